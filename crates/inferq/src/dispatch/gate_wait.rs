//! `--gate-wait-timeout` (go-v011 §2): a request that has waited at its pool's gate longer than
//! this is put back in its queue, recoverable, not failed: [`Job::put_back`] keeps its score
//! (deadline and FIFO sequence) and its generation, and it is not a retry (`retry_count` stays).
//! Each one counts in `llm_d_async_async_gate_wait_requeues_total`. A timeout of 0 (`None`)
//! waits until the request's deadline, as before.
//!
//! The worker is freed for other work; the request is claimed again once the promoter's next
//! tick makes it pending, and waits at the gate afresh.

use std::time::{Duration, Instant};

use super::context::Job;

/// How long a request put back stays parked before it is pending again: the promoter's tick
/// paces it, and this floor keeps it from cycling faster than a waiting request asks again.
const PUT_BACK_FOR: Duration = Duration::from_millis(50);

/// One request's wait at its pool gate, started when it first asks.
#[derive(Debug, Clone, Copy)]
pub struct GateWait {
    /// When the wait ends; `None`: at the deadline only.
    until: Option<Instant>,
}

impl GateWait {
    /// Starts the wait now.
    pub fn start(timeout: Option<Duration>) -> GateWait {
        GateWait {
            until: timeout.map(|t| Instant::now() + t),
        }
    }

    /// How long the next question to the gate may take: what the deadline leaves (`left`), or
    /// less when the wait ends sooner; and whether it is the wait's end that bounds it.
    pub fn bound(&self, left: Duration) -> (Duration, bool) {
        match self.until {
            Some(until) => {
                let rest = until.saturating_duration_since(Instant::now());
                if rest < left {
                    (rest, true)
                } else {
                    (left, false)
                }
            }
            None => (left, false),
        }
    }

    /// Whether the request has waited as long as it may.
    pub fn over(&self) -> bool {
        self.until.is_some_and(|until| Instant::now() >= until)
    }
}

/// Puts a request that waited too long back in its queue, and counts it.
pub fn requeue(job: Job) {
    let ctx = job.ctx.clone();
    ctx.metrics
        .dispatch
        .gate_wait_requeues
        .get_or_create(&ctx.labels)
        .inc();
    tracing::debug!(
        id = %job.held.envelope.request.id,
        queue = %ctx.queue.name(),
        "waited --gate-wait-timeout at the pool gate; put back in its queue"
    );
    job.put_back(PUT_BACK_FOR);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_bounds_each_question_until_it_is_over() {
        let unbounded = GateWait::start(None);
        assert_eq!(
            unbounded.bound(Duration::from_secs(9)),
            (Duration::from_secs(9), false)
        );
        assert!(!unbounded.over());
        let short = GateWait::start(Some(Duration::from_secs(3)));
        let (d, binds) = short.bound(Duration::from_secs(9));
        assert!(binds && d <= Duration::from_secs(3) && d > Duration::from_secs(2));
        assert_eq!(
            short.bound(Duration::from_secs(1)),
            (Duration::from_secs(1), false)
        );
        assert!(!short.over());
        assert!(GateWait::start(Some(Duration::ZERO)).over());
    }
}
