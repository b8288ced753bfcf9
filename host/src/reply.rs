//! The reply type every layer returns.

use serde_json::{Value, json};

/// An HTTP answer produced by the host or a plugin.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// A JSON answer.
    pub fn json(status: u16, value: &Value) -> Reply {
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

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }
}
