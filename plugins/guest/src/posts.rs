//! The public post document, shared by every family that shows posts
//! (timeline, search, mcp), so they can never disagree.

use crate::endpoint::kv;
use crate::error::ApiError;
use serde_json::{Value, json};

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
pub fn render(mut post: Value) -> Result<Value, ApiError> {
    let fp = post["author_fingerprint"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let id = post["post_id"].as_str().unwrap_or_default().to_string();
    let nick = kv::get_in::<Value>(Some("identity"), &format!("id/{fp}"))?
        .and_then(|p| p["nickname"].as_str().map(str::to_string));
    let rating = kv::get_in::<Value>(Some("identity"), &format!("post_rating/{id}"))?
        .unwrap_or_else(|| json!({"up": 0, "down": 0}));
    let listing = listing(
        post["attachments"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["filename"].as_str()),
    );
    post["author_nick"] = json!(nick);
    post["rating"] = json!({"up": rating["up"], "down": rating["down"]});
    post["listing"] = listing;
    Ok(post)
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
