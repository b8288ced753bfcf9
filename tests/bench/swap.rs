//! Benchmark: hot reload. Measures the time from a fee component file change
//! in the watched plugins directory to the new version serving, and the
//! p99 latency of `GET /api/fees` under keep-alive load with and without
//! swaps happening.
//!
//! Run: `cargo xtask bench --bench swap`. Settings: BENCH_SECONDS (default
//! 5), BENCH_CONNECTIONS (default 16), BENCH_SWAPS (default 10).

use marketplace::{App, Config};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod load;
use load::load;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

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
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release");
    let plugins = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(&built).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().is_some_and(|e| e == "wasm") {
            std::fs::copy(&p, plugins.path().join(p.file_name().unwrap())).unwrap();
        }
    }
    let data = tempfile::tempdir().unwrap();
    let config = Config::load(
        None,
        &[],
        &[
            ("data_dir".into(), data.path().display().to_string()),
            ("plugins_dir".into(), plugins.path().display().to_string()),
            ("log".into(), "warn".into()),
        ],
    )
    .unwrap();
    let app = App::start(config).expect("start app (run `cargo xtask build-plugins` first)");
    marketplace::reload::spawn(app.clone()).unwrap();
    let target = plugins.path().join("fees_bid_inclusive.wasm");
    let versions = [
        built.join("fees_pickup_paid.wasm"),
        built.join("fees_bid_inclusive.wasm"),
    ];
    let policies = ["pickup-paid", "bid-inclusive"];

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let app2 = app.clone();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(marketplace::http::serve(
            app2.clone(),
            listener,
            std::future::pending(),
        ));
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
            "{swaps} swaps of the fee component through the watched directory (poll {:?})",
            marketplace::reload::POLL
        );
        println!(
            "file change -> new version serving: p50 {:?}, max {:?}",
            times[times.len() / 2],
            times[times.len() - 1]
        );
        println!(
            "GET /api/fees without swaps: {:>8.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us",
            quiet.rps, quiet.p50_us, quiet.p99_us
        );
        println!(
            "GET /api/fees during swaps : {:>8.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us",
            busy.rps, busy.p50_us, busy.p99_us
        );
        println!(
            "p99 during swaps / without: {:.2}x",
            busy.p99_us / quiet.p99_us
        );
    });
    drop(app);
}
