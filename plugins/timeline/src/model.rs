//! The stored post and its public rendering.

use marketplace_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// The post type of a private reply: never in the timeline or search,
/// readable by id and in its parent's thread.
pub const PRIVATE_REPLY: &str = "private_reply";

/// Metadata of one attachment; its bytes live at `att/{post_id}/{index}`.
#[derive(Serialize, Deserialize, Clone)]
pub struct Attachment {
    pub index: usize,
    pub filename: String,
    pub attachment_type: String,
    pub size: usize,
    pub sha256: String,
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

    /// The public document (see `marketplace_guest::posts::render`).
    pub fn render(&self) -> Result<Value, ApiError> {
        let stored = serde_json::to_value(self).map_err(|e| ApiError::internal(e.to_string()))?;
        marketplace_guest::posts::render(stored)
    }
}

/// Load a post (None when absent).
pub fn load(post_id: &str) -> Result<Option<Post>, ApiError> {
    kv::get(&format!("post/{post_id}"))
}
