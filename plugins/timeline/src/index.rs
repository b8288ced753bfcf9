//! The inverted index, written in the same transaction as the post it
//! indexes (so search is never out of date). Read by the `search` family.
//!
//! - `ix/t/{term}\0{post_id}` -> `"{tf} {len} {post_type}"`: weighted term
//!   frequency, weighted document length and the post type, so ranking and
//!   the type filter need no other reads
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
    for (term, f) in &tf {
        let posting = format!("{f} {len} {}", post.post_type);
        kv::put_raw(
            &format!("ix/t/{term}\0{}", post.post_id),
            posting.as_bytes(),
        )?;
        let df_key = format!("ix/df/{term}");
        let df: u64 = kv::get(&df_key)?.unwrap_or(0);
        kv::put(&df_key, &(df + 1))?;
    }
    let mut stats: Value =
        kv::get("ix/stats")?.unwrap_or_else(|| json!({"docs": 0, "total_len": 0}));
    stats["docs"] = json!(stats["docs"].as_u64().unwrap_or(0) + 1);
    stats["total_len"] = json!(stats["total_len"].as_u64().unwrap_or(0) + len);
    kv::put("ix/stats", &stats)
}
