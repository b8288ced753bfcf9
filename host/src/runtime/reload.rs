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

/// What the watcher last saw of a component file: its stamp, and the
/// hash of its content.
#[derive(Default, Clone, PartialEq)]
struct Seen {
    stamp: Option<Stamp>,
    hash: Option<String>,
}

impl Seen {
    /// The file as it is now (at start: not a change to act on).
    fn now(path: &Path) -> Seen {
        Seen {
            stamp: stamp(path),
            hash: super::engine::read_component(path)
                .ok()
                .map(|b| marketplace_common::hex::sha256(&b)),
        }
    }

    /// The file's bytes when its content changed since last seen (a new
    /// stamp with the same bytes, as a redeploy rewriting every file, is
    /// no change: a fleet-wide admin upload serving instead stays).
    ///
    /// A file still being written (a `cp` into the directory: its creation
    /// and its first bytes are events of their own) is not acted on: one
    /// whose stamp changed while it was read, or that cannot be read yet
    /// (empty) and changed less than [`POLL`] ago, is looked at again at
    /// the next event or poll. So a copy is not first refused as an empty
    /// component, nor as a cut-short one while its writer goes on writing
    /// (a writer that stalls midway for longer than a read still has its
    /// part read: write aside and rename, as README says). A file that
    /// still cannot be read past that (empty, a FIFO, over the size a
    /// component may have) is `Err` with why, once per change of it.
    fn changed(&mut self, path: &Path) -> Option<Result<Vec<u8>, String>> {
        let now = stamp(path);
        if now.is_none() || now == self.stamp {
            return None;
        }
        let read = super::engine::read_component(path);
        if stamp(path) != now {
            return None;
        }
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(e) => {
                let fresh = now
                    .and_then(|(modified, _)| modified?.elapsed().ok())
                    .is_some_and(|age| age < POLL);
                if fresh {
                    tracing::debug!("{} not read yet: {e}", path.display());
                    return None;
                }
                self.stamp = now;
                // (Unread: the same bytes back are a change again.)
                self.hash = None;
                tracing::warn!("{} not read: {e}", path.display());
                return Some(Err(format!("not read: {e}")));
            }
        };
        self.stamp = now;
        let hash = marketplace_common::hex::sha256(&bytes);
        if self.hash.as_ref() == Some(&hash) {
            tracing::debug!(
                "{} rewritten with the same content: nothing to swap",
                path.display()
            );
            return None;
        }
        self.hash = Some(hash);
        Some(Ok(bytes))
    }
}

pub use crate::config::{FAMILIES_DIR, in_families_dir};

/// An admin API change kept for a family (see `crate::server::uploads`).
pub struct KeptChange {
    /// It unmounted the family (else it uploaded a component).
    pub unmounted: bool,
    /// The uploaded component's sha256 (absent in older records).
    pub component: Option<String>,
    /// The sha256 of the family's file in the plugins directory it was
    /// made over ("-": there was none), when recorded and the
    /// configuration still names that file.
    pub file: Option<String>,
}

impl KeptChange {
    /// Whether this change is what `serving` is (an unmount: nothing; an
    /// upload: its component), so that it still stands on this host.
    fn in_force(&self, serving: Option<&crate::runtime::LoadedPlugin>) -> bool {
        match serving {
            None => self.unmounted,
            Some(p) => !self.unmounted && self.component.as_ref().is_none_or(|h| *h == p.hash),
        }
    }
}

/// The change kept for a family, if any (`Err`: the store could not say).
pub type KeptChanges = dyn Fn(&str) -> Result<Option<KeptChange>, String> + Send;

/// What the watcher is told of the admin API's kept state (see
/// `crate::server::uploads`), which sits above the runtime.
pub struct Kept {
    /// Families unmounted through the admin API: their files in the
    /// families directory are not mounted again until they change.
    pub unmounted: Vec<String>,
    /// Whether a file that serves drops the admin change kept for its
    /// family ([`Kept::file_serves`]): on one host; a shared store keeps
    /// the fleet's record over one host's directory.
    pub file_drops_kept: bool,
    /// Called once a file's component serves (swapped in or mounted): the
    /// file decides from then on, over an older admin upload or unmount.
    pub file_serves: Box<dyn Fn(&str) + Send>,
    /// The admin change kept for a family: it stands while it is what
    /// this host serves and the file is the one it was made over.
    pub kept_change: Box<KeptChanges>,
}

impl Default for Kept {
    /// Nothing kept (a host without an admin API, benchmarks).
    fn default() -> Kept {
        Kept {
            unmounted: Vec::new(),
            file_drops_kept: true,
            file_serves: Box::new(|_| {}),
            kept_change: Box::new(|_| Ok(None)),
        }
    }
}

/// The lock every change takes, what serves a family, and the admin
/// change kept for it ([`weigh`]).
type Weighed<'a> = (
    crate::runtime::OneChange<'a>,
    Option<Arc<crate::runtime::LoadedPlugin>>,
    Option<KeptChange>,
);

/// What serves `family` and the admin change kept for it, read under the
/// lock every change takes (held in the result): the record is read before
/// taking it (a store that is away holds up no admin change meanwhile) and
/// again under it if what serves changed in between, so that an admin
/// change made meanwhile is weighed, not undone. None when the record could
/// not be read (logged, naming `what` happened to the file): the caller
/// looks again.
fn weigh<'a>(rt: &'a Runtime, family: &str, kept: &Kept, what: &str) -> Option<Weighed<'a>> {
    let read = || {
        (kept.kept_change)(family)
            .map_err(|e| {
                tracing::warn!(
                    family = %family,
                    "{what}, but the admin API's kept changes could not be read ({e}): it is looked at again"
                );
            })
            .ok()
    };
    let before = rt.plugin(family).map(|p| p.hash.clone());
    let mut change = read()?;
    let held = rt.one_change();
    let serving = rt.plugin(family);
    if serving.as_ref().map(|p| &p.hash) != before.as_ref() {
        change = read()?;
    }
    Some((held, serving, change))
}

/// Swap the component `bytes`, read from `path`, in for `family`, counting
/// and logging the outcome and keeping a refusal; once it serves,
/// `file_serves` (in the same change). An admin change kept for the family
/// (an upload serving in the file's place, or an unmount) stands while it
/// is what serves and the file is the one it was made over, as at a start;
/// a file that replaces such a change, or mounts a family that serves
/// nothing, gets the grants a start gives it (the configuration's). False
/// when it could not be decided (the store holding the kept changes did
/// not answer): the caller looks again.
fn swap_in(
    rt: &Runtime,
    family: &str,
    component: &str,
    path: &Path,
    bytes: &[u8],
    kept: &Kept,
) -> bool {
    let started = Instant::now();
    let hash = marketplace_common::hex::sha256(bytes);
    let what = format!("{} changed", path.display());
    let Some((_one_change, serving, change)) = weigh(rt, family, kept, &what) else {
        return false;
    };
    // The file now holds what an admin upload in force serves, made over
    // another file: on one host a changed file, which decides from now on
    // (swapped in as a start would serve it, the upload dropped), so that
    // the file it was made over, put back later, serves too. (Taken for no
    // change, it left the upload standing, and that file put back "the
    // file the change was made over": the operator could not go back.) On
    // a shared store the fleet's upload stays, with its grants: no change.
    let upload_in_file = kept.file_drops_kept
        && change.as_ref().is_some_and(|c| {
            !c.unmounted && c.in_force(serving.as_deref()) && c.file.as_ref() != Some(&hash)
        });
    if serving.as_ref().is_some_and(|p| p.hash == hash) && !upload_in_file {
        // The file is back to what serves: nothing refused any more.
        rt.refusals.loaded(family);
        return true;
    }
    if change
        .as_ref()
        .is_some_and(|c| c.in_force(serving.as_deref()) && c.file.as_ref() == Some(&hash))
    {
        tracing::info!(
            family = %family,
            "{} is the file the admin API's change to the family was made over: that change stands",
            path.display()
        );
        // A file refused meanwhile is no longer there to act on.
        rt.refusals.loaded(family);
        return true;
    }
    let grants = (change.is_some() || serving.is_none()).then(|| {
        rt.config
            .family(family)
            .map(|spec| spec.grants)
            .unwrap_or_default()
    });
    let result = rt.swap(family, component, bytes, grants.clone());
    crate::metrics::metrics().swap(family, if result.is_ok() { "ok" } else { "refused" });
    match result {
        Ok(p) => {
            tracing::info!(
                family = %family,
                name = %p.name,
                version = %p.version,
                millis = started.elapsed().as_millis() as u64,
                "hot reload: {} {}",
                if serving.is_some() { "swapped in" } else { "mounted" },
                path.display()
            );
            (kept.file_serves)(family);
        }
        Err(e) => {
            // Listed before it is logged: a reader of the log finds it.
            // (A configured file's refusal stays if the file goes: the
            // same bytes back would not be looked at again.)
            let gone_with = in_families_dir(component).then_some(path);
            let mut why = format!("{e:#}");
            if why.contains("failed to parse") {
                // The watcher may see a file its writer has not finished.
                why.push_str(
                    " (a file still being written reads so: write it beside the directory's files and rename it into place)",
                );
            }
            // A file replacing an admin upload takes the configuration's
            // grants, not the upload's (which health still shows): say so.
            if let (Some(given), Some(p)) = (&grants, &serving)
                && given.names() != p.grants.names()
            {
                why.push_str(&format!(
                    " (a file replacing the admin API's upload gets the grants the configuration gives the family, [{}], not the upload's [{}])",
                    given.names().join(", "),
                    p.grants.names().join(", "),
                ));
            }
            rt.refusals
                .note(family, gone_with, component, Some(bytes), why.clone());
            tracing::warn!(family = %family, "hot reload refused {}: {why}", path.display());
        }
    }
    true
}

/// Say once that a configured family's file, seen before, is gone: what
/// serves goes on serving, but the next start would not load the family.
/// Put back, it is looked at as any change (the same bytes: nothing).
fn say_if_removed(rt: &Runtime, family: &str, path: &Path, last: &mut Seen) {
    let gone =
        matches!(std::fs::metadata(path), Err(e) if e.kind() == std::io::ErrorKind::NotFound);
    if !(gone && last.stamp.is_some()) {
        return;
    }
    last.stamp = None;
    let serving = match rt.plugin(family) {
        Some(p) => format!("family {family} serves on from {}", p.component),
        None => format!("family {family} serves nothing now"),
    };
    tracing::warn!(
        "{} was removed: {serving}, but at the next start the family would not load; put the file back, or name another in the configuration",
        path.display()
    );
}

/// Swap `family`'s file at `path` in when it changed since `last` (see
/// [`swap_in`]); when that could not be decided, it stays unseen, to be
/// looked at again.
fn look_at(rt: &Runtime, family: &str, component: &str, path: &Path, last: &mut Seen, kept: &Kept) {
    let before = last.clone();
    match last.changed(path) {
        Some(Ok(bytes)) if !swap_in(rt, family, component, path, &bytes, kept) => {
            *last = before;
        }
        Some(Ok(_)) => {}
        // Listed as any refused file (`GET /admin/plugins`, `plugins
        // list`, health's alert): what serves goes on serving, but a start
        // would not load this file (an outside probe's empty fee file was
        // said only in the log, until a restart made every paid route 503).
        Some(Err(why)) => {
            let gone_with = in_families_dir(component).then_some(path);
            rt.refusals.note(family, gone_with, component, None, why);
        }
        None => {}
    }
}

/// Start watching `rt`'s plugins directory on a background thread, until
/// `stop` is set: filesystem notifications (inotify through `notify`) wake
/// it at once; it also looks every [`POLL`] in case a notification is lost
/// (network filesystems send none). The families directory's components
/// are mounted before this returns.
pub fn spawn(rt: Arc<Runtime>, stop: Arc<AtomicBool>, kept: Kept) -> std::io::Result<()> {
    let families = rt.config.families();
    let dir = rt.plugins_dir().to_path_buf();
    let mut seen: HashMap<String, Seen> = families
        .iter()
        .map(|f| (f.name.clone(), Seen::now(&dir.join(&f.component))))
        .collect();
    let configured: Vec<PathBuf> = families.iter().map(|f| dir.join(&f.component)).collect();
    let mut staged: HashMap<PathBuf, Option<Stamp>> = HashMap::new();
    // Families mounted from the families directory, with their file; one
    // the admin API unmounted counts as seen as it is now.
    let families_dir = dir.join(FAMILIES_DIR);
    let mut mounted = FamiliesDir {
        mounted: kept
            .unmounted
            .iter()
            .map(|f| {
                let file = families_dir.join(format!("{f}.wasm"));
                // Said, as a configured family unmounted so is: the file
                // is there, and serves nothing. (A family configured with
                // another file is said to ignore this one, elsewhere.)
                let of_the_dir = rt
                    .config
                    .family(f)
                    .is_none_or(|spec| in_families_dir(&spec.component));
                if of_the_dir && file.is_file() {
                    tracing::info!(
                        family = %f,
                        "{} not mounted: the family was unmounted through the admin API (a change of the file, or a load through the admin API, mounts it again)",
                        file.display()
                    );
                }
                (f.clone(), Seen::now(&file))
            })
            .collect(),
        ignored: HashMap::new(),
        looked: false,
    };
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let mut watcher = notifier(&dir, &families_dir, tx);
    // Mounted before the host says it is ready.
    watch_families_dir(&rt, &families_dir, &mut mounted, &kept);
    let stage = stager(rt.clone(), stop.clone())?;
    std::thread::Builder::new()
        .name("plugin-watch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                // Swaps first: they are what an operator waits for.
                for f in &families {
                    let path = dir.join(&f.component);
                    let last = seen.entry(f.name.clone()).or_default();
                    // (One of the families directory that goes unmounts
                    // its family: `watch_families_dir`.)
                    if !in_families_dir(&f.component) {
                        say_if_removed(&rt, &f.name, &path, last);
                    }
                    look_at(&rt, &f.name, &f.component, &path, last, &kept);
                }
                watch_families_dir(&rt, &families_dir, &mut mounted, &kept);
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
                        let _ = stage.send(path);
                    }
                }
                rt.refusals.forget_removed();
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

/// A thread that precompiles the staged components sent to it, one at a
/// time, until `stop`: off the watcher's thread, whose swaps an operator
/// waits for (an outside probe's fee swap waited 10 to 15 s behind the
/// compile of a large staged component).
fn stager(
    rt: Arc<Runtime>,
    stop: Arc<AtomicBool>,
) -> std::io::Result<std::sync::mpsc::Sender<PathBuf>> {
    let (tx, rx) = std::sync::mpsc::channel::<PathBuf>();
    std::thread::Builder::new()
        .name("plugin-stage".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(path) = rx.recv_timeout(POLL) else {
                    continue;
                };
                if let Ok(bytes) = super::engine::read_component(&path)
                    && rt.precompile(&bytes)
                {
                    tracing::info!("staged component ready (precompiled): {}", path.display());
                }
            }
        })?;
    Ok(tx)
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

/// What the watcher knows of the families directory.
struct FamiliesDir {
    /// Families of its files (mounted from them, or served by an admin
    /// upload in their place), with the file as last seen.
    mounted: HashMap<String, Seen>,
    /// Files it does not mount (said once per change of the file).
    ignored: HashMap<PathBuf, Seen>,
    /// It has been looked at once (at start, before the host is ready).
    looked: bool,
}

/// Mount, swap or unmount the families of the families directory.
fn watch_families_dir(rt: &Runtime, dir: &Path, state: &mut FamiliesDir, kept: &Kept) {
    let FamiliesDir {
        mounted,
        ignored,
        looked,
    } = state;
    let mut present = Vec::new();
    let mut listed = Vec::new();
    for path in std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
    {
        if path.extension().is_none_or(|e| e != "wasm") {
            continue;
        }
        listed.push(path.clone());
        let Some(family) = path
            .file_stem()
            .and_then(|s| s.to_str())
            .map(str::to_string)
        else {
            continue;
        };
        let component = format!("{FAMILIES_DIR}/{family}.wasm");
        let valid = crate::capabilities::valid_family(&family);
        // Only families of their own: a built-in or configured family
        // keeps its configured component.
        let configured = rt
            .config
            .family(&family)
            .is_some_and(|f| !in_families_dir(&f.component));
        if !valid || configured {
            // Said once per change of the file: an operator dropping it
            // there expects it to mount.
            if let Some(read) = ignored.entry(path.clone()).or_default().changed(&path) {
                let why = if !valid {
                    format!(
                        "its name is not a family name ({})",
                        crate::capabilities::FAMILY_NAME_RULE
                    )
                } else {
                    // What the family is configured with, and whether it
                    // loaded (a refused one serves nothing).
                    let served = match rt.plugin(&family) {
                        Some(p) => format!("is served from {}", p.component),
                        None => format!(
                            "is configured with {} (which does not serve now: see its load error)",
                            rt.config
                                .family(&family)
                                .map(|f| f.component)
                                .unwrap_or_else(|| "another component".into())
                        ),
                    };
                    // (The fee policy's file is named in [plugins].)
                    let table = if family == crate::runtime::FEES_FAMILY {
                        "[plugins] says fees".to_string()
                    } else {
                        format!("[families.{family}] says component")
                    };
                    format!(
                        "family {family} {served} (to mount it from here, its {table} = \"{FAMILIES_DIR}/{family}.wasm\")"
                    )
                };
                // Listed only when it can never mount: otherwise the
                // family is served, by what this file gives way to.
                if !valid {
                    rt.refusals.note(
                        &family,
                        Some(&path),
                        &component,
                        read.as_deref().ok(),
                        why.clone(),
                    );
                }
                tracing::warn!("{} not mounted: {why}", path.display());
            }
            continue;
        }
        present.push(family.clone());
        // At the first look a family an admin upload serves in this file's
        // place takes the file as it is (the start weighed the upload
        // against it); from then on a file not seen before is new, and a
        // change of it (against the upload's record: `swap_in`) serves.
        let first_look_under_upload = !*looked
            && rt
                .plugin(&family)
                .is_some_and(|p| !in_families_dir(&p.component));
        let last = mounted.entry(family.clone()).or_insert_with(|| {
            if first_look_under_upload {
                Seen::now(&path)
            } else {
                Seen::default()
            }
        });
        look_at(rt, &family, &component, &path, last, kept);
    }
    // A file not mounted that is gone: put back, it is said (and listed
    // as refused) again.
    ignored.retain(|path, _| listed.contains(path));
    *looked = true;
    mounted.retain(|family, _| {
        if present.contains(family) {
            return true;
        }
        let from_file = |p: Option<&crate::runtime::LoadedPlugin>| {
            p.is_some_and(|p| in_families_dir(&p.component))
        };
        if !from_file(rt.plugin(family).as_deref()) {
            return false;
        }
        // An admin upload may carry the file's name (one sent without
        // `?component=`): it is not the file's to unmount. Unread, the
        // file's removal is looked at again.
        let what = format!("the component file of family {family} was removed");
        let Some((_one_change, serving, change)) = weigh(rt, family, kept, &what) else {
            return true;
        };
        if !from_file(serving.as_deref()) || change.is_some_and(|c| c.in_force(serving.as_deref()))
        {
            return false;
        }
        match rt.unmount(family) {
            Ok(()) => {
                crate::metrics::metrics().swap(family, "unmounted");
                tracing::info!(family = %family, "component file removed: family unmounted")
            }
            Err(e) => tracing::warn!(family = %family, "unmount refused: {e:#}"),
        }
        false
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_files_of_the_families_dir_are_its() {
        assert!(in_families_dir("families/hello.wasm"));
        assert!(!in_families_dir("families_old.wasm"));
        assert!(!in_families_dir("families"));
        assert!(!in_families_dir("hello.wasm"));
    }
}
