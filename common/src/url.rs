//! Absolute URLs of answers, from the request's `Host`.

/// Whether a `Host` value looks like `host[:port]` (a name, an IPv4 or a
/// bracketed IPv6 literal): nothing that could break out of a URL.
pub fn plausible_host(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 255
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
}

/// `http(s)://{host}` from a request's `Host` (the scheme from
/// `X-Forwarded-Proto`), or "" (so URLs stay relative) when the host is
/// absent or implausible.
pub fn base_url(host: Option<&str>, forwarded_proto: Option<&str>) -> String {
    let Some(host) = host.map(str::trim).filter(|h| plausible_host(h)) else {
        return String::new();
    };
    let scheme = match forwarded_proto {
        Some(p) if p.trim().eq_ignore_ascii_case("https") => "https",
        _ => "http",
    };
    format!("{scheme}://{host}")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
