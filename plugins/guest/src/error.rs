//! Protocol errors: every failure is `{"code", "message", ...extra}`.

use serde_json::{Map, Value, json};

/// One field-level problem of a 400 `invalid_request`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detail {
    pub field: String,
    pub problem: String,
}

/// An HTTP error answer in the protocol's shape.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
    /// Extra top-level members (e.g. `details`, `current_status`).
    pub extra: Map<String, Value>,
}

/// Characters of what a 404 names, at most.
pub const NAMED_CHARS: usize = 200;

/// `s` cut to its first `max` characters, `...` marking a cut.
pub fn clip(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// Most problems one 400 names in `details`: an MCP call with 30,000
/// unknown arguments was answered 7.6 MB naming each (an outside audit).
pub const MAX_DETAILS: usize = 20;

impl ApiError {
    pub fn new(status: u16, code: &str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.to_string(),
            message: message.into(),
            extra: Map::new(),
        }
    }

    /// Add an extra top-level member to the error body.
    pub fn with(mut self, key: &str, value: Value) -> Self {
        self.extra.insert(key.to_string(), value);
        self
    }

    /// 400 `invalid_request` naming one field.
    pub fn invalid(field: &str, problem: impl Into<String>) -> Self {
        Self::invalid_many(vec![Detail {
            field: field.to_string(),
            problem: problem.into(),
        }])
    }

    /// 400 `invalid_request` naming several fields: at most
    /// [`MAX_DETAILS`] of them, the rest counted in the message.
    pub fn invalid_many(mut details: Vec<Detail>) -> Self {
        let more = details.len().saturating_sub(MAX_DETAILS);
        details.truncate(MAX_DETAILS);
        let mut message = details
            .iter()
            .map(|d| format!("{}: {}", d.field, d.problem))
            .collect::<Vec<_>>()
            .join("; ");
        if more > 0 {
            message.push_str(&format!("; and {more} more"));
        }
        let details: Vec<Value> = details
            .into_iter()
            .map(|d| json!({"field": d.field, "problem": d.problem}))
            .collect();
        Self::new(400, "invalid_request", message).with("details", Value::Array(details))
    }

    /// 404 `not_found`.
    /// `what` is clipped to [`NAMED_CHARS`]: an id a stranger sent is not
    /// echoed whole (a path may hold 64 KiB of it).
    pub fn not_found(what: impl Into<String>) -> Self {
        let what = clip(&what.into(), NAMED_CHARS);
        Self::new(404, "not_found", format!("{what} not found"))
    }

    /// 409 `conflict`.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, "conflict", message)
    }

    /// 500 `internal`; the detail goes to the log, never to the client.
    pub fn internal(detail: impl AsRef<str>) -> Self {
        #[cfg(all(feature = "endpoint", target_family = "wasm"))]
        crate::endpoint::log_error(detail.as_ref());
        #[cfg(not(all(feature = "endpoint", target_family = "wasm")))]
        let _ = detail;
        Self::new(500, "internal", "internal error")
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        let mut map = Map::new();
        map.insert("code".into(), Value::String(self.code.clone()));
        map.insert("message".into(), Value::String(self.message.clone()));
        for (k, v) in &self.extra {
            map.insert(k.clone(), v.clone());
        }
        Value::Object(map)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_lists_details_and_message() {
        let e = ApiError::invalid("limit", "must be between 1 and 100");
        assert_eq!(e.status, 400);
        let body = e.body();
        assert_eq!(body["code"], "invalid_request");
        assert_eq!(body["details"][0]["field"], "limit");
        assert_eq!(body["message"], "limit: must be between 1 and 100");
    }

    #[test]
    fn past_twenty_problems_the_rest_are_counted() {
        let details = (0..30_000)
            .map(|i| Detail {
                field: format!("arguments.a{i}"),
                problem: "is not a parameter of this tool".into(),
            })
            .collect();
        let body = ApiError::invalid_many(details).body();
        assert_eq!(body["details"].as_array().unwrap().len(), MAX_DETAILS);
        assert_eq!(body["details"][19]["field"], "arguments.a19");
        let message = body["message"].as_str().unwrap();
        assert!(message.ends_with("; and 29980 more"), "{message}");
        assert!(message.starts_with("arguments.a0: is not"), "{message}");
    }

    #[test]
    fn extra_members_are_top_level() {
        let e = ApiError::new(409, "invalid_transition", "no").with("current_status", json!("x"));
        assert_eq!(e.body()["current_status"], "x");
    }
}
