//! MCP 2026-07-28, the stateless revision (SEP-2575), beside the
//! revisions of the `initialize` handshake.
//!
//! A request of this revision stands alone: no `initialize`, no session.
//! It carries its protocol version and the client's capabilities in
//! `params._meta`, and over HTTP mirrors the version, its method and the
//! name it acts on in headers (`MCP-Protocol-Version`, `Mcp-Method`,
//! `Mcp-Name`) that must agree with the body. Methods of the handshake
//! revisions it dropped (`initialize`, `ping`, `logging/setLevel`, the
//! resource subscriptions) are HTTP 404 with -32601; every result says its
//! `resultType`, names the server in `_meta`, and the cacheable ones carry
//! caching hints (SEP-2549). A message is of this revision when its header
//! names it, or its `_meta` carries a protocol version and no header names a
//! handshake revision ([`applies`]).

use crate::rpc::RpcFault;
use marketplace_guest::prelude::*;

/// The revisions of this kind spoken (newest first).
pub const VERSIONS: &[&str] = &["2026-07-28"];

/// The methods of this revision that this server serves; any other is
/// -32601 (HTTP 404). Without list-change notifications or resource
/// subscriptions to deliver (the capabilities say so), `subscriptions/listen`
/// is not served; nor is `completion/complete` (no completions capability).
pub const METHODS: &[&str] = &[
    "server/discover",
    "tools/list",
    "tools/call",
    "prompts/list",
    "prompts/get",
    "resources/list",
    "resources/read",
    "resources/templates/list",
];

const PROTOCOL_VERSION_KEY: &str = "io.modelcontextprotocol/protocolVersion";
const CLIENT_CAPABILITIES_KEY: &str = "io.modelcontextprotocol/clientCapabilities";
const SERVER_INFO_KEY: &str = "io.modelcontextprotocol/serverInfo";

/// A header that disagrees with the request's body, or appears twice.
pub const HEADER_MISMATCH: i64 = -32020;
/// A protocol revision this server does not speak.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// The headers that route a request; each may appear once.
const ROUTING_HEADERS: &[&str] = &["mcp-protocol-version", "mcp-method", "mcp-name"];

/// The methods whose `Mcp-Name` header mirrors a parameter, and which.
const NAMED: &[(&str, &str)] = &[
    ("tools/call", "name"),
    ("prompts/get", "name"),
    ("resources/read", "uri"),
];

/// Whether `msg` is a message of this revision: its `MCP-Protocol-Version`
/// header names one; or, without a header naming a handshake revision
/// (whose requests are that revision's, whatever their `_meta` holds), its
/// `params._meta` carries a protocol version (a client of a later
/// revision is told which are spoken, as the ladder of [`admit`] has it).
pub fn applies(req: &Request, msg: &Value) -> bool {
    match header(req, "mcp-protocol-version") {
        Some(v) if VERSIONS.contains(&v) => true,
        Some(v) if crate::methods::PROTOCOL_VERSIONS.contains(&v) => false,
        _ => named_version(msg).is_some(),
    }
}

/// The revision a message names in its `params._meta`, if it names one
/// (as it wrote it, or `2026-07-28`, the one that has the member, when it
/// is no string).
pub fn named_version(msg: &Value) -> Option<&str> {
    let named = msg["params"]["_meta"].get(PROTOCOL_VERSION_KEY)?;
    Some(named.as_str().unwrap_or(VERSIONS[0]))
}

/// The HTTP status of a JSON-RPC error of this revision (its transport's
/// table): the request's own faults (a resource not found among them, see
/// [`error`]) are 400, an unknown method 404, the rest 200 (an internal
/// error, the server's own).
pub fn status(code: i64) -> u16 {
    match code {
        -32700 | -32600 | -32602 | HEADER_MISMATCH | -32021 | UNSUPPORTED_PROTOCOL_VERSION => 400,
        -32601 => 404,
        _ => 200,
    }
}

/// A method's error as this revision has it: a resource not found is
/// -32602 with its `uri` in `data` (SEP-2164), where the handshake
/// revisions said -32002.
pub fn error(fault: RpcFault) -> RpcFault {
    match fault.code {
        -32002 => RpcFault {
            code: -32602,
            ..fault
        },
        _ => fault,
    }
}

/// -32022 for `requested`, with the revisions `supported` (of this kind,
/// or under the handshake every one spoken).
pub fn unsupported(requested: &str, supported: &[&str]) -> RpcFault {
    RpcFault {
        code: UNSUPPORTED_PROTOCOL_VERSION,
        message: format!(
            "unsupported protocol version {requested:?}; supported: {}",
            supported.join(", ")
        ),
        data: Some(json!({"supported": supported, "requested": requested})),
    }
}

fn mismatch(message: String) -> RpcFault {
    RpcFault {
        code: HEADER_MISMATCH,
        message,
        data: None,
    }
}

/// A notification of this revision (no id) is accepted only under a
/// version header this server speaks (the revision defines none a server
/// acts on: it is acknowledged and dropped).
pub fn notification_refused(req: &Request) -> Option<RpcFault> {
    let asked = header(req, "mcp-protocol-version").unwrap_or("");
    (!VERSIONS.contains(&asked)).then(|| unsupported(asked, VERSIONS))
}

/// Header `name` sent once at most (-32020 naming how often it came).
pub fn at_most_once(req: &Request, name: &str) -> Result<(), RpcFault> {
    match req.header_lines(name).count() {
        count @ 2.. => Err(mismatch(format!("the {name} header appears {count} times"))),
        _ => Ok(()),
    }
}

/// A request's envelope, checked in the revision's order (the first
/// failure answers): the routing headers once each (-32020);
/// `params._meta` with the protocol version and the client's capabilities
/// (-32602); the routing headers agreeing with the body (-32020); a
/// version this server speaks (-32022); capabilities that are an object
/// (-32602, as the request's schema has it).
pub fn admit(msg: &Value, method: &str, req: &Request) -> Result<(), RpcFault> {
    for name in ROUTING_HEADERS {
        at_most_once(req, name)?;
    }
    let params = &msg["params"];
    let Some(meta) = params.get("_meta").and_then(Value::as_object) else {
        return Err(RpcFault::invalid_params(&format!(
            "params._meta must be an object carrying {PROTOCOL_VERSION_KEY:?} and {CLIENT_CAPABILITIES_KEY:?} (MCP 2026-07-28: every request says its revision and the client's capabilities)"
        )));
    };
    let missing: Vec<&str> = [PROTOCOL_VERSION_KEY, CLIENT_CAPABILITIES_KEY]
        .into_iter()
        .filter(|k| !meta.contains_key(*k))
        .collect();
    if !missing.is_empty() {
        return Err(RpcFault::invalid_params(&format!(
            "params._meta lacks {}",
            missing.join(" and ")
        )));
    }
    let version = &meta[PROTOCOL_VERSION_KEY];
    // (An absent header never matches, whatever the body's version is.)
    let said = header(req, "mcp-protocol-version");
    if said.is_none() || said != version.as_str() {
        return Err(mismatch(format!(
            "the MCP-Protocol-Version header is not params._meta[{PROTOCOL_VERSION_KEY:?}] ({version})"
        )));
    }
    if header(req, "mcp-method") != Some(method) {
        return Err(mismatch(format!(
            "the Mcp-Method header is not the request's method ({method})"
        )));
    }
    if let Some((_, param)) = NAMED.iter().find(|(m, _)| *m == method) {
        let named = &params[param];
        if !named.is_null() {
            let said = header(req, "mcp-name").and_then(decode_header_value);
            if said.map(Value::String).as_ref() != Some(named) {
                return Err(mismatch(format!(
                    "the Mcp-Name header is not params.{param} ({named})"
                )));
            }
        }
    }
    match version.as_str() {
        None => Err(RpcFault::invalid_params(&format!(
            "params._meta[{PROTOCOL_VERSION_KEY:?}] must be a string"
        ))),
        Some(v) if !VERSIONS.contains(&v) => Err(unsupported(v, VERSIONS)),
        Some(_) if !meta[CLIENT_CAPABILITIES_KEY].is_object() => Err(RpcFault::invalid_params(
            &format!("params._meta[{CLIENT_CAPABILITIES_KEY:?}] must be an object"),
        )),
        Some(_) => Ok(()),
    }
}

/// A header's value without the whitespace around it (RFC 9110 5.5).
pub fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    req.header(name).map(|v| v.trim_matches([' ', '\t']))
}

/// A header value as sent: verbatim, or the UTF-8 text of a
/// `=?base64?...?=` value (how a client sends what a header cannot carry).
/// A malformed one (not canonical base64, not UTF-8) is none, so it never
/// matches.
fn decode_header_value(value: &str) -> Option<String> {
    use base64::Engine as _;
    let Some(payload) = value
        .strip_prefix("=?base64?")
        .and_then(|v| v.strip_suffix("?="))
    else {
        return Some(value.to_string());
    };
    let engine = &base64::engine::general_purpose::STANDARD;
    let bytes = engine.decode(payload).ok()?;
    // Only the encoder's own (canonical) form.
    if engine.encode(&bytes) != payload {
        return None;
    }
    String::from_utf8(bytes).ok()
}

/// A result of this revision: its `resultType`, the server named in its
/// `_meta`, and for a cacheable method the hints: fresh `fresh_ms`
/// milliseconds, `public` when `shared` (no answer of this server depends
/// on who asks, but without a `public_url` its absolute URLs are those of
/// the `Host` asked: then `private`).
pub fn complete(mut result: Value, fresh_ms: Option<u64>, shared: bool, version: &str) -> Value {
    if let Value::Object(map) = &mut result {
        map.entry("resultType").or_insert_with(|| json!("complete"));
        if let Some(ms) = fresh_ms {
            map.entry("ttlMs").or_insert_with(|| json!(ms));
            let scope = if shared { "public" } else { "private" };
            map.entry("cacheScope").or_insert_with(|| json!(scope));
        }
        let meta = map.entry("_meta").or_insert_with(|| json!({}));
        if !meta.is_object() {
            *meta = json!({});
        }
        meta[SERVER_INFO_KEY] = crate::methods::server_info(version);
    }
    result
}

/// `server/discover`: the revisions spoken, the capabilities, the
/// instructions.
pub fn discover() -> Value {
    json!({"supportedVersions": VERSIONS,
           "capabilities": crate::methods::capabilities(false),
           "instructions": crate::methods::INSTRUCTIONS})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(headers: &[(&str, &str)]) -> Request {
        Request(marketplace_guest::types::Request {
            method: "POST".into(),
            path: "/mcp".into(),
            route: "/mcp".into(),
            params: vec![],
            query: vec![],
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: vec![],
        })
    }

    fn meta() -> Value {
        json!({PROTOCOL_VERSION_KEY: "2026-07-28", CLIENT_CAPABILITIES_KEY: {}})
    }

    const HEADERS: &[(&str, &str)] = &[
        ("mcp-protocol-version", "2026-07-28"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "search"),
    ];

    fn code(msg: &Value, headers: &[(&str, &str)]) -> Option<i64> {
        let method = msg["method"].as_str().unwrap();
        admit(msg, method, &request(headers)).err().map(|f| f.code)
    }

    #[test]
    fn the_envelope_is_checked_in_the_revisions_order() {
        let call = |params: Value| json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": params});
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": meta()})), HEADERS),
            None
        );
        // No _meta, or a key of it missing: -32602, before the headers.
        assert_eq!(code(&call(json!({"name": "search"})), &[]), Some(-32602));
        let mut lacking = meta();
        lacking
            .as_object_mut()
            .unwrap()
            .remove(CLIENT_CAPABILITIES_KEY);
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": lacking})), HEADERS),
            Some(-32602)
        );
        // A header that disagrees, is missing or appears twice: -32020.
        let mut other = meta();
        other[PROTOCOL_VERSION_KEY] = json!("2099-01-01");
        assert_eq!(
            code(
                &call(json!({"name": "search", "_meta": other.clone()})),
                HEADERS
            ),
            Some(HEADER_MISMATCH)
        );
        assert_eq!(
            code(
                &call(json!({"name": "search", "_meta": meta()})),
                &HEADERS[..2]
            ),
            Some(HEADER_MISMATCH)
        );
        assert_eq!(
            code(
                &call(json!({"name": "search", "_meta": meta()})),
                &[HEADERS[0], ("mcp-method", "TOOLS/CALL"), HEADERS[2]]
            ),
            Some(HEADER_MISMATCH)
        );
        // (The host gives header names in lower case.)
        let twice = [HEADERS, &[("mcp-method", "tools/call")]].concat();
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": meta()})), &twice),
            Some(HEADER_MISMATCH)
        );
        // Whitespace around a value is no part of it; a base64 value is its text.
        let spaced = [HEADERS[0], HEADERS[1], ("mcp-name", "  search\t")];
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": meta()})), &spaced),
            None
        );
        let encoded = [HEADERS[0], HEADERS[1], ("mcp-name", "=?base64?c2VhcmNo?=")];
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": meta()})), &encoded),
            None
        );
        // Agreeing on a version not spoken: -32022.
        let later = [
            ("mcp-protocol-version", "2099-01-01"),
            HEADERS[1],
            HEADERS[2],
        ];
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": other})), &later),
            Some(UNSUPPORTED_PROTOCOL_VERSION)
        );
        // A name that is no string never matches; a version that is none
        // never matches an absent header.
        assert_eq!(
            code(&call(json!({"name": 5, "_meta": meta()})), &HEADERS[..2]),
            Some(HEADER_MISMATCH)
        );
        let mut null_version = meta();
        null_version[PROTOCOL_VERSION_KEY] = Value::Null;
        assert_eq!(
            code(
                &call(json!({"name": "search", "_meta": null_version})),
                &HEADERS[1..]
            ),
            Some(HEADER_MISMATCH)
        );
        // A routing header twice is refused before anything else.
        assert_eq!(
            code(&call(json!({"name": "search"})), &twice),
            Some(HEADER_MISMATCH)
        );
        // Capabilities that are no object: the request's schema (-32602).
        let mut odd = meta();
        odd[CLIENT_CAPABILITIES_KEY] = json!([]);
        assert_eq!(
            code(&call(json!({"name": "search", "_meta": odd})), HEADERS),
            Some(-32602)
        );
        // A method that names nothing needs no Mcp-Name.
        let list =
            json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {"_meta": meta()}});
        assert_eq!(
            code(&list, &[HEADERS[0], ("mcp-method", "tools/list")]),
            None
        );
    }

    #[test]
    fn a_message_is_of_this_revision_by_its_header_else_its_meta() {
        let with_meta = json!({"method": "tools/list", "params": {"_meta": meta()}});
        let bare = json!({"method": "tools/list", "params": {}});
        let of = |msg: &Value, version: &str| {
            applies(&request(&[("mcp-protocol-version", version)]), msg)
        };
        assert!(of(&bare, "2026-07-28"));
        assert!(
            of(&with_meta, "2099-01-01"),
            "a later revision is told which are spoken"
        );
        assert!(
            !of(&with_meta, "2025-11-25"),
            "a handshake revision's header decides"
        );
        assert!(!of(&bare, "2099-01-01"));
        assert!(applies(&request(&[]), &with_meta));
        assert!(!applies(&request(&[]), &bare));
    }

    #[test]
    fn header_values_decode_only_in_canonical_base64() {
        assert_eq!(decode_header_value("plain").as_deref(), Some("plain"));
        assert_eq!(decode_header_value("=?base64?w6k=?=").as_deref(), Some("é"));
        assert_eq!(decode_header_value("=?base64?w6k?="), None);
        assert_eq!(decode_header_value("=?base64?/w==?="), None);
    }

    #[test]
    fn results_say_their_type_server_and_freshness() {
        let r = complete(json!({"tools": []}), Some(0), true, "1.2.3");
        assert_eq!(r["resultType"], "complete");
        assert_eq!(r["ttlMs"], 0);
        assert_eq!(r["cacheScope"], "public");
        assert_eq!(r["_meta"][SERVER_INFO_KEY]["version"], "1.2.3");
        let r = complete(
            json!({"content": [], "_meta": {"marketplace/status": 200}}),
            None,
            true,
            "1",
        );
        assert!(r.get("ttlMs").is_none());
        assert_eq!(r["_meta"]["marketplace/status"], 200);
        assert_eq!(r["_meta"][SERVER_INFO_KEY]["name"], "marketplace");
        let r = complete(json!({"contents": [], "_meta": null}), Some(0), false, "1");
        assert_eq!(r["cacheScope"], "private");
        assert_eq!(r["_meta"][SERVER_INFO_KEY]["name"], "marketplace");
        assert_eq!(status(-32601), 404);
        assert_eq!(status(HEADER_MISMATCH), 400);
        assert_eq!(status(-32002), 200);
    }
}
