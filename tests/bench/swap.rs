//! Benchmark: hot reload. Measures the time from a fee component file change
//! in the watched plugins directory to the new version serving, and the
//! p99 latency of `GET /api/fees` under keep-alive load with and without
//! swaps happening.
//!
//! Run: `cargo xtask bench --bench swap`. Settings: BENCH_SECONDS (default
//! 5), BENCH_CONNECTIONS (default 16), BENCH_SWAPS (default 10).

use marketplace::App;
use std::path::Path;
use std::time::{Duration, Instant};

mod support;
use support::{env_or, load};

/// Write aside, then rename: how an operator replaces a component.
fn install(from: &Path, to: &Path) {
    let tmp = to.with_extension("part");
    std::fs::copy(from, &tmp).unwrap();
    std::fs::rename(&tmp, to).unwrap();
}

fn policy(app: &App) -> String {
    app.runtime.fee_policy()
}

fn main() {
    let secs = env_or("BENCH_SECONDS", 5);
    let conns = env_or("BENCH_CONNECTIONS", 16);
    let swaps = env_or("BENCH_SWAPS", 10);
    let built = support::built_plugins();
    let plugins = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&built).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "wasm") {
            std::fs::copy(&p, plugins.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let data = tempfile::tempdir().unwrap();
    let app = support::start_app(data.path(), plugins.path(), false);
    marketplace::runtime::reload::spawn(
        app.runtime.clone(),
        Default::default(),
        Default::default(),
    )
    .unwrap();
    let target = plugins.path().join("fees_bid_inclusive.wasm");
    let versions = [
        built.join("fees_pickup_paid.wasm"),
        built.join("fees_bid_inclusive.wasm"),
    ];
    let policies = ["pickup-paid", "bid-inclusive"];

    let rt = support::runtime();
    let app2 = app.clone();
    rt.block_on(async move {
        let addr = support::serve(app2.clone()).await;
        load(addr, &["/api/fees"], 4, 1).await;
        let quiet = load(addr, &["/api/fees"], conns, secs).await;

        // Swaps on a blocking thread while the load runs.
        let swapper = {
            let app = app2.clone();
            tokio::task::spawn_blocking(move || {
                let mut times = Vec::new();
                let pause = Duration::from_millis(secs * 1000 / (swaps + 1));
                for i in 0..swaps as usize {
                    std::thread::sleep(pause);
                    let start = Instant::now();
                    install(&versions[i % 2], &target);
                    while policy(&app) != policies[i % 2] {
                        assert!(
                            start.elapsed() < Duration::from_secs(10),
                            "swap {i} never served"
                        );
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    times.push(start.elapsed());
                }
                times
            })
        };
        let busy = load(addr, &["/api/fees"], conns, secs).await;
        let mut times = swapper.await.unwrap();
        times.sort();
        println!(
            "{swaps} swaps of the fee component through the watched directory (notifications; fallback poll {:?})",
            marketplace::runtime::reload::POLL
        );
        println!(
            "file change -> new version serving: p50 {:?}, max {:?}",
            times[times.len() / 2],
            times[times.len() - 1]
        );
        quiet.print("GET /api/fees without swaps");
        busy.print("GET /api/fees during swaps");
        println!(
            "p99 during swaps / without: {:.2}x",
            busy.p99_us / quiet.p99_us
        );
    });
    drop(app);
}
