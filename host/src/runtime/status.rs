//! What health, info and the admin API show of each family: its status,
//! version, grants, routes and imports, and the watched files refused.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Status of one family for health/info/admin.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PluginStatus {
    pub family: String,
    pub component: String,
    /// The component's own name (its `describe`), which a file name
    /// does not tell (a fee policy swapped in under the configured file's
    /// name); empty unless loaded.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    pub version: String,
    pub status: String,
    pub hash: String,
    pub loaded_at: String,
    /// Capability names granted.
    pub grants: Vec<String>,
    /// Other keyspaces it may read.
    pub reads: Vec<String>,
    /// "METHOD pattern" of each route it serves.
    pub routes: Vec<String>,
    /// The interfaces its component imports (empty unless loaded).
    pub imports: Vec<String>,
    /// Why it is unavailable (its last load's failure), when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Its calls that failed (trap, time limit, memory cap) since the last
    /// it answered.
    pub consecutive_faults: u64,
    /// The loaded component's last failed call, however long ago (the
    /// admin API's listing only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_fault: Option<LastFault>,
}

/// The last failure of a component's calls, as the admin API lists it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LastFault {
    /// When (RFC 3339).
    pub at: String,
    /// `trap`, `timeout` or `memory`, as the faults metric counts them.
    pub kind: &'static str,
    /// The host's words for it (the log line's, with a panic's message).
    pub why: String,
}

/// The last change of a watched component file that was not loaded: the
/// family kept what served before (or stayed unmounted) and the log said
/// why. `GET /admin/plugins` shows it beside the family, since nobody got
/// an answer to a file dropped into a directory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RefusedFile {
    /// The file, under the plugins directory (`families/NAME.wasm`).
    pub file: String,
    /// sha256 of the refused bytes (empty when they could not be read).
    pub hash: String,
    /// When it was refused (RFC 3339).
    pub at: String,
    pub error: String,
}

/// A refusal kept, and the file to watch for it going away (a file of the
/// families directory; `None` for a configured family's file, whose
/// watcher would not say a refusal again if the same bytes came back).
type Kept = (Option<PathBuf>, RefusedFile);

/// The refusals of watched files, by family (by file name for a file
/// whose name is not a family's). One is kept until its family loads a
/// component (from any source), its file is back to the bytes that serve,
/// or its `families/` file is gone.
#[derive(Default)]
pub struct Refusals(Mutex<BTreeMap<String, Kept>>);

impl Refusals {
    /// `file`, a change for `family` whose bytes are `bytes` (None: it
    /// could not be read), was refused for `error`; `gone_with` is the path
    /// whose removal forgets it.
    pub fn note(
        &self,
        family: &str,
        gone_with: Option<&Path>,
        file: &str,
        bytes: Option<&[u8]>,
        error: String,
    ) {
        let refused = RefusedFile {
            file: file.to_string(),
            hash: bytes
                .map(marketplace_common::hex::sha256)
                .unwrap_or_default(),
            at: crate::ids::rfc3339(std::time::SystemTime::now()),
            error,
        };
        let kept = (gone_with.map(Path::to_path_buf), refused);
        self.lock().insert(family.to_string(), kept);
    }

    /// `family` loaded a component, or its file is back to what serves:
    /// its refusal is history.
    pub fn loaded(&self, family: &str) {
        self.lock().remove(family);
    }

    /// Forget the refusals whose file is gone (looked at without the lock:
    /// a slow filesystem holds up no reader).
    pub fn forget_removed(&self) {
        let watched: Vec<(String, PathBuf)> = self
            .lock()
            .iter()
            .filter_map(|(family, (path, _))| Some((family.clone(), path.clone()?)))
            .collect();
        for (family, path) in watched {
            if !path.exists() {
                let mut map = self.lock();
                if map
                    .get(&family)
                    .is_some_and(|(p, _)| p.as_ref() == Some(&path))
                {
                    map.remove(&family);
                }
            }
        }
    }

    /// Every refusal kept, by family.
    pub fn list(&self) -> BTreeMap<String, RefusedFile> {
        self.lock()
            .iter()
            .map(|(f, (_, r))| (f.clone(), r.clone()))
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Kept>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
