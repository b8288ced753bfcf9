//! Black-box test harness: starts the real `marketplace` binary with the real
//! built plugins on a free port and a temporary data dir, and talks HTTP/1.1
//! to it with `ureq` (and, for the tests that write raw bytes, over plain
//! TCP).
#![allow(dead_code)]

pub mod deal;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader, Read};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{LazyLock, mpsc};
use std::time::Duration;

/// The families a default configuration serves.
pub const BUILTIN_FAMILIES: [&str; 7] = [
    "info",
    "identity",
    "timeline",
    "search",
    "contracts",
    "mcp",
    "fees",
];

/// One compile cache for every server and in-process host of this build:
/// compiling the mcp component (a JavaScript engine) per test would
/// dominate the suite.
pub fn compile_cache() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("compile-cache")
}

/// Directory of the built plugin components (`cargo xtask build-plugins`).
pub fn plugins_dir() -> PathBuf {
    let exe = PathBuf::from(env!("CARGO_BIN_EXE_marketplace"));
    let dir = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("binary inside a target dir")
        .join("plugins");
    assert!(
        dir.join("info.wasm").is_file(),
        "plugins are not built in {}: run `cargo xtask test` (or `cargo xtask build-plugins` first)",
        dir.display()
    );
    dir
}

/// The built `name` component (`mcp.wasm`, say) with a custom section
/// appended that names `tag` and the time: the same component under a hash
/// no compile cache holds, so loading it compiles (seconds for `mcp`).
pub fn uncached_component(name: &str, tag: &str) -> Vec<u8> {
    let mut wasm = std::fs::read(plugins_dir().join(name)).unwrap();
    let payload = format!("{:?}", std::time::SystemTime::now());
    let size = 1 + tag.len() + payload.len();
    assert!(size < 128, "one-byte LEB128 sizes");
    wasm.extend_from_slice(&[0, size as u8, tag.len() as u8]);
    wasm.extend_from_slice(tag.as_bytes());
    wasm.extend_from_slice(payload.as_bytes());
    wasm
}

/// The PostgreSQL server the tests may use (`MARKETPLACE_TEST_PG`, a
/// `postgres://` URL; `cargo xtask test` starts a throwaway cluster and
/// sets it when PostgreSQL is installed).
pub fn pg_url() -> Option<String> {
    std::env::var("MARKETPLACE_TEST_PG")
        .ok()
        .filter(|u| !u.is_empty())
}

/// Whether the black-box suite runs on the PostgreSQL backend
/// (`MARKETPLACE_TEST_BACKEND=postgres`): every `Server::with` then stores
/// in `pg_url()`, in a schema of its data dir. Tests about the redb file
/// itself skip themselves then.
pub fn backend_is_postgres() -> bool {
    std::env::var("MARKETPLACE_TEST_BACKEND").is_ok_and(|b| b == "postgres")
}

/// Under the PostgreSQL backend, print that `test` is skipped and return
/// true: for tests inherently about the redb file (`if
/// common::skip_on_postgres("...", "why") { return; }`).
pub fn skip_on_postgres(test: &str, why: &str) -> bool {
    let skip = backend_is_postgres();
    if skip {
        eprintln!("{test}: skipped on the PostgreSQL backend: {why}");
    }
    skip
}

/// The schema a server on `data_dir` uses under the PostgreSQL backend:
/// one per data dir, so a restart on the same dir sees the same data.
pub fn schema_of(data_dir: &Path) -> String {
    use sha2::{Digest, Sha256};
    let path = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = Sha256::digest(path.as_os_str().as_encoded_bytes());
    format!("t_{}", &hex(&digest)[..24])
}

/// The storage of the (stopped) server on `data_dir`: its redb file, or
/// under the PostgreSQL backend its schema of the shared store.
pub fn open_store(data_dir: &Path) -> marketplace::store::Storage {
    if backend_is_postgres() {
        let url = pg_url().expect("MARKETPLACE_TEST_PG");
        marketplace::store::Storage::open_pg(
            &url,
            &schema_of(data_dir),
            2,
            std::time::Duration::from_secs(10),
            Default::default(),
        )
        .expect("opening the server's schema")
    } else {
        marketplace::store::Storage::open(&data_dir.join("marketplace.redb"), Default::default())
            .expect("opening the stopped server's database")
    }
}

/// Every byte the server on `data_dir` stored: its redb file, or under the
/// PostgreSQL backend every keyspace, key and value of its schema (as a
/// dump of the database would hold them).
pub fn stored_bytes(data_dir: &Path) -> Vec<u8> {
    if !backend_is_postgres() {
        return std::fs::read(data_dir.join("marketplace.redb")).expect("the database file");
    }
    let url = pg_url().expect("MARKETPLACE_TEST_PG");
    let sql = format!("SELECT ks, k, v FROM \"{}\".kv", schema_of(data_dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connecting to the test cluster");
        tokio::spawn(conn);
        let mut out = Vec::new();
        for row in client
            .query(sql.as_str(), &[])
            .await
            .expect("reading the schema")
        {
            let (ks, k, v): (String, Vec<u8>, Vec<u8>) = (row.get(0), row.get(1), row.get(2));
            out.extend_from_slice(ks.as_bytes());
            out.extend_from_slice(&k);
            out.extend_from_slice(&v);
        }
        out
    })
}

/// A fresh random schema name (for tests that share one among hosts).
pub fn random_schema(prefix: &str) -> String {
    let mut raw = [0u8; 10];
    getrandom::fill(&mut raw).unwrap();
    format!("{prefix}_{}", hex(&raw))
}

/// The PostgreSQL URL for a test that needs one; `None` (after saying the
/// test is skipped) when `MARKETPLACE_TEST_PG` is unset, unless
/// `MARKETPLACE_REQUIRE_PG=1`, then a panic.
pub fn pg_or_skip(test: &str) -> Option<String> {
    let url = pg_url();
    if url.is_none() {
        assert!(
            std::env::var("MARKETPLACE_REQUIRE_PG").as_deref() != Ok("1"),
            "{test}: MARKETPLACE_REQUIRE_PG=1 but MARKETPLACE_TEST_PG is not set \
             (run `cargo xtask test`, which starts a PostgreSQL cluster)"
        );
        eprintln!(
            "{test}: skipped: MARKETPLACE_TEST_PG is not set (no PostgreSQL; \
             `cargo xtask test` starts one when PostgreSQL is installed)"
        );
    }
    url
}

/// Admin token every test server gets.
pub const ADMIN_TOKEN: &str = "test-admin-token-0123456789abcdef";

/// Unix seconds now.
pub fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An Ed25519 identity for tests.
pub struct Key(ed25519_dalek::SigningKey);

impl Key {
    /// A fresh random key.
    pub fn random() -> Key {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).unwrap();
        Key(ed25519_dalek::SigningKey::from_bytes(&seed))
    }

    /// The fingerprint: lower-case hex of the public key.
    pub fn fp(&self) -> String {
        hex(self.0.verifying_key().as_bytes())
    }

    /// Hex signature of `message`.
    pub fn sign(&self, message: &str) -> String {
        use ed25519_dalek::Signer;
        hex(&self.0.sign(message.as_bytes()).to_bytes())
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A running server; killed when dropped.
pub struct Server {
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// The `metrics_listen` listener, when the server was given one.
    pub metrics: Option<SocketAddr>,
    child: Child,
    pub data_dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    /// Where `Options::config` was written, for the server's life.
    _config: Option<tempfile::TempDir>,
    pub log: PathBuf,
}

/// Options of a test server.
#[derive(Default, Clone)]
pub struct Options {
    pub testing_routes: bool,
    /// Extra `MARKETPLACE_*` environment settings.
    pub env: Vec<(String, String)>,
    /// Reuse this data dir (restart tests) instead of a fresh one.
    pub data_dir: Option<PathBuf>,
    pub plugins_dir: Option<PathBuf>,
    /// A TOML configuration file's text, given as `MARKETPLACE_CONFIG`.
    pub config: Option<String>,
    /// Most bytes of address space the server may map (`ulimit -v`).
    pub address_space: Option<u64>,
}

/// Limit the address space of the process `cmd` starts to `bytes`.
fn limit_address_space(cmd: &mut Command, bytes: u64) {
    use std::os::unix::process::CommandExt;
    // SAFETY: setrlimit is async-signal-safe, and nothing else runs
    // between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let limit = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl Server {
    pub fn start() -> Server {
        Self::with(Options::default())
    }

    pub fn testing() -> Server {
        Self::with(Options {
            testing_routes: true,
            ..Options::default()
        })
    }

    pub fn with(opts: Options) -> Server {
        Self::try_with(opts).unwrap_or_else(|log| panic!("server did not start; log:\n{log}"))
    }

    /// A server of `opts`, or its log when it did not start.
    pub fn try_with(opts: Options) -> Result<Server, String> {
        let (tmp, data_dir) = match &opts.data_dir {
            Some(d) => (None, d.clone()),
            None => {
                let t = tempfile::tempdir().expect("temp dir");
                let d = t.path().join("data");
                (Some(t), d)
            }
        };
        std::fs::create_dir_all(&data_dir).unwrap();
        let log = data_dir.join(format!("server-{}.log", std::process::id()));
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_marketplace"));
        cmd.arg("serve")
            .arg("--listen")
            .arg("127.0.0.1:0")
            .arg("--data-dir")
            .arg(&data_dir)
            .arg("--plugins")
            .arg(opts.plugins_dir.clone().unwrap_or_else(plugins_dir))
            .arg("--admin-listen")
            .arg("127.0.0.1:0")
            .env("MARKETPLACE_ADMIN_TOKEN", ADMIN_TOKEN)
            .env_remove("MARKETPLACE_CONFIG")
            // The test harness's own settings, not the server's.
            .env_remove("MARKETPLACE_TEST_PG")
            .env_remove("MARKETPLACE_TEST_BACKEND")
            .env_remove("MARKETPLACE_TEST_PG_SUITE")
            .env_remove("MARKETPLACE_REQUIRE_PG")
            .env("MARKETPLACE_LOG", "info")
            .env("MARKETPLACE_CACHE_DIR", compile_cache())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log_file));
        if opts.testing_routes {
            cmd.arg("--testing-routes");
        }
        if backend_is_postgres() && !opts.env.iter().any(|(k, _)| k == "MARKETPLACE_STORE") {
            let url = pg_url().expect(
                "MARKETPLACE_TEST_BACKEND=postgres needs MARKETPLACE_TEST_PG (`cargo xtask test` sets it)",
            );
            cmd.env("MARKETPLACE_STORE", url)
                .env("MARKETPLACE_STORE_SCHEMA", schema_of(&data_dir));
        }
        let config = opts.config.as_ref().map(|toml| {
            let dir = tempfile::tempdir().expect("temp dir");
            let file = dir.path().join("marketplace.toml");
            std::fs::write(&file, toml).unwrap();
            cmd.env("MARKETPLACE_CONFIG", &file);
            dir
        });
        for (k, v) in &opts.env {
            cmd.env(k, v);
        }
        if let Some(bytes) = opts.address_space {
            limit_address_space(&mut cmd, bytes);
        }
        let mut child = cmd.spawn().expect("spawn marketplace");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut admin, mut metrics) = (None, None);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(addr) = line.strip_prefix("marketplace admin listening on http://") {
                    admin = Some(addr.parse::<SocketAddr>().unwrap());
                }
                if let Some(addr) = line.strip_prefix("marketplace metrics listening on http://") {
                    metrics = Some(addr.parse::<SocketAddr>().unwrap());
                }
                if let Some(addr) = line.strip_prefix("marketplace listening on http://") {
                    let _ = tx.send((
                        addr.parse::<SocketAddr>().unwrap(),
                        admin.expect("admin line first"),
                        metrics,
                    ));
                }
            }
        });
        let (addr, admin, metrics) = match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::fs::read_to_string(&log).unwrap_or_default());
            }
        };
        Ok(Server {
            addr,
            admin,
            metrics,
            child,
            data_dir,
            _tmp: tmp,
            _config: config,
            log,
        })
    }

    pub fn get(&self, path: &str) -> Resp {
        self.request("GET", path, &[], None)
    }

    /// Whether the served OpenAPI document lists `status` among the
    /// answers of `method path` (path as templated in the document).
    pub fn documents(&self, method: &str, path: &str, status: u16) -> bool {
        let doc = self.get("/openapi.json").json();
        doc["paths"][path][method.to_ascii_lowercase()]["responses"]
            .get(status.to_string())
            .is_some()
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Resp {
        self.request(
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.to_string().as_bytes()),
        )
    }

    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&[u8]>,
    ) -> Resp {
        request(self.addr, method, path, headers, body)
    }

    /// Mint a secret through the admin listener.
    pub fn mint(&self, amount: &str) -> String {
        let r = self.admin_request(
            "POST",
            "/admin/cash/mint",
            &serde_json::json!({"amount": amount}),
        );
        assert_eq!(r.status, 200, "mint: {}", r.text());
        r.json()["secret"].as_str().unwrap().to_string()
    }

    /// `POST /api/storage/presign` by `key` (signed `presign:{file_path}`,
    /// public), as the original client asks for an upload URL; the answer.
    pub fn presign(&self, key: &Key, file_path: &str, content_type: &str) -> Value {
        let r = self.post_json(
            "/api/storage/presign",
            &json!({
                "fingerprint": key.fp(), "file_path": file_path, "content_type": content_type,
                "is_public": true, "signature": key.sign(&format!("presign:{file_path}")),
            }),
        );
        assert_eq!(r.status, 200, "presign: {}", r.text());
        r.json()
    }

    /// Upload `bytes` as the original client does (`POST
    /// /api/storage/presign` signed `presign:{file_path}`, then `PUT` to the
    /// presigned URL): the upload's `s3_key`.
    pub fn upload(&self, key: &Key, file_path: &str, content_type: &str, bytes: &[u8]) -> String {
        let p = self.presign(key, file_path, content_type);
        let r = self.request(
            "PUT",
            &path_of(p["presigned_url"].as_str().unwrap()),
            &[("content-type", content_type)],
            Some(bytes),
        );
        assert_eq!(r.status, 200, "upload: {}", r.text());
        p["s3_key"].as_str().unwrap().to_string()
    }

    /// A metric's value from the admin listener's `GET /metrics`.
    pub fn metric(&self, name: &str) -> u64 {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        let r = request(
            self.admin,
            "GET",
            "/metrics",
            &[("authorization", &auth)],
            None,
        );
        assert_eq!(r.status, 200, "metrics: {}", r.text());
        let text = r.text();
        let line = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} in the metrics:\n{text}"));
        let value = line.split_whitespace().nth(1).unwrap();
        value
            .parse::<f64>()
            .unwrap_or_else(|e| panic!("{name} {value}: {e}")) as u64
    }

    /// An authenticated admin request with a JSON body.
    pub fn admin_request(&self, method: &str, path: &str, body: &Value) -> Resp {
        self.admin_raw(method, path, Some(body.to_string().as_bytes()))
    }

    /// An authenticated admin request with these body bytes, if any (a
    /// body that is no JSON, or none).
    pub fn admin_raw(&self, method: &str, path: &str, body: Option<&[u8]>) -> Resp {
        let auth = format!("Bearer {ADMIN_TOKEN}");
        request(self.admin, method, path, &[("authorization", &auth)], body)
    }

    /// POST JSON with extra headers.
    pub fn post_with(&self, path: &str, headers: &[(&str, &str)], body: &Value) -> Resp {
        let mut h = vec![("content-type", "application/json")];
        h.extend_from_slice(headers);
        self.request("POST", path, &h, Some(body.to_string().as_bytes()))
    }

    /// A JSON POST written on a socket of its own with exactly these
    /// header lines after the framing ones (no `host` unless given), their
    /// values as raw bytes: for what HTTP clients will not send (a header
    /// twice, bytes outside ASCII, no or another Host).
    pub fn raw_post(&self, path: &str, headers: &[(&str, &[u8])], body: &Value) -> Resp {
        use std::io::Write;
        let body = body.to_string();
        let mut req = format!(
            "POST {path} HTTP/1.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            body.len()
        )
        .into_bytes();
        for (name, value) in headers {
            req.extend_from_slice(name.as_bytes());
            req.extend_from_slice(b": ");
            req.extend_from_slice(value);
            req.extend_from_slice(b"\r\n");
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body.as_bytes());
        let mut stream = connect(self.addr);
        stream.write_all(&req).unwrap();
        read_response(&mut stream)
    }

    /// A paid POST carrying `secret` in X-Cash-Secret.
    pub fn post_paid(&self, path: &str, secret: &str, body: &Value) -> Resp {
        self.post_with(path, &[("x-cash-secret", secret)], body)
    }

    /// `POST /api/cash/health_check` for one secret: (spent, amount).
    pub fn cash_state(&self, secret: &str) -> (Value, Value) {
        let r = self.post_json("/api/cash/health_check", &serde_json::json!([secret]));
        assert_eq!(r.status, 200, "{}", r.text());
        let results = r.json()["results"].clone();
        let (_, v) = results.as_object().unwrap().iter().next().unwrap();
        (v["spent"].clone(), v["amount"].clone())
    }

    /// Register an identity with a fresh signature, paying with `secret`.
    pub fn register(&self, key: &Key, nickname: &str, secret: &str) -> Resp {
        let ts = now_s();
        self.post_paid(
            "/api/identity",
            secret,
            &serde_json::json!({
                "nickname": nickname,
                "pgp_public_key": key.fp(),
                "signature": key.sign(&format!("register:{nickname}:{ts}")),
                "timestamp": ts,
            }),
        )
    }

    /// A registered identity (pays with a freshly minted secret).
    pub fn identity(&self, nickname: &str) -> Key {
        let key = Key::random();
        let r = self.register(&key, nickname, &self.mint("0.6"));
        assert_eq!(r.status, 201, "register {nickname}: {}", r.text());
        key
    }

    /// Create a post (or comment) signed freshly by `key`; `extra` members
    /// (post_type, parent_id, keywords, attachments...) are merged in.
    pub fn post(&self, key: &Key, content: &str, extra: Value, secret: &str) -> Resp {
        let ts = now_s();
        let mut body = serde_json::json!({
            "author_fingerprint": key.fp(),
            "content": content,
            "signature": key.sign(&format!("post:{content}:{ts}")),
            "timestamp": ts,
        });
        if let Value::Object(extra) = extra {
            for (k, v) in extra {
                body[k] = v;
            }
        }
        self.post_paid("/api/timeline", secret, &body)
    }

    /// `GET /api/timeline?{query}` (answered 200): its post ids in order,
    /// and its `next_before`.
    pub fn timeline_page(&self, query: &str) -> (Vec<String>, Option<String>) {
        let r = self.get(&format!("/api/timeline?{query}"));
        assert_eq!(r.status, 200, "{}", r.text());
        let page = r.json();
        let ids = page["posts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["post_id"].as_str().unwrap().to_string())
            .collect();
        (ids, page["next_before"].as_str().map(str::to_string))
    }

    /// `POST /api/posts/delete` signed by `key` with the legacy message
    /// (`delete_post:{post_id}`, the original client's).
    pub fn delete_post(&self, key: &Key, post_id: &str) -> Resp {
        self.post_json(
            "/api/posts/delete",
            &json!({
                "post_id": post_id,
                "author_fingerprint": key.fp(),
                "signature": key.sign(&format!("delete_post:{post_id}")),
            }),
        )
    }

    /// Create a post paid with a fresh secret; returns its post_id.
    pub fn new_post(&self, key: &Key, content: &str, extra: Value) -> String {
        let r = self.post(key, content, extra, &self.mint("0.3"));
        assert_eq!(r.status, 201, "post: {}", r.text());
        r.json()["post_id"].as_str().unwrap().to_string()
    }

    /// Kill the server like a crash would (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn log_text(&self) -> String {
        read_log(&self.log)
    }

    /// Wait up to 30 s (a loaded machine) for the log to satisfy `pred`: a
    /// busy worker writes its lines when it runs out of work, so a line may
    /// follow the answer.
    pub fn wait_log(&self, what: &str, pred: impl Fn(&str) -> bool) {
        let until = std::time::Instant::now() + Duration::from_secs(30);
        while !pred(&self.log_text()) {
            assert!(
                std::time::Instant::now() < until,
                "never in the log: {what}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stop the server as an operator would (SIGTERM, so every log line is
    /// written), or kill it if it has not exited within 10 s.
    pub fn stop(&mut self) {
        self.signal("TERM");
        if self.wait_exit(Duration::from_secs(10)).is_none() {
            self.kill();
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send a signal by name (`TERM`, `INT`, `KILL`) with kill(1).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{name} failed");
    }

    /// Wait up to `timeout` for the process to exit; its status, if it did.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let until = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!("---- server log ----\n{}", self.log_text());
        }
    }
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The error `code` of a JSON error body.
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_string()
    }
}

/// `r` is `429 rate_limited` (a per-identity cap, `marketplace_guest::
/// quota`) with a `Retry-After` of 1 to `window_s` seconds: that wait.
pub fn rate_limited(r: &Resp, window_s: u64) -> u64 {
    assert_eq!(
        (r.status, r.code().as_str()),
        (429, "rate_limited"),
        "{}",
        r.text()
    );
    let wait: u64 = r
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .expect("Retry-After in seconds");
    assert!((1..=window_s).contains(&wait), "Retry-After {wait}");
    wait
}

/// The path (and query) of an absolute URL or of a path.
pub fn path_of(url: &str) -> String {
    match url.split_once("://") {
        Some((_, rest)) => rest.find('/').map(|i| rest[i..].to_string()).unwrap(),
        None => url.to_string(),
    }
}

/// One HTTP/1.1 request on a fresh connection.
pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Resp {
    try_request(addr, method, path, headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// The tests' HTTP client: any status is a response (not an error), no
/// redirect is followed, any method may carry a body, and every request
/// has a connection of its own.
static CLIENT: LazyLock<ureq::Agent> = LazyLock::new(|| {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(0)
        .allow_non_standard_methods(true)
        .max_idle_connections(0)
        .max_idle_connections_per_host(0)
        .timeout_connect(Some(Duration::from_secs(30)))
        .timeout_recv_response(Some(Duration::from_secs(30)))
        .timeout_recv_body(Some(Duration::from_secs(30)))
        .build()
        .new_agent()
});

/// A body at least this large is sent with `expect: 100-continue` (as curl
/// does), so a response the server gives before reading it (413) arrives
/// instead of a broken pipe.
const EXPECT_CONTINUE_FROM: usize = 1 << 20;

/// One HTTP/1.1 request; an error when the connection fails or closes
/// before a whole response (as when the server is killed).
pub fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> std::io::Result<Resp> {
    use std::io::Error;
    let mut req = ureq::http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some_and(|b| b.len() >= EXPECT_CONTINUE_FROM) {
        req = req.header("expect", "100-continue");
    }
    let sent = match body {
        Some(b) => req.body(b).map(|r| CLIENT.run(r)),
        None => req.body(()).map(|r| CLIENT.run(r)),
    };
    let mut response = sent.map_err(Error::other)?.map_err(|e| match e {
        ureq::Error::Io(e) => e,
        e => Error::other(e),
    })?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(k, v)| {
            let v = String::from_utf8_lossy(v.as_bytes()).trim().to_string();
            (k.as_str().to_string(), v)
        })
        .collect();
    let body = response
        .body_mut()
        .with_config()
        .limit(u64::MAX)
        .read_to_vec()
        .map_err(|e| match e {
            ureq::Error::Io(e) => e,
            e => Error::other(e),
        })?;
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// A connection for a raw request: reads give up after 10 s, so a server
/// that never answers fails the test instead of hanging it.
pub fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
}

/// A connection from `ip` (a loopback address) to `to`.
pub fn connect_from(ip: [u8; 4], to: SocketAddr) -> TcpStream {
    connect_socket(to, |socket| {
        socket
            .bind(SocketAddr::from((ip, 0)))
            .unwrap_or_else(|e| panic!("binding {ip:?}: {e}"))
    })
}

/// A blocking connection to `to` from a socket `prepare` set up first
/// (its source address, its buffers).
pub fn connect_socket(to: SocketAddr, prepare: impl FnOnce(&tokio::net::TcpSocket)) -> TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()
        .unwrap();
    rt.block_on(async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        prepare(&socket);
        let stream = socket.connect(to).await.unwrap().into_std().unwrap();
        stream.set_nonblocking(false).unwrap();
        stream
    })
}

/// Read one response (connection: close, or content-length framed) from a
/// stream the test wrote a raw request to.
pub fn read_response(stream: &mut TcpStream) -> Resp {
    try_read_response(stream).unwrap_or_else(|e| panic!("reading a response: {e}"))
}

pub fn try_read_response(stream: &mut TcpStream) -> std::io::Result<Resp> {
    use std::io::{Error, ErrorKind};
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let header_end = loop {
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::UnexpectedEof,
                format!(
                    "connection closed before headers: {:?}",
                    String::from_utf8_lossy(&buf)
                ),
            ));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::new(ErrorKind::InvalidData, "no status line"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let mut body = buf[header_end + 4..].to_vec();
    let length = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok());
    match length {
        Some(len) => {
            while body.len() < len {
                let n = stream.read(&mut chunk)?;
                if n == 0 {
                    return Err(Error::new(ErrorKind::UnexpectedEof, "body cut short"));
                }
                body.extend_from_slice(&chunk[..n]);
            }
            body.truncate(len);
        }
        None => {
            // Closed by the server after the body (a reset is fine too).
            let _ = stream.read_to_end(&mut body);
        }
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// The public form (`e<amount>:public:<sha256 hex>`) of a secret.
pub fn public_of(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    let (amt, hex_part) = secret.split_once(":secret:").expect("a secret");
    format!("{amt}:public:{}", hex(&Sha256::digest(hex_part.as_bytes())))
}

/// Spent state of each secret (by public form) through health_check.
pub fn spent_states(s: &Server, secrets: &[String]) -> std::collections::HashMap<String, Value> {
    let mut out = std::collections::HashMap::new();
    // 100 at a time: the host refuses more (PROTOCOL asks for 1,000).
    for chunk in secrets.chunks(100) {
        let publics: Vec<String> = chunk.iter().map(|s| public_of(s)).collect();
        let r = s.post_json("/api/cash/health_check", &serde_json::json!(publics));
        assert_eq!(r.status, 200, "health_check: {}", r.text());
        let results = r.json()["results"].clone();
        for (secret, public) in chunk.iter().zip(&publics) {
            out.insert(secret.clone(), results[public]["spent"].clone());
        }
    }
    out
}

/// Every post of `author` (content -> post id), paging the timeline.
pub fn posts_of(s: &Server, author: &str) -> std::collections::HashMap<String, String> {
    let mut present = std::collections::HashMap::new();
    let mut before = String::new();
    loop {
        let r = s.get(&format!("/api/timeline?author={author}&limit=100{before}"));
        assert_eq!(r.status, 200, "timeline: {}", r.text());
        let page = r.json();
        for p in page["posts"].as_array().unwrap() {
            let old = present.insert(
                p["content"].as_str().unwrap().to_string(),
                p["post_id"].as_str().unwrap().to_string(),
            );
            assert!(old.is_none(), "a post listed twice: {p}");
        }
        match page["next_before"].as_str() {
            Some(next) => before = format!("&before={next}"),
            None => break,
        }
    }
    present
}

/// Panics naming each member of `body` (an answer of `method path` with
/// `status`, path as templated in the served OpenAPI document `doc`) that
/// its documented schema does not name, as JSON paths (`contract.witness`):
/// where an object's schema lists `properties` and no
/// `additionalProperties`, each member must be among them, at every depth
/// the schema describes; a member it does not name is walked against an
/// object-valued `additionalProperties` (a map by name).
pub fn assert_documented(doc: &Value, method: &str, path: &str, status: u16, body: &Value) {
    let op = &doc["paths"][path][method.to_ascii_lowercase()];
    let answer = &op["responses"][status.to_string()];
    assert!(answer.is_object(), "{method} {path} documents no {status}");
    let schema = &answer["content"]["application/json"]["schema"];
    let mut missing = Vec::new();
    walk_documented(doc, schema, body, "", &mut missing);
    assert!(
        missing.is_empty(),
        "{method} {path} {status}: undocumented {missing:?}"
    );
}

fn walk_documented(doc: &Value, schema: &Value, value: &Value, at: &str, out: &mut Vec<String>) {
    let schema = resolve(doc, schema);
    // allOf, anyOf, oneOf: a member named by any branch is documented.
    let branches: Vec<&Value> = ["allOf", "anyOf", "oneOf"]
        .iter()
        .filter_map(|k| schema[*k].as_array())
        .flatten()
        .map(|b| resolve(doc, b))
        .chain(std::iter::once(schema))
        .collect();
    match value {
        Value::Object(members) => {
            let named: Vec<&serde_json::Map<String, Value>> = branches
                .iter()
                .filter_map(|b| b["properties"].as_object())
                .collect();
            let open = branches.iter().any(|b| {
                b.get("additionalProperties")
                    .is_some_and(|a| a != &Value::Bool(false))
            });
            // A schema for the members not named (a map by name): each is
            // walked against it.
            let others = branches
                .iter()
                .map(|b| &b["additionalProperties"])
                .find(|a| a.is_object());
            for (name, v) in members {
                let here = if at.is_empty() {
                    name.clone()
                } else {
                    format!("{at}.{name}")
                };
                match (named.iter().find_map(|p| p.get(name)), others) {
                    (Some(s), _) | (None, Some(s)) => walk_documented(doc, s, v, &here, out),
                    (None, None) if open || named.is_empty() => {}
                    (None, None) => out.push(here),
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = branches.iter().map(|b| &b["items"]).find(|i| i.is_object()) {
                for (i, v) in items.iter().enumerate() {
                    walk_documented(doc, s, v, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

/// A schema, its `$ref` (to `#/components/schemas/...`) followed.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema["$ref"].as_str() {
        Some(r) => {
            let name = r.rsplit('/').next().unwrap_or_default();
            resolve(doc, &doc["components"]["schemas"][name])
        }
        None => schema,
    }
}

/// A server log's whole lines: a line the server is writing as the file is
/// read (a write spanning a page boundary shows up a page at a time) waits
/// for the next read.
pub fn read_log(path: &std::path::Path) -> String {
    let mut bytes = std::fs::read(path).unwrap_or_default();
    bytes.truncate(bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1));
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The same component with a custom section appended: a different file
/// (another hash) that serves exactly the same.
pub fn with_custom_section(bytes: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut content = Vec::new();
    leb(name.len(), &mut content);
    content.extend_from_slice(name.as_bytes());
    content.extend_from_slice(payload);
    let mut out = bytes.to_vec();
    out.push(0); // custom section id
    leb(content.len(), &mut out);
    out.extend_from_slice(&content);
    out
}
