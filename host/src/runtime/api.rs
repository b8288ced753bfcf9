//! What the loaded components serve, put together: a component's declared
//! `api` (routes with their OpenAPI operations, and schemas) is checked at
//! load, and the route table and the OpenAPI document are assembled from
//! the host's own routes and every loaded family's `api`.

use crate::runtime::routes::{self, Handler, Route, Table};
use serde_json::{Map, Value, json};

/// The host's part of the OpenAPI document: info, its own routes and the
/// schemas every family may reference (`Error`, `PaymentRequired`, ...).
pub const HOST_OPENAPI: &str = include_str!("../../openapi/host.json");

/// Largest OpenAPI operation of one route, and all schemas of one family.
const MAX_OPERATION: usize = 64 * 1024;
const MAX_SCHEMAS: usize = 512 * 1024;
/// Largest declared api of one family: its operations and schemas
/// together. Every family's goes into the OpenAPI document, and the `mcp`
/// component renders them all (`/docs`, `/api/docs/search`) within its
/// memory cap: the built-in families' whole document is about 140 kB.
const MAX_API: usize = 512 * 1024;
/// Deepest nesting of arrays and objects in one operation or schema: the
/// assembled document puts them three or four levels down, and it must
/// stay within what JSON and YAML readers take (serde_json's 128, which
/// the `mcp` component's `/docs` parses it with). No real schema nests
/// deeper than a few dozen.
const MAX_DEPTH: usize = 64;
/// Most values (objects, arrays, strings, numbers, booleans, nulls) of one
/// family's api, and the most bytes they may take as YAML in the
/// document ([`Rendered`]); and the same of the whole document, which a
/// mount or swap while the service runs may not take past them (a start
/// takes every configured family, each within its own caps, and says so
/// when the whole is over). The `mcp` component parses the whole document
/// and renders it (`/openapi.yaml`, `/docs`, `/api/docs/search`) within
/// its memory cap, and keeps what it rendered in its 8 MiB memo: it
/// rendered 130,000 values, or 2.9 MB of YAML 60 arrays deep, and failed
/// at a million values. The built-in families' document has about 6,600
/// values and 280 KiB by this estimate (220 kB as that component writes
/// it). Within the byte caps above, a family alone could break it for
/// every client: 480 KiB of small values 60 arrays deep render to a 32 MB
/// YAML, past the `mcp` component's memory cap (`/openapi.yaml` 503), and
/// 2 MiB of them unnested (four families at their byte caps) did the
/// same; ten to twenty families at their caps did it to `/docs`.
const MAX_API_VALUES: usize = 64 * 1024;
const MAX_API_YAML: usize = 640 << 10;
const MAX_DOCUMENT_VALUES: usize = 192 * 1024;
const MAX_DOCUMENT_YAML: usize = 3 << 20;

/// A route as the WIT `route` record gives it: method, pattern, writes,
/// paid action, OpenAPI operation (JSON text), own body limit.
pub type RouteDecl = (String, String, bool, Option<String>, String, Option<u32>);

/// One route a component declared.
#[derive(Debug, Clone, PartialEq)]
pub struct Declared {
    pub method: String,
    pub pattern: String,
    pub writes: bool,
    pub paid: Option<String>,
    /// The OpenAPI operation object.
    pub operation: Value,
    /// Its own body limit, if it has one.
    pub max_body: Option<usize>,
}

/// A component's declared api, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Api {
    pub routes: Vec<Declared>,
    pub schemas: Map<String, Value>,
}

impl Api {
    /// Check what a component declared (the WIT `api` record).
    pub fn check(routes: Vec<RouteDecl>, schemas: &str) -> Result<Api, String> {
        if routes.len() > routes::MAX_ROUTES {
            return Err(format!("at most {} routes per family", routes::MAX_ROUTES));
        }
        if schemas.len() > MAX_SCHEMAS {
            return Err(format!("schemas over {MAX_SCHEMAS} bytes"));
        }
        let mut out = Vec::with_capacity(routes.len());
        let mut total = schemas.len();
        for (method, pattern, writes, paid, openapi, max_body) in routes {
            let max_body = max_body.map(|n| n as usize);
            if max_body.is_some_and(|n| n > crate::store::MAX_VALUE_BYTES) {
                return Err(format!(
                    "{method} {pattern}: max-body over {} bytes",
                    crate::store::MAX_VALUE_BYTES
                ));
            }
            routes::check(&method, &pattern)?;
            if let Some(action) = &paid {
                paid_action(&method, writes, action)
                    .map_err(|why| format!("{method} {pattern}: {why}"))?;
            }
            if openapi.len() > MAX_OPERATION {
                return Err(format!(
                    "{method} {pattern}: OpenAPI operation over {MAX_OPERATION} bytes"
                ));
            }
            total += openapi.len();
            if total > MAX_API {
                return Err(format!(
                    "the OpenAPI operations and schemas together are over {MAX_API} bytes"
                ));
            }
            let mut operation = match parse(&openapi) {
                Ok(v @ Value::Object(_)) => v,
                _ if openapi.trim().is_empty() => Value::Object(Map::new()),
                Ok(_) => {
                    return Err(format!(
                        "{method} {pattern}: the OpenAPI operation is not a JSON object"
                    ));
                }
                Err(why) => return Err(format!("{method} {pattern}: the OpenAPI operation {why}")),
            };
            // Where clients send the operation's requests is this
            // service's origin: another server named here would have a
            // generated client send it the request's payment.
            if let Some(why) = names_a_server(&operation) {
                return Err(format!(
                    "{method} {pattern}: the OpenAPI operation {why}: every route is served at the service's own origin"
                ));
            }
            path_parameters(&pattern, &mut operation)
                .map_err(|why| format!("{method} {pattern}: {why}"))?;
            out.push(Declared {
                // A read method never gets a write transaction, whatever
                // the component declares.
                writes: writes && !routes::is_read(&method),
                method,
                pattern,
                paid,
                operation,
                max_body,
            });
        }
        let schemas = match parse(schemas) {
            Ok(Value::Object(m)) => m,
            _ if schemas.trim().is_empty() => Map::new(),
            Ok(_) => return Err("schemas must be a JSON object".into()),
            Err(why) => return Err(format!("the schemas {why}")),
        };
        // OpenAPI 3.1's rule for the keys of `components`: another name
        // makes `/openapi.json` invalid (and "" cannot be referred to).
        if let Some(name) = schemas.keys().find(|n| {
            n.is_empty()
                || !n
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        }) {
            return Err(format!(
                "schema name {:?} is not one of letters, digits, `.`, `_` and `-` (OpenAPI's rule for component names)",
                crate::logging::one_line(name, 64)
            ));
        }
        let api = Api {
            routes: out,
            schemas,
        };
        let rendered = Rendered::of_api(&api);
        if rendered.values > MAX_API_VALUES || rendered.yaml > MAX_API_YAML {
            return Err(rendered.too_large("its OpenAPI", MAX_API_VALUES, MAX_API_YAML));
        }
        Ok(api)
    }
}

/// Where an OpenAPI operation would name a server its clients send
/// requests to: its `servers`, a response link's `server`, or a callback
/// (requests described elsewhere, which a component does not make).
fn names_a_server(operation: &Value) -> Option<&'static str> {
    if operation.get("servers").is_some() {
        return Some("names `servers`");
    }
    if operation.get("callbacks").is_some() {
        return Some("declares `callbacks`");
    }
    let links = operation
        .get("responses")
        .and_then(Value::as_object)
        .into_iter()
        .flat_map(|r| r.values())
        .filter_map(|response| response.get("links")?.as_object())
        .flat_map(|links| links.values());
    for link in links {
        if link.get("server").is_some() {
            return Some("names a `server` in a response link");
        }
    }
    None
}

/// `text` as JSON nested at most [`MAX_DEPTH`] deep, or why not.
fn parse(text: &str) -> Result<Value, String> {
    let too_deep = || {
        format!(
            "nests arrays and objects more than {MAX_DEPTH} deep (the assembled OpenAPI document must stay readable)"
        )
    };
    // serde_json stops at 128 levels, valid JSON or not: that is too deep
    // too, not a syntax error.
    let value = serde_json::from_str::<Value>(text).map_err(|e| {
        match e.to_string().starts_with("recursion limit exceeded") {
            true => too_deep(),
            false => format!("is not valid JSON: {e}"),
        }
    })?;
    fn depth(v: &Value) -> usize {
        match v {
            Value::Array(a) => 1 + a.iter().map(depth).max().unwrap_or(0),
            Value::Object(m) => 1 + m.values().map(depth).max().unwrap_or(0),
            _ => 0,
        }
    }
    if depth(&value) > MAX_DEPTH {
        return Err(too_deep());
    }
    Ok(value)
}

/// Make `operation`'s path parameters those of `pattern` (OpenAPI: each
/// `{name}` of the path declared once, `in: path`, required): one the
/// pattern lacks, or declared twice or not required, is refused (it would
/// make the service's whole document invalid); one the operation leaves
/// out is added, a string (unless it refers to parameters elsewhere,
/// which may declare it).
fn path_parameters(pattern: &str, operation: &mut Value) -> Result<(), String> {
    let names: Vec<&str> = routes::param_names(pattern).collect();
    let Value::Object(op) = operation else {
        return Ok(());
    };
    let parameters = match op.get_mut("parameters") {
        None => None,
        Some(Value::Array(list)) => Some(list),
        Some(_) => return Err("`parameters` is not an array".into()),
    };
    let mut declared = Vec::new();
    let mut referred = false;
    for p in parameters.iter().flat_map(|list| list.iter()) {
        referred |= p.get("$ref").is_some();
        if p["in"] != "path" {
            continue;
        }
        let name = p["name"].as_str().unwrap_or_default();
        if !names.contains(&name) {
            return Err(format!(
                "the OpenAPI operation declares path parameter {name:?}, which the pattern does not have"
            ));
        }
        if declared.contains(&name) {
            return Err(format!(
                "the OpenAPI operation declares path parameter {name:?} twice"
            ));
        }
        if p["required"] != true {
            return Err(format!(
                "the OpenAPI operation's path parameter {name:?} must say `required: true`"
            ));
        }
        declared.push(name);
    }
    if referred {
        return Ok(());
    }
    let missing: Vec<Value> = names
        .iter()
        .filter(|n| !declared.contains(n))
        .map(|n| json!({"name": n, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    if !missing.is_empty() {
        let list = op
            .entry("parameters")
            .or_insert_with(|| Value::Array(Vec::new()));
        if let Value::Array(list) = list {
            list.extend(missing);
        }
    }
    Ok(())
}

/// The route table and the OpenAPI document (JSON text) in force. Both are
/// shared by the tables that follow while the declared apis stay the same
/// (a new version of a component with the same routes).
#[derive(Debug, Default)]
pub struct Served {
    pub table: std::sync::Arc<Table>,
    pub openapi: std::sync::Arc<str>,
    /// What the document costs to render.
    pub rendered: Rendered,
    /// One more at each table put in force (a mount, swap or unmount): what
    /// the components' memos are kept for (see [`crate::runtime::memo`]).
    pub generation: u64,
}

/// The names of the single-valued query parameters an OpenAPI operation
/// declares inline (`parameters` entries with `in: query`; not an array,
/// which a client may send as the parameter repeated).
fn declared_query(operation: &Value) -> Box<[String]> {
    operation["parameters"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["in"] == "query" && p["schema"]["type"] != "array")
        .filter_map(|p| p["name"].as_str().map(str::to_string))
        .collect()
}

/// The first `$ref` in `value` that does not resolve in `doc` (one outside
/// the document counts as not resolving).
fn dangling_ref<'v>(doc: &Value, value: &'v Value) -> Option<&'v str> {
    match value {
        Value::Object(m) => {
            if let Some(Value::String(target)) = m.get("$ref")
                && target
                    .strip_prefix('#')
                    .is_none_or(|pointer| doc.pointer(pointer).is_none())
            {
                return Some(target);
            }
            m.values().find_map(|v| dangling_ref(doc, v))
        }
        Value::Array(items) => items.iter().find_map(|v| dangling_ref(doc, v)),
        _ => None,
    }
}

/// Assemble the table and document from the host's routes and the loaded
/// families' apis. A route or schema conflict is an error; so, with the
/// document in force (`instead_of`), is a document past a cap
/// ([`MAX_DOCUMENT_VALUES`], [`MAX_DOCUMENT_YAML`]) and further past it
/// than that one (a change that makes an oversized document smaller is
/// taken).
pub fn assemble(
    host_routes: Vec<Route>,
    families: &[(&str, &Api)],
    instead_of: Option<Rendered>,
) -> Result<Served, String> {
    let mut doc: Value = serde_json::from_str(HOST_OPENAPI)
        .map_err(|e| format!("host OpenAPI document does not parse: {e}"))?;
    doc["info"]["version"] = Value::String(env!("CARGO_PKG_VERSION").into());
    let mut routes = host_routes;
    let mut schema_owner: std::collections::HashMap<String, String> = Default::default();
    for (family, api) in families {
        for d in &api.routes {
            routes.push(Route {
                method: d.method.clone(),
                pattern: d.pattern.clone(),
                handler: Handler::Family(family.to_string()),
                writes: d.writes,
                paid: d.paid.clone(),
                max_body: d.max_body,
                query: declared_query(&d.operation),
                metrics: Default::default(),
            });
        }
    }
    let table = Table::new(routes)?;
    // operationId -> who uses it: unique across the document (OpenAPI
    // requires it; `/docs` anchors and doc search links by it).
    let mut operation_owner: std::collections::HashMap<String, String> = doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .filter_map(Value::as_object)
        .flat_map(|item| item.values())
        .filter_map(|op| op["operationId"].as_str())
        .map(|id| (id.to_string(), "the host".to_string()))
        .collect();
    for (family, api) in families {
        let schemas = doc["components"]["schemas"]
            .as_object_mut()
            .ok_or("host OpenAPI document has no components.schemas")?;
        for (name, schema) in &api.schemas {
            match schemas.get(name) {
                Some(existing) if existing != schema => {
                    let other = schema_owner
                        .get(name)
                        .map_or("the host", String::as_str)
                        .to_string();
                    return Err(format!(
                        "schema conflict: {family} defines {name} differently from {other}"
                    ));
                }
                Some(_) => {}
                None => {
                    schemas.insert(name.clone(), schema.clone());
                    schema_owner.insert(name.clone(), family.to_string());
                }
            }
        }
        let paths = doc["paths"]
            .as_object_mut()
            .ok_or("host OpenAPI document has no paths")?;
        for d in &api.routes {
            if d.operation
                .get("operationId")
                .is_some_and(|id| id.as_str().is_none_or(str::is_empty))
            {
                return Err(format!(
                    "{family} names {} {} with an operationId that is not a non-empty string",
                    d.method, d.pattern
                ));
            }
            if let Some(id) = d.operation["operationId"].as_str()
                && let Some(owner) = operation_owner.insert(id.to_string(), family.to_string())
            {
                return Err(format!(
                    "operationId conflict: {family} names {} {} `{id}`, which {} already uses",
                    d.method,
                    d.pattern,
                    if owner == *family {
                        "it"
                    } else {
                        owner.as_str()
                    }
                ));
            }
            let mut op = d.operation.clone();
            if let Value::Object(m) = &mut op {
                m.insert("x-family".into(), Value::String(family.to_string()));
                // What the route declares, checked above, not what its
                // operation says.
                match &d.paid {
                    Some(paid) => m.insert("x-paid".into(), Value::String(paid.clone())),
                    None => m.remove("x-paid"),
                };
            }
            let item = paths
                .entry(d.pattern.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            item[d.method.to_ascii_lowercase()] = op;
        }
    }
    // Every reference of a family's operations and schemas resolves in the
    // document (a dangling one makes `/openapi.json` invalid for every
    // client generator).
    for (family, api) in families {
        let operations = api.routes.iter().map(|d| &d.operation);
        for value in operations.chain(api.schemas.values()) {
            if let Some(target) = dangling_ref(&doc, value) {
                return Err(format!(
                    "{family} refers to {target:?}, which the document does not define"
                ));
            }
        }
    }
    // What the host answers before any route runs, whatever the method and
    // whatever its component (or the host's file) documents: 413 to a body
    // declared over its limit and 408 to one that does not arrive in time
    // (`body_timeout_ms`); 400 to a path or query parameter, declared or
    // not, that is not UTF-8 once decoded (`server::http`); 415 to a body
    // under a content coding; and the seconds a 429 or 503 says to wait,
    // as a header a generated client exposes. After the route, a GET's
    // 200 meets its conditions (`server::conditional`: `If-None-Match: *`
    // matches an answer without a tag too): 304 and 412.
    let error = |description: &str| json!({"description": description, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    let paths = doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.iter_mut());
    for (pattern, item) in paths {
        let in_path = pattern.contains('{');
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for (method, op) in item.iter_mut() {
            let Some(op) = op.as_object_mut() else {
                continue;
            };
            let has_body = op.contains_key("requestBody");
            let paid = op.contains_key("x-paid");
            let in_query = op
                .get("parameters")
                .and_then(Value::as_array)
                .is_some_and(|ps| ps.iter().any(|p| p["in"] == "query"));
            if method == "get" {
                conditions_declared(op);
            }
            let Value::Object(responses) = op.entry("responses").or_insert_with(|| json!({}))
            else {
                continue;
            };
            for (status, description) in [
                (
                    "408",
                    "request_timeout: the body did not arrive within body_timeout_ms (nothing was kept)",
                ),
                ("413", "payload_too_large"),
            ] {
                responses
                    .entry(status)
                    .or_insert_with(|| error(description));
            }
            // A paid operation's refusal for want of payment, whatever
            // its component documents (its `x-paid` says it charges).
            if paid {
                responses.entry("402").or_insert_with(|| {
                    json!({"description": "payment required: the fee is in the body (and, base64, in the PAYMENT-REQUIRED header)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PaymentRequired"}}}})
                });
            }
            // (Any operation: the coding is refused before the route runs,
            // a body the operation does not read included.)
            responses.entry("415").or_insert_with(|| {
                error(if has_body {
                    "unsupported_media_type: the body came under a content coding (Content-Encoding other than identity); send it as it is"
                } else {
                    "unsupported_media_type: a body (this operation reads none) came under a content coding (Content-Encoding other than identity)"
                })
            });
            if method == "get" {
                responses.entry("304").or_insert_with(|| {
                    json!({"description": "not modified: If-None-Match names the answer's ETag, or `*` (no body)"})
                });
                responses.entry("412").or_insert_with(|| {
                    error("precondition_failed: If-Match names no ETag of the answer")
                });
            }
            // (Any operation: a query parameter it does not declare is
            // read too, and refused the same way.)
            responses.entry("400").or_insert_with(|| {
                error(if in_path || in_query {
                    "invalid_request: a parameter is not UTF-8 once percent-decoded"
                } else {
                    "invalid_request: a query parameter (this operation declares none) is not UTF-8 once percent-decoded"
                })
            });
            for status in ["429", "503"] {
                if let Some(Value::Object(response)) = responses.get_mut(status)
                    && !response.contains_key("$ref")
                    && let Value::Object(headers) =
                        response.entry("headers").or_insert_with(|| json!({}))
                {
                    headers.entry("Retry-After").or_insert_with(|| {
                        json!({"description": "seconds to wait before trying again", "schema": {"type": "integer", "minimum": 0}})
                    });
                }
            }
        }
    }
    // A write a browser says another site's page sent is refused before
    // it runs (`server::http`), whatever its route documents.
    for route in table.routes().filter(|r| r.writes && r.pattern != "/mcp") {
        let responses = doc["paths"]
            .get_mut(&route.pattern)
            .and_then(|item| item.get_mut(route.method.to_ascii_lowercase()))
            .and_then(|op| op.get_mut("responses"))
            .and_then(Value::as_object_mut);
        if let Some(responses) = responses {
            responses.entry("403").or_insert_with(|| {
                error("cross_site_request: a browser said a page of another site sent this write (Sec-Fetch-Site)")
            });
        }
    }
    let rendered = Rendered::of(&doc, 0, 0);
    if let Some(current) = instead_of
        && rendered.grows_past_the_caps(&current)
    {
        return Err(rendered.too_large(
            "the service's OpenAPI document with it",
            MAX_DOCUMENT_VALUES,
            MAX_DOCUMENT_YAML,
        ));
    }
    Ok(Served {
        table: table.into(),
        openapi: doc.to_string().into(),
        rendered,
        generation: 0,
    })
}

/// The request headers the host evaluates on any `GET`'s 200 (its 304
/// and 412), as parameters of `op` where its component did not declare
/// them: a generated client offers them, a fuzzer expects their answers.
fn conditions_declared(op: &mut serde_json::Map<String, Value>) {
    let Value::Array(params) = op.entry("parameters").or_insert_with(|| json!([])) else {
        return;
    };
    for (name, description) in [
        (
            "If-None-Match",
            "ETags of earlier answers, or `*`: 304 (no body) when one names this answer's ETag, compared weakly; `*` matches any answer, one without an ETag too",
        ),
        (
            "If-Match",
            "ETags, or `*`: 412 precondition_failed when none names this answer's ETag, compared strongly",
        ),
    ] {
        let declared = params.iter().any(|p| {
            p["in"] == "header"
                && p["name"]
                    .as_str()
                    .is_some_and(|n| n.eq_ignore_ascii_case(name))
        });
        if !declared {
            params.push(json!({"name": name, "in": "header", "required": false, "description": description, "schema": {"type": "string"}}));
        }
    }
}

/// What a route's `paid` may say: the name of a fee action (`post`,
/// `identity`...: the fee policy prices it when the route charges), on a
/// method that writes (a read cannot charge). It is published as the
/// operation's `x-paid`, which clients and agents read.
fn paid_action(method: &str, writes: bool, action: &str) -> Result<(), String> {
    if routes::is_read(method) {
        return Err(format!(
            "paid {action:?} on a read: a {method} cannot charge"
        ));
    }
    if !writes {
        return Err(format!(
            "paid {action:?} on a route declared without writes: a charge is a write (declare the route's writes)"
        ));
    }
    let name = action.len() <= 32
        && action
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase())
        && action
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !name {
        return Err(format!(
            "paid {:?} is not a fee action's name (1 to 32 of a-z, 0-9, _ and -, starting with a letter: post, identity, ... as the fee schedule names them)",
            crate::logging::one_line(action, 64)
        ));
    }
    Ok(())
}

/// What a JSON document costs the components that render it: its values,
/// and about how many bytes it takes as block-style YAML (each value a
/// line indented two spaces a level, its key or `- ` before it; a little
/// more than the `mcp` component's emitter writes, which leaves a
/// sequence in a mapping unindented).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Rendered {
    values: usize,
    yaml: usize,
}

impl Rendered {
    /// `v` as a value `depth` levels down, under a key of `key` bytes.
    fn of(v: &Value, depth: usize, key: usize) -> Rendered {
        let mut r = Rendered::default();
        r.add(v, depth, key);
        r
    }

    /// A family's api as the document holds it: each operation under its
    /// path and method, each schema under `components.schemas`.
    fn of_api(api: &Api) -> Rendered {
        let mut r = Rendered::default();
        for d in &api.routes {
            r.add(&d.operation, 3, d.method.len());
        }
        for (name, schema) in &api.schemas {
            r.add(schema, 3, quoted_len(name));
        }
        r
    }

    /// Whether a whole document is past a cap, and further past it than
    /// `current`.
    fn grows_past_the_caps(&self, current: &Rendered) -> bool {
        (self.values > MAX_DOCUMENT_VALUES && self.values > current.values)
            || (self.yaml > MAX_DOCUMENT_YAML && self.yaml > current.yaml)
    }

    /// Why a whole document this large may not render, if it may not.
    pub fn whole_problem(&self) -> Option<String> {
        (self.values > MAX_DOCUMENT_VALUES || self.yaml > MAX_DOCUMENT_YAML).then(|| {
            self.too_large(
                "the service's OpenAPI document",
                MAX_DOCUMENT_VALUES,
                MAX_DOCUMENT_YAML,
            )
        })
    }

    /// Why `what` is refused, against these caps.
    fn too_large(&self, what: &str, values: usize, yaml: usize) -> String {
        format!(
            "{what} would be too large to render ({} values, about {} KiB as YAML; at most {values} values and {} KiB, the built-in families' whole document about 6,600 and 280 KiB): declare fewer, smaller or shallower examples and schemas",
            self.values,
            self.yaml >> 10,
            yaml >> 10,
        )
    }

    fn add(&mut self, v: &Value, depth: usize, key: usize) {
        self.values += 1;
        // Indentation, the key and its `: ` (or `- `), the line's end.
        self.yaml += 2 * depth + key + 3;
        match v {
            Value::Object(m) => m
                .iter()
                .for_each(|(k, c)| self.add(c, depth + 1, quoted_len(k))),
            Value::Array(items) => items.iter().for_each(|c| self.add(c, depth + 1, 0)),
            Value::String(s) => self.yaml += quoted_len(s),
            // Numbers, booleans and null as JSON writes them.
            other => self.yaml += other.to_string().len(),
        }
    }
}

/// A string's length quoted (the YAML emitter quotes every string and
/// escapes as JSON does, near enough).
fn quoted_len(s: &str) -> usize {
    s.len()
        + 2
        + s.bytes()
            .filter(|b| matches!(b, b'"' | b'\\') || *b < 0x20)
            .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_operations_path_parameters_are_its_patterns() {
        let check = |pattern: &str, operation: Value| {
            Api::check(
                vec![(
                    "GET".into(),
                    pattern.into(),
                    false,
                    None,
                    operation.to_string(),
                    None,
                )],
                "{}",
            )
            .map(|api| api.routes[0].operation["parameters"].clone())
        };
        let id =
            json!({"name": "id", "in": "path", "required": true, "schema": {"type": "string"}});
        // Declared as the pattern has it: kept as it is.
        assert_eq!(
            check("/api/x/{id}", json!({"parameters": [id]})).unwrap(),
            json!([id])
        );
        // Left out: added (an operation may say nothing at all).
        assert_eq!(check("/api/x/{id}", json!({})).unwrap(), json!([id]));
        let term = json!({"name": "term", "in": "query"});
        assert_eq!(
            check("/api/x/{id}", json!({"parameters": [term]})).unwrap(),
            json!([term, id])
        );
        // A pattern without parameters gets none.
        assert_eq!(check("/api/x", json!({})).unwrap(), Value::Null);
        // One the pattern lacks, twice, or not required: refused.
        let other = json!({"name": "other", "in": "path", "required": true});
        let why = check("/api/x/{id}", json!({"parameters": [other]})).unwrap_err();
        assert!(
            why.contains("GET /api/x/{id}") && why.contains("\"other\""),
            "{why}"
        );
        assert!(check("/api/x/{id}", json!({"parameters": [id, id]})).is_err());
        let optional = json!({"name": "id", "in": "path"});
        assert!(check("/api/x/{id}", json!({"parameters": [optional]})).is_err());
        assert!(check("/api/x/{id}", json!({"parameters": {}})).is_err());
        // A reference may declare it: nothing is added.
        let referred = json!({"$ref": "#/components/parameters/Id"});
        assert_eq!(
            check("/api/x/{id}", json!({"parameters": [referred]})).unwrap(),
            json!([referred])
        );
    }

    /// Host routes as `runtime::native` declares them (that module is
    /// above this one): two of them, documented in the host's file.
    fn host_routes() -> Vec<Route> {
        [
            ("GET", "/api/health", "health"),
            ("GET", "/api/fees", "fees"),
        ]
        .into_iter()
        .map(|(method, pattern, name)| Route {
            method: method.into(),
            pattern: pattern.into(),
            handler: Handler::Host(name),
            writes: false,
            paid: None,
            max_body: None,
            query: Box::default(),
            metrics: Default::default(),
        })
        .collect()
    }

    fn api(routes: &[(&str, &str)], schemas: Value) -> Api {
        Api::check(
            routes
                .iter()
                .map(|(m, p)| {
                    (
                        m.to_string(),
                        p.to_string(),
                        *m != "GET",
                        None,
                        json!({"summary": p}).to_string(),
                        None,
                    )
                })
                .collect(),
            &schemas.to_string(),
        )
        .unwrap()
    }

    #[test]
    fn families_are_assembled_into_one_document() {
        let a = api(&[("GET", "/api/a/{id}")], json!({"A": {"type": "string"}}));
        let b = api(&[("POST", "/api/b/{x}")], json!({"A": {"type": "string"}}));
        let host = host_routes();
        let host_routes = host.len();
        let served = assemble(host, &[("a", &a), ("b", &b)], Some(Rendered::default())).unwrap();
        let doc: Value = serde_json::from_str(&served.openapi).unwrap();
        assert_eq!(doc["paths"]["/api/a/{id}"]["get"]["x-family"], "a");
        assert_eq!(doc["paths"]["/api/b/{x}"]["post"]["x-family"], "b");
        // 413 and 408 are documented even where a component's operation,
        // or the host's file, leaves them out.
        for (path, method) in [("/api/a/{id}", "get"), ("/api/fees", "get")] {
            let responses = &doc["paths"][path][method]["responses"];
            assert_eq!(
                responses["413"]["description"], "payload_too_large",
                "{path}"
            );
            let late = responses["408"]["description"].as_str().unwrap_or_default();
            assert!(late.starts_with("request_timeout"), "{path}");
        }
        assert!(doc["paths"]["/api/fees"]["get"].is_object());
        assert!(doc["components"]["schemas"]["Error"].is_object());
        assert_eq!(served.table.routes().count(), host_routes + 2);
        // A GET meets conditions (304, 412); any operation may meet a
        // content coding's 415, the host refusing it before the route
        // runs, and one without a body says it reads none.
        let get = &doc["paths"]["/api/a/{id}"]["get"]["responses"];
        assert!(get["304"].is_object() && get["412"].is_object(), "{get}");
        // ...and declares the headers they answer, once.
        let params = doc["paths"]["/api/a/{id}"]["get"]["parameters"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for name in ["If-None-Match", "If-Match"] {
            let n = params
                .iter()
                .filter(|p| p["name"] == name && p["in"] == "header")
                .count();
            assert_eq!(n, 1, "{name}: {params:?}");
        }
        let post = &doc["paths"]["/api/b/{x}"]["post"]["responses"];
        assert!(post["304"].is_null(), "{post}");
        for op in [get, post] {
            let said = op["415"]["description"].as_str().unwrap_or_default();
            assert!(said.contains("this operation reads none"), "{op}");
        }
        let with_body = Api::check(
            vec![(
                "POST".into(),
                "/api/c".into(),
                true,
                None,
                json!({"requestBody": {"content": {"application/json": {"schema": {}}}}})
                    .to_string(),
                None,
            )],
            "{}",
        )
        .unwrap();
        let served = assemble(vec![], &[("c", &with_body)], Some(Rendered::default())).unwrap();
        let doc: Value = serde_json::from_str(&served.openapi).unwrap();
        let code = &doc["paths"]["/api/c"]["post"]["responses"]["415"]["description"];
        assert!(
            code.as_str().is_some_and(
                |d| d.starts_with("unsupported_media_type") && !d.contains("reads none")
            ),
            "{doc}"
        );
    }

    #[test]
    fn a_paid_route_names_a_fee_action_on_a_write_and_documents_402() {
        let route = |method: &str, paid: &str| {
            Api::check(
                vec![(
                    method.into(),
                    "/api/c".into(),
                    true,
                    Some(paid.into()),
                    "{}".into(),
                    None,
                )],
                "{}",
            )
        };
        for (method, paid, why) in [
            ("GET", "post", "cannot charge"),
            ("POST", "bogus action", "not a fee action"),
            ("POST", "-1", "not a fee action"),
            ("POST", "", "not a fee action"),
        ] {
            let err = route(method, paid)
                .err()
                .unwrap_or_else(|| panic!("{paid:?} taken"));
            assert!(err.contains(why), "{err}");
        }
        let unwritten = Api::check(
            vec![(
                "POST".into(),
                "/api/c".into(),
                false,
                Some("post".into()),
                "{}".into(),
                None,
            )],
            "{}",
        );
        assert!(unwritten.is_err_and(|e| e.contains("without writes")));
        let api = route("POST", "post").unwrap();
        let served = assemble(vec![], &[("c", &api)], Some(Rendered::default())).unwrap();
        let doc: Value = serde_json::from_str(&served.openapi).unwrap();
        let op = &doc["paths"]["/api/c"]["post"];
        assert_eq!(op["x-paid"], "post");
        assert_eq!(
            op["responses"]["402"]["content"]["application/json"]["schema"]["$ref"],
            "#/components/schemas/PaymentRequired"
        );
        // An operation's own `x-paid` is not what the route declares.
        let claims = Api::check(
            vec![(
                "GET".into(),
                "/api/d".into(),
                false,
                None,
                json!({"x-paid": "bogus"}).to_string(),
                None,
            )],
            "{}",
        )
        .unwrap();
        let served = assemble(vec![], &[("d", &claims)], Some(Rendered::default())).unwrap();
        let doc: Value = serde_json::from_str(&served.openapi).unwrap();
        let op = &doc["paths"]["/api/d"]["get"];
        assert!(
            op["x-paid"].is_null() && op["responses"]["402"].is_null(),
            "{op}"
        );
    }

    #[test]
    fn schema_names_are_openapis_component_names() {
        let with =
            |name: &str| Api::check(vec![], &json!({ name: {"type": "string"} }).to_string());
        assert!(with("Hello.Note_v2-a").is_ok());
        for bad in ["", "a b", "a/../c", "<script>", "é"] {
            let err = with(bad).err().unwrap_or_else(|| panic!("{bad:?} taken"));
            assert!(err.contains("schema name"), "{err}");
        }
    }

    #[test]
    fn conflicts_are_refused() {
        let a = api(&[("GET", "/api/a/{id}")], json!({"A": {"type": "string"}}));
        let same_route = api(&[("GET", "/api/a/{other}")], json!({}));
        let err = assemble(
            vec![],
            &[("a", &a), ("b", &same_route)],
            Some(Rendered::default()),
        )
        .unwrap_err();
        assert!(err.contains("conflict"), "{err}");
        // Another method on a's path is a's alone too.
        let same_path = api(&[("DELETE", "/api/a/{x}")], json!({}));
        let err = assemble(
            vec![],
            &[("a", &a), ("b", &same_path)],
            Some(Rendered::default()),
        )
        .unwrap_err();
        assert!(err.contains("conflict"), "{err}");
        let host_route = api(&[("GET", "/api/fees")], json!({}));
        assert!(
            assemble(
                host_routes(),
                &[("b", &host_route)],
                Some(Rendered::default())
            )
            .is_err()
        );
        let other_schema = api(&[("GET", "/api/b")], json!({"A": {"type": "integer"}}));
        let err = assemble(
            vec![],
            &[("a", &a), ("b", &other_schema)],
            Some(Rendered::default()),
        )
        .unwrap_err();
        assert!(
            err.contains("schema conflict") && err.contains('A'),
            "{err}"
        );
    }

    #[test]
    fn references_resolve_and_operation_ids_are_names() {
        let route = |operation: Value| {
            Api::check(
                vec![(
                    "GET".into(),
                    "/api/r".into(),
                    false,
                    None,
                    operation.to_string(),
                    None,
                )],
                &json!({"Here": {"type": "string"}}).to_string(),
            )
            .unwrap()
        };
        let ok = route(
            json!({"operationId": "r", "responses": {"200": {"content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/Here"}}}}}}),
        );
        assert!(assemble(vec![], &[("r", &ok)], Some(Rendered::default())).is_ok());
        for operation in [
            json!({"responses": {"200": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Nowhere"}}}}}}),
            json!({"responses": {"200": {"$ref": "https://example.com/x.json"}}}),
            json!({"operationId": ""}),
            json!({"operationId": 5}),
        ] {
            let api = route(operation.clone());
            assert!(
                assemble(vec![], &[("r", &api)], Some(Rendered::default())).is_err(),
                "{operation}"
            );
        }
    }

    #[test]
    fn operation_ids_are_unique_across_the_document() {
        let with_id = |path: &str, id: &str| {
            Api::check(
                vec![(
                    "GET".into(),
                    path.into(),
                    false,
                    None,
                    json!({"operationId": id}).to_string(),
                    None,
                )],
                "{}",
            )
            .unwrap()
        };
        let a = with_id("/api/a", "search");
        let b = with_id("/api/b", "search");
        let err = assemble(vec![], &[("a", &a), ("b", &b)], Some(Rendered::default())).unwrap_err();
        assert!(
            err.contains("operationId conflict") && err.contains("`search`"),
            "{err}"
        );
        assert!(err.contains("which a already uses"), "{err}");
        let c = with_id("/api/c", "searchMore");
        assert!(assemble(vec![], &[("a", &a), ("c", &c)], Some(Rendered::default())).is_ok());
        // The host's own operations count too.
        let host_id = serde_json::from_str::<Value>(HOST_OPENAPI).unwrap()["paths"]
            .as_object()
            .unwrap()
            .values()
            .flat_map(|item| item.as_object().unwrap().values())
            .find_map(|op| op["operationId"].as_str().map(str::to_string))
            .unwrap();
        let h = with_id("/api/h", &host_id);
        let err = assemble(vec![], &[("h", &h)], Some(Rendered::default())).unwrap_err();
        assert!(err.contains("the host"), "{err}");
    }

    #[test]
    fn an_api_or_document_too_large_to_render_is_refused() {
        // What is counted: each value, its line's indentation, key and end.
        assert_eq!(
            Rendered::of(&json!({"a": [1, "x\"y"]}), 0, 0),
            Rendered {
                values: 4,
                yaml: 3 + (2 + 3 + 3) + (4 + 3 + 1) + (4 + 3 + 6)
            }
        );
        let padded = |name: &str, values: usize, depth: usize| {
            let mut example = Value::Array(vec![json!(0); values]);
            for _ in 1..depth {
                example = Value::Array(vec![example]);
            }
            let route = (
                "GET".into(),
                format!("/api/{name}"),
                false,
                None,
                "{}".into(),
                None,
            );
            Api::check(
                vec![route],
                &json!({name: {"example": example}}).to_string(),
            )
        };
        // One family: many small values, or fewer deep, within its byte
        // caps and past what it may declare.
        let e = padded("x", MAX_API_VALUES, 1).unwrap_err();
        assert!(
            e.contains("its OpenAPI would be too large to render"),
            "{e}"
        );
        let e = padded("x", 5_000, 60).unwrap_err();
        assert!(e.contains("KiB as YAML"), "{e}");
        padded("x", 40_000, 1).unwrap();
        padded("x", 4_000, 60).unwrap();
        // The whole document counts, whoever adds to it: five families each
        // within its caps go over, four do not.
        let big: Vec<(String, Api)> = (0..5)
            .map(|i| {
                (
                    format!("f{i}"),
                    padded(&format!("f{i}"), 45_000, 1).unwrap(),
                )
            })
            .collect();
        let families: Vec<(&str, &Api)> = big.iter().map(|(f, a)| (f.as_str(), a)).collect();
        assemble(host_routes(), &families[..4], Some(Rendered::default())).unwrap();
        let e = assemble(host_routes(), &families, Some(Rendered::default())).unwrap_err();
        assert!(e.contains("document with it would be too large"), "{e}");
        // Unless the caller takes them all (a start), or the document in
        // force is larger still (a change that makes it smaller).
        let whole = assemble(host_routes(), &families, None).unwrap();
        assert!(whole.rendered.whole_problem().is_some());
        assemble(host_routes(), &families, Some(whole.rendered)).unwrap();
        assert!(
            assemble(host_routes(), &families[..4], None)
                .unwrap()
                .rendered
                .whole_problem()
                .is_none()
        );
        // The whole document's YAML: six families of deep values, each
        // within its caps, go over it.
        let deep: Vec<(String, Api)> = (0..6)
            .map(|i| {
                (
                    format!("d{i}"),
                    padded(&format!("d{i}"), 4_000, 60).unwrap(),
                )
            })
            .collect();
        let families: Vec<(&str, &Api)> = deep.iter().map(|(f, a)| (f.as_str(), a)).collect();
        let e = assemble(host_routes(), &families, Some(Rendered::default())).unwrap_err();
        assert!(e.contains("KiB as YAML"), "{e}");
    }

    #[test]
    fn a_routes_declared_query_parameters_are_its_inline_query_entries() {
        let op = json!({"parameters": [
            {"name": "id", "in": "path", "required": true},
            {"name": "term", "in": "query"},
            {"$ref": "#/components/parameters/x"},
            {"name": "limit", "in": "query"},
            {"name": "tag", "in": "query", "schema": {"type": "array"}},
            {"name": "x-trace", "in": "header"},
        ]});
        assert_eq!(&*declared_query(&op), ["term", "limit"]);
        assert!(declared_query(&json!({})).is_empty());
    }

    #[test]
    fn declarations_are_checked() {
        let bad = |m: &str, p: &str, op: &str, schemas: &str| {
            Api::check(
                vec![(m.into(), p.into(), true, None, op.into(), None)],
                schemas,
            )
            .is_err()
        };
        assert!(bad("GET", "/api/x", "[1]", "{}"));
        assert!(bad("GET", "/api/x", "{}", "[]"));
        assert!(bad("TRACE", "/api/x", "{}", "{}"));
        assert!(!bad("GET", "/api/x", "", ""));
        // Nesting within what JSON readers take; no other server.
        let nested = |n: usize| format!("{}0{}", "{\"a\":".repeat(n), "}".repeat(n));
        assert!(!bad(
            "GET",
            "/api/x",
            &nested(MAX_DEPTH),
            &nested(MAX_DEPTH)
        ));
        let refusal = |op: String, schemas: String| {
            let route = ("GET".into(), "/api/x".into(), false, None, op, None);
            Api::check(vec![route], &schemas).unwrap_err()
        };
        let e = refusal("{}".into(), nested(MAX_DEPTH + 1));
        assert!(e.contains("more than 64 deep"), "{e}");
        // Past serde_json's own limit too: the same refusal, not a syntax
        // error of JSON that is valid.
        let e = refusal(nested(200), "{}".into());
        assert!(e.contains("more than 64 deep"), "{e}");
        assert!(!e.contains("not valid JSON"), "{e}");
        let servers = r#"{"servers": [{"url": "https://elsewhere.example"}]}"#;
        assert!(bad("POST", "/api/x", servers, "{}"));
        let link = r#"{"responses": {"200": {"description": "ok", "links": {"next": {"operationId": "x", "server": {"url": "https://elsewhere.example"}}}}}}"#;
        assert!(bad("POST", "/api/x", link, "{}"));
        assert!(bad("POST", "/api/x", r#"{"callbacks": {}}"#, "{}"));
        // A schema's member named `server` is no server.
        let member = r#"{"requestBody": {"content": {"application/json": {"schema": {"properties": {"server": {"type": "string"}, "servers": {"type": "array"}}}}}}}"#;
        assert!(!bad("POST", "/api/x", member, "{}"));
        // A GET or an OPTIONS never writes, whatever it declares; a POST
        // does what it declares.
        let api = Api::check(
            ["GET", "OPTIONS", "POST"]
                .iter()
                .map(|m| {
                    (
                        m.to_string(),
                        "/api/x".into(),
                        true,
                        None,
                        "{}".into(),
                        None,
                    )
                })
                .collect(),
            "{}",
        )
        .unwrap();
        let writes: Vec<bool> = api.routes.iter().map(|r| r.writes).collect();
        assert_eq!(writes, [false, false, true]);
        // Operations within their own limit, too large together (the mcp
        // component renders every family's).
        let description = "d".repeat(60 * 1024);
        let routes = |n: usize| -> Vec<RouteDecl> {
            (0..n)
                .map(|i| {
                    let op = json!({"description": description}).to_string();
                    ("GET".into(), format!("/api/x{i}"), false, None, op, None)
                })
                .collect()
        };
        assert!(Api::check(routes(8), "{}").is_ok());
        let e = Api::check(routes(9), "{}").unwrap_err();
        assert!(e.contains("together are over"), "{e}");
    }

    /// Every kind the host raises is one the served document admits, and
    /// the document names no other (a client validating health's answer
    /// against it must not see an unknown kind).
    #[test]
    fn the_openapi_document_lists_every_alert_kind() {
        use crate::alerts::Kind;
        let all = [
            Kind::WalDamaged,
            Kind::ServerKeyChanged,
            Kind::ArbiterKeyChanged,
            Kind::KeptUploadRefused,
            Kind::EscrowLeftBehind,
            Kind::DatabaseNewer,
            Kind::DiskFull,
        ];
        let doc: serde_json::Value = serde_json::from_str(HOST_OPENAPI).unwrap();
        let listed = doc["components"]["schemas"]["Health"]["properties"]["alerts"]["items"]
            ["properties"]["kind"]["enum"]
            .as_array()
            .expect("the document lists the alert kinds")
            .clone();
        let raised: Vec<serde_json::Value> = all
            .iter()
            .map(|k| serde_json::to_value(k).unwrap())
            .collect();
        assert_eq!(listed, raised);
        // A new kind is added to the list above (the match makes the
        // compiler ask).
        for k in all {
            match k {
                Kind::WalDamaged
                | Kind::ServerKeyChanged
                | Kind::ArbiterKeyChanged
                | Kind::KeptUploadRefused
                | Kind::EscrowLeftBehind
                | Kind::DatabaseNewer
                | Kind::DiskFull => {}
            }
        }
    }
}
