//! The `search` family: `GET /api/search?term=&limit=&post_type=`.
//!
//! Reads the inverted index the timeline family writes in the same
//! transaction as each post (`ix/t/{term}\0{post_id}` -> `"{tf} {len}
//! {post_type}"`, `ix/stats`), tokenises the query with the same tokenizer
//! and ranks with BM25 (k1 = 1.2, b = 0.75) over field-weighted term
//! frequencies (content 3, keywords 2, markdown attachments 1).
//!
//! Cost is bounded: per query term at most [`MAX_POSTINGS`] postings are
//! read, newest posts first. IDF uses the exact document frequency
//! (`ix/df/{term}`), so scores are true BM25; for a term in more posts than
//! that, only its newest posts compete.

use marketplace_common::text::tokens;
use marketplace_guest::prelude::*;
use marketplace_guest::storage;
use std::collections::HashMap;

struct Search;

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Postings read per query term at most (keeps a query's cost bounded).
const MAX_POSTINGS: u32 = 5_000;
/// Query terms used at most.
const MAX_TERMS: usize = 16;

impl Endpoint for Search {
    const NAME: &'static str = "search";

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("GET", "/api/search") => {
                let term = req.query("term").unwrap_or("").trim().to_string();
                if term.is_empty() {
                    return Err(ApiError::invalid("term", "is required"));
                }
                if term.chars().count() > 1000 {
                    return Err(ApiError::invalid("term", "must be at most 1000 characters"));
                }
                let limit = req.query_int("limit", 1, 100)?.unwrap_or(20) as usize;
                let post_type = req.query("post_type").filter(|t| !t.is_empty());
                Ok(json(200, &search(&term, limit, post_type)?))
            }
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

/// Run a search; the result document of GET /api/search.
fn search(term: &str, limit: usize, post_type: Option<&str>) -> Result<Value, ApiError> {
    let stats: Value = kv::get_in(Some("timeline"), "ix/stats")?
        .unwrap_or_else(|| json!({"docs": 0, "total_len": 0}));
    let docs = stats["docs"].as_u64().unwrap_or(0) as f64;
    let avgdl = if docs > 0.0 {
        stats["total_len"].as_u64().unwrap_or(0) as f64 / docs
    } else {
        1.0
    };

    let mut query: Vec<String> = tokens(term);
    query.sort();
    query.dedup();
    query.truncate(MAX_TERMS);

    let mut scores: HashMap<String, f64> = HashMap::new();
    let mut capped = false;
    for t in &query {
        let prefix = format!("ix/t/{t}\0");
        let end = kv::prefix_end(prefix.as_bytes());
        let postings = storage::scan(
            Some("timeline"),
            prefix.as_bytes(),
            end.as_deref(),
            // Post ids are ULIDs: a reverse scan reads the newest posts first.
            true,
            MAX_POSTINGS,
        )
        .map_err(|e| ApiError::internal(format!("{e:?}")))?;
        let df_exact: Option<u64> = kv::get_in(Some("timeline"), &format!("ix/df/{t}"))?;
        let df = df_exact.unwrap_or(0).max(postings.len() as u64) as f64;
        if postings.len() as u32 == MAX_POSTINGS {
            capped = true;
        }
        let idf = (1.0 + (docs - df + 0.5) / (df + 0.5)).ln();
        for p in postings {
            let value = String::from_utf8_lossy(&p.value);
            let mut parts = value.splitn(3, ' ');
            let tf: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0.0);
            let len: f64 = parts.next().and_then(|v| v.parse().ok()).unwrap_or(avgdl);
            let ptype = parts.next().unwrap_or("");
            if post_type.is_some_and(|want| want != ptype) {
                continue;
            }
            let key = String::from_utf8_lossy(&p.key[prefix.len()..]).into_owned();
            let s = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avgdl));
            *scores.entry(key).or_default() += s;
        }
    }
    // With a capped term and no type filter, the exact count of a one-term
    // query is its document frequency.
    let mut total = scores.len() as u64;
    if capped && query.len() == 1 && post_type.is_none() {
        let df: Option<u64> = kv::get_in(Some("timeline"), &format!("ix/df/{}", query[0]))?;
        total = total.max(df.unwrap_or(0));
    }
    let mut ranked: Vec<(String, f64)> = scores.into_iter().collect();
    // Best score first; newer post first among equals.
    ranked.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
    let mut results = Vec::new();
    for (post_id, score) in ranked.into_iter().take(limit) {
        let Some(mut post) = marketplace_guest::posts::load_rendered(&post_id)? else {
            continue;
        };
        post["score"] = json!((score * 10_000.0).round() / 10_000.0);
        results.push(post);
    }
    Ok(json!({"term": term, "total": total, "results": results}))
}

marketplace_guest::endpoint_plugin!(Search);
