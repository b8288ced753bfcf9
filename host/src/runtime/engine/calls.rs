//! Calls into components: the stores every call runs in (a deadline and
//! a memory cap; loads and fee quotes use them too), and one request
//! through a family: a fresh instance from the family's pre-instantiated
//! component, its transaction, its answer, and the instance's teardown.

use super::faults::{fault_answered_as_asked, fault_reply};
use super::{Kind, MIN_LOAD_BUDGET, Runtime, wit};
use crate::money::payments::PaymentHeaders;
use crate::reply::Reply;
use crate::runtime::host::{Caller, Ctx, Limiter};
use crate::store::{RunAgain, run_again_on_conflict};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::component::TypedFunc;
use wasmtime::{Store, UpdateDeadline};

/// A finished call's store, torn down when this drops (after the answer
/// is made), the teardown timed into its family's histogram.
struct Teardown<'a> {
    store: Option<Store<Ctx>>,
    family: &'a str,
    metrics: &'a crate::metrics::PluginMetrics,
}

impl Drop for Teardown<'_> {
    fn drop(&mut self) {
        let started = Instant::now();
        drop(self.store.take());
        self.metrics.teardown(self.family, started.elapsed());
    }
}

impl Runtime {
    pub(super) fn store<T: Limiter>(&self, data: T) -> Store<T> {
        self.store_for(data, self.limits.deadline)
    }

    /// The time the calls of a load are given: see [`MIN_LOAD_BUDGET`].
    pub(super) fn load_budget(&self) -> Duration {
        self.limits.deadline.max(MIN_LOAD_BUDGET)
    }

    /// A store whose calls may run for `budget`.
    pub(super) fn store_for<T: Limiter>(&self, data: T, budget: Duration) -> Store<T> {
        let mut store = Store::new(&self.engine, data);
        store.limiter(|d| d.limiter() as &mut dyn wasmtime::ResourceLimiter);
        // Checked on every tick the call runs through, so a plugin may
        // shorten its own deadline (`host.limit-time`).
        store.data_mut().limiter().start(budget);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut cx| {
            let data = cx.data_mut();
            let limiter = data.limiter();
            Ok(if limiter.expired() {
                UpdateDeadline::Interrupt
            } else if limiter.holds_batch {
                UpdateDeadline::Continue(1)
            } else {
                // A long call counts against its client address, wherever
                // it runs (`long_calls`).
                if limiter.account_long() {
                    data.count_long();
                }
                let limiter = data.limiter();
                if limiter.yields {
                    // On an async worker: let the worker's other tasks run
                    // (a long call also waits for its turn).
                    let deadline = limiter.deadline();
                    UpdateDeadline::YieldCustom(1, limiter.long.yield_now(deadline))
                } else {
                    // On a blocking thread (every call, on a shared store):
                    // the operating system shares the cores.
                    UpdateDeadline::Continue(1)
                }
            })
        });
        store
    }

    /// Run one request through an endpoint family in its own transaction,
    /// a write transaction when `write` (the matched route's
    /// [`crate::runtime::routes::Route::writes`]). Writes (and payment spends)
    /// commit only on a 2xx answer. Blocks: call it off the async workers.
    ///
    /// On a shared store, a request whose transaction lost a race with
    /// another host's runs again from the start (a fresh instance, a fresh
    /// transaction), a few times, then answers 503 `storage_conflict`.
    pub fn handle(
        self: &Arc<Self>,
        family: &str,
        req: wit::Request,
        payment: PaymentHeaders,
        write: bool,
    ) -> Reply {
        self.handle_from(family, req, payment, write, Caller::default())
    }

    /// [`Runtime::handle`] of a request from `from` (a dispatching call).
    pub fn handle_from(
        self: &Arc<Self>,
        family: &str,
        req: wit::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Reply {
        run_again_on_conflict(|alone| {
            let from = Caller {
                alone: alone || from.alone,
                ..from.clone()
            };
            run_to_end(self.handle_once(family, &req, payment.clone(), write, false, from))
        })
        .unwrap_or_else(|_: RunAgain| {
            tracing::warn!(family, "still losing races after every run again: 503");
            Reply::conflict()
        })
    }

    /// Whether a request (`write`: of a route that writes) may run on an
    /// async worker ([`Runtime::handle_inline`]) rather than be handed to a
    /// blocking thread: the store is the embedded one (reads come from
    /// memory-mapped pages, no network round trips), and a write waits for
    /// the commit batch and its durability as a task, not a thread
    /// ([`Ctx::ready`](crate::runtime::host::Ctx), `Storage::commit_async`),
    /// unless group commit is off (each commit then waits for its fsync
    /// holding the batch) or payments go to an upstream webcash server (its
    /// calls block). Such a call blocks nowhere but in its own code, which
    /// yields to the worker's other tasks on every epoch tick; what it asks
    /// that could block (a fee component not answered from the kept
    /// prices, a request it dispatches that cannot run inline) runs on a
    /// blocking thread, unless the call holds the commit batch (then in
    /// place: those threads may all be waiting for the batch).
    pub fn runs_inline(&self, write: bool) -> bool {
        let config = &self.state.config;
        !self.state.storage.is_shared()
            && (!write || (config.group_commit && config.cash_upstream.is_none()))
    }

    /// [`Runtime::handle`] on an async worker (see [`Runtime::runs_inline`]).
    /// A write runs through [`Runtime::write_as_task`] instead. `from`: who
    /// dispatched it, if a call did (see [`Caller`]).
    pub async fn handle_inline(
        self: &Arc<Self>,
        family: &str,
        req: wit::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Reply {
        // Only a shared store makes a request run again, and it never runs
        // inline.
        self.handle_once(family, &req, payment, write, true, from)
            .await
            .unwrap_or_else(|_: RunAgain| Reply::conflict())
    }

    /// [`Runtime::handle_inline`] of a write as a task of its own on the
    /// workers, in `span`: a client (or a dispatching call's client) that
    /// goes away does not cancel it halfway (its commit, its charge). Err:
    /// the task panicked.
    pub async fn write_as_task(
        self: &Arc<Self>,
        family: &str,
        req: wit::Request,
        payment: PaymentHeaders,
        from: Caller,
        span: tracing::Span,
    ) -> Result<Reply, tokio::task::JoinError> {
        use tracing::Instrument;
        let (rt, family) = (self.clone(), family.to_string());
        // Boxed: the task then holds a pointer, not the call's 10 KB
        // future, which tokio would otherwise copy into its cell and out.
        tokio::spawn(
            Box::pin(async move { rt.handle_inline(&family, req, payment, true, from).await })
                .instrument(span),
        )
        .await
    }

    /// One run of a request. `inline`: the call runs on an async worker
    /// and yields on epoch ticks; otherwise it never yields, and
    /// [`run_to_end`] finishes it on the calling thread.
    async fn handle_once(
        self: &Arc<Self>,
        family: &str,
        req: &wit::Request,
        mut payment: PaymentHeaders,
        write: bool,
        inline: bool,
        from: Caller,
    ) -> Result<Reply, RunAgain> {
        let Some(plugin) = self.plugin(family) else {
            // Unmounted since its route was found: answered as the route
            // table in force answers its paths now (an unmounted family's
            // routes are 404), not as a passing outage.
            return Ok(Reply::no_route(
                &req.method,
                &req.path,
                &format!(": the {family} family was unmounted"),
            ));
        };
        let Kind::Endpoint { pre, handle } = &plugin.kind else {
            return Ok(Reply::error(500, "internal", "internal error"));
        };
        // The key of this paid request's stored answer.
        let replay_key = match (&payment.cash, write) {
            (Some(secret), true) => {
                crate::money::payments::RetryKey::new(secret, &req.method, &req.path, &req.body)
            }
            _ => None,
        };
        // Both looked up in one view, and none taken when there is nothing
        // to look up.
        if write
            && (payment.x402.id.is_some() || replay_key.is_some())
            && let Ok(view) = self.state.storage.begin_read()
        {
            // A payment identifier (x402) seen before: the stored answer of
            // the same request, or 409 idempotency_conflict for another one.
            let since_ms = self.state.replays_kept_since_ms();
            if let Some(kept) = crate::money::x402::lookup(
                &self.state.ledger,
                &view,
                since_ms,
                &mut payment.x402,
                replay_key.as_ref().map_or("", |r| r.public.as_str()),
                &req.method,
                &req.path,
                &req.body,
            ) {
                return Ok(kept);
            }
            // An identical retry of a paid request gets the stored answer.
            if let Some(stored) = replay_key.as_ref().and_then(|r| {
                self.state
                    .ledger
                    .replay_paid(&view, &r.public, &r.key, since_ms)
            }) {
                tracing::info!(family, "identical paid retry: stored response replayed");
                return Ok(crate::money::x402::sent(stored));
            }
        }
        let ctx = Ctx::new(
            self.clone(),
            family,
            plugin.grants.clone(),
            write,
            payment,
            replay_key,
            self.limits.memory_bytes,
        );
        let mut store = self.store(ctx);
        store
            .data_mut()
            .with_memo(plugin.memo.clone(), self.served().generation);
        store.data_mut().limiter().yields = inline;
        // A dispatched call runs in its caller's share of the long calls'.
        let long = &mut store.data_mut().limiter().long;
        long.takes_turns = from.depth == 0;
        long.client = from.client;
        store.data_mut().dispatched_by(from);
        let started = Instant::now();
        let instance = pre.instance_pre().instantiate_async(&mut store).await;
        let instantiated = Instant::now();
        let result = match instance {
            Ok(instance) => match instance.get_func(&mut store, handle) {
                // SAFETY: the export's type was checked against these
                // parameters and results when the component was loaded
                // (`smoke_describe`); every instance comes from that
                // component's `pre`, and `request` and `response` hold no
                // resource (whose types would be per instance), so the
                // types are the same for each. An index of another
                // component finds no function here (`None` below).
                Some(func) => {
                    unsafe { TypedFunc::<(&wit::Request,), (wit::Response,)>::new_unchecked(func) }
                        .call_async(&mut store, (req,))
                        .await
                        .map(|(resp,)| resp)
                }
                None => Err(wasmtime::format_err!(
                    "the component lost its handle export"
                )),
            },
            Err(e) => Err(e),
        };
        plugin
            .metrics
            .call(family, instantiated - started, instantiated.elapsed());
        // The context leaves the store before the instance is torn down:
        // a write's commit (and its hold on the commit batch, which the
        // next writer waits for) does not wait for the teardown.
        let memory_bytes = self.limits.memory_bytes;
        let mut ctx = std::mem::replace(store.data_mut(), Ctx::inert("", memory_bytes));
        let _torn_down_last = Teardown {
            store: Some(store),
            family,
            metrics: &plugin.metrics,
        };
        if ctx.conflicted() {
            // Whatever the plugin made of it, its reads were not a state
            // that can be kept: run it again.
            drop(ctx);
            return Err(RunAgain::LostRace);
        }
        let mut reply = match result {
            Ok(resp) => {
                plugin.faults.answered();
                // By reference: a future holding the context by value was
                // 6.3 KB, most of a request's future, which is moved
                // (boxed) at every call. It goes before the teardown.
                let finished = ctx.finish(resp).await;
                drop(ctx);
                finished?
            }
            Err(e) => {
                let answer = match ctx.take_on_fault() {
                    Some(chosen) => {
                        fault_answered_as_asked(
                            &plugin,
                            &e,
                            ctx.memory_hit(),
                            chosen.status,
                            ctx.panic_message(),
                        );
                        chosen
                    }
                    None => fault_reply(&plugin, &e, ctx.memory_limit(), ctx.panic_message()),
                };
                // A payment taken at an upstream webcash server comes back;
                // those of requests it dispatched stand (each committed on
                // its own), and their change is the client's.
                let answer = ctx.failing(answer);
                // Its transaction (and any hold on the batch) goes first.
                drop(ctx);
                answer
            }
        };
        // Every 402 also speaks x402 (`PAYMENT-REQUIRED`).
        crate::money::x402::add_required(&mut reply, &req.path, &req.headers);
        crate::money::upstream::add_retry_after(&*self.state, &mut reply);
        Ok(reply)
    }
}

/// Run a plugin call's future to its end on this thread. Off the async
/// workers a call never yields (its limiter's `yields` is false, and its
/// `dispatch` and fee calls run on this thread), so the first poll
/// finishes it.
pub(super) fn run_to_end<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match future.as_mut().poll(&mut cx) {
        std::task::Poll::Ready(out) => out,
        // Nothing would wake it again: a bug, answered 500 by the caller's
        // thread (a blocking task) rather than a thread spinning for ever.
        std::task::Poll::Pending => panic!("a plugin call off the async workers did not finish"),
    }
}
