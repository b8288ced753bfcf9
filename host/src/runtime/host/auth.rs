//! `auth` (capability `signatures`): Ed25519 checks of signed statements.

use super::Ctx;
use crate::runtime::bindings::endpoint::marketplace::plugin::{auth, types};

fn statement(s: &auth::Signed) -> crate::auth::Statement<'_> {
    crate::auth::Statement {
        actor: &s.actor,
        message: &s.message,
        signature: &s.signature,
        timestamp: s.timestamp,
    }
}

fn same_statement(a: &auth::Signed, b: &auth::Signed) -> bool {
    a.actor == b.actor
        && a.message == b.message
        && a.signature == b.signature
        && a.timestamp == b.timestamp
}

impl auth::Host for Ctx {
    async fn verify(
        &mut self,
        signed: auth::Signed,
        require_fresh: bool,
        legacy_single_use: bool,
    ) -> Result<(), types::Refusal> {
        let checked = self.prechecked.iter().any(|p| same_statement(p, &signed));
        self.ready().await;
        let (rt, txn) = self.write_txn()?;
        crate::auth::verify(
            txn,
            rt.now_ms() / 1000,
            &statement(&signed),
            require_fresh,
            legacy_single_use,
            checked,
        )
        .map_err(super::refusal)
    }

    fn precheck(&mut self, signed: auth::Signed) -> bool {
        let ok = crate::auth::check_signature(&statement(&signed)).is_ok();
        if ok && self.prechecked.len() < 16 {
            self.prechecked.push(signed);
        }
        ok
    }
}
