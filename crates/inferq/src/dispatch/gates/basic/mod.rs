//! The gates that need no metrics source, built from a config [`GateSpec`] by [`build`]:
//!
//! - `constant` (here): always open.
//! - [`redis_budget`] `redis`: a budget read from a Redis key.
//! - [`quota`] `redis-quota`: a per-attribute concurrency quota or sliding-window rate limit kept
//!   in Redis, with `reserved` / `overflow` classification.
//! - [`leased_rate`] `redis-leased-rate`: a pool-wide admission rate a controller leases through
//!   Redis, enforced as a token bucket shared by every replica; fails closed.
//! - [`local`] `local-max-concurrency`: an in-process concurrency limit.
//! - [`combine`] `composite`, `wait-on-refuse`, `tier-priority-admission`: gates made of other
//!   gates (which may be of any type, metric gates included).
//!
//! Parameters come in as the JSON object the user wrote and are read with Go's lenient coercion
//! ([`Params`]); every parameter error names the gate and the parameter. The Redis-backed gates
//! share one lazily opened connection per address ([`link`]).

mod combine;
mod leased_rate;
mod link;
pub use link::CallError;
mod local;
mod quota;
mod redis_budget;

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Decision, Gate, GateEnv, GateError, GateInput};
use crate::config::gate_params::Params;
use crate::config::{GateSpec, GateType};

/// The label a quota gate's classification is written to (and later gates read it from).
pub const CLASSIFICATION: &str = "classification";
/// Classification of a request that got a quota unit.
pub const RESERVED: &str = "reserved";
/// Classification of a request over its quota.
pub const OVERFLOW: &str = "overflow";

/// Builds a gate of this family (a metric type is handed on to the metric family).
pub fn build(spec: &GateSpec, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let p = Params::new(spec.kind.as_str(), &spec.params);
    match spec.kind {
        GateType::Constant => Ok(Arc::new(Constant)),
        GateType::Redis => redis_budget::build(p),
        GateType::RedisQuota => quota::build(p),
        GateType::RedisLeasedRate => leased_rate::build(p, env),
        GateType::LocalMaxConcurrency => local::build(p),
        GateType::Composite => combine::composite(p, env),
        GateType::WaitOnRefuse => combine::wait_on_refuse(p, env),
        GateType::TierPriorityAdmission => combine::tier_priority_admission(p, env),
        GateType::PrometheusSaturation
        | GateType::PrometheusBudget
        | GateType::PrometheusQuery
        | GateType::EndpointScrape => super::metric::build(spec, env),
        GateType::Aimd | GateType::Slack => super::adaptive::build(spec, env),
    }
}

/// `constant`: budget 1.0, every request may go.
struct Constant;

impl Gate for Constant {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(std::future::ready(1.0))
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(std::future::ready(Ok(Decision::go())))
    }
}

#[cfg(test)]
pub(super) mod testing {
    //! Helpers shared by the gate tests.

    use std::collections::BTreeMap;

    use serde_json::Value;

    use super::*;
    use crate::dispatch::gates::Verdict;

    /// Builds a gate from a type name and a JSON parameter object, as the processor does.
    pub(crate) fn gate(kind: &str, params: Value) -> Result<Arc<dyn Gate>, GateError> {
        let kind = GateType::from_name(kind).ok_or_else(|| GateError::Failed {
            gate: "test",
            reason: format!("no gate type {kind}"),
        })?;
        let params = match params {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        crate::dispatch::gates::build(&GateSpec { kind, params }, &GateEnv::default())
    }

    /// The error text of a build that must fail.
    pub(crate) fn build_error(kind: &str, params: Value) -> String {
        match gate(kind, params) {
            Ok(_) => String::from("(built)"),
            Err(e) => e.to_string(),
        }
    }

    /// A string map from pairs.
    pub(crate) fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// Applies a gate to a request with this metadata and these labels.
    pub(crate) async fn apply(
        gate: &dyn Gate,
        metadata: &[(&str, &str)],
        labels: &[(&str, &str)],
    ) -> Decision {
        let metadata = map(metadata);
        let labels = map(labels);
        gate.apply(GateInput {
            metadata: &metadata,
            labels: &labels,
        })
        .await
        .unwrap()
    }

    /// A verdict's name, for compact assertions.
    pub(crate) fn name(verdict: &Verdict) -> &'static str {
        match verdict {
            Verdict::Continue => "continue",
            Verdict::Wait => "wait",
            Verdict::Refuse => "refuse",
            Verdict::Drop(_) => "drop",
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::testing::*;

    /// Every gate type refuses a parameter it does not read, naming it and the ones it reads
    /// (before: ignored, so a misspelt `windw` left a quota window at its default).
    #[test]
    fn unknown_parameters_are_refused() {
        assert_eq!(
            build_error(
                "redis-quota",
                json!({"address": "h:1", "limit": 1, "windw": "10s"})
            ),
            "gate redis-quota: parameter windw: unknown parameter (known: address, attribute, \
             mode, limit, window, prefix, gating_mode)"
        );
        for (kind, _) in crate::config::GateType::ALL {
            let e = build_error(kind, json!({"no_such_parameter": 1}));
            assert!(
                e.starts_with(&format!(
                    "gate {kind}: parameter no_such_parameter: unknown parameter"
                )),
                "{kind}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn constant_is_open() {
        let g = gate("constant", json!({})).unwrap();
        assert_eq!(g.budget().await, 1.0);
        let d = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&d.verdict), "continue");
        assert!(d.releases.is_empty() && d.classification.is_none());
    }
}
