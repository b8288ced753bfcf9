//! The limits of one plugin call: a memory cap (remembering whether it was
//! hit) and a deadline the store's epoch callback checks.

use crate::runtime::long_calls::LongCall;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;

/// Bytes of linear memory the calls in progress hold, and the most they
/// may hold together (`plugin_memory_total_mib`): without it, a flood of
/// free calls that each grow to their own cap (macros from many
/// addresses) held gigabytes at once.
static IN_USE: AtomicUsize = AtomicUsize::new(0);
static TOTAL: AtomicUsize = AtomicUsize::new(usize::MAX);

/// Set the most linear memory all calls may hold together.
pub fn set_total(bytes: usize) {
    TOTAL.store(bytes, Ordering::Relaxed);
}

/// The linear memory the calls in progress hold now (the
/// `marketplace_plugin_memory_bytes` gauge, set when metrics are read).
pub fn in_use() -> usize {
    IN_USE.load(Ordering::Relaxed)
}

/// Which memory limit a call ran into, if any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MemoryHit {
    #[default]
    None,
    /// Its own cap (`plugin_memory_mib`): the same request hits it again.
    OwnCap,
    /// What all calls in progress may hold together
    /// (`plugin_memory_total_mib`): another time it may fit.
    AllCalls,
}

impl MemoryHit {
    /// Whether the call ran into either.
    pub fn any(self) -> bool {
        self != MemoryHit::None
    }
}

/// The limits of one plugin call: caps linear memory growth (remembering
/// which cap was hit) and holds the call's deadline.
pub struct CallLimiter {
    max_bytes: usize,
    pub(crate) hit: MemoryHit,
    /// Bytes of linear memory this call holds, counted in [`IN_USE`].
    granted: usize,
    /// Not held to the total: a load's calls, so that a flood of requests
    /// cannot refuse a sound component.
    outside_total: bool,
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
    /// Its part in the long calls' turns ([`crate::runtime::long_calls`]).
    pub(crate) long: LongCall,
    /// How long its client's request waited for its address's other long
    /// calls before it was admitted ([`crate::runtime::host::Caller`]).
    pub(crate) turn_waited: Duration,
}

impl Drop for CallLimiter {
    fn drop(&mut self) {
        if self.granted > 0 {
            IN_USE.fetch_sub(self.granted, Ordering::AcqRel);
        }
    }
}

/// A call's growth was refused since every call's memory together would
/// pass `total`: one line a second at most (a flood refuses many).
fn total_used_up(total: usize) {
    static LINES: crate::logging::Throttle = crate::logging::Throttle::new(Duration::from_secs(1));
    if let Some(n) = LINES.note() {
        tracing::warn!(
            refused_since_last_line = n,
            "plugin calls hold plugin_memory_total_mib ({} MiB) of memory in all: a call's growth was refused (it fails as at its own cap)",
            total >> 20
        );
    }
}

/// Most a call's deadline is extended by host time in all: a plugin that
/// keeps the host busy for it (store round trips in a loop) still ends.
pub const MAX_EXTENSION: Duration = Duration::from_secs(30);

impl CallLimiter {
    pub fn new(max_bytes: usize) -> Self {
        CallLimiter {
            max_bytes,
            hit: MemoryHit::None,
            granted: 0,
            outside_total: false,
            deadline: Instant::now() + Duration::from_secs(3600),
            extended: Duration::ZERO,
            store_base: Duration::ZERO,
            yields: false,
            holds_batch: false,
            long: LongCall::default(),
            turn_waited: Duration::ZERO,
        }
    }

    /// The limits of a load's call: its memory is not held to the
    /// requests' total.
    pub fn outside_total(max_bytes: usize) -> Self {
        let mut limiter = CallLimiter::new(max_bytes);
        limiter.outside_total = true;
        limiter
    }

    /// Start the call's clock: it may run for `budget` from now.
    pub fn start(&mut self, budget: Duration) {
        let now = Instant::now();
        self.long.start(now);
        self.deadline = now + budget;
        self.store_base = crate::store::pg::waited_here();
    }

    /// At an epoch tick: count the call's own time since the last tick.
    /// True once it is a long call that should count against its client
    /// address ([`LongCall::account`], [`LongCall::account_cpu`] for a call
    /// that never yields).
    pub fn account_long(&mut self) -> bool {
        if self.yields {
            self.long.account()
        } else {
            self.long.account_cpu()
        }
    }

    /// When the call must end (as extended so far).
    pub fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Let the call run at most `budget` more (never longer than before).
    ///
    /// The call also ends by twice `budget` from its start, less the time
    /// its request waited for its client address's other long calls
    /// ([`crate::runtime::long_calls`]; not its waits for a slot, which
    /// other clients' requests cause) and plus what [`CallLimiter::extend`]
    /// gave back: so code on a budget (a macro: at most about 1 s of its
    /// own, answered within 2 s, PROTOCOL 8) whose client sent several at
    /// once is answered within about twice it from when it was ready.
    pub fn shorten(&mut self, budget: Duration) {
        self.deadline = self.deadline.min(Instant::now() + budget);
        if let Some(started) = self.long.started() {
            let cap = (started + budget.saturating_mul(2) + self.extended)
                .checked_sub(self.turn_waited)
                .unwrap_or(started);
            self.deadline = self.deadline.min(cap);
        }
    }

    /// Give the call `by` more: the wall time of a host call that must not
    /// count against the plugin (a call to the upstream webcash server, the
    /// wait for the commit batch), up to [`MAX_EXTENSION`] in all (a
    /// shared store's round trips are counted apart: [`CallLimiter::expired`]).
    pub fn extend(&mut self, by: Duration) {
        // Not the plugin's own running time either.
        self.long.waited(by);
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

impl ResourceLimiter for CallLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = MemoryHit::OwnCap;
            return Ok(false);
        }
        let more = desired.saturating_sub(current);
        if more > 0 && !self.outside_total {
            let before = IN_USE.fetch_add(more, Ordering::AcqRel);
            let total = TOTAL.load(Ordering::Relaxed);
            if before.saturating_add(more) > total {
                IN_USE.fetch_sub(more, Ordering::AcqRel);
                self.hit = MemoryHit::AllCalls;
                total_used_up(total);
                return Ok(false);
            }
            self.granted += more;
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
