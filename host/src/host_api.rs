//! The host side of the WIT imports: what a plugin instance may ask of the
//! host during one request. Everything here acts on that request's
//! transaction, so it commits or vanishes with the request.

use crate::app::{App, Reply, SERVICE_NAME, SERVICE_VERSION};
use crate::runtime::bindings::endpoint::marketplace::plugin::{
    auth, cash, clock, dispatch, host, ids, log, payments, storage, types,
};
use crate::storage::{StorageError, Txn};
use std::sync::Arc;
use wasmtime::ResourceLimiter;

/// Payment secrets presented with a request (never passed to plugins).
#[derive(Debug, Clone, Default)]
pub struct PaymentHeaders {
    /// `X-Cash-Secret` or its alias `X-Webcash-Secret`.
    pub cash: Option<String>,
    /// `X-Bitcoin-Secret`.
    pub bitcoin: Option<String>,
}

/// Caps linear memory growth and remembers whether the cap was hit.
pub struct MemLimiter {
    max_bytes: usize,
    hit: bool,
}

impl MemLimiter {
    fn new(max_bytes: usize) -> Self {
        MemLimiter {
            max_bytes,
            hit: false,
        }
    }
}

impl ResourceLimiter for MemLimiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.max_bytes {
            self.hit = true;
            return Ok(false);
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 1_000_000)
    }
}

/// Store data that carries a memory limiter.
pub trait Limiter: Send + 'static {
    fn limiter(&mut self) -> &mut dyn ResourceLimiter;
    fn memory_hit(&self) -> bool;
}

/// Store data of one endpoint-plugin call.
pub struct Ctx {
    /// None for the inert context of a smoke call.
    app: Option<Arc<App>>,
    family: String,
    /// Whether this request may write (non-GET/HEAD).
    write: bool,
    /// Opened on first storage use, so routes that never touch storage
    /// never open (or commit) a transaction.
    txn: Option<Txn>,
    #[allow(dead_code)]
    payment: PaymentHeaders,
    limiter: MemLimiter,
}

impl Limiter for Ctx {
    fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }
    fn memory_hit(&self) -> bool {
        self.limiter.hit
    }
}

impl Ctx {
    pub fn new(
        app: Arc<App>,
        family: &str,
        write: bool,
        payment: PaymentHeaders,
        memory_bytes: usize,
    ) -> Ctx {
        Ctx {
            app: Some(app),
            family: family.to_string(),
            write,
            txn: None,
            payment,
            limiter: MemLimiter::new(memory_bytes),
        }
    }

    /// A context with no storage or payments (smoke calls).
    pub fn inert(memory_bytes: usize) -> Ctx {
        Ctx {
            app: None,
            family: String::new(),
            write: false,
            txn: None,
            payment: PaymentHeaders::default(),
            limiter: MemLimiter::new(memory_bytes),
        }
    }

    /// Turn the plugin's answer into the reply, committing the transaction
    /// when (and only when) the answer is a 2xx of a mutating request.
    pub fn finish(mut self, resp: types::Response) -> Reply {
        let reply = Reply {
            status: resp.status,
            headers: resp.headers,
            body: resp.body,
        };
        if !(100..=599).contains(&reply.status) {
            tracing::error!(family = %self.family, status = reply.status, "plugin answered an invalid status");
            return Reply::error(500, "internal", "internal error");
        }
        match (self.txn.take(), &self.app) {
            (Some(Txn::Write(txn)), Some(app)) if reply.is_success() => {
                match app.storage.commit(txn) {
                    Ok(()) => reply,
                    Err(e) => {
                        tracing::error!(family = %self.family, "commit failed: {e}");
                        Reply::error(500, "internal", "internal error")
                    }
                }
            }
            // Read transactions end here; failed writes are discarded.
            _ => reply,
        }
    }

    /// The request's transaction, opened on first use.
    fn txn(&mut self) -> Result<&mut Txn, StorageError> {
        if self.txn.is_none() {
            let app = self
                .app
                .as_ref()
                .ok_or_else(|| StorageError::Internal("no storage in this call".into()))?;
            self.txn = Some(app.storage.begin(self.write)?);
        }
        Ok(self.txn.as_mut().expect("just opened"))
    }

    fn keyspace(&self, requested: Option<String>) -> Result<String, StorageError> {
        match requested {
            None => Ok(self.family.clone()),
            Some(k) => match &self.app {
                Some(app) if app.storage.has_keyspace(&k) => Ok(k),
                _ => Err(StorageError::UnknownKeyspace(k)),
            },
        }
    }
}

fn to_wit(e: StorageError) -> storage::StorageError {
    match e {
        StorageError::ReadOnly => storage::StorageError::ReadOnly,
        StorageError::UnknownKeyspace(k) => storage::StorageError::UnknownKeyspace(k),
        StorageError::TooLarge(m) => storage::StorageError::TooLarge(m),
        StorageError::Internal(m) => storage::StorageError::Internal(m),
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

fn unavailable(what: &str) -> types::Refusal {
    refusal(Reply::error(
        503,
        "plugin_unavailable",
        format!("{what} is not available on this host yet"),
    ))
}

impl types::Host for Ctx {}

impl storage::Host for Ctx {
    fn get(
        &mut self,
        keyspace: Option<String>,
        key: Vec<u8>,
    ) -> Result<Option<Vec<u8>>, storage::StorageError> {
        let ks = self.keyspace(keyspace).map_err(to_wit)?;
        self.txn().and_then(|t| t.get(&ks, &key)).map_err(to_wit)
    }

    fn put(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<(), storage::StorageError> {
        let ks = self.family.clone();
        self.txn()
            .and_then(|t| t.put(&ks, &key, &value))
            .map_err(to_wit)
    }

    fn delete(&mut self, key: Vec<u8>) -> Result<bool, storage::StorageError> {
        let ks = self.family.clone();
        self.txn().and_then(|t| t.delete(&ks, &key)).map_err(to_wit)
    }

    fn scan(
        &mut self,
        keyspace: Option<String>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<storage::Entry>, storage::StorageError> {
        let ks = self.keyspace(keyspace).map_err(to_wit)?;
        let limit = limit.min(100_000) as usize;
        let rows = self
            .txn()
            .and_then(|t| t.scan(&ks, &start, end.as_deref(), reverse, limit))
            .map_err(to_wit)?;
        Ok(rows
            .into_iter()
            .map(|(key, value)| storage::Entry { key, value })
            .collect())
    }
}

impl clock::Host for Ctx {
    fn now_ms(&mut self) -> u64 {
        match &self.app {
            Some(app) => app.now_ms(),
            None => 0,
        }
    }
}

fn write_log(family: &str, level: log::Level, message: &str) {
    let message: String = message.chars().take(4096).collect();
    match level {
        log::Level::Trace => tracing::trace!(plugin = family, "{message}"),
        log::Level::Debug => tracing::debug!(plugin = family, "{message}"),
        log::Level::Info => tracing::info!(plugin = family, "{message}"),
        log::Level::Warn => tracing::warn!(plugin = family, "{message}"),
        log::Level::Error => tracing::error!(plugin = family, "{message}"),
    }
}

impl log::Host for Ctx {
    fn log(&mut self, level: log::Level, message: String) {
        write_log(&self.family, level, &message);
    }
}

impl ids::Host for Ctx {
    fn ulid(&mut self) -> String {
        match &self.app {
            Some(app) => app.ids.ulid_at(app.now_ms()),
            None => String::new(),
        }
    }

    fn random_bytes(&mut self, len: u32) -> Vec<u8> {
        let mut buf = vec![0u8; len.min(4096) as usize];
        crate::ids::fill_random(&mut buf);
        buf
    }
}

impl payments::Host for Ctx {
    fn quote(&mut self, action: String, basis: Option<u64>) -> Result<u64, types::Refusal> {
        let Some(app) = &self.app else {
            return Err(unavailable("pricing"));
        };
        app.runtime.fee_quote(&action, basis).map_err(refusal)
    }

    fn charge(
        &mut self,
        _action: String,
        _basis: Option<u64>,
    ) -> Result<payments::Receipt, types::Refusal> {
        Err(unavailable("payment"))
    }

    fn policy(&mut self) -> String {
        match &self.app {
            Some(app) => app.runtime.fee_policy(),
            None => String::new(),
        }
    }
}

impl auth::Host for Ctx {
    fn verify(
        &mut self,
        _statement: auth::Signed,
        _require_fresh: bool,
    ) -> Result<(), types::Refusal> {
        Err(unavailable("signature verification"))
    }
}

impl cash::Host for Ctx {
    fn payout(&mut self, _purpose: String, _amount: u64) -> Result<String, types::Refusal> {
        Err(unavailable("cash payout"))
    }

    fn earn(&mut self, _amount: u64) -> Result<(), types::Refusal> {
        Err(unavailable("cash ledger"))
    }
}

impl dispatch::Host for Ctx {
    fn call(&mut self, _req: types::Request) -> types::Response {
        let r = Reply::error(
            503,
            "plugin_unavailable",
            "internal dispatch is not available on this host yet",
        );
        types::Response {
            status: r.status,
            headers: r.headers,
            body: r.body,
        }
    }
}

impl host::Host for Ctx {
    fn service(&mut self) -> (String, String) {
        (SERVICE_NAME.into(), SERVICE_VERSION.into())
    }

    fn storage(&mut self) -> host::StorageStats {
        match &self.app {
            Some(app) => host::StorageStats {
                status: if app.storage.healthy() { "ok" } else { "error" }.into(),
                commits: app.storage.commits(),
                syncs: app.storage.syncs(),
            },
            None => host::StorageStats {
                status: "unknown".into(),
                commits: 0,
                syncs: 0,
            },
        }
    }

    fn plugins(&mut self) -> Vec<host::PluginStatus> {
        let Some(app) = &self.app else { return vec![] };
        app.runtime
            .statuses()
            .into_iter()
            .map(|s| host::PluginStatus {
                family: s.family,
                component: s.component,
                version: s.version,
                status: s.status,
            })
            .collect()
    }

    fn payment_rails(&mut self) -> Vec<host::Rail> {
        vec![
            host::Rail {
                rail: "webcash".into(),
                header: "X-Cash-Secret".into(),
                enabled: true,
            },
            host::Rail {
                rail: "bitcoin".into(),
                header: "X-Bitcoin-Secret".into(),
                enabled: false,
            },
        ]
    }
}

/// Store data of one fee-policy call.
pub struct FeeCtx {
    limiter: MemLimiter,
}

impl FeeCtx {
    pub fn new(memory_bytes: usize) -> FeeCtx {
        FeeCtx {
            limiter: MemLimiter::new(memory_bytes),
        }
    }
}

impl Limiter for FeeCtx {
    fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }
    fn memory_hit(&self) -> bool {
        self.limiter.hit
    }
}

impl types::Host for FeeCtx {}

impl log::Host for FeeCtx {
    fn log(&mut self, level: log::Level, message: String) {
        write_log("fees", level, &message);
    }
}
