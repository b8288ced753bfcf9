//! `settings`: the operator's settings of the calling family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::settings;

impl settings::Host for Ctx {
    /// The configuration's value (one lookup: a family's component may
    /// ask on every request), or, for a smoke call, the one it was given.
    fn get(&mut self, key: String) -> Option<String> {
        match (&self.rt, &self.smoke_settings) {
            (Some(rt), _) => rt.config.family_setting(&self.family, &key),
            (None, Some(settings)) => settings.get(&key).cloned(),
            (None, None) => None,
        }
    }

    fn keys(&mut self) -> Vec<String> {
        match (&self.rt, &self.smoke_settings) {
            (Some(rt), _) => rt.config.family_setting_keys(&self.family),
            (None, Some(settings)) => settings.keys().cloned().collect(),
            (None, None) => Vec::new(),
        }
    }
}
