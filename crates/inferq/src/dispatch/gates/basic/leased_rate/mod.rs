//! `redis-leased-rate`: a pool-wide admission rate that a controller leases through a Redis hash
//! (go-newer §6). The controller writes `control_key` (`api_version`, `pool_id`,
//! `max_admission_rps`, `valid_until_unix_ms`, `decision_id`); every processor replica takes
//! tokens from one bucket in `state_key` (default `<control_key>:state`), so together they admit
//! at most the leased rate, with bursts of `burst_seconds` (default 1) of it.
//!
//! - `apply`: one Lua step (`lua/leasedRateAdmit-2.lua`) checks the lease by Redis's clock and
//!   takes a token. Continue when it got one, Refuse otherwise.
//! - `budget`: the same script reading the lease only: 1 while a lease of a rate above 0 is
//!   valid, else 0. The rate itself is enforced by `apply`.
//! - Fails closed: a missing, malformed, mismatched (version or pool) or expired lease, rate 0,
//!   and any Redis failure (unreachable, timeout, a cluster's `MOVED`) refuse. A Redis failure is
//!   a refusal, not a gate error, as in Go: wrapped in `wait-on-refuse` (the recommended pool
//!   gate) a controller or Redis outage parks the workers instead of failing requests.
//! - Each decision sets Go's `drain_limit_rps`, `_lease_valid` and `_valid_until_seconds`
//!   gauges for `pool_id`, which start at 0 when the gate is built.
//!
//! `pool_id` defaults to the owning pool (a queue gate's is its queue's `worker_pool_id`). The
//! gate is a plain client of its `address`, as the other Redis gates are, also when the queues
//! live on a cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock};

use futures::future::BoxFuture;
use redis::{Script, Value};

use super::link::{self, Link};
use crate::config::gate_params::Params;
use crate::dispatch::gates::{Decision, Gate, GateEnv, GateError, GateInput, Verdict};
use crate::ops::Metrics;

static ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/leasedRateAdmit-2.lua")));

/// The lease format this gate reads (the control hash's `api_version`).
pub(super) const API_VERSION: &str = "llm-d.ai/v1alpha1";

const GATE: &str = "redis-leased-rate";

/// Builds a `redis-leased-rate` gate.
pub(super) fn build(p: Params<'_>, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let link = link::link(&p)?;
    let control_key = p.required_string("control_key")?;
    let owner_pool = env
        .owner
        .as_ref()
        .map(|o| o.labels.pool_name.clone())
        .filter(|pool| !pool.is_empty());
    let pool_id = p.string("pool_id").or(owner_pool).ok_or_else(|| {
        param_error(
            "pool_id",
            "required when the gate has no owning pool".to_owned(),
        )
    })?;
    let state_key = p
        .string("state_key")
        .unwrap_or_else(|| format!("{control_key}:state"));
    let burst_seconds = p.float_or("burst_seconds", 1.0)?;
    if !burst_seconds.is_finite() || burst_seconds <= 0.0 {
        return Err(param_error(
            "burst_seconds",
            format!("must be a finite number > 0, got {burst_seconds}"),
        ));
    }
    let metrics = env.owner.as_ref().map(|o| o.metrics.clone());
    if let Some(m) = &metrics {
        m.record_drain_limit(&pool_id, None);
    }
    Ok(Arc::new(LeasedRate {
        link,
        control_key,
        state_key,
        pool_id,
        burst_seconds,
        metrics,
        failing: AtomicBool::new(false),
    }))
}

fn param_error(param: &str, reason: String) -> GateError {
    GateError::Param {
        gate: GATE,
        param: param.to_owned(),
        reason,
    }
}

struct LeasedRate {
    link: Arc<Link>,
    control_key: String,
    state_key: String,
    pool_id: String,
    burst_seconds: f64,
    /// Where the `drain_limit_*` gauges are (none for a gate built without an owner, in tests).
    metrics: Option<Arc<Metrics>>,
    /// Whether the last call failed, so an outage is logged when it starts and when it ends.
    failing: AtomicBool,
}

/// What the script answered.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Answer {
    admitted: bool,
    /// The lease's rate and end (Unix ms) when it is valid.
    lease: Option<(f64, i64)>,
}

impl LeasedRate {
    /// Runs the script (`take`: take a token, else read the lease only); any failure is a
    /// refusal with an invalid lease.
    async fn ask(&self, take: bool) -> Answer {
        let call = async {
            let mut con = self.link.con().await?;
            ADMIT
                .key(&self.control_key)
                .key(&self.state_key)
                .arg(API_VERSION)
                .arg(&self.pool_id)
                .arg(self.burst_seconds)
                .arg(u8::from(take))
                .invoke_async::<Value>(&mut con)
                .await
        };
        let answer = link::within(&self.link, call)
            .await
            .map_err(|e| crate::gateway::error_chain(&e))
            .and_then(|v| answer_of(&v).ok_or_else(|| format!("unexpected script answer {v:?}")));
        let answer = match answer {
            Ok(answer) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(pool = %self.pool_id, key = %self.control_key, "redis-leased-rate gate: Redis answers again");
                }
                answer
            }
            Err(reason) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::warn!(pool = %self.pool_id, key = %self.control_key, %reason, "redis-leased-rate gate: cannot read the lease, admitting nothing");
                }
                Answer {
                    admitted: false,
                    lease: None,
                }
            }
        };
        if let Some(m) = &self.metrics {
            m.record_drain_limit(&self.pool_id, answer.lease);
        }
        answer
    }
}

/// Reads `{admitted, lease_valid, rate, valid_until_ms}`.
fn answer_of(v: &Value) -> Option<Answer> {
    let Value::Array(items) = v else {
        return None;
    };
    let [admitted, valid, rate, until] = items.as_slice() else {
        return None;
    };
    let int = |v: &Value| match v {
        Value::Int(i) => Some(*i),
        _ => None,
    };
    let rate = match rate {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<f64>().ok()?,
        _ => return None,
    };
    let lease = match int(valid)? {
        1 if rate.is_finite() => Some((rate, int(until)?)),
        _ => None,
    };
    Some(Answer {
        admitted: int(admitted)? == 1 && lease.is_some(),
        lease,
    })
}

impl Gate for LeasedRate {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(async move {
            if self.ask(false).await.admitted {
                1.0
            } else {
                0.0
            }
        })
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            Ok(Decision::verdict(if self.ask(true).await.admitted {
                Verdict::Continue
            } else {
                Verdict::Refuse
            }))
        })
    }
}

#[cfg(test)]
mod tests;
