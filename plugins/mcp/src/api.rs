//! The routes of the `mcp` family and their OpenAPI (MCP tools, the JSON-RPC server, manifests and docs).

use marketplace_guest::openapi::{self, Op, nonblank, obj, op, pattern, r, t};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        ok: (200, "McpDescription"),
        ..op(
            "GET",
            "/api/mcp",
            "mcpDescription",
            "mcp",
            "MCP tool endpoints",
            "Built-in tools, defined macros and the JSON-RPC endpoint.",
        )
    },
    Op {
        writes: Some(false),
        body: Some("McpSearch"),
        ok: (200, "SearchResults"),
        errors: &[400],
        ..op(
            "POST",
            "/api/mcp/tools/search",
            "mcpSearch",
            "mcp",
            "MCP search tool",
            "Same search as GET /api/search.",
        )
    },
    Op {
        body: Some("MacroDefinition"),
        ok: (201, "MacroEnvelope"),
        errors: &[400, 401, 403, 409],
        patch: Some(define_answers),
        ..op(
            "POST",
            "/api/mcp/tools/define",
            "mcpDefine",
            "mcp",
            "Define a macro",
            "Stores a reusable search macro; names are first come; only the signed owner may update. At most 1,000 macros, of which at most 500 (`[settings.mcp] unsigned_macros`) without an owner and at most 50 (`macros_per_owner`) owned by one identity: past any of these, a new name is 409 `conflict`. A description holds no control character but line breaks and tabs (400). The TypeScript is a function body that receives `args` and returns `{term, post_type?, limit?}`. It is parsed as TypeScript (oxc) and its types erased; syntax and type-syntax errors, and TypeScript with runtime semantics (enum, namespace, parameter properties), are 400 with `details` naming `typescript` and the line and column.",
        )
    },
    Op {
        // Its endpoint form dispatches writes as requests of their own.
        writes: Some(false),
        body: Some("Execute"),
        null_absent: false,
        ok: (200, "Any"),
        errors: &[400, 402, 404, 422, 503],
        patch: Some(execute_answers),
        ..op(
            "POST",
            "/api/mcp/tools/execute",
            "mcpExecute",
            "mcp",
            "Execute a tool or endpoint",
            "Give `tool` (with `arguments`) or `endpoint`, not both (400); an endpoint's input is its `query` and `body`, and `arguments` beside it (other than `{}`) is 400. Answers with the target's status and body unchanged; a paid target without payment gives its 402. A macro's arguments are checked against its input_schema (400 with details); then its JavaScript runs in a sandbox (the boa engine: no I/O, no clock but the host's, at most 1 s, the plugin's memory cap) and the answer is the search it returns. A throw, a runaway or a bad return value is 422 `macro_error`.",
        )
    },
    Op {
        // A read, as /api/mcp/tools/execute is: a ping or a list never
        // holds the commit batch (`define`, which writes, runs as a
        // request of its own to its route).
        writes: Some(false),
        patch: Some(jsonrpc_answers),
        body: Some("McpJsonRpc"),
        null_absent: false,
        ok: (200, "Any"),
        errors: &[400],
        ..op(
            "POST",
            "/mcp",
            "mcpJsonRpc",
            "mcp",
            "MCP server (Streamable HTTP)",
            "JSON-RPC 2.0 under two kinds of MCP revision. Those of the `initialize` handshake: initialize, ping, tools/list, tools/call, resources/list, resources/templates/list, resources/read, prompts/list, prompts/get, logging/setLevel (other methods: -32601); notifications are answered 202. The stateless 2026-07-28 (a request whose `MCP-Protocol-Version` header names it, or whose `params._meta` carries `io.modelcontextprotocol/protocolVersion` under no header naming a handshake revision): no initialize; each request carries in `params._meta` its `io.modelcontextprotocol/protocolVersion` and `io.modelcontextprotocol/clientCapabilities` (else -32602) and sends `MCP-Protocol-Version`, `Mcp-Method` and, for tools/call, prompts/get and resources/read, `Mcp-Name` (base64 as `=?base64?...?=`) agreeing with its body, once each (else -32020); a revision not spoken is -32022 with `data: {supported, requested}`; methods server/discover, tools/list, tools/call, prompts/list, prompts/get, resources/list, resources/read and resources/templates/list, any other (initialize, ping, logging/setLevel among them) -32601 with HTTP 404; an error of the request's own making is HTTP 400 (a resource not found is -32602 with its `uri`); results carry `resultType: \"complete\"` and `_meta[\"io.modelcontextprotocol/serverInfo\"]`, and those of discover and the lists and reads `ttlMs` (0 for the tools list and live records, 60000 for what only a load of components changes) and `cacheScope` (`public` with a `public_url`, else `private`); a notification is 202; no batches. Resources are absolute URLs of this service (the OpenAPI document, the agent manifest, the A2A card, the fee schedule; templates for a post, a thread and a contract), read as their HTTP route answers them (-32002 for an unknown URI or record); prompts are find_listings, sell_item and contract_next_step. The tools are those of /api/mcp, define and execute included (each with the request's headers, as a request to its route: a 201 of define is a tool result; execute's payment header pays what it runs, and the endpoint's `X-Cash-Change` and `PAYMENT-RESPONSE` come back on this answer, one line each per paid call of a batch; or, x402 over MCP, a PaymentPayload in a tools/call's `params._meta[\"x402/payment\"]` pays for that call, whose result then carries the settlement in `_meta[\"x402/payment-response\"]`; an unpaid call's `structuredContent` holds x402's PaymentRequired beside the 402 body), and every macro. The handshake's revisions 2025-11-25 (the newest of them), 2025-06-18, 2025-03-26 and 2024-11-05: the client's revision when it is one of these, else 2025-11-25. A browser's `Origin` must be allowed (`[settings.mcp] allowed_origins`, the origin of `public_url`, or the request's own `Host` when that is an IP address or localhost and the service has no `public_url`), else 403; a request without `Origin` is not a browser's and passes. Every answer to an allowed `Origin` carries `Access-Control-Allow-Origin` (that origin), `Access-Control-Expose-Headers` (the payment answers `X-Cash-Change` and `PAYMENT-RESPONSE`; an unpaid call's x402 PaymentRequired is in its result) and `Vary: Origin`; the preflight is `OPTIONS /mcp`. An `MCP-Protocol-Version` header naming a revision not spoken is 400 with -32022 and every revision spoken. A batch (a JSON array of 1 to 16 messages, MCP 2025-03-26 and 2024-11-05; refused with 400 when the header names a later revision or a member is of 2026-07-28 by its `_meta`) is answered with the array of the requests' answers, in order, each as if sent alone (a member that is not a valid message, or an `initialize`, gets a -32600 error in its place; a batch of only notifications and responses is 202; once its answers pass 4 MiB, its later requests are not run and are answered -32000 saying so). Tool input that does not fit a tool's inputSchema is a tool result with `isError: true`.",
        )
    },
    Op {
        patch: Some(preflight_answers),
        ok: (204, "Any"),
        errors: &[403],
        ..op(
            "OPTIONS",
            "/mcp",
            "mcpPreflight",
            "mcp",
            "CORS preflight of POST /mcp",
            "A browser page's preflight. From an allowed `Origin` (as for `POST /mcp`): 204 with `Access-Control-Allow-Origin` (that origin), `Access-Control-Allow-Methods: POST`, `Access-Control-Allow-Headers` (`Content-Type`, `Accept`, `MCP-Protocol-Version`, `Mcp-Method`, `Mcp-Name`, `MCP-Session-Id`, `Last-Event-ID`, `X-Request-Id` and the payment headers `X-Cash-Secret`, `X-Webcash-Secret`, `X-Bitcoin-Secret`, `PAYMENT-SIGNATURE`) and `Access-Control-Max-Age: 600`. From a refused origin: 403 with the JSON-RPC error of `POST /mcp`. Without `Origin`: 204 with `Allow: OPTIONS, POST`.",
        )
    },
    Op {
        writes: Some(true),
        patch: Some(a2a_answers),
        query: &[(
            "A2A-Version",
            "string",
            false,
            "the A2A version, where the A2A-Version header does not say it (A2A 1.0, 3.6.1): 1.0 or 0.3",
        )],
        body: Some("JsonRpc"),
        null_absent: false,
        ok: (200, "A2aJsonRpcResponse"),
        ..op(
            "POST",
            "/a2a",
            "a2aJsonRpc",
            "mcp",
            "A2A agent (JSON-RPC binding, A2A 1.0 and 0.3)",
            "The agent of `/.well-known/agent-card.json`. A2A 1.0's methods `SendMessage`, `GetTask` and `ListTasks` (`CancelTask` answers that a task is final; streaming, push notifications and the extended card are not offered). A message needs `messageId` and `role` `ROLE_USER`. A text part is a search term, or names a contract (`contract CTR_...`); a data part is `{term, limit?, post_type?}` or `{contract_id}`. `SendMessage` answers `{task}`: a completed task whose artifact holds a short text and a data part (the search results, or the contract's status and allowed actions); an unknown contract gives a failed task. The task is stored and `GetTask {id}` answers it again (the newest 1000 are kept, of one client address its newest 100). `ListTasks {contextId, status?, pageSize? (1-100, default 50), pageToken?, statusTimestampAfter?, historyLength?, includeArtifacts?}` answers `{tasks, nextPageToken, pageSize (the tasks on this page), totalSize}`: the tasks of that context, newest first (a task is visible by its id or its context's id; without `contextId` the list is empty). A notification (a request without `id`) is answered 202 with no body and runs nothing. Errors are JSON-RPC errors with HTTP 200 (an internal error: 500): -32700 parse, -32600 invalid request, -32601 unknown method, -32602 invalid params, -32001 task not found, -32002 not cancelable, -32003 push notifications, -32004 unsupported operation, -32005 content type (file or URL parts only), -32007 no extended card, -32009 an `A2A-Version` other than 1.x or 0.3. A2A 0.3 (its method names `message/send`, `tasks/get`, `tasks/cancel`, and its shapes: `kind` members, roles `user` and `agent`, states such as `completed`; `message/send` answers the task itself): a request with `A2A-Version: 0.3`, or with no version (A2A 1.0: no version is 0.3), naming a 0.3 method; a 1.0 method under 0.3, or a 0.3 method under 1.x, is -32601. The version is the `A2A-Version` header, else the `A2A-Version` query parameter.",
        )
    },
    Op {
        patch: Some(docs_limit),
        query: &[
            ("q", "string", true, "words to find"),
            (
                "limit",
                "integer",
                false,
                "1 to 50, default 10 (also when empty)",
            ),
        ],
        ok: (200, "DocsResults"),
        errors: &[400],
        ..op(
            "GET",
            "/api/docs/search",
            "docsSearch",
            "docs",
            "Search the documentation",
            "Matches operations by path, summary and description.",
        )
    },
    Op {
        ok: (200, "AgentManifest"),
        ..op(
            "GET",
            "/.well-known/agent.json",
            "agentManifest",
            "docs",
            "Agent manifest",
            "Machine-readable description for agents.",
        )
    },
    Op {
        ok: (200, "AgentCard"),
        ..op(
            "GET",
            "/.well-known/agent-card.json",
            "agentCard",
            "docs",
            "A2A agent card",
            "The A2A 1.0 card of the agent at `POST /a2a` (JSON-RPC binding) and its skills, search and contract_status. URLs are absolute: from `[settings.mcp] public_url` (by default the service's `public_url`), else from the request's `Host`.",
        )
    },
    Op {
        media: Some("application/yaml"),
        patch: Some(openapi::tagged),
        ok: (200, "Any"),
        ..op(
            "GET",
            "/openapi.yaml",
            "openapiYaml",
            "docs",
            "This OpenAPI document (YAML)",
            "",
        )
    },
    Op {
        patch: Some(openapi::tagged),
        ok: (200, "Any"),
        ..op(
            "GET",
            "/openapi.json",
            "openapiJson",
            "docs",
            "This OpenAPI document (JSON)",
            "",
        )
    },
    Op {
        media: Some("text/html"),
        patch: Some(openapi::tagged),
        ok: (200, "Raw"),
        ..op(
            "GET",
            "/docs",
            "docs",
            "docs",
            "HTML reference",
            "Rendered from this document; works offline.",
        )
    },
];

/// `POST /mcp` also answers 202 (a notification), 400 (a JSON-RPC parse
/// error, an invalid request), 403 (an Origin not allowed) and, under MCP
/// 2026-07-28, 404 (a method not served).
fn jsonrpc_answers(operation: &mut Value) {
    let responses = &mut operation["responses"];
    responses["202"] = json!({"description": "a notification (or a batch of only notifications and responses): accepted, no body"});
    responses["400"] = json!({"description": "JSON-RPC parse error, invalid request, an unsupported MCP-Protocol-Version header (-32022), or a batch that is empty, over 16 messages or sent under a revision without batches; under 2026-07-28 also a request's invalid params or _meta (-32602) and headers that disagree with its body (-32020)", "content": {"application/json": {"schema": r("JsonRpcError")}}});
    responses["404"] = json!({"description": "under MCP 2026-07-28: a method not served (-32601), the handshake's initialize, ping and logging/setLevel among them", "content": {"application/json": {"schema": r("JsonRpcError")}}});
    responses["403"] = json!({"description": "the Origin is not allowed (a JSON-RPC error without id)", "content": {"application/json": {"schema": r("JsonRpcError")}}});
    // A tools/call of a paid route (execute, define) pays with them.
    pays_what_it_runs(operation, &["200"]);
}

/// A define by the macro's owner updates it: 200.
fn define_answers(operation: &mut Value) {
    operation["responses"]["200"] = json!({"description": "updated by its signed owner", "content": {"application/json": {"schema": r("MacroEnvelope")}}});
    operation["responses"]["403"]["description"] =
        json!("forbidden_party: the macro belongs to another identity");
}

/// An endpoint's answer passes through whatever its status.
fn execute_answers(operation: &mut Value) {
    // An endpoint's answer keeps its media type: an attachment comes as
    // its own (text/markdown, an upload's type), not as JSON.
    let content = json!({"application/json": {"schema": r("Any")}, "*/*": {"schema": {"type": "string", "format": "binary"}}});
    operation["responses"]["200"]["description"] = json!(
        "the tool's result, or the endpoint's answer with its status, media type and body unchanged (JSON, or an attachment's own bytes and Content-Type)"
    );
    operation["responses"]["200"]["content"] = content.clone();
    operation["responses"]["default"] = json!({"description": "the target endpoint's answer, its status and body unchanged (201 for a creation, 401, 403, 409 and the rest of its errors)", "content": content});
    pays_what_it_runs(operation, &["200", "default"]);
}

/// The payment headers pay what the operation runs, as on the target's
/// own route, and its settlement and change come back on its `answers`.
fn pays_what_it_runs(operation: &mut Value, answers: &[&str]) {
    match operation["parameters"].as_array_mut() {
        Some(params) => params.extend(openapi::payment_parameters()),
        None => operation["parameters"] = Value::Array(openapi::payment_parameters()),
    }
    for answer in answers {
        operation["responses"][*answer]["headers"] = openapi::payment_answer_headers();
    }
}

/// `OPTIONS /mcp` answers 204 with no body.
fn preflight_answers(operation: &mut Value) {
    let responses = &mut operation["responses"];
    responses["204"] = json!({"description": "the preflight's answer: CORS headers, no body"});
    responses["403"] = json!({"description": "the Origin is not allowed (a JSON-RPC error without id, as POST /mcp answers)", "content": {"application/json": {"schema": r("JsonRpcError")}}});
}

/// `POST /a2a` answers JSON-RPC errors with HTTP 200 as well, and a
/// notification with 202.
fn a2a_answers(operation: &mut Value) {
    let responses = &mut operation["responses"];
    responses["200"]["description"] = json!(
        "a JSON-RPC response: `result` (SendMessage: `{task}`; GetTask: the task; ListTasks: `{tasks, nextPageToken, pageSize, totalSize}`) or `error`"
    );
    responses["202"] = json!({"description": "a notification (a request without `id`): accepted, nothing run, no body"});
}

/// Docs search pages are at most 50 results.
fn docs_limit(operation: &mut Value) {
    for p in operation["parameters"].as_array_mut().into_iter().flatten() {
        if p["name"] == "limit" {
            p["schema"] = json!({"type": "integer", "minimum": 1, "maximum": 50});
        }
    }
}

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    json!({
        "McpDescription": obj(&[("name", t("string")), ("version", t("string")), ("tools", json!({"type": "array", "items": r("McpTool")})), ("macros", json!({"type": "array", "items": r("McpMacro")})), ("jsonrpc", t("string"))], &["tools", "macros"]),
        "McpTool": obj(&[("name", t("string")), ("description", t("string")), ("method", json!({"type": "string", "enum": ["GET", "POST"]})), ("path", t("string")), ("input_schema", json!({"type": "object", "description": "JSON Schema of the tool's arguments"}))], &["name", "description", "method", "path", "input_schema"]),
        "McpMacro": obj(&[("name", t("string")), ("description", t("string")), ("kind", t("string")), ("input_schema", json!({"type": "object", "description": "JSON Schema of the macro's arguments"}))], &["name", "description", "kind", "input_schema"]),
        "McpSearch": obj(&[("term", nonblank(1000)), ("limit", json!({"type": ["integer", "null"], "minimum": 1, "maximum": 100})), ("post_type", json!({"type": ["string", "null"], "pattern": "^([A-Za-z0-9_-]{1,64})?$"}))], &["term"]),
        "SearchResults": openapi::search_results(),
        "Post": openapi::post(),
        "MacroDefinition": obj(&[("name", pattern("^[a-z][a-z0-9_-]{0,63}$")), ("description", json!({"type": "string", "maxLength": 1000, "pattern": "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$", "description": "no control character but line breaks and tabs"})), ("kind", json!({"const": "search"})), ("typescript", {
                let mut ts = nonblank(16384);
                ts["description"] = json!("The macro's TypeScript: at most 16384 bytes of UTF-8 (so at most 16384 characters, fewer when some take several bytes).");
                ts
            }),
            ("input_schema", crate::schema::openapi()),
            ("timestamp", json!({"type": ["integer", "null"], "minimum": 0, "maximum": u64::MAX})), ("owner_fingerprint", json!({"type": ["string", "null"]})), ("signature", json!({"type": ["string", "null"]}))], &["name", "kind", "typescript", "input_schema"]),
        "MacroEnvelope": obj(&[("macro", t("object"))], &["macro"]),
        "Execute": {"anyOf": [r("ExecuteTool"), r("ExecuteEndpoint")]},
        "ExecuteTool": obj(&[("tool", nonblank(64)), ("arguments", t("object"))], &["tool"]),
        "ExecuteEndpoint": obj(&[("endpoint", r("EndpointCall"))], &["endpoint"]),
        "EndpointCall": obj(&[("method", json!({"type": "string", "enum": ["GET", "POST"]})), ("path", pattern("^/api/")), ("query", json!({"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}})), ("body", json!({}))], &["method", "path"]),
        "JsonRpcError": obj(&[("jsonrpc", t("string")), ("id", json!({})), ("error", obj(&[("code", t("integer")), ("message", t("string"))], &["code", "message"]))], &["jsonrpc", "error"]),
        "McpJsonRpc": {"anyOf": [r("JsonRpc"), {"type": "array", "minItems": 1, "maxItems": 16, "items": {},
            "description": "a batch (MCP 2025-03-26, 2024-11-05): each member a JSON-RPC message, answered in the 200's array (an invalid member by a -32600 error in its place)"}]},
        "JsonRpc": obj(&[("jsonrpc", json!({"const": "2.0"})), ("id", json!({"type": ["string", "integer"]})), ("method", json!({"type": "string", "minLength": 1})), ("params", t("object"))], &["jsonrpc", "method"]),
        "DocsResults": obj(&[("results", json!({"type": "array", "items": obj(&[("title", t("string")), ("path", t("string")), ("snippet", t("string"))], &[])}))], &["results"]),
        "AgentCard": obj(&[("name", t("string")), ("description", t("string")), ("version", t("string")), ("documentationUrl", t("string")),
            ("supportedInterfaces", json!({"type": "array", "minItems": 1, "items": obj(&[("url", t("string")), ("protocolBinding", t("string")), ("protocolVersion", t("string"))], &["url", "protocolBinding", "protocolVersion"])})),
            ("url", json!({"type": "string", "description": "A2A 0.3: the JSON-RPC endpoint"})), ("preferredTransport", json!({"type": "string", "description": "A2A 0.3: JSONRPC"})), ("protocolVersion", json!({"type": "string", "description": "A2A 0.3: the 0.3 version a 0.3 client speaks here (1.x clients read supportedInterfaces)"})),
            ("capabilities", obj(&[("streaming", t("boolean")), ("pushNotifications", t("boolean")), ("extendedAgentCard", t("boolean"))], &[])),
            ("defaultInputModes", json!({"type": "array", "items": t("string")})), ("defaultOutputModes", json!({"type": "array", "items": t("string")})),
            ("skills", json!({"type": "array", "items": obj(&[("id", t("string")), ("name", t("string")), ("description", t("string")), ("tags", json!({"type": "array", "items": t("string")})), ("examples", json!({"type": "array", "items": t("string")})), ("inputModes", json!({"type": "array", "items": t("string")})), ("outputModes", json!({"type": "array", "items": t("string")}))], &["id", "name", "description", "tags"])}))],
            &["name", "description", "version", "supportedInterfaces", "capabilities", "defaultInputModes", "defaultOutputModes", "skills"]),
        "A2aJsonRpcResponse": obj(&[("jsonrpc", json!({"const": "2.0"})), ("id", json!({"type": ["string", "integer", "null"]})), ("result", t("object")),
            ("error", obj(&[("code", t("integer")), ("message", t("string"))], &["code", "message"]))], &["jsonrpc", "id"]),
        "AgentManifest": obj(&[("name", t("string")), ("version", t("string")), ("description", t("string")), ("capabilities", json!({"type": "array", "items": t("string")})), ("openapi", t("string")), ("docs", t("string")), ("mcp", obj(&[("tools_search", t("string")), ("tools_define", t("string")), ("tools_execute", t("string")), ("description", json!({"type": "string", "description": "the tool list (GET)"})), ("jsonrpc", json!({"type": "string", "description": "the MCP server (JSON-RPC, Streamable HTTP)"})), ("protocol_versions", json!({"type": "array", "items": t("string"), "description": "the MCP revisions it speaks, newest first: 2026-07-28 (stateless: no initialize) and those of the initialize handshake"}))], &[])), ("a2a", obj(&[("card", t("string")), ("jsonrpc", t("string"))], &[])), ("fees", json!({"type": "string", "description": "the fee schedule"}))], &["name", "version", "openapi", "docs", "mcp"]),
    })
}

/// What the family serves (its `describe-api` export): the operations and
/// the schemas they reference.
pub fn api() -> marketplace_guest::types::Api {
    openapi::api(OPS, schemas())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_resolve() {
        assert_eq!(openapi::check(OPS, &schemas()), Ok(()));
    }

    #[test]
    fn routes_are_the_familys() {
        let expected = [
            ("GET", "/api/mcp", false),
            ("POST", "/api/mcp/tools/search", false),
            ("POST", "/api/mcp/tools/define", true),
            ("POST", "/api/mcp/tools/execute", false),
            ("POST", "/mcp", false),
            ("OPTIONS", "/mcp", false),
            ("POST", "/a2a", true),
            ("GET", "/api/docs/search", false),
            ("GET", "/.well-known/agent.json", false),
            ("GET", "/.well-known/agent-card.json", false),
            ("GET", "/openapi.yaml", false),
            ("GET", "/openapi.json", false),
            ("GET", "/docs", false),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
