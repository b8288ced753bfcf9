//! `POST /api/graphql`: the one query the original client sends
//! (`{ arbiterPubkey }`).

use marketplace_guest::arbiter;
use marketplace_guest::prelude::*;

/// The longest GraphQL query, in characters (the document's `maxLength`).
const MAX_GRAPHQL_QUERY: usize = 10_000;

/// `POST /api/graphql`: the one query the original client sends,
/// `{ arbiterPubkey }`; anything else is a GraphQL error (never a 404).
pub(crate) fn graphql(req: &Request) -> Result<Response, ApiError> {
    let errors = |message: &str| json(200, &json!({"errors": [{"message": message}]}));
    // Both a protocol error and a GraphQL one, for either kind of client.
    let refused = |message: &str, field: &str, problem: &str| {
        json(
            400,
            &json!({"code": "invalid_request", "message": message, "errors": [{"message": message}],
                    "details": [{"field": field, "problem": problem}]}),
        )
    };
    let sent = match serde_json::from_slice::<Value>(req.body()) {
        Ok(v) => Some(v),
        Err(e) => {
            return Ok(refused(
                "the body must be JSON with a `query` string",
                "body",
                &format!("invalid JSON: {e}"),
            ));
        }
    };
    let Some(query) = sent
        .as_ref()
        .and_then(|v| v.get("query"))
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Ok(refused(
            "the body must be JSON with a `query` string",
            "query",
            "must be a string in a JSON object body",
        ));
    };
    // GraphQL over HTTP: `variables` is a map and `operationName` a name,
    // when given (the one query here takes neither, but a malformed
    // request is refused, not answered).
    for (field, fits, kind) in [
        (
            "variables",
            Value::is_object as fn(&Value) -> bool,
            "an object or null",
        ),
        ("operationName", Value::is_string, "a string or null"),
    ] {
        if let Some(v) = sent.as_ref().and_then(|b| b.get(field))
            && !v.is_null()
            && !fits(v)
        {
            return Ok(refused(
                &format!("`{field}` must be {kind}"),
                field,
                &format!("must be {kind}"),
            ));
        }
    }
    // The document's `maxLength`, in characters as JSON Schema counts.
    if query.chars().count() > MAX_GRAPHQL_QUERY {
        let most = format!("at most {MAX_GRAPHQL_QUERY} characters");
        return Ok(refused(
            &format!("the query is too long: {most}"),
            "query",
            &most,
        ));
    }
    // Selection of the one root field, with an optional `query [Name]`.
    let body = query.trim();
    let (name, body) = match body.strip_prefix("query") {
        Some(rest) => {
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (Some(&rest[..end]).filter(|n| !n.is_empty()), &rest[end..])
        }
        None => (None, body),
    };
    let body = body.trim();
    // `operationName` picks an operation of the document: here its one,
    // by its name (an anonymous one has none to pick it by).
    if let Some(asked) = sent
        .as_ref()
        .and_then(|b| b.get("operationName"))
        .and_then(Value::as_str)
        && name != Some(asked)
    {
        return Ok(errors(&format!("Unknown operation named \"{asked}\"")));
    }
    let field = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .map(str::trim);
    match field {
        Some("arbiterPubkey") => Ok(json(
            200,
            &json!({"data": {"arbiterPubkey": arbiter::public_key()}}),
        )),
        Some(other) => Ok(errors(&format!(
            "Cannot query field \"{other}\" on type \"Query\"; this service answers {{ arbiterPubkey }}"
        ))),
        None => Ok(errors(
            "Syntax Error: expected a selection set like { arbiterPubkey }",
        )),
    }
}
