//! Absolute URLs of answers, from the request's `Host`, and the decoding
//! of a request's query.

/// Whether a `Host` value is `host[:port]`: a name or IPv4 address of
/// letters, digits and `-._~`, or a bracketed IP literal, and a port of at
/// most 65535 (or none, or empty as RFC 3986 allows). Nothing that could
/// break out of a URL. The HTTP server refuses any other (400), and
/// absolute URLs are made from it. Checked in place (it runs per request).
pub fn plausible_host(h: &str) -> bool {
    plausible_host_bytes(h.as_bytes())
}

/// [`plausible_host`] of a header value's bytes (every byte it accepts is
/// visible ASCII: no UTF-8 check is needed before it).
pub fn plausible_host_bytes(h: &[u8]) -> bool {
    if h.is_empty() || h.len() > 255 {
        return false;
    }
    let (name, port) = match h.strip_prefix(b"[") {
        Some(rest) => {
            let Some(end) = rest.iter().position(|&b| b == b']') else {
                return false;
            };
            let literal = &rest[..end];
            if literal.is_empty()
                || !literal
                    .iter()
                    .all(|b| b.is_ascii_hexdigit() || b":.".contains(b))
            {
                return false;
            }
            match &rest[end + 1..] {
                [] => return true,
                [b':', port @ ..] => (&b"x"[..], port),
                _ => return false,
            }
        }
        None => match h.iter().rposition(|&b| b == b':') {
            Some(colon) => (&h[..colon], &h[colon + 1..]),
            None => (h, &b""[..]),
        },
    };
    !name.is_empty() && name.iter().all(|&b| HOST_NAME_BYTE[usize::from(b)]) && port_number(port)
}

/// The bytes of a host name or IPv4 address in a `Host`: letters, digits
/// and `-._~` (a table: it runs per request).
const HOST_NAME_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_' | b'~');
        b += 1;
    }
    table
};

/// Whether `port` is digits of at most 65535 (empty: none).
fn port_number(port: &[u8]) -> bool {
    let mut value = 0u32;
    for &b in port {
        if !b.is_ascii_digit() {
            return false;
        }
        value = value * 10 + u32::from(b - b'0');
        if value > u32::from(u16::MAX) {
            return false;
        }
    }
    true
}

/// A route pattern (or a path template) with its `{name}` segments made
/// anonymous: two patterns of one shape match the same paths, whatever
/// their parameters are called.
pub fn pattern_shape(pattern: &str) -> String {
    pattern
        .split('/')
        .map(|s| {
            if s.starts_with('{') && s.ends_with('}') {
                "{}"
            } else {
                s
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// Whether a request of `method` (upper case) only reads: GET, its HEAD,
/// and OPTIONS never get a write transaction, whatever a route declares.
pub fn read_only_method(method: &str) -> bool {
    matches!(method, "GET" | "HEAD" | "OPTIONS")
}

/// Decode one name or value of an `application/x-www-form-urlencoded`
/// query (`+` is a space; an invalid escape is kept as written); `None`
/// when its escapes decode to bytes that are not UTF-8.
fn query_component(s: &str) -> Option<String> {
    let decode = |s: &str| {
        percent_encoding::percent_decode_str(s)
            .decode_utf8()
            .ok()
            .map(|d| d.into_owned())
    };
    if s.contains('+') {
        decode(&s.replace('+', " "))
    } else {
        decode(s)
    }
}

/// The index of the first of `pairs` whose name an earlier pair has too,
/// among the names `counted` takes: a parameter given more than once.
/// O(n log n): a query of 32,000 parameters, each compared with all before
/// it, took a second of the MCP family's `execute` (an outside audit).
/// (A `BTreeSet`: a hash set's random keys would need the guests' WASI.)
pub fn first_repeated(pairs: &[(String, String)], counted: impl Fn(&str) -> bool) -> Option<usize> {
    let mut seen = std::collections::BTreeSet::new();
    pairs
        .iter()
        .position(|(name, _)| counted(name) && !seen.insert(name.as_str()))
}

/// A query string as ordered, decoded pairs (empty pairs skipped, only
/// the first `=` splits). A name or value whose escapes are not UTF-8
/// (`%E9` of Latin-1) is malformed, never silently replaced: `Err` with the
/// parameter's name (its bytes replaced, for the error message).
pub fn parse_query(q: &str) -> Result<Vec<(String, String)>, String> {
    let mut pairs = Vec::new();
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match (query_component(name), query_component(value)) {
            (Some(n), Some(v)) => pairs.push((n, v)),
            _ => {
                let name = percent_encoding::percent_decode_str(&name.replace('+', " "))
                    .decode_utf8_lossy()
                    .into_owned();
                return Err(name);
            }
        }
    }
    Ok(pairs)
}

/// `http(s)://{host}` from a request's `Host` (the scheme from
/// `X-Forwarded-Proto`), or "" (so URLs stay relative) when the host is
/// absent or implausible.
pub fn base_url(host: Option<&str>, forwarded_proto: Option<&str>) -> String {
    let Some(host) = host.map(str::trim).filter(|h| plausible_host(h)) else {
        return String::new();
    };
    // Proxies in a chain may each append theirs (`https, http`): the
    // first is the scheme the client used.
    let first = forwarded_proto.and_then(|p| p.split(',').next());
    let scheme = match first {
        Some(p) if p.trim().eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

/// The path routes are matched against: escapes of unreserved characters
/// decoded, and the `/api/v1` compatibility alias folded onto `/api`.
pub fn canonical_path(path: &str) -> String {
    let unescaped = unreserved_unescaped(path);
    let path = unescaped.as_deref().unwrap_or(path);
    match path.strip_prefix("/api/v1") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => format!("/api{rest}"),
        _ => path.to_string(),
    }
}

/// `path` with its escapes of unreserved characters (letters, digits,
/// `-._~`) decoded, which RFC 3986 6.2.2.2 makes the same path as the
/// characters themselves (`/api/%68ealth` is `/api/health`); None when
/// there is none to decode. Other escapes stay as sent, for the route's
/// parameters to decode once (`%2F` stays a slash within a segment). A
/// path with a `%` that begins no escape is left alone: decoding around
/// it could make a new escape of it (`%%34%31`).
pub fn unreserved_unescaped(path: &str) -> Option<String> {
    if !path.contains('%') {
        return None;
    }
    let bytes = path.as_bytes();
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut decoded = Vec::new();
    let mut escapes = false;
    let mut i = 0;
    while let Some(at) = bytes[i..].iter().position(|&b| b == b'%') {
        let at = i + at;
        let (Some(hi), Some(lo)) = (
            bytes.get(at + 1).copied().and_then(hex),
            bytes.get(at + 2).copied().and_then(hex),
        ) else {
            return None;
        };
        let c = hi << 4 | lo;
        decoded.extend_from_slice(&bytes[i..at]);
        if c.is_ascii_alphanumeric() || b"-._~".contains(&c) {
            decoded.push(c);
            escapes = true;
        } else {
            decoded.extend_from_slice(&bytes[at..at + 3]);
        }
        i = at + 3;
    }
    decoded.extend_from_slice(&bytes[i..]);
    // Only ASCII was put in place of ASCII escapes: still UTF-8.
    escapes.then(|| String::from_utf8(decoded).expect("ASCII replaced ASCII"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_of_unreserved_characters_are_the_characters() {
        assert_eq!(canonical_path("/api/%68ealth"), "/api/health");
        assert_eq!(canonical_path("/%61pi/v%31/h%65alth"), "/api/health");
        assert_eq!(canonical_path("/api/%7e%2D%2e%5F"), "/api/~-._");
        // Reserved characters and other bytes stay escaped, once.
        assert_eq!(
            canonical_path("/api/posts/a%2Fb%20c"),
            "/api/posts/a%2Fb%20c"
        );
        assert_eq!(canonical_path("/api/x%2541"), "/api/x%2541");
        assert_eq!(canonical_path("/api/caf%C3%A9"), "/api/caf%C3%A9");
        // A `%` that begins no escape leaves the path as sent.
        assert_eq!(canonical_path("/api/%%34%31"), "/api/%%34%31");
        assert_eq!(canonical_path("/api/%6"), "/api/%6");
        assert_eq!(canonical_path("/api/health%"), "/api/health%");
    }

    #[test]
    fn a_patterns_shape_ignores_its_parameters_names() {
        assert_eq!(pattern_shape("/api/c/{id}/status"), "/api/c/{}/status");
        assert_eq!(
            pattern_shape("/api/c/{contract_id}/status"),
            "/api/c/{}/status"
        );
        assert_eq!(pattern_shape("/api/c/buy"), "/api/c/buy");
        assert_eq!(pattern_shape("/api/{a}/{b}"), "/api/{}/{}");
    }

    #[test]
    fn the_first_repeated_pair_is_found_among_the_counted_names() {
        let q = parse_query("a=1&b=2&a=3&c=&c=").unwrap();
        assert_eq!(first_repeated(&q, |_| true), Some(2));
        assert_eq!(first_repeated(&q, |n| n == "c"), Some(4));
        assert_eq!(first_repeated(&q, |n| n == "b"), None);
        assert_eq!(first_repeated(&[], |_| true), None);
        // Many parameters: the repeat is still the first one found.
        let mut many: Vec<(String, String)> = (0..40_000)
            .map(|i| (format!("p{i}"), String::new()))
            .collect();
        assert_eq!(first_repeated(&many, |_| true), None);
        many.push(("p39999".into(), String::new()));
        many.push(("p7".into(), String::new()));
        assert_eq!(first_repeated(&many, |_| true), Some(40_000));
    }

    #[test]
    fn base_urls_come_from_sane_hosts_only() {
        assert_eq!(
            base_url(Some("a.example:8080"), None),
            "http://a.example:8080"
        );
        assert_eq!(
            base_url(Some("[::1]:80"), Some("HTTPS")),
            "https://[::1]:80"
        );
        assert_eq!(base_url(Some("evil/path"), None), "");
        assert_eq!(base_url(Some(""), None), "");
        assert_eq!(base_url(None, Some("https")), "");
        // A chain of proxies: the first one's scheme, the client's.
        assert_eq!(
            base_url(Some("a.example"), Some("https, http")),
            "https://a.example"
        );
        assert_eq!(
            base_url(Some("a.example"), Some("http,https")),
            "http://a.example"
        );
    }

    #[test]
    fn hosts() {
        for good in [
            "market.example",
            "127.0.0.1:8080",
            "[::1]",
            "[::1]:8080",
            "localhost:1",
            "a-b.example.com:65535",
            "a.example:",
            "under_score.example",
            "h:0065535",
            "t~x.example:0",
        ] {
            assert!(plausible_host(good), "{good:?}");
        }
        for bad in [
            "",
            "a b",
            "user@host",
            "host:port",
            "host:70000",
            "host:+80",
            "a/b",
            "a'b.example",
            "a,b",
            "[::1",
            "[]",
            "[::1]x",
            ":80",
            "\u{e9}.example",
            "a%41",
            "host:65536",
            "host:99999999999999999999",
            "a\tb",
            "[::1]:x",
        ] {
            assert!(!plausible_host(bad), "{bad:?}");
        }
    }

    #[test]
    fn query_decoding() {
        assert_eq!(
            parse_query("term=a+b%21&limit=20&x&bad=%zz%4"),
            Ok(vec![
                ("term".into(), "a b!".into()),
                ("limit".into(), "20".into()),
                ("x".into(), "".into()),
                ("bad".into(), "%zz%4".into())
            ])
        );
        // `+` is a space and `%2B` a plus; `%2F` is a slash; only the first
        // `=` splits; UTF-8 escapes decode.
        assert_eq!(
            parse_query("q=1%2B1+%3D+2&path=a%2Fb&eq=x=y&u=caf%C3%A9&&"),
            Ok(vec![
                ("q".into(), "1+1 = 2".into()),
                ("path".into(), "a/b".into()),
                ("eq".into(), "x=y".into()),
                ("u".into(), "caf\u{e9}".into())
            ])
        );
        // Escapes of bytes that are not UTF-8, in a value or a name: the
        // parameter is named, nothing is replaced.
        assert_eq!(parse_query("limit=2&term=caf%E9"), Err("term".into()));
        assert_eq!(parse_query("t%FF=1"), Err("t\u{FFFD}".into()));
    }
}
