//! The route table: every HTTP endpoint, the family that serves it, and
//! whether it is paid. One table, used by the router, the OpenAPI
//! consistency test and the admin view.

/// Who serves a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handler {
    /// A plugin family.
    Family(&'static str),
    /// A native host handler (ledger, docs, benchmark baseline).
    Host(&'static str),
}

/// One endpoint.
#[derive(Debug, Clone, Copy)]
pub struct Route {
    pub method: &'static str,
    /// Path pattern with `{name}` segments.
    pub pattern: &'static str,
    pub handler: Handler,
    /// Only mounted when `testing_routes` is on (benchmarks and fault tests).
    pub testing: bool,
    /// Whether the call gets a write transaction (and joins a commit batch).
    /// Every method but GET, except POST routes that only read.
    pub writes: bool,
}

impl Route {
    /// Whether this route answers `method` (HEAD is served by GET routes).
    pub fn serves(&self, method: &str) -> bool {
        self.method == method || (method == "HEAD" && self.method == "GET")
    }
}

const fn is_read(method: &str) -> bool {
    matches!(method.as_bytes(), b"GET" | b"HEAD")
}

const fn family(method: &'static str, pattern: &'static str, family: &'static str) -> Route {
    Route {
        method,
        pattern,
        handler: Handler::Family(family),
        testing: false,
        writes: !is_read(method),
    }
}

/// A POST route that only reads: it runs on a read snapshot, so a slow call
/// (a macro) never holds up the commit batch of writers.
const fn reads(method: &'static str, pattern: &'static str, family: &'static str) -> Route {
    Route {
        writes: false,
        ..self::family(method, pattern, family)
    }
}

const fn testing(method: &'static str, pattern: &'static str, handler: Handler) -> Route {
    Route {
        method,
        pattern,
        handler,
        testing: true,
        writes: !is_read(method),
    }
}

/// Every route of the service.
pub const ROUTES: &[Route] = &[
    // info
    family("GET", "/api/health", "info"),
    family("GET", "/api/info", "info"),
    family("GET", "/api/developers", "info"),
    // fees (served by the host from the active fee-policy component)
    Route {
        method: "GET",
        pattern: "/api/fees",
        handler: Handler::Host("fees"),
        testing: false,
        writes: false,
    },
    // timeline
    family("GET", "/api/timeline", "timeline"),
    family("POST", "/api/timeline", "timeline"),
    family("GET", "/api/posts/{post_id}", "timeline"),
    family(
        "GET",
        "/api/posts/{post_id}/attachments/{index}",
        "timeline",
    ),
    family("GET", "/api/thread/{post_id}", "timeline"),
    // search
    family("GET", "/api/search", "search"),
    // identity
    family("GET", "/api/profile", "identity"),
    family("POST", "/api/identity", "identity"),
    family("POST", "/api/profiles/rate", "identity"),
    // contracts
    family("POST", "/api/arbitration/contracts/buy", "contracts"),
    family("GET", "/api/arbitration/contracts/{id}", "contracts"),
    family("GET", "/api/arbitration/contracts/{id}/status", "contracts"),
    family(
        "POST",
        "/api/arbitration/contracts/{id}/pickup",
        "contracts",
    ),
    family(
        "POST",
        "/api/arbitration/contracts/{id}/accept",
        "contracts",
    ),
    family(
        "POST",
        "/api/arbitration/contracts/{id}/deliver",
        "contracts",
    ),
    family(
        "POST",
        "/api/arbitration/contracts/{id}/refund",
        "contracts",
    ),
    family(
        "POST",
        "/api/arbitration/contracts/{id}/release",
        "contracts",
    ),
    family("POST", "/api/witness/replace", "contracts"),
    family("POST", "/api/witness/health_check", "contracts"),
    // mcp, manifest and docs
    family("GET", "/api/mcp", "mcp"),
    reads("POST", "/api/mcp/tools/search", "mcp"),
    family("POST", "/api/mcp/tools/define", "mcp"),
    // Its endpoint form dispatches writes as requests of their own.
    reads("POST", "/api/mcp/tools/execute", "mcp"),
    reads("POST", "/mcp", "mcp"),
    family("GET", "/api/docs/search", "mcp"),
    family("GET", "/.well-known/agent.json", "mcp"),
    family("GET", "/.well-known/agent-card.json", "mcp"),
    family("GET", "/openapi.yaml", "mcp"),
    family("GET", "/openapi.json", "mcp"),
    family("GET", "/docs", "mcp"),
    // cash ledger (host)
    Route {
        method: "POST",
        pattern: "/api/cash/replace",
        handler: Handler::Host("cash_replace"),
        testing: false,
        writes: true,
    },
    Route {
        method: "POST",
        pattern: "/api/cash/health_check",
        handler: Handler::Host("cash_health_check"),
        testing: false,
        writes: true,
    },
    // test-only routes
    testing("GET", "/_testing/ok", Handler::Family("testing")),
    testing("GET", "/_testing/trap", Handler::Family("testing")),
    testing("GET", "/_testing/loop", Handler::Family("testing")),
    testing("GET", "/_testing/alloc", Handler::Family("testing")),
    testing("POST", "/_testing/write", Handler::Family("testing")),
    testing("GET", "/_testing/read", Handler::Family("testing")),
    testing("POST", "/_testing/paid", Handler::Family("testing")),
    testing("GET", "/_testing/native", Handler::Host("native_ok")),
];

/// The result of matching a request against the table.
#[derive(Debug)]
pub enum Match {
    Found {
        route: &'static Route,
        params: Vec<(String, String)>,
    },
    /// The path exists with other methods.
    MethodNotAllowed(Vec<&'static str>),
    NotFound,
}

/// Fold the `/api/v1` compatibility alias onto `/api`.
pub fn canonical_path(path: &str) -> String {
    match path.strip_prefix("/api/v1") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/api{rest}"),
        _ => path.to_string(),
    }
}

/// Whether a call of `method` on the route `pattern` writes (see
/// [`Route::writes`]); unknown routes write unless read by method. For
/// callers that hold a request rather than its matched [`Route`].
pub fn writes(method: &str, pattern: &str) -> bool {
    ROUTES
        .iter()
        .find(|r| r.pattern == pattern && r.serves(method))
        .map_or(!is_read(method), |r| r.writes)
}

/// Match a method and canonical path. HEAD matches GET routes.
pub fn find(method: &str, path: &str, with_testing: bool) -> Match {
    let mut allowed = Vec::new();
    for route in ROUTES.iter().filter(|r| with_testing || !r.testing) {
        if let Some(params) = match_pattern(route.pattern, path) {
            if route.serves(method) {
                return Match::Found { route, params };
            }
            allowed.push(route.method);
        }
    }
    if allowed.is_empty() {
        Match::NotFound
    } else {
        Match::MethodNotAllowed(allowed)
    }
}

fn match_pattern(pattern: &str, path: &str) -> Option<Vec<(String, String)>> {
    let mut params = Vec::new();
    let mut pat = pattern.split('/');
    let mut segs = path.split('/');
    loop {
        match (pat.next(), segs.next()) {
            (None, None) => return Some(params),
            (Some(p), Some(s)) => {
                if let Some(name) = p.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                    if s.is_empty() {
                        return None;
                    }
                    params.push((name.to_string(), percent_decode(s)));
                } else if p != s {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// Decode `%XX` escapes (and `+` as space when `plus` is set) leniently:
/// invalid escapes are kept as written, invalid UTF-8 is replaced.
pub fn percent_decode_with(s: &str, plus: bool) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 3;
                        continue;
                    }
                    _ => out.push(b'%'),
                }
            }
            b'+' if plus => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decode a path segment.
pub fn percent_decode(s: &str) -> String {
    percent_decode_with(s, false)
}

/// Parse a query string into ordered, decoded pairs.
pub fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode_with(k, true), percent_decode_with(v, true))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_mutations_get_write_transactions() {
        assert!(writes("POST", "/api/timeline"));
        assert!(writes("POST", "/api/mcp/tools/define"));
        assert!(!writes("GET", "/api/timeline"));
        assert!(!writes("HEAD", "/api/timeline"));
        for read_only_post in ["/api/mcp/tools/search", "/api/mcp/tools/execute", "/mcp"] {
            assert!(!writes("POST", read_only_post), "{read_only_post}");
        }
        assert!(writes("POST", "/no/such/route"));
    }

    #[test]
    fn alias_folds_onto_api() {
        assert_eq!(canonical_path("/api/v1/health"), "/api/health");
        assert_eq!(canonical_path("/api/v1"), "/api");
        assert_eq!(canonical_path("/api/v10/health"), "/api/v10/health");
        assert_eq!(canonical_path("/api/health"), "/api/health");
    }

    #[test]
    fn params_are_extracted_and_decoded() {
        match find("GET", "/api/posts/post_1%20x/attachments/2", false) {
            Match::Found { route, params } => {
                assert_eq!(route.pattern, "/api/posts/{post_id}/attachments/{index}");
                assert_eq!(
                    params,
                    vec![
                        ("post_id".into(), "post_1 x".into()),
                        ("index".into(), "2".into())
                    ]
                );
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn literal_segments_win_over_params() {
        // `buy` is a literal route; it must not be read as contract id "buy" with POST.
        match find("POST", "/api/arbitration/contracts/buy", false) {
            Match::Found { route, .. } => {
                assert_eq!(route.pattern, "/api/arbitration/contracts/buy")
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn wrong_method_lists_allowed() {
        match find("DELETE", "/api/timeline", false) {
            Match::MethodNotAllowed(m) => assert_eq!(m, vec!["GET", "POST"]),
            m => panic!("{m:?}"),
        }
        assert!(matches!(find("GET", "/api/nope", false), Match::NotFound));
        assert!(matches!(find("GET", "/api/posts/", false), Match::NotFound));
    }

    #[test]
    fn testing_routes_are_hidden_unless_enabled() {
        assert!(matches!(
            find("GET", "/_testing/ok", false),
            Match::NotFound
        ));
        assert!(matches!(
            find("GET", "/_testing/ok", true),
            Match::Found { .. }
        ));
    }

    #[test]
    fn query_decoding() {
        assert_eq!(
            parse_query("term=a+b%21&limit=20&x&bad=%zz%4"),
            vec![
                ("term".into(), "a b!".into()),
                ("limit".into(), "20".into()),
                ("x".into(), "".into()),
                ("bad".into(), "%zz%4".into())
            ]
        );
    }
}
