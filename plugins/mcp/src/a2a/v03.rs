//! A2A 0.3 on the same endpoint: its method names (`message/send`,
//! `tasks/get`, ...) and JSON shapes (`kind` members, `"user"`, `"completed"`)
//! translated to and from the 1.0 ones the agent speaks, as the official
//! `a2a-sdk` 1.x maps them (`a2a.compat.v0_3.conversions`). A2A 1.0 (3.6.2):
//! a request without `A2A-Version` is 0.3's, so a 0.3 client (which sends
//! none) is served; 0.3 had no `tasks/list`.

use super::{INVALID_PARAMS, RpcError, err};
use marketplace_guest::prelude::*;
use serde_json::Map;

/// The 1.0 method of a 0.3 method name.
pub fn method(name: &str) -> Option<&'static str> {
    Some(match name {
        "message/send" => "SendMessage",
        "message/stream" => "SendStreamingMessage",
        "tasks/get" => "GetTask",
        "tasks/cancel" => "CancelTask",
        "tasks/resubscribe" => "SubscribeToTask",
        "tasks/pushNotificationConfig/set" => "CreateTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/get" => "GetTaskPushNotificationConfig",
        "tasks/pushNotificationConfig/list" => "ListTaskPushNotificationConfigs",
        "tasks/pushNotificationConfig/delete" => "DeleteTaskPushNotificationConfig",
        "agent/getAuthenticatedExtendedCard" => "GetExtendedAgentCard",
        _ => return None,
    })
}

/// Whether an `A2A-Version` value names 0.3 (`0.3`, `0.3.0`).
pub fn is_v03(version: &str) -> bool {
    version == "0.3" || version.starts_with("0.3.")
}

/// The 1.0 params of a 0.3 request to `method` (its 1.0 name).
pub fn params_in(method: &str, params: &Value) -> Result<Value, RpcError> {
    let mut params = params.clone();
    match method {
        "SendMessage" => {
            if let Some(message) = params.get_mut("message").filter(|m| m.is_object()) {
                *message = message_in(message)?;
            }
            // 0.3: a historyLength of 0 is all of it (the SDK leaves it
            // unset); `blocking` is moot, every task is final at once.
            if let Some(Value::Object(config)) = params.get_mut("configuration") {
                unlimited_history(config);
                config.remove("blocking");
            }
        }
        "GetTask" => {
            if let Value::Object(p) = &mut params {
                unlimited_history(p);
            }
        }
        _ => {}
    }
    Ok(params)
}

fn unlimited_history(members: &mut Map<String, Value>) {
    if members.get("historyLength").and_then(Value::as_f64) == Some(0.0) {
        members.remove("historyLength");
    }
}

/// A 0.3 message as 1.0 has it: its role's enum name, its parts without
/// `kind` (a file as `raw` or `url`).
fn message_in(message: &Value) -> Result<Value, RpcError> {
    let mut m = message.clone();
    let Value::Object(members) = &mut m else {
        return Ok(m);
    };
    members.remove("kind");
    match members.get("role").and_then(Value::as_str) {
        Some("user") => members.insert("role".into(), "ROLE_USER".into()),
        Some(other) => {
            return Err(err(
                INVALID_PARAMS,
                format!("message.role must be \"user\" (A2A 0.3), not {other:?}"),
            ));
        }
        None => None,
    };
    if let Some(Value::Array(parts)) = members.get_mut("parts") {
        for part in parts.iter_mut() {
            *part = part_in(part);
        }
    }
    Ok(m)
}

/// A 0.3 part (`{kind, text | data | file, metadata?}`) as 1.0's.
fn part_in(part: &Value) -> Value {
    let Value::Object(members) = part else {
        return part.clone();
    };
    let mut out = members.clone();
    out.remove("kind");
    if let Some(Value::Object(file)) = out.remove("file") {
        let content = match (file.get("bytes"), file.get("uri")) {
            (Some(bytes), _) => ("raw", bytes.clone()),
            (None, Some(uri)) => ("url", uri.clone()),
            // Neither: a part with no content, refused as such.
            (None, None) => return Value::Object(out),
        };
        out.insert(content.0.into(), content.1);
        if let Some(mime) = file.get("mimeType") {
            out.insert("mediaType".into(), mime.clone());
        }
        if let Some(name) = file.get("name") {
            out.insert("filename".into(), name.clone());
        }
    }
    Value::Object(out)
}

/// The 0.3 result of a 1.0 result of `method`: `SendMessage`'s `{task}`
/// is the task itself, as every task and message is, in 0.3's shapes.
pub fn result_out(method: &str, result: Value) -> Value {
    match method {
        "SendMessage" => match result {
            Value::Object(mut r) => match (r.remove("task"), r.remove("message")) {
                (Some(task), _) => task_out(task),
                (None, Some(message)) => message_out(message),
                (None, None) => Value::Object(r),
            },
            other => other,
        },
        "GetTask" | "CancelTask" => task_out(result),
        _ => result,
    }
}

fn task_out(mut task: Value) -> Value {
    let Value::Object(t) = &mut task else {
        return task;
    };
    t.insert("kind".into(), "task".into());
    if let Some(Value::Object(status)) = t.get_mut("status") {
        if let Some(state) = status.get("state").and_then(Value::as_str) {
            status.insert("state".into(), state_out(state).into());
        }
        if let Some(message) = status.remove("message") {
            status.insert("message".into(), message_out(message));
        }
    }
    if let Some(Value::Array(history)) = t.get_mut("history") {
        for m in history.iter_mut() {
            *m = message_out(std::mem::take(m));
        }
    }
    if let Some(Value::Array(artifacts)) = t.get_mut("artifacts") {
        for a in artifacts.iter_mut() {
            if let Some(Value::Array(parts)) = a.get_mut("parts") {
                parts_out(parts);
            }
        }
    }
    task
}

/// A task state as 0.3 names it (`TASK_STATE_INPUT_REQUIRED` ->
/// `input-required`).
fn state_out(state: &str) -> String {
    match state.strip_prefix("TASK_STATE_") {
        Some("UNSPECIFIED") | None => "unknown".into(),
        Some(s) => s.to_ascii_lowercase().replace('_', "-"),
    }
}

fn message_out(mut message: Value) -> Value {
    let Value::Object(m) = &mut message else {
        return message;
    };
    m.insert("kind".into(), "message".into());
    let role = match m.get("role").and_then(Value::as_str) {
        Some("ROLE_USER") => "user",
        _ => "agent",
    };
    m.insert("role".into(), role.into());
    if let Some(Value::Array(parts)) = m.get_mut("parts") {
        parts_out(parts);
    }
    message
}

fn parts_out(parts: &mut [Value]) {
    for p in parts.iter_mut() {
        *p = part_out(std::mem::take(p));
    }
}

/// A 1.0 part as 0.3's: `kind` and its content; a data part's data is an
/// object (another value goes in `{value}`, said in its metadata, as the
/// SDK does); a file's media type and name inside its `file`.
fn part_out(part: Value) -> Value {
    let Value::Object(mut p) = part else {
        return part;
    };
    let mut out = Map::new();
    let metadata = p.remove("metadata");
    let media_type = p.remove("mediaType");
    let filename = p.remove("filename");
    if let Some(text) = p.remove("text") {
        out.insert("kind".into(), "text".into());
        out.insert("text".into(), text);
    } else if let Some(data) = p.remove("data") {
        out.insert("kind".into(), "data".into());
        if data.is_object() {
            out.insert("data".into(), data);
        } else {
            out.insert("data".into(), json!({"value": data}));
            let mut meta = metadata.clone().unwrap_or_else(|| json!({}));
            meta["data_part_compat"] = true.into();
            out.insert("metadata".into(), meta);
        }
    } else {
        let mut file = Map::new();
        if let Some(raw) = p.remove("raw") {
            file.insert("bytes".into(), raw);
        } else if let Some(url) = p.remove("url") {
            file.insert("uri".into(), url);
        }
        if let Some(m) = media_type {
            file.insert("mimeType".into(), m);
        }
        if let Some(n) = filename {
            file.insert("name".into(), n);
        }
        out.insert("kind".into(), "file".into());
        out.insert("file".into(), Value::Object(file));
    }
    if let Some(m) = metadata {
        out.entry("metadata").or_insert(m);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_comes_in_as_1_0s() {
        let m = json!({"kind": "message", "messageId": "m1", "role": "user", "parts": [
            {"kind": "text", "text": "walnut"},
            {"kind": "data", "data": {"term": "oak"}},
            {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain", "name": "a.txt"}},
            {"kind": "file", "file": {"uri": "https://x.example/a"}},
        ]});
        let p = params_in("SendMessage", &json!({"message": m, "configuration": {"historyLength": 0, "blocking": true, "acceptedOutputModes": ["text/plain"]}})).unwrap();
        assert_eq!(
            p,
            json!({"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [
                {"text": "walnut"},
                {"data": {"term": "oak"}},
                {"raw": "aGk=", "mediaType": "text/plain", "filename": "a.txt"},
                {"url": "https://x.example/a"},
            ]}, "configuration": {"acceptedOutputModes": ["text/plain"]}})
        );
        // 0.3's roles are "user" and "agent".
        let bad = json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": []}});
        assert_eq!(
            params_in("SendMessage", &bad).unwrap_err().0,
            INVALID_PARAMS
        );
        assert_eq!(
            params_in("GetTask", &json!({"id": "t", "historyLength": 0})).unwrap(),
            json!({"id": "t"})
        );
    }

    #[test]
    fn a_task_goes_out_as_0_3s() {
        let task = json!({"task": {"id": "task_1", "contextId": "ctx_1",
            "status": {"state": "TASK_STATE_INPUT_REQUIRED", "timestamp": "2026-01-01T00:00:00Z",
                       "message": {"messageId": "r", "role": "ROLE_AGENT", "parts": [{"text": "hi"}]}},
            "artifacts": [{"artifactId": "a", "name": "search", "parts": [
                {"text": "found"}, {"data": {"total": 1}, "mediaType": "application/json"}, {"data": [1, 2]}]}],
            "history": [{"messageId": "m", "role": "ROLE_USER", "parts": [{"raw": "aGk=", "mediaType": "text/plain"}]}],
            "metadata": {"skill": "search"}}});
        assert_eq!(
            result_out("SendMessage", task),
            json!({"kind": "task", "id": "task_1", "contextId": "ctx_1",
                "status": {"state": "input-required", "timestamp": "2026-01-01T00:00:00Z",
                           "message": {"kind": "message", "messageId": "r", "role": "agent", "parts": [{"kind": "text", "text": "hi"}]}},
                "artifacts": [{"artifactId": "a", "name": "search", "parts": [
                    {"kind": "text", "text": "found"}, {"kind": "data", "data": {"total": 1}},
                    {"kind": "data", "data": {"value": [1, 2]}, "metadata": {"data_part_compat": true}}]}],
                "history": [{"kind": "message", "messageId": "m", "role": "user", "parts": [
                    {"kind": "file", "file": {"bytes": "aGk=", "mimeType": "text/plain"}}]}],
                "metadata": {"skill": "search"}})
        );
        assert_eq!(state_out("TASK_STATE_COMPLETED"), "completed");
        assert_eq!(state_out("TASK_STATE_UNSPECIFIED"), "unknown");
    }

    #[test]
    fn method_names_map() {
        assert_eq!(method("message/send"), Some("SendMessage"));
        assert_eq!(method("tasks/get"), Some("GetTask"));
        assert_eq!(method("SendMessage"), None);
        assert!(is_v03("0.3") && is_v03("0.3.0") && !is_v03("0.30") && !is_v03("1.0"));
    }
}
