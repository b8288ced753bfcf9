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
//! batch itself.
//!
//! Readers see a batch only once it is committed, so nothing that is not
//! durable is ever shown.

use super::{Backend, StorageError, pg};
use redb::WriteTransaction;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::Thread;
use std::time::Duration;

/// How commits are grouped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Off: every mutating request commits durably on its own.
    pub enabled: bool,
    /// Longest a member waits for its batch to be committed by a later
    /// member before it commits the batch itself.
    pub window: Duration,
    /// Most requests in one batch.
    pub max_batch: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            enabled: true,
            window: Duration::from_millis(2),
            max_batch: 32,
        }
    }
}

#[derive(Default)]
struct Slot {
    /// The open batch transaction, when no request holds it.
    txn: Option<BatchTxn>,
    /// Id of the newest batch (open, leased or committing).
    batch: u64,
    /// Successful requests applied to the newest batch.
    members: u64,
    /// A request holds the batch transaction.
    leased: bool,
    /// Requests waiting for the lease, served first come first served.
    queue: VecDeque<Arc<Waiter>>,
    /// Mutating requests under way that have not handed on (or never took)
    /// the lease: while there are any, a batch stays open for them.
    pending: u64,
    /// How the newest batch ended, once it has.
    outcome: Arc<Outcome>,
    /// A batch's commit is under way: the next batch begins after it (as
    /// redb makes it; on a shared store a batch begun earlier would read
    /// around the committing one and lose the race to it).
    committing: bool,
    /// Successful mutating requests and durable commits since start.
    commits: u64,
    syncs: u64,
}

/// The coordinator of one database's writers.
pub struct GroupCommit {
    settings: Settings,
    backend: Backend,
    slot: Mutex<Slot>,
    /// Signalled when a batch ends.
    ended: Condvar,
}

/// A request parked until the lease is handed to it.
struct Waiter {
    granted: AtomicBool,
    thread: Thread,
}

/// A mutating request under way, counted until it hands the lease on or
/// ends without taking it.
pub struct Pending {
    gc: Arc<GroupCommit>,
    counted: bool,
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
    Redb(WriteTransaction),
    Pg(pg::Lent),
}

impl BatchTxn {
    fn begin(backend: &Backend) -> Result<BatchTxn, CommitError> {
        match backend {
            Backend::Redb(db) => db
                .begin_write()
                .map(BatchTxn::Redb)
                .map_err(|e| CommitError::fatal(e.to_string())),
            Backend::Pg(store) => store
                .begin_batch()
                .map(BatchTxn::Pg)
                .map_err(CommitError::from),
        }
    }

    /// A shared store's transaction that a failed statement aborted:
    /// nothing of it can be kept.
    pub fn is_aborted(&self) -> bool {
        matches!(self, BatchTxn::Pg(lent) if lent.is_aborted())
    }

    fn commit(self) -> Result<(), CommitError> {
        match self {
            BatchTxn::Redb(txn) => txn.commit().map_err(|e| CommitError::fatal(e.to_string())),
            BatchTxn::Pg(lent) => lent.commit().map_err(CommitError::from),
        }
    }
}

/// How one batch ended: its members read it when they wake.
#[derive(Default)]
struct Outcome(std::sync::atomic::AtomicU8);

impl Outcome {
    const COMMITTED: u8 = 1;
    const FAILED: u8 = 2;
    /// Failed having kept nothing (a shared store's lost race): its
    /// requests may run again.
    const LOST_RACE: u8 = 3;

    fn set(&self, v: u8) {
        self.0.store(v, Ordering::Release);
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
        match self.0.load(Ordering::Acquire) {
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
}

impl Lease {
    pub fn txn(&self) -> &BatchTxn {
        &self.txn
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

impl GroupCommit {
    pub fn new(backend: Backend, settings: Settings) -> Arc<GroupCommit> {
        Arc::new(GroupCommit {
            settings,
            backend,
            slot: Mutex::new(Slot::default()),
            ended: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Slot> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
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
            // The members report a failure themselves.
            let _ = self.commit_batch(
                s,
                Lease {
                    txn,
                    batch,
                    outcome,
                },
                false,
            );
        }
    }

    /// Take the batch transaction for `pending` (waiting for the request
    /// holding it), opening a new batch when none is open.
    pub fn acquire(&self, mut pending: Pending) -> Result<Lease, CommitError> {
        // From here the lease's release (or a failed begin) uncounts it.
        pending.counted = false;
        let mut s = self.lock();
        if s.leased || !s.queue.is_empty() {
            let me = Arc::new(Waiter {
                granted: AtomicBool::new(false),
                thread: std::thread::current(),
            });
            s.queue.push_back(me.clone());
            drop(s);
            while !me.granted.load(Ordering::Acquire) {
                std::thread::park();
            }
            s = self.lock();
        }
        s.leased = true;
        if let Some(txn) = s.txn.take() {
            return Ok(Lease {
                txn,
                batch: s.batch,
                outcome: s.outcome.clone(),
            });
        }
        while s.committing {
            s = self.ended.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        s.batch += 1;
        s.members = 0;
        s.outcome = Arc::new(Outcome::default());
        let (batch, outcome) = (s.batch, s.outcome.clone());
        drop(s);
        // Outside the lock: this waits while the previous batch commits.
        match BatchTxn::begin(&self.backend) {
            Ok(txn) => Ok(Lease {
                txn,
                batch,
                outcome,
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
        let mut s = self.lock();
        s.pending -= 1;
        if applied {
            s.members += 1;
        }
        let commit_now = s.members > 0
            && (!self.settings.enabled || s.pending == 0 || s.members >= self.settings.max_batch);
        if commit_now {
            return self.commit_batch(s, lease, applied);
        }
        if s.members == 0 && s.pending == 0 {
            // Nothing to keep and nobody to hand it to: abort it.
            Self::hand_on(&mut s);
            drop(s);
            drop(lease.txn);
            return Ok(());
        }
        let (batch, outcome) = (lease.batch, lease.outcome);
        s.txn = Some(lease.txn);
        Self::hand_on(&mut s);
        if !applied {
            return Ok(());
        }
        loop {
            if let Some(result) = outcome.result() {
                return result;
            }
            let (next, timeout) = self
                .ended
                .wait_timeout(s, self.settings.window)
                .unwrap_or_else(|p| p.into_inner());
            s = next;
            if timeout.timed_out()
                && !s.leased
                && s.queue.is_empty()
                && s.batch == batch
                && s.txn.is_some()
            {
                // Nobody took the batch on: commit it here.
                let txn = s.txn.take().expect("checked");
                s.leased = true;
                return self.commit_batch(
                    s,
                    Lease {
                        txn,
                        batch,
                        outcome,
                    },
                    true,
                );
            }
        }
    }

    /// Give the lease to the longest waiting request, or free it.
    fn hand_on(s: &mut Slot) {
        match s.queue.pop_front() {
            Some(next) => {
                // Stays leased: it passes straight to `next`.
                next.granted.store(true, Ordering::Release);
                next.thread.unpark();
            }
            None => s.leased = false,
        }
    }

    /// Commit the batch `lease` holds, durably, and wake its members.
    fn commit_batch(
        &self,
        mut s: MutexGuard<'_, Slot>,
        lease: Lease,
        mine: bool,
    ) -> Result<(), CommitError> {
        let members = s.members;
        // The next request opens a new batch once this commit is done.
        Self::hand_on(&mut s);
        s.committing = true;
        drop(s);
        let Lease {
            txn,
            batch,
            outcome,
        } = lease;
        let result = txn.commit();
        let mut s = self.lock();
        s.committing = false;
        match &result {
            Ok(()) => {
                outcome.set(Outcome::COMMITTED);
                s.commits += members;
                s.syncs += 1;
                let m = crate::metrics::metrics();
                m.commits.inc_by(members);
                m.fsyncs.inc();
                m.commit_batch.observe(members as f64);
            }
            Err(e) => {
                if e.retry {
                    tracing::info!(batch, members, "{e}; its requests run again");
                } else {
                    tracing::error!(batch, members, "{e}");
                }
                outcome.set(Outcome::failure(e.retry));
            }
        }
        self.ended.notify_all();
        if mine { result } else { Ok(()) }
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
        self.ended.notify_all();
        drop(s);
        // Its rollback (a round trip on a shared store) outside the lock.
        drop(lease.txn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, ReadableTableMetadata, TableDefinition};

    const T: TableDefinition<u64, u64> = TableDefinition::new("t");

    fn open(settings: Settings) -> (tempfile::TempDir, Arc<Database>, Arc<GroupCommit>) {
        let dir = tempfile::tempdir().unwrap();
        let db = Arc::new(Database::create(dir.path().join("db")).unwrap());
        let gc = GroupCommit::new(Backend::Redb(db.clone()), settings);
        (dir, db, gc)
    }

    fn put(l: &Lease, k: u64) {
        let BatchTxn::Redb(txn) = l.txn() else {
            unreachable!("redb here")
        };
        txn.open_table(T).unwrap().insert(k, k).unwrap();
    }

    fn count(db: &Database) -> u64 {
        let r = db.begin_read().unwrap();
        r.open_table(T).map(|t| t.len().unwrap()).unwrap_or(0)
    }

    #[test]
    fn a_lone_writer_commits_at_once() {
        let (_d, db, gc) = open(Settings::default());
        for k in 0..3 {
            let l = gc.acquire(gc.enter()).unwrap();
            put(&l, k);
            gc.release(l, true).unwrap();
            assert_eq!(count(&db), k + 1, "visible (and durable) on return");
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
                        let l = gc.acquire(gc.enter()).unwrap();
                        put(&l, t * 1000 + i);
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
        assert_eq!(count(&db), 800);
        let s = gc.lock();
        assert_eq!((s.leased, s.pending, s.txn.is_none()), (false, 0, true));
    }

    #[test]
    fn a_failed_batch_mate_hands_on_and_the_batch_still_commits() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_secs(30),
            ..Settings::default()
        });
        let a = gc.acquire(gc.enter()).unwrap();
        put(&a, 1);
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
        assert_eq!(count(&db), 1);
    }

    #[test]
    fn a_stuck_successor_is_bounded_by_the_window() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_millis(20),
            ..Settings::default()
        });
        let a = gc.acquire(gc.enter()).unwrap();
        put(&a, 1);
        // Another request is under way but never takes the lease.
        let stuck = gc.enter();
        gc.release(a, true).unwrap();
        drop(stuck);
        assert_eq!(count(&db), 1);
        assert_eq!(gc.counters(), (1, 1));
    }

    #[test]
    fn a_request_that_never_writes_lets_the_batch_commit() {
        let (_d, db, gc) = open(Settings {
            window: Duration::from_secs(30),
            ..Settings::default()
        });
        let a = gc.acquire(gc.enter()).unwrap();
        put(&a, 1);
        let reader = gc.enter(); // under way; ends without storage
        let gc2 = gc.clone();
        let member = std::thread::spawn(move || gc2.release(a, true));
        while gc.lock().members == 0 {
            std::thread::yield_now();
        }
        assert_eq!(count(&db), 0, "the batch waits for the pending request");
        let started = std::time::Instant::now();
        drop(reader);
        member.join().unwrap().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "waited the window"
        );
        assert_eq!(count(&db), 1);
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
                        let l = gc.acquire(gc.enter()).unwrap();
                        put(&l, t * 100 + i);
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
