//! `payments` (capability `payments`): quote an action and charge the
//! caller from the request's payment headers (HTTP 402 otherwise).

use super::Serving;
use super::{Ctx, off_the_worker, refusal};
use crate::capabilities::Capability;
use crate::money::ledger::SecretError;
use crate::money::payments::ESCROW_ACTIONS;
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{payments, types};
use std::sync::Arc;

impl Ctx {
    /// The 402 of a payment the ledger refuses as it stands (no secret;
    /// a malformed, unknown or too small one; one spent by another
    /// request), decided from a read snapshot before the request waits
    /// for the commit batch: a flood of such requests, which a stranger
    /// can send without paying, must not make the paying ones wait their
    /// turn behind it. None: the charge decides, in the request's
    /// transaction, as before (a payment that may pay; the upstream's; a
    /// request already in its transaction; on a shared store, all but a
    /// missing or malformed one).
    fn refused_early(&self, action: &str, price: u64) -> Option<types::Refusal> {
        if price == 0 || self.txn.is_some() || self.upstream_mode().is_some() {
            return None;
        }
        let secret = match crate::money::payments::presented(&self.payment, action, price) {
            Ok(secret) => secret,
            Err(refused) => return Some(refusal(refused)),
        };
        // (On a shared store a read is a round trip of its own, and
        // writers do not take turns on one batch there.)
        let rt = self.rt.as_ref().filter(|rt| !rt.storage.is_shared())?;
        let read = rt.storage.begin_read().ok()?;
        match rt.ledger.check(&read, secret) {
            Ok((_, paid)) if paid < price => Some(refusal(crate::money::payments::insufficient(
                paid, action, price,
            ))),
            Ok(_) | Err(SecretError::Storage(_)) => None,
            // Spent by this same request (an identical retry that raced
            // the first, or the same payment identifier): its answer is
            // kept in the same commit as the spend, and the charge's
            // failure path gives it.
            Err(SecretError::Spent) if self.kept_meanwhile(&**rt, &read).is_some() => None,
            Err(e) => Some(refusal(crate::money::payments::secret_refused(
                e, action, price,
            ))),
        }
    }

    /// Refuse `what` (a 500, logged) to a family not granted `escrow`.
    fn escrow_holder(&self, action: &str, what: &str) -> Result<(), types::Refusal> {
        if self.grants.has(Capability::Escrow) {
            return Ok(());
        }
        tracing::error!(family = %self.family, action, "{what} needs the escrow grant");
        Err(refusal(Reply::error(500, "internal", "internal error")))
    }

    /// Charge `price` for `action`; the receipt's change is a stand-in
    /// (see [`super::stand_in`]).
    fn charge_at(
        &mut self,
        action: String,
        price: u64,
    ) -> Result<payments::Receipt, types::Refusal> {
        let mut receipt = self.charge_now(action, price)?;
        if let Some(change) = receipt.change.take() {
            let stand_in = super::stand_in(&change);
            receipt.change = Some(stand_in.clone());
            self.change_stand_in = Some((stand_in, change));
        }
        Ok(receipt)
    }

    fn charge_now(
        &mut self,
        action: String,
        price: u64,
    ) -> Result<payments::Receipt, types::Refusal> {
        if self.charged.is_some() {
            tracing::error!(family = %self.family, "a request may be charged only once");
            return Err(refusal(Reply::error(500, "internal", "internal error")));
        }
        let escrowed = ESCROW_ACTIONS.contains(&action.as_str());
        if escrowed {
            self.escrow_holder(&action, "an escrow action")?;
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
    rt: Option<Arc<dyn Serving>>,
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

/// The largest body `payments.retry-answer` keeps.
const MAX_RETRY_ANSWER_BYTES: usize = 64 << 10;

impl payments::Host for Ctx {
    async fn quote(&mut self, action: String, basis: Option<u64>) -> Result<u64, types::Refusal> {
        let started = std::time::Instant::now();
        let price = self.price(action, basis).await;
        // (A fee call on a blocking thread is not this call's time.)
        self.limiter.long.waited(started.elapsed());
        price
    }

    async fn charge(
        &mut self,
        action: String,
        basis: Option<u64>,
    ) -> Result<payments::Receipt, types::Refusal> {
        // A read is refused before the fee component is asked.
        self.must_write()?;
        // A basis is a contract's amount (`buy`, a percentage fee): the
        // escrow holder's. Without escrow, a component could price any
        // action off a basis of its choosing and take a client's whole
        // secret for a route documented at a fixed price.
        if basis.is_some() {
            self.escrow_holder(&action, "a charge with a basis (a contract's amount)")?;
        }
        let started = std::time::Instant::now();
        let price = self.price(action.clone(), basis).await;
        self.limiter.long.waited(started.elapsed());
        let price = price?;
        if let Some(refused) = self.refused_early(&action, price) {
            return Err(refused);
        }
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
        self.escrow_holder(&action, "charge-price")?;
        if let Some(refused) = self.refused_early(&action, price) {
            return Err(refused);
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

    fn retry_answer(&mut self, status: u16, body: String) {
        // A short error body: it is kept for the retry horizon, outside the
        // call's memory cap.
        if body.len() > MAX_RETRY_ANSWER_BYTES {
            tracing::warn!(
                family = %self.family,
                bytes = body.len(),
                "retry answer not kept: over {MAX_RETRY_ANSWER_BYTES} bytes"
            );
            return;
        }
        // As `limits.on-fault`: an answer the host may not send is not
        // kept (a retry then gets the request's own answer), said in the log.
        let may = crate::reply::PluginGrants {
            relayed: &[],
            ..self.may_send()
        };
        let json = vec![("content-type".to_string(), "application/json".to_string())];
        match Reply::from_plugin(status, json, body.into_bytes(), may) {
            Ok(reply) => self.retry_answer = Some(reply),
            Err(why) => {
                tracing::warn!(family = %self.family, "retry answer not kept: {why}");
            }
        }
    }
}
