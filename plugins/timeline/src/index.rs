//! The inverted index, written in the same transaction as the post it
//! indexes (so search is never out of date). Read by the `search` family.
//!
//! - `ix/i/{term}\0{rank}{flipped post_id}` -> `"{tf} {len} {post_type}"`:
//!   the posting list of a term in impact order. `rank` is 8 hex digits of
//!   `u32::MAX - impact`, `impact` the term's BM25 term-frequency part
//!   (k1 = 1.2, b = 0.75, scaled by 10^6) against the average length when
//!   the post was indexed; the post id is flipped (`order::flip_ulid`) so
//!   equal impacts list the newest post first. A forward scan yields the
//!   best postings first and a top-k query reads only the head of the list. The value holds the
//!   weighted term frequency, the weighted document length and the post
//!   type, so ranking and the type filter need no other reads.
//! - `ix/df/{term}` -> number of posts containing the term (exact)
//! - `ix/stats` -> `{"docs": n, "total_len": n}`
//!
//! Field weights (BM25F-style): content 3, keywords 2, markdown attachments 1.

use crate::model::Post;
use marketplace_common::text::tokens;
use marketplace_guest::prelude::*;
use std::collections::BTreeMap;

pub const CONTENT_WEIGHT: u64 = 3;
pub const KEYWORD_WEIGHT: u64 = 2;
pub const ATTACHMENT_WEIGHT: u64 = 1;

/// Whether an attachment is indexed (markdown).
pub fn is_markdown(filename: &str, attachment_type: &str) -> bool {
    filename.to_ascii_lowercase().ends_with(".md") || attachment_type.starts_with("text/markdown")
}

/// Index a new post; `markdown` holds the text of its markdown attachments.
pub fn add(post: &Post, markdown: &[&str]) -> Result<(), ApiError> {
    let mut tf: BTreeMap<String, u64> = BTreeMap::new();
    let mut len = 0u64;
    let mut count = |text: &str, weight: u64| {
        for t in tokens(text) {
            *tf.entry(t).or_default() += weight;
            len += weight;
        }
    };
    count(&post.content, CONTENT_WEIGHT);
    for k in &post.keywords {
        count(k, KEYWORD_WEIGHT);
    }
    for m in markdown {
        count(m, ATTACHMENT_WEIGHT);
    }
    let mut stats: Value =
        kv::get("ix/stats")?.unwrap_or_else(|| json!({"docs": 0, "total_len": 0}));
    let docs = stats["docs"].as_u64().unwrap_or(0) + 1;
    let total_len = stats["total_len"].as_u64().unwrap_or(0) + len;
    let avgdl = total_len as f64 / docs as f64;
    for (term, f) in &tf {
        let posting = format!("{f} {len} {}", post.post_type);
        kv::put_raw(
            &posting_key(term, impact(*f as f64, len as f64, avgdl), &post.post_id),
            posting.as_bytes(),
        )?;
        let df_key = format!("ix/df/{term}");
        let df: u64 = kv::get(&df_key)?.unwrap_or(0);
        kv::put(&df_key, &(df + 1))?;
    }
    stats["docs"] = json!(docs);
    stats["total_len"] = json!(total_len);
    kv::put("ix/stats", &stats)
}

/// The BM25 term-frequency part of a posting (k1 = 1.2, b = 0.75).
pub fn impact(tf: f64, len: f64, avgdl: f64) -> f64 {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avgdl.max(1.0)))
}

/// `ix/i/{term}\0{rank}{flipped post_id}`: best impact first, then newest.
pub fn posting_key(term: &str, impact: f64, post_id: &str) -> String {
    let scaled = (impact * 1e6).clamp(0.0, u32::MAX as f64) as u32;
    format!(
        "ix/i/{term}\0{:08x}{}",
        u32::MAX - scaled,
        marketplace_common::order::flip_ulid(post_id)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn better_postings_sort_first() {
        let avgdl = 30.0;
        // More occurrences in a same-length post, then a shorter post with
        // the same count, rank higher.
        let a = posting_key("rust", impact(9.0, 30.0, avgdl), "post_B");
        let b = posting_key("rust", impact(3.0, 30.0, avgdl), "post_A");
        let c = posting_key("rust", impact(3.0, 300.0, avgdl), "post_C");
        assert!(a < b && b < c, "{a:?} {b:?} {c:?}");
        // Equal impact: the newer post first.
        let (old, new) = (
            "post_01HZX3K9Q8R7S6T5V4W3X2Y1Z0",
            "post_01HZX3K9Q8R7S6T5V4W3X2Y1Z1",
        );
        assert!(posting_key("t", 1.0, new) < posting_key("t", 1.0, old));
        // A term's list is contiguous: no other term's keys inside it.
        assert!(posting_key("ru", 0.0, "post_9") < posting_key("rust", 2.0, "post_1"));
    }
}
