//! `arbiter` (capability `arbiter`): the service's arbiter key.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::arbiter;

impl arbiter::Host for Ctx {
    fn public_key(&mut self) -> String {
        self.rt
            .as_ref()
            .map_or_else(String::new, |rt| rt.arbiter.public_hex())
    }

    fn sign(&mut self, message: String) -> String {
        self.rt
            .as_ref()
            .map_or_else(String::new, |rt| rt.arbiter.sign_hex(message.as_bytes()))
    }
}
