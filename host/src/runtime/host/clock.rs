//! `clock`: the host clock (tests may shift it).

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::clock;

impl clock::Host for Ctx {
    fn now_ms(&mut self) -> u64 {
        match &self.rt {
            Some(rt) => rt.now_ms(),
            None => 0,
        }
    }
}
