//! Components swapped in or mounted through the admin API are kept in
//! `<data_dir>/uploads/` (`NAME.wasm` plus `NAME.json` with its component
//! name and grants; an unmount leaves only `NAME.json` saying so), and
//! replayed at start ([`mount_at_start`]), so a restart serves the same
//! versions the operator last uploaded.
//!
//! With a shared store they are kept in the store instead (`host:uploads`:
//! family -> the same JSON; `host:upload-blobs`: family -> the component),
//! and every host of the fleet polls them ([`spawn_fleet_sync`]): a swap,
//! mount or unmount made through any host's admin API is served by all of
//! them within [`FLEET_POLL`] plus a compile.

use crate::app::App;
use crate::capabilities::Grants;
use crate::runtime::OneChange;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Shared store tables of the kept uploads.
pub const ROWS: &str = "host:uploads";
pub const BLOBS: &str = "host:upload-blobs";
/// How often a host of a fleet looks for uploads made through another.
pub const FLEET_POLL: Duration = Duration::from_millis(100);
/// At most one line this often about polls that failed.
const FAILED_LOG_EVERY: Duration = Duration::from_secs(1);

#[derive(Serialize, Deserialize)]
struct Kept {
    component: String,
    grants: Vec<String>,
    reads: Vec<String>,
    #[serde(default)]
    unmounted: bool,
    /// Shared store: when and by which upload (so that the same bytes
    /// uploaded again are applied again).
    #[serde(default)]
    upload: String,
    /// The sha256 of the family's file in the plugins directory when this
    /// was recorded ("-" when there was none; absent in older records): a
    /// file whose content differs at start changed since, and serves.
    #[serde(default)]
    file: Option<String>,
    /// That file's path in the plugins directory (absent in older
    /// records): when the configuration names another file now, the
    /// upload still serves, since no file it was weighed against changed.
    #[serde(default)]
    path: Option<String>,
    /// The uploaded component's sha256 (none for an unmount; absent in
    /// older records): whether the upload is what a host serves.
    #[serde(default)]
    hash: Option<String>,
}

/// Keep `kept` (and the component, when given) in the shared store.
fn record_shared(app: &App, family: &str, kept: &mut Kept, bytes: Option<&[u8]>) -> Result<()> {
    kept.upload = app.ids.ulid_at(app.now_ms());
    let row = serde_json::to_vec(kept)?;
    app.storage
        .write(|txn| {
            txn.put_in(ROWS, family.as_bytes(), &row)?;
            match bytes {
                Some(b) => txn.put_in(BLOBS, family.as_bytes(), b)?,
                None => {
                    txn.delete_in(BLOBS, family.as_bytes())?;
                }
            }
            Ok::<_, crate::store::StorageError>(())
        })
        .and_then(|r| r)
        .map_err(|e| anyhow::anyhow!("keeping the upload in the shared store: {e}"))?;
    app.uploads_applied.set(family, row);
    Ok(())
}

fn dir(app: &App) -> PathBuf {
    app.config.data_dir.join("uploads")
}

/// Write `bytes` to `path` atomically (temp file, fsync, rename), 0600.
/// The temp file is the path's own (`NAME.wasm.tmp`, `NAME.json.tmp`): a
/// component and its record never share one.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut options = std::fs::File::options();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut f = options
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// Keep the component just swapped in for `family`.
pub fn record(app: &App, family: &str, bytes: &[u8]) -> Result<()> {
    let status = app
        .runtime
        .status(family)
        .context("the family has no slot")?;
    let mut kept = Kept {
        component: status.component,
        grants: status.grants,
        reads: status.reads,
        unmounted: false,
        upload: String::new(),
        file: Some(file_hash(app, family)),
        path: Some(family_component(app, family)),
        hash: Some(marketplace_common::hex::sha256(bytes)),
    };
    if app.storage.is_shared() {
        return record_shared(app, family, &mut kept, Some(bytes));
    }
    let dir = dir(app);
    crate::state::create_private_dir(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    // The component is staged under its hash, the record (naming that
    // hash) is the commit, then the component takes its place: a stop
    // anywhere between leaves the old record with its old component, or
    // the new record with the new one staged, which a start puts in place
    // ([`settle_staged`]). (Written in place first, a kill -9 before the
    // record left the new component under the old record's name and
    // grants, listed as the old one.)
    let hash = kept.hash.clone().unwrap_or_default();
    let staged = staged_path(&dir, family, &hash);
    write_file(&staged, bytes)?;
    write_file(
        &dir.join(format!("{family}.json")),
        &serde_json::to_vec_pretty(&kept)?,
    )?;
    std::fs::rename(&staged, dir.join(format!("{family}.wasm")))
        .with_context(|| format!("putting {} in place", staged.display()))
}

/// Where [`record`] stages the component of hash `hash` for `family`.
fn staged_path(dir: &std::path::Path, family: &str, hash: &str) -> PathBuf {
    dir.join(format!("{family}.{hash}.wasm"))
}

/// At start, before the kept records are read: a component staged for a
/// record that names it (a stop after the record was written) takes its
/// place; one staged for a record never written, and the temporary files
/// of writes a stop cut short, go.
fn settle_staged(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.ends_with(".tmp") {
            let _ = std::fs::remove_file(&path);
            continue;
        }
        // FAMILY.HASH.wasm (a family name has no dot).
        let Some((family, hash)) = name
            .strip_suffix(".wasm")
            .and_then(|stem| stem.split_once('.'))
        else {
            continue;
        };
        let named = std::fs::read(dir.join(format!("{family}.json")))
            .ok()
            .and_then(|b| serde_json::from_slice::<Kept>(&b).ok())
            .is_some_and(|k| !k.unmounted && k.hash.as_deref() == Some(hash));
        if named {
            match std::fs::rename(&path, dir.join(format!("{family}.wasm"))) {
                Ok(()) => tracing::info!(
                    family,
                    "the upload a stop cut short after it was recorded is put in place"
                ),
                Err(e) => tracing::error!(family, "{} not put in place: {e}", path.display()),
            }
        } else {
            tracing::info!(
                family,
                "an upload a stop cut short before it was recorded is dropped: the one before serves"
            );
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// Keep that `family` was unmounted.
pub fn record_unmount(app: &App, family: &str) -> Result<()> {
    let mut kept = Kept {
        component: String::new(),
        grants: vec![],
        reads: vec![],
        unmounted: true,
        upload: String::new(),
        file: Some(file_hash(app, family)),
        path: Some(family_component(app, family)),
        hash: None,
    };
    if app.storage.is_shared() {
        return record_shared(app, family, &mut kept, None);
    }
    let dir = dir(app);
    crate::state::create_private_dir(&dir)?;
    write_file(
        &dir.join(format!("{family}.json")),
        &serde_json::to_vec_pretty(&kept)?,
    )?;
    let _ = std::fs::remove_file(dir.join(format!("{family}.wasm")));
    Ok(())
}

/// The admin change kept for `family` (an upload or an unmount), as the
/// watcher weighs it against the family's file: it stands while it is
/// what serves and the file is the one it was made over, as at a start
/// ([`file_changed`]). `Err` when the shared store did not answer.
pub fn kept_change(
    app: &App,
    family: &str,
) -> Result<Option<crate::runtime::reload::KeptChange>, String> {
    let row = if app.storage.is_shared() {
        use crate::store::Kv;
        app.storage
            .begin_read()
            .and_then(|r| r.get_in(ROWS, family.as_bytes()))
            .map_err(|e| e.to_string())?
    } else {
        std::fs::read(dir(app).join(format!("{family}.json"))).ok()
    };
    let Some(kept) = row.and_then(|row| serde_json::from_slice::<Kept>(&row).ok()) else {
        return Ok(None);
    };
    Ok(Some(crate::runtime::reload::KeptChange {
        unmounted: kept.unmounted,
        file: weighed_file(app, family, &kept).map(str::to_string),
        component: kept.hash,
    }))
}

/// Whether an upload through the admin API is kept for `family` (not an
/// unmount): one a start refused leaves a family that is not mounted with
/// an upload still to settle.
/// `Err` when the shared store did not answer.
pub fn kept_upload(app: &App, family: &str) -> Result<bool, String> {
    Ok(kept_change(app, family)?.is_some_and(|change| !change.unmounted))
}

/// The families kept unmounted through the admin API (the watcher does
/// not mount their files in the families directory until they change).
pub fn kept_unmounts(app: &App) -> Vec<String> {
    let kept: Vec<(String, Vec<u8>)> = if app.storage.is_shared() {
        use crate::store::Kv;
        app.storage
            .begin_read()
            .and_then(|r| r.scan_in(ROWS, b"", None, false, 10_000))
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
            .collect()
    } else {
        std::fs::read_dir(dir(app))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| {
                let family = p.file_stem()?.to_str()?.to_string();
                Some((family, std::fs::read(&p).ok()?))
            })
            .collect()
    };
    kept.into_iter()
        .filter(|(_, row)| serde_json::from_slice::<Kept>(row).is_ok_and(|k| k.unmounted))
        .map(|(family, _)| family)
        .collect()
}

/// A component file of the plugins directory serves `family` now (the
/// watcher swapped or mounted it): on one host the file decides from
/// then on, so the family's kept upload or unmount is dropped (a restart
/// serves the file). A fleet's record stays: the fleet's choice is kept
/// over one host's directory (README "Scale-out").
pub fn file_serves(app: &App, family: &str) {
    if app.storage.is_shared() {
        return;
    }
    let dir = dir(app);
    let json = dir.join(format!("{family}.json"));
    if json.exists() {
        let _ = std::fs::remove_file(dir.join(format!("{family}.wasm")));
        match std::fs::remove_file(&json) {
            Ok(()) => tracing::info!(
                family,
                "the plugins directory's file serves now: the admin upload kept for restarts is dropped"
            ),
            Err(e) => tracing::warn!(family, "dropping the kept upload {}: {e}", json.display()),
        }
    }
}

/// The component file in the plugins directory that serves `family` when
/// nothing was uploaded: the configured one, or the families directory's.
fn family_file(app: &App, family: &str) -> PathBuf {
    app.runtime
        .plugins_dir()
        .join(family_component(app, family))
}

/// [`family_file`], relative to the plugins directory.
fn family_component(app: &App, family: &str) -> String {
    app.config.family(family).map_or_else(
        || format!("{}/{family}.wasm", crate::runtime::reload::FAMILIES_DIR),
        |f| f.component,
    )
}

/// Whether `family`'s file in the plugins directory changed since `kept`
/// was recorded: the same file (by path) with other content. A file that
/// is not there cannot serve, and one the configuration names only since
/// is no change of what the upload was weighed against.
fn file_changed(app: &App, family: &str, kept: &Kept) -> bool {
    // (Nothing need be read when no recorded file is the one to weigh.)
    weighed_file(app, family, kept).is_some_and(|recorded| {
        let now = file_hash(app, family);
        now != "-" && recorded != now
    })
}

/// The sha256 `kept` recorded of `family`'s file ("-": none), when that
/// file is still the family's: another path configured now is not the
/// file the change was weighed against (a record older than its `path`
/// is taken as made over the file configured now).
fn weighed_file<'a>(app: &App, family: &str, kept: &'a Kept) -> Option<&'a str> {
    let recorded = kept.file.as_deref()?;
    let moved = kept
        .path
        .as_ref()
        .is_some_and(|path| *path != family_component(app, family));
    (!moved).then_some(recorded)
}

/// The sha256 (hex) of `family`'s file in the plugins directory, "-" when
/// there is none.
fn file_hash(app: &App, family: &str) -> String {
    std::fs::read(family_file(app, family))
        .map_or_else(|_| "-".to_string(), |b| marketplace_common::hex::sha256(&b))
}

/// A kept upload or unmount, to replay at start ([`pending`], [`replay`]).
struct Pending {
    family: String,
    kept: Kept,
    /// The component (not read for an unmount).
    bytes: Component,
    /// The shared store's record, marked applied once replayed.
    row: Option<Vec<u8>>,
}

/// Where a kept component is: read only when it is mounted, so that no
/// more than one is held in memory at start.
enum Component {
    None,
    /// With the sha256 its record names (absent in older records).
    File(PathBuf, Option<String>),
    /// From the fleet's snapshot (read with its record).
    Read(Result<Vec<u8>>),
}

impl Component {
    fn read(self) -> Result<Vec<u8>> {
        match self {
            Component::None => Ok(Vec::new()),
            Component::File(path, hash) => {
                let bytes =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                let found = marketplace_common::hex::sha256(&bytes);
                match hash {
                    Some(named) if named != found => anyhow::bail!(
                        "{} is not the component its record names (sha256 {found}, the record's {named}): upload it again",
                        path.display()
                    ),
                    _ => Ok(bytes),
                }
            }
            Component::Read(bytes) => bytes,
        }
    }
}

/// The kept uploads and unmounts to replay at start (on a shared store,
/// the fleet's): a family each. One whose file in the plugins directory
/// changed since (a deploy while the host was down) is left out, and the
/// file serves, as it would have while the host ran.
fn pending(app: &App) -> Vec<Pending> {
    if app.storage.is_shared() {
        return fleet_pending(app).unwrap_or_else(|e| {
            tracing::error!("uploads of the shared store not applied: {e:#}");
            Vec::new()
        });
    }
    settle_staged(&dir(app));
    let Ok(entries) = std::fs::read_dir(dir(app)) else {
        return Vec::new();
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    let mut out = Vec::new();
    for path in names {
        let Some(family) = path.file_stem().and_then(|s| s.to_str()).map(String::from) else {
            continue;
        };
        let kept: Kept = match std::fs::read(&path)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice(&b)?))
        {
            Ok(k) => k,
            Err(e) => {
                tracing::error!(family, "unreadable {}: {e:#}", path.display());
                continue;
            }
        };
        // (A file written again with the same bytes did not change.)
        if file_changed(app, &family, &kept) {
            // A warning: an upgrade deploys every file anew, so this is
            // also how a swap made through the admin API (a fee policy,
            // say) ends at the first start of a new version.
            let (decided, again) = if kept.unmounted {
                (
                    "unmount".to_string(),
                    "to unmount it again, `marketplace plugins unmount`",
                )
            } else {
                (
                    format!("upload {}", kept.component),
                    "to serve it again, upload its new build (`marketplace plugins load`) or name it in the configuration",
                )
            };
            tracing::warn!(
                family,
                "{} changed since the admin API's {decided} (a deploy or an upgrade while the host was down): the file serves and the {decided} is dropped; {again}",
                family_file(app, &family).display(),
            );
            file_serves(app, &family);
            continue;
        }
        let bytes = if kept.unmounted {
            Component::None
        } else {
            Component::File(path.with_extension("wasm"), kept.hash.clone())
        };
        out.push(Pending {
            family,
            kept,
            bytes,
            row: None,
        });
    }
    out
}

/// Serve what `p` keeps; whether that is what serves now.
fn replay(app: &App, p: Pending, held: &OneChange) -> bool {
    let Pending {
        family,
        kept,
        bytes,
        row,
    } = p;
    let served = apply(app, &family, &kept, || bytes.read(), held);
    // Applied or refused: a fleet's record is not tried again until it
    // changes.
    if let Some(row) = row {
        app.uploads_applied.set(&family, row);
    }
    served
}

/// Mount the families at start: the built-in ones, then the other
/// configured ones, then those only uploaded through the admin API
/// ([`crate::config::Config::start_rank`]), so a path two of them declare
/// goes to the one first in that order, whichever compiles first. Within
/// a rank the configured components load first (smallest first), then the
/// kept uploads and unmounts; a family an upload or unmount decides never
/// serves its configured component meanwhile (a contract bought then
/// would keep the wrong fee policy), unless the upload is refused.
///
/// The admin API refuses uploads and unmounts until the start is done
/// (`Runtime::loading`: the families directory is mounted after this):
/// one made while the start had read the kept records and not yet
/// replayed them was partly undone (the new file served under the old
/// record's name and grants, or on a shared store the old component,
/// until the next poll). The records are read and replayed under
/// `one_change` all the same, as every change of what serves is.
///
/// Returns the families of the kept uploads (not unmounts), served or
/// refused: their `[settings.X]` tables are for a family (a refused one's
/// refusal is its own error line and alert, which may name such a
/// setting).
pub fn mount_at_start(app: &App) -> Vec<String> {
    let started = std::time::Instant::now();
    let config = &app.config;
    let held = app.runtime.one_change();
    let mut pending = pending(app);
    let kept: Vec<String> = pending
        .iter()
        .filter(|p| !p.kept.unmounted)
        .map(|p| p.family.clone())
        .collect();
    let specs = config.families();
    for rank in 0..=2 {
        let (now, later): (Vec<Pending>, Vec<Pending>) = pending
            .into_iter()
            .partition(|p| config.start_rank(&p.family) == rank);
        pending = later;
        let configured: Vec<_> = specs
            .iter()
            .filter(|f| config.start_rank(&f.name) == rank)
            .filter(|f| !now.iter().any(|p| p.family == f.name))
            .cloned()
            .collect();
        app.runtime.load_specs(&configured, started);
        for p in now {
            let family = p.family.clone();
            if replay(app, p, &held) {
                continue;
            }
            // Not what the operator decided last: say so where a monitor
            // looks, not only in the log.
            let spec = specs.iter().find(|f| f.name == family);
            if let Some(spec) = spec {
                // The upload was refused: the configured component serves,
                // if it loads.
                app.runtime.load_specs(std::slice::from_ref(spec), started);
            }
            let serves = app
                .runtime
                .status(&family)
                .is_some_and(|s| s.status == "ok");
            crate::alerts::raise_about(
                crate::alerts::Kind::KeptUploadRefused,
                &family,
                format!(
                    "the change to family {family} made through the admin API (kept for restarts{}) could not be applied at start (the log says why): {}; mend what refused it (routes another family serves are that family's to give up: unmount it or change its routes first) and upload the component again{}, through the admin API",
                    if app.storage.is_shared() {
                        ", in the shared store".to_string()
                    } else {
                        format!(", in {}", dir(app).display())
                    },
                    match (spec, serves) {
                        (Some(spec), true) =>
                            format!("its configured component {} serves instead", spec.component),
                        (Some(spec), false) => format!(
                            "its configured component {} did not load either: the family serves nothing",
                            spec.component
                        ),
                        (None, _) => "the family serves nothing".to_string(),
                    },
                    // (The fee family can only be swapped; a family
                    // that is not configured has nothing to unmount.)
                    match spec {
                        Some(_) if family == crate::config::FEES_FAMILY =>
                            " (or the configured one)",
                        Some(_) => " (or the configured one), or unmount the family",
                        None => "",
                    }
                ),
            );
        }
        // On a shared store, what the fleet changed while this rank loaded
        // (through another host: this one's admin API waits for the start)
        // is applied before the next rank loads and before the start is
        // done, not only once it says it is ready (a contract bought
        // meanwhile would keep the fee policy the fleet left). The fee and
        // contracts families are of the first rank. Only this rank's and
        // those before: a later rank's family is mounted in its turn, and
        // its record read at the start replayed then must not come after
        // a newer one.
        if app.storage.is_shared()
            && let Err(e) = apply_fleet(app, &held, |family| config.start_rank(family) <= rank)
        {
            tracing::warn!("uploads of the fleet made during the start: {e:#}");
        }
    }
    drop(held);
    let serving = app
        .runtime
        .statuses_with(false)
        .iter()
        .filter(|s| s.status == "ok")
        .count();
    tracing::info!(
        families = specs.len(),
        serving,
        millis = started.elapsed().as_millis() as u64,
        "families loaded"
    );
    kept
}

/// Serve what `kept` says of `family`: its component (`bytes`), or
/// nothing; whether that is what serves now.
fn apply(
    app: &App,
    family: &str,
    kept: &Kept,
    bytes: impl FnOnce() -> Result<Vec<u8>>,
    _held: &OneChange,
) -> bool {
    if kept.unmounted {
        if app.runtime.grants(family).is_some() {
            match app.runtime.unmount(family) {
                Ok(()) => tracing::info!(family, "unmounted, as through the admin API"),
                Err(e) => {
                    tracing::warn!(family, "kept unmount not applied: {e:#}");
                    return false;
                }
            }
        }
        return true;
    }
    let result = bytes().and_then(|bytes| {
        let grants = Grants::parse(
            kept.grants.iter().map(String::as_str),
            kept.reads.iter().map(String::as_str),
        )
        .map_err(|e| anyhow::anyhow!(e))?;
        app.runtime
            .swap(family, &kept.component, &bytes, Some(grants))
    });
    let served = result.is_ok();
    match result {
        Ok(p) => {
            tracing::info!(
                family,
                name = %p.name,
                version = %p.version,
                "serving the component uploaded through the admin API"
            );
            // The configuration names another file since the upload: it
            // does not serve (no file the upload was weighed against
            // changed), which an operator who set it expects it to.
            let configured = family_component(app, family);
            if let Some(was) = kept.path.as_deref()
                && was != configured
            {
                tracing::warn!(
                    family,
                    "the configuration names {configured} for this family now, but the component uploaded through the admin API (over {was}) serves: upload that file through the admin API (`marketplace plugins load {family} ...`) to serve it"
                );
            }
            // Its grants are the upload's: say so when the configuration
            // says otherwise (the operator may expect the config's).
            if let Some(spec) = app.config.family(family) {
                let config = (
                    spec.grants
                        .capabilities
                        .iter()
                        .map(|c| c.name().to_string())
                        .collect::<Vec<_>>(),
                    spec.grants.reads.iter().cloned().collect::<Vec<_>>(),
                );
                let mut upload = (kept.grants.clone(), kept.reads.clone());
                upload.0.sort();
                upload.1.sort();
                let mut configured = config;
                configured.0.sort();
                if upload != configured {
                    tracing::warn!(
                        family,
                        "the upload's grants {:?} and reads {:?} apply, not the configuration's {:?} and {:?} (upload again with --grants/--read to change them)",
                        upload.0,
                        upload.1,
                        configured.0,
                        configured.1
                    );
                }
            }
        }
        Err(e) => tracing::error!(family, "kept upload refused: {e:#}"),
    }
    served
}

fn store_error(e: crate::store::StorageError) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// The shared store's records (family, record) this host has not applied
/// yet, read from `snapshot`.
fn unapplied(app: &App, snapshot: &impl crate::store::Kv) -> Result<Vec<(String, Vec<u8>)>> {
    let rows = snapshot
        .scan_in(ROWS, b"", None, false, 10_000)
        .map_err(store_error)?;
    Ok(rows
        .into_iter()
        .map(|(family, row)| (String::from_utf8_lossy(&family).into_owned(), row))
        .filter(|(family, row)| !app.uploads_applied.is(family, row))
        .collect())
}

/// The shared store's uploads and unmounts this host has not applied yet.
fn fleet_pending(app: &App) -> Result<Vec<Pending>> {
    use crate::store::Kv;
    // One snapshot for the records and their components.
    let snapshot = app.storage.begin_read().map_err(store_error)?;
    let mut out = Vec::new();
    for (family, row) in unapplied(app, &snapshot)? {
        match serde_json::from_slice::<Kept>(&row) {
            Ok(kept) => {
                let bytes = if kept.unmounted {
                    Component::None
                } else {
                    Component::Read(
                        snapshot
                            .get_in(BLOBS, family.as_bytes())
                            .map_err(store_error)
                            .and_then(|b| b.context("the component of the upload is missing")),
                    )
                };
                out.push(Pending {
                    family,
                    kept,
                    bytes,
                    row: Some(row),
                });
            }
            Err(e) => {
                tracing::error!(family, "unreadable upload record: {e}");
                app.uploads_applied.set(&family, row);
            }
        }
    }
    Ok(out)
}

/// Apply the shared store's uploads this host does not serve yet.
///
/// What is applied is read under `one_change`, as an upload through this
/// host's own admin API swaps, records and marks its record applied: a
/// record read then is applied here already or newer than what serves.
/// (Read before taking it, a record this host had just written could be
/// taken for another host's, and served again over the uploads that came
/// after it, until the next poll.) A first read of the records alone,
/// without it, finds whether there is anything to apply: a store that is
/// away makes a read wait (`store_timeout_ms`), and the watcher's swaps
/// and the admin API's changes do not wait with it.
fn sync(app: &App) -> Result<()> {
    let first = app.storage.begin_read().map_err(store_error)?;
    if unapplied(app, &first)?.is_empty() {
        return Ok(());
    }
    drop(first);
    apply_fleet(app, &app.runtime.one_change(), |_| true)
}

/// Apply the fleet's uploads and unmounts this host has not applied yet,
/// of the families `of` takes, holding `one_change`.
fn apply_fleet(app: &App, held: &OneChange, of: impl Fn(&str) -> bool) -> Result<()> {
    for p in fleet_pending(app)?.into_iter().filter(|p| of(&p.family)) {
        tracing::info!(family = %p.family, upload = %p.kept.upload, "applying an upload of the fleet");
        let family = p.family.clone();
        if replay(app, p, held) {
            // The operator's change, made through another host, settles
            // what this host's start found of that family.
            crate::alerts::settled(&family);
        }
    }
    Ok(())
}

/// Shared store: poll for uploads made through other hosts, until `stop`.
pub fn spawn_fleet_sync(app: Arc<App>, stop: Arc<AtomicBool>) -> Result<()> {
    std::thread::Builder::new()
        .name("fleet-sync".into())
        .spawn(move || {
            // A store that is away fails every poll: one line per
            // FAILED_LOG_EVERY at most, with the count since the last.
            let lines = crate::logging::Throttle::new(FAILED_LOG_EVERY);
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(FLEET_POLL);
                if let Err(e) = sync(&app)
                    && let Some(failed) = lines.note()
                {
                    tracing::warn!(
                        failed_since_last_line = failed,
                        "looking for uploads of the fleet: {e:#}"
                    );
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_json(hash: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "component": "fees_pickup_paid.wasm", "grants": [], "reads": [], "hash": hash,
        }))
        .unwrap()
    }

    /// What a kill -9 leaves in the middle of an upload is settled at the
    /// next start into the upload before it or the upload itself, never
    /// one's component under the other's record.
    #[test]
    fn an_upload_cut_short_is_settled_whole_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let (old, new) = ("a".repeat(64), "b".repeat(64));
        // Stopped after the record: the staged component takes its place.
        std::fs::write(d.join("fees.json"), record_json(&new)).unwrap();
        std::fs::write(d.join("fees.wasm"), b"old").unwrap();
        std::fs::write(staged_path(d, "fees", &new), b"new").unwrap();
        // Stopped before the record: the staged component goes, the old
        // one stays.
        std::fs::write(d.join("mcp.json"), record_json(&old)).unwrap();
        std::fs::write(d.join("mcp.wasm"), b"old").unwrap();
        std::fs::write(staged_path(d, "mcp", &new), b"new").unwrap();
        // A temporary file of a write cut short goes.
        std::fs::write(d.join("mcp.json.tmp"), b"{").unwrap();
        settle_staged(d);
        let mut left: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["fees.json", "fees.wasm", "mcp.json", "mcp.wasm"]);
        assert_eq!(std::fs::read(d.join("fees.wasm")).unwrap(), b"new");
        assert_eq!(std::fs::read(d.join("mcp.wasm")).unwrap(), b"old");
    }

    /// A kept component that is not the one its record names (an older
    /// host's upload cut short) is refused, saying so, not served under
    /// the record's name and grants.
    #[test]
    fn a_kept_component_is_read_only_as_its_record_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fees.wasm");
        std::fs::write(&path, b"bytes").unwrap();
        let right = marketplace_common::hex::sha256(b"bytes");
        let read = |hash: Option<String>| Component::File(path.clone(), hash).read();
        assert_eq!(read(Some(right)).unwrap(), b"bytes");
        assert_eq!(read(None).unwrap(), b"bytes", "an older record names none");
        let e = read(Some("c".repeat(64))).unwrap_err().to_string();
        assert!(e.contains("is not the component its record names"), "{e}");
    }
}
