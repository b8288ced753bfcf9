//! The limits of one plugin call: a memory cap (remembering whether it was
//! hit) and a deadline the store's epoch callback checks.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use wasmtime::ResourceLimiter;

/// How long a call on an async worker runs (its own time between yields,
/// not the time it waits for its worker) before it is a long call, which
/// runs on only with one of the [`LONG_TURNS`].
pub const LONG_CALL: Duration = Duration::from_millis(5);

/// The turns long calls take: half the async workers (at least one), so
/// however many CPU-bound calls a stranger starts (free macro runs, each
/// spinning until its deadline), at most this many run at once and the
/// other workers stay free for short requests; the rest wait, their
/// deadlines running on, and most end at them.
static LONG_TURNS: LazyLock<Arc<Semaphore>> = LazyLock::new(|| {
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    Arc::new(Semaphore::new((workers / 2).max(1)))
});

/// How many calls of one family for one client address may run long at
/// once: that address's further requests of the family wait to be admitted
/// until one of them ends ([`address_turn`]). A stranger's flood of
/// CPU-bound requests from one address (free macro runs that spin until
/// their deadline) then runs this many at a time, however many connections
/// it holds, instead of each taking the cores until its first turn; its
/// other requests, and everyone else's, are not held up.
pub const LONG_PER_ADDRESS: u32 = 2;

/// A client address and a family.
type Whose = (IpAddr, Box<str>);

/// The long calls of each client address and family, and a wake-up for the
/// requests waiting on them.
struct Addresses {
    long: Mutex<HashMap<Whose, u32>>,
    /// Long calls of any address (none: admission looks no further).
    any: AtomicU32,
    ended: Notify,
}

static ADDRESSES: LazyLock<Addresses> = LazyLock::new(|| Addresses {
    long: Mutex::new(HashMap::new()),
    any: AtomicU32::new(0),
    ended: Notify::new(),
});

fn long_of(addr: IpAddr, family: &str) -> u32 {
    if ADDRESSES.any.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
    long.get(&(addr, family.into())).copied().unwrap_or(0)
}

/// A long call of a client address and family, counted until it is dropped
/// (with its call's limiter).
struct LongOf(Whose);

impl LongOf {
    fn new(whose: Whose) -> LongOf {
        let mut long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
        *long.entry(whose.clone()).or_insert(0) += 1;
        ADDRESSES.any.fetch_add(1, Ordering::AcqRel);
        LongOf(whose)
    }
}

impl Drop for LongOf {
    fn drop(&mut self) {
        let mut long = ADDRESSES.long.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = long.get_mut(&self.0) {
            *n -= 1;
            if *n == 0 {
                long.remove(&self.0);
            }
        }
        ADDRESSES.any.fetch_sub(1, Ordering::AcqRel);
        drop(long);
        ADDRESSES.ended.notify_waiters();
    }
}

/// Wait, at most `wait`, until fewer than [`LONG_PER_ADDRESS`] calls of
/// `family` for the client address `addr` run long. `false`: they still
/// did.
pub async fn address_turn(addr: IpAddr, family: &str, wait: Duration) -> bool {
    let until = tokio::time::Instant::now() + wait;
    let mut counted = false;
    loop {
        let ended = ADDRESSES.ended.notified();
        tokio::pin!(ended);
        // Registered before the count is read: an end in between wakes it.
        ended.as_mut().enable();
        if long_of(addr, family) < LONG_PER_ADDRESS {
            return true;
        }
        if !counted {
            counted = true;
            crate::metrics::metrics().address_waits.inc();
        }
        if tokio::time::timeout_at(until, ended).await.is_err() {
            return false;
        }
    }
}

/// Instants as microseconds since the process's first use of them, so a
/// yield's future can note when its call runs again in an atomic.
static ORIGIN: LazyLock<Instant> = LazyLock::new(Instant::now);

fn micros(at: Instant) -> u64 {
    at.saturating_duration_since(*ORIGIN).as_micros() as u64
}

/// What a call that reached an epoch tick on an async worker keeps for the
/// long-call gate: when it last started running again, and its turn.
struct Running {
    resumed: AtomicU64,
    turn: Mutex<Option<OwnedSemaphorePermit>>,
}

/// The limits of one plugin call: caps linear memory growth (remembering
/// whether the cap was hit) and holds the call's deadline.
pub struct CallLimiter {
    max_bytes: usize,
    pub(crate) hit: bool,
    /// When the call must end; the store's epoch callback checks it.
    deadline: Instant,
    /// How much [`CallLimiter::extend`] gave the call so far.
    extended: Duration,
    /// This thread's wait for a shared store when the call started
    /// ([`crate::store::pg::waited_here`]): the wait since is not the
    /// plugin's time either.
    store_base: Duration,
    /// The call runs on an async worker: it yields to the worker's other
    /// tasks on every epoch tick instead of running on.
    pub(crate) yields: bool,
    /// The call holds the commit batch (an inline write past its first
    /// storage use): it runs on through epoch ticks rather than yield,
    /// since every other writer waits for it (its deadline still holds).
    pub(crate) holds_batch: bool,
    /// When the call started (see [`CallLimiter::start`]).
    started: Instant,
    /// How long the call has run on its worker, counted at its yields.
    ran: Duration,
    /// Made at the call's first yield (most calls never reach one).
    running: Option<Arc<Running>>,
    /// The address of the client whose request this call serves, and the
    /// call's family (None: no client's, e.g. a fee quote at load).
    pub(crate) client: Option<Whose>,
    /// Counts the call among its client's long calls once it is one.
    long_of: Option<LongOf>,
}

/// Most a call's deadline is extended by host time in all: a plugin that
/// keeps the host busy for it (store round trips in a loop) still ends.
pub const MAX_EXTENSION: Duration = Duration::from_secs(30);

impl CallLimiter {
    pub fn new(max_bytes: usize) -> Self {
        CallLimiter {
            max_bytes,
            hit: false,
            deadline: Instant::now() + Duration::from_secs(3600),
            extended: Duration::ZERO,
            store_base: Duration::ZERO,
            yields: false,
            holds_batch: false,
            started: Instant::now(),
            ran: Duration::ZERO,
            running: None,
            client: None,
            long_of: None,
        }
    }

    /// Start the call's clock: it may run for `budget` from now.
    pub fn start(&mut self, budget: Duration) {
        self.started = Instant::now();
        self.deadline = self.started + budget;
        self.store_base = crate::store::pg::waited_here();
    }

    /// Let the call run at most `budget` more (never longer than before).
    pub fn shorten(&mut self, budget: Duration) {
        self.deadline = self.deadline.min(Instant::now() + budget);
    }

    /// Give the call `by` more: the wall time of a host call that must not
    /// count against the plugin (a call to the upstream webcash server, the
    /// wait for the commit batch), up to [`MAX_EXTENSION`] in all (a
    /// shared store's round trips are counted apart: [`CallLimiter::expired`]).
    pub fn extend(&mut self, by: Duration) {
        let by = by.min(MAX_EXTENSION.saturating_sub(self.extended));
        self.extended += by;
        self.deadline += by;
    }

    /// Whether the deadline has passed, not counting this thread's wait
    /// for a shared store since the call started (with what
    /// [`CallLimiter::extend`] gave, at most [`MAX_EXTENSION`]). A call
    /// runs on one thread when the store is shared; on the embedded store
    /// nothing is waited for there.
    pub fn expired(&self) -> bool {
        let store = crate::store::pg::waited_here().saturating_sub(self.store_base);
        let store = store.min(MAX_EXTENSION.saturating_sub(self.extended));
        Instant::now() >= self.deadline + store
    }
}

impl CallLimiter {
    /// The yield of a call on an async worker at an epoch tick: it lets the
    /// worker's other tasks run (tokio's yield, which also has the worker
    /// poll for I/O first, so a new request is seen within a tick). A call
    /// that has run [`LONG_CALL`] in all waits for one of the
    /// [`LONG_TURNS`] instead, unless it has one, and keeps it until it
    /// ends.
    pub fn yield_at_tick(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        let now = Instant::now();
        let since = match &self.running {
            Some(r) => r.resumed.load(Ordering::Relaxed),
            None => micros(self.started),
        };
        self.ran += Duration::from_micros(micros(now).saturating_sub(since));
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
        if self.ran >= LONG_CALL {
            if self.long_of.is_none()
                && let Some(whose) = self.client.take()
            {
                self.long_of = Some(LongOf::new(whose));
            }
            let mut turn = running.turn.lock().unwrap_or_else(|p| p.into_inner());
            if turn.is_none() {
                match LONG_TURNS.clone().try_acquire_owned() {
                    Ok(permit) => *turn = Some(permit),
                    Err(_) => wait = true,
                }
            }
        }
        // A call that waits no further than its deadline: at it, it goes
        // on without a turn, and the next epoch check ends it.
        let deadline = tokio::time::Instant::from_std(self.deadline);
        Box::pin(async move {
            if wait {
                crate::metrics::metrics().long_call_waits.inc();
                let turn = LONG_TURNS.clone().acquire_owned();
                // (The semaphore is never closed.)
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

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// Store data that carries a call limiter.
pub trait Limiter: Send + 'static {
    fn limiter(&mut self) -> &mut CallLimiter;
    fn memory_hit(&self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_address_waits_while_two_of_its_calls_of_a_family_run_long() {
        let a: IpAddr = "192.0.2.7".parse().unwrap();
        let b: IpAddr = "192.0.2.8".parse().unwrap();
        let short = Duration::from_millis(30);
        let first = LongOf::new((a, "mcp".into()));
        assert!(
            address_turn(a, "mcp", short).await,
            "one long call: admitted"
        );
        let second = LongOf::new((a, "mcp".into()));
        assert!(
            !address_turn(a, "mcp", short).await,
            "two: not within the wait"
        );
        // Another family of the address, and another address, go on.
        assert!(address_turn(a, "timeline", short).await);
        assert!(address_turn(b, "mcp", short).await);
        // One of the two ends while the third waits: it is admitted.
        let waiting = tokio::spawn(address_turn(a, "mcp", Duration::from_secs(30)));
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(waiting.await.unwrap(), "admitted once one ended");
        drop(second);
        assert_eq!(long_of(a, "mcp"), 0);
        assert!(
            ADDRESSES
                .long
                .lock()
                .unwrap()
                .get(&(a, "mcp".into()))
                .is_none()
        );
    }
}
