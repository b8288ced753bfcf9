//! The fee policy's side of the runtime: the rules no fee component may
//! break (a buy moves the contract amount, a fee is at most it, the
//! schedule says what is charged), checked at load and on every quote,
//! and the calls that price a paid action ([`Runtime::fee_quote`]), kept
//! per component.

use super::faults::fault_reply;
use super::{FEES_FAMILY, FeePolicy, Kind, LoadedPlugin, MAX_SCHEDULE_BYTES, Runtime};
use crate::reply::Reply;
use crate::runtime::host::{FeeCtx, Limiter};
use anyhow::Result;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Store;

/// Most prices kept per fee component (then the cache starts over).
const MAX_QUOTES: usize = 4096;

/// The quotes a fee component must answer when it is loaded: every fixed
/// action, and the arbitration fee of a contract (here of 100 webcash).
/// (`buy` and `arbitration` are also tried on [`RULE_BASES`], where a
/// policy may refuse an amount; `pickup` is not: contracts charge the fee
/// fixed at buy.)
pub(super) const SMOKE_QUOTES: [(&str, Option<u64>); 5] = [
    ("identity", None),
    ("post", None),
    ("comment", None),
    ("rate", None),
    ("arbitration", Some(10_000_000_000)),
];

/// The arbitration policies the contracts know (PROTOCOL 4 and 7): a fee
/// policy naming another would have contracts that pay no fee at all.
const POLICIES: [&str; 2] = ["bid-inclusive", "pickup-paid"];

/// Contract amounts a fee component's `buy` and `arbitration` prices are
/// checked on at load ([`quote_keeps_the_rules`]): a unit, a webcash and a
/// hundred. (A policy may refuse some amounts: a refusal there passes.)
pub(super) const RULE_BASES: [u64; 3] = [1, 100_000_000, 10_000_000_000];

/// What no fee policy may price otherwise, whatever its schedule says:
/// a buy moves the contract amount into escrow, no more and no less (a
/// payout or refund is that amount), and a contract's arbitration fee is
/// paid out of that amount, so it is at most the amount (a larger one
/// would let no party settle).
pub(super) fn quote_keeps_the_rules(
    action: &str,
    basis: Option<u64>,
    price: u64,
) -> Result<(), String> {
    use marketplace_common::amount::format;
    match (action, basis) {
        ("buy", Some(amount)) if price != amount => Err(format!(
            "quote(buy) on {} is {}: a buy moves the contract amount into escrow",
            format(amount),
            format(price)
        )),
        ("arbitration", Some(amount)) if price > amount => Err(format!(
            "quote(arbitration) on {} is {}: a contract's fee is at most its amount",
            format(amount),
            format(price)
        )),
        ("buy" | "arbitration", None) => Err(format!("{action} is priced on a contract amount")),
        _ => Ok(()),
    }
}

/// A fee component's `policy()` must be one of [`POLICIES`].
pub(super) fn known_policy(policy: &str) -> Result<()> {
    anyhow::ensure!(
        POLICIES.contains(&policy),
        "policy() is {policy:?}, not one the contracts know ({})",
        POLICIES.join(", ")
    );
    Ok(())
}

/// A fee schedule (`GET /api/fees`) must say what the component charges:
/// a client pays the price it reads there, so a schedule that disagrees
/// with `quote` would have every such payment refused. Checked at load
/// against the smoke quotes: each fixed action's `price` (PROTOCOL 4:
/// `actions.{identity,post,comment,rate}.price`, a decimal string), and
/// `arbitration`'s `policy` and `rate` (the fee on the smoke basis is
/// that rate of it, to the rate's 8 decimals).
pub(super) fn schedule_says_what_is_charged(
    schedule: &serde_json::Value,
    policy: &str,
    quotes: &HashMap<(String, Option<u64>), u64>,
) -> Result<()> {
    use marketplace_common::amount;
    for ((action, basis), quote) in quotes {
        let charged = amount::format(*quote);
        match basis {
            None => {
                let said = &schedule["actions"][action.as_str()]["price"];
                anyhow::ensure!(
                    said.as_str().and_then(|p| amount::parse(p).ok()) == Some(*quote),
                    "the fee schedule's actions.{action}.price is {said}, but quote({action}) charges {charged}: GET /api/fees must say what is charged"
                );
            }
            Some(basis) => {
                let said = &schedule[action.as_str()]["policy"];
                anyhow::ensure!(
                    said.as_str() == Some(policy),
                    "the fee schedule's {action}.policy is {said}, but policy() is {policy:?}"
                );
                // The rate of the amount, to the rate's own precision (8
                // decimals: a third is written 0.33333333).
                let rate = &schedule[action.as_str()]["rate"];
                let fee = rate
                    .as_str()
                    .and_then(|r| amount::parse(r).ok())
                    .map(|r| u128::from(*basis) * u128::from(r) / u128::from(amount::UNIT));
                let slack = u128::from(*basis) / u128::from(amount::UNIT);
                anyhow::ensure!(
                    fee.is_some_and(|fee| fee.abs_diff(u128::from(*quote)) <= slack),
                    "the fee schedule's {action}.rate is {rate}, but quote({action}) on {} charges {charged}: GET /api/fees must say what is charged",
                    amount::format(*basis)
                );
            }
        }
    }
    Ok(())
}

/// A price fee component `plugin` gave before for `action` and `basis`.
fn kept_quote(plugin: &LoadedPlugin, action: &str, basis: Option<u64>) -> Option<u64> {
    let Kind::Fees { quotes, .. } = &plugin.kind else {
        return None;
    };
    let quotes = quotes.lock().unwrap_or_else(|p| p.into_inner());
    quotes.get(&(action.to_string(), basis)).copied()
}

impl Runtime {
    pub(super) fn fee_store(&self, budget: Duration) -> Store<FeeCtx> {
        self.store_for(
            FeeCtx::new(self.limits.memory_bytes, self.fee_settings.clone()),
            budget,
        )
    }

    /// The loaded fee component (503 when none is).
    fn fee_plugin(&self) -> Result<Arc<LoadedPlugin>, Reply> {
        match self.plugin(FEES_FAMILY) {
            Some(plugin) if matches!(plugin.kind, Kind::Fees { .. }) => Ok(plugin),
            Some(_) => Err(Reply::error(500, "internal", "internal error")),
            None => Err(Reply::error(
                503,
                "plugin_unavailable",
                "no fee-policy component is loaded",
            )
            .retry_after_a_second()),
        }
    }

    /// Call the fee component `plugin` (from [`Runtime::fee_plugin`]):
    /// `f` gets the instance bindings.
    fn call_fees<R>(
        &self,
        plugin: &LoadedPlugin,
        f: impl FnOnce(&FeePolicy, &mut Store<FeeCtx>) -> wasmtime::Result<R>,
    ) -> Result<R, Reply> {
        let Kind::Fees { pre, .. } = &plugin.kind else {
            return Err(Reply::error(500, "internal", "internal error"));
        };
        let mut store = self.fee_store(self.limits.deadline);
        let result = pre.instantiate(&mut store).and_then(|b| f(&b, &mut store));
        match result {
            Ok(answer) => {
                plugin.faults.answered();
                Ok(answer)
            }
            Err(e) => {
                let memory = store.data().memory_limit();
                Err(fault_reply(
                    plugin,
                    &e,
                    memory,
                    store.data().panic_message(),
                ))
            }
        }
    }

    /// The fee schedule document (JSON text).
    pub fn fee_schedule(&self) -> Result<String, Reply> {
        let plugin = self.fee_plugin()?;
        let schedule =
            self.call_fees(&plugin, |b, s| b.marketplace_plugin_fees().call_schedule(s))?;
        if schedule.len() > MAX_SCHEDULE_BYTES {
            tracing::error!(
                "the fee schedule is {} bytes, over {} KiB",
                schedule.len(),
                MAX_SCHEDULE_BYTES >> 10
            );
            return Err(Reply::error(500, "internal", "internal error"));
        }
        Ok(schedule)
    }

    /// A price the loaded fee component gave before for the same action
    /// and basis: a fee policy is a published schedule, a function of the
    /// action, the basis and its settings (see the WIT `fees.quote`), so
    /// its answers are kept for as long as that component is loaded.
    pub fn cached_quote(&self, action: &str, basis: Option<u64>) -> Option<u64> {
        kept_quote(&*self.fee_plugin().ok()?, action, basis)
    }

    /// Price of an action in units (kept, see [`Runtime::cached_quote`]).
    pub fn fee_quote(&self, action: &str, basis: Option<u64>) -> Result<u64, Reply> {
        let plugin = self.fee_plugin()?;
        if let Some(price) = kept_quote(&plugin, action, basis) {
            return Ok(price);
        }
        let priced = self.call_fees(&plugin, |b, s| {
            b.marketplace_plugin_fees().call_quote(s, action, basis)
        })?;
        // (Checked at load on a few amounts; here on every one.)
        let priced = priced.and_then(|price| {
            quote_keeps_the_rules(action, basis, price)
                .map(|()| price)
                .map_err(|why| format!("it breaks a rule: {why}"))
        });
        match priced {
            Ok(price) => {
                if let Kind::Fees { quotes, .. } = &plugin.kind {
                    let mut quotes = quotes.lock().unwrap_or_else(|p| p.into_inner());
                    if quotes.len() >= MAX_QUOTES {
                        quotes.clear();
                    }
                    quotes.insert((action.to_string(), basis), price);
                }
                Ok(price)
            }
            Err(e) => {
                tracing::error!(
                    "fee policy cannot price {action}: {}",
                    crate::logging::one_line(&e, 500)
                );
                Err(Reply::error(
                    500,
                    "internal",
                    format!(
                        "the fee policy could not price {action} (the operator's log says why)"
                    ),
                ))
            }
        }
    }

    /// Name of the fee policy in force ("unavailable" when none is
    /// loaded), as the component gave it at load.
    pub fn fee_policy(&self) -> String {
        match self.plugin(FEES_FAMILY).as_deref().map(|p| &p.kind) {
            Some(Kind::Fees { policy, .. }) => policy.clone(),
            _ => "unavailable".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_policy_prices_a_buy_or_a_fee_past_the_contract_amount() {
        assert!(quote_keeps_the_rules("buy", Some(200), 200).is_ok());
        for price in [0, 199, 201] {
            let why = quote_keeps_the_rules("buy", Some(200), price).unwrap_err();
            assert!(why.contains("contract amount into escrow"), "{why}");
        }
        assert!(quote_keeps_the_rules("arbitration", Some(200), 0).is_ok());
        assert!(quote_keeps_the_rules("arbitration", Some(200), 200).is_ok());
        assert!(quote_keeps_the_rules("arbitration", Some(200), 201).is_err());
        // Both are priced on an amount.
        assert!(quote_keeps_the_rules("buy", None, 0).is_err());
        assert!(quote_keeps_the_rules("arbitration", None, 0).is_err());
        // Fixed prices and a pickup fee have no such rule here.
        assert!(quote_keeps_the_rules("post", None, u64::MAX).is_ok());
        assert!(quote_keeps_the_rules("pickup", Some(200), 6).is_ok());
        // Only the policies the contracts know.
        assert!(known_policy("bid-inclusive").is_ok());
        assert!(known_policy("pickup-paid").is_ok());
        for other in ["free-money", "", "Bid-Inclusive"] {
            let why = known_policy(other).unwrap_err().to_string();
            assert!(why.contains("not one the contracts know"), "{why}");
        }
    }

    #[test]
    fn a_fee_schedule_must_say_what_is_charged() {
        let basis = 100 * marketplace_common::amount::UNIT;
        let quotes = |post: u64, arbitration: u64| {
            HashMap::from([
                (("post".to_string(), None), post),
                (("arbitration".to_string(), Some(basis)), arbitration),
            ])
        };
        let schedule = |post: serde_json::Value, rate: &str| {
            serde_json::json!({
                "actions": {"post": {"price": post, "basis": "fixed"}},
                "arbitration": {"policy": "bid-inclusive", "rate": rate},
            })
        };
        let check =
            |s: &serde_json::Value, q| schedule_says_what_is_charged(s, "bid-inclusive", &q);
        // The standard schedule: 0.3 a post, 3 % of 100 webcash.
        assert!(
            check(
                &schedule("0.3".into(), "0.03"),
                quotes(30_000_000, 300_000_000)
            )
            .is_ok()
        );
        // A third, to the rate's 8 decimals.
        assert!(
            check(
                &schedule("0.3".into(), "0.33333333"),
                quotes(30_000_000, 3_333_333_333)
            )
            .is_ok()
        );
        let refused = |s: &serde_json::Value, q| check(s, q).unwrap_err().to_string();
        assert!(
            refused(
                &schedule("0.05".into(), "0.03"),
                quotes(30_000_000, 300_000_000)
            )
            .contains("actions.post.price is \"0.05\", but quote(post) charges 0.3")
        );
        // An amount is a decimal string.
        assert!(
            refused(
                &schedule(0.3.into(), "0.03"),
                quotes(30_000_000, 300_000_000)
            )
            .contains("actions.post.price")
        );
        assert!(
            refused(
                &schedule("0.3".into(), "0.05"),
                quotes(30_000_000, 300_000_000)
            )
            .contains("arbitration.rate")
        );
        let other = schedule_says_what_is_charged(
            &schedule("0.3".into(), "0.03"),
            "pickup-paid",
            &quotes(30_000_000, 300_000_000),
        );
        assert!(
            other
                .unwrap_err()
                .to_string()
                .contains("arbitration.policy")
        );
    }
}
