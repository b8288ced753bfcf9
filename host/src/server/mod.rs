//! The server layer: HTTP, the admin API, the metrics listener, and the
//! life of a serving process ([`run`]): start, serve, drain on a signal.

pub mod admin;
pub mod answers;
pub mod checks;
pub mod conditional;
pub mod connections;
pub mod drain;
pub mod forwarded;
pub mod framing;
pub mod gates;
pub mod http;
pub mod linger;
pub mod open_files;
pub mod shares;
pub mod uploads;

use crate::app::App;
use crate::config::Config;
use anyhow::{Context, Result};
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// Start the service on `config` and serve until SIGTERM or SIGINT; then
/// stop accepting, let the requests in flight finish (at most
/// `drain_timeout_ms`), stop the admin and metrics listeners and the
/// plugin watcher. Returns the exit code: 0 after a drain. A second signal
/// exits at once (code 130).
pub async fn run(config: Config) -> Result<i32> {
    tracing::info!(
        data_dir = %config.data_dir.display(),
        plugins_dir = %config.plugins_dir.display(),
        "starting marketplace {}",
        crate::app::SERVICE_VERSION
    );
    // SIGHUP, which many operators send to have a daemon reload, would
    // kill the process at once (its default): no drain, answers lost. This
    // service reads its configuration at start and reloads components on
    // its own, so the signal is said in the log (once a second at most)
    // and changes nothing, from the start on. (A terminal closing sends it
    // too: a server started in the foreground outlives its terminal.)
    #[cfg(unix)]
    if let Ok(mut hangup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        tokio::spawn(async move {
            let lines = crate::logging::Throttle::new(Duration::from_secs(1));
            while hangup.recv().await.is_some() {
                if lines.note().is_none() {
                    continue;
                }
                tracing::warn!(
                    "SIGHUP ignored: the configuration is read at start (restart to change it), components reload from the watched directory or the admin API on their own, SIGTERM stops"
                );
            }
        });
    }
    open_files::ensure(config.max_connections, config.store_connections);
    let (listen, admin_listen, metrics_listen) =
        (config.listen, config.admin_listen, config.metrics_listen);
    let drain = Duration::from_millis(config.drain_timeout_ms);
    let watch_plugins = config.watch_plugins;
    // An address taken by another process (or not this machine's) is said
    // before the data dir is made: a mistyped port leaves nothing behind.
    // (The real binds follow the open; one lost to a race meanwhile is
    // said then, as before.)
    for (setting, addr) in [
        ("listen", Some(listen)),
        ("admin_listen", admin_listen),
        ("metrics_listen", metrics_listen),
    ] {
        if let Some(addr) = addr {
            std::net::TcpListener::bind(addr).with_context(|| bind_failed(setting, addr))?;
        }
    }
    // App::open creates the data dir (0700) before anything is written in
    // it; the families load once the listeners are up.
    let app = tokio::task::spawn_blocking(move || App::open(config)).await??;
    {
        let app = app.clone();
        tokio::task::spawn_blocking(move || admin::read_ledger_gauges(&app)).await?;
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_watcher = Arc::new(AtomicBool::new(false));
    // Every listener is bound before any is announced: a script that
    // waits for a "listening" line never sees one of a start that fails.
    let admin = match admin_listen {
        Some(addr) => {
            let token = admin::token(app.config.admin_token.as_deref(), &app.config.data_dir)?;
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| bind_failed("admin_listen", addr))?;
            Some((listener, token))
        }
        None => {
            // Unused without the listener, but read by the CLI and by the
            // next start with one: a weak token file is said now.
            let file = app.config.data_dir.join("admin.token");
            if app.config.admin_token.is_none()
                && let Ok(token) = std::fs::read_to_string(&file)
                && let Some(why) = admin::weak_token_file(&file, &token)
            {
                tracing::warn!("{why}; a start with admin_listen refuses it");
            }
            None
        }
    };
    let metrics = match metrics_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| bind_failed("metrics_listen", addr))?,
        ),
        None => None,
    };
    let listener = bind_public(listen).with_context(|| bind_failed("listen", listen))?;
    let mut listeners: Vec<(&str, tokio::task::JoinHandle<()>)> = Vec::new();
    if let Some((listener, token)) = admin {
        let admin_addr = listener.local_addr()?;
        announce(&format!(
            "marketplace admin listening on http://{admin_addr}"
        ));
        tracing::info!("admin listener on http://{admin_addr}");
        listeners.push((
            "admin",
            tokio::spawn(admin::serve(app.clone(), listener, token, stop_rx.clone())),
        ));
    }
    if let Some(listener) = metrics {
        let metrics_addr = listener.local_addr()?;
        announce(&format!(
            "marketplace metrics listening on http://{metrics_addr}"
        ));
        tracing::info!("metrics listener on http://{metrics_addr}/metrics");
        if !metrics_addr.ip().is_loopback() {
            tracing::warn!(
                "the metrics listener {metrics_addr} is not on loopback: anyone who reaches it reads the ledger totals and request counts (no token); firewall it, or scrape the admin listener with its token"
            );
        }
        listeners.push((
            "metrics",
            tokio::spawn(admin::serve_metrics(app.clone(), listener, stop_rx.clone())),
        ));
    }
    let addr = listener.local_addr()?;
    tracing::info!("listening on http://{addr} (families loading)");
    // Requests are served from now on, each family's as soon as it is
    // ready (until all are, an unmatched path is 503 with Retry-After):
    // the built-in families, then the other configured ones, then those
    // only uploaded, each as the uploads kept in the data dir (or the
    // fleet's) decide (`uploads::mount_at_start`). Then the watchers
    // start, and one machine-readable line on stdout says the host is
    // ready: tests and scripts wait for it.
    {
        let (app, stop_watcher) = (app.clone(), stop_watcher.clone());
        tokio::spawn(async move {
            let loading = app.clone();
            let stop = stop_watcher.clone();
            let loaded = tokio::task::spawn_blocking(move || {
                let kept_uploads = uploads::mount_at_start(&loading);
                // The families directory's components mount after them.
                if watch_plugins {
                    let kept = crate::runtime::reload::Kept {
                        unmounted: uploads::kept_unmounts(&loading),
                        // On a shared store the fleet's record stays.
                        file_drops_kept: !loading.storage.is_shared(),
                        file_serves: Box::new({
                            let app = loading.clone();
                            move |family| uploads::file_serves(&app, family)
                        }),
                        kept_change: Box::new({
                            let app = loading.clone();
                            move |family| uploads::kept_change(&app, family)
                        }),
                    };
                    if let Err(e) =
                        crate::runtime::reload::spawn(loading.runtime.clone(), stop, kept)
                    {
                        tracing::error!("cannot watch the plugins directory: {e:#}");
                    }
                }
                // Every family the start mounts (or tried to: a kept upload
                // refused) is known now.
                let mounted: Vec<String> = loading
                    .runtime
                    .statuses_with(false)
                    .into_iter()
                    .map(|s| s.family)
                    .chain(kept_uploads)
                    .collect();
                for line in loading.config.settings_for_no_family(&mounted) {
                    tracing::warn!("{line}");
                }
                loading.runtime.loaded();
            })
            .await;
            if let Err(e) = loaded {
                tracing::error!("loading the families failed: {e}");
                // What loaded serves; health stops saying `loading`.
                app.runtime.loaded();
            }
            if app.storage.is_shared()
                && let Err(e) = uploads::spawn_fleet_sync(app.clone(), stop_watcher)
            {
                tracing::error!("cannot follow the fleet's uploads: {e:#}");
            }
            // A keyspace to read that names no family (a typo in `read`)
            // would read nothing, silently: said once everything is loaded
            // (the admin API refuses such a name; a family mounted later
            // through the watched directory or the API may still come).
            // (A configured family an admin unmounted is among them, as
            // `unmounted`: it keeps its data, which reads of it find.)
            let statuses = app.runtime.statuses_with(false);
            for s in &statuses {
                for read in s
                    .reads
                    .iter()
                    .filter(|r| !statuses.iter().any(|o| &o.family == *r))
                {
                    tracing::warn!(
                        family = %s.family,
                        read = %read,
                        "read names no family: nothing is mounted or configured under that name, so its reads find nothing"
                    );
                }
            }
            let unavailable: Vec<String> = statuses
                .iter()
                .filter(|s| s.status == "unavailable")
                .map(|s| match &s.error {
                    Some(why) => format!("{} ({why})", s.family),
                    None => s.family.clone(),
                })
                .collect();
            if unavailable.is_empty() {
                tracing::info!("ready: every family loaded, serving on http://{addr}");
            } else {
                tracing::warn!(
                    "ready: serving on http://{addr}, health degraded: {} of {} families unavailable: {}",
                    unavailable.len(),
                    statuses.len(),
                    unavailable.join("; ")
                );
            }
            // After the ready line, written out: a script that saw this
            // line finds it in the log.
            crate::logging::flush_all();
            announce(&format!("marketplace listening on http://{addr}"));
        });
    }

    // When the signal came: the drain's time counts from it.
    let drain_started = Arc::new(std::sync::OnceLock::new());
    let started = drain_started.clone();
    tokio::spawn(async move {
        signal().await;
        tracing::info!(
            drain_ms = drain.as_millis() as u64,
            "signal received: draining (a second signal exits at once)"
        );
        let _ = started.set(tokio::time::Instant::now());
        let _ = stop_tx.send(true);
        signal().await;
        tracing::warn!("second signal: exiting now");
        crate::logging::flush_all();
        std::process::exit(130);
    });
    http::serve(app.clone(), listener, stop_rx, drain).await;
    // The admin and metrics listeners drained alongside (an online backup
    // or an upload in flight is answered): given what is left of the
    // drain, and a moment at least.
    let admin_until = tokio::time::Instant::now() + Duration::from_secs(1);
    for (name, l) in listeners {
        let until = admin_until.max(drain_deadline(&drain_started, drain));
        if tokio::time::timeout_at(until, l).await.is_err() {
            // (An upload still compiling is abandoned: `plugins list`
            // after the restart says what serves.)
            tracing::warn!(
                listener = name,
                drain_ms = drain.as_millis() as u64,
                "drain timeout: the {name} listener's requests still running were not answered (an upload still compiling is abandoned: plugins list after the restart says what serves)"
            );
        }
    }
    stop_watcher.store(true, Ordering::Relaxed);
    app.stop_background();
    // Into the database file itself: the write-ahead log is empty after a
    // clean stop (unless a checkpoint cannot be made, say on a full disk:
    // then the log keeps it, and the next start applies it).
    let flushing = app.clone();
    let _ = tokio::task::spawn_blocking(move || flushing.storage.flush()).await;
    tracing::info!(commits = app.storage.commits(), "stopped");
    Ok(0)
}

/// A line on stdout for the scripts that wait for it (`marketplace ...
/// listening on ...`). Nobody reading stdout (a closed pipe) is no reason
/// to stop: the same line is in the log.
fn announce(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

/// When a drain that began at `started` (now, if it has not) must end.
fn drain_deadline(
    started: &std::sync::OnceLock<tokio::time::Instant>,
    drain: Duration,
) -> tokio::time::Instant {
    *started.get_or_init(tokio::time::Instant::now) + drain
}

/// SIGTERM or SIGINT.
async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = int.recv() => {},
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}

/// Resolves once `stop` turns true.
pub(crate) async fn stopped(mut stop: watch::Receiver<bool>) {
    while !*stop.borrow_and_update() {
        if stop.changed().await.is_err() {
            // The sender is gone: never stop on its account.
            std::future::pending::<()>().await;
        }
    }
}

/// Connections the kernel keeps waiting for their accept (the kernel caps
/// it at `net.core.somaxconn`, 4096 by default since Linux 5.4). The
/// usual 128 overflows when many clients connect at once, or while every
/// place is taken and new clients wait (see `connections`): an overflowed
/// connection attempt is retried by the client's kernel only after 1 s.
const LISTEN_BACKLOG: u32 = 4096;

/// How the start says that the listener of `setting` could not bind
/// `addr`.
fn bind_failed(setting: &str, addr: std::net::SocketAddr) -> String {
    let listener = match setting {
        "admin_listen" => "admin listener",
        "metrics_listen" => "metrics listener",
        _ => "public listener",
    };
    format!("binding the {listener} ({setting}) {addr}")
}

/// The public listener, with room for [`LISTEN_BACKLOG`] waiting
/// connections.
fn bind_public(addr: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match addr {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As std's and tokio's `bind` do on Unix: a restart binds at once,
    // whatever connections of the last run linger in TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}
