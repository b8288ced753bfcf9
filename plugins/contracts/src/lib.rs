//! The `contracts` family: arbitration (escrow) contracts between a buyer
//! and the seller of a listing, with certificates and bearer witnesses.
//!
//! Keyspace `contracts`:
//! - `c/{contract_id}` -> [`Contract`] (no spendable secret; never served raw)
//! - `w/{witness proof}` -> `{"contract_id", "state": live|spent|burned}`,
//!   and for a certificate (a bearer witness of its own, `n:CRT_...`) also
//!   `"certificate_id"`
//! - `by/{fingerprint}/{contract_id}` -> empty: the contracts of each party
//!   ([`parties`]), `meta/by-party` how far the index covers older ones
//! - `q/{fingerprint}` -> the buyer's buys of the current UTC day
//!
//! Money goes through the host's escrow, one account per contract: buy
//! charges the amount and holds it in the contract's account; settlement
//! earns the fee out of it (bid-inclusive) or the first pickup pays the fee
//! fixed at buy (pickup-paid); payouts and refunds come out of the account
//! and are recorded by the host, so every repeat of a pickup returns the
//! same secret and nothing is ever paid twice.

mod api;
pub mod machine;
mod parties;

use machine::{Action, Collect, Role, State, Verdict};
use marketplace_common::{amount, hex};
use marketplace_guest::prelude::*;
use marketplace_guest::quota::Quota;
use marketplace_guest::{arbiter, clock, escrow, ids, payments};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

struct Contracts;

const CONTRACT_TYPES: &[&str] = &["service", "product_digital", "product_physical"];
const DEFAULT_DEADLINE_MS: u64 = 7 * 24 * 3600 * 1000;
const MAX_TEXT: usize = 64 * 1024;

#[derive(Serialize, Deserialize, Clone)]
struct Event {
    action: String,
    actor: String,
    at: String,
}

/// The certificate as stored: its secret is never stored; the host's
/// escrow issues it and shows it again on each pickup.
#[derive(Serialize, Deserialize, Clone)]
struct Certificate {
    certificate_id: String,
    certificate_proof: String,
}

#[derive(Serialize, Deserialize, Clone)]
struct Contract {
    contract_id: String,
    status: State,
    contract_type: String,
    /// Units.
    amount: u64,
    buyer_fingerprint: String,
    target_seller_fingerprint: String,
    reference_post: String,
    work_spec: Value,
    delivery_deadline_ms: u64,
    fee_policy: String,
    /// The 3 % arbitration fee in units, fixed at buy time.
    fee: u64,
    created_at: String,
    updated_at: String,
    history: Vec<Event>,
    // Private members: never part of a GET.
    witness_proof: Option<String>,
    encrypted_witness_secret: Option<String>,
    delivered_text: Option<String>,
    certificate: Option<Certificate>,
    /// Under pickup-paid: whether the fee-paying first pickup happened.
    fee_paid: bool,
    /// The arbiter's signature over the terms at issue (PROTOCOL 10).
    #[serde(default)]
    arbiter_signature: Option<String>,
    /// Kinds ("payout", "refund") already handed out to a legacy
    /// (untimestamped) signature: once only (PROTOCOL 10).
    #[serde(default)]
    legacy_pickups: Vec<String>,
}

impl Contract {
    fn deadline_passed(&self) -> bool {
        clock::now_ms() > self.delivery_deadline_ms
    }

    fn allowed(&self) -> Vec<&'static str> {
        machine::allowed_actions(self.status, self.deadline_passed())
    }

    /// [`Contract::allowed`] per party: who may act next.
    fn allowed_by_role(&self) -> Value {
        let of = |role| machine::actions_of(self.status, role, self.deadline_passed());
        json!({"buyer": of(machine::Role::Buyer), "seller": of(machine::Role::Seller)})
    }

    /// The public document (never a secret).
    fn public(&self) -> Value {
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

    fn record(&mut self, action: &str, actor: &str) {
        let now = marketplace_guest::now_rfc3339();
        self.history.push(Event {
            action: action.into(),
            actor: actor.into(),
            at: now.clone(),
        });
        self.updated_at = now;
    }

    fn save(&self) -> Result<(), ApiError> {
        kv::put(&format!("c/{}", self.contract_id), self)
    }
}

fn load(id: &str) -> Result<Contract, ApiError> {
    kv::get(&format!("c/{id}"))?.ok_or_else(|| ApiError::not_found(format!("contract {id}")))
}

fn valid_contract_id(id: &str) -> bool {
    id.len() > 4
        && id.len() <= 68
        && id.starts_with("CTR_")
        && id[4..]
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// A certificate id: `CRT_` and a ULID (as settlement makes them).
fn valid_certificate_id(id: &str) -> bool {
    id.strip_prefix("CRT_")
        .is_some_and(|u| u.len() == 26 && u.bytes().all(|b| b.is_ascii_alphanumeric()))
}

/// Proof of a witness secret `n:{id}:secret:{64 hex}`: `n:{id}:public:{sha256
/// of the raw 32 bytes}`. The id is a contract's (a bearer contract's
/// witness) or a certificate's.
fn witness_proof_of(secret: &str) -> Option<String> {
    let rest = secret.strip_prefix("n:")?;
    let (id, hexpart) = rest.split_once(":secret:")?;
    if !(valid_contract_id(id) || valid_certificate_id(id)) || hexpart.len() != 64 {
        return None;
    }
    let raw = hex::decode(hexpart)?;
    Some(format!("n:{id}:public:{}", hex::sha256(raw)))
}

fn valid_witness_proof(proof: &str, contract_id: &str) -> bool {
    proof
        .strip_prefix(&format!("n:{contract_id}:public:"))
        .is_some_and(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        })
}

impl Endpoint for Contracts {
    const NAME: &'static str = "contracts";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> =
        Some(&[marketplace_guest::Setting {
            key: BUYS.setting,
            check: |v| BUYS.check(v),
        }]);

    fn api() -> marketplace_guest::types::Api {
        api::api()
    }

    fn handle(req: &Request) -> Result<Response, ApiError> {
        match (req.method(), req.route()) {
            ("POST", "/api/arbitration/contracts/buy") => buy(req),
            ("GET", "/api/arbitration/contracts/{id}") => {
                Ok(json(200, &load(req.param("id"))?.public()))
            }
            ("GET", "/api/arbitration/contracts/{id}/status") => {
                let c = load(req.param("id"))?;
                Ok(json(
                    200,
                    &json!({"contract_id": c.contract_id, "status": c.status.name(),
                            "allowed_actions": c.allowed(),
                            "actions_by_role": c.allowed_by_role(), "updated_at": c.updated_at}),
                ))
            }
            ("POST", "/api/arbitration/contracts/{id}/accept") => act(req, Action::Accept),
            ("POST", "/api/arbitration/contracts/{id}/deliver") => act(req, Action::Deliver),
            ("POST", "/api/arbitration/contracts/{id}/pickup") => act(req, Action::Pickup),
            ("POST", "/api/arbitration/contracts/{id}/refund") => act(req, Action::Refund),
            ("POST", "/api/arbitration/contracts/{id}/release") => act(req, Action::Release),
            ("POST", "/api/witness/replace") => witness_replace(req),
            ("POST", "/api/witness/health_check") => witness_health(req),
            ("POST", "/api/graphql") => graphql(req),
            _ => Err(ApiError::not_found(format!("route {}", req.route()))),
        }
    }
}

/// Contracts one identity buys in a UTC day (`buys_per_day`, 1 to a
/// million; default 100). A buy refunded before acceptance gives back its
/// whole amount, so without a cap a stranger could store contracts (each
/// with up to 64 KiB of terms) endlessly for the price of one identity (an
/// outside probe wrote 2.5 GB in 75 s).
const BUYS: Quota = Quota {
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

fn buy(req: &Request) -> Result<Response, ApiError> {
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

/// The work_spec of a contract bought without one.
const DEFAULT_WORK_SPEC: &str = "Contract deliverable";

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

/// The longest GraphQL query, in characters (the document's `maxLength`).
const MAX_GRAPHQL_QUERY: usize = 10_000;

/// `POST /api/graphql`: the one query the original client sends,
/// `{ arbiterPubkey }`; anything else is a GraphQL error (never a 404).
fn graphql(req: &Request) -> Result<Response, ApiError> {
    let errors = |message: &str| json(200, &json!({"errors": [{"message": message}]}));
    // Both a protocol error and a GraphQL one, for either kind of client.
    let refused = |message: &str, field: &str, problem: &str| {
        json(
            400,
            &json!({"code": "invalid_request", "message": message, "errors": [{"message": message}],
                    "details": [{"field": field, "problem": problem}]}),
        )
    };
    let sent = match serde_json::from_slice::<Value>(req.body()) {
        Ok(v) => Some(v),
        Err(e) => {
            return Ok(refused(
                "the body must be JSON with a `query` string",
                "body",
                &format!("invalid JSON: {e}"),
            ));
        }
    };
    let Some(query) = sent
        .as_ref()
        .and_then(|v| v.get("query"))
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Ok(refused(
            "the body must be JSON with a `query` string",
            "query",
            "must be a string in a JSON object body",
        ));
    };
    // GraphQL over HTTP: `variables` is a map and `operationName` a name,
    // when given (the one query here takes neither, but a malformed
    // request is refused, not answered).
    for (field, fits, kind) in [
        (
            "variables",
            Value::is_object as fn(&Value) -> bool,
            "an object or null",
        ),
        ("operationName", Value::is_string, "a string or null"),
    ] {
        if let Some(v) = sent.as_ref().and_then(|b| b.get(field))
            && !v.is_null()
            && !fits(v)
        {
            return Ok(refused(
                &format!("`{field}` must be {kind}"),
                field,
                &format!("must be {kind}"),
            ));
        }
    }
    // The document's `maxLength`, in characters as JSON Schema counts.
    if query.chars().count() > MAX_GRAPHQL_QUERY {
        let most = format!("at most {MAX_GRAPHQL_QUERY} characters");
        return Ok(refused(
            &format!("the query is too long: {most}"),
            "query",
            &most,
        ));
    }
    // Selection of the one root field, with an optional `query [Name]`.
    let body = query.trim();
    let (name, body) = match body.strip_prefix("query") {
        Some(rest) => {
            let rest = rest.trim_start();
            let end = rest
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .unwrap_or(rest.len());
            (Some(&rest[..end]).filter(|n| !n.is_empty()), &rest[end..])
        }
        None => (None, body),
    };
    let body = body.trim();
    // `operationName` picks an operation of the document: here its one,
    // by its name (an anonymous one has none to pick it by).
    if let Some(asked) = sent
        .as_ref()
        .and_then(|b| b.get("operationName"))
        .and_then(Value::as_str)
        && name != Some(asked)
    {
        return Ok(errors(&format!("Unknown operation named \"{asked}\"")));
    }
    let field = body
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .map(str::trim);
    match field {
        Some("arbiterPubkey") => Ok(json(
            200,
            &json!({"data": {"arbiterPubkey": arbiter::public_key()}}),
        )),
        Some(other) => Ok(errors(&format!(
            "Cannot query field \"{other}\" on type \"Query\"; this service answers {{ arbiterPubkey }}"
        ))),
        None => Ok(errors(
            "Syntax Error: expected a selection set like { arbiterPubkey }",
        )),
    }
}

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

fn act(req: &Request, action: Action) -> Result<Response, ApiError> {
    let id = req.param("id").to_string();
    let mut body = Body::parse(req)?;
    let delivered_text = if action == Action::Deliver {
        body.required_str("delivered_text", MAX_TEXT)
    } else {
        None
    };
    let witness_secret = body.optional_str("witness_secret", 200);
    let tracking_number = body.optional_str("tracking_number", 200);
    let tracking_carrier = body.optional_str("tracking_carrier", 100);
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
                    if check_witness(&c, witness_secret.as_deref()).is_err() {
                        return Err(ApiError::new(
                            403,
                            "forbidden_party",
                            "releasing needs the contract's current witness secret in witness_secret",
                        ));
                    }
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
    let mut doc =
        json!({"contract_id": id, "status": c.status.name(), "allowed_actions": c.allowed()});
    for (k, v) in extra {
        doc[k] = v;
    }
    Ok(json(200, &doc))
}

/// A payout or refund: to a fresh signature (`{contract_id}:{timestamp}`)
/// at any time; to a legacy one (`{contract_id}`, what the original client
/// sends) once, a later legacy pickup being 409 `already_picked_up` with
/// the public form of what was issued (PROTOCOL 10).
fn collect(
    c: &mut Contract,
    kind: &str,
    units: u64,
    timestamp: Option<u64>,
) -> Result<String, ApiError> {
    let secret = escrow::payout(&c.contract_id, kind, units)?;
    if timestamp.is_none() {
        if c.legacy_pickups.iter().any(|k| k == kind) {
            let public = marketplace_common::secret::parse(&secret)
                .map(|p| {
                    let hash = hex::sha256(&p.hex);
                    marketplace_common::secret::public_string(p.amount, &hash)
                })
                .map_err(ApiError::internal)?;
            return Err(ApiError::new(
                409,
                "already_picked_up",
                format!(
                    "the {kind} of {} was handed out already; sign \"{{contract_id}}:{{timestamp}}\" and send timestamp to fetch it again",
                    c.contract_id
                ),
            )
            .with("issued", json!(public)));
        }
        c.legacy_pickups.push(kind.to_string());
    }
    Ok(secret)
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

fn check_witness(c: &Contract, secret: Option<&str>) -> Result<(), ApiError> {
    let Some(current) = &c.witness_proof else {
        return Ok(());
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
            "deliver needs the contract's current witness secret in witness_secret",
        ))
    }
}

fn burn_witness(c: &Contract) -> Result<(), ApiError> {
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
fn witness_replace(req: &Request) -> Result<Response, ApiError> {
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
fn witness_health(req: &Request) -> Result<Response, ApiError> {
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

marketplace_guest::endpoint_plugin!(Contracts);

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
