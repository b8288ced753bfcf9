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
//! A query reads each term's list best first, in rounds (the threshold
//! algorithm): the first reads `max(2 x limit, 40)` postings per term
//! (with a `post_type` filter, that many that match), each later one twice
//! as many. A post found in some lists gets its other terms' parts from
//! its `ix/doc` record, so every post found carries its whole score, and
//! a post not read in any list scores at most the sum of the lists' last
//! impacts: once the `limit`-th best reaches that sum, the page is the true
//! top `limit` and reading stops. Scores use the current statistics; the
//! order within a list is the impact when the post was indexed, so the
//! page is exact up to the drift of the average length since then. At
//! most [`READ_BUDGET`] postings are read per query. `total` is exact for
//! one term without a filter (its document frequency) and when every list
//! was read to its end; otherwise it is at least the posts found.

mod api;

use marketplace_common::order::{cmp_bytes, flip_ulid_bytes};
use marketplace_common::text::tokens;
use marketplace_guest::prelude::*;

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
/// Postings read over all the query's terms at most: past it the page is
/// the best of what was read (see [`search`]).
const READ_BUDGET: usize = 8_000;
/// Postings a round reads per list at most (rounds double from the first).
const MAX_ROUND: usize = 1_000;
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

/// One query term's posting list, as far as it was read.
struct List {
    idf: f64,
    /// `ix/i/{term}\0`.
    prefix: String,
    end: Option<Vec<u8>>,
    /// Where the next page starts.
    next: Vec<u8>,
    /// Read to its end.
    done: bool,
    /// Stopped at [`MAX_POSTINGS`] (so `total` cannot be counted).
    capped: bool,
    read: usize,
    /// The stored impact of the last posting read: what every posting
    /// after it has at most (the list is in impact order).
    last_impact: f64,
}

impl List {
    /// What this list can add to the score of a post it was not seen in:
    /// nothing once read to its end (the post lacks the term), else at
    /// most its last impact.
    fn bound(&self) -> f64 {
        if self.done && !self.capped {
            0.0
        } else {
            self.idf * self.last_impact
        }
    }
}

/// A post found in at least one list.
#[derive(Default)]
struct Candidate {
    score: f64,
    /// The lists whose part is in `score` (bit per query term).
    seen: u32,
    /// Its other lists' parts were looked up (see [`complete`]).
    looked_up: bool,
}

/// BM25's term part of a posting whose value is `"{tf} {len} {type}"`, and
/// its type.
fn part(value: &[u8], idf: f64, avgdl: f64) -> (f64, &str) {
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
    let score = idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avgdl));
    (score, parts.next().unwrap_or(""))
}

/// The impact a posting key's rank stores (8 hex digits of `u32::MAX -
/// impact x 10^6` after the list's prefix).
fn stored_impact(key: &[u8], prefix: usize) -> f64 {
    let rank = key
        .get(prefix..prefix + 8)
        .and_then(|h| std::str::from_utf8(h).ok())
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .unwrap_or(u32::MAX);
    f64::from(u32::MAX - rank) / 1e6
}

/// Run a search; the result document of GET /api/search (JSON text).
///
/// The threshold algorithm over impact-ordered lists: each round reads the
/// next `max(2 x limit, 40)` postings of every list (with a `post_type`
/// filter, that many that match), and a post found in some lists gets the
/// parts of its other lists from its `ix/doc` record, so every post found
/// has its whole score. A post in no list's read part scores at most the
/// sum of the lists' last impacts; once the `limit`-th best score reaches
/// that sum, no post unread can enter the page.
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

    let mut lists: Vec<List> = query
        .iter()
        .zip(&dfs)
        .filter(|(_, df)| **df > 0)
        .map(|(t, &df)| {
            let prefix = format!("ix/i/{t}\0");
            List {
                idf: (1.0 + (docs - df as f64 + 0.5) / (df as f64 + 0.5)).ln(),
                end: kv::prefix_end(prefix.as_bytes()),
                next: prefix.clone().into_bytes(),
                prefix,
                done: false,
                capped: false,
                read: 0,
                last_impact: f64::INFINITY,
            }
        })
        .collect();
    let mut round = (limit * 2).max(40);
    // By flipped post id (it sorts newest first).
    let mut found: std::collections::BTreeMap<Vec<u8>, Candidate> = Default::default();
    loop {
        for (bit, list) in lists.iter_mut().enumerate() {
            if !list.done {
                read_round(list, 1 << bit, round, post_type, avgdl, &mut found)?;
            }
        }
        if lists.len() > 1 {
            complete(&lists, &mut found, avgdl, limit)?;
        }
        let unread: f64 = lists.iter().map(List::bound).sum();
        let read: usize = lists.iter().map(|l| l.read).sum();
        if lists.iter().all(|l| l.done) || kth_best(&found, limit) >= unread || read >= READ_BUDGET
        {
            break;
        }
        round = (round * 2).min(MAX_ROUND);
    }
    let total = match (query.len(), post_type) {
        (1, None) => dfs[0],
        _ if lists.iter().all(|l| !l.capped && l.done) => found.len() as u64,
        (_, None) => (found.len() as u64).max(dfs.iter().copied().max().unwrap_or(0)),
        _ => found.len() as u64,
    };
    let mut ranked: Vec<(Vec<u8>, f64)> = found.into_iter().map(|(id, c)| (id, c.score)).collect();
    // Best score first; newer post (smaller flipped id) first among equals.
    // (Ids are unique, so an unstable sort gives the same order.)
    ranked.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then_with(|| cmp_bytes(&a.0, &b.0)));
    ranked.truncate(limit);
    let ids: Vec<String> = ranked.iter().map(|(id, _)| flip_ulid_bytes(id)).collect();
    // The page is written as text: each stored post extended in place with
    // its rendered members and its score.
    let mut out = String::with_capacity(1024 * (ids.len() + 1));
    out.push_str(r#"{"term":"#);
    out.push_str(&json!(term).to_string());
    out.push_str(&format!(r#","total":{total},"results":["#));
    marketplace_guest::posts::render_many_into(
        &ids,
        |i, members| {
            let score = (ranked[i].1 * 10_000.0).round() / 10_000.0;
            members.push_str(r#""score":"#);
            members.push_str(&json_text(&score));
        },
        &mut out,
    )?;
    out.push_str("]}");
    Ok(out)
}

/// Read a round of `list` (its bit in a candidate's `seen` is `bit`):
/// `want` postings, or with a `post_type` filter `want` that match.
fn read_round(
    list: &mut List,
    bit: u32,
    want: usize,
    post_type: Option<&str>,
    avgdl: f64,
    found: &mut std::collections::BTreeMap<Vec<u8>, Candidate>,
) -> Result<(), ApiError> {
    let mut matched = 0;
    let page = if post_type.is_some() {
        PAGE
    } else {
        want as u32
    };
    loop {
        let postings = kv::scan_packed(
            Some("timeline"),
            &list.next,
            list.end.as_deref(),
            false,
            page,
        )?;
        let mut entries = 0;
        let mut last_key: &[u8] = &[];
        for (key, value) in postings.entries() {
            entries += 1;
            last_key = key;
            list.last_impact = stored_impact(key, list.prefix.len());
            let (score, ptype) = part(value, list.idf, avgdl);
            if post_type.is_some_and(|want| want != ptype) {
                continue;
            }
            matched += 1;
            // Key: prefix, 8 hex digits of rank, the flipped post id.
            let id = key.get(list.prefix.len() + 8..).unwrap_or_default();
            let c = found.entry(id.to_vec()).or_default();
            if c.seen & bit == 0 {
                c.score += score;
                c.seen |= bit;
            }
        }
        list.read += entries;
        if entries < page as usize {
            list.done = true;
            list.last_impact = 0.0;
            return Ok(());
        }
        // Continue just after the last key read.
        list.next = last_key.to_vec();
        list.next.push(0);
        if list.read >= MAX_POSTINGS {
            (list.done, list.capped) = (true, true);
            return Ok(());
        }
        if matched >= want {
            return Ok(());
        }
    }
}

/// Give a post found in some lists but not all the parts of its other
/// lists, read through its `ix/doc` record (the posting keys the timeline
/// family wrote for it; posts indexed before that record existed keep the
/// parts found): each post that could still enter the page (what it has
/// plus what its other lists could add reaches the `limit`-th best found).
fn complete(
    lists: &[List],
    found: &mut std::collections::BTreeMap<Vec<u8>, Candidate>,
    avgdl: f64,
    limit: usize,
) -> Result<(), ApiError> {
    let all = (1u32 << lists.len()) - 1;
    let kth = kth_best(found, limit);
    let could_add = |seen: u32| -> f64 {
        lists
            .iter()
            .enumerate()
            .filter(|(l, _)| seen & (1 << l) == 0)
            .map(|(_, list)| list.bound())
            .sum()
    };
    let ids: Vec<Vec<u8>> = found
        .iter()
        .filter(|(_, c)| !c.looked_up && c.seen != all && c.score + could_add(c.seen) >= kth)
        .map(|(id, _)| id.clone())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    // A posting key as the record's JSON writes it, up to its rank: the
    // quote, `ix/i/{term}` and the `\u0000` after the term.
    let needles: Vec<Vec<u8>> = lists
        .iter()
        .map(|l| {
            let mut text = json!(l.prefix).to_string().into_bytes();
            text.pop();
            text
        })
        .collect();
    let finders: Vec<memchr::memmem::Finder> =
        needles.iter().map(memchr::memmem::Finder::new).collect();
    let doc_keys: Vec<String> = ids
        .iter()
        .map(|id| format!("ix/doc/{}", flip_ulid_bytes(id)))
        .collect();
    // (candidate, list) of each part to read, and its posting key.
    let mut wanted: Vec<(usize, usize)> = Vec::new();
    let mut posting_keys: Vec<String> = Vec::new();
    for (chunk_at, chunk) in doc_keys.chunks(kv::MAX_GET_MANY).enumerate() {
        let packed = kv::get_many_packed(Some("timeline"), chunk)?;
        for (j, doc) in packed.values().enumerate() {
            let at = chunk_at * kv::MAX_GET_MANY + j;
            let Some(doc) = doc else { continue };
            let seen = found[&ids[at]].seen;
            for (l, list) in lists.iter().enumerate() {
                if seen & (1 << l) != 0 {
                    continue;
                }
                let Some(rank) = finders[l]
                    .find(doc)
                    .and_then(|i| doc.get(i + needles[l].len()..i + needles[l].len() + 8))
                    .and_then(|r| std::str::from_utf8(r).ok())
                else {
                    continue;
                };
                wanted.push((at, l));
                posting_keys.push(format!(
                    "{}{rank}{}",
                    list.prefix,
                    String::from_utf8_lossy(&ids[at])
                ));
            }
        }
    }
    for id in &ids {
        if let Some(c) = found.get_mut(id) {
            c.looked_up = true;
        }
    }
    for (chunk_at, chunk) in posting_keys.chunks(kv::MAX_GET_MANY).enumerate() {
        let packed = kv::get_many_packed(Some("timeline"), chunk)?;
        for (j, value) in packed.values().enumerate() {
            let (at, l) = wanted[chunk_at * kv::MAX_GET_MANY + j];
            let Some(value) = value else { continue };
            let (score, _) = part(value, lists[l].idf, avgdl);
            if let Some(c) = found.get_mut(&ids[at])
                && c.seen & (1 << l) == 0
            {
                c.score += score;
                c.seen |= 1 << l;
            }
        }
    }
    Ok(())
}

/// The `k`-th best score found (minus infinity with fewer found).
fn kth_best(found: &std::collections::BTreeMap<Vec<u8>, Candidate>, k: usize) -> f64 {
    if found.len() < k {
        return f64::NEG_INFINITY;
    }
    let mut scores: Vec<f64> = found.values().map(|c| c.score).collect();
    let (_, kth, _) = scores.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

marketplace_guest::endpoint_plugin!(Search);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_posting_key_gives_back_its_impact_and_a_value_its_part() {
        // As the timeline family writes them: `u32::MAX - impact x 10^6`.
        let prefix = "ix/i/walnut\0";
        let key = format!("{prefix}{:08x}FLIPPEDID", u32::MAX - 1_234_567);
        assert!((stored_impact(key.as_bytes(), prefix.len()) - 1.234567).abs() < 1e-9);
        assert_eq!(stored_impact(b"ix/i/x\0zz", 7), 0.0);
        // tf 3 in a post of the average length: idf x 3 x 2.2 / (3 + 1.2).
        let (score, ptype) = part(b"3 30 offer", 2.0, 30.0);
        assert!((score - 2.0 * 3.0 * 2.2 / 4.2).abs() < 1e-12);
        assert_eq!(ptype, "offer");
    }

    #[test]
    fn the_kth_best_needs_k_found() {
        let mut found = std::collections::BTreeMap::new();
        for (id, score) in [(b"a", 1.0), (b"b", 3.0), (b"c", 2.0)] {
            found.insert(
                id.to_vec(),
                Candidate {
                    score,
                    ..Default::default()
                },
            );
        }
        assert_eq!(kth_best(&found, 1), 3.0);
        assert_eq!(kth_best(&found, 3), 1.0);
        assert_eq!(kth_best(&found, 4), f64::NEG_INFINITY);
    }
}
