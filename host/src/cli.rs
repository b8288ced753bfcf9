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
    marketplace --version | --help

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
fn parse_settings(args: &[String]) -> Result<(Option<PathBuf>, Overrides)> {
    let mut file = None;
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
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
        } else {
            bail!("unknown option {arg:?}\n\n{USAGE}");
        }
    }
    Ok((file, flags))
}

fn load_config(args: &[String]) -> Result<Config> {
    let (file, flags) = parse_settings(args)?;
    let env: Vec<(String, String)> = std::env::vars()
        .filter(|(k, _)| k.starts_with("MARKETPLACE_"))
        .collect();
    Config::load(file.as_deref(), &env, &flags)
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
        let app = tokio::task::spawn_blocking(move || App::start(config)).await??;
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let addr = listener.local_addr()?;
        // One machine-readable line on stdout: tests and scripts wait for it.
        println!("marketplace listening on http://{addr}");
        std::io::stdout().flush()?;
        tracing::info!("listening on http://{addr}");
        crate::http::serve(app, listener, shutdown_signal()).await;
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
