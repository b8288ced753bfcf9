//! Group commit: concurrent mutating requests share one redb write
//! transaction and one durable commit.
//!
//! A request leases the open batch transaction, runs with its writes held
//! in its own overlay (see [`crate::store::WriteTxn`]), and on success
//! applies them to the batch before handing the lease on. A request that
//! fails hands the lease on untouched: it leaves no writes and spends
//! nothing, and its batch-mates are unaffected. Requests run one at a time
//! on the batch, in order, so a later one sees every earlier one's writes
//! (a double spend inside one batch is refused as ever).
//!
//! Mutating requests are counted from the moment they start (before their
//! plugin runs). The batch is committed durably when the request handing
//! the lease on sees no other request under way, or when the batch holds
//! `max_batch` requests; each member answers only once that commit is done.
//! With no concurrency every request is alone in its batch and commits at
//! once: no added latency. A member that waits `window` while its batch sits
//! idle (the requests under way are slow to reach storage) commits the
//! batch itself; and a request that fails and hands on a batch whose
//! first member is `window` old commits it, so requests that keep taking
//! the lease and failing (a flood of refused payments) cannot hold their
//! batch-mates' answers.
//!
//! Readers see a batch only once it is committed (durable), so no read
//! shows what is not durable, and a 2xx waits for its batch. A mutating
//! request that fails (a 4xx such as a secret already spent in a batch
//! still on its way to disk) answers at once: should that batch then fail,
//! the refusal named a state that was not kept, and the client may try
//! again.
//!
//! On the embedded store a batch is made durable by a committer thread of
//! its own, while the next batch already runs: a batch's writes are kept
//! in memory ([`RedbBatch`]) over a snapshot of the database, and each
//! batch reads through the batches closed before it that are not in the
//! database yet. The committer takes closed batches from that same ordered
//! list (there is no queue between them that could reorder them), appends
//! all those waiting to the write-ahead log as one record with one sync
//! (see [`super::wal`]) and answers their members; a batch that read one
//! that failed fails too (nothing of it is logged). An applier thread
//! applies the batches logged to redb, all those waiting in one
//! non-durable commit, and only then drops them from the list, so a sync
//! never waits for B-tree work and B-tree work never for a sync.
//! Readers read through the batches logged but not applied yet, so a
//! read after an answer sees it. While a checkpoint makes the database
//! durable (on the applier), batches go on being logged and answered
//! and wait in the list to be applied. So the requests of the next batch
//! do not wait for the previous batch's sync, a batch's durability costs
//! one sequential write of its own bytes, and applying a request's writes
//! is a copy in memory rather than B-tree work under the lease. A shared
//! store's batch stays one transaction, committed by the member that
//! closes it.

use super::key_filter::{KeyFilter, RowHash};
use super::wal::{self, Wal};
use super::{Backend, Overlay, Settings, StorageError, pg};
use redb::{Database, Durability, ReadTransaction, ReadableDatabase};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::thread::Thread;

/// Most closed batches waiting for the write-ahead log: the member closing
/// one more waits, still holding the lease, until the committer catches up.
const MAX_SEALED: usize = 4;
/// Most closed batches not yet in the database (made durable while a
/// checkpoint runs): bounds the memory they hold the same way.
const MAX_HELD: usize = 256;
/// Most batches one apply (one non-durable redb commit) takes. After a
/// checkpoint a few hundred wait; applied all in one go they stay in the
/// list (which new batches count against `MAX_HELD`) until the last of
/// them is in, 130 ms and more of the applier, while requests closing a
/// batch wait at `MAX_HELD`. In pieces, each piece leaves the list as soon
/// as it is in (seventy-second session: the server's p99 28.6 against 31.4 ms
/// on average over four alternating pairs of paid runs, p99.9 49.8
/// against 54.5 ms, no dearer a post). Under steady load an apply takes a
/// handful. A piece ends with a whole log record ([`piece_end`]).
const MAX_APPLY: usize = 64;

#[derive(Default)]
struct Slot {
    /// The open batch transaction, when no request holds it.
    txn: Option<BatchTxn>,
    /// Id of the newest batch (open, leased or committing).
    batch: u64,
    /// Successful requests applied to the newest batch.
    members: u64,
    /// When its first member was applied: a failing request that hands
    /// on a batch with members that old (`window`) commits it, even while
    /// other requests still hold or wait for the lease, so requests that
    /// keep failing (a stranger's flood) cannot keep a paid request's batch
    /// open. (Successful requests keep batching up to `max_batch`.)
    first_member: Option<std::time::Instant>,
    /// A request holds the batch transaction.
    leased: bool,
    /// Requests waiting for the lease, served first come first served.
    queue: VecDeque<Arc<Waiter>>,
    /// Mutating requests under way that have not handed on (or never took)
    /// the lease: while there are any, a batch stays open for them.
    pending: u64,
    /// How the newest batch ended, once it has.
    outcome: Arc<Outcome>,
    /// A shared store's batch commit is under way: the next batch begins
    /// after it (a batch begun earlier would read around the committing
    /// one and lose the race to it).
    committing: bool,
    /// Embedded store: closed batches not yet in the database, oldest
    /// first. The first `logged` of them have ended (made durable in the
    /// write-ahead log, or failed); the applier removes them once it has
    /// applied them to the database.
    sealed: VecDeque<Arc<Sealed>>,
    logged: usize,
    /// Batches removed from `sealed` since start (applied, or failed).
    applied: u64,
    /// A checkpoint was asked for and has not ended: the applier first
    /// applies the records before its segment, then makes the database
    /// durable (batches wait in `sealed` while it does).
    checkpointing: bool,
    /// Why batches can no longer be applied to the database, once that
    /// failed (every later batch fails; a restart applies the log).
    broken: Option<String>,
    /// The last append to the write-ahead log failed (a full disk, say):
    /// batches fail until one is logged again.
    log_failing: bool,
    /// Tests: batches are not applied to the database (as while a
    /// checkpoint runs).
    #[cfg(test)]
    hold_apply: bool,
    /// Tests: checkpoints only when flushed or stopping, not when due.
    #[cfg(test)]
    no_timed_checkpoints: bool,
    /// Tests: new log segments that could not be started.
    #[cfg(test)]
    rotations_failed: u64,
    /// `flush` waits for a checkpoint that begins after its call.
    flush_wanted: bool,
    /// Checkpoints begun, and the number of the last one ended (or, with
    /// nothing to checkpoint, skipped).
    checkpoints_begun: u64,
    checkpoints_done: u64,
    /// The committer has ended.
    committer_gone: bool,
    /// The applier's last checkpoint failed (the committer tries again
    /// when the next is due).
    checkpoint_failed: bool,
    /// The checkpoint asked for, as the first sequence number of the log
    /// segment it keeps (the older ones go once it is done): the applier
    /// runs it once every record before that is in the database.
    checkpoint_at: Option<u64>,
    /// The committer logs no more: the applier ends once nothing is left.
    logging_done: bool,
    /// The store is being dropped: the committer writes what is left in
    /// `sealed`, then ends.
    stopping: bool,
    /// Successful mutating requests and durable commits since start.
    commits: u64,
    syncs: u64,
}

/// The coordinator of one database's writers.
pub struct GroupCommit {
    settings: Settings,
    backend: Backend,
    shared: Arc<Shared>,
    /// Embedded store: the thread that writes closed batches to disk.
    committer: Option<std::thread::JoinHandle<()>>,
}

/// What the committer and applier threads share with the requests.
struct Shared {
    slot: Mutex<Slot>,
    /// Signalled when a batch ends.
    ended: Condvar,
    /// Signalled when a batch is closed (or the store is dropped, or a
    /// checkpoint ends): wakes the committer.
    sealed: Condvar,
    /// Signalled when batches are logged or a checkpoint is asked for:
    /// wakes the applier.
    logged: Condvar,
    /// Tests: the committer fails the next batch it writes.
    #[cfg(test)]
    fail_next: AtomicBool,
    /// Tests: held, the write-ahead log stalls like a slow disk.
    #[cfg(test)]
    log_gate: Mutex<()>,
    /// Tests: the applier's applies (redb commits) so far.
    #[cfg(test)]
    applies: std::sync::atomic::AtomicU64,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    #[cfg(test)]
    fn fails_next(&self) -> bool {
        self.fail_next.swap(false, Ordering::AcqRel)
    }

    #[cfg(not(test))]
    fn fails_next(&self) -> bool {
        false
    }
}

/// The open batch of the embedded store: the writes of its members so far,
/// over a snapshot of what was committed when it opened and the closed
/// batches that were not yet.
pub struct RedbBatch {
    pub(super) snapshot: ReadTransaction,
    /// Closed batches not on disk when this one opened, oldest first.
    pub(super) below: Vec<Arc<Sealed>>,
    pub(super) writes: Overlay,
    /// The snapshot's tables read so far.
    pub(super) opened: super::OpenTables,
}

impl RedbBatch {
    /// The newest write of `key` in this batch or the closed ones below:
    /// `Some(None)` for a delete, `None` when none of them wrote it.
    pub(super) fn written(&self, table: &str, key: &[u8]) -> Option<&Option<Vec<u8>>> {
        if let Some(v) = self.writes.get(table).and_then(|t| t.get(key)) {
            return Some(v);
        }
        if self.below.is_empty() {
            return None;
        }
        // One hash per read; the closed batches' filters rule out (almost)
        // every batch that never wrote the row.
        let row = RowHash::of(table, key);
        self.below
            .iter()
            .rev()
            .filter(|b| b.filter.may_hold(row))
            .find_map(|b| b.writes.get(table).and_then(|t| t.get(key)))
    }

    /// Every layer of writes, oldest first (the closed batches, then this).
    pub(super) fn layers(&self) -> impl Iterator<Item = &Overlay> {
        self.below
            .iter()
            .map(|b| &b.writes)
            .chain(std::iter::once(&self.writes))
    }
}

/// A closed batch of the embedded store, on its way to disk.
pub(super) struct Sealed {
    pub(super) writes: Overlay,
    /// The rows `writes` holds, for reads that look through this batch.
    filter: KeyFilter,
    batch: u64,
    members: u64,
    outcome: Arc<Outcome>,
    /// How the batches it read through ended: when one failed, so does it.
    below: Vec<Arc<Outcome>>,
    /// The sequence number of the write-ahead log record it is in, once
    /// logged (0 before).
    seq: std::sync::atomic::AtomicU64,
}

impl Sealed {
    fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
    }
}

/// A request waiting until the lease is handed to it: a parked thread,
/// or a task on the async workers.
struct Waiter {
    granted: AtomicBool,
    thread: Option<Thread>,
    task: Mutex<Option<Waker>>,
}

impl Waiter {
    fn new(thread: Option<Thread>) -> Arc<Waiter> {
        Arc::new(Waiter {
            granted: AtomicBool::new(false),
            thread,
            task: Mutex::new(None),
        })
    }

    /// Hand it the lease and wake it.
    fn grant(&self) {
        self.granted.store(true, Ordering::Release);
        match &self.thread {
            Some(thread) => thread.unpark(),
            None => {
                let task = self.task.lock().unwrap_or_else(|p| p.into_inner()).take();
                if let Some(waker) = task {
                    waker.wake();
                }
            }
        }
    }

    fn granted(&self) -> bool {
        self.granted.load(Ordering::Acquire)
    }
}

/// A task's place in the lease queue: dropped before it got the lease
/// (its request was cancelled), it leaves the queue, or hands the lease
/// on when it was granted meanwhile, so nobody waits for it.
struct Queued<'a> {
    gc: &'a GroupCommit,
    me: Option<Arc<Waiter>>,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        let Some(me) = self.me.take() else { return };
        let mut s = self.gc.lock();
        if me.granted() {
            GroupCommit::hand_on(&mut s);
        } else {
            s.queue.retain(|w| !Arc::ptr_eq(w, &me));
        }
    }
}

/// How handing the lease on left a request.
enum Released {
    /// Nothing more to wait for.
    Done(Result<(), CommitError>),
    /// Its writes are in batch `batch`: it answers once that batch ends.
    Member { batch: u64, outcome: Arc<Outcome> },
}

/// A mutating request under way, counted until it hands the lease on or
/// ends without taking it.
pub struct Pending {
    gc: Arc<GroupCommit>,
    counted: bool,
    /// Run again after a lost race: on a shared store its batch holds it
    /// alone (see [`Pending::alone`]).
    alone: bool,
}

impl Pending {
    /// With `alone` (a request running again after its batches lost races
    /// on a shared store), its batch holds only it: a batch open with other
    /// members is committed first, and its own is committed as soon as it
    /// hands the lease on. A lone request reads and writes a few rows, so
    /// another host's short writes rarely touch what it read (PostgreSQL's
    /// serializable checks track reads by index page), where a batch of
    /// dozens of requests reads so many pages that a steady stream of small
    /// writes elsewhere in the fleet could make it lose every time. The
    /// embedded store has no races and ignores it.
    pub fn alone(mut self, alone: bool) -> Pending {
        self.alone = alone;
        self
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if self.counted {
            self.gc.left();
        }
    }
}

/// The transaction of a batch.
#[allow(
    clippy::large_enum_variant,
    reason = "one per batch, moved only when the lease is handed on"
)]
pub enum BatchTxn {
    Redb(RedbBatch),
    Pg(pg::Lent),
}

impl BatchTxn {
    /// A shared store's transaction that a failed statement aborted:
    /// nothing of it can be kept.
    pub fn is_aborted(&self) -> bool {
        matches!(self, BatchTxn::Pg(lent) if lent.is_aborted())
    }

    /// A shared store's batch holding [`pg::PENDING_BATCH_BYTES`] of
    /// writes not sent yet: closed now, whatever its size in requests.
    fn full(&self) -> bool {
        matches!(self, BatchTxn::Pg(lent) if lent.pending_bytes() >= pg::PENDING_BATCH_BYTES)
    }

    /// A shared store's batch begun before `t`: its snapshot may miss a
    /// commit another host acknowledged before `t`. (The embedded store's
    /// batches begin after the previous one's commit, and no other process
    /// writes it: never.)
    pub fn begun_before(&self, t: std::time::Instant) -> bool {
        matches!(self, BatchTxn::Pg(lent) if lent.taken() < t)
    }
}

/// Apply batches made durable in the write-ahead log to the database,
/// oldest first, in one non-durable redb transaction (each table opened
/// once), with the sequence number of the last record they are in (see
/// [`super::wal`]). Each key is written once, with the last batch's write
/// of it ([`last_writes`]). With `cost`, what each table and the commit
/// took (for the debug log).
fn apply(
    db: &Database,
    group: &[Arc<Sealed>],
    log_id: u64,
    mut cost: Option<&mut ApplyCost>,
) -> anyhow::Result<()> {
    let mut txn = db.begin_write()?;
    let tables: std::collections::BTreeSet<&String> =
        group.iter().flat_map(|b| b.writes.keys()).collect();
    for table in tables {
        let started = cost.is_some().then(std::time::Instant::now);
        let mut t = txn.open_table(super::def(table))?;
        let rows = last_writes(group, table);
        let n = rows.len();
        super::write_sorted(&mut t, &rows)?;
        drop(t);
        if let (Some(cost), Some(started)) = (cost.as_deref_mut(), started) {
            cost.tables.push((table.clone(), n, started.elapsed()));
        }
    }
    let last = group.iter().map(|b| b.seq()).max().unwrap_or(0);
    wal::record_applied(&txn, log_id, last)?;
    txn.set_durability(Durability::None)?;
    let started = cost.is_some().then(std::time::Instant::now);
    txn.commit()?;
    if let (Some(cost), Some(started)) = (cost, started) {
        cost.commit = started.elapsed();
    }
    Ok(())
}

/// The rows of `table` the batches of `group` (oldest first) leave: each
/// key once, with the value (or removal) of the last batch that wrote it,
/// in key order. Batches of one request each often write the same keys (a
/// term's document count, the index's statistics, an author's count), and
/// each insert is a descent of redb's B-tree; in key order, each descent
/// finds the pages of the one before in the cache.
fn last_writes<'a>(group: &'a [Arc<Sealed>], table: &str) -> Vec<(&'a [u8], Option<&'a [u8]>)> {
    type Rows = BTreeMap<Vec<u8>, Option<Vec<u8>>>;
    let batches: Vec<&'a Rows> = group.iter().filter_map(|b| b.writes.get(table)).collect();
    let row = |(k, v): (&'a Vec<u8>, &'a Option<Vec<u8>>)| (k.as_slice(), v.as_deref());
    match batches[..] {
        // One batch wrote it: its rows already are each key once, in order.
        [rows] => rows.iter().map(row).collect(),
        _ => {
            let mut merged = BTreeMap::new();
            for (key, value) in batches.into_iter().flat_map(|rows| rows.iter().map(row)) {
                merged.insert(key, value);
            }
            merged.into_iter().collect()
        }
    }
}

/// What one apply took: per table its rows and the time to write them,
/// then redb's commit (which writes the pages they dirtied). Shown by the
/// applier's debug line, so that an operator (or a benchmark's kept log)
/// can see which tables a workload's writes cost.
struct ApplyCost {
    /// When the apply began.
    began: std::time::Instant,
    tables: Vec<(String, usize, std::time::Duration)>,
    commit: std::time::Duration,
}

impl ApplyCost {
    fn begin() -> ApplyCost {
        ApplyCost {
            began: std::time::Instant::now(),
            tables: Vec::new(),
            commit: std::time::Duration::ZERO,
        }
    }
}

impl std::fmt::Display for ApplyCost {
    /// `{table} {rows}/{µs}` for each table, space-separated.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, (table, rows, took)) in self.tables.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{table} {rows}/{}", took.as_micros())?;
        }
        Ok(())
    }
}

/// Make what the database holds durable (one durable commit, which writes
/// the pages the non-durable ones left in memory), then remove the log's
/// segments before `next`. Quick repair is on for it: after a crash,
/// redb reopens from this commit without walking the whole database.
/// `Err((true, _))` when the database's own commit failed: redb then
/// refuses every later write of the process (a full disk, say), so no batch
/// can reach it before a restart. `Err((false, _))`: the old log segments
/// could not be removed, to be tried again.
fn checkpoint(
    db: &Database,
    base: &std::path::Path,
    next: u64,
) -> Result<(), (bool, anyhow::Error)> {
    let database = |e: redb::Error| (true, anyhow::Error::from(e));
    let mut txn = db.begin_write().map_err(|e| database(e.into()))?;
    txn.set_quick_repair(true);
    txn.commit().map_err(|e| database(e.into()))?;
    wal::remove_before(base, next).map_err(|e| (false, e))
}

/// The closed batches a new batch reads through: all but those that failed.
fn live(sealed: &VecDeque<Arc<Sealed>>) -> Vec<Arc<Sealed>> {
    sealed
        .iter()
        .filter(|b| !b.outcome.failed())
        .cloned()
        .collect()
}

/// How one batch ended: its members read it when they wake. Its members
/// wait on its own condition variable (always with the slot lock), so a
/// batch that ends wakes its own members and no others.
#[derive(Default)]
struct Outcome {
    state: std::sync::atomic::AtomicU8,
    /// Signalled when the batch ends, and when it is left open with nobody
    /// on it (its members then time out after `window` and commit it).
    done: Condvar,
    /// Members waiting on the async workers, woken at the same moments.
    tasks: Mutex<Vec<Waker>>,
}

impl Outcome {
    const COMMITTED: u8 = 1;
    const FAILED: u8 = 2;
    /// Failed having kept nothing (a shared store's lost race): its
    /// requests may run again.
    const LOST_RACE: u8 = 3;

    /// Record how the batch ended (the slot locked) and wake its members.
    fn set(&self, v: u8) {
        self.state.store(v, Ordering::Release);
        self.wake();
    }

    /// Wake every member waiting (the slot locked).
    fn wake(&self) {
        self.done.notify_all();
        let tasks = std::mem::take(&mut *self.tasks.lock().unwrap_or_else(|p| p.into_inner()));
        for task in tasks {
            task.wake();
        }
    }

    fn committed(&self) -> bool {
        self.state.load(Ordering::Acquire) == Outcome::COMMITTED
    }

    fn failed(&self) -> bool {
        !matches!(self.state.load(Ordering::Acquire), 0 | Outcome::COMMITTED)
    }

    /// Wait (the slot locked) until woken.
    fn wait<'a>(&self, s: MutexGuard<'a, Slot>) -> MutexGuard<'a, Slot> {
        self.done.wait(s).unwrap_or_else(|p| p.into_inner())
    }

    fn failure(retry: bool) -> u8 {
        if retry {
            Outcome::LOST_RACE
        } else {
            Outcome::FAILED
        }
    }

    /// The answer of a member, once its batch has ended. (On a shared
    /// store a later batch may commit before an earlier one's commit
    /// returns: only the batch's own outcome tells.)
    fn result(&self) -> Option<Result<(), CommitError>> {
        match self.state.load(Ordering::Acquire) {
            0 => None,
            Outcome::COMMITTED => Some(Ok(())),
            v => Some(Err(CommitError {
                message: "the batch could not be committed".into(),
                retry: v == Outcome::LOST_RACE,
            })),
        }
    }
}

/// A request's hold on the batch transaction.
pub struct Lease {
    txn: BatchTxn,
    batch: u64,
    outcome: Arc<Outcome>,
    /// The batch holds only this request ([`Pending::alone`]).
    alone: bool,
}

impl Lease {
    pub fn txn(&self) -> &BatchTxn {
        &self.txn
    }

    pub fn txn_mut(&mut self) -> &mut BatchTxn {
        &mut self.txn
    }
}

/// Why a request's writes did not become durable.
#[derive(Debug)]
pub struct CommitError {
    pub message: String,
    /// Lost a race on a shared store: nothing was kept, the request may
    /// run again.
    pub retry: bool,
}

impl CommitError {
    fn fatal(message: String) -> CommitError {
        CommitError {
            message,
            retry: false,
        }
    }
}

impl From<StorageError> for CommitError {
    fn from(e: StorageError) -> CommitError {
        CommitError {
            retry: matches!(e, StorageError::Conflict),
            message: e.to_string(),
        }
    }
}

impl std::fmt::Display for CommitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "commit failed: {}", self.message)
    }
}

impl Drop for GroupCommit {
    fn drop(&mut self) {
        // The committer writes what is closed, then lets the database go
        // (it may be opened again right after); an idle open batch's
        // snapshot goes first.
        if let Some(thread) = self.committer.take() {
            let idle = {
                let mut s = self.lock();
                s.stopping = true;
                s.txn.take()
            };
            drop(idle);
            self.shared.sealed.notify_all();
            let _ = thread.join();
        }
    }
}

impl GroupCommit {
    /// `wal`: the embedded store's write-ahead log (it has one; a shared
    /// store has none).
    pub fn new(backend: Backend, settings: Settings, wal: Option<Wal>) -> Arc<GroupCommit> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::default()),
            ended: Condvar::new(),
            sealed: Condvar::new(),
            logged: Condvar::new(),
            #[cfg(test)]
            fail_next: AtomicBool::new(false),
            #[cfg(test)]
            log_gate: Mutex::new(()),
            #[cfg(test)]
            applies: Default::default(),
        });
        let committer = match &backend {
            Backend::Redb(db) => {
                let (db, shared) = (db.clone(), shared.clone());
                let wal = wal.expect("the embedded store has a write-ahead log");
                let thread = std::thread::Builder::new()
                    .name("committer".into())
                    .spawn(move || committer(&db, &shared, wal))
                    .expect("spawning the committer thread");
                Some(thread)
            }
            Backend::Pg(_) => None,
        };
        Arc::new(GroupCommit {
            settings,
            backend,
            shared,
            committer,
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.shared.lock()
    }

    /// Open a new batch over the closed ones in `sealed` (the embedded
    /// store's, read with the slot locked), with the lease held.
    fn begin(&self, sealed: &VecDeque<Arc<Sealed>>) -> Result<BatchTxn, CommitError> {
        match &self.backend {
            // Under the slot lock, so that the snapshot and the closed
            // batches it reads through agree (the applier drops a closed
            // batch from the list under the lock once it is visible).
            Backend::Redb(db) => Ok(BatchTxn::Redb(RedbBatch {
                snapshot: db
                    .begin_read()
                    .map_err(|e| CommitError::fatal(e.to_string()))?,
                below: live(sealed),
                writes: Overlay::new(),
                opened: Default::default(),
            })),
            Backend::Pg(store) => store
                .begin_batch()
                .map(BatchTxn::Pg)
                .map_err(CommitError::from),
        }
    }

    /// A reader's view of the embedded store: what is in the database, and
    /// the batches made durable in the write-ahead log but not applied to
    /// it yet (so a read sees every batch whose members were answered).
    pub(super) fn view(&self, db: &Database) -> Result<RedbBatch, StorageError> {
        let s = self.lock();
        Ok(RedbBatch {
            snapshot: db.begin_read().map_err(super::internal)?,
            below: s
                .sealed
                .range(..s.logged)
                .filter(|b| b.outcome.committed())
                .cloned()
                .collect(),
            writes: Overlay::new(),
            opened: Default::default(),
        })
    }

    /// Wait until every batch answered so far is in the database (not only
    /// in the write-ahead log).
    pub(super) fn wait_applied(&self) {
        let mut s = self.lock();
        let target = s.applied + s.logged as u64;
        while s.applied < target && s.broken.is_none() {
            s = self.shared.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Make every batch answered so far durable in the database itself (a
    /// checkpoint), as before a clean stop: the write-ahead log is then
    /// empty.
    pub(super) fn flush(&self) {
        let mut s = self.lock();
        let target = s.checkpoints_begun + 1;
        s.flush_wanted = true;
        self.shared.sealed.notify_all();
        while s.checkpoints_done < target && s.broken.is_none() && !s.committer_gone {
            s = self.shared.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
    }

    /// Hold batches out of the database, as while a checkpoint runs, or
    /// let them in (tests).
    #[cfg(test)]
    pub(super) fn hold_apply(&self, on: bool) {
        self.lock().hold_apply = on;
        self.shared.logged.notify_all();
    }

    /// The applier's applies so far (tests).
    #[cfg(test)]
    pub(super) fn applies(&self) -> u64 {
        self.shared.applies.load(Ordering::Relaxed)
    }

    /// A checkpoint was asked for and has not ended (tests).
    #[cfg(test)]
    pub(super) fn checkpoint_pending(&self) -> bool {
        self.lock().checkpointing
    }

    /// Stall the write-ahead log while the guard is held (tests).
    #[cfg(test)]
    pub(super) fn stall_log(&self) -> MutexGuard<'_, ()> {
        self.shared
            .log_gate
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Whether committed batches could not be applied to the database
    /// (its file refused a write, a full disk say): from then on every
    /// write fails until a restart, which applies the log.
    #[cfg(test)]
    pub(super) fn broken(&self) -> bool {
        self.lock().broken.is_some()
    }

    /// Whether committed batches cannot be kept now: [`GroupCommit::broken`],
    /// or the last append to the write-ahead log failed (until one is
    /// logged again). What health reports.
    pub(super) fn failing(&self) -> bool {
        let s = self.lock();
        s.broken.is_some() || s.log_failing
    }

    /// New log segments that could not be started (tests).
    #[cfg(test)]
    pub(super) fn rotations_failed(&self) -> u64 {
        self.lock().rotations_failed
    }

    /// Requests in the newest batch, and whether it is open with nobody
    /// on it (tests).
    #[cfg(test)]
    pub(super) fn open_members(&self) -> (u64, bool) {
        let s = self.lock();
        (s.members, Self::idle(&s, s.batch))
    }

    /// Closed batches not yet on disk (tests).
    #[cfg(test)]
    pub(super) fn sealed_len(&self) -> usize {
        self.lock().sealed.len()
    }

    /// (successful mutating requests, durable commits) since start.
    pub fn counters(&self) -> (u64, u64) {
        let s = self.lock();
        (s.commits, s.syncs)
    }

    /// Count a mutating request as under way (before it runs), so that a
    /// batch waits for it rather than committing without it.
    pub fn enter(self: &Arc<Self>) -> Pending {
        self.lock().pending += 1;
        Pending {
            gc: self.clone(),
            counted: true,
            alone: false,
        }
    }

    /// A pending request ended without taking the lease: if it was the
    /// last one a batch waited for, commit that batch.
    fn left(&self) {
        let mut s = self.lock();
        s.pending -= 1;
        if s.pending == 0 && s.members > 0 && !s.leased && s.txn.is_some() {
            let txn = s.txn.take().expect("checked");
            s.leased = true;
            let (batch, outcome) = (s.batch, s.outcome.clone());
            self.commit_batch(
                s,
                Lease {
                    txn,
                    batch,
                    outcome,
                    alone: false,
                },
            );
        } else if s.pending == 0 && s.members == 0 && !s.leased && s.txn.is_some() {
            // An open batch nobody will use: let its snapshot go (a redb
            // read transaction keeps freed pages from being reused).
            let idle = s.txn.take();
            drop(s);
            drop(idle);
        }
    }

    /// Take the batch transaction for `pending` (waiting for the request
    /// holding it), opening a new batch when none is open.
    pub fn acquire(&self, mut pending: Pending) -> Result<Lease, CommitError> {
        // From here the lease's release (or a failed begin) uncounts it.
        pending.counted = false;
        if let Some(me) = self.queue_up(Some(std::thread::current())) {
            while !me.granted() {
                std::thread::park();
            }
        }
        self.take_lease(pending.alone)
    }

    /// [`GroupCommit::acquire`] for a task on the async workers: waits
    /// without holding its thread. Cancelled while queued, it leaves the
    /// queue (or hands on a lease granted meanwhile).
    pub async fn acquire_async(&self, mut pending: Pending) -> Result<Lease, CommitError> {
        // Still counted while queued: cancelled there, it leaves the count
        // as a request that never took the lease does (after `Queued`).
        if let Some(me) = self.queue_up(None) {
            let mut queued = Queued {
                gc: self,
                me: Some(me.clone()),
            };
            std::future::poll_fn(|cx| {
                if me.granted() {
                    return Poll::Ready(());
                }
                *me.task.lock().unwrap_or_else(|p| p.into_inner()) = Some(cx.waker().clone());
                if me.granted() {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            })
            .await;
            queued.me = None;
        }
        pending.counted = false;
        self.take_lease(pending.alone)
    }

    /// Join the queue when the lease is held or others wait for it (the
    /// waiter to wait on), else take the lease at once (`None`).
    fn queue_up(&self, thread: Option<Thread>) -> Option<Arc<Waiter>> {
        let mut s = self.lock();
        if s.leased || !s.queue.is_empty() {
            let me = Waiter::new(thread);
            s.queue.push_back(me.clone());
            return Some(me);
        }
        s.leased = true;
        None
    }

    /// With the lease held: the open batch, or a new one. `alone` on a
    /// shared store: a new one, once the open batch (if it has members) is
    /// committed.
    fn take_lease(&self, alone: bool) -> Result<Lease, CommitError> {
        let alone = alone && matches!(self.backend, Backend::Pg(_));
        let mut s = self.lock();
        s.leased = true;
        // An open batch nobody is a member of, which a lone request does
        // not take: begun before it ran, perhaps, its snapshot could be
        // older than the request (see `Ctx::finish`). Rolled back outside
        // the lock (a round trip).
        let mut unused = None;
        if let Some(txn) = s.txn.take() {
            if !alone {
                return Ok(Lease {
                    txn,
                    batch: s.batch,
                    outcome: s.outcome.clone(),
                    alone,
                });
            }
            if s.members == 0 {
                unused = Some(txn);
            } else {
                // Its members wait for it: commit it here, keeping the lease.
                let (batch, members, outcome) = (s.batch, s.members, s.outcome.clone());
                s = self.commit_shared(s, txn, batch, members, &outcome);
            }
        }
        while s.committing {
            s = self.shared.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.batch += 1;
        s.members = 0;
        s.first_member = None;
        s.outcome = Arc::new(Outcome::default());
        let (batch, outcome) = (s.batch, s.outcome.clone());
        let begun = match self.backend {
            Backend::Redb(_) => Some(self.begin(&s.sealed)),
            Backend::Pg(_) => None,
        };
        drop(s);
        drop(unused);
        // A shared store's outside the lock (a round trip).
        match begun.unwrap_or_else(|| self.begin(&VecDeque::new())) {
            Ok(txn) => Ok(Lease {
                txn,
                batch,
                outcome,
                alone,
            }),
            Err(e) => {
                let mut s = self.lock();
                s.pending -= 1;
                Self::hand_on(&mut s);
                Err(e)
            }
        }
    }

    /// Hand the lease on. `applied`: the request succeeded and its writes
    /// are in the batch; then this returns once the batch is durable.
    pub fn release(&self, lease: Lease, applied: bool) -> Result<(), CommitError> {
        let (batch, outcome) = match self.hand_over(lease, applied) {
            Released::Done(result) => return result,
            Released::Member { batch, outcome } => (batch, outcome),
        };
        let mut s = self.lock();
        loop {
            if let Some(result) = outcome.result() {
                return result;
            }
            // Only while the batch is open with nobody on it does a member
            // time out (and commit it); else it sleeps until its batch
            // ends or is left idle (see `hand_on`).
            if !Self::idle(&s, batch) {
                s = outcome.wait(s);
                continue;
            }
            let (next, timeout) = outcome
                .done
                .wait_timeout(s, self.settings.window)
                .unwrap_or_else(|p| p.into_inner());
            s = next;
            if timeout.timed_out() {
                s = self.commit_if_idle(s, batch);
            }
        }
    }

    /// [`GroupCommit::release`] for a task on the async workers: the wait
    /// for the batch to be durable holds no thread.
    pub async fn release_async(&self, lease: Lease, applied: bool) -> Result<(), CommitError> {
        let (batch, outcome) = match self.hand_over(lease, applied) {
            Released::Done(result) => return result,
            Released::Member { batch, outcome } => (batch, outcome),
        };
        loop {
            let idle = {
                let s = self.lock();
                if let Some(result) = outcome.result() {
                    return result;
                }
                Self::idle(&s, batch)
            };
            // Woken when the batch ends or its idleness changes.
            let mut registered = false;
            let woken = std::future::poll_fn(|cx| {
                if registered {
                    return Poll::Ready(());
                }
                let s = self.lock();
                if outcome.result().is_some() || Self::idle(&s, batch) != idle {
                    return Poll::Ready(());
                }
                outcome
                    .tasks
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(cx.waker().clone());
                registered = true;
                Poll::Pending
            });
            if !idle {
                woken.await;
            } else if tokio::time::timeout(self.settings.window, woken)
                .await
                .is_err()
            {
                drop(self.commit_if_idle(self.lock(), batch));
            }
        }
    }

    /// The request's part of handing the lease on: apply its membership,
    /// close the batch when it is complete, hand the lease to the next.
    fn hand_over(&self, lease: Lease, applied: bool) -> Released {
        let mut s = self.lock();
        s.pending -= 1;
        if applied {
            if s.members == 0 {
                s.first_member = Some(std::time::Instant::now());
            }
            s.members += 1;
        }
        let (batch, outcome) = (lease.batch, lease.outcome.clone());
        let member = Released::Member { batch, outcome };
        let commit_now = s.members > 0
            && (!self.settings.enabled
                || s.pending == 0
                || s.members >= self.settings.max_batch
                || lease.alone
                || lease.txn.full()
                || (!applied
                    && s.first_member
                        .is_some_and(|t| t.elapsed() >= self.settings.window)));
        if commit_now {
            self.commit_batch(s, lease);
            return if applied {
                member
            } else {
                Released::Done(Ok(()))
            };
        }
        if s.members == 0 && s.pending == 0 {
            // Nothing to keep and nobody to hand it to: abort it.
            Self::hand_on(&mut s);
            drop(s);
            drop(lease.txn);
            return Released::Done(Ok(()));
        }
        s.txn = Some(lease.txn);
        Self::hand_on(&mut s);
        if applied {
            member
        } else {
            Released::Done(Ok(()))
        }
    }

    /// Whether batch `batch` is open with nobody on it.
    fn idle(s: &Slot, batch: u64) -> bool {
        s.batch == batch && s.txn.is_some() && !s.leased
    }

    /// A member's `window` ran out: when its batch is still open with
    /// nobody on it or waiting for it, commit it here.
    fn commit_if_idle<'a>(
        &'a self,
        mut s: MutexGuard<'a, Slot>,
        batch: u64,
    ) -> MutexGuard<'a, Slot> {
        if Self::idle(&s, batch) && s.queue.is_empty() {
            let txn = s.txn.take().expect("checked");
            s.leased = true;
            let outcome = s.outcome.clone();
            self.commit_batch(
                s,
                Lease {
                    txn,
                    batch,
                    outcome,
                    alone: false,
                },
            );
            return self.lock();
        }
        s
    }

    /// Give the lease to the longest waiting request, or free it. A batch
    /// left open with nobody on it wakes its members: one of them commits
    /// it should nobody take it on within `window`.
    fn hand_on(s: &mut Slot) {
        match s.queue.pop_front() {
            // Stays leased: it passes straight to `next`.
            Some(next) => next.grant(),
            None => {
                s.leased = false;
                if s.txn.is_some() {
                    s.outcome.wake();
                }
            }
        }
    }

    /// Commit the batch `lease` holds, durably, and wake its members (who
    /// read how it ended from its outcome). On the embedded store, close it
    /// for the committer instead.
    fn commit_batch(&self, mut s: MutexGuard<'_, Slot>, lease: Lease) {
        let members = s.members;
        if let BatchTxn::Redb(_) = &lease.txn {
            return self.seal(s, lease, members);
        }
        // The next request opens a new batch once this commit is done.
        Self::hand_on(&mut s);
        let Lease {
            txn,
            batch,
            outcome,
            ..
        } = lease;
        drop(self.commit_shared(s, txn, batch, members, &outcome));
    }

    /// Commit a shared store's batch `txn` (taken out of the slot, whose
    /// lock `s` is) outside the lock, record how it ended and wake its
    /// members; the slot locked again.
    fn commit_shared<'a>(
        &'a self,
        mut s: MutexGuard<'a, Slot>,
        txn: BatchTxn,
        batch: u64,
        members: u64,
        outcome: &Outcome,
    ) -> MutexGuard<'a, Slot> {
        s.committing = true;
        drop(s);
        let result = match txn {
            BatchTxn::Pg(lent) => lent.commit().map_err(CommitError::from),
            BatchTxn::Redb(_) => unreachable!("the embedded store's batches are sealed"),
        };
        let mut s = self.lock();
        s.committing = false;
        if result.is_ok() {
            synced(&mut s, members);
        }
        ended(&mut s, batch, members, outcome, &result);
        self.shared.ended.notify_all();
        s
    }

    /// Close the embedded store's batch: it joins the ordered list the
    /// committer writes from, and the lease goes to the next request (which
    /// opens a new batch over this one at once). The lease stays here while
    /// the committer is more than `MAX_SEALED` batches behind, and, with
    /// group commit off, until this batch is durable (one commit per
    /// request, nothing read through).
    fn seal(&self, mut s: MutexGuard<'_, Slot>, lease: Lease, members: u64) {
        let Lease {
            txn,
            batch,
            outcome,
            ..
        } = lease;
        let BatchTxn::Redb(open) = txn else {
            unreachable!("checked by the caller")
        };
        let RedbBatch {
            snapshot,
            below,
            writes,
            opened,
        } = open;
        s.sealed.push_back(Arc::new(Sealed {
            filter: KeyFilter::of(&writes),
            writes,
            batch,
            members,
            outcome: outcome.clone(),
            below: below.iter().map(|b| b.outcome.clone()).collect(),
            seq: Default::default(),
        }));
        self.shared.sealed.notify_one();
        while (s.sealed.len() - s.logged > MAX_SEALED
            || (s.sealed.len() > MAX_HELD && s.broken.is_none())
            || (!self.settings.enabled && outcome.result().is_none()))
            && !s.committer_gone
        {
            s = self.shared.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        Self::hand_on(&mut s);
        drop(s);
        drop((opened, snapshot, below));
    }

    /// Abandon the batch `lease` holds (its writes are in an unknown state):
    /// every member of it fails; with `retry` (a lost race on a shared
    /// store, nothing kept) they run again.
    pub fn poison(&self, lease: Lease, retry: bool) {
        let mut s = self.lock();
        if retry {
            tracing::info!(
                batch = lease.batch,
                members = s.members,
                "batch lost a race with another host; its requests run again"
            );
        } else {
            tracing::error!(
                batch = lease.batch,
                members = s.members,
                "batch abandoned after a storage error"
            );
        }
        // Counted as handed on: the request holding it is done with it.
        s.pending -= 1;
        lease.outcome.set(Outcome::failure(retry));
        Self::hand_on(&mut s);
        self.shared.ended.notify_all();
        drop(s);
        // Its rollback (a round trip on a shared store) outside the lock.
        drop(lease.txn);
    }
}

/// Count one durable commit of `members` requests (the slot locked).
fn synced(s: &mut Slot, members: u64) {
    s.syncs += 1;
    let m = crate::metrics::metrics();
    m.fsyncs.inc();
    m.commit_batch.observe(members as f64);
}

/// Record how a batch ended (the slot locked): counters, metrics, log,
/// and the outcome its members read.
fn ended(
    s: &mut Slot,
    batch: u64,
    members: u64,
    outcome: &Outcome,
    result: &Result<(), CommitError>,
) {
    match result {
        Ok(()) => {
            outcome.set(Outcome::COMMITTED);
            s.commits += members;
            crate::metrics::metrics().commits.inc_by(members);
        }
        Err(e) => {
            if e.retry {
                tracing::info!(batch, members, "{e}; its requests run again");
            } else {
                // At most once a second: a full disk fails every batch.
                static LINES: crate::logging::Throttle =
                    crate::logging::Throttle::new(std::time::Duration::from_secs(1));
                if let Some(failed) = LINES.note() {
                    tracing::error!(batch, members, failed_batches = failed, "{e}");
                }
            }
            outcome.set(Outcome::failure(e.retry));
        }
    }
}

/// The committer thread. Each round: every closed batch waiting goes to
/// the write-ahead log as one record with one sync, and its members are
/// answered (under load, batches that closed while the previous sync ran
/// share the next). The applier thread ([`applier`]) then puts the batches
/// logged into the database, so a sync never waits for a B-tree update.
/// When a checkpoint is due, the log goes on in a new segment and the
/// applier makes the database durable once it holds every record before
/// that segment, while batches go on being logged and answered. Ends once
/// the store is dropped and everything is checkpointed.
///
/// The batches of one record share one fate: the first read only through
/// batches that have ended, and every later one read through the first.
/// So when one the first read through failed, none is logged.
fn committer(db: &Arc<Database>, shared: &Arc<Shared>, mut wal: Wal) {
    let applier = {
        let (db, shared) = (db.clone(), shared.clone());
        let (base, id) = (wal.base().to_path_buf(), wal.id());
        std::thread::Builder::new()
            .name("applier".into())
            .spawn(move || applier(&db, &shared, &base, id))
            .expect("spawning the applier thread")
    };
    'run: loop {
        let group = {
            let mut s = shared.lock();
            loop {
                if std::mem::take(&mut s.checkpoint_failed) {
                    if s.stopping {
                        // The log keeps what the database may lack.
                        break 'run;
                    }
                    wal.retry_later();
                }
                let unlogged = s.sealed.len() > s.logged;
                if s.flush_wanted
                    && !unlogged
                    && !s.checkpointing
                    && s.logged == 0
                    && !wal.pending()
                {
                    // Nothing to checkpoint: the database holds it all.
                    end_flush_without_checkpoint(&mut s, shared);
                }
                if unlogged || can_checkpoint(&s, &wal) {
                    break;
                }
                if s.stopping && !s.checkpointing {
                    // Everything is in the database and checkpointed (or
                    // can no longer be applied: the log keeps it).
                    break 'run;
                }
                s = if wal.pending() && !s.checkpointing {
                    // Idle with records not checkpointed: wake when due.
                    shared
                        .sealed
                        .wait_timeout(s, wal::CHECKPOINT_AFTER / 4)
                        .unwrap_or_else(|p| p.into_inner())
                        .0
                } else {
                    shared.sealed.wait(s).unwrap_or_else(|p| p.into_inner())
                };
            }
            s.sealed.range(s.logged..).cloned().collect::<Vec<_>>()
        };
        if !group.is_empty() {
            log_batches(shared, &group, &mut wal);
        }
        let mut s = shared.lock();
        if can_checkpoint(&s, &wal) {
            match wal.rotate() {
                Ok(next) => {
                    s.checkpointing = true;
                    s.checkpoint_at = Some(next);
                    s.flush_wanted = false;
                    s.checkpoints_begun += 1;
                    shared.logged.notify_all();
                }
                Err(e) => {
                    tracing::error!(
                        "the write-ahead log could not start a new segment (it goes on in the current one; tried again in {:?}): {e:#}",
                        wal::ROTATE_RETRY
                    );
                    #[cfg(test)]
                    {
                        s.rotations_failed += 1;
                    }
                    if s.stopping {
                        // The log keeps what the database may lack.
                        break 'run;
                    }
                    if s.flush_wanted {
                        // A flush waiting ends, given up, as when its
                        // checkpoint fails: the log keeps everything.
                        tracing::warn!(
                            "a flush ends without a checkpoint: the write-ahead log keeps what the database file lacks (applied at the next start)"
                        );
                        end_flush_without_checkpoint(&mut s, shared);
                    }
                }
            }
        }
    }
    shared.lock().logging_done = true;
    shared.logged.notify_all();
    let _ = applier.join();
    shared.lock().committer_gone = true;
    shared.ended.notify_all();
}

/// The applier thread: puts the batches logged into the database, oldest
/// first, all those waiting in one non-durable commit, and then drops them
/// from the list new batches and readers read through; and runs the
/// checkpoints the committer asks for (both need redb's one write
/// transaction), each once every record before its segment is in the
/// database. While a checkpoint runs, batches wait in the list. Ends once
/// the committer has ended and no checkpoint is left.
fn applier(db: &Database, shared: &Shared, base: &std::path::Path, log_id: u64) {
    loop {
        let mut s = shared.lock();
        while !can_apply(&s) && !checkpoint_ready(&s) {
            if s.logging_done && s.checkpoint_at.is_none() {
                return;
            }
            s = shared.logged.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if can_apply(&s) {
            let done: Vec<Arc<Sealed>> = s
                .sealed
                .range(..piece_end(&s.sealed, s.logged))
                .cloned()
                .collect();
            drop(s);
            let kept: Vec<Arc<Sealed>> = done
                .iter()
                .filter(|b| b.outcome.committed())
                .cloned()
                .collect();
            // Timed only for the debug line.
            let mut cost = tracing::enabled!(tracing::Level::DEBUG).then(ApplyCost::begin);
            let applied = if kept.is_empty() {
                Ok(())
            } else {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    apply(db, &kept, log_id, cost.as_mut())
                }))
                .unwrap_or_else(|_| Err(anyhow::anyhow!("applying the batches panicked")))
            };
            #[cfg(test)]
            if !kept.is_empty() {
                shared.applies.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(cost) = cost {
                tracing::debug!(
                    took_us = cost.began.elapsed().as_micros() as u64,
                    batches = kept.len(),
                    members = kept.iter().map(|b| b.members).sum::<u64>(),
                    commit_us = cost.commit.as_micros() as u64,
                    tables = %cost,
                    "batches applied"
                );
            }
            s = shared.lock();
            match applied {
                Ok(()) => {
                    // Only this thread removes logged batches, from the
                    // front: these are still the first `done.len()`.
                    s.sealed.drain(..done.len());
                    s.logged -= done.len();
                    s.applied += done.len() as u64;
                }
                Err(e) => {
                    // The batches are durable in the log, and readers read
                    // them from the list: a restart applies them.
                    tracing::error!(
                        "batches in the write-ahead log could not be applied to the database ({e:#}); no more writes are accepted until a restart"
                    );
                    s.broken = Some(format!(
                        "the database could not take committed batches: {e:#}"
                    ));
                }
            }
            shared.ended.notify_all();
            if s.flush_wanted {
                // The committer decides whether a flush has anything left
                // to checkpoint once nothing logged waits.
                shared.sealed.notify_all();
            }
        }
        if !checkpoint_ready(&s) {
            continue;
        }
        let Some(next) = s.checkpoint_at else {
            continue;
        };
        if s.broken.is_some() {
            // What the database lacks stays in the log.
            s.checkpoint_at = None;
            s.checkpointing = false;
            s.checkpoint_failed = true;
            s.checkpoints_done = s.checkpoints_begun;
            shared.sealed.notify_all();
            shared.ended.notify_all();
            continue;
        }
        drop(s);
        let started = std::time::Instant::now();
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| checkpoint(db, base, next)))
                .unwrap_or_else(|_| Err((false, anyhow::anyhow!("the checkpoint panicked"))));
        let mut poisoned = None;
        match &result {
            Ok(()) => tracing::debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "checkpoint done"
            ),
            Err((true, e)) => {
                tracing::error!(
                    "the database refused the checkpoint ({e:#}); no more writes are accepted until a restart (the write-ahead log keeps every batch: a restart applies them)"
                );
                poisoned = Some(format!("the database refused a checkpoint: {e:#}"));
            }
            Err((false, e)) => tracing::error!(
                "checkpoint failed (the write-ahead log keeps every batch; the next one tries again): {e:#}"
            ),
        }
        let mut s = shared.lock();
        if poisoned.is_some() {
            s.broken = poisoned;
        }
        s.checkpointing = false;
        s.checkpoint_at = None;
        s.checkpoint_failed = result.is_err();
        s.checkpoints_done = s.checkpoints_begun;
        shared.sealed.notify_all();
        shared.ended.notify_all();
    }
}

/// End the wait of a flush without running a checkpoint (nothing to
/// checkpoint, or one could not begin), counted as one begun and ended
/// (the slot locked).
fn end_flush_without_checkpoint(s: &mut Slot, shared: &Shared) {
    s.flush_wanted = false;
    s.checkpoints_begun += 1;
    s.checkpoints_done = s.checkpoints_begun;
    shared.ended.notify_all();
}

/// Whether the checkpoint asked for can run (or, the store broken, be
/// given up): every record before its segment is in the database (the
/// slot locked).
fn checkpoint_ready(s: &Slot) -> bool {
    s.checkpoint_at.is_some_and(|next| {
        s.broken.is_some() || !s.sealed.range(..s.logged).any(|b| b.seq() < next)
    })
}

/// Whether batches wait to be applied to the database (the slot locked).
fn can_apply(s: &Slot) -> bool {
    #[cfg(test)]
    if s.hold_apply {
        return false;
    }
    s.logged > 0 && s.broken.is_none()
}

/// Where the applier's next piece of the first `logged` closed batches
/// ends: after [`MAX_APPLY`] of them, and then at the end of the log
/// record the last of those is in. An apply marks its last record as in
/// the database (what recovery skips after a crash), so a piece never ends
/// inside one: a checkpoint between two pieces would make that mark
/// durable without the record's other batches.
fn piece_end(sealed: &VecDeque<Arc<Sealed>>, logged: usize) -> usize {
    let mut end = logged.min(MAX_APPLY);
    while end > 0 && end < logged && sealed[end].seq() == sealed[end - 1].seq() {
        end += 1;
    }
    end
}

/// Whether a checkpoint is to begin: due (or the store is stopping, or a
/// flush wants one), none under way, batches can still reach the
/// database, and no new log segment failed to start lately.
fn can_checkpoint(s: &Slot, wal: &Wal) -> bool {
    #[cfg(test)]
    let due = wal.due() && !s.no_timed_checkpoints;
    #[cfg(not(test))]
    let due = wal.due();
    !s.checkpointing
        && s.broken.is_none()
        && wal.may_rotate()
        && (due || ((s.stopping || s.flush_wanted) && wal.pending()))
}

/// Append `group` (the closed batches not logged yet, oldest first) to
/// the write-ahead log as one record, then record how each ended.
fn log_batches(shared: &Shared, group: &[Arc<Sealed>], wal: &mut Wal) {
    #[cfg(test)]
    let _gate = shared.log_gate.lock().unwrap_or_else(|p| p.into_inner());
    let broken = shared.lock().broken.clone();
    let seq = wal.next_seq();
    let result = if let Some(why) = broken {
        Err(CommitError::fatal(why))
    } else if group[0].below.iter().any(|o| !o.committed()) {
        Err(CommitError::fatal(
            "an earlier batch it read could not be committed".into(),
        ))
    } else if shared.fails_next() {
        Err(CommitError::fatal("failed by the test".into()))
    } else {
        let started = std::time::Instant::now();
        let appended = wal
            .append(group.iter().map(|b| &b.writes))
            .map_err(|e| CommitError::fatal(format!("{e:#}")));
        tracing::debug!(
            took_us = started.elapsed().as_micros() as u64,
            batches = group.len(),
            "batches logged"
        );
        appended
    };
    let mut s = shared.lock();
    s.log_failing = result.is_err() && s.broken.is_none();
    // The applier may have removed batches from the front meanwhile, but
    // only logged ones: the group still follows the first `logged`.
    let logged = s.logged;
    debug_assert!(Arc::ptr_eq(&s.sealed[logged], &group[0]));
    if result.is_ok() {
        synced(&mut s, group.iter().map(|b| b.members).sum());
        for b in group {
            b.seq.store(seq, Ordering::Release);
        }
    }
    for b in group {
        ended(&mut s, b.batch, b.members, &b.outcome, &result);
    }
    if result.is_err() && s.broken.is_some() {
        // Never to be applied, nor read: they go now (a broken store
        // would otherwise hold every later batch).
        s.sealed.drain(logged..logged + group.len());
        s.applied += group.len() as u64;
    } else {
        s.logged += group.len();
        shared.logged.notify_one();
    }
    shared.ended.notify_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, TableDefinition};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;

    const T: TableDefinition<&[u8], &[u8]> = TableDefinition::new("t");

    fn open(settings: Settings) -> (tempfile::TempDir, Arc<Database>, Arc<GroupCommit>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("db")).unwrap());
        let wal = Wal::create(&dir.path().join("db-wal"), 1, 0).unwrap();
        let gc = GroupCommit::new(Backend::Redb(db.clone()), settings, Some(wal));
        (dir, db, gc)
    }

    fn put(l: &mut Lease, k: u64) {
        let BatchTxn::Redb(batch) = l.txn_mut() else {
            unreachable!("redb here")
        };
        let k = k.to_be_bytes().to_vec();
        batch
            .writes
            .entry("t".into())
            .or_default()
            .insert(k.clone(), Some(k));
    }

    /// One row a test batch writes: table, key, value (`None`: removed).
    type Row<'a> = (&'a str, &'a [u8], Option<&'a [u8]>);

    /// A logged batch holding `writes`, for `apply`.
    fn logged_batch(writes: &[Row<'_>], seq: u64) -> Arc<Sealed> {
        let mut overlay = Overlay::new();
        for (table, key, value) in writes {
            overlay
                .entry(table.to_string())
                .or_default()
                .insert(key.to_vec(), value.map(<[u8]>::to_vec));
        }
        Arc::new(Sealed {
            filter: KeyFilter::of(&overlay),
            writes: overlay,
            batch: seq,
            members: 1,
            outcome: Default::default(),
            below: Vec::new(),
            seq: seq.into(),
        })
    }

    #[test]
    fn a_piece_of_the_applier_ends_with_a_whole_log_record() {
        // Records of one, three and two batches: 62 of one batch each
        // (seq 1 to 62), then seq 63 holding batches 62 to 64, seq 64
        // holding 65 and 66, and more.
        let mut seqs: Vec<u64> = (1..=62).collect();
        seqs.extend([63, 63, 63, 64, 64]);
        seqs.extend(65..100);
        let sealed: VecDeque<Arc<Sealed>> = seqs.iter().map(|&q| logged_batch(&[], q)).collect();
        // The 64th batch is the second of record 63: the piece takes the
        // third too.
        assert_eq!(piece_end(&sealed, sealed.len()), 65);
        // Only what is logged, however a record goes on.
        assert_eq!(piece_end(&sealed, 64), 64);
        assert_eq!(piece_end(&sealed, 10), 10);
        // A record that starts right after the 64th is the next piece's.
        let ones: VecDeque<Arc<Sealed>> = (1..=100).map(|q| logged_batch(&[], q)).collect();
        assert_eq!(piece_end(&ones, 100), 64);
    }

    #[test]
    fn an_apply_reports_the_rows_of_each_table() {
        let dir = tempfile::tempdir().unwrap();
        let db = Database::create(dir.path().join("db")).unwrap();
        let group = [
            logged_batch(
                &[
                    ("a", b"1", Some(b"x")),
                    ("a", b"2", Some(b"y")),
                    ("b", b"k", Some(b"old")),
                ],
                1,
            ),
            logged_batch(&[("b", b"k", Some(b"new")), ("b", b"gone", None)], 2),
            // A key removed by one batch and written again by a later
            // one, and one written and then removed.
            logged_batch(&[("b", b"again", None), ("b", b"dropped", Some(b"x"))], 3),
            logged_batch(
                &[("b", b"again", Some(b"back")), ("b", b"dropped", None)],
                4,
            ),
        ];
        let mut cost = ApplyCost::begin();
        apply(&db, &group, 7, Some(&mut cost)).unwrap();
        let rows: Vec<(&str, usize)> = cost
            .tables
            .iter()
            .map(|(t, n, _)| (t.as_str(), *n))
            .collect();
        // Each key once: the group's last write of it.
        assert_eq!(rows, [("a", 2), ("b", 4)]);
        // The line the applier logs: each table's rows and microseconds.
        let line = cost.to_string();
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts.len(), 4, "{line}");
        assert_eq!((parts[0], parts[2]), ("a", "b"));
        assert!(
            parts[1].starts_with("2/") && parts[3].starts_with("4/"),
            "{line}"
        );
        // What was applied: the later batch's write of a key wins.
        let read = db.begin_read().unwrap();
        let b = read.open_table(crate::store::def("b")).unwrap();
        assert_eq!(b.get(&b"k"[..]).unwrap().unwrap().value(), b"new");
        assert_eq!(b.get(&b"again"[..]).unwrap().unwrap().value(), b"back");
        assert!(b.get(&b"dropped"[..]).unwrap().is_none());
        assert!(b.get(&b"gone"[..]).unwrap().is_none());
        let a = read.open_table(crate::store::def("a")).unwrap();
        assert_eq!(redb::ReadableTableMetadata::len(&a).unwrap(), 2);
        // And without a cost asked for, nothing is measured.
        apply(&db, &group, 7, None).unwrap();
    }

    /// A row of a test batch, owned: table, key, value (`None`: removed).
    type OwnedRow = (String, Vec<u8>, Option<Vec<u8>>);

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// A group applied at once leaves the database as its batches
        /// applied one after another to a plain map would: each key's last
        /// write (a value, or its removal), whatever the order in which
        /// keys and tables repeat.
        #[test]
        fn a_group_leaves_each_keys_last_write(
            group in proptest::collection::vec(
                proptest::collection::vec((0u8..3, 0u8..6, proptest::option::of(0u8..4)), 0..8),
                1..8,
            ),
            before in proptest::collection::vec((0u8..3, 0u8..6), 0..10),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let db = Database::create(dir.path().join("db")).unwrap();
            let table = |t: u8| format!("t{t}");
            // The model: what the database holds, row by row.
            let mut model = std::collections::BTreeMap::new();
            let rows: Vec<OwnedRow> = before
                .iter()
                .map(|&(t, k)| (table(t), vec![k], Some(b"before".to_vec())))
                .collect();
            let batch = |rows: &[OwnedRow], seq| {
                let writes: Vec<Row<'_>> = rows
                    .iter()
                    .map(|(t, k, v)| (t.as_str(), k.as_slice(), v.as_deref()))
                    .collect();
                logged_batch(&writes, seq)
            };
            apply(&db, &[batch(&rows, 1)], 7, None).unwrap();
            for (t, k, v) in rows {
                model.insert((t, k), v);
            }
            let mut logged = Vec::new();
            for (i, writes) in group.iter().enumerate() {
                let rows: Vec<OwnedRow> = writes
                    .iter()
                    .map(|&(t, k, v)| (table(t), vec![k], v.map(|v| vec![v])))
                    .collect();
                // Within a batch a later write of a key replaces an
                // earlier one (as a request's writes do).
                logged.push(batch(&rows, i as u64 + 2));
                for (t, k, v) in rows {
                    model.insert((t, k), v);
                }
            }
            apply(&db, &logged, 7, None).unwrap();
            let read = db.begin_read().unwrap();
            for t in 0..3u8 {
                let Ok(held) = read.open_table(crate::store::def(&table(t))) else {
                    // No such table: then the model holds nothing in it.
                    for k in 0..6u8 {
                        proptest::prop_assert_eq!(
                            model.get(&(table(t), vec![k])).cloned().flatten(),
                            None,
                            "table {} key {}", t, k
                        );
                    }
                    continue;
                };
                for k in 0..6u8 {
                    let got = held.get(&[k][..]).unwrap().map(|v| v.value().to_vec());
                    let want = model.get(&(table(t), vec![k])).cloned().flatten();
                    proptest::prop_assert_eq!(got, want, "table {} key {}", t, k);
                }
            }
        }
    }

    /// Rows of `t` a reader sees (durable, in the database or the log).
    fn count(gc: &GroupCommit, db: &Database) -> u64 {
        let view = gc.view(db).unwrap();
        let mut rows = crate::store::Rows::new();
        view.scan_layered(
            None,
            "t",
            &[],
            None,
            false,
            usize::MAX,
            usize::MAX,
            &mut rows,
        )
        .unwrap();
        rows.len() as u64
    }

    /// A database file that refuses writes once `full` is set, as a full
    /// disk does.
    #[derive(Debug)]
    struct Filling {
        inner: redb::backends::InMemoryBackend,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl Filling {
        fn check(&self) -> std::io::Result<()> {
            if self.full.load(std::sync::atomic::Ordering::SeqCst) {
                Err(std::io::Error::other("no space left on device (test)"))
            } else {
                Ok(())
            }
        }
    }

    impl redb::StorageBackend for Filling {
        fn len(&self) -> std::io::Result<u64> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> std::io::Result<()> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> std::io::Result<()> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> std::io::Result<()> {
            self.check()?;
            self.inner.write(offset, data)
        }
    }

    /// A store whose database file refuses every write once `full` is set
    /// (its log is on a real disk).
    fn filling() -> (
        tempfile::TempDir,
        Arc<std::sync::atomic::AtomicBool>,
        Arc<GroupCommit>,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let full = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let backend = Filling {
            inner: redb::backends::InMemoryBackend::new(),
            full: full.clone(),
        };
        let db = Arc::new(redb::Builder::new().create_with_backend(backend).unwrap());
        let wal = Wal::create(&dir.path().join("db-wal"), 1, 0).unwrap();
        let gc = GroupCommit::new(Backend::Redb(db), Settings::default(), Some(wal));
        // Checkpoints only when a test flushes: one due meanwhile (on a
        // loaded machine) would run before the test makes the file full.
        gc.lock().no_timed_checkpoints = true;
        (dir, full, gc)
    }

    #[test]
    fn a_database_that_cannot_take_batches_any_more_is_broken() {
        // Once the file refuses a write redb refuses every later one, so
        // the batches stay in the log and writes fail until a restart:
        // `broken` says so (health answers 503 degraded with it).
        let (_dir, full, gc) = filling();
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, 1);
        gc.release(l, true).unwrap();
        gc.flush();
        assert!(!gc.broken());
        full.store(true, std::sync::atomic::Ordering::SeqCst);
        for k in 2..5 {
            let Ok(mut l) = gc.acquire(gc.enter()) else {
                break;
            };
            put(&mut l, k);
            let _ = gc.release(l, true);
            gc.flush();
            gc.wait_applied();
        }
        assert!(gc.broken(), "the database refused the batches");
        assert!(gc.failing());
    }

    #[test]
    fn a_database_that_refuses_a_checkpoint_is_broken_at_once() {
        // redb refuses every write after its file refused one: a failed
        // checkpoint is that moment, not a later batch's.
        let (_dir, full, gc) = filling();
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, 1);
        gc.release(l, true).unwrap();
        gc.wait_applied();
        full.store(true, std::sync::atomic::Ordering::SeqCst);
        gc.flush();
        assert!(gc.broken(), "the checkpoint was refused");
    }

    #[test]
    fn a_log_that_refuses_a_batch_fails_health_until_one_is_logged() {
        // A full disk refuses the log's append: that batch fails, and until
        // a later one is logged the store says it cannot keep writes.
        let (_d, _db, gc) = open(Settings::default());
        assert!(!gc.failing());
        gc.shared.fail_next.store(true, Ordering::Release);
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, 1);
        assert!(gc.release(l, true).is_err());
        assert!(gc.failing(), "the log refused the batch");
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, 2);
        gc.release(l, true).unwrap();
        assert!(!gc.failing(), "logged again");
    }

    #[test]
    fn a_lone_writer_commits_at_once() {
        let (_d, db, gc) = open(Settings::default());
        for k in 0..3 {
            let mut l = gc.acquire(gc.enter()).unwrap();
            put(&mut l, k);
            gc.release(l, true).unwrap();
            assert_eq!(count(&gc, &db), k + 1, "visible (and durable) on return");
        }
        assert_eq!(gc.counters(), (3, 3));
    }

    #[test]
    fn concurrent_writers_share_commits() {
        let (_d, db, gc) = open(Settings::default());
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let gc = gc.clone();
                std::thread::spawn(move || {
                    for i in 0..50 {
                        let mut l = gc.acquire(gc.enter()).unwrap();
                        put(&mut l, t * 1000 + i);
                        std::thread::sleep(Duration::from_micros(50));
                        gc.release(l, true).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (commits, syncs) = gc.counters();
        assert_eq!(commits, 800);
        assert!(syncs < commits / 2, "little batching: {syncs} syncs");
        assert_eq!(count(&gc, &db), 800);
        let s = gc.lock();
        assert_eq!((s.leased, s.pending, s.txn.is_none()), (false, 0, true));
    }

    #[test]
    fn a_failed_batch_mate_hands_on_and_the_batch_still_commits() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_secs(30),
            ..Settings::default()
        });
        let mut a = gc.acquire(gc.enter()).unwrap();
        put(&mut a, 1);
        let gc2 = gc.clone();
        let b = std::thread::spawn(move || {
            let b = gc2.acquire(gc2.enter()).unwrap();
            // B fails: hands the lease on without applying anything.
            gc2.release(b, false).unwrap();
        });
        while gc.lock().pending < 2 {
            std::thread::yield_now();
        }
        let started = std::time::Instant::now();
        gc.release(a, true).unwrap();
        b.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited the window"
        );
        assert_eq!(gc.counters(), (1, 1));
        assert_eq!(count(&gc, &db), 1);
    }

    #[test]
    fn requests_that_keep_failing_on_the_lease_do_not_hold_a_members_batch() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_millis(20),
            ..Settings::default()
        });
        // Another request is under way all along (so the batch is never
        // left with nobody under way), and a flood of requests takes the
        // lease and fails, one after another (so it is never idle).
        let under_way = gc.enter();
        let stop = Arc::new(AtomicBool::new(false));
        let flood = {
            let (gc, stop) = (gc.clone(), stop.clone());
            std::thread::spawn(move || {
                let until = std::time::Instant::now() + Duration::from_secs(30);
                while !stop.load(Ordering::Relaxed) && std::time::Instant::now() < until {
                    let failing = gc.acquire(gc.enter()).unwrap();
                    gc.release(failing, false).unwrap();
                }
                std::time::Instant::now() < until
            })
        };
        let mut a = gc.acquire(gc.enter()).unwrap();
        put(&mut a, 1);
        gc.release(a, true).unwrap();
        // Committed while the flood still runs: it did not give up first.
        stop.store(true, Ordering::Relaxed);
        assert!(
            flood.join().unwrap(),
            "the member waited for the flood to end"
        );
        drop(under_way);
        assert_eq!(count(&gc, &db), 1);
    }

    #[test]
    fn a_stuck_successor_is_bounded_by_the_window() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_millis(20),
            ..Settings::default()
        });
        let mut a = gc.acquire(gc.enter()).unwrap();
        put(&mut a, 1);
        // Another request is under way but never takes the lease.
        let stuck = gc.enter();
        gc.release(a, true).unwrap();
        drop(stuck);
        assert_eq!(count(&gc, &db), 1);
        assert_eq!(gc.counters(), (1, 1));
    }

    #[test]
    fn a_request_that_never_writes_lets_the_batch_commit() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_secs(30),
            ..Settings::default()
        });
        let mut a = gc.acquire(gc.enter()).unwrap();
        put(&mut a, 1);
        let reader = gc.enter(); // under way; ends without storage
        let gc2 = gc.clone();
        let member = std::thread::spawn(move || gc2.release(a, true));
        while gc.lock().members == 0 {
            std::thread::yield_now();
        }
        assert_eq!(
            count(&gc, &db),
            0,
            "the batch waits for the pending request"
        );
        let started = std::time::Instant::now();
        drop(reader);
        member.join().unwrap().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited the window"
        );
        assert_eq!(count(&gc, &db), 1);
    }

    /// Closed batches not yet in the log.
    fn sealed(gc: &GroupCommit) -> usize {
        let s = gc.lock();
        s.sealed.len() - s.logged
    }

    fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
        let started = std::time::Instant::now();
        while !f() {
            assert!(started.elapsed() < Duration::from_secs(20), "{what}");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_failed_batch_fails_every_batch_that_read_through_it() {
        let (_d, db, gc) = open(Settings::default());
        let disk = gc.stall_log();
        let spawn_put = |k: u64| {
            let gc = gc.clone();
            std::thread::spawn(move || {
                let mut l = gc.acquire(gc.enter()).unwrap();
                put(&mut l, k);
                gc.release(l, true)
            })
        };
        let a = spawn_put(1);
        wait_for("batch 1 closed", || sealed(&gc) == 1);
        // Opened over batch 1, which is not on disk yet.
        let b = spawn_put(2);
        wait_for("batch 2 closed", || sealed(&gc) == 2);
        gc.shared.fail_next.store(true, Ordering::Release);
        drop(disk);
        assert!(a.join().unwrap().is_err(), "its own commit failed");
        assert!(b.join().unwrap().is_err(), "it read a batch that failed");
        assert_eq!(count(&gc, &db), 0, "nothing of either is written");
        wait_for("both gone", || gc.lock().sealed.is_empty());
        // A batch opened after them starts from what is on disk.
        let mut l = gc.acquire(gc.enter()).unwrap();
        put(&mut l, 3);
        gc.release(l, true).unwrap();
        assert_eq!(count(&gc, &db), 1);
        assert_eq!(gc.counters(), (1, 1));
    }

    #[test]
    fn a_stalled_disk_holds_writers_back_and_reorders_nothing() {
        // Every request adds one to a counter it reads: a batch committed
        // out of order, or a write lost, leaves the counter short.
        let (_d, db, gc) = open(Settings::default());
        let stop = Arc::new(AtomicBool::new(false));
        let staller = {
            let (gc, stop) = (gc.clone(), stop.clone());
            std::thread::spawn(move || {
                // The database (as while a checkpoint runs) and the log
                // stall in turn.
                while !stop.load(Ordering::Acquire) {
                    gc.hold_apply(true);
                    std::thread::sleep(Duration::from_millis(3));
                    gc.hold_apply(false);
                    let log = gc.stall_log();
                    std::thread::sleep(Duration::from_millis(3));
                    drop(log);
                    std::thread::sleep(Duration::from_micros(200));
                }
            })
        };
        let most = Arc::new(Mutex::new(0usize));
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let (gc, most) = (gc.clone(), most.clone());
                std::thread::spawn(move || {
                    for _ in 0..40 {
                        let mut l = gc.acquire(gc.enter()).unwrap();
                        bump(&mut l);
                        let mut m = most.lock().unwrap();
                        *m = (*m).max(sealed(&gc));
                        drop(m);
                        gc.release(l, true).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, Ordering::Release);
        staller.join().unwrap();
        assert_eq!(counter(&gc, &db), 480);
        assert_eq!(gc.counters().0, 480);
        assert!(
            *most.lock().unwrap() <= MAX_SEALED,
            "closed batches bounded"
        );
        assert_eq!(sealed(&gc), 0);
    }

    /// Add one to the counter (`n` in table `t`) in the lease's batch.
    fn bump(l: &mut Lease) {
        let key = b"n".to_vec();
        let BatchTxn::Redb(batch) = l.txn_mut() else {
            unreachable!("redb here")
        };
        let n = match batch.written("t", &key) {
            Some(v) => u64::from_be_bytes(v.clone().unwrap().try_into().unwrap()),
            None => batch
                .snapshot
                .open_table(T)
                .ok()
                .and_then(|t| t.get(key.as_slice()).unwrap())
                .map_or(0, |v| u64::from_be_bytes(v.value().try_into().unwrap())),
        };
        batch
            .writes
            .entry("t".into())
            .or_default()
            .insert(key, Some((n + 1).to_be_bytes().to_vec()));
    }

    fn counter(gc: &GroupCommit, db: &Database) -> u64 {
        let v = gc
            .view(db)
            .unwrap()
            .get_layered("t", b"n")
            .unwrap()
            .unwrap();
        u64::from_be_bytes(v.try_into().unwrap())
    }

    #[test]
    fn tasks_and_threads_take_turns_and_lose_no_update() {
        let (_d, db, gc) = open(Settings::default());
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let tasks: Vec<_> = (0..24)
            .map(|_| {
                let gc = gc.clone();
                rt.spawn(async move {
                    for _ in 0..20 {
                        let mut l = gc.acquire_async(gc.enter()).await.unwrap();
                        bump(&mut l);
                        tokio::task::yield_now().await;
                        gc.release_async(l, true).await.unwrap();
                    }
                })
            })
            .collect();
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let gc = gc.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let mut l = gc.acquire(gc.enter()).unwrap();
                        bump(&mut l);
                        gc.release(l, true).unwrap();
                    }
                })
            })
            .collect();
        rt.block_on(async {
            for t in tasks {
                t.await.unwrap();
            }
        });
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter(&gc, &db), 560);
        let (commits, syncs) = gc.counters();
        assert_eq!(commits, 560);
        assert!(syncs < commits, "no batching: {syncs} syncs");
        let s = gc.lock();
        assert_eq!((s.leased, s.pending, s.queue.len()), (false, 0, 0));
    }

    #[test]
    fn a_task_cancelled_in_the_queue_holds_nobody_up() {
        use std::future::Future;
        let (_d, db, gc) = open(Settings {
            window: Duration::from_secs(30),
            ..Settings::default()
        });
        let mut cx = std::task::Context::from_waker(Waker::noop());
        for granted in [false, true] {
            let holder = gc.acquire(gc.enter()).unwrap();
            let mut queued = Box::pin(gc.acquire_async(gc.enter()));
            assert!(queued.as_mut().poll(&mut cx).is_pending());
            if granted {
                // The lease passes to the queued task, which never runs.
                gc.release(holder, false).unwrap();
                drop(queued);
            } else {
                drop(queued);
                gc.release(holder, false).unwrap();
            }
            {
                let s = gc.lock();
                assert_eq!((s.leased, s.pending, s.queue.len()), (false, 0, 0));
            }
            // The next writer gets the lease, and its batch commits at once
            // (nobody is counted as under way any more).
            let mut l = gc.acquire(gc.enter()).unwrap();
            bump(&mut l);
            gc.release(l, true).unwrap();
        }
        assert_eq!(counter(&gc, &db), 2);
    }

    #[test]
    fn disabled_means_one_commit_each() {
        let (_d, _db, gc) = open(Settings {
            enabled: false,
            ..Settings::default()
        });
        let threads: Vec<_> = (0..8u64)
            .map(|t| {
                let gc = gc.clone();
                std::thread::spawn(move || {
                    for i in 0..10 {
                        let mut l = gc.acquire(gc.enter()).unwrap();
                        put(&mut l, t * 100 + i);
                        gc.release(l, true).unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(gc.counters(), (80, 80));
    }
}
