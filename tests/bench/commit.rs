//! Benchmark: durable paid posts per second over HTTP at concurrency 1, 8
//! and 64, with group commit on and with the one-commit-per-request
//! baseline (`group_commit = false`), next to the disk's raw fsync rate
//! measured in the same run and directory.
//!
//! Every post is a real `POST /api/timeline`: signed (fresh timestamp,
//! single-use), paid with its own minted secret (spent, change issued),
//! indexed for search, and answered 201 only once durable.
//!
//! Run: `cargo xtask bench --bench commit`. Settings: BENCH_SECONDS (default
//! 5 per row), BENCH_ROWS (e.g. "group:64,baseline:64"),
//! BENCH_COMMIT_MAX_BATCH (default 32, the service default), BENCH_DIR (where the databases go; default: the workspace
//! root, so the disk under test is the one the service would use).

use ed25519_dalek::SigningKey;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

mod support;
use support::{MakeRequest, env_or, load_with};

/// Raw fdatasync rate of a 4 KiB overwrite in `dir`, for one second.
fn fsync_rate(dir: &std::path::Path) -> f64 {
    let path = dir.join("fsync.probe");
    let mut f = std::fs::File::create(&path).unwrap();
    let block = [7u8; 4096];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < Duration::from_secs(1) {
        use std::io::Seek;
        f.seek(std::io::SeekFrom::Start(0)).unwrap();
        f.write_all(&block).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    std::fs::remove_file(&path).ok();
    n as f64 / start.elapsed().as_secs_f64()
}

/// CPU seconds (user + system) this process has used (Linux /proc).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of the line (11, 12 after the name).
    (ticks(11) + ticks(12)) / 100.0
}

/// One row: a fresh host, `conns` connections posting for `secs` seconds.
fn row(group: bool, conns: u64, secs: u64, base: &std::path::Path) -> support::Run {
    let dir = tempfile::tempdir_in(base).unwrap();
    let max_batch = std::env::var("BENCH_COMMIT_MAX_BATCH").unwrap_or_else(|_| "32".into());
    let app = support::start_app_with(
        &dir.path().join("data"),
        &support::built_plugins(),
        false,
        &[
            ("group_commit", if group { "true" } else { "false" }),
            ("commit_max_batch", &max_batch),
        ],
    );
    // Secrets minted up front in one transaction, one per post.
    let key = SigningKey::from_bytes(&[42u8; 32]);
    let budget = 6_000 * secs as usize;
    let w = app.storage.begin_write().unwrap();
    let funding = app.ledger.mint(&w, 100 * 100_000_000).unwrap();
    let secrets: Vec<String> = (0..budget)
        .map(|_| app.ledger.mint(&w, 100_000_000).unwrap())
        .collect();
    app.storage.commit(w).unwrap();
    support::register(&app, &key, &funding);

    let secrets = Arc::new(secrets);
    let next = Arc::new(AtomicUsize::new(0));
    let clock = app.clone();
    let make: MakeRequest = Arc::new(move |conn, i| {
        let n = next.fetch_add(1, Ordering::Relaxed);
        let secret = secrets.get(n).expect("minted enough secrets");
        let content = format!("bench post {conn}/{i}: durable paid writes, batch {n}");
        let body = support::post_body(&key, &content, &[], clock.now_ms() / 1000).to_string();
        format!(
            "POST /api/timeline HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
             x-cash-secret: {secret}\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
        .into_bytes()
    });
    let rt = support::runtime();
    let (commits0, syncs0) = (app.storage.commits(), app.storage.syncs());
    let cpu0 = cpu_seconds();
    let run = rt.block_on(async {
        let addr = support::serve(app.clone()).await;
        load_with(addr, conns, secs, 201, make).await
    });
    let cores = (cpu_seconds() - cpu0) / secs as f64;
    let commits = app.storage.commits() - commits0;
    let syncs = app.storage.syncs() - syncs0;
    let label = format!(
        "{} c={conns}",
        if group { "group commit" } else { "baseline" }
    );
    run.print(&label);
    println!(
        "{:<26}  {commits} commits in {syncs} fsyncs ({:.1} per fsync), {cores:.2} cores busy",
        "",
        commits as f64 / syncs.max(1) as f64
    );
    rt.shutdown_timeout(Duration::from_secs(1));
    run
}

fn main() {
    let secs = env_or("BENCH_SECONDS", 5);
    let base = support::bench_dir();
    // A child run measures one row (fresh process, fresh database).
    if let Ok(row_name) = std::env::var("BENCH_ROW") {
        let (mode, conns) = row_name.split_once(':').expect("BENCH_ROW=mode:conns");
        row(
            mode == "group",
            conns.parse().expect("connections"),
            secs,
            &base,
        );
        return;
    }
    let probe = tempfile::tempdir_in(&base).unwrap();
    println!(
        "raw fdatasync rate (4 KiB overwrite): {:.0}/s",
        fsync_rate(probe.path())
    );
    println!("paid signed posts over HTTP, {secs} s per row, client in the same process:");
    // BENCH_ROWS picks rows, e.g. "group:64,baseline:1" (default: all six).
    let rows = std::env::var("BENCH_ROWS").unwrap_or_default();
    for conns in [1, 8, 64] {
        for mode in ["baseline", "group"] {
            let name = format!("{mode}:{conns}");
            if rows.is_empty() || rows.split(',').any(|r| r.trim() == name) {
                // Each row in its own process, so no row inherits another's
                // threads or dirty pages.
                let status = std::process::Command::new(std::env::current_exe().unwrap())
                    .env("BENCH_ROW", &name)
                    .status()
                    .expect("running a row");
                assert!(status.success(), "row {name} failed");
            }
        }
    }
    println!(
        "raw fdatasync rate (again, after the runs): {:.0}/s",
        fsync_rate(probe.path())
    );
}
