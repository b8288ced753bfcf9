//! Reads: a snapshot of the embedded store seen through the writes not in
//! the database yet (a request's own, its batch's, the closed batches'),
//! and the merge of stored rows with them.

use super::*;

/// Reads of the embedded store through the writes not in the database
/// yet: `mine` (a request's own, newest), then the batch's and the closed
/// batches' (newest first), then the snapshot.
impl RedbBatch {
    pub(super) fn get_layered(
        &self,
        table: &str,
        key: &[u8],
    ) -> Result<Option<Vec<u8>>, StorageError> {
        match self.written(table, key) {
            Some(v) => Ok(v.clone()),
            None => read_one(self.opened.table(&self.snapshot, table)?.as_deref(), key),
        }
    }

    /// One table open for all the keys none of the layers wrote.
    pub(super) fn get_many_layered(
        &self,
        mine: Option<&BTreeMap<Vec<u8>, Option<Vec<u8>>>>,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError> {
        let mut stored = None;
        let mut budget = Budget::new(max_bytes);
        for k in keys {
            let written = mine
                .and_then(|m| m.get(k.as_slice()))
                .or_else(|| self.written(table, k));
            if let Some(v) = written {
                budget.take(v.as_ref().map_or(0, Vec::len))?;
                out.value(v.as_deref());
                continue;
            }
            if stored.is_none() {
                stored = Some(self.opened.table(&self.snapshot, table)?);
            }
            let guard = match stored.as_ref().expect("opened above") {
                Some(t) => t.get(k.as_slice()).map_err(internal)?,
                None => None,
            };
            // Counted before the copy: an over-budget value is never copied.
            budget.take(guard.as_ref().map_or(0, |v| v.value().len()))?;
            out.value(guard.as_ref().map(|v| v.value()));
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn scan_layered(
        &self,
        mine: Option<&Overlay>,
        table: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
        max_bytes: usize,
        out: &mut dyn RowSink,
    ) -> Result<(), StorageError> {
        if end.is_some_and(|e| e <= start) {
            return Ok(());
        }
        let range = bounds(start, end);
        // The writes not yet on disk in the range, newest over oldest: the
        // closed batches', this batch's, this request's.
        let mut written: BTreeMap<&Vec<u8>, &Option<Vec<u8>>> = BTreeMap::new();
        for layer in self.layers().chain(mine) {
            if let Some(t) = layer.get(table) {
                written.extend(t.range::<[u8], _>(range));
            }
        }
        let mut mine: Vec<(&Vec<u8>, &Option<Vec<u8>>)> = written.into_iter().collect();
        if reverse {
            mine.reverse();
        }
        let Some(t) = self.opened.table(&self.snapshot, table)? else {
            return merge(
                std::iter::empty::<Result<(Vec<u8>, Vec<u8>), _>>(),
                mine,
                reverse,
                limit,
                max_bytes,
                out,
            );
        };
        let iter = t
            .range::<&[u8]>(range)
            .map_err(internal)?
            .map(|r| r.map_err(internal));
        let base: Box<dyn Iterator<Item = _>> = if reverse {
            Box::new(iter.rev())
        } else {
            Box::new(iter)
        };
        merge(base, mine, reverse, limit, max_bytes, out)
    }
}

/// A read-only table of byte keys and values.
pub(super) type BytesTable = redb::ReadOnlyTable<&'static [u8], &'static [u8]>;

/// The tables of one snapshot opened so far, each opened once. Opening a
/// table looks its name up in redb's table tree and parses its definition,
/// about as much work as the read itself, and a paid post reads through its
/// batch's snapshot a dozen times.
#[derive(Default)]
pub(super) struct OpenTables(std::sync::Mutex<Vec<(String, Option<Arc<BytesTable>>)>>);

impl OpenTables {
    /// Most tables kept open per snapshot (past them, each read opens its
    /// table again).
    pub(super) const MAX: usize = 32;

    /// `table` of `snapshot` (this snapshot's, always: one `OpenTables`
    /// lives beside one snapshot); `None` when the snapshot has no such
    /// table.
    fn table(
        &self,
        snapshot: &redb::ReadTransaction,
        table: &str,
    ) -> Result<Option<Arc<BytesTable>>, StorageError> {
        let mut open = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, t)) = open.iter().find(|(name, _)| name == table) {
            return Ok(t.clone());
        }
        let t = snapshot_table(snapshot, table)?.map(Arc::new);
        if open.len() < Self::MAX {
            open.push((table.to_string(), t.clone()));
        }
        Ok(t)
    }
}

/// The value at `key` of a snapshot's `table` (`None`: no such table).
pub(super) fn read_one(
    table: Option<&BytesTable>,
    key: &[u8],
) -> Result<Option<Vec<u8>>, StorageError> {
    match table {
        Some(t) => Ok(t.get(key).map_err(internal)?.map(|v| v.value().to_vec())),
        None => Ok(None),
    }
}

/// A table of a batch's snapshot; `None` when it did not exist yet.
pub(super) fn snapshot_table(
    snapshot: &redb::ReadTransaction,
    table: &str,
) -> Result<Option<BytesTable>, StorageError> {
    match snapshot.open_table(def(table)) {
        Ok(t) => Ok(Some(t)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(internal(e)),
    }
}

pub(super) fn bounds<'a>(
    start: &'a [u8],
    end: Option<&'a [u8]>,
) -> (Bound<&'a [u8]>, Bound<&'a [u8]>) {
    (
        Bound::Included(start),
        match end {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        },
    )
}

/// A stored key or value, borrowed from the database or copied out.
pub(super) trait Stored {
    fn bytes(&self) -> &[u8];
}

impl Stored for redb::AccessGuard<'_, &'static [u8]> {
    fn bytes(&self) -> &[u8] {
        self.value()
    }
}

impl Stored for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Merge committed rows with a request's own writes (which win, and whose
/// deletes hide rows), both in scan order, up to `limit`, into `out`.
pub(super) fn merge<I, B>(
    base: I,
    mine: Vec<(&Vec<u8>, &Option<Vec<u8>>)>,
    reverse: bool,
    limit: usize,
    max_bytes: usize,
    out: &mut dyn RowSink,
) -> Result<(), StorageError>
where
    I: Iterator<Item = Result<(B, B), StorageError>>,
    B: Stored,
{
    let mut budget = Budget::new(max_bytes);
    if mine.is_empty() {
        // Nothing written over the committed rows (the usual read): taken
        // as they come, without peeking (a redb row is a pair of page
        // guards, moved on every peek).
        for row in base.take(limit) {
            let (k, v) = row?;
            budget.take(k.bytes().len() + v.bytes().len())?;
            out.row(k.bytes(), v.bytes());
        }
        return Ok(());
    }
    let before = |a: &[u8], b: &[u8]| if reverse { a > b } else { a < b };
    let mut taken = 0;
    let mut base = base.peekable();
    let mut mine = mine.into_iter().peekable();
    /// Which row comes next.
    enum Next {
        Mine,
        /// This request's write of the base row's key (which it hides).
        MineOverBase,
        Base,
        Failed,
    }
    while taken < limit {
        // Decided on the peeked rows in place (no copy of the base key).
        let next = match (base.peek(), mine.peek()) {
            (Some(Err(_)), _) => Next::Failed,
            (None, None) => break,
            (None, Some(_)) => Next::Mine,
            (Some(Ok(_)), None) => Next::Base,
            (Some(Ok((b, _))), Some((m, _))) => {
                if b.bytes() == m.as_slice() {
                    Next::MineOverBase
                } else if before(m, b.bytes()) {
                    Next::Mine
                } else {
                    Next::Base
                }
            }
        };
        let take_mine = match next {
            Next::Failed => return Err(base.next().expect("peeked").err().expect("err")),
            Next::MineOverBase => {
                base.next(); // shadowed by this request's write
                true
            }
            Next::Mine => true,
            Next::Base => false,
        };
        if take_mine {
            let (k, v) = mine.next().expect("peeked");
            if let Some(v) = v {
                budget.take(k.len() + v.len())?;
                out.row(k, v);
                taken += 1;
            }
        } else {
            let (k, v) = base.next().expect("peeked")?;
            budget.take(k.bytes().len() + v.bytes().len())?;
            out.row(k.bytes(), v.bytes());
            taken += 1;
        }
    }
    Ok(())
}

impl Kv for redb::ReadTransaction {
    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        read_one(snapshot_table(self, table)?.as_ref(), key)
    }

    /// One table open for all the keys.
    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError> {
        let Some(t) = snapshot_table(self, table)? else {
            keys.iter().for_each(|_| out.value(None));
            return Ok(());
        };
        let mut budget = Budget::new(max_bytes);
        for k in keys {
            let v = t.get(k.as_slice()).map_err(internal)?;
            // Counted before the copy: an over-budget value is never copied.
            budget.take(v.as_ref().map_or(0, |v| v.value().len()))?;
            out.value(v.as_ref().map(|v| v.value()));
        }
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
        out: &mut dyn RowSink,
    ) -> Result<(), StorageError> {
        if end.is_some_and(|e| e <= start) {
            return Ok(());
        }
        let Some(t) = snapshot_table(self, table)? else {
            return Ok(());
        };
        let iter = t
            .range::<&[u8]>(bounds(start, end))
            .map_err(internal)?
            .map(|r| r.map_err(internal));
        let rows: Box<dyn Iterator<Item = _>> = if reverse {
            Box::new(iter.rev())
        } else {
            Box::new(iter)
        };
        // A snapshot has no writes of its own to merge in.
        merge(rows, Vec::new(), reverse, limit, max_bytes, out)
    }
}

impl Kv for ReadTxn {
    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            ReadTxn::Redb(t) => t.get_layered(table, key),
            ReadTxn::Pg(t) => t.get_in(table, key),
        }
    }

    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError> {
        match self {
            ReadTxn::Redb(t) => t.get_many_layered(None, table, keys, max_bytes, out),
            ReadTxn::Pg(t) => t.get_many_into(table, keys, max_bytes, out),
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
        match self {
            ReadTxn::Redb(t) => {
                t.scan_layered(None, table, start, end, reverse, limit, max_bytes, out)
            }
            ReadTxn::Pg(t) => t.scan_into(table, start, end, reverse, limit, max_bytes, out),
        }
    }
}

impl Kv for Txn {
    fn get_in(&self, table: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        match self {
            Txn::Read(t) => t.get_in(table, key),
            Txn::Write(t) => t.get_in(table, key),
        }
    }

    fn get_many_into(
        &self,
        table: &str,
        keys: &[Vec<u8>],
        max_bytes: usize,
        out: &mut dyn ValueSink,
    ) -> Result<(), StorageError> {
        match self {
            Txn::Read(t) => t.get_many_into(table, keys, max_bytes, out),
            Txn::Write(t) => t.get_many_into(table, keys, max_bytes, out),
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
        match self {
            Txn::Read(t) => t.scan_into(table, start, end, reverse, limit, max_bytes, out),
            Txn::Write(t) => t.scan_into(table, start, end, reverse, limit, max_bytes, out),
        }
    }
}
