//! The reads: the timeline (newest first, with its filters), one post,
//! and a thread (a post and its comments, oldest first, in pages).

use crate::model;
use crate::{DELETED, MAX_THREAD, THREAD_CHUNK};
use marketplace_guest::posts::{self, Budget, record_key};
use marketplace_guest::prelude::*;

/// A post id's form (`^post_[0-9A-Za-z]{1,59}$`), as a cursor must have it.
fn is_post_id(s: &str) -> bool {
    s.strip_prefix("post_").is_some_and(|id| {
        (1..=59).contains(&id.len()) && id.bytes().all(|c| c.is_ascii_alphanumeric())
    })
}

/// An optional cursor query parameter (`before`, `after`): a post id, or
/// none when absent or empty (PROTOCOL writes the query
/// `?limit=&before=&...`, and a form sends a blank field so); anything
/// else is a 400 naming it.
fn query_cursor<'a>(req: &'a Request, name: &str) -> Result<Option<&'a str>, ApiError> {
    match req.query(name) {
        None | Some("") => Ok(None),
        Some(c) if is_post_id(c) => Ok(Some(c)),
        Some(_) => Err(ApiError::invalid(name, "must be a post_id")),
    }
}

/// Most posts one timeline page passes over (private replies, another
/// type than the filter's) before it ends with what it has: without a
/// bound, 5,000 private replies of 64 KiB, paid for once, made every
/// client's first page cost 0.2 s (an outside audit), and an author's
/// posts of other types did so for that author's filtered pages. Its
/// `next_before` is then the last post passed over when that one is
/// listed elsewhere (another type), else the millisecond of that private
/// reply ([`millisecond_of`]), once every post of it is seen: a private
/// reply's id is never named (one whose parent was deleted is listed
/// nowhere, and its id would show its author and recipient).
const MAX_PASSED_OVER: usize = 256;

/// `post_` and the time part of a post id that is a ULID (its first ten
/// characters: the millisecond), as a cursor: every id of that
/// millisecond sorts above it, every earlier one below. None for another
/// form of id.
fn millisecond_of(post_id: &str) -> Option<String> {
    let ulid = post_id.strip_prefix("post_")?;
    marketplace_common::order::is_ulid(ulid).then(|| format!("post_{}", &ulid[..10]))
}

pub(crate) fn timeline(req: &Request) -> Result<Response, ApiError> {
    let limit = req.query_int("limit", 1, 100)?.unwrap_or(20) as usize;
    let post_type = posts::post_type_filter(req.query("post_type"))?;
    let author = posts::author_filter(req.query("author"))?;
    let before = query_cursor(req, "before")?;
    // The narrowest index that answers the filters.
    let (prefix, holds_posts) = match (&author, post_type) {
        (Some(a), _) => (format!("author/{a}/"), false),
        (None, Some(t)) => (format!("type/{t}/"), false),
        (None, None) => ("post/".to_string(), true),
    };
    let end = match before {
        Some(b) => format!("{prefix}{b}").into_bytes(),
        None => kv::prefix_end(prefix.as_bytes()).unwrap_or_default(),
    };
    // The stored records, rendered as they are (no parse into a `Post`
    // and back): only their id and type are read, and only the records
    // kept are copied out of the packed scan.
    let mut records: Vec<String> = Vec::new();
    let mut budget = Budget::default();
    let mut last_id = None;
    let mut cursor_end = end;
    let mut more = false;
    let mut passed_over = 0;
    // Where the next page starts when not below the last post listed; and
    // the millisecond a page past its bound ends at.
    let (mut resume, mut stop_at) = (None, None::<String>);
    // The first page reads one more entry than the answer holds (to know
    // whether more follow); skipped posts (private replies, another type)
    // make later, bigger pages.
    let (mut page, mut later_pages) = (limit as u32 + 1, 200);
    'scan: loop {
        // Rows of large posts come fewer at a time (`scan_fitting`), and
        // so do the pages after.
        let asked = page;
        let batch = kv::scan_fitting(None, prefix.as_bytes(), Some(&cursor_end), true, &mut page)?;
        if page < asked {
            later_pages = page;
        }
        let entries: Vec<(&[u8], &[u8])> = batch.entries().collect();
        // An index names its posts: their records are read a chunk of the
        // answer's size at a time, each chunk in one call (fewer when
        // they are large).
        let (mut from, mut size) = (0, limit + 1);
        while from < entries.len() {
            let window = &entries[from..entries.len().min(from + size)];
            let (chunk, loaded) = if holds_posts {
                (window, None)
            } else {
                let keys: Vec<String> = window
                    .iter()
                    .map(|(key, _)| {
                        let key = String::from_utf8_lossy(key);
                        record_key(key.rsplit('/').next().unwrap_or_default())
                    })
                    .collect();
                let (loaded, n) = kv::get_many_fitting(None, &keys, &mut size)?;
                (&window[..n], Some(loaded))
            };
            from += chunk.len();
            let mut records_of = loaded.as_ref().map(|l| l.values());
            for &(key, value) in chunk {
                cursor_end.clear();
                cursor_end.extend_from_slice(key);
                let raw = match records_of.as_mut() {
                    None => value,
                    // A post gone from under its index entry is skipped.
                    Some(values) => match values.next().flatten() {
                        Some(raw) => raw,
                        None => continue,
                    },
                };
                let record = model::record_str(raw)?;
                let listed: model::Listed<'_> =
                    serde_json::from_str(record).map_err(|e| ApiError::internal(e.to_string()))?;
                // Every post of that millisecond seen: the page ends there.
                if let Some(ms) = &stop_at
                    && !listed.post_id.starts_with(ms.as_str())
                {
                    resume = stop_at.take();
                    more = true;
                    break 'scan;
                }
                let private = listed.post_type == model::PRIVATE_REPLY;
                if private || post_type.is_some_and(|t| t != listed.post_type) {
                    passed_over += 1;
                    if passed_over >= MAX_PASSED_OVER && stop_at.is_none() {
                        if !private {
                            resume = Some(listed.post_id.into_owned());
                            more = true;
                            break 'scan;
                        }
                        // (An id of another form: on to a post that is
                        // not a private reply.)
                        stop_at = millisecond_of(&listed.post_id);
                    }
                    continue;
                }
                // A page of large posts ends early: `next_before` goes on.
                if records.len() == limit || !budget.take(record.len()) {
                    more = true;
                    break 'scan;
                }
                last_id = Some(listed.post_id.into_owned());
                records.push(record.to_string());
            }
        }
        if entries.len() < page as usize {
            break;
        }
        page = later_pages;
    }
    let next_before = if more { resume.or(last_id) } else { None };
    Ok(json_members(
        200,
        &[
            ("next_before", &json_text(&next_before)),
            ("posts", &model::render(&records)?),
        ],
    ))
}

pub(crate) fn get_post(req: &Request) -> Result<Response, ApiError> {
    let id = req.param("post_id");
    let record =
        model::load_record(id)?.ok_or_else(|| ApiError::not_found(format!("post {id}")))?;
    Ok(json_members(200, &[("post", &model::render_one(&record)?)]))
}

pub(crate) fn thread(req: &Request) -> Result<Response, ApiError> {
    let id = req.param("post_id");
    // Where a thread too large for one answer goes on (`next_after`).
    let after = query_cursor(req, "after")?;
    let root = model::load_record(id)?.ok_or_else(|| ApiError::not_found(format!("post {id}")))?;
    // Every descendant's id, found through the `children/` index a parent
    // at a time (a deleted comment keeps its entry, so the walk reaches the
    // replies below it).
    let mut queue = vec![id.to_string()];
    let mut ids: Vec<String> = Vec::new();
    // Entries walked, deleted comments' included: the walk's bound.
    let mut walked = 0usize;
    while let Some(parent) = queue.pop() {
        let prefix = format!("children/{parent}/");
        let end = kv::prefix_end(prefix.as_bytes());
        let children = kv::scan_packed(
            None,
            prefix.as_bytes(),
            end.as_deref(),
            false,
            MAX_THREAD as u32,
        )?;
        for (key, value) in children.entries() {
            let child = String::from_utf8_lossy(key.get(prefix.len()..).unwrap_or_default());
            queue.push(child.clone().into_owned());
            // A comment whose entry says deleted ([`DELETED`]) has no
            // record to read: its replies are walked, it is not listed.
            if value != DELETED {
                ids.push(child.into_owned());
            }
            walked += 1;
            if walked >= MAX_THREAD {
                queue.clear();
                break;
            }
        }
    }
    // Post ids are ULIDs: id order is creation order.
    ids.sort_unstable();
    // Every live descendant, whatever the page (PROTOCOL 5). Entries of
    // comments deleted before deletions were marked say live: each found
    // missing while reading is taken off below.
    let mut count = ids.len();
    if let Some(a) = after {
        ids.retain(|c| c.as_str() > a);
    }
    // The records, read a chunk at a time and shown as stored (like a
    // timeline page's) until the answer's budget is spent.
    let mut records: Vec<String> = Vec::new();
    let mut budget = Budget::default();
    let (mut next_after, mut last_listed) = (None, None);
    let keys: Vec<String> = ids.iter().map(|c| record_key(c)).collect();
    let (mut read, mut chunk) = (0, THREAD_CHUNK);
    'read: while read < ids.len() {
        let (loaded, n) = kv::get_many_fitting(None, &keys[read..], &mut chunk)?;
        let children = &ids[read..read + n];
        read += n;
        for (child, raw) in children.iter().zip(loaded.values()) {
            // A deleted comment is not listed.
            let Some(raw) = raw else {
                count = count.saturating_sub(1);
                continue;
            };
            if !budget.take(raw.len()) {
                // The next answer starts after the last one listed.
                next_after = last_listed;
                break 'read;
            }
            let record = model::record_str(raw)?;
            records.push(record.to_string());
            last_listed = Some(child);
        }
    }
    Ok(json_members(
        200,
        &[
            ("comments", &model::render(&records)?),
            ("count", &count.to_string()),
            ("next_after", &json_text(&next_after)),
            ("root", &model::render_one(&root)?),
        ],
    ))
}
