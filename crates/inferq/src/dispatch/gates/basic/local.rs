//! `local-max-concurrency`: at most `limit` requests of this process in flight through the gate.
//!
//! Each admitted request holds one permit of a semaphore; its release (or dropping the decision)
//! gives the permit back. `gating_mode: classifying` (default) refuses when every permit is held;
//! `blocking` waits for a permit — the decision comes back once the permit is held, and a caller
//! that stops waiting simply drops the future (nothing is taken). Budget is the free fraction,
//! `(limit − in flight) / limit`.

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use crate::config::gate_params::Params;
use crate::dispatch::gates::{Decision, Gate, GateError, GateInput, Release, Verdict};

const GATE: &str = "local-max-concurrency";

/// Builds a `local-max-concurrency` gate.
pub(super) fn build(p: Params<'_>) -> Result<Arc<dyn Gate>, GateError> {
    let err = |param: &str, reason: String| GateError::Param {
        gate: GATE,
        param: param.to_owned(),
        reason,
    };
    let limit = match p.int("limit")? {
        None => return Err(err("limit", "required".to_owned())),
        Some(n) if n <= 0 => return Err(err("limit", format!("must be > 0, got {n}"))),
        Some(n) => usize::try_from(n)
            .ok()
            .filter(|&n| n <= Semaphore::MAX_PERMITS)
            .ok_or_else(|| err("limit", format!("too large: {n}")))?,
    };
    let blocking = match p.string_or("gating_mode", "classifying").as_str() {
        "classifying" => false,
        "blocking" => true,
        other => {
            return Err(err(
                "gating_mode",
                format!("must be classifying or blocking, got {other:?}"),
            ))
        }
    };
    Ok(Arc::new(LocalMax {
        permits: Arc::new(Semaphore::new(limit)),
        limit,
        blocking,
    }))
}

struct LocalMax {
    /// One permit per request that may be in flight.
    permits: Arc<Semaphore>,
    limit: usize,
    /// Wait for a permit rather than refuse.
    blocking: bool,
}

impl Gate for LocalMax {
    fn budget(&self) -> BoxFuture<'_, f64> {
        let free = self.permits.available_permits() as f64 / self.limit as f64;
        Box::pin(std::future::ready(free))
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let permit = if self.blocking {
                self.permits.clone().acquire_owned().await.map_err(closed)?
            } else {
                match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => permit,
                    Err(TryAcquireError::NoPermits) => {
                        return Ok(Decision::verdict(Verdict::Refuse))
                    }
                    Err(TryAcquireError::Closed) => return Err(closed(())),
                }
            };
            let mut decision = Decision::go();
            decision.releases.push(release(permit));
            Ok(decision)
        })
    }
}

/// A release that gives the permit back (so does dropping it unrun).
fn release(permit: OwnedSemaphorePermit) -> Release {
    Release::new(move || {
        drop(permit);
        Box::pin(std::future::ready(()))
    })
}

fn closed<E>(_: E) -> GateError {
    GateError::Failed {
        gate: GATE,
        reason: "semaphore closed".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde_json::json;

    use super::super::testing::*;
    use super::*;

    #[tokio::test]
    async fn classifying_refuses_when_full() {
        let g = gate(GATE, json!({"limit": 2})).unwrap();
        assert_eq!(g.budget().await, 1.0);
        let a = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(g.budget().await, 0.5);
        let b = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&b.verdict), "continue");
        assert_eq!(g.budget().await, 0.0);
        let c = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&c.verdict), "refuse");
        assert!(c.releases.is_empty());

        Decision::release_all(a.releases).await;
        assert_eq!(g.budget().await, 0.5);
        drop(b);
        assert_eq!(g.budget().await, 1.0, "dropping a decision frees its slot");
    }

    #[tokio::test]
    async fn blocking_waits_for_a_release() {
        let g = gate(GATE, json!({"limit": "1", "gating_mode": "blocking"})).unwrap();
        let held = apply(g.as_ref(), &[], &[]).await;
        let metadata = map(&[]);
        let input = GateInput {
            metadata: &metadata,
            labels: &metadata,
        };
        let waited = tokio::time::timeout(Duration::from_millis(50), g.apply(input)).await;
        assert!(waited.is_err(), "no slot: still waiting");
        assert_eq!(g.budget().await, 0.0, "a dropped wait takes nothing");

        let waiter = g.apply(input);
        let releaser = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            Decision::release_all(held.releases).await;
        };
        let (got, ()) = tokio::join!(waiter, releaser);
        let got = got.unwrap();
        assert_eq!(name(&got.verdict), "continue");
        assert_eq!(got.releases.len(), 1);
        assert_eq!(g.budget().await, 0.0);
    }

    #[test]
    fn parameter_errors() {
        assert_eq!(
            build_error(GATE, json!({})),
            "gate local-max-concurrency: parameter limit: required"
        );
        assert_eq!(
            build_error(GATE, json!({"limit": -3})),
            "gate local-max-concurrency: parameter limit: must be > 0, got -3"
        );
        assert_eq!(
            build_error(GATE, json!({"limit": 1, "gating_mode": "queue"})),
            "gate local-max-concurrency: parameter gating_mode: must be classifying or blocking, got \"queue\""
        );
    }
}
