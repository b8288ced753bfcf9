//! A post's attachments: checking those a request sends (inline text, or
//! an upload of the author's by its `s3_key`), storing them, the markdown
//! the index reads of them, and serving one
//! (`GET /api/posts/{post_id}/attachments/{index}`).

use crate::index;
use crate::model::{self, Attachment, Post};
use crate::{MAX_ATTACHMENT_BYTES, MAX_ATTACHMENTS};
use marketplace_common::hex;
use marketplace_guest::prelude::*;
use marketplace_guest::{Body, upload_id};
use sha2::{Digest, Sha256};

/// A validated attachment from the request.
pub(crate) struct NewAttachment {
    pub(crate) filename: String,
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

/// The `attachments` member, validated (400 `invalid_attachment`) for a
/// post by `author` (the fingerprint the request claims).
pub(crate) fn attachments_field(
    body: &Body,
    author: Option<&str>,
) -> Result<Vec<NewAttachment>, ApiError> {
    let (attachments, problems) = attachment_problems(body, author)?;
    if !problems.is_empty() {
        let mut e = ApiError::invalid_many(problems);
        e.code = "invalid_attachment".into();
        return Err(e);
    }
    Ok(attachments)
}

/// Store a post's attachment bytes; their metadata.
pub(crate) fn store_attachments(
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
pub(crate) fn new_markdown(attachments: &[NewAttachment]) -> Vec<&str> {
    attachments
        .iter()
        .filter(|a| index::is_markdown(&a.filename, &a.attachment_type))
        .filter_map(NewAttachment::content)
        .collect()
}

/// The texts of the indexed (inline markdown) attachments of a stored post.
pub(crate) fn stored_markdown(post: &Post) -> Result<Vec<String>, ApiError> {
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

pub(crate) fn attachment(req: &Request) -> Result<Response, ApiError> {
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
            let bytes = kv::get_large(Some("identity"), &format!("file/{upload}"), file.size)?
                .ok_or_else(gone)?;
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
