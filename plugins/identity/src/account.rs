//! The original client's account calls (PROTOCOL 10): delete an identity
//! and update a profile, each signed by the identity, and the signer
//! checks the family's signed calls share.

use crate::uploads::FileMeta;
use crate::{Identity, is_fingerprint};
use marketplace_guest::prelude::*;

/// Most skills on a profile, and the longest skill.
const MAX_SKILLS: usize = 50;
const MAX_SKILL: usize = 64;

/// What a legacy (untimestamped) signature may do on a route.
#[derive(Clone, Copy)]
pub(crate) enum Legacy {
    Accepted,
    /// Accepted once: a second use is 409 `conflict`.
    SingleUse,
    /// The fresh form is required (401 `auth_expired`).
    Refused,
}

/// The signer of a body's statement `{message}` (legacy or fresh form).
pub(crate) fn signer(
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

/// Why a `profile_picture` is refused that names no upload.
const NOT_AN_UPLOAD_KEY: &str = "must be the s3_key of an upload (files/{id}) or \"\"";

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
    // Its form is checked with the other members, before the signature
    // (PROTOCOL 1: 400 before 401); whose upload it is, after.
    if picture
        .as_deref()
        .is_some_and(|p| !p.is_empty() && marketplace_guest::upload_id(p).is_none())
    {
        body.problem("profile_picture", NOT_AN_UPLOAD_KEY);
    }
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
            let meta: Option<FileMeta> = marketplace_guest::upload_id(&p)
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
                    return Err(ApiError::invalid("profile_picture", NOT_AN_UPLOAD_KEY));
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
