//! `limits` (capability `limits`): the answer to one's own fault, and a
//! shorter deadline, for plugins running user code.

use super::Ctx;
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{limits, types};
use std::time::Duration;

impl limits::Host for Ctx {
    fn on_fault(&mut self, answer: types::Response) {
        if answer.status == 0 {
            self.on_fault = None;
        } else {
            // An answer that is not one the host may send is not kept (the
            // fault then gets the host's own answer).
            // (It passes on no payment header, relayed or not: as before.)
            let may = crate::reply::PluginGrants {
                relayed: &[],
                ..self.may_send()
            };
            match Reply::from_plugin(answer.status, answer.headers, answer.body, may) {
                Ok(reply) => self.on_fault = Some(reply),
                Err(why) => {
                    tracing::warn!(family = %self.family, "fault answer not kept: {why}");
                }
            }
        }
    }

    fn limit_time(&mut self, ms: u32) -> wasmtime::Result<()> {
        self.limiter.shorten(Duration::from_millis(ms.into()));
        // Past it already (a request that waited its turn out): the fault
        // now, not at the next epoch tick, so that the waiting requests
        // after it are not held a tick each.
        if self.limiter.expired() {
            return Err(wasmtime::Trap::Interrupt.into());
        }
        Ok(())
    }
}
