//! Tokenisation shared by the indexer (timeline) and the query side
//! (search), so both always agree: Unicode NFC (an accent typed as a
//! combining mark is the same word as the precomposed letter), lower-case,
//! split on anything that is not a letter, a digit or a combining mark
//! (vowel signs and viramas belong to their word); a word longer than 64
//! characters is kept as its first 64 (on both sides, so a checksum or a
//! long compound is still found when asked for whole).

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::{IsNormalized, UnicodeNormalization, is_nfc_quick};

/// A character that changes how text reads without showing itself:
/// bidirectional controls (a name could show its extension reversed),
/// zero-width and other invisible format characters (the soft hyphen,
/// fillers, tag characters that spell hidden ASCII), line and paragraph
/// separators.
pub fn reads_otherwise(c: char) -> bool {
    matches!(
        c,
        '\u{ad}'
            | '\u{61c}'
            | '\u{115f}'
            | '\u{1160}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{206f}'
            | '\u{3164}'
            | '\u{feff}'
            | '\u{ffa0}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{e0000}'..='\u{e007f}'
    )
}

/// Longest token: a longer word is cut to this many characters.
pub const MAX_TOKEN_CHARS: usize = 64;

/// The tokens of `text`, in order (duplicates kept).
pub fn tokens(text: &str) -> Vec<String> {
    let mut all = Vec::new();
    each_token(text, |t| {
        all.push(t);
        true
    });
    all
}

/// Hand the tokens of `text` to `each` in order (as [`tokens`] lists
/// them) until it returns false: a caller that wants only the first so
/// many words of a long text makes no more of them.
pub fn each_token(text: &str, mut each: impl FnMut(String) -> bool) {
    // ASCII (most text) is NFC already and has no combining mark.
    if text.is_ascii() {
        for t in text
            .split(|c: char| !c.is_ascii_alphanumeric())
            .filter(|t| !t.is_empty())
        {
            if !each(t[..t.len().min(MAX_TOKEN_CHARS)].to_ascii_lowercase()) {
                return;
            }
        }
        return;
    }
    let composed = nfc(text);
    let text = composed.as_deref().unwrap_or(text);
    // (Combining marks start at U+0300: no table lookup below it.)
    for t in text.split(|c: char| !in_word(c)).filter(|t| !t.is_empty()) {
        let token = match t.char_indices().nth(MAX_TOKEN_CHARS) {
            Some((cut, _)) => t[..cut].to_lowercase(),
            None => t.to_lowercase(),
        };
        if !each(token) {
            return;
        }
    }
}

/// Whether `c` belongs to a word: what [`each_token`] keeps (a letter,
/// a digit or a combining mark).
fn in_word(c: char) -> bool {
    c.is_alphanumeric() || (c >= '\u{300}' && is_combining_mark(c))
}

/// `text` cut to at most `max_bytes` where no word is cut in two: at a
/// character boundary and, when a word runs over the cut, before that
/// word, so a reader of the first bytes of a text makes no term of a
/// word's first letters. A word whose part before the cut is already
/// longer than a token ([`MAX_TOKEN_CHARS`], counted four times over as
/// composing a text can join up to four characters into one, as α with
/// three marks is U+1F86) gives its
/// token either way and is kept; so the scan back is short whatever the
/// text.
pub fn cut_between_words(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let (head, tail) = text.split_at(text.floor_char_boundary(max_bytes));
    if !tail.chars().next().is_some_and(in_word) {
        return head;
    }
    for (seen, (i, c)) in head.char_indices().rev().enumerate() {
        if !in_word(c) {
            return &head[..i + c.len_utf8()];
        }
        if seen >= 4 * MAX_TOKEN_CHARS {
            return head;
        }
    }
    ""
}

/// `text` in Unicode NFC, or `None` when it already is (ASCII always is).
pub fn nfc(text: &str) -> Option<String> {
    if text.is_ascii() || is_nfc_quick(text.chars()) == IsNormalized::Yes {
        return None;
    }
    Some(text.nfc().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invisible_characters_read_otherwise_and_visible_ones_do_not() {
        for c in [
            '\u{ad}',
            '\u{61c}',
            '\u{200b}',
            '\u{200e}',
            '\u{2028}',
            '\u{202e}',
            '\u{2066}',
            '\u{206f}',
            '\u{3164}',
            '\u{feff}',
            '\u{fffb}',
            '\u{e0041}',
            '\u{e007f}',
        ] {
            assert!(reads_otherwise(c), "{:?}", c);
        }
        for c in [
            'a', '-', ' ', 'é', '\u{301}', '\u{2010}', '\u{3000}', '\u{fffd}', '😀',
        ] {
            assert!(!reads_otherwise(c), "{:?}", c);
        }
    }

    #[test]
    fn each_token_stops_when_asked() {
        for text in ["one two three four", "ünï two three four"] {
            let mut seen = Vec::new();
            each_token(text, |t| {
                seen.push(t);
                seen.len() < 2
            });
            assert_eq!(seen, tokens(text)[..2]);
        }
    }

    #[test]
    fn splits_and_lowercases() {
        assert_eq!(
            tokens("Rust-based  WASM, hosting!"),
            ["rust", "based", "wasm", "hosting"]
        );
        assert_eq!(tokens("Ünïcode ok"), ["ünïcode", "ok"]);
        assert!(tokens("  --- ").is_empty());
        // A long word is its first 64 characters, ASCII or not.
        assert_eq!(
            tokens(&format!("{} b", "x".repeat(65))),
            ["x".repeat(64), "b".into()]
        );
        assert_eq!(tokens(&"é".repeat(70)), ["é".repeat(64)]);
        assert_eq!(tokens(&"X".repeat(64)), ["x".repeat(64)]);
    }

    #[test]
    fn a_cut_falls_between_words() {
        // Within the bound: the text whole.
        assert_eq!(cut_between_words("alpha beta", 10), "alpha beta");
        // At a space, or on one: the words before it.
        assert_eq!(cut_between_words("alpha beta", 6), "alpha ");
        assert_eq!(cut_between_words("alpha beta", 5), "alpha");
        // Inside a word: before it, never its first letters.
        assert_eq!(cut_between_words("alpha beta", 8), "alpha ");
        assert_eq!(cut_between_words("alpha", 3), "");
        // Inside a character, and before a combining mark (part of the
        // word it follows: "cafe" of "café" typed as e + U+0301 is not a
        // word of this text).
        assert_eq!(cut_between_words("ab \u{e9}\u{e9}", 6), "ab ");
        assert_eq!(cut_between_words("x cafe\u{301}", 6), "x ");
        // A word longer than a token before the cut is kept: its token is
        // the same whole or cut.
        let long = "w".repeat(4 * MAX_TOKEN_CHARS + 10);
        let text = format!("a {long}");
        let cut = cut_between_words(&text, text.len() - 1);
        assert_eq!(cut.len(), text.len() - 1);
        assert_eq!(tokens(cut), tokens(&text));
        // What is left is tokens of the text, in order.
        let text = "Ünïcode wörds, cut ánywhere ok";
        for max in 0..=text.len() {
            let cut = cut_between_words(text, max);
            assert!(cut.len() <= max && text.starts_with(cut));
            assert_eq!(tokens(cut), tokens(text)[..tokens(cut).len()], "{max}");
        }
    }

    #[test]
    fn one_word_however_its_accents_are_typed() {
        // "café" precomposed (U+00E9) and as e + U+0301: one token, never
        // cut at the combining mark (which made it "caf" + nothing, or
        // matched "cafe").
        assert_eq!(tokens("caf\u{e9} ok"), ["caf\u{e9}", "ok"]);
        assert_eq!(tokens("Cafe\u{301} ok"), ["caf\u{e9}", "ok"]);
        assert_eq!(tokens("cafe"), ["cafe"]);
        // A mark with no precomposed letter stays in its word; so do
        // Devanagari's vowel signs and virama.
        assert_eq!(tokens("q\u{307}\u{323}x y"), ["q\u{323}\u{307}x", "y"]);
        assert_eq!(
            tokens("\u{939}\u{93f}\u{928}\u{94d}\u{926}\u{940}"),
            ["\u{939}\u{93f}\u{928}\u{94d}\u{926}\u{940}"]
        );
        assert_eq!(nfc("plain"), None);
        assert_eq!(nfc("caf\u{e9}"), None);
        assert_eq!(nfc("e\u{301}").as_deref(), Some("\u{e9}"));
        // The ASCII path and the Unicode one agree.
        assert_eq!(tokens("A-b_C9 x"), tokens("A-b_C9 x \u{e9}")[..4]);
    }
}
