//! Process metrics in the Prometheus text format (`prometheus-client`).
//!
//! One registry per process ([`metrics()`]); every layer counts into it, and
//! the server renders it on `GET /metrics` of the admin listener and of the
//! optional `metrics_listen` listener. Values read from storage (ledger
//! totals) are set by the server just before rendering ([`Metrics::ledger`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub family: String,
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub family: String,
    pub route: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FamilyLabels {
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FaultLabels {
    pub family: String,
    /// `trap`, `timeout` or `memory`.
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SwapLabels {
    pub family: String,
    /// `ok`, `refused` or `unmounted`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CodeLabels {
    pub code: String,
}

/// The kinds of a plugin call's fault (`FaultLabels::kind`).
const FAULT_KINDS: [&str; 3] = ["trap", "timeout", "memory"];
/// The results of a swap (`SwapLabels::result`).
const SWAP_RESULTS: [&str; 3] = ["ok", "refused", "unmounted"];
/// The error codes of a 402 (PROTOCOL 3).
pub const PAYMENT_REFUSALS: [&str; 5] = [
    "payment_required",
    "payment_invalid",
    "payment_spent",
    "payment_insufficient",
    "payment_rail_unavailable",
];

/// Every metric of the process.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<RouteLabels, Histogram>,
    pub instantiate_seconds: Family<FamilyLabels, Histogram>,
    pub call_seconds: Family<FamilyLabels, Histogram>,
    pub teardown_seconds: Family<FamilyLabels, Histogram>,
    pub faults: Family<FaultLabels, Counter>,
    pub swaps: Family<SwapLabels, Counter>,
    pub payments_refused: Family<CodeLabels, Counter>,
    pub commits: Counter,
    /// Runs again of requests (and host writes) that lost a race on the
    /// shared store.
    pub conflict_retries: Counter,
    /// Refusals on the shared store read from a batch begun before their
    /// request, run again in a batch of their own.
    pub stale_refusals: Counter,
    pub fsyncs: Counter,
    pub commit_batch: Histogram,
    pub connections: Gauge,
    pub in_flight: Gauge,
    /// Bytes (counted in KiB) of request bodies held before their request
    /// runs.
    pub pending_body_bytes: Gauge,
    /// Bytes of large answers of reads not yet sent to their clients.
    pub unsent_answer_bytes: Gauge,
    /// Bytes of linear memory the plugin calls in progress hold (set
    /// from the runtime's count when the metrics are read).
    pub plugin_memory_bytes: Gauge,
    /// Bytes free on the data dir's filesystem (embedded store with a
    /// `min_free_disk_mib`), read every 250 ms.
    pub disk_free_bytes: Gauge,
    pub refused_connections: Counter,
    pub connections_closed_for_room: Counter,
    /// Connections the server ended before their client, being drained
    /// ([`crate::server::linger`]), and those closed without it.
    pub connections_draining: Gauge,
    pub connections_not_drained: Counter,
    /// Times a plugin call that ran long waited for a turn to go on.
    pub long_call_waits: Counter,
    /// Requests that waited to be admitted while their address's calls of
    /// their family ran long.
    pub address_waits: Counter,
    pub ledger_minted: LedgerGauge,
    pub ledger_unspent: LedgerGauge,
    pub ledger_fees: LedgerGauge,
    pub ledger_escrow: LedgerGauge,
    /// Problems found at start that need the operator ([`crate::alerts`]).
    pub alerts: Gauge,
}

/// A ledger total in units. The ledger counts up to `u64::MAX` units
/// (184 billion webcash), past the `i64` of an integer gauge: these are
/// floats, as Prometheus keeps every sample (exact up to 2^53 units,
/// about 90 million webcash).
pub type LedgerGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One route's request metrics, looked up once (by its labels) and kept
/// with the route: an answered request then costs no label allocation or
/// hash lookup.
#[derive(Debug, Clone, Default)]
pub struct RouteMetrics {
    seconds: OnceLock<Histogram>,
    /// The counters of the first statuses the route answered.
    answered: [OnceLock<(u16, Counter)>; 6],
}

impl RouteMetrics {
    /// Count a request of the route `pattern` of `family` answered with
    /// `status` after `seconds`. A 408 (the client's body did not arrive
    /// in time) is counted but not timed: its seconds are the client's
    /// delay, which would make the route's latency look like the server's
    /// (ten-second 408s of slow clients had put one route's mean at 2.2 s
    /// while its median was under 1 ms).
    pub fn answered(&self, family: &str, pattern: &str, status: u16, seconds: f64) {
        let m = metrics();
        let labels = || RequestLabels {
            family: family.to_string(),
            route: pattern.to_string(),
            status,
        };
        if status != 408 {
            self.timed(family, pattern, seconds);
        }
        for slot in &self.answered {
            let (s, counter) =
                slot.get_or_init(|| (status, m.requests.get_or_create(&labels()).clone()));
            if *s == status {
                counter.inc();
                return;
            }
        }
        m.requests.get_or_create(&labels()).inc();
    }

    /// Observe `seconds` in the route's duration histogram.
    fn timed(&self, family: &str, pattern: &str, seconds: f64) {
        self.seconds
            .get_or_init(|| {
                metrics()
                    .request_seconds
                    .get_or_create(&RouteLabels {
                        family: family.to_string(),
                        route: pattern.to_string(),
                    })
                    .clone()
            })
            .observe(seconds);
    }
}

/// A loaded component's call histograms (instantiation, call, teardown),
/// looked up on its first call and kept with it.
#[derive(Debug, Default)]
pub struct PluginMetrics {
    seconds: OnceLock<[Histogram; 3]>,
}

impl PluginMetrics {
    fn histograms(&self, family: &str) -> &[Histogram; 3] {
        self.seconds.get_or_init(|| {
            let m = metrics();
            let labels = FamilyLabels {
                family: family.into(),
            };
            [&m.instantiate_seconds, &m.call_seconds, &m.teardown_seconds]
                .map(|f| f.get_or_create(&labels).clone())
        })
    }

    /// Count a call of `family`'s component: `instantiate` to make its
    /// instance, `call` to run it.
    pub fn call(&self, family: &str, instantiate: Duration, call: Duration) {
        let [i, c, _] = self.histograms(family);
        i.observe(instantiate.as_secs_f64());
        c.observe(call.as_secs_f64());
    }

    /// Count the teardown of a call's instance (its store dropped: the
    /// pool's slots reset, most of it the memory slot's pages).
    pub fn teardown(&self, family: &str, took: Duration) {
        self.histograms(family)[2].observe(took.as_secs_f64());
    }
}

fn seconds_histogram() -> Histogram {
    // 50 us .. ~1.6 s
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// A plugin's instantiation and a cheap handler take a few to a few tens
/// of microseconds: with the requests' 50 us first bucket every one of
/// them fell in it. 5 us .. ~2.6 s.
fn plugin_seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_005, 2.0, 20))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("marketplace");
        let m = Metrics {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(seconds_histogram),
            instantiate_seconds: Family::new_with_constructor(plugin_seconds_histogram),
            call_seconds: Family::new_with_constructor(plugin_seconds_histogram),
            teardown_seconds: Family::new_with_constructor(plugin_seconds_histogram),
            faults: Family::default(),
            swaps: Family::default(),
            payments_refused: Family::default(),
            commits: Counter::default(),
            conflict_retries: Counter::default(),
            stale_refusals: Counter::default(),
            fsyncs: Counter::default(),
            commit_batch: Histogram::new(exponential_buckets(1.0, 2.0, 12)),
            connections: Gauge::default(),
            in_flight: Gauge::default(),
            pending_body_bytes: Gauge::default(),
            unsent_answer_bytes: Gauge::default(),
            plugin_memory_bytes: Gauge::default(),
            disk_free_bytes: Gauge::default(),
            refused_connections: Counter::default(),
            connections_closed_for_room: Counter::default(),
            connections_draining: Gauge::default(),
            connections_not_drained: Counter::default(),
            long_call_waits: Counter::default(),
            address_waits: Counter::default(),
            ledger_minted: LedgerGauge::default(),
            ledger_unspent: LedgerGauge::default(),
            ledger_fees: LedgerGauge::default(),
            ledger_escrow: LedgerGauge::default(),
            alerts: Gauge::default(),
            registry: Registry::default(),
        };
        let r = &mut registry;
        r.register(
            "requests",
            "Requests answered, by family (or host), route pattern and status",
            m.requests.clone(),
        );
        r.register(
            "request_duration_seconds",
            "Time from routing to the answer, by family and route (408s, the client's delay, are not timed)",
            m.request_seconds.clone(),
        );
        r.register(
            "plugin_instantiate_seconds",
            "Time to instantiate a plugin for one call",
            m.instantiate_seconds.clone(),
        );
        r.register(
            "plugin_call_seconds",
            "Time a plugin's handler ran (with its host calls)",
            m.call_seconds.clone(),
        );
        r.register(
            "plugin_teardown_seconds",
            "Time to tear a call's instance down (the pool's slots reset for the next call)",
            m.teardown_seconds.clone(),
        );
        r.register(
            "plugin_faults",
            "Plugin calls that trapped, ran out of time or hit the memory cap",
            m.faults.clone(),
        );
        r.register(
            "plugin_swaps",
            "Component swaps, mounts and unmounts, by result",
            m.swaps.clone(),
        );
        r.register(
            "payments_refused",
            "Payments refused (402), by error code",
            m.payments_refused.clone(),
        );
        r.register("commits", "Write transactions committed", m.commits.clone());
        r.register(
            "store_conflict_retries",
            "Requests run again after losing a race on the shared store",
            m.conflict_retries.clone(),
        );
        r.register(
            "store_stale_refusals",
            "Refusals read from a shared-store batch begun before their request, run again in a batch of their own",
            m.stale_refusals.clone(),
        );
        r.register(
            "fsyncs",
            "Durable commits (one per batch)",
            m.fsyncs.clone(),
        );
        r.register(
            "commit_batch_size",
            "Requests per durable commit",
            m.commit_batch.clone(),
        );
        r.register(
            "connections_open",
            "Client connections open",
            m.connections.clone(),
        );
        r.register(
            "connections_refused",
            "Client connections closed as they came: their address held max_connections_per_ip",
            m.refused_connections.clone(),
        );
        r.register(
            "connections_closed_for_room",
            "Connections not inside a request closed to make room for a new client at max_connections (of the address holding the most)",
            m.connections_closed_for_room.clone(),
        );
        r.register(
            "connections_draining",
            "Connections the server ended before their client (a refused body), read and dropped until the client closes so it reads its answer",
            m.connections_draining.clone(),
        );
        r.register(
            "connections_not_drained",
            "Connections the server ended before their client closed without draining (512 draining, or 64 of one address): the client may see a reset instead of its answer",
            m.connections_not_drained.clone(),
        );
        r.register(
            "requests_in_flight",
            "Requests being served",
            m.in_flight.clone(),
        );
        r.register(
            "pending_body_bytes",
            "Bytes of request bodies held before their request runs (being received, or waiting for a slot), counted in KiB",
            m.pending_body_bytes.clone(),
        );
        r.register(
            "plugin_memory_bytes",
            "Bytes of linear memory the plugin calls in progress hold, of plugin_memory_total_mib",
            m.plugin_memory_bytes.clone(),
        );
        r.register(
            "disk_free_bytes",
            "Bytes free on the data dir's filesystem (the embedded store with min_free_disk_mib set); below min_free_disk_mib writes are refused with 503 disk_full",
            m.disk_free_bytes.clone(),
        );
        r.register(
            "unsent_answer_bytes",
            "Bytes of large answers (over 64 KiB) of reads held until their clients read them, of max_unsent_answer_bytes",
            m.unsent_answer_bytes.clone(),
        );
        r.register(
            "ledger_minted_units",
            "Cash minted by the operator (1e-8 units)",
            m.ledger_minted.clone(),
        );
        r.register(
            "ledger_unspent_units",
            "Cash in unspent outputs (minted - fees - escrow)",
            m.ledger_unspent.clone(),
        );
        r.register("ledger_fees_units", "Fees earned", m.ledger_fees.clone());
        r.register(
            "ledger_escrow_units",
            "Cash held in contracts' escrow, payouts and refunds not yet picked up included",
            m.ledger_escrow.clone(),
        );
        r.register(
            "plugin_long_call_waits",
            "Times a plugin call that had run 5 ms of its own time on an async worker waited for one of the turns long calls take (one per worker) to go on",
            m.long_call_waits.clone(),
        );
        r.register(
            "plugin_address_waits",
            "Requests that waited to be admitted while two calls of their family for their client address ran long",
            m.address_waits.clone(),
        );
        r.register(
            "alerts",
            "Problems found at start that need the operator (a damaged write-ahead log, a changed key): see the alerts of GET /api/health and the log's ERROR lines",
            m.alerts.clone(),
        );
        // The codes a 402 can carry, at 0 from the start (as a family's
        // series from its mount: [`Metrics::family_mounted`]).
        for code in PAYMENT_REFUSALS {
            drop(
                m.payments_refused
                    .get_or_create(&CodeLabels { code: code.into() }),
            );
        }
        Metrics { registry, ..m }
    }

    /// The whole registry in the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::error!("encoding metrics: {e}");
        }
        out
    }

    /// Set the ledger gauges (units).
    pub fn ledger(&self, minted: u64, fees: u64, escrow: u64) {
        let g = |v: u64| v as f64;
        self.ledger_minted.set(g(minted));
        self.ledger_fees.set(g(fees));
        self.ledger_escrow.set(g(escrow));
        self.ledger_unspent
            .set(g(minted.saturating_sub(fees).saturating_sub(escrow)));
    }

    /// Show `family`'s plugin series at 0 (faults and swaps of every kind,
    /// the call histograms) from its mount on: a family with no series
    /// until its first fault would leave an alert rule on its rate with
    /// nothing to read.
    pub fn family_mounted(&self, family: &str) {
        for kind in FAULT_KINDS {
            drop(self.faults.get_or_create(&FaultLabels {
                family: family.into(),
                kind: kind.into(),
            }));
        }
        for result in SWAP_RESULTS {
            drop(self.swaps.get_or_create(&SwapLabels {
                family: family.into(),
                result: result.into(),
            }));
        }
        let labels = FamilyLabels {
            family: family.into(),
        };
        for histograms in [
            &self.instantiate_seconds,
            &self.call_seconds,
            &self.teardown_seconds,
        ] {
            drop(histograms.get_or_create(&labels));
        }
    }

    /// Count a fault of a plugin call.
    pub fn fault(&self, family: &str, kind: &str) {
        debug_assert!(FAULT_KINDS.contains(&kind), "{kind} is not in FAULT_KINDS");
        self.faults
            .get_or_create(&FaultLabels {
                family: family.into(),
                kind: kind.into(),
            })
            .inc();
    }

    /// Count a swap, mount or unmount.
    pub fn swap(&self, family: &str, result: &str) {
        debug_assert!(
            SWAP_RESULTS.contains(&result),
            "{result} is not in SWAP_RESULTS"
        );
        self.swaps
            .get_or_create(&SwapLabels {
                family: family.into(),
                result: result.into(),
            })
            .inc();
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_render_in_the_text_format() {
        let m = Metrics::new();
        m.requests
            .get_or_create(&RequestLabels {
                family: "timeline".into(),
                route: "/api/timeline".into(),
                status: 201,
            })
            .inc();
        m.fault("search", "timeout");
        m.ledger(100, 10, 20);
        let text = m.render();
        assert!(text.contains(
            r#"marketplace_requests_total{family="timeline",route="/api/timeline",status="201"} 1"#
        ), "{text}");
        assert!(
            text.contains(r#"marketplace_plugin_faults_total{family="search",kind="timeout"} 1"#)
        );
        assert!(text.contains("marketplace_ledger_unspent_units 70"));
        assert!(text.ends_with("# EOF\n"));
    }

    #[test]
    fn plugin_calls_of_microseconds_fall_in_buckets_of_their_own() {
        let m = Metrics::new();
        let labels = FamilyLabels {
            family: "testing".into(),
        };
        let instantiate = m.instantiate_seconds.get_or_create(&labels);
        instantiate.observe(Duration::from_micros(12).as_secs_f64());
        instantiate.observe(Duration::from_micros(40).as_secs_f64());
        m.call_seconds
            .get_or_create(&labels)
            .observe(Duration::from_secs(2).as_secs_f64());
        let text = m.render();
        let bucket = |name: &str, le: &str| {
            let line = format!(r#"marketplace_{name}_bucket{{le="{le}",family="testing"}} "#);
            let at = text
                .find(&line)
                .unwrap_or_else(|| panic!("{line} in {text}"));
            text[at + line.len()..].lines().next().unwrap().to_string()
        };
        // 12 us and 40 us no longer share the first bucket.
        assert_eq!(bucket("plugin_instantiate_seconds", "0.00001"), "0");
        assert_eq!(bucket("plugin_instantiate_seconds", "0.00002"), "1");
        assert_eq!(bucket("plugin_instantiate_seconds", "0.00004"), "2");
        // A two-second call still has a finite bucket.
        assert_eq!(bucket("plugin_call_seconds", "2.62144"), "1");
        assert_eq!(bucket("plugin_call_seconds", "1.31072"), "0");
    }

    #[test]
    fn ledger_totals_past_i64_are_not_clamped() {
        // 100,000,000,001 webcash minted: 10^19 + 10^8 units, over
        // i64::MAX (an integer gauge showed 9223372036854775807).
        let m = Metrics::new();
        let minted = 10_000_000_000_100_000_000u64;
        m.ledger(minted, 100_000_000, 0);
        let text = m.render();
        let value = |name: &str| -> f64 {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap();
            line.split_whitespace().nth(1).unwrap().parse().unwrap()
        };
        assert_eq!(value("marketplace_ledger_minted_units"), minted as f64);
        assert_eq!(value("marketplace_ledger_unspent_units"), 1e19);
        assert!(!text.contains(&i64::MAX.to_string()), "{text}");
    }

    #[test]
    fn a_routes_kept_metrics_count_into_the_registry() {
        let r = RouteMetrics::default();
        let statuses = [200, 200, 404, 201, 400, 402, 409, 422, 500, 503, 200, 503];
        for status in statuses {
            r.answered("kept-test", "/api/kept/{id}", status, 0.001);
        }
        // A second route value (a table rebuilt at a swap) adds to the same.
        RouteMetrics::default().answered("kept-test", "/api/kept/{id}", 200, 0.001);
        // A 408, the client's delay, is counted and not timed.
        r.answered("kept-test", "/api/kept/{id}", 408, 10.0);
        let text = metrics().render();
        for (status, n) in [
            (200, 4),
            (404, 1),
            (201, 1),
            (408, 1),
            (409, 1),
            (500, 1),
            (503, 2),
        ] {
            let line = format!(
                r#"marketplace_requests_total{{family="kept-test",route="/api/kept/{{id}}",status="{status}"}} {n}"#
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        let count = r#"marketplace_request_duration_seconds_count{family="kept-test",route="/api/kept/{id}"} 13"#;
        assert!(text.contains(count), "{text}");
    }
}
