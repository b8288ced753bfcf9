//! The runtime as the host interfaces see it: [`Serving`] for
//! [`Runtime`], so that a call's dispatched request, its prices and the
//! families' statuses come from the runtime without the interfaces
//! importing it (they sit below it).

use crate::capabilities::Capability;
use crate::money::payments::PaymentHeaders;
use crate::reply::Reply;
use crate::runtime::api::Served;
use crate::runtime::bindings::endpoint::marketplace::plugin::types;
use crate::runtime::engine::Runtime;
use crate::runtime::host::{Caller, Serving};
use crate::runtime::routes::Match;
use crate::runtime::status::PluginStatus;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

impl Serving for Runtime {
    fn served(&self) -> Arc<Served> {
        Runtime::served(self)
    }

    fn find(&self, method: &str, path: &str) -> Match {
        Runtime::find(self, method, path)
    }

    fn granted(&self, family: &str, capability: Capability) -> bool {
        Runtime::granted(self, family, capability)
    }

    fn configured(&self, family: &str) -> bool {
        self.grants(family).is_some()
    }

    fn statuses(&self) -> Vec<PluginStatus> {
        self.statuses_with(false)
    }

    fn fee_quote(&self, action: &str, basis: Option<u64>) -> Result<u64, Reply> {
        Runtime::fee_quote(self, action, basis)
    }

    fn cached_quote(&self, action: &str, basis: Option<u64>) -> Option<u64> {
        Runtime::cached_quote(self, action, basis)
    }

    fn fee_policy(&self) -> String {
        Runtime::fee_policy(self)
    }

    fn runs_inline(&self, write: bool) -> bool {
        Runtime::runs_inline(self, write)
    }

    fn host_runs_inline(&self, name: &str) -> bool {
        crate::runtime::native::runs_inline(self, name)
    }

    fn handle_host(self: Arc<Self>, name: &str, body: &[u8]) -> Reply {
        crate::runtime::native::handle(&self, name, body)
    }

    fn handle_from(
        self: Arc<Self>,
        family: &str,
        req: types::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Reply {
        Runtime::handle_from(&self, family, req, payment, write, from)
    }

    fn handle_inline(
        self: Arc<Self>,
        family: String,
        req: types::Request,
        payment: PaymentHeaders,
        write: bool,
        from: Caller,
    ) -> Pin<Box<dyn Future<Output = Reply> + Send>> {
        Box::pin(
            async move { Runtime::handle_inline(&self, &family, req, payment, write, from).await },
        )
    }

    fn write_as_task(
        self: Arc<Self>,
        family: String,
        req: types::Request,
        payment: PaymentHeaders,
        from: Caller,
        span: tracing::Span,
    ) -> Pin<Box<dyn Future<Output = Result<Reply, tokio::task::JoinError>> + Send>> {
        Box::pin(
            async move { Runtime::write_as_task(&self, &family, req, payment, from, span).await },
        )
    }
}
