//! Running a tool or an endpoint: the requests this one dispatches through
//! the host (with the origin and payment headers they pass on), the
//! built-in tools' calls, and `execute`, which runs a tool, a macro or a
//! public `/api` endpoint.

use crate::macros::run_macro;
use crate::tools::{TOOLS, Tool, tool_schema};
use crate::{Mcp, schema};
use marketplace_common::url::canonical_path;
use marketplace_guest::prelude::*;
use marketplace_guest::{dispatch, index::search_term, types};

thread_local! {
    /// Headers passed on to the requests this one dispatches: the client
    /// request's `host` and `x-forwarded-proto`, so their absolute URLs
    /// (the x402 `resource.url` of a 402) name the service as the client
    /// reached it; and a tools/call's x402 payment (see [`x402`]).
    static FORWARDED: std::cell::RefCell<Vec<(String, String)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keep the request's origin headers for [`call`].
pub(crate) fn forward_origin(req: &Request) {
    let kept = ["host", "x-forwarded-proto"]
        .into_iter()
        .filter_map(|name| req.header(name).map(|v| (name.to_string(), v.to_string())))
        .collect();
    FORWARDED.with(|o| *o.borrow_mut() = kept);
}

/// Pass `name: value` on to the requests this one dispatches while the
/// returned guard lives (one message of a batch does not pay for the next).
pub(crate) fn forward(name: &str, value: String) -> Forwarding {
    FORWARDED.with(|o| {
        let mut o = o.borrow_mut();
        o.push((name.to_string(), value));
        Forwarding(o.len() - 1)
    })
}

/// While it lives, a header of [`forward`] is passed on.
pub(crate) struct Forwarding(usize);

impl Drop for Forwarding {
    fn drop(&mut self) {
        FORWARDED.with(|o| o.borrow_mut().truncate(self.0));
    }
}

/// Run a request through the host router.
pub(crate) fn call(
    method: &str,
    path: &str,
    query: Vec<(String, String)>,
    body: Option<&Value>,
) -> Response {
    dispatch::call(&outgoing(method, "", path, query, body))
}

/// A request this one makes: a JSON body, and the [`FORWARDED`] headers.
fn outgoing(
    method: &str,
    route: &str,
    path: &str,
    query: Vec<(String, String)>,
    body: Option<&Value>,
) -> types::Request {
    let mut headers = vec![("content-type".to_string(), "application/json".to_string())];
    FORWARDED.with(|o| headers.extend(o.borrow().iter().cloned()));
    types::Request {
        method: method.into(),
        route: route.into(),
        path: path.into(),
        params: vec![],
        query,
        headers,
        body: body.map(|b| b.to_string().into_bytes()).unwrap_or_default(),
    }
}

/// The route of this component's own that only reads and that `method
/// path` (the `/api/v1` alias folded) names, if it is one.
fn own_read(method: &str, path: &str) -> Option<&'static str> {
    let canonical = canonical_path(path);
    [
        ("GET", "/api/mcp"),
        ("GET", "/api/docs/search"),
        ("POST", "/api/mcp/tools/search"),
    ]
    .into_iter()
    .find(|(m, p)| *m == method && *p == canonical)
    .map(|(_, p)| p)
}

/// Say where a read's answer came from (`Content-Location`, its /api path,
/// the alias folded): a binary one becomes an embedded resource of this
/// URI in a tools/call result (see `tool_result`). A path that could not
/// be a header's value (control characters, not ASCII, over 8 KiB) is
/// left out; the answer stands.
fn locate(answer: &mut Response, path: &str) {
    let canonical = canonical_path(path);
    if canonical.len() <= 8192 && canonical.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        answer.headers.push(("content-location".into(), canonical));
    }
}

/// A scalar argument as query text. A whole number written as a float
/// (`2.0`, `1e20`) is an integer (JSON Schema), so it goes as its digits
/// (`2`, `100000000000000000000`), however large.
fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) if n.is_f64() => Some(match marketplace_guest::whole_number(n) {
            Some(i) => i.to_string(),
            // (Display writes a float's shortest digits, never an exponent.)
            None => n
                .as_f64()
                .filter(|f| f.fract() == 0.0)
                .map_or_else(|| n.to_string(), |f| format!("{f}")),
        }),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// The search tool: validated arguments, then the same search as GET /api/search.
pub(crate) fn run_search(args: &Value) -> Result<Response, ApiError> {
    let mut problems = Vec::new();
    let term = search_term(args["term"].as_str().unwrap_or(""));
    if let Err(problem) = &term {
        let problem = match &args["term"] {
            Value::Null => "is required (a string)",
            Value::String(_) => problem.rule(),
            _ => "must be a string",
        };
        problems.push(marketplace_guest::Detail {
            field: "term".into(),
            problem: problem.into(),
        });
    }
    let limit = match &args["limit"] {
        Value::Null => None,
        Value::Number(n)
            if n.as_f64()
                .is_some_and(|l| l.fract() == 0.0 && (1.0..=100.0).contains(&l)) =>
        {
            n.as_f64().map(|l| l as u64)
        }
        _ => {
            problems.push(marketplace_guest::Detail {
                field: "limit".into(),
                problem: "must be an integer from 1 to 100".into(),
            });
            None
        }
    };
    match &args["post_type"] {
        Value::Null => {}
        // Checked here as the search route checks it, so that a macro's
        // bad return is the macro's error (422), not a 400 of a request
        // its caller never made.
        Value::String(t) => {
            if marketplace_guest::posts::post_type_filter(Some(t)).is_err() {
                problems.push(marketplace_guest::Detail {
                    field: "post_type".into(),
                    problem: marketplace_guest::posts::POST_TYPE_RULE.into(),
                });
            }
        }
        _ => problems.push(marketplace_guest::Detail {
            field: "post_type".into(),
            problem: "must be a string".into(),
        }),
    }
    let term = match term {
        Ok(term) if problems.is_empty() => term,
        _ => return Err(ApiError::invalid_many(problems)),
    };
    let mut query = vec![("term".to_string(), term.to_string())];
    if let Some(l) = limit {
        query.push(("limit".into(), l.to_string()));
    }
    if let Some(t) = args["post_type"].as_str().filter(|t| !t.is_empty()) {
        query.push(("post_type".into(), t.to_string()));
    }
    Ok(call("GET", "/api/search", query, None))
}

/// Run a built-in tool: a read tool by filling its path template from the
/// arguments; `execute` as a POST of the arguments to its route would run,
/// its faults shaped by `wrap`; `define` (it writes, and the caller's route
/// only reads) as a request of its own to its route. Both take the headers
/// of `caller` (the JSON-RPC or execute request): payment, origin.
fn run_tool(tool: &Tool, args: &Value, wrap: Wrap, caller: &Request) -> Result<Response, ApiError> {
    if tool.name == "search" {
        // Its inputSchema first, as for every other tool (the same
        // `arguments.{name}` fields); then the route's own checks.
        schema::check_arguments(&tool_schema(tool), args)?;
        return run_search(args);
    }
    if tool.method != "GET" {
        let post = as_post(caller, tool.path, args);
        return Ok(if tool.name == "execute" {
            execute_with(&post, wrap)?
        } else {
            dispatch::call(&post.0)
        });
    }
    schema::check_arguments(&tool_schema(tool), args)?;
    let mut path = tool.path.to_string();
    let mut query = Vec::new();
    if let Some(map) = args.as_object() {
        for (k, v) in map {
            let Some(text) = text_of(v) else { continue };
            let slot = format!("{{{k}}}");
            if path.contains(&slot) {
                // A path parameter is one segment: a value that would add
                // segments, a query or an escape names nothing (PROTOCOL 1:
                // 404), and never reaches another route.
                if text.is_empty()
                    || text == "."
                    || text == ".."
                    || text.contains(['/', '\\', '?', '#', '%'])
                {
                    return Err(ApiError::not_found(format!("{k} {text:?}")));
                }
                path = path.replace(&slot, &text);
            } else {
                query.push((k.clone(), text));
            }
        }
    }
    if path.contains('{') {
        return Err(ApiError::invalid(
            "arguments",
            format!("{} needs {}", tool.name, tool.path),
        ));
    }
    let mut answer = call("GET", &path, query, None);
    locate(&mut answer, &path);
    Ok(answer)
}

/// `caller` as a POST of `args` (JSON) to `path`: the same headers, but
/// for the body's own.
fn as_post(caller: &Request, path: &str, args: &Value) -> Request {
    let mut req = caller.0.clone();
    req.method = "POST".into();
    req.route = path.into();
    req.path = path.into();
    req.params = vec![];
    req.query = vec![];
    req.headers.retain(|(k, _)| {
        !k.eq_ignore_ascii_case("content-type") && !k.eq_ignore_ascii_case("content-length")
    });
    req.headers
        .push(("content-type".into(), "application/json".into()));
    req.body = args.to_string().into_bytes();
    Request(req)
}

/// Run a tool by name: built-in or macro. `wrap` turns a tool's answer into
/// the caller's own response (the JSON-RPC server wraps it in a result); it
/// shapes the answer the host gives if a macro runs away.
pub(crate) fn run_named(
    name: &str,
    args: &Value,
    wrap: Wrap,
    caller: &Request,
) -> Result<Response, ApiError> {
    // An argument sent as null is absent, as a body's member is.
    let args = &schema::nulls_absent(args);
    if let Some(tool) = TOOLS.iter().find(|t| t.name == name) {
        return run_tool(tool, args, wrap, caller);
    }
    let Some(m) = kv::get::<Value>(&format!("macro/{name}"))? else {
        return Err(unknown_tool(name));
    };
    schema::check_arguments(&m["input_schema"], args)?;
    run_macro(
        name,
        m["typescript"].as_str().unwrap_or_default(),
        args,
        wrap,
    )
}

/// No tool, built-in or macro, is named `name`.
pub(crate) fn unknown_tool(name: &str) -> ApiError {
    ApiError::not_found(format!("tool {name}"))
}

/// How a caller shapes a tool's answer.
pub(crate) type Wrap<'a> = &'a dyn Fn(Response) -> Response;

pub(crate) fn execute(req: &Request) -> Result<Response, ApiError> {
    execute_with(req, &|r| r)
}

/// [`execute`], a macro's faults shaped by `wrap` (a JSON-RPC result when
/// called as a tool over `POST /mcp`).
fn execute_with(req: &Request, wrap: Wrap) -> Result<Response, ApiError> {
    let body = req.json_object()?;
    let given = |k: &str| body.get(k).is_some_and(|v| !v.is_null());
    if given("endpoint") && given("tool") {
        // Which one the caller meant is not for this server to guess.
        return Err(ApiError::invalid(
            "endpoint",
            "give tool (with arguments) or endpoint, not both",
        ));
    }
    if let Some(endpoint) = body.get("endpoint").filter(|v| !v.is_null()) {
        // Arguments meant for the endpoint would be dropped unseen: its
        // input is `query` and `body`. (An empty object says nothing.)
        let empty = |v: &Value| v.is_null() || v.as_object().is_some_and(|o| o.is_empty());
        if body.get("arguments").is_some_and(|a| !empty(a)) {
            return Err(ApiError::invalid(
                "arguments",
                "go with tool; an endpoint takes endpoint.query and endpoint.body",
            ));
        }
        let method = match endpoint.get("method") {
            None | Some(Value::Null) => "GET".to_string(),
            Some(Value::String(m)) => m.to_ascii_uppercase(),
            // (Not taken as a GET: the caller meant something else.)
            Some(_) => return Err(ApiError::invalid("endpoint.method", "must be GET or POST")),
        };
        // The reads and the paid or signed actions an agent makes; uploads
        // (PUT) go to their presigned URL.
        if method != "GET" && method != "POST" {
            return Err(ApiError::invalid("endpoint.method", "must be GET or POST"));
        }
        let path = match &endpoint["path"] {
            Value::String(path) => path.as_str(),
            Value::Null => return Err(ApiError::invalid("endpoint.path", "is required")),
            _ => return Err(ApiError::invalid("endpoint.path", "must be a string")),
        };
        // Public routes only (PROTOCOL 8), as the tool's schema says
        // (`^/api/`): another path is the arguments' 400, not a lookup.
        if !path.starts_with("/api/") {
            return Err(ApiError::invalid(
                "endpoint.path",
                "must be a public route's path, starting /api/",
            ));
        }
        let (path, inline_query) = path
            .split_once('?')
            .map(|(p, q)| (p, Some(q)))
            .unwrap_or((path, None));
        // Not this route: it could only run itself again (the host does not
        // dispatch a family's reads back to it; the others run here).
        if canonical_path(path) == "/api/mcp/tools/execute" {
            return Err(ApiError::invalid(
                "endpoint.path",
                "names execute itself: give the route it should run",
            ));
        }
        // Decoded as the HTTP server decodes a request's query (escapes of
        // bytes that are not UTF-8 are refused, as there).
        let mut query: Vec<(String, String)> = match inline_query
            .map(marketplace_common::url::parse_query)
            .transpose()
        {
            Ok(q) => q.unwrap_or_default(),
            Err(name) => {
                return Err(ApiError::invalid(
                    "endpoint.path",
                    format!("query parameter {name:?} is not UTF-8 once percent-decoded"),
                ));
            }
        };
        let from_path = query.len();
        let given = match endpoint.get("query") {
            None | Some(Value::Null) => None,
            Some(Value::Object(q)) => Some(q),
            Some(_) => {
                return Err(ApiError::invalid(
                    "endpoint.query",
                    "must be an object of parameter values",
                ));
            }
        };
        for (k, v) in given.into_iter().flatten() {
            match text_of(v) {
                Some(t) => query.push((k.clone(), t)),
                None if v.is_null() => {}
                None => {
                    return Err(ApiError::invalid(
                        &format!("endpoint.query.{k}"),
                        "must be a string, number or boolean",
                    ));
                }
            }
        }
        // A parameter given twice (in the path and in `query`, or twice in
        // the path) is the input's 400, as the host answers it over HTTP
        // for the parameters a route declares: which value was meant is
        // not for the server to guess.
        if let Some(i) = marketplace_common::url::first_repeated(&query, |_| true) {
            let name = &query[i].0;
            let field = if i < from_path {
                "endpoint.path".to_string()
            } else {
                format!("endpoint.query.{name}")
            };
            return Err(ApiError::invalid(
                &field,
                format!("gives the query parameter {name:?} more than once: give it once"),
            ));
        }
        let target_body = endpoint.get("body").filter(|b| !b.is_null());
        let mut answer = match own_read(&method, path) {
            // This component's own reads: the host runs a family's own
            // routes for it only where they write, so they run here.
            Some(route) => {
                let own = Request(outgoing(&method, route, path, query, target_body));
                // (Its handling starts by keeping its own origin headers:
                // this request's, kept whole meanwhile.)
                let kept = FORWARDED.with(|o| o.borrow().clone());
                let answer = Mcp::handle(&own).unwrap_or_else(Response::from);
                FORWARDED.with(|o| *o.borrow_mut() = kept);
                answer
            }
            None => call(&method, path, query, target_body),
        };
        if method == "GET" {
            locate(&mut answer, path);
        }
        return Ok(answer);
    }
    let tool = match body.get("tool") {
        Some(Value::String(t)) => t,
        Some(Value::Null) | None => {
            return Err(ApiError::invalid(
                "tool",
                "give tool (with arguments) or endpoint",
            ));
        }
        Some(_) => {
            return Err(ApiError::invalid(
                "tool",
                "must be a string (a tool's name)",
            ));
        }
    };
    // The endpoint form refuses execute itself; so does the tool form.
    if tool == "execute" {
        return Err(ApiError::invalid(
            "tool",
            "names execute itself: give the tool it should run",
        ));
    }
    // (null: no arguments, as over JSON-RPC.)
    let args = body
        .get("arguments")
        .filter(|a| !a.is_null())
        .cloned()
        .unwrap_or_else(|| json!({}));
    run_named(tool, &args, wrap, req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_floats_go_as_integers() {
        assert_eq!(text_of(&json!(2.0)).as_deref(), Some("2"));
        assert_eq!(text_of(&json!(-0.0)).as_deref(), Some("0"));
        assert_eq!(text_of(&json!(2.5)).as_deref(), Some("2.5"));
        assert_eq!(text_of(&json!(7)).as_deref(), Some("7"));
        // However large, as the digits of an integer.
        assert_eq!(
            text_of(&json!(1e20)).as_deref(),
            Some("100000000000000000000")
        );
        assert_eq!(
            text_of(&json!(1e300)),
            Some(format!("1{}", "0".repeat(300)))
        );
        assert_eq!(
            text_of(&json!(-1e23)).as_deref(),
            Some("-100000000000000000000000")
        );
        assert_eq!(text_of(&json!(1e-300)).as_deref(), Some("1e-300"));
        assert_eq!(text_of(&json!([1])), None);
    }
}
