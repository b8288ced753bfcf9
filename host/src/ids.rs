//! Identifiers and time formatting, and the client key per-address
//! limits count by.

use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Monotonic ULID generator: within one millisecond the random part is
/// incremented, so ids sort in creation order.
#[derive(Default)]
pub struct IdGen {
    last: Mutex<(u64, u128)>,
}

impl IdGen {
    /// A new ULID for the time `ms` (milliseconds since the epoch).
    pub fn ulid_at(&self, ms: u64) -> String {
        let mut last = self.last.lock().expect("ulid lock");
        let random = if ms <= last.0 {
            // Same (or earlier, clock moved back) millisecond: keep order.
            last.1 = last.1.wrapping_add(1) & ((1u128 << 80) - 1);
            last.1
        } else {
            let mut bytes = [0u8; 16];
            fill_random(&mut bytes);
            let r = u128::from_be_bytes(bytes) & ((1u128 << 79) - 1);
            *last = (ms, r);
            r
        };
        let ms = ms.max(last.0);
        let value = ((ms as u128) << 80) | random;
        (0..26)
            .rev()
            .map(|i| CROCKFORD[((value >> (i * 5)) & 31) as usize] as char)
            .collect()
    }
}

/// Bytes of the operating system's CSPRNG fetched by one `getrandom` call.
const RANDOM_POOL: usize = 256;

thread_local! {
    /// This thread's unused random bytes: `.0[.1..]` (empty at first).
    static POOL: std::cell::RefCell<([u8; RANDOM_POOL], usize)> =
        const { std::cell::RefCell::new(([0; RANDOM_POOL], RANDOM_POOL)) };
}

/// Fill `buf` from the operating system's CSPRNG. Requests of up to 64
/// bytes are served from a per-thread pool that one `getrandom` call
/// refills (a paid post asked two to three times, each a system call);
/// each byte is handed out once and zeroed in the pool as it goes.
pub fn fill_random(buf: &mut [u8]) {
    if buf.len() > RANDOM_POOL / 4 {
        getrandom::fill(buf).expect("operating system random source");
        return;
    }
    POOL.with_borrow_mut(|(pool, next)| {
        if RANDOM_POOL - *next < buf.len() {
            getrandom::fill(pool).expect("operating system random source");
            *next = 0;
        }
        let taken = &mut pool[*next..*next + buf.len()];
        buf.copy_from_slice(taken);
        taken.fill(0);
        *next += buf.len();
    });
}

/// RFC 3339 UTC with second precision, e.g. `2026-11-22T03:04:05Z`.
pub fn rfc3339(t: SystemTime) -> String {
    marketplace_common::time::rfc3339(
        t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
    )
}

/// Seconds since the Unix epoch, now.
pub fn unix_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The key by which per-address limits count a client (connections,
/// long calls, pending bodies, unsent answers): an IPv4 address (one
/// mapped into IPv6 too), or an IPv6 address's /64 network, which one
/// customer is usually given whole, so that the 2^64 addresses of one
/// network are one client to the limits. Prefixes that carry another
/// client's IPv4 address in them count by it, since every IPv4 client of
/// an IPv6-only server behind a translator (RFC 6052, 8215), or of one
/// Teredo server (RFC 4380), shares a /64: `64:ff9b::/96` as that IPv4
/// address; the local-use `64:ff9b:1::/48`, whose prefix length varies,
/// as the whole address; Teredo's `2001::/32` as the last 32 bits,
/// inverted.
pub fn client_key(ip: std::net::IpAddr) -> std::net::IpAddr {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let IpAddr::V6(v6) = ip else {
        return ip;
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        return IpAddr::V4(v4);
    }
    let bits = u128::from(v6);
    let low = bits as u32;
    if bits >> 32 == 0x0064_ff9b_0000_0000_0000_0000 {
        return IpAddr::V4(Ipv4Addr::from(low));
    }
    // The local-use prefix takes any RFC 6052 length (/48 to /96), which
    // places the IPv4 address differently: the whole address, one to one
    // with it, is the key.
    if bits >> 80 == 0x0064_ff9b_0001 {
        return ip;
    }
    if bits >> 96 == 0x2001_0000 {
        return IpAddr::V4(Ipv4Addr::from(!low));
    }
    IpAddr::V6(Ipv6Addr::from(bits & !((1u128 << 64) - 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_an_ipv4_address_or_an_ipv6_network() {
        let key = |s: &str| client_key(s.parse().unwrap()).to_string();
        assert_eq!(key("192.0.2.7"), "192.0.2.7");
        assert_eq!(key("::ffff:192.0.2.7"), "192.0.2.7");
        assert_eq!(key("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::");
        assert_eq!(key("2001:db8:1:3::1"), "2001:db8:1:3::");
        // IPv4 clients through a translator, or by Teredo, are their IPv4
        // addresses, not one /64 for all.
        assert_eq!(key("64:ff9b::192.0.2.7"), "192.0.2.7");
        assert_eq!(key("64:ff9b::198.51.100.1"), "198.51.100.1");
        assert_eq!(key("64:ff9b:1:2::203.0.113.9"), "64:ff9b:1:2::cb00:7109");
        // 192.0.2.45 under a /48 of the local-use prefix (RFC 6052 2.2).
        assert_eq!(key("64:ff9b:1:c000:2:2d00::"), "64:ff9b:1:c000:2:2d00::");
        // RFC 4380's example: server 65.54.227.120, client 192.0.2.45.
        assert_eq!(key("2001:0:4136:e378:8000:63bf:3fff:fdd2"), "192.0.2.45");
        // Near them, ordinary /64s.
        assert_eq!(key("64:ff9b:0:0:1::1"), "64:ff9b::");
        assert_eq!(key("2001:1::1"), "2001:1::");
    }

    #[test]
    fn random_bytes_are_never_handed_out_twice() {
        // Draws of every size up to past the pool's limit, many times over
        // the pool: no 16-byte draw repeats another, and none is all zeros.
        let mut seen = std::collections::HashSet::new();
        for i in 0..4_000usize {
            let mut b = vec![0u8; 16 + i % 80];
            fill_random(&mut b);
            assert!(b.iter().any(|&x| x != 0), "draw {i} is all zeros");
            assert!(
                seen.insert(b[..16].to_vec()),
                "draw {i} repeats an earlier one"
            );
        }
        // Another thread has a pool of its own.
        let there = std::thread::spawn(|| {
            let mut b = [0u8; 16];
            fill_random(&mut b);
            b
        })
        .join()
        .unwrap();
        assert!(seen.insert(there.to_vec()));
    }

    #[test]
    fn ulids_are_26_chars_and_sorted() {
        let g = IdGen::default();
        let ids: Vec<String> = (0..1000).map(|i| g.ulid_at(1_000 + i / 100)).collect();
        assert!(ids.iter().all(|id| id.len() == 26));
        let mut sorted = ids.clone();
        sorted.sort();
        assert_eq!(ids, sorted);
        sorted.dedup();
        assert_eq!(sorted.len(), ids.len());
    }
}
