//! The plugin runtime's two ways of running a call, in-process: handed to
//! a blocking thread (`Runtime::handle`, finished there without yielding)
//! and on an async worker (`Runtime::handle_inline`, yielding on epoch
//! ticks). Timings are the benchmarks' (`tests/bench/dispatch.rs`,
//! `tests/bench/external.rs`); these check behaviour.

mod common;
#[path = "bench/support.rs"]
mod support;

use marketplace::money::payments::PaymentHeaders;
use marketplace::runtime::Caller;
use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use support::ok_request;

fn get(route: &str) -> Request {
    Request {
        route: route.into(),
        path: route.into(),
        ..ok_request()
    }
}

#[test]
fn every_call_gets_a_fresh_pooled_instance_on_either_path() {
    let tmp = tempfile::tempdir().unwrap();
    let app = support::start_app(&tmp.path().join("data"), &common::plugins_dir(), true);
    assert!(
        app.runtime.is_pooling(),
        "instances must come from the pooling allocator"
    );
    assert!(app.runtime.runs_inline(false), "reads on redb run inline");
    assert!(
        app.runtime.runs_inline(true),
        "writes on redb run inline too (they wait for the batch as tasks)"
    );
    let one_by_one = support::start_app_with(
        &tmp.path().join("data2"),
        &common::plugins_dir(),
        true,
        &[("group_commit", "false")],
    );
    assert!(
        !one_by_one.runtime.runs_inline(true),
        "without group commit each commit's fsync holds the batch: writes are handed off"
    );
    drop(one_by_one);
    // Far more calls than the pool has slots: every instance goes back.
    let slots = app.config.max_instances as usize * 2 + 16;
    let rt = support::runtime();
    for i in 0..slots * 3 {
        // A trap now and then: the next call is served as if none happened.
        let (route, want) = if i % 97 == 0 {
            ("/_testing/trap", 500)
        } else {
            ("/_testing/ok", 200)
        };
        let blocking = app
            .runtime
            .handle("testing", get(route), PaymentHeaders::default(), false);
        assert_eq!(blocking.status, want, "blocking call {i}");
        let inline = rt.block_on(app.runtime.handle_inline(
            "testing",
            get(route),
            PaymentHeaders::default(),
            false,
            Caller::default(),
        ));
        assert_eq!(inline.status, want, "inline call {i}");
    }
}

#[test]
fn an_inline_call_that_spins_lets_the_workers_other_tasks_run_and_still_ends() {
    let tmp = tempfile::tempdir().unwrap();
    let app = support::start_app_with(
        &tmp.path().join("data"),
        &common::plugins_dir(),
        true,
        &[("request_timeout_ms", "2000")],
    );
    // One worker thread: without yields, nothing else runs until the
    // spinning call ends (its 2 s deadline leaves a loaded machine time to
    // get the call going and fire the other task's timer first).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let spin_done = Arc::new(AtomicBool::new(false));
    let (spin, ran_while_spinning) = rt.block_on(async {
        let (app2, done) = (app.clone(), spin_done.clone());
        let spinning = tokio::spawn(async move {
            let reply = app2
                .runtime
                .handle_inline(
                    "testing",
                    get("/_testing/loop"),
                    PaymentHeaders::default(),
                    false,
                    Caller::default(),
                )
                .await;
            done.store(true, Ordering::SeqCst);
            reply
        });
        // A timer fires only when the worker is let go: the plugin call
        // must have yielded (whichever task the scheduler polls first).
        let done = spin_done.clone();
        let other = tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            !done.load(Ordering::SeqCst)
        });
        (spinning.await.unwrap(), other.await.unwrap())
    });
    assert_eq!(spin.status, 503, "{}", String::from_utf8_lossy(&spin.body));
    assert!(
        ran_while_spinning,
        "another task on the worker ran while the plugin spun"
    );
}

#[test]
fn dispatched_requests_nest_only_so_deep() {
    // `POST /api/testing/relay` dispatches itself one level deeper (a
    // writing route may be its own family's dispatch target): the chain
    // ends where dispatches nest MAX_DISPATCH_DEPTH deep, with a 500 to
    // the last call, and every level above it answers.
    use marketplace::runtime::MAX_DISPATCH_DEPTH;
    let s = common::Server::testing();
    let r = s.post_json("/api/testing/relay", &serde_json::json!({"n": 0}));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut level = r.json();
    let mut depth = 0;
    while level["inner"]["status"] == 200 {
        assert_eq!(level["n"], depth, "{level}");
        level = level["inner"]["body"].clone();
        depth += 1;
    }
    assert_eq!(depth, u64::from(MAX_DISPATCH_DEPTH), "{level}");
    assert_eq!(level["inner"]["status"], 500, "{level}");
    assert_eq!(level["inner"]["body"]["code"], "internal", "{level}");
    // The refusal is logged (the line may come after the answer).
    s.wait_log("the depth refusal", |log| {
        log.contains("dispatched requests nest at most")
    });
    // The host still answers (no instance or slot was kept).
    assert_eq!(s.get("/_testing/ok").status, 200);
}
