//! The routes of the `identity` family and their OpenAPI.

use marketplace_guest::openapi::{self, Op, nonblank, obj, op, pattern, r, t, with_signature};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        query: &[
            ("fingerprint", "string", false, "64-hex key"),
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
            "By fingerprint or nickname.",
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
        errors: &[400, 401, 402, 403, 404],
        ..op(
            "POST",
            "/api/profiles/rate",
            "rate",
            "identity",
            "Rate a post's author",
            "Signed `vote:{post_id}:{vote}`; one vote per (actor, post), a later vote replaces it.",
        )
    },
];

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    let profile = obj(
        &[
            ("fingerprint", t("string")),
            ("nickname", t("string")),
            ("about", t("string")),
            ("pub_key", t("string")),
            ("created_at", t("string")),
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
        "NewIdentity": with_signature(vec![("nickname", pattern("^[A-Za-z0-9_.-]{1,32}$")), ("pgp_public_key", openapi::fingerprint()), ("about", json!({"type": "string", "maxLength": 2000}))], &["nickname", "pgp_public_key", "signature"]),
        "IdentityCreated": obj(&[("fingerprint", t("string")), ("profile", r("Profile")), ("payment", openapi::payment())], &["fingerprint", "profile"]),
        "Rate": with_signature(vec![("post_id", nonblank(200)), ("actor_fingerprint", t("string")), ("vote", json!({"enum": ["up", "down"]}))], &["post_id", "actor_fingerprint", "vote", "signature"]),
        "Rated": obj(&[("post_id", t("string")), ("vote", t("string")), ("rating", t("object")), ("payment", openapi::payment())], &["post_id", "vote", "rating"]),
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
        let routes: Vec<(String, String, bool)> = api()
            .routes
            .into_iter()
            .map(|r| (r.method, r.pattern, r.writes))
            .collect();
        let expected = [
            ("GET", "/api/profile", false),
            ("POST", "/api/identity", true),
            ("POST", "/api/profiles/rate", true),
        ];
        assert_eq!(
            routes,
            expected.map(|(m, p, w)| (m.to_string(), p.to_string(), w))
        );
    }
}
