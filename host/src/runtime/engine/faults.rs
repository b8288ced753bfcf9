//! What a component's failure is answered and logged as: a trap, the
//! deadline, the memory cap (500 or 503, never a crash), and why a load's
//! smoke call refused a component.

use super::MIN_LOAD_BUDGET;
use crate::reply::Reply;
use crate::runtime::limiter::MemoryHit;
use anyhow::anyhow;
use wasmtime::Trap;

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

/// What went wrong in a plugin call, mapped to the protocol's answers.
pub(super) fn fault_reply(family: &str, err: &wasmtime::Error, memory: MemoryHit) -> Reply {
    crate::metrics::metrics().fault(family, fault_kind(err, memory.any()));
    if matches!(err.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
        tracing::warn!(
            family,
            "plugin exceeded its time limit (request_timeout_ms)"
        );
        // Retry-After as for the host's other 503s: a call can run out of
        // time on a busy machine or a slow store.
        Reply::error(
            503,
            "plugin_unavailable",
            format!("the {family} plugin exceeded its time limit"),
        )
        .retry_after_a_second()
    } else if memory.any() {
        // (What failed after the cap was hit, say a wasip2 guest's report
        // of the failed allocation reaching for an import it lacks, is not
        // the cause: kept for the debug log.)
        tracing::warn!(
            family,
            "plugin exceeded its memory limit (plugin_memory_mib, or plugin_memory_total_mib for all calls)"
        );
        tracing::debug!(family, "after the memory limit: {}", backtrace(err));
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
        let why = match err.downcast_ref::<Trap>() {
            Some(Trap::UnreachableCodeReached) => {
                "unreachable code (a Rust panic; its message is the `plugin panicked` line before)"
                    .to_string()
            }
            Some(trap) => trap_text(trap),
            None => root_cause(err),
        };
        tracing::error!(family, "plugin trapped: {why}");
        tracing::debug!(family, "plugin trap: {}", backtrace(err));
        Reply::error(500, "internal", "internal error")
    }
}
