//! The original client's recovery scan (PROTOCOL 10): derived keys probed
//! for the identities and contracts they hold.

use crate::{Identity, is_fingerprint};
use marketplace_common::{amount, time};
use marketplace_guest::prelude::*;
use marketplace_guest::{auth, clock, storage};

/// Most probes in one recovery scan.
const MAX_PROBES: usize = 100;
/// How far the challenge's time may be from the host clock (seconds).
const CHALLENGE_WINDOW_S: u64 = 300;
/// Contracts a scan lists by default, and at most.
const DEFAULT_CONTRACTS: u64 = 100;
const MAX_CONTRACTS: u64 = 500;
/// Contracts the scan looks through at most (pages of `SCAN_PAGE`).
const SCAN_PAGE: u32 = 500;
const SCAN_PAGES: usize = 40;

/// `POST /api/recovery/scan`: which probed keys have identities.
pub fn recovery_scan(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let challenge = body.required_str("challenge", 300);
    let challenge_ms = challenge.as_deref().and_then(|c| {
        let (fp, at) = c.strip_prefix("recover:")?.split_once(':')?;
        (!fp.is_empty()).then_some(())?;
        // No leap second (`HH:MM:60`): RFC 3339 admits one at the end of a
        // month, but no client's clock writes it, and the documented
        // pattern stays a plain one.
        (at.get(17..19) != Some("60")).then_some(())?;
        // A time before 1970 is a time long past (401 below), not a
        // malformed challenge.
        time::parse_rfc3339_signed(at).map(|ms| u64::try_from(ms).unwrap_or(0))
    });
    if challenge.is_some() && challenge_ms.is_none() {
        body.problem("challenge", "must be recover:{fingerprint}:{RFC 3339 time}");
    }
    let mut probes = Vec::new();
    match body.raw("probes").cloned() {
        None => body.problem("probes", "is required"),
        Some(Value::Array(items)) if items.len() > MAX_PROBES => {
            body.problem("probes", format!("at most {MAX_PROBES} probes"))
        }
        Some(Value::Array(items)) => {
            for (i, p) in items.iter().enumerate() {
                // JSON Schema's integers: 7 or 7.0.
                let index = p
                    .get("key_index")
                    .and_then(Value::as_number)
                    .and_then(marketplace_guest::whole_u64);
                let fp = p.get("fingerprint").and_then(Value::as_str);
                let sig = p.get("signature").and_then(Value::as_str);
                match (index, fp, sig) {
                    (Some(_), Some(fp), Some(_)) if !is_fingerprint(fp) => body.problem(
                        "probes",
                        format!(
                            "probe {i}'s fingerprint must be 64 hexadecimal digits (its Ed25519 public key)"
                        ),
                    ),
                    (Some(index), Some(fp), Some(sig)) if sig.chars().count() <= 256 => {
                        probes.push((index, fp.to_ascii_lowercase(), sig.to_string()))
                    }
                    _ => body.problem(
                        "probes",
                        format!(
                            "probe {i} must have key_index (an integer from 0 to 2^64-1), fingerprint and signature (strings, the signature at most 256 characters)"
                        ),
                    ),
                }
            }
        }
        Some(_) => body.problem("probes", "must be a list"),
    }
    let include_contracts = match body.raw("include_contracts") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            body.problem("include_contracts", "must be a boolean");
            false
        }
    };
    let limit = body.optional_u64("contract_limit");
    if limit.is_some_and(|l| !(1..=MAX_CONTRACTS).contains(&l)) {
        body.problem(
            "contract_limit",
            format!("must be an integer from 1 to {MAX_CONTRACTS}"),
        );
    }
    body.finish()?;
    let challenge = challenge.unwrap_or_default();
    let now = clock::now_ms();
    let at = challenge_ms.unwrap_or_default();
    if now.abs_diff(at) > CHALLENGE_WINDOW_S * 1000 {
        return Err(ApiError::new(
            401,
            "auth_expired",
            format!(
                "the challenge's time must be within {CHALLENGE_WINDOW_S} s of the server clock"
            ),
        ));
    }

    let mut identities = Vec::new();
    let mut found = Vec::new();
    // Every probed key looked up first, in one call: a probe of a key with
    // no identity (a stranger's hundred random keys) costs no signature
    // check.
    let keys: Vec<String> = probes.iter().map(|(_, fp, _)| format!("id/{fp}")).collect();
    let found_ids = kv::get_many_raw(None, &keys)?;
    for ((index, fp, sig), (key, bytes)) in probes.into_iter().zip(keys.iter().zip(found_ids)) {
        let Some(bytes) = bytes else {
            continue;
        };
        let id: Identity = kv::parse(key, &bytes)?;
        let verifies = auth::precheck(&auth::Signed {
            actor: fp.clone(),
            message: challenge.clone(),
            signature: sig,
            timestamp: None,
        });
        if verifies {
            identities.push(json!({
                "key_index": index,
                "fingerprint": id.fingerprint,
                "nickname": id.nickname,
                "pub_key": id.fingerprint,
            }));
            found.push(fp);
        }
    }
    let contracts = if include_contracts && !found.is_empty() {
        contracts_of(&found, limit.unwrap_or(DEFAULT_CONTRACTS) as usize)?
    } else {
        Vec::new()
    };
    Ok(json(
        200,
        &json!({"challenge": challenge, "identities": identities, "contracts": contracts}),
    ))
}

/// The contracts where one of `parties` is buyer or seller, in the order
/// of their ids, when the family may read the `contracts` keyspace; empty
/// otherwise. Read through the contracts family's index by party once it
/// covers every contract, else by reading the contracts themselves.
fn contracts_of(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    use marketplace_common::parties as index;
    match storage::get(Some("contracts"), index::PROGRESS.as_bytes()) {
        // Not granted (the default) or no contracts family: nothing.
        Err(storage::StorageError::Forbidden(_))
        | Err(storage::StorageError::UnknownKeyspace(_)) => Ok(Vec::new()),
        Err(e) => Err(ApiError::internal(format!("storage: {e:?}"))),
        Ok(Some(p)) if p == index::COMPLETE => indexed(parties, limit),
        Ok(_) => scanned(parties, limit),
    }
}

/// [`contracts_of`] through the index: each party's first `limit` ids, the
/// first `limit` of them all, then those contracts.
fn indexed(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    use marketplace_common::parties as index;
    let mut ids = std::collections::BTreeSet::new();
    for party in parties {
        let prefix = index::prefix(party);
        for (key, _) in kv::scan_prefix(Some("contracts"), &prefix, false, limit as u32)? {
            ids.insert(key[prefix.len()..].to_string());
        }
    }
    let keys: Vec<String> = ids
        .into_iter()
        .take(limit)
        .map(|id| format!("c/{id}"))
        .collect();
    let mut out = Vec::with_capacity(keys.len());
    let mut chunk = keys.len().max(1);
    let mut done = 0;
    while done < keys.len() {
        let (page, n) = kv::get_many_fitting(Some("contracts"), &keys[done..], &mut chunk)?;
        for value in page.values().flatten() {
            if let Some(c) = summary(value, parties) {
                out.push(c);
            }
        }
        done += n;
    }
    Ok(out)
}

/// [`contracts_of`] by reading the contracts in order (a database whose
/// contracts from before the index are not all indexed yet).
fn scanned(parties: &[String], limit: usize) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    let end = kv::prefix_end(b"c/");
    let mut start = b"c/".to_vec();
    for _ in 0..SCAN_PAGES {
        let page = storage::scan(Some("contracts"), &start, end.as_deref(), false, SCAN_PAGE)
            .map_err(|e| ApiError::internal(format!("storage: {e:?}")))?;
        let full = page.len() == SCAN_PAGE as usize;
        for entry in &page {
            if let Some(c) = summary(&entry.value, parties) {
                out.push(c);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
        }
        match page.last() {
            Some(last) if full => {
                start = last.key.clone();
                start.push(0);
            }
            _ => break,
        }
    }
    Ok(out)
}

/// The members of a stored contract a scan shows (any others, a 64 KiB
/// `work_spec` among them, are skipped unbuilt: parsing each record
/// whole made a scan of 500 contracts cost 0.6 s, an outside audit).
#[derive(serde::Deserialize, Default)]
#[serde(default)]
struct Stored {
    contract_id: Value,
    contract_type: Value,
    status: Value,
    buyer_fingerprint: Value,
    target_seller_fingerprint: Value,
    amount: Value,
    witness_proof: Value,
    reference_post: Value,
    delivery_deadline_ms: Value,
    created_at: Value,
    updated_at: Value,
}

/// What a scan shows of a stored contract, when one of `parties` is its
/// buyer or seller.
fn summary(stored: &[u8], parties: &[String]) -> Option<Value> {
    let c = serde_json::from_slice::<Stored>(stored).ok()?;
    let s = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let (buyer, seller) = (s(&c.buyer_fingerprint), s(&c.target_seller_fingerprint));
    if !parties.iter().any(|p| *p == buyer || *p == seller) {
        return None;
    }
    Some(json!({
        "contract_id": s(&c.contract_id),
        "contract_type": s(&c.contract_type),
        "status": c.status,
        "buyer_fingerprint": buyer,
        "seller_fingerprint": seller,
        "amount": amount::format(c.amount.as_u64().unwrap_or(0)),
        "witness_proof": c.witness_proof,
        "reference_post": s(&c.reference_post),
        "delivery_deadline": time::rfc3339(c.delivery_deadline_ms.as_u64().unwrap_or(0)),
        "created_at": s(&c.created_at),
        "updated_at": s(&c.updated_at),
    }))
}
