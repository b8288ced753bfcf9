//! The built-in tools as data (name, description, route, input schema),
//! the schemas they are listed with (their own, tightened by their routes'
//! OpenAPI operations; their answers' as `outputSchema`), and
//! `GET /api/mcp`, which lists them with the macros.

use crate::macros::{MACRO_BUDGET_MS, MAX_MACROS, each_macro_page};
use crate::{openapi, raw};
use marketplace_guest::memoized;
use marketplace_guest::prelude::*;

/// A built-in tool: name, description, HTTP method and path template,
/// input schema.
pub(crate) struct Tool {
    pub(crate) name: &'static str,
    pub(crate) description: &'static str,
    pub(crate) method: &'static str,
    pub(crate) path: &'static str,
    schema: fn() -> Value,
}

impl Tool {
    /// The route whose OpenAPI operation states what this tool's arguments
    /// may be: a read tool's own, the search tool's `GET /api/search`.
    fn read_route(&self) -> Option<&'static str> {
        match (self.name, self.method) {
            ("search", _) => Some("/api/search"),
            (_, "GET") => Some(self.path),
            _ => None,
        }
    }
}

/// Keywords of a route's parameter schema that constrain its value.
const CONSTRAINTS: &[&str] = &[
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "enum",
];

/// `schema` (a tool's own) with each argument that is a parameter of
/// `operation` given the constraints that parameter's schema states and
/// the argument's does not: the route refuses what they exclude, so the
/// listed schema says so too (a `pattern` is the route's to check).
fn tightened(mut schema: Value, operation: &Value) -> Value {
    let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return schema;
    };
    for param in operation["parameters"].as_array().into_iter().flatten() {
        let (Some(name), Some(stated)) = (param["name"].as_str(), param["schema"].as_object())
        else {
            continue;
        };
        if !matches!(param["in"].as_str(), Some("query" | "path")) {
            continue;
        }
        let Some(argument) = properties.get_mut(name).and_then(Value::as_object_mut) else {
            continue;
        };
        for &key in CONSTRAINTS {
            if let Some(value) = stated.get(key)
                && !argument.contains_key(key)
            {
                argument.insert(key.into(), value.clone());
            }
        }
    }
    schema
}

/// A built-in tool's input schema as listed and checked: its own,
/// [`tightened`] by its route's operation in the service's document;
/// rendered once per load of components (each tool's apart: a call reads
/// only its own). Its own alone should the document fail to parse.
pub(crate) fn tool_schema(tool: &Tool) -> Value {
    input_schema(tool, true).unwrap_or_else(|_| (tool.schema)())
}

/// [`tool_schema`] as the document gives it (`documented`: an error where
/// the document could not be read), else the tool's own.
pub(crate) fn input_schema(tool: &Tool, documented: bool) -> Result<Value, ApiError> {
    let Some(path) = tool.read_route().filter(|_| documented) else {
        return Ok((tool.schema)());
    };
    let text = memoized(&format!("tool-schema/{}.json", tool.name), || {
        let document = openapi::document()?;
        Ok(tightened((tool.schema)(), &operation_of(&document, "GET", path)).to_string())
    })?;
    serde_json::from_str(&text).map_err(|e| ApiError::internal(e.to_string()))
}

/// What lists the built-in tools (`GET /api/mcp`'s head, `tools/list`'s
/// first page), as JSON text: `render(true)` kept in the memo (once per
/// load of components) when every schema came from the document, else
/// `render(false)` (each tool's own schemas), kept by nobody. A listing
/// then parses one text, not one per schema, and copies no schema.
pub(crate) fn listing_text(key: &str, render: impl Fn(bool) -> Result<String, ApiError>) -> String {
    memoized(key, || render(true))
        .or_else(|_| render(false))
        .unwrap_or_default()
}

/// The operation of `document` at `method` and `path` but for the names of
/// its `{parameters}` (a tool may name one otherwise than its route does:
/// `{contract_id}` for `{id}`); null when there is none.
fn operation_of(document: &Value, method: &str, path: &str) -> Value {
    use marketplace_common::url::pattern_shape;
    let shape = pattern_shape(path);
    document["paths"]
        .as_object()
        .and_then(|paths| paths.iter().find(|(p, _)| pattern_shape(p) == shape))
        .map_or(Value::Null, |(_, item)| {
            item[method.to_ascii_lowercase()].clone()
        })
}

/// What a successful call of a tool answers, as MCP's `outputSchema`: the
/// JSON object schema its route's OpenAPI operation gives every 2xx
/// answer (the search route's for macros, which answer a search), with
/// the component schemas it refers to under `$defs`; None for a tool
/// whose answers are not one object schema (execute's any endpoint, an
/// attachment's bytes). A client checks `structuredContent` against it.
fn output_schema(document: &Value, method: &str, path: &str) -> Option<Value> {
    let operation = operation_of(document, method, path);
    let mut answers = operation["responses"]
        .as_object()?
        .iter()
        .filter(|(status, _)| status.starts_with('2'))
        .map(|(_, answer)| answer["content"]["application/json"]["schema"].clone());
    let first = answers.next()?;
    if answers.any(|other| other != first) {
        return None;
    }
    let schemas = &document["components"]["schemas"];
    let name = |reference: &Value| {
        reference
            .as_str()
            .and_then(|r| r.strip_prefix("#/components/schemas/"))
            .map(str::to_string)
    };
    let mut root = schemas.get(name(&first["$ref"])?)?.clone();
    if root["type"] != "object" {
        return None;
    }
    // Every schema it refers to, transitively, and its references made
    // local to it.
    fn refer_locally(v: &mut Value, found: &mut Vec<String>) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get_mut("$ref")
                    && let Some(name) = r.strip_prefix("#/components/schemas/")
                {
                    if !found.iter().any(|f| f == name) {
                        found.push(name.to_string());
                    }
                    *r = format!("#/$defs/{name}");
                }
                map.values_mut().for_each(|v| refer_locally(v, found));
            }
            Value::Array(items) => items.iter_mut().for_each(|v| refer_locally(v, found)),
            _ => {}
        }
    }
    let mut found = Vec::new();
    refer_locally(&mut root, &mut found);
    let mut defs = serde_json::Map::new();
    let mut at = 0;
    while at < found.len() {
        let mut def = schemas.get(&found[at])?.clone();
        refer_locally(&mut def, &mut found);
        defs.insert(found[at].clone(), def);
        at += 1;
    }
    if !defs.is_empty() {
        root["$defs"] = Value::Object(defs);
    }
    Some(root)
}

/// A built-in tool's `outputSchema` (see [`output_schema`]), rendered once
/// per load of components; None when it has none or the document fails
/// to parse.
pub(crate) fn tool_output_schema(tool: &Tool) -> Option<Value> {
    output_schema_of(tool, true).ok().flatten()
}

/// [`tool_output_schema`] as the document gives it (`documented`: an error
/// where the document could not be read), else none.
pub(crate) fn output_schema_of(tool: &Tool, documented: bool) -> Result<Option<Value>, ApiError> {
    if !documented {
        return Ok(None);
    }
    let text = memoized(&format!("tool-output/{}.json", tool.name), || {
        let document = openapi::document()?;
        Ok(output_schema(&document, tool.method, tool.path)
            .map_or_else(String::new, |s| s.to_string()))
    })?;
    Ok(serde_json::from_str(&text).ok())
}

fn search_schema() -> Value {
    json!({"type": "object", "properties": {
        "term": {"type": "string", "minLength": 1, "maxLength": 1000, "description": "words to find"},
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "most results, default 20"},
        "post_type": {"type": "string", "description": "only posts of this type, e.g. general or service_request"}},
        "required": ["term"]})
}

fn post_id_schema() -> Value {
    json!({"type": "object", "properties": {"post_id": {"type": "string", "minLength": 1, "description": "post_<ULID>"}}, "required": ["post_id"]})
}

/// The contract id as its route takes it: any id (one that names nothing
/// is its route's 404 `not_found`, as over HTTP; a length rule here made
/// `CTR` a 400 over MCP alone).
fn contract_id_schema() -> Value {
    json!({"type": "object", "properties": {"contract_id": {"type": "string", "minLength": 1, "description": "CTR_ and 1 to 64 letters, digits, '_' or '-'"}}, "required": ["contract_id"]})
}

pub(crate) const TOOLS: &[Tool] = &[
    Tool {
        name: "search",
        description: "Search marketplace posts (BM25).",
        method: "POST",
        path: "/api/mcp/tools/search",
        schema: search_schema,
    },
    Tool {
        name: "define",
        description: "Define a reusable search macro: a tool under its own name whose TypeScript turns the caller's arguments into a search. A name is taken first come; only its owner (a signed owner_fingerprint) may define it again.",
        method: "POST",
        path: "/api/mcp/tools/define",
        schema: || {
            json!({"type": "object", "properties": {
            "name": {"type": "string", "pattern": "^[a-z][a-z0-9_-]{0,63}$", "description": "the macro's tool name: lower-case letters, digits, '_' and '-', starting with a letter"},
            "description": {"type": "string", "maxLength": 1000, "pattern": "^[^\\u0000-\\u0008\\u000b\\u000c\\u000e-\\u001f\\u007f-\\u009f]*$", "description": "what the macro finds, shown to agents as its tool description (no control character but line breaks and tabs)"},
            "kind": {"const": "search", "description": "\"search\" (the only kind)"},
            "typescript": {"type": "string", "minLength": 1, "description": format!("a function body that receives `args` (the caller's arguments, checked against input_schema) and returns {{term, post_type?, limit?}}, e.g. `return {{term: args.topic + \" \" + args.city, limit: 10}};`. At most 16384 bytes; runs sandboxed: no I/O, at most {MACRO_BUDGET_MS} ms (its engine's start included) and 64 MiB (beyond either: 422 macro_error); a syntax error is a 400 at define time.")},
            "input_schema": crate::schema::openapi(),
            "owner_fingerprint": {"type": "string", "description": "to own the macro: a registered identity's fingerprint"},
            "signature": {"type": "string", "description": "hex of that identity's Ed25519 signature of the UTF-8 text define:{name}:{sha256 hex of typescript}:{timestamp}, timestamp within 300 s of the server's clock (without timestamp, the legacy form define:{name}:{sha256 hex of typescript})"},
            "timestamp": {"type": "integer", "minimum": 0, "description": "the signature's Unix time (seconds), for the fresh form"}},
            "required": ["name", "kind", "typescript", "input_schema"]})
        },
    },
    Tool {
        name: "execute",
        description: "Run a tool ({tool, arguments}) or a public /api endpoint ({endpoint: {method, path, query?, body?}}), e.g. {\"endpoint\": {\"method\": \"POST\", \"path\": \"/api/timeline\", \"body\": {...}}}. A body that acts is signed: `signature` = hex of an Ed25519 signature, by the signer's key, over the UTF-8 text `{message}:{timestamp}`, with `timestamp` (Unix seconds, within 300 s; each signature once) in the body; the signer member is the key's fingerprint (its public key in hex). Signer member and message per endpoint: POST /api/identity: pgp_public_key, register:{nickname}; POST /api/timeline (a post or comment): author_fingerprint, post:{content}; POST /api/profiles/rate: actor_fingerprint, vote:{post_id}:{vote}; POST /api/arbitration/contracts/buy: buyer_fingerprint, buy_contract:{buyer_fingerprint}:{reference_post}:{contract_id}:{witness_proof} (an absent value is empty: buy_contract:{fp}:{post}:: then :{timestamp}); .../{contract_id}/accept: seller_fingerprint, accept:{contract_id}:{seller_fingerprint}; .../deliver: actor_fingerprint, deliver:{contract_id}:{delivered_text}; .../pickup: actor_fingerprint, {contract_id}; .../refund: actor_fingerprint, REFUND:{contract_id}; .../release: actor_fingerprint, release:{contract_id}; the others: the `openapi` resource's description of each route. The answer is the endpoint's body (isError for a status of 400 or more; the status itself in the result's _meta[\"marketplace/status\"]). A paid endpoint is paid by the payment header (X-Cash-Secret: e<amount>:secret:<hex>, or PAYMENT-SIGNATURE) sent on this MCP request's HTTP POST, or over JSON-RPC by an x402 PaymentPayload in params._meta[\"x402/payment\"]; without one it is an isError result with the endpoint's 402 body (its price) and x402's PaymentRequired (x402Version, accepts) in structuredContent. The change of an overpayment is the X-Cash-Change header of the HTTP answer and payment.change of the endpoint's body.",
        method: "POST",
        path: "/api/mcp/tools/execute",
        schema: || {
            json!({"type": "object", "properties": {
            "tool": {"type": "string", "description": "a tool's or macro's name (with arguments)"},
            "arguments": {"type": "object", "description": "the tool's arguments"},
            "endpoint": {"type": "object", "description": "a public /api endpoint to call", "properties": {
                "method": {"type": "string", "description": "GET (the default) or POST, in any case"},
                "path": {"type": "string", "pattern": "^/api/", "description": "e.g. /api/timeline"},
                "query": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}},
                "body": {"description": "the JSON body of a POST"}},
                "required": ["path"]}}})
        },
    },
    Tool {
        name: "get_post",
        description: "One post with its listing check.",
        method: "GET",
        path: "/api/posts/{post_id}",
        schema: post_id_schema,
    },
    Tool {
        name: "get_thread",
        description: "A post and its comments, oldest first. A thread too large for one answer ends with next_after: call again with it as `after` for the rest.",
        method: "GET",
        path: "/api/thread/{post_id}",
        schema: || json!({"type": "object", "properties": {"post_id": {"type": "string", "minLength": 1, "description": "post_<ULID>"}, "after": {"type": "string", "description": "next_after of the previous answer"}}, "required": ["post_id"]}),
    },
    Tool {
        name: "get_attachment",
        description: "One attachment of a post (raw).",
        method: "GET",
        path: "/api/posts/{post_id}/attachments/{index}",
        schema: || json!({"type": "object", "properties": {"post_id": {"type": "string", "minLength": 1}, "index": {"type": "integer", "minimum": 0}}, "required": ["post_id", "index"]}),
    },
    Tool {
        name: "get_timeline",
        description: "Newest posts, with filters.",
        method: "GET",
        path: "/api/timeline",
        schema: || {
            json!({"type": "object", "properties": {
            "limit": {"type": "integer", "minimum": 1, "maximum": 100, "description": "default 20"},
            "before": {"type": "string", "description": "next_before of the previous page"},
            "post_type": {"type": "string"},
            "author": {"type": "string", "description": "author fingerprint"}}})
        },
    },
    Tool {
        name: "get_profile",
        description: "A profile by fingerprint or nickname (give one of the two).",
        method: "GET",
        path: "/api/profile",
        schema: || json!({"type": "object", "properties": {"fingerprint": {"type": "string"}, "nickname": {"type": "string"}}}),
    },
    Tool {
        name: "get_contract",
        description: "One arbitration contract.",
        method: "GET",
        path: "/api/arbitration/contracts/{contract_id}",
        schema: contract_id_schema,
    },
    Tool {
        name: "get_contract_status",
        description: "A contract's status, the actions allowed now, and who may take each (actions_by_role: the buyer's and the seller's).",
        method: "GET",
        path: "/api/arbitration/contracts/{contract_id}/status",
        schema: contract_id_schema,
    },
    Tool {
        name: "get_fees",
        description: "The fee schedule.",
        method: "GET",
        path: "/api/fees",
        // No parameters: only an empty object (MCP 2025-11-25's advice).
        schema: || json!({"type": "object", "additionalProperties": false}),
    },
];

/// What a client may assume of a built-in tool offered over JSON-RPC:
/// every one reads only, but `define` (it stores a macro, or replaces its
/// owner's) and `execute` (it runs any public endpoint: posting, paying,
/// deleting).
pub(crate) fn annotations(tool: &str) -> Value {
    match tool {
        "define" => json!({"readOnlyHint": false, "destructiveHint": true,
                           "idempotentHint": false, "openWorldHint": false}),
        "execute" => json!({"readOnlyHint": false, "destructiveHint": true,
                            "idempotentHint": false, "openWorldHint": false}),
        _ => json!({"readOnlyHint": true, "openWorldHint": false}),
    }
}

/// A macro as `GET /api/mcp` describes it (written from the stored
/// macro, its schema not copied).
#[derive(serde::Serialize)]
struct Described<'a> {
    description: &'a str,
    input_schema: &'a Value,
    kind: &'a str,
    name: &'a str,
}

/// `GET /api/mcp`: written as text a page of macros at a time, so that
/// a thousand macros' schemas are never all parsed at once.
pub(crate) fn describe(version: &str) -> Result<Response, ApiError> {
    let mut out = listing_text("describe/head.json", |documented| {
        let tools = TOOLS
            .iter()
            .map(|t| {
                let input = input_schema(t, documented)?;
                Ok(object([
                    ("name", t.name.into()),
                    ("description", t.description.into()),
                    ("method", t.method.into()),
                    ("path", t.path.into()),
                    ("input_schema", input),
                ]))
            })
            .collect::<Result<Vec<_>, ApiError>>()?;
        let head = object([
            ("name", "marketplace".into()),
            ("version", version.into()),
            ("tools", tools.into()),
        ]);
        Ok(head.to_string())
    });
    out.pop();
    out.push_str(r#","macros":["#);
    let mut first = true;
    each_macro_page(MAX_MACROS as u32, |page| {
        for m in page {
            if !first {
                out.push(',');
            }
            first = false;
            out.push_str(&json_text(&Described {
                description: m.description.as_deref().unwrap_or(""),
                input_schema: &m.input_schema,
                kind: m.kind.as_deref().unwrap_or("search"),
                name: &m.name,
            }));
        }
        true
    })?;
    out.push_str(r#"],"jsonrpc":"/mcp"}"#);
    Ok(raw(out, "application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tools_output_schema_is_its_routes_answer_with_what_it_refers_to() {
        let answer = |schema: &str| json!({"content": {"application/json": {"schema": {"$ref": format!("#/components/schemas/{schema}")}}}});
        let document = json!({
            "paths": {
                "/api/posts/{post_id}": {"get": {"responses": {"200": answer("Envelope"), "404": answer("Error")}}},
                "/api/define": {"post": {"responses": {"200": answer("Envelope"), "201": answer("Envelope")}}},
                "/api/either": {"post": {"responses": {"200": answer("Envelope"), "201": answer("Post")}}},
                "/api/list": {"get": {"responses": {"200": answer("List")}}},
                "/api/bytes": {"get": {"responses": {"200": {"content": {"*/*": {"schema": {"type": "string"}}}}}}},
            },
            "components": {"schemas": {
                "Envelope": {"type": "object", "properties": {"post": {"$ref": "#/components/schemas/Post"}}},
                "Post": {"type": "object", "properties": {"author": {"$ref": "#/components/schemas/Author"},
                                                           "replies": {"type": "array", "items": {"$ref": "#/components/schemas/Post"}}}},
                "Author": {"type": "string"},
                "List": {"type": "array", "items": {"$ref": "#/components/schemas/Post"}},
                "Error": {"type": "object"},
            }},
        });
        let out = output_schema(&document, "GET", "/api/posts/{id}").expect("an object answer");
        assert_eq!(out["type"], "object");
        assert_eq!(out["properties"]["post"]["$ref"], "#/$defs/Post");
        assert_eq!(
            out["$defs"]["Post"]["properties"]["author"]["$ref"],
            "#/$defs/Author"
        );
        assert_eq!(
            out["$defs"]["Post"]["properties"]["replies"]["items"]["$ref"],
            "#/$defs/Post"
        );
        assert_eq!(out["$defs"]["Author"], json!({"type": "string"}));
        assert!(out["$defs"].get("Error").is_none());
        // Two 2xx answers of one schema; of two, none; not an object; bytes.
        assert!(output_schema(&document, "POST", "/api/define").is_some());
        assert_eq!(output_schema(&document, "POST", "/api/either"), None);
        assert_eq!(output_schema(&document, "GET", "/api/list"), None);
        assert_eq!(output_schema(&document, "GET", "/api/bytes"), None);
        assert_eq!(output_schema(&document, "GET", "/api/none"), None);
    }

    #[test]
    fn a_tool_schema_takes_its_routes_query_constraints_it_lacks() {
        let operation = json!({"parameters": [
            {"in": "query", "name": "post_type", "schema": {"type": "string", "pattern": "^x$", "maxLength": 64}},
            {"in": "query", "name": "limit", "schema": {"type": "integer", "minimum": 1, "maximum": 100}},
            {"in": "query", "name": "unlisted", "schema": {"type": "string", "pattern": "^y$"}},
            {"in": "header", "name": "term", "schema": {"type": "string", "pattern": "^z$"}}]});
        let own = json!({"type": "object", "properties": {
            "post_type": {"type": "string"},
            "limit": {"type": "integer", "maximum": 50},
            "term": {"type": "string"}}});
        let schema = tightened(own, &operation);
        let p = &schema["properties"];
        assert_eq!(
            p["post_type"],
            json!({"type": "string", "pattern": "^x$", "maxLength": 64})
        );
        // The tool's own bound stands; only what it lacks is added.
        assert_eq!(
            p["limit"],
            json!({"type": "integer", "minimum": 1, "maximum": 50})
        );
        // A header is no argument; a parameter the tool lacks adds none.
        assert_eq!(p["term"], json!({"type": "string"}));
        assert!(p.get("unlisted").is_none());
        // No operation (the route's family unmounted): the tool's own.
        assert_eq!(tightened(search_schema(), &Value::Null), search_schema());
        // A schema without properties stays without.
        let none = json!({"type": "object", "additionalProperties": false});
        assert_eq!(tightened(none.clone(), &operation), none);
    }

    #[test]
    fn a_tools_route_is_found_whatever_its_parameters_are_named() {
        let document = json!({"paths": {
            "/api/things/{id}": {"get": {"operationId": "thing"}},
            "/api/things/{id}/parts": {"get": {"operationId": "parts"}},
            "/api/things/buy": {"post": {}}}});
        assert_eq!(
            operation_of(&document, "GET", "/api/things/{thing_id}")["operationId"],
            "thing"
        );
        assert_eq!(
            operation_of(&document, "GET", "/api/things/{x}/parts")["operationId"],
            "parts"
        );
        assert!(operation_of(&document, "GET", "/api/things").is_null());
        assert!(operation_of(&document, "GET", "/api/things/buy").is_null());
    }

    #[test]
    fn every_read_tool_reads_through_a_get_route() {
        for t in TOOLS {
            match t.read_route() {
                Some(route) if t.name == "search" => assert_eq!(route, "/api/search"),
                Some(route) => assert_eq!((t.method, route), ("GET", t.path)),
                None => assert_eq!(t.method, "POST", "{}", t.name),
            }
        }
    }
}
