//! Benchmark: cost per request measured from outside the process.
//!
//! Starts two servers as child processes: a plain hyper 1 "hello" server
//! (`host/examples/hello.rs`, the baseline) and the real `marketplace serve
//! --testing-routes` on a fresh data dir, and loads each route with an
//! external load generator, its own process: `wrk` when installed, else
//! `host/examples/load.rs` (a closed-loop client, one thread per keep-alive
//! connection). The main figure is the server process's own CPU time
//! (utime + stime of `/proc/<pid>/stat`, all threads) per answered request,
//! and its ratio to the hello server's, measured in the same run; and of
//! it, the kernel's part (stime: the socket calls, the loopback delivery
//! of the answers and waking the load generator, page faults, the memory
//! slot's `PAGEMAP_SCAN`), most of the hello server's.
//!
//! Routes: hello `GET /`; `GET /_testing/native` (host handler);
//! `GET /_testing/ok` (trivial plugin); `GET /api/health`; each round loads
//! hello first and the marketplace routes after it. Then, unless
//! BENCH_PAID=0, durable paid posts: a third server on a fresh data dir with
//! secrets minted before it starts (as `marketplace cash mint --data-dir`
//! does), one identity registered over HTTP, and `POST /api/timeline` at
//! BENCH_PAID_CONNECTIONS connections, each post signed (fresh timestamp:
//! the second it is expected to be sent in at BENCH_POST_RATE posts a
//! second, 5,000 by default; 0 signs them all with one) and paid with its
//! own secret; then `GET /api/search` (one term every
//! post has, limit 20) at BENCH_CONNECTIONS over the posts it wrote.
//!
//! Builds nothing itself: `cargo bench` builds `target/release/marketplace`;
//! build the examples and the plugins first:
//!
//! ```sh
//! cargo xtask build-plugins
//! cargo build --release -p marketplace --example hello --example load
//! cargo bench -p marketplace --bench external
//! ```
//!
//! Settings: BENCH_SECONDS (default 10 per route), BENCH_CONNECTIONS (32),
//! BENCH_ROUNDS (2), BENCH_ROUTES (comma list of paths, default all four),
//! BENCH_PAID (1), BENCH_PAID_CONNECTIONS (64), BENCH_PAID_SECONDS (the paid
//! run's length, default BENCH_SECONDS: at 4,000 to 6,000 posts/s, 25 writes
//! the 100,000 posts the search target names), BENCH_GENERATOR (`wrk` or
//! `load`; default wrk when on PATH), BENCH_WRK_THREADS (2), BENCH_LOG (the
//! server's log filter, default `info` as in production; the log goes to a
//! file), BENCH_DIR (where the data dirs go; default the workspace root;
//! a relative path in BENCH_DIR, BENCH_BIN or BENCH_PLUGINS is taken from
//! there, not from `host/` where cargo runs the bench),
//! BENCH_BIN (another `marketplace` binary to measure, e.g. a copy of an
//! earlier build; default the one cargo built), BENCH_PLUGINS (another
//! directory of built components; default the target dir's `plugins`).
//!
//! Scale-out mode (`BENCH_PG=postgres://...`, a PostgreSQL server the bench
//! may create schemas in): durable paid posts at BENCH_PAID_CONNECTIONS and
//! then searches at BENCH_CONNECTIONS over the posts written, on one host on
//! redb, one host on the shared store and BENCH_HOSTS (3) hosts on it, in
//! one run; the connections are split over the hosts, one generator process
//! per host. CPU is the hosts' (the database server's is not counted).
//! BENCH_STORES (`redb,pg,hosts`) picks which of the three runs to make.
//! BENCH_KEEP=1 keeps each run's data dirs and server logs (in both modes,
//! the paid posts' data dir). BENCH_AUTHORS (1, at most 200): how many
//! identities sign the paid posts, in turn (with one, every post updates
//! that author's post counter, which hosts of a fleet then race on).

use ed25519_dalek::{Signer, SigningKey};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

mod support;
use support::{env_or, hex};

const ADMIN_TOKEN: &str = "bench-admin-token-0123456789abcdef0123";

fn now_s() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `target/release`, where cargo put the marketplace binary.
fn release_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_marketplace"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn need(path: &Path) -> PathBuf {
    if !path.is_file() {
        eprintln!(
            "{} is missing: run `cargo xtask build-plugins` and \
             `cargo build --release -p marketplace --example hello --example load` first",
            path.display()
        );
        std::process::exit(1);
    }
    path.to_path_buf()
}

/// A server child process; killed when dropped.
struct Server {
    child: Child,
    addr: String,
    /// Its `metrics_listen` address, when it has one.
    metrics: Option<String>,
}

impl Server {
    /// Spawn `cmd` and wait for its `... listening on http://ADDR` lines.
    fn start(mut cmd: Command, main_prefix: &str) -> Server {
        let mut child = cmd.stdout(Stdio::piped()).spawn().expect("spawn server");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut metrics = None;
        let addr = loop {
            let line = lines
                .next()
                .expect("server exited before listening")
                .unwrap();
            if let Some(a) = line.strip_prefix("marketplace metrics listening on http://") {
                metrics = Some(a.to_string());
            }
            if let Some(a) = line.strip_prefix(main_prefix) {
                break a.to_string();
            }
        };
        // Keep draining stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Server {
            child,
            addr,
            metrics,
        }
    }

    /// A counter of its `/metrics` (0 without a metrics listener).
    fn counter(&self, name: &str) -> u64 {
        let Some(addr) = &self.metrics else { return 0 };
        let (_, text) = http(addr, "GET", "/metrics", &[], "");
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok())
            .unwrap_or(0.0) as u64
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn hello() -> Server {
    let exe = need(&release_dir().join("examples/hello"));
    let mut cmd = Command::new(exe);
    // The baseline answers its own 11 bytes, whatever the shell exports.
    cmd.arg("127.0.0.1:0").env_remove("HELLO_BODY");
    Server::start(cmd, "hello listening on http://")
}

/// BENCH_PLUGINS (another build's components, to compare two builds of a
/// component with the same host) or the target dir's.
fn plugins_dir() -> PathBuf {
    let plugins = support::env_path("BENCH_PLUGINS").unwrap_or_else(support::built_plugins);
    need(&plugins.join("info.wasm"));
    plugins
}

fn marketplace(data_dir: &Path, testing: bool) -> Server {
    marketplace_with(data_dir, testing, &[])
}

fn marketplace_with(data_dir: &Path, testing: bool, env: &[(String, String)]) -> Server {
    let plugins = plugins_dir();
    std::fs::create_dir_all(data_dir).unwrap();
    let log = std::fs::File::create(data_dir.join("server.log")).unwrap();
    let exe = support::env_path("BENCH_BIN")
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_marketplace")));
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .args(["--listen", "127.0.0.1:0"])
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--plugins")
        .arg(&plugins)
        .env("MARKETPLACE_ADMIN_TOKEN", ADMIN_TOKEN)
        .env_remove("MARKETPLACE_CONFIG")
        .env_remove("RUST_LOG")
        .env(
            "MARKETPLACE_LOG",
            std::env::var("BENCH_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stderr(log);
    if testing {
        cmd.arg("--testing-routes");
    }
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    Server::start(cmd, "marketplace listening on http://")
}

/// CPU time of process `pid` (every thread), in clock ticks.
#[derive(Clone, Copy, Default)]
struct Ticks {
    /// In the process's own code (utime).
    user: u64,
    /// In the kernel on its behalf (stime).
    system: u64,
}

impl Ticks {
    fn of(pid: u32) -> Ticks {
        let stat =
            std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read /proc/pid/stat");
        let fields: Vec<&str> = stat
            .rsplit_once(')')
            .unwrap()
            .1
            .split_whitespace()
            .collect();
        // utime and stime are fields 14 and 15 of the line (11 and 12 after the name).
        Ticks {
            user: fields[11].parse().unwrap(),
            system: fields[12].parse().unwrap(),
        }
    }

    fn of_all(servers: &[Server]) -> Ticks {
        servers
            .iter()
            .map(|s| Ticks::of(s.pid()))
            .fold(Ticks::default(), |a, b| Ticks {
                user: a.user + b.user,
                system: a.system + b.system,
            })
    }

    /// The ticks from `before` to these: (all, in the kernel).
    fn since(self, before: Ticks) -> (u64, u64) {
        let system = self.system - before.system;
        (self.user - before.user + system, system)
    }
}

fn clock_ticks_per_s() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

/// One HTTP/1.1 request on a fresh connection: (status, body).
fn http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: bench\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    req.push_str(body);
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let status = resp.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = resp.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    (status, body.to_string())
}

#[derive(Clone, Copy, PartialEq)]
enum Generator {
    Wrk,
    Load,
}

/// What the generator reports.
struct Load {
    requests: u64,
    errors: u64,
    secs: f64,
    p50_us: f64,
    p99_us: f64,
}

/// wrk's Lua for every run: print one machine-readable line at the end.
const WRK_REPORT: &str = r#"
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %d %d %d %d\n", summary.requests,
    e.status + e.connect + e.read + e.write + e.timeout, summary.duration,
    latency:percentile(50), latency:percentile(99)))
end
"#;

/// wrk's Lua for paid posts: each thread sends its own list of paid POSTs
/// (the requests file is the script's argument). Only these runs define
/// `request()`: with it, wrk calls Lua for every request, a client CPU
/// cost a GET run does not need to pay on the same two cores.
const WRK_POSTS: &str = r#"
local counter = 0
function setup(thread)
  thread:set("tid", counter)
  counter = counter + 1
end
local reqs, n = {}, 0
function init(args)
  local f = assert(io.open(args[1] .. "." .. tid, "r"))
  for line in f:lines() do
    local s, b = line:match("^([^\t]*)\t(.*)$")
    reqs[#reqs + 1] = wrk.format("POST", nil,
      {["content-type"] = "application/json", ["x-cash-secret"] = s}, b)
  end
  f:close()
end
function request()
  n = n + 1
  return reqs[((n - 1) % #reqs) + 1]
end
"#;

/// Run the generator against `addr``path` for `secs` seconds.
fn generate(
    generator: Generator,
    work: &Path,
    addr: &str,
    path: &str,
    conns: u64,
    secs: u64,
    posts: Option<&Path>,
) -> Load {
    let output = match generator {
        Generator::Wrk => {
            // One script per target: generators of a fleet run at once.
            let script = work.join(format!("bench-{}.lua", addr.replace([':', '.'], "_")));
            let lua = match posts {
                Some(_) => format!("{WRK_POSTS}{WRK_REPORT}"),
                None => WRK_REPORT.to_string(),
            };
            std::fs::write(&script, lua).unwrap();
            let threads = env_or("BENCH_WRK_THREADS", 2).min(conns);
            let mut cmd = Command::new("wrk");
            cmd.arg(format!("-t{threads}"))
                .arg(format!("-c{conns}"))
                .arg(format!("-d{secs}s"))
                .arg("--timeout")
                .arg("10s")
                .arg("-s")
                .arg(&script)
                .arg(format!("http://{addr}{path}"));
            if let Some(p) = posts {
                cmd.arg("--").arg(p);
            }
            cmd.output().expect("run wrk")
        }
        Generator::Load => {
            let mut cmd = Command::new(need(&release_dir().join("examples/load")));
            cmd.args([addr, path, &conns.to_string(), &secs.to_string()]);
            if let Some(p) = posts {
                cmd.arg(p);
            }
            cmd.output().expect("run the load generator")
        }
    };
    let text = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "load generator failed: {text}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let nums = |line: &str| -> Vec<f64> {
        line.split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect()
    };
    match generator {
        Generator::Wrk => {
            let line = text
                .lines()
                .find(|l| l.starts_with("RESULT "))
                .unwrap_or_else(|| panic!("no RESULT line from wrk: {text}"));
            let v = nums(line);
            Load {
                requests: v[0] as u64,
                errors: v[1] as u64,
                secs: v[2] / 1e6,
                p50_us: v[3],
                p99_us: v[4],
            }
        }
        Generator::Load => {
            let line = text.lines().find(|l| l.starts_with("requests ")).unwrap();
            let v = nums(line);
            Load {
                requests: v[0] as u64,
                errors: v[1] as u64,
                secs: v[2],
                p50_us: v[3],
                p99_us: v[4],
            }
        }
    }
}

/// One measured row.
struct Row {
    label: String,
    rps: f64,
    cpu_us: f64,
    /// Of `cpu_us`, the kernel's part (stime).
    sys_us: f64,
    cores: f64,
    p50_us: f64,
    p99_us: f64,
    errors: u64,
}

struct Bench {
    generator: Generator,
    work: PathBuf,
    tick_us: f64,
    /// The row of the last paid-post run.
    last: std::sync::Mutex<Option<Row>>,
}

impl Bench {
    /// Load every host of a fleet at once, `conns` split over them (one
    /// generator process each; with `posts`, host i sends the requests of
    /// `posts[i]`): requests/s summed, CPU summed over the hosts, the
    /// highest p50 and p99.
    fn measure_fleet(
        &self,
        label: &str,
        servers: &[Server],
        path: &str,
        conns: u64,
        secs: u64,
        posts: Option<&[PathBuf]>,
    ) -> Row {
        if servers.len() == 1 {
            return self.measure(
                label,
                &servers[0],
                path,
                conns,
                secs,
                posts.map(|p| p[0].as_path()),
            );
        }
        let per_host = conns.div_ceil(servers.len() as u64);
        let before = Ticks::of_all(servers);
        let loads: Vec<Load> = std::thread::scope(|scope| {
            let handles: Vec<_> = servers
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let posts = posts.map(|p| p[i].clone());
                    let (generator, work) = (self.generator, &self.work);
                    scope.spawn(move || {
                        generate(
                            generator,
                            work,
                            &s.addr,
                            path,
                            per_host,
                            secs,
                            posts.as_deref(),
                        )
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (ticks, system) = Ticks::of_all(servers).since(before);
        let requests: u64 = loads.iter().map(|l| l.requests).sum();
        let wall = loads.iter().map(|l| l.secs).fold(0.0, f64::max);
        let cpu_s = ticks as f64 * self.tick_us / 1e6;
        let row = Row {
            label: label.to_string(),
            rps: loads.iter().map(|l| l.requests as f64 / l.secs).sum(),
            cpu_us: self.per_request(ticks, requests),
            sys_us: self.per_request(system, requests),
            cores: cpu_s / wall,
            p50_us: loads.iter().map(|l| l.p50_us).fold(0.0, f64::max),
            p99_us: loads.iter().map(|l| l.p99_us).fold(0.0, f64::max),
            errors: loads.iter().map(|l| l.errors).sum(),
        };
        row.print();
        row
    }

    /// Microseconds of CPU a request, of `ticks` over `requests`.
    fn per_request(&self, ticks: u64, requests: u64) -> f64 {
        ticks as f64 * self.tick_us / requests.max(1) as f64
    }

    fn measure(
        &self,
        label: &str,
        server: &Server,
        path: &str,
        conns: u64,
        secs: u64,
        posts: Option<&Path>,
    ) -> Row {
        let before = Ticks::of(server.pid());
        let load = generate(
            self.generator,
            &self.work,
            &server.addr,
            path,
            conns,
            secs,
            posts,
        );
        let (ticks, system) = Ticks::of(server.pid()).since(before);
        let cpu_s = ticks as f64 * self.tick_us / 1e6;
        let row = Row {
            label: label.to_string(),
            rps: load.requests as f64 / load.secs,
            cpu_us: self.per_request(ticks, load.requests),
            sys_us: self.per_request(system, load.requests),
            cores: cpu_s / load.secs,
            p50_us: load.p50_us,
            p99_us: load.p99_us,
            errors: load.errors,
        };
        row.print();
        row
    }
}

impl Row {
    fn print(&self) {
        println!(
            "  {:<28} {:>9.0} req/s  {:>6.1} us CPU/req ({:>5.1} kernel)  {:.2} cores  p50 {:>7.0} us  p99 {:>7.0} us{}",
            self.label,
            self.rps,
            self.cpu_us,
            self.sys_us,
            self.cores,
            self.p50_us,
            self.p99_us,
            if self.errors > 0 {
                format!("  ({} errors)", self.errors)
            } else {
                String::new()
            }
        );
    }
}

/// Scale-out mode: paid posts, then searches over them, on one host on
/// redb, one host on the shared store, and `hosts` hosts on it.
fn scaleout(bench: &Bench, base: &Path, url: &str, secs: u64) {
    let paid_conns = env_or("BENCH_PAID_CONNECTIONS", 64);
    let search_conns = env_or("BENCH_CONNECTIONS", 32);
    let hosts = env_or("BENCH_HOSTS", 3) as usize;
    println!(
        "scale-out: durable paid posts at {paid_conns} connections, then `GET /api/search` at {search_conns}, {secs} s each; {} cores; CPU is the hosts' (not the database server's)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    let stores = [
        ("redb", "redb, 1 host", Store::Redb),
        (
            "pg",
            "postgres, 1 host",
            Store::Pg {
                url: url.into(),
                hosts: 1,
            },
        ),
        (
            "hosts",
            "postgres, hosts",
            Store::Pg {
                url: url.into(),
                hosts,
            },
        ),
    ];
    // BENCH_STORES: which rows, by their keys above.
    let rows = std::env::var("BENCH_STORES").unwrap_or_else(|_| "redb,pg,hosts".into());
    let rows: Vec<&str> = rows.split(',').map(str::trim).collect();
    for row in &rows {
        assert!(
            stores.iter().any(|(key, ..)| key == row),
            "BENCH_STORES: {row:?} is none of redb, pg, hosts"
        );
    }
    let mut table = vec![];
    for (key, name, store) in &stores {
        if !rows.contains(key) {
            continue;
        }
        let name = name.replace("hosts", &format!("{hosts} hosts"));
        println!("{name}:");
        let tmp = tempfile::tempdir_in(base).unwrap();
        let (servers, term) = paid_posts_on(bench, tmp.path(), store, paid_conns, secs);
        let paid = bench.last.lock().unwrap().take().unwrap();
        let runs_again: u64 = servers
            .iter()
            .map(|s| s.counter("marketplace_store_conflict_retries_total"))
            .sum();
        println!("  (requests run again after losing a race with another host's: {runs_again})");
        let path = format!("/api/search?term={term}&limit=20");
        // Twice: the first run right after the writes (cold caches), the
        // second is the figure of the table.
        let search = (0..2)
            .map(|round| {
                bench.measure_fleet(
                    &format!("GET /api/search {name} ({})", ["first", "second"][round]),
                    &servers,
                    &path,
                    search_conns,
                    secs,
                    None,
                )
            })
            .last()
            .unwrap();
        drop(servers);
        if std::env::var_os("BENCH_KEEP").is_some() {
            println!("  (data and logs kept in {})", tmp.keep().display());
        }
        table.push((name, paid, search, runs_again));
    }
    println!(
        "\n| store | paid posts/s | p50 ms | p99 ms | host CPU µs/post | runs again | errors | searches/s | search p99 ms | host CPU µs/search |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for (name, p, s, again) in &table {
        println!(
            "| {name} | {:.0} | {:.1} | {:.1} | {:.0} | {again} | {} | {:.0} | {:.1} | {:.0} |",
            p.rps,
            p.p50_us / 1000.0,
            p.p99_us / 1000.0,
            p.cpu_us,
            p.errors + s.errors,
            s.rps,
            s.p99_us / 1000.0,
            s.cpu_us
        );
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Where the hosts of a paid-post run keep their data.
enum Store {
    /// One host, the embedded redb file.
    Redb,
    /// `hosts` hosts on one schema of a PostgreSQL server (URL).
    Pg { url: String, hosts: usize },
}

/// Fresh data dir with one funding secret and `n` secrets of 1.0 minted
/// offline, before the server starts (the database takes one process);
/// on a shared store, into the schema the hosts will use (the settings
/// `env` give them), under the server key they are given.
fn mint_offline(data_dir: &Path, n: usize, env: &[(String, String)]) -> (String, Vec<String>) {
    std::fs::create_dir_all(data_dir).unwrap();
    let flags = [("data_dir".to_string(), data_dir.display().to_string())];
    let config = marketplace::Config::load(None, env, &flags).unwrap();
    let (storage, ledger) = if config.shared_store() {
        (
            marketplace::store::Storage::open_pg(
                &config.store,
                &config.store_schema,
                4,
                std::time::Duration::from_millis(config.store_timeout_ms),
                marketplace::store::Settings::of(&config),
            )
            .unwrap(),
            marketplace::money::ledger::Ledger::from_hex(config.server_key.as_deref().unwrap())
                .unwrap(),
        )
    } else {
        (
            marketplace::store::Storage::open(
                &config.db_path(),
                marketplace::store::Settings::of(&config),
            )
            .unwrap(),
            marketplace::state::embedded_ledger(&config).unwrap(),
        )
    };
    let txn = storage.begin_write().unwrap();
    let funding = ledger.mint(&txn, 100 * 100_000_000).unwrap();
    let secrets = (0..n)
        .map(|_| ledger.mint(&txn, 100_000_000).unwrap())
        .collect();
    storage.commit(txn).unwrap();
    (funding, secrets)
}

/// Durable paid posts at `conns` connections.
/// Start the hosts of `store` on a fresh data dir under `dir`, mint, sign
/// and load them with durable paid posts at `conns` connections split over
/// the hosts (one generator process per host); the hosts stay up (for a
/// search run over what they wrote) and the row is in `bench.last`.
fn paid_posts_on(
    bench: &Bench,
    dir: &Path,
    store: &Store,
    conns: u64,
    secs: u64,
) -> (Vec<Server>, String) {
    let data = dir.join("data");
    let budget = 10_000 * secs as usize;
    let t = Instant::now();
    let mut env = vec![];
    let n_hosts = match store {
        Store::Redb => 1,
        Store::Pg { url, hosts } => {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).unwrap();
            env.push(("MARKETPLACE_STORE".to_string(), url.clone()));
            env.push((
                "MARKETPLACE_STORE_SCHEMA".to_string(),
                format!("bench_{}", &hex(&raw)[..12]),
            ));
            env.push(("MARKETPLACE_SERVER_KEY".to_string(), hex(&raw)));
            env.push((
                "MARKETPLACE_METRICS_LISTEN".to_string(),
                "127.0.0.1:0".to_string(),
            ));
            *hosts
        }
    };
    let (funding, secrets) = mint_offline(&data, budget, &env);
    let servers: Vec<Server> = (0..n_hosts)
        .map(|i| match store {
            Store::Redb => marketplace_with(&data, false, &env),
            Store::Pg { .. } => marketplace_with(&data.join(format!("host{i}")), false, &env),
        })
        .collect();
    let server = &servers[0];
    // BENCH_AUTHORS identities (one by default), registered over HTTP, the
    // first paid with the funding secret and the others with a post's.
    let authors = env_or("BENCH_AUTHORS", 1).clamp(1, 200) as usize;
    let mut secrets = secrets;
    let keys: Vec<SigningKey> = (0..authors)
        .map(|i| SigningKey::from_bytes(&[42u8.wrapping_add(i as u8); 32]))
        .collect();
    for (i, key) in keys.iter().enumerate() {
        let fp = hex(key.verifying_key().as_bytes());
        let nickname = if i == 0 {
            "bench".to_string()
        } else {
            format!("bench{i}")
        };
        let body = serde_json::json!({
            "nickname": nickname,
            "pgp_public_key": fp,
            "signature": hex(&key.sign(format!("register:{nickname}").as_bytes()).to_bytes()),
        })
        .to_string();
        let paying = if i == 0 {
            funding.clone()
        } else {
            secrets.pop().unwrap()
        };
        let (status, text) = http(
            &server.addr,
            "POST",
            "/api/identity",
            &[
                ("content-type", "application/json"),
                ("x-cash-secret", &paying),
            ],
            &body,
        );
        assert_eq!(status, 201, "registering bench identity {i}: {text}");
    }
    // Per host, one file per wrk thread (`posts-<host>.<i>`), or one for
    // the load client.
    let per_host = conns.div_ceil(n_hosts as u64);
    let threads = match bench.generator {
        Generator::Wrk => env_or("BENCH_WRK_THREADS", 2).min(per_host) as usize,
        Generator::Load => 1,
    };
    let files = threads * n_hosts;
    let stem = |h: usize| dir.join(format!("posts-{h}"));
    let mut out: Vec<_> = (0..files)
        .map(|f| {
            let (h, i) = (f / threads, f % threads);
            let name = match bench.generator {
                Generator::Wrk => format!("posts-{h}.{i}"),
                Generator::Load => format!("posts-{h}"),
            };
            std::io::BufWriter::new(std::fs::File::create(dir.join(name)).unwrap())
        })
        .collect();
    // Each post is signed with the second it is expected to be sent in,
    // at BENCH_POST_RATE posts a second (5,000), as clients sign with their
    // own clocks: a second's posts share their timestamp, as under real
    // load. (All 160,000 with one timestamp, BENCH_POST_RATE=0, made every
    // used signature a random insert over the whole `auth:fresh-used`
    // table, which no real traffic does.) The last of 160,000 is 32 s
    // after the first; sent faster or slower than the rate, a post's
    // timestamp is off the clock by less than the run and that, well
    // inside the 300 s window.
    let ts = now_s();
    let rate = env_or("BENCH_POST_RATE", 5000);
    for (n, secret) in secrets.iter().enumerate() {
        let ts = ts + (n as u64).checked_div(rate).unwrap_or(0);
        let content = format!("bench post {n}: durable paid writes over HTTP");
        let key = &keys[n % authors];
        let fp = hex(key.verifying_key().as_bytes());
        let sig = hex(&key
            .sign(format!("post:{content}:{ts}").as_bytes())
            .to_bytes());
        let body = serde_json::json!({"author_fingerprint": fp, "content": content,
            "keywords": [], "post_type": "general", "signature": sig, "timestamp": ts});
        writeln!(out[n % files], "{secret}\t{body}").unwrap();
    }
    drop(out);
    println!(
        "  (paid posts: {} secrets minted and signed, {authors} identities registered, in {:.1} s)",
        secrets.len(),
        t.elapsed().as_secs_f64()
    );
    let stems: Vec<PathBuf> = (0..n_hosts).map(stem).collect();
    let label = match store {
        Store::Redb => format!("POST /api/timeline c={conns}"),
        Store::Pg { hosts, .. } => format!("POST /api/timeline pg x{hosts} c={conns}"),
    };
    let row = bench.measure_fleet(&label, &servers, "/api/timeline", conns, secs, Some(&stems));
    *bench.last.lock().unwrap() = Some(row);
    (servers, "durable".into())
}

fn main() {
    let secs = env_or("BENCH_SECONDS", 10);
    let conns = env_or("BENCH_CONNECTIONS", 32);
    let rounds = env_or("BENCH_ROUNDS", 2).max(1);
    let have_wrk = Command::new("wrk")
        .arg("--version")
        .output()
        .is_ok_and(|o| !o.stdout.is_empty() || !o.stderr.is_empty());
    let generator = match std::env::var("BENCH_GENERATOR").as_deref() {
        Ok("load") => Generator::Load,
        Ok("wrk") => Generator::Wrk,
        _ if have_wrk => Generator::Wrk,
        _ => Generator::Load,
    };
    // Everything the run needs, before it starts a server: a missing
    // piece found later would leave the servers running (`need` exits).
    plugins_dir();
    if generator == Generator::Load {
        need(&release_dir().join("examples/load"));
    }
    let base = support::bench_dir();
    let work = tempfile::tempdir_in(&base).unwrap();
    let bench = Bench {
        generator,
        work: work.path().to_path_buf(),
        tick_us: 1e6 / clock_ticks_per_s(),
        last: std::sync::Mutex::new(None),
    };
    if let Ok(url) = std::env::var("BENCH_PG") {
        scaleout(&bench, &base, &url, secs);
        return;
    }
    let routes: Vec<String> = std::env::var("BENCH_ROUTES")
        .unwrap_or_else(|_| "/_testing/native,/_testing/ok,/api/health".into())
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();

    let hello = hello();
    let host = marketplace(&work.path().join("data"), true);
    println!(
        "external load: {} ({conns} keep-alive connections), {secs} s per route, {rounds} rounds; \
         server CPU from /proc/<pid>/stat; {} cores",
        match generator {
            Generator::Wrk => "wrk",
            Generator::Load => "host/examples/load",
        },
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    // Warm up every route (compile cache, pools, page faults).
    for path in &routes {
        generate(generator, &bench.work, &host.addr, path, 4, 1, None);
    }
    generate(generator, &bench.work, &hello.addr, "/", 4, 1, None);

    let mut rows: Vec<Vec<Row>> = Vec::new();
    for round in 1..=rounds {
        println!("round {round}:");
        let mut r =
            vec![bench.measure("hello (plain hyper) GET /", &hello, "/", conns, secs, None)];
        for path in &routes {
            r.push(bench.measure(&format!("GET {path}"), &host, path, conns, secs, None));
        }
        rows.push(r);
    }
    // Medians over the rounds; ratios to hello's median CPU per request.
    println!(
        "\n| route | requests/s | server CPU µs/request | of it in the kernel | ratio to hello | server cores busy | p50 µs | p99 µs |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let hello_cpu = median(rows.iter().map(|r| r[0].cpu_us).collect());
    let print_row = |label: &str, sel: &dyn Fn(&Vec<Row>) -> &Row| {
        let m = |f: &dyn Fn(&Row) -> f64| median(rows.iter().map(|r| f(sel(r))).collect());
        let cpu = m(&|r| r.cpu_us);
        println!(
            "| {label} | {:.0} | {cpu:.1} | {:.1} | {:.2}x | {:.2} | {:.0} | {:.0} |",
            m(&|r| r.rps),
            m(&|r| r.sys_us),
            cpu / hello_cpu,
            m(&|r| r.cores),
            m(&|r| r.p50_us),
            m(&|r| r.p99_us),
        );
    };
    print_row("hello `GET /`", &|r| &r[0]);
    for (i, path) in routes.iter().enumerate() {
        print_row(&format!("`GET {path}`"), &|r| &r[i + 1]);
    }
    drop(host);

    if env_or("BENCH_PAID", 1) == 1 {
        let paid_conns = env_or("BENCH_PAID_CONNECTIONS", 64);
        println!("\ndurable paid posts (group commit, default settings), then searches over them:");
        let tmp = tempfile::tempdir_in(&base).unwrap();
        let paid_secs = env_or("BENCH_PAID_SECONDS", secs);
        let (servers, term) =
            paid_posts_on(&bench, tmp.path(), &Store::Redb, paid_conns, paid_secs);
        let row = bench.last.lock().unwrap().take().unwrap();
        let posts = (row.rps * paid_secs as f64).round();
        // Twice: right after the writes, then the figure of the table.
        let path = format!("/api/search?term={term}&limit=20");
        let search = (0..2)
            .map(|round| {
                let label = format!("GET /api/search ({})", ["first", "second"][round]);
                bench.measure_fleet(&label, &servers, &path, conns, secs, None)
            })
            .last()
            .unwrap();
        drop(servers);
        if std::env::var_os("BENCH_KEEP").is_some() {
            println!("  (data and log kept in {})", tmp.keep().display());
        }
        println!(
            "| `POST /api/timeline` (paid, durable), {paid_conns} connections | {:.0} | {:.1} | {:.1} | {:.2}x | {:.2} | {:.0} | {:.0} |",
            row.rps,
            row.cpu_us,
            row.sys_us,
            row.cpu_us / hello_cpu,
            row.cores,
            row.p50_us,
            row.p99_us
        );
        println!(
            "| `GET /api/search?term={term}&limit=20` over about {posts} posts, {conns} connections | {:.0} | {:.1} | {:.1} | {:.2}x | {:.2} | {:.0} | {:.0} |",
            search.rps,
            search.cpu_us,
            search.sys_us,
            search.cpu_us / hello_cpu,
            search.cores,
            search.p50_us,
            search.p99_us
        );
        assert_eq!(row.errors, 0, "paid posts answered errors");
        assert_eq!(search.errors, 0, "searches answered errors");
    }
    drop(hello);
}
