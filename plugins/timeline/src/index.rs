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
//! - `ix/doc/{post_id}` -> `{"len": n, "keys": [posting keys]}`: what a
//!   post added, so an update or a delete can take it out again (posts
//!   indexed before this record existed are found by their terms instead)
//!
//! Field weights (BM25F-style): content 3, keywords 2, markdown attachments 1.
//!
//! A post is indexed by its first [`MAX_TEXT_BYTES`] of text and
//! [`MAX_TOKENS`] words (its keywords first: a content of the most
//! characters leaves them searchable) and, of their distinct terms, the
//! [`MAX_TERMS`] it uses most ([`weigh`]).

use crate::model::Post;
use marketplace_common::text::{cut_between_words, each_token};
use marketplace_guest::index::{STATS_KEY, Stats, df_key, doc_key, term_prefix};
use marketplace_guest::prelude::*;
use std::collections::BTreeMap;

pub const CONTENT_WEIGHT: u64 = 3;
pub const KEYWORD_WEIGHT: u64 = 2;
pub const ATTACHMENT_WEIGHT: u64 = 1;

/// Whether an attachment is indexed (markdown).
pub fn is_markdown(filename: &str, attachment_type: &str) -> bool {
    filename.to_ascii_lowercase().ends_with(".md") || attachment_type.starts_with("text/markdown")
}

/// The words of a post the index reads: its keywords' (at most 32 of 64
/// characters: a bounded share, read first so that the terms its author
/// chose to be found by are never crowded out by a long content), then
/// its content's, then its markdown attachments', each in order; the rest
/// is not searchable. (64 KiB of English prose is about 10,000 words.)
pub const MAX_TOKENS: usize = 16_384;

/// The bytes of text the index reads of a post, at most, in the same
/// order (a text is cut before the word the bound falls in, so no term is
/// made of a word's first letters): telling a character of
/// some scripts (Hangul jamo, Thai) a letter costs about 0.4 µs in a
/// component, and a word of them has no end to stop at, so four 170,000
/// character attachments of jamo, one word each, took 200 ms on every
/// update; this bounds that to 18 to 29 ms, as for ASCII text. (16,384
/// words of English are about 100 KiB.)
pub const MAX_TEXT_BYTES: usize = 128 << 10;

/// The distinct terms a post is indexed under, at most: of the words
/// read, the terms of highest weighted frequency (ties: the one met
/// first). Each costs a posting, a document frequency and a place in the
/// post's `ix/doc` record, written while the post holds the writers' turn
/// (about 4 µs each to add, as much to take out on an update); unbounded,
/// a post of three 500 KiB attachments of distinct words ran past its
/// memory cap after 0.4 s, and ten of 1 MB added 440 MB to the database.
/// (A long article of 10,000 words has about 2,000 distinct ones.)
pub const MAX_TERMS: usize = 2_048;

/// A post's terms: term -> (weighted frequency, the order it was first
/// met in).
type Weights = BTreeMap<String, (u64, usize)>;

/// The weighted term frequencies of a post and its weighted length (of
/// the words read). `bounded`: within [`MAX_TEXT_BYTES`], [`MAX_TOKENS`]
/// and [`MAX_TERMS`], as posts are indexed now; unbounded for a post
/// indexed before its `ix/doc` record existed (and before the bounds),
/// found again by all its terms.
fn weigh(post: &Post, markdown: &[&str], bounded: bool) -> (Weights, u64) {
    let (max_tokens, mut bytes_left) = match bounded {
        true => (MAX_TOKENS, MAX_TEXT_BYTES),
        false => (usize::MAX, usize::MAX),
    };
    let mut tf = Weights::new();
    let (mut read, mut len) = (0usize, 0u64);
    let mut count = |text: &str, weight: u64| {
        if read >= max_tokens || bytes_left == 0 {
            return;
        }
        let cut = cut_between_words(text, bytes_left);
        bytes_left = match cut.len() < text.len() {
            true => 0,
            false => bytes_left - cut.len(),
        };
        let text = cut;
        each_token(text, |t| {
            let first = tf.len();
            tf.entry(t).or_insert((0, first)).0 += weight;
            len += weight;
            read += 1;
            read < max_tokens
        });
    };
    for k in &post.keywords {
        count(k, KEYWORD_WEIGHT);
    }
    count(&post.content, CONTENT_WEIGHT);
    for m in markdown {
        count(m, ATTACHMENT_WEIGHT);
    }
    if bounded && tf.len() > MAX_TERMS {
        let mut ranked: Vec<(String, (u64, usize))> = tf.into_iter().collect();
        ranked.sort_unstable_by(|(_, (fa, a)), (_, (fb, b))| fb.cmp(fa).then(a.cmp(b)));
        ranked.truncate(MAX_TERMS);
        tf = ranked.into_iter().collect();
    }
    (tf, len)
}

/// What a post added to the index (`ix/doc/{post_id}`).
#[derive(serde::Serialize, serde::Deserialize)]
struct Doc {
    len: u64,
    keys: Vec<String>,
}

fn load_stats() -> Result<Stats, ApiError> {
    Ok(kv::get(STATS_KEY)?.unwrap_or_default())
}

/// Index a new post; `markdown` holds the text of its markdown attachments.
/// Keys and values are put together with `concat` and `itoa` rather than
/// `format!`: a post makes three of them per distinct word, and in a
/// component `format!` cost about 2,400 instructions each.
pub fn add(post: &Post, markdown: &[&str]) -> Result<(), ApiError> {
    let (tf, len) = weigh(post, markdown, true);
    // The statistics and every term's document frequency in one host call
    // (a paid post holds the commit batch while it runs), or one per
    // MAX_GET_MANY keys for a post of more distinct words than that.
    let mut read = vec![STATS_KEY.to_string()];
    read.extend(tf.keys().map(|term| df_key(term)));
    let packed = kv::get_many_chunked(None, &read)?;
    let mut values = read.iter().zip(packed.iter().flat_map(|p| p.values()));
    let mut stats: Stats = match values.next() {
        Some((key, Some(v))) => kv::parse(key, v)?,
        _ => Stats::default(),
    };
    stats.docs += 1;
    stats.total_len += len;
    let avgdl = stats.total_len as f64 / stats.docs as f64;
    let flipped = marketplace_common::order::flip_ulid(&post.post_id);
    let mut number = itoa::Buffer::new();
    let len_text = number.format(len).to_string();
    let mut keys = Vec::with_capacity(tf.len());
    for ((term, (f, _)), (df_key, df)) in tf.iter().zip(values) {
        let posting = [number.format(*f), " ", &len_text, " ", &post.post_type].concat();
        let key = posting_key(term, impact(*f as f64, len as f64, avgdl), &flipped);
        kv::put_raw(&key, posting.as_bytes())?;
        keys.push(key);
        let df: u64 = df.map_or(Ok(0), |v| kv::parse(df_key, v))?;
        kv::put_raw(df_key, number.format(df + 1).as_bytes())?;
    }
    kv::put(&doc_key(&post.post_id), &Doc { len, keys })?;
    kv::put(STATS_KEY, &stats)
}

/// Take a post out of the index (before an update re-adds it, or on
/// delete); `markdown` gives the texts as for [`add`], read only for posts
/// indexed before their `ix/doc` record existed. A post that is not
/// indexed is left alone.
pub fn remove(
    post: &Post,
    markdown: impl FnOnce() -> Result<Vec<String>, ApiError>,
) -> Result<(), ApiError> {
    let key = doc_key(&post.post_id);
    let (len, keys) = match kv::get::<Doc>(&key)? {
        Some(doc) => {
            kv::delete(&key)?;
            (doc.len, doc.keys)
        }
        None => {
            let texts = markdown()?;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            let (tf, len) = weigh(post, &texts, false);
            let mut keys = Vec::new();
            for term in tf.keys() {
                if let Some(k) = find_posting(term, &post.post_id)? {
                    keys.push(k);
                }
            }
            if keys.is_empty() {
                return Ok(());
            }
            (len, keys)
        }
    };
    // The postings, then the document frequencies of the terms whose
    // posting was there, read in one host call per MAX_GET_MANY (one
    // posting per term and post: no term comes twice).
    let mut df_keys = Vec::with_capacity(keys.len());
    for k in &keys {
        if kv::delete(k)? {
            let term = k
                .strip_prefix("ix/i/")
                .and_then(|rest| rest.split('\0').next())
                .unwrap_or_default();
            df_keys.push(df_key(term));
        }
    }
    let packed = kv::get_many_chunked(None, &df_keys)?;
    let mut number = itoa::Buffer::new();
    for (df_key, df) in df_keys.iter().zip(packed.iter().flat_map(|p| p.values())) {
        let df: u64 = df.map_or(Ok(0), |v| kv::parse(df_key, v))?;
        if df <= 1 {
            kv::delete(df_key)?;
        } else {
            kv::put_raw(df_key, number.format(df - 1).as_bytes())?;
        }
    }
    let mut stats = load_stats()?;
    stats.docs = stats.docs.saturating_sub(1);
    stats.total_len = if stats.docs == 0 {
        0
    } else {
        stats.total_len.saturating_sub(len)
    };
    kv::put(STATS_KEY, &stats)
}

/// The key of a post's posting in a term's list, found by reading the list.
fn find_posting(term: &str, post_id: &str) -> Result<Option<String>, ApiError> {
    const PAGE: u32 = 500;
    let suffix = marketplace_common::order::flip_ulid(post_id);
    let prefix = term_prefix(term);
    let end = kv::prefix_end(prefix.as_bytes());
    let mut start = prefix.clone().into_bytes();
    loop {
        let page = kv::scan_packed(None, &start, end.as_deref(), false, PAGE)?;
        let mut n = 0;
        let mut last = Vec::new();
        for (key, _) in page.entries() {
            n += 1;
            if key.len() == prefix.len() + 8 + suffix.len() && key.ends_with(suffix.as_bytes()) {
                return Ok(Some(String::from_utf8_lossy(key).into_owned()));
            }
            last = key.to_vec();
        }
        if n < PAGE as usize {
            return Ok(None);
        }
        last.push(0);
        start = last;
    }
}

/// The BM25 term-frequency part of a posting (k1 = 1.2, b = 0.75).
pub fn impact(tf: f64, len: f64, avgdl: f64) -> f64 {
    const K1: f64 = 1.2;
    const B: f64 = 0.75;
    tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avgdl.max(1.0)))
}

/// `ix/i/{term}\0{rank}{flipped post_id}`: best impact first, then newest
/// (`flipped` is the post id through `order::flip_ulid`).
pub fn posting_key(term: &str, impact: f64, flipped: &str) -> String {
    let scaled = (impact * 1e6).clamp(0.0, u32::MAX as f64) as u32;
    let mut key = term_prefix(term);
    key.reserve(8 + flipped.len());
    marketplace_common::hex::encode_into(&(u32::MAX - scaled).to_be_bytes(), &mut key);
    key.push_str(flipped);
    key
}

#[cfg(test)]
mod tests {
    use super::*;
    use marketplace_common::order::flip_ulid;

    /// The key of `post_id`'s posting.
    fn posting_key(term: &str, impact: f64, post_id: &str) -> String {
        super::posting_key(term, impact, &flip_ulid(post_id))
    }

    fn post(content: &str, keywords: &[&str]) -> Post {
        Post {
            post_id: "post_1".into(),
            parent_id: None,
            author_fingerprint: "ab".into(),
            content: content.into(),
            post_type: "post".into(),
            keywords: keywords.iter().map(|k| k.to_string()).collect(),
            attachments: vec![],
            activity_metadata: serde_json::Value::Null,
            created_at: String::new(),
            comment_count: 0,
            recipient_fingerprint: None,
            encrypted_payload: None,
            listing: None,
        }
    }

    #[test]
    fn a_post_is_indexed_by_its_most_used_terms() {
        // More distinct words than MAX_TERMS: the most frequent (weighted)
        // stay, then those met first; the length counts every word read.
        let many: Vec<String> = (0..MAX_TERMS + 500).map(|i| format!("w{i}")).collect();
        // A word met late, and often: kept.
        let late = format!("w{}", MAX_TERMS + 400);
        let markdown = [many.join(" "), [late.as_str(); 4].join(" ")];
        let markdown: Vec<&str> = markdown.iter().map(String::as_str).collect();
        let p = post("alpha alpha", &["beta"]);
        let (tf, len) = weigh(&p, &markdown, true);
        assert_eq!(tf.len(), MAX_TERMS);
        assert_eq!(tf["alpha"].0, 2 * CONTENT_WEIGHT);
        assert_eq!(tf["beta"].0, KEYWORD_WEIGHT);
        assert_eq!(tf[&late].0, 5);
        assert!(tf.contains_key("w0") && tf.contains_key(&format!("w{}", MAX_TERMS - 4)));
        assert!(!tf.contains_key(&format!("w{}", MAX_TERMS - 3)));
        let words = 2 + 1 + many.len() + 4;
        assert_eq!(len, 2 * CONTENT_WEIGHT + KEYWORD_WEIGHT + words as u64 - 3);
        // Unbounded (a post indexed before the bounds): every term.
        let (all, _) = weigh(&p, &markdown, false);
        assert_eq!(all.len(), MAX_TERMS + 500 + 2);
    }

    #[test]
    fn text_past_the_first_max_text_bytes_is_not_read() {
        // One long word of Hangul jamo (3 bytes each) in content, then an
        // attachment: the content is read to the budget, the rest never.
        let jamo = "\u{1100}".repeat(MAX_TEXT_BYTES / 3 + 10);
        let markdown = ["unseen".to_string()];
        let markdown: Vec<&str> = markdown.iter().map(String::as_str).collect();
        let (tf, len) = weigh(&post(&format!("seen {jamo}"), &[]), &markdown, true);
        assert_eq!(tf.len(), 2, "{:?}", tf.keys().collect::<Vec<_>>());
        assert!(tf.contains_key("seen"));
        assert_eq!(len, 2 * CONTENT_WEIGHT);
        let (tf, _) = weigh(&post(&format!("seen {jamo}"), &[]), &markdown, false);
        assert!(tf.contains_key("unseen"));
        // A cut inside a character moves back to its start (three bytes of
        // ASCII, then two-byte letters: the budget ends inside one).
        let text = format!("ab {}", "é".repeat(MAX_TEXT_BYTES));
        let (tf, len) = weigh(&post(&text, &[]), &[], true);
        assert_eq!(tf.len(), 2);
        assert_eq!(len, 2 * CONTENT_WEIGHT);
    }

    #[test]
    fn no_term_is_made_of_the_first_letters_of_a_word_the_bound_cuts() {
        // "zebra" runs over the byte bound: neither it nor "ze" is a
        // term, and nothing after it is read (the attachment either).
        let x = "x".repeat(64);
        let content = format!("{} zebra", "x".repeat(MAX_TEXT_BYTES - 3));
        let (tf, _) = weigh(&post(&content, &[]), &["later"], true);
        assert_eq!(tf.keys().collect::<Vec<_>>(), [&x]);
        // A bound that falls on the word's end takes it whole.
        let content = format!("{} zebra and more", "x".repeat(MAX_TEXT_BYTES - 7));
        let (tf, _) = weigh(&post(&content, &[]), &[], true);
        assert_eq!(tf.keys().collect::<Vec<_>>(), [&x, "zebra"]);
    }

    #[test]
    fn words_past_the_first_max_tokens_are_not_read() {
        let content = "a ".repeat(MAX_TOKENS - 1) + "last";
        let (tf, len) = weigh(&post(&content, &[]), &["never"], true);
        assert_eq!(tf.keys().collect::<Vec<_>>(), ["a", "last"]);
        assert_eq!(len, MAX_TOKENS as u64 * CONTENT_WEIGHT);
        let (tf, _) = weigh(&post(&content, &[]), &["seen"], false);
        assert!(tf.contains_key("seen"));
        // The keywords come first: here the content's last word is the
        // one past the bound.
        let (tf, _) = weigh(&post(&content, &["kept"]), &[], true);
        assert_eq!(tf.keys().collect::<Vec<_>>(), ["a", "kept"]);
    }

    #[test]
    fn keywords_are_read_however_long_the_content() {
        // The most content a post may have, in two-byte letters, fills the
        // byte bound by itself: the keywords are read before it.
        let content = "é".repeat(65_536);
        let (tf, len) = weigh(
            &post(&content, &["zqkeyword", "two words"]),
            &["never"],
            true,
        );
        assert!(
            tf.contains_key("zqkeyword") && tf.contains_key("words"),
            "{:?}",
            tf.keys().collect::<Vec<_>>()
        );
        assert!(!tf.contains_key("never"));
        // Three keyword words, and the content's one word (longer than a
        // token, so its first letters are its token either way).
        assert_eq!(len, 3 * KEYWORD_WEIGHT + CONTENT_WEIGHT);
    }

    #[test]
    fn posting_keys_keep_their_stored_form() {
        // The form search and earlier versions read: 8 lower-case hex
        // digits of the rank between the term and the flipped id.
        for (impact, rank) in [(0.0, "ffffffff"), (1.5, "ffe91c9f"), (1e9, "00000000")] {
            assert_eq!(
                posting_key("rust", impact, "post_01HZX3K9Q8"),
                format!("ix/i/rust\0{rank}{}", flip_ulid("post_01HZX3K9Q8"))
            );
        }
        let scaled = (0.123456 * 1e6) as u32;
        assert_eq!(
            posting_key("ü", 0.123456, "post_1"),
            format!("ix/i/ü\0{:08x}{}", u32::MAX - scaled, flip_ulid("post_1"))
        );
    }

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
