//! `memo`: bytes the calling component's instances keep between requests
//! (see [`crate::runtime::memo`]).

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::memo;

impl memo::Host for Ctx {
    fn get(&mut self, key: String) -> Option<Vec<u8>> {
        let (memo, generation) = self.memo.as_ref()?;
        memo.get(*generation, &key)
    }

    fn put(&mut self, key: String, value: Vec<u8>) -> bool {
        match &self.memo {
            Some((memo, generation)) => memo.put(*generation, key, value),
            None => false,
        }
    }
}
