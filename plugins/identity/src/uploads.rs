//! Uploads hosted by the service itself (PROTOCOL 10): a presigned URL,
//! its single-use `PUT`, and the public `GET` of what was uploaded.

use crate::account::{Legacy, signer};
use marketplace_common::hex;
use marketplace_guest::prelude::*;
use marketplace_guest::{clock, ids};
use serde::{Deserialize, Serialize};

/// How long a presigned upload URL stays valid (seconds).
const UPLOAD_TTL_S: u64 = 900;

/// A presigned upload not yet used (`upload/{token}`).
#[derive(Serialize, Deserialize)]
pub struct Upload {
    id: String,
    owner: String,
    file_path: String,
    content_type: String,
    is_public: bool,
    expires_ms: u64,
}

/// What is known of an upload besides its bytes (`file_meta/{id}`).
#[derive(Serialize, Deserialize)]
pub struct FileMeta {
    pub(crate) owner: String,
    file_path: String,
    content_type: String,
    is_public: bool,
    size: u64,
    created_at: String,
    /// SHA-256 of the bytes (hex; empty for uploads stored before it was
    /// kept), shown with a post's attachment as an inline one's is.
    #[serde(default)]
    sha256: String,
}

/// `http(s)://{host}` of the request, or "" (a relative URL).
fn base_url(req: &Request) -> String {
    marketplace_common::url::base_url(req.header("host"), req.header("x-forwarded-proto"))
}

/// The public URL of an upload's `s3_key` (`files/{id}`).
pub fn public_url(req: &Request, s3_key: &str) -> String {
    format!("{}/api/storage/{s3_key}", base_url(req))
}

/// `POST /api/storage/presign`: a single-use upload URL on this service.
/// Most uploads (files and open tokens) one identity may ever presign.
pub const MAX_UPLOADS_PER_IDENTITY: u64 = 64;

pub fn presign(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let file_path = body.required_str("file_path", 1024);
    let content_type = body.required_str("content_type", 255);
    if let Some(ct) = &content_type
        && !marketplace_common::media::is_media_type(ct)
    {
        // Served back as the upload's Content-Type.
        body.problem(
            "content_type",
            "must be a media type like image/png (type/subtype, then ; name=value parameters)",
        );
    }
    let is_public = match body.raw("is_public") {
        None => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            body.problem("is_public", "must be a boolean");
            true
        }
    };
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("fingerprint")?;
    let file_path = file_path.unwrap_or_default();
    let actor = signer(
        &body,
        "fingerprint",
        &format!("presign:{file_path}"),
        timestamp,
        Legacy::Accepted,
    )?;
    require_identity(&actor)?;
    // The id is unguessable (a ULID and 128 random bits), so a private
    // upload is served only to those given its key.
    let id = format!(
        "{}{}",
        ids::ulid().to_ascii_lowercase(),
        hex::encode(&ids::random_bytes(16))
    );
    // Presigning is free: bound what one identity may hold (uploaded files
    // and open tokens together), so nobody fills the disk for nothing.
    let quota_key = format!("upload_quota/{actor}");
    let used: u64 = kv::get(&quota_key)?.unwrap_or(0);
    if used >= MAX_UPLOADS_PER_IDENTITY {
        return Err(ApiError::new(
            409,
            "conflict",
            format!("an identity may presign at most {MAX_UPLOADS_PER_IDENTITY} uploads"),
        ));
    }
    kv::put(&quota_key, &(used + 1))?;
    let token = hex::encode(&ids::random_bytes(32));
    let upload = Upload {
        id: id.clone(),
        owner: actor,
        file_path,
        content_type: content_type.unwrap_or_default(),
        is_public,
        expires_ms: clock::now_ms() + UPLOAD_TTL_S * 1000,
    };
    kv::put(&format!("upload/{token}"), &upload)?;
    let s3_key = format!("files/{id}");
    Ok(json(
        200,
        &json!({
            "presigned_url": format!("{}/api/storage/upload/{token}", base_url(req)),
            "s3_key": s3_key,
            "public_url": public_url(req, &s3_key),
            "expires_in": UPLOAD_TTL_S,
            "method": "PUT",
            "max_bytes": crate::api::MAX_UPLOAD,
        }),
    ))
}

/// `PUT /api/storage/upload/{token}`: store the body under the presigned
/// key; the token is used up.
pub fn upload(req: &Request) -> Result<Response, ApiError> {
    let token = req.param("token");
    let key = format!("upload/{token}");
    let gone = || ApiError::not_found("upload URL (unknown, expired or already used)");
    if token.is_empty() || token.len() > 128 {
        return Err(gone());
    }
    let up: Upload = kv::get(&key)?.ok_or_else(gone)?;
    if clock::now_ms() > up.expires_ms {
        return Err(gone());
    }
    kv::delete(&key)?;
    let size = req.body().len() as u64;
    let sha256 = marketplace_common::hex::sha256(req.body());
    kv::put_large(&format!("file/{}", up.id), req.body())?;
    let meta = FileMeta {
        owner: up.owner,
        file_path: up.file_path,
        content_type: up.content_type.clone(),
        is_public: up.is_public,
        size,
        created_at: marketplace_guest::now_rfc3339(),
        sha256: sha256.clone(),
    };
    kv::put(&format!("file_meta/{}", up.id), &meta)?;
    let s3_key = format!("files/{}", up.id);
    Ok(json(
        200,
        &json!({
            "s3_key": s3_key,
            "public_url": public_url(req, &s3_key),
            "size": size,
            "sha256": sha256,
            "content_type": up.content_type,
        }),
    ))
}

/// `GET /api/storage/files/{token}`: the bytes, with their content type.
pub fn file(req: &Request) -> Result<Response, ApiError> {
    let id = req.param("token");
    let missing = || ApiError::not_found(format!("file {id}"));
    if !marketplace_guest::is_upload_id(id) {
        return Err(missing());
    }
    let meta: FileMeta = kv::get(&format!("file_meta/{id}"))?.ok_or_else(missing)?;
    let bytes = kv::get_large(None, &format!("file/{id}"), meta.size)?.ok_or_else(missing)?;
    let mut headers = vec![
        ("content-type".into(), meta.content_type),
        ("x-content-type-options".into(), "nosniff".into()),
        // Uploaded HTML must not run as this service's pages.
        ("content-security-policy".into(), "sandbox".into()),
        // The host answers a `Range` of it (resumed downloads, media).
        ("accept-ranges".into(), "bytes".into()),
    ];
    // A file never changes under its token: its checksum tags it (not the
    // token, a capability), so a resumed download's `If-Range` holds
    // (uploads stored before checksums were kept have no tag).
    if !meta.sha256.is_empty() {
        headers.push((
            "etag".into(),
            format!("\"{}\"", &meta.sha256[..32.min(meta.sha256.len())]),
        ));
    }
    if meta.is_public {
        headers.push((
            "cache-control".into(),
            "public, max-age=31536000, immutable".into(),
        ));
    } else {
        // Presigned with `is_public: false`: served to whoever holds its
        // unguessable URL, as a private object's presigned URL is, and
        // kept out of shared caches and search engines.
        headers.extend([
            ("cache-control".into(), "private, no-store".into()),
            ("x-robots-tag".into(), "noindex".into()),
            ("referrer-policy".into(), "no-referrer".into()),
        ]);
    }
    Ok(Response {
        status: 200,
        headers,
        body: bytes,
    })
}
