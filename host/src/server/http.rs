//! HTTP: hyper server, routing to families or native handlers, request
//! limits (connections, header and body timeouts, body size, concurrency
//! per family), request ids, metrics, JSON errors and one log line per
//! request.

use super::answers::Answer;
use super::connections::{Held, Open};
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
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::json;
use std::collections::HashMap;
use std::convert::Infallible;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tracing::Instrument;

/// Concurrency gates: the instance pool shared by every family; a gate
/// for read (non-writing) routes that leaves part of the pool to writes, so
/// free work (searches, macros that may run for 500 ms) can never hold every
/// slot while paid writes wait; and a gate per family (its
/// `max_concurrent`, by default half the pool).
struct Gates {
    pool: Arc<Semaphore>,
    reads: Arc<Semaphore>,
    // (foldhash: looked up per request, where SipHash cost ~200
    // instructions; the keys are the host's own family names.)
    families: std::sync::Mutex<HashMap<String, Arc<FamilyGates>, foldhash::fast::RandomState>>,
    /// KiB of request bodies held before their request runs (being
    /// received, or waiting for a slot): `max_pending_body_bytes`.
    bodies: Arc<Budget>,
    /// The same KiB by client address: [`address_body_share`] each (none
    /// counted with `max_connections_per_ip = 0`).
    bodies_by_address: Option<Arc<super::shares::Shares>>,
    /// True once the server drains: every answer then closes its
    /// connection.
    draining: watch::Receiver<bool>,
    /// Host routes that work on their body ([`crate::runtime::native::parses_body`])
    /// running at once: [`host_body_slots`]. The memory a handler
    /// works in is some times its body's, which is only budgeted while it
    /// waits; a request waiting here keeps its body counted.
    host_bodies: Arc<Semaphore>,
    /// Bytes of large answers of reads not sent yet:
    /// `max_unsent_answer_bytes` ([`super::answers`]).
    unsent: Arc<super::answers::Unsent>,
}

/// Host handlers with a body that run at once: CPU-bound work on blocking
/// threads, so more than a few per core only adds memory (each parses
/// up to `max_body_bytes` of JSON and builds its answer).
fn host_body_slots() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 4
}

/// Pool slots only writes may take: a quarter of the pool, at least one
/// (none with a pool of one).
pub fn write_reserve(max_instances: u32) -> u32 {
    if max_instances < 2 {
        0
    } else {
        (max_instances / 4).max(1)
    }
}

/// A family's gates: its `max_concurrent` slots, and its share of the
/// KiB of bodies held before their request runs: one for its routes of
/// the usual body limit, another as large for those that declare a larger
/// one (uploads), so stalled large bodies cannot keep out its small
/// requests (an identity's registration behind 17 trickled 8 MiB uploads
/// to made-up tokens).
struct FamilyGates {
    slots: Arc<Semaphore>,
    bodies: Budget,
    large_bodies: Budget,
}

impl FamilyGates {
    fn bodies(&self, large: bool) -> &Budget {
        if large {
            &self.large_bodies
        } else {
            &self.bodies
        }
    }
}

/// KiB, as the body budgets count.
fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// A family's share of `max_pending_body_bytes` (KiB of `total`): its
/// `max_concurrent`'s share of the pool (half by default), so one
/// family's senders leave the rest to the others; at least room for two
/// bodies of the largest size a route may take, so one stalled body
/// cannot keep out a body of that size.
pub fn family_body_share(total: u32, limit: u32, max_instances: u32, max_body_bytes: usize) -> u32 {
    let share = u64::from(total) * u64::from(limit) / u64::from(max_instances.max(1));
    u32::try_from(share)
        .unwrap_or(u32::MAX)
        .max(kib(crate::config::largest_body_bytes(max_body_bytes) as u64).saturating_mul(2))
        .min(total)
}

/// An address's share of `max_pending_body_bytes` (KiB of `total`): an
/// eighth, at least room for two bodies of the largest size a route may
/// take (or the whole when that is less), so that the stalled bodies of
/// a few addresses cannot keep every other client's bodies out of a
/// family.
pub fn address_body_share(total: u32, max_body_bytes: usize) -> u32 {
    let two_largest =
        kib(crate::config::largest_body_bytes(max_body_bytes) as u64).saturating_mul(2);
    (total / 8).max(two_largest).min(total)
}

/// KiB that requests take and give back; never waited for (a body that
/// finds no room is refused), so an atomic count does.
struct Budget(std::sync::atomic::AtomicU32);

impl Budget {
    fn new(kib: u32) -> Budget {
        Budget(std::sync::atomic::AtomicU32::new(kib))
    }

    /// Take `n` KiB, if there are.
    fn take(&self, n: u32) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    fn give(&self, n: u32) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The bytes of one request's body held before it runs, counted in KiB
/// of what is allocated for it, as it arrives (a body sent slowly holds
/// only what came), against its family's share (none for a host route)
/// and the whole budget, and given back when it runs or ends.
struct PendingBody {
    family: Option<Arc<FamilyGates>>,
    /// Of a route that declares a larger body limit than `max_body_bytes`.
    large: bool,
    all: Arc<Budget>,
    /// The sender's address and the shares by address, if counted.
    client: IpAddr,
    by_address: Option<Arc<super::shares::Shares>>,
    kib: u32,
}

impl PendingBody {
    /// Count the body's first `bytes`: false when the family's share or
    /// the whole budget has no room for them.
    fn cover(&mut self, bytes: usize) -> bool {
        let need = kib(bytes as u64);
        if need <= self.kib {
            return true;
        }
        let more = need - self.kib;
        if let Some(f) = &self.family
            && !f.bodies(self.large).take(more)
        {
            return false;
        }
        let give_back_family = || {
            if let Some(f) = &self.family {
                f.bodies(self.large).give(more);
            }
        };
        if !self.all.take(more) {
            give_back_family();
            return false;
        }
        if let Some(shares) = &self.by_address
            && !shares.take(Some(self.client), u64::from(more))
        {
            self.all.give(more);
            give_back_family();
            return false;
        }
        self.kib = need;
        metrics().pending_body_bytes.inc_by(i64::from(more) * 1024);
        true
    }
}

impl Drop for PendingBody {
    fn drop(&mut self) {
        if self.kib > 0 {
            if let Some(f) = &self.family {
                f.bodies(self.large).give(self.kib);
            }
            self.all.give(self.kib);
            if let Some(shares) = &self.by_address {
                shares.give(Some(self.client), u64::from(self.kib));
            }
            metrics()
                .pending_body_bytes
                .dec_by(i64::from(self.kib) * 1024);
        }
    }
}

/// Why a body was not read whole.
enum BodyError {
    TooLarge,
    /// The pending-body budget had no room.
    Busy,
    Read(hyper::Error),
}

/// Read `body` whole, at most `max` bytes, counting what is allocated for
/// it into `pending` as it arrives.
async fn read_body(
    mut body: Incoming,
    max: usize,
    pending: &mut PendingBody,
) -> Result<Vec<u8>, BodyError> {
    // Room for its first bytes before any is asked for: a client that
    // sent `Expect: 100-continue` is refused without sending the body.
    if !pending.cover(1) {
        return Err(BodyError::Busy);
    }
    let mut out: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue;
        };
        let len = out.len() + data.len();
        if len > max {
            return Err(BodyError::TooLarge);
        }
        if len > out.capacity() {
            // Grown as a Vec grows (at most `max`), and counted so.
            let capacity = len.max(out.capacity() * 2).min(max);
            if !pending.cover(capacity) {
                return Err(BodyError::Busy);
            }
            out.reserve_exact(capacity - out.len());
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// A family's `max_concurrent` when its configuration gives none: half the
/// pool (at least one), so that one family's requests (a flood of runaway
/// ones, each holding its slot until its deadline) cannot take every slot
/// other families' reads may use.
pub fn default_family_limit(max_instances: u32) -> u32 {
    (max_instances / 2).max(1)
}

/// Longest a request waits for one of its family's `max_concurrent` slots
/// (five plugin deadlines, at least a second): past it the family is
/// busy, 503 with Retry-After, rather than a queue without end behind
/// slow requests of that family.
fn family_wait(app: &App) -> Duration {
    Duration::from_millis(app.config.request_timeout_ms)
        .saturating_mul(5)
        .max(Duration::from_secs(1))
}

/// The permits a request holds while it runs.
struct Admitted {
    _pool: OwnedPermit,
    _read: Option<OwnedPermit>,
    _family: OwnedPermit,
}

impl Gates {
    fn new(app: &App, draining: watch::Receiver<bool>) -> Gates {
        let pool = app.config.max_instances;
        Gates {
            pool: Arc::new(Semaphore::new(pool as usize)),
            reads: Arc::new(Semaphore::new((pool - write_reserve(pool)) as usize)),
            families: std::sync::Mutex::new(HashMap::default()),
            bodies: Arc::new(Budget::new(kib(app.config.pending_body_budget()))),
            // None per address where the operator counts no address
            // (`max_connections_per_ip = 0`: every client may come
            // through one proxy that is not a trusted one).
            bodies_by_address: (app.config.max_connections_per_ip != 0).then(|| {
                Arc::new(super::shares::Shares::new(
                    u64::MAX,
                    u64::from(address_body_share(
                        kib(app.config.pending_body_budget()),
                        app.config.max_body_bytes,
                    )),
                ))
            }),
            draining,
            host_bodies: Arc::new(Semaphore::new(host_body_slots())),
            unsent: super::answers::Unsent::new(app.config.max_unsent_answer_bytes),
        }
    }

    /// `family`'s gates, made at its first request.
    fn family(&self, app: &App, family: &str) -> Arc<FamilyGates> {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = families.get(family) {
            return g.clone();
        }
        let limit = app
            .config
            .family(family)
            .and_then(|f| f.max_concurrent)
            .unwrap_or_else(|| default_family_limit(app.config.max_instances));
        let share = family_body_share(
            kib(app.config.pending_body_budget()),
            limit,
            app.config.max_instances,
            app.config.max_body_bytes,
        );
        let g = Arc::new(FamilyGates {
            slots: Arc::new(Semaphore::new(limit as usize)),
            bodies: Budget::new(share),
            large_bodies: Budget::new(share),
        });
        families.insert(family.to_string(), g.clone());
        g
    }

    /// A body to count before its request runs: of a family's (`gates`;
    /// `large` for a route that declares a larger limit than the usual),
    /// or of a host route's.
    fn pending_body(
        &self,
        gates: Option<&Arc<FamilyGates>>,
        large: bool,
        client: IpAddr,
    ) -> PendingBody {
        PendingBody {
            family: gates.cloned(),
            large,
            all: self.bodies.clone(),
            client,
            by_address: self.bodies_by_address.clone(),
            kib: 0,
        }
    }

    /// [`Gates::enter`] when every permit is free now, without waiting.
    fn try_enter(&self, gates: &Arc<FamilyGates>, writes: bool) -> Option<Admitted> {
        let own = gates.slots.clone().try_acquire_owned().ok()?;
        let read = match writes {
            true => None,
            false => Some(self.reads.clone().try_acquire_owned().ok()?),
        };
        Some(Admitted {
            _pool: self.pool.clone().try_acquire_owned().ok()?,
            _read: read,
            _family: own,
        })
    }

    /// Wait for a slot of `family` (its `gates`), then (for a read) of the
    /// reads' share, then of the pool. Refused (503): the family's
    /// `max_concurrent` slots stayed taken for [`family_wait`] (with
    /// Retry-After), or the server is shutting down.
    async fn enter(
        &self,
        app: &App,
        family: &str,
        gates: Arc<FamilyGates>,
        writes: bool,
    ) -> Result<Admitted, Reply> {
        let shutting_down = || Reply::error(503, "plugin_unavailable", "shutting down");
        let slot = gates.slots.clone().acquire_owned();
        let own = match tokio::time::timeout(family_wait(app), slot).await {
            Ok(permit) => permit.map_err(|_| shutting_down())?,
            Err(_) => {
                return Err(busy(format!(
                    "{family} is busy: its max_concurrent requests are all running; retry shortly"
                )));
            }
        };
        let read = match writes {
            true => None,
            false => Some(
                self.reads
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| shutting_down())?,
            ),
        };
        let pool = self
            .pool
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shutting_down())?;
        Ok(Admitted {
            _pool: pool,
            _read: read,
            _family: own,
        })
    }
}

type OwnedPermit = tokio::sync::OwnedSemaphorePermit;

/// 503 `plugin_unavailable` with Retry-After.
fn busy(why: String) -> Reply {
    Reply::error(503, "plugin_unavailable", why).retry_after_a_second()
}

/// Serve HTTP on `listener` until `stop` turns true; then stop accepting,
/// let every connection finish the request it is serving (idle keep-alive
/// connections close after `drain_linger_ms` without a request, or once no
/// request runs when that is later, see [`drain_linger`]; connections with
/// a request already sent are served first, see [`super::drain`]) and
/// return true, or false if `drain` ran out first.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    stop: watch::Receiver<bool>,
    drain: Duration,
) -> bool {
    let gates = Arc::new(Gates::new(&app, stop.clone()));
    let connections = Arc::new(Semaphore::new(app.config.max_connections as usize));
    let open = Open::new(app.config.max_connections_per_ip);
    long_calls::set_per_address(app.config.max_long_calls_per_ip);
    // Every connection task holds a sender: once all are dropped, every
    // connection has ended.
    let (live, mut ended) = tokio::sync::mpsc::channel::<()>(1);
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
        live,
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
            conn.spawn(stream, peer, held, None);
            break;
        };
        conn.spawn(stream, peer, held, Some(permit));
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
            conn.spawn(stream, peer, held, None);
        }
    }
    flush_refused();
    drop(conn);
    tokio::select! {
        _ = ended.recv() => true,
        _ = tokio::time::sleep(drain) => {
            DRAIN_TIMED_OUT.store(true, std::sync::atomic::Ordering::Release);
            false
        }
    }
}

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
    live: tokio::sync::mpsc::Sender<()>,
}

impl Conn {
    /// Serve `stream` on a task of its own, holding its address's place
    /// and `permit` (a place under the connection cap) until it ends.
    fn spawn(
        &self,
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
        let live = self.live.clone();
        let header_timeout = self.header_timeout;
        let (linger, linger_most) = (self.linger, self.linger_most);
        tokio::spawn(async move {
            let m = metrics();
            m.connections.inc();
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
            m.connections.dec();
            drop(held);
            drop(permit);
            drop(live);
        });
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
                && !routes::holds_cash_secret(v)
                && !marketplace_common::secret::holds_hex_key(v)
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
            let method = self.method.to_ascii_uppercase();
            let route = match self
                .app
                .runtime
                .find(&method, &routes::canonical_path(self.path))
            {
                routes::Match::Found { route, .. } => Some(route),
                _ => None,
            };
            let path = routes::logged(route.as_deref(), self.path).into_owned();
            let why = if self.conn.closed_for_room() {
                "closed to make room while its body was still coming (every connection place was taken); it did not run"
            } else if DRAIN_TIMED_OUT.load(std::sync::atomic::Ordering::Acquire) {
                "not answered: still running when the drain timed out and the server stopped (its writes do not commit)"
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
        reply = closing(reply);
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
    // (A 204 or 304 carries no body, whatever its handler gave.)
    let typed = !reply.body.is_empty() && !matches!(reply.status, 204 | 304);
    // A HEAD answer names the length its GET's body would have (an empty
    // one too), where a body may be at all.
    let head_length =
        (head && !matches!(reply.status, 100..=199 | 204 | 304)).then_some(reply.body.len());
    let body = if head {
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
/// What is wrong with a request's `Host`, if anything (RFC 9112 3.2: an
/// HTTP/1.1 request has one; no request has two, or one that is not a
/// host and optional port). Empty is allowed, as the RFC has clients send
/// for a target without an authority (answers' URLs are then relative);
/// else answers' absolute URLs are made from it.
fn host_problem(version: hyper::Version, headers: &hyper::HeaderMap) -> Option<&'static str> {
    let mut hosts = headers.get_all(hyper::header::HOST).iter();
    let Some(host) = hosts.next() else {
        return (version == hyper::Version::HTTP_11)
            .then_some("is required in an HTTP/1.1 request");
    };
    if hosts.next().is_some() {
        return Some("must be given once");
    }
    let valid = host.is_empty() || marketplace_common::url::plausible_host_bytes(host.as_bytes());
    (!valid).then_some("must be a host name or address with an optional port")
}

/// Whether every `Expect` the request names is `100-continue` (hyper
/// answers that one when the body is first read), the only expectation
/// HTTP defines (RFC 9110 10.1.1): any other is answered 417 at once,
/// not waited on for a body the client may hold back.
fn expectations_met(headers: &hyper::HeaderMap) -> bool {
    lists_only(headers, hyper::header::EXPECT, "100-continue")
}

/// Whether every item of every `name` header (a comma-separated list) is
/// `only`, in any case (an empty item is none).
fn lists_only(headers: &hyper::HeaderMap, name: hyper::header::HeaderName, only: &str) -> bool {
    headers.get_all(name).iter().all(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .all(|item| item.is_empty() || item.eq_ignore_ascii_case(only))
        })
    })
}

/// Whether the request's body, if it has one, is framed by `chunked`
/// alone (RFC 9112 6.1, 7): hyper reads any list of codings ending in
/// `chunked` as chunked, so `gzip, chunked` would reach a route as the
/// still-compressed bytes, and `chunked, chunked` (which RFC 9112 7
/// forbids) as once-chunked ones. Any other coding, or `chunked` twice,
/// is answered 501 at once ("a transfer coding it does not understand").
fn transfer_codings_supported(headers: &hyper::HeaderMap) -> bool {
    let mut chunked = 0;
    for value in headers.get_all(hyper::header::TRANSFER_ENCODING) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return false;
            }
            chunked += 1;
        }
    }
    chunked <= 1
}

/// Whether the request's body, if it has one, comes without a content
/// coding (`Content-Encoding` absent or `identity`): no route decodes one,
/// so a gzip body would reach it as the compressed bytes (an outside probe
/// found a gzip-labelled `[]` answered as plain JSON). Any other is
/// answered 415 at once (RFC 9110 15.5.16).
fn content_codings_supported(headers: &hyper::HeaderMap) -> bool {
    let has_body = headers.contains_key(hyper::header::TRANSFER_ENCODING)
        || declared_length(headers).is_some_and(|n| n > 0);
    !has_body || lists_only(headers, hyper::header::CONTENT_ENCODING, "identity")
}

/// A request's method as its answer names it: a HEAD's answer is its
/// GET's (RFC 9110 9.3.2), down to the message of a 404 or 405 and so to
/// the length it says.
fn as_get(method: &str) -> &str {
    if method == "HEAD" { "GET" } else { method }
}

/// Whether a browser says a page of another site sent this request
/// (`Sec-Fetch-Site: cross-site` or `same-site`; RFC-less but sent by
/// every current browser, never by other clients). A write the service
/// takes from pages goes through `/mcp` and the origins it allows: any
/// other write from a page is a form or a `fetch` that needs no preflight
/// (`text/plain`, a form's types), which a page can make its visitors'
/// browsers send, each from its own address, past the per-address caps
/// (free macro definitions, A2A tasks, execute). Refused before it runs.
fn sent_by_another_site(headers: &hyper::HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site" || v.as_bytes() == b"same-site")
}

/// The answer to a request whose target names no resource: `OPTIONS *`
/// asks what the server supports (RFC 9110 9.3.7: 204 with `Allow`, as
/// load balancers' health checks send it); the asterisk with any other
/// method is malformed (400); `CONNECT` asks for a tunnel, which this
/// service, not a proxy, does not make (501).
fn not_for_a_resource(app: &App, method: &str, uri: &hyper::Uri) -> Option<Reply> {
    if method == "CONNECT" {
        return Some(Reply::error(
            501,
            "not_implemented",
            "this service is not a proxy: it makes no tunnels (CONNECT)",
        ));
    }
    if uri.path() != "*" {
        return None;
    }
    Some(if method == "OPTIONS" {
        // Every method some route of the table in force takes.
        let served = app.runtime.served();
        let mut methods: Vec<&str> = served.table.routes().map(|r| r.method.as_str()).collect();
        if methods.contains(&"GET") {
            methods.push("HEAD");
        }
        methods.sort_unstable();
        methods.dedup();
        methods.retain(|m| *m != "OPTIONS");
        options(&methods, &hyper::HeaderMap::new())
    } else {
        Reply::invalid("target", "the asterisk form (`*`) is for OPTIONS only")
    })
}

/// `OPTIONS` on a path that does not declare it: 204 with the methods the
/// path answers in `Allow` (RFC 9110 9.3.7). A browser's CORS preflight
/// of a read (`Access-Control-Request-Method: GET` or `HEAD`) from any
/// origin is allowed: every read is public, and no cookie or credential
/// of a browser's is ever read. A preflight of another method gets no
/// `Access-Control-Allow-*`, so the browser does not send it (a family
/// that takes writes from browsers answers OPTIONS itself, as `/mcp`).
fn options<S: AsRef<str>>(allowed: &[S], headers: &hyper::HeaderMap) -> Reply {
    let mut list: Vec<&str> = allowed.iter().map(AsRef::as_ref).collect();
    if !list.contains(&"OPTIONS") {
        list.push("OPTIONS");
    }
    let mut reply = Reply {
        status: 204,
        headers: vec![("allow".into(), crate::reply::allowed_list(&list))],
        body: vec![],
    };
    let asked = headers
        .get("access-control-request-method")
        .and_then(|v| v.to_str().ok());
    let reads = matches!(asked, Some("GET" | "HEAD")) && list.contains(&"GET");
    if reads && headers.contains_key(hyper::header::ORIGIN) {
        reply.headers.extend([
            ("access-control-allow-origin".into(), "*".into()),
            ("access-control-allow-methods".into(), "GET, HEAD".into()),
            ("access-control-max-age".into(), "600".into()),
        ]);
        // The headers it asks to send, as asked (a read takes none of
        // them as a credential).
        if let Some(wanted) = headers
            .get("access-control-request-headers")
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 1024)
        {
            reply
                .headers
                .push(("access-control-allow-headers".into(), wanted.to_string()));
        }
    }
    reply
}

async fn dispatch(
    app: &Arc<App>,
    gates: &Gates,
    req: Request<Incoming>,
    id: &str,
    client: IpAddr,
    conn: &Arc<super::connections::State>,
) -> (Reply, Option<Arc<Route>>) {
    if let Some(problem) = host_problem(req.version(), req.headers()) {
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
    let method = req.method().as_str().to_ascii_uppercase();
    if let Some(reply) = not_for_a_resource(app, &method, req.uri()) {
        return (reply, None);
    }
    let path = routes::canonical_path(req.uri().path());
    let (route, params) = match app.runtime.find(&method, &path) {
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
            return (
                Reply::error(
                    404,
                    "not_found",
                    // (A path may be 64 KiB: not echoed whole.)
                    format!(
                        "no route for {} {}",
                        as_get(&method),
                        crate::logging::clip(req.uri().path(), crate::logging::SHOWN_PATH)
                    ),
                ),
                None,
            );
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

/// A request's route, its parameters, its method (upper case) and its
/// canonical path.
struct Found {
    route: Arc<Route>,
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
        let mut reply = closing(Reply::error(
            415,
            "unsupported_media_type",
            "a request body is read as sent: no content coding (Content-Encoding: gzip, ...) is decoded; send it uncompressed",
        ));
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
        return if ended { refused } else { closing(refused) };
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
            return closing(busy(
                "too many request bodies are being received or waiting for a slot; retry shortly"
                    .into(),
            ));
        }
        Ok(Err(BodyError::Read(e))) => {
            return Reply::invalid("body", format!("could not be read: {e}"));
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
    let (counted, permits) = match (&route.handler, family_gates) {
        (Handler::Family(family), Some(g)) => {
            let at_once = long_calls::no_address_turns()
                .then(|| gates.try_enter(&g, route.writes))
                .flatten();
            match at_once {
                Some(permits) => (None, Some(permits)),
                None => {
                    match admit_waiting(app, gates, family, g, route.writes, client, conn).await {
                        Ok((counted, permits)) => (counted, Some(permits)),
                        Err(refused) => return refused,
                    }
                }
            }
        }
        _ => (None, None),
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

/// Admit a family's request that has to wait (its address's turn among its
/// long calls, then its slots), unless its connection is chosen to make
/// room meanwhile: then it gives way, answered 503 (the connection closes
/// after).
async fn admit_waiting(
    app: &Arc<App>,
    gates: &Gates,
    family: &str,
    family_gates: Arc<FamilyGates>,
    writes: bool,
    client: IpAddr,
    conn: &Arc<super::connections::State>,
) -> Result<(Option<long_calls::LongOf>, Admitted), Reply> {
    let admitted = async {
        let counted = match long_calls::address_turn(client, family, family_wait(app)).await {
            Ok(counted) => counted,
            Err(()) => {
                return Err(busy(format!(
                    "{family} is busy: {} of this address's requests of it are running long; retry shortly",
                    long_calls::per_address()
                )));
            }
        };
        let permits = gates.enter(app, family, family_gates, writes).await?;
        Ok((counted, permits))
    };
    unless_giving_way(conn, admitted).await
}

/// Wait for `admission` unless the connection is chosen to make room
/// meanwhile ([`super::connections::State::give_way_if_waiting`]): then its
/// request gives way, admitted or not, answered 503 (the connection closes
/// after).
async fn unless_giving_way<T>(
    conn: &Arc<super::connections::State>,
    admission: impl std::future::Future<Output = Result<T, Reply>>,
) -> Result<T, Reply> {
    let waiting = conn.waiting_for_admission();
    let admitted = tokio::select! {
        biased;
        admitted = admission => Some(admitted),
        () = conn.given_way() => None,
    };
    match admitted {
        Some(admitted) if waiting.admitted() => admitted,
        _ => Err(closing(busy(
            "every connection place is taken: this request, waiting its turn, gave its place to another client; retry shortly".into(),
        ))),
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
        let value = value.to_str().ok();
        if payment.read(name, value) {
            continue;
        }
        let Some(value) = value else { continue };
        if is_credential(name) {
            credentials.push((name.to_string(), value.to_string()));
        } else {
            headers.push((name.to_string(), value.to_string()));
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

/// `reply`, saying `Connection: close`: an answer that leaves the request
/// body unread ends the connection, and says so rather than leave a
/// keep-alive client to find a closed socket.
fn closing(mut reply: Reply) -> Reply {
    if !reply
        .headers
        .iter()
        .any(|(n, v)| n.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close"))
    {
        reply.headers.push(("connection".into(), "close".into()));
    }
    reply
}

/// The `Content-Length` a request declares, if it is a number.
pub(crate) fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// 408 `request_timeout`: the body did not arrive within `limit`; the
/// connection closes.
pub(crate) fn body_late(limit: Duration) -> Reply {
    closing(Reply::error(
        408,
        "request_timeout",
        format!(
            "the request body did not arrive within {} ms",
            limit.as_millis()
        ),
    ))
}

/// 413 `payload_too_large`, answered before the body is read.
pub(crate) fn too_large(max: usize) -> Reply {
    closing(Reply::json(
        413,
        &json!({
            "code": "payload_too_large",
            "message": format!("request body exceeds {max} bytes"),
            "max_bytes": max,
        }),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waiting_its_turn_gives_way_when_told_and_runs_when_admitted_first() {
        let conn = Arc::new(super::super::connections::State::default());
        // Admitted at once: it runs, and its connection waits no longer.
        let ran = unless_giving_way(&conn, async { Ok::<_, Reply>(7) }).await;
        assert_eq!(ran.ok(), Some(7));
        assert!(!conn.is_waiting());
        // Still waiting (a slot that never comes) when room is made: it
        // gives way, 503 and the connection closes after.
        let never = std::future::pending::<Result<(), Reply>>();
        let both = async {
            tokio::join!(unless_giving_way(&conn, never), async {
                tokio::task::yield_now().await;
                conn.give_way_if_waiting()
            })
        };
        // (A wait that never heeds being told would hang here.)
        let (gave_way, told) = tokio::time::timeout(std::time::Duration::from_secs(30), both)
            .await
            .expect("told to give way, it stops waiting");
        assert!(told);
        let reply = gave_way.unwrap_err();
        assert_eq!(reply.status, 503);
        assert!(
            reply
                .headers
                .iter()
                .any(|(n, v)| n == "connection" && v == "close")
        );
        // Nothing waits now: a later make_room finds none to tell.
        assert!(!conn.give_way_if_waiting());
    }

    #[test]
    fn a_family_holds_its_slots_share_of_body_memory_and_room_for_the_largest_body() {
        let mib = 1024;
        // Half the pool's slots, half the budget (KiB).
        assert_eq!(family_body_share(256 * mib, 128, 256, 2 << 20), 128 * mib);
        assert_eq!(family_body_share(96 * mib, 128, 256, 2 << 20), 48 * mib);
        // A family of one slot still takes two bodies of the largest size
        // a route may take (16 MiB), or of max_body_bytes if larger...
        assert_eq!(family_body_share(256 * mib, 1, 256, 2 << 20), 32 * mib);
        assert_eq!(family_body_share(256 * mib, 1, 256, 64 << 20), 128 * mib);
        // ...within the whole budget.
        assert_eq!(family_body_share(32 * mib, 128, 256, 2 << 20), 32 * mib);
    }

    #[test]
    fn a_body_with_a_content_coding_is_refused() {
        let of = |pairs: &[(&str, &str)]| {
            let mut headers = hyper::HeaderMap::new();
            for (k, v) in pairs {
                headers.append(
                    hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            content_codings_supported(&headers)
        };
        assert!(of(&[]));
        assert!(of(&[("content-length", "2")]));
        assert!(of(&[
            ("content-length", "2"),
            ("content-encoding", "identity")
        ]));
        assert!(of(&[("content-length", "0"), ("content-encoding", "gzip")]));
        assert!(!of(&[
            ("content-length", "2"),
            ("content-encoding", "gzip")
        ]));
        assert!(!of(&[
            ("transfer-encoding", "chunked"),
            ("content-encoding", "br")
        ]));
        assert!(!of(&[
            ("content-length", "2"),
            ("content-encoding", "identity"),
            ("content-encoding", "deflate"),
        ]));
    }

    #[test]
    fn only_100_continue_is_an_expectation_met() {
        let met = |values: &[&str]| {
            let mut headers = hyper::HeaderMap::new();
            for v in values {
                headers.append(
                    hyper::header::EXPECT,
                    hyper::header::HeaderValue::from_str(v).unwrap(),
                );
            }
            expectations_met(&headers)
        };
        assert!(met(&[]));
        assert!(met(&["100-continue"]));
        assert!(met(&["100-Continue"]));
        assert!(!met(&["200-ok"]));
        assert!(!met(&["100-continue, 200-ok"]));
        assert!(!met(&["100-continue", "foo"]));
        // An empty list names no expectation.
        assert!(met(&[""]));
    }

    #[test]
    fn one_valid_host_per_request() {
        use hyper::Version;
        let problem = |version: Version, hosts: &[&[u8]]| {
            let mut headers = hyper::HeaderMap::new();
            for h in hosts {
                headers.append(
                    hyper::header::HOST,
                    hyper::header::HeaderValue::from_bytes(h).unwrap(),
                );
            }
            host_problem(version, &headers)
        };
        // (What a host may look like: `marketplace_common::url`.)
        for good in [&b"market.example"[..], b"[::1]:8080", b""] {
            assert_eq!(problem(Version::HTTP_11, &[good]), None, "{good:?}");
        }
        assert_eq!(problem(Version::HTTP_10, &[]), None);
        assert!(problem(Version::HTTP_11, &[]).is_some());
        assert!(problem(Version::HTTP_11, &[b"a", b"b"]).is_some());
        assert!(problem(Version::HTTP_10, &[b"a", b"a"]).is_some());
        for bad in [&b"a b"[..], b"user@host", b"\xff", b"host:70000"] {
            assert!(problem(Version::HTTP_11, &[bad]).is_some(), "{bad:?}");
        }
    }

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
