//! The host side of the WIT imports: what a plugin instance may ask of the
//! host during one request, one file per interface. Everything acts on
//! that request's transaction, so it commits or vanishes with the request.
//! Which interfaces a family's component is linked with is decided by its
//! grants ([`crate::capabilities`]).

mod arbiter;
mod auth;
mod clock;
mod dispatch;
mod escrow;
mod fees;
mod ids;
mod info;
mod limits;
mod log;
mod memo;
mod payments;
mod settings;
mod storage;
mod upstream;

pub use dispatch::{Caller, MAX_DISPATCH_DEPTH};
pub use fees::FeeCtx;
pub use log::LogBudget;
pub(crate) use log::{FAULT_LINES_PER_SECOND, family_admits_fault};

use crate::capabilities::{Capability, Grants};
use crate::money::ledger::Derivation;
use crate::money::payments::{Charge, PaymentHeaders, RetryKey};
use crate::reply::Reply;
use crate::runtime::api::Served;
use crate::runtime::bindings::endpoint::marketplace::plugin::{auth as wit_auth, types};
use crate::runtime::limiter::CallLimiter;
use crate::runtime::routes::Match;
use crate::runtime::status::PluginStatus;
use crate::state::State;
use crate::store::{RunAgain, StorageError, Txn};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// What the host interfaces ask of the runtime that serves their call,
/// beyond its state (configuration, storage, ledger, ids, clock: the
/// [`State`] it derefs to): the route table and the families' statuses
/// and grants, the fee component's prices, and running a request a call
/// dispatches. The runtime implements it (`runtime::serving`), above the
/// interfaces, which know it only by this: so they import nothing above
/// themselves, though a dispatched request runs through the runtime again.
pub trait Serving: std::ops::Deref<Target = State> + Send + Sync {
    /// The state (`&**rt` for a `&Arc<dyn Serving>`).
    fn state(&self) -> &State {
        self
    }
    /// The route table and OpenAPI document in force.
    fn served(&self) -> Arc<Served>;
    /// The route `method` and `path` reach.
    fn find(&self, method: &str, path: &str) -> Match;
    /// Whether `family` was granted `capability`.
    fn granted(&self, family: &str, capability: Capability) -> bool;
    /// Whether `family` is configured (its keyspace exists).
    fn configured(&self, family: &str) -> bool;
    /// Every family's status, without the details only admins see.
    fn statuses(&self) -> Vec<PluginStatus>;
    /// The price of `action` (`basis`: the amount it is a share of), from
    /// the fee component.
    fn fee_quote(&self, action: &str, basis: Option<u64>) -> Result<u64, Reply>;
    /// That price as the fee component last gave it, if it is kept.
    fn cached_quote(&self, action: &str, basis: Option<u64>) -> Option<u64>;
    /// The fee component's policy name.
    fn fee_policy(&self) -> String;
    /// Whether a request (`write`: of a writing route) may run on an
    /// async worker.
    fn runs_inline(&self, write: bool) -> bool;
    /// Whether the host's own route `name` answers on an async worker.
    fn host_runs_inline(&self, name: &str) -> bool;
    /// Run the host's own route `name`.
    fn handle_host(self: Arc<Self>, name: &str, body: &[u8]) -> Reply;
    /// Run a family's request to its end on this thread (off the workers).
    fn handle_from(
        self: Arc<Self>,
        family: &str,
        req: types::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Reply;
    /// Run a family's request on an async worker.
    fn handle_inline(
        self: Arc<Self>,
        family: String,
        req: types::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Pin<Box<dyn Future<Output = Reply> + Send>>;
    /// Run a family's write as a task of its own on the workers, in
    /// `span` (see `engine::Runtime::write_as_task`). Err: the task panicked.
    fn write_as_task(
        self: Arc<Self>,
        family: String,
        req: types::Request,
        payment: PaymentHeaders,
        from: Caller,
        span: tracing::Span,
    ) -> Pin<Box<dyn Future<Output = Result<Reply, tokio::task::JoinError>> + Send>>;
}

/// Run `f` on a blocking thread, in this request's span: the part of an
/// inline call (on an async worker) that may wait. `Err` is the 500 for a
/// task that failed (panicked), logged with `what`.
async fn off_the_worker<R: Send + 'static>(
    what: &str,
    f: impl FnOnce() -> R + Send + 'static,
) -> Result<R, Reply> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| {
            tracing::error!(what, "work handed to a blocking thread failed: {e}");
            Reply::error(500, "internal", "internal error")
        })
}

/// Store data that carries a call limiter.
pub trait Limiter: Send + 'static {
    fn limiter(&mut self) -> &mut CallLimiter;
    /// Which memory limit the call ran into.
    fn memory_limit(&self) -> crate::runtime::limiter::MemoryHit;
    /// Whether it ran into one.
    fn memory_hit(&self) -> bool {
        self.memory_limit().any()
    }
    /// Count the call against its client, with its family, as a long call
    /// ([`crate::runtime::long_calls::LongCall::count_against`]).
    fn count_long(&mut self);
}

/// Store data of one endpoint-plugin call.
pub struct Ctx {
    /// None for the inert context of a smoke call.
    rt: Option<Arc<dyn Serving>>,
    /// When this run of the request began (see [`Ctx::refused_from_fresh`]).
    started: std::time::Instant,
    /// It dispatched a write that succeeded (committed on its own): it
    /// must not run again for a stale refusal, which would repeat it.
    dispatched_write: bool,
    family: String,
    /// What the family may do beyond its own keyspace.
    grants: Arc<Grants>,
    /// Whether this request may write (non-GET/HEAD).
    write: bool,
    /// Opened on first storage use, so routes that never touch storage
    /// never open (or commit) a transaction.
    txn: Option<Txn>,
    /// Why an inline write's transaction could not be opened.
    open_failed: Option<String>,
    /// Dispatched by a call that holds the commit batch: treated as
    /// holding it (see [`Ctx::holds_batch`]).
    under_batch: bool,
    /// Dispatches between this request and the client's.
    depth: u8,
    /// Runs again after losing races: its writes take a batch of their own
    /// ([`crate::store::group_commit::Pending::alone`]).
    alone: bool,
    /// A mutating request is counted from its start, so that a batch of
    /// writes waits for it (group commit).
    pending: Option<crate::store::group_commit::Pending>,
    /// Whose turn its writes take for the commit batch (see
    /// [`crate::store::group_commit::Pending::from`]): its client's.
    source: Option<std::net::IpAddr>,
    payment: PaymentHeaders,
    /// Key under which a paid request's answer is kept for identical retries.
    replay_key: Option<RetryKey>,
    /// The charge taken in this request, if any.
    charged: Option<Charge>,
    /// Units charged for an escrow action and not yet held in a contract's
    /// account: a 2xx answer with any left is turned into a 500.
    unheld: u64,
    /// Secrets issued in this request and how to derive them again: a kept
    /// answer holds the derivation, never the secret.
    issued: Vec<(String, Derivation)>,
    /// The change the component was given in its receipt instead of the
    /// real one, which the host puts in its answer ([`stand_in`]).
    change_stand_in: Option<(String, String)>,
    /// Statements whose signature already verified in this request.
    prechecked: Vec<wit_auth::Signed>,
    /// The answer the plugin asked for should it fault (`limits.on-fault`).
    on_fault: Option<Reply>,
    /// What an identical retry of this paid request gets instead of its
    /// answer (`payments.retry-answer`).
    retry_answer: Option<Reply>,
    /// In upstream mode, the payment taken at the upstream webcash server:
    /// split when the request commits, refunded in the answer otherwise.
    upstream: Option<crate::money::upstream::Held>,
    limiter: CallLimiter,
    /// The component's memo and the generation this request began under
    /// (none for a smoke call: its memo calls find and keep nothing).
    memo: Option<(Arc<crate::runtime::memo::Memo>, u64)>,
    /// What this call, its dispatching callers and the calls it
    /// dispatched have logged (bounded per client request).
    logged: log::LogBudget,
    /// The payment headers ([`crate::reply::HOST_OWNED`]) the host answered
    /// this call's dispatched requests with: the only ones its answer may
    /// carry.
    relayed: Vec<(String, String)>,
    /// The panic message the guest crate logged before trapping (a smoke
    /// call's refusal quotes it).
    panicked: Option<String>,
    /// The family's settings, for a smoke call (which has no `rt` to read
    /// them from): `describe` may check them.
    smoke_settings: Option<Arc<BTreeMap<String, String>>>,
}

impl Limiter for Ctx {
    fn limiter(&mut self) -> &mut CallLimiter {
        &mut self.limiter
    }
    fn memory_limit(&self) -> crate::runtime::limiter::MemoryHit {
        self.limiter.hit
    }
    fn count_long(&mut self) {
        self.limiter.long.count_against(&self.family);
    }
}

/// A request's commit failed: logged at most once a second (a full disk
/// or a lost database fails every request; the store logs the cause).
fn commit_failed(family: &str, e: &StorageError) {
    static LINES: crate::logging::Throttle =
        crate::logging::Throttle::new(std::time::Duration::from_secs(1));
    let Some(failed) = LINES.note() else {
        return;
    };
    let since = match failed {
        1 => String::new(),
        n => format!(" ({n} requests' commits failed since the last such line)"),
    };
    // The shared store away is a passing outage (503, which its own line
    // says), not the error of a failed commit.
    if e.unavailable() {
        tracing::warn!(family, failed, "commit failed: {e}{since}");
    } else {
        tracing::error!(family, failed, "commit failed: {e}{since}");
    }
}

impl Ctx {
    pub fn new(
        rt: Arc<dyn Serving>,
        family: &str,
        grants: Arc<Grants>,
        write: bool,
        payment: PaymentHeaders,
        replay_key: Option<RetryKey>,
        memory_bytes: usize,
    ) -> Ctx {
        Ctx {
            pending: write.then(|| rt.storage.enter()),
            rt: Some(rt),
            started: std::time::Instant::now(),
            dispatched_write: false,
            family: family.to_string(),
            grants,
            write,
            txn: None,
            open_failed: None,
            under_batch: false,
            depth: 0,
            alone: false,
            payment,
            replay_key,
            source: None,
            charged: None,
            unheld: 0,
            issued: Vec::new(),
            change_stand_in: None,
            prechecked: Vec::new(),
            on_fault: None,
            retry_answer: None,
            upstream: None,
            limiter: CallLimiter::new(memory_bytes),
            memo: None,
            logged: log::LogBudget::default(),
            relayed: Vec::new(),
            panicked: None,
            smoke_settings: None,
        }
    }

    /// A context with no storage or payments (smoke calls, whose log
    /// lines name `family`).
    pub fn inert(family: &str, memory_bytes: usize) -> Ctx {
        Ctx {
            rt: None,
            started: std::time::Instant::now(),
            dispatched_write: false,
            family: family.to_string(),
            grants: Arc::new(Grants::default()),
            write: false,
            txn: None,
            open_failed: None,
            under_batch: false,
            depth: 0,
            alone: false,
            pending: None,
            payment: PaymentHeaders::default(),
            replay_key: None,
            source: None,
            charged: None,
            unheld: 0,
            issued: Vec::new(),
            change_stand_in: None,
            prechecked: Vec::new(),
            on_fault: None,
            retry_answer: None,
            upstream: None,
            // (A smoke call's memory is not held to the requests' total.)
            limiter: CallLimiter::outside_total(memory_bytes),
            memo: None,
            logged: log::LogBudget::default(),
            relayed: Vec::new(),
            panicked: None,
            smoke_settings: None,
        }
    }

    /// This smoke call's context with the family's `settings`.
    pub fn with_settings(mut self, settings: BTreeMap<String, String>) -> Ctx {
        self.smoke_settings = Some(Arc::new(settings));
        self
    }

    /// The message of a panic the component logged (`plugin panicked:
    /// ...`, as the guest crate's panic hook writes it just before the
    /// trap), if it did.
    pub fn panic_message(&self) -> Option<&str> {
        self.panicked.as_deref()
    }

    /// What this call's answers (its own and its fault answer) may carry
    /// beyond the plugin's own headers.
    pub(super) fn may_send(&self) -> crate::reply::PluginGrants<'_> {
        crate::reply::PluginGrants {
            relayed: &self.relayed,
            credentials: self.grants.has(Capability::Credentials),
        }
    }

    /// Give the call its component's memo, for the generation of the
    /// served table it began under.
    pub fn with_memo(&mut self, memo: Arc<crate::runtime::memo::Memo>, generation: u64) {
        self.memo = Some((memo, generation));
    }

    /// Put on `reply` the payment answers (`X-Cash-Change`,
    /// `PAYMENT-RESPONSE`) of the paid requests this call dispatched, those
    /// it does not carry already: each committed on its own, so its change
    /// is the client's whatever this call answers, a fault included (the
    /// MCP family's `execute` of a paid endpoint).
    pub fn pass_on_payment_answers(&self, reply: &mut Reply) {
        for (name, value) in &self.relayed {
            let paid = name == "x-cash-change" || name == crate::money::x402::PAYMENT_RESPONSE;
            if paid && !reply.headers.iter().any(|(n, v)| n == name && v == value) {
                reply.headers.push((name.clone(), value.clone()));
            }
        }
    }

    /// `failed`, the answer to a request that fails (a fault, a refusal of
    /// the upstream, the host's own error): nothing of it is kept, a payment
    /// held at the upstream is refunded, and the payment answers of
    /// requests it dispatched (which stand) are passed on.
    pub fn failing(&mut self, failed: Reply) -> Reply {
        let mut failed = self.refund_upstream(failed);
        self.pass_on_payment_answers(&mut failed);
        failed
    }

    /// [`Ctx::failing`] with a 500: the request failed in the host after
    /// its plugin answered (an invalid answer, a charge not held, a failed
    /// commit).
    fn internal_error(&mut self) -> Reply {
        self.failing(Reply::error(500, "internal", "internal error"))
    }

    /// The answer the plugin chose for its own fault, if it did.
    pub fn take_on_fault(&mut self) -> Option<Reply> {
        self.on_fault.take()
    }

    /// Whether the request's transaction lost a race on the shared store
    /// (then nothing of it can be kept, and it runs again).
    pub fn conflicted(&self) -> bool {
        matches!(&self.txn, Some(Txn::Write(t)) if t.conflicted())
    }

    /// Turn the plugin's answer into the reply, committing the transaction
    /// when (and only when) the answer is a 2xx of a mutating request;
    /// `RunAgain` when the commit lost a race on the shared store, or a
    /// refusal may come from a stale read ([`Ctx::refused_from_fresh`]).
    pub async fn finish(&mut self, mut resp: types::Response) -> Result<Reply, RunAgain> {
        // The change goes into a successful answer where the component put
        // what it was given instead.
        if let Some((stand_in, change)) = &self.change_stand_in
            && (200..300).contains(&resp.status)
        {
            resp.body = with_change(
                &resp.headers,
                std::mem::take(&mut resp.body),
                stand_in,
                change,
            );
        }
        let mut reply = match Reply::from_plugin(
            resp.status,
            resp.headers,
            resp.body,
            self.may_send(),
        ) {
            Ok(reply) => reply,
            Err(why) => {
                tracing::error!(family = %self.family, "plugin answered an invalid response: {why}");
                return Ok(self.internal_error());
            }
        };
        self.pass_on_payment_answers(&mut reply);
        if reply.is_success() && self.unheld > 0 {
            tracing::error!(family = %self.family, units = self.unheld, "escrow charge not held in a contract's account: nothing is kept");
            // As any failure: the answers of requests it dispatched (their
            // payments stand) go with it.
            return Ok(self.internal_error());
        }
        if reply.is_success()
            && let Some(change) = self.charged.as_ref().and_then(|c| c.change.clone())
        {
            reply.headers.push(("x-cash-change".into(), change));
        }
        if reply.is_success()
            && let Some(charge) = &self.charged
        {
            // x402 `PAYMENT-RESPONSE`: kept as JSON text, base64 once sent.
            crate::money::x402::add_response(&mut reply, charge);
        }
        match (self.txn.take(), self.rt.clone()) {
            (Some(Txn::Write(txn)), Some(rt)) if reply.is_success() => {
                // A request with the same x402 payment identifier committed
                // meanwhile: its answer, and this request's charge is dropped.
                if let Some(kept) = crate::money::x402::answered_meanwhile(
                    &rt.ledger,
                    &txn,
                    rt.replays_kept_since_ms(),
                    &self.payment.x402,
                    self.charged.as_ref(),
                ) {
                    // Upstream mode: this request's payment was swapped;
                    // its hold goes back to its payer as a refund.
                    return self.give_kept(&*rt, txn, kept).await;
                }
                // Upstream mode: fee and change are made at the upstream
                // before the commit that settles them.
                if let Err(failed) = self.settle_upstream(&txn) {
                    drop(txn);
                    return Ok(self.failing(failed));
                }
                // Inline, the wait for the batch to be durable is the
                // task's, not the worker's.
                let committed = match self.record_replay(&txn, &reply) {
                    Err(e) => Err(e),
                    Ok(()) => rt.storage.commit_as(txn, self.limiter.yields).await,
                };
                match committed {
                    Ok(()) => Ok(crate::money::x402::sent(reply)),
                    // Nothing was kept (shared store; no upstream there).
                    Err(StorageError::Conflict) => Err(RunAgain::LostRace),
                    // Nothing was kept: its writes would pass the reserve.
                    Err(e @ StorageError::DiskFull) => {
                        Ok(self.failing(crate::reply::storage_failure(&e)))
                    }
                    Err(e) => {
                        commit_failed(&self.family, &e);
                        Ok(self.internal_error())
                    }
                }
            }
            // A paid request that fails while an identical one (same
            // secret, or same x402 payment identifier, and the same request)
            // committed meanwhile (so this one found its secret spent or its
            // signature used): that one's answer, as an identical retry
            // after it gets (PROTOCOL 3), not "spent". It is given once
            // durable: nothing of this request is kept, and its empty
            // commit waits for the batches it read.
            (Some(Txn::Write(txn)), Some(rt))
                if self.replay_key.is_some() || self.payment.x402.keys.is_some() =>
            {
                let kept = self.kept_meanwhile(&*rt, &txn);
                if txn.conflicted() {
                    // The lookup lost a race (shared store): run again.
                    return Err(RunAgain::LostRace);
                }
                match kept {
                    Some(kept) => self.give_kept(&*rt, txn, kept).await,
                    None => {
                        self.refused_from_fresh(&txn, &reply)?;
                        drop(txn);
                        Ok(self.refund_upstream(reply))
                    }
                }
            }
            // Read transactions end here; failed writes (and spends) are
            // discarded (and a payment taken upstream is refunded).
            (txn, _) => {
                if let Some(Txn::Write(txn)) = &txn {
                    self.refused_from_fresh(txn, &reply)?;
                }
                drop(txn);
                Ok(self.refund_upstream(reply))
            }
        }
    }

    /// A refusal (4xx) of a write that read from a shared-store batch
    /// begun before this run is not given: another host's commit that the
    /// client saw acknowledged before sending this request (a replace, a
    /// delivery) could be missing from that read, and a request that
    /// writes nothing has nothing checked at commit. It runs again in a
    /// batch of its own, begun after it ([`RunAgain::Stale`]). Given as it
    /// is: a refusal made before reading anything (a malformed payment
    /// header, say), a 402 to a request that presents no payment secret
    /// (it does not depend on what was read: it is every x402 client's
    /// first answer), and the refusal of a call that dispatched a write
    /// that succeeded (committed on its own: a run again would repeat it).
    fn refused_from_fresh(
        &self,
        txn: &crate::store::WriteTxn,
        reply: &Reply,
    ) -> Result<(), RunAgain> {
        let unpaid =
            reply.status == 402 && self.payment.cash.is_none() && self.payment.bitcoin.is_none();
        if (400..500).contains(&reply.status)
            && !unpaid
            && !self.dispatched_write
            && txn.may_be_stale(self.started)
        {
            tracing::debug!(
                family = %self.family,
                status = reply.status,
                "refused from a batch begun before this request: run again in a batch of its own"
            );
            return Err(RunAgain::Stale);
        }
        Ok(())
    }

    /// Answer `kept` (another request's stored answer) instead of this
    /// request's own. It may come from a batch not yet on disk: it is given
    /// once that batch is durable. This request's writes go; committing
    /// the rest waits for its own batch, which comes after every batch it
    /// read. A payment taken upstream goes back to its payer as a refund
    /// (after the transaction, and its lease, are gone); the payment
    /// answers of requests this one dispatched (committed on their own:
    /// they stand) go with it, as with any answer not its own
    /// ([`Ctx::failing`]).
    async fn give_kept(
        &mut self,
        rt: &dyn Serving,
        txn: crate::store::WriteTxn,
        kept: Reply,
    ) -> Result<Reply, RunAgain> {
        txn.discard_writes();
        match rt.storage.commit_as(txn, self.limiter.yields).await {
            Ok(()) => Ok(self.failing(kept)),
            Err(StorageError::Conflict) => Err(RunAgain::LostRace),
            Err(e) => {
                commit_failed(&self.family, &e);
                Ok(self.internal_error())
            }
        }
    }

    /// The answer an identical paid request (by its x402 payment
    /// identifier, else by its secret and request) committed while this
    /// one ran, as seen in this request's transaction.
    fn kept_meanwhile(&self, rt: &dyn Serving, txn: &impl crate::store::Kv) -> Option<Reply> {
        let since_ms = rt.replays_kept_since_ms();
        if let Some(kept) =
            crate::money::x402::kept_for(&rt.ledger, txn, since_ms, &self.payment.x402)
        {
            tracing::info!(family = %self.family, "same payment identifier answered meanwhile: its stored response");
            return Some(kept);
        }
        let retry = self.replay_key.as_ref()?;
        let stored = rt
            .ledger
            .replay_paid(txn, &retry.public, &retry.key, since_ms)?;
        tracing::info!(family = %self.family, "identical paid request answered meanwhile: its stored response");
        Some(crate::money::x402::sent(stored))
    }

    /// Keep a paid request's answer for identical retries (same
    /// transaction), its secrets replaced by their derivations.
    fn record_replay(
        &self,
        txn: &crate::store::WriteTxn,
        reply: &Reply,
    ) -> Result<(), StorageError> {
        use crate::money::ledger::Ledger;
        let kept = self.kept_for_retries(reply);
        let reply = &*kept;
        match (&self.charged, &self.replay_key) {
            (Some(c), Some(retry)) if !c.public.is_empty() => {
                let now_ms = self.rt.as_ref().map_or(0, |rt| rt.now_ms());
                // With the output the presented secret spent (the charge's:
                // both come from the same header).
                Ledger::record_paid_replay_at(
                    txn,
                    &retry.public,
                    &retry.key,
                    reply,
                    &self.issued,
                    now_ms,
                )
                .and_then(|_| {
                    // Also under its x402 payment identifier, if it has one.
                    crate::money::x402::record(txn, &self.payment.x402, reply, &self.issued, now_ms)
                })
                .map_err(|e| StorageError::Internal(e.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// What identical retries get: `reply`, or the plugin's retry answer
    /// (`payments.retry-answer`) with `reply`'s payment answers
    /// (`X-Cash-Change`, x402's `PAYMENT-RESPONSE`): the payment was taken,
    /// and its change is the payer's whichever answer the retry gets.
    fn kept_for_retries<'a>(&self, reply: &'a Reply) -> std::borrow::Cow<'a, Reply> {
        let Some(instead) = &self.retry_answer else {
            return std::borrow::Cow::Borrowed(reply);
        };
        let mut kept = instead.clone();
        kept.headers.extend(
            reply
                .headers
                .iter()
                .filter(|(k, _)| {
                    k.eq_ignore_ascii_case("x-cash-change")
                        || k.eq_ignore_ascii_case(crate::money::x402::PAYMENT_RESPONSE)
                })
                .cloned(),
        );
        std::borrow::Cow::Owned(kept)
    }

    /// Whether the shared store is unavailable, or was a moment ago.
    fn store_unavailable_lately(&self) -> bool {
        self.rt
            .as_ref()
            .is_some_and(|rt| rt.storage.unavailable_lately())
    }

    /// The request's write transaction (refused in read-only requests).
    fn write_txn(&mut self) -> Result<(&dyn Serving, &crate::store::WriteTxn), types::Refusal> {
        self.must_write()?;
        if let Err(e) = self.txn() {
            return Err(self.internal(&e.to_string()));
        }
        match (&self.rt, &self.txn) {
            (Some(rt), Some(Txn::Write(t))) => Ok((&**rt, t)),
            _ => Err(self.internal("no write transaction")),
        }
    }

    /// A 500 for `why`, logged (summarized while the shared store is
    /// unavailable: see [`crate::logging::request_error`]).
    fn internal(&self, why: &str) -> types::Refusal {
        if self.store_unavailable_lately() {
            crate::logging::request_error(true, Some(&self.family), why);
        } else {
            tracing::error!("{why}");
        }
        refusal(Reply::error(500, "internal", "internal error"))
    }

    /// Refuse (500, logged) a money or signature call in a request that
    /// only reads.
    fn must_write(&self) -> Result<(), types::Refusal> {
        if self.write {
            return Ok(());
        }
        tracing::error!(family = %self.family, "payments, signatures and escrow need a mutating request");
        Err(refusal(Reply::error(500, "internal", "internal error")))
    }

    /// Open an inline write's transaction (see [`Serving::runs_inline`])
    /// without holding its worker: the wait for the commit batch is the
    /// task's. Every import that may open a write transaction calls this
    /// first; elsewhere (a blocking thread, or a read) [`Ctx::txn`] opens
    /// it on first use. The wait does not count against the deadline.
    async fn ready(&mut self) {
        if self.txn.is_some() || !self.write || !self.limiter.yields || self.open_failed.is_some() {
            return;
        }
        let Some(rt) = self.rt.clone() else { return };
        // A request that dispatched another is no longer counted.
        let pending = Self::pending_write(self.pending.take(), &rt, self.alone, self.source);
        let started = std::time::Instant::now();
        match rt.storage.begin_write_async(pending).await {
            Ok(txn) => {
                self.txn = Some(Txn::Write(txn));
                self.limiter.holds_batch = true;
            }
            Err(e) => self.open_failed = Some(e.to_string()),
        }
        self.limiter.extend(started.elapsed());
    }

    /// Whether this call holds the commit batch, itself or through the
    /// call that dispatched it: then it must not wait for a blocking thread
    /// (they may all be waiting for the batch), nor dispatch a write (that
    /// would wait for the batch its own caller holds).
    fn holds_batch(&self) -> bool {
        self.under_batch || matches!(self.txn, Some(Txn::Write(_)))
    }

    /// Record who dispatched this call, if a call did: one that holds the
    /// commit batch makes this one hold it too.
    pub fn dispatched_by(&mut self, from: Caller) {
        self.limiter.turn_waited = from.turn_waited;
        self.depth = from.depth;
        self.source = from.source;
        self.alone = from.alone;
        if let Some(logged) = from.logged {
            self.logged = logged;
        }
        if from.under_batch {
            self.under_batch = true;
            self.limiter.holds_batch = true;
        }
    }

    /// A request as a writer about to take the commit batch: counted from
    /// its start (or now, after it dispatched another), alone after a lost
    /// race, from its client's source.
    fn pending_write(
        pending: Option<crate::store::group_commit::Pending>,
        rt: &Arc<dyn Serving>,
        alone: bool,
        source: Option<std::net::IpAddr>,
    ) -> crate::store::group_commit::Pending {
        pending
            .unwrap_or_else(|| rt.storage.enter())
            .alone(alone)
            .from(source.map_or(0, crate::store::group_commit::source_of))
    }

    /// Who this call is to a request it dispatches.
    fn as_caller(&self) -> Caller {
        Caller {
            under_batch: self.holds_batch(),
            depth: self.depth.saturating_add(1),
            alone: self.alone,
            logged: Some(self.logged.clone()),
            // A dispatched call runs in its caller's share of the long
            // calls' (`long_calls`): no client of its own to count.
            client: None,
            source: self.source,
            // It waited for no turn of its own.
            turn_waited: std::time::Duration::ZERO,
        }
    }

    /// The request's transaction, opened on first use. The wait for it
    /// (the commit batch of the writers before) does not count against the
    /// plugin's deadline.
    fn txn(&mut self) -> Result<&mut Txn, StorageError> {
        if let Some(failed) = &self.open_failed {
            return Err(StorageError::Internal(failed.clone()));
        }
        if self.txn.is_none() && self.write && self.limiter.yields {
            // An import that opens it without `ready` would wait for the
            // commit batch holding an async worker: refused, not risked.
            debug_assert!(
                false,
                "an inline write's transaction opened without `ready`"
            );
            return Err(StorageError::Internal(
                "an inline write's transaction opened without waiting for it".into(),
            ));
        }
        if self.txn.is_none() {
            let rt = self
                .rt
                .as_ref()
                .ok_or_else(|| StorageError::Internal("no storage in this call".into()))?;
            let (started, store_before) =
                (std::time::Instant::now(), crate::store::pg::waited_here());
            self.txn = Some(if self.write {
                let pending = Self::pending_write(self.pending.take(), rt, self.alone, self.source);
                Txn::Write(rt.storage.begin_write_for(pending)?)
            } else {
                Txn::Read(rt.storage.begin_read()?)
            });
            // The wait for the commit batch; a shared store's round trips
            // are not the plugin's time either, and are counted apart
            // (`CallLimiter::expired`).
            self.limiter.extend(
                started
                    .elapsed()
                    .saturating_sub(crate::store::pg::waited_here().saturating_sub(store_before)),
            );
        }
        Ok(self.txn.as_mut().expect("just opened"))
    }
}

/// A refusal a plugin returns unchanged.
pub fn refusal(reply: Reply) -> types::Refusal {
    let code = serde_json::from_slice::<serde_json::Value>(&reply.body)
        .ok()
        .and_then(|v| v.get("code").and_then(|c| c.as_str()).map(str::to_string))
        .unwrap_or_default();
    types::Refusal {
        status: reply.status,
        code,
        body: String::from_utf8_lossy(&reply.body).into_owned(),
    }
}

impl types::Host for Ctx {}

/// `body` with the change put where the component put its stand-in: each
/// whole JSON string `"{stand_in}"` of a JSON answer (no content type,
/// `application/json` or an `application/...+json` type). Nowhere else:
/// inside a longer string (a link; also one whose `\"` escape would put
/// a quote before the stand-in), or in an answer of another type (a page's
/// image), the stand-in stays, for a client following such a link or
/// loading such a page would send the change wherever the component
/// pointed it. (The client still gets the change in `X-Cash-Change`.)
fn with_change(
    headers: &[(String, String)],
    body: Vec<u8>,
    stand_in: &str,
    change: &str,
) -> Vec<u8> {
    let json = headers
        .iter()
        .filter(|(name, _)| name.eq_ignore_ascii_case("content-type"))
        .all(|(_, value)| is_json_type(value));
    if !json || memchr::memmem::find(&body, stand_in.as_bytes()).is_none() {
        return body;
    }
    replace_json_strings(&body, stand_in.as_bytes(), change.as_bytes())
}

/// `application/json`, or `application/<something>+json`, with or
/// without parameters; not a text that is no media type (`x+json`, which
/// a browser would sniff).
fn is_json_type(value: &str) -> bool {
    if !marketplace_common::media::is_media_type(value) {
        return false;
    }
    let essence = value.split(';').next().unwrap_or_default().trim();
    let Some((kind, sub)) = essence.split_once('/') else {
        return false;
    };
    // (A media type is ASCII: any byte is a boundary.)
    kind.eq_ignore_ascii_case("application")
        && (sub.eq_ignore_ascii_case("json")
            || sub.len() > 5 && sub[sub.len() - 5..].eq_ignore_ascii_case("+json"))
}

/// `body` with each JSON string token whose content is exactly `from`
/// (which has nothing to escape) holding `to` instead. Strings are read as
/// a JSON reader reads them: one begins at a quote outside any string and
/// ends at the next quote no backslash escapes.
fn replace_json_strings(body: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + to.len().saturating_sub(from.len()));
    let (mut at, mut copied) = (0, 0);
    while let Some(found) = memchr::memchr(b'"', &body[at..]) {
        let open = at + found;
        let mut scan = open + 1;
        let close = loop {
            let Some(k) = memchr::memchr2(b'"', b'\\', body.get(scan..).unwrap_or_default()) else {
                break None;
            };
            if body[scan + k] == b'"' {
                break Some(scan + k);
            }
            scan += k + 2;
        };
        let Some(close) = close else { break };
        if &body[open + 1..close] == from {
            out.extend_from_slice(&body[copied..=open]);
            out.extend_from_slice(to);
            copied = close;
        }
        at = close + 1;
    }
    out.extend_from_slice(&body[copied..]);
    out
}

/// What a component is given for the change secret `change` of its
/// charge: the same amount, with 64 random hex digits no ledger holds. It
/// puts that where the change goes in its answer, and the host puts the
/// change there ([`Ctx::finish`]): so a component never holds a spendable
/// change, whatever it keeps, logs or sends elsewhere.
pub fn stand_in(change: &str) -> String {
    let amount = change.split(':').next().unwrap_or("e0");
    let mut random = [0u8; 32];
    crate::ids::fill_random(&mut random);
    format!(
        "{amount}:secret:{}",
        marketplace_common::hex::encode(&random)
    )
}

#[cfg(test)]
mod tests {
    use super::with_change;

    fn typed(t: &str) -> Vec<(String, String)> {
        vec![("Content-Type".into(), t.into())]
    }

    #[test]
    fn the_change_goes_only_into_a_whole_json_string_of_a_json_answer() {
        let (stand_in, change) = ("e0.7:secret:aa", "e0.7:secret:bb");
        let body = br#"{"payment":{"change":"e0.7:secret:aa"},"link":"/x?c=e0.7:secret:aa"}"#;
        let put = br#"{"payment":{"change":"e0.7:secret:bb"},"link":"/x?c=e0.7:secret:aa"}"#;
        for headers in [
            vec![],
            typed("application/json"),
            typed("Application/JSON; charset=utf-8"),
            typed("application/problem+json"),
        ] {
            assert_eq!(
                with_change(&headers, body.to_vec(), stand_in, change),
                put,
                "{headers:?}"
            );
        }
        // A quote escaped inside a longer string is no string's start
        // (outside review): the link keeps the stand-in.
        let escaped =
            br#"{"link":"https://evil.example/?c=\"e0.7:secret:aa","c":"e0.7:secret:aa","q":"\\"}"#;
        let put =
            br#"{"link":"https://evil.example/?c=\"e0.7:secret:aa","c":"e0.7:secret:bb","q":"\\"}"#;
        assert_eq!(with_change(&[], escaped.to_vec(), stand_in, change), put);
        let page = br#"<img src="https://evil.example/i?c=e0.7:secret:aa"> "e0.7:secret:aa""#;
        for t in [
            "text/html",
            "text/plain",
            "application/jsonp",
            "+json",
            "x+json",
            "text/x+json",
        ] {
            assert_eq!(
                with_change(&typed(t), page.to_vec(), stand_in, change),
                page,
                "{t}"
            );
        }
    }
}
