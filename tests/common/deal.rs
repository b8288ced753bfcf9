//! Shared flows of the black-box tests: raw admin requests, fresh
//! timestamps, and a buyer/seller deal through the contract actions.

use super::{Key, Resp, Server, now_s};
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

/// An authenticated admin request with raw bytes as the body.
pub fn admin(s: &Server, method: &str, path: &str, body: &[u8]) -> Resp {
    s.admin_raw(method, path, Some(body))
}

/// A timestamp inside the freshness window that no earlier call returned,
/// so no two fresh signatures of a test collide.
pub fn fresh_ts() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let floor = now_s() - 280;
    let mut prev = LAST.load(Ordering::Relaxed);
    loop {
        let next = (prev + 1).max(floor);
        match LAST.compare_exchange(prev, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(p) => prev = p,
        }
    }
}

static NICK: AtomicU64 = AtomicU64::new(0);

pub fn nick(role: &str) -> String {
    format!("{role}{}", NICK.fetch_add(1, Ordering::Relaxed))
}

pub struct Deal {
    pub buyer: Key,
    pub seller: Key,
    pub post: String,
}

pub fn deal(s: &Server) -> Deal {
    let seller = s.identity(&nick("seller"));
    let buyer = s.identity(&nick("buyer"));
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

/// The signed body of a buy.
pub fn buy_body(d: &Deal, amount: &str) -> Value {
    let ts = fresh_ts();
    let msg = format!("buy_contract:{}:{}:::{ts}", d.buyer.fp(), d.post);
    json!({
        "buyer_fingerprint": d.buyer.fp(), "contract_type": "service", "amount": amount,
        "reference_post": d.post, "accept_terms": true, "timestamp": ts,
        "signature": d.buyer.sign(&msg),
    })
}

/// Buy a contract of `amount` (paid exactly); its id.
pub fn buy(s: &Server, d: &Deal, amount: &str) -> String {
    let r = s.post_paid(
        "/api/arbitration/contracts/buy",
        &s.mint(amount),
        &buy_body(d, amount),
    );
    assert_eq!(r.status, 201, "buy: {}", r.text());
    r.json()["contract_id"].as_str().unwrap().to_string()
}

/// The signed body of a contract action by `key` (fresh signature).
pub fn action_body(key: &Key, id: &str, action: &str) -> Value {
    let ts = fresh_ts();
    let (field, message, text) = match action {
        "accept" => (
            "seller_fingerprint",
            format!("accept:{id}:{}", key.fp()),
            None,
        ),
        "deliver" => (
            "actor_fingerprint",
            format!("deliver:{id}:the logo files"),
            Some("the logo files"),
        ),
        "pickup" => ("actor_fingerprint", id.to_string(), None),
        "refund" => ("actor_fingerprint", format!("REFUND:{id}"), None),
        _ => unreachable!(),
    };
    let mut body = json!({
        "timestamp": ts,
        "signature": key.sign(&format!("{message}:{ts}")),
    });
    body[field] = json!(key.fp());
    if let Some(text) = text {
        body["delivered_text"] = json!(text);
    }
    body
}

pub fn action_path(id: &str, action: &str) -> String {
    format!("/api/arbitration/contracts/{id}/{action}")
}

/// A contract action with a fresh signature by `key`.
pub fn act(s: &Server, key: &Key, id: &str, action: &str) -> Resp {
    s.post_json(&action_path(id, action), &action_body(key, id, action))
}

pub fn act_ok(s: &Server, key: &Key, id: &str, action: &str) -> Value {
    let r = act(s, key, id, action);
    assert_eq!(r.status, 200, "{action} {id}: {}", r.text());
    r.json()
}
