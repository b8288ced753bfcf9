//! Black-box tests of arbitration contracts (PROTOCOL section 7): every row
//! of the transition table, every refused (action, state, party), money
//! under both fee policies, deadlines, witnesses and concurrency.

mod common;

use common::{Key, Server, now_s};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

/// Fresh signatures are single-use: give every request its own timestamp.
static TICK: AtomicU64 = AtomicU64::new(0);
/// A timestamp inside the freshness window that no earlier call returned
/// (for the same clock shift), so no two signatures of a test collide.
fn fresh_ts(shift_s: u64) -> u64 {
    static LAST: std::sync::Mutex<std::collections::BTreeMap<u64, u64>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let mut last = LAST.lock().unwrap();
    let entry = last.entry(shift_s).or_insert(0);
    *entry = (*entry + 1).max(now_s() + shift_s - 280);
    *entry
}

struct Deal {
    buyer: Key,
    seller: Key,
    post: String,
}

fn deal(s: &Server) -> Deal {
    let seller = s.identity(&format!("seller{}", TICK.fetch_add(1, Ordering::Relaxed)));
    let buyer = s.identity(&format!("buyer{}", TICK.fetch_add(1, Ordering::Relaxed)));
    let post = s.new_post(
        &seller,
        "Logo design, delivered in 3 days",
        json!({"post_type": "service"}),
    );
    Deal {
        buyer,
        seller,
        post,
    }
}

fn buy_body(d: &Deal, amount: &str, extra: Value) -> Value {
    let ts = fresh_ts(0);
    let cid = extra["contract_id"].as_str().unwrap_or("").to_string();
    let proof = extra["witness_proof"].as_str().unwrap_or("").to_string();
    let msg = format!(
        "buy_contract:{}:{}:{cid}:{proof}:{ts}",
        d.buyer.fp(),
        d.post
    );
    let mut body = json!({
        "buyer_fingerprint": d.buyer.fp(), "contract_type": "service", "amount": amount,
        "reference_post": d.post, "accept_terms": true, "timestamp": ts, "signature": d.buyer.sign(&msg),
    });
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

fn buy(s: &Server, d: &Deal, amount: &str, extra: Value) -> common::Resp {
    buy_with(s, d, amount, extra, &s.mint(amount))
}

/// [`buy`] paid with `secret`.
fn buy_with(s: &Server, d: &Deal, amount: &str, extra: Value, secret: &str) -> common::Resp {
    let body = buy_body(d, amount, extra);
    s.post_paid("/api/arbitration/contracts/buy", secret, &body)
}

fn new_contract(s: &Server, d: &Deal) -> String {
    let r = buy(s, d, "1", json!({}));
    assert_eq!(r.status, 201, "buy: {}", r.text());
    r.json()["contract_id"].as_str().unwrap().to_string()
}

/// A contract action signed by `key` (fresh unless `legacy`).
fn act_with(
    s: &Server,
    key: &Key,
    id: &str,
    action: &str,
    extra: Value,
    ts: Option<u64>,
    secret: Option<&str>,
) -> common::Resp {
    let text = extra["delivered_text"].as_str().unwrap_or("").to_string();
    let (field, message) = match action {
        "accept" => ("seller_fingerprint", format!("accept:{id}:{}", key.fp())),
        "deliver" => ("actor_fingerprint", format!("deliver:{id}:{text}")),
        "pickup" => ("actor_fingerprint", id.to_string()),
        "refund" => ("actor_fingerprint", format!("REFUND:{id}")),
        "release" => ("actor_fingerprint", format!("release:{id}")),
        _ => unreachable!(),
    };
    let mut body = json!({});
    body[field] = json!(key.fp());
    match ts {
        Some(ts) => {
            body["timestamp"] = json!(ts);
            body["signature"] = json!(key.sign(&format!("{message}:{ts}")));
        }
        None => body["signature"] = json!(key.sign(&message)),
    }
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let path = format!("/api/arbitration/contracts/{id}/{action}");
    match secret {
        Some(sec) => s.post_paid(&path, sec, &body),
        None => s.post_json(&path, &body),
    }
}

fn act(s: &Server, key: &Key, id: &str, action: &str) -> common::Resp {
    let extra = if action == "deliver" {
        json!({"delivered_text": "the logo files"})
    } else {
        json!({})
    };
    act_with(s, key, id, action, extra, Some(fresh_ts(0)), None)
}

fn status(s: &Server, id: &str) -> Value {
    let r = s.get(&format!("/api/arbitration/contracts/{id}/status"));
    assert_eq!(r.status, 200);
    r.json()
}

/// Drive a fresh contract into `state`.
fn contract_in(s: &Server, d: &Deal, state: &str) -> String {
    let id = new_contract(s, d);
    let steps: &[(&str, bool)] = match state {
        "issued" => &[],
        "active" => &[("accept", false)],
        "delivered" => &[("accept", false), ("deliver", false)],
        "settled" => &[("accept", false), ("deliver", false), ("pickup", true)],
        "refunded" => &[("refund", true)],
        _ => unreachable!(),
    };
    for (action, by_buyer) in steps {
        let key = if *by_buyer { &d.buyer } else { &d.seller };
        let r = act(s, key, &id, action);
        assert_eq!(r.status, 200, "{action}: {}", r.text());
    }
    assert_eq!(status(s, &id)["status"], state);
    id
}

/// The witness proof of `n:{id}:secret:{hex}` (PROTOCOL 7): `n:{id}:public:`
/// and the sha256 of the secret's 32 bytes.
fn witness_proof(id: &str, hex: &str) -> String {
    use sha2::{Digest, Sha256};
    let raw: Vec<u8> = (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    format!("n:{id}:public:{}", common::hex(&Sha256::digest(&raw)))
}

/// What the arbiter signs at issue (PROTOCOL 10): `arbiter_issue:` and the
/// sha256 of `fields`, each preceded by its length as a little-endian u64.
fn issue_message(fields: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for f in fields {
        h.update((f.len() as u64).to_le_bytes());
        h.update(f.as_bytes());
    }
    format!("arbiter_issue:{}", common::hex(&h.finalize()))
}

#[test]
fn every_action_in_every_state_by_every_party() {
    let s = Server::start();
    let d = deal(&s);
    // (state, action, buyer's answer, seller's answer, state after a success)
    let matrix = [
        ("issued", "accept", 403, 200, "active"),
        ("issued", "deliver", 409, 409, ""),
        ("issued", "pickup", 409, 409, ""),
        ("issued", "release", 409, 409, ""),
        ("issued", "refund", 200, 403, "refunded"),
        ("active", "accept", 409, 409, ""),
        ("active", "deliver", 403, 200, "delivered"),
        ("active", "pickup", 409, 409, ""),
        // The seller may release too (a shipment, PROTOCOL 10), but only
        // with a tracking number: without one it is a 400.
        ("active", "release", 200, 400, "settled"),
        ("active", "refund", 403, 200, "refunded"),
        ("delivered", "accept", 409, 409, ""),
        ("delivered", "deliver", 409, 409, ""),
        ("delivered", "pickup", 200, 403, "settled"),
        ("delivered", "release", 200, 403, "settled"),
        ("delivered", "refund", 403, 200, "refunded"),
        ("settled", "accept", 409, 409, ""),
        ("settled", "deliver", 409, 409, ""),
        ("settled", "pickup", 200, 200, "settled"),
        ("settled", "release", 409, 409, ""),
        ("settled", "refund", 409, 409, ""),
        ("refunded", "accept", 409, 409, ""),
        ("refunded", "deliver", 409, 409, ""),
        ("refunded", "pickup", 200, 403, "refunded"),
        ("refunded", "release", 409, 409, ""),
        ("refunded", "refund", 409, 409, ""),
    ];
    for (state, action, buyer_code, seller_code, after) in matrix {
        for (who, key, code) in [
            ("buyer", &d.buyer, buyer_code),
            ("seller", &d.seller, seller_code),
        ] {
            let id = contract_in(&s, &d, state);
            // The status names, per party, exactly the actions that party
            // may take here (the seller's release without its tracking
            // number is one: a 400 for the body, not the state).
            let by_role = status(&s, &id)["actions_by_role"][who].clone();
            let listed = by_role.as_array().unwrap().contains(&json!(action));
            assert_eq!(
                listed,
                matches!(code, 200 | 400),
                "{who} {action} in {state}: {by_role}"
            );
            let r = act(&s, key, &id, action);
            let ctx = format!("{who} {action} in {state}: {}", r.text());
            assert_eq!(r.status, code, "{ctx}");
            let b = r.json();
            match code {
                200 => {
                    assert_eq!(b["status"], after, "{ctx}");
                    assert_eq!(status(&s, &id)["status"], after, "{ctx}");
                    assert!(b["allowed_actions"].is_array());
                }
                403 => {
                    assert_eq!(b["code"], "forbidden_party", "{ctx}");
                    assert_eq!(status(&s, &id)["status"], state);
                }
                409 => {
                    assert_eq!(b["code"], "invalid_transition", "{ctx}");
                    assert_eq!(b["current_status"], state, "{ctx}");
                    assert!(b["allowed_actions"].is_array(), "{ctx}");
                    let want = format!("contract {id} is {state} and cannot be");
                    assert!(b["message"].as_str().unwrap().starts_with(&want), "{ctx}");
                }
                400 => {
                    assert_eq!(b["code"], "invalid_request", "{ctx}");
                    assert_eq!(status(&s, &id)["status"], state);
                }
                _ => unreachable!(),
            }
        }
    }
    // A stranger is refused whatever the state.
    let stranger = s.identity("stranger");
    for state in ["issued", "delivered", "settled"] {
        let id = contract_in(&s, &d, state);
        let r = act(&s, &stranger, &id, "release");
        assert_eq!((r.status, r.code().as_str()), (403, "forbidden_party"));
    }
}

#[test]
fn status_and_contract_reads() {
    let s = Server::start();
    let d = deal(&s);
    let r = buy(
        &s,
        &d,
        "2.5",
        json!({"contract_id": "CTR_2026_000123", "work_spec": {"pages": 3}}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let b = r.json();
    assert_eq!(b["contract_id"], "CTR_2026_000123");
    assert_eq!(b["status"], "issued");
    assert_eq!(b["target_seller_fingerprint"], d.seller.fp());
    let st = status(&s, "CTR_2026_000123");
    assert_eq!(st["allowed_actions"], json!(["accept", "refund"]));
    assert!(st["updated_at"].is_string());
    let c = s.get("/api/arbitration/contracts/CTR_2026_000123").json();
    assert_eq!(c["amount"], "2.5");
    assert_eq!(c["buyer_fingerprint"], d.buyer.fp());
    assert_eq!(c["reference_post"], d.post.as_str());
    assert_eq!(c["work_spec"], json!({"pages": 3}));
    assert_eq!(c["fee_policy"], "bid-inclusive");
    assert_eq!(c["history"][0]["action"], "buy");
    assert!(c["delivery_deadline"].as_str().unwrap().ends_with('Z'));
    assert!(
        !c.to_string().contains("secret"),
        "no secret in a contract read: {c}"
    );
    // A taken id is a conflict (found after the charge: the payment is
    // not spent); unknown ids are 404.
    let secret = s.mint("1");
    let taken = buy_with(
        &s,
        &d,
        "1",
        json!({"contract_id": "CTR_2026_000123"}),
        &secret,
    );
    assert_eq!((taken.status, taken.code().as_str()), (409, "conflict"));
    assert_eq!(s.cash_state(&secret).0, json!(false));
    assert_eq!(
        s.get("/api/arbitration/contracts/CTR_nope").code(),
        "not_found"
    );
    assert_eq!(
        s.get("/api/arbitration/contracts/whatever/status").code(),
        "not_found"
    );
}

#[test]
fn buy_validation_payment_and_parties() {
    let s = Server::start();
    let d = deal(&s);
    for (extra, field) in [
        (json!({"amount": "0"}), "amount"),
        (json!({"amount": "1.000000001"}), "amount"),
        // Amounts are decimal strings: a JSON number is refused.
        (json!({"amount": 1}), "amount"),
        (json!({"amount": 0.5}), "amount"),
        (json!({"contract_type": "barter"}), "contract_type"),
        (json!({"accept_terms": false}), "accept_terms"),
        (json!({"contract_id": "BAD id"}), "contract_id"),
        (
            json!({"delivery_deadline": "2001-01-01T00:00:00Z"}),
            "delivery_deadline",
        ),
        (
            json!({"witness_proof": "n:CTR_x:public:00"}),
            "witness_proof",
        ),
    ] {
        let r = buy(&s, &d, "1", extra.clone());
        assert_eq!(r.status, 400, "{extra}: {}", r.text());
        assert_eq!(r.json()["details"][0]["field"], field, "{extra}");
    }
    // A deadline before 1970 is a time in the past, not a malformed one.
    for (deadline, problem) in [
        ("1969-12-31T23:59:59Z", "must be in the future"),
        ("0231-01-01T00:00:00Z", "must be in the future"),
        ("1969-02-30T00:00:00Z", "must be an RFC 3339 time"),
        // The document's `date-time`: `T` between date and time.
        ("2099-01-01 00:00:00Z", "must be an RFC 3339 time"),
    ] {
        let r = buy(&s, &d, "1", json!({"delivery_deadline": deadline}));
        assert_eq!(r.status, 400, "{deadline}: {}", r.text());
        let said = r.json()["details"][0]["problem"]
            .as_str()
            .unwrap_or("")
            .to_string();
        assert!(said.starts_with(problem), "{deadline}: {said}");
    }
    // One past the year 9999 in UTC (written with an offset) is in the
    // future.
    let r = buy(
        &s,
        &d,
        "1",
        json!({"delivery_deadline": "9999-12-31T23:59:59-00:01"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // An empty id or proof is an absent one (signed as ""): the server
    // makes the id.
    let r = buy(&s, &d, "1", json!({"contract_id": "", "witness_proof": ""}));
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(
        r.json()["contract_id"]
            .as_str()
            .unwrap()
            .starts_with("CTR_")
    );
    // A signer given under another action's member: 401 auth_required
    // naming the member this action reads (accept's is the seller's).
    let id = r.json()["contract_id"].as_str().unwrap().to_string();
    let ts = fresh_ts(0);
    let wrong = json!({"actor_fingerprint": d.seller.fp(), "timestamp": ts,
                       "signature": d.seller.sign(&format!("accept:{id}:{}:{ts}", d.seller.fp()))});
    let r = s.post_json(&format!("/api/arbitration/contracts/{id}/accept"), &wrong);
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_required"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("`seller_fingerprint`"), "{}", r.text());
    // A timestamp in milliseconds is well-formed, only far from the clock.
    let ts_ms = now_s() * 1000;
    let msg = format!("buy_contract:{}:{}:::{ts_ms}", d.buyer.fp(), d.post);
    let body = json!({
        "buyer_fingerprint": d.buyer.fp(), "contract_type": "service", "amount": "1",
        "reference_post": d.post, "accept_terms": true, "timestamp": ts_ms,
        "signature": d.buyer.sign(&msg),
    });
    let secret = s.mint("1");
    let r = s.post_paid("/api/arbitration/contracts/buy", &secret, &body);
    assert_eq!(
        (r.status, r.code().as_str()),
        (401, "auth_expired"),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret).0, json!(false), "nothing spent");
    // 402 names the contract amount.
    let r = s.post_json(
        "/api/arbitration/contracts/buy",
        &json!({"buyer_fingerprint": d.buyer.fp(), "contract_type": "service", "amount": "1.25",
                "reference_post": d.post, "accept_terms": true}),
    );
    assert_eq!(
        (r.status, r.json()["required_amount"].as_str()),
        (402, Some("1.25"))
    );
    // Buying your own listing, or an unknown post.
    let selfbuy = Deal {
        buyer: d.seller,
        seller: Key::random(),
        post: d.post.clone(),
    };
    let r = buy(&s, &selfbuy, "1", json!({}));
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden_party"));
    let ghost = Deal {
        buyer: d.buyer,
        seller: Key::random(),
        post: "post_01GHOST".into(),
    };
    let r = buy(&s, &ghost, "1", json!({}));
    assert_eq!((r.status, r.code().as_str()), (404, "not_found"));
}

#[test]
fn a_listing_whose_seller_deleted_their_identity_cannot_be_bought() {
    let s = Server::start();
    let d = deal(&s);
    let fp = d.seller.fp();
    let r = s.post_json(
        "/api/identity/delete",
        &json!({"fingerprint": fp, "signature": d.seller.sign(&format!("delete_identity:{fp}"))}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // The post stays, but nobody could accept a contract on it: refused
    // before any money moves.
    assert_eq!(s.get(&format!("/api/posts/{}", d.post)).status, 200);
    let secret = s.mint("1");
    let ts = fresh_ts(0);
    let msg = format!("buy_contract:{}:{}:::{ts}", d.buyer.fp(), d.post);
    let r = s.post_paid(
        "/api/arbitration/contracts/buy",
        &secret,
        &json!({"buyer_fingerprint": d.buyer.fp(), "contract_type": "service", "amount": "1",
                "reference_post": d.post, "accept_terms": true, "timestamp": ts,
                "signature": d.buyer.sign(&msg)}),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (404, "not_found"),
        "{}",
        r.text()
    );
    assert!(
        r.json()["message"].as_str().unwrap().contains(&d.post),
        "{}",
        r.text()
    );
    assert_eq!(s.cash_state(&secret).0, json!(false), "nothing spent");
}

#[test]
fn bid_inclusive_happy_path_pays_out_amount_less_fee() {
    let s = Server::start();
    let d = deal(&s);
    let id = contract_in(&s, &d, "delivered");
    let r = act(&s, &d.buyer, &id, "pickup");
    assert_eq!(r.status, 200);
    let cert = r.json();
    assert_eq!(cert["status"], "settled");
    assert!(cert["certificate_id"].as_str().unwrap().starts_with("CRT_"));
    assert_eq!(cert["delivered_text"], "the logo files");
    // The certificate is a bearer witness of its own, as the original
    // client keeps and checks it: n:{certificate_id}:secret:{64 hex},
    // its proof live in the witness ledger.
    let cert_id = cert["certificate_id"].as_str().unwrap().to_string();
    let secret = cert["certificate_secret"].as_str().unwrap().to_string();
    let hex = secret
        .strip_prefix(&format!("n:{cert_id}:secret:"))
        .unwrap_or_else(|| panic!("{cert}"))
        .to_string();
    assert_eq!(hex.len(), 64, "{cert}");
    let proof = witness_proof(&cert_id, &hex);
    assert_eq!(cert["certificate_proof"], proof.as_str());
    let health = |p: &str| {
        s.post_json("/api/witness/health_check", &json!([p])).json()["results"][p].clone()
    };
    assert_eq!(
        health(&proof),
        json!({"spent": false, "state": "live", "contract_id": id})
    );
    // A repeat returns the same certificate.
    let again = act(&s, &d.buyer, &id, "pickup").json();
    assert_eq!(again["certificate_id"], cert["certificate_id"]);
    assert_eq!(again["certificate_secret"], cert["certificate_secret"]);
    // Its holder moves it to a secret only they know (the client's
    // `certificate insert`): the old one is spent, and cannot move again.
    let mine = "ab".repeat(32);
    let new_secret = format!("n:{cert_id}:secret:{mine}");
    let replace = |old: &str, new: &str| {
        s.post_json(
            "/api/witness/replace",
            &json!({"secrets": [old], "new_secrets": [new]}),
        )
    };
    let r = replace(&secret, &new_secret);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(health(&proof)["state"], "spent");
    assert_eq!(
        health(&witness_proof(&cert_id, &mine)),
        json!({"spent": false, "state": "live", "contract_id": id})
    );
    let r = replace(&secret, &format!("n:{cert_id}:secret:{}", "cd".repeat(32)));
    assert_eq!(r.status, 400, "{}", r.text());
    // A certificate cannot move to another id.
    let other = format!("n:{id}:secret:{}", "ef".repeat(32));
    assert_eq!(replace(&new_secret, &other).status, 400);
    // The seller's payout, the way the original client asks: a legacy
    // signature over the contract id, honoured once.
    let r = act_with(&s, &d.seller, &id, "pickup", json!({}), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let payout = r.json()["payout"].as_str().unwrap().to_string();
    assert!(payout.starts_with("e0.97:secret:"), "{payout}");
    assert_eq!(s.cash_state(&payout), (json!(false), json!("0.97")));
    let again = act_with(&s, &d.seller, &id, "pickup", json!({}), None, None);
    assert_eq!(
        (again.status, again.code().as_str()),
        (409, "already_picked_up")
    );
    assert!(!again.text().contains(&payout[13..]), "{}", again.text());
    assert_eq!(again.json()["issued"], public_form(&payout));
    // A fresh signature fetches the same secret at any time.
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["payout"], payout.as_str());
    // The history shows the payout's first pickup, by the seller, once.
    let pickups = |id: &str| -> Vec<String> {
        s.get(&format!("/api/arbitration/contracts/{id}")).json()["history"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["action"] == "pickup")
            .map(|e| e["actor"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(pickups(&id), [d.buyer.fp(), d.seller.fp()]);

    // Refund path: the buyer gets the whole amount back, the same way.
    let id = contract_in(&s, &d, "refunded");
    let r = act_with(&s, &d.buyer, &id, "pickup", json!({}), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    let refund = r.json()["refund"].as_str().unwrap().to_string();
    assert!(refund.starts_with("e1:secret:"));
    assert_eq!(s.cash_state(&refund), (json!(false), json!("1")));
    let again = act_with(&s, &d.buyer, &id, "pickup", json!({}), None, None);
    assert_eq!(
        (again.status, again.code().as_str()),
        (409, "already_picked_up")
    );
    assert_eq!(again.json()["issued"], public_form(&refund));
    assert_eq!(
        act(&s, &d.buyer, &id, "pickup").json()["refund"],
        refund.as_str()
    );
    assert_eq!(pickups(&id), [d.buyer.fp()]);
}

/// `e{amount}:public:{sha256 of the 64-hex string}`, computed here.
fn public_form(secret: &str) -> String {
    use sha2::{Digest, Sha256};
    let (amount, hex) = secret.split_once(":secret:").unwrap();
    format!(
        "{amount}:public:{}",
        common::hex(&Sha256::digest(hex.as_bytes()))
    )
}

fn pickup_paid_server() -> Server {
    Server::with(common::Options {
        config: Some("testing_routes = true\n[plugins]\nfees = \"fees_pickup_paid.wasm\"\n".into()),
        ..Default::default()
    })
}

#[test]
fn pickup_paid_first_pickup_pays_the_fee_and_payout_is_whole() {
    let s = pickup_paid_server();
    let d = deal(&s);
    let id = contract_in(&s, &d, "delivered");
    assert_eq!(
        s.get(&format!("/api/arbitration/contracts/{id}")).json()["fee_policy"],
        "pickup-paid"
    );
    let r = act(&s, &d.buyer, &id, "pickup");
    assert_eq!(
        (r.status, r.code().as_str()),
        (402, "payment_required"),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["required_amount"], "0.03");
    let ts = fresh_ts(0);
    let r = act_with(
        &s,
        &d.buyer,
        &id,
        "pickup",
        json!({}),
        Some(ts),
        Some(&s.mint("0.03")),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "settled");
    // Later pickups are free; the payout is the whole amount.
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    let payout = r.json()["payout"].as_str().unwrap().to_string();
    assert_eq!(s.cash_state(&payout), (json!(false), json!("1")));
    assert_eq!(act(&s, &d.buyer, &id, "pickup").status, 200);

    // After a release, whichever party picks up first pays.
    let id = contract_in(&s, &d, "active");
    assert_eq!(act(&s, &d.buyer, &id, "release").status, 200);
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 402);
    let r = act_with(
        &s,
        &d.seller,
        &id,
        "pickup",
        json!({}),
        Some(fresh_ts(0)),
        Some(&s.mint("0.03")),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(act(&s, &d.buyer, &id, "pickup").status, 200);
}

/// PROTOCOL 10 (which wins over 3): a payout goes to a legacy signature
/// once. An identical retry of a paid legacy pickup (the same body and the
/// same, now spent, fee secret) is answered as a later legacy pickup is,
/// not with the kept payout: a copy of the request (a proxy's log) would
/// otherwise collect it. The payment's change still comes back, and a
/// fresh signature still fetches the payout.
#[test]
fn a_paid_legacy_pickup_hands_its_payout_out_once_even_to_a_retry() {
    let s = pickup_paid_server();
    let d = deal(&s);
    let id = contract_in(&s, &d, "active");
    assert_eq!(act(&s, &d.buyer, &id, "release").status, 200);
    let fee = s.mint("0.05");
    let pickup = || act_with(&s, &d.seller, &id, "pickup", json!({}), None, Some(&fee));
    let first = pickup();
    assert_eq!(first.status, 200, "{}", first.text());
    let payout = first.json()["payout"].as_str().unwrap().to_string();
    let change = first.header("x-cash-change").unwrap().to_string();
    assert!(change.starts_with("e0.02:secret:"), "{change}");
    assert_eq!(s.cash_state(&payout), (json!(false), json!("1")));
    for _ in 0..2 {
        let again = pickup();
        assert_eq!(
            (again.status, again.code().as_str()),
            (409, "already_picked_up"),
            "{}",
            again.text()
        );
        assert!(!again.text().contains(&payout[11..]), "{}", again.text());
        assert_eq!(again.json()["issued"], public_form(&payout));
        assert_eq!(again.header("x-cash-change"), Some(change.as_str()));
    }
    // The fee was taken once, the change is the payer's, the payout is
    // still the seller's to fetch with a fresh signature.
    assert_eq!(s.cash_state(&fee).0, json!(true));
    assert_eq!(s.cash_state(&change), (json!(false), json!("0.02")));
    let fresh = act(&s, &d.seller, &id, "pickup");
    assert_eq!(fresh.status, 200, "{}", fresh.text());
    assert_eq!(fresh.json()["payout"], payout.as_str());
    // A paid fresh-signature pickup keeps its answer for identical
    // retries (PROTOCOL 3), as every paid request does.
    let id = contract_in(&s, &d, "active");
    assert_eq!(act(&s, &d.buyer, &id, "release").status, 200);
    let (ts, fee) = (fresh_ts(0), s.mint("0.03"));
    let paid = || {
        act_with(
            &s,
            &d.seller,
            &id,
            "pickup",
            json!({}),
            Some(ts),
            Some(&fee),
        )
    };
    let first = paid();
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(paid().json(), first.json());
}

#[test]
fn contracts_keep_the_policy_they_were_bought_under() {
    let s = Server::start();
    let d = deal(&s);
    let old = contract_in(&s, &d, "delivered");
    let wasm = std::fs::read(common::plugins_dir().join("fees_pickup_paid.wasm")).unwrap();
    let r = common::deal::admin(&s, "PUT", "/admin/plugins/fees", &wasm);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        s.get("/api/fees").json()["arbitration"]["policy"],
        "pickup-paid"
    );
    // The old contract settles free and pays out amount - fee.
    assert_eq!(act(&s, &d.buyer, &old, "pickup").status, 200);
    let payout = act(&s, &d.seller, &old, "pickup").json()["payout"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(s.cash_state(&payout).1, json!("0.97"));
    // A new one follows the new policy.
    let new = contract_in(&s, &d, "delivered");
    assert_eq!(
        s.get(&format!("/api/arbitration/contracts/{new}")).json()["fee_policy"],
        "pickup-paid"
    );
    assert_eq!(act(&s, &d.buyer, &new, "pickup").status, 402);
}

#[test]
fn buyer_may_refund_an_active_contract_after_the_deadline() {
    let s = Server::testing();
    let d = deal(&s);
    let id = contract_in(&s, &d, "active");
    let r = act(&s, &d.buyer, &id, "refund");
    assert_eq!((r.status, r.code().as_str()), (403, "forbidden_party"));
    // The refusal says when the buyer may.
    let deadline = s.get(&format!("/api/arbitration/contracts/{id}")).json()["delivery_deadline"]
        .as_str()
        .unwrap()
        .to_string();
    let said = r.json()["message"].as_str().unwrap().to_string();
    assert!(
        said.contains(&format!(
            "once its delivery_deadline ({deadline}) has passed"
        )),
        "{said}"
    );
    // The seller's refusal of the buyer's action says nothing of it.
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 409, "{}", r.text());
    assert!(!r.text().contains("delivery_deadline"), "{}", r.text());
    let shift = 8 * 86_400;
    let r = s.admin_request("POST", "/admin/clock", &json!({"shift_ms": shift * 1000}));
    assert_eq!(r.status, 200);
    let r = act_with(
        &s,
        &d.buyer,
        &id,
        "refund",
        json!({}),
        Some(fresh_ts(shift)),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "refunded");
}

/// A retry of an action that went through, its answer lost, sends the
/// same signature again: 409 `conflict` (single use), which shows where
/// the contract stands, so the client sees its action took.
#[test]
fn a_used_signature_on_an_action_shows_where_the_contract_stands() {
    let s = Server::start();
    let d = deal(&s);
    let id = new_contract(&s, &d);
    let ts = fresh_ts(0);
    let accept = || act_with(&s, &d.seller, &id, "accept", json!({}), Some(ts), None);
    let first = accept();
    assert_eq!(first.status, 200, "{}", first.text());
    let again = accept();
    assert_eq!((again.status, again.code().as_str()), (409, "conflict"));
    let doc = again.json();
    assert_eq!(doc["current_status"], "active", "{doc}");
    assert_eq!(
        doc["allowed_actions"],
        first.json()["allowed_actions"],
        "{doc}"
    );
}

/// A fee policy may price arbitration at the whole amount (the rule is
/// at most the amount): the seller's pickup then collects nothing, a 200
/// saying so, and no secret worth nothing is made.
#[test]
fn a_fee_of_the_whole_amount_leaves_the_seller_no_payout() {
    let s = Server::with(common::Options {
        config: Some("[settings.fees]\narbitration_percent = \"100\"\n".into()),
        ..Default::default()
    });
    let d = deal(&s);
    let id = contract_in(&s, &d, "settled");
    let unspent = s.metric("marketplace_ledger_unspent_units");
    let r = act(&s, &d.seller, &id, "pickup");
    assert_eq!(r.status, 200, "{}", r.text());
    let doc = r.json();
    assert_eq!(doc["payout_amount"], "0", "{doc}");
    assert!(doc.get("payout").is_none(), "{doc}");
    assert_eq!(doc["status"], "settled", "{doc}");
    // Nothing was issued.
    assert_eq!(s.metric("marketplace_ledger_unspent_units"), unspent);
}

/// A buy refunded before acceptance gives its whole amount back, so buys
/// are counted per identity and UTC day (`buys_per_day`): past it 429
/// `rate_limited` with `Retry-After`, nothing spent; another identity, or
/// the next day, buys again.
#[test]
fn one_identity_buys_a_bounded_number_of_contracts_a_day() {
    use common::deal as flow;
    let s = Server::with(common::Options {
        testing_routes: true,
        config: Some("[settings.contracts]\nbuys_per_day = \"2\"\n".into()),
        ..Default::default()
    });
    let d = flow::deal(&s);
    for _ in 0..2 {
        let id = flow::buy(&s, &d, "0.00000001");
        flow::act_ok(&s, &d.buyer, &id, "refund");
    }
    let secret = s.mint("0.00000001");
    let r = s.post_paid(
        "/api/arbitration/contracts/buy",
        &secret,
        &flow::buy_body(&d, "0.00000001"),
    );
    let wait = common::rate_limited(&r, 86_400);
    assert_eq!(s.cash_state(&secret).0, json!(false));
    assert!(s.documents("POST", "/api/arbitration/contracts/buy", 429));
    // Another buyer is not affected.
    let other = flow::deal(&s);
    flow::buy(&s, &other, "0.00000001");
    // The next day the first buys again.
    let shift_ms = wait * 1000;
    let r = s.admin_request("POST", "/admin/clock", &json!({"shift_ms": shift_ms}));
    assert_eq!(r.status, 200, "{}", r.text());
    let mut body = flow::buy_body(&d, "0.00000001");
    let ts = body["timestamp"].as_u64().unwrap() + wait;
    let msg = format!("buy_contract:{}:{}:::{ts}", d.buyer.fp(), d.post);
    body["timestamp"] = json!(ts);
    body["signature"] = json!(d.buyer.sign(&msg));
    let r = s.post_paid("/api/arbitration/contracts/buy", &secret, &body);
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn witness_gates_delivery_and_is_burned_at_settlement() {
    let s = Server::start();
    let d = deal(&s);
    let id = "CTR_witness_1";
    let secret_hex = "11".repeat(32);
    let proof_of = |hex: &str| witness_proof(id, hex);
    let proof = proof_of(&secret_hex);
    let r = buy(
        &s,
        &d,
        "1",
        json!({"contract_id": id, "witness_proof": proof, "encrypted_witness_secret": "enc-blob"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    // Before accept, the witness is live (what the client checks before it
    // inserts the contract).
    let before = s
        .post_json("/api/witness/health_check", &json!([proof]))
        .json();
    assert_eq!(
        before["results"][&proof],
        json!({"spent": false, "state": "live", "contract_id": id})
    );
    // A health check only reads: it runs on a snapshot and commits nothing.
    let commits = || s.get("/api/health").json()["storage"]["commits"].as_u64();
    let at_start = commits();
    assert!(at_start.is_some());
    for _ in 0..3 {
        let r = s.post_json("/api/witness/health_check", &json!([proof]));
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(commits(), at_start, "a witness health check committed");
    let r = act(&s, &d.seller, id, "accept");
    assert_eq!(r.json()["witness_secret_encrypted_for_seller"], "enc-blob");
    let r = act(&s, &d.seller, id, "deliver");
    assert_eq!((r.status, r.code().as_str()), (403, "witness_mismatch"));
    // The refusal names the member a client has to send.
    let message = r.json()["message"].as_str().unwrap_or_default().to_string();
    assert!(message.contains("witness_secret"), "{message}");

    let new_hex = "22".repeat(32);
    let r = s.post_json(
        "/api/witness/replace",
        &json!({"secrets": [format!("n:{id}:secret:{secret_hex}")], "new_secrets": [format!("n:{id}:secret:{new_hex}")]}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = act_with(
        &s,
        &d.seller,
        id,
        "deliver",
        json!({"delivered_text": "the logo files", "witness_secret": format!("n:{id}:secret:{secret_hex}")}),
        Some(fresh_ts(0)),
        None,
    );
    assert_eq!((r.status, r.code().as_str()), (403, "witness_mismatch"));
    let r = act_with(
        &s,
        &d.seller,
        id,
        "deliver",
        json!({"delivered_text": "the logo files", "witness_secret": format!("n:{id}:secret:{new_hex}")}),
        Some(fresh_ts(0)),
        None,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let states = s
        .post_json(
            "/api/witness/health_check",
            &json!([proof, proof_of(&new_hex)]),
        )
        .json();
    // The original client's shape (PROTOCOL 10): `spent` is false only
    // while the proof is live.
    assert_eq!(
        states["results"][&proof],
        json!({"spent": true, "state": "spent", "contract_id": id})
    );
    assert_eq!(
        states["results"][&proof_of(&new_hex)],
        json!({"spent": false, "state": "live", "contract_id": id})
    );
    let unknown = proof_of(&"44".repeat(32));
    let states_unknown = s
        .post_json("/api/witness/health_check", &json!([unknown]))
        .json();
    assert_eq!(
        states_unknown["results"][&unknown],
        json!({"spent": null, "state": null, "contract_id": null})
    );
    // Results come in the order asked (as the cash health_check's), a
    // proof asked twice once.
    let (late, early) = (proof_of(&"ff".repeat(32)), proof_of(&"00".repeat(32)));
    let r = s.post_json(
        "/api/witness/health_check",
        &json!([late, early, late, proof_of(&new_hex)]),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let text = r.text();
    let at = |p: &str| {
        text.find(&format!("\"{p}\""))
            .unwrap_or_else(|| panic!("{p}: {text}"))
    };
    assert!(
        at(&late) < at(&early) && at(&early) < at(&proof_of(&new_hex)),
        "{text}"
    );
    assert_eq!(text.matches(&late).count(), 1, "{text}");
    assert_eq!(r.json()["results"].as_object().unwrap().len(), 3, "{text}");
    assert_eq!(act(&s, &d.buyer, id, "pickup").status, 200);
    let states = s
        .post_json("/api/witness/health_check", &json!([proof_of(&new_hex)]))
        .json();
    assert_eq!(
        states["results"][&proof_of(&new_hex)],
        json!({"spent": true, "state": "burned", "contract_id": id})
    );
    // A spent secret cannot be replaced again.
    let r = s.post_json(
        "/api/witness/replace",
        &json!({"secrets": [format!("n:{id}:secret:{secret_hex}")], "new_secrets": [format!("n:{id}:secret:{}", "33".repeat(32))]}),
    );
    assert_eq!(r.status, 400);
    // 64 bytes that are not 64 hex digits (a sign, a character of three
    // bytes across a digit pair) are refused as input, not a 500.
    for bad in [
        format!("+f{}", "0".repeat(62)),
        format!("a€{}", "0".repeat(60)),
    ] {
        let r = s.post_json(
            "/api/witness/replace",
            &json!({"secrets": [format!("n:{id}:secret:{bad}")], "new_secrets": [format!("n:{id}:secret:{}", "55".repeat(32))]}),
        );
        assert_eq!(
            (r.status, r.code().as_str()),
            (400, "invalid_request"),
            "{bad}: {}",
            r.text()
        );
        // Refused for its form: the sign was once decoded as a digit, and
        // then only the (not live) proof made it a 400.
        assert!(
            r.text().contains("witness secrets look like"),
            "{bad}: {}",
            r.text()
        );
    }
}

#[test]
fn sixteen_simultaneous_accepts_one_wins() {
    let s = Server::start();
    let d = deal(&s);
    let id = new_contract(&s, &d);
    let addr = s.addr;
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let ts = now_s() - i;
            let sig = d
                .seller
                .sign(&format!("accept:{id}:{}:{ts}", d.seller.fp()));
            let body =
                json!({"seller_fingerprint": d.seller.fp(), "signature": sig, "timestamp": ts})
                    .to_string();
            let path = format!("/api/arbitration/contracts/{id}/accept");
            std::thread::spawn(move || {
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
    let results: Vec<common::Resp> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let wins = results.iter().filter(|r| r.status == 200).count();
    assert_eq!(
        wins,
        1,
        "{:?}",
        results.iter().map(|r| r.text()).collect::<Vec<_>>()
    );
    assert!(
        results
            .iter()
            .filter(|r| r.status != 200)
            .all(|r| r.status == 409 && r.code() == "invalid_transition")
    );
    let history = s.get(&format!("/api/arbitration/contracts/{id}")).json()["history"].clone();
    assert_eq!(
        history
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h["action"] == "accept")
            .count(),
        1
    );
}

/// Under pickup-paid, the settling pickup pays the fee fixed when the
/// contract was bought, whatever the fee component quotes by then (here
/// the operator raised `arbitration_percent` from 3 to 5 between buy and
/// pickup).
#[test]
fn pickup_paid_charges_the_fee_fixed_at_buy() {
    use common::deal as flow;
    let pickup_paid = (
        "MARKETPLACE_PLUGIN_FEES".to_string(),
        "fees_pickup_paid.wasm".to_string(),
    );
    let mut first = Server::with(common::Options {
        env: vec![pickup_paid.clone()],
        ..Default::default()
    });
    let d = flow::deal(&first);
    let id = flow::buy(&first, &d, "1");
    flow::act_ok(&first, &d.seller, &id, "accept");
    flow::act_ok(&first, &d.seller, &id, "deliver");
    first.kill();

    let s = Server::with(common::Options {
        config: Some("[settings.fees]\narbitration_percent = 5\n".into()),
        env: vec![pickup_paid],
        data_dir: Some(first.data_dir.clone()),
        ..Default::default()
    });
    // The component in force now quotes 5 %.
    let fees = s.get("/api/fees").json();
    assert_eq!(fees["arbitration"]["rate"], "0.05", "{fees}");
    // The contract still asks for its 3 %.
    let unpaid = flow::act(&s, &d.buyer, &id, "pickup");
    assert_eq!(unpaid.status, 402, "{}", unpaid.text());
    assert_eq!(unpaid.json()["required_amount"], "0.03");
    let paid = s.post_paid(
        &flow::action_path(&id, "pickup"),
        &s.mint("0.03"),
        &flow::action_body(&d.buyer, &id, "pickup"),
    );
    assert_eq!(paid.status, 200, "{}", paid.text());
    let doc = paid.json();
    assert_eq!(doc["status"], "settled");
    assert_eq!(doc["payment"]["price"], "0.03");
    // And the seller is paid the whole amount.
    let payout = flow::act_ok(&s, &d.seller, &id, "pickup");
    assert_eq!(payout["payout_amount"], "1");
}

/// The seller's release (PROTOCOL 10): tracking number, carrier and the
/// contract's current witness secret move it from active to delivered; a
/// wrong witness secret is 403 forbidden_party.
#[test]
fn the_seller_releases_a_shipment_with_the_witness_secret() {
    let s = Server::start();
    let d = deal(&s);
    let id = "CTR_ship_1";
    let secret_hex = "5a".repeat(32);
    let proof = witness_proof(id, &secret_hex);
    let r = buy(
        &s,
        &d,
        "1",
        json!({"contract_id": id, "witness_proof": proof}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(act(&s, &d.seller, id, "accept").status, 200);
    let tracking = |witness: &str| json!({"tracking_number": "1Z999", "tracking_carrier": "UPS", "witness_secret": witness});
    let wrong = format!("n:{id}:secret:{}", "5b".repeat(32));
    let r = act_with(
        &s,
        &d.seller,
        id,
        "release",
        tracking(&wrong),
        Some(fresh_ts(0)),
        None,
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "forbidden_party"),
        "{}",
        r.text()
    );
    assert_eq!(status(&s, id)["status"], "active");
    let right = format!("n:{id}:secret:{secret_hex}");
    // The original client signs the legacy form.
    let r = act_with(&s, &d.seller, id, "release", tracking(&right), None, None);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "delivered");
    // The buyer's pickup then settles and shows the shipment.
    let cert = act(&s, &d.buyer, id, "pickup").json();
    assert_eq!(cert["status"], "settled");
    assert_eq!(cert["delivered_text"], "UPS: 1Z999");
}

/// A contract bought without a witness takes no witness secret: one sent
/// anyway names a witness it does not have and is refused (deliver's
/// `witness_mismatch`, the seller's release `forbidden_party`), while none
/// (or `""`) goes through.
#[test]
fn a_contract_without_a_witness_refuses_a_witness_secret() {
    let s = Server::start();
    let d = deal(&s);
    let bogus = format!("n:CTR_x:secret:{}", "5b".repeat(32));
    let id = contract_in(&s, &d, "active");
    let deliver = |witness: &str| {
        act_with(
            &s,
            &d.seller,
            &id,
            "deliver",
            json!({"delivered_text": "the logo files", "witness_secret": witness}),
            Some(fresh_ts(0)),
            None,
        )
    };
    let r = deliver(&bogus);
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "witness_mismatch"),
        "{}",
        r.text()
    );
    assert!(
        r.json()["message"]
            .as_str()
            .unwrap_or_default()
            .contains("no witness"),
        "{}",
        r.text()
    );
    assert_eq!(status(&s, &id)["status"], "active");
    let r = deliver("");
    assert_eq!(r.status, 200, "{}", r.text());

    let id = contract_in(&s, &d, "active");
    let release = |extra: Value| {
        act_with(
            &s,
            &d.seller,
            &id,
            "release",
            extra,
            Some(fresh_ts(0)),
            None,
        )
    };
    let r = release(json!({"tracking_number": "1Z999", "witness_secret": "xyz"}));
    assert_eq!(
        (r.status, r.code().as_str()),
        (403, "forbidden_party"),
        "{}",
        r.text()
    );
    assert_eq!(status(&s, &id)["status"], "active");
    let r = release(json!({"tracking_number": "1Z999"}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["status"], "delivered");
}

/// Members an action does not read are unknown to it, and ignored
/// (PROTOCOL 1), whatever their type: a witness secret or tracking number
/// of another type on an accept, a refund or a deliver's tracking. Before,
/// every action checked them (400 "must be a string"), though only
/// deliver and release read the witness secret and only release the
/// tracking.
#[test]
fn members_an_action_does_not_read_are_ignored() {
    let s = Server::start();
    let d = deal(&s);
    let by_seller = |id: &str, action: &str, extra: Value| {
        act_with(&s, &d.seller, id, action, extra, Some(fresh_ts(0)), None)
    };
    let odd = json!({"witness_secret": {}, "tracking_number": 5, "tracking_carrier": [1]});
    let id = new_contract(&s, &d);
    let r = by_seller(&id, "accept", odd.clone());
    assert_eq!(r.status, 200, "accept: {}", r.text());
    let mut deliver = json!({"delivered_text": "the logo files"});
    deliver["tracking_number"] = json!(5);
    deliver["tracking_carrier"] = json!({});
    let r = by_seller(&id, "deliver", deliver);
    assert_eq!(r.status, 200, "deliver: {}", r.text());
    let id = contract_in(&s, &d, "active");
    let r = by_seller(&id, "refund", odd.clone());
    assert_eq!(r.status, 200, "refund: {}", r.text());
    // Where the action reads the member, its type still counts.
    let id = contract_in(&s, &d, "active");
    let r = by_seller(&id, "release", odd);
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
}

/// The arbiter signature (PROTOCOL 10): `arbiter_signature` on the buy
/// answer and the contract verifies under the key `{ arbiterPubkey }`
/// gives, over the canonical message computed here independently.
#[test]
fn the_arbiter_signs_what_it_issues() {
    use ed25519_dalek::{Signature, VerifyingKey};
    let s = Server::start();
    let d = deal(&s);
    // A deadline is kept to the second, as it is shown and signed.
    let deadline = "2031-05-01T12:00:00Z";
    let r = buy(
        &s,
        &d,
        "1.5",
        json!({"work_spec": "three logo drafts", "delivery_deadline": "2031-05-01T12:00:00.750Z"}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let bought = r.json();
    let id = bought["contract_id"].as_str().unwrap().to_string();
    let key_doc = s
        .post_json("/api/graphql", &json!({"query": "{ arbiterPubkey }"}))
        .json();
    let key_hex = key_doc["data"]["arbiterPubkey"]
        .as_str()
        .unwrap()
        .to_string();
    assert_eq!(key_hex.len(), 64);
    let fields = [
        id.clone(),
        d.buyer.fp(),
        "150000000".to_string(),
        deadline.to_string(),
        "service".to_string(),
        "three logo drafts".to_string(),
        d.post.clone(),
        d.buyer.fp(),
    ];
    let message = issue_message(&fields);
    let unhex = |s: &str| -> Vec<u8> {
        (0..s.len() / 2)
            .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    };
    let key = VerifyingKey::from_bytes(&unhex(&key_hex).try_into().unwrap()).unwrap();
    let sig_hex = bought["arbiter_signature"].as_str().unwrap();
    let sig = Signature::from_bytes(&unhex(sig_hex).try_into().unwrap());
    assert!(key.verify_strict(message.as_bytes(), &sig).is_ok());
    // The contract document carries the same signature and the signed terms.
    let doc = s.get(&format!("/api/arbitration/contracts/{id}")).json();
    assert_eq!(doc["arbiter_signature"], sig_hex);
    assert_eq!(doc["work_spec"], "three logo drafts");
    assert_eq!(doc["delivery_deadline"], deadline);
    // A contract without a work_spec signs the default text, and its
    // document shows that text, so the signature checks from its fields.
    let plain = buy(&s, &d, "1", json!({})).json();
    assert!(
        plain["arbiter_signature"]
            .as_str()
            .is_some_and(|s| s.len() == 128)
    );
    assert_eq!(plain["contract"]["work_spec"], "Contract deliverable");
    let plain_id = plain["contract_id"].as_str().unwrap();
    let plain_doc = s
        .get(&format!("/api/arbitration/contracts/{plain_id}"))
        .json();
    assert_eq!(plain_doc["work_spec"], "Contract deliverable");
    assert_eq!(plain_doc["arbiter_signature"], plain["arbiter_signature"]);
    let text = |k: &str| plain_doc[k].as_str().unwrap().to_string();
    let message = issue_message(&[
        text("contract_id"),
        text("buyer_fingerprint"),
        "100000000".to_string(), // "1" in units of 1e-8
        text("delivery_deadline"),
        text("contract_type"),
        text("work_spec"),
        text("reference_post"),
        text("buyer_fingerprint"),
    ]);
    let sig = Signature::from_bytes(&unhex(&text("arbiter_signature")).try_into().unwrap());
    assert!(key.verify_strict(message.as_bytes(), &sig).is_ok());
    // Terms given as an object are kept as given and signed as their
    // compact JSON with keys sorted (README, "Contracts").
    let terms = json!({"zeta": [1, "two"], "alpha": {"b": true, "a": null}});
    let r = buy(&s, &d, "1", json!({"work_spec": terms}));
    assert_eq!(r.status, 201, "{}", r.text());
    let obj_doc = s
        .get(&format!(
            "/api/arbitration/contracts/{}",
            r.json()["contract_id"].as_str().unwrap()
        ))
        .json();
    assert_eq!(obj_doc["work_spec"], terms);
    let text = |k: &str| obj_doc[k].as_str().unwrap().to_string();
    let message = issue_message(&[
        text("contract_id"),
        text("buyer_fingerprint"),
        "100000000".to_string(),
        text("delivery_deadline"),
        text("contract_type"),
        r#"{"alpha":{"a":null,"b":true},"zeta":[1,"two"]}"#.to_string(),
        text("reference_post"),
        text("buyer_fingerprint"),
    ]);
    let sig = Signature::from_bytes(&unhex(&text("arbiter_signature")).try_into().unwrap());
    assert!(key.verify_strict(message.as_bytes(), &sig).is_ok());
    // GraphQL: named queries work; other fields are GraphQL errors, not 404.
    let named = s
        .post_json(
            "/api/graphql",
            &json!({"query": "query Key { arbiterPubkey }"}),
        )
        .json();
    assert_eq!(named["data"]["arbiterPubkey"], key_hex.as_str());
    let other = s.post_json("/api/graphql", &json!({"query": "{ contracts { id } }"}));
    assert_eq!(other.status, 200);
    assert!(other.json()["errors"][0]["message"].is_string());
    let malformed = s.post_json("/api/graphql", &json!(["not a query"]));
    assert_eq!(
        (malformed.status, malformed.code().as_str()),
        (400, "invalid_request")
    );
    assert!(malformed.json()["errors"][0]["message"].is_string());
    // `variables` and `operationName` of another type than GraphQL over
    // HTTP allows are refused the same way (null, an object, a name pass).
    for (field, bad) in [
        ("variables", json!([null, null])),
        ("variables", json!("x")),
        ("operationName", json!(5)),
        ("operationName", json!({})),
    ] {
        let mut body = json!({"query": "{ arbiterPubkey }"});
        body[field] = bad;
        let r = s.post_json("/api/graphql", &body);
        assert_eq!(
            (
                r.status,
                r.code().as_str(),
                r.json()["details"][0]["field"].as_str()
            ),
            (400, "invalid_request", Some(field)),
            "{body}: {}",
            r.text()
        );
        assert!(r.json()["errors"][0]["message"].is_string());
    }
    let fine = s.post_json(
        "/api/graphql",
        &json!({"query": "query Key { arbiterPubkey }", "variables": {}, "operationName": "Key"}),
    );
    assert_eq!(fine.json()["data"]["arbiterPubkey"], key_hex.as_str());
    let nulls = s.post_json(
        "/api/graphql",
        &json!({"query": "{ arbiterPubkey }", "variables": null, "operationName": null}),
    );
    assert_eq!(nulls.json()["data"]["arbiterPubkey"], key_hex.as_str());
    // An operation name the query does not have is a GraphQL error.
    for (query, name) in [
        ("{ arbiterPubkey }", "Nope"),
        ("query Key { arbiterPubkey }", "Ke"),
    ] {
        let r = s.post_json(
            "/api/graphql",
            &json!({"query": query, "operationName": name}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        assert!(r.json()["data"].is_null(), "{}", r.text());
        assert!(
            r.text()
                .contains(&format!("Unknown operation named \\\"{name}\\\"")),
            "{}",
            r.text()
        );
    }
    // The document's maxLength of 10,000 is in characters: one more is the
    // body's 400; 10,000 two-byte ones are a query (here a wrong one).
    let long = format!("{{ arbiterPubkey }}{}", " ".repeat(9_984));
    let r = s.post_json("/api/graphql", &json!({"query": long}));
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["details"][0]["field"], "query");
    let wide = format!("{{ arbiterPubkey }}{}", "é".repeat(9_983));
    let r = s.post_json("/api/graphql", &json!({"query": wide}));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json()["errors"][0]["message"].is_string());
    // A body the JSON parser refuses names the body and why.
    let r = s.request(
        "POST",
        "/api/graphql",
        &[("content-type", "application/json")],
        Some(br#"{"query": "{ arbiterPubkey }", "x": 1e400}"#),
    );
    assert_eq!(
        (r.status, r.code().as_str()),
        (400, "invalid_request"),
        "{}",
        r.text()
    );
    assert_eq!(r.json()["details"][0]["field"], "body", "{}", r.text());
    assert!(r.text().contains("number out of range"), "{}", r.text());
    assert_eq!(
        s.post_json("/api/v1/graphql", &json!({"query": "{ arbiterPubkey }"}))
            .status,
        200
    );
}

/// Every member a contract answer carries is in the served OpenAPI
/// document, at every depth its schema describes: a buy, each action, the
/// certificate, a payout and a refund, a refused transition and a second
/// legacy pickup (PROTOCOL 1, 7 and 10 name their extra members).
#[test]
fn contract_answers_hold_only_documented_members() {
    let s = Server::start();
    let doc = s.get("/openapi.json").json();
    let check = |method: &str, path: &str, r: &common::Resp| {
        common::assert_documented(&doc, method, path, r.status, &r.json());
    };
    let action = "/api/arbitration/contracts/{id}/";
    let d = deal(&s);
    let r = buy(&s, &d, "1", json!({"encrypted_witness_secret": "opaque"}));
    assert_eq!(r.status, 201, "{}", r.text());
    check("POST", "/api/arbitration/contracts/buy", &r);
    let id = r.json()["contract_id"].as_str().unwrap().to_string();
    for (key, step) in [
        (&d.seller, "accept"),
        (&d.seller, "deliver"),
        (&d.buyer, "pickup"),
    ] {
        let r = act(&s, key, &id, step);
        assert_eq!(r.status, 200, "{step}: {}", r.text());
        check("POST", &format!("{action}{step}"), &r);
        if step == "accept" {
            assert_eq!(r.json()["witness_secret_encrypted_for_seller"], "opaque");
        }
    }
    let r = s.get(&format!("/api/arbitration/contracts/{id}"));
    check("GET", "/api/arbitration/contracts/{id}", &r);
    let r = act(&s, &d.seller, &id, "deliver");
    assert_eq!((r.status, r.code().as_str()), (409, "invalid_transition"));
    check("POST", &format!("{action}deliver"), &r);
    // The payout under a legacy signature, then again: 409 with `issued`.
    for want in [200, 409] {
        let r = act_with(&s, &d.seller, &id, "pickup", json!({}), None, None);
        assert_eq!(r.status, want, "{}", r.text());
        check("POST", &format!("{action}pickup"), &r);
    }
    // A refund.
    let id = new_contract(&s, &d);
    for step in ["refund", "pickup"] {
        let r = act(&s, &d.buyer, &id, step);
        assert_eq!(r.status, 200, "{step}: {}", r.text());
        check("POST", &format!("{action}{step}"), &r);
    }
}
