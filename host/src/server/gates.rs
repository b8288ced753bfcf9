//! Admission: the gates a request passes before it runs (the instance
//! pool, the reads' share of it, its family's `max_concurrent`, host
//! routes' body slots) and the budget of request bodies held meanwhile
//! (`max_pending_body_bytes`, by family and by client address). A request
//! waiting here may give its place up to make room for a new connection.

use crate::app::App;
use crate::metrics::metrics;
use crate::reply::Reply;
use crate::runtime::long_calls;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, watch};

/// Concurrency gates: the instance pool shared by every family; a gate
/// for read (non-writing) routes that leaves part of the pool to writes, so
/// free work (searches, macros that may run for a second) can never hold every
/// slot while paid writes wait; and a gate per family (its
/// `max_concurrent`, by default half the pool).
pub(super) struct Gates {
    pool: Arc<Semaphore>,
    reads: Arc<Semaphore>,
    // (foldhash: looked up per request, where SipHash cost ~200
    // instructions; the keys are the host's own family names.)
    families: std::sync::Mutex<HashMap<String, Arc<FamilyGates>, foldhash::fast::RandomState>>,
    /// KiB of request bodies held before their request runs (being
    /// received, or waiting for a slot): `max_pending_body_bytes`.
    bodies: Arc<Budget>,
    /// The same KiB by client address: [`address_body_share`] each (none
    /// counted with `max_connections_per_ip = 0`).
    bodies_by_address: Option<Arc<super::shares::Shares>>,
    /// True once the server drains: every answer then closes its
    /// connection.
    pub(super) draining: watch::Receiver<bool>,
    /// Host routes that work on their body ([`crate::runtime::native::parses_body`])
    /// running at once: [`host_body_slots`]. The memory a handler
    /// works in is some times its body's, which is only budgeted while it
    /// waits; a request waiting here keeps its body counted.
    pub(super) host_bodies: Arc<Semaphore>,
    /// Bytes of large answers of reads not sent yet:
    /// `max_unsent_answer_bytes` ([`super::answers`]).
    pub(super) unsent: Arc<super::answers::Unsent>,
}

/// Host handlers with a body that run at once: CPU-bound work on blocking
/// threads, so more than a few per core only adds memory (each parses
/// up to `max_body_bytes` of JSON and builds its answer).
pub(super) fn host_body_slots() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get()) * 4
}

/// Pool slots only writes may take: a quarter of the pool, at least one
/// (none with a pool of one).
pub fn write_reserve(max_instances: u32) -> u32 {
    if max_instances < 2 {
        0
    } else {
        (max_instances / 4).max(1)
    }
}

/// A family's gates: its `max_concurrent` slots, and its share of the
/// KiB of bodies held before their request runs: one for its routes of
/// the usual body limit, another as large for those that declare a larger
/// one (uploads), so stalled large bodies cannot keep out its small
/// requests (an identity's registration behind 17 trickled 8 MiB uploads
/// to made-up tokens).
pub(super) struct FamilyGates {
    slots: Arc<Semaphore>,
    bodies: Budget,
    large_bodies: Budget,
}

impl FamilyGates {
    fn bodies(&self, large: bool) -> &Budget {
        if large {
            &self.large_bodies
        } else {
            &self.bodies
        }
    }
}

/// KiB, as the body budgets count.
pub(super) fn kib(bytes: u64) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// A family's share of `max_pending_body_bytes` (KiB of `total`): its
/// `max_concurrent`'s share of the pool (half by default), so one
/// family's senders leave the rest to the others; at least room for two
/// bodies of the largest size a route may take, so one stalled body
/// cannot keep out a body of that size.
pub fn family_body_share(total: u32, limit: u32, max_instances: u32, max_body_bytes: usize) -> u32 {
    let share = u64::from(total) * u64::from(limit) / u64::from(max_instances.max(1));
    u32::try_from(share)
        .unwrap_or(u32::MAX)
        .max(kib(crate::config::largest_body_bytes(max_body_bytes) as u64).saturating_mul(2))
        .min(total)
}

/// An address's share of `max_pending_body_bytes` (KiB of `total`): an
/// eighth, at least room for two bodies of the largest size a route may
/// take (or the whole when that is less), so that the stalled bodies of
/// a few addresses cannot keep every other client's bodies out of a
/// family.
pub fn address_body_share(total: u32, max_body_bytes: usize) -> u32 {
    let two_largest =
        kib(crate::config::largest_body_bytes(max_body_bytes) as u64).saturating_mul(2);
    (total / 8).max(two_largest).min(total)
}

/// KiB that requests take and give back; never waited for (a body that
/// finds no room is refused), so an atomic count does.
pub(super) struct Budget(std::sync::atomic::AtomicU32);

impl Budget {
    fn new(kib: u32) -> Budget {
        Budget(std::sync::atomic::AtomicU32::new(kib))
    }

    /// Take `n` KiB, if there are.
    fn take(&self, n: u32) -> bool {
        use std::sync::atomic::Ordering;
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }

    fn give(&self, n: u32) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The bytes of one request's body held before it runs, counted in KiB
/// of what is allocated for it, as it arrives (a body sent slowly holds
/// only what came), against its family's share (none for a host route)
/// and the whole budget, and given back when it runs or ends.
pub(super) struct PendingBody {
    family: Option<Arc<FamilyGates>>,
    /// Of a route that declares a larger body limit than `max_body_bytes`.
    large: bool,
    all: Arc<Budget>,
    /// The sender's address and the shares by address, if counted.
    client: IpAddr,
    by_address: Option<Arc<super::shares::Shares>>,
    kib: u32,
}

impl PendingBody {
    /// Count the body's first `bytes`: false when the family's share or
    /// the whole budget has no room for them.
    fn cover(&mut self, bytes: usize) -> bool {
        let need = kib(bytes as u64);
        if need <= self.kib {
            return true;
        }
        let more = need - self.kib;
        if let Some(f) = &self.family
            && !f.bodies(self.large).take(more)
        {
            return false;
        }
        let give_back_family = || {
            if let Some(f) = &self.family {
                f.bodies(self.large).give(more);
            }
        };
        if !self.all.take(more) {
            give_back_family();
            return false;
        }
        if let Some(shares) = &self.by_address
            && !shares.take(Some(self.client), u64::from(more))
        {
            self.all.give(more);
            give_back_family();
            return false;
        }
        self.kib = need;
        metrics().pending_body_bytes.inc_by(i64::from(more) * 1024);
        true
    }
}

impl Drop for PendingBody {
    fn drop(&mut self) {
        if self.kib > 0 {
            if let Some(f) = &self.family {
                f.bodies(self.large).give(self.kib);
            }
            self.all.give(self.kib);
            if let Some(shares) = &self.by_address {
                shares.give(Some(self.client), u64::from(self.kib));
            }
            metrics()
                .pending_body_bytes
                .dec_by(i64::from(self.kib) * 1024);
        }
    }
}

/// Why a body was not read whole.
pub(super) enum BodyError {
    TooLarge,
    /// The pending-body budget had no room.
    Busy,
    Read(hyper::Error),
}

/// Read `body` whole, at most `max` bytes, counting what is allocated for
/// it into `pending` as it arrives.
pub(super) async fn read_body(
    mut body: Incoming,
    max: usize,
    pending: &mut PendingBody,
) -> Result<Vec<u8>, BodyError> {
    // Room for its first bytes before any is asked for: a client that
    // sent `Expect: 100-continue` is refused without sending the body.
    if !pending.cover(1) {
        return Err(BodyError::Busy);
    }
    let mut out: Vec<u8> = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(BodyError::Read)?.into_data() else {
            continue;
        };
        let len = out.len() + data.len();
        if len > max {
            return Err(BodyError::TooLarge);
        }
        if len > out.capacity() {
            // Grown as a Vec grows (at most `max`), and counted so.
            let capacity = len.max(out.capacity() * 2).min(max);
            if !pending.cover(capacity) {
                return Err(BodyError::Busy);
            }
            out.reserve_exact(capacity - out.len());
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

/// A family's `max_concurrent` when its configuration gives none: half the
/// pool (at least one), so that one family's requests (a flood of runaway
/// ones, each holding its slot until its deadline) cannot take every slot
/// other families' reads may use.
pub fn default_family_limit(max_instances: u32) -> u32 {
    (max_instances / 2).max(1)
}

/// Longest a request waits for one of its family's `max_concurrent` slots
/// (five plugin deadlines, at least a second): past it the family is
/// busy, 503 with Retry-After, rather than a queue without end behind
/// slow requests of that family.
pub(super) fn family_wait(app: &App) -> Duration {
    Duration::from_millis(app.config.request_timeout_ms)
        .saturating_mul(5)
        .max(Duration::from_secs(1))
}

/// The permits a request holds while it runs.
pub(super) struct Admitted {
    _pool: OwnedPermit,
    _read: Option<OwnedPermit>,
    _family: OwnedPermit,
}

impl Gates {
    pub(super) fn new(app: &App, draining: watch::Receiver<bool>) -> Gates {
        let pool = app.config.max_instances;
        Gates {
            pool: Arc::new(Semaphore::new(pool as usize)),
            reads: Arc::new(Semaphore::new((pool - write_reserve(pool)) as usize)),
            families: std::sync::Mutex::new(HashMap::default()),
            bodies: Arc::new(Budget::new(kib(app.config.pending_body_budget()))),
            // None per address where the operator counts no address
            // (`max_connections_per_ip = 0`: every client may come
            // through one proxy that is not a trusted one).
            bodies_by_address: (app.config.max_connections_per_ip != 0).then(|| {
                Arc::new(super::shares::Shares::new(
                    u64::MAX,
                    u64::from(address_body_share(
                        kib(app.config.pending_body_budget()),
                        app.config.max_body_bytes,
                    )),
                ))
            }),
            draining,
            host_bodies: Arc::new(Semaphore::new(host_body_slots())),
            unsent: super::answers::Unsent::new(app.config.max_unsent_answer_bytes),
        }
    }

    /// `family`'s gates, made at its first request.
    pub(super) fn family(&self, app: &App, family: &str) -> Arc<FamilyGates> {
        let mut families = self.families.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = families.get(family) {
            return g.clone();
        }
        let limit = app
            .config
            .family(family)
            .and_then(|f| f.max_concurrent)
            .unwrap_or_else(|| default_family_limit(app.config.max_instances));
        let share = family_body_share(
            kib(app.config.pending_body_budget()),
            limit,
            app.config.max_instances,
            app.config.max_body_bytes,
        );
        let g = Arc::new(FamilyGates {
            slots: Arc::new(Semaphore::new(limit as usize)),
            bodies: Budget::new(share),
            large_bodies: Budget::new(share),
        });
        families.insert(family.to_string(), g.clone());
        g
    }

    /// A body to count before its request runs: of a family's (`gates`;
    /// `large` for a route that declares a larger limit than the usual),
    /// or of a host route's.
    pub(super) fn pending_body(
        &self,
        gates: Option<&Arc<FamilyGates>>,
        large: bool,
        client: IpAddr,
    ) -> PendingBody {
        PendingBody {
            family: gates.cloned(),
            large,
            all: self.bodies.clone(),
            client,
            by_address: self.bodies_by_address.clone(),
            kib: 0,
        }
    }

    /// [`Gates::enter`] when every permit is free now, without waiting.
    pub(super) fn try_enter(&self, gates: &Arc<FamilyGates>, writes: bool) -> Option<Admitted> {
        let own = gates.slots.clone().try_acquire_owned().ok()?;
        let read = match writes {
            true => None,
            false => Some(self.reads.clone().try_acquire_owned().ok()?),
        };
        Some(Admitted {
            _pool: self.pool.clone().try_acquire_owned().ok()?,
            _read: read,
            _family: own,
        })
    }

    /// Wait for a slot of `family` (its `gates`), then (for a read) of the
    /// reads' share, then of the pool. Refused (503): the family's
    /// `max_concurrent` slots stayed taken for [`family_wait`] (with
    /// Retry-After), or the server is shutting down.
    pub(super) async fn enter(
        &self,
        app: &App,
        family: &str,
        gates: Arc<FamilyGates>,
        writes: bool,
    ) -> Result<Admitted, Reply> {
        let shutting_down = || Reply::error(503, "plugin_unavailable", "shutting down");
        let slot = gates.slots.clone().acquire_owned();
        let own = match tokio::time::timeout(family_wait(app), slot).await {
            Ok(permit) => permit.map_err(|_| shutting_down())?,
            Err(_) => {
                return Err(busy(format!(
                    "{family} is busy: its max_concurrent requests are all running; retry shortly"
                )));
            }
        };
        let read = match writes {
            true => None,
            false => Some(
                self.reads
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| shutting_down())?,
            ),
        };
        let pool = self
            .pool
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| shutting_down())?;
        Ok(Admitted {
            _pool: pool,
            _read: read,
            _family: own,
        })
    }
}

pub(super) type OwnedPermit = tokio::sync::OwnedSemaphorePermit;

/// 503 `plugin_unavailable` with Retry-After.
pub(super) fn busy(why: String) -> Reply {
    Reply::error(503, "plugin_unavailable", why).retry_after_a_second()
}

/// Admit a family's request that has to wait (its address's turn among its
/// long calls, then its slots), unless its connection is chosen to make
/// room meanwhile: then it gives way, answered 503 (the connection closes
/// after). With its admission, how long it waited for its address's turn.
pub(super) async fn admit_waiting(
    app: &Arc<App>,
    gates: &Gates,
    family: &str,
    family_gates: Arc<FamilyGates>,
    writes: bool,
    client: IpAddr,
    conn: &Arc<super::connections::State>,
) -> Result<(Option<long_calls::LongOf>, Admitted, std::time::Duration), Reply> {
    let admitted = async {
        let asked = std::time::Instant::now();
        let counted = match long_calls::address_turn(client, family, family_wait(app)).await {
            Ok(counted) => counted,
            Err(()) => {
                return Err(busy(format!(
                    "{family} is busy: {} of this address's requests of it are running long; retry shortly",
                    long_calls::per_address()
                )));
            }
        };
        // (Only this wait is its client's own doing.)
        let turn_waited = asked.elapsed();
        let permits = gates.enter(app, family, family_gates, writes).await?;
        Ok((counted, permits, turn_waited))
    };
    unless_giving_way(conn, admitted).await
}

/// Wait for `admission` unless the connection is chosen to make room
/// meanwhile ([`super::connections::State::give_way_if_waiting`]): then its
/// request gives way, admitted or not, answered 503 (the connection closes
/// after).
pub(super) async fn unless_giving_way<T>(
    conn: &Arc<super::connections::State>,
    admission: impl std::future::Future<Output = Result<T, Reply>>,
) -> Result<T, Reply> {
    let waiting = conn.waiting_for_admission();
    let admitted = tokio::select! {
        biased;
        admitted = admission => Some(admitted),
        () = conn.given_way() => None,
    };
    match admitted {
        Some(admitted) if waiting.admitted() => admitted,
        _ => Err(busy(
            "every connection place is taken: this request, waiting its turn, gave its place to another client; retry shortly".into(),
        ).closing()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_request_waiting_its_turn_gives_way_when_told_and_runs_when_admitted_first() {
        let conn = Arc::new(super::super::connections::State::default());
        // Admitted at once: it runs, and its connection waits no longer.
        let ran = unless_giving_way(&conn, async { Ok::<_, Reply>(7) }).await;
        assert_eq!(ran.ok(), Some(7));
        assert!(!conn.is_waiting());
        // Still waiting (a slot that never comes) when room is made: it
        // gives way, 503 and the connection closes after.
        let never = std::future::pending::<Result<(), Reply>>();
        let both = async {
            tokio::join!(unless_giving_way(&conn, never), async {
                tokio::task::yield_now().await;
                conn.give_way_if_waiting()
            })
        };
        // (A wait that never heeds being told would hang here.)
        let (gave_way, told) = tokio::time::timeout(std::time::Duration::from_secs(30), both)
            .await
            .expect("told to give way, it stops waiting");
        assert!(told);
        let reply = gave_way.unwrap_err();
        assert_eq!(reply.status, 503);
        assert!(
            reply
                .headers
                .iter()
                .any(|(n, v)| n == "connection" && v == "close")
        );
        // Nothing waits now: a later make_room finds none to tell.
        assert!(!conn.give_way_if_waiting());
    }

    #[test]
    fn a_family_holds_its_slots_share_of_body_memory_and_room_for_the_largest_body() {
        let mib = 1024;
        // Half the pool's slots, half the budget (KiB).
        assert_eq!(family_body_share(256 * mib, 128, 256, 2 << 20), 128 * mib);
        assert_eq!(family_body_share(96 * mib, 128, 256, 2 << 20), 48 * mib);
        // A family of one slot still takes two bodies of the largest size
        // a route may take (16 MiB), or of max_body_bytes if larger...
        assert_eq!(family_body_share(256 * mib, 1, 256, 2 << 20), 32 * mib);
        assert_eq!(family_body_share(256 * mib, 1, 256, 64 << 20), 128 * mib);
        // ...within the whole budget.
        assert_eq!(family_body_share(32 * mib, 128, 256, 2 << 20), 32 * mib);
    }
}
