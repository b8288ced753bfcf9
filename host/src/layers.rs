//! The host's modules in layers: each imports only modules below it, so
//! there is no import cycle. [`ORDER`] is the order, bottom first; the
//! test reads the sources and fails on a use of a module above (or on a
//! new module not placed in the order yet).

/// The top-level modules of the host, each allowed to use only those
/// before it.
pub(crate) const ORDER: &[&str] = &[
    // Leaves: ids and hex, grant names, the process's metrics.
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
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};

    /// Every `.rs` file of a module (a file, or a folder of them).
    fn files(path: &Path, out: &mut Vec<PathBuf>) {
        if path.is_dir() {
            for entry in std::fs::read_dir(path).unwrap() {
                files(&entry.unwrap().path(), out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.to_path_buf());
        }
    }

    /// What the crate root re-exports, and the module each comes from.
    const ROOT_EXPORTS: [(&str, &str); 3] =
        [("App", "app"), ("Config", "config"), ("Reply", "reply")];

    /// The module a path after `crate::` starts with ("" for none).
    fn module_of(path: &str) -> String {
        let name: String = path
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        match ROOT_EXPORTS.iter().find(|(item, _)| *item == name) {
            Some((_, module)) => module.to_string(),
            None => name,
        }
    }

    /// The modules a group `crate::{a::x, b::{y, z}, ..}` names (`group`
    /// starts after its `{`): the head of each member at its first level.
    fn group_heads(group: &str) -> Vec<String> {
        let mut heads = vec![module_of(group.trim_start())];
        let mut depth = 1;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => heads.push(module_of(group[i + 1..].trim_start())),
                _ => {}
            }
        }
        heads
    }

    /// The top-level modules `source` names as `crate::<name>` or in
    /// `crate::{<name>, ..}` in code (comments left out), with the line of
    /// each first use.
    fn uses(source: &str) -> BTreeMap<String, usize> {
        let prefix = concat!("crate", "::");
        let mut found = BTreeMap::new();
        for (n, line) in source.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            let mut rest = code;
            while let Some(at) = rest.find(prefix) {
                let after = &rest[at + prefix.len()..];
                let names = match after.strip_prefix('{') {
                    Some(group) => group_heads(group),
                    None => vec![module_of(after)],
                };
                for name in names.into_iter().filter(|m| !m.is_empty()) {
                    found.entry(name).or_insert(n + 1);
                }
                rest = after;
            }
        }
        found
    }

    #[test]
    fn modules_use_only_the_layers_below_them() {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let rank = |name: &str| ORDER.iter().position(|m| *m == name);
        let mut wrong = Vec::new();
        let mut modules = 0;
        for entry in std::fs::read_dir(&src).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            if ["lib", "main", "layers"].contains(&name.as_str()) {
                continue;
            }
            modules += 1;
            let Some(own) = rank(&name) else {
                wrong.push(format!("{name}: not placed in layers::ORDER"));
                continue;
            };
            let mut sources = Vec::new();
            files(&path, &mut sources);
            for file in sources {
                let text = std::fs::read_to_string(&file).unwrap();
                for (used, line) in uses(&text) {
                    if rank(&used).is_some_and(|r| r > own) {
                        wrong.push(format!(
                            "{}:{line}: {name} uses {used}, a layer above it",
                            file.strip_prefix(&src).unwrap().display()
                        ));
                    }
                }
            }
        }
        assert_eq!(modules, ORDER.len(), "a module of ORDER is gone");
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    }

    #[test]
    fn uses_are_read_from_code_groups_and_root_exports_not_comments() {
        let text = "use crate::store::Storage;\n// crate::server\nlet x = crate::money::f(); // crate::app\n";
        let found: Vec<String> = uses(text).into_keys().collect();
        assert_eq!(found, ["money", "store"]);
        // Groups, and what the crate root re-exports.
        let text = "use crate::{auth::check, state::{State, X}};\nfn f(_: crate::Config) {}\n";
        let found: Vec<String> = uses(text).into_keys().collect();
        assert_eq!(found, ["auth", "config", "state"]);
    }
}
