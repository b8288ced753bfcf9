//! Benchmark: the host's Ed25519 signature check (`auth::check_signature`:
//! the key from the cache of decompressed keys, `verify_strict` over a
//! post's signed message with its timestamp), as every signed request
//! makes it. Prints µs per check, for each of BENCH_ROUNDS (default 3)
//! rounds of BENCH_CHECKS (default 20,000) checks, on one thread.
//!
//! Run: `cargo bench -p marketplace --bench verify`.

use ed25519_dalek::{Signer, SigningKey};
use marketplace::auth::{Statement, check_signature};
use std::time::Instant;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let key = SigningKey::from_bytes(&[42u8; 32]);
    let actor = marketplace_common::hex::encode(key.verifying_key().as_bytes());
    // A post's signed message: the body's fields as PROTOCOL joins them.
    let message = format!(
        "post:{actor}:{}:",
        "a listing of about two hundred bytes ".repeat(6)
    );
    let timestamp = 1_795_316_645;
    let signed = format!("{message}:{timestamp}");
    let signature = marketplace_common::hex::encode(&key.sign(signed.as_bytes()).to_bytes());
    let statement = Statement {
        actor: &actor,
        message: &message,
        signature: &signature,
        timestamp: Some(timestamp),
    };
    assert!(check_signature(&statement).is_ok());
    let checks = env_or("BENCH_CHECKS", 20_000);
    for round in 1..=env_or("BENCH_ROUNDS", 3) {
        let start = Instant::now();
        for _ in 0..checks {
            std::hint::black_box(check_signature(std::hint::black_box(&statement))).unwrap();
        }
        let per = start.elapsed().as_secs_f64() * 1e6 / checks as f64;
        println!("round {round}: {per:.2} us per signature check ({checks} checks)");
    }
}
