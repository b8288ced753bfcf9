//! The stored post and its public rendering.

use marketplace_guest::posts::record_key;
use marketplace_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// The post type of a private reply: never in the timeline or search,
/// readable by id and in its parent's thread.
pub const PRIVATE_REPLY: &str = "private_reply";

/// What a listing reads of a stored record (borrowed from it).
#[derive(Deserialize)]
pub struct Listed<'a> {
    #[serde(borrow)]
    pub post_id: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    pub post_type: std::borrow::Cow<'a, str>,
}

/// Metadata of one attachment. An inline one's bytes live at
/// `att/{post_id}/{index}` (shown with their `sha256`); an upload's stay
/// with the identity family at `file/{id}` (shown with its `s3_key`,
/// `files/{id}`, and the `url` that family serves it at).
#[derive(Serialize, Deserialize, Clone)]
pub struct Attachment {
    pub index: usize,
    pub filename: String,
    pub attachment_type: String,
    pub size: usize,
    /// SHA-256 of the bytes (hex); "" (not shown) only for an upload
    /// stored before uploads kept it.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub sha256: String,
    /// Uploads only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3_key: Option<String>,
    /// Uploads only: `/api/storage/files/{id}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
}

/// A post as stored at `post/{post_id}`.
#[derive(Serialize, Deserialize, Clone)]
pub struct Post {
    pub post_id: String,
    pub parent_id: Option<String>,
    pub author_fingerprint: String,
    pub content: String,
    pub post_type: String,
    pub keywords: Vec<String>,
    pub attachments: Vec<Attachment>,
    pub activity_metadata: Value,
    pub created_at: String,
    /// Direct replies.
    pub comment_count: u64,
    /// A private reply's addressee (`post_type` [`PRIVATE_REPLY`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipient_fingerprint: Option<String>,
    /// A private reply's payload, opaque to the service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encrypted_payload: Option<String>,
    /// The listing check, computed when the post is written (records
    /// written before it was stored get it computed when shown).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listing: Option<Value>,
}

impl Post {
    /// Whether this is a private reply.
    pub fn is_private(&self) -> bool {
        self.post_type == PRIVATE_REPLY
    }

    /// The stored record (JSON text, in field order).
    pub fn record(&self) -> Result<String, ApiError> {
        serde_json::to_string(self).map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Write the post at `post/{post_id}`; the record written is returned,
    /// to be rendered without serializing the post again.
    pub fn save(&self) -> Result<String, ApiError> {
        let record = self.record()?;
        kv::put_raw(&record_key(&self.post_id), record.as_bytes())?;
        Ok(record)
    }
}

/// The public documents of stored records as a JSON array (see
/// `marketplace_guest::posts::render_records_into`): every author and
/// rating read in one host call.
pub fn render(records: &[String]) -> Result<String, ApiError> {
    let records: Vec<&str> = records.iter().map(String::as_str).collect();
    let mut out = String::with_capacity(records.iter().map(|r| r.len() + 128).sum::<usize>() + 2);
    out.push('[');
    marketplace_guest::posts::render_records_into(&records, &mut out)?;
    out.push(']');
    Ok(out)
}

/// The public document of one stored record (JSON text).
pub fn render_one(record: &str) -> Result<String, ApiError> {
    let mut out = String::with_capacity(record.len() + 128);
    marketplace_guest::posts::render_records_into(&[record], &mut out)?;
    Ok(out)
}

/// A stored record's bytes as the text they are.
pub fn record_text(raw: Vec<u8>) -> Result<String, ApiError> {
    marketplace_common::utf8::string_from_utf8(raw).map_err(|e| ApiError::internal(e.to_string()))
}

/// [`record_text`], borrowed.
pub fn record_str(raw: &[u8]) -> Result<&str, ApiError> {
    marketplace_common::utf8::from_utf8(raw).map_err(|e| ApiError::internal(e.to_string()))
}

/// The stored record of a post (None when absent), as JSON text.
pub fn load_record(post_id: &str) -> Result<Option<String>, ApiError> {
    kv::get_raw(None, &record_key(post_id))?
        .map(record_text)
        .transpose()
}

/// Load a post (None when absent).
pub fn load(post_id: &str) -> Result<Option<Post>, ApiError> {
    kv::get(&record_key(post_id))
}
