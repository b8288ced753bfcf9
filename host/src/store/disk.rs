//! The embedded store's disk: writes stop while the data dir's filesystem
//! has less free space than a reserve (`min_free_disk_mib`), so that it
//! never fills. A full disk makes redb refuse the write-ahead log's
//! checkpoint (every write fails from then until a restart) and the next
//! start itself fail on opening the database; with the reserve kept, a
//! checkpoint and a restart still have room, reads go on, and writing
//! requests are refused before they run (503 `disk_full`, nothing spent)
//! until space is freed, as is a large commit that would not fit in the
//! room left ([`Guard::charge`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// How often the free space is read: at the most a write flood can add
/// in this time (a few MB) is what the reserve must hold beyond a
/// checkpoint.
const EVERY: Duration = Duration::from_millis(250);

/// What a checkpoint may write at once, at most: the write-ahead log
/// since the last one (at most `wal::CHECKPOINT_BYTES`) grew the database
/// by up to about 3.5 times its size in a probe.
pub const CHECKPOINT_NEED: u64 = 4 * super::wal::CHECKPOINT_BYTES;

/// What a commit is charged against the room, per byte of its writes.
const COMMIT_COST: u64 = 3;
/// Writes of a commit that passes whatever the room.
const SMALL_COMMIT: u64 = 64 << 10;

pub struct Guard {
    dir: PathBuf,
    reserve: u64,
    free: AtomicU64,
    low: AtomicBool,
    /// Bytes commits were charged since the free space was last read.
    spent: AtomicU64,
    /// Reads the free bytes of a directory's filesystem ([`free_bytes`]).
    reader: fn(&Path) -> std::io::Result<u64>,
}

impl Guard {
    /// Watch `dir`'s filesystem from a thread of its own, refusing writes
    /// while fewer than `reserve` bytes are free (read once before this
    /// returns). `None` for a reserve of 0 (no guard).
    pub fn watch(dir: &Path, reserve: u64) -> Option<Arc<Guard>> {
        if reserve == 0 {
            tracing::warn!(
                "min_free_disk_mib is 0: no disk space is kept free; should the disk fill, a checkpoint fails and every write then fails until a restart"
            );
            return None;
        }
        let guard = Arc::new(Guard::new(dir, reserve, free_bytes));
        guard.read();
        guard.say_if_misfit();
        let watched = Arc::downgrade(&guard);
        let spawned = std::thread::Builder::new()
            .name("disk-guard".into())
            .spawn(move || {
                while let Some(guard) = watched.upgrade() {
                    guard.read();
                    drop(guard);
                    std::thread::sleep(EVERY);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("the free disk space will not be watched: {e}");
        }
        Some(guard)
    }

    fn new(dir: &Path, reserve: u64, reader: fn(&Path) -> std::io::Result<u64>) -> Guard {
        Guard {
            dir: dir.to_path_buf(),
            reserve,
            free: AtomicU64::new(u64::MAX),
            low: AtomicBool::new(false),
            spent: AtomicU64::new(0),
            reader,
        }
    }

    /// Warn at start of a reserve that cannot work as meant: one the whole
    /// filesystem is smaller than (every write refused for good), or one
    /// smaller than a checkpoint may write at once (the write-ahead log's
    /// batches since the last one, copied into the database's pages: up
    /// to about [`CHECKPOINT_NEED`]), which could then fill the disk and
    /// stop every write until a restart.
    fn say_if_misfit(&self) {
        let mib = |b: u64| b >> 20;
        if let Ok(size) = filesystem_bytes(&self.dir)
            && size <= self.reserve
        {
            tracing::warn!(
                size_mib = mib(size),
                reserve_mib = mib(self.reserve),
                "min_free_disk_mib is more than the data dir's whole filesystem: every writing request will be refused"
            );
        } else if self.reserve < CHECKPOINT_NEED {
            tracing::warn!(
                reserve_mib = mib(self.reserve),
                "min_free_disk_mib is less than a checkpoint may write at once (up to about {} MiB): below the reserve a checkpoint could fill the disk, and then every write fails until a restart",
                mib(CHECKPOINT_NEED)
            );
        }
    }

    /// Read the free space now; log when it crosses the reserve. Writes
    /// stop below the reserve and come back above it by a sixteenth more,
    /// so that a disk hovering at the reserve does not flip (and log) four
    /// times a second.
    fn read(&self) {
        let free = match (self.reader)(&self.dir) {
            Ok(free) => free,
            Err(e) => {
                static LINES: crate::logging::Throttle =
                    crate::logging::Throttle::new(Duration::from_secs(60));
                if LINES.note().is_some() {
                    tracing::warn!(dir = %self.dir.display(), "free disk space not read: {e}");
                }
                return;
            }
        };
        self.free.store(free, Ordering::Relaxed);
        // What was charged is on the disk now (or is the checkpoint's, which
        // the charge's multiple and the reserve hold).
        self.spent.store(0, Ordering::Relaxed);
        crate::metrics::metrics()
            .disk_free_bytes
            .set(i64::try_from(free).unwrap_or(i64::MAX));
        let low = if self.low.load(Ordering::Acquire) {
            free < self.reserve.saturating_add(self.reserve / 16)
        } else {
            free < self.reserve
        };
        if self.low.swap(low, Ordering::AcqRel) != low {
            let (free_mib, reserve_mib) = (free >> 20, self.reserve >> 20);
            if low {
                tracing::error!(
                    dir = %self.dir.display(),
                    free_mib,
                    reserve_mib,
                    "the data dir's disk is nearly full: writing requests are refused (503 disk_full) until more than min_free_disk_mib is free; reads go on"
                );
            } else {
                tracing::info!(
                    dir = %self.dir.display(),
                    free_mib,
                    "the data dir's disk has room again: writes are accepted"
                );
            }
        }
    }

    /// Free bytes beyond the reserve, as last read, less what commits were
    /// charged since.
    pub fn room(&self) -> u64 {
        self.beyond_reserve()
            .saturating_sub(self.spent.load(Ordering::Relaxed))
    }

    /// Free bytes beyond the reserve, as last read.
    fn beyond_reserve(&self) -> u64 {
        self.free
            .load(Ordering::Relaxed)
            .saturating_sub(self.reserve)
    }

    /// Charge a commit of `bytes` of writes, if the room left takes it: it
    /// is written to the write-ahead log, then to the database at a
    /// checkpoint, whose copied pages may take as much again
    /// ([`COMMIT_COST`] times its bytes are charged). Between two reads of
    /// the free space, the requests admitted while there was room (each
    /// may hold 64 MiB of writes, many share a batch) would otherwise
    /// write past the reserve. A small commit always passes (a writing
    /// request is refused before it runs while the disk is low): the
    /// operator's mint goes on.
    pub fn charge(&self, bytes: u64) -> bool {
        let cost = bytes.saturating_mul(COMMIT_COST);
        let room = self.beyond_reserve();
        // (Checked and charged at once: two commits at a time do not both
        // take the last of the room.)
        let charged = self
            .spent
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |spent| {
                let fits = room.saturating_sub(spent) >= cost;
                (bytes <= SMALL_COMMIT || fits).then(|| spent.saturating_add(cost))
            });
        if let Err(spent) = charged {
            // Above the reserve, so no alert says it: the refusal (503
            // disk_full) lasts while the room stays under what this write
            // needs.
            static LINES: crate::logging::Throttle =
                crate::logging::Throttle::new(Duration::from_secs(10));
            if let Some(refused) = LINES.note() {
                tracing::warn!(
                    bytes,
                    needs = cost,
                    room = room.saturating_sub(spent),
                    refused_since_last_line = refused,
                    "a write was refused (503 disk_full): it needs {COMMIT_COST} times its bytes free beyond min_free_disk_mib, and fewer are; free space on the data dir's disk"
                );
            }
        }
        charged.is_ok()
    }

    /// Free bytes and the reserve, while fewer than the reserve are free.
    pub fn low(&self) -> Option<(u64, u64)> {
        self.low
            .load(Ordering::Acquire)
            .then(|| (self.free.load(Ordering::Relaxed), self.reserve))
    }
}

/// Bytes an unprivileged writer may still use on `dir`'s filesystem.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The size of `dir`'s filesystem.
fn filesystem_bytes(dir: &Path) -> std::io::Result<u64> {
    let st = rustix::fs::statvfs(dir)?;
    Ok(st.f_blocks.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reserve_beyond_the_free_space_is_low_and_zero_is_no_guard() {
        let dir = tempfile::tempdir().unwrap();
        let free = free_bytes(dir.path()).unwrap();
        assert!(free > 0);
        assert!(Guard::watch(dir.path(), 0).is_none());
        let roomy = Guard::watch(dir.path(), 1).unwrap();
        assert_eq!(roomy.low(), None);
        let full = Guard::watch(dir.path(), u64::MAX).unwrap();
        let (seen, reserve) = full.low().expect("low");
        assert_eq!(reserve, u64::MAX);
        assert!(seen > 0 && seen < u64::MAX);
    }

    static FREE: AtomicU64 = AtomicU64::new(0);

    fn free_now(_: &Path) -> std::io::Result<u64> {
        Ok(FREE.load(Ordering::Relaxed))
    }

    #[test]
    fn writes_stop_under_the_reserve_and_come_back_a_sixteenth_above_it() {
        let guard = Guard::new(Path::new("/"), 1600, free_now);
        let at = |free: u64| {
            FREE.store(free, Ordering::Relaxed);
            guard.read();
            guard.low()
        };
        assert_eq!(at(5000), None);
        assert_eq!(at(1600), None);
        assert_eq!(at(1599), Some((1599, 1600)));
        assert_eq!(at(1600), Some((1600, 1600)), "not yet a sixteenth above");
        assert_eq!(at(1699), Some((1699, 1600)));
        assert_eq!(at(1700), None);
        assert_eq!(at(1650), None, "the margin is only for coming back");
        assert_eq!(at(0), Some((0, 1600)));
    }

    #[test]
    fn large_commits_are_charged_against_the_room_until_the_next_read() {
        static ROOM: AtomicU64 = AtomicU64::new(0);
        fn roomy(_: &Path) -> std::io::Result<u64> {
            Ok(ROOM.load(Ordering::Relaxed))
        }
        let mib = 1 << 20;
        ROOM.store(100 * mib, Ordering::Relaxed);
        let guard = Guard::new(Path::new("/"), 10 * mib, roomy);
        guard.read();
        // 90 MiB of room: a 20 MiB commit costs 60.
        assert!(guard.charge(20 * mib));
        assert_eq!(guard.room(), 30 * mib);
        assert!(!guard.charge(20 * mib), "two would pass the reserve");
        assert!(guard.charge(SMALL_COMMIT), "a small one passes");
        guard.read();
        assert_eq!(guard.room(), 90 * mib, "read again: what the disk says");
        ROOM.store(5 * mib, Ordering::Relaxed);
        guard.read();
        assert_eq!(guard.room(), 0);
        assert!(!guard.charge(SMALL_COMMIT + 1));
        assert!(guard.charge(1));
    }

    #[test]
    fn a_missing_dir_is_an_error_not_a_free_disk() {
        assert!(free_bytes(Path::new("/nonexistent/marketplace/disk")).is_err());
    }
}
