//! Components swapped in or mounted through the admin API are kept in
//! `<data_dir>/uploads/` (`NAME.wasm` plus `NAME.json` with its component
//! name and grants; an unmount leaves only `NAME.json` saying so), and
//! replayed at start after the configured families are loaded, so a
//! restart serves the same versions the operator last uploaded.

use crate::app::App;
use crate::capabilities::Grants;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

#[derive(Serialize, Deserialize)]
struct Kept {
    component: String,
    grants: Vec<String>,
    reads: Vec<String>,
    #[serde(default)]
    unmounted: bool,
}

fn dir(app: &App) -> PathBuf {
    app.config.data_dir.join("uploads")
}

/// Write `bytes` to `path` atomically (temp file, fsync, rename), 0600.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
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
    let dir = dir(app);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    write_file(&dir.join(format!("{family}.wasm")), bytes)?;
    let kept = Kept {
        component: status.component,
        grants: status.grants,
        reads: status.reads,
        unmounted: false,
    };
    write_file(
        &dir.join(format!("{family}.json")),
        &serde_json::to_vec_pretty(&kept)?,
    )
}

/// Keep that `family` was unmounted.
pub fn record_unmount(app: &App, family: &str) -> Result<()> {
    let dir = dir(app);
    std::fs::create_dir_all(&dir)?;
    let kept = Kept {
        component: String::new(),
        grants: vec![],
        reads: vec![],
        unmounted: true,
    };
    write_file(
        &dir.join(format!("{family}.json")),
        &serde_json::to_vec_pretty(&kept)?,
    )?;
    let _ = std::fs::remove_file(dir.join(format!("{family}.wasm")));
    Ok(())
}

/// Replay the kept uploads and unmounts (at start).
pub fn restore(app: &App) {
    let Ok(entries) = std::fs::read_dir(dir(app)) else {
        return;
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
        if kept.unmounted {
            if app.runtime.grants(&family).is_some() {
                match app.runtime.unmount(&family) {
                    Ok(()) => tracing::info!(family, "unmounted, as through the admin API"),
                    Err(e) => tracing::warn!(family, "kept unmount not applied: {e:#}"),
                }
            }
            continue;
        }
        let wasm = path.with_extension("wasm");
        let result = std::fs::read(&wasm)
            .with_context(|| format!("reading {}", wasm.display()))
            .and_then(|bytes| {
                let grants = Grants::parse(
                    kept.grants.iter().map(String::as_str),
                    kept.reads.iter().map(String::as_str),
                )
                .map_err(|e| anyhow::anyhow!(e))?;
                app.runtime
                    .swap(&family, &kept.component, &bytes, Some(grants))
            });
        match result {
            Ok(p) => tracing::info!(
                family,
                version = %p.version,
                "serving the component uploaded through the admin API"
            ),
            Err(e) => tracing::error!(family, "kept upload refused: {e:#}"),
        }
    }
}
