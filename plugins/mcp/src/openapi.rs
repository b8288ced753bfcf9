//! The OpenAPI 3.1 document the host assembles (its own routes and every
//! loaded family's `api`), and what is derived from it: the YAML form, the
//! docs page and docs search.

use marketplace_guest::host;
use marketplace_guest::prelude::*;

/// The service's OpenAPI document, as the host assembled it.
///
/// Parsed once per instance (a request): the first listing after a load
/// renders each tool's schemas from it, and each parse of about 100 KB
/// costs a millisecond or more.
pub fn document() -> Result<std::rc::Rc<Value>, ApiError> {
    thread_local! {
        static PARSED: std::cell::OnceCell<std::rc::Rc<Value>> = const { std::cell::OnceCell::new() };
    }
    if let Some(document) = PARSED.with(|p| p.get().cloned()) {
        return Ok(document);
    }
    let document = serde_json::from_str::<Value>(&document_text()?).map_err(|e| {
        ApiError::internal(format!("the host's OpenAPI document does not parse: {e}"))
    })?;
    Ok(PARSED.with(|p| p.get_or_init(|| std::rc::Rc::new(document)).clone()))
}

/// The service's OpenAPI document as the host's JSON text, passed on as
/// it is: the host writes it compact from a parsed document, so it is
/// byte for byte what parsing and writing it again would give, without
/// the millisecond that costs for about 100 KB. An object, or an error.
pub fn document_text() -> Result<String, ApiError> {
    let text = host::openapi();
    if text.trim_start().starts_with('{') {
        Ok(text)
    } else {
        Err(ApiError::internal(
            "the host's OpenAPI document is not an object",
        ))
    }
}

/// Methods in the order the docs list them.
const METHODS: &[&str] = &["get", "post", "put", "patch", "delete", "options"];

/// One documented operation.
struct Operation<'a> {
    /// Upper-case method.
    method: String,
    path: &'a str,
    op: &'a Value,
}

impl Operation<'_> {
    fn text(&self, member: &str) -> &str {
        self.op[member].as_str().unwrap_or("")
    }

    /// The operationId, or one made from method and path.
    fn id(&self) -> String {
        match self.op["operationId"].as_str() {
            Some(id) if !id.is_empty() => id.to_string(),
            _ => format!("{} {}", self.method, self.path)
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
                .collect(),
        }
    }
}

/// Every operation of the document: paths in document order, methods in
/// [`METHODS`] order.
fn operations(doc: &Value) -> Vec<Operation<'_>> {
    let mut out = Vec::new();
    for (path, item) in doc["paths"].as_object().into_iter().flatten() {
        for m in METHODS {
            if let Some(op) = item.get(*m).filter(|op| op.is_object()) {
                out.push(Operation {
                    method: m.to_ascii_uppercase(),
                    path,
                    op,
                });
            }
        }
    }
    out
}

/// Emit a JSON value as block-style YAML with libyaml's emitter: every
/// string (keys too) double-quoted, so no YAML 1.1 or 1.2 reader takes one
/// for a number, boolean, null or date; numbers, booleans and null plain.
pub fn to_yaml(v: &Value) -> String {
    let mut out = Vec::new();
    match emit_yaml(v, &mut out).map(|()| String::from_utf8(out)) {
        Ok(Ok(text)) => text,
        // Not reached (the events are well formed and the output is a
        // buffer); JSON is YAML too.
        _ => serde_json::to_string_pretty(v).unwrap_or_default(),
    }
}

fn emit_yaml(v: &Value, out: &mut Vec<u8>) -> Result<(), libyaml_safer::Error> {
    use libyaml_safer::{Emitter, Encoding, Event, MappingStyle, ScalarStyle, SequenceStyle};

    fn scalar(text: &str, style: ScalarStyle) -> Event {
        Event::scalar(None, None, text, true, true, style)
    }
    fn node(e: &mut Emitter, v: &Value) -> Result<(), libyaml_safer::Error> {
        match v {
            Value::Null => e.emit(scalar("null", ScalarStyle::Plain)),
            Value::Bool(b) => e.emit(scalar(
                if *b { "true" } else { "false" },
                ScalarStyle::Plain,
            )),
            Value::Number(n) => e.emit(scalar(&number(n), ScalarStyle::Plain)),
            Value::String(s) => e.emit(scalar(s, ScalarStyle::DoubleQuoted)),
            Value::Array(items) => {
                e.emit(Event::sequence_start(
                    None,
                    None,
                    true,
                    SequenceStyle::Block,
                ))?;
                for item in items {
                    node(e, item)?;
                }
                e.emit(Event::sequence_end())
            }
            Value::Object(members) => {
                e.emit(Event::mapping_start(None, None, true, MappingStyle::Block))?;
                for (k, val) in members {
                    e.emit(scalar(k, ScalarStyle::DoubleQuoted))?;
                    node(e, val)?;
                }
                e.emit(Event::mapping_end())
            }
        }
    }

    let mut e = Emitter::new();
    e.set_output_string(out);
    e.set_unicode(true);
    // No folding of long strings.
    e.set_width(-1);
    e.emit(Event::stream_start(Encoding::Utf8))?;
    e.emit(Event::document_start(None, &[], true))?;
    node(&mut e, v)?;
    e.emit(Event::document_end(true))?;
    e.emit(Event::stream_end())?;
    e.flush()
}

/// A JSON number as a YAML scalar both YAML 1.1 and 1.2 readers resolve
/// to the same number: a float keeps a `.` and a signed exponent (`1e20`
/// is a string to YAML 1.1).
fn number(n: &serde_json::Number) -> String {
    let text = n.to_string();
    if !n.is_f64() {
        return text;
    }
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, x)) => (m, Some(x)),
        None => (text.as_str(), None),
    };
    let mut out = mantissa.to_string();
    if !out.contains('.') {
        out.push_str(".0");
    }
    if let Some(x) = exponent {
        out.push('e');
        if !x.starts_with(['+', '-']) {
            out.push('+');
        }
        out.push_str(x);
    }
    out
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The self-contained HTML reference.
pub fn html(doc: &Value) -> String {
    let mut body = String::new();
    let mut nav = String::new();
    for o in operations(doc) {
        let id = esc(&o.id());
        nav.push_str(&format!(
            "<li><a href=\"#{id}\"><code>{} {}</code></a></li>",
            o.method,
            esc(o.path)
        ));
        let op = o.op;
        let body_schema = op["requestBody"]["content"]["application/json"]["schema"]["$ref"]
            .as_str()
            .map(|r| r.trim_start_matches("#/components/schemas/"));
        let params: Vec<String> = op["parameters"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|p| {
                format!(
                    "<li><code>{}</code> ({}{}) {}</li>",
                    esc(p["name"].as_str().unwrap_or("")),
                    p["in"].as_str().unwrap_or(""),
                    if p["required"] == true {
                        ", required"
                    } else {
                        ""
                    },
                    esc(p["description"].as_str().unwrap_or(""))
                )
            })
            .collect();
        let responses: Vec<String> = op["responses"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(code, r)| {
                format!(
                    "<li><code>{code}</code> {}</li>",
                    esc(r["description"].as_str().unwrap_or(""))
                )
            })
            .collect();
        body.push_str(&format!(
            "<section id=\"{}\"><h2><span class=\"m {}\">{}</span> <code>{}</code></h2><p><b>{}</b></p><p>{}</p>{}{}<h4>Responses</h4><ul>{}</ul></section>",
            id, o.method.to_ascii_lowercase(), o.method, esc(o.path), esc(o.text("summary")), esc(o.text("description")),
            if params.is_empty() { String::new() } else { format!("<h4>Parameters</h4><ul>{}</ul>", params.join("")) },
            body_schema.map(|b| format!("<h4>Request body</h4><p>JSON <code>{}</code> (see <a href=\"/openapi.yaml\">openapi.yaml</a>)</p>", esc(b))).unwrap_or_default(),
            responses.join("")
        ));
    }
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>Marketplace API reference</title><style>\
body{{font-family:system-ui,sans-serif;margin:0;display:flex;color:#222}}nav{{width:330px;height:100vh;overflow:auto;position:sticky;top:0;background:#f5f5f7;padding:1em;box-sizing:border-box}}\
nav ul{{list-style:none;padding:0}}nav li{{margin:.2em 0}}main{{padding:1em 2em;max-width:900px}}section{{border-bottom:1px solid #ddd;padding:1em 0}}\
.m{{font-size:.8em;padding:.1em .5em;border-radius:4px;color:#fff}}.get{{background:#2b7}}.post{{background:#27c}}.put,.patch{{background:#c80}}.delete{{background:#c33}}code{{font-size:.95em}}</style></head>\
<body><nav><h3>Marketplace API</h3><p>v{}</p><p><a href=\"/openapi.yaml\">openapi.yaml</a></p><ul>{nav}</ul></nav><main><h1>Marketplace API reference</h1>\
<p>{}</p><p>Errors are JSON <code>{{\"code\", \"message\"}}</code>; clients branch on <code>code</code>. Paid routes answer 402 until <code>X-Cash-Secret</code> carries a secret covering the fee (<a href=\"/api/fees\">/api/fees</a>).</p>{body}</main></body></html>",
        esc(doc["info"]["version"].as_str().unwrap_or("")),
        esc(doc["info"]["description"].as_str().unwrap_or(""))
    )
}

/// What docs search reads of each operation, in the document's order:
/// a line each, `{words of the path and summary}\t{words of the
/// description, tags and fee}\t{the result}` (each list of words
/// space-separated between spaces, the result the JSON object `{title,
/// path, snippet}` a hit is answered). Kept in the family's memo as it
/// is, so a search parses no JSON: it looks its words up in each line and
/// copies the lines it answers. (Words hold neither spaces, tabs nor
/// newlines; compact JSON holds no tab or newline.)
pub fn search_index(doc: &Value) -> String {
    // Each word once, sorted (so an index reads the same for the same
    // document).
    let words = |text: String| {
        let mut words = marketplace_common::text::tokens(&text);
        words.sort_unstable();
        words.dedup();
        format!(" {} ", words.join(" "))
    };
    let mut index = String::new();
    for o in operations(doc) {
        let tags: Vec<&str> = o.op["tags"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        let result = object([
            (
                "title",
                format!("{} {} - {}", o.method, o.path, o.text("summary")).into(),
            ),
            ("path", format!("/docs#{}", o.id()).into()),
            ("snippet", o.text("description").into()),
        ]);
        index.push_str(&words(format!("{} {}", o.path, o.text("summary"))));
        index.push('\t');
        index.push_str(&words(format!(
            "{} {} {}",
            o.text("description"),
            tags.join(" "),
            o.text("x-paid")
        )));
        index.push('\t');
        index.push_str(&result.to_string());
        index.push('\n');
    }
    index
}

/// Docs search over a [`search_index`], as the JSON text answered: the
/// operations ranked by query words found, a word in the path or summary
/// counting three times one in the description, tags or fee (in the
/// document's order where they score alike).
pub fn search(index: &str, q: &str, limit: usize) -> String {
    let words: Vec<String> = marketplace_common::text::tokens(q)
        .into_iter()
        .map(|w| format!(" {w} "))
        .collect();
    let mut hits: Vec<(usize, &str)> = index
        .lines()
        .filter_map(|line| {
            let mut fields = line.splitn(3, '\t');
            let (head, body, result) = (fields.next()?, fields.next()?, fields.next()?);
            let score = words
                .iter()
                .map(|w| {
                    3 * usize::from(head.contains(w.as_str()))
                        + usize::from(body.contains(w.as_str()))
                })
                .sum();
            Some((score, result))
        })
        .filter(|(n, _)| *n > 0)
        .collect();
    hits.sort_by_key(|h| std::cmp::Reverse(h.0));
    let results: Vec<&str> = hits.into_iter().take(limit).map(|(_, r)| r).collect();
    format!("{{\"results\":[{}]}}", results.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use marketplace_guest::openapi::operation;

    /// A document as the host assembles it, from this family's operations
    /// and one paid operation of another family.
    fn doc() -> Value {
        let mut paths = serde_json::Map::new();
        for o in crate::api::OPS {
            let item = paths.entry(o.path.to_string()).or_insert_with(|| json!({}));
            item[o.method.to_ascii_lowercase()] = operation(o);
        }
        paths.insert(
            "/api/things/{id}/refund".into(),
            json!({"post": {"operationId": "refundThing", "tags": ["things"], "summary": "Give back",
                            "description": "Returns the money.", "x-paid": "refund", "x-family": "things",
                            "requestBody": {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Thing"}}}},
                            "responses": {"200": {"description": "success"}}}}),
        );
        json!({"openapi": "3.1.0", "info": {"version": "1.2.3", "description": "About <it>."}, "paths": paths})
    }

    #[test]
    fn yaml_quotes_every_string_and_keeps_the_structure() {
        let v = json!({"openapi": "3.1.0", "paths": {"/a/{id}": {"get": {"tags": ["x", "y"],
            "responses": {"200": {"description": "ok"}}}}}, "n": [1, -2.5, true, null], "e": {}, "l": []});
        assert_eq!(
            to_yaml(&v),
            "\"e\": {}\n\"l\": []\n\"n\":\n- 1\n- -2.5\n- true\n- null\n\"openapi\": \"3.1.0\"\n\
             \"paths\":\n  \"/a/{id}\":\n    \"get\":\n      \"responses\":\n        \"200\":\n          \
             \"description\": \"ok\"\n      \"tags\":\n      - \"x\"\n      - \"y\"\n"
        );
    }

    /// Read the emitted YAML back with libyaml's parser, resolving plain
    /// scalars as the JSON schema does.
    fn load_yaml(text: &str) -> Value {
        use libyaml_safer::{EventData, Parser, ScalarStyle};
        type Events = std::iter::Peekable<std::vec::IntoIter<EventData>>;
        fn node(events: &mut Events) -> Value {
            match events.next().unwrap() {
                EventData::Scalar { value, style, .. } if style != ScalarStyle::Plain => {
                    Value::String(value)
                }
                EventData::Scalar { value, .. } => serde_json::from_str(&value)
                    .unwrap_or_else(|e| panic!("plain scalar {value:?}: {e}")),
                EventData::SequenceStart { .. } => {
                    let mut items = Vec::new();
                    while events.next_if_eq(&EventData::SequenceEnd).is_none() {
                        items.push(node(events));
                    }
                    Value::Array(items)
                }
                EventData::MappingStart { .. } => {
                    let mut members = serde_json::Map::new();
                    while events.next_if_eq(&EventData::MappingEnd).is_none() {
                        let Value::String(k) = node(events) else {
                            panic!("a key that is not a string")
                        };
                        members.insert(k, node(events));
                    }
                    Value::Object(members)
                }
                e => panic!("unexpected {e:?}"),
            }
        }
        let mut input = text.as_bytes();
        let mut parser = Parser::new();
        parser.set_input_string(&mut input);
        let mut events = Vec::new();
        loop {
            let e = parser.parse().unwrap().data;
            let end = e == EventData::StreamEnd;
            events.push(e);
            if end {
                break;
            }
        }
        let mut events = events.into_iter().peekable();
        assert!(matches!(events.next(), Some(EventData::StreamStart { .. })));
        assert!(matches!(
            events.next(),
            Some(EventData::DocumentStart { .. })
        ));
        let v = node(&mut events);
        assert!(matches!(events.next(), Some(EventData::DocumentEnd { .. })));
        assert_eq!(events.next(), Some(EventData::StreamEnd));
        v
    }

    #[test]
    fn yaml_reads_back_as_the_same_data() {
        let long = "word ".repeat(100);
        let v = json!({
            "tricky": ["yes", "no", "on", "~", "null", "true", "2026-01-01", "1e3", "0x1F", "1_000",
                       "", " lead", "trail ", "tab\there", "line\nbreak\n", "quote\"back\\slash",
                       "unicode é ✓ 😀", "\u{7f}\u{85}\u{a0}\u{feff}\u{2028}\u{0}", "- dash", "# hash",
                       "key: value", "{x}", "[y]", "*ref", "&anchor", "!tag", "%x", "@x", "`x`", "---", "...",
                       "? q", "| bar", "> gt", "'single'", long],
            "numbers": [0, -5, u64::MAX, i64::MIN, 1.5, 1e20, -2.5e-7, 100.0],
            "nested": [[1, [2, []]], [{}], [{"a": {"b": [{"c": null}]}}]],
            long.clone(): {"": "empty key", "multi\nline key": 1},
        });
        assert_eq!(load_yaml(&to_yaml(&v)), v);
        assert_eq!(load_yaml(&to_yaml(&doc())), doc());
        // YAML 1.1 readers take `1e20` for a string: floats keep a point
        // and a signed exponent.
        assert!(to_yaml(&v).contains("- 1.0e+20\n"));
        assert!(to_yaml(&v).contains("- -2.5e-7\n"));
    }

    #[test]
    fn the_page_lists_every_operation_of_the_document() {
        let doc = doc();
        let page = html(&doc);
        for (path, item) in doc["paths"].as_object().unwrap() {
            assert!(page.contains(path.as_str()), "{path}");
            for op in item.as_object().unwrap().values() {
                let id = op["operationId"].as_str().unwrap();
                assert!(page.contains(&format!("<a href=\"#{id}\">")), "{id}");
                assert!(page.contains(&format!("<section id=\"{id}\">")), "{id}");
            }
        }
        assert!(page.contains("JSON <code>Thing</code>"));
        assert!(page.contains("JSON <code>MacroDefinition</code>"));
        assert!(page.contains("v1.2.3"));
        assert!(page.contains("About &lt;it&gt;."));
        assert!(!page.contains("http://") && !page.contains("https://"));
    }

    #[test]
    fn search_ranks_path_and_summary_words_first() {
        let doc = doc();
        let index = search_index(&doc);
        let search = |q: &str, limit: usize| -> Value {
            serde_json::from_str(&search(&index, q, limit)).expect("the answer is JSON")
        };
        let r = search("macro", 5);
        let results = r["results"].as_array().unwrap();
        assert!(results.len() >= 2);
        assert_eq!(
            results[0]["title"],
            "POST /api/mcp/tools/define - Define a macro"
        );
        assert_eq!(results[0]["path"], "/docs#mcpDefine");
        assert!(results[0]["snippet"].as_str().unwrap().contains("macro"));
        // Words of the tags and the fee count too.
        let r = search("things", 5);
        assert_eq!(r["results"][0]["path"], "/docs#refundThing");
        assert_eq!(
            search("money", 5)["results"][0]["path"],
            "/docs#refundThing"
        );
        assert_eq!(search("zzzz", 5)["results"], json!([]));
        assert_eq!(search("docs", 1)["results"].as_array().unwrap().len(), 1);
        // A word is a whole word: a part of one finds nothing.
        assert_eq!(search("macr", 5)["results"], json!([]));
        // Several words: each found adds to the score.
        let both = search("refund things", 5);
        assert_eq!(both["results"][0]["path"], "/docs#refundThing");
    }
}
