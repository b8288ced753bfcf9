//! What health, info and the admin API show of each family: its status,
//! version, grants, routes and imports.

/// Status of one family for health/info/admin.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PluginStatus {
    pub family: String,
    pub component: String,
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
}

/// The last change of a watched component file that was not loaded: the
/// family kept what served before (or stayed unmounted) and the log said
/// why. `GET /admin/plugins` shows it beside the family, since nobody got
/// an answer to a file dropped into a directory.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Refusal {
    /// The file, under the plugins directory (`families/NAME.wasm`).
    pub file: String,
    /// sha256 of the refused bytes (empty when they were not read).
    pub hash: String,
    /// When it was refused (RFC 3339).
    pub at: String,
    pub error: String,
}

/// The refusals of watched files, by family (by file name for a file
/// whose name is not a family's). One is kept until its family loads a
/// component (from any source) or its file is gone.
#[derive(Default)]
pub struct Refusals(std::sync::Mutex<std::collections::BTreeMap<String, (PathBuf, Refusal)>>);

use std::path::PathBuf;

impl Refusals {
    /// `file` (at `path`), a change for `family`, was refused for `error`.
    pub fn note(
        &self,
        family: &str,
        path: &std::path::Path,
        file: &str,
        bytes: Option<&[u8]>,
        error: String,
    ) {
        let refusal = Refusal {
            file: file.to_string(),
            hash: bytes
                .map(marketplace_common::hex::sha256)
                .unwrap_or_default(),
            at: crate::ids::rfc3339(std::time::SystemTime::now()),
            error,
        };
        self.lock()
            .insert(family.to_string(), (path.to_path_buf(), refusal));
    }

    /// `family` loaded a component: its refusal is history.
    pub fn loaded(&self, family: &str) {
        self.lock().remove(family);
    }

    /// Forget the refusals whose file is gone.
    pub fn forget_removed(&self) {
        let mut map = self.lock();
        if !map.is_empty() {
            map.retain(|_, (path, _)| path.exists());
        }
    }

    /// Every refusal kept, by family.
    pub fn list(&self) -> std::collections::BTreeMap<String, Refusal> {
        self.lock()
            .iter()
            .map(|(f, (_, r))| (f.clone(), r.clone()))
            .collect()
    }

    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, std::collections::BTreeMap<String, (PathBuf, Refusal)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}
