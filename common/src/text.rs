//! Tokenisation shared by the indexer (timeline) and the query side
//! (search), so both always agree: lower-case, split on anything that is not
//! a letter or digit, tokens of 1 to 64 characters.

/// Longest token kept.
pub const MAX_TOKEN_CHARS: usize = 64;

/// The tokens of `text`, in order (duplicates kept).
pub fn tokens(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|t| !t.is_empty() && t.chars().count() <= MAX_TOKEN_CHARS)
        .map(|t| t.to_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_lowercases() {
        assert_eq!(
            tokens("Rust-based  WASM, hosting!"),
            ["rust", "based", "wasm", "hosting"]
        );
        assert_eq!(tokens("Ünïcode ok"), ["ünïcode", "ok"]);
        assert!(tokens("  --- ").is_empty());
        assert!(tokens(&"x".repeat(65)).is_empty());
    }
}
