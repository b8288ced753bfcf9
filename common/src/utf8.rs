//! UTF-8 checks for the components' hot paths. In a WebAssembly component
//! the standard library's check comes compiled ahead (without the
//! component's target features) and cost about 3.8 instructions a byte: 38k
//! of a search's 545k instructions went to checking the records it renders.
//! What a component reads back is nearly always ASCII (JSON it wrote, ids,
//! keys): checked here eight bytes at a time as such, and the standard way
//! only when a byte is not ASCII.

/// The high bit of each of eight bytes.
const HIGH: u64 = 0x8080_8080_8080_8080;

/// Whether every byte is ASCII: the words' bits OR-ed together, one test
/// at the end (a test per word cost a component four times as much).
fn all_ascii(bytes: &[u8]) -> bool {
    let mut words = bytes.chunks_exact(8);
    let mut seen = 0u64;
    for word in &mut words {
        // (Never short: a failure would count as not ASCII, not as ASCII.)
        seen |= word.try_into().map_or(HIGH, u64::from_le_bytes);
    }
    for &b in words.remainder() {
        seen |= u64::from(b);
    }
    seen & HIGH == 0
}

/// `std::str::from_utf8`, the same answers and errors.
pub fn from_utf8(bytes: &[u8]) -> Result<&str, std::str::Utf8Error> {
    if all_ascii(bytes) {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes)
    }
}

/// `String::from_utf8`, the same answers and errors.
pub fn string_from_utf8(bytes: Vec<u8>) -> Result<String, std::string::FromUtf8Error> {
    if all_ascii(&bytes) {
        // SAFETY: ASCII is UTF-8.
        Ok(unsafe { String::from_utf8_unchecked(bytes) })
    } else {
        String::from_utf8(bytes)
    }
}

/// `bytes` as text, what is not UTF-8 in them as U+FFFD (as
/// `String::from_utf8_lossy`), without a copy when they are UTF-8.
pub fn string_lossy(bytes: Vec<u8>) -> String {
    string_from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_agree_with_the_standard_ones() {
        let mut cases: Vec<Vec<u8>> = vec![
            vec![],
            b"{}".to_vec(),
            br#"{"post_id":"post_01A","content":"plain ascii, 8+ bytes long"}"#.to_vec(),
            "{\"content\":\"Café ü 日本\"}".as_bytes().to_vec(),
            vec![b'a'; 7],
            vec![b'a'; 8],
            vec![b'a'; 17],
            vec![0x7f; 9],
            vec![0x80; 9],
        ];
        // A byte that is not ASCII at every position of a word and of the
        // tail, alone (not UTF-8) and as part of a character (UTF-8), and
        // a character cut at a word's end.
        for at in 0..19 {
            let mut bad = vec![b'x'; 19];
            bad[at] = 0xff;
            cases.push(bad);
            let mut good = vec![b'x'; 19];
            good.splice(at..at + 1, "é".bytes());
            cases.push(good.clone());
            good.truncate(at + 1);
            cases.push(good);
        }
        for bytes in cases {
            // The quick path is taken exactly for ASCII.
            assert_eq!(all_ascii(&bytes), bytes.is_ascii(), "{bytes:?}");
            assert_eq!(from_utf8(&bytes), std::str::from_utf8(&bytes), "{bytes:?}");
            assert_eq!(
                string_from_utf8(bytes.clone()).map_err(|e| e.utf8_error()),
                String::from_utf8(bytes.clone()).map_err(|e| e.utf8_error()),
                "{bytes:?}"
            );
            assert_eq!(
                string_lossy(bytes.clone()),
                String::from_utf8_lossy(&bytes),
                "{bytes:?}"
            );
        }
    }
}
