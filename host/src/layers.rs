//! The host's modules in layers: each imports only modules below it, so
//! there is no import cycle. [`ORDER`] is the order, bottom first; the
//! test reads the sources and fails on a use of a module above (or on a
//! new module not placed in the order yet). Inside each folder (a module
//! of modules: `money`, `runtime`, `runtime::host`, `server`, `store`)
//! the modules' uses of each other must form no cycle either; the folder's
//! `mod.rs` is its front (its modules use what it defines, it re-exports
//! theirs) and not one of them. Paths written only inside strings (an
//! attribute's `with = "..."`) are not read.

/// The top-level modules of the host, each allowed to use only those
/// before it.
pub(crate) const ORDER: &[&str] = &[
    // Leaves: the heap, ids and hex, grant names, the process's metrics.
    "heap",
    "ids",
    "capabilities",
    "metrics",
    // Problems for the operator, settings, the log writer.
    "alerts",
    "config",
    "logging",
    // Storage (redb or PostgreSQL, group commit, the write-ahead log).
    "store",
    // The answer type and its JSON errors.
    "reply",
    // The ledger, the payment gate, escrow, upstream mode.
    "money",
    // Signature checks.
    "auth",
    // Which versions served the database.
    "versions",
    // What the layers above share: config, storage, ledger, ids, clock.
    "state",
    // The plugin runtime and the host interfaces; snapshots; sweeping.
    "runtime",
    "backup",
    "retention",
    // State and runtime together, the HTTP server, the command line.
    "app",
    "server",
    "cli",
];

#[cfg(test)]
mod tests {
    use super::ORDER;
    use std::collections::{BTreeMap, BTreeSet};
    use std::path::{Path, PathBuf};

    /// A module's path below the crate root (`["runtime", "host"]`).
    type Module = Vec<String>;

    /// Every `.rs` file below `dir`, with the module it is.
    fn modules(src: &Path, dir: &Path, out: &mut Vec<(Module, PathBuf)>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                modules(src, &path, out);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut module: Module = rel.iter().map(|c| c.to_string_lossy().into()).collect();
            if module.last().is_some_and(|m| m == "mod") || module == ["lib"] {
                module.pop();
            }
            if module != ["main"] {
                out.push((module, path));
            }
        }
    }

    fn is_ident(c: char) -> bool {
        c.is_alphanumeric() || c == '_'
    }

    /// `source` with its comments and the insides of its string and
    /// character literals blanked (lines kept), so that only code is read.
    fn code(source: &str) -> String {
        let s: Vec<char> = source.chars().collect();
        let mut out = s.clone();
        let blank = |out: &mut Vec<char>, from: usize, to: usize| {
            for c in &mut out[from..to.min(s.len())] {
                if *c != '\n' {
                    *c = ' ';
                }
            }
        };
        let mut i = 0;
        while i < s.len() {
            let at = |k: usize| s.get(k).copied().unwrap_or('\0');
            let word_start = i == 0 || !is_ident(at(i - 1));
            // `r"..."`, `br"..."`, `cr"..."` (and with `#`s).
            let raw_start = at(i) == 'r'
                && (word_start
                    || (matches!(at(i - 1), 'b' | 'c') && (i < 2 || !is_ident(at(i - 2)))));
            if at(i) == '/' && at(i + 1) == '/' {
                let end = (i..s.len()).find(|&k| s[k] == '\n').unwrap_or(s.len());
                blank(&mut out, i, end);
                i = end;
            } else if at(i) == '/' && at(i + 1) == '*' {
                let (mut depth, mut k) = (1, i + 2);
                while k < s.len() && depth > 0 {
                    if at(k) == '/' && at(k + 1) == '*' {
                        depth += 1;
                        k += 1;
                    } else if at(k) == '*' && at(k + 1) == '/' {
                        depth -= 1;
                        k += 1;
                    }
                    k += 1;
                }
                blank(&mut out, i, k);
                i = k;
            } else if raw_start && (at(i + 1) == '"' || at(i + 1) == '#') {
                let hashes = (i + 1..s.len()).take_while(|&k| s[k] == '#').count();
                if at(i + 1 + hashes) != '"' {
                    i += 1;
                    continue;
                }
                let body = i + 2 + hashes;
                let close = (body..s.len())
                    .find(|&k| s[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#'))
                    .unwrap_or(s.len());
                blank(&mut out, body, close);
                i = close + 1 + hashes;
            } else if at(i) == '"' {
                let mut k = i + 1;
                while k < s.len() && s[k] != '"' {
                    k += if s[k] == '\\' { 2 } else { 1 };
                }
                blank(&mut out, i + 1, k);
                i = k + 1;
            } else if at(i) == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
                // A character literal (`'x'`, `'\''`, `'\u{..}'`); a lifetime
                // (`'a`) has no closing quote. An escape's next character
                // is never the closing one.
                let from = if at(i + 1) == '\\' { i + 3 } else { i + 2 };
                let close = (from..s.len()).find(|&k| s[k] == '\'').unwrap_or(s.len());
                blank(&mut out, i + 1, close);
                i = close + 1;
            } else {
                i += 1;
            }
        }
        out.into_iter().collect()
    }

    /// A path, and the name a `use` binds it to when it renames it
    /// (`a::b as c`).
    type Named = (Module, Option<String>);

    /// The paths of a use tree starting at `s[at..]` (`a::b`, `{a, b::{c}}`,
    /// `a as b`, across lines), and where it ends. A path stops at
    /// anything else (`(`, `<`, `;`).
    fn tree(s: &[char], mut at: usize) -> (Vec<Named>, usize) {
        let skip = |at: &mut usize| {
            while s.get(*at).is_some_and(|c| c.is_whitespace()) {
                *at += 1;
            }
        };
        skip(&mut at);
        if s.get(at) == Some(&'{') {
            let mut paths = Vec::new();
            at += 1;
            loop {
                skip(&mut at);
                match s.get(at) {
                    None => return (paths, at),
                    Some('}') => return (paths, at + 1),
                    Some(',') => at += 1,
                    Some(_) => {
                        let (more, end) = tree(s, at);
                        paths.extend(more);
                        if end == at {
                            return (paths, at);
                        }
                        at = end;
                    }
                }
            }
        }
        // A raw identifier (`r#match`) is its name.
        if s.get(at) == Some(&'r') && s.get(at + 1) == Some(&'#') {
            at += 2;
        }
        let start = at;
        while s.get(at).is_some_and(|&c| is_ident(c) || c == '*') {
            at += 1;
        }
        let name: String = s[start..at].iter().collect();
        if name.is_empty() {
            return (vec![], at);
        }
        let mut after = at;
        skip(&mut after);
        if s.get(after) == Some(&':') && s.get(after + 1) == Some(&':') {
            let (rest, end) = tree(s, after + 2);
            if !rest.is_empty() {
                let paths = rest
                    .into_iter()
                    .map(|(mut p, alias)| {
                        p.insert(0, name.clone());
                        (p, alias)
                    })
                    .collect();
                return (paths, end);
            }
        }
        // `name as alias`: bound to the alias.
        if s[after..].starts_with(&['a', 's'])
            && s.get(after + 2).is_some_and(|c| c.is_whitespace())
        {
            let mut from = after + 2;
            skip(&mut from);
            let start = from;
            while s.get(from).is_some_and(|&c| is_ident(c)) {
                from += 1;
            }
            let alias: String = s[start..from].iter().collect();
            if !alias.is_empty() {
                return (vec![(vec![name], Some(alias))], from);
            }
        }
        (vec![(vec![name], None)], at)
    }

    /// Every path in `code` that starts at `root` (`crate`, `super`, or
    /// `use` for the items a `pub use` names), with its line and how many
    /// inline modules (`mod tests { .. }`) it is inside. A root that
    /// continues a path (`super::super`), or names a visibility
    /// (`pub(in crate::x)`), starts none.
    fn paths_from(code: &str, root: &str) -> Vec<(Named, usize, usize)> {
        let s: Vec<char> = code.chars().collect();
        let r: Vec<char> = root.chars().collect();
        let inline = inline_modules(&s);
        let mut found = Vec::new();
        let mut line = 1;
        for i in 0..s.len() {
            if s[i] == '\n' {
                line += 1;
            }
            let word = s[i..].starts_with(&r)
                && (i == 0 || !is_ident(s[i - 1]))
                && !s.get(i + r.len()).is_some_and(|&c| is_ident(c));
            if !word {
                continue;
            }
            // What comes before it, white space skipped: `::` (it
            // continues a path), or `(in` (a visibility, `pub(in ..)`).
            let back = |mut k: usize| {
                while k > 0 && s[k - 1].is_whitespace() {
                    k -= 1;
                }
                k
            };
            let k = back(i);
            let continues = k >= 2 && s[k - 2..k] == [':', ':'];
            let visibility = k >= 2
                && s[k - 2..k] == ['i', 'n']
                && (k == 2 || !is_ident(s[k - 3]))
                && back(k - 2) > 0
                && s[back(k - 2) - 1] == '(';
            if root != "use" && (continues || visibility) {
                continue;
            }
            let paths = if root == "use" {
                tree(&s, i + r.len()).0
            } else {
                let (paths, _) = tree(&s, i);
                paths.into_iter().filter(|(p, _)| p.len() > 1).collect()
            };
            let depth = inline.iter().filter(|(a, b)| *a < i && i < *b).count();
            found.extend(paths.into_iter().map(|p| (p, line, depth)));
        }
        found
    }

    /// Where each inline module's body (`mod name { .. }`) begins and ends.
    fn inline_modules(s: &[char]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        for i in 0..s.len() {
            let word = s[i..].starts_with(&['m', 'o', 'd'])
                && (i == 0 || !is_ident(s[i - 1]))
                && s.get(i + 3).is_some_and(|c| c.is_whitespace());
            if !word {
                continue;
            }
            let mut at = i + 3;
            while s.get(at).is_some_and(|c| c.is_whitespace() || is_ident(*c)) {
                at += 1;
            }
            if s.get(at) != Some(&'{') {
                continue;
            }
            let mut depth = 0;
            for (k, c) in s.iter().enumerate().skip(at) {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            found.push((at, k));
                            break;
                        }
                    }
                    _ => {}
                }
            }
        }
        found
    }

    /// The crate's modules, and what each folder's `pub use` re-exports:
    /// (folder and item name) -> the module it comes from.
    struct Crate {
        modules: BTreeSet<Module>,
        exports: BTreeMap<Module, Module>,
    }

    impl Crate {
        fn read(files: &[(Module, PathBuf, String)]) -> Crate {
            let modules: BTreeSet<Module> = files.iter().map(|(m, _, _)| m.clone()).collect();
            let longest_module = |path: &[String]| {
                (1..=path.len())
                    .rev()
                    .map(|n| path[..n].to_vec())
                    .find(|m| modules.contains(m))
            };
            let mut exports = BTreeMap::new();
            for (folder, path, text) in files {
                let folder_file = path.ends_with("mod.rs") || path.ends_with("lib.rs");
                if !folder_file {
                    continue;
                }
                for ((p, alias), _, _) in paths_from(text, "use") {
                    // `use child::x`, `use self::child::x`, `use crate::..`.
                    let absolute: Module = match p[0].as_str() {
                        "crate" => p[1..].to_vec(),
                        "self" => folder.iter().chain(&p[1..]).cloned().collect(),
                        _ => folder.iter().chain(&p).cloned().collect(),
                    };
                    let Some(from) = longest_module(&absolute) else {
                        continue;
                    };
                    let Some(name) = alias.or_else(|| p.last().cloned()) else {
                        continue;
                    };
                    let item: Module = folder.iter().cloned().chain([name]).collect();
                    // (A name that is a module of the folder is that module.)
                    if from != *folder && !modules.contains(&item) {
                        exports.insert(item, from);
                    }
                }
            }
            Crate { modules, exports }
        }

        /// The module `path` (from the crate root) names, through
        /// re-exports (a folder's item that another folder below re-exports
        /// in turn is followed to where it is defined).
        fn resolve(&self, path: &[String]) -> Option<Module> {
            let mut path = path.to_vec();
            for _ in 0..16 {
                let n = (1..=path.len()).rev().find(|&n| {
                    self.exports.contains_key(&path[..n]) || self.modules.contains(&path[..n])
                })?;
                let Some(from) = self.exports.get(&path[..n]) else {
                    return Some(path[..n].to_vec());
                };
                // A module re-exported (`pub use self::h::d`): the rest of
                // the path is inside it.
                if from.last() == Some(&path[n - 1]) {
                    path = from.iter().chain(&path[n..]).cloned().collect();
                    continue;
                }
                let item: Module = from.iter().chain(&path[n - 1..n]).cloned().collect();
                if !self.exports.contains_key(&item) {
                    return Some(from.clone());
                }
                path = item.into_iter().chain(path[n..].iter().cloned()).collect();
            }
            None
        }

        /// The modules a file of `module` uses, each with the first line
        /// naming it.
        fn uses(&self, module: &[String], code: &str) -> BTreeMap<Module, usize> {
            let mut used = BTreeMap::new();
            let mut note = |target: Option<Module>, line: usize| {
                if let Some(t) = target.filter(|t| !module.starts_with(t) && t.as_slice() != module)
                {
                    used.entry(t).or_insert(line);
                }
            };
            for ((p, _), line, _) in paths_from(code, "crate") {
                note(self.resolve(&p[1..]), line);
            }
            for ((p, _), line, depth) in paths_from(code, "super") {
                // Inside `depth` inline modules, the first `depth` steps up
                // only come back to the file's own module.
                let ups = p.iter().take_while(|s| *s == "super").count();
                let Some(out) = ups.checked_sub(depth).filter(|&n| n > 0) else {
                    continue;
                };
                let mut base = module.to_vec();
                for _ in 0..out {
                    base.pop();
                }
                let full: Module = base.into_iter().chain(p[ups..].iter().cloned()).collect();
                note(self.resolve(&full), line);
            }
            used
        }
    }

    /// Every file of the host crate: its module, path and code.
    fn sources() -> Vec<(Module, PathBuf, String)> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut found = Vec::new();
        modules(&src, &src, &mut found);
        found
            .into_iter()
            .map(|(m, p)| {
                let text = code(&std::fs::read_to_string(&p).unwrap());
                let rel = p.strip_prefix(&src).unwrap().to_path_buf();
                (m, rel, text)
            })
            .collect()
    }

    /// Each use of one module by another: (user, used) -> where.
    fn edges(files: &[(Module, PathBuf, String)]) -> BTreeMap<(Module, Module), String> {
        let krate = Crate::read(files);
        let mut edges = BTreeMap::new();
        for (module, path, text) in files {
            for (used, line) in krate.uses(module, text) {
                edges
                    .entry((module.clone(), used))
                    .or_insert_with(|| format!("{}:{line}", path.display()));
            }
        }
        edges
    }

    #[test]
    fn modules_use_only_the_layers_below_them() {
        let files = sources();
        let rank = |name: &str| ORDER.iter().position(|m| *m == name);
        let mut wrong = Vec::new();
        let tops: BTreeSet<&str> = files
            .iter()
            .filter_map(|(m, _, _)| m.first().map(String::as_str))
            .filter(|m| *m != "layers")
            .collect();
        for top in &tops {
            if rank(top).is_none() {
                wrong.push(format!("{top}: not placed in layers::ORDER"));
            }
        }
        for ((user, used), at) in edges(&files) {
            let (Some(from), Some(to)) = (user.first(), used.first()) else {
                continue;
            };
            if let (Some(a), Some(b)) = (rank(from), rank(to))
                && b > a
            {
                wrong.push(format!("{at}: {from} uses {to}, a layer above it"));
            }
        }
        assert_eq!(tops.len(), ORDER.len(), "a module of ORDER is gone");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    /// The cycles among the modules of each folder, each as the folder,
    /// its modules around the cycle, and where each use is.
    fn folder_cycles(edges: &BTreeMap<(Module, Module), String>) -> Vec<String> {
        // folder -> module -> (module it uses -> where)
        let mut graph: BTreeMap<Module, BTreeMap<String, BTreeMap<String, String>>> =
            BTreeMap::new();
        for ((user, used), at) in edges {
            let common = user.iter().zip(used).take_while(|(a, b)| a == b).count();
            if common == 0 || common >= user.len() || common >= used.len() {
                continue;
            }
            graph
                .entry(user[..common].to_vec())
                .or_default()
                .entry(user[common].clone())
                .or_default()
                .entry(used[common].clone())
                .or_insert_with(|| at.clone());
        }
        let mut cycles = Vec::new();
        for (folder, g) in &graph {
            // Depth first; a module met again on the path closes a cycle.
            fn walk<'a>(
                g: &'a BTreeMap<String, BTreeMap<String, String>>,
                at: &'a str,
                path: &mut Vec<&'a str>,
                done: &mut BTreeSet<&'a str>,
                found: &mut Option<Vec<&'a str>>,
            ) {
                if found.is_some() || done.contains(at) {
                    return;
                }
                if let Some(i) = path.iter().position(|m| *m == at) {
                    *found = Some(path[i..].to_vec());
                    return;
                }
                path.push(at);
                for next in g.get(at).into_iter().flat_map(|n| n.keys()) {
                    walk(g, next, path, done, found);
                }
                path.pop();
                done.insert(at);
            }
            let (mut done, mut found) = (BTreeSet::new(), None);
            for start in g.keys() {
                walk(g, start, &mut Vec::new(), &mut done, &mut found);
            }
            if let Some(cycle) = found {
                let uses: Vec<String> = cycle
                    .iter()
                    .zip(cycle.iter().cycle().skip(1))
                    .map(|(a, b)| format!("{a} -> {b} ({})", g[*a][*b]))
                    .collect();
                cycles.push(format!("{}: {}", folder.join("::"), uses.join(", ")));
            }
        }
        cycles
    }

    #[test]
    fn the_modules_of_each_folder_use_each_other_without_a_cycle() {
        let cycles = folder_cycles(&edges(&sources()));
        assert!(cycles.is_empty(), "{}", cycles.join("\n"));
    }

    /// Modules and the code of their files, as `sources` gives them.
    fn crate_of(files: &[(&str, &str)]) -> Vec<(Module, PathBuf, String)> {
        files
            .iter()
            .map(|(path, text)| {
                let mut module: Module = path
                    .trim_end_matches(".rs")
                    .split('/')
                    .map(String::from)
                    .collect();
                if module.last().is_some_and(|m| m == "mod") || module == ["lib"] {
                    module.pop();
                }
                (module, PathBuf::from(path), code(text))
            })
            .collect()
    }

    #[test]
    fn uses_are_read_from_code_across_lines_groups_and_re_exports() {
        let text = "use crate::store::Storage;\n// crate::server\nlet x = crate::money::f(); // crate::app\n\
            let url = \"http://x/crate::cli\"; let r = r#\"crate::cli\"#; let c = '\"'; crate::auth::g();\n\
            use crate::{\n    state::{State, X},\n    runtime :: Y,\n};\nfn f<'a>(_: &'a crate::Config) {}\n";
        let files = crate_of(&[
            ("lib.rs", "pub mod a;\npub use config::Config;\n"),
            ("a.rs", text),
            ("store/mod.rs", ""),
            ("money/mod.rs", ""),
            ("auth.rs", ""),
            ("state.rs", ""),
            (
                "runtime/mod.rs",
                "pub mod engine;\npub use engine::{Y, Z as W};\n",
            ),
            ("runtime/engine.rs", ""),
            ("config.rs", ""),
            ("server.rs", ""),
            ("cli.rs", ""),
            ("app.rs", ""),
        ]);
        let used: Vec<String> = edges(&files)
            .into_keys()
            .filter(|(user, _)| user == &["a"])
            .map(|(_, used)| used.join("::"))
            .collect();
        assert_eq!(
            used,
            [
                "auth",
                "config",
                "money",
                "runtime::engine",
                "state",
                "store"
            ]
        );
    }

    #[test]
    fn literals_raw_names_visibilities_and_inline_modules_are_read_right() {
        // Escaped and quote characters, byte and C strings: none hides the
        // uses after it, and none of their contents is a use.
        let text = "let q = matches!(c, '\\''|'\"'); let b = b'\\''; let s = '\\\\';\n\
            let r = cr#\"a\"b crate::cli\"#; let u = '\\u{22}';\n\
            use crate::store::Storage;\n\
            fn g() { crate::r#money::f() }\n\
            pub(in crate::app) fn h() {}\n\
            fn k() { for x in crate::state::all() {} }\n";
        let files = crate_of(&[
            ("lib.rs", ""),
            ("a.rs", text),
            ("store.rs", ""),
            ("money.rs", ""),
            ("app.rs", ""),
            ("cli.rs", ""),
            ("state.rs", ""),
        ]);
        let used: Vec<String> = edges(&files)
            .into_keys()
            .map(|(_, used)| used.join("::"))
            .collect();
        assert_eq!(used, ["money", "state", "store"]);
        // `super` inside an inline module climbs it first; `super::super`
        // is one path, not also `super::p`; a folder re-exports through
        // `self::` and through another folder's re-export.
        let files = crate_of(&[
            ("lib.rs", ""),
            ("f/mod.rs", "pub use self::h::C;\n"),
            ("f/h/mod.rs", "pub use d::C;\n"),
            ("f/h/d.rs", ""),
            ("f/h/p.rs", ""),
            (
                "f/h/e.rs",
                "use super::super::p::X;\nmod tests { use super::*; use super::super::d::Y; }\n",
            ),
            ("f/p.rs", "use crate::f::C;\n"),
        ]);
        let edges: Vec<String> = edges(&files)
            .into_keys()
            .map(|(user, used)| format!("{} -> {}", user.join("::"), used.join("::")))
            .collect();
        assert_eq!(
            edges,
            ["f::h::e -> f::h::d", "f::h::e -> f::p", "f::p -> f::h::d"]
        );
    }

    #[test]
    fn a_cycle_inside_a_folder_is_found_through_super_and_re_exports() {
        let files = crate_of(&[
            ("lib.rs", ""),
            ("r/mod.rs", "pub use engine::Runtime;\n"),
            ("r/engine.rs", "use super::host::Ctx;\n"),
            ("r/host/mod.rs", "mod dispatch;\n"),
            (
                "r/host/dispatch.rs",
                "use super::super::Runtime;\nuse super::Ctx;\n",
            ),
        ]);
        let cycles = folder_cycles(&edges(&files));
        assert_eq!(cycles.len(), 1, "{cycles:?}");
        assert!(cycles[0].starts_with("r: "), "{cycles:?}");
        assert!(
            cycles[0].contains("engine -> host (r/engine.rs:1)"),
            "{cycles:?}"
        );
        assert!(
            cycles[0].contains("host -> engine (r/host/dispatch.rs:1)"),
            "{cycles:?}"
        );
        // Without the way back, none.
        let files = crate_of(&[
            ("lib.rs", ""),
            ("r/mod.rs", "pub use engine::Runtime;\n"),
            ("r/engine.rs", "use super::host::Ctx;\n"),
            ("r/host/mod.rs", "mod dispatch;\n"),
            ("r/host/dispatch.rs", "use super::Ctx;\n"),
        ]);
        assert!(folder_cycles(&edges(&files)).is_empty());
    }

    #[test]
    fn re_exports_are_read_by_the_names_they_bind() {
        let files = crate_of(&[
            ("lib.rs", ""),
            (
                "f/mod.rs",
                "pub use self::h::{d as dd, C};\npub use h::q;\n",
            ),
            (
                "f/h/mod.rs",
                "use crate::g::{auth as wit_auth, types};\npub use d::C;\n",
            ),
            ("f/h/d.rs", ""),
            ("f/h/q.rs", ""),
            ("f/h/auth.rs", ""),
            ("g.rs", ""),
            (
                "f/p.rs",
                "use crate::f::dd::X;\nuse crate::f::q::sub::Y;\nuse super::h::auth::Z;\n",
            ),
        ]);
        let krate = Crate::read(&files);
        let names: Vec<String> = krate.exports.keys().map(|k| k.join("::")).collect();
        assert_eq!(
            names,
            [
                "f::C",
                "f::dd",
                "f::h::C",
                "f::h::types",
                "f::h::wit_auth",
                "f::q"
            ]
        );
        // A renamed module, a module re-exported as itself (the path goes
        // on inside it), and a module whose name another one renames.
        let used: Vec<String> = edges(&files)
            .into_keys()
            .filter(|(user, _)| user == &["f", "p"])
            .map(|(_, used)| used.join("::"))
            .collect();
        assert_eq!(used, ["f::h::auth", "f::h::d", "f::h::q"]);
    }
}
