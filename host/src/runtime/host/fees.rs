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
}

impl FeeCtx {
    pub fn new(memory_bytes: usize, settings: Arc<BTreeMap<String, String>>) -> FeeCtx {
        FeeCtx {
            limiter: CallLimiter::new(memory_bytes),
            settings,
            logged: Default::default(),
        }
    }
}

impl settings::Host for FeeCtx {
    fn get(&mut self, key: String) -> Option<String> {
        self.settings.get(&key).cloned()
    }
}

impl Limiter for FeeCtx {
    fn limiter(&mut self) -> &mut CallLimiter {
        &mut self.limiter
    }
    fn memory_hit(&self) -> bool {
        self.limiter.hit
    }
    fn count_long(&mut self) {
        // A fee call serves no client of its own.
    }
}

impl types::Host for FeeCtx {}

impl log::Host for FeeCtx {
    fn log(&mut self, level: log::Level, message: String) {
        super::log::write_log("fees", &self.logged, level, &message);
    }
}
