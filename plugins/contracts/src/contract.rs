//! The stored contract: its record, events and certificate, how it is
//! shown to the public, and the forms of its ids.

use crate::machine::{self, State};
use marketplace_common::amount;
use marketplace_guest::clock;
use marketplace_guest::prelude::*;
use serde::{Deserialize, Serialize};

/// The work_spec of a contract bought without one.
pub(crate) const DEFAULT_WORK_SPEC: &str = "Contract deliverable";

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Event {
    pub(crate) action: String,
    pub(crate) actor: String,
    at: String,
}

/// The certificate as stored: its secret is never stored; the host's
/// escrow issues it and shows it again on each pickup.
#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Certificate {
    pub(crate) certificate_id: String,
    pub(crate) certificate_proof: String,
}

#[derive(Serialize, Deserialize, Clone)]
pub(crate) struct Contract {
    pub(crate) contract_id: String,
    pub(crate) status: State,
    pub(crate) contract_type: String,
    /// Units.
    pub(crate) amount: u64,
    pub(crate) buyer_fingerprint: String,
    pub(crate) target_seller_fingerprint: String,
    pub(crate) reference_post: String,
    pub(crate) work_spec: Value,
    pub(crate) delivery_deadline_ms: u64,
    pub(crate) fee_policy: String,
    /// The 3 % arbitration fee in units, fixed at buy time.
    pub(crate) fee: u64,
    pub(crate) created_at: String,
    pub(crate) updated_at: String,
    pub(crate) history: Vec<Event>,
    // Private members: never part of a GET.
    pub(crate) witness_proof: Option<String>,
    pub(crate) encrypted_witness_secret: Option<String>,
    pub(crate) delivered_text: Option<String>,
    pub(crate) certificate: Option<Certificate>,
    /// Under pickup-paid: whether the fee-paying first pickup happened.
    pub(crate) fee_paid: bool,
    /// The arbiter's signature over the terms at issue (PROTOCOL 10).
    #[serde(default)]
    pub(crate) arbiter_signature: Option<String>,
    /// Kinds ("payout", "refund") already handed out to a legacy
    /// (untimestamped) signature: once only (PROTOCOL 10).
    #[serde(default)]
    pub(crate) legacy_pickups: Vec<String>,
}

impl Contract {
    pub(crate) fn deadline_passed(&self) -> bool {
        clock::now_ms() > self.delivery_deadline_ms
    }

    pub(crate) fn allowed(&self) -> Vec<&'static str> {
        machine::allowed_actions(self.status, self.deadline_passed())
    }

    /// [`Contract::allowed`] per party: who may act next.
    pub(crate) fn allowed_by_role(&self) -> Value {
        let of = |role| machine::actions_of(self.status, role, self.deadline_passed());
        json!({"buyer": of(machine::Role::Buyer), "seller": of(machine::Role::Seller)})
    }

    /// The public document (never a secret).
    pub(crate) fn public(&self) -> Value {
        json!({
            "contract_id": self.contract_id,
            "status": self.status.name(),
            "contract_type": self.contract_type,
            "amount": amount::format(self.amount),
            "buyer_fingerprint": self.buyer_fingerprint,
            "target_seller_fingerprint": self.target_seller_fingerprint,
            "reference_post": self.reference_post,
            // The text the arbiter signed when none was given (PROTOCOL
            // 10), so the signature checks from the document's own fields.
            "work_spec": match &self.work_spec {
                Value::Null => json!(DEFAULT_WORK_SPEC),
                given => given.clone(),
            },
            "delivery_deadline": marketplace_guest::rfc3339(self.delivery_deadline_ms),
            "fee_policy": self.fee_policy,
            "arbitration_fee": amount::format(self.fee),
            "arbiter_signature": self.arbiter_signature,
            "witness": self.witness_proof.is_some(),
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "history": self.history,
        })
    }

    pub(crate) fn record(&mut self, action: &str, actor: &str) {
        let now = marketplace_guest::now_rfc3339();
        self.history.push(Event {
            action: action.into(),
            actor: actor.into(),
            at: now.clone(),
        });
        self.updated_at = now;
    }

    pub(crate) fn save(&self) -> Result<(), ApiError> {
        kv::put(&format!("c/{}", self.contract_id), self)
    }
}

pub(crate) fn load(id: &str) -> Result<Contract, ApiError> {
    kv::get(&format!("c/{id}"))?.ok_or_else(|| ApiError::not_found(format!("contract {id}")))
}

pub(crate) fn valid_contract_id(id: &str) -> bool {
    id.len() > 4
        && id.len() <= 68
        && id.starts_with("CTR_")
        && id[4..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A certificate id: `CRT_` and a ULID (as settlement makes them).
pub(crate) fn valid_certificate_id(id: &str) -> bool {
    id.strip_prefix("CRT_")
        .is_some_and(|u| u.len() == 26 && u.bytes().all(|b| b.is_ascii_alphanumeric()))
}
