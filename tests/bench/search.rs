//! Benchmark: index BENCH_POSTS generated posts (default 100,000) through
//! the real timeline plugin (each one a paid, signed, durably committed
//! request, from BENCH_WRITERS concurrent writers), then measure `GET /api/search` latency and throughput under
//! concurrent keep-alive load next to `GET /api/health` in the same run.
//!
//! Run: `cargo xtask bench` (or `cargo bench -p marketplace --bench search`
//! after `cargo xtask build-plugins`). Settings: BENCH_POSTS, BENCH_SECONDS
//! (default 5), BENCH_CONNECTIONS (default 32), BENCH_ROUNDS (default 3),
//! BENCH_WRITERS (default 16), BENCH_LIMIT (default 20), BENCH_KEEP=1
//! (keep the data dir, with the query paths in `search_paths.txt`, one a
//! line, for a run against the real binary: the warm-cache pairs in
//! README's "CPU per read once the cache is warm", `tests/bench/warm_cache.py`).

use ed25519_dalek::SigningKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

mod support;
use support::{env_or, load};

/// A deterministic pseudo-random generator (xorshift), so runs compare.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    /// Skewed towards small values: a few common words, many rare ones.
    fn zipfish(&mut self, n: usize) -> usize {
        let r = (self.next() % 1_000_000) as f64 / 1_000_000.0;
        ((r * r * r) * n as f64) as usize
    }
}

const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ne", "ru", "ta", "vo", "zi", "pe", "su", "do", "ga", "hi", "ju", "be", "fa",
];

fn word(i: usize) -> String {
    let mut w = String::new();
    let mut n = i + 16;
    while n > 0 {
        w.push_str(SYLLABLES[n % 16]);
        n /= 16;
    }
    w
}

fn main() {
    let posts = env_or("BENCH_POSTS", 100_000) as usize;
    let secs = env_or("BENCH_SECONDS", 5);
    let conns = env_or("BENCH_CONNECTIONS", 32);
    let vocabulary = 20_000;
    let tmp = tempfile::tempdir_in(support::bench_dir()).unwrap();
    let app = support::start_app(&tmp.path().join("data"), &support::built_plugins(), false);

    // One registered author.
    let secret = marketplace::server::admin::mint(&app, 100_000_000).unwrap();
    let key = SigningKey::from_bytes(&[42u8; 32]);
    support::register(&app, &key, &secret);

    // Indexing: BENCH_WRITERS concurrent writers (default 16), each paying
    // with its own chain of change, so posts share group commits.
    let writers = env_or("BENCH_WRITERS", 16) as usize;
    let w = app.storage.begin_write().unwrap();
    let funds: Vec<String> = (0..writers)
        .map(|_| app.ledger.mint(&w, 1_000_000 * 100_000_000).unwrap())
        .collect();
    app.storage.commit(w).unwrap();
    let key = Arc::new(key);
    let done = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let threads: Vec<_> = funds
        .into_iter()
        .enumerate()
        .map(|(wi, mut secret)| {
            let (app, key, done) = (app.clone(), key.clone(), done.clone());
            std::thread::spawn(move || {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ ((wi as u64 + 1) * 0x1000_0001));
                for i in (wi..posts).step_by(writers) {
                    let len = 20 + (rng.next() % 30) as usize;
                    let content: Vec<String> =
                        (0..len).map(|_| word(rng.zipfish(vocabulary))).collect();
                    let keywords: Vec<String> =
                        (0..3).map(|_| word(rng.zipfish(vocabulary))).collect();
                    let body = support::post_body(
                        &key,
                        &format!("{} #{i}", content.join(" ")),
                        &keywords,
                        app.now_ms() / 1000,
                    );
                    let (status, change) =
                        support::paid_call(&app, "timeline", "/api/timeline", &body, &secret);
                    assert_eq!(status, 201, "post {i}");
                    secret = change.expect("change");
                    let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if n % 10_000 == 0 {
                        eprintln!(
                            "indexed {n} posts in {:.1} s",
                            start.elapsed().as_secs_f64()
                        );
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let index_secs = start.elapsed().as_secs_f64();
    println!(
        "indexed {posts} posts (paid, signed, durable; {writers} writers, group commit) in {index_secs:.1} s: {:.0} posts/s",
        posts as f64 / index_secs
    );
    let mut rng = Rng(0x5EED);

    // Query terms across the frequency range: common, middling and rare words.
    let terms: Vec<String> = (0..500)
        .map(|i| {
            let rank = match i % 3 {
                0 => (rng.next() % 50) as usize,
                1 => 50 + (rng.next() % 2000) as usize,
                _ => 2000 + (rng.next() % 18_000) as usize,
            };
            format!(
                "/api/search?term={}&limit={}",
                word(rank),
                env_or("BENCH_LIMIT", 20)
            )
        })
        .collect();
    let paths: Vec<&str> = terms.iter().map(String::as_str).collect();
    if std::env::var_os("BENCH_KEEP").is_some() {
        std::fs::write(tmp.path().join("search_paths.txt"), terms.join("\n") + "\n").unwrap();
    }

    // The plugin call alone (no HTTP), one thread: where a search's time goes.
    let call = |path: &str| {
        let (route, query) = path.split_once('?').unwrap_or((path, ""));
        let req = support::get_request(route, query);
        let family = if route == "/api/info" {
            "info"
        } else {
            "search"
        };
        let t = Instant::now();
        let r = app.runtime.handle(family, req, Default::default(), false);
        assert_eq!(r.status, 200);
        t.elapsed().as_nanos() as u64
    };
    let per_call = |paths: &[&str]| {
        let mut all: Vec<u64> = (0..2_000).map(|i| call(paths[i % paths.len()])).collect();
        support::p50_p99_us(&mut all)
    };
    // `GET /api/info` is the baseline plugin call (health is the host's).
    let (h50, h99) = per_call(&["/api/info"]);
    let (s50, s99) = per_call(&paths);
    println!(
        "plugin call, no HTTP     : info p50 {h50:.0} us p99 {h99:.0} us; search p50 {s50:.0} us p99 {s99:.0} us"
    );

    let rt = support::runtime();
    rt.block_on(async move {
        let addr = support::serve(app).await;
        load(addr, &paths, 4, 1).await;
        // Health and search alternate, BENCH_ROUNDS times (default 3): a
        // shared machine drifts, and each ratio compares neighbours.
        let rounds = env_or("BENCH_ROUNDS", 3);
        println!(
            "load: {conns} keep-alive connections, {secs} s per run, {rounds} rounds, client in the same process"
        );
        let mut ratios = Vec::new();
        for round in 1..=rounds {
            let health = load(addr, &["/api/health"], conns, secs).await;
            let search = load(addr, &paths, conns, secs).await;
            health.print(&format!("GET /api/health (round {round})"));
            search.print(&format!("GET /api/search (round {round})"));
            ratios.push(health.rps / search.rps);
        }
        let single = load(addr, &paths, 1, secs).await;
        single.print("GET /api/search (1 conn)");
        ratios.sort_by(f64::total_cmp);
        println!(
            "health/search throughput: median {:.2}x (rounds: {})",
            ratios[ratios.len() / 2],
            ratios.iter().map(|r| format!("{r:.2}x")).collect::<Vec<_>>().join(", ")
        );
    });
    if std::env::var_os("BENCH_KEEP").is_some() {
        println!(
            "(kept: {}, its data/ and search_paths.txt)",
            tmp.keep().display()
        );
    }
}
