//! The write-ahead log of the embedded store.
//!
//! A closed batch is made durable by appending its writes to this log and
//! syncing it (one sequential write and one `fdatasync`), then applied to
//! redb by a non-durable commit, which keeps the pages it dirtied in
//! memory. Every [`CHECKPOINT_AFTER`] (or [`CHECKPOINT_BYTES`] of log)
//! the log goes on in a new segment and, once every record before it is
//! in the database, one durable redb commit (on the applier thread)
//! writes those pages out; then the segments before are removed. So a
//! page that many batches touch (a total, a term's list, the newest
//! posts) is written once per checkpoint instead of once per batch, and a
//! batch's durability costs what its own bytes cost.
//!
//! Segments are `{database}-wal.{first sequence number, 16 hex digits}`.
//! Each record names the log (`id`, kept in the database's `host:meta`
//! under `wal`, with the sequence number of the last record the database
//! holds) and carries a sequence number and a CRC-32. On open, the records
//! after the database's last one are applied in order, as long as they are
//! whole, belong to this database and follow one another without a gap: a
//! torn tail (a crash in the middle of an append), and a segment a crash
//! kept from being removed, are ignored. A record holds final values (puts
//! and deletes), so applying one twice is harmless. A backup (a copy of
//! the tables) does not take the log's id: the copy starts a log of its
//! own.
//!
//! Segments are reused: once checkpointed, the newest segment a checkpoint
//! lets go is renamed `{database}-wal.spare` instead of removed, and the
//! next new segment is that file renamed again, written over from its
//! start. A record written over blocks the file already has needs no
//! change to the file's size or extents, so its sync writes the data
//! alone, without a journal commit of the file system (on this disk a
//! sync beside a checkpoint's writes: p99 0.23 to 0.32 ms in place
//! against 0.42 to 0.60 ms appending; `tests/bench/log_sync.py`). Past
//! the new records, a reused segment holds the old ones: each segment's
//! records are read from its start only while their sequence numbers go
//! on from the one its name gives, and the old records (all before it,
//! all in the database) are never applied nor taken for damage.
//!
//! Record: `MKW1`, payload length (u32 LE), CRC-32 of what follows it,
//! log id (u64 LE), sequence number (u64 LE), then the payload: for each
//! write, 1 (put) or 0 (delete), the table name (u16 LE length), the key
//! (u32 LE length) and, for a put, the value (u32 LE length).

use super::{META_TABLE, Overlay};
use anyhow::{Context, Result};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"MKW1";
const HEADER: usize = 4 + 4 + 4 + 8 + 8;
/// The `host:meta` key of the log's id and the last record applied.
pub const META_KEY: &[u8] = b"wal";
/// A checkpoint once the oldest record not checkpointed is this old (a
/// shorter interval writes more pages in all, a longer one writes them in
/// bursts that hold up the log's syncs on the same disk)...
pub const CHECKPOINT_AFTER: Duration = Duration::from_millis(250);
/// ...or the log is this long.
pub const CHECKPOINT_BYTES: u64 = 64 << 20;

/// After a new segment could not be started (a full disk, say), none is
/// tried again for this long: the log goes on in the current segment.
pub const ROTATE_RETRY: Duration = Duration::from_secs(1);

/// The log's id and the last sequence number the database holds, as kept
/// under [`META_KEY`].
pub fn encode_meta(id: u64, seq: u64) -> [u8; 16] {
    let mut m = [0; 16];
    m[..8].copy_from_slice(&id.to_be_bytes());
    m[8..].copy_from_slice(&seq.to_be_bytes());
    m
}

/// Record in `txn` that the database holds log `id` up to record `seq`.
pub fn record_applied(txn: &redb::WriteTransaction, id: u64, seq: u64) -> Result<()> {
    txn.open_table(super::def(META_TABLE))?
        .insert(META_KEY, encode_meta(id, seq).as_slice())?;
    Ok(())
}

pub fn decode_meta(bytes: &[u8]) -> Option<(u64, u64)> {
    let m: &[u8; 16] = bytes.try_into().ok()?;
    Some((
        u64::from_be_bytes(m[..8].try_into().ok()?),
        u64::from_be_bytes(m[8..].try_into().ok()?),
    ))
}

/// The base path of the log of the database at `db`; its segments are
/// `{base}.{first sequence number, 16 hex digits}`.
pub fn path_for(db: &Path) -> PathBuf {
    let mut name = db.file_name().unwrap_or_default().to_os_string();
    name.push("-wal");
    db.with_file_name(name)
}

/// Every file of the log of the database at `db` (its segments, the spare,
/// any kept aside as damaged): what the data dir's owner alone may read.
pub fn files(db: &Path) -> Vec<PathBuf> {
    files_of(&path_for(db))
        .map(|files| files.into_iter().map(|(_, path)| path).collect())
        .unwrap_or_default()
}

/// The files beside the log at `base` whose names continue its own
/// (`{base}.{rest}`), as `(rest, path)`; none when the directory is not
/// there.
fn files_of(base: &Path) -> Result<Vec<(String, PathBuf)>> {
    let dir = base.parent().unwrap_or(Path::new("."));
    let prefix = format!(
        "{}.",
        base.file_name().unwrap_or_default().to_string_lossy()
    );
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if let Some(rest) = name.strip_prefix(&prefix) {
            out.push((rest.to_string(), entry.path()));
        }
    }
    Ok(out)
}

/// The first sequence number a segment's name suffix gives (16 hex
/// digits), if it is one.
fn segment_first(rest: &str) -> Option<u64> {
    (rest.len() == 16)
        .then(|| u64::from_str_radix(rest, 16).ok())
        .flatten()
}

/// The segments of the log at `base`, oldest first, with their first
/// sequence numbers.
fn segments(base: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut out: Vec<(u64, PathBuf)> = files_of(base)?
        .into_iter()
        .filter_map(|(rest, path)| Some((segment_first(&rest)?, path)))
        .collect();
    out.sort();
    Ok(out)
}

pub(super) fn segment_path(base: &Path, first: u64) -> PathBuf {
    let mut name = base.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".{first:016x}"));
    base.with_file_name(name)
}

/// Where a segment whose records are all in the database waits to be
/// written over as the next new one.
fn spare_path(base: &Path) -> PathBuf {
    let mut name = base.file_name().unwrap_or_default().to_os_string();
    name.push(".spare");
    base.with_file_name(name)
}

/// Let go of the segments of the log at `base` that hold only records
/// before `seq` (the database holds them durably).
pub fn remove_before(base: &Path, seq: u64) -> Result<()> {
    let all = segments(base)?;
    // A segment ends where the next one begins.
    let done = all
        .iter()
        .enumerate()
        .filter(|(i, _)| all.get(i + 1).is_some_and(|(next, _)| *next <= seq))
        .map(|(_, (_, path))| path.clone())
        .collect();
    let_go(base, done)
}

/// Of `done` (segments, oldest first, whose records are all in the
/// database): the newest becomes the spare (see the module's doc), the
/// others are removed.
fn let_go(base: &Path, mut done: Vec<PathBuf>) -> Result<()> {
    if let Some(newest) = done.pop() {
        // A crash before the new name lasts leaves the segment where it
        // was: a leftover that recovery skips.
        if std::fs::rename(&newest, spare_path(base)).is_err() {
            done.push(newest);
        }
    }
    for path in done {
        std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

/// One write of a record: table, key, and the value (None: a delete).
pub type Write = (String, Vec<u8>, Option<Vec<u8>>);

/// A segment whose whole records go on past a damaged record or a gap:
/// what a crash cannot leave (it tears at most the last record).
#[derive(Debug)]
pub struct Damaged {
    pub path: PathBuf,
    /// Its length, and where its whole records from the start end.
    pub bytes: usize,
    pub whole_to: usize,
    /// Whole records in it after the last one applied, not applied.
    pub not_applied: usize,
}

/// What the log at `base` holds for a database holding up to `applied` of
/// log `id`: the records to apply, each one's writes, in order; and the
/// damaged segments (see [`keep_aside`]). Reads only.
pub type Recovered = (Vec<(u64, Vec<Write>)>, Vec<Damaged>);

/// Read the log at `base` for a database holding up to `applied` of log
/// `id` (see [`Recovered`]). Whole records after the point where applying
/// stops (a damaged record before them, or a gap) mean the log was
/// damaged: what they held, answered once, is not in the database.
pub fn recover(base: &Path, id: u64, applied: u64) -> Result<Recovered> {
    /// What one segment held: the sequence numbers of its whole records
    /// from its start, where they end, and those of whole records found
    /// past that point.
    struct Read {
        path: PathBuf,
        seqs: Vec<u64>,
        end: usize,
        len: usize,
        beyond: Vec<u64>,
    }
    let mut read = Vec::new();
    let mut chain = Vec::new();
    for (first, path) in segments(base)? {
        let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        let (records, end) = decode_all(&bytes, id, first);
        read.push(Read {
            seqs: records.iter().map(|(seq, _)| *seq).collect(),
            // From `end` itself: the record there may be whole but out of
            // order (damage) or from the segment's earlier use.
            beyond: whole_records_in(bytes.get(end..).unwrap_or_default(), id),
            path,
            end,
            len: bytes.len(),
        });
        chain.extend(records);
    }
    let out = records_after(chain, applied);
    let last = out.last().map_or(applied, |(seq, _)| *seq);
    let damaged = read
        .into_iter()
        .filter_map(|segment| {
            let not_applied = segment
                .seqs
                .iter()
                .chain(&segment.beyond)
                .filter(|seq| **seq > last)
                .count();
            (not_applied > 0).then_some(Damaged {
                path: segment.path,
                bytes: segment.len,
                whole_to: segment.end,
                not_applied,
            })
        })
        .collect();
    Ok((out, damaged))
}

/// Once the records [`recover`] found are durably in the database: log each
/// damaged segment as an error and keep it aside as `{segment}.damaged`
/// (`.damaged.1`, ... when that name is taken), where no log reads or
/// removes it, for the operator.
pub fn keep_aside(damaged: &[Damaged], database_holds_to: u64) {
    for segment in damaged {
        let aside = (0..)
            .map(|n| {
                let mut name = segment.path.clone().into_os_string();
                name.push(if n == 0 {
                    ".damaged".to_string()
                } else {
                    format!(".damaged.{n}")
                });
                PathBuf::from(name)
            })
            .find(|name| !name.exists())
            .expect("a free name");
        let kept = std::fs::rename(&segment.path, &aside).and_then(|()| {
            let dir = aside.parent().unwrap_or(Path::new("."));
            File::open(dir).and_then(|d| d.sync_all())
        });
        let where_kept = match &kept {
            Ok(()) => format!("the segment is kept as {}", aside.display()),
            Err(e) => format!("the segment could not be moved aside ({e})"),
        };
        let message = format!(
            "the write-ahead log segment {} was damaged: {} records after its byte {} were not applied (answered requests this database does not hold); restore a backup to recover them; {where_kept}",
            segment.path.display(),
            segment.not_applied,
            segment.whole_to,
        );
        tracing::error!(
            segment = %segment.path.display(),
            bytes = segment.bytes,
            whole_records_end_at = segment.whole_to,
            records_not_applied = segment.not_applied,
            database_holds_to,
            kept_as = %aside.display(),
            kept = kept.is_ok(),
            "{message}"
        );
        crate::alerts::raise(crate::alerts::Kind::WalDamaged, message);
    }
}

/// Raise the alert again for each segment an earlier start (a `serve`, or
/// an offline `backup` or `cash mint` on the data dir) kept aside as
/// damaged: what it held past its damage is still not in the database, so
/// every start says so, until the operator removes the kept file. Call it
/// before [`keep_aside`] of this start's own.
pub fn alert_kept_earlier(base: &Path) {
    // What `keep_aside` names them: `{segment}.damaged`, `.damaged.{n}`.
    let kept_aside = |rest: &str| {
        rest.split_once(".damaged").is_some_and(|(segment, n)| {
            segment_first(segment).is_some()
                && (n.is_empty()
                    || n.strip_prefix('.')
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())))
        })
    };
    let mut kept: Vec<PathBuf> = files_of(base)
        .unwrap_or_default()
        .into_iter()
        .filter(|(rest, _)| kept_aside(rest))
        .map(|(_, path)| path)
        .collect();
    kept.sort();
    for path in kept {
        let message = format!(
            "the write-ahead log segment {} was kept aside as damaged by an earlier start: the answered requests it held past its damage are not in this database (that start's log said how many); restore a backup to recover them, then remove the file to clear this alert",
            path.display()
        );
        tracing::error!(segment = %path.display(), "{message}");
        crate::alerts::raise(crate::alerts::Kind::WalDamaged, message);
    }
}

/// The whole records of log `id` at the start of `bytes` (a segment
/// whose first record is `first`) that follow one another from `first`
/// on, and where they end. What comes after them in a reused segment are
/// records of its earlier use, with sequence numbers before `first`.
fn decode_all(bytes: &[u8], id: u64, first: u64) -> (Vec<(u64, Vec<Write>)>, usize) {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((seq, writes, len)) = decode(&bytes[at..], id) {
        if seq != first + out.len() as u64 {
            break;
        }
        at += len;
        out.push((seq, writes));
    }
    (out, at)
}

/// The sequence numbers of whole records of log `id` anywhere in `bytes`
/// (searched at every `MKW1`): past a damaged record, what a crash cannot
/// have left.
fn whole_records_in(bytes: &[u8], id: u64) -> Vec<u64> {
    let mut seqs = Vec::new();
    let mut at = 0;
    while let Some(found) = bytes[at..].windows(4).position(|w| w == MAGIC) {
        let start = at + found;
        match decode(&bytes[start..], id) {
            Some((seq, _, len)) => {
                seqs.push(seq);
                at = start + len;
            }
            None => at = start + 1,
        }
    }
    seqs
}

/// Of `chain` (records in the order the segments hold them), those after
/// `applied` that follow one another without a gap.
fn records_after(chain: Vec<(u64, Vec<Write>)>, applied: u64) -> Vec<(u64, Vec<Write>)> {
    let mut out = Vec::new();
    let mut expect = applied + 1;
    for (seq, writes) in chain {
        if seq < expect && out.is_empty() {
            // Already in the database (its segment was not removed yet).
            continue;
        }
        if seq != expect {
            break;
        }
        out.push((seq, writes));
        expect += 1;
    }
    out
}

/// The record at the start of `bytes`: its sequence number, its writes and
/// its length; None when it is not a whole record of log `id`.
fn decode(bytes: &[u8], id: u64) -> Option<(u64, Vec<Write>, usize)> {
    let header = bytes.get(..HEADER)?;
    if &header[..4] != MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().ok()?) as usize;
    let crc = u32::from_le_bytes(header[8..12].try_into().ok()?);
    let body = bytes.get(12..HEADER + len)?;
    if crc32fast::hash(body) != crc {
        return None;
    }
    if u64::from_le_bytes(body[..8].try_into().ok()?) != id {
        return None;
    }
    let seq = u64::from_le_bytes(body[8..16].try_into().ok()?);
    let mut p = &body[16..];
    let mut writes = Vec::new();
    fn take<'a>(p: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = p.split_at_checked(n)?;
        *p = rest;
        Some(head)
    }
    fn len_of(p: &mut &[u8], width: usize) -> Option<usize> {
        let b = take(p, width)?;
        Some(match width {
            2 => u16::from_le_bytes(b.try_into().ok()?) as usize,
            _ => u32::from_le_bytes(b.try_into().ok()?) as usize,
        })
    }
    while !p.is_empty() {
        let put = match take(&mut p, 1)?[0] {
            0 => false,
            1 => true,
            _ => return None,
        };
        let n = len_of(&mut p, 2)?;
        let table = String::from_utf8(take(&mut p, n)?.to_vec()).ok()?;
        let n = len_of(&mut p, 4)?;
        let key = take(&mut p, n)?.to_vec();
        let value = if put {
            let n = len_of(&mut p, 4)?;
            Some(take(&mut p, n)?.to_vec())
        } else {
            None
        };
        writes.push((table, key, value));
    }
    Some((seq, writes, HEADER + len))
}

/// The log, appended to by the committer thread only.
pub struct Wal {
    file: File,
    base: PathBuf,
    id: u64,
    /// Sequence number of the next record.
    next: u64,
    /// Bytes in the current segment (where the next record goes).
    len: u64,
    /// When the oldest record not checkpointed was appended.
    since: Option<Instant>,
    /// After a failed rotation: no new one is tried before this.
    retry_at: Option<Instant>,
    buf: Vec<u8>,
}

impl Wal {
    /// Start the log at `base` afresh for a database that holds every
    /// record up to `applied` of log `id`: the newest segment becomes the
    /// spare (and so the new segment, written over), the others are
    /// removed.
    pub fn create(base: &Path, id: u64, applied: u64) -> Result<Wal> {
        let_go(base, segments(base)?.into_iter().map(|(_, p)| p).collect())?;
        let next = applied + 1;
        Ok(Wal {
            file: Self::segment(base, next)?,
            base: base.to_path_buf(),
            id,
            next,
            len: 0,
            since: None,
            retry_at: None,
            buf: Vec::new(),
        })
    }

    /// A new segment whose first record is `first`: the spare, renamed,
    /// when there is one (written over from its start), else an empty file.
    fn segment(base: &Path, first: u64) -> Result<File> {
        let path = segment_path(base, first);
        let reused = std::fs::rename(spare_path(base), &path).is_ok();
        let mut options = File::options();
        options
            .read(true)
            .write(true)
            .create(!reused)
            .truncate(!reused);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let file = options
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        // The new name must last, or a crash could lose the records
        // synced into it.
        if let Some(dir) = path.parent() {
            File::open(dir)
                .and_then(|d| d.sync_all())
                .with_context(|| format!("syncing {}", dir.display()))?;
        }
        Ok(file)
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn base(&self) -> &Path {
        &self.base
    }

    /// Sequence number of the next record.
    pub fn next_seq(&self) -> u64 {
        self.next
    }

    /// Append the writes of `layers` (oldest first; a later write of a key
    /// wins) as the next record and sync it. On failure the log is cut
    /// back to what it was (and if even that fails, the process stops: the
    /// record's fate would be unknown).
    pub fn append<'a>(&mut self, layers: impl Iterator<Item = &'a Overlay>) -> Result<()> {
        self.buf.clear();
        self.buf.extend_from_slice(MAGIC);
        self.buf.extend_from_slice(&[0; 8]);
        self.buf.extend_from_slice(&self.id.to_le_bytes());
        self.buf.extend_from_slice(&self.next.to_le_bytes());
        for overlay in layers {
            for (table, rows) in overlay {
                for (key, value) in rows {
                    self.buf.push(value.is_some() as u8);
                    self.buf
                        .extend_from_slice(&(table.len() as u16).to_le_bytes());
                    self.buf.extend_from_slice(table.as_bytes());
                    self.buf
                        .extend_from_slice(&(key.len() as u32).to_le_bytes());
                    self.buf.extend_from_slice(key);
                    if let Some(v) = value {
                        self.buf.extend_from_slice(&(v.len() as u32).to_le_bytes());
                        self.buf.extend_from_slice(v);
                    }
                }
            }
        }
        // A record's length is 32 bits: one past them fails its batch
        // before anything is written (never a wrong length, whose record
        // the next start would refuse with the acknowledged ones after it).
        let Ok(payload) = u32::try_from(self.buf.len() - HEADER) else {
            anyhow::bail!(
                "a write-ahead log record of {} bytes is past the 4 GiB a record may hold: its batch is not written",
                self.buf.len()
            );
        };
        self.buf[4..8].copy_from_slice(&payload.to_le_bytes());
        let crc = crc32fast::hash(&self.buf[12..]);
        self.buf[8..12].copy_from_slice(&crc.to_le_bytes());
        let written = self
            .file
            .write_all_at(&self.buf, self.len)
            .and_then(|()| self.file.sync_data());
        if let Err(e) = written {
            // Cut back what may have reached the file, so that the record
            // is never applied.
            if let Err(cut) = self
                .file
                .set_len(self.len)
                .and_then(|()| self.file.sync_all())
            {
                // The record may be whole on disk, to be applied at the
                // next start, while its requests would be told it failed:
                // stop before anyone is told anything.
                tracing::error!(
                    log = %self.base.display(),
                    "the write-ahead log could not be cut back after a failed write ({cut}); stopping: the next start applies what it holds"
                );
                crate::logging::flush();
                std::process::abort();
            }
            return Err(e).with_context(|| format!("writing {}", self.base.display()));
        }
        self.len += self.buf.len() as u64;
        self.next += 1;
        self.since.get_or_insert_with(Instant::now);
        Ok(())
    }

    /// Whether a checkpoint is due.
    pub fn due(&self) -> bool {
        self.len >= CHECKPOINT_BYTES || self.since.is_some_and(|t| t.elapsed() >= CHECKPOINT_AFTER)
    }

    /// Whether a new segment may be tried: none failed in the last
    /// [`ROTATE_RETRY`].
    pub fn may_rotate(&self) -> bool {
        self.retry_at.is_none_or(|at| Instant::now() >= at)
    }

    /// Whether records wait for a checkpoint.
    pub fn pending(&self) -> bool {
        self.since.is_some()
    }

    /// Go on in a new segment; returns its first sequence number (the
    /// segments before it can go once the database holds every record
    /// before that durably).
    /// On failure the log goes on in the current segment, and
    /// [`Wal::may_rotate`] says no for [`ROTATE_RETRY`].
    pub fn rotate(&mut self) -> Result<u64> {
        let file = Self::segment(&self.base, self.next).inspect_err(|_| {
            self.retry_at = Some(Instant::now() + ROTATE_RETRY);
        })?;
        self.file = file;
        self.retry_at = None;
        self.len = 0;
        self.since = None;
        Ok(self.next)
    }

    /// A checkpoint failed: its records wait for the next one.
    pub fn retry_later(&mut self) {
        self.since.get_or_insert_with(Instant::now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overlay(rows: &[(&str, &str, Option<&str>)]) -> Overlay {
        let mut o = Overlay::new();
        for (t, k, v) in rows {
            o.entry(t.to_string())
                .or_default()
                .insert(k.as_bytes().to_vec(), v.map(|v| v.as_bytes().to_vec()));
        }
        o
    }

    fn put(wal: &mut Wal, value: &str) {
        wal.append([&overlay(&[("t", "k", Some(value))])].into_iter())
            .unwrap();
    }

    /// A log (id 1) in a temporary dir, holding records 1 to `n` with
    /// the values `v0`, `v1`...
    fn log_with(n: usize) -> (tempfile::TempDir, PathBuf, Wal) {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("db-wal");
        let mut wal = Wal::create(&base, 1, 0).unwrap();
        for i in 0..n {
            put(&mut wal, &format!("v{i}"));
        }
        (dir, base, wal)
    }

    fn values(records: &[(u64, Vec<Write>)]) -> Vec<String> {
        records
            .iter()
            .map(|(_, w)| String::from_utf8(w[0].2.clone().unwrap()).unwrap())
            .collect()
    }

    #[test]
    fn records_read_back_in_order_with_puts_and_deletes() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("db-wal");
        let mut wal = Wal::create(&base, 7, 0).unwrap();
        let a = overlay(&[("t", "a", Some("1")), ("u", "b", None)]);
        let b = overlay(&[("t", "a", Some("2"))]);
        wal.append([&a].into_iter()).unwrap();
        wal.append([&b, &a].into_iter()).unwrap();
        let records = recover(&base, 7, 0).unwrap().0;
        let seqs: Vec<u64> = records.iter().map(|r| r.0).collect();
        assert_eq!(seqs, [1, 2]);
        assert_eq!(
            records[0].1,
            vec![
                ("t".into(), b"a".to_vec(), Some(b"1".to_vec())),
                ("u".into(), b"b".to_vec(), None),
            ]
        );
        assert_eq!(records[1].1.len(), 3);
        // What the database holds already is not applied again; another
        // log's records never are.
        assert_eq!(recover(&base, 7, 1).unwrap().0.len(), 1);
        assert!(recover(&base, 7, 2).unwrap().0.is_empty());
        assert!(recover(&base, 8, 0).unwrap().0.is_empty());
    }

    #[test]
    fn a_torn_or_corrupt_tail_is_ignored() {
        let (_dir, base, _wal) = log_with(3);
        let segment = segment_path(&base, 1);
        let bytes = std::fs::read(&segment).unwrap();
        for cut in 0..bytes.len() {
            std::fs::write(&segment, &bytes[..cut]).unwrap();
            let records = recover(&base, 1, 0).unwrap().0;
            // Whole records only, in order, and all of them at the end.
            let seqs: Vec<u64> = records.iter().map(|r| r.0).collect();
            assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());
            assert!(seqs.len() < 3);
        }
        let mut flipped = bytes.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        std::fs::write(&segment, &flipped).unwrap();
        assert_eq!(values(&recover(&base, 1, 0).unwrap().0), ["v0", "v1"]);
        // What a crash leaves is no damage.
        assert!(recover(&base, 1, 0).unwrap().1.is_empty());
    }

    #[test]
    fn whole_records_after_a_damaged_one_are_kept_aside() {
        let (dir, base, _wal) = log_with(5);
        let segment = segment_path(&base, 1);
        let bytes = std::fs::read(&segment).unwrap();
        // One byte of the second record's payload flipped: records 3 to 5
        // are whole but cannot be applied after it.
        let mut flipped = bytes.clone();
        flipped[bytes.len() * 2 / 5 - 2] ^= 1;
        std::fs::write(&segment, &flipped).unwrap();
        let (records, damaged) = recover(&base, 1, 0).unwrap();
        assert_eq!(values(&records), ["v0"]);
        assert_eq!(damaged.len(), 1);
        assert_eq!(damaged[0].not_applied, 3);
        // Reading changed nothing; keeping it aside moves it.
        assert_eq!(std::fs::read(&segment).unwrap(), flipped);
        keep_aside(&damaged, 1);
        let mut aside = segment.clone().into_os_string();
        aside.push(".damaged");
        assert!(!segment.exists());
        assert_eq!(std::fs::read(&aside).unwrap(), flipped);
        // The operator's monitor sees it too (health's alerts, a gauge).
        let named = aside.to_string_lossy().into_owned();
        assert!(
            crate::alerts::all()
                .iter()
                .any(|a| a.kind == crate::alerts::Kind::WalDamaged
                    && a.message.contains(&named)
                    && a.message.contains("3 records")),
            "{:?}",
            crate::alerts::all()
        );
        // Kept aside, it is neither read again nor removed by a new log,
        // and a later one of the same name is kept beside it.
        assert!(segments(&base).unwrap().is_empty());
        Wal::create(&base, 1, 0).unwrap();
        assert!(std::path::Path::new(&aside).exists());
        std::fs::write(&segment, &flipped).unwrap();
        let (_, damaged) = recover(&base, 1, 0).unwrap();
        keep_aside(&damaged, 1);
        let mut second = aside.clone();
        second.push(".1");
        assert!(std::path::Path::new(&second).exists());
        assert_eq!(std::fs::read(&aside).unwrap(), flipped);
        // A later start (after an offline `backup` kept them, say) raises
        // the alert again for each, until the operator removes the file.
        let earlier = |name: &str| {
            crate::alerts::all()
                .iter()
                .filter(|a| {
                    a.kind == crate::alerts::Kind::WalDamaged
                        && a.message.contains("by an earlier start")
                        && a.message.contains(name)
                })
                .count()
        };
        let (first, second) = (named, second.to_string_lossy().into_owned());
        assert_eq!((earlier(&first), earlier(&second)), (0, 0));
        // Not a kept segment: a log segment, and other files.
        std::fs::write(dir.path().join("db-wal.damaged"), b"").unwrap();
        std::fs::write(format!("{first}.x"), b"").unwrap();
        alert_kept_earlier(&base);
        // `{first}` is also a prefix of `{second}`: one message each.
        assert_eq!(
            earlier(&format!("{first} ")),
            1,
            "{:?}",
            crate::alerts::all()
        );
        assert_eq!(
            earlier(&format!("{second} ")),
            1,
            "{:?}",
            crate::alerts::all()
        );
        assert_eq!(earlier(".x "), 0);
        std::fs::remove_file(&aside).unwrap();
        std::fs::remove_file(&second).unwrap();
        alert_kept_earlier(&base);
        assert_eq!(earlier(&format!("{first} ")), 1);
    }

    fn inode(path: &Path) -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap())
    }

    #[test]
    fn a_checkpointed_segment_is_written_over_as_the_next_one() {
        let (_dir, base, mut wal) = log_with(6);
        let first = segment_path(&base, 1);
        let old_len = std::fs::metadata(&first).unwrap().len();
        let (old_ino, old_bytes) = (inode(&first), std::fs::read(&first).unwrap());
        let second = wal.rotate().unwrap();
        put(&mut wal, "second");
        // The checkpoint lets the first segment go: it waits as the spare,
        // not read by recovery.
        remove_before(&base, second).unwrap();
        assert!(!first.exists());
        assert_eq!(inode(&spare_path(&base)), old_ino);
        let left: Vec<u64> = segments(&base).unwrap().iter().map(|s| s.0).collect();
        assert_eq!(left, [second]);
        // The next segment is that file, written from its start: fewer
        // records than it held, so the old ones follow the new.
        let third = wal.rotate().unwrap();
        let reused = segment_path(&base, third);
        assert_eq!(inode(&reused), old_ino);
        put(&mut wal, "third-a");
        put(&mut wal, "third-b");
        assert_eq!(std::fs::metadata(&reused).unwrap().len(), old_len);
        // The database holds 1..=6 (checkpointed): from 7 on, in order,
        // and the old records are neither applied nor damage.
        let (records, damaged) = recover(&base, 1, 6).unwrap();
        assert_eq!(values(&records), ["second", "third-a", "third-b"]);
        assert!(damaged.is_empty(), "{damaged:?}");

        // Every point where a crash can tear the record being written over
        // the old ones: the whole records before it are applied, in order,
        // and nothing is taken for damage.
        let now = std::fs::read(&reused).unwrap();
        let (recs, new_end) = decode_all(&now, 1, third);
        assert_eq!(recs.len(), 2);
        for cut in 0..new_end {
            let mut torn = now[..cut].to_vec();
            torn.extend_from_slice(&old_bytes[cut..]);
            std::fs::write(&reused, &torn).unwrap();
            let (records, damaged) = recover(&base, 1, 6).unwrap();
            let got = values(&records);
            let all = ["second", "third-a", "third-b"];
            assert!(
                !got.is_empty() && got[..] == all[..got.len()],
                "cut {cut}: {got:?}"
            );
            assert!(damaged.is_empty(), "cut {cut}: {damaged:?}");
        }
        // A new record that ends where an old one begins: the old one is
        // not read as the next.
        let mut aligned = now[..new_end].to_vec();
        let mut old_at = 0;
        while old_at < new_end {
            old_at += decode(&old_bytes[old_at..], 1).unwrap().2;
        }
        aligned.extend_from_slice(&old_bytes[old_at..]);
        std::fs::write(&reused, &aligned).unwrap();
        // Nor does the segment after it look like one after a gap.
        wal.rotate().unwrap();
        put(&mut wal, "fourth");
        let (records, damaged) = recover(&base, 1, 6).unwrap();
        assert_eq!(values(&records), ["second", "third-a", "third-b", "fourth"]);
        assert!(damaged.is_empty(), "{damaged:?}");
        // Starting afresh keeps one segment as the spare, removes the rest.
        let newest = inode(&segment_path(&base, 10));
        Wal::create(&base, 1, 10).unwrap();
        let left: Vec<u64> = segments(&base).unwrap().iter().map(|s| s.0).collect();
        assert_eq!(left, [11]);
        assert_eq!(inode(&segment_path(&base, 11)), newest);
        assert!(!spare_path(&base).exists());
    }

    #[test]
    fn a_whole_record_out_of_order_is_damage_not_old() {
        let (_dir, base, _wal) = log_with(3);
        // Record 2 lost from the middle of the segment: 3 is whole, after
        // the database's last record, and cannot be applied.
        let segment = segment_path(&base, 1);
        let bytes = std::fs::read(&segment).unwrap();
        let one = decode(&bytes, 1).unwrap().2;
        let two = decode(&bytes[one..], 1).unwrap().2;
        let mut gap = bytes[..one].to_vec();
        gap.extend_from_slice(&bytes[one + two..]);
        std::fs::write(&segment, &gap).unwrap();
        let (records, damaged) = recover(&base, 1, 0).unwrap();
        assert_eq!(values(&records), ["v0"]);
        assert_eq!(damaged.len(), 1);
        assert_eq!(damaged[0].not_applied, 1);
        assert_eq!(damaged[0].whole_to, one);
    }

    #[test]
    fn segments_go_once_checkpointed_and_a_leftover_one_is_skipped() {
        let (_dir, base, mut wal) = log_with(4);
        let first = segment_path(&base, 1);
        let kept = std::fs::read(&first).unwrap();
        let next = wal.rotate().unwrap();
        assert_eq!(next, 5);
        put(&mut wal, "new");
        assert_eq!(segments(&base).unwrap().len(), 2);
        // The database holds records 1-4 durably: their segment goes, the
        // current one stays.
        remove_before(&base, next).unwrap();
        let left: Vec<u64> = segments(&base).unwrap().iter().map(|s| s.0).collect();
        assert_eq!(left, [5]);
        assert_eq!(values(&recover(&base, 1, 4).unwrap().0), ["new"]);
        // A crash before the removal reached the disk: the old segment is
        // back, and nothing of it is applied again.
        std::fs::write(&first, &kept).unwrap();
        assert_eq!(values(&recover(&base, 1, 4).unwrap().0), ["new"]);
        // Nor is a record after a gap (a lost segment).
        std::fs::remove_file(&first).unwrap();
        assert!(recover(&base, 1, 2).unwrap().0.is_empty());
        // Starting afresh removes every segment.
        let wal = Wal::create(&base, 1, 5).unwrap();
        assert_eq!(wal.next_seq(), 6);
        let left: Vec<u64> = segments(&base).unwrap().iter().map(|s| s.0).collect();
        assert_eq!(left, [6]);
    }
}
