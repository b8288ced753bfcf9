//! The rules a start refuses a configuration by: each setting's range and
//! form, and those that read several settings together.

use super::*;

/// Whether listeners on `a` and `b` would take the same socket: one port
/// (not 0, which picks a free one) and one address, or an unspecified one
/// covering the other (`[::]` takes IPv4 too, as Linux binds it by
/// default; `0.0.0.0` every IPv4 address, mapped ones included).
pub(super) fn same_socket(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() == 0 || a.port() != b.port() {
        return false;
    }
    let (x, y) = (a.ip().to_canonical(), b.ip().to_canonical());
    let covers = |u: std::net::IpAddr, other: std::net::IpAddr| {
        u.is_unspecified() && (u.is_ipv6() || other.is_ipv4())
    };
    x == y || covers(x, y) || covers(y, x)
}

/// A URL as an error may show it: quoted, with what stands before an `@`
/// (a user and password) left out.
pub(super) fn without_credentials(url: &str) -> String {
    // A query may carry one too (`?password=...`).
    let url = match url.split_once('?') {
        Some((base, _)) => format!("{base}?(parameters left out)"),
        None => url.to_string(),
    };
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
pub(super) fn log_filter(filter: &str) -> std::result::Result<(), String> {
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

impl Config {
    /// The numeric settings a start accepts within a range: (name, value,
    /// least, most). README's Configuration lists them (a unit test holds
    /// the two together).
    pub(super) fn ranges(&self) -> [(&'static str, u64, u64, u64); 24] {
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
            ("store_cache_mib", self.store_cache_mib, 1, 1 << 20),
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
    pub(super) fn validate_together(&self) -> Result<()> {
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

    /// For `serve`: every configured family's component comes from
    /// `plugins_dir` (or is named relative to it), so without it the host
    /// would answer health and serve no route at all. Refused as a setting
    /// is, naming where it was set (or that it is the default).
    pub fn check_plugins_dir(&self) -> Result<()> {
        let what = match std::fs::metadata(&self.plugins_dir) {
            Ok(meta) if meta.is_dir() => return Ok(()),
            Ok(_) => "is not a directory".to_string(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => "does not exist".to_string(),
            Err(e) => format!("cannot be read ({e})"),
        };
        let from = match &self.plugins_dir_source {
            Some(source) => format!("`plugins_dir` {source}"),
            // (Built ones, target/plugins holding info.wasm beside the
            // binary's target dir or in the working directory, come first.)
            None => "the default when no built components are found: ./plugins".to_string(),
        };
        bail!(
            "plugins_dir {} {what} ({from}): name the built components with --plugins DIR, MARKETPLACE_PLUGINS_DIR or `plugins_dir` in the config file (`cargo xtask build-plugins` puts them in target/plugins)",
            self.plugins_dir.display()
        )
    }

    pub(super) fn validate(&self) -> Result<()> {
        // An empty path would be the working directory, never meant.
        for (name, path) in [
            ("data_dir", Some(&self.data_dir)),
            ("plugins_dir", Some(&self.plugins_dir)),
            ("cache_dir", self.cache_dir.as_ref()),
        ] {
            if path.is_some_and(|p| p.as_os_str().is_empty()) {
                bail!("{name} must not be empty (leave it unset for the default)");
            }
            // (A plugins_dir that is no directory is refused by `serve`
            // alone, `Config::check_plugins_dir`: the offline commands do
            // not read it.)
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
        // Read as a connection will read it, so that a malformed one is
        // said here, naming the setting, rather than at the first connect.
        if self.shared_store()
            && let Err(e) = self.store.parse::<tokio_postgres::Config>()
        {
            bail!(
                "store {} is not a PostgreSQL URL a connection can use ({e}): postgres://user[:password]@host[:port]/database",
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
}

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
