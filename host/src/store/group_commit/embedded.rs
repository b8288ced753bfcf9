//! The embedded store's way to disk: closed batches, the committer that
//! logs them, the applier that puts them in the database, checkpoints.

use super::{CommitError, Outcome, Shared, Slot, ended, synced};
use crate::store::Overlay;
use crate::store::key_filter::{KeyFilter, RowHash};
use crate::store::wal::{self, Wal};
use redb::{Database, Durability, ReadTransaction};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Most closed batches waiting for the write-ahead log: the member closing
/// one more waits, still holding the lease, until the committer catches up.
pub(super) const MAX_SEALED: usize = 4;
/// Most closed batches not yet in the database (made durable while a
/// checkpoint runs): bounds the memory they hold the same way.
pub(super) const MAX_HELD: usize = 256;
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

/// The open batch of the embedded store: the writes of its members so far,
/// over a snapshot of what was committed when it opened and the closed
/// batches that were not yet.
pub struct RedbBatch {
    pub(in crate::store) snapshot: ReadTransaction,
    /// Closed batches not on disk when this one opened, oldest first.
    pub(in crate::store) below: Vec<Arc<Sealed>>,
    pub(in crate::store) writes: Overlay,
    /// The snapshot's tables read so far.
    pub(in crate::store) opened: crate::store::OpenTables,
}

impl RedbBatch {
    /// The newest write of `key` in this batch or the closed ones below:
    /// `Some(None)` for a delete, `None` when none of them wrote it.
    pub(in crate::store) fn written(&self, table: &str, key: &[u8]) -> Option<&Option<Vec<u8>>> {
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
    pub(in crate::store) fn layers(&self) -> impl Iterator<Item = &Overlay> {
        self.below
            .iter()
            .map(|b| &b.writes)
            .chain(std::iter::once(&self.writes))
    }
}

/// A closed batch of the embedded store, on its way to disk.
pub(in crate::store) struct Sealed {
    pub(in crate::store) writes: Overlay,
    /// The rows `writes` holds, for reads that look through this batch.
    pub(super) filter: KeyFilter,
    pub(super) batch: u64,
    pub(super) members: u64,
    pub(super) outcome: Arc<Outcome>,
    /// How the batches it read through ended: when one failed, so does it.
    pub(super) below: Vec<Arc<Outcome>>,
    /// The sequence number of the write-ahead log record it is in, once
    /// logged (0 before).
    pub(super) seq: std::sync::atomic::AtomicU64,
}

impl Sealed {
    fn seq(&self) -> u64 {
        self.seq.load(Ordering::Acquire)
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
        let mut t = txn.open_table(crate::store::def(table))?;
        let rows = last_writes(group, table);
        let n = rows.len();
        crate::store::write_sorted(&mut t, &rows)?;
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
pub(super) fn live(sealed: &VecDeque<Arc<Sealed>>) -> Vec<Arc<Sealed>> {
    sealed
        .iter()
        .filter(|b| !b.outcome.failed())
        .cloned()
        .collect()
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
pub(super) fn committer(db: &Arc<Database>, shared: &Arc<Shared>, mut wal: Wal) {
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
    use redb::{Database, ReadableDatabase};

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
}
