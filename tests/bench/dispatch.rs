//! Benchmark: a trivial plugin route (`GET /_testing/ok`, fresh instance per
//! request) against a native hyper handler returning the same JSON
//! (`GET /_testing/native`), in the same server process, under concurrent
//! keep-alive load; plus the in-process dispatch overhead
//! (store + instantiate + call + teardown).
//!
//! Run: `cargo xtask bench` (or `cargo bench -p marketplace --bench dispatch`
//! after `cargo xtask build-plugins`). Settings: BENCH_SECONDS (default 5),
//! BENCH_CONNECTIONS (default 32).

use marketplace::money::payments::PaymentHeaders;
use std::time::Instant;

mod support;
use support::{env_or, load, ok_request};

fn main() {
    let secs = env_or("BENCH_SECONDS", 5);
    let conns = env_or("BENCH_CONNECTIONS", 32);
    let tmp = tempfile::tempdir().unwrap();
    let app = support::start_app(&tmp.path().join("data"), &support::built_plugins(), true);

    // In-process dispatch overhead.
    for _ in 0..500 {
        app.runtime
            .handle("testing", ok_request(), PaymentHeaders::default(), false);
    }
    let mut ns: Vec<u128> = (0..20_000)
        .map(|_| {
            let r = ok_request();
            let t = Instant::now();
            let reply = app
                .runtime
                .handle("testing", r, PaymentHeaders::default(), false);
            assert_eq!(reply.status, 200);
            t.elapsed().as_nanos()
        })
        .collect();
    let (p50, p99) = support::p50_p99_us(&mut ns);
    println!(
        "dispatch overhead (fresh instance per call, pooling={}): p50 {p50:.1} us, p99 {p99:.1} us",
        app.runtime.is_pooling(),
    );

    let rt = support::runtime();
    rt.block_on(async move {
        let addr = support::serve(app).await;
        // Warm up both paths.
        load(addr, &["/_testing/native"], 4, 1).await;
        load(addr, &["/_testing/ok"], 4, 1).await;
        let native = load(addr, &["/_testing/native"], conns, secs).await;
        let plugin = load(addr, &["/_testing/ok"], conns, secs).await;
        println!(
            "load: {conns} keep-alive connections, {secs} s per route, client in the same process"
        );
        native.print("native hyper handler");
        plugin.print("plugin route");
        println!("plugin/native throughput: {:.2}x", plugin.rps / native.rps);
    });
}
