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

mod api;
mod index;
mod model;

use marketplace_common::hex;
use marketplace_guest::posts::{self, Budget, record_key};
use marketplace_guest::prelude::*;
use marketplace_guest::quota::Quota;
use marketplace_guest::{Body, ids};
use model::{Attachment, Post};
use sha2::{Digest, Sha256};

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

/// A validated attachment from the request.
struct NewAttachment {
    filename: String,
    attachment_type: String,
    source: Source,
}

/// Where an attachment's bytes are.
enum Source {
    /// Sent in the request (`content`), stored at `att/{post_id}/{index}`.
    Inline(String),
    /// An upload of the author's (`s3_key` `files/{id}`), kept by the
    /// identity family at `file/{id}` (read when the attachment is served).
    Upload {
        id: String,
        size: usize,
        sha256: String,
    },
}

impl NewAttachment {
    /// The text of an inline attachment (None for an upload).
    fn content(&self) -> Option<&str> {
        match &self.source {
            Source::Inline(c) => Some(c),
            Source::Upload { .. } => None,
        }
    }
}

/// What the timeline reads of an upload's `file_meta/{id}` in the identity
/// family's keyspace.
#[derive(serde::Deserialize)]
struct UploadMeta {
    owner: String,
    #[serde(default)]
    content_type: String,
    #[serde(default)]
    size: u64,
    /// Empty for uploads stored before it was kept.
    #[serde(default)]
    sha256: String,
}

impl UploadMeta {
    /// The type the upload is served with (its own, else bytes).
    fn media_type(&self) -> String {
        if self.content_type.is_empty() {
            "application/octet-stream".into()
        } else {
            self.content_type.clone()
        }
    }
}

/// The upload id of an `s3_key` (`files/{id}`, id ASCII alphanumeric, at
/// most 128), as the identity family hands them out.
fn upload_id(s3_key: &str) -> Option<&str> {
    s3_key.strip_prefix("files/").filter(|id| {
        !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric())
    })
}

/// The public URL of an upload (served by the identity family).
fn upload_url(id: &str) -> String {
    format!("/api/storage/files/{id}")
}

/// The upload `id`'s metadata (None when there is no such upload).
fn upload_meta(id: &str) -> Result<Option<UploadMeta>, ApiError> {
    kv::get_in(Some("identity"), &format!("file_meta/{id}"))
}

/// The request's attachments and what is wrong with them. `author` is the
/// fingerprint the request claims (it is verified later, before anything
/// is stored, and `verify` answers the fingerprint it checked): an upload
/// may only be attached by its owner.
fn attachment_problems(
    body: &Body,
    author: Option<&str>,
) -> Result<(Vec<NewAttachment>, Vec<marketplace_guest::Detail>), ApiError> {
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let mut problem = |field: String, p: &str| {
        problems.push(marketplace_guest::Detail {
            field,
            problem: p.to_string(),
        })
    };
    let Some(raw) = body.raw("attachments") else {
        return Ok((out, problems));
    };
    let Some(list) = raw.as_array() else {
        problem("attachments".into(), "must be a list");
        return Ok((out, problems));
    };
    if list.len() > MAX_ATTACHMENTS {
        problem(
            "attachments".into(),
            &format!("at most {MAX_ATTACHMENTS} attachments"),
        );
        return Ok((out, problems));
    }
    // References to uploads, checked together once the list is read:
    // (their place in `out`, their place in the request, whether the
    // request gave their type).
    let mut uploads: Vec<(usize, usize, bool)> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    for (i, item) in list.iter().enumerate() {
        let field = |f: &str| format!("attachments[{i}].{f}");
        let filename = item.get("filename").and_then(|v| v.as_str()).unwrap_or("");
        // An absent member and a null one are the same.
        let member = |name: &str| item.get(name).filter(|v| !v.is_null());
        let (content, s3_key) = (member("content"), member("s3_key"));
        let named = if filename.is_empty() || filename.chars().count() > 255 {
            problem(field("filename"), "is required, at most 255 characters");
            false
        } else if filename.contains(['/', '\\'])
            || filename
                .chars()
                .any(|c| c.is_control() || reads_otherwise(c))
            || filename == "."
            || filename == ".."
        {
            problem(
                field("filename"),
                "must not be \".\" or \"..\", nor contain path separators, control characters, or invisible or bidirectional formatting characters",
            );
            false
        } else {
            true
        };
        // Two names a reader cannot tell apart are one: compared in NFC
        // (an accent typed as a combining mark or precomposed) and in any
        // letter case.
        let name = marketplace_common::text::nfc(filename)
            .unwrap_or_else(|| filename.to_string())
            .to_lowercase();
        if named && names.contains(&name) {
            problem(
                field("filename"),
                "duplicates another attachment's filename",
            );
        }
        names.push(name);
        // Accepted and ignored (the original client sends it), but of the
        // type the document gives it.
        if member("is_public").is_some_and(|v| !v.is_boolean()) {
            problem(field("is_public"), "must be true or false (it is ignored)");
        }
        let source = match (content, s3_key) {
            (Some(_), Some(_)) => {
                problem(
                    field("s3_key"),
                    "must not be given with content: an attachment is either inline (content) or an upload (s3_key)",
                );
                continue;
            }
            (None, None) => {
                problem(
                    field("content"),
                    "is required (a string), unless s3_key names an upload",
                );
                continue;
            }
            (Some(Value::String(content)), None) => {
                if content.len() > MAX_ATTACHMENT_BYTES {
                    problem(
                        field("content"),
                        &format!("must be at most {MAX_ATTACHMENT_BYTES} bytes"),
                    );
                }
                Source::Inline(content.clone())
            }
            (Some(_), None) => {
                problem(field("content"), "is required (a string)");
                continue;
            }
            (None, Some(key)) => match key.as_str().and_then(upload_id) {
                Some(id) => Source::Upload {
                    id: id.to_string(),
                    size: 0,
                    sha256: String::new(),
                },
                None => {
                    problem(
                        field("s3_key"),
                        "must be the s3_key of an upload (files/{id})",
                    );
                    continue;
                }
            },
        };
        let default_type = match source {
            // The upload's own type, once it is read.
            Source::Upload { .. } => "",
            Source::Inline(_) if filename.to_ascii_lowercase().ends_with(".md") => {
                "text/markdown; charset=utf-8"
            }
            Source::Inline(_) => "text/plain; charset=utf-8",
        };
        let (attachment_type, typed) = match item.get("attachment_type") {
            None | Some(Value::Null) => (default_type.to_string(), false),
            Some(Value::String(t))
                if t.len() <= 127 && marketplace_common::media::is_media_type(t) =>
            {
                (t.clone(), true)
            }
            Some(_) => {
                problem(
                    field("attachment_type"),
                    "must be a media type like text/markdown",
                );
                continue;
            }
        };
        if matches!(source, Source::Upload { .. }) {
            uploads.push((out.len(), i, typed));
        }
        out.push(NewAttachment {
            filename: filename.to_string(),
            attachment_type,
            source,
        });
    }
    if uploads.is_empty() {
        return Ok((out, problems));
    }
    // Every upload's metadata in one call.
    let keys: Vec<String> = uploads
        .iter()
        .map(|&(at, _, _)| match &out[at].source {
            Source::Upload { id, .. } => format!("file_meta/{id}"),
            Source::Inline(_) => unreachable!("only uploads are listed"),
        })
        .collect();
    let metas = kv::get_many_raw(Some("identity"), &keys)?;
    let author = author.map(str::to_ascii_lowercase);
    for (&(at, i, typed), meta) in uploads.iter().zip(metas) {
        let field = format!("attachments[{i}].s3_key");
        let Some(meta) = meta else {
            problem(
                field,
                "names no upload: upload the file first (POST /api/storage/presign, then PUT to its presigned_url)",
            );
            continue;
        };
        let meta: UploadMeta = serde_json::from_slice(&meta)
            .map_err(|e| ApiError::internal(format!("corrupt upload metadata: {e}")))?;
        // Without a claimed author the request is refused as unsigned.
        if author.as_deref().is_some_and(|a| a != meta.owner) {
            problem(
                field,
                "names an upload of another identity: only the post's author's own uploads may be attached",
            );
            continue;
        }
        let a = &mut out[at];
        if !typed {
            a.attachment_type = meta.media_type();
        }
        if let Source::Upload { size, sha256, .. } = &mut a.source {
            *size = usize::try_from(meta.size).unwrap_or(usize::MAX);
            *sha256 = meta.sha256;
        }
    }
    Ok((out, problems))
}

/// The `keywords` member, validated (None when absent).
fn keywords_field(body: &mut Body) -> Option<Vec<String>> {
    let mut keywords = Vec::new();
    match body.raw("keywords").cloned() {
        None => return None,
        Some(Value::Array(list)) if list.len() <= MAX_KEYWORDS => {
            for k in list {
                match k.as_str() {
                    Some(s) if !marketplace_guest::is_blank(s) && s.chars().count() <= MAX_KEYWORD_CHARS => {
                        keywords.push(s.trim_matches(marketplace_guest::is_js_space).to_string())
                    }
                    _ => body.problem("keywords", format!("each keyword must be a non-empty string of at most {MAX_KEYWORD_CHARS} characters")),
                }
            }
        }
        Some(_) => body.problem(
            "keywords",
            format!("must be a list of at most {MAX_KEYWORDS} strings"),
        ),
    }
    Some(keywords)
}

/// The `activity_metadata` member, validated (None when absent).
fn metadata_field(body: &mut Body) -> Option<Value> {
    match body.raw("activity_metadata").cloned() {
        None => None,
        Some(v @ Value::Object(_)) if v.to_string().len() <= MAX_METADATA => Some(v),
        Some(Value::Object(_)) => {
            body.problem(
                "activity_metadata",
                format!("must be at most {MAX_METADATA} bytes as JSON"),
            );
            Some(Value::Null)
        }
        Some(_) => {
            body.problem("activity_metadata", "must be an object");
            Some(Value::Null)
        }
    }
}

/// The `attachments` member, validated (400 `invalid_attachment`) for a
/// post by `author` (the fingerprint the request claims).
fn attachments_field(body: &Body, author: Option<&str>) -> Result<Vec<NewAttachment>, ApiError> {
    let (attachments, problems) = attachment_problems(body, author)?;
    if !problems.is_empty() {
        let mut e = ApiError::invalid_many(problems);
        e.code = "invalid_attachment".into();
        return Err(e);
    }
    Ok(attachments)
}

/// Store a post's attachment bytes; their metadata.
fn store_attachments(
    post_id: &str,
    attachments: &[NewAttachment],
) -> Result<Vec<Attachment>, ApiError> {
    let mut meta = Vec::new();
    for (i, a) in attachments.iter().enumerate() {
        let (size, sha256, s3_key, url) = match &a.source {
            Source::Inline(content) => {
                kv::put_raw(&format!("att/{post_id}/{i:04}"), content.as_bytes())?;
                let sha256 = hex::sha256(content);
                (content.len(), sha256, None, None)
            }
            // The bytes stay with the identity family.
            Source::Upload { id, size, sha256 } => (
                *size,
                sha256.clone(),
                Some(format!("files/{id}")),
                Some(upload_url(id)),
            ),
        };
        meta.push(Attachment {
            index: i,
            filename: a.filename.clone(),
            attachment_type: a.attachment_type.clone(),
            size,
            sha256,
            s3_key,
            url,
        });
    }
    Ok(meta)
}

/// The texts of the indexed (inline markdown) attachments of a request:
/// uploads are not indexed.
fn new_markdown(attachments: &[NewAttachment]) -> Vec<&str> {
    attachments
        .iter()
        .filter(|a| index::is_markdown(&a.filename, &a.attachment_type))
        .filter_map(NewAttachment::content)
        .collect()
}

/// The texts of the indexed (inline markdown) attachments of a stored post.
fn stored_markdown(post: &Post) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    for a in &post.attachments {
        if a.s3_key.is_none()
            && index::is_markdown(&a.filename, &a.attachment_type)
            && let Some(bytes) = kv::get_raw(None, &format!("att/{}/{:04}", post.post_id, a.index))?
        {
            out.push(String::from_utf8_lossy(&bytes).into_owned());
        }
    }
    Ok(out)
}

fn create(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_type = body
        .optional_str("post_type", 64)
        .unwrap_or_else(|| "general".into());
    if !posts::is_post_type(&post_type) {
        body.problem("post_type", posts::POST_TYPE_RULE);
    }
    let private = post_type == model::PRIVATE_REPLY;
    // A private reply's text is its opaque payload; its content is "".
    let content = if private {
        match body.raw("content") {
            None => Some(String::new()),
            Some(Value::String(s)) if s.is_empty() => Some(String::new()),
            Some(_) => {
                body.problem(
                    "content",
                    "must be empty for a private reply (the text goes in encrypted_payload)",
                );
                None
            }
        }
    } else {
        body.required_str("content", MAX_CONTENT)
    };
    // "" is no parent, as null is (and as for the other optional ids).
    let parent_id = body.optional_str("parent_id", 64).filter(|p| !p.is_empty());
    let (recipient, payload) = if private {
        if parent_id.is_none() {
            body.problem("parent_id", "is required for a private reply");
        }
        let recipient = body.required_str("recipient_fingerprint", 64);
        let recipient = match recipient {
            Some(r) if hex::is_fingerprint(&r) => Some(r.to_ascii_lowercase()),
            Some(_) => {
                body.problem("recipient_fingerprint", "must be 64 hex characters");
                None
            }
            None => None,
        };
        let payload = body.required_str("encrypted_payload", MAX_PAYLOAD);
        (recipient, payload)
    } else {
        (None, None)
    };
    let keywords = keywords_field(&mut body).unwrap_or_default();
    let activity_metadata = metadata_field(&mut body).unwrap_or_else(|| json!({}));
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("author_fingerprint")?;
    let attachments = attachments_field(&body, body.text("author_fingerprint").as_deref())?;
    let content = content.unwrap_or_default();

    // The signature check is the costly part: done before payment, which
    // opens the write transaction that concurrent posts take turns on.
    let (author, message, signature) = (
        body.text("author_fingerprint"),
        format!("post:{}", payload.as_deref().unwrap_or(&content)),
        body.text("signature"),
    );
    precheck(author.as_deref(), &message, signature.as_deref(), timestamp);
    let payment = charge(
        if parent_id.is_some() {
            "comment"
        } else {
            "post"
        },
        None,
    )?;
    let (author, reused) = verify_in_order(
        "author_fingerprint",
        author.as_deref(),
        &message,
        signature.as_deref(),
        timestamp,
        false,
        true,
    )?;
    require_identity(&author)?;
    let mut parent = match &parent_id {
        Some(pid) => Some(
            model::load(pid)?.ok_or_else(|| ApiError::not_found(format!("parent post {pid}")))?,
        ),
        None => None,
    };
    // A private reply to nobody could never be read by its addressee.
    if let Some(r) = &recipient
        && !marketplace_guest::registered(r)?
    {
        return Err(ApiError::not_found(format!("recipient identity {r}")));
    }
    reused.check()?;

    let post_id = ["post_", &ids::ulid()].concat();
    let meta = store_attachments(&post_id, &attachments)?;
    let post = Post {
        post_id: post_id.clone(),
        parent_id: parent_id.clone(),
        author_fingerprint: author.clone(),
        content,
        post_type: post_type.clone(),
        keywords,
        attachments: meta,
        activity_metadata,
        created_at: marketplace_guest::now_rfc3339(),
        comment_count: 0,
        recipient_fingerprint: recipient,
        encrypted_payload: payload,
        listing: Some(marketplace_guest::posts::listing(
            attachments.iter().map(|a| a.filename.as_str()),
        )),
    };
    let record = post.save()?;
    if let Some(p) = parent.as_mut() {
        kv::put_raw(&["children/", &p.post_id, "/", &post_id].concat(), b"")?;
        p.comment_count += 1;
        kv::put(&record_key(&p.post_id), p)?;
    }
    // A private reply is reachable by id and through its parent only.
    if !private {
        // Keys put together with `concat`: `format!` is dear in a component.
        kv::put_raw(&["type/", &post_type, "/", &post_id].concat(), b"")?;
        kv::put_raw(&["author/", &author, "/", &post_id].concat(), b"")?;
        let count_key = ["author_count/", &author].concat();
        let count: u64 = kv::get(&count_key)?.unwrap_or(0);
        kv::put(&count_key, &(count + 1))?;
        index::add(&post, &new_markdown(&attachments))?;
    }
    // Members in name order, as the answer has always listed them.
    Ok(json_members(
        201,
        &[
            ("payment", &json_text(&payment)),
            ("post", &model::render_one(&record)?),
            ("post_id", &json_text(&post_id)),
        ],
    ))
}

/// The post a signed author request names, checked in the protocol's
/// order: 400 (body), 401 (signature, identity), 404 (post), 403 (not the
/// author), 409 (a signature used already). `require_fresh`: a legacy
/// (untimestamped) signature is refused.
fn authored_post(
    body: &Body,
    post_id: &str,
    timestamp: Option<u64>,
    action: &str,
    require_fresh: bool,
) -> Result<Post, ApiError> {
    let (author, reused) = verify_in_order(
        "author_fingerprint",
        body.text("author_fingerprint").as_deref(),
        &format!("{action}:{post_id}"),
        body.text("signature").as_deref(),
        timestamp,
        require_fresh,
        false,
    )?;
    require_identity(&author)?;
    let post =
        model::load(post_id)?.ok_or_else(|| ApiError::not_found(format!("post {post_id}")))?;
    if post.author_fingerprint != author {
        return Err(ApiError::new(
            403,
            "forbidden_party",
            "only the post's author may change it",
        ));
    }
    reused.check()?;
    Ok(post)
}

/// Updates one author makes in an hour (`updates_per_hour`, 1 to a
/// million; default 120), freshly signed and legacy-signed counted apart. An update is free and re-indexes the post: an
/// outside probe sent one author's 1.5 MB update again and again from 32
/// addresses (a legacy signature is reusable) and held paid posts for
/// seconds.
const UPDATES: Quota = Quota {
    setting: "updates_per_hour",
    default: 120,
    max: 1_000_000,
    window_ms: 3_600_000,
};

/// `POST /api/posts/update`: the author replaces members of a post (free).
fn update(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_id = body.required_str("post_id", 64).unwrap_or_default();
    let timestamp = body.optional_u64("timestamp");
    let content = match body.raw("content") {
        None => None,
        Some(_) => body.required_str("content", MAX_CONTENT),
    };
    let keywords = keywords_field(&mut body);
    let activity_metadata = metadata_field(&mut body);
    body.finish_signed("author_fingerprint")?;
    let attachments = match body.raw("attachments") {
        None => None,
        Some(_) => Some(attachments_field(
            &body,
            body.text("author_fingerprint").as_deref(),
        )?),
    };
    // An update's legacy signature signs no content: the operator may
    // require the fresh form for it.
    let fresh = !marketplace_guest::legacy_updates();
    let mut post = authored_post(&body, &post_id, timestamp, "update_post", fresh)?;
    // A legacy signature is reusable by whoever holds it: its updates are
    // counted apart, so that they cannot use up the author's own.
    let bucket = if timestamp.is_some() { "" } else { "legacy/" };
    let key = format!("updates/{bucket}{}", post.author_fingerprint);
    let counted = UPDATES.take(&key, |count, next| {
        format!(
            "this identity has updated posts {count} times this hour, the most one identity may an hour; it may update again from {next}"
        )
    })?;
    if let Some(refused) = counted {
        return Ok(refused);
    }
    if post.is_private() && content.is_some() {
        return Err(ApiError::invalid(
            "content",
            "a private reply has no content (its text is the encrypted_payload)",
        ));
    }
    // The index follows what it is made of: an update of the metadata
    // alone leaves it (re-indexing reads the stored attachments again).
    // One that sends any of them re-indexes, even unchanged: that is how
    // a post indexed under older rules is brought up to date.
    let reindex =
        !post.is_private() && (content.is_some() || keywords.is_some() || attachments.is_some());
    if reindex {
        index::remove(&post, || stored_markdown(&post))?;
    }
    if let Some(c) = content {
        post.content = c;
    }
    if let Some(k) = keywords {
        post.keywords = k;
    }
    if let Some(m) = activity_metadata {
        post.activity_metadata = m;
    }
    if let Some(list) = &attachments {
        for a in post.attachments.iter().filter(|a| a.s3_key.is_none()) {
            kv::delete(&format!("att/{}/{:04}", post.post_id, a.index))?;
        }
        post.attachments = store_attachments(&post.post_id, list)?;
        post.listing = Some(marketplace_guest::posts::listing(
            list.iter().map(|a| a.filename.as_str()),
        ));
    }
    let record = post.save()?;
    if reindex {
        match &attachments {
            Some(list) => index::add(&post, &new_markdown(list))?,
            None => {
                let texts = stored_markdown(&post)?;
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                index::add(&post, &texts)?;
            }
        }
    }
    Ok(json_members(200, &[("post", &model::render_one(&record)?)]))
}

/// `POST /api/posts/delete`: the author removes a post from everywhere.
fn delete(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_id = body.required_str("post_id", 64).unwrap_or_default();
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("author_fingerprint")?;
    let post = authored_post(&body, &post_id, timestamp, "delete_post", false)?;
    let id = &post.post_id;
    if !post.is_private() {
        index::remove(&post, || stored_markdown(&post))?;
        kv::delete(&format!("type/{}/{id}", post.post_type))?;
        kv::delete(&format!("author/{}/{id}", post.author_fingerprint))?;
        let count_key = format!("author_count/{}", post.author_fingerprint);
        let count: u64 = kv::get(&count_key)?.unwrap_or(0);
        kv::put(&count_key, &count.saturating_sub(1))?;
    }
    if let Some(pid) = &post.parent_id {
        // Its `children/` entry stays, marked deleted, and so do its
        // replies' under it: a thread walks through a deleted comment to
        // the replies below it.
        // (None when the thread's root went first: no entry to mark.)
        let entry = format!("children/{pid}/{id}");
        if kv::get_raw(None, &entry)?.is_some() {
            kv::put_raw(&entry, DELETED)?;
        }
        if let Some(mut parent) = model::load(pid)? {
            parent.comment_count = parent.comment_count.saturating_sub(1);
            kv::put(&record_key(pid), &parent)?;
        }
    }
    // Uploads stay with the identity family.
    for a in post.attachments.iter().filter(|a| a.s3_key.is_none()) {
        kv::delete(&format!("att/{id}/{:04}", a.index))?;
    }
    // A top-level post's thread goes with it; its replies stay readable by
    // id.
    if post.parent_id.is_none() {
        for (key, _) in kv::scan_prefix(None, &format!("children/{id}/"), false, 100_000)? {
            kv::delete(&key)?;
        }
    }
    kv::delete(&record_key(id))?;
    Ok(json(200, &json!({"post_id": id, "deleted": true})))
}

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

fn timeline(req: &Request) -> Result<Response, ApiError> {
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
                if listed.post_type == model::PRIVATE_REPLY
                    || post_type.is_some_and(|t| t != listed.post_type)
                {
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
    let next_before = if more { last_id } else { None };
    Ok(json_members(
        200,
        &[
            ("next_before", &json_text(&next_before)),
            ("posts", &model::render(&records)?),
        ],
    ))
}

fn get_post(req: &Request) -> Result<Response, ApiError> {
    let id = req.param("post_id");
    let record =
        model::load_record(id)?.ok_or_else(|| ApiError::not_found(format!("post {id}")))?;
    Ok(json_members(200, &[("post", &model::render_one(&record)?)]))
}

fn attachment(req: &Request) -> Result<Response, ApiError> {
    let id = req.param("post_id");
    let post = model::load(id)?.ok_or_else(|| ApiError::not_found(format!("post {id}")))?;
    let raw_index = req.param("index");
    // The index as the post lists it: "01" names nothing.
    let meta = marketplace_common::uint::parse(raw_index)
        .filter(|i| i.to_string() == raw_index)
        .and_then(|i| post.attachments.get(usize::try_from(i).ok()?))
        .ok_or_else(|| ApiError::not_found(format!("attachment {raw_index} of post {id}")))?;
    // An upload is read from the identity family when served: its bytes
    // and type are the upload's, and it may be gone.
    let upload = match meta.s3_key.as_deref() {
        None => None,
        Some(key) => {
            let gone = move || ApiError::not_found(format!("the upload {key} of post {id}"));
            let upload = upload_id(key).ok_or_else(gone)?;
            let file = upload_meta(upload)?.ok_or_else(gone)?;
            Some((upload, file, gone))
        }
    };
    // The tag changes with anything the answer carries: the bytes (their
    // sha256, or an upload's id: an upload never changes), and the type and
    // name an update may change while keeping them.
    let content = match &upload {
        None => meta.sha256.as_str(),
        Some((upload, ..)) => *upload,
    };
    // (An inline one's type as served: a cache that kept it without its
    // charset revalidates into the new answer.)
    let tagged_type = match &upload {
        None => with_utf8_charset(&meta.attachment_type),
        Some(_) => meta.attachment_type.clone(),
    };
    let tag = Sha256::digest(format!("{content}\0{tagged_type}\0{}", meta.filename));
    let etag = format!("\"{}\"", hex::encode(&tag[..16]));
    let mut headers = vec![
        ("etag".to_string(), etag.clone()),
        (
            "cache-control".into(),
            // The author may replace attachments: revalidate by ETag.
            "public, no-cache".into(),
        ),
        // The host answers a `Range` of them (resumed downloads, media).
        ("accept-ranges".into(), "bytes".into()),
    ];
    // Answered here, before the bytes are read (the host would answer the
    // same after them): If-None-Match compares weakly (RFC 9110 13.1.2),
    // `W/"x"` matches `"x"`.
    if req
        .header("if-none-match")
        .is_some_and(|v| marketplace_common::etag::listed(v, &etag, false))
    {
        return Ok(Response {
            status: 304,
            headers,
            body: vec![],
        });
    }
    let (bytes, content_type) = match upload {
        None => {
            let bytes =
                kv::get_raw(None, &format!("att/{id}/{:04}", meta.index))?.ok_or_else(|| {
                    ApiError::internal(format!("attachment bytes missing for {id}/{}", meta.index))
                })?;
            (bytes, tagged_type)
        }
        Some((upload, file, gone)) => {
            let bytes =
                kv::get_raw(Some("identity"), &format!("file/{upload}"))?.ok_or_else(gone)?;
            (bytes, file.media_type())
        }
    };
    headers.push(("content-type".into(), content_type));
    // The type is the uploader's choice: never let it run as our origin.
    headers.push(("x-content-type-options".into(), "nosniff".into()));
    headers.push((
        "content-security-policy".into(),
        "sandbox; default-src 'none'".into(),
    ));
    headers.push((
        "content-disposition".into(),
        content_disposition(&meta.filename),
    ));
    Ok(Response {
        status: 200,
        headers,
        body: bytes,
    })
}

use marketplace_common::text::reads_otherwise;

/// `inline` with the attachment's name (RFC 6266): an ASCII `filename`
/// for old clients ('_' for what is not printable ASCII, no quote or
/// backslash) and the exact name as `filename*` (UTF-8, percent-encoded).
/// Bidirectional controls are left out of both, so a name cannot show its
/// extension reversed.
fn content_disposition(filename: &str) -> String {
    // (Names taken before such characters were refused may hold them.)
    let name: String = filename.chars().filter(|c| !reads_otherwise(*c)).collect();
    // A name of bidirectional controls only: a name all the same.
    let name = if name.is_empty() {
        "attachment".to_string()
    } else {
        name
    };
    let ascii: String = name
        .chars()
        .map(|c| match c {
            ' '..='~' if c != '"' && c != '\\' => c,
            _ => '_',
        })
        .collect();
    let mut encoded = String::with_capacity(name.len() * 3);
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"!#$&+-.^_`|~".contains(&b) {
            encoded.push(b as char);
        } else {
            encoded.push_str(&format!("%{b:02X}"));
        }
    }
    format!("inline; filename=\"{ascii}\"; filename*=UTF-8''{encoded}")
}

fn thread(req: &Request) -> Result<Response, ApiError> {
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

marketplace_guest::endpoint_plugin!(Timeline);

/// An inline attachment's type as served: its bytes are the UTF-8 of the
/// JSON string it was sent as, so a `text/*` type without a charset says
/// so (`text/markdown` requires one, RFC 7763; without it Python's
/// `requests` and browsers read the bytes as Latin-1 and garble every
/// accented letter of a `terms.md`), and a type naming another charset
/// names UTF-8 instead (what it names is not what the bytes are).
fn with_utf8_charset(media_type: &str) -> String {
    let mut parts = media_type.split(';');
    let essence = parts.next().unwrap_or_default();
    let params: Vec<&str> = parts.collect();
    fn charset(p: &str) -> Option<&str> {
        let p = p.trim();
        p.get(..8)
            .is_some_and(|n| n.eq_ignore_ascii_case("charset="))
            .then(|| p[8..].trim_matches('"'))
    }
    let named = params.iter().find_map(|p| charset(p));
    let text = essence
        .trim_start()
        .get(..5)
        .is_some_and(|t| t.eq_ignore_ascii_case("text/"));
    match named {
        Some(c) if c.eq_ignore_ascii_case("utf-8") => media_type.to_string(),
        None if !text => media_type.to_string(),
        _ => {
            let mut served = essence.to_string();
            for p in params.iter().filter(|p| charset(p).is_none()) {
                served.push(';');
                served.push_str(p);
            }
            served + "; charset=utf-8"
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn inline_text_attachments_say_their_charset() {
        use super::with_utf8_charset as served;
        assert_eq!(served("text/markdown"), "text/markdown; charset=utf-8");
        assert_eq!(served("Text/Plain"), "Text/Plain; charset=utf-8");
        assert_eq!(
            served("text/plain; charset=utf-8"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            served("text/plain;Charset=UTF-8"),
            "text/plain;Charset=UTF-8"
        );
        assert_eq!(
            served("text/markdown; variant=GFM"),
            "text/markdown; variant=GFM; charset=utf-8"
        );
        assert_eq!(served("application/pdf"), "application/pdf");
        assert_eq!(served("text"), "text");
        // Another charset is not what the bytes are.
        assert_eq!(
            served("text/plain; charset=iso-8859-1"),
            "text/plain; charset=utf-8"
        );
        assert_eq!(
            served("text/csv;charset=\"us-ascii\";header=present"),
            "text/csv;header=present; charset=utf-8"
        );
        assert_eq!(
            served("application/json; charset=latin1"),
            "application/json; charset=utf-8"
        );
        assert_eq!(
            served("text/plain; charset=\"UTF-8\""),
            "text/plain; charset=\"UTF-8\""
        );
    }

    use super::content_disposition;

    #[test]
    fn attachment_names_in_both_forms_without_bidi_controls() {
        assert_eq!(
            content_disposition("terms.md"),
            "inline; filename=\"terms.md\"; filename*=UTF-8''terms.md"
        );
        assert_eq!(
            content_disposition("é ü.md"),
            "inline; filename=\"_ _.md\"; filename*=UTF-8''%C3%A9%20%C3%BC.md"
        );
        // A right-to-left override would show "exe.png" as "gnp.exe".
        assert_eq!(
            content_disposition("\u{202e}gnp.exe"),
            "inline; filename=\"gnp.exe\"; filename*=UTF-8''gnp.exe"
        );
        assert_eq!(
            content_disposition("\u{202e}\u{61c}"),
            "inline; filename=\"attachment\"; filename*=UTF-8''attachment"
        );
        assert_eq!(
            content_disposition("a\\b;c=d"),
            "inline; filename=\"a_b;c=d\"; filename*=UTF-8''a%5Cb%3Bc%3Dd"
        );
    }
}
