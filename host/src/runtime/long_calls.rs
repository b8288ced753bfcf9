//! Long calls: plugin calls that run on and on (a free macro run spins
//! until its deadline). A stranger holding many connections of them would
//! otherwise keep every core busy, every other request waiting behind them
//! in the workers' queues.
//!
//! - A client's call (not one dispatched by another call: that runs in its
//!   caller's share) that has run [`LONG_CALL`] of its own time is a long
//!   call. On an async worker it goes on only with one of the [`TURNS`]
//!   (one per worker), waiting for one at an epoch tick no longer than its
//!   deadline; while others wait, it gives its turn back at each tick and
//!   queues behind them ([`WAITING`]); on a blocking thread (every call, on
//!   a shared store) the operating system shares the cores, and its own
//!   time is its thread's CPU time.
//! - It counts against its client address and family: while
//!   [`PER_ADDRESS`] (2) such calls of a family for one address exist, that
//!   address's further requests of the family wait to be admitted
//!   ([`address_turn`]), and one admitted meanwhile counts as one of them
//!   until it ends, so at most that many run whatever the connections.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

/// How much of its own time (on its worker, not waiting for it, nor in a
/// host call that waits: for the commit batch, a dispatched request, a
/// blocking thread; on a blocking thread, the CPU time the thread was
/// given) a call runs before it is a long call.
pub const LONG_CALL: Duration = Duration::from_millis(5);

/// How many calls of one family for one client address may be long at
/// once (see the module's text): `max_long_calls_per_ip`, set at start
/// ([`set_per_address`]); 0, no limit.
static PER_ADDRESS: AtomicU32 = AtomicU32::new(2);

/// Set [`PER_ADDRESS`] (the server does, from its configuration).
pub fn set_per_address(n: u32) {
    PER_ADDRESS.store(n, Ordering::Relaxed);
}

/// The limit in force.
pub fn per_address() -> u32 {
    PER_ADDRESS.load(Ordering::Relaxed)
}

/// The turns long calls take: one per async worker. However many long
/// calls there are, at most this many are in the workers' queues, so a
/// short request waits behind at most one epoch tick of each; and as many
/// legitimate long calls run at once as there are cores for them (with
/// half the workers, two 270 ms macros on two cores took turns, and the
/// second passed its then 500 ms budget waiting).
static TURNS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(Semaphore::new(workers.max(1)))
});

/// Long calls waiting for one of the [`TURNS`]. While any waits, a long
/// call holding a turn gives it back at its next epoch tick and queues
/// behind them (the semaphore is first come, first served): long calls
/// take turns tick by tick rather than keep one until they end, so a call
/// that only became long because the operating system took its core for a
/// few milliseconds waits a few ticks, not until runaway loops reach their
/// deadline.
static WAITING: AtomicU32 = AtomicU32::new(0);

/// One long call counted in [`WAITING`] until dropped (also when the call
/// is dropped while it waits).
struct Waiting;

impl Waiting {
    fn new() -> Waiting {
        WAITING.fetch_add(1, Ordering::AcqRel);
        Waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The long calls of each client address, by family.
type Counts = HashMap<IpAddr, Vec<(Box<str>, u32)>>;

/// The long calls of each client address, by family, and a wake-up for the
/// requests waiting on them.
struct Addresses {
    long: Mutex<Counts>,
    /// Long calls of any address (none: admission looks no further).
    any: AtomicU32,
    ended: Notify,
}

static ADDRESSES: LazyLock<Addresses> = LazyLock::new(|| Addresses {
    long: Mutex::new(HashMap::new()),
    any: AtomicU32::new(0),
    ended: Notify::new(),
});

fn count(long: &Counts, addr: IpAddr, family: &str) -> u32 {
    long.get(&addr)
        .and_then(|fams| fams.iter().find(|(f, _)| &**f == family))
        .map_or(0, |(_, n)| *n)
}

/// A long call (or a request admitted while its address has some) of a
/// client address and family, counted until it is dropped.
pub struct LongOf {
    addr: IpAddr,
    family: Box<str>,
}

impl LongOf {
    /// Counted under the lock `long` holds.
    fn counted(long: &mut Counts, addr: IpAddr, family: &str) -> LongOf {
        let fams = long.entry(addr).or_default();
        match fams.iter_mut().find(|(f, _)| &**f == family) {
            Some((_, n)) => *n += 1,
            None => fams.push((family.into(), 1)),
        }
        ADDRESSES.any.fetch_add(1, Ordering::AcqRel);
        LongOf {
            addr,
            family: family.into(),
        }
    }

    fn new(addr: IpAddr, family: &str) -> LongOf {
        let mut long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
        LongOf::counted(&mut long, addr, family)
    }
}

impl Drop for LongOf {
    fn drop(&mut self) {
        let mut long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(fams) = long.get_mut(&self.addr) {
            if let Some(at) = fams.iter().position(|(f, _)| *f == self.family) {
                fams[at].1 -= 1;
                if fams[at].1 == 0 {
                    fams.swap_remove(at);
                }
            }
            if fams.is_empty() {
                long.remove(&self.addr);
            }
        }
        ADDRESSES.any.fetch_sub(1, Ordering::AcqRel);
        drop(long);
        ADDRESSES.ended.notify_waiters();
    }
}

/// Whether no address has a long call now (or there is no limit): every
/// request is admitted at once by [`address_turn`], uncounted.
pub fn no_address_turns() -> bool {
    per_address() == 0 || ADDRESSES.any.load(Ordering::Acquire) == 0
}

/// Admit a request of `family` from the client address `addr`: at once
/// when the address has no long call of the family (`Ok(None)`: the call
/// counts itself if it runs long); while it has fewer than
/// [`PER_ADDRESS`], counted as one of them until the returned guard is
/// dropped (its call then does not count itself again); otherwise once one
/// ends, waiting at most `wait` (`Err`: they stayed).
pub async fn address_turn(
    addr: IpAddr,
    family: &str,
    wait: Duration,
) -> Result<Option<LongOf>, ()> {
    if no_address_turns() {
        return Ok(None);
    }
    let limit = per_address();
    let addr = crate::ids::client_key(addr);
    let until = tokio::time::Instant::now() + wait;
    let mut counted = false;
    loop {
        let ended = ADDRESSES.ended.notified();
        tokio::pin!(ended);
        // Registered before the count is read: an end in between wakes it.
        ended.as_mut().enable();
        {
            let mut long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
            match count(&long, addr, family) {
                0 => return Ok(None),
                n if n < limit => return Ok(Some(LongOf::counted(&mut long, addr, family))),
                _ => {}
            }
        }
        if !counted {
            counted = true;
            crate::metrics::metrics().address_waits.inc();
        }
        if tokio::time::timeout_at(until, ended).await.is_err() {
            return Err(());
        }
    }
}

/// The CPU time the calling thread has been given (`CLOCK_THREAD_CPUTIME_ID`).
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only the timespec it is given.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Instants as microseconds since the process's first use of them, so a
/// yield's future can note when its call runs again in an atomic.
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

fn micros(at: Instant) -> u64 {
    at.saturating_duration_since(*ORIGIN).as_micros() as u64
}

/// What a call that reached an epoch tick keeps: when it last started
/// running again, and its turn.
struct Running {
    resumed: AtomicU64,
    turn: Mutex<Option<OwnedSemaphorePermit>>,
}

/// One call's part in all this (kept by its limiter).
#[derive(Default)]
pub struct LongCall {
    /// A client's own call (not a dispatched one): it takes turns.
    pub takes_turns: bool,
    /// The client's address, while the call may still count against it.
    pub client: Option<IpAddr>,
    /// When the call started.
    started: Option<Instant>,
    /// For a call that never yields, its thread's CPU time when last
    /// counted ([`LongCall::account_cpu`]).
    cpu: Option<Duration>,
    /// Its own time so far, counted at its ticks.
    ran: Duration,
    /// Time since it last ran on that was not its own (see [`LONG_CALL`]).
    waited: Duration,
    /// Made at the call's first tick (most calls never reach one).
    running: Option<Arc<Running>>,
    long_of: Option<LongOf>,
}

impl LongCall {
    /// The call starts `now`.
    pub fn start(&mut self, now: Instant) {
        // (The origin is taken before any call's start.)
        LazyLock::force(&ORIGIN);
        self.started = Some(now);
    }

    /// When the call started, if it has.
    pub fn started(&self) -> Option<Instant> {
        self.started
    }

    /// `d` of the call's time was not its own (a host call that waited).
    pub fn waited(&mut self, d: Duration) {
        self.waited += d;
    }

    /// Count the time since the call last ran on, at an epoch tick. True:
    /// it is now long and should count against its client (with its
    /// family: [`LongCall::count_against`]).
    pub fn account(&mut self) -> bool {
        let now = micros(Instant::now());
        let since = match &self.running {
            Some(r) => r.resumed.load(Ordering::Relaxed),
            None => self.started.map_or(now, micros),
        };
        let ran = Duration::from_micros(now.saturating_sub(since));
        self.ran += ran.saturating_sub(self.waited);
        self.waited = Duration::ZERO;
        if let Some(r) = &self.running {
            // Counted up to now (a tick that does not yield runs on).
            r.resumed.store(now, Ordering::Relaxed);
        }
        self.is_long()
    }

    /// [`LongCall::account`] for a call that never yields (one on a
    /// blocking thread: every call, on a shared store): its own time is the
    /// CPU time its thread was given since the last tick, so neither its
    /// waits (a shared store's round trips, a dispatched request's) nor the
    /// time other threads had the core count. Counted from its first tick.
    pub fn account_cpu(&mut self) -> bool {
        let now = thread_cpu_time();
        if let Some(last) = self.cpu.replace(now) {
            self.ran += now.saturating_sub(last);
        }
        self.is_long()
    }

    /// Whether it has run long and should now count against its client.
    fn is_long(&self) -> bool {
        self.takes_turns && self.long_of.is_none() && self.client.is_some() && self.ran >= LONG_CALL
    }

    pub fn count_against(&mut self, family: &str) {
        if let Some(addr) = self.client.take() {
            self.long_of = Some(LongOf::new(crate::ids::client_key(addr), family));
        }
    }

    /// The yield at an epoch tick (after [`LongCall::account`]): tokio's
    /// yield, which lets the worker's other tasks run and poll for I/O
    /// first; a long call without a turn waits for one instead (no longer
    /// than `deadline`), and keeps it until it ends.
    pub fn yield_now(&mut self, deadline: Instant) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let running = self
            .running
            .get_or_insert_with(|| {
                Arc::new(Running {
                    resumed: AtomicU64::new(0),
                    turn: Mutex::new(None),
                })
            })
            .clone();
        let mut wait = false;
        if self.takes_turns && self.ran >= LONG_CALL {
            let mut turn = running.turn.lock().unwrap_or_else(|p| p.into_inner());
            if turn.is_some() && WAITING.load(Ordering::Acquire) > 0 {
                // Others wait: the turn goes to the first of them.
                *turn = None;
            }
            if turn.is_none() {
                match TURNS.clone().try_acquire_owned() {
                    Ok(permit) => *turn = Some(permit),
                    Err(_) => wait = true,
                }
            }
        }
        let deadline = tokio::time::Instant::from_std(deadline);
        Box::pin(async move {
            if wait {
                crate::metrics::metrics().long_call_waits.inc();
                let _waiting = Waiting::new();
                let turn = TURNS.clone().acquire_owned();
                // At its deadline it goes on without a turn, and the next
                // epoch check ends it. (The semaphore is never closed.)
                if let Ok(Ok(permit)) = tokio::time::timeout_at(deadline, turn).await {
                    *running.turn.lock().unwrap_or_else(|p| p.into_inner()) = Some(permit);
                }
            } else {
                tokio::task::yield_now().await;
            }
            running
                .resumed
                .store(micros(Instant::now()), Ordering::Relaxed);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_waits_while_two_of_its_calls_of_a_family_run_long() {
        let a: IpAddr = "192.0.2.7".parse().unwrap();
        let b: IpAddr = "192.0.2.8".parse().unwrap();
        let short = Duration::from_millis(30);
        let first = LongOf::new(a, "mcp");
        // One long call: admitted, and counted as a second until it ends.
        let admitted = address_turn(a, "mcp", short).await.unwrap();
        assert!(admitted.is_some());
        assert!(address_turn(a, "mcp", short).await.is_err(), "two");
        // Another family of the address, and another address, go on
        // uncounted.
        assert!(address_turn(a, "timeline", short).await.unwrap().is_none());
        assert!(address_turn(b, "mcp", short).await.unwrap().is_none());
        // Two wait; one ends: one of them is admitted, the other waits on.
        let waiting: Vec<_> = (0..2)
            .map(|_| tokio::spawn(address_turn(a, "mcp", Duration::from_millis(300))))
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        let mut outcomes = Vec::new();
        for w in waiting {
            outcomes.push(w.await.unwrap());
        }
        assert_eq!(
            outcomes.iter().filter(|o| matches!(o, Ok(Some(_)))).count(),
            1,
            "one admitted"
        );
        assert_eq!(outcomes.iter().filter(|o| o.is_err()).count(), 1);
        drop(outcomes);
        drop(admitted);
        let long = ADDRESSES.long.lock().unwrap();
        assert_eq!(count(&long, a, "mcp"), 0);
        assert!(long.get(&a).is_none());
    }

    #[test]
    fn a_call_that_never_yields_counts_its_threads_cpu_time_not_its_waits() {
        let mut c = LongCall {
            takes_turns: true,
            client: Some("192.0.2.9".parse().unwrap()),
            ..LongCall::default()
        };
        // Its first tick starts the count.
        assert!(!c.account_cpu());
        // A wait (a store's round trip, another thread on the core) is not
        // its own time, however long.
        std::thread::sleep(Duration::from_millis(30));
        assert!(!c.account_cpu(), "{:?}", c.ran);
        // Work is.
        let spin_until = thread_cpu_time() + LONG_CALL + Duration::from_millis(2);
        while thread_cpu_time() < spin_until {
            std::hint::black_box(0u64);
        }
        assert!(c.account_cpu(), "{:?}", c.ran);
    }

    #[test]
    fn waits_inside_host_calls_are_not_a_calls_own_time() {
        // Calls start after the origin of the clock.
        LazyLock::force(&ORIGIN);
        std::thread::sleep(Duration::from_millis(60));
        let mut c = LongCall {
            takes_turns: true,
            client: Some("192.0.2.9".parse().unwrap()),
            ..LongCall::default()
        };
        c.started = Some(Instant::now() - Duration::from_millis(50));
        // 50 ms since it started, 48 of them waiting for the commit batch.
        c.waited(Duration::from_millis(48));
        assert!(!c.account(), "{:?}", c.ran);
        assert!(c.ran < LONG_CALL);
        c.started = Some(Instant::now() - Duration::from_millis(50));
        c.running = None;
        assert!(c.account(), "50 ms of its own: long");
        // A dispatched call never takes turns nor counts.
        let mut d = LongCall {
            takes_turns: false,
            client: Some("192.0.2.9".parse().unwrap()),
            ..LongCall::default()
        };
        d.started = Some(Instant::now() - Duration::from_millis(50));
        assert!(!d.account());
    }
}
