//! Fee-policy plugins.

use serde_json::Value;

/// What a fee-policy plugin implements.
pub trait FeePolicy {
    /// The plugin's name as reported by `describe`.
    const NAME: &'static str;
    /// Policy name, e.g. "bid-inclusive".
    const POLICY: &'static str;
    /// Price in units of `action` for the basis amount.
    fn quote(action: &str, basis: Option<u64>) -> Result<u64, String>;
    /// The document served by GET /api/fees.
    fn schedule() -> Value;
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
                <$ty as $crate::FeePolicy>::quote(&action, basis)
            }
            fn schedule() -> String {
                <$ty as $crate::FeePolicy>::schedule().to_string()
            }
            fn policy() -> String {
                <$ty as $crate::FeePolicy>::POLICY.to_string()
            }
            fn describe() -> $crate::fee_bindings::marketplace::plugin::types::PluginInfo {
                $crate::fee_bindings::marketplace::plugin::types::PluginInfo {
                    name: <$ty as $crate::FeePolicy>::NAME.to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                }
            }
        }
        $crate::fee_bindings::export_fee_policy!(__MarketplaceExport);
    };
}
