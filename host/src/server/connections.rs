//! The connections open: the cap per client address, and room made at the
//! global cap.
//!
//! `max_connections_per_ip` keeps one address from holding every place,
//! but a few addresses together can: each opens its share and sends
//! nothing (or one header line every few seconds), and every other client
//! waits in the listen backlog. So when every place is taken and a client
//! is waiting, the host closes one connection that is not inside a
//! request, of the address that holds the most of those: one that never sent a
//! whole request head is closed at once (nothing of it was read), one
//! between requests as hyper's graceful shutdown closes it (at once when
//! idle, else after its answer; dropped if that answer is not read within
//! the header timeout). When every connection is inside a request, one
//! whose request has not run is chosen: one still receiving its body is
//! closed, one waiting to be admitted is answered 503 and closed. A
//! connection inside a running request is never chosen, and
//! one whose socket holds a request hyper has not read yet declines (it
//! is not closed; another is chosen). One is chosen at a time.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// Connections open per client address, capped (`max_connections_per_ip`),
/// and every open connection's state, to choose one to close for room.
#[derive(Clone)]
pub struct Open {
    max_per_ip: u32,
    inner: Arc<Mutex<Inner>>,
}

#[derive(Default)]
struct Inner {
    per_ip: HashMap<IpAddr, u32>,
    /// By admission order (the oldest first).
    conns: BTreeMap<u64, (IpAddr, Arc<State>)>,
    next: u64,
}

/// How long a new connection has to send its first request head before
/// it may be closed to make room (it may have connected a moment before
/// sending, as clients that open a connection ahead do).
pub const FIRST_HEAD_GRACE: Duration = Duration::from_secs(1);

/// What the host knows of one connection.
pub struct State {
    /// When it was admitted.
    since: Instant,
    /// Requests whose head reached the service, and those it answered.
    started: AtomicU64,
    answered: AtomicU64,
    /// When the server last wrote to it, in nanoseconds since `since`
    /// (0: nothing yet), and whether a write waits for room, for the
    /// header timeout ([`State::head_due`]).
    wrote_ns: AtomicU64,
    write_waits: AtomicBool,
    /// Chosen to make room (once).
    chosen: AtomicBool,
    /// Inside a request whose body is still coming (it has not run).
    receiving: AtomicBool,
    /// Closed to make room with such a request (see [`State::drop_receiving`]).
    dropped_receiving: AtomicBool,
    /// Inside a request waiting to be admitted (its address's turn among
    /// its long calls, or a slot): it has not run.
    waiting: AtomicBool,
    /// Tells that waiting request to give its place up.
    give_way: Notify,
    close: Notify,
}

impl Default for State {
    fn default() -> State {
        State {
            since: Instant::now(),
            started: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            wrote_ns: AtomicU64::new(0),
            write_waits: AtomicBool::new(false),
            chosen: AtomicBool::new(false),
            close: Notify::new(),
            receiving: AtomicBool::new(false),
            dropped_receiving: AtomicBool::new(false),
            waiting: AtomicBool::new(false),
            give_way: Notify::new(),
        }
    }
}

impl State {
    /// A request head reached the service (called as hyper hands it over).
    pub fn request_started(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
    }

    /// The service answered that request.
    pub fn request_answered(&self) {
        self.answered.fetch_add(1, Ordering::AcqRel);
    }

    /// Whether no whole request head has come on this connection yet.
    pub fn never_requested(&self) -> bool {
        self.started.load(Ordering::Acquire) == 0
    }

    /// Whether it is not inside a request (every head that reached the
    /// service was answered).
    pub fn between_requests(&self) -> bool {
        self.started.load(Ordering::Acquire) == self.answered.load(Ordering::Acquire)
    }

    /// The server wrote to this connection (a write went through).
    pub fn wrote(&self) {
        let ns = u64::try_from(self.since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.wrote_ns.store(ns, Ordering::Relaxed);
    }

    /// A write to it waits for room (`true`), or no longer does.
    pub fn write_waits(&self, waits: bool) {
        self.write_waits.store(waits, Ordering::Relaxed);
    }

    /// The header timeout, checked at `now`: `None` once the connection
    /// has waited `timeout` for a whole request head (since it was
    /// admitted, or since the server last wrote to it, its last answer
    /// then out), else when to check again. Inside a request (the head
    /// has come; its body has a timeout of its own) or while a write
    /// waits for room (a slow client reading an answer: the write has a
    /// timeout of its own, see `super::linger`), checked again a
    /// `timeout` later.
    pub fn head_due(&self, timeout: Duration, now: Instant) -> Option<Instant> {
        if !self.between_requests() || self.write_waits.load(Ordering::Relaxed) {
            return Some(now + timeout);
        }
        let due =
            self.since + Duration::from_nanos(self.wrote_ns.load(Ordering::Relaxed)) + timeout;
        (due > now).then_some(due)
    }

    /// While the guard lives, this connection's request is receiving its
    /// body: it may be closed to make room (see [`Open::make_room`]).
    pub fn receiving_body(self: &Arc<Self>) -> ReceivingBody {
        self.receiving.store(true, Ordering::Release);
        ReceivingBody(self.clone())
    }

    /// Whether its request is still receiving its body.
    pub fn is_receiving(&self) -> bool {
        self.receiving.load(Ordering::Acquire)
    }

    /// While the guard lives, this connection's request waits to be
    /// admitted: it may be told to give way to make room (see
    /// [`Open::make_room`], [`State::given_way`]).
    pub fn waiting_for_admission(self: &Arc<Self>) -> WaitingForAdmission {
        self.waiting.store(true, Ordering::Release);
        WaitingForAdmission(self.clone())
    }

    /// Whether its request still waits to be admitted.
    pub fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// Tell its request to give way if it still waits to be admitted (it
    /// is answered 503 and the connection closes after): false when it
    /// waits no longer (admitted meanwhile, it runs).
    pub fn give_way_if_waiting(&self) -> bool {
        let told = self
            .waiting
            .compare_exchange(true, false, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        if told {
            self.give_way.notify_one();
        }
        told
    }

    /// Resolves once the request waiting to be admitted is told to give
    /// way.
    pub async fn given_way(&self) {
        self.give_way.notified().await
    }

    /// Note that this connection is closed to make room while its
    /// request's body was still coming: that request never ran, and its log
    /// line says so ([`State::closed_for_room`]), not that its client left.
    pub fn drop_receiving(&self) {
        self.dropped_receiving.store(true, Ordering::Release);
    }

    /// Whether [`State::drop_receiving`] was called.
    pub fn closed_for_room(&self) -> bool {
        self.dropped_receiving.load(Ordering::Acquire)
    }

    /// Resolves once this connection is chosen to make room.
    pub async fn closing(&self) {
        self.close.notified().await
    }

    /// Chosen, but a request waits in its socket: not closed after all,
    /// and it may be chosen again later.
    pub fn decline(&self) {
        self.chosen.store(false, Ordering::Release);
    }
}

/// A request receiving its body ([`State::receiving_body`]).
pub struct ReceivingBody(Arc<State>);

impl Drop for ReceivingBody {
    fn drop(&mut self) {
        self.0.receiving.store(false, Ordering::Release);
    }
}

/// A request waiting to be admitted ([`State::waiting_for_admission`]).
pub struct WaitingForAdmission(Arc<State>);

impl WaitingForAdmission {
    /// Its request was admitted: true when it may run, false when it was
    /// told to give way first ([`State::give_way_if_waiting`]), which it
    /// must then do.
    pub fn admitted(self) -> bool {
        self.0.waiting.swap(false, Ordering::AcqRel)
    }
}

impl Drop for WaitingForAdmission {
    fn drop(&mut self) {
        self.0.waiting.store(false, Ordering::Release);
    }
}

/// One admitted connection; dropping it frees its place.
pub struct Held {
    open: Open,
    id: u64,
    ip: IpAddr,
    pub state: Arc<State>,
}

impl Open {
    pub fn new(max_per_ip: u32) -> Open {
        Open {
            max_per_ip,
            inner: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A place for one more connection from `ip`, unless it holds its cap
    /// (`max_per_ip` 0: no cap, never refused).
    pub fn admit(&self, ip: IpAddr) -> Option<Held> {
        let ip = crate::ids::client_key(ip);
        let mut inner = self.lock();
        let n = inner.per_ip.entry(ip).or_insert(0);
        if self.max_per_ip != 0 && *n >= self.max_per_ip {
            return None;
        }
        *n += 1;
        let id = inner.next;
        inner.next += 1;
        let state = Arc::new(State::default());
        inner.conns.insert(id, (ip, state.clone()));
        Some(Held {
            open: self.clone(),
            id,
            ip,
            state,
        })
    }

    /// Choose a connection to close for room for `newcomer` (admitted,
    /// not served yet): not inside a request, of the address holding the
    /// most such connections (of those, the one holding the most in all),
    /// the oldest of those; when every other is inside a request, one
    /// whose request has not run (its body is still coming, or it waits
    /// to be admitted), chosen the same way. (Bodies trickled a byte at a
    /// time from two addresses held every place for `body_timeout_ms` at
    /// a time, again and again; two addresses' runaway macros, each
    /// connection with the next request queued behind its own, held every
    /// place as long as they kept sending.) False when every other connection is inside a running
    /// request, or one chosen before is still closing (one at a time: no
    /// more are closed than places needed).
    pub fn make_room(&self, newcomer: &Held) -> bool {
        self.make_room_at(newcomer, Instant::now())
    }

    /// [`Open::make_room`] at `now`: a connection that has not sent a
    /// request head within [`FIRST_HEAD_GRACE`] of its admission is not
    /// chosen before then. (Else, while others' bodies trickled in from
    /// every place, each newcomer that paused a moment before sending was
    /// the one closed.)
    fn make_room_at(&self, newcomer: &Held, now: Instant) -> bool {
        let inner = self.lock();
        if inner
            .conns
            .values()
            .any(|(_, s)| s.chosen.load(Ordering::Acquire))
        {
            return false;
        }
        let choosable = |between: bool| -> Vec<(&u64, &(IpAddr, Arc<State>))> {
            inner
                .conns
                .iter()
                .filter(|(id, (_, s))| {
                    **id != newcomer.id
                        && !s.chosen.load(Ordering::Acquire)
                        && if between {
                            s.between_requests()
                                && !(s.never_requested()
                                    && now.saturating_duration_since(s.since) < FIRST_HEAD_GRACE)
                        } else {
                            s.is_receiving() || s.is_waiting()
                        }
                })
                .collect()
        };
        let mut candidates = choosable(true);
        if candidates.is_empty() {
            candidates = choosable(false);
        }
        // Counted among the candidates: an address whose connections are
        // all inside requests but the one it opened a moment ago (whose
        // head is on its way) does not make that one the victim again and
        // again while others' idle connections stay open.
        let mut closable: HashMap<IpAddr, u32> = HashMap::new();
        for (_, (ip, _)) in &candidates {
            *closable.entry(*ip).or_default() += 1;
        }
        let victim = candidates.into_iter().max_by_key(|(id, (ip, _))| {
            (
                closable.get(ip).copied(),
                inner.per_ip.get(ip).copied(),
                std::cmp::Reverse(**id),
            )
        });
        match victim {
            Some((_, (_, state))) => {
                state.chosen.store(true, Ordering::Release);
                // Kept if the task is not waiting yet: it sees it next.
                state.close.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut inner = self.open.lock();
        inner.conns.remove(&self.id);
        if let Some(n) = inner.per_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                inner.per_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// A moment when every connection made so far is past its grace.
    fn later() -> std::time::Instant {
        std::time::Instant::now() + FIRST_HEAD_GRACE * 2
    }

    #[test]
    fn the_header_timeout_counts_from_admission_or_the_last_write() {
        let t = Duration::from_secs(10);
        let s = State::default();
        let now = Instant::now();
        // Due a timeout after admission.
        assert!(s.head_due(t, now).is_some_and(|due| due <= now + t));
        assert_eq!(s.head_due(t, now + t * 2), None);
        // Inside a request: not due, however late.
        s.request_started();
        assert_eq!(s.head_due(t, now + t * 2), Some(now + t * 3));
        s.request_answered();
        assert_eq!(s.head_due(t, now + t * 2), None, "nothing written yet");
        // A write moves it on.
        std::thread::sleep(Duration::from_millis(20));
        s.wrote();
        let due = s.head_due(t, now).unwrap();
        assert!(due >= now + Duration::from_millis(20) + t);
        assert_eq!(s.head_due(t, due), None);
        // A write waiting for room (its own timeout applies): not due.
        s.write_waits(true);
        assert_eq!(s.head_due(t, now + t * 5), Some(now + t * 6));
        s.write_waits(false);
        assert_eq!(s.head_due(t, now + t * 5), None);
    }

    #[test]
    fn an_address_is_capped_and_its_places_come_back() {
        let open = Open::new(2);
        let a = open.admit(ip(1)).unwrap();
        let _b = open.admit(ip(1)).unwrap();
        assert!(open.admit(ip(1)).is_none());
        assert!(open.admit(ip(2)).is_some());
        drop(a);
        assert!(open.admit(ip(1)).is_some());
        let unlimited = Open::new(0);
        let _held: Vec<Held> = (0..100).map(|_| unlimited.admit(ip(1)).unwrap()).collect();
    }

    #[test]
    fn room_comes_from_the_address_with_the_most_connections_that_can_close() {
        // An address whose connections are all inside requests but its
        // newest (its head on the way) holds the most connections; another
        // holds two idle ones: those give way first.
        let open = Open::new(0);
        let busy: Vec<Held> = (0..5).map(|_| open.admit(ip(7)).unwrap()).collect();
        for h in &busy[..4] {
            h.state.request_started();
        }
        let idle: Vec<Held> = (0..2).map(|_| open.admit(ip(3)).unwrap()).collect();
        let newcomer = open.admit(ip(7)).unwrap();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(idle[0].state.chosen.load(Ordering::Acquire));
        assert!(!busy[4].state.chosen.load(Ordering::Acquire));
    }

    #[test]
    fn room_is_made_from_the_address_holding_most_never_inside_a_request() {
        let open = Open::new(0);
        let lone = open.admit(ip(1)).unwrap();
        let mut crowd: Vec<Held> = (0..3).map(|_| open.admit(ip(2)).unwrap()).collect();
        // The one room is made for (of the crowd's address too) is never
        // chosen itself.
        let newcomer = open.admit(ip(2)).unwrap();
        // The crowd's oldest connection is inside a request: its next one
        // is chosen, then the one after.
        crowd[0].state.request_started();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(crowd[1].state.chosen.load(Ordering::Acquire));
        // One at a time: none more while the chosen one is still open.
        assert!(!open.make_room_at(&newcomer, later()));
        drop(crowd.remove(1));
        assert!(open.make_room_at(&newcomer, later()));
        assert!(crowd[1].state.chosen.load(Ordering::Acquire));
        // One that declines (a request waited in its socket) may be chosen
        // again, and lets another be chosen meanwhile.
        crowd[1].state.decline();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(crowd[1].state.chosen.load(Ordering::Acquire));
        drop(crowd.remove(1));
        // Then the lone address's (the crowd's last one is busy).
        assert!(open.make_room_at(&newcomer, later()));
        assert!(lone.state.chosen.load(Ordering::Acquire));
        drop(lone);
        assert!(
            !open.make_room_at(&newcomer, later()),
            "only a connection inside a request is left"
        );
        assert!(!newcomer.state.chosen.load(Ordering::Acquire));
        // Answered: between requests again, so it may be chosen.
        crowd[0].state.request_answered();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(crowd[0].state.chosen.load(Ordering::Acquire));
        assert!(!crowd[0].state.never_requested());
        assert!(newcomer.state.never_requested());
    }

    #[test]
    fn with_every_request_running_room_comes_from_a_body_still_coming() {
        let open = Open::new(0);
        let running = open.admit(ip(1)).unwrap();
        running.state.request_started();
        let trickling: Vec<Held> = (0..2).map(|_| open.admit(ip(2)).unwrap()).collect();
        let bodies: Vec<ReceivingBody> = trickling
            .iter()
            .map(|h| {
                h.state.request_started();
                h.state.receiving_body()
            })
            .collect();
        let lone = open.admit(ip(3)).unwrap();
        lone.state.request_started();
        let _lone_body = lone.state.receiving_body();
        let newcomer = open.admit(ip(4)).unwrap();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(
            trickling[0].state.chosen.load(Ordering::Acquire),
            "the address with the most"
        );
        assert!(!running.state.chosen.load(Ordering::Acquire));
        drop(bodies);
        drop(trickling);
        assert!(open.make_room_at(&newcomer, later()));
        assert!(lone.state.chosen.load(Ordering::Acquire));
        drop(_lone_body);
        drop(lone);
        assert!(
            !open.make_room_at(&newcomer, later()),
            "a running request is never chosen"
        );
    }

    #[test]
    fn with_every_request_running_room_comes_from_one_waiting_its_turn() {
        let open = Open::new(0);
        let running = open.admit(ip(1)).unwrap();
        running.state.request_started();
        let queued: Vec<Held> = (0..2).map(|_| open.admit(ip(2)).unwrap()).collect();
        let waits: Vec<WaitingForAdmission> = queued
            .iter()
            .map(|h| {
                h.state.request_started();
                h.state.waiting_for_admission()
            })
            .collect();
        let newcomer = open.admit(ip(4)).unwrap();
        assert!(open.make_room_at(&newcomer, later()));
        assert!(queued[0].state.chosen.load(Ordering::Acquire));
        assert!(!running.state.chosen.load(Ordering::Acquire));
        // Told to give way, the waiting request hears it (its permit is
        // kept until it listens), and may not run even if admitted
        // meanwhile.
        let mut waits = waits.into_iter();
        let (told, other) = (waits.next().unwrap(), waits.next().unwrap());
        assert!(queued[0].state.give_way_if_waiting());
        let heard = queued[0].state.given_way();
        assert!(futures_util::FutureExt::now_or_never(heard).is_some());
        assert!(!told.admitted());
        // One admitted first runs, and is told nothing after.
        assert!(other.admitted());
        assert!(!queued[1].state.give_way_if_waiting());
        queued[0].state.chosen.store(false, Ordering::Release);
        assert!(
            !open.make_room_at(&newcomer, later()),
            "a running request is never chosen"
        );
    }

    #[test]
    fn a_new_connection_has_a_moment_to_send_its_first_head() {
        let open = Open::new(0);
        let trickling = open.admit(ip(2)).unwrap();
        trickling.state.request_started();
        let _body = trickling.state.receiving_body();
        let fresh = open.admit(ip(3)).unwrap();
        let newcomer = open.admit(ip(4)).unwrap();
        // Now: the fresh one is spared, the body still coming is closed.
        assert!(open.make_room(&newcomer));
        assert!(!fresh.state.chosen.load(Ordering::Acquire));
        assert!(trickling.state.chosen.load(Ordering::Acquire));
        drop(_body);
        drop(trickling);
        // Past its grace without a request head: it may be closed.
        assert!(!open.make_room(&newcomer));
        assert!(open.make_room_at(&newcomer, later()));
        assert!(fresh.state.chosen.load(Ordering::Acquire));
    }
}
