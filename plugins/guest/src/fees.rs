//! Fee-policy plugins, and the standard schedule both shipped policies use.

/// Amounts in units (10^-8 webcash): parse and format the decimal
/// strings of the protocol (`amount::parse("0.3")`, `amount::format(n)`),
/// and a percentage of an amount rounded down (`amount::percent`).
pub use marketplace_common::amount;
use serde_json::{Value, json};

/// Log a panic's message through the host before the instance traps: each
/// export of [`fee_plugin!`] calls it first, so the host's `plugin trapped`
/// line follows a `plugin panicked: ...` line naming where and why.
pub fn log_fee_panics() {
    use crate::fee_bindings::marketplace::plugin::log;
    crate::log_panics_with(|line| log::log(log::Level::Error, line));
}

/// What a fee-policy plugin implements.
pub trait FeePolicy {
    /// The plugin's name as reported by `describe`.
    const NAME: &'static str;
    /// Policy name, e.g. "bid-inclusive".
    const POLICY: &'static str;
    /// The operator's settings this component reads, as
    /// [`crate::Endpoint::SETTINGS`] (the standard schedule's:
    /// [`standard::SETTINGS`]).
    const SETTINGS: Option<&'static [crate::Setting]> = None;
    /// Price in units of `action` for the basis amount.
    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String>;
    /// The document served by GET /api/fees (the host adds `rails`).
    fn schedule() -> Value;
}

/// The standard schedule: fixed prices for identity, post, comment and rate
/// (operator settings override the defaults), buy = the contract amount, a
/// 3 % arbitration fee, and the pickup rule of the policy.
pub mod standard {
    use super::*;

    /// Arbitration fee in percent.
    pub const ARBITRATION_PERCENT: u64 = 3;

    /// Fixed-price actions and their default prices.
    pub const FIXED: &[(&str, &str)] = &[
        ("identity", "0.6"),
        ("post", "0.3"),
        ("comment", "0.01"),
        ("rate", "0.001"),
    ];

    /// The settings the standard schedule reads: a price for each of
    /// [`FIXED`] and `arbitration_percent`.
    pub const SETTINGS: &[crate::Setting] = &[
        crate::Setting {
            key: "identity",
            check: price,
        },
        crate::Setting {
            key: "post",
            check: price,
        },
        crate::Setting {
            key: "comment",
            check: price,
        },
        crate::Setting {
            key: "rate",
            check: price,
        },
        crate::Setting {
            key: "arbitration_percent",
            check: |v| arbitration_percent_of(v).map(drop),
        },
    ];

    /// An `arbitration_percent` setting's value.
    fn arbitration_percent_of(text: &str) -> Result<u64, String> {
        crate::settings::whole(text, 0, 100)
    }

    fn price(text: &str) -> Result<(), String> {
        amount::parse(text)
            .map(drop)
            .map_err(|_| "a decimal amount with at most 8 decimals, e.g. \"0.3\"".to_string())
    }

    /// Whether the first pickup pays the fee ("pickup-paid") or the fee is
    /// inside the bid ("bid-inclusive").
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub enum Pickup {
        Free,
        FirstPaid,
    }

    /// Price of a fixed action: the operator's setting or the default.
    pub fn fixed_price(action: &str) -> Result<u64, String> {
        let default = FIXED
            .iter()
            .find(|(a, _)| *a == action)
            .map(|(_, p)| *p)
            .ok_or_else(|| format!("unknown action {action}"))?;
        let configured = crate::fee_bindings::marketplace::plugin::settings::get(action);
        let text = configured.as_deref().unwrap_or(default);
        amount::parse(text).map_err(|e| format!("price of {action} ({text}) {e}"))
    }

    /// The arbitration fee in percent: the operator's `arbitration_percent`
    /// setting (0 to 100) or [`ARBITRATION_PERCENT`]. A contract keeps the
    /// fee quoted when it was bought.
    pub fn arbitration_percent() -> Result<u64, String> {
        match crate::fee_bindings::marketplace::plugin::settings::get("arbitration_percent") {
            None => Ok(ARBITRATION_PERCENT),
            Some(text) => arbitration_percent_of(&text)
                .map_err(|must| format!("arbitration_percent ({text}) must be {must}")),
        }
    }

    pub fn quote(pickup: Pickup, action: &str, basis: Option<u64>) -> Result<u64, String> {
        let basis_of = |a: &str| basis.ok_or_else(|| format!("{a} needs the contract amount"));
        match action {
            "buy" => basis_of(action),
            "arbitration" => Ok(amount::percent(basis_of(action)?, arbitration_percent()?)),
            "pickup" => match pickup {
                Pickup::Free => Ok(0),
                Pickup::FirstPaid => Ok(amount::percent(basis_of(action)?, arbitration_percent()?)),
            },
            other => fixed_price(other),
        }
    }

    pub fn schedule(name: &str, version: &str, policy: &str, pickup: Pickup) -> Value {
        let percent = arbitration_percent().unwrap_or(ARBITRATION_PERCENT);
        let rate = amount::format(percent * 1_000_000);
        let mut actions = serde_json::Map::new();
        for (action, _) in FIXED {
            let price = fixed_price(action).map(amount::format).ok();
            actions.insert(
                action.to_string(),
                json!({"price": price, "basis": "fixed"}),
            );
        }
        actions.insert(
            "buy".into(),
            json!({"price": null, "basis": "contract_amount", "rate": "1", "note": "the contract amount, held in escrow"}),
        );
        actions.insert(
            "pickup".into(),
            match pickup {
                Pickup::Free => json!({"price": "0", "basis": "free", "note": format!("the {percent}% arbitration fee is inside the bid: seller payout = amount - fee")}),
                Pickup::FirstPaid => json!({"price": null, "basis": "contract_amount", "rate": rate, "note": format!("the first pickup of a contract pays {percent}% of its amount (fixed when it was bought); later pickups are free; payout = amount")}),
            },
        );
        json!({
            "currency": "webcash",
            "decimals": 8,
            "actions": actions,
            "arbitration": {"policy": policy, "rate": rate},
            "plugin": {"name": name, "version": version},
        })
    }
}

/// Export a type implementing [`FeePolicy`] as the component's `fees`.
#[macro_export]
macro_rules! fee_plugin {
    ($ty:ty) => {
        struct __MarketplaceExport;
        impl $crate::fee_bindings::exports::marketplace::plugin::fees::Guest
            for __MarketplaceExport
        {
            fn quote(action: String, basis: Option<u64>) -> Result<u64, String> {
                $crate::log_fee_panics();
                <$ty as $crate::FeePolicy>::quote(&action, basis)
            }
            fn schedule() -> String {
                $crate::log_fee_panics();
                <$ty as $crate::FeePolicy>::schedule().to_string()
            }
            fn policy() -> String {
                <$ty as $crate::FeePolicy>::POLICY.to_string()
            }
            fn describe() -> $crate::fee_bindings::marketplace::plugin::types::PluginInfo {
                $crate::log_fee_panics();
                $crate::settings::check_fees(<$ty as $crate::FeePolicy>::SETTINGS);
                $crate::fee_bindings::marketplace::plugin::types::PluginInfo {
                    name: <$ty as $crate::FeePolicy>::NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }
            }
        }
        $crate::fee_bindings::export_fee_policy!(__MarketplaceExport);
    };
}
