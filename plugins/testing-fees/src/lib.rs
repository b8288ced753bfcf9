//! Test-only fee policy: the standard bid-inclusive schedule, made to
//! misbehave by its `[settings.fees]`, as a careless author's would:
//! - `panic_on = "ACTION"`: quoting ACTION panics (for `arbitration`, on
//!   any amount but the 100 webcash of the host's smoke quote at load, so
//!   it loads and a buy then finds the panic);
//! - `schedule_post = "AMOUNT"`: its schedule (`GET /api/fees`) says a
//!   post costs AMOUNT while `quote(post)` charges the standard price.

use marketplace_guest::fee_bindings::marketplace::plugin::settings;
use marketplace_guest::prelude::*;
use standard::Pickup;

/// The contract amount of the host's smoke quote of `arbitration`.
const SMOKE_BASIS: u64 = 100 * amount::UNIT;

struct Misbehaving;

impl FeePolicy for Misbehaving {
    const NAME: &'static str = "testing-fees";
    const POLICY: &'static str = "bid-inclusive";

    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String> {
        let smoke = action == "arbitration" && basis == Some(SMOKE_BASIS);
        if settings::get("panic_on").as_deref() == Some(action) && !smoke {
            panic!("deliberate panic quoting {action}");
        }
        standard::quote(Pickup::Free, action, basis)
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
