//! The `timeline` family: posts and comments (paid, signed), private
//! replies, the author's update and delete, single posts,
//! attachments, threads, the timeline, and the search index.
//!
//! Keyspace `timeline`:
//! - `post/{post_id}` -> [`model::Post`] (post ids are `post_<ULID>`, so key
//!   order is creation order)
//! - `att/{post_id}/{index:04}` -> raw attachment bytes (inline ones; an
//!   attachment that refers to an upload, `s3_key` `files/{id}`, is read
//!   from the identity family's `file/{id}` and `file_meta/{id}` instead)
//! - `type/{post_type}/{post_id}`, `author/{fingerprint}/{post_id}`,
//!   `children/{parent_id}/{post_id}` -> "" (secondary indexes; a deleted
//!   comment keeps its `children/` entries, its own marked "deleted", so
//!   threads reach its replies and count without reading)
//! - `author_count/{fingerprint}` -> posts by that author (read by identity)
//! - `ix/...` -> the inverted index (see [`index`])
//! - `updates/{fingerprint}`, `updates/legacy/{fingerprint}` -> the
//!   author's updates this hour, fresh and legacy-signed (a cap each)
//!
//! Private replies (`post_type` `private_reply`) have a `post/` record and a
//! `children/` entry only: never in the type, author or search indexes.
//!
//! Where things are: `writes` (create, update, delete), `reads` (the
//! timeline, a post, a thread), `attachments` (checked, stored, served),
//! `index` (the inverted index), `model` (the stored post), `api` (the
//! family's routes and their OpenAPI).

mod api;
mod attachments;
mod index;
mod model;
mod reads;
mod writes;

use attachments::attachment;
use marketplace_guest::prelude::*;
use reads::{get_post, thread, timeline};
use writes::{UPDATES, create, delete, update};

struct Timeline;

pub(crate) const MAX_CONTENT: usize = 64 * 1024;
/// `activity_metadata`, as compact JSON: a post's record holds it, and
/// listings read many records.
const MAX_METADATA: usize = 16 * 1024;
/// A private reply's `encrypted_payload`, in characters (as `content`,
/// and as the document's `maxLength` counts).
const MAX_PAYLOAD: usize = 64 * 1024;
const MAX_KEYWORDS: usize = 32;
const MAX_KEYWORD_CHARS: usize = 64;
const MAX_ATTACHMENTS: usize = 16;
const MAX_ATTACHMENT_BYTES: usize = 512 * 1024;
const MAX_THREAD: usize = 10_000;
/// The value of a deleted comment's `children/` entry (a live one's is
/// empty).
const DELETED: &[u8] = b"deleted";
/// A thread reads the records of a parent's children this many at a time.
const THREAD_CHUNK: usize = 100;

impl Endpoint for Timeline {
    const NAME: &'static str = "timeline";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(&[
        marketplace_guest::LEGACY_UPDATES,
        marketplace_guest::Setting {
            key: UPDATES.setting,
            check: |v| UPDATES.check(v),
        },
    ]);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("POST", "/api/timeline") => create(req),
            ("POST", "/api/posts/update") => update(req),
            ("POST", "/api/posts/delete") => delete(req),
            ("GET", "/api/timeline") => timeline(req),
            ("GET", "/api/posts/{post_id}") => get_post(req),
            ("GET", "/api/posts/{post_id}/attachments/{index}") => attachment(req),
            ("GET", "/api/thread/{post_id}") => thread(req),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

marketplace_guest::endpoint_plugin!(Timeline);
