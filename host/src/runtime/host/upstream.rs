//! The request side of the upstream webcash mode
//! ([`crate::money::upstream`]): the payment is taken at the upstream
//! before the request's transaction opens, split into fee and change when
//! the request answers 2xx (before its commit), and refunded in the answer
//! when it fails in any way.

use super::{Ctx, refusal};
use crate::capabilities::Capability;
use crate::money::upstream::{self, Upstream};
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{payments, types};
use crate::store::WriteTxn;
use std::sync::Arc;
use std::time::Instant;

impl Ctx {
    /// The upstream this request's payments are taken at, if any.
    pub(super) fn upstream_mode(&self) -> Option<Arc<Upstream>> {
        self.rt.as_ref()?.upstream.clone()
    }

    /// `payments.charge` in upstream mode (a price above zero).
    pub(super) fn charge_upstream(
        &mut self,
        up: Arc<Upstream>,
        action: String,
        price: u64,
        escrowed: bool,
    ) -> Result<payments::Receipt, types::Refusal> {
        // Escrow is not held at the upstream: a buy is refused, and so is
        // a contract's fee taken after reading it (the pickup fee).
        if escrowed || (self.grants.has(Capability::Escrow) && self.txn.is_some()) {
            return Err(refusal(Reply::error(
                409,
                "conflict",
                "arbitration contracts (escrow) are not available while this server takes payments at an upstream webcash server",
            )));
        }
        let internal = |m: &str| {
            tracing::error!("{m}");
            refusal(Reply::error(500, "internal", "internal error"))
        };
        if !self.write {
            return Err(internal(
                "payments, signatures and escrow need a mutating request",
            ));
        }
        if self.txn.is_some() {
            // The intent is committed on its own before the upstream call,
            // which the request's open batch lease would wait for.
            return Err(internal(&format!(
                "family {}: in upstream mode a route must charge before its first storage use",
                self.family
            )));
        }
        let Some(rt) = self.rt.clone() else {
            return Err(internal("no runtime in this call"));
        };
        let started = Instant::now();
        let taken = upstream::charge(
            &up,
            rt.state(),
            &self.payment,
            &action,
            price,
            self.replay_key.as_ref().map(|r| &r.key),
        );
        // The upstream's time does not count against the plugin's deadline.
        self.limiter.extend(started.elapsed());
        let (charge, held) = taken.map_err(refusal)?;
        // From here a failure of the request refunds the hold.
        self.upstream = Some(held);
        self.write_txn()?;
        let receipt = payments::Receipt {
            action: charge.action.clone(),
            price: charge.price,
            paid: charge.paid,
            change: charge.change.clone(),
        };
        if let (Some(s), Some(d)) = (&charge.change, &charge.change_derivation) {
            self.issued.push((s.clone(), d.clone()));
        }
        self.charged = Some(charge);
        Ok(receipt)
    }

    /// A 2xx is about to commit: split the hold at the upstream and settle
    /// the journal entry in the request's transaction.
    pub(super) fn settle_upstream(&mut self, txn: &WriteTxn) -> Result<(), Reply> {
        let (Some(up), Some(rt)) = (self.upstream_mode(), self.rt.clone()) else {
            return Ok(());
        };
        match self.upstream.as_mut() {
            Some(held) => upstream::settle(&up, rt.state(), txn, held),
            None => Ok(()),
        }
    }

    /// The request fails: drop its transaction (nothing of it is kept) and
    /// show the payment held at the upstream, if any, as `payment.refund`.
    pub fn refund_upstream(&mut self, mut reply: Reply) -> Reply {
        let Some(held) = self.upstream.take() else {
            return reply;
        };
        self.txn = None;
        if let Some(rt) = &self.rt {
            upstream::refund_into(rt.state(), &held, &mut reply);
        }
        reply
    }
}
