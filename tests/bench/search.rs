//! Benchmark: index BENCH_POSTS generated posts (default 100,000) through
//! the real timeline plugin (each one a paid, signed, durably committed
//! request), then measure `GET /api/search` latency and throughput under
//! concurrent keep-alive load next to `GET /api/health` in the same run.
//!
//! Run: `cargo xtask bench` (or `cargo bench -p marketplace --bench search`
//! after `cargo xtask build-plugins`). Settings: BENCH_POSTS, BENCH_SECONDS
//! (default 5), BENCH_CONNECTIONS (default 32).

use ed25519_dalek::SigningKey;
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
    let tmp =
        tempfile::tempdir_in(std::env::var("BENCH_DIR").unwrap_or_else(|_| ".".into())).unwrap();
    let app = support::start_app(&tmp.path().join("data"), &support::built_plugins(), false);

    // One author, paid for with a large minted secret whose change chains on.
    let mut secret = marketplace::admin::mint(&app, 1_000_000 * 100_000_000).unwrap();
    let key = SigningKey::from_bytes(&[42u8; 32]);
    secret = support::register(&app, &key, &secret);

    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let start = Instant::now();
    for i in 0..posts {
        let len = 20 + (rng.next() % 30) as usize;
        let content: Vec<String> = (0..len).map(|_| word(rng.zipfish(vocabulary))).collect();
        let keywords: Vec<String> = (0..3).map(|_| word(rng.zipfish(vocabulary))).collect();
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
        if (i + 1) % 10_000 == 0 {
            eprintln!(
                "indexed {} posts in {:.1} s",
                i + 1,
                start.elapsed().as_secs_f64()
            );
        }
    }
    let index_secs = start.elapsed().as_secs_f64();
    println!(
        "indexed {posts} posts (paid, signed, one durable commit each) in {index_secs:.1} s: {:.0} posts/s",
        posts as f64 / index_secs
    );

    // Query terms across the frequency range: common, middling and rare words.
    let terms: Vec<String> = (0..500)
        .map(|i| {
            let rank = match i % 3 {
                0 => (rng.next() % 50) as usize,
                1 => 50 + (rng.next() % 2000) as usize,
                _ => 2000 + (rng.next() % 18_000) as usize,
            };
            format!("/api/search?term={}&limit=20", word(rank))
        })
        .collect();
    let paths: Vec<&str> = terms.iter().map(String::as_str).collect();

    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let addr = support::serve(app).await;
        load(addr, &paths, 4, 1).await;
        let health = load(addr, &["/api/health"], conns, secs).await;
        let search = load(addr, &paths, conns, secs).await;
        let single = load(addr, &paths, 1, secs).await;
        println!("load: {conns} keep-alive connections, {secs} s each, client in the same process");
        health.print("GET /api/health");
        search.print("GET /api/search");
        single.print("GET /api/search (1 conn)");
        println!("health/search throughput: {:.2}x", health.rps / search.rps);
    });
}
