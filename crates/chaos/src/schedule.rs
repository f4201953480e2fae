//! The fault schedule: which fault comes next and how long it lasts, drawn from a seeded RNG
//! so that a failing run can be replayed with the same `--seed`.
//!
//! [`plan`] takes the seed, the number of processors, the lease and the length of the fault
//! window, and returns the whole list of [`Planned`] faults up front. Every kind of fault
//! appears at least once (in a seeded order, even if that overruns a short window) before
//! kinds repeat at random, so even a short run exercises them all. Which kinds there are
//! depends on the deployment ([`PlanShape::redis`]): a standalone run breaks processes, Redis
//! and the network; a cluster run kills processors and masters, fails over and migrates the
//! queue's slot; a Sentinel run kills processors and the primary and forces fail-overs. The
//! injectors ([`super::inject`], [`super::deployed`]) carry them out one after another.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::ChaosRedis;

/// Whose slot a cluster fault aims at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SlotOf {
    /// The queue's slot: its pending set, claims, staged finishes and the result list beside
    /// it (`{queue}:results`).
    Queue,
    /// The slot of the result list in another slot (the staged, three-step finish).
    ResultList,
}

impl SlotOf {
    fn label(self) -> &'static str {
        match self {
            SlotOf::Queue => "the queue's",
            SlotOf::ResultList => "the other result list's",
        }
    }
}

/// One fault. Durations appear in the JSON report as milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Fault {
    /// SIGKILL a processor; start it again after `down`.
    KillProcessor {
        index: usize,
        #[serde(serialize_with = "super::millis::serialize")]
        down: Duration,
    },
    /// SIGSTOP a processor for `stopped` (longer than its lease), then SIGCONT: a zombie owner
    /// comes back believing it still holds its claims.
    PauseProcessor {
        index: usize,
        #[serde(serialize_with = "super::millis::serialize")]
        stopped: Duration,
    },
    /// Restart Redis: `SIGTERM` (graceful) or `SIGKILL`, down for `down`, then again on the
    /// same port and data directory (the AOF, `appendfsync always`, brings everything back).
    RestartRedis {
        graceful: bool,
        #[serde(serialize_with = "super::millis::serialize")]
        down: Duration,
    },
    /// SIGSTOP a processor, SIGKILL Redis while it is frozen and bring Redis back, then
    /// SIGCONT after `stopped`: the zombie wakes up to broken connections, a restarted Redis
    /// and claims that are no longer its own.
    FrozenAcrossRedisRestart {
        index: usize,
        #[serde(serialize_with = "super::millis::serialize")]
        stopped: Duration,
    },
    /// `SCRIPT FLUSH`: every processor's cached scripts vanish.
    ScriptFlush,
    /// Drop every connection through the proxy of one processor, or of all (`None`).
    CutConnections { index: Option<usize> },
    /// Stop forwarding through the proxy of one processor, or of all, for `stalled`.
    StallConnections {
        index: Option<usize>,
        #[serde(serialize_with = "super::millis::serialize")]
        stalled: Duration,
    },
    /// The gateway answers 5xx, 429, resets or hangs at these rates for `lasting`.
    GatewayFaults {
        error_rate: f64,
        hang_rate: f64,
        reset_rate: f64,
        rate_limit_rate: f64,
        #[serde(serialize_with = "super::millis::serialize")]
        lasting: Duration,
    },
    /// Cluster: SIGKILL the master serving `of`'s slot, wait until its replica took over, then
    /// start the old master again (it rejoins as a replica of the promoted one).
    KillMaster { of: SlotOf },
    /// Cluster: `CLUSTER FAILOVER` on a replica of the master serving `of`'s slot (the roles
    /// swap without losing a write).
    ClusterFailover { of: SlotOf },
    /// Cluster: move the queue's slot to another master under load: `first_keys` keys first
    /// (the slot is half-way: clients meet `ASK` and `TRYAGAIN`), the rest after `halfway`.
    MigrateQueueSlot {
        first_keys: usize,
        #[serde(serialize_with = "super::millis::serialize")]
        halfway: Duration,
    },
    /// Sentinel: SIGKILL the primary, wait until the sentinels promoted the replica, then start
    /// the old primary again as a replica.
    KillPrimary,
    /// Sentinel: `SENTINEL FAILOVER` (the old primary becomes a replica).
    SentinelFailover,
}

impl Fault {
    /// Roughly how long carrying it out takes (for fitting the plan into the window).
    pub fn span(&self) -> Duration {
        match self {
            Fault::KillProcessor { down, .. } => *down,
            Fault::PauseProcessor { stopped, .. }
            | Fault::FrozenAcrossRedisRestart { stopped, .. } => *stopped,
            Fault::RestartRedis { down, .. } => *down + Duration::from_millis(300),
            Fault::ScriptFlush | Fault::CutConnections { .. } => Duration::ZERO,
            Fault::StallConnections { stalled, .. } => *stalled,
            Fault::GatewayFaults { lasting, .. } => *lasting,
            // Roughly what the fail-overs take on an idle machine.
            Fault::KillMaster { .. } | Fault::KillPrimary => Duration::from_secs(8),
            Fault::ClusterFailover { .. } | Fault::SentinelFailover => Duration::from_secs(3),
            Fault::MigrateQueueSlot { halfway, .. } => *halfway + Duration::from_secs(1),
        }
    }

    /// The fault's kind as the report counts it: the `kind` of its JSON, with `/graceful` or
    /// `/kill` for Redis restarts.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::KillProcessor { .. } => "kill_processor",
            Fault::PauseProcessor { .. } => "pause_processor",
            Fault::RestartRedis { graceful: true, .. } => "restart_redis/graceful",
            Fault::RestartRedis {
                graceful: false, ..
            } => "restart_redis/kill",
            Fault::FrozenAcrossRedisRestart { .. } => "frozen_across_redis_restart",
            Fault::ScriptFlush => "script_flush",
            Fault::CutConnections { .. } => "cut_connections",
            Fault::StallConnections { .. } => "stall_connections",
            Fault::GatewayFaults { .. } => "gateway_faults",
            Fault::KillMaster { .. } => "kill_master",
            Fault::ClusterFailover { .. } => "cluster_failover",
            Fault::MigrateQueueSlot { .. } => "migrate_queue_slot",
            Fault::KillPrimary => "kill_primary",
            Fault::SentinelFailover => "sentinel_failover",
        }
    }

    /// A short label for tables.
    pub fn label(&self) -> String {
        let s = |d: &Duration| format!("{:.1}s", d.as_secs_f64());
        let who = |i: &Option<usize>| match i {
            Some(i) => format!("processor {i}"),
            None => "all processors".to_owned(),
        };
        match self {
            Fault::KillProcessor { index, down } => {
                format!("SIGKILL processor {index}, restart after {}", s(down))
            }
            Fault::PauseProcessor { index, stopped } => {
                format!("SIGSTOP processor {index} for {}, SIGCONT", s(stopped))
            }
            Fault::RestartRedis { graceful, down } => format!(
                "{} Redis, down {}",
                if *graceful { "SIGTERM" } else { "SIGKILL" },
                s(down)
            ),
            Fault::FrozenAcrossRedisRestart { index, stopped } => format!(
                "SIGSTOP processor {index} for {}, SIGKILL + restart Redis meanwhile, SIGCONT",
                s(stopped)
            ),
            Fault::ScriptFlush => "SCRIPT FLUSH".to_owned(),
            Fault::CutConnections { index } => format!("cut Redis connections of {}", who(index)),
            Fault::StallConnections { index, stalled } => {
                format!(
                    "stall Redis connections of {} for {}",
                    who(index),
                    s(stalled)
                )
            }
            Fault::GatewayFaults {
                error_rate,
                hang_rate,
                reset_rate,
                rate_limit_rate,
                lasting,
            } => format!(
                "gateway 5xx {:.0}% hang {:.0}% reset {:.0}% 429 {:.0}% for {}",
                error_rate * 100.0,
                hang_rate * 100.0,
                reset_rate * 100.0,
                rate_limit_rate * 100.0,
                s(lasting)
            ),
            Fault::KillMaster { of } => format!(
                "SIGKILL {} master, replica promoted, old master back as a replica",
                of.label()
            ),
            Fault::ClusterFailover { of } => {
                format!("CLUSTER FAILOVER of {} master", of.label())
            }
            Fault::MigrateQueueSlot {
                first_keys,
                halfway,
            } => format!(
                "migrate the queue's slot: {first_keys} keys, {} half-way (ASK), then the rest",
                s(halfway)
            ),
            Fault::KillPrimary => {
                "SIGKILL the Sentinel primary, replica promoted, old primary back as a replica"
                    .to_owned()
            }
            Fault::SentinelFailover => "SENTINEL FAILOVER".to_owned(),
        }
    }
}

/// A fault and the quiet gap before it.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub gap: Duration,
    pub fault: Fault,
}

/// How the plan is shaped.
#[derive(Debug, Clone)]
pub struct PlanShape {
    pub processors: usize,
    pub lease: Duration,
    /// Faults start within this window (measured from the first one's gap).
    pub window: Duration,
    /// Quiet time between faults, drawn uniformly from this range.
    pub gap: (Duration, Duration),
    /// Which faults the deployment has.
    pub redis: ChaosRedis,
}

/// The standalone kinds, `0..KINDS` in [`draw_kind`].
const KINDS: usize = 9;
/// The kinds of a cluster run: processor kill and freeze, master kill, manual failover, slot
/// migration.
const CLUSTER_KINDS: [usize; 5] = [0, 1, 10, 11, 12];
/// The kinds of a Sentinel run: processor kill and freeze, primary kill, forced failover.
const SENTINEL_KINDS: [usize; 4] = [0, 1, 13, 14];

/// The kinds of fault `redis` has (numbers of [`draw_kind`]).
fn kinds(redis: ChaosRedis) -> Vec<usize> {
    match redis {
        ChaosRedis::Standalone => (0..KINDS).collect(),
        ChaosRedis::Cluster => CLUSTER_KINDS.to_vec(),
        ChaosRedis::Sentinel => SENTINEL_KINDS.to_vec(),
    }
}

fn draw_kind(kind: usize, shape: &PlanShape, rng: &mut StdRng) -> Fault {
    let ms = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    let lease_ms = u64::try_from(shape.lease.as_millis()).unwrap_or(u64::MAX);
    let index = rng.random_range(0..shape.processors.max(1));
    let one_or_all = |rng: &mut StdRng| rng.random_bool(0.5).then_some(index);
    let slot_of = |rng: &mut StdRng| {
        if rng.random_bool(0.5) {
            SlotOf::Queue
        } else {
            SlotOf::ResultList
        }
    };
    match kind {
        0 => Fault::KillProcessor {
            index,
            down: ms(rng, 500, 2000),
        },
        1 => Fault::PauseProcessor {
            index,
            // Longer than the lease, so a survivor reclaims its claims while it is frozen.
            stopped: ms(rng, lease_ms + lease_ms / 2, lease_ms * 2 + 1000),
        },
        2 => Fault::RestartRedis {
            graceful: true,
            down: ms(rng, 200, 1500),
        },
        3 => Fault::RestartRedis {
            graceful: false,
            down: ms(rng, 200, 1500),
        },
        4 => Fault::ScriptFlush,
        5 => Fault::CutConnections {
            index: one_or_all(rng),
        },
        6 => Fault::StallConnections {
            index: one_or_all(rng),
            stalled: ms(rng, 1000, lease_ms * 2 + 1000),
        },
        8 => Fault::FrozenAcrossRedisRestart {
            index,
            stopped: ms(rng, lease_ms + lease_ms / 2, lease_ms * 2 + 1000),
        },
        10 => Fault::KillMaster { of: slot_of(rng) },
        11 => Fault::ClusterFailover { of: slot_of(rng) },
        12 => Fault::MigrateQueueSlot {
            first_keys: rng.random_range(1..=4),
            halfway: ms(rng, 200, 1500),
        },
        13 => Fault::KillPrimary,
        14 => Fault::SentinelFailover,
        _ => Fault::GatewayFaults {
            error_rate: rng.random_range(0.1..0.5),
            hang_rate: rng.random_range(0.0..0.1),
            reset_rate: rng.random_range(0.0..0.1),
            rate_limit_rate: rng.random_range(0.0..0.2),
            lasting: ms(rng, 1000, 4000),
        },
    }
}

/// The whole fault plan for `seed`.
pub fn plan(seed: u64, shape: &PlanShape) -> Vec<Planned> {
    let mut rng = StdRng::seed_from_u64(seed);
    let kinds = kinds(shape.redis);
    let mut first_round = kinds.clone();
    first_round.shuffle(&mut rng);
    let (lo, hi) = shape.gap;
    let mut out = Vec::new();
    let mut elapsed = Duration::ZERO;
    loop {
        let kind = first_round
            .get(out.len())
            .copied()
            .unwrap_or_else(|| kinds[rng.random_range(0..kinds.len())]);
        let gap = if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        };
        let fault = draw_kind(kind, shape, &mut rng);
        let next = elapsed + gap;
        // The first round always runs whole, so every kind is exercised.
        if next > shape.window && out.len() >= kinds.len() {
            return out;
        }
        elapsed = next + fault.span();
        out.push(Planned { gap, fault });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(window_s: u64) -> PlanShape {
        PlanShape {
            processors: 3,
            lease: Duration::from_secs(2),
            window: Duration::from_secs(window_s),
            gap: (Duration::from_millis(1000), Duration::from_millis(3000)),
            redis: ChaosRedis::Standalone,
        }
    }

    #[test]
    fn a_seed_replays_the_same_plan_and_another_seed_does_not() {
        assert_eq!(plan(7, &shape(60)), plan(7, &shape(60)));
        assert_ne!(plan(7, &shape(60)), plan(8, &shape(60)));
    }

    #[test]
    fn every_kind_appears_and_the_plan_fits_the_window() {
        for seed in 0..50 {
            let p = plan(seed, &shape(60));
            let kinds: std::collections::BTreeSet<_> = p.iter().map(|x| x.fault.kind()).collect();
            assert_eq!(kinds.len(), KINDS, "seed {seed}: {kinds:?}");
            let mut start = Duration::ZERO;
            for x in &p {
                start += x.gap;
                assert!(start <= Duration::from_secs(60), "seed {seed}");
                start += x.fault.span();
            }
            for x in &p {
                match &x.fault {
                    Fault::PauseProcessor { stopped, .. } => {
                        assert!(*stopped > Duration::from_secs(2), "longer than the lease")
                    }
                    Fault::KillProcessor { index, .. } => assert!(*index < 3),
                    _ => {}
                }
            }
        }
    }

    #[test]
    fn a_cluster_or_sentinel_plan_has_every_topology_fault_and_no_standalone_one() {
        for (redis, want) in [
            (
                ChaosRedis::Cluster,
                &[
                    "kill_processor",
                    "pause_processor",
                    "kill_master",
                    "cluster_failover",
                    "migrate_queue_slot",
                ][..],
            ),
            (
                ChaosRedis::Sentinel,
                &[
                    "kill_processor",
                    "pause_processor",
                    "kill_primary",
                    "sentinel_failover",
                ][..],
            ),
        ] {
            for seed in 0..30 {
                let p = plan(seed, &PlanShape { redis, ..shape(30) });
                let kinds: std::collections::BTreeSet<_> =
                    p.iter().map(|x| x.fault.kind()).collect();
                let want: std::collections::BTreeSet<_> = want.iter().copied().collect();
                assert_eq!(kinds, want, "{redis:?} seed {seed}");
            }
        }
    }
}
