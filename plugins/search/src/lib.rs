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
//! [`MAX_POSTINGS`] postings for one word or with a filter, else
//! [`EXACT_BUDGET`], and lookups as [`complete`] says;
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
/// Postings a query reads per word at most, and in all for one word or
/// with a `post_type` filter (keeps a query's cost bounded).
const MAX_POSTINGS: usize = 5_000;
/// Postings a query of several words without a filter reads at most over
/// all its words (filtered out or not): past it the page is the best of
/// what was read (see [`search`]).
const EXACT_BUDGET: usize = 1_200;
/// Postings a round reads per list at most (rounds double from the first).
const MAX_ROUND: usize = 1_000;
/// `ix/doc` records looked up per query at most (see [`complete`])...
const LOOKUPS: usize = 96;
/// ...and their bytes at most.
const LOOKUP_BYTES: usize = 512 << 10;
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
    /// Where its flipped id is in [`Found::ids`], and its length.
    at: usize,
    id_len: usize,
    score: f64,
    /// The lists whose part is in `score` (bit per query term).
    seen: u32,
    /// Its other lists' parts were looked up (see [`complete`]).
    looked_up: bool,
    /// Its weighted length (from a posting's value).
    len: u64,
}

/// The posts found by several lists: each once, its id in one buffer, found
/// by a hash of its id (no allocation per post; an ordered map's byte
/// comparisons were a third of a two-word query).
#[derive(Default)]
struct Found {
    ids: Vec<u8>,
    all: Vec<Candidate>,
    /// FNV-1a of an id -> its index in `all` (a collision probes on).
    index: std::collections::HashMap<u64, usize, std::hash::BuildHasherDefault<Hashed>>,
}

/// A hasher for keys that are hashes already.
#[derive(Default)]
struct Hashed(u64);

impl std::hash::Hasher for Hashed {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl Found {
    fn id(&self, c: &Candidate) -> &[u8] {
        &self.ids[c.at..c.at + c.id_len]
    }

    /// The candidate of `id`, made when new.
    fn entry(&mut self, id: &[u8]) -> &mut Candidate {
        let mut h = id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        loop {
            match self.index.get(&h) {
                Some(&i) if self.id(&self.all[i]) == id => return &mut self.all[i],
                Some(_) => h = h.wrapping_add(1),
                None => break,
            }
        }
        let i = self.all.len();
        self.index.insert(h, i);
        self.all.push(Candidate {
            at: self.ids.len(),
            id_len: id.len(),
            ..Default::default()
        });
        self.ids.extend_from_slice(id);
        &mut self.all[i]
    }
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
    // With one word (or a filter: the old per-word reach) a query may read
    // MAX_POSTINGS; several words without one share EXACT_BUDGET.
    let budget = if lists.len() <= 1 || post_type.is_some() {
        MAX_POSTINGS
    } else {
        EXACT_BUDGET
    };
    let first = (limit * 2).max(40);
    let (ranked, exhausted) = if lists.len() <= 1 {
        one_list(lists.first_mut(), first, budget, limit, post_type, avgdl)?
    } else {
        many_lists(&mut lists, first, budget, limit, post_type, avgdl)?
    };
    let total = match (query.len(), post_type) {
        (1, None) => dfs[0],
        _ if exhausted => ranked.found as u64,
        (_, None) => (ranked.found as u64).max(dfs.iter().copied().max().unwrap_or(0)),
        _ => ranked.found as u64,
    };
    let Ranked {
        ids: id_bytes,
        mut best,
        ..
    } = ranked;
    let id = |s: &(usize, usize, f64)| &id_bytes[s.0..s.0 + s.1];
    // Best score first; newer post (smaller flipped id) first among equals.
    // (Ids are unique, so an unstable sort gives the same order.)
    best.sort_unstable_by(|a, b| b.2.total_cmp(&a.2).then_with(|| cmp_bytes(id(a), id(b))));
    best.truncate(limit);
    let ranked: Vec<f64> = best.iter().map(|s| s.2).collect();
    let ids: Vec<String> = best.iter().map(|s| flip_ulid_bytes(id(s))).collect();
    // The page is written as text: each stored post extended in place with
    // its rendered members and its score.
    let mut out = String::with_capacity(1024 * (ids.len() + 1));
    out.push_str(r#"{"term":"#);
    out.push_str(&json!(term).to_string());
    out.push_str(&format!(r#","total":{total},"results":["#));
    marketplace_guest::posts::render_many_into(
        &ids,
        |i, members| {
            let score = (ranked[i] * 10_000.0).round() / 10_000.0;
            members.push_str(r#""score":"#);
            members.push_str(&json_text(&score));
        },
        &mut out,
    )?;
    out.push_str("]}");
    Ok(out)
}

/// The posts found: their flipped ids in one buffer, each as (where its
/// id is, its length, its score), and how many were found.
struct Ranked {
    ids: Vec<u8>,
    best: Vec<(usize, usize, f64)>,
    found: usize,
}

/// One word's list (or none): read in rounds until the `limit`-th best
/// reaches the part of the last posting read (one round, but after a
/// drift), no map of candidates needed (a list names a post once).
/// Whether the list was read to its end.
fn one_list(
    list: Option<&mut List>,
    first: usize,
    budget: usize,
    limit: usize,
    post_type: Option<&str>,
    avgdl: f64,
) -> Result<(Ranked, bool), ApiError> {
    let mut ranked = Ranked {
        ids: Vec::with_capacity(first * 32),
        best: Vec::with_capacity(first),
        found: 0,
    };
    let Some(list) = list else {
        return Ok((ranked, true));
    };
    let mut round = first;
    loop {
        let share = budget.saturating_sub(list.read).max(1);
        read_round(list, round, share, post_type, avgdl, &mut |id, p| {
            ranked.best.push((ranked.ids.len(), id.len(), p.score));
            ranked.ids.extend_from_slice(id);
        })?;
        // The `limit`-th best reaches the bound: `limit` of them do.
        let bound = list.bound();
        if list.done
            || list.read >= budget
            || ranked.best.iter().filter(|s| s.2 >= bound).count() >= limit
        {
            break;
        }
        round = (round * 2).min(MAX_ROUND);
    }
    ranked.found = ranked.best.len();
    Ok((ranked, list.done && !list.capped))
}

/// Several words' lists: the threshold algorithm (see [`search`]).
/// Whether every list was read to its end.
fn many_lists(
    lists: &mut [List],
    first: usize,
    mut budget: usize,
    limit: usize,
    post_type: Option<&str>,
    avgdl: f64,
) -> Result<(Ranked, bool), ApiError> {
    let mut found = Found::default();
    let mut lookups = Lookups::default();
    let mut round = first;
    loop {
        let active = lists.iter().filter(|l| !l.done).count().max(1);
        // The budget left, shared by the lists still read.
        let share = (budget / active).max(1);
        for (bit, list) in lists.iter_mut().enumerate() {
            if list.done {
                continue;
            }
            let before = list.read;
            read_round(list, round, share, post_type, avgdl, &mut |id, p| {
                let c = found.entry(id);
                c.len = p.len;
                if c.seen & (1 << bit) == 0 {
                    c.score += p.score;
                    c.seen |= 1 << bit;
                }
            })?;
            budget = budget.saturating_sub(list.read - before);
        }
        complete(lists, &mut found, avgdl, limit, &mut lookups)?;
        let unread: f64 = lists.iter().map(List::bound).sum();
        if lists.iter().all(|l| l.done) || kth_best(&found, limit) >= unread || budget == 0 {
            break;
        }
        round = (round * 2).min(MAX_ROUND);
    }
    let ranked = Ranked {
        best: found
            .all
            .iter()
            .map(|c| (c.at, c.id_len, c.score))
            .collect(),
        found: found.all.len(),
        ids: found.ids,
    };
    Ok((ranked, lists.iter().all(|l| l.done && !l.capped)))
}

/// Read a round of `list`: `want` postings, or with a `post_type` filter
/// `want` that match (at most `share` read), each given to `found` with
/// its post's flipped id.
fn read_round(
    list: &mut List,
    want: usize,
    share: usize,
    post_type: Option<&str>,
    avgdl: f64,
    found: &mut dyn FnMut(&[u8], &Posting),
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
            found(
                key.get(list.prefix.len() + 8..).unwrap_or_default(),
                &posting,
            );
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
    found: &mut Found,
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
    // (best it could score, candidate) of each post to look up, best first.
    let mut wanted: Vec<(f64, usize)> = found
        .all
        .iter_mut()
        .enumerate()
        .filter(|(_, c)| !c.looked_up && c.seen != all)
        .filter_map(|(i, c)| {
            let best = c.score + could_add(c.seen);
            if best < kth {
                return None;
            }
            if c.len > LOOKUP_MAX_LEN {
                c.looked_up = true;
                return None;
            }
            Some((best, i))
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
            .map(|&(_, i)| format!("ix/doc/{}", flip_ulid_bytes(found.id(&found.all[i]))))
            .collect();
        let packed = kv::get_many_packed(Some("timeline"), &doc_keys)?;
        for (j, doc) in packed.values().enumerate() {
            let at = chunk_at * LOOKUP_CHUNK + j;
            let c = &mut found.all[wanted[at].1];
            lookups.records += 1;
            c.looked_up = true;
            let seen = c.seen;
            let Some(doc) = doc else { continue };
            lookups.bytes += doc.len();
            let id = found.id(&found.all[wanted[at].1]);
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
            let c = &mut found.all[wanted[at].1];
            if c.seen & (1 << l) == 0 {
                c.score += posting.score;
                c.seen |= 1 << l;
            }
        }
    }
    Ok(())
}

/// The `k`-th best of `scores` (minus infinity with fewer than `k`).
fn kth(scores: impl Iterator<Item = f64>, k: usize) -> f64 {
    let mut scores: Vec<f64> = scores.collect();
    if scores.len() < k || k == 0 {
        return f64::NEG_INFINITY;
    }
    let (_, kth, _) = scores.select_nth_unstable_by(k - 1, |a, b| b.total_cmp(a));
    *kth
}

/// The `k`-th best score found (minus infinity with fewer found).
fn kth_best(found: &Found, k: usize) -> f64 {
    kth(found.all.iter().map(|c| c.score), k)
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
        let mut found = Found::default();
        for (id, score) in [(b"a", 1.0), (b"b", 3.0), (b"c", 2.0)] {
            found.entry(id).score += score;
        }
        // The same id again is the same post.
        found.entry(b"b").score += 1.0;
        assert_eq!((found.all.len(), found.id(&found.all[1])), (3, &b"b"[..]));
        assert_eq!(kth_best(&found, 1), 4.0);
        assert_eq!(kth_best(&found, 3), 1.0);
        assert_eq!(kth_best(&found, 4), f64::NEG_INFINITY);
    }
}
