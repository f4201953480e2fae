//! The fault schedule: which fault comes next and how long it lasts, drawn from a seeded RNG
//! so that a failing run can be replayed with the same `--seed`.
//!
//! [`plan`] takes the seed, the number of processors, the lease and the length of the fault
//! window, and returns the whole list of [`Planned`] faults up front. Every kind of fault
//! appears at least once (in a seeded order, even if that overruns a short window) before
//! kinds repeat at random, so even a short run exercises them all. The injector ([`super::inject`]) carries them out one after another.

use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

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
}

const KINDS: usize = 9;

fn draw_kind(kind: usize, shape: &PlanShape, rng: &mut StdRng) -> Fault {
    let ms = |rng: &mut StdRng, lo: u64, hi: u64| Duration::from_millis(rng.random_range(lo..=hi));
    let lease_ms = u64::try_from(shape.lease.as_millis()).unwrap_or(u64::MAX);
    let index = rng.random_range(0..shape.processors.max(1));
    let one_or_all = |rng: &mut StdRng| rng.random_bool(0.5).then_some(index);
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
    let mut first_round: Vec<usize> = (0..KINDS).collect();
    first_round.shuffle(&mut rng);
    let (lo, hi) = shape.gap;
    let mut out = Vec::new();
    let mut elapsed = Duration::ZERO;
    loop {
        let kind = first_round
            .get(out.len())
            .copied()
            .unwrap_or_else(|| rng.random_range(0..KINDS));
        let gap = if hi > lo {
            rng.random_range(lo..=hi)
        } else {
            lo
        };
        let fault = draw_kind(kind, shape, &mut rng);
        let next = elapsed + gap;
        // The first round always runs whole, so every kind is exercised.
        if next > shape.window && out.len() >= KINDS {
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
        }
    }

    fn kind(f: &Fault) -> &'static str {
        match f {
            Fault::KillProcessor { .. } => "kill",
            Fault::PauseProcessor { .. } => "pause",
            Fault::RestartRedis { graceful: true, .. } => "redis-term",
            Fault::RestartRedis {
                graceful: false, ..
            } => "redis-kill",
            Fault::ScriptFlush => "flush",
            Fault::CutConnections { .. } => "cut",
            Fault::StallConnections { .. } => "stall",
            Fault::GatewayFaults { .. } => "gateway",
            Fault::FrozenAcrossRedisRestart { .. } => "frozen-across-redis",
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
            let kinds: std::collections::BTreeSet<_> = p.iter().map(|x| kind(&x.fault)).collect();
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
}
