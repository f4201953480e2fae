//! The feedback gates' metric families: `aimd`'s per-band windows (Go's proposed names,
//! `llm_d_async_async_aimd_*{pool_name,band}`) and `slack`'s window and signals
//! (`inferq_slack_*{pool_name}`, inferq's own). A gate built with an owner takes its series
//! from here at start-up, so each exists (at its starting value) before the first request.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::metrics::PoolLabels;

/// A gauge that holds a fraction (a window grows by `increase / window`).
pub type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;

/// One `aimd` band of one pool.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BandLabels {
    pub pool_name: String,
    pub band: String,
}

/// One kind of answer in one `aimd` band.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BandOutcomeLabels {
    pub pool_name: String,
    pub band: String,
    pub outcome: String,
}

/// Every family of the feedback gates.
#[derive(Debug, Default)]
pub struct FeedbackMetrics {
    pub aimd_window: Family<BandLabels, FloatGauge>,
    pub aimd_ssthresh: Family<BandLabels, FloatGauge>,
    pub aimd_inflight: Family<BandLabels, Gauge>,
    pub aimd_outcomes: Family<BandOutcomeLabels, Counter>,
    pub slack_window: Family<PoolLabels, FloatGauge>,
    pub slack_inflight: Family<PoolLabels, Gauge>,
    pub slack_signal: Family<PoolLabels, FloatGauge>,
    pub slack_signal_available: Family<PoolLabels, Gauge>,
    pub slack_capacity: Family<PoolLabels, FloatGauge>,
    pub slack_others: Family<PoolLabels, FloatGauge>,
    pub slack_baseline: Family<PoolLabels, FloatGauge>,
    pub slack_latency: Family<PoolLabels, FloatGauge>,
    pub slack_preempted: Family<PoolLabels, Counter>,
}

impl FeedbackMetrics {
    /// Adds every family to the registry.
    pub fn register(&self, r: &mut Registry) {
        let aimd = |name: &str| format!("llm_d_async_async_aimd_{name}");
        r.register(
            aimd("window"),
            "An aimd band's congestion window",
            self.aimd_window.clone(),
        );
        r.register(
            aimd("ssthresh"),
            "An aimd band's slow-start threshold",
            self.aimd_ssthresh.clone(),
        );
        r.register(
            aimd("inflight"),
            "Requests an aimd band has at the gateway",
            self.aimd_inflight.clone(),
        );
        r.register(
            aimd("outcomes"),
            "Answers an aimd band has seen, by how it classified them",
            self.aimd_outcomes.clone(),
        );
        r.register(
            "inferq_slack_window",
            "The slack gate's window: requests it lets be at the gateway at once",
            self.slack_window.clone(),
        );
        r.register(
            "inferq_slack_inflight",
            "Requests the slack gate has at the gateway",
            self.slack_inflight.clone(),
        );
        r.register(
            "inferq_slack_signal",
            "The slack gate's last reading of signal_metric (the pool's standing queue)",
            self.slack_signal.clone(),
        );
        r.register(
            "inferq_slack_signal_available",
            "Whether the slack gate's signal_url answered lately (1) or it steers on latency alone (0)",
            self.slack_signal_available.clone(),
        );
        r.register(
            "inferq_slack_capacity",
            "Sequences the slack gate has learnt the pool runs before it queues (0: not yet known)",
            self.slack_capacity.clone(),
        );
        r.register(
            "inferq_slack_others",
            "Sequences in the pool that are not the slack gate's (interactive traffic), as it reckons them",
            self.slack_others.clone(),
        );
        r.register(
            "inferq_slack_baseline_seconds_per_token",
            "The slack gate's no-load latency per output token (0: not yet measured)",
            self.slack_baseline.clone(),
        );
        r.register(
            "inferq_slack_latency_seconds_per_token",
            "The slack gate's recent median latency per output token",
            self.slack_latency.clone(),
        );
        r.register(
            "inferq_slack_preempted",
            "Requests the slack gate took back from the gateway to make room for a standing queue",
            self.slack_preempted.clone(),
        );
    }
}
