//! Configuration: embedded defaults, overlaid by a TOML file, then by
//! `MARKETPLACE_*` environment variables, then by command-line flags.
//!
//! `mod.rs` holds the settings, their defaults and what the rest of the
//! host reads off them; `load.rs` overlays the file, the environment and
//! the flags; `check.rs` the rules a start refuses a configuration by;
//! `values.rs` the settings with a syntax of their own (trusted proxies,
//! the public URL).

mod check;
mod load;
#[cfg(test)]
mod tests;
mod values;

pub use check::{confined, upstream_url};
pub(crate) use load::boolean;
pub use values::{PublicUrl, TrustedProxies};

use anyhow::{Context, Result, bail};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Service name reported by info, health and the manifest.
pub const SERVICE_NAME: &str = "marketplace";
/// Service version (the host crate's).
pub const SERVICE_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The family that serves fees.
pub const FEES_FAMILY: &str = "fees";
/// The shortest admin token taken, configured or in `<data_dir>/admin.token`.
pub const MIN_ADMIN_TOKEN_BYTES: usize = 32;

/// The subdirectory of the plugins directory whose components are
/// families of their own: `families/NAME.wasm` mounts family NAME (with
/// the grants of `[families.NAME]`, or none), a change swaps it, removing
/// the file unmounts it (its data stays).
pub const FAMILIES_DIR: &str = "families";

/// Whether a component name is a file of [`FAMILIES_DIR`]
/// (`families/NAME.wasm`): the name that ties a family to that file.
pub fn in_families_dir(component: &str) -> bool {
    component
        .strip_prefix(FAMILIES_DIR)
        .is_some_and(|rest| rest.starts_with('/'))
}

/// Whether `family` can be given `grants`: the fees family's world
/// (`fee-policy`) imports `log` and `settings` only, so a capability or a
/// keyspace to read would be listed for it (health, admin) but never used.
pub fn grants_fit(family: &str, grants: &crate::capabilities::Grants) -> Result<(), String> {
    if family == FEES_FAMILY && (!grants.capabilities.is_empty() || !grants.reads.is_empty()) {
        return Err(format!(
            "the {FEES_FAMILY} family takes no grants or reads: its world (fee-policy) imports log and settings only"
        ));
    }
    Ok(())
}

/// Plugin families and the component file each loads by default.
pub const DEFAULT_PLUGINS: &[(&str, &str)] = &[
    ("info", "info.wasm"),
    ("identity", "identity.wasm"),
    ("timeline", "timeline.wasm"),
    ("search", "search.wasm"),
    ("contracts", "contracts.wasm"),
    ("mcp", "mcp.wasm"),
    (FEES_FAMILY, "fees_bid_inclusive.wasm"),
];

/// The test-only family, loaded when `testing_routes` is on.
pub const TESTING_PLUGIN: (&str, &str) = ("testing", "testing.wasm");

#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// Public HTTP listener.
    pub listen: SocketAddr,
    /// Directory of the database, server key, admin token and compile cache.
    pub data_dir: PathBuf,
    /// Directory the plugin components are loaded from (and watched).
    pub plugins_dir: PathBuf,
    /// Where compiled components are cached (default `<data_dir>/cache`).
    /// Servers of one build may share it.
    pub cache_dir: Option<PathBuf>,
    /// Admin listener (loopback only); off when unset.
    pub admin_listen: Option<SocketAddr>,
    /// Admin bearer token; generated into `<data_dir>/admin.token` when unset.
    pub admin_token: Option<String>,
    /// The arbiter's Ed25519 secret key (64 hex); generated into
    /// `<data_dir>/arbiter.key` when unset.
    pub arbiter_key: Option<String>,
    /// Family -> component file name (relative to `plugins_dir`) overrides.
    pub plugins: BTreeMap<String, String>,
    /// Wall-clock deadline of one plugin call, in milliseconds.
    pub request_timeout_ms: u64,
    /// Memory cap of one plugin instance, in MiB.
    pub plugin_memory_mib: u64,
    /// Most linear memory all plugin calls in progress hold together, in
    /// MiB.
    pub plugin_memory_total_mib: u64,
    /// Plugin instances that may run at once (pool size); more requests queue.
    pub max_instances: u32,
    /// Address space reserved for each plugin linear memory, in MiB;
    /// unset: wasmtime's 4 GiB, which lets compiled plugins skip bounds
    /// checks. Lower where the process's address space is limited
    /// (`ulimit -v`, valgrind): the pool reserves it for every slot.
    pub memory_reservation_mib: Option<u64>,
    /// Largest request body accepted, in bytes.
    pub max_body_bytes: usize,
    /// Most bytes of request bodies held before their request runs (being
    /// received, or waiting for a slot); a family may hold its
    /// `max_concurrent`'s share of the pool's of them.
    pub max_pending_body_bytes: u64,
    /// Most bytes of large answers (of reads) held until their clients
    /// have read them (see `crate::server::answers`).
    pub max_unsent_answer_bytes: u64,
    /// Mount the test-only routes (`/_testing/...`) and load the testing plugin.
    pub testing_routes: bool,
    /// Watch the plugins directory and swap changed components in.
    pub watch_plugins: bool,
    /// Write `/tmp/perf-<pid>.map`, naming each compiled function of the
    /// loaded components, so `perf` can attribute samples inside plugins.
    pub perf_map: bool,
    /// Let the heap use transparent huge pages (mimalloc's way, the
    /// default); off, `serve` moves it to an arena of 4 KiB pages
    /// (`crate::heap`).
    pub heap_huge_pages: bool,
    /// Log filter (tracing-subscriber EnvFilter syntax), e.g. "info".
    pub log: String,
    /// `text` (colours only on a terminal) or `json` (one object per line).
    pub log_format: LogFormat,
    /// Prometheus metrics listener (no token; `/metrics` is also on the
    /// admin listener, with it); off when unset.
    pub metrics_listen: Option<SocketAddr>,
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    pub drain_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long a keep-alive connection between
    /// requests stays open for a request already on its way (at most half
    /// of `drain_timeout_ms`; longer while other requests still run).
    pub drain_linger_ms: u64,
    /// Most client connections open at once; more wait in the backlog.
    pub max_connections: u32,
    /// Most connections open at once from one client address (0: no
    /// limit); more are closed as they come.
    pub max_connections_per_ip: u32,
    /// How many calls of one family for one client address may run long
    /// at once (`runtime/long_calls.rs`; 0: no limit).
    pub max_long_calls_per_ip: u32,
    /// The reverse proxies in front of the service, as addresses or
    /// networks (`"127.0.0.1, 10.0.0.0/8"`): a request from one of them is
    /// taken to come from the client its `X-Forwarded-For` names (see
    /// `server::forwarded`). Empty: every client is its connection's peer.
    pub trusted_proxies: TrustedProxies,
    /// The origin clients reach the service at (`https://market.example`):
    /// absolute URLs in answers are made from it instead of the request's
    /// `Host` (see [`PublicUrl`]). Unset: from `Host`.
    pub public_url: Option<PublicUrl>,
    /// A client must send a request's headers within this time.
    pub header_timeout_ms: u64,
    /// A client must send a request's whole body within this time (408).
    pub body_timeout_ms: u64,
    /// Most bytes one storage call of a plugin may return (a scan or
    /// get-many over it is refused with `too-large`).
    pub max_call_bytes: usize,
    /// Most bytes of writes one request may hold before it commits.
    pub max_request_write_bytes: usize,
    /// How long a paid answer is kept for identical retries, in seconds.
    pub replay_retention_s: u64,
    /// Free space, in MiB, kept on the data dir's filesystem (embedded
    /// store): below it writing requests are refused with 503 `disk_full`
    /// (see `store::disk`); 0: none kept.
    pub min_free_disk_mib: u64,
    /// redb's page cache (embedded store), in MiB: the most of the
    /// database it holds in memory (reads and the writes not yet flushed).
    pub store_cache_mib: u64,
    /// Let concurrent mutating requests share one durable commit.
    pub group_commit: bool,
    /// Longest a committed request waits, in microseconds, for a batch-mate
    /// to make its batch durable before it does so itself.
    pub commit_window_us: u64,
    /// Most requests whose commits share one fsync.
    pub commit_max_batch: u64,
    /// Upstream webcash mode: the base URL (`http://host:port`) of a
    /// webcash server at which payment secrets are validated and spent
    /// instead of the embedded ledger (see `money::upstream`).
    pub cash_upstream: Option<String>,
    /// Longest wait for one call to the upstream webcash server.
    pub cash_upstream_timeout_ms: u64,
    /// Where the data lives: `redb` (the embedded file in `data_dir`), or a
    /// `postgres://` URL of a PostgreSQL-protocol database shared by many
    /// hosts (see `store::pg`).
    pub store: String,
    /// The schema of the shared store holding this service's data.
    pub store_schema: String,
    /// Most connections to the shared store.
    pub store_connections: u64,
    /// Longest wait for one round trip to the shared store, or for a free
    /// connection to it (see `store::pg`).
    pub store_timeout_ms: u64,
    /// The server key (64 hex): HMAC key of server-made secrets. Unset:
    /// `<data_dir>/server.key` (redb), or the shared store's (postgres).
    pub server_key: Option<String>,
    /// Families and their grants: `[families.NAME] component = "x.wasm",
    /// grants = ["payments"], read = ["timeline"]`. A built-in family
    /// named here keeps its component unless one is given, and takes these
    /// grants instead of its built-in ones; any other name mounts a new
    /// family.
    pub families: BTreeMap<String, FamilyConfig>,
    /// Per-family operator settings (`[settings.fees] post = "0.3"`), read by
    /// plugins through the `settings` interface.
    pub settings: BTreeMap<String, BTreeMap<String, toml::Value>>,
    /// Where `plugins_dir` was set, as errors say it (`from the flag
    /// --plugins = "..."`); `None` for the default. Not a setting.
    #[serde(skip)]
    pub plugins_dir_source: Option<String>,
}

/// One `[families.NAME]` table.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FamilyConfig {
    /// Component file name, relative to `plugins_dir`.
    pub component: Option<String>,
    /// Capabilities granted (see `crate::capabilities`).
    pub grants: Option<Vec<String>>,
    /// Other families' keyspaces it may read.
    pub read: Option<Vec<String>>,
    /// Most requests of this family running at once (more wait).
    pub max_concurrent: Option<u32>,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// A family the host serves, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilySpec {
    pub name: String,
    pub component: String,
    pub grants: crate::capabilities::Grants,
    /// Most requests running at once (None: only the global pool bounds it).
    pub max_concurrent: Option<u32>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:8080".parse().expect("valid default address"),
            data_dir: PathBuf::from("data"),
            plugins_dir: default_plugins_dir(),
            cache_dir: None,
            admin_listen: None,
            admin_token: None,
            arbiter_key: None,
            plugins: BTreeMap::new(),
            request_timeout_ms: 1000,
            plugin_memory_mib: 64,
            plugin_memory_total_mib: 1024,
            max_instances: 256,
            memory_reservation_mib: None,
            max_body_bytes: 2 * 1024 * 1024,
            max_pending_body_bytes: 256 << 20,
            max_unsent_answer_bytes: 256 << 20,
            testing_routes: false,
            watch_plugins: true,
            perf_map: false,
            heap_huge_pages: true,
            log: "info".into(),
            log_format: LogFormat::Text,
            metrics_listen: None,
            drain_timeout_ms: 10_000,
            drain_linger_ms: 500,
            max_connections: 1024,
            max_connections_per_ip: 512,
            max_long_calls_per_ip: 2,
            trusted_proxies: TrustedProxies::default(),
            public_url: None,
            header_timeout_ms: 10_000,
            body_timeout_ms: 10_000,
            max_call_bytes: 32 << 20,
            max_request_write_bytes: 64 << 20,
            replay_retention_s: 24 * 3600,
            min_free_disk_mib: 512,
            store_cache_mib: 1024,
            group_commit: true,
            commit_window_us: 2000,
            commit_max_batch: 32,
            cash_upstream: None,
            cash_upstream_timeout_ms: 5000,
            store: "redb".into(),
            store_schema: "marketplace".into(),
            store_connections: 64,
            store_timeout_ms: 10_000,
            server_key: None,
            settings: BTreeMap::new(),
            families: BTreeMap::new(),
            plugins_dir_source: None,
        }
    }
}

/// Where `cargo xtask build-plugins` puts the components
/// (`target/plugins`, once it holds `info.wasm`): beside the host binary's
/// target directory when run from a checkout, else `./plugins`.
fn default_plugins_dir() -> PathBuf {
    let built = std::env::current_exe().ok().and_then(|exe| {
        // <target>/<profile>/marketplace -> <target>/plugins
        let target = exe.parent()?.parent()?;
        let dir = target.join("plugins");
        dir.join("info.wasm").is_file().then_some(dir)
    });
    built.unwrap_or_else(|| {
        let cwd_built = Path::new("target/plugins");
        if cwd_built.join("info.wasm").is_file() {
            cwd_built.to_path_buf()
        } else {
            PathBuf::from("plugins")
        }
    })
}

/// The largest body a route may take with `max_body_bytes`: that, or a
/// route's own `max-body` (at most the largest stored value, 16 MiB).
pub fn largest_body_bytes(max_body_bytes: usize) -> usize {
    max_body_bytes.max(marketplace_common::MAX_VALUE_BYTES)
}

/// The host's own settings table, `[settings.cash]`, and its keys.
pub const CASH_SETTINGS: &str = "cash";
const CASH_KEYS: &[&str] = &["terms"];

/// A setting as a component reads it: a string as written, a number or
/// boolean in TOML form (`0.5`, `true`), a list as its items joined by
/// commas (`allowed_origins = ["https://a", "https://b"]`).
fn setting_text(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(items) => items.iter().map(setting_text).collect::<Vec<_>>().join(","),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Float(f) => f.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        // (Refused at start: see `plain_setting`.)
        toml::Value::Table(_) => String::new(),
    }
}

/// Whether a setting's value is one [`setting_text`] writes as a
/// component expects: a scalar, or a list of scalars.
fn plain_setting(value: &toml::Value) -> bool {
    match value {
        toml::Value::Table(_) => false,
        toml::Value::Array(items) => items
            .iter()
            .all(|i| !matches!(i, toml::Value::Table(_) | toml::Value::Array(_))),
        _ => true,
    }
}

impl Config {
    /// Every family this host serves at start, with its component file name
    /// and grants.
    pub fn families(&self) -> Vec<FamilySpec> {
        self.try_families().unwrap_or_default()
    }

    fn try_families(&self) -> Result<Vec<FamilySpec>> {
        use crate::capabilities::{self, Grants};
        let mut out: Vec<FamilySpec> = DEFAULT_PLUGINS
            .iter()
            .chain(self.testing_routes.then_some(&TESTING_PLUGIN))
            .map(|(f, c)| FamilySpec {
                name: f.to_string(),
                component: c.to_string(),
                grants: capabilities::builtin(f),
                max_concurrent: None,
            })
            .collect();
        for (name, fc) in &self.families {
            if !capabilities::valid_family(name) {
                bail!(
                    "[families.{name}]: a family name is {}",
                    crate::capabilities::FAMILY_NAME_RULE
                );
            }
            let i = match out.iter().position(|f| &f.name == name) {
                Some(i) => i,
                None => {
                    let Some(component) = &fc.component else {
                        bail!(
                            "[families.{name}] needs a component file name, relative to plugins_dir: component = \"{name}.wasm\" (or \"families/{name}.wasm\" for the watched directory's file)"
                        );
                    };
                    out.push(FamilySpec {
                        name: name.clone(),
                        component: component.clone(),
                        grants: Grants::default(),
                        max_concurrent: None,
                    });
                    out.len() - 1
                }
            };
            if let Some(c) = &fc.component {
                out[i].component = c.clone();
            }
            if fc.max_concurrent.is_some() {
                out[i].max_concurrent = fc.max_concurrent;
            }
            if fc.grants.is_some() || fc.read.is_some() {
                let caps = fc.grants.iter().flatten().map(String::as_str);
                let reads = fc.read.iter().flatten().map(String::as_str);
                let mut given = Grants::parse(caps, reads)
                    .map_err(|e| anyhow::anyhow!("[families.{name}]: {e}"))?;
                // Each replaces its own half: a built-in family given only
                // `read` keeps the capabilities it needs, and the reverse.
                let before = &out[i].grants;
                if fc.grants.is_none() {
                    given.capabilities = before.capabilities.clone();
                }
                if fc.read.is_none() {
                    given.reads = before.reads.clone();
                }
                grants_fit(name, &given).map_err(|e| anyhow::anyhow!("[families.{name}]: {e}"))?;
                out[i].grants = given;
            }
        }
        for f in out.iter_mut() {
            if let Some(over) = self.plugins.get(&f.name) {
                f.component = over.clone();
            }
        }
        Ok(out)
    }

    /// Which claim on routes a family has at start: 0 for the built-in
    /// families (the default ones, and `testing` with testing routes on),
    /// 1 for the other configured ones, 2 for any other (mounted only
    /// through the admin API or the families directory). At start they
    /// mount in that order, so which one gets a path two of them declare
    /// does not depend on which component compiles first.
    pub fn start_rank(&self, name: &str) -> u8 {
        if DEFAULT_PLUGINS.iter().any(|(f, _)| *f == name)
            || (self.testing_routes && name == TESTING_PLUGIN.0)
        {
            0
        } else if self.families.contains_key(name) {
            1
        } else {
            2
        }
    }

    /// The configured spec of one family, if it has one.
    pub fn family(&self, name: &str) -> Option<FamilySpec> {
        self.families().into_iter().find(|f| f.name == name)
    }

    /// Settings of one family as strings (TOML strings as written, other
    /// values in TOML form, e.g. `0.6`).
    pub fn family_settings(&self, family: &str) -> BTreeMap<String, String> {
        self.settings
            .get(family)
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), setting_text(v)))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// One setting of one family, as [`Config::family_settings`] gives it.
    pub fn family_setting(&self, family: &str, key: &str) -> Option<String> {
        self.settings.get(family)?.get(key).map(setting_text)
    }

    /// The keys of one family's settings, sorted.
    pub fn family_setting_keys(&self, family: &str) -> Vec<String> {
        self.settings
            .get(family)
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// `drain_linger_ms` as a drain uses it: at most half of
    /// `drain_timeout_ms` (an idle connection must not outlive the drain),
    /// and a line to log at start when that cut it.
    pub fn drain_linger(&self) -> (Duration, Option<String>) {
        let half = Duration::from_millis(self.drain_timeout_ms) / 2;
        let linger = Duration::from_millis(self.drain_linger_ms);
        let cut = (linger > half).then(|| {
            format!(
                "drain_linger_ms {} is more than half of drain_timeout_ms {}: a drain lingers {} ms",
                self.drain_linger_ms,
                self.drain_timeout_ms,
                half.as_millis()
            )
        });
        (linger.min(half), cut)
    }

    /// The `[settings.<family>]` tables for no family of this
    /// configuration nor of those `mounted` at start (kept uploads, the
    /// families directory), each a line to log: a family of that name
    /// mounted later reads them, but a typo (`[settings.fee]`) would
    /// otherwise go unnoticed.
    pub fn settings_for_no_family(&self, mounted: &[String]) -> Vec<String> {
        let families = self.families();
        let mut names: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
        for f in mounted {
            if !names.contains(&f.as_str()) {
                names.push(f);
            }
        }
        self.settings
            .keys()
            .filter(|f| f.as_str() != CASH_SETTINGS && !names.contains(&f.as_str()))
            .map(|f| {
                format!(
                    "[settings.{f}] is for no family of this configuration, mounted at start or uploaded and kept (they are {}, and `cash` for the host's cash): it has effect only once a family named {f:?} is mounted",
                    names.join(", ")
                )
            })
            .collect()
    }

    /// `max_pending_body_bytes`, or room for two bodies of the largest
    /// size a route may take (`max_body_bytes`, or a route's own
    /// `max-body` of up to 16 MiB) when that is more: one stalled body
    /// never keeps out a body of that size.
    pub fn pending_body_budget(&self) -> u64 {
        let largest = largest_body_bytes(self.max_body_bytes) as u64;
        self.max_pending_body_bytes.max(2 * largest)
    }

    /// Compiled-component cache directory.
    pub fn cache_path(&self) -> PathBuf {
        self.cache_dir
            .clone()
            .unwrap_or_else(|| self.data_dir.join("cache"))
    }

    /// Whether the data lives in a shared (PostgreSQL-protocol) store.
    pub fn shared_store(&self) -> bool {
        self.store != "redb"
    }

    /// Path of the redb file.
    pub fn db_path(&self) -> PathBuf {
        self.data_dir.join("marketplace.redb")
    }
}
