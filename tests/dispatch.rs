//! Per-request dispatch overhead of the plugin runtime, measured in-process:
//! fresh Store + instantiate (from InstancePre, pooling allocator) + call +
//! teardown, for a trivial plugin route.

mod common;
#[path = "bench/support.rs"]
mod support;

use support::ok_request;

use marketplace::money::payments::PaymentHeaders;
use std::time::Instant;

#[test]
fn fresh_instance_dispatch_overhead_p50_under_50us_with_pooling() {
    let tmp = tempfile::tempdir().unwrap();
    let app = support::start_app(&tmp.path().join("data"), &common::plugins_dir(), true);
    assert!(
        app.runtime.is_pooling(),
        "instances must come from the pooling allocator"
    );

    for _ in 0..200 {
        assert_eq!(
            app.runtime
                .handle("testing", ok_request(), PaymentHeaders::default(), false)
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
                .handle("testing", req, PaymentHeaders::default(), false);
            let ns = t.elapsed().as_nanos();
            assert_eq!(reply.status, 200);
            ns
        })
        .collect();
    let (p50, p99) = support::p50_p99_us(&mut samples);
    eprintln!("dispatch overhead: p50 {p50:.1} us, p99 {p99:.1} us");
    assert!(
        p50 < 50.0,
        "p50 dispatch overhead {p50:.1} us is over 50 us"
    );
}
