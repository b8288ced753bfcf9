//! `log`: one line into the host log, attributed to the family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::log;
use std::borrow::Cow;

/// Characters of one plugin log line at most.
const MAX_CHARS: usize = 4096;
/// Lines one call may log at most...
const MAX_LINES: u32 = 100;
/// ...and error lines past them (a panic's message, after a chatty call).
const MORE_ERRORS: u32 = 8;
/// ...and their bytes at most.
const MAX_BYTES: usize = 64 << 10;

/// Bytes of log lines one family may write in a second, all its calls
/// together: a call's own budget bounds one request, this one a flood of
/// them (a plugin writing 21 KB a request filled 227 MiB of log in 5 s).
const FAMILY_BYTES_PER_SECOND: usize = 1 << 20;
/// What a line costs beyond its message: the time, level, request span
/// and family the log writes with it (an empty message is a line too).
const LINE_COST: usize = 128;
/// Panic messages a family logs in a second at most (an operator needs
/// to see why calls trap, not each one: one written for every panicking
/// request had a client on four connections fill 113 MB of log in 3 s,
/// outside audit, ninety-sixth session); past the family's byte cap, only
/// a request's first, cut to [`PANIC_CHARS_PAST_CAP`] characters.
const PANIC_LINES_PER_SECOND: u32 = 5;
const PANIC_CHARS_PAST_CAP: usize = 500;
/// The host's lines of a family's failed calls (trapped, out of time, out
/// of memory) written in a second at most: a stranger can make a component
/// fail every request (a body it panics on, a runaway macro), and one
/// line each beside the access line doubled what a flood wrote. The rest
/// are counted, and the next line written says how many were not.
pub(crate) const FAULT_LINES_PER_SECOND: u32 = 5;

/// Each family's window: its second, the bytes, panic messages and fault
/// lines it logged in it, and the fault lines not written since the last
/// that was (carried over from second to second).
#[derive(Clone, Copy)]
struct Window {
    second: u64,
    bytes: usize,
    panic_lines: u32,
    fault_lines: u32,
    unwritten_faults: u64,
}

static FAMILY_WINDOWS: std::sync::Mutex<Option<std::collections::HashMap<String, Window>>> =
    std::sync::Mutex::new(None);

/// `family`'s window for `second`, to change under the lock.
fn with_window<T>(family: &str, second: u64, f: impl FnOnce(&mut Window) -> T) -> T {
    let mut windows = FAMILY_WINDOWS.lock().unwrap_or_else(|e| e.into_inner());
    let windows = windows.get_or_insert_with(Default::default);
    let fresh = Window {
        second,
        bytes: 0,
        panic_lines: 0,
        fault_lines: 0,
        unwritten_faults: 0,
    };
    let window = match windows.get_mut(family) {
        Some(w) => w,
        None => windows.entry(family.to_string()).or_insert(fresh),
    };
    // (Forward only: a call on another thread still in the second
    // before charges the current one, not a fresh one of its own.)
    if second > window.second {
        *window = Window {
            unwritten_faults: window.unwritten_faults,
            ..fresh
        };
    }
    f(window)
}

/// Whether `family` may log `len` more bytes in `second` (of the Unix
/// clock); its first line refused in a second says that the family's
/// lines are being dropped (written once the windows' lock is let go).
fn family_admits(family: &str, len: usize, second: u64) -> bool {
    let (admitted, newly_full) = with_window(family, second, |window| {
        if window.bytes + len <= FAMILY_BYTES_PER_SECOND {
            window.bytes += len;
            (true, false)
        } else {
            // Past the cap, marked full: said once a second.
            let newly_full = window.bytes < FAMILY_BYTES_PER_SECOND;
            window.bytes = FAMILY_BYTES_PER_SECOND;
            (false, newly_full)
        }
    });
    if newly_full {
        tracing::warn!(
            plugin = family,
            "this family's log lines are dropped for the rest of this second (a family logs at most {} KiB a second, its calls together; of the panic messages past that, a request's first, at most {PANIC_LINES_PER_SECOND} a second, cut to {PANIC_CHARS_PAST_CAP} characters)",
            FAMILY_BYTES_PER_SECOND >> 10
        );
    }
    admitted
}

/// Whether `family` may log one more panic message in `second`: the
/// first [`PANIC_LINES_PER_SECOND`] of the second.
fn family_admits_panic(family: &str, second: u64) -> bool {
    with_window(family, second, |window| {
        let admitted = window.panic_lines < PANIC_LINES_PER_SECOND;
        window.panic_lines += u32::from(admitted);
        admitted
    })
}

/// Whether the host may write a line of `family`'s failed call in
/// `second`, with the number of its fault lines not written since the
/// last one that was (see [`FAULT_LINES_PER_SECOND`]).
pub(crate) fn family_admits_fault(family: &str, second: u64) -> Option<u64> {
    with_window(family, second, |window| {
        if window.fault_lines < FAULT_LINES_PER_SECOND {
            window.fault_lines += 1;
            Some(std::mem::take(&mut window.unwritten_faults))
        } else {
            window.unwritten_faults += 1;
            None
        }
    })
}

/// What one client request has logged, through its own call and every
/// call it dispatched (a clone shares the count), or a fee quote: a
/// stranger's request must not make plugins flood the operator's log.
/// Made on first use: a call that neither logs nor dispatches allocates
/// nothing for it.
#[derive(Default)]
pub struct LogBudget(std::sync::OnceLock<std::sync::Arc<std::sync::Mutex<Logged>>>);

impl Clone for LogBudget {
    fn clone(&self) -> Self {
        LogBudget(std::sync::OnceLock::from(self.shared().clone()))
    }
}

#[derive(Default)]
struct Logged {
    lines: u32,
    errors_past: u32,
    bytes: usize,
    said: bool,
    /// The call's panic message went out past the family's cap.
    panic_passed: bool,
}

impl LogBudget {
    fn shared(&self) -> &std::sync::Arc<std::sync::Mutex<Logged>> {
        self.0.get_or_init(Default::default)
    }

    /// Whether this is the first panic message of the request's calls: it
    /// may be written past the family's cap (an operator needs to see why
    /// a call trapped), once, within [`PANIC_LINES_PER_SECOND`].
    fn first_panic(&self) -> bool {
        let mut logged = self.shared().lock().unwrap_or_else(|e| e.into_inner());
        !std::mem::replace(&mut logged.panic_passed, true)
    }

    /// Whether a line of `len` bytes may still be written (an error line
    /// has [`MORE_ERRORS`] more); the first line refused says that the
    /// rest of the request's are dropped.
    fn admit(&self, family: &str, len: usize, error: bool) -> bool {
        let mut logged = self.shared().lock().unwrap_or_else(|e| e.into_inner());
        let within = logged.lines < MAX_LINES && logged.bytes + len <= MAX_BYTES;
        if within || (error && logged.errors_past < MORE_ERRORS && len <= MAX_BYTES) {
            if within {
                logged.lines += 1;
                logged.bytes += len;
            } else {
                logged.errors_past += 1;
            }
            return true;
        }
        if !logged.said {
            logged.said = true;
            tracing::warn!(
                plugin = family,
                "this call's further log lines are dropped (a call logs at most {MAX_LINES} lines, {} KiB)",
                MAX_BYTES >> 10
            );
        }
        false
    }
}

/// `message` on one line, at most [`MAX_CHARS`] characters (see
/// [`crate::logging::one_line`]).
fn one_line(message: &str) -> Cow<'_, str> {
    crate::logging::one_line(message, MAX_CHARS)
}

/// A plugin's `message` as it is written: on one line, with the hex of any
/// cash secret in it redacted.
fn printable(message: &str) -> Cow<'_, str> {
    use crate::runtime::routes::redact_secret_text;
    match one_line(message) {
        Cow::Borrowed(line) => redact_secret_text(line),
        Cow::Owned(line) => Cow::Owned(redact_secret_text(&line).into_owned()),
    }
}

/// Write one plugin log line, within the call's `budget`; a line the log
/// filter drops costs the call nothing of it.
pub(super) fn write_log(family: &str, budget: &LogBudget, level: log::Level, message: &str) {
    // (A tracing level is a constant of each call site.)
    macro_rules! write_at {
        ($level:ident, $event:ident) => {{
            if !tracing::enabled!(tracing::Level::$level) {
                return;
            }
            let message = printable(message);
            let error = matches!(level, log::Level::Error);
            if !budget.admit(family, message.len(), error) {
                return;
            }
            let second = crate::ids::unix_seconds();
            let panic = error && message.starts_with(PANIC_PREFIX);
            if panic && !family_admits_panic(family, second) {
                return;
            }
            if family_admits(family, message.len() + LINE_COST, second) {
                tracing::$event!(plugin = family, "{message}");
            } else if panic && budget.first_panic() {
                let cut = crate::logging::one_line(&message, PANIC_CHARS_PAST_CAP);
                tracing::$event!(plugin = family, "{cut}");
            }
        }};
    }
    match level {
        log::Level::Trace => write_at!(TRACE, trace),
        log::Level::Debug => write_at!(DEBUG, debug),
        log::Level::Info => write_at!(INFO, info),
        log::Level::Warn => write_at!(WARN, warn),
        log::Level::Error => write_at!(ERROR, error),
    }
}

/// How the guest crate's panic hook begins the line it logs.
const PANIC_PREFIX: &str = "plugin panicked: ";

/// The message of a panic the guest crate logs just before its instance
/// traps (`plugin panicked: ...` at `error`), on one line, kept once per
/// call in `panicked` (a smoke call's refusal quotes it).
pub(super) fn note_panic(panicked: &mut Option<String>, level: log::Level, message: &str) {
    if level == log::Level::Error
        && panicked.is_none()
        && let Some(panic) = message.strip_prefix(PANIC_PREFIX)
    {
        // ("panicked at FILE:LINE:COL:\nMESSAGE": one line.)
        let panic = panic.replace('\n', " ");
        *panicked = Some(crate::logging::one_line(&printable(&panic), 500).into_owned());
    }
}

impl log::Host for Ctx {
    fn log(&mut self, level: log::Level, message: String) {
        note_panic(&mut self.panicked, level, &message);
        if level == log::Level::Error && self.store_unavailable_lately() {
            crate::logging::request_error(true, Some(&self.family), &printable(&message));
            return;
        }
        // A lost race is routine on a shared store (logged by the host at
        // `info`, and the request runs again): what the component says of
        // it is not an error of the service.
        let level = if level == log::Level::Error && self.conflicted() {
            log::Level::Debug
        } else {
            level
        };
        write_log(&self.family, &self.logged, level, &message);
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
        // Separators some viewers break lines at, and bidi controls.
        assert_eq!(
            one_line("a\u{2028}b\u{2029}c\u{202e}d"),
            "a\\u{2028}b\\u{2029}c\\u{202e}d"
        );
    }

    #[test]
    fn a_family_logs_a_bounded_amount_a_second() {
        // (Family names of this test's own: the windows are the process's.)
        let family = "log-window-test";
        let line = 60 << 10;
        let fits = FAMILY_BYTES_PER_SECOND / line;
        assert!((0..fits).all(|_| family_admits(family, line, 7)));
        assert!(!family_admits(family, line, 7));
        assert!(
            !family_admits(family, 1, 7),
            "full for the rest of the second"
        );
        // Another family has its own; the next second starts again.
        assert!(family_admits("log-window-other", line, 7));
        assert!((0..fits).all(|_| family_admits(family, line, 8)));
        assert!(!family_admits(family, line, 8));
        // A first panic message per request may pass the family's cap...
        let budget = LogBudget::default();
        assert!(budget.first_panic());
        assert!(!budget.first_panic());
        // ...and a family logs the first few of a second, cap or not.
        let panics = (0..PANIC_LINES_PER_SECOND + 5)
            .filter(|_| family_admits_panic(family, 8))
            .count();
        assert_eq!(panics, PANIC_LINES_PER_SECOND as usize);
        assert!(
            family_admits_panic(family, 9),
            "the next second starts again"
        );
    }

    #[test]
    fn a_family_writes_a_few_fault_lines_a_second_and_counts_the_rest() {
        // (Family names of this test's own: the windows are the process's.)
        let family = "fault-lines-test";
        let written = (0..FAULT_LINES_PER_SECOND)
            .map(|_| family_admits_fault(family, 7))
            .collect::<Vec<_>>();
        assert_eq!(written, vec![Some(0); FAULT_LINES_PER_SECOND as usize]);
        assert_eq!(family_admits_fault(family, 7), None);
        assert_eq!(family_admits_fault(family, 7), None);
        // Another family has its own window; the panic messages theirs.
        assert_eq!(family_admits_fault("fault-lines-other", 7), Some(0));
        assert!(family_admits_panic(family, 7));
        // The next second's first line says how many were not written.
        assert_eq!(family_admits_fault(family, 8), Some(2));
        assert_eq!(family_admits_fault(family, 8), Some(0));
        // A late caller of the second before charges this one.
        assert_eq!(family_admits_fault(family, 7), Some(0));
        assert_eq!(family_admits_fault(family, 8), Some(0));
        assert_eq!(family_admits_fault(family, 8), Some(0));
        assert_eq!(family_admits_fault(family, 8), None);
        assert_eq!(family_admits_fault(family, 9), Some(1));
    }

    #[test]
    fn a_call_logs_a_bounded_amount() {
        let budget = LogBudget::default();
        // A dispatched call counts against its caller's budget.
        let dispatched = budget.clone();
        assert!((0..MAX_LINES / 2).all(|_| budget.admit("f", 10, false)));
        assert!((MAX_LINES / 2..MAX_LINES).all(|_| dispatched.admit("f", 10, false)));
        assert!(!budget.admit("f", 1, false));
        assert!(!budget.admit("f", 1, false));
        // A few error lines (a panic's message) still pass, then no more.
        assert!((0..MORE_ERRORS).all(|_| budget.admit("f", 10, true)));
        assert!(!budget.admit("f", 10, true));
        let budget = LogBudget::default();
        assert!(budget.admit("f", MAX_BYTES - 1, false));
        assert!(!budget.admit("f", 2, false));
    }
}
