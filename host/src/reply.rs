//! The reply type every layer returns.

use serde_json::json;

/// An HTTP answer produced by the host or a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The value of the header `name` (any case) in `headers`, the first if
/// several.
pub fn header_of<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

impl Reply {
    /// The value of this reply's header `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        header_of(&self.headers, name)
    }

    /// A JSON answer (a `Value`, or anything serializable straight to
    /// bytes, without building a `Value` first).
    pub fn json(status: u16, value: &(impl serde::Serialize + ?Sized)) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: serde_json::to_vec(value).unwrap_or_default(),
        }
    }

    /// [`Reply::json`] written into a buffer of `capacity` bytes from the
    /// start, for an answer known to be about that large (serde_json's
    /// own starts at 128 bytes and grows by copying).
    pub fn json_sized(
        status: u16,
        value: &(impl serde::Serialize + ?Sized),
        capacity: usize,
    ) -> Reply {
        let mut body = Vec::with_capacity(capacity);
        if serde_json::to_writer(&mut body, value).is_err() {
            body.clear();
        }
        Reply {
            status,
            headers: vec![],
            body,
        }
    }

    /// 405 `method_not_allowed` with the methods `path` answers, also in
    /// `Allow`: the HTTP server's and the admin listener's answer.
    pub fn method_not_allowed<S: AsRef<str> + serde::Serialize>(
        method: &str,
        path: &str,
        allowed: &[S],
    ) -> Reply {
        let mut reply = Reply::method_refused(method, path, allowed);
        reply.headers.push(("allow".into(), allowed_list(allowed)));
        reply
    }

    /// [`Reply::method_not_allowed`]'s body alone: the answer to a request
    /// a component dispatches (MCP `execute`), whose `Allow` would speak of
    /// the component's own route.
    pub fn method_refused<S: AsRef<str> + serde::Serialize>(
        method: &str,
        path: &str,
        allowed: &[S],
    ) -> Reply {
        Reply::json(
            405,
            &json!({
                "code": "method_not_allowed",
                "message": format!(
                    "{} is not allowed on {path}; allowed: {}",
                    crate::logging::clip(method, crate::logging::MAX_METHOD),
                    allowed_list(allowed),
                ),
                "allowed_methods": allowed,
            }),
        )
    }

    /// A protocol error `{"code", "message"}`.
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
        Reply::json(status, &json!({"code": code, "message": message.into()}))
    }

    /// 400 `invalid_request` about one field, with its `details`.
    pub fn invalid(field: &str, problem: impl Into<String>) -> Reply {
        let problem = problem.into();
        Reply::json(
            400,
            &json!({
                "code": "invalid_request",
                "message": format!("{field}: {problem}"),
                "details": [{"field": field, "problem": problem}],
            }),
        )
    }

    /// 503 `storage_conflict`: a request kept losing races with other
    /// hosts' on the shared store; nothing of it was kept.
    pub fn conflict() -> Reply {
        Reply::error(
            503,
            "storage_conflict",
            "the request kept conflicting with concurrent ones on the shared store; nothing was kept, try again",
        )
        .retry_after_a_second()
    }

    /// 404 `not_found` for `method path` (the method as its answer names
    /// it: a HEAD's is its GET's), which no route takes, `why` after it
    /// (empty, or what took it away). A path may be 64 KiB: it is not
    /// echoed whole.
    pub fn no_route(method: &str, path: &str, why: &str) -> Reply {
        Reply::error(
            404,
            "not_found",
            format!(
                "no route for {method} {}{why}",
                crate::logging::clip(path, crate::logging::SHOWN_PATH)
            ),
        )
    }

    /// The shared store could not be reached while the request ran.
    /// A write may not have been kept (or, when the connection broke at its
    /// commit, may have been): an identical retry of a paid request is
    /// answered as the first was if it was.
    pub fn store_unavailable() -> Reply {
        Reply::error(
            503,
            "store_unavailable",
            "the shared store is unavailable; try again (an identical retry of a paid request is answered as the first was, if that was kept)",
        )
        .retry_after_a_second()
    }

    /// 503 `disk_full` for a request that `writes`, while the embedded
    /// store's disk has less free space than its reserve
    /// (`crate::store::disk`): refused before it runs, directly or
    /// dispatched, nothing done or spent.
    pub fn refusing_writes(storage: &crate::store::Storage, writes: bool) -> Option<Reply> {
        (writes && storage.disk_low().is_some()).then(Reply::disk_full)
    }

    fn disk_full() -> Reply {
        Reply::error(
            503,
            "disk_full",
            "the server's disk is nearly full: writes are refused until its operator frees space (reads go on); nothing was done or spent, try again later",
        )
        .retry_after(30)
    }

    /// This reply saying `Connection: close`: an answer that leaves the
    /// request body unread ends the connection, and says so rather than
    /// leave a keep-alive client to find a closed socket.
    pub fn closing(mut self) -> Reply {
        if !self
            .headers
            .iter()
            .any(|(n, v)| n.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close"))
        {
            self.headers.push(("connection".into(), "close".into()));
        }
        self
    }

    /// This reply with `Retry-After: 1`: the condition (a lost race, a
    /// store or components not there yet) may pass any moment.
    pub fn retry_after_a_second(self) -> Reply {
        self.retry_after(1)
    }

    /// This reply with `Retry-After: {seconds}`.
    fn retry_after(mut self, seconds: u32) -> Reply {
        self.headers
            .push(("retry-after".into(), seconds.to_string()));
        self
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// Methods as `Allow` lists them.
/// Methods as `Allow` lists them.
pub fn allowed_list<S: AsRef<str>>(allowed: &[S]) -> String {
    allowed
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Headers that say how the message is framed or how the connection goes
/// on, the host's request id, and the answer's `Date` and `Server`: the
/// host's HTTP layer sets them, so a plugin's are dropped (a plugin's
/// `content-length` could otherwise end its body early and make the rest
/// of it the next answer on the connection).
const HOP_BY_HOP: [&str; 11] = [
    "connection",
    "content-length",
    "date",
    "server",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-request-id",
];

/// Headers only the host writes, from the payment it took: a plugin's own
/// would show a client change it was never given, or ask for a payment the
/// host did not price. (A plugin may relay those a request it dispatched
/// was answered with: see [`Reply::from_plugin`].)
pub const HOST_OWNED: [&str; 3] = ["x-cash-change", PAYMENT_REQUIRED, PAYMENT_RESPONSE];

/// x402's header names (lower case on the wire, as hyper writes them): what
/// a payment costs, the payment a client sends, and its settlement.
pub const PAYMENT_REQUIRED: &str = "payment-required";
pub const PAYMENT_SIGNATURE: &str = "payment-signature";
pub const PAYMENT_RESPONSE: &str = "payment-response";

/// Header names accepted for the webcash rail, canonical first.
pub const CASH_HEADERS: &[&str] = &["X-Cash-Secret", "X-Webcash-Secret"];
/// Header of the bitcoin rail (disabled on this host).
pub const BITCOIN_HEADER: &str = "X-Bitcoin-Secret";

/// Headers that set, clear, ask for or expose the client's credentials: a
/// plugin's reach the client only when its family is granted
/// `credentials` (a cookie set by one family is sent to every family of
/// the origin; `Clear-Site-Data` wipes every family's; an
/// `Access-Control-Allow-Credentials` lets another site's page read the
/// answer to a request its browser sent with the origin's cookies).
const CREDENTIAL_SETTERS: [&str; 5] = [
    "set-cookie",
    "clear-site-data",
    "www-authenticate",
    "proxy-authenticate",
    "access-control-allow-credentials",
];

/// Headers that set a policy of the whole origin (how clients reach it
/// and report on it): the operator's (say at its TLS proxy), never a
/// family's, whose `max-age=0` would turn HSTS off for every family.
const ORIGIN_POLICIES: [&str; 4] = ["strict-transport-security", "alt-svc", "nel", "report-to"];

/// Headers an answer has at most one of: a plugin's second is dropped
/// (two `Content-Type`s leave a client to guess which it meant).
const SINGLE: [&str; 6] = [
    "content-type",
    "content-disposition",
    "etag",
    "last-modified",
    "location",
    "retry-after",
];

/// Whether a redirect to `location` would take the client off this
/// service's origin: an absolute URL (a scheme), a network-path reference
/// (`//host`), or what browsers read as one (`/\\host`, `\\host`), read as
/// a WHATWG URL parser reads it: tabs and line breaks anywhere removed,
/// leading controls and spaces trimmed (`/\t/host` is `//host` to it). A
/// client following it would send the other server the request again,
/// its payment header included.
fn leaves_origin(location: &str) -> bool {
    let l: String = location
        .trim_start_matches(|c: char| c <= ' ')
        .chars()
        .filter(|c| !matches!(c, '\t' | '\n' | '\r'))
        .collect();
    if l.starts_with("//") || l.starts_with("/\\") || l.starts_with('\\') {
        return true;
    }
    l.find([':', '/', '?', '#'])
        .is_some_and(|i| l.as_bytes()[i] == b':')
}

/// A header name or value of a plugin's, as the reason its answer was
/// refused quotes it (that reason is logged): any cash secret in it
/// redacted (a component may echo a client's input), clipped (a name may
/// be 64 KiB).
fn shown(text: &str, max: usize) -> String {
    let redacted = marketplace_common::secret::redact_secret_text(text);
    crate::logging::clip(&redacted, max).into_owned()
}

/// What a plugin's answer may carry beyond its own headers: the payment
/// headers the host answered its dispatched requests with, and whether its
/// family is granted `credentials`.
#[derive(Clone, Copy, Default)]
pub struct PluginGrants<'a> {
    pub relayed: &'a [(String, String)],
    pub credentials: bool,
}

/// Headers a plugin's answer may carry at most, and their bytes (names and
/// values): a client meets nothing larger than a browser or proxy accepts.
const MAX_PLUGIN_HEADERS: usize = 100;
const MAX_PLUGIN_HEADER_BYTES: usize = 64 << 10;

impl Reply {
    /// A plugin's answer as the host may send it: `Err` (the reason, for
    /// the log) when its status is not a final one (200 to 599), it has
    /// more headers than [`MAX_PLUGIN_HEADERS`] (or bytes of them than
    /// [`MAX_PLUGIN_HEADER_BYTES`]) or a header name or value is not valid
    /// HTTP; [`HOP_BY_HOP`] headers are
    /// dropped, [`HOST_OWNED`] ones but those `may.relayed` holds (what the
    /// host answered the plugin's dispatched requests with: the MCP
    /// `execute` tool passes a 402's `PAYMENT-REQUIRED` or a paid call's
    /// change on), [`CREDENTIAL_SETTERS`] without `may.credentials`, and
    /// [`ORIGIN_POLICIES`];
    /// names lower-cased (a name already so is kept as given). Every
    /// answer of a plugin comes through here, its fault answer too.
    pub fn from_plugin(
        status: u16,
        headers: Vec<(String, String)>,
        body: Vec<u8>,
        may: PluginGrants,
    ) -> Result<Reply, String> {
        use hyper::header::{HeaderName, HeaderValue};
        if !(200..=599).contains(&status) {
            return Err(format!(
                "status {status} is not a final status (200 to 599)"
            ));
        }
        let bytes: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
        if headers.len() > MAX_PLUGIN_HEADERS || bytes > MAX_PLUGIN_HEADER_BYTES {
            return Err(format!(
                "{} headers of {bytes} bytes (at most {MAX_PLUGIN_HEADERS} headers, {MAX_PLUGIN_HEADER_BYTES} bytes)",
                headers.len()
            ));
        }
        let mut kept = Vec::with_capacity(headers.len());
        for (name, value) in headers {
            let Ok(parsed) = HeaderName::from_bytes(name.as_bytes()) else {
                let name = shown(&name, 100);
                return Err(format!("header name {name:?} is not valid"));
            };
            if HeaderValue::from_str(&value).is_err() {
                let name = shown(&name, 100);
                return Err(format!("the value of header {name:?} is not valid"));
            }
            if HOP_BY_HOP.contains(&parsed.as_str()) {
                continue;
            }
            let name = if parsed.as_str() == name {
                name
            } else {
                parsed.as_str().to_string()
            };
            if HOST_OWNED.contains(&name.as_str())
                && !may.relayed.iter().any(|(n, v)| *n == name && *v == value)
            {
                continue;
            }
            if !may.credentials && CREDENTIAL_SETTERS.contains(&name.as_str()) {
                continue;
            }
            if ORIGIN_POLICIES.contains(&name.as_str()) {
                continue;
            }
            if SINGLE.contains(&name.as_str()) && kept.iter().any(|(n, _)| *n == name) {
                continue;
            }
            if name == "location" && (300..400).contains(&status) && leaves_origin(&value) {
                return Err(format!(
                    "a redirect ({status}) off the service's origin (Location {:?}): its client would send the request there again, payment headers included; a redirect names a path",
                    shown(&value, 200)
                ));
            }
            kept.push((name, value));
        }
        Ok(Reply {
            status,
            headers: kept,
            body,
        })
    }
}

/// The answer to a storage failure of the host's own: 503
/// `storage_conflict` for a lost race, 503 `disk_full` for a commit the
/// disk's reserve refused, else a 500 (logged by the caller).
pub fn storage_failure(e: &crate::store::StorageError) -> Reply {
    match e {
        crate::store::StorageError::Conflict => Reply::conflict(),
        crate::store::StorageError::DiskFull => Reply::disk_full(),
        _ => Reply::error(500, "internal", "internal error"),
    }
}

#[cfg(test)]
mod plugin_answer_tests {
    use super::{PluginGrants, Reply};

    fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn framing_headers_of_a_plugin_are_dropped() {
        let reply = Reply::from_plugin(
            200,
            h(&[
                ("Content-Length", "2"),
                ("transfer-encoding", "chunked"),
                ("Connection", "close"),
                ("x-request-id", "forged"),
                ("ETag", "\"v1\""),
            ]),
            b"{}HTTP/1.1 200 OK".to_vec(),
            Default::default(),
        )
        .unwrap();
        assert_eq!(reply.headers, h(&[("etag", "\"v1\"")]));
        assert_eq!(reply.body, b"{}HTTP/1.1 200 OK");
    }

    #[test]
    fn a_plugin_redirects_only_within_the_origin_and_sets_no_date() {
        let answer = |status, location: &str| {
            Reply::from_plugin(
                status,
                h(&[("Location", location), ("Date", "x"), ("Server", "rogue")]),
                vec![],
                Default::default(),
            )
        };
        for here in ["/docs/", "next", "/api/x?to=https://a.example", "#top"] {
            let reply = answer(307, here).unwrap();
            assert_eq!(reply.headers, h(&[("location", here)]), "{here}");
        }
        for away in [
            "https://a.example/steal",
            "//a.example/steal",
            "/\\a.example",
            "\\\\a.example",
            " http://a.example",
            "javascript:alert(1)",
            "/\t/a.example/steal",
            "\t//a.example",
            "/\t\\a.example",
            "ht\ttps://a.example",
        ] {
            for status in [301, 302, 303, 307, 308] {
                let e = answer(status, away).unwrap_err();
                assert!(e.contains("off the service's origin"), "{away}: {e}");
            }
        }
        // The refusal, which is logged, shows no secret a plugin echoed.
        let secret = format!("e1:secret:{}", "ab".repeat(32));
        let e = answer(307, &format!("https://a.example/?s={secret}")).unwrap_err();
        assert!(
            e.contains("e1:secret:{redacted}") && !e.contains(&secret),
            "{e}"
        );
        let bad_name = Reply::from_plugin(
            200,
            h(&[(secret.as_str(), "x")]),
            vec![],
            Default::default(),
        );
        let e = bad_name.unwrap_err();
        assert!(
            e.contains("e1:secret:{redacted}") && !e.contains(&secret),
            "{e}"
        );
        // A created resource's absolute Location is no redirect.
        assert!(answer(201, "https://a.example/x").is_ok());
        // One of each single-valued header: the first.
        let reply = Reply::from_plugin(
            200,
            h(&[
                ("Content-Type", "text/plain"),
                ("content-type", "text/html"),
            ]),
            vec![],
            Default::default(),
        )
        .unwrap();
        assert_eq!(reply.headers, h(&[("content-type", "text/plain")]));
    }

    #[test]
    fn payment_headers_pass_only_as_the_host_gave_them() {
        let relayed = h(&[("x-cash-change", "e1:secret:given")]);
        let reply = Reply::from_plugin(
            200,
            h(&[
                ("X-Cash-Change", "e1:secret:given"),
                ("x-cash-change", "e2:secret:forged"),
                ("payment-required", "e30="),
                ("x-kept", "yes"),
            ]),
            vec![],
            PluginGrants {
                relayed: &relayed,
                credentials: false,
            },
        )
        .unwrap();
        assert_eq!(
            reply.headers,
            h(&[("x-cash-change", "e1:secret:given"), ("x-kept", "yes")])
        );
        // Credential headers only with the grant.
        let cookie = h(&[
            ("Set-Cookie", "a=b"),
            ("www-authenticate", "Basic"),
            ("Access-Control-Allow-Credentials", "true"),
        ]);
        let without = Reply::from_plugin(200, cookie.clone(), vec![], Default::default());
        assert!(without.unwrap().headers.is_empty());
        let with = PluginGrants {
            relayed: &[],
            credentials: true,
        };
        let kept = Reply::from_plugin(200, cookie, vec![], with).unwrap();
        assert_eq!(kept.headers.len(), 3);
        // Clearing every family's cookies is a credential header too; the
        // origin's transport and reporting policies are no family's, even
        // one granted credentials (outside plugin-author probe).
        let origin_wide = h(&[
            ("Clear-Site-Data", "\"cookies\""),
            ("Strict-Transport-Security", "max-age=0"),
            ("alt-svc", "h3=\"evil.example:443\""),
            ("NEL", "{}"),
            ("Report-To", "{}"),
            ("access-control-allow-origin", "*"),
        ]);
        let without = Reply::from_plugin(200, origin_wide.clone(), vec![], Default::default());
        assert_eq!(
            without.unwrap().headers,
            h(&[("access-control-allow-origin", "*")])
        );
        let with = Reply::from_plugin(200, origin_wide, vec![], with).unwrap();
        assert_eq!(
            with.headers,
            h(&[
                ("clear-site-data", "\"cookies\""),
                ("access-control-allow-origin", "*")
            ])
        );
    }

    #[test]
    fn only_final_statuses_and_valid_headers_pass() {
        for status in [0, 100, 101, 199, 600, 999] {
            assert!(
                Reply::from_plugin(status, vec![], vec![], Default::default()).is_err(),
                "{status}"
            );
        }
        for status in [200, 304, 404, 599] {
            assert!(
                Reply::from_plugin(status, vec![], vec![], Default::default()).is_ok(),
                "{status}"
            );
        }
        assert!(
            Reply::from_plugin(200, h(&[("bad name", "x")]), vec![], Default::default()).is_err()
        );
        let many: Vec<(String, String)> =
            (0..101).map(|i| (format!("x-{i}"), "v".into())).collect();
        assert!(Reply::from_plugin(200, many[..100].to_vec(), vec![], Default::default()).is_ok());
        assert!(Reply::from_plugin(200, many, vec![], Default::default()).is_err());
        let big = vec![("x-big".to_string(), "v".repeat(64 << 10))];
        assert!(Reply::from_plugin(200, big, vec![], Default::default()).is_err());
        assert!(
            Reply::from_plugin(
                200,
                h(&[("x-a", "line\r\nx-b: y")]),
                vec![],
                Default::default()
            )
            .is_err()
        );
    }
}
