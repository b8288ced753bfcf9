//! The routes the host serves itself: the fee schedule (from the active
//! fee-policy component plus the host's rails) and the webcash-compatible
//! cash ledger. They sit in the same route table as the families' routes
//! and are reached the same way, over HTTP or by in-process dispatch.

use crate::reply::Reply;
use crate::runtime::Runtime;
use crate::runtime::routes::{Handler, Route};
use serde_json::json;
use std::sync::Arc;

/// The host's own routes: (method, pattern, handler name, writes).
const HOST_ROUTES: &[(&str, &str, &str, bool)] = &[
    ("GET", "/api/fees", "fees", false),
    ("POST", "/api/cash/replace", "cash_replace", true),
    ("POST", "/api/cash/health_check", "cash_health_check", true),
    // Where webcash wallets look: `{base}/api/v1/replace` and
    // `{base}/api/v1/health_check` (the alias folds `/api/v1` to `/api`).
    ("POST", "/api/replace", "cash_replace", true),
    ("POST", "/api/health_check", "cash_health_check", true),
];

/// The test-only native route (benchmark baseline).
const TESTING_ROUTES: &[(&str, &str, &str, bool)] =
    &[("GET", "/_testing/native", "native_ok", false)];

/// The host's routes for the route table.
pub fn routes(testing: bool) -> Vec<Route> {
    HOST_ROUTES
        .iter()
        .chain(TESTING_ROUTES.iter().filter(|_| testing))
        .map(|(method, pattern, name, writes)| Route {
            method: method.to_string(),
            pattern: pattern.to_string(),
            handler: Handler::Host(name),
            writes: *writes,
            paid: None,
            max_body: None,
        })
        .collect()
}

/// Run the host route `name`.
pub fn handle(rt: &Arc<Runtime>, name: &str, body: &[u8]) -> Reply {
    match name {
        "fees" => match rt.fee_schedule() {
            Ok(doc) => fee_schedule(&doc),
            Err(reply) => reply,
        },
        "cash_replace" => cash_replace(rt, body),
        "cash_health_check" => cash_health_check(rt, body),
        // The benchmark baseline: the same JSON as the trivial plugin route.
        "native_ok" => Reply::json(200, &json!({"ok": true})),
        _ => Reply::error(404, "not_found", format!("no handler {name}")),
    }
}

/// The fee plugin's schedule plus the host's payment rails.
fn fee_schedule(doc: &str) -> Reply {
    match serde_json::from_str::<serde_json::Value>(doc) {
        Ok(serde_json::Value::Object(mut map)) => {
            map.insert("rails".into(), rails());
            Reply::json(200, &serde_json::Value::Object(map))
        }
        _ => {
            tracing::error!("fee plugin returned a schedule that is not a JSON object");
            Reply::error(500, "internal", "internal error")
        }
    }
}

/// Payment rails of this host as JSON.
fn rails() -> serde_json::Value {
    crate::money::payments::RAILS
        .iter()
        .map(|(rail, header, enabled)| json!({"rail": rail, "header": header, "enabled": enabled}))
        .collect()
}

fn bad_request(field: &str, problem: impl Into<String>) -> Reply {
    let problem = problem.into();
    Reply::json(
        400,
        &json!({
            "code": "invalid_request",
            "message": format!("{field}: {problem}"),
            "details": [{"field": field, "problem": problem}],
        }),
    )
}

fn string_list(v: Option<&serde_json::Value>, field: &str) -> Result<Vec<String>, Reply> {
    match v {
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad_request(field, "must be a list of strings"))
            })
            .collect(),
        _ => Err(bad_request(field, "must be a list of strings")),
    }
}

/// `POST /api/cash/replace` (webcash semantics, atomic).
fn cash_replace(rt: &Arc<Runtime>, body: &[u8]) -> Reply {
    let doc: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return bad_request("body", format!("invalid JSON: {e}")),
    };
    let inputs = match string_list(doc.get("webcashes"), "webcashes") {
        Ok(v) => v,
        Err(r) => return r,
    };
    let outputs = match string_list(doc.get("new_webcashes"), "new_webcashes") {
        Ok(v) => v,
        Err(r) => return r,
    };
    let txn = match rt.storage.begin_write() {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("cash replace: {e}");
            return Reply::error(500, "internal", "internal error");
        }
    };
    if let Err(problem) = rt.ledger.replace(&txn, &inputs, &outputs) {
        return bad_request("webcashes", problem);
    }
    match rt.storage.commit(txn) {
        Ok(()) => Reply::json(200, &json!({"status": "success"})),
        Err(e) => {
            tracing::error!("cash replace commit: {e}");
            Reply::error(500, "internal", "internal error")
        }
    }
}

/// `POST /api/cash/health_check`: `[public strings]` -> states.
fn cash_health_check(rt: &Arc<Runtime>, body: &[u8]) -> Reply {
    let list: Vec<String> = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match string_list(Some(&v), "body") {
            Ok(l) => l,
            Err(r) => return r,
        },
        Err(e) => return bad_request("body", format!("invalid JSON: {e}")),
    };
    let result = rt.storage.begin_read().map_err(|e| {
        tracing::error!("cash health_check: {e}");
        Reply::error(500, "internal", "internal error")
    });
    match result {
        Ok(txn) => match rt.ledger.health_check(&txn, &list) {
            Ok(doc) => Reply::json(200, &doc),
            Err(problem) => bad_request("body", problem),
        },
        Err(r) => r,
    }
}
