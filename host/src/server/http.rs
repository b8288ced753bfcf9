//! HTTP: hyper server, routing to families or native handlers, request
//! limits (connections, header and body timeouts, body size, concurrency
//! per family), request ids, metrics, JSON errors and one log line per
//! request.

use super::answers::Answer;
use super::checks::{
    as_get, content_codings_supported, declared_length, expectations_met, not_for_a_resource,
    options, request_host_problem, sent_by_another_site, transfer_codings_supported,
};
use super::connections::{Held, Open};
use super::gates::{BodyError, Gates, admit_waiting, busy, read_body, unless_giving_way};
use crate::app::App;
use crate::capabilities::{Capability, is_credential};
use crate::metrics::{RouteMetrics, metrics};
use crate::money::payments::PaymentReader;
use crate::reply::Reply;
use crate::runtime::Caller;
use crate::runtime::bindings::endpoint::marketplace::plugin::types as wit;
use crate::runtime::long_calls;
use crate::runtime::routes::{self, Handler, Match, Route};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument;

/// Serve HTTP on `listener` until `stop` turns true; then stop accepting,
/// let every connection finish the request it is serving (idle keep-alive
/// connections close after `drain_linger_ms` without a request, or once no
/// request runs when that is later, see [`drain_linger`]; connections with
/// a request already sent are served first, see [`super::drain`]) and
/// return; if `drain` runs out first, what is still open is cut (see
/// [`cut_off`]), with a `drain timeout` line.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
    drain: Duration,
) {
    let gates = Arc::new(Gates::new(&app, stop.clone()));
    let connections = Arc::new(Semaphore::new(app.config.max_connections as usize));
    let open = Open::new(app.config.max_connections_per_ip);
    long_calls::set_per_address(app.config.max_long_calls_per_ip);
    // Every connection's task: once the set is empty, every connection has
    // ended; past the drain, the ones left are cut (see `cut_off`).
    let mut tasks = tokio::task::JoinSet::new();
    let conn = Conn {
        app: app.clone(),
        gates,
        stop: stop.clone(),
        header_timeout: Duration::from_millis(app.config.header_timeout_ms),
        // Well inside the drain itself: with a short `drain_timeout_ms`
        // an idle connection must not outlive it (and read as a request
        // the drain gave up on).
        linger: app.config.drain_linger().0.min(drain / 2),
        linger_most: drain / 2,
    };
    let stopping = super::stopped(stop);
    tokio::pin!(stopping);
    loop {
        // (The signal first: once it came, connections are taken only
        // from the backlog, below.)
        let (stream, peer) = tokio::select! {
            biased;
            _ = &mut stopping => break,
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let Some(held) = admit(&open, peer) else {
            continue;
        };
        // A place under the connection cap. When every one is taken, room
        // is made: a connection not inside a request, of the address that
        // holds the most, is closed (see `connections`); when none can
        // give way, this client waits for a place.
        let permit = loop {
            if let Ok(p) = connections.clone().try_acquire_owned() {
                break Some(p);
            }
            if open.make_room(&held) {
                metrics().connections_closed_for_room.inc();
            }
            tokio::select! {
                biased;
                _ = &mut stopping => break None,
                p = connections.clone().acquire_owned() => match p {
                    Ok(p) => break Some(p),
                    Err(_) => break None,
                },
                // The one chosen may have declined (a request waited in
                // its socket): choose again (not while one chosen is
                // still closing, see `make_room`).
                () = tokio::time::sleep(ROOM_RETRY) => {}
            }
        };
        let Some(permit) = permit else {
            // Stopping: served like the clients in the backlog, below.
            conn.spawn(&mut tasks, stream, peer, held, None);
            break;
        };
        conn.spawn(&mut tasks, stream, peer, held, Some(permit));
        // (The ended ones' entries, so the set holds only the open.)
        while let Some(ended) = tasks.try_join_next() {
            said_if_panicked(ended);
        }
    }
    // Clients that connected before the signal and wait in the backlog
    // have sent their request, or are about to: they are served (past the
    // connection cap: the backlog bounds them), then the listener closes.
    let backlog = super::drain::take_backlog(listener);
    if !backlog.is_empty() {
        tracing::info!(
            connections = backlog.len(),
            "draining: serving the connections waiting in the listen backlog"
        );
    }
    for (stream, peer) in backlog {
        if let Some(held) = admit(&open, peer) {
            conn.spawn(&mut tasks, stream, peer, held, None);
        }
    }
    flush_refused();
    drop(conn);
    if tokio::time::timeout(drain, all_ended(&mut tasks))
        .await
        .is_ok()
    {
        return;
    }
    DRAIN_TIMED_OUT.store(true, std::sync::atomic::Ordering::Release);
    tracing::warn!(
        in_flight = metrics().in_flight.get(),
        drain_ms = drain.as_millis() as u64,
        "drain timeout: requests still running were not answered (a write already under way may still commit)"
    );
    cut_off(tasks).await;
}

/// The drain ran out: the connections still open are cut here, while the
/// runtime still runs, so that each request they were serving is dropped
/// and says so in the log (see [`InFlight`]) before the exit. A task
/// running a plugin call is dropped at its next yield, a task waiting on
/// a blocking call at once (the call itself is abandoned); on a machine
/// too busy to run the workers within [`CUT_WAIT`], the runtime's own
/// shutdown drops what is left.
async fn cut_off(mut tasks: tokio::task::JoinSet<()>) {
    tasks.abort_all();
    let _ = tokio::time::timeout(CUT_WAIT, all_ended(&mut tasks)).await;
}

/// Until every task of `tasks` has ended (one that panicked is said).
async fn all_ended(tasks: &mut tokio::task::JoinSet<()>) {
    while let Some(ended) = tasks.join_next().await {
        said_if_panicked(ended);
    }
}

/// A connection's task that panicked is said (its connection was closed
/// with it, its request unanswered).
fn said_if_panicked(ended: Result<(), tokio::task::JoinError>) {
    if let Err(e) = ended
        && e.is_panic()
    {
        tracing::error!("a connection's task panicked: its connection was closed");
    }
}

/// How long the cut connections' tasks get to be dropped.
const CUT_WAIT: Duration = Duration::from_secs(5);

/// The drain timed out: the requests still running are dropped with the
/// process, not by their clients (their log line says so).
static DRAIN_TIMED_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A place for a connection from `peer`'s address. One address may not
/// hold every connection (slow senders keeping sockets open): past its
/// share, `None`, counted and logged, and the caller drops the stream (so
/// it is closed at once).
fn admit(open: &Open, peer: std::net::SocketAddr) -> Option<Held> {
    let held = open.admit(peer.ip());
    if held.is_none() {
        tracing::debug!(%peer, "connection refused: this address holds max_connections_per_ip");
        metrics().refused_connections.inc();
        refused_now(peer);
    }
    held
}

/// Lines about connections refused for their address's share.
static REFUSED_LINES: crate::logging::Throttle = crate::logging::Throttle::new(REFUSED_LOG_EVERY);

/// Log a connection turned away for its address's share, at most once per
/// [`REFUSED_LOG_EVERY`] (a flood must not flood the log too), with how
/// many were since the last line; those held back are written when the
/// interval is over (or at shutdown, [`flush_refused`]), not only with the
/// next refusal.
fn refused_now(peer: std::net::SocketAddr) {
    use crate::logging::Noted;
    match REFUSED_LINES.note_deferred() {
        Noted::Now(refused) => tracing::warn!(%peer, refused, "{REFUSED_LINE}"),
        Noted::Later(wait) => {
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                flush_refused();
            });
        }
        Noted::Held => {}
    }
}

/// Write the refusals held back since the last line, if any.
fn flush_refused() {
    if let Some(refused) = REFUSED_LINES.flush() {
        tracing::warn!(refused, "{REFUSED_LINE}");
    }
}

const REFUSED_LINE: &str = "connections refused: their address holds max_connections_per_ip (counted in marketplace_connections_refused_total)";

/// At most one line per this long about refused connections.
const REFUSED_LOG_EVERY: Duration = Duration::from_secs(10);

/// How often a lingering connection looks whether the drain still serves
/// requests.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// How long a connection between requests stays open once the server
/// drains: `linger`, then on while any request is still being served, up
/// to `most` in all. The drain waits for those requests anyway, so a
/// keep-alive client whose next request comes late (one busy or slowed
/// down under load, that saw no `connection: close` on its last answer)
/// is answered instead of finding its connection closed; once nothing
/// runs, an idle connection closes within [`DRAIN_POLL`].
async fn drain_linger(linger: Duration, most: Duration) {
    let start = tokio::time::Instant::now();
    tokio::time::sleep(linger).await;
    while metrics().in_flight.get() > 0 && start.elapsed() < most {
        tokio::time::sleep(DRAIN_POLL).await;
    }
}

/// How long a client waits for the connection chosen to make room before
/// another is chosen.
const ROOM_RETRY: Duration = Duration::from_millis(100);

/// What every connection is served with.
struct Conn {
    app: Arc<App>,
    gates: Arc<Gates>,
    stop: watch::Receiver<bool>,
    header_timeout: Duration,
    /// How long a connection between requests stays open once the server
    /// drains (`drain_linger_ms`, or half the drain's time when that is
    /// shorter).
    linger: Duration,
    /// How long at most it stays open while other requests are still
    /// being served (half the drain's time; see [`drain_linger`]).
    linger_most: Duration,
}

impl Conn {
    /// Serve `stream` on a task of its own, holding its address's place
    /// and `permit` (a place under the connection cap) until it ends.
    fn spawn(
        &self,
        tasks: &mut tokio::task::JoinSet<()>,
        stream: tokio::net::TcpStream,
        peer: std::net::SocketAddr,
        held: Held,
        permit: Option<tokio::sync::OwnedSemaphorePermit>,
    ) {
        let _ = stream.set_nodelay(true);
        let socket = super::drain::Socket::of(&stream);
        // A trusted proxy's connection carries many clients: its drain
        // counts only against the whole.
        let drains_as = Some(peer.ip().to_canonical())
            .filter(|ip| !self.app.config.trusted_proxies.contains(*ip));
        let (app, gates) = (self.app.clone(), self.gates.clone());
        let state = held.state.clone();
        let service = service_fn(move |req: Request<Incoming>| {
            // Counted as hyper hands the request over, so a connection
            // chosen to make room is never closed inside a request (but
            // one still receiving its body, see `make_room`).
            state.request_started();
            let (app, gates, state) = (app.clone(), gates.clone(), state.clone());
            async move {
                let answered = handle(app, gates, req, peer.ip(), &state).await;
                state.request_answered();
                answered
            }
        });
        // No timer for hyper: the header timeout is `head_timeout`.
        let conn = http1::Builder::new()
            .max_buf_size(64 * 1024)
            .serve_connection(
                TokioIo::new(super::framing::JsonErrors::new(
                    super::linger::Lingering::new(
                        stream,
                        drains_as,
                        self.header_timeout,
                        Some(held.state.clone()),
                    ),
                    peer.ip(),
                )),
                service,
            );
        let stop = self.stop.clone();
        let header_timeout = self.header_timeout;
        let (linger, linger_most) = (self.linger, self.linger_most);
        tasks.spawn(async move {
            let open = OpenConnection::counted();
            tokio::pin!(conn);
            let state = held.state.clone();
            let head = head_timeout(&state, header_timeout, peer);
            tokio::pin!(head);
            let ended = loop {
                // (In order: no random pick at every poll.)
                tokio::select! {
                    biased;
                    ended = conn.as_mut() => break ended,
                    () = &mut head => break Ok(()),
                    () = state.closing() => {
                        // A request already in the socket (hyper has not
                        // read it yet) is not thrown away, and one that
                        // began since this connection was chosen (its
                        // head was read meanwhile) is not waited for: this
                        // one declines, and another is chosen. (Waiting
                        // would hold up every later choice: one is chosen
                        // at a time.)
                        if state.is_receiving() {
                            // Its request has not run: closed, with the
                            // body that was still coming.
                            tracing::debug!(%peer, "connection closed to make room: its request's body was still coming");
                            state.drop_receiving();
                            break Ok(());
                        }
                        if state.give_way_if_waiting() {
                            // Its request waits to be admitted (it has not
                            // run): answered 503 now, then closed (a
                            // request behind it in the socket is dropped
                            // unread: it never ran either).
                            tracing::debug!(%peer, "connection closed to make room: its request was waiting to be admitted");
                        } else if socket.request_waiting() || !state.between_requests() {
                            state.decline();
                            continue;
                        }
                        if state.never_requested() {
                            // Nothing of it was read: closed now.
                            tracing::debug!(%peer, "connection closed to make room: no request yet");
                            break Ok(());
                        }
                        // Between requests (or giving way): closed when
                        // idle, or after the answer it has begun meanwhile;
                        // one whose answer is not read within the header
                        // timeout is dropped.
                        conn.as_mut().graceful_shutdown();
                        break loop {
                            match tokio::time::timeout(header_timeout, conn.as_mut()).await {
                                Ok(ended) => break ended,
                                // Inside a request begun meanwhile: its
                                // answer first.
                                Err(_) if !state.between_requests() => {}
                                Err(_) => {
                                    tracing::debug!(%peer, "connection closed to make room: its answer was not read in time");
                                    break Ok(());
                                }
                            }
                        };
                    }
                    () = super::stopped(stop.clone()) => {
                        // Every answer from now on says `connection:
                        // close` (see `handle`), and the connection ends
                        // after it. One between requests lingers first: a
                        // keep-alive client that sent its next request as
                        // the signal came (on its way, not yet in the
                        // socket), or later while the drain still serves
                        // others, is answered, not reset.
                        let linger = drain_linger(linger, linger_most);
                        tokio::pin!(linger);
                        tokio::select! {
                            biased;
                            ended = conn.as_mut() => break ended,
                            () = &mut head => break Ok(()),
                            () = &mut linger => {}
                        }
                        // Still open: idle (closed now, unless a request
                        // is already in its socket) or inside a request
                        // (closed after its answer).
                        if !socket.request_waiting() {
                            conn.as_mut().graceful_shutdown();
                        }
                        // (The connection first: a request in its socket
                        // is read before the header timeout is looked at.)
                        break tokio::select! {
                            biased;
                            ended = conn.as_mut() => ended,
                            () = &mut head => Ok(()),
                        };
                    }
                }
            };
            if let Err(e) = ended {
                tracing::debug!(%peer, "connection ended: {e}");
            }
            drop(open);
            drop(held);
            drop(permit);
        });
    }
}

/// A connection counted in `marketplace_connections` while its task lives,
/// one cut by the drain (its task aborted) included.
struct OpenConnection;

impl OpenConnection {
    fn counted() -> Self {
        metrics().connections.inc();
        OpenConnection
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        metrics().connections.dec();
    }
}

/// Ends when the connection has waited `timeout` for a whole request
/// head: since it was admitted, or since the server last wrote to it
/// (see `State::head_due`). hyper's own header timeout would arm a timer
/// for every request (a sleep made, registered and dropped: 8 % of a host
/// route's instructions); this is one per connection, moved on only when
/// it ends.
async fn head_timeout(
    state: &super::connections::State,
    timeout: Duration,
    peer: std::net::SocketAddr,
) {
    let mut due = tokio::time::Instant::now() + timeout;
    loop {
        tokio::time::sleep_until(due).await;
        match state.head_due(timeout, std::time::Instant::now()) {
            Some(next) => due = next.into(),
            None => break,
        }
    }
    tracing::debug!(%peer, "connection closed: no whole request head within the header timeout ({timeout:?})");
}

pub(super) static X_REQUEST_ID: hyper::header::HeaderName =
    hyper::header::HeaderName::from_static("x-request-id");

/// A request id: the client's `X-Request-Id` when sane (1 to 128 of
/// `A-Za-z0-9._:-`), else a new one (unique within the process, random
/// across restarts).
pub(super) fn request_id(headers: &hyper::HeaderMap) -> String {
    static PREFIX: LazyLock<String> = LazyLock::new(|| {
        let mut b = [0u8; 4];
        crate::ids::fill_random(&mut b);
        marketplace_common::hex::encode(&b)
    });
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let given = headers
        .get(&X_REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| {
            (1..=128).contains(&v.len())
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
                // Logged with every line of the request: never a secret,
                // nor what may be one written otherwise (`e1_secret_<hex>`,
                // a bare 64-hex key).
                && !routes::may_hold_secret(v)
        });
    match given {
        Some(id) => id.to_string(),
        None => sequence_id(&PREFIX, SEQ.fetch_add(1, Ordering::Relaxed)),
    }
}

/// `{prefix}-{seq:08x}`, without the formatting machinery (it is made for
/// most requests).
fn sequence_id(prefix: &str, seq: u64) -> String {
    let digits = (16 - seq.leading_zeros() as usize / 4).max(8);
    let mut id = String::with_capacity(prefix.len() + 1 + digits);
    id.push_str(prefix);
    id.push('-');
    for i in (0..digits).rev() {
        id.push(char::from(
            b"0123456789abcdef"[(seq >> (4 * i)) as usize & 0xf],
        ));
    }
    id
}

/// A request counted in `marketplace_requests_in_flight` until it is
/// answered or its client goes away (hyper then drops the request's
/// future, and with it this guard): either way it stops counting, and a
/// request whose client left unanswered gets a log line of its own.
struct InFlight<'a> {
    app: &'a App,
    id: &'a str,
    method: &'a str,
    path: &'a str,
    client: IpAddr,
    start: Instant,
    conn: &'a super::connections::State,
    answered: bool,
}

impl<'a> InFlight<'a> {
    fn start(
        app: &'a App,
        id: &'a str,
        method: &'a str,
        path: &'a str,
        client: IpAddr,
        start: Instant,
        conn: &'a super::connections::State,
    ) -> Self {
        metrics().in_flight.inc();
        InFlight {
            app,
            id,
            method,
            path,
            client,
            start,
            conn,
            answered: false,
        }
    }

    fn answered(mut self) {
        self.answered = true;
        metrics().in_flight.dec();
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered {
            metrics().in_flight.dec();
            // (Rare: the route is looked up again for its logged form.)
            let route = match self
                .app
                .runtime
                .find(self.method, &routes::canonical_path(self.path))
            {
                routes::Match::Found { route, .. } => Some(route),
                _ => None,
            };
            let path = routes::logged(route.as_deref(), self.path).into_owned();
            let why = if self.conn.closed_for_room() {
                "closed to make room while its body was still coming (every connection place was taken); it did not run"
            } else if DRAIN_TIMED_OUT.load(std::sync::atomic::Ordering::Acquire) {
                "not answered: still running when the drain timed out and the server stopped (a write already under way may still commit)"
            } else {
                "the client went away before its answer"
            };
            tracing::info!(
                request_id = self.id,
                client = %self.client,
                method = self.method,
                path,
                micros = self.start.elapsed().as_micros() as u64,
                "request: {why}"
            );
        }
    }
}

async fn handle(
    app: Arc<App>,
    gates: Arc<Gates>,
    mut req: Request<Incoming>,
    peer: IpAddr,
    conn: &Arc<super::connections::State>,
) -> Result<Response<Answer>, Infallible> {
    let start = Instant::now();
    super::forwarded::drop_unproxied(&app.config.trusted_proxies, peer, req.headers_mut());
    let id = request_id(req.headers());
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let client = super::forwarded::client(&app.config.trusted_proxies, peer, req.headers());
    let in_flight = InFlight::start(&app, &id, &method, &path, client, start, conn);
    let has_body = !hyper::body::Body::is_end_stream(req.body());
    let from_a_page = req.headers().contains_key(hyper::header::ORIGIN);
    let asked = super::conditional::Asked::of(req.method(), req.headers());
    let (reply, route) = dispatch(&app, &gates, req, &id, client, conn).await;
    let mut reply = asked.apply(reply);
    in_flight.answered();
    // A large answer of a read waits for its client with room of its own,
    // or is refused: a write's answer is kept whatever (what it did is
    // done).
    let held = if reply.body.len() > super::answers::SMALL
        && method != "HEAD"
        && route.as_deref().is_none_or(|r| !r.writes)
    {
        match gates.unsent.hold(client, reply.body.len()) {
            Some(held) => Some(held),
            // Never to be sent, however long the client waits: not busy.
            None if reply.body.len() as u64 > gates.unsent.largest() => {
                tracing::warn!(
                    bytes = reply.body.len(),
                    largest = gates.unsent.largest(),
                    "an answer larger than one client may be sent at once (its address's share of max_unsent_answer_bytes) was refused"
                );
                reply = Reply::error(
                    500,
                    "internal",
                    format!(
                        "the answer is larger than this service sends to one client ({} bytes)",
                        gates.unsent.largest()
                    ),
                );
                None
            }
            None => {
                reply = busy(
                    "too many large answers are waiting for their clients to read them; retry shortly"
                        .into(),
                );
                None
            }
        }
    } else {
        None
    };
    // A request no route took (404, 405, 503 while loading) leaves its
    // body unread; while draining, no connection is kept for another.
    if (has_body && route.is_none()) || *gates.draining.borrow() {
        reply = reply.closing();
    }
    // Every answer of /mcp depends on Origin (CORS), the host's own too
    // (405, 413, a bad Host's 400): a cache must not give one origin's
    // answer to another. (Its route's pattern, or the path as routed when
    // no route took it: `/%6Dcp` is `/mcp`.)
    let mcp = match route.as_deref() {
        Some(r) => r.pattern == "/mcp",
        None => routes::canonical_path(&path) == "/mcp",
    };
    if mcp && reply.header("vary").is_none() {
        reply.headers.push(("vary".into(), "Origin".into()));
    }
    let elapsed = start.elapsed();
    // Requests no route took (404, 405, 503 while loading) count as `-`.
    static NO_ROUTE: LazyLock<RouteMetrics> = LazyLock::new(RouteMetrics::default);
    let (family, pattern, counted) = match route.as_deref() {
        Some(r) => (r.owner(), r.pattern.as_str(), &r.metrics),
        None => ("-", "-", &*NO_ROUTE),
    };
    counted.answered(family, pattern, reply.status, elapsed.as_secs_f64());
    let path = routes::logged(route.as_deref(), &path);
    crate::logging::access(
        &id,
        &crate::logging::Access {
            client,
            method: &method,
            path: &path,
            family,
            status: reply.status,
            micros: elapsed.as_micros() as u64,
        },
    );
    let mut resp = to_hyper(reply, method == "HEAD");
    if let Ok(id) = hyper::header::HeaderValue::from_maybe_shared(Bytes::from(id)) {
        resp.headers_mut().append(&X_REQUEST_ID, id);
    }
    if method == "GET" || method == "HEAD" {
        read_headers(resp.headers_mut(), !mcp, from_a_page);
    }
    Ok(match held {
        Some(held) => resp.map(|answer| answer.holding(held)),
        None => resp,
    })
}

/// What every answer to a read says unless its handler said otherwise:
/// `Cache-Control: no-cache` (what it answers changes with every write,
/// and a 200 or 404 without it may be kept by a shared cache for hours:
/// a contract's status polled through a CDN would stay `issued`), and
/// `Access-Control-Allow-Origin: *` with `Access-Control-Expose-Headers:
/// *` (`cors`: every path but `/mcp`, which answers CORS itself): every
/// read is public and none depends on a browser's cookies or credentials,
/// so a web page may read it, its `ETag`, `Content-Range` and request id
/// too. Those are said to a request from a page (`from_a_page`: it has an
/// `Origin`) and on every answer whose route chose how it is cached (an
/// attachment, a public file a CDN keeps for a year), so that a cache
/// that kept one for a client without an `Origin` serves a page a copy it
/// can read; an answer left `no-cache` is asked for again at every use,
/// with the page's `Origin`. (Said on every answer they cost the host
/// route about 8 % more server CPU.)
fn read_headers(headers: &mut hyper::HeaderMap, cors: bool, from_a_page: bool) {
    use hyper::header::{
        ACCESS_CONTROL_ALLOW_ORIGIN, ACCESS_CONTROL_EXPOSE_HEADERS, CACHE_CONTROL, HeaderValue,
    };
    let route_caches = headers.contains_key(CACHE_CONTROL);
    if !route_caches {
        headers.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    if cors && (from_a_page || route_caches) {
        headers
            .entry(ACCESS_CONTROL_ALLOW_ORIGIN)
            .or_insert(HeaderValue::from_static("*"));
        headers
            .entry(ACCESS_CONTROL_EXPOSE_HEADERS)
            .or_insert(HeaderValue::from_static("*"));
    }
}

pub(crate) fn to_hyper(reply: Reply, head: bool) -> Response<Answer> {
    use hyper::header::{CONTENT_TYPE, HeaderName, HeaderValue};
    // An answer with no body (a 202 notification, a 304) names no media
    // type unless its handler gave one; every other answer is JSON unless
    // it says otherwise (a HEAD keeps what its GET would say).
    // (A 204 or 304 carries no body, whatever its handler gave; nor does
    // a 205, RFC 9110 15.3.6, which says so with a zero length.)
    let typed = !reply.body.is_empty() && !matches!(reply.status, 204 | 205 | 304);
    // A HEAD answer names the length its GET's body would have (an empty
    // one too), where a body may be at all.
    let head_length = (head && !matches!(reply.status, 100..=199 | 204 | 304)).then_some(
        if reply.status == 205 {
            0
        } else {
            reply.body.len()
        },
    );
    let body = if head || reply.status == 205 {
        Bytes::new()
    } else {
        Bytes::from(reply.body)
    };
    let mut resp = Response::new(Answer::new(body));
    *resp.status_mut() =
        StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let headers = resp.headers_mut();
    // Room for the handler's headers, the content type or length added
    // below, the request id and a read's headers `handle` adds: the map
    // grows no more.
    headers.reserve(reply.headers.len() + 6);
    for (name, value) in reply.headers {
        match (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(Bytes::from(value)),
        ) {
            (Ok(name), Ok(value)) => {
                headers.append(name, value);
            }
            _ => {
                tracing::error!("invalid response from handler: header {name:?} or its value");
                let mut resp = Response::new(Answer::new(Bytes::from_static(
                    br#"{"code":"internal","message":"internal error"}"#,
                )));
                *resp.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                resp.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
                return resp;
            }
        }
    }
    if typed && !headers.contains_key(CONTENT_TYPE) {
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    }
    if let Some(length) = head_length {
        headers.insert(hyper::header::CONTENT_LENGTH, HeaderValue::from(length));
    }
    resp
}

/// Route one request; returns the reply and the family (or host handler)
/// that served it. A found route is served in the request's span (lines
/// logged while serving it carry its id), except a host route answered
/// from memory, which logs nothing of its own.
async fn dispatch(
    app: &Arc<App>,
    gates: &Gates,
    mut req: Request<Incoming>,
    id: &str,
    client: IpAddr,
    conn: &Arc<super::connections::State>,
) -> (Reply, Option<Arc<Route>>) {
    if let Some(problem) = request_host_problem(&mut req) {
        return (Reply::invalid("host", problem), None);
    }
    if !expectations_met(req.headers()) {
        let reply = Reply::error(
            417,
            "expectation_failed",
            "the only expectation this service meets is `Expect: 100-continue`",
        );
        return (reply, None);
    }
    if !transfer_codings_supported(req.headers()) {
        let reply = Reply::error(
            501,
            "not_implemented",
            "the only transfer coding this service reads is `chunked`, applied once",
        );
        return (reply, None);
    }
    // Methods are case-sensitive (RFC 9110 9.1): `get` is not GET, and is
    // answered as a method the resource does not take.
    let method = req.method().as_str().to_string();
    if let Some(reply) = not_for_a_resource(app, &method, req.uri()) {
        return (reply, None);
    }
    let path = routes::canonical_path(req.uri().path());
    let table = app.runtime.served().table.clone();
    let (route, params) = match table.find(&method, &path) {
        Match::Found { route, params } => (route, params),
        // While the families load, the path may be one of theirs.
        Match::NotFound if app.runtime.loading() => {
            let reply = Reply::error(
                503,
                "plugin_unavailable",
                "the service is starting: its components are still loading",
            );
            return (reply.retry_after_a_second(), None);
        }
        Match::NotFound => {
            return (Reply::no_route(as_get(&method), req.uri().path(), ""), None);
        }
        Match::MethodNotAllowed(allowed) if method == "OPTIONS" => {
            return (options(&allowed, req.headers()), None);
        }
        Match::MethodNotAllowed(allowed) => {
            // (With OPTIONS: RFC 9110 15.5.6's list is of every method the
            // resource supports, in `Allow` and the body alike.)
            let reply = Reply::method_not_allowed(
                as_get(&method),
                &crate::logging::clip(req.uri().path(), crate::logging::SHOWN_PATH),
                &allowed,
            );
            return (reply, None);
        }
    };
    if route.writes && path != "/mcp" && sent_by_another_site(req.headers()) {
        return (
            Reply::error(
                403,
                "cross_site_request",
                "a web page of another site may not send this service a write: its browser said so (Sec-Fetch-Site)",
            ),
            Some(route),
        );
    }
    let from_memory = matches!(&route.handler,
        Handler::Host(name) if crate::runtime::native::runs_inline(&app.runtime, name));
    let span = if from_memory {
        tracing::Span::none()
    } else {
        crate::logging::request_span(id)
    };
    let served_by = Some(route.clone());
    // The path as the client wrote it, when an `/api/v1` alias: what a
    // 402's x402 resource names.
    let alias = (req.uri().path() != path).then(|| (path.clone(), req.uri().path().to_string()));
    let found = Found {
        route,
        table,
        params,
        method,
        path,
        from_memory,
    };
    let outages = app.storage.outages();
    // Boxed: held by value, the route's future (about 1.9 KB) was copied
    // into each future above it, and those (5.2 KB) on to hyper's.
    let mut reply =
        Box::pin(serve_route(app, gates, req, found, client, conn).instrument(span)).await;
    if let Some((routed, asked)) = alias {
        crate::money::x402::name_resource(&mut reply, &routed, &asked);
    }
    // A 500 while the shared store could not be reached is that outage's
    // (the plugin saw storage errors): say so, with when to try again.
    if reply.status == 500 && app.storage.outages() != outages {
        reply = Reply::store_unavailable();
    }
    (reply, served_by)
}

/// The answer to a family's request whose route a change of components
/// took away, or gave another family or another declaration, while its
/// body came in or it waited its turn: as the table in force now answers
/// (404, 405), or 503 to send it again (the new route may read it
/// otherwise). None when the route stands: the request runs on the
/// family's component in force, which declares it (an outside probe saw a
/// swapped-in component handed a route it did not declare).
fn moved_meanwhile(
    app: &App,
    routed: &Arc<routes::Table>,
    route: &Route,
    method: &str,
    path: &str,
) -> Option<Reply> {
    let Handler::Family(family) = &route.handler else {
        return None;
    };
    let now = app.runtime.served();
    // (A new version declaring the same api keeps the table.)
    if Arc::ptr_eq(&now.table, routed) {
        return None;
    }
    match now.table.find(method, path) {
        Match::Found { route: r, .. }
            if r.handler == route.handler
                && r.pattern == route.pattern
                && r.writes == route.writes
                && r.paid == route.paid
                && r.max_body == route.max_body
                && r.query == route.query =>
        {
            None
        }
        Match::NotFound => {
            let why = app
                .runtime
                .plugin(family)
                .is_none()
                .then(|| format!(": the {family} family was unmounted"));
            Some(Reply::no_route(
                as_get(method),
                path,
                why.as_deref().unwrap_or(""),
            ))
        }
        Match::MethodNotAllowed(allowed) => Some(Reply::method_not_allowed(
            as_get(method),
            &crate::logging::clip(path, crate::logging::SHOWN_PATH),
            &allowed,
        )),
        Match::Found { .. } => Some(
            Reply::error(
                503,
                "plugin_unavailable",
                "the components changed while this request waited its turn, and its route with them: send it again",
            )
            .retry_after_a_second(),
        ),
    }
}

/// A request's route, its parameters, its method (upper case) and its
/// canonical path.
struct Found {
    route: Arc<Route>,
    /// The route table it was found in.
    table: Arc<routes::Table>,
    params: Vec<(String, String)>,
    method: String,
    path: String,
    /// A host route answered from memory, on this worker.
    from_memory: bool,
}

/// Serve a request on the route found for it.
async fn serve_route(
    app: &Arc<App>,
    gates: &Gates,
    req: Request<Incoming>,
    found: Found,
    client: IpAddr,
    conn: &Arc<super::connections::State>,
) -> Reply {
    let Found {
        route,
        table,
        params,
        method,
        path,
        from_memory,
    } = found;
    // 413 is decided from a declared length before the body is read; a
    // chunked body is cut off at the same limit while reading.
    let max = route.max_body.unwrap_or(app.config.max_body_bytes);
    if declared_length(req.headers()).is_some_and(|n| n > max as u64) {
        return too_large(max);
    }
    if !content_codings_supported(req.headers()) {
        let mut reply = Reply::error(
            415,
            "unsupported_media_type",
            "a request body is read as sent: no content coding (Content-Encoding: gzip, ...) is decoded; send it uncompressed",
        ).closing();
        reply
            .headers
            .push(("accept-encoding".into(), "identity".into()));
        return reply;
    }
    let query = match req
        .uri()
        .query()
        .map(marketplace_common::url::parse_query)
        .transpose()
    {
        Ok(query) => query.unwrap_or_default(),
        Err(name) => return Reply::invalid(&name, routes::NOT_UTF8),
    };
    if let Some(name) = routes::param_not_utf8(&route.pattern, &path) {
        return Reply::invalid(name, routes::NOT_UTF8);
    }
    if let Some(name) = route.repeated_query(&query) {
        return Reply::invalid(name, crate::runtime::routes::REPEATED);
    }
    // Refused before its body is read: the connection closes after.
    if let Some(refused) = Reply::refusing_writes(&app.storage, route.writes) {
        let ended = hyper::body::Body::is_end_stream(req.body());
        return if ended { refused } else { refused.closing() };
    }
    // A host handler reads none of them.
    let (headers, payment) = match &route.handler {
        Handler::Family(family) => component_headers(app, family, req.headers()),
        Handler::Host(_) => Default::default(),
    };
    let body_timeout = Duration::from_millis(app.config.body_timeout_ms);
    let family_gates = match &route.handler {
        Handler::Family(family) => Some(gates.family(app, family)),
        Handler::Host(_) => None,
    };
    // Most reads carry no body at all: no timer, no copy.
    let no_body = hyper::body::Body::is_end_stream(req.body());
    // A body counts, as it arrives and until its request runs, against
    // `max_pending_body_bytes` and its family's share of it.
    let large = max > app.config.max_body_bytes;
    let mut pending = (!no_body).then(|| gates.pending_body(family_gates.as_ref(), large, client));
    let body = match &mut pending {
        None => Ok(Ok(Vec::new())),
        Some(pending) => {
            // Meanwhile the connection may be closed to make room.
            let _receiving = conn.receiving_body();
            tokio::time::timeout(body_timeout, read_body(req.into_body(), max, pending)).await
        }
    };
    let body = match body {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => return too_large(max),
        Ok(Err(BodyError::Busy)) => {
            // (Its body not read whole: the connection closes after.)
            return busy(
                "too many request bodies are being received or waiting for a slot; retry shortly"
                    .into(),
            )
            .closing();
        }
        Ok(Err(BodyError::Read(e))) => {
            // (A body hyper cannot frame ends its connection: said so.)
            return Reply::invalid("body", format!("could not be read: {e}")).closing();
        }
        Err(_) => return body_late(body_timeout),
    };
    // A family's request is admitted (a slot of its family and of the
    // pool) once its body is in: a client sending its body slowly, or not
    // at all until the body timeout, holds no slot meanwhile, so such
    // clients (up to the connection limits) cannot keep a family's
    // requests from running.
    // A client whose calls already run long waits first, holding no slot
    // (see `long_calls`). While it waits, its connection may be chosen to
    // make room: then it gives its place up, answered 503. (Most are
    // admitted at once: nothing waited for, nothing noted.)
    let (counted, permits, turn_waited) = match (&route.handler, family_gates) {
        (Handler::Family(family), Some(g)) => {
            let at_once = long_calls::no_address_turns()
                .then(|| gates.try_enter(&g, route.writes))
                .flatten();
            match at_once {
                Some(permits) => (None, Some(permits), Duration::ZERO),
                None => {
                    match admit_waiting(app, gates, family, g, route.writes, client, conn).await {
                        Ok((counted, permits, waited)) => (counted, Some(permits), waited),
                        Err(refused) => return refused,
                    }
                }
            }
        }
        _ => (None, None, Duration::ZERO),
    };
    // A host route that works on its body waits its turn with it still
    // counted.
    // Meanwhile, as a family's request waiting, it may give way.
    let host_slot = match &route.handler {
        Handler::Host(name) if crate::runtime::native::parses_body(name) && !body.is_empty() => {
            let slots = &gates.host_bodies;
            match slots.clone().try_acquire_owned() {
                Ok(slot) => Some(slot),
                Err(_) => {
                    let turn = async { Ok(slots.clone().acquire_owned().await.ok()) };
                    match unless_giving_way(conn, turn).await {
                        Ok(slot) => slot,
                        Err(gave_way) => return gave_way,
                    }
                }
            }
        }
        _ => None,
    };
    if let Some(moved) = moved_meanwhile(app, &table, &route, &method, &path) {
        return moved;
    }
    // Running: its body is the running request's now (bounded by the pool).
    drop(pending);

    let span = tracing::Span::current();
    match &route.handler {
        // Answered from memory: no hand-off to a blocking thread.
        Handler::Host(name) if from_memory => {
            crate::runtime::native::handle(&app.runtime, name, &body)
        }
        Handler::Host(name) => {
            let (app2, name) = (app.clone(), *name);
            match tokio::task::spawn_blocking(move || {
                // Held by the work itself: a client that goes away drops
                // this future, not the work.
                let _slot = host_slot;
                span.in_scope(|| crate::runtime::native::handle(&app2.runtime, name, &body))
            })
            .await
            {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::error!("host handler {name} failed: {e}");
                    Reply::error(500, "internal", "internal error")
                }
            }
        }
        Handler::Family(family) => {
            let request = wit::Request {
                method: if method == "HEAD" {
                    "GET".into()
                } else {
                    method.clone()
                },
                route: route.pattern.clone(),
                path,
                params,
                query,
                headers,
                body,
            };
            let writes = route.writes;
            let inline = app.runtime.runs_inline(writes);
            // Counted already (admitted while its address had long calls):
            // the call does not count itself again.
            let caller = Caller {
                client: Some(client).filter(|_| counted.is_none()),
                source: Some(client),
                turn_waited,
                ..Caller::default()
            };
            let result = if inline && writes {
                app.runtime
                    .write_as_task(family, request, payment, caller, span)
                    .await
                    .map_err(|e| e.to_string())
            } else if inline {
                // On this worker: no hand-off to a blocking thread. A
                // panic is caught as the blocking pool would catch it.
                // Boxed: the call's future is about 10 KB, and held by
                // value it made every future above it (this one, the
                // connection's) as large, moved by hyper and tokio at
                // each request: 23-47 KB of memcpy per request.
                use futures_util::FutureExt;
                std::panic::AssertUnwindSafe(Box::pin(
                    app.runtime
                        .handle_inline(family, request, payment, false, caller),
                ))
                .catch_unwind()
                .await
                .map_err(|_| "panicked".to_string())
            } else {
                let app2 = app.clone();
                let family_name = family.clone();
                tokio::task::spawn_blocking(move || {
                    span.in_scope(|| {
                        app2.runtime
                            .handle_from(&family_name, request, payment, writes, caller)
                    })
                })
                .await
                .map_err(|e| e.to_string())
            };
            drop(permits);
            drop(counted);
            match result {
                Ok(reply) => reply,
                Err(e) => {
                    tracing::error!(family = %family, "plugin task failed: {e}");
                    Reply::error(500, "internal", "internal error")
                }
            }
        }
    }
}

/// What a family's component gets of a request's headers, and its
/// payment (whose headers no component sees).
fn component_headers(
    app: &App,
    family: &str,
    from: &hyper::HeaderMap,
) -> (
    Vec<(String, String)>,
    crate::money::payments::PaymentHeaders,
) {
    let (mut headers, mut credentials) = (Vec::new(), Vec::new());
    let mut payment = PaymentReader::default();
    for (name, value) in from {
        let name = name.as_str();
        if payment.read(name, value.to_str().ok()) {
            continue;
        }
        // A value of other bytes than visible ASCII is passed on as text
        // (UTF-8 as it is, other bytes as U+FFFD), not dropped: a header
        // present but unreadable must not read as absent (an `Origin:
        // http://\xff` was taken as no Origin by /mcp's check, which lets
        // only those through).
        let value = match value.to_str() {
            Ok(v) => v.to_string(),
            Err(_) => String::from_utf8_lossy(value.as_bytes()).into_owned(),
        };
        if is_credential(name) {
            credentials.push((name.to_string(), value));
        } else {
            headers.push((name.to_string(), value));
        }
    }
    // Absolute URLs in answers are the configured origin's.
    if let Some(public) = &app.config.public_url {
        public.apply(&mut headers);
    }
    // The client's credentials reach only a family granted them.
    if !credentials.is_empty() && app.runtime.granted(family, Capability::Credentials) {
        headers.append(&mut credentials);
    }
    (headers, payment.finish())
}

/// 408 `request_timeout`: the body did not arrive within `limit`; the
/// connection closes.
pub(crate) fn body_late(limit: Duration) -> Reply {
    Reply::error(
        408,
        "request_timeout",
        format!(
            "the request body did not arrive within {} ms",
            limit.as_millis()
        ),
    )
    .closing()
}

/// 413 `payload_too_large`, answered before the body is read.
pub(crate) fn too_large(max: usize) -> Reply {
    Reply::json(
        413,
        &json!({
            "code": "payload_too_large",
            "message": format!("request body exceeds {max} bytes"),
            "max_bytes": max,
        }),
    )
    .closing()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(headers: &[(&str, &str)]) -> Reply {
        Reply {
            status: 201,
            headers: headers
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: b"<p>hi</p>".to_vec(),
        }
    }

    #[test]
    fn replies_become_responses_with_their_headers_and_a_default_type() {
        let r = to_hyper(
            reply(&[
                ("X-Request-Id", "a-1"),
                ("set-cookie", "a"),
                ("set-cookie", "b"),
            ]),
            false,
        );
        assert_eq!(r.status(), 201);
        assert_eq!(r.headers()["x-request-id"], "a-1");
        assert_eq!(r.headers().get_all("set-cookie").iter().count(), 2);
        assert_eq!(r.headers()["content-type"], "application/json");
        let r = to_hyper(reply(&[("Content-Type", "text/html")]), true);
        assert_eq!(r.headers()["content-type"], "text/html");
        assert_eq!(r.headers().get_all("content-type").iter().count(), 1);
        assert!(hyper::body::Body::is_end_stream(r.body()), "HEAD: no body");
        for bad in [("bad name", "x"), ("x-ok", "line\nbreak")] {
            let r = to_hyper(reply(&[("x-first", "1"), bad]), false);
            assert_eq!(r.status(), 500, "{bad:?}");
            assert!(r.headers().get("x-first").is_none());
            assert_eq!(r.headers()["content-type"], "application/json");
        }
        // No body (a 304, a 202 notification): no media type is made up.
        let empty = Reply {
            status: 304,
            headers: vec![("etag".into(), "\"a\"".into())],
            body: vec![],
        };
        let r = to_hyper(empty, false);
        assert_eq!(r.status(), 304);
        assert!(r.headers().get("content-type").is_none());
        assert_eq!(r.headers()["etag"], "\"a\"");
        // A 205 says its client has nothing to show: no body, a zero
        // length, whatever its handler gave (RFC 9110 15.3.6).
        let reset = Reply {
            status: 205,
            headers: vec![],
            body: b"{}".to_vec(),
        };
        let r = to_hyper(reset, false);
        assert_eq!(r.status(), 205);
        assert!(hyper::body::Body::is_end_stream(r.body()), "no body");
        assert!(r.headers().get("content-type").is_none());
    }

    #[test]
    fn sequence_ids_are_the_prefix_and_at_least_eight_hex_digits() {
        for seq in [
            0,
            1,
            0xabc,
            0xffff_ffff,
            0x1_0000_0000,
            0x1234_5678_9abc,
            u64::MAX,
        ] {
            assert_eq!(sequence_id("8beb27e6", seq), format!("8beb27e6-{seq:08x}"));
        }
    }
}
