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
//! a post not read in any list scores at most the sum of the score parts
//! of the lists' last postings read: once the `limit`-th best reaches that
//! sum, the page is the true top `limit` and reading stops. Scores use the
//! current statistics; the order within a list is the impact when the post
//! was indexed, so the page is exact up to the drift of the average length
//! since then (the bound is the last posting's current score, on the same
//! scale as the page's, so posts of equal impact stop a query as soon as
//! the page is full whatever the drift). The work is bounded: at most
//! [`READ_BUDGET`] postings per query, and lookups as [`complete`] says;
//! past them the page is the best of what was read. `total` is exact for
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
/// Postings read over all the query's terms at most (filtered out or not):
/// past it the page is the best of what was read (see [`search`]).
const READ_BUDGET: usize = 4_000;
/// Postings a round reads per list at most (rounds double from the first).
const MAX_ROUND: usize = 1_000;
/// `ix/doc` records looked up per query at most (see [`complete`])...
const LOOKUPS: usize = 256;
/// ...and their bytes at most.
const LOOKUP_BYTES: usize = 2 << 20;
/// A post is looked up only up to this weighted length: its record has at
/// most one key per unit of it, so no record read is large (a post's author
/// chooses its size).
const LOOKUP_MAX_LEN: u64 = 1_024;
/// Records read per storage call.
const LOOKUP_CHUNK: usize = 16;
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
    /// The score part of the last posting read: what every posting after
    /// it has at most, the list being in impact order (impacts as of
    /// indexing; see the module doc).
    last_part: f64,
}

impl List {
    /// What this list can add to the score of a post it was not seen in:
    /// nothing once read to its end (the post lacks the term), else at
    /// most the part of the last posting read.
    fn bound(&self) -> f64 {
        if self.done && !self.capped {
            0.0
        } else {
            self.last_part
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
    /// Its weighted length (from a posting's value).
    len: u64,
}

/// A posting whose value is `"{tf} {len} {type}"`, read.
struct Posting<'v> {
    /// BM25's term part.
    score: f64,
    /// The post's weighted length (0 when unreadable).
    len: u64,
    post_type: &'v str,
}

fn part(value: &[u8], idf: f64, avgdl: f64) -> Posting<'_> {
    let value = std::str::from_utf8(value).unwrap_or("");
    let mut parts = value.splitn(3, ' ');
    // Both are integers (weighted counts).
    let tf = parts
        .next()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0) as f64;
    let len = parts.next().and_then(|v| v.parse::<u64>().ok());
    let l = len.map_or(avgdl, |l| l as f64);
    Posting {
        score: idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * l / avgdl)),
        len: len.unwrap_or(0),
        post_type: parts.next().unwrap_or(""),
    }
}

/// Run a search; the result document of GET /api/search (JSON text).
///
/// The threshold algorithm over impact-ordered lists: each round reads the
/// next `max(2 x limit, 40)` postings of every list (with a `post_type`
/// filter, that many that match), and a post found in some lists gets the
/// parts of its other lists from its `ix/doc` record, so every post found
/// has its whole score. A post in no list's read part scores at most the
/// sum of the parts of the lists' last postings read; once the `limit`-th
/// best score reaches that sum, no post unread can enter the page.
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
                last_part: f64::INFINITY,
            }
        })
        .collect();
    let mut round = (limit * 2).max(40);
    // By flipped post id (it sorts newest first).
    let mut found: std::collections::BTreeMap<Vec<u8>, Candidate> = Default::default();
    let mut lookups = Lookups::default();
    let mut budget = READ_BUDGET;
    loop {
        let active = lists.iter().filter(|l| !l.done).count().max(1);
        // The budget left, shared by the lists still read.
        let share = (budget / active).max(1);
        for (bit, list) in lists.iter_mut().enumerate() {
            if !list.done {
                let before = list.read;
                read_round(list, 1 << bit, round, share, post_type, avgdl, &mut found)?;
                budget = budget.saturating_sub(list.read - before);
            }
        }
        if lists.len() > 1 {
            complete(&lists, &mut found, avgdl, limit, &mut lookups)?;
        }
        let unread: f64 = lists.iter().map(List::bound).sum();
        if lists.iter().all(|l| l.done) || kth_best(&found, limit) >= unread || budget == 0 {
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
    share: usize,
    post_type: Option<&str>,
    avgdl: f64,
    found: &mut std::collections::BTreeMap<Vec<u8>, Candidate>,
) -> Result<(), ApiError> {
    let mut matched = 0;
    // Read at most `share` postings this round, and MAX_POSTINGS in all.
    let stop_at = (list.read + share).min(MAX_POSTINGS);
    loop {
        let page = if post_type.is_some() {
            PAGE as usize
        } else {
            want
        }
        .min(stop_at.saturating_sub(list.read))
        .max(1) as u32;
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
            let posting = part(value, list.idf, avgdl);
            list.last_part = posting.score;
            if post_type.is_some_and(|want| want != posting.post_type) {
                continue;
            }
            matched += 1;
            // Key: prefix, 8 hex digits of rank, the flipped post id.
            let id = key.get(list.prefix.len() + 8..).unwrap_or_default();
            let c = found.entry(id.to_vec()).or_default();
            c.len = posting.len;
            if c.seen & bit == 0 {
                c.score += posting.score;
                c.seen |= bit;
            }
        }
        list.read += entries;
        if entries < page as usize {
            list.done = true;
            list.last_part = 0.0;
            return Ok(());
        }
        // Continue just after the last key read.
        list.next = last_key.to_vec();
        list.next.push(0);
        if list.read >= MAX_POSTINGS {
            (list.done, list.capped) = (true, true);
            return Ok(());
        }
        if matched >= want || list.read >= stop_at {
            return Ok(());
        }
    }
}

/// What a query's [`complete`] calls have read.
#[derive(Default)]
struct Lookups {
    records: usize,
    bytes: usize,
}

/// Give a post found in some lists but not all the parts of its other
/// lists, read through its `ix/doc` record (the posting keys the timeline
/// family wrote for it): each post that could still enter the page (what
/// it has plus what its other lists could add reaches the `limit`-th best
/// found), best first. Bounded, since a stranger can write posts that
/// would be looked up: at most [`LOOKUPS`] records and [`LOOKUP_BYTES`] per
/// query, and only of posts up to [`LOOKUP_MAX_LEN`]; a post not looked up
/// (a longer one, one past those bounds, one indexed before its record
/// existed) keeps the parts found.
fn complete(
    lists: &[List],
    found: &mut std::collections::BTreeMap<Vec<u8>, Candidate>,
    avgdl: f64,
    limit: usize,
    lookups: &mut Lookups,
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
    // (best it could score, id) of each post to look up, best first.
    let mut wanted: Vec<(f64, Vec<u8>)> = found
        .iter_mut()
        .filter(|(_, c)| !c.looked_up && c.seen != all)
        .filter_map(|(id, c)| {
            let best = c.score + could_add(c.seen);
            if best < kth {
                return None;
            }
            if c.len > LOOKUP_MAX_LEN {
                c.looked_up = true;
                return None;
            }
            Some((best, id.clone()))
        })
        .collect();
    wanted.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));
    wanted.truncate(LOOKUPS.saturating_sub(lookups.records));
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
    // (candidate, list) of each part to read, and its posting key.
    let mut parts: Vec<(usize, usize)> = Vec::new();
    let mut posting_keys: Vec<String> = Vec::new();
    for (chunk_at, chunk) in wanted.chunks(LOOKUP_CHUNK).enumerate() {
        if lookups.bytes >= LOOKUP_BYTES {
            break;
        }
        let doc_keys: Vec<String> = chunk
            .iter()
            .map(|(_, id)| format!("ix/doc/{}", flip_ulid_bytes(id)))
            .collect();
        let packed = kv::get_many_packed(Some("timeline"), &doc_keys)?;
        for (j, doc) in packed.values().enumerate() {
            let at = chunk_at * LOOKUP_CHUNK + j;
            let id = &wanted[at].1;
            lookups.records += 1;
            let Some(c) = found.get_mut(id) else { continue };
            c.looked_up = true;
            let Some(doc) = doc else { continue };
            lookups.bytes += doc.len();
            for (l, list) in lists.iter().enumerate() {
                if c.seen & (1 << l) != 0 {
                    continue;
                }
                let Some(rank) = finders[l]
                    .find(doc)
                    .and_then(|i| doc.get(i + needles[l].len()..i + needles[l].len() + 8))
                    .and_then(|r| std::str::from_utf8(r).ok())
                else {
                    continue;
                };
                parts.push((at, l));
                posting_keys.push(format!(
                    "{}{rank}{}",
                    list.prefix,
                    String::from_utf8_lossy(id)
                ));
            }
        }
    }
    // Postings are small (`"{tf} {len} {type}"`).
    for (chunk_at, chunk) in posting_keys.chunks(kv::MAX_GET_MANY).enumerate() {
        let packed = kv::get_many_packed(Some("timeline"), chunk)?;
        for (j, value) in packed.values().enumerate() {
            let (at, l) = parts[chunk_at * kv::MAX_GET_MANY + j];
            let Some(value) = value else { continue };
            let posting = part(value, lists[l].idf, avgdl);
            if let Some(c) = found.get_mut(&wanted[at].1)
                && c.seen & (1 << l) == 0
            {
                c.score += posting.score;
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
    fn a_posting_value_gives_its_part_and_type() {
        // tf 3 in a post of the average length: idf x 3 x 2.2 / (3 + 1.2).
        let p = part(b"3 30 offer", 2.0, 30.0);
        assert!((p.score - 2.0 * 3.0 * 2.2 / 4.2).abs() < 1e-12);
        assert_eq!((p.len, p.post_type), (30, "offer"));
        assert_eq!(part(b"junk", 1.0, 30.0).len, 0);
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
