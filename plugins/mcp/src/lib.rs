//! The `mcp` family: MCP tool endpoints and macros, the JSON-RPC MCP server
//! at `/mcp`, the A2A agent at `/a2a` with its card, the agent manifest, the
//! OpenAPI document, the HTML reference and docs search.
//!
//! Keyspace `mcp`: `macro/{name}` -> macro definition, `macro_count`,
//! `macro_count_unsigned` (macros without an owner),
//! `macro_count_owner/{fingerprint}` (the macros an identity owns,
//! defined since owners were capped);
//! `a2a/task/{id}` -> an A2A task, `a2a/task_count`.
//!
//! Built-in tools run through the host's in-process dispatch, so they answer
//! exactly what the HTTP endpoint would (a paid target without payment gives
//! its 402).
//!
//! Where things are: `tools` (the built-in tools as data, their schemas,
//! `GET /api/mcp`), `macros` (user-defined search tools), `run` (running a
//! tool or an endpoint, `execute`), `rpc` (`POST /mcp`'s JSON-RPC envelope
//! and batches), `methods` (the MCP methods), `modern` (the stateless
//! revision 2026-07-28), `resources`, `prompts`, `schema` (tools' input
//! schemas), `x402`, `origin` (browsers' origins and settings), `a2a` (and its 0.3 translation, `a2a::v03`),
//! `openapi` (the service's document, its renderings and docs search),
//! `api` (this family's own routes).

// The OpenAPI schemas are large `json!` literals.
#![recursion_limit = "512"]

mod a2a;
mod api;
mod macros;
mod methods;
mod modern;
mod openapi;
mod origin;
mod prompts;
mod resources;
mod rpc;
mod run;
mod schema;
mod tools;
mod x402;

use macros::define;
use marketplace_guest::prelude::*;
use marketplace_guest::{host, index::search_term, memoized};
use methods::spoken_versions;
use rpc::{CORS, jsonrpc};
use run::{execute, forward_origin, run_search};
use tools::describe;

struct Mcp;

impl Endpoint for Mcp {
    const NAME: &'static str = "mcp";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(origin::SETTINGS);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        forward_origin(req);
        let version = host::service().1;
        match (req.method(), req.route()) {
            ("GET", "/api/mcp") => describe(&version),
            ("POST", "/api/mcp/tools/search") => {
                let args = Value::Object(req.json_object()?);
                Ok(run_search(&args)?)
            }
            ("POST", "/api/mcp/tools/define") => define(req),
            ("POST", "/api/mcp/tools/execute") => execute(req),
            // Against DNS rebinding: a browser's Origin must be one this
            // service answers to (MCP 2025-11-25: 403, a JSON-RPC error
            // without an id). An allowed browser page reads every answer,
            // errors and faults included.
            ("POST", "/mcp") => Ok(match origin::cors(req) {
                Err(refused) => origin::refused_origin(&refused),
                Ok(cors) => {
                    CORS.with(|c| *c.borrow_mut() = cors.clone());
                    let mut answer = jsonrpc(req, &version).unwrap_or_else(Response::from);
                    answer.headers.extend(cors);
                    answer
                }
            }),
            ("OPTIONS", "/mcp") => Ok(origin::preflight(req)),
            ("POST", "/a2a") => a2a::handle(req),
            ("GET", "/api/docs/search") => {
                let q = req
                    .query("q")
                    .ok_or_else(|| ApiError::invalid("q", "is required"))?;
                let q = search_term(q).map_err(|p| ApiError::invalid("q", p.rule()))?;
                let limit = req.query_int("limit", 1, 50)?.unwrap_or(10) as usize;
                // Derived from the host's document alone: built once per
                // load of components.
                let index = memoized("docs-search.txt", || {
                    Ok(openapi::search_index(&*openapi::document()?))
                })?;
                Ok(raw(openapi::search(&index, q, limit), "application/json"))
            }
            ("GET", "/.well-known/agent.json") => Ok(json(200, &manifest(&version))),
            ("GET", "/.well-known/agent-card.json") => {
                Ok(json(200, &a2a::card(&origin::base(req), &version)))
            }
            // The three are the host's document, which only a load of
            // components changes, and what is rendered of it: made once
            // per load, with a tag that lets a client revalidate (304).
            ("GET", "/openapi.json") => tagged_document("openapi.json", "application/json", || {
                openapi::document_text()
            }),
            ("GET", "/openapi.yaml") => {
                tagged_document("openapi.yaml", "application/yaml; charset=utf-8", || {
                    Ok(openapi::to_yaml(&*openapi::document()?))
                })
            }
            ("GET", "/docs") => tagged_document("docs.html", "text/html; charset=utf-8", || {
                Ok(openapi::html(&*openapi::document()?))
            }),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

/// A document rendered once per load of components (see [`memoized`]),
/// with its `ETag`: its bytes' SHA-256 (half), taken once per load too, by
/// which the host answers a client's `If-None-Match` with a 304.
fn tagged_document(
    key: &str,
    content_type: &str,
    render: impl FnOnce() -> Result<String, ApiError>,
) -> Result<Response, ApiError> {
    let text = memoized(key, render)?;
    let tag = memoized(&format!("{key}.etag"), || {
        Ok(format!(
            "\"{}\"",
            &marketplace_common::hex::sha256(&text)[..32]
        ))
    })?;
    let mut answer = raw(text, content_type);
    answer.headers.push(("etag".into(), tag));
    Ok(answer)
}

fn raw(text: String, content_type: &str) -> Response {
    Response {
        status: 200,
        headers: vec![("content-type".into(), content_type.into())],
        body: text.into_bytes(),
    }
}

fn manifest(version: &str) -> Value {
    json!({
        "name": "marketplace",
        "version": version,
        "description": "Marketplace API where people and agents post listings, search them, register Ed25519 identities, rate each other and trade through escrow (arbitration) contracts. Spam-costly mutations are paid in bearer cash (HTTP 402).",
        "capabilities": [
            "posts", "comments", "attachments", "search", "identities", "profiles", "ratings",
            "arbitration-contracts", "escrow", "witnesses", "mcp-tools", "mcp-macros", "mcp-jsonrpc",
            "mcp-resources", "mcp-prompts",
            "a2a-jsonrpc",
            "auth:ed25519-signature", "payment:http-402", "payment:webcash (X-Cash-Secret)",
            "payment:x402 (PAYMENT-SIGNATURE, PAYMENT-REQUIRED)",
        ],
        "openapi": "/openapi.yaml",
        "docs": "/docs",
        "mcp": {
            "tools_search": "/api/mcp/tools/search",
            "tools_define": "/api/mcp/tools/define",
            "tools_execute": "/api/mcp/tools/execute",
            "description": "/api/mcp",
            "jsonrpc": "/mcp",
            "protocol_versions": spoken_versions(),
        },
        "a2a": {"card": "/.well-known/agent-card.json", "jsonrpc": "/a2a"},
        "fees": "/api/fees",
    })
}

marketplace_guest::endpoint_plugin!(Mcp);
