//! The shared store: every table of the host in one PostgreSQL table
//! `<schema>.kv (ks text, k bytea, v bytea, primary key (ks, k))`, so an
//! ordered scan is an index range scan, and many hosts can share it.
//!
//! A batch of mutating requests (see [`crate::store::group_commit`]) is one
//! `SERIALIZABLE` transaction on one connection; a snapshot for reading is
//! one `REPEATABLE READ READ ONLY` transaction, begun at its first read.
//! A serialization failure (SQLSTATE 40001, or a deadlock, 40P01) is a
//! [`StorageError::Conflict`]: the batch is abandoned and its requests run
//! again from scratch.
//!
//! The SQL stays inside what PostgreSQL-compatible distributed databases
//! (CockroachDB, YugabyteDB) run too: no advisory locks, no extensions,
//! `INSERT .. ON CONFLICT`, `unnest` of arrays, explicit retries.
//!
//! The connections are driven by a small runtime of the store's own; the
//! calling thread (a plugin's thread, or any other) waits for its answer by
//! parking, so the store works the same from any thread.

use super::{Budget, Overlay, StorageError};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::future::Future;
use std::pin::pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls, Statement};

/// How long after an outage requests' own error lines are still taken
/// for its echoes ([`PgStore::unavailable_lately`]).
const OUTAGE_ECHO: Duration = Duration::from_secs(2);

/// Most a new connection may take.
const CONNECT_WAIT: Duration = Duration::from_secs(3);
/// How long the health check waits for a connection and for its answer
/// (at most).
const HEALTH_WAIT: Duration = Duration::from_secs(2);

thread_local! {
    /// How long this thread has waited for the shared store.
    static WAITED: std::cell::Cell<Duration> = const { std::cell::Cell::new(Duration::ZERO) };
}

/// How long this thread has waited for the shared store since it started
/// (round trips, connections, a free connection): a plugin call's
/// deadline does not count that time (`CallLimiter::expired`), whichever
/// host call waited (its own storage, a payment, a signature check).
pub fn waited_here() -> Duration {
    WAITED.with(std::cell::Cell::get)
}

/// Count `since`'s elapsed time as this thread's wait for the store.
fn waited_since(since: std::time::Instant) {
    WAITED.with(|w| w.set(w.get() + since.elapsed()));
}

/// Run `f` to completion on this thread, parking between polls. The
/// driver's futures only talk to the connection task through channels, so
/// no runtime is needed here.
pub fn block_on<F: Future>(f: F) -> F::Output {
    block_on_until(f, None).expect("no deadline")
}

/// [`block_on`], giving up (`None`) after `limit`.
fn block_on_within<F: Future>(f: F, limit: Duration) -> Option<F::Output> {
    block_on_until(f, Some(std::time::Instant::now() + limit))
}

fn block_on_until<F: Future>(f: F, deadline: Option<std::time::Instant>) -> Option<F::Output> {
    let started = std::time::Instant::now();
    let out = poll_until(f, deadline);
    waited_since(started);
    out
}

fn poll_until<F: Future>(f: F, deadline: Option<std::time::Instant>) -> Option<F::Output> {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return Some(v);
        }
        match deadline {
            None => std::thread::park(),
            Some(at) => {
                let left = at.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return None;
                }
                std::thread::park_timeout(left);
            }
        }
    }
}

fn pg_err(e: tokio_postgres::Error) -> StorageError {
    match e.code() {
        Some(c)
            if *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::IN_FAILED_SQL_TRANSACTION =>
        {
            StorageError::Conflict
        }
        // (tokio-postgres says only "db error"; the server's message,
        // "permission denied for schema ...", is its cause.)
        _ => StorageError::Internal(format!("postgres: {}", pg_text(&e))),
    }
}

/// Whether `e` says the database cannot be reached or is going away (the
/// connection closed, or its I/O failed; SQLSTATE class 08, a connection
/// exception; 57P01-57P03, the server shutting down or starting; 53300,
/// too many connections), rather than that a statement failed.
fn unreachable(e: &tokio_postgres::Error) -> bool {
    match e.code() {
        None => {
            e.is_closed() || std::error::Error::source(e).is_some_and(|s| s.is::<std::io::Error>())
        }
        Some(c) => {
            let code = c.code();
            code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300")
        }
    }
}

/// Prepared statements of one connection.
struct Prepared {
    get: Statement,
    get_many: Statement,
    scan: [Statement; 4],
    upsert: Statement,
    delete: Statement,
}

/// One pooled connection.
struct Conn {
    client: Client,
    st: Prepared,
}

struct Logged(std::time::Instant);
impl Drop for Logged {
    fn drop(&mut self) {
        tracing::debug!(
            micros = self.0.elapsed().as_micros() as u64,
            "store connection opened"
        );
    }
}

/// Where a connection goes, as an operator wrote it: `host:port` (or the
/// socket directory), each of a list; never the user or password.
fn target_of(config: &tokio_postgres::Config) -> String {
    let ports = config.get_ports();
    let targets: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
            match host {
                tokio_postgres::config::Host::Tcp(name) if name.contains(':') => {
                    format!("[{name}]:{port}")
                }
                tokio_postgres::config::Host::Tcp(name) => format!("{name}:{port}"),
                tokio_postgres::config::Host::Unix(dir) => {
                    format!("{}/.s.PGSQL.{port}", dir.display())
                }
            }
        })
        .collect();
    if targets.is_empty() {
        "the default host".into()
    } else {
        targets.join(", ")
    }
}

/// An error with its causes (`error connecting to server: Connection
/// refused (os error 111)`): tokio-postgres says what failed only in them.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let more = c.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = c.source();
    }
    text
}

/// A PostgreSQL error as one line: the server's own message and its
/// SQLSTATE for a statement's failure (tokio-postgres says only "db
/// error"; the server's DETAIL, which may quote a row, and HINT are left
/// out), else the error with its causes.
fn pg_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            format!("{} (SQLSTATE {})", db.message(), db.code().code()).replace(['\n', '\r'], " ")
        }
        None => with_causes(e),
    }
}

/// The shared store: a pool of connections to one schema.
pub struct PgStore {
    rt: tokio::runtime::Runtime,
    url: String,
    table: String,
    schema: String,
    idle: Mutex<Pool>,
    freed: Condvar,
    max: usize,
    /// Round trips that failed because the database could not be reached
    /// (see [`PgStore::outages`]).
    outages: std::sync::atomic::AtomicU64,
    /// One outage line a second at most: every request fails while the
    /// store is away.
    outage_lines: crate::logging::Throttle,
    /// How long one round trip, or the wait for a free connection, may
    /// take before the store counts as not answering (a database that
    /// hangs, or a network that drops packets): the connection is then
    /// closed and the request fails (503 `store_unavailable` at the HTTP
    /// layer) rather than wait for ever. Generous: a row lock held by
    /// another host's batch is waited for within it. (`store_timeout_ms`)
    timeout: Duration,
    /// When the last outage was counted.
    last_outage: Mutex<Option<std::time::Instant>>,
    /// This host's shard of the counters every host adds to (see
    /// `crate::money::ledger::add_total`): drawn at random at each start,
    /// so two hosts share one rarely (they then race on it, as on one row).
    shard: u16,
    /// The health probe in flight, if any, and the last one's answer: one
    /// at a time, on a thread of its own (see [`PgStore::healthy`]).
    probe: (Mutex<Probe>, Condvar),
}

#[derive(Default)]
struct Probe {
    running: bool,
    last: bool,
}

/// How many counter shards hosts draw theirs from: each total has at most
/// this many rows.
const SHARDS: u16 = 1024;

#[derive(Default)]
struct Pool {
    conns: Vec<Conn>,
    open: usize,
}

/// Quote an identifier.
fn ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl PgStore {
    /// Connect, and make the schema and table when missing.
    pub fn open(
        url: &str,
        schema: &str,
        max_connections: usize,
        timeout: Duration,
    ) -> anyhow::Result<Arc<PgStore>> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("store-pg")
            .enable_all()
            .build()?;
        let store = Arc::new(PgStore {
            rt,
            url: url.to_string(),
            table: format!("{}.kv", ident(schema)),
            schema: schema.to_string(),
            idle: Mutex::new(Pool::default()),
            freed: Condvar::new(),
            max: max_connections.max(2),
            outages: Default::default(),
            outage_lines: crate::logging::Throttle::new(Duration::from_secs(1)),
            timeout,
            last_outage: Mutex::new(None),
            probe: Default::default(),
            shard: {
                let mut r = [0u8; 2];
                crate::ids::fill_random(&mut r);
                u16::from_le_bytes(r) % SHARDS
            },
        });
        let (client, _) = store.connect_raw()?;
        // A schema made now is a new fleet: said, since a mistyped name
        // would otherwise start an empty fleet of its own quietly.
        let existed = block_on(client.query_opt(
            "SELECT 1 FROM pg_catalog.pg_namespace WHERE nspname = $1",
            &[&schema],
        ))
        .map(|row| row.is_some())
        .unwrap_or(true);
        let ddl = format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}; \
             CREATE TABLE IF NOT EXISTS {table} (ks TEXT NOT NULL, k BYTEA NOT NULL, v BYTEA NOT NULL, PRIMARY KEY (ks, k))",
            schema = ident(schema),
            table = store.table,
        );
        // Hosts starting together race to make them: the loser sees a
        // unique violation once, then finds them made.
        let mut tries = 0;
        loop {
            match block_on(client.batch_execute(&ddl)) {
                Ok(()) => break,
                Err(e) if tries < 5 => {
                    tries += 1;
                    tracing::debug!("making the store's table: {}; again", pg_text(&e));
                    std::thread::sleep(Duration::from_millis(50 * tries));
                }
                Err(e) => {
                    return Err(anyhow::anyhow!("making {}: {}", store.table, pg_text(&e)));
                }
            }
        }
        if !existed {
            tracing::warn!(
                schema,
                "made the schema {schema} in the shared store: a new fleet with no data (hosts of an existing fleet name its schema, store_schema)"
            );
        }
        Ok(store)
    }

    /// The schema's name (health, logs).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// Round trips since start that failed because the database could not
    /// be reached (refused, closed, or no answer in time): a request whose
    /// storage failed while this grew is answered 503 `store_unavailable`
    /// rather than 500 (`crate::server::http`).
    pub fn outages(&self) -> u64 {
        self.outages.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether a round trip failed for want of the store within the last
    /// [`OUTAGE_ECHO`]: requests' own error lines are then summarized
    /// (see `crate::runtime::host::log`), the store's outage line saying
    /// what failed.
    pub fn unavailable_lately(&self) -> bool {
        self.last_outage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|at| at.elapsed() < OUTAGE_ECHO)
    }

    /// A failed round trip as the caller sees it: an outage when the
    /// database could not be reached, else what the statement's failure is.
    fn error(&self, e: tokio_postgres::Error) -> StorageError {
        if unreachable(&e) {
            self.outage(e)
        } else {
            pg_err(e)
        }
    }

    /// Count an outage (logged at most once a second, with the count
    /// since); the error to give the caller.
    fn outage(&self, what: impl std::fmt::Display) -> StorageError {
        self.outages
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        *self.last_outage.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(std::time::Instant::now());
        if let Some(failed) = self.outage_lines.note() {
            tracing::warn!(
                failed_since_last_line = failed,
                "the shared store is unavailable: {what}"
            );
        }
        StorageError::Internal(format!("{}{what}", super::UNAVAILABLE))
    }

    fn connect_raw(&self) -> Result<(Client, ()), StorageError> {
        let mut config: tokio_postgres::Config = self
            .url
            .parse()
            .map_err(|e| StorageError::Internal(format!("postgres url: {e}")))?;
        let target = target_of(&config);
        let connect_wait = CONNECT_WAIT.min(self.timeout);
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(connect_wait);
        }
        let task = self.rt.spawn(async move {
            let (client, conn) = config.connect(NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    // The store going away ends every pooled connection:
                    // its outage line says so once (a request meeting it).
                    if unreachable(&e) {
                        tracing::debug!("store connection ended: {}", pg_text(&e));
                    } else {
                        tracing::warn!("store connection ended: {}", pg_text(&e));
                    }
                }
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = block_on_within(task, connect_wait + Duration::from_millis(500))
            .ok_or_else(|| self.outage(format_args!("connecting to {target} took too long")))?
            .map_err(|e| StorageError::Internal(format!("postgres connect: {}", with_causes(&e))))?
            .map_err(|e| self.outage(format_args!("connecting to {target}: {}", pg_text(&e))))?;
        Ok((client, ()))
    }

    fn connect(&self) -> Result<Conn, StorageError> {
        let started = std::time::Instant::now();
        let (client, ()) = self.connect_raw()?;
        let _log = Logged(started);
        // Every statement here is a lookup or a range of the primary key,
        // and the plan that reads it through the key is right whatever the
        // table holds. PostgreSQL's own choice per call follows the
        // table's statistics, which lag behind a keyspace that grows fast
        // (a new fleet, a bulk of posts): planned on them, a get-many of a
        // few dozen keys read the whole keyspace through `ks` alone and
        // filtered it (117 ms over 200,000 rows instead of 0.1 ms), and a
        // range sorted all its rows to return the first few. A server
        // older than PostgreSQL 12, which lacks the setting, plans as
        // before.
        match block_on_within(
            client.batch_execute("SET plan_cache_mode = force_generic_plan"),
            self.timeout,
        ) {
            Some(Ok(())) => {}
            Some(Err(e)) => tracing::debug!("plan_cache_mode not set: {e}"),
            None => return Err(self.outage("setting up a connection took too long")),
        }
        let t = &self.table;
        let prep = |sql: String| match block_on_within(client.prepare(&sql), self.timeout) {
            Some(result) => result.map_err(|e| self.error(e)),
            None => Err(self.outage("preparing statements took too long")),
        };
        let scan = |order: &str, end: bool| {
            let bound = if end { " AND k < $3" } else { "" };
            let limit = if end { "$4" } else { "$3" };
            prep(format!(
                "SELECT k, v FROM {t} WHERE ks = $1 AND k >= $2{bound} ORDER BY k {order} LIMIT {limit}"
            ))
        };
        let st = Prepared {
            get: prep(format!("SELECT v FROM {t} WHERE ks = $1 AND k = $2"))?,
            get_many: prep(format!(
                "SELECT k, v FROM {t} WHERE ks = $1 AND k = ANY($2::BYTEA[])"
            ))?,
            scan: [
                scan("ASC", false)?,
                scan("ASC", true)?,
                scan("DESC", false)?,
                scan("DESC", true)?,
            ],
            upsert: prep(format!(
                "INSERT INTO {t} (ks, k, v) SELECT $1::TEXT, u.k, u.v \
                 FROM unnest($2::BYTEA[], $3::BYTEA[]) AS u(k, v) \
                 ON CONFLICT (ks, k) DO UPDATE SET v = excluded.v"
            ))?,
            delete: prep(format!(
                "DELETE FROM {t} WHERE ks = $1 AND k = ANY($2::BYTEA[])"
            ))?,
        };
        Ok(Conn { client, st })
    }

    /// A connection from the pool, or a new one while under the cap.
    fn take(self: &Arc<Self>) -> Result<Lent, StorageError> {
        self.take_within(self.timeout)
    }

    /// [`PgStore::take`], waiting at most `wait` for a connection to be
    /// given back when all are lent.
    fn take_within(self: &Arc<Self>, wait: Duration) -> Result<Lent, StorageError> {
        let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(conn) = pool.conns.pop() {
                if conn.client.is_closed() {
                    pool.open -= 1;
                    continue;
                }
                return Ok(self.lent(conn));
            }
            if pool.open < self.max {
                pool.open += 1;
                drop(pool);
                return match self.connect() {
                    Ok(conn) => Ok(self.lent(conn)),
                    Err(e) => {
                        self.idle.lock().unwrap_or_else(|p| p.into_inner()).open -= 1;
                        self.freed.notify_one();
                        Err(e)
                    }
                };
            }
            let started = std::time::Instant::now();
            let (next, timeout) = self
                .freed
                .wait_timeout(pool, wait)
                .unwrap_or_else(|p| p.into_inner());
            waited_since(started);
            pool = next;
            if timeout.timed_out() && pool.conns.is_empty() && pool.open >= self.max {
                let open = pool.open;
                drop(pool);
                return Err(self.outage(format_args!(
                    "no store connection free within {wait:?} ({open} open)"
                )));
            }
        }
    }

    fn lent(self: &Arc<Self>, conn: Conn) -> Lent {
        Lent {
            conn: Some(conn),
            store: self.clone(),
            in_txn: false,
            read_only: false,
            aborted: std::cell::Cell::new(false),
            broken: std::cell::Cell::new(false),
            begin: std::cell::Cell::new(None),
            pending: Default::default(),
            pending_bytes: Default::default(),
            taken: std::time::Instant::now(),
        }
    }

    fn give_back(&self, conn: Option<Conn>) {
        let mut pool = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        match conn {
            Some(c) if !c.client.is_closed() => pool.conns.push(c),
            _ => pool.open -= 1,
        }
        drop(pool);
        self.freed.notify_one();
    }

    /// Begin the transaction of a batch of mutating requests.
    pub fn begin_batch(self: &Arc<Self>) -> Result<Lent, StorageError> {
        let mut lent = self.take()?;
        lent.begin("BEGIN ISOLATION LEVEL SERIALIZABLE")?;
        Ok(lent)
    }

    /// A snapshot for reading, begun at its first read.
    pub fn begin_read(self: &Arc<Self>) -> PgRead {
        PgRead {
            store: self.clone(),
            lent: std::cell::RefCell::new(None),
        }
    }

    /// Whether the store answers (within [`HEALTH_WAIT`] for a
    /// connection and as much for the answer).
    ///
    /// The probe runs on a thread of its own, one at a time: a store that
    /// hangs can hold it longer (a new connection may take 3 s to fail),
    /// but no health check waits past [`HEALTH_WAIT`], and a flood of
    /// checks starts no more than one probe.
    pub fn healthy(self: &Arc<Self>) -> bool {
        let wait = HEALTH_WAIT.min(self.timeout);
        let deadline = std::time::Instant::now() + wait;
        let (lock, done) = &self.probe;
        let mut probe = lock.lock().unwrap_or_else(|p| p.into_inner());
        if !probe.running {
            probe.running = true;
            let store = self.clone();
            let spawned = std::thread::Builder::new()
                .name("store-health".into())
                .spawn(move || {
                    let ok = store
                        .take_within(wait)
                        .and_then(|l| l.wait_for(l.conn().client.simple_query("SELECT 1"), wait))
                        .is_ok();
                    let (lock, done) = &store.probe;
                    let mut probe = lock.lock().unwrap_or_else(|p| p.into_inner());
                    *probe = Probe {
                        running: false,
                        last: ok,
                    };
                    done.notify_all();
                });
            if spawned.is_err() {
                probe.running = false;
                return false;
            }
        }
        while probe.running {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            probe = done
                .wait_timeout(probe, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        probe.last
    }
}

/// A connection lent out of the pool, in a transaction or not; a
/// transaction not committed is rolled back when it is dropped.
pub struct Lent {
    conn: Option<Conn>,
    store: Arc<PgStore>,
    in_txn: bool,
    /// A snapshot for reading: its end need not be waited for.
    read_only: bool,
    /// A statement failed: PostgreSQL aborted the transaction, and would
    /// answer its `COMMIT` with a rollback (not an error).
    aborted: std::cell::Cell<bool>,
    /// The connection failed or did not answer in time: it is closed, not
    /// given back.
    broken: std::cell::Cell<bool>,
    /// A `BEGIN ..` not sent yet: it goes out with the first query, in one
    /// round trip.
    begin: std::cell::Cell<Option<&'static str>>,
    /// A batch's writes not sent yet: its requests' overlays as they ended
    /// (a later write of a key wins). They go out at `COMMIT`, in one
    /// order, sorted by keyspace and key, so that two hosts' batches take
    /// their row locks in the same order: one waits for the other instead
    /// of the two deadlocking (which PostgreSQL finds only after
    /// `deadlock_timeout`, a second by default). Batch-mates read them
    /// first ([`Lent::pending`]).
    pending: std::cell::RefCell<Overlay>,
    /// Bytes of keys and values added to `pending` (overwrites counted
    /// again): a batch past [`PENDING_BATCH_BYTES`] is closed.
    pending_bytes: std::cell::Cell<usize>,
    /// When it was taken from the pool. Its transaction begins after, and
    /// PostgreSQL takes the snapshot at its first statement: so the
    /// snapshot holds every commit acknowledged before this instant.
    taken: std::time::Instant,
}

/// A shared store's batch holding this many bytes of writes not sent yet
/// is committed at once, so that what a batch holds in memory and sends at
/// its `COMMIT` stays bounded whatever the batch size.
pub const PENDING_BATCH_BYTES: usize = 32 << 20;

/// Bytes of keys and values one statement of a batch's writes carries at
/// most (a run longer than that goes out as several, in the same order).
const STATEMENT_BYTES: usize = 4 << 20;

impl Drop for Lent {
    fn drop(&mut self) {
        let mut conn = self.conn.take();
        if self.broken.get() {
            conn = None;
        }
        let begun = self.begin.get().is_none();
        match &conn {
            Some(c) if self.in_txn && begun && self.read_only => {
                // Sent, not waited for: the connection's next user queues
                // behind it, and a snapshot has nothing to undo.
                send_only(c.client.batch_execute("ROLLBACK"));
            }
            Some(c)
                if self.in_txn
                    && begun
                    && !matches!(
                        block_on_within(c.client.batch_execute("ROLLBACK"), self.store.timeout),
                        Some(Ok(()))
                    ) =>
            {
                // Not reusable in an unknown state.
                conn = None;
            }
            _ => {}
        }
        self.store.give_back(conn);
    }
}

/// Poll `f` once, which sends its message to the connection, and drop it:
/// the answer is read and dropped by the connection task.
fn send_only<F: Future>(f: F) {
    let mut cx = Context::from_waker(Waker::noop());
    let _ = pin!(f).as_mut().poll(&mut cx);
}

impl Lent {
    /// The host's shard of shared counters ([`PgStore`]'s `shard`).
    pub fn shard(&self) -> u16 {
        self.store.shard
    }

    fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("lent until dropped")
    }

    fn begin(&mut self, sql: &str) -> Result<(), StorageError> {
        self.wait(self.conn().client.batch_execute(sql))?;
        self.in_txn = true;
        Ok(())
    }

    /// Wait for one round trip, at most the store's `timeout`.
    fn wait<T>(
        &self,
        f: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StorageError> {
        self.wait_for(f, self.store.timeout)
    }

    /// Wait for one round trip, at most `limit`: a failure is the
    /// transaction's (see [`Lent::failed`]); no answer in time closes the
    /// connection, and counts as an outage.
    fn wait_for<T>(
        &self,
        f: impl Future<Output = Result<T, tokio_postgres::Error>>,
        limit: Duration,
    ) -> Result<T, StorageError> {
        match block_on_within(f, limit) {
            Some(result) => result.map_err(|e| self.failed(e)),
            None => {
                self.aborted.set(true);
                self.broken.set(true);
                Err(self
                    .store
                    .outage(format_args!("no answer within {limit:?}")))
            }
        }
    }

    /// Begin with the first query (see [`Lent::run`]).
    fn begin_lazily(&mut self, sql: &'static str) {
        self.begin.set(Some(sql));
        self.in_txn = true;
    }

    /// Wait for `query`; a `BEGIN` not sent yet goes out just before it, in
    /// the same round trip.
    fn run<T>(
        &self,
        query: impl Future<Output = Result<T, tokio_postgres::Error>>,
    ) -> Result<T, StorageError> {
        match self.begin.take() {
            None => self.wait(query),
            Some(begin) => {
                let (began, result) = self.wait(
                    futures_util::future::join(self.conn().client.batch_execute(begin), query)
                        .map(Ok),
                )?;
                began.map_err(|e| self.failed(e))?;
                result.map_err(|e| self.failed(e))
            }
        }
    }

    /// A statement of the transaction failed: it is aborted (and when the
    /// database could not be reached, its connection is closed and the
    /// failure counts as an outage).
    fn failed(&self, e: tokio_postgres::Error) -> StorageError {
        self.aborted.set(true);
        if unreachable(&e) {
            self.broken.set(true);
        }
        self.store.error(e)
    }

    /// Whether a statement failed (the transaction is aborted).
    pub fn is_aborted(&self) -> bool {
        self.aborted.get()
    }

    /// When the connection was taken for this transaction (see the field).
    pub fn taken(&self) -> std::time::Instant {
        self.taken
    }

    /// Commit the transaction, its pending writes first: a conflict is
    /// [`StorageError::Conflict`].
    pub fn commit(mut self) -> Result<(), StorageError> {
        if self.aborted.get() {
            // Nothing of it can be kept (PostgreSQL would roll it back and
            // say so only in the command tag): its requests run again.
            return Err(StorageError::Conflict);
        }
        // A failure leaves the transaction open and aborted: dropping the
        // lease rolls it back. A lost race is a conflict, as at COMMIT.
        let pending = std::mem::take(&mut *self.pending.borrow_mut());
        self.write(&pending)?;
        let result = self.wait(self.conn().client.batch_execute("COMMIT"));
        // Whatever the outcome, the transaction is over.
        self.in_txn = false;
        result
    }

    pub fn get(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let c = self.conn();
        let row = self.run(c.client.query_opt(&c.st.get, &[&table, &key]))?;
        Ok(row.map(|r| r.get::<_, Vec<u8>>(0)))
    }

    pub fn get_many_within(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        if keys.is_empty() {
            return Ok(vec![]);
        }
        let c = self.conn();
        let list: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        let rows = self.run(c.client.query(&c.st.get_many, &[&table, &list]))?;
        let found: HashMap<Vec<u8>, Vec<u8>> = rows
            .into_iter()
            .map(|r| (r.get::<_, Vec<u8>>(0), r.get::<_, Vec<u8>>(1)))
            .collect();
        let mut budget = Budget::new(max_bytes);
        keys.iter()
            .map(|k| {
                let v = found.get(k).cloned();
                budget.take(v.as_ref().map_or(0, Vec::len))?;
                Ok(v)
            })
            .collect()
    }

    /// Rows of [start, end) in scan order, at most `limit`, read from the
    /// connection as they are taken: a caller that stops early (a byte
    /// budget) never holds the rest.
    pub fn scan_rows(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<RowIter<'_>, StorageError> {
        let c = self.conn();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let st = &c.st.scan[usize::from(reverse) * 2 + usize::from(end.is_some())];
        let table = &table as &(dyn tokio_postgres::types::ToSql + Sync);
        let stream = match end {
            Some(end) => self.run(c.client.query_raw(st, [table, &start, &end, &limit])),
            None => self.run(c.client.query_raw(st, [table, &start, &limit])),
        }?;
        Ok(RowIter {
            stream: Box::pin(stream),
            lent: self,
        })
    }

    /// Add a request's overlay to the batch's pending writes (sent at
    /// [`Lent::commit`]).
    pub fn apply(&self, overlay: Overlay) -> Result<(), StorageError> {
        let mut pending = self.pending.borrow_mut();
        let mut bytes = 0;
        for (table, writes) in overlay {
            bytes += writes
                .iter()
                .map(|(k, v)| k.len() + v.as_ref().map_or(0, Vec::len))
                .sum::<usize>();
            pending.entry(table).or_default().extend(writes);
        }
        self.pending_bytes
            .set(self.pending_bytes.get().saturating_add(bytes));
        Ok(())
    }

    /// Bytes of writes added to the batch and not sent yet (see
    /// [`PENDING_BATCH_BYTES`]).
    pub fn pending_bytes(&self) -> usize {
        self.pending_bytes.get()
    }

    /// The batch's writes not sent yet, which its requests read before the
    /// database's rows.
    pub fn pending(&self) -> std::cell::Ref<'_, Overlay> {
        self.pending.borrow()
    }

    /// Send `writes` in their order (keyspace, then key): one statement per
    /// run of puts or deletes, all at once (one round trip; a connection
    /// runs them in the order sent).
    fn write(&self, writes: &Overlay) -> Result<(), StorageError> {
        if writes.is_empty() {
            return Ok(());
        }
        let c = self.conn();
        /// One statement: which, its keyspace, its keys and (puts) values.
        type Run<'a> = (&'a Statement, &'a String, Vec<&'a [u8]>, Vec<&'a [u8]>);
        let mut statements: Vec<Run> = vec![];
        let mut run_bytes = 0;
        for (table, rows) in writes {
            for (k, v) in rows {
                let put = v.is_some();
                let st = if put { &c.st.upsert } else { &c.st.delete };
                let size = k.len() + v.as_ref().map_or(0, Vec::len);
                let same_run = statements.last().is_some_and(|(last, t, _, _)| {
                    *t == table && std::ptr::eq(*last, st) && run_bytes + size <= STATEMENT_BYTES
                });
                if !same_run {
                    statements.push((st, table, vec![], vec![]));
                    run_bytes = 0;
                }
                run_bytes += size;
                let run = statements.last_mut().expect("pushed above");
                run.2.push(k.as_slice());
                if let Some(v) = v {
                    run.3.push(v.as_slice());
                }
            }
        }
        type Param<'a> = &'a (dyn tokio_postgres::types::ToSql + Sync);
        let sent = statements.iter().map(|(st, table, keys, values)| {
            let mut params: Vec<Param> = vec![table, keys];
            if !values.is_empty() {
                params.push(values);
            }
            c.client.execute_raw(*st, params)
        });
        for result in self.run(futures_util::future::join_all(sent).map(Ok))? {
            result.map_err(|e| self.failed(e))?;
        }
        Ok(())
    }
}

/// The rows of a scan, as the connection delivers them.
pub struct RowIter<'a> {
    stream: std::pin::Pin<Box<tokio_postgres::RowStream>>,
    lent: &'a Lent,
}

impl Iterator for RowIter<'_> {
    type Item = Result<(Vec<u8>, Vec<u8>), StorageError>;

    fn next(&mut self) -> Option<Self::Item> {
        use futures_util::StreamExt;
        let row = match self
            .lent
            .wait(self.stream.next().map(|row| row.transpose()))
        {
            Ok(row) => row?,
            Err(e) => return Some(Err(e)),
        };
        Some(Ok((row.get(0), row.get(1))))
    }
}

/// A snapshot of committed data, on a connection taken at its first read
/// and given back when it is dropped.
pub struct PgRead {
    store: Arc<PgStore>,
    lent: std::cell::RefCell<Option<Lent>>,
}

impl PgRead {
    fn with<R>(&self, f: impl FnOnce(&Lent) -> Result<R, StorageError>) -> Result<R, StorageError> {
        let mut slot = self.lent.borrow_mut();
        if slot.is_none() {
            let mut lent = self.store.take()?;
            lent.read_only = true;
            lent.begin_lazily("BEGIN ISOLATION LEVEL REPEATABLE READ, READ ONLY");
            *slot = Some(lent);
        }
        f(slot.as_ref().expect("just set"))
    }
}

impl super::Kv for PgRead {
    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.with(|l| l.get(table, key))
    }

    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn super::ValueSink,
    ) -> Result<(), StorageError> {
        let values = self.with(|l| l.get_many_within(table, keys, max_bytes))?;
        values.into_iter().for_each(|v| out.owned(v));
        Ok(())
    }

    fn scan_into(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
        out: &mut dyn super::RowSink,
    ) -> Result<(), StorageError> {
        if end.is_some_and(|e| e <= start) {
            return Ok(());
        }
        self.with(|l| {
            super::merge(
                l.scan_rows(table, start, end, reverse, limit)?,
                Vec::new(),
                reverse,
                limit,
                max_bytes,
                out,
            )
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::store::{Kv, Packed, Settings, Storage, StorageError};
    use std::sync::Arc;

    #[test]
    fn a_connection_failure_names_where_and_why() {
        let config = |url: &str| url.parse::<tokio_postgres::Config>().unwrap();
        assert_eq!(
            super::target_of(&config("postgres://u:pw@db.example:6543/x")),
            "db.example:6543"
        );
        assert_eq!(
            super::target_of(&config("postgres://u@a,b:7/x")),
            "a:5432, b:7"
        );
        assert_eq!(
            super::target_of(&config("host=/run/pg port=5433 user=u")),
            "/run/pg/.s.PGSQL.5433"
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        #[derive(Debug)]
        struct Outer(std::io::Error);
        impl std::fmt::Display for Outer {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("error connecting to server")
            }
        }
        impl std::error::Error for Outer {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        assert_eq!(
            super::with_causes(&Outer(io)),
            "error connecting to server: refused"
        );
    }

    /// The throwaway cluster of `cargo xtask test`, or None (skipped, unless
    /// MARKETPLACE_REQUIRE_PG=1).
    pub(crate) fn url() -> Option<String> {
        match std::env::var("MARKETPLACE_TEST_PG") {
            Ok(u) if !u.is_empty() => Some(u),
            _ => {
                assert!(
                    std::env::var("MARKETPLACE_REQUIRE_PG").as_deref() != Ok("1"),
                    "MARKETPLACE_TEST_PG is not set but MARKETPLACE_REQUIRE_PG=1"
                );
                eprintln!("skipped: no PostgreSQL (MARKETPLACE_TEST_PG unset)");
                None
            }
        }
    }

    /// A schema of its own for each test.
    pub(crate) fn schema() -> String {
        let mut b = [0u8; 6];
        crate::ids::fill_random(&mut b);
        format!("unit_{}", marketplace_common::hex::encode(&b))
    }

    pub(crate) fn open(url: &str, schema: &str) -> Storage {
        Storage::open_pg(url, schema, 8, TIMEOUT, Settings::default()).unwrap()
    }

    const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

    #[test]
    fn overlay_reads_scans_and_deletes_like_redb() {
        let Some(url) = url() else { return };
        let schema = schema();
        let (_dir, redb) = crate::store::temp_storage();
        let pg = open(&url, &schema);
        for s in [&redb, &pg] {
            let w = s.begin_write().unwrap();
            for k in [b"a1", b"a2", b"a3", b"a4", b"b1"] {
                w.put_in("kv:t", k, k).unwrap();
            }
            s.commit(w).unwrap();
        }
        let run = |s: &Storage| {
            let w = s.begin_write().unwrap();
            w.put_in("kv:t", b"a25", b"new").unwrap();
            w.delete_in("kv:t", b"a3").unwrap();
            w.put_in("kv:t", b"a1", b"changed").unwrap();
            let mut seen = vec![
                w.scan_in("kv:t", b"a", Some(b"b"), false, 10).unwrap(),
                w.scan_in("kv:t", b"a", Some(b"b"), true, 3).unwrap(),
                w.scan_in("kv:t", b"a2", None, false, 100).unwrap(),
            ];
            let many = w
                .get_many_in(
                    "kv:t",
                    &[
                        b"a1".to_vec(),
                        b"zz".to_vec(),
                        b"a2".to_vec(),
                        b"a1".to_vec(),
                        b"a2".to_vec(),
                    ],
                )
                .unwrap();
            seen.push(
                many.into_iter()
                    .map(|v| (vec![], v.unwrap_or_default()))
                    .collect(),
            );
            // The packed forms a plugin reads, through the overlay.
            let keys = [b"a1".to_vec(), b"zz".to_vec(), b"a3".to_vec()];
            let mut packed = Packed::default();
            w.scan_into("kv:t", b"a", Some(b"b"), true, 3, usize::MAX, &mut packed)
                .unwrap();
            w.get_many_into("kv:t", &keys, usize::MAX, &mut packed)
                .unwrap();
            s.commit(w).unwrap();
            let r = s.begin_read().unwrap();
            // ...and from committed data.
            r.scan_into("kv:t", b"", None, false, 100, usize::MAX, &mut packed)
                .unwrap();
            r.get_many_into("kv:t", &keys, usize::MAX, &mut packed)
                .unwrap();
            seen.push(vec![(packed.0, vec![])]);
            seen.push(r.scan_in("kv:t", b"", None, true, 100).unwrap());
            assert!(matches!(
                r.scan_within("kv:t", b"", None, false, 100, 10),
                Err(StorageError::TooLarge(_))
            ));
            seen
        };
        assert_eq!(run(&redb), run(&pg));
    }

    /// A get-many reads through the primary key even when the statistics
    /// say a keyspace is empty that has grown since: taken while `kv:b`
    /// held nothing, with 20,000 rows in it by now (and no autovacuum to
    /// refresh them), PostgreSQL's own plan for it read the whole keyspace
    /// through `ks` and filtered it on the keys (in 6 or 7 of 7 runs).
    /// (The ranges' sorts seen in a bench's log did not show in this case:
    /// a range's plan here is the key's with or without the setting.)
    #[test]
    fn a_get_many_goes_through_the_key_whatever_the_statistics_say() {
        let Some(url) = url() else { return };
        let store = super::PgStore::open(&url, &schema(), 4, TIMEOUT).unwrap();
        let lent = store.take().unwrap();
        let c = lent.conn();
        let t = &store.table;
        super::block_on(c.client.batch_execute(&format!(
            "ALTER TABLE {t} SET (autovacuum_enabled = false); \
             INSERT INTO {t} SELECT 'kv:a', convert_to('a' || g, 'UTF8'), '\\x00' \
               FROM generate_series(1, 100) g; \
             ANALYZE {t}; \
             INSERT INTO {t} SELECT 'kv:b', convert_to('ix/i/w' || g, 'UTF8'), '\\x00' \
               FROM generate_series(1, 20000) g"
        )))
        .unwrap();
        let rows = |sql: &str| -> Vec<String> {
            super::block_on(c.client.simple_query(sql))
                .unwrap()
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .collect()
        };
        // The connection's own prepared statements, found by their text.
        let plan = |text: &str, args: &str| -> String {
            let name = rows(&format!(
                "SELECT name FROM pg_prepared_statements WHERE statement LIKE '%{text}%'"
            ));
            assert_eq!(name.len(), 1, "one statement {text}: {name:?}");
            rows(&format!("EXPLAIN EXECUTE {}({args})", name[0])).join("\n")
        };
        let keys: Vec<String> = (0..34)
            .map(|i| format!("convert_to('ix/df/t{i}', 'UTF8')"))
            .collect();
        let keys = format!("'kv:b', ARRAY[{}]", keys.join(", "));
        // The same statement many times over: PostgreSQL may switch plans
        // after the first five.
        for _ in 0..7 {
            let get_many = plan("SELECT k, v FROM%k = ANY", &keys);
            let cond = get_many
                .lines()
                .find(|l| l.contains("Index Cond"))
                .unwrap_or_default();
            assert!(
                cond.contains("k = ANY") && !get_many.contains("Filter"),
                "{get_many}"
            );
        }
    }

    #[test]
    fn hosts_racing_on_one_key_lose_no_update() {
        let Some(url) = url() else { return };
        let schema = schema();
        let hosts: Vec<Arc<Storage>> = (0..3).map(|_| Arc::new(open(&url, &schema))).collect();
        let threads: Vec<_> = (0..12)
            .map(|i| {
                let s = hosts[i % 3].clone();
                std::thread::spawn(move || {
                    for _ in 0..10 {
                        s.write(|w| {
                            let n = w
                                .get_in("kv:t", b"counter")?
                                .map_or(0, |v| u64::from_be_bytes(v.try_into().unwrap()));
                            w.put_in("kv:t", b"counter", &(n + 1).to_be_bytes())
                        })
                        .expect("retried until it won")
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let v = hosts[0]
            .begin_read()
            .unwrap()
            .get_in("kv:t", b"counter")
            .unwrap()
            .unwrap();
        assert_eq!(u64::from_be_bytes(v.try_into().unwrap()), 120);
    }

    /// A request running again (`alone`) while a batch with a member is
    /// open, waiting for it: on a shared store the open batch is committed
    /// first and the request commits on its own (two commits); the
    /// embedded store has no races and ignores it (one commit).
    fn runs_alone(s: Storage) -> (bool, u64) {
        let s = Arc::new(s);
        let (first, again) = (s.enter(), s.enter().alone(true));
        let member = {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = s.begin_write_for(first).unwrap();
                w.put_in("kv:t", b"first", b"1").unwrap();
                s.commit(w)
            })
        };
        // The first request is in the open batch, which waits for `again`.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while s.gc.open_members() != (1, true) {
            assert!(std::time::Instant::now() < until, "the first never joined");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let w = s.begin_write_for(again).unwrap();
        // The first's batch was committed before `again` got a transaction
        // (the member thread may not have woken yet: count the commit).
        let first_done = s.commits() == 1;
        w.put_in("kv:t", b"again", b"2").unwrap();
        s.commit(w).unwrap();
        member.join().unwrap().unwrap();
        let r = s.begin_read().unwrap();
        assert_eq!(
            r.get_in("kv:t", b"first").unwrap().as_deref(),
            Some(&b"1"[..])
        );
        assert_eq!(
            r.get_in("kv:t", b"again").unwrap().as_deref(),
            Some(&b"2"[..])
        );
        assert_eq!(s.commits(), 2);
        (first_done, s.syncs())
    }

    /// A batch whose writes not sent yet pass [`PENDING_BATCH_BYTES`] is
    /// committed at once, though another request it would wait for (up to
    /// a minute) is under way; its writes go out as several statements
    /// (`STATEMENT_BYTES` each) and read back whole, with a delete of a row
    /// an earlier batch put.
    #[test]
    fn a_batch_past_its_byte_bound_commits_without_waiting_and_reads_back_whole() {
        let Some(url) = url() else { return };
        let slow = Settings {
            window: std::time::Duration::from_secs(60),
            ..Settings::default()
        };
        let s = Arc::new(Storage::open_pg(&url, &schema(), 8, TIMEOUT, slow).unwrap());
        let value = |i: usize| vec![i as u8; 1 << 20];
        let rows = super::PENDING_BATCH_BYTES / (1 << 20) + 1;
        // One request puts rows of a mebibyte until the batch is past its
        // bound, and deletes one put by an earlier request.
        s.write(|w| w.put_in("kv:t", b"gone", b"x"))
            .unwrap()
            .unwrap();
        let (big, waiting) = (s.enter(), s.enter());
        let writer = {
            let s = s.clone();
            std::thread::spawn(move || {
                let w = s.begin_write_for(big).unwrap();
                for i in 0..rows {
                    w.put_in("kv:t", format!("row{i:03}").as_bytes(), &value(i))?;
                }
                w.delete_in("kv:t", b"gone")?;
                s.commit(w)
            })
        };
        // `waiting` is counted as under way and never begins until the
        // big batch is committed.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while s.commits() < 2 {
            assert!(
                std::time::Instant::now() < until,
                "the batch past its bound waited for the request under way"
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        writer.join().unwrap().unwrap();
        let w = s.begin_write_for(waiting).unwrap();
        w.put_in("kv:t", b"later", b"1").unwrap();
        s.commit(w).unwrap();
        let r = s.begin_read().unwrap();
        for i in 0..rows {
            let got = r.get_in("kv:t", format!("row{i:03}").as_bytes()).unwrap();
            assert!(got == Some(value(i)), "row {i}");
        }
        assert_eq!(r.get_in("kv:t", b"gone").unwrap(), None);
        assert_eq!(
            r.get_in("kv:t", b"later").unwrap().as_deref(),
            Some(&b"1"[..])
        );
    }

    #[test]
    fn a_request_running_again_takes_a_batch_of_its_own() {
        let Some(url) = url() else { return };
        // Batches wait (up to a minute) for the requests counted as under way.
        let slow = Settings {
            window: std::time::Duration::from_secs(60),
            ..Settings::default()
        };
        let pg = Storage::open_pg(&url, &schema(), 8, TIMEOUT, slow).unwrap();
        assert_eq!(runs_alone(pg), (true, 2));
        let dir = tempfile::tempdir().unwrap();
        let redb = Storage::open(&dir.path().join("db.redb"), slow).unwrap();
        assert_eq!(runs_alone(redb), (false, 1));
    }

    /// Host B holds a batch open (a request under way) whose snapshot was
    /// taken before host A commits a row. A refusal B's next write would
    /// make from that snapshot ("not known") is not given: it runs again
    /// in a batch begun after it, which sees A's row. (Without the run
    /// again, `write` answered `Err("not known")`.)
    #[test]
    fn a_refusal_from_a_batch_older_than_the_request_runs_again_alone() {
        let Some(url) = url() else { return };
        let schema = schema();
        let slow = Settings {
            window: std::time::Duration::from_secs(60),
            ..Settings::default()
        };
        let a = open(&url, &schema);
        let b = Storage::open_pg(&url, &schema, 8, TIMEOUT, slow).unwrap();
        // B's batch takes its snapshot, and stays open, with no member,
        // for the request still under way (`keep`).
        let (first, keep) = (b.enter(), b.enter());
        let w = b.begin_write_for(first).unwrap();
        assert_eq!(w.get_in("kv:t", b"k").unwrap(), None);
        drop(w);
        a.write(|w| w.put_in("kv:t", b"k", b"1")).unwrap().unwrap();
        // A write joining that batch reads from before A's commit.
        let joined = b.begin_write_for(b.enter()).unwrap();
        assert!(joined.begun_before(std::time::Instant::now()));
        assert_eq!(joined.get_in("kv:t", b"k").unwrap(), None);
        drop(joined);
        // A refusal made without reading anything is given as it is.
        let mut runs = 0;
        let refused = b
            .write(|_| {
                runs += 1;
                Err::<(), _>("refused")
            })
            .unwrap();
        assert_eq!((refused, runs), (Err("refused"), 1));
        let stale_before = crate::metrics::metrics().stale_refusals.get();
        let mut runs = 0;
        let seen = b
            .write(|w| {
                runs += 1;
                w.get_in("kv:t", b"k")?
                    .ok_or_else(|| StorageError::Internal("not known".into()))
            })
            .unwrap();
        assert_eq!(seen.unwrap(), b"1".to_vec());
        assert_eq!(runs, 2, "refused from the old batch, then run alone");
        assert!(crate::metrics::metrics().stale_refusals.get() > stale_before);
        // A lone run's batch begins after it.
        let asked = std::time::Instant::now();
        let lone = b.begin_write_for(b.enter().alone(true)).unwrap();
        assert!(!lone.begun_before(asked));
        drop(lone);
        drop(keep);
    }

    #[test]
    fn a_lost_race_is_a_conflict_and_keeps_nothing() {
        let Some(url) = url() else { return };
        let schema = schema();
        let (a, b) = (open(&url, &schema), open(&url, &schema));
        let wa = a.begin_write().unwrap();
        let wb = b.begin_write().unwrap();
        assert_eq!(wa.get_in("kv:t", b"k").unwrap(), None);
        assert_eq!(wb.get_in("kv:t", b"k").unwrap(), None);
        wa.put_in("kv:t", b"k", b"a").unwrap();
        wb.put_in("kv:t", b"k", b"b").unwrap();
        wb.put_in("kv:t", b"other", b"b").unwrap();
        a.commit(wa).unwrap();
        assert!(matches!(b.commit(wb), Err(StorageError::Conflict)));
        let r = b.begin_read().unwrap();
        assert_eq!(r.get_in("kv:t", b"k").unwrap().as_deref(), Some(&b"a"[..]));
        assert_eq!(r.get_in("kv:t", b"other").unwrap(), None);
        drop(r);
        // The store is usable after the lost race.
        let w = b.begin_write().unwrap();
        w.put_in("kv:t", b"other", b"b").unwrap();
        b.commit(w).unwrap();
    }
}
