//! A party's signed actions on a contract (accept, deliver, pickup,
//! refund, release), as the state machine allows them, and the money they
//! move out of its escrow: payouts, refunds, the fee, certificates.

use crate::contract::{Certificate, Contract, load};
use crate::machine::{self, Action, Collect, Role, State, Verdict};
use crate::witness::{burn_witness, check_witness, witness_proof_of};
use crate::{MAX_TEXT, parties};
use marketplace_common::{amount, hex};
use marketplace_guest::prelude::*;
use marketplace_guest::{Body, escrow, ids};

/// The member naming the signer of each action.
fn signer_member(action: Action) -> &'static str {
    match action {
        Action::Accept => "seller_fingerprint",
        Action::Deliver | Action::Pickup | Action::Refund | Action::Release => "actor_fingerprint",
    }
}

/// The signed message of each action.
fn signed_message(action: Action, id: &str, body: &Body) -> String {
    match action {
        Action::Accept => format!(
            "accept:{id}:{}",
            body.text("seller_fingerprint").unwrap_or_default()
        ),
        Action::Deliver => format!(
            "deliver:{id}:{}",
            body.text("delivered_text").unwrap_or_default()
        ),
        Action::Pickup => id.to_string(),
        Action::Refund => format!("REFUND:{id}"),
        Action::Release => format!("release:{id}"),
    }
}

pub(crate) fn act(req: &Request, action: Action) -> Result<Response, ApiError> {
    let id = req.param("id").to_string();
    let mut body = Body::parse(req)?;
    let delivered_text = if action == Action::Deliver {
        body.required_str("delivered_text", MAX_TEXT)
    } else {
        None
    };
    // Members only the actions that read them check: to the others they
    // are unknown members, ignored (PROTOCOL 1).
    let witness_secret = matches!(action, Action::Deliver | Action::Release)
        .then(|| body.optional_str("witness_secret", 200))
        .flatten();
    let (tracking_number, tracking_carrier) = if action == Action::Release {
        (
            body.optional_str("tracking_number", 200),
            body.optional_str("tracking_carrier", 100),
        )
    } else {
        (None, None)
    };
    let timestamp = body.optional_u64("timestamp");
    let actor_field = signer_member(action);
    body.finish_signed(actor_field)?;

    let (actor, reused) = verify_in_order(
        actor_field,
        body.text(actor_field).as_deref(),
        &signed_message(action, &id, &body),
        body.text("signature").as_deref(),
        timestamp,
        false,
        false,
    )?;
    require_identity(&actor)?;
    let mut c = load(&id)?;
    let role = if actor == c.buyer_fingerprint {
        Role::Buyer
    } else if actor == c.target_seller_fingerprint {
        Role::Seller
    } else {
        return Err(ApiError::new(
            403,
            "forbidden_party",
            "you are not a party to this contract",
        ));
    };
    let verdict = machine::decide(c.status, action, role, c.deadline_passed());
    // The other party's action is a 403, answered before a used
    // signature's 409.
    if !matches!(verdict, Verdict::OtherParty) {
        // A retry of an action that went through (its answer lost) shows
        // where the contract stands now.
        reused.check().map_err(|e| {
            e.with("current_status", json!(c.status.name()))
                .with("allowed_actions", json!(c.allowed()))
        })?;
    }
    let mut extra = serde_json::Map::new();
    match verdict {
        Verdict::OtherParty => {
            let mut message = format!(
                "only the other party can {} contract {id} while it is {}",
                action.name(),
                c.status.name()
            );
            if machine::after_deadline(c.status, action, role) {
                message.push_str(&format!(
                    "; this party can once its delivery_deadline ({}) has passed",
                    marketplace_guest::rfc3339(c.delivery_deadline_ms)
                ));
            }
            return Err(ApiError::new(403, "forbidden_party", message));
        }
        Verdict::Invalid => {
            return Err(ApiError::new(
                409,
                "invalid_transition",
                format!(
                    "contract {id} is {} and cannot be {}",
                    c.status.name(),
                    action.participle()
                ),
            )
            .with("current_status", json!(c.status.name()))
            .with("allowed_actions", json!(c.allowed())));
        }
        Verdict::Move(to) => {
            if action == Action::Pickup {
                pay_first_pickup(&mut c, &mut extra)?;
            }
            match action {
                Action::Accept => {
                    extra.insert(
                        "witness_secret_encrypted_for_seller".into(),
                        json!(c.encrypted_witness_secret),
                    );
                }
                Action::Deliver => {
                    check_witness(&c, witness_secret.as_deref())?;
                    c.delivered_text = delivered_text;
                }
                // The seller's release (PROTOCOL 10): a shipment, shown with
                // the contract's current witness secret.
                Action::Release if role == Role::Seller => {
                    let Some(number) = tracking_number.filter(|n| !n.trim().is_empty()) else {
                        return Err(ApiError::invalid(
                            "tracking_number",
                            "is required when the seller releases",
                        ));
                    };
                    // A wrong witness secret is PROTOCOL 10's 403
                    // forbidden_party here (deliver's is witness_mismatch).
                    check_witness(&c, witness_secret.as_deref()).map_err(|e| {
                        if e.code == "witness_mismatch" {
                            ApiError::new(403, "forbidden_party", e.message)
                        } else {
                            e
                        }
                    })?;
                    c.delivered_text = Some(match tracking_carrier {
                        Some(carrier) if !carrier.trim().is_empty() => {
                            format!("{carrier}: {number}")
                        }
                        _ => number,
                    });
                }
                _ => {}
            }
            c.status = to;
            c.record(action.name(), &actor);
            match to {
                State::Settled => settle(&mut c)?,
                State::Refunded => burn_witness(&c)?,
                _ => {}
            }
            if action == Action::Pickup {
                extra.extend(certificate_doc(&c)?);
            }
        }
        Verdict::Collect(kind) => {
            // A party's first pickup in a settled or refunded contract (its
            // payout, refund or certificate) is in the history; one that
            // fetches it again is not.
            if !c
                .history
                .iter()
                .any(|e| e.action == "pickup" && e.actor == actor)
            {
                c.record(Action::Pickup.name(), &actor);
            }
            match kind {
                Collect::Certificate => {
                    pay_first_pickup(&mut c, &mut extra)?;
                    extra.extend(certificate_doc(&c)?);
                }
                Collect::Payout => {
                    pay_first_pickup(&mut c, &mut extra)?;
                    let out = if c.fee_policy == "bid-inclusive" {
                        c.amount - c.fee
                    } else {
                        c.amount
                    };
                    // A fee policy may take the whole amount: nothing is
                    // left to pay out, and no secret is worth nothing.
                    if out > 0 {
                        let secret = collect(&mut c, "payout", out, timestamp)?;
                        extra.insert("payout".into(), json!(secret));
                    }
                    extra.insert("payout_amount".into(), json!(amount::format(out)));
                }
                Collect::RefundSecret => {
                    let units = c.amount;
                    let secret = collect(&mut c, "refund", units, timestamp)?;
                    extra.insert("refund".into(), json!(secret));
                    extra.insert("refund_amount".into(), json!(amount::format(units)));
                }
            }
        }
    }
    parties::catch_up()?;
    c.save()?;
    if let Some(instead) = retry_instead(&c, timestamp, &extra)? {
        answer_retries_with(&instead);
    }
    let mut doc =
        json!({"contract_id": id, "status": c.status.name(), "allowed_actions": c.allowed()});
    for (k, v) in extra {
        doc[k] = v;
    }
    Ok(json(200, &doc))
}

/// What an identical retry of a paid legacy pickup of a payout or refund
/// gets instead of its kept answer (PROTOCOL 3): what a later legacy pickup
/// gets, 409 `already_picked_up` (PROTOCOL 10, which wins: the secret goes
/// to a legacy signature once; a kept answer would hand it to whoever holds
/// a copy of the request and its spent fee secret). None for any other
/// answer: an identical retry gets the stored answer (PROTOCOL 3).
fn retry_instead(
    c: &Contract,
    timestamp: Option<u64>,
    extra: &serde_json::Map<String, Value>,
) -> Result<Option<ApiError>, ApiError> {
    if timestamp.is_some() {
        return Ok(None);
    }
    let issued = ["payout", "refund"]
        .into_iter()
        .find_map(|kind| Some((kind, extra.get(kind)?.as_str()?)));
    match issued {
        Some((kind, secret)) => already_picked_up(c, kind, secret).map(Some),
        None => Ok(None),
    }
}

/// A payout or refund: to a fresh signature (`{contract_id}:{timestamp}`)
/// at any time; to a legacy one (`{contract_id}`, what the original client
/// sends) once, a later legacy pickup being 409 `already_picked_up` with
/// the public form of what was issued (PROTOCOL 10; an identical retry of
/// a paid one too: [`retry_instead`]).
fn collect(
    c: &mut Contract,
    kind: &str,
    units: u64,
    timestamp: Option<u64>,
) -> Result<String, ApiError> {
    let secret = escrow::payout(&c.contract_id, kind, units)?;
    if timestamp.is_none() {
        if c.legacy_pickups.iter().any(|k| k == kind) {
            return Err(already_picked_up(c, kind, &secret)?);
        }
        c.legacy_pickups.push(kind.to_string());
    }
    Ok(secret)
}

/// The 409 of a legacy pickup of `kind`, `secret`, handed out already: its
/// public form, and how to fetch it again.
fn already_picked_up(c: &Contract, kind: &str, secret: &str) -> Result<ApiError, ApiError> {
    let public = marketplace_common::secret::parse(secret)
        .map(|p| {
            let hash = hex::sha256(&p.hex);
            marketplace_common::secret::public_string(p.amount, &hash)
        })
        .map_err(ApiError::internal)?;
    Ok(ApiError::new(
        409,
        "already_picked_up",
        format!(
            "the {kind} of {} was handed out already; sign \"{{contract_id}}:{{timestamp}}\" and send timestamp to fetch it again",
            c.contract_id
        ),
    )
    .with("issued", json!(public)))
}

/// Under pickup-paid, the first settlement-side pickup pays the fee.
fn pay_first_pickup(
    c: &mut Contract,
    extra: &mut serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    if c.fee_policy != "pickup-paid" || c.fee_paid {
        return Ok(());
    }
    // The contract keeps the policy and the fee it was bought under,
    // whatever the fee component in force now quotes.
    let payment = charge_price("pickup", c.fee)?;
    escrow::note_fee(&c.contract_id)?;
    extra.insert("payment".into(), payment);
    c.fee_paid = true;
    Ok(())
}

/// Settlement: the certificate, the witness burned, the fee earned (bid-inclusive).
///
/// The certificate is a bearer witness of its own, as the original client
/// keeps it: secret `n:{certificate_id}:secret:{64 hex}` (the host's
/// escrow derives the hex again at each pickup; it is never stored),
/// proof `n:{certificate_id}:public:{sha256}`, live in the witness ledger,
/// so `witness/health_check` reports it and `witness/replace` moves it to
/// a secret only its holder knows.
fn settle(c: &mut Contract) -> Result<(), ApiError> {
    let certificate_id = format!("CRT_{}", ids::ulid());
    let secret = certificate_secret(&certificate_id, &c.contract_id)?;
    let proof = witness_proof_of(&secret)
        .ok_or_else(|| ApiError::internal("the escrow certificate is not 64 hex"))?;
    kv::put(
        &format!("w/{proof}"),
        &json!({"contract_id": c.contract_id, "certificate_id": certificate_id, "state": "live"}),
    )?;
    c.certificate = Some(Certificate {
        certificate_id,
        certificate_proof: proof,
    });
    if c.fee_policy == "bid-inclusive" && c.fee > 0 {
        escrow::earn(&c.contract_id, c.fee)?;
    }
    burn_witness(c)
}

/// A certificate's secret as issued (see [`settle`]).
fn certificate_secret(certificate_id: &str, contract_id: &str) -> Result<String, ApiError> {
    Ok(format!(
        "n:{certificate_id}:secret:{}",
        escrow::certificate(contract_id)?
    ))
}

/// The certificate members of a pickup answer (the secret from the host).
fn certificate_doc(c: &Contract) -> Result<serde_json::Map<String, Value>, ApiError> {
    let mut m = serde_json::Map::new();
    if let Some(cert) = &c.certificate {
        m.insert("certificate_id".into(), json!(cert.certificate_id));
        // (One settled before certificates were witnesses has a bare
        // sha256 proof, and its bare hex secret.)
        let secret = if cert.certificate_proof.starts_with("n:") {
            certificate_secret(&cert.certificate_id, &c.contract_id)?
        } else {
            escrow::certificate(&c.contract_id)?
        };
        m.insert("certificate_secret".into(), json!(secret));
        m.insert("certificate_proof".into(), json!(cert.certificate_proof));
        m.insert("delivered_text".into(), json!(c.delivered_text));
    }
    Ok(m)
}
