//! Benchmark: a trivial plugin route (`GET /_testing/ok`, fresh instance per
//! request) against a native hyper handler returning the same JSON
//! (`GET /_testing/native`), in the same server process, under concurrent
//! keep-alive load; plus the in-process dispatch overhead
//! (store + instantiate + call + teardown).
//!
//! Run: `cargo xtask bench` (or `cargo bench -p marketplace --bench dispatch`
//! after `cargo xtask build-plugins`). Settings: BENCH_SECONDS (default 5),
//! BENCH_CONNECTIONS (default 32).

use marketplace::host_api::PaymentHeaders;
use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use marketplace::{App, Config};
use std::path::PathBuf;
use std::time::Instant;

mod load;
use load::load;

fn plugins_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release")
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ok_request() -> Request {
    Request {
        method: "GET".into(),
        route: "/_testing/ok".into(),
        path: "/_testing/ok".into(),
        params: vec![],
        query: vec![],
        headers: vec![],
        body: vec![],
    }
}

fn main() {
    let secs = env_or("BENCH_SECONDS", 5);
    let conns = env_or("BENCH_CONNECTIONS", 32);
    let tmp = tempfile::tempdir().unwrap();
    let config = Config::load(
        None,
        &[],
        &[
            (
                "data_dir".into(),
                tmp.path().join("data").display().to_string(),
            ),
            ("plugins_dir".into(), plugins_dir().display().to_string()),
            ("testing_routes".into(), "true".into()),
            ("log".into(), "warn".into()),
        ],
    )
    .unwrap();
    let app = App::start(config).expect("start app (run `cargo xtask build-plugins` first)");

    // In-process dispatch overhead.
    for _ in 0..500 {
        app.runtime
            .handle(&app, "testing", ok_request(), PaymentHeaders::default());
    }
    let mut ns: Vec<u128> = (0..20_000)
        .map(|_| {
            let r = ok_request();
            let t = Instant::now();
            let reply = app
                .runtime
                .handle(&app, "testing", r, PaymentHeaders::default());
            assert_eq!(reply.status, 200);
            t.elapsed().as_nanos()
        })
        .collect();
    ns.sort_unstable();
    println!(
        "dispatch overhead (fresh instance per call, pooling={}): p50 {:.1} us, p99 {:.1} us",
        app.runtime.is_pooling(),
        ns[ns.len() / 2] as f64 / 1000.0,
        ns[ns.len() * 99 / 100] as f64 / 1000.0
    );

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(marketplace::http::serve(
            app,
            listener,
            std::future::pending(),
        ));
        // Warm up both paths.
        load(addr, &["/_testing/native"], 4, 1).await;
        load(addr, &["/_testing/ok"], 4, 1).await;
        let native = load(addr, &["/_testing/native"], conns, secs).await;
        let plugin = load(addr, &["/_testing/ok"], conns, secs).await;
        println!(
            "load: {conns} keep-alive connections, {secs} s per route, client in the same process"
        );
        println!(
            "native hyper handler : {:>9.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us",
            native.rps, native.p50_us, native.p99_us
        );
        println!(
            "plugin route         : {:>9.0} req/s  p50 {:>7.1} us  p99 {:>7.1} us",
            plugin.rps, plugin.p50_us, plugin.p99_us
        );
        println!("plugin/native throughput: {:.2}x", plugin.rps / native.rps);
    });
}
