//! The routes and OpenAPI of an endpoint family.
//!
//! A family describes each route it serves as one [`Op`] (method, path,
//! operation id, tag, texts, fee, query parameters, body and answers) and
//! names the component schemas those operations reference. [`api`] turns
//! the table into the `api` record of the `describe-api` export: per route
//! its method, pattern, whether it writes, its fee action and its OpenAPI
//! 3.1 Operation Object; plus the schemas as one JSON object. The host
//! assembles `/openapi.json` from every loaded family and its own routes.
//!
//! The host defines the common schemas [`HOST_SCHEMAS`] (`Error`,
//! `PaymentRequired`, `Any`, `Raw`, `Success`, `StringList`); a family
//! references them without defining them. A schema two families both need
//! (`Post`, `SearchResults`) comes from one function here, so both emit the
//! same definition: the host refuses a name defined differently by two
//! families.
//!
//! ```ignore
//! use marketplace_guest::openapi::{Op, op, obj, r, t};
//! const OPS: &[Op] = &[Op {
//!     ok: (200, "Hello"),
//!     ..op("GET", "/api/hello", "hello", "hello", "Say hello", "Answers {\"hello\": \"world\"}.")
//! }];
//! fn api() -> marketplace_guest::types::Api {
//!     marketplace_guest::openapi::api(OPS, json!({"Hello": obj(&[("hello", t("string"))], &["hello"])}))
//! }
//! ```

use crate::endpoint::types;
use serde_json::{Map, Value, json};
use std::collections::BTreeSet;

/// One query parameter: name, JSON type, required, description. The schema
/// comes from [`query_schema`] (a few well-known names are narrower).
pub type Query = (&'static str, &'static str, bool, &'static str);

/// One operation (route) of a family.
#[derive(Clone, Copy)]
pub struct Op {
    /// Upper-case method: GET, POST, PUT, PATCH, DELETE or OPTIONS.
    pub method: &'static str,
    /// Path pattern with `{name}` segments (each becomes a required path
    /// parameter).
    pub path: &'static str,
    /// The operationId (also the anchor of the docs page).
    pub id: &'static str,
    pub tag: &'static str,
    pub summary: &'static str,
    pub description: &'static str,
    /// The fee when the route is paid: the fee action first, then any
    /// explanation, e.g. "post (comment when parent_id is set)". Adds the
    /// payment headers, a 402 answer and "Paid: ..." to the description.
    pub paid: Option<&'static str>,
    /// Whether a call gets a write transaction; `None` = every method but
    /// GET and OPTIONS. A POST that only reads says `Some(false)`; a GET
    /// or OPTIONS never writes (the host gives it no write transaction
    /// whatever it declares, and [`check`] refuses `Some(true)` on one).
    pub writes: Option<bool>,
    pub query: &'static [Query],
    /// Request body schema name in components (a required JSON body).
    pub body: Option<&'static str>,
    /// Success status and response schema name.
    pub ok: (u16, &'static str),
    /// Media type of the success answer; `None` = `application/json`, or
    /// `*/*` when the schema is `Raw`.
    pub media: Option<&'static str>,
    /// Error statuses this operation documents (besides 402 when paid, and
    /// 413, 500 and 503, which every operation may answer).
    pub errors: &'static [u16],
    /// A last touch to the rendered Operation Object (an extra answer, a
    /// narrower parameter).
    pub patch: Option<fn(&mut Value)>,
    /// The largest body this route takes when it differs from the host's
    /// limit (an upload); the host answers 413 above it.
    pub max_body: Option<u32>,
    /// The body is read with [`Body`](crate::Body), which takes a member
    /// that is `null` as an absent one: the document then lets every
    /// optional member of [`Op::body`] be null (see [`null_is_absent`]).
    /// `false` for a body read otherwise (JSON-RPC, execute).
    pub null_absent: bool,
}

/// An operation with defaults: not paid, writes unless GET, no query, no
/// body, `200` with `Any`, JSON, no documented errors.
pub const fn op(
    method: &'static str,
    path: &'static str,
    id: &'static str,
    tag: &'static str,
    summary: &'static str,
    description: &'static str,
) -> Op {
    Op {
        method,
        path,
        id,
        tag,
        summary,
        description,
        paid: None,
        writes: None,
        query: &[],
        body: None,
        ok: (200, "Any"),
        media: None,
        errors: &[],
        patch: None,
        max_body: None,
        null_absent: true,
    }
}

/// The usual page size parameter.
pub const LIMIT: Query = (
    "limit",
    "integer",
    false,
    "1 to 100, default 20 (also when empty); anything else is 400",
);

/// The schemas the host defines for every family (see the module doc).
pub const HOST_SCHEMAS: &[&str] = &[
    "Any",
    "Raw",
    "Error",
    "PaymentRequired",
    "Success",
    "StringList",
];

/// Schemas of the host's own document that a family references but never
/// defines: the payment request header's (`payment_parameters`) and a
/// payment rail's (`/api/fees`, `/api/info`).
pub const HOST_DOCUMENT_SCHEMAS: &[&str] = &["PaymentSignature", "PaymentRail"];

/// An object schema with these properties and required members.
pub fn obj(props: &[(&str, Value)], required: &[&str]) -> Value {
    let mut p = Map::new();
    for (k, v) in props {
        p.insert(k.to_string(), v.clone());
    }
    json!({"type": "object", "properties": p, "required": required})
}

/// A schema of one JSON type.
pub fn t(ty: &str) -> Value {
    json!({"type": ty})
}

/// A string with at least one non-space character.
pub fn nonblank(max: usize) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": max, "pattern": "\\S"})
}

/// A string matching a regular expression.
pub fn pattern(p: &str) -> Value {
    json!({"type": "string", "pattern": p})
}

/// A reference to a component schema.
pub fn r(name: &str) -> Value {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// An amount of cash: a decimal string.
pub fn amount() -> Value {
    json!({"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,8})?$", "description": "decimal, at most 8 decimals, shortest form"})
}

/// A positive amount of cash a client sends: at most 11 digits before the
/// point, as the cash strings' pattern says (the ledger's range ends at
/// 184,467,440,737.09551615, so 12 digits below that are taken too).
pub fn positive_amount() -> Value {
    json!({"type": "string", "pattern": "^[0-9]{1,11}(\\.[0-9]{1,8})?$", "not": {"pattern": "^0+(\\.0+)?$"}, "description": "positive decimal, at most 8 decimals and 11 digits before the point"})
}

/// A 64-hex Ed25519 public key.
pub fn fingerprint() -> Value {
    pattern("^[0-9a-fA-F]{64}$")
}

/// The members of a signed body: `signature` and the fresh form's
/// `timestamp`.
pub fn signed_fields() -> [(&'static str, Value); 2] {
    [
        (
            "signature",
            json!({"type": "string", "description": "hex Ed25519 signature; needed, but its absence (like the signer's) is 401 auth_required, checked after the body and a paid route's payment, so a paid body without it is answered 402 first"}),
        ),
        (
            "timestamp",
            json!({"type": ["integer", "string"], "minimum": 0, "maximum": u64::MAX, "pattern": u64_digits(), "description": "unix seconds: fresh form, signs {message}:{timestamp} (the number in decimal; a string of decimal digits, at most 2^64 - 1, is read as the number); more than 300 s from the server clock is 401 auth_expired"}),
        ),
    ]
}

/// A pattern of the decimal strings of a u64 (leading zeros allowed), as
/// [`marketplace_common::uint::parse`] reads them: up to 19 digits, or 20
/// digits at most `u64::MAX` (a digit below the maximum's after a prefix
/// of it, then any digits).
pub fn u64_digits() -> String {
    let max = u64::MAX.to_string();
    let mut alternatives = vec!["[0-9]{1,19}".to_string(), max.clone()];
    for (i, d) in max.bytes().enumerate() {
        if d > b'0' {
            let rest = max.len() - i - 1;
            alternatives.push(format!(
                "{}[0-{}][0-9]{{{rest}}}",
                &max[..i],
                (d - 1) as char
            ));
        }
    }
    format!("^0*({})$", alternatives.join("|"))
}

/// An object schema of a signed body: `props` plus [`signed_fields`].
pub fn with_signature(mut props: Vec<(&str, Value)>, required: &[&str]) -> Value {
    props.extend(signed_fields());
    obj(&props, required)
}

/// The `payment` member of a paid answer (what the charge took).
pub fn payment() -> Value {
    obj(
        &[
            ("action", t("string")),
            ("price", amount()),
            ("paid", amount()),
            ("change", json!({"type": ["string", "null"]})),
        ],
        &[],
    )
}

/// The `Post` schema: the public post document (timeline, search, mcp).
pub fn post() -> Value {
    obj(
        &[
            ("post_id", t("string")),
            ("parent_id", json!({"type": ["string", "null"]})),
            ("author_fingerprint", t("string")),
            ("author_nick", json!({"type": ["string", "null"]})),
            ("content", t("string")),
            ("post_type", t("string")),
            ("keywords", json!({"type": "array", "items": t("string")})),
            (
                "attachments",
                json!({"type": "array", "items": obj(&[("index", t("integer")), ("filename", t("string")), ("attachment_type", t("string")), ("size", t("integer")), ("sha256", json!({"type": "string", "description": "SHA-256 of the bytes (hex); absent only for an upload stored before uploads kept it"})), ("s3_key", json!({"type": "string", "description": "an attached upload (files/{id})"})), ("url", json!({"type": "string", "description": "an attached upload: where the identity family serves it"}))], &[])}),
            ),
            ("activity_metadata", t("object")),
            (
                "recipient_fingerprint",
                json!({"type": "string", "description": "private replies only"}),
            ),
            (
                "encrypted_payload",
                json!({"type": "string", "description": "private replies only: opaque, as sent"}),
            ),
            (
                "created_at",
                json!({"type": "string", "format": "date-time"}),
            ),
            ("comment_count", t("integer")),
            (
                "rating",
                obj(&[("up", t("integer")), ("down", t("integer"))], &[]),
            ),
            ("listing", listing()),
        ],
        &["post_id", "author_fingerprint", "content", "post_type"],
    )
}

/// A post's listing check (PROTOCOL 5), from its attachments' names.
fn listing() -> Value {
    let mut names: Vec<Value> = crate::posts::DESCRIPTORS.iter().map(|d| json!(d)).collect();
    names.push(Value::Null);
    let mut schema = obj(
        &[
            ("terms", t("boolean")),
            (
                "descriptor",
                json!({"type": ["string", "null"], "enum": names}),
            ),
            ("verified", t("boolean")),
        ],
        &[],
    );
    schema["description"] = json!(
        "From the attachments' names, compared ignoring ASCII case: `terms` when one is named terms.md; `descriptor` the first of service.md, product.md, skill.md and description.md that one is named, written in lower case whatever the attachment's own case (null: none); `verified` both."
    );
    schema
}

/// The `SearchResults` schema (GET /api/search, the MCP search tool).
pub fn search_results() -> Value {
    obj(
        &[
            ("term", t("string")),
            ("total", t("integer")),
            (
                "results",
                json!({"type": "array", "items": {"allOf": [r("Post"), obj(&[("score", t("number"))], &[])]}}),
            ),
        ],
        &["term", "total", "results"],
    )
}

/// The common schemas the host defines ([`HOST_SCHEMAS`]); the host's own
/// document carries the same definitions.
pub fn host_schemas() -> Value {
    json!({
        "Any": {},
        "Raw": {"type": "string"},
        "Error": obj(&[("code", t("string")), ("message", t("string")), ("details", json!({"type": "array", "items": obj(&[("field", t("string")), ("problem", t("string"))], &[])})),
            ("current_status", json!({"type": "string", "description": "409 invalid_transition, or conflict for a contract action's used signature (a retry of one that went through): the contract's status now"})),
            ("allowed_actions", json!({"type": "array", "items": t("string"), "description": "409 invalid_transition, or conflict for a contract action's used signature: the actions some party could take now"})),
            ("issued", json!({"type": "string", "description": "409 already_picked_up: the public form of the payout or refund handed out already"}))], &["code", "message"]),
        "PaymentRequired": obj(&[("code", json!({"enum": ["payment_required", "payment_invalid", "payment_spent", "payment_insufficient", "payment_rail_unavailable"]})), ("message", t("string")), ("required_amount", amount()),
            ("payment", obj(&[("action", t("string")), ("price", amount()), ("currency", json!({"const": "webcash"})), ("header", json!({"const": "X-Cash-Secret"})), ("supported_headers", json!({"type": "array", "items": t("string")})), ("format", t("string")), ("allowed_rails", json!({"type": "array", "items": t("string")})), ("fee_schedule_url", t("string"))], &["action", "price", "currency", "header", "supported_headers", "format", "allowed_rails", "fee_schedule_url"]))], &["code", "message", "required_amount", "payment"]),
        "Success": obj(&[("status", json!({"const": "success"}))], &["status"]),
        "StringList": {"type": "array", "items": t("string"), "maxItems": 100},
    })
}

/// The answer documented for an error status.
pub fn error_response(status: u16) -> Value {
    let (desc, schema) = match status {
        400 => (
            "invalid_request (with details: each field and its problem), or on a post's attachments invalid_attachment",
            "Error",
        ),
        401 => ("auth_required, auth_invalid or auth_expired", "Error"),
        402 => (
            "payment required: the fee is in the body",
            "PaymentRequired",
        ),
        403 => (
            "forbidden_party (the signer is not the party the operation needs), or on a delivery witness_mismatch",
            "Error",
        ),
        404 => ("not_found", "Error"),
        409 => (
            "conflict (a signature or id already used, a key or name taken), idempotency_conflict (an x402 payment-identifier given before with another request), or on a contract action invalid_transition (with current_status, allowed_actions) or, on a pickup, already_picked_up (with issued)",
            "Error",
        ),
        413 => ("payload_too_large", "Error"),
        422 => ("macro_error", "Error"),
        429 => (
            "rate_limited: past a cap on one identity's writes per window of time (a day, an hour); retry after Retry-After (seconds)",
            "Error",
        ),
        503 => (
            "plugin_unavailable, upstream_unavailable, disk_full (a writing request while the server's disk is nearly full: nothing was done, retry after Retry-After), or on a shared store storage_conflict (the request kept losing races with other hosts' and nothing of it was kept) or store_unavailable (the store could not be reached); retry after Retry-After",
            "Error",
        ),
        _ => ("internal", "Error"),
    };
    json!({"description": desc, "content": {"application/json": {"schema": r(schema)}}})
}

/// The schema of a query parameter: `limit` is 1 to 100, `term` and `q`
/// are non-blank (at most 1000 characters), the cursors `before` and
/// `after` are post ids, the filters `post_type` and `author` a post type
/// and a fingerprint (an empty cursor or filter: none); any other has its
/// plain type.
pub fn query_schema(name: &str, ty: &str) -> Value {
    match name {
        "limit" => json!({"type": "integer", "minimum": 1, "maximum": 100}),
        "term" | "q" => nonblank(1000),
        "before" | "after" => json!({"type": "string", "pattern": "^(post_[0-9A-Za-z]{1,59})?$"}),
        "post_type" => json!({"type": "string", "pattern": "^([A-Za-z0-9_-]{1,64})?$"}),
        "author" => json!({"type": "string", "pattern": "^([0-9A-Fa-f]{64})?$"}),
        _ => t(ty),
    }
}

/// A reference to a response header the host's document defines.
fn header_ref(name: &str) -> Value {
    json!({"$ref": format!("#/components/headers/{name}")})
}

/// The names of the `{name}` segments of a path pattern, in order.
pub fn path_params(path: &str) -> impl Iterator<Item = &str> {
    path.split('/')
        .filter_map(|seg| seg.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
}

/// Optional string request headers, with what each does, added to an
/// operation's parameters.
fn request_headers(op: &mut Value, headers: &[(&str, &str)]) {
    if !op["parameters"].is_array() {
        op["parameters"] = json!([]);
    }
    if let Some(params) = op["parameters"].as_array_mut() {
        params.extend(headers.iter().map(|(name, description)| {
            json!({"name": name, "in": "header", "required": false, "description": description, "schema": t("string")})
        }));
    }
}

/// The media of stored bytes served back: the type they were stored
/// with, any (`*/*`); `application/octet-stream` too, so that a generated
/// client reads them as a file rather than refusing the answer.
fn stored_content() -> Value {
    let bytes = json!({"schema": {"type": "string", "format": "binary"}});
    json!({"application/octet-stream": bytes, "*/*": bytes})
}

/// A route serving stored bytes (an attachment, an uploaded file): tagged
/// and served by ranges.
pub fn stored_bytes(op: &mut Value) {
    tagged(op);
    ranged(op);
}

/// A route whose answer carries an `ETag`: the host answers
/// `If-None-Match` (304 with no body) and `If-Match` (412) by it.
pub fn tagged(op: &mut Value) {
    request_headers(
        op,
        &[
            (
                "If-None-Match",
                "ETags of earlier answers (or `*`): 304 when one of them still holds, compared weakly",
            ),
            (
                "If-Match",
                "ETags (or `*`): 412 when none of them is the answer's, compared strongly",
            ),
        ],
    );
    op["responses"]["304"] = json!({"description": "not modified: an ETag given in If-None-Match still holds (no body)", "headers": {"ETag": {"schema": t("string")}}});
    op["responses"]["412"] = json!({"description": "precondition_failed: If-Match names no ETag of the answer", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
}

/// A route whose answer says `Accept-Ranges: bytes`, so that the host
/// answers a `Range` of it: the `Range` and `If-Range` headers, the 206
/// with its `Content-Range`, and the 416 past the end.
pub fn ranged(op: &mut Value) {
    request_headers(
        op,
        &[
            (
                "Range",
                "one byte range (`bytes=0-1023`, `bytes=1024-`, `bytes=-512`): 206 with those bytes; several ranges, another unit or an invalid one: the whole answer",
            ),
            (
                "If-Range",
                "the ETag of the answer a part is wanted of: when it no longer holds, the whole answer (200)",
            ),
        ],
    );
    let content_range = json!({"Content-Range": {"description": "`bytes first-last/length`", "schema": t("string")}});
    op["responses"]["206"] = json!({"description": "the range asked for (Range)", "headers": content_range, "content": stored_content()});
    op["responses"]["416"] = json!({"description": "range_not_satisfiable: the range starts past the end (`Content-Range: bytes */length`)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
}

/// The request headers that pay for a paid operation (PROTOCOL 3).
pub fn payment_parameters() -> Vec<Value> {
    vec![
        json!({"name": "X-Cash-Secret", "in": "header", "required": false, "description": "bearer cash secret e<amount>:secret:<hex> paying the fee (X-Webcash-Secret is an alias); an empty value is no payment (402 payment_required)", "schema": t("string")}),
        json!({"name": "X-Webcash-Secret", "in": "header", "required": false, "description": "alias of X-Cash-Secret (the same secret in both is one payment; different ones are 402 payment_invalid)", "schema": t("string")}),
        json!({"name": "PAYMENT-SIGNATURE", "in": "header", "required": false, "description": "x402 v2: base64 of the JSON X402PaymentPayload (its payload.secret pays exactly as X-Cash-Secret); an empty value is no payment (402 payment_required)",
             "schema": r("PaymentSignature")}),
        json!({"name": "X-Bitcoin-Secret", "in": "header", "required": false, "description": "bitcoin rail (disabled unless configured: 402 payment_rail_unavailable); an empty value is no payment (402 payment_required)", "schema": t("string")}),
    ]
}

/// The headers of a paid answer: the settlement of the payment, and the
/// change of an overpayment.
pub fn payment_answer_headers() -> Value {
    json!({"PAYMENT-RESPONSE": header_ref("PAYMENT-RESPONSE"),
           "X-Cash-Change": header_ref("X-Cash-Change")})
}

/// The OpenAPI 3.1 Operation Object of one operation.
pub fn operation(o: &Op) -> Value {
    let mut params = Vec::new();
    for name in path_params(o.path) {
        params.push(json!({"name": name, "in": "path", "required": true, "schema": t("string")}));
    }
    for (name, ty, required, desc) in o.query {
        params.push(json!({"name": name, "in": "query", "required": required, "description": desc, "schema": query_schema(name, ty)}));
    }
    if o.paid.is_some() {
        params.extend(payment_parameters());
    }
    let mut responses = Map::new();
    let content = match (o.media, o.ok.1) {
        (Some(m), _) => json!({m: {"schema": r(o.ok.1)}}),
        (None, "Raw") => stored_content(),
        (None, _) => json!({"application/json": {"schema": r(o.ok.1)}}),
    };
    let mut ok = json!({"description": "success", "content": content});
    if o.paid.is_some() {
        // The settlement of the payment, and the change of an overpayment.
        ok["headers"] = payment_answer_headers();
    }
    responses.insert(o.ok.0.to_string(), ok);
    let mut errs: Vec<u16> = o.errors.to_vec();
    if o.paid.is_some() && !errs.contains(&402) {
        errs.push(402);
    }
    // 413: a body over the route's limit (the host decides it before
    // reading, whatever the method), or a storage budget passed (a read
    // over `max_call_bytes`, writes over `max_request_write_bytes`).
    errs.extend([413, 500, 503]);
    for e in errs {
        responses
            .entry(e.to_string())
            .or_insert_with(|| error_response(e));
    }
    if let Some(Value::Object(refused)) = responses.get_mut("402") {
        refused.insert(
            "headers".into(),
            json!({"PAYMENT-REQUIRED": header_ref("PAYMENT-REQUIRED")}),
        );
    }
    let description = match o.paid {
        Some(a) => format!("{} Paid: {a}.", o.description),
        None => o.description.to_string(),
    };
    let mut operation = json!({
        "operationId": o.id, "tags": [o.tag], "summary": o.summary,
        "description": description,
        "parameters": params, "responses": responses,
    });
    if let Some(body) = o.body {
        operation["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": r(body)}}});
    }
    if let Some(patch) = o.patch {
        patch(&mut operation);
    }
    operation
}

/// Whether a call of the operation gets a write transaction.
pub fn writes(o: &Op) -> bool {
    o.writes
        .unwrap_or(!marketplace_common::url::read_only_method(o.method))
}

/// The fee action of a paid operation: the first word of [`Op::paid`].
pub fn fee_action(o: &Op) -> Option<String> {
    o.paid
        .and_then(|p| p.split_whitespace().next())
        .map(str::to_string)
}

/// One route of the `api` record.
pub fn route(o: &Op) -> types::Route {
    types::Route {
        method: o.method.to_string(),
        pattern: o.path.to_string(),
        writes: writes(o),
        paid: fee_action(o),
        openapi: operation(o).to_string(),
        max_body: o.max_body,
    }
}

/// The `api` record a family exports (`describe-api`): its operations and
/// the component schemas they reference (a JSON object, name -> schema).
pub fn api(ops: &[Op], mut schemas: Value) -> types::Api {
    for o in ops.iter().filter(|o| o.null_absent) {
        if let Some(schema) = o.body.and_then(|name| schemas.get_mut(name)) {
            null_is_absent(schema);
        }
    }
    types::Api {
        routes: ops.iter().map(route).collect(),
        schemas: schemas.to_string(),
    }
}

/// Let each optional member of an object schema also be `null` (what
/// [`Body`](crate::Body) reads as absent): a plain typed schema gains
/// `"null"` among its types; any other (a reference, an enum, a `not`) is
/// wrapped in `anyOf` with `{"type": "null"}`. Required members stay as
/// they are.
pub fn null_is_absent(schema: &mut Value) {
    let required: BTreeSet<String> = schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    let Some(props) = schema.get_mut("properties").and_then(Value::as_object_mut) else {
        return;
    };
    for (name, prop) in props.iter_mut() {
        if required.contains(name) || prop.as_object().is_some_and(|o| o.is_empty()) {
            continue;
        }
        let plain = ["$ref", "enum", "const", "not", "allOf", "anyOf", "oneOf"]
            .iter()
            .all(|k| prop.get(k).is_none());
        match prop.get_mut("type") {
            Some(Value::String(ty)) if plain => {
                if ty != "null" {
                    let ty = std::mem::take(ty);
                    prop["type"] = json!([ty, "null"]);
                }
            }
            Some(Value::Array(types)) if plain => {
                if !types.iter().any(|t| t == "null") {
                    types.push(json!("null"));
                }
            }
            _ => *prop = json!({"anyOf": [prop.take(), {"type": "null"}]}),
        }
    }
}

/// `(method, pattern, writes)` of each route of `api`, in order: what a
/// family's tests compare with the routes it means to serve.
pub fn routes_of(api: &types::Api) -> Vec<(&str, &str, bool)> {
    api.routes
        .iter()
        .map(|r| (r.method.as_str(), r.pattern.as_str(), r.writes))
        .collect()
}

/// Every schema name a value references (`#/components/schemas/NAME`).
pub fn refs(v: &Value, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("$ref", Value::String(s)) => {
                        if let Some(name) = s.strip_prefix("#/components/schemas/") {
                            out.insert(name.to_string());
                        }
                    }
                    _ => refs(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| refs(x, out)),
        _ => {}
    }
}

/// Check a family's table (for its unit tests): every schema referenced by
/// an operation or a schema is defined by the family or the host, every
/// schema the family defines is referenced, no name of
/// [`HOST_SCHEMAS`] is redefined differently nor one of
/// [`HOST_DOCUMENT_SCHEMAS`] at all, operation ids are unique and no route
/// is declared twice.
pub fn check(ops: &[Op], schemas: &Value) -> Result<(), String> {
    let defined = schemas
        .as_object()
        .ok_or("the schemas are not a JSON object")?;
    let host = host_schemas();
    let mut used = BTreeSet::new();
    let mut ids = BTreeSet::new();
    let mut routes = BTreeSet::new();
    for o in ops {
        if !ids.insert(o.id) {
            return Err(format!("operationId {} twice", o.id));
        }
        if !routes.insert((o.method, marketplace_common::url::pattern_shape(o.path))) {
            return Err(format!("{} {} twice", o.method, o.path));
        }
        if o.writes == Some(true) && marketplace_common::url::read_only_method(o.method) {
            return Err(format!(
                "{} {} declares writes, but a {} never writes: make it a POST",
                o.method, o.path, o.method
            ));
        }
        refs(&operation(o), &mut used);
    }
    refs(schemas, &mut used);
    for name in &used {
        let hosts = HOST_SCHEMAS.iter().chain(HOST_DOCUMENT_SCHEMAS);
        if !defined.contains_key(name) && !hosts.into_iter().any(|h| h == name) {
            return Err(format!("schema {name} is referenced but not defined"));
        }
    }
    for (name, schema) in defined {
        if HOST_DOCUMENT_SCHEMAS.contains(&name.as_str()) {
            return Err(format!("schema {name} is the host's document's"));
        }
        if !used.contains(name) {
            return Err(format!("schema {name} is defined but not referenced"));
        }
        if host.get(name).is_some_and(|h| h != schema) {
            return Err(format!("schema {name} differs from the host's"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn optional_body_members_may_be_null_and_required_ones_not() {
        let mut schema = with_signature(
            vec![
                ("name", nonblank(10)),
                ("about", t("string")),
                ("change", json!({"type": ["string", "null"]})),
                ("skills", r("StringList")),
                ("amount", positive_amount()),
                ("kind", json!({"const": "search"})),
                ("anything", json!({})),
            ],
            &["name"],
        );
        null_is_absent(&mut schema);
        let p = &schema["properties"];
        assert_eq!(p["name"], nonblank(10));
        assert_eq!(p["about"], json!({"type": ["string", "null"]}));
        assert_eq!(p["change"], json!({"type": ["string", "null"]}));
        assert_eq!(p["signature"]["type"], json!(["string", "null"]));
        assert_eq!(p["timestamp"]["type"], json!(["integer", "string", "null"]));
        for wrapped in ["skills", "amount", "kind"] {
            assert_eq!(p[wrapped]["anyOf"][1], json!({"type": "null"}), "{wrapped}");
        }
        assert_eq!(p["skills"]["anyOf"][0], r("StringList"));
        assert_eq!(p["anything"], json!({}));
        // Only the bodies of operations that read them with `Body`.
        let schemas =
            json!({"A": obj(&[("x", t("string"))], &[]), "B": obj(&[("x", t("string"))], &[])});
        let ops = [
            Op {
                body: Some("A"),
                ..op("POST", "/a", "a", "t", "s", "d")
            },
            Op {
                body: Some("B"),
                null_absent: false,
                ..op("POST", "/b", "b", "t", "s", "d")
            },
        ];
        let out: Value = serde_json::from_str(&api(&ops, schemas).schemas).unwrap();
        assert_eq!(
            out["A"]["properties"]["x"]["type"],
            json!(["string", "null"])
        );
        assert_eq!(out["B"]["properties"]["x"]["type"], "string");
    }

    const OPS: &[Op] = &[
        Op {
            query: &[LIMIT, ("author", "string", false, "author fingerprint")],
            ok: (200, "Things"),
            errors: &[400, 404],
            ..op(
                "GET",
                "/api/things/{thing_id}/parts/{index}",
                "getPart",
                "things",
                "One part",
                "A part of a thing.",
            )
        },
        Op {
            paid: Some("post (comment when parent_id is set)"),
            body: Some("NewThing"),
            ok: (201, "Things"),
            errors: &[400, 402],
            ..op(
                "POST",
                "/api/things",
                "createThing",
                "things",
                "Create",
                "Makes a thing.",
            )
        },
        Op {
            writes: Some(false),
            body: Some("NewThing"),
            ..op(
                "POST",
                "/api/things/search",
                "searchThings",
                "things",
                "Search",
                "Only reads.",
            )
        },
        Op {
            ok: (200, "Raw"),
            ..op("GET", "/api/raw", "raw", "things", "Raw", "")
        },
        Op {
            media: Some("text/html"),
            ok: (200, "Raw"),
            patch: Some(|o| o["responses"]["202"] = json!({"description": "accepted"})),
            ..op("GET", "/page", "page", "things", "A page", "")
        },
    ];

    fn schemas() -> Value {
        json!({
            "Things": obj(&[("things", json!({"type": "array", "items": r("Post")}))], &[]),
            "Post": post(),
            "NewThing": with_signature(vec![("name", nonblank(10))], &["name"]),
        })
    }

    #[test]
    fn path_segments_become_required_path_parameters() {
        let o = operation(&OPS[0]);
        let params = o["parameters"].as_array().unwrap();
        assert_eq!(
            params[0],
            json!({"name": "thing_id", "in": "path", "required": true, "schema": {"type": "string"}})
        );
        assert_eq!(params[1]["name"], "index");
        assert_eq!(params[1]["in"], "path");
        assert_eq!(params[1]["required"], true);
        assert_eq!(params[2]["name"], "limit");
        assert_eq!(params[2]["in"], "query");
        assert_eq!(params[2]["required"], false);
        assert_eq!(params[2]["schema"]["maximum"], 100);
        // The author filter: a fingerprint, or empty for none.
        assert_eq!(
            params[3]["schema"],
            json!({"type": "string", "pattern": "^([0-9A-Fa-f]{64})?$"})
        );
        assert_eq!(params.len(), 4);
        assert_eq!(o["operationId"], "getPart");
        assert_eq!(o["tags"], json!(["things"]));
        assert!(o.get("requestBody").is_none());
    }

    #[test]
    fn responses_list_success_and_errors() {
        let o = operation(&OPS[0]);
        let codes: Vec<&String> = o["responses"].as_object().unwrap().keys().collect();
        assert_eq!(codes, ["200", "400", "404", "413", "500", "503"]);
        assert_eq!(
            o["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Things"
        );
        assert_eq!(
            o["responses"]["404"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/Error"
        );
        let raw = operation(&OPS[3]);
        assert!(raw["responses"]["200"]["content"]["*/*"].is_object());
        assert!(raw["responses"]["200"]["content"]["application/octet-stream"].is_object());
        let page = operation(&OPS[4]);
        assert!(page["responses"]["200"]["content"]["text/html"].is_object());
        assert_eq!(page["responses"]["202"]["description"], "accepted");
    }

    #[test]
    fn paid_operations_document_payment() {
        let o = operation(&OPS[1]);
        assert_eq!(
            o["description"],
            "Makes a thing. Paid: post (comment when parent_id is set)."
        );
        let headers: Vec<&Value> = o["parameters"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["in"] == "header")
            .map(|p| &p["name"])
            .collect();
        assert_eq!(
            headers,
            [
                "X-Cash-Secret",
                "X-Webcash-Secret",
                "PAYMENT-SIGNATURE",
                "X-Bitcoin-Secret"
            ]
        );
        assert_eq!(
            o["responses"]["402"]["headers"]["PAYMENT-REQUIRED"]["$ref"],
            "#/components/headers/PAYMENT-REQUIRED"
        );
        assert_eq!(
            o["responses"]["402"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/PaymentRequired"
        );
        assert!(o["responses"]["413"].is_object());
        assert_eq!(
            o["requestBody"],
            json!({"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/NewThing"}}}})
        );
    }

    #[test]
    fn routes_say_whether_they_write_and_what_they_charge() {
        let api = api(OPS, schemas());
        let by_path = |p: &str| api.routes.iter().find(|r| r.pattern == p).unwrap();
        let get = by_path("/api/things/{thing_id}/parts/{index}");
        assert_eq!(get.method, "GET");
        assert!(!get.writes);
        assert_eq!(get.paid, None);
        let create = by_path("/api/things");
        assert!(create.writes);
        assert_eq!(create.paid.as_deref(), Some("post"));
        let search = by_path("/api/things/search");
        assert_eq!(search.method, "POST");
        assert!(!search.writes, "a read-only POST says writes = false");
        let operation: Value = serde_json::from_str(&create.openapi).unwrap();
        assert_eq!(operation["operationId"], "createThing");
        let schemas: Value = serde_json::from_str(&api.schemas).unwrap();
        assert_eq!(schemas["Post"], post());
    }

    #[test]
    fn check_finds_undefined_unused_and_duplicate() {
        assert_eq!(check(OPS, &schemas()), Ok(()));
        let mut missing = schemas();
        missing.as_object_mut().unwrap().remove("Post");
        assert!(check(OPS, &missing).unwrap_err().contains("Post"));
        let mut extra = schemas();
        extra["Unused"] = json!({});
        assert!(check(OPS, &extra).unwrap_err().contains("Unused"));
        let mut wrong = schemas();
        wrong["Error"] = json!({"type": "string"});
        assert!(check(OPS, &wrong).unwrap_err().contains("Error"));
        let twice = [OPS[0], OPS[0]];
        assert!(check(&twice, &schemas()).is_err());
        let same_shape = [
            OPS[0],
            op("GET", "/api/things/{x}/parts/{y}", "other", "t", "", ""),
        ];
        assert!(check(&same_shape, &schemas()).is_err());
        // A GET never writes: declaring it is a mistake to be told of.
        let get_writes = [Op {
            writes: Some(true),
            ..op("GET", "/api/things/{x}/touch", "touch", "t", "", "")
        }];
        let why = check(&get_writes, &schemas()).unwrap_err();
        assert!(why.contains("make it a POST"), "{why}");
        let post_reads: Vec<Op> = OPS
            .iter()
            .map(|o| Op {
                writes: Some(false),
                ..*o
            })
            .collect();
        assert_eq!(check(&post_reads, &schemas()), Ok(()));
    }

    #[test]
    fn shared_schemas_are_stable_text() {
        // Two families calling the same function emit the same text.
        assert_eq!(post().to_string(), post().to_string());
        assert!(
            search_results()
                .to_string()
                .contains("#/components/schemas/Post")
        );
        let host = host_schemas();
        for name in HOST_SCHEMAS {
            assert!(host.get(*name).is_some(), "{name}");
        }
    }
}
