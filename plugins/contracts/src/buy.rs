//! Buying: the buyer's signed offer on a listing, charged the amount and
//! held in the contract's escrow account, with the arbiter's signature
//! over the terms, and the buyer's daily cap.

use crate::contract::{Contract, DEFAULT_WORK_SPEC, valid_contract_id};
use crate::machine::State;
use crate::witness::valid_witness_proof;
use crate::{CONTRACT_TYPES, DEFAULT_DEADLINE_MS, MAX_TEXT, parties};
use marketplace_common::{amount, hex};
use marketplace_guest::prelude::*;
use marketplace_guest::quota::Quota;
use marketplace_guest::{Body, arbiter, clock, escrow, ids, payments};
use sha2::{Digest, Sha256};

/// Contracts one identity buys in a UTC day (`buys_per_day`, 1 to a
/// million; default 100). A buy refunded before acceptance gives back its
/// whole amount, so without a cap a stranger could store contracts (each
/// with up to 64 KiB of terms) endlessly for the price of one identity (an
/// outside probe wrote 2.5 GB in 75 s).
pub(crate) const BUYS: Quota = Quota {
    setting: "buys_per_day",
    default: 100,
    max: 1_000_000,
    window_ms: 86_400_000,
};

/// Count a buy against `buyer`'s day (`q/{fingerprint}`), or the 429.
fn count_buy(buyer: &str) -> Result<Option<Response>, ApiError> {
    BUYS.take(&format!("q/{buyer}"), |count, next| {
        format!(
            "this identity has bought {count} contracts today, the most one identity may buy a day (UTC); it may buy again from {next}"
        )
    })
}

fn parse_amount(body: &mut Body) -> Option<u64> {
    let text = match body.raw("amount") {
        None => {
            body.problem("amount", "is required");
            return None;
        }
        Some(Value::String(s)) => s.clone(),
        // Amounts are decimal strings (PROTOCOL section 1): a JSON number
        // would pass through binary floating point on many clients.
        Some(_) => {
            body.problem("amount", "must be a decimal string like \"1.5\"");
            return None;
        }
    };
    match amount::parse(&text) {
        Ok(0) => {
            body.problem("amount", "must be positive");
            None
        }
        Ok(units) => Some(units),
        Err(e) => {
            body.problem("amount", format!("{e} (decimal with at most 8 decimals)"));
            None
        }
    }
}

pub(crate) fn buy(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let contract_type = body.required_str("contract_type", 32);
    if let Some(t) = &contract_type
        && !CONTRACT_TYPES.contains(&t.as_str())
    {
        body.problem(
            "contract_type",
            format!("must be one of {}", CONTRACT_TYPES.join(", ")),
        );
    }
    let units = parse_amount(&mut body);
    let reference_post = body.required_str("reference_post", 128);
    // "" is an absent id (PROTOCOL 2 signs it as the empty string), as for
    // `witness_proof`: the server makes one.
    let contract_id = body
        .optional_str("contract_id", 68)
        .filter(|id| !id.is_empty());
    if let Some(id) = &contract_id
        && !valid_contract_id(id)
    {
        body.problem("contract_id", "must match ^CTR_[A-Za-z0-9_-]{1,64}$");
    }
    let work_spec = body.raw("work_spec").cloned().unwrap_or(Value::Null);
    if work_spec.to_string().len() > MAX_TEXT {
        body.problem("work_spec", "is too large");
    }
    let now = clock::now_ms();
    // (0 when refused: the body's problems end the request below.)
    let deadline =
        delivery_deadline(body.raw("delivery_deadline"), now).unwrap_or_else(|problem| {
            body.problem("delivery_deadline", problem);
            0
        });
    let witness_proof = body
        .optional_str("witness_proof", 200)
        .filter(|p| !p.is_empty());
    if let Some(p) = &witness_proof {
        match &contract_id {
            None => body.problem(
                "witness_proof",
                "a witness needs a client-supplied contract_id",
            ),
            Some(id) if !valid_witness_proof(p, id) => {
                body.problem("witness_proof", "must be n:{contract_id}:public:{64 hex}")
            }
            _ => {}
        }
    }
    let encrypted = body.optional_str("encrypted_witness_secret", 8192);
    if body.raw("accept_terms") != Some(&Value::Bool(true)) {
        body.problem("accept_terms", "must be true");
    }
    let timestamp = body.optional_u64("timestamp");
    body.finish_signed("buyer_fingerprint")?;
    let (units, reference_post) = (units.unwrap_or(0), reference_post.unwrap_or_default());
    let buyer_field = body.text("buyer_fingerprint").unwrap_or_default();

    // The fee is fixed at buy: quoted before the charge, which joins the
    // commit batch (a fee component slow to quote keeps no other paid
    // write waiting).
    let (fee_policy, fee) = (
        payments::policy(),
        payments::quote("arbitration", Some(units))?,
    );
    let payment = charge("buy", Some(units))?;
    let (buyer, reused) = verify_in_order(
        "buyer_fingerprint",
        body.text("buyer_fingerprint").as_deref(),
        &format!(
            "buy_contract:{buyer_field}:{reference_post}:{}:{}",
            contract_id.as_deref().unwrap_or(""),
            witness_proof.as_deref().unwrap_or("")
        ),
        body.text("signature").as_deref(),
        timestamp,
        false,
        false,
    )?;
    require_identity(&buyer)?;
    let seller = marketplace_guest::posts::author_of(&reference_post)?;
    // A deleted seller could never accept: the buyer's money would only
    // wait in escrow for their own refund.
    if !marketplace_guest::registered(&seller)? {
        return Err(ApiError::new(
            404,
            "not_found",
            format!(
                "post {reference_post}'s author has no registered identity (deleted): nobody could accept the contract"
            ),
        ));
    }
    if seller == buyer {
        return Err(ApiError::new(
            403,
            "forbidden_party",
            "you cannot buy from your own listing",
        ));
    }
    reused.check()?;
    let id = contract_id.unwrap_or_else(|| format!("CTR_{}", ids::ulid()));
    if kv::get_raw(None, &format!("c/{id}"))?.is_some() {
        return Err(ApiError::conflict(format!("contract id {id} is taken")));
    }
    if let Some(p) = &witness_proof {
        if kv::get_raw(None, &format!("w/{p}"))?.is_some() {
            return Err(ApiError::conflict("this witness proof is already in use"));
        }
        kv::put(
            &format!("w/{p}"),
            &json!({"contract_id": id, "state": "live"}),
        )?;
    }
    let now_text = marketplace_guest::now_rfc3339();
    let mut c = Contract {
        contract_id: id.clone(),
        status: State::Issued,
        contract_type: contract_type.unwrap_or_default(),
        amount: units,
        buyer_fingerprint: buyer.clone(),
        target_seller_fingerprint: seller.clone(),
        reference_post,
        work_spec,
        delivery_deadline_ms: deadline,
        fee_policy,
        fee,
        created_at: now_text.clone(),
        updated_at: now_text,
        history: vec![],
        witness_proof,
        encrypted_witness_secret: encrypted,
        delivered_text: None,
        certificate: None,
        fee_paid: false,
        legacy_pickups: vec![],
        arbiter_signature: None,
    };
    c.arbiter_signature = Some(arbiter::sign(&arbiter_message(&c)));
    c.record("buy", &buyer);
    // After the 409s of a taken id or witness (PROTOCOL 1's order).
    if let Some(refused) = count_buy(&buyer)? {
        return Ok(refused);
    }
    escrow::hold(&id)?;
    parties::catch_up()?;
    parties::index(&id, &buyer, &seller)?;
    c.save()?;
    Ok(json(
        201,
        &json!({"contract_id": id, "status": "issued", "target_seller_fingerprint": seller,
                "arbiter_signature": c.arbiter_signature,
                "allowed_actions": c.allowed(), "contract": c.public(), "payment": payment}),
    ))
}

/// A buy's `delivery_deadline` (absent: 7 days from `now`), in ms, kept
/// to the second as it is shown and signed (PROTOCOL 10): a fraction is
/// dropped, so the contract's own field is its deadline.
fn delivery_deadline(given: Option<&Value>, now: u64) -> Result<u64, &'static str> {
    let ms = match given {
        None => i128::from(now + DEFAULT_DEADLINE_MS),
        Some(Value::String(s)) => marketplace_common::time::parse_date_time_signed(s)
            .ok_or("must be an RFC 3339 time like 2026-12-01T00:00:00Z")?,
        Some(_) => return Err("must be an RFC 3339 string"),
    };
    let ms = ms - ms.rem_euclid(1000);
    if ms <= i128::from(now) {
        return Err("must be in the future");
    }
    Ok(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// What the arbiter signs at issue (PROTOCOL 10): `arbiter_issue:{hex
/// sha256}`, the hash over contract_id, buyer_fingerprint, the amount in
/// units (decimal), delivery_deadline, contract_type, work_spec (text;
/// "Contract deliverable" when none), reference_post and the buyer's
/// public key (hex), each preceded by its byte length as a little-endian
/// u64.
fn arbiter_message(c: &Contract) -> String {
    let work_spec = match &c.work_spec {
        Value::Null => DEFAULT_WORK_SPEC.to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let fields = [
        c.contract_id.clone(),
        c.buyer_fingerprint.clone(),
        c.amount.to_string(),
        marketplace_guest::rfc3339(c.delivery_deadline_ms),
        c.contract_type.clone(),
        work_spec,
        c.reference_post.clone(),
        c.buyer_fingerprint.clone(),
    ];
    let mut h = Sha256::new();
    for f in &fields {
        h.update((f.len() as u64).to_le_bytes());
        h.update(f.as_bytes());
    }
    format!("arbiter_issue:{}", hex::encode(&h.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deadline_is_kept_to_the_second() {
        let now = 1_800_000_000_123;
        let at = |s: &str| delivery_deadline(Some(&json!(s)), now);
        // A fraction is dropped, whatever its offset or digits.
        assert_eq!(at("2031-05-01T12:00:00.750Z"), at("2031-05-01T12:00:00Z"));
        assert_eq!(
            at("2031-05-01T14:00:00.999999+02:00"),
            at("2031-05-01T12:00:00Z")
        );
        assert_eq!(at("2031-05-01T12:00:00Z").unwrap() % 1000, 0);
        // The default: 7 days from now, to the second.
        let default = delivery_deadline(None, now).unwrap();
        assert_eq!(default, now + DEFAULT_DEADLINE_MS - 123);
        // Within the second that has begun is not in the future.
        let this_second = marketplace_guest::rfc3339(now);
        assert_eq!(
            delivery_deadline(Some(&json!(format!("{}.900Z", &this_second[..19]))), now),
            Err("must be in the future")
        );
        assert_eq!(
            delivery_deadline(Some(&json!(5)), now),
            Err("must be an RFC 3339 string")
        );
        assert!(at("tomorrow").is_err());
    }
}
