//! Developer commands, run as `cargo xtask <command>`:
//!
//! - `build-plugins [--lint]`: install the wasm targets if missing, build
//!   every plugin crate (each `plugins/*` crate with a `cdylib`) for its
//!   target (`wasm32-wasip2`, or what its `[package.metadata.marketplace]`
//!   says) with the `plugin` profile and copy the components into
//!   `target/plugins/`.
//! - `serve [--production] [ARGS]`: build the plugins, then run the host on
//!   its defaults (built with the `release` profile, or with `--production`
//!   the `production` one).
//! - `test [--lint] [ARGS]`: build the plugins, then run every test of the
//!   workspace; when PostgreSQL's server binaries are installed, against a
//!   throwaway cluster too (the multi-host tests, then the black-box suite
//!   once more with `MARKETPLACE_TEST_BACKEND=postgres`; see `test`).
//!
//!   `--lint` (CI's): the builds that plugins and tests need anyway are
//!   also clippy's, with warnings denied (clippy's driver as cargo's
//!   workspace wrapper: each workspace crate is linted as it is compiled,
//!   the plugins for wasm and everything natively, every target), so the
//!   dependencies are compiled once rather than once more for
//!   `cargo clippy`'s check build.
//! - `pg`: start a throwaway PostgreSQL cluster, print its
//!   `MARKETPLACE_TEST_PG=...` URL, and stop and remove it when standard
//!   input ends or a line is read (for running PostgreSQL tests by hand).
//! - `bench [--production] [ARGS]`: build the plugins, then run the
//!   benchmarks (see README); with `--production`, the whole-process bench
//!   runs the host built with the `production` profile.
//! - `ci`: format check, then `test --lint`.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (cmd, rest) = match args.split_first() {
        Some((c, r)) => (c.as_str(), r),
        None => ("help", &[][..]),
    };
    // `--lint` anywhere before a `--` (past it, the arguments are the test
    // binaries').
    let end = rest.iter().position(|a| a == "--").unwrap_or(rest.len());
    let lint = rest[..end].iter().any(|a| a == "--lint");
    let rest: Vec<String> = rest
        .iter()
        .enumerate()
        .filter(|&(i, a)| !(i < end && a == "--lint"))
        .map(|(_, a)| a.clone())
        .collect();
    let rest = &rest[..];
    if lint && !matches!(cmd, "build-plugins" | "test") {
        eprintln!("xtask: --lint is an option of build-plugins and test");
        return ExitCode::FAILURE;
    }
    let result = match cmd {
        "build-plugins" => lint_env(lint).and_then(|env| build_plugins(&env)),
        "serve" => build_plugins(&[]).and_then(|_| {
            // `--production`: the host built with the `production` profile
            // (whole-program optimization; a longer build).
            let (production, rest) = production_flag(rest);
            let profile = if production { "production" } else { "release" };
            let mut a = vec![
                "run",
                "--profile",
                profile,
                "-p",
                "marketplace",
                "--",
                "serve",
            ];
            a.extend(rest.iter().map(String::as_str));
            cargo(&a)
        }),
        "test" => lint_env(lint).and_then(|env| build_plugins(&env).and_then(|_| test(rest, &env))),
        "pg" => pg_shell(),
        "bench" => build_plugins(&[]).and_then(|_| {
            // `--production`: the benches that start the server binary
            // (`external`) start the one built with the `production`
            // profile, as deployed, instead of the release one the tests
            // use (unless BENCH_BIN names another).
            let (production, rest) = production_flag(rest);
            let mut env = Vec::new();
            if production {
                cargo(&["build", "--profile", "production", "-p", "marketplace"])?;
                if std::env::var_os("BENCH_BIN").is_none() {
                    let bin = target_dir()?.join("production").join("marketplace");
                    env.push(("BENCH_BIN", bin.to_string_lossy().into_owned()));
                }
            }
            // The whole-process bench runs these as processes of their own.
            if rest.iter().any(|a| a == "external") {
                cargo(&[
                    "build",
                    "--release",
                    "-p",
                    "marketplace",
                    "--example",
                    "hello",
                    "--example",
                    "load",
                ])?;
            }
            let mut a = vec!["bench", "-p", "marketplace"];
            a.extend(rest.iter().map(String::as_str));
            cargo_env(&a, &env)
        }),
        "ci" => cargo(&["fmt", "--all", "--", "--check"])
            .and_then(|_| lint_env(true))
            .and_then(|env| build_plugins(&env).and_then(|_| test(&[], &env))),
        _ => {
            eprintln!(
                "usage: cargo xtask <build-plugins [--lint] | serve [--production] [ARGS] | test [--lint] [ARGS] | pg | bench [--production] [ARGS] | ci>"
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

/// Whether `rest` starts with `--production` (`serve`'s and `bench`'s
/// option), and the arguments after it.
fn production_flag(rest: &[String]) -> (bool, &[String]) {
    match rest.split_first() {
        Some((flag, after)) if flag == "--production" => (true, after),
        _ => (false, rest),
    }
}

fn root() -> PathBuf {
    // `cargo run` (and so `cargo xtask`) names the manifest's directory at
    // run time too; prefer it, since checkouts that share one target dir
    // share the `xtask` binary, and the one built last would otherwise
    // point every checkout at its own tree.
    // (Only a directory named `xtask` is this crate's: a process of some
    // other package's, a test or a build script, names its own.)
    let dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .filter(|dir| dir.file_name().is_some_and(|name| name == "xtask"))
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    dir.parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// The cargo running xtask (or the one on PATH).
fn cargo_exe() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

/// The environment that makes cargo's builds clippy's too (`--lint`):
/// clippy's driver (beside the rustc of this toolchain) as the workspace
/// wrapper, with warnings denied, as `cargo clippy` sets it up for its
/// check builds. Dependencies are compiled by rustc alone; each workspace
/// crate by the driver, which lints it and then compiles it (with some
/// compiler options of clippy's own: the code does the same but is not
/// bit-identical, nor a build to measure; the benches build without
/// `--lint`).
/// Cargo keeps the wrapper in its fingerprints, so a build with it and one
/// without do not reuse each other's workspace crates (their
/// dependencies, yes).
fn lint_env(lint: bool) -> Result<Vec<(&'static str, String)>, String> {
    if !lint {
        return Ok(vec![]);
    }
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run {rustc} --print sysroot: {e}"))?;
    let sysroot = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let driver = Path::new(&sysroot)
        .join("bin")
        .join(format!("clippy-driver{}", std::env::consts::EXE_SUFFIX));
    if !out.status.success() || !driver.is_file() {
        return Err(format!(
            "--lint needs clippy ({} not found): rustup component add clippy",
            driver.display()
        ));
    }
    Ok(vec![
        ("RUSTC_WORKSPACE_WRAPPER", driver.display().to_string()),
        // `cargo clippy -- -D warnings`: its arguments, each followed by
        // this separator.
        (
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__".into(),
        ),
    ])
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

/// The target a plugin crate is built for unless its manifest names
/// another: std and WASI (wasi-libc) work as on any wasm32-wasip2 program.
const DEFAULT_TARGET: &str = "wasm32-wasip2";

/// Where `build-plugins` puts every component (what `plugins_dir`
/// defaults to in a checkout): `target/plugins/<crate>.wasm`.
const PLUGINS_OUT: &str = "plugins";
/// The profile components are built with (`Cargo.toml`: release with
/// whole-program optimization).
const PLUGIN_PROFILE: &str = "plugin";

/// A plugin crate: a package under `plugins/` that builds a cdylib.
struct Plugin {
    name: String,
    /// Its cdylib's name: the component is `<lib>.wasm`.
    lib: String,
    /// `[package.metadata.marketplace] target = "..."`, else
    /// [`DEFAULT_TARGET`]. The repository's own plugins (except `mcp`,
    /// whose script engine reads the clock, and the template authors start
    /// from) say `wasm32-unknown-unknown`: no C library, so the component
    /// imports no WASI (see `.cargo/config.toml`).
    target: String,
}

impl Plugin {
    /// The file cargo writes: `<target dir>/<target>/plugin/<lib>.wasm`
    /// (built with the workspace's `plugin` profile).
    fn built(&self) -> Result<PathBuf, String> {
        Ok(target_dir()?
            .join(&self.target)
            .join(PLUGIN_PROFILE)
            .join(format!("{}.wasm", self.lib)))
    }
}

/// `cargo metadata` of the workspace (asked once).
fn metadata() -> Result<&'static serde_json::Value, String> {
    static METADATA: std::sync::OnceLock<serde_json::Value> = std::sync::OnceLock::new();
    if let Some(meta) = METADATA.get() {
        return Ok(meta);
    }
    let out = Command::new(cargo_exe())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let meta =
        serde_json::from_slice(&out.stdout).map_err(|e| format!("reading cargo metadata: {e}"))?;
    Ok(METADATA.get_or_init(|| meta))
}

/// The workspace's target directory as cargo resolves it
/// (`CARGO_TARGET_DIR`, `build.target-dir`, else `target/`).
fn target_dir() -> Result<PathBuf, String> {
    metadata()?["target_directory"]
        .as_str()
        .map(PathBuf::from)
        .ok_or_else(|| "cargo metadata names no target directory".to_string())
}

/// The targets of a `cargo metadata` package whose `kind` lists `kind`.
fn targets_of<'a>(
    package: &'a serde_json::Value,
    kind: &'a str,
) -> impl Iterator<Item = &'a serde_json::Value> {
    package["targets"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |t| {
            t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == kind))
        })
}

/// The workspace's plugin crates, from `cargo metadata`.
fn plugin_crates() -> Result<Vec<Plugin>, String> {
    let meta = metadata()?;
    let plugins_dir = root().join("plugins");
    let mut crates = Vec::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let under_plugins = package["manifest_path"]
            .as_str()
            .is_some_and(|m| Path::new(m).starts_with(&plugins_dir));
        let cdylib = targets_of(package, "cdylib").next();
        let (true, Some(cdylib), Some(name)) = (under_plugins, cdylib, package["name"].as_str())
        else {
            continue;
        };
        crates.push(Plugin {
            name: name.to_string(),
            lib: cdylib["name"].as_str().unwrap_or(name).replace('-', "_"),
            target: package["metadata"]["marketplace"]["target"]
                .as_str()
                .unwrap_or(DEFAULT_TARGET)
                .to_string(),
        });
    }
    crates.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(crates)
}

fn ensure_wasm_targets(targets: &[&str]) -> Result<(), String> {
    let installed = match Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
    {
        Ok(out) => String::from_utf8_lossy(&out.stdout).into_owned(),
        Err(e) => {
            eprintln!("xtask: rustup not found ({e}); assuming {targets:?} are installed");
            return Ok(());
        }
    };
    let missing: Vec<&str> = targets
        .iter()
        .copied()
        .filter(|t| !installed.lines().any(|l| l.trim() == *t))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    run(Command::new("rustup")
        .args(["target", "add"])
        .args(&missing))
}

/// Every test: the host's unit and black-box tests, and the plugins' unit
/// tests natively (`--lib`: a plugin's cdylib only links for wasm), in one
/// cargo run so that they share one build (features are unified over the
/// selected packages: two selections would compile the shared crates
/// twice). `lint`: [`lint_env`]'s variables, or none; with them, every
/// target of the workspace (benches and examples too) is built and linted
/// first, then the tests run from that build.
///
/// PostgreSQL (issue 18): unless `MARKETPLACE_TEST_PG` already names a
/// server, a throwaway cluster is started under `target/` when PostgreSQL's
/// server binaries are installed, and its URL is handed to the tests as
/// `MARKETPLACE_TEST_PG` (the multi-host tests in `tests/scaleout.rs` use
/// it). Then the host's black-box test binaries run a second time with
/// `MARKETPLACE_TEST_BACKEND=postgres` (skip that with
/// `MARKETPLACE_TEST_PG_SUITE=0`). Without the binaries the PostgreSQL tests
/// are skipped, unless `MARKETPLACE_REQUIRE_PG=1`, then that is an error.
/// The cluster is stopped and removed at the end, whatever the outcome.
fn test(extra: &[String], lint: &[(&'static str, String)]) -> Result<(), String> {
    // The same packages for every run, so they share one build.
    let base = ["test", "--release", "--workspace"];
    if !lint.is_empty() {
        // Before any cluster starts: nothing runs from a build that fails.
        let mut all = base.to_vec();
        all.extend(["--all-targets", "--no-run"]);
        cargo_env(&all, lint)?;
    }
    let require = std::env::var("MARKETPLACE_REQUIRE_PG").is_ok_and(|v| v == "1");
    let mut cluster = None;
    let pg_url = match std::env::var("MARKETPLACE_TEST_PG") {
        Ok(url) if !url.is_empty() => {
            eprintln!("xtask: PostgreSQL tests against MARKETPLACE_TEST_PG={url}");
            Some(url)
        }
        _ => match pg_bindir() {
            Some(bin) => {
                let c = PgCluster::start(&bin)?;
                let url = c.url();
                eprintln!("xtask: PostgreSQL tests against a throwaway cluster: {url}");
                cluster = Some(c);
                Some(url)
            }
            None if require => {
                return Err(
                    "MARKETPLACE_REQUIRE_PG=1 but no PostgreSQL server binaries \
                     (initdb, pg_ctl) were found: install the `postgresql` package"
                        .into(),
                );
            }
            None => {
                eprintln!(
                    "xtask: PostgreSQL server binaries not found: the PostgreSQL tests are \
                     skipped (install the `postgresql` package to run them)"
                );
                None
            }
        },
    };
    let mut env: Vec<(&str, String)> = lint.to_vec();
    if let Some(url) = &pg_url {
        env.push(("MARKETPLACE_TEST_PG", url.clone()));
    }

    let mut failed = Vec::new();
    // Every test binary runs even when one fails.
    let no_fail_fast = if extra.iter().any(|a| a == "--no-fail-fast") {
        None
    } else {
        Some("--no-fail-fast")
    };
    let mut run = base.to_vec();
    run.extend(no_fail_fast);
    // The tests' targets (not the benches, which would run, nor doc tests:
    // the workspace's examples in docs are `ignore`d), unless the
    // arguments pick targets of their own.
    if !picks_targets(extra) {
        run.extend(["--lib", "--bins", "--tests"]);
    }
    run.extend(extra.iter().map(String::as_str));
    if let Err(e) = cargo_env(&run, &env) {
        failed.push(e);
    }

    let suite = std::env::var("MARKETPLACE_TEST_PG_SUITE").map_or(true, |v| v != "0");
    match (&pg_url, suite) {
        (Some(_), true) => {
            let binaries = black_box_tests()?;
            let mut again = base.to_vec();
            again.extend(no_fail_fast);
            for t in &binaries {
                again.extend(["--test", t.as_str()]);
            }
            again.extend(extra.iter().map(String::as_str));
            let mut env = env.clone();
            env.push(("MARKETPLACE_TEST_BACKEND", "postgres".into()));
            eprintln!(
                "xtask: the black-box suite again on the PostgreSQL backend \
                 (MARKETPLACE_TEST_PG_SUITE=0 skips this)"
            );
            let started = Instant::now();
            if let Err(e) = cargo_env(&again, &env) {
                failed.push(e);
            }
            eprintln!(
                "xtask: the suite on PostgreSQL took {:.0?}",
                started.elapsed()
            );
        }
        (Some(_), false) => {
            eprintln!("xtask: MARKETPLACE_TEST_PG_SUITE=0: the suite on PostgreSQL is skipped")
        }
        (None, _) => {}
    }
    if let Some(c) = cluster.take() {
        c.stop();
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("\n"))
    }
}

/// Whether `cargo test` arguments (before a `--`) choose targets
/// themselves (`--test http`, `--lib`, ...).
fn picks_targets(args: &[String]) -> bool {
    const FLAGS: &[&str] = &[
        "--lib",
        "--bins",
        "--bin",
        "--tests",
        "--test",
        "--examples",
        "--example",
        "--benches",
        "--bench",
        "--all-targets",
        "--doc",
    ];
    args.iter().take_while(|a| *a != "--").any(|a| {
        FLAGS
            .iter()
            .any(|f| a == f || a.strip_prefix(f).is_some_and(|r| r.starts_with('=')))
    })
}

/// `cargo xtask pg`: a cluster for running PostgreSQL tests by hand.
fn pg_shell() -> Result<(), String> {
    let bin = pg_bindir().ok_or("no PostgreSQL server binaries (initdb, pg_ctl) found")?;
    let c = PgCluster::start(&bin)?;
    println!("MARKETPLACE_TEST_PG={}", c.url());
    eprintln!("xtask: the cluster runs until standard input ends or a line is read");
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
    c.stop();
    Ok(())
}

/// The host's black-box test binaries: the `[[test]]` targets of
/// `host/Cargo.toml` that start `marketplace` processes (`Server::`), but
/// not `scaleout`, which is about PostgreSQL already.
fn black_box_tests() -> Result<Vec<String>, String> {
    let host = metadata()?["packages"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["name"] == "marketplace")
        .ok_or("cargo metadata lists no `marketplace` package")?;
    let mut out = Vec::new();
    for test in targets_of(host, "test") {
        let (Some(name), Some(path)) = (test["name"].as_str(), test["src_path"].as_str()) else {
            continue;
        };
        let source = std::fs::read_to_string(path).unwrap_or_default();
        if name != "scaleout" && source.contains("Server::") {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

fn cargo_env(args: &[&str], env: &[(&str, String)]) -> Result<(), String> {
    let mut cmd = Command::new(cargo_exe());
    cmd.args(args).current_dir(root());
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd)
}

/// The directory of PostgreSQL's server binaries (`initdb`, `pg_ctl`):
/// the newest `/usr/lib/postgresql/*/bin` (Debian, Ubuntu), else the one
/// `pg_config --bindir` names, else `initdb` on PATH.
fn pg_bindir() -> Option<PathBuf> {
    let usable = |d: &Path| d.join("initdb").is_file() && d.join("pg_ctl").is_file();
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse::<u32>().ok()?;
            Some((v, e.path().join("bin")))
        })
        .filter(|(_, d)| usable(d))
        .collect();
    versions.sort();
    if let Some((_, d)) = versions.pop() {
        return Some(d);
    }
    if let Ok(out) = Command::new("pg_config").arg("--bindir").output() {
        let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if out.status.success() && usable(&d) {
            return Some(d);
        }
    }
    std::env::var_os("PATH").and_then(|paths| std::env::split_paths(&paths).find(|d| usable(d)))
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A throwaway PostgreSQL cluster in `target/pg-test-<pid>` (trust auth,
/// user `marketplace`, database `marketplace`, TCP on 127.0.0.1 only).
/// Run as the `postgres` user when xtask runs as root (the server refuses
/// root). Stopped and removed by `stop` or on drop.
struct PgCluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    as_postgres: bool,
    stopped: bool,
}

impl PgCluster {
    fn start(bin: &Path) -> Result<PgCluster, String> {
        let target = target_dir()?;
        remove_stale_clusters(bin, &target);
        let mut dir = target.join(format!("pg-test-{}", std::process::id()));
        // The unix socket's path must fit in 107 bytes.
        if dir.as_os_str().len() > 80 {
            dir = std::env::temp_dir().join(format!("pg-test-{}", std::process::id()));
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut c = PgCluster {
            bin: bin.to_path_buf(),
            dir,
            port: 0,
            as_postgres: is_root(),
            stopped: false,
        };
        if c.as_postgres && !postgres_can_reach(&c.dir) {
            // A checkout under a private home (/root): the postgres user
            // cannot reach target/, so the cluster lives in the temp dir.
            let _ = std::fs::remove_dir_all(&c.dir);
            c.dir = std::env::temp_dir().join(format!("pg-test-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&c.dir);
            std::fs::create_dir_all(&c.dir).map_err(|e| format!("{}: {e}", c.dir.display()))?;
        }
        if c.as_postgres {
            run(Command::new("chown")
                .arg("-R")
                .arg("postgres:")
                .arg(&c.dir))
            .map_err(|e| format!("{e} (running as root, the cluster needs the `postgres` user that the Debian package creates)"))?;
        }
        let data = c.dir.join("data");
        c.run_as("initdb", |cmd| {
            cmd.arg("-D")
                .arg(&data)
                .args([
                    "-U",
                    "marketplace",
                    "--auth=trust",
                    "-E",
                    "UTF8",
                    "--locale=C",
                ])
                .args(["--no-sync", "--no-instructions"]);
        })?;
        // A free port: bind port 0, let it go, start on it; another process
        // may take it in between, so try a few.
        let mut last = String::new();
        for _ in 0..5 {
            c.port = free_port()?;
            let opts = format!(
                "-c listen_addresses=127.0.0.1 -p {} -k {} -c fsync=on -c max_connections=300",
                c.port,
                c.dir.display()
            );
            let log = c.dir.join("server.log");
            match c.run_as("pg_ctl", |cmd| {
                cmd.arg("-D")
                    .arg(&data)
                    .arg("-l")
                    .arg(&log)
                    .args(["-w", "-t", "120", "-o", &opts, "start"]);
            }) {
                Ok(()) => {
                    last.clear();
                    break;
                }
                Err(e) => {
                    last = format!("{e}\n{}", std::fs::read_to_string(&log).unwrap_or_default());
                    // Make sure nothing half-started keeps the data dir.
                    let _ = c.run_as("pg_ctl", |cmd| {
                        cmd.arg("-D").arg(&data).args(["-m", "immediate", "stop"]);
                    });
                }
            }
        }
        if !last.is_empty() {
            return Err(format!("the PostgreSQL test cluster did not start: {last}"));
        }
        let port = c.port.to_string();
        c.run_as("createdb", |cmd| {
            cmd.args([
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "marketplace",
                "marketplace",
            ]);
        })?;
        Ok(c)
    }

    fn url(&self) -> String {
        format!("postgres://marketplace@127.0.0.1:{}/marketplace", self.port)
    }

    /// Run one of the cluster's binaries, as `postgres` when root.
    fn run_as(&self, program: &str, args: impl FnOnce(&mut Command)) -> Result<(), String> {
        let exe = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(exe);
            c
        } else {
            Command::new(exe)
        };
        // Nothing of the caller's libpq settings applies here.
        for var in [
            "PGHOST",
            "PGPORT",
            "PGUSER",
            "PGDATABASE",
            "PGPASSWORD",
            "PGDATA",
        ] {
            cmd.env_remove(var);
        }
        cmd.current_dir(&self.dir);
        args(&mut cmd);
        run(&mut cmd)
    }

    fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let data = self.dir.join("data");
        if self.port != 0
            && let Err(e) = self.run_as("pg_ctl", |cmd| {
                cmd.arg("-D")
                    .arg(&data)
                    .args(["-w", "-t", "60", "-m", "fast", "stop"]);
            })
        {
            eprintln!("xtask: stopping the PostgreSQL test cluster: {e}");
        }
        match std::fs::remove_dir_all(&self.dir) {
            Ok(()) => eprintln!("xtask: PostgreSQL test cluster stopped and removed"),
            Err(e) => eprintln!("xtask: removing {}: {e}", self.dir.display()),
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Clusters left by an xtask that was killed (its pid is gone): stopped
/// and removed.
fn remove_stale_clusters(bin: &Path, target: &Path) {
    let Ok(entries) = std::fs::read_dir(target) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("pg-test-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let stale = PgCluster {
            bin: bin.to_path_buf(),
            dir: entry.path(),
            port: u16::from(entry.path().join("data").join("postmaster.pid").exists()),
            as_postgres: is_root(),
            stopped: false,
        };
        eprintln!(
            "xtask: removing a stale test cluster {}",
            stale.dir.display()
        );
        stale.stop();
    }
}

/// Whether the `postgres` user can enter every directory above `dir`.
fn postgres_can_reach(dir: &Path) -> bool {
    let Some(parent) = dir.parent() else {
        return false;
    };
    Command::new("runuser")
        .args(["-u", "postgres", "--", "test", "-x"])
        .arg(parent)
        .status()
        .is_ok_and(|s| s.success())
}

fn free_port() -> Result<u16, String> {
    let l =
        std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding a port: {e}"))?;
    let port = l.local_addr().map_err(|e| e.to_string())?.port();
    drop(l);
    // Let the kernel forget the socket before the server binds it.
    std::thread::sleep(Duration::from_millis(10));
    Ok(port)
}

/// Build every plugin crate for its target, then copy each component into
/// `target/plugins/` (through a `.part` file and a rename, so a server
/// watching that directory never loads half a file; unchanged files are
/// left alone, so it reloads only what changed) and remove the components
/// no crate builds any more. `env`: [`lint_env`]'s, or none.
fn build_plugins(env: &[(&str, String)]) -> Result<(), String> {
    let crates = plugin_crates()?;
    let mut targets: Vec<&str> = crates.iter().map(|p| p.target.as_str()).collect();
    targets.sort();
    targets.dedup();
    ensure_wasm_targets(&targets)?;
    for target in &targets {
        let mut args = vec!["build", "--profile", PLUGIN_PROFILE, "--target", target];
        for c in crates.iter().filter(|c| c.target == *target) {
            args.extend(["-p", c.name.as_str()]);
        }
        cargo_env(&args, env)?;
    }
    let out = target_dir()?.join(PLUGINS_OUT);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    for c in &crates {
        let built = c.built()?;
        let bytes = std::fs::read(&built).map_err(|e| format!("{}: {e}", built.display()))?;
        let file = out.join(built.file_name().expect("a file name"));
        if std::fs::read(&file).is_ok_and(|old| old == bytes) {
            continue;
        }
        let part = file.with_extension("wasm.part");
        std::fs::write(&part, &bytes)
            .and_then(|()| std::fs::rename(&part, &file))
            .map_err(|e| format!("{}: {e}", file.display()))?;
    }
    // A renamed or removed crate's component (or a write cut short) would
    // otherwise stay and could be configured by mistake; subdirectories
    // (`families/`) are an operator's.
    let current: Vec<String> = crates.iter().map(|c| format!("{}.wasm", c.lib)).collect();
    for entry in std::fs::read_dir(&out).map_err(|e| format!("{}: {e}", out.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let ours = name.ends_with(".wasm") || name.ends_with(".wasm.part");
        if path.is_file() && ours && !current.iter().any(|c| c == name) {
            std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::picks_targets;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn target_flags_are_told_from_other_arguments() {
        assert!(picks_targets(&args(&["--test", "http"])));
        assert!(picks_targets(&args(&["--test=http"])));
        assert!(picks_targets(&args(&["-p", "marketplace", "--lib"])));
        assert!(!picks_targets(&args(&[])));
        assert!(!picks_targets(&args(&["-p", "marketplace", "idempotency"])));
        // `--testing` is no target flag; past `--`, arguments are the test
        // binaries'.
        assert!(!picks_targets(&args(&["--testing"])));
        assert!(!picks_targets(&args(&["--", "--test"])));
    }
}
