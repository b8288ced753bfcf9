//! Test-only: a sound endpoint (`GET /api/slow/ping`) whose `describe-api`
//! smoke call computes for a while (a few hundred milliseconds here) before it
//! answers, as a family with a large OpenAPI does on a busy machine. A
//! host whose `request_timeout_ms` is shorter than that must still load
//! it: the calls of a load are not a request.

use marketplace_guest::openapi::{self, Op, op};
use marketplace_guest::prelude::*;

/// Rounds of arithmetic `describe-api` does before it answers.
const ROUNDS: u64 = 200_000_000;

const OPS: &[Op] = &[Op {
    ok: (200, "SlowPing"),
    ..op(
        "GET",
        "/api/slow/ping",
        "slowPing",
        "slow",
        "Ping",
        "Answers at once; only describing the family is slow.",
    )
}];

struct Slow;

impl Endpoint for Slow {
    const NAME: &'static str = "slow";

    fn api() -> marketplace_guest::types::Api {
        let mut x = std::hint::black_box(1u64);
        for i in 0..ROUNDS {
            x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
        }
        let description = format!("Answers ({}).", x % 2 + 1);
        openapi::api(
            OPS,
            json!({ "SlowPing": { "type": "object", "description": description } }),
        )
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("GET", "/api/slow/ping") => Ok(json(200, &json!({"pong": true}))),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

marketplace_guest::endpoint_plugin!(Slow);
