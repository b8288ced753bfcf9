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
        } else if (200..=599).contains(&answer.status) {
            self.on_fault = Some(Reply {
                status: answer.status,
                headers: answer.headers,
                body: answer.body,
            });
        }
    }

    fn limit_time(&mut self, ms: u32) {
        self.limiter.shorten(Duration::from_millis(ms.into()));
    }
}
