//! The routes of the `info` family and their OpenAPI.

use marketplace_guest::openapi::{self, Op, obj, op, r, t};
use marketplace_guest::prelude::*;

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        ok: (200, "Info"),
        ..op(
            "GET",
            "/api/info",
            "info",
            "info",
            "Service information",
            "Name, version, payment rails, fee policy in force and loaded plugins.",
        )
    },
    Op {
        ok: (200, "Any"),
        ..op(
            "GET",
            "/api/developers",
            "developers",
            "info",
            "Plugin developer guide",
            "How to build a plugin: WIT package and worlds, the template, build commands and the WIT text.",
        )
    },
];

/// The component schemas the operations reference (besides the host's).
pub fn schemas() -> Value {
    json!({
        "Info": obj(&[("name", t("string")), ("version", t("string")), ("payment_rails", json!({"type": "array", "items": r("PaymentRail")})), ("fee_schedule_url", t("string")), ("fee_policy", t("string")), ("plugins", t("object")), ("description", t("string")), ("openapi", json!({"type": "string", "description": "the OpenAPI document"})), ("docs", json!({"type": "string", "description": "the API reference page"})), ("manifest", json!({"type": "string", "description": "the agent manifest"}))], &["name", "version"]),
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
            ("GET", "/api/info", false),
            ("GET", "/api/developers", false),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
