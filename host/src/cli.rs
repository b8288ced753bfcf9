//! The `marketplace` command line.

use crate::app::App;
use crate::config::Config;
use anyhow::{Context, Result, bail};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "\
marketplace: the marketplace service host

USAGE:
    marketplace serve [--config FILE] [--listen ADDR] [--data-dir DIR]
                      [--plugins DIR] [--admin-listen ADDR] [--testing-routes]
    marketplace cash mint <AMOUNT> [--data-dir DIR | --admin URL [--token T]]
    marketplace plugins list --admin URL [--token T]
    marketplace plugins load <FAMILY> <FILE.wasm> [--grants CAP,..] [--read FAMILY,..] --admin URL [--token T]
    marketplace plugins unmount <FAMILY> --admin URL [--token T]
    marketplace --version | --help

`cash mint` without --admin opens the data dir directly (the server must be
stopped); with --admin it asks the running server's admin listener. The token
defaults to MARKETPLACE_ADMIN_TOKEN, else <data-dir>/admin.token.

Every setting can also come from a TOML file (--config or MARKETPLACE_CONFIG)
and from MARKETPLACE_<SETTING> environment variables; flags win over the
environment, which wins over the file. See README.md for all settings.
";

/// Entry point of the binary.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &[String]) -> Result<()> {
    match args.first().map(String::as_str) {
        Some("serve") => serve(&args[1..]),
        Some("cash") => match args.get(1).map(String::as_str) {
            Some("mint") => cash_mint(&args[2..]),
            _ => bail!("usage: marketplace cash mint <AMOUNT> [--data-dir DIR | --admin URL]"),
        },
        Some("plugins") => plugins(&args[1..]),
        Some("--version") | Some("-V") => {
            println!("marketplace {}", crate::app::SERVICE_VERSION);
            Ok(())
        }
        Some("--help") | Some("-h") | Some("help") | None => {
            print!("{USAGE}");
            Ok(())
        }
        Some(other) => bail!("unknown command {other:?}\n\n{USAGE}"),
    }
}

/// Flags that take a value, and the setting each sets.
const VALUE_FLAGS: &[(&str, &str)] = &[
    ("--listen", "listen"),
    ("--data-dir", "data_dir"),
    ("--plugins", "plugins_dir"),
    ("--admin-listen", "admin_listen"),
];

/// Setting overrides: (setting name, value).
type Overrides = Vec<(String, String)>;

/// Parse `--config FILE` and setting flags into (file, overrides).
fn parse_settings(args: &[String], positional_ok: bool) -> Result<(Option<PathBuf>, Overrides)> {
    let mut file = None;
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        if name == "--admin" || name == "--token" {
            // Client options of the admin commands, handled by `client_options`.
            if inline.is_none() {
                it.next();
            }
            continue;
        }
        if name == "--testing-routes" {
            flags.push(("testing_routes".into(), "true".into()));
            continue;
        }
        let mut value = || -> Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .with_context(|| format!("{name} needs a value")),
            }
        };
        if name == "--config" {
            file = Some(PathBuf::from(value()?));
        } else if let Some((_, key)) = VALUE_FLAGS.iter().find(|(f, _)| *f == name) {
            flags.push((key.to_string(), value()?));
        } else if positional_ok && !arg.starts_with("--") {
            continue;
        } else {
            bail!("unknown option {arg:?}\n\n{USAGE}");
        }
    }
    Ok((file, flags))
}

/// Configuration from settings flags; `positional_ok` lets client commands
/// keep their own positional arguments in `args`.
fn load_config_with(args: &[String], positional_ok: bool) -> Result<Config> {
    let (file, flags) = parse_settings(args, positional_ok)?;
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MARKETPLACE_"))
        .collect();
    Config::load(file.as_deref(), &env, &flags)
}

fn load_config(args: &[String]) -> Result<Config> {
    load_config_with(args, false)
}

fn init_logging(filter: &str) {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| filter.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}

fn serve(args: &[String]) -> Result<()> {
    let config = load_config(args)?;
    init_logging(&config.log);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .max_blocking_threads(config.max_instances as usize + 16)
        .build()?;
    rt.block_on(async move {
        tracing::info!(
            data_dir = %config.data_dir.display(),
            plugins_dir = %config.plugins_dir.display(),
            "starting marketplace {}",
            crate::app::SERVICE_VERSION
        );
        let listen = config.listen;
        let admin = match config.admin_listen {
            Some(addr) => Some((
                addr,
                crate::server::admin::token(config.admin_token.as_deref(), &config.data_dir)?,
            )),
            None => None,
        };
        let watch = config.watch_plugins;
        let app = tokio::task::spawn_blocking(move || App::start(config)).await??;
        if watch {
            crate::runtime::reload::spawn(app.runtime.clone())?;
        }
        if let Some((addr, token)) = admin {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("binding admin listener {addr}"))?;
            let admin_addr = listener.local_addr()?;
            println!("marketplace admin listening on http://{admin_addr}");
            tracing::info!("admin listener on http://{admin_addr}");
            tokio::spawn(crate::server::admin::serve(app.clone(), listener, token));
        }
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        // One machine-readable line on stdout: tests and scripts wait for it.
        println!("marketplace listening on http://{addr}");
        std::io::stdout().flush()?;
        tracing::info!("listening on http://{addr}");
        crate::server::http::serve(app, listener, shutdown_signal()).await;
        tracing::info!("stopped");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// `--admin URL` and `--token T` of the admin client commands, and the
/// remaining positional arguments.
fn client_options(args: &[String]) -> (Option<String>, Option<String>, Vec<String>) {
    let (mut admin, mut token, mut rest) = (None, None, Vec::new());
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.split_once('=') {
            Some(("--admin", v)) => admin = Some(v.to_string()),
            Some(("--token", v)) => token = Some(v.to_string()),
            _ if a == "--admin" => admin = it.next().cloned(),
            _ if a == "--token" => token = it.next().cloned(),
            // Grants of `plugins load`: kept with their value.
            _ if a == "--grants" || a == "--read" => {
                rest.push(a.clone());
                rest.extend(it.next().cloned());
            }
            _ if a.starts_with("--") => {
                // A setting flag (e.g. --data-dir DIR): skip it and its value.
                if !a.contains('=') && a != "--testing-routes" {
                    it.next();
                }
            }
            _ => rest.push(a.clone()),
        }
    }
    (admin, token, rest)
}

fn admin_token(token: Option<String>, args: &[String]) -> Result<String> {
    if let Some(t) = token.or_else(|| std::env::var("MARKETPLACE_ADMIN_TOKEN").ok()) {
        return Ok(t);
    }
    let config = load_config_with(args, true)?;
    let path = config.data_dir.join("admin.token");
    Ok(std::fs::read_to_string(&path)
        .with_context(|| format!("no --token given and {} is unreadable", path.display()))?
        .trim()
        .to_string())
}

fn cash_mint(args: &[String]) -> Result<()> {
    let (admin, token, rest) = client_options(args);
    let [amount] = rest.as_slice() else {
        bail!("usage: marketplace cash mint <AMOUNT> [--data-dir DIR | --admin URL]");
    };
    let units =
        marketplace_common::amount::parse(amount).map_err(|e| anyhow::anyhow!("amount {e}"))?;
    anyhow::ensure!(units > 0, "amount must be positive");
    if let Some(url) = admin {
        let token = admin_token(token, args)?;
        let body = serde_json::json!({"amount": amount}).to_string();
        let (status, text) =
            admin_request(&url, "POST", "/admin/cash/mint", &token, body.as_bytes())?;
        anyhow::ensure!(status == 200, "admin answered {status}: {text}");
        let v: serde_json::Value = serde_json::from_str(&text)?;
        println!("{}", v["secret"].as_str().unwrap_or_default());
        return Ok(());
    }
    let config = load_config_with(args, true)?;
    let storage = crate::store::Storage::open(&config.db_path(), config.commit_settings())
        .context("opening the database (is the server running? then use --admin URL)")?;
    let ledger = crate::money::ledger::Ledger::open(&config.data_dir)?;
    let txn = storage.begin_write().map_err(|e| anyhow::anyhow!("{e}"))?;
    let secret = ledger.mint(&txn, units)?;
    storage.commit(txn).map_err(|e| anyhow::anyhow!("{e}"))?;
    println!("{secret}");
    Ok(())
}

fn plugins(args: &[String]) -> Result<()> {
    let (admin, token, rest) = client_options(args);
    let url = admin.context("plugins commands talk to a running server: pass --admin URL")?;
    let token = admin_token(token, args)?;
    let (status, text) = match rest
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        ["list"] => admin_request(&url, "GET", "/admin/plugins", &token, b"")?,
        ["load", family, file, grants @ ..] => {
            let bytes = std::fs::read(file).with_context(|| format!("reading {file}"))?;
            // `--grants a,b` and `--read x,y` become the query of the PUT.
            let mut query = Vec::new();
            for pair in grants.chunks(2) {
                match pair {
                    ["--grants", v] => query.push(format!("grants={v}")),
                    ["--read", v] => query.push(format!("read={v}")),
                    _ => bail!("load takes --grants CAP,CAP and --read FAMILY,FAMILY"),
                }
            }
            let mut path = format!("/admin/plugins/{family}");
            if !query.is_empty() {
                path = format!("{path}?{}", query.join("&"));
            }
            admin_request(&url, "PUT", &path, &token, &bytes)?
        }
        ["unmount", family] => admin_request(
            &url,
            "DELETE",
            &format!("/admin/plugins/{family}"),
            &token,
            b"",
        )?,
        _ => bail!(
            "usage: marketplace plugins list | load <FAMILY> <FILE.wasm> [--grants CAP,..] [--read FAMILY,..] | unmount <FAMILY>  (all with --admin URL)"
        ),
    };
    println!("{text}");
    anyhow::ensure!(status == 200, "admin answered {status}");
    Ok(())
}

/// A minimal HTTP/1.1 client for the admin listener (http://host:port).
fn admin_request(
    url: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &[u8],
) -> Result<(u16, String)> {
    use std::io::Read;
    let authority = url
        .strip_prefix("http://")
        .context("admin URL must start with http://")?
        .trim_end_matches('/');
    let mut stream = std::net::TcpStream::connect(authority)
        .with_context(|| format!("connecting to {authority}"))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nhost: {authority}\r\nauthorization: Bearer {token}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .context("malformed admin response")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("malformed admin status line")?;
    Ok((status, body.to_string()))
}
