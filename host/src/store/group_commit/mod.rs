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
//! `max_batch` requests, or is [`OPEN_AT_MOST`] (or `window`, if longer)
//! old; each member answers only once that commit is done.
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

use super::key_filter::KeyFilter;
use super::wal::Wal;
use super::{Backend, Overlay, Settings, StorageError, pg};
use redb::{Database, ReadableDatabase};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Poll, Waker};
use std::thread::Thread;

mod embedded;

pub use embedded::RedbBatch;
pub(super) use embedded::Sealed;
use embedded::{MAX_HELD, MAX_SEALED, committer, live};

/// The longest a batch with members stays open for the requests still
/// under way: the next request handing the lease on commits it, whatever
/// is pending. Under load a batch fills (`max_batch`) or runs dry well
/// before; but requests that each hold the lease long (a component that
/// writes, then computes near its deadline) would keep it open, and every
/// member's answer waiting, for as long as they keep coming.
const OPEN_AT_MOST: std::time::Duration = std::time::Duration::from_millis(50);

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
    /// open. (Successful requests keep batching up to `max_batch`, or
    /// until the batch is [`OPEN_AT_MOST`] old.)
    first_member: Option<std::time::Instant>,
    /// A request holds the batch transaction.
    leased: bool,
    /// Requests waiting for the lease, in the order they came: served by
    /// turns of their sources (see [`GroupCommit::hand_on`]).
    queue: VecDeque<Arc<Waiter>>,
    /// Grants of the lease since start, and the grant each source (of the
    /// queue's, and the holder's) last had.
    turn: u64,
    served: std::collections::HashMap<u64, u64>,
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

/// A request waiting until the lease is handed to it: a parked thread,
/// or a task on the async workers.
struct Waiter {
    granted: AtomicBool,
    /// Its request's source ([`Pending::from`]), and the grants of the
    /// lease there had been when it came.
    source: u64,
    arrived: u64,
    thread: Option<Thread>,
    task: Mutex<Option<Waker>>,
}

impl Waiter {
    fn new(thread: Option<Thread>, source: u64, arrived: u64) -> Arc<Waiter> {
        Arc::new(Waiter {
            granted: AtomicBool::new(false),
            source,
            arrived,
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
    /// Whose turn it takes in the lease's queue ([`Pending::from`]).
    source: u64,
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

    /// Whose request it is: `source` names its client's address
    /// ([`source_of`]; 0, the host's own writers). The lease goes to the
    /// waiters in their order, but past those of the source that held it
    /// last while another source waits (see [`GroupCommit::hand_on`]): so
    /// one client's requests that hold the lease long (a component that
    /// writes, then computes until its deadline) take turns with other
    /// clients' rather than all go first.
    pub fn from(mut self, source: u64) -> Pending {
        self.source = source;
        self
    }
}

/// The source of a request from the client address `ip` (by its key,
/// [`crate::ids::client_key`]: an IPv6 client by its /64): never 0.
pub fn source_of(ip: std::net::IpAddr) -> u64 {
    use std::hash::{BuildHasher, BuildHasherDefault};
    let key = crate::ids::client_key(ip);
    BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default().hash_one(key) | 1
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
            source: 0,
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
        if let Some(me) = self.queue_up(Some(std::thread::current()), pending.source) {
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
        if let Some(me) = self.queue_up(None, pending.source) {
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
    fn queue_up(&self, thread: Option<Thread>, source: u64) -> Option<Arc<Waiter>> {
        let mut s = self.lock();
        if s.leased || !s.queue.is_empty() {
            let me = Waiter::new(thread, source, s.turn);
            s.queue.push_back(me.clone());
            return Some(me);
        }
        s.leased = true;
        Self::served(&mut s, source);
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
        let open_for = s.first_member.map(|t| t.elapsed());
        let commit_now = s.members > 0
            && (!self.settings.enabled
                || s.pending == 0
                || s.members >= self.settings.max_batch
                || lease.alone
                || lease.txn.full()
                || open_for.is_some_and(|open| {
                    open >= self.settings.window.max(OPEN_AT_MOST)
                        || !applied && open >= self.settings.window
                }));
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

    /// Give the lease to the next waiting request, or free it. A batch
    /// left open with nobody on it wakes its members: one of them commits
    /// it should nobody take it on within `window`.
    ///
    /// Sources take turns: each waiter's place is the later of the grant
    /// count when it came and the grant after its source's last one, and
    /// the lowest place goes first (the earlier waiter on a tie). So a
    /// client whose dozens of requests each hold the lease long (up to
    /// their deadline) gets one turn in each round of the clients waiting,
    /// not all its turns before theirs; each source keeps its own order;
    /// and a waiter's place never grows while it waits, while every later
    /// comer's is at least the grant count then: no one starves. With one
    /// source (the host's own writers, a lone client, a benchmark) this is
    /// first come, first served.
    fn hand_on(s: &mut Slot) {
        let next = match s.queue.front() {
            Some(first) if s.queue.iter().any(|w| w.source != first.source) => {
                let place =
                    |w: &Waiter| w.arrived.max(s.served.get(&w.source).map_or(0, |t| t + 1));
                let (i, _) = s
                    .queue
                    .iter()
                    .enumerate()
                    .min_by_key(|(i, w)| (place(w), *i))
                    .expect("a queue with a first");
                s.queue.remove(i)
            }
            _ => s.queue.pop_front(),
        };
        match next {
            // Stays leased: it passes straight to `next`.
            Some(next) => {
                Self::served(s, next.source);
                next.grant()
            }
            None => {
                s.leased = false;
                if s.txn.is_some() {
                    s.outcome.wake();
                }
            }
        }
    }

    /// Count a grant of the lease to `source` (the slot locked). Sources
    /// with no request waiting are forgotten once they are many: one
    /// coming back takes its place as any newcomer does.
    fn served(s: &mut Slot, source: u64) {
        s.turn += 1;
        s.served.insert(source, s.turn);
        if s.served.len() > 64 && s.served.len() > 2 * s.queue.len() {
            let waiting: std::collections::HashSet<u64> =
                s.queue.iter().map(|w| w.source).collect();
            s.served
                .retain(|src, _| *src == source || waiting.contains(src));
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

#[cfg(test)]
mod tests;
