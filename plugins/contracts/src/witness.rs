//! Bearer witnesses: a contract's proof of a secret, checked and burned
//! as the contract moves, replaced by their holders
//! (`POST /api/witness/replace`) and looked up
//! (`POST /api/witness/health_check`).

use crate::contract::{Contract, load, valid_certificate_id, valid_contract_id};
use marketplace_common::hex;
use marketplace_guest::Body;
use marketplace_guest::prelude::*;

/// Proof of a witness secret `n:{id}:secret:{64 hex}`: `n:{id}:public:{sha256
/// of the raw 32 bytes}`. The id is a contract's (a bearer contract's
/// witness) or a certificate's.
pub(crate) fn witness_proof_of(secret: &str) -> Option<String> {
    let rest = secret.strip_prefix("n:")?;
    let (id, hexpart) = rest.split_once(":secret:")?;
    if !(valid_contract_id(id) || valid_certificate_id(id)) || hexpart.len() != 64 {
        return None;
    }
    let raw = hex::decode(hexpart)?;
    Some(format!("n:{id}:public:{}", hex::sha256(raw)))
}

pub(crate) fn valid_witness_proof(proof: &str, contract_id: &str) -> bool {
    proof
        .strip_prefix(&format!("n:{contract_id}:public:"))
        .is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

/// Whether `secret` shows the contract's current witness: with a witness,
/// its live secret; without one, no secret at all (one sent anyway names
/// a witness this contract does not have). `Err` says what is wrong.
pub(crate) fn check_witness(c: &Contract, secret: Option<&str>) -> Result<(), ApiError> {
    let secret = secret.filter(|s| !s.is_empty());
    let Some(current) = &c.witness_proof else {
        return match secret {
            None => Ok(()),
            Some(_) => Err(ApiError::new(
                403,
                "witness_mismatch",
                "this contract has no witness: send no witness_secret",
            )),
        };
    };
    let ok = secret
        .and_then(witness_proof_of)
        .is_some_and(|p| &p == current)
        && kv::get::<Value>(&format!("w/{current}"))?.is_some_and(|w| w["state"] == "live");
    if ok {
        Ok(())
    } else {
        Err(ApiError::new(
            403,
            "witness_mismatch",
            "this needs the contract's current witness secret in witness_secret",
        ))
    }
}

pub(crate) fn burn_witness(c: &Contract) -> Result<(), ApiError> {
    if let Some(p) = &c.witness_proof {
        kv::put(
            &format!("w/{p}"),
            &json!({"contract_id": c.contract_id, "state": "burned"}),
        )?;
    }
    Ok(())
}

fn string_list(body: &mut Body, field: &str) -> Vec<String> {
    match body.raw(field) {
        Some(Value::Array(items))
            if !items.is_empty() && items.len() <= 100 && items.iter().all(Value::is_string) =>
        {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        }
        _ => {
            body.problem(field, "must be a list of 1 to 100 strings");
            vec![]
        }
    }
}

/// `POST /api/witness/replace {secrets: [old], new_secrets: [new]}`.
pub(crate) fn witness_replace(req: &Request) -> Result<Response, ApiError> {
    let mut body = Body::parse(req)?;
    let old = string_list(&mut body, "secrets");
    let new = string_list(&mut body, "new_secrets");
    if old.len() != new.len() {
        body.problem("new_secrets", "must have one new secret per old secret");
    }
    body.finish()?;
    for (o, n) in old.iter().zip(&new) {
        const SHAPE: &str =
            "witness secrets look like n:{contract_id or certificate_id}:secret:{64 hex}";
        let Some(old_proof) = witness_proof_of(o) else {
            return Err(ApiError::invalid("secrets", SHAPE));
        };
        let Some(new_proof) = witness_proof_of(n) else {
            return Err(ApiError::invalid("new_secrets", SHAPE));
        };
        let id = old_proof.split(':').nth(1).unwrap_or_default().to_string();
        if new_proof.split(':').nth(1) != Some(id.as_str()) {
            return Err(ApiError::invalid(
                "new_secrets",
                "a new secret must name the same contract or certificate",
            ));
        }
        // A bearer contract's witness must also be its contract's current
        // one; a certificate's ledger record alone says it is live.
        let contract = if valid_certificate_id(&id) {
            None
        } else {
            Some(load(&id).map_err(|_| ApiError::invalid("secrets", "unknown witness"))?)
        };
        let current = contract
            .as_ref()
            .is_none_or(|c| c.witness_proof.as_deref() == Some(old_proof.as_str()));
        let record: Option<Value> = kv::get(&format!("w/{old_proof}"))?;
        let Some(mut record) = record.filter(|r| r["state"] == "live" && current) else {
            return Err(ApiError::invalid("secrets", "a witness secret is not live"));
        };
        if kv::get_raw(None, &format!("w/{new_proof}"))?.is_some() {
            return Err(ApiError::invalid(
                "new_secrets",
                "a new witness already exists",
            ));
        }
        record["state"] = json!("spent");
        kv::put(&format!("w/{old_proof}"), &record)?;
        record["state"] = json!("live");
        kv::put(&format!("w/{new_proof}"), &record)?;
        if let Some(mut c) = contract {
            c.witness_proof = Some(new_proof);
            c.save()?;
        }
    }
    Ok(json(200, &json!({"status": "success"})))
}

/// `POST /api/witness/health_check [proofs]`.
pub(crate) fn witness_health(req: &Request) -> Result<Response, ApiError> {
    let proofs: Vec<String> = match serde_json::from_slice::<Value>(req.body()) {
        Ok(Value::Array(items)) if items.len() <= 100 && items.iter().all(Value::is_string) => {
            items
                .iter()
                .filter_map(|v| v.as_str().map(str::to_string))
                .collect()
        }
        _ => {
            return Err(ApiError::invalid(
                "body",
                "must be a list of at most 100 witness proofs",
            ));
        }
    };
    // PROTOCOL 10: the original client reads `results[proof].spent`. The
    // members come in the order of the request (a proof asked twice, at
    // its first place), as the cash health_check's do.
    let mut results = String::from("{");
    let mut seen = std::collections::HashSet::new();
    for p in proofs {
        if !seen.insert(p.clone()) {
            continue;
        }
        let state: Option<Value> = kv::get(&format!("w/{p}"))?;
        let doc = match state {
            Some(w) => json!({"spent": w["state"] != "live", "state": w["state"],
                              "contract_id": w["contract_id"]}),
            None => json!({"spent": null, "state": null, "contract_id": null}),
        };
        if results.len() > 1 {
            results.push(',');
        }
        results.push_str(&json_text(&p));
        results.push(':');
        results.push_str(&doc.to_string());
    }
    results.push('}');
    Ok(json_members(
        200,
        &[("status", "\"success\""), ("results", &results)],
    ))
}
