//! `settings`: the operator's settings of the calling family.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::settings;

impl settings::Host for Ctx {
    fn get(&mut self, key: String) -> Option<String> {
        let rt = self.rt.as_ref()?;
        rt.config.family_settings(&self.family).remove(&key)
    }
}
