//! Key encodings that sort the way a reader wants to scan.

/// Crockford base32, the ULID alphabet (in sort order).
const CROCKFORD: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";

/// Byte -> its mirror in the alphabet (other bytes map to themselves).
const FLIP: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = b as u8;
        b += 1;
    }
    let mut i = 0;
    while i < 32 {
        table[CROCKFORD[i] as usize] = CROCKFORD[31 - i];
        i += 1;
    }
    table
};

/// Flip every ULID character of `id` to its mirror in the alphabet, so
/// flipped ids sort newest first. Other characters (a `post_` prefix) are
/// kept. Applying it twice gives `id` back.
pub fn flip_ulid(id: &str) -> String {
    // Only ASCII bytes are remapped (to ASCII), so the result stays UTF-8.
    let bytes: Vec<u8> = id
        .bytes()
        .map(|b| if b.is_ascii() { FLIP[b as usize] } else { b })
        .collect();
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flipped_ids_sort_newest_first_and_flip_back() {
        let (old, new) = (
            "post_01HZX3K9Q8R7S6T5V4W3X2Y1Z0",
            "post_01HZX3K9Q8R7S6T5V4W3X2Y1Z1",
        );
        assert!(flip_ulid(new) < flip_ulid(old));
        assert_eq!(flip_ulid(&flip_ulid(old)), old);
        assert!(flip_ulid(old).starts_with("post_"));
        assert_eq!(flip_ulid("é0Z"), "éZ0");
    }
}
