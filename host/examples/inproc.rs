//! Time one GET route through the runtime in-process, without HTTP: a
//! steadier figure for A/B comparisons of plugin and storage work than
//! whole-process CPU on a shared VM (one thread, nothing else running).
//!
//! `cargo run --release -p marketplace --example inproc -- <data dir>
//! <family> <route> <query> <requests>`, e.g. `... /tmp/data search
//! /api/search 'term=durable&limit=20' 5000`; the query is `k=v&...`
//! taken as it is (not URL-decoded). Plugins come from the workspace's
//! built ones or `PLUGINS_DIR`. Prints p10, p50 and mean over all but the
//! first tenth of the requests.

use marketplace::money::payments::PaymentHeaders;
use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use marketplace::{App, Config};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, family, route, query, count] = &args[..] else {
        eprintln!("usage: inproc <data dir> <family> <route> <query> <requests>");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("a number of requests");
    let plugins = std::env::var("PLUGINS_DIR").unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/wasm32-wasip2/release"
        )
        .into()
    });
    let flags = [
        ("data_dir", data.as_str()),
        ("plugins_dir", plugins.as_str()),
        ("testing_routes", "true"),
        ("log", "warn"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    let app = App::start(Config::load(None, &[], &flags).unwrap()).unwrap();
    let query: Vec<(String, String)> = query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.into(), v.into()))
        .collect();
    let request = || Request {
        method: "GET".into(),
        route: route.clone(),
        path: route.clone(),
        params: vec![],
        query: query.clone(),
        headers: vec![],
        body: vec![],
    };
    // The families load in the background: wait for this one.
    while app
        .runtime
        .handle(family, request(), PaymentHeaders::default(), false)
        .status
        == 503
    {
        if let Some(error) = app.runtime.load_error(family) {
            eprintln!("the {family} family did not load: {error}");
            std::process::exit(1);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut micros = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        let reply = app
            .runtime
            .handle(family, request(), PaymentHeaders::default(), false);
        assert_eq!(
            reply.status,
            200,
            "{}",
            String::from_utf8_lossy(&reply.body)
        );
        if i >= count / 10 {
            micros.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.sort_by(f64::total_cmp);
    let mean = micros.iter().sum::<f64>() / micros.len().max(1) as f64;
    let at = |q: usize| micros.get(micros.len() * q / 100).copied().unwrap_or(0.0);
    println!(
        "{family} {route}: {} timed requests, p10 {:.2} us, p50 {:.2} us, mean {mean:.2} us",
        micros.len(),
        at(10),
        at(50)
    );
    // Not a clean stop: the data dir is left as a crash would.
    std::process::exit(0);
}
