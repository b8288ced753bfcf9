//! Checks of a request's head made before any route runs: its `Host`,
//! `Expect`, transfer and content codings, a browser's `Sec-Fetch-Site`,
//! and the answers to targets that name no resource (`OPTIONS *`,
//! `CONNECT`) and to `OPTIONS` on a path.

use crate::app::App;
use crate::reply::Reply;

/// What is wrong with a request's `Host`, if anything (RFC 9112 3.2: an
/// HTTP/1.1 request has one; no request has two, or one that is not a
/// host and optional port). Empty is allowed, as the RFC has clients send
/// for a target without an authority (answers' URLs are then relative);
/// else answers' absolute URLs are made from it.
pub(super) fn host_problem(
    version: hyper::Version,
    headers: &hyper::HeaderMap,
) -> Option<&'static str> {
    let mut hosts = headers.get_all(hyper::header::HOST).iter();
    let Some(host) = hosts.next() else {
        return (version == hyper::Version::HTTP_11)
            .then_some("is required in an HTTP/1.1 request");
    };
    if hosts.next().is_some() {
        return Some("must be given once");
    }
    let valid = host.is_empty() || marketplace_common::url::plausible_host_bytes(host.as_bytes());
    (!valid).then_some(NOT_A_HOST)
}

const NOT_A_HOST: &str = "must be a host name or address with an optional port";

/// What is wrong with the host a request names, if anything: its `Host`
/// ([`host_problem`]; an HTTP/1.1 request needs one even with an
/// absolute target, RFC 9112 3.2), then an absolute-form target's
/// (`GET http://host/path`, as sent to a proxy), which names the request's
/// host whatever `Host` says (RFC 9112 3.2.2): its authority takes
/// `Host`'s place, checked as a `Host` is (a user name in it is refused
/// there), and its scheme must be one this service is reached by.
pub(super) fn request_host_problem<B>(req: &mut hyper::Request<B>) -> Option<&'static str> {
    if let Some(problem) = host_problem(req.version(), req.headers()) {
        return Some(problem);
    }
    let scheme = req.uri().scheme_str()?;
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return Some("an absolute target must be an http or https URL");
    }
    let authority = req.uri().authority()?;
    let Ok(host) = hyper::header::HeaderValue::from_str(authority.as_str()) else {
        return Some(NOT_A_HOST);
    };
    req.headers_mut().insert(hyper::header::HOST, host);
    host_problem(req.version(), req.headers())
}

/// Whether every `Expect` the request names is `100-continue` (hyper
/// answers that one when the body is first read), the only expectation
/// HTTP defines (RFC 9110 10.1.1): any other is answered 417 at once,
/// not waited on for a body the client may hold back.
pub(super) fn expectations_met(headers: &hyper::HeaderMap) -> bool {
    lists_only(headers, hyper::header::EXPECT, "100-continue")
}

/// Whether every item of every `name` header (a comma-separated list) is
/// `only`, in any case (an empty item is none).
pub(super) fn lists_only(
    headers: &hyper::HeaderMap,
    name: hyper::header::HeaderName,
    only: &str,
) -> bool {
    headers.get_all(name).iter().all(|value| {
        value.to_str().is_ok_and(|v| {
            v.split(',')
                .map(str::trim)
                .all(|item| item.is_empty() || item.eq_ignore_ascii_case(only))
        })
    })
}

/// Whether the request's body, if it has one, is framed by `chunked`
/// alone (RFC 9112 6.1, 7): hyper reads any list of codings ending in
/// `chunked` as chunked, so `gzip, chunked` would reach a route as the
/// still-compressed bytes, and `chunked, chunked` (which RFC 9112 7
/// forbids) as once-chunked ones. Any other coding, or `chunked` twice,
/// is answered 501 at once ("a transfer coding it does not understand").
pub(super) fn transfer_codings_supported(headers: &hyper::HeaderMap) -> bool {
    let mut chunked = 0;
    for value in headers.get_all(hyper::header::TRANSFER_ENCODING) {
        let Ok(value) = value.to_str() else {
            return false;
        };
        for coding in value.split(',').map(str::trim).filter(|c| !c.is_empty()) {
            if !coding.eq_ignore_ascii_case("chunked") {
                return false;
            }
            chunked += 1;
        }
    }
    chunked <= 1
}

/// Whether the request's body, if it has one, comes without a content
/// coding (`Content-Encoding` absent or `identity`): no route decodes one,
/// so a gzip body would reach it as the compressed bytes (an outside probe
/// found a gzip-labelled `[]` answered as plain JSON). Any other is
/// answered 415 at once (RFC 9110 15.5.16).
pub(super) fn content_codings_supported(headers: &hyper::HeaderMap) -> bool {
    let has_body = headers.contains_key(hyper::header::TRANSFER_ENCODING)
        || declared_length(headers).is_some_and(|n| n > 0);
    !has_body || lists_only(headers, hyper::header::CONTENT_ENCODING, "identity")
}

/// A request's method as its answer names it: a HEAD's answer is its
/// GET's (RFC 9110 9.3.2), down to the message of a 404 or 405 and so to
/// the length it says.
pub(super) fn as_get(method: &str) -> &str {
    if method == "HEAD" { "GET" } else { method }
}

/// Whether a browser says a page of another site sent this request
/// (`Sec-Fetch-Site: cross-site` or `same-site`; RFC-less but sent by
/// every current browser, never by other clients). A write the service
/// takes from pages goes through `/mcp` and the origins it allows: any
/// other write from a page is a form or a `fetch` that needs no preflight
/// (`text/plain`, a form's types), which a page can make its visitors'
/// browsers send, each from its own address, past the per-address caps
/// (free macro definitions, A2A tasks, execute). Refused before it runs.
pub(super) fn sent_by_another_site(headers: &hyper::HeaderMap) -> bool {
    headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site" || v.as_bytes() == b"same-site")
}

/// The answer to a request whose target names no resource: `OPTIONS *`
/// asks what the server supports (RFC 9110 9.3.7: 204 with `Allow`, as
/// load balancers' health checks send it); the asterisk with any other
/// method is malformed (400); `CONNECT` asks for a tunnel, which this
/// service, not a proxy, does not make (501).
pub(super) fn not_for_a_resource(app: &App, method: &str, uri: &hyper::Uri) -> Option<Reply> {
    if method == "CONNECT" {
        return Some(Reply::error(
            501,
            "not_implemented",
            "this service is not a proxy: it makes no tunnels (CONNECT)",
        ));
    }
    if uri.path() != "*" {
        return None;
    }
    Some(if method == "OPTIONS" {
        // Every method some route of the table in force takes.
        let served = app.runtime.served();
        let mut methods: Vec<&str> = served.table.routes().map(|r| r.method.as_str()).collect();
        if methods.contains(&"GET") {
            methods.push("HEAD");
        }
        methods.sort_unstable();
        methods.dedup();
        methods.retain(|m| *m != "OPTIONS");
        options(&methods, &hyper::HeaderMap::new())
    } else {
        Reply::invalid("target", "the asterisk form (`*`) is for OPTIONS only")
    })
}

/// `OPTIONS` on a path that does not declare it: 204 with the methods the
/// path answers in `Allow` (RFC 9110 9.3.7). A browser's CORS preflight
/// of a read (`Access-Control-Request-Method: GET` or `HEAD`) from any
/// origin is allowed: every read is public, and no cookie or credential
/// of a browser's is ever read. A preflight of another method gets no
/// `Access-Control-Allow-*`, so the browser does not send it (a family
/// that takes writes from browsers answers OPTIONS itself, as `/mcp`).
pub(super) fn options<S: AsRef<str>>(allowed: &[S], headers: &hyper::HeaderMap) -> Reply {
    let mut list: Vec<&str> = allowed.iter().map(AsRef::as_ref).collect();
    if !list.contains(&"OPTIONS") {
        list.push("OPTIONS");
    }
    let mut reply = Reply {
        status: 204,
        headers: vec![("allow".into(), crate::reply::allowed_list(&list))],
        body: vec![],
    };
    let asked = headers
        .get("access-control-request-method")
        .and_then(|v| v.to_str().ok());
    let reads = matches!(asked, Some("GET" | "HEAD")) && list.contains(&"GET");
    if reads && headers.contains_key(hyper::header::ORIGIN) {
        reply.headers.extend([
            ("access-control-allow-origin".into(), "*".into()),
            ("access-control-allow-methods".into(), "GET, HEAD".into()),
            ("access-control-max-age".into(), "600".into()),
        ]);
        // The headers it asks to send, as asked (a read takes none of
        // them as a credential).
        if let Some(wanted) = headers
            .get("access-control-request-headers")
            .and_then(|v| v.to_str().ok())
            .filter(|v| v.len() <= 1024)
        {
            reply
                .headers
                .push(("access-control-allow-headers".into(), wanted.to_string()));
        }
    }
    reply
}

/// The `Content-Length` a request declares, if it is a number.
pub(crate) fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_with_a_content_coding_is_refused() {
        let of = |pairs: &[(&str, &str)]| {
            let mut headers = hyper::HeaderMap::new();
            for (k, v) in pairs {
                headers.append(
                    hyper::header::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                );
            }
            content_codings_supported(&headers)
        };
        assert!(of(&[]));
        assert!(of(&[("content-length", "2")]));
        assert!(of(&[
            ("content-length", "2"),
            ("content-encoding", "identity")
        ]));
        assert!(of(&[("content-length", "0"), ("content-encoding", "gzip")]));
        assert!(!of(&[
            ("content-length", "2"),
            ("content-encoding", "gzip")
        ]));
        assert!(!of(&[
            ("transfer-encoding", "chunked"),
            ("content-encoding", "br")
        ]));
        assert!(!of(&[
            ("content-length", "2"),
            ("content-encoding", "identity"),
            ("content-encoding", "deflate"),
        ]));
    }

    #[test]
    fn only_100_continue_is_an_expectation_met() {
        let met = |values: &[&str]| {
            let mut headers = hyper::HeaderMap::new();
            for v in values {
                headers.append(
                    hyper::header::EXPECT,
                    hyper::header::HeaderValue::from_str(v).unwrap(),
                );
            }
            expectations_met(&headers)
        };
        assert!(met(&[]));
        assert!(met(&["100-continue"]));
        assert!(met(&["100-Continue"]));
        assert!(!met(&["200-ok"]));
        assert!(!met(&["100-continue, 200-ok"]));
        assert!(!met(&["100-continue", "foo"]));
        // An empty list names no expectation.
        assert!(met(&[""]));
    }

    #[test]
    fn one_valid_host_per_request() {
        use hyper::Version;
        let problem = |version: Version, hosts: &[&[u8]]| {
            let mut headers = hyper::HeaderMap::new();
            for h in hosts {
                headers.append(
                    hyper::header::HOST,
                    hyper::header::HeaderValue::from_bytes(h).unwrap(),
                );
            }
            host_problem(version, &headers)
        };
        // (What a host may look like: `marketplace_common::url`.)
        for good in [&b"market.example"[..], b"[::1]:8080", b""] {
            assert_eq!(problem(Version::HTTP_11, &[good]), None, "{good:?}");
        }
        assert_eq!(problem(Version::HTTP_10, &[]), None);
        assert!(problem(Version::HTTP_11, &[]).is_some());
        assert!(problem(Version::HTTP_11, &[b"a", b"b"]).is_some());
        assert!(problem(Version::HTTP_10, &[b"a", b"a"]).is_some());
        for bad in [&b"a b"[..], b"user@host", b"\xff", b"host:70000"] {
            assert!(problem(Version::HTTP_11, &[bad]).is_some(), "{bad:?}");
        }
    }
}
