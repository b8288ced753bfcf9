//! The keys and statistics of the search index: written by the timeline
//! family with each post (`plugins/timeline/src/index.rs` documents the
//! layout), read by the search family.

/// The index's statistics.
pub const STATS_KEY: &str = "ix/stats";

/// `ix/stats`: how many posts are indexed and the sum of their weighted
/// lengths (a field missing reads as 0).
#[derive(Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Stats {
    pub docs: u64,
    pub total_len: u64,
}

/// `ix/df/{term}`: how many indexed posts have `term`.
pub fn df_key(term: &str) -> String {
    ["ix/df/", term].concat()
}

/// `ix/doc/{post_id}`: what a post added to the index.
pub fn doc_key(post_id: &str) -> String {
    ["ix/doc/", post_id].concat()
}

/// `ix/i/{term}\0`: where `term`'s posting list begins (no other term's
/// keys fall inside it).
pub fn term_prefix(term: &str) -> String {
    ["ix/i/", term, "\0"].concat()
}

/// The most characters a search term may have, counted as sent (white
/// space around it included: the published documents' `maxLength`).
pub const MAX_TERM_CHARS: usize = 1000;

/// Why a text is not a search term.
#[derive(Debug, PartialEq, Eq)]
pub enum TermProblem {
    /// Empty, or nothing but white space.
    Blank,
    /// Over [`MAX_TERM_CHARS`] characters.
    TooLong,
}

impl TermProblem {
    /// The rule, worded for a field's error detail.
    pub fn rule(&self) -> &'static str {
        match self {
            TermProblem::Blank => "must not be blank",
            TermProblem::TooLong => "must be at most 1000 characters",
        }
    }
}

/// A search term as every way in reads it (`GET /api/search`, the MCP
/// search tool, an A2A message, the docs search): trimmed of the white
/// space the schemas' `\S` reads as such, never blank, and at most
/// [`MAX_TERM_CHARS`] characters as sent.
pub fn search_term(sent: &str) -> Result<&str, TermProblem> {
    let term = sent.trim_matches(crate::is_js_space);
    if term.is_empty() {
        Err(TermProblem::Blank)
    } else if sent.chars().count() > MAX_TERM_CHARS {
        Err(TermProblem::TooLong)
    } else {
        Ok(term)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_search_term_is_trimmed_and_counted_as_sent() {
        assert_eq!(search_term("  rust\u{3000}"), Ok("rust"));
        // U+0085 is not white space to ECMAScript's `\s`; U+FEFF is.
        assert_eq!(search_term("\u{85}a"), Ok("\u{85}a"));
        assert_eq!(search_term("\u{feff} \t\n"), Err(TermProblem::Blank));
        assert_eq!(search_term(""), Err(TermProblem::Blank));
        let word = "ü".repeat(MAX_TERM_CHARS);
        assert_eq!(search_term(&word), Ok(word.as_str()));
        // The spaces around the word count: the length is the text's as sent.
        assert_eq!(search_term(&format!(" {word}")), Err(TermProblem::TooLong));
        // Blank wins over long (the field is missing, whatever its size).
        assert_eq!(search_term(&" ".repeat(2000)), Err(TermProblem::Blank));
        // The rule names the limit the check applies.
        let rule = TermProblem::TooLong.rule();
        assert!(rule.contains(&MAX_TERM_CHARS.to_string()), "{rule}");
    }

    #[test]
    fn stats_keep_their_stored_form() {
        let stats: Stats = serde_json::from_str(r#"{"docs":3,"total_len":41}"#).unwrap();
        assert_eq!((stats.docs, stats.total_len), (3, 41));
        assert_eq!(
            serde_json::to_string(&stats).unwrap(),
            r#"{"docs":3,"total_len":41}"#
        );
        let empty: Stats = serde_json::from_str("{}").unwrap();
        assert_eq!((empty.docs, empty.total_len), (0, 0));
    }

    #[test]
    fn keys_keep_their_stored_form() {
        assert_eq!(df_key("rust"), "ix/df/rust");
        assert_eq!(doc_key("post_1"), "ix/doc/post_1");
        assert_eq!(term_prefix("ü"), "ix/i/ü\0");
    }
}
