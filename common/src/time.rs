//! RFC 3339 UTC formatting and parsing over epoch milliseconds, on the
//! `time` crate; shared by the host and the plugins.

use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// `2026-11-22T03:04:05Z` for epoch milliseconds (second precision; the
/// milliseconds are dropped). Instants past 9999-12-31T23:59:59Z, which
/// RFC 3339 cannot write, are clamped to it.
pub fn rfc3339(ms: u64) -> String {
    // 9999-12-31T23:59:59Z: clamped here rather than left to the `time`
    // crate, whose range depends on its `large-dates` feature, which
    // another crate of a build may turn on.
    const LAST: i64 = 253_402_300_799;
    let secs = i64::try_from(ms / 1000).unwrap_or(LAST).min(LAST);
    OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|at| at.format(&Rfc3339).ok())
        .unwrap_or_else(|| "9999-12-31T23:59:59Z".to_string())
}

/// Parse `2026-12-01T00:00:00Z` (optional fraction, `Z` or `+hh:mm`,
/// separator `T`, `t` or a space) into epoch milliseconds. Impossible dates
/// and times (February 31, hour 24, a leap second other than at the end of
/// a UTC month) and instants before 1970 are `None`.
pub fn parse_rfc3339(s: &str) -> Option<u64> {
    u64::try_from(parse_rfc3339_signed(s)?).ok()
}

/// As [`parse_rfc3339`], instants before 1970 included (negative), for
/// telling a time in the past from one that is no time at all.
pub fn parse_rfc3339_signed(s: &str) -> Option<i128> {
    // The `time` crate takes any byte as the date/time separator.
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't' | b' ')) {
        return None;
    }
    let at = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    // The instant whatever its offset: no conversion to UTC, which panics
    // past the year 9999 (`9999-12-31T23:59:59-00:01`). Milliseconds
    // rounded down, before 1970 too.
    Some(at.unix_timestamp_nanos().div_euclid(1_000_000))
}

/// As [`parse_rfc3339_signed`], for a JSON Schema `date-time`: RFC 3339's
/// grammar, `T` or `t` between date and time (not the space its note
/// allows, which recovery challenges take).
pub fn parse_date_time_signed(s: &str) -> Option<i128> {
    if !matches!(s.as_bytes().get(10), Some(b'T' | b't')) {
        return None;
    }
    parse_rfc3339_signed(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_known_values() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_316_645_000), "2026-11-22T03:04:05Z");
        // Milliseconds are not written.
        assert_eq!(rfc3339(1_795_316_645_999), "2026-11-22T03:04:05Z");
        assert_eq!(rfc3339(253_402_300_799_000), "9999-12-31T23:59:59Z");
        assert_eq!(rfc3339(u64::MAX), "9999-12-31T23:59:59Z");
    }

    #[test]
    fn a_date_time_has_t_between_date_and_time() {
        assert_eq!(parse_date_time_signed("1970-01-01T00:00:01Z"), Some(1_000));
        assert_eq!(parse_date_time_signed("1970-01-01t00:00:01z"), Some(1_000));
        assert_eq!(parse_date_time_signed("1970-01-01 00:00:01Z"), None);
        assert_eq!(parse_rfc3339_signed("1970-01-01 00:00:01Z"), Some(1_000));
    }

    #[test]
    fn a_time_before_1970_is_a_time_in_the_past() {
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59Z"), None);
        assert_eq!(parse_rfc3339_signed("1969-12-31T23:59:59Z"), Some(-1_000));
        assert_eq!(
            parse_rfc3339_signed("0231-01-01T00:00:00Z").map(|ms| ms < 0),
            Some(true)
        );
        assert_eq!(parse_rfc3339_signed("1969-02-30T00:00:00Z"), None);
        assert_eq!(parse_rfc3339_signed("yesterday"), None);
        // Rounded down: half a millisecond before 1970 is before it.
        assert_eq!(parse_rfc3339("1969-12-31T23:59:59.9995Z"), None);
        assert_eq!(parse_rfc3339_signed("1969-12-31T23:59:59.9995Z"), Some(-1));
    }

    #[test]
    fn an_instant_past_9999_in_utc_is_no_panic() {
        // 10000-01-01T00:00:59Z, written with an offset.
        assert_eq!(
            parse_rfc3339("9999-12-31T23:59:59-00:01"),
            Some(253_402_300_859_000)
        );
        assert_eq!(
            parse_rfc3339("9999-12-31T23:59:59Z"),
            Some(253_402_300_799_000)
        );
    }

    #[test]
    fn parses_utc_and_offsets() {
        assert_eq!(parse_rfc3339("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339("2026-11-22T03:04:05Z"),
            Some(1_795_316_645_000)
        );
        assert_eq!(
            parse_rfc3339("2026-11-22T04:04:05.250+01:00"),
            Some(1_795_316_645_250)
        );
        assert_eq!(
            parse_rfc3339("2026-11-22t02:04:05.2509-01:00"),
            Some(1_795_316_645_250)
        );
        assert_eq!(
            parse_rfc3339("2026-11-22 03:04:05z"),
            Some(1_795_316_645_000)
        );
        for bad in [
            "2026-11-22",
            "2026-13-01T00:00:00Z",
            "2026-11-22T03:04:05",
            "2026-11-22X03:04:05Z",
            "2026-11-22T03:04:05.Z",
            "2026-11-22T03:04:05Zjunk",
            "2026-11-22T03:04:05+1:00",
            "1969-12-31T23:59:59Z",
            "yesterday",
            "",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn rejects_impossible_dates_and_times() {
        for bad in [
            "2026-02-31T00:00:00Z",
            "2026-04-31T00:00:00Z",
            "2026-06-31T00:00:00Z",
            "2026-02-29T00:00:00Z",
            "1900-02-29T00:00:00Z",
            "2026-01-32T00:00:00Z",
            "2026-01-00T00:00:00Z",
            "2026-00-10T00:00:00Z",
            "2026-11-22T24:00:00Z",
            "2026-11-22T23:60:00Z",
            "2026-11-22T23:59:61Z",
            "2026-11-22T03:04:60Z",
            "2026-11-22T03:04:05+24:00",
            "2026-11-22T03:04:05+01:60",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
        // Leap days of leap years are fine.
        assert_eq!(parse_rfc3339("2000-02-29T00:00:00Z"), Some(951_782_400_000));
        assert!(parse_rfc3339("2028-02-29T12:00:00Z").is_some());
        // A leap second at the end of a UTC month reads as its last
        // millisecond.
        assert_eq!(
            parse_rfc3339("2016-12-31T23:59:60Z"),
            Some(1_483_228_799_999)
        );
    }

    #[test]
    fn round_trip() {
        for ms in [0, 86_399_000, 1_795_316_645_000, 4_102_444_800_000] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms));
        }
    }
}
