//! The `contracts` family: arbitration (escrow) contracts between a buyer
//! and the seller of a listing, with certificates and bearer witnesses.
//!
//! Keyspace `contracts`:
//! - `c/{contract_id}` -> [`contract::Contract`] (no spendable secret; never served raw)
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
//!
//! Where things are: `machine` (the state machine, its transition table
//! as data), `contract` (the stored record and its ids), `buy`, `act` (a
//! party's signed actions and the money they move), `witness` (bearer
//! witnesses), `parties` (each party's contracts), `graphql`, `api` (the
//! family's routes and their OpenAPI).

mod act;
mod api;
mod buy;
mod contract;
mod graphql;
pub mod machine;
mod parties;
mod witness;

use act::act;
use buy::{BUYS, buy};
use contract::load;
use graphql::graphql;
use machine::Action;
use marketplace_guest::prelude::*;
use witness::{witness_health, witness_replace};

struct Contracts;

const CONTRACT_TYPES: &[&str] = &["service", "product_digital", "product_physical"];
const DEFAULT_DEADLINE_MS: u64 = 7 * 24 * 3600 * 1000;
const MAX_TEXT: usize = 64 * 1024;

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

marketplace_guest::endpoint_plugin!(Contracts);
