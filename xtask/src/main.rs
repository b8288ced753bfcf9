//! Developer commands, run as `cargo xtask <command>`:
//!
//! - `build-plugins`: install the wasm32-wasip2 target if missing and build
//!   every plugin crate (each `plugins/*` crate with a `cdylib`) into
//!   `target/wasm32-wasip2/release/`.
//! - `serve [ARGS]`: build the plugins, then run the host on its defaults.
//! - `test [ARGS]`: build the plugins, then run every test of the workspace.
//! - `bench`: build the plugins, then run the benchmarks (see README).
//! - `ci`: format check, clippy with warnings denied, then `test`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    let result = match cmd {
        "build-plugins" => build_plugins(),
        "serve" => build_plugins().and_then(|_| {
            let mut a = vec!["run", "--release", "-p", "marketplace", "--", "serve"];
            a.extend(rest.iter().map(String::as_str));
            cargo(&a)
        }),
        "test" => build_plugins().and_then(|_| test(rest)),
        "bench" => build_plugins().and_then(|_| {
            let mut a = vec!["bench", "-p", "marketplace"];
            a.extend(rest.iter().map(String::as_str));
            cargo(&a)
        }),
        "ci" => cargo(&["fmt", "--all", "--", "--check"])
            .and_then(|_| build_plugins())
            .and_then(|_| {
                cargo(&[
                    "clippy",
                    "--release",
                    "--workspace",
                    "--all-targets",
                    "--",
                    "-D",
                    "warnings",
                ])
            })
            .and_then(|_| test(&[])),
        _ => {
            eprintln!(
                "usage: cargo xtask <build-plugins | serve [ARGS] | test [ARGS] | bench [ARGS] | ci>"
            );
            return if cmd == "help" {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            };
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

fn cargo(args: &[&str]) -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(cargo).args(args).current_dir(root()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

/// Plugin crates: directories under `plugins/` whose manifest builds a cdylib.
fn plugin_crates() -> Result<Vec<String>, String> {
    let dir = root().join("plugins");
    let mut crates = Vec::new();
    for entry in std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))? {
        let manifest = entry.map_err(|e| e.to_string())?.path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&manifest) else {
            continue;
        };
        if !text.contains("cdylib") {
            continue;
        }
        let name = text
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix("name = ")
                    .map(|v| v.trim_matches('"').to_string())
            })
            .ok_or_else(|| format!("{}: no package name", manifest.display()))?;
        crates.push(name);
    }
    crates.sort();
    Ok(crates)
}

fn ensure_wasm_target() -> Result<(), String> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match installed {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == "wasm32-wasip2") =>
        {
            Ok(())
        }
        Ok(_) => run(Command::new("rustup").args(["target", "add", "wasm32-wasip2"])),
        Err(e) => {
            eprintln!("xtask: rustup not found ({e}); assuming wasm32-wasip2 is installed");
            Ok(())
        }
    }
}

/// Every test: the host's unit and black-box tests, then the plugins' unit
/// tests natively (`--lib`: a plugin's cdylib only links for wasm32-wasip2).
fn test(extra: &[String]) -> Result<(), String> {
    let plugins = plugin_crates()?;
    let mut host = vec!["test", "--release", "--workspace"];
    for p in &plugins {
        host.extend(["--exclude", p.as_str()]);
    }
    host.extend(extra.iter().map(String::as_str));
    cargo(&host)?;
    let mut guests = vec!["test", "--release", "--lib"];
    for p in &plugins {
        guests.extend(["-p", p.as_str()]);
    }
    guests.extend(extra.iter().map(String::as_str));
    cargo(&guests)
}

fn build_plugins() -> Result<(), String> {
    ensure_wasm_target()?;
    let crates = plugin_crates()?;
    let mut args = vec!["build", "--release", "--target", "wasm32-wasip2"];
    for c in &crates {
        args.push("-p");
        args.push(c);
    }
    cargo(&args)
}
