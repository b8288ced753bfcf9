//! Identifiers and time formatting.

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

/// Fill `buf` from the operating system's CSPRNG.
pub fn fill_random(buf: &mut [u8]) {
    getrandom::fill(buf).expect("operating system random source");
}

/// RFC 3339 UTC with second precision, e.g. `2026-11-22T03:04:05Z`.
pub fn rfc3339(t: SystemTime) -> String {
    rfc3339_ms(t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64)
}

/// RFC 3339 UTC of a millisecond timestamp.
pub fn rfc3339_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_known_values() {
        assert_eq!(rfc3339_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339_ms(1_795_316_645_000), "2026-11-22T03:04:05Z");
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
