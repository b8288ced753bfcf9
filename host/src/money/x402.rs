//! x402 v2 beside the native payment headers (PROTOCOL 3).
//!
//! The headers carry base64 (standard alphabet, padded, as the x402 SDKs
//! encode them) of JSON:
//! - every 402 also carries `PAYMENT-REQUIRED`: `{x402Version: 2, error,
//!   resource, accepts: [the webcash rail], extensions}`, built from the 402
//!   body the payment gate wrote;
//! - a request may pay with `PAYMENT-SIGNATURE`: `{x402Version: 2, accepted,
//!   payload: {secret}}`; its secret is used exactly as `X-Cash-Secret`, and
//!   a malformed header is `402 payment_invalid`;
//! - a paid answer carries `PAYMENT-RESPONSE`: `{success, transaction,
//!   network, payer, amount, extra: {change}}`.
//!
//! The `payment-identifier` extension (`extensions["payment-identifier"]
//! .info.id`) is an idempotency key. A paid answer is kept (through the
//! ledger's kept answers, so with its secrets replaced by their derivations
//! and pruned by retention like them) under the id and the request
//! (method, path, SHA-256 of the body), and a `409 idempotency_conflict`
//! is kept under the id alone: the same id and request get the stored
//! answer, the same id with another request gets the 409.
//!
//! `PAYMENT-RESPONSE` holds the change secret, which a kept answer must not
//! hold in plain text: the header is built as JSON text (which the ledger's
//! kept answers take secrets out of, like the body) and turned into base64
//! only on the way out ([`sent`]), both for a live answer and a replayed one.

use crate::money::ledger::{Charge, Derivation, Ledger};
use crate::reply::{CASH_HEADERS, Reply};
use crate::store::{Kv, WriteTxn};
use marketplace_common::{amount, secret};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// The x402 version spoken.
pub const VERSION: u64 = 2;
/// Header names (defined with the answers, which name the host's own).
pub use crate::reply::{PAYMENT_REQUIRED, PAYMENT_RESPONSE, PAYMENT_SIGNATURE};
/// The webcash rail's `accepts` entry.
pub const SCHEME: &str = "exact";
pub const NETWORK: &str = "webcash:mainnet";
pub const ASSET: &str = "webcash";
pub const MAX_TIMEOUT_SECONDS: u64 = 300;
/// The idempotency extension and its id's length bounds.
pub const PAYMENT_IDENTIFIER: &str = "payment-identifier";
pub const ID_MIN: usize = 16;
pub const ID_MAX: usize = 128;
/// Largest `PAYMENT-SIGNATURE` value read (base64 characters).
const MAX_SIGNATURE: usize = 16 * 1024;

/// What a request's `PAYMENT-SIGNATURE` header said (its secret goes into
/// `payments::PaymentHeaders::cash` when no cash header is given).
#[derive(Debug, Clone, Default)]
pub struct Signature {
    /// The secret and payment identifier of the header, once given (a
    /// second, different payment is refused; the same one again is one
    /// payment).
    pub seen: Option<(String, Option<String>)>,
    /// Why the header was refused: the request is `402 payment_invalid`
    /// wherever it has to pay.
    pub invalid: Option<String>,
    /// The `payment-identifier` id, when one was given.
    pub id: Option<String>,
    /// `accepted.amount`: the most the payer agreed to pay (units), when
    /// given. A price above it (changed since the 402) is not charged.
    pub accepted: Option<u64>,
    /// Keys of the idempotency records, set once the lookup found none.
    pub keys: Option<IdempotencyKeys>,
}

/// Where the answer of a request with a payment identifier is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdempotencyKeys {
    /// The id, the paying secret and the request: the stored answer.
    pub request: [u8; 32],
    /// The id and the request, whoever pays: the stored answer when it
    /// carries no secret (a retry may pay with a new payload, as x402
    /// clients do; an answer with change is only for its own payer).
    pub any_payer: [u8; 32],
    /// The id alone: the `409 idempotency_conflict` for any other request.
    pub id: [u8; 32],
}

/// Read a `PAYMENT-SIGNATURE` header into `signature`: its secret,
/// which pays unless `X-Cash-Secret` (or its alias) is given too. A
/// second, different payment (another line of the header, or an MCP call's
/// `_meta` payment beside the header) is refused: which one pays would be
/// a guess. The same payment again (same secret and payment identifier:
/// a client that sends its payment both ways) is one payment.
pub fn read_signature(signature: &mut Signature, value: &str) -> Option<String> {
    let (secret, id, accepted) = match parse_signature(value) {
        Ok(read) => read,
        Err(why) => {
            signature.invalid = Some(why);
            return None;
        }
    };
    match &signature.seen {
        Some((first, first_id)) if *first == secret && *first_id == id => None,
        Some(_) => {
            signature.invalid = Some(
                "was sent twice with different payments (two lines of the header, or the header and an MCP call's _meta[\"x402/payment\"]): send one".into(),
            );
            None
        }
        None => {
            signature.seen = Some((secret.clone(), id.clone()));
            signature.id = id;
            signature.accepted = accepted;
            Some(secret)
        }
    }
}

/// The secret, payment identifier and accepted amount (units) of a
/// `PAYMENT-SIGNATURE` value.
pub fn parse_signature(value: &str) -> Result<(String, Option<String>, Option<u64>), String> {
    let value = value.trim();
    if value.len() > MAX_SIGNATURE {
        return Err(format!("is over {MAX_SIGNATURE} characters"));
    }
    let raw = base64_decode(value).ok_or("is not base64")?;
    let doc: Value =
        serde_json::from_slice(&raw).map_err(|_| "is not base64 of a JSON object".to_string())?;
    let Value::Object(doc) = doc else {
        return Err("is not base64 of a JSON object".into());
    };
    if doc.get("x402Version").and_then(Value::as_u64) != Some(VERSION) {
        return Err(format!("must have x402Version {VERSION}"));
    }
    let accepted = doc
        .get("accepted")
        .and_then(Value::as_object)
        .ok_or("must have `accepted`: one entry of the 402's `accepts`")?;
    let field = |name: &str| accepted.get(name).and_then(Value::as_str);
    if field("scheme") != Some(SCHEME) || field("network") != Some(NETWORK) {
        return Err(format!(
            "`accepted` must be the {SCHEME} {NETWORK} entry of the 402's `accepts`"
        ));
    }
    if accepted.get("asset").is_some_and(|a| a != ASSET) {
        return Err(format!("`accepted.asset` must be {ASSET}"));
    }
    // Paying someone else (another server's entry) is not paying here.
    if accepted
        .get("payTo")
        .is_some_and(|p| p != crate::config::SERVICE_NAME)
    {
        return Err(format!(
            "`accepted.payTo` must be {}, as the 402's entry says",
            crate::config::SERVICE_NAME
        ));
    }
    // The price as the 402 gave it: units of 1e-8 as a string of digits,
    // the most the payer agreed to pay (a price risen since the 402 is
    // refused at the charge; a lower one is charged).
    let amount =
        match accepted.get("amount") {
            None => None,
            Some(a) => Some(a.as_str().and_then(marketplace_common::uint::parse).ok_or(
                "`accepted.amount` must be the 402's amount: units as a string of digits",
            )?),
        };
    let secret = doc
        .get("payload")
        .and_then(|p| p.get("secret"))
        .and_then(Value::as_str)
        .ok_or("must have `payload.secret`: e<amount>:secret:<hex>")?;
    let id = match doc
        .get("extensions")
        .and_then(|e| e.get(PAYMENT_IDENTIFIER))
        .and_then(|e| e.get("info"))
        .and_then(|i| i.get("id"))
    {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if valid_id(id) => Some(id.clone()),
        Some(_) => {
            return Err(format!(
                "payment-identifier id must be {ID_MIN} to {ID_MAX} of A-Z a-z 0-9 _ -"
            ));
        }
    };
    Ok((secret.trim().to_string(), id, amount))
}

fn valid_id(id: &str) -> bool {
    (ID_MIN..=ID_MAX).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// The `accepts` entry of the webcash rail for a price in units.
pub fn webcash_requirements(price: u64) -> Value {
    json!({
        "scheme": SCHEME,
        "network": NETWORK,
        "asset": ASSET,
        "amount": price.to_string(),
        "payTo": crate::config::SERVICE_NAME,
        "maxTimeoutSeconds": MAX_TIMEOUT_SECONDS,
        "extra": {"header": CASH_HEADERS[0], "price": amount::format(price)},
    })
}

/// The declaration of the `payment-identifier` extension (optional), as
/// the x402 SDKs' `declare_payment_identifier_extension()` writes it: a
/// client's SDK adds its id only to a 402 that declares it.
fn identifier_declaration() -> Value {
    json!({
        "info": {"required": false},
        "schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {
                "required": {"type": "boolean"},
                "id": {
                    "type": "string",
                    "minLength": ID_MIN,
                    "maxLength": ID_MAX,
                    "pattern": "^[a-zA-Z0-9_-]+$",
                },
            },
            "required": ["required"],
        },
    })
}

/// The `PAYMENT-REQUIRED` document of a 402 body of the payment gate
/// (`required_amount`, `message`, `payment.action`), for the resource at
/// `url`.
pub fn payment_required(body: &Value, url: &str) -> Value {
    let price = body
        .get("required_amount")
        .or_else(|| body.pointer("/payment/price"))
        .and_then(Value::as_str)
        .and_then(|p| amount::parse(p).ok());
    let action = body
        .pointer("/payment/action")
        .and_then(Value::as_str)
        .unwrap_or("request");
    let error = body
        .get("message")
        .or_else(|| body.get("code"))
        .and_then(Value::as_str)
        .unwrap_or("payment required");
    let description = match price {
        Some(p) => format!(
            "{} action `{action}`: {} webcash",
            crate::config::SERVICE_NAME,
            amount::format(p)
        ),
        None => format!("{} action `{action}`", crate::config::SERVICE_NAME),
    };
    json!({
        "x402Version": VERSION,
        "error": error,
        "resource": {"url": url, "description": description, "mimeType": "application/json"},
        "accepts": price.map(webcash_requirements).into_iter().collect::<Vec<_>>(),
        "extensions": {PAYMENT_IDENTIFIER: identifier_declaration()},
    })
}

/// Add `PAYMENT-REQUIRED` to a 402 answered to a request for `path` with
/// these (non-payment) headers.
pub fn add_required(reply: &mut Reply, path: &str, headers: &[(String, String)]) {
    if reply.status != 402
        || reply
            .headers
            .iter()
            .any(|(n, _)| n.eq_ignore_ascii_case(PAYMENT_REQUIRED))
    {
        return;
    }
    let body = serde_json::from_slice::<Value>(&reply.body).unwrap_or(Value::Null);
    let url = format!("{}{path}", base_url(headers));
    let doc = payment_required(&body, &url);
    reply.headers.push((
        PAYMENT_REQUIRED.into(),
        base64_encode(doc.to_string().as_bytes()),
    ));
}

/// A 402 of a request whose client wrote another path than the route's
/// (`/api/v1/...`, the alias): its `PAYMENT-REQUIRED` resource names the
/// path the client asked for, which x402 clients compare with.
pub fn name_resource(reply: &mut Reply, routed: &str, asked: &str) {
    if reply.status != 402 {
        return;
    }
    for (name, value) in reply.headers.iter_mut() {
        if !name.eq_ignore_ascii_case(PAYMENT_REQUIRED) {
            continue;
        }
        let Some(mut doc) =
            base64_decode(value).and_then(|raw| serde_json::from_slice::<Value>(&raw).ok())
        else {
            continue;
        };
        let Some(url) = doc["resource"]["url"].as_str() else {
            continue;
        };
        if let Some(base) = url.strip_suffix(routed) {
            doc["resource"]["url"] = json!(format!("{base}{asked}"));
            *value = base64_encode(doc.to_string().as_bytes());
        }
    }
}

/// `http(s)://{host}` of the request, or "" (a relative URL).
fn base_url(headers: &[(String, String)]) -> String {
    let header = |name| crate::reply::header_of(headers, name);
    marketplace_common::url::base_url(header("host"), header("x-forwarded-proto"))
}

/// The settlement document of a charge, as JSON text: its members in
/// name order, as a `serde_json::Value` (a sorted map) wrote them, written
/// straight from the charge (no map built per paid answer).
pub fn settlement(charge: &Charge) -> String {
    #[derive(serde::Serialize)]
    struct Extra<'a> {
        change: &'a Option<String>,
    }
    #[derive(serde::Serialize)]
    struct Settlement<'a> {
        amount: &'a str,
        extra: Extra<'a>,
        network: &'a str,
        payer: &'a str,
        success: bool,
        transaction: &'a str,
    }
    let mut price = itoa::Buffer::new();
    serde_json::to_string(&Settlement {
        amount: price.format(charge.price),
        extra: Extra {
            change: &charge.change,
        },
        network: NETWORK,
        payer: "",
        success: true,
        transaction: &secret::public_string(charge.paid, &charge.public),
    })
    .expect("strings and a bool serialize")
}

/// Add `PAYMENT-RESPONSE` to the answer of a paid request, as JSON text
/// until [`sent`] encodes it (so a kept answer holds no change secret).
pub fn add_response(reply: &mut Reply, charge: &Charge) {
    if charge.public.is_empty() {
        return;
    }
    reply
        .headers
        .push((PAYMENT_RESPONSE.into(), settlement(charge)));
}

/// An answer on its way out: its `PAYMENT-RESPONSE` in base64.
pub fn sent(mut reply: Reply) -> Reply {
    for (name, value) in reply.headers.iter_mut() {
        if name.eq_ignore_ascii_case(PAYMENT_RESPONSE) && value.starts_with('{') {
            *value = base64_encode(value.as_bytes());
        }
    }
    reply
}

/// The keys of the idempotency records of a request with payment
/// identifier `id`.
/// `payer` is the public hash of the secret that pays (empty without one):
/// an answer that carries that payment's change is only for the same
/// payment; anyone else who knows the identifier gets the 409.
pub fn keys(id: &str, payer: &str, method: &str, path: &str, body: &[u8]) -> IdempotencyKeys {
    let base = || {
        let mut h = Sha256::new();
        h.update(b"x402:payment-identifier\0");
        h.update(id.as_bytes());
        h
    };
    // The request as the native replay key names it, with the payer (a
    // public hash: hex, so never the marker of "any payer").
    let request = |payer: &str| {
        let mut h = base();
        h.update([0]);
        h.update(crate::money::ledger::replay_key(payer, method, path, body));
        h.finalize().into()
    };
    IdempotencyKeys {
        request: request(payer),
        any_payer: request("any payer"),
        id: base().finalize().into(),
    }
}

/// The answer kept for a request with a payment identifier: the stored
/// answer of the same request, or the 409 of another one; None when the
/// id is new (its record keys are then noted in `signature`). `payer`: the
/// public hash of the secret the request presents (its
/// `payments::RetryKey`'s), empty without one.
#[allow(clippy::too_many_arguments)]
pub fn lookup(
    ledger: &Ledger,
    kv: &impl Kv,
    since_ms: u64,
    signature: &mut Signature,
    payer: &str,
    method: &str,
    path: &str,
    body: &[u8],
) -> Option<Reply> {
    let id = signature.id.as_deref()?;
    let keys = keys(id, payer, method, path, body);
    if let Some(kept) = kept(ledger, kv, since_ms, &keys) {
        return Some(kept);
    }
    signature.keys = Some(keys);
    None
}

/// (Answers recorded before `since_ms` are past the retry horizon.)
fn kept(ledger: &Ledger, kv: &impl Kv, since_ms: u64, keys: &IdempotencyKeys) -> Option<Reply> {
    if let Some(stored) = ledger
        .replay(kv, &keys.request, since_ms)
        .or_else(|| ledger.replay(kv, &keys.any_payer, since_ms))
    {
        tracing::info!("payment identifier seen before: stored response replayed");
        return Some(sent(stored));
    }
    ledger.replay(kv, &keys.id, since_ms)
}

/// The answer kept under this request's payment identifier, if it came
/// with one and another request's answer is kept there (read in `kv`).
pub fn kept_for(
    ledger: &Ledger,
    kv: &impl Kv,
    since_ms: u64,
    signature: &Signature,
) -> Option<Reply> {
    kept(ledger, kv, since_ms, signature.keys.as_ref()?)
}

/// In a paid request's transaction, just before it commits: the answer
/// another request with the same payment identifier committed meanwhile,
/// if one did (this request's charge is then not kept). None for a request
/// that was not charged (nothing is kept under its id).
pub fn answered_meanwhile(
    ledger: &Ledger,
    txn: &WriteTxn,
    since_ms: u64,
    signature: &Signature,
    charged: Option<&Charge>,
) -> Option<Reply> {
    if charged.is_none_or(|c| c.public.is_empty()) {
        return None;
    }
    kept(ledger, txn, since_ms, signature.keys.as_ref()?)
}

/// Keep a paid answer under its payment identifier (same transaction as
/// the charge), its secrets replaced by their derivations.
pub fn record(
    txn: &WriteTxn,
    signature: &Signature,
    reply: &Reply,
    issued: &[(String, Derivation)],
    now_ms: u64,
) -> anyhow::Result<()> {
    let (Some(keys), Some(id)) = (&signature.keys, &signature.id) else {
        return Ok(());
    };
    Ledger::record_replay_at(txn, &keys.request, reply, issued, now_ms)?;
    let conflict = |message: String| {
        Reply::json(
            409,
            &json!({"code": "idempotency_conflict", "message": message, "payment_identifier": id}),
        )
    };
    if issued.is_empty() {
        Ledger::record_replay_at(txn, &keys.any_payer, reply, issued, now_ms)?;
    } else {
        // The same request paid by another payload: its answer holds
        // change for the payment that made it only.
        let paid_by_another = conflict(format!(
            "payment identifier {id} was used for this same request paid by another payment, and its answer holds change for that payment only: retry with the same PAYMENT-SIGNATURE to get it"
        ));
        Ledger::record_replay_at(txn, &keys.any_payer, &paid_by_another, &[], now_ms)?;
    }
    let other_request = conflict(format!(
        "payment identifier {id} was used for another request (method, path or body differ)"
    ));
    Ledger::record_replay_at(txn, &keys.id, &other_request, &[], now_ms)
}

/// Standard base64 with padding (Python's `base64.b64encode`).
pub fn base64_encode(data: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Base64, standard or URL-safe alphabet, padded or not.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine;
    use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
    const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true);
    const STANDARD: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::STANDARD, LENIENT);
    const URL_SAFE: GeneralPurpose = GeneralPurpose::new(&base64::alphabet::URL_SAFE, LENIENT);
    let text = text.trim();
    STANDARD
        .decode(text)
        .or_else(|_| URL_SAFE.decode(text))
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b64(v: &Value) -> String {
        base64_encode(v.to_string().as_bytes())
    }

    #[test]
    fn base64_round_trips_like_python() {
        assert_eq!(base64_encode(b""), "");
        assert_eq!(base64_encode(b"f"), "Zg==");
        assert_eq!(base64_encode(b"fo"), "Zm8=");
        assert_eq!(base64_encode(b"foo"), "Zm9v");
        assert_eq!(base64_encode(&[0xfb, 0xff]), "+/8=");
        for s in ["", "f", "fo", "foo", "foob", "fooba", "foobar"] {
            assert_eq!(
                base64_decode(&base64_encode(s.as_bytes())).unwrap(),
                s.as_bytes()
            );
        }
        assert_eq!(base64_decode("-_8").unwrap(), vec![0xfb, 0xff]);
        assert!(base64_decode("Zm9v!").is_none());
        assert!(base64_decode("Z").is_none());
    }

    #[test]
    fn signatures_are_read_or_refused() {
        let secret = format!("e1:secret:{}", "ab".repeat(32));
        let ok = json!({
            "x402Version": 2,
            "accepted": webcash_requirements(30_000_000),
            "payload": {"secret": secret},
            "extensions": {"payment-identifier": {"info": {"required": false, "id": "pay_0123456789abcdef"}}},
        });
        assert_eq!(
            parse_signature(&b64(&ok)).unwrap(),
            (
                secret.clone(),
                Some("pay_0123456789abcdef".to_string()),
                Some(30_000_000)
            )
        );
        let mut p = Signature::default();
        assert_eq!(read_signature(&mut p, &b64(&ok)), Some(secret.clone()));
        assert!(p.invalid.is_none());
        assert_eq!(p.accepted, Some(30_000_000));
        // The same payment again is the same payment (nothing added)...
        assert_eq!(read_signature(&mut p, &b64(&ok)), None);
        assert!(p.invalid.is_none());
        // ...another one is refused.
        let mut other = ok.clone();
        other["payload"]["secret"] = json!(format!("e1:secret:{}", "cd".repeat(32)));
        assert_eq!(read_signature(&mut p, &b64(&other)), None);
        assert!(p.invalid.is_some());
        for bad in [
            json!({"x402Version": 1, "accepted": webcash_requirements(1), "payload": {"secret": secret}}),
            json!({"x402Version": 2, "payload": {"secret": secret}}),
            json!({"x402Version": 2, "accepted": {"scheme": "exact", "network": "eip155:8453"}, "payload": {"secret": secret}}),
            json!({"x402Version": 2, "accepted": {"scheme": "exact", "network": "webcash:mainnet", "payTo": "someone"}, "payload": {"secret": secret}}),
            json!({"x402Version": 2, "accepted": webcash_requirements(1), "payload": {}}),
            json!({"x402Version": 2, "accepted": webcash_requirements(1), "payload": {"secret": secret},
                   "extensions": {"payment-identifier": {"info": {"id": "short"}}}}),
            json!([1, 2]),
        ] {
            assert!(parse_signature(&b64(&bad)).is_err(), "{bad}");
        }
        assert!(parse_signature("not base64!").is_err());
        let mut p = Signature::default();
        assert_eq!(read_signature(&mut p, "bm90IGpzb24="), None);
        assert!(p.invalid.is_some());
    }

    #[test]
    fn a_402_body_becomes_payment_required() {
        let body = json!({"code": "payment_required", "message": "post costs 0.3 webcash",
            "required_amount": "0.3", "payment": {"action": "post", "price": "0.3"}});
        let mut reply = Reply::json(402, &body);
        add_required(
            &mut reply,
            "/api/timeline",
            &[("host".into(), "example.org:8080".into())],
        );
        let (_, v) = reply
            .headers
            .iter()
            .find(|(n, _)| n == PAYMENT_REQUIRED)
            .unwrap();
        let doc: Value = serde_json::from_slice(&base64_decode(v).unwrap()).unwrap();
        assert_eq!(doc["x402Version"], 2);
        assert_eq!(doc["error"], "post costs 0.3 webcash");
        assert_eq!(
            doc["resource"]["url"],
            "http://example.org:8080/api/timeline"
        );
        assert_eq!(doc["resource"]["mimeType"], "application/json");
        assert_eq!(doc["accepts"], json!([webcash_requirements(30_000_000)]));
        assert_eq!(doc["accepts"][0]["amount"], "30000000");
        assert_eq!(doc["accepts"][0]["extra"]["price"], "0.3");
        assert_eq!(doc["accepts"][0]["payTo"], "marketplace");
    }

    #[test]
    fn idempotency_keys_separate_requests() {
        let id = "pay_0123456789abcdef";
        let a = keys(id, "p1", "POST", "/api/identity", b"{}");
        let b = keys(id, "p1", "POST", "/api/identity", b"{ }");
        assert_eq!(a.id, b.id);
        assert_ne!(a.request, b.request);
        assert_ne!(a.request, a.id);
        // Another payment with the same identifier and request is another
        // request: it never gets the first one's answer (and its change).
        let c = keys(id, "p2", "POST", "/api/identity", b"{}");
        assert_eq!(a.id, c.id);
        assert_ne!(a.request, c.request);
        assert_eq!(a.any_payer, c.any_payer);
        assert_ne!(a.any_payer, b.any_payer);
    }

    #[test]
    fn the_settlement_text_is_the_document_it_always_was() {
        for (paid, price, change) in [
            (
                300_000_000u64,
                100_000_000u64,
                Some("e2:secret:ab".to_string()),
            ),
            (1, 1, None),
            (u64::MAX, 0, Some("quote\" and \\ back".to_string())),
        ] {
            let charge = Charge {
                action: "post".into(),
                price,
                paid,
                public: "cd".repeat(32),
                change: change.clone(),
                change_derivation: None,
            };
            let before = json!({
                "success": true,
                "transaction": secret::public_string(paid, &charge.public),
                "network": NETWORK,
                "payer": "",
                "amount": price.to_string(),
                "extra": {"change": change},
            });
            assert_eq!(settlement(&charge), before.to_string());
        }
    }
}
