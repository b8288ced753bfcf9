//! `settings`: the operator's settings of the calling family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::settings;
use std::collections::BTreeMap;

impl Ctx {
    /// The calling family's settings: the configuration's, or those a
    /// smoke call was given.
    fn family_settings(&self) -> BTreeMap<String, String> {
        match (&self.rt, &self.smoke_settings) {
            (Some(rt), _) => rt.config.family_settings(&self.family),
            (None, Some(settings)) => (**settings).clone(),
            (None, None) => BTreeMap::new(),
        }
    }
}

impl settings::Host for Ctx {
    fn get(&mut self, key: String) -> Option<String> {
        self.family_settings().remove(&key)
    }

    fn keys(&mut self) -> Vec<String> {
        self.family_settings().into_keys().collect()
    }
}
