//! MCP resources (`resources/list`, `resources/templates/list`,
//! `resources/read`): what an agent may read into its context without a
//! tool call. Every resource is an absolute URL of this service (the base
//! of [`crate::origin::base`]), so a client can also fetch it over HTTP:
//! the API's OpenAPI document, the agent manifest, the A2A card and the fee
//! schedule; and, through templates, a post, a thread and a contract. Reads
//! of live data run through the host's dispatch, so they answer what the
//! HTTP route would.

use crate::{a2a, manifest, openapi, rpc::RpcFault, run::call};
use marketplace_guest::prelude::*;

/// A resource this service lists: its path under the base, name, title,
/// description, and whether it is read live (else only a load of
/// components changes it).
struct Fixed {
    path: &'static str,
    name: &'static str,
    title: &'static str,
    description: &'static str,
    live: bool,
}

const FIXED: &[Fixed] = &[
    Fixed {
        path: "/openapi.json",
        name: "openapi",
        title: "OpenAPI document",
        description: "The marketplace HTTP API (OpenAPI 3.1): every route, its parameters, bodies, answers, error codes, payments and signatures.",
        live: false,
    },
    Fixed {
        path: "/.well-known/agent.json",
        name: "agent-manifest",
        title: "Agent manifest",
        description: "What this service offers agents: capabilities, payment methods and where the OpenAPI document, the MCP tools and the A2A agent are.",
        live: false,
    },
    Fixed {
        path: "/.well-known/agent-card.json",
        name: "a2a-agent-card",
        title: "A2A agent card",
        description: "The A2A 1.0 card of the agent at /a2a and its skills.",
        live: false,
    },
    Fixed {
        path: "/api/fees",
        name: "fees",
        title: "Fee schedule",
        description: "What each paid action costs now, in webcash (read live).",
        live: true,
    },
];

/// A template: its path pattern with one `{variable}`, name, title,
/// description.
struct Template {
    prefix: &'static str,
    variable: &'static str,
    name: &'static str,
    title: &'static str,
    description: &'static str,
}

const TEMPLATES: &[Template] = &[
    Template {
        prefix: "/api/posts/",
        variable: "post_id",
        name: "post",
        title: "A post",
        description: "One post (a listing or a comment) with its listing check, by id (post_<ULID>).",
    },
    Template {
        prefix: "/api/thread/",
        variable: "post_id",
        name: "thread",
        title: "A thread",
        description: "A post and its comments, oldest first, by the post's id.",
    },
    Template {
        prefix: "/api/arbitration/contracts/",
        variable: "contract_id",
        name: "contract",
        title: "An arbitration contract",
        description: "One arbitration (escrow) contract by id (CTR_...).",
    },
];

/// `resources/list`: one page holds them all, so a cursor is never valid.
pub fn list(base: &str, params: &Value) -> Result<Value, RpcFault> {
    no_cursor(params)?;
    let resources: Vec<Value> = FIXED
        .iter()
        .map(|r| {
            json!({"uri": format!("{base}{}", r.path), "name": r.name, "title": r.title,
                   "description": r.description, "mimeType": "application/json"})
        })
        .collect();
    Ok(json!({ "resources": resources }))
}

/// `resources/templates/list` (RFC 6570 level 1 templates).
pub fn templates(base: &str, params: &Value) -> Result<Value, RpcFault> {
    no_cursor(params)?;
    let templates: Vec<Value> = TEMPLATES
        .iter()
        .map(|t| {
            json!({"uriTemplate": format!("{base}{}{{{}}}", t.prefix, t.variable), "name": t.name,
                   "title": t.title, "description": t.description, "mimeType": "application/json"})
        })
        .collect();
    Ok(json!({ "resourceTemplates": templates }))
}

/// `resources/read {uri}`: a listed resource, or a template's with its
/// variable filled in. An unknown resource (or a post or contract that
/// does not exist) is -32002, as MCP names it.
pub fn read(base: &str, version: &str, params: &Value) -> Result<Value, RpcFault> {
    let Some(uri) = params.get("uri").and_then(Value::as_str) else {
        return Err(RpcFault::invalid_params(
            "params.uri is required (a string)",
        ));
    };
    let not_found = || RpcFault {
        code: -32002,
        message: format!("resource not found: {uri}"),
        data: Some(json!({ "uri": uri })),
    };
    let Some(path) = uri.strip_prefix(base).filter(|p| p.starts_with('/')) else {
        return Err(not_found());
    };
    let text = match path {
        "/openapi.json" => openapi::document_text().map_err(RpcFault::internal)?,
        "/.well-known/agent.json" => manifest(version).to_string(),
        "/.well-known/agent-card.json" => a2a::card(base, version).to_string(),
        "/api/fees" => live(uri, path)?,
        _ => {
            let filled = TEMPLATES.iter().find_map(|t| {
                path.strip_prefix(t.prefix)
                    .filter(|v| is_segment(v))
                    .map(|_| path)
            });
            match filled {
                Some(path) => live(uri, path)?,
                None => return Err(not_found()),
            }
        }
    };
    Ok(json!({"contents": [{"uri": uri, "mimeType": "application/json", "text": text}]}))
}

/// Whether `uri` is one of the resources listed that only a load of
/// components changes (the fee schedule and the templates' are live).
pub fn is_document(base: &str, uri: &str) -> bool {
    uri.strip_prefix(base)
        .is_some_and(|path| FIXED.iter().any(|r| r.path == path && !r.live))
}

/// One path segment of a template's variable: not empty, no `/`, `?`, `#`
/// (an id is plain ASCII; the route checks it further).
fn is_segment(v: &str) -> bool {
    !v.is_empty() && v.len() <= 128 && !v.contains(['/', '?', '#', '%'])
}

/// The body of `GET path`, as the HTTP route answers it: 404 is -32002,
/// a 400 or 422 (the URI's fault) -32602 with the route's message, anything
/// else (a limit, a fault) -32603.
fn live(uri: &str, path: &str) -> Result<String, RpcFault> {
    let resp = call("GET", path, vec![], None);
    let body = String::from_utf8_lossy(&resp.body).into_owned();
    let message = || {
        serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["message"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("HTTP {}", resp.status))
    };
    match resp.status {
        200 => Ok(body),
        404 => Err(RpcFault {
            code: -32002,
            message: format!("resource not found: {uri}: {}", message()),
            data: Some(json!({ "uri": uri })),
        }),
        400 | 422 => Err(RpcFault::invalid_params(&format!("{uri}: {}", message()))),
        _ => Err(RpcFault {
            code: -32603,
            message: format!("reading {uri}: {}", message()),
            data: None,
        }),
    }
}

/// A list answered in one page: any cursor is one this server never gave.
pub fn no_cursor(params: &Value) -> Result<(), RpcFault> {
    match params.get("cursor") {
        None | Some(Value::Null) => Ok(()),
        Some(_) => Err(RpcFault::invalid_params(
            "params.cursor: this list has one page (no nextCursor was given)",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_uris_are_absolute_and_templates_have_one_variable() {
        let listed = list("http://h:1", &json!({})).unwrap();
        let uris: Vec<&str> = listed["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["uri"].as_str().unwrap())
            .collect();
        assert_eq!(uris[0], "http://h:1/openapi.json");
        assert!(uris.iter().all(|u| u.starts_with("http://h:1/")));
        let t = templates("http://h:1", &json!({})).unwrap();
        assert_eq!(
            t["resourceTemplates"][0]["uriTemplate"],
            "http://h:1/api/posts/{post_id}"
        );
        assert_eq!(
            list("http://h:1", &json!({"cursor": "x"}))
                .unwrap_err()
                .code,
            -32602
        );
    }

    #[test]
    fn reads_outside_the_base_or_the_list_are_not_found() {
        for uri in [
            "http://elsewhere/openapi.json",
            "http://h:1",
            "http://h:1/nope",
            "http://h:1/api/posts/",
            "http://h:1/api/posts/a/b",
            "http://h:1/api/posts/a%2Fb",
        ] {
            let fault = read("http://h:1", "1", &json!({ "uri": uri })).unwrap_err();
            assert_eq!(fault.code, -32002, "{uri}");
        }
        assert_eq!(
            read("http://h:1", "1", &json!({})).unwrap_err().code,
            -32602
        );
        assert_eq!(
            read("http://h:1", "1", &json!({"uri": 5}))
                .unwrap_err()
                .code,
            -32602
        );
    }
}
