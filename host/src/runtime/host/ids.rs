//! `ids`: ULIDs, random bytes and the client's key.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::ids;

impl ids::Host for Ctx {
    fn ulid(&mut self) -> String {
        match &self.rt {
            Some(rt) => rt.ids.ulid_at(rt.now_ms()),
            None => String::new(),
        }
    }

    fn random_bytes(&mut self, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len.min(4096) as usize];
        crate::ids::fill_random(&mut buf);
        buf
    }

    fn client(&mut self) -> String {
        match (&self.rt, self.source) {
            (Some(rt), Some(ip)) => client_of(&rt.ledger, &self.family, ip),
            _ => String::new(),
        }
    }
}

/// The key `family` knows a client address by: the first half of an
/// HMAC of the family and the address as per-address limits count it
/// ([`crate::ids::client_key`]), under a key of its own derived from the
/// server key (no purpose the ledger derives money from is
/// `client-keys`: theirs all hold a `:`). Each family has its own, so two
/// families cannot tell that one client called both.
fn client_of(ledger: &crate::money::ledger::Ledger, family: &str, ip: std::net::IpAddr) -> String {
    use hmac::{Hmac, Mac};
    let key = ledger.derive(b"client-keys");
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key.as_bytes()).expect("any key length");
    mac.update(family.as_bytes());
    mac.update(b"\0");
    mac.update(crate::ids::client_key(ip).to_string().as_bytes());
    marketplace_common::hex::encode(&mac.finalize().into_bytes()[..16])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_known_by_its_address_as_limits_count_it() {
        let ledger = crate::money::ledger::Ledger::from_hex(&"ab".repeat(32)).unwrap();
        let other = crate::money::ledger::Ledger::from_hex(&"cd".repeat(32)).unwrap();
        let of =
            |l: &crate::money::ledger::Ledger, ip: &str| client_of(l, "mcp", ip.parse().unwrap());
        let a = of(&ledger, "192.0.2.1");
        assert_eq!(a.len(), 32);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!a.contains("192"));
        assert_eq!(a, of(&ledger, "::ffff:192.0.2.1"));
        assert_ne!(a, of(&ledger, "192.0.2.2"));
        assert_ne!(a, of(&other, "192.0.2.1"), "keyed by the server key");
        assert_ne!(
            a,
            client_of(&ledger, "timeline", "192.0.2.1".parse().unwrap()),
            "per family"
        );
        // One IPv6 /64 is one client.
        assert_eq!(
            of(&ledger, "2001:db8:1:2::1"),
            of(&ledger, "2001:db8:1:2:ffff::9")
        );
        assert_ne!(
            of(&ledger, "2001:db8:1:2::1"),
            of(&ledger, "2001:db8:1:3::1")
        );
    }
}
