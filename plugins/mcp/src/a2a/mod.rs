//! `POST /a2a`: an A2A 1.0 agent over the JSON-RPC binding, and its card
//! (`GET /.well-known/agent-card.json`); A2A 0.3's methods and shapes too
//! (`v03`).
//!
//! Two skills, answered at once as completed tasks:
//! - `search`: a text part is the search term (or a data part `{term,
//!   limit?, post_type?}`); the answer is a short text and a data part with
//!   the results;
//! - `contract_status`: a data part `{contract_id}`, or a text naming the
//!   contract (`contract CTR_...`); the answer is its status and allowed
//!   actions.
//!
//! Both run through the host's in-process dispatch (the same routes as
//! `GET /api/search` and `GET /api/arbitration/contracts/{id}/status`).
//! A task is a snapshot of what was answered, so `SendMessage` stores it
//! (keyspace `mcp`: `a2a/task/{id}`, the newest [`MAX_TASKS`] kept and
//! [`MAX_TASKS_PER_CLIENT`] of one client's, and a row in its context's
//! list) and `GetTask` answers it again by id,
//! `ListTasks` by its context: the route is a write.
//!
//! Method names and JSON shapes are the ones of the binding as the official
//! `a2a-sdk` 1.x client sends and reads them (`SendMessage`, `GetTask`,
//! `ListTasks`;
//! ProtoJSON: camelCase members, `TASK_STATE_COMPLETED`, `ROLE_USER`).

mod v03;

use crate::{origin, run::call};
use marketplace_guest::index::search_term;
use marketplace_guest::prelude::*;
use marketplace_guest::{clock, ids, rfc3339};

/// The A2A protocol version this endpoint speaks.
pub const VERSION: &str = "1.0";
/// A2A 0.3, which this endpoint also speaks (see [`v03`]): as
/// `supportedInterfaces` names it, and as a 0.3 card's `protocolVersion`.
pub const V03: &str = "0.3";
const V03_CARD: &str = "0.3.0";
/// The binding, as named in `supportedInterfaces`.
pub const BINDING: &str = "JSONRPC";
/// Tasks kept for `GetTask`; the oldest is dropped past this.
pub const MAX_TASKS: u64 = 1000;
/// Tasks kept of one client (one address, as the host counts them);
/// its oldest is dropped past this.
pub const MAX_TASKS_PER_CLIENT: u64 = 100;
/// The largest message (serialized) `SendMessage` takes.
const MAX_MESSAGE_BYTES: usize = 16 * 1024;
/// Search results in an answer: default and most.
const SEARCH_LIMIT: u64 = 10;
const SEARCH_LIMIT_MAX: u64 = 20;
/// Characters of a post's content in a search answer.
const CONTENT_CHARS: usize = 500;

// JSON-RPC and A2A error codes.
const INVALID_REQUEST: i64 = -32600;
const METHOD_NOT_FOUND: i64 = -32601;
const INVALID_PARAMS: i64 = -32602;
const INTERNAL: i64 = -32603;
const PARSE_ERROR: i64 = -32700;
const TASK_NOT_FOUND: i64 = -32001;
const TASK_NOT_CANCELABLE: i64 = -32002;
const PUSH_NOT_SUPPORTED: i64 = -32003;
const UNSUPPORTED_OPERATION: i64 = -32004;
const CONTENT_TYPE_NOT_SUPPORTED: i64 = -32005;
const EXTENDED_CARD_NOT_CONFIGURED: i64 = -32007;
const VERSION_NOT_SUPPORTED: i64 = -32009;

/// The agent card: absolute URLs from the public base URL.
pub fn card(base: &str, version: &str) -> Value {
    json!({
        "name": "marketplace",
        "description": "Marketplace of listings and escrow contracts for people and agents. This agent searches the listings and reads arbitration contracts; posting, buying and the other paid actions use the HTTP API (see documentationUrl), paid in bearer cash (HTTP 402).",
        "supportedInterfaces": [
            {"url": format!("{base}/a2a"), "protocolBinding": BINDING, "protocolVersion": VERSION},
            {"url": format!("{base}/a2a"), "protocolBinding": BINDING, "protocolVersion": V03},
        ],
        // A2A 0.3's members, for its clients (1.x clients read
        // supportedInterfaces and pass these over).
        "url": format!("{base}/a2a"),
        "preferredTransport": BINDING,
        "protocolVersion": V03_CARD,
        "version": version,
        "documentationUrl": format!("{base}/docs"),
        "capabilities": {"streaming": false, "pushNotifications": false, "extendedAgentCard": false},
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": [
            {
                "id": "search",
                "name": "Search listings",
                "description": format!("Find marketplace posts and listings by words, ranked by relevance (BM25). Send the words as a text part, or a data part {{\"term\", \"limit\" (1 to {SEARCH_LIMIT_MAX}, default {SEARCH_LIMIT}), \"post_type\"}}. The answer is a completed task whose artifact holds a short text and a data part {{term, total, results: [{{post_id, url, author_nick, post_type, content, score, ...}}]}}."),
                "tags": ["search", "listings", "marketplace"],
                "examples": ["walnut desk", "{\"term\": \"violin repair\", \"limit\": 5}"],
                "inputModes": ["text/plain", "application/json"],
                "outputModes": ["text/plain", "application/json"],
            },
            {
                "id": "contract_status",
                "name": "Read a contract",
                "description": "The status and allowed actions of an arbitration (escrow) contract. Send a data part {\"contract_id\": \"CTR_...\"}, or a text naming it: the id alone (\"CTR_...\"), after the word contract (\"status of contract CTR_...\"), or a whole id among other words (\"is CTR_2026_000123 funded?\"); any other text is a search. The answer is a completed task whose artifact holds a short text and a data part {contract_id, status, allowed_actions, updated_at, url}; an unknown contract gives a failed task.",
                "tags": ["contracts", "escrow"],
                "examples": ["contract CTR_2026_000123", "{\"contract_id\": \"CTR_2026_000123\"}"],
                "inputModes": ["text/plain", "application/json"],
                "outputModes": ["text/plain", "application/json"],
            },
        ],
    })
}

/// A JSON-RPC failure: code and message.
#[derive(Debug)]
struct RpcError(i64, String);

fn err(code: i64, message: impl Into<String>) -> RpcError {
    RpcError(code, message.into())
}

/// `POST /a2a`. Every answer is a JSON-RPC body with HTTP 200, as the
/// binding has it, but for an internal error (500).
pub fn handle(req: &Request) -> Result<Response, ApiError> {
    let msg: Value = match serde_json::from_slice(req.body()) {
        Ok(v) => v,
        Err(e) => {
            return Ok(answer(
                &Value::Null,
                Err(err(PARSE_ERROR, format!("parse error: {e}"))),
            ));
        }
    };
    // A string or an integer (JSON-RPC's numbers "SHOULD NOT contain
    // fractional parts", and A2A's ids are string or integer); null is
    // tolerated as JSON-RPC allows it.
    let id = match msg.get("id") {
        Some(id @ (Value::String(_) | Value::Null)) => id.clone(),
        Some(id @ Value::Number(n)) if n.is_i64() || n.is_u64() => id.clone(),
        None => Value::Null,
        Some(_) => {
            return Ok(answer(
                &Value::Null,
                Err(err(
                    INVALID_REQUEST,
                    "invalid request: id must be a string, an integer or null",
                )),
            ));
        }
    };
    let method = match (&msg["jsonrpc"], &msg["method"], msg.get("params")) {
        (Value::String(v), Value::String(m), None | Some(Value::Object(_)))
            if v == "2.0" && !m.is_empty() =>
        {
            m.as_str()
        }
        _ => {
            return Ok(answer(
                &id,
                Err(err(
                    INVALID_REQUEST,
                    "invalid request: a JSON-RPC 2.0 request needs \"jsonrpc\": \"2.0\", a method and object params",
                )),
            ));
        }
    };
    // A notification (no `id` member) gets no answer (JSON-RPC 2.0 4.1),
    // and, since every A2A method is a request whose answer is the point
    // (a task's id, a task), nothing is run for it.
    if msg.get("id").is_none() {
        return Ok(Response {
            status: 202,
            headers: vec![],
            body: vec![],
        });
    }
    let (method, legacy) = match versioned(req, method) {
        Ok(m) => m,
        Err(e) => return Ok(answer(&id, Err(e))),
    };
    let empty = json!({});
    let mut params = msg.get("params").unwrap_or(&empty);
    let converted;
    if legacy {
        converted = match v03::params_in(method, params) {
            Ok(p) => p,
            Err(e) => return Ok(answer(&id, Err(e))),
        };
        params = &converted;
    }
    let result = match method {
        "SendMessage" => send_message(req, params),
        "GetTask" => get_task(params),
        "CancelTask" => cancel_task(params),
        "SendStreamingMessage" | "SubscribeToTask" => Err(err(
            UNSUPPORTED_OPERATION,
            "streaming is not supported (capabilities.streaming is false); use SendMessage",
        )),
        "ListTasks" => list_tasks(params),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => Err(err(
            PUSH_NOT_SUPPORTED,
            "push notifications are not supported (capabilities.pushNotifications is false)",
        )),
        "GetExtendedAgentCard" => Err(err(
            EXTENDED_CARD_NOT_CONFIGURED,
            "there is no extended agent card; the public card is all there is",
        )),
        _ => Err(err(METHOD_NOT_FOUND, format!("method not found: {method}"))),
    };
    let result = result.map(|r| {
        if legacy {
            v03::result_out(method, r)
        } else {
            r
        }
    });
    Ok(answer(&id, result))
}

/// The A2A version a request names: its `A2A-Version` header, else its
/// `A2A-Version` query parameter (A2A 1.0, 3.6.1); none when empty.
fn requested_version(req: &Request) -> Option<&str> {
    fn named(v: Option<&str>) -> Option<&str> {
        v.map(str::trim).filter(|v| !v.is_empty())
    }
    named(req.header("a2a-version")).or_else(|| named(req.query("A2A-Version")))
}

/// The 1.0 method a request runs, and whether it is A2A 0.3's (its names
/// and shapes, translated by [`v03`]). A request without a version is
/// 0.3's by its method names (A2A 1.0, 3.6.2: no version is 0.3) and 1.0's
/// by 1.0's, whose names 0.3 does not have. Each version has its own
/// methods: one of the other's is not found; another version is -32009.
fn versioned<'a>(req: &Request, method: &'a str) -> Result<(&'a str, bool), RpcError> {
    let named = requested_version(req);
    let legacy = v03::method(method);
    match (named, legacy) {
        (None, Some(v10)) => Ok((v10, true)),
        (Some(v), Some(v10)) if v03::is_v03(v) => Ok((v10, true)),
        (Some(v), None) if v03::is_v03(v) => Err(err(
            METHOD_NOT_FOUND,
            format!(
                "method not found: {method} is not an A2A 0.3 method (0.3's: message/send, tasks/get, tasks/cancel)"
            ),
        )),
        (Some(v), _) if v.split('.').next() != Some("1") => Err(err(
            VERSION_NOT_SUPPORTED,
            format!("A2A version {v} is not supported; this agent speaks {VERSION} and 0.3"),
        )),
        (Some(v), Some(v10)) => Err(err(
            METHOD_NOT_FOUND,
            format!("method not found: {method} is A2A 0.3's; under A2A-Version {v} it is {v10}"),
        )),
        (_, None) => Ok((method, false)),
    }
}

fn answer(id: &Value, result: Result<Value, RpcError>) -> Response {
    match result {
        Ok(result) => json(
            200,
            &object([
                ("jsonrpc", "2.0".into()),
                ("id", id.clone()),
                ("result", result),
            ]),
        ),
        Err(RpcError(code, message)) => json(
            // An internal error is also an HTTP 500, so the host drops
            // whatever this request wrote.
            if code == INTERNAL { 500 } else { 200 },
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        ),
    }
}

/// An id of ours (`task_`, `ctx_`, `msg_` + a ULID).
fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", ids::ulid())
}

fn task_key(id: &str) -> String {
    format!("a2a/task/{id}")
}

/// A task id as this agent makes them (anything else is unknown).
fn valid_task_id(id: &str) -> bool {
    id.strip_prefix("task_")
        .is_some_and(marketplace_common::order::is_ulid)
}

fn load_task(id: &str) -> Result<Option<Value>, RpcError> {
    if !valid_task_id(id) {
        return Ok(None);
    }
    kv::get::<Value>(&task_key(id)).map_err(|e| err(INTERNAL, e.message))
}

fn task_not_found(id: &str) -> RpcError {
    err(
        TASK_NOT_FOUND,
        format!(
            "task {id} not found (the newest {MAX_TASKS} tasks are kept, and {MAX_TASKS_PER_CLIENT} of one client's)"
        ),
    )
}

/// An id a client gives (a message's, a context's, a task's): at most 128
/// visible ASCII characters; absent, null or "" is none. An id is kept and
/// answered whole (a context's also in the key of its list), so one that
/// holds a cash, witness or certificate secret is refused rather than
/// kept.
fn id_param(value: Option<&Value>, name: &str) -> Result<Option<String>, RpcError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) if marketplace_common::secret::redact_secret_text(s) != *s => {
            Err(err(
                INVALID_PARAMS,
                format!("{name} must not hold a secret (ids are kept)"),
            ))
        }
        Some(Value::String(s)) if s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()) => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(err(
            INVALID_PARAMS,
            format!("{name} must be at most 128 visible ASCII characters"),
        )),
    }
}

/// `historyLength`: absent = all of the history, else at most that many of
/// the newest messages.
fn history_length(params: &Value) -> Result<Option<usize>, RpcError> {
    match params.get("historyLength") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => whole(v).map(|n| Some(n as usize)).ok_or_else(|| {
            err(
                INVALID_PARAMS,
                "historyLength must be a non-negative integer",
            )
        }),
    }
}

/// A non-negative whole number, also when written as a float (`5.0`: a
/// data part's numbers are protobuf doubles).
fn whole(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0 && *f < 9.0e15)
            .map(|f| f as u64)
    })
}

fn with_history(mut task: Value, keep: Option<usize>) -> Value {
    if let (Some(keep), Some(history)) = (keep, task["history"].as_array_mut()) {
        let drop = history.len().saturating_sub(keep);
        history.drain(..drop);
    }
    task
}

/// `params.id`, the task id: a string.
fn task_id(params: &Value) -> Result<&str, RpcError> {
    match &params["id"] {
        Value::String(id) => Ok(id),
        Value::Null => Err(err(INVALID_PARAMS, "id (the task id) is required")),
        _ => Err(err(INVALID_PARAMS, "id (the task id) must be a string")),
    }
}

fn get_task(params: &Value) -> Result<Value, RpcError> {
    let id = task_id(params)?;
    let keep = history_length(params)?;
    match load_task(id)? {
        Some(task) => Ok(with_history(task, keep)),
        None => Err(task_not_found(id)),
    }
}

fn cancel_task(params: &Value) -> Result<Value, RpcError> {
    let id = task_id(params)?;
    match load_task(id)? {
        Some(task) => Err(err(
            TASK_NOT_CANCELABLE,
            format!(
                "task {id} is {} (final): nothing is left to cancel",
                task["status"]["state"].as_str().unwrap_or("finished")
            ),
        )),
        None => Err(task_not_found(id)),
    }
}

/// What a message asks for.
#[derive(Debug, PartialEq)]
enum Ask {
    Search {
        term: String,
        limit: u64,
        post_type: Option<String>,
    },
    Contract(String),
}

fn is_contract_id(s: &str) -> bool {
    s.strip_prefix("CTR_").is_some_and(|rest| {
        (1..=64).contains(&rest.len())
            && rest
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    })
}

/// A contract id named in a text, if any: a word `CTR_...` after the word
/// `contract` (`contract CTR_...`, `Contract: CTR_...?`), a text that is
/// the id alone, or a word anywhere that is a whole contract id of 8 or
/// more characters after `CTR_` (`CTR_2026_000123 status?`; ids made here
/// are `CTR_` and a ULID). Any other text is search words, a short `CTR_`
/// word among them too (`walnut CTR_` and "my CTR_X ratio" once gave an
/// error and a failed task).
fn contract_in_text(text: &str) -> Option<String> {
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-')))
        .filter(|w| !w.is_empty())
        .collect();
    let after_contract = || {
        words
            .windows(2)
            .find(|w| w[0].eq_ignore_ascii_case("contract") && w[1].starts_with("CTR_"))
            .map(|w| w[1])
    };
    let whole_id = || {
        words
            .iter()
            .copied()
            .find(|w| is_contract_id(w) && w.len() >= "CTR_".len() + 8)
    };
    let named = match words[..] {
        [only] => Some(only),
        _ => after_contract().or_else(whole_id),
    };
    named.filter(|w| w.starts_with("CTR_")).map(str::to_string)
}

/// Each part holds one content (a2a.proto's `oneof`): text, data, url or
/// raw (`file`: A2A 0.3's). This agent reads text and data: a file of
/// either kind beside them is passed over (as the A2A TCK expects of a
/// text with a binary part), a message of files only is another content
/// type.
fn check_parts(parts: &[Value]) -> Result<(), RpcError> {
    let mut files_only = true;
    for part in parts {
        let Some(members) = part.as_object() else {
            return Err(err(INVALID_PARAMS, "each part must be an object"));
        };
        if members.get("text").is_some_and(|t| !t.is_string()) {
            return Err(err(INVALID_PARAMS, "text part: text must be a string"));
        }
        let mut contents = ["text", "data", "url", "raw", "file"]
            .into_iter()
            .filter(|c| members.contains_key(*c));
        match (contents.next(), contents.next()) {
            (None, _) => {
                return Err(err(
                    INVALID_PARAMS,
                    "each part needs its content: text, data, url or raw",
                ));
            }
            (Some(_), Some(_)) => {
                return Err(err(
                    INVALID_PARAMS,
                    "a part holds one content: text, data, url or raw",
                ));
            }
            (Some("text" | "data"), None) => files_only = false,
            (Some(_), None) => {}
        }
    }
    if files_only && !parts.is_empty() {
        return Err(err(
            CONTENT_TYPE_NOT_SUPPORTED,
            "this agent reads text and data parts only (no files or URLs)",
        ));
    }
    Ok(())
}

/// Read what the message's parts ask: the first text or data part this
/// agent understands decides.
fn ask_of(parts: &[Value]) -> Result<Ask, RpcError> {
    check_parts(parts)?;
    for part in parts {
        if let Some(text) = part.get("text").and_then(Value::as_str) {
            if marketplace_guest::is_blank(text) {
                continue;
            }
            if let Some(id) = contract_in_text(text.trim_matches(marketplace_guest::is_js_space)) {
                return contract_ask(&id);
            }
            return search_ask(text, None, None);
        }
        if let Some(data) = part.get("data") {
            if let Some(id) = data.get("contract_id") {
                let Some(id) = id.as_str() else {
                    return Err(err(
                        INVALID_PARAMS,
                        "data part: contract_id must be a string",
                    ));
                };
                return contract_ask(id);
            }
            if let Some(term) = data.get("term") {
                let Some(term) = term.as_str() else {
                    return Err(err(INVALID_PARAMS, "data part: term must be a string"));
                };
                let limit = match data.get("limit") {
                    None | Some(Value::Null) => None,
                    Some(l) => Some(
                        whole(l)
                            .filter(|l| (1..=SEARCH_LIMIT_MAX).contains(l))
                            .ok_or_else(|| {
                                err(
                                    INVALID_PARAMS,
                                    format!(
                                        "data part: limit must be an integer from 1 to {SEARCH_LIMIT_MAX}"
                                    ),
                                )
                            })?,
                    ),
                };
                let post_type = match data.get("post_type") {
                    None | Some(Value::Null) => None,
                    Some(Value::String(t)) => Some(t.clone()).filter(|t| !t.is_empty()),
                    Some(_) => {
                        return Err(err(INVALID_PARAMS, "data part: post_type must be a string"));
                    }
                };
                return search_ask(term, limit, post_type);
            }
        }
    }
    Err(err(
        INVALID_PARAMS,
        "no part this agent understands: send the search words as text (or a data part {term}), or name a contract (\"contract CTR_...\" or a data part {contract_id})",
    ))
}

fn contract_ask(id: &str) -> Result<Ask, RpcError> {
    if is_contract_id(id) {
        Ok(Ask::Contract(id.to_string()))
    } else {
        Err(err(
            INVALID_PARAMS,
            format!("{id:?} is not a contract id (CTR_ and 1 to 64 letters, digits, '_' or '-')"),
        ))
    }
}

fn search_ask(term: &str, limit: Option<u64>, post_type: Option<String>) -> Result<Ask, RpcError> {
    let term = search_term(term)
        .map_err(|p| err(INVALID_PARAMS, format!("the search term {}", p.rule())))?;
    Ok(Ask::Search {
        term: term.to_string(),
        limit: limit.unwrap_or(SEARCH_LIMIT),
        post_type,
    })
}

/// Which parts the client takes (`configuration.acceptedOutputModes`):
/// (text, data).
fn output_modes(params: &Value) -> Result<(bool, bool), RpcError> {
    let modes: Vec<&str> = params["configuration"]["acceptedOutputModes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if modes.is_empty() {
        return Ok((true, true));
    }
    let takes = |m: &str| {
        modes.iter().any(|a| {
            let a = a.trim().to_ascii_lowercase();
            a == m || a == "*/*" || a == format!("{}/*", m.split('/').next().unwrap_or(""))
        })
    };
    let (text, data) = (takes("text/plain"), takes("application/json"));
    if !text && !data {
        return Err(err(
            CONTENT_TYPE_NOT_SUPPORTED,
            "this agent answers text/plain and application/json only",
        ));
    }
    Ok((text, data))
}

/// The outcome of a skill: final state, short text, data.
struct Outcome {
    state: &'static str,
    skill: &'static str,
    text: String,
    data: Option<Value>,
}

fn send_message(req: &Request, params: &Value) -> Result<Value, RpcError> {
    let Some(message) = params.get("message").filter(|m| m.is_object()) else {
        return Err(err(INVALID_PARAMS, "message (an object) is required"));
    };
    if serde_json::to_vec(message).map_or(0, |b| b.len()) > MAX_MESSAGE_BYTES {
        return Err(err(
            INVALID_PARAMS,
            format!("the message must be at most {MAX_MESSAGE_BYTES} bytes"),
        ));
    }
    // Both required (a2a.proto), as the official SDK's server has them;
    // the role as its name or its ProtoJSON number.
    match message.get("role") {
        None | Some(Value::Null) => {
            return Err(err(INVALID_PARAMS, "message.role is required (ROLE_USER)"));
        }
        Some(Value::String(r)) if r == "ROLE_USER" => {}
        Some(Value::Number(n)) if n.as_u64() == Some(1) => {}
        Some(_) => return Err(err(INVALID_PARAMS, "message.role must be ROLE_USER")),
    }
    let text_id = |field: &str| id_param(message.get(field), &format!("message.{field}"));
    let Some(message_id) = text_id("messageId")? else {
        return Err(err(
            INVALID_PARAMS,
            "message.messageId is required (the sender's id of the message)",
        ));
    };
    let context_id = text_id("contextId")?.unwrap_or_else(|| new_id("ctx"));
    if let Some(task_id) = text_id("taskId")? {
        // Every task this agent makes is already final.
        return match load_task(&task_id)? {
            Some(task) => Err(err(
                UNSUPPORTED_OPERATION,
                format!(
                    "task {task_id} is {} (final); send a new message without taskId",
                    task["status"]["state"].as_str().unwrap_or("finished")
                ),
            )),
            None => Err(task_not_found(&task_id)),
        };
    }
    let parts = message["parts"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    if parts.is_empty() {
        return Err(err(
            INVALID_PARAMS,
            "message.parts must be a non-empty array",
        ));
    }
    let (want_text, want_data) = output_modes(params)?;
    let keep = history_length(params.get("configuration").unwrap_or(&Value::Null))?;
    let base = origin::base(req);
    let outcome = match ask_of(parts)? {
        Ask::Search {
            term,
            limit,
            post_type,
        } => search(&base, &term, limit, post_type)?,
        Ask::Contract(id) => contract(&base, &id)?,
    };

    let task_id = new_id("task");
    let mut user = message.clone();
    user["messageId"] = json!(message_id);
    user["contextId"] = json!(context_id);
    user["taskId"] = json!(task_id);
    user["role"] = json!("ROLE_USER");
    let reply = json!({
        "messageId": new_id("msg"), "contextId": context_id, "taskId": task_id,
        "role": "ROLE_AGENT", "parts": [{"text": outcome.text}],
    });
    let mut answer_parts = Vec::new();
    if want_text {
        answer_parts.push(json!({"text": outcome.text}));
    }
    if let Some(data) = outcome.data.filter(|_| want_data) {
        answer_parts.push(object([
            ("data", data),
            ("mediaType", "application/json".into()),
        ]));
    }
    let artifacts = if outcome.state == "TASK_STATE_COMPLETED" {
        vec![object([
            ("artifactId", format!("{task_id}-result").into()),
            ("name", outcome.skill.into()),
            ("parts", answer_parts.into()),
        ])]
    } else {
        vec![]
    };
    // The status timestamp as shown (to the second) is the one
    // `ListTasks` filters and orders by.
    let at_ms = clock::now_ms() / 1000 * 1000;
    // A cash secret a user pasted into the message is not kept, in its
    // history or in what the skill made of it (no skill needs one).
    let status = object([
        ("state", outcome.state.into()),
        ("message", reply.clone()),
        ("timestamp", rfc3339(at_ms).into()),
    ]);
    let mut task = object([
        ("id", task_id.as_str().into()),
        ("contextId", context_id.as_str().into()),
        ("status", status),
        ("artifacts", artifacts.into()),
        ("history", vec![user, reply].into()),
        ("metadata", json!({"skill": outcome.skill})),
    ]);
    redact(&mut task);
    store(&task_id, &context_id, outcome.state, at_ms, &task)
        .map_err(|e| err(INTERNAL, e.message))?;
    Ok(object([("task", with_history(task, keep))]))
}

/// Show the hex of every cash secret in `value`'s strings as `{redacted}`.
fn redact(value: &mut Value) {
    match value {
        Value::String(s) => {
            if let std::borrow::Cow::Owned(shown) =
                marketplace_common::secret::redact_secret_text(s)
            {
                *s = shown;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(redact),
        Value::Object(members) => members.values_mut().for_each(redact),
        _ => {}
    }
}

/// Keep the task and its row in its context's list. Past
/// [`MAX_TASKS_PER_CLIENT`] of its client's (the host's key of the
/// client's address), that client's oldest goes; past [`MAX_TASKS`] in
/// all, the oldest of anyone's. So one address sending tasks in a loop
/// replaces its own, not those of others, who lose theirs only to at
/// least `MAX_TASKS / MAX_TASKS_PER_CLIENT` addresses at once.
fn store(
    task_id: &str,
    context_id: &str,
    state: &str,
    at_ms: u64,
    task: &Value,
) -> Result<(), ApiError> {
    let client = ids::client();
    let mut count: u64 = kv::get("a2a/task_count")?.unwrap_or(0);
    if !client.is_empty() {
        let of_client: u64 = kv::get(&client_count_key(&client))?.unwrap_or(0);
        if of_client >= MAX_TASKS_PER_CLIENT
            && let Some((row, _)) = kv::scan_prefix(None, &client_prefix(&client), false, 1)?.pop()
            && let Some(oldest) = row.strip_prefix(&client_prefix(&client))
        {
            // (Its count goes down with it, to come up again below; a row
            // whose task is gone goes alone, with its count.)
            if remove(oldest)? {
                count = count.saturating_sub(1);
            } else {
                kv::delete(&row)?;
                uncount(&client)?;
            }
        }
    }
    if count >= MAX_TASKS
        && let Some((oldest, _)) = kv::scan_prefix(None, "a2a/task/", false, 1)?.pop()
        && let Some(id) = oldest.strip_prefix("a2a/task/")
        && remove(id)?
    {
        count = count.saturating_sub(1);
    }
    kv::put("a2a/task_count", &(count.min(MAX_TASKS - 1) + 1))?;
    kv::put(&task_key(task_id), task)?;
    if !client.is_empty() {
        let key = client_count_key(&client);
        let of_client: u64 = kv::get(&key)?.unwrap_or(0);
        kv::put(&key, &(of_client + 1))?;
        kv::put(&format!("{}{task_id}", client_prefix(&client)), &())?;
        kv::put(&owner_key(task_id), &client)?;
    }
    kv::put(
        &format!("{}{task_id}", context_prefix(context_id)),
        &json!([at_ms, state]),
    )
}

/// Remove the task `id` with its rows (its context's, its client's) and
/// its client's count of it; whether it was there. The total count is
/// the caller's.
fn remove(id: &str) -> Result<bool, ApiError> {
    let key = task_key(id);
    let Some(task) = kv::get::<Value>(&key)? else {
        return Ok(false);
    };
    kv::delete(&key)?;
    if let Some(context) = task["contextId"].as_str() {
        kv::delete(&format!("{}{id}", context_prefix(context)))?;
    }
    // (Tasks kept before clients were known have no owner.)
    if let Some(client) = kv::get::<String>(&owner_key(id))? {
        kv::delete(&owner_key(id))?;
        kv::delete(&format!("{}{id}", client_prefix(&client)))?;
        uncount(&client)?;
    }
    Ok(true)
}

/// One task fewer of `client`'s.
fn uncount(client: &str) -> Result<(), ApiError> {
    let count_key = client_count_key(client);
    match kv::get::<u64>(&count_key)?.unwrap_or(0) {
        0 | 1 => drop(kv::delete(&count_key)?),
        n => kv::put(&count_key, &(n - 1))?,
    }
    Ok(())
}

/// A client's tasks, oldest first (ids sort by time): `a2a/client/{key}/`
/// then each task's id.
fn client_prefix(client: &str) -> String {
    format!("a2a/client/{client}/")
}

/// How many tasks a client has kept.
fn client_count_key(client: &str) -> String {
    format!("a2a/client_count/{client}")
}

/// Whose task `id` is.
fn owner_key(id: &str) -> String {
    format!("a2a/owner/{id}")
}

/// Where a context's tasks are listed: `a2a/ctx/{hex of its id}/`, then
/// each task's id, with `[status timestamp ms, state]` (tasks made before
/// `ListTasks` was offered have no row).
fn context_prefix(context_id: &str) -> String {
    format!(
        "a2a/ctx/{}/",
        marketplace_common::hex::encode(context_id.as_bytes())
    )
}

/// The states of a task, in a2a.proto's order (ProtoJSON takes a state's
/// name or its number).
const STATES: [&str; 9] = [
    "TASK_STATE_UNSPECIFIED",
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
];

/// Tasks a page of `ListTasks` holds: by default and at most.
const LIST_PAGE: u64 = 50;
const LIST_PAGE_MAX: u64 = 100;

/// `ListTasks`: the tasks of one context, newest status first, in pages.
///
/// This agent has no accounts: a task is visible to whoever holds its id
/// (`GetTask`) or its context's id, which the agent makes unguessable
/// when the first message names none (a context id a client chooses is as
/// private as it is hard to guess). So the tasks listed are those of the
/// `contextId` named; without one, none are visible and the list is empty.
fn list_tasks(params: &Value) -> Result<Value, RpcError> {
    let context = id_param(params.get("contextId"), "contextId")?;
    let status = match params.get("status") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if s.is_empty() => None,
        Some(Value::String(s)) => match STATES.iter().position(|name| name == s) {
            Some(i) => Some(i),
            None => {
                return Err(err(
                    INVALID_PARAMS,
                    format!("status must be a task state (TASK_STATE_COMPLETED, ...), not {s:?}"),
                ));
            }
        },
        Some(v) => match whole(v).filter(|n| (*n as usize) < STATES.len()) {
            Some(n) => Some(n as usize),
            None => {
                return Err(err(
                    INVALID_PARAMS,
                    "status must be a task state's name or number",
                ));
            }
        },
    }
    // TASK_STATE_UNSPECIFIED filters nothing (proto3's default).
    .filter(|i| *i != 0)
    .map(|i| STATES[i]);
    let page_size = match params.get("pageSize") {
        None | Some(Value::Null) => LIST_PAGE,
        Some(v) => whole(v)
            .filter(|n| (1..=LIST_PAGE_MAX).contains(n))
            .ok_or_else(|| {
                err(
                    INVALID_PARAMS,
                    format!("pageSize must be an integer from 1 to {LIST_PAGE_MAX}"),
                )
            })?,
    };
    let after_task = match params.get("pageToken") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) if t.is_empty() => None,
        Some(Value::String(t)) if valid_task_id(t) => Some(t.as_str()),
        Some(_) => {
            return Err(err(
                INVALID_PARAMS,
                "pageToken is not one this agent gave (a nextPageToken of ListTasks)",
            ));
        }
    };
    let since_ms = match params.get("statusTimestampAfter") {
        None | Some(Value::Null) => None,
        Some(t) => Some(
            t.as_str()
                .and_then(marketplace_common::time::parse_rfc3339_signed)
                .ok_or_else(|| {
                    err(
                        INVALID_PARAMS,
                        "statusTimestampAfter must be an RFC 3339 time (2026-12-04T10:00:00Z)",
                    )
                })?,
        ),
    };
    let include_artifacts = match params.get("includeArtifacts") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(err(INVALID_PARAMS, "includeArtifacts must be a boolean")),
    };
    let keep = history_length(params)?;
    // `pageSize` answers the tasks this page holds (the A2A TCK's reading
    // of "the page size used for this response": 0 for an empty list).
    let page = |tasks: Vec<Value>, next: &str, total: usize| {
        let held = tasks.len();
        object([
            ("tasks", tasks.into()),
            ("nextPageToken", next.into()),
            ("pageSize", held.into()),
            ("totalSize", total.into()),
        ])
    };
    let Some(context) = context else {
        return Ok(page(vec![], "", 0));
    };
    // The context's rows, newest first: at most MAX_TASKS (older tasks are
    // dropped with their rows), each a few dozen bytes.
    let prefix = context_prefix(&context);
    let rows = kv::scan_prefix(None, &prefix, true, MAX_TASKS as u32)
        .map_err(|e| err(INTERNAL, e.message))?;
    let matching: Vec<String> = rows
        .into_iter()
        .filter_map(|(key, value)| {
            let (at_ms, state): (u64, String) = serde_json::from_slice(&value).ok()?;
            let wanted = status.is_none_or(|s| s == state)
                && since_ms.is_none_or(|since| i128::from(at_ms) >= since);
            wanted.then(|| key[prefix.len()..].to_string())
        })
        .collect();
    let total = matching.len();
    // After the page token's task: those older than it.
    let start = after_task.map_or(0, |t| matching.partition_point(|id| id.as_str() >= t));
    let ids = &matching[start..(start + page_size as usize).min(total)];
    // The page's tasks in one storage call (at most LIST_PAGE_MAX keys).
    let keys: Vec<String> = ids.iter().map(|id| task_key(id)).collect();
    let values = kv::get_many_raw(None, &keys).map_err(|e| err(INTERNAL, e.message))?;
    let mut tasks = Vec::with_capacity(ids.len());
    for (key, value) in keys.iter().zip(values) {
        let Some(value) = value else {
            continue;
        };
        let mut task: Value = kv::parse(key, &value).map_err(|e| err(INTERNAL, e.message))?;
        if !include_artifacts && let Some(members) = task.as_object_mut() {
            members.remove("artifacts");
        }
        tasks.push(with_history(task, keep));
    }
    let next = match ids.last() {
        Some(last) if start + ids.len() < total => last.as_str(),
        _ => "",
    };
    Ok(page(tasks, next, total))
}

fn truncate(s: &str, max: usize) -> (String, bool) {
    match s.char_indices().nth(max) {
        Some((i, _)) => (s[..i].to_string(), true),
        None => (s.to_string(), false),
    }
}

/// The search skill: `GET /api/search`, each result summed up with a link.
fn search(
    base: &str,
    term: &str,
    limit: u64,
    post_type: Option<String>,
) -> Result<Outcome, RpcError> {
    let mut query = vec![
        ("term".to_string(), term.to_string()),
        ("limit".to_string(), limit.to_string()),
    ];
    if let Some(t) = &post_type {
        query.push(("post_type".into(), t.clone()));
    }
    let resp = call("GET", "/api/search", query, None);
    let body: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    match resp.status {
        200 => {}
        400 => {
            return Err(err(
                INVALID_PARAMS,
                format!(
                    "invalid search: {}",
                    body["message"].as_str().unwrap_or("refused")
                ),
            ));
        }
        s => return Err(err(INTERNAL, format!("search answered {s}"))),
    }
    let results: Vec<Value> = body["results"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let id = p["post_id"].as_str().unwrap_or_default();
            let (content, truncated) =
                truncate(p["content"].as_str().unwrap_or_default(), CONTENT_CHARS);
            json!({
                "post_id": id,
                "url": format!("{base}/api/posts/{id}"),
                "author_fingerprint": p["author_fingerprint"],
                "author_nick": p["author_nick"],
                "post_type": p["post_type"],
                "content": content,
                "content_truncated": truncated,
                "keywords": p["keywords"],
                "created_at": p["created_at"],
                "verified": p["listing"]["verified"],
                "score": p["score"],
            })
        })
        .collect();
    let total = body["total"].as_u64().unwrap_or(results.len() as u64);
    let text = match (total, results.len()) {
        (0, _) => format!("No listing matches \"{term}\"."),
        (1, _) => format!("Found 1 listing for \"{term}\"."),
        (t, n) if n as u64 >= t => format!("Found {t} listings for \"{term}\"."),
        (t, n) => format!("Found {t} listings for \"{term}\"; here are the {n} best."),
    };
    Ok(Outcome {
        state: "TASK_STATE_COMPLETED",
        skill: "search",
        text,
        data: Some(object([
            ("term", term.into()),
            ("post_type", json!(post_type)),
            ("total", json!(total)),
            ("results", results.into()),
        ])),
    })
}

/// The contract skill: `GET /api/arbitration/contracts/{id}/status`.
fn contract(base: &str, id: &str) -> Result<Outcome, RpcError> {
    let resp = call(
        "GET",
        &format!("/api/arbitration/contracts/{id}/status"),
        vec![],
        None,
    );
    let body: Value = serde_json::from_slice(&resp.body).unwrap_or(Value::Null);
    match resp.status {
        200 => {
            let actions: Vec<&str> = body["allowed_actions"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            let status = body["status"].as_str().unwrap_or("unknown");
            let text = if actions.is_empty() {
                format!("Contract {id} is {status}; no action is open.")
            } else {
                format!(
                    "Contract {id} is {status}; allowed actions: {}.",
                    actions.join(", ")
                )
            };
            let mut data = body.clone();
            data["url"] = json!(format!("{base}/api/arbitration/contracts/{id}"));
            Ok(Outcome {
                state: "TASK_STATE_COMPLETED",
                skill: "contract_status",
                text,
                data: Some(data),
            })
        }
        404 => Ok(Outcome {
            state: "TASK_STATE_FAILED",
            skill: "contract_status",
            text: format!("There is no contract {id}."),
            data: None,
        }),
        s => Err(err(INTERNAL, format!("the contract read answered {s}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn search_of(term: &str) -> Ask {
        Ask::Search {
            term: term.into(),
            limit: SEARCH_LIMIT,
            post_type: None,
        }
    }

    #[test]
    fn parts_map_to_skills() {
        let ask = |parts: Value| ask_of(parts.as_array().unwrap()).map_err(|e| e.0);
        assert_eq!(
            ask(json!([{"text": " walnut desk "}])),
            Ok(search_of("walnut desk"))
        );
        assert_eq!(
            ask(json!([{"text": "contract CTR_2026_000123?"}])),
            Ok(Ask::Contract("CTR_2026_000123".into()))
        );
        assert_eq!(
            ask(json!([{"text": "CTR_2026_000123"}])),
            Ok(Ask::Contract("CTR_2026_000123".into()))
        );
        assert_eq!(
            ask(json!([{"text": "Contract: CTR_9"}])),
            Ok(Ask::Contract("CTR_9".into()))
        );
        assert_eq!(
            ask(json!([{"text": "CTR_2026_000123 status?"}])),
            Ok(Ask::Contract("CTR_2026_000123".into()))
        );
        assert_eq!(
            ask(json!([{"text": "status of contract id CTR_01KBZ3Q8WJ5N2"}])),
            Ok(Ask::Contract("CTR_01KBZ3Q8WJ5N2".into()))
        );
        // A short CTR_ word among others is a search word.
        assert_eq!(
            ask(json!([{"text": "walnut CTR_"}])),
            Ok(search_of("walnut CTR_"))
        );
        assert_eq!(
            ask(json!([{"text": "my CTR_X ratio"}])),
            Ok(search_of("my CTR_X ratio"))
        );
        assert_eq!(
            ask(json!([{"data": {"contract_id": "CTR_x-1"}}])),
            Ok(Ask::Contract("CTR_x-1".into()))
        );
        assert_eq!(
            ask(json!([{"data": {"term": "violin", "limit": 3, "post_type": "general"}}])),
            Ok(Ask::Search {
                term: "violin".into(),
                limit: 3,
                post_type: Some("general".into())
            })
        );
        // The first part the agent understands decides; blank text is skipped.
        assert_eq!(
            ask(json!([{"text": "  "}, {"data": {"other": 1}}, {"text": "oak"}])),
            Ok(search_of("oak"))
        );
        // Blank as the published schemas read white space (ECMAScript's):
        // U+FEFF is, U+0085 is not.
        assert_eq!(
            ask(json!([{"text": "\u{feff}"}, {"text": "oak"}])),
            Ok(search_of("oak"))
        );
        assert_eq!(
            ask(json!([{"text": "\u{85}"}, {"text": "oak"}])),
            Ok(search_of("\u{85}"))
        );
        assert_eq!(
            ask(json!([{"data": {"contract_id": "nope"}}])),
            Err(INVALID_PARAMS)
        );
        assert_eq!(ask(json!([{"text": "contract CTR_"}])), Err(INVALID_PARAMS));
        assert_eq!(
            ask(json!([{"data": {"term": "x", "limit": 500}}])),
            Err(INVALID_PARAMS)
        );
        assert_eq!(ask(json!([{"data": {"term": 5}}])), Err(INVALID_PARAMS));
        assert_eq!(
            ask(json!([{"data": {"term": "oak", "limit": 5.0}}])),
            Ok(Ask::Search {
                term: "oak".into(),
                limit: 5,
                post_type: None
            })
        );
        assert_eq!(
            ask(json!([{"data": {"term": "oak", "limit": 2.5}}])),
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            ask(json!([{"text": "x".repeat(1001)}])),
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            ask(json!([{"url": "https://x.example/a.png"}])),
            Err(CONTENT_TYPE_NOT_SUPPORTED)
        );
        assert_eq!(ask(json!([{"data": {}}])), Err(INVALID_PARAMS));
        // A file beside a text is passed over; files alone are refused.
        assert_eq!(
            ask(json!([{"raw": "AAAA", "mediaType": "image/png"}, {"text": "oak"}])),
            Ok(search_of("oak"))
        );
        assert_eq!(
            ask(json!([{"kind": "file", "file": {"uri": "https://x.example/a"}}])),
            Err(CONTENT_TYPE_NOT_SUPPORTED)
        );
        // A part without content, or with two, is malformed.
        assert_eq!(ask(json!([{"text": "oak"}, {}])), Err(INVALID_PARAMS));
        assert_eq!(
            ask(json!([{"text": "oak", "url": "https://x.example/a"}])),
            Err(INVALID_PARAMS)
        );
    }

    #[test]
    fn ids_and_modes() {
        assert!(valid_task_id("task_01JD0000000000000000000000"));
        assert!(!valid_task_id("task_01jd0000000000000000000000"));
        assert!(!valid_task_id("../task"));
        assert!(is_contract_id("CTR_2026_000123"));
        assert!(!is_contract_id("CTR_a b"));
        let modes = |m: Value| {
            output_modes(&json!({"configuration": {"acceptedOutputModes": m}})).map_err(|e| e.0)
        };
        assert_eq!(modes(json!([])), Ok((true, true)));
        assert_eq!(modes(json!(["text/plain"])), Ok((true, false)));
        assert_eq!(modes(json!(["application/json"])), Ok((false, true)));
        assert_eq!(modes(json!(["*/*"])), Ok((true, true)));
        assert_eq!(modes(json!(["image/png"])), Err(CONTENT_TYPE_NOT_SUPPORTED));
    }

    #[test]
    fn history_is_cut_to_the_newest() {
        let task = json!({"history": [1, 2, 3]});
        assert_eq!(
            with_history(task.clone(), None)["history"],
            json!([1, 2, 3])
        );
        assert_eq!(with_history(task.clone(), Some(1))["history"], json!([3]));
        assert_eq!(with_history(task, Some(0))["history"], json!([]));
    }

    #[test]
    fn card_is_absolute_and_names_the_binding() {
        let c = card("https://m.example", "1.2.3");
        assert_eq!(c["supportedInterfaces"][0]["url"], "https://m.example/a2a");
        assert_eq!(c["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
        assert_eq!(c["supportedInterfaces"][0]["protocolVersion"], "1.0");
        assert_eq!(c["documentationUrl"], "https://m.example/docs");
        let skills: Vec<&str> = c["skills"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["id"].as_str().unwrap())
            .collect();
        assert_eq!(skills, ["search", "contract_status"]);
    }
}
