//! The feedback gates: pool gates whose window learns from what the gateway did with the
//! requests they let through, instead of a threshold an operator must guess.
//!
//! - [`aimd`]: Go's proposed `aimd` gate (go-aimd §1–§2): a congestion window per band
//!   (reserved/overflow × interactive/async/batch), slow start then additive increase, a
//!   multiplicative decrease once per flight on the router's capacity rejections, `Retry-After`
//!   closing the band. It sees nothing while an engine queues instead of refusing (vLLM).
//! - [`slack`]: inferq's own. Its window fills the room the pool has left: learnt from a standing
//!   queue on a scraped metrics page (`signal_url`) when it has one, from its own requests'
//!   latency per output token against their no-load baseline otherwise, and from rejections as
//!   `aimd` handles them. It may take back room at once by preempting its youngest requests.
//!
//! A request enters through [`crate::dispatch::gates::Gate::apply`], which takes a slot of the
//! window (or waits for one, or refuses); the slot leaves with the request's
//! [`Feedback`](super::Feedback), handed to the slot's release when the outcome is decided.
//! [`classify`] reads an answer as go-aimd §2 does; [`slots`] is the wait for a free slot both
//! gates share.

pub mod aimd;
mod signal;
pub mod slack;
mod slots;

use std::sync::Arc;

use super::{Feedback, Gate, GateEnv, GateError};
use crate::config::gate_params::Params;
use crate::config::{GateSpec, GateType};

/// How an answer bears on a window (go-aimd §2), read from its status and the router's
/// `x-llm-d-request-dropped-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// 2xx: the pool took it.
    Accepted,
    /// A 429 with `rejected-saturated`, no reason or an unknown one: the pool is full.
    Saturated,
    /// `rejected-ttl-expired`: it waited past its time in the router's queue.
    Expired,
    /// A reason starting `evicted`: dropped after dispatch; a cost, not saturation.
    Evicted,
    /// Any other reason (`rejected-no-endpoints`, `rejected-context-cancelled`,
    /// `rejected-shutting-down`), and other statuses: nothing about capacity.
    Other,
    /// A transport failure, or a 5xx with no reason.
    Error,
}

impl Answer {
    /// Its name in `llm_d_async_async_aimd_outcomes_total{outcome}`.
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Accepted => "accepted",
            Answer::Saturated => "saturated",
            Answer::Expired => "expired",
            Answer::Evicted => "evicted",
            Answer::Other => "other",
            Answer::Error => "error",
        }
    }

    /// Every answer, for series made at start-up.
    pub const ALL: [Answer; 6] = [
        Answer::Accepted,
        Answer::Saturated,
        Answer::Expired,
        Answer::Evicted,
        Answer::Other,
        Answer::Error,
    ];
}

/// Classifies an answer (go-aimd §2; the reason is the router's
/// `x-llm-d-request-dropped-reason`).
pub fn classify(feedback: &Feedback) -> Answer {
    let reason = feedback.dropped_reason.as_deref().unwrap_or("");
    match (feedback.status, reason) {
        (_, "rejected-ttl-expired") => Answer::Expired,
        (_, r) if r.starts_with("evicted") => Answer::Evicted,
        (_, "rejected-no-endpoints" | "rejected-context-cancelled" | "rejected-shutting-down") => {
            Answer::Other
        }
        (_, "rejected-saturated") => Answer::Saturated,
        // An unknown reason is read as a bare 429 would be.
        (_, r) if !r.is_empty() => Answer::Saturated,
        (Some(429), _) => Answer::Saturated,
        (Some(200..=299), _) => Answer::Accepted,
        (None, _) | (Some(500..), _) => Answer::Error,
        (Some(_), _) => Answer::Other,
    }
}

/// Builds an `aimd` or `slack` gate.
pub fn build(spec: &GateSpec, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let p = Params::new(spec.kind.as_str(), &spec.params);
    match spec.kind {
        GateType::Slack => slack::build(p, env),
        _ => aimd::build(p, env),
    }
}

/// The largest window a pool gate may have: its own `max_window` (or `default` when unset),
/// never above the pool's workers (more could never be in flight).
fn max_window(p: &Params<'_>, env: &GateEnv, default: Option<f64>) -> Result<f64, GateError> {
    let workers = env.pool_workers.map(f64::from);
    let asked = p
        .float("max_window")?
        .or(default)
        .or(workers)
        .unwrap_or(256.0);
    if asked.is_nan() || asked < 1.0 {
        return Err(param(
            p.gate,
            "max_window",
            format!("must be ≥ 1, got {asked}"),
        ));
    }
    Ok(workers.map_or(asked, |w| asked.min(w.max(1.0))))
}

/// `min_window`, at least 1 and at most `max`.
fn min_window(p: &Params<'_>, max: f64) -> Result<f64, GateError> {
    let min = p.float_or("min_window", 1.0)?;
    if !(1.0..=max).contains(&min) {
        return Err(param(
            p.gate,
            "min_window",
            format!("must be between 1 and max_window ({max}), got {min}"),
        ));
    }
    Ok(min)
}

/// A fraction parameter in (0, 1).
fn factor(p: &Params<'_>, name: &str, default: f64) -> Result<f64, GateError> {
    let v = p.float_or(name, default)?;
    if !(v > 0.0 && v < 1.0) {
        return Err(param(p.gate, name, format!("must be in (0, 1), got {v}")));
    }
    Ok(v)
}

fn param(gate: &'static str, name: &str, reason: String) -> GateError {
    GateError::Param {
        gate,
        param: name.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn answer(status: Option<u16>, reason: Option<&str>) -> Answer {
        classify(&Feedback {
            status,
            dropped_reason: reason.map(str::to_owned),
            retry_after: None,
            sent_at: Instant::now(),
            elapsed: Duration::ZERO,
            body: None,
        })
    }

    /// go-aimd §2's table, row by row.
    #[test]
    fn answers_are_read_as_the_router_means_them() {
        assert_eq!(answer(Some(200), None), Answer::Accepted);
        assert_eq!(
            answer(Some(429), Some("rejected-saturated")),
            Answer::Saturated
        );
        assert_eq!(answer(Some(429), None), Answer::Saturated);
        assert_eq!(answer(Some(429), Some("something-new")), Answer::Saturated);
        assert_eq!(
            answer(Some(429), Some("rejected-ttl-expired")),
            Answer::Expired
        );
        assert_eq!(answer(Some(429), Some("evicted")), Answer::Evicted);
        assert_eq!(answer(Some(429), Some("evicted-priority")), Answer::Evicted);
        assert_eq!(
            answer(Some(503), Some("rejected-no-endpoints")),
            Answer::Other
        );
        assert_eq!(
            answer(Some(503), Some("rejected-context-cancelled")),
            Answer::Other
        );
        assert_eq!(
            answer(Some(503), Some("rejected-shutting-down")),
            Answer::Other
        );
        assert_eq!(answer(Some(503), None), Answer::Error);
        assert_eq!(answer(None, None), Answer::Error);
        assert_eq!(answer(Some(400), None), Answer::Other);
    }

    #[test]
    fn usage_gives_the_output_tokens() {
        let mut fb = Feedback {
            status: Some(200),
            dropped_reason: None,
            retry_after: None,
            sent_at: Instant::now(),
            elapsed: Duration::ZERO,
            body: Some(bytes::Bytes::from_static(
                br#"{"id":"x","choices":[{"text":"hi"}],"usage":{"prompt_tokens":3,"completion_tokens":17,"total_tokens":20}}"#,
            )),
        };
        assert_eq!(fb.output_tokens(), Some(17));
        fb.body = Some(bytes::Bytes::from_static(b"not json"));
        assert_eq!(fb.output_tokens(), None);
        fb.body = None;
        assert_eq!(fb.output_tokens(), None);
    }
}
