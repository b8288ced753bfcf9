//! The `info` family: `GET /api/info`, `GET /api/developers`. (`GET
//! /api/health` is the host's own, so it answers while components load.)

mod api;

use marketplace_guest::prelude::*;
use marketplace_guest::{host, payments};

struct Info;

impl Endpoint for Info {
    const NAME: &'static str = "info";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(&[]);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("GET", "/api/info") => Ok(info()),
            ("GET", "/api/developers") => Ok(developers()),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

fn plugins_by_family() -> Value {
    let mut map = serde_json::Map::new();
    for p in host::plugins() {
        map.insert(
            p.family,
            json!({"version": p.version, "status": p.status, "component": p.component,
                   "grants": p.grants, "reads": p.reads}),
        );
    }
    Value::Object(map)
}

fn info() -> Response {
    let (name, version) = host::service();
    let rails: Vec<Value> = host::payment_rails()
        .into_iter()
        .map(|r| json!({"rail": r.rail, "header": r.header, "enabled": r.enabled}))
        .collect();
    json(
        200,
        &json!({
            "name": name,
            "version": version,
            "description": "Marketplace API: listings, search, Ed25519 identities, ratings and escrow contracts, paid in bearer cash.",
            "payment_rails": rails,
            "fee_schedule_url": "/api/fees",
            "fee_policy": payments::policy(),
            "plugins": plugins_by_family(),
            "openapi": "/openapi.yaml",
            "docs": "/docs",
            "manifest": "/.well-known/agent.json",
        }),
    )
}

/// The WIT package plugins are built against, served verbatim.
const WIT: &str = include_str!("../../../wit/marketplace.wit");

fn developers() -> Response {
    json(
        200,
        &json!({
            "wit_package": "marketplace:plugin@0.2.0",
            "wit_path": "wit/marketplace.wit",
            "worlds": [
                {"name": "endpoint", "export": "handler", "purpose": "an endpoint family: handle(request) -> response, describe(), describe-api() (its routes and their OpenAPI)"},
                {"name": "fee-policy", "export": "fees", "purpose": "prices paid actions: quote(action, basis), schedule(), policy()"},
            ],
            "families": ["info", "identity", "timeline", "search", "contracts", "mcp", "fees"],
            "template": "plugins/template: a new family `template` with its own routes (copy the crate, rename it, edit src/lib.rs and src/api.rs)",
            "guest_helper_crate": "plugins/guest (marketplace-guest)",
            "script_crate": "plugins/script (marketplace-script): a TypeScript/JavaScript sandbox for plugins that run user code",
            "capabilities": {
                "always": ["storage (own keyspace)", "clock", "ids", "log", "settings", "memo"],
                "granted": ["payments", "signatures", "escrow", "dispatch", "host-info", "limits", "arbiter", "credentials"],
                "credentials": "no interface: the client's authorization, proxy-authorization and cookie headers reach the family, and its set-cookie, clear-site-data, www-authenticate and proxy-authenticate reach the client",
                "read": "other families' keyspaces, one by one",
                "grant": "[families.NAME] grants = [...], read = [...] in the config, or PUT /admin/plugins/NAME?grants=...&read=...",
                "refusal": "a component importing a capability its family was not granted is refused at load, naming both",
            },
            "build": [
                "rustup target add wasm32-wasip2",
                "cargo build --release --target wasm32-wasip2 -p <crate>",
                "cargo component build --release -p <crate>",
                "cargo xtask build-plugins (every crate under plugins/, into target/plugins/)",
                "without WASI (a leaner instance per request): cargo build --release --target wasm32-unknown-unknown -p <crate> with linker = \"wasm-component-ld\" for that target (see .cargo/config.toml); marketplace-guest brings the allocator; std's clock, files and environment are unavailable",
            ],
            "output": "target/<target>/release/<crate>.wasm",
            "load": [
                "a new family: copy the .wasm to <plugins_dir>/families/<family>.wasm (mounted by the watcher with no capability granted beyond the defaults: one that imports payments, signatures, ... needs [families.<family>] component = \"families/<family>.wasm\" and grants = [...] in the config), or",
                "marketplace plugins load <family> <file.wasm> --admin http://127.0.0.1:<admin-port> (PUT /admin/plugins/<family>; mounts an unknown family)",
                "an existing family: copy the .wasm over its component in the plugins directory (hot reload)",
                "unmount: marketplace plugins unmount <family> --admin URL (DELETE /admin/plugins/<family>)",
            ],
            "limits": {
                "per_request_deadline_ms": "configurable, default 1000",
                "memory_mib": "configurable, default 64",
                "instance": "a fresh instance per request; storage writes commit only on a 2xx answer",
            },
            "wit": WIT,
        }),
    )
}

marketplace_guest::endpoint_plugin!(Info);
