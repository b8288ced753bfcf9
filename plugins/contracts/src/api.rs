//! The routes of the `contracts` family and their OpenAPI.

use crate::machine::{ACTIONS, STATES};
use marketplace_guest::openapi::{self, Op, nonblank, obj, op, pattern, r, t, with_signature};
use marketplace_guest::prelude::*;

/// What `work_spec` may be, and how the arbiter signs it (PROTOCOL 10).
const WORK_SPEC: &str = "the work: text, or any JSON value (an object of terms, say), at most 65,536 bytes as compact JSON; kept as given. The arbiter signs a text as it is, another value as its compact JSON with object keys sorted, and none as \"Contract deliverable\" (which the contract then shows)";

/// Every operation of the family.
pub const OPS: &[Op] = &[
    Op {
        paid: Some("buy (the contract amount, held in escrow)"),
        body: Some("Buy"),
        ok: (201, "Bought"),
        errors: &[400, 401, 402, 403, 404, 409, 429],
        ..op(
            "POST",
            "/api/arbitration/contracts/buy",
            "buy",
            "contracts",
            "Buy: open a contract",
            "Signed `buy_contract:{buyer}:{reference_post}:{contract_id}:{witness_proof}`. The seller is the reference post's author: 404 `not_found` when the post is absent or its author's identity was deleted (nobody could accept), 403 `forbidden_party` when it is the buyer. One identity buys at most 100 contracts a UTC day (`[settings.contracts] buys_per_day`): past it 429 `rate_limited` with `Retry-After` (the seconds to the next day), nothing spent.",
        )
    },
    Op {
        ok: (200, "Contract"),
        errors: &[404],
        ..op(
            "GET",
            "/api/arbitration/contracts/{id}",
            "getContract",
            "contracts",
            "One contract",
            "Never contains a secret.",
        )
    },
    Op {
        ok: (200, "ContractStatus"),
        errors: &[404],
        ..op(
            "GET",
            "/api/arbitration/contracts/{id}/status",
            "getContractStatus",
            "contracts",
            "Contract status",
            "Status and the actions some party could take now.",
        )
    },
    Op {
        paid: Some("pickup (first settling pickup under pickup-paid)"),
        body: Some("Action"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 402, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/pickup",
            "pickup",
            "contracts",
            "Pickup",
            "Collect what the contract owes you: certificate (buyer), payout (seller), refund (buyer). A payout or refund comes to a fresh signature ({contract_id}:{timestamp}) at any time, and to a legacy one ({contract_id}) once: a later legacy pickup is 409 already_picked_up with the public form of what was issued.",
        )
    },
    Op {
        body: Some("Accept"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/accept",
            "accept",
            "contracts",
            "Accept (seller)",
            "issued -> active; signed `accept:{id}:{seller_fingerprint}`.",
        )
    },
    Op {
        body: Some("Deliver"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/deliver",
            "deliver",
            "contracts",
            "Deliver (seller)",
            "active -> delivered; signed `deliver:{id}:{delivered_text}`; needs the witness secret when the contract has one (a wrong one, or one sent for a contract without a witness, is 403 witness_mismatch).",
        )
    },
    Op {
        body: Some("Action"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/refund",
            "refund",
            "contracts",
            "Refund",
            "Signed `REFUND:{id}`. By the buyer: issued -> refunded, or active -> refunded once `delivery_deadline` has passed. By the seller: active or delivered -> refunded. The refund is the buyer's to pick up (`pickup`). Who may act now: `actions_by_role` of the contract's status.",
        )
    },
    Op {
        body: Some("Release"),
        ok: (200, "ActionResult"),
        errors: &[400, 401, 403, 404, 409],
        ..op(
            "POST",
            "/api/arbitration/contracts/{id}/release",
            "release",
            "contracts",
            "Release",
            "Signed `release:{id}`. By the buyer: active or delivered -> settled. By the seller: records a shipment, active -> delivered, with `tracking_number` (required from the seller: 400 invalid_request without it or when it is blank) and `tracking_carrier` becoming `delivered_text`, shown with the contract's current `witness_secret` (a wrong one, or one sent for a contract without a witness, is 403 forbidden_party).",
        )
    },
    Op {
        body: Some("GraphQl"),
        ok: (200, "GraphQlAnswer"),
        writes: Some(false),
        errors: &[400],
        ..op(
            "POST",
            "/api/graphql",
            "graphql",
            "contracts",
            "Arbiter key (GraphQL)",
            "Answers the query `{ arbiterPubkey }` with `{\"data\": {\"arbiterPubkey\": <64 hex>}}`: the key that signs `arbiter_signature` on bought contracts. Any other query gets GraphQL `errors`. A body that is not JSON, without a `query` string, with a `query` over 10,000 characters, or with `variables` other than an object or null or `operationName` other than a string or null, is 400 `invalid_request` (with GraphQL `errors` too). An `operationName` that names no operation of the query (an anonymous one has no name) is a GraphQL error.",
        )
    },
    Op {
        body: Some("WitnessReplace"),
        ok: (200, "Success"),
        errors: &[400],
        ..op(
            "POST",
            "/api/witness/replace",
            "witnessReplace",
            "contracts",
            "Replace witness secrets",
            "Old secrets become spent, new ones live.",
        )
    },
    Op {
        body: Some("StringList"),
        ok: (200, "WitnessHealth"),
        // Only reads: a snapshot, no durable commit per (anonymous) call.
        writes: Some(false),
        errors: &[400],
        ..op(
            "POST",
            "/api/witness/health_check",
            "witnessHealthCheck",
            "contracts",
            "Witness states",
            "live, spent, burned or null for each proof.",
        )
    },
];

/// The component schemas the operations reference (besides the host's:
/// `StringList`, `Success`).
pub fn schemas() -> Value {
    let contract = obj(
        &[
            ("contract_id", t("string")),
            ("status", r("ContractState")),
            ("contract_type", t("string")),
            ("amount", openapi::amount()),
            ("buyer_fingerprint", t("string")),
            ("target_seller_fingerprint", t("string")),
            ("reference_post", t("string")),
            ("work_spec", json!({"description": WORK_SPEC})),
            (
                "delivery_deadline",
                json!({"type": "string", "format": "date-time", "description": "to the second, as the arbiter signed it"}),
            ),
            ("fee_policy", t("string")),
            ("arbitration_fee", openapi::amount()),
            (
                "witness",
                json!({"type": "boolean", "description": "whether delivery needs a witness secret (the contract was bought with witness_proof)"}),
            ),
            (
                "arbiter_signature",
                json!({"type": ["string", "null"], "description": "hex Ed25519 signature by the arbiter key over arbiter_issue:{sha256 of the length-prefixed terms}"}),
            ),
            ("created_at", t("string")),
            ("updated_at", t("string")),
            (
                "history",
                json!({"type": "array", "description": "every transition, oldest first, and each party's first pickup of a settled or refunded contract (the seller's payout, the buyer's certificate or refund); a pickup that fetches the same secret again is not repeated", "items": obj(&[("action", t("string")), ("actor", json!({"type": "string", "description": "the fingerprint of the party that acted"})), ("at", json!({"type": "string", "format": "date-time"}))], &[])}),
            ),
        ],
        &["contract_id", "status"],
    );
    // The state machine's names, for clients to branch on.
    let names = |names: Vec<&str>| json!({"type": "string", "enum": names});
    let states = names(STATES.iter().map(|s| s.name()).collect());
    let action_names = names(ACTIONS.iter().map(|a| a.name()).collect());
    let actions = json!({"type": "array", "items": r("ContractAction")});
    // A bearer contract's witness, or a settled contract's certificate.
    let witness_secret =
        pattern("^n:(CTR_[A-Za-z0-9_-]{1,64}|CRT_[0-9A-Za-z]{26}):secret:[0-9a-f]{64}$");
    json!({
        "Buy": with_signature(vec![("buyer_fingerprint", t("string")), ("contract_type", json!({"enum": ["service", "product_digital", "product_physical"]})), ("amount", openapi::positive_amount()), ("reference_post", nonblank(128)),
            ("contract_id", json!({"type": "string", "pattern": "^(CTR_[A-Za-z0-9_-]{1,64})?$", "description": "an id of the buyer's choosing; absent or \"\" (signed as the empty string): the server makes CTR_<ULID>"})), ("work_spec", json!({"description": WORK_SPEC})), ("delivery_deadline", json!({"type": "string", "format": "date-time", "description": "must be in the future; kept to the second (a fraction is dropped); default 7 days from now"})), ("witness_proof", json!({"type": "string", "pattern": "^(n:CTR_[A-Za-z0-9_-]{1,64}:public:[0-9a-f]{64})?$", "description": "needs a client-supplied contract_id; \"\" is none (signed as the empty string)"})), ("encrypted_witness_secret", json!({"type": "string", "maxLength": 8192})), ("accept_terms", json!({"const": true}))],
            &["contract_type", "amount", "reference_post", "accept_terms"]),
        "ContractState": states,
        "ContractAction": action_names,
        "Bought": obj(&[("contract_id", t("string")), ("status", r("ContractState")), ("allowed_actions", actions.clone()), ("target_seller_fingerprint", t("string")), ("arbiter_signature", t("string")), ("contract", r("Contract")), ("payment", openapi::payment())], &["contract_id", "status", "contract"]),
        "Release": with_signature(vec![("actor_fingerprint", t("string")), ("tracking_number", json!({"type": "string", "maxLength": 200})), ("tracking_carrier", json!({"type": "string", "maxLength": 100})), ("witness_secret", t("string"))], &[]),
        "GraphQl": obj(&[("query", json!({"type": "string", "maxLength": 10000})), ("operationName", json!({"type": ["string", "null"]})), ("variables", json!({"type": ["object", "null"]}))], &["query"]),
        "GraphQlAnswer": obj(&[("data", json!({"type": ["object", "null"]})), ("errors", json!({"type": "array", "items": obj(&[("message", t("string"))], &["message"])}))], &[]),
        "Contract": contract,
        "ContractStatus": obj(&[("contract_id", t("string")), ("status", r("ContractState")), ("allowed_actions", actions.clone()), ("actions_by_role", json!({"type": "object", "description": "allowed_actions split by who may take them now: the buyer's and the seller's (a pickup may be both parties', each collecting their own)", "properties": {"buyer": actions.clone(), "seller": actions}, "required": ["buyer", "seller"]})), ("updated_at", t("string"))], &["contract_id", "status", "allowed_actions"]),
        "Action": with_signature(vec![("actor_fingerprint", t("string"))], &[]),
        "Accept": with_signature(vec![("seller_fingerprint", t("string"))], &[]),
        "Deliver": with_signature(vec![("actor_fingerprint", t("string")), ("delivered_text", nonblank(65536)), ("witness_secret", t("string"))], &["delivered_text"]),
        "ActionResult": obj(&[("contract_id", t("string")), ("status", r("ContractState")), ("allowed_actions", actions.clone()), ("certificate_id", t("string")), ("certificate_secret", json!({"type": "string", "description": "a bearer witness of the certificate: n:{certificate_id}:secret:{64 hex} (live in the witness ledger until witness/replace moves it)"})), ("certificate_proof", json!({"type": "string", "description": "n:{certificate_id}:public:{sha256 of the secret's 32 bytes}, for witness/health_check"})), ("delivered_text", json!({"type": ["string", "null"], "description": "what the seller delivered (null when the contract settled without a delivery)"})), ("payout", json!({"type": "string", "description": "the seller's payout: a cash secret e{amount}:secret:{64 hex}"})), ("payout_amount", openapi::amount()), ("refund", json!({"type": "string", "description": "the buyer's refund: a cash secret e{amount}:secret:{64 hex}"})), ("refund_amount", openapi::amount()), ("witness_secret_encrypted_for_seller", json!({"type": ["string", "null"], "description": "accept: the buyer's encrypted_witness_secret, as given at buy (null when none)"})), ("payment", openapi::payment())], &["contract_id", "status", "allowed_actions"]),
        "WitnessReplace": obj(&[("secrets", json!({"type": "array", "items": witness_secret, "minItems": 1, "maxItems": 100})), ("new_secrets", json!({"type": "array", "items": witness_secret, "minItems": 1, "maxItems": 100}))], &["secrets", "new_secrets"]),
        "WitnessHealth": obj(&[("status", t("string")), ("results", json!({"type": "object", "additionalProperties": obj(&[("spent", json!({"type": ["boolean", "null"]})), ("state", json!({"type": ["string", "null"]})), ("contract_id", json!({"type": ["string", "null"]}))], &["spent", "state", "contract_id"])}))], &[]),
    })
}

/// What the family serves (its `describe-api` export): the operations and
/// the schemas they reference.
pub fn api() -> marketplace_guest::types::Api {
    openapi::api(OPS, schemas())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemas_resolve() {
        assert_eq!(openapi::check(OPS, &schemas()), Ok(()));
    }

    #[test]
    fn routes_are_the_familys() {
        let expected = [
            ("POST", "/api/arbitration/contracts/buy", true),
            ("GET", "/api/arbitration/contracts/{id}", false),
            ("GET", "/api/arbitration/contracts/{id}/status", false),
            ("POST", "/api/arbitration/contracts/{id}/pickup", true),
            ("POST", "/api/arbitration/contracts/{id}/accept", true),
            ("POST", "/api/arbitration/contracts/{id}/deliver", true),
            ("POST", "/api/arbitration/contracts/{id}/refund", true),
            ("POST", "/api/arbitration/contracts/{id}/release", true),
            ("POST", "/api/graphql", false),
            ("POST", "/api/witness/replace", true),
            ("POST", "/api/witness/health_check", false),
        ];
        assert_eq!(openapi::routes_of(&api()), expected);
    }
}
