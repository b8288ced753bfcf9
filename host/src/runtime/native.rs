//! The routes the host serves itself: the fee schedule (from the active
//! fee-policy component plus the host's rails), the webcash-compatible
//! cash ledger and its terms of service. They sit in the same route table
//! as the families' routes and are reached the same way, over HTTP or by
//! in-process dispatch.

use crate::money::ledger::LedgerError;
use crate::reply::Reply;
use crate::runtime::Runtime;
use crate::runtime::routes::{Handler, Route};
use serde_json::json;
use std::sync::Arc;

/// The host's own routes: (method, pattern, handler name, writes).
const HOST_ROUTES: &[(&str, &str, &str, bool)] = &[
    // Health is the host's own: it answers while components load or when
    // one fails to, and a load balancer's probe costs no plugin call.
    ("GET", "/api/health", "health", false),
    ("GET", "/api/fees", "fees", false),
    ("POST", "/api/cash/replace", "cash_replace", true),
    ("POST", "/api/cash/health_check", "cash_health_check", false),
    // Where webcash wallets look: `{base}/api/v1/replace` and
    // `{base}/api/v1/health_check` (the alias folds `/api/v1` to `/api`).
    ("POST", "/api/replace", "cash_replace", true),
    ("POST", "/api/health_check", "cash_health_check", false),
    // Upstream webcash mode: the value of a payment whose request failed.
    ("POST", "/api/cash/refund", "cash_refund", true),
    // The terms a wallet's `legalese.terms` accepts, as the public webcash
    // server serves them.
    ("GET", "/terms", "terms", false),
    ("GET", "/terms/text", "terms", false),
];

/// The terms served when the operator sets none (`[settings.cash] terms`).
pub const DEFAULT_TERMS: &str = "Terms of service of this marketplace's cash ledger

1. Cash on this service is webcash-compatible bearer cash: whoever holds a
   secret (e<amount>:secret:<hex>) can spend it. Keep secrets private; a
   lost or leaked secret cannot be recovered, frozen or reversed.
2. Amounts are accounted by this service's own ledger. They are redeemable
   only as this service's operator states.
3. Paid actions are priced by the fee schedule (/api/fees); a payment worth
   more than the price is spent whole and the change is returned as a new
   secret. Payments are final once the action succeeds.
4. The service is provided as is, without warranty of any kind.

Sending `legalese: {\"terms\": true}` to /api/v1/replace accepts these terms.
";

/// The test-only native route (benchmark baseline).
const TESTING_ROUTES: &[(&str, &str, &str, bool)] =
    &[("GET", "/_testing/native", "native_ok", false)];

/// Whether host route `name` answers from memory alone (no storage call
/// that could wait, no plugin call), so the server may run it on its async
/// worker instead of handing it to a blocking thread (that hand-off costs
/// more than these handlers do). Health asks the embedded store whether a
/// read transaction opens (memory only); on a shared store it asks the
/// database server, so it is handed off there.
pub fn runs_inline(rt: &Runtime, name: &str) -> bool {
    match name {
        "native_ok" | "terms" => true,
        "health" => !rt.storage.is_shared(),
        _ => false,
    }
}

/// Whether host handler `name` works on its body in memory some times
/// its size (the cash ledger's replace and health check parse up to
/// `max_body_bytes` of JSON): such requests run a few per core at once
/// (`server/http.rs`). Not `cash_refund`, which waits on the upstream.
pub fn parses_body(name: &str) -> bool {
    matches!(name, "cash_replace" | "cash_health_check")
}

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
            query: Box::default(),
            metrics: Default::default(),
        })
        .collect()
}

/// Run the host route `name`.
pub fn handle(rt: &Arc<Runtime>, name: &str, body: &[u8]) -> Reply {
    match name {
        "health" => health(rt),
        "fees" => match rt.fee_schedule() {
            Ok(doc) => fee_schedule(&doc),
            Err(reply) => reply,
        },
        // In upstream mode the payer's wallet lives at the upstream.
        "cash_replace" | "cash_health_check" if rt.upstream.is_some() => {
            crate::money::upstream::ledger_route(&*rt.state)
                .unwrap_or_else(|| Reply::error(500, "internal", "internal error"))
        }
        "cash_replace" => cash_replace(rt, body),
        "cash_health_check" => cash_health_check(rt, body),
        "cash_refund" => crate::money::upstream::claim(&*rt.state, body),
        "terms" => terms(rt),
        // The benchmark baseline: the same JSON as the trivial plugin route.
        "native_ok" => Reply::json(200, &json!({"ok": true})),
        _ => Reply::error(404, "not_found", format!("no handler {name}")),
    }
}

/// `GET /api/health`: the store's status and counters, and every family's
/// version and status; 503 `degraded` when the store does not answer or a
/// configured family is unavailable.
/// Serialized straight from borrowed fields (load balancers call it often;
/// building a `Value` tree first cost more than the rest of the request).
fn health(rt: &Runtime) -> Reply {
    use crate::runtime::engine::StatusView;
    use serde::ser::{Serialize, SerializeMap, SerializeStruct, Serializer};
    use std::cell::RefCell;

    // Fields in alphabetical order, as `json!` objects render.
    #[derive(serde::Serialize)]
    struct Health<'a, 'b> {
        alerts: Vec<crate::alerts::Alert>,
        plugins: Plugins<'a, 'b>,
        status: &'a str,
        storage: Store<'a>,
    }
    #[derive(serde::Serialize)]
    struct Store<'a> {
        backend: &'a str,
        commits: u64,
        status: &'a str,
        syncs: u64,
    }
    /// The statuses, serialized as they are walked (once).
    struct Plugins<'a, 'b>(RefCell<&'a mut dyn Iterator<Item = StatusView<'b>>>);
    struct Plugin<'a>(StatusView<'a>);
    struct Names<I>(RefCell<Option<I>>);
    impl<I: Iterator<Item = &'static str>> Serialize for Names<I> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_seq(self.0.borrow_mut().take().into_iter().flatten())
        }
    }
    impl Serialize for Plugin<'_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let v = &self.0;
            let mut st = s.serialize_struct("Plugin", 6)?;
            st.serialize_field("component", v.component)?;
            st.serialize_field("consecutive_faults", &v.consecutive_faults())?;
            let names = v.grants.capabilities.iter().map(|c| c.name());
            st.serialize_field("grants", &Names(RefCell::new(Some(names))))?;
            st.serialize_field("reads", &v.grants.reads)?;
            st.serialize_field("status", v.status)?;
            st.serialize_field("version", v.version)?;
            st.end()
        }
    }
    impl Serialize for Plugins<'_, '_> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let mut map = s.serialize_map(None)?;
            for v in &mut **self.0.borrow_mut() {
                map.serialize_entry(v.family, &Plugin(v))?;
            }
            map.end()
        }
    }

    let ok = rt.storage.healthy();
    // A disk under its reserve refuses writes until the operator frees
    // space: an alert, the status staying `ok` (a load balancer taking
    // the host out, or a restart, would stop its reads and free nothing).
    let disk = rt.storage.disk_low();
    // A configured family whose component was refused (or never found)
    // serves none of its routes: not a host to send traffic to.
    let families_ok = rt.with_statuses(|statuses| {
        let mut statuses = statuses;
        Iterator::all(&mut statuses, |v| v.status != "unavailable")
    });
    // `loading` (still 200: the host answers) until every configured
    // family of the start is loaded or refused, so a client waiting for
    // `ok` does not meet a family's 503 `plugin_unavailable`; then
    // `degraded` if one was refused.
    let status = match (ok, rt.loading(), families_ok) {
        (false, _, _) => "degraded",
        (true, true, _) => "loading",
        (true, false, false) => "degraded",
        (true, false, true) => "ok",
    };
    rt.with_statuses(|statuses| {
        let mut alerts = crate::alerts::all();
        if let Some((free, reserve)) = disk {
            alerts.push(crate::alerts::disk_full(free, reserve));
        }
        let health = Health {
            alerts,
            plugins: Plugins(RefCell::new(statuses)),
            status,
            storage: Store {
                backend: rt.storage.backend_name(),
                commits: rt.storage.request_commits(),
                status: match (ok, disk) {
                    (false, _) => "error",
                    (true, Some(_)) => "disk_full",
                    (true, None) => "ok",
                },
                syncs: rt.storage.syncs(),
            },
        };
        // (The built-in families' health is about 2 KB: written in one
        // buffer, not grown from 128 bytes by copying.)
        let reply = Reply::json_sized(if status == "degraded" { 503 } else { 200 }, &health, 4096);
        if ok {
            reply
        } else {
            // The store may answer again any moment (a restart, a
            // network blip): when to look again.
            reply.retry_after_a_second()
        }
    })
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

fn string_list(v: Option<&serde_json::Value>, field: &str) -> Result<Vec<String>, Reply> {
    match v {
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .map(|i| {
                i.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| Reply::invalid(field, "must be a list of strings"))
            })
            .collect(),
        _ => Err(Reply::invalid(field, "must be a list of strings")),
    }
}

/// `GET /terms`, `GET /terms/text`: the operator's terms
/// (`[settings.cash] terms`), as text.
fn terms(rt: &Arc<Runtime>) -> Reply {
    let text = rt
        .config
        .family_setting(crate::config::CASH_SETTINGS, "terms")
        .filter(|t| !t.trim().is_empty())
        .unwrap_or_else(|| DEFAULT_TERMS.to_string());
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/plain; charset=utf-8".into())],
        body: text.into_bytes(),
    }
}

/// `POST /api/cash/replace` (webcash semantics, atomic). As the public
/// webcash server: `legalese`, when sent, must accept the terms; a replace
/// of nothing for nothing succeeds.
fn cash_replace(rt: &Arc<Runtime>, body: &[u8]) -> Reply {
    let doc: serde_json::Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Reply::invalid("body", format!("invalid JSON: {e}")),
    };
    if let Some(legalese) = doc.get("legalese")
        && legalese.get("terms") != Some(&serde_json::Value::Bool(true))
    {
        return Reply::invalid(
            "legalese",
            "terms must be true: accept the terms of service (GET /terms)",
        );
    }
    let inputs = match string_list(doc.get("webcashes"), "webcashes") {
        Ok(v) => v,
        Err(r) => return r,
    };
    let outputs = match string_list(doc.get("new_webcashes"), "new_webcashes") {
        Ok(v) => v,
        Err(r) => return r,
    };
    if inputs.is_empty() && outputs.is_empty() {
        return Reply::json(200, &json!({"status": "success"}));
    }
    match rt
        .storage
        .write(|txn| rt.ledger.replace(txn, &inputs, &outputs))
    {
        Ok(Ok(())) => Reply::json(200, &json!({"status": "success"})),
        Ok(Err(LedgerError::Refused(field, problem))) => Reply::invalid(field, problem),
        Ok(Err(LedgerError::Storage(e))) => {
            storage_error(rt, &format!("cash replace: {e}"));
            Reply::error(500, "internal", "internal error")
        }
        Err(e) => {
            storage_error(rt, &format!("cash replace: {e}"));
            crate::reply::storage_failure(&e)
        }
    }
}

/// Log a host route's storage failure (summarized while the shared store
/// is unavailable).
fn storage_error(rt: &Runtime, message: &str) {
    crate::logging::request_error(rt.storage.unavailable_lately(), None, message);
}

/// `POST /api/cash/health_check`: `[public strings]` -> states, the
/// `results` members in the order of the request (written out by hand:
/// serde_json's maps are sorted).
fn cash_health_check(rt: &Arc<Runtime>, body: &[u8]) -> Reply {
    let list: Vec<String> = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(v) => match string_list(Some(&v), "body") {
            Ok(l) => l,
            Err(r) => return r,
        },
        Err(e) => return Reply::invalid("body", format!("invalid JSON: {e}")),
    };
    let result = rt.storage.begin_read().map_err(|e| {
        storage_error(rt, &format!("cash health_check: {e}"));
        Reply::error(500, "internal", "internal error")
    });
    match result {
        Ok(txn) => match rt.ledger.health_check(&txn, &list) {
            Ok(results) => {
                let mut text = String::from(r#"{"results":{"#);
                for (i, (public, state)) in results.iter().enumerate() {
                    if i > 0 {
                        text.push(',');
                    }
                    text.push_str(&serde_json::Value::from(public.as_str()).to_string());
                    text.push(':');
                    text.push_str(&state.to_string());
                }
                text.push_str(r#"},"status":"success"}"#);
                Reply {
                    status: 200,
                    headers: vec![],
                    body: text.into_bytes(),
                }
            }
            Err(LedgerError::Refused(field, problem)) => Reply::invalid(field, problem),
            Err(LedgerError::Storage(e)) => {
                storage_error(rt, &format!("cash health_check: {e}"));
                Reply::error(500, "internal", "internal error")
            }
        },
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route the host serves itself (the testing one aside) is in
    /// the assembled document, from the host's own OpenAPI file, and in
    /// the route table.
    #[test]
    fn the_host_routes_are_documented_and_routed() {
        let host = routes(false);
        let served = crate::runtime::api::assemble(host.clone(), &[], None).unwrap();
        let doc: serde_json::Value = serde_json::from_str(&served.openapi).unwrap();
        for route in &host {
            let path = &route.pattern;
            let op = &doc["paths"][path][route.method.to_ascii_lowercase()];
            assert!(op.is_object(), "{} {path} is not documented", route.method);
            assert!(
                matches!(
                    served.table.find(&route.method, path),
                    crate::runtime::routes::Match::Found { .. }
                ),
                "{} {path} is not routed",
                route.method
            );
        }
        assert_eq!(served.table.routes().count(), host.len());
    }
}
