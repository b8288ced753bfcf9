//! Scale-out (issue 18): three stateless host processes on one PostgreSQL
//! schema behave as one service. One secret is spent once across all hosts,
//! one accept wins a contract race, a post written on one host is found by
//! search on another, a fee component swapped on one host is served by the
//! others, and a host killed with SIGKILL during a paid-write
//! load loses no acknowledged write and leaves no partial request. The hosts
//! get no `server_key` or `arbiter_key`: they must take them from the store.
//!
//! Needs a PostgreSQL server: `MARKETPLACE_TEST_PG=postgres://...` (`cargo
//! xtask test` starts a throwaway cluster and sets it). Without it every
//! test says it is skipped, unless `MARKETPLACE_REQUIRE_PG=1`.

mod common;

use common::deal as flow;
use common::{ADMIN_TOKEN, Key, Options, Resp, Server, now_s};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

/// Price of a post, in units of 1e-8.
const POST_UNITS: u64 = 30_000_000;
/// Price of an identity, in units of 1e-8.
const IDENTITY_UNITS: u64 = 60_000_000;

/// One test at a time: each runs three hosts on a 2-core machine, and two
/// of them measure (the swap bound, the load).
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

// ---------------------------------------------------------------- helpers

/// Hosts sharing one fresh schema of the test PostgreSQL server.
struct Fleet {
    url: String,
    schema: String,
    hosts: Vec<Server>,
    _serial: std::sync::MutexGuard<'static, ()>,
}

impl Fleet {
    /// `n` hosts on a fresh schema, started one after another (`None`
    /// when the test is skipped: no PostgreSQL).
    fn start(test: &str, n: usize) -> Option<Fleet> {
        Self::start_with(test, n, false)
    }

    /// `n` hosts on a fresh schema, started all at once when `at_once`
    /// (they race to create the schema, the table and the keys).
    fn start_with(test: &str, n: usize, at_once: bool) -> Option<Fleet> {
        Self::start_of(test, n, at_once, host_on)
    }

    /// [`Fleet::start_with`], each host started by `host` (given the
    /// store's URL and the schema).
    fn start_of(
        test: &str,
        n: usize,
        at_once: bool,
        host: fn(&str, &str) -> Server,
    ) -> Option<Fleet> {
        let url = common::pg_or_skip(test)?;
        let serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
        let schema = common::random_schema("scaleout");
        let hosts = if at_once {
            let threads: Vec<_> = (0..n)
                .map(|_| {
                    let (url, schema) = (url.clone(), schema.clone());
                    std::thread::spawn(move || host(&url, &schema))
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        } else {
            (0..n).map(|_| host(&url, &schema)).collect()
        };
        eprintln!("{test}: {n} hosts on schema {schema}");
        Some(Fleet {
            url,
            schema,
            hosts,
            _serial: serial,
        })
    }

    /// One more host on the same schema.
    fn add(&mut self) -> usize {
        self.hosts.push(host_on(&self.url, &self.schema));
        self.hosts.len() - 1
    }
}

/// A host on `schema` with a data dir of its own and no configured keys.
fn host_on(url: &str, schema: &str) -> Server {
    host_with(url, schema, None)
}

/// [`host_on`], with a configuration file's text.
fn host_with(url: &str, schema: &str, config: Option<&str>) -> Server {
    Server::with(options_on(url, schema, config))
}

/// [`host_on`] with the testing routes, where a request may hold its
/// batch (and run) for seconds.
fn testing_host(url: &str, schema: &str) -> Server {
    Server::with(Options {
        testing_routes: true,
        ..options_on(url, schema, Some("request_timeout_ms = 20000\n"))
    })
}

/// The options of a host on `schema`, with a configuration file's text.
fn options_on(url: &str, schema: &str, config: Option<&str>) -> Options {
    Options {
        env: vec![
            ("MARKETPLACE_STORE".into(), url.into()),
            ("MARKETPLACE_STORE_SCHEMA".into(), schema.into()),
        ],
        config: config.map(str::to_string),
        ..Options::default()
    }
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

/// `n` secrets worth one post each, made on `s`: minted through the admin
/// API (100 posts' worth at a time) and split with `POST /api/cash/replace`.
/// Also returns the units minted.
fn post_secrets(s: &Server, n: usize) -> (Vec<String>, u64) {
    let (mut out, mut minted) = (Vec::with_capacity(n), 0);
    while out.len() < n {
        let k = (n - out.len()).min(100);
        let big = s.mint(&amount(POST_UNITS * k as u64));
        minted += POST_UNITS * k as u64;
        let outputs: Vec<String> = (0..k).map(|_| new_secret(POST_UNITS)).collect();
        let r = s.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [big], "new_webcashes": outputs}),
        );
        assert_eq!(r.status, 200, "replace: {}", r.text());
        out.extend(outputs);
    }
    (out, minted)
}

/// The body of a post by `key`, freshly signed.
fn post_body(key: &Key, content: &str) -> String {
    let ts = now_s();
    json!({
        "author_fingerprint": key.fp(),
        "content": content,
        "signature": key.sign(&format!("post:{content}:{ts}")),
        "timestamp": ts,
    })
    .to_string()
}

/// A paid post to `addr` on a connection of its own.
fn send_post(addr: SocketAddr, secret: &str, body: &str) -> std::io::Result<Resp> {
    common::try_request(
        addr,
        "POST",
        "/api/timeline",
        &[
            ("content-type", "application/json"),
            ("x-cash-secret", secret),
        ],
        Some(body.as_bytes()),
    )
}

/// A refusal a lost race may get besides the expected one: the host gave
/// up re-running a conflicting transaction (503 `storage_conflict`, with
/// `Retry-After`). It must leave nothing behind, as any refusal.
fn is_storage_conflict(r: &Resp) -> bool {
    if r.status != 503 {
        return false;
    }
    assert_eq!(r.code(), "storage_conflict", "{}", r.text());
    assert!(
        r.header("retry-after").is_some(),
        "503 without Retry-After: {:?}",
        r.headers
    );
    true
}

/// The arbitration fee policy `s` serves now.
fn policy(s: &Server) -> String {
    s.get("/api/fees").json()["arbitration"]["policy"]
        .as_str()
        .unwrap_or("")
        .to_string()
}

// ------------------------------------------------------------------ tests

/// Three hosts started at once on an empty schema, none given a server or
/// arbiter key, derive the same secrets: a paid answer's change shown on
/// host A is shown again, identically, by an identical retry on B and C
/// (a host with another server key answers 409 there), the change spends
/// on C, and all three sign contracts with one arbiter key.
#[test]
fn hosts_started_at_once_share_the_keys_from_the_store() {
    let Some(f) = Fleet::start_with(
        "hosts_started_at_once_share_the_keys_from_the_store",
        3,
        true,
    ) else {
        return;
    };
    let [a, b, c] = [&f.hosts[0], &f.hosts[1], &f.hosts[2]];
    for s in [a, b, c] {
        let health = s.get("/api/health");
        assert_eq!(health.status, 200, "{}", health.text());
        // The store's state: `store` {backend, ok} (or `storage`
        // {backend, status}, as the host names it).
        let doc = health.json();
        let store = if doc["store"].is_object() {
            &doc["store"]
        } else {
            &doc["storage"]
        };
        assert_eq!(store["backend"], "postgres", "health: {doc}");
        assert!(
            store["ok"] == json!(true) || store["status"] == "ok",
            "health: {doc}"
        );
    }

    let key = Key::random();
    let secret = a.mint("1");
    let name = flow::nick("keyholder");
    let ts = now_s();
    let body = json!({
        "nickname": name, "pgp_public_key": key.fp(),
        "signature": key.sign(&format!("register:{name}:{ts}")), "timestamp": ts,
    });
    let first = a.post_paid("/api/identity", &secret, &body);
    assert_eq!(first.status, 201, "{}", first.text());
    let change = first.header("x-cash-change").expect("change").to_string();
    assert!(change.starts_with("e0.4:secret:"), "{change}");
    for (name, s) in [("B", b), ("C", c)] {
        let again = s.post_paid("/api/identity", &secret, &body);
        assert_eq!(
            (again.status, again.header("x-cash-change")),
            (201, Some(change.as_str())),
            "identical retry on host {name}: the hosts derive different secrets: {}",
            again.text()
        );
    }
    assert_eq!(c.cash_state(&change), (json!(false), json!("0.4")));
    let r = c.register(&Key::random(), &flow::nick("changed"), &{
        // Spend the change on C (0.4 for a 0.6 identity is short: top it up
        // with a replace on B first).
        let extra = b.mint("0.2");
        let joined = new_secret(IDENTITY_UNITS);
        let r = b.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [change.clone(), extra], "new_webcashes": [joined.clone()]}),
        );
        assert_eq!(r.status, 200, "replace of the change on B: {}", r.text());
        joined
    });
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(a.cash_state(&change).0, json!(true));

    let arbiter = |s: &Server| {
        let r = s.post_json("/api/graphql", &json!({"query": "{ arbiterPubkey }"}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["data"]["arbiterPubkey"]
            .as_str()
            .expect("an arbiter key")
            .to_string()
    };
    let key_a = arbiter(a);
    assert_eq!(
        arbiter(b),
        key_a,
        "hosts A and B sign with different arbiter keys"
    );
    assert_eq!(
        arbiter(c),
        key_a,
        "hosts A and C sign with different arbiter keys"
    );

    // A host's data dir holds no database: an offline mint there (the
    // operator's shell without the store setting) is refused, not a
    // secret of a new, empty embedded ledger that no host accepts.
    let offline = std::process::Command::new(env!("CARGO_BIN_EXE_marketplace"))
        .args(["cash", "mint", "1", "--data-dir"])
        .arg(&a.data_dir)
        .env_remove("MARKETPLACE_STORE")
        .env_remove("MARKETPLACE_CONFIG")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&offline.stderr);
    assert!(
        !offline.status.success(),
        "offline mint on a fleet host's dir: {said}"
    );
    assert!(
        said.contains("shared store") && said.contains("--admin URL"),
        "{said}"
    );
    assert!(
        !a.data_dir.join("marketplace.redb").exists() && !a.data_dir.join("server.key").exists(),
        "the refused mint made an embedded store"
    );
}

/// 32 simultaneous paid posts with one secret, spread over three hosts:
/// exactly one is created, the others are refused as spent, and every host
/// sees the secret spent and the one post.
#[test]
fn thirty_two_spends_of_one_secret_across_hosts_succeed_once() {
    let Some(f) = Fleet::start(
        "thirty_two_spends_of_one_secret_across_hosts_succeed_once",
        3,
    ) else {
        return;
    };
    let key = f.hosts[0].identity(&flow::nick("spender"));
    let secret = f.hosts[1].mint(&amount(POST_UNITS));
    let barrier = Arc::new(Barrier::new(32));
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let addr = f.hosts[i % 3].addr;
            let body = post_body(&key, &format!("race {i}"));
            let (secret, barrier) = (secret.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                (i % 3, send_post(addr, &secret, &body).expect("an answer"))
            })
        })
        .collect();
    let results: Vec<(usize, Resp)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let summary: Vec<(usize, u16, String)> = results
        .iter()
        .map(|(h, r)| (*h, r.status, r.text()))
        .collect();
    let wins: Vec<&Resp> = results
        .iter()
        .map(|(_, r)| r)
        .filter(|r| r.status == 201)
        .collect();
    assert_eq!(wins.len(), 1, "{summary:#?}");
    let conflicts = results
        .iter()
        .filter(|(_, r)| is_storage_conflict(r))
        .count();
    assert!(
        results.iter().all(|(_, r)| r.status == 201
            || (r.status == 402 && r.code() == "payment_spent")
            || is_storage_conflict(r)),
        "{summary:#?}"
    );
    eprintln!("1 created, {conflicts} answered 503 storage_conflict, the rest 402 payment_spent");
    let id = wins[0].json()["post_id"].as_str().unwrap().to_string();
    for s in &f.hosts {
        assert_eq!(s.cash_state(&secret).0, json!(true));
        let posts = common::posts_of(s, &key.fp());
        assert_eq!(posts.len(), 1, "{posts:?}");
        assert_eq!(posts.values().next(), Some(&id));
    }
}

/// Free ledger writes on one host (a client swapping one secret with
/// `POST /api/cash/replace` over and over, and the operator minting) while
/// paid posts go to the two other hosts: every post is created. (A batch of
/// paid posts reads dozens of index pages, so each such short write
/// elsewhere used to make it lose its race; from its second run again a
/// request now takes a batch of its own, each host adds to ledger totals of
/// its own, and a request goes on running again for 2 s. Before that, a loop of 90
/// replaces a second made 25 % of the posts 503, an unpaced one 50 %.)
/// The loops here pause 4 ms between calls (a few hundred writes a second).
#[test]
fn free_ledger_writes_on_one_host_do_not_starve_paid_posts_on_the_others() {
    let Some(f) = Fleet::start(
        "free_ledger_writes_on_one_host_do_not_starve_paid_posts_on_the_others",
        3,
    ) else {
        return;
    };
    let author = Arc::new(f.hosts[0].identity(&flow::nick("starved")));
    let (clients, per_client) = (24, 10);
    let (secrets, _) = post_secrets(&f.hosts[0], clients * per_client);
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicUsize::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let mut held = f.hosts[0].mint("0.01");
        let addr = f.hosts[0].addr;
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let next = new_secret(1_000_000);
                let body = json!({"webcashes": [held], "new_webcashes": [next]}).to_string();
                let r = common::request(
                    addr,
                    "POST",
                    "/api/cash/replace",
                    &[("content-type", "application/json")],
                    Some(body.as_bytes()),
                );
                assert_eq!(r.status, 200, "replace: {}", r.text());
                held = next;
                swaps.fetch_add(1, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(4));
            }
        })
    };
    let minter = {
        let (stop, admin) = (stop.clone(), f.hosts[0].admin);
        std::thread::spawn(move || {
            let auth = format!("Bearer {ADMIN_TOKEN}");
            let mut minted = 0;
            while !stop.load(Ordering::Relaxed) {
                let r = common::request(
                    admin,
                    "POST",
                    "/admin/cash/mint",
                    &[
                        ("authorization", &auth),
                        ("content-type", "application/json"),
                    ],
                    Some(br#"{"amount":"0.01"}"#),
                );
                assert_eq!(r.status, 200, "mint: {}", r.text());
                minted += 1;
                std::thread::sleep(Duration::from_millis(4));
            }
            minted
        })
    };
    // Let the loops get going.
    while swaps.load(Ordering::Relaxed) < 5 {
        std::thread::sleep(Duration::from_millis(2));
    }
    let posters: Vec<_> = secrets
        .chunks(per_client)
        .enumerate()
        .map(|(c, mine)| {
            let mine = mine.to_vec();
            let author = author.clone();
            let addr = f.hosts[1 + c % 2].addr;
            std::thread::spawn(move || {
                mine.iter()
                    .enumerate()
                    .map(|(i, secret)| {
                        let body = post_body(&author, &format!("beside the swaps {c}/{i}"));
                        let r = send_post(addr, secret, &body).expect("an answer");
                        (r.status, r.text())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let answers: Vec<(u16, String)> = posters
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let during = swaps.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    swapper.join().unwrap();
    let mints = minter.join().unwrap();
    let refused: Vec<&(u16, String)> = answers.iter().filter(|(s, _)| *s != 201).collect();
    let again = f.hosts[1].metric("marketplace_store_conflict_retries_total")
        + f.hosts[2].metric("marketplace_store_conflict_retries_total");
    eprintln!(
        "{} posts, {during} replaces and {mints} mints beside them; {again} runs again",
        answers.len()
    );
    assert!(
        refused.is_empty(),
        "{} of {} paid posts refused: {:?}",
        refused.len(),
        answers.len(),
        &refused[..refused.len().min(5)]
    );
    assert!(during > 5, "the replace loop did not overlap the posts");
    assert_eq!(
        common::posts_of(&f.hosts[2], &author.fp()).len(),
        clients * per_client
    );
    // A lost race is routine (the request runs again): what a component
    // logs about the storage call that lost it is not an error line.
    for h in &f.hosts[1..] {
        let log = h.log_text();
        let lines: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("ERROR") && l.contains("conflict with a concurrent request"))
            .collect();
        assert!(lines.is_empty(), "{again} runs again: {lines:#?}");
    }
}

/// A TCP relay between hosts and PostgreSQL that a test can cut (every
/// connection closed, new ones refused: a database that went away) or
/// freeze (every byte held: a database or network that hangs).
struct Relay {
    addr: SocketAddr,
    /// 0: pass bytes on; 1: cut; 2: frozen.
    mode: Arc<std::sync::atomic::AtomicU8>,
    open: Arc<Mutex<Vec<std::net::TcpStream>>>,
}

impl Relay {
    fn to(upstream: SocketAddr) -> Relay {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let open: Arc<Mutex<Vec<std::net::TcpStream>>> = Arc::default();
        let (m, o) = (mode.clone(), open.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { continue };
                if m.load(Ordering::SeqCst) == 1 {
                    continue; // dropped: closed at once
                }
                let Ok(server) = std::net::TcpStream::connect(upstream) else {
                    continue;
                };
                o.lock()
                    .unwrap()
                    .extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let m = m.clone();
                    std::thread::spawn(move || {
                        let mut buf = [0u8; 16384];
                        loop {
                            let n = match from.read(&mut buf) {
                                Ok(0) | Err(_) => break,
                                Ok(n) => n,
                            };
                            while m.load(Ordering::SeqCst) == 2 {
                                std::thread::sleep(Duration::from_millis(5));
                            }
                            if m.load(Ordering::SeqCst) == 1 || to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = from.shutdown(std::net::Shutdown::Both);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, mode, open }
    }

    /// The database URL `url` with this relay as its host and port.
    fn url(&self, url: &str) -> String {
        let (head, rest) = url.split_once('@').expect("user@host in the URL");
        let tail = rest.find('/').map_or("", |i| &rest[i..]);
        format!("{head}@{}{tail}", self.addr)
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
        if mode == 1 {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

/// A host on a new schema named after `schema` of the database at `url`,
/// reaching it through a [`Relay`] the test can cut or freeze, with the
/// settings `more`.
fn through_a_relay(url: &str, schema: &str, more: &[(&str, &str)]) -> (Relay, Server) {
    let relay = Relay::to(db_addr(url));
    let mut env = vec![
        ("MARKETPLACE_STORE".to_string(), relay.url(url)),
        (
            "MARKETPLACE_STORE_SCHEMA".to_string(),
            common::random_schema(schema),
        ),
    ];
    env.extend(more.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let s = Server::with(Options {
        env,
        ..Options::default()
    });
    (relay, s)
}

/// A host whose store goes away before anything scraped its metrics
/// shows the ledger totals read at its start, not zeros (the fleet's
/// money, minted through another host before it started).
#[test]
fn the_ledger_gauges_hold_the_starts_totals_before_any_scrape() {
    let test = "the_ledger_gauges_hold_the_starts_totals_before_any_scrape";
    let Some(f) = Fleet::start(test, 1) else {
        return;
    };
    f.hosts[0].mint("1.5");
    let (relay, s) = through_a_relay(
        &f.url,
        "unused",
        &[
            ("MARKETPLACE_STORE_SCHEMA", f.schema.as_str()),
            ("MARKETPLACE_STORE_TIMEOUT_MS", "1000"),
        ],
    );
    relay.set(1);
    assert_eq!(s.metric("marketplace_ledger_minted_units"), 150_000_000);
}

/// The address of the test database in `url`.
fn db_addr(url: &str) -> SocketAddr {
    let rest = url.split_once('@').expect("user@host in the URL").1;
    let hostport = &rest[..rest.find('/').unwrap_or(rest.len())];
    std::net::ToSocketAddrs::to_socket_addrs(hostport)
        .unwrap()
        .next()
        .unwrap()
}

/// The shared store goes away, then hangs, under a host: every request
/// that needs it is answered 503 `store_unavailable` with `Retry-After`
/// (a hang within about `store_timeout_ms`, not never; health says 503),
/// nothing is spent, and once the store is back the identical retries are
/// created. (Before: 500 `internal` while it was down, and requests hung
/// for as long as it did.)
#[test]
fn a_store_that_goes_away_or_hangs_is_503_store_unavailable_and_nothing_is_lost() {
    let test = "a_store_that_goes_away_or_hangs_is_503_store_unavailable_and_nothing_is_lost";
    let Some(url) = common::pg_or_skip(test) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (relay, s) = through_a_relay(&url, "outage", &[("MARKETPLACE_STORE_TIMEOUT_MS", "1000")]);
    let key = s.identity(&flow::nick("outage"));
    let secrets: Vec<String> = (0..3).map(|_| s.mint(&amount(POST_UNITS))).collect();
    let bodies: Vec<String> = (0..3)
        .map(|i| post_body(&key, &format!("through an outage {i}")))
        .collect();
    let first = send_post(s.addr, &secrets[0], &bodies[0]).unwrap();
    assert_eq!(first.status, 201, "{}", first.text());

    let unavailable = |what: &str, r: &Resp| {
        assert_eq!(
            (r.status, r.code().as_str()),
            (503, "store_unavailable"),
            "{what}: {}",
            r.text()
        );
        assert!(r.header("retry-after").is_some(), "{what}: {:?}", r.headers);
    };
    let auth = format!("Bearer {ADMIN_TOKEN}");
    let minted = s.metric("marketplace_ledger_minted_units");
    assert!(minted > 0);
    for (mode, name) in [(1, "gone"), (2, "hanging")] {
        relay.set(mode);
        let secret = &secrets[mode as usize];
        let body = &bodies[mode as usize];
        // A scrape meanwhile shows the ledger totals last read, never
        // zeros (a graph would drop to nothing and come back).
        assert_eq!(
            s.metric("marketplace_ledger_minted_units"),
            minted,
            "{name}: the ledger totals while the store is away"
        );
        unavailable(name, &s.get("/api/timeline"));
        unavailable(name, &send_post(s.addr, secret, body).unwrap());
        let mint = common::request(
            s.admin,
            "POST",
            "/admin/cash/mint",
            &[
                ("authorization", &auth),
                ("content-type", "application/json"),
            ],
            Some(br#"{"amount":"0.01"}"#),
        );
        unavailable(name, &mint);
        // An admin upload cannot be recorded for the fleet: undone here
        // too, so this host does not serve another fee policy than the
        // fleet's (before, it kept it until a restart).
        let policy = || s.get("/api/fees").json()["actions"]["pickup"].clone();
        let before = policy();
        let fees = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
        let upload = common::request(
            s.admin,
            "PUT",
            "/admin/plugins/fees",
            &[("authorization", &auth)],
            Some(&fees),
        );
        unavailable(name, &upload);
        assert!(
            upload.json()["message"]
                .as_str()
                .unwrap_or_default()
                .starts_with("not applied"),
            "{name}: {}",
            upload.text()
        );
        assert_eq!(policy(), before, "{name}: the upload was not undone");
        let health = s.get("/api/health");
        assert_eq!(health.status, 503, "{name}: {}", health.text());
        assert_eq!(health.json()["storage"]["status"], "error", "{name}");
        assert!(health.header("retry-after").is_some(), "{name}: health");
        relay.set(0);
        // Back: the store answers again within a few tries.
        let until = Instant::now() + Duration::from_secs(30);
        while s.get("/api/health").status != 200 {
            assert!(Instant::now() < until, "{name}: the host never recovered");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            s.cash_state(secret).0,
            json!(false),
            "{name}: spent on a 503"
        );
        let again = send_post(s.addr, secret, body).unwrap();
        assert_eq!(again.status, 201, "{name}: the retry: {}", again.text());
    }
    let posts = common::posts_of(&s, &key.fp());
    assert_eq!(posts.len(), 3, "{posts:?}");
    for secret in &secrets {
        assert_eq!(s.cash_state(secret).0, json!(true));
    }
    // Each outage was logged for the operator.
    assert!(
        s.log_text().contains("the shared store is unavailable"),
        "no log line says the store was unavailable"
    );
}

/// 16 simultaneous accepts of one contract, spread over three hosts:
/// exactly one wins, the others are refused as invalid transitions, and
/// every host shows one accept in the history.
#[test]
fn sixteen_accepts_of_one_contract_across_hosts_one_wins() {
    let Some(f) = Fleet::start("sixteen_accepts_of_one_contract_across_hosts_one_wins", 3) else {
        return;
    };
    let d = flow::deal(&f.hosts[0]);
    let id = flow::buy(&f.hosts[1], &d, "1");
    let barrier = Arc::new(Barrier::new(16));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let addr = f.hosts[i % 3].addr;
            let body = flow::action_body(&d.seller, &id, "accept").to_string();
            let path = flow::action_path(&id, "accept");
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                barrier.wait();
                common::request(
                    addr,
                    "POST",
                    &path,
                    &[("content-type", "application/json")],
                    Some(body.as_bytes()),
                )
            })
        })
        .collect();
    let results: Vec<Resp> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let summary: Vec<(u16, String)> = results.iter().map(|r| (r.status, r.text())).collect();
    let wins = results.iter().filter(|r| r.status == 200).count();
    assert_eq!(wins, 1, "{summary:#?}");
    assert!(
        results.iter().all(|r| r.status == 200
            || (r.status == 409 && r.code() == "invalid_transition")
            || is_storage_conflict(r)),
        "{summary:#?}"
    );
    for s in &f.hosts {
        let doc = s.get(&format!("/api/arbitration/contracts/{id}")).json();
        assert_eq!(doc["status"], "active", "{doc}");
        let accepts = doc["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["action"] == "accept")
            .count();
        assert_eq!(accepts, 1, "{doc}");
    }
}

/// A post written through host A is found at once by search on hosts C
/// and B, and read there by id.
#[test]
fn a_post_written_on_one_host_is_found_by_search_on_another() {
    let Some(f) = Fleet::start(
        "a_post_written_on_one_host_is_found_by_search_on_another",
        3,
    ) else {
        return;
    };
    let [a, b, c] = [&f.hosts[0], &f.hosts[1], &f.hosts[2]];
    let seller = a.identity(&flow::nick("seller"));
    let mut raw = [0u8; 6];
    getrandom::fill(&mut raw).unwrap();
    let word = format!("zeppelin{}", common::hex(&raw));
    let id = a.new_post(
        &seller,
        &format!("Airship tours over the bay: {word}"),
        json!({"post_type": "service", "keywords": ["airship"]}),
    );
    for (name, s) in [("C", c), ("B", b)] {
        let r = s.get(&format!("/api/search?term={word}&limit=20"));
        assert_eq!(r.status, 200, "search on {name}: {}", r.text());
        let found = r.json();
        assert_eq!(found["total"], 1, "search on host {name}: {found}");
        assert_eq!(found["results"][0]["post_id"], id.as_str(), "{found}");
        let post = s.get(&format!("/api/posts/{id}"));
        assert_eq!(post.status, 200, "read on host {name}: {}", post.text());
    }
    // The schema was new: the host that made it said so.
    assert_eq!(
        f.hosts
            .iter()
            .filter(|h| h.log_text().contains("a new fleet with no data"))
            .count(),
        1,
        "one host made the schema"
    );
    // A shared store is backed up by the database, not through a host:
    // refused, saying so.
    let auth = format!("Bearer {}", common::ADMIN_TOKEN);
    let r = common::request(
        a.admin,
        "GET",
        "/admin/backup",
        &[("authorization", &auth)],
        None,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "conflict"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("pg_dump"), "{}", r.text());
    // And the other way round: written on C, found on A.
    let other = c.new_post(&seller, &format!("Second flight {word}"), json!({}));
    let found = a.get(&format!("/api/search?term={word}&limit=20")).json();
    assert_eq!(found["total"], 2, "{found}");
    assert!(
        found["results"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["post_id"] == other.as_str()),
        "{found}"
    );
}

/// The search index's counts (its statistics, each word's document
/// frequency), which every post adds to and a delete takes from, stay
/// exact when posts are written and deleted through different hosts:
/// searched on any host, the posts rank with the scores one host holding
/// the same posts gives them, and a deleted post's words count nowhere.
#[test]
fn index_counts_across_hosts_are_what_one_host_counts() {
    let Some(f) = Fleet::start("index_counts_across_hosts_are_what_one_host_counts", 3) else {
        return;
    };
    let [a, b, c] = [&f.hosts[0], &f.hosts[1], &f.hosts[2]];
    let mut raw = [0u8; 6];
    getrandom::fill(&mut raw).unwrap();
    let word = format!("dirigible{}", common::hex(&raw));
    let gone = format!("{word}gone");
    let texts = [
        format!("{word} tours"),
        format!("Balloon {word} rides over the bay, {gone} and the hills"),
        format!("{word} {word} repairs and spare parts"),
        format!("Kites, gliders and {word}"),
    ];
    let delete = |s: &Server, key: &Key, id: &str| {
        let r = s.delete_post(key, id);
        assert_eq!(r.status, 200, "delete: {}", r.text());
    };
    // Written through A, B, C and A; the one written through B deleted
    // through C.
    let seller = a.identity(&flow::nick("seller"));
    let ids: Vec<String> = texts
        .iter()
        .zip([a, b, c, a])
        .map(|(text, h)| h.new_post(&seller, text, json!({})))
        .collect();
    delete(c, &seller, &ids[1]);
    // The same posts on one host, the same one deleted.
    let one = Server::start();
    let key = one.identity(&flow::nick("seller"));
    let mine: Vec<String> = texts
        .iter()
        .map(|text| one.new_post(&key, text, json!({})))
        .collect();
    delete(&one, &key, &mine[1]);

    let scores = |s: &Server, term: &str| -> (Value, Vec<(String, f64)>) {
        let r = s.get(&format!("/api/search?term={term}&limit=20"));
        assert_eq!(r.status, 200, "{}", r.text());
        let found = r.json();
        let mut hits: Vec<(String, f64)> = found["results"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                (
                    h["content"].as_str().unwrap().to_string(),
                    h["score"].as_f64().unwrap(),
                )
            })
            .collect();
        hits.sort_by(|x, y| x.0.cmp(&y.0));
        (found["total"].clone(), hits)
    };
    let (total, expected) = scores(&one, &word);
    assert_eq!(total, 3, "one host: {expected:?}");
    for (name, s) in [("A", a), ("B", b), ("C", c)] {
        let (total, hits) = scores(s, &word);
        assert_eq!(total, 3, "host {name}: {hits:?}");
        assert_eq!(hits.len(), expected.len(), "host {name}: {hits:?}");
        for ((text, score), (want_text, want)) in hits.iter().zip(&expected) {
            assert_eq!(text, want_text, "host {name}");
            assert!(
                (score - want).abs() <= 1e-9 * want.abs().max(1.0),
                "host {name}, {text:?}: score {score}, one host {want}"
            );
        }
        // The deleted post's own word is counted nowhere any more.
        let (total, hits) = scores(s, &gone);
        assert_eq!((total, hits.len()), (json!(0), 0), "host {name}: {hits:?}");
    }
}

/// A fee component swapped through one host's admin API is served by the
/// two others (they poll the fleet's record every 100 ms; how soon is
/// printed, not asserted, so a loaded machine cannot fail it), by a host
/// started afterwards, and the swap back likewise by all three others.
#[test]
fn a_fee_component_swapped_on_one_host_is_served_by_all() {
    let Some(f) = Fleet::start("a_fee_component_swapped_on_one_host_is_served_by_all", 3) else {
        return;
    };
    for s in &f.hosts {
        assert_eq!(policy(s), "bid-inclusive");
    }
    let mut f = f;
    for (file, expected) in [
        ("fees_pickup_paid.wasm", "pickup-paid"),
        ("fees_bid_inclusive.wasm", "bid-inclusive"),
    ] {
        let a = &f.hosts[0];
        let bytes = std::fs::read(common::plugins_dir().join(file)).unwrap();
        let sent = Instant::now();
        let r = flow::admin(a, "PUT", "/admin/plugins/fees", &bytes);
        let answered = Instant::now();
        assert_eq!(r.status, 200, "PUT fees {file}: {}", r.text());
        assert_eq!(policy(a), expected, "host 0 right after its swap");
        let others = &f.hosts[1..];
        let mut seen: Vec<Option<Duration>> = vec![None; others.len()];
        while seen.iter().any(Option::is_none) && answered.elapsed() < Duration::from_secs(30) {
            for (i, s) in others.iter().enumerate() {
                if seen[i].is_none() && policy(s) == expected {
                    seen[i] = Some(answered.elapsed());
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{file}: PUT on host 0 took {:?}; served by hosts 1.. after {seen:?}",
            answered - sent
        );
        for (i, took) in seen.iter().enumerate() {
            assert!(took.is_some(), "host {} never served {file}", i + 1);
        }
        if expected == "pickup-paid" {
            // The swap is recorded in the store: a host started now serves
            // the swapped component from the start.
            let d = f.add();
            assert_eq!(
                policy(&f.hosts[d]),
                expected,
                "a host started after the swap"
            );
        }
    }
}

/// A change made through another host while a host loads is applied
/// before that host says it is ready: from its first answer it serves the
/// fleet's fee component (a contract bought on it would otherwise keep the
/// policy the fleet had left). A family that takes a while to load after
/// the fee family's makes the window; a try whose change came after the
/// start had read the fleet's records again tests nothing and is made
/// again.
#[test]
fn a_change_made_while_a_host_loads_is_served_once_it_is_ready() {
    let Some(f) = Fleet::start(
        "a_change_made_while_a_host_loads_is_served_once_it_is_ready",
        1,
    ) else {
        return;
    };
    let slow = "[families.slow]\ncomponent = \"testing_slow_load.wasm\"\n";
    let pickup = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    let bid = std::fs::read(common::plugins_dir().join("fees_bid_inclusive.wasm")).unwrap();
    for attempt in 1..=5 {
        // The fleet back on bid-inclusive (the first try: as started).
        let r = flow::admin(&f.hosts[0], "PUT", "/admin/plugins/fees", &bid);
        assert_eq!(r.status, 200, "{}", r.text());
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let log = data_dir.join(format!("server-{}.log", std::process::id()));
        let opts = Options {
            data_dir: Some(data_dir.clone()),
            ..options_on(&f.url, &f.schema, Some(slow))
        };
        let starting = std::thread::spawn(move || Server::with(opts));
        let until = Instant::now() + Duration::from_secs(60);
        while !common::read_log(&log)
            .lines()
            .any(|l| l.contains("plugin loaded family=\"fees\""))
        {
            assert!(Instant::now() < until, "{}", common::read_log(&log));
            std::thread::sleep(Duration::from_millis(5));
        }
        let r = flow::admin(&f.hosts[0], "PUT", "/admin/plugins/fees", &pickup);
        assert_eq!(r.status, 200, "{}", r.text());
        let b = starting.join().unwrap();
        let text = b.log_text();
        let at = |what: &str| text.lines().position(|l| l.contains(what));
        let (applied, done) = (at("applying an upload of the fleet"), at("families loaded"));
        match (applied, done) {
            (Some(applied), Some(done)) if applied < done => {
                assert_eq!(policy(&b), "pickup-paid", "{text}");
                return;
            }
            _ => eprintln!(
                "try {attempt}: not applied within the start (log lines {applied:?}, {done:?})"
            ),
        }
    }
    panic!("no try changed the fleet while the host loaded");
}

/// Fee settings are each host's own: a host whose `[settings.fees]`
/// differ from those of the host started before it says so at start,
/// naming both; a host like the one before it says nothing.
#[test]
fn a_host_with_other_fee_settings_than_the_fleets_warns_at_start() {
    let Some(mut f) = Fleet::start(
        "a_host_with_other_fee_settings_than_the_fleets_warns_at_start",
        1,
    ) else {
        return;
    };
    let warned = |s: &Server| s.log_text().contains("differ from those of the host");
    assert!(!warned(&f.hosts[0]), "{}", f.hosts[0].log_text());
    let dearer = "[settings.fees]\npost = \"0.5\"\n";
    f.hosts.push(host_with(&f.url, &f.schema, Some(dearer)));
    let log = f.hosts[1].log_text();
    assert!(warned(&f.hosts[1]), "{log}");
    assert!(log.contains("post=\"0.5\""), "this host's settings: {log}");
    assert!(log.contains("defaults"), "the fleet's settings: {log}");
    // The dearer host charges its own price, the first the default.
    assert_eq!(post_price(&f.hosts[1]), "0.5");
    assert_ne!(post_price(&f.hosts[0]), "0.5");
    // A host like the one started before it: no warning.
    f.hosts.push(host_with(&f.url, &f.schema, Some(dearer)));
    assert!(!warned(&f.hosts[2]), "{}", f.hosts[2].log_text());
    // A setting of a custom fee component's own differs too, and is
    // counted, never shown (it may be anything).
    let custom = format!("{dearer}api_token = \"s3cret-token\"\n");
    f.hosts.push(host_with(&f.url, &f.schema, Some(&custom)));
    let log = f.hosts[3].log_text();
    assert!(warned(&f.hosts[3]), "{log}");
    assert!(log.contains("and 1 other settings"), "{log}");
    assert!(!log.contains("s3cret-token"), "{log}");
}

/// The price `GET /api/fees` quotes for a post.
fn post_price(s: &Server) -> String {
    let fees = s.get("/api/fees").json();
    fees["actions"]["post"]["price"]
        .as_str()
        .unwrap_or_else(|| panic!("{fees}"))
        .to_string()
}

/// One paid-post request of the load and what its client saw.
struct Sent {
    content: String,
    secret: String,
    host: usize,
    /// The answer, or why there was none.
    seen: Result<(u16, Value), String>,
}

/// SIGKILL of one of three hosts in the middle of a paid-post load spread
/// over all of them: every acknowledged post is stored and readable on the
/// others, every secret is spent exactly when its post exists (nothing half
/// done), a refused request left nothing, and the ledger balances.
#[test]
fn kill_9_of_one_host_during_paid_writes_loses_nothing_acknowledged() {
    let Some(mut f) = Fleet::start(
        "kill_9_of_one_host_during_paid_writes_loses_nothing_acknowledged",
        3,
    ) else {
        return;
    };
    let author = Arc::new(f.hosts[0].identity(&flow::nick("loader")));
    let (clients, per_client) = (12, 30);
    let (all, minted) = post_secrets(&f.hosts[2], clients * per_client);
    let addrs: Vec<SocketAddr> = f.hosts.iter().map(|s| s.addr).collect();
    let victim = 1;
    let acked = Arc::new(AtomicUsize::new(0));
    let acked_on_victim = Arc::new(AtomicUsize::new(0));
    let killed = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = all
        .chunks(per_client)
        .enumerate()
        .map(|(c, mine)| {
            let mine = mine.to_vec();
            let (author, addrs) = (author.clone(), addrs.clone());
            let (acked, acked_on_victim, killed) =
                (acked.clone(), acked_on_victim.clone(), killed.clone());
            std::thread::spawn(move || {
                // Client c starts on host c % 3; when its host fails it
                // moves on to the next one, as behind a load balancer, with
                // the next secret (the failed request's outcome is unknown).
                let mut host = c % 3;
                let mut log = Vec::new();
                for (i, secret) in mine.into_iter().enumerate() {
                    let content = format!("load {c}/{i}");
                    let body = post_body(&author, &content);
                    let seen = match send_post(addrs[host], &secret, &body) {
                        Ok(r) => {
                            let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                            if r.status == 201 {
                                acked.fetch_add(1, Ordering::Relaxed);
                                if host == victim && !killed.load(Ordering::Relaxed) {
                                    acked_on_victim.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            if r.status == 503 {
                                is_storage_conflict(&r);
                            }
                            Ok((r.status, v))
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    let failed = seen.is_err();
                    log.push(Sent {
                        content,
                        secret,
                        host,
                        seen,
                    });
                    if failed {
                        host = (host + 1) % 3;
                    }
                }
                log
            })
        })
        .collect();
    // Kill the victim once a good share is acknowledged.
    let until = Instant::now() + Duration::from_secs(120);
    while acked.load(Ordering::Relaxed) < clients * per_client / 3 {
        assert!(Instant::now() < until, "the load makes no progress");
        std::thread::sleep(Duration::from_millis(5));
    }
    let acked_at_kill = acked.load(Ordering::Relaxed);
    f.hosts[victim].kill();
    killed.store(true, Ordering::Relaxed);
    let log: Vec<Sent> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    assert_eq!(log.len(), clients * per_client);

    let mut statuses: HashMap<u16, usize> = HashMap::new();
    let mut unanswered = Vec::new();
    for s in &log {
        match &s.seen {
            Ok((status, body)) => {
                *statuses.entry(*status).or_default() += 1;
                assert!(
                    *status == 201 || *status == 503,
                    "{} on host {} answered {status}: {body}",
                    s.content,
                    s.host
                );
            }
            Err(why) => {
                assert_eq!(s.host, victim, "{} failed on a live host: {why}", s.content);
                unanswered.push(s.content.clone());
            }
        }
    }
    eprintln!(
        "SIGKILL of host {victim} after {acked_at_kill} acknowledged posts ({} on it); {} requests: \
         {statuses:?}; {} without an answer: {unanswered:?}",
        acked_on_victim.load(Ordering::Relaxed),
        log.len(),
        unanswered.len()
    );
    assert!(
        acked_on_victim.load(Ordering::Relaxed) > 0,
        "the killed host had acknowledged nothing"
    );
    let after_kill = log
        .iter()
        .filter(|s| s.host != victim && matches!(s.seen, Ok((201, _))))
        .count();
    assert!(
        after_kill > acked_at_kill / 3,
        "the other hosts did not go on after the kill"
    );

    // What the survivors (and a fresh host on the same schema) show.
    let created: HashMap<&str, &str> = log
        .iter()
        .filter_map(|s| match &s.seen {
            Ok((201, body)) => Some((s.content.as_str(), body["post_id"].as_str().unwrap())),
            _ => None,
        })
        .collect();
    let fresh = f.add();
    for h in [0, 2, fresh] {
        let s = &f.hosts[h];
        let present = common::posts_of(s, &author.fp());
        for (content, id) in &created {
            assert_eq!(
                present.get(*content).map(String::as_str),
                Some(*id),
                "host {h}: the acknowledged post {content:?} ({id}) is missing"
            );
        }
        let sent: HashSet<&str> = log.iter().map(|s| s.content.as_str()).collect();
        for content in present.keys() {
            assert!(
                sent.contains(content.as_str()),
                "host {h}: a post nobody sent: {content}"
            );
        }
        // Each payment is spent exactly when its post exists; a request
        // answered with a refusal left nothing; an unanswered one (on the
        // killed host) either took effect whole or not at all.
        let spent = common::spent_states(s, &all);
        for sent in &log {
            let exists = present.contains_key(&sent.content);
            assert_eq!(
                spent[&sent.secret],
                json!(exists),
                "host {h}: {:?} (sent to host {}, seen {:?}): post stored {exists}, secret spent {}",
                sent.content,
                sent.host,
                sent.seen,
                spent[&sent.secret]
            );
            if let Ok((status, _)) = &sent.seen {
                assert_eq!(
                    exists,
                    *status == 201,
                    "host {h}: {:?} answered {status}",
                    sent.content
                );
            }
        }
        for id in created.values().take(20) {
            let r = s.get(&format!("/api/posts/{id}"));
            assert_eq!(r.status, 200, "host {h}: post {id}: {}", r.text());
        }

        // The ledger balances: what was minted is unspent in the known
        // secrets, or earned as fees (nothing is in escrow here).
        let posts = present.len() as u64;
        let unspent = spent.values().filter(|v| **v == json!(false)).count() as u64 * POST_UNITS;
        let (m, fees, escrow) = (
            s.metric("marketplace_ledger_minted_units"),
            s.metric("marketplace_ledger_fees_units"),
            s.metric("marketplace_ledger_escrow_units"),
        );
        assert_eq!(m, minted + IDENTITY_UNITS, "host {h}: minted");
        assert_eq!(escrow, 0, "host {h}: escrow");
        assert_eq!(
            fees,
            IDENTITY_UNITS + POST_UNITS * posts,
            "host {h}: fees earned vs. {posts} posts stored"
        );
        assert_eq!(
            m,
            unspent + fees + escrow,
            "host {h}: value is not conserved"
        );
    }
}

/// While the shared store is away every request fails the same way: their
/// error lines (a component's, the cash ledger's routes', the admin mint's)
/// are summarized (one a second, with the count held back) instead of one
/// per request, and the store's own line says what failed.
/// (Before, a store that refused connections gave an `ERROR` line per
/// failed request: a client retrying at once could fill the disk.)
#[test]
fn an_outage_is_logged_in_a_few_lines_not_one_per_request() {
    let test = "an_outage_is_logged_in_a_few_lines_not_one_per_request";
    let Some(url) = common::pg_or_skip(test) else {
        return;
    };
    let _serial = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (relay, s) = through_a_relay(&url, "outage_log", &[]);
    let key = s.identity(&flow::nick("outagelog"));
    let secret = s.mint(&amount(POST_UNITS));
    let body = post_body(&key, "through an outage");
    let public = common::public_of(&secret);
    let fresh = format!(
        "{}:secret:{}",
        secret.split_once(":secret:").unwrap().0,
        "ab".repeat(32)
    );
    relay.set(1);
    for _ in 0..60 {
        let r = send_post(s.addr, &secret, &body).unwrap();
        assert_eq!((r.status, r.code().as_str()), (503, "store_unavailable"));
    }
    // The host's own routes that touch the store too: the cash ledger's
    // replace and health check, and the admin mint.
    for _ in 0..20 {
        let r = s.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [&secret], "new_webcashes": [&fresh], "legalese": {"terms": true}}),
        );
        assert!(r.status >= 500, "replace: {} {}", r.status, r.text());
        let r = s.post_json("/api/cash/health_check", &json!([&public]));
        assert!(r.status >= 500, "health_check: {} {}", r.status, r.text());
        let r = s.admin_request("POST", "/admin/cash/mint", &json!({"amount": "1"}));
        assert!(r.status >= 500, "mint: {} {}", r.status, r.text());
    }
    relay.set(0);
    let log = s.log_text();
    let errors = log
        .lines()
        .filter(|l| l.contains("ERROR") && l.contains("store unavailable"))
        .count();
    assert!(errors <= 4, "{errors} error lines for one outage:\n{log}");
    assert!(
        log.lines()
            .any(|l| l.contains("while the shared store is unavailable")
                && l.contains("lines_since_last")),
        "the requests' own lines are summarized:\n{log}"
    );
    assert!(log.contains("the shared store is unavailable"));
}

/// On its own thread: a testing request on `host` that reads `read`
/// (its commit batch takes its snapshot), then holds that batch
/// `hold_ms`.
fn hold_batch(host: &Server, read: &str, hold_ms: u64) -> std::thread::JoinHandle<Resp> {
    let path = format!("/_testing/write?key=holder&read={read}&hold_ms={hold_ms}");
    let addr = host.addr;
    std::thread::spawn(move || common::request(addr, "POST", &path, &[], None))
}

/// On its own thread and connection: `POST path` with a JSON `body`.
fn post_json_apart(
    host: &Server,
    path: &'static str,
    body: &Value,
) -> std::thread::JoinHandle<Resp> {
    let (addr, body) = (host.addr, body.to_string());
    std::thread::spawn(move || {
        common::request(
            addr,
            "POST",
            path,
            &[("content-type", "application/json")],
            Some(body.as_bytes()),
        )
    })
}

/// A client that saw host A acknowledge a write, then sends host B a
/// request that depends on it, gets an answer that counts it, though B's
/// open commit batch took its snapshot before A's commit: a paid post with
/// change made on A is created (not 402 "not known"), and a replace of
/// that change is done (not 400). B runs such a refusal again in a batch
/// of its own (`marketplace_store_stale_refusals_total`). The batch is
/// held open by a testing request that read, then holds for `hold_ms`;
/// should the machine be too slow to send both requests within it, the
/// round is tried again with a longer hold.
#[test]
fn a_refusal_never_comes_from_a_snapshot_older_than_the_request() {
    let test = "a_refusal_never_comes_from_a_snapshot_older_than_the_request";
    let Some(f) = Fleet::start_of(test, 2, false, testing_host) else {
        return;
    };
    let (a, b) = (&f.hosts[0], &f.hosts[1]);
    let key = a.identity(&flow::nick("late"));
    let stale = "marketplace_store_stale_refusals_total";
    for (round, hold_ms) in [1500u64, 4000, 10_000].into_iter().enumerate() {
        let before = b.metric(stale);
        // B's batch: the holder reads (the batch's snapshot is taken), then
        // holds the batch.
        let holder = hold_batch(b, &format!("mark{round}"), hold_ms);
        // (A fifth of the hold for the holder to take its snapshot.)
        std::thread::sleep(Duration::from_millis(hold_ms / 5));
        // On A, acknowledged before B is asked: a mark the holder did not
        // see, and two secrets of one post each.
        let marked = a.request(
            "POST",
            &format!("/_testing/write?key=mark{round}&value=set"),
            &[],
            None,
        );
        assert_eq!(marked.status, 200, "{}", marked.text());
        let minted = a.mint(&amount(2 * POST_UNITS));
        let (for_post, for_replace) = (new_secret(POST_UNITS), new_secret(POST_UNITS));
        let r = a.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [minted], "new_webcashes": [for_post, for_replace]}),
        );
        assert_eq!(r.status, 200, "replace on A: {}", r.text());
        // On B, each on a connection of its own while the holder holds.
        let post = {
            let body = post_body(&key, &format!("after A's replace, round {round}"));
            let (addr, secret) = (b.addr, for_post.clone());
            std::thread::spawn(move || send_post(addr, &secret, &body).expect("an answer"))
        };
        let replaced = new_secret(POST_UNITS);
        let replace = post_json_apart(
            b,
            "/api/cash/replace",
            &json!({"webcashes": [for_replace], "new_webcashes": [replaced]}),
        );
        let (post, replace) = (post.join().unwrap(), replace.join().unwrap());
        let held = holder.join().unwrap();
        assert_eq!(held.status, 200, "holder: {}", held.text());
        // Whatever B's batch had read, both count A's replace.
        assert_eq!(post.status, 201, "post on B: {}", post.text());
        assert_eq!(replace.status, 200, "replace on B: {}", replace.text());
        assert_eq!(b.cash_state(&for_post).0, json!(true));
        assert_eq!(a.cash_state(&replaced).0, json!(false));
        let ran_again = b.metric(stale) - before;
        eprintln!(
            "round {round}: hold {hold_ms} ms, holder read {}, {ran_again} refusals run again",
            held.json()["read"]
        );
        // The round set up what it tests once a refusal from B's older
        // snapshot ran again (both requests' answers are checked above
        // either way). Often only the first of the two to take B's batch
        // reads in it: a refused request hands on a batch whose first
        // member is older than the commit window by committing it (so
        // refused requests cannot hold their batch-mates' answers), and
        // the other takes a new batch, read fresh, never refused.
        if ran_again >= 1 {
            return;
        }
    }
    panic!("B's batch never held a snapshot older than A's commits while a request came");
}

/// A refusal read from a batch older than the request runs again, except
/// after a write it dispatched succeeded: that write committed on its own,
/// and a run again would make it twice. B's held batch read before A
/// acknowledged a mark; a request on B that dispatches a write (`POST
/// /api/testing/relay`, a write route that answers 200), then reads the
/// mark in that batch and refuses 409, is answered as it is: its answer
/// shows the mark missing, and nothing ran again. (An answer that shows
/// the mark with a refusal run again would be the run again this test
/// forbids; one that shows it with nothing run again came after B's batch
/// was committed: the machine was too slow to send it within the hold,
/// and the round is tried again with a longer hold.)
#[test]
fn a_refusal_after_a_dispatched_write_is_not_run_again() {
    let test = "a_refusal_after_a_dispatched_write_is_not_run_again";
    let Some(f) = Fleet::start_of(test, 2, false, testing_host) else {
        return;
    };
    let (a, b) = (&f.hosts[0], &f.hosts[1]);
    let stale = "marketplace_store_stale_refusals_total";
    for (round, hold_ms) in [1500u64, 4000, 10_000].into_iter().enumerate() {
        let mark = format!("mark{round}");
        let before = b.metric(stale);
        let holder = hold_batch(b, &mark, hold_ms);
        std::thread::sleep(Duration::from_millis(hold_ms / 5));
        let marked = a.request(
            "POST",
            &format!("/_testing/write?key={mark}&value=set"),
            &[],
            None,
        );
        assert_eq!(marked.status, 200, "{}", marked.text());
        let body = json!({
            "read": mark,
            "status": 409,
            "path": "/api/testing/relay",
            "body": {"n": 0},
        });
        let dispatching = post_json_apart(b, "/api/testing/dispatch", &body)
            .join()
            .unwrap();
        let held = holder.join().unwrap();
        assert_eq!(held.status, 200, "holder: {}", held.text());
        assert_eq!(dispatching.status, 409, "{}", dispatching.text());
        let answer = dispatching.json();
        assert_eq!(answer["status"], 200, "the dispatched write: {answer}");
        let ran_again = b.metric(stale) - before;
        eprintln!(
            "round {round}: hold {hold_ms} ms, read {}, {ran_again} refusals run again",
            answer["read"]
        );
        assert_eq!(
            ran_again, 0,
            "the refusal after a dispatched write ran again"
        );
        // (A holder slow to take its snapshot read the mark too: the
        // round set up nothing, and the next holds longer.)
        if answer["read"].is_null() && held.json()["read"].is_null() {
            return;
        }
        assert_eq!(answer["read"], "set", "{answer}");
    }
    panic!("the request never came while B's batch held a snapshot older than A's mark");
}
