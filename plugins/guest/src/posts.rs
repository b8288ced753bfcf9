//! The public post document, shared by every family that shows posts
//! (timeline, search, mcp), so they can never disagree.

use crate::endpoint::kv;
use crate::error::ApiError;
use serde_json::{Value, json};
use std::borrow::Cow;

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

/// Render a stored post record (`timeline` keyspace `post/{id}`): adds the
/// author's current nickname and the post's rating (identity family) and
/// the listing check.
pub fn render(post: Value) -> Result<Value, ApiError> {
    let record = serde_json::to_string(&post).map_err(|e| ApiError::internal(e.to_string()))?;
    let rendered = render_records(&[record])?.remove(0);
    serde_json::from_str(&rendered).map_err(|e| ApiError::internal(e.to_string()))
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

/// The listing check of a post without attachments.
const NO_LISTING: &str = r#"{"descriptor":null,"terms":false,"verified":false}"#;

/// Render stored post records (JSON objects) into public documents (JSON
/// text), reading every author and rating in one host call. The records
/// are extended in place, not rebuilt, so a page of results costs little
/// more than its bytes.
pub fn render_records(records: &[String]) -> Result<Vec<String>, ApiError> {
    let heads: Vec<Head<'_>> = records
        .iter()
        .map(|r| {
            serde_json::from_str(r).map_err(|e| ApiError::internal(format!("corrupt post: {e}")))
        })
        .collect::<Result<_, _>>()?;
    // One key per post for its rating, one per distinct author.
    let mut keys: Vec<String> = heads
        .iter()
        .map(|h| format!("post_rating/{}", h.post_id))
        .collect();
    let mut authors: Vec<&str> = heads
        .iter()
        .map(|h| h.author_fingerprint.as_ref())
        .collect();
    authors.sort_unstable();
    authors.dedup();
    keys.extend(authors.iter().map(|a| format!("id/{a}")));
    let values = kv::get_many_raw(Some("identity"), &keys)?;
    let nicks: Vec<Option<String>> = values[heads.len()..]
        .iter()
        .map(|v| {
            v.as_deref()
                .and_then(|v| serde_json::from_slice::<Nick>(v).ok())
                .and_then(|n| n.nickname)
        })
        .collect();
    let mut out = Vec::with_capacity(records.len());
    for (i, (record, head)) in records.iter().zip(&heads).enumerate() {
        let nick = authors
            .binary_search(&head.author_fingerprint.as_ref())
            .ok()
            .and_then(|a| nicks[a].clone());
        let rating: Rating = values[i]
            .as_deref()
            .and_then(|v| serde_json::from_slice(v).ok())
            .unwrap_or_default();
        // Stored with the post since it is computed on write; older
        // records get it computed here.
        let listing = match (&head.listing, head.attachments.is_empty()) {
            (Some(_), _) => String::new(),
            (None, true) => format!(r#","listing":{NO_LISTING}"#),
            (None, false) => format!(
                r#","listing":{}"#,
                listing(head.attachments.iter().map(|a| a.filename.as_ref()))
            ),
        };
        let nick = match nick {
            Some(n) => serde_json::to_string(&n).unwrap_or_else(|_| "null".into()),
            None => "null".into(),
        };
        let extra = format!(
            r#""author_nick":{nick},"rating":{{"up":{},"down":{}}}{listing}"#,
            rating.up, rating.down,
        );
        out.push(extend_object(record, &extra));
    }
    Ok(out)
}

/// Append members (`"k":v,...`) to a JSON object's text.
pub fn extend_object(object: &str, members: &str) -> String {
    let body = object.trim_end();
    let body = body.strip_suffix('}').unwrap_or(body);
    let sep = if body.trim_end().ends_with('{') {
        ""
    } else {
        ","
    };
    format!("{body}{sep}{members}}}")
}

/// Load and render posts by id, in order (None where absent), in two host
/// calls whatever their number.
pub fn load_rendered_many(post_ids: &[String]) -> Result<Vec<Option<String>>, ApiError> {
    let keys: Vec<String> = post_ids.iter().map(|id| format!("post/{id}")).collect();
    let records = kv::get_many_raw(Some("timeline"), &keys)?;
    let present: Vec<String> = records
        .iter()
        .flatten()
        .map(|r| String::from_utf8_lossy(r).into_owned())
        .collect();
    let mut rendered = render_records(&present)?.into_iter();
    Ok(records
        .iter()
        .map(|r| r.as_ref().and_then(|_| rendered.next()))
        .collect())
}

/// The author fingerprint of a post (404 `not_found` when it does not exist).
pub fn author_of(post_id: &str) -> Result<String, ApiError> {
    let post: Value = kv::get_in(Some("timeline"), &format!("post/{post_id}"))?
        .ok_or_else(|| ApiError::not_found(format!("post {post_id}")))?;
    Ok(post["author_fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

/// Load and render a post by id (None when absent).
pub fn load_rendered(post_id: &str) -> Result<Option<Value>, ApiError> {
    match kv::get_in::<Value>(Some("timeline"), &format!("post/{post_id}"))? {
        Some(p) => render(p).map(Some),
        None => Ok(None),
    }
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
    fn objects_are_extended_in_place() {
        assert_eq!(extend_object(r#"{"a":1}"#, r#""b":2"#), r#"{"a":1,"b":2}"#);
        assert_eq!(extend_object("{}", r#""b":2"#), r#"{"b":2}"#);
    }
}
