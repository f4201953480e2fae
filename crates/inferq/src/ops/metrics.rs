//! Prometheus metrics. Names and labels follow the Go processor (`llm_d_async_async_*`, labels
//! `queue_id`, `queue_name`, `pool_name`) so existing dashboards keep working; the durable-claims
//! names (`claim_depth`, `claims_expired`) are Go's too, and the rest are inferq's own.
//! Dispatch code records into [`Metrics`]; [`Metrics::encode`] renders the page Go's `/metrics`
//! serves (see [`super::exposition`]).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// The Go queue labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolLabels {
    pub pool_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
    pub outcome: String,
}

/// Reloads of the queues config by result: `success` or `error` (Go's label).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: String,
}

/// Wake-ups by where they came from: `doorbell` or `keyspace`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
    pub source: String,
}

/// Metric gates' gauges carry Go's `inference_pool` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PoolGaugeLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
    pub inference_pool: String,
}

/// Gate decisions carry Go's `reason` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub queue_id: String,
    pub queue_name: String,
    pub pool_name: String,
    pub reason: String,
}

impl QueueLabels {
    pub fn with_reason(&self, reason: &str) -> ReasonLabels {
        ReasonLabels {
            queue_id: self.queue_id.clone(),
            queue_name: self.queue_name.clone(),
            pool_name: self.pool_name.clone(),
            reason: reason.to_owned(),
        }
    }

    pub fn with_source(&self, source: &str) -> SourceLabels {
        SourceLabels {
            queue_id: self.queue_id.clone(),
            queue_name: self.queue_name.clone(),
            pool_name: self.pool_name.clone(),
            source: source.to_owned(),
        }
    }

    pub fn with_outcome(&self, outcome: &str) -> OutcomeLabels {
        OutcomeLabels {
            queue_id: self.queue_id.clone(),
            queue_name: self.queue_name.clone(),
            pool_name: self.pool_name.clone(),
            outcome: outcome.to_owned(),
        }
    }
}

type Counters = Family<QueueLabels, Counter>;
type Gauges = Family<QueueLabels, Gauge>;
type Histograms = Family<QueueLabels, Histogram>;

/// A family's name as the Go processor spells it.
fn go_name(name: &str) -> String {
    format!("llm_d_async_async_{name}")
}

fn inference_buckets() -> Histogram {
    Histogram::new([
        10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 3e4, 6e4, 1.2e5,
    ])
}

fn residence_buckets() -> Histogram {
    Histogram::new([
        500.0, 1e3, 2e3, 5e3, 1e4, 3e4, 6e4, 1.2e5, 3e5, 6e5, 1.8e6, 3.6e6, 7.2e6, 2.16e7, 4.32e7,
        8.64e7,
    ])
}

/// One queue's handle to one series of a family, looked up on first use and kept, so the hot
/// path does no label lookups. Like a direct `get_or_create`, the series appears in `/metrics`
/// only once it is first recorded (as Go's vectors do).
#[derive(Debug)]
pub struct Series<M> {
    family: Family<QueueLabels, M>,
    labels: QueueLabels,
    handle: std::sync::OnceLock<M>,
}

impl<M: Clone> Series<M> {
    fn new(family: &Family<QueueLabels, M>, labels: &QueueLabels) -> Series<M> {
        Series {
            family: family.clone(),
            labels: labels.clone(),
            handle: std::sync::OnceLock::new(),
        }
    }

    /// The series (created in its family on the first call).
    pub fn get(&self) -> &M {
        self.handle
            .get_or_init(|| self.family.get_or_create(&self.labels).clone())
    }
}

/// One queue's per-request series (see [`Metrics::queue_series`]).
#[derive(Debug)]
pub struct QueueSeries {
    pub requests: Series<Counter>,
    pub retries: Series<Counter>,
    pub successful: Series<Counter>,
    pub failed: Series<Counter>,
    pub exceeded: Series<Counter>,
    pub shedded: Series<Counter>,
    pub cancelled: Series<Counter>,
    pub inference_latency: Series<Histogram>,
    pub residence: Series<Histogram>,
    pub queue_depth: Series<Gauge>,
    pub inflight: Series<Gauge>,
    pub deliveries: Series<Counter>,
    pub fenced: Series<Counter>,
    pub claims_lost: Series<Counter>,
}

/// Every metric the processor records.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// First attempts started (`retry_count == 0`).
    pub requests: Counters,
    pub retries: Counters,
    pub successful: Counters,
    pub failed: Counters,
    pub exceeded: Counters,
    /// 429 answers.
    pub shedded: Counters,
    pub cancelled: Counters,
    /// Milliseconds per HTTP attempt.
    pub inference_latency: Histograms,
    /// Milliseconds from claim to a worker taking the request.
    pub residence: Histograms,
    /// Claimed requests waiting for a worker.
    pub queue_depth: Gauges,
    pub inflight: Gauges,
    /// Pending requests (ZCARD), polled.
    pub backlog: Gauges,
    /// Whether the last backlog read succeeded (1) or failed (0, and `backlog` reads 0).
    pub backlog_source_available: Gauges,
    pub pool_worker_limit: Family<PoolLabels, Gauge>,
    /// Queue gate budget at each poll.
    pub dispatch_budget: Family<QueueLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Gate decisions by reason: gate_closed, quota_exhausted, dropped, error.
    pub gate_decisions: Family<ReasonLabels, Counter>,
    /// A metric gate's last reading, its threshold, and whether its source answered.
    pub gate_metric_value: Family<PoolGaugeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub gate_metric_threshold: Family<PoolGaugeLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub gate_metric_source_available: Family<PoolGaugeLabels, Gauge>,
    /// A `redis-leased-rate` gate's last decision: the leased rate, whether the lease was valid,
    /// and when it ends (labelled by the gate's `pool_id`).
    pub drain_limit_rps: Family<PoolLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub drain_limit_lease_valid: Family<PoolLabels, Gauge>,
    pub drain_limit_valid_until: Family<PoolLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    /// Claims this instance holds (Go durable-claims name).
    pub claim_depth: Gauges,
    /// Redeliveries after lease expiry (Go durable-claims name).
    pub claims_expired: Counters,
    /// Renewal outcomes: renewed, lost, error.
    pub renewals: Family<OutcomeLabels, Counter>,
    /// Finishes refused by the fence (already done, or taken over).
    pub fenced: Counters,
    /// Outcomes waiting to be written to Redis.
    pub outbox_depth: Gauges,
    /// Outcomes dropped because the lease was known lost before Redis took them.
    pub outbox_dropped: Counters,
    /// Dead letters by reason: undecodable, deliveries.
    pub dead_letters: Family<OutcomeLabels, Counter>,
    /// Claims taken (each is one delivery attempt).
    pub deliveries: Counters,
    /// Requests peeked and decoded for a claim that found them already taken by another
    /// instance: the cost of instances racing for the same queue.
    pub claims_lost: Counters,
    /// In-flight requests aborted, by reason: lost, cancelled, shutdown.
    pub aborted: Family<OutcomeLabels, Counter>,
    /// Wake-ups received, by source: doorbell, keyspace.
    pub wakeups: Family<SourceLabels, Counter>,
    /// Messages received on a redis-pubsub channel, by outcome: admitted (new), duplicate
    /// (another instance admitted them first), lost (not admitted before a shutdown).
    pub pubsub_messages: Family<OutcomeLabels, Counter>,
    /// Reloads of the transport config file's queues, by result (Go's names).
    pub config_reloads: Family<ResultLabels, Counter>,
    /// Unix time of the last reload applied (0: none yet).
    pub config_last_success: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// The feedback gates' (`aimd`, `slack`) windows and signals.
    pub feedback: super::feedback_metrics::FeedbackMetrics,
    /// Sends, tokens, gate-wait requeues and deadline proximity (newer Go's).
    pub dispatch: super::dispatch_metrics::DispatchMetrics,
    /// `fair-share`'s served requests per tenant, weights and tenants with work.
    pub fair_share: super::fair_share_metrics::FairShareMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers every family, a group at a time, then the process collector (`/metrics` lists
    /// families sorted by name, see [`super::exposition`], so the groups are for the reader).
    pub fn new() -> Metrics {
        let m = Metrics::unregistered();
        let mut registry = Registry::default();
        m.register_request_counts(&mut registry);
        m.register_request_times(&mut registry);
        m.register_load(&mut registry);
        m.register_gates(&mut registry);
        m.register_config_reloads(&mut registry);
        m.register_drain_limits(&mut registry);
        m.register_claims(&mut registry);
        m.register_finishes(&mut registry);
        m.register_deliveries(&mut registry);
        m.feedback.register(&mut registry);
        m.dispatch.register(&mut registry);
        m.fair_share.register(&mut registry);
        registry.register_collector(Box::new(super::process::ProcessCollector));
        Metrics { registry, ..m }
    }

    /// Every family empty, the registry not yet holding them.
    fn unregistered() -> Metrics {
        Metrics {
            requests: Counters::default(),
            retries: Counters::default(),
            successful: Counters::default(),
            failed: Counters::default(),
            exceeded: Counters::default(),
            shedded: Counters::default(),
            cancelled: Counters::default(),
            inference_latency: Histograms::new_with_constructor(inference_buckets),
            residence: Histograms::new_with_constructor(residence_buckets),
            queue_depth: Gauges::default(),
            inflight: Gauges::default(),
            backlog: Gauges::default(),
            backlog_source_available: Gauges::default(),
            pool_worker_limit: Family::default(),
            dispatch_budget: Family::default(),
            gate_decisions: Family::default(),
            gate_metric_value: Family::default(),
            gate_metric_threshold: Family::default(),
            gate_metric_source_available: Family::default(),
            drain_limit_rps: Family::default(),
            drain_limit_lease_valid: Family::default(),
            drain_limit_valid_until: Family::default(),
            claim_depth: Gauges::default(),
            claims_expired: Counters::default(),
            renewals: Family::default(),
            fenced: Counters::default(),
            outbox_depth: Gauges::default(),
            outbox_dropped: Counters::default(),
            dead_letters: Family::default(),
            deliveries: Counters::default(),
            claims_lost: Counters::default(),
            aborted: Family::default(),
            wakeups: Family::default(),
            pubsub_messages: Family::default(),
            config_reloads: Family::default(),
            config_last_success: Gauge::default(),
            feedback: Default::default(),
            dispatch: Default::default(),
            fair_share: Default::default(),
            registry: Registry::default(),
        }
    }

    /// Go's per-request counters: started, retried, and how each ended.
    fn register_request_counts(&self, r: &mut Registry) {
        r.register(
            go_name("request"),
            "Requests started (first attempt)",
            self.requests.clone(),
        );
        r.register(
            go_name("request_retries"),
            "Retries scheduled with a backoff",
            self.retries.clone(),
        );
        r.register(
            go_name("successful_requests"),
            "Requests answered below 400",
            self.successful.clone(),
        );
        r.register(
            go_name("failed_requests"),
            "Requests that failed terminally",
            self.failed.clone(),
        );
        r.register(
            go_name("exceeded_deadline_requests"),
            "Requests that ran out of time",
            self.exceeded.clone(),
        );
        r.register(
            go_name("shedded_requests"),
            "Requests answered 429",
            self.shedded.clone(),
        );
    }

    /// Go's two latency histograms: the HTTP attempt, and the wait from claim to a worker.
    fn register_request_times(&self, r: &mut Registry) {
        r.register(
            go_name("inference_latency_time_millis"),
            "Milliseconds per inference attempt",
            self.inference_latency.clone(),
        );
        r.register(
            go_name("queue_residence_time_millis"),
            "Milliseconds from claim to a worker",
            self.residence.clone(),
        );
    }

    /// How much work is where: waiting for a worker, being sent, pending in Redis, and the
    /// workers each pool may run.
    fn register_load(&self, r: &mut Registry) {
        r.register(
            go_name("queue_depth"),
            "Claimed requests waiting for a worker",
            self.queue_depth.clone(),
        );
        r.register(
            go_name("inflight_requests"),
            "Requests being sent",
            self.inflight.clone(),
        );
        r.register(
            go_name("broker_backlog"),
            "Pending requests in the queue",
            self.backlog.clone(),
        );
        r.register(
            go_name("broker_backlog_source_available"),
            "Whether the last backlog read succeeded (1) or failed (0)",
            self.backlog_source_available.clone(),
        );
        r.register(
            go_name("pool_worker_limit"),
            "Workers per pool",
            self.pool_worker_limit.clone(),
        );
    }

    /// The gates' view: the queue gate's budget, each decision, and a metric gate's reading.
    fn register_gates(&self, r: &mut Registry) {
        r.register(
            go_name("dispatch_budget"),
            "Queue gate budget at each poll",
            self.dispatch_budget.clone(),
        );
        r.register(
            go_name("gate_decisions"),
            "Gate decisions by reason",
            self.gate_decisions.clone(),
        );
        r.register(
            go_name("gate_metric_value"),
            "A metric gate's last reading",
            self.gate_metric_value.clone(),
        );
        r.register(
            go_name("gate_metric_threshold"),
            "A metric gate's threshold",
            self.gate_metric_threshold.clone(),
        );
        r.register(
            go_name("gate_metric_source_available"),
            "Whether a metric gate's source answered (1) or its fallback was used (0)",
            self.gate_metric_source_available.clone(),
        );
    }

    /// Reloads of the queues config (Go's names).
    fn register_config_reloads(&self, r: &mut Registry) {
        r.register(
            go_name("queue_config_reloads"),
            "Reloads of the queues config, by result",
            self.config_reloads.clone(),
        );
        r.register(
            go_name("queue_config_last_success_timestamp_seconds"),
            "Unix time of the last queues config reload applied",
            self.config_last_success.clone(),
        );
    }

    /// A `redis-leased-rate` gate's lease (Go's `drain_limit_*` names).
    fn register_drain_limits(&self, r: &mut Registry) {
        r.register(
            go_name("drain_limit_rps"),
            "The admission rate a redis-leased-rate gate's lease allows (0 when invalid)",
            self.drain_limit_rps.clone(),
        );
        r.register(
            go_name("drain_limit_lease_valid"),
            "Whether a redis-leased-rate gate's lease was valid at its last decision",
            self.drain_limit_lease_valid.clone(),
        );
        r.register(
            go_name("drain_limit_valid_until_seconds"),
            "When a redis-leased-rate gate's lease ends, in Unix seconds (0 when invalid)",
            self.drain_limit_valid_until.clone(),
        );
    }

    /// The durable claims (Go's durable-claims names).
    fn register_claims(&self, r: &mut Registry) {
        r.register(
            go_name("claim_depth"),
            "Claims held by this instance",
            self.claim_depth.clone(),
        );
        r.register(
            go_name("claims_expired"),
            "Claims redelivered after their lease expired",
            self.claims_expired.clone(),
        );
    }

    /// inferq's own: how requests finish once claimed (cancellations, lease renewals, fenced
    /// finishes, the outbox, dead letters).
    fn register_finishes(&self, r: &mut Registry) {
        r.register(
            "inferq_cancelled_requests",
            "Requests finished as CANCELLED",
            self.cancelled.clone(),
        );
        r.register(
            "inferq_renewals",
            "Lease renewals by outcome",
            self.renewals.clone(),
        );
        r.register(
            "inferq_fenced_finishes",
            "Finishes refused because the claim was no longer ours",
            self.fenced.clone(),
        );
        r.register(
            "inferq_outbox_depth",
            "Outcomes waiting to be written to Redis",
            self.outbox_depth.clone(),
        );
        r.register(
            "inferq_outbox_dropped",
            "Outcomes dropped after the lease was lost",
            self.outbox_dropped.clone(),
        );
        r.register(
            "inferq_dead_letters",
            "Requests dead-lettered, by reason",
            self.dead_letters.clone(),
        );
    }

    /// inferq's own: how requests arrive and are taken (claims, lost races, aborts, wake-ups,
    /// pub/sub messages).
    fn register_deliveries(&self, r: &mut Registry) {
        r.register(
            "inferq_delivery_attempts",
            "Claims taken (delivery attempts)",
            self.deliveries.clone(),
        );
        r.register(
            "inferq_claims_lost",
            "Requests another instance claimed between this instance's peek and its claim",
            self.claims_lost.clone(),
        );
        r.register(
            "inferq_aborted_requests",
            "In-flight requests aborted, by reason",
            self.aborted.clone(),
        );
        r.register(
            "inferq_wakeups",
            "Wake-ups received (work arrived), by source",
            self.wakeups.clone(),
        );
        r.register(
            "inferq_pubsub_messages",
            "Messages received on a redis-pubsub request channel, by outcome",
            self.pubsub_messages.clone(),
        );
    }

    /// The per-request series of one queue, resolved once so the hot path does no label lookups.
    pub fn queue_series(&self, labels: &QueueLabels) -> QueueSeries {
        QueueSeries {
            requests: Series::new(&self.requests, labels),
            retries: Series::new(&self.retries, labels),
            successful: Series::new(&self.successful, labels),
            failed: Series::new(&self.failed, labels),
            exceeded: Series::new(&self.exceeded, labels),
            shedded: Series::new(&self.shedded, labels),
            cancelled: Series::new(&self.cancelled, labels),
            inference_latency: Series::new(&self.inference_latency, labels),
            residence: Series::new(&self.residence, labels),
            queue_depth: Series::new(&self.queue_depth, labels),
            inflight: Series::new(&self.inflight, labels),
            deliveries: Series::new(&self.deliveries, labels),
            fenced: Series::new(&self.fenced, labels),
            claims_lost: Series::new(&self.claims_lost, labels),
        }
    }

    /// Records a metric gate's reading under Go's gauge names.
    pub fn record_gate_reading(
        &self,
        labels: &QueueLabels,
        inference_pool: &str,
        value: Option<f64>,
        threshold: f64,
    ) {
        let l = PoolGaugeLabels {
            queue_id: labels.queue_id.clone(),
            queue_name: labels.queue_name.clone(),
            pool_name: labels.pool_name.clone(),
            inference_pool: inference_pool.to_owned(),
        };
        // As Go: the value and threshold only with a reading; a failed read sets availability.
        if let Some(v) = value {
            self.gate_metric_value.get_or_create(&l).set(v);
            self.gate_metric_threshold.get_or_create(&l).set(threshold);
        }
        self.gate_metric_source_available
            .get_or_create(&l)
            .set(i64::from(value.is_some()));
    }

    /// Records a `redis-leased-rate` decision under Go's `drain_limit_*` gauges: the lease's
    /// rate and end (Unix milliseconds) when it was valid, zeros when it was not.
    pub fn record_drain_limit(&self, pool: &str, lease: Option<(f64, i64)>) {
        let l = PoolLabels {
            pool_name: pool.to_owned(),
        };
        let (rate, until_ms) = lease.unwrap_or((0.0, 0));
        self.drain_limit_rps.get_or_create(&l).set(rate);
        self.drain_limit_lease_valid
            .get_or_create(&l)
            .set(i64::from(lease.is_some()));
        // Milliseconds to seconds; exact for any lease end this side of the year 287,000.
        self.drain_limit_valid_until
            .get_or_create(&l)
            .set(until_ms as f64 / 1000.0);
    }

    /// Creates Go's four gate-decision series at 0 for a gated queue or pool.
    pub fn precreate_gate_series(&self, labels: &QueueLabels) {
        for reason in ["gate_closed", "quota_exhausted", "dropped", "error"] {
            let _ = self
                .gate_decisions
                .get_or_create(&labels.with_reason(reason));
        }
    }

    /// The `/metrics` page: Prometheus text format 0.0.4 as the Go processor writes it.
    pub fn encode(&self) -> Result<String, super::exposition::ExpositionError> {
        super::exposition::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Queue `q1` named `q` in the default pool.
    fn labels() -> QueueLabels {
        QueueLabels {
            queue_id: "q1".into(),
            queue_name: "q".into(),
            pool_name: "default".into(),
        }
    }

    /// Go's metric gate sets the value and threshold gauges only with a reading; a failed read
    /// sets `source_available` 0 and nothing else.
    #[test]
    fn a_failed_gate_reading_sets_only_its_availability() {
        let m = Metrics::new();
        let l = labels();
        m.record_gate_reading(&l, "p", None, 0.2);
        let text = m.encode().expect("encodes");
        assert!(text.contains(r#"llm_d_async_async_gate_metric_source_available{inference_pool="p",pool_name="default",queue_id="q1",queue_name="q"} 0"#), "{text}");
        assert!(!text.contains("gate_metric_threshold{"), "{text}");
        assert!(!text.contains("gate_metric_value{"), "{text}");
        m.record_gate_reading(&l, "p", Some(0.5), 0.2);
        let text = m.encode().expect("encodes");
        assert!(text.contains(r#"llm_d_async_async_gate_metric_threshold{inference_pool="p",pool_name="default",queue_id="q1",queue_name="q"} 0.2"#), "{text}");
        assert!(text.contains(r#"llm_d_async_async_gate_metric_source_available{inference_pool="p",pool_name="default",queue_id="q1",queue_name="q"} 1"#), "{text}");
    }

    #[test]
    fn exposes_go_names() {
        let m = Metrics::new();
        let l = labels();
        let series = m.queue_series(&l);
        series.requests.get().inc();
        series.inference_latency.get().observe(12.0);
        m.claim_depth.get_or_create(&l).set(3);
        m.dispatch_budget.get_or_create(&l).set(0.5);
        m.precreate_gate_series(&l);
        let text = m.encode().expect("encodes");
        assert!(text.contains(r#"llm_d_async_async_dispatch_budget{pool_name="default",queue_id="q1",queue_name="q"} 0.5"#), "{text}");
        for reason in ["gate_closed", "quota_exhausted", "dropped", "error"] {
            let series = format!(
                r#"llm_d_async_async_gate_decisions_total{{pool_name="default",queue_id="q1",queue_name="q",reason="{reason}"}} 0"#
            );
            assert!(text.contains(&series), "{series} missing from {text}");
        }
        assert!(text.contains(r#"llm_d_async_async_request_total{pool_name="default",queue_id="q1",queue_name="q"} 1"#), "{text}");
        assert!(
            text.contains("# TYPE llm_d_async_async_request_total counter\n"),
            "{text}"
        );
        assert!(text.contains(r#"llm_d_async_async_inference_latency_time_millis_bucket{pool_name="default",queue_id="q1",queue_name="q",le="1000"} 1"#), "{text}");
        assert!(text.contains("llm_d_async_async_claim_depth{"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    /// Go's residence buckets above a million milliseconds are spelled as Go spells them.
    #[test]
    fn residence_buckets_read_as_go_s() {
        let m = Metrics::new();
        let l = labels();
        m.queue_series(&l).residence.get().observe(2e6);
        let text = m.encode().expect("encodes");
        let bounds: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("llm_d_async_async_queue_residence_time_millis_bucket{"))
            .filter_map(|l| l.split("le=\"").nth(1)?.split('"').next())
            .collect();
        assert_eq!(
            bounds,
            [
                "500", "1000", "2000", "5000", "10000", "30000", "60000", "120000", "300000",
                "600000", "1.8e+06", "3.6e+06", "7.2e+06", "2.16e+07", "4.32e+07", "8.64e+07",
                "+Inf"
            ]
        );
    }
}
