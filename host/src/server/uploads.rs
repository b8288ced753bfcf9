//! Components swapped in or mounted through the admin API are kept in
//! `<data_dir>/uploads/` (`NAME.wasm` plus `NAME.json` with its component
//! name and grants; an unmount leaves only `NAME.json` saying so), and
//! replayed at start after the configured families are loaded, so a
//! restart serves the same versions the operator last uploaded.
//!
//! With a shared store they are kept in the store instead (`host:uploads`:
//! family -> the same JSON; `host:upload-blobs`: family -> the component),
//! and every host of the fleet polls them ([`spawn_fleet_sync`]): a swap,
//! mount or unmount made through any host's admin API is served by all of
//! them within [`FLEET_POLL`] plus a compile.

use crate::app::App;
use crate::capabilities::Grants;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
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
    };
    if app.storage.is_shared() {
        return record_shared(app, family, &mut kept, Some(bytes));
    }
    let dir = dir(app);
    crate::state::create_private_dir(&dir)
        .with_context(|| format!("creating {}", dir.display()))?;
    write_file(&dir.join(format!("{family}.wasm")), bytes)?;
    write_file(
        &dir.join(format!("{family}.json")),
        &serde_json::to_vec_pretty(&kept)?,
    )
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
    let Some(recorded) = &kept.file else {
        return false;
    };
    // Another path configured now: the recorded file is not the one that
    // changed (and nothing need be read).
    if kept
        .path
        .as_ref()
        .is_some_and(|path| *path != family_component(app, family))
    {
        return false;
    }
    let now = file_hash(app, family);
    now != "-" && *recorded != now
}

/// The sha256 (hex) of `family`'s file in the plugins directory, "-" when
/// there is none.
fn file_hash(app: &App, family: &str) -> String {
    use sha2::Digest;
    std::fs::read(family_file(app, family)).map_or_else(
        |_| "-".to_string(),
        |b| marketplace_common::hex::encode(&sha2::Sha256::digest(&b)),
    )
}

/// Replay the kept uploads and unmounts (at start).
pub fn restore(app: &App) -> BTreeSet<String> {
    if app.storage.is_shared() {
        return sync(app).unwrap_or_else(|e| {
            tracing::error!("uploads of the shared store not applied: {e:#}");
            BTreeSet::new()
        });
    }
    let mut decided = BTreeSet::new();
    let Ok(entries) = std::fs::read_dir(dir(app)) else {
        return decided;
    };
    let mut names: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
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
        // A component file whose content changed since the upload (a
        // deploy while the host was down) decides instead, as it would have
        // while it ran. (A file written again with the same bytes did not
        // change.)
        if file_changed(app, &family, &kept) {
            tracing::info!(
                family,
                "{} changed since the admin API's upload or unmount: the file serves",
                family_file(app, &family).display()
            );
            file_serves(app, &family);
            continue;
        }
        let wasm = path.with_extension("wasm");
        if apply(app, &family, &kept, || {
            std::fs::read(&wasm).with_context(|| format!("reading {}", wasm.display()))
        }) {
            decided.insert(family);
        }
    }
    decided
}

/// Serve what `kept` says of `family`: its component (`bytes`), or
/// nothing; whether that is what serves now.
fn apply(app: &App, family: &str, kept: &Kept, bytes: impl FnOnce() -> Result<Vec<u8>>) -> bool {
    let _one_change = app.runtime.one_change();
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
                version = %p.version,
                "serving the component uploaded through the admin API"
            );
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

/// Apply the shared store's uploads this host does not serve yet; the
/// families now served as the fleet decided.
fn sync(app: &App) -> Result<BTreeSet<String>> {
    use crate::store::Kv;
    let err = |e: crate::store::StorageError| anyhow::anyhow!("{e}");
    // One snapshot for the records and their components.
    let snapshot = app.storage.begin_read().map_err(err)?;
    let rows = snapshot
        .scan_in(ROWS, b"", None, false, 10_000)
        .map_err(err)?;
    let mut applied = BTreeSet::new();
    for (family, row) in rows {
        let family = String::from_utf8_lossy(&family).into_owned();
        if app.uploads_applied.is(&family, &row) {
            continue;
        }
        match serde_json::from_slice::<Kept>(&row) {
            Ok(kept) => {
                tracing::info!(family, upload = %kept.upload, "applying an upload of the fleet");
                if apply(app, &family, &kept, || {
                    snapshot
                        .get_in(BLOBS, family.as_bytes())
                        .map_err(err)?
                        .context("the component of the upload is missing")
                }) {
                    applied.insert(family.clone());
                }
            }
            Err(e) => tracing::error!(family, "unreadable upload record: {e}"),
        }
        // Applied or refused: not tried again until it changes.
        app.uploads_applied.set(&family, row);
    }
    Ok(applied)
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
