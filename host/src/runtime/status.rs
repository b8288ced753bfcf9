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
