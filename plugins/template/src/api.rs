//! The routes of the `template` family and their OpenAPI: what the host
//! builds its route table and `/openapi.json` from.

use marketplace_guest::openapi::{self, LIMIT, Op, nonblank, obj, op, t};
use marketplace_guest::prelude::*;

/// Longest note, in characters.
pub const MAX_NOTE: usize = 200;

/// The routes of the family, with their OpenAPI.
pub const OPS: &[Op] = &[
    Op {
        query: &[LIMIT],
        ok: (200, "TemplateNotes"),
        errors: &[400],
        ..op(
            "GET",
            "/api/template/notes",
            "templateNotes",
            "template",
            "List notes",
            "How many notes were written, and the newest ones first.",
        )
    },
    Op {
        body: Some("TemplateNewNote"),
        ok: (201, "TemplateNoteCreated"),
        errors: &[400],
        ..op(
            "POST",
            "/api/template/notes",
            "templateCreateNote",
            "template",
            "Write a note",
            "Stores a note of at most 200 characters.",
        )
    },
];

/// The schemas the routes reference. Names are shared by every family, so
/// prefix yours with the family name.
pub fn schemas() -> Value {
    json!({
        "TemplateNotes": obj(&[("count", t("integer")), ("notes", json!({"type": "array", "items": t("string")}))], &["count", "notes"]),
        "TemplateNewNote": obj(&[("note", nonblank(MAX_NOTE))], &["note"]),
        "TemplateNoteCreated": obj(&[("count", t("integer")), ("note", t("string"))], &["count", "note"]),
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
    fn routes_and_schemas_agree() {
        assert_eq!(openapi::check(OPS, &schemas()), Ok(()));
        assert_eq!(
            openapi::routes_of(&api()),
            [
                ("GET", "/api/template/notes", false),
                ("POST", "/api/template/notes", true)
            ]
        );
    }
}
