//! The public post document, shared by every family that shows posts
//! (timeline, search, mcp), so they can never disagree.

use crate::endpoint::kv;
use crate::error::ApiError;
use marketplace_common::order::cmp_bytes;
use serde_json::{Value, json};
use std::borrow::Cow;
use std::fmt::Write as _;

/// What [`is_post_type`] asks, as an error's problem says it.
pub const POST_TYPE_RULE: &str = "must be 1 to 64 ASCII letters and digits, '_' or '-'";

/// Whether `s` is a post type: 1 to 64 ASCII letters, digits, `_` or `-`.
pub fn is_post_type(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The `post_type` filter of a listing query: absent or empty is no
/// filter; a value no post type can have is 400 (PROTOCOL 1: malformed
/// parameters are refused, not taken as matching nothing).
pub fn post_type_filter(value: Option<&str>) -> Result<Option<&str>, ApiError> {
    match value.filter(|v| !v.is_empty()) {
        Some(t) if !is_post_type(t) => Err(ApiError::invalid("post_type", POST_TYPE_RULE)),
        t => Ok(t),
    }
}

/// The `author` filter of a listing query: absent or empty is no filter;
/// otherwise a fingerprint (64 hex digits, either case; lower-cased), else
/// 400.
pub fn author_filter(value: Option<&str>) -> Result<Option<String>, ApiError> {
    match value.filter(|v| !v.is_empty()) {
        Some(a) if !marketplace_common::hex::is_fingerprint(a) => Err(ApiError::invalid(
            "author",
            "must be a fingerprint (64 hex digits)",
        )),
        a => Ok(a.map(str::to_ascii_lowercase)),
    }
}

/// Attachment names that describe a listing (besides `terms.md`).
pub const DESCRIPTORS: &[&str] = &["service.md", "product.md", "skill.md", "description.md"];

/// The listing check from attachment file names: `terms.md` plus one
/// descriptive attachment.
pub fn listing<'a>(filenames: impl IntoIterator<Item = &'a str>) -> Value {
    let names: Vec<String> = filenames.into_iter().map(str::to_ascii_lowercase).collect();
    let terms = names.iter().any(|n| n == "terms.md");
    let descriptor = DESCRIPTORS
        .iter()
        .find(|d| names.iter().any(|n| n == *d))
        .copied();
    json!({"terms": terms, "descriptor": descriptor, "verified": terms && descriptor.is_some()})
}

/// What rendering needs from a stored post record (borrowed from it).
#[derive(serde::Deserialize)]
struct Head<'a> {
    #[serde(borrow)]
    post_id: Cow<'a, str>,
    #[serde(borrow)]
    author_fingerprint: Cow<'a, str>,
    #[serde(default, borrow)]
    attachments: Vec<AttachmentName<'a>>,
    /// Present when computed at write time.
    #[serde(default)]
    listing: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct AttachmentName<'a> {
    #[serde(borrow)]
    filename: Cow<'a, str>,
}

/// Nickname from an identity record.
#[derive(serde::Deserialize)]
struct Nick {
    nickname: Option<String>,
}

#[derive(serde::Deserialize, Default)]
struct Rating {
    #[serde(default)]
    up: u64,
    #[serde(default)]
    down: u64,
}

/// [`Head`] read straight off a record the timeline wrote, without parsing
/// its content: records are serialized in field order (`post_id`,
/// `parent_id`, `author_fingerprint` first, `listing` last), ids and
/// fingerprints never need escapes, and a listing check is written by
/// [`listing`] (its members in name order). Anything else (an older record,
/// a surprise) is `None` and gets the full parse.
fn quick_head(record: &str) -> Option<Head<'_>> {
    let rest = record.strip_prefix(r#"{"post_id":""#)?;
    let (post_id, rest) = plain_string(rest)?;
    let rest = rest.strip_prefix(r#","parent_id":"#)?;
    let rest = match rest.strip_prefix("null") {
        Some(rest) => rest,
        None => plain_string(rest.strip_prefix('"')?)?.1,
    };
    let rest = rest.strip_prefix(r#","author_fingerprint":""#)?;
    let (author, _) = plain_string(rest)?;
    // The last member must be the listing check: most often the one of a
    // post without attachments, compared in place; else searched from the
    // end by hand (`rfind` builds a two-way searcher for every record, and
    // the check is a few bytes from the end).
    let body = record.strip_suffix('}')?;
    let no_listing = body
        .strip_suffix(NO_LISTING)
        .is_some_and(|before| before.ends_with(r#","listing":"#));
    let written = no_listing || {
        let needle = br#","listing":{"#;
        let at = body
            .as_bytes()
            .windows(needle.len())
            .rposition(|w| w[0] == b',' && w == needle)?;
        written_listing(&body[at + 11..])
    };
    written.then_some(Head {
        post_id: Cow::Borrowed(post_id),
        author_fingerprint: Cow::Borrowed(author),
        attachments: Vec::new(),
        listing: Some(serde::de::IgnoredAny),
    })
}

/// The text of a JSON string up to its closing quote (`s` starts just
/// after the opening one) and what follows that quote; `None` when an
/// escape comes first. One pass, no searcher set up: a page of posts
/// reads three of these per post.
fn plain_string(s: &str) -> Option<(&str, &str)> {
    let bytes = s.as_bytes();
    // Eight bytes at a time while none is a quote or a backslash (a
    // fingerprint is 64 bytes), then byte by byte.
    let mut from = 0;
    while let Some(chunk) = bytes.get(from..from + 8) {
        let word = u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        if has_byte(word, b'"') || has_byte(word, b'\\') {
            break;
        }
        from += 8;
    }
    let end = from
        + bytes[from..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\')?;
    (bytes[end] == b'"').then(|| (&s[..end], &s[end + 1..]))
}

/// Whether one of the eight bytes of `word` is `byte` (the classic
/// zero-byte test on `word` XOR `byte` in every lane: exact for "any").
fn has_byte(word: u64, byte: u8) -> bool {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let x = word ^ (ONES * u64::from(byte));
    x.wrapping_sub(ONES) & !x & (ONES << 7) != 0
}

/// Whether `check` is a listing check as [`listing`] writes it:
/// `{"descriptor":null|"<one of DESCRIPTORS>","terms":<bool>,"verified":<bool>}`.
fn written_listing(check: &str) -> bool {
    fn boolean(s: &str) -> Option<&str> {
        s.strip_prefix("true").or_else(|| s.strip_prefix("false"))
    }
    let parsed = || -> Option<&str> {
        let rest = check.strip_prefix(r#"{"descriptor":"#)?;
        let rest = match rest.strip_prefix("null") {
            Some(rest) => rest,
            None => {
                let (name, rest) = plain_string(rest.strip_prefix('"')?)?;
                DESCRIPTORS.contains(&name).then_some(rest)?
            }
        };
        let rest = boolean(rest.strip_prefix(r#","terms":"#)?)?;
        boolean(rest.strip_prefix(r#","verified":"#)?)
    };
    parsed() == Some("}")
}

/// The listing check of a post without attachments.
const NO_LISTING: &str = r#"{"descriptor":null,"terms":false,"verified":false}"#;

/// Render stored post records (JSON objects) into their public documents
/// (JSON text), written onto `out` comma-separated, in order, reading every
/// author and rating in one host call. The records are extended in place,
/// not rebuilt, so a page of results costs little more than its bytes.
pub fn render_records_into(records: &[&str], out: &mut String) -> Result<(), ApiError> {
    render_into(records, |_, _| {}, out)
}

/// [`render_records_into`], with `extra(i, members)` writing members
/// (`"k":v,...`) to add to the i-th document onto an empty `members`.
fn render_into(
    records: &[&str],
    extra: impl Fn(usize, &mut String),
    out: &mut String,
) -> Result<(), ApiError> {
    let mut first = true;
    let mut more = String::with_capacity(64);
    render_each(records, |i, record, members| {
        if !first {
            out.push(',');
        }
        first = false;
        more.clear();
        extra(i, &mut more);
        push_extended(out, record, &[members, &more]);
    })
}

/// The work of [`render_into`]: `emit(i, record, members)` gets each
/// record with the members its public document adds.
fn render_each(records: &[&str], mut emit: impl FnMut(usize, &str, &str)) -> Result<(), ApiError> {
    let heads: Vec<Head<'_>> = records
        .iter()
        .map(|r| match quick_head(r) {
            Some(head) => Ok(head),
            None => serde_json::from_str(r)
                .map_err(|e| ApiError::internal(format!("corrupt post: {e}"))),
        })
        .collect::<Result<_, _>>()?;
    // One key per post for its rating, one per distinct author.
    let key = |prefix: &str, id: &str| {
        let mut k = String::with_capacity(prefix.len() + id.len());
        k.push_str(prefix);
        k.push_str(id);
        k
    };
    let mut keys: Vec<String> = heads
        .iter()
        .map(|h| key("post_rating/", &h.post_id))
        .collect();
    // Compared a word at a time: a page is often one author's posts.
    let by_bytes = |a: &&str, b: &&str| cmp_bytes(a.as_bytes(), b.as_bytes());
    let mut authors: Vec<&str> = heads
        .iter()
        .map(|h| h.author_fingerprint.as_ref())
        .collect();
    // (Neighbours first: a page of one author's posts is then one.)
    authors.dedup_by(|a, b| by_bytes(a, b).is_eq());
    authors.sort_unstable_by(by_bytes);
    authors.dedup_by(|a, b| by_bytes(a, b).is_eq());
    keys.extend(authors.iter().map(|a| key("id/", a)));
    // A long thread names more keys than one call may: a call per chunk.
    let packs = kv::get_many_chunked(Some("identity"), &keys)?;
    let values: Vec<Option<&[u8]>> = packs.iter().flat_map(kv::Packed::values).collect();
    // Each author's nickname as JSON text, made once per author.
    let nicks: Vec<Option<String>> = values[heads.len()..]
        .iter()
        .map(|v| {
            v.and_then(|v| serde_json::from_slice::<Nick>(v).ok())
                .and_then(|n| n.nickname)
                .and_then(|n| serde_json::to_string(&n).ok())
        })
        .collect();
    // One buffer for every record's members: a page of posts is hundreds
    // of allocations otherwise, each a call into the plugin's allocator.
    let mut extra = String::with_capacity(160);
    let mut digits = itoa::Buffer::new();
    for (i, (record, head)) in records.iter().zip(&heads).enumerate() {
        let nick = authors
            .binary_search_by(|a| by_bytes(a, &head.author_fingerprint.as_ref()))
            .ok()
            .and_then(|a| nicks[a].as_deref());
        let rating: Rating = values[i]
            .and_then(|v| serde_json::from_slice(v).ok())
            .unwrap_or_default();
        extra.clear();
        extra.push_str(r#""author_nick":"#);
        extra.push_str(nick.unwrap_or("null"));
        // Piece by piece, the numbers with `itoa`: `format!` with its many
        // arguments was a tenth of a search's time, and `write!` of each
        // number still about 4 % (two a post).
        extra.push_str(r#","rating":{"up":"#);
        extra.push_str(digits.format(rating.up));
        extra.push_str(r#","down":"#);
        extra.push_str(digits.format(rating.down));
        extra.push('}');
        // Stored with the post since it is computed on write; older
        // records get it computed here.
        match (&head.listing, head.attachments.is_empty()) {
            (Some(_), _) => {}
            (None, true) => {
                extra.push_str(r#","listing":"#);
                extra.push_str(NO_LISTING);
            }
            (None, false) => {
                let check = listing(head.attachments.iter().map(|a| a.filename.as_ref()));
                let _ = write!(extra, r#","listing":{check}"#);
            }
        }
        emit(i, record, &extra);
    }
    Ok(())
}

/// Write `object` with `members` (each `"k":v,...`, empty ones skipped)
/// appended to it onto `out`.
fn push_extended(out: &mut String, object: &str, members: &[&str]) {
    let body = object.trim_end();
    let body = body.strip_suffix('}').unwrap_or(body);
    out.push_str(body);
    let mut empty = body.trim_end().ends_with('{');
    for m in members.iter().filter(|m| !m.is_empty()) {
        if !empty {
            out.push(',');
        }
        out.push_str(m);
        empty = false;
    }
    out.push('}');
}

/// The key of a post's stored record in the timeline family's keyspace.
pub fn record_key(post_id: &str) -> String {
    let mut key = String::with_capacity(5 + post_id.len());
    key.push_str("post/");
    key.push_str(post_id);
    key
}

/// The most bytes of stored post records one answer lists (a timeline
/// page, a thread, search results). A post's content is up to 64 Ki
/// characters of up to 6 bytes once stored (escaped), so a hundred of them
/// would not fit in a plugin's memory: past this budget an answer lists
/// fewer posts than asked (and says how to go on where it can). The first
/// record always counts as fitting.
pub const ANSWER_BUDGET: usize = 4 << 20;

/// Keeps the running size of an answer's records against
/// [`ANSWER_BUDGET`].
#[derive(Default)]
pub struct Budget {
    used: usize,
    listed: usize,
}

impl Budget {
    /// Whether a record of `len` bytes still fits; if so, it is counted.
    pub fn take(&mut self, len: usize) -> bool {
        if self.listed > 0 && self.used.saturating_add(len) > ANSWER_BUDGET {
            return false;
        }
        self.used += len;
        self.listed += 1;
        true
    }
}

/// Load and render posts by id onto `out`, comma-separated, in order,
/// skipping absent ones and stopping at the first that does not fit in
/// [`ANSWER_BUDGET`]; `extra(i, members)` writes members (`"k":v,...`)
/// to add to the i-th post's document (e.g. a search score) onto an empty
/// `members`. One copy of each record, two host calls.
pub fn render_many_into(
    post_ids: &[String],
    extra: impl Fn(usize, &mut String),
    out: &mut String,
) -> Result<(), ApiError> {
    let keys: Vec<String> = post_ids.iter().map(|id| record_key(id)).collect();
    // Usually one call; records large enough to pass a call's byte budget
    // are read in smaller ones, until the answer's budget is spent.
    let (mut packs, mut read, mut chunk) = (Vec::new(), 0, keys.len());
    let mut budget = Budget::default();
    let mut fits = true;
    while fits && read < keys.len() {
        let (pack, n) = kv::get_many_fitting(Some("timeline"), &keys[read..], &mut chunk)?;
        fits = pack.values().flatten().all(|b| budget.take(b.len()));
        packs.push((read, pack));
        read += n;
    }
    // The records counted above, in order: the first that did not fit and
    // everything after it are left out.
    let mut budget = Budget::default();
    let (index, records): (Vec<usize>, Vec<&str>) = packs
        .iter()
        .flat_map(|(first, pack)| pack.values().enumerate().map(move |(i, v)| (first + i, v)))
        .filter_map(|(i, v)| v.map(|b| (i, b)))
        .take_while(|(_, b)| budget.take(b.len()))
        .map(|(i, b)| (i, marketplace_common::utf8::from_utf8(b).unwrap_or("{}")))
        .unzip();
    render_into(&records, |n, members| extra(index[n], members), out)
}

/// The author fingerprint of a post (404 `not_found` when it does not exist).
pub fn author_of(post_id: &str) -> Result<String, ApiError> {
    let post: Value = kv::get_in(Some("timeline"), &record_key(post_id))?
        .ok_or_else(|| ApiError::not_found(format!("post {post_id}")))?;
    Ok(post["author_fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_no_attachment_listing_is_the_computed_one() {
        let computed: Value = listing(std::iter::empty());
        assert_eq!(computed, serde_json::from_str::<Value>(NO_LISTING).unwrap());
    }

    #[test]
    fn quick_heads_agree_with_the_full_parse_or_defer_to_it() {
        let full = |r: &str| {
            let h: Head<'_> = serde_json::from_str(r).unwrap();
            (h.post_id.to_string(), h.author_fingerprint.to_string())
        };
        let written = [
            r#"{"post_id":"post_01A","parent_id":null,"author_fingerprint":"ab12","content":"x \"listing\":{","post_type":"general","keywords":[],"attachments":[],"activity_metadata":{},"created_at":"t","comment_count":0,"listing":{"descriptor":null,"terms":false,"verified":false}}"#,
            r#"{"post_id":"post_01B","parent_id":"post_01A","author_fingerprint":"cd34","content":"","post_type":"general","keywords":[],"attachments":[{"filename":"terms.md"}],"activity_metadata":{"listing":{"a":1}},"created_at":"t","comment_count":2,"listing":{"descriptor":"service.md","terms":true,"verified":true}}"#,
        ];
        // A listing-like text inside an earlier member: the last one counts.
        let nested = r#"{"post_id":"post_01F","parent_id":null,"author_fingerprint":"ab12","content":"","activity_metadata":{"a":1,"listing":{"descriptor":null,"terms":false,"verified":false}},"listing":{"descriptor":"product.md","terms":true,"verified":true}}"#;
        assert!(quick_head(nested).is_some());
        for r in written {
            let quick = quick_head(r).expect("a record as written");
            assert_eq!(
                (
                    quick.post_id.to_string(),
                    quick.author_fingerprint.to_string()
                ),
                full(r)
            );
        }
        // No stored listing (an older record), even with one nested in the
        // metadata, or an unexpected layout: the full parse decides.
        for r in [
            r#"{"post_id":"post_01C","parent_id":null,"author_fingerprint":"ef56","content":"","attachments":[],"activity_metadata":{"z":1,"listing":{"verified":true}},"created_at":"t","comment_count":0}"#,
            r#"{"author_fingerprint":"ef56","post_id":"post_01D","listing":{"verified":true}}"#,
            r#"{"post_id":"post_\u0031","parent_id":null,"author_fingerprint":"ef56","listing":{"verified":true}}"#,
            // The written check, but not the last member.
            r#"{"post_id":"post_01E","parent_id":null,"author_fingerprint":"ef56","listing":{"descriptor":null,"terms":false,"verified":false},"x":1}"#,
        ] {
            assert!(quick_head(r).is_none(), "{r}");
        }
    }

    #[test]
    fn listing_checks_as_written_are_recognised_and_nothing_else() {
        let names: Vec<Vec<&str>> = vec![
            vec![],
            vec!["terms.md"],
            vec!["notes.txt"],
            vec!["terms.md", "service.md"],
            vec!["product.md"],
            vec!["TERMS.md", "Skill.md"],
            vec!["description.md", "terms.md"],
        ];
        for n in names {
            let written = listing(n.iter().copied()).to_string();
            assert!(written_listing(&written), "{written}");
        }
        for other in [
            r#"{"descriptor":null,"terms":false}"#,
            r#"{"descriptor":"other.md","terms":true,"verified":true}"#,
            r#"{"descriptor":null,"terms":false,"verified":false,"x":1}"#,
            r#"{"descriptor":null,"terms":0,"verified":false}"#,
            r#"{"terms":false,"descriptor":null,"verified":false}"#,
            r#"{"descriptor":"serv\u0069ce.md","terms":true,"verified":true}"#,
            "",
        ] {
            assert!(!written_listing(other), "{other}");
        }
    }

    #[test]
    fn plain_strings_end_at_their_quote_unless_escaped() {
        assert_eq!(plain_string(r#"ab","c""#), Some(("ab", r#","c""#)));
        assert_eq!(plain_string(r#"""#), Some(("", "")));
        assert_eq!(plain_string(r#"a\"b""#), None);
        assert_eq!(plain_string("abc"), None);
        // Every position of the quote or an escape, across the eight-byte
        // steps, against the byte-by-byte reading.
        for len in 0..40 {
            for (stop, found) in [('"', true), ('\\', false)] {
                let text: String = (0..len).map(|i| (b'a' + (i % 26) as u8) as char).collect();
                let s = format!("{text}{stop}tail\"");
                let expected = found.then_some((text.as_str(), "tail\""));
                assert_eq!(plain_string(&s), expected, "{s}");
            }
            let unterminated: String = "x".repeat(len);
            assert_eq!(plain_string(&unterminated), None);
        }
    }

    #[test]
    fn a_byte_is_found_in_any_lane_and_only_there() {
        for byte in [b'"', b'\\', 0, 0x80, 0xff] {
            for lane in 0..8 {
                for fill in [0u8, 1, b'a', 0x7f, 0x80, 0xfe, 0xff] {
                    if fill == byte {
                        continue;
                    }
                    let mut bytes = [fill; 8];
                    assert!(!has_byte(u64::from_le_bytes(bytes), byte));
                    bytes[lane] = byte;
                    assert!(
                        has_byte(u64::from_le_bytes(bytes), byte),
                        "{byte} {lane} {fill}"
                    );
                }
            }
        }
    }

    #[test]
    fn objects_are_extended_in_place() {
        let extended = |object: &str, members: &[&str]| {
            let mut out = String::new();
            push_extended(&mut out, object, members);
            out
        };
        assert_eq!(extended(r#"{"a":1}"#, &[r#""b":2"#]), r#"{"a":1,"b":2}"#);
        assert_eq!(extended("{}", &[r#""b":2"#]), r#"{"b":2}"#);
        assert_eq!(extended("{}", &["", r#""b":2"#]), r#"{"b":2}"#);
    }
}
