//! A request's client address behind reverse proxies (`trusted_proxies`).
//!
//! A request whose connection comes from a trusted proxy is taken to come
//! from the address the proxies name in `X-Forwarded-For`: read from the
//! right (each proxy appends the address it got the request from), past
//! every trusted one, to the first that is not; that address is the
//! client's, whatever a client wrote to the left of it (a client can put
//! anything there). An entry that is not an address (`unknown`, a name, a
//! hidden one) ends the walk at the proxy that wrote it, and so does a
//! list longer than [`MAX_HOPS`]. A request from anywhere else is its
//! connection's peer's, whatever its headers say.
//!
//! The client address is what long calls count against (`max_long_calls_per_ip`)
//! and what the access log shows. Connections are counted by their peer
//! (`max_connections_per_ip`): a proxy's connections are its own.

use crate::config::TrustedProxies;
use std::net::{IpAddr, SocketAddr};

/// With `trusted_proxies` set, what only a proxy may say: the scheme
/// clients used (`X-Forwarded-Proto`, read for the absolute URLs of
/// answers) is dropped from a request that did not come through one.
/// Without the setting it is read from any client, as before it existed
/// (a client can then change only its own answers' URLs).
pub fn drop_unproxied(trusted: &TrustedProxies, peer: IpAddr, headers: &mut hyper::HeaderMap) {
    if !trusted.is_empty() && !trusted.contains(peer) {
        headers.remove("x-forwarded-proto");
    }
}

/// Most entries of `X-Forwarded-For` read (from the right).
pub const MAX_HOPS: usize = 32;

/// The client of a request from `peer` with these headers.
pub fn client(trusted: &TrustedProxies, peer: IpAddr, headers: &hyper::HeaderMap) -> IpAddr {
    let mut client = peer.to_canonical();
    if !trusted.contains(client) {
        return client;
    }
    let mut hops = 0;
    for value in headers.get_all("x-forwarded-for").iter().rev() {
        // Entry by entry: bytes that are no text in an entry a client
        // wrote (a proxy appends to the client's own header) end the walk
        // only when it gets there.
        for entry in value.as_bytes().rsplit(|&b| b == b',') {
            hops += 1;
            let Some(addr) = std::str::from_utf8(entry)
                .ok()
                .and_then(|e| address(e.trim()))
                .filter(|_| hops <= MAX_HOPS)
            else {
                return client;
            };
            client = addr;
            if !trusted.contains(addr) {
                return client;
            }
        }
    }
    client
}

/// An entry of `X-Forwarded-For`: an address, or one with a port
/// (`192.0.2.7:4711`, `[2001:db8::7]:4711`) or in brackets
/// (`[2001:db8::7]`), as some proxies write it.
fn address(entry: &str) -> Option<IpAddr> {
    let bare = entry
        .strip_prefix('[')
        .and_then(|e| e.strip_suffix(']'))
        .unwrap_or(entry);
    bare.parse::<IpAddr>()
        .or_else(|_| entry.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|a| a.to_canonical())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(list: &str) -> TrustedProxies {
        TrustedProxies::parse(list.split(',')).unwrap()
    }

    fn from(trusted_list: &str, peer: &str, forwarded: &[&str]) -> String {
        let mut headers = hyper::HeaderMap::new();
        for value in forwarded {
            headers.append("x-forwarded-for", value.parse().unwrap());
        }
        client(&trusted(trusted_list), peer.parse().unwrap(), &headers).to_string()
    }

    #[test]
    fn a_peer_that_is_not_a_proxy_is_the_client_whatever_it_says() {
        assert_eq!(
            from("10.0.0.1", "192.0.2.7", &["198.51.100.1"]),
            "192.0.2.7"
        );
        let none = TrustedProxies::default();
        let mut headers = hyper::HeaderMap::new();
        headers.insert("x-forwarded-for", "198.51.100.1".parse().unwrap());
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        assert_eq!(client(&none, peer, &headers), peer);
    }

    #[test]
    fn only_a_proxy_says_the_scheme_once_proxies_are_named() {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("x-forwarded-proto", "https".parse().unwrap());
        let direct: IpAddr = "192.0.2.7".parse().unwrap();
        let proxy: IpAddr = "10.0.0.1".parse().unwrap();
        drop_unproxied(&TrustedProxies::default(), direct, &mut headers);
        assert!(headers.contains_key("x-forwarded-proto"));
        drop_unproxied(&trusted("10.0.0.1"), proxy, &mut headers);
        assert!(headers.contains_key("x-forwarded-proto"));
        drop_unproxied(&trusted("10.0.0.1"), direct, &mut headers);
        assert!(!headers.contains_key("x-forwarded-proto"));
    }

    #[test]
    fn a_proxy_names_its_client() {
        assert_eq!(
            from("10.0.0.1", "10.0.0.1", &["198.51.100.1"]),
            "198.51.100.1"
        );
        // Nothing named: the proxy itself.
        assert_eq!(from("10.0.0.1", "10.0.0.1", &[]), "10.0.0.1");
        // An IPv4 peer on an IPv6 socket.
        assert_eq!(
            from("10.0.0.1", "::ffff:10.0.0.1", &["198.51.100.1"]),
            "198.51.100.1"
        );
    }

    #[test]
    fn the_walk_passes_trusted_hops_and_stops_at_the_first_other() {
        // The client wrote the leftmost entry itself: not believed.
        assert_eq!(
            from(
                "10.0.0.0/8",
                "10.0.0.1",
                &["203.0.113.66, 198.51.100.1, 10.1.2.3"]
            ),
            "198.51.100.1"
        );
        // Several headers read as one list, in order.
        assert_eq!(
            from(
                "10.0.0.0/8",
                "10.0.0.1",
                &["203.0.113.66", "198.51.100.1", "10.1.2.3"]
            ),
            "198.51.100.1"
        );
        // All trusted: the farthest.
        assert_eq!(
            from("10.0.0.0/8", "10.0.0.1", &["10.9.9.9, 10.1.2.3"]),
            "10.9.9.9"
        );
    }

    #[test]
    fn ports_and_ipv6_are_read() {
        assert_eq!(
            from("10.0.0.1", "10.0.0.1", &["198.51.100.1:4711"]),
            "198.51.100.1"
        );
        assert_eq!(
            from("10.0.0.1", "10.0.0.1", &["[2001:db8::7]:4711"]),
            "2001:db8::7"
        );
        assert_eq!(from("::1", "::1", &["2001:db8::7"]), "2001:db8::7");
        assert_eq!(
            from("10.0.0.1", "10.0.0.1", &["[2001:db8::7]"]),
            "2001:db8::7"
        );
    }

    #[test]
    fn bytes_that_are_no_text_in_a_clients_entry_do_not_hide_it() {
        // nginx and Envoy append the address they saw to the client's own
        // header value.
        let mut headers = hyper::HeaderMap::new();
        headers.insert(
            "x-forwarded-for",
            hyper::header::HeaderValue::from_bytes(b"\xff\xfe, 198.51.100.1").unwrap(),
        );
        let peer: IpAddr = "10.0.0.1".parse().unwrap();
        let client = client(&trusted("10.0.0.1"), peer, &headers);
        assert_eq!(client.to_string(), "198.51.100.1");
    }

    #[test]
    fn an_entry_that_is_no_address_ends_the_walk_at_its_writer() {
        assert_eq!(
            from("10.0.0.0/8", "10.0.0.1", &["198.51.100.1, unknown"]),
            "10.0.0.1"
        );
        assert_eq!(
            from("10.0.0.0/8", "10.0.0.1", &["unknown, 10.1.2.3"]),
            "10.1.2.3"
        );
        assert_eq!(
            from("10.0.0.0/8", "10.0.0.1", &["198.51.100.1,,"]),
            "10.0.0.1"
        );
        assert_eq!(from("10.0.0.0/8", "10.0.0.1", &[""]), "10.0.0.1");
    }

    #[test]
    fn a_long_list_is_read_only_so_far() {
        let mut list = vec!["198.51.100.1"];
        list.extend(std::iter::repeat_n("10.1.2.3", MAX_HOPS));
        let list = list.join(",");
        assert_eq!(from("10.0.0.0/8", "10.0.0.1", &[&list]), "10.1.2.3");
        let short = list.split_once(',').unwrap().1.split_once(',').unwrap().1;
        let list = format!("198.51.100.1,{short}");
        assert_eq!(from("10.0.0.0/8", "10.0.0.1", &[&list]), "198.51.100.1");
    }
}
