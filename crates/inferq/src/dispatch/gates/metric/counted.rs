//! `endpoint-scrape` with `admission: counted` (go-newer §6): the scraped metric is a count of
//! used slots (`value_type: saturation`, a positive `max_count_per_pod`), and each reading
//! admits `floor(capacity − used)` requests, one per `apply`, until the next reading.
//!
//! ```text
//!   reading (at most one per --prometheus-cache-ttl) ──▶ left = floor(headroom), 0 on failure
//!   apply():  left ≥ 1 ? (left −= 1, Continue) : Refuse
//!   budget(): left ≥ 1 ? 1 : 0     (a fraction would leave the last slots unused)
//! ```
//!
//! A failed reading (unreachable page, no matching series without `absent_value`, an empty pool,
//! a count that is NaN, infinite or negative) admits nothing until the next one: there is no
//! fallback. Readings and admissions share one lock, so concurrent workers never admit more
//! than a reading granted. Each reading is recorded in Go's `gate_metric_*` gauges under the
//! gate's owner, its value being the free slots it found.

use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::Mutex;

use super::source::{Scrape, READ_BOUND};
use crate::dispatch::gates::{Decision, Gate, GateError, GateInput, GateOwner, Verdict};

/// What the last reading granted.
#[derive(Debug, Clone, Copy)]
struct Grant {
    at: Instant,
    /// Admissions still to give out.
    left: u64,
    /// Whether the reading succeeded (for logging changes only).
    read: bool,
}

/// A `counted` endpoint-scrape gate.
#[derive(Debug)]
pub(super) struct CountedGate {
    scrape: Scrape,
    /// How long a reading's grant stands (`--prometheus-cache-ttl`; zero: each call reads).
    every: Duration,
    grant: Mutex<Option<Grant>>,
    owner: Option<GateOwner>,
}

impl CountedGate {
    pub(super) fn new(scrape: Scrape, every: Duration, owner: Option<GateOwner>) -> CountedGate {
        CountedGate {
            scrape,
            every,
            grant: Mutex::new(None),
            owner,
        }
    }

    /// Under the lock: the current grant, read anew when the last one is older than `every`;
    /// `take` takes one admission from it. Returns whether there was one.
    async fn admit(&self, take: bool) -> bool {
        let mut grant = self.grant.lock().await;
        let due = grant.is_none_or(|g| g.at.elapsed() >= self.every);
        if due {
            let (fresh, failure) = self.read().await;
            let was_read = grant.is_none_or(|g| g.read);
            let url = crate::config::redact_url(self.scrape.target.url.as_str());
            match failure {
                Some(reason) if was_read => tracing::warn!(
                    gate = "endpoint-scrape",
                    %url,
                    "counted admission: reading failed, admitting nothing until a reading \
                     succeeds: {reason}"
                ),
                None if !was_read => tracing::info!(
                    gate = "endpoint-scrape",
                    %url,
                    left = fresh.left,
                    "counted admission: reading again"
                ),
                _ => {}
            }
            *grant = Some(fresh);
        }
        let Some(g) = grant.as_mut() else {
            return false;
        };
        if g.left == 0 {
            return false;
        }
        if take {
            g.left -= 1;
        }
        true
    }

    /// One reading of the page, recorded in the gauges; with the reason when it failed.
    async fn read(&self) -> (Grant, Option<String>) {
        let headroom = tokio::time::timeout(READ_BOUND, self.scrape.headroom())
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {READ_BOUND:?}")));
        if let Some(owner) = &self.owner {
            owner.metrics.record_gate_reading(
                &owner.labels,
                "",
                headroom.as_ref().ok().copied(),
                0.0,
            );
        }
        let (left, failure) = match headroom {
            // Finite and at least 0 (see `Scrape::headroom`); the cast saturates.
            Ok(free) => (free.floor() as u64, None),
            Err(reason) => (0, Some(reason)),
        };
        let grant = Grant {
            at: Instant::now(),
            left,
            read: failure.is_none(),
        };
        (grant, failure)
    }
}

impl Gate for CountedGate {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(async move {
            if self.admit(false).await {
                1.0
            } else {
                0.0
            }
        })
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            Ok(Decision::verdict(if self.admit(true).await {
                Verdict::Continue
            } else {
                Verdict::Refuse
            }))
        })
    }
}
