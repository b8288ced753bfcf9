//! Problems found at start that the service keeps working through but
//! only the operator can mend: records of a damaged write-ahead log that
//! were not applied (answered requests this database no longer holds), a
//! server or arbiter key other than the one the database ran with, or a
//! change made through the admin API (an upload or an unmount) that the
//! start could not apply (another component serves than the operator
//! decided last), or escrow the embedded ledger holds while the host
//! takes payments at an upstream webcash server, or a database a newer
//! version of the service served (`crate::versions`). Each
//! is logged at ERROR where it is found; [`raise`] also keeps it for `GET
//! /api/health`'s `alerts` and counts it in the `marketplace_alerts` gauge,
//! so a monitor notices without reading the log. Health stays `ok`: the
//! host serves, and a load balancer taking traffic away would not undo the
//! loss.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// What kind of problem: its `kind` in health's `alerts`, which the
/// host's OpenAPI document lists (a unit test below holds them together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    WalDamaged,
    ServerKeyChanged,
    ArbiterKeyChanged,
    KeptUploadRefused,
    EscrowLeftBehind,
    /// A newer version of the service served this database
    /// (`crate::versions`).
    DatabaseNewer,
    /// Not kept: shown while the data dir's disk is under its reserve
    /// ([`disk_full`]).
    DiskFull,
}

/// One problem: what kind and what to do, in words.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Alert {
    pub kind: Kind,
    pub message: String,
    /// The family it is about, when the operator's next admin change to
    /// that family settles it ([`settled`]).
    #[serde(skip)]
    pub family: Option<String>,
}

static ALERTS: Mutex<Vec<Alert>> = Mutex::new(Vec::new());
/// Whether any was raised: health, called often, then takes no lock.
static ANY: AtomicBool = AtomicBool::new(false);

/// Keep `message` of `kind` for the operator until the process ends.
pub fn raise(kind: Kind, message: impl Into<String>) {
    keep(Alert {
        kind,
        message: message.into(),
        family: None,
    });
}

/// Keep `message` of `kind` about `family` until the process ends or an
/// admin change to that family settles it ([`settled`]).
pub fn raise_about(kind: Kind, family: &str, message: impl Into<String>) {
    keep(Alert {
        kind,
        message: message.into(),
        family: Some(family.to_string()),
    });
}

fn keep(alert: Alert) {
    let mut all = ALERTS.lock().unwrap_or_else(|e| e.into_inner());
    all.push(alert);
    ANY.store(true, Ordering::Release);
    gauge(&all);
}

/// `marketplace_alerts`: how many are kept now.
fn gauge(all: &[Alert]) {
    crate::metrics::metrics()
        .alerts
        .set(i64::try_from(all.len()).unwrap_or(i64::MAX));
}

/// The operator changed `family` through the admin API (an upload or an
/// unmount, applied on this host, through it or another host of the
/// fleet): the alerts about it are settled, gone from health and the
/// gauge.
pub fn settled(family: &str) {
    if !ANY.load(Ordering::Acquire) {
        return;
    }
    let mut all = ALERTS.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|a| a.family.as_deref() != Some(family));
    gauge(&all);
}

/// The alert health shows while the data dir's disk has `free` bytes, fewer
/// than the `reserve` kept (`crate::store::disk`): it passes with the
/// condition, so it is made when health is asked, never kept.
pub fn disk_full(free: u64, reserve: u64) -> Alert {
    Alert {
        kind: Kind::DiskFull,
        message: format!(
            "the data dir's disk has {} MiB free, under min_free_disk_mib ({} MiB): writing requests are refused (503 disk_full) until space is freed; reads go on",
            free >> 20,
            reserve >> 20
        ),
        family: None,
    }
}

/// The alerts raised since the process started.
pub fn all() -> Vec<Alert> {
    if !ANY.load(Ordering::Acquire) {
        return Vec::new();
    }
    ALERTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}
