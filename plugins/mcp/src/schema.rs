//! Tool input schemas: what `define` accepts as a macro's `input_schema`,
//! and the check of a call's arguments against a tool's schema.
//!
//! A schema is listed to every agent (`tools/list`, `GET /api/mcp`) as a
//! promise of what the tool accepts, so `define` takes only the JSON
//! Schema keywords [`check_arguments`] enforces, plus annotations; any
//! other keyword (`pattern`, `format`, `anyOf`, a nested object's
//! `properties`) is refused naming it, rather than listed and ignored.

use marketplace_guest::prelude::*;
use marketplace_guest::{Body, Detail};

/// A macro's input schema at most, as compact JSON: every listing carries
/// every macro's schema.
pub const MAX_INPUT_SCHEMA: usize = 8 * 1024;

/// The `type` a property may have.
const TYPES: &[&str] = &["string", "number", "integer", "boolean", "object", "array"];

/// Keywords that only describe (never checked, always accepted).
const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "default",
    "examples",
    "deprecated",
    "readOnly",
    "writeOnly",
    "$comment",
];

/// The keywords of [`PROPERTY_KEYWORDS`] that apply to arrays only: on a
/// property of another type they would check nothing, so they are refused.
const ARRAY_KEYWORDS: [&str; 3] = ["items", "minItems", "maxItems"];

/// The keywords of a property that arguments are checked against.
const PROPERTY_KEYWORDS: &[&str] = &[
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "items",
];

/// The keywords of the schema itself.
const SCHEMA_KEYWORDS: &[&str] = &[
    "type",
    "properties",
    "required",
    "additionalProperties",
    "$schema",
];

/// The OpenAPI schema of a macro's `input_schema` as `define` takes it:
/// the keywords above, each with the JSON type it must have, annotations,
/// and nothing else (one list for both, so the document and the check
/// cannot part).
pub fn openapi() -> Value {
    let types = json!({"enum": TYPES});
    let count = json!({"type": "integer", "minimum": 0, "maximum": u64::MAX});
    let annotated = |keywords: &mut dyn Iterator<Item = (&str, Value)>, required: &[&str]| {
        let mut props: serde_json::Map<String, Value> = ANNOTATIONS
            .iter()
            .map(|k| (k.to_string(), json!({})))
            .collect();
        props.extend(keywords.map(|(k, v)| (k.to_string(), v)));
        json!({"type": "object", "properties": props, "required": required, "additionalProperties": false})
    };
    let item = annotated(&mut std::iter::once(("type", types.clone())), &["type"]);
    let mut property = annotated(
        &mut PROPERTY_KEYWORDS.iter().map(|&k| {
            let v = match k {
                "type" => types.clone(),
                "enum" => json!({"type": "array", "minItems": 1, "items": {}}),
                "const" => json!({}),
                "multipleOf" => json!({"type": "number", "exclusiveMinimum": 0}),
                "minLength" | "maxLength" | "minItems" | "maxItems" => count.clone(),
                "items" => item.clone(),
                // The bounds.
                _ => json!({"type": "number"}),
            };
            (k, v)
        }),
        &["type"],
    );
    // As `property_problems` refuses them elsewhere.
    property["if"] = json!({"properties": {"type": {"const": "array"}}, "required": ["type"]});
    property["else"] = json!({"properties": ARRAY_KEYWORDS.map(|k| (k.to_string(), Value::Bool(false))).into_iter().collect::<serde_json::Map<_, _>>()});
    let mut schema = annotated(
        &mut SCHEMA_KEYWORDS.iter().map(|&k| {
            let v = match k {
                "type" => json!({"const": "object"}),
                "properties" => json!({"type": "object", "additionalProperties": property}),
                "required" => json!({"type": "array", "items": {"type": "string"}}),
                "additionalProperties" => json!({"type": "boolean"}),
                // `$schema`.
                _ => json!({"type": "string"}),
            };
            (k, v)
        }),
        &["type", "properties"],
    );
    schema["description"] = json!(format!(
        "JSON Schema of the macro's arguments, with only the keywords they are checked against (any other keyword is 400, naming it; items, minItems and maxItems only on a property of type array); at most {} KiB as JSON",
        MAX_INPUT_SCHEMA / 1024
    ));
    schema
}

/// The members of an input schema that MCP's `Tool.inputSchema` types and
/// this one does not fit, each with what it must be: `required` a list of
/// names, `$schema` a URI string. A listing carries every macro's schema,
/// so one that a client's SDK cannot read would break every client's
/// listing: `define` refuses them, and the listing leaves them out.
fn misshapen(schema: &Value) -> Vec<(&'static str, &'static str)> {
    let mut out = Vec::new();
    if schema
        .get("required")
        .is_some_and(|r| !r.as_array().is_some_and(|r| r.iter().all(Value::is_string)))
    {
        out.push(("required", "must be an array of property names (strings)"));
    }
    if schema.get("$schema").is_some_and(|s| !s.is_string()) {
        out.push(("$schema", "must be a string (a URI)"));
    }
    out
}

/// A stored macro's input schema in the shape MCP's `Tool.inputSchema`
/// requires: macros defined before `define` checked [`misshapen`] members
/// are listed without them.
pub fn listed(mut schema: Value) -> Value {
    let drop = misshapen(&schema);
    if let Value::Object(map) = &mut schema {
        for (member, _) in drop {
            map.remove(member);
        }
        map.insert("type".into(), json!("object"));
        return schema;
    }
    json!({"type": "object"})
}

/// What `define` says of a macro's `input_schema` (each problem into
/// `body`, naming the member).
pub fn check_definition(schema: Option<&Value>, body: &mut Body) {
    let Some(schema) = schema else {
        body.problem("input_schema", "is required");
        return;
    };
    if schema.to_string().len() > MAX_INPUT_SCHEMA {
        body.problem(
            "input_schema",
            format!("must be at most {MAX_INPUT_SCHEMA} bytes as JSON"),
        );
        return;
    }
    if schema["type"] != "object" || !schema["properties"].is_object() {
        body.problem(
            "input_schema",
            "must be {\"type\": \"object\", \"properties\": {...}}",
        );
        return;
    }
    for (member, problem) in misshapen(schema) {
        body.problem(&format!("input_schema.{member}"), problem);
    }
    for key in schema.as_object().into_iter().flat_map(|m| m.keys()) {
        if !SCHEMA_KEYWORDS.contains(&key.as_str()) && !ANNOTATIONS.contains(&key.as_str()) {
            body.problem(&format!("input_schema.{key}"), unchecked(SCHEMA_KEYWORDS));
        }
    }
    if schema
        .get("additionalProperties")
        .is_some_and(|a| !a.is_boolean())
    {
        body.problem("input_schema.additionalProperties", "must be true or false");
    }
    for (name, prop) in schema["properties"].as_object().into_iter().flatten() {
        for (field, problem) in property_problems(prop) {
            let at = match field {
                "" => format!("input_schema.properties.{name}"),
                k => format!("input_schema.properties.{name}.{k}"),
            };
            body.problem(&at, problem);
        }
    }
}

/// What a keyword outside `checked` is told.
fn unchecked(checked: &[&str]) -> String {
    format!(
        "is not a keyword arguments are checked against; use {} (or annotations: {})",
        checked.join(", "),
        ANNOTATIONS.join(", ")
    )
}

/// The problems of one property's schema: (its keyword, or "" for the
/// property itself; what is wrong).
fn property_problems(prop: &Value) -> Vec<(&str, String)> {
    let mut out = Vec::new();
    let Some(map) = prop.as_object() else {
        return vec![("", "must be an object".into())];
    };
    let ty = prop["type"].as_str().filter(|t| TYPES.contains(t));
    if ty.is_none() {
        out.push(("", format!("needs a type, one of {}", TYPES.join(", "))));
    }
    for (key, value) in map {
        let key = key.as_str();
        if ANNOTATIONS.contains(&key) {
            continue;
        }
        let Some(&known) = PROPERTY_KEYWORDS.iter().find(|k| **k == key) else {
            out.push((key, unchecked(PROPERTY_KEYWORDS)));
            continue;
        };
        let problem = match known {
            "enum" if value.as_array().is_none_or(|a| a.is_empty()) => {
                Some("must be a non-empty array".to_string())
            }
            "minimum" | "maximum" | "exclusiveMinimum" | "exclusiveMaximum"
                if !value.is_number() =>
            {
                Some("must be a number".into())
            }
            "multipleOf" if !value.as_f64().is_some_and(|m| m > 0.0) => {
                Some("must be a number above 0".into())
            }
            "minLength" | "maxLength" | "minItems" | "maxItems" if count(value).is_none() => {
                Some("must be a non-negative integer below 2^64".into())
            }
            "items" => {
                let item_type = value["type"].as_str().filter(|t| TYPES.contains(t));
                let other = value.as_object().and_then(|m| {
                    m.keys()
                        .find(|k| *k != "type" && !ANNOTATIONS.contains(&k.as_str()))
                });
                match (value.is_object(), item_type, other) {
                    (true, Some(_), None) => None,
                    (true, Some(_), Some(k)) => Some(format!(
                        "checks only its items' type: {k:?} is not a keyword arguments are checked against"
                    )),
                    _ => Some(format!(
                        "must be {{\"type\": T}}, T one of {}",
                        TYPES.join(", ")
                    )),
                }
            }
            _ => None,
        };
        out.extend(problem.map(|p| (known, p)));
    }
    if ty != Some("array") {
        for k in ARRAY_KEYWORDS {
            if map.contains_key(k) {
                out.push((
                    k,
                    "applies to arrays only: the type is not \"array\"".into(),
                ));
            }
        }
    }
    out
}

/// Whether `v` is of the JSON Schema type `ty` (an unknown type admits all).
fn of_type(v: &Value, ty: &str) -> bool {
    match ty {
        "string" => v.is_string(),
        "number" => v.is_number(),
        "integer" => v.as_f64().is_some_and(|f| f.fract() == 0.0),
        "boolean" => v.is_boolean(),
        "object" => v.is_object(),
        "array" => v.is_array(),
        _ => true,
    }
}

/// JSON Schema's equality: numbers by value (`1.0` is `1`), the rest as
/// JSON.
fn same(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

/// The value of a count keyword (`minLength`, `maxItems`, ...): a
/// non-negative integer below 2^64, written as JSON Schema counts integers
/// (`3`, but also `3.0` or `3e0`).
fn count(v: &Value) -> Option<u64> {
    v.as_number().and_then(marketplace_guest::whole_u64)
}

/// What a count `n` (characters, items) breaks of the `min` and `max`
/// keywords of `prop`: "must {verb} at least {min} {unit}" and the like.
fn count_problems(
    prop: &Value,
    n: u64,
    (min, max): (&str, &str),
    verb: &str,
    unit: &str,
) -> impl Iterator<Item = String> {
    let under = count(&prop[min]).filter(|&m| n < m);
    let over = count(&prop[max]).filter(|&m| n > m);
    (under
        .map(|m| format!("must {verb} at least {m} {unit}"))
        .into_iter())
    .chain(over.map(|m| format!("must {verb} at most {m} {unit}")))
}

/// `args` without its members that are null: such an argument is absent,
/// as a request body's member sent as null is (a required one is then
/// missing). Anything but an object is left for [`check_arguments`] to
/// refuse.
pub fn nulls_absent(args: &Value) -> std::borrow::Cow<'_, Value> {
    match args.as_object() {
        Some(map) if map.values().any(Value::is_null) => std::borrow::Cow::Owned(Value::Object(
            map.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )),
        _ => std::borrow::Cow::Borrowed(args),
    }
}

/// Validate arguments against a tool's input schema (400 with details):
/// each property's `type`, `enum`, `const`, `minimum`/`maximum` and their
/// exclusive forms, `multipleOf`, `minLength`/`maxLength` (in characters),
/// `minItems`/`maxItems` and `items`' type, then `required` and
/// `additionalProperties: false`.
pub fn check_arguments(schema: &Value, args: &Value) -> Result<(), ApiError> {
    let mut problems = Vec::new();
    let Some(map) = args.as_object() else {
        return Err(ApiError::invalid("arguments", "must be an object"));
    };
    let mut problem = |field: &str, text: String| {
        problems.push(Detail {
            field: format!("arguments.{field}"),
            problem: text,
        })
    };
    let properties = schema["properties"].as_object();
    for (name, v) in map {
        let Some(prop) = properties.and_then(|p| p.get(name)) else {
            if schema["additionalProperties"] == false {
                problem(name, "is not a parameter of this tool".into());
            }
            continue;
        };
        let ty = prop["type"].as_str().unwrap_or("");
        if !of_type(v, ty) {
            problem(name, format!("must be of type {}", prop["type"]));
            continue;
        }
        if let Some(allowed) = prop["enum"].as_array()
            && !allowed.iter().any(|a| same(a, v))
        {
            problem(name, format!("must be one of {}", prop["enum"]));
        }
        if let Some(c) = prop.get("const")
            && !same(c, v)
        {
            problem(name, format!("must be {c}"));
        }
        if let Some(n) = v.as_f64() {
            let bound = |k: &str| prop[k].as_f64();
            if bound("minimum").is_some_and(|m| n < m) {
                problem(name, format!("must be at least {}", prop["minimum"]));
            }
            if bound("maximum").is_some_and(|m| n > m) {
                problem(name, format!("must be at most {}", prop["maximum"]));
            }
            if bound("exclusiveMinimum").is_some_and(|m| n <= m) {
                problem(name, format!("must be above {}", prop["exclusiveMinimum"]));
            }
            if bound("exclusiveMaximum").is_some_and(|m| n >= m) {
                problem(name, format!("must be below {}", prop["exclusiveMaximum"]));
            }
            if let Some(m) = bound("multipleOf").filter(|m| *m > 0.0) {
                let q = n / m;
                if (q - q.round()).abs() > 1e-9 * q.abs().max(1.0) {
                    problem(
                        name,
                        format!("must be a multiple of {}", prop["multipleOf"]),
                    );
                }
            }
        }
        if let Some(text) = v.as_str() {
            let chars = text.chars().count() as u64;
            for p in count_problems(prop, chars, ("minLength", "maxLength"), "be", "characters") {
                problem(name, p);
            }
        }
        if let Some(items) = v.as_array() {
            let n = items.len() as u64;
            for p in count_problems(prop, n, ("minItems", "maxItems"), "have", "items") {
                problem(name, p);
            }
            if let Some(item_type) = prop["items"]["type"].as_str()
                && let Some(i) = items.iter().position(|x| !of_type(x, item_type))
            {
                problem(
                    &format!("{name}[{i}]"),
                    format!("must be of type {}", prop["items"]["type"]),
                );
            }
        }
    }
    for req in schema["required"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str())
    {
        if !map.contains_key(req) {
            problem(req, "is required".into());
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_many(problems))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_argument_is_absent() {
        let schema = json!({"type": "object", "properties": {
            "limit": {"type": "integer"}, "term": {"type": "string"}}, "required": ["term"]});
        let sent = json!({"term": "x", "limit": null});
        assert_eq!(*nulls_absent(&sent), json!({"term": "x"}));
        assert!(check_arguments(&schema, &nulls_absent(&sent)).is_ok());
        // As sent, null is no integer.
        assert!(check_arguments(&schema, &sent).is_err());
        // A required one sent as null is missing.
        let missing = check_arguments(&schema, &nulls_absent(&json!({"term": null}))).unwrap_err();
        assert!(
            format!("{missing:?}").contains("is required"),
            "{missing:?}"
        );
        // Not an object: left as it is, for the check to refuse.
        assert_eq!(*nulls_absent(&json!([null])), json!([null]));
    }

    #[test]
    fn a_listed_schema_has_the_shape_mcp_requires() {
        let stored = json!({"type": "object", "properties": {"a": {"type": "string"}},
                            "required": "a", "$schema": 5});
        assert_eq!(
            listed(stored),
            json!({"type": "object", "properties": {"a": {"type": "string"}}})
        );
        let fine = json!({"type": "object", "properties": {}, "required": ["a"],
                          "$schema": "https://json-schema.org/draft/2020-12/schema"});
        assert_eq!(listed(fine.clone()), fine);
        assert_eq!(listed(json!(null)), json!({"type": "object"}));
    }

    fn schema(prop: Value) -> Value {
        json!({"type": "object", "properties": {"p": prop}})
    }

    fn fails(prop: Value, arg: Value) -> bool {
        check_arguments(&schema(prop), &json!({"p": arg})).is_err()
    }

    #[test]
    fn every_keyword_a_definition_may_use_is_enforced() {
        let e = json!({"type": "string", "enum": ["walnut", "oak"]});
        assert!(!fails(e.clone(), json!("oak")) && fails(e, json!("pine")));
        let c = json!({"type": "integer", "const": 3});
        assert!(!fails(c.clone(), json!(3)) && fails(c.clone(), json!(4)));
        // A whole float is that integer.
        assert!(!fails(c, json!(3.0)));
        assert!(!fails(
            json!({"type": "integer", "enum": [1, 2]}),
            json!(2.0)
        ));
        let x = json!({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 10});
        assert!(!fails(x.clone(), json!(5)));
        assert!(fails(x.clone(), json!(0)) && fails(x, json!(10)));
        let m = json!({"type": "number", "multipleOf": 0.5});
        assert!(!fails(m.clone(), json!(2.5)) && fails(m, json!(2.25)));
        let a = json!({"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string"}});
        assert!(!fails(a.clone(), json!(["a"])));
        assert!(fails(a.clone(), json!([])) && fails(a.clone(), json!(["a", "b", "c"])));
        assert!(fails(a, json!(["a", 1])));
        let s = json!({"type": "string", "minLength": 2, "maxLength": 3});
        assert!(fails(s.clone(), json!("é")) && !fails(s.clone(), json!("éé")));
        assert!(fails(s, json!("abcd")));
        let n = json!({"type": "integer", "minimum": 1, "maximum": 2});
        assert!(fails(n.clone(), json!(0)) && fails(n.clone(), json!(1.5)));
        assert!(!fails(n, json!(2)));
    }

    #[test]
    fn a_keyword_that_would_not_be_enforced_is_refused() {
        let problems = |prop: Value| -> Vec<String> {
            property_problems(&prop)
                .into_iter()
                .map(|(k, _)| k.to_string())
                .collect()
        };
        assert!(problems(json!({"type": "string", "description": "d", "enum": ["a"]})).is_empty());
        assert_eq!(
            problems(json!({"type": "string", "pattern": "^a"})),
            ["pattern"]
        );
        assert_eq!(
            problems(json!({"type": "string", "format": "email"})),
            ["format"]
        );
        assert_eq!(
            problems(json!({"type": "object", "properties": {}, "required": ["x"]})),
            ["properties", "required"]
        );
        assert_eq!(
            problems(json!({"type": "array", "items": {"type": "string", "pattern": "x"}})),
            ["items"]
        );
        assert_eq!(
            problems(json!({"type": "array", "items": {"type": "nope"}})),
            ["items"]
        );
        assert_eq!(
            problems(json!({"type": "string", "minItems": 1})),
            ["minItems"]
        );
        assert_eq!(problems(json!({"type": "string", "enum": []})), ["enum"]);
        assert_eq!(
            problems(json!({"type": "number", "multipleOf": 0})),
            ["multipleOf"]
        );
        assert_eq!(problems(json!({"enum": ["a"]})), [""]);
        // A count is an integer as JSON Schema counts them (a whole float
        // too), below 2^64.
        let counted: Value =
            serde_json::from_str(r#"{"type": "array", "minItems": 1.0, "maxItems": 2e0}"#).unwrap();
        assert!(problems(counted).is_empty());
        for bad in ["-1", "1.5", "18446744073709551616", "\"1\""] {
            let prop: Value =
                serde_json::from_str(&format!(r#"{{"type": "string", "minLength": {bad}}}"#))
                    .unwrap();
            assert_eq!(problems(prop), ["minLength"], "{bad}");
        }
        let largest: Value =
            serde_json::from_str(r#"{"type": "string", "maxLength": 18446744073709551615}"#)
                .unwrap();
        assert!(problems(largest).is_empty());
    }

    #[test]
    fn a_count_written_as_a_whole_float_is_enforced() {
        let a: Value = serde_json::from_str(
            r#"{"type": "array", "minItems": 1.0, "maxItems": 2e0, "items": {"type": "string"}}"#,
        )
        .unwrap();
        assert!(!fails(a.clone(), json!(["a"])));
        assert!(fails(a.clone(), json!([])) && fails(a, json!(["a", "b", "c"])));
    }
}
