//! `dispatch` (capability `dispatch`): run a public `/api/` route
//! in-process, as if it came over HTTP with the caller's payment headers,
//! and the x402 `PAYMENT-SIGNATURE` the dispatched request carries itself
//! (a payment the client sent in a body, as x402 over MCP does in `_meta`).
//! The target runs in its own instance and transaction; a family's own
//! routes are targets only where they write; dispatched requests nest at
//! most [`MAX_DISPATCH_DEPTH`] deep.

use super::{Ctx, Serving, off_the_worker};
use crate::capabilities::Capability;
use crate::money::payments::{PaymentHeaders, PaymentReader};
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{dispatch, types};
use crate::runtime::routes::{Handler, Match};
use std::sync::Arc;

/// Who a request comes from: a client over HTTP (the default), or a
/// plugin call that dispatched it (`dispatch.call`).
#[derive(Clone, Default)]
pub struct Caller {
    /// Dispatched by a call that holds the commit batch, so this one is
    /// treated as holding it too (it may not write, wait for a blocking
    /// thread, or yield).
    pub under_batch: bool,
    /// Dispatches between this request and the client's (0: the client's
    /// own); at most [`MAX_DISPATCH_DEPTH`].
    pub depth: u8,
    /// Runs again after losing races on a shared store (or was dispatched
    /// by such a run): its writes take a commit batch of their own
    /// ([`crate::store::group_commit::Pending::alone`]).
    pub alone: bool,
    /// The log budget of the client's request, shared by every call it
    /// dispatches (None: a client's own request, with a budget of its own).
    pub logged: Option<super::LogBudget>,
    /// The address of the client whose own request this is (None for a
    /// dispatched one; see [`crate::runtime::long_calls`]).
    pub client: Option<std::net::IpAddr>,
    /// Whose turn its writes take in the commit batch's queue: the
    /// client's address, for its own request and every one it dispatches
    /// ([`crate::store::group_commit::Pending::from`]; made a source only
    /// when the request writes).
    pub source: Option<std::net::IpAddr>,
    /// How long the client's own request waited for its address's other
    /// long calls before it was admitted ([`crate::runtime::long_calls`];
    /// zero for a dispatched one): `limits.limit-time` counts it
    /// ([`crate::runtime::limiter::CallLimiter::shorten`]).
    pub turn_waited: std::time::Duration,
}

/// How deep dispatched requests may nest: a chain of families (or a
/// writing route of one family) dispatching on and on ends here, with
/// instances of the pool to spare.
pub const MAX_DISPATCH_DEPTH: u8 = 4;

impl dispatch::Host for Ctx {
    async fn call(&mut self, req: types::Request) -> types::Response {
        // Off the async workers a target runs here; on one (an inline
        // call), only a target that cannot wait does, and any other waits
        // on a blocking thread (for the commit batch, an upstream server
        // or the fee component), unless this call holds the batch.
        let inline = self.limiter.yields;
        // A call holding the commit batch runs a host target in place: the
        // blocking threads may all be waiting for that batch.
        let in_place = !inline || self.holds_batch();
        // The target's time is its own, not this call's (long calls).
        let started = std::time::Instant::now();
        let writes = !crate::runtime::routes::is_read(&req.method.to_ascii_uppercase());
        let reply = match self.target(req, writes) {
            Err(reply) => reply,
            Ok(Target::Host(rt, name, body)) if in_place || rt.host_runs_inline(name) => {
                rt.handle_host(name, &body)
            }
            Ok(Target::Host(rt, name, body)) => {
                off_the_worker(name, move || rt.handle_host(name, &body))
                    .await
                    .unwrap_or_else(|failed| failed)
            }
            Ok(Target::Family(rt, family, req, payment, writes)) => {
                let payment = *payment;
                let from = self.as_caller();
                if !inline {
                    rt.handle_from(&family, req, payment, writes, from)
                } else if !rt.runs_inline(writes) {
                    let f = family.clone();
                    off_the_worker(&family, move || {
                        rt.handle_from(&f, req, payment, writes, from)
                    })
                    .await
                    .unwrap_or_else(|failed| failed)
                } else if writes {
                    // As a client's write: the caller's client going away
                    // does not cancel it halfway.
                    rt.write_as_task(family.clone(), req, payment, from, tracing::Span::current())
                        .await
                        .unwrap_or_else(|e| {
                            tracing::error!(family = %family, "a dispatched write failed: {e}");
                            Reply::error(500, "internal", "internal error")
                        })
                } else {
                    rt.handle_inline(family, req, payment, writes, from).await
                }
            }
        };
        self.limiter.long.waited(started.elapsed());
        if writes && reply.is_success() {
            self.dispatched_write = true;
        }
        // The payment headers given here are the ones this call may pass
        // on in its own answer.
        self.relayed.extend(
            reply
                .headers
                .iter()
                .filter(|(name, _)| crate::reply::HOST_OWNED.contains(&name.as_str()))
                .cloned(),
        );
        types::Response {
            status: reply.status,
            headers: reply.headers,
            body: reply.body,
        }
    }
}

/// What a dispatched request runs.
enum Target {
    /// A host handler, its request body.
    Host(Arc<dyn Serving>, &'static str, Vec<u8>),
    /// A family's route: the family, the routed request, its payment,
    /// whether it writes.
    Family(
        Arc<dyn Serving>,
        String,
        types::Request,
        Box<PaymentHeaders>,
        bool,
    ),
}

impl Ctx {
    /// Route a dispatched request (`writes`: its method is not a read),
    /// or the answer refusing it.
    fn target(&mut self, mut req: types::Request, writes: bool) -> Result<Target, Reply> {
        let Some(rt) = self.rt.clone() else {
            return Err(Reply::error(500, "internal", "internal error"));
        };
        let path = crate::runtime::routes::canonical_path(&req.path);
        if !path.starts_with("/api/") {
            return Err(Reply::error(
                404,
                "not_found",
                format!("only /api/ routes can be executed, not {path}"),
            ));
        }
        if self.depth >= MAX_DISPATCH_DEPTH {
            tracing::error!(
                family = %self.family,
                "dispatch refused: dispatched requests nest at most {MAX_DISPATCH_DEPTH} deep"
            );
            return Err(Reply::error(500, "internal", "internal error"));
        }
        // Payment headers are read by the host, never passed on. The
        // target pays with the caller's, and with an x402 payment the
        // dispatched request carries itself: a client's, sent in a body
        // (an MCP call's `_meta`) rather than as a header. That is the
        // only one a component may add: the same payment twice is one,
        // two different ones are refused as malformed wherever the target
        // has to pay. Any other payment header a component puts on a
        // request is dropped, unread.
        let mut payment = PaymentReader::from(self.payment.clone());
        req.headers.retain(|(name, value)| {
            let name = name.to_ascii_lowercase();
            if name == crate::money::x402::PAYMENT_SIGNATURE {
                payment.read(&name, Some(value));
                return false;
            }
            !crate::money::payments::PAYMENT_HEADERS.contains(&name.as_str())
        });
        let payment = payment.finish();
        let method = req.method.to_ascii_uppercase();
        if writes && self.holds_batch() {
            tracing::error!(family = %self.family, "dispatch of a mutation from a request that holds the commit batch");
            return Err(Reply::error(500, "internal", "internal error"));
        }
        // The target is a request of its own: no batch should wait for this
        // one while it waits for the target.
        self.pending = None;
        match rt.find(&method, &path) {
            Match::NotFound => Err(Reply::no_route(&method, &path, "")),
            Match::MethodNotAllowed(allowed) => Err(Reply::method_refused(
                &method,
                &crate::logging::clip(&path, crate::logging::SHOWN_PATH),
                &allowed,
            )),
            Match::Found { route, params } => {
                if let Some(name) = route.repeated_query(&req.query) {
                    return Err(Reply::invalid(name, crate::runtime::routes::REPEATED));
                }
                if let Some(name) = crate::runtime::routes::param_not_utf8(&route.pattern, &path) {
                    return Err(Reply::invalid(name, crate::runtime::routes::NOT_UTF8));
                }
                if let Some(refused) = Reply::refusing_writes(&rt.state().storage, route.writes) {
                    return Err(refused);
                }
                match &route.handler {
                    // A family reaches its own routes only where they write:
                    // a read route (a JSON-RPC call) may run its family's
                    // writing route as a request of its own; a read never runs
                    // itself, and a writing route that does stops at the
                    // depth cap above. (The caller's input named it: a 400.)
                    Handler::Family(f) if *f == self.family && !route.writes => {
                        Err(Reply::invalid(
                            "path",
                            format!(
                                "{path} is a route of the calling family that only reads: it cannot be dispatched from there"
                            ),
                        ))
                    }
                    Handler::Family(f) => {
                        req.method = method;
                        req.route = route.pattern.clone();
                        req.path = path;
                        req.params = params;
                        // Credentials reach a family only by its own grant,
                        // whoever passes them on.
                        if !rt.granted(f, Capability::Credentials) {
                            req.headers
                                .retain(|(name, _)| !crate::capabilities::is_credential(name));
                        }
                        Ok(Target::Family(
                            rt,
                            f.clone(),
                            req,
                            Box::new(payment),
                            route.writes,
                        ))
                    }
                    Handler::Host(name) => Ok(Target::Host(rt, name, req.body)),
                }
            }
        }
    }
}
