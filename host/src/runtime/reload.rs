//! Hot reload: the plugins directory is watched (filesystem notifications,
//! and a slow poll as a fallback); a changed component file of
//! a configured family is validated and swapped in (the same path as the
//! admin upload: compile, link, type-check the world, smoke-call, then
//! swap). Requests in flight finish on the instance they started with; a
//! refused component leaves the old one serving and the reason is logged.
//! Other `.wasm` files staged in the directory are precompiled into the
//! compile cache in the background, so swapping to them is fast. Files in
//! its `families/` subdirectory are families of their own (see
//! [`FAMILIES_DIR`]).

use crate::runtime::Runtime;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

/// How often the directory is looked at when no notification came.
pub const POLL: Duration = Duration::from_secs(1);

type Stamp = (Option<SystemTime>, u64);

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok(), meta.len()))
}

/// The subdirectory of the plugins directory whose components are
/// families of their own: `families/NAME.wasm` mounts family NAME (with
/// the grants of `[families.NAME]`, or none), a change swaps it, removing
/// the file unmounts it (its data stays).
pub const FAMILIES_DIR: &str = "families";

/// Swap the component at `path` in for `family`, logging the outcome.
fn swap_in(rt: &Runtime, family: &str, component: &str, path: &Path) {
    let Ok(bytes) = std::fs::read(path) else {
        return;
    };
    let hash = marketplace_common::hex::encode(&Sha256::digest(&bytes));
    if rt.plugin(family).is_some_and(|p| p.hash == hash) {
        return;
    }
    let started = Instant::now();
    let result = rt.swap(family, component, &bytes, None);
    crate::metrics::metrics().swap(family, if result.is_ok() { "ok" } else { "refused" });
    match result {
        Ok(p) => tracing::info!(
            family = %family,
            version = %p.version,
            millis = started.elapsed().as_millis() as u64,
            "hot reload: swapped in {}",
            path.display()
        ),
        Err(e) => tracing::warn!(family = %family, "hot reload refused {}: {e:#}", path.display()),
    }
}

/// Start watching `rt`'s plugins directory on a background thread, until
/// `stop` is set: filesystem notifications (inotify through `notify`) wake
/// it at once; it also looks every [`POLL`] in case a notification is lost
/// (network filesystems send none).
pub fn spawn(rt: Arc<Runtime>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    let families = rt.config.families();
    let dir = rt.plugins_dir().to_path_buf();
    let mut seen: HashMap<String, Option<Stamp>> = families
        .iter()
        .map(|f| (f.name.clone(), stamp(&dir.join(&f.component))))
        .collect();
    let configured: Vec<PathBuf> = families.iter().map(|f| dir.join(&f.component)).collect();
    let mut staged: HashMap<PathBuf, Option<Stamp>> = HashMap::new();
    // Families mounted from the families directory, with their file's stamp.
    let mut mounted: HashMap<String, Option<Stamp>> = HashMap::new();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let families_dir = dir.join(FAMILIES_DIR);
    let mut watcher = notifier(&dir, &families_dir, tx);
    std::thread::Builder::new()
        .name("plugin-watch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Swaps first: they are what an operator waits for.
                for f in &families {
                    let path = dir.join(&f.component);
                    let now = stamp(&path);
                    if now.is_none() || seen.get(&f.name) == Some(&now) {
                        continue;
                    }
                    seen.insert(f.name.clone(), now);
                    swap_in(&rt, &f.name, &f.component, &path);
                }
                watch_families_dir(&rt, &families_dir, &mut mounted);
                // Staged components: precompile new or changed ones.
                for path in std::fs::read_dir(&dir)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|e| e.path())
                {
                    if path.extension().is_none_or(|e| e != "wasm") || configured.contains(&path) {
                        continue;
                    }
                    let now = stamp(&path);
                    if staged.get(&path) != Some(&now) {
                        staged.insert(path.clone(), now);
                        if let Ok(bytes) = std::fs::read(&path)
                            && rt.precompile(&bytes)
                        {
                            tracing::info!(
                                "staged component ready (precompiled): {}",
                                path.display()
                            );
                        }
                    }
                }
                // Sleep until a notification (then drain the burst) or POLL.
                if rx.recv_timeout(POLL).is_ok() {
                    while rx.try_recv().is_ok() {}
                }
                // The families directory may have appeared since.
                if let Some(w) = watcher.as_mut() {
                    use notify::Watcher;
                    let _ = w.watch(&families_dir, notify::RecursiveMode::NonRecursive);
                }
            }
            drop(watcher);
        })?;
    Ok(())
}

/// A watcher of the plugins directory and its families directory that
/// sends on `tx` at each change; None (polling only) if the platform
/// refuses.
fn notifier(
    dir: &Path,
    families_dir: &Path,
    tx: std::sync::mpsc::Sender<()>,
) -> Option<notify::RecommendedWatcher> {
    use notify::{RecursiveMode, Watcher};
    let handler = move |event: notify::Result<notify::Event>| {
        if event.is_ok_and(|e| !e.kind.is_access()) {
            let _ = tx.send(());
        }
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!("no filesystem notifications ({e}); polling the plugins directory");
            return None;
        }
    };
    if let Err(e) = watcher.watch(dir, RecursiveMode::NonRecursive) {
        tracing::warn!("cannot watch {} ({e}); polling it", dir.display());
    }
    // Missing until the operator makes it; watched again after each wakeup.
    let _ = watcher.watch(families_dir, RecursiveMode::NonRecursive);
    Some(watcher)
}

/// Mount, swap or unmount the families of the families directory.
fn watch_families_dir(rt: &Runtime, dir: &Path, mounted: &mut HashMap<String, Option<Stamp>>) {
    let mut present = Vec::new();
    for path in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
    {
        if path.extension().is_none_or(|e| e != "wasm") {
            continue;
        }
        let Some(family) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        // Only families of their own: a built-in or configured family
        // keeps its configured component.
        let configured = rt
            .config
            .family(&family)
            .is_some_and(|f| !f.component.starts_with(FAMILIES_DIR));
        let elsewhere = rt
            .plugin(&family)
            .is_some_and(|p| !p.component.starts_with(FAMILIES_DIR));
        if !crate::capabilities::valid_family(&family) || configured || elsewhere {
            continue;
        }
        present.push(family.clone());
        let now = stamp(&path);
        if mounted.get(&family) == Some(&now) {
            continue;
        }
        mounted.insert(family.clone(), now);
        let component = format!("{FAMILIES_DIR}/{family}.wasm");
        if rt.grants(&family).is_none()
            && let Some(spec) = rt.config.family(&family)
        {
            // A family the config grants but that has no slot yet.
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            if let Err(e) = rt.swap(&family, &component, &bytes, Some(spec.grants)) {
                tracing::warn!(family = %family, "mount refused {}: {e:#}", path.display());
            }
            continue;
        }
        swap_in(rt, &family, &component, &path);
    }
    mounted.retain(|family, _| {
        if present.contains(family) {
            return true;
        }
        if rt
            .plugin(family)
            .is_some_and(|p| p.component.starts_with(FAMILIES_DIR))
        {
            match rt.unmount(family) {
                Ok(()) => {
                    tracing::info!(family = %family, "component file removed: family unmounted")
                }
                Err(e) => tracing::warn!(family = %family, "unmount refused: {e:#}"),
            }
        }
        false
    });
}
