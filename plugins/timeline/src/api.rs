//! The routes of the `timeline` family and their OpenAPI.

use marketplace_guest::openapi::{
    self, LIMIT, Op, fingerprint, nonblank, obj, op, pattern, r, t, with_signature,
};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        query: &[
            LIMIT,
            (
                "before",
                "string",
                false,
                "post_id cursor, a position: only posts whose ids sort before it (byte order, as ids are stored), whether or not it names a post still there, so a page goes on after its last post is deleted",
            ),
            ("post_type", "string", false, "filter"),
            ("author", "string", false, "author fingerprint"),
        ],
        ok: (200, "Timeline"),
        errors: &[400],
        ..op(
            "GET",
            "/api/timeline",
            "timeline",
            "posts",
            "List timeline posts",
            "Newest first, with a `before` cursor and filters. `next_before` is set when older posts follow: pass it as `before` for the next page. A page may hold fewer than `limit` while older posts follow: one of very large posts (at most 4 MiB of stored posts, at least one post), or one that passed over 256 posts it does not list (private replies, other types than `post_type`); `next_before` then goes on from there: a post the page does not list, or `post_` and the first ten characters of an id (a millisecond: the page ends below it). Only a null `next_before` ends the timeline.",
        )
    },
    Op {
        paid: Some("post (comment when parent_id is set)"),
        body: Some("NewPost"),
        ok: (201, "PostCreated"),
        errors: &[400, 401, 402, 404, 409],
        ..op(
            "POST",
            "/api/timeline",
            "createPost",
            "posts",
            "Create a post or comment",
            "Signed `post:{content}` by author_fingerprint. Attachments: at most 16, unique filenames (not `.` or `..`) without path separators; each either inline (`content`, at most 512 KiB) or an upload of the author's (`s3_key` `files/{id}` from `POST /api/storage/presign`, shown with its `url`; an unknown upload, another identity's, or both `content` and `s3_key` is 400 `invalid_attachment`, nothing spent). A private reply (`post_type` `private_reply`, `content` \"\", `parent_id`, `recipient_fingerprint`, `encrypted_payload` of at most 65,536 characters) is signed `post:{encrypted_payload}` and paid as a comment; it is never listed in the timeline or search, but readable by id and in its parent's thread (with its opaque `encrypted_payload` and `recipient_fingerprint`).",
        )
    },
    Op {
        body: Some("UpdatePost"),
        ok: (200, "PostEnvelope"),
        errors: &[400, 401, 403, 404, 409, 429],
        ..op(
            "POST",
            "/api/posts/update",
            "updatePost",
            "posts",
            "Update a post",
            "Free. The author replaces the members sent (content, keywords, attachments, activity_metadata; attachments are replaced as a whole, inline or the author's uploads as for a new post); search follows. Signed `update_post:{post_id}` by author_fingerprint (the fresh form `update_post:{post_id}:{timestamp}` only, 401 `auth_expired` otherwise, when the operator sets `[settings.timeline] legacy_updates = false`); another identity is 403 `forbidden_party`. One identity updates at most 120 times an hour with fresh signatures, and as many with legacy ones (counted apart: a legacy signature can be sent again by whoever holds it) (`[settings.timeline] updates_per_hour`): past it 429 `rate_limited` with `Retry-After` (the seconds to the next hour). Answers the updated post.",
        )
    },
    Op {
        body: Some("DeletePost"),
        ok: (200, "PostDeleted"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/posts/delete",
            "deletePost",
            "posts",
            "Delete a post",
            "Free. The author removes the post: it answers 404 afterwards and leaves the timeline, its parent's thread and search. Signed `delete_post:{post_id}` by author_fingerprint; another identity is 403 `forbidden_party`.",
        )
    },
    Op {
        ok: (200, "PostEnvelope"),
        errors: &[404],
        ..op(
            "GET",
            "/api/posts/{post_id}",
            "getPost",
            "posts",
            "One post",
            "The post with its listing check (`terms.md` plus one descriptor attachment).",
        )
    },
    Op {
        ok: (200, "Raw"),
        errors: &[404],
        patch: Some(attachment),
        ..op(
            "GET",
            "/api/posts/{post_id}/attachments/{index}",
            "getAttachment",
            "posts",
            "One attachment",
            "The raw attachment bytes with their content type (an inline one of a `text/*` type, or one naming a charset, with `charset=utf-8`: its bytes are UTF-8) and an ETag (If-None-Match gives 304, If-Match 412; `Range` a part, 206). `index` is the attachment's index as the post lists it (0, 1, ...): any other text (`01`, `-1`, `abc`) names no attachment, 404 like an index past the last. An upload's bytes and content type are read from the identity family when served (404 if the upload is gone).",
        )
    },
    Op {
        query: &[(
            "after",
            "string",
            false,
            "post_id cursor, a position: only comments after it (a thread's `next_after`; empty: from the first), whether or not it names a comment of the thread",
        )],
        ok: (200, "Thread"),
        errors: &[400, 404],
        ..op(
            "GET",
            "/api/thread/{post_id}",
            "getThread",
            "posts",
            "A post's thread",
            "The root post and all descendants, oldest first; `count` is the number of comments in the whole thread (every descendant not deleted, whichever page this is). One answer holds at most 4 MiB of stored posts (at least one comment): when more follow, `next_after` names the last comment listed, and `?after={next_after}` gives the rest (null when the thread is complete). A thread lists at most 10,000 descendants.",
        )
    },
];

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    let mut schemas = json!({
        "Post": openapi::post(),
        "PostEnvelope": obj(&[("post", r("Post"))], &["post"]),
        "PostCreated": obj(&[("post_id", t("string")), ("post", r("Post")), ("payment", openapi::payment())], &["post_id", "post"]),
        "Timeline": obj(&[("posts", json!({"type": "array", "items": r("Post")})), ("next_before", json!({"type": ["string", "null"]}))], &["posts"]),
        "Thread": obj(&[("root", r("Post")), ("comments", json!({"type": "array", "items": r("Post")})), ("count", json!({"type": "integer", "description": "comments in the whole thread (every descendant not deleted), not only in this answer"})), ("next_after", json!({"type": ["string", "null"], "description": "set when more comments follow: pass as `after`"}))], &["root", "comments", "count", "next_after"]),
        "NewPost": with_signature(vec![("author_fingerprint", t("string")),
            ("content", json!({"type": ["string", "null"], "maxLength": crate::MAX_CONTENT, "description": "required and not blank; \"\", null or absent for a private_reply"})),
            ("post_type", pattern("^[A-Za-z0-9_-]{1,64}$")), ("parent_id", t("string")), ("keywords", keywords()),
            ("attachments", attachments()), ("activity_metadata", json!({"type": "object", "description": "at most 16 KiB as compact JSON"})),
            ("recipient_fingerprint", json!({"description": "private_reply only (required there; ignored on other posts): the addressee, 64 hex"})),
            ("encrypted_payload", json!({"description": "private_reply only (required there; ignored on other posts): opaque text, at most 65,536 characters; signed as post:{encrypted_payload}"}))],
            &[]),
        "UpdatePost": with_signature(vec![("post_id", nonblank(128)), ("author_fingerprint", fingerprint()), ("content", nonblank(crate::MAX_CONTENT)), ("keywords", keywords()),
            ("attachments", attachments()), ("activity_metadata", json!({"type": "object", "description": "at most 16 KiB as compact JSON"}))], &["post_id"]),
        "DeletePost": with_signature(vec![("post_id", nonblank(128)), ("author_fingerprint", fingerprint())], &["post_id"]),
        "PostDeleted": obj(&[("post_id", t("string")), ("deleted", json!({"type": "boolean", "const": true}))], &["post_id", "deleted"]),
    });
    // A private reply's own members, read (and so checked) on it alone.
    schemas["NewPost"]["if"] = json!({"properties": {"post_type": {"const": crate::model::PRIVATE_REPLY}}, "required": ["post_type"]});
    schemas["NewPost"]["then"] = json!({
        "properties": {
            "content": {"enum": ["", null]},
            "parent_id": {"type": "string", "minLength": 1},
            "recipient_fingerprint": {"type": "string", "pattern": "^[0-9a-fA-F]{64}$"},
            "encrypted_payload": {"type": "string", "minLength": 1, "maxLength": 65536, "pattern": "\\S"},
        },
        "required": ["parent_id", "recipient_fingerprint", "encrypted_payload"],
    });
    // Any other post has a content that is not blank.
    schemas["NewPost"]["else"] = json!({
        "properties": {"content": nonblank(crate::MAX_CONTENT)},
        "required": ["content"],
    });
    schemas
}

/// An attachment is stored bytes, and its `index` an integer (as the
/// post's `attachments[].index` and the `get_attachment` tool say it):
/// a generated client sends a number. Text that is no such integer
/// names no attachment (404, as the description says).
fn attachment(operation: &mut Value) {
    openapi::stored_bytes(operation);
    for param in operation["parameters"].as_array_mut().into_iter().flatten() {
        if param["name"] == "index" {
            param["schema"] = json!({"type": "integer", "minimum": 0});
        }
    }
}

fn keywords() -> Value {
    json!({"type": "array", "items": nonblank(64), "maxItems": 32})
}

/// An attachment is inline (`content`) or an upload of the author's
/// (`s3_key`), never both.
fn attachments() -> Value {
    let mut item = obj(
        &[
            (
                "filename",
                json!({"type": "string", "minLength": 1, "maxLength": 255, "pattern": r"^[^/\\\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]+$", "not": {"enum": [".", ".."]}, "description": "unique in the post (case-insensitive), not \".\" or \"..\", no path separators, control characters, or invisible or bidirectional formatting characters (U+061C, U+200B-U+200F, U+2028-U+202E, U+2060-U+2069, U+FEFF)"}),
            ),
            (
                "content",
                json!({"type": "string", "description": "inline: the text itself, at most 512 KiB (markdown is indexed for search)"}),
            ),
            (
                "s3_key",
                json!({"type": "string", "pattern": format!("^{}$", marketplace_guest::UPLOAD_KEY_PATTERN), "description": "an upload instead of content: the s3_key from POST /api/storage/presign, uploaded by the post's author; served from the identity family, not indexed"}),
            ),
            (
                "attachment_type",
                json!({"type": "string", "maxLength": 127, "pattern": marketplace_common::media::MEDIA_TYPE_PATTERN, "description": "a media type (type/subtype, then ; name=value parameters); default text/markdown (.md) or text/plain inline, the upload's content type for an s3_key"}),
            ),
            (
                "is_public",
                json!({"type": "boolean", "description": "accepted and ignored (the original client sends it); any other type is 400 invalid_attachment"}),
            ),
        ],
        &["filename"],
    );
    // Optional members may be null, read as absent; exactly one of
    // content and s3_key is a string.
    openapi::null_is_absent(&mut item);
    item["oneOf"] = json!([
        {"required": ["content"], "properties": {"content": {"type": "string"}}},
        {"required": ["s3_key"], "properties": {"s3_key": {"type": "string"}}}
    ]);
    json!({"type": "array", "maxItems": 16, "items": item})
}

/// What the family serves (its `describe-api` export): the operations and
/// the schemas they reference.
pub fn api() -> marketplace_guest::types::Api {
    openapi::api(OPS, schemas())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_resolve() {
        assert_eq!(openapi::check(OPS, &schemas()), Ok(()));
    }

    #[test]
    fn routes_are_the_familys() {
        let expected = [
            ("GET", "/api/timeline", false),
            ("POST", "/api/timeline", true),
            ("POST", "/api/posts/update", true),
            ("POST", "/api/posts/delete", true),
            ("GET", "/api/posts/{post_id}", false),
            ("GET", "/api/posts/{post_id}/attachments/{index}", false),
            ("GET", "/api/thread/{post_id}", false),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
