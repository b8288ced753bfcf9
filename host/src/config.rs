//! Configuration: embedded defaults, overlaid by a TOML file, then by
//! `MARKETPLACE_*` environment variables, then by command-line flags.

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

/// `trusted_proxies`: addresses and networks, written in TOML as a list
/// or as one comma-separated string (as an environment variable is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

impl TrustedProxies {
    /// Parse `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32` entries.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<TrustedProxies> {
        let mut nets = Vec::new();
        for entry in entries {
            let entry = entry.trim();
            let net = match entry.parse::<std::net::IpAddr>() {
                Ok(addr) => ipnet::IpNet::from(addr),
                Err(_) => entry.parse::<ipnet::IpNet>().map_err(|_| {
                    anyhow::anyhow!(
                        "trusted_proxies: {entry:?} is not an address or a network (e.g. 10.0.0.1 or 10.0.0.0/8)"
                    )
                })?,
            };
            nets.push(canonical(net));
        }
        Ok(TrustedProxies(nets))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `addr` (an IPv4 address written as IPv6 too) is a proxy's.
    pub fn contains(&self, addr: std::net::IpAddr) -> bool {
        let addr = addr.to_canonical();
        self.0.iter().any(|net| net.contains(&addr))
    }
}

/// IPv4 written as IPv6 (`::ffff:10.0.0.0/104`) as the IPv4 network it
/// is, since addresses are matched in their IPv4 form.
fn canonical(net: ipnet::IpNet) -> ipnet::IpNet {
    match net {
        ipnet::IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, ipnet::IpNet::V4),
            None => net,
        },
        _ => net,
    }
}

impl<'de> Deserialize<'de> for TrustedProxies {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(String),
            List(Vec<String>),
        }
        let written = Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "trusted_proxies must be a string of addresses and networks separated by commas, or a list of them",
            )
        })?;
        let entries: Vec<String> = match written {
            Written::One(text) if text.trim().is_empty() => Vec::new(),
            Written::One(text) => text.split(',').map(str::to_string).collect(),
            Written::List(list) => list,
        };
        TrustedProxies::parse(entries.iter().map(String::as_str))
            .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

/// `public_url`: `http(s)://host[:port]`, no path (the service's routes
/// are at the root). Components and the host make absolute URLs from a
/// request's `Host` and `X-Forwarded-Proto`, so with it set those two
/// headers are given as it says ([`PublicUrl::apply`]); it is also the
/// `mcp` family's `public_url` unless `[settings.mcp]` names another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
}

impl PublicUrl {
    pub fn parse(url: &str) -> Result<PublicUrl> {
        let problem = |why: &str| {
            anyhow::anyhow!(
                "public_url {url:?} {why}: give the origin clients use, e.g. https://market.example"
            )
        };
        let uri: ureq::http::Uri = url.trim().parse().map_err(|_| problem("is not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {
                s.to_ascii_lowercase()
            }
            _ => return Err(problem("must start with http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| problem("has no host"))?;
        if authority.as_str().contains('@') {
            return Err(problem("must have no user name"));
        }
        if authority.as_str().ends_with(':') {
            return Err(problem("has an empty port"));
        }
        // As browsers write an origin: the default port left out.
        let default_port = if scheme == "https" { 443 } else { 80 };
        let host = authority.host().to_ascii_lowercase();
        let authority = match authority.port_u16() {
            Some(port) if port != default_port => format!("{host}:{port}"),
            _ => host,
        };
        if !marketplace_common::url::plausible_host(&authority) {
            return Err(problem("has no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() || url.contains('#') {
            return Err(problem("must have no path, query or fragment"));
        }
        Ok(PublicUrl { scheme, authority })
    }

    /// Give `headers` (a request's, as components see them) the `Host` and
    /// `X-Forwarded-Proto` of this URL instead of the client's.
    pub fn apply(&self, headers: &mut Vec<(String, String)>) {
        headers.retain(|(name, _)| {
            !name.eq_ignore_ascii_case("host") && !name.eq_ignore_ascii_case("x-forwarded-proto")
        });
        headers.push(("host".into(), self.authority.clone()));
        headers.push(("x-forwarded-proto".into(), self.scheme.clone()));
    }
}

impl std::fmt::Display for PublicUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl<'de> Deserialize<'de> for PublicUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PublicUrl::parse(&text).map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
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

/// Whether listeners on `a` and `b` would take the same socket: one port
/// (not 0, which picks a free one) and one address, or an unspecified one
/// covering the other (`[::]` takes IPv4 too, as Linux binds it by
/// default; `0.0.0.0` every IPv4 address, mapped ones included).
fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() == 0 || a.port() != b.port() {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |u: std::net::IpAddr, other: std::net::IpAddr| {
        u.is_unspecified() && (u.is_ipv6() || other.is_ipv4())
    };
    x == y || covers(x, y) || covers(y, x)
}

/// The command-line flag that sets `setting` (`--plugins` for
/// `plugins_dir`, else the setting's name with dashes).
fn flag_of(setting: &str) -> String {
    match setting {
        "plugins_dir" => "plugins".into(),
        other => other.replace('_', "-"),
    }
}

/// ` (`name` where it was set)` for the first setting of `sources` an
/// error's `message` names (quoted in backticks as serde's errors do, or
/// as a whole word as ours do), or nothing. Of names found at one place,
/// the longest (`plugins.fees`, an environment variable's, over the
/// file's `plugins` table).
fn named_source(message: &str, sources: &BTreeMap<String, String>, quoted: bool) -> String {
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    sources
        .iter()
        .filter_map(|(name, source)| {
            let at = if quoted {
                // (A table's field is named `table.key`.)
                message
                    .find(&format!("`{name}`"))
                    .or_else(|| message.find(&format!("`{name}.")))
            } else {
                message
                    .match_indices(name.as_str())
                    .map(|(at, _)| at)
                    .find(|&at| {
                        !word(message[..at].chars().next_back())
                            && !word(message[at + name.len()..].chars().next())
                    })
            }?;
            Some((at, std::cmp::Reverse(name.len()), name, source))
        })
        .min()
        .map(|(_, _, name, source)| format!(" (`{name}` {source})"))
        .unwrap_or_default()
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

/// A URL as an error may show it: quoted, with what stands before an `@`
/// (a user and password) left out.
fn without_credentials(url: &str) -> String {
    match url.rsplit_once('@') {
        Some((before, after)) => {
            let scheme = before.split_once("//").map_or("", |(s, _)| s);
            format!("{:?}", format!("{scheme}//(credentials left out)@{after}"))
        }
        None => format!("{url:?}"),
    }
}

/// Check a log filter as `EnvFilter` reads it, and more strictly: a
/// directive with no `=` must be a level or a module path (`a::b`). A
/// bare word is otherwise a target's name to `EnvFilter`, so a misspelt
/// level (`wran`) would be a filter for a target of that name and silence
/// every line, the access log included.
fn log_filter(filter: &str) -> std::result::Result<(), String> {
    tracing_subscriber::EnvFilter::try_new(filter).map_err(|e| e.to_string())?;
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let bare = !directive.contains(['=', '[', ':']);
        if bare
            && directive != "marketplace"
            && directive
                .parse::<tracing_subscriber::filter::LevelFilter>()
                .is_err()
        {
            return Err(format!(
                "{directive:?} is neither a level (trace, debug, info, warn, error, off) nor TARGET=LEVEL"
            ));
        }
    }
    Ok(())
}

/// A value a flag or an environment variable overrode: still checked,
/// since it is set and would be read once what overrides it is gone (a
/// broken file found in an incident, when the variable is removed).
struct Overridden {
    /// The setting (`plugins.{family}` for a family's component).
    key: String,
    value: toml::Value,
    /// Where the value was set, as errors say it.
    source: String,
    /// What overrode it: the flag or variable.
    by: String,
}

impl Overridden {
    /// The value `table` holds for `key` now, which `by` is about to
    /// override, if any.
    fn of(
        table: &toml::Table,
        key: &str,
        sources: &BTreeMap<String, String>,
        by: String,
    ) -> Option<Overridden> {
        let value = match key.strip_prefix("plugins.") {
            Some(family) => table.get("plugins")?.as_table()?.get(family)?,
            None => table.get(key)?,
        };
        let source = sources
            .get(key)
            .or_else(|| key.strip_prefix("plugins.").and(sources.get("plugins")))
            .cloned()
            .unwrap_or_default();
        Some(Overridden {
            key: key.to_string(),
            value: value.clone(),
            source,
            by,
        })
    }

    /// Check the value in the final configuration (`table`, which holds)
    /// in place of what overrode it: the rules that read another setting
    /// (`plugin_memory_total_mib` at least `plugin_memory_mib`) read the
    /// others as they are in force.
    fn check(&self, table: &toml::Table) -> Result<()> {
        let mut table = table.clone();
        match self.key.strip_prefix("plugins.") {
            Some(family) => {
                plugins_entry(&mut table)?.insert(family.to_string(), self.value.clone());
            }
            None => {
                table.insert(self.key.clone(), self.value.clone());
            }
        }
        let checked = toml::Value::Table(table)
            .try_into::<Config>()
            .map_err(|e| e.to_string().trim().replace('\n', " "))
            .and_then(|c| c.validate().map_err(|e| format!("{e:#}")));
        match checked {
            Ok(()) => Ok(()),
            Err(message) => bail!(
                "invalid configuration: {message} (`{}` {}, which {} overrides)",
                self.key,
                self.source,
                self.by
            ),
        }
    }
}

impl Config {
    /// Build the configuration from an optional file, the environment and
    /// flag overrides (`key`, TOML-or-string value).
    pub fn load(
        file: Option<&Path>,
        env: &[(String, String)],
        flags: &[(String, String)],
    ) -> Result<Config> {
        let mut table = toml::Table::new();
        // Where each setting came from, for an error about it.
        let mut sources: BTreeMap<String, String> = BTreeMap::new();
        // The families named by `MARKETPLACE_PLUGIN_*`, as spelled there.
        let mut env_families: Vec<String> = Vec::new();
        // The values the environment and flags override, checked once the
        // final configuration is known.
        let mut overridden: Vec<Overridden> = Vec::new();
        let file = file.map(Path::to_path_buf).or_else(|| {
            env.iter()
                .find(|(k, _)| k == "MARKETPLACE_CONFIG")
                .map(|(_, v)| PathBuf::from(v))
        });
        if let Some(path) = file {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading config {}", path.display()))?;
            table = text
                .parse::<toml::Table>()
                .with_context(|| format!("parsing config {}", path.display()))?;
            for key in table.keys() {
                sources.insert(
                    key.clone(),
                    format!("in the config file {}", path.display()),
                );
            }
        }
        for (key, value) in env {
            let Some(name) = key.strip_prefix("MARKETPLACE_") else {
                continue;
            };
            let name = name.to_ascii_lowercase();
            // The test harness's own variables (README: `cargo xtask pg`
            // prints MARKETPLACE_TEST_PG) are not settings of a server
            // started beside them.
            if name == "config" || name.starts_with("test_") || name == "require_pg" {
                continue;
            }
            // An empty switch is an unset one (`X=${X:-}` in a compose
            // file), not a wrong value.
            if value.trim().is_empty()
                && (name == "log_json" || BOOL_SETTINGS.contains(&name.as_str()))
            {
                continue;
            }
            // `MARKETPLACE_PLUGIN_{FAMILY}` names a family's component,
            // except the settings whose own names start that way.
            let family = name.strip_prefix("plugin_").filter(|_| {
                !matches!(
                    name.as_str(),
                    "plugin_memory_mib" | "plugin_memory_total_mib"
                )
            });
            let overrides = match (name.as_str(), family) {
                ("log_json", _) => "log_format".to_string(),
                (_, Some(family)) => format!("plugins.{family}"),
                _ => name.clone(),
            };
            let by = format!("the environment variable {key}");
            overridden.extend(Overridden::of(&table, &overrides, &sources, by));
            sources.insert(
                name.clone(),
                format!("from the environment variable {key}{}", shown(&name, value)),
            );
            if name == "log_json" {
                // Either way it is the environment's word over the file's
                // `log_format`.
                let format = if boolean(key, value)? { "json" } else { "text" };
                table.insert("log_format".into(), toml::Value::String(format.into()));
                continue;
            }
            if let Some(family) = family {
                plugins_entry(&mut table)?
                    .insert(family.to_string(), toml::Value::String(value.clone()));
                env_families.push(family.to_string());
                sources.insert(
                    format!("plugins.{family}"),
                    format!("from the environment variable {key}"),
                );
                continue;
            }
            let value = scalar(&name, key, value)?;
            table.insert(name, value);
        }
        for (key, value) in flags {
            let key = key.replace('-', "_");
            let by = format!("the flag --{}", flag_of(&key));
            overridden.extend(Overridden::of(&table, &key, &sources, by));
            sources.insert(
                key.clone(),
                format!("from the flag --{}{}", flag_of(&key), shown(&key, value)),
            );
            let value = scalar(&key, &key, value)?;
            table.insert(key, value);
        }
        let in_force = table.clone();
        let mut config: Config =
            toml::Value::Table(table)
                .try_into()
                .map_err(|e: toml::de::Error| {
                    let message = e.to_string().trim().replace('\n', " ");
                    let source = named_source(&message, &sources, true);
                    // (std's words for `localhost:8080` say nothing of why.)
                    let hint = match message.contains("invalid socket address syntax") {
                        true => ": a listener is an IP address and a port, e.g. 127.0.0.1:8080 or [::1]:8080 (a host name is not looked up)",
                        false => "",
                    };
                    anyhow::anyhow!("invalid configuration: {message}{source}{hint}")
                })?;
        config.dash_env_families(&env_families);
        config
            .validate()
            .and_then(|()| config.validate_together())
            .map_err(|e| {
                let message = format!("{e:#}");
                let source = named_source(&message, &sources, false);
                anyhow::anyhow!("{message}{source}")
            })?;
        for value in &overridden {
            value.check(&in_force)?;
        }
        // RUST_LOG wins over `log`, so it is held to the same rule: a typo
        // would otherwise lose the access log for the life of the process.
        // (No setting: its error names no setting's source.)
        if let Ok(rust_log) = std::env::var("RUST_LOG")
            && let Err(e) = log_filter(&rust_log)
        {
            bail!(
                "RUST_LOG {rust_log:?} is not a log filter (e.g. info, or warn,marketplace=debug): {e}"
            );
        }
        if let Some(public) = &config.public_url {
            let mcp = config.settings.entry("mcp".into()).or_default();
            // (A blank one is an unset one, as the family reads it.)
            let unset = mcp
                .get("public_url")
                .is_none_or(|v| v.as_str().is_some_and(|u| u.trim().is_empty()));
            if unset {
                mcp.insert("public_url".into(), toml::Value::String(public.to_string()));
            }
        }
        Ok(config)
    }

    /// A shell cannot export a variable with `-` in its name, so
    /// `MARKETPLACE_PLUGIN_MY_FAM` names the family `my-fam` when there is
    /// no family `my_fam` (family names may hold either).
    fn dash_env_families(&mut self, named: &[String]) {
        let Ok(families) = self.try_families() else {
            return; // validate() reports it
        };
        let known = |name: &str| families.iter().any(|f| f.name == name);
        for name in named {
            let dashed = name.replace('_', "-");
            if !known(name)
                && dashed != *name
                && known(&dashed)
                && let Some(component) = self.plugins.remove(name)
            {
                self.plugins.insert(dashed, component);
            }
        }
    }

    /// The numeric settings a start accepts within a range: (name, value,
    /// least, most). README's Configuration lists them (a unit test holds
    /// the two together).
    fn ranges(&self) -> [(&'static str, u64, u64, u64); 23] {
        [
            ("store_connections", self.store_connections, 2, 10_000),
            ("store_timeout_ms", self.store_timeout_ms, 100, 600_000),
            ("request_timeout_ms", self.request_timeout_ms, 1, 60_000),
            ("plugin_memory_mib", self.plugin_memory_mib, 1, 4096),
            (
                "plugin_memory_total_mib",
                self.plugin_memory_total_mib,
                self.plugin_memory_mib,
                1 << 20,
            ),
            ("max_instances", self.max_instances.into(), 1, 10_000),
            ("commit_window_us", self.commit_window_us, 1, 1_000_000),
            ("commit_max_batch", self.commit_max_batch, 1, 100_000),
            ("max_body_bytes", self.max_body_bytes as u64, 1, 1 << 30),
            (
                "max_pending_body_bytes",
                self.max_pending_body_bytes,
                32 << 20,
                1 << 40,
            ),
            (
                "max_unsent_answer_bytes",
                self.max_unsent_answer_bytes,
                1 << 20,
                1 << 40,
            ),
            ("drain_timeout_ms", self.drain_timeout_ms, 0, 600_000),
            ("drain_linger_ms", self.drain_linger_ms, 0, 600_000),
            ("max_connections", self.max_connections.into(), 1, 1_000_000),
            (
                "max_connections_per_ip",
                self.max_connections_per_ip.into(),
                0,
                1_000_000,
            ),
            (
                "max_long_calls_per_ip",
                self.max_long_calls_per_ip.into(),
                0,
                1_000_000,
            ),
            ("header_timeout_ms", self.header_timeout_ms, 100, 600_000),
            ("body_timeout_ms", self.body_timeout_ms, 100, 3_600_000),
            (
                "max_call_bytes",
                self.max_call_bytes as u64,
                1 << 20,
                1 << 32,
            ),
            (
                "max_request_write_bytes",
                self.max_request_write_bytes as u64,
                1 << 20,
                1 << 34,
            ),
            (
                "replay_retention_s",
                self.replay_retention_s,
                60,
                365 * 24 * 3600,
            ),
            ("min_free_disk_mib", self.min_free_disk_mib, 0, 1 << 30),
            (
                "cash_upstream_timeout_ms",
                self.cash_upstream_timeout_ms,
                100,
                60_000,
            ),
        ]
    }

    /// The rules that read several settings: checked on the final
    /// configuration only (a value a flag or variable overrides is checked
    /// by [`Config::validate`] alone, in place of what overrode it).
    fn validate_together(&self) -> Result<()> {
        // Two listeners on one address: the second bind would fail with
        // the OS's "address in use", naming neither setting.
        let listeners = [
            ("listen", Some(self.listen)),
            ("admin_listen", self.admin_listen),
            ("metrics_listen", self.metrics_listen),
        ];
        for (i, (name, addr)) in listeners.iter().enumerate() {
            for (other, addr2) in &listeners[i + 1..] {
                if let (Some(a), Some(b)) = (addr, addr2)
                    && same_socket(*a, *b)
                {
                    bail!(
                        "{other} {b} would bind where {name} {a} does: give each listener an address and port of its own"
                    );
                }
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<()> {
        // An empty path would be the working directory, never meant.
        for (name, path) in [
            ("data_dir", Some(&self.data_dir)),
            ("plugins_dir", Some(&self.plugins_dir)),
            ("cache_dir", self.cache_dir.as_ref()),
        ] {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                bail!("{name} must not be empty (leave it unset for the default)");
            }
            // (A plugins_dir that is no directory is refused with the
            // CLI's hint on how to build one.)
            if name != "plugins_dir"
                && let Some(p) = path.filter(|p| p.exists() && !p.is_dir())
            {
                bail!("{name} {} is not a directory", p.display());
            }
        }
        if let Some(addr) = self.admin_listen
            && !addr.ip().is_loopback()
        {
            bail!("admin_listen must be a loopback address, got {addr}");
        }
        if let Err(e) = log_filter(&self.log) {
            bail!(
                "log {:?} is not a log filter (e.g. info, or warn,marketplace=debug): {e}",
                self.log
            );
        }
        if let Some(mib) = self.memory_reservation_mib
            && !(self.plugin_memory_mib..=1 << 20).contains(&mib)
        {
            bail!(
                "memory_reservation_mib must be at least plugin_memory_mib ({}) and at most 1048576, got {mib}",
                self.plugin_memory_mib
            );
        }
        for (name, value, min, max) in self.ranges() {
            if !(min..=max).contains(&value) {
                bail!("{name} must be {min}..={max}, got {value}");
            }
        }
        if let Some(url) = &self.cash_upstream {
            upstream_url(url)
                .map_err(|e| anyhow::anyhow!("cash_upstream {}: {e}", without_credentials(url)))?;
        }
        if self.store != "redb"
            && !self.store.starts_with("postgres://")
            && !self.store.starts_with("postgresql://")
        {
            // Not echoed whole: a URL may carry a password.
            bail!(
                "store must be \"redb\" or a postgres://user@host:port/database URL, got {}",
                without_credentials(&self.store)
            );
        }
        if self.shared_store() && self.cash_upstream.is_some() {
            bail!(
                "cash_upstream is not supported with a shared store: a request that runs again after a conflict would swap its payment at the upstream twice"
            );
        }
        if self.store_schema.is_empty()
            || self.store_schema.len() > 63
            || !self
                .store_schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            bail!(
                "store_schema must be 1..=63 of a-z, 0-9 and _, got {:?}",
                self.store_schema
            );
        }
        for (name, key) in [
            ("server_key", &self.server_key),
            ("arbiter_key", &self.arbiter_key),
        ] {
            if let Some(key) = key
                && (key.trim().len() != 64 || !key.trim().bytes().all(|b| b.is_ascii_hexdigit()))
            {
                bail!("{name} must be 64 hex characters");
            }
        }
        if let Some(token) = &self.admin_token
            && token.len() < MIN_ADMIN_TOKEN_BYTES
        {
            bail!(
                "admin_token must be at least {MIN_ADMIN_TOKEN_BYTES} bytes (got {}); leave it unset to have one generated into <data_dir>/admin.token",
                token.len()
            );
        }
        let families = self.try_families()?;
        for f in &families {
            // Named as it was set: `[plugins]` (or MARKETPLACE_PLUGIN_*)
            // over `[families.*] component`.
            confined(&f.component).map_err(|e| {
                if self.plugins.contains_key(&f.name) {
                    anyhow::anyhow!(
                        "plugins.{}: the component of family {}: {e}",
                        f.name,
                        f.name
                    )
                } else {
                    anyhow::anyhow!("[families.{}] component: {e}", f.name)
                }
            })?;
            if f.max_concurrent == Some(0) {
                bail!("[families.{}] max_concurrent must be at least 1", f.name);
            }
        }
        for (family, table) in &self.settings {
            for (key, value) in table {
                if !plain_setting(value) {
                    bail!(
                        "[settings.{family}] {key}: a setting is a string, a number, a boolean or a list of them"
                    );
                }
                if family == CASH_SETTINGS && !CASH_KEYS.contains(&key.as_str()) {
                    bail!(
                        "[settings.cash] {key}: unknown setting of the host's cash (it reads {})",
                        CASH_KEYS.join(", ")
                    );
                }
            }
        }
        for family in self.plugins.keys() {
            if !families.iter().any(|f| &f.name == family) {
                let known: Vec<&str> = families.iter().map(|f| f.name.as_str()).collect();
                bail!(
                    "plugins.{family}: unknown plugin family {family:?}, named by [plugins] {family} in the config file or by MARKETPLACE_PLUGIN_{}; the families are {} (a new family is mounted with [families.{family}] in the config file)",
                    family.to_ascii_uppercase().replace('-', "_"),
                    known.join(", ")
                );
            }
        }
        Ok(())
    }

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
                    "[settings.{f}] is for no family of this configuration or mounted at start (they are {}, and `cash` for the host's cash): it has effect only once a family named {f:?} is mounted",
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

fn plugins_entry(table: &mut toml::Table) -> Result<&mut toml::Table> {
    table
        .entry("plugins")
        .or_insert_with(|| toml::Value::Table(toml::Table::new()))
        .as_table_mut()
        .context("`plugins` must be a table")
}

/// Settings that are strings whatever they look like (an all-digit token
/// stays a string).
const STRING_SETTINGS: &[&str] = &[
    "listen",
    "data_dir",
    "plugins_dir",
    "cache_dir",
    "admin_listen",
    "admin_token",
    "arbiter_key",
    "log",
    "log_format",
    "metrics_listen",
    "cash_upstream",
    "store",
    "store_schema",
    "server_key",
    "trusted_proxies",
    "public_url",
];

/// The upstream webcash server's base URL: `http://host[:port][/prefix]`,
/// no query or fragment. `https` needs a TLS-enabled build (ureq's
/// `rustls` feature, off here): put a local TLS proxy in front instead.
pub fn upstream_url(url: &str) -> Result<()> {
    let uri: ureq::http::Uri = url
        .parse()
        .map_err(|e| anyhow::anyhow!("not a URL ({e})"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => bail!(
            "https is not supported by this build (ureq without TLS): use an http:// URL, e.g. a local TLS proxy in front of the upstream"
        ),
        _ => bail!("must start with http://"),
    }
    if uri.host().is_none_or(str::is_empty) {
        bail!("has no host");
    }
    // The upstream's API has no credentials to send; a user name or
    // password here would be sent nowhere, or somewhere unexpected.
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        bail!("must not carry a user name or password (http://host[:port][/prefix])");
    }
    if uri.query().is_some() || url.contains('#') {
        bail!("must be a base URL, without query or fragment");
    }
    Ok(())
}

/// A component file name must stay inside the plugins directory: relative,
/// no `..`, no empty or absolute parts.
pub fn confined(component: &str) -> Result<()> {
    let path = Path::new(component);
    let ok = !component.is_empty()
        && !component.contains('\\')
        && path
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !ok {
        bail!(
            "{component:?} must be a file name relative to plugins_dir (no absolute path, no `..`)"
        );
    }
    Ok(())
}

/// Settings that are on or off.
const BOOL_SETTINGS: &[&str] = &[
    "testing_routes",
    "watch_plugins",
    "perf_map",
    "heap_huge_pages",
    "group_commit",
];

/// An env/flag value (`given` names it in an error): a string for
/// [`STRING_SETTINGS`], a boolean for [`BOOL_SETTINGS`]; else a TOML scalar
/// when it parses as one, else a string.
fn scalar(name: &str, given: &str, raw: &str) -> Result<toml::Value> {
    if STRING_SETTINGS.contains(&name) {
        return Ok(toml::Value::String(raw.to_string()));
    }
    if BOOL_SETTINGS.contains(&name) {
        return Ok(toml::Value::Boolean(boolean(given, raw)?));
    }
    if let Ok(v) = raw.parse::<i64>() {
        return Ok(toml::Value::Integer(v));
    }
    Ok(match raw {
        "true" => toml::Value::Boolean(true),
        "false" => toml::Value::Boolean(false),
        _ => toml::Value::String(raw.to_string()),
    })
}

/// ` = "VALUE"` of a setting named in an error, unless the value may hold
/// a secret (a token, a key, a URL with a password).
fn shown(name: &str, value: &str) -> String {
    // A token, a key, a URL that may hold credentials.
    const SECRET: &[&str] = &[
        "admin_token",
        "server_key",
        "arbiter_key",
        "store",
        "cash_upstream",
    ];
    if SECRET.contains(&name) || value.len() > 200 {
        String::new()
    } else {
        format!(" = {value:?}")
    }
}

/// An on/off value as environments spell it: `true`/`false`, `1`/`0`,
/// `yes`/`no`, `on`/`off`, in any case; anything else is refused, not
/// read as off.
fn boolean(given: &str, raw: &str) -> Result<bool> {
    match raw.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => bail!("{given} must be true or false (or 1/0, yes/no, on/off), got {raw:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_drain_lingers_at_most_half_its_time_and_a_longer_linger_is_said() {
        let config = |linger, timeout| Config {
            drain_linger_ms: linger,
            drain_timeout_ms: timeout,
            ..Config::default()
        };
        assert_eq!(
            config(500, 10_000).drain_linger(),
            (Duration::from_millis(500), None)
        );
        assert_eq!(config(5_000, 10_000).drain_linger().1, None);
        let (linger, said) = config(9_000, 10_000).drain_linger();
        assert_eq!(linger, Duration::from_secs(5));
        assert_eq!(
            said.as_deref(),
            Some(
                "drain_linger_ms 9000 is more than half of drain_timeout_ms 10000: a drain lingers 5000 ms"
            )
        );
        assert_eq!(
            config(500, 300).drain_linger().0,
            Duration::from_millis(150)
        );
    }

    #[test]
    fn a_url_in_an_error_shows_no_credentials() {
        let shown = without_credentials("Postgres://u:SECRETPW@h/db");
        assert!(
            !shown.contains("SECRETPW") && shown.contains("h/db"),
            "{shown}"
        );
        assert_eq!(without_credentials("http://h:1"), "\"http://h:1\"");
        let bad = Config {
            store: "redis://u:SECRETPW@h/db".into(),
            ..Config::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            !e.contains("SECRETPW") && e.contains("store must be"),
            "{e}"
        );
    }

    #[test]
    fn a_misspelt_level_is_not_taken_for_a_target() {
        for ok in [
            "info",
            "WARN",
            "off",
            "warn,marketplace=debug",
            "marketplace",
            "marketplace::store",
            "info,hyper=warn",
        ] {
            assert!(log_filter(ok).is_ok(), "{ok}");
        }
        for bad in ["wran", "info,debgu", "zz?z", "hyper"] {
            assert!(log_filter(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn listeners_clash_on_one_socket_only() {
        let clash = |a: &str, b: &str| same_socket(a.parse().unwrap(), b.parse().unwrap());
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:80"),
            ("0.0.0.0:80", "127.0.0.1:80"),
            ("[::]:80", "127.0.0.1:80"),
            ("[::]:80", "[::1]:80"),
            ("[::ffff:127.0.0.1]:80", "127.0.0.1:80"),
            ("0.0.0.0:80", "[::ffff:127.0.0.1]:80"),
        ] {
            assert!(clash(a, b) && clash(b, a), "{a} {b}");
        }
        for (a, b) in [
            ("127.0.0.1:80", "127.0.0.1:81"),
            ("127.0.0.1:0", "127.0.0.1:0"),
            ("127.0.0.1:80", "127.0.0.2:80"),
            ("0.0.0.0:80", "[::1]:80"),
        ] {
            assert!(!clash(a, b) && !clash(b, a), "{a} {b}");
        }
    }

    fn s(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn defaults_are_valid() {
        let c = Config::load(None, &[], &[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
        assert_eq!(c.families().len(), DEFAULT_PLUGINS.len());
        assert_eq!(
            c.family("contracts").unwrap().grants,
            crate::capabilities::builtin("contracts")
        );
    }

    /// README's Configuration gives every range a start holds a setting
    /// to, as the code has it.
    #[test]
    fn readme_lists_every_settings_range() {
        let readme = include_str!("../../README.md").replace('\n', " ");
        for (name, _, min, max) in Config::default().ranges() {
            let least = match name {
                "plugin_memory_total_mib" => "plugin_memory_mib".to_string(),
                _ => min.to_string(),
            };
            let listed = format!("`{name}` {least}..={max}");
            assert!(readme.contains(&listed), "README lacks {listed}");
        }
    }

    #[test]
    fn file_then_env_then_flags() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "listen = \"127.0.0.1:1\"\nrequest_timeout_ms = 500\n[plugins]\nfees = \"fees_pickup_paid.wasm\"\n").unwrap();
        let env = s(&[
            ("MARKETPLACE_LISTEN", "127.0.0.1:2"),
            ("MARKETPLACE_TESTING_ROUTES", "true"),
            ("OTHER", "x"),
        ]);
        let flags = s(&[("listen", "127.0.0.1:3")]);
        let c = Config::load(Some(&file), &env, &flags).unwrap();
        assert_eq!(c.listen.port(), 3);
        assert_eq!(c.request_timeout_ms, 500);
        assert!(c.testing_routes);
        assert_eq!(c.family("fees").unwrap().component, "fees_pickup_paid.wasm");
        let c = Config::load(Some(&file), &env, &[]).unwrap();
        assert_eq!(c.listen.port(), 2);
        // A file's bad value that a variable overrides is refused as one a
        // flag overrides: it would be read once the variable is gone. So
        // are the file's log_format under MARKETPLACE_LOG_JSON and a
        // family's component under MARKETPLACE_PLUGIN_<FAMILY>.
        for (text, var, value, says) in [
            (
                "max_body_bytes = 0",
                "MARKETPLACE_MAX_BODY_BYTES",
                "100",
                "max_body_bytes",
            ),
            (
                "data_dir = \"\"",
                "MARKETPLACE_DATA_DIR",
                "/d",
                "data_dir must not be empty",
            ),
            (
                "log_format = \"yaml\"",
                "MARKETPLACE_LOG_JSON",
                "1",
                "`log_format`",
            ),
            (
                "[plugins]\nfees = \"../x.wasm\"",
                "MARKETPLACE_PLUGIN_FEES",
                "fees_pickup_paid.wasm",
                "`plugins.fees`",
            ),
        ] {
            std::fs::write(&file, text).unwrap();
            let e = format!(
                "{:#}",
                Config::load(Some(&file), &s(&[(var, value)]), &[]).unwrap_err()
            );
            assert!(
                e.contains(says)
                    && e.contains("in the config file")
                    && e.contains(&format!("which the environment variable {var} overrides")),
                "{text}: {e}"
            );
        }
        // An overridden value is checked with the others in force: a rule
        // that reads another setting reads the one the server runs with.
        std::fs::write(
            &file,
            "plugin_memory_mib = 16\nplugin_memory_total_mib = 32\n",
        )
        .unwrap();
        let c = Config::load(
            Some(&file),
            &s(&[("MARKETPLACE_PLUGIN_MEMORY_TOTAL_MIB", "48")]),
            &[],
        )
        .unwrap();
        assert_eq!((c.plugin_memory_mib, c.plugin_memory_total_mib), (16, 48));
    }

    #[test]
    fn an_error_names_where_the_setting_came_from() {
        let err = |env: &[(&str, &str)], flags: &[(&str, &str)]| {
            format!("{:#}", Config::load(None, &s(env), &s(flags)).unwrap_err())
        };
        let e = err(
            &[("MARKETPLACE_MAX_CONNECTIONS", "many")],
            &[("data_dir", "d")],
        );
        assert!(
            e.contains("from the environment variable MARKETPLACE_MAX_CONNECTIONS = \"many\""),
            "{e}"
        );
        // An unknown variable is named, not a setting the error lists.
        let e = err(&[("MARKETPLACE_ZZZ", "1")], &[("data_dir", "d")]);
        assert!(
            e.contains("(`zzz` from the environment variable MARKETPLACE_ZZZ"),
            "{e}"
        );
        let e = err(&[], &[("listen", "127.0.0.1:99999")]);
        assert!(
            e.contains("from the flag --listen = \"127.0.0.1:99999\""),
            "{e}"
        );
        // A host name is no listener: the error says what is.
        let e = err(&[], &[("listen", "localhost:8080")]);
        assert!(
            e.contains("from the flag --listen = \"localhost:8080\"")
                && e.ends_with("(a host name is not looked up)"),
            "{e}"
        );
        // So do the checks made once it is read (ranges, formats); a key's
        // value is not repeated.
        let e = err(&[("MARKETPLACE_MAX_BODY_BYTES", "0")], &[]);
        assert!(
            e.contains("(`max_body_bytes` from the environment variable MARKETPLACE_MAX_BODY_BYTES = \"0\")"),
            "{e}"
        );
        let e = err(&[("MARKETPLACE_ARBITER_KEY", "zz")], &[]);
        assert!(
            e.contains("arbiter_key must be 64 hex characters (`arbiter_key` from the environment variable MARKETPLACE_ARBITER_KEY)"),
            "{e}"
        );
        // A value that may be a secret is not repeated.
        let e = err(
            &[
                ("MARKETPLACE_STORE", "postgres://u:pw@h/db"),
                ("MARKETPLACE_STORE_TIMEOUT_MS", "x"),
            ],
            &[],
        );
        assert!(!e.contains("pw@"), "{e}");
        // A store's other settings hold no secret: their values are shown.
        assert!(e.contains("MARKETPLACE_STORE_TIMEOUT_MS = \"x\""), "{e}");
        // A family's component names the variable that set it, and the
        // flag by its own name (`--plugins`, not `--plugins-dir`).
        let e = err(
            &[("MARKETPLACE_PLUGIN_FEES", "../x.wasm")],
            &[("plugins_dir", "/p")],
        );
        assert!(
            e.ends_with("(`plugins.fees` from the environment variable MARKETPLACE_PLUGIN_FEES)"),
            "{e}"
        );
        // A bad value a flag overrides is refused too, named where it was.
        let e = err(&[("MARKETPLACE_LISTEN", "5")], &[("listen", "127.0.0.1:1")]);
        assert!(
            e.contains("(`listen` from the environment variable MARKETPLACE_LISTEN = \"5\", which the flag --listen overrides)"),
            "{e}"
        );
        let e = err(&[("MARKETPLACE_PLUGINS_DIR", "")], &[("plugins_dir", "/p")]);
        assert!(
            e.contains("plugins_dir must not be empty")
                && e.contains("which the flag --plugins overrides"),
            "{e}"
        );
        let e = err(&[], &[("plugins_dir", "")]);
        assert!(e.contains("from the flag --plugins = \"\""), "{e}");
        // Two listeners on one socket, named where they were set; a value
        // a flag overrides is not held against the others' (it is
        // checked alone).
        let e = err(
            &[("MARKETPLACE_ADMIN_LISTEN", "127.0.0.1:9000")],
            &[("listen", "127.0.0.1:9000")],
        );
        assert!(
            e.contains("admin_listen 127.0.0.1:9000 would bind where listen 127.0.0.1:9000 does")
                && e.contains("from the environment variable MARKETPLACE_ADMIN_LISTEN"),
            "{e}"
        );
        let c = Config::load(
            None,
            &s(&[
                ("MARKETPLACE_LISTEN", "127.0.0.1:9000"),
                ("MARKETPLACE_ADMIN_LISTEN", "127.0.0.1:8080"),
            ]),
            &s(&[("admin_listen", "127.0.0.1:9001")]),
        )
        .unwrap();
        assert_eq!(c.admin_listen, Some("127.0.0.1:9001".parse().unwrap()));
        // Of two families' variables, the unknown one's.
        let e = err(
            &[
                ("MARKETPLACE_PLUGIN_MY_FAM", "template.wasm"),
                ("MARKETPLACE_PLUGIN_FEES", "fees_pickup_paid.wasm"),
            ],
            &[],
        );
        assert!(
            e.contains("unknown plugin family \"my_fam\"")
                && e.ends_with(
                    "(`plugins.my_fam` from the environment variable MARKETPLACE_PLUGIN_MY_FAM)"
                ),
            "{e}"
        );
        // The test harness's variables are not settings.
        let c = Config::load(
            None,
            &s(&[
                ("MARKETPLACE_TEST_PG", "postgres://x"),
                ("MARKETPLACE_REQUIRE_PG", "1"),
            ]),
            &[],
        );
        assert!(c.is_ok(), "{:?}", c.err());
    }

    #[test]
    fn a_bad_component_in_the_file_names_its_table() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[families.notes]\ncomponent = \"../t.wasm\"\n").unwrap();
        let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
        assert!(
            e.starts_with("[families.notes] component: \"../t.wasm\" must be a file name")
                && e.contains("(`families` in the config file"),
            "{e}"
        );
        std::fs::write(&file, "[plugins]\nfees = \"/abs.wasm\"\n").unwrap();
        let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
        assert!(
            e.starts_with("plugins.fees: the component of family fees")
                && e.contains("(`plugins` in the config file"),
            "{e}"
        );
    }

    #[test]
    fn plugin_settings_are_plain_values_and_cash_has_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let load = |text: &str| {
            std::fs::write(&file, text).unwrap();
            Config::load(Some(&file), &[], &[]).map_err(|e| format!("{e:#}"))
        };
        let c = load(
            "[settings.mcp]\nallowed_origins = [\"https://a\", \"https://b\"]\nunsigned_macros = 7\n\
             [settings.fees]\npost = 0.5\n[settings.fee]\npost = \"1\"\n",
        )
        .unwrap();
        let mcp = c.family_settings("mcp");
        assert_eq!(mcp["allowed_origins"], "https://a,https://b");
        assert_eq!(mcp["unsigned_macros"], "7");
        assert_eq!(c.family_settings("fees")["post"], "0.5");
        let unused = c.settings_for_no_family(&[]);
        assert_eq!(unused.len(), 1, "{unused:?}");
        assert!(
            unused[0].starts_with("[settings.fee] is for no family"),
            "{unused:?}"
        );
        // A family mounted at start (an upload kept, the families
        // directory) is one.
        assert!(c.settings_for_no_family(&["fee".into()]).is_empty());
        // What a component could not read as a text is refused at start,
        // naming the file.
        for (text, named) in [
            (
                "[settings.mcp]\nx = { a = 1 }\n",
                "[settings.mcp] x: a setting is",
            ),
            (
                "[settings.mcp]\nx = [[1]]\n",
                "[settings.mcp] x: a setting is",
            ),
            (
                "[settings.cash]\nterm = \"t\"\n",
                "[settings.cash] term: unknown setting",
            ),
        ] {
            let e = load(text).unwrap_err();
            assert!(e.contains(named), "{text}: {e}");
            assert!(e.contains("in the config file"), "{text}: {e}");
        }
        assert!(load("[settings.cash]\nterms = \"t\"\n").is_ok());
        // A misspelt field of a family's table names the file too.
        let e = load("[families.timeline]\ngrant = [\"payments\"]\n").unwrap_err();
        assert!(e.contains("unknown field `grant`"), "{e}");
        assert!(e.contains("(`families` in the config file"), "{e}");
    }

    #[test]
    fn bad_values_are_refused() {
        assert!(Config::load(None, &[], &s(&[("admin_listen", "0.0.0.0:9")])).is_err());
        assert!(Config::load(None, &[], &s(&[("nonsense", "1")])).is_err());
        let e = Config::load(None, &s(&[("MARKETPLACE_PLUGIN_NOPE", "x.wasm")]), &[]).unwrap_err();
        let e = format!("{e:#}");
        assert!(
            e.contains("MARKETPLACE_PLUGIN_NOPE") && e.contains("timeline"),
            "{e}"
        );
        // A setting whose name starts like a family's component.
        let c = Config::load(
            None,
            &s(&[
                ("MARKETPLACE_PLUGIN_MEMORY_MIB", "16"),
                ("MARKETPLACE_PLUGIN_MEMORY_TOTAL_MIB", "32"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!((c.plugin_memory_mib, c.plugin_memory_total_mib), (16, 32));
        let err =
            |env: &[(&str, &str)]| format!("{:#}", Config::load(None, &s(env), &[]).unwrap_err());
        assert!(err(&[("MARKETPLACE_MAX_BODY_BYTES", "0")]).contains("max_body_bytes"));
        // Room for one body of the largest size, or none could be received.
        assert!(err(&[("MARKETPLACE_MAX_PENDING_BODY_BYTES", "1")]).contains("33554432.."));
        // It holds at least two bodies of the largest size a route takes.
        let c = |env: &[(&str, &str)]| Config::load(None, &s(env), &[]).unwrap();
        assert_eq!(c(&[]).pending_body_budget(), 256 << 20);
        let big = c(&[("MARKETPLACE_MAX_BODY_BYTES", "268435456")]);
        assert_eq!(big.pending_body_budget(), 512 << 20);
        assert!(err(&[("MARKETPLACE_ADMIN_TOKEN", "short")]).contains("admin_token"));
        // A reservation holds the memory cap.
        assert!(
            err(&[("MARKETPLACE_MEMORY_RESERVATION_MIB", "32")])
                .contains("memory_reservation_mib must be at least plugin_memory_mib (64)")
        );
        assert_eq!(
            c(&[("MARKETPLACE_MEMORY_RESERVATION_MIB", "64")]).memory_reservation_mib,
            Some(64)
        );
        assert_eq!(c(&[]).memory_reservation_mib, None);
        assert!(err(&[("MARKETPLACE_PLUGIN_FEES", "../x.wasm")]).contains("fees"));
        assert!(err(&[("MARKETPLACE_PLUGIN_FEES", "/etc/x.wasm")]).contains("fees"));
        assert!(err(&[("MARKETPLACE_LOG_FORMAT", "xml")]).contains("log_format"));
        assert!(err(&[("MARKETPLACE_LOG", "info,=[")]).contains("log \"info,=[\""));
        assert!(
            Config::load(
                None,
                &s(&[("MARKETPLACE_LOG", "warn,marketplace=debug")]),
                &[]
            )
            .is_ok()
        );
        assert!(err(&[("MARKETPLACE_MAX_CONNECTIONS", "many")]).contains("max_connections"));
        for bad in [
            "ftp://x",
            "https://mint.example",
            "http://",
            "not a url",
            "http://h/?q=1",
            "http://user:pw@127.0.0.1:9",
        ] {
            assert!(
                err(&[("MARKETPLACE_CASH_UPSTREAM", bad)]).contains("cash_upstream"),
                "{bad}"
            );
        }
        assert!(
            err(&[("MARKETPLACE_CASH_UPSTREAM_TIMEOUT_MS", "0")])
                .contains("cash_upstream_timeout_ms")
        );
        let c = Config::load(
            None,
            &s(&[("MARKETPLACE_CASH_UPSTREAM", "http://127.0.0.1:9/")]),
            &[],
        )
        .unwrap();
        assert_eq!(c.cash_upstream.as_deref(), Some("http://127.0.0.1:9/"));
        assert_eq!(c.cash_upstream_timeout_ms, 5000);
    }

    #[test]
    fn tokens_are_strings_and_json_logs_are_a_switch() {
        let digits = "1".repeat(40);
        let c = Config::load(
            None,
            &s(&[
                ("MARKETPLACE_ADMIN_TOKEN", &digits),
                ("MARKETPLACE_LOG_JSON", "1"),
            ]),
            &[],
        )
        .unwrap();
        assert_eq!(c.admin_token.as_deref(), Some(digits.as_str()));
        assert_eq!(c.log_format, LogFormat::Json);
        let c = Config::load(None, &[], &s(&[("plugins_dir", "123")])).unwrap();
        assert_eq!(c.plugins_dir, PathBuf::from("123"));
        confined("families/notes.wasm").unwrap();
    }

    #[test]
    fn switches_read_as_environments_spell_them_and_nothing_else() {
        let load = |env: &[(&str, &str)]| Config::load(None, &s(env), &[]);
        for (on, off) in [("1", "0"), ("TRUE", "False"), ("yes", "no"), ("On", "off")] {
            let c = load(&[
                ("MARKETPLACE_WATCH_PLUGINS", off),
                ("MARKETPLACE_TESTING_ROUTES", on),
                ("MARKETPLACE_LOG_JSON", on),
            ])
            .unwrap();
            assert!(!c.watch_plugins && c.testing_routes, "{on} {off}");
            assert_eq!(c.log_format, LogFormat::Json, "{on}");
            let c = load(&[("MARKETPLACE_LOG_JSON", off)]).unwrap();
            assert_eq!(c.log_format, LogFormat::Text, "{off}");
        }
        // A flag as the CLI passes it.
        let c = Config::load(None, &[], &s(&[("testing-routes", "true")])).unwrap();
        assert!(c.testing_routes);
        for name in ["MARKETPLACE_GROUP_COMMIT", "MARKETPLACE_LOG_JSON"] {
            let e = format!("{:#}", load(&[(name, "enabled")]).unwrap_err());
            assert!(e.contains(name) && e.contains("true or false"), "{e}");
        }
        // An empty switch is unset.
        let c = load(&[
            ("MARKETPLACE_LOG_JSON", ""),
            ("MARKETPLACE_GROUP_COMMIT", " "),
        ])
        .unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        assert!(c.group_commit);
        // Off in the environment wins over a file's json.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "log_format = \"json\"\n").unwrap();
        let c = Config::load(Some(&file), &s(&[("MARKETPLACE_LOG_JSON", "0")]), &[]).unwrap();
        assert_eq!(c.log_format, LogFormat::Text);
        // An empty path is refused, not taken as the working directory.
        for name in ["DATA_DIR", "PLUGINS_DIR", "CACHE_DIR"] {
            let e = format!(
                "{:#}",
                load(&[(&format!("MARKETPLACE_{name}"), "")]).unwrap_err()
            );
            let said = format!("{} must not be empty", name.to_ascii_lowercase());
            assert!(e.contains(&said), "{e}");
        }
    }

    #[test]
    fn families_mount_and_grant() {
        use crate::capabilities::Capability;
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "[families.notes]\ncomponent = \"notes.wasm\"\ngrants = [\"payments\"]\nread = [\"timeline\"]\n[families.search]\ngrants = []\n[families.timeline]\nread = []\n",
        )
        .unwrap();
        let c = Config::load(Some(&file), &[], &[]).unwrap();
        let notes = c.family("notes").unwrap();
        assert_eq!(notes.component, "notes.wasm");
        assert!(notes.grants.has(Capability::Payments));
        assert!(notes.grants.reads.contains("timeline"));
        // A built-in family named with grants takes exactly those, and
        // keeps its reads; named with reads, it keeps its capabilities.
        let search = c.family("search").unwrap();
        assert_eq!(search.component, "search.wasm");
        assert!(search.grants.capabilities.is_empty());
        assert_eq!(
            search.grants.reads,
            crate::capabilities::builtin("search").reads
        );
        let timeline = c.family("timeline").unwrap();
        assert!(timeline.grants.reads.is_empty());
        assert_eq!(
            timeline.grants.capabilities,
            crate::capabilities::builtin("timeline").capabilities
        );
        std::fs::write(&file, "[families.x]\ngrants = [\"payments\"]\n").unwrap();
        let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
        assert!(e.contains(r#"component = "x.wasm""#), "{e}");
        for bad in [
            "[families.x]\ngrants = [\"payments\"]\n",
            "[families.x]\ncomponent = \"x.wasm\"\ngrants = [\"money\"]\n",
            "[families.Bad]\ncomponent = \"x.wasm\"\n",
        ] {
            std::fs::write(&file, bad).unwrap();
            assert!(Config::load(Some(&file), &[], &[]).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_environment_variable_names_a_family_with_a_dash() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        let env = s(&[("MARKETPLACE_PLUGIN_MY_FAM", "v2.wasm")]);
        std::fs::write(&file, "[families.my-fam]\ncomponent = \"v1.wasm\"\n").unwrap();
        let c = Config::load(Some(&file), &env, &[]).unwrap();
        assert_eq!(c.family("my-fam").unwrap().component, "v2.wasm");
        // A family spelled with `_` is named as it is, beside one with `-`.
        std::fs::write(
            &file,
            "[families.my-fam]\ncomponent = \"v1.wasm\"\n[families.my_fam]\ncomponent = \"u1.wasm\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&file), &env, &[]).unwrap();
        assert_eq!(c.family("my-fam").unwrap().component, "v1.wasm");
        assert_eq!(c.family("my_fam").unwrap().component, "v2.wasm");
        // An unknown family is named as a shell would spell its variable.
        std::fs::write(&file, "[plugins]\nno-such = \"x.wasm\"\n").unwrap();
        let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
        assert!(e.contains("MARKETPLACE_PLUGIN_NO_SUCH"), "{e}");
    }

    #[test]
    fn trusted_proxies_are_a_list_or_a_comma_separated_string() {
        let ip = |a: &str| a.parse::<std::net::IpAddr>().unwrap();
        let c = Config::load(
            None,
            &s(&[(
                "MARKETPLACE_TRUSTED_PROXIES",
                "127.0.0.1, 10.0.0.0/8,2001:db8::/32",
            )]),
            &[],
        )
        .unwrap();
        for inside in ["127.0.0.1", "10.200.0.9", "::ffff:10.1.1.1", "2001:db8::5"] {
            assert!(c.trusted_proxies.contains(ip(inside)), "{inside}");
        }
        for outside in ["127.0.0.2", "11.0.0.1", "2001:db9::5", "::1"] {
            assert!(!c.trusted_proxies.contains(ip(outside)), "{outside}");
        }
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "trusted_proxies = [\"::1\", \"192.0.2.0/24\"]\n").unwrap();
        let c = Config::load(Some(&file), &[], &[]).unwrap();
        assert!(
            c.trusted_proxies.contains(ip("::1")) && c.trusted_proxies.contains(ip("192.0.2.9"))
        );
        // IPv4 networks written as IPv6 match IPv4 peers.
        std::fs::write(&file, "trusted_proxies = \"::ffff:10.0.0.0/104\"\n").unwrap();
        let c = Config::load(Some(&file), &[], &[]).unwrap();
        assert!(c.trusted_proxies.contains(ip("10.3.2.1")));
        assert!(c.trusted_proxies.contains(ip("::ffff:10.3.2.1")));
        assert!(!c.trusted_proxies.contains(ip("11.3.2.1")));
        std::fs::write(&file, "trusted_proxies = 7\n").unwrap();
        let e = format!("{:#}", Config::load(Some(&file), &[], &[]).unwrap_err());
        assert!(e.contains("trusted_proxies must be a string"), "{e}");
        // Unset or empty: none.
        assert!(
            Config::load(None, &[], &[])
                .unwrap()
                .trusted_proxies
                .is_empty()
        );
        let c = Config::load(None, &s(&[("MARKETPLACE_TRUSTED_PROXIES", "")]), &[]).unwrap();
        assert!(c.trusted_proxies.is_empty());
        for bad in ["10.0.0.0/33", "proxy.example", "10.0.0.1,,10.0.0.2", "*"] {
            let e = format!(
                "{:#}",
                Config::load(None, &s(&[("MARKETPLACE_TRUSTED_PROXIES", bad)]), &[]).unwrap_err()
            );
            assert!(e.contains("trusted_proxies"), "{bad}: {e}");
        }
    }

    #[test]
    fn public_url_is_an_origin_and_the_mcp_familys_default() {
        let load = |url: &str| Config::load(None, &s(&[("MARKETPLACE_PUBLIC_URL", url)]), &[]);
        let c = load("HTTPS://Market.Example:8443/").unwrap();
        let public = c.public_url.clone().unwrap();
        assert_eq!(public.to_string(), "https://market.example:8443");
        assert_eq!(
            c.settings["mcp"]["public_url"].as_str(),
            Some("https://market.example:8443")
        );
        let mut headers = vec![
            ("Host".to_string(), "internal:8080".to_string()),
            ("x-forwarded-proto".to_string(), "http".to_string()),
            ("accept".to_string(), "*/*".to_string()),
        ];
        public.apply(&mut headers);
        assert_eq!(
            headers,
            [
                ("accept".to_string(), "*/*".to_string()),
                ("host".to_string(), "market.example:8443".to_string()),
                ("x-forwarded-proto".to_string(), "https".to_string()),
            ]
        );
        // As browsers write an origin: the default port left out.
        let origin = |url: &str| load(url).unwrap().public_url.unwrap().to_string();
        assert_eq!(
            origin("https://Market.Example:443/"),
            "https://market.example"
        );
        assert_eq!(origin("http://a.example:080"), "http://a.example");
        assert_eq!(origin("http://[::1]:8080"), "http://[::1]:8080");
        for bad in [
            "ftp://x",
            "https://",
            "https://a.example/market",
            "https://a.example?x=1",
            "market.example",
            "https://a.example:",
            "https://user@a.example",
        ] {
            let e = format!("{:#}", load(bad).unwrap_err());
            assert!(e.contains("public_url"), "{bad}: {e}");
        }
        // The mcp family's own setting wins.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(
            &file,
            "public_url = \"https://a.example\"\n[settings.mcp]\npublic_url = \"https://b.example\"\n",
        )
        .unwrap();
        let c = Config::load(Some(&file), &[], &[]).unwrap();
        assert_eq!(
            c.settings["mcp"]["public_url"].as_str(),
            Some("https://b.example")
        );
    }
}
