//! A mutating request's transaction ([`WriteTxn`]): its writes held in an
//! overlay over the shared batch, within the request's byte budget, read
//! back through it, and put into the batch only when the whole request
//! succeeded.

use super::group_commit::{BatchTxn, GroupCommit, Lease};
use super::kv::{Budget, Kv, RowSink, ValueSink};
use super::{
    MAX_KEY_BYTES, MAX_SHARED_KEY_BYTES, MAX_VALUE_BYTES, Overlay, StorageError, bounds, merge,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) fn apply(lease: &mut Lease, overlay: Overlay) -> Result<(), StorageError> {
    match lease.txn_mut() {
        // Into the batch's writes in memory; the committer writes them.
        BatchTxn::Redb(batch) => {
            for (table, writes) in overlay {
                batch.writes.entry(table).or_default().extend(writes);
            }
            Ok(())
        }
        BatchTxn::Pg(batch) => batch.apply(overlay),
    }
}

/// A mutating request's transaction: reads see the batch plus this
/// request's own writes; writes stay here until [`Storage::commit`].
/// Dropping it discards them and hands the batch on.
pub struct WriteTxn {
    pub(super) lease: Option<Lease>,
    pub(super) overlay: RefCell<Overlay>,
    /// Bytes of keys and values the overlay holds.
    pub(super) held: std::cell::Cell<usize>,
    /// Most bytes the overlay may hold.
    pub(super) budget: usize,
    pub(super) gc: Arc<GroupCommit>,
    /// A read or write lost a race (shared store): the batch is lost and
    /// this request must run again.
    pub(super) conflict: std::cell::Cell<bool>,
    /// It read something (see [`WriteTxn::may_be_stale`]).
    pub(super) read: std::cell::Cell<bool>,
}

impl WriteTxn {
    /// On a shared store, this host's shard of the counters every host
    /// adds to (see [`crate::money::ledger::add_total`]); `None` on the
    /// embedded store, which has one writer.
    pub fn counter_shard(&self) -> Option<u16> {
        match self.lease.as_ref()?.txn() {
            BatchTxn::Pg(lent) => Some(lent.shard()),
            BatchTxn::Redb(_) => None,
        }
    }
}

impl Drop for WriteTxn {
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        if self.conflict.get() || lease.txn().is_aborted() {
            // The shared transaction is aborted: every member runs again.
            self.gc.poison(lease, true);
        } else if let Err(e) = self.gc.release(lease, false) {
            tracing::error!("handing on the batch: {e}");
        }
    }
}

impl WriteTxn {
    fn lease(&self) -> &Lease {
        self.lease
            .as_ref()
            .expect("live until committed or dropped")
    }

    /// Drop every write made so far (committing what is left then only
    /// waits for the batch: a durability barrier for what it read).
    pub fn discard_writes(&self) {
        self.overlay.borrow_mut().clear();
        self.held.set(0);
    }

    /// Whether this request lost a race and must run again.
    pub fn conflicted(&self) -> bool {
        self.conflict.get()
    }

    /// Whether this transaction's batch (on a shared store) began before
    /// `t`, so that what it reads may miss another host's commit
    /// acknowledged before `t` ([`RunAgain::Stale`]).
    pub fn begun_before(&self, t: std::time::Instant) -> bool {
        self.lease.as_ref().is_some_and(|l| l.txn().begun_before(t))
    }

    /// Whether what this transaction read may miss a commit acknowledged
    /// before `t`, so that a refusal made from it is not to be given
    /// ([`RunAgain::Stale`]): it read something, from a batch begun before
    /// `t`. Also when a statement of the batch failed since (the store
    /// went away, or a batch-mate lost a race): what was read is no less
    /// stale for it, and the one run again, in a batch of its own, either
    /// reads afresh or meets the store's failure (503). (Given as it was,
    /// such a refusal told an outside probe, with PostgreSQL stopped and
    /// started under paid load, that the change another host had just
    /// given it was "not known".)
    pub fn may_be_stale(&self, t: std::time::Instant) -> bool {
        self.read.get() && self.begun_before(t)
    }

    /// Note a conflict on the way out.
    fn noted<T>(&self, r: Result<T, StorageError>) -> Result<T, StorageError> {
        if let Err(StorageError::Conflict) = &r {
            self.conflict.set(true);
        }
        r
    }

    /// Write `key` of `table`.
    pub fn put_in(&self, table: &str, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        self.check_row(key, value)?;
        self.write_row(table, key.to_vec(), Some(value.to_vec()))
    }

    /// [`WriteTxn::put_in`] of a key and value the caller hands over (a
    /// component's host call does): not copied again.
    pub fn put_owned(&self, table: &str, key: Vec<u8>, value: Vec<u8>) -> Result<(), StorageError> {
        self.check_row(&key, &value)?;
        self.write_row(table, key, Some(value))
    }

    /// Refuse a row over the limits of one key and one value.
    fn check_row(&self, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        let max_key = self.max_key();
        if key.len() > max_key {
            return Err(StorageError::TooLarge(format!("key over {max_key} bytes")));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(StorageError::TooLarge(format!(
                "value over {MAX_VALUE_BYTES} bytes"
            )));
        }
        Ok(())
    }

    /// The longest key a row of this store may have.
    fn max_key(&self) -> usize {
        match self.lease().txn() {
            BatchTxn::Redb(_) => MAX_KEY_BYTES,
            BatchTxn::Pg(_) => MAX_SHARED_KEY_BYTES,
        }
    }

    /// Put `value` (None: a deletion) at `key` of `table` in the request's
    /// writes, accounted against the request's budget (what it replaces
    /// there no longer counts): refused, and nothing written, when it
    /// would pass it. One lookup of the row; the table's name is copied
    /// only at its first write.
    fn write_row(
        &self,
        table: &str,
        key: Vec<u8>,
        value: Option<Vec<u8>>,
    ) -> Result<(), StorageError> {
        let size = key.len() + value.as_ref().map_or(0, Vec::len);
        let held = self.held.get();
        let fits = |replaced: usize| {
            let next = held - replaced + size;
            if next > self.budget {
                return Err(StorageError::TooLarge(format!(
                    "this request's writes would pass {} bytes",
                    self.budget
                )));
            }
            self.held.set(next);
            Ok(())
        };
        let mut overlay = self.overlay.borrow_mut();
        match overlay.get_mut(table) {
            Some(rows) => match rows.entry(key) {
                std::collections::btree_map::Entry::Occupied(mut row) => {
                    fits(row.key().len() + row.get().as_ref().map_or(0, Vec::len))?;
                    row.insert(value);
                }
                std::collections::btree_map::Entry::Vacant(row) => {
                    fits(0)?;
                    row.insert(value);
                }
            },
            None => {
                fits(0)?;
                overlay.insert(table.to_string(), BTreeMap::from([(key, value)]));
            }
        }
        Ok(())
    }

    /// Delete `key` of `table`; true when it existed.
    pub fn delete_in(&self, table: &str, key: &[u8]) -> Result<bool, StorageError> {
        // A key longer than any row may have names none: nothing to delete,
        // and nothing of it goes to the batch or the write-ahead log.
        if key.len() > self.max_key() {
            return Ok(false);
        }
        let existed = self.get_in(table, key)?.is_some();
        self.write_row(table, key.to_vec(), None)?;
        Ok(existed)
    }
}

impl Kv for WriteTxn {
    /// On a shared store, the keys this request did not write are read in
    /// one round trip.
    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError> {
        self.read.set(true);
        let batch = match self.lease().txn() {
            BatchTxn::Pg(batch) => batch,
            BatchTxn::Redb(batch) => {
                let overlay = self.overlay.borrow();
                return batch.get_many_layered(overlay.get(table), table, keys, max_bytes, out);
            }
        };
        let overlay = self.overlay.borrow();
        let pending = batch.pending();
        // This request's writes, then its batch-mates' (not sent yet).
        let (mine, theirs) = (overlay.get(table), pending.get(table));
        let written = |k: &[u8]| {
            mine.and_then(|m| m.get(k))
                .or_else(|| theirs.and_then(|t| t.get(k)))
        };
        let missing: Vec<Vec<u8>> = keys
            .iter()
            .filter(|k| written(k.as_slice()).is_none())
            .cloned()
            .collect();
        let mut stored = self
            .noted(batch.get_many_within(table, &missing, max_bytes))?
            .into_iter();
        let mut budget = Budget::new(max_bytes);
        for k in keys {
            match written(k.as_slice()) {
                Some(v) => {
                    budget.take(v.as_ref().map_or(0, Vec::len))?;
                    out.value(v.as_deref());
                }
                None => {
                    let v = stored.next().flatten();
                    budget.take(v.as_ref().map_or(0, Vec::len))?;
                    out.owned(v);
                }
            }
        }
        Ok(())
    }

    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        self.read.set(true);
        if let Some(v) = self.overlay.borrow().get(table).and_then(|t| t.get(key)) {
            return Ok(v.clone());
        }
        match self.lease().txn() {
            BatchTxn::Redb(batch) => batch.get_layered(table, key),
            BatchTxn::Pg(batch) => {
                // The batch-mates' writes, not sent before its commit.
                if let Some(v) = batch.pending().get(table).and_then(|t| t.get(key)) {
                    return Ok(v.clone());
                }
                self.noted(batch.get(table, key))
            }
        }
    }

    fn scan_into(
        &self,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
        out: &mut dyn RowSink,
    ) -> Result<(), StorageError> {
        self.read.set(true);
        if end.is_some_and(|e| e <= start) {
            return Ok(());
        }
        let range = bounds(start, end);
        let overlay = self.overlay.borrow();
        let batch = match self.lease().txn() {
            BatchTxn::Redb(batch) => batch,
            BatchTxn::Pg(batch) => {
                // This request's writes over its batch-mates' (not sent
                // yet), in key order.
                let pending = batch.pending();
                let mut written: BTreeMap<&Vec<u8>, &Option<Vec<u8>>> = pending
                    .get(table)
                    .map(|t| t.range::<[u8], _>(range).collect())
                    .unwrap_or_default();
                if let Some(t) = overlay.get(table) {
                    written.extend(t.range::<[u8], _>(range));
                }
                let mut mine: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = written.into_iter().collect();
                if reverse {
                    mine.reverse();
                }
                // Each of this request's writes may hide one stored row;
                // the budget counts only the rows answered.
                let want = limit.saturating_add(mine.len());
                let rows = self.noted(batch.scan_rows(table, start, end, reverse, want))?;
                return self.noted(merge(rows, mine, reverse, limit, max_bytes, out));
            }
        };
        batch.scan_layered(
            Some(&overlay),
            table,
            start,
            end,
            reverse,
            limit,
            max_bytes,
            out,
        )
    }
}
