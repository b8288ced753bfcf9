//! Fee policy `pickup-paid` (SPEC rule P, statement A): the first pickup of
//! a contract pays 3 % of its amount; later pickups are free; the payout is
//! the whole amount.

use marketplace_guest::prelude::*;
use standard::Pickup;

struct PickupPaid;

impl FeePolicy for PickupPaid {
    const NAME: &'static str = "fees-pickup-paid";
    const POLICY: &'static str = "pickup-paid";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(standard::SETTINGS);

    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String> {
        standard::quote(Pickup::FirstPaid, action, basis)
    }

    fn schedule() -> Value {
        standard::schedule(
            Self::NAME,
            env!("CARGO_PKG_VERSION"),
            Self::POLICY,
            Pickup::FirstPaid,
        )
    }
}

marketplace_guest::fee_plugin!(PickupPaid);
