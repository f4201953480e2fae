//! Dispatch gates: decide, from capacity signals, how much of a queue may be taken now
//! ([`Gate::budget`]) and whether one request may go ([`Gate::apply`]).
//!
//! Queue-level gates are consulted between peek and claim, so a refused request is never
//! claimed: it stays pending at its score, and the requests behind it in the same poll are still
//! considered (Go re-popped a refused head over and over). Pool-level gates are consulted by a
//! worker before it sends. The gate types and their parameters are the Go processor's
//! (go-compat §6); [`build`] makes one from a config [`GateSpec`].
//!
//! - [`basic`]: `constant`, `redis`, `redis-quota`, `redis-leased-rate`,
//!   `local-max-concurrency`, `composite`, `wait-on-refuse`, `tier-priority-admission`.
//! - [`metric`]: `prometheus-saturation`, `prometheus-budget`, `prometheus-query`,
//!   `endpoint-scrape`.
//! - [`adaptive`]: `aimd` (Go's proposed feedback gate) and `slack` (inferq's own): pool gates
//!   whose window learns from what the gateway did with the requests they let through
//!   ([`Feedback`], handed to their [`Release`]s).
//! - [`params`]: Go's lenient parameter coercion.

pub mod adaptive;
pub mod basic;
pub mod metric;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::config::{GateSpec, GateType};
use crate::ops::{Metrics, QueueLabels};
use inferq_client::wire::ResultMessage;

/// What a gate says about one request.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Dispatch it.
    Continue,
    /// Not now: leave it where it is and ask again later (pending at queue level; the worker
    /// re-asks every 50 ms at pool level).
    Wait,
    /// Not now, for a reason Go reports as refusal (e.g. over quota), counted as `gate_closed` /
    /// `quota_exhausted`: left pending at queue level like `Wait`; at pool level the request
    /// goes back to the queue and its worker is freed.
    Refuse,
    /// Finish it now with this result (or `GATE_DROPPED` when `None`).
    Drop(Option<ResultMessage>),
}

/// What the gateway did with one request a gate let through, as its releases see it: the facts
/// a feedback gate (`aimd`, `slack`) learns from. A request never sent has none.
#[derive(Debug, Clone)]
pub struct Feedback {
    /// The answer's status; `None` for a transport failure or a timeout before the head.
    pub status: Option<u16>,
    /// The router's `x-llm-d-request-dropped-reason`, when it gave one.
    pub dropped_reason: Option<String>,
    /// The answer's `Retry-After`, when it gave one.
    pub retry_after: Option<Duration>,
    /// When the request was sent.
    pub sent_at: Instant,
    /// From the send to the end of the body (or the failure).
    pub elapsed: Duration,
    /// A successful answer's body, kept (a cheap reference) for [`Feedback::output_tokens`].
    pub body: Option<Bytes>,
}

impl Feedback {
    /// The answer's `usage.completion_tokens`, when it is an OpenAI answer that counts them.
    /// Parsed only when asked (by a gate that normalises latency per token), never on the hot
    /// path otherwise.
    pub fn output_tokens(&self) -> Option<u64> {
        #[derive(serde::Deserialize)]
        struct Answer {
            usage: Option<Usage>,
        }
        #[derive(serde::Deserialize)]
        struct Usage {
            completion_tokens: Option<u64>,
        }
        let body = self.body.as_ref()?;
        let answer: Answer = serde_json::from_slice(body).ok()?;
        answer.usage?.completion_tokens.filter(|&n| n > 0)
    }
}

/// What a release is handed: the request's feedback, when it was sent.
type ReleaseFn = Box<dyn FnOnce(Option<&Feedback>) -> BoxFuture<'static, ()> + Send>;

/// Undoes a reservation a gate made (a concurrency slot, a quota unit). Runs once the request's
/// outcome is decided, or at once when the request is not dispatched after all.
pub struct Release(ReleaseFn);

impl Release {
    /// A release that does not look at the outcome.
    pub fn new<F>(f: F) -> Release
    where
        F: FnOnce() -> BoxFuture<'static, ()> + Send + 'static,
    {
        Release(Box::new(move |_| f()))
    }

    /// A release that learns from the outcome (`None`: the request was not sent).
    pub fn observing<F>(f: F) -> Release
    where
        F: FnOnce(Option<&Feedback>) -> BoxFuture<'static, ()> + Send + 'static,
    {
        Release(Box::new(f))
    }

    /// Runs the release for a request that was not sent.
    pub async fn run(self) {
        (self.0)(None).await
    }

    /// Runs the release with what became of the request.
    pub async fn settle(self, feedback: Option<&Feedback>) {
        (self.0)(feedback).await
    }
}

impl std::fmt::Debug for Release {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Release")
    }
}

/// A gate's decision about one request.
#[derive(Debug)]
pub struct Decision {
    pub verdict: Verdict,
    /// `reserved` / `overflow` as quota gates classify (written into `internal.labels`).
    pub classification: Option<String>,
    /// Reservations to undo when the request is done (run in reverse order).
    pub releases: Vec<Release>,
    /// Fired by the gate to take back the room it gave (the `slack` gate, when interactive
    /// traffic needs it): a request still at the gateway is aborted and put back, unchanged.
    pub preempt: Option<CancellationToken>,
}

impl Decision {
    pub fn verdict(verdict: Verdict) -> Decision {
        Decision {
            verdict,
            classification: None,
            releases: Vec::new(),
            preempt: None,
        }
    }

    pub fn go() -> Decision {
        Decision::verdict(Verdict::Continue)
    }

    /// How Go counts a refusal or wait: `quota_exhausted` when a quota gate classified the
    /// request as overflow, `gate_closed` otherwise.
    pub fn refusal_reason(&self) -> &'static str {
        if self.classification.as_deref() == Some("overflow") {
            "quota_exhausted"
        } else {
            "gate_closed"
        }
    }

    /// Runs every release of a request that was not sent, newest first.
    pub async fn release_all(releases: Vec<Release>) {
        Decision::settle_all(releases, None).await
    }

    /// Runs every release with what became of the request, newest first.
    pub async fn settle_all(releases: Vec<Release>, feedback: Option<Feedback>) {
        for r in releases.into_iter().rev() {
            r.settle(feedback.as_ref()).await;
        }
    }
}

/// What a gate may look at: the request's metadata and its labels (`tier`, `classification`).
#[derive(Debug, Clone, Copy)]
pub struct GateInput<'a> {
    pub metadata: &'a BTreeMap<String, String>,
    pub labels: &'a BTreeMap<String, String>,
}

/// A gate. Budgets never fail (a gate that cannot read its signal answers its fallback).
pub trait Gate: Send + Sync {
    /// The fraction in [0, 1] of a poll's batch that may be taken now.
    fn budget(&self) -> BoxFuture<'_, f64>;
    /// Decides one request. An error is a gate failure (`GATE_ERROR` at pool level; the request
    /// stays pending at queue level).
    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>>;
}

/// Gate errors.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GateError {
    #[error("gate {gate}: parameter {param}: {reason}")]
    Param {
        gate: &'static str,
        param: String,
        reason: String,
    },
    #[error("gate {gate}: {reason}")]
    Failed { gate: &'static str, reason: String },
    /// A metric gate's HTTP client or Prometheus URL cannot be set up.
    #[error("gate {gate}: {source}")]
    Setup {
        gate: &'static str,
        #[source]
        source: Arc<metric::SetupError>,
    },
    /// A Redis-backed gate's call failed.
    #[error("gate {gate}: {source}")]
    Redis {
        gate: &'static str,
        #[source]
        source: Arc<basic::CallError>,
    },
}

impl From<crate::config::gate_params::ParamError> for GateError {
    fn from(e: crate::config::gate_params::ParamError) -> GateError {
        GateError::Param {
            gate: e.gate,
            param: e.param,
            reason: e.reason,
        }
    }
}

/// What building a gate may need besides its own parameters.
#[derive(Debug, Clone, Default)]
pub struct GateEnv {
    /// `--prometheus-url`.
    pub prometheus_url: Option<String>,
    /// `--prometheus-cache-ttl` (zero disables the cache).
    pub prometheus_cache_ttl: Duration,
    /// Whose gate this is, for Go's `gate_metric_*` gauges: every metric gate built with this
    /// env (wrapped in other gates or not) records each reading under these labels.
    pub owner: Option<GateOwner>,
    /// The workers of the pool a pool gate belongs to: the feedback gates' largest window.
    pub pool_workers: Option<u32>,
}

/// The queue or pool a gate belongs to (Go stamps the owner into a gate and its inner gates).
#[derive(Clone)]
pub struct GateOwner {
    pub metrics: Arc<Metrics>,
    /// A queue gate's queue labels; a pool gate's are empty but for `pool_name`, as in Go.
    pub labels: QueueLabels,
}

impl std::fmt::Debug for GateOwner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateOwner")
            .field("labels", &self.labels)
            .finish_non_exhaustive()
    }
}

/// Builds the gate a config names. A parameter the gate type does not read is refused (Go
/// ignored it, so a misspelt `windw` silently left the window at its default).
pub fn build(spec: &GateSpec, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let known = spec.kind.params();
    if let Some(unknown) = spec.params.keys().find(|k| !known.contains(&k.as_str())) {
        let reason = if known.is_empty() {
            "unknown parameter (this gate takes none)".to_owned()
        } else {
            format!("unknown parameter (known: {})", known.join(", "))
        };
        return Err(GateError::Param {
            gate: spec.kind.as_str(),
            param: unknown.clone(),
            reason,
        });
    }
    match spec.kind {
        GateType::PrometheusSaturation
        | GateType::PrometheusBudget
        | GateType::PrometheusQuery
        | GateType::EndpointScrape => metric::build(spec, env),
        GateType::Aimd | GateType::Slack => adaptive::build(spec, env),
        _ => basic::build(spec, env),
    }
}
