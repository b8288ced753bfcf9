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

#[cfg(test)]
mod tests {
    use super::*;

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
