//! Carrying out faults on the running system (the [`Rig`]): Redis, the proxies, the
//! processors and the simulator. [`Rig::inject`] takes one planned [`Fault`], does it, and
//! returns a [`FaultRecord`] for the fault log; for a processor kill or freeze it also returns
//! the [`Orphans`]: the requests that processor held at that moment.
//!
//! Which claims a processor held is read from Redis, not from the processor: the claim owners
//! and lease expiries are snapshotted just before the signal and again half a lease later.
//! Live owners renew every third of a lease, so by then every live claim has a later expiry
//! (or is gone, finished); the claims whose token and expiry did not move belong to the
//! process that was just stopped. [`Rig::restore`] brings everything back after the last
//! fault.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use serde::Serialize;

use super::history::Orphans;
use super::processes::{Life, Processor};
use super::proxy::Proxy;
use super::schedule::Fault;
use inferq_client::keys::QueueKeys;
use inferq_client::producer::unix_ms;
use inferq_sim::{FaultRates, Sim};
use inferq_testkit::RedisServer;

/// One line of the fault log.
#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub index: usize,
    /// When it began, from the start of the workload.
    pub at_ms: u64,
    /// How long carrying it out took.
    pub took_ms: u64,
    pub fault: Fault,
    pub label: String,
    /// `ok`, or what went wrong carrying it out.
    pub outcome: String,
    /// Claims the processor held when killed or frozen (when they could be read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held: Option<usize>,
}

impl FaultRecord {
    /// The record of fault `index`, begun at `began` in a run started at `run_started` (`at`),
    /// carried out with `outcome`.
    pub fn new(
        index: usize,
        fault: &Fault,
        (run_started, began): (Instant, Instant),
        outcome: Result<(), String>,
        held: Option<usize>,
    ) -> FaultRecord {
        FaultRecord {
            index,
            at_ms: ms(began.saturating_duration_since(run_started)),
            took_ms: ms(began.elapsed()),
            fault: fault.clone(),
            label: fault.label(),
            outcome: match outcome {
                Ok(()) => "ok".to_owned(),
                Err(e) => e,
            },
            held,
        }
    }
}

/// Claim key -> (owner token, lease expiry).
type Claims = HashMap<String, (String, f64)>;

/// The request ids of claims whose owner token and lease expiry did not move between two
/// snapshots: nobody renewed them.
fn unrenewed(before: &Claims, after: &Claims) -> Vec<String> {
    let mut ids: Vec<String> = before
        .iter()
        .filter(|(key, was)| after.get(*key) == Some(*was))
        .map(|(key, _)| key.split('\0').next().unwrap_or_default().to_owned())
        .collect();
    ids.sort();
    ids
}

/// Everything a chaos run started.
#[derive(Debug)]
pub struct Rig {
    pub redis: RedisServer,
    pub proxies: Vec<Proxy>,
    pub processors: Vec<Processor>,
    pub sim: Sim,
    /// A direct connection (not through a proxy) for `SCRIPT FLUSH` and snapshots.
    pub admin: ConnectionManager,
    pub keys: QueueKeys,
    pub lease: Duration,
}

/// Attempts of one admin command before it counts as failed.
const ADMIN_TRIES: usize = 3;

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Rig {
    /// Carries out `fault`, the `index`-th of the run.
    pub async fn inject(
        &mut self,
        index: usize,
        fault: &Fault,
        run_started: Instant,
    ) -> (FaultRecord, Option<Orphans>) {
        let began = Instant::now();
        let mut held = None;
        let mut orphans = None;
        let outcome = match fault {
            Fault::KillProcessor { index: p, down } => {
                let (o, result) = self
                    .with_orphans(index, *p, *down, |proc| {
                        proc.kill();
                        Ok(())
                    })
                    .await;
                held = o.as_ref().map(|o| o.ids.len());
                orphans = o;
                match result {
                    Ok(()) => self.processors[*p].revive().map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            }
            Fault::PauseProcessor { index: p, stopped } => {
                let (o, result) = self
                    .with_orphans(index, *p, *stopped, |proc| {
                        proc.pause().map_err(|e| e.to_string())
                    })
                    .await;
                held = o.as_ref().map(|o| o.ids.len());
                orphans = o;
                let resumed = self.processors[*p].resume().map_err(|e| e.to_string());
                result.and(resumed)
            }
            Fault::FrozenAcrossRedisRestart { index: p, stopped } => {
                // Orphans are read while Redis is still up, half a lease into the freeze; the
                // Redis restart follows at once, and the freeze lasts `stopped` in all.
                let began = Instant::now();
                let (o, result) = self
                    .with_orphans(index, *p, Duration::ZERO, |proc| {
                        proc.pause().map_err(|e| e.to_string())
                    })
                    .await;
                held = o.as_ref().map(|o| o.ids.len());
                orphans = o;
                tokio::task::block_in_place(|| self.redis.kill());
                tokio::time::sleep(Duration::from_millis(300)).await;
                let restarted =
                    tokio::task::block_in_place(|| self.redis.restart()).map_err(|e| e.to_string());
                tokio::time::sleep(stopped.saturating_sub(began.elapsed())).await;
                let resumed = self.processors[*p].resume().map_err(|e| e.to_string());
                result.and(restarted).and(resumed)
            }
            Fault::RestartRedis { graceful, down } => {
                let graceful = *graceful;
                tokio::task::block_in_place(|| {
                    if graceful {
                        self.redis.terminate(Duration::from_secs(10));
                    } else {
                        self.redis.kill();
                    }
                });
                tokio::time::sleep(*down).await;
                tokio::task::block_in_place(|| self.redis.restart()).map_err(|e| e.to_string())
            }
            Fault::ScriptFlush => {
                let mut last = Ok(());
                // The admin connection may still be broken from a Redis restart: it
                // reconnects on the next try.
                for _ in 0..ADMIN_TRIES {
                    last = redis::cmd("SCRIPT")
                        .arg("FLUSH")
                        .query_async::<()>(&mut self.admin)
                        .await
                        .map_err(|e| e.to_string());
                    if last.is_ok() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                last
            }
            Fault::CutConnections { index: p } => {
                self.proxies_of(*p).for_each(Proxy::cut);
                Ok(())
            }
            Fault::StallConnections { index: p, stalled } => {
                self.proxies_of(*p).for_each(|x| x.stall(true));
                tokio::time::sleep(*stalled).await;
                self.proxies_of(*p).for_each(|x| x.stall(false));
                Ok(())
            }
            Fault::GatewayFaults {
                error_rate,
                hang_rate,
                reset_rate,
                rate_limit_rate,
                lasting,
            } => {
                let set = self.sim.set_faults(FaultRates {
                    error_rate: *error_rate,
                    hang_rate: *hang_rate,
                    reset_rate: *reset_rate,
                    rate_limit_rate: *rate_limit_rate,
                    ..FaultRates::default()
                });
                tokio::time::sleep(*lasting).await;
                let cleared = self.sim.set_faults(FaultRates::default());
                set.and(cleared).map_err(|e| e.to_string())
            }
            Fault::KillMaster { .. }
            | Fault::ClusterFailover { .. }
            | Fault::MigrateQueueSlot { .. }
            | Fault::KillPrimary
            | Fault::SentinelFailover => Err("not a fault of a standalone Redis".to_owned()),
        };
        let record = FaultRecord::new(index, fault, (run_started, began), outcome, held);
        tracing::info!(
            fault = index,
            at_s = record.at_ms as f64 / 1000.0,
            outcome = %record.outcome,
            held = ?record.held,
            "{}",
            record.label
        );
        (record, orphans)
    }

    fn proxies_of(&self, index: Option<usize>) -> impl Iterator<Item = &Proxy> {
        self.proxies
            .iter()
            .enumerate()
            .filter(move |(i, _)| index.is_none_or(|p| p == *i))
            .map(|(_, p)| p)
    }

    /// Snapshots the claims, stops processor `p` with `signal`, finds the claims that stopped
    /// being renewed, and waits out `hold` in all.
    async fn with_orphans(
        &mut self,
        fault: usize,
        p: usize,
        hold: Duration,
        signal: impl FnOnce(&mut Processor) -> Result<(), String>,
    ) -> (Option<Orphans>, Result<(), String>) {
        let began = Instant::now();
        let before = self.claims().await;
        let at_ms = unix_ms();
        if let Err(e) = signal(&mut self.processors[p]) {
            return (None, Err(e));
        }
        let look = self.lease / 2;
        tokio::time::sleep(look).await;
        let after = self.claims().await;
        let orphans = match (before, after) {
            (Some(before), Some(after)) => Some(Orphans {
                fault,
                processor: p,
                at_ms,
                ids: unrenewed(&before, &after),
            }),
            _ => None,
        };
        tokio::time::sleep(hold.saturating_sub(began.elapsed())).await;
        (orphans, Ok(()))
    }

    /// Every claim's owner token and lease expiry, read in one transaction (tried a few
    /// times: the admin connection may be broken from a Redis restart and reconnects).
    async fn claims(&mut self) -> Option<Claims> {
        for _ in 0..ADMIN_TRIES {
            if let Some(claims) = self.claims_once().await {
                return Some(claims);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        None
    }

    async fn claims_once(&mut self) -> Option<Claims> {
        let (owners, idx): (HashMap<String, String>, Vec<(String, f64)>) = redis::pipe()
            .atomic()
            .cmd("HGETALL")
            .arg(&self.keys.owners)
            .cmd("ZRANGE")
            .arg(&self.keys.idx)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.admin)
            .await
            .ok()?;
        let expiry: HashMap<String, f64> = idx.into_iter().collect();
        Some(
            owners
                .into_iter()
                .map(|(key, token)| {
                    let e = expiry.get(&key).copied().unwrap_or(f64::NAN);
                    (key, (token, e))
                })
                .collect(),
        )
    }

    /// After the last fault: forwarding on, gateway healthy, Redis up, every processor
    /// running. Returns what could not be brought back.
    pub async fn restore(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        for p in &self.proxies {
            p.stall(false);
        }
        if let Err(e) = self.sim.set_faults(FaultRates::default()) {
            problems.push(format!("gateway faults: {e}"));
        }
        if !self.redis.is_running() {
            if let Err(e) = tokio::task::block_in_place(|| self.redis.restart()) {
                problems.push(format!("redis restart: {e}"));
            }
        }
        for p in &mut self.processors {
            if p.life() != Life::Running {
                if let Err(e) = p.revive() {
                    problems.push(format!("processor {}: {e}", p.index));
                }
            }
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_orphan_is_a_claim_whose_token_and_expiry_did_not_move() {
        let before: Claims = [
            ("a\0t".to_owned(), ("o1".to_owned(), 10.0)),
            ("b\0t".to_owned(), ("o2".to_owned(), 10.5)),
            ("c\0t".to_owned(), ("o3".to_owned(), 11.0)),
        ]
        .into();
        let after: Claims = [
            ("a\0t".to_owned(), ("o1".to_owned(), 10.0)),
            ("b\0t".to_owned(), ("o2".to_owned(), 12.5)),
        ]
        .into();
        // a: not renewed (orphaned); b: renewed by a live owner; c: finished (gone).
        assert_eq!(unrenewed(&before, &after), ["a"]);
        let taken: Claims = [("a\0t".to_owned(), ("other".to_owned(), 10.0))].into();
        assert!(
            unrenewed(&before, &taken).is_empty(),
            "a new owner is not an orphan"
        );
    }
}
