//! The Batch API's metrics, on `/metrics` of its listener: batches by status (refreshed from
//! Redis, so every replica reports the whole deployment), lines ingested, results filed and
//! dropped, lines written to output and error files, the time from a batch's sealing to
//! its files being recorded, creates refused per tenant by its bound on lines not yet finished,
//! and what the sweeper removed.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StatusLabel {
    pub status: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabel {
    pub mode: String,
}

/// The front door's modes, each with its `inferq_front_requests_total` series from start-up.
pub const FRONT_MODES: [&str; 5] = ["live", "passthrough", "enqueue", "wait", "stream"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

/// What the sweeper removes: expired files, ended batches' records, orphaned objects.
pub const SWEPT_KINDS: [&str; 3] = ["file", "batch", "orphan"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FileLabel {
    pub file: String,
}

/// Every status an OpenAI batch can have: each has its `inferq_batch_batches` series from
/// start-up, at 0 until the first count read from Redis says otherwise.
pub const BATCH_STATUSES: [&str; 8] = [
    "validating",
    "failed",
    "in_progress",
    "finalizing",
    "completed",
    "expired",
    "cancelling",
    "cancelled",
];

/// Every metric of a replica.
#[derive(Debug)]
pub struct Metrics {
    pub registry: Registry,
    pub batches: Family<StatusLabel, Gauge<i64, std::sync::atomic::AtomicI64>>,
    pub lines_ingested: Counter<u64, AtomicU64>,
    pub results_filed: Counter<u64, AtomicU64>,
    pub results_dropped: Counter<u64, AtomicU64>,
    pub lines_written: Family<FileLabel, Counter<u64, AtomicU64>>,
    pub finalize_seconds: Histogram,
    pub front_requests: Family<ModeLabel, Counter<u64, AtomicU64>>,
    pub front_waiting: Gauge<i64, std::sync::atomic::AtomicI64>,
    pub front_busy: Counter<u64, AtomicU64>,
    pub front_joined: Counter<u64, AtomicU64>,
    pub front_disconnect_cancels: Counter<u64, AtomicU64>,
    pub limit_refusals: Family<TenantLabel, Counter<u64, AtomicU64>>,
    pub swept: Family<KindLabel, Counter<u64, AtomicU64>>,
    /// Lines per tenant (see [`crate::tenants`]).
    pub tenants: crate::tenants::TenantMetrics,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let batches = Family::<StatusLabel, Gauge<i64, std::sync::atomic::AtomicI64>>::default();
        registry.register(
            "inferq_batch_batches",
            "Batches by status, across every replica (read from Redis)",
            batches.clone(),
        );
        let lines_ingested = Counter::default();
        registry.register(
            "inferq_batch_lines_ingested",
            "Input lines submitted to the request queue by this replica",
            lines_ingested.clone(),
        );
        let results_filed = Counter::default();
        registry.register(
            "inferq_batch_results_filed",
            "Results filed under their batch's line by this replica",
            results_filed.clone(),
        );
        let results_dropped = Counter::default();
        registry.register(
            "inferq_batch_results_dropped",
            "Results taken off the batch result list and dropped (a line's second result, an ended or unknown batch, an unreadable entry)",
            results_dropped.clone(),
        );
        let lines_written = Family::<FileLabel, Counter<u64, AtomicU64>>::default();
        registry.register(
            "inferq_batch_lines_written",
            "Lines written to output (file=output) and error (file=error) files by this replica",
            lines_written.clone(),
        );
        let finalize_seconds =
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
        registry.register(
            "inferq_batch_finalize_seconds",
            "Time to write a sealed batch's output and error files and record its ending",
            finalize_seconds.clone(),
        );
        let front_requests = Family::<ModeLabel, Counter<u64, AtomicU64>>::default();
        registry.register(
            "inferq_front_requests",
            "Requests taken by this replica's front door, by mode (live: no X-AP-Mode; passthrough, enqueue, wait; stream: wait mode with stream: true)",
            front_requests.clone(),
        );
        let front_waiting = Gauge::<i64, std::sync::atomic::AtomicI64>::default();
        registry.register(
            "inferq_front_waiting_clients",
            "Clients this replica holds waiting (wait mode, streams, long polls)",
            front_waiting.clone(),
        );
        let front_busy = Counter::default();
        registry.register(
            "inferq_front_busy",
            "Waits refused with 429 because --max-waiting-clients were waiting",
            front_busy.clone(),
        );
        let front_joined = Counter::default();
        registry.register(
            "inferq_front_joined",
            "Queued requests whose id named a request pending or not yet fetched, which they joined instead of running again",
            front_joined.clone(),
        );
        let front_disconnect_cancels = Counter::default();
        registry.register(
            "inferq_front_disconnect_cancels",
            "Requests cancelled because the client waiting for them went away",
            front_disconnect_cancels.clone(),
        );
        let limit_refusals = Family::<TenantLabel, Counter<u64, AtomicU64>>::default();
        registry.register(
            "inferq_batch_limit_refusals",
            "Batch creates refused with 429 because the tenant's lines not yet finished would pass its bound (--max-enqueued-lines or its key's max_enqueued_lines)",
            limit_refusals.clone(),
        );
        let swept = Family::<KindLabel, Counter<u64, AtomicU64>>::default();
        registry.register(
            "inferq_batch_swept",
            "What this replica's sweeper removed: expired files (kind=file), ended batches' records past --batch-retention (kind=batch), objects no key names (kind=orphan)",
            swept.clone(),
        );
        for kind in SWEPT_KINDS {
            let _ = swept.get_or_create(&KindLabel {
                kind: kind.to_owned(),
            });
        }
        let tenants = crate::tenants::TenantMetrics::register(&mut registry);
        for mode in FRONT_MODES {
            let _ = front_requests.get_or_create(&ModeLabel {
                mode: mode.to_owned(),
            });
        }
        // Every series whose labels are known exists at 0 from start-up (go-v011 §4).
        for status in BATCH_STATUSES {
            let _ = batches.get_or_create(&StatusLabel {
                status: status.to_owned(),
            });
        }
        for file in ["output", "error"] {
            let _ = lines_written.get_or_create(&FileLabel {
                file: file.to_owned(),
            });
        }
        Metrics {
            registry,
            batches,
            lines_ingested,
            results_filed,
            results_dropped,
            lines_written,
            finalize_seconds,
            front_requests,
            front_waiting,
            front_busy,
            front_joined,
            front_disconnect_cancels,
            limit_refusals,
            swept,
            tenants,
        }
    }

    /// Exports the per-tenant series of `tenants` at 0 (the keys' tenants are known at start).
    pub fn known_tenants(&self, tenants: &[String]) {
        for tenant in tenants {
            let _ = self.limit_refusals.get_or_create(&TenantLabel {
                tenant: tenant.clone(),
            });
        }
    }

    /// Counts a create refused by `tenant`'s bound.
    pub fn limit_refused(&self, tenant: &str) {
        self.limit_refusals
            .get_or_create(&TenantLabel {
                tenant: tenant.to_owned(),
            })
            .inc();
    }

    /// Counts `n` removals of `kind` (one of [`SWEPT_KINDS`]).
    pub fn count_swept(&self, kind: &str, n: u64) {
        self.swept
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc_by(n);
    }

    /// Counts a front-door request of `mode`.
    pub fn front_request(&self, mode: &str) {
        self.front_requests
            .get_or_create(&ModeLabel {
                mode: mode.to_owned(),
            })
            .inc();
    }

    /// The exposition text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_status_and_file_is_there_at_zero_from_the_start() {
        let metrics = Metrics::new();
        metrics.known_tenants(&["a".to_owned(), "b".to_owned()]);
        let page = metrics.encode();
        for tenant in ["a", "b"] {
            let series = format!("inferq_batch_limit_refusals_total{{tenant=\"{tenant}\"}} 0");
            assert!(page.contains(&series), "{series} missing from {page}");
        }
        for status in BATCH_STATUSES {
            let series = format!("inferq_batch_batches{{status=\"{status}\"}} 0");
            assert!(page.contains(&series), "{series} missing from {page}");
        }
        assert!(
            page.contains("inferq_batch_lines_written_total{file=\"error\"} 0"),
            "{page}"
        );
        for series in [
            "inferq_front_requests_total{mode=\"wait\"} 0",
            "inferq_front_requests_total{mode=\"enqueue\"} 0",
            "inferq_front_waiting_clients 0",
            "inferq_front_busy_total 0",
            "inferq_front_requests_total{mode=\"passthrough\"} 0",
            "inferq_front_requests_total{mode=\"live\"} 0",
            "inferq_front_joined_total 0",
            "inferq_front_disconnect_cancels_total 0",
            "inferq_batch_swept_total{kind=\"orphan\"} 0",
        ] {
            assert!(page.contains(series), "{series} missing from {page}");
        }
    }
}
