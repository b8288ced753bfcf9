//! What a component's failure is answered and logged as: a trap, the
//! deadline, the memory cap (500 or 503, never a crash), and why a load's
//! smoke call refused a component; each loaded component's run of such
//! failures, which health and the admin API show.

use super::{LoadedPlugin, MIN_LOAD_BUDGET};
use crate::reply::Reply;
use crate::runtime::host::{FAULT_LINES_PER_SECOND, family_admits_fault};
use crate::runtime::limiter::MemoryHit;
use crate::runtime::status::LastFault;
use anyhow::anyhow;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use wasmtime::Trap;

/// A loaded component's calls that failed (a trap, the time limit, the
/// memory cap, answered with a server error) since the last one it answered, and
/// the last such failure: a component that fails every call is seen in
/// `GET /api/health` (`consecutive_faults`) and `GET /admin/plugins`
/// (`last_fault` too), not only in the log. A new version starts afresh.
/// (Boxed by its owner: a flood of faults writes here, and the fields
/// every call reads are kept off these cache lines.)
#[derive(Default)]
pub struct Faults {
    in_a_row: AtomicU64,
    last: Mutex<Option<LastFault>>,
}

impl Faults {
    /// A call the component answered: its run of failures is over. (Read
    /// before it is written: the common call writes nothing shared.)
    pub fn answered(&self) {
        if self.in_a_row.load(Ordering::Relaxed) != 0 {
            self.in_a_row.store(0, Ordering::Relaxed);
        }
    }

    /// A call that failed: the last failure is kept first, so a count
    /// read meanwhile has its reason.
    fn failed(&self, kind: &'static str, why: String) {
        let last = LastFault {
            at: crate::ids::rfc3339(std::time::SystemTime::now()),
            kind,
            why,
        };
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(last);
        self.in_a_row.fetch_add(1, Ordering::Relaxed);
    }

    /// Calls failed since the last it answered.
    pub fn in_a_row(&self) -> u64 {
        self.in_a_row.load(Ordering::Relaxed)
    }

    /// Its last failure, however long ago.
    pub fn last(&self) -> Option<LastFault> {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Whether a fault line of `family` may be written now (see
/// [`FAULT_LINES_PER_SECOND`]), and what it adds when earlier ones were
/// not.
fn fault_line(family: &str) -> Option<String> {
    let unwritten = family_admits_fault(family, crate::ids::unix_seconds())?;
    Some(if unwritten == 0 {
        String::new()
    } else {
        format!(
            " ({unwritten} more faults of this family were not logged since its last such line: at most {FAULT_LINES_PER_SECOND} a second are; marketplace_plugin_faults_total counts them all)"
        )
    })
}

/// A trap with its wasm backtrace, on one line: the backtrace names the
/// component's own functions, which it may have named anything.
pub(super) fn backtrace(err: &wasmtime::Error) -> String {
    crate::logging::one_line(&format!("{err:?}"), 16_384).into_owned()
}

/// The kind of a plugin fault, as metrics count it.
pub(super) fn fault_kind(err: &wasmtime::Error, memory_hit: bool) -> &'static str {
    if matches!(err.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        "timeout"
    } else if memory_hit {
        "memory"
    } else {
        "trap"
    }
}

/// What an endpoint component's exports must be, for refusals.
pub(super) const ENDPOINT_EXPORTS: &str = "its exports must have the types of the `endpoint` world of marketplace:plugin@0.2.0 in wit/marketplace.wit: the `handler` interface's handle(request) -> response, describe() -> plugin-info and describe-api() -> api";

/// Why a call at load (`describe`, `describe-api`, instantiation) failed,
/// in words a plugin author can act on: a time limit, the memory cap, or
/// the trap itself (a Rust panic is an `unreachable` trap), with the wasm
/// backtrace kept for the debug log.
pub(super) fn smoke_failure(
    what: &str,
    err: wasmtime::Error,
    memory_hit: bool,
    panic: Option<&str>,
) -> anyhow::Error {
    tracing::debug!("{what} failed: {}", backtrace(&err));
    let why = match (err.downcast_ref::<Trap>(), memory_hit) {
        (Some(Trap::Interrupt), _) => format!(
            "ran past its time limit at load (request_timeout_ms, at least {} s)",
            MIN_LOAD_BUDGET.as_secs()
        ),
        (_, true) => "grew past its memory cap (plugin_memory_mib)".to_string(),
        // (std's panic message reads "panicked at FILE:LINE:COL: ...".)
        (Some(Trap::UnreachableCodeReached), _) if let Some(panic) = panic => {
            if panic.starts_with("panicked at ") {
                panic.to_string()
            } else {
                format!("panicked: {panic}")
            }
        }
        (Some(Trap::UnreachableCodeReached), _) => {
            "trapped: unreachable code (a Rust panic traps so; the guest crate logs its message, `plugin panicked: ...`, just before)".to_string()
        }
        (Some(trap), _) => format!("trapped: {}", trap_text(trap)),
        (None, _) => root_cause(&err),
    };
    anyhow!("{what} {why}")
}

/// A trap in words: an out-of-bounds access says that a stack overflow
/// reads so too (the stack lies below the data in the layout README asks
/// for, so running off its end is such an access).
fn trap_text(trap: &Trap) -> String {
    match trap {
        Trap::MemoryOutOfBounds => format!(
            "{trap} (it may be a stack overflow, which reads so: the stack is the build's `-zstack-size`)"
        ),
        trap => trap.to_string(),
    }
}

/// A call's failure that is not a trap, in one line. A WASI import (std's
/// `println!`, `SystemTime::now`, of a `wasm32-wasip2` build) is linked
/// only as a trap, so that components std makes import it still load:
/// its message says what to use instead.
pub(super) fn root_cause(err: &wasmtime::Error) -> String {
    let cause = format!("{:#}", err.root_cause());
    if cause.contains("unknown import: `wasi:") || cause.contains("unknown import: wasi:") {
        format!(
            "{cause} (the host gives plugins no WASI: log through the `log` interface, read the time from `clock`; README \"Writing a plugin\")"
        )
    } else {
        cause
    }
}

/// What went wrong in a call of `plugin` that the host answers, mapped to
/// the protocol's answers, counted in its run of failures and logged
/// (within [`FAULT_LINES_PER_SECOND`]); `panic` is the message of the
/// panic the component logged before it trapped, if it did.
pub(super) fn fault_reply(
    plugin: &LoadedPlugin,
    err: &wasmtime::Error,
    memory: MemoryHit,
    panic: Option<&str>,
) -> Reply {
    let family = plugin.family.as_str();
    let kind = fault_kind(err, memory.any());
    crate::metrics::metrics().fault(family, kind);
    let line = fault_line(family);
    let why = fault_why(kind, err, panic);
    if matches!(err.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        if let Some(more) = line {
            tracing::warn!(family, "{why}{more}");
        }
        plugin.faults.failed(kind, why);
        // Retry-After as for the host's other 503s: a call can run out of
        // time on a busy machine or a slow store.
        Reply::error(
            503,
            "plugin_unavailable",
            format!("the {family} plugin exceeded its time limit"),
        )
        .retry_after_a_second()
    } else if memory.any() {
        if let Some(more) = line {
            tracing::warn!(family, "{why}{more}");
        }
        tracing::debug!(family, "after the memory limit: {}", backtrace(err));
        plugin.faults.failed(kind, why);
        let answer = Reply::error(
            503,
            "plugin_unavailable",
            format!("the {family} plugin exceeded its memory limit"),
        );
        // Only the share of all calls is worth a retry: the call's own
        // cap refuses the same request again.
        if memory == MemoryHit::AllCalls {
            answer.retry_after_a_second()
        } else {
            answer
        }
    } else {
        // One line an operator can read (the wasm backtrace, a dozen
        // lines, goes to the debug log).
        if let Some(more) = line {
            tracing::error!(family, "{why}{more}");
        }
        tracing::debug!(family, "plugin trap: {}", backtrace(err));
        plugin.faults.failed(kind, why);
        Reply::error(500, "internal", "internal error")
    }
}

/// A failed call of `kind` (from [`fault_kind`]) in a line's words, as
/// the log and the admin listing say it, whoever chose its answer. (What
/// failed after the memory cap was hit, say a wasip2 guest's report of
/// the failed allocation reaching for an import it lacks, is not the
/// cause: kept for the debug log.)
fn fault_why(kind: &str, err: &wasmtime::Error, panic: Option<&str>) -> String {
    match kind {
        "timeout" => "plugin exceeded its time limit (request_timeout_ms)".to_string(),
        "memory" => "plugin exceeded its memory limit (plugin_memory_mib, or plugin_memory_total_mib for all calls)".to_string(),
        _ => trapped(err, panic),
    }
}

/// A call's trap (or other failure) in a line's words: a Rust panic (an
/// `unreachable` trap) by the message the component logged before it, if
/// it did (that line may have been held back), and any other trap by
/// what it was.
fn trapped(err: &wasmtime::Error, panic: Option<&str>) -> String {
    let why = match (err.downcast_ref::<Trap>(), panic) {
        (Some(Trap::UnreachableCodeReached), Some(panic)) => panic.to_string(),
        (Some(Trap::UnreachableCodeReached), None) => {
            "unreachable code (a Rust panic traps so)".to_string()
        }
        (Some(trap), _) => trap_text(trap),
        (None, _) => root_cause(err),
    };
    format!("plugin trapped: {why}")
}

/// A failed call answered with the answer the component chose for it
/// beforehand (`status`): logged at `info` (within the family's fault
/// lines), and counted in its run of failures when that answer is a
/// server error; an answer of another status blames the request (a
/// macro's runaway script is the client's), so the run is left as it is.
pub(super) fn fault_answered_as_asked(
    plugin: &LoadedPlugin,
    err: &wasmtime::Error,
    memory_hit: bool,
    status: u16,
    panic: Option<&str>,
) {
    let family = plugin.family.as_str();
    let kind = fault_kind(err, memory_hit);
    crate::metrics::metrics().fault(family, kind);
    // One line: strangers can cause these (a runaway macro); the
    // backtrace is at debug.
    let why = fault_why(kind, err, panic);
    // (Only when the line can be written: one the filter drops would
    // take a place of the family's few and carry their count away.)
    let line = tracing::enabled!(tracing::Level::INFO)
        .then(|| fault_line(family))
        .flatten();
    if let Some(more) = line {
        tracing::info!(family, status, "{why}, answered as the plugin asked{more}");
    }
    tracing::debug!(
        family,
        "the fault answered as the plugin asked: {}",
        backtrace(err)
    );
    if status >= 500 {
        plugin.faults.failed(kind, why);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_of_faults_ends_with_an_answer() {
        let faults = Faults::default();
        assert_eq!((faults.in_a_row(), faults.last().is_none()), (0, true));
        faults.failed("trap", "plugin trapped: x".into());
        faults.failed("timeout", "plugin exceeded its time limit".into());
        assert_eq!(faults.in_a_row(), 2);
        faults.answered();
        assert_eq!(faults.in_a_row(), 0);
        // The last one stays listed, with its kind.
        let last = faults.last().expect("kept");
        assert_eq!(last.kind, "timeout");
        assert!(last.why.contains("time limit"), "{}", last.why);
    }

    #[test]
    fn a_trap_is_said_with_its_panic() {
        let unreachable = wasmtime::Error::from(Trap::UnreachableCodeReached);
        assert_eq!(
            trapped(&unreachable, Some("panicked at src/lib.rs:1:2: boom")),
            "plugin trapped: panicked at src/lib.rs:1:2: boom"
        );
        assert_eq!(
            trapped(&unreachable, None),
            "plugin trapped: unreachable code (a Rust panic traps so)"
        );
        // A panic logged before another trap is not its cause.
        let oob = wasmtime::Error::from(Trap::MemoryOutOfBounds);
        let why = trapped(&oob, Some("panicked at x"));
        assert!(why.contains("stack overflow"), "{why}");
    }
}
