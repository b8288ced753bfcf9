//! The reply type every layer returns.

use serde_json::json;

/// An HTTP answer produced by the host or a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// A JSON answer (a `Value`, or anything serializable straight to
    /// bytes, without building a `Value` first).
    pub fn json(status: u16, value: &(impl serde::Serialize + ?Sized)) -> Reply {
        Reply {
            status,
            headers: vec![],
            body: serde_json::to_vec(value).unwrap_or_default(),
        }
    }

    /// A protocol error `{"code", "message"}`.
    pub fn error(status: u16, code: &str, message: impl Into<String>) -> Reply {
        Reply::json(status, &json!({"code": code, "message": message.into()}))
    }

    /// 400 `invalid_request` about one field, with its `details`.
    pub fn invalid(field: &str, problem: impl Into<String>) -> Reply {
        let problem = problem.into();
        Reply::json(
            400,
            &json!({
                "code": "invalid_request",
                "message": format!("{field}: {problem}"),
                "details": [{"field": field, "problem": problem}],
            }),
        )
    }

    /// 503 `storage_conflict`: a request kept losing races with other
    /// hosts' on the shared store; nothing of it was kept.
    pub fn conflict() -> Reply {
        let mut reply = Reply::error(
            503,
            "storage_conflict",
            "the request kept conflicting with concurrent ones on the shared store; nothing was kept, try again",
        );
        reply.headers.push(("retry-after".into(), "1".into()));
        reply
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// The answer to a storage failure of the host's own: 503
/// `storage_conflict` for a lost race, else a 500 (logged by the caller).
pub fn storage_failure(e: &crate::store::StorageError) -> Reply {
    match e {
        crate::store::StorageError::Conflict => Reply::conflict(),
        _ => Reply::error(500, "internal", "internal error"),
    }
}
