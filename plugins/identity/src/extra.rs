//! The original client's identity calls (PROTOCOL 10): delete an identity,
//! update a profile, scan derived keys for recovery, and uploads hosted by
//! the service itself (presign, single-use PUT, public GET).

use crate::{Identity, is_fingerprint};
use marketplace_common::{amount, hex, time};
use marketplace_guest::prelude::*;
use marketplace_guest::{auth, clock, ids, storage};
use serde::{Deserialize, Serialize};

/// How long a presigned upload URL stays valid (seconds).
const UPLOAD_TTL_S: u64 = 900;
/// Most skills on a profile, and the longest skill.
const MAX_SKILLS: usize = 50;
const MAX_SKILL: usize = 64;
/// Most probes in one recovery scan.
const MAX_PROBES: usize = 100;
/// How far the challenge's time may be from the host clock (seconds).
const CHALLENGE_WINDOW_S: u64 = 300;
/// Contracts a scan lists by default, and at most.
const DEFAULT_CONTRACTS: u64 = 100;
const MAX_CONTRACTS: u64 = 500;
/// Contracts the scan looks through at most (pages of `SCAN_PAGE`).
const SCAN_PAGE: u32 = 500;
const SCAN_PAGES: usize = 40;

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
    owner: String,
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

/// What a legacy (untimestamped) signature may do on a route.
#[derive(Clone, Copy)]
enum Legacy {
    Accepted,
    /// Accepted once: a second use is 409 `conflict`.
    SingleUse,
    /// The fresh form is required (401 `auth_expired`).
    Refused,
}

/// The signer of a body's statement `{message}` (legacy or fresh form).
fn signer(
    body: &Body,
    actor_field: &str,
    message: &str,
    timestamp: Option<u64>,
    legacy: Legacy,
) -> Result<String, ApiError> {
    let actor = body.text(actor_field).map(|a| a.to_ascii_lowercase());
    let signature = body.text("signature");
    verify(
        actor_field,
        actor.as_deref(),
        message,
        signature.as_deref(),
        timestamp,
        matches!(legacy, Legacy::Refused),
        matches!(legacy, Legacy::SingleUse),
    )
    .map(|a| a.to_ascii_lowercase())
}

/// A member of the body as the client sent it, for a signed message: a
/// message names its signer as sent (PROTOCOL 2's `{field}`), upper-case
/// hex included, as buy and accept do, though the identity is looked up in
/// lower case.
fn as_sent(body: &Body, field: &str) -> String {
    body.text(field).unwrap_or_default()
}

/// The storage key (the fingerprint in lower case) and identity of a
/// signed request's `fingerprint` (its signer, read as every signed route
/// reads its signer):
/// 401 `auth_required` when the request is not signed (no signature, or no
/// signer; one that is not a string was the body's 400 already), 401
/// `auth_invalid` when the signer is
/// not a key or has no identity (never registered, or deleted already),
/// as PROTOCOL section 2 says of any signer.
fn registered(body: &Body) -> Result<(String, Identity), ApiError> {
    let (Some(fingerprint), Some(_)) = (body.text("fingerprint"), body.text("signature")) else {
        return Err(unsigned("fingerprint"));
    };
    if !is_fingerprint(&fingerprint) {
        return Err(ApiError::new(
            401,
            "auth_invalid",
            "the signer's fingerprint must be a 64-hex Ed25519 public key",
        ));
    }
    let fingerprint = fingerprint.to_ascii_lowercase();
    let key = format!("id/{fingerprint}");
    match kv::get(&key)? {
        Some(id) => Ok((key, id)),
        None => Err(unregistered()),
    }
}

/// `POST /api/identity/delete`: the identity and its nickname go; posts,
/// ratings and uploads stay.
pub fn delete_identity(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("fingerprint")?;
    // Looked up first, so that repeating a delete does not spend its
    // signature.
    let (key, id) = registered(&body)?;
    // A legacy delete signature is single-use: replayed after the key
    // registers again it would delete the new identity.
    let actor = signer(
        &body,
        "fingerprint",
        &format!("delete_identity:{}", as_sent(&body, "fingerprint")),
        timestamp,
        Legacy::SingleUse,
    )?;
    kv::delete(&key)?;
    // Its registration, if legacy-signed, could be replayed by anyone to
    // bring the identity back: a legacy registration of this key and
    // nickname is refused from now on (see `register`).
    kv::put(&crate::deleted_key(&actor, &id.nickname), &true)?;
    let nick_key = format!("nick/{}", id.nickname.to_ascii_lowercase());
    if kv::get::<String>(&nick_key)?.as_deref() == Some(actor.as_str()) {
        kv::delete(&nick_key)?;
    }
    Ok(json(200, &json!({"fingerprint": actor, "deleted": true})))
}

/// `POST /api/profile/update`: sets `about`, `skills`, `profile_picture`.
pub fn update_profile(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let about = body.optional_str("about", crate::MAX_ABOUT);
    let skills = match body.raw("skills") {
        None => None,
        Some(Value::Array(items)) if items.len() > MAX_SKILLS => {
            body.problem("skills", format!("at most {MAX_SKILLS} skills"));
            None
        }
        Some(Value::Array(items)) => {
            let mut skills = Vec::new();
            let mut bad = None;
            for (i, item) in items.iter().enumerate() {
                // Trimmed as the document's `\S` reads white space; its
                // length is the item's as sent (the document's maxLength).
                match item.as_str().map(|sent| {
                    (
                        sent.trim_matches(marketplace_guest::is_js_space),
                        sent.chars().count(),
                    )
                }) {
                    Some((s, sent)) if !s.is_empty() && sent <= MAX_SKILL => {
                        skills.push(s.to_string())
                    }
                    _ => {
                        bad = Some(i);
                        break;
                    }
                }
            }
            if let Some(i) = bad {
                body.problem(
                    "skills",
                    format!(
                        "item {i} must be a non-empty string of at most {MAX_SKILL} characters"
                    ),
                );
                None
            } else {
                Some(skills)
            }
        }
        Some(_) => {
            body.problem("skills", "must be a list of strings");
            None
        }
    };
    let picture = body.optional_str("profile_picture", 200);
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("fingerprint")?;
    let (key, mut id) = registered(&body)?;
    let actor = signer(
        &body,
        "fingerprint",
        &format!("update_profile:{}", as_sent(&body, "fingerprint")),
        timestamp,
        if marketplace_guest::legacy_updates() {
            Legacy::Accepted
        } else {
            Legacy::Refused
        },
    )?;
    if let Some(p) = picture {
        if p.is_empty() {
            id.profile_picture = None;
        } else {
            let meta: Option<FileMeta> = p
                .strip_prefix("files/")
                .map(|fid| kv::get(&format!("file_meta/{fid}")))
                .transpose()?
                .flatten();
            match meta {
                Some(m) if m.owner == actor => id.profile_picture = Some(p),
                Some(_) => {
                    return Err(ApiError::invalid(
                        "profile_picture",
                        "the upload belongs to another identity",
                    ));
                }
                None => {
                    return Err(ApiError::invalid(
                        "profile_picture",
                        "must be the s3_key of an upload (files/{id}) or \"\"",
                    ));
                }
            }
        }
    }
    if let Some(a) = about {
        id.about = a;
    }
    if let Some(s) = skills {
        id.skills = s;
    }
    kv::put(&key, &id)?;
    Ok(json(
        200,
        &json!({"profile": crate::profile_json(req, &id)?}),
    ))
}

/// `POST /api/recovery/scan`: which probed keys have identities.
pub fn recovery_scan(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let challenge = body.required_str("challenge", 300);
    let challenge_ms = challenge.as_deref().and_then(|c| {
        let (fp, at) = c.strip_prefix("recover:")?.split_once(':')?;
        (!fp.is_empty()).then_some(())?;
        // No leap second (`HH:MM:60`): RFC 3339 admits one at the end of a
        // month, but no client's clock writes it, and the documented
        // pattern stays a plain one.
        (at.get(17..19) != Some("60")).then_some(())?;
        // A time before 1970 is a time long past (401 below), not a
        // malformed challenge.
        time::parse_rfc3339_signed(at).map(|ms| u64::try_from(ms).unwrap_or(0))
    });
    if challenge.is_some() && challenge_ms.is_none() {
        body.problem("challenge", "must be recover:{fingerprint}:{RFC 3339 time}");
    }
    let mut probes = Vec::new();
    match body.raw("probes").cloned() {
        None => body.problem("probes", "is required"),
        Some(Value::Array(items)) if items.len() > MAX_PROBES => {
            body.problem("probes", format!("at most {MAX_PROBES} probes"))
        }
        Some(Value::Array(items)) => {
            for (i, p) in items.iter().enumerate() {
                // JSON Schema's integers: 7 or 7.0.
                let index = p
                    .get("key_index")
                    .and_then(Value::as_number)
                    .and_then(marketplace_guest::whole_u64);
                let fp = p.get("fingerprint").and_then(Value::as_str);
                let sig = p.get("signature").and_then(Value::as_str);
                match (index, fp, sig) {
                    (Some(_), Some(fp), Some(_)) if !is_fingerprint(fp) => body.problem(
                        "probes",
                        format!(
                            "probe {i}'s fingerprint must be 64 hexadecimal digits (its Ed25519 public key)"
                        ),
                    ),
                    (Some(index), Some(fp), Some(sig)) if sig.chars().count() <= 256 => {
                        probes.push((index, fp.to_ascii_lowercase(), sig.to_string()))
                    }
                    _ => body.problem(
                        "probes",
                        format!(
                            "probe {i} must have key_index (an integer from 0 to 2^64-1), fingerprint and signature (strings, the signature at most 256 characters)"
                        ),
                    ),
                }
            }
        }
        Some(_) => body.problem("probes", "must be a list"),
    }
    let include_contracts = match body.raw("include_contracts") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            body.problem("include_contracts", "must be a boolean");
            false
        }
    };
    let limit = body.optional_u64("contract_limit");
    if limit.is_some_and(|l| !(1..=MAX_CONTRACTS).contains(&l)) {
        body.problem(
            "contract_limit",
            format!("must be an integer from 1 to {MAX_CONTRACTS}"),
        );
    }
    body.finish()?;
    let challenge = challenge.unwrap_or_default();
    let now = clock::now_ms();
    let at = challenge_ms.unwrap_or_default();
    if now.abs_diff(at) > CHALLENGE_WINDOW_S * 1000 {
        return Err(ApiError::new(
            401,
            "auth_expired",
            format!(
                "the challenge's time must be within {CHALLENGE_WINDOW_S} s of the server clock"
            ),
        ));
    }

    let mut identities = Vec::new();
    let mut found = Vec::new();
    // Every probed key looked up first, in one call: a probe of a key with
    // no identity (a stranger's hundred random keys) costs no signature
    // check.
    let keys: Vec<String> = probes.iter().map(|(_, fp, _)| format!("id/{fp}")).collect();
    let found_ids = kv::get_many_raw(None, &keys)?;
    for ((index, fp, sig), (key, bytes)) in probes.into_iter().zip(keys.iter().zip(found_ids)) {
        let Some(bytes) = bytes else {
            continue;
        };
        let id: Identity = kv::parse(key, &bytes)?;
        let verifies = auth::precheck(&auth::Signed {
            actor: fp.clone(),
            message: challenge.clone(),
            signature: sig,
            timestamp: None,
        });
        if verifies {
            identities.push(json!({
                "key_index": index,
                "fingerprint": id.fingerprint,
                "nickname": id.nickname,
                "pub_key": id.fingerprint,
            }));
            found.push(fp);
        }
    }
    let contracts = if include_contracts && !found.is_empty() {
        contracts_of(&found, limit.unwrap_or(DEFAULT_CONTRACTS) as usize)?
    } else {
        Vec::new()
    };
    Ok(json(
        200,
        &json!({"challenge": challenge, "identities": identities, "contracts": contracts}),
    ))
}

/// The contracts where one of `parties` is buyer or seller, in the order
/// of their ids, when the family may read the `contracts` keyspace; empty
/// otherwise. Read through the contracts family's index by party once it
/// covers every contract, else by reading the contracts themselves.
fn contracts_of(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    use marketplace_common::parties as index;
    match storage::get(Some("contracts"), index::PROGRESS.as_bytes()) {
        // Not granted (the default) or no contracts family: nothing.
        Err(storage::StorageError::Forbidden(_))
        | Err(storage::StorageError::UnknownKeyspace(_)) => Ok(Vec::new()),
        Err(e) => Err(ApiError::internal(format!("storage: {e:?}"))),
        Ok(Some(p)) if p == index::COMPLETE => indexed(parties, limit),
        Ok(_) => scanned(parties, limit),
    }
}

/// [`contracts_of`] through the index: each party's first `limit` ids, the
/// first `limit` of them all, then those contracts.
fn indexed(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    use marketplace_common::parties as index;
    let mut ids = std::collections::BTreeSet::new();
    for party in parties {
        let prefix = index::prefix(party);
        for (key, _) in kv::scan_prefix(Some("contracts"), &prefix, false, limit as u32)? {
            ids.insert(key[prefix.len()..].to_string());
        }
    }
    let keys: Vec<String> = ids
        .into_iter()
        .take(limit)
        .map(|id| format!("c/{id}"))
        .collect();
    let mut out = Vec::with_capacity(keys.len());
    let mut chunk = keys.len().max(1);
    let mut done = 0;
    while done < keys.len() {
        let (page, n) = kv::get_many_fitting(Some("contracts"), &keys[done..], &mut chunk)?;
        for value in page.values().flatten() {
            if let Some(c) = summary(value, parties) {
                out.push(c);
            }
        }
        done += n;
    }
    Ok(out)
}

/// [`contracts_of`] by reading the contracts in order (a database whose
/// contracts from before the index are not all indexed yet).
fn scanned(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    let end = kv::prefix_end(b"c/");
    let mut start = b"c/".to_vec();
    for _ in 0..SCAN_PAGES {
        let page = storage::scan(Some("contracts"), &start, end.as_deref(), false, SCAN_PAGE)
            .map_err(|e| ApiError::internal(format!("storage: {e:?}")))?;
        let full = page.len() == SCAN_PAGE as usize;
        for entry in &page {
            if let Some(c) = summary(&entry.value, parties) {
                out.push(c);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        match page.last() {
            Some(last) if full => {
                start = last.key.clone();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok(out)
}

/// What a scan shows of a stored contract, when one of `parties` is its
/// buyer or seller.
fn summary(stored: &[u8], parties: &[String]) -> Option<Value> {
    let c = serde_json::from_slice::<Value>(stored).ok()?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
    let (buyer, seller) = (s("buyer_fingerprint"), s("target_seller_fingerprint"));
    if !parties.iter().any(|p| p == buyer || p == seller) {
        return None;
    }
    Some(json!({
        "contract_id": s("contract_id"),
        "contract_type": s("contract_type"),
        "status": c.get("status").cloned().unwrap_or(Value::Null),
        "buyer_fingerprint": buyer,
        "seller_fingerprint": seller,
        "amount": amount::format(c.get("amount").and_then(Value::as_u64).unwrap_or(0)),
        "witness_proof": c.get("witness_proof").cloned().unwrap_or(Value::Null),
        "reference_post": s("reference_post"),
        "delivery_deadline": time::rfc3339(c.get("delivery_deadline_ms").and_then(Value::as_u64).unwrap_or(0)),
        "created_at": s("created_at"),
        "updated_at": s("updated_at"),
    }))
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
    kv::put_raw(&format!("file/{}", up.id), req.body())?;
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
    if id.is_empty() || id.len() > 128 || !id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(missing());
    }
    let meta: FileMeta = kv::get(&format!("file_meta/{id}"))?.ok_or_else(missing)?;
    let bytes = kv::get_raw(None, &format!("file/{id}"))?.ok_or_else(missing)?;
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
