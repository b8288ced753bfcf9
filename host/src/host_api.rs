//! The host side of the WIT imports: what a plugin instance may ask of the
//! host during one request. Everything here acts on that request's
//! transaction, so it commits or vanishes with the request.

use crate::app::{App, Reply, SERVICE_NAME, SERVICE_VERSION};
use crate::payments::Charge;
use crate::runtime::bindings::endpoint::marketplace::plugin::{
    auth, cash, clock, dispatch, host, ids, log, payments, settings, storage, types,
};
use crate::storage::{StorageError, Txn};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;

/// Payment secrets presented with a request (never passed to plugins).
#[derive(Debug, Clone, Default)]
pub struct PaymentHeaders {
    /// `X-Cash-Secret` or its alias `X-Webcash-Secret`.
    pub cash: Option<String>,
    /// `X-Bitcoin-Secret`.
    pub bitcoin: Option<String>,
}

/// The limits of one plugin call: caps linear memory growth (remembering
/// whether the cap was hit) and holds the call's deadline.
pub struct CallLimiter {
    max_bytes: usize,
    hit: bool,
    /// When the call must end; the store's epoch callback checks it.
    deadline: Instant,
}

impl CallLimiter {
    fn new(max_bytes: usize) -> Self {
        CallLimiter {
            max_bytes,
            hit: false,
            deadline: Instant::now() + Duration::from_secs(3600),
        }
    }

    /// Start the call's clock: it may run for `budget` from now.
    pub fn start(&mut self, budget: Duration) {
        self.deadline = Instant::now() + budget;
    }

    /// Let the call run at most `budget` more (never longer than before).
    pub fn shorten(&mut self, budget: Duration) {
        self.deadline = self.deadline.min(Instant::now() + budget);
    }

    pub fn expired(&self) -> bool {
        Instant::now() >= self.deadline
    }
}

impl ResourceLimiter for CallLimiter {
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

/// Store data that carries a call limiter.
pub trait Limiter: Send + 'static {
    fn limiter(&mut self) -> &mut CallLimiter;
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
    /// A mutating request is counted from its start, so that a batch of
    /// writes waits for it (group commit).
    pending: Option<crate::group_commit::Pending>,
    payment: PaymentHeaders,
    /// Key under which a paid request's answer is kept for identical retries.
    replay_key: Option<[u8; 32]>,
    /// The charge taken in this request, if any.
    charged: Option<Charge>,
    /// Statements whose signature already verified in this request.
    prechecked: Vec<auth::Signed>,
    /// The answer the plugin asked for should it fault (`host.on-fault`).
    on_fault: Option<Reply>,
    limiter: CallLimiter,
}

impl Limiter for Ctx {
    fn limiter(&mut self) -> &mut CallLimiter {
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
        replay_key: Option<[u8; 32]>,
        memory_bytes: usize,
    ) -> Ctx {
        Ctx {
            pending: write.then(|| app.storage.enter()),
            app: Some(app),
            family: family.to_string(),
            write,
            txn: None,
            payment,
            replay_key,
            charged: None,
            prechecked: Vec::new(),
            on_fault: None,
            limiter: CallLimiter::new(memory_bytes),
        }
    }

    /// A context with no storage or payments (smoke calls).
    pub fn inert(memory_bytes: usize) -> Ctx {
        Ctx {
            app: None,
            family: String::new(),
            write: false,
            txn: None,
            pending: None,
            payment: PaymentHeaders::default(),
            replay_key: None,
            charged: None,
            prechecked: Vec::new(),
            on_fault: None,
            limiter: CallLimiter::new(memory_bytes),
        }
    }

    /// The answer the plugin chose for its own fault, if it did.
    pub fn take_on_fault(&mut self) -> Option<Reply> {
        self.on_fault.take()
    }

    /// Turn the plugin's answer into the reply, committing the transaction
    /// when (and only when) the answer is a 2xx of a mutating request.
    pub fn finish(mut self, resp: types::Response) -> Reply {
        let mut reply = Reply {
            status: resp.status,
            headers: resp.headers,
            body: resp.body,
        };
        if !(100..=599).contains(&reply.status) {
            tracing::error!(family = %self.family, status = reply.status, "plugin answered an invalid status");
            return Reply::error(500, "internal", "internal error");
        }
        if reply.is_success()
            && let Some(change) = self.charged.as_ref().and_then(|c| c.change.clone())
        {
            reply.headers.push(("x-cash-change".into(), change));
        }
        match (self.txn.take(), &self.app) {
            (Some(Txn::Write(txn)), Some(app)) if reply.is_success() => {
                match self
                    .record_replay(&txn, &reply)
                    .and_then(|_| app.storage.commit(txn))
                {
                    Ok(()) => reply,
                    Err(e) => {
                        tracing::error!(family = %self.family, "commit failed: {e}");
                        Reply::error(500, "internal", "internal error")
                    }
                }
            }
            // Read transactions end here; failed writes (and spends) are discarded.
            _ => reply,
        }
    }

    /// Keep a paid request's answer for identical retries (same transaction).
    fn record_replay(
        &self,
        txn: &crate::storage::WriteTxn,
        reply: &Reply,
    ) -> Result<(), StorageError> {
        match (&self.charged, &self.replay_key) {
            (Some(c), Some(key)) if !c.public.is_empty() => {
                crate::ledger::Ledger::record_replay(txn, key, reply)
                    .map_err(|e| StorageError::Internal(e.to_string()))
            }
            _ => Ok(()),
        }
    }

    /// The request's write transaction (refused in read-only requests).
    fn write_txn(&mut self) -> Result<(&App, &crate::storage::WriteTxn), types::Refusal> {
        let internal = |m: &str| {
            tracing::error!("{m}");
            refusal(Reply::error(500, "internal", "internal error"))
        };
        if !self.write {
            return Err(internal(
                "payments, signatures and cash need a mutating request",
            ));
        }
        self.txn().map_err(|e| internal(&e.to_string()))?;
        match (&self.app, &self.txn) {
            (Some(app), Some(Txn::Write(t))) => Ok((app, t)),
            _ => Err(internal("no write transaction")),
        }
    }

    /// The request's transaction, opened on first use.
    fn txn(&mut self) -> Result<&mut Txn, StorageError> {
        if self.txn.is_none() {
            let app = self
                .app
                .as_ref()
                .ok_or_else(|| StorageError::Internal("no storage in this call".into()))?;
            self.txn = Some(match (self.write, self.pending.take()) {
                (true, Some(pending)) => Txn::Write(app.storage.begin_write_for(pending)?),
                (write, _) => app.storage.begin(write)?,
            });
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

    fn get_many(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>, storage::StorageError> {
        if keys.len() > crate::storage::MAX_GET_MANY {
            return Err(storage::StorageError::TooLarge(format!(
                "at most {} keys per get-many",
                crate::storage::MAX_GET_MANY
            )));
        }
        let ks = self.keyspace(keyspace).map_err(to_wit)?;
        self.txn()
            .and_then(|t| t.get_many(&ks, &keys))
            .map_err(to_wit)
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

    fn scan_packed(
        &mut self,
        keyspace: Option<String>,
        start: Vec<u8>,
        end: Option<Vec<u8>>,
        reverse: bool,
        limit: u32,
    ) -> Result<Vec<u8>, storage::StorageError> {
        let rows = self.scan(keyspace, start, end, reverse, limit)?;
        let size = rows.iter().map(|e| 8 + e.key.len() + e.value.len()).sum();
        let mut buf = Vec::with_capacity(size);
        for e in &rows {
            pack(&mut buf, &e.key);
            pack(&mut buf, &e.value);
        }
        Ok(buf)
    }

    fn get_many_packed(
        &mut self,
        keyspace: Option<String>,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<u8>, storage::StorageError> {
        let values = self.get_many(keyspace, keys)?;
        let size = values
            .iter()
            .map(|v| 4 + v.as_ref().map_or(0, Vec::len))
            .sum();
        let mut buf = Vec::with_capacity(size);
        for v in &values {
            match v {
                Some(v) => pack(&mut buf, v),
                None => buf.extend_from_slice(&u32::MAX.to_le_bytes()),
            }
        }
        Ok(buf)
    }
}

/// Append `bytes` with its little-endian u32 length (the packed form).
fn pack(buf: &mut Vec<u8>, bytes: &[u8]) {
    buf.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    buf.extend_from_slice(bytes);
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
        action: String,
        basis: Option<u64>,
    ) -> Result<payments::Receipt, types::Refusal> {
        if self.charged.is_some() {
            tracing::error!(family = %self.family, "a request may be charged only once");
            return Err(refusal(Reply::error(500, "internal", "internal error")));
        }
        let price = self.quote(action.clone(), basis)?;
        let payment = self.payment.clone();
        let (app, txn) = self.write_txn()?;
        let charge =
            crate::payments::charge(&app.ledger, txn, &payment, &action, price).map_err(refusal)?;
        let receipt = payments::Receipt {
            action: charge.action.clone(),
            price: charge.price,
            paid: charge.paid,
            change: charge.change.clone(),
        };
        self.charged = Some(charge);
        Ok(receipt)
    }

    fn policy(&mut self) -> String {
        match &self.app {
            Some(app) => app.runtime.fee_policy(),
            None => String::new(),
        }
    }
}

fn statement(s: &auth::Signed) -> crate::auth::Statement<'_> {
    crate::auth::Statement {
        actor: &s.actor,
        message: &s.message,
        signature: &s.signature,
        timestamp: s.timestamp,
    }
}

fn same_statement(a: &auth::Signed, b: &auth::Signed) -> bool {
    a.actor == b.actor
        && a.message == b.message
        && a.signature == b.signature
        && a.timestamp == b.timestamp
}

impl auth::Host for Ctx {
    fn verify(
        &mut self,
        signed: auth::Signed,
        require_fresh: bool,
        legacy_single_use: bool,
    ) -> Result<(), types::Refusal> {
        let checked = self.prechecked.iter().any(|p| same_statement(p, &signed));
        let (app, txn) = self.write_txn()?;
        crate::auth::verify(
            txn,
            app.now_ms() / 1000,
            &statement(&signed),
            require_fresh,
            legacy_single_use,
            checked,
        )
        .map_err(refusal)
    }

    fn precheck(&mut self, signed: auth::Signed) -> bool {
        let ok = crate::auth::check_signature(&statement(&signed)).is_ok();
        if ok && self.prechecked.len() < 16 {
            self.prechecked.push(signed);
        }
        ok
    }
}

impl cash::Host for Ctx {
    fn payout(&mut self, purpose: String, amount: u64) -> Result<String, types::Refusal> {
        let family = self.family.clone();
        let (app, txn) = self.write_txn()?;
        let internal = |e: anyhow::Error| {
            tracing::error!(family = %family, "payout failed: {e:#}");
            refusal(Reply::error(500, "internal", "internal error"))
        };
        let (secret, created) = app
            .ledger
            .issue(txn, &format!("{family}:{purpose}"), amount)
            .map_err(internal)?;
        if created {
            crate::ledger::add_total(txn, "escrow", -(amount as i128)).map_err(internal)?;
        }
        Ok(secret)
    }

    fn earn(&mut self, amount: u64) -> Result<(), types::Refusal> {
        let family = self.family.clone();
        let (_, txn) = self.write_txn()?;
        crate::ledger::add_total(txn, "escrow", -(amount as i128))
            .and_then(|_| crate::ledger::add_total(txn, "fees", amount as i128))
            .map_err(|e| {
                tracing::error!(family = %family, "earning a fee failed: {e:#}");
                refusal(Reply::error(500, "internal", "internal error"))
            })
    }
}

impl settings::Host for Ctx {
    fn get(&mut self, key: String) -> Option<String> {
        let app = self.app.as_ref()?;
        app.config.family_settings(&self.family).remove(&key)
    }
}

impl dispatch::Host for Ctx {
    /// Run a public `/api/` request in-process with the caller's payment
    /// headers. The target runs in its own instance and transaction.
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
        use crate::routes::{Handler, Match};
        let Some(app) = self.app.clone() else {
            return Reply::error(500, "internal", "internal error");
        };
        let path = crate::routes::canonical_path(&req.path);
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
        match crate::routes::find(&method, &path, false) {
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
            Match::Found { route, params } => match route.handler {
                Handler::Family(f) if f == self.family => Reply::error(
                    404,
                    "not_found",
                    format!("{path} cannot be executed from itself"),
                ),
                Handler::Family(f) => {
                    req.method = method;
                    req.route = route.pattern.to_string();
                    req.path = path;
                    req.params = params;
                    app.runtime
                        .handle(&app, f, req, self.payment.clone(), route.writes)
                }
                Handler::Host(name) => crate::http::host_route(&app, name, &req.body),
            },
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

    fn on_fault(&mut self, answer: types::Response) {
        if answer.status == 0 {
            self.on_fault = None;
        } else if (200..=599).contains(&answer.status) {
            self.on_fault = Some(Reply {
                status: answer.status,
                headers: answer.headers,
                body: answer.body,
            });
        }
    }

    fn limit_time(&mut self, ms: u32) {
        self.limiter.shorten(Duration::from_millis(ms.into()));
    }

    fn payment_rails(&mut self) -> Vec<host::Rail> {
        crate::payments::RAILS
            .iter()
            .map(|(rail, header, enabled)| host::Rail {
                rail: rail.to_string(),
                header: header.to_string(),
                enabled: *enabled,
            })
            .collect()
    }
}

/// Store data of one fee-policy call.
pub struct FeeCtx {
    limiter: CallLimiter,
    settings: Arc<BTreeMap<String, String>>,
}

impl FeeCtx {
    pub fn new(memory_bytes: usize, settings: Arc<BTreeMap<String, String>>) -> FeeCtx {
        FeeCtx {
            limiter: CallLimiter::new(memory_bytes),
            settings,
        }
    }
}

impl settings::Host for FeeCtx {
    fn get(&mut self, key: String) -> Option<String> {
        self.settings.get(&key).cloned()
    }
}

impl Limiter for FeeCtx {
    fn limiter(&mut self) -> &mut CallLimiter {
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
