//! `ids`: ULIDs and random bytes.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::ids;

impl ids::Host for Ctx {
    fn ulid(&mut self) -> String {
        match &self.rt {
            Some(rt) => rt.ids.ulid_at(rt.now_ms()),
            None => String::new(),
        }
    }

    fn random_bytes(&mut self, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len.min(4096) as usize];
        crate::ids::fill_random(&mut buf);
        buf
    }
}
