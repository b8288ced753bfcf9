//! The route table: every HTTP endpoint, who serves it, and whether it
//! writes. It is assembled from the host's own routes and the routes each
//! loaded component declares (`handler.api`), and rebuilt at every swap,
//! mount and unmount. Used by the router, in-process dispatch, the admin
//! view and the OpenAPI document.

use std::sync::Arc;

/// Who serves a route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handler {
    /// A plugin family.
    Family(String),
    /// A native host handler (see [`crate::runtime::native`]).
    Host(&'static str),
}

/// One endpoint.
#[derive(Debug, Clone)]
pub struct Route {
    pub method: String,
    /// Path pattern with `{name}` segments.
    pub pattern: String,
    pub handler: Handler,
    /// Whether the call gets a write transaction (and joins a commit batch).
    pub writes: bool,
    /// The fee action when the route is paid (documentation).
    pub paid: Option<String>,
    /// Its own body limit (bytes), instead of the host's `max_body_bytes`.
    pub max_body: Option<usize>,
    /// The query parameters its OpenAPI operation declares: each may be
    /// given once (a second value is 400, never silently dropped).
    pub query: Box<[String]>,
    /// Its request counters and latency histogram, found on first use.
    pub metrics: crate::metrics::RouteMetrics,
}

impl Route {
    /// Whether this route answers `method` (HEAD is served by GET routes).
    pub fn serves(&self, method: &str) -> bool {
        self.method == method || (method == "HEAD" && self.method == "GET")
    }

    /// The first of its declared query parameters `query` gives more than
    /// once: which value a client meant is not for the server to guess
    /// (PROTOCOL 1: malformed parameters are 400, never silently dropped).
    pub fn repeated_query<'q>(&self, query: &'q [(String, String)]) -> Option<&'q str> {
        let declared = |name: &str| self.query.iter().any(|d| d == name);
        marketplace_common::url::first_repeated(query, declared).map(|i| query[i].0.as_str())
    }

    /// Who serves it, for logs and errors.
    pub fn owner(&self) -> &str {
        match &self.handler {
            Handler::Family(f) => f,
            Handler::Host(_) => "host",
        }
    }

    /// `path` as logs may show it: a segment the pattern names
    /// [`SECRET_PARAM`] (a bearer capability such as a single-use upload
    /// URL's token) is shown as that name, never as sent, and what of a
    /// segment may hold a cash secret ([`may_hold_secret`]: written out, or
    /// its 64 hex digits alone, enough to spend; no route takes a public key
    /// in its path) as `{redacted}` ([`redacted_segment`]).
    /// Segments are matched from the end, so a path under an alias prefix
    /// (`/api/v1/...`) is redacted too.
    pub fn logged_path<'p>(&self, path: &'p str) -> std::borrow::Cow<'p, str> {
        // (A pattern without parameters first, by one memchr: most
        // requests' routes, and the substring search costs more.)
        let token = self.pattern.contains('{') && self.pattern.contains(SECRET_PARAM);
        if !token && !may_hold_secret(path) {
            return path.into();
        }
        let mut segments: Vec<std::borrow::Cow<'_, str>> =
            path.split('/').map(redacted_segment).collect();
        if token {
            let pattern: Vec<&str> = self.pattern.split('/').collect();
            let Some(skip) = segments.len().checked_sub(pattern.len()) else {
                return self.pattern.clone().into();
            };
            for (segment, p) in segments[skip..].iter_mut().zip(&pattern) {
                if *p == SECRET_PARAM {
                    *segment = SECRET_PARAM.into();
                }
            }
        }
        segments.join("/").into()
    }
}

pub use marketplace_common::secret::{holds_cash_secret, may_hold_secret, redact_secret_text};

/// A routed path's `segment` as logs may show it: `{redacted}` when it
/// holds a cash secret written out; else its runs of 64 or more hex digits
/// each `{redacted}` (`CTR_{redacted}`, `e1_secret_{redacted}`), so that
/// the rest of an id still names what it is.
fn redacted_segment(segment: &str) -> std::borrow::Cow<'_, str> {
    if holds_cash_secret(segment) {
        return "{redacted}".into();
    }
    if !marketplace_common::secret::holds_hex_key(segment) {
        return segment.into();
    }
    let bytes = segment.as_bytes();
    let (mut out, mut i) = (String::with_capacity(segment.len()), 0);
    while i < bytes.len() {
        let run = bytes[i..]
            .iter()
            .take_while(|b| b.is_ascii_hexdigit())
            .count();
        if run >= 64 {
            out.push_str("{redacted}");
            i += run;
        } else if run > 0 {
            out.push_str(&segment[i..i + run]);
            i += run;
        } else {
            let c = segment[i..].chars().next().expect("a char at a boundary");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out.into()
}

/// A path parameter no log shows (see [`Route::logged_path`]).
pub const SECRET_PARAM: &str = "{token}";

/// `path` as logs may show it, whether `route` took it or none did. Its
/// escapes of unreserved characters are read as the characters first, as
/// routing reads them, so that no escaping hides a secret from the
/// redaction (`e1:%73ecret:...`).
pub fn logged<'p>(route: Option<&Route>, path: &'p str) -> std::borrow::Cow<'p, str> {
    if let Some(plain) = marketplace_common::url::unreserved_unescaped(path) {
        return logged(route, &plain).into_owned().into();
    }
    match route {
        Some(r) => r.logged_path(path),
        None => logged_unrouted(path),
    }
}

/// The problem of a declared query parameter given twice.
pub const REPEATED: &str = "is given more than once: give it once";

/// The problem of a query or path parameter whose escapes are not UTF-8.
pub const NOT_UTF8: &str =
    "is not UTF-8 once percent-decoded: escape the text's UTF-8 bytes (caf%C3%A9, not caf%E9)";

/// A path no route took (404, 405, 503 while the families load) as logs
/// may show it: with no route to name its parameters, a segment that could
/// be a bearer token (32 or more letters and digits, as an upload URL's
/// token is) is shown as `{redacted}`.
pub fn logged_unrouted(path: &str) -> std::borrow::Cow<'_, str> {
    let secret = |segment: &str| {
        (segment.len() >= 32 && segment.bytes().all(|b| b.is_ascii_alphanumeric()))
            || may_hold_secret(segment)
    };
    if !path.split('/').any(secret) {
        return path.into();
    }
    path.split('/')
        .map(|segment| {
            if secret(segment) {
                "{redacted}"
            } else {
                segment
            }
        })
        .collect::<Vec<_>>()
        .join("/")
        .into()
}

/// Methods a component may declare (GET also answers HEAD; OPTIONS is for
/// a family answering CORS preflights of its own routes, and only reads).
pub const METHODS: &[&str] = &["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

/// Most routes one family may declare.
pub const MAX_ROUTES: usize = 256;

/// The pattern with its `{name}` segments made anonymous: two routes of one
/// method and one shape would serve the same requests.
pub fn shape(pattern: &str) -> String {
    marketplace_common::url::pattern_shape(pattern)
}

fn is_param(segment: &str) -> bool {
    segment.starts_with('{') && segment.ends_with('}')
}

/// The names of a pattern's `{name}` segments, in order.
pub fn param_names(pattern: &str) -> impl Iterator<Item = &str> {
    pattern
        .split('/')
        .filter(|s| is_param(s))
        .map(|s| &s[1..s.len() - 1])
}

/// Why a declared route cannot be served, if it cannot.
pub fn check(method: &str, pattern: &str) -> Result<(), String> {
    if !METHODS.contains(&method) {
        return Err(format!(
            "{method} {pattern}: method must be one of {}",
            METHODS.join(", ")
        ));
    }
    if !pattern.starts_with('/') || pattern.len() > 512 {
        return Err(format!(
            "{method} {pattern}: a pattern starts with / and has at most 512 characters"
        ));
    }
    let first = pattern.split('/').nth(1).unwrap_or_default();
    // (A `%` is refused below as a bad segment, not as the alias.)
    if HOST_ROOTS.contains(&first) || (canonical_path(pattern) != pattern && !pattern.contains('%'))
    {
        return Err(format!(
            "{method} {pattern}: /admin, /metrics and the /api/v1 alias are the host's"
        ));
    }
    let mut params = Vec::new();
    for seg in pattern.split('/').skip(1) {
        let ok = if is_param(seg) {
            let name = &seg[1..seg.len() - 1];
            if params.contains(&name) {
                return Err(format!(
                    "{method} {pattern}: the parameter {{{name}}} is named twice"
                ));
            }
            params.push(name);
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        } else {
            // What a client sends as is (RFC 3986 pchar without escapes):
            // a segment a client must escape, or a dot segment it removes,
            // could never be reached.
            seg != "."
                && seg != ".."
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:@".contains(&b))
        };
        if !ok || (seg.is_empty() && pattern != "/") {
            return Err(format!("{method} {pattern}: bad segment {seg:?}"));
        }
    }
    Ok(())
}

/// First path segments only the host serves: its admin API and its
/// metrics (on their own listeners; a family's `/metrics` would pass for
/// them).
const HOST_ROOTS: &[&str] = &["admin", "metrics"];

/// Order: at the first segment where two patterns differ in kind, the
/// literal one comes first, so `/contracts/buy` wins over `/contracts/{id}`.
fn specificity(pattern: &str) -> Vec<bool> {
    pattern.split('/').map(is_param).collect()
}

/// The routes in force, most specific first.
#[derive(Debug, Clone, Default)]
pub struct Table {
    routes: Vec<Arc<Route>>,
    /// Per route, what a matching path must have: its number of `/` and
    /// the pattern's bytes before its first parameter (checked before the
    /// segments are matched); and its rank (routes of one rank and one
    /// number of `/` that match one path are of one path shape).
    keys: Vec<(usize, usize, usize)>,
    /// The routes of each pattern without parameters, by pattern, in table
    /// order: such a pattern is the most specific of any path it matches,
    /// so a path found here is answered without the scan. (Hashed with
    /// foldhash, seeded per process: SipHash took more than the rest of
    /// the lookup. The keys are the table's own few, so no client's path
    /// can make a lookup long.)
    literal: Literal,
}

type Literal = std::collections::HashMap<String, Vec<usize>, foldhash::fast::RandomState>;

/// The `/`s of a path or pattern.
fn slashes(path: &str) -> usize {
    path.bytes().filter(|&b| b == b'/').count()
}

/// The result of matching a request against the table.
#[derive(Debug)]
pub enum Match {
    Found {
        route: Arc<Route>,
        params: Vec<(String, String)>,
    },
    /// The path exists with other methods.
    MethodNotAllowed(Vec<String>),
    NotFound,
}

impl Table {
    /// A table of `routes`; a second route of one method and shape is a
    /// conflict naming both owners.
    pub fn new(routes: Vec<Route>) -> Result<Table, String> {
        let mut seen: std::collections::HashMap<(String, String), String> = Default::default();
        for r in &routes {
            if let Some(other) =
                seen.insert((r.method.clone(), shape(&r.pattern)), r.owner().to_string())
            {
                // (One owner's twice is its own mistake, not a clash with
                // what it replaces.)
                return Err(if other == r.owner() {
                    format!(
                        "route conflict: {} {} is declared twice by {other} (or as another pattern of the same shape)",
                        r.method, r.pattern
                    )
                } else {
                    format!(
                        "route conflict: {} {} of {} is already served by {other}",
                        r.method,
                        r.pattern,
                        r.owner()
                    )
                });
            }
        }
        // A literal segment wins over a parameter only among one owner's
        // routes: a family may not capture requests meant for another's
        // parameter route (and the payment headers they carry). Nor may it
        // add a method to another's path (`DELETE /api/timeline`): a path
        // and the 405 naming its methods belong to one owner.
        for (i, a) in routes.iter().enumerate() {
            for b in &routes[i + 1..] {
                if a.owner() != b.owner() && overlap(&a.pattern, &b.pattern) {
                    return Err(format!(
                        "route conflict: {} {} of {} would share a path with {} {} of {}",
                        b.method,
                        b.pattern,
                        b.owner(),
                        a.method,
                        a.pattern,
                        a.owner()
                    ));
                }
            }
        }
        let mut routes: Vec<Arc<Route>> = routes.into_iter().map(Arc::new).collect();
        routes.sort_by_cached_key(|r| specificity(&r.pattern));
        let mut rank = 0;
        let keys = routes
            .iter()
            .enumerate()
            .map(|(i, r)| {
                if i > 0 && specificity(&routes[i - 1].pattern) != specificity(&r.pattern) {
                    rank += 1;
                }
                let literal = r.pattern.find('{').unwrap_or(r.pattern.len());
                (slashes(&r.pattern), literal, rank)
            })
            .collect();
        let mut literal = Literal::default();
        for (i, r) in routes.iter().enumerate() {
            if !r.pattern.split('/').any(is_param) {
                literal.entry(r.pattern.clone()).or_default().push(i);
            }
        }
        Ok(Table {
            routes,
            keys,
            literal,
        })
    }

    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.routes.iter()
    }

    /// Whether a call of `method` on the route `pattern` writes (see
    /// [`Route::writes`]); unknown routes write unless read by method.
    pub fn writes(&self, method: &str, pattern: &str) -> bool {
        self.routes
            .iter()
            .find(|r| r.pattern == pattern && r.serves(method))
            .map_or(!is_read(method), |r| r.writes)
    }

    /// Match a method and canonical path. HEAD matches GET routes. The
    /// most specific pattern that matches the path is the path's, for
    /// every method: `GET /api/posts/update` is 405 (the literal POST
    /// route's path), not a read of a post named `update`.
    pub fn find(&self, method: &str, path: &str) -> Match {
        let mut allowed: Vec<String> = Vec::new();
        if let Some(routes) = self.literal.get(path) {
            for route in routes.iter().map(|&i| &self.routes[i]) {
                if route.serves(method) {
                    return Match::Found {
                        route: route.clone(),
                        params: Vec::new(),
                    };
                }
                if !allowed.contains(&route.method) {
                    allowed.push(route.method.clone());
                }
            }
            return Match::other_methods(allowed);
        }
        let mut path_rank = None;
        let n = slashes(path);
        for (route, &(route_slashes, literal, rank)) in self.routes.iter().zip(&self.keys) {
            if route_slashes != n || !path.starts_with(&route.pattern[..literal]) {
                continue;
            }
            if path_rank.is_some_and(|r| r != rank) {
                break;
            }
            if let Some(params) = match_pattern(&route.pattern, path) {
                path_rank = Some(rank);
                if route.serves(method) {
                    return Match::Found {
                        route: route.clone(),
                        params,
                    };
                }
                if !allowed.contains(&route.method) {
                    allowed.push(route.method.clone());
                }
            }
        }
        Match::other_methods(allowed)
    }
}

impl Match {
    /// No route of the path serves the method: 405 with the methods that
    /// do (HEAD after GET: a GET route answers it, and RFC 9110's `Allow`
    /// lists it; OPTIONS, which every path takes), or 404 when none does.
    fn other_methods(mut allowed: Vec<String>) -> Match {
        if allowed.is_empty() {
            return Match::NotFound;
        }
        allowed.sort();
        if let Some(at) = allowed.iter().position(|m| m == "GET") {
            allowed.insert(at + 1, "HEAD".into());
        }
        // Last: the host answers it on every path (unless a route does).
        if !allowed.iter().any(|m| m == "OPTIONS") {
            allowed.push("OPTIONS".into());
        }
        Match::MethodNotAllowed(allowed)
    }
}

/// Whether some path matches both patterns.
fn overlap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<&str>, Vec<&str>) = (a.split('/').collect(), b.split('/').collect());
    a.len() == b.len()
        && a.iter()
            .zip(&b)
            .all(|(x, y)| x == y || is_param(x) || is_param(y))
}

pub fn is_read(method: &str) -> bool {
    marketplace_common::url::read_only_method(method)
}

/// Escapes of unreserved characters decoded, the `/api/v1` compatibility
/// alias folded onto `/api`.
pub use marketplace_common::url::canonical_path;

fn match_pattern(pattern: &str, path: &str) -> Option<Vec<(String, String)>> {
    let mut params = Vec::new();
    let mut pat = pattern.split('/');
    let mut segs = path.split('/');
    loop {
        match (pat.next(), segs.next()) {
            (None, None) => return Some(params),
            (Some(p), Some(s)) => {
                if is_param(p) {
                    if s.is_empty() {
                        return None;
                    }
                    params.push((p[1..p.len() - 1].to_string(), percent_decode(s)));
                } else if p != s {
                    return None;
                }
            }
            _ => return None,
        }
    }
}

/// The name of the first parameter of `pattern` whose segment of `path`
/// (a path the pattern matches) is not UTF-8 once decoded (`caf%E9`):
/// malformed, as such a query parameter is.
pub fn param_not_utf8<'p>(pattern: &'p str, path: &str) -> Option<&'p str> {
    if !path.contains('%') {
        return None;
    }
    pattern
        .split('/')
        .zip(path.split('/'))
        .find(|(p, s)| {
            is_param(p)
                && s.contains('%')
                && percent_encoding::percent_decode_str(s)
                    .decode_utf8()
                    .is_err()
        })
        .map(|(p, _)| &p[1..p.len() - 1])
}

/// Decode a path segment (`+` is a plus) leniently: invalid escapes are
/// kept as written, invalid UTF-8 is replaced.
pub fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fam(method: &str, pattern: &str, family: &str) -> Route {
        Route {
            method: method.into(),
            pattern: pattern.into(),
            handler: Handler::Family(family.into()),
            writes: !is_read(method),
            paid: None,
            max_body: None,
            query: Box::default(),
            metrics: Default::default(),
        }
    }

    fn table() -> Table {
        Table::new(vec![
            fam("GET", "/api/timeline", "timeline"),
            fam("POST", "/api/timeline", "timeline"),
            fam("GET", "/api/posts/{post_id}", "timeline"),
            fam(
                "GET",
                "/api/posts/{post_id}/attachments/{index}",
                "timeline",
            ),
            fam("POST", "/api/posts/update", "timeline"),
            fam("GET", "/api/arbitration/contracts/{id}", "contracts"),
            fam(
                "POST",
                "/api/arbitration/contracts/{id}/accept",
                "contracts",
            ),
            fam("POST", "/api/arbitration/contracts/buy", "contracts"),
            Route {
                writes: false,
                ..fam("POST", "/mcp", "mcp")
            },
        ])
        .unwrap()
    }

    #[test]
    fn a_declared_query_parameter_given_twice_is_named() {
        let pairs = |q: &[(&str, &str)]| -> Vec<(String, String)> {
            q.iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect()
        };
        let route = Route {
            query: ["term".to_string(), "limit".to_string()].into(),
            ..fam("GET", "/api/search", "search")
        };
        let repeated = |q: &[(String, String)]| route.repeated_query(q).map(str::to_string);
        let q = pairs(&[("term", "a"), ("limit", "1"), ("limit", "abc")]);
        assert_eq!(repeated(&q).as_deref(), Some("limit"));
        // The same value twice is still twice.
        let q = pairs(&[("limit", "1"), ("term", "a"), ("limit", "1")]);
        assert_eq!(repeated(&q).as_deref(), Some("limit"));
        // Once each, or repeated but not declared: nothing to say.
        let q = pairs(&[("term", "a"), ("limit", "1"), ("utm", "x"), ("utm", "y")]);
        assert_eq!(repeated(&q), None);
        let undeclared = fam("GET", "/api/search", "search");
        assert_eq!(
            undeclared.repeated_query(&pairs(&[("a", ""), ("a", "")])),
            None
        );
    }

    #[test]
    fn read_only_posts_are_declared() {
        let t = table();
        assert!(t.writes("POST", "/api/timeline"));
        assert!(!t.writes("GET", "/api/timeline"));
        assert!(!t.writes("HEAD", "/api/timeline"));
        assert!(!t.writes("POST", "/mcp"));
        assert!(t.writes("POST", "/no/such/route"));
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
        match table().find("GET", "/api/posts/post_1%20x/attachments/2") {
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
    fn literal_segments_win_over_params_whatever_the_order() {
        match table().find("POST", "/api/arbitration/contracts/buy") {
            Match::Found { route, .. } => {
                assert_eq!(route.pattern, "/api/arbitration/contracts/buy")
            }
            m => panic!("{m:?}"),
        }
        // The literal route's path is its own for every method: a GET
        // there is 405, not a read of a post named `update`.
        match table().find("GET", "/api/posts/update") {
            Match::MethodNotAllowed(allowed) => assert_eq!(allowed, ["POST", "OPTIONS"]),
            m => panic!("{m:?}"),
        }
        match table().find("POST", "/api/posts/update") {
            Match::Found { route, .. } => assert_eq!(route.pattern, "/api/posts/update"),
            m => panic!("{m:?}"),
        }
    }

    /// The table's find against matching every route in order.
    #[test]
    fn find_agrees_with_matching_every_route() {
        let t = table();
        let naive = |method: &str, path: &str| {
            let mut allowed: Vec<String> = Vec::new();
            // Only the most specific patterns that match count.
            let most = t
                .routes()
                .filter(|r| match_pattern(&r.pattern, path).is_some())
                .map(|r| specificity(&r.pattern))
                .min();
            for r in t.routes() {
                if Some(specificity(&r.pattern)) != most {
                    continue;
                }
                if let Some(params) = match_pattern(&r.pattern, path) {
                    if r.serves(method) {
                        return format!("found {} {params:?}", r.pattern);
                    }
                    allowed.push(r.method.clone());
                }
            }
            allowed.sort();
            allowed.dedup();
            // A GET route also answers HEAD.
            if allowed.contains(&"GET".to_string()) {
                allowed.push("HEAD".into());
                allowed.sort_by_key(|m| {
                    if m == "HEAD" {
                        "GET\u{1}".to_string()
                    } else {
                        m.clone()
                    }
                });
            }
            // Every path takes OPTIONS, last.
            if !allowed.is_empty() && !allowed.contains(&"OPTIONS".to_string()) {
                allowed.push("OPTIONS".into());
            }
            format!("other {allowed:?}")
        };
        let said = |m: Match| match m {
            Match::Found { route, params } => format!("found {} {params:?}", route.pattern),
            Match::MethodNotAllowed(allowed) => format!("other {allowed:?}"),
            Match::NotFound => "other []".to_string(),
        };
        let mut paths = vec!["/".to_string(), "".into(), "//".into(), "/api".into()];
        for r in t.routes() {
            for value in ["x", "buy", "update", "a%2Fb", ""] {
                let p = r.pattern.replace("{post_id}", value).replace("{id}", value);
                let p = p.replace("{index}", "7");
                paths.extend([
                    p.clone(),
                    format!("{p}/"),
                    format!("{p}/more"),
                    p[..p.len() - 1].to_string(),
                ]);
            }
        }
        for path in &paths {
            for method in ["GET", "HEAD", "POST", "DELETE"] {
                assert_eq!(
                    said(t.find(method, path)),
                    naive(method, path),
                    "{method} {path}"
                );
            }
        }
    }

    #[test]
    fn wrong_method_lists_allowed() {
        match table().find("DELETE", "/api/timeline") {
            Match::MethodNotAllowed(m) => assert_eq!(m, vec!["GET", "HEAD", "POST", "OPTIONS"]),
            m => panic!("{m:?}"),
        }
        assert!(matches!(table().find("GET", "/api/nope"), Match::NotFound));
        assert!(matches!(
            table().find("GET", "/api/posts/"),
            Match::NotFound
        ));
    }

    #[test]
    fn same_method_and_shape_conflict() {
        let err = Table::new(vec![
            fam("GET", "/api/posts/{post_id}", "timeline"),
            fam("GET", "/api/posts/{id}", "rogue"),
        ])
        .unwrap_err();
        assert!(err.contains("conflict") && err.contains("rogue") && err.contains("timeline"));
        // Nor add a method to another family's path.
        let err = Table::new(vec![
            fam("GET", "/api/posts/{post_id}", "timeline"),
            fam("POST", "/api/posts/{id}", "rogue"),
        ])
        .unwrap_err();
        assert!(err.contains("share a path"), "{err}");
        let err = Table::new(vec![
            fam("GET", "/api/timeline", "timeline"),
            fam("DELETE", "/api/timeline", "rogue"),
        ])
        .unwrap_err();
        assert!(err.contains("rogue") && err.contains("timeline"), "{err}");
        // One family's methods on one path, and another's on other paths.
        assert!(
            Table::new(vec![
                fam("GET", "/api/timeline", "timeline"),
                fam("POST", "/api/timeline", "timeline"),
                fam("GET", "/api/timeline/{x}", "rogue"),
            ])
            .is_ok()
        );
        // Another family's literal may not shadow a parameter route.
        let err = Table::new(vec![
            fam(
                "POST",
                "/api/arbitration/contracts/{id}/accept",
                "contracts",
            ),
            fam("POST", "/api/arbitration/contracts/CTR_1/accept", "rogue"),
        ])
        .unwrap_err();
        assert!(err.contains("rogue") && err.contains("contracts"), "{err}");
        // One family's route twice is said so.
        let err = Table::new(vec![
            fam("GET", "/api/evil/{a}", "evil"),
            fam("GET", "/api/evil/{b}", "evil"),
        ])
        .unwrap_err();
        assert!(err.contains("declared twice by evil"), "{err}");
    }

    #[test]
    fn declared_routes_are_checked() {
        assert!(check("GET", "/api/x/{id}").is_ok());
        assert!(check("HEAD", "/api/x").is_err());
        assert!(check("GET", "api/x").is_err());
        assert!(check("GET", "/api/v1/x").is_err());
        assert!(check("GET", "/admin/plugins").is_err());
        assert!(check("GET", "/api/{}").is_err());
        assert!(check("GET", "/api//x").is_err());
        // Unreachable patterns: dot segments (clients remove them), bytes
        // a client must escape, one parameter named twice; the host's
        // roots.
        for bad in [
            "/api/g/../timeline",
            "/api/g/./x",
            "/api/a b",
            "/api/caf\u{e9}",
            "/api/g/{a}/{a}",
            "/metrics",
            "/metrics/x",
            "/admin",
        ] {
            assert!(check("GET", bad).is_err(), "{bad}");
        }
        for good in [
            "/",
            "/docs",
            "/.well-known/agent-card.json",
            "/api/a:b@c",
            "/_testing/ok",
        ] {
            assert!(check("GET", good).is_ok(), "{good}");
        }
    }

    #[test]
    fn a_token_in_a_path_is_never_logged() {
        let upload = fam("PUT", "/api/storage/upload/{token}", "identity");
        assert_eq!(
            upload.logged_path("/api/storage/upload/ab12cd"),
            "/api/storage/upload/{token}"
        );
        assert_eq!(
            upload.logged_path("/api/v1/storage/upload/ab12cd"),
            "/api/v1/storage/upload/{token}"
        );
        assert_eq!(upload.logged_path("/x"), "/api/storage/upload/{token}");
        let post = fam("GET", "/api/posts/{id}", "timeline");
        assert_eq!(post.logged_path("/api/posts/p1"), "/api/posts/p1");
        // No route took it: anything shaped like a token is hidden.
        let token = "ab12".repeat(16);
        assert_eq!(
            logged_unrouted(&format!("/api/storage/upload/{token}/")),
            "/api/storage/upload/{redacted}/"
        );
        assert_eq!(
            logged_unrouted("/api/nope/post_01abc"),
            "/api/nope/post_01abc"
        );
        // A cash secret a client put in a path by mistake, routed or not,
        // escaped or not.
        let secret = format!("e1.5:secret:{}", "ab".repeat(32));
        assert_eq!(
            logged_unrouted(&format!("/nope/{secret}/x")),
            "/nope/{redacted}/x"
        );
        assert_eq!(
            post.logged_path(&format!("/api/posts/{secret}")),
            "/api/posts/{redacted}"
        );
        let escaped = secret.replace(':', "%3a");
        assert_eq!(
            post.logged_path(&format!("/api/posts/{escaped}")),
            "/api/posts/{redacted}"
        );
        // Unreserved characters escaped, as routing reads them.
        let letters = format!("e1:%73ecret:{}", "ab".repeat(32));
        assert_eq!(
            logged(Some(&post), &format!("/api/posts/{letters}")),
            "/api/posts/{redacted}"
        );
        let token = "%61b12".repeat(16);
        assert_eq!(
            logged(None, &format!("/api/storage/upload/{token}")),
            "/api/storage/upload/{redacted}"
        );
        assert_eq!(
            logged(Some(&upload), &format!("/api/storage/upload/{token}")),
            "/api/storage/upload/{token}"
        );
        // Its 64 hex digits alone, or inside another word: as good as
        // the secret, never shown.
        let hex = "ab".repeat(32);
        let thread = fam("GET", "/api/thread/{post_id}", "timeline");
        for (sent, shown) in [
            (hex.clone(), "{redacted}"),
            (format!("e1_secret_{hex}"), "e1_secret_{redacted}"),
            (format!("CTR_{hex}"), "CTR_{redacted}"),
            (format!("x-{hex}-é{hex}"), "x-{redacted}-é{redacted}"),
        ] {
            assert_eq!(
                thread.logged_path(&format!("/api/v1/thread/{sent}")),
                format!("/api/v1/thread/{shown}"),
                "{sent}"
            );
            assert_eq!(
                logged_unrouted(&format!("/nope/{sent}-")),
                "/nope/{redacted}"
            );
        }
        assert_eq!(
            upload.logged_path(&format!("/api/storage/upload/{hex}")),
            "/api/storage/upload/{token}"
        );
        // 63 digits are not a key.
        let short = &hex[1..];
        assert_eq!(
            thread.logged_path(&format!("/api/thread/{short}")),
            format!("/api/thread/{short}")
        );
        assert!(holds_cash_secret("E1:SECRET:AB"));
        assert!(!holds_cash_secret("/api/posts/post_01secret"));
        // One colon escaped, the other not.
        assert!(holds_cash_secret("e1%3Asecret:ab"));
        assert!(holds_cash_secret("e1:secret%3aab"));
        assert!(!holds_cash_secret("a secret: kept"));
        assert_eq!(
            redact_secret_text(&format!(
                "paid with {secret}, change {{\"change\":\"e0.5:SECRET:ABCDEF\"}} e1%3Asecret%3A0f"
            )),
            "paid with e1.5:secret:{redacted}, change {\"change\":\"e0.5:SECRET:{redacted}\"} e1%3Asecret%3A{redacted}"
        );
        assert_eq!(redact_secret_text("no money here"), "no money here");
        // Prose is left as written: no amount before, or no hex after.
        for prose in [
            ":secret: emoji",
            "label:secret:Tuesday",
            "note:secret:deadline",
            "e1:secret: none",
            "x:secret:abc",
        ] {
            assert_eq!(redact_secret_text(prose), prose);
        }
    }

    #[test]
    fn path_decoding() {
        // In a path segment `+` stays a plus; `%2F` decodes to a slash
        // inside the one parameter instead of splitting the path.
        assert_eq!(percent_decode("a+b%20c"), "a+b c");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%FFok"), "\u{FFFD}ok");
        let pattern = "/api/posts/{post_id}/attachments/{index}";
        assert_eq!(
            param_not_utf8(pattern, "/api/posts/caf%C3%A9/attachments/1"),
            None
        );
        assert_eq!(
            param_not_utf8(pattern, "/api/posts/a%2Fb/attachments/%FF"),
            Some("index")
        );
        assert_eq!(
            param_not_utf8(pattern, "/api/posts/caf%E9/attachments/1"),
            Some("post_id")
        );
        assert_eq!(param_not_utf8("/api/%FF/{x}", "/api/%FF/ok"), None);
        match table().find("GET", "/api/posts/a%2Fb+c/attachments/1") {
            Match::Found { params, .. } => assert_eq!(
                params,
                vec![
                    ("post_id".into(), "a/b+c".into()),
                    ("index".into(), "1".into())
                ]
            ),
            m => panic!("{m:?}"),
        }
    }
}
