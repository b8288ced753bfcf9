//! A template endpoint plugin. Copy this crate, rename it, and replace the
//! routes. Build it with either:
//!
//! ```sh
//! cargo build --release --target wasm32-wasip2 -p template
//! cargo component build --release -p template
//! ```
//!
//! then load the `.wasm` for a family (`marketplace plugins load <family>
//! <file> --admin URL`, or drop it into the watched plugins directory).
//!
//! The host gives every request a fresh instance and one storage
//! transaction: whatever `kv::put` writes commits only if you answer 2xx.

use marketplace_guest::prelude::*;

struct Template;

impl Endpoint for Template {
    const NAME: &'static str = "template";

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match req.method() {
            // Reads: count how often this route was written.
            "GET" => {
                let count: u64 = kv::get("count")?.unwrap_or(0);
                Ok(json(
                    200,
                    &json!({"plugin": Self::NAME, "route": req.route(), "count": count}),
                ))
            }
            // Writes: validate the body (400 with details), then store.
            _ => {
                let mut body = Body::parse(req)?;
                let note = body.required_str("note", 200);
                body.finish()?;
                let count: u64 = kv::get("count")?.unwrap_or(0);
                kv::put("count", &(count + 1))?;
                kv::put(&format!("note/{count}"), &note)?;
                Ok(json(201, &json!({"count": count + 1})))
            }
        }
    }
}

marketplace_guest::endpoint_plugin!(Template);
