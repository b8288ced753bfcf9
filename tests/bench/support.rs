//! Shared by the benchmarks (and the dispatch test): settings from the
//! environment, an in-process host on the built plugins, and a keep-alive
//! HTTP/1.1 load generator.
#![allow(dead_code)]

use marketplace::runtime::bindings::endpoint::marketplace::plugin::types::Request;
use marketplace::{App, Config};
use std::path::{Path, PathBuf};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Keep-alive GETs on one connection until `until`; returns latencies (ns).
async fn client(
    addr: SocketAddr,
    paths: Arc<Vec<String>>,
    offset: usize,
    until: Instant,
) -> Vec<u64> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut lat = Vec::new();
    let mut i = offset;
    while Instant::now() < until {
        let req = format!(
            "GET {} HTTP/1.1\r\nhost: bench\r\n\r\n",
            paths[i % paths.len()]
        );
        i += 1;
        let t = Instant::now();
        stream.write_all(req.as_bytes()).await.expect("write");
        // Read one response: headers, then content-length bytes.
        let mut have = 0;
        loop {
            let n = stream.read(&mut buf[have..]).await.expect("read");
            assert!(n > 0, "server closed the connection");
            have += n;
            if let Some(end) = buf[..have].windows(4).position(|w| w == b"\r\n\r\n") {
                let head = std::str::from_utf8(&buf[..end])
                    .unwrap()
                    .to_ascii_lowercase();
                assert!(head.starts_with("http/1.1 200"), "{head}");
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap();
                while have < end + 4 + len {
                    let n = stream.read(&mut buf[have..]).await.expect("read body");
                    assert!(n > 0);
                    have += n;
                }
                break;
            }
        }
        lat.push(t.elapsed().as_nanos() as u64);
    }
    lat
}

pub struct Run {
    pub rps: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

/// Drive `conns` keep-alive connections for `secs` seconds, cycling through
/// `paths` (each connection starts at a different one).
pub async fn load(addr: SocketAddr, paths: &[&str], conns: u64, secs: u64) -> Run {
    let paths: Arc<Vec<String>> = Arc::new(paths.iter().map(|p| p.to_string()).collect());
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..conns)
        .map(|c| tokio::spawn(client(addr, paths.clone(), c as usize * 7919, until)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    all.sort_unstable();
    Run {
        rps: all.len() as f64 / elapsed,
        p50_us: all[all.len() / 2] as f64 / 1000.0,
        p99_us: all[all.len() * 99 / 100] as f64 / 1000.0,
    }
}

impl Run {
    /// One result line: `label: req/s p50 p99`.
    pub fn print(&self, label: &str) {
        println!(
            "{label:<26}: {:>9.0} req/s  p50 {:>8.1} us  p99 {:>8.1} us",
            self.rps, self.p50_us, self.p99_us
        );
    }
}

/// A numeric setting from the environment.
pub fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Where `cargo xtask build-plugins` puts the components.
pub fn built_plugins() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/wasm32-wasip2/release")
}

/// Start a host in-process on `data_dir` and `plugins_dir`.
pub fn start_app(data_dir: &Path, plugins_dir: &Path, testing_routes: bool) -> Arc<App> {
    let config = Config::load(
        None,
        &[],
        &[
            ("data_dir".into(), data_dir.display().to_string()),
            ("plugins_dir".into(), plugins_dir.display().to_string()),
            ("testing_routes".into(), testing_routes.to_string()),
            ("log".into(), "warn".into()),
        ],
    )
    .unwrap();
    App::start(config).expect("start app (run `cargo xtask build-plugins` first)")
}

/// Serve `app` over HTTP on a free loopback port.
pub async fn serve(app: Arc<App>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(marketplace::http::serve(
        app,
        listener,
        std::future::pending(),
    ));
    addr
}

/// The trivial plugin route of the testing family.
pub fn ok_request() -> Request {
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
