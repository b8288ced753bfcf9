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

/// How long a caller waits for a free connection before failing.
const POOL_WAIT: Duration = Duration::from_secs(10);

/// Run `f` to completion on this thread, parking between polls. The
/// driver's futures only talk to the connection task through channels, so
/// no runtime is needed here.
pub fn block_on<F: Future>(f: F) -> F::Output {
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
            return v;
        }
        std::thread::park();
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
        _ => StorageError::Internal(format!("postgres: {e}")),
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

/// The shared store: a pool of connections to one schema.
pub struct PgStore {
    rt: tokio::runtime::Runtime,
    url: String,
    table: String,
    schema: String,
    idle: Mutex<Pool>,
    freed: Condvar,
    max: usize,
}

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
    pub fn open(url: &str, schema: &str, max_connections: usize) -> anyhow::Result<Arc<PgStore>> {
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
        });
        let (client, _) = store.connect_raw()?;
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
                    tracing::debug!("making the store's table: {e}; again");
                    std::thread::sleep(Duration::from_millis(50 * tries));
                }
                Err(e) => return Err(anyhow::anyhow!("making {}: {e}", store.table)),
            }
        }
        Ok(store)
    }

    /// The schema's name (health, logs).
    pub fn schema(&self) -> &str {
        &self.schema
    }

    fn connect_raw(&self) -> Result<(Client, ()), StorageError> {
        let url = self.url.clone();
        let task = self.rt.spawn(async move {
            let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::warn!("store connection ended: {e}");
                }
            });
            Ok::<_, tokio_postgres::Error>(client)
        });
        let client = block_on(task)
            .map_err(|e| StorageError::Internal(format!("postgres connect: {e}")))?
            .map_err(|e| StorageError::Internal(format!("postgres connect: {e}")))?;
        Ok((client, ()))
    }

    fn connect(&self) -> Result<Conn, StorageError> {
        let started = std::time::Instant::now();
        let (client, ()) = self.connect_raw()?;
        let _log = Logged(started);
        let t = &self.table;
        let prep = |sql: String| block_on(client.prepare(&sql)).map_err(pg_err);
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
            let (next, timeout) = self
                .freed
                .wait_timeout(pool, POOL_WAIT)
                .unwrap_or_else(|p| p.into_inner());
            pool = next;
            if timeout.timed_out() && pool.conns.is_empty() && pool.open >= self.max {
                return Err(StorageError::Internal(format!(
                    "no store connection free within {}s ({} open)",
                    POOL_WAIT.as_secs(),
                    pool.open
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
            begin: std::cell::Cell::new(None),
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

    /// Whether the store answers.
    pub fn healthy(self: &Arc<Self>) -> bool {
        self.take()
            .and_then(|l| {
                block_on(l.conn().client.simple_query("SELECT 1"))
                    .map(|_| ())
                    .map_err(pg_err)
            })
            .is_ok()
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
    /// A `BEGIN ..` not sent yet: it goes out with the first query, in one
    /// round trip.
    begin: std::cell::Cell<Option<&'static str>>,
}

impl Drop for Lent {
    fn drop(&mut self) {
        let mut conn = self.conn.take();
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
                    && block_on(c.client.batch_execute("ROLLBACK")).is_err() =>
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
    fn conn(&self) -> &Conn {
        self.conn.as_ref().expect("lent until dropped")
    }

    fn begin(&mut self, sql: &str) -> Result<(), StorageError> {
        block_on(self.conn().client.batch_execute(sql)).map_err(pg_err)?;
        self.in_txn = true;
        Ok(())
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
            None => block_on(query).map_err(|e| self.failed(e)),
            Some(begin) => {
                let (began, result) = block_on(futures_util::future::join(
                    self.conn().client.batch_execute(begin),
                    query,
                ));
                began.map_err(|e| self.failed(e))?;
                result.map_err(|e| self.failed(e))
            }
        }
    }

    /// A statement of the transaction failed: it is aborted.
    fn failed(&self, e: tokio_postgres::Error) -> StorageError {
        self.aborted.set(true);
        pg_err(e)
    }

    /// Whether a statement failed (the transaction is aborted).
    pub fn is_aborted(&self) -> bool {
        self.aborted.get()
    }

    /// Commit the transaction: a conflict is [`StorageError::Conflict`].
    pub fn commit(mut self) -> Result<(), StorageError> {
        if self.aborted.get() {
            // Nothing of it can be kept (PostgreSQL would roll it back and
            // say so only in the command tag): its requests run again.
            return Err(StorageError::Conflict);
        }
        let result = block_on(self.conn().client.batch_execute("COMMIT")).map_err(pg_err);
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

    /// Write a request's overlay into the batch transaction: one statement
    /// per table and kind, all sent at once (one round trip).
    pub fn apply(&self, overlay: Overlay) -> Result<(), StorageError> {
        let c = self.conn();
        let mut statements = vec![];
        for (table, writes) in &overlay {
            let (mut keys, mut values, mut gone) = (vec![], vec![], vec![]);
            for (k, v) in writes {
                match v {
                    Some(v) => {
                        keys.push(k.as_slice());
                        values.push(v.as_slice());
                    }
                    None => gone.push(k.as_slice()),
                }
            }
            if !keys.is_empty() {
                statements.push((&c.st.upsert, table, keys, values));
            }
            if !gone.is_empty() {
                statements.push((&c.st.delete, table, gone, vec![]));
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
        let row = block_on(self.stream.next())?;
        Some(
            row.map(|r| (r.get(0), r.get(1)))
                .map_err(|e| self.lent.failed(e)),
        )
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
mod tests {
    use crate::store::group_commit::Settings;
    use crate::store::{Kv, Packed, Storage, StorageError};
    use std::sync::Arc;

    /// The throwaway cluster of `cargo xtask test`, or None (skipped, unless
    /// MARKETPLACE_REQUIRE_PG=1).
    fn url() -> Option<String> {
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

    fn schema() -> String {
        let mut b = [0u8; 6];
        crate::ids::fill_random(&mut b);
        format!("unit_{}", marketplace_common::hex::encode(&b))
    }

    fn open(url: &str, schema: &str) -> Storage {
        Storage::open_pg(url, schema, 8, Settings::default()).unwrap()
    }

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
