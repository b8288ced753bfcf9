//! TypeScript to JavaScript by type erasure.
//!
//! The oxc parser parses the source as TypeScript; a visitor then records the
//! span of every piece of type-only syntax (annotations, `as`/`satisfies`,
//! `!`, type parameters and arguments, interfaces, type aliases, `declare`,
//! overloads, class modifiers) and those bytes are replaced by spaces. What is
//! left is the same program as JavaScript, with every line and column where
//! it was, so the engine's error positions match the author's source. This is
//! the "strip-only" mode Node.js uses: TypeScript that has runtime semantics
//! of its own (enums, namespaces, parameter properties) is refused with a
//! clear error rather than half-compiled.

use oxc_allocator::Allocator;
use oxc_ast::ast::*;
use oxc_ast_visit::{Visit, walk};
use oxc_parser::Parser;
use oxc_span::{GetSpan, SourceType, Span};
use oxc_syntax::scope::ScopeFlags;

use crate::Problem;

/// Modifiers that only exist in TypeScript and may precede a class member.
const TS_MODIFIERS: [&str; 7] = [
    "public",
    "private",
    "protected",
    "readonly",
    "override",
    "declare",
    "abstract",
];

/// A script with its types erased.
pub(crate) struct Stripped {
    pub js: String,
    /// The name of the function the script consists of, when it is exactly
    /// one function declaration with a body.
    pub sole_function: Option<String>,
}

/// Parse `source` (a TypeScript script) and erase its types. `line_offset`
/// is the number of lines a wrapper put before the author's text,
/// subtracted from reported positions.
pub(crate) fn strip(source: &str, line_offset: u32) -> Result<Stripped, Vec<Problem>> {
    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, source, SourceType::ts().with_script(true)).parse();
    let at = |offset: u32, message: String| Problem::at(source, offset, line_offset, message);
    if parsed.panicked || parsed.diagnostics.has_errors() {
        let mut problems: Vec<Problem> = parsed
            .diagnostics
            .errors()
            .take(crate::MAX_PROBLEMS)
            .map(|d| {
                let offset = d.labels.first().map(|l| l.offset()).unwrap_or(0);
                at(offset, d.message.to_string())
            })
            .collect();
        if problems.is_empty() {
            problems.push(at(0, "the parser gave up".into()));
        }
        return Err(problems);
    }
    let mut eraser = Eraser {
        source,
        blanks: Vec::new(),
        refused: Vec::new(),
    };
    eraser.visit_program(&parsed.program);
    if !eraser.refused.is_empty() {
        return Err(eraser
            .refused
            .into_iter()
            .take(crate::MAX_PROBLEMS)
            .map(|(offset, m)| at(offset, m))
            .collect());
    }
    let mut bytes = source.as_bytes().to_vec();
    for span in eraser.blanks {
        for b in &mut bytes[span.start as usize..span.end as usize] {
            // Keep line breaks so positions stay put; every other byte of a
            // (possibly multi-byte) character becomes a space.
            if *b != b'\n' && *b != b'\r' {
                *b = b' ';
            }
        }
    }
    let sole_function = match parsed.program.body.as_slice() {
        [Statement::FunctionDeclaration(f)] if f.body.is_some() => {
            f.id.as_ref().map(|id| id.name.to_string())
        }
        _ => None,
    };
    Ok(Stripped {
        js: String::from_utf8(bytes).expect("only whole characters are blanked"),
        sole_function,
    })
}

struct Eraser<'s> {
    source: &'s str,
    blanks: Vec<Span>,
    refused: Vec<(u32, String)>,
}

impl Eraser<'_> {
    fn blank(&mut self, start: u32, end: u32) {
        if start < end {
            self.blanks.push(Span::new(start, end));
        }
    }

    fn refuse(&mut self, span: Span, what: &str) {
        self.refused.push((
            span.start,
            format!("{what} has runtime semantics and is not supported here; use plain JavaScript"),
        ));
    }

    /// Blank the first `ch` between `start` and `end` (a `?` or `!` marker).
    fn blank_char(&mut self, start: u32, end: u32, ch: u8) {
        let bytes = &self.source.as_bytes()[start as usize..end as usize];
        if let Some(i) = bytes.iter().position(|b| *b == ch) {
            let at = start + i as u32;
            self.blank(at, at + 1);
        }
    }

    /// Blank TypeScript-only modifier words in `start..end` (the text of a
    /// class member before its key).
    fn blank_modifiers(&mut self, start: u32, end: u32) {
        let text = &self.source[start as usize..end as usize];
        let mut i = 0;
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$')) {
            if TS_MODIFIERS.contains(&word) {
                let s = start + i as u32;
                self.blank(s, s + word.len() as u32);
            }
            i += word.len() + 1;
        }
    }
}

impl<'a> Visit<'a> for Eraser<'_> {
    fn visit_statement(&mut self, it: &Statement<'a>) {
        match it {
            Statement::TSTypeAliasDeclaration(d) => self.blank(d.span.start, d.span.end),
            Statement::TSInterfaceDeclaration(d) => self.blank(d.span.start, d.span.end),
            Statement::TSEnumDeclaration(d) if d.declare => self.blank(d.span.start, d.span.end),
            Statement::TSEnumDeclaration(d) => self.refuse(d.span, "an enum"),
            Statement::TSNamespaceDeclaration(d) if d.declare => {
                self.blank(d.span.start, d.span.end)
            }
            Statement::TSNamespaceDeclaration(d) => self.refuse(d.span, "a namespace"),
            Statement::TSGlobalDeclaration(d) => self.blank(d.span.start, d.span.end),
            Statement::TSImportEqualsDeclaration(d) => self.refuse(d.span, "import ="),
            Statement::TSExportAssignment(d) => self.refuse(d.span, "export ="),
            Statement::VariableDeclaration(d) if d.declare => self.blank(d.span.start, d.span.end),
            Statement::ClassDeclaration(c) if c.declare => self.blank(c.span.start, c.span.end),
            Statement::FunctionDeclaration(f) if f.declare || f.body.is_none() => {
                self.blank(f.span.start, f.span.end)
            }
            _ => walk::walk_statement(self, it),
        }
    }

    fn visit_ts_type_annotation(&mut self, it: &TSTypeAnnotation<'a>) {
        self.blank(it.span.start, it.span.end);
    }

    fn visit_ts_type_parameter_declaration(&mut self, it: &TSTypeParameterDeclaration<'a>) {
        self.blank(it.span.start, it.span.end);
    }

    fn visit_ts_type_parameter_instantiation(&mut self, it: &TSTypeParameterInstantiation<'a>) {
        self.blank(it.span.start, it.span.end);
    }

    fn visit_ts_as_expression(&mut self, it: &TSAsExpression<'a>) {
        self.blank(it.expression.span().end, it.span.end);
        self.visit_expression(&it.expression);
    }

    fn visit_ts_satisfies_expression(&mut self, it: &TSSatisfiesExpression<'a>) {
        self.blank(it.expression.span().end, it.span.end);
        self.visit_expression(&it.expression);
    }

    fn visit_ts_non_null_expression(&mut self, it: &TSNonNullExpression<'a>) {
        self.blank(it.expression.span().end, it.span.end);
        self.visit_expression(&it.expression);
    }

    fn visit_ts_type_assertion(&mut self, it: &TSTypeAssertion<'a>) {
        self.blank(it.span.start, it.expression.span().start);
        self.visit_expression(&it.expression);
    }

    fn visit_function(&mut self, it: &Function<'a>, flags: ScopeFlags) {
        if let Some(this) = &it.this_param {
            // `function f(this: T, x)`: drop the parameter and its comma.
            let end = it
                .params
                .items
                .first()
                .map(|p| p.span.start)
                .unwrap_or(this.span.end);
            self.blank(this.span.start, end);
        }
        walk::walk_function(self, it, flags);
    }

    fn visit_formal_parameter(&mut self, it: &FormalParameter<'a>) {
        if it.accessibility.is_some() || it.readonly || it.r#override {
            self.refuse(it.span, "a parameter property");
            return;
        }
        if it.optional {
            let end = it
                .type_annotation
                .as_ref()
                .map(|t| t.span.start)
                .unwrap_or(it.span.end);
            self.blank_char(it.pattern.span().end, end, b'?');
        }
        walk::walk_formal_parameter(self, it);
    }

    fn visit_variable_declarator(&mut self, it: &VariableDeclarator<'a>) {
        if it.definite
            && let Some(t) = &it.type_annotation
        {
            self.blank_char(it.id.span().end, t.span.start, b'!');
        }
        walk::walk_variable_declarator(self, it);
    }

    fn visit_class(&mut self, it: &Class<'a>) {
        if it.r#abstract {
            let head_end = it
                .id
                .as_ref()
                .map(|i| i.span.start)
                .unwrap_or(it.body.span.start);
            self.blank_modifiers(it.span.start, head_end);
        }
        if let (Some(first), Some(last)) = (it.implements.first(), it.implements.last()) {
            let before = &self.source[..first.span.start as usize];
            if let Some(kw) = before.rfind("implements") {
                self.blank(kw as u32, last.span.end);
            }
        }
        walk::walk_class(self, it);
    }

    /// Blanked whole in `visit_class`, with the `implements` keyword.
    fn visit_ts_class_implements_list(
        &mut self,
        _: &oxc_allocator::Vec<'a, TSClassImplements<'a>>,
    ) {
    }

    fn visit_class_element(&mut self, it: &ClassElement<'a>) {
        match it {
            ClassElement::TSIndexSignature(s) => self.blank(s.span.start, s.span.end),
            ClassElement::PropertyDefinition(p) => {
                if p.declare || p.r#type == PropertyDefinitionType::TSAbstractPropertyDefinition {
                    self.blank(p.span.start, p.span.end);
                    return;
                }
                self.blank_modifiers(p.span.start, p.key.span().start);
                let marker_end = p
                    .type_annotation
                    .as_ref()
                    .map(|t| t.span.start)
                    .or_else(|| p.value.as_ref().map(|v| v.span().start))
                    .unwrap_or(p.span.end);
                if p.optional {
                    self.blank_char(p.key.span().end, marker_end, b'?');
                }
                if p.definite {
                    self.blank_char(p.key.span().end, marker_end, b'!');
                }
                walk::walk_property_definition(self, p);
            }
            ClassElement::MethodDefinition(m) => {
                if m.value.body.is_none()
                    || m.r#type == MethodDefinitionType::TSAbstractMethodDefinition
                {
                    // An overload signature or an abstract method.
                    self.blank(m.span.start, m.span.end);
                    return;
                }
                self.blank_modifiers(m.span.start, m.key.span().start);
                if m.optional {
                    self.blank_char(m.key.span().end, m.value.params.span.start, b'?');
                }
                walk::walk_method_definition(self, m);
            }
            ClassElement::AccessorProperty(a) => {
                self.blank_modifiers(a.span.start, a.key.span().start);
                walk::walk_accessor_property(self, a);
            }
            _ => walk::walk_class_element(self, it),
        }
    }
}
