//! Black-box tests of running the service: graceful shutdown under paid
//! load (every request is answered or left no trace), the second signal,
//! online and offline backups restored into new data dirs, components
//! uploaded through the admin API surviving a restart, a missing data dir
//! created private, and the command line (help, config errors).

mod common;

use common::{ADMIN_TOKEN, Key, Options, Server, now_s};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_marketplace");

/// Price of a post, in units of 1e-8.
const POST_UNITS: u64 = 30_000_000;
/// Price of an identity, in units of 1e-8.
const IDENTITY_UNITS: u64 = 60_000_000;

// ---------------------------------------------------------------- helpers

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    common::hex(&Sha256::digest(bytes))
}

fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o777
}

/// Units as the protocol writes amounts: shortest decimal.
fn amount(units: u64) -> String {
    let (whole, frac) = (units / 100_000_000, units % 100_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let frac = format!("{frac:08}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

/// A fresh cash secret worth `units` (not yet known to the server).
fn new_secret(units: u64) -> String {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).unwrap();
    format!("e{}:secret:{}", amount(units), common::hex(&raw))
}

/// `n` secrets worth one post each: a few minted through the admin API,
/// each split into up to 100 with `POST /api/cash/replace`.
fn post_secrets(s: &Server, n: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = (n - out.len()).min(100);
        let big = s.mint(&amount(POST_UNITS * k as u64));
        let outputs: Vec<String> = (0..k).map(|_| new_secret(POST_UNITS)).collect();
        let r = s.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [big], "new_webcashes": outputs}),
        );
        assert_eq!(r.status, 200, "replace: {}", r.text());
        out.extend(outputs);
    }
    out
}

/// The ledger's totals, read from the database of a stopped server.
fn totals(data_dir: &Path) -> marketplace::money::ledger::Totals {
    let db = common::open_store(data_dir);
    let read = db.begin_read().expect("a read transaction");
    marketplace::money::ledger::Ledger::totals(&read).expect("ledger totals")
}

fn assert_conserved(data_dir: &Path) -> marketplace::money::ledger::Totals {
    let t = totals(data_dir);
    assert_eq!(
        t.minted,
        t.unspent + t.fees + t.escrow,
        "value is not conserved in {}: {t:?}",
        data_dir.display()
    );
    t
}

/// SIGTERM, then the exit status (0 expected) within `within`.
fn stop(s: &mut Server, within: Duration) {
    s.signal("TERM");
    let status = s
        .wait_exit(within)
        .unwrap_or_else(|| panic!("no exit within {within:?} of SIGTERM\n{}", s.log_text()));
    assert_eq!(
        status.code(),
        Some(0),
        "exit after SIGTERM: {status}\n{}",
        s.log_text()
    );
}

/// A server on `data_dir` (kept by the caller).
fn server_on(data_dir: &Path, env: &[(&str, &str)]) -> Server {
    Server::with(Options {
        data_dir: Some(data_dir.to_path_buf()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Options::default()
    })
}

/// The binary, with no inherited MARKETPLACE_ setting but the shared
/// compile cache (compiling the mcp component per test would dominate).
fn bare_command() -> Command {
    let mut cmd = Command::new(BIN);
    for (k, _) in std::env::vars() {
        if k.starts_with("MARKETPLACE_") {
            cmd.env_remove(k);
        }
    }
    cmd.env(
        "MARKETPLACE_CACHE_DIR",
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache"),
    );
    cmd
}

/// A server process killed when dropped.
struct Kill(std::process::Child);

/// `marketplace serve` started by hand on `data` with an empty compile
/// cache of its own (a first start: the families take seconds to load,
/// mcp most), so a test can watch it before it says it is ready.
struct ColdStart {
    addr: SocketAddr,
    /// Its admin listener (with [`ColdStart::with_admin`]).
    admin: Option<SocketAddr>,
    /// The ready line scripts wait for on stdout, sent once the server
    /// writes it.
    ready: std::sync::mpsc::Receiver<String>,
    log: std::path::PathBuf,
    _child: Kill,
}

impl ColdStart {
    /// Its log, compile cache and listener come from `tmp`.
    fn on(tmp: &Path, data: &Path) -> ColdStart {
        ColdStart::start(tmp, data, false)
    }

    /// [`ColdStart::on`], with an admin listener (token [`ADMIN_TOKEN`]).
    fn with_admin(tmp: &Path, data: &Path) -> ColdStart {
        ColdStart::start(tmp, data, true)
    }

    fn start(tmp: &Path, data: &Path, admin: bool) -> ColdStart {
        let log = tmp.join("server.log");
        let mut cmd = bare_command();
        if admin {
            cmd.args(["serve", "--admin-listen", "127.0.0.1:0"])
                .env("MARKETPLACE_ADMIN_TOKEN", ADMIN_TOKEN);
        } else {
            cmd.arg("serve");
        }
        cmd.args(["--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .arg("--plugins")
            .arg(common::plugins_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .env("MARKETPLACE_CACHE_DIR", tmp.join("cache"));
        let mut child = cmd.spawn().expect("spawn marketplace");
        let stdout = child.stdout.take().unwrap();
        let (tx, ready) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // (The admin listener's line comes first, when there is one.)
            let mut stdout = std::io::BufReader::new(stdout);
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut stdout, &mut line).is_ok_and(|n| n > 0)
                && line.starts_with("marketplace admin listening on")
            {
                line.clear();
            }
            let _ = tx.send(line);
        });
        let mut child = Kill(child);
        ColdStart {
            admin: admin.then(|| logged_addr(&mut child, &log, "admin listener on http://")),
            addr: logged_addr(&mut child, &log, "listening on http://"),
            ready,
            log,
            _child: child,
        }
    }

    fn log_text(&self) -> String {
        common::read_log(&self.log)
    }
}

/// The address after `prefix` in the log at `log` of a server started on
/// port 0 (its listener is bound when the line is written), waited for
/// (120 s at most; not if the server exits first).
fn logged_addr(server: &mut Kill, log: &Path, prefix: &str) -> SocketAddr {
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let text = common::read_log(log);
        if let Some(at) = text.find(prefix) {
            let rest = &text[at + prefix.len()..];
            let end = rest.find(|c: char| c.is_whitespace()).unwrap_or(rest.len());
            return rest[..end].trim_end_matches("/metrics").parse().unwrap();
        }
        assert!(
            server.0.try_wait().unwrap().is_none(),
            "the server exited:\n{text}"
        );
        assert!(Instant::now() < until, "no {prefix:?} in the log:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Kill {
    /// SIGTERM, then its exit status (30 s at most).
    fn terminate(&mut self) -> std::process::ExitStatus {
        let pid = self.0.id().to_string();
        assert!(
            Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(st) = self.0.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < until, "no exit after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Run the binary with `args` (no inherited MARKETPLACE_ settings); killed
/// and reported if it runs longer than `limit`.
fn run(args: &[&str], env: &[(&str, &str)], limit: Duration) -> Output {
    let mut cmd = bare_command();
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn marketplace");
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = out.read_to_end(&mut b);
        b
    });
    let err_t = std::thread::spawn(move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    });
    let until = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > until {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`marketplace {}` still running after {limit:?}; stderr:\n{}",
                args.join(" "),
                String::from_utf8_lossy(&err_t.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

// ------------------------------------------------- a raw HTTP/1.1 client

/// What a client saw of one request.
#[derive(Debug, Clone)]
enum Seen {
    /// A whole response.
    Answered(u16, Vec<u8>),
    /// The connection closed or failed before any byte of a response.
    NoAnswer(String),
    /// Some bytes of a response, then the connection failed.
    Partial(String),
    /// The connection was refused: nobody is accepting.
    Refused,
}

/// One client connection, optionally kept alive across requests.
struct Client {
    addr: SocketAddr,
    keep_alive: bool,
    conn: Option<TcpStream>,
    /// Whether the last request went on a connection that had already
    /// carried an answered request.
    reused: bool,
}

impl Client {
    fn new(addr: SocketAddr, keep_alive: bool) -> Client {
        Client {
            addr,
            keep_alive,
            conn: None,
            reused: false,
        }
    }

    fn post(&mut self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Seen {
        self.reused = self.conn.is_some();
        if self.conn.is_none() {
            match TcpStream::connect_timeout(&self.addr, Duration::from_secs(30)) {
                Ok(c) => {
                    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                    c.set_nodelay(true).unwrap();
                    self.conn = Some(c);
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    return Seen::Refused;
                }
                Err(e) => return Seen::NoAnswer(format!("connect: {e}")),
            }
        }
        let mut req = format!("POST {path} HTTP/1.1\r\nhost: {}\r\n", self.addr);
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        req.push_str(&format!("content-length: {}\r\n", body.len()));
        if !self.keep_alive {
            req.push_str("connection: close\r\n");
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        let conn = self.conn.as_mut().unwrap();
        if let Err(e) = conn.write_all(&bytes) {
            self.conn = None;
            return Seen::NoAnswer(format!("write: {e}"));
        }
        let (seen, reusable) = read_response(conn);
        if !(self.keep_alive && reusable) {
            self.conn = None;
        }
        seen
    }
}

/// Read one response; whether the connection may carry another request.
fn read_response(conn: &mut TcpStream) -> (Seen, bool) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let failed = match conn.read(&mut chunk) {
            Ok(0) => "closed".to_string(),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                continue;
            }
            Err(e) => e.to_string(),
        };
        return if buf.is_empty() {
            (Seen::NoAnswer(failed), false)
        } else {
            (
                Seen::Partial(format!("{failed} after {:?}", text(&buf))),
                false,
            )
        };
    };
    let head = text(&buf[..header_end]);
    let mut lines = head.split("\r\n");
    let Some(status) = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse::<u16>().ok())
    else {
        return (Seen::Partial(format!("no status line: {head:?}")), false);
    };
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_ascii_lowercase()))
        .collect();
    let header = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) else {
        return (Seen::Partial(format!("no content-length: {head:?}")), false);
    };
    let mut body = buf[header_end + 4..].to_vec();
    while body.len() < len {
        match conn.read(&mut chunk) {
            Ok(0) => return (Seen::Partial("body cut short".into()), false),
            Ok(n) => body.extend_from_slice(&chunk[..n]),
            Err(e) => return (Seen::Partial(format!("body: {e}")), false),
        }
    }
    body.truncate(len);
    let reusable = header("connection") != Some("close");
    (Seen::Answered(status, body), reusable)
}

// ------------------------------------------------------ paid post load

/// One paid post request and what its client saw.
#[derive(Debug, Clone)]
struct Sent {
    content: String,
    secret: String,
    seen: Seen,
    /// Sent on a kept-alive connection that had carried an answer.
    reused: bool,
}

impl Sent {
    fn created(&self) -> Option<String> {
        match &self.seen {
            Seen::Answered(201, body) => {
                let v: Value = serde_json::from_slice(body).expect("a JSON 201");
                Some(v["post_id"].as_str().expect("post_id").to_string())
            }
            _ => None,
        }
    }
}

/// Threads posting paid posts until told to stop, refused, or out of
/// secrets. Half the clients keep their connection alive.
struct Load {
    stop: Arc<AtomicBool>,
    /// Post ids in the order their 201s arrived.
    acked: Arc<Mutex<Vec<String>>>,
    acked_n: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<Vec<Sent>>>,
}

impl Load {
    fn start(addr: SocketAddr, key: Arc<Key>, secrets: Vec<Vec<String>>, tag: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(Mutex::new(Vec::new()));
        let acked_n = Arc::new(AtomicUsize::new(0));
        let threads = secrets
            .into_iter()
            .enumerate()
            .map(|(c, mine)| {
                let (key, stop, acked, acked_n) =
                    (key.clone(), stop.clone(), acked.clone(), acked_n.clone());
                let tag = tag.to_string();
                std::thread::spawn(move || {
                    let mut client = Client::new(addr, c % 2 == 0);
                    let mut log = Vec::new();
                    for (i, secret) in mine.into_iter().enumerate() {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let content = format!("{tag} {c}/{i}");
                        let ts = now_s();
                        let body = json!({
                            "author_fingerprint": key.fp(),
                            "content": content,
                            "signature": key.sign(&format!("post:{content}:{ts}")),
                            "timestamp": ts,
                        })
                        .to_string();
                        let headers = [
                            ("content-type", "application/json"),
                            ("x-cash-secret", secret.as_str()),
                        ];
                        let seen = client.post("/api/timeline", &headers, body.as_bytes());
                        let sent = Sent {
                            content,
                            secret,
                            seen,
                            reused: client.reused,
                        };
                        if let Some(id) = sent.created() {
                            acked.lock().unwrap().push(id);
                            acked_n.fetch_add(1, Ordering::Relaxed);
                        }
                        let refused = matches!(sent.seen, Seen::Refused);
                        log.push(sent);
                        if refused {
                            break;
                        }
                    }
                    log
                })
            })
            .collect();
        Load {
            stop,
            acked,
            acked_n,
            threads,
        }
    }

    /// Wait until `n` posts are acknowledged (generous bound).
    fn wait_for(&self, n: usize) {
        let until = Instant::now() + Duration::from_secs(120);
        while self.acked_n.load(Ordering::Relaxed) < n {
            assert!(
                Instant::now() < until,
                "only {} posts acknowledged",
                self.acked_n.load(Ordering::Relaxed)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn acked(&self) -> Vec<String> {
        self.acked.lock().unwrap().clone()
    }

    /// Stop (or let finish) and collect every request's outcome.
    fn finish(self, stop: bool) -> Vec<Sent> {
        if stop {
            self.stop.store(true, Ordering::Relaxed);
        }
        self.threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect()
    }
}

/// The secrets split into `clients` lists of `per_client`.
fn load_secrets(s: &Server, clients: usize, per_client: usize) -> Vec<Vec<String>> {
    let all = post_secrets(s, clients * per_client);
    all.chunks(per_client).map(<[String]>::to_vec).collect()
}

// ------------------------------------------------------------------ tests

/// Read what the server sends on `conn` until it closes it (at most 10 s).
fn read_to_close(conn: &mut TcpStream) -> std::io::Result<String> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut out = Vec::new();
    conn.read_to_end(&mut out)?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// What `conn` reads to its end after SIGTERM is a 200 that says the
/// connection closes (`what` names the request in a failure).
fn answered_200_and_closed(s: &Server, conn: &mut TcpStream, what: &str) {
    let answer = read_to_close(conn)
        .unwrap_or_else(|e| panic!("{what} was not answered ({e})\n{}", s.log_text()));
    assert!(
        answer.starts_with("HTTP/1.1 200"),
        "{what}: {answer:?}\n{}",
        s.log_text()
    );
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{what}: {answer}"
    );
}

/// A keep-alive connection that got one answer (a 200 of `/api/health`,
/// the connection kept open) and is now between requests.
fn idle_keep_alive(s: &Server) -> TcpStream {
    let mut conn = TcpStream::connect(s.addr).unwrap();
    conn.write_all(b"GET /api/health HTTP/1.1\r\nhost: drain\r\n\r\n")
        .unwrap();
    let (seen, reusable) = read_response(&mut conn);
    assert!(matches!(seen, Seen::Answered(200, _)), "{seen:?}");
    assert!(reusable);
    conn
}

/// A connection inside a request that runs (a plugin call spinning until
/// the server's request deadline), once the server counts it in flight
/// (within 10 s).
fn running_request(s: &Server) -> TcpStream {
    let mut conn = TcpStream::connect(s.addr).unwrap();
    conn.write_all(b"GET /_testing/loop HTTP/1.1\r\nhost: drain\r\n\r\n")
        .unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while in_flight(s) < 1.0 {
        assert!(Instant::now() < until, "the running request never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    conn
}

/// The server exits 0 within 20 s (after a SIGTERM sent already).
fn exits_cleanly(s: &mut Server) {
    let status = s
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("no exit after SIGTERM\n{}", s.log_text()));
    assert_eq!(status.code(), Some(0), "{}", s.log_text());
}

#[test]
fn sigterm_answers_a_request_waiting_in_the_listen_backlog() {
    let dir = tempfile::tempdir().unwrap();
    // One connection at a time: later clients wait for its place.
    let mut s = Server::with(Options {
        data_dir: Some(dir.path().join("data")),
        testing_routes: true,
        env: vec![
            ("MARKETPLACE_MAX_CONNECTIONS".into(), "1".into()),
            ("MARKETPLACE_REQUEST_TIMEOUT_MS".into(), "5000".into()),
        ],
        ..Options::default()
    });
    // The first holds the only place with a request that runs (a plugin
    // call spinning until its 5 s deadline), so it cannot be closed to
    // make room.
    let mut first = running_request(&s);
    // The second is taken from the backlog and waits for a place; the
    // third stays in the backlog (the kernel queues it). Both send their
    // request, which nobody reads yet.
    let request = b"GET /api/health HTTP/1.1\r\nhost: drain\r\n\r\n";
    let mut second = TcpStream::connect(s.addr).unwrap();
    second.write_all(request).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    let mut third = TcpStream::connect(s.addr).unwrap();
    third.write_all(request).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    s.signal("TERM");
    // Each is answered, and told the connection closes.
    for (name, waiting) in [("second", &mut second), ("third", &mut third)] {
        answered_200_and_closed(&s, waiting, &format!("the {name} waiting client"));
    }
    // The first finishes its request and is answered too.
    let answer = read_to_close(&mut first).unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 "), "{answer}");
    exits_cleanly(&mut s);
    assert!(s.log_text().contains("listen backlog"), "{}", s.log_text());
}

/// An idle keep-alive connection lingers at SIGTERM for a request on its
/// way (`drain_linger_ms`, half a second by default; 5 s here, so that a
/// test thread slowed down on a loaded machine still sends within it, and
/// so that the request sent a second after the signal shows the setting
/// is what kept the connection open: nothing else runs).
#[test]
fn sigterm_answers_a_keep_alive_request_sent_just_after_the_signal() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = server_on(
        &dir.path().join("data"),
        &[("MARKETPLACE_DRAIN_LINGER_MS", "5000")],
    );
    let request = b"GET /api/health HTTP/1.1\r\nhost: drain\r\n\r\n";
    let mut conn = idle_keep_alive(&s);
    // The connection is idle when the signal comes; its client sends the
    // next request once the server drains (it had not seen any close):
    // new connections are refused from then on.
    s.signal("TERM");
    let until = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(s.addr).is_ok() {
        assert!(Instant::now() < until, "the server never began to drain");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_secs(1));
    conn.write_all(request).unwrap();
    answered_200_and_closed(&s, &mut conn, "the request a second after the signal");
    exits_cleanly(&mut s);
}

/// A keep-alive client whose next request comes well after the signal
/// (slowed down, as a busy client under load is), while the drain still
/// serves another request, is answered on its connection, not reset: it
/// saw no `connection: close` on its last answer.
#[test]
fn sigterm_answers_a_late_keep_alive_request_while_others_still_run() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = Server::with(Options {
        data_dir: Some(dir.path().join("data")),
        testing_routes: true,
        env: vec![("MARKETPLACE_REQUEST_TIMEOUT_MS".into(), "4000".into())],
        ..Options::default()
    });
    let request = b"GET /api/health HTTP/1.1\r\nhost: drain\r\n\r\n";
    let mut idle = idle_keep_alive(&s);
    // Another request runs through the drain (a plugin call spinning
    // until its 4 s deadline).
    let mut running = running_request(&s);
    s.signal("TERM");
    // Well past the half second an idle connection lingers for a request
    // already on its way.
    std::thread::sleep(Duration::from_millis(500));
    idle.write_all(request).unwrap();
    answered_200_and_closed(&s, &mut idle, "the late request");
    let answer = read_to_close(&mut running).unwrap_or_default();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    exits_cleanly(&mut s);
}

#[test]
fn a_short_drain_is_not_outlived_by_an_idle_keep_alive_connection() {
    // The time an idle connection lingers at SIGTERM (`drain_linger_ms`)
    // is cut to half the drain's: a clean stop, not a drain that gave up
    // on it. (A linger of 5 s cut to 1.5 s leaves the drain 1.5 s more, so
    // a loaded machine's late timer does not take the cut for the drain.)
    let dir = tempfile::tempdir().unwrap();
    let mut s = server_on(
        &dir.path().join("data"),
        &[
            ("MARKETPLACE_DRAIN_TIMEOUT_MS", "3000"),
            ("MARKETPLACE_DRAIN_LINGER_MS", "5000"),
        ],
    );
    let conn = idle_keep_alive(&s);
    s.signal("TERM");
    exits_cleanly(&mut s);
    let log = s.log_text();
    assert!(log.contains("stopped"), "{log}");
    assert!(!log.contains("drain timeout"), "{log}");
    drop(conn);
}

/// An online backup in progress at SIGTERM is streamed to its end, as
/// any request being served is (it used to be cut off: the admin listener
/// stopped at once, and the backup CLI failed with "peer disconnected").
#[test]
fn sigterm_lets_an_online_backup_in_progress_finish() {
    if common::skip_on_postgres(
        "sigterm_lets_an_online_backup_in_progress_finish",
        "a host backs up only a redb data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut s = server_on(&dir.path().join("data"), &[]);
    // More than the loopback socket's buffers hold: the server is still
    // writing when the signal comes.
    let k = s.identity("backer");
    let blob: Vec<u8> = (0..7usize << 20).map(|i| (i * 7 % 251) as u8).collect();
    for i in 0..4 {
        s.upload(
            &k,
            &format!("big{i}.bin"),
            "application/octet-stream",
            &blob,
        );
    }
    let mut c = TcpStream::connect(s.admin).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // HTTP/1.0: the answer's end is the connection's.
    write!(
        c,
        "GET /admin/backup HTTP/1.0\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
    )
    .unwrap();
    let mut answer = vec![0u8; 64 << 10];
    c.read_exact(&mut answer).unwrap();
    s.signal("TERM");
    std::thread::sleep(Duration::from_millis(300));
    c.read_to_end(&mut answer).unwrap();
    let head_end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    assert!(
        text(&answer[..head_end]).contains(" 200"),
        "{}",
        text(&answer[..head_end])
    );
    let mut archive = tar::Archive::new(&answer[head_end + 4..]);
    let mut db = 0;
    let mut names = Vec::new();
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.unwrap_or_else(|e| panic!("the backup was cut off: {e}"));
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        let size = entry.header().size().unwrap();
        let read = std::io::copy(&mut entry, &mut std::io::sink()).unwrap_or(0);
        assert_eq!(read, size, "{name} cut off");
        if name == "marketplace.redb" {
            db = size;
        }
        names.push(name);
    }
    assert!(
        db > 28 << 20,
        "database of {db} bytes in the backup: {names:?}"
    );
    assert!(names.iter().any(|n| n == "backup.json"), "{names:?}");
    exits_cleanly(&mut s);
}

#[test]
fn sigterm_during_paid_load_answers_every_accepted_request() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let drain = Duration::from_secs(20);
    let mut s = server_on(&data, &[("MARKETPLACE_DRAIN_TIMEOUT_MS", "20000")]);
    let key = Arc::new(s.identity("drainer"));
    let (clients, per_client) = (32, 40);
    let secrets = load_secrets(&s, clients, per_client);
    let everything: Vec<String> = secrets.iter().flatten().cloned().collect();
    let load = Load::start(s.addr, key.clone(), secrets, "drain");
    // Signal in the middle of the load, once a good share is answered.
    load.wait_for(300);
    let acked_at_signal = load.acked_n.load(Ordering::Relaxed);
    let signalled = Instant::now();
    s.signal("TERM");
    let status = s
        .wait_exit(drain + Duration::from_secs(10))
        .unwrap_or_else(|| panic!("no exit after SIGTERM\n{}", s.log_text()));
    let exited_after = signalled.elapsed();
    let log = load.finish(false);
    assert_eq!(status.code(), Some(0), "{status}\n{}", s.log_text());
    assert!(
        exited_after < drain,
        "the drain took {exited_after:?}, beyond its timeout"
    );
    assert!(
        s.log_text().contains("signal received"),
        "no drain in the log:\n{}",
        s.log_text()
    );

    let mut statuses: HashMap<u16, usize> = HashMap::new();
    let (mut unanswered, mut refused) = (0, 0);
    for sent in &log {
        match &sent.seen {
            Seen::Answered(status, body) => {
                *statuses.entry(*status).or_default() += 1;
                assert!(
                    *status < 500,
                    "{} answered {status}: {}",
                    sent.content,
                    text(body)
                );
                assert_eq!(*status, 201, "{} refused: {}", sent.content, text(body));
            }
            Seen::Partial(why) => panic!("{}: half an answer: {why}", sent.content),
            Seen::NoAnswer(why) => {
                // A client that connected as the listener closed may be
                // reset; a request on a kept-alive connection is answered
                // (the connection lingers between requests while draining).
                assert!(
                    !sent.reused,
                    "{}: sent on a kept-alive connection, no answer ({why})\n{}",
                    sent.content,
                    s.log_text()
                );
                unanswered += 1;
                eprintln!("{}: no answer on a new connection ({why})", sent.content);
            }
            Seen::Refused => refused += 1,
        }
    }
    let created: HashMap<String, String> = log
        .iter()
        .filter_map(|s| s.created().map(|id| (s.content.clone(), id)))
        .collect();
    eprintln!(
        "SIGTERM after {acked_at_signal} acknowledged; exit {exited_after:?} later; {} requests: \
         {statuses:?}, {unanswered} unanswered, {refused} refused",
        log.len()
    );
    assert!(
        created.len() > acked_at_signal,
        "nothing was answered after the signal: the drain was not exercised"
    );
    assert!(
        log.len() < clients * per_client,
        "the load ended before the signal: nothing was cut off"
    );

    // Restarted on the same data: exactly the acknowledged posts are there.
    let mut s2 = server_on(&data, &[]);
    for id in created.values() {
        let r = s2.get(&format!("/api/posts/{id}"));
        assert_eq!(r.status, 200, "acknowledged post {id}: {}", r.text());
    }
    let present = common::posts_of(&s2, &key.fp());
    assert_eq!(
        present.len(),
        created.len(),
        "posts stored vs. 201 answers given"
    );
    assert_eq!(
        present, created,
        "the stored posts are the acknowledged ones"
    );
    // Each payment is spent exactly when its post was acknowledged.
    let spent = common::spent_states(&s2, &everything);
    let sent_by_secret: HashMap<&str, &Sent> = log.iter().map(|s| (s.secret.as_str(), s)).collect();
    for secret in &everything {
        let acknowledged = sent_by_secret
            .get(secret.as_str())
            .is_some_and(|s| s.created().is_some());
        assert_eq!(
            spent[secret],
            json!(acknowledged),
            "secret of {:?}: spent {} but acknowledged {acknowledged}",
            sent_by_secret.get(secret.as_str()).map(|s| &s.content),
            spent[secret]
        );
    }
    stop(&mut s2, Duration::from_secs(30));
    let t = assert_conserved(&data);
    assert_eq!(
        t.fees,
        IDENTITY_UNITS + POST_UNITS * created.len() as u64,
        "fees earned vs. paid requests answered: {t:?}"
    );
    drop(s);
}

/// The value of `marketplace_requests_in_flight` (or any metric ending so).
fn in_flight(s: &Server) -> f64 {
    let r = s.admin_request("GET", "/metrics", &json!(null));
    assert_eq!(r.status, 200, "{}", r.text());
    r.text()
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            name.ends_with("requests_in_flight")
                .then(|| value.parse().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("no requests_in_flight metric:\n{}", r.text()))
}

#[test]
fn second_signal_exits_at_once() {
    let mut s = Server::with(Options {
        testing_routes: true,
        env: vec![
            // The loop outlasts every wait below on a loaded machine.
            ("MARKETPLACE_REQUEST_TIMEOUT_MS".into(), "60000".into()),
            ("MARKETPLACE_DRAIN_TIMEOUT_MS".into(), "120000".into()),
        ],
        ..Options::default()
    });
    let addr = s.addr;
    let spinning = std::thread::spawn(move || {
        common::try_request(addr, "GET", "/_testing/loop", &[], None)
            .map(|r| r.status)
            .map_err(|e| e.to_string())
    });
    // The spinning request is in flight (the metrics request is not counted
    // there: it is on the admin listener).
    let until = Instant::now() + Duration::from_secs(60);
    while in_flight(&s) < 1.0 {
        assert!(Instant::now() < until, "the spinning request never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    s.signal("TERM");
    let until = Instant::now() + Duration::from_secs(30);
    while !s.log_text().contains("signal received") {
        assert!(Instant::now() < until, "the first signal was not seen");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Draining: nothing new is accepted, and the spinning request holds it.
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        match TcpStream::connect(s.addr) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
            _ => {
                assert!(Instant::now() < until, "still accepting while draining");
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }
    assert!(
        s.wait_exit(Duration::ZERO).is_none(),
        "exited while a request was in flight"
    );
    let second = Instant::now();
    s.signal("TERM");
    let status = s
        .wait_exit(Duration::from_secs(10))
        .unwrap_or_else(|| panic!("still running 10 s after the second signal"));
    eprintln!(
        "exit {status} {:?} after the second signal",
        second.elapsed()
    );
    assert_eq!(status.code(), Some(130), "{status}\n{}", s.log_text());
    // The spinning request was not answered (the process is gone).
    let got = spinning.join().unwrap();
    assert!(got.is_err(), "the spinning request was answered: {got:?}");
}

#[test]
fn sigint_closes_idle_connections_and_exits_0() {
    // Idle connections do not hold the drain up: one kept alive after a
    // request, one that never sent a byte.
    let mut s = Server::with(Options {
        env: vec![("MARKETPLACE_DRAIN_TIMEOUT_MS".into(), "60000".into())],
        ..Options::default()
    });
    let mut kept = TcpStream::connect(s.addr).unwrap();
    kept.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(kept, "GET /api/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let (seen, reusable) = read_response(&mut kept);
    assert!(matches!(seen, Seen::Answered(200, _)), "{seen:?}");
    assert!(reusable);
    let mut silent = TcpStream::connect(s.addr).unwrap();
    silent
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    s.signal("INT");
    let status = s
        .wait_exit(Duration::from_secs(30))
        .unwrap_or_else(|| panic!("idle connections held the drain\n{}", s.log_text()));
    assert_eq!(status.code(), Some(0), "{status}\n{}", s.log_text());
    for conn in [&mut kept, &mut silent] {
        let mut b = [0u8; 1];
        assert!(
            matches!(conn.read(&mut b), Ok(0) | Err(_)),
            "an idle connection stayed open"
        );
    }
}

#[test]
fn a_request_longer_than_the_drain_is_cut_off() {
    let mut s = Server::with(Options {
        testing_routes: true,
        env: vec![
            ("MARKETPLACE_REQUEST_TIMEOUT_MS".into(), "60000".into()),
            ("MARKETPLACE_DRAIN_TIMEOUT_MS".into(), "500".into()),
        ],
        ..Options::default()
    });
    let addr = s.addr;
    // More spinning requests than async workers: none of them parks to
    // write the lines it gathered.
    let spinning: Vec<_> = (0..3)
        .map(|_| {
            std::thread::spawn(move || {
                common::try_request(addr, "GET", "/_testing/loop", &[], None)
                    .map(|r| r.status)
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while in_flight(&s) < 3.0 {
        assert!(
            Instant::now() < until,
            "the spinning requests never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    s.signal("TERM");
    // Far sooner than the request's own 60 s deadline.
    let status = s
        .wait_exit(Duration::from_secs(20))
        .unwrap_or_else(|| panic!("the drain timeout was not kept\n{}", s.log_text()));
    assert_eq!(status.code(), Some(0), "{status}\n{}", s.log_text());
    // The log says when the drain began and how many it gave up on:
    // every line is out before the exit, those of busy workers included.
    let log = s.log_text();
    assert!(log.contains("signal received: draining"), "{log}");
    assert!(log.contains("drain timeout"), "{log}");
    assert!(log.contains("in_flight=3"), "{log}");
    // The requests dropped are the server's doing, not their clients';
    // and the stop is logged as any other.
    assert!(!log.contains("the client went away"), "{log}");
    // One line for each (a busy worker's may follow the stop's: each
    // worker writes the lines it gathered when it parks).
    let cut = log
        .matches("still running when the drain timed out")
        .count();
    assert_eq!(cut, 3, "{log}");
    assert!(log.contains("stopped commits="), "{log}");
    for spinning in spinning {
        let got = spinning.join().unwrap();
        assert!(got.is_err(), "a spinning request was answered: {got:?}");
    }
}

/// `marketplace backup` through the admin listener of `s` into `to`.
fn online_backup(s: &Server, to: &Path) -> Output {
    let admin = format!("http://{}", s.admin);
    run(
        &[
            "backup",
            "--to",
            to.to_str().unwrap(),
            "--admin",
            &admin,
            "--token",
            ADMIN_TOKEN,
        ],
        &[],
        Duration::from_secs(120),
    )
}

fn restore(file: &Path, into: &Path) -> Output {
    run(
        &[
            "restore",
            file.to_str().unwrap(),
            "--data-dir",
            into.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(120),
    )
}

/// A backup replaces only an earlier backup or an empty file: written over
/// the live database (`--to <data dir>/marketplace.redb`), it left the
/// server serving a deleted file and acknowledging writes that its next
/// start lost (an outside operator audit). A directory, a path inside the
/// data dir and a file that is not a backup are refused before the server
/// is asked; a backup written over the last one is the usual rotation.
#[test]
fn a_backup_replaces_only_an_earlier_backup() {
    if common::skip_on_postgres(
        "a_backup_replaces_only_an_earlier_backup",
        "a host backs up only a redb data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = server_on(&data, &[]);
    let live = data.join("marketplace.redb");
    for (to, says) in [
        (live.clone(), "exists and is not a backup"),
        (data.join("server.key"), "exists and is not a backup"),
        (dir.path().to_path_buf(), "is a directory"),
    ] {
        let out = online_backup(&s, &to);
        assert!(!out.status.success(), "{to:?}: {out:?}");
        assert!(
            text(&out.stderr).contains(says),
            "{to:?}: {}",
            text(&out.stderr)
        );
    }
    // Both as they were: the database still redb's (its size is no
    // witness: the host may grow it meanwhile), the key not a tar.
    assert!(std::fs::read(&live).unwrap().starts_with(b"redb"));
    assert!(
        !std::fs::read(data.join("server.key"))
            .unwrap()
            .starts_with(b"backup.json")
    );
    // Offline (or online with the data dir named), a new file inside it.
    let admin = format!("http://{}", s.admin);
    let out = run(
        &[
            "backup",
            "--to",
            data.join("new.tar").to_str().unwrap(),
            "--admin",
            &admin,
            "--token",
            ADMIN_TOKEN,
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        !out.status.success() && text(&out.stderr).contains("inside the data dir"),
        "{out:?}"
    );
    // The usual rotation: over an empty file, then over that backup.
    let file = dir.path().join("rotated.tar");
    std::fs::write(&file, b"").unwrap();
    for round in 0..2 {
        let out = online_backup(&s, &file);
        assert!(out.status.success(), "round {round}: {out:?}");
    }
    assert_eq!(s.get("/api/health").status, 200);
}

#[test]
fn backup_during_paid_writes_restores_a_consistent_copy() {
    if common::skip_on_postgres(
        "backup_during_paid_writes_restores_a_consistent_copy",
        "a host backs up only a redb data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut s = server_on(&data, &[]);
    let key = Arc::new(s.identity("backer"));
    let secrets = load_secrets(&s, 12, 40);
    let everything: Vec<String> = secrets.iter().flatten().cloned().collect();
    let load = Load::start(s.addr, key.clone(), secrets, "backup");
    load.wait_for(40);
    let before_backup = load.acked();
    let file = dir.path().join("online.tar");
    let out = online_backup(&s, &file);
    let during = load.acked_n.load(Ordering::Relaxed) - before_backup.len();
    assert!(
        out.status.success(),
        "backup failed: {}\n{}",
        text(&out.stderr),
        s.log_text()
    );
    assert!(text(&out.stdout).contains("backup written"), "{out:?}");
    eprintln!("{}", text(&out.stdout).trim());
    let log = load.finish(true);
    eprintln!(
        "{} acknowledged before the backup, {during} while it ran, {} requests in all",
        before_backup.len(),
        log.len()
    );
    assert_eq!(mode(&file), 0o600, "the backup file's mode");
    for sent in &log {
        if let Seen::Answered(status, body) = &sent.seen {
            assert_eq!(*status, 201, "{}: {}", sent.content, text(body));
        }
    }

    // The route itself: a tar streamed (chunked), only with the token.
    let r = s.admin_raw("GET", "/admin/backup", None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-tar"));
    assert_eq!(r.header("content-length"), None, "not streamed");
    let mut names = Vec::new();
    let mut archive = tar::Archive::new(&r.body[..]);
    for entry in archive.entries().expect("a tar") {
        let mut entry = entry.expect("a tar entry");
        let name = entry.path().unwrap().to_string_lossy().into_owned();
        if name == "backup.json" {
            let mut doc = String::new();
            entry.read_to_string(&mut doc).unwrap();
            let doc: Value = serde_json::from_str(&doc).unwrap();
            assert_eq!(doc["format"], 1, "{doc}");
        }
        // Every entry is owner-only, the database too.
        assert_eq!(entry.header().mode().unwrap() & 0o777, 0o600, "{name}");
        names.push(name);
    }
    for name in ["backup.json", "server.key", "marketplace.redb"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }
    let r = common::request(s.admin, "GET", "/admin/backup", &[], None);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = common::request(
        s.admin,
        "GET",
        "/admin/backup",
        &[("authorization", "Bearer not-the-token")],
        None,
    );
    assert_eq!(r.status, 401, "{}", r.text());

    // A wrong token is refused, and leaves no file.
    let wrong = dir.path().join("wrong.tar");
    let admin = format!("http://{}", s.admin);
    let out = run(
        &[
            "backup",
            "--to",
            wrong.to_str().unwrap(),
            "--admin",
            &admin,
            "--token",
            "not-the-token-0123456789abcdef0123",
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(
        !out.status.success(),
        "a backup with a wrong token: {out:?}"
    );
    assert!(!wrong.exists(), "a refused backup left a file");

    // Restored into a new dir, a server serves every post acknowledged
    // before the backup began, and the copy is of one instant: a post is
    // there exactly when its payment is spent.
    let restored = dir.path().join("restored");
    let out = restore(&file, &restored);
    assert!(out.status.success(), "restore: {}", text(&out.stderr));
    assert_eq!(mode(&restored), 0o700, "the restored data dir's mode");
    assert!(
        !restored.join("admin.token").exists(),
        "the admin token is not part of a backup"
    );
    let mut r = server_on(&restored, &[]);
    for id in &before_backup {
        let got = r.get(&format!("/api/posts/{id}"));
        assert_eq!(
            got.status,
            200,
            "post {id} acknowledged before the backup: {}",
            got.text()
        );
    }
    let present = common::posts_of(&r, &key.fp());
    let spent = common::spent_states(&r, &everything);
    let by_content: HashMap<&str, &Sent> = log.iter().map(|s| (s.content.as_str(), s)).collect();
    for (content, id) in &present {
        let sent = by_content
            .get(content.as_str())
            .unwrap_or_else(|| panic!("a post nobody sent: {content}"));
        assert_eq!(
            sent.created().as_ref(),
            Some(id),
            "{content} is in the backup but was not acknowledged as {id}"
        );
        assert_eq!(spent[&sent.secret], json!(true), "{content}: unpaid");
    }
    for sent in &log {
        if !present.contains_key(&sent.content) {
            assert_eq!(
                spent[&sent.secret],
                json!(false),
                "{}: paid but not in the backup",
                sent.content
            );
        }
    }
    assert!(present.len() >= before_backup.len());
    stop(&mut r, Duration::from_secs(30));
    let t = assert_conserved(&restored);
    assert_eq!(
        t.fees,
        IDENTITY_UNITS + POST_UNITS * present.len() as u64,
        "{t:?}"
    );

    // Never over an existing database.
    let out = restore(&file, &restored);
    assert!(!out.status.success(), "restored over a database: {out:?}");
    assert!(
        text(&out.stderr).contains("is not empty"),
        "{}",
        text(&out.stderr)
    );

    // An offline backup of a running server's data dir is refused.
    let live = dir.path().join("live.tar");
    let out = run(
        &[
            "backup",
            "--to",
            live.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(!out.status.success(), "an offline backup of a live server");
    assert!(
        text(&out.stderr).contains("--admin"),
        "{}",
        text(&out.stderr)
    );
    assert!(!live.exists());

    // Offline, from the stopped server's data dir: everything acknowledged.
    stop(&mut s, Duration::from_secs(30));
    let all_created: HashMap<String, String> = log
        .iter()
        .filter_map(|s| s.created().map(|id| (s.content.clone(), id)))
        .collect();
    let offline = dir.path().join("offline.tar");
    let out = run(
        &[
            "backup",
            "--to",
            offline.to_str().unwrap(),
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(120),
    );
    assert!(
        out.status.success(),
        "offline backup: {}",
        text(&out.stderr)
    );
    assert_eq!(mode(&offline), 0o600);
    let restored2 = dir.path().join("restored-offline");
    let out = restore(&offline, &restored2);
    assert!(out.status.success(), "restore: {}", text(&out.stderr));
    let mut r2 = server_on(&restored2, &[]);
    assert_eq!(common::posts_of(&r2, &key.fp()), all_created);
    // Change and payouts still derive from the restored server key: a
    // replace with change works on the restored copy.
    let big = r2.mint("1");
    let half = new_secret(50_000_000);
    let rest = new_secret(50_000_000);
    let got = r2.post_json(
        "/api/cash/replace",
        &json!({"webcashes": [big], "new_webcashes": [half, rest]}),
    );
    assert_eq!(got.status, 200, "{}", got.text());
    stop(&mut r2, Duration::from_secs(30));
    let t2 = assert_conserved(&restored2);
    assert_eq!(
        t2.fees,
        IDENTITY_UNITS + POST_UNITS * all_created.len() as u64
    );
}

#[test]
fn a_failed_restore_leaves_the_data_dir_restorable() {
    if common::skip_on_postgres(
        "a_failed_restore_leaves_the_data_dir_restorable",
        "a host backs up only a redb data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut s = server_on(&data, &[]);
    let key = s.identity("truncated");
    let id = s.new_post(&key, "before the backup", json!({}));
    let file = dir.path().join("full.tar");
    let out = online_backup(&s, &file);
    assert!(out.status.success(), "backup: {}", text(&out.stderr));
    stop(&mut s, Duration::from_secs(30));
    // Cut inside the database, the last member.
    let bytes = std::fs::read(&file).unwrap();
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() * 3 / 4]).unwrap();
    let restored = dir.path().join("restored");
    let out = restore(&cut, &restored);
    assert!(!out.status.success(), "a truncated backup was restored");
    assert!(
        text(&out.stderr).contains("damaged or cut short"),
        "{}",
        text(&out.stderr)
    );
    // A file that is no backup (another tar, or not a tar) is named so,
    // not quoted from the tar reader, and nothing is made.
    let other = dir.path().join("other.tar");
    {
        let mut tar = tar::Builder::new(std::fs::File::create(&other).unwrap());
        let mut header = tar::Header::new_gnu();
        header.set_size(5);
        header.set_mode(0o600);
        tar.append_data(&mut header, "notes.txt", &b"notes"[..])
            .unwrap();
        tar.finish().unwrap();
    }
    let random = dir.path().join("random.bin");
    std::fs::write(
        &random,
        (0..5000u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    for file in [&other, &random] {
        let out = restore(file, &restored);
        assert!(!out.status.success(), "{} was restored", file.display());
        let err = text(&out.stderr);
        assert!(err.contains("is not a backup"), "{err}");
        assert!(!restored.exists(), "{err}");
        let staged = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".marketplace-restore-")
            })
            .count();
        assert_eq!(staged, 0, "a refused restore left its staging dir");
    }
    // A backup read from a pipe (`curl .../admin/backup | marketplace
    // restore /dev/stdin`): read once, in one pass.
    let mut child = bare_command()
        .args(["restore", "/dev/stdin", "--data-dir"])
        .arg(dir.path().join("from-a-pipe"))
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let bytes = std::fs::read(&file).unwrap();
    let feeder = std::thread::spawn(move || {
        let _ = stdin.write_all(&bytes);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(
        out.status.success(),
        "restore from a pipe: {}",
        text(&out.stderr)
    );
    assert!(
        !restored.join("marketplace.redb").exists(),
        "a failed restore left a (truncated) database behind: {}",
        text(&out.stderr)
    );
    // The whole file then restores into the same dir.
    let out = restore(&file, &restored);
    assert!(
        out.status.success(),
        "retry after a failed restore: {}",
        text(&out.stderr)
    );
    let mut r = server_on(&restored, &[]);
    assert_eq!(r.get(&format!("/api/posts/{id}")).status, 200);
    stop(&mut r, Duration::from_secs(30));
}

#[test]
fn uploads_survive_a_restart() {
    if common::skip_on_postgres(
        "uploads_survive_a_restart",
        "it checks the uploads kept in the data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let read = |f: &str| std::fs::read(common::plugins_dir().join(f)).unwrap();
    let (fees, template, search) = (
        read("fees_pickup_paid.wasm"),
        read("template.wasm"),
        read("search.wasm"),
    );
    let admin = |s: &Server, method: &str, path: &str, body: &[u8]| {
        common::deal::admin(s, method, path, body)
    };
    let plugin = |s: &Server, family: &str| -> Option<Value> {
        let r = admin(s, "GET", "/admin/plugins", b"");
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["family"] == family)
            .cloned()
    };
    let policy = |s: &Server| s.get("/api/fees").json()["arbitration"]["policy"].clone();

    let mut s = server_on(&data, &[]);
    assert_eq!(policy(&s), "bid-inclusive");
    let r = admin(&s, "PUT", "/admin/plugins/fees", &fees);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin(&s, "PUT", "/admin/plugins/template", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post_json("/api/template/notes", &json!({"note": "kept"}));
    assert!(r.status < 300, "{}", r.text());
    let r = admin(&s, "DELETE", "/admin/plugins/search", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/api/search?term=x").status, 404);
    stop(&mut s, Duration::from_secs(30));

    let mut s = server_on(&data, &[]);
    let p = plugin(&s, "fees").expect("fees is served");
    assert_eq!(p["hash"], sha256_hex(&fees), "{p}");
    assert_eq!(policy(&s), "pickup-paid");
    let p = plugin(&s, "template").expect("the mounted template is served");
    assert_eq!(p["hash"], sha256_hex(&template), "{p}");
    let r = s.get("/api/template/notes");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.text().contains("kept"), "{}", r.text());
    // A configured family an admin unmounted is listed as such.
    assert_eq!(
        plugin(&s, "search").map(|p| p["status"].clone()),
        Some(json!("unmounted")),
        "search was unmounted"
    );
    let r = s.get("/api/search?term=x");
    assert_eq!(r.status, 404, "{}", r.text());
    // Mounted again, then unmount template: both kept in turn.
    let r = admin(&s, "PUT", "/admin/plugins/search", &search);
    assert_eq!(r.status, 200, "{}", r.text());
    let r = admin(&s, "DELETE", "/admin/plugins/template", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    stop(&mut s, Duration::from_secs(30));

    let mut s = server_on(&data, &[]);
    assert_eq!(s.get("/api/search?term=x").status, 200);
    assert_eq!(
        plugin(&s, "search").expect("search mounted again")["hash"],
        sha256_hex(&search)
    );
    assert!(plugin(&s, "template").is_none(), "template was unmounted");
    assert_eq!(s.get("/api/template/notes").status, 404);
    assert_eq!(policy(&s), "pickup-paid");
    let kept = data.join("uploads");
    assert_eq!(mode(&kept), 0o700, "the uploads dir is owner-only");
    for entry in std::fs::read_dir(&kept).unwrap() {
        let path = entry.unwrap().path();
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }

    // A backup carries the uploads (the big mcp component too, so the
    // streamed answer is many chunks), and a restored server serves them.
    let mcp = read("mcp.wasm");
    let r = admin(&s, "PUT", "/admin/plugins/mcp", &mcp);
    assert_eq!(r.status, 200, "{}", r.text());
    // A client that goes away mid-backup leaves no snapshot behind.
    {
        let mut c = TcpStream::connect(s.admin).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        write!(
            c,
            "GET /admin/backup HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
        )
        .unwrap();
        let mut first = [0u8; 4096];
        let n = c.read(&mut first).unwrap();
        assert!(
            text(&first[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            text(&first[..n])
        );
    }
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<String> = std::fs::read_dir(&data)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(".backup-"))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < until,
            "left behind: {left:?}\n{}",
            s.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let file = dir.path().join("with-uploads.tar");
    let out = online_backup(&s, &file);
    assert!(out.status.success(), "backup: {}", text(&out.stderr));
    assert!(
        std::fs::metadata(&file).unwrap().len() > mcp.len() as u64,
        "{}",
        text(&out.stdout)
    );
    // A backup still streaming to a client that does not read holds the
    // shutdown up no longer than the drain, and leaves no snapshot behind.
    let mut slow = TcpStream::connect(s.admin).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    write!(
        slow,
        "GET /admin/backup HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN_TOKEN}\r\n\r\n"
    )
    .unwrap();
    let mut first = [0u8; 12];
    slow.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    stop(&mut s, Duration::from_secs(30));
    drop(slow);
    let left: Vec<String> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".backup-"))
        .collect();
    assert!(left.is_empty(), "left behind by the shutdown: {left:?}");
    let restored = dir.path().join("restored");
    let out = restore(&file, &restored);
    assert!(out.status.success(), "restore: {}", text(&out.stderr));
    assert_eq!(
        mode(&restored.join("uploads")),
        0o700,
        "restored uploads dir"
    );
    let mut r = server_on(&restored, &[]);
    assert_eq!(policy(&r), "pickup-paid");
    assert_eq!(plugin(&r, "search").unwrap()["hash"], sha256_hex(&search));
    assert_eq!(plugin(&r, "mcp").unwrap()["hash"], sha256_hex(&mcp));
    assert!(plugin(&r, "template").is_none(), "template was unmounted");
    assert_eq!(r.get("/openapi.json").status, 200);
    stop(&mut r, Duration::from_secs(30));
}

/// A second `serve` on a data dir another server holds says so, and what
/// to do, rather than only redb's "Cannot acquire lock".
#[test]
fn a_second_server_on_a_held_data_dir_says_what_holds_it() {
    if common::skip_on_postgres(
        "a_second_server_on_a_held_data_dir_says_what_holds_it",
        "about the lock of the redb file",
    ) {
        return;
    }
    let s = Server::start();
    let plugins = common::plugins_dir();
    let data = s.data_dir.to_str().unwrap().to_string();
    let out = run(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--data-dir",
            &data,
            "--plugins",
            plugins.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("another process has it open")
            && err.contains("start this server once it has exited"),
        "{err}"
    );
    // The first one serves on.
    assert_eq!(s.get("/api/health").status, 200);
}

#[test]
fn serve_creates_a_missing_data_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("new").join("deeper");
    let mut child = serve_command(&data).stderr(Stdio::piped()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let mut child = Kill(child);
    let err_t = std::thread::spawn(move || {
        let mut b = String::new();
        let _ = stderr.read_to_string(&mut b);
        b
    });
    let Some((admin, public)) = listening_addrs(stdout) else {
        let _ = child.0.kill();
        panic!(
            "no listening line; stderr:\n{}",
            err_t.join().unwrap_or_default()
        );
    };
    assert!(data.is_dir());
    assert_eq!(mode(&data), 0o700, "the new data dir's mode");
    let token_file = data.join("admin.token");
    assert_eq!(mode(&token_file), 0o600, "admin.token's mode");
    let token = std::fs::read_to_string(&token_file).unwrap();
    let token = token.trim();
    assert!(token.len() >= 32, "{token:?}");
    let auth = format!("Bearer {token}");
    let r = common::request(
        admin.expect("an admin listener"),
        "GET",
        "/admin/plugins",
        &[("authorization", &auth)],
        None,
    );
    assert_eq!(r.status, 200, "the generated token works: {}", r.text());
    let r = common::request(public, "GET", "/api/health", &[], None);
    assert_eq!(r.status, 200);
    let status = child.terminate();
    assert_eq!(status.code(), Some(0), "{}", err_t.join().unwrap());
}

/// `serve` on `data` with the built components, public and admin
/// listeners on free ports, stdout piped (see [`listening_addrs`]).
fn serve_command(data: &Path) -> Command {
    let mut cmd = bare_command();
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ])
    .arg("--data-dir")
    .arg(data)
    .arg("--plugins")
    .arg(common::plugins_dir())
    .stdin(Stdio::null())
    .stdout(Stdio::piped());
    cmd
}

/// The admin and public addresses `serve` writes on stdout, once it has
/// written the public one; `None` when stdout ends or 120 s pass first.
fn listening_addrs(stdout: std::process::ChildStdout) -> Option<(Option<SocketAddr>, SocketAddr)> {
    use std::io::BufRead;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let mut admin = None;
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        let line = rx
            .recv_timeout(until.saturating_duration_since(Instant::now()))
            .ok()?;
        if let Some(a) = line.strip_prefix("marketplace admin listening on http://") {
            admin = Some(a.parse().unwrap());
        }
        if let Some(a) = line.strip_prefix("marketplace listening on http://") {
            return Some((admin, a.parse().unwrap()));
        }
    }
}

/// Log lines that cannot be written (stderr full, or its reader gone)
/// are dropped, not a panic: the server starts, answers a request that
/// logs a warning (a wrong admin token), and exits 0 on SIGTERM; a
/// refused command still exits 1.
#[test]
fn an_unwritable_stderr_stops_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("d");
    let full = || {
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap()
    };
    let mut child = serve_command(&data).stderr(full()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = Kill(child);
    let (admin, public) = listening_addrs(stdout).expect("a listening line");
    let r = common::request(
        admin.expect("an admin listener"),
        "GET",
        "/admin/plugins",
        &[("authorization", "Bearer not-the-token-0123456789abcdef")],
        None,
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let r = common::request(public, "GET", "/api/health", &[], None);
    assert_eq!(r.status, 200, "{}", r.text());
    let status = child.terminate();
    assert_eq!(status.code(), Some(0));
    let out = bare_command()
        .args(["cash", "mint", "0", "--data-dir"])
        .arg(&data)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(full())
        .status()
        .unwrap();
    assert_eq!(out.code(), Some(1));
}

/// The offline commands create a missing data dir as `serve` does:
/// owner-only, whatever the umask.
#[test]
fn an_offline_mint_makes_the_data_dir_private() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("minted");
    let mut cmd = Command::new("sh");
    for (k, _) in std::env::vars() {
        if k.starts_with("MARKETPLACE_") {
            cmd.env_remove(k);
        }
    }
    let out = cmd
        .arg("-c")
        .arg("umask 000; exec \"$0\" cash mint 1 --data-dir \"$1\"")
        .arg(BIN)
        .arg(&data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).starts_with("e1:secret:"), "{out:?}");
    assert_eq!(mode(&data), 0o700, "the data dir");
    assert_eq!(mode(&data.join("marketplace.redb")), 0o600, "the database");
    assert_eq!(mode(&data.join("server.key")), 0o600, "server.key");
}

/// Why a start stops is said in the log's format even when it is the
/// configuration that is refused, before the log is set up: with a JSON
/// log asked for (by the flag, or by the config file) one JSON `ERROR`
/// line `exiting: ...` naming the setting; with text, the `error: ...`
/// line. A missing plugins directory is an `exiting:` line of the log.
/// Before, every refused setting was a plain line, which a JSON log
/// pipeline drops.
#[test]
fn a_refused_configuration_is_said_in_the_logs_format() {
    let tmp = tempfile::tempdir().unwrap();
    let plugins = tmp.path().join("plugins");
    std::fs::create_dir_all(&plugins).unwrap();
    let serve_from = |plugins: &Path, extra: &[&str]| {
        let out = bare_command()
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(tmp.path().join("data"))
            .arg("--plugins")
            .arg(plugins)
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
        text(&out.stderr)
    };
    let serve = |extra: &[&str]| serve_from(&plugins, extra);
    let json_line = |err: &str| -> Value {
        let lines: Vec<&str> = err.lines().collect();
        assert_eq!(lines.len(), 1, "{err}");
        serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {err}"))
    };
    let loopback = ["--admin-listen", "0.0.0.0:1"];
    let line = json_line(&serve(&[&["--log-format", "json"][..], &loopback].concat()));
    assert_eq!(line["level"], "ERROR", "{line}");
    let message = line["fields"]["message"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("exiting: ") && message.contains("admin_listen must be a loopback"),
        "{line}"
    );
    let config = tmp.path().join("json.toml");
    std::fs::write(
        &config,
        "log_format = \"json\"\nmax_body_bytes = \"lots\"\n",
    )
    .unwrap();
    let line = json_line(&serve(&["--config", config.to_str().unwrap()]));
    let message = line["fields"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("max_body_bytes"), "{line}");
    let err = serve(&loopback);
    assert!(
        err.starts_with("error: ") && err.contains("admin_listen"),
        "{err}"
    );
    let err = serve_from(&tmp.path().join("none"), &["--log-format", "json"]);
    let line = json_line(&err);
    let message = line["fields"]["message"].as_str().unwrap_or_default();
    assert!(message.starts_with("exiting: plugins_dir"), "{line}");
}

/// A listen address another process holds stops the start before the
/// data dir is made: a mistyped port leaves nothing behind.
#[test]
fn a_taken_address_stops_the_start_before_the_data_dir_is_made() {
    let tmp = tempfile::tempdir().unwrap();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = held.local_addr().unwrap().to_string();
    for (public, admin, says) in [
        (&*taken, "127.0.0.1:0", "public listener (listen)"),
        ("127.0.0.1:0", &*taken, "admin listener (admin_listen)"),
    ] {
        let data = tmp.path().join(says.replace(' ', "_"));
        let mut cmd = bare_command();
        cmd.args(["serve", "--listen", public, "--admin-listen", admin])
            .arg("--data-dir")
            .arg(&data)
            .arg("--plugins")
            .arg(common::plugins_dir());
        let out = cmd.output().unwrap();
        assert!(!out.status.success(), "{says}: {out:?}");
        let err = text(&out.stderr);
        assert!(err.contains(says) && err.contains(&taken), "{says}: {err}");
        assert!(!data.exists(), "{says}: the data dir was made: {err}");
    }
}

/// The operator CLI's rough edges: a mint with no data dir named and no
/// database in `./data` is refused (the secret would be worth nothing);
/// a reader that goes away (`| head`) ends the output without a panic;
/// `plugins` commands take the token from `--data-dir`; the admin API
/// refuses a misspelled parameter, a read grant of no family, a family
/// name that is not one and a core module, each saying which.
#[test]
fn cli_and_admin_refuse_what_would_silently_go_wrong() {
    let tmp = tempfile::tempdir().unwrap();
    let out = bare_command()
        .current_dir(tmp.path())
        .args(["cash", "mint", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    assert!(text(&out.stderr).contains("no database at"), "{out:?}");
    assert!(!tmp.path().join("data").exists(), "a data dir was made");

    // Nobody reads the secret: the command still ends well (a named, fresh
    // data dir is minted into, as before the first start).
    let mut child = bare_command()
        .args(["cash", "mint", "1", "--data-dir"])
        .arg(tmp.path().join("fresh"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(!text(&out.stderr).contains("panicked"), "{out:?}");

    let s = Server::start();
    let tokens = tmp.path().join("tokens");
    std::fs::create_dir_all(&tokens).unwrap();
    std::fs::write(tokens.join("admin.token"), ADMIN_TOKEN).unwrap();
    let out = bare_command()
        .args(["plugins", "list", "--admin", &format!("http://{}", s.admin)])
        .arg("--data-dir")
        .arg(&tokens)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("\"family\""), "{out:?}");
    // ...or from the server's config file (README: the config it reads).
    let config = tmp.path().join("op.toml");
    std::fs::write(&config, format!("admin_token = \"{ADMIN_TOKEN}\"\n")).unwrap();
    let out = bare_command()
        .args(["plugins", "list", "--admin", &format!("http://{}", s.admin)])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(text(&out.stdout).contains("\"family\""), "{out:?}");
    // Without a token source, the error says where one comes from; the
    // public listener given as --admin, and a wrong token, say what to
    // check.
    let list = |admin: &str, extra: &[&str]| {
        let out = bare_command()
            .current_dir(tmp.path())
            .env_remove("MARKETPLACE_ADMIN_TOKEN")
            .args(["plugins", "list", "--admin", admin])
            .args(extra)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{out:?}");
        text(&out.stderr)
    };
    let admin_url = format!("http://{}", s.admin);
    let err = list(&admin_url, &[]);
    assert!(
        err.contains("no admin token") && err.contains("--data-dir") && err.contains("--token"),
        "{err}"
    );
    let err = list(&format!("http://{}", s.addr), &["--token", ADMIN_TOKEN]);
    assert!(
        err.contains("admin answered 404") && err.contains("is not the admin listener"),
        "{err}"
    );
    let err = list(&admin_url, &["--token", &"x".repeat(40)]);
    assert!(
        err.contains("admin answered 401") && err.contains("admin.token"),
        "{err}"
    );
    // The server says who presented it.
    s.wait_log("the wrong token's warn line", |log| {
        log.lines().any(|l| {
            l.contains("a wrong admin token was presented") && l.contains("peer=127.0.0.1:")
        })
    });

    let fees = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    for (query, field) in [("grant=payments", "grant"), ("read=nosuch", "read")] {
        let r = common::deal::admin(&s, "PUT", &format!("/admin/plugins/fees?{query}"), &fees);
        assert_eq!(r.status, 400, "{query}: {}", r.text());
        assert_eq!(r.json()["details"][0]["field"], field, "{query}");
    }
    // A family name that is not one, and a core module rather than a
    // component, are refused saying which.
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/NOTES", &fees);
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.json()["details"][0]["field"], "family");
    let core = b"\0asm\x01\0\0\0";
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/notes", core);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("core WebAssembly module"), "{}", r.text());
    // An empty body (an upload of a file that was not there) says so.
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/notes", b"");
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("the file is empty"), "{}", r.text());
    // Nothing was swapped.
    assert_eq!(
        s.get("/api/fees").json()["arbitration"]["policy"],
        "bid-inclusive"
    );
}

#[test]
fn cli_help_and_config_errors() {
    let limit = Duration::from_secs(60);
    for args in [
        &["--help"][..],
        &["serve", "--help"],
        &["cash", "mint", "--help"],
        &["plugins", "load", "--help"],
        &["backup", "--help"],
        &["restore", "--help"],
    ] {
        let out = run(args, &[], limit);
        assert!(
            out.status.success(),
            "marketplace {}: {out:?}",
            args.join(" ")
        );
        let stdout = text(&out.stdout);
        assert!(
            stdout.contains("Usage"),
            "marketplace {}: {stdout}",
            args.join(" ")
        );
    }
    assert!(text(&run(&["serve", "--help"], &[], limit).stdout).contains("--data-dir"));
    assert!(text(&run(&["backup", "--help"], &[], limit).stdout).contains("--to"));
    assert!(text(&run(&["--help"], &[], limit).stdout).contains("restore"));
    // The commands that open the data dir or talk to the admin listener
    // take the config and data dir, not the server's listeners.
    for args in [
        &["cash", "mint", "--help"][..],
        &["backup", "--help"],
        &["plugins", "list", "--help"],
    ] {
        let help = text(&run(args, &[], limit).stdout);
        assert!(
            help.contains("--config") && help.contains("--data-dir"),
            "{help}"
        );
        assert!(
            !help.contains("--listen") && !help.contains("--plugins"),
            "{help}"
        );
    }

    for args in [
        &["serve", "--nonsense"][..],
        &["--nonsense"],
        &["backup", "--to", "x.tar", "--bogus"],
        &["cash", "mint", "1", "--listen", "127.0.0.1:1"],
        &["restore"],
        &["frobnicate"],
    ] {
        let out = run(args, &[], limit);
        assert!(
            !out.status.success(),
            "marketplace {} succeeded: {out:?}",
            args.join(" ")
        );
        assert!(
            !out.stderr.is_empty(),
            "marketplace {}: nothing on stderr",
            args.join(" ")
        );
    }
    let out = run(&["serve", "--nonsense"], &[], limit);
    assert!(text(&out.stderr).contains("--nonsense"), "{out:?}");

    // Each refused setting is named, and nothing is served.
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let plugins = common::plugins_dir();
    let serve = [
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        data.to_str().unwrap(),
        "--plugins",
        plugins.to_str().unwrap(),
    ];
    for (var, value, named) in [
        ("MARKETPLACE_MAX_BODY_BYTES", "0", "max_body_bytes"),
        ("MARKETPLACE_ADMIN_TOKEN", "short", "admin_token"),
        ("MARKETPLACE_PLUGIN_FEES", "../x.wasm", "fees"),
        (
            "MARKETPLACE_DRAIN_TIMEOUT_MS",
            "forever",
            "drain_timeout_ms",
        ),
        ("MARKETPLACE_REQUEST_TIMEOUT_MS", "0", "request_timeout_ms"),
        ("MARKETPLACE_LOG", "info,=[", "log"),
        // RUST_LOG wins over `log`: a typo in it is refused as well.
        ("RUST_LOG", "marketplace=bogus", "RUST_LOG"),
    ] {
        let out = run(&serve, &[(var, value)], limit);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{var}={value} was accepted: {out:?}");
        assert!(
            stderr.contains(named),
            "{var}={value}: the message does not name {named}: {stderr}"
        );
        assert!(
            !text(&out.stdout).contains("listening"),
            "{var}={value}: it served"
        );
    }
    // RUST_LOG is no setting: beside a good MARKETPLACE_LOG, its error is
    // not put on that variable.
    let out = run(
        &serve,
        &[("RUST_LOG", "wran"), ("MARKETPLACE_LOG", "info")],
        limit,
    );
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("RUST_LOG \"wran\""),
        "{stderr}"
    );
    assert!(!stderr.contains("MARKETPLACE_LOG"), "{stderr}");
    assert!(!data.join("marketplace.redb").exists());
    // A plugins dir that is missing (a typo) or not a directory would serve
    // no route at all: refused, named.
    let a_file = tmp.path().join("a-file");
    std::fs::write(&a_file, b"x").unwrap();
    for plugins in [tmp.path().join("no-such-dir"), a_file.clone()] {
        let mut args = serve;
        args[8] = plugins.to_str().unwrap();
        let out = run(&args, &[], limit);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{plugins:?} was accepted: {out:?}");
        // Refused as a bad setting is: one `error:` line naming where it
        // was set.
        assert!(
            stderr.starts_with(&format!("error: plugins_dir {}", plugins.display()))
                && stderr.contains("(`plugins_dir` from the flag --plugins = "),
            "{stderr}"
        );
        assert!(
            !text(&out.stdout).contains("listening"),
            "{plugins:?}: it served"
        );
    }
    assert!(!data.join("marketplace.redb").exists());
    // A data dir or compile cache dir that is a file is named; so is an
    // admin token file (generated, or an operator's) shorter than a
    // configured token may be.
    let short = tmp.path().join("short-token");
    std::fs::create_dir(&short).unwrap();
    std::fs::write(short.join("admin.token"), b"short\n").unwrap();
    // A compile cache dir other users may write to (its compiled code
    // runs natively) is refused too.
    let open_cache = tmp.path().join("open-cache");
    std::fs::create_dir(&open_cache).unwrap();
    let mut open = std::fs::metadata(&open_cache).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut open, 0o1777);
    std::fs::set_permissions(&open_cache, open).unwrap();
    let group_cache = tmp.path().join("group-cache");
    std::fs::create_dir(&group_cache).unwrap();
    let mut group = std::fs::metadata(&group_cache).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut group, 0o770);
    std::fs::set_permissions(&group_cache, group).unwrap();
    for (data_dir, env, named) in [
        (&a_file, None, "data_dir"),
        (&data, Some(("MARKETPLACE_CACHE_DIR", &a_file)), "cache_dir"),
        (
            &data,
            Some(("MARKETPLACE_CACHE_DIR", &open_cache)),
            "other users may write to it",
        ),
        (
            &data,
            Some(("MARKETPLACE_CACHE_DIR", &group_cache)),
            "(mode 770)",
        ),
        (&short, None, "admin.token"),
    ] {
        let mut args = serve;
        args[6] = data_dir.to_str().unwrap();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.to_str().unwrap())).collect();
        let out = run(&args, &env, limit);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{named}: accepted: {out:?}");
        assert!(stderr.contains(named), "{named}: {stderr}");
        assert!(
            !text(&out.stdout).contains("listening"),
            "{named}: it served"
        );
    }
    // Two listeners on one port: refused naming both settings, before
    // anything is bound; and a public port already taken is refused
    // before any listener is announced (the admin one bound first).
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let other = format!("127.0.0.1:{}", free.local_addr().unwrap().port());
    drop(free);
    for (public, admin, named) in [
        (other.as_str(), other.as_str(), "admin_listen"),
        (&format!("127.0.0.1:{port}"), "127.0.0.1:0", "(listen)"),
    ] {
        let mut args = serve;
        (args[2], args[4]) = (public, admin);
        let out = run(&args, &[], limit);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{public} {admin}: accepted: {out:?}");
        assert!(stderr.contains(named), "{public} {admin}: {stderr}");
        assert!(
            !text(&out.stdout).contains("listening"),
            "{public} {admin}: a listener was announced: {}",
            text(&out.stdout)
        );
    }
    drop(taken);
    // A bad flag value too.
    let out = run(
        &[
            "serve",
            "--listen",
            "not-an-address",
            "--data-dir",
            data.to_str().unwrap(),
        ],
        &[],
        limit,
    );
    assert!(!out.status.success(), "{out:?}");
    assert!(
        text(&out.stderr).contains("listen"),
        "{}",
        text(&out.stderr)
    );
}

/// A family decided by an admin upload never serves its configured
/// component at start, not even while the other families load: it serves
/// nothing (503) until its kept upload is applied. (It used to serve the
/// configured component until every configured family had loaded, so for
/// seconds the configured fee policy served, and a contract bought then
/// kept it.) The upload is applied just before the host is ready, so an
/// answer before the ready line is not required, only that every answer
/// is the upload's.
#[test]
fn a_kept_upload_serves_from_the_first_answer_of_a_start() {
    if common::skip_on_postgres(
        "a_kept_upload_serves_from_the_first_answer_of_a_start",
        "the fleet's record is applied by the same code; this test starts a host by hand on a data dir",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let mut s = server_on(&data, &[]);
    let pickup = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/fees", &pickup);
    assert_eq!(r.status, 200, "{}", r.text());
    stop(&mut s, Duration::from_secs(30));

    let start = ColdStart::on(tmp.path(), &data);
    let (addr, rx, log_text) = (start.addr, &start.ready, || start.log_text());
    let until = Instant::now() + Duration::from_secs(120);
    let mut answered = 0;
    let mut ready = false;
    while !ready {
        ready = rx.try_recv().is_ok();
        assert!(Instant::now() < until, "never ready\n{}", log_text());
        let r = common::try_request(addr, "GET", "/api/fees", &[], None);
        if let Ok(r) = &r
            && r.status == 200
        {
            answered += 1;
            assert_eq!(
                r.json()["arbitration"]["policy"],
                "pickup-paid",
                "the configured fee policy served at start\n{}",
                log_text()
            );
        } else if ready {
            panic!("no fee schedule once ready: {r:?}\n{}", log_text());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("{answered} fee schedules answered, the last once ready");
}

/// Uploads and unmounts through the admin API are refused while the host
/// starts (503 `plugin_unavailable`, `Retry-After`): until every family
/// is loaded the start decides what serves. (An upload made while the
/// start had read the kept records and not yet replayed them was partly
/// undone: the new file served under the old record's name and grants.)
/// Sent again once the host is ready, it is what serves, and what a
/// restart serves. A cold start (an empty compile cache: seconds of
/// compiling) leaves the change time to come while the families load.
#[test]
fn an_admin_change_while_the_host_starts_waits_for_it_to_be_ready() {
    if common::skip_on_postgres(
        "an_admin_change_while_the_host_starts_waits_for_it_to_be_ready",
        "this test starts a host by hand on a data dir; the fleet's records are replayed by the same code",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let pickup = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    let (before, after) = (
        common::with_custom_section(&pickup, "upload", b"before"),
        common::with_custom_section(&pickup, "upload", b"after"),
    );
    let mut s = server_on(&data, &[]);
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/fees", &before);
    assert_eq!(r.status, 200, "{}", r.text());
    let kept = (r.json()["hash"].clone(), r.json()["component"].clone());
    stop(&mut s, Duration::from_secs(30));

    let auth = format!("Bearer {ADMIN_TOKEN}");
    let admin = |at: SocketAddr, method: &str, path: &str, body: Option<&[u8]>| {
        common::request(at, method, path, &[("authorization", &auth)], body)
    };
    let fees = |at: SocketAddr| {
        let r = admin(at, "GET", "/admin/plugins", None);
        assert_eq!(r.status, 200, "{}", r.text());
        let fees = r
            .json()
            .as_array()
            .expect("a JSON list")
            .iter()
            .find(|p| p["family"] == "fees")
            .cloned()
            .expect("fees listed");
        (fees["hash"].clone(), fees["component"].clone())
    };
    let start = ColdStart::with_admin(tmp.path(), &data);
    let at = start.admin.unwrap();
    let refused = [
        admin(at, "PUT", "/admin/plugins/fees", Some(&after)),
        admin(at, "DELETE", "/admin/plugins/fees", None),
    ];
    if let Ok(line) = start.ready.try_recv() {
        panic!(
            "ready ({line:?}) before the changes were answered: nothing tested\n{}",
            start.log_text()
        );
    }
    for r in &refused {
        assert_eq!(
            (r.status, r.code().as_str(), r.header("retry-after")),
            (503, "plugin_unavailable", Some("1")),
            "{}",
            r.text()
        );
    }
    start
        .ready
        .recv_timeout(Duration::from_secs(120))
        .expect("ready");
    // What the start replayed serves, untouched by the refused changes.
    assert_eq!(fees(at), kept, "{}", start.log_text());
    let r = admin(at, "PUT", "/admin/plugins/fees", Some(&after));
    assert_eq!(r.status, 200, "{}", r.text());
    let uploaded = (r.json()["hash"].clone(), r.json()["component"].clone());
    assert_eq!(uploaded.0, marketplace_common::hex::sha256(&after).as_str());
    assert_eq!(fees(at), uploaded);
    drop(start);

    let again = ColdStart::with_admin(tmp.path(), &data);
    again
        .ready
        .recv_timeout(Duration::from_secs(120))
        .expect("ready");
    assert_eq!(fees(again.admin.unwrap()), uploaded, "{}", again.log_text());
}

/// A first start (empty compile cache): each family serves as soon as its
/// own component is ready. Health answers while the large `mcp` component
/// (a JavaScript engine) still compiles, a path no loaded family serves is
/// 503 with Retry-After until every family is loaded (it may be one of the
/// loading ones'), and the stdout line scripts wait for comes once all are.
#[test]
fn a_first_start_serves_each_family_as_soon_as_it_is_ready() {
    if common::skip_on_postgres(
        "a_first_start_serves_each_family_as_soon_as_it_is_ready",
        "the start order does not depend on the store",
    ) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let start = ColdStart::on(tmp.path(), &tmp.path().join("data"));
    let (addr, rx, log_text) = (start.addr, &start.ready, || start.log_text());

    let until = Instant::now() + Duration::from_secs(120);
    let first = loop {
        if let Ok(r) = common::try_request(addr, "GET", "/api/health", &[], None)
            && r.status == 200
        {
            break r;
        }
        assert!(
            Instant::now() < until,
            "health never answered\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    // Health is the host's: it answers before any family is ready, and
    // says so.
    assert_eq!(first.json()["status"], "loading", "{}", first.text());
    let plugins = &first.json()["plugins"];
    assert_eq!(
        plugins["mcp"]["status"],
        "loading",
        "health answered only once mcp was loaded: {plugins}\n{}",
        log_text()
    );
    // A small family serves while mcp still loads.
    let info = loop {
        let r = common::request(addr, "GET", "/api/info", &[], None);
        if r.status == 200 {
            break r;
        }
        assert_eq!(r.code(), "plugin_unavailable", "{}", r.text());
        assert!(
            Instant::now() < until,
            "info never answered\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(info.json()["plugins"]["info"]["status"], "ok");
    assert!(
        rx.try_recv().is_err(),
        "the ready line came before every family was loaded"
    );
    let r = common::request(
        addr,
        "POST",
        "/mcp",
        &[("content-type", "application/json")],
        Some(b"{}"),
    );
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.code(), "plugin_unavailable");
    assert_eq!(r.header("retry-after"), Some("1"));

    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_else(|_| panic!("no ready line\n{}", log_text()));
    assert_eq!(
        line.trim(),
        format!("marketplace listening on http://{addr}")
    );
    let health = common::request(addr, "GET", "/api/health", &[], None).json();
    assert_eq!(health["status"], "ok", "{health}");
    for (family, p) in health["plugins"].as_object().unwrap() {
        assert_eq!(p["status"], "ok", "{family}: {health}");
    }
    assert_eq!(
        common::request(addr, "GET", "/no/such/route", &[], None).status,
        404
    );
    let log = log_text();
    for family in common::BUILTIN_FAMILIES {
        assert!(
            log.lines()
                .any(|l| l.contains("family ready") && l.contains(&format!("family={family} "))),
            "no load time logged for {family}\n{log}"
        );
    }
}

/// The CLI presents the `admin_token` of the config it reads (the
/// server's own config, say), when no --token or environment gives one.
#[test]
fn the_cli_takes_the_admin_token_from_its_config() {
    let s = Server::start();
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("ops.toml");
    std::fs::write(
        &config,
        format!(
            "admin_token = \"{}\"\ndata_dir = \"{}\"\n",
            common::ADMIN_TOKEN,
            tmp.path().join("no-token-file-here").display()
        ),
    )
    .unwrap();
    let out = bare_command()
        .args(["cash", "mint", "1", "--admin"])
        .arg(format!("http://{}", s.admin))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let secret = text(&out.stdout).trim().to_string();
    assert!(secret.starts_with("e1:secret:"), "{secret}");
    assert_eq!(s.cash_state(&secret).0, json!(false));
}

/// Behind a reverse proxy (`trusted_proxies`), a request's client is the
/// address the proxies name in `X-Forwarded-For`, read from the right past
/// the trusted ones (what a client writes further left is not believed),
/// and the access log shows it. From any other peer the header is ignored:
/// anyone can send it.
#[test]
fn behind_a_trusted_proxy_the_access_log_names_the_forwarded_client() {
    let line_of = |s: &Server, rid: &str| -> String {
        let tag = format!("request{{id={rid}}}: request: ");
        s.wait_log(rid, |log| log.lines().any(|l| l.contains(&tag)));
        let log = s.log_text();
        let line = log.lines().find(|l| l.contains(&tag)).unwrap();
        line[line.find(&tag).unwrap() + tag.len()..].to_string()
    };
    let forwarded = |s: &Server, rid: &str, chain: &str| {
        let r = s.request(
            "GET",
            "/api/health",
            &[("x-request-id", rid), ("x-forwarded-for", chain)],
            None,
        );
        assert_eq!(r.status, 200, "{}", r.text());
    };
    let behind = Server::with(Options {
        env: vec![(
            "MARKETPLACE_TRUSTED_PROXIES".into(),
            "127.0.0.1, 10.0.0.0/8".into(),
        )],
        ..Default::default()
    });
    forwarded(&behind, "proxied-1", "203.0.113.66, 198.51.100.7, 10.1.2.3");
    assert!(
        line_of(&behind, "proxied-1")
            .starts_with("client=198.51.100.7 method=GET path=/api/health "),
        "{}",
        line_of(&behind, "proxied-1")
    );
    // Nothing the proxy could read as an address: the proxy itself.
    forwarded(&behind, "proxied-2", "unknown");
    assert!(line_of(&behind, "proxied-2").starts_with("client=127.0.0.1 "));
    // A direct client's own header is not believed.
    let direct = Server::start();
    forwarded(&direct, "direct-1", "198.51.100.7");
    assert!(
        line_of(&direct, "direct-1").starts_with("client=127.0.0.1 method=GET "),
        "{}",
        line_of(&direct, "direct-1")
    );
}

/// Many systems start a process with a soft limit of 1,024 open files,
/// under what the default `max_connections` (1,024 clients, and up to 512
/// more connections draining after their answer) needs: past it `accept`
/// fails and clients wait. `serve` raises its soft limit to what its
/// configuration needs, within the hard limit, and says so.
#[test]
fn serve_raises_a_low_open_files_limit() {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let mut cmd = bare_command();
    cmd.args(["serve", "--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--plugins")
        .arg(common::plugins_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    // SAFETY: only setrlimit (async-signal-safe) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let mut limit = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
            limit.rlim_cur = 256;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
            Ok(())
        });
    }
    let mut child = Kill(cmd.spawn().unwrap());
    let stdout = child.0.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    assert!(
        lines
            .next()
            .and_then(Result::ok)
            .is_some_and(|l| l.contains("listening on")),
        "no listening line"
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.0.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    let (soft, hard) = (numbers[0], numbers[1]);
    // max_connections 1,024 + 512 draining + 64 store connections + 256.
    let needed = 1024 + 512 + 64 + 256;
    let expected = match hard.parse::<u64>() {
        Ok(hard) => hard.min(needed),
        Err(_) => needed, // unlimited
    };
    assert_eq!(soft.parse::<u64>().unwrap(), expected, "{line}");
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(
        log.contains("open-files limit raised") && log.contains("from=256"),
        "{log}"
    );
    // A hard limit under what is needed: raised that far, and said.
    if expected < needed {
        assert!(log.contains("open-files limit is below"), "{log}");
    }
}

/// A mint with an idempotency key can be sent again after its answer was
/// lost: the same key and amount give the same secret and mint nothing
/// more, through the admin API, the CLI through it, and the CLI into a
/// stopped server's data dir; the key with another amount is refused (a
/// key names one mint), nothing minted.
#[test]
fn a_keyed_mint_repeats_its_secret_and_mints_once() {
    let s = Server::start();
    let mint = |body: serde_json::Value| {
        let r = s.admin_request("POST", "/admin/cash/mint", &body);
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["secret"].as_str().unwrap().to_string()
    };
    let keyed = json!({"amount": "1.5", "idempotency_key": "order-42"});
    let secret = mint(keyed.clone());
    assert!(secret.starts_with("e1.5:secret:"), "{secret}");
    assert_eq!(mint(keyed.clone()), secret);
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 150_000_000);
    s.wait_log("the repeat logged as such", |l| l.contains("mint repeated"));
    // The key with another amount: 409, naming what it minted first.
    for amount in ["1", "1.50000001", "15"] {
        let r = s.admin_request(
            "POST",
            "/admin/cash/mint",
            &json!({"amount": amount, "idempotency_key": "order-42"}),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "idempotency_conflict"),
            "{amount}: {}",
            r.text()
        );
        assert!(r.text().contains("already minted 1.5"), "{}", r.text());
    }
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 150_000_000);
    // Another key or no key: another secret, minted.
    let others = [
        mint(json!({"amount": "1", "idempotency_key": "order-44"})),
        mint(json!({"amount": "1.5", "idempotency_key": "order-43"})),
        mint(json!({"amount": "1.5"})),
        mint(json!({"amount": "1.5", "idempotency_key": null})),
    ];
    assert!(others.iter().all(|o| *o != secret), "{others:?}");
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);
    // Spent, the key still names the same (spent) secret: no new value.
    let out = format!("e1.5:secret:{}", "ab".repeat(32));
    let r = s.post_json(
        "/api/cash/replace",
        &json!({"webcashes": [secret], "new_webcashes": [out]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(mint(keyed), secret);
    assert_eq!(s.cash_state(&secret).0, json!(true));
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);
    for bad in [json!(""), json!("a b"), json!("k".repeat(129)), json!(7)] {
        let r = s.admin_request(
            "POST",
            "/admin/cash/mint",
            &json!({"amount": "1", "idempotency_key": bad}),
        );
        assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
        assert_eq!(r.json()["details"][0]["field"], "idempotency_key");
    }
    // An amount that is missing, or not a string, says which it is.
    for (body, says) in [
        (json!({}), "is required"),
        (json!({"amount": null}), "is required"),
        (json!({"amount": 5}), "must be a string"),
        (json!({"amount": 1.5}), "must be a string"),
    ] {
        let r = s.admin_request("POST", "/admin/cash/mint", &body);
        assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
        let detail = &r.json()["details"][0];
        assert_eq!(detail["field"], "amount", "{body}");
        let issue = detail["problem"].as_str().unwrap_or_default();
        assert!(issue.starts_with(says), "{body}: {}", r.text());
    }
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);
    // A member the route does not know (a misspelled key would mint again
    // on every retry) and a body that is no JSON object are refused.
    for (body, field) in [
        (
            r#"{"amount": "1", "idempotencyKey": "order-43"}"#,
            "idempotencyKey",
        ),
        (r#"{"amount": "1", "extra": 1}"#, "extra"),
        ("notjson", "body"),
        (r#"["amount", "1"]"#, "body"),
    ] {
        let r = s.admin_raw("POST", "/admin/cash/mint", Some(body.as_bytes()));
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{body}"
        );
        assert_eq!(r.json()["details"][0]["field"], field, "{body}");
    }
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);

    // The CLI, through the admin listener: the same secret again.
    let admin = format!("http://{}", s.admin);
    let cli = |args: &[&str]| {
        let out = bare_command().args(args).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout).trim().to_string()
    };
    // A command refused, saying `says` on stderr.
    let refused = |args: &[&str], says: &str| {
        let out = bare_command().args(args).output().unwrap();
        assert!(!out.status.success(), "{out:?}");
        assert!(text(&out.stderr).contains(says), "{out:?}");
    };
    let through = ["cash", "mint", "1.5", "--idempotency-key", "order-42"];
    let token = ["--admin", &admin, "--token", ADMIN_TOKEN];
    assert_eq!(cli(&[&through[..], &token[..]].concat()), secret);
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);

    // The CLI into a data dir, twice: one secret, minted once.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let offline = ["cash", "mint", "2", "--idempotency-key", "k1"];
    let in_dir = ["--data-dir", dir.to_str().unwrap()];
    let first = cli(&[&offline[..], &in_dir].concat());
    assert!(first.starts_with("e2:secret:"), "{first}");
    assert_eq!(cli(&[&offline[..], &in_dir].concat()), first);
    let bad_key = ["cash", "mint", "1", "--idempotency-key", "no spaces"];
    refused(&[&bad_key[..], &in_dir].concat(), "--idempotency-key");
    // The key with another amount, offline and through the admin API: a
    // refusal that says what the key minted, nothing minted.
    let other_amount = ["cash", "mint", "3", "--idempotency-key", "k1"];
    refused(&[&other_amount[..], &in_dir].concat(), "already minted 2");
    let other_amount = ["cash", "mint", "2", "--idempotency-key", "order-42"];
    refused(&[&other_amount[..], &token].concat(), "409");
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 700_000_000);
    // A data dir whose server.key is lost: no key is made for it (one made
    // now would derive other secrets, and "k1" would mint again); with
    // another key put in its place, "k1" is refused rather than minted
    // twice.
    let key_file = dir.join("server.key");
    let kept = std::fs::read(&key_file).unwrap();
    std::fs::remove_file(&key_file).unwrap();
    refused(&[&offline[..], &in_dir].concat(), "server.key is missing");
    assert!(
        !key_file.exists(),
        "a key was made for a database that had one"
    );
    std::fs::write(&key_file, "5c".repeat(32)).unwrap();
    refused(
        &[&offline[..], &in_dir].concat(),
        "minted under another server key",
    );
    std::fs::write(&key_file, &kept).unwrap();
    assert_eq!(cli(&[&offline[..], &in_dir].concat()), first);
    // The data dir is a redb file, whatever backend the suite runs on.
    if common::backend_is_postgres() {
        return;
    }
    let d = Server::with(Options {
        data_dir: Some(dir.clone()),
        ..Options::default()
    });
    assert_eq!(d.metric("marketplace_ledger_minted_units"), 200_000_000);
    assert_eq!(d.cash_state(&first), (json!(false), json!("2")));
    drop(d);
    // Served with another key in the file (the alert's case), the admin
    // API refuses the key's repeat too: 409, nothing minted.
    std::fs::write(&key_file, "5c".repeat(32)).unwrap();
    let d = Server::with(Options {
        data_dir: Some(dir),
        ..Options::default()
    });
    let r = d.admin_request(
        "POST",
        "/admin/cash/mint",
        &json!({"amount": "2", "idempotency_key": "k1"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "idempotency_conflict"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("another server key"), "{}", r.text());
    assert_eq!(d.metric("marketplace_ledger_minted_units"), 200_000_000);
}

/// With `server_key` (and `arbiter_key`) configured there are no key files:
/// the offline mint derives under the configured key as the server does
/// (the same idempotency key gives the same secret through either), makes
/// no key file of its own, and backups, online and offline, hold the keys
/// in force.
#[test]
fn a_configured_server_key_is_the_one_minted_under_and_backed_up() {
    if common::skip_on_postgres(
        "a_configured_server_key_is_the_one_minted_under_and_backed_up",
        "backups and the offline mint are of the embedded store",
    ) {
        return;
    }
    let (hex, arbiter) = ("5a".repeat(32), "6b".repeat(32));
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let env = [
        ("MARKETPLACE_SERVER_KEY", hex.as_str()),
        ("MARKETPLACE_ARBITER_KEY", arbiter.as_str()),
    ];
    let mint = |extra: &[&str]| {
        let out = run(
            &[&["cash", "mint", "1", "--idempotency-key", "same-1"], extra].concat(),
            &env,
            Duration::from_secs(60),
        );
        assert!(out.status.success(), "{out:?}");
        text(&out.stdout).trim().to_string()
    };
    let offline = mint(&["--data-dir", dir.to_str().unwrap()]);
    assert!(!dir.join("server.key").exists(), "a key file was made");

    let mut s = Server::with(Options {
        data_dir: Some(dir.clone()),
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Options::default()
    });
    let admin = format!("http://{}", s.admin);
    let online = mint(&["--admin", &admin, "--token", ADMIN_TOKEN]);
    assert_eq!(online, offline, "one key, one secret");
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 100_000_000);

    let file = tmp.path().join("online.tar");
    let out = online_backup(&s, &file);
    assert!(out.status.success(), "{out:?}\n{}", s.log_text());
    s.stop();
    let out = run(
        &[
            "backup",
            "--to",
            tmp.path().join("offline.tar").to_str().unwrap(),
            "--data-dir",
            dir.to_str().unwrap(),
        ],
        &env,
        Duration::from_secs(60),
    );
    assert!(out.status.success(), "{out:?}");
    for name in ["online.tar", "offline.tar"] {
        let restored = tmp.path().join(format!("restored-{name}"));
        let out = restore(&tmp.path().join(name), &restored);
        assert!(out.status.success(), "{out:?}");
        assert_eq!(
            std::fs::read_to_string(restored.join("server.key")).unwrap(),
            hex,
            "{name}"
        );
        assert_eq!(
            std::fs::read_to_string(restored.join("arbiter.key")).unwrap(),
            arbiter,
            "{name}"
        );
    }
    assert!(!dir.join("server.key").exists());
    assert!(!dir.join("arbiter.key").exists());
}

// ------------------------------------------ what a start tells the operator

/// A write-ahead log segment an earlier start (or an offline command)
/// kept aside as damaged is still an alert at every later start, until the
/// operator removes it: an offline `cash mint --data-dir` that found the
/// damage says so on stderr, and the next `serve` lists it in health's
/// `alerts` rather than starting clean.
#[test]
fn a_damaged_log_segment_kept_aside_is_an_alert_at_every_start() {
    if common::skip_on_postgres(
        "a_damaged_log_segment_kept_aside_is_an_alert_at_every_start",
        "the write-ahead log is the embedded store's",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut s = server_on(&data, &[]);
    assert_eq!(s.get("/api/health").json()["alerts"], json!([]));
    s.stop();
    // What an earlier start leaves when it found the log damaged.
    let kept = data.join("marketplace.redb-wal.00000000000000fe.damaged");
    std::fs::write(&kept, b"whole records the database does not hold").unwrap();
    let named = kept.display().to_string();

    // An offline command opens the data dir as a start does, and says so.
    let out = run(
        &["cash", "mint", "1", "--data-dir", data.to_str().unwrap()],
        &[],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("ERROR") && err.contains(&named),
        "stderr: {err}"
    );
    assert!(text(&out.stdout).contains(":secret:"));

    let mut s = server_on(&data, &[]);
    let h = s.get("/api/health");
    assert_eq!(h.status, 200, "{}", h.text());
    let alerts = h.json()["alerts"].clone();
    assert_eq!(alerts.as_array().map(Vec::len), Some(1), "{alerts}");
    assert_eq!(alerts[0]["kind"], "wal_damaged", "{alerts}");
    assert!(
        alerts[0]["message"].as_str().unwrap().contains(&named),
        "{alerts}"
    );
    assert_eq!(s.metric("marketplace_alerts"), 1);
    s.stop();
    // Removed by the operator: the next start is clean.
    std::fs::remove_file(&kept).unwrap();
    let s = server_on(&data, &[]);
    assert_eq!(s.get("/api/health").json()["alerts"], json!([]));
}

/// A component uploaded through the admin API is kept for restarts; one
/// the next start cannot load (a damaged file) leaves the configured
/// component serving, and health says so in `alerts`, since what serves
/// is not what the operator decided last.
#[test]
fn a_kept_upload_refused_at_start_is_an_alert() {
    if common::skip_on_postgres(
        "a_kept_upload_refused_at_start_is_an_alert",
        "a shared store keeps uploads in the store, not in the data dir",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut s = server_on(&data, &[]);
    let policy = |s: &Server| s.get("/api/fees").json()["arbitration"]["policy"].clone();
    let bid_inclusive = policy(&s);
    assert_eq!(bid_inclusive, "bid-inclusive");
    let wasm = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/fees", &wasm);
    assert_eq!(r.status, 200, "{}", r.text());
    let pickup_paid = policy(&s);
    assert_ne!(pickup_paid, bid_inclusive);
    s.stop();
    // Kept across a restart, as decided.
    let mut s = server_on(&data, &[]);
    assert_eq!(policy(&s), pickup_paid);
    assert_eq!(s.get("/api/health").json()["alerts"], json!([]));
    s.stop();

    let file = data.join("uploads").join("fees.wasm");
    let bytes = std::fs::read(&file).expect("the kept upload");
    std::fs::write(&file, &bytes[..5000]).unwrap();
    let s = server_on(&data, &[]);
    let h = s.get("/api/health");
    assert_eq!(policy(&s), bid_inclusive, "the configured component serves");
    let alerts = h.json()["alerts"].clone();
    assert_eq!(alerts[0]["kind"], "kept_upload_refused", "{}", h.text());
    let message = alerts[0]["message"].as_str().unwrap();
    assert!(
        message.contains("fees") && message.contains("fees_bid_inclusive.wasm serves instead"),
        "{alerts}"
    );
    assert_eq!(s.metric("marketplace_alerts"), 1);
    // Doing what it asks (the upload again) settles it (plugin-author
    // probe: it stayed until the next restart).
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/fees", &wasm);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(policy(&s), pickup_paid);
    assert_eq!(s.get("/api/health").json()["alerts"], json!([]));
    assert_eq!(s.metric("marketplace_alerts"), 0);

    // A family that exists only by its upload: refused at a start, it is
    // not mounted at all, and the unmount README offers still settles it
    // (an outside audit's unmount was 404 and the alert stayed).
    let template = std::fs::read(common::plugins_dir().join("template.wasm")).unwrap();
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/hello", &template);
    assert_eq!(r.status, 200, "{}", r.text());
    let mut s = s;
    s.stop();
    let file = data.join("uploads").join("hello.wasm");
    let bytes = std::fs::read(&file).expect("the kept upload");
    std::fs::write(&file, &bytes[..5000]).unwrap();
    let mut s = server_on(&data, &[]);
    let h = s.get("/api/health").json();
    assert_eq!(h["alerts"][0]["kind"], "kept_upload_refused", "{h}");
    assert!(h["plugins"].get("hello").is_none(), "{h}");
    let r = common::deal::admin(&s, "DELETE", "/admin/plugins/hello", b"");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["kept_upload_dropped"], true, "{}", r.text());
    assert_eq!(s.get("/api/health").json()["alerts"], json!([]));
    // Settled for good: the next start neither tries it nor alerts.
    s.stop();
    let s = server_on(&data, &[]);
    let h = s.get("/api/health").json();
    assert_eq!(h["alerts"], json!([]), "{h}");
    assert!(h["plugins"].get("hello").is_none(), "{h}");
    let r = common::deal::admin(&s, "DELETE", "/admin/plugins/hello", b"");
    assert_eq!(r.status, 404, "nothing left to settle: {}", r.text());
}

/// Health's `commits` counts committed mutating requests (PROTOCOL 8): none
/// on a fresh start (the host's own start-up writes are not requests),
/// then one per paid request.
#[test]
fn health_counts_requests_commits_not_the_starts_own() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for start in 0..2 {
        let mut s = server_on(&data, &[]);
        let commits = |s: &Server| s.get("/api/health").json()["storage"]["commits"].clone();
        assert_eq!(commits(&s), json!(0), "start {start}");
        // The operator's mint is a mutating request too.
        let secret = s.mint("0.6");
        assert_eq!(commits(&s), json!(1), "start {start}");
        let r = s.register(&Key::random(), &format!("counted{start}"), &secret);
        assert_eq!(r.status, 201, "{}", r.text());
        assert_eq!(commits(&s), json!(2), "start {start}");
        s.stop();
    }
}

/// The lines scripts wait for are printed on stdout; a stdout nobody reads
/// (a closed pipe) does not stop the server, with its admin and metrics
/// listeners too.
#[test]
fn a_closed_stdout_does_not_stop_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("server.log");
    let mut cmd = serve_command(&dir.path().join("data"));
    cmd.args(["--metrics-listen", "127.0.0.1:0"])
        .env("MARKETPLACE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stderr(std::fs::File::create(&log).unwrap());
    let mut child = Kill(cmd.spawn().unwrap());
    // The read end closed before the server writes a line.
    drop(child.0.stdout.take());
    // Each listener says where it is in the log (stdout has no reader).
    let public = logged_addr(&mut child, &log, "listening on http://");
    let admin = logged_addr(&mut child, &log, "admin listener on http://");
    logged_addr(&mut child, &log, "metrics listener on http://");
    let until = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the server exited: {:?}",
            child.0.try_wait()
        );
        let r = common::request(public, "GET", "/api/health", &[], None);
        if r.status == 200 && r.json()["status"] == "ok" {
            break;
        }
        assert!(Instant::now() < until, "never ready");
        std::thread::sleep(Duration::from_millis(100));
    }
    // Every line has been written (or failed) by now; it still serves.
    std::thread::sleep(Duration::from_millis(300));
    assert!(child.0.try_wait().unwrap().is_none(), "the server exited");
    assert_eq!(
        common::request(public, "GET", "/api/fees", &[], None).status,
        200
    );
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let r = common::request(
        admin,
        "GET",
        "/admin/plugins",
        &[("authorization", &auth)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The admin listener logs a path as the public one logs a path no route
/// took: a cash secret (or a token-like segment) in it is not written.
#[test]
fn the_admin_listeners_access_log_shows_no_secret() {
    let s = Server::start();
    let secret = s.mint("0.5");
    let auth = format!("Bearer {ADMIN_TOKEN}");
    for headers in [vec![], vec![("authorization", auth.as_str())]] {
        let r = common::request(s.admin, "GET", &format!("/admin/{secret}"), &headers, None);
        assert!(matches!(r.status, 401 | 404), "{}", r.text());
    }
    s.wait_log("the admin access lines", |log| {
        log.matches("path=/admin/{redacted}").count() >= 2
    });
    let hex = secret.rsplit(':').next().unwrap();
    assert!(!s.log_text().contains(hex), "the secret is in the log");
}

/// The mapping of `/proc/<pid>/smaps` holding address `at`, as its lines
/// (the address line first).
fn mapping_at(pid: u32, at: u64) -> Option<Vec<String>> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).ok()?;
    let mut found: Option<Vec<String>> = None;
    for line in smaps.lines() {
        // An address line (`7f..-7f.. rw-p ...`) starts a mapping; field
        // lines are `Name: value`.
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((lo, hi)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            if found.is_some() {
                break;
            }
            let range = u64::from_str_radix(lo, 16).ok()?..u64::from_str_radix(hi, 16).ok()?;
            if range.contains(&at) {
                found = Some(Vec::new());
            }
        }
        if let Some(m) = found.as_mut() {
            m.push(line.to_string());
        }
    }
    found
}

fn smaps_kib(mapping: &[String], field: &str) -> u64 {
    mapping
        .iter()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn the_heap_moves_to_small_pages_when_huge_pages_are_turned_off() {
    if !Path::new("/proc/self/smaps").exists() {
        return; // not Linux
    }
    // heap_huge_pages = false: the heap moves to an arena of 4 KiB pages
    // at start; the log says where, and the mapping there is marked for
    // no huge pages, has none, and holds the heap's memory.
    let s = Server::with(Options {
        env: vec![("MARKETPLACE_HEAP_HUGE_PAGES".into(), "false".into())],
        ..Options::default()
    });
    s.wait_log("the heap's arena", |t| t.contains("heap: small pages"));
    let log = s.log_text();
    let field = |name: &str| {
        log.split(name)
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .map(str::to_string)
            .unwrap_or_else(|| panic!("{name} in the log: {log}"))
    };
    let mib: u64 = field("arena_mib=").parse().unwrap();
    let at = u64::from_str_radix(field("at=").trim_start_matches("0x"), 16).unwrap();
    assert!(mib >= 64, "{mib} MiB");
    for _ in 0..20 {
        assert_eq!(s.get("/api/search?term=heap").status, 200);
    }
    let arena = mapping_at(s.pid(), at).expect("a mapping at the arena's start");
    assert!(arena[0].contains(" rw-p "), "{arena:?}");
    let flags = arena
        .iter()
        .find_map(|l| l.strip_prefix("VmFlags:"))
        .unwrap_or("");
    assert!(flags.split_whitespace().any(|f| f == "nh"), "{arena:?}");
    assert_eq!(smaps_kib(&arena, "AnonHugePages:"), 0, "{arena:?}");
    assert!(
        smaps_kib(&arena, "Rss:") >= 1024,
        "the heap's memory is in the arena: {arena:?}"
    );
    drop(s);

    // By default the heap stays in mimalloc's own arenas (huge pages
    // where the kernel gives them).
    let plain = Server::start();
    assert_eq!(plain.get("/api/health").status, 200);
    assert!(!plain.log_text().contains("heap: small pages"));
}

/// A data dir's disk with less free space than `min_free_disk_mib` (here a
/// reserve no disk has) refuses writing requests before they run, 503
/// `disk_full` with Retry-After, nothing spent, directly or dispatched
/// from an MCP tool call; reads, the webcash health check and the
/// operator's mint go on, health's alert says why, and an online backup
/// (a copy of the database in the data dir first) is refused. A start with
/// room takes the same secret. (A full disk made the write-ahead log's
/// checkpoint fail, every write after it until a restart, and the next
/// start itself.)
#[test]
fn a_disk_under_its_reserve_refuses_writes_and_serves_reads() {
    if common::skip_on_postgres(
        "a_disk_under_its_reserve_refuses_writes_and_serves_reads",
        "the reserve is the embedded store's data dir's",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut s = server_on(&data, &[]);
    let key = Key::random();
    let r = s.register(&key, "roomy", &s.mint("0.6"));
    assert_eq!(r.status, 201, "{}", r.text());
    let before = s.post(&key, "written before", json!({}), &s.mint("0.3"));
    assert_eq!(before.status, 201, "{}", before.text());
    s.stop();

    let mut s = server_on(&data, &[("MARKETPLACE_MIN_FREE_DISK_MIB", "1073741824")]);
    // Health says so, in an alert; its status stays ok (taking the host
    // out of a load balancer would stop its reads and free nothing).
    let h = s.get("/api/health");
    assert_eq!(h.status, 200, "{}", h.text());
    assert_eq!(h.json()["status"], "ok");
    assert_eq!(h.json()["storage"]["status"], "disk_full");
    assert_eq!(h.json()["alerts"][0]["kind"], "disk_full", "{}", h.text());
    assert!(s.metric("marketplace_disk_free_bytes") > 0);
    // An online backup, which first copies the database into the data
    // dir, is refused too.
    let r = s.admin_raw("GET", "/admin/backup", None);
    assert_eq!(
        (r.status, r.code().as_str()),
        (507, "insufficient_storage"),
        "{}",
        r.text()
    );
    let refused = |r: &common::Resp| {
        assert_eq!(
            (r.status, r.code().as_str()),
            (503, "disk_full"),
            "{}",
            r.text()
        );
        assert_eq!(r.header("retry-after"), Some("30"));
    };
    let secret = s.mint("0.3");
    refused(&s.post(&key, "written while full", json!({}), &secret));
    let change = format!("e0.3:secret:{}", "c".repeat(64));
    let replace = json!({"webcashes": [secret], "new_webcashes": [change]});
    refused(&s.post_json("/api/cash/replace", &replace));
    let r = s.post_json(
        "/api/mcp/tools/execute",
        &json!({"endpoint": {"method": "POST", "path": "/api/cash/replace", "body": replace}}),
    );
    refused(&r);
    assert_eq!(s.cash_state(&secret), (json!(false), json!("0.3")));
    assert_eq!(s.cash_state(&change).0, Value::Null, "never created");
    let r = s.get("/api/timeline");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["posts"][0]["content"], "written before");
    let r = s.get("/api/search?term=written");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        s.log_text()
            .contains("the data dir's disk is nearly full: writing requests are refused"),
        "logged for the operator"
    );
    s.stop();

    // A killed backup's copy of the database is removed at start.
    let left = data.join(".backup-killed");
    std::fs::create_dir_all(&left).unwrap();
    std::fs::write(left.join("marketplace.redb"), b"a copy").unwrap();
    let s = server_on(&data, &[]);
    assert!(!left.exists(), "a killed backup's copy is left");
    let h = s.get("/api/health").json();
    assert_eq!(
        (&h["storage"]["status"], &h["alerts"]),
        (&json!("ok"), &json!([]))
    );
    let r = s.post(&key, "written with room", json!({}), &secret);
    assert_eq!(r.status, 201, "{}", r.text());
}

/// Requests admitted while the disk had room can still write past its
/// reserve together before the next read of the free space (a plugin's
/// 60 MiB writes, four at once, filled a tmpfs: the checkpoint failed and
/// every write after it until a restart). So a commit is charged three
/// times its writes against the room left: one that does not fit is 503
/// `disk_full`, nothing of it kept; a small one passes.
#[test]
fn a_commit_larger_than_the_disks_room_is_refused() {
    if common::skip_on_postgres(
        "a_commit_larger_than_the_disks_room_is_refused",
        "the reserve is the embedded store's data dir's",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // What the server's guard reads, read the same way.
    let free_mib = marketplace::store::disk::free_bytes(dir.path()).unwrap() >> 20;
    if free_mib < 1024 {
        eprintln!("a_commit_larger_than_the_disks_room_is_refused: skipped, {free_mib} MiB free");
        return;
    }
    // 200 MiB of room beyond the reserve (other tests may write or free a
    // little meanwhile: the commits below are far from its edge).
    let reserve = (free_mib - 200).to_string();
    let s = Server::with(Options {
        testing_routes: true,
        data_dir: Some(dir.path().join("data")),
        env: vec![
            ("MARKETPLACE_MIN_FREE_DISK_MIB".into(), reserve),
            (
                "MARKETPLACE_MAX_REQUEST_WRITE_BYTES".into(),
                (256u64 << 20).to_string(),
            ),
        ],
        ..Options::default()
    });
    let r = s.post_json("/_testing/write?key=big&fill_mib=120", &json!({}));
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "disk_full"),
        "{}",
        r.text()
    );
    let r = s.get("/_testing/read?key=big");
    assert_eq!(r.json()["value"], Value::Null, "nothing of it kept");
    let r = s.post_json("/_testing/write?key=small&fill_mib=1", &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/_testing/read?key=small").json()["value"], "v");
}

/// SIGHUP, which operators send a daemon out of habit to have it reload,
/// killed the server at once (its default action): no drain, paid writes
/// committed but never answered (an outside operator audit). It is said
/// in the log and changes nothing; SIGTERM still drains.
#[test]
fn sighup_is_logged_and_the_server_serves_on() {
    let mut s = Server::start();
    s.signal("HUP");
    s.wait_log("the SIGHUP line", |log| log.contains("SIGHUP ignored"));
    assert_eq!(s.get("/api/health").status, 200);
    let key = s.identity("after_hup");
    let r = s.post(&key, "still serving", json!({}), &s.mint("0.3"));
    assert_eq!(r.status, 201, "{}", r.text());
    s.signal("TERM");
    let status = s
        .wait_exit(Duration::from_secs(10))
        .expect("exits on SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// The admin listener drains as the public one does: a request sent on a
/// keep-alive admin connection just after SIGTERM (a mint an operator's
/// script sent as the signal came) is answered, then the connection
/// closes; before, the connection was closed at the signal and the mint
/// went unanswered (an outside money audit).
#[test]
fn sigterm_answers_an_admin_request_on_its_way() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = server_on(&dir.path().join("data"), &[]);
    let auth = format!("authorization: Bearer {}\r\n", common::ADMIN_TOKEN);
    let request = format!("GET /admin/plugins HTTP/1.1\r\nhost: admin\r\n{auth}\r\n");
    let mut conn = TcpStream::connect(s.admin).unwrap();
    conn.write_all(request.as_bytes()).unwrap();
    let (seen, reusable) = read_response(&mut conn);
    assert!(matches!(seen, Seen::Answered(200, _)), "{seen:?}");
    assert!(reusable);
    s.signal("TERM");
    // Inside the half second a connection between requests lingers.
    std::thread::sleep(Duration::from_millis(100));
    conn.write_all(request.as_bytes()).unwrap();
    let answer =
        read_to_close(&mut conn).unwrap_or_else(|e| panic!("not answered ({e})\n{}", s.log_text()));
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // It says the connection closes, so the client sends no more on it.
    assert!(
        answer.to_ascii_lowercase().contains("connection: close"),
        "{answer}"
    );
    exits_cleanly(&mut s);
}

/// `store_cache_mib` at its least: a request whose writes outgrow the
/// cache (a 3 MiB upload: redb flushes its pages before the commit) and
/// many small ones commit whole, read back byte for byte, and are there
/// after a clean stop and after a kill -9.
#[test]
fn a_one_mib_store_cache_keeps_every_write() {
    if common::skip_on_postgres(
        "a_one_mib_store_cache_keeps_every_write",
        "store_cache_mib is the embedded store's",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let small = [("MARKETPLACE_STORE_CACHE_MIB", "1")];
    let mut s = server_on(&data, &small);
    let author = s.identity("pages");
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend((0..3 << 20u32).map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8));
    let file = s.upload(&author, "big.png", "image/png", &png);
    let file = format!(
        "/api/storage/files/{}",
        file.strip_prefix("files/").unwrap()
    );
    let posts: Vec<String> = (0..40)
        .map(|i| {
            s.new_post(
                &author,
                &format!("page {i} {}", "words ".repeat(200)),
                json!({}),
            )
        })
        .collect();
    let check = |s: &Server, when: &str| {
        assert!(s.get(&file).body == png, "{when}: the upload differs");
        let mut seen: Vec<String> = common::posts_of(s, &author.fp()).into_values().collect();
        seen.sort();
        let mut want = posts.clone();
        want.sort();
        assert_eq!(seen, want, "{when}");
    };
    check(&s, "served");
    s.stop();
    let mut s = server_on(&data, &small);
    check(&s, "after a stop");
    let last = s.new_post(&author, "the last one", json!({}));
    s.kill();
    let s = server_on(&data, &small);
    let r = s.get(&format!("/api/posts/{last}"));
    assert_eq!(r.status, 200, "after a kill: {}", r.text());
    assert!(s.get(&file).body == png, "after a kill: the upload differs");
}

/// A drain that runs out while the admin listener still serves a request
/// (an upload of a large component compiling) says so in the log, as the
/// public listener's does; before, the log said only `stopped` (an outside
/// probe), and the operator could not tell what became of the upload.
#[test]
fn a_drain_cutting_an_admin_upload_says_so() {
    let mut s = Server::with(common::Options {
        env: vec![("MARKETPLACE_DRAIN_TIMEOUT_MS".into(), "1000".into())],
        ..Options::default()
    });
    // The mcp component under a hash no cache has compiled: seconds of
    // compiling on any machine.
    let wasm = common::uncached_component("mcp.wasm", "drain-test");
    let admin = s.admin;
    let upload = std::thread::spawn(move || {
        common::request(
            admin,
            "PUT",
            "/admin/plugins/mcp",
            &[("authorization", &format!("Bearer {ADMIN_TOKEN}"))],
            Some(&wasm),
        )
    });
    // Its body is in (9 MB over loopback) and its compile under way.
    std::thread::sleep(Duration::from_millis(500));
    s.signal("TERM");
    assert!(s.wait_exit(Duration::from_secs(30)).is_some(), "no exit");
    let _ = upload.join();
    let log = s.log_text();
    assert!(
        log.contains(
            "drain timeout: the admin listener's requests still running were not answered"
        ),
        "{log}"
    );
}
