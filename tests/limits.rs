//! Black-box tests of the server's bounds and its observability: idle and
//! slow clients, per-call byte budgets (with the process's memory watched),
//! per-family concurrency, request ids in the logs, and the Prometheus
//! metrics on the admin and metrics listeners.

mod common;

use common::{ADMIN_TOKEN, Resp, Server};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn server_with(testing: bool, pairs: &[(&str, &str)]) -> Server {
    Server::with(common::Options {
        testing_routes: testing,
        env: env(pairs),
        ..common::Options::default()
    })
}

// ---------------------------------------------------------------------------
// Metrics: scraping and a small parser of the text format.

/// One sample of the text format.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

fn bad_line(line: &str) -> ! {
    panic!("metrics line does not parse: {line:?}")
}

/// Parse every sample line (comments skipped); panics on a line that does
/// not parse, naming it.
fn parse_metrics(text: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).unwrap_or_else(|| bad_line(line));
        let name = &line[..name_end];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            bad_line(line);
        }
        let mut labels = BTreeMap::new();
        let mut rest = &line[name_end..];
        if let Some(body) = rest.strip_prefix('{') {
            let mut chars = body.char_indices().peekable();
            let mut key = String::new();
            let close;
            loop {
                let Some((i, c)) = chars.next() else {
                    bad_line(line)
                };
                match c {
                    '}' if key.is_empty() => {
                        close = i;
                        break;
                    }
                    ',' if key.is_empty() => {}
                    '=' => {
                        if chars.next().map(|(_, c)| c) != Some('"') {
                            bad_line(line);
                        }
                        let mut value = String::new();
                        loop {
                            match chars.next() {
                                Some((_, '\\')) => match chars.next() {
                                    Some((_, 'n')) => value.push('\n'),
                                    Some((_, c @ ('\\' | '"'))) => value.push(c),
                                    _ => bad_line(line),
                                },
                                Some((_, '"')) => break,
                                Some((_, c)) => value.push(c),
                                None => bad_line(line),
                            }
                        }
                        labels.insert(std::mem::take(&mut key), value);
                    }
                    c if c.is_ascii_alphanumeric() || c == '_' => key.push(c),
                    _ => bad_line(line),
                }
            }
            rest = &body[close + 1..];
        }
        let mut fields = rest.split_whitespace();
        let value: f64 = fields
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| bad_line(line));
        out.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    out
}

/// Label pairs a sample must carry.
type Labels<'a> = &'a [(&'a str, &'a str)];

/// Scraped metrics.
struct Metrics {
    text: String,
    samples: Vec<Sample>,
}

impl Metrics {
    fn from_text(text: String) -> Metrics {
        assert!(
            text.ends_with("# EOF\n"),
            "the exposition does not end with # EOF: {text}"
        );
        let samples = parse_metrics(&text);
        Metrics { text, samples }
    }

    /// Sum of the samples called `name` whose labels include `labels`.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
            })
            .map(|s| s.value)
            .sum()
    }

    /// Whether a sample of `name` with `labels` is there (at any value).
    fn has(&self, name: &str, labels: &[(&str, &str)]) -> bool {
        self.samples.iter().any(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).is_some_and(|x| x == v))
        })
    }

    fn has_family(&self, name: &str) -> bool {
        self.text.lines().any(|l| {
            l.strip_prefix("# TYPE ")
                .is_some_and(|r| r.split(' ').next() == Some(name))
        })
    }
}

fn bearer() -> String {
    format!("Bearer {ADMIN_TOKEN}")
}

fn scrape_admin(s: &Server) -> Metrics {
    let r = common::request(
        s.admin,
        "GET",
        "/metrics",
        &[("authorization", &bearer())],
        None,
    );
    assert_eq!(r.status, 200, "admin /metrics: {}", r.text());
    Metrics::from_text(r.text())
}

fn scrape_listener(addr: SocketAddr) -> Metrics {
    let r = common::request(addr, "GET", "/metrics", &[], None);
    assert_eq!(r.status, 200, "metrics listener: {}", r.text());
    Metrics::from_text(r.text())
}

// ---------------------------------------------------------------------------
// 1. Idle connections.

/// What the server answers to `raw` on a fresh connection, whole (it
/// closes the connection after these answers).
fn raw_answer(s: &Server, raw: &[u8]) -> String {
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The server may answer and close before taking all of an oversize
    // head: a failed write is fine, the answer is what counts.
    let _ = c.write_all(raw);
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn requests_the_http_layer_refuses_get_json_errors() {
    let s = server_with(false, &[]);
    let long_uri = format!(
        "GET /api/health?q={} HTTP/1.1\r\nhost: t\r\n\r\n",
        "a".repeat(70_000)
    );
    let big_header = format!(
        "GET /api/health HTTP/1.1\r\nhost: t\r\nx-big: {}\r\n\r\n",
        "a".repeat(400_000)
    );
    let many_headers = format!(
        "GET /api/health HTTP/1.1\r\nhost: t\r\n{}\r\n",
        (0..120)
            .map(|i| format!("x-h{i}: v\r\n"))
            .collect::<String>()
    );
    for (raw, status, code) in [
        (
            b"POST /api/timeline HTTP/1.1\r\nhost: t\r\ncontent-length: abc\r\n\r\n".to_vec(),
            "400",
            "invalid_request",
        ),
        (
            b"GET /api/health HTTP/1.1\r\nhost: t\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n".to_vec(),
            "400",
            "invalid_request",
        ),
        (b"\x00\x01 not http\r\n\r\n".to_vec(), "400", "invalid_request"),
        (long_uri.into_bytes(), "414", "uri_too_long"),
        (big_header.into_bytes(), "431", "headers_too_large"),
        (many_headers.into_bytes(), "431", "headers_too_large"),
    ] {
        let answer = raw_answer(&s, &raw);
        assert!(answer.starts_with(&format!("HTTP/1.1 {status} ")), "{answer}");
        let (head, body) = answer.split_once("\r\n\r\n").unwrap();
        assert!(head.contains("content-type: application/json"), "{head}");
        assert!(head.contains(&format!("content-length: {}", body.len())), "{head}");
        let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"));
        assert_eq!(v["code"], code, "{answer}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    // Each was counted, and the log says so.
    let counted = scrape_admin(&s).get(
        "marketplace_requests_total",
        &[("family", "-"), ("route", "-"), ("status", "431")],
    );
    assert!(counted >= 2.0, "{counted}");
    s.wait_log("the refusal's line", |log| {
        log.contains("refused a request that could not be parsed")
    });
    // The server is fine, and its own answers are untouched.
    let r = s.get("/api/health");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.get("/api/nope").json()["code"], "not_found");
    // A long path is not echoed whole in a 404 or a 405.
    let long = format!("/api/{}", "x".repeat(30_000));
    let r = s.get(&long);
    assert_eq!(r.status, 404);
    assert!(r.text().len() < 500, "{} bytes", r.text().len());
    let r = s.request(
        "DELETE",
        &format!("/api/posts/{}", "y".repeat(30_000)),
        &[],
        None,
    );
    assert!(
        r.text().len() < 500,
        "{}: {} bytes",
        r.status,
        r.text().len()
    );
}

#[test]
fn idle_connections_do_not_stop_new_clients() {
    // Every client here has one address (loopback): without a share per
    // address (tested below) 512 idle ones fit.
    let s = server_with(false, &[("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "0")]);
    let idle: Vec<TcpStream> = (0..512)
        .map(|i| TcpStream::connect(s.addr).unwrap_or_else(|e| panic!("connection {i}: {e}")))
        .collect();
    // The server has accepted them all (they are open connections, not
    // clients waiting in the backlog).
    let until = Instant::now() + Duration::from_secs(30);
    let mut open = 0.0;
    while Instant::now() < until {
        open = scrape_admin(&s).get("marketplace_connections_open", &[]);
        if open >= 512.0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        open >= 512.0,
        "connections_open is {open} with 512 idle clients"
    );

    let started = Instant::now();
    let r = s.get("/api/health");
    let took = started.elapsed();
    eprintln!("GET /api/health beside 512 idle connections: {took:?}");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        took < Duration::from_secs(2),
        "a new client waited {took:?}"
    );

    // Closed by the clients: the gauge comes back down.
    drop(idle);
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let open = scrape_admin(&s).get("marketplace_connections_open", &[]);
        if open <= 1.0 {
            break;
        }
        assert!(
            Instant::now() < until,
            "connections_open is still {open} after the idle clients left"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two addresses holding every place with requests whose bodies trickle
/// in (a byte now and then, so they are inside a request until the body
/// timeout) do not keep a third client out: when every connection is
/// inside a request, one still receiving its body, of the address holding
/// the most, is closed to make room. (Before, the newcomer waited for the
/// body timeout, and the two could hold every place again and again.)
#[test]
fn bodies_trickled_from_every_place_give_way_to_a_new_client() {
    let s = server_with(
        false,
        &[
            ("MARKETPLACE_MAX_CONNECTIONS", "8"),
            ("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "4"),
            ("MARKETPLACE_BODY_TIMEOUT_MS", "600000"),
        ],
    );
    let mut trickling = Vec::new();
    for (ip, n) in [([127, 0, 0, 2], 4), ([127, 0, 0, 3], 4)] {
        for _ in 0..n {
            let mut c = common::connect_from(ip, s.addr);
            c.write_all(
                b"POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{",
            )
            .unwrap();
            trickling.push(c);
        }
    }
    // Every place is held by a request receiving its body.
    let until = Instant::now() + Duration::from_secs(30);
    while s.metric("marketplace_connections_open") < 8 {
        assert!(Instant::now() < until, "the places were never all taken");
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut newcomer = common::connect_from([127, 0, 0, 4], s.addr);
    newcomer
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    newcomer
        .write_all(b"GET /api/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .unwrap();
    let r = common::read_response(&mut newcomer);
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(s.metric("marketplace_connections_closed_for_room_total") >= 1);
    // The log says why the closed one's request never ran (not that its
    // client went away).
    s.wait_log("the closed request's line", |log| {
        log.contains("closed to make room while its body was still coming")
    });
    drop(trickling);
}

/// Two addresses holding every place (each within its share, sending
/// nothing or half a header) do not keep a third client out for the
/// header timeout: a connection not inside a request, of the address that
/// holds the most, is closed to make room. One inside a request is kept.
#[test]
fn addresses_holding_every_place_give_way_to_a_new_client() {
    let s = server_with(
        true,
        &[
            ("MARKETPLACE_MAX_CONNECTIONS", "8"),
            ("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "4"),
            // Far longer than this test waits: no place frees by itself.
            ("MARKETPLACE_HEADER_TIMEOUT_MS", "120000"),
            // The busy request runs until then.
            ("MARKETPLACE_REQUEST_TIMEOUT_MS", "8000"),
        ],
    );
    // 127.0.0.3's first connection is inside a request that runs (a
    // plugin call spinning until its deadline).
    let mut busy = common::connect_from([127, 0, 0, 3], s.addr);
    busy.write_all(b"GET /_testing/loop HTTP/1.1\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut held = vec![];
    for i in 0..7 {
        let ip = if i < 4 {
            [127, 0, 0, 2]
        } else {
            [127, 0, 0, 3]
        };
        let mut c = common::connect_from(ip, s.addr);
        if i % 2 == 0 {
            c.write_all(b"GET /api/health HTTP/1.1\r\nx-slow: ")
                .unwrap();
        }
        held.push(c);
    }
    // The busy one's request has begun before a place is needed.
    let until = Instant::now() + Duration::from_secs(10);
    while scrape_admin(&s).get("marketplace_requests_in_flight", &[]) < 1.0 {
        assert!(
            Instant::now() < until,
            "the busy connection's request never began"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(100));
    // Every place is taken; a client of a third address is served.
    let r = common::try_request(s.addr, "GET", "/api/health", &[], None)
        .unwrap_or_else(|e| panic!("the new client was not served: {e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let m = scrape_admin(&s);
    assert!(m.get("marketplace_connections_closed_for_room_total", &[]) >= 1.0);
    // The connection inside a request was not the one closed (the
    // others, silent for more than a second, were).
    busy.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut head = [0u8; 9];
    busy.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"HTTP/1.1 ");
}

/// Two addresses holding every place with requests that wait their turn
/// (each address's runaway calls running at its long-call limit, the next
/// requests queued behind them) do not keep a third client out: a
/// connection whose request waits to be admitted gives way, answered 503
/// and closed. The running ones are kept.
#[test]
fn requests_waiting_their_turn_give_way_to_a_new_client() {
    let s = server_with(
        true,
        &[
            ("MARKETPLACE_MAX_CONNECTIONS", "8"),
            ("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "4"),
            ("MARKETPLACE_HEADER_TIMEOUT_MS", "120000"),
            // The loops run until then (past this test's own bounds), and
            // the waiting ones wait.
            ("MARKETPLACE_REQUEST_TIMEOUT_MS", "60000"),
        ],
    );
    let loop_request = b"GET /_testing/loop HTTP/1.1\r\nhost: x\r\n\r\n";
    let mut running = vec![];
    for ip in [[127, 0, 0, 2], [127, 0, 0, 3]] {
        for _ in 0..2 {
            let mut c = common::connect_from(ip, s.addr);
            c.write_all(loop_request).unwrap();
            running.push(c);
        }
    }
    // Each address's two calls run long (past 5 ms of their own time)...
    let until = Instant::now() + Duration::from_secs(20);
    while s.metric("marketplace_requests_in_flight") < 4 {
        assert!(Instant::now() < until, "the loops never all began");
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    // ... so each address's next two wait for their turn, holding the
    // other four places.
    let mut waiting = vec![];
    for ip in [[127, 0, 0, 2], [127, 0, 0, 3]] {
        for _ in 0..2 {
            let mut c = common::connect_from(ip, s.addr);
            c.write_all(loop_request).unwrap();
            waiting.push(c);
        }
    }
    while s.metric("marketplace_plugin_address_waits_total") < 4 {
        assert!(Instant::now() < until, "the requests never waited");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = common::try_request(s.addr, "GET", "/api/health", &[], None)
        .unwrap_or_else(|e| panic!("the new client was not served: {e}"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(s.metric("marketplace_connections_closed_for_room_total") >= 1);
    // One waiting request was answered 503, its connection closed; the
    // running ones are still running.
    let mut gave_way = None;
    while gave_way.is_none() {
        assert!(Instant::now() < until, "no waiting request gave way");
        for c in &mut waiting {
            c.set_nonblocking(true).unwrap();
            let ready = matches!(c.peek(&mut [0u8; 1]), Ok(n) if n > 0);
            c.set_nonblocking(false).unwrap();
            if ready {
                gave_way = Some(common::read_response(c));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = gave_way.unwrap();
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "plugin_unavailable"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("connection"), Some("close"));
    assert!(r.header("retry-after").is_some());
    assert!(s.metric("marketplace_requests_in_flight") >= 4);
    drop((running, waiting));
}

#[test]
fn one_address_holds_at_most_its_share_of_connections() {
    let s = server_with(false, &[("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "3")]);
    let mut held: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    // Accepted in order: the fourth finds its address at its share and is
    // closed at once, while the three held ones are served.
    let mut fourth = TcpStream::connect(s.addr).unwrap();
    assert!(closed_by_server(&mut fourth, Duration::from_secs(5)));
    let get = |c: &mut TcpStream| -> String {
        c.write_all(b"GET /api/health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut out = String::new();
        let _ = c.read_to_string(&mut out);
        out
    };
    assert!(get(&mut held[0]).starts_with("HTTP/1.1 200"));
    // That one closed: its place is free again (once the server has seen
    // it go).
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let mut next = TcpStream::connect(s.addr).unwrap();
        if get(&mut next).starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < until,
            "no place freed for a new connection"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let m = scrape_admin(&s);
    assert!(m.get("marketplace_connections_refused_total", &[]) >= 1.0);
    // The operator reads it in the log too (one line per 10 s at most).
    assert!(
        s.log_text().contains("connections refused"),
        "{}",
        s.log_text()
    );
}

/// A family's request bodies count against its share of
/// `max_pending_body_bytes` as they arrive, until the request runs: clients
/// that send bodies and stall before their last byte fill at most their
/// family's share (here half of 64 MiB), a body past it is 503 busy at
/// once (not read into memory), and the other families' requests go on.
/// Once those clients are gone the family takes bodies again.
#[test]
fn stalled_bodies_fill_only_their_familys_share_of_body_memory() {
    let s = server_with(
        false,
        &[
            ("MARKETPLACE_MAX_PENDING_BODY_BYTES", "67108864"),
            // The stalled bodies stay until the test lets them go.
            ("MARKETPLACE_BODY_TIMEOUT_MS", "600000"),
        ],
    );
    let two_mib = 2 << 20;
    let head = |len: usize| {
        format!(
            "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    let pending = || s.metric("marketplace_pending_body_bytes");
    let wait_for = |what: &str, done: &dyn Fn(u64) -> bool| {
        let until = Instant::now() + Duration::from_secs(60);
        while !done(pending()) {
            assert!(
                Instant::now() < until,
                "{what}: {} bytes pending",
                pending()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // Sixteen bodies of 2 MiB, each short of its last byte (each counted
    // as the 2 MiB allocated for it): 32 MiB, the timeline's whole share,
    // from two addresses (each within its own share).
    let stalled: Vec<TcpStream> = (0..16u8)
        .map(|i| {
            let mut c = common::connect_from([127, 0, 0, 2 + i % 2], s.addr);
            c.write_all(head(two_mib).as_bytes()).unwrap();
            c.write_all(&vec![b' '; two_mib - 1]).unwrap();
            c
        })
        .collect();
    wait_for("the stalled bodies", &|n| n >= 32 << 20);
    assert_eq!(pending(), 32 << 20);
    // Another timeline request with a body finds no room: 503 with when
    // to retry. (Sent whole in one write: nothing is left unread when the
    // server closes the connection.)
    let mut another = TcpStream::connect(s.addr).unwrap();
    let mut request = head(4096).into_bytes();
    request.extend_from_slice(&[b' '; 4096]);
    another.write_all(&request).unwrap();
    let r = common::read_response(&mut another);
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "plugin_unavailable"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("1"), "{}", r.text());
    // A client that waits for `100 Continue` is told 503 instead, before
    // it sends the body.
    let mut asks = TcpStream::connect(s.addr).unwrap();
    asks.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = head(4096).into_bytes();
    request.truncate(request.len() - 2);
    request.extend_from_slice(b"expect: 100-continue\r\n\r\n");
    asks.write_all(&request).unwrap();
    let r = common::read_response(&mut asks);
    assert_eq!(r.status, 503, "{}", r.text());
    // Another family's paid request is served meanwhile.
    let key = common::Key::random();
    let r = s.register(&key, "pendingbodies", &s.mint("1"));
    assert_eq!(r.status, 201, "{}", r.text());
    // Gone, the stalled bodies give their share back.
    drop(stalled);
    wait_for("the share given back", &|n| n == 0);
    let r = s.post(&key, "after the stalled bodies", json!({}), &s.mint("0.3"));
    assert_eq!(r.status, 201, "{}", r.text());
}

/// One client address holds at most its share of body memory (an eighth
/// of `max_pending_body_bytes`, at least two of the largest bodies): its
/// stalled bodies past that are refused while the family still has room
/// for others. (Before, 64 stalled 2 MiB posts from one address, sent
/// again every `body_timeout_ms`, kept every client's posts out.)
#[test]
fn one_address_holds_only_its_share_of_body_memory() {
    let s = server_with(false, &[("MARKETPLACE_BODY_TIMEOUT_MS", "600000")]);
    let two_mib = 2 << 20;
    let head = |len: usize| {
        format!(
            "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
        )
    };
    let pending = || s.metric("marketplace_pending_body_bytes");
    // The address's share of the default 256 MiB: 32 MiB, sixteen bodies.
    let stalled: Vec<TcpStream> = (0..16)
        .map(|_| {
            let mut c = common::connect_from([127, 0, 0, 2], s.addr);
            c.write_all(head(two_mib).as_bytes()).unwrap();
            c.write_all(&vec![b' '; two_mib - 1]).unwrap();
            c
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while pending() < 32 << 20 {
        assert!(Instant::now() < until, "{} bytes pending", pending());
        std::thread::sleep(Duration::from_millis(10));
    }
    // A seventeenth from that address: 503, told before it sends its body.
    let mut more = common::connect_from([127, 0, 0, 2], s.addr);
    more.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut request = head(two_mib).into_bytes();
    request.truncate(request.len() - 2);
    request.extend_from_slice(b"expect: 100-continue\r\n\r\n");
    more.write_all(&request).unwrap();
    let r = common::read_response(&mut more);
    assert_eq!(r.status, 503, "{}", r.text());
    // Another address's post is served meanwhile (the timeline's share,
    // 128 MiB, has room).
    let key = common::Key::random();
    s.register(&key, "othersender", &s.mint("1"));
    let r = s.post(&key, "beside a stalled sender", json!({}), &s.mint("0.3"));
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(pending(), 32 << 20);
    drop(stalled);
}

/// A route that declares a larger body limit than the usual (uploads, 8
/// MiB) has a share of its own: stalled uploads (here to a made-up token,
/// whose body is read before the component can say 404) fill only that
/// share, and the family's other requests (an identity's registration)
/// still find room. (Before, four such uploads took identity's whole share
/// and every registration was 503 until they timed out.)
#[test]
fn stalled_uploads_leave_room_for_their_familys_other_requests() {
    let s = server_with(
        false,
        &[
            ("MARKETPLACE_MAX_PENDING_BODY_BYTES", "67108864"),
            ("MARKETPLACE_BODY_TIMEOUT_MS", "600000"),
        ],
    );
    let eight_mib = 8 << 20;
    let upload = |mut c: TcpStream| {
        write!(
            c,
            "PUT /api/storage/upload/{} HTTP/1.1\r\nhost: x\r\ncontent-type: image/png\r\ncontent-length: {eight_mib}\r\n\r\n",
            "0".repeat(64)
        )
        .unwrap();
        c
    };
    let pending = || s.metric("marketplace_pending_body_bytes");
    // Four uploads short of their last byte: 32 MiB, identity's whole
    // share for large bodies, from two addresses.
    let stalled: Vec<TcpStream> = (0..4u8)
        .map(|i| {
            let mut c = upload(common::connect_from([127, 0, 0, 2 + i % 2], s.addr));
            c.write_all(&vec![b'x'; eight_mib - 1]).unwrap();
            c
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(60);
    while pending() < 32 << 20 {
        assert!(Instant::now() < until, "{} bytes pending", pending());
        std::thread::sleep(Duration::from_millis(10));
    }
    // A fifth finds no room (told before it sends its body).
    let mut fifth = upload(common::connect_from([127, 0, 0, 4], s.addr));
    fifth
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let r = common::read_response(&mut fifth);
    assert_eq!(r.status, 503, "{}", r.text());
    // The family's small requests still do.
    let key = common::Key::random();
    let r = s.register(&key, "afteruploads", &s.mint("1"));
    assert_eq!(r.status, 201, "{}", r.text());
    drop(stalled);
}

/// A connection to `to` whose client reads little at a time (a 4 KiB
/// receive buffer).
fn connect_small_reader(to: SocketAddr) -> TcpStream {
    common::connect_socket(to, |socket| socket.set_recv_buffer_size(4096).unwrap())
}

/// Large answers of reads wait for their clients within
/// `max_unsent_answer_bytes`: clients that ask for them and read nothing
/// hold at most that much (then a request for another is 503 with when to
/// retry, not kept in memory), and each is cut off once it has read
/// nothing for the header timeout, which gives its answer's room back.
/// (Before, 2,400 such sockets took a server from 65 MB to 2.3 GB, and
/// stayed open for minutes.)
#[test]
fn clients_that_read_nothing_hold_a_bounded_amount_of_answers() {
    let s = server_with(
        true,
        &[
            ("MARKETPLACE_MAX_UNSENT_ANSWER_BYTES", "16777216"),
            // Long enough for the third request to be answered before the
            // two idle clients are cut off, on a loaded machine.
            ("MARKETPLACE_HEADER_TIMEOUT_MS", "3000"),
        ],
    );
    let unsent = || s.metric("marketplace_unsent_answer_bytes");
    let ask = |stream: &mut TcpStream| {
        write!(
            stream,
            "GET /_testing/large?bytes={} HTTP/1.1\r\nhost: x\r\n\r\n",
            8 << 20
        )
        .unwrap();
    };
    // Two clients that never read: 16 MiB held.
    let mut idle: Vec<TcpStream> = (0..2)
        .map(|_| {
            let mut c = connect_small_reader(s.addr);
            ask(&mut c);
            c
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(30);
    while unsent() < 16 << 20 {
        assert!(Instant::now() < until, "{} bytes unsent", unsent());
        std::thread::sleep(Duration::from_millis(10));
    }
    // A third finds no room.
    let mut third = common::connect(s.addr);
    ask(&mut third);
    let r = common::read_response(&mut third);
    assert_eq!(
        (r.status, r.code().as_str()),
        (503, "plugin_unavailable"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), Some("1"));
    // Small answers are served meanwhile.
    assert_eq!(s.get("/_testing/ok").status, 200);
    // The two are cut off after reading nothing for 3 s: their room is back.
    let until = Instant::now() + Duration::from_secs(30);
    while unsent() > 0 {
        assert!(Instant::now() < until, "{} bytes still unsent", unsent());
        std::thread::sleep(Duration::from_millis(50));
    }
    for c in &mut idle {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut all = Vec::new();
        let _ = c.read_to_end(&mut all);
        assert!(all.len() < (8 << 20), "cut off before the whole answer");
    }
    // A client that reads gets the whole answer.
    let mut reader = common::connect(s.addr);
    ask(&mut reader);
    let r = common::read_response(&mut reader);
    assert_eq!((r.status, r.body.len()), (200, 8 << 20));
}

/// An answer larger than one client's share of `max_unsent_answer_bytes`
/// could never be sent: a 500 saying so (and a warning in the log), not a
/// 503 to retry forever (outside plugin-author probe).
#[test]
fn an_answer_larger_than_a_clients_share_is_refused_for_good() {
    let s = server_with(true, &[("MARKETPLACE_MAX_UNSENT_ANSWER_BYTES", "4194304")]);
    let r = s.get(&format!("/_testing/large?bytes={}", 5 << 20));
    assert_eq!(
        (r.status, r.code().as_str()),
        (500, "internal"),
        "{}",
        r.text()
    );
    assert!(
        r.text().contains("larger than this service sends"),
        "{}",
        r.text()
    );
    assert_eq!(r.header("retry-after"), None);
    // One within the share is sent whole.
    let r = s.get(&format!("/_testing/large?bytes={}", 3 << 20));
    assert_eq!((r.status, r.body.len()), (200, 3 << 20));
    assert!(
        s.log_text()
            .contains("an answer larger than one client may be sent")
    );
}

/// The refusals of a burst are all in the log, not only the first: those
/// held back by the one-line-per-10-s throttle are written when the
/// interval ends or, as here, at shutdown. (Before, the tail of a burst
/// waited for another refusal, and was lost at shutdown.)
#[test]
fn every_refused_connection_of_a_burst_reaches_the_log() {
    let mut s = server_with(false, &[("MARKETPLACE_MAX_CONNECTIONS_PER_IP", "1")]);
    let _held = TcpStream::connect(s.addr).unwrap();
    for _ in 0..5 {
        let mut refused = TcpStream::connect(s.addr).unwrap();
        assert!(closed_by_server(&mut refused, Duration::from_secs(5)));
    }
    let counted = scrape_admin(&s).get("marketplace_connections_refused_total", &[]);
    assert_eq!(counted, 5.0);
    s.stop();
    let log = s.log_text();
    let logged: u64 = log
        .lines()
        .filter(|l| l.contains("connections refused"))
        .filter_map(|l| l.split("refused=").nth(1))
        .filter_map(|n| n.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(logged, 5, "{log}");
}

/// Read from a connection the server should close: true when it was closed
/// (EOF or reset, possibly after an error answer), false when the read
/// timed out with the connection still open.
fn closed_by_server(stream: &mut TcpStream, within: Duration) -> bool {
    stream.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

/// The header timeout counts from the connection's last answer, not from
/// its admission: a keep-alive client whose requests come under the
/// timeout apart is served past the timeout from its admission, and one
/// that goes quiet after an answer is closed.
#[test]
fn the_header_timeout_counts_from_the_last_answer() {
    let s = server_with(false, &[("MARKETPLACE_HEADER_TIMEOUT_MS", "3000")]);
    let mut c = common::connect(s.addr);
    for i in 0..4 {
        std::thread::sleep(Duration::from_millis(1000));
        write!(c, "GET /api/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        let r = common::try_read_response(&mut c)
            .unwrap_or_else(|e| panic!("request {i}, 1 s after the last answer: {e}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert!(
        closed_by_server(&mut c, Duration::from_secs(15)),
        "an idle keep-alive connection is still open 15 s after a 3 s header timeout"
    );
}

/// A request that runs longer than the header timeout is answered, and
/// its connection serves the next one: the timeout is for the head.
#[test]
fn a_request_longer_than_the_header_timeout_keeps_its_connection() {
    // A timeout long enough for the next request to follow the answer on
    // a loaded machine.
    let s = server_with(
        true,
        &[
            ("MARKETPLACE_HEADER_TIMEOUT_MS", "1000"),
            ("MARKETPLACE_REQUEST_TIMEOUT_MS", "5000"),
        ],
    );
    let mut c = common::connect(s.addr);
    // The component spins for 3 s: three header timeouts.
    write!(
        c,
        "GET /_testing/loop?budget_ms=3000 HTTP/1.1\r\nhost: x\r\n\r\n"
    )
    .unwrap();
    let r = common::try_read_response(&mut c)
        .unwrap_or_else(|e| panic!("the long request's answer: {e}"));
    assert_eq!(r.status, 503, "{}", r.text());
    write!(c, "GET /api/health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
    let r = common::try_read_response(&mut c)
        .unwrap_or_else(|e| panic!("the next request on the same connection: {e}"));
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn header_timeout_frees_the_slots_of_silent_and_dribbling_clients() {
    // At most 16 connections; headers must arrive within a second.
    let s = Server::with(common::Options {
        env: env(&[
            ("MARKETPLACE_MAX_CONNECTIONS", "16"),
            ("MARKETPLACE_HEADER_TIMEOUT_MS", "1000"),
        ]),
        ..common::Options::default()
    });
    let mut idle: Vec<TcpStream> = (0..15)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    // The 16th dribbles its request line, a byte every 100 ms.
    let dribbler = TcpStream::connect(s.addr).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let drip = {
        let mut w = dribbler.try_clone().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            for b in b"GET /api/health HTTP/1.1\r\nx-padding: "
                .iter()
                .chain(std::iter::repeat(&b'a'))
            {
                if stop.load(Ordering::Relaxed) || w.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // Every slot is taken: a new client is served only once the server
    // has cut the silent ones off.
    let r = common::try_request(s.addr, "GET", "/api/health", &[], None).unwrap_or_else(|e| {
        panic!(
            "a new client was not served while 16 silent or dribbling clients held every slot: {e}"
        )
    });
    assert_eq!(r.status, 200, "{}", r.text());
    for (i, c) in idle.iter_mut().enumerate() {
        assert!(
            closed_by_server(c, Duration::from_secs(10)),
            "silent connection {i} is still open 10 s after a 1 s header timeout"
        );
    }
    let mut d = dribbler;
    let cut = closed_by_server(&mut d, Duration::from_secs(10));
    stop.store(true, Ordering::Relaxed);
    drip.join().unwrap();
    assert!(
        cut,
        "a client dribbling its headers is still connected 10 s after a 1 s header timeout"
    );
    assert_eq!(s.get("/api/health").status, 200);
}

// ---------------------------------------------------------------------------
// 2. Slow bodies.

#[test]
fn a_slow_drip_body_is_cut_off_with_408_and_others_are_served() {
    let s = server_with(false, &[("MARKETPLACE_BODY_TIMEOUT_MS", "1000")]);
    let mut stream = TcpStream::connect(s.addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    write!(
        stream,
        "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
    )
    .unwrap();
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let drip = {
        let mut w = stream.try_clone().unwrap();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sent = 0;
            while sent < 1000 && !stop.load(Ordering::Relaxed) {
                if w.write_all(b" ").is_err() {
                    break;
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            sent
        })
    };
    // While it drips, others are served.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(s.get("/api/health").status, 200);
    assert_eq!(s.get("/api/timeline").status, 200);

    let r = common::read_response(&mut stream);
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let sent = drip.join().unwrap();
    eprintln!(
        "slow body answered {} after {took:?} ({sent} bytes sent)",
        r.status
    );
    assert_eq!(r.status, 408, "{}", r.text());
    assert_eq!(r.code(), "request_timeout");
    assert!(
        took >= Duration::from_millis(900),
        "cut off after {took:?}, before the 1000 ms body timeout"
    );
    assert!(
        took < Duration::from_secs(10),
        "cut off only after {took:?}"
    );
    assert!(
        closed_by_server(&mut stream, Duration::from_secs(5)),
        "the connection stays open after the 408"
    );
    // The server is fine afterwards.
    assert_eq!(s.get("/api/health").status, 200);
}

// ---------------------------------------------------------------------------
// 3. Byte budgets of plugin calls, with the process's memory watched.

/// VmRSS and VmHWM (peak) of a process, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/{pid}/status"))
            * 1024
    };
    (field("VmRSS:"), field("VmHWM:"))
}

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

fn hog(s: &Server, query: &str) -> Resp {
    let path = format!("/_testing/hog?{query}");
    common::try_request(s.addr, "POST", &path, &[], None).unwrap_or_else(|e| {
        panic!(
            "POST {path}: {e} (the server may have died); log tail:\n{}",
            tail(&s.log_text())
        )
    })
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// A request over the host's byte budgets: the process's peak RSS stays
/// under 1 GiB, and the answer is the guest's mapping of the storage error
/// `too-large` (413 `payload_too_large`).
fn hog_refused(s: &Server, query: &str) {
    let r = hog(s, query);
    let (rss, peak) = rss(s.pid());
    eprintln!(
        "{query}: {} after it, RSS {} MiB, peak {} MiB",
        r.status,
        rss / MIB,
        peak / MIB
    );
    assert!(peak < GIB, "peak RSS {} MiB after {query}", peak / MIB);
    assert_eq!(
        (r.status, r.code().as_str()),
        (413, "payload_too_large"),
        "{query}: {}",
        String::from_utf8_lossy(&r.body[..r.body.len().min(400)])
    );
}

#[test]
fn plugin_calls_over_their_byte_budget_are_refused_and_memory_stays_bounded() {
    let s = Server::testing();
    let pid = s.pid();
    let (rss0, hwm0) = rss(pid);
    eprintln!("at start: RSS {} MiB, peak {} MiB", rss0 / MIB, hwm0 / MIB);

    // Within the budgets everything works.
    let r = hog(&s, "mode=writes&n=2");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["bytes"], 16 * MIB);
    let r = hog(&s, "mode=seed");
    assert_eq!(r.status, 200, "{}", r.text());
    let r = hog(&s, "mode=get_many&n=2");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["bytes"], 16 * MIB);

    // 200 writes of 8 MiB (1.6 GB) in one request.
    hog_refused(&s, "mode=writes&n=200");
    // Nothing of the refused request was kept.
    let r = s.get("/_testing/read?key=hog/w/5");
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(
        r.json()["value"].is_null(),
        "a refused request's write persisted"
    );

    // get-many of 500 copies of one 8 MiB value (4 GB), both forms.
    hog_refused(&s, "mode=get_many&n=500");
    hog_refused(&s, "mode=get_many&n=500&packed=1");

    // A scan over 9 values of 8 MiB (72 MiB, over the 32 MiB call budget).
    for i in 0..8 {
        let r = hog(&s, &format!("mode=seed&key=big{i}"));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    let r = hog(&s, "mode=scan&prefix=big0&n=10");
    assert_eq!(
        r.status,
        200,
        "one value is within the budget: {}",
        r.text()
    );
    assert_eq!(r.json()["bytes"], 8 * MIB);
    hog_refused(&s, "mode=scan&n=100");
    hog_refused(&s, "mode=scan&n=100&packed=1");

    let health = s.get("/api/health");
    assert_eq!(health.status, 200);
    assert_eq!(health.json()["plugins"]["testing"]["status"], "ok");
}

// ---------------------------------------------------------------------------
// 4. Per-family concurrency: spinning macros do not hold up paid posts.

fn timed_posts(s: &Server, key: &common::Key, secrets: &[String], tag: &str) -> Vec<Duration> {
    secrets
        .iter()
        .enumerate()
        .map(|(i, secret)| {
            let started = Instant::now();
            let r = s.post(key, &format!("{tag} post number {i}"), json!({}), secret);
            let took = started.elapsed();
            assert_eq!(r.status, 201, "{tag} post {i}: {}", r.text());
            took
        })
        .collect()
}

fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    (samples[samples.len() / 2], *samples.last().unwrap())
}

/// Two instances in all, both wanted by another family's runaway calls:
/// the reads' share of the pool and the family's limit leave paid writes
/// their reserved slot. Without them the loops would hold both, and each
/// paid post would wait out a loop's 8 s deadline (measured so, with
/// both turned off). Macros spin the same way but end at their 1 s
/// budget, too close to a loaded machine's noise to tell a wait apart;
/// `/_testing/loop` runs to the deadline.
#[test]
fn spinning_plugin_calls_do_not_delay_paid_posts() {
    let s = server_with(
        true,
        &[
            ("MARKETPLACE_MAX_INSTANCES", "2"),
            ("MARKETPLACE_REQUEST_TIMEOUT_MS", "8000"),
        ],
    );
    let key = s.identity("latencyseller");
    let secrets: Vec<String> = (0..60).map(|_| s.mint("0.3")).collect();

    let baseline = timed_posts(&s, &key, &secrets[..30], "baseline");

    let stop = Arc::new(AtomicBool::new(false));
    let addr = s.addr;
    let spinners: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut statuses = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let r = common::request(addr, "GET", "/_testing/loop", &[], None);
                    statuses.push((r.status, r.code()));
                }
                statuses
            })
        })
        .collect();
    // Both loops run (the testing family may hold one of the two slots;
    // the other waits for it) before the posts start.
    let until = Instant::now() + Duration::from_secs(20);
    while s.metric("marketplace_requests_in_flight") < 2 {
        assert!(Instant::now() < until, "the loops never arrived");
        std::thread::sleep(Duration::from_millis(10));
    }
    let loaded = timed_posts(&s, &key, &secrets[30..], "loaded");
    stop.store(true, Ordering::Relaxed);
    for t in spinners {
        let statuses = t.join().unwrap();
        assert!(!statuses.is_empty());
        for st in statuses {
            assert_eq!(st, (503, "plugin_unavailable".to_string()));
        }
    }
    let (b50, bmax) = summary(baseline);
    let (l50, lmax) = summary(loaded);
    eprintln!("30 paid posts alone: p50 {b50:?}, max {bmax:?}");
    eprintln!("30 paid posts beside two spinning calls: p50 {l50:?}, max {lmax:?}");
    assert!(
        lmax < Duration::from_secs(4),
        "a paid post took {lmax:?} while plugin calls spun, as if it waited for a slot (alone: max {bmax:?})"
    );
}

// ---------------------------------------------------------------------------
// 5. Request ids and log formats.

fn unique(tag: &str) -> String {
    let mut b = [0u8; 6];
    getrandom::fill(&mut b).unwrap();
    format!("{tag}-{}", common::hex(&b))
}

fn sane_id(id: &str) -> bool {
    (1..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:-".contains(&b))
}

/// Every line of a JSON log, parsed (panics on a line that is not JSON).
fn json_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .unwrap_or_else(|e| panic!("a log line is not JSON ({e}): {l:?}"))
        })
        .collect()
}

/// Poll the log until `pred` holds for a line (the server writes the
/// request line after answering).
fn wait_json_line(s: &Server, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(l) = json_lines(&s.log_text()).into_iter().find(|l| pred(l)) {
            return l;
        }
        assert!(
            Instant::now() < until,
            "no log line {what}; log:\n{}",
            tail(&s.log_text())
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn is_request_line(l: &Value, path: &str) -> bool {
    l["target"] == "request" && l["fields"]["path"] == path
}

#[test]
fn request_ids_reach_every_json_log_line_of_their_request() {
    let s = server_with(true, &[("MARKETPLACE_LOG_FORMAT", "json")]);
    let rid = unique("rid");
    let msg = unique("hello");
    let r = s.request(
        "GET",
        &format!("/_testing/log?msg={msg}"),
        &[("x-request-id", &rid)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-request-id"), Some(rid.as_str()));

    let plugin_line = wait_json_line(&s, "with the plugin's message", |l| {
        l["fields"]["message"] == msg.as_str()
    });
    assert_eq!(plugin_line["span"]["id"], rid.as_str(), "{plugin_line}");
    assert_eq!(plugin_line["level"], "INFO", "{plugin_line}");
    let request_line = wait_json_line(&s, "for the request", |l| {
        is_request_line(l, "/_testing/log") && l["span"]["id"] == rid.as_str()
    });
    assert_eq!(request_line["fields"]["status"], 200, "{request_line}");

    // Ids that are not sane are replaced by generated ones, and so is one
    // holding a cash secret (sent there by mistake: never logged).
    let long = "a".repeat(300);
    let secret = format!("e1:secret:{}", "cd".repeat(32));
    // A secret written without its colons, and a bare key, are kept out of
    // the log too.
    let underscored = format!("e0.77_secret_{}", "cd".repeat(32));
    let bare = "ef".repeat(32);
    let mut seen = Vec::new();
    for bad in [
        long.as_str(),
        "has spaces in it",
        "semi;colon",
        "",
        secret.as_str(),
        underscored.as_str(),
        bare.as_str(),
    ] {
        let r = s.request("GET", "/_testing/ok", &[("x-request-id", bad)], None);
        assert_eq!(r.status, 200);
        let id = r
            .header("x-request-id")
            .expect("an x-request-id")
            .to_string();
        assert_ne!(id, bad);
        assert!(sane_id(&id), "generated id {id:?}");
        wait_json_line(&s, &format!("with the generated id {id}"), |l| {
            is_request_line(l, "/_testing/ok") && l["span"]["id"] == id.as_str()
        });
        seen.push(id);
    }
    // Without the header too; every generated id differs.
    let id = s
        .get("/api/health")
        .header("x-request-id")
        .unwrap()
        .to_string();
    assert!(sane_id(&id), "{id:?}");
    seen.push(id);
    let mut distinct = seen.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), seen.len(), "{seen:?}");

    // Every line of the log is one JSON object.
    for l in json_lines(&s.log_text()) {
        assert!(l.is_object(), "{l}");
    }

    // MARKETPLACE_LOG_JSON=1 is the same switch.
    let s = server_with(false, &[("MARKETPLACE_LOG_JSON", "1")]);
    let rid = unique("rid");
    let r = s.request("GET", "/api/health", &[("x-request-id", &rid)], None);
    assert_eq!(r.header("x-request-id"), Some(rid.as_str()));
    wait_json_line(&s, "for the health request", |l| {
        is_request_line(l, "/api/health") && l["span"]["id"] == rid.as_str()
    });
}

#[test]
fn text_logs_carry_ids_and_no_colour_codes_when_not_a_terminal() {
    let s = Server::testing();
    let rid = unique("rid");
    let msg = unique("hello-text");
    let r = s.request(
        "GET",
        &format!("/_testing/log?msg={msg}"),
        &[("x-request-id", &rid)],
        None,
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), Some(rid.as_str()));
    let until = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = s.log_text();
        if log.lines().any(|l| l.contains(&msg)) || Instant::now() > until {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        !log.contains("\x1b["),
        "ANSI escapes in a log that is not a terminal:\n{}",
        tail(&log)
    );
    let line = log
        .lines()
        .find(|l| l.contains(&msg))
        .unwrap_or_else(|| panic!("no line with the plugin's message:\n{}", tail(&log)));
    assert!(
        line.contains(&rid),
        "the plugin's line lacks the request id: {line}"
    );
}

/// A plugin's log line stays one line (a line break in it would print a
/// host line of the plugin's making, say a forged access line), and one
/// call logs at most 100 lines: a stranger's request must not make a
/// plugin flood the operator's log.
#[test]
fn a_plugin_cannot_forge_log_lines_or_flood_the_log() {
    let s = Server::testing();
    let forged = "2026-11-29T08:00:00.000000Z  INFO request{id=fake}: request: forged=yes";
    let msg = format!("{}\n{forged}", unique("before"));
    let escaped: String = msg
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let r = s.get(&format!("/_testing/log?msg={escaped}"));
    assert_eq!(r.status, 200, "{}", r.text());
    let until = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = s.log_text();
        if log.contains("forged=yes") || Instant::now() > until {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let line = log
        .lines()
        .find(|l| l.contains("forged=yes"))
        .unwrap_or_else(|| panic!("no line with the message:\n{}", tail(&log)));
    assert!(line.contains("\\n2026-11-29"), "{line}");
    assert!(
        !log.lines()
            .any(|l| l.starts_with("2026-11-29T08:00:00.000000Z")),
        "a forged line:\n{}",
        tail(&log)
    );

    // A plugin that logs a cash secret (what it was paid with, the change
    // it was handed) does not put it in the log.
    let secret = s.mint("0.5");
    let hex = secret.rsplit(':').next().unwrap().to_string();
    let marker = unique("paid");
    let r = s.get(&format!(
        "/_testing/log?msg={marker}%20with%20{}",
        secret.replace(':', "%3A")
    ));
    assert_eq!(r.status, 200, "{}", r.text());
    s.wait_log("the plugin's line", |log| log.contains(&marker));
    let log = s.log_text();
    let line = log.lines().find(|l| l.contains(&marker)).unwrap();
    assert!(line.contains("e0.5:secret:{redacted}"), "{line}");
    assert!(!log.contains(&hex), "the secret is in the log:\n{line}");

    let flood = unique("flood");
    let r = s.get(&format!("/_testing/log?msg={flood}&times=5000"));
    assert_eq!(r.status, 200, "{}", r.text());
    // (The warning goes out at once; the info lines before it when their
    // worker next parks: wait for both.)
    let flooded = |log: &str| log.lines().filter(|l| l.contains(&flood)).count();
    let until = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = s.log_text();
        let done = log.contains("further log lines are dropped") && flooded(&log) >= 100;
        if done || Instant::now() > until {
            break log;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        log.contains("further log lines are dropped"),
        "{}",
        tail(&log)
    );
    assert_eq!(flooded(&log), 100);

    // Many such requests at once (each logs 16 of these 4 KB lines, its
    // 64 KiB): the family's lines together stop at 1 MiB a second (about
    // 262 of them), said once a second.
    let line = "x".repeat(4000);
    let burst = unique("burst");
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..50 {
                    let r = s.get(&format!("/_testing/log?msg={burst}{line}&times=100"));
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            });
        }
    });
    s.wait_log("the family's cap", |log| {
        log.contains("this family's log lines are dropped for the rest of this second")
    });
    // Counted by the second each line is stamped with (a line admitted
    // at the end of a second may be stamped in the next: twice the cap).
    let mut per_second = std::collections::HashMap::<&str, usize>::new();
    let log = s.log_text();
    for l in log.lines().filter(|l| l.contains(&burst)) {
        *per_second.entry(&l[..19]).or_default() += 1;
    }
    let most = per_second.values().max().copied().unwrap_or(0);
    assert!(most <= 2 * ((1 << 20) / 4000 + 1), "{per_second:?}");
}

// ---------------------------------------------------------------------------
// 6. Metrics.

const FAMILIES: &[&str] = &[
    "marketplace_requests",
    "marketplace_request_duration_seconds",
    "marketplace_plugin_instantiate_seconds",
    "marketplace_plugin_call_seconds",
    "marketplace_plugin_teardown_seconds",
    "marketplace_plugin_faults",
    "marketplace_plugin_swaps",
    "marketplace_payments_refused",
    "marketplace_commits",
    "marketplace_fsyncs",
    "marketplace_commit_batch_size",
    "marketplace_connections_open",
    "marketplace_requests_in_flight",
    "marketplace_ledger_minted_units",
    "marketplace_ledger_unspent_units",
    "marketplace_ledger_fees_units",
    "marketplace_ledger_escrow_units",
];

#[test]
fn metrics_are_served_to_the_operator_and_count_what_happened() {
    let s = server_with(true, &[("MARKETPLACE_METRICS_LISTEN", "127.0.0.1:0")]);
    let metrics_addr = s
        .metrics
        .expect("the server printed its metrics listener address");

    // The admin listener wants its token; the metrics listener does not,
    // and serves nothing else.
    let r = common::request(s.admin, "GET", "/metrics", &[], None);
    assert_eq!(r.status, 401, "{}", r.text());
    let r = common::request(
        s.admin,
        "GET",
        "/metrics",
        &[("authorization", "Bearer not-the-token-0123456789abcdef0123")],
        None,
    );
    assert_eq!(r.status, 401, "{}", r.text());
    let r = common::request(
        s.admin,
        "GET",
        "/metrics",
        &[("authorization", &bearer()), ("x-request-id", "scrape-1")],
        None,
    );
    assert_eq!(r.status, 200);
    // The admin listener's answers carry their request id as the public
    // listener's do.
    assert_eq!(r.header("x-request-id"), Some("scrape-1"));
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        r.header("content-type")
    );
    assert_eq!(
        common::request(metrics_addr, "GET", "/admin/plugins", &[], None).status,
        404
    );
    let r = common::request(metrics_addr, "POST", "/metrics", &[], Some(b"{}"));
    assert_eq!(
        (r.status, r.header("allow")),
        (405, Some("GET")),
        "{}",
        r.text()
    );
    // Nothing is served on the public listener.
    assert_eq!(s.get("/metrics").status, 404);

    // Money for later, minted before the baseline.
    let identity_secret = s.mint("0.6");
    let post_secret = s.mint("0.5");
    let key = common::Key::random();

    let m0 = scrape_admin(&s);
    let l0 = scrape_listener(metrics_addr);
    // What an alert rule reads is there from the start, at 0: every
    // refusal code of a 402, and a mounted family's faults, swaps and
    // call histograms (no series until the first event would leave a
    // rule on their rate nothing to read).
    for code in [
        "payment_required",
        "payment_invalid",
        "payment_spent",
        "payment_insufficient",
        "payment_rail_unavailable",
    ] {
        let labels = [("code", code)];
        assert!(
            m0.has("marketplace_payments_refused_total", &labels),
            "{code}"
        );
        assert_eq!(m0.get("marketplace_payments_refused_total", &labels), 0.0);
    }
    for family in ["testing", "timeline", "fees"] {
        for kind in ["trap", "timeout", "memory"] {
            let labels = [("family", family), ("kind", kind)];
            assert!(
                m0.has("marketplace_plugin_faults_total", &labels),
                "{family} {kind}"
            );
        }
        for result in ["ok", "refused", "unmounted"] {
            let labels = [("family", family), ("result", result)];
            assert!(
                m0.has("marketplace_plugin_swaps_total", &labels),
                "{family} {result}"
            );
        }
    }
    // (No contract route is asked for before this scrape.)
    for histogram in ["instantiate", "call", "teardown"] {
        let name = format!("marketplace_plugin_{histogram}_seconds_count");
        let labels = [("family", "contracts")];
        assert!(m0.has(&name, &labels), "{name}");
        assert_eq!(m0.get(&name, &labels), 0.0, "{name}");
    }
    assert_eq!(
        m0.get("marketplace_requests_total", &[]),
        l0.get("marketplace_requests_total", &[]),
        "both listeners render the same registry"
    );

    assert_eq!(s.get("/api/health").status, 200);
    assert_eq!(s.get("/api/v1/health").status, 200);
    assert_eq!(s.get("/api/info").status, 200);
    assert_eq!(s.get("/api/no-such-route").status, 404);
    // A paid route without payment (the body is valid, so 402 comes first).
    let ts = common::now_s();
    let unpaid = json!({"author_fingerprint": key.fp(), "content": "unpaid",
                        "signature": key.sign(&format!("post:unpaid:{ts}")), "timestamp": ts});
    let r = s.post_json("/api/timeline", &unpaid);
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_required"),
        "{}",
        r.text()
    );
    let r = s.post_paid("/api/timeline", "e0.3:secret:nothex", &unpaid);
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_invalid"),
        "{}",
        r.text()
    );
    // Faults of each kind.
    assert_eq!(s.get("/_testing/trap").status, 500);
    assert_eq!(s.get("/_testing/loop?budget_ms=100").status, 503);
    assert_eq!(s.get("/_testing/alloc").status, 503);
    // A refused component swap.
    let r = common::request(
        s.admin,
        "PUT",
        "/admin/plugins/testing",
        &[("authorization", &bearer())],
        Some(b"not a component"),
    );
    assert_eq!(r.status, 400, "{}", r.text());

    let m1 = scrape_admin(&s);
    let d = |name: &str, labels: &[(&str, &str)]| m1.get(name, labels) - m0.get(name, labels);
    let req = "marketplace_requests_total";
    let checks: &[(&str, Labels, f64)] = &[
        (
            req,
            &[
                ("family", "host"),
                ("route", "/api/health"),
                ("status", "200"),
            ],
            2.0,
        ),
        (
            req,
            &[
                ("family", "info"),
                ("route", "/api/info"),
                ("status", "200"),
            ],
            1.0,
        ),
        (
            req,
            &[("family", "-"), ("route", "-"), ("status", "404")],
            1.0,
        ),
        (
            req,
            &[
                ("family", "timeline"),
                ("route", "/api/timeline"),
                ("status", "402"),
            ],
            2.0,
        ),
        (
            req,
            &[
                ("family", "testing"),
                ("route", "/_testing/trap"),
                ("status", "500"),
            ],
            1.0,
        ),
        (
            req,
            &[
                ("family", "testing"),
                ("route", "/_testing/loop"),
                ("status", "503"),
            ],
            1.0,
        ),
        (
            req,
            &[
                ("family", "testing"),
                ("route", "/_testing/alloc"),
                ("status", "503"),
            ],
            1.0,
        ),
        (req, &[], 9.0),
        (
            "marketplace_request_duration_seconds_count",
            &[("family", "host"), ("route", "/api/health")],
            2.0,
        ),
        ("marketplace_request_duration_seconds_count", &[], 9.0),
        (
            "marketplace_payments_refused_total",
            &[("code", "payment_required")],
            1.0,
        ),
        (
            "marketplace_payments_refused_total",
            &[("code", "payment_invalid")],
            1.0,
        ),
        (
            "marketplace_plugin_faults_total",
            &[("family", "testing"), ("kind", "trap")],
            1.0,
        ),
        (
            "marketplace_plugin_faults_total",
            &[("family", "testing"), ("kind", "timeout")],
            1.0,
        ),
        (
            "marketplace_plugin_faults_total",
            &[("family", "testing"), ("kind", "memory")],
            1.0,
        ),
        ("marketplace_plugin_faults_total", &[], 3.0),
        (
            "marketplace_plugin_instantiate_seconds_count",
            &[("family", "testing")],
            3.0,
        ),
        (
            "marketplace_plugin_call_seconds_count",
            &[("family", "testing")],
            3.0,
        ),
        (
            "marketplace_plugin_teardown_seconds_count",
            &[("family", "testing")],
            3.0,
        ),
        (
            "marketplace_plugin_swaps_total",
            &[("family", "testing"), ("result", "refused")],
            1.0,
        ),
        ("marketplace_plugin_swaps_total", &[("result", "ok")], 0.0),
        ("marketplace_commits_total", &[], 0.0),
        ("marketplace_fsyncs_total", &[], 0.0),
    ];
    let mut wrong = Vec::new();
    for (name, labels, want) in checks {
        let got = d(name, labels);
        if got != *want {
            wrong.push(format!("{name}{labels:?}: moved by {got}, expected {want}"));
        }
    }
    assert!(
        d(
            "marketplace_plugin_instantiate_seconds_count",
            &[("family", "info")]
        ) >= 1.0,
        "info instantiations did not move"
    );
    assert_eq!(m1.get("marketplace_requests_in_flight", &[]), 0.0);
    assert!(
        wrong.is_empty(),
        "metrics moved wrongly:\n{}\n\n{}",
        wrong.join("\n"),
        m1.text
    );

    // Paid writes: commits and fsyncs move, and the ledger gauges follow
    // the money.
    let h0 = s.get("/api/health").json()["storage"].clone();
    let m2 = scrape_admin(&s);
    let r = s.register(&key, "metricsuser", &identity_secret);
    assert_eq!(r.status, 201, "{}", r.text());
    let r = s.post(&key, "counted post", json!({}), &post_secret);
    assert_eq!(r.status, 201, "{}", r.text());
    let change = r.json()["payment"]["change"].as_str().unwrap().to_string();
    let m3 = scrape_admin(&s);
    let h1 = s.get("/api/health").json()["storage"].clone();
    let d = |name: &str, labels: &[(&str, &str)]| m3.get(name, labels) - m2.get(name, labels);
    for (labels, want) in [
        (
            &[
                ("family", "identity"),
                ("route", "/api/identity"),
                ("status", "201"),
            ][..],
            1.0,
        ),
        (
            &[
                ("family", "timeline"),
                ("route", "/api/timeline"),
                ("status", "201"),
            ][..],
            1.0,
        ),
    ] {
        assert_eq!(d(req, labels), want, "{labels:?}");
    }
    let commits = d("marketplace_commits_total", &[]);
    let fsyncs = d("marketplace_fsyncs_total", &[]);
    eprintln!("two paid requests: {commits} commits, {fsyncs} fsyncs");
    assert_eq!(commits, 2.0, "commits_total moved by {commits}");
    assert!(
        (1.0..=2.0).contains(&fsyncs),
        "fsyncs_total moved by {fsyncs}"
    );
    // One batch-size observation per durable commit, summing to the
    // requests committed.
    assert_eq!(d("marketplace_commit_batch_size_count", &[]), fsyncs);
    assert_eq!(d("marketplace_commit_batch_size_sum", &[]), commits);
    // The health document counts the same.
    let hd = |k: &str| h1[k].as_f64().unwrap() - h0[k].as_f64().unwrap();
    assert_eq!(hd("commits"), commits, "health {h0} -> {h1}");
    assert_eq!(hd("syncs"), fsyncs, "health {h0} -> {h1}");

    // Minted: 0.6 + 0.5; fees: identity 0.6 + post 0.3; unspent: the 0.2
    // change; nothing in escrow.
    let units = |s: &str| (s.parse::<f64>().unwrap() * 1e8).round();
    assert_eq!(m3.get("marketplace_ledger_minted_units", &[]), units("1.1"));
    assert_eq!(m3.get("marketplace_ledger_fees_units", &[]), units("0.9"));
    assert_eq!(
        m3.get("marketplace_ledger_unspent_units", &[]),
        units("0.2")
    );
    assert_eq!(m3.get("marketplace_ledger_escrow_units", &[]), 0.0);
    let (spent, amount) = s.cash_state(&change);
    assert_eq!((spent, amount), (json!(false), json!("0.2")));
    // Every family has samples by now, all named marketplace_*.
    for family in FAMILIES {
        assert!(m3.has_family(family), "no {family} in:\n{}", m3.text);
    }
    for sample in &m3.samples {
        assert!(sample.name.starts_with("marketplace_"), "{sample:?}");
    }
    // The metrics listener sees the same ledger.
    let l3 = scrape_listener(metrics_addr);
    assert_eq!(l3.get("marketplace_ledger_minted_units", &[]), units("1.1"));
}

/// A plugin frames nothing: its `Content-Length`, `Transfer-Encoding` and
/// `Connection` are dropped and the host frames its whole body, so what
/// follows on the connection is the next request's answer, not text the
/// plugin wrote. A status that is not final is a 500; a bodiless error of
/// the plugin's goes out as it is (not as hyper's answer to a request it
/// could not parse).
#[test]
fn a_plugin_cannot_frame_its_own_answer() {
    let s = server_with(true, &[]);
    let body = b"{}HTTP/1.1 200 OK\r\ncontent-length: 19\r\n\r\n{\"smuggled\": true }";
    let out = raw_answer(
        &s,
        b"GET /_testing/framing HTTP/1.1\r\nhost: t\r\n\r\nGET /api/health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n",
    );
    let (head, rest) = out.split_once("\r\n\r\n").expect("an answer");
    let head = head.to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(
        head.contains(&format!("content-length: {}\r\n", body.len())),
        "{head}"
    );
    assert!(!head.contains("transfer-encoding"), "{head}");
    assert!(!head.contains("content-length: 2\r\n"), "{head}");
    let body = String::from_utf8_lossy(body);
    assert!(rest.starts_with(body.as_ref()), "{rest}");
    let second = &rest[body.len()..];
    assert!(second.starts_with("HTTP/1.1 200"), "{second}");
    assert!(second.contains("\"storage\""), "{second}");
    assert!(!second.contains("smuggled"), "{second}");

    // A component's own bodiless error goes out as it is: only hyper's
    // answers to what it could not parse are given a JSON body.
    for status in [400, 431] {
        let out = raw_answer(
            &s,
            format!(
                "GET /_testing/framing?status={status}&empty=1 HTTP/1.1\r\nhost: t\r\n\r\nGET /api/health HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n"
            )
            .as_bytes(),
        );
        let (head, rest) = out.split_once("\r\n\r\n").expect("an answer");
        assert!(head.starts_with(&format!("HTTP/1.1 {status} ")), "{head}");
        assert!(head.contains("\r\ncontent-length: 0"), "{head}");
        assert!(rest.starts_with("HTTP/1.1 200"), "{status}: {rest}");
    }

    for status in [101, 199] {
        let r = s.get(&format!("/_testing/framing?status={status}"));
        assert_eq!(r.status, 500, "{status}");
        assert_eq!(r.json()["code"], "internal");
    }

    // A redirect stays on the service's origin: one elsewhere would have
    // its client send the request there again, payment headers included
    // (plugin-author probe: a 307 to another host got a client's
    // X-Cash-Secret sent there).
    let r = s.get("/_testing/framing?status=307&location=/docs");
    assert_eq!((r.status, r.header("location")), (307, Some("/docs")));
    for away in [
        "https://a.example/steal",
        "//a.example/steal",
        "/%5Ca.example",
        "/%09/a.example",
    ] {
        let r = s.get(&format!("/_testing/framing?status=307&location={away}"));
        let decoded = away.replace("%5C", "\\").replace("%09", "\t");
        assert_eq!((r.status, r.code().as_str()), (500, "internal"), "{away}");
        assert!(r.header("location").is_none(), "{away}");
        assert!(
            s.log_text()
                .contains(&format!("off the service's origin (Location {decoded:?})")),
            "{away}"
        );
    }

    // Nor does it send payment headers (only the host writes what the
    // payment it took gives), nor, without the `credentials` grant, set
    // or ask for the client's credentials.
    let r = s.get("/_testing/framing");
    assert_eq!(r.header("x-testing-kept"), Some("yes"));
    for withheld in [
        "x-cash-change",
        "payment-required",
        "payment-response",
        "set-cookie",
        "www-authenticate",
        "proxy-authenticate",
    ] {
        assert_eq!(r.header(withheld), None, "{withheld}");
    }
    // (The testing family's own grants, and `credentials`.)
    let config = r#"[families.testing]
grants = ["payments", "signatures", "escrow", "dispatch", "host-info", "limits", "arbiter", "credentials"]
read = ["timeline", "identity", "contracts"]
"#
    .to_string();
    let s = Server::with(common::Options {
        testing_routes: true,
        config: Some(config),
        ..Default::default()
    });
    let r = s.get("/_testing/framing");
    assert_eq!(r.header("set-cookie"), Some("sid=evil; Path=/"));
    assert_eq!(r.header("www-authenticate"), Some("Basic realm=\"x\""));
    assert_eq!(r.header("x-cash-change"), None);
}

/// A request whose client leaves before the answer stops counting in
/// `marketplace_requests_in_flight` (it stayed counted for good), and the
/// log says it went unanswered.
#[test]
fn a_request_whose_client_left_stops_counting_in_flight() {
    let s = server_with(true, &[]);
    for _ in 0..3 {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.write_all(b"GET /_testing/loop?budget_ms=3000 HTTP/1.1\r\nhost: t\r\n\r\n")
            .unwrap();
        // The request has begun before its client goes.
        let until = Instant::now() + Duration::from_secs(10);
        while scrape_admin(&s).get("marketplace_requests_in_flight", &[]) < 1.0 {
            assert!(Instant::now() < until, "the request never began");
            std::thread::sleep(Duration::from_millis(10));
        }
        c.shutdown(std::net::Shutdown::Both).unwrap();
        drop(c);
        // Its deadline (the default second) ends the call either way.
        let until = Instant::now() + Duration::from_secs(10);
        while scrape_admin(&s).get("marketplace_requests_in_flight", &[]) > 0.0 {
            assert!(
                Instant::now() < until,
                "a request whose client left still counts as in flight"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    s.wait_log("the unanswered request", |log| {
        log.contains("the client went away before its answer")
    });
}

/// Requests that take the commit batch and fail there (a stranger's
/// valid secret that is never spent, sent with a bad signature: 401 after
/// the charge, nothing kept) must not hold a paid post's answer until they
/// stop coming: the post is answered while they still come.
#[test]
fn failing_mutations_do_not_hold_a_paid_post_until_they_stop() {
    let s = Server::start();
    let author = s.identity("flood_victim");
    let bait = s.mint("0.3");
    let stranger = common::Key::random();
    let flood_body = json!({"author_fingerprint": stranger.fp(), "content": "spam",
                            "signature": "00".repeat(64), "timestamp": common::now_s()})
    .to_string();
    let stop = Arc::new(AtomicBool::new(false));
    let gave_up = Arc::new(AtomicBool::new(false));
    let flooders: Vec<_> = (0..32)
        .map(|_| {
            let (addr, stop, gave_up) = (s.addr, stop.clone(), gave_up.clone());
            let (body, bait) = (flood_body.clone(), bait.clone());
            std::thread::spawn(move || {
                // One keep-alive connection each, eight requests pipelined
                // at a time: requests are always waiting at the server.
                let request = format!(
                    "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nx-cash-secret: {bait}\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                )
                .repeat(8);
                let until = Instant::now() + Duration::from_secs(60);
                let mut conn = common::connect(addr);
                while !stop.load(Ordering::Relaxed) {
                    if Instant::now() > until {
                        gave_up.store(true, Ordering::Relaxed);
                        return;
                    }
                    if conn.write_all(request.as_bytes()).is_err() {
                        conn = common::connect(addr);
                        continue;
                    }
                    // The eight answers, all 401 (the bad signature).
                    let mut got = Vec::new();
                    let mut chunk = [0u8; 16384];
                    while got.windows(13).filter(|w| w == b"HTTP/1.1 401 ").count() < 8
                        || got.last() != Some(&b'}')
                    {
                        match conn.read(&mut chunk) {
                            Ok(n) if n > 0 => got.extend_from_slice(&chunk[..n]),
                            _ => break,
                        }
                    }
                    let text = String::from_utf8_lossy(&got);
                    assert!(!text.contains("HTTP/1.1 2"), "{text}");
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let r = s.post(
        &author,
        "answered during the flood",
        json!({}),
        &s.mint("0.3"),
    );
    let flooding = !gave_up.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    for f in flooders {
        f.join().unwrap();
    }
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(
        flooding,
        "the paid post was answered only once the flood gave up"
    );
    assert_eq!(s.cash_state(&bait), (json!(false), json!("0.3")));
}

/// A body framed by anything but `chunked` once (RFC 9112 6.1, 7) is
/// answered 501 at once and the connection closed: hyper would read
/// `gzip, chunked` as plain chunked and hand a route compressed bytes.
/// `chunked` alone, in any case, is read as always.
#[test]
fn a_transfer_coding_other_than_chunked_is_501() {
    let s = server_with(false, &[]);
    // A chunked body of `{}` under `coding` (one header line, or two).
    let post = |coding: &str| {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            c,
            "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: {coding}\r\n\r\n2\r\n{{}}\r\n0\r\n\r\n"
        )
        .unwrap();
        common::read_response(&mut c)
    };
    for coding in [
        "gzip, chunked",
        "bogus, chunked",
        "chunked, chunked",
        "chunked\r\ntransfer-encoding: chunked",
    ] {
        let r = post(coding);
        assert_eq!(
            (r.status, r.code().as_str()),
            (501, "not_implemented"),
            "{coding}: {}",
            r.text()
        );
        assert_eq!(r.header("connection"), Some("close"), "{coding}");
    }
    // `chunked` alone (any case) is read: the route answers the body.
    for coding in ["chunked", "Chunked"] {
        let r = post(coding);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{coding}: {}",
            r.text()
        );
    }
}

/// A body under a content coding (`Content-Encoding: gzip`) is answered
/// 415 at once, naming `identity` in `Accept-Encoding` (RFC 9110
/// 15.5.16): no route decodes one, and a gzip-labelled `[]` was read as
/// plain JSON. `identity`, or no body, is served as ever.
#[test]
fn a_body_under_a_content_coding_is_415() {
    let s = server_with(false, &[]);
    let post = |coding: &str| {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        write!(
            c,
            "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-encoding: {coding}\r\ncontent-length: 2\r\n\r\n{{}}"
        )
        .unwrap();
        common::read_response(&mut c)
    };
    for coding in ["gzip", "br", "identity, gzip"] {
        let r = post(coding);
        assert_eq!(
            (r.status, r.code().as_str()),
            (415, "unsupported_media_type"),
            "{coding}: {}",
            r.text()
        );
        assert_eq!(r.header("accept-encoding"), Some("identity"), "{coding}");
        assert_eq!(r.header("connection"), Some("close"), "{coding}");
    }
    // `identity` is no coding: the route reads the body (and refuses `{}`).
    let r = post("identity");
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    assert_eq!(s.get("/api/health").status, 200);
}

/// An expectation other than `100-continue` (RFC 9110 10.1.1) is answered
/// 417 at once, before any body: the client holding its body back for it
/// is not left waiting for the body timeout's 408. `100-continue` still
/// gets its `100 Continue` and the request is served.
#[test]
fn an_unknown_expectation_is_417_at_once() {
    let s = server_with(false, &[("MARKETPLACE_BODY_TIMEOUT_MS", "600000")]);
    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nexpect: 200-ok\r\n\r\n"
    )
    .unwrap();
    let r = common::read_response(&mut c);
    assert_eq!(
        (r.status, r.code().as_str()),
        (417, "expectation_failed"),
        "{}",
        r.text()
    );
    // The body was not read: the connection is not kept for another.
    assert_eq!(r.header("connection"), Some("close"), "{}", r.text());

    let mut c = TcpStream::connect(s.addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        c,
        "POST /api/timeline HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 2\r\nexpect: 100-continue\r\n\r\n"
    )
    .unwrap();
    let mut interim = [0u8; 25];
    c.read_exact(&mut interim).unwrap();
    assert_eq!(&interim, b"HTTP/1.1 100 Continue\r\n\r\n");
    c.write_all(b"{}").unwrap();
    let r = common::read_response(&mut c);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
}
