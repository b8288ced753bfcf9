//! Per-request dispatch overhead of the plugin runtime, measured in-process:
//! fresh Store + instantiate (from InstancePre, pooling allocator) + call +
//! teardown, for a trivial plugin route.

mod common;

use marketplace::host_api::PaymentHeaders;
use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use marketplace::{App, Config};
use std::time::Instant;

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

#[test]
fn fresh_instance_dispatch_overhead_p50_under_50us_with_pooling() {
    let tmp = tempfile::tempdir().unwrap();
    let config = Config::load(
        None,
        &[],
        &[
            (
                "data_dir".into(),
                tmp.path().join("data").display().to_string(),
            ),
            (
                "plugins_dir".into(),
                common::plugins_dir().display().to_string(),
            ),
            ("testing_routes".into(), "true".into()),
        ],
    )
    .unwrap();
    let app = App::start(config).unwrap();
    assert!(
        app.runtime.is_pooling(),
        "instances must come from the pooling allocator"
    );

    for _ in 0..200 {
        assert_eq!(
            app.runtime
                .handle(&app, "testing", ok_request(), PaymentHeaders::default())
                .status,
            200
        );
    }
    let mut samples: Vec<u128> = (0..3000)
        .map(|_| {
            let req = ok_request();
            let t = Instant::now();
            let reply = app
                .runtime
                .handle(&app, "testing", req, PaymentHeaders::default());
            let ns = t.elapsed().as_nanos();
            assert_eq!(reply.status, 200);
            ns
        })
        .collect();
    samples.sort_unstable();
    let p50 = samples[samples.len() / 2] as f64 / 1000.0;
    let p99 = samples[samples.len() * 99 / 100] as f64 / 1000.0;
    eprintln!("dispatch overhead: p50 {p50:.1} us, p99 {p99:.1} us");
    assert!(
        p50 < 50.0,
        "p50 dispatch overhead {p50:.1} us is over 50 us"
    );
}
