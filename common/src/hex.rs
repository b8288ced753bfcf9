//! Lower-case hex, the one encoding of keys, hashes, signatures and secrets
//! in this service (host and plugins alike).

const DIGITS: &[u8; 16] = b"0123456789abcdef";

/// Whether `s` is written as a fingerprint: 64 hex digits (an Ed25519
/// public key), either case.
pub fn is_fingerprint(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The SHA-256 of `bytes`, as lower-case hex: the content id of a
/// component, a backup file or an upload, and a secret's public hash.
pub fn sha256(bytes: impl AsRef<[u8]>) -> String {
    use sha2::Digest;
    encode(&sha2::Sha256::digest(bytes))
}

/// `bytes` as lower-case hex.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    encode_into(bytes, &mut out);
    out
}

/// Append `bytes` as lower-case hex to `out`.
pub fn encode_into(bytes: &[u8], out: &mut String) {
    out.reserve(bytes.len() * 2);
    for &b in bytes {
        out.push(DIGITS[(b >> 4) as usize] as char);
        out.push(DIGITS[(b & 0x0f) as usize] as char);
    }
}

/// The bytes of lower- or upper-case hex; `None` for an odd length or any
/// character that is not a hex digit (no sign, no spaces, no prefix).
pub fn decode(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.chunks_exact(2)
        .map(|pair| Some(nibble(pair[0])? << 4 | nibble(pair[1])?))
        .collect()
}

fn nibble(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha256_is_the_standard_digest_in_lower_case_hex() {
        assert_eq!(
            sha256(""),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(sha256(b"abc"), sha256("abc"));
    }

    #[test]
    fn encodes_every_byte_as_two_lower_case_digits() {
        let all: Vec<u8> = (0..=255).collect();
        let text = encode(&all);
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(text, expected);
        assert_eq!(encode(&[]), "");
        let mut out = "k/".to_string();
        encode_into(&[0xab, 0x01], &mut out);
        assert_eq!(out, "k/ab01");
    }

    #[test]
    fn decodes_either_case_and_round_trips() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)), Some(all.clone()));
        assert_eq!(decode(&encode(&all).to_uppercase()), Some(all));
        assert_eq!(decode("aB0f"), Some(vec![0xab, 0x0f]));
        assert_eq!(decode(""), Some(vec![]));
    }

    #[test]
    fn refuses_what_is_not_plain_hex() {
        // `u8::from_str_radix` would take a sign: "+f" is 15 to it.
        for bad in ["+f", "-1", "0", "abc", "0x", "g0", " 0", "éé", "00 "] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
