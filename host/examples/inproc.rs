//! Time one GET request of a plugin route through the runtime in-process,
//! without HTTP: a steadier figure for A/B comparisons of plugin and
//! storage work than whole-process CPU on a shared VM (one thread, nothing
//! else running).
//!
//! `cargo run --release -p marketplace --example inproc -- <data dir>
//! <path?query> <requests>`, e.g. `... /tmp/data
//! '/api/search?term=durable&limit=20' 5000`. The path is routed as the
//! server routes it. Plugins come from the workspace's built ones or
//! `PLUGINS_DIR`. Prints p10, p50 and mean over all but the first tenth of
//! the requests. The requests only read, but opening a data dir writes
//! (storage opens it as the server does, and the compile cache lives in
//! it unless `MARKETPLACE_CACHE_DIR` says otherwise): compare builds on
//! copies of one data dir.
//!
//! `INPROC_CONFIG=FILE` reads a config file too (the flags above still
//! win), e.g. one mounting another family with `[families.NAME]`.
//!
//! `INPROC_TOUCH_KB=N` (default 0) writes one byte in every
//! `INPROC_STRIDE` (default 64) of an N KiB buffer between requests,
//! untimed: what other work does to the caches and the TLB between two
//! calls, as the server's HTTP and kernel work does. A stride of 64 evicts
//! cache lines, a stride of 4096 mostly TLB entries.

use marketplace::money::payments::PaymentHeaders;
use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use marketplace::runtime::routes::{Handler, Match, canonical_path};
use marketplace::{App, Config};
use marketplace_common::url::parse_query;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [data, target, count] = &args[..] else {
        eprintln!("usage: inproc <data dir> <path?query> <requests>");
        std::process::exit(2);
    };
    let count: usize = count.parse().expect("a number of requests");
    let plugins = std::env::var("PLUGINS_DIR")
        .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../target/plugins").into());
    let flags = [
        ("data_dir", data.as_str()),
        ("plugins_dir", plugins.as_str()),
        ("testing_routes", "true"),
        ("log", "warn"),
    ]
    .map(|(k, v)| (k.to_string(), v.to_string()));
    // `MARKETPLACE_*` settings apply as for `serve` (say a small
    // `MARKETPLACE_MAX_INSTANCES`, so the instance pool's address space fits
    // under valgrind); the flags above win.
    let env: Vec<(String, String)> = std::env::vars().collect();
    // `INPROC_CONFIG=FILE`: a config file as `serve --config` reads it
    // (say `[families.NAME]` mounting a component of your own).
    let file = std::env::var_os("INPROC_CONFIG").map(std::path::PathBuf::from);
    let app = App::start(Config::load(file.as_deref(), &env, &flags).unwrap()).unwrap();
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let path = canonical_path(path);
    // `App::start` has loaded the families (or logged why one did not).
    let Match::Found { route, params } = app.runtime.find("GET", &path) else {
        eprintln!("no route for GET {path} (a family that did not load is named in the log)");
        std::process::exit(1);
    };
    let Handler::Family(family) = &route.handler else {
        eprintln!("GET {path} is a host route");
        std::process::exit(1);
    };
    let request = || Request {
        method: "GET".into(),
        route: route.pattern.clone(),
        path: path.clone(),
        params: params.clone(),
        query: parse_query(query).expect("a query of UTF-8"),
        headers: vec![],
        body: vec![],
    };
    let mut micros = Vec::with_capacity(count);
    let setting = |name: &str, default: usize| {
        std::env::var(name).map_or(default, |v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name} must be a whole number"))
        })
    };
    let mut sweep = vec![0u8; setting("INPROC_TOUCH_KB", 0) << 10];
    let stride = setting("INPROC_STRIDE", 64).max(1);
    for i in 0..count {
        for b in sweep.iter_mut().step_by(stride) {
            *b = b.wrapping_add(1);
        }
        std::hint::black_box(&mut sweep);
        let started = Instant::now();
        let reply = app
            .runtime
            .handle(family, request(), PaymentHeaders::default(), route.writes);
        if reply.status >= 300 {
            eprintln!("{}: {}", reply.status, String::from_utf8_lossy(&reply.body));
            std::process::exit(1);
        }
        if i >= count / 10 {
            micros.push(started.elapsed().as_secs_f64() * 1e6);
        }
    }
    micros.sort_by(f64::total_cmp);
    let mean = micros.iter().sum::<f64>() / micros.len().max(1) as f64;
    let at = |q: usize| micros.get(micros.len() * q / 100).copied().unwrap_or(0.0);
    println!(
        "GET {target}: {} timed requests, p10 {:.2} us, p50 {:.2} us, mean {mean:.2} us",
        micros.len(),
        at(10),
        at(50)
    );
    // Left as a crash would leave it: the next open recovers.
    std::process::exit(0);
}
