//! Hot reload: the plugins directory is polled; a changed component file of
//! a configured family is validated and swapped in (the same path as the
//! admin upload: compile, link, type-check the world, smoke-call, then
//! swap). Requests in flight finish on the instance they started with; a
//! refused component leaves the old one serving and the reason is logged.
//! Other `.wasm` files staged in the directory are precompiled into the
//! compile cache in the background, so swapping to them is fast.

use crate::app::App;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How often the directory is looked at.
pub const POLL: Duration = Duration::from_millis(100);

type Stamp = (Option<SystemTime>, u64);

fn stamp(path: &std::path::Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok(), meta.len()))
}

/// Start watching `app`'s plugins directory on a background thread.
pub fn spawn(app: Arc<App>) -> std::io::Result<()> {
    let families = app.config.families();
    let dir = app.runtime.plugins_dir().to_path_buf();
    let mut seen: HashMap<String, Option<Stamp>> = families
        .iter()
        .map(|(f, c)| (f.clone(), stamp(&dir.join(c))))
        .collect();
    let configured: Vec<std::path::PathBuf> = families.iter().map(|(_, c)| dir.join(c)).collect();
    let mut staged: HashMap<std::path::PathBuf, Option<Stamp>> = HashMap::new();
    std::thread::Builder::new().name("plugin-watch".into()).spawn(move || {
        loop {
            // Staged components: precompile new or changed ones.
            for path in std::fs::read_dir(&dir).into_iter().flatten().flatten().map(|e| e.path()) {
                if path.extension().is_none_or(|e| e != "wasm") || configured.contains(&path) {
                    continue;
                }
                let now = stamp(&path);
                if staged.get(&path) != Some(&now) {
                    staged.insert(path.clone(), now);
                    if let Ok(bytes) = std::fs::read(&path)
                        && app.runtime.precompile(&bytes)
                    {
                        tracing::info!("staged component ready (precompiled): {}", path.display());
                    }
                }
            }
            std::thread::sleep(POLL);
            for (family, component) in &families {
                let path = dir.join(component);
                let now = stamp(&path);
                if now.is_none() || seen.get(family) == Some(&now) {
                    continue;
                }
                seen.insert(family.clone(), now);
                let Ok(bytes) = std::fs::read(&path) else { continue };
                let hash = crate::runtime::hex(&Sha256::digest(&bytes));
                if app.runtime.plugin(family).is_some_and(|p| p.hash == hash) {
                    continue;
                }
                let started = Instant::now();
                match app.runtime.swap(family, component, &bytes) {
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
        }
    })?;
    Ok(())
}
