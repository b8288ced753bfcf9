//! The routes of the test-only `testing` family (mounted only with
//! `testing_routes = true`), with minimal OpenAPI.

use marketplace_guest::openapi::{self, Op, Query, op};
use marketplace_guest::prelude::*;
use marketplace_guest::settings;

/// What every misbehaving route accepts first.
const FAULT: &[Query] = &[
    (
        "fault",
        "integer",
        false,
        "answer this status if the call faults",
    ),
    ("clear", "string", false, "take the fault answer back"),
    ("budget_ms", "integer", false, "shorten the deadline"),
];

/// Every operation of the family.
pub const OPS: &[Op] = &[
    op(
        "GET",
        "/_testing/ok",
        "testingOk",
        "testing",
        "Trivial answer",
        "The dispatch benchmark's route.",
    ),
    Op {
        query: &[(
            "bytes",
            "integer",
            false,
            "how long the answer is (at most 8 MiB)",
        )],
        ..op(
            "GET",
            "/_testing/large",
            "testingLarge",
            "testing",
            "A large answer",
            "Answers `bytes` bytes of text: what a client that does not read holds.",
        )
    },
    op(
        "GET",
        "/_testing/headers",
        "testingHeaders",
        "testing",
        "Header names",
        "Answers with the names of the request headers the host passed.",
    ),
    Op {
        query: &[
            ("status", "integer", false, "the status to answer"),
            (
                "empty",
                "integer",
                false,
                "1: answer the status alone, without headers or body",
            ),
        ],
        ..op(
            "GET",
            "/_testing/framing",
            "testingFraming",
            "testing",
            "Forged framing",
            "Answers with its own Content-Length, Transfer-Encoding and Connection headers, which the host must not send, and payment and credential headers only the host (or a family granted credentials) may send.",
        )
    },
    Op {
        query: FAULT,
        ..op(
            "GET",
            "/_testing/trap",
            "testingTrap",
            "testing",
            "Trap",
            "Panics.",
        )
    },
    Op {
        query: &[
            FAULT[0],
            FAULT[1],
            FAULT[2],
            (
                "hold_mib",
                "integer",
                false,
                "MiB of memory held while it spins",
            ),
            (
                "spin_ms",
                "integer",
                false,
                "spin this many milliseconds (host clock), then answer 200",
            ),
        ],
        ..op(
            "GET",
            "/_testing/loop",
            "testingLoop",
            "testing",
            "Spin",
            "Loops until the deadline (or for spin_ms).",
        )
    },
    Op {
        query: FAULT,
        ..op(
            "GET",
            "/_testing/alloc",
            "testingAlloc",
            "testing",
            "Allocate",
            "Allocates until the memory cap.",
        )
    },
    Op {
        query: &[
            ("key", "string", false, "default k"),
            ("value", "string", false, "default v"),
            ("status", "integer", false, "answer status, default 200"),
            (
                "read",
                "string",
                false,
                "a key read first, its value answered",
            ),
            (
                "hold_ms",
                "integer",
                false,
                "then hold the request (and its commit batch) this long",
            ),
        ],
        errors: &[400],
        ..op(
            "POST",
            "/_testing/write",
            "testingWrite",
            "testing",
            "Write, then answer a status",
            "Writes persist only when the status is 2xx.",
        )
    },
    Op {
        query: &[("key", "string", false, "default k")],
        ..op(
            "GET",
            "/_testing/read",
            "testingRead",
            "testing",
            "Read a key",
            "",
        )
    },
    Op {
        paid: Some("post"),
        query: &[(
            "fail",
            "string",
            false,
            "trap or status: fail after charging",
        )],
        ok: (201, "Any"),
        errors: &[409],
        ..op(
            "POST",
            "/_testing/paid",
            "testingPaid",
            "testing",
            "Charge, write, then fail as asked",
            "Nothing may be spent or written unless the answer is 2xx.",
        )
    },
    op(
        "POST",
        "/_testing/payout",
        "testingPayout",
        "testing",
        "Escrow payout",
        "Pays out of a test escrow account.",
    ),
    op(
        "GET",
        "/_testing/held",
        "testingHeld",
        "testing",
        "Escrow held",
        "What a test escrow account holds.",
    ),
    Op {
        query: &[("msg", "string", false, "the line to log")],
        ..op(
            "GET",
            "/_testing/log",
            "testingLog",
            "testing",
            "Log a line",
            "Writes `msg` into the host log at info level.",
        )
    },
    Op {
        query: &[
            ("key", "string", false, "default k"),
            ("put", "string", false, "keep this text under the key first"),
        ],
        ..op(
            "GET",
            "/_testing/memo",
            "testingMemo",
            "testing",
            "Keep and read the family's memo",
            "Answers whether `put` was kept and what the memo holds under `key`.",
        )
    },
    Op {
        query: &[
            ("mode", "string", true, "seed, writes, get_many or scan"),
            ("n", "integer", false, "how many values (default 1)"),
            ("key", "string", false, "seed / get_many key, default big"),
            ("prefix", "string", false, "scan prefix, default big"),
            ("packed", "string", false, "1: the packed storage calls"),
        ],
        errors: &[400],
        ..op(
            "POST",
            "/_testing/hog",
            "testingHog",
            "testing",
            "Ask the host for a lot of memory",
            "Writes or reads many 8 MiB values in one request; the host's byte budgets must refuse it.",
        )
    },
    // An `/api/` route (dispatch reaches only those) that writes (a
    // family's own routes are dispatch targets only where they write).
    Op {
        errors: &[400],
        ..op(
            "POST",
            "/api/testing/relay",
            "testingRelay",
            "testing",
            "Dispatch itself, one level deeper",
            "Body {n}: dispatches POST /api/testing/relay with {n: n + 1} and answers {n, inner: {status, body}}: how deep dispatched requests nest.",
        )
    },
    Op {
        errors: &[400],
        ..op(
            "POST",
            "/api/testing/dispatch",
            "testingDispatch",
            "testing",
            "Dispatch a POST with headers of the plugin's choosing",
            "Body {path, headers: [[name, value]], body, read, status}: dispatches POST path (when given) with those headers and that JSON body, then reads the key `read` (when given), and answers {status, body, read} (the dispatched answer's status and body, the value read) with status `status` (200 when absent): which headers a dispatched request may pay with, and what a refusal after a dispatched write does.",
        )
    },
];

/// The settings the family reads: `api_padding_kib` (0 to 1024) adds a
/// schema `TestingPadding` whose `example` is about that many KiB of
/// JSON, `api_padding_depth` (1 to 60, default 1) arrays deep: the
/// largest, deepest OpenAPI a family can declare, to show that the
/// service's documents still render (or that the host refuses it).
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "api_padding_kib",
        check: |v| settings::whole(v, 0, 1024).map(drop),
    },
    Setting {
        key: "api_padding_depth",
        check: |v| settings::whole(v, 1, 60).map(drop),
    },
];

/// What the family serves (its `describe-api` export); every schema it
/// references is the host's, but the padding its settings ask for.
pub fn api() -> marketplace_guest::types::Api {
    let setting = |key, default| {
        // Natively (the unit tests) there is no host to ask.
        if cfg!(not(target_arch = "wasm32")) {
            return default;
        }
        marketplace_guest::endpoint_bindings::marketplace::plugin::settings::get(key)
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(default)
    };
    let kib = setting("api_padding_kib", 0);
    if kib == 0 {
        return openapi::api(OPS, json!({}));
    }
    // The innermost array holds the bytes as `0,` pairs: one scalar per
    // two bytes, each its own line of the YAML, indented by its depth.
    let mut example = Value::Array(vec![json!(0); kib * 512]);
    for _ in 1..setting("api_padding_depth", 1) {
        example = Value::Array(vec![example]);
    }
    openapi::api(
        OPS,
        json!({"TestingPadding": {"type": "array", "example": example}}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_are_the_familys() {
        assert_eq!(openapi::check(OPS, &json!({})), Ok(()));
        let expected = [
            ("GET", "/_testing/ok", false),
            ("GET", "/_testing/large", false),
            ("GET", "/_testing/headers", false),
            ("GET", "/_testing/framing", false),
            ("GET", "/_testing/trap", false),
            ("GET", "/_testing/loop", false),
            ("GET", "/_testing/alloc", false),
            ("POST", "/_testing/write", true),
            ("GET", "/_testing/read", false),
            ("POST", "/_testing/paid", true),
            ("POST", "/_testing/payout", true),
            ("GET", "/_testing/held", false),
            ("GET", "/_testing/log", false),
            ("GET", "/_testing/memo", false),
            ("POST", "/_testing/hog", true),
            ("POST", "/api/testing/relay", true),
            ("POST", "/api/testing/dispatch", true),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
