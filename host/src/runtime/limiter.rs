//! The limits of one plugin call: a memory cap (remembering whether it was
//! hit) and a deadline the store's epoch callback checks.

use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;

/// The limits of one plugin call: caps linear memory growth (remembering
/// whether the cap was hit) and holds the call's deadline.
pub struct CallLimiter {
    max_bytes: usize,
    pub(crate) hit: bool,
    /// When the call must end; the store's epoch callback checks it.
    deadline: Instant,
}

impl CallLimiter {
    pub fn new(max_bytes: usize) -> Self {
        CallLimiter {
            max_bytes,
            hit: false,
            deadline: Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Start the call's clock: it may run for `budget` from now.
    pub fn start(&mut self, budget: Duration) {
        self.deadline = Instant::now() + budget;
    }

    /// Let the call run at most `budget` more (never longer than before).
    pub fn shorten(&mut self, budget: Duration) {
        self.deadline = self.deadline.min(Instant::now() + budget);
    }

    /// Give the call `by` more: the wall time of a host call that must not
    /// count against the plugin (a call to the upstream webcash server).
    pub fn extend(&mut self, by: Duration) {
        self.deadline += by;
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
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
