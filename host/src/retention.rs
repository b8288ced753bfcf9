//! Retention of the records that only need to outlive a time window:
//! used fresh signatures (`auth:fresh-used`, and in databases of earlier
//! versions `auth:used`) and the kept answers of paid requests
//! (`cash:replays-by-time`, and in databases of earlier versions
//! `cash:replays`).
//!
//! `auth:fresh-used` is in the order of its records' signed timestamps, so
//! a sweep removes a range of it directly. The other records are listed in
//! an index table by time (`auth:used-by-time`, `cash:replays-by-time`: u64
//! BE milliseconds, then the record's key), written in the same transaction
//! as the record, so a sweep finds the old ones with a range scan instead
//! of reading whole tables. A kept answer is the value of its entry (its
//! `cash:replays` record, if it has one, only names the time), so deleting
//! the entry deletes the answer; entries of earlier versions are empty.
//!
//! - A fresh signature's use is removed [`Retention::signatures`] after its
//!   signed timestamp (at least [`crate::auth::MIN_USED_RETENTION_S`]), or
//!   as recorded by earlier versions after the use: by then the timestamp
//!   is outside the freshness window, so it is refused as `auth_expired`
//!   with or without its record, and in legacy form the trailing-timestamp
//!   rule refuses it. Legacy single-use records and records of older
//!   versions (no fresh/legacy flag) are never listed and stay for good:
//!   nothing refused today is accepted after a sweep (see
//!   [`crate::auth::prunable_from_ms`]).
//! - A kept answer is removed [`Retention::replays`] after it was recorded
//!   (the retry horizon); an identical retry after that is `402
//!   payment_spent`, as any other reuse of a spent secret.
//!
//! Databases of older versions have records but no index entries: the
//! first sweeps list them, a chunk at a time, resuming from a cursor kept
//! in `host:meta`, and mark the table done there. A used signature is listed
//! at its recorded time; an old kept answer (it has no time) at the time of
//! that sweep, so it gets the whole retry horizon from then.
//!
//! Every write transaction deletes at most [`MAX_DELETIONS_PER_TXN`] rows
//! (or lists at most [`BACKFILL_ROWS`] records) and commits, so a sweep never
//! holds the writer for long; paid requests take their turn between chunks.
//! A sweep with nothing to do only reads a snapshot and commits nothing.

use crate::money::ledger::{REPLAYS, REPLAYS_BY_TIME, replay_recorded_ms};
use crate::money::upgrade::META;
use crate::store::{Kv, Storage, WriteTxn};
use anyhow::Result;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Default retry horizon of a kept answer.
pub const DEFAULT_REPLAYS: Duration = Duration::from_secs(24 * 60 * 60);
/// Default retention of a fresh signature's use (the 600 s it needs, plus
/// margin for clock adjustments).
pub const DEFAULT_SIGNATURES: Duration = Duration::from_secs(60 * 60);
/// Most rows one write transaction of a sweep deletes (records and their
/// index entries).
pub const MAX_DELETIONS_PER_TXN: usize = 1000;
/// Most records one write transaction lists when indexing an older
/// database (kept answers are read whole).
pub const BACKFILL_ROWS: usize = 100;

/// How long records are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Kept answers of paid requests: the retry horizon.
    pub replays: Duration,
    /// Used fresh signatures, from their signed timestamp (from their use
    /// in records of earlier versions); raised to
    /// [`crate::auth::MIN_USED_RETENTION_S`] when shorter.
    pub signatures: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            replays: DEFAULT_REPLAYS,
            signatures: DEFAULT_SIGNATURES,
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SweepStats {
    /// Used-signature records removed.
    pub signatures: u64,
    /// Kept answers removed.
    pub replays: u64,
    /// Records of an older database listed by time.
    pub indexed: u64,
    /// Write transactions committed.
    pub commits: u64,
}

impl SweepStats {
    fn removed(&self) -> u64 {
        self.signatures + self.replays
    }
}

pub use crate::store::time_key as index_key;

/// The two kinds of timed records.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Signatures,
    Replays,
}

impl Kind {
    fn table(self) -> &'static str {
        match self {
            Kind::Signatures => crate::auth::USED,
            Kind::Replays => REPLAYS,
        }
    }

    fn index(self) -> &'static str {
        match self {
            Kind::Signatures => crate::auth::USED_BY_TIME,
            Kind::Replays => REPLAYS_BY_TIME,
        }
    }

    /// Backfill: the time to list an existing record at, or None (kept for
    /// good, or already listed by the version that wrote it).
    fn list_at(self, record: &[u8], now_ms: u64) -> Option<u64> {
        match self {
            Kind::Signatures => crate::auth::prunable_from_ms(record),
            Kind::Replays => replay_recorded_ms(record).is_none().then_some(now_ms),
        }
    }

    /// Whether the record an expired index entry names may go (it is what
    /// the entry says, not a newer record under the same key).
    fn may_remove(self, record: &[u8], cutoff_ms: u64) -> bool {
        match self {
            Kind::Signatures => {
                crate::auth::prunable_from_ms(record).is_some_and(|ms| ms < cutoff_ms)
            }
            Kind::Replays => replay_recorded_ms(record).is_none_or(|ms| ms < cutoff_ms),
        }
    }

    /// Records older than this are removed.
    fn cutoff_ms(self, now_ms: u64, r: &Retention) -> u64 {
        let keep = match self {
            Kind::Signatures => r
                .signatures
                .max(Duration::from_secs(crate::auth::MIN_USED_RETENTION_S)),
            Kind::Replays => r.replays,
        };
        now_ms.saturating_sub(u64::try_from(keep.as_millis()).unwrap_or(u64::MAX))
    }
}

const KINDS: [Kind; 2] = [Kind::Signatures, Kind::Replays];

fn err(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("{e}")
}

/// Remove every record older than its horizon at `now_ms` (host clock),
/// listing the records of an older database first.
pub fn sweep(storage: &Storage, now_ms: u64, retention: &Retention) -> Result<SweepStats> {
    sweep_until(storage, now_ms, retention, &AtomicBool::new(false))
}

/// [`sweep`], giving up between chunks once `stop` is set.
fn sweep_until(
    storage: &Storage,
    now_ms: u64,
    retention: &Retention,
    stop: &AtomicBool,
) -> Result<SweepStats> {
    let mut stats = SweepStats::default();
    for kind in KINDS {
        backfill(storage, kind, now_ms, stop, &mut stats)?;
        prune(
            storage,
            kind,
            kind.cutoff_ms(now_ms, retention),
            stop,
            &mut stats,
        )?;
    }
    let cutoff_s = Kind::Signatures.cutoff_ms(now_ms, retention) / 1000;
    prune_fresh(storage, cutoff_s, stop, &mut stats)?;
    Ok(stats)
}

/// Remove the fresh uses (`auth:fresh-used`) signed before `cutoff_s`,
/// in chunks. The key begins with the signed timestamp, within
/// [`crate::auth::FRESH_WINDOW_S`] of the use, and the retention is at
/// least [`crate::auth::MIN_USED_RETENTION_S`], so whatever goes is
/// refused as `auth_expired` without its record. Timestamps before
/// [`crate::auth::FRESH_PRUNABLE_FROM_S`] stay (see
/// [`crate::auth::prunable_from_ms`]).
fn prune_fresh(
    storage: &Storage,
    cutoff_s: u64,
    stop: &AtomicBool,
    stats: &mut SweepStats,
) -> Result<()> {
    if cutoff_s <= crate::auth::FRESH_PRUNABLE_FROM_S {
        return Ok(());
    }
    let start = crate::auth::FRESH_PRUNABLE_FROM_S.to_be_bytes();
    let end = cutoff_s.to_be_bytes();
    let table = crate::auth::FRESH_USED;
    in_chunks(
        storage,
        table,
        &start,
        &end,
        MAX_DELETIONS_PER_TXN,
        stop,
        stats,
        |txn, rows, stats| {
            for (key, _) in rows {
                txn.delete_in(table, key).map_err(err)?;
            }
            stats.signatures += rows.len() as u64;
            Ok(())
        },
    )
}

fn done_key(kind: Kind) -> Vec<u8> {
    format!("retention:indexed:{}", kind.table()).into_bytes()
}

fn cursor_key(kind: Kind) -> Vec<u8> {
    format!("retention:cursor:{}", kind.table()).into_bytes()
}

/// List the records an older version wrote, in chunks, from the cursor.
fn backfill(
    storage: &Storage,
    kind: Kind,
    now_ms: u64,
    stop: &AtomicBool,
    stats: &mut SweepStats,
) -> Result<()> {
    {
        let snapshot = storage.begin_read().map_err(err)?;
        if snapshot
            .get_in(META, &done_key(kind))
            .map_err(err)?
            .is_some()
        {
            return Ok(());
        }
        // An empty table has nothing of an older version: whatever comes
        // later is listed by its writer. Nothing to commit yet.
        let cursor = snapshot.get_in(META, &cursor_key(kind)).map_err(err)?;
        if cursor.is_none()
            && snapshot
                .scan_in(kind.table(), b"", None, false, 1)
                .map_err(err)?
                .is_empty()
        {
            return Ok(());
        }
    }
    while !stop.load(Ordering::Relaxed) {
        let txn = storage.begin_write().map_err(err)?;
        let start = match txn.get_in(META, &cursor_key(kind)).map_err(err)? {
            Some(mut last) => {
                last.push(0); // the next key after it
                last
            }
            None => Vec::new(),
        };
        let rows = txn
            .scan_in(kind.table(), &start, None, false, BACKFILL_ROWS)
            .map_err(err)?;
        for (key, record) in &rows {
            if let Some(ms) = kind.list_at(record, now_ms) {
                let entry = index_key(ms, key);
                if txn.get_in(kind.index(), &entry).map_err(err)?.is_none() {
                    txn.put_in(kind.index(), &entry, b"").map_err(err)?;
                    stats.indexed += 1;
                }
            }
        }
        let finished = rows.len() < BACKFILL_ROWS;
        if finished {
            txn.put_in(META, &done_key(kind), b"1").map_err(err)?;
            txn.delete_in(META, &cursor_key(kind)).map_err(err)?;
        } else if let Some((last, _)) = rows.last() {
            txn.put_in(META, &cursor_key(kind), last).map_err(err)?;
        }
        commit(storage, txn, stats)?;
        if finished {
            break;
        }
    }
    Ok(())
}

/// Remove the records listed before `cutoff_ms`, in chunks.
fn prune(
    storage: &Storage,
    kind: Kind,
    cutoff_ms: u64,
    stop: &AtomicBool,
    stats: &mut SweepStats,
) -> Result<()> {
    let end = cutoff_ms.to_be_bytes();
    // Each entry deletes itself and at most its record.
    let chunk = MAX_DELETIONS_PER_TXN / 2;
    in_chunks(
        storage,
        kind.index(),
        b"",
        &end,
        chunk,
        stop,
        stats,
        |txn, entries, stats| {
            for (entry, held) in entries {
                txn.delete_in(kind.index(), entry).map_err(err)?;
                // An entry that holds a kept answer: the answer goes with it
                // (and its record, unless a newer record took its key).
                let mut removed = !held.is_empty();
                if let Some(key) = entry.get(8..)
                    && let Some(record) = txn.get_in(kind.table(), key).map_err(err)?
                    && kind.may_remove(&record, cutoff_ms)
                {
                    txn.delete_in(kind.table(), key).map_err(err)?;
                    removed = true;
                }
                if removed {
                    match kind {
                        Kind::Signatures => stats.signatures += 1,
                        Kind::Replays => stats.replays += 1,
                    }
                }
            }
            Ok(())
        },
    )
}

/// Run `each` on the rows of `table` from `start` up to `end`, at most
/// `chunk` of them per write transaction, committing each, until none are
/// left (or `stop`). `each` removes the rows it is given. A snapshot is
/// read first: an idle sweep takes no write transaction.
#[allow(clippy::too_many_arguments)]
fn in_chunks(
    storage: &Storage,
    table: &str,
    start: &[u8],
    end: &[u8],
    chunk: usize,
    stop: &AtomicBool,
    stats: &mut SweepStats,
    mut each: impl FnMut(&WriteTxn, &[(Vec<u8>, Vec<u8>)], &mut SweepStats) -> Result<()>,
) -> Result<()> {
    if storage
        .begin_read()
        .map_err(err)?
        .scan_in(table, start, Some(end), false, 1)
        .map_err(err)?
        .is_empty()
    {
        return Ok(());
    }
    while !stop.load(Ordering::Relaxed) {
        let txn = storage.begin_write().map_err(err)?;
        let rows = txn
            .scan_in(table, start, Some(end), false, chunk)
            .map_err(err)?;
        if rows.is_empty() {
            break; // dropped: nothing written
        }
        each(&txn, &rows, stats)?;
        commit(storage, txn, stats)?;
        if rows.len() < chunk {
            break;
        }
    }
    Ok(())
}

fn commit(storage: &Storage, txn: WriteTxn, stats: &mut SweepStats) -> Result<()> {
    storage.commit(txn).map_err(err)?;
    stats.commits += 1;
    Ok(())
}

/// The background sweeper: [`Sweeper::stop`] (or dropping it) ends it.
pub struct Sweeper {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sweeper {
    /// Stop sweeping: an ongoing sweep ends after its current chunk; waits
    /// for the thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            if thread.join().is_err() {
                tracing::error!("the retention sweeper panicked");
            }
        }
    }
}

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Sweep with the default [`Retention`] every `every`, the first time
/// `every` after the start, on a thread of its own (host clock).
pub fn spawn(state: Arc<crate::state::State>, every: Duration) -> Sweeper {
    spawn_with(state, every, Retention::default())
}

/// [`spawn`] with the given retention.
pub fn spawn_with(
    state: Arc<crate::state::State>,
    every: Duration,
    retention: Retention,
) -> Sweeper {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("retention".into())
        .spawn(move || {
            loop {
                let due = Instant::now() + every;
                while !flag.load(Ordering::Relaxed) {
                    let left = due.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    std::thread::park_timeout(left);
                }
                if flag.load(Ordering::Relaxed) {
                    return;
                }
                match sweep_until(&state.storage, state.now_ms(), &retention, &flag) {
                    Ok(s) if s.removed() > 0 || s.indexed > 0 => tracing::info!(
                        signatures = s.signatures,
                        replays = s.replays,
                        indexed = s.indexed,
                        commits = s.commits,
                        "retention: removed expired used signatures and kept answers"
                    ),
                    Ok(_) => {}
                    Err(e) => tracing::warn!("retention sweep failed (retried next time): {e:#}"),
                }
            }
        })
        .expect("spawning the retention thread");
    Sweeper {
        stop,
        thread: Some(thread),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{FRESH_WINDOW_S, Statement, verify};
    use crate::money::ledger::Ledger;
    use ed25519_dalek::{Signer, SigningKey};

    const NOW_S: u64 = 1_800_000_000;

    fn hex(b: &[u8]) -> String {
        marketplace_common::hex::encode(b)
    }

    fn count(storage: &Storage, table: &str) -> usize {
        storage
            .begin_read()
            .unwrap()
            .scan_in(table, b"", None, false, usize::MAX)
            .unwrap()
            .len()
    }

    struct Signer1 {
        sk: SigningKey,
        fp: String,
    }

    impl Signer1 {
        fn new() -> Signer1 {
            let sk = SigningKey::from_bytes(&[5u8; 32]);
            let fp = hex(sk.verifying_key().as_bytes());
            Signer1 { sk, fp }
        }
        fn sign(&self, m: &str) -> String {
            hex(&self.sk.sign(m.as_bytes()).to_bytes())
        }
    }

    /// Use a fresh signature of `post:{n}` at `used_s`; returns it.
    fn use_fresh(storage: &Storage, who: &Signer1, n: u64, used_s: u64) -> String {
        let sig = who.sign(&format!("post:{n}:{used_s}"));
        let st = Statement {
            actor: &who.fp,
            message: &format!("post:{n}"),
            signature: &sig,
            timestamp: Some(used_s),
        };
        let txn = storage.begin_write().unwrap();
        verify(&txn, used_s, &st, false, false, false).unwrap();
        storage.commit(txn).unwrap();
        sig
    }

    #[test]
    fn old_used_signatures_go_young_and_legacy_ones_stay() {
        let (_d, db) = crate::store::temp_storage();
        let who = Signer1::new();
        let r = Retention::default();
        let horizon_s = r.signatures.as_secs();
        // Three old fresh uses, one young one, one legacy single use.
        let old_sigs: Vec<String> = (0..3)
            .map(|n| use_fresh(&db, &who, n, NOW_S - horizon_s - 10 - n))
            .collect();
        use_fresh(&db, &who, 9, NOW_S - 5);
        // And an old fresh use as the previous version recorded it: in
        // `auth:used`, flagged, listed by time.
        let txn = db.begin_write().unwrap();
        let before_s = NOW_S - horizon_s - 100;
        let mut flagged = before_s.to_be_bytes().to_vec();
        flagged.push(1);
        let key = format!("{}:cc", who.fp);
        txn.put_in(crate::auth::USED, key.as_bytes(), &flagged)
            .unwrap();
        txn.put_in(
            crate::auth::USED_BY_TIME,
            &index_key(before_s * 1000, key.as_bytes()),
            b"",
        )
        .unwrap();
        db.commit(txn).unwrap();
        let legacy = who.sign("post:legacy");
        let st = Statement {
            actor: &who.fp,
            message: "post:legacy",
            signature: &legacy,
            timestamp: None,
        };
        let txn = db.begin_write().unwrap();
        verify(&txn, NOW_S - 10 * horizon_s, &st, false, true, false).unwrap();
        db.commit(txn).unwrap();
        assert_eq!(count(&db, crate::auth::FRESH_USED), 4);
        assert_eq!(count(&db, crate::auth::USED), 2);
        assert_eq!(count(&db, crate::auth::USED_BY_TIME), 1);

        let stats = sweep(&db, NOW_S * 1000, &r).unwrap();
        assert_eq!((stats.signatures, stats.replays), (4, 0));
        assert_eq!(count(&db, crate::auth::FRESH_USED), 1);
        assert_eq!(count(&db, crate::auth::USED), 1, "the legacy use");
        assert_eq!(count(&db, crate::auth::USED_BY_TIME), 0);
        // What went is refused all the same: expired, and as legacy.
        let txn = db.begin_write().unwrap();
        for (n, sig) in old_sigs.iter().enumerate() {
            let ts = NOW_S - horizon_s - 10 - n as u64;
            let fresh = Statement {
                actor: &who.fp,
                message: &format!("post:{n}"),
                signature: sig,
                timestamp: Some(ts),
            };
            assert_eq!(
                verify(&txn, NOW_S, &fresh, false, false, false)
                    .unwrap_err()
                    .status,
                401
            );
            let as_legacy = format!("post:{n}:{ts}");
            let legacy = Statement {
                actor: &who.fp,
                message: &as_legacy,
                signature: sig,
                timestamp: None,
            };
            assert_eq!(
                verify(&txn, NOW_S, &legacy, false, true, false)
                    .unwrap_err()
                    .status,
                401
            );
        }
        drop(txn);
        // The legacy single use is still refused, years later.
        let txn = db.begin_write().unwrap();
        let later = NOW_S + 10 * 365 * 86_400;
        assert_eq!(
            verify(&txn, later, &st, false, true, false)
                .unwrap_err()
                .status,
            409
        );
        drop(txn);
        // A second sweep has nothing to do and commits nothing.
        let again = sweep(&db, NOW_S * 1000, &r).unwrap();
        assert_eq!(again, SweepStats::default());
    }

    #[test]
    fn a_pruned_signature_still_cannot_be_replayed() {
        let (_d, db) = crate::store::temp_storage();
        let who = Signer1::new();
        let r = Retention {
            signatures: Duration::from_secs(1), // raised to the safe minimum
            ..Retention::default()
        };
        // Used with a timestamp as far ahead as the window allows.
        let used_s = NOW_S;
        let ts = used_s + FRESH_WINDOW_S;
        let sig = who.sign(&format!("post:x:{ts}"));
        let fresh = Statement {
            actor: &who.fp,
            message: "post:x",
            signature: &sig,
            timestamp: Some(ts),
        };
        let txn = db.begin_write().unwrap();
        verify(&txn, used_s, &fresh, false, false, false).unwrap();
        db.commit(txn).unwrap();

        // Two windows after the use, a timestamp that far ahead is still
        // inside the window: the record is what refuses it, so it stays
        // (the minimum retention applies, not the configured second).
        let early = (used_s + 2 * FRESH_WINDOW_S) * 1000;
        assert_eq!(sweep(&db, early, &r).unwrap().signatures, 0);
        let txn = db.begin_write().unwrap();
        assert_eq!(
            verify(
                &txn,
                used_s + 2 * FRESH_WINDOW_S,
                &fresh,
                false,
                false,
                false
            )
            .unwrap_err()
            .status,
            409,
            "still recorded, still refused as used"
        );
        drop(txn);

        // Kept until its timestamp is the safe minimum old.
        let now_s = ts + crate::auth::MIN_USED_RETENTION_S;
        assert_eq!(sweep(&db, now_s * 1000, &r).unwrap().signatures, 0);
        let now_s = now_s + 1;
        assert_eq!(sweep(&db, now_s * 1000, &r).unwrap().signatures, 1);
        assert_eq!(count(&db, crate::auth::FRESH_USED), 0);
        let txn = db.begin_write().unwrap();
        // The fresh form: its timestamp is outside the window now.
        let e = verify(&txn, now_s, &fresh, false, false, false).unwrap_err();
        assert_eq!(
            (e.status, e.body.windows(12).any(|w| w == b"auth_expired")),
            (401, true)
        );
        // The same bytes as a legacy signature of "post:x:{ts}": refused by
        // the trailing-timestamp rule, single use or not.
        let as_legacy = format!("post:x:{ts}");
        let legacy = Statement {
            actor: &who.fp,
            message: &as_legacy,
            signature: &sig,
            timestamp: None,
        };
        for single_use in [false, true] {
            let e = verify(&txn, now_s, &legacy, false, single_use, false).unwrap_err();
            assert_eq!(e.status, 401);
        }
    }

    #[test]
    fn old_databases_are_listed_once_and_keep_what_is_unknown() {
        let (dir, db) = crate::store::temp_storage();
        let who = Signer1::new();
        // Records as older versions wrote them, with no index entries: a
        // fresh use (flag 1), an unflagged use (fresh or legacy: unknown)
        // and a kept answer without a time.
        let txn = db.begin_write().unwrap();
        let old_s = NOW_S - 30 * 86_400;
        let mut flagged = old_s.to_be_bytes().to_vec();
        flagged.push(1);
        txn.put_in(
            crate::auth::USED,
            format!("{}:aa", who.fp).as_bytes(),
            &flagged,
        )
        .unwrap();
        txn.put_in(
            crate::auth::USED,
            format!("{}:bb", who.fp).as_bytes(),
            &old_s.to_be_bytes(),
        )
        .unwrap();
        let ledger = Ledger::open(dir.path()).unwrap();
        let reply = crate::reply::Reply::json(201, &serde_json::json!({"id": "p1"}));
        let key = [3u8; 32];
        Ledger::record_replay_at(&txn, &key, &reply, &[], 0).unwrap();
        // Make it an old-format record: the reply under its key, no time,
        // not listed.
        let raw = txn
            .get_in(REPLAYS_BY_TIME, &index_key(0, &key))
            .unwrap()
            .unwrap();
        let mlen = u32::from_be_bytes(raw[2..6].try_into().unwrap()) as usize;
        let mut meta: serde_json::Value = serde_json::from_slice(&raw[6..6 + mlen]).unwrap();
        meta.as_object_mut().unwrap().remove("at_ms");
        let meta = serde_json::to_vec(&meta).unwrap();
        let mut old = raw[..2].to_vec();
        old.extend_from_slice(&(meta.len() as u32).to_be_bytes());
        old.extend_from_slice(&meta);
        old.extend_from_slice(&raw[6 + mlen..]);
        txn.put_in(REPLAYS, &key, &old).unwrap();
        txn.delete_in(REPLAYS_BY_TIME, &index_key(0, &key)).unwrap();
        db.commit(txn).unwrap();
        assert_eq!(replay_recorded_ms(&old), None);
        assert_eq!(count(&db, REPLAYS_BY_TIME), 0);

        let r = Retention::default();
        let now_ms = NOW_S * 1000;
        let s = sweep(&db, now_ms, &r).unwrap();
        // The flagged fresh use is listed and, being old, removed; the
        // unflagged one stays; the answer counts from this sweep.
        assert_eq!((s.indexed, s.signatures, s.replays), (2, 1, 0));
        assert_eq!(count(&db, crate::auth::USED), 1);
        assert_eq!(count(&db, REPLAYS_BY_TIME), 1);
        assert!(ledger.replay(&db.begin_read().unwrap(), &key, 0).is_some());
        // Listed once: a later sweep does not list again.
        let s = sweep(&db, now_ms + 1000, &r).unwrap();
        assert_eq!(s, SweepStats::default());
        // The whole horizon from the first sweep, then gone.
        let horizon = r.replays.as_millis() as u64;
        assert_eq!(sweep(&db, now_ms + horizon, &r).unwrap().replays, 0);
        assert_eq!(sweep(&db, now_ms + horizon + 1, &r).unwrap().replays, 1);
        assert!(ledger.replay(&db.begin_read().unwrap(), &key, 0).is_none());
        assert_eq!(count(&db, crate::auth::USED), 1, "the unknown use stays");
    }

    #[test]
    fn replays_answer_inside_the_horizon_and_go_after_it() {
        let (dir, db) = crate::store::temp_storage();
        let ledger = Ledger::open(dir.path()).unwrap();
        let r = Retention::default();
        let horizon = r.replays.as_millis() as u64;
        let now_ms = NOW_S * 1000;
        let (change, _) = {
            let txn = db.begin_write().unwrap();
            let c = ledger.issue(&txn, "change:abc", 7).unwrap();
            db.commit(txn).unwrap();
            c
        };
        let d = crate::money::ledger::Derivation {
            purpose: "change:abc:7".into(),
            amount: Some(7),
            public: crate::money::ledger::public_hash(
                &marketplace_common::secret::parse(&change).unwrap().hex,
            ),
        };
        let reply = crate::reply::Reply {
            status: 201,
            headers: vec![("x-cash-change".into(), change.clone())],
            body: format!("{{\"payment\":{{\"change\":\"{change}\"}}}}").into_bytes(),
        };
        let txn = db.begin_write().unwrap();
        let (young, old) = ([1u8; 32], [2u8; 32]);
        Ledger::record_replay_at(&txn, &young, &reply, &[(change.clone(), d)], now_ms - 1000)
            .unwrap();
        Ledger::record_replay_at(&txn, &old, &reply, &[], now_ms - horizon - 1).unwrap();
        db.commit(txn).unwrap();

        let s = sweep(&db, now_ms, &r).unwrap();
        assert_eq!((s.replays, s.signatures, s.indexed), (1, 0, 0));
        let snap = db.begin_read().unwrap();
        assert_eq!(
            ledger.replay(&snap, &young, 0),
            Some(reply),
            "whole, secrets derived"
        );
        assert_eq!(ledger.replay(&snap, &old, 0), None);
        assert_eq!(count(&db, REPLAYS_BY_TIME), 1);
    }

    #[test]
    fn answers_kept_with_their_output_go_after_the_horizon() {
        let (dir, db) = crate::store::temp_storage();
        let ledger = Ledger::open(dir.path()).unwrap();
        let r = Retention::default();
        let horizon = r.replays.as_millis() as u64;
        let now_ms = NOW_S * 1000;
        let reply = crate::reply::Reply::json(201, &serde_json::json!({"id": "p1"}));
        let txn = db.begin_write().unwrap();
        let mut keys = Vec::new();
        for (i, at) in [now_ms - 1000, now_ms - horizon - 1]
            .into_iter()
            .enumerate()
        {
            let paid = ledger.mint(&txn, 5).unwrap();
            let public = crate::money::ledger::public_hash(
                &marketplace_common::secret::parse(&paid).unwrap().hex,
            );
            let key = crate::money::payments::replay_key(&public, "POST", "/p", &[i as u8]);
            ledger.spend(&txn, &public).unwrap();
            Ledger::record_paid_replay_at(&txn, &public, &key, &reply, &[], at).unwrap();
            keys.push((public, key));
        }
        db.commit(txn).unwrap();
        assert_eq!(count(&db, REPLAYS), 0);

        let s = sweep(&db, now_ms, &r).unwrap();
        assert_eq!((s.replays, s.signatures, s.indexed), (1, 0, 0));
        let snap = db.begin_read().unwrap();
        let [(young_pub, young), (old_pub, old)] = &keys[..] else {
            unreachable!()
        };
        assert_eq!(ledger.replay_paid(&snap, young_pub, young, 0), Some(reply));
        assert_eq!(ledger.replay_paid(&snap, old_pub, old, 0), None);
        assert_eq!(count(&db, REPLAYS_BY_TIME), 1);
    }

    #[test]
    fn sweeps_delete_in_bounded_chunks() {
        let (_d, db) = crate::store::temp_storage();
        let n = MAX_DELETIONS_PER_TXN + 7;
        let txn = db.begin_write().unwrap();
        for i in 0..n as u64 {
            let key = marketplace_common::hex::encode(&i.to_be_bytes())
                .repeat(4)
                .into_bytes();
            let mut rec = (NOW_S - 86_400 + i).to_be_bytes().to_vec();
            rec.push(1);
            txn.put_in(crate::auth::USED, &key, &rec).unwrap();
        }
        db.commit(txn).unwrap();
        let before = db.commits();
        let s = sweep(&db, NOW_S * 1000, &Retention::default()).unwrap();
        assert_eq!((s.indexed, s.signatures), (n as u64, n as u64));
        // Backfill: n / 100 + 1 transactions; prune: n / 500 + 1.
        let expect = (n / BACKFILL_ROWS + 1) + (n / (MAX_DELETIONS_PER_TXN / 2) + 1);
        assert_eq!(s.commits, expect as u64);
        assert_eq!(db.commits() - before, expect as u64);
        assert_eq!(count(&db, crate::auth::USED), 0);
        assert_eq!(count(&db, crate::auth::USED_BY_TIME), 0);
    }

    #[test]
    fn the_sweeper_thread_sweeps_and_stops() {
        let dir = tempfile::tempdir().unwrap();
        let config = crate::config::Config {
            data_dir: dir.path().to_path_buf(),
            ..Default::default()
        };
        let state = crate::state::State::open(config).unwrap();
        let txn = state.storage.begin_write().unwrap();
        let mut rec = (state.now_ms() / 1000 - 86_400).to_be_bytes().to_vec();
        rec.push(1);
        txn.put_in(crate::auth::USED, b"k", &rec).unwrap();
        state.storage.commit(txn).unwrap();
        let sweeper = spawn(state.clone(), Duration::from_millis(20));
        let deadline = Instant::now() + Duration::from_secs(10);
        while count(&state.storage, crate::auth::USED) > 0 {
            assert!(Instant::now() < deadline, "not swept");
            std::thread::sleep(Duration::from_millis(10));
        }
        sweeper.stop();
        // A long period does not delay stopping.
        let started = Instant::now();
        spawn(state, Duration::from_secs(3600)).stop();
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn a_stopped_sweep_stops_between_chunks() {
        let (_d, db) = crate::store::temp_storage();
        let txn = db.begin_write().unwrap();
        let mut rec = (NOW_S - 86_400).to_be_bytes().to_vec();
        rec.push(1);
        txn.put_in(crate::auth::USED, b"k", &rec).unwrap();
        db.commit(txn).unwrap();
        let stop = AtomicBool::new(true);
        let s = sweep_until(&db, NOW_S * 1000, &Retention::default(), &stop).unwrap();
        assert_eq!(s, SweepStats::default());
        assert_eq!(count(&db, crate::auth::USED), 1);
    }
}
