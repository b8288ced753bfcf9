//! `payments` (capability `payments`): quote an action and charge the
//! caller from the request's payment headers (HTTP 402 otherwise).

use super::{Ctx, off_the_worker, refusal};
use crate::capabilities::Capability;
use crate::money::payments::ESCROW_ACTIONS;
use crate::reply::Reply;
use crate::runtime::Runtime;
use crate::runtime::bindings::endpoint::marketplace::plugin::{payments, types};
use std::sync::Arc;

impl Ctx {
    fn charge_at(
        &mut self,
        action: String,
        price: u64,
    ) -> Result<payments::Receipt, types::Refusal> {
        if self.charged.is_some() {
            tracing::error!(family = %self.family, "a request may be charged only once");
            return Err(refusal(Reply::error(500, "internal", "internal error")));
        }
        let escrowed = ESCROW_ACTIONS.contains(&action.as_str());
        if escrowed && !self.grants.has(Capability::Escrow) {
            tracing::error!(family = %self.family, action, "an escrow action needs the escrow grant");
            return Err(refusal(Reply::error(500, "internal", "internal error")));
        }
        if price > 0
            && let Some(up) = self.upstream_mode()
        {
            return self.charge_upstream(up, action, price, escrowed);
        }
        let payment = self.payment.clone();
        let (rt, txn) = self.write_txn()?;
        let charge = crate::money::payments::charge(&rt.ledger, txn, &payment, &action, price)
            .map_err(refusal)?;
        let receipt = payments::Receipt {
            action: charge.action.clone(),
            price: charge.price,
            paid: charge.paid,
            change: charge.change.clone(),
        };
        if escrowed {
            self.unheld += charge.price;
        }
        if let (Some(s), Some(d)) = (&charge.change, &charge.change_derivation) {
            self.issued.push((s.clone(), d.clone()));
        }
        self.charged = Some(charge);
        Ok(receipt)
    }
}

/// The fee component's price of `action`: a price it gave before, or a
/// call. With `elsewhere` (an inline call that does not hold the commit
/// batch), the call runs on a blocking thread: it must not hold the worker
/// for its own deadline. A call holding the batch runs it in place: the
/// blocking threads may all be waiting for that batch. (Takes no `Ctx`:
/// its future crosses an await, and a `&Ctx` is not `Send`.)
async fn quote_of(
    rt: Option<Arc<Runtime>>,
    elsewhere: bool,
    action: String,
    basis: Option<u64>,
) -> Result<u64, types::Refusal> {
    let Some(rt) = rt else {
        return Err(refusal(Reply::error(
            503,
            "plugin_unavailable",
            "pricing is not available in this call",
        )));
    };
    if !elsewhere {
        return rt.fee_quote(&action, basis).map_err(refusal);
    }
    if let Some(price) = rt.cached_quote(&action, basis) {
        return Ok(price);
    }
    off_the_worker("fee quote", move || {
        rt.fee_quote(&action, basis).map_err(refusal)
    })
    .await
    .unwrap_or_else(|failed| Err(refusal(failed)))
}

impl Ctx {
    /// This call's price of `action` (see [`quote_of`]).
    fn price(
        &self,
        action: String,
        basis: Option<u64>,
    ) -> impl Future<Output = Result<u64, types::Refusal>> + Send + 'static {
        let elsewhere = self.limiter.yields && !self.holds_batch();
        quote_of(self.rt.clone(), elsewhere, action, basis)
    }
}

impl payments::Host for Ctx {
    async fn quote(&mut self, action: String, basis: Option<u64>) -> Result<u64, types::Refusal> {
        self.price(action, basis).await
    }

    async fn charge(
        &mut self,
        action: String,
        basis: Option<u64>,
    ) -> Result<payments::Receipt, types::Refusal> {
        // A read is refused before the fee component is asked.
        self.must_write()?;
        let price = self.price(action.clone(), basis).await?;
        self.ready().await;
        self.charge_at(action, price)
    }

    async fn charge_price(
        &mut self,
        action: String,
        price: u64,
    ) -> Result<payments::Receipt, types::Refusal> {
        // A price the component fixed itself: only for the escrow holder,
        // whose contracts fix their fee at buy.
        if !self.grants.has(Capability::Escrow) {
            tracing::error!(family = %self.family, "charge-price needs the escrow grant");
            return Err(refusal(Reply::error(500, "internal", "internal error")));
        }
        self.ready().await;
        self.charge_at(action, price)
    }

    fn policy(&mut self) -> String {
        // Kept from the fee component's load: no call.
        self.rt
            .as_ref()
            .map_or_else(String::new, |rt| rt.fee_policy())
    }
}
