//! Where the service is reached from: its public base URL (absolute links in
//! the A2A card and answers) and the `Origin` rule of `POST /mcp`.
//!
//! Operator settings (`[settings.mcp]`):
//! - `public_url`: the base URL clients use, e.g. `https://market.example`
//!   (else `http://` + the request's `Host`);
//! - `allowed_origins`: comma-separated browser origins allowed to call
//!   `POST /mcp`, e.g. `https://a.example,https://b.example`;
//! - `unsigned_macros` (read in `lib.rs`): how many of the 1,000 macros
//!   may have no owner (default 500);
//! - `macros_per_owner` (read in `lib.rs`): how many one identity may own
//!   (default 50).

use marketplace_guest::Setting;
use marketplace_guest::endpoint_bindings::marketplace::plugin::settings;
use marketplace_guest::prelude::*;

/// The settings this family reads (a load checks them).
pub const SETTINGS: &[Setting] = &[
    Setting {
        key: "public_url",
        check: |v| {
            if v.trim().is_empty() || normalize_base(v.trim()).is_some() {
                Ok(())
            } else {
                Err("an http(s) URL, e.g. https://market.example".into())
            }
        },
    },
    Setting {
        key: "allowed_origins",
        check: |v| {
            let bad = v
                .split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .find(|o| !is_origin(o));
            match bad {
                None => Ok(()),
                Some(o) => Err(format!(
                    "a comma-separated list of origins, each http(s)://host[:port] (not {o:?})"
                )),
            }
        },
    },
    Setting {
        key: "unsigned_macros",
        check: |v| crate::macros::macro_cap_of(v).map(drop),
    },
    Setting {
        key: "macros_per_owner",
        check: |v| crate::macros::macro_cap_of(v).map(drop),
    },
];

/// Whether an `allowed_origins` entry is an origin a browser may send:
/// `http(s)://` and a host, with a path of at most `/`.
fn is_origin(entry: &str) -> bool {
    let lower = entry.to_ascii_lowercase();
    let Some(rest) = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))
    else {
        return false;
    };
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    !authority.is_empty()
        && !authority.contains(['/', '?', '#', '@', '*'])
        && !authority.chars().any(char::is_whitespace)
}

/// An operator setting of this family, trimmed; `None` when unset or blank.
pub fn setting(key: &str) -> Option<String> {
    settings::get(key)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// The configured `public_url` without a trailing slash, when it is an
/// http(s) URL.
pub fn public_url() -> Option<String> {
    setting("public_url").and_then(|u| normalize_base(&u))
}

fn normalize_base(url: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    let rest = lower
        .strip_prefix("http://")
        .or_else(|| lower.strip_prefix("https://"))?;
    if rest.is_empty() || rest.starts_with('/') || url.chars().any(char::is_whitespace) {
        return None;
    }
    Some(url.trim_end_matches('/').to_string())
}

/// The request's `Host`, when it looks like `host[:port]`.
pub fn host(req: &Request) -> Option<&str> {
    req.header("host")
        .map(str::trim)
        .filter(|h| marketplace_common::url::plausible_host(h))
}

/// The base of absolute URLs in answers: `public_url`, else the request's
/// scheme (`https` when `X-Forwarded-Proto` says so, which the host passes
/// on only from a trusted proxy when `trusted_proxies` is set, or from the
/// host's own `public_url`) + its `Host` (`http://localhost` without one).
pub fn base(req: &Request) -> String {
    base_of(
        public_url().as_deref(),
        host(req),
        req.header("x-forwarded-proto"),
    )
}

fn base_of(public_url: Option<&str>, host: Option<&str>, forwarded_proto: Option<&str>) -> String {
    match (public_url, host) {
        (Some(u), _) => u.to_string(),
        (None, Some(h)) => marketplace_common::url::base_url(Some(h), forwarded_proto),
        (None, None) => "http://localhost".into(),
    }
}

/// The origin (`scheme://host[:port]`, lower case) of an absolute URL.
fn origin_of(url: &str) -> String {
    let lower = url.trim().to_ascii_lowercase();
    let (scheme, rest) = lower.split_once("://").unwrap_or(("", lower.as_str()));
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    format!("{scheme}://{authority}")
}

/// Whether a host (`name[:port]`) can only be this server's own name as the
/// browser sees it: an IP literal or `localhost`. A DNS rebinding attack
/// makes a browser send an attacker's DNS name as both `Host` and `Origin`,
/// so a DNS name equal to the Origin proves nothing by itself.
fn is_literal_or_localhost(host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    if host.starts_with('[') {
        // An IPv6 literal, with or without a port.
        return host
            .split(']')
            .next()
            .and_then(|h| h.strip_prefix('['))
            .is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host.as_str(),
    };
    name == "localhost"
        || name.ends_with(".localhost")
        || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// The `Origin` rule of `POST /mcp`. Allowed: no `Origin` (a non-browser
/// client); an origin listed in `allowed_origins`; the origin of
/// `public_url`; and `http://HOST` or `https://HOST` where HOST is the
/// request's `Host`, when HOST is an IP literal or `localhost` (a DNS name
/// must be configured, so a rebound name is refused).
pub fn allowed(
    origin: Option<&str>,
    host: Option<&str>,
    allowed_origins: &[String],
    public_url: Option<&str>,
) -> bool {
    let Some(origin) = origin else { return true };
    let origin = origin.trim().trim_end_matches('/').to_ascii_lowercase();
    if allowed_origins.iter().any(|a| origin_of(a) == origin) {
        return true;
    }
    if public_url.is_some_and(|u| origin_of(u) == origin) {
        return true;
    }
    match host {
        Some(h) if is_literal_or_localhost(h) => {
            let h = h.to_ascii_lowercase();
            origin == format!("http://{h}") || origin == format!("https://{h}")
        }
        _ => false,
    }
}

/// `allowed_origins` as a list.
pub fn allowed_origins() -> Vec<String> {
    setting("allowed_origins")
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|o| !o.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

/// The `Origin` check of a request: `Err(why)` when it is refused. Sent
/// twice, it is refused whatever the first says (an allowed origin before
/// another passed as the first alone).
pub fn check(req: &Request) -> Result<(), String> {
    if req.header_lines("origin").nth(1).is_some() {
        return Err("Origin was sent more than once: a browser sends one".into());
    }
    let origin = req.header("origin");
    if allowed(
        origin,
        host(req),
        &allowed_origins(),
        public_url().as_deref(),
    ) {
        Ok(())
    } else {
        Err(format!(
            "origin {:?} is not allowed: set [settings.mcp] allowed_origins (or public_url) to admit it",
            origin.unwrap_or_default()
        ))
    }
}

/// Request headers a browser page may send to `POST /mcp` (the preflight's
/// `Access-Control-Allow-Headers`): the MCP transport's and the payment
/// headers.
const ALLOW_HEADERS: &str = "Content-Type, Accept, MCP-Protocol-Version, Mcp-Method, Mcp-Name, MCP-Session-Id, Last-Event-ID, X-Request-Id, X-Cash-Secret, X-Webcash-Secret, X-Bitcoin-Secret, PAYMENT-SIGNATURE";

/// Answer headers a browser page may read (`Access-Control-Expose-Headers`):
/// the change and payment answers a paid tool call gets, the request id.
/// (No `PAYMENT-REQUIRED`: an unpaid call's is in its result, never a
/// header of `/mcp`.)
const EXPOSE_HEADERS: &str = "X-Cash-Change, PAYMENT-RESPONSE, X-Request-Id, Retry-After";

/// How long a browser may keep a preflight's answer, in seconds.
const MAX_AGE: &str = "600";

/// The `Origin` rule and the CORS headers it gives an answer of
/// `POST /mcp` (each answer depends on `Origin`, so each says `Vary:
/// Origin`): from an allowed browser origin, `Access-Control-Allow-Origin`
/// (that origin) and the headers a page may read; without `Origin` (not a
/// browser's cross-origin request), `Vary` alone. `Err(why)` when the
/// origin is refused.
pub fn cors(req: &Request) -> Result<Vec<(String, String)>, String> {
    check(req)?;
    let mut headers = vec![("vary".to_string(), "Origin".to_string())];
    if let Some(origin) = req.header("origin").map(str::trim) {
        headers.push(("access-control-allow-origin".into(), origin.to_string()));
        headers.push((
            "access-control-expose-headers".into(),
            EXPOSE_HEADERS.into(),
        ));
    }
    Ok(headers)
}

/// `OPTIONS /mcp`: the CORS preflight of a browser page. From an allowed
/// origin: 204 with what the page may send. From a refused origin: 403
/// with the same JSON-RPC error `POST /mcp` answers. Without `Origin` (not
/// a preflight): 204 with `Allow`.
pub fn preflight(req: &Request) -> Response {
    if let Err(refused) = check(req) {
        return refused_origin(&refused);
    }
    let mut headers: Vec<(String, String)> = vec![("allow".into(), "OPTIONS, POST".into())];
    match req.header("origin").map(str::trim) {
        None => headers.push(("vary".into(), "Origin".into())),
        Some(origin) => headers.extend([
            ("access-control-allow-origin".into(), origin.to_string()),
            ("access-control-allow-methods".into(), "POST".into()),
            ("access-control-allow-headers".into(), ALLOW_HEADERS.into()),
            ("access-control-max-age".into(), MAX_AGE.into()),
            (
                "vary".into(),
                "Origin, Access-Control-Request-Method, Access-Control-Request-Headers".into(),
            ),
        ]),
    }
    Response {
        status: 204,
        headers,
        body: vec![],
    }
}

/// The 403 of a refused browser origin, saying `why` ([`check`]; MCP
/// 2025-11-25: a JSON-RPC error without an id).
pub fn refused_origin(why: &str) -> Response {
    let mut answer = json(
        403,
        &json!({"jsonrpc": "2.0", "error": {"code": -32000, "message": why}}),
    );
    answer.headers.push(("vary".into(), "Origin".into()));
    answer
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowed_origins_are_origins() {
        let check = SETTINGS[1].check;
        assert!(check("https://a.example, http://b.example:8080/").is_ok());
        assert!(check("").is_ok());
        for bad in [
            "*",
            "a.example",
            "https://a.example/app",
            "https://",
            "ftp://a",
        ] {
            assert!(check(bad).is_err(), "{bad}");
        }
        let public_url = SETTINGS[0].check;
        assert!(public_url("https://market.example").is_ok());
        assert!(public_url("market.example").is_err());
    }

    fn list(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn origin_rule() {
        let none: &[String] = &[];
        // No Origin: a non-browser client.
        assert!(allowed(None, Some("evil.example"), none, None));
        // The request's own host, when it cannot be a rebound name.
        for host in [
            "127.0.0.1:8080",
            "localhost:8080",
            "localhost",
            "[::1]:9000",
            "10.0.0.5",
        ] {
            assert!(
                allowed(Some(&format!("http://{host}")), Some(host), none, None),
                "{host}"
            );
            assert!(
                allowed(Some(&format!("https://{host}")), Some(host), none, None),
                "{host}"
            );
        }
        assert!(allowed(
            Some("HTTP://LOCALHOST:8080/"),
            Some("localhost:8080"),
            none,
            None
        ));
        // DNS rebinding: the attacker's name as both Host and Origin.
        assert!(!allowed(
            Some("http://evil.example.com"),
            Some("evil.example.com"),
            none,
            None
        ));
        assert!(!allowed(
            Some("http://evil.example.com:8080"),
            Some("evil.example.com:8080"),
            none,
            None
        ));
        // Another port or host is another origin.
        assert!(!allowed(
            Some("http://127.0.0.1:3000"),
            Some("127.0.0.1:8080"),
            none,
            None
        ));
        assert!(!allowed(
            Some("http://evil.example"),
            Some("127.0.0.1:8080"),
            none,
            None
        ));
        assert!(!allowed(Some("null"), Some("127.0.0.1:8080"), none, None));
        assert!(!allowed(Some("http://127.0.0.1:8080"), None, none, None));
        // Configured origins and the public URL's origin.
        let conf = list(&["https://a.example", " https://b.example/ "]);
        assert!(allowed(Some("https://a.example"), Some("x"), &conf, None));
        assert!(allowed(Some("https://b.example"), Some("x"), &conf, None));
        assert!(!allowed(Some("https://c.example"), Some("x"), &conf, None));
        assert!(!allowed(Some("http://a.example"), Some("x"), &conf, None));
        assert!(allowed(
            Some("https://market.example"),
            Some("market.example"),
            none,
            Some("https://market.example/base")
        ));
        assert!(!allowed(
            Some("http://market.example"),
            Some("market.example"),
            none,
            Some("https://market.example")
        ));
    }

    #[test]
    fn base_urls() {
        assert_eq!(
            normalize_base("https://m.example/"),
            Some("https://m.example".into())
        );
        assert_eq!(
            normalize_base("http://m.example:8080/x/"),
            Some("http://m.example:8080/x".into())
        );
        assert_eq!(normalize_base("ftp://m.example"), None);
        assert_eq!(normalize_base("https://"), None);
        assert_eq!(
            base_of(Some("https://m.example"), Some("h:1"), Some("http")),
            "https://m.example"
        );
        assert_eq!(
            base_of(None, Some("127.0.0.1:8080"), None),
            "http://127.0.0.1:8080"
        );
        // Behind a proxy that terminates TLS.
        assert_eq!(
            base_of(None, Some("m.example"), Some("https")),
            "https://m.example"
        );
        assert_eq!(
            base_of(None, Some("m.example"), Some("gopher")),
            "http://m.example"
        );
        assert_eq!(base_of(None, None, Some("https")), "http://localhost");
        assert!(marketplace_common::url::plausible_host("[::1]:8080"));
        assert!(!marketplace_common::url::plausible_host("a b"));
        assert!(!marketplace_common::url::plausible_host("a/b"));
    }
}
