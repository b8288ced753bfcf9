//! Fee policy `bid-inclusive` (SPEC rule P, statement B, the default):
//! pickups are free and the 3 % arbitration fee is inside the bid, so the
//! seller's payout is the amount less the fee.

use marketplace_guest::prelude::*;
use standard::Pickup;

struct BidInclusive;

impl FeePolicy for BidInclusive {
    const NAME: &'static str = "fees-bid-inclusive";
    const POLICY: &'static str = "bid-inclusive";
    const SETTINGS: Option<&'static [marketplace_guest::Setting]> = Some(standard::SETTINGS);

    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String> {
        standard::quote(Pickup::Free, action, basis)
    }

    fn schedule() -> Value {
        standard::schedule(
            Self::NAME,
            env!("CARGO_PKG_VERSION"),
            Self::POLICY,
            Pickup::Free,
        )
    }
}

marketplace_guest::fee_plugin!(BidInclusive);
