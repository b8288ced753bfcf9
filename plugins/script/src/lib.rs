//! User macros for plugins: a TypeScript function body, checked and stripped
//! of its types by the oxc parser ([`compile`]), then run by the boa
//! JavaScript engine ([`run`]).
//!
//! The sandbox is layered. The engine has no I/O at all: no `fetch`,
//! `require`, `console` or timers exist, so a body that reaches for them gets a
//! `ReferenceError`; the clock is the host's, passed in. Engine limits catch
//! deep recursion. Time and memory are bounded one level down, by the host's
//! epoch deadline and memory cap on the plugin instance this runs in; the
//! plugin tells the host beforehand how to answer if that happens.

mod strip;

use boa_engine::context::time::JsInstant;
use boa_engine::context::{Clock, ContextBuilder, HostHooks};
use boa_engine::{Context, JsValue, Source, js_string};
use serde_json::Value;
use std::rc::Rc;

/// Name of the function the author's body becomes.
const ENTRY: &str = "__macro";
/// Lines the wrapper puts before the author's body.
const PREFIX_LINES: u32 = 1;

/// A problem in the author's source, at a 1-based line and column of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub line: u32,
    pub column: u32,
    pub message: String,
}

impl Problem {
    fn at(source: &str, offset: u32, line_offset: u32, message: String) -> Problem {
        // The parser's offsets fall on character boundaries; should one
        // not, the line and column are those of the character it is in.
        let before = &source[..source.floor_char_boundary(offset as usize)];
        let line = before.matches('\n').count() as u32 + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u32 + 1;
        Problem {
            line: line.saturating_sub(line_offset).max(1),
            column,
            message,
        }
    }
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "line {}, column {}: {}",
            self.line, self.column, self.message
        )
    }
}

/// Most problems [`compile`] gives (each one's line and column is counted
/// from the start of the source: all of a 1,800-line body's were, 36 ms,
/// though only the first ten were ever shown).
pub const MAX_PROBLEMS: usize = 10;

/// Check a TypeScript function body (it receives `args`) and turn it into a
/// JavaScript program for [`run`]. Syntax errors, type-syntax errors and
/// TypeScript with runtime semantics (enums, namespaces) are problems: the
/// first [`MAX_PROBLEMS`] of them.
pub fn compile(body: &str) -> Result<String, Vec<Problem>> {
    let source = format!("function {ENTRY}(args: any) {{\n{body}\n}}\n");
    let stripped = strip::strip(&source, PREFIX_LINES)?;
    // The wrapper must still be one function: a body like `} evil(); {`
    // would otherwise escape it.
    if stripped.sole_function.as_deref() != Some(ENTRY) {
        return Err(vec![Problem {
            line: 1,
            column: 1,
            message: "the macro must be one function body (unbalanced braces?)".into(),
        }]);
    }
    Ok(stripped.js)
}

/// What a run may use.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Deepest JavaScript call nesting.
    pub recursion: usize,
    /// Largest value stack of the engine.
    pub stack: usize,
    /// Most iterations of any one loop (0: unlimited; time is bounded by the
    /// host anyway).
    pub loop_iterations: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            recursion: 256,
            stack: 64 * 1024,
            loop_iterations: 0,
        }
    }
}

/// Load a program from [`compile`] into a fresh engine without calling its
/// function: the engine parses and compiles all of it, as [`run`] does
/// first, so a program that passes has nothing the engine refuses to load.
/// (Nesting deep enough to overflow the plugin's stack traps here as it
/// would in [`run`]; the caller tells the host how to answer that.)
pub fn check(js: &str) -> Result<(), String> {
    let mut ctx = engine(0, Limits::default())?;
    load(js, &mut ctx).map(|_| ())
}

/// Run a program from [`compile`] with `args` (as JSON), and return what the
/// function returned, as JSON (`None` for `undefined`). `now_ms` is the wall
/// clock JavaScript sees. Errors are the engine's messages.
pub fn run(js: &str, args: &Value, now_ms: i64, limits: Limits) -> Result<Option<Value>, String> {
    let mut ctx = engine(now_ms, limits)?;
    let function = load(js, &mut ctx)?;
    let args = JsValue::from_json(args, &mut ctx).map_err(|e| message(e, &mut ctx))?;
    let out = function
        .call(&JsValue::undefined(), &[args], &mut ctx)
        .map_err(|e| message(e, &mut ctx))?;
    out.to_json(&mut ctx).map_err(|e| message(e, &mut ctx))
}

/// A fresh engine with the host's clock and `limits`.
fn engine(now_ms: i64, limits: Limits) -> Result<Context, String> {
    let mut ctx = ContextBuilder::default()
        .clock(Rc::new(HostClock(now_ms)))
        .host_hooks(Rc::new(Utc))
        .build()
        .map_err(|e| e.to_string())?;
    let runtime = ctx.runtime_limits_mut();
    runtime.set_recursion_limit(limits.recursion);
    runtime.set_stack_size_limit(limits.stack);
    if limits.loop_iterations > 0 {
        runtime.set_loop_iteration_limit(limits.loop_iterations);
    }
    Ok(ctx)
}

/// Evaluate the program (it only declares the function) and return the
/// function.
fn load(js: &str, ctx: &mut Context) -> Result<boa_engine::object::JsObject, String> {
    if let Err(e) = ctx.eval(Source::from_bytes(js)) {
        return Err(message(e, ctx));
    }
    let entry = ctx
        .global_object()
        .get(js_string!(ENTRY), ctx)
        .map_err(|e| message(e, ctx))?;
    match entry.as_callable() {
        Some(function) => Ok(function.clone()),
        None => Err("the macro did not define its function".into()),
    }
}

/// An engine error's first line: the engine appends a stack trace in
/// wrapper positions, and positions of the wrapped source would mislead.
fn message(e: boa_engine::JsError, ctx: &mut Context) -> String {
    let text = match e.try_native(ctx) {
        Ok(native) => native.to_string(),
        Err(_) => e.to_string(),
    };
    let first = text.lines().next().unwrap_or_default();
    match first.rfind(" (unknown at ") {
        Some(i) if first.ends_with(')') => first[..i].to_string(),
        _ => first.to_string(),
    }
}

/// The host's wall clock, fixed for one run: the sandbox has no clock of its
/// own (and reading the system clock would leave it).
struct HostClock(i64);

impl Clock for HostClock {
    fn now(&self) -> JsInstant {
        let ms = self.0.max(0) as u64;
        JsInstant::new(ms / 1000, (ms % 1000) as u32 * 1_000_000)
    }

    fn system_time_millis(&self) -> i64 {
        self.0
    }
}

/// Dates are in UTC; the sandbox has no time zone database.
struct Utc;

impl HostHooks for Utc {
    fn local_timezone_offset_seconds(&self, _unix_time_seconds: i64) -> i32 {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn strip_body(ts: &str) -> String {
        let js = compile(ts).unwrap_or_else(|p| panic!("{ts}: {p:?}"));
        let start = js.find('\n').unwrap() + 1;
        js[start..js.len() - 3].to_string()
    }

    fn eval(ts: &str, args: Value) -> Result<Option<Value>, String> {
        let js = compile(ts).map_err(|p| format!("{p:?}"))?;
        run(&js, &args, 1_700_000_000_000, Limits::default())
    }

    #[test]
    fn types_are_erased_in_place() {
        let cases = [
            ("let x: number = 1;", "let x         = 1;"),
            ("const y = args as any;", "const y = args       ;"),
            ("const z = args!.q;", "const z = args .q;"),
            ("const w = <string>args.q;", "const w =         args.q;"),
            (
                "const v = {a: 1} satisfies object;",
                "const v = {a: 1}                 ;",
            ),
            ("interface A { b: string }", "                         "),
            ("type T = string | number;", "                         "),
            (
                "function f<T>(a: T, b?: number): T { return a; }",
                "function f   (a   , b         )    { return a; }",
            ),
            ("const g = f<string>('x');", "const g = f        ('x');"),
            ("let d!: number;", "let d         ;"),
            ("declare const k: number;", "                        "),
        ];
        for (ts, js) in cases {
            assert_eq!(strip_body(ts), js, "{ts}");
        }
    }

    #[test]
    fn classes_lose_their_typescript_modifiers() {
        let js = strip_body(
            "abstract class A<T> implements I, J { private readonly x: T; y?: number; z!: string; \
             static s = 1; abstract m(): void; f(a: T): T; f(a: any) { return a; } }",
        );
        assert!(!js.contains("private") && !js.contains("readonly") && !js.contains("abstract"));
        assert!(!js.contains("implements") && !js.contains('?') && !js.contains('!'));
        assert!(js.contains("static s = 1"));
        assert_eq!(js.matches("f(").count(), 1, "{js}");
    }

    #[test]
    fn at_most_ten_problems_are_given() {
        // 1,800 lines, each a refused enum: the first ten, in order.
        let body: String = (0..1_800).map(|i| format!("enum E{i} {{ A }}\n")).collect();
        let problems = compile(&body).unwrap_err();
        assert_eq!(problems.len(), MAX_PROBLEMS);
        assert_eq!(
            problems.iter().map(|p| p.line).collect::<Vec<_>>(),
            (1..=10).collect::<Vec<_>>()
        );
    }

    #[test]
    fn check_loads_without_running() {
        // The body would throw if it ran: loading does not run it.
        assert_eq!(check(&compile("throw new Error('ran');").unwrap()), Ok(()));
        assert!(eval("throw new Error('ran');", Value::Null).is_err());
        // What the engine refuses to load is the check's error.
        assert!(check("function __macro(args) { return 1 +; }").is_err());
        assert!(check("const x = 1;").is_err(), "no function");
    }

    #[test]
    fn typed_body_runs() {
        let out = eval(
            "interface Q { term: string; limit?: number }\n\
             const words: string[] = (args.words as string[]).map((w: string): string => w.toUpperCase());\n\
             const q: Q = { term: words.join(' '), limit: args.n! * 2 };\n\
             return q satisfies Q;",
            json!({"words": ["a", "b"], "n": 3}),
        )
        .unwrap();
        assert_eq!(out, Some(json!({"term": "A B", "limit": 6})));
    }

    #[test]
    fn syntax_errors_point_at_the_authors_line() {
        let problems = compile("const a = 1;\nlet x: = 3;").unwrap_err();
        assert_eq!(problems[0].line, 2, "{problems:?}");
        let problems = compile("let t: Array<string = [];").unwrap_err();
        assert_eq!(problems[0].line, 1, "{problems:?}");
    }

    #[test]
    fn runtime_typescript_is_refused() {
        for ts in [
            "enum E { A }",
            "namespace N { export const a = 1 }",
            "class C { constructor(private a: number) {} }",
        ] {
            let problems = compile(ts).unwrap_err();
            assert!(
                problems[0].message.contains("not supported"),
                "{ts}: {problems:?}"
            );
        }
    }

    #[test]
    fn escaping_the_wrapper_is_refused() {
        assert!(compile("return 1; } globalThis.x = 1; function y() {").is_err());
    }

    #[test]
    fn no_io_exists() {
        for body in [
            "return fetch('http://example.com')",
            "return require('fs')",
            "console.log(1)",
            "setTimeout(() => 1, 1)",
        ] {
            let e = eval(body, json!({})).unwrap_err();
            assert!(e.contains("ReferenceError"), "{body}: {e}");
        }
    }

    #[test]
    fn errors_and_limits_are_reported() {
        let e = eval("throw new TypeError('bad input')", json!({})).unwrap_err();
        assert!(e.contains("bad input"), "{e}");
        let e = eval(
            "function r(n: number): number { return r(n + 1) } return r(0)",
            json!({}),
        )
        .unwrap_err();
        assert!(e.starts_with("RuntimeLimitError"), "{e}");
        let js = compile("let i = 0; while (true) { i++ }").unwrap();
        let limits = Limits {
            loop_iterations: 10_000,
            ..Limits::default()
        };
        let e = run(&js, &json!({}), 0, limits).unwrap_err();
        assert!(e.to_lowercase().contains("loop"), "{e}");
    }

    #[test]
    fn the_clock_is_the_hosts() {
        assert_eq!(
            eval("return new Date().toISOString()", json!({})).unwrap(),
            Some(json!("2023-11-14T22:13:20.000Z"))
        );
    }
}
