//! Test-only fee policy: the standard bid-inclusive schedule, made to
//! misbehave by its `[settings.fees]`, as a careless author's would:
//! - `panic_on = "ACTION"`: quoting ACTION panics (for `arbitration`, on
//!   any amount but those the host quotes at load, a unit, one and a
//!   hundred webcash, so it loads and a buy of another then finds the
//!   panic);
//! - `schedule_post = "AMOUNT"`: its schedule (`GET /api/fees`) says a
//!   post costs AMOUNT while `quote(post)` charges the standard price;
//! - `buy_plus = "AMOUNT"`: a buy costs the contract amount and AMOUNT
//!   more (`buy_plus_later`: only on amounts the host does not quote at
//!   load);
//! - `arbitration_twice = "true"`: the arbitration fee is twice the
//!   contract amount.

use marketplace_guest::fee_bindings::marketplace::plugin::settings;
use marketplace_guest::prelude::*;
use standard::Pickup;

/// The contract amounts the host quotes `arbitration` on at load.
const SMOKE_BASES: [u64; 3] = [1, amount::UNIT, 100 * amount::UNIT];

struct Misbehaving;

impl FeePolicy for Misbehaving {
    const NAME: &'static str = "testing-fees";
    const POLICY: &'static str = "bid-inclusive";

    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String> {
        let smoke = action == "arbitration" && basis.is_some_and(|b| SMOKE_BASES.contains(&b));
        if settings::get("panic_on").as_deref() == Some(action) && !smoke {
            panic!("deliberate panic quoting {action}");
        }
        let loaded = basis.is_some_and(|b| SMOKE_BASES.contains(&b));
        let extra = |key: &str| settings::get(key).and_then(|a| amount::parse(&a).ok());
        match (action, basis) {
            ("buy", Some(b)) => {
                let plus = extra("buy_plus")
                    .or_else(|| extra("buy_plus_later").filter(|_| !loaded))
                    .unwrap_or(0);
                Ok(b + plus)
            }
            ("arbitration", Some(b)) if settings::get("arbitration_twice").is_some() => Ok(b * 2),
            _ => standard::quote(Pickup::Free, action, basis),
        }
    }

    fn schedule() -> Value {
        let mut schedule = standard::schedule(
            Self::NAME,
            env!("CARGO_PKG_VERSION"),
            Self::POLICY,
            Pickup::Free,
        );
        if let Some(price) = settings::get("schedule_post") {
            schedule["actions"]["post"]["price"] = json!(price);
        }
        schedule
    }
}

marketplace_guest::fee_plugin!(Misbehaving);
