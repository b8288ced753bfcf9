//! The `marketplace` command line (clap): `serve`, and the operator
//! commands `cash mint`, `plugins list|load|unmount`, `backup`, `restore`.

use crate::config::{Config, LogFormat};
use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// The marketplace service host.
///
/// Every setting can also come from a TOML file (--config or
/// MARKETPLACE_CONFIG) and from MARKETPLACE_<SETTING> environment variables;
/// flags win over the environment, which wins over the file. See README.md
/// for all settings.
#[derive(Parser, Debug)]
#[command(name = "marketplace", version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve the HTTP API (and the admin and metrics listeners when set).
    Serve {
        #[command(flatten)]
        settings: Settings,
    },
    /// Cash operations.
    Cash {
        #[command(subcommand)]
        command: CashCommand,
    },
    /// Plugin families of a running server (through its admin listener).
    Plugins {
        #[command(subcommand)]
        command: PluginsCommand,
        #[command(flatten)]
        client: Client,
        /// Where the admin token comes from when no --token is given.
        #[command(flatten)]
        settings: StoreSettings,
    },
    /// Write one consistent snapshot of the database plus the server and
    /// arbiter keys into FILE (0600). Online through the admin listener
    /// (--admin), or offline on the data dir (server stopped).
    Backup {
        /// Where to write the backup (replaced atomically).
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
        #[command(flatten)]
        client: Client,
        #[command(flatten)]
        settings: StoreSettings,
    },
    /// Restore a backup into a new (missing or empty) data dir.
    Restore {
        /// A file written by `marketplace backup`.
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// The data dir to create.
        #[arg(long, value_name = "DIR")]
        data_dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum CashCommand {
    /// Mint a new secret worth AMOUNT. Without --admin it opens the data dir
    /// directly (the server must be stopped).
    Mint {
        /// Decimal amount, e.g. 1.5
        amount: String,
        /// Makes the mint repeatable: the same key and amount give the same
        /// secret and mint nothing more (a retry after a lost answer).
        /// 1 to 128 of A-Z a-z 0-9 _ - . :
        #[arg(long, value_name = "KEY")]
        idempotency_key: Option<String>,
        #[command(flatten)]
        client: Client,
        #[command(flatten)]
        settings: StoreSettings,
    },
}

#[derive(Subcommand, Debug)]
enum PluginsCommand {
    /// List families, their components, grants and routes.
    List,
    /// Swap in (or mount) a component for FAMILY.
    Load {
        family: String,
        /// The component (.wasm).
        file: PathBuf,
        /// Capabilities to grant, comma separated (replaces the family's).
        #[arg(long, value_name = "CAP,..")]
        grants: Option<String>,
        /// Other families' keyspaces it may read, comma separated.
        #[arg(long, value_name = "FAMILY,..")]
        read: Option<String>,
    },
    /// Unmount FAMILY: its routes answer 404; its data stays.
    Unmount { family: String },
}

/// Settings flags (each also a config file key and a MARKETPLACE_ variable).
#[derive(Args, Debug, Default, Clone)]
struct Settings {
    /// TOML configuration file.
    #[arg(long, value_name = "FILE", env = "MARKETPLACE_CONFIG")]
    config: Option<PathBuf>,
    /// Public HTTP listener, e.g. 127.0.0.1:8080 [default:
    /// MARKETPLACE_LISTEN, else the config's `listen`, else 127.0.0.1:8080]
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// Data directory (database, keys, admin token, compile cache)
    /// [default: MARKETPLACE_DATA_DIR, else the config's `data_dir`, else
    /// ./data]
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Directory of the plugin components [default: MARKETPLACE_PLUGINS_DIR,
    /// else the config's `plugins_dir`, else <target>/plugins beside a
    /// <target>/<profile>/marketplace binary when it holds info.wasm, else
    /// ./target/plugins when that does, else ./plugins]
    #[arg(long = "plugins", value_name = "DIR")]
    plugins_dir: Option<PathBuf>,
    /// Admin listener (loopback), e.g. 127.0.0.1:9090
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<String>,
    /// Prometheus metrics listener, e.g. 127.0.0.1:9100
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    /// Log format: text or json.
    #[arg(long, value_name = "FORMAT")]
    log_format: Option<String>,
    /// Mount the test-only routes and plugin.
    #[arg(long)]
    testing_routes: bool,
}

/// The settings of the commands that open the data dir, or read the
/// server's configuration for its admin token: the serve-only flags
/// (listeners, plugins, logs) mean nothing to them.
#[derive(Args, Debug, Default, Clone)]
struct StoreSettings {
    /// TOML configuration file (the server's: its data_dir, store,
    /// server_key and admin_token).
    #[arg(long, value_name = "FILE", env = "MARKETPLACE_CONFIG", global = true)]
    config: Option<PathBuf>,
    /// Data directory (its database; its admin.token when no --token).
    #[arg(long, value_name = "DIR", global = true)]
    data_dir: Option<PathBuf>,
}

impl StoreSettings {
    fn settings(&self) -> Settings {
        Settings {
            config: self.config.clone(),
            data_dir: self.data_dir.clone(),
            ..Settings::default()
        }
    }
}

/// Client options of the commands that talk to a running server.
#[derive(Args, Debug, Clone)]
struct Client {
    /// The admin listener's URL, e.g. http://127.0.0.1:9090
    #[arg(long, value_name = "URL", global = true)]
    admin: Option<String>,
    /// Admin token (default: MARKETPLACE_ADMIN_TOKEN, else the config's
    /// admin_token, else <data-dir>/admin.token).
    #[arg(
        long,
        value_name = "TOKEN",
        env = "MARKETPLACE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
}

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is::<Logged>() => ExitCode::FAILURE,
        Err(e) => {
            complain(format_args!("error: {e:#}"));
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    if !matches!(cli.command, Command::Serve { .. }) {
        // The offline commands open the data dir as `serve` does: what
        // that finds for the operator (a damaged write-ahead log) is said
        // on stderr, not dropped.
        let _ = tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .with_max_level(tracing::Level::WARN)
            .try_init();
    }
    match cli.command {
        Command::Serve { settings } => {
            // A log pipeline that reads only JSON lines reads why this
            // start stops too: in the loaded configuration's format, or
            // (when it did not load) the format its settings ask for.
            let (json, loaded) = match load_config(&settings) {
                Ok(config) => (
                    config.log_format == LogFormat::Json,
                    config.check_plugins_dir().map(|()| config),
                ),
                Err(e) => (asked_for_json(&settings), Err(e)),
            };
            match loaded {
                Ok(config) => serve(config),
                Err(e) if json => {
                    crate::logging::exiting_before_init(&e);
                    Err(anyhow::Error::new(Logged))
                }
                Err(e) => Err(e),
            }
        }
        Command::Cash {
            command:
                CashCommand::Mint {
                    amount,
                    idempotency_key,
                    client,
                    settings,
                },
        } => cash_mint(
            &amount,
            idempotency_key.as_deref(),
            &client,
            &settings.settings(),
        ),
        Command::Plugins {
            command,
            client,
            settings,
        } => plugins(command, &client, &settings.settings()),
        Command::Backup {
            to,
            client,
            settings,
        } => backup(&to, &client, &settings.settings()),
        Command::Restore { file, data_dir } => {
            crate::backup::restore(&file, &data_dir)?;
            say(&format!("restored into {}", data_dir.display()))
        }
    }
}

/// Print a line on stderr, if it can be written: a stderr that is full or
/// closed does not turn a refusal or a warning into a panic (`eprintln!`).
fn complain(line: std::fmt::Arguments) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// Print a line on stdout. A reader that went away (`| head`) ends the
/// output quietly, as it does for other tools, instead of a panic.
fn say(line: &str) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{line}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other.context("writing to stdout")?),
    }
}

impl Settings {
    /// The flags given, as (setting, value) overrides.
    fn overrides(&self) -> Vec<(String, String)> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        [
            ("listen", self.listen.clone()),
            ("data_dir", path(&self.data_dir)),
            ("plugins_dir", path(&self.plugins_dir)),
            ("admin_listen", self.admin_listen.clone()),
            ("metrics_listen", self.metrics_listen.clone()),
            ("log_format", self.log_format.clone()),
            (
                "testing_routes",
                self.testing_routes.then(|| "true".to_string()),
            ),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
        .collect()
    }
}

fn load_config(settings: &Settings) -> Result<Config> {
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MARKETPLACE_"))
        .collect();
    Config::load(settings.config.as_deref(), &env, &settings.overrides())
}

/// Whether the operator asked for a JSON log, read as the configuration
/// reads it (the flag, then the environment, then the file), for a start
/// whose configuration is refused: its reason is then a JSON line too.
/// Best effort: what cannot be read is text.
fn asked_for_json(settings: &Settings) -> bool {
    let set = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    if let Some(format) = &settings.log_format {
        return format == "json";
    }
    if let Some(format) = set("MARKETPLACE_LOG_FORMAT") {
        return format.trim() == "json";
    }
    if let Some(on) = set("MARKETPLACE_LOG_JSON") {
        return crate::config::boolean("MARKETPLACE_LOG_JSON", &on).unwrap_or(false);
    }
    settings
        .config
        .as_ref()
        .and_then(|path| std::fs::read_to_string(path).ok())
        .and_then(|text| text.parse::<toml::Table>().ok())
        .is_some_and(|table| table.get("log_format").and_then(|v| v.as_str()) == Some("json"))
}

fn serve(config: Config) -> Result<()> {
    crate::logging::init(&config);
    // Why the server stops, in the log's own format (a JSON log's
    // pipeline reads only JSON lines), and said once.
    serve_logged(config).map_err(|e| {
        if !tracing::enabled!(tracing::Level::ERROR) {
            return e;
        }
        tracing::error!("exiting: {e:#}");
        crate::logging::flush_all();
        anyhow::Error::new(Logged)
    })
}

/// An error already written to the log ([`serve`]): not said again.
#[derive(Debug)]
struct Logged;

impl std::fmt::Display for Logged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("(said in the log)")
    }
}

impl std::error::Error for Logged {}

/// [`serve`] once the log is set up.
fn serve_logged(config: Config) -> Result<()> {
    if !config.heap_huge_pages {
        match crate::heap::use_small_pages() {
            Ok(arena) => tracing::info!(
                arena_mib = arena.bytes >> 20,
                at = format_args!("{:#x}", arena.start),
                "heap: small pages (heap_huge_pages = false)"
            ),
            Err(errno) => tracing::warn!(
                "heap: no arena of small pages could be reserved (errno {errno}); the heap may use huge pages"
            ),
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A busy worker gathers its log lines and writes them when idle.
        .on_thread_unpark(crate::logging::gather)
        .on_thread_park(crate::logging::flush)
        .on_thread_stop(crate::logging::flush)
        .max_blocking_threads(config.max_instances as usize + 16)
        .build()?;
    let code = rt.block_on(crate::server::run(config));
    // Blocking tasks still running after the drain timeout are abandoned:
    // their requests were not answered (the drain cut them, each with its
    // line; a write already under way may still commit). A request task
    // the cut could not drop in time (a machine too loaded to run its
    // worker) is dropped here, within a second, which an exit waits only
    // while a blocking task still runs.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    crate::logging::flush_all();
    let code = code?;
    if code != 0 {
        std::process::exit(code);
    }
    Ok(())
}

/// The admin token to present: --token / MARKETPLACE_ADMIN_TOKEN, else
/// the configuration's `admin_token` (the server's, when the CLI reads the
/// same config), else the data dir's `admin.token`.
fn admin_token(client: &Client, settings: &Settings) -> Result<String> {
    if let Some(t) = &client.token {
        return Ok(t.clone());
    }
    let config = load_config(settings)?;
    if let Some(t) = &config.admin_token {
        return Ok(t.clone());
    }
    let path = config.data_dir.join("admin.token");
    Ok(std::fs::read_to_string(&path)
        .with_context(|| {
            format!(
                "no admin token: {} is unreadable; give the server's --data-dir (its token is generated there), its --config (admin_token), or --token / MARKETPLACE_ADMIN_TOKEN",
                path.display()
            )
        })?
        .trim()
        .to_string())
}

fn cash_mint(amount: &str, key: Option<&str>, client: &Client, settings: &Settings) -> Result<()> {
    let units =
        marketplace_common::amount::parse(amount).map_err(|e| anyhow::anyhow!("amount {e}"))?;
    anyhow::ensure!(units > 0, "amount must be positive");
    if let Some(problem) = key.and_then(crate::money::ledger::mint_key_problem) {
        anyhow::bail!("--idempotency-key {problem}");
    }
    if let Some(url) = &client.admin {
        let token = admin_token(client, settings)?;
        let body = serde_json::json!({"amount": amount, "idempotency_key": key}).to_string();
        let (status, text) = admin_request(url, "POST", "/admin/cash/mint", &token, body.into())?;
        if status != 200 {
            return Err(admin_refused(url, status, &text));
        }
        let v: serde_json::Value = serde_json::from_str(&text)?;
        return say(v["secret"].as_str().unwrap_or_default());
    }
    let config = load_config(settings)?;
    anyhow::ensure!(
        !config.shared_store(),
        "with a shared store, mint through a running host: --admin URL"
    );
    crate::state::refuse_fleet_dir(&config)?;
    // Minting into a fresh data dir (before the first start) is fine when
    // it is named; the default `./data` holding no database is more likely
    // a forgotten --data-dir, and the secret would be worth nothing there.
    let named = settings.data_dir.is_some() || config.data_dir != Config::default().data_dir;
    anyhow::ensure!(
        named || config.db_path().is_file(),
        "no database at {}: name the server's data dir (--data-dir DIR), or mint through a running server (--admin URL)",
        config.db_path().display()
    );
    let storage = crate::state::open_embedded(&config)
        .context("opening the database (is the server running? then use --admin URL)")?;
    let ledger = crate::state::offline_ledger(&config, &storage)?;
    let txn = storage.begin_write().map_err(|e| anyhow::anyhow!("{e}"))?;
    let (secret, _) = ledger.mint_with_key(&txn, units, key)?;
    storage.commit(txn).map_err(|e| anyhow::anyhow!("{e}"))?;
    say(&secret)
}

fn plugins(command: PluginsCommand, client: &Client, settings: &Settings) -> Result<()> {
    let url = client
        .admin
        .as_deref()
        .context("plugins commands talk to a running server: pass --admin URL")?;
    if let PluginsCommand::Load { family, .. } | PluginsCommand::Unmount { family } = &command {
        // Said here, naming the argument: sent as is, a name with a space
        // would not even make a URL.
        anyhow::ensure!(
            crate::capabilities::valid_family(family),
            "FAMILY {family:?} is not a family name ({})",
            crate::capabilities::FAMILY_NAME_RULE
        );
    }
    let token = admin_token(client, settings)?;
    let (status, text) = match command {
        PluginsCommand::List => admin_request(url, "GET", "/admin/plugins", &token, Vec::new())?,
        PluginsCommand::Load {
            family,
            file,
            grants,
            read,
        } => {
            let bytes =
                std::fs::read(&file).with_context(|| format!("reading {}", file.display()))?;
            // The file's name, so that listings say which file serves.
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .map(|n| n.to_string());
            let query: Vec<String> = [("grants", grants), ("read", read), ("component", name)]
                .into_iter()
                .filter_map(|(k, v)| {
                    v.map(|v| {
                        format!(
                            "{k}={}",
                            form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                        )
                    })
                })
                .collect();
            let mut path = format!("/admin/plugins/{family}");
            if !query.is_empty() {
                path = format!("{path}?{}", query.join("&"));
            }
            admin_request(url, "PUT", &path, &token, bytes)?
        }
        PluginsCommand::Unmount { family } => admin_request(
            url,
            "DELETE",
            &format!("/admin/plugins/{family}"),
            &token,
            Vec::new(),
        )?,
    };
    // A refusal's reason goes with the error (stderr), as `cash mint`'s
    // does: a script that keeps only stderr for errors still reads it.
    if status != 200 {
        return Err(admin_refused(url, status, &text));
    }
    let doc = serde_json::from_str::<serde_json::Value>(&text).unwrap_or_default();
    // A swap that turned routes into 404s is said on stderr too.
    if let Some(dropped) = doc["dropped_routes"].as_array()
        && !dropped.is_empty()
    {
        let routes: Vec<&str> = dropped.iter().filter_map(|r| r.as_str()).collect();
        complain(format_args!(
            "warning: family {} no longer serves {} (they answer 404 now)",
            doc["family"].as_str().unwrap_or_default(),
            routes.join(", ")
        ));
    }
    // So is a watched file that was refused (`plugins list`).
    for refused in doc
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| &p["refused"])
        .filter(|r| r.is_object())
    {
        // (A file name or a component's panic may hold any character.)
        let field = |name: &str| {
            crate::logging::one_line(refused[name].as_str().unwrap_or_default(), 2000).into_owned()
        };
        complain(format_args!(
            "warning: {} was not loaded ({}): {}",
            field("file"),
            field("at"),
            field("error")
        ));
    }
    // And a component whose calls have failed since the last it answered.
    for plugin in doc.as_array().into_iter().flatten() {
        let failed = plugin["consecutive_faults"].as_u64().unwrap_or(0);
        if failed == 0 {
            continue;
        }
        let last = &plugin["last_fault"];
        let field = |name: &str| {
            crate::logging::one_line(last[name].as_str().unwrap_or_default(), 2000).into_owned()
        };
        complain(format_args!(
            "warning: family {}: {failed} call{} in a row failed since it last answered one, the last at {}: {}",
            crate::logging::one_line(plugin["family"].as_str().unwrap_or_default(), 200),
            if failed == 1 { "" } else { "s" },
            field("at"),
            field("why")
        ));
    }
    say(text.trim_end())
}

fn backup(to: &std::path::Path, client: &Client, settings: &Settings) -> Result<()> {
    // Checked before the server is asked for the snapshot. (Online, the
    // data dir known here is this configuration's, not necessarily the
    // server's: the check that an existing file is a backup covers both.)
    let data_dir = load_config(settings).ok().map(|c| c.data_dir);
    crate::backup::check_destination(to, data_dir.as_deref())?;
    let written = match &client.admin {
        Some(url) => {
            let token = admin_token(client, settings)?;
            crate::backup::write_atomically(to, |file| {
                let mut resp = admin_call(url, "GET", "/admin/backup", &token, Vec::new())?;
                let status = resp.status().as_u16();
                if status != 200 {
                    let text = resp.body_mut().read_to_string().unwrap_or_default();
                    return Err(admin_refused(url, status, &text));
                }
                let mut reader = resp.into_body().into_reader();
                Ok(std::io::copy(&mut reader, file)?)
            })?
        }
        None => {
            let config = load_config(settings)?;
            crate::backup::offline(&config, to)?
        }
    };
    say(&format!(
        "backup written to {} ({written} bytes)",
        to.display()
    ))
}

/// An admin answer other than 200 as the error to report: its status and
/// body, and what to check when it is not the admin listener's refusal.
fn admin_refused(url: &str, status: u16, text: &str) -> anyhow::Error {
    let hint = match status {
        // The public listener's answer to a path it has no route for, or
        // the metrics listener's.
        404 if text.contains("\"no route for ")
            || text.contains(crate::server::admin::METRICS_ONLY) =>
        {
            format!(
                " ({url} is not the admin listener: --admin takes the address of the server's admin_listen)"
            )
        }
        401 | 403 => " (the token is the server's admin_token, else <data_dir>/admin.token: give --token, MARKETPLACE_ADMIN_TOKEN, or the server's --config or --data-dir)".to_string(),
        _ => String::new(),
    };
    anyhow::anyhow!("admin answered {status}: {}{hint}", text.trim_end())
}

/// One request to the admin listener (http://host:port); the raw answer.
fn admin_call(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> Result<ureq::http::Response<ureq::Body>> {
    anyhow::ensure!(
        url.starts_with("http://"),
        "admin URL must start with http://"
    );
    // How long the answer may take to begin, and then any read or write:
    // a backup copies and hashes the database before its first byte, a
    // load compiles the component; every other call answers at once.
    // Without a limit, a listener that accepts and never answers (a server
    // stopped in a debugger, another program on the port) hung the
    // command. And what a call that timed out may have done meanwhile.
    let (wait, maybe_done) = match (method, path) {
        ("GET", "/admin/backup") => (3600, ""),
        ("PUT", _) => (
            600,
            " The component may still have been loaded: see `plugins list`.",
        ),
        ("DELETE", _) => (
            60,
            " The family may still have been unmounted: see `plugins list`.",
        ),
        ("POST", "/admin/cash/mint") => (
            60,
            " The mint may still have been made: with --idempotency-key, the same command again gives its secret (a mint without one cannot be asked for again).",
        ),
        _ => (60, ""),
    };
    let wait = Duration::from_secs(wait);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_connect(Some(Duration::from_secs(10)))
        .timeout_recv_response(Some(wait))
        .timeout_per_read(Some(wait))
        .timeout_per_write(Some(wait))
        .build()
        .into();
    let mut request = ureq::http::Request::builder()
        .method(method)
        .uri(format!("{}{path}", url.trim_end_matches('/')))
        .header("authorization", format!("Bearer {token}"));
    if !body.is_empty() {
        // A refusal (a wrong token) then comes back before the upload is
        // sent, rather than as a broken pipe halfway through it.
        request = request.header("expect", "100-continue");
    }
    let request = request.body(body)?;
    agent.run(request).map_err(|e| match e {
        ureq::Error::Timeout(ureq::Timeout::Connect | ureq::Timeout::Resolve) => anyhow::anyhow!(
            "could not connect to the admin listener at {url} within 10 s (is the address right, and is the server running?)"
        ),
        ureq::Error::Timeout(_) => anyhow::anyhow!(
            "the admin listener at {url} did not answer within {} s (is it this server's admin listener, and is the server running, not stopped?).{maybe_done}",
            wait.as_secs()
        ),
        e => anyhow::Error::new(e).context(format!(
            "asking the admin listener at {url} (is the server running with its admin listener there? \
             It is off unless `admin_listen` is set: --admin-listen, MARKETPLACE_ADMIN_LISTEN or the config file)"
        )),
    })
}

/// One request to the admin listener; (status, body text).
fn admin_request(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: Vec<u8>,
) -> Result<(u16, String)> {
    let mut resp = admin_call(url, method, path, token, body)?;
    let status = resp.status().as_u16();
    let text = resp
        .body_mut()
        .read_to_string()
        .context("reading the admin answer")?;
    Ok((status, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    #[test]
    fn flags_become_settings() {
        let cli = Cli::try_parse_from([
            "marketplace",
            "serve",
            "--listen",
            "127.0.0.1:1",
            "--data-dir",
            "d",
            "--testing-routes",
        ])
        .unwrap();
        let Command::Serve { settings } = cli.command else {
            panic!("serve")
        };
        let o = settings.overrides();
        assert!(o.contains(&("listen".into(), "127.0.0.1:1".into())));
        assert!(o.contains(&("data_dir".into(), "d".into())));
        assert!(o.contains(&("testing_routes".into(), "true".into())));
        assert!(Cli::try_parse_from(["marketplace", "serve", "--nonsense"]).is_err());
        assert!(Cli::try_parse_from(["marketplace", "restore", "f"]).is_err());
        // Client options may come before or after the plugins subcommand.
        for args in [
            &["marketplace", "plugins", "list", "--admin", "http://a"][..],
            &["marketplace", "plugins", "--admin", "http://a", "list"][..],
        ] {
            let Command::Plugins { client, .. } = Cli::try_parse_from(args).unwrap().command else {
                panic!("plugins")
            };
            assert_eq!(client.admin.as_deref(), Some("http://a"));
        }
    }
}
