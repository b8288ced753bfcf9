//! Backup and restore of a data dir.
//!
//! A backup is one tar file holding:
//! - `marketplace.redb`: a consistent snapshot of the database, copied table
//!   by table inside one read transaction (so it is exactly the committed
//!   state at one instant, taken while the server keeps serving);
//! - `server.key`: the key every change, payout and refund secret is
//!   derived from (the data dir's, or the configured `server_key`). The
//!   database keeps only public hashes and derivations,
//!   so a database restored without its key cannot pay out what it owes
//!   (its kept answers answer 409): the two must be kept together;
//! - `arbiter.key`: the arbiter key (the data dir's, or the configured
//!   `arbiter_key`), when there is one;
//! - `uploads/`: components uploaded through the admin API;
//! - `backup.json`: when, which version, and the ledger totals.
//!
//! The admin token and the compile cache are not kept: a restored server
//! generates a new token (or takes the configured one) and recompiles.
//! Restore refuses a data dir that is not empty, and unpacks into a temp
//! dir first, so a failed restore leaves nothing behind.

use crate::config::Config;
use crate::store::Storage;
use anyhow::{Context, Result, bail};
use serde_json::json;
use std::fs::File;
use std::io::Write;
use std::path::Path;

const DB: &str = "marketplace.redb";
const SERVER_KEY: &str = "server.key";
const ARBITER_KEY: &str = "arbiter.key";
const UPLOADS: &str = "uploads";
const MANIFEST: &str = "backup.json";

/// The keys a backup holds beside the database, each 64 hex: those the
/// server runs with, read from the data dir or from the configuration.
pub struct Keys {
    pub server: String,
    /// None: no arbiter key yet (it is made at the first start).
    pub arbiter: Option<String>,
}

impl Keys {
    /// The keys of a running server.
    pub fn of(state: &crate::state::State) -> Keys {
        Keys {
            server: state.ledger.key_hex(),
            arbiter: Some(state.arbiter.seed_hex()),
        }
    }

    /// The keys of a stopped server's data dir: the configured ones, else
    /// its files. A backup never makes a key: one made now would not be
    /// the one the database's secrets and certificates were made with.
    pub fn offline(config: &Config) -> Result<Keys> {
        use crate::money::ledger::Ledger;
        let server = match &config.server_key {
            Some(hex) => Ledger::from_hex(hex)?.key_hex(),
            None => {
                let path = config.data_dir.join(SERVER_KEY);
                let text = std::fs::read_to_string(&path).with_context(|| {
                    format!(
                        "reading {} (and no server_key is configured)",
                        path.display()
                    )
                })?;
                Ledger::from_hex(&text)?.key_hex()
            }
        };
        let arbiter_of = |hex: &str| {
            crate::auth::Arbiter::open(&config.data_dir, Some(hex)).map(|a| a.seed_hex())
        };
        let arbiter = match config.arbiter_key.as_deref() {
            Some(hex) => Some(arbiter_of(hex).context("the configured arbiter_key")?),
            // Read here, not through `Arbiter::open`, which makes a key
            // when there is none.
            None => match std::fs::read_to_string(config.data_dir.join(ARBITER_KEY)) {
                Ok(text) => Some(arbiter_of(&text).context("the data dir's arbiter.key")?),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(e) => return Err(e).context("reading the data dir's arbiter.key"),
            },
        };
        Ok(Keys { server, arbiter })
    }
}

/// Where a snapshot copies the database first: `.backup-*` in the data
/// dir.
const COPY_PREFIX: &str = ".backup-";

/// Remove the copies backups of `data_dir` that were killed left behind
/// (called with the database held, so that none is running: at `serve`'s
/// start and by an offline backup).
pub fn remove_stale_copies(data_dir: &Path) {
    for entry in std::fs::read_dir(data_dir).into_iter().flatten().flatten() {
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(COPY_PREFIX) {
            match std::fs::remove_dir_all(entry.path()) {
                Ok(()) => tracing::info!(
                    dir = %entry.path().display(),
                    "removed the database copy a killed backup left"
                ),
                Err(e) => {
                    tracing::warn!(dir = %entry.path().display(), "a killed backup's copy not removed: {e}")
                }
            }
        }
    }
}

/// Write a backup of the live `storage` (data dir `data_dir`, holding
/// `keys`) to `out`; returns the bytes written.
pub fn snapshot(
    storage: &Storage,
    data_dir: &Path,
    keys: &Keys,
    out: &mut dyn Write,
) -> Result<u64> {
    // Owner-only as the data dir's own files: the copy is the database.
    let tmp = owner_only(tempfile::Builder::new().prefix(COPY_PREFIX))
        .tempdir_in(data_dir)
        .context("making a temp dir for the snapshot")?;
    let db = tmp.path().join(DB);
    let tables = storage.snapshot_into(&db).context("copying the database")?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&db, std::fs::Permissions::from_mode(0o600))?;
    }
    let totals = {
        let copy = Storage::open(&db, Default::default())?;
        let txn = copy.begin_read().map_err(|e| anyhow::anyhow!("{e}"))?;
        let t = |name| crate::money::ledger::total(&txn, name).unwrap_or(0);
        json!({"minted": t("minted"), "fees": t("fees"), "escrow": t("escrow")})
    };
    // What the archive holds besides the manifest, read once to be hashed
    // (the database is hashed from its file, then streamed).
    let mut files: Vec<(String, Vec<u8>)> = vec![(SERVER_KEY.into(), keys.server.clone().into())];
    if let Some(arbiter) = &keys.arbiter {
        files.push((ARBITER_KEY.into(), arbiter.clone().into()));
    }
    if let Ok(entries) = std::fs::read_dir(data_dir.join(UPLOADS)) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".wasm") || name.ends_with(".json") {
                files.push((format!("{UPLOADS}/{name}"), std::fs::read(entry.path())?));
            }
        }
    }
    let mut digests = serde_json::Map::new();
    digests.insert(DB.into(), json!(sha256_of_file(&db)?));
    for (name, bytes) in &files {
        digests.insert(name.clone(), json!(marketplace_common::hex::sha256(bytes)));
    }
    let manifest = json!({
        "format": 1,
        "service": crate::config::SERVICE_NAME,
        "version": crate::config::SERVICE_VERSION,
        "created_at": crate::ids::rfc3339(std::time::SystemTime::now()),
        "tables": tables,
        "totals": totals,
        "sha256": digests,
    });
    let mut counter = Counting { inner: out, n: 0 };
    {
        let mut tar = tar::Builder::new(&mut counter);
        let mut add_bytes = |name: &str, bytes: &[u8]| -> Result<()> {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o600);
            header.set_mtime(crate::ids::unix_seconds());
            header.set_cksum();
            tar.append_data(&mut header, name, bytes)
                .with_context(|| format!("writing {name} into the backup"))
        };
        add_bytes(MANIFEST, &serde_json::to_vec_pretty(&manifest)?)?;
        for (name, bytes) in &files {
            add_bytes(name, bytes)?;
        }
        // Owner-only like every other entry (and the live file), whatever
        // mode the copy was created with.
        let mut f = File::open(&db)?;
        let mut header = tar::Header::new_gnu();
        header.set_metadata(&f.metadata()?);
        header.set_mode(0o600);
        header.set_cksum();
        tar.append_data(&mut header, DB, &mut f)
            .context("writing the database into the backup")?;
        tar.finish()?;
    }
    counter.flush()?;
    Ok(counter.n)
}

/// Back up a stopped server's data dir into `to`.
pub fn offline(config: &Config, to: &Path) -> Result<u64> {
    anyhow::ensure!(
        !config.shared_store(),
        "the configured store is a shared one ({}): back it up with its database's tools (pg_dump, or the cluster's own backups), not through a host",
        config.store_schema
    );
    crate::state::refuse_fleet_dir(config)?;
    anyhow::ensure!(
        config.db_path().is_file(),
        "no database at {}: name the server's data dir (--data-dir DIR), or back up a running server (--admin URL)",
        config.db_path().display()
    );
    let keys = Keys::offline(config)?;
    let storage = crate::state::open_embedded(config)
        .context("opening the database (is the server running? then use --admin URL)")?;
    remove_stale_copies(&config.data_dir);
    write_atomically(to, |f| snapshot(&storage, &config.data_dir, &keys, f))
}

/// The directory `path` is in (`.` for a bare name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// A temp dir made by `builder` readable by its owner only (0700; the
/// default is 0777 less the umask).
fn owner_only<'b, 'p, 's>(
    builder: &'b mut tempfile::Builder<'p, 's>,
) -> &'b mut tempfile::Builder<'p, 's> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o700));
    }
    builder
}

/// Refuse a backup destination that would replace what is not a backup:
/// a directory; a path inside `data_dir` (the configured one, when known:
/// the live database, a key); an existing file other than an empty one or
/// an earlier backup (a tar whose first entry is [`MANIFEST`]). Written
/// over the live database, a backup left the server serving a deleted
/// file, acknowledging writes that a restart then lost (an outside
/// operator audit).
pub fn check_destination(to: &Path, data_dir: Option<&Path>) -> Result<()> {
    let shown = to.display();
    let is_dir = to.as_os_str().to_string_lossy().ends_with('/') || to.is_dir();
    // (A directory is looked at itself, a file where it would be; a
    // directory not made yet, as the nearest one that is.)
    let place = std::path::absolute(if is_dir { to } else { dir_of(to) })
        .ok()
        .and_then(|p| p.ancestors().find_map(|a| a.canonicalize().ok()));
    if let Some(data_dir) = data_dir
        && let (Some(dir), Ok(data)) = (place, data_dir.canonicalize())
        && dir.starts_with(&data)
    {
        bail!(
            "--to {shown} is inside the data dir {}: write the backup outside it (where it outlives the data dir: another disk or machine)",
            data_dir.display()
        );
    }
    if is_dir {
        bail!(
            "--to {shown} is a directory: name the backup file to write in it (say {}/marketplace-backup.tar)",
            shown.to_string().trim_end_matches('/')
        );
    }
    match std::fs::metadata(to) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("looking at --to {shown}")),
        Ok(m) if m.len() == 0 || is_backup(to) => Ok(()),
        Ok(_) => bail!(
            "--to {shown} exists and is not a backup (a backup is a tar file beginning with {MANIFEST}): it is not replaced; name a new file, or remove that one first"
        ),
    }
}

/// Whether `path` is a file `marketplace backup` wrote: a tar archive
/// whose first entry is its manifest.
fn is_backup(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    let mut archive = tar::Archive::new(file);
    let first = archive.entries().ok().and_then(|mut e| e.next());
    matches!(first, Some(Ok(entry)) if entry.path().is_ok_and(|p| p == Path::new(MANIFEST)))
}

/// The temp file a backup is written to beside its destination.
const PARTIAL_PREFIX: &str = ".marketplace-backup-";
/// The temp dir a restore unpacks into beside the data dir.
const STAGING_PREFIX: &str = ".marketplace-restore-";
/// How long a temp file or dir nobody holds must have been left
/// unchanged before it is taken for abandoned. Its maker locks it just
/// after making it, but a lock is best-effort (a network filesystem may
/// not share or take one, an older binary takes none, and its clock may
/// differ from the file server's): nothing is urgent about a leftover.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(3600);

/// Remove what a killed backup or restore left in `dir` (names beginning
/// with `prefix`): a running one holds a lock on its temp file or dir
/// (`flock`, which ends with its process), so only one nobody holds and
/// left unchanged for [`ABANDONED_AFTER`] is removed, and said so.
fn remove_abandoned(dir: &Path, prefix: &str) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        // (Never a link's target: only what a backup or restore makes.)
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if !(kind.is_file() || kind.is_dir()) {
            continue;
        }
        // A staging dir's own time stays while a file in it is written:
        // its newest entry's counts.
        let mut times = vec![entry.metadata().and_then(|m| m.modified())];
        if kind.is_dir() {
            let inside = std::fs::read_dir(&path).into_iter().flatten().flatten();
            times.extend(inside.map(|e| e.metadata().and_then(|m| m.modified())));
        }
        let old = times.iter().all(|t| {
            t.as_ref()
                .is_ok_and(|t| t.elapsed().is_ok_and(|age| age >= ABANDONED_AFTER))
        });
        if !(old && nobody_holds(&path)) {
            continue;
        }
        let removed = if kind.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        // Said on stderr (the CLI's), never a panic if it is closed; one
        // another cleaner removed first is no news.
        let _ = match removed {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Ok(()) => writeln!(
                std::io::stderr(),
                "removed {}, left by a backup or restore that was stopped before it ended",
                path.display()
            ),
            Err(e) => writeln!(
                std::io::stderr(),
                "{} was left by a backup or restore that was stopped; not removed: {e}",
                path.display()
            ),
        };
    }
}

/// Whether no process holds a lock on `path`: probed with a shared lock
/// (which any reader may take, and a running job's exclusive one
/// refuses), opened without following a link or waiting on a FIFO put
/// there meanwhile. Not knowing (no lock to be had there) is "held".
fn nobody_holds(path: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .is_ok_and(|f| f.try_lock_shared().is_ok())
}

/// Mark `file` (a job's temp file or dir) as held while the job runs
/// (the kernel lets go if the process dies); best-effort: where no lock
/// can be had (some network filesystems) the job goes on unmarked.
fn hold(file: &File) {
    let _ = file.lock();
}

/// Write `to` through `f` into a temp file beside it (0600), fsync, then
/// rename: a failed backup never leaves a partial file under that name,
/// and a killed one's temp file is removed by a later backup there.
pub fn write_atomically(to: &Path, f: impl FnOnce(&mut File) -> Result<u64>) -> Result<u64> {
    let dir = dir_of(to);
    remove_abandoned(dir, PARTIAL_PREFIX);
    let mut tmp = tempfile::Builder::new()
        .prefix(PARTIAL_PREFIX)
        .tempfile_in(dir)
        .with_context(|| format!("creating a temp file in {}", dir.display()))?;
    hold(tmp.as_file());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        tmp.as_file()
            .set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    let n = f(tmp.as_file_mut())?;
    tmp.as_file().sync_all()?;
    // The rename's own error (tempfile's wraps it and repeats its text).
    tmp.persist(to)
        .map_err(|e| e.error)
        .with_context(|| format!("writing {}", to.display()))?;
    Ok(n)
}

/// Restore the backup `file` into `data_dir`, which must be missing or
/// empty. Everything is unpacked and checked in a temp dir beside it and
/// renamed into place only then: a failed restore leaves nothing behind.
pub fn restore(file: &Path, data_dir: &Path) -> Result<()> {
    let empty = match std::fs::read_dir(data_dir) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(e).with_context(|| format!("reading {}", data_dir.display())),
    };
    if !empty {
        bail!(
            "{} is not empty: restore into a new (or empty) data dir",
            data_dir.display()
        );
    }
    let input = File::open(file).with_context(|| format!("opening {}", file.display()))?;
    let parent = dir_of(data_dir);
    std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    // Owner-only from the start (it becomes the data dir).
    remove_abandoned(parent, STAGING_PREFIX);
    let staging = owner_only(tempfile::Builder::new().prefix(STAGING_PREFIX))
        .tempdir_in(parent)
        .with_context(|| format!("creating a temp dir in {}", parent.display()))?;
    // (A directory opens read-only; where it cannot be locked so, the
    // staging dir goes unmarked: see `hold`.)
    let _held = File::open(staging.path()).inspect(hold);
    // Read once, in one pass (the file may be a pipe: `restore /dev/stdin`).
    unpack(input, staging.path()).map_err(|e| match e.downcast_ref::<NotABackup>() {
        Some(_) => anyhow::anyhow!(
            "{} is not a backup (a backup is a tar file beginning with {MANIFEST}, as `marketplace backup` and GET /admin/backup write it): nothing restored",
            file.display()
        ),
        None => e,
    })?;
    // rename(2) replaces an empty directory.
    let staged = staging.keep();
    if let Err(e) = std::fs::rename(&staged, data_dir) {
        let _ = std::fs::remove_dir_all(&staged);
        return Err(e)
            .with_context(|| format!("moving the restored files to {}", data_dir.display()));
    }
    Ok(())
}

/// A file whose first entry is not a backup's manifest (or that is no tar
/// archive at all): named so, not by what the tar reader makes of it.
#[derive(Debug)]
struct NotABackup;

impl std::fmt::Display for NotABackup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a backup")
    }
}

impl std::error::Error for NotABackup {}

/// A failure reading the archive past its manifest: a damaged or cut
/// backup (a file that is no backup is [`NotABackup`]). Its
/// own errors can quote the bytes of a damaged header: shown escaped to
/// ASCII and cut short, never raw on the operator's terminal.
fn unreadable(e: std::io::Error) -> anyhow::Error {
    let text = e.to_string();
    let mut shown: String = text.escape_default().take(200).collect();
    if shown.len() < text.escape_default().count() {
        shown.push_str("...");
    }
    anyhow::anyhow!("reading the backup (damaged or cut short): {shown}")
}

/// A failed write of the restored file `name`: the destination's fault,
/// not the backup's.
fn unwritable(name: &str, e: std::io::Error) -> anyhow::Error {
    use std::io::ErrorKind::{QuotaExceeded, StorageFull};
    let full = matches!(e.kind(), StorageFull | QuotaExceeded);
    anyhow::anyhow!(
        "writing the restored {name} (the backup is not at fault): {e}{}",
        if full {
            "; the restore's disk is full: free space there, or restore into a data dir on another disk"
        } else {
            ""
        }
    )
}

/// Copy an archive entry `from` into the restored file `name` (`to`):
/// read errors are the backup's, write errors the destination's (a full
/// disk must not pass for a damaged backup).
fn copy_entry(
    from: &mut impl std::io::Read,
    to: &mut impl std::io::Write,
    buf: &mut [u8],
    name: &str,
) -> Result<()> {
    loop {
        let n = match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(unreadable(e)),
        };
        to.write_all(&buf[..n]).map_err(|e| unwritable(name, e))?;
    }
}

/// Unpack a backup into the empty dir `dir` and check it: the database and
/// `server.key` are there, every entry a plain file, the keys are keys, the
/// database opens, its ledger adds up and matches the totals `backup.json`
/// recorded.
fn unpack(input: impl std::io::Read, dir: &Path) -> Result<()> {
    let mut buf = vec![0u8; 256 << 10];
    let mut archive = tar::Archive::new(input);
    let (mut seen_db, mut seen_key, mut seen_arbiter) = (false, false, false);
    let mut unpacked = Vec::new();
    let mut first = true;
    for entry in archive.entries().map_err(unreadable)? {
        // Every backup begins with its manifest.
        let read = entry.and_then(|entry| {
            let name = entry.path()?.to_string_lossy().into_owned();
            Ok((entry, name))
        });
        let (mut entry, name) = match read {
            Ok((_, name)) if first && name != MANIFEST => return Err(NotABackup.into()),
            Err(_) if first => return Err(NotABackup.into()),
            read => read.map_err(unreadable)?,
        };
        first = false;
        if !entry.header().entry_type().is_file() {
            bail!(
                "entry {:?} of the backup is not a plain file",
                name.escape_debug().to_string()
            );
        }
        let allowed = name == DB
            || name == MANIFEST
            || [SERVER_KEY, ARBITER_KEY].contains(&name.as_str())
            || name
                .strip_prefix("uploads/")
                .is_some_and(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.'));
        if !allowed {
            bail!(
                "unexpected entry {:?} in the backup",
                name.escape_debug().to_string()
            );
        }
        if name != MANIFEST {
            unpacked.push(name.clone());
        }
        seen_db |= name == DB;
        seen_key |= name == SERVER_KEY;
        seen_arbiter |= name == ARBITER_KEY;
        let target = dir.join(&name);
        if let Some(parent) = target.parent() {
            crate::state::create_private_dir(parent)?;
        }
        let mut options = File::options();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut out = options.open(&target).map_err(|e| unwritable(&name, e))?;
        copy_entry(&mut entry, &mut out, &mut buf, &name)?;
        out.sync_all().map_err(|e| unwritable(&name, e))?;
    }
    if first {
        // An empty archive (or an empty file).
        return Err(NotABackup.into());
    }
    anyhow::ensure!(
        seen_db && seen_key,
        "the backup lacks the database or server.key"
    );
    // The manifest first: its digests are checked before anything opens
    // (and so changes) the database.
    let text = std::fs::read(dir.join(MANIFEST))
        .context("the backup lacks backup.json (its manifest and ledger totals)")?;
    let manifest: serde_json::Value =
        serde_json::from_slice(&text).context("backup.json is not JSON")?;
    check_digests(&manifest, dir, &unpacked)?;
    // What `serve` would refuse at start is refused now.
    crate::money::ledger::Ledger::open(dir).context("the backup's server.key")?;
    if seen_arbiter {
        crate::auth::Arbiter::open(dir, None).context("the backup's arbiter.key")?;
    }
    let storage = Storage::open(&dir.join(DB), Default::default())
        .context("the restored database does not open")?;
    let txn = storage.begin_read().map_err(|e| anyhow::anyhow!("{e}"))?;
    let t = crate::money::ledger::Ledger::totals(&txn)?;
    anyhow::ensure!(
        t.minted == t.unspent + t.fees + t.escrow,
        "the restored ledger does not add up: {t:?}"
    );
    // The totals the backup recorded when it was taken: every backup has
    // them (one without is not a whole backup of this service).
    let recorded = &manifest["totals"];
    anyhow::ensure!(recorded.is_object(), "backup.json records no ledger totals");
    for (name, now) in [("minted", t.minted), ("fees", t.fees), ("escrow", t.escrow)] {
        anyhow::ensure!(
            recorded[name].as_u64() == Some(now),
            "backup.json records {name} {} but the database holds {now}: the two files are not of one backup",
            recorded[name]
        );
    }
    Ok(())
}

/// The SHA-256 of a file's bytes, read in pieces, lower-case hex.
fn sha256_of_file(path: &Path) -> Result<String> {
    use sha2::{Digest, Sha256};
    let mut hasher = Sha256::new();
    let mut f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    std::io::copy(&mut f, &mut hasher)?;
    Ok(marketplace_common::hex::encode(&hasher.finalize()))
}

/// Every file `unpacked` into `dir` against the SHA-256 `backup.json`
/// recorded for it (`sha256`, since backups record it): one changed, added
/// or missing since the backup was taken is refused. A backup of an
/// earlier version, without digests, is checked by its totals alone.
fn check_digests(manifest: &serde_json::Value, dir: &Path, unpacked: &[String]) -> Result<()> {
    let Some(recorded) = manifest.get("sha256") else {
        return Ok(());
    };
    let recorded = recorded
        .as_object()
        .context("backup.json's sha256 is not an object")?;
    for name in unpacked {
        let Some(want) = recorded.get(name).and_then(|v| v.as_str()) else {
            bail!(
                "the backup holds {:?}, which its backup.json does not list",
                name.escape_debug().to_string()
            );
        };
        let have = sha256_of_file(&dir.join(name))?;
        anyhow::ensure!(
            have == want,
            "{name} of the backup is not what was backed up (its SHA-256 differs from backup.json's): the archive was changed or damaged"
        );
    }
    for name in recorded.keys() {
        anyhow::ensure!(
            unpacked.contains(name),
            "the backup lacks {:?}, which its backup.json lists",
            name.escape_debug().to_string()
        );
    }
    Ok(())
}

/// A writer that counts what passes.
struct Counting<'a> {
    inner: &'a mut dyn Write,
    n: u64,
}

impl Write for Counting<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_that_cannot_write_blames_the_destination() {
        use std::io::{Error, ErrorKind, Read, Write};
        /// Fails with `kind` once `left` bytes are through.
        struct Failing {
            left: usize,
            kind: ErrorKind,
        }
        impl Read for Failing {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                match self.left.min(buf.len()) {
                    0 => Err(Error::from(self.kind)),
                    n => {
                        self.left -= n;
                        Ok(n)
                    }
                }
            }
        }
        impl Write for Failing {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                match self.left.min(buf.len()) {
                    0 => Err(Error::from(self.kind)),
                    n => {
                        self.left -= n;
                        Ok(n)
                    }
                }
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut buf = [0u8; 16];
        let copy = |from: &mut dyn Read, to: &mut dyn Write, buf: &mut [u8]| {
            copy_entry(&mut &mut *from, &mut &mut *to, buf, "marketplace.redb")
                .unwrap_err()
                .to_string()
        };
        // A full disk: the destination's, said so.
        let mut data: &[u8] = &[7u8; 100];
        let mut full = Failing {
            left: 40,
            kind: ErrorKind::StorageFull,
        };
        let e = copy(&mut data, &mut full, &mut buf);
        assert!(
            e.starts_with("writing the restored marketplace.redb (the backup is not at fault)")
                && e.contains("the restore's disk is full")
                && !e.contains("damaged"),
            "{e}"
        );
        // Another write error: the destination's, no word of a full disk.
        let mut data: &[u8] = &[7u8; 100];
        let mut denied = Failing {
            left: 0,
            kind: ErrorKind::PermissionDenied,
        };
        let e = copy(&mut data, &mut denied, &mut buf);
        assert!(
            e.starts_with("writing the restored") && !e.contains("disk is full"),
            "{e}"
        );
        // A read error: the backup's.
        let mut damaged = Failing {
            left: 30,
            kind: ErrorKind::UnexpectedEof,
        };
        let e = copy(&mut damaged, &mut Vec::new(), &mut buf);
        assert!(
            e.starts_with("reading the backup (damaged or cut short)"),
            "{e}"
        );
        // An interrupted read is read again.
        struct Interrupted(bool);
        impl Read for Interrupted {
            fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
                if std::mem::replace(&mut self.0, false) {
                    return Err(Error::from(ErrorKind::Interrupted));
                }
                buf[0] = 1;
                Ok(1)
            }
        }
        let mut once = Interrupted(true).take(3);
        let mut out = Vec::new();
        copy_entry(&mut once, &mut out, &mut buf, "x").unwrap();
        assert_eq!(out, [1, 1, 1]);
    }

    /// A data dir `dir/data` with its server key and 500 units minted.
    fn data_dir_with_cash(dir: &Path) -> (std::path::PathBuf, Storage) {
        let data = dir.join("data");
        std::fs::create_dir_all(&data).unwrap();
        let storage = Storage::open(&data.join(DB), Default::default()).unwrap();
        let ledger = crate::money::ledger::Ledger::open(&data).unwrap();
        let txn = storage.begin_write().unwrap();
        ledger.mint(&txn, 500).unwrap();
        storage.commit(txn).unwrap();
        (data, storage)
    }

    /// The keys of a data dir that has its own key files.
    fn keys_of(data: &Path) -> Keys {
        Keys::offline(&Config {
            data_dir: data.to_path_buf(),
            ..Config::default()
        })
        .unwrap()
    }

    #[test]
    fn an_offline_backup_holds_the_configured_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (hex, arbiter) = ("1f".repeat(32), "2e".repeat(32));
        let config = Config {
            data_dir: dir.path().join("data"),
            server_key: Some(hex.clone()),
            arbiter_key: Some(arbiter.clone()),
            ..Config::default()
        };
        {
            let storage = crate::state::open_embedded(&config).unwrap();
            let ledger = crate::state::embedded_ledger(&config).unwrap();
            let txn = storage.begin_write().unwrap();
            ledger.mint(&txn, 5).unwrap();
            storage.commit(txn).unwrap();
        }
        assert!(!config.data_dir.join(SERVER_KEY).exists());
        assert!(!config.data_dir.join(ARBITER_KEY).exists());
        let file = dir.path().join("b.tar");
        offline(&config, &file).unwrap();
        let restored = dir.path().join("restored");
        restore(&file, &restored).unwrap();
        assert_eq!(
            std::fs::read_to_string(restored.join(SERVER_KEY)).unwrap(),
            hex
        );
        assert_eq!(
            std::fs::read_to_string(restored.join(ARBITER_KEY)).unwrap(),
            arbiter
        );
        // Neither configured nor in the data dir: no backup, and no key
        // made up for it.
        let bare = Config {
            server_key: None,
            ..config.clone()
        };
        let err = offline(&bare, &dir.path().join("c.tar")).unwrap_err();
        assert!(
            format!("{err:#}").contains("no server_key is configured"),
            "{err:#}"
        );
        assert!(!bare.data_dir.join(SERVER_KEY).exists());
    }

    #[test]
    fn a_backup_restores_into_a_new_dir_with_its_keys() {
        let dir = tempfile::tempdir().unwrap();
        let (data, storage) = data_dir_with_cash(dir.path());
        let txn = storage.begin_write().unwrap();
        txn.put_in("kv:notes", b"k", b"v").unwrap();
        storage.commit(txn).unwrap();
        let file = dir.path().join("b.tar");
        write_atomically(&file, |f| snapshot(&storage, &data, &keys_of(&data), f)).unwrap();
        let restored = dir.path().join("restored");
        restore(&file, &restored).unwrap();
        assert_eq!(
            std::fs::read(restored.join("server.key")).unwrap(),
            std::fs::read(data.join("server.key")).unwrap()
        );
        // No arbiter key yet (made at the first start): none backed up,
        // and none made by the backup.
        assert!(!data.join(ARBITER_KEY).exists());
        assert!(!restored.join(ARBITER_KEY).exists());
        let copy = Storage::open(&restored.join(DB), Default::default()).unwrap();
        let r = copy.begin_read().unwrap();
        use crate::store::Kv;
        assert_eq!(
            r.get_in("kv:notes", b"k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(crate::money::ledger::total(&r, "minted").unwrap(), 500);
        // Never over an existing database; a cut backup leaves nothing.
        assert!(restore(&file, &restored).is_err());
        let bytes = std::fs::read(&file).unwrap();
        let cut = dir.path().join("cut.tar");
        std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
        let target = dir.path().join("again");
        assert!(restore(&cut, &target).is_err());
        assert!(!target.exists());
        assert_eq!(
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| e
                    .as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with('.'))
                .count(),
            0
        );
        restore(&file, &target).unwrap();
    }

    /// A backup's entries, as (name, bytes).
    type Entries = Vec<(String, Vec<u8>)>;

    /// The entries of a backup file.
    fn entries(file: &Path) -> Entries {
        let mut archive = tar::Archive::new(File::open(file).unwrap());
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let name = entry.path().unwrap().to_string_lossy().into_owned();
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut bytes).unwrap();
            out.push((name, bytes));
        }
        out
    }

    /// A backup file of these entries; `link` adds a symlink entry.
    fn write_backup(file: &Path, entries: &Entries, link: Option<&str>) {
        let mut tar = tar::Builder::new(File::create(file).unwrap());
        for (name, bytes) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o600);
            header.set_cksum();
            tar.append_data(&mut header, name, bytes.as_slice())
                .unwrap();
        }
        if let Some(name) = link {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, name, "/etc/passwd").unwrap();
        }
        tar.finish().unwrap();
    }

    #[test]
    fn a_file_that_is_no_archive_is_refused_in_plain_ascii() {
        let dir = tempfile::tempdir().unwrap();
        // Bytes a tar header parser chokes on, quoting them: control
        // characters and ones that are not UTF-8.
        let junk: Vec<u8> = (0..2048u32).map(|i| (i * 7 + 0x15) as u8).collect();
        let file = dir.path().join("junk.tar");
        std::fs::write(&file, &junk).unwrap();
        let err = format!("{:#}", restore(&file, &dir.path().join("new")).unwrap_err());
        assert!(err.contains("not a backup"), "{err}");
        assert!(
            err.is_ascii() && !err.chars().any(|c| c.is_control()),
            "{err}"
        );
        assert!(err.len() < 400, "{err}");
        assert!(!dir.path().join("new").exists());
    }

    #[test]
    fn a_backup_whose_server_would_not_start_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (data, storage) = data_dir_with_cash(dir.path());
        crate::auth::Arbiter::open(&data, None).unwrap();
        let good = dir.path().join("good.tar");
        write_atomically(&good, |f| snapshot(&storage, &data, &keys_of(&data), f)).unwrap();
        let original = entries(&good);
        // An entry changed without its digest (damage, tampering)...
        let tampered = |name: &str, bytes: &[u8]| -> Entries {
            original
                .iter()
                .map(|(n, b)| {
                    (
                        n.clone(),
                        if n == name { bytes.to_vec() } else { b.clone() },
                    )
                })
                .collect()
        };
        let mut manifest: serde_json::Value =
            serde_json::from_slice(&original.iter().find(|(n, _)| n == MANIFEST).unwrap().1)
                .unwrap();
        // ...or with it, so that the checks after the digests' see it.
        let as_backed_up = manifest.clone();
        let edited = |name: &str, bytes: &[u8]| -> Entries {
            let mut entries = tampered(name, bytes);
            if name != MANIFEST && !name.is_empty() {
                let mut m = as_backed_up.clone();
                m["sha256"][name] = json!(marketplace_common::hex::sha256(bytes));
                let m = serde_json::to_vec(&m).unwrap();
                entries
                    .iter_mut()
                    .filter(|(n, _)| n == MANIFEST)
                    .for_each(|(_, b)| *b = m.clone());
            }
            entries
        };
        manifest["totals"]["minted"] = json!(1000);
        let without_manifest: Entries = original
            .iter()
            .filter(|(n, _)| n != MANIFEST)
            .cloned()
            .collect();
        let mut no_totals = manifest.clone();
        no_totals.as_object_mut().unwrap().remove("totals");
        // The database with one byte of a page changed (a post's content,
        // say): it may open and add up, but it is not what was backed up.
        let db = &original.iter().find(|(n, _)| n == DB).unwrap().1;
        let mut flipped = db.clone();
        let at = flipped.len() / 2;
        flipped[at] ^= 0x20;
        let mut added = original.clone();
        added.push(("uploads/x.json".into(), b"{}".to_vec()));
        let no_arbiter: Entries = original
            .iter()
            .filter(|(n, _)| n != "arbiter.key")
            .cloned()
            .collect();
        let cases: Vec<(&str, Entries, Option<&str>, &str)> = vec![
            ("nomanifest", without_manifest, None, "is not a backup"),
            (
                "nototals",
                edited(MANIFEST, &serde_json::to_vec(&no_totals).unwrap()),
                None,
                "no ledger totals",
            ),
            ("badkey", edited("server.key", b"zz"), None, "not 64 hex"),
            (
                "shortkey",
                edited("server.key", b"abcd"),
                None,
                "must hold 32 bytes",
            ),
            (
                "badarbiter",
                edited("arbiter.key", b"not hex"),
                None,
                "arbiter key must be 64 hex",
            ),
            (
                "link",
                edited("", b""),
                Some("uploads/x.wasm"),
                "not a plain file",
            ),
            (
                "manifest",
                edited(MANIFEST, &serde_json::to_vec(&manifest).unwrap()),
                None,
                "minted",
            ),
            ("db", tampered(DB, &flipped), None, "SHA-256 differs"),
            (
                "badkeydigest",
                tampered("server.key", b"zz"),
                None,
                "server.key of the backup is not what was backed up",
            ),
            ("added", added, None, "does not list"),
            ("dropped", no_arbiter, None, "lacks \"arbiter.key\""),
        ];
        for (label, entries, link, expected) in cases {
            let file = dir.path().join(format!("{label}.tar"));
            write_backup(&file, &entries, link);
            let target = dir.path().join(format!("{label}-restored"));
            let e = restore(&file, &target).expect_err(label);
            assert!(format!("{e:#}").contains(expected), "{label}: {e:#}");
            assert!(!target.exists(), "{label}");
        }
        // The unchanged entries, written the same way, restore.
        let same = dir.path().join("same.tar");
        write_backup(&same, &original, None);
        restore(&same, &dir.path().join("same-restored")).unwrap();
        // A backup of an earlier version (no digests) is checked by its
        // totals alone.
        let mut old_manifest = manifest.clone();
        old_manifest["totals"] = serde_json::from_slice::<serde_json::Value>(
            &original.iter().find(|(n, _)| n == MANIFEST).unwrap().1,
        )
        .unwrap()["totals"]
            .clone();
        old_manifest.as_object_mut().unwrap().remove("sha256");
        let older = dir.path().join("older.tar");
        write_backup(
            &older,
            &edited(MANIFEST, &serde_json::to_vec(&old_manifest).unwrap()),
            None,
        );
        restore(&older, &dir.path().join("older-restored")).unwrap();
        // Not a backup at all: said so.
        let noise = dir.path().join("noise.tar");
        let bytes: Vec<u8> = (0..2048u32).map(|i| (i * 7 % 256) as u8).collect();
        std::fs::write(&noise, &bytes).unwrap();
        let e = restore(&noise, &dir.path().join("noise-restored")).unwrap_err();
        assert!(format!("{e:#}").contains("is not a backup"), "{e:#}");
        // A manifest, then noise: the tar reader's error, shown without
        // raw control bytes.
        let mut damaged = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(2);
        header.set_mode(0o600);
        header.set_cksum();
        damaged
            .append_data(&mut header, MANIFEST, &b"{}"[..])
            .unwrap();
        let mut damaged = damaged.into_inner().unwrap();
        damaged.truncate(1024);
        damaged.extend_from_slice(&bytes);
        std::fs::write(&noise, &damaged).unwrap();
        let e = restore(&noise, &dir.path().join("noise-restored")).unwrap_err();
        let text = format!("{e:#}");
        assert!(text.contains("damaged or cut short"), "{text:?}");
        assert!(!text.chars().any(|c| c.is_control()), "{text:?}");
    }

    #[test]
    fn what_a_killed_backup_or_restore_left_is_removed_by_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let long_ago = std::time::SystemTime::now() - 2 * ABANDONED_AFTER;
        let make = |name: &str| {
            let path = dir.path().join(name);
            let file = File::create(&path).unwrap();
            file.set_modified(long_ago).unwrap();
            (path, file)
        };
        // Left by a killed backup: old, nobody holds it.
        let (left, _) = make(".marketplace-backup-left");
        // A backup still running: held, however old.
        let (running, held) = make(".marketplace-backup-running");
        held.lock().unwrap();
        // Just made, not locked yet: too new to be taken for left.
        let new = dir.path().join(".marketplace-backup-new");
        std::fs::write(&new, b"").unwrap();
        // Not ours.
        let (other, _) = make("marketplace-backup-other");
        // A killed restore's staging dir beside the data dir.
        let staging = dir.path().join(".marketplace-restore-left");
        std::fs::create_dir(&staging).unwrap();
        let inside = staging.join("marketplace.redb");
        std::fs::write(&inside, b"x").unwrap();
        for path in [&inside, &staging] {
            File::open(path).unwrap().set_modified(long_ago).unwrap();
        }

        let to = dir.path().join("b.tar");
        write_atomically(&to, |f| Ok(f.write(b"backup")? as u64)).unwrap();
        assert_eq!(std::fs::read(&to).unwrap(), b"backup");
        assert!(!left.exists());
        assert!(running.exists() && new.exists() && other.exists());
        assert!(staging.exists(), "a backup removes only its own kind");

        let junk = dir.path().join("junk.tar");
        std::fs::write(&junk, b"not a backup").unwrap();
        assert!(restore(&junk, &dir.path().join("data")).is_err());
        assert!(!staging.exists());
        assert!(running.exists());
        drop(held);
    }
}
