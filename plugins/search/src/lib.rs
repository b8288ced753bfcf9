//! The `search` family: `GET /api/search?term=&limit=&post_type=`.
//!
//! Reads the inverted index the timeline family writes in the same
//! transaction as each post: per term an impact-ordered posting list
//! (`ix/i/{term}\0{rank}{flipped post_id}` -> `"{tf} {len} {post_type}"`,
//! best BM25 term part first), the exact document frequency
//! (`ix/df/{term}`) and `ix/stats`. The query is tokenised with the same
//! tokenizer and ranked with BM25 (k1 = 1.2, b = 0.75) over field-weighted
//! term frequencies (content 3, keywords 2, markdown attachments 1).
//!
//! A query reads only the head of each term's list: the best
//! `max(2 x limit, 40)` postings (with a `post_type` filter, until that
//! many match or [`MAX_POSTINGS`] were read). Those are rescored exactly
//! with the current statistics, so a one-term query returns its true BM25
//! top results (up to drift of the average length since indexing); for
//! several terms, a post's score sums the lists whose head it is in.
//! `total` is exact for one term without a filter (its document frequency)
//! and otherwise counts the posts found.

mod api;

use marketplace_common::order::{cmp_bytes, flip_ulid_bytes};
use marketplace_common::text::tokens;
use marketplace_guest::prelude::*;

/// A posting read: where its post id is in the buffer of ids, and its part
/// of the post's score.
struct Scored {
    at: usize,
    len: usize,
    score: f64,
}

struct Search;

/// `ix/stats`, kept by the timeline family.
#[derive(serde::Deserialize, Default)]
struct Stats {
    docs: u64,
    total_len: u64,
}

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Postings read per query term at most (keeps a query's cost bounded).
const MAX_POSTINGS: usize = 5_000;
/// Postings read per storage call when filtering by type.
const PAGE: u32 = 200;
/// Query terms used at most.
const MAX_TERMS: usize = 16;

impl Endpoint for Search {
    const NAME: &'static str = "search";

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

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
                let post_type = marketplace_guest::posts::post_type_filter(req.query("post_type"))?;
                Ok(Response {
                    status: 200,
                    headers: vec![],
                    body: search(&term, limit, post_type)?.into_bytes(),
                })
            }
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

/// Run a search; the result document of GET /api/search (JSON text).
fn search(term: &str, limit: usize, post_type: Option<&str>) -> Result<String, ApiError> {
    let mut query: Vec<String> = tokens(term);
    query.sort();
    query.dedup();
    query.truncate(MAX_TERMS);

    // The statistics and every term's document frequency in one call.
    let mut keys = vec!["ix/stats".to_string()];
    keys.extend(query.iter().map(|t| format!("ix/df/{t}")));
    let packed = kv::get_many_packed(Some("timeline"), &keys)?;
    let mut values = keys.iter().zip(packed.values());
    let stats: Stats = match values.next() {
        Some((key, Some(v))) => kv::parse(key, v)?,
        _ => Stats::default(),
    };
    let dfs: Vec<u64> = values
        .map(|(key, v)| v.map_or(Ok(0), |v| kv::parse(key, v)))
        .collect::<Result<_, _>>()?;
    let docs = stats.docs as f64;
    let avgdl = if stats.docs > 0 {
        stats.total_len as f64 / docs
    } else {
        1.0
    };

    let want = (limit * 2).max(40);
    // Every posting read: its flipped post id (kept flipped until the final
    // page: it sorts newest first), as a range of `id_bytes`, one buffer
    // for all, and its part of the score.
    let mut id_bytes: Vec<u8> = Vec::with_capacity(want * query.len() * 32);
    let mut found: Vec<Scored> = Vec::with_capacity(want * query.len());
    let mut lists = 0;
    let mut exhausted = true;
    for (t, &df) in query.iter().zip(&dfs) {
        if df == 0 {
            continue;
        }
        lists += 1;
        let idf = (1.0 + (docs - df as f64 + 0.5) / (df as f64 + 0.5)).ln();
        let prefix = format!("ix/i/{t}\0");
        let end = kv::prefix_end(prefix.as_bytes());
        let mut start = prefix.clone().into_bytes();
        let (mut matched, mut read) = (0, 0);
        loop {
            let page = if post_type.is_some() {
                PAGE
            } else {
                want as u32
            };
            let postings = kv::scan_packed(Some("timeline"), &start, end.as_deref(), false, page)?;
            let mut entries = 0;
            let mut last_key: &[u8] = &[];
            for (key, value) in postings.entries() {
                entries += 1;
                last_key = key;
                let value = std::str::from_utf8(value).unwrap_or("");
                let mut parts = value.splitn(3, ' ');
                // Both are integers (weighted counts).
                let tf = parts
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0) as f64;
                let len = parts
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
                    .map_or(avgdl, |l| l as f64);
                let ptype = parts.next().unwrap_or("");
                if post_type.is_some_and(|want| want != ptype) {
                    continue;
                }
                matched += 1;
                let s = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avgdl));
                // Key: prefix, 8 hex digits of rank, the flipped post id.
                let id = key.get(prefix.len() + 8..).unwrap_or_default();
                found.push(Scored {
                    at: id_bytes.len(),
                    len: id.len(),
                    score: s,
                });
                id_bytes.extend_from_slice(id);
            }
            let last_page = entries < page as usize;
            read += entries;
            if last_page {
                break;
            }
            if matched >= want || read >= MAX_POSTINGS {
                exhausted = false;
                break;
            }
            // Continue just after the last key read.
            start = last_key.to_vec();
            start.push(0);
        }
    }
    let id = |s: &Scored| &id_bytes[s.at..s.at + s.len];
    // A post in several terms' lists: one entry, its parts summed in term
    // order (a stable sort keeps them in it). One list names a post once.
    if lists > 1 {
        found.sort_by(|a, b| cmp_bytes(id(a), id(b)));
        found.dedup_by(|later, first| {
            let same = id(later) == id(first);
            if same {
                first.score += later.score;
            }
            same
        });
    }
    let total = match (query.len(), post_type) {
        (1, None) => dfs[0],
        _ if exhausted => found.len() as u64,
        (_, None) => (found.len() as u64).max(dfs.iter().copied().max().unwrap_or(0)),
        _ => found.len() as u64,
    };
    let mut ranked = found;
    // Best score first; newer post (smaller flipped id) first among equals.
    // (Ids are unique, so an unstable sort gives the same order.)
    ranked.sort_unstable_by(|a, b| {
        b.score
            .total_cmp(&a.score)
            .then_with(|| cmp_bytes(id(a), id(b)))
    });
    ranked.truncate(limit);
    let ids: Vec<String> = ranked.iter().map(|s| flip_ulid_bytes(id(s))).collect();
    // The page is written as text: each stored post extended in place with
    // its rendered members and its score.
    let mut out = String::with_capacity(1024 * (ids.len() + 1));
    out.push_str(r#"{"term":"#);
    out.push_str(&json!(term).to_string());
    out.push_str(&format!(r#","total":{total},"results":["#));
    marketplace_guest::posts::render_many_into(
        &ids,
        |i, members| {
            let score = (ranked[i].score * 10_000.0).round() / 10_000.0;
            members.push_str(r#""score":"#);
            members.push_str(&json_text(&score));
        },
        &mut out,
    )?;
    out.push_str("]}");
    Ok(out)
}

marketplace_guest::endpoint_plugin!(Search);
