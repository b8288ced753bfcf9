//! Black-box tests of payments, the cash ledger, fees, identities,
//! signatures and profiles (PROTOCOL sections 2, 3, 4, 6).

mod common;

use common::{Key, Server, now_s};
use serde_json::{Value, json};

#[test]
fn identity_is_402_without_payment_then_201_with_change() {
    let s = Server::start();
    let key = Key::random();
    let ts = now_s();
    let body = json!({
        "nickname": "alice",
        "pgp_public_key": key.fp(),
        "signature": key.sign(&format!("register:alice:{ts}")),
        "timestamp": ts,
    });
    let r = s.post_json("/api/identity", &body);
    assert_eq!(r.status, 402, "{}", r.text());
    let b = r.json();
    assert_eq!(b["code"], "payment_required");
    assert!(b["message"].is_string());
    assert_eq!(b["required_amount"], "0.6");
    let p = &b["payment"];
    assert_eq!(p["action"], "identity");
    assert_eq!(p["price"], "0.6");
    assert_eq!(p["currency"], "webcash");
    assert_eq!(p["header"], "X-Cash-Secret");
    assert_eq!(p["format"], "e<amount>:secret:<hex>");
    assert_eq!(p["fee_schedule_url"], "/api/fees");
    assert!(
        p["supported_headers"]
            .as_array()
            .unwrap()
            .contains(&json!("X-Cash-Secret"))
    );
    assert_eq!(p["allowed_rails"], json!(["webcash"]));
    // The original client's first try of a paid call sends an empty
    // payment header to learn the price: that is no payment, not a bad one.
    let bytes = body.to_string();
    for header in ["X-Webcash-Secret", "X-Cash-Secret"] {
        let r = s.request(
            "POST",
            "/api/identity",
            &[(header, ""), ("content-type", "application/json")],
            Some(bytes.as_bytes()),
        );
        assert_eq!(r.status, 402, "{}", r.text());
        assert_eq!(
            r.json()["code"],
            "payment_required",
            "{header}: {}",
            r.text()
        );
        assert_eq!(r.json()["required_amount"], "0.6");
    }

    let secret = s.mint("1");
    let r = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(r.status, 201, "{}", r.text());
    let b = r.json();
    assert_eq!(b["fingerprint"], key.fp());
    assert_eq!(b["profile"]["fingerprint"], key.fp());
    assert_eq!(b["profile"]["nickname"], "alice");
    assert_eq!(b["profile"]["pub_key"], key.fp());
    assert_eq!(
        b["profile"]["rating"],
        json!({"up": 0, "down": 0, "score": 0})
    );
    // 1 - 0.6 = 0.4 in change, in the header and the body.
    let change = r
        .header("x-cash-change")
        .expect("change header")
        .to_string();
    assert_eq!(b["payment"]["change"], change.as_str());
    assert!(change.starts_with("e0.4:secret:"), "{change}");
    assert_eq!(s.cash_state(&secret), (json!(true), json!("1")));
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.4")));
    // The change is itself spendable.
    let next = format!("e0.4:secret:{}", "c".repeat(64));
    let r = s.post_json(
        "/api/cash/replace",
        &json!({"webcashes": [change], "new_webcashes": [next]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"status": "success"}));
    assert_eq!(s.cash_state(&next), (json!(false), json!("0.4")));

    // The profile reads back by fingerprint and by nickname.
    let p = s.get(&format!("/api/profile?fingerprint={}", key.fp()));
    assert_eq!(p.status, 200);
    assert_eq!(p.json()["profile"]["nickname"], "alice");
    let p = s.get("/api/profile?nickname=ALICE");
    assert_eq!(p.json()["profile"]["fingerprint"], key.fp());
    assert_eq!(s.get("/api/profile?nickname=nobody").code(), "not_found");
    assert_eq!(s.get("/api/profile").status, 400);
    // Both: they must name the same identity.
    let both = |nick: &str| {
        s.get(&format!(
            "/api/profile?fingerprint={}&nickname={nick}",
            key.fp()
        ))
    };
    assert_eq!(both("Alice").json()["profile"]["nickname"], "alice");
    assert_eq!(both("someone_else").code(), "not_found");
}

#[test]
fn bad_or_missing_signature_is_401_and_spends_nothing() {
    let s = Server::start();
    let secret = s.mint("0.6");
    let key = Key::random();
    let other = Key::random();
    let ts = now_s();
    // Signed by the wrong key.
    let r = s.post_paid(
        "/api/identity",
        &secret,
        &json!({"nickname": "bob", "pgp_public_key": key.fp(), "timestamp": ts,
                "signature": other.sign(&format!("register:bob:{ts}"))}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_invalid"),
        "{}",
        r.text()
    );
    // No signature at all.
    let r = s.post_paid(
        "/api/identity",
        &secret,
        &json!({"nickname": "bob", "pgp_public_key": key.fp()}),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "auth_required"));
    // Malformed signature.
    let r = s.post_paid(
        "/api/identity",
        &secret,
        &json!({"nickname": "bob", "pgp_public_key": key.fp(), "signature": "zz"}),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "auth_invalid"));
    assert_eq!(s.cash_state(&secret), (json!(false), json!("0.6")));
    // The same secret still pays for a valid request.
    assert_eq!(s.register(&key, "bob", &secret).status, 201);
    assert_eq!(s.cash_state(&secret).0, json!(true));
}

#[test]
fn signer_members_of_the_wrong_type_are_the_bodys_400_before_402_or_401() {
    // PROTOCOL 1's order: 400 (body), then 402, then 401. A fingerprint or
    // signature that is not a string is a malformed body, not a missing
    // signature.
    let s = Server::start();
    let fp = Key::random().fp();
    let cases = [
        (
            "/api/timeline",
            json!({"author_fingerprint": 12, "content": "hi", "signature": "00"}),
            "author_fingerprint",
        ),
        (
            "/api/timeline",
            json!({"author_fingerprint": fp, "content": "hi", "signature": 7}),
            "signature",
        ),
        (
            "/api/profiles/rate",
            json!({"post_id": "post_x", "actor_fingerprint": 12, "vote": "up", "signature": "00"}),
            "actor_fingerprint",
        ),
        (
            "/api/arbitration/contracts/CTR_x/accept",
            json!({"seller_fingerprint": 5, "signature": "00"}),
            "seller_fingerprint",
        ),
        (
            "/api/arbitration/contracts/buy",
            json!({"buyer_fingerprint": 5, "contract_type": "service", "amount": "1",
                   "reference_post": "post_x", "accept_terms": true, "signature": "00"}),
            "buyer_fingerprint",
        ),
        (
            "/api/arbitration/contracts/CTR_x/deliver",
            json!({"actor_fingerprint": 5, "delivered_text": "x", "signature": "00"}),
            "actor_fingerprint",
        ),
        (
            "/api/identity",
            json!({"nickname": "n", "pgp_public_key": 5, "signature": "00"}),
            "pgp_public_key",
        ),
        (
            "/api/storage/presign",
            json!({"fingerprint": 5, "file_path": "a.png", "content_type": "image/png", "signature": "00"}),
            "fingerprint",
        ),
        (
            "/api/posts/update",
            json!({"post_id": "post_x", "author_fingerprint": 5, "signature": "00"}),
            "author_fingerprint",
        ),
        (
            "/api/mcp/tools/define",
            json!({"name": "signed_by_five", "description": "d", "kind": "search",
                   "typescript": "return {term: 'x'}", "input_schema": {"type": "object", "properties": {}},
                   "owner_fingerprint": 5, "signature": "00"}),
            "owner_fingerprint",
        ),
    ];
    // The contract actions, the identity routes and a post's delete, signed
    // by `actor_fingerprint`, `fingerprint` and `author_fingerprint`.
    let mut cases: Vec<(String, Value, &str)> = cases
        .into_iter()
        .map(|(path, body, field)| (path.to_string(), body, field))
        .collect();
    for action in ["pickup", "refund", "release"] {
        cases.push((
            format!("/api/arbitration/contracts/CTR_x/{action}"),
            json!({"actor_fingerprint": 5, "signature": "00"}),
            "actor_fingerprint",
        ));
    }
    for path in ["/api/identity/delete", "/api/profile/update"] {
        cases.push((
            path.to_string(),
            json!({"fingerprint": 5, "signature": "00"}),
            "fingerprint",
        ));
    }
    cases.push((
        "/api/posts/delete".to_string(),
        json!({"post_id": "post_x", "author_fingerprint": 5, "signature": "00"}),
        "author_fingerprint",
    ));
    for (path, body, field) in cases {
        let r = s.post_json(&path, &body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{path} {body}: {}",
            r.text()
        );
        let details = r.json()["details"].clone();
        assert!(
            details
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["field"] == field),
            "{path}: {details}"
        );
    }
    // Another route's signer member is an unknown member here, ignored
    // (PROTOCOL 1), whatever its type: the request goes on to its 402 or
    // 401.
    let r = s.post_json(
        "/api/timeline",
        &json!({"author_fingerprint": fp, "content": "hi", "signature": "00",
                "seller_fingerprint": [[]], "actor_fingerprint": 5, "owner_fingerprint": {}}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_required"),
        "{}",
        r.text()
    );
    let r = s.post_json(
        "/api/arbitration/contracts/CTR_x/accept",
        &json!({"seller_fingerprint": fp, "signature": "00", "actor_fingerprint": 5, "buyer_fingerprint": [1]}),
    );
    assert_eq!(r.status, 401, "{}", r.text());
    // A timestamp far from the clock (milliseconds, say) is no body error:
    // the request goes on to ask for payment, and paid, it is 401
    // `auth_expired` (tests/contracts.rs pays one).
    let r = s.post_json(
        "/api/timeline",
        &json!({"author_fingerprint": fp, "content": "hi", "signature": "00", "timestamp": now_s() * 1000}),
    );
    assert_eq!(r.status, 402, "{}", r.text());
}

#[test]
fn legacy_signatures_are_accepted() {
    let s = Server::start();
    let key = Key::random();
    let r = s.post_paid(
        "/api/identity",
        &s.mint("0.6"),
        &json!({"nickname": "legacy", "pgp_public_key": key.fp(), "signature": key.sign("register:legacy")}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn expired_fresh_signature_is_401_and_reuse_is_409() {
    let s = Server::start();
    let key = Key::random();
    let old = now_s() - 1000;
    let r = s.post_paid(
        "/api/identity",
        &s.mint("0.6"),
        &json!({"nickname": "carol", "pgp_public_key": key.fp(), "timestamp": old,
                "signature": key.sign(&format!("register:carol:{old}"))}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_expired"),
        "{}",
        r.text()
    );

    let ts = now_s();
    let body = json!({"nickname": "carol", "pgp_public_key": key.fp(), "timestamp": ts,
                      "signature": key.sign(&format!("register:carol:{ts}"))});
    assert_eq!(
        s.post_paid("/api/identity", &s.mint("0.6"), &body).status,
        201
    );
    let again = s.mint("0.6");
    let r = s.post_paid("/api/identity", &again, &body);
    assert_eq!((r.status, r.code().as_str()), (409, "conflict"));
    // It says how to make a new one (the same message at the same second
    // signs the same bytes).
    let message = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        message.contains("already used") && message.contains("later timestamp"),
        "{}",
        r.text()
    );
    assert_eq!(
        s.cash_state(&again).0,
        json!(false),
        "a refused request spends nothing"
    );
}

#[test]
fn taken_key_or_nickname_is_409_and_bad_bodies_are_400() {
    let s = Server::start();
    let (a, b) = (Key::random(), Key::random());
    assert_eq!(s.register(&a, "dave", &s.mint("0.6")).status, 201);
    let r = s.register(&b, "Dave", &s.mint("0.6"));
    assert_eq!((r.status, r.code().as_str()), (409, "conflict"));
    let r = s.register(&a, "dave2", &s.mint("0.6"));
    assert_eq!((r.status, r.code().as_str()), (409, "conflict"));

    let r = s.post_json(
        "/api/identity",
        &json!({"nickname": "x", "pgp_public_key": "-----BEGIN PGP PUBLIC KEY BLOCK-----"}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["details"][0]["field"], "pgp_public_key");
    // A key is 64 hex characters as sent: spaces or a line end around it
    // are not taken away (the document's pattern refuses them too).
    let c = Key::random();
    for padded in [format!(" {}", c.fp()), format!("{}\n", c.fp())] {
        let r = s.post_json(
            "/api/identity",
            &json!({"nickname": "padded", "pgp_public_key": padded,
                    "signature": c.sign("register:padded")}),
        );
        assert_eq!(
            (r.status, r.json()["details"][0]["field"].as_str()),
            (400, Some("pgp_public_key")),
            "{}",
            r.text()
        );
    }
    // Nicknames are ASCII (the schema's pattern): a letter outside it is
    // refused, and the rule says which letters.
    for bad in ["bad nick!", "José"] {
        let r = s.post_json(
            "/api/identity",
            &json!({"nickname": bad, "pgp_public_key": a.fp()}),
        );
        let detail = &r.json()["details"][0];
        assert_eq!(
            (r.status, detail["field"].as_str()),
            (400, Some("nickname")),
            "{bad}: {}",
            r.text()
        );
        let rule = detail["problem"].as_str();
        assert!(
            rule.is_some_and(|m| m.contains("ASCII letters")),
            "{bad}: {}",
            r.text()
        );
    }
    let r = s.request("POST", "/api/identity", &[], Some(b"not json"));
    assert_eq!((r.status, r.code().as_str()), (400, "invalid_request"));
    let r = s.post_json("/api/identity", &json!([1, 2]));
    assert_eq!(r.status, 400);
}

#[test]
fn payment_header_refusals() {
    let s = Server::start();
    let key = Key::random();
    let body = json!({"nickname": "erin", "pgp_public_key": key.fp(), "signature": key.sign("register:erin")});
    let r = s.post_paid("/api/identity", "e1:secret:nothex", &body);
    assert_eq!((r.status, r.code().as_str()), (402, "payment_invalid"));
    let unknown = format!("e1:secret:{}", "a".repeat(64));
    let r = s.post_paid("/api/identity", &unknown, &body);
    assert_eq!((r.status, r.code().as_str()), (402, "payment_invalid"));
    // A secret with bytes outside ASCII (sent raw: HTTP clients refuse to)
    // is a malformed payment, not a missing one; so is a good secret with
    // a no-break space (UTF-8 C2 A0) after it, which is not spent.
    let good = s.mint("1");
    let not_ascii = [
        format!("e1:secret:{}", "é".repeat(32)).into_bytes(),
        [good.as_bytes(), "\u{a0}".as_bytes()].concat(),
    ];
    for (header, value) in ["x-cash-secret", "x-webcash-secret"]
        .into_iter()
        .flat_map(|h| not_ascii.iter().map(move |v| (h, v)))
    {
        let r = s.raw_post("/api/identity", &[("host", b"x"), (header, value)], &body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (402, "payment_invalid"),
            "{header}: {}",
            r.text()
        );
    }
    // Two lines of one payment header are one comma-separated value: a
    // malformed payment naming several secrets, and neither is spent.
    let several = |payment: &[(&str, &[u8])]| {
        let lines: Vec<(&str, &[u8])> = [("host", &b"x"[..])]
            .into_iter()
            .chain(payment.iter().copied())
            .collect();
        let r = s.raw_post("/api/identity", &lines, &body);
        assert_eq!(
            (r.status, r.code().as_str()),
            (402, "payment_invalid"),
            "{}",
            r.text()
        );
        let message = r.json()["message"].as_str().unwrap().to_string();
        assert!(
            message.contains("several different payment secrets"),
            "{message}"
        );
    };
    let (first, second) = (s.mint("1"), s.mint("1"));
    for header in ["x-cash-secret", "x-webcash-secret"] {
        several(&[(header, first.as_bytes()), (header, second.as_bytes())]);
    }
    // So are two different secrets in X-Cash-Secret and its alias.
    several(&[
        ("x-cash-secret", first.as_bytes()),
        ("x-webcash-secret", second.as_bytes()),
    ]);
    // And one line listing thousands of items, a real secret first (read
    // only up to the second item).
    let many: Vec<String> = std::iter::once(first.clone())
        .chain((0..6_000).map(|i| i.to_string()))
        .collect();
    several(&[("x-cash-secret", many.join(",").as_bytes())]);
    for secret in [&first, &second] {
        assert_eq!(s.cash_state(secret).0, json!(false), "{secret}");
    }
    // The same secret in two lines and in the alias is one payment.
    let k4 = Key::random();
    let hugo = json!({"nickname": "hugo", "pgp_public_key": k4.fp(), "signature": k4.sign("register:hugo")});
    let lines = [
        ("host", &b"x"[..]),
        ("x-cash-secret", first.as_bytes()),
        ("x-cash-secret", first.as_bytes()),
        ("x-webcash-secret", first.as_bytes()),
    ];
    let r = s.raw_post("/api/identity", &lines, &hugo);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&first).0, json!(true));
    // One line is as two (RFC 9110 5.3): `S, S` is one payment, `S1, S2`
    // two different secrets, neither spent.
    let (third, fourth) = (s.mint("1"), s.mint("1"));
    let k5 = Key::random();
    let ida =
        json!({"nickname": "ida", "pgp_public_key": k5.fp(), "signature": k5.sign("register:ida")});
    let two = format!("{third}, {fourth}");
    let r = s.raw_post(
        "/api/identity",
        &[("host", b"x"), ("x-cash-secret", two.as_bytes())],
        &ida,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_invalid"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&third).0, json!(false));
    let same = format!("{third},{third}");
    let r = s.raw_post(
        "/api/identity",
        &[("host", b"x"), ("x-cash-secret", same.as_bytes())],
        &ida,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(s.cash_state(&third).0, json!(true));
    let k3 = Key::random();
    let gwen = json!({"nickname": "gwen", "pgp_public_key": k3.fp(), "signature": k3.sign("register:gwen")});
    assert_eq!(s.post_paid("/api/identity", &good, &gwen).status, 201);
    let small = s.mint("0.5");
    let r = s.post_paid("/api/identity", &small, &body);
    assert_eq!((r.status, r.code().as_str()), (402, "payment_insufficient"));
    assert_eq!(r.json()["required_amount"], "0.6");
    let r = s.post_with("/api/identity", &[("x-bitcoin-secret", "anything")], &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_rail_unavailable")
    );
    // The webcash alias header pays too.
    let secret = s.mint("0.6");
    let r = s.post_with("/api/identity", &[("x-webcash-secret", &secret)], &body);
    assert_eq!(r.status, 201, "{}", r.text());
    // Reusing a spent secret for another request.
    let k2 = Key::random();
    let r = s.post_paid(
        "/api/identity",
        &secret,
        &json!({"nickname": "frank", "pgp_public_key": k2.fp(), "signature": k2.sign("register:frank")}),
    );
    assert_eq!((r.status, r.code().as_str()), (402, "payment_spent"));
}

#[test]
fn identical_retry_replays_the_stored_response() {
    let s = Server::start();
    let key = Key::random();
    let secret = s.mint("1");
    let body = json!({"nickname": "gina", "pgp_public_key": key.fp(), "signature": key.sign("register:gina")});
    let first = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(first.status, 201);
    let second = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(second.status, 201, "{}", second.text());
    assert_eq!(second.body, first.body);
    assert_eq!(
        second.header("x-cash-change"),
        first.header("x-cash-change")
    );
    // Charged once: the one change output holds 0.4, unspent.
    let change = first.header("x-cash-change").unwrap();
    assert_eq!(s.cash_state(change), (json!(false), json!("0.4")));
    // A different request with the same (spent) secret is refused.
    let mut other = body.clone();
    other["about"] = json!("changed");
    let r = s.post_paid("/api/identity", &secret, &other);
    assert_eq!((r.status, r.code().as_str()), (402, "payment_spent"));
}

/// An identical retry gets the kept answer up to `replay_retention_s`, and
/// `402 payment_spent` past it, though retention has not swept it yet (it
/// sweeps every 10 minutes; the answer used to be replayed until then).
#[test]
fn past_the_retry_horizon_an_identical_retry_is_payment_spent() {
    let s = Server::with(common::Options {
        testing_routes: true,
        env: vec![("MARKETPLACE_REPLAY_RETENTION_S".into(), "60".into())],
        ..Default::default()
    });
    let key = Key::random();
    let secret = s.mint("1");
    let body = json!({"nickname": "horizon", "pgp_public_key": key.fp(),
                      "signature": key.sign("register:horizon")});
    let first = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(first.status, 201, "{}", first.text());
    let shift = |ms: i64| {
        let r = s.admin_request("POST", "/admin/clock", &json!({"shift_ms": ms}));
        assert_eq!(r.status, 200, "{}", r.text());
    };
    // Inside the horizon: the kept answer.
    shift(50_000);
    let r = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.body, first.body);
    // Past it: the secret is spent, and the answer is no longer given.
    shift(20_000);
    let r = s.post_paid("/api/identity", &secret, &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_spent"),
        "{}",
        r.text()
    );
}

#[test]
fn failures_after_charging_spend_and_write_nothing() {
    let s = Server::testing();
    for fail in ["status", "trap"] {
        let secret = s.mint("0.3");
        let r = s.request(
            "POST",
            &format!("/_testing/paid?fail={fail}"),
            &[("x-cash-secret", &secret)],
            Some(b"{}"),
        );
        assert!(matches!(r.status, 409 | 500), "{fail}: {}", r.text());
        assert_eq!(
            s.cash_state(&secret),
            (json!(false), json!("0.3")),
            "{fail}"
        );
        assert!(s.get("/_testing/read?key=paid").json()["value"].is_null());
    }
    let secret = s.mint("0.3");
    let r = s.request(
        "POST",
        "/_testing/paid",
        &[("x-cash-secret", &secret)],
        Some(b"{}"),
    );
    assert_eq!(r.status, 201);
    assert_eq!(s.cash_state(&secret).0, json!(true));
    assert_eq!(s.get("/_testing/read?key=paid").json()["value"], "yes");
}

#[test]
fn a_component_never_holds_a_spendable_change() {
    // The component gets a stand-in for the change in its receipt; the
    // host puts the real one where the component put the stand-in in its
    // answer. What the component keeps, or hides in its answer, spends
    // nothing.
    let s = Server::testing();
    let secret = s.mint("1");
    let r = s.post_paid("/_testing/paid?keep=1", &secret, &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let body = r.json();
    let change = body["payment"]["change"].as_str().unwrap().to_string();
    assert!(change.starts_with("e0.7:secret:"), "{body}");
    assert_eq!(r.header("x-cash-change"), Some(change.as_str()));
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.7")));
    let seen: String = body["reversed_change"]
        .as_str()
        .unwrap()
        .chars()
        .rev()
        .collect();
    let kept = s.get("/_testing/read?key=kept_change").json()["value"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(seen, kept, "what it answered is what it kept");
    assert!(
        seen.starts_with("e0.7:secret:"),
        "the amount is kept: {seen}"
    );
    assert_ne!(seen, change);
    let replace = |input: &str, output: &str| {
        s.post_json(
            "/api/cash/replace",
            &json!({"webcashes": [input], "new_webcashes": [format!("e0.7:secret:{output}")],
                    "legalese": {"terms": true}}),
        )
    };
    // Unknown to the ledger: no spend, no money.
    assert_eq!(s.cash_state(&seen).0, json!(null), "{seen}");
    let r = replace(&seen, &"ab".repeat(32));
    assert_eq!(r.status, 400, "{}", r.text());
    // The real change spends once.
    let r = replace(&change, &"cd".repeat(32));
    assert_eq!(r.status, 200, "{}", r.text());
}

/// The host puts the change only where a JSON answer holds the stand-in as
/// a whole string: a component that puts it in a page's image link, or in
/// a longer text a client might follow, gets no spendable change sent
/// there (the client still has it in `X-Cash-Change`).
#[test]
fn the_change_goes_nowhere_but_a_json_answers_own_string() {
    let s = Server::testing();
    let secret = s.mint("1");
    let r = s.post_paid("/_testing/paid?keep=page", &secret, &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let change = r.header("x-cash-change").unwrap().to_string();
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.7")));
    let page = r.text();
    assert!(!page.contains(&change), "{page}");
    assert!(page.contains("evil.example/i?c=e0.7:secret:"), "{page}");

    let secret = s.mint("1");
    let r = s.post_paid("/_testing/paid?keep=link", &secret, &json!({}));
    assert_eq!(r.status, 201, "{}", r.text());
    let body = r.json();
    let change = body["payment"]["change"].as_str().unwrap();
    assert_eq!(r.header("x-cash-change"), Some(change));
    assert_eq!(s.cash_state(change), (json!(false), json!("0.7")));
    let link = body["link"].as_str().unwrap();
    assert!(link.starts_with("/api/elsewhere?c=e0.7:secret:"), "{link}");
    assert!(!link.contains(change), "{link}");
}

#[test]
fn cash_replace_refuses_every_invalid_form_and_changes_nothing() {
    let s = Server::start();
    let input = s.mint("1");
    let out = |amount: &str, c: char| format!("e{amount}:secret:{}", c.to_string().repeat(64));
    let existing = s.mint("0.5");
    // Each with the field its 400 names: the inputs' list, or the outputs'
    // (their total included).
    let cases = [
        (
            "webcashes",
            json!({"webcashes": [input, input], "new_webcashes": [out("2", 'a')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [out("0.5", 'a'), out("0.5", 'a')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [existing.clone()]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [out("0", 'a'), out("1", 'b')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [out("0.999999999", 'a')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [out("0.9", 'a')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [out("1.1", 'a')]}),
        ),
        // (An empty replace, no inputs and no outputs, is 200 success as on
        // the public webcash server: tests/x402.rs.)
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": []}),
        ),
        (
            "webcashes",
            json!({"webcashes": [], "new_webcashes": [out("1", 'a')]}),
        ),
        (
            "new_webcashes",
            json!({"webcashes": [input], "new_webcashes": [input]}),
        ),
        (
            "webcashes",
            json!({"webcashes": "x", "new_webcashes": [out("1", 'a')]}),
        ),
        (
            "webcashes",
            json!({"webcashes": [out("1", 'd')], "new_webcashes": [out("1", 'a')]}),
        ),
    ];
    for (field, case) in &cases {
        let r = s.post_json("/api/cash/replace", case);
        assert_eq!(r.status, 400, "{case}: {}", r.text());
        assert_eq!(r.code(), "invalid_request");
        assert_eq!(
            r.json()["details"][0]["field"],
            *field,
            "{case}: {}",
            r.text()
        );
        assert_eq!(s.cash_state(&input), (json!(false), json!("1")), "{case}");
        assert_eq!(s.cash_state(&existing), (json!(false), json!("0.5")));
        assert_eq!(s.cash_state(&out("0.5", 'a')), (json!(null), json!(null)));
    }
    let r = s.post_json(
        "/api/cash/replace",
        &json!({"webcashes": [input], "new_webcashes": [out("0.25", 'a'), out("0.75", 'b')]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(s.cash_state(&input).0, json!(true));
    assert_eq!(
        s.cash_state(&out("0.75", 'b')),
        (json!(false), json!("0.75"))
    );
    // Public forms are answered too, and unknown ones are null.
    let r = s.post_json(
        "/api/cash/health_check",
        &json!([format!("e1:public:{}", "0".repeat(64))]),
    );
    let results = r.json()["results"].clone();
    assert_eq!(
        results.as_object().unwrap().values().next().unwrap(),
        &json!({"spent": null, "amount": null})
    );
}

#[test]
fn concurrent_spends_of_one_secret_succeed_once() {
    let s = Server::start();
    let secret = s.mint("0.6");
    let addr = s.addr;
    let threads: Vec<_> = (0..32)
        .map(|i| {
            let secret = secret.clone();
            std::thread::spawn(move || {
                let key = Key::random();
                let nick = format!("racer{i}");
                let body = json!({"nickname": nick, "pgp_public_key": key.fp(),
                                  "signature": key.sign(&format!("register:{nick}"))});
                let r = common::request(
                    addr,
                    "POST",
                    "/api/identity",
                    &[
                        ("x-cash-secret", &secret),
                        ("content-type", "application/json"),
                    ],
                    Some(body.to_string().as_bytes()),
                );
                (r.status, r.code())
            })
        })
        .collect();
    let results: Vec<(u16, String)> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let wins = results.iter().filter(|(st, _)| *st == 201).count();
    assert_eq!(wins, 1, "{results:?}");
    assert!(
        results
            .iter()
            .filter(|(st, _)| *st != 201)
            .all(|(st, c)| *st == 402 && c == "payment_spent"),
        "{results:?}"
    );
    assert_eq!(s.cash_state(&secret).0, json!(true));
}

#[test]
fn admin_needs_its_token() {
    let s = Server::start();
    let r = common::request(
        s.admin,
        "POST",
        "/admin/cash/mint",
        &[],
        Some(br#"{"amount":"1"}"#),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "auth_required"));
    let r = common::request(
        s.admin,
        "POST",
        "/admin/cash/mint",
        &[("authorization", "Bearer nope")],
        Some(br#"{"amount":"1"}"#),
    );
    assert_eq!((r.status, r.code().as_str()), (401, "auth_invalid"));
    // A 401 names its scheme (RFC 9110), which is case-insensitive.
    assert!(
        r.header("www-authenticate")
            .is_some_and(|v| v.starts_with("Bearer"))
    );
    let lower = format!("bearer {}", common::ADMIN_TOKEN);
    let r = common::request(
        s.admin,
        "GET",
        "/admin/plugins",
        &[("authorization", &lower)],
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.admin_request(
        "POST",
        "/admin/cash/mint",
        &json!({"amount": "0.123456789"}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["details"][0]["field"], "amount");
    // More than the ledger can count in total: the operator's 400, and
    // nothing minted.
    let before = s.admin_request("POST", "/admin/cash/mint", &json!({"amount": "1"}));
    assert_eq!(before.status, 200);
    let r = s.admin_request(
        "POST",
        "/admin/cash/mint",
        &json!({"amount": "184467440737.09551615"}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    // The limit it names is the ledger's: u64::MAX units.
    assert!(r.text().contains("(184467440737.09551615)"), "{}", r.text());
    // A known path with another method: 405 with Allow.
    let r = s.admin_request("POST", "/admin/plugins", &json!(null));
    assert_eq!((r.status, r.code().as_str()), (405, "method_not_allowed"));
    assert_eq!(r.header("allow"), Some("GET"));
    let r = s.admin_request("GET", "/admin/cash/mint", &json!(null));
    assert_eq!(r.status, 405);
    assert_eq!(
        s.admin_request("GET", "/admin/nothing", &json!(null))
            .status,
        404
    );
    // An upload declared over 64 MiB is refused before its body is read.
    {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(s.admin).unwrap();
        c.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        write!(
            c,
            "PUT /admin/plugins/fees HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {}\r\ncontent-length: 70000000\r\n\r\n",
            common::ADMIN_TOKEN
        )
        .unwrap();
        let mut head = [0u8; 1024];
        let n = c.read(&mut head).unwrap();
        let head = String::from_utf8_lossy(&head[..n]);
        assert!(head.starts_with("HTTP/1.1 413"), "{head}");
        assert!(head.contains("payload_too_large"), "{head}");
    }
    let plugins = s.admin_request("GET", "/admin/plugins", &json!(null));
    assert_eq!(plugins.status, 200);
    let info = plugins
        .json()
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["family"] == "info")
        .cloned()
        .unwrap();
    assert_eq!(info["hash"].as_str().unwrap().len(), 64);
}

#[test]
fn fee_schedule_follows_the_plugin_and_settings() {
    let s = Server::start();
    let f = s.get("/api/fees").json();
    assert_eq!(f["currency"], "webcash");
    assert_eq!(f["decimals"], 8);
    assert_eq!(
        f["arbitration"],
        json!({"policy": "bid-inclusive", "rate": "0.03"})
    );
    for (action, price) in [
        ("identity", "0.6"),
        ("post", "0.3"),
        ("comment", "0.01"),
        ("rate", "0.001"),
    ] {
        assert_eq!(f["actions"][action]["price"], price, "{action}");
    }
    assert_eq!(f["actions"]["pickup"]["price"], "0");
    assert!(
        f["rails"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["rail"] == "webcash" && r["enabled"] == true)
    );
    assert_eq!(f["plugin"]["name"], "fees-bid-inclusive");

    let s = Server::with(common::Options {
        config: Some(
            "[plugins]\nfees = \"fees_pickup_paid.wasm\"\n[settings.fees]\nidentity = \"0.5\"\n"
                .into(),
        ),
        ..Default::default()
    });
    let f = s.get("/api/fees").json();
    assert_eq!(f["arbitration"]["policy"], "pickup-paid");
    assert_eq!(f["actions"]["identity"]["price"], "0.5");
    assert_eq!(f["actions"]["pickup"]["rate"], "0.03");
    assert_eq!(s.get("/api/info").json()["fee_policy"], "pickup-paid");
    let key = Key::random();
    let r = s.post_json(
        "/api/identity",
        &json!({"nickname": "h", "pgp_public_key": key.fp()}),
    );
    assert_eq!(r.json()["required_amount"], "0.5");
}

/// A fee setting the fee component cannot read refuses the component when
/// it is loaded, naming the setting, instead of failing each paid request.
#[test]
fn a_fee_setting_the_policy_cannot_read_refuses_the_fee_component() {
    for (setting, named) in [
        (
            "post = \"abc\"",
            "setting post = \"abc\" must be a decimal amount",
        ),
        (
            "arbitration_percent = \"500\"",
            "setting arbitration_percent = \"500\" must be a whole number from 0 to 100",
        ),
    ] {
        let s = Server::with(common::Options {
            config: Some(format!("[settings.fees]\n{setting}\n")),
            ..Default::default()
        });
        let health = s.get("/api/health");
        assert_eq!(health.status, 503, "{setting}: {}", health.text());
        assert_eq!(health.json()["status"], "degraded");
        assert_eq!(health.json()["plugins"]["fees"]["status"], "unavailable");
        let log = s.log_text();
        assert!(log.contains(named), "{setting}: {log}");
        // Nothing is charged: the paid route cannot be priced.
        let key = Key::random();
        let secret = s.mint("1");
        let r = s.register(&key, "nofees", &secret);
        assert_eq!(r.status, 503, "{setting}: {}", r.text());
        assert_eq!(r.code(), "plugin_unavailable");
        assert_eq!(s.cash_state(&secret), (json!(false), json!("1")));
    }
}

#[test]
fn acknowledged_paid_writes_survive_kill_9() {
    let mut s = Server::start();
    let data_dir = s.data_dir.clone();
    let mut done = Vec::new();
    for i in 0..12 {
        let key = Key::random();
        let secret = s.mint("0.6");
        let r = s.register(&key, &format!("durable{i}"), &secret);
        assert_eq!(r.status, 201);
        done.push((key.fp(), secret));
    }
    s.kill();
    let s2 = Server::with(common::Options {
        data_dir: Some(data_dir),
        ..Default::default()
    });
    for (fp, secret) in &done {
        assert_eq!(
            s2.get(&format!("/api/profile?fingerprint={fp}")).status,
            200
        );
        assert_eq!(s2.cash_state(secret), (json!(true), json!("0.6")));
    }
    drop(s);
}

/// A webcash wallet addresses the service by its base URL and calls
/// `{base}/api/v1/replace` and `{base}/api/v1/health_check` (PROTOCOL 3 and
/// 10): they answer exactly as `/api/cash/...` do.
#[test]
fn webcash_wallet_paths_serve_the_ledger() {
    let s = Server::start();
    let input = s.mint("1");
    let out_a = format!("e0.4:secret:{}", "ab".repeat(32));
    let out_b = format!("e0.6:secret:{}", "cd".repeat(32));
    let r = s.post_json(
        "/api/v1/replace",
        &json!({"webcashes": [input], "new_webcashes": [out_a, out_b]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json(), json!({"status": "success"}));
    // Spent now, on either path.
    let again = s.post_json(
        "/api/replace",
        &json!({"webcashes": [input], "new_webcashes": [format!("e1:secret:{}", "ef".repeat(32))]}),
    );
    assert_eq!(again.status, 400);
    let states = s
        .post_json("/api/v1/health_check", &json!([input, out_a]))
        .json();
    let cash = s
        .post_json("/api/cash/health_check", &json!([input, out_a]))
        .json();
    assert_eq!(states, cash);
    assert_eq!(states["status"], "success");
    let results = states["results"].as_object().unwrap();
    assert_eq!(results.len(), 2);
    assert!(
        results
            .values()
            .any(|v| v["spent"] == true && v["amount"] == "1")
    );
    assert!(
        results
            .values()
            .any(|v| v["spent"] == false && v["amount"] == "0.4")
    );
}
