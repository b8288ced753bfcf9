//! Non-negative integers as clients write them in text (query parameters,
//! path segments, numbers in strings and signed messages).

/// A non-negative integer written in ASCII digits only: no sign, no
/// spaces, no exponent (`str::parse` would take `+5`), at most `u64::MAX`.
/// Leading zeros are allowed.
pub fn parse(text: &str) -> Option<u64> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn digits_only() {
        assert_eq!(parse("0"), Some(0));
        assert_eq!(parse("20"), Some(20));
        assert_eq!(parse("007"), Some(7));
        assert_eq!(parse("18446744073709551615"), Some(u64::MAX));
        for bad in [
            "",
            "+5",
            "-1",
            " 5",
            "5 ",
            "1e3",
            "0x10",
            "١",
            "18446744073709551616",
        ] {
            assert_eq!(parse(bad), None, "{bad:?}");
        }
    }
}
