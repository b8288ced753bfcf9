//! The admin listener: loopback only, every request needs
//! `Authorization: Bearer <token>` (from config, or generated into
//! `<data_dir>/admin.token` with mode 0600).
//!
//! - `GET /admin/plugins` -> `[{family, component, version, status, hash,
//!   loaded_at, grants, reads, routes, imports, error?, refused?}]`
//!   (`imports`: the interfaces the loaded component imports,
//!   `package:name/iface@version`; `error`: why an unavailable family's last
//!   load failed; `refused`: `{file, hash, at, error}`, the last change of a
//!   watched file of the family that was not loaded, until the family loads,
//!   the file is back to the bytes that serve or (in `families/`) is gone;
//!   a refused file of no listed family is listed with status `refused`)
//! - `PUT /admin/plugins/{family}[?grants=a,b&read=x,y]` (component bytes,
//!   up to 64 MiB): validate, swap, then answer `{family, version, hash,
//!   mounted, grants, reads, routes}`. An unknown family is mounted (with
//!   the grants given, else those of `[families.NAME]`, else none); with
//!   `grants`/`read` a known family's grants are replaced. A refused
//!   component (bad bytes, an ungranted import, a route or schema conflict)
//!   is 400 and the old one keeps serving.
//! - `DELETE /admin/plugins/{family}`: unmount; its routes answer 404 again,
//!   its data stays. 404 for an unknown family.
//! - `POST /admin/cash/mint {"amount": "1.5", "idempotency_key"?}` ->
//!   `{"secret"}` (a repeat of a key and amount: the same secret, nothing
//!   more minted; the key with another amount: 409 `idempotency_conflict`;
//!   409 in upstream mode: mint at the upstream)
//! - `GET /admin/cash/upstream-fees` (upstream mode): the fees earned that
//!   are unspent at the upstream, as secrets to insert into a wallet
//! - `POST /admin/clock {"shift_ms": n}` (only with `testing_routes`): shift
//!   the host clock, for deadline and freshness tests.
//! - `GET /admin/backup`: a consistent backup (tar, see `crate::backup`),
//!   streamed as it is written, never held whole in memory; a failure
//!   before the first byte is a 500, a later one cuts the body short.

use crate::app::App;
use crate::capabilities::Grants;
use crate::money::ledger;
use crate::reply::Reply;
use crate::runtime::routes::logged_unrouted;
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// Largest component upload.
pub const MAX_UPLOAD: usize = crate::runtime::engine::MAX_COMPONENT_BYTES;
/// Longest the admin listener waits for a request body (64 MiB at about
/// 1 MiB/s): a stalled sender does not hold a connection for ever.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(60);

/// The body of every admin and metrics answer: whole, or streamed (backup).
pub type AdminBody = BoxBody<Bytes, std::io::Error>;

/// A whole answer as an [`AdminBody`] one.
fn boxed(resp: Response<super::answers::Answer>) -> Response<AdminBody> {
    resp.map(|b| b.map_err(|never| match never {}).boxed())
}

/// Why the token `text` of the file at `path` is refused, if it is: as a
/// configured one, a short token is guessed, and an empty one would refuse
/// every request with no word of why.
pub fn weak_token_file(path: &Path, text: &str) -> Option<String> {
    let bytes = text.trim().len();
    (bytes < crate::config::MIN_ADMIN_TOKEN_BYTES).then(|| {
        format!(
            "{} holds an admin token of {bytes} bytes: at least {} are needed (remove the file to have one generated, or set admin_token)",
            path.display(),
            crate::config::MIN_ADMIN_TOKEN_BYTES
        )
    })
}

/// The metrics listener's 404 (the CLI knows it: not the admin listener).
pub const METRICS_ONLY: &str = "only GET /metrics is served here";

/// The admin token: configured, or read from / generated into the data dir.
pub fn token(configured: Option<&str>, data_dir: &Path) -> Result<String> {
    if let Some(t) = configured {
        return Ok(t.to_string());
    }
    let path = data_dir.join("admin.token");
    match std::fs::read_to_string(&path) {
        Ok(t) => match weak_token_file(&path, &t) {
            Some(why) => bail!("{why}"),
            None => Ok(t.trim().to_string()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut raw = [0u8; 32];
            crate::ids::fill_random(&mut raw);
            let t = marketplace_common::hex::encode(&raw);
            crate::money::ledger::write_private(&path, &t)?;
            Ok(t)
        }
        Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
    }
}

/// Accept connections on `listener` until `stop`, serving each with
/// `handle`; then let every request in flight finish (an online backup
/// streaming, an upload compiling) while idle connections close, and
/// return once every connection has ended. As on the public listener
/// (see [`super::drain`]), a request already sent when the signal comes
/// is answered, not reset: the connections waiting in the listen backlog
/// are accepted and served, and a connection between requests stays open
/// `linger` (the drain's `drain_linger_ms`) before it closes, so one on
/// its way is served. (An outside audit's mints sent just before a
/// SIGTERM were closed unanswered.)
async fn accept_loop<F, Fut>(
    listener: TcpListener,
    stop: watch::Receiver<bool>,
    linger: Duration,
    handle: F,
) where
    F: Fn(std::net::SocketAddr, Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = Response<AdminBody>> + Send + 'static,
{
    let stopping = super::stopped(stop.clone());
    tokio::pin!(stopping);
    // Every connection task holds a sender: once all are dropped, every
    // connection has ended.
    let (live, mut ended) = tokio::sync::mpsc::channel::<()>(1);
    let serve = |stream: tokio::net::TcpStream, peer: std::net::SocketAddr| {
        let handle = handle.clone();
        let (stop, live) = (stop.clone(), live.clone());
        let draining = stop.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let fut = handle(peer, req);
                let draining = draining.clone();
                async move {
                    let mut resp = fut.await;
                    // An answer given once the drain began says the
                    // connection closes after it, so its client sends
                    // no more on it (as the public listener's do).
                    if *draining.borrow() {
                        resp.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("close"),
                        );
                    }
                    Ok::<_, std::convert::Infallible>(resp)
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = super::stopped(stop) => {
                    // A request on its way is served meanwhile; then the
                    // connection closes when idle, or after the answer it
                    // is giving.
                    tokio::select! {
                        _ = conn.as_mut() => {}
                        () = tokio::time::sleep(linger) => {
                            conn.as_mut().graceful_shutdown();
                            let _ = conn.await;
                        }
                    }
                }
            }
            drop(live);
        });
    };
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = &mut stopping => break,
        };
        let Ok((stream, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        serve(stream, peer);
    }
    for (stream, peer) in super::drain::take_backlog(listener) {
        serve(stream, peer);
    }
    drop(live);
    let _ = ended.recv().await;
}

/// Serve the admin API on `listener` until `stop`.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    token: String,
    stop: watch::Receiver<bool>,
) {
    let token = Arc::new(token);
    let linger = app.config.drain_linger().0;
    accept_loop(listener, stop, linger, move |peer, req| {
        handle(app.clone(), token.clone(), peer, req)
    })
    .await
}

/// Serve `GET /metrics` (no token) on `listener` until `stop`.
pub async fn serve_metrics(app: Arc<App>, listener: TcpListener, stop: watch::Receiver<bool>) {
    let linger = app.config.drain_linger().0;
    accept_loop(listener, stop, linger, move |_, req| {
        let app = app.clone();
        async move {
            let reply = match (req.method().as_str(), req.uri().path()) {
                ("GET", "/metrics") => metrics_reply(&app).await,
                // Another method on the one path: 405 with `Allow`, as
                // on the admin listener.
                (method, "/metrics") => Reply::method_not_allowed(method, "/metrics", &["GET"]),
                _ => Reply::error(404, "not_found", METRICS_ONLY),
            };
            boxed(crate::server::http::to_hyper(reply, false))
        }
    })
    .await
}

/// The metrics in the Prometheus text format, ledger totals read now. A
/// store that cannot be read (or not within [`LEDGER_READ_WAIT`]) leaves
/// the totals last read, never zeros: a scrape is answered in time, and a
/// graph does not drop to nothing during an outage.
async fn metrics_reply(app: &Arc<App>) -> Reply {
    let app = app.clone();
    let read = tokio::task::spawn_blocking(move || ledger_totals(&app));
    let m = crate::metrics::metrics();
    m.plugin_memory_bytes
        .set(i64::try_from(crate::runtime::limiter::in_use()).unwrap_or(i64::MAX));
    // (A read that comes after the wait sets nothing: a later scrape's
    // may have shown newer totals meanwhile.)
    match tokio::time::timeout(LEDGER_READ_WAIT, read).await {
        Ok(Ok(Some((minted, fees, escrow)))) => m.ledger(minted, fees, escrow),
        _ => tracing::debug!("ledger totals not read for the metrics: the last ones are shown"),
    }
    Reply {
        status: 200,
        headers: vec![(
            "content-type".into(),
            "application/openmetrics-text; version=1.0.0; charset=utf-8".into(),
        )],
        body: m.render().into_bytes(),
    }
}

/// The ledger's totals (minted, fees, escrow) read now, if they can be.
fn ledger_totals(app: &App) -> Option<(u64, u64, u64)> {
    let txn = app.storage.begin_read().ok()?;
    let t = |name| crate::money::ledger::total(&txn, name).ok();
    Some((t("minted")?, t("fees")?, t("escrow")?))
}

/// Set the ledger gauges from the totals read now, at start: a store away
/// before the first scrape then leaves the start's totals, not zeros.
pub fn read_ledger_gauges(app: &App) {
    if let Some((minted, fees, escrow)) = ledger_totals(app) {
        crate::metrics::metrics().ledger(minted, fees, escrow);
    }
}

/// Longest a scrape waits for the ledger totals.
const LEDGER_READ_WAIT: Duration = Duration::from_secs(2);

/// Compare in constant time, whatever the lengths (both are hashed first,
/// so a length mismatch takes as long as any other).
fn same(a: &[u8], b: &[u8]) -> bool {
    use sha2::{Digest, Sha256};
    use subtle::ConstantTimeEq;
    Sha256::digest(a).ct_eq(&Sha256::digest(b)).into()
}

/// Answer one admin request in a request span (its lines carry the
/// request id, as the public listener's do), log it, and return its id in
/// `x-request-id`.
async fn handle(
    app: Arc<App>,
    token: Arc<String>,
    peer: std::net::SocketAddr,
    req: Request<Incoming>,
) -> Response<AdminBody> {
    use tracing::Instrument;
    let start = std::time::Instant::now();
    let id = super::http::request_id(req.headers());
    let span = crate::logging::request_span(&id);
    let (method, path) = (
        req.method().as_str().to_string(),
        req.uri().path().to_string(),
    );
    let mut resp = answer(app, token, peer, req, &method, &path)
        .instrument(span.clone())
        .await;
    // A path may hold anything a client typed, a cash secret included:
    // logged as the public listener logs a path no route took.
    span.in_scope(|| {
        tracing::info!(
            target: "admin",
            client = %peer.ip(),
            method = %crate::logging::clip(&method, crate::logging::MAX_METHOD),
            path = %crate::logging::clip(&logged_unrouted(&path), crate::logging::MAX_PATH),
            status = resp.status().as_u16(),
            micros = start.elapsed().as_micros() as u64
        )
    });
    if let Ok(v) = hyper::header::HeaderValue::from_str(&id) {
        resp.headers_mut()
            .insert(super::http::X_REQUEST_ID.clone(), v);
    }
    resp
}

/// The answer to an admin request (`method` and `path` are its own).
async fn answer(
    app: Arc<App>,
    token: Arc<String>,
    peer: std::net::SocketAddr,
    req: Request<Incoming>,
    method: &str,
    path: &str,
) -> Response<AdminBody> {
    let query = req.uri().query().unwrap_or_default().to_string();
    let presented = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer);
    let authorized = presented.is_some_and(|t| same(t.trim().as_bytes(), token.as_bytes()));
    if authorized && method == "GET" && path == "/admin/backup" {
        return backup(app).await;
    }
    let declared = super::checks::declared_length(req.headers());
    let mut reply = match presented {
        None => Reply::error(
            401,
            "auth_required",
            "send Authorization: Bearer <admin token>",
        ),
        Some(t) if !same(t.trim().as_bytes(), token.as_bytes()) => {
            wrong_token(peer);
            Reply::error(401, "auth_invalid", "admin token does not match")
        }
        Some(_) if method == "GET" && path == "/metrics" => metrics_reply(&app).await,
        // Decided from the declared length, before the body is read; the
        // connection closes (the body stays unread).
        Some(_) if declared.is_some_and(|n| n > MAX_UPLOAD as u64) => {
            super::http::too_large(MAX_UPLOAD)
        }
        Some(_) => match tokio::time::timeout(
            UPLOAD_TIMEOUT,
            Limited::new(req.into_body(), MAX_UPLOAD).collect(),
        )
        .await
        {
            Err(_) => super::http::body_late(UPLOAD_TIMEOUT),
            Ok(Err(_)) => super::http::too_large(MAX_UPLOAD),
            Ok(Ok(body)) => {
                let body = body.to_bytes().to_vec();
                let (m, p) = (method.to_string(), path.to_string());
                // (In the request's span: a mint's line carries its id.)
                let span = tracing::Span::current();
                tokio::task::spawn_blocking(move || {
                    span.in_scope(|| route(&app, &m, &p, &query, &body))
                })
                .await
                .unwrap_or_else(|_| Reply::error(500, "internal", "internal error"))
            }
        },
    };
    if reply.status == 401 {
        reply
            .headers
            .push(("www-authenticate".into(), "Bearer realm=\"admin\"".into()));
    }
    boxed(crate::server::http::to_hyper(reply, false))
}

/// A wrong admin token was presented: a `warn` line naming the peer, one
/// a second at most (a process guessing tokens presents many).
fn wrong_token(peer: std::net::SocketAddr) {
    static LINES: crate::logging::Throttle = crate::logging::Throttle::new(Duration::from_secs(1));
    if let Some(n) = LINES.note() {
        tracing::warn!(target: "admin", %peer, refused_since_last_line = n, "a wrong admin token was presented");
    }
}

/// The token of an `Authorization: Bearer <token>` value (the scheme in
/// any case, RFC 9110 11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// `GET /admin/backup`: `crate::backup::snapshot` runs on a blocking thread
/// writing 64 KiB chunks into a small channel that the response body
/// drains, so at most a few chunks are in memory at once.
async fn backup(app: Arc<App>) -> Response<AdminBody> {
    use std::io::Write;
    if app.config.shared_store() {
        return boxed(crate::server::http::to_hyper(
            Reply::error(
                409,
                "conflict",
                "this host serves a shared store: back it up with its database's tools (pg_dump, or the cluster's own backups), not through a host",
            ),
            false,
        ));
    }
    // The snapshot is a copy of the database in the data dir first: one
    // that would eat into the disk's reserve is refused (it would fill
    // the disk the reserve keeps room on).
    let database = std::fs::metadata(app.config.db_path()).map_or(0, |m| m.len());
    if let Some(room) = app.storage.disk_room()
        && room < database
    {
        return boxed(crate::server::http::to_hyper(
            Reply::error(
                507,
                "insufficient_storage",
                format!(
                    "a backup first copies the database ({} MiB) into the data dir, whose disk has {} MiB free beyond min_free_disk_mib: free space on it first",
                    database >> 20,
                    room >> 20
                ),
            ),
            false,
        ));
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<Bytes>>(8);
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || {
        let _in_request = span.enter();
        let mut out = std::io::BufWriter::with_capacity(64 << 10, Chunks(tx.clone()));
        let keys = crate::backup::Keys::of(&app.state);
        let written = crate::backup::snapshot(&app.storage, &app.config.data_dir, &keys, &mut out)
            .and_then(|n| Ok(out.flush().map(|()| n)?));
        // Never flush what an error left in the buffer after the error.
        let _ = out.into_parts();
        match written {
            Ok(n) => tracing::info!(target: "admin", bytes = n, "backup streamed"),
            Err(e) => {
                tracing::error!(target: "admin", "backup failed: {e:#}");
                let _ = tx.blocking_send(Err(std::io::Error::other(format!("{e:#}"))));
            }
        }
    });
    match rx.recv().await {
        Some(Ok(first)) => {
            let body = ChannelBody {
                first: Some(first),
                rx,
            };
            let mut resp = Response::new(body.boxed());
            let h = resp.headers_mut();
            h.insert(
                "content-type",
                hyper::header::HeaderValue::from_static("application/x-tar"),
            );
            h.insert(
                "content-disposition",
                hyper::header::HeaderValue::from_static(
                    "attachment; filename=\"marketplace-backup.tar\"",
                ),
            );
            h.insert(
                "cache-control",
                hyper::header::HeaderValue::from_static("no-store"),
            );
            resp
        }
        _ => boxed(crate::server::http::to_hyper(
            Reply::error(500, "internal", "the backup failed (see the server log)"),
            false,
        )),
    }
}

/// A writer sending what it is given, as one chunk per write, into a channel.
struct Chunks(tokio::sync::mpsc::Sender<std::io::Result<Bytes>>);

impl std::io::Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| {
                std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client went away")
            })?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A response body read from a channel (after a first chunk already taken).
struct ChannelBody {
    first: Option<Bytes>,
    rx: tokio::sync::mpsc::Receiver<std::io::Result<Bytes>>,
}

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        if let Some(first) = self.first.take() {
            return std::task::Poll::Ready(Some(Ok(hyper::body::Frame::data(first))));
        }
        self.rx
            .poll_recv(cx)
            .map(|next| next.map(|chunk| chunk.map(hyper::body::Frame::data)))
    }
}

fn status_json(s: &crate::runtime::PluginStatus) -> serde_json::Value {
    serde_json::to_value(s).unwrap_or_default()
}

/// `GET /admin/plugins`: every family's status, with `refused` (the last
/// watched file of it that was not loaded) where there is one; a refused
/// file whose family is not listed is an entry of its own, status
/// `refused`.
fn plugins_json(app: &App) -> serde_json::Value {
    // Statuses first: a swap clears its family's refusal after it serves.
    let statuses = app.runtime.statuses();
    let mut refusals = app.runtime.refusals.list();
    let refused_only: Vec<_> = refusals
        .iter()
        .filter(|(family, _)| !statuses.iter().any(|s| &s.family == *family))
        .map(|(family, r)| crate::runtime::PluginStatus {
            family: family.clone(),
            component: r.file.clone(),
            status: "refused".into(),
            error: Some(r.error.clone()),
            ..Default::default()
        })
        .collect();
    // A family of the families directory an admin unmounted: its file is
    // there and serves nothing until it changes or is loaded again (a
    // configured family so unmounted is among the statuses already).
    let families_dir = app.runtime.plugins_dir().join(crate::config::FAMILIES_DIR);
    let held: Vec<_> = super::uploads::kept_unmounts(app)
        .into_iter()
        .filter(|f| !statuses.iter().chain(&refused_only).any(|s| &s.family == f))
        .filter(|f| families_dir.join(format!("{f}.wasm")).is_file())
        .map(|family| crate::runtime::PluginStatus {
            component: format!("{}/{family}.wasm", crate::config::FAMILIES_DIR),
            family,
            status: "unmounted".into(),
            ..Default::default()
        })
        .collect();
    let list: Vec<_> = statuses
        .iter()
        .chain(&refused_only)
        .chain(&held)
        .map(|s| {
            let mut v = status_json(s);
            if let Some(r) = refusals.remove(&s.family) {
                v["refused"] = json!(r);
            }
            v
        })
        .collect();
    json!(list)
}

/// The name an upload is listed under, from `?component=NAME` (the file
/// it came from, as `plugins load` sends it): a plain file name. Without
/// it see [`unnamed_upload`].
fn component_of(pairs: &[(String, String)]) -> Result<Option<String>, String> {
    let Some((_, name)) = pairs.iter().find(|(n, _)| n == "component") else {
        return Ok(None);
    };
    let name = name.clone();
    let plain = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && !name
            .chars()
            .any(|c| c == '/' || c == '\\' || crate::logging::escaped(c));
    if !plain {
        return Err(format!(
            "component {name:?} must be a file name (1 to 128 bytes, no path, not starting with '.', no control, line-separator, bidi or invisible characters: it is shown in listings and logs)"
        ));
    }
    Ok(Some(name))
}

/// The answer to an upload or unmount (`what`) the shared store could not
/// record for the fleet: undone on this host too (what served before
/// serves again), so the fleet does not split, and 503 to try again.
fn not_recorded(
    app: &App,
    family: &str,
    previous: crate::runtime::engine::Previous,
    what: &str,
    e: &anyhow::Error,
) -> Reply {
    tracing::error!(
        family,
        "the {what} could not be recorded for the fleet, so it is undone here too: {e:#}"
    );
    let message = match app.runtime.put_back(family, previous) {
        Ok(()) => format!(
            "not applied: the {what} could not be recorded for the fleet ({e:#}), so this host serves what it served before; {what} again"
        ),
        Err(undo) => {
            tracing::error!(family, "the {what} could not be undone here: {undo:#}");
            format!(
                "the {what} applies on this host only: it could not be recorded for the fleet ({e:#}), nor undone here; {what} again"
            )
        }
    };
    Reply::error(503, "store_unavailable", message).retry_after_a_second()
}

/// The name of an upload sent without `?component`: the family's current
/// name when the bytes are the ones serving, else `{family}-{12 hex of
/// their sha256}.wasm`, so a listing never names a file whose content is
/// not what serves. A family of the watched `families/` directory keeps
/// its `families/NAME.wasm`: that name is what ties the family to its
/// file (a later change of the file swaps, its removal unmounts).
fn unnamed_upload(
    family: &str,
    serving: Option<&crate::runtime::PluginStatus>,
    bytes: &[u8],
) -> String {
    let hash = marketplace_common::hex::sha256(bytes);
    match serving {
        Some(s) if s.hash == hash => s.component.clone(),
        Some(s) if crate::runtime::reload::in_families_dir(&s.component) => s.component.clone(),
        _ => format!("{family}-{}.wasm", &hash[..12]),
    }
}

/// Grants from `?grants=a,b&read=x,y`, if either is given; the one not
/// given keeps its `current` value.
fn grants_of(
    pairs: &[(String, String)],
    current: Option<Grants>,
) -> Result<Option<Grants>, String> {
    let get = |k: &str| pairs.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (caps, reads) = (get("grants"), get("read"));
    if caps.is_none() && reads.is_none() {
        return Ok(None);
    }
    let current = current.unwrap_or_default();
    let mut g = Grants::parse(
        caps.as_deref().unwrap_or_default().split(','),
        reads.as_deref().unwrap_or_default().split(','),
    )?;
    if caps.is_none() {
        g.capabilities = current.capabilities;
    }
    if reads.is_none() {
        g.reads = current.reads;
    }
    Ok(Some(g))
}

fn route(app: &Arc<App>, method: &str, path: &str, query: &str, body: &[u8]) -> Reply {
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, segments.as_slice()) {
        ("GET", ["admin", "plugins"]) => Reply::json(200, &plugins_json(app)),
        // Until the start is done it decides what serves (the kept
        // uploads replayed, the families directory mounted): a change now
        // could be undone by it.
        ("PUT" | "DELETE", ["admin", "plugins", _]) if app.runtime.loading() => Reply::error(
            503,
            "plugin_unavailable",
            "the service is starting: its families are still loading; send the change again once it is ready",
        )
        .retry_after_a_second(),
        ("PUT", ["admin", "plugins", family]) => {
            if !crate::capabilities::valid_family(family) {
                return Reply::invalid(
                    "family",
                    format!(
                        "{family:?} is not a family name ({})",
                        crate::capabilities::FAMILY_NAME_RULE
                    ),
                );
            }
            // (From reading what serves now: the grants and name kept
            // come from it.)
            // Applied and kept before another change (two uploads at once
            // are applied and recorded one after the other).
            let _one_change = app.runtime.one_change();
            // (A configured family an admin unmounted is listed, but
            // mounting it again is a mount.)
            let current = app
                .runtime
                .status(family)
                .filter(|s| s.status != "unmounted");
            let known = current.is_some();
            let pairs = match marketplace_common::url::parse_query(query) {
                Ok(pairs) => pairs,
                Err(name) => return Reply::invalid(&name, crate::runtime::routes::NOT_UTF8),
            };
            // A misspelled parameter (`?grant=`) would be ignored: refused.
            if let Some((name, _)) = pairs
                .iter()
                .find(|(n, _)| !["grants", "read", "component"].contains(&n.as_str()))
            {
                return Reply::invalid(
                    name,
                    format!(
                        "unknown parameter {name:?}: the parameters are grants, read and component"
                    ),
                );
            }
            let grants = match grants_of(&pairs, app.runtime.grants(family)) {
                Ok(g) => g,
                Err(e) => return Reply::invalid("grants", e),
            };
            if let Some(Err(e)) = grants.as_ref().map(|g| crate::config::grants_fit(family, g)) {
                let field = if pairs.iter().any(|(n, v)| n == "grants" && !v.is_empty()) {
                    "grants"
                } else {
                    "read"
                };
                return Reply::invalid(field, e);
            }
            // A keyspace to read names a family that exists (mounted or
            // configured): a typo would otherwise read nothing, silently.
            if let Some(unknown) = grants.as_ref().and_then(|g| {
                g.reads
                    .iter()
                    .find(|r| *r != family && !app.family_known(r))
            }) {
                return Reply::invalid(
                    "read",
                    format!("no family {unknown:?} is mounted or configured"),
                );
            }
            let named = match component_of(&pairs) {
                Ok(n) => n,
                Err(e) => return Reply::invalid("component", e),
            };
            let spec = app.config.family(family);
            let component = named.unwrap_or_else(|| unnamed_upload(family, current.as_ref(), body));
            let grants = grants.or_else(|| (!known).then(|| spec.map(|s| s.grants)).flatten());
            let before = app.runtime.plugin(family);
            let previous = app.runtime.previous(family);
            let result = app.runtime.swap(family, &component, body, grants);
            crate::metrics::metrics().swap(family, if result.is_ok() { "ok" } else { "refused" });
            match result {
                Ok(plugin) => {
                    if let Err(e) = super::uploads::record(app, family, body) {
                        if app.storage.is_shared() {
                            // The fleet would not follow: this host does
                            // not either (nothing changed).
                            return not_recorded(app, family, previous, "upload", &e);
                        }
                        tracing::error!(
                            family,
                            "the upload serves now but was not kept for restarts: {e:#}"
                        );
                    }
                    // What the operator decided last serves now.
                    crate::alerts::settled(family);
                    let mut doc = app
                        .runtime
                        .status(family)
                        .map(|s| status_json(&s))
                        .unwrap_or_default();
                    doc["mounted"] = json!(!known);
                    // What the swap turned into 404s (logged too): a typo
                    // in the family's name swaps another family's
                    // component, a built-in one's too.
                    if let Some(before) = &before {
                        doc["dropped_routes"] =
                            json!(crate::runtime::engine::dropped_routes(before, &plugin));
                    }
                    Reply::json(200, &doc)
                }
                Err(e) => {
                    tracing::warn!(family, "refused component upload: {e:#}");
                    Reply::invalid("body", format!("component refused: {e:#}"))
                }
            }
        }
        ("DELETE", ["admin", "plugins", family]) => {
            // Applied and kept before another change (two uploads at once
            // are applied and recorded one after the other).
            let _one_change = app.runtime.one_change();
            if app.runtime.grants(family).is_none() {
                // Not mounted, but an upload of it is kept that the start
                // refused (`kept_upload_refused`): the unmount settles it,
                // as README says, instead of leaving it to come back.
                let kept = match super::uploads::kept_upload(app, family) {
                    Ok(kept) => kept,
                    // Not known: not said to be absent.
                    Err(e) => {
                        tracing::warn!(family, "unmount: the shared store did not answer: {e}");
                        return Reply::store_unavailable();
                    }
                };
                if kept {
                    if let Err(e) = super::uploads::record_unmount(app, family) {
                        tracing::error!(family, "the kept upload was not dropped: {e:#}");
                        return Reply::error(500, "internal", "internal error");
                    }
                    crate::alerts::settled(family);
                    tracing::info!(family, "the kept upload the start refused was dropped through the admin API");
                    return Reply::json(
                        200,
                        &json!({"family": family, "unmounted": true, "kept_upload_dropped": true}),
                    );
                }
                return Reply::error(404, "not_found", format!("no plugin family {family}"));
            }
            let previous = app.runtime.previous(family);
            match app.runtime.unmount(family) {
                Ok(()) => {
                    crate::metrics::metrics().swap(family, "unmounted");
                    if let Err(e) = super::uploads::record_unmount(app, family) {
                        if app.storage.is_shared() {
                            return not_recorded(app, family, previous, "unmount", &e);
                        }
                        tracing::error!(family, "the unmount was not kept for restarts: {e:#}");
                    }
                    crate::alerts::settled(family);
                    Reply::json(200, &json!({"family": family, "unmounted": true}))
                }
                Err(e) => Reply::invalid("family", format!("{e:#}")),
            }
        }
        // Upstream mode: cash is minted at the upstream, not here.
        ("POST", ["admin", "cash", "mint"]) if app.upstream.is_some() => {
            crate::money::upstream::ledger_route(&*app.state)
                .unwrap_or_else(|| Reply::error(500, "internal", "internal error"))
        }
        ("GET", ["admin", "cash", "upstream-fees"]) => crate::money::upstream::fees(&*app.state),
        ("POST", ["admin", "cash", "mint"]) => {
            // A member this route does not know is refused, not ignored: a
            // misspelled `idempotency_key` would mint again on a retry.
            let request = match serde_json::from_slice::<serde_json::Value>(body) {
                Ok(serde_json::Value::Object(members)) => {
                    if let Some(other) = members
                        .keys()
                        .find(|k| !["amount", "idempotency_key"].contains(&k.as_str()))
                    {
                        return Reply::invalid(
                            other,
                            "is not a member of a mint: the body is {\"amount\": \"<decimal>\", \"idempotency_key\": \"<key>\"} (the key optional)",
                        );
                    }
                    serde_json::Value::Object(members)
                }
                Ok(serde_json::Value::Null) => serde_json::Value::Null,
                _ if body.iter().all(u8::is_ascii_whitespace) => serde_json::Value::Null,
                _ => {
                    return Reply::invalid(
                        "body",
                        "must be a JSON object: {\"amount\": \"<decimal>\", \"idempotency_key\": \"<key>\"}",
                    );
                }
            };
            let amount = match request.get("amount") {
                Some(serde_json::Value::String(a)) => a,
                // A number is refused, not read: 0.1 as a JSON number is
                // not the decimal the operator typed.
                Some(other) if !other.is_null() => {
                    return Reply::invalid(
                        "amount",
                        "must be a string of a decimal amount, as in {\"amount\": \"1.5\"}",
                    );
                }
                _ => {
                    return Reply::invalid(
                        "amount",
                        "is required: the body is {\"amount\": \"<decimal>\"}",
                    );
                }
            };
            let key = match request.get("idempotency_key") {
                None | Some(serde_json::Value::Null) => None,
                Some(serde_json::Value::String(k)) => match ledger::mint_key_problem(k) {
                    None => Some(k.as_str()),
                    Some(problem) => return Reply::invalid("idempotency_key", problem),
                },
                Some(_) => return Reply::invalid("idempotency_key", "must be a string"),
            };
            let outages = app.storage.outages();
            match marketplace_common::amount::parse(amount) {
                Ok(units) if units > 0 => match mint_with(app, units, key) {
                    Ok(secret) => Reply::json(200, &json!({"secret": secret})),
                    Err(e)
                        if e.downcast_ref::<crate::money::ledger::OutOfRange>()
                            .is_some() =>
                    {
                        Reply::invalid(
                            "amount",
                            format!(
                                "would take the total minted past what the ledger counts ({})",
                                marketplace_common::amount::format(u64::MAX)
                            ),
                        )
                    }
                    Err(e)
                        if e.downcast_ref::<ledger::MintKeyReused>().is_some()
                            || e.downcast_ref::<ledger::MintKeyOtherServerKey>().is_some() =>
                    {
                        Reply::error(409, "idempotency_conflict", e.to_string())
                    }
                    Err(e) => mint_failure(&e, app.storage.outages() != outages),
                },
                Ok(_) => Reply::invalid("amount", "must be positive"),
                Err(e) => Reply::invalid("amount", e.to_string()),
            }
        }
        ("POST", ["admin", "clock"]) if app.config.testing_routes => {
            let shift = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v.get("shift_ms").and_then(|s| s.as_i64()));
            match shift {
                Some(ms) => {
                    app.shift_clock(ms);
                    Reply::json(200, &json!({"now_ms": app.now_ms()}))
                }
                None => Reply::invalid("shift_ms", "is required: an integer"),
            }
        }
        _ => match admin_methods(app, segments.as_slice()) {
            Some(allowed) => Reply::method_not_allowed(method, path, &allowed),
            None => Reply::error(404, "not_found", format!("no admin route {method} {path}")),
        },
    }
}

/// The methods an admin path answers, if it is one (for 405 and `Allow`).
fn admin_methods(app: &App, segments: &[&str]) -> Option<Vec<&'static str>> {
    Some(match segments {
        ["admin", "plugins"] => vec!["GET"],
        ["admin", "plugins", _] => vec!["PUT", "DELETE"],
        ["admin", "cash", "mint"] => vec!["POST"],
        ["admin", "cash", "upstream-fees"] => vec!["GET"],
        ["admin", "backup"] | ["metrics"] => vec!["GET"],
        ["admin", "clock"] if app.config.testing_routes => vec!["POST"],
        _ => return None,
    })
}

/// Mint a secret worth `units` in its own transaction.
pub fn mint(app: &App, units: u64) -> Result<String> {
    mint_with(app, units, None)
}

/// Mint, with the operator's idempotency key when given: a repeat of the
/// same key and amount returns the same secret and mints nothing more
/// ([`ledger::Ledger::mint_with_key`]).
pub fn mint_with(app: &App, units: u64, key: Option<&str>) -> Result<String> {
    let (secret, minted) = app
        .storage
        .write(|txn| app.ledger.mint_with_key(txn, units, key))
        .map_err(anyhow::Error::from)??;
    let amount = marketplace_common::amount::format(units);
    if minted {
        tracing::info!(target: "admin", %amount, keyed = key.is_some(), "minted");
    } else {
        tracing::info!(target: "admin", %amount, "mint repeated: its idempotency key's secret again, nothing minted");
    }
    Ok(secret)
}

/// The answer to a mint that failed in storage: a mint that kept losing
/// races with other hosts' (a shared store; `storage.write` ran it again
/// first) is 503 `storage_conflict` with `Retry-After`, and nothing was
/// minted; a shared store that could not be reached while it ran
/// (`unreachable`) is 503 `store_unavailable`; anything else is a 500,
/// logged.
fn mint_failure(e: &anyhow::Error, unreachable: bool) -> Reply {
    if unreachable {
        crate::logging::request_error(true, None, &format!("mint failed: {e:#}"));
        return Reply::store_unavailable();
    }
    match e.downcast_ref::<crate::store::StorageError>() {
        Some(storage) => {
            if !matches!(storage, crate::store::StorageError::Conflict) {
                tracing::error!("mint failed: {e:#}");
            }
            crate::reply::storage_failure(storage)
        }
        None => {
            tracing::error!("mint failed: {e:#}");
            Reply::error(500, "internal", "internal error")
        }
    }
}

#[cfg(test)]
mod mint_tests {
    use super::*;
    use crate::store::StorageError;

    #[test]
    fn an_uploads_name_is_a_file_name_shown_as_written() {
        let of = |name: &str| component_of(&[("component".into(), name.into())]);
        assert_eq!(of("hello_v2.wasm"), Ok(Some("hello_v2.wasm".into())));
        for bad in [
            "",
            ".hidden.wasm",
            "a/b.wasm",
            "a\\b.wasm",
            "evil\u{202e}msa.exe",
            "a\nb",
            "zero\u{200b}width.wasm",
        ] {
            assert!(of(bad).is_err(), "{bad:?} taken");
        }
    }

    #[test]
    fn a_mint_that_kept_losing_races_is_503_with_retry_after() {
        let lost = mint_failure(&anyhow::Error::from(StorageError::Conflict), false);
        assert_eq!(lost.status, 503);
        assert!(
            lost.headers
                .iter()
                .any(|(k, v)| k == "retry-after" && v == "1")
        );
        let body: serde_json::Value = serde_json::from_slice(&lost.body).unwrap();
        assert_eq!(body["code"], "storage_conflict");
        let broken = mint_failure(
            &anyhow::Error::from(StorageError::Internal("disk".into())),
            false,
        );
        assert_eq!(broken.status, 500);
        assert_eq!(mint_failure(&anyhow::anyhow!("other"), false).status, 500);
        let away = mint_failure(
            &anyhow::Error::from(StorageError::Internal("closed".into())),
            true,
        );
        assert_eq!(away.status, 503);
        let body: serde_json::Value = serde_json::from_slice(&away.body).unwrap();
        assert_eq!(body["code"], "store_unavailable");
    }
}
