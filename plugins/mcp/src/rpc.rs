//! `POST /mcp`'s JSON-RPC 2.0 envelope: one message or a batch, each
//! message checked and answered under its era (the handshake's revisions
//! or 2026-07-28's), errors, and what a fault of the instance is answered
//! (a JSON-RPC error, the batch's array kept whole).

use crate::methods::{PROTOCOL_VERSIONS, fresh_for, serve, spoken_versions};
use crate::{modern, origin, raw};
use marketplace_guest::prelude::*;
use marketplace_guest::{clear_on_fault, on_fault};

thread_local! {
    /// The built-in tools (their JSON objects, comma-separated) that the
    /// `tools/list` answer being made lists ahead of its macros: kept as
    /// the memo's text and written into the answer by [`answer_text`], so
    /// that a listing neither parses nor writes again the schemas (about
    /// 20 KB) of every tool.
    pub(crate) static LISTED_BUILTINS: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
    /// What a fault of this request is answered when no narrower answer is
    /// set: for `/mcp`, a JSON-RPC error (an instance serves one request).
    static FAULT_ANSWER: std::cell::RefCell<Option<Response>> = const { std::cell::RefCell::new(None) };
    /// The CORS headers of this `/mcp` request's answers (faults' too).
    pub(crate) static CORS: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Back to this request's own answer to a fault after a narrower one
/// ([`FAULT_ANSWER`], else the host's).
pub(crate) fn restore_fault() {
    FAULT_ANSWER.with(|f| match &*f.borrow() {
        Some(answer) => on_fault(answer),
        None => clear_on_fault(),
    });
}

/// Answer a fault of this `/mcp` request with a JSON-RPC internal error
/// (HTTP 500 alone, in its batch's array otherwise) naming `id`.
fn answer_faults_with_id(id: Option<Value>) {
    let answer = fault_answer(
        500,
        rpc_error(
            id.unwrap_or(Value::Null),
            -32603,
            "internal error: the server could not finish this request within its limits",
        ),
    );
    FAULT_ANSWER.with(|f| *f.borrow_mut() = Some(answer));
    restore_fault();
}

/// A batch being answered: what its earlier messages were answered, and
/// the ids of its later requests (see [`fault_answer`]).
struct Batch {
    /// The earlier answers as JSON text, comma-separated (each serialized
    /// once, as the batch's answer will hold it).
    answered: String,
    later: Vec<Value>,
}

thread_local! {
    static BATCH: std::cell::RefCell<Option<Batch>> = const { std::cell::RefCell::new(None) };
}

/// The whole request's answer should the message being answered fault
/// with `answer` (its JSON-RPC answer): alone, `answer` with `status`; in a
/// batch, still the batch's array, in order: the earlier messages' answers,
/// `answer`, and for each later request an error saying it did not run
/// (the instance ends with the fault), so every id is answered.
pub(crate) fn fault_answer(status: u16, answer: Value) -> Response {
    let mut response = fault_body(status, answer);
    CORS.with(|c| response.headers.extend(c.borrow().iter().cloned()));
    response
}

/// The body of [`fault_answer`].
fn fault_body(status: u16, answer: Value) -> Response {
    BATCH.with(|b| match &*b.borrow() {
        None => json(status, &answer),
        Some(batch) => {
            let mut all = String::with_capacity(batch.answered.len() + 256);
            all.push('[');
            all.push_str(&batch.answered);
            for a in std::iter::once(answer).chain(batch.later.iter().map(|id| {
                rpc_error(
                    id.clone(),
                    -32603,
                    "not run: an earlier message of this batch exceeded the request's limits",
                )
            })) {
                if all.len() > 1 {
                    all.push(',');
                }
                all.push_str(&a.to_string());
            }
            all.push(']');
            raw(all, "application/json")
        }
    })
}

/// `POST /mcp`: the Model Context Protocol over Streamable HTTP (JSON answers).
pub(crate) fn jsonrpc(req: &Request, version: &str) -> Result<Response, ApiError> {
    // A fault (the memory cap, the deadline) is answered as JSON-RPC too.
    answer_faults_with_id(None);
    LISTED_BUILTINS.with(|l| l.borrow_mut().take());
    // The revision header once at most, in either kind of revision: two
    // lines left the first to decide (and with it whether a batch is
    // taken).
    if let Err(twice) = modern::at_most_once(req, "mcp-protocol-version") {
        return Ok(json(400, &twice.answer(Value::Null)));
    }
    let msg: Value = match serde_json::from_slice(req.body()) {
        Ok(v) => v,
        Err(e) => {
            return Ok(json(
                400,
                &rpc_error(Value::Null, -32700, &format!("parse error: {e}")),
            ));
        }
    };
    // From here, with the request's id when it has one.
    answer_faults_with_id(msg.get("id").filter(|v| is_request_id(v)).cloned());
    let batch = match msg {
        Value::Object(_) => {
            let (status, answer) = message(&msg, req, version)?;
            return Ok(match answer {
                Some(answer) => Response {
                    status,
                    headers: vec![],
                    body: answer_text(answer).into_bytes(),
                },
                None => accepted(),
            });
        }
        Value::Array(batch) => batch,
        _ => return Ok(json(400, &invalid(Value::Null, "send one JSON-RPC object"))),
    };
    // Batches (MCP 2025-03-26 and 2024-11-05; removed in 2025-06-18): for a
    // client that names no later revision, in the header or (without one)
    // in a member's `_meta`, as MCP 2026-07-28 does. Each message is
    // answered as if sent alone; the answers come back together, in order.
    let later = match modern::header(req, "mcp-protocol-version") {
        Some(asked) => Some(asked).filter(|v| !BATCH_VERSIONS.contains(v)),
        None => batch
            .iter()
            .filter_map(modern::named_version)
            .find(|v| !BATCH_VERSIONS.contains(v)),
    };
    if let Some(asked) = later {
        // A revision not spoken is said as such (-32022, every revision
        // spoken), as for a single message.
        if !PROTOCOL_VERSIONS.contains(&asked) && !modern::VERSIONS.contains(&asked) {
            let refused = modern::unsupported(asked, &spoken_versions());
            return Ok(json(400, &refused.answer(Value::Null)));
        }
        return Ok(json(
            400,
            &invalid(
                Value::Null,
                &format!("MCP {asked} has no batches: send one JSON-RPC object"),
            ),
        ));
    }
    if batch.is_empty() || batch.len() > MAX_BATCH {
        return Ok(json(
            400,
            &invalid(
                Value::Null,
                &format!("a batch holds 1 to {MAX_BATCH} messages"),
            ),
        ));
    }
    BATCH.with(|b| {
        *b.borrow_mut() = Some(Batch {
            answered: String::new(),
            later: Vec::new(),
        })
    });
    for (i, m) in batch.iter().enumerate() {
        // Past the answer's budget, the later requests are answered with
        // an error saying so, rather than run into the memory cap.
        let full = BATCH.with(|b| {
            b.borrow()
                .as_ref()
                .is_some_and(|b| b.answered.len() >= MAX_BATCH_ANSWER)
        });
        if full {
            for m in &batch[i..] {
                // As each would be answered, but a request is not run.
                let error = match invalid_member(m) {
                    Some(invalid) => invalid,
                    None => match request_id(m) {
                        Some(id) => rpc_error(
                            id.clone(),
                            -32000,
                            &format!(
                                "not run: the batch's answer reached {} MiB; send this request again on its own or in a later batch",
                                MAX_BATCH_ANSWER >> 20
                            ),
                        ),
                        None => continue,
                    },
                };
                BATCH.with(|b| {
                    if let Some(batch) = b.borrow_mut().as_mut() {
                        batch.answered.push(',');
                        batch.answered.push_str(&error.to_string());
                    }
                });
            }
            break;
        }
        // Should this message fault, the batch is still answered whole.
        let later = batch[i + 1..]
            .iter()
            .filter_map(|m| request_id(m).cloned())
            .collect();
        BATCH.with(|b| {
            if let Some(batch) = b.borrow_mut().as_mut() {
                batch.later = later;
            }
        });
        answer_faults_with_id(m.get("id").filter(|v| is_request_id(v)).cloned());
        let answer = match invalid_member(m) {
            Some(invalid) => Some(invalid),
            None => message(m, req, version)?.1,
        };
        if let Some(answer) = answer {
            BATCH.with(|b| {
                if let Some(batch) = b.borrow_mut().as_mut() {
                    if !batch.answered.is_empty() {
                        batch.answered.push(',');
                    }
                    batch.answered.push_str(&answer_text(answer));
                }
            });
        }
    }
    let answered = BATCH
        .with(|b| b.borrow_mut().take())
        .map(|b| b.answered)
        .unwrap_or_default();
    Ok(if answered.is_empty() {
        accepted()
    } else {
        raw(format!("[{answered}]"), "application/json")
    })
}

/// The id of a batch member that is a request (a method and a request
/// id), which is owed an answer.
fn request_id(m: &Value) -> Option<&Value> {
    m.get("method")
        .is_some_and(Value::is_string)
        .then(|| m.get("id").filter(|v| is_request_id(v)))
        .flatten()
}

/// The -32600 answer of a batch member that is not one: not an object, or
/// an `initialize` (MCP 2025-03-26: never part of a batch).
fn invalid_member(m: &Value) -> Option<Value> {
    if !m.is_object() {
        Some(invalid(Value::Null, "a batch member is a JSON-RPC object"))
    } else if m.get("method").is_some_and(|m| m == "initialize") {
        let id = m
            .get("id")
            .filter(|v| is_request_id(v))
            .cloned()
            .unwrap_or(Value::Null);
        Some(invalid(id, "initialize must be sent alone, not in a batch"))
    } else {
        None
    }
}

/// Revisions that have JSON-RPC batches (a client that sends no
/// `MCP-Protocol-Version` header is taken to speak 2025-03-26).
const BATCH_VERSIONS: &[&str] = &["2025-03-26", "2024-11-05"];
/// Messages in one batch at most: every one runs in this request's instance,
/// under its deadline.
const MAX_BATCH: usize = 16;
/// Bytes of a batch's answers after which its later requests are not run
/// (each is answered -32000 saying so): sixteen searches of 100 listings
/// made 9.9 MB of answers and ran the instance into its memory cap, so
/// every request of the batch failed.
const MAX_BATCH_ANSWER: usize = 4 << 20;

/// 202, no body: the answer to notifications and client responses.
fn accepted() -> Response {
    Response {
        status: 202,
        headers: vec![],
        body: vec![],
    }
}

/// A request's id is a string or an integer, never null (MCP, JSON-RPC).
fn is_request_id(id: &Value) -> bool {
    id.is_string() || id.is_i64() || id.is_u64()
}

/// A JSON-RPC "invalid request" error (-32600).
fn invalid(id: Value, why: &str) -> Value {
    rpc_error(id, -32600, &format!("invalid request: {why}"))
}

/// The revisions a JSON-RPC message is answered under.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Era {
    /// Those of the `initialize` handshake ([`PROTOCOL_VERSIONS`]).
    Handshake,
    /// MCP 2026-07-28's, where each request stands alone ([`modern`]).
    Modern,
}

impl Era {
    /// `result` as this era answers it to `id` (2026-07-28: with its
    /// `resultType`, the server's name and, for a cacheable method, how
    /// long it stays fresh and whether a shared cache may keep it: when
    /// the service has a `public_url`, which makes its absolute URLs).
    pub(crate) fn answer(
        self,
        id: &Value,
        result: Value,
        fresh_ms: Option<u64>,
        version: &str,
    ) -> Value {
        rpc_result(
            id,
            match self {
                Era::Handshake => result,
                Era::Modern => {
                    modern::complete(result, fresh_ms, origin::public_url().is_some(), version)
                }
            },
        )
    }
}

/// One JSON-RPC message (an object): the HTTP status it gets when sent
/// alone and its answer (`None` for a notification or a client's
/// response, which get none).
fn message(msg: &Value, req: &Request, version: &str) -> Result<(u16, Option<Value>), ApiError> {
    let refuse = |id: Value, why: &str| Ok((400, Some(invalid(id, why))));
    let id = msg.get("id").cloned();
    // (`"error": null` beside a result, which loose clients send, is none.)
    let result = msg.get("result").is_some();
    let error = msg.get("error").is_some_and(|e| !e.is_null());
    let is_response = result || error;
    let method = match msg.get("method") {
        Some(Value::String(m))
            if !m.is_empty()
                && !is_response
                && msg["jsonrpc"] == "2.0"
                && matches!(msg.get("params"), None | Some(Value::Object(_))) =>
        {
            m.as_str()
        }
        // A client's answer to a server request: nothing to say back.
        // (One with both a result and an error is no answer: JSON-RPC 5;
        // nor is an error that is not an object with an integer code.)
        None if result != error
            && msg["jsonrpc"] == "2.0"
            && (!error || msg["error"]["code"].is_i64()) =>
        {
            ""
        }
        _ => {
            return refuse(
                id.unwrap_or(Value::Null),
                "a JSON-RPC 2.0 message needs \"jsonrpc\": \"2.0\" and either a method with object params (a request) or one of result and error (a response)",
            );
        }
    };
    if !method.is_empty() && id.as_ref().is_some_and(|v| !is_request_id(v)) {
        return refuse(
            Value::Null,
            "a request id is a string or an integer of at most 64 bits (not null)",
        );
    }
    let era = if modern::applies(req, msg) {
        Era::Modern
    } else {
        Era::Handshake
    };
    let id = match era {
        // A server of 2026-07-28 sends no requests: a client sends
        // requests and notifications only.
        Era::Modern if method.is_empty() => {
            return refuse(
                id.unwrap_or(Value::Null),
                "MCP 2026-07-28: send one request or notification (this server asks clients nothing)",
            );
        }
        // Notifications are acknowledged under a revision spoken.
        Era::Modern => match id {
            None => {
                return Ok(match modern::notification_refused(req) {
                    Some(fault) => (400, Some(fault.answer(Value::Null))),
                    None => (202, None),
                });
            }
            Some(id) => {
                if let Err(fault) = modern::admit(msg, method, req) {
                    return Ok((modern::status(fault.code), Some(fault.answer(id))));
                }
                id
            }
        },
        Era::Handshake => {
            // After initialize a client names the negotiated revision in a
            // header; one this server does not speak is a 400 (absent:
            // 2025-03-26) with -32022 and every revision spoken: a client
            // of a later stateless revision retries with 2026-07-28, one
            // of the handshake's initializes (the MCP SDKs' `auto` mode).
            if method != "initialize"
                && let Some(asked) = modern::header(req, "mcp-protocol-version")
                && !PROTOCOL_VERSIONS.contains(&asked)
            {
                let refused = modern::unsupported(asked, &spoken_versions());
                return Ok((400, Some(refused.answer(id.unwrap_or(Value::Null)))));
            }
            match id.filter(|_| !method.is_empty()) {
                Some(id) => id,
                // Notifications (and responses) get no answer body.
                None => return Ok((202, None)),
            }
        }
    };
    let params = &msg["params"];
    Ok(match serve(method, &id, params, req, version, era)? {
        Ok(result) => {
            // (Only 2026-07-28 has caching hints.)
            let fresh = match era {
                Era::Modern => fresh_for(method, params, &origin::base(req)),
                Era::Handshake => None,
            };
            (200, Some(era.answer(&id, result, fresh, version)))
        }
        Err(fault) => match era {
            Era::Handshake => (200, Some(fault.answer(id))),
            Era::Modern => {
                let fault = modern::error(fault);
                (modern::status(fault.code), Some(fault.answer(id)))
            }
        },
    })
}

/// A JSON-RPC error a method answers with.
#[derive(Debug)]
pub struct RpcFault {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcFault {
    /// -32602, invalid params.
    pub fn invalid_params(message: &str) -> RpcFault {
        RpcFault {
            code: -32602,
            message: message.to_string(),
            data: None,
        }
    }

    /// -32601: no such method (or not under the revision spoken).
    pub fn method_not_found(method: &str) -> RpcFault {
        RpcFault {
            code: -32601,
            message: format!("method not found: {method}"),
            data: None,
        }
    }

    /// -32603, an internal error.
    pub fn internal(e: ApiError) -> RpcFault {
        RpcFault {
            code: -32603,
            message: e.message,
            data: None,
        }
    }

    fn answer(self, id: Value) -> Value {
        let mut answer = rpc_error(id, self.code, &self.message);
        if let Some(data) = self.data {
            answer["error"]["data"] = data;
        }
        answer
    }
}

fn rpc_result(id: &Value, result: Value) -> Value {
    object([
        ("jsonrpc", "2.0".into()),
        ("id", id.clone()),
        ("result", result),
    ])
}

/// A JSON-RPC answer as text. A `tools/list` answer's `result.tools` holds
/// its macros: the built-in tools ([`LISTED_BUILTINS`]) are written ahead
/// of them, and `tools` ahead of the result's other members.
fn answer_text(mut answer: Value) -> String {
    let Some(builtins) = LISTED_BUILTINS.with(|l| l.borrow_mut().take()) else {
        return answer.to_string();
    };
    let Some(Value::Object(rest)) = answer.get_mut("result") else {
        return answer.to_string();
    };
    let mut rest = std::mem::take(rest);
    answer["result"] = Value::Null;
    let macros = rest.remove("tools");
    // The envelope's members are `id`, `jsonrpc` and `result`, written in
    // that order: it ends `"result":null}`.
    let envelope = answer.to_string();
    let Some(head) = envelope.strip_suffix("null}") else {
        return envelope;
    };
    let rest = Value::Object(rest).to_string();
    let mut text = String::with_capacity(head.len() + builtins.len() + rest.len() + 32);
    text.push_str(head);
    text.push_str(r#"{"tools":["#);
    text.push_str(&builtins);
    for tool in macros
        .as_ref()
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        text.push(',');
        text.push_str(&tool.to_string());
    }
    text.push(']');
    match rest.strip_prefix('{').filter(|r| *r != "}") {
        Some(members) => {
            text.push(',');
            text.push_str(members);
        }
        None => text.push('}'),
    }
    text.push('}');
    text
}

fn rpc_error(id: Value, code: i64, message: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_answer_writes_the_builtins_ahead_of_its_macros() {
        let listed = |builtins: &str| {
            LISTED_BUILTINS.with(|l| *l.borrow_mut() = Some(builtins.to_string()));
        };
        let parsed = |text: String| serde_json::from_str::<Value>(&text).expect("JSON");
        listed(r#"{"name":"a"},{"name":"b"}"#);
        let answer = rpc_result(
            &json!(7),
            json!({"tools": [{"name": "m"}], "nextCursor": "m", "_meta": {"x": "null}"}}),
        );
        assert_eq!(
            parsed(answer_text(answer)),
            json!({"jsonrpc": "2.0", "id": 7, "result": {
                "tools": [{"name": "a"}, {"name": "b"}, {"name": "m"}],
                "nextCursor": "m", "_meta": {"x": "null}"}}})
        );
        // Taken by that answer: the next is written as it is.
        let plain = rpc_result(&json!(8), json!({"tools": []}));
        assert_eq!(answer_text(plain.clone()), plain.to_string());
        // No macro, no other member; an id that looks like the envelope.
        listed(r#"{"name":"a"}"#);
        let answer = rpc_result(&json!("\"result\":null}"), json!({"tools": []}));
        assert_eq!(
            parsed(answer_text(answer)),
            json!({"jsonrpc": "2.0", "id": "\"result\":null}", "result": {"tools": [{"name": "a"}]}})
        );
    }
}
