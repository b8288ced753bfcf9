//! The `identity` family: `POST /api/identity` (paid `identity`),
//! `GET /api/profile`, `POST /api/profiles/rate` (paid `rate`), and the
//! original client's calls (PROTOCOL 10): `POST /api/identity/delete`,
//! `POST /api/profile/update`, `POST /api/recovery/scan`,
//! `POST /api/storage/presign` with its upload `PUT
//! /api/storage/upload/{token}` and `GET /api/storage/files/{token}`.
//!
//! Keyspace `identity`:
//! - `id/{fingerprint}` -> [`Identity`]
//! - `nick/{lower-case nickname}` -> fingerprint
//! - `rating/{fingerprint}` -> [`Tally`] of votes on the author's posts
//! - `post_rating/{post_id}` -> [`Tally`] of one post
//! - `vote/{post_id}/{actor}` -> "up" | "down"
//! - `upload/{token}` -> [`uploads::Upload`]: a presigned, not yet used upload
//! - `file/{id}` -> the raw bytes of an upload (`s3_key` = `files/{id}`), in
//!   pieces of about a MiB: the first there, the next at `file/{id}/1`...
//!   (`kv::put_large`, read with `kv::get_large`)
//! - `file_meta/{id}` -> [`uploads::FileMeta`]
//!
//! Reads (read-only) from `timeline`: `post/{post_id}` (its
//! `author_fingerprint`) and `author_count/{fingerprint}`. The recovery
//! scan reads `contracts` (`c/{contract_id}`) only when the operator granted
//! it (identity is granted `read = ["contracts"]` by default); without the grant its `contracts` is empty.

mod account;
mod api;
mod recovery;
mod uploads;

use marketplace_guest::prelude::*;
use serde::{Deserialize, Serialize};

struct IdentityFamily;

/// Longest nickname.
const MAX_NICKNAME: usize = 32;
/// Longest "about" text.
const MAX_ABOUT: usize = 2000;

#[derive(Serialize, Deserialize)]
struct Identity {
    fingerprint: String,
    nickname: String,
    about: String,
    created_at: String,
    #[serde(default)]
    skills: Vec<String>,
    /// The `s3_key` of an upload.
    #[serde(default)]
    profile_picture: Option<String>,
}

#[derive(Serialize, Deserialize, Default, Clone, Copy)]
struct Tally {
    up: u64,
    down: u64,
}

impl Tally {
    fn json(self) -> Value {
        json!({"up": self.up, "down": self.down, "score": self.up as i64 - self.down as i64})
    }
    fn add(&mut self, vote: &str, delta: i64) {
        let slot = if vote == "up" {
            &mut self.up
        } else {
            &mut self.down
        };
        *slot = (*slot as i64 + delta).max(0) as u64;
    }
}

impl Endpoint for IdentityFamily {
    const NAME: &'static str = "identity";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> =
        Some(&[marketplace_guest::LEGACY_UPDATES]);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("POST", "/api/identity") => register(req),
            ("GET", "/api/profile") => profile(req),
            ("POST", "/api/profiles/rate") => rate(req),
            ("POST", "/api/identity/delete") => account::delete_identity(req),
            ("POST", "/api/profile/update") => account::update_profile(req),
            ("POST", "/api/recovery/scan") => recovery::recovery_scan(req),
            ("POST", "/api/storage/presign") => uploads::presign(req),
            ("PUT", "/api/storage/upload/{token}") => uploads::upload(req),
            ("GET", "/api/storage/files/{token}") => uploads::file(req),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

fn valid_nickname(n: &str) -> bool {
    n.chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

use marketplace_common::hex::is_fingerprint;

/// The public profile document (`req` gives the base of the picture's URL).
fn profile_json(req: &Request, id: &Identity) -> Result<Value, ApiError> {
    let tally: Tally = kv::get(&format!("rating/{}", id.fingerprint))?.unwrap_or_default();
    let posts: u64 = kv::get_in(
        Some("timeline"),
        &format!("author_count/{}", id.fingerprint),
    )?
    .unwrap_or(0);
    Ok(json!({
        "fingerprint": id.fingerprint,
        "nickname": id.nickname,
        "about": id.about,
        "pub_key": id.fingerprint,
        "created_at": id.created_at,
        "skills": id.skills,
        "profile_picture": id.profile_picture,
        "profile_picture_url": id.profile_picture.as_deref().map(|k| uploads::public_url(req, k)),
        "post_count": posts,
        "rating": tally.json(),
    }))
}

fn register(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let nickname = body.required_str("nickname", MAX_NICKNAME);
    if let Some(n) = &nickname
        && !valid_nickname(n)
    {
        body.problem(
            "nickname",
            "may contain only ASCII letters and digits, '_', '-' and '.'",
        );
    }
    // As sent: a key with spaces around it is not 64 hex characters
    // (PROTOCOL 1: malformed is 400, never quietly mended).
    let key = body.required_str("pgp_public_key", 10_000);
    if let Some(k) = &key {
        if k.contains("BEGIN PGP") {
            body.problem(
                "pgp_public_key",
                "OpenPGP armored keys are not accepted: send the Ed25519 public key as 64 hex characters",
            );
        } else if !is_fingerprint(k) {
            body.problem(
                "pgp_public_key",
                "must be the Ed25519 public key as 64 hex characters",
            );
        }
    }
    let about = body.optional_str("about", MAX_ABOUT).unwrap_or_default();
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("pgp_public_key")?;
    let (nickname, fingerprint) = (
        nickname.unwrap_or_default(),
        key.unwrap_or_default().to_ascii_lowercase(),
    );

    let message = format!("register:{nickname}");
    let signature = body.text("signature");
    precheck(
        Some(&fingerprint),
        &message,
        signature.as_deref(),
        timestamp,
    );
    let payment = charge("identity", None)?;
    verify(
        "pgp_public_key",
        Some(&fingerprint),
        &message,
        signature.as_deref(),
        timestamp,
        false,
        false,
    )?;
    if kv::get_raw(None, &format!("id/{fingerprint}"))?.is_some() {
        return Err(ApiError::conflict("this public key is already registered"));
    }
    // A legacy signature of a registration that was deleted since is a
    // replay for all this request can tell (the same key signs the same
    // message the same way): only a fresh signature brings it back.
    if timestamp.is_none() && kv::get_raw(None, &deleted_key(&fingerprint, &nickname))?.is_some() {
        return Err(ApiError::conflict(format!(
            "this identity ({nickname}) was deleted: register it again with a fresh (timestamped) signature"
        )));
    }
    let nick_key = format!("nick/{}", nickname.to_ascii_lowercase());
    if kv::get_raw(None, &nick_key)?.is_some() {
        return Err(ApiError::conflict(format!("nickname {nickname} is taken")));
    }
    let id = Identity {
        fingerprint: fingerprint.clone(),
        nickname,
        about,
        created_at: marketplace_guest::now_rfc3339(),
        skills: Vec::new(),
        profile_picture: None,
    };
    kv::put(&format!("id/{fingerprint}"), &id)?;
    kv::put(&nick_key, &fingerprint)?;
    Ok(json(
        201,
        &json!({"fingerprint": fingerprint, "profile": profile_json(req, &id)?, "payment": payment}),
    ))
}

/// Where a deleted identity's key and nickname are remembered
/// (`deleted/{fingerprint}/{nickname}`), so its legacy registration
/// cannot be replayed.
pub(crate) fn deleted_key(fingerprint: &str, nickname: &str) -> String {
    format!("deleted/{fingerprint}/{nickname}")
}

fn profile(req: &Request) -> Result<Response, ApiError> {
    // An empty parameter is an absent one (a client filling the query
    // template with one value left out). A fingerprint that names nothing
    // is 404, well-formed or not (PROTOCOL section 1).
    let given = |name: &str| req.query(name).filter(|v| !v.is_empty());
    let fingerprint = match (given("fingerprint"), given("nickname")) {
        (Some(fp), _) => fp.to_ascii_lowercase(),
        (None, Some(nick)) => kv::get::<String>(&format!("nick/{}", nick.to_ascii_lowercase()))?
            .ok_or_else(|| ApiError::not_found(format!("profile {nick}")))?,
        (None, None) => {
            return Err(ApiError::invalid(
                "fingerprint",
                "give fingerprint or nickname",
            ));
        }
    };
    let id: Identity =
        kv::get(&format!("id/{fingerprint}"))?.ok_or_else(|| ApiError::not_found("profile"))?;
    // Both given: they must name the same identity (a nickname in any
    // case), not one silently ignored.
    if let Some(nick) = given("nickname")
        && given("fingerprint").is_some()
        && !nick.eq_ignore_ascii_case(&id.nickname)
    {
        return Err(ApiError::not_found(format!(
            "profile with fingerprint {fingerprint} and nickname {nick}"
        )));
    }
    Ok(json(200, &json!({"profile": profile_json(req, &id)?})))
}

fn rate(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let post_id = body.required_str("post_id", 200);
    let vote = body.required_str("vote", 10);
    if let Some(v) = &vote
        && v != "up"
        && v != "down"
    {
        body.problem("vote", "must be \"up\" or \"down\"");
    }
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("actor_fingerprint")?;
    let (post_id, vote) = (post_id.unwrap_or_default(), vote.unwrap_or_default());

    let (actor, message, signature) = (
        body.text("actor_fingerprint"),
        format!("vote:{post_id}:{vote}"),
        body.text("signature"),
    );
    precheck(actor.as_deref(), &message, signature.as_deref(), timestamp);
    let payment = charge("rate", None)?;
    let (actor, reused) = verify_in_order(
        "actor_fingerprint",
        actor.as_deref(),
        &message,
        signature.as_deref(),
        timestamp,
        false,
        false,
    )?;
    require_identity(&actor)?;
    let author = marketplace_guest::posts::author_of(&post_id)?;
    if author == actor {
        return Err(ApiError::new(
            403,
            "forbidden_party",
            "you cannot rate your own post",
        ));
    }
    // A vote rates the author: one whose identity was deleted has no
    // profile to carry it.
    if !marketplace_guest::registered(&author)? {
        return Err(ApiError::new(
            404,
            "not_found",
            format!(
                "post {post_id}'s author has no registered identity (deleted): there is no profile to rate"
            ),
        ));
    }
    reused.check()?;

    let vote_key = format!("vote/{post_id}/{actor}");
    let previous: Option<String> = kv::get(&vote_key)?;
    let mut author_tally: Tally = kv::get(&format!("rating/{author}"))?.unwrap_or_default();
    let mut post_tally: Tally = kv::get(&format!("post_rating/{post_id}"))?.unwrap_or_default();
    if let Some(prev) = &previous {
        author_tally.add(prev, -1);
        post_tally.add(prev, -1);
    }
    author_tally.add(&vote, 1);
    post_tally.add(&vote, 1);
    kv::put(&vote_key, &vote)?;
    kv::put(&format!("rating/{author}"), &author_tally)?;
    kv::put(&format!("post_rating/{post_id}"), &post_tally)?;
    Ok(json(
        200,
        &json!({
            "post_id": post_id,
            "vote": vote,
            "previous_vote": previous,
            "author_fingerprint": author,
            "rating": author_tally.json(),
            "post_rating": {"up": post_tally.up, "down": post_tally.down},
            "payment": payment,
        }),
    ))
}

marketplace_guest::endpoint_plugin!(IdentityFamily);
