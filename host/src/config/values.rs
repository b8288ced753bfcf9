//! The settings with a syntax of their own: `trusted_proxies` and
//! `public_url`.

use anyhow::Result;
use serde::Deserialize;

/// `trusted_proxies`: addresses and networks, written in TOML as a list
/// or as one comma-separated string (as an environment variable is).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<ipnet::IpNet>);

impl TrustedProxies {
    /// Parse `10.0.0.0/8`, `192.0.2.7` or `2001:db8::/32` entries.
    pub fn parse<'a>(entries: impl IntoIterator<Item = &'a str>) -> Result<TrustedProxies> {
        let mut nets = Vec::new();
        for entry in entries {
            let entry = entry.trim();
            let net = match entry.parse::<std::net::IpAddr>() {
                Ok(addr) => ipnet::IpNet::from(addr),
                Err(_) => entry.parse::<ipnet::IpNet>().map_err(|_| {
                    anyhow::anyhow!(
                        "trusted_proxies: {entry:?} is not an address or a network (e.g. 10.0.0.1 or 10.0.0.0/8)"
                    )
                })?,
            };
            nets.push(canonical(net));
        }
        Ok(TrustedProxies(nets))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `addr` (an IPv4 address written as IPv6 too) is a proxy's.
    pub fn contains(&self, addr: std::net::IpAddr) -> bool {
        let addr = addr.to_canonical();
        self.0.iter().any(|net| net.contains(&addr))
    }
}

/// IPv4 written as IPv6 (`::ffff:10.0.0.0/104`) as the IPv4 network it
/// is, since addresses are matched in their IPv4 form.
fn canonical(net: ipnet::IpNet) -> ipnet::IpNet {
    match net {
        ipnet::IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96).map_or(net, ipnet::IpNet::V4),
            None => net,
        },
        _ => net,
    }
}

impl<'de> Deserialize<'de> for TrustedProxies {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            One(String),
            List(Vec<String>),
        }
        let written = Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "trusted_proxies must be a string of addresses and networks separated by commas, or a list of them",
            )
        })?;
        let entries: Vec<String> = match written {
            Written::One(text) if text.trim().is_empty() => Vec::new(),
            Written::One(text) => text.split(',').map(str::to_string).collect(),
            Written::List(list) => list,
        };
        TrustedProxies::parse(entries.iter().map(String::as_str))
            .map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}

/// `public_url`: `http(s)://host[:port]`, no path (the service's routes
/// are at the root). Components and the host make absolute URLs from a
/// request's `Host` and `X-Forwarded-Proto`, so with it set those two
/// headers are given as it says ([`PublicUrl::apply`]); it is also the
/// `mcp` family's `public_url` unless `[settings.mcp]` names another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicUrl {
    /// `http` or `https`.
    pub scheme: String,
    /// `host[:port]`.
    pub authority: String,
}

impl PublicUrl {
    pub fn parse(url: &str) -> Result<PublicUrl> {
        let problem = |why: &str| {
            anyhow::anyhow!(
                "public_url {url:?} {why}: give the origin clients use, e.g. https://market.example"
            )
        };
        let uri: ureq::http::Uri = url.trim().parse().map_err(|_| problem("is not a URL"))?;
        let scheme = match uri.scheme_str() {
            Some(s) if s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https") => {
                s.to_ascii_lowercase()
            }
            _ => return Err(problem("must start with http:// or https://")),
        };
        let authority = uri.authority().ok_or_else(|| problem("has no host"))?;
        if authority.as_str().contains('@') {
            return Err(problem("must have no user name"));
        }
        if authority.as_str().ends_with(':') {
            return Err(problem("has an empty port"));
        }
        // As browsers write an origin: the default port left out.
        let default_port = if scheme == "https" { 443 } else { 80 };
        let host = authority.host().to_ascii_lowercase();
        let authority = match authority.port_u16() {
            Some(port) if port != default_port => format!("{host}:{port}"),
            _ => host,
        };
        if !marketplace_common::url::plausible_host(&authority) {
            return Err(problem("has no host"));
        }
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() || url.contains('#') {
            return Err(problem("must have no path, query or fragment"));
        }
        Ok(PublicUrl { scheme, authority })
    }

    /// Give `headers` (a request's, as components see them) the `Host` and
    /// `X-Forwarded-Proto` of this URL instead of the client's.
    pub fn apply(&self, headers: &mut Vec<(String, String)>) {
        headers.retain(|(name, _)| {
            !name.eq_ignore_ascii_case("host") && !name.eq_ignore_ascii_case("x-forwarded-proto")
        });
        headers.push(("host".into(), self.authority.clone()));
        headers.push(("x-forwarded-proto".into(), self.scheme.clone()));
    }
}

impl std::fmt::Display for PublicUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}", self.scheme, self.authority)
    }
}

impl<'de> Deserialize<'de> for PublicUrl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        PublicUrl::parse(&text).map_err(|e| serde::de::Error::custom(format!("{e:#}")))
    }
}
