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

/// Builds raw HTTP/1.1 request `i` of connection `conn`.
pub type MakeRequest = Arc<dyn Fn(usize, usize) -> Vec<u8> + Send + Sync>;

/// Keep-alive requests on one connection until `until`; returns latencies
/// (ns). Every response must have status `expect`.
async fn client(
    addr: SocketAddr,
    make: MakeRequest,
    conn: usize,
    until: Instant,
    expect: u16,
) -> Vec<u64> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut lat = Vec::new();
    let status_line = format!("http/1.1 {expect}");
    let mut i = 0;
    while Instant::now() < until {
        let req = make(conn, i);
        i += 1;
        let t = Instant::now();
        stream.write_all(&req).await.expect("write");
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
                assert!(
                    head.starts_with(&status_line),
                    "{head}\n{}",
                    String::from_utf8_lossy(&buf[end..have])
                );
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

/// Drive `conns` keep-alive connections for `secs` seconds with requests
/// from `make`, each answered with status `expect`.
pub async fn load_with(
    addr: SocketAddr,
    conns: u64,
    secs: u64,
    expect: u16,
    make: MakeRequest,
) -> Run {
    let start = Instant::now();
    let until = start + Duration::from_secs(secs);
    let tasks: Vec<_> = (0..conns as usize)
        .map(|c| tokio::spawn(client(addr, make.clone(), c, until, expect)))
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let elapsed = start.elapsed().as_secs_f64();
    let (p50_us, p99_us) = p50_p99_us(&mut all);
    Run {
        rps: all.len() as f64 / elapsed,
        p50_us,
        p99_us,
    }
}

/// The p50 and p99 of nanosecond samples, in microseconds (sorts them).
pub fn p50_p99_us<T: Copy + Ord + Into<u128>>(samples: &mut [T]) -> (f64, f64) {
    samples.sort_unstable();
    let at = |i: usize| samples[i].into() as f64 / 1000.0;
    (at(samples.len() / 2), at(samples.len() * 99 / 100))
}

/// The multi-threaded runtime the load generator and server share.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Drive `conns` keep-alive connections of GETs for `secs` seconds, cycling
/// through `paths` (each connection starts at a different one).
pub async fn load(addr: SocketAddr, paths: &[&str], conns: u64, secs: u64) -> Run {
    let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
    let make: MakeRequest = Arc::new(move |conn, i| {
        let path = &paths[(conn * 7919 + i) % paths.len()];
        format!("GET {path} HTTP/1.1\r\nhost: bench\r\n\r\n").into_bytes()
    });
    load_with(addr, conns, secs, 200, make).await
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

/// `BENCH_DIR` (default: the workspace root; a relative one is taken from
/// there too, see [`env_path`]), where a bench's data dirs go, created
/// when missing.
pub fn bench_dir() -> PathBuf {
    let dir = env_path("BENCH_DIR").unwrap_or_else(workspace_root);
    std::fs::create_dir_all(&dir)
        .unwrap_or_else(|e| panic!("creating BENCH_DIR {}: {e}", dir.display()));
    dir
}

/// The path in environment variable `name`, a relative one taken from the
/// workspace root, where `cargo bench` is typed (cargo runs a bench in its
/// package's directory, `host/`).
pub fn env_path(name: &str) -> Option<PathBuf> {
    let value = std::env::var_os(name)?;
    Some(workspace_root().join(value))
}

/// The workspace root (the host package's parent).
fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where `cargo xtask build-plugins` puts the components: `plugins/` in
/// the target directory of the marketplace binary (cargo's, wherever it is
/// configured).
pub fn built_plugins() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_marketplace"))
        .parent()
        .and_then(Path::parent)
        .expect("the binary inside a target dir")
        .join("plugins")
}

/// Start a host in-process on `data_dir` and `plugins_dir`.
pub fn start_app(data_dir: &Path, plugins_dir: &Path, testing_routes: bool) -> Arc<App> {
    start_app_with(data_dir, plugins_dir, testing_routes, &[])
}

/// Start a host in-process with extra configuration `(key, value)` pairs.
pub fn start_app_with(
    data_dir: &Path,
    plugins_dir: &Path,
    testing_routes: bool,
    extra: &[(&str, &str)],
) -> Arc<App> {
    let mut flags = vec![
        ("data_dir".to_string(), data_dir.display().to_string()),
        ("plugins_dir".into(), plugins_dir.display().to_string()),
        ("testing_routes".into(), testing_routes.to_string()),
        ("log".into(), "warn".into()),
    ];
    flags.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let config = Config::load(None, &[], &flags).unwrap();
    App::start(config).expect("start app (run `cargo xtask build-plugins` first)")
}

/// Serve `app` over HTTP on a free loopback port.
pub async fn serve(app: Arc<App>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Never stopped: the sender lives as long as the process.
    let (stop, never) = tokio::sync::watch::channel(false);
    std::mem::forget(stop);
    tokio::spawn(marketplace::server::http::serve(
        app,
        listener,
        never,
        std::time::Duration::from_secs(1),
    ));
    addr
}

/// A GET of `route` with a raw query string, as the router hands it over.
pub fn get_request(route: &str, query: &str) -> Request {
    let query = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_string(), v.to_string())
        })
        .collect();
    Request {
        method: "GET".into(),
        route: route.into(),
        path: route.into(),
        params: vec![],
        query,
        headers: vec![],
        body: vec![],
    }
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

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A paid request through the runtime (no HTTP): (status, x-cash-change).
pub fn paid_call(
    app: &Arc<App>,
    family: &str,
    path: &str,
    body: &serde_json::Value,
    secret: &str,
) -> (u16, Option<String>) {
    let req = Request {
        method: "POST".into(),
        route: path.into(),
        path: path.into(),
        params: vec![],
        query: vec![],
        headers: vec![],
        body: body.to_string().into_bytes(),
    };
    let pay = marketplace::money::payments::PaymentHeaders {
        cash: Some(secret.to_string()),
        bitcoin: None,
        ..Default::default()
    };
    let write = app.runtime.served().table.writes(&req.method, &req.route);
    let reply = app.runtime.handle(family, req, pay, write);
    let change = reply
        .headers
        .iter()
        .find(|(k, _)| k == "x-cash-change")
        .map(|(_, v)| v.clone());
    (reply.status, change)
}

/// Register `key` as an identity, paying with `secret`; returns the change.
pub fn register(app: &Arc<App>, key: &ed25519_dalek::SigningKey, secret: &str) -> String {
    use ed25519_dalek::Signer;
    let fp = hex(key.verifying_key().as_bytes());
    let sig = hex(&key.sign(b"register:bench").to_bytes());
    let body = serde_json::json!({"nickname": "bench", "pgp_public_key": fp, "signature": sig});
    let (status, change) = paid_call(app, "identity", "/api/identity", &body, secret);
    assert_eq!(status, 201, "registering the bench identity");
    change.expect("change")
}

/// The body of a signed post of `content` by `key` at unix second `ts`.
pub fn post_body(
    key: &ed25519_dalek::SigningKey,
    content: &str,
    keywords: &[String],
    ts: u64,
) -> serde_json::Value {
    use ed25519_dalek::Signer;
    let fp = hex(key.verifying_key().as_bytes());
    let sig = hex(&key
        .sign(format!("post:{content}:{ts}").as_bytes())
        .to_bytes());
    serde_json::json!({"author_fingerprint": fp, "content": content, "keywords": keywords,
                       "post_type": "general", "signature": sig, "timestamp": ts})
}
