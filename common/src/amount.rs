//! Amounts: decimal strings with at most 8 decimals, stored as integer
//! units (1 unit = 10^-8). Output is always the shortest form: "1", "0.4",
//! "0.97" (no trailing zeros, no trailing dot).

/// Units per whole coin.
pub const UNIT: u64 = 100_000_000;
/// Decimals of an amount.
pub const DECIMALS: usize = 8;

/// Why an amount string was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AmountError {
    Empty,
    Malformed,
    TooPrecise,
    TooLarge,
}

impl std::fmt::Display for AmountError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AmountError::Empty => "is empty",
            AmountError::Malformed => "is not a decimal amount",
            AmountError::TooPrecise => "has more than 8 decimals",
            AmountError::TooLarge => "is too large",
        })
    }
}

/// Parse a decimal amount into units ("1", "0.5"): digits are required on
/// both sides of a dot; no sign, no exponent, no spaces.
pub fn parse(s: &str) -> Result<u64, AmountError> {
    if s.is_empty() {
        return Err(AmountError::Empty);
    }
    let (whole, frac) = match s.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (s, None),
    };
    let digits = |p: &str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return Err(AmountError::Malformed);
    }
    let frac = frac.unwrap_or("");
    if frac.len() > DECIMALS {
        return Err(AmountError::TooPrecise);
    }
    let whole: u64 = whole.parse().map_err(|_| AmountError::TooLarge)?;
    let mut frac_units: u64 = 0;
    for (i, b) in frac.bytes().enumerate() {
        frac_units += u64::from(b - b'0') * 10u64.pow((DECIMALS - 1 - i) as u32);
    }
    whole
        .checked_mul(UNIT)
        .and_then(|w| w.checked_add(frac_units))
        .ok_or(AmountError::TooLarge)
}

/// Format units in the shortest decimal form.
pub fn format(units: u64) -> String {
    format_sum(units.into())
}

/// [`format`] of a sum of amounts, which may pass u64.
/// Written with `itoa` (a u64's division where the sum fits one): every
/// answer with an amount formats a few, and `format!` of a u128 was among
/// the dearest calls of a paid post.
pub fn format_sum(units: u128) -> String {
    let (whole, frac) = match u64::try_from(units) {
        Ok(u) => ((u / UNIT) as u128, u % UNIT),
        Err(_) => (units / UNIT as u128, (units % UNIT as u128) as u64),
    };
    let mut digits = itoa::Buffer::new();
    let mut out = String::with_capacity(24);
    out.push_str(digits.format(whole));
    if frac != 0 {
        // UNIT + frac is "1" and then frac's eight digits, zero-padded.
        out.push('.');
        out.push_str(digits.format(UNIT + frac)[1..].trim_end_matches('0'));
    }
    out
}

/// floor(amount * percent / 100) in units, without overflow.
pub fn percent(units: u64, percent: u64) -> u64 {
    ((units as u128 * percent as u128) / 100) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_form() {
        assert_eq!(format(UNIT), "1");
        assert_eq!(format(40_000_000), "0.4");
        assert_eq!(format(97_000_000), "0.97");
        assert_eq!(format(1), "0.00000001");
        assert_eq!(format(0), "0");
        assert_eq!(format(123 * UNIT + 5), "123.00000005");
        assert_eq!(format(u64::MAX), "184467440737.09551615");
        assert_eq!(format_sum(u64::MAX as u128 + 1), "184467440737.09551616");
        assert_eq!(
            format_sum(u128::MAX),
            "3402823669209384634633746074317.68211455"
        );
        assert_eq!(
            format_sum(7 * UNIT as u128 * 1_000_000_000_000),
            "7000000000000"
        );
        // A sum past u64 (two large outputs) is written as it is.
        assert_eq!(
            format_sum(2 * (99_999_999_999 * UNIT as u128)),
            "199999999998"
        );
    }

    #[test]
    fn parse_accepts_and_refuses() {
        assert_eq!(parse("1"), Ok(UNIT));
        assert_eq!(parse("0.4"), Ok(40_000_000));
        assert_eq!(parse("1.50"), Ok(150_000_000));
        assert_eq!(parse("0.00000001"), Ok(1));
        assert_eq!(parse("0.000000001"), Err(AmountError::TooPrecise));
        for bad in ["", "-1", "1e3", "1.", ".5", "a", "1.2.3", " 1", "+1"] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(parse("999999999999999999999"), Err(AmountError::TooLarge));
    }

    #[test]
    fn round_trip() {
        for u in [0, 1, 7, 10, 99_999_999, UNIT, 3 * UNIT / 100, u64::MAX / 2] {
            assert_eq!(parse(&format(u)), Ok(u));
        }
    }

    #[test]
    fn three_percent_is_floored() {
        assert_eq!(percent(UNIT, 3), 3_000_000);
        assert_eq!(percent(33, 3), 0);
        assert_eq!(percent(34, 3), 1);
    }
}
