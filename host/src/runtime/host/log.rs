//! `log`: one line into the host log, attributed to the family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::log;

/// Write one plugin log line (at most 4096 characters).
pub(super) fn write_log(family: &str, level: log::Level, message: &str) {
    let message: String = message.chars().take(4096).collect();
    match level {
        log::Level::Trace => tracing::trace!(plugin = family, "{message}"),
        log::Level::Debug => tracing::debug!(plugin = family, "{message}"),
        log::Level::Info => tracing::info!(plugin = family, "{message}"),
        log::Level::Warn => tracing::warn!(plugin = family, "{message}"),
        log::Level::Error => tracing::error!(plugin = family, "{message}"),
    }
}

impl log::Host for Ctx {
    fn log(&mut self, level: log::Level, message: String) {
        write_log(&self.family, level, &message);
    }
}
