//! `log`: one line into the host log, attributed to the family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::log;
use std::borrow::Cow;

/// Characters of one plugin log line at most.
const MAX_CHARS: usize = 4096;
/// Lines one call may log at most...
const MAX_LINES: u32 = 100;
/// ...and their bytes at most.
const MAX_BYTES: usize = 64 << 10;

/// What one call (a request's, a fee quote's) has logged: a stranger's
/// request must not make a plugin flood the operator's log.
#[derive(Default)]
pub struct LogBudget {
    lines: u32,
    bytes: usize,
}

impl LogBudget {
    /// Whether a line of `len` bytes may still be written; the first line
    /// refused says that the rest of the call's are dropped.
    fn admit(&mut self, family: &str, len: usize) -> bool {
        let over = self.lines >= MAX_LINES || self.bytes + len > MAX_BYTES;
        if over {
            if self.lines != u32::MAX {
                self.lines = u32::MAX;
                tracing::warn!(
                    plugin = family,
                    "this call's further log lines are dropped (a call logs at most {MAX_LINES} lines, {} KiB)",
                    MAX_BYTES >> 10
                );
            }
            return false;
        }
        self.lines += 1;
        self.bytes += len;
        true
    }
}

/// `message` on one line: control characters (a line break that would
/// forge a host log line of its own, say) written as escapes, at most
/// [`MAX_CHARS`] characters.
fn one_line(message: &str) -> Cow<'_, str> {
    let cut = message
        .char_indices()
        .nth(MAX_CHARS)
        .map_or(message, |(at, _)| &message[..at]);
    if !cut.chars().any(char::is_control) {
        return Cow::Borrowed(cut);
    }
    let mut out = String::with_capacity(cut.len() + 16);
    for c in cut.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// Write one plugin log line, within the call's `budget`.
pub(super) fn write_log(family: &str, budget: &mut LogBudget, level: log::Level, message: &str) {
    let message = one_line(message);
    if !budget.admit(family, message.len()) {
        return;
    }
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
        write_log(&self.family, &mut self.logged, level, &message);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_stays_one_line() {
        assert_eq!(one_line("plain text é"), "plain text é");
        assert_eq!(
            one_line("hi\n2026-11-29T08:00:00Z  INFO forged\r\t\u{1b}[31m"),
            "hi\\n2026-11-29T08:00:00Z  INFO forged\\r\\t\\u{1b}[31m"
        );
        assert_eq!(one_line(&"x".repeat(5000)).len(), MAX_CHARS);
    }

    #[test]
    fn a_call_logs_a_bounded_amount() {
        let mut budget = LogBudget::default();
        assert!((0..MAX_LINES).all(|_| budget.admit("f", 10)));
        assert!(!budget.admit("f", 1));
        assert!(!budget.admit("f", 1));
        let mut budget = LogBudget::default();
        assert!(budget.admit("f", MAX_BYTES - 1));
        assert!(!budget.admit("f", 2));
    }
}
