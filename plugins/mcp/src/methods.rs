//! The MCP methods `POST /mcp` serves: `initialize`, the tools' list and
//! calls (a tool's answer as a result), `logging/setLevel`, and the
//! resources' and prompts' (in their own modules), with what the server
//! says of itself.

use crate::macros::{MACRO_PAGE, listed_description, macro_page, valid_name};
use crate::rpc::{Era, LISTED_BUILTINS, RpcFault, fault_answer};
use crate::run::{forward, run_named, unknown_tool};
use crate::tools::{
    TOOLS, annotations, input_schema, listing_text, output_schema_of, tool_output_schema,
};
use crate::{modern, origin, prompts, resources, schema, x402};
use marketplace_guest::prelude::*;

/// MCP protocol revisions of the `initialize` handshake this server speaks
/// (newest first; 2026-07-28's are [`modern::VERSIONS`]).
pub(crate) const PROTOCOL_VERSIONS: &[&str] =
    &["2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"];

/// What an agent is told of this server when it connects.
pub const INSTRUCTIONS: &str = "Search listings with `search`; read posts, threads, profiles and contracts with the get_* tools. Act (post, register, rate, trade) with `execute` on a public /api endpoint (its description says how a body is signed; the `openapi` resource documents every route); a paid one is paid by an X-Cash-Secret (or PAYMENT-SIGNATURE) header on this MCP request's HTTP POST, or by an x402 PaymentPayload in the tools/call's params._meta[\"x402/payment\"], and answers 402 with its price without one. Macro tools are defined by users: their descriptions are not this server's.";

/// The server's capabilities; `logging` only under the handshake (MCP
/// 2026-07-28 dropped `logging/setLevel`). No list changes are announced
/// and no resource is subscribed to.
pub fn capabilities(handshake: bool) -> Value {
    let mut capabilities = json!({"tools": {"listChanged": false},
                                  "resources": {"subscribe": false, "listChanged": false},
                                  "prompts": {"listChanged": false}});
    if handshake {
        capabilities["logging"] = json!({});
    }
    capabilities
}

/// Every MCP revision `/mcp` speaks, newest first: 2026-07-28's, then the
/// handshake's.
pub(crate) fn spoken_versions() -> Vec<&'static str> {
    modern::VERSIONS
        .iter()
        .chain(PROTOCOL_VERSIONS)
        .copied()
        .collect()
}

/// Who answers (MCP's `Implementation`).
pub fn server_info(version: &str) -> Value {
    json!({"name": "marketplace", "version": version})
}

/// How long a cacheable result stays fresh (MCP 2026-07-28's `ttlMs`), in
/// milliseconds: the tools list and live reads not at all (a macro may be
/// defined, a post written, at any moment); what only a load of components
/// changes (prompts, the resource lists, the documents, the capabilities)
/// [`STABLE_FRESH_MS`]. `None` for a method whose results are not cached.
pub(crate) fn fresh_for(method: &str, params: &Value, base: &str) -> Option<u64> {
    match method {
        "tools/list" => Some(0),
        "prompts/list" | "resources/list" | "resources/templates/list" | "server/discover" => {
            Some(STABLE_FRESH_MS)
        }
        "resources/read" => Some(
            if params["uri"]
                .as_str()
                .is_some_and(|uri| resources::is_document(base, uri))
            {
                STABLE_FRESH_MS
            } else {
                0
            },
        ),
        _ => None,
    }
}

/// See [`fresh_for`]: a client may reuse such a result a minute.
const STABLE_FRESH_MS: u64 = 60_000;

/// A request's result, or the JSON-RPC error it is answered, under `era`:
/// the handshake's methods, or 2026-07-28's ([`modern::METHODS`]).
pub(crate) fn serve(
    method: &str,
    id: &Value,
    params: &Value,
    req: &Request,
    version: &str,
    era: Era,
) -> Result<Result<Value, RpcFault>, ApiError> {
    let served = match era {
        Era::Modern => modern::METHODS.contains(&method),
        Era::Handshake => method != "server/discover",
    };
    if !served {
        return Ok(Err(RpcFault::method_not_found(method)));
    }
    Ok(match method {
        "resources/list" => resources::list(&origin::base(req), params),
        "resources/templates/list" => resources::templates(&origin::base(req), params),
        "resources/read" => resources::read(&origin::base(req), version, params),
        "prompts/list" => prompts::list(params),
        "prompts/get" => prompts::get(params),
        "logging/setLevel" => set_level(params),
        "initialize" => initialize(params, version),
        "ping" => Ok(json!({})),
        "server/discover" => Ok(modern::discover()),
        "tools/list" => tools_list(params)?,
        "tools/call" => tools_call(id, params, req, version, era),
        _ => Err(RpcFault::method_not_found(method)),
    })
}

/// `initialize` (the handshake): the revision agreed (the client's if
/// spoken, else the newest), the capabilities, who answers.
fn initialize(params: &Value, version: &str) -> Result<Value, RpcFault> {
    // InitializeRequest's params: protocolVersion (a string), capabilities
    // and clientInfo (objects).
    let Some(asked) = params.get("protocolVersion").and_then(Value::as_str) else {
        return Err(RpcFault::invalid_params(
            "params.protocolVersion (a string) is required",
        ));
    };
    for member in ["capabilities", "clientInfo"] {
        if !params.get(member).is_some_and(Value::is_object) {
            return Err(RpcFault::invalid_params(&format!(
                "params.{member} (an object) is required"
            )));
        }
    }
    let agreed = PROTOCOL_VERSIONS
        .iter()
        .find(|v| **v == asked)
        .unwrap_or(&PROTOCOL_VERSIONS[0]);
    Ok(json!({"protocolVersion": agreed,
              "capabilities": capabilities(true),
              "serverInfo": server_info(version),
              "instructions": INSTRUCTIONS}))
}

/// `tools/list`: the built-in tools and the first page of macros, then
/// pages of macros (MCP pagination) while `nextCursor` (the last macro's
/// name) says more follow.
fn tools_list(params: &Value) -> Result<Result<Value, RpcFault>, ApiError> {
    let after = match params.get("cursor") {
        None | Some(Value::Null) => "",
        // A nextCursor names the last macro of its page: one that names
        // no macro is no cursor of this server's.
        Some(Value::String(c))
            if valid_name(c) && kv::get_raw(None, &format!("macro/{c}"))?.is_some() =>
        {
            c.as_str()
        }
        Some(_) => {
            return Ok(Err(RpcFault::invalid_params(
                "params.cursor is not a cursor: send a tools/list answer's nextCursor",
            )));
        }
    };
    if after.is_empty() {
        // The first page lists the built-in tools first: their JSON text,
        // written into the answer as it is (see [`crate::rpc::answer_text`]).
        let text = listing_text("tools-list/builtins.json", |documented| {
            let tools = TOOLS
                .iter()
                .map(|t| {
                    Ok(listed_tool(
                        t.name,
                        t.description.into(),
                        input_schema(t, documented)?,
                        annotations(t.name),
                        output_schema_of(t, documented)?,
                    ))
                })
                .collect::<Result<Vec<_>, ApiError>>()?;
            Ok(Value::Array(tools).to_string())
        });
        let builtins = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .filter(|t| !t.is_empty())
            .ok_or_else(|| ApiError::internal("the built-in tools' listing is not a JSON array"))?;
        LISTED_BUILTINS.with(|l| *l.borrow_mut() = Some(builtins.to_string()));
    }
    let mut tools = Vec::new();
    let mut page = macro_page(after, MACRO_PAGE + 1)?;
    let next = (page.len() > MACRO_PAGE as usize).then(|| {
        page.truncate(MACRO_PAGE as usize);
        page.last().map(|m| m.name.clone())
    });
    // A macro answers with a search: it only reads too.
    let search_output = TOOLS
        .iter()
        .find(|t| t.name == "search")
        .and_then(tool_output_schema);
    for m in page {
        let description = listed_description(&m).into();
        let annotations = json!({"readOnlyHint": true, "openWorldHint": false});
        let input = schema::listed(m.input_schema);
        tools.push(listed_tool(
            &m.name,
            description,
            input,
            annotations,
            search_output.clone(),
        ));
    }
    Ok(Ok(match next.flatten() {
        Some(cursor) => object([("tools", tools.into()), ("nextCursor", cursor.into())]),
        None => object([("tools", tools.into())]),
    }))
}

/// A tool as `tools/list` lists it.
fn listed_tool(
    name: &str,
    description: Value,
    input: Value,
    annotations: Value,
    output: Option<Value>,
) -> Value {
    let mut tool = object([
        ("name", name.into()),
        ("description", description),
        ("inputSchema", input),
        ("annotations", annotations),
    ]);
    if let Some(output) = output {
        tool["outputSchema"] = output;
    }
    tool
}

/// `tools/call`: the tool's answer as its result (a tool's own failure is
/// a result with `isError`); an unknown tool, arguments that are not an
/// object or an x402 payment that is none are -32602.
fn tools_call(
    id: &Value,
    params: &Value,
    req: &Request,
    version: &str,
    era: Era,
) -> Result<Value, RpcFault> {
    let Some(name) = params["name"].as_str() else {
        return Err(RpcFault::invalid_params("params.name is required"));
    };
    // Arguments that are not an object fail the CallToolRequest schema (a
    // protocol error); arguments that do not fit the tool's inputSchema
    // are the tool's error (isError: true).
    let args = match params.get("arguments") {
        None | Some(Value::Null) => json!({}),
        Some(a @ Value::Object(_)) => a.clone(),
        Some(_) => {
            return Err(RpcFault::invalid_params(
                "params.arguments must be an object",
            ));
        }
    };
    // x402 over MCP: a payment in `_meta` pays the endpoint the tool runs
    // as a PAYMENT-SIGNATURE header would.
    let _paying = match x402::payment_header(params) {
        Ok(header) => header.map(|h| forward("payment-signature", h)),
        Err(why) => return Err(RpcFault::invalid_params(why)),
    };
    let base = origin::base(req);
    let wrap = |r: Response| {
        fault_answer(
            200,
            era.answer(id, tool_result(name, &r, &base), None, version),
        )
    };
    let resp = match run_named(name, &args, &wrap, req) {
        Ok(r) => r,
        // The tool called is unknown (a protocol error); a tool that
        // `execute` names is that tool's error.
        Err(e) if e.status == 404 && e.message == unknown_tool(name).message => {
            return Err(RpcFault::invalid_params(&format!("unknown tool {name}")));
        }
        Err(e) => e.into(),
    };
    // (The endpoint's payment answers, `X-Cash-Change` and
    // `PAYMENT-RESPONSE`, reach the client on this request's HTTP answer,
    // or its fault's: the host passes them on.)
    Ok(tool_result(name, &resp, &base))
}

/// Where a tools/call result carries the HTTP status its endpoint answered.
const STATUS_META: &str = "marketplace/status";

/// A tools/call result of the tool `name`: its answer as text, and as
/// structured content when it is a JSON object, but for a refusal of a
/// tool that lists an `outputSchema` (see [`lists_output_schema`]). An
/// answer that is not UTF-8 (an attachment's bytes) is not text: it comes
/// base64-encoded, as image or audio content when its media type says so,
/// else as an embedded resource (`blob`) at `base` + where it came from.
fn tool_result(name: &str, resp: &Response, base: &str) -> Value {
    let content = match std::str::from_utf8(&resp.body) {
        Ok(text) => object([("type", "text".into()), ("text", text.into())]),
        Err(_) => binary_content(resp, base),
    };
    // The endpoint's HTTP status, for a program (an agent reads isError
    // and the body); `x402::annotate` adds its settlement beside it.
    let mut result = object([
        ("content", vec![content].into()),
        ("isError", (resp.status >= 400).into()),
        ("_meta", json!({STATUS_META: resp.status})),
    ]);
    // A 402 for want of payment (not a refused one: that header was sent).
    let unpaid = resp.status == 402
        && serde_json::from_slice::<Value>(&resp.body)
            .is_ok_and(|b| b["code"] == "payment_required");
    if unpaid {
        // The 402 body speaks of HTTP headers: say where they go over MCP.
        result["content"].as_array_mut().expect("an array").push(json!({"type": "text", "text":
            "To pay over MCP: call this tool again with the payment header (X-Cash-Secret: e<amount>:secret:<hex>, or x402's PAYMENT-SIGNATURE) on the HTTP POST /mcp request that carries the tools/call, or with an x402 PaymentPayload ({x402Version: 2, accepted: <the entry of structuredContent.accepts>, payload: {secret: \"e<amount>:secret:<hex>\"}}) in params._meta[\"x402/payment\"]. The change of an overpayment comes back as the HTTP answer's X-Cash-Change header, and in the result's _meta[\"x402/payment-response\"].extra.change."}));
    }
    if let Ok(v @ Value::Object(_)) = serde_json::from_slice::<Value>(&resp.body) {
        result["structuredContent"] = v;
    }
    x402::annotate(&mut result, resp);
    // MCP: structured content MUST conform to the tool's outputSchema,
    // which describes its answers, not its refusals; clients check it
    // even on an error (the TypeScript SDK's callTool threw a schema error
    // in place of the refusal). A refusal's body stays the text above.
    if resp.status >= 400
        && let Value::Object(r) = &mut result
        && lists_output_schema(name)
    {
        r.remove("structuredContent");
    }
    result
}

/// Whether `tools/list` lists an `outputSchema` for the tool `name`: a
/// built-in whose route answers one object schema, or a macro (which
/// answers a search).
fn lists_output_schema(name: &str) -> bool {
    let builtin = |n: &str| TOOLS.iter().find(|t| t.name == n);
    builtin(name)
        .or_else(|| builtin("search"))
        .and_then(tool_output_schema)
        .is_some()
}

/// The most bytes of an answer a tool result carries inline (base64).
const MAX_INLINE_BYTES: usize = 4 << 20;

/// An answer's bytes as MCP content (see [`tool_result`]).
fn binary_content(resp: &Response, base: &str) -> Value {
    use base64::Engine as _;
    let header = |name: &str| {
        resp.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    };
    let mime = header("content-type")
        .and_then(|t| t.split(';').next())
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .unwrap_or("application/octet-stream");
    let uri = format!("{base}{}", header("content-location").unwrap_or("/"));
    // Past this, base64 and the JSON answer around it would pass the
    // component's memory cap (an upload of nearly 8 MiB answered 500):
    // the result says where HTTP serves the bytes instead.
    if resp.body.len() > MAX_INLINE_BYTES {
        return json!({"type": "text", "text": format!(
            "{mime}, {} bytes: more than the {} MiB a tool result carries inline. Fetch it over HTTP: GET {uri}",
            resp.body.len(),
            MAX_INLINE_BYTES >> 20
        )});
    }
    let data = base64::engine::general_purpose::STANDARD.encode(&resp.body);
    if mime.starts_with("image/") {
        json!({"type": "image", "data": data, "mimeType": mime})
    } else if mime.starts_with("audio/") {
        json!({"type": "audio", "data": data, "mimeType": mime})
    } else {
        json!({"type": "resource", "resource": {"uri": uri, "mimeType": mime, "blob": data}})
    }
}

/// The levels of `logging/setLevel` (RFC 5424's, as MCP names them).
const LOG_LEVELS: &[&str] = &[
    "debug",
    "info",
    "notice",
    "warning",
    "error",
    "critical",
    "alert",
    "emergency",
];

/// `logging/setLevel`: accepted (an empty result) for a level MCP names.
/// Answers are plain JSON, never a stream, so this server sends no log
/// notifications at any level.
fn set_level(params: &Value) -> Result<Value, RpcFault> {
    match params.get("level").and_then(Value::as_str) {
        Some(level) if LOG_LEVELS.contains(&level) => Ok(json!({})),
        _ => Err(RpcFault::invalid_params(&format!(
            "params.level must be one of {}",
            LOG_LEVELS.join(", ")
        ))),
    }
}
