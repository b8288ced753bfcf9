//! The imports of a fee-policy component: `log` and `settings`.

use super::Limiter;
use crate::runtime::bindings::endpoint::marketplace::plugin::{log, settings, types};
use crate::runtime::limiter::CallLimiter;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Store data of one fee-policy call.
pub struct FeeCtx {
    limiter: CallLimiter,
    settings: Arc<BTreeMap<String, String>>,
    logged: super::log::LogBudget,
    /// The panic message logged before a trap (a smoke call quotes it).
    panicked: Option<String>,
}

impl FeeCtx {
    pub fn new(memory_bytes: usize, settings: Arc<BTreeMap<String, String>>) -> FeeCtx {
        FeeCtx {
            limiter: CallLimiter::new(memory_bytes),
            settings,
            logged: Default::default(),
            panicked: None,
        }
    }

    /// The message of a panic the component logged, if it did.
    pub fn panic_message(&self) -> Option<&str> {
        self.panicked.as_deref()
    }
}

impl settings::Host for FeeCtx {
    fn get(&mut self, key: String) -> Option<String> {
        self.settings.get(&key).cloned()
    }

    fn keys(&mut self) -> Vec<String> {
        self.settings.keys().cloned().collect()
    }
}

impl Limiter for FeeCtx {
    fn limiter(&mut self) -> &mut CallLimiter {
        &mut self.limiter
    }
    fn memory_limit(&self) -> crate::runtime::limiter::MemoryHit {
        self.limiter.hit
    }
    fn count_long(&mut self) {
        // A fee call serves no client of its own.
    }
}

impl types::Host for FeeCtx {}

impl log::Host for FeeCtx {
    fn log(&mut self, level: log::Level, message: String) {
        super::log::note_panic(&mut self.panicked, level, &message);
        super::log::write_log("fees", &self.logged, level, &message);
    }
}
