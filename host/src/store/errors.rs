//! What a storage operation's failure is, and how a request that lost a
//! race on the shared store runs again.

/// Why a request is to run again from the start (on the shared store only;
/// nothing of it was kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunAgain {
    /// It lost a race with another host's request.
    LostRace,
    /// It was refused from what a batch read, where the batch had begun
    /// before the request: another host's commit acknowledged meanwhile,
    /// which the client may have waited for before sending it, could be
    /// missing from that read. Its next run takes a batch of its own,
    /// begun after it ([`WriteTxn::may_be_stale`]).
    Stale,
}

/// How many times a request that lost a race runs again at least before
/// the host answers 503 `storage_conflict`...
pub const CONFLICT_RETRIES: u32 = 8;
/// ...and for how long since its first run it goes on running again after
/// that. (On a small shared database PostgreSQL's page-granular read
/// tracking makes most concurrent writers conflict: a steady stream of
/// writes elsewhere in the fleet can make a request lose more than 8 times
/// in a row, however short it is.)
pub const CONFLICT_BUDGET: std::time::Duration = std::time::Duration::from_secs(2);

/// The pause before run `attempt` (1-based) of a request that lost a race:
/// growing, with jitter, so that the racers do not meet again.
pub(super) fn conflict_backoff(attempt: u32) -> std::time::Duration {
    let mut r = [0u8; 2];
    crate::ids::fill_random(&mut r);
    let cap_us = 500u64 << attempt.min(6);
    std::time::Duration::from_micros(cap_us / 2 + u64::from(u16::from_le_bytes(r)) % cap_us)
}

/// From which run again on a request takes a batch of its own
/// ([`group_commit::Pending::alone`]). The first run again shares a batch
/// as before: with many true conflicts (hot rows) one-request batches
/// would cost a transaction each (measured: a third fewer paid posts a
/// second over three hosts, ten times as many runs again); a request that
/// lost twice most likely meets writes elsewhere it cannot avoid in a
/// batch.
pub const ALONE_FROM_RUN: u32 = 2;

/// Run `once` until it does not lose a race (`RunAgain`), pausing between
/// runs: at least [`CONFLICT_RETRIES`] times more, then while
/// [`CONFLICT_BUDGET`] has not passed since the first; `RunAgain` when it
/// lost every time. `once` is told whether it is to run alone (from the
/// [`ALONE_FROM_RUN`]th run again, or at once after a refusal from a stale
/// read: [`RunAgain::Stale`], which is not a lost race and is not counted
/// as one).
pub fn run_again_on_conflict<T>(
    mut once: impl FnMut(bool) -> Result<T, RunAgain>,
) -> Result<T, RunAgain> {
    let (mut attempt, started) = (0, std::time::Instant::now());
    let mut fresh = false;
    loop {
        match once(fresh || attempt >= ALONE_FROM_RUN) {
            // (A lone run's batch begins after it: never stale again.)
            Err(RunAgain::Stale) if !fresh => {
                fresh = true;
                crate::metrics::metrics().stale_refusals.inc();
            }
            Err(_) if attempt < CONFLICT_RETRIES || started.elapsed() < CONFLICT_BUDGET => {
                attempt += 1;
                crate::metrics::metrics().conflict_retries.inc();
                std::thread::sleep(conflict_backoff(attempt));
            }
            other => return other,
        }
    }
}

/// What a lost race ([`StorageError::Conflict`]) says.
pub const CONFLICT: &str = "conflict with a concurrent transaction";

/// Log the host's own storage operation that failed (`what` failed:
/// `error`): a lost race on the shared store at `debug`, since its request
/// runs again from the start (the host logs that at `info`); the shared
/// store unavailable at `debug` too, since the store's own outage line
/// (a `warn`, once a second with the count since) says it for every
/// request it fails; anything else at `error`. The error may come as text
/// (the ledger's), so both are known by what it says.
pub fn log_failure(what: &str, error: &dyn std::fmt::Display) {
    let text = error.to_string();
    if text.ends_with(CONFLICT) || text.contains(UNAVAILABLE) {
        tracing::debug!("{what}: {text}");
    } else {
        tracing::error!("{what}: {text}");
    }
}

/// Why a storage operation failed.
#[derive(Debug)]
pub enum StorageError {
    ReadOnly,
    UnknownKeyspace(String),
    TooLarge(String),
    /// The transaction lost a race with another one (a shared store's
    /// serialization failure): the whole request runs again.
    Conflict,
    /// The commit's writes would pass the disk's reserve
    /// ([`disk::Guard::charge`]): nothing of it was kept.
    DiskFull,
    Internal(String),
}

impl std::fmt::Display for StorageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageError::ReadOnly => write!(f, "read-only transaction"),
            StorageError::UnknownKeyspace(k) => write!(f, "unknown keyspace {k}"),
            StorageError::TooLarge(m) => write!(f, "too large: {m}"),
            StorageError::Conflict => f.write_str(CONFLICT),
            StorageError::DiskFull => f.write_str("the disk's free space is under its reserve"),
            StorageError::Internal(m) => write!(f, "storage: {m}"),
        }
    }
}

impl std::error::Error for StorageError {}

/// How a shared store's failure for want of the database begins its
/// message ([`StorageError::unavailable`]).
pub(super) const UNAVAILABLE: &str = "store unavailable: ";

impl StorageError {
    /// Whether this is a shared store's failure for want of the database
    /// (an outage: every request fails the same way meanwhile).
    pub fn unavailable(&self) -> bool {
        matches!(self, StorageError::Internal(m) if m.starts_with(UNAVAILABLE))
    }
}

pub(super) fn internal(e: impl std::fmt::Display) -> StorageError {
    StorageError::Internal(e.to_string())
}

/// The database file is open in another process (redb's lock): a server
/// on the same data directory, running or still exiting.
#[derive(Debug)]
pub struct HeldElsewhere(pub std::path::PathBuf);

impl std::fmt::Display for HeldElsewhere {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "opening {}: another process has it open (a server on this data directory, \
             still running or still exiting after SIGTERM)",
            self.0.display()
        )
    }
}

impl std::error::Error for HeldElsewhere {}
