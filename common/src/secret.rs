//! Cash secrets: `e{amount}:secret:{64 lowercase hex}`; public form
//! `e{amount}:public:{sha256 hex of the 64-char hex string}`.

use crate::amount;

/// A parsed secret or public cash string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CashString {
    /// Amount in units.
    pub amount: u64,
    /// "secret" or "public".
    pub kind: Kind,
    /// The 64 lowercase hex characters.
    pub hex: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Secret,
    Public,
}

/// Parse `e{amount}:{secret|public}:{64 hex}`. Hex must be lowercase.
pub fn parse(s: &str) -> Result<CashString, String> {
    let rest = s.strip_prefix('e').ok_or("must start with 'e'")?;
    let mut parts = rest.splitn(3, ':');
    let (Some(amt), Some(kind), Some(hex)) = (parts.next(), parts.next(), parts.next()) else {
        return Err("must look like e<amount>:secret:<64 hex>".into());
    };
    let amount = amount::parse(amt).map_err(|e| format!("amount {e}"))?;
    if amount == 0 {
        return Err("amount must be positive".into());
    }
    let kind = match kind {
        "secret" => Kind::Secret,
        "public" => Kind::Public,
        _ => return Err("kind must be 'secret' or 'public'".into()),
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err("must end in 64 lowercase hex characters".into());
    }
    Ok(CashString {
        amount,
        kind,
        hex: hex.to_string(),
    })
}

/// `e{amount}:secret:{hex}` in the shortest amount form.
pub fn secret_string(amount_units: u64, hex: &str) -> String {
    format!("e{}:secret:{hex}", amount::format(amount_units))
}

/// `e{amount}:public:{hash}`.
pub fn public_string(amount_units: u64, hash_hex: &str) -> String {
    format!("e{}:public:{hash_hex}", amount::format(amount_units))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_secrets_and_publics() {
        let h = "ab".repeat(32);
        let s = parse(&format!("e0.5:secret:{h}")).unwrap();
        assert_eq!(
            (s.amount, s.kind, s.hex.as_str()),
            (50_000_000, Kind::Secret, h.as_str())
        );
        assert_eq!(parse(&format!("e1:public:{h}")).unwrap().kind, Kind::Public);
        assert_eq!(secret_string(50_000_000, &h), format!("e0.5:secret:{h}"));
    }

    #[test]
    fn refuses_malformed() {
        let h = "ab".repeat(32);
        for bad in [
            format!("0.5:secret:{h}"),
            format!("e0:secret:{h}"),
            format!("e0.5:secret:{}", "AB".repeat(32)),
            format!("e0.5:secret:{}", "ab".repeat(31)),
            format!("e0.5:private:{h}"),
            "e1:secret".to_string(),
            format!("e1.000000001:secret:{h}"),
        ] {
            assert!(parse(&bad).is_err(), "{bad}");
        }
    }
}
