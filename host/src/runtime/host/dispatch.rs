//! `dispatch` (capability `dispatch`): run a public `/api/` route
//! in-process, as if it came over HTTP with the caller's payment headers.
//! The target runs in its own instance and transaction.

use super::Ctx;
use crate::reply::Reply;
use crate::runtime::bindings::endpoint::marketplace::plugin::{dispatch, types};
use crate::runtime::routes::{Handler, Match};
use crate::store::Txn;

impl dispatch::Host for Ctx {
    fn call(&mut self, req: types::Request) -> types::Response {
        let reply = self.dispatch(req);
        types::Response {
            status: reply.status,
            headers: reply.headers,
            body: reply.body,
        }
    }
}

impl Ctx {
    fn dispatch(&mut self, mut req: types::Request) -> Reply {
        let Some(rt) = self.rt.clone() else {
            return Reply::error(500, "internal", "internal error");
        };
        let path = crate::runtime::routes::canonical_path(&req.path);
        if !path.starts_with("/api/") {
            return Reply::error(
                404,
                "not_found",
                format!("only /api/ routes can be executed, not {path}"),
            );
        }
        let method = req.method.to_ascii_uppercase();
        let writes = !matches!(method.as_str(), "GET" | "HEAD");
        if writes && matches!(self.txn, Some(Txn::Write(_))) {
            tracing::error!(family = %self.family, "dispatch of a mutation from a request that already writes");
            return Reply::error(500, "internal", "internal error");
        }
        // The target is a request of its own: no batch should wait for this
        // one while it waits for the target.
        self.pending = None;
        match rt.find(&method, &path) {
            Match::NotFound => {
                Reply::error(404, "not_found", format!("no route for {method} {path}"))
            }
            Match::MethodNotAllowed(allowed) => Reply::error(
                405,
                "method_not_allowed",
                format!(
                    "{method} is not allowed on {path}; allowed: {}",
                    allowed.join(", ")
                ),
            ),
            Match::Found { route, params } => match &route.handler {
                Handler::Family(f) if *f == self.family => Reply::error(
                    404,
                    "not_found",
                    format!("{path} cannot be executed from itself"),
                ),
                Handler::Family(f) => {
                    req.method = method;
                    req.route = route.pattern.clone();
                    req.path = path;
                    req.params = params;
                    rt.handle(f, req, self.payment.clone(), route.writes)
                }
                Handler::Host(name) => crate::runtime::native::handle(&rt, name, &req.body),
            },
        }
    }
}
