//! The state every layer below the server shares: configuration, storage,
//! the cash ledger, ids and the host clock. The runtime and the host
//! interfaces reach storage and money through it, never through `App`.

use crate::config::{Config, FEES_FAMILY};
use crate::ids::IdGen;
use crate::money::ledger::Ledger;
use crate::store::Settings;
use crate::store::Storage;
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// Configuration, storage, ledger, ids and clock.
pub struct State {
    pub config: Config,
    pub storage: Storage,
    pub ledger: Ledger,
    /// Upstream webcash mode (`cash_upstream`): payments are taken at that
    /// server instead of the embedded ledger.
    pub upstream: Option<Arc<crate::money::upstream::Upstream>>,
    /// The service's arbiter key.
    pub arbiter: crate::auth::Arbiter,
    pub ids: IdGen,
    /// Milliseconds added to the wall clock (tests shift time with it).
    clock_offset_ms: AtomicI64,
}

impl State {
    /// Make the data dir private, open the database and the ledger key.
    pub fn open(config: Config) -> Result<Arc<State>> {
        let mut storage = if config.shared_store() {
            // The data dir still holds the keys and the admin token.
            private_dir(&config.data_dir)?;
            mark_fleet_dir(&config)?;
            let storage = Storage::open_pg(
                &config.store,
                &config.store_schema,
                config.store_connections as usize,
                std::time::Duration::from_millis(config.store_timeout_ms),
                Settings::of(&config),
            )
            .with_context(|| {
                format!("opening the shared store (schema {})", config.store_schema)
            })?;
            tracing::info!(schema = %config.store_schema, "shared store (postgres)");
            storage
        } else {
            open_embedded(&config).map_err(|e| {
                if e.downcast_ref::<crate::store::HeldElsewhere>().is_some() {
                    anyhow::anyhow!("{e:#}: start this server once it has exited")
                } else if e.chain().any(no_space_left) {
                    // Opening applies the write-ahead log and writes.
                    anyhow::anyhow!(
                        "{e:#}: the data dir's disk ({}) is full; free space on it and start again (a running server keeps min_free_disk_mib free, refusing writes below it)",
                        config.data_dir.display()
                    )
                } else {
                    e
                }
            })?
        };
        storage.set_write_budget(config.max_request_write_bytes);
        storage.guard_disk(&config.data_dir, config.min_free_disk_mib << 20);
        let (ledger, arbiter) = if config.shared_store() {
            // Every host of the fleet derives the same secrets: the keys
            // come from the config, or from the store (made once).
            let server_key = shared_key(&storage, "server-key", config.server_key.as_deref())?;
            let arbiter_key = shared_key(&storage, "arbiter-key", config.arbiter_key.as_deref())?;
            fleet_fee_settings(&storage, &config.family_settings(FEES_FAMILY));
            (
                Ledger::from_hex(&server_key)?,
                crate::auth::Arbiter::open(&config.data_dir, Some(&arbiter_key))?,
            )
        } else {
            let ledger = embedded_ledger(&config)?;
            let arbiter =
                crate::auth::Arbiter::open(&config.data_dir, config.arbiter_key.as_deref())?;
            keys_in_use(
                &storage,
                &[
                    KeyInUse {
                        name: "server-key",
                        check: key_check("server-key", &ledger.key_hex()),
                        configured: config.server_key.is_some(),
                    },
                    KeyInUse {
                        name: "arbiter-key",
                        check: key_check("arbiter-key", &arbiter.seed_hex()),
                        configured: config.arbiter_key.is_some(),
                    },
                ],
            );
            (ledger, arbiter)
        };
        for name in ["server.key", "arbiter.key", "admin.token"] {
            tighten(&config.data_dir.join(name));
        }
        crate::money::upgrade::run(&storage, &ledger).context("upgrading the database")?;
        crate::versions::record(&storage, crate::config::SERVICE_VERSION);
        let upstream = crate::money::upstream::Upstream::from_config(&config);
        if let Some(url) = &config.cash_upstream {
            tracing::info!(
                upstream = %url,
                timeout_ms = config.cash_upstream_timeout_ms,
                "cash: upstream mode (payments are swapped at the upstream's ledger)"
            );
            escrow_left_behind(&storage);
        }
        Ok(Arc::new(State {
            config,
            storage,
            ledger,
            upstream,
            arbiter,
            ids: IdGen::default(),
            clock_offset_ms: AtomicI64::new(0),
        }))
    }

    /// Host clock in milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> u64 {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_millis() as i64;
        (wall + self.clock_offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }

    /// Kept paid answers recorded before this time (ms) are past the retry
    /// horizon (`replay_retention_s`): an identical retry no longer gets
    /// them, whether or not retention has swept them yet.
    pub fn replays_kept_since_ms(&self) -> u64 {
        self.now_ms()
            .saturating_sub(self.config.replay_retention_s.saturating_mul(1000))
    }

    /// Shift the host clock (tests of deadlines and signature freshness).
    pub fn shift_clock(&self, delta_ms: i64) {
        self.clock_offset_ms.fetch_add(delta_ms, Ordering::Relaxed);
    }
}

/// What upstream mode works on, seen from the money layer.
impl crate::money::upstream::Books for State {
    fn storage(&self) -> &Storage {
        &self.storage
    }
    fn ledger(&self) -> &Ledger {
        &self.ledger
    }
    fn upstream(&self) -> Option<&Arc<crate::money::upstream::Upstream>> {
        self.upstream.as_ref()
    }
    fn now_ms(&self) -> u64 {
        State::now_ms(self)
    }
}

/// Create `dir` and any missing parents owner-only (0700); an existing
/// directory keeps its mode. For what lives in the data dir (the compile
/// cache, kept uploads, a restore's folders): nothing the service writes
/// is for other users.
pub fn create_private_dir(dir: &std::path::Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

/// Whether `e` is a full disk's (ENOSPC), however the store wrapped it.
fn no_space_left(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|io| io.kind() == std::io::ErrorKind::StorageFull)
        || e.to_string().contains("os error 28")
}

/// The file a host on a shared store keeps in its data dir (which holds
/// no database, only its keys and admin token): an embedded store opened
/// there, by an offline command or a `serve` whose store setting was
/// forgotten, would be a new and empty one beside the fleet's, minting
/// secrets no host accepts. While it is there, [`open_embedded`] refuses.
pub const FLEET_MARK: &str = "shared-store";

/// Leave [`FLEET_MARK`] in a shared-store host's data dir.
fn mark_fleet_dir(config: &Config) -> Result<()> {
    let mark = config.data_dir.join(FLEET_MARK);
    let text = format!(
        "This is the data dir of a host on a shared store (schema {}).\n\
         Its data is in that store, not here: an embedded store opened here would be\n\
         a new, empty one, so offline commands (cash mint, backup) and a serve without\n\
         the store setting refuse this dir while this file is here. Mint and back up\n\
         through a running host (--admin URL). Remove this file only to keep an\n\
         embedded store of its own here.\n",
        config.store_schema
    );
    if std::fs::read_to_string(&mark).ok().as_deref() != Some(text.as_str()) {
        std::fs::write(&mark, text).with_context(|| format!("writing {}", mark.display()))?;
    }
    Ok(())
}

/// Refused when `config`'s data dir is a shared-store host's
/// ([`FLEET_MARK`]).
pub fn refuse_fleet_dir(config: &Config) -> Result<()> {
    let mark = config.data_dir.join(FLEET_MARK);
    if !mark.exists() {
        return Ok(());
    }
    // (A database here is from before the dir served on the shared store:
    // it holds nothing the fleet did since.)
    let here = if config.db_path().exists() {
        format!(
            "its embedded database {} is older than what the host did on the store since",
            config.db_path().display()
        )
    } else {
        "an embedded store here would be a new, empty one".to_string()
    };
    anyhow::bail!(
        "{} is the data dir of a host on a shared store ({} says so): its data is in the store, and {here}. Configure the store (store, MARKETPLACE_STORE) to serve it; mint or back up through a running host (--admin URL); remove that file only to use an embedded store of this dir's own",
        config.data_dir.display(),
        mark.display()
    )
}

/// The embedded database of `config`'s data dir, the dir made owner-only
/// (0700) and the database file 0600, for `serve` and the offline commands
/// alike (the first of them to run may create both). Refused in a
/// shared-store host's data dir ([`refuse_fleet_dir`]).
pub fn open_embedded(config: &Config) -> Result<Storage> {
    refuse_fleet_dir(config)?;
    private_dir(&config.data_dir)?;
    let storage = Storage::open(&config.db_path(), Settings::of(config))?;
    private_file(&config.db_path())?;
    // The write-ahead log's segments hold the requests' writes as the
    // database does (made 0600; tightened here whatever a copy left, the
    // spare the open has just taken for its segment included: later
    // spares are segments made here).
    for file in crate::store::wal::files(&config.db_path()) {
        tighten(&file);
    }
    Ok(storage)
}

/// The ledger of an embedded store: under the configured `server_key`, or
/// the data dir's `server.key` (made on first use), for `serve` and the
/// offline commands alike, so that both derive the same secrets.
pub fn embedded_ledger(config: &Config) -> Result<Ledger> {
    match &config.server_key {
        Some(hex) => Ledger::from_hex(hex),
        None => Ledger::open(&config.data_dir),
    }
}

/// The ledger an offline command (`cash mint --data-dir`) mints under: as
/// [`embedded_ledger`], but it never makes a server key for a database
/// that holds money or recorded one (see [`keys_in_use`]): a key made now
/// would derive other secrets, and change what `serve` runs with. (A mint
/// key sent again under another key is the ledger's refusal:
/// [`crate::money::ledger::MintKeyOtherServerKey`].) `serve` starts
/// anyway, loudly, to refuse double spends; an operator's command has
/// nothing to keep serving.
pub fn offline_ledger(config: &Config, storage: &Storage) -> Result<Ledger> {
    use crate::store::Kv;
    let key_file = config.data_dir.join("server.key");
    if config.server_key.is_none() && !key_file.exists() {
        let read = storage.begin_read().map_err(anyhow::Error::from)?;
        let recorded = read
            .get_in(crate::store::META_TABLE, b"server-key-check")
            .map_err(anyhow::Error::from)?;
        let minted = crate::money::ledger::total(&read, "minted")?;
        anyhow::ensure!(
            recorded.is_none() && minted == 0,
            "{} is missing, and this database ran with a server key (its secrets are derived from it): put the file back from a backup of this data dir, or configure server_key as that key",
            key_file.display()
        );
    }
    embedded_ledger(config)
}

/// Create the data dir readable by the owner only (0700), or tighten it:
/// it holds the database, the server key and the admin token.
fn private_dir(dir: &std::path::Path) -> Result<()> {
    create_private_dir(dir)
        .with_context(|| format!("creating the data dir (data_dir) {}", dir.display()))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .with_context(|| format!("making {} private (0700)", dir.display()))?;
    }
    Ok(())
}

/// A 32-byte key (64 hex) every host of a fleet must share (`name`:
/// `server-key`, `arbiter-key`). Configured: checked against the digest
/// the first host recorded in the shared store's `host:meta` (the key
/// itself stays out of the database); a host with another key refuses to
/// start, it would derive other secrets. Not configured: the key kept in
/// the store, made by the first host.
fn shared_key(storage: &Storage, name: &str, configured: Option<&str>) -> Result<String> {
    use crate::store::{Kv, StorageError};
    const META: &str = crate::store::META_TABLE;
    let check_of = |hex: &str| key_check(name, hex);
    let check_key = format!("{name}-check");
    let configured = configured.map(|k| k.trim().to_ascii_lowercase());
    let found = storage
        .write(|txn| {
            let text = |v: Vec<u8>| {
                String::from_utf8(v).map_err(|_| StorageError::Internal("not text".into()))
            };
            let check = txn.get_in(META, check_key.as_bytes())?.map(text).transpose()?;
            let kept = txn.get_in(META, name.as_bytes())?.map(text).transpose()?;
            let key = match (&configured, kept) {
                (Some(mine), _) => mine.clone(),
                (None, Some(kept)) => kept,
                (None, None) if check.is_some() => {
                    return Ok(Err(format!(
                        "the fleet uses a configured {name}: give this host the same one"
                    )));
                }
                (None, None) => {
                    let mut key = [0u8; 32];
                    crate::ids::fill_random(&mut key);
                    let hex = marketplace_common::hex::encode(&key);
                    txn.put_in(META, name.as_bytes(), hex.as_bytes())?;
                    hex
                }
            };
            match check {
                Some(c) if c != check_of(&key) => Ok(Err(format!(
                    "the {name} of this host differs from the fleet's (recorded in the shared store by its first host): every host must derive the same secrets"
                ))),
                Some(_) => Ok(Ok(key)),
                None => {
                    txn.put_in(META, check_key.as_bytes(), check_of(&key).as_bytes())?;
                    Ok(Ok(key))
                }
            }
        })
        .and_then(|r| r)
        .map_err(|e| anyhow::anyhow!("the {name} of the shared store: {e}"))?;
    found.map_err(|e| anyhow::anyhow!(e))
}

/// The shared store's record of the fee settings (`[settings.fees]`) of
/// the host started last: a digest of them all, and the built-in prices
/// as text (a custom fee component's other settings may hold anything, so
/// they are only counted).
const FEE_SETTINGS_KEY: &str = "fee-settings";

/// The settings of the built-in fee components, shown in the warning.
const SHOWN_FEE_SETTINGS: [&str; 5] =
    ["identity", "post", "comment", "rate", "arbitration_percent"];

/// `[settings.fees]` as the record keeps it: `{digest} {shown}`, the
/// digest over every setting, the text over the built-in prices.
fn settings_record(settings: &BTreeMap<String, String>) -> String {
    let all: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    let digest = marketplace_common::hex::sha256(all.join("\n"));
    let mut shown: Vec<String> = settings
        .iter()
        .filter(|(k, _)| SHOWN_FEE_SETTINGS.contains(&k.as_str()))
        .map(|(k, v)| format!("{k}={v:?}"))
        .collect();
    let others = settings.len() - shown.len();
    if others > 0 {
        shown.push(format!("and {others} other settings"));
    }
    if shown.is_empty() {
        shown.push("(none: the fee component's defaults)".into());
    }
    format!("{digest} {}", shown.join(" "))
}

/// On a shared store every host prices an action with its own
/// `[settings.fees]`: hosts that differ quote different fees for one post,
/// and a contract keeps the fee of the host that sold it. At start the
/// host compares its settings with those of the host started before it
/// (recorded in the store): a difference is a warning naming both, and
/// this host's become the record. So in a rolling change the first host
/// started with the new settings warns, and a host started later with the
/// old ones warns again; hosts already running are not checked. Returns
/// the record found before when it differs (tests).
fn fleet_fee_settings(storage: &Storage, settings: &BTreeMap<String, String>) -> Option<String> {
    use crate::store::Kv;
    const META: &str = crate::store::META_TABLE;
    let mine = settings_record(settings);
    let before = storage
        .write(|txn| {
            let before = txn.get_in(META, FEE_SETTINGS_KEY.as_bytes())?;
            if before.as_deref() != Some(mine.as_bytes()) {
                txn.put_in(META, FEE_SETTINGS_KEY.as_bytes(), mine.as_bytes())?;
            }
            Ok(before.map(|b| String::from_utf8_lossy(&b).into_owned()))
        })
        .and_then(|r| r);
    let digest = |record: &str| {
        record
            .split_once(' ')
            .map_or(record, |(d, _)| d)
            .to_string()
    };
    let shown = |record: &str| record.split_once(' ').map_or("", |(_, s)| s).to_string();
    match before {
        Ok(Some(before)) if digest(&before) != digest(&mine) => {
            tracing::warn!(
                this_host = %shown(&mine),
                last_host = %shown(&before),
                "this host's fee settings ([settings.fees]) differ from those of the host of the fleet started before it: hosts with different settings quote different fees for the same action. Give every host the same [settings.fees]"
            );
            Some(before)
        }
        Ok(_) => None,
        Err(e) => {
            tracing::warn!("recording the fee settings in the shared store: {e}");
            None
        }
    }
}

/// What the database keeps of a key (`name`: `server-key`, `arbiter-key`;
/// `hex`: the key) to know it again: a digest, never the key.
fn key_check(name: &str, hex: &str) -> String {
    marketplace_common::hex::sha256(format!("marketplace fleet {name}:{hex}"))
}

/// Record in the embedded database the [`key_check`] of each key (`name`,
/// its check) it first ran with (under `{name}-check`, as a shared store
/// keeps its fleet's), in one transaction, and at every start with another
/// key (a lost `server.key` or `arbiter.key` made anew, or a wrong one
/// copied in) say so loudly. The host still starts, safely: it refuses
/// double spends, what it owes under the old server key (kept answers,
/// payouts) answers 409, and contracts signed by the old arbiter key do not
/// verify against the published one. Putting the right key file back ends
/// it.
fn keys_in_use(storage: &Storage, keys: &[KeyInUse]) {
    use crate::store::Kv;
    const META: &str = crate::store::META_TABLE;
    let firsts = storage
        .write(|txn| {
            let mut firsts = Vec::with_capacity(keys.len());
            for key in keys {
                let row = format!("{}-check", key.name);
                let first = txn.get_in(META, row.as_bytes())?;
                if first.is_none() {
                    txn.put_in(META, row.as_bytes(), key.check.as_bytes())?;
                }
                firsts.push(first);
            }
            Ok(firsts)
        })
        .and_then(|r| r);
    let firsts = match firsts {
        Ok(firsts) => firsts,
        Err(e) => return tracing::warn!("recording the keys in use: {e}"),
    };
    for (key, first) in keys.iter().zip(firsts) {
        if first.is_some_and(|first| first != key.check.as_bytes()) {
            let message = key.changed_message();
            tracing::error!(key = key.name, "{message}");
            let kind = if key.name == "server-key" {
                crate::alerts::Kind::ServerKeyChanged
            } else {
                crate::alerts::Kind::ArbiterKeyChanged
            };
            crate::alerts::raise(kind, message);
        }
    }
}

/// Upstream mode pays nothing out of the embedded ledger (its secrets are
/// not the upstream's), so the escrow of contracts bought in embedded mode
/// stays where it is: their payouts and refunds answer 409 until the
/// server runs in embedded mode again. A start in upstream mode with such
/// escrow says so loudly.
fn escrow_left_behind(storage: &Storage) {
    let held = storage
        .begin_read()
        .map_err(anyhow::Error::from)
        .and_then(|r| crate::money::ledger::total(&r, "escrow"));
    match held {
        Ok(0) => {}
        Ok(units) => {
            let message = format!(
                "contracts bought in embedded mode hold {} in escrow in the embedded ledger, which pays nothing out in upstream mode (cash_upstream): their payouts and refunds answer 409 until the server runs without cash_upstream again (switch modes with no open contracts)",
                marketplace_common::amount::format(units)
            );
            tracing::error!("{message}");
            crate::alerts::raise(crate::alerts::Kind::EscrowLeftBehind, message);
        }
        Err(e) => tracing::warn!("reading the escrow held: {e:#}"),
    }
}

/// A key a start runs with, as [`keys_in_use`] weighs it.
struct KeyInUse {
    /// `server-key` or `arbiter-key`.
    name: &'static str,
    /// Its [`key_check`].
    check: String,
    /// From the configuration (`server_key`, `arbiter_key`), which
    /// overrides the data dir's key file.
    configured: bool,
}

impl KeyInUse {
    /// What a start with another key than the database's first says: what
    /// that costs, and where the key to put back goes (the setting, when
    /// one is configured: putting the file back would change nothing).
    fn changed_message(&self) -> String {
        let (cost, setting, file) = match self.name {
            "server-key" => (
                "what it owes under that key cannot be shown (kept answers and payouts answer 409)",
                "server_key",
                "server.key",
            ),
            _ => (
                "contracts signed by the earlier arbiter key do not verify against this one",
                "arbiter_key",
                "arbiter.key",
            ),
        };
        let env = format!("MARKETPLACE_{}", setting.to_ascii_uppercase());
        match self.configured {
            true => format!(
                "this database ran with another {} before: {cost}. This one is the configured `{setting}` ({env} or the config file), which overrides the data dir's {file}: set it to the key this database ran with (or leave it unset, if the data dir's {file} is that key) and restart",
                self.name
            ),
            false => format!(
                "this database ran with another {} before (its file was lost and made anew, or replaced): {cost}. Put the data dir's {file} back from a backup of this data dir (or configure `{setting}` as that key) and restart",
                self.name
            ),
        }
    }
}

/// Key files and the admin token are the owner's only, as the database is,
/// however they were copied in: a plain file others may read or write is
/// made 0600. One that cannot be (a read-only mount, another owner) is a
/// warning, not a reason to stop; a symlink (a mounted secret) is left as
/// it is.
fn tighten(path: &std::path::Path) {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let Ok(meta) = std::fs::symlink_metadata(path) else {
            return;
        };
        if !meta.is_file() || meta.permissions().mode() & 0o077 == 0 {
            return;
        }
        if let Err(e) = private_file(path) {
            tracing::warn!(
                "{} may be read by others (mode {:o}): {e:#}",
                path.display(),
                meta.permissions().mode() & 0o777
            );
        }
    }
}

/// Make a file readable and writable by the owner only (0600).
fn private_file(path: &std::path::Path) -> Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
            .with_context(|| format!("making {} private (0600)", path.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_store_hosts_data_dir_gets_no_embedded_store() {
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: dir.path().join("data"),
            store_schema: "fleet".into(),
            ..Config::default()
        };
        std::fs::create_dir_all(&config.data_dir).unwrap();
        mark_fleet_dir(&config).unwrap();
        let mark = std::fs::read_to_string(config.data_dir.join(FLEET_MARK)).unwrap();
        assert!(mark.contains("schema fleet"), "{mark}");
        let refused = open_embedded(&config).err().expect("refused").to_string();
        assert!(refused.contains(FLEET_MARK), "{refused}");
        assert!(refused.contains("--admin URL"), "{refused}");
        assert!(!config.db_path().exists(), "no database was made");
        // The operator's choice: without the file, an embedded store.
        std::fs::remove_file(config.data_dir.join(FLEET_MARK)).unwrap();
        drop(open_embedded(&config).unwrap());
        assert!(config.db_path().exists());
    }

    #[cfg(unix)]
    #[test]
    fn an_open_makes_the_database_and_its_log_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let config = Config {
            data_dir: dir.path().join("data"),
            ..Config::default()
        };
        drop(open_embedded(&config).unwrap());
        let mut files = crate::store::wal::files(&config.db_path());
        assert!(!files.is_empty(), "the log has a segment");
        // A copy that left them readable by others, and a spare.
        // (The spare becomes the next segment at the open; a segment kept
        // aside as damaged stays as it is, to be tightened.)
        let spare = config.data_dir.join("marketplace.redb-wal.spare");
        let damaged = config
            .data_dir
            .join("marketplace.redb-wal.00000000000000ff.damaged");
        std::fs::write(&spare, b"").unwrap();
        std::fs::write(&damaged, b"").unwrap();
        files.extend([config.db_path(), spare, damaged.clone()]);
        for f in &files {
            std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        drop(open_embedded(&config).unwrap());
        // Every file of the data dir: the database, the log's segments
        // (the spare may have become one).
        let now: Vec<_> = std::fs::read_dir(&config.data_dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.is_file())
            .collect();
        assert!(now.contains(&damaged), "{now:?}");
        for f in now {
            let mode = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", f.display());
        }
    }
}
