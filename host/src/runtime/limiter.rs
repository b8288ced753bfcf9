//! The limits of one plugin call: a memory cap (remembering whether it was
//! hit) and a deadline the store's epoch callback checks.

use crate::runtime::long_calls::LongCall;
use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;

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
    /// Its part in the long calls' turns ([`crate::runtime::long_calls`]).
    pub(crate) long: LongCall,
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
            long: LongCall::default(),
        }
    }

    /// Start the call's clock: it may run for `budget` from now.
    pub fn start(&mut self, budget: Duration) {
        self.long.start();
        self.deadline = Instant::now() + budget;
        self.store_base = crate::store::pg::waited_here();
    }

    /// When the call must end (as extended so far).
    pub fn deadline(&self) -> Instant {
        self.deadline
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
