//! A template endpoint plugin: the family `template`, with its own routes
//! `GET /api/template/notes` and `POST /api/template/notes`. Copy this
//! crate, rename it (crate, `NAME`, routes, schema names), and replace the
//! routes in `src/api.rs` and their handlers here.
//!
//! A family declares what it serves in its `describe-api` export (here
//! `src/api.rs`): each route (method, path pattern, whether it writes, its
//! fee) with its OpenAPI operation, and the schemas those operations
//! reference. The host builds its route table and `/openapi.json` (and so
//! `/docs`) from that; a route or schema name another family already has
//! is refused. Build it with either:
//!
//! ```sh
//! cargo build --release --target wasm32-wasip2 -p template
//! cargo component build --release -p template
//! ```
//!
//! then mount it as a new family `template`: upload it to the admin
//! listener's `PUT /admin/plugins/template` (`marketplace plugins load
//! template target/wasm32-wasip2/release/template.wasm --admin
//! http://127.0.0.1:<admin-port>` does that), or drop it into
//! `<plugins_dir>/families/template.wasm`. It needs no capability: it uses
//! only its own keyspace.
//!
//! The host gives every request a fresh instance and one storage
//! transaction: whatever `kv::put` writes commits only if you answer 2xx.

mod api;

use api::MAX_NOTE;
use marketplace_guest::prelude::*;

struct Template;

impl Endpoint for Template {
    const NAME: &'static str = "template";
    // The operator's settings it reads (`[settings.<family>]`), each with
    // a check: a load refuses a value a check refuses and logs a key not
    // listed. It reads none.
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(&[]);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            // A read: the count and the newest notes.
            ("GET", "/api/template/notes") => {
                let limit = req.query_int("limit", 1, 100)?.unwrap_or(20) as u32;
                let count: u64 = kv::get("count")?.unwrap_or(0);
                let notes = kv::scan_prefix(None, "note/", true, limit)?
                    .into_iter()
                    .map(|(key, bytes)| kv::parse::<String>(&key, &bytes))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(json(200, &json!({"count": count, "notes": notes})))
            }
            // A write: validate the body (400 with details), then store.
            ("POST", "/api/template/notes") => {
                let mut body = Body::parse(req)?;
                let note = body.required_str("note", MAX_NOTE);
                body.finish()?;
                let count: u64 = kv::get("count")?.unwrap_or(0);
                kv::put("count", &(count + 1))?;
                // Zero-padded, so keys sort in writing order.
                kv::put(&format!("note/{count:020}"), &note)?;
                Ok(json(201, &json!({"count": count + 1, "note": note})))
            }
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

marketplace_guest::endpoint_plugin!(Template);
