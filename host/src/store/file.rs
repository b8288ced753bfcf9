//! The database file: redb's own file backend, plus early writeback.
//!
//! A checkpoint writes the pages dirtied since the one before (thousands,
//! one `pwrite` each) and then syncs the file. Left alone, the kernel
//! sends all of them to the disk at that sync: a burst of tens of
//! megabytes taking 35 ms and more (the ninetieth percentile of a paid
//! run's checkpoint syncs), while the checkpoint holds the batches waiting
//! to be applied. Here every [`WRITEBACK_BYTES`] written starts the
//! kernel's writeback of the file (`sync_file_range` with
//! `SYNC_FILE_RANGE_WRITE`, which does not wait for it), so the disk takes
//! the pages while the checkpoint is still writing them and its sync
//! finds little left. Durability is unchanged: the sync still decides it.

use redb::backends::FileBackend;
use redb::{BackendError, StorageBackend};
use std::fs::File;
use std::io::Error as IoError;
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes written between two starts of the kernel's writeback.
const WRITEBACK_BYTES: u64 = 1 << 20;

#[derive(Debug)]
pub struct DatabaseFile {
    inner: FileBackend,
    #[cfg(target_os = "linux")]
    fd: std::os::fd::RawFd,
    /// Bytes written since the last start of the writeback (or sync).
    unsent: AtomicU64,
    /// Writebacks started (tests).
    #[cfg(test)]
    started: AtomicU64,
}

impl DatabaseFile {
    /// The file at `path`, opened (or created) as redb's `Database::create`
    /// opens it. redb takes its lock when the database is opened on it.
    pub fn open(path: &Path) -> Result<DatabaseFile, IoError> {
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        #[cfg(target_os = "linux")]
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        Ok(DatabaseFile {
            inner: FileBackend::new(file).map_err(IoError::other)?,
            #[cfg(target_os = "linux")]
            fd,
            unsent: AtomicU64::new(0),
            #[cfg(test)]
            started: AtomicU64::new(0),
        })
    }

    /// Start the writeback of the file's dirty pages, without waiting for
    /// it. A failure is the next sync's to report.
    fn start_writeback(&self) {
        #[cfg(test)]
        self.started.fetch_add(1, Ordering::Relaxed);
        #[cfg(target_os = "linux")]
        // SAFETY: `fd` is the descriptor of the file `inner` owns, open as
        // long as `self` is; the call reads no memory of ours.
        unsafe {
            libc::sync_file_range(self.fd, 0, 0, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
}

impl StorageBackend for DatabaseFile {
    fn len(&self) -> Result<u64, IoError> {
        self.inner.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), IoError> {
        self.inner.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), IoError> {
        self.inner.set_len(len)
    }

    fn sync_data(&self) -> Result<(), IoError> {
        self.unsent.store(0, Ordering::Relaxed);
        self.inner.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), IoError> {
        self.inner.write(offset, data)?;
        // One writer (redb writes from its one write transaction at a time).
        let unsent = self.unsent.load(Ordering::Relaxed) + data.len() as u64;
        if unsent >= WRITEBACK_BYTES {
            self.unsent.store(0, Ordering::Relaxed);
            self.start_writeback();
        } else {
            self.unsent.store(unsent, Ordering::Relaxed);
        }
        Ok(())
    }

    fn close(&self) -> Result<(), IoError> {
        self.inner.close()
    }

    // redb's locks (one writer process for the file) are the file
    // backend's own.
    fn try_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: Bound<u64>,
        end: Bound<u64>,
    ) -> Result<bool, BackendError> {
        self.inner.try_lock_shared_range(start, end)
    }

    fn lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_range(start, end)
    }

    fn lock_shared_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.lock_shared_range(start, end)
    }

    fn unlock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<(), BackendError> {
        self.inner.unlock_range(start, end)
    }

    fn query_lock_range(&self, start: Bound<u64>, end: Bound<u64>) -> Result<bool, BackendError> {
        self.inner.query_lock_range(start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redb::{Database, ReadableDatabase, TableDefinition};

    const T: TableDefinition<u64, &[u8]> = TableDefinition::new("t");

    fn open(path: &Path) -> Result<Database, redb::DatabaseError> {
        redb::Builder::new().create_with_backend(DatabaseFile::open(path).unwrap())
    }

    #[test]
    fn writeback_starts_once_a_mebibyte_and_the_sync_counts_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let f = DatabaseFile::open(&dir.path().join("f")).unwrap();
        let page = vec![7u8; 4096];
        // 255 pages: not yet; the 256th: once.
        for i in 0..255 {
            f.write(i * 4096, &page).unwrap();
        }
        assert_eq!(f.started.load(Ordering::Relaxed), 0);
        f.write(255 * 4096, &page).unwrap();
        assert_eq!(f.started.load(Ordering::Relaxed), 1);
        // A sync starts the count again.
        for i in 0..200 {
            f.write(i * 4096, &page).unwrap();
        }
        f.sync_data().unwrap();
        for i in 0..200 {
            f.write(i * 4096, &page).unwrap();
        }
        assert_eq!(f.started.load(Ordering::Relaxed), 1);
        let mut back = vec![0u8; 4096];
        f.read(199 * 4096, &mut back).unwrap();
        assert_eq!(back, page);
    }

    #[test]
    fn a_database_on_it_keeps_what_it_commits_and_one_process_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db.redb");
        let value = vec![0x5au8; 3000];
        {
            let db = open(&path).unwrap();
            // A second writer of the same file is refused, as redb's own
            // file backend refuses it.
            assert!(matches!(
                open(&path),
                Err(redb::DatabaseError::DatabaseAlreadyOpen)
            ));
            // About 6 MB in one commit: several writebacks under way
            // before its sync.
            let txn = db.begin_write().unwrap();
            {
                let mut t = txn.open_table(T).unwrap();
                for k in 0..2000u64 {
                    t.insert(k, value.as_slice()).unwrap();
                }
            }
            txn.commit().unwrap();
        }
        let db = open(&path).unwrap();
        let txn = db.begin_read().unwrap();
        let t = txn.open_table(T).unwrap();
        assert_eq!(redb::ReadableTableMetadata::len(&t).unwrap(), 2000);
        for k in [0u64, 999, 1999] {
            assert_eq!(t.get(k).unwrap().unwrap().value(), value.as_slice());
        }
    }
}
