//! redb storage: one table per family keyspace plus the host's own tables.
//!
//! Every request runs in exactly one transaction: a read transaction for
//! GET/HEAD (a snapshot; never blocks writers) or a write transaction for
//! mutations, committed only when the whole request succeeded.

use anyhow::{Context, Result};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition, TableError};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest key a plugin may write.
pub const MAX_KEY_BYTES: usize = 4 * 1024;
/// Largest value a plugin may write (a post with 16 attachments of 512 KiB fits).
pub const MAX_VALUE_BYTES: usize = 16 * 1024 * 1024;

/// Table of one family keyspace.
fn keyspace_table(family: &str) -> String {
    format!("kv:{family}")
}

/// The database plus commit counters.
pub struct Storage {
    db: Database,
    families: Vec<String>,
    commits: AtomicU64,
    syncs: AtomicU64,
}

/// Key/value pairs returned by a scan.
pub type Rows = Vec<(Vec<u8>, Vec<u8>)>;

/// One request's transaction.
#[allow(
    clippy::large_enum_variant,
    reason = "one per request, never moved in a hot loop"
)]
pub enum Txn {
    Read(redb::ReadTransaction),
    Write(redb::WriteTransaction),
}

/// Why a storage operation failed.
#[derive(Debug)]
pub enum StorageError {
    ReadOnly,
    UnknownKeyspace(String),
    TooLarge(String),
    Internal(String),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::ReadOnly => write!(f, "read-only transaction"),
            StorageError::UnknownKeyspace(k) => write!(f, "unknown keyspace {k}"),
            StorageError::TooLarge(m) => write!(f, "too large: {m}"),
            StorageError::Internal(m) => write!(f, "storage: {m}"),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> StorageError {
    StorageError::Internal(e.to_string())
}

impl Storage {
    /// Open (or create) the database and make sure every keyspace exists.
    pub fn open(path: &Path, families: &[&str]) -> Result<Storage> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let db = Database::create(path).with_context(|| format!("opening {}", path.display()))?;
        let txn = db.begin_write()?;
        for family in families {
            let name = keyspace_table(family);
            txn.open_table(TableDefinition::<&[u8], &[u8]>::new(&name))?;
        }
        txn.commit()?;
        Ok(Storage {
            db,
            families: families.iter().map(|s| s.to_string()).collect(),
            commits: AtomicU64::new(0),
            syncs: AtomicU64::new(0),
        })
    }

    /// The database, for the host's own tables (ledger, auth).
    pub fn db(&self) -> &Database {
        &self.db
    }

    /// Whether `family` names a keyspace.
    pub fn has_keyspace(&self, family: &str) -> bool {
        self.families.iter().any(|f| f == family)
    }

    /// Begin a request transaction.
    pub fn begin(&self, write: bool) -> Result<Txn, StorageError> {
        if write {
            self.db.begin_write().map(Txn::Write).map_err(internal)
        } else {
            self.db.begin_read().map(Txn::Read).map_err(internal)
        }
    }

    /// Commit a request's write transaction durably.
    pub fn commit(&self, txn: redb::WriteTransaction) -> Result<(), StorageError> {
        txn.commit().map_err(internal)?;
        self.commits.fetch_add(1, Ordering::Relaxed);
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Committed mutating requests since start.
    pub fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Durable commits (fsyncs) since start.
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Whether a read transaction can be opened.
    pub fn healthy(&self) -> bool {
        self.db.begin_read().is_ok()
    }
}

impl Txn {
    pub fn is_write(&self) -> bool {
        matches!(self, Txn::Write(_))
    }

    /// Read a key of a keyspace.
    pub fn get(&self, family: &str, key: &[u8]) -> Result<Option<Vec<u8>>, StorageError> {
        let name = keyspace_table(family);
        let def = TableDefinition::<&[u8], &[u8]>::new(&name);
        match self {
            Txn::Read(t) => match t.open_table(def) {
                Ok(table) => Ok(table
                    .get(key)
                    .map_err(internal)?
                    .map(|v| v.value().to_vec())),
                Err(TableError::TableDoesNotExist(_)) => Ok(None),
                Err(e) => Err(internal(e)),
            },
            Txn::Write(t) => {
                let table = t.open_table(def).map_err(internal)?;
                Ok(table
                    .get(key)
                    .map_err(internal)?
                    .map(|v| v.value().to_vec()))
            }
        }
    }

    /// Write a key of a keyspace.
    pub fn put(&mut self, family: &str, key: &[u8], value: &[u8]) -> Result<(), StorageError> {
        if key.len() > MAX_KEY_BYTES {
            return Err(StorageError::TooLarge(format!(
                "key over {MAX_KEY_BYTES} bytes"
            )));
        }
        if value.len() > MAX_VALUE_BYTES {
            return Err(StorageError::TooLarge(format!(
                "value over {MAX_VALUE_BYTES} bytes"
            )));
        }
        let Txn::Write(t) = self else {
            return Err(StorageError::ReadOnly);
        };
        let name = keyspace_table(family);
        let mut table = t
            .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
            .map_err(internal)?;
        table.insert(key, value).map_err(internal)?;
        Ok(())
    }

    /// Delete a key of a keyspace; true when it existed.
    pub fn delete(&mut self, family: &str, key: &[u8]) -> Result<bool, StorageError> {
        let Txn::Write(t) = self else {
            return Err(StorageError::ReadOnly);
        };
        let name = keyspace_table(family);
        let mut table = t
            .open_table(TableDefinition::<&[u8], &[u8]>::new(&name))
            .map_err(internal)?;
        let existed = table.remove(key).map_err(internal)?.is_some();
        Ok(existed)
    }

    /// Ordered scan of [start, end), reversed when asked, at most `limit`.
    pub fn scan(
        &self,
        family: &str,
        start: &[u8],
        end: Option<&[u8]>,
        reverse: bool,
        limit: usize,
    ) -> Result<Rows, StorageError> {
        let name = keyspace_table(family);
        let def = TableDefinition::<&[u8], &[u8]>::new(&name);
        match self {
            Txn::Read(t) => match t.open_table(def) {
                Ok(table) => scan_table(&table, start, end, reverse, limit),
                Err(TableError::TableDoesNotExist(_)) => Ok(vec![]),
                Err(e) => Err(internal(e)),
            },
            Txn::Write(t) => {
                let table = t.open_table(def).map_err(internal)?;
                scan_table(&table, start, end, reverse, limit)
            }
        }
    }

    /// Access to the raw write transaction for the host's own tables.
    pub fn write_txn(&self) -> Option<&redb::WriteTransaction> {
        match self {
            Txn::Write(t) => Some(t),
            Txn::Read(_) => None,
        }
    }

    /// Access to the raw read side for the host's own tables.
    pub fn read_txn(&self) -> Option<&redb::ReadTransaction> {
        match self {
            Txn::Read(t) => Some(t),
            Txn::Write(_) => None,
        }
    }
}

fn scan_table<T: ReadableTable<&'static [u8], &'static [u8]>>(
    table: &T,
    start: &[u8],
    end: Option<&[u8]>,
    reverse: bool,
    limit: usize,
) -> Result<Rows, StorageError> {
    use std::ops::Bound;
    let range = (
        Bound::Included(start),
        match end {
            Some(e) => Bound::Excluded(e),
            None => Bound::Unbounded,
        },
    );
    if end.is_some_and(|e| e <= start) {
        return Ok(vec![]);
    }
    let iter = table.range::<&[u8]>(range).map_err(internal)?;
    let mut out = Vec::new();
    let rows: Box<dyn Iterator<Item = _>> = if reverse {
        Box::new(iter.rev().take(limit))
    } else {
        Box::new(iter.take(limit))
    };
    for item in rows {
        let (k, v) = item.map_err(internal)?;
        out.push((k.value().to_vec(), v.value().to_vec()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open() -> (tempfile::TempDir, Storage) {
        let dir = tempfile::tempdir().unwrap();
        let s = Storage::open(&dir.path().join("db.redb"), &["a", "b"]).unwrap();
        (dir, s)
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
}
