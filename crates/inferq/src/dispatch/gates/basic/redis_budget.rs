//! `redis`: a budget some other system writes into a Redis key (`budget_key`, default
//! `dispatch-gate-budget`) and this gate reads with `GET` on every budget call.
//!
//! Missing key → 1.0; unparsable value → 1.0; a Redis error or timeout → 0.0 (fail closed, logged
//! once per outage); otherwise the value clamped to [0, 1]. Apply is budget-only: a budget ≤ 0
//! refuses, anything else continues.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::future::BoxFuture;

use super::link::{self, Link};
use crate::config::gate_params::Params;
use crate::dispatch::gates::{Decision, Gate, GateError, GateInput, Verdict};

/// Builds a `redis` gate.
pub(super) fn build(p: Params<'_>) -> Result<Arc<dyn Gate>, GateError> {
    Ok(Arc::new(RedisBudget {
        link: link::link(&p)?,
        key: p.string_or("budget_key", "dispatch-gate-budget"),
        failing: AtomicBool::new(false),
    }))
}

struct RedisBudget {
    link: Arc<Link>,
    key: String,
    /// Whether the last read failed, so an outage is logged when it starts and when it ends
    /// rather than on every poll.
    failing: AtomicBool,
}

impl RedisBudget {
    async fn read(&self) -> f64 {
        let call = async {
            let mut con = self.link.con().await?;
            redis::cmd("GET")
                .arg(&self.key)
                .query_async::<Option<Vec<u8>>>(&mut con)
                .await
        };
        match link::within(&self.link, call).await {
            Ok(raw) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::info!(key = %self.key, "redis gate: budget readable again");
                }
                budget_of(raw.as_deref())
            }
            Err(e) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    let reason = crate::gateway::error_chain(&e);
                    tracing::warn!(key = %self.key, %reason, "redis gate: budget unreadable, gate closed");
                }
                0.0
            }
        }
    }
}

/// The budget a key's value stands for: missing or unparsable → 1.0, else clamped to [0, 1].
fn budget_of(raw: Option<&[u8]>) -> f64 {
    let Some(raw) = raw else {
        return 1.0;
    };
    match std::str::from_utf8(raw).ok().map(str::parse::<f64>) {
        Some(Ok(v)) if !v.is_nan() => v.clamp(0.0, 1.0),
        _ => 1.0,
    }
}

impl Gate for RedisBudget {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(self.read())
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            Ok(Decision::verdict(if self.read().await <= 0.0 {
                Verdict::Refuse
            } else {
                Verdict::Continue
            }))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use redis::AsyncCommands;
    use serde_json::json;

    use super::super::testing::*;
    use super::*;
    use inferq_testkit::{free_port, RedisServer};

    #[test]
    fn values() {
        assert_eq!(budget_of(None), 1.0);
        assert_eq!(budget_of(Some(b"0.3")), 0.3);
        assert_eq!(budget_of(Some(b"7")), 1.0);
        assert_eq!(budget_of(Some(b"-1")), 0.0);
        assert_eq!(budget_of(Some(b"lots")), 1.0);
        assert_eq!(budget_of(Some(b"NaN")), 1.0);
        assert_eq!(budget_of(Some(b"\xff")), 1.0);
    }

    #[tokio::test]
    async fn reads_the_key() {
        let mut server = RedisServer::start().unwrap();
        let mut con = server.connection().await.unwrap();
        let g = gate(
            "redis",
            json!({"address": format!("127.0.0.1:{}", server.port())}),
        )
        .unwrap();
        assert_eq!(g.budget().await, 1.0, "missing key");
        for (value, budget) in [("0.3", 0.3), ("7", 1.0), ("-1", 0.0), ("oops", 1.0)] {
            let _: () = con.set("dispatch-gate-budget", value).await.unwrap();
            assert_eq!(g.budget().await, budget, "value {value}");
        }
        assert_eq!(name(&apply(g.as_ref(), &[], &[]).await.verdict), "continue");
        let _: () = con.set("dispatch-gate-budget", "0").await.unwrap();
        assert_eq!(g.budget().await, 0.0, "live update");
        assert_eq!(name(&apply(g.as_ref(), &[], &[]).await.verdict), "refuse");

        // Another key, through a URL address with a database number.
        let url = format!("redis://127.0.0.1:{}/2", server.port());
        let other = gate("redis", json!({"address": url, "budget_key": "b"})).unwrap();
        let _: () = redis::cmd("SELECT")
            .arg(2)
            .query_async(&mut con)
            .await
            .unwrap();
        let _: () = con.set("b", 0.25).await.unwrap();
        assert_eq!(other.budget().await, 0.25);

        server.kill();
        let started = Instant::now();
        assert_eq!(g.budget().await, 0.0, "Redis down fails closed");
        assert_eq!(name(&apply(g.as_ref(), &[], &[]).await.verdict), "refuse");
        assert!(started.elapsed() < Duration::from_millis(2500));
    }

    #[tokio::test]
    async fn never_reachable_is_closed_quickly() {
        let port = free_port().unwrap();
        let g = gate("redis", json!({"address": format!("127.0.0.1:{port}")})).unwrap();
        let started = Instant::now();
        assert_eq!(g.budget().await, 0.0);
        assert!(started.elapsed() < Duration::from_millis(1500));
    }

    #[test]
    fn parameter_errors() {
        assert_eq!(
            build_error("redis", json!({"budget_key": "k"})),
            "gate redis: parameter address: required"
        );
    }
}
