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
    // (What the host reads a header of other bytes as, too: a message
    // about its first letter would mislead.)
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(
            "holds a byte that is not visible ASCII: it must look like e<amount>:secret:<64 hex>"
                .into(),
        );
    }
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

/// Whether `text` may hold a bearer cash secret (`e<amount>:secret:<hex>`,
/// in any case, either colon written as is or escaped as `%3A`): a client
/// that put one in a path or a request id by mistake must not find it in
/// the operator's log.
pub fn holds_cash_secret(text: &str) -> bool {
    let b = text.as_bytes();
    // Most paths and ids have neither: one pass, no window compared.
    if !b.iter().any(|&c| c == b':' || c == b'%') {
        return false;
    }
    secret_markers(b).next().is_some()
}

/// Whether `text` holds a run of 64 hex digits or more: a secret's key
/// written some other way than `e<amount>:secret:<hex>` (`e1_secret_<hex>`,
/// or the bare key), which a free-form value that is logged (a request id)
/// must not carry.
pub fn holds_hex_key(text: &str) -> bool {
    let mut run = 0;
    text.bytes().any(|b| {
        run = if b.is_ascii_hexdigit() { run + 1 } else { 0 };
        run >= 64
    })
}

/// Whether `text` may hold a cash secret, written out
/// ([`holds_cash_secret`]) or its key alone ([`holds_hex_key`]): what no
/// logged value (a path, a request id) may show.
pub fn may_hold_secret(text: &str) -> bool {
    holds_cash_secret(text) || holds_hex_key(text)
}

/// Each `secret` between two colons (as is or `%3A`) of `b`: where the word
/// begins, and where what follows its second colon begins.
fn secret_markers(b: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let colon_ending = |i: usize| {
        (i >= 1 && b[i - 1] == b':') || (i >= 3 && b[i - 3..i].eq_ignore_ascii_case(b"%3a"))
    };
    let colon_at = |j: usize| {
        if b.get(j) == Some(&b':') {
            Some(j + 1)
        } else if b
            .get(j..j + 3)
            .is_some_and(|w| w.eq_ignore_ascii_case(b"%3a"))
        {
            Some(j + 3)
        } else {
            None
        }
    };
    (0..b.len().saturating_sub(5))
        .filter(move |&i| b[i..i + 6].eq_ignore_ascii_case(b"secret") && colon_ending(i))
        .filter_map(move |i| colon_at(i + 6).map(|hex| (i, hex)))
}

/// Whether the `secret` at `i` of `b` follows `e<amount>` and its colon
/// (as is or `%3A`): a cash secret, not prose (`:secret:`, `note:secret:`).
fn after_amount(b: &[u8], i: usize) -> bool {
    let colon = if b[i - 1] == b':' { i - 1 } else { i - 3 };
    let digits = b[..colon]
        .iter()
        .rev()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .count();
    digits > 0 && colon > digits && b[colon - digits - 1].eq_ignore_ascii_case(&b'e')
}

/// Whether the `secret` at `i` of `b` follows `n:<id>` and its colon (each
/// colon as is or `%3A`): a bearer witness or certificate secret,
/// `n:{contract or certificate id}:secret:{hex}`, which moves a contract
/// to whoever holds it (`POST /api/witness/replace`).
fn after_witness_id(b: &[u8], i: usize) -> bool {
    let colon = if b[i - 1] == b':' { i - 1 } else { i - 3 };
    let id = b[..colon]
        .iter()
        .rev()
        .take_while(|c| c.is_ascii_alphanumeric() || **c == b'_' || **c == b'-')
        .count();
    let start = colon - id;
    if start < 2 {
        return false;
    }
    // The separator before the id: a colon, or `%3A` (whose `3A` the run
    // above took for the id's).
    let id = match b[start - 1] {
        b':' => id,
        b'%' if b[start..].len() >= 2 && b[start..start + 2].eq_ignore_ascii_case(b"3a") => id - 2,
        _ => return false,
    };
    let n = start - 2;
    id > 0 && b[n].eq_ignore_ascii_case(&b'n') && (n == 0 || !b[n - 1].is_ascii_alphanumeric())
}

/// `text` with the hex of every cash, witness or certificate secret in it
/// shown as `{redacted}`: a plugin's log line (a plugin that logs what it
/// was paid with, or the change it was handed, must not put a spendable
/// secret in the log), a message a component keeps.
pub fn redact_secret_text(text: &str) -> std::borrow::Cow<'_, str> {
    if !holds_cash_secret(text) {
        return text.into();
    }
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (word, start) in secret_markers(b) {
        let end = start
            + b[start..]
                .iter()
                .take_while(|c| c.is_ascii_hexdigit())
                .count();
        if start < copied || end == start || !(after_amount(b, word) || after_witness_id(b, word)) {
            continue;
        }
        out.push_str(&text[copied..start]);
        out.push_str("{redacted}");
        copied = end;
    }
    out.push_str(&text[copied..]);
    out.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hex_key_is_a_run_of_64_hex_digits() {
        let key = "aB".repeat(32);
        assert!(holds_hex_key(&key));
        assert!(holds_hex_key(&format!("e1_secret_{key}")));
        assert!(holds_hex_key(&format!("x-{key}0-y")));
        assert!(!holds_hex_key(&key[1..]), "63 digits");
        assert!(!holds_hex_key(&format!("{}-{}", &key[..32], &key[32..])));
        assert!(
            !holds_hex_key("0af7651916cd43dd8448eb211c80319c"),
            "a trace id"
        );
    }

    #[test]
    fn witness_and_certificate_secrets_are_redacted_as_cash_is() {
        let h = "ab".repeat(32);
        for (text, want) in [
            (
                format!("take n:CTR_2026-x_1:secret:{h} now"),
                "take n:CTR_2026-x_1:secret:{redacted} now",
            ),
            (
                format!("{{\"w\":\"N:CRT_01J:SECRET:{h}\"}}"),
                "{\"w\":\"N:CRT_01J:SECRET:{redacted}\"}",
            ),
            (
                format!("n%3ACTR_1%3Asecret%3A{h}"),
                "n%3ACTR_1%3Asecret%3A{redacted}",
            ),
            (
                format!("e1:secret:{h} and n:CTR_1:secret:{h}"),
                "e1:secret:{redacted} and n:CTR_1:secret:{redacted}",
            ),
        ] {
            assert_eq!(redact_secret_text(&text), want);
        }
        // Not a witness: no `n:` before the id, or a word ending in n.
        for prose in [
            format!("CTR_1:secret:{h}"),
            format!("plan:CTR_1:secret:{h}"),
            format!("n::secret:{h}"),
        ] {
            assert_eq!(redact_secret_text(&prose), prose);
        }
    }

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
        // Bytes outside visible ASCII are named as such, not as a wrong
        // first letter (the host reads a header of them as a sentence).
        for odd in [format!("e1:secret:{h}\u{e9}"), "(not visible ASCII)".into()] {
            let e = parse(&odd).unwrap_err();
            assert!(e.contains("visible ASCII"), "{odd}: {e}");
        }
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
