//! `escrow` (capability `escrow`): the family's per-contract accounts and
//! issuances (see [`crate::money::escrow`]). Accounts are named by the
//! calling family, so no family reaches another's.

use super::{Ctx, refusal};
use crate::money::escrow;
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{escrow as wit, types};

impl wit::Host for Ctx {
    async fn hold(&mut self, contract: String) -> Result<u64, types::Refusal> {
        let family = self.family.clone();
        self.ready().await;
        let units = self.unheld;
        let (_, txn) = self.write_txn()?;
        let now = escrow::hold(txn, &family, &contract, units).map_err(refusal)?;
        self.unheld = 0;
        Ok(now)
    }

    async fn held(&mut self, contract: String) -> u64 {
        let family = self.family.clone();
        self.ready().await;
        match self.txn() {
            Ok(txn) => escrow::held(txn, &family, &contract).unwrap_or(0),
            Err(e) => {
                tracing::error!(family = %family, "escrow held: {e}");
                0
            }
        }
    }

    async fn payout(
        &mut self,
        contract: String,
        kind: String,
        amount: u64,
    ) -> Result<String, types::Refusal> {
        let family = self.family.clone();
        if self.upstream_mode().is_some() {
            // The escrow is the embedded ledger's; its secret would be
            // worth nothing at the upstream, where the payee's wallet is.
            return Err(refusal(Reply::error(
                409,
                "conflict",
                format!(
                    "the escrow of {contract} is held in this server's own ledger, whose secrets are worth nothing at the upstream webcash server this server takes payments at now: the contract is unchanged, and its payout or refund can be collected once the server runs in embedded mode again"
                ),
            )));
        }
        self.ready().await;
        let (rt, txn) = self.write_txn()?;
        let (secret, derivation) =
            escrow::payout(&rt.ledger, txn, &family, &contract, &kind, amount).map_err(refusal)?;
        self.issued.push((secret.clone(), derivation));
        Ok(secret)
    }

    async fn earn(&mut self, contract: String, amount: u64) -> Result<(), types::Refusal> {
        let family = self.family.clone();
        self.ready().await;
        let (_, txn) = self.write_txn()?;
        escrow::earn(txn, &family, &contract, amount).map_err(refusal)
    }

    async fn note_fee(&mut self, contract: String) -> Result<(), types::Refusal> {
        let family = self.family.clone();
        self.ready().await;
        let price = self.charged.as_ref().map_or(0, |c| c.price);
        let (_, txn) = self.write_txn()?;
        escrow::note_fee(txn, &family, &contract, price).map_err(refusal)
    }

    async fn certificate(&mut self, contract: String) -> Result<String, types::Refusal> {
        let family = self.family.clone();
        self.ready().await;
        let (rt, txn) = self.write_txn()?;
        let (secret, derivation) =
            escrow::certificate(&rt.ledger, txn, &family, &contract).map_err(refusal)?;
        self.issued.push((secret.clone(), derivation));
        Ok(secret)
    }
}
