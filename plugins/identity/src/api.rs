//! The routes of the `identity` family and their OpenAPI.

use marketplace_guest::openapi::{self, Op, nonblank, obj, op, pattern, r, t, with_signature};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        query: &[
            (
                "fingerprint",
                "string",
                false,
                "64-hex key (either case); one that is not names no profile: 404",
            ),
            ("nickname", "string", false, "case-insensitive"),
        ],
        ok: (200, "ProfileEnvelope"),
        errors: &[400, 404],
        ..op(
            "GET",
            "/api/profile",
            "getProfile",
            "identity",
            "A profile",
            "By fingerprint or nickname (when both are given they must name the same profile, else 404; an empty one counts as absent, neither is 400; one naming no profile, well-formed or not, is 404).",
        )
    },
    Op {
        paid: Some("identity"),
        body: Some("NewIdentity"),
        ok: (201, "IdentityCreated"),
        errors: &[400, 401, 402, 409],
        ..op(
            "POST",
            "/api/identity",
            "createIdentity",
            "identity",
            "Register an identity",
            "Ed25519 public key as 64 hex in pgp_public_key; signed `register:{nickname}` by that key.",
        )
    },
    Op {
        paid: Some("rate"),
        body: Some("Rate"),
        ok: (200, "Rated"),
        errors: &[400, 401, 402, 403, 404, 409],
        ..op(
            "POST",
            "/api/profiles/rate",
            "rate",
            "identity",
            "Rate a post's author",
            "Signed `vote:{post_id}:{vote}`; one vote per (actor, post), a later vote replaces it.",
        )
    },
    Op {
        body: Some("DeleteIdentity"),
        ok: (200, "IdentityDeleted"),
        errors: &[400, 401, 409],
        ..op(
            "POST",
            "/api/identity/delete",
            "deleteIdentity",
            "identity",
            "Delete an identity",
            "Signed `delete_identity:{fingerprint}` (legacy form, single-use) or `delete_identity:{fingerprint}:{timestamp}` (fresh form). Free. Afterwards the profile answers 404 and the nickname is free again; posts keep their author fingerprint. An identity that is not registered (never, or deleted already): 401 `auth_invalid`.",
        )
    },
    Op {
        body: Some("UpdateProfile"),
        ok: (200, "ProfileEnvelope"),
        errors: &[400, 401, 409],
        ..op(
            "POST",
            "/api/profile/update",
            "updateProfile",
            "identity",
            "Update a profile",
            "Signed `update_profile:{fingerprint}` (or `update_profile:{fingerprint}:{timestamp}`, the only form taken when the operator sets `[settings.identity] legacy_updates = false`: 401 `auth_expired` otherwise). Free. Sets the members given: `about`, `skills` (at most 50 strings of at most 64 characters), `profile_picture` (the `s3_key` of an upload by the same identity; an empty string clears it). An identity that is not registered: 401 `auth_invalid`.",
        )
    },
    Op {
        writes: Some(false),
        body: Some("RecoveryScan"),
        ok: (200, "RecoveryScanResult"),
        errors: &[400, 401],
        ..op(
            "POST",
            "/api/recovery/scan",
            "recoveryScan",
            "identity",
            "Find the identities of derived keys",
            "The challenge is `recover:{fingerprint}:{RFC 3339 time}`, within 300 s of the server clock (401 auth_expired otherwise). Each probe signs the challenge with one candidate key; only probes whose signature verifies and whose key has a registered identity are answered. At most 100 probes. `contracts` lists the contracts of the answered identities (as buyer or seller, at most `contract_limit`, 1 to 500, default 100) only when the operator granted the identity family `read = [\"contracts\"]`; otherwise it is always empty.",
        )
    },
    Op {
        body: Some("Presign"),
        ok: (200, "Presigned"),
        errors: &[400, 401, 409],
        ..op(
            "POST",
            "/api/storage/presign",
            "presignUpload",
            "identity",
            "Get an upload URL",
            "Signed `presign:{file_path}` by `fingerprint` (a registered identity). Free. `presigned_url` is a single-use `PUT /api/storage/upload/{token}` on this service, valid `expires_in` seconds (900), taking at most 8 MiB. `s3_key` is `files/{id}` and `public_url` is `/api/storage/files/{id}` (absolute: from the service's `public_url` setting, else the request's Host); `s3_key` is what `profile_picture` refers to.",
        )
    },
    Op {
        ok: (200, "Uploaded"),
        errors: &[404],
        max_body: Some(MAX_UPLOAD),
        patch: Some(raw_body),
        ..op(
            "PUT",
            "/api/storage/upload/{token}",
            "uploadFile",
            "identity",
            "Upload a file",
            "The body is the file's bytes (at most 8 MiB; 413 above), stored with the content type given at presign. Single-use: an unknown, expired or used token is 404.",
        )
    },
    Op {
        ok: (200, "Raw"),
        errors: &[404],
        patch: Some(openapi::stored_bytes),
        ..op(
            "GET",
            "/api/storage/files/{token}",
            "getFile",
            "identity",
            "An uploaded file",
            "The bytes of upload `files/{token}` (`token`: the id of its `s3_key`), byte for byte, with the content type given at presign. The id is unguessable, a bearer capability: logs show it as `{token}`; an upload presigned with `is_public: false` is answered with `cache-control: private, no-store` (and `x-robots-tag: noindex`), a public one may be cached for a year. Its ETag is its checksum's first half (If-None-Match gives 304, If-Match 412); `Range` gives a part (206).",
        )
    },
];

/// Largest upload (bytes).
pub const MAX_UPLOAD: u32 = 8 * 1024 * 1024;

/// The upload takes raw bytes rather than JSON: any bytes under any
/// media type, none included (`format: binary`, so that generated
/// clients send a file's bytes as they are rather than as JSON).
fn raw_body(op: &mut Value) {
    op["requestBody"] = json!({
        "required": false,
        "description": "The file's bytes, whatever they are (served back with the content_type given at presign, not this request's); an empty body stores an empty file.",
        "content": {
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
            "*/*": {"schema": {"type": "string", "format": "binary"}},
        },
    });
}

/// A recovery challenge, `recover:{fingerprint}:{RFC 3339 time}`, as
/// exactly as the route reads it: a date that exists (30 February does
/// not; 29 February in leap years only), seconds to 59 (the route refuses
/// a leap second's `:60`, which no client clock writes). A year before
/// 1970 is a time long past (401), not a malformed challenge.
fn recovery_challenge() -> Value {
    const YEAR: &str = "[0-9]{4}";
    // Years divisible by 4 but not by 100, and those divisible by 400.
    const LEAP_YEAR: &str =
        "([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)";
    let date = format!(
        "({YEAR}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))|{LEAP_YEAR}-02-29)"
    );
    let time = "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?";
    let offset = "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
    json!({
        "type": "string",
        "maxLength": 300,
        "pattern": format!("^recover:[^:]+:{date}[Tt ]{time}{offset}$"),
    })
}

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    let profile = obj(
        &[
            ("fingerprint", t("string")),
            ("nickname", t("string")),
            ("about", t("string")),
            ("pub_key", t("string")),
            ("created_at", t("string")),
            ("skills", r("StringList")),
            (
                "profile_picture",
                json!({"type": ["string", "null"], "description": "s3_key of the picture"}),
            ),
            (
                "profile_picture_url",
                json!({"type": ["string", "null"], "description": "its public URL"}),
            ),
            ("post_count", t("integer")),
            (
                "rating",
                obj(
                    &[
                        ("up", t("integer")),
                        ("down", t("integer")),
                        ("score", t("integer")),
                    ],
                    &[],
                ),
            ),
        ],
        &["fingerprint", "nickname"],
    );
    json!({
        "Profile": profile,
        "ProfileEnvelope": obj(&[("profile", r("Profile"))], &["profile"]),
        "NewIdentity": with_signature(vec![("nickname", pattern("^[A-Za-z0-9_.-]{1,32}$")), ("pgp_public_key", openapi::fingerprint()), ("about", json!({"type": "string", "maxLength": 2000}))], &["nickname", "pgp_public_key"]),
        "IdentityCreated": obj(&[("fingerprint", t("string")), ("profile", r("Profile")), ("payment", openapi::payment())], &["fingerprint", "profile"]),
        "Rate": with_signature(vec![("post_id", nonblank(200)), ("actor_fingerprint", t("string")), ("vote", json!({"enum": ["up", "down"]}))], &["post_id", "vote"]),
        "DeleteIdentity": with_signature(vec![("fingerprint", openapi::fingerprint())], &[]),
        "IdentityDeleted": obj(&[("fingerprint", t("string")), ("deleted", t("boolean"))], &["fingerprint", "deleted"]),
        "UpdateProfile": with_signature(vec![("fingerprint", openapi::fingerprint()), ("about", json!({"type": "string", "maxLength": 2000})), ("skills", json!({"type": "array", "maxItems": 50, "items": {"type": "string", "minLength": 1, "maxLength": 64, "pattern": "\\S", "description": "trimmed; not blank"}})), ("profile_picture", json!({"type": "string", "maxLength": 200, "pattern": format!("^({})?$", marketplace_guest::UPLOAD_KEY_PATTERN), "description": "an s3_key from /api/storage/presign (an upload of this identity's), or \"\" to clear"}))], &[]),
        "RecoveryScan": obj(&[("challenge", recovery_challenge()), ("probes", json!({"type": "array", "maxItems": 100, "items": obj(&[("key_index", json!({"type": "integer", "minimum": 0, "maximum": 18446744073709551615u64})), ("fingerprint", openapi::fingerprint()), ("signature", json!({"type": "string", "maxLength": 256}))], &["key_index", "fingerprint", "signature"])})), ("include_contracts", t("boolean")), ("contract_limit", json!({"type": "integer", "minimum": 1, "maximum": 500}))], &["challenge", "probes"]),
        "RecoveryScanResult": obj(&[("challenge", t("string")), ("identities", json!({"type": "array", "items": obj(&[("key_index", t("integer")), ("fingerprint", t("string")), ("nickname", t("string")), ("pub_key", t("string"))], &["key_index", "fingerprint", "nickname", "pub_key"])})), ("contracts", json!({"type": "array", "items": obj(&[("contract_id", t("string")), ("contract_type", t("string")), ("status", t("string")), ("buyer_fingerprint", t("string")), ("seller_fingerprint", t("string")), ("amount", openapi::amount()), ("witness_proof", json!({"type": ["string", "null"]})), ("reference_post", t("string")), ("delivery_deadline", t("string")), ("created_at", t("string")), ("updated_at", t("string"))], &["contract_id", "status"])}))], &["challenge", "identities", "contracts"]),
        "Presign": with_signature(vec![("fingerprint", openapi::fingerprint()), ("file_path", nonblank(1024)), ("content_type", json!({"type": "string", "minLength": 3, "maxLength": 255, "pattern": marketplace_common::media::MEDIA_TYPE_PATTERN, "description": "a media type (type/subtype, then ; name=value parameters), served back as the upload's Content-Type"})), ("is_public", json!({"type": "boolean", "description": "false: served only to holders of its URL, kept out of shared caches"}))], &["file_path", "content_type"]),
        "Presigned": obj(&[("presigned_url", t("string")), ("s3_key", t("string")), ("public_url", t("string")), ("expires_in", t("integer")), ("method", json!({"const": "PUT", "description": "how to send the bytes to presigned_url"})), ("max_bytes", json!({"type": "integer", "description": "the largest upload presigned_url takes (413 above it)"}))], &["presigned_url", "s3_key", "public_url", "expires_in"]),
        "Uploaded": obj(&[("s3_key", t("string")), ("public_url", t("string")), ("size", t("integer")), ("sha256", json!({"type": "string", "pattern": "^[0-9a-f]{64}$", "description": "SHA-256 of the bytes (hex), shown with the post attachments that name this upload"})), ("content_type", t("string"))], &["s3_key", "public_url", "size", "sha256"]),
        "Rated": obj(&[("post_id", t("string")), ("vote", t("string")), ("previous_vote", json!({"type": ["string", "null"], "description": "this actor's earlier vote on the post, replaced (null: the first)"})), ("author_fingerprint", json!({"type": "string", "description": "the rated author"})), ("rating", json!({"type": "object", "description": "the author's tally after the vote", "properties": {"up": t("integer"), "down": t("integer"), "score": json!({"type": "integer", "description": "up - down"})}})), ("post_rating", json!({"type": "object", "description": "the post's own tally", "properties": {"up": t("integer"), "down": t("integer")}})), ("payment", openapi::payment())], &["post_id", "vote", "rating"]),
    })
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
            ("GET", "/api/profile", false),
            ("POST", "/api/identity", true),
            ("POST", "/api/profiles/rate", true),
            ("POST", "/api/identity/delete", true),
            ("POST", "/api/profile/update", true),
            ("POST", "/api/recovery/scan", false),
            ("POST", "/api/storage/presign", true),
            ("PUT", "/api/storage/upload/{token}", true),
            ("GET", "/api/storage/files/{token}", false),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
