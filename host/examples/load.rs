//! A closed-loop HTTP/1.1 load generator, run as its own process by
//! `tests/bench/external.rs` when `wrk` is not installed: one thread per
//! keep-alive connection (std `TcpStream`), each sending a request and
//! reading the whole answer before the next, for a fixed time.
//!
//! `load ADDR PATH CONNECTIONS SECONDS [REQUESTS]`: GETs of PATH, or, with a
//! REQUESTS file (one `secret<TAB>json body` per line, each used once), POSTs
//! of that body to PATH with `x-cash-secret: secret`. Prints one line:
//! `requests N errors E seconds S p50_us P p99_us Q` (errors: answers not
//! 2xx; they are counted in N as well).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

struct Shared {
    addr: String,
    path: String,
    posts: Vec<(String, String)>,
    next: AtomicUsize,
}

impl Shared {
    /// The next request, or None when the paid requests ran out.
    fn request(&self) -> Option<Vec<u8>> {
        if self.posts.is_empty() {
            return Some(format!("GET {} HTTP/1.1\r\nhost: bench\r\n\r\n", self.path).into_bytes());
        }
        let (secret, body) = self.posts.get(self.next.fetch_add(1, Ordering::Relaxed))?;
        Some(
            format!(
                "POST {} HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n\
                 x-cash-secret: {secret}\r\ncontent-length: {}\r\n\r\n{body}",
                self.path,
                body.len()
            )
            .into_bytes(),
        )
    }
}

/// Latencies (ns) and the count of answers that were not 2xx.
fn connection(shared: &Shared, until: Instant) -> (Vec<u64>, u64) {
    let mut stream = TcpStream::connect(&shared.addr).expect("connect");
    stream.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let (mut lat, mut errors) = (Vec::new(), 0);
    while Instant::now() < until {
        let Some(req) = shared.request() else { break };
        let t = Instant::now();
        stream.write_all(&req).expect("write");
        let mut have = 0;
        loop {
            let n = stream.read(&mut buf[have..]).expect("read");
            assert!(n > 0, "server closed the connection");
            have += n;
            let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            if !head.starts_with("http/1.1 2") {
                errors += 1;
            }
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("content-length");
            while have < end + 4 + len {
                let n = stream.read(&mut buf[have..]).expect("read body");
                assert!(n > 0, "server closed the connection");
                have += n;
            }
            break;
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    (lat, errors)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 4 {
        eprintln!("usage: load ADDR PATH CONNECTIONS SECONDS [REQUESTS]");
        std::process::exit(2);
    }
    let conns: usize = args[2].parse().expect("CONNECTIONS");
    let secs: f64 = args[3].parse().expect("SECONDS");
    let posts = match args.get(4) {
        Some(file) => std::fs::read_to_string(file)
            .expect("read REQUESTS")
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .map(|(s, b)| (s.to_string(), b.to_string()))
            .collect(),
        None => Vec::new(),
    };
    let shared = Arc::new(Shared {
        addr: args[0].trim_start_matches("http://").to_string(),
        path: args[1].clone(),
        posts,
        next: AtomicUsize::new(0),
    });
    let start = Instant::now();
    let until = start + Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let shared = shared.clone();
            std::thread::spawn(move || connection(&shared, until))
        })
        .collect();
    let (mut all, mut errors) = (Vec::new(), 0);
    for t in threads {
        let (lat, e) = t.join().expect("connection thread");
        all.extend(lat);
        errors += e;
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    let at = |q: usize| {
        all.get(all.len() * q / 100)
            .map_or(0.0, |&ns| ns as f64 / 1000.0)
    };
    println!(
        "requests {} errors {errors} seconds {elapsed:.3} p50_us {:.1} p99_us {:.1}",
        all.len(),
        at(50),
        at(99)
    );
}
