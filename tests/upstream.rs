//! Upstream webcash mode: server M (`cash_upstream = http://U`) takes its
//! payments at server U, an ordinary marketplace whose `/api/v1/replace`
//! and `/api/v1/health_check` are webcash's. Change and refunds are U's
//! secrets; an upstream that is down, slow or answers garbage is a clear
//! 503/502 and nothing is lost. (The journal's crash points are unit-tested
//! beside the code, `money::upstream::tests`.)

mod common;

use common::{Key, Options, Server, now_s};
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Server M, taking payments at `upstream`, with the testing routes.
fn mirror(upstream: &str, timeout_ms: u64) -> Server {
    Server::with(Options {
        testing_routes: true,
        env: vec![
            ("MARKETPLACE_CASH_UPSTREAM".into(), upstream.into()),
            (
                "MARKETPLACE_CASH_UPSTREAM_TIMEOUT_MS".into(),
                timeout_ms.to_string(),
            ),
        ],
        ..Options::default()
    })
}

fn url(s: &Server) -> String {
    format!("http://{}", s.addr)
}

/// (spent, amount) of a secret at U, asked the way a webcash wallet does.
fn at(u: &Server, secret: &str) -> (Value, Value) {
    let r = u.post_json("/api/v1/health_check", &json!([secret]));
    assert_eq!(r.status, 200, "{}", r.text());
    let results = r.json()["results"].clone();
    let (_, v) = results.as_object().unwrap().iter().next().unwrap();
    (v["spent"].clone(), v["amount"].clone())
}

fn unspent(amount: &str) -> (Value, Value) {
    (json!(false), json!(amount))
}

fn spent(amount: &str) -> (Value, Value) {
    (json!(true), json!(amount))
}

/// A well-formed secret no mint knows.
fn stranger(amount: &str) -> String {
    let mut raw = [0u8; 32];
    getrandom::fill(&mut raw).unwrap();
    format!("e{amount}:secret:{}", common::hex(&raw))
}

fn register_body(key: &Key, nickname: &str, ts: u64) -> Value {
    json!({
        "nickname": nickname,
        "pgp_public_key": key.fp(),
        "signature": key.sign(&format!("register:{nickname}:{ts}")),
        "timestamp": ts,
    })
}

fn refund_of(r: &common::Resp) -> String {
    r.json()["payment"]["refund"]
        .as_str()
        .unwrap_or_else(|| panic!("no payment.refund: {}", r.text()))
        .to_string()
}

#[test]
fn payments_are_taken_at_the_upstream_and_change_is_its_cash() {
    if common::skip_on_postgres(
        "payments_are_taken_at_the_upstream_and_change_is_its_cash",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let u = Server::start();
    let m = mirror(&url(&u), 5000);
    let secret = u.mint("1");
    let key = Key::random();
    let body = register_body(&key, "upstream_alice", now_s());
    let r = m.post_paid("/api/identity", &secret, &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let change = r.header("x-cash-change").expect("change").to_string();
    assert_eq!(r.json()["payment"]["change"], change.as_str());
    assert!(change.starts_with("e0.4:secret:"), "{change}");
    assert_eq!(at(&u, &secret), spent("1"), "spent at the upstream");
    assert_eq!(at(&u, &change), unspent("0.4"), "the change is U's cash");

    // An identical retry gets the same answer; the secret cannot pay again.
    let again = m.post_paid("/api/identity", &secret, &body);
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.header("x-cash-change"), Some(change.as_str()));
    let other = register_body(&Key::random(), "upstream_bob", now_s());
    let r = m.post_paid("/api/identity", &secret, &other);
    assert_eq!((r.status, r.code()), (402, "payment_spent".into()));

    // The change pays at M again (a post costs 0.3).
    let ts = now_s();
    let post = json!({
        "author_fingerprint": key.fp(),
        "content": "paid upstream",
        "signature": key.sign(&format!("post:paid upstream:{ts}")),
        "timestamp": ts,
    });
    let r = m.post_paid("/api/timeline", &change, &post);
    assert_eq!(r.status, 201, "{}", r.text());
    let change2 = r.header("x-cash-change").unwrap().to_string();
    assert_eq!(at(&u, &change), spent("0.4"));
    assert_eq!(at(&u, &change2), unspent("0.1"));

    // M's fees are U's secrets the operator can withdraw.
    let fees = m.admin_request("GET", "/admin/cash/upstream-fees", &Value::Null);
    assert_eq!(fees.status, 200, "{}", fees.text());
    let fees = fees.json();
    assert_eq!(fees["total"], "0.9");
    for f in fees["unspent"].as_array().unwrap() {
        let s = f["secret"].as_str().unwrap();
        assert_eq!(at(&u, s), unspent(f["amount"].as_str().unwrap()));
    }

    // M keeps no ledger of its own: its ledger routes and mint name U.
    for path in [
        "/api/cash/replace",
        "/api/v1/replace",
        "/api/v1/health_check",
    ] {
        let r = m.post_json(path, &json!({"webcashes": [], "new_webcashes": []}));
        assert_eq!((r.status, r.code()), (409, "conflict".into()), "{path}");
        assert!(r.text().contains(&url(&u)), "{}", r.text());
    }
    let r = m.admin_request("POST", "/admin/cash/mint", &json!({"amount": "1"}));
    assert_eq!(r.status, 409, "{}", r.text());
    // And an embedded server has nothing to refund; a body that names no
    // secret is still the body's 400 first (PROTOCOL 1).
    let r = u.post_json("/api/cash/refund", &json!({"secret": secret}));
    assert_eq!((r.status, r.code()), (404, "not_found".into()));
    for (body, says) in [
        (json!({}), "is required"),
        (json!({"secret": null}), "is required"),
        (json!({"secret": 5}), "must be a string"),
        (json!({"secret": "e1:public:00"}), "64 lowercase hex"),
        (
            json!({"secret": format!("e1:public:{}", "ab".repeat(32))}),
            "not its public hash",
        ),
        (json!([1]), "must be a JSON object"),
    ] {
        let r = u.post_json("/api/cash/refund", &body);
        assert_eq!(
            (r.status, r.code()),
            (400, "invalid_request".into()),
            "{body}"
        );
        assert!(r.text().contains(says), "{body}: {}", r.text());
        let field = if body.is_object() { "secret" } else { "body" };
        assert_eq!(r.json()["details"][0]["field"], field, "{body}");
    }
}

#[test]
fn a_failed_request_returns_the_value_as_an_upstream_refund() {
    if common::skip_on_postgres(
        "a_failed_request_returns_the_value_as_an_upstream_refund",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let u = Server::start();
    let m = mirror(&url(&u), 5000);
    let secret = u.mint("1");
    let pay = [("x-cash-secret", secret.as_str())];
    let r = m.request("POST", "/_testing/paid?fail=status", &pay, Some(b"{}"));
    assert_eq!(
        (r.status, r.code()),
        (409, "conflict".into()),
        "{}",
        r.text()
    );
    let refund = refund_of(&r);
    assert_eq!(r.json()["payment"]["refund_amount"], "1");
    assert_eq!(at(&u, &secret), spent("1"), "swapped");
    assert_eq!(at(&u, &refund), unspent("1"), "worth the input at U");
    // Nothing of the request was kept.
    let read = m.request("GET", "/_testing/read?key=paid", &[], None);
    assert_eq!(read.json()["value"], Value::Null);

    // An identical retry runs again holding the same value: same refund.
    let r = m.request("POST", "/_testing/paid?fail=status", &pay, Some(b"{}"));
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(refund_of(&r), refund);
    // Another use of the secret (another body) is refused; the payer may
    // claim its value.
    let r = m.request("POST", "/_testing/paid", &pay, Some(b"{\"other\": 1}"));
    assert_eq!((r.status, r.code()), (402, "payment_spent".into()));
    assert!(r.text().contains("/api/cash/refund"), "{}", r.text());
    let claim = m.post_json("/api/cash/refund", &json!({"secret": secret}));
    assert_eq!(claim.status, 200, "{}", claim.text());
    assert_eq!(claim.json()["refund"], refund.as_str());
    assert_eq!(claim.json()["amount"], "1");

    // The refund pays like any of U's secrets.
    let r = m.request(
        "POST",
        "/_testing/paid",
        &[("x-cash-secret", refund.as_str())],
        Some(b"{}"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let change = r.header("x-cash-change").unwrap().to_string();
    assert_eq!(at(&u, &refund), spent("1"));
    assert_eq!(at(&u, &change), unspent("0.7"));
    // Now nothing is owed for the first secret.
    let claim = m.post_json("/api/cash/refund", &json!({"secret": secret}));
    assert_eq!((claim.status, claim.code()), (409, "conflict".into()));
    let claim = m.post_json("/api/cash/refund", &json!({"secret": stranger("1")}));
    assert_eq!((claim.status, claim.code()), (404, "not_found".into()));

    // A trap after the charge refunds too.
    let secret = u.mint("0.5");
    let r = m.request(
        "POST",
        "/_testing/paid?fail=trap",
        &[("x-cash-secret", secret.as_str())],
        Some(b"{}"),
    );
    assert_eq!(r.status, 500, "{}", r.text());
    assert_eq!(at(&u, &refund_of(&r)), unspent("0.5"));
}

#[test]
fn an_identical_retry_after_a_failure_loses_nothing() {
    if common::skip_on_postgres(
        "an_identical_retry_after_a_failure_loses_nothing",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let u = Server::start();
    let m = mirror(&url(&u), 5000);
    let secret = u.mint("1");
    let key = Key::random();
    let body = register_body(&key, "retry_carol", now_s());
    // M's clock runs ahead: the signature is stale, after the charge.
    let shift = |ms: i64| {
        let r = m.admin_request("POST", "/admin/clock", &json!({"shift_ms": ms}));
        assert_eq!(r.status, 200, "{}", r.text());
    };
    shift(400_000);
    let r = m.post_paid("/api/identity", &secret, &body);
    assert_eq!(
        (r.status, r.code()),
        (401, "auth_expired".into()),
        "{}",
        r.text()
    );
    let refund = refund_of(&r);
    assert_eq!(at(&u, &refund), unspent("1"));
    shift(-400_000);
    // The same request again: it succeeds with the value already swapped.
    let r = m.post_paid("/api/identity", &secret, &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let change = r.header("x-cash-change").unwrap().to_string();
    assert_eq!(at(&u, &change), unspent("0.4"));
    assert_eq!(at(&u, &refund), spent("1"), "the held value paid");
    let claim = m.post_json("/api/cash/refund", &json!({"secret": secret}));
    assert_eq!((claim.status, claim.code()), (404, "not_found".into()));
}

#[test]
fn an_upstream_that_is_down_spends_nothing() {
    if common::skip_on_postgres(
        "an_upstream_that_is_down_spends_nothing",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let mut u = Server::start();
    let m = mirror(&url(&u), 2000);
    let secret = u.mint("1");
    let data_dir = u.data_dir.clone();
    u.kill();
    let key = Key::random();
    let r = m.post_paid(
        "/api/identity",
        &secret,
        &register_body(&key, "down_dan", now_s()),
    );
    assert_eq!(
        (r.status, r.code()),
        (503, "upstream_unavailable".into()),
        "{}",
        r.text()
    );
    assert!(r.header("retry-after").is_some(), "{:?}", r.headers);
    assert!(r.json()["payment"].get("refund").is_none());
    // U again (on another port): the secret is the payer's, unspent.
    let u2 = Server::with(Options {
        data_dir: Some(data_dir),
        ..Options::default()
    });
    assert_eq!(at(&u2, &secret), unspent("1"));
    drop(u);
}

/// A listener that accepts connections and never answers.
fn silent() -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in l.incoming().take(8) {
            held.push(stream);
        }
        std::thread::sleep(Duration::from_secs(60));
    });
    (addr, t)
}

/// A listener answering every request `HTTP/1.1 {status}` with `body`.
fn answering(status: &'static str, body: &'static str) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in l.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                read_request(&mut s);
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
            });
        }
    });
    addr
}

/// Read one request's head and its content-length body.
fn read_request(s: &mut TcpStream) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let Ok(n) = s.read(&mut chunk) else { return };
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let len = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
    }
}

#[test]
fn a_slow_upstream_is_a_503_within_its_timeout() {
    if common::skip_on_postgres(
        "a_slow_upstream_is_a_503_within_its_timeout",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let (addr, _t) = silent();
    // The plugin's own deadline (1 s) must not cut the upstream's time.
    let m = mirror(&format!("http://{addr}"), 1500);
    let secret = stranger("1");
    let started = Instant::now();
    let r = m.request(
        "POST",
        "/_testing/paid",
        &[("x-cash-secret", secret.as_str())],
        Some(b"{}"),
    );
    let took = started.elapsed();
    assert_eq!(
        (r.status, r.code()),
        (503, "upstream_unavailable".into()),
        "{}",
        r.text()
    );
    assert!(r.header("retry-after").is_some());
    assert!(took >= Duration::from_millis(1400), "{took:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
}

#[test]
fn an_upstream_answering_garbage_is_a_502() {
    if common::skip_on_postgres(
        "an_upstream_answering_garbage_is_a_502",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    for (status, body) in [
        ("200 OK", "this is not json"),
        ("500 Internal Server Error", "oops"),
    ] {
        let addr = answering(status, body);
        let m = mirror(&format!("http://{addr}"), 2000);
        let r = m.request(
            "POST",
            "/_testing/paid",
            &[("x-cash-secret", stranger("1").as_str())],
            Some(b"{}"),
        );
        assert_eq!(
            (r.status, r.code()),
            (502, "upstream_error".into()),
            "{}",
            r.text()
        );
        assert!(r.json()["payment"].get("refund").is_none());
    }
}

#[test]
fn an_exact_payment_pays_once_and_its_refund_cannot_pay_again() {
    if common::skip_on_postgres(
        "an_exact_payment_pays_once_and_its_refund_cannot_pay_again",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let u = Server::start();
    let m = mirror(&url(&u), 5000);
    // `/_testing/paid` charges the `post` price, 0.3: an exact payment's
    // hold stays whole at M as its fee.
    let secret = u.mint("0.3");
    let pay = [("x-cash-secret", secret.as_str())];
    let r = m.request("POST", "/_testing/paid", &pay, Some(b"{}"));
    assert_eq!(r.status, 201, "{}", r.text());
    // The spent secret pays for nothing else, even though M's fee (the
    // hold it was swapped into) is still unspent at U.
    // (Another body: the same one would be an identical retry, answered
    // from the kept answer.)
    let r = m.request("POST", "/_testing/paid", &pay, Some(b"{\"again\": 1}"));
    assert_eq!(
        (r.status, r.code()),
        (402, "payment_spent".into()),
        "{}",
        r.text()
    );

    // A failed exact payment shows its hold as the refund; an identical
    // retry must not run on that hold while the payer keeps it.
    let secret = u.mint("0.3");
    let pay = [("x-cash-secret", secret.as_str())];
    let r = m.request("POST", "/_testing/paid?fail=status", &pay, Some(b"{}"));
    assert_eq!(r.status, 409, "{}", r.text());
    let refund = refund_of(&r);
    assert_eq!(at(&u, &refund), unspent("0.3"));
    let r = m.request("POST", "/_testing/paid?fail=status", &pay, Some(b"{}"));
    assert_eq!(
        (r.status, r.code()),
        (402, "payment_spent".into()),
        "{}",
        r.text()
    );
    assert_eq!(at(&u, &refund), unspent("0.3"), "the refund is the payer's");
}

/// Escrow is the embedded ledger's: a server started in upstream mode with
/// contracts bought before in embedded mode says so in health, and their
/// payouts and refunds are 409 with nothing issued (their secrets would
/// be worth nothing at the upstream); back in embedded mode they are paid.
#[test]
fn escrow_bought_in_embedded_mode_waits_for_it() {
    use common::deal as flow;
    if common::skip_on_postgres(
        "escrow_bought_in_embedded_mode_waits_for_it",
        "the host refuses cash_upstream with a shared store",
    ) {
        return;
    }
    let mut first = Server::start();
    let d = flow::deal(&first);
    let settled = flow::buy(&first, &d, "2");
    flow::act_ok(&first, &d.seller, &settled, "accept");
    flow::act_ok(&first, &d.seller, &settled, "deliver");
    flow::act_ok(&first, &d.buyer, &settled, "pickup");
    let refunded = flow::buy(&first, &d, "1");
    flow::act_ok(&first, &d.buyer, &refunded, "refund");
    assert!(
        first.get("/api/health").json()["alerts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    first.kill();

    // Nothing reaches the upstream here: the port need not answer.
    let mut m = Server::with(Options {
        data_dir: Some(first.data_dir.clone()),
        env: vec![(
            "MARKETPLACE_CASH_UPSTREAM".into(),
            "http://127.0.0.1:9".into(),
        )],
        ..Options::default()
    });
    let health = m.get("/api/health").json();
    let alerts = health["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{health}");
    assert_eq!(alerts[0]["kind"], "escrow_left_behind", "{health}");
    // 2 less the 3 % fee, and 1.
    let message = alerts[0]["message"].as_str().unwrap();
    assert!(message.contains("hold 2.94 in escrow"), "{message}");
    for (key, id) in [(&d.seller, &settled), (&d.buyer, &refunded)] {
        let r = flow::act(&m, key, id, "pickup");
        assert_eq!(
            (r.status, r.code().as_str()),
            (409, "conflict"),
            "{}",
            r.text()
        );
        assert!(
            r.text().contains("the contract is unchanged"),
            "{}",
            r.text()
        );
    }
    m.kill();

    let s = Server::with(Options {
        data_dir: Some(first.data_dir.clone()),
        ..Options::default()
    });
    assert!(
        s.get("/api/health").json()["alerts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    let payout = flow::act_ok(&s, &d.seller, &settled, "pickup");
    let refund = flow::act_ok(&s, &d.buyer, &refunded, "pickup");
    assert_eq!(
        s.cash_state(payout["payout"].as_str().unwrap()),
        (json!(false), json!("1.94"))
    );
    assert_eq!(
        s.cash_state(refund["refund"].as_str().unwrap()),
        (json!(false), json!("1"))
    );
}
