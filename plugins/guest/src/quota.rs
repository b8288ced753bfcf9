//! Counts of one actor's writes per window of time (a UTC day, an hour),
//! kept in the family's own keyspace, for the writes a stranger could
//! repeat endlessly for nothing (free ones, or ones whose money comes
//! back): past the cap, 429 `rate_limited` with `Retry-After`.

use crate::ApiError;
use crate::endpoint::{Response, clock, kv, rfc3339};
use crate::endpoint_bindings::marketplace::plugin::settings;
use serde::{Deserialize, Serialize};

/// One actor's count in one window (stored under the caller's key).
#[derive(Serialize, Deserialize)]
struct Counted {
    /// Windows since the epoch.
    window: u64,
    count: u64,
}

/// A cap on one actor's writes per window, which an operator setting
/// (`setting`, a whole number from 1 to `max`) may change.
pub struct Quota {
    /// The setting (declared in [`crate::Endpoint::SETTINGS`] with
    /// [`Quota::check`]).
    pub setting: &'static str,
    pub default: u64,
    pub max: u64,
    pub window_ms: u64,
}

impl Quota {
    /// Whether `value` is a valid setting of this quota (its declaration's
    /// check, at every load).
    pub fn check(&self, value: &str) -> Result<(), String> {
        crate::settings::whole(value, 1, self.max).map(drop)
    }

    /// The cap in force: the operator's setting, else the default.
    pub fn cap(&self) -> u64 {
        settings::get(self.setting)
            .and_then(|v| crate::settings::whole(&v, 1, self.max).ok())
            .unwrap_or(self.default)
    }

    /// Count one more write under `key` in this window (kept only if the
    /// request's writes are), or, when the window's writes are used up,
    /// the 429 answer: `refusal(count, next)` is its message, `next` the
    /// RFC 3339 time the next window begins.
    pub fn take(
        &self,
        key: &str,
        refusal: impl FnOnce(u64, &str) -> String,
    ) -> Result<Option<Response>, ApiError> {
        let now = clock::now_ms();
        let window = now / self.window_ms;
        let count = kv::get::<Counted>(key)?
            .filter(|c| c.window == window)
            .map_or(0, |c| c.count);
        if count >= self.cap() {
            let next = (window + 1) * self.window_ms;
            let mut refused: Response =
                ApiError::new(429, "rate_limited", refusal(count, &rfc3339(next))).into();
            refused.headers.push((
                "retry-after".into(),
                (next - now).div_ceil(1000).to_string(),
            ));
            return Ok(Some(refused));
        }
        kv::put(
            key,
            &Counted {
                window,
                count: count + 1,
            },
        )?;
        Ok(None)
    }
}
