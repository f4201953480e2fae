//! Every series whose label values are known at start-up, created at 0 before any event (go-v011
//! §4: a series that appears only after its first event breaks ratios, `absent()` alerts and
//! dashboards). Per queue: Go's request counters, times and gauges, the gate decisions by
//! reason, and inferq's own families by their outcome or reason; process-wide: the reloads by
//! result. What remains absent until it happens is what has no known labels yet: a metric gate's
//! reading, a leased rate's lease, the backlog before its first poll.

use super::metrics::{Metrics, QueueLabels, ResultLabels};

/// Renewal outcomes (`inferq_renewals_total`).
const RENEWAL_OUTCOMES: [&str; 3] = ["renewed", "lost", "error"];
/// Dead-letter reasons (`inferq_dead_letters_total`).
const DEAD_LETTER_REASONS: [&str; 3] = ["undecodable", "deliveries", "result_refused"];
/// Why in-flight requests were aborted (`inferq_aborted_requests_total`).
const ABORT_REASONS: [&str; 3] = ["lost", "cancelled", "shutdown"];
/// Where wake-ups come from (`inferq_wakeups_total`).
const WAKEUP_SOURCES: [&str; 2] = ["doorbell", "keyspace"];
/// What became of redis-pubsub messages (`inferq_pubsub_messages_total`).
const PUBSUB_OUTCOMES: [&str; 3] = ["admitted", "duplicate", "lost"];

impl Metrics {
    /// Creates every series of one queue at 0; `pubsub` adds the channel's message counts.
    pub fn precreate_queue(&self, labels: &QueueLabels, pubsub: bool) {
        for family in [
            &self.requests,
            &self.retries,
            &self.successful,
            &self.failed,
            &self.exceeded,
            &self.shedded,
            &self.cancelled,
            &self.claims_expired,
            &self.fenced,
            &self.outbox_dropped,
            &self.deliveries,
            &self.claims_lost,
        ] {
            let _ = family.get_or_create(labels);
        }
        for family in [
            &self.queue_depth,
            &self.inflight,
            &self.claim_depth,
            &self.outbox_depth,
        ] {
            let _ = family.get_or_create(labels);
        }
        let _ = self.inference_latency.get_or_create(labels);
        let _ = self.residence.get_or_create(labels);
        self.precreate_gate_series(labels);
        for (family, values) in [
            (&self.renewals, &RENEWAL_OUTCOMES[..]),
            (&self.dead_letters, &DEAD_LETTER_REASONS[..]),
            (&self.aborted, &ABORT_REASONS[..]),
        ] {
            for value in values {
                let _ = family.get_or_create(&labels.with_outcome(value));
            }
        }
        for source in WAKEUP_SOURCES {
            let _ = self.wakeups.get_or_create(&labels.with_source(source));
        }
        if pubsub {
            for outcome in PUBSUB_OUTCOMES {
                let _ = self
                    .pubsub_messages
                    .get_or_create(&labels.with_outcome(outcome));
            }
        }
        self.dispatch.precreate(labels);
    }

    /// A retired lane's readings, once no running lane shares its labels: the claims and the
    /// outbox it held go to 0 (it retires only once both are empty), and its backlog, which no
    /// one polls any more, is removed rather than left at its last reading. Counters stay, so
    /// rates over the lane's life stay right.
    pub fn retire_queue(&self, labels: &QueueLabels) {
        self.claim_depth.get_or_create(labels).set(0);
        self.outbox_depth.get_or_create(labels).set(0);
        self.backlog.remove(labels);
        self.backlog_source_available.remove(labels);
        self.dispatch.deadline_proximity.remove(labels);
    }

    /// Creates the process-wide series at 0: the queues config reloads by result.
    pub fn precreate_process(&self) {
        for result in ["success", "error"] {
            let _ = self.config_reloads.get_or_create(&ResultLabels {
                result: result.to_owned(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh queue's page holds its counters at 0 under every known reason.
    #[test]
    fn a_queue_s_series_exist_at_zero() {
        let m = Metrics::new();
        let l = QueueLabels {
            queue_id: "q1".into(),
            queue_name: "q".into(),
            pool_name: "default".into(),
        };
        m.precreate_queue(&l, false);
        m.precreate_process();
        let text = m.encode().expect("encodes");
        for series in [
            r#"llm_d_async_async_failed_requests_total{pool_name="default",queue_id="q1",queue_name="q"} 0"#,
            r#"llm_d_async_async_request_retries_total{pool_name="default",queue_id="q1",queue_name="q"} 0"#,
            r#"llm_d_async_async_gate_decisions_total{pool_name="default",queue_id="q1",queue_name="q",reason="dropped"} 0"#,
            r#"inferq_dead_letters_total{outcome="undecodable",pool_name="default",queue_id="q1",queue_name="q"} 0"#,
            r#"llm_d_async_async_tokens_total{direction="output",pool_name="default",queue_id="q1",queue_name="q"} 0"#,
            r#"llm_d_async_async_gate_wait_requeues_total{pool_name="default",queue_id="q1",queue_name="q"} 0"#,
            r#"llm_d_async_async_deadline_proximity_millis_bucket{pool_name="default",queue_id="q1",queue_name="q",le="+Inf"} 0"#,
            r#"llm_d_async_async_queue_config_reloads_total{result="error"} 0"#,
        ] {
            assert!(text.contains(series), "{series} missing from {text}");
        }
        assert!(!text.contains("inferq_pubsub_messages_total{"), "{text}");
    }
}
