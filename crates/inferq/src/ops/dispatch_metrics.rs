//! The metrics newer Go (go-v011 §2, §4) added to the processor's page: every send to the
//! gateway, the tokens its answers report, requests put back after waiting too long at a pool
//! gate (and, inferq's own, after the router evicted them), and a snapshot of how far pending requests are from their deadlines. [`super::Metrics`]
//! holds them as one field and registers them with the rest.

use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::encoding::{EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use super::metrics::QueueLabels;

/// `tokens_total`'s labels: the queue's and `direction` (`input` or `output`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
    pub direction: String,
}

/// The upper bounds (milliseconds to the deadline) of `deadline_proximity_millis`: `0` holds
/// the requests already past their deadline; the last finite bound is a day.
pub const PROXIMITY_BOUNDS_MS: [f64; 13] = [
    0.0, 1e3, 5e3, 1e4, 3e4, 6e4, 3e5, 6e5, 1.8e6, 3.6e6, 2.16e7, 4.32e7, 8.64e7,
];

/// A histogram set whole from a reading (not observed one value at a time): the pending
/// requests of a queue by how far they are from their deadlines, as the last ZCOUNTs found
/// them. Its `_sum` is 0: counts over score ranges give no sum. `rate()` means nothing on it.
#[derive(Clone, Debug, Default)]
pub struct ProximitySnapshot {
    /// Cumulative counts per bound of [`PROXIMITY_BOUNDS_MS`], then the total (`+Inf`).
    cumulative: Arc<Mutex<Vec<u64>>>,
}

impl ProximitySnapshot {
    /// Sets the snapshot: `cumulative[i]` requests are within `PROXIMITY_BOUNDS_MS[i]` of
    /// their deadline (or past it), `total` are pending.
    pub fn set(&self, cumulative: &[u64], total: u64) {
        let mut all = cumulative.to_vec();
        all.push(total);
        *self
            .cumulative
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = all;
    }
}

impl TypedMetric for ProximitySnapshot {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for ProximitySnapshot {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let cumulative = self
            .cumulative
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let at = |i: usize| cumulative.get(i).copied().unwrap_or(0);
        let mut buckets = Vec::with_capacity(PROXIMITY_BOUNDS_MS.len() + 1);
        let mut below = 0;
        for (i, bound) in PROXIMITY_BOUNDS_MS
            .iter()
            .chain(std::iter::once(&f64::INFINITY))
            .enumerate()
        {
            // The encoder adds the buckets up again: hand it each bucket's own count. A count
            // read later in the pipeline may be lower if members left meanwhile: clamp.
            let upto = at(i).max(below);
            buckets.push((*bound, upto - below));
            below = upto;
        }
        encoder.encode_histogram::<NoLabelSet>(0.0, below, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// The families (see the module comment).
#[derive(Debug, Default)]
pub struct DispatchMetrics {
    /// Every send to the gateway, retries included (Go's `dispatched_requests_total`).
    pub dispatched: Family<QueueLabels, Counter>,
    /// Tokens from the answers' OpenAI `usage`, by direction.
    pub tokens: Family<DirectionLabels, Counter>,
    /// Requests put back in their queue after waiting `--gate-wait-timeout` at a pool gate.
    pub gate_wait_requeues: Family<QueueLabels, Counter>,
    /// Requests the router's flow control evicted (429 `evicted…`), each put back at once.
    pub evicted: Family<QueueLabels, Counter>,
    /// Pending requests by milliseconds to their deadline, a snapshot per backlog poll.
    pub deadline_proximity: Family<QueueLabels, ProximitySnapshot>,
}

impl QueueLabels {
    pub fn with_direction(&self, direction: &str) -> DirectionLabels {
        DirectionLabels {
            queue_id: self.queue_id.clone(),
            queue_name: self.queue_name.clone(),
            pool_name: self.pool_name.clone(),
            direction: direction.to_owned(),
        }
    }
}

/// `llm_d_async_async_<name>`.
fn go_name(name: &str) -> String {
    format!("llm_d_async_async_{name}")
}

impl DispatchMetrics {
    /// Registers the families under Go's names.
    pub fn register(&self, r: &mut Registry) {
        r.register(
            go_name("dispatched_requests"),
            "Requests sent to the gateway, retries included",
            self.dispatched.clone(),
        );
        r.register(
            go_name("tokens"),
            "Tokens reported by the answers' usage, by direction (input, output)",
            self.tokens.clone(),
        );
        r.register(
            go_name("gate_wait_requeues"),
            "Requests put back in their queue after waiting --gate-wait-timeout at a pool gate",
            self.gate_wait_requeues.clone(),
        );
        r.register(
            go_name("evicted_requests"),
            "Requests the router's flow control evicted (429 evicted), put back in their queue at once",
            self.evicted.clone(),
        );
        r.register(
            go_name("deadline_proximity_millis"),
            "Pending requests by milliseconds to their deadline (a snapshot; 0: past it)",
            self.deadline_proximity.clone(),
        );
    }

    /// Creates a queue's series at 0.
    pub fn precreate(&self, labels: &QueueLabels) {
        let _ = self.dispatched.get_or_create(labels);
        let _ = self.gate_wait_requeues.get_or_create(labels);
        let _ = self.evicted.get_or_create(labels);
        for direction in ["input", "output"] {
            let _ = self.tokens.get_or_create(&labels.with_direction(direction));
        }
        let _ = self.deadline_proximity.get_or_create(labels);
    }
}
