//! `fair-share`'s queues beyond the listed ones, and the tenants' weights.
//!
//! Every `discover_interval` one pass reads the index of queues with work (one `ZRANGE` of a
//! zset, queue name -> Unix ms work was last added, which the Batch API writes after each round
//! trip of lines) and the weights hash (one `HGETALL`), and runs a lane for each indexed queue
//! whose name starts with `queue_prefix`, with the settings of the template queue
//! ([`Lanes::discover`]). The cost of a pass does not grow with the tenants: two calls, plus
//! three reads for each entry that has gone `idle_after` without new work and whose lane found
//! its queue empty; an entry whose queue has nothing pending, claimed or parked is then taken
//! off the index (`forgetIdle-1.lua`, which leaves it if work came meanwhile) and its lane
//! retired. An entry whose score moved since the last pass rings its lane, whose consumer
//! waits for such rings (and the doorbell) while its queue is empty instead of polling it.
//!
//! Producers that do not write the index (Go's) are found by a `SCAN` for the prefix every
//! `scan_interval` (every primary's, on a cluster), which adds what it finds to the index, so
//! every processor serves them from then on.
//!
//! Every pass also announces that the prefix is served: `inferq-tenants:served:<prefix>`, with
//! a TTL of 30 s. A Batch API with `--queue-per-tenant` is not ready while no processor has
//! (see `inferq_batch::tenants`), so tenants' lines never wait unnoticed in queues no processor
//! serves.
//!
//! In: the policy's parameters, the template queue, the running lanes. Out: lanes started and
//! retired, the announcement, and the shared [`Weights`] the pools' merges read.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use tokio_util::sync::CancellationToken;

use super::fair_share::{SharedWeights, Weights};
use super::lanes::Lanes;
use super::reload::GateFactory;
use crate::config::{FairShare, QueueConfig};
use crate::queue::payload_census::{on, primaries};
use crate::queue::traced::Con;
use crate::queue::QueueError;
use inferq_client::keys::QueueKeys;
use inferq_client::scripts::SCRIPTS;

/// Most index entries read per pass.
const MOST_QUEUES: isize = 100_000;
/// Most idle entries looked at per pass.
const IDLE_CHECKS_PER_PASS: usize = 64;
/// `SCAN`'s page size hint.
const SCAN_PAGE: u64 = 1000;
/// How long the word that a prefix is served lasts without a pass renewing it.
const SERVED_TTL_MS: u64 = 30_000;

/// What the discovery works with.
pub struct Discovery {
    pub policy: FairShare,
    /// Each found queue's index score at the last pass: a newer one rings its lane.
    pub scores: HashMap<String, f64>,
    /// The listed queue whose settings found queues take.
    pub template: QueueConfig,
    pub lanes: Arc<Mutex<Lanes>>,
    pub gates: GateFactory,
    pub weights: SharedWeights,
    pub con: Con,
    /// Where the weights and the tenants with work are shown.
    pub metrics: Arc<crate::ops::Metrics>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery").finish_non_exhaustive()
    }
}

/// The weights the policy's parameters give.
pub fn initial_weights(policy: &FairShare) -> Weights {
    Weights {
        by_tenant: policy
            .weights
            .iter()
            .map(|(t, w)| (t.clone(), *w))
            .collect(),
        default: policy.default_weight,
    }
}

/// Discovers until `stop`.
pub async fn run(mut d: Discovery, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(d.policy.discover_interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_scan = tokio::time::Instant::now();
    let mut failing = false;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if let Some(every) = d.policy.scan_interval {
            if tokio::time::Instant::now() >= next_scan {
                next_scan = tokio::time::Instant::now() + every;
                if let Err(e) = d.scan().await {
                    tracing::warn!(error = %e, prefix = %d.policy.queue_prefix, "cannot SCAN for fair-share queues; retrying");
                }
            }
        }
        match d.pass().await {
            Ok(()) if failing => {
                failing = false;
                tracing::info!("reading the index of queues with work again");
            }
            Ok(()) => {}
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, index = %d.policy.index_key, "cannot read the index of queues with work; the queues found so far stay served; retrying");
            }
            Err(_) => {}
        }
    }
}

impl Discovery {
    /// One pass: weights, index, idle entries, lanes.
    async fn pass(&mut self) -> Result<(), QueueError> {
        let mut con = self.con.clone();
        if !self.policy.weights_key.is_empty() {
            let stored: HashMap<String, String> = redis::cmd("HGETALL")
                .arg(&self.policy.weights_key)
                .query_async(&mut con)
                .await?;
            self.set_weights(&stored);
        }
        if self.policy.queue_prefix.is_empty() {
            // Only the listed queues: nothing to find.
            return Ok(());
        }
        // The word that the prefix's queues are served, which a Batch API with
        // `--queue-per-tenant` waits for before it says it is ready (its `tenants` module
        // reads the same key).
        let _: () = redis::cmd("SET")
            .arg(format!(
                "inferq-tenants:served:{}",
                self.policy.queue_prefix
            ))
            .arg(inferq_client::producer::unix_ms())
            .arg("PX")
            .arg(SERVED_TTL_MS)
            .query_async(&mut con)
            .await?;
        let entries: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&self.policy.index_key)
            .arg(0)
            .arg(MOST_QUEUES - 1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await?;
        let prefix = &self.policy.queue_prefix;
        let entries: Vec<(String, f64)> = entries
            .into_iter()
            .filter(|(name, _)| name.starts_with(prefix.as_str()) && name.len() > prefix.len())
            .collect();
        let forgotten = self.forget_idle(&entries).await?;
        let found: Vec<QueueConfig> = entries
            .iter()
            .filter(|(name, _)| !forgotten.contains(name))
            .map(|(name, _)| self.queue(name))
            .collect();
        let mut lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
        // New work in a queue whose lane waits: ring it (its consumer polls at once).
        for (name, at) in &entries {
            let newer = self.scores.get(name).is_none_or(|old| at > old);
            if newer {
                if let Some(ctx) = lanes.context_of(name) {
                    ctx.wake.notify_one();
                }
            }
        }
        self.scores = entries.iter().cloned().collect();
        self.metrics
            .fair_share
            .tenants_with_work
            .set(i64::try_from(found.len()).unwrap_or(i64::MAX));
        match lanes.discover(found, |q| (self.gates)(q)) {
            Ok(change) if change != Default::default() => {
                tracing::debug!(
                    added = change.added.len(),
                    removed = change.removed.len(),
                    "fair-share queues changed"
                );
            }
            Ok(_) => {}
            Err((field, e)) => {
                tracing::error!(%field, error = %e, "cannot build the gate of a found queue; the queues found so far stay");
            }
        }
        Ok(())
    }

    /// The policy's weights, overridden by the stored hash's (unreadable ones are ignored).
    fn set_weights(&self, stored: &HashMap<String, String>) {
        let mut w = initial_weights(&self.policy);
        for (tenant, value) in stored {
            if let Ok(v) = value.parse::<f64>() {
                if v.is_finite() && v > 0.0 {
                    w.by_tenant.insert(tenant.clone(), v);
                }
            }
        }
        self.metrics
            .fair_share
            .set_weights(w.by_tenant.iter().map(|(t, w)| (t, *w)), w.default);
        *self.weights.write().unwrap_or_else(PoisonError::into_inner) = w;
    }

    /// A found queue, as its template says.
    fn queue(&self, name: &str) -> QueueConfig {
        QueueConfig {
            id: name.to_owned(),
            queue_name: name.to_owned(),
            ..self.template.clone()
        }
    }

    /// Takes off the index the entries idle for `idle_after` whose queues hold nothing; the
    /// names taken off.
    async fn forget_idle(&self, entries: &[(String, f64)]) -> Result<Vec<String>, QueueError> {
        let now_ms = inferq_client::producer::unix_ms() as f64;
        let idle_ms = self.policy.idle_after.as_millis() as f64;
        let cluster = self.con.is_cluster();
        let mut con = self.con.clone();
        let mut forgotten = Vec::new();
        let quiet = |name: &str| {
            let lanes = self.lanes.lock().unwrap_or_else(PoisonError::into_inner);
            lanes
                .context_of(name)
                .is_none_or(|ctx| ctx.holdings.is_empty() && ctx.state.is_seen_empty())
        };
        let idle: Vec<&(String, f64)> = entries
            .iter()
            .filter(|(name, at)| *at + idle_ms < now_ms && quiet(name))
            .take(IDLE_CHECKS_PER_PASS)
            .collect();
        for (name, at) in idle {
            let keys = QueueKeys::for_layout(name, cluster);
            let (pending, claimed, parked): (u64, u64, u64) = redis::pipe()
                .cmd("ZCARD")
                .arg(&keys.pending)
                .cmd("HLEN")
                .arg(&keys.claimed)
                .cmd("ZCARD")
                .arg(&keys.parked)
                .query_async(&mut con)
                .await?;
            if pending + claimed + parked > 0 {
                continue;
            }
            let script = &SCRIPTS.forget_idle;
            let cmd = script.cmd(&[&self.policy.index_key], &[name.clone(), at.to_string()]);
            let removed: i64 = redis::from_redis_value(script.run(&mut con, &cmd).await?)
                .map_err(redis::RedisError::from)?;
            if removed == 1 {
                forgotten.push(name.clone());
            }
        }
        Ok(forgotten)
    }

    /// Adds the queues a `SCAN` for the prefix finds to the index (`NX`: an entry's time is
    /// the producers' to move).
    async fn scan(&self) -> Result<(), QueueError> {
        let mut link = self.con.link();
        let pattern = format!("{}*", glob_escape(&self.policy.queue_prefix));
        let mut found = BTreeMap::new();
        for node in primaries(&mut link).await? {
            let mut cursor = 0u64;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_PAGE)
                    .arg("TYPE")
                    .arg("zset");
                let (next, keys): (u64, Vec<String>) = on(&mut link, node.as_ref(), &scan).await?;
                for key in keys.into_iter().filter(|k| is_queue_name(k)) {
                    found.insert(key, ());
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        if found.is_empty() {
            return Ok(());
        }
        let now = inferq_client::producer::unix_ms();
        let mut con = self.con.clone();
        for chunk in found.keys().collect::<Vec<_>>().chunks(500) {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&self.policy.index_key).arg("NX");
            for name in chunk {
                zadd.arg(now).arg(name.as_str());
            }
            let _: i64 = zadd.query_async(&mut con).await?;
        }
        Ok(())
    }
}

/// The suffixes of a queue's own bookkeeping zsets (`<queue>:claims-idx`, …), which a `SCAN`
/// for the prefix also finds.
const BOOKKEEPING: [&str; 5] = [
    ":claims-idx",
    ":deliveries-idx",
    ":parked",
    ":dead",
    ":finishing-idx",
];

/// Whether a zset a `SCAN` found is a queue, not a queue's bookkeeping or another index.
fn is_queue_name(key: &str) -> bool {
    !BOOKKEEPING.iter().any(|s| key.ends_with(s))
        && !key.starts_with("request-seq:")
        && !key.ends_with(":retry-sortedset")
}

/// `text` with `SCAN MATCH`'s special characters escaped.
fn glob_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bookkeeping_is_no_queue_and_globs_are_escaped() {
        assert!(is_queue_name("inferq-tenant:alice"));
        assert!(!is_queue_name("inferq-tenant:alice:claims-idx"));
        assert!(!is_queue_name("inferq-tenant:alice:parked"));
        assert_eq!(glob_escape("a*b?[c]"), "a\\*b\\?\\[c\\]");
    }
}
