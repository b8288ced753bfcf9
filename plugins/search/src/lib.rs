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
//! A query whose lists hold at most [`WHOLE_READ`] postings in all reads
//! them whole (exact whatever the drift below). Any other reads each
//! term's list best first, in rounds (the threshold algorithm): the first reads `max(2 x limit, 40)` postings per term
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
use marketplace_guest::index::{STATS_KEY, Stats, df_key, doc_key, search_term, term_prefix};
use marketplace_guest::prelude::*;
use marketplace_guest::{Setting, settings};

struct Search;

const K1: f64 = 1.2;
const B: f64 = 0.75;
/// Postings a query reads per word at most, and in all for one word or
/// with a `post_type` filter (keeps a query's cost bounded).
const MAX_POSTINGS: usize = 5_000;
/// Postings a query of several words without a filter reads at most over
/// all its words (filtered out or not): past it the page is the best of
/// what was read (see [`search`]).
const EXACT_BUDGET: usize = 1_200;
/// Postings a later round reads per list at most (rounds double from the
/// first; a whole read's one round reads each list to its end).
const MAX_ROUND: usize = 1_000;
/// `ix/doc` records looked up per query at most (see [`complete`])...
const LOOKUPS: usize = 160;
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
/// A query whose words' lists hold this many postings in all is read
/// whole: its page is then exact whatever the average length did since
/// the posts were indexed (a young service's first posts were ranked
/// against an average of a few posts), at a bounded cost (about 0.1 µs a
/// posting). The operator's `[settings.search] whole_read` replaces it
/// (0 to [`MAX_WHOLE_READ`]; 0: always the threshold algorithm).
const WHOLE_READ: u64 = 1_000;
/// The largest `whole_read`: below [`MAX_POSTINGS`], so a list read whole
/// is seen to end rather than taken as capped.
const MAX_WHOLE_READ: u64 = 4_000;

/// [`WHOLE_READ`], or the operator's `whole_read` (a load refuses any
/// value but a whole number up to [`MAX_WHOLE_READ`]).
fn whole_read() -> u64 {
    marketplace_guest::endpoint_bindings::marketplace::plugin::settings::get("whole_read")
        .and_then(|v| whole_read_of(&v).ok())
        .unwrap_or(WHOLE_READ)
}

/// A `whole_read` setting's value, as [`whole_read`] reads it and a load
/// checks it.
fn whole_read_of(text: &str) -> Result<u64, String> {
    settings::whole(text, 0, MAX_WHOLE_READ)
}

/// The settings search reads.
const SETTINGS: &[Setting] = &[Setting {
    key: "whole_read",
    check: |v| whole_read_of(v).map(drop),
}];

impl Endpoint for Search {
    const NAME: &'static str = "search";
    const SETTINGS: Option<&'static [Setting]> = Some(SETTINGS);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("GET", "/api/search") => {
                let term = req
                    .query("term")
                    .ok_or_else(|| ApiError::invalid("term", "is required"))?;
                let term = search_term(term).map_err(|p| ApiError::invalid("term", p.rule()))?;
                let limit = req.query_int("limit", 1, 100)?.unwrap_or(20) as usize;
                let post_type = marketplace_guest::posts::post_type_filter(req.query("post_type"))?;
                Ok(Response {
                    status: 200,
                    headers: vec![],
                    body: search(term, limit, post_type)?.into_bytes(),
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
    /// Read to its end before the page is taken (see [`WHOLE_READ`]).
    whole: bool,
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
        } else if self.whole {
            f64::INFINITY
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
    /// [`hash`] of an id -> its index in `all` (a collision probes on).
    index: std::collections::HashMap<u64, usize, std::hash::BuildHasherDefault<Hashed>>,
}

/// A hash of a flipped post id: FNV-1a over its eight-byte words (and
/// its last bytes), so a 26-byte id is four steps, not 26.
fn hash(id: &[u8]) -> u64 {
    let mut words = id.chunks_exact(8);
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for w in &mut words {
        h = (h ^ u64::from_le_bytes(w.try_into().expect("eight bytes")))
            .wrapping_mul(0x100_0000_01b3)
            .rotate_left(29);
    }
    for &b in words.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    // The map takes its bucket from the low bits and its tag from the
    // high ones: mix both ways (MurmurHash3's finalizer).
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
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

    /// Room for `n` posts (a query knows how many postings it may read).
    fn with_capacity(n: usize) -> Found {
        let mut index = std::collections::HashMap::default();
        index.reserve(n);
        Found {
            ids: Vec::with_capacity(n * 26),
            all: Vec::with_capacity(n),
            index,
        }
    }

    /// The candidate of `id`, made when new.
    fn entry(&mut self, id: &[u8]) -> &mut Candidate {
        let mut h = hash(id);
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
    post_type: &'v [u8],
}

/// Read a posting's value in place (a query reads up to thousands: no
/// UTF-8 check or string split per posting). Both numbers are decimal
/// integers (weighted counts); an unreadable tf counts 0, an unreadable
/// length the average.
fn part(value: &[u8], idf: f64, avgdl: f64) -> Posting<'_> {
    let mut fields = value.splitn(3, |&b| b == b' ');
    let tf = fields.next().and_then(decimal).unwrap_or(0) as f64;
    let len = fields.next().and_then(decimal);
    let l = len.map_or(avgdl, |l| l as f64);
    Posting {
        score: idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * l / avgdl)),
        len: len.unwrap_or(0),
        post_type: fields.next().unwrap_or_default(),
    }
}

/// A run of 1 to 19 ASCII digits as a `u64` (`None` on anything else: the
/// weighted counts are far smaller, and 19 digits cannot overflow, so no
/// checked arithmetic, which wasm does in 128 bits).
fn decimal(digits: &[u8]) -> Option<u64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &d| {
        d.is_ascii_digit().then(|| n * 10 + u64::from(d - b'0'))
    })
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
    let mut keys = vec![STATS_KEY.to_string()];
    keys.extend(query.iter().map(|t| df_key(t)));
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

    let listed = dfs.iter().sum::<u64>();
    // (The setting is asked for only when it could matter: not for the
    // long lists of common words, a search's usual case.)
    let whole = listed <= MAX_WHOLE_READ && listed <= whole_read();
    let mut lists: Vec<List> = query
        .iter()
        .zip(&dfs)
        .filter(|(_, df)| **df > 0)
        .map(|(t, &df)| {
            let prefix = term_prefix(t);
            List {
                idf: (1.0 + (docs - df as f64 + 0.5) / (df as f64 + 0.5)).ln(),
                end: kv::prefix_end(prefix.as_bytes()),
                next: prefix.clone().into_bytes(),
                prefix,
                done: false,
                capped: false,
                whole,
                read: 0,
                last_part: f64::INFINITY,
            }
        })
        .collect();
    // With one word (or a filter: the old per-word reach) a query may read
    // MAX_POSTINGS; several words without one share EXACT_BUDGET.
    let budget = if lists.len() <= 1 || post_type.is_some() || whole {
        MAX_POSTINGS
    } else {
        EXACT_BUDGET
    };
    let first = if whole {
        // One round: each list's postings, and one more to see its end.
        listed as usize + 1
    } else {
        (limit * 2).max(40)
    };
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
    // (Ids are unique, so an unstable sort gives the same order.) Only the
    // page is sorted, out of up to thousands found.
    top(&mut best, limit, |a, b| {
        b.2.total_cmp(&a.2).then_with(|| cmp_bytes(id(a), id(b)))
    });
    let ranked: Vec<f64> = best.iter().map(|s| s.2).collect();
    let ids: Vec<String> = best.iter().map(|s| flip_ulid_bytes(id(s))).collect();
    // The page is written as text: each stored post extended in place with
    // its rendered members and its score.
    let mut out = String::with_capacity(1024 * (ids.len() + 1));
    out.push_str(r#"{"term":"#);
    out.push_str(&json_text(&term));
    out.push_str(r#","total":"#);
    out.push_str(itoa::Buffer::new().format(total));
    out.push_str(r#","results":["#);
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
    // Each posting read names at most one new post.
    // Read whole (see [`WHOLE_READ`]): one round reads every list to its
    // end (`first` is their postings and one), each with the whole budget.
    let whole = lists.iter().any(|l| l.whole);
    let mut found = Found::with_capacity(if whole { first } else { budget });
    let mut lookups = Lookups::default();
    let mut round = first;
    loop {
        let active = lists.iter().filter(|l| !l.done).count().max(1);
        // The budget left, shared by the lists still read.
        let share = if whole {
            budget
        } else {
            (budget / active).max(1)
        };
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
            if post_type.is_some_and(|want| want.as_bytes() != posting.post_type) {
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
/// family wrote for it); a list read to its end needs no lookup, having
/// named every post it holds. Each post that could still enter the page (what
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
    // The lists a lookup can still add a part from: a list read to its end
    // has named every post with its word already.
    let open: u32 = (0..lists.len())
        .filter(|&l| !lists[l].done || lists[l].capped)
        .fold(0, |bits, l| bits | 1 << l);
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
        .filter(|(_, c)| !c.looked_up && open & !c.seen != 0)
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
    top(
        &mut wanted,
        LOOKUPS.saturating_sub(lookups.records),
        // Among equals, the one found first (by round, then list, then
        // place in the list).
        |a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)),
    );
    let needles: Vec<Vec<u8>> = lists.iter().map(|l| json_prefix(&l.prefix)).collect();
    // (candidate, list) of each part to read, and its posting key.
    let mut parts: Vec<(usize, usize)> = Vec::new();
    let mut posting_keys: Vec<String> = Vec::new();
    for (chunk_at, chunk) in wanted.chunks(LOOKUP_CHUNK).enumerate() {
        if lookups.bytes >= LOOKUP_BYTES {
            break;
        }
        let doc_keys: Vec<String> = chunk
            .iter()
            .map(|&(_, i)| doc_key(&flip_ulid_bytes(found.id(&found.all[i]))))
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
            ranks_in(doc, &needles, open & !seen, &mut |l, rank| {
                parts.push((at, l));
                posting_keys.push(format!(
                    "{}{rank}{}",
                    lists[l].prefix,
                    String::from_utf8_lossy(id)
                ));
            });
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

/// A posting-key prefix (`ix/i/{term}\0`) as an `ix/doc` record's JSON
/// text writes it (the NUL escaped `\u0000`), without quotes.
fn json_prefix(prefix: &str) -> Vec<u8> {
    let text = json!(prefix).to_string().into_bytes();
    text[1..text.len() - 1].to_vec()
}

/// The posting keys of an `ix/doc` record (its JSON text) that start with
/// one of `needles` (see [`json_prefix`]) whose bit is in `wanted`: each
/// gives `found(list, rank)` with the 8 rank digits after the prefix. One
/// pass over the record, however many words: its strings are `len`,
/// `keys` and the keys, which hold no quote or backslash but the escaped
/// NUL (a term is letters, digits and combining marks).
fn ranks_in(doc: &[u8], needles: &[Vec<u8>], mut wanted: u32, found: &mut dyn FnMut(usize, &str)) {
    let mut quotes = memchr::memchr_iter(b'"', doc);
    while wanted != 0 {
        let (Some(open), Some(close)) = (quotes.next(), quotes.next()) else {
            return;
        };
        let key = &doc[open + 1..close];
        if !key.starts_with(b"ix/i/") {
            continue;
        }
        let Some(l) =
            (0..needles.len()).find(|&l| wanted & (1 << l) != 0 && key.starts_with(&needles[l]))
        else {
            continue;
        };
        wanted &= !(1 << l);
        let rank = key.get(needles[l].len()..needles[l].len() + 8);
        if let Some(rank) = rank.and_then(|r| std::str::from_utf8(r).ok()) {
            found(l, rank);
        }
    }
}

/// Keep the first `n` of `items` in `order`, sorted (kept as they are when
/// in order already, else a selection, then a sort of those `n` only).
fn top<T>(items: &mut Vec<T>, n: usize, order: impl Fn(&T, &T) -> std::cmp::Ordering) {
    if n == 0 {
        items.clear();
        return;
    }
    // A list's postings come in impact order, newest first among equals,
    // which the rescored page keeps unless the statistics moved a post past
    // another: then one pass finds them in order already (a selection and
    // a sort cost several times as many comparisons, each of two ids when
    // the scores tie).
    if items.is_sorted_by(|a, b| order(a, b).is_le()) {
        items.truncate(n);
        return;
    }
    if items.len() > n {
        items.select_nth_unstable_by(n - 1, &order);
        items.truncate(n);
    }
    items.sort_unstable_by(order);
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
        assert_eq!((p.len, p.post_type), (30, &b"offer"[..]));
        assert_eq!(part(b"junk", 1.0, 30.0).len, 0);
        // Not a number: tf 0 (no part), the length unknown.
        let p = part(b"x 3a general", 2.0, 30.0);
        assert_eq!((p.score, p.len, p.post_type), (0.0, 0, &b"general"[..]));
        assert_eq!(part(b"2 18446744073709551616 t", 1.0, 30.0).len, 0);
        assert_eq!(
            decimal(b"9999999999999999999"),
            Some(9_999_999_999_999_999_999)
        );
        assert_eq!(
            (decimal(b""), decimal(b"+1"), decimal(b"007")),
            (None, None, Some(7))
        );
    }

    #[test]
    fn a_records_keys_give_the_ranks_of_the_words_asked() {
        // As the timeline family writes the record (serde's JSON).
        let doc = json!({"len": 12, "keys": [
            "ix/i/cam\u{0}00000001POSTA",
            "ix/i/camabu\u{0}0000beefPOSTA",
            "ix/i/zed\u{0}fffffff0POSTA",
        ]})
        .to_string();
        let needles: Vec<Vec<u8>> = ["ix/i/camabu\0", "ix/i/zed\0", "ix/i/cam\0", "ix/i/nope\0"]
            .iter()
            .map(|p| json_prefix(p))
            .collect();
        assert_eq!(needles[0], br"ix/i/camabu\u0000");
        let ranks = |wanted: u32| {
            let mut got = Vec::new();
            ranks_in(doc.as_bytes(), &needles, wanted, &mut |l, r| {
                got.push((l, r.to_string()))
            });
            got
        };
        assert_eq!(
            ranks(0b1111),
            [
                (2, "00000001".to_string()),
                (0, "0000beef".into()),
                (1, "fffffff0".into())
            ]
        );
        // Only the words asked for; a word the post lacks gives nothing.
        assert_eq!(ranks(0b1010), [(1, "fffffff0".to_string())]);
        assert!(ranks(0b1000).is_empty());
    }

    #[test]
    fn top_keeps_the_first_n_in_order() {
        let mut items = vec![5, 1, 9, 3, 7, 2];
        top(&mut items, 3, |a: &i32, b| b.cmp(a));
        assert_eq!(items, [9, 7, 5]);
        let mut few = vec![2, 8];
        top(&mut few, 3, |a: &i32, b| a.cmp(b));
        assert_eq!(few, [2, 8]);
        top(&mut few, 0, |a: &i32, b| a.cmp(b));
        assert!(few.is_empty());
        // In order already (the usual page), with ties; and against the
        // model (a whole sort, then the first n) over many shapes: sorted,
        // nearly sorted, shuffled.
        let mut sorted = vec![(9, 1), (9, 2), (7, 0), (7, 3), (5, 5), (1, 0)];
        let by = |a: &(i32, i32), b: &(i32, i32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
        top(&mut sorted, 4, by);
        assert_eq!(sorted, [(9, 1), (9, 2), (7, 0), (7, 3)]);
        let mut seed = 7u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) as i32
        };
        for len in 0..50 {
            for shape in 0..3 {
                let mut items: Vec<(i32, i32)> = (0..len).map(|i| (next() % 6, i)).collect();
                if shape < 2 {
                    items.sort_by(by);
                }
                if shape == 1 && len > 1 {
                    let (a, b) = (
                        (next() as usize) % len as usize,
                        (next() as usize) % len as usize,
                    );
                    items.swap(a, b);
                }
                let mut model = items.clone();
                model.sort_by(by);
                model.truncate(20);
                top(&mut items, 20, by);
                assert_eq!(items, model, "len {len}, shape {shape}");
            }
        }
    }

    #[test]
    fn ids_differing_anywhere_hash_apart() {
        let id = *b"01KMZ4WQ7R9V2XN3H5J6P8TBCD";
        let mut seen = std::collections::HashSet::new();
        assert!(seen.insert(hash(&id)));
        for at in 0..id.len() {
            let mut other = id;
            other[at] ^= 1;
            assert!(seen.insert(hash(&other)), "byte {at}");
        }
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
