//! redb storage: one table per family keyspace plus the host's own tables.
//!
//! Every request runs in exactly one transaction: a read transaction for
//! GET/HEAD (a snapshot of committed data; never blocks writers) or a
//! [`WriteTxn`] for mutations. A write transaction keeps its writes in an
//! overlay on top of the shared batch transaction (see
//! [`crate::store::group_commit`]); they reach the batch only when the whole
//! request succeeded, so a failed request leaves nothing behind.

pub mod disk;
mod errors;
mod file;
pub mod group_commit;
mod key_filter;
mod kv;
pub mod pg;
mod read;
pub mod wal;
mod write;

pub use errors::{
    ALONE_FROM_RUN, CONFLICT, CONFLICT_BUDGET, CONFLICT_RETRIES, HeldElsewhere, RunAgain,
    StorageError, log_failure, run_again_on_conflict,
};
use errors::{UNAVAILABLE, internal};
use kv::{Budget, Packed};
pub use kv::{Kv, RowSink, ValueSink};
use read::OpenTables;
use read::{bounds, merge};
pub use write::WriteTxn;
use write::apply;

use self::group_commit::{GroupCommit, Lease, Pending, RedbBatch};
use anyhow::{Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError, TableHandle};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::Path;
use std::sync::Arc;

/// Largest key a plugin may write.
pub const MAX_KEY_BYTES: usize = 4 * 1024;
/// Largest key on a shared store: a PostgreSQL btree entry (keyspace and
/// key) must stay under 2704 bytes.
pub const MAX_SHARED_KEY_BYTES: usize = 2 * 1024;
/// Most keys of one `get-many` call, and the largest value one write may
/// hold (shared with the plugins).
pub use marketplace_common::{MAX_GET_MANY, MAX_VALUE_BYTES};

/// How commits are grouped (see [`group_commit`]), and how much of the
/// database is kept in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Off: every mutating request commits durably on its own.
    pub enabled: bool,
    /// Longest a member waits for its batch to be committed by a later
    /// member before it commits the batch itself.
    pub window: std::time::Duration,
    /// Most requests in one batch.
    pub max_batch: u64,
    /// redb's page cache, in bytes (the embedded store's reads, and its
    /// writes not yet flushed).
    pub cache_bytes: usize,
}

impl Settings {
    /// How `config` groups commits.
    pub fn of(config: &crate::config::Config) -> Settings {
        Settings {
            enabled: config.group_commit,
            window: std::time::Duration::from_micros(config.commit_window_us),
            max_batch: config.commit_max_batch,
            cache_bytes: usize::try_from(config.store_cache_mib << 20).unwrap_or(usize::MAX),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            window: std::time::Duration::from_millis(2),
            max_batch: 32,
            // redb's own default.
            cache_bytes: 1 << 30,
        }
    }
}

/// The host's table of its own settings and marks (upgrades done, the
/// write-ahead log's position, the shared store's keys).
pub const META_TABLE: &str = "host:meta";

/// The host's own tables (ledger, signatures), created at open.
pub const HOST_TABLES: &[&str] = &[
    "cash:outputs",
    "cash:totals",
    "cash:mint-keys",
    "cash:replays",
    "cash:replays-by-time",
    "auth:used",
    "auth:used-by-time",
    "auth:fresh-used",
    "escrow:accounts",
    "escrow:issued",
    META_TABLE,
    "cash:upstream-journal",
    "cash:upstream-fees",
    "host:uploads",
    "host:upload-blobs",
];

/// Key of a by-time index entry: the time (u64 BE, in milliseconds for the
/// by-time indexes, in seconds for `auth:fresh-used`), then the record's
/// key, so a range scan up to a time finds every record older than it.
pub fn time_key(ms: u64, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    k.extend_from_slice(&ms.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// Table of one family keyspace, `kv:{family}`: made at every storage
/// call of a component, so kept on the stack for the usual short names.
fn keyspace_table(family: &str) -> KeyspaceTable {
    let mut inline = [0u8; KeyspaceTable::INLINE];
    let len = 3 + family.len();
    if len > inline.len() {
        return KeyspaceTable::Heap(["kv:", family].concat());
    }
    inline[..3].copy_from_slice(b"kv:");
    inline[3..len].copy_from_slice(family.as_bytes());
    KeyspaceTable::Inline(inline, len as u8)
}

/// The name [`keyspace_table`] makes, read as a `&str`.
enum KeyspaceTable {
    Inline([u8; KeyspaceTable::INLINE], u8),
    Heap(String),
}

impl KeyspaceTable {
    const INLINE: usize = 64;
}

impl std::ops::Deref for KeyspaceTable {
    type Target = str;

    fn deref(&self) -> &str {
        match self {
            // Copied from a `str` and an ASCII prefix: always UTF-8.
            KeyspaceTable::Inline(bytes, len) => {
                std::str::from_utf8(&bytes[..*len as usize]).unwrap_or_default()
            }
            KeyspaceTable::Heap(name) => name,
        }
    }
}

fn def(name: &str) -> TableDefinition<'_, &'static [u8], &'static [u8]> {
    TableDefinition::new(name)
}

/// Write one row of a batch into a table of the embedded store: its new
/// value, or `None` to remove the key (a batch applied by the applier
/// thread or replayed from the write-ahead log at open).
fn put_row(
    table: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), redb::StorageError> {
    match value {
        Some(v) => drop(table.insert(key, v)?),
        None => drop(table.remove(key)?),
    }
    Ok(())
}

/// Most bytes of rows [`write_sorted`] puts through one insert cursor.
const RUN_BYTES: usize = 64 << 10;

/// Write one table's rows of an apply ([`group_commit`]): given in
/// ascending key order, each key once, a value or `None` to remove it.
///
/// Two or more new keys that fall into the same gap between two stored
/// keys go in through one of redb's insert cursors, which packs them with
/// the leaf they land in into full pages. Inserted one by one instead, a
/// run of ascending keys in the middle of a table (the records, index
/// documents and postings of the posts of an apply: most of their rows)
/// splits its leaf evenly again and again, and every leaf it passes stays
/// half empty, which no later insert fills. A key already stored, a new
/// one alone in its gap (a full leaf split evenly suits keys that land at
/// random places) and keys past the table's last (redb packs an append at
/// the end itself, more cheaply) go in with `insert`; a removal with
/// `remove`.
fn write_sorted(
    table: &mut redb::Table<'_, &'static [u8], &'static [u8]>,
    rows: &[(&[u8], Option<&[u8]>)],
) -> Result<(), redb::Error> {
    let mut i = 0;
    while let Some(&(key, value)) = rows.get(i) {
        let Some(value) = value else {
            table.remove(key)?;
            i += 1;
            continue;
        };
        let mut cursor = table.lower_bound_mut(std::ops::Bound::Included(key))?;
        // The stored key after the gap `key` falls into.
        let next = cursor.peek_next()?.map(|(k, _)| k.value().to_vec());
        // The new keys from here on that fall into that gap.
        let run = rows[i..]
            .iter()
            .take_while(|(k, v)| v.is_some() && next.as_deref().is_none_or(|next| *k < next))
            .count();
        if run < 2 || next.is_none() {
            // (A cursor would pack a lone key's full leaf and branch and
            // start nearly empty ones beside them.)
            cursor.close()?;
            table.insert(key, value)?;
            i += 1;
            continue;
        }
        // At most RUN_BYTES a cursor: redb buffers a run until the cursor
        // closes, and a buffer of a megabyte (the records of a thousand
        // posts applied after a checkpoint) is fresh memory each time. The
        // next cursor packs on from the leaf this one ended in.
        let mut bytes = 0;
        for &(key, value) in &rows[i..i + run] {
            let value = value.unwrap_or_default();
            cursor.insert_before(key, value)?;
            i += 1;
            bytes += key.len() + value.len();
            if bytes >= RUN_BYTES {
                break;
            }
        }
        cursor.close()?;
    }
    Ok(())
}

/// Where the data lives: the embedded redb file (one host) or a shared
/// PostgreSQL-protocol database (many hosts).
#[derive(Clone)]
pub enum Backend {
    Redb(Arc<Database>),
    Pg(Arc<pg::PgStore>),
}

/// The database plus its commit coordinator.
pub struct Storage {
    backend: Backend,
    gc: Arc<GroupCommit>,
    /// Most bytes of writes one write transaction may hold.
    write_budget: usize,
    /// [`Storage::commits`] when the host's own start-up writes were done
    /// ([`Storage::opened`]).
    commits_at_open: std::sync::atomic::AtomicU64,
    /// The embedded store's disk reserve ([`Storage::guard_disk`]).
    disk: Option<Arc<disk::Guard>>,
}

/// Default of [`Storage::set_write_budget`].
pub const DEFAULT_WRITE_BUDGET: usize = 64 << 20;

/// Key/value pairs returned by a scan.
pub type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// One request's transaction.
#[allow(
    clippy::large_enum_variant,
    reason = "one per request, never moved in a hot loop"
)]
pub enum Txn {
    Read(ReadTxn),
    Write(WriteTxn),
}

/// A snapshot of committed data.
pub enum ReadTxn {
    /// What is in the database and what is durable in its write-ahead log
    /// but not applied to it yet.
    Redb(RedbBatch),
    Pg(pg::PgRead),
}

impl Storage {
    /// Open (or create) the database and make sure every table exists;
    /// apply what its write-ahead log holds beyond it (batches made durable
    /// there before a crash), then start the log again.
    pub fn open(path: &Path, commit: Settings) -> Result<Storage> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = file::DatabaseFile::open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        let db = match redb::Builder::new()
            .set_cache_size(commit.cache_bytes)
            .create_with_backend(file)
        {
            Err(redb::DatabaseError::DatabaseAlreadyOpen) => {
                return Err(HeldElsewhere(path.to_path_buf()).into());
            }
            db => db.with_context(|| format!("opening {}", path.display()))?,
        };
        let mut txn = db.begin_write()?;
        for table in HOST_TABLES {
            txn.open_table(def(table)).with_context(|| {
                format!("opening table {table} (a database of an older version?)")
            })?;
        }
        let wal_path = wal::path_for(path);
        let (id, mut applied) = {
            let meta = txn.open_table(def(META_TABLE))?;
            let got = meta.get(wal::META_KEY)?;
            got.and_then(|v| wal::decode_meta(v.value()))
                .unwrap_or_else(|| {
                    let mut id = [0; 8];
                    crate::ids::fill_random(&mut id);
                    (u64::from_le_bytes(id), 0)
                })
        };
        let (records, damaged) = wal::recover(&wal_path, id, applied)?;
        let replayed = records.len();
        for (seq, writes) in records {
            for (table, key, value) in writes {
                put_row(&mut txn.open_table(def(&table))?, &key, value.as_deref())?;
            }
            applied = seq;
        }
        wal::record_applied(&txn, id, applied)?;
        txn.set_quick_repair(true);
        txn.commit()?;
        // Only now that what could be applied is durably in the database.
        wal::alert_kept_earlier(&wal_path);
        wal::keep_aside(&damaged, applied);
        if replayed > 0 {
            tracing::info!(
                records = replayed,
                log = %wal_path.display(),
                "applied the write-ahead log's batches that were not in the database yet"
            );
        }
        let wal = wal::Wal::create(&wal_path, id, applied)?;
        Ok(Self::on(Backend::Redb(Arc::new(db)), commit, Some(wal)))
    }

    /// Open a shared PostgreSQL-protocol store (`url`), its data in
    /// `schema`, with at most `connections` connections.
    pub fn open_pg(
        url: &str,
        schema: &str,
        connections: usize,
        timeout: std::time::Duration,
        commit: Settings,
    ) -> Result<Storage> {
        let store = pg::PgStore::open(url, schema, connections, timeout)?;
        Ok(Self::on(Backend::Pg(store), commit, None))
    }

    fn on(backend: Backend, commit: Settings, wal: Option<wal::Wal>) -> Storage {
        Storage {
            gc: GroupCommit::new(backend.clone(), commit, wal),
            backend,
            write_budget: DEFAULT_WRITE_BUDGET,
            commits_at_open: Default::default(),
            disk: None,
        }
    }

    /// `redb` or `postgres`.
    pub fn backend_name(&self) -> &'static str {
        match self.backend {
            Backend::Redb(_) => "redb",
            Backend::Pg(_) => "postgres",
        }
    }

    /// Whether many hosts may share this store.
    pub fn is_shared(&self) -> bool {
        matches!(self.backend, Backend::Pg(_))
    }

    /// Most bytes (keys plus values) of writes one transaction may hold
    /// before it commits; a write past it is refused with `TooLarge`.
    pub fn set_write_budget(&mut self, bytes: usize) {
        self.write_budget = bytes;
    }

    /// Keep `reserve` bytes free on the filesystem of `dir` (the data
    /// dir, on the embedded store): see [`disk`]. 0: no reserve.
    pub fn guard_disk(&mut self, dir: &Path, reserve: u64) {
        if !self.is_shared() {
            self.disk = disk::Guard::watch(dir, reserve);
        }
    }

    /// The free bytes and the reserve, while fewer than the reserve are
    /// free: writing requests are to be refused (503 `disk_full`).
    pub fn disk_low(&self) -> Option<(u64, u64)> {
        self.disk.as_ref()?.low()
    }

    /// Free bytes beyond the reserve on the data dir's disk (`None`: no
    /// reserve kept): what may still be written outside the requests (an
    /// online backup's copy of the database).
    pub fn disk_room(&self) -> Option<u64> {
        Some(self.disk.as_ref()?.room())
    }

    /// Begin a request transaction.
    pub fn begin(&self, write: bool) -> Result<Txn, StorageError> {
        if write {
            self.begin_write().map(Txn::Write)
        } else {
            self.begin_read().map(Txn::Read)
        }
    }

    /// A snapshot of committed data.
    pub fn begin_read(&self) -> Result<ReadTxn, StorageError> {
        match &self.backend {
            Backend::Redb(db) => self.gc.view(db).map(ReadTxn::Redb),
            Backend::Pg(store) => Ok(ReadTxn::Pg(store.begin_read())),
        }
    }

    /// Count a mutating request as under way from its start, so that open
    /// batches wait for it (see [`crate::store::group_commit`]).
    pub fn enter(&self) -> Pending {
        self.gc.enter()
    }

    /// Begin a write transaction: waits for the batch. The host's own
    /// writers (cash replace, mint) use this too.
    pub fn begin_write(&self) -> Result<WriteTxn, StorageError> {
        self.begin_write_for(self.enter())
    }

    /// Begin the write transaction of a request counted by `pending`.
    pub fn begin_write_for(&self, pending: Pending) -> Result<WriteTxn, StorageError> {
        let lease = self.gc.acquire(pending).map_err(internal)?;
        Ok(self.write_txn(lease))
    }

    /// [`Storage::begin_write_for`] for a task on the async workers (the
    /// embedded store only): waits for the batch without holding a thread.
    pub async fn begin_write_async(&self, pending: Pending) -> Result<WriteTxn, StorageError> {
        let lease = self.gc.acquire_async(pending).await.map_err(internal)?;
        Ok(self.write_txn(lease))
    }

    fn write_txn(&self, lease: Lease) -> WriteTxn {
        WriteTxn {
            lease: Some(lease),
            overlay: RefCell::new(BTreeMap::new()),
            held: std::cell::Cell::new(0),
            budget: self.write_budget,
            gc: self.gc.clone(),
            conflict: std::cell::Cell::new(false),
            read: std::cell::Cell::new(false),
        }
    }

    /// Commit a write transaction; returns once its writes are durable.
    pub fn commit(&self, w: WriteTxn) -> Result<(), StorageError> {
        let lease = self.apply_to_batch(w)?;
        self.gc.release(lease, true).map_err(commit_error)
    }

    /// [`Storage::commit`] for a task on the async workers: the wait for
    /// the batch to be durable holds no thread.
    pub async fn commit_async(&self, w: WriteTxn) -> Result<(), StorageError> {
        let lease = self.apply_to_batch(w)?;
        self.gc
            .release_async(lease, true)
            .await
            .map_err(commit_error)
    }

    /// [`Storage::commit`], or with `task` (a call on the async workers)
    /// [`Storage::commit_async`].
    pub async fn commit_as(&self, w: WriteTxn, task: bool) -> Result<(), StorageError> {
        if task {
            // Boxed: the wait is large, and held by value it would grow
            // every request's future (reads too) by its size.
            Box::pin(self.commit_async(w)).await
        } else {
            self.commit(w)
        }
    }

    /// Put a write transaction's writes into its batch; its lease, to hand
    /// on.
    fn apply_to_batch(&self, mut w: WriteTxn) -> Result<Lease, StorageError> {
        // Refused before its writes join the batch: dropped, the
        // transaction hands the batch on without them.
        if let Some(disk) = &self.disk
            && !disk.charge(w.held.get() as u64)
        {
            return Err(StorageError::DiskFull);
        }
        let lease = w.lease.take().expect("live until committed or dropped");
        if w.conflict.get() {
            self.gc.poison(lease, true);
            return Err(StorageError::Conflict);
        }
        if lease.txn().is_aborted() {
            // A statement of this request failed (and it answered 2xx all
            // the same): nothing of the batch can be kept; its other
            // members run again.
            self.gc.poison(lease, true);
            return Err(StorageError::Internal(
                "a storage call of this request failed".into(),
            ));
        }
        let overlay = std::mem::take(&mut *w.overlay.borrow_mut());
        let mut lease = lease;
        if let Err(e) = apply(&mut lease, overlay) {
            // The batch may hold part of this request: abandon all of it.
            self.gc.poison(lease, matches!(e, StorageError::Conflict));
            return Err(e);
        }
        Ok(lease)
    }

    /// Run `f` in a write transaction of the host's own, and commit it when
    /// `f` answers `Ok`; when the transaction lost a race on a shared store,
    /// run `f` again on a new one (a few times). `Err` of `f` leaves
    /// nothing. The outer error is the store's.
    pub fn write<T, E>(
        &self,
        mut f: impl FnMut(&WriteTxn) -> Result<T, E>,
    ) -> Result<Result<T, E>, StorageError> {
        // The store's own errors other than a lost race end it at once.
        let once = |alone: bool| -> Result<Result<Result<T, E>, StorageError>, RunAgain> {
            let started = std::time::Instant::now();
            let txn = match self.begin_write_for(self.enter().alone(alone)) {
                Ok(t) => t,
                Err(e) => return Ok(Err(e)),
            };
            let result = f(&txn);
            if txn.conflicted() {
                return Err(RunAgain::LostRace);
            }
            match result {
                Ok(v) => match self.commit(txn) {
                    Ok(()) => Ok(Ok(Ok(v))),
                    Err(StorageError::Conflict) => Err(RunAgain::LostRace),
                    Err(e) => Ok(Err(e)),
                },
                // A refusal (an input not known, say) from a snapshot
                // older than this call is not given (see `RunAgain::Stale`).
                Err(_) if txn.may_be_stale(started) => {
                    tracing::debug!(
                        "a host write refused from a batch begun before it: run again in a batch of its own"
                    );
                    Err(RunAgain::Stale)
                }
                Err(e) => Ok(Ok(Err(e))),
            }
        };
        run_again_on_conflict(once).unwrap_or(Err(StorageError::Conflict))
    }

    /// Successful write transactions since start.
    pub fn commits(&self) -> u64 {
        self.gc.counters().0
    }

    /// The host's own start-up writes (key checks, settings records, an
    /// upgrade) are done: what commits from now on is requests' (and the
    /// retention sweeps'), which [`Storage::request_commits`] counts.
    pub fn opened(&self) {
        self.commits_at_open
            .store(self.commits(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Write transactions committed since [`Storage::opened`]: health's
    /// `commits`, "committed mutating requests" (PROTOCOL 8).
    pub fn request_commits(&self) -> u64 {
        let at_open = self
            .commits_at_open
            .load(std::sync::atomic::Ordering::Relaxed);
        self.commits().saturating_sub(at_open)
    }

    /// Durable commits (fsyncs) since start.
    pub fn syncs(&self) -> u64 {
        self.gc.counters().1
    }

    /// Copy every table, as of one read transaction (one instant of
    /// committed state), into a new database at `path`; returns how many
    /// tables were copied. Writers are not held up.
    pub fn snapshot_into(&self, path: &Path) -> Result<usize> {
        /// The copy's cache.
        const COPY_CACHE: usize = 16 << 20;
        let db = match &self.backend {
            Backend::Redb(db) => db,
            Backend::Pg(_) => anyhow::bail!(
                "a shared store is backed up by its database (pg_dump, or the cluster's own backups), not by a host"
            ),
        };
        // Every batch answered before now, in the database.
        self.gc.wait_applied();
        let read = db.begin_read()?;
        // The copy's cache small: the pages of a write transaction stay in
        // memory up to the cache's size, so the copy under redb's default
        // 1 GiB cache held the whole database in memory until its commit
        // (a backup of a 285 MB database raised the server's RSS by
        // 222 MB). (Committing in chunks saved nothing more; compacting the
        // copy made its file larger.)
        let out = redb::Builder::new()
            .set_cache_size(COPY_CACHE)
            .create(path)
            .with_context(|| format!("creating {}", path.display()))?;
        let w = out.begin_write()?;
        let mut tables = 0;
        for handle in read.list_tables()? {
            let name = handle.name().to_string();
            let src = read.open_table(def(&name))?;
            let mut dst = w.open_table(def(&name))?;
            for row in src.iter()? {
                let (k, v) = row?;
                // The copy is a database of its own: not this one's log.
                if name == META_TABLE && k.value() == wal::META_KEY {
                    continue;
                }
                dst.insert(k.value(), v.value())?;
            }
            tables += 1;
        }
        w.commit()?;
        Ok(tables)
    }

    /// Make everything answered so far durable in the database file itself
    /// (the embedded store's checkpoint; see [`wal`]): done at a clean stop.
    pub fn flush(&self) {
        if let Backend::Redb(_) = self.backend {
            self.gc.flush();
        }
    }

    /// Round trips to a shared store that failed because it could not be
    /// reached, since start (0 on the embedded store): see
    /// [`pg::PgStore::outages`].
    pub fn outages(&self) -> u64 {
        match &self.backend {
            Backend::Redb(_) => 0,
            Backend::Pg(store) => store.outages(),
        }
    }

    /// Whether a shared store failed for want of the database a moment ago
    /// (never on the embedded store): see
    /// [`pg::PgStore::unavailable_lately`].
    pub fn unavailable_lately(&self) -> bool {
        match &self.backend {
            Backend::Redb(_) => false,
            Backend::Pg(store) => store.unavailable_lately(),
        }
    }

    /// Whether the store serves: a read transaction can be opened, and on
    /// the embedded store the database still takes committed batches.
    pub fn healthy(&self) -> bool {
        match &self.backend {
            // Reads alone are not health: a database that cannot take
            // committed batches any more refuses every write until a
            // restart, so the load balancer is told (503 degraded).
            Backend::Redb(db) => !self.gc.failing() && db.begin_read().is_ok(),
            Backend::Pg(store) => store.healthy(),
        }
    }
}

fn commit_error(e: group_commit::CommitError) -> StorageError {
    if e.retry {
        StorageError::Conflict
    } else {
        internal(e)
    }
}

/// Writes of one request: table -> key -> value, or None for a delete.
type Overlay = BTreeMap<String, BTreeMap<Vec<u8>, Option<Vec<u8>>>>;

impl Txn {
    /// Read a key of a keyspace.
    pub fn get(&self, family: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.get_in(&keyspace_table(family), key)
    }

    /// Read several keys of a keyspace, at most `max_bytes` of values.
    pub fn get_many(
        &self,
        family: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
    ) -> Result<Vec<Option<Vec<u8>>>, StorageError> {
        self.get_many_within(&keyspace_table(family), keys, max_bytes)
    }

    /// [`Txn::get_many`] in the packed form a plugin reads ([`Packed`]).
    pub fn get_many_packed(
        &self,
        family: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
    ) -> Result<Vec<u8>, StorageError> {
        let mut out = Packed::default();
        self.get_many_into(&keyspace_table(family), keys, max_bytes, &mut out)?;
        Ok(out.0)
    }

    /// Write a key of a keyspace.
    pub fn put(&mut self, family: &str, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        match self {
            Txn::Write(t) => t.put_in(&keyspace_table(family), key, value),
            Txn::Read(_) => Err(StorageError::ReadOnly),
        }
    }

    /// [`Txn::put`] of a key and value the caller hands over.
    pub fn put_owned(
        &mut self,
        family: &str,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<(), StorageError> {
        match self {
            Txn::Write(t) => t.put_owned(&keyspace_table(family), key, value),
            Txn::Read(_) => Err(StorageError::ReadOnly),
        }
    }

    /// Delete a key of a keyspace; true when it existed.
    pub fn delete(&mut self, family: &str, key: &[u8]) -> Result<bool, StorageError> {
        match self {
            Txn::Write(t) => t.delete_in(&keyspace_table(family), key),
            Txn::Read(_) => Err(StorageError::ReadOnly),
        }
    }

    /// Ordered scan of a keyspace.
    pub fn scan(
        &self,
        family: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Rows, StorageError> {
        self.scan_in(&keyspace_table(family), start, end, reverse, limit)
    }

    /// Ordered scan of a keyspace, at most `max_bytes` of keys and values.
    pub fn scan_bounded(
        &self,
        family: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Rows, StorageError> {
        self.scan_within(
            &keyspace_table(family),
            start,
            end,
            reverse,
            limit,
            max_bytes,
        )
    }

    /// [`Txn::scan_bounded`] in the packed form a plugin reads ([`Packed`]).
    pub fn scan_packed(
        &self,
        family: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
    ) -> Result<Vec<u8>, StorageError> {
        let mut out = Packed::default();
        let table = keyspace_table(family);
        self.scan_into(&table, start, end, reverse, limit, max_bytes, &mut out)?;
        Ok(out.0)
    }
}

/// A storage on a temporary directory, for unit tests.
#[cfg(test)]
pub(crate) fn temp_storage() -> (tempfile::TempDir, Storage) {
    let dir = tempfile::tempdir().unwrap();
    let s = Storage::open(&dir.path().join("db.redb"), Settings::default()).unwrap();
    (dir, s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_setting_reaches_redb_in_bytes() {
        let mut config = crate::config::Config::default();
        assert_eq!(Settings::of(&config).cache_bytes, 1 << 30);
        config.store_cache_mib = 64;
        assert_eq!(Settings::of(&config).cache_bytes, 64 << 20);
    }

    #[test]
    fn a_lost_race_is_logged_at_debug_and_other_failures_at_error() {
        let lines = crate::logging::Captured::default();
        let sink = lines.clone();
        let dispatch: tracing::Dispatch = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish()
            .into();
        tracing::dispatcher::with_default(&dispatch, || {
            log_failure("escrow", &StorageError::Conflict);
            // As the ledger passes it on: text.
            log_failure("payment check", &StorageError::Conflict.to_string());
            log_failure("escrow", &StorageError::Internal("disk full".into()));
        });
        let text = lines.text();
        let levels: Vec<&str> = text
            .lines()
            .map(|l| l.split_whitespace().nth(1).unwrap_or_default())
            .collect();
        assert_eq!(levels, ["DEBUG", "DEBUG", "ERROR"], "{text}");
        assert!(text.contains("escrow: storage: disk full"), "{text}");
    }

    #[test]
    fn keyspace_tables_are_named_as_ever() {
        for family in [
            "timeline",
            "",
            "ünïcode-family",
            &"f".repeat(KeyspaceTable::INLINE - 3),
            &"g".repeat(KeyspaceTable::INLINE - 2),
            &"h".repeat(300),
        ] {
            assert_eq!(&*keyspace_table(family), format!("kv:{family}"));
        }
    }

    fn open() -> (tempfile::TempDir, Storage) {
        temp_storage()
    }

    fn put(s: &Storage, key: &[u8], value: &[u8]) {
        let mut w = s.begin(true).unwrap();
        w.put("a", key, value).unwrap();
        let Txn::Write(w) = w else { unreachable!() };
        s.commit(w).unwrap();
    }

    fn read(s: &Storage, key: &[u8]) -> Option<Vec<u8>> {
        s.begin(false).unwrap().get("a", key).unwrap()
    }

    /// A view opens each table once and keeps it: every read of it,
    /// point, many or scan, still sees that view's own snapshot, and past
    /// the tables a view keeps open the others are read all the same.
    #[test]
    fn each_view_reads_its_own_snapshot_of_the_tables_it_keeps_open() {
        let (_d, s) = open();
        let tables: Vec<String> = (0..OpenTables::MAX + 8).map(|i| format!("t{i}")).collect();
        let before = s.begin_read().unwrap();
        for t in &tables {
            assert_eq!(before.get_in(t, b"k").unwrap(), None, "{t}");
        }
        let Txn::Write(w) = s.begin(true).unwrap() else {
            unreachable!()
        };
        for t in &tables {
            w.put_in(t, b"k", t.as_bytes()).unwrap();
        }
        s.commit(w).unwrap();
        // In the database itself, not only in the log's layers.
        s.gc.wait_applied();
        let after = s.begin_read().unwrap();
        let keys = [b"k".to_vec(), b"missing".to_vec()];
        for t in &tables {
            for _ in 0..2 {
                assert_eq!(before.get_in(t, b"k").unwrap(), None, "{t}");
                assert!(before.scan_in(t, b"", None, false, 10).unwrap().is_empty());
                let mine = Some(t.as_bytes().to_vec());
                assert_eq!(after.get_in(t, b"k").unwrap(), mine, "{t}");
                assert_eq!(
                    after.get_many_in(t, &keys).unwrap(),
                    vec![mine.clone(), None]
                );
                let rows = after.scan_in(t, b"", None, false, 10).unwrap();
                assert_eq!(rows.len(), 1, "{t}");
            }
        }
    }

    /// The log's position the database keeps: the log's id and the last
    /// record of it the database holds.
    fn log_position(s: &Storage) -> (u64, u64) {
        s.begin(false)
            .unwrap()
            .get_in(META_TABLE, wal::META_KEY)
            .unwrap()
            .as_deref()
            .and_then(wal::decode_meta)
            .expect("the log's position")
    }

    /// The write-ahead log of the store `s` opened in `dir`: its id and
    /// base path (for [`wal::recover`]).
    fn log_of(s: &Storage, dir: &std::path::Path) -> (u64, std::path::PathBuf) {
        (log_position(s).0, wal::path_for(&dir.join("db.redb")))
    }

    /// A copy of the data dir `dir` as a crash now would leave it (the
    /// database as of its last durable commit, and the log's segments;
    /// nothing but files), opened: the log is applied.
    fn crash_copy(dir: &std::path::Path) -> (tempfile::TempDir, Storage) {
        let crashed = tempfile::tempdir().unwrap();
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, crashed.path().join(path.file_name().unwrap())).unwrap();
            }
        }
        let copy = Storage::open(&crashed.path().join("db.redb"), Default::default()).unwrap();
        (crashed, copy)
    }

    /// A copy of the database file of `dir` alone (no log), opened.
    fn file_alone(dir: &std::path::Path) -> (tempfile::TempDir, Storage) {
        let alone = tempfile::tempdir().unwrap();
        std::fs::copy(dir.join("db.redb"), alone.path().join("db.redb")).unwrap();
        let copy = Storage::open(&alone.path().join("db.redb"), Default::default()).unwrap();
        (alone, copy)
    }

    /// Flush; if that takes over 20 s, stop the test binary (a scope
    /// cannot end while the flush hangs, so a panic would hang too).
    fn flush_within(s: &Storage, why: &str) {
        std::thread::scope(|scope| {
            let flushing = scope.spawn(|| s.flush());
            let asked = std::time::Instant::now();
            while !flushing.is_finished() {
                if asked.elapsed() > std::time::Duration::from_secs(20) {
                    eprintln!("{why}");
                    std::process::abort();
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
    }

    #[test]
    fn batches_in_the_log_are_read_and_survive_a_crash() {
        let (dir, s) = open();
        put(&s, b"k1", b"applied");
        // The database takes no batch now (as while a checkpoint runs):
        // what commits is durable in the write-ahead log only.
        s.gc.hold_apply(true);
        put(&s, b"k2", b"logged");
        put(&s, b"k1", b"overwritten");
        assert_eq!(read(&s, b"k2").as_deref(), Some(&b"logged"[..]));
        assert_eq!(read(&s, b"k1").as_deref(), Some(&b"overwritten"[..]));
        let (id, base) = log_of(&s, dir.path());
        assert!(
            wal::recover(&base, id, 0).unwrap().0.len() >= 2,
            "both in the log"
        );
        // A crash now: copy what is on disk (the database as of its last
        // durable commit, and the log), and open the copy.
        let (crashed, copy) = crash_copy(dir.path());
        assert_eq!(read(&copy, b"k2").as_deref(), Some(&b"logged"[..]));
        assert_eq!(read(&copy, b"k1").as_deref(), Some(&b"overwritten"[..]));
        // Recovered, the copy goes on writing and reopens with everything.
        put(&copy, b"k3", b"after");
        drop(copy);
        let copy = Storage::open(&crashed.path().join("db.redb"), Default::default()).unwrap();
        assert_eq!(read(&copy, b"k3").as_deref(), Some(&b"after"[..]));
        assert_eq!(read(&copy, b"k2").as_deref(), Some(&b"logged"[..]));
        s.gc.hold_apply(false);
        // A flush (as at a clean stop) puts it all in the database file:
        // a copy of that file alone holds it.
        s.flush();
        assert!(wal::recover(&base, id, 0).unwrap().0.is_empty(), "flushed");
        let (_alone, copy) = file_alone(dir.path());
        assert_eq!(read(&copy, b"k1").as_deref(), Some(&b"overwritten"[..]));
        assert_eq!(read(&copy, b"k2").as_deref(), Some(&b"logged"[..]));
        drop(copy);
        drop(s);
        // A clean stop checkpoints: the log holds nothing, and the original
        // reopens with everything in the database.
        assert!(
            wal::recover(&base, id, 0).unwrap().0.is_empty(),
            "log empty"
        );
        let s = Storage::open(&dir.path().join("db.redb"), Default::default()).unwrap();
        assert_eq!(read(&s, b"k1").as_deref(), Some(&b"overwritten"[..]));
    }

    #[test]
    fn batches_held_back_go_into_the_database_in_pieces() {
        let (_dir, s) = open();
        // As while a checkpoint runs: 150 batches (one request each) wait.
        s.gc.hold_apply(true);
        let before = s.gc.applies();
        for i in 0..150u32 {
            put(&s, format!("k{i:03}").as_bytes(), &i.to_le_bytes());
        }
        s.gc.hold_apply(false);
        s.gc.wait_applied();
        // At most 64 batches an apply: three at least, each leaving the
        // list (and the batches closing meanwhile) as soon as it is in.
        let applies = s.gc.applies() - before;
        assert!((3..=150).contains(&applies), "{applies} applies");
        assert_eq!(s.gc.sealed_len(), 0);
        for i in [0u32, 63, 64, 127, 128, 149] {
            assert_eq!(
                read(&s, format!("k{i:03}").as_bytes()).as_deref(),
                Some(&i.to_le_bytes()[..])
            );
        }
    }

    #[test]
    fn a_checkpoint_waits_for_the_batches_logged_before_it_and_writes_go_on() {
        let (dir, s) = open();
        // The applier takes no batch: a checkpoint asked for now must not
        // make the database durable (and drop the log) without them.
        s.gc.hold_apply(true);
        put(&s, b"k1", b"logged");
        let (id, base) = log_of(&s, dir.path());
        let logged = |key: &[u8]| {
            wal::recover(&base, id, 0)
                .unwrap()
                .0
                .iter()
                .any(|(_, writes)| writes.iter().any(|(_, k, _)| k == key))
        };
        std::thread::scope(|scope| {
            let flushing = scope.spawn(|| s.flush());
            let asked = std::time::Instant::now();
            while !s.gc.checkpoint_pending() {
                assert!(
                    asked.elapsed() < std::time::Duration::from_secs(20),
                    "the flush asked for no checkpoint"
                );
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            // Writes are logged and answered meanwhile (into the segment
            // after the checkpoint's).
            put(&s, b"k2", b"while the checkpoint waits");
            assert_eq!(read(&s, b"k1").as_deref(), Some(&b"logged"[..]));
            std::thread::sleep(std::time::Duration::from_millis(200));
            assert!(
                !flushing.is_finished() && s.gc.checkpoint_pending(),
                "checkpointed without the batches logged before it"
            );
            assert!(logged(b"k1"), "the log dropped a batch not in the database");
            assert!(logged(b"k2"));
            s.gc.hold_apply(false);
            flushing.join().unwrap();
        });
        assert!(!logged(b"k1"), "checkpointed, its segment goes");
        // The database file alone holds what was logged before the flush.
        let (_alone, copy) = file_alone(dir.path());
        assert_eq!(read(&copy, b"k1").as_deref(), Some(&b"logged"[..]));
        drop(copy);
        // And nothing is lost on a clean stop.
        drop(s);
        let s = Storage::open(&dir.path().join("db.redb"), Default::default()).unwrap();
        assert_eq!(
            read(&s, b"k2").as_deref(),
            Some(&b"while the checkpoint waits"[..])
        );
    }

    #[test]
    fn a_new_log_segment_that_cannot_start_is_retried_later_and_a_flush_ends() {
        let (dir, s) = open();
        // Batches stay out of the database: only the log holds them.
        s.gc.hold_apply(true);
        // Nothing is logged yet: the current segment starts with the next
        // record (the one after those the database holds), and every
        // segment to come starts after it.
        let (id, base) = log_of(&s, dir.path());
        let next = log_position(&s).1 + 1;
        // Directories where those segments go (a segment is named by its
        // first record): starting one fails, as on a full disk, whoever
        // runs the test.
        let blockers: Vec<_> = (next + 1..next + 17)
            .map(|seq| wal::segment_path(&base, seq))
            .collect();
        for b in &blockers {
            std::fs::create_dir(b).unwrap();
        }
        put(&s, b"k1", b"logged");
        // A flush whose checkpoint cannot begin ends, given up.
        flush_within(&s, "a flush waited for a segment that cannot start");
        let failed = s.gc.rotations_failed();
        let since = std::time::Instant::now();
        assert!(failed >= 1, "no new segment was tried");
        // The committer does not try again at once, in a loop (a due
        // checkpoint comes every `CHECKPOINT_AFTER`; a retry only every
        // `ROTATE_RETRY`), and writes go on in the current segment.
        put(&s, b"k2", b"after the failure");
        std::thread::sleep(wal::CHECKPOINT_AFTER * 3);
        let allowed = 1 + (since.elapsed().as_millis() / wal::ROTATE_RETRY.as_millis()) as u64;
        assert!(
            s.gc.rotations_failed() - failed <= allowed,
            "retried at once"
        );
        assert_eq!(read(&s, b"k1").as_deref(), Some(&b"logged"[..]));
        // A crash now: the log still holds both (the blockers are no files
        // of the store's).
        let (_crashed, copy) = crash_copy(dir.path());
        assert_eq!(read(&copy, b"k1").as_deref(), Some(&b"logged"[..]));
        assert_eq!(
            read(&copy, b"k2").as_deref(),
            Some(&b"after the failure"[..])
        );
        drop(copy);
        // Once the segment can start, a flush checkpoints (after the retry
        // delay): the log empties and the database file alone holds both.
        for b in &blockers {
            std::fs::remove_dir(b).unwrap();
        }
        s.gc.hold_apply(false);
        flush_within(&s, "the flush after the disk came back did not end");
        assert!(wal::recover(&base, id, 0).unwrap().0.is_empty(), "flushed");
        let (_alone, copy) = file_alone(dir.path());
        assert_eq!(read(&copy, b"k1").as_deref(), Some(&b"logged"[..]));
        assert_eq!(
            read(&copy, b"k2").as_deref(),
            Some(&b"after the failure"[..])
        );
    }

    #[test]
    fn writes_are_visible_only_after_commit() {
        let (_d, s) = open();
        let mut w = s.begin(true).unwrap();
        w.put("a", b"k", b"v").unwrap();
        assert_eq!(w.get("a", b"k").unwrap().as_deref(), Some(&b"v"[..]));
        let r = s.begin(false).unwrap();
        assert_eq!(r.get("a", b"k").unwrap(), None);
        drop(r);
        let Txn::Write(t) = w else { unreachable!() };
        s.commit(t).unwrap();
        assert_eq!(
            s.begin(false).unwrap().get("a", b"k").unwrap().as_deref(),
            Some(&b"v"[..])
        );
        assert_eq!(s.commits(), 1);
    }

    #[test]
    fn dropped_write_transaction_leaves_nothing() {
        let (_d, s) = open();
        let mut w = s.begin(true).unwrap();
        w.put("a", b"k", b"v").unwrap();
        drop(w);
        assert_eq!(s.begin(false).unwrap().get("a", b"k").unwrap(), None);
    }

    #[test]
    fn read_transactions_refuse_writes() {
        let (_d, s) = open();
        let mut r = s.begin(false).unwrap();
        assert!(matches!(
            r.put("a", b"k", b"v"),
            Err(StorageError::ReadOnly)
        ));
    }

    #[test]
    fn scan_is_ordered_bounded_and_reversible() {
        let (_d, s) = open();
        let mut w = s.begin(true).unwrap();
        for k in ["p/1", "p/2", "p/3", "q/1"] {
            w.put("b", k.as_bytes(), b"x").unwrap();
        }
        let keys = |v: Vec<(Vec<u8>, Vec<u8>)>| {
            v.into_iter()
                .map(|(k, _)| String::from_utf8(k).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(w.scan("b", b"p/", Some(b"p0"), false, 10).unwrap()),
            ["p/1", "p/2", "p/3"]
        );
        assert_eq!(
            keys(w.scan("b", b"p/", Some(b"p0"), true, 2).unwrap()),
            ["p/3", "p/2"]
        );
        assert_eq!(keys(w.scan("b", b"p/", None, false, 10).unwrap()).len(), 4);
        assert!(w.scan("b", b"q", Some(b"p"), false, 10).unwrap().is_empty());
    }

    #[test]
    fn oversized_values_are_refused() {
        let (_d, s) = open();
        let mut w = s.begin(true).unwrap();
        let big = vec![0u8; MAX_VALUE_BYTES + 1];
        assert!(matches!(
            w.put("a", b"k", &big),
            Err(StorageError::TooLarge(_))
        ));
    }

    #[test]
    fn a_key_longer_than_a_row_may_have_is_never_written() {
        let (_d, mut s) = open();
        s.set_write_budget(3 * MAX_KEY_BYTES);
        let mut w = s.begin(true).unwrap();
        let long = vec![b'k'; MAX_KEY_BYTES + 1];
        assert!(matches!(
            w.put("a", &long, b"v"),
            Err(StorageError::TooLarge(_))
        ));
        // Its delete names no row: false, and nothing of it is written
        // (ten of them would pass this request's budget if they were).
        for _ in 0..10 {
            assert!(!w.delete("a", &long).unwrap());
        }
        w.put("a", &vec![b'k'; MAX_KEY_BYTES], &[7u8; MAX_KEY_BYTES])
            .unwrap();
    }

    #[test]
    fn calls_and_pending_writes_stay_within_their_byte_budgets() {
        let (_d, mut s) = open();
        s.set_write_budget(10_000);
        let mut w = s.begin(true).unwrap();
        let value = vec![7u8; 4_000];
        w.put("a", b"k1", &value).unwrap();
        // Rewriting a key replaces its bytes rather than adding to them.
        for _ in 0..10 {
            w.put("a", b"k2", &value).unwrap();
        }
        assert!(matches!(
            w.put("a", b"k3", &value),
            Err(StorageError::TooLarge(_))
        ));
        // A refused write leaves nothing: no new row, the old value kept.
        assert_eq!(w.get("a", b"k3").unwrap(), None);
        assert!(matches!(
            w.put("a", b"k1", &[7u8; 6_000]),
            Err(StorageError::TooLarge(_))
        ));
        assert_eq!(w.get("a", b"k1").unwrap(), Some(value.clone()));
        w.delete("a", b"k2").unwrap();
        w.put("a", b"k3", &value).unwrap();
        let Txn::Write(t) = w else { unreachable!() };
        s.commit(t).unwrap();
        let r = s.begin(false).unwrap();
        let keys = vec![b"k1".to_vec(); 10];
        assert_eq!(r.get_many("a", &keys, 40_000).unwrap().len(), 10);
        assert!(matches!(
            r.get_many("a", &keys, 39_999),
            Err(StorageError::TooLarge(_))
        ));
        assert_eq!(
            r.scan_bounded("a", b"", None, false, 10, 8_004)
                .unwrap()
                .len(),
            2
        );
        assert!(matches!(
            r.scan_bounded("a", b"", None, false, 10, 8_003),
            Err(StorageError::TooLarge(_))
        ));
        // The packed forms keep the same budgets.
        assert!(r.get_many_packed("a", &keys, 40_000).is_ok());
        assert!(matches!(
            r.get_many_packed("a", &keys, 39_999),
            Err(StorageError::TooLarge(_))
        ));
        assert!(r.scan_packed("a", b"", None, false, 10, 8_004).is_ok());
        assert!(matches!(
            r.scan_packed("a", b"", None, false, 10, 8_003),
            Err(StorageError::TooLarge(_))
        ));
    }

    /// The packed form, spelled out: a little-endian u32 length, then the
    /// bytes; `None` is the length `u32::MAX` alone.
    fn packed<'a>(items: impl IntoIterator<Item = Option<&'a [u8]>>) -> Vec<u8> {
        let mut out = vec![];
        for item in items {
            match item {
                Some(b) => {
                    out.extend((b.len() as u32).to_le_bytes());
                    out.extend(b);
                }
                None => out.extend([0xff; 4]),
            }
        }
        out
    }

    #[test]
    fn a_failed_request_between_two_good_ones_leaves_nothing() {
        let (_d, s) = open();
        for (key, ok) in [("k1", true), ("k2", false), ("k3", true)] {
            let mut w = s.begin(true).unwrap();
            w.put("a", key.as_bytes(), b"v").unwrap();
            w.delete("a", b"k1").unwrap();
            w.put("a", b"k1", b"again").unwrap();
            let Txn::Write(t) = w else { unreachable!() };
            if ok {
                s.commit(t).unwrap();
            }
        }
        let r = s.begin(false).unwrap();
        let keys: Vec<_> = r
            .scan("a", b"", None, false, 10)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(keys, [b"k1".to_vec(), b"k3".to_vec()]);
    }

    use proptest::prelude::*;

    #[derive(Debug, Clone)]
    enum Op {
        Put(u8, u8),
        Delete(u8),
        Commit,
        Abort,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..24, any::<u8>()).prop_map(|(k, v)| Op::Put(k, v)),
            2 => (0u8..24).prop_map(Op::Delete),
            1 => Just(Op::Commit),
            1 => Just(Op::Abort),
        ]
    }

    /// Apply a put or a delete to `w` and to the model `view`.
    fn put_or_delete(
        w: &mut Txn,
        view: &mut BTreeMap<Vec<u8>, Vec<u8>>,
        op: &Op,
    ) -> Result<(), TestCaseError> {
        match *op {
            Op::Put(k, v) => {
                // Values of 1 to 4 bytes: a packed form that mixed up the
                // lengths of keys and values would show.
                let value = vec![v; 1 + usize::from(v % 4)];
                w.put("a", &[k], &value).unwrap();
                view.insert(vec![k], value);
            }
            Op::Delete(k) => {
                let existed = w.delete("a", &[k]).unwrap();
                prop_assert_eq!(existed, view.remove(&vec![k]).is_some());
            }
            Op::Commit | Op::Abort => unreachable!("not a write"),
        }
        Ok(())
    }

    /// `w` reads (get, get-many, scans both ways over [lo, hi) with
    /// `limit`) exactly like the model `view`.
    fn reads_like(
        w: &Txn,
        view: &BTreeMap<Vec<u8>, Vec<u8>>,
        lo: u8,
        hi: u8,
        limit: usize,
    ) -> Result<(), TestCaseError> {
        let keys: Vec<Vec<u8>> = (0u8..24).map(|k| vec![k]).collect();
        for k in &keys {
            prop_assert_eq!(w.get("a", k).unwrap(), view.get(k).cloned());
        }
        let many = w.get_many("a", &keys, usize::MAX).unwrap();
        let want: Vec<_> = keys.iter().map(|k| view.get(k).cloned()).collect();
        prop_assert_eq!(many, want);
        let want = packed(keys.iter().map(|k| view.get(k).map(Vec::as_slice)));
        prop_assert_eq!(w.get_many_packed("a", &keys, usize::MAX).unwrap(), want);
        let (start, end) = (vec![lo], vec![hi]);
        for rev in [false, true] {
            let expect: Vec<(Vec<u8>, Vec<u8>)> = if hi <= lo {
                vec![]
            } else {
                let r = view.range(start.clone()..end.clone());
                let r = r.map(|(k, v)| (k.clone(), v.clone()));
                if rev {
                    r.rev().take(limit).collect()
                } else {
                    r.take(limit).collect()
                }
            };
            let want = packed(
                expect
                    .iter()
                    .flat_map(|(k, v)| [Some(&k[..]), Some(&v[..])]),
            );
            prop_assert_eq!(w.scan("a", &start, Some(&end), rev, limit).unwrap(), expect);
            let got = w.scan_packed("a", &start, Some(&end), rev, limit, usize::MAX);
            prop_assert_eq!(got.unwrap(), want);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// A write transaction reads and scans (both directions, any bounds
        /// and limit) exactly like a map holding the committed data plus its
        /// own writes; committed data equals the model of committed requests.
        #[test]
        fn overlay_reads_like_a_map(
            ops in proptest::collection::vec(op(), 1..60),
            lo in 0u8..24, hi in 0u8..26, limit in 1usize..30,
        ) {
            let (_d, s) = open();
            let mut committed = BTreeMap::<Vec<u8>, Vec<u8>>::new();
            let mut view = committed.clone();
            let mut w = s.begin(true).unwrap();
            for op in ops {
                match op {
                    Op::Put(..) | Op::Delete(..) => put_or_delete(&mut w, &mut view, &op)?,
                    Op::Commit | Op::Abort => {
                        let Txn::Write(t) = std::mem::replace(&mut w, s.begin(false).unwrap()) else {
                            unreachable!()
                        };
                        if matches!(op, Op::Commit) {
                            s.commit(t).unwrap();
                            committed = view.clone();
                        } else {
                            drop(t);
                            view = committed.clone();
                        }
                        w = s.begin(true).unwrap();
                    }
                }
                reads_like(&w, &view, lo, hi, limit)?;
            }
            drop(w);
            let r = s.begin(false).unwrap();
            let all: BTreeMap<_, _> = r.scan("a", b"", None, false, 1000).unwrap().into_iter().collect();
            prop_assert_eq!(all, committed);
        }

        /// The same while the disk stalls: committed requests' batches are
        /// closed but not on disk, and a later request reads through them
        /// (gets and scans, both directions, deletes hiding stored rows)
        /// exactly like the model, while readers still see only the disk.
        /// Once the disk is back, everything committed is there.
        #[test]
        fn reads_through_batches_not_yet_on_disk_like_a_map(
            ops in proptest::collection::vec(op(), 1..60),
            lo in 0u8..24, hi in 0u8..26, limit in 1usize..30,
        ) {
            let (_d, s) = open();
            let mut disk = BTreeMap::<Vec<u8>, Vec<u8>>::new();
            let mut first = s.begin(true).unwrap();
            for k in (0u8..24).step_by(3) {
                first.put("a", &[k], &[0]).unwrap();
                disk.insert(vec![k], vec![0]);
            }
            let Txn::Write(first) = first else { unreachable!() };
            s.commit(first).unwrap();
            let stalled = s.gc.stall_log();
            let mut committed = disk.clone();
            let mut view = committed.clone();
            std::thread::scope(|scope| -> Result<(), TestCaseError> {
                let mut members = Vec::new();
                let mut w = s.begin(true).unwrap();
                for op in ops {
                    match op {
                        Op::Put(..) | Op::Delete(..) => put_or_delete(&mut w, &mut view, &op)?,
                        Op::Commit | Op::Abort => {
                            let Txn::Write(t) = std::mem::replace(&mut w, s.begin(false).unwrap()) else {
                                unreachable!()
                            };
                            // At most three closed batches wait for the disk.
                            if matches!(op, Op::Commit) && members.len() < 3 {
                                // (The batch before the stall may still be on its
                                // way from the log to the database.)
                                s.gc.wait_applied();
                                let before = s.gc.sealed_len();
                                let s = &s;
                                members.push(scope.spawn(move || s.commit(t)));
                                while s.gc.sealed_len() == before {
                                    std::thread::yield_now();
                                }
                                committed = view.clone();
                            } else {
                                drop(t);
                                view = committed.clone();
                            }
                            w = s.begin(true).unwrap();
                        }
                    }
                    reads_like(&w, &view, lo, hi, limit)?;
                    let r = s.begin(false).unwrap();
                    let shown: BTreeMap<_, _> = r.scan("a", b"", None, false, 1000).unwrap().into_iter().collect();
                    prop_assert_eq!(&shown, &disk, "readers see only what is durable");
                    let rows = disk.iter().flat_map(|(k, v)| [Some(&k[..]), Some(&v[..])]);
                    let got = r.scan_packed("a", b"", None, false, 1000, usize::MAX).unwrap();
                    prop_assert_eq!(got, packed(rows), "a reader's packed scan");
                }
                drop(w);
                drop(stalled);
                for m in members {
                    prop_assert!(m.join().unwrap().is_ok());
                }
                Ok(())
            })?;
            let r = s.begin(false).unwrap();
            let all: BTreeMap<_, _> = r.scan("a", b"", None, false, 1000).unwrap().into_iter().collect();
            prop_assert_eq!(all, committed);
        }
    }

    /// Rows `write_sorted` is given: keys from a small space (so that rounds
    /// overwrite and remove what earlier ones wrote), values up to 1.5 kB
    /// (so that the table spans many leaves and runs split them).
    fn sorted_rows() -> impl proptest::strategy::Strategy<Value = BTreeMap<Vec<u8>, Option<Vec<u8>>>>
    {
        use proptest::prelude::*;
        proptest::collection::btree_map(
            (0u16..600).prop_map(|k| format!("k/{k:04}").into_bytes()),
            proptest::option::weighted(
                0.8,
                (0usize..1500, any::<u8>()).prop_map(|(n, b)| vec![b; n]),
            ),
            0..300,
        )
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Rounds of sorted rows (new keys in runs and alone, replaced
        /// keys, removals, values of every size) leave the table as a map
        /// given the same rows holds them, in order.
        #[test]
        fn sorted_writes_leave_the_table_as_a_map(rounds in proptest::collection::vec(sorted_rows(), 1..5)) {
            let dir = tempfile::tempdir().unwrap();
            let db = redb::Database::create(dir.path().join("db")).unwrap();
            let mut model = BTreeMap::new();
            for round in &rounds {
                let rows: Vec<(&[u8], Option<&[u8]>)> =
                    round.iter().map(|(k, v)| (k.as_slice(), v.as_deref())).collect();
                let txn = db.begin_write().unwrap();
                write_sorted(&mut txn.open_table(def("t")).unwrap(), &rows).unwrap();
                txn.commit().unwrap();
                for (k, v) in round {
                    match v {
                        Some(v) => model.insert(k.clone(), v.clone()),
                        None => model.remove(k),
                    };
                }
                let read = db.begin_read().unwrap();
                let t = read.open_table(def("t")).unwrap();
                let held: BTreeMap<Vec<u8>, Vec<u8>> = t
                    .range::<&[u8]>(..)
                    .unwrap()
                    .map(|r| {
                        let (k, v) = r.unwrap();
                        (k.value().to_vec(), v.value().to_vec())
                    })
                    .collect();
                proptest::prop_assert_eq!(&held, &model);
            }
        }
    }

    /// Posts' keys go in ascending in the middle of a table (between
    /// other keys): written a batch at a time through `write_sorted`, they
    /// fill their leaves; one by one, redb's even splits leave them half
    /// empty.
    #[test]
    fn an_ascending_run_in_the_middle_of_a_table_packs_its_leaves() {
        let leaves = |sorted: bool| {
            let dir = tempfile::tempdir().unwrap();
            let db = redb::Database::create(dir.path().join("db")).unwrap();
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(def("t")).unwrap();
                t.insert(&b"a"[..], &b"before"[..]).unwrap();
                t.insert(&b"z"[..], &b"after"[..]).unwrap();
            }
            txn.commit().unwrap();
            let value = [7u8; 200];
            for batch in 0..100u32 {
                let keys: Vec<Vec<u8>> = (0..20u32)
                    .map(|i| format!("post/{:08}", batch * 20 + i).into_bytes())
                    .collect();
                let rows: Vec<(&[u8], Option<&[u8]>)> = keys
                    .iter()
                    .map(|k| (k.as_slice(), Some(&value[..])))
                    .collect();
                let txn = db.begin_write().unwrap();
                {
                    let mut t = txn.open_table(def("t")).unwrap();
                    if sorted {
                        write_sorted(&mut t, &rows).unwrap();
                    } else {
                        for (k, v) in &rows {
                            t.insert(*k, v.unwrap()).unwrap();
                        }
                    }
                }
                txn.commit().unwrap();
            }
            let read = db.begin_read().unwrap();
            let t = read.open_table(def("t")).unwrap();
            assert_eq!(redb::ReadableTableMetadata::len(&t).unwrap(), 2002);
            redb::ReadableTableMetadata::stats(&t).unwrap().leaf_pages()
        };
        let (packed, one_by_one) = (leaves(true), leaves(false));
        // 2,000 rows of about 215 bytes: about 110 full 4 KiB leaves.
        assert!(
            packed * 10 < one_by_one * 7,
            "{packed} leaves written in runs against {one_by_one} one by one"
        );
    }
}
