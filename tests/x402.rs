//! Black-box tests of x402 v2 beside the native payment headers and of the
//! webcash wallet paths (PROTOCOL section 3): `PAYMENT-REQUIRED` on every
//! 402, paying with `PAYMENT-SIGNATURE`, `PAYMENT-RESPONSE` on the paid
//! answer, the `payment-identifier` idempotency key; `legalese`, the empty
//! replace, health checks answered in request order and `/terms`.

mod common;

use common::{Key, Resp, Server, now_s};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

// ---------------------------------------------------------------- helpers

/// Standard base64 with padding, written here independently of the host.
fn b64(data: &[u8]) -> String {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in data.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            out.push(if i <= c.len() {
                A[((n >> (18 - 6 * i)) & 63) as usize] as char
            } else {
                '='
            });
        }
    }
    out
}

/// Decode standard padded base64 strictly (what the x402 SDKs send).
fn unb64(text: &str) -> Vec<u8> {
    const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    assert!(text.len().is_multiple_of(4), "unpadded base64: {text}");
    let body = text.trim_end_matches('=');
    let (mut acc, mut bits, mut out) = (0u32, 0, Vec::new());
    for ch in body.bytes() {
        let v = A
            .iter()
            .position(|&x| x == ch)
            .unwrap_or_else(|| panic!("not standard base64: {text}"));
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// A header's base64 JSON.
fn decoded(r: &Resp, name: &str) -> Value {
    let v = r
        .header(name)
        .unwrap_or_else(|| panic!("no {name} header: {} {}", r.status, r.text()));
    serde_json::from_slice(&unb64(v)).expect("base64 of JSON")
}

fn public_form(secret: &str) -> String {
    let (amount, hex) = secret.split_once(":secret:").unwrap();
    let h: String = Sha256::digest(hex.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("{amount}:public:{h}")
}

fn register_body(key: &Key, nickname: &str) -> Value {
    let ts = now_s();
    json!({
        "nickname": nickname,
        "pgp_public_key": key.fp(),
        "signature": key.sign(&format!("register:{nickname}:{ts}")),
        "timestamp": ts,
    })
}

/// The `PAYMENT-SIGNATURE` value paying with `secret` for `accepted`.
fn signature(accepted: &Value, secret: &str, id: Option<&str>) -> String {
    let mut doc = json!({
        "x402Version": 2,
        "accepted": accepted,
        "payload": {"secret": secret},
    });
    if let Some(id) = id {
        doc["extensions"] = json!({"payment-identifier": {"info": {"required": false, "id": id}}});
    }
    b64(doc.to_string().as_bytes())
}

/// The webcash `accepts` entry of a fresh 402 for identity.
fn identity_requirements(s: &Server) -> Value {
    let r = s.post_json("/api/identity", &register_body(&Key::random(), "probe"));
    assert_eq!(r.status, 402, "{}", r.text());
    decoded(&r, "payment-required")["accepts"][0].clone()
}

// ------------------------------------------------------------------ x402

#[test]
fn every_402_carries_payment_required() {
    let s = Server::start();
    let r = s.post_json("/api/identity", &register_body(&Key::random(), "alice"));
    assert_eq!(r.status, 402);
    // The JSON body keeps its PROTOCOL shape.
    let body = r.json();
    assert_eq!(body["code"], "payment_required");
    assert_eq!(body["required_amount"], "0.6");
    assert_eq!(body["payment"]["header"], "X-Cash-Secret");
    let doc = decoded(&r, "PAYMENT-REQUIRED");
    assert_eq!(doc["x402Version"], 2);
    assert!(
        doc["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{doc}"
    );
    let url = doc["resource"]["url"].as_str().unwrap();
    assert!(
        url.starts_with("http://") && url.ends_with("/api/identity"),
        "{url}"
    );
    assert!(doc["resource"]["description"].is_string());
    assert_eq!(doc["resource"]["mimeType"], "application/json");
    // The same 402 through the MCP execute tool names the same resource.
    let r = s.post_json(
        "/api/mcp/tools/execute",
        &json!({"endpoint": {"method": "POST", "path": "/api/identity",
                             "body": register_body(&Key::random(), "viaexec")}}),
    );
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(decoded(&r, "payment-required")["resource"]["url"], url);
    assert_eq!(
        doc["accepts"],
        json!([{
            "scheme": "exact",
            "network": "webcash:mainnet",
            "asset": "webcash",
            "amount": "60000000",
            "payTo": "marketplace",
            "maxTimeoutSeconds": 300,
            "extra": {"header": "X-Cash-Secret", "price": "0.6"},
        }])
    );
    // The payment-identifier extension is declared (optional).
    assert_eq!(
        doc["extensions"]["payment-identifier"]["info"]["required"],
        false
    );

    // Other 402 codes carry it too: a spent secret, too little.
    let small = s.mint("0.1");
    let r = s.post_paid(
        "/api/identity",
        &small,
        &register_body(&Key::random(), "bob"),
    );
    assert_eq!((r.status, r.code().as_str()), (402, "payment_insufficient"));
    let doc = decoded(&r, "payment-required");
    assert_eq!(doc["accepts"][0]["amount"], "60000000");
    assert!(
        doc["error"].as_str().unwrap().contains("less than"),
        "{doc}"
    );
    // A post's price through the /api/v1 alias.
    let key = s.identity("carol");
    let ts = now_s();
    let r = s.post_json(
        "/api/v1/timeline",
        &json!({"author_fingerprint": key.fp(), "content": "hello", "timestamp": ts,
                "signature": key.sign(&format!("post:hello:{ts}"))}),
    );
    assert_eq!(r.status, 402, "{}", r.text());
    let doc = decoded(&r, "payment-required");
    assert_eq!(doc["accepts"][0]["amount"], "30000000");
    assert_eq!(doc["accepts"][0]["extra"]["price"], "0.3");
    // Its resource is the path the client asked for.
    let url = doc["resource"]["url"].as_str().unwrap();
    assert!(url.ends_with("/api/v1/timeline"), "{url}");
    // Not on other answers.
    assert!(s.get("/api/health").header("payment-required").is_none());
}

#[test]
fn payment_signature_pays_like_x_cash_secret() {
    let s = Server::start();
    let accepted = identity_requirements(&s);
    let secret = s.mint("1");
    let key = Key::random();
    let body = register_body(&key, "alice");
    let header = signature(&accepted, &secret, None);
    let r = s.post_with("/api/identity", &[("PAYMENT-SIGNATURE", &header)], &body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["fingerprint"], key.fp());
    assert_eq!(s.cash_state(&secret), (json!(true), json!("1")));
    // The native change beside the x402 settlement.
    let change = r.header("x-cash-change").unwrap().to_string();
    assert!(change.starts_with("e0.4:secret:"), "{change}");
    assert_eq!(r.json()["payment"]["change"], change.as_str());
    let settle = decoded(&r, "PAYMENT-RESPONSE");
    assert_eq!(
        settle,
        json!({
            "success": true,
            "transaction": public_form(&secret),
            "network": "webcash:mainnet",
            "payer": "",
            "amount": "60000000",
            "extra": {"change": change},
        })
    );
    // A paid answer through X-Cash-Secret carries it too; no change: null.
    let exact = s.mint("0.6");
    let plain = s.post_paid(
        "/api/identity",
        &exact,
        &register_body(&Key::random(), "bob"),
    );
    assert_eq!(plain.status, 201, "{}", plain.text());
    let settle = decoded(&plain, "payment-response");
    assert_eq!(settle["transaction"], public_form(&exact));
    assert_eq!(settle["extra"]["change"], Value::Null);
    // The identical retry replays the answer, PAYMENT-RESPONSE included.
    let again = s.post_with("/api/identity", &[("PAYMENT-SIGNATURE", &header)], &body);
    assert_eq!(again.status, 201, "{}", again.text());
    assert_eq!(again.json(), r.json());
    assert_eq!(
        again.header("payment-response"),
        r.header("payment-response")
    );
    // Any other use of the spent secret: 402 payment_spent, PAYMENT-REQUIRED.
    let other = s.post_with(
        "/api/identity",
        &[("PAYMENT-SIGNATURE", &header)],
        &register_body(&Key::random(), "eve"),
    );
    assert_eq!(
        (other.status, other.code().as_str()),
        (402, "payment_spent")
    );
    assert!(other.header("payment-required").is_some());
    // A secret the ledger does not know, sent as PAYMENT-SIGNATURE.
    let unknown = format!("e1:secret:{}", "ab".repeat(32));
    let r = s.post_with(
        "/api/identity",
        &[("payment-signature", &signature(&accepted, &unknown, None))],
        &register_body(&Key::random(), "dave"),
    );
    assert_eq!((r.status, r.code().as_str()), (402, "payment_invalid"));
}

/// `accepted.amount` is the most the payer agreed to pay: a price above
/// it (risen since the 402) is refused with nothing spent, a price at or
/// below it is charged (the secret's rest is change), as is any price when
/// the amount is left out.
#[test]
fn an_x402_payment_pays_at_most_its_accepted_amount() {
    let s = Server::start();
    let accepted = identity_requirements(&s);
    assert_eq!(accepted["amount"], "60000000");
    let secret = s.mint("1");
    let with_amount = |units: &str| {
        let mut a = accepted.clone();
        a["amount"] = json!(units);
        a
    };
    // Agreed to one unit: refused, nothing spent; the answer says why
    // and carries the 402's requirements at the price.
    let body = register_body(&Key::random(), "cheap");
    let header = signature(&with_amount("1"), &secret, None);
    let r = s.post_with("/api/identity", &[("PAYMENT-SIGNATURE", &header)], &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_insufficient"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("accepted.amount"), "{}", r.text());
    assert_eq!(
        decoded(&r, "payment-required")["accepts"][0]["amount"],
        "60000000"
    );
    assert_eq!(s.cash_state(&secret), (json!(false), json!("1")));
    // Agreed to more than the price: the price is charged.
    let header = signature(&with_amount("70000000"), &secret, None);
    let r = s.post_with("/api/identity", &[("PAYMENT-SIGNATURE", &header)], &body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(decoded(&r, "payment-response")["amount"], "60000000");
    assert!(
        r.header("x-cash-change")
            .unwrap()
            .starts_with("e0.4:secret:")
    );
    // No amount: the price.
    let mut open = accepted.clone();
    open.as_object_mut().unwrap().remove("amount");
    let other = s.mint("0.6");
    let header = signature(&open, &other, None);
    let r = s.post_with(
        "/api/identity",
        &[("PAYMENT-SIGNATURE", &header)],
        &register_body(&Key::random(), "open"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn a_malformed_payment_signature_is_payment_invalid() {
    let s = Server::start();
    let accepted = identity_requirements(&s);
    let secret = s.mint("1");
    let mut wrong_network = accepted.clone();
    wrong_network["network"] = json!("eip155:8453");
    let amount = |a: Value| {
        let mut entry = accepted.clone();
        entry["amount"] = a;
        signature(&entry, &secret, None)
    };
    let cases: Vec<(&str, String)> = vec![
        ("not base64", "%%% not base64 %%%".to_string()),
        ("not JSON", b64(b"not json")),
        ("a JSON array", b64(b"[1,2]")),
        (
            "version 1",
            b64(
                json!({"x402Version": 1, "accepted": accepted, "payload": {"secret": secret}})
                    .to_string()
                    .as_bytes(),
            ),
        ),
        (
            "no accepted",
            b64(json!({"x402Version": 2, "payload": {"secret": secret}})
                .to_string()
                .as_bytes()),
        ),
        ("another network", signature(&wrong_network, &secret, None)),
        ("an amount in exponent form", amount(json!("1e400"))),
        ("an amount as a number", amount(json!(60000000))),
        ("a negative amount", amount(json!("-60000000"))),
        (
            "no secret",
            b64(
                json!({"x402Version": 2, "accepted": accepted, "payload": {}})
                    .to_string()
                    .as_bytes(),
            ),
        ),
        (
            "a public hash",
            signature(&accepted, &public_form(&secret), None),
        ),
        ("a short id", signature(&accepted, &secret, Some("short"))),
    ];
    for (what, header) in &cases {
        let r = s.post_with(
            "/api/identity",
            &[("payment-signature", header)],
            &register_body(&Key::random(), "alice"),
        );
        assert_eq!(r.status, 402, "{what}: {}", r.text());
        assert_eq!(r.code(), "payment_invalid", "{what}: {}", r.text());
        assert_eq!(r.json()["required_amount"], "0.6", "{what}");
        assert!(r.header("payment-required").is_some(), "{what}");
    }
    // A malformed PAYMENT-SIGNATURE refuses even beside a good X-Cash-Secret,
    // and nothing is spent.
    let r = s.post_with(
        "/api/identity",
        &[("x-cash-secret", &secret), ("payment-signature", "!!")],
        &register_body(&Key::random(), "alice"),
    );
    assert_eq!((r.status, r.code().as_str()), (402, "payment_invalid"));
    assert_eq!(s.cash_state(&secret), (json!(false), json!("1")));
    // Two PAYMENT-SIGNATURE lines: which payment is meant is a guess, so
    // neither (nothing spent). Raw, so both lines surely go out.
    let raw = |headers: &[(&str, &str)], body: &Value| {
        use std::io::Write;
        let mut stream = common::connect(s.addr);
        let text = body.to_string();
        let mut head = format!(
            "POST /api/identity HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
            text.len()
        );
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        stream
            .write_all(format!("{head}\r\n{text}").as_bytes())
            .unwrap();
        common::read_response(&mut stream)
    };
    // An empty PAYMENT-SIGNATURE is no payment, as an empty X-Cash-Secret
    // (the document's schema admits it): 402 payment_required, not
    // payment_invalid; beside a good X-Cash-Secret it adds nothing.
    let r = raw(
        &[("payment-signature", "")],
        &register_body(&Key::random(), "alice"),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_required"),
        "{}",
        r.text()
    );
    let other = s.mint("1");
    let r = raw(
        &[("payment-signature", ""), ("x-cash-secret", &other)],
        &register_body(&Key::random(), "dave"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&other).0, json!(true));
    let other = s.mint("1");
    // Beside X-Cash-Secret naming another secret, whichever comes first,
    // which payment is meant is a guess too, so neither (it used to be the
    // cash header's, the other ignored while its client thought it paid).
    for headers in [
        [
            ("payment-signature", signature(&accepted, &secret, None)),
            ("payment-signature", signature(&accepted, &other, None)),
        ],
        [
            ("payment-signature", signature(&accepted, &other, None)),
            ("x-cash-secret", secret.clone()),
        ],
    ] {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let r = raw(&headers, &register_body(&Key::random(), "alice"));
        assert_eq!(
            (r.status, r.code().as_str()),
            (402, "payment_invalid"),
            "{headers:?}: {}",
            r.text()
        );
        assert_eq!(s.cash_state(&secret), (json!(false), json!("1")));
        assert_eq!(s.cash_state(&other), (json!(false), json!("1")));
    }
    // Naming the same secret, both are one payment.
    let r = raw(
        &[
            ("payment-signature", &signature(&accepted, &secret, None)),
            ("x-cash-secret", &secret),
        ],
        &register_body(&Key::random(), "alice"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&secret).0, json!(true));
    // The other secret still pays.
    let r = s.post_with(
        "/api/identity",
        &[("payment-signature", &signature(&accepted, &other, None))],
        &register_body(&Key::random(), "carol"),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn a_payment_identifier_is_an_idempotency_key() {
    let mut s = Server::start();
    let accepted = identity_requirements(&s);
    let id = "pay_01HZX402IDEMPOTENT";
    let key = Key::random();
    let body = register_body(&key, "alice");
    let first_secret = s.mint("1");
    let first = s.post_with(
        "/api/identity",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &first_secret, Some(id)),
        )],
        &body,
    );
    assert_eq!(first.status, 201, "{}", first.text());
    let change = first.header("x-cash-change").unwrap().to_string();

    // Same id and request but another secret: someone who learnt the
    // identifier must not get the first answer (it carries the change).
    // 409, and the other secret is not charged.
    let other_secret = s.mint("1");
    let r = s.post_with(
        "/api/identity",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &other_secret, Some(id)),
        )],
        &body,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (409, "idempotency_conflict"),
        "{}",
        r.text()
    );
    assert!(!r.text().contains("secret:"), "{}", r.text());
    // Its message says what happened: this same request, another payment.
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("this same request paid by another payment")
            && !message.contains("body differ"),
        "{message}"
    );
    assert_eq!(s.cash_state(&other_secret), (json!(false), json!("1")));

    // Same id, same request, same payment: the stored answer.
    let second_secret = first_secret.clone();
    let second = s.post_with(
        "/api/identity",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &second_secret, Some(id)),
        )],
        &body,
    );
    assert_eq!(second.status, 201, "{}", second.text());
    assert_eq!(second.json(), first.json());
    assert_eq!(second.header("x-cash-change"), Some(change.as_str()));
    assert_eq!(
        decoded(&second, "payment-response"),
        decoded(&first, "payment-response")
    );
    assert_eq!(s.cash_state(&second_secret), (json!(true), json!("1")));
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.4")));

    // Same id, another request: 409 idempotency_conflict, nothing charged.
    let third_secret = s.mint("1");
    let other = register_body(&Key::random(), "bob");
    let r = s.post_with(
        "/api/identity",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &third_secret, Some(id)),
        )],
        &other,
    );
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(r.code(), "idempotency_conflict");
    assert!(r.text().contains("body differ"), "{}", r.text());
    assert_eq!(s.cash_state(&third_secret), (json!(false), json!("1")));
    // Another path is another request too.
    let r = s.post_with(
        "/api/profiles/rate",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &third_secret, Some(id)),
        )],
        &json!({}),
    );
    assert_eq!((r.status, r.code().as_str()), (409, "idempotency_conflict"));

    // Another id pays again as usual.
    let r = s.post_with(
        "/api/identity",
        &[(
            "PAYMENT-SIGNATURE",
            &signature(&accepted, &third_secret, Some("pay_01HZX402OTHER000")),
        )],
        &other,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&third_secret), (json!(true), json!("1")));

    // The kept answers hold no live secret: not the change, and not the
    // PAYMENT-RESPONSE that carries it.
    let response = first.header("payment-response").unwrap().to_string();
    s.kill();
    let mut stored = Vec::new();
    for entry in std::fs::read_dir(&s.data_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            stored.extend(std::fs::read(&path).unwrap());
        }
    }
    let hex = &change[change.len() - 64..];
    let find = |needle: &[u8]| stored.windows(needle.len()).any(|w| w == needle);
    assert!(!find(hex.as_bytes()), "the change secret is at rest");
    assert!(
        !find(response.as_bytes()),
        "the PAYMENT-RESPONSE is at rest"
    );
}

// -------------------------------------------------------- webcash wallets

#[test]
fn replace_enforces_legalese_and_accepts_the_empty_replace() {
    let s = Server::start();
    for path in ["/api/v1/replace", "/api/cash/replace"] {
        let empty = s.post_json(
            path,
            &json!({"webcashes": [], "new_webcashes": [], "legalese": {"terms": true}}),
        );
        assert_eq!(empty.status, 200, "{path}: {}", empty.text());
        assert_eq!(empty.json(), json!({"status": "success"}));
        let input = s.mint("1");
        let out = format!("e1:secret:{}", common::hex(&rand32()));
        for legalese in [json!({"terms": false}), json!({}), json!(null)] {
            let r = s.post_json(
                path,
                &json!({"webcashes": [input], "new_webcashes": [out], "legalese": legalese}),
            );
            assert_eq!(r.status, 400, "{path} {legalese}: {}", r.text());
            assert_eq!(r.code(), "invalid_request");
        }
        assert_eq!(s.cash_state(&input), (json!(false), json!("1")));
        let r = s.post_json(
            path,
            &json!({"webcashes": [input], "new_webcashes": [out], "legalese": {"terms": true}}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(s.cash_state(&out), (json!(false), json!("1")));
    }
}

fn rand32() -> [u8; 32] {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).unwrap();
    b
}

#[test]
fn health_check_answers_in_request_order_and_takes_a_thousand() {
    let s = Server::start();
    let known = s.mint("0.5");
    // 1,000 entries, unknown ones around the known one, in an order that
    // is neither sorted nor reverse sorted.
    let mut list: Vec<String> = (0..999)
        .map(|_| format!("e1:public:{}", common::hex(&rand32())))
        .collect();
    list.insert(500, public_form(&known));
    let r = s.post_json("/api/v1/health_check", &json!(list));
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    // The members' order in the text is the request's.
    let mut at = 0;
    for p in &list {
        let i = text[at..]
            .find(&format!("\"{p}\""))
            .unwrap_or_else(|| panic!("{p} missing or out of order"));
        at += i + p.len();
    }
    let v = r.json();
    assert_eq!(v["status"], "success");
    assert_eq!(v["results"].as_object().unwrap().len(), 1000);
    assert_eq!(
        v["results"][public_form(&known)],
        json!({"spent": false, "amount": "0.5"})
    );
    assert_eq!(
        v["results"][&list[0]],
        json!({"spent": null, "amount": null})
    );
    // Same answer on the /api/cash path.
    assert_eq!(
        s.post_json("/api/cash/health_check", &json!(list)).json(),
        v
    );
}

#[test]
fn terms_are_served_as_text() {
    let s = Server::start();
    for path in ["/terms", "/terms/text"] {
        let r = s.get(path);
        assert_eq!(r.status, 200);
        assert!(
            r.header("content-type").unwrap().starts_with("text/plain"),
            "{:?}",
            r.header("content-type")
        );
        assert!(r.text().contains("terms"), "{}", r.text());
    }
    // The operator's own terms.
    let s = Server::with(common::Options {
        config: Some("[settings.cash]\nterms = \"Operator terms: be kind.\"\n".into()),
        ..Default::default()
    });
    assert_eq!(s.get("/terms").text(), "Operator terms: be kind.");
    assert_eq!(s.get("/terms/text").text(), "Operator terms: be kind.");
}

/// `POST /api/identity` of both bodies at once (one thread each, behind a
/// barrier), each paying with the `PAYMENT-SIGNATURE` `header`; the
/// answers in the same order.
fn register_at_once(s: &Server, header: &str, bodies: [&Value; 2]) -> Vec<Resp> {
    let barrier = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = bodies
        .iter()
        .map(|body| {
            let (addr, body, header, barrier) = (
                s.addr,
                body.to_string(),
                header.to_string(),
                barrier.clone(),
            );
            std::thread::spawn(move || {
                barrier.wait();
                common::request(
                    addr,
                    "POST",
                    "/api/identity",
                    &[
                        ("content-type", "application/json"),
                        ("PAYMENT-SIGNATURE", &header),
                    ],
                    Some(body.as_bytes()),
                )
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).collect()
}

#[test]
fn the_same_payment_sent_twice_at_once_gets_one_answer() {
    // A client retrying while its first attempt still runs: the same
    // PAYMENT-SIGNATURE (identifier and secret) and request, at once.
    // Whichever commits, both get its answer; the secret pays once.
    let s = Server::start();
    let accepted = identity_requirements(&s);
    for i in 0..8 {
        let key = Key::random();
        let body = register_body(&key, &format!("twin{i}"));
        let secret = s.mint("1");
        let header = signature(
            &accepted,
            &secret,
            Some(&format!("pay_twin_{i:04}_abcdefgh")),
        );
        let answers = register_at_once(&s, &header, [&body, &body]);
        for r in &answers {
            assert_eq!(r.status, 201, "{}", r.text());
        }
        assert_eq!(answers[0].json(), answers[1].json());
        assert_eq!(
            answers[0].header("x-cash-change"),
            answers[1].header("x-cash-change")
        );
        assert_eq!(s.cash_state(&secret).0, json!(true));
    }
}

#[test]
fn one_identifier_for_two_requests_at_once_is_one_answer_and_one_conflict() {
    // The same payment identifier (and secret) on two different requests
    // sent at once: whichever commits gets its answer, the other the
    // 409 idempotency_conflict (as it would after it), never the change.
    let s = Server::start();
    let accepted = identity_requirements(&s);
    for i in 0..6 {
        let secret = s.mint("1");
        let header = signature(
            &accepted,
            &secret,
            Some(&format!("pay_split_{i:04}_abcdefgh")),
        );
        let bodies = [
            register_body(&Key::random(), &format!("splita{i}")),
            register_body(&Key::random(), &format!("splitb{i}")),
        ];
        let answers = register_at_once(&s, &header, [&bodies[0], &bodies[1]]);
        let mut statuses: Vec<u16> = answers.iter().map(|r| r.status).collect();
        statuses.sort();
        assert_eq!(
            statuses,
            [201, 409],
            "{:?}",
            answers.iter().map(Resp::text).collect::<Vec<_>>()
        );
        let conflict = answers.iter().find(|r| r.status == 409).unwrap();
        assert_eq!(
            conflict.code(),
            "idempotency_conflict",
            "{}",
            conflict.text()
        );
        assert_eq!(conflict.header("x-cash-change"), None);
        assert!(!conflict.text().contains("secret:"), "{}", conflict.text());
    }
}

/// A JSON-RPC `tools/call` of `execute` on `POST /mcp` running `endpoint`,
/// with these extra HTTP headers and `params._meta` (when not null).
fn mcp_execute(s: &Server, endpoint: Value, meta: Value, headers: &[(&str, &str)]) -> Value {
    let mut params = json!({"name": "execute", "arguments": {"endpoint": endpoint}});
    if !meta.is_null() {
        params["_meta"] = meta;
    }
    let mut h = vec![("accept", "application/json, text/event-stream")];
    h.extend_from_slice(headers);
    let r = s.post_with(
        "/mcp",
        &h,
        &json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()
}

#[test]
fn x402_over_mcp_pays_with_the_payload_in_meta() {
    let s = Server::start();
    let key = Key::random();
    let endpoint = json!({"method": "POST", "path": "/api/identity",
                          "body": register_body(&key, "meta_payer")});
    // Unpaid: the endpoint's 402 body, and x402's PaymentRequired beside it
    // in structuredContent, where an x402 MCP client looks for it.
    let r = mcp_execute(&s, endpoint.clone(), Value::Null, &[]);
    let result = &r["result"];
    assert_eq!(result["isError"], true, "{r}");
    let required = &result["structuredContent"];
    assert_eq!(required["code"], "payment_required", "{r}");
    assert_eq!(required["x402Version"], 2, "{r}");
    let accepted = required["accepts"][0].clone();
    assert_eq!(accepted["network"], "webcash:mainnet", "{r}");
    assert_eq!(accepted["amount"], "60000000", "{r}");
    assert!(required["resource"]["url"].is_string(), "{r}");
    // No settlement: only the endpoint's status.
    assert_eq!(result["_meta"], json!({"marketplace/status": 402}), "{r}");

    // Paid with the PaymentPayload in `_meta["x402/payment"]`: created,
    // the settlement (with the change) in the result's `_meta`.
    let secret = s.mint("1");
    let payload = json!({"x402Version": 2, "accepted": accepted,
                         "payload": {"secret": secret}});
    let meta = json!({"x402/payment": payload});
    let r = mcp_execute(&s, endpoint.clone(), meta.clone(), &[]);
    let result = &r["result"];
    assert_eq!(result["isError"], false, "{r}");
    assert_eq!(result["structuredContent"]["fingerprint"], key.fp(), "{r}");
    assert_eq!(result["_meta"]["marketplace/status"], 201, "{r}");
    let settled = &result["_meta"]["x402/payment-response"];
    assert_eq!(settled["success"], true, "{r}");
    assert_eq!(settled["transaction"], public_form(&secret), "{r}");
    assert_eq!(settled["amount"], "60000000", "{r}");
    let change = settled["extra"]["change"]
        .as_str()
        .expect("change")
        .to_string();
    assert!(change.starts_with("e0.4:secret:"), "{r}");
    assert_eq!(
        result["structuredContent"]["payment"]["change"],
        change.as_str()
    );
    assert_eq!(s.cash_state(&secret), (json!(true), json!("1")));
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.4")));
    // The identical call is the identical retry: the same answer, nothing
    // spent again.
    let again = mcp_execute(&s, endpoint.clone(), meta.clone(), &[]);
    assert_eq!(again["result"], r["result"], "{again}");
    // The same payload for another request: the secret is spent.
    let other = json!({"method": "POST", "path": "/api/identity",
                       "body": register_body(&Key::random(), "meta_other")});
    let r = mcp_execute(&s, other.clone(), meta, &[]);
    assert_eq!(r["result"]["isError"], true, "{r}");
    assert_eq!(
        r["result"]["structuredContent"]["code"], "payment_spent",
        "{r}"
    );
    assert_eq!(r["result"]["structuredContent"]["x402Version"], 2, "{r}");

    // Its base64 header form pays too.
    let fresh = s.mint("0.6");
    let header = signature(&accepted, &fresh, None);
    let r = mcp_execute(&s, other.clone(), json!({"x402/payment": header}), &[]);
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(s.cash_state(&fresh), (json!(true), json!("0.6")));
    assert_eq!(
        r["result"]["_meta"]["x402/payment-response"]["extra"]["change"],
        Value::Null
    );

    // A payment in `_meta` and another secret in the HTTP header: refused
    // as malformed, neither spent.
    let (a, b) = (s.mint("0.6"), s.mint("0.6"));
    let third = json!({"method": "POST", "path": "/api/identity",
                       "body": register_body(&Key::random(), "meta_two")});
    let r = mcp_execute(
        &s,
        third,
        json!({"x402/payment": {"x402Version": 2, "accepted": accepted, "payload": {"secret": a}}}),
        &[("x-cash-secret", &b)],
    );
    assert_eq!(
        r["result"]["structuredContent"]["code"], "payment_invalid",
        "{r}"
    );
    assert_eq!(s.cash_state(&a), (json!(false), json!("0.6")));
    assert_eq!(s.cash_state(&b), (json!(false), json!("0.6")));
    // A malformed payment in `_meta` alone: its refusal names where an MCP
    // client put it, not only the HTTP header.
    let versioned = json!({"x402Version": 1, "accepted": accepted, "payload": {"secret": a}});
    let r = mcp_execute(&s, other.clone(), json!({"x402/payment": versioned}), &[]);
    let refusal = &r["result"]["structuredContent"];
    assert_eq!(refusal["code"], "payment_invalid", "{r}");
    let message = refusal["message"].as_str().unwrap();
    assert!(
        message.contains("_meta[\"x402/payment\"]") && message.contains("x402Version 2"),
        "{message}"
    );
    assert_eq!(s.cash_state(&a), (json!(false), json!("0.6")));
    // A payment that is neither a payload nor its header: invalid params.
    let r = mcp_execute(&s, other, json!({"x402/payment": 5}), &[]);
    assert_eq!(r["error"]["code"], -32602, "{r}");

    // The same payment both as the HTTP header and in `_meta` (clients
    // that send it both ways): one payment.
    let both = s.mint("0.6");
    let payload = json!({"x402Version": 2, "accepted": accepted, "payload": {"secret": both}});
    let fourth = json!({"method": "POST", "path": "/api/identity",
                        "body": register_body(&Key::random(), "meta_both")});
    let r = mcp_execute(
        &s,
        fourth,
        json!({"x402/payment": payload}),
        &[("payment-signature", &signature(&accepted, &both, None))],
    );
    assert_eq!(r["result"]["isError"], false, "{r}");
    assert_eq!(s.cash_state(&both), (json!(true), json!("0.6")));
}

#[test]
fn an_unpaid_mcp_result_says_it_in_text_too_and_meta_pays_one_batch_member() {
    let s = Server::start();
    let endpoint = |nick: &str| {
        json!({"method": "POST", "path": "/api/identity",
               "body": register_body(&Key::random(), nick)})
    };
    // The unpaid result's first text part is its structuredContent as
    // JSON, x402's PaymentRequired included (clients without
    // structuredContent read it there).
    let r = mcp_execute(&s, endpoint("text_reader"), Value::Null, &[]);
    let result = &r["result"];
    let text: Value = serde_json::from_str(result["content"][0]["text"].as_str().unwrap()).unwrap();
    assert_eq!(text, result["structuredContent"], "{r}");
    assert_eq!(text["x402Version"], 2, "{r}");
    let accepted = text["accepts"][0].clone();

    // A batch (MCP 2025-03-26): a member's `_meta` payment pays for that
    // member only; the next member, unpaid, gets its 402.
    let secret = s.mint("1");
    let call = |id: u64, endpoint: Value, meta: Option<Value>| {
        let mut params = json!({"name": "execute", "arguments": {"endpoint": endpoint}});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    let batch = json!([
        call(
            1,
            endpoint("batch_paid"),
            Some(json!({"x402/payment":
            {"x402Version": 2, "accepted": accepted, "payload": {"secret": secret}}}))
        ),
        call(2, endpoint("batch_unpaid"), None),
    ]);
    let r = s.post_with(
        "/mcp",
        &[
            ("accept", "application/json, text/event-stream"),
            ("mcp-protocol-version", "2025-03-26"),
        ],
        &batch,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let answers = r.json();
    assert_eq!(answers[0]["result"]["isError"], false, "{answers}");
    assert_eq!(answers[1]["result"]["isError"], true, "{answers}");
    assert_eq!(
        answers[1]["result"]["structuredContent"]["code"], "payment_required",
        "{answers}"
    );
    assert_eq!(s.cash_state(&secret), (json!(true), json!("1")));
}

/// A component may add to a request it dispatches only an x402
/// `PAYMENT-SIGNATURE` (a client's payment sent in a body, as MCP's
/// `_meta` carries it): any other payment header it adds is dropped
/// unread, so it cannot spend a secret it came across.
#[test]
fn a_dispatched_request_pays_only_with_an_x402_signature() {
    let s = Server::with(common::Options {
        testing_routes: true,
        ..Default::default()
    });
    let key = Key::random();
    let register = |nick: &str, key: &Key| register_body(key, nick);
    let dispatch = |headers: Value, body: Value| {
        let r = s.post_json(
            "/api/testing/dispatch",
            &json!({"path": "/api/identity", "headers": headers, "body": body}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()
    };
    let secret = s.mint("1");
    for header in ["x-cash-secret", "x-webcash-secret", "X-Cash-Secret"] {
        let r = dispatch(json!([[header, secret]]), register("dispatched", &key));
        assert_eq!(r["status"], 402, "{header}: {r}");
        assert_eq!(r["body"]["code"], "payment_required", "{header}: {r}");
    }
    assert_eq!(s.cash_state(&secret), (json!(false), json!("1")));
    // The 402's own x402 entry, paid as PAYMENT-SIGNATURE: it pays.
    let required = dispatch(json!([]), register("dispatched", &key));
    assert_eq!(required["status"], 402, "{required}");
    let accepted = json!({"scheme": "exact", "network": "webcash:mainnet", "asset": "webcash",
                          "amount": "60000000", "payTo": "marketplace", "maxTimeoutSeconds": 300});
    let signature = b64(
        json!({"x402Version": 2, "accepted": accepted, "payload": {"secret": secret}})
            .to_string()
            .as_bytes(),
    );
    let r = dispatch(
        json!([["PAYMENT-SIGNATURE", signature]]),
        register("dispatched", &key),
    );
    assert_eq!(r["status"], 201, "{r}");
    assert_eq!(s.cash_state(&secret), (json!(true), json!("1")));
}

/// Behind a reverse proxy the request's `Host` is not what clients use
/// (nginx's `$host` drops the port; TLS ends at the proxy): with
/// `public_url` set, every absolute URL an answer carries is made from it:
/// x402's resource, the upload URLs, the A2A card and the MCP resources.
/// Before, only the `mcp` family's own setting existed, and the x402
/// resource and the upload URLs still came from `Host`.
#[test]
fn public_url_makes_every_absolute_url_of_an_answer() {
    let public = "https://market.example:8443";
    let s = Server::with(common::Options {
        env: vec![("MARKETPLACE_PUBLIC_URL".into(), format!("{public}/"))],
        ..Default::default()
    });
    let r = s.post_json("/api/identity", &register_body(&Key::random(), "behind"));
    assert_eq!(r.status, 402, "{}", r.text());
    assert_eq!(
        decoded(&r, "payment-required")["resource"]["url"],
        format!("{public}/api/identity")
    );
    let key = s.identity("uploader");
    let p = s.presign(&key, "avatars/a.png", "image/png");
    for url in ["presigned_url", "public_url"] {
        let url = p[url].as_str().unwrap();
        assert!(url.starts_with(&format!("{public}/api/storage/")), "{p}");
    }
    let card = s.get("/.well-known/agent-card.json").json();
    assert_eq!(
        card["supportedInterfaces"][0]["url"],
        format!("{public}/a2a"),
        "{card}"
    );
}

/// Once `trusted_proxies` names the proxies, only they say which scheme
/// clients used (`X-Forwarded-Proto`, read for absolute URLs); a request
/// from anywhere else is answered with its own `Host`'s `http://` URLs.
#[test]
fn only_a_trusted_proxy_says_the_scheme_clients_used() {
    let resource = |trusted: &str| {
        let s = Server::with(common::Options {
            env: vec![("MARKETPLACE_TRUSTED_PROXIES".into(), trusted.into())],
            ..Default::default()
        });
        let body = register_body(&Key::random(), "scheme").to_string();
        let r = s.request(
            "POST",
            "/api/identity",
            &[
                ("content-type", "application/json"),
                ("x-forwarded-proto", "https"),
            ],
            Some(body.as_bytes()),
        );
        assert_eq!(r.status, 402, "{}", r.text());
        decoded(&r, "payment-required")["resource"]["url"]
            .as_str()
            .unwrap()
            .to_string()
    };
    // The test client connects from 127.0.0.1.
    assert!(resource("127.0.0.1").starts_with("https://"));
    assert!(resource("10.0.0.1").starts_with("http://"));
}
