//! `inferq-dev chaos`: proves the durability contract by breaking things on purpose and checking
//! the whole history afterwards.
//!
//! A run starts a real `redis-server` (AOF, `appendfsync always`), the simulator gateway
//! in-process, and three `inferq run` children of this executable, each reaching Redis
//! through its own breakable TCP proxy. It submits N requests at a steady rate while injecting
//! faults from a seeded schedule (SIGKILL and SIGSTOP of processors, Redis restarts graceful
//! and kill -9, `SCRIPT FLUSH`, cut and stalled connections, gateway errors and hangs), then
//! stops injecting, brings everything back, waits for quiescence and checks every accepted
//! generation has exactly one terminal record and nothing is stranded. It also runs forced
//! stale-owner races at the library level. With `--redis cluster` or `--redis sentinel` the
//! same checks run against a test-kit Redis Cluster or Sentinel set ([`deployed`]), whose
//! faults are fail-overs and slot migrations. Everything ends in a [`report::Report`] (JSON and a
//! table); the run passes only if every check holds.
//!
//! # Layout
//!
//! - [`schedule`]: the seeded fault plan.
//! - [`proxy`]: the TCP proxy that cuts and stalls connections.
//! - [`processes`]: `inferq run` children and the signals sent to them.
//! - [`inject`]: carries out one fault, and records which requests a killed or frozen
//!   processor held.
//! - [`workload`]: the steady-rate submitter and its ledger.
//! - [`observe`]: reading lists and key sizes back from Redis.
//! - [`history`]: the checker (pure): lost, duplicated, stranded, executions, redeliveries.
//! - [`races`]: the stale-owner races.
//! - [`harness`]: one whole run, start to verdict.
//! - [`deployed`]: the same run on a Redis Cluster or behind Sentinel (`--redis cluster`,
//!   `--redis sentinel`): topology faults instead of proxy and restart faults, submissions
//!   with a replica wait, two result lists.
//! - [`report`]: the JSON report and the summary table.

pub mod batch;
pub mod deployed;
pub mod front;
pub mod harness;
pub mod history;
pub mod inject;
pub mod observe;
pub mod processes;
pub mod proxy;
pub mod races;
pub mod report;
pub mod schedule;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

pub use harness::run;
pub use report::Report;

/// What can stop a chaos run from producing a verdict (a failed check is not an error: it is
/// in the report).
#[derive(Debug, thiserror::Error)]
pub enum ChaosError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("queue: {0}")]
    Queue(#[from] inferq::queue::QueueError),
    #[error("cannot start redis-server: {0}")]
    Testkit(#[from] inferq_testkit::TestkitError),
    #[error("simulator: {0}")]
    Sim(#[from] inferq_sim::SimError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Process(String),
}

/// A preset size of run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// About a minute of faults; the whole run well under three minutes (CI).
    Short,
    /// About fifteen minutes of faults and 15,000 requests.
    Long,
}

/// How Redis is deployed for a run (`--redis`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ChaosRedis {
    /// One `redis-server` behind breakable proxies: process, Redis and network faults.
    Standalone,
    /// A Redis Cluster of 3 masters with a replica each: masters killed and failed over,
    /// manual `CLUSTER FAILOVER`s and the queue's slot migrated mid-load.
    Cluster,
    /// A primary, its replica and three sentinels: the primary killed and failed over, and
    /// `SENTINEL FAILOVER`s.
    Sentinel,
}

impl ChaosRedis {
    /// The `--redis` value.
    pub fn flag(self) -> &'static str {
        match self {
            ChaosRedis::Standalone => "standalone",
            ChaosRedis::Cluster => "cluster",
            ChaosRedis::Sentinel => "sentinel",
        }
    }
}

/// How the workload reaches the processors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ChaosTransport {
    /// Submitted into the queue's sorted set (`inferq submit`'s way).
    RedisSortedset,
    /// Published on the queue's channel (Go's redis-pubsub producer); the processors admit it.
    RedisPubsub,
}

impl ChaosTransport {
    /// The transport the processors run.
    pub fn kind(self) -> inferq::config::TransportKind {
        match self {
            ChaosTransport::RedisSortedset => inferq::config::TransportKind::SortedSet,
            ChaosTransport::RedisPubsub => inferq::config::TransportKind::PubSub,
        }
    }

    /// The `--transport` value of `inferq run`.
    pub fn flag(self) -> &'static str {
        self.kind().name()
    }
}

/// Everything a run needs to know.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ChaosSettings {
    pub profile: Profile,
    pub seed: u64,
    pub redis: ChaosRedis,
    pub transport: ChaosTransport,
    /// The inferq executable the processors are started from.
    #[serde(skip)]
    pub exe: PathBuf,
    /// Where Redis keeps its AOF and the processors their logs.
    #[serde(skip)]
    pub dir: PathBuf,
    pub requests: u64,
    /// Requests per second.
    pub rate: f64,
    pub processors: usize,
    pub concurrency: u32,
    #[serde(with = "millis")]
    pub lease: Duration,
    #[serde(with = "millis")]
    pub reclaim_interval: Duration,
    /// Per-attempt gateway timeout of the processors (ends hangs).
    #[serde(with = "millis")]
    pub request_timeout: Duration,
    /// Each request's deadline from its submission.
    #[serde(with = "millis")]
    pub deadline: Duration,
    /// How long faults are injected.
    #[serde(with = "millis")]
    pub fault_window: Duration,
    /// Quiet time between faults (range).
    #[serde(with = "millis_pair")]
    pub fault_gap: (Duration, Duration),
    /// The longest wait for quiescence after the last fault.
    #[serde(with = "millis")]
    pub quiesce_limit: Duration,
    /// Stale-owner races (0: none).
    pub races: u64,
    /// Simulated inference: output tokens per request and decode time per token.
    pub max_tokens: u64,
    pub per_token_ms: f64,
    pub ttft_ms: u64,
}

impl ChaosSettings {
    /// The settings of a profile on a standalone Redis.
    pub fn profile(profile: Profile, seed: u64, exe: PathBuf, dir: PathBuf) -> ChaosSettings {
        Self::deployed(profile, ChaosRedis::Standalone, seed, exe, dir)
    }

    /// The settings of a profile on `redis`. A cluster or Sentinel run is shorter (600
    /// requests in about 30 s of faults for `short`): each fail-over takes seconds, and the
    /// stale-owner races (a library-level check of one server) are left to the standalone run.
    pub fn deployed(
        profile: Profile,
        redis: ChaosRedis,
        seed: u64,
        exe: PathBuf,
        dir: PathBuf,
    ) -> ChaosSettings {
        let short = ChaosSettings {
            profile,
            seed,
            redis,
            transport: ChaosTransport::RedisSortedset,
            exe,
            dir,
            requests: 1000,
            rate: 20.0,
            processors: 3,
            concurrency: 16,
            lease: Duration::from_secs(2),
            reclaim_interval: Duration::from_millis(500),
            request_timeout: Duration::from_secs(3),
            deadline: Duration::from_secs(60),
            fault_window: Duration::from_secs(50),
            fault_gap: (Duration::from_millis(800), Duration::from_millis(2500)),
            quiesce_limit: Duration::from_secs(75),
            races: 1000,
            // About 1.1 s of simulated inference: ~20 requests in flight, so a kill or a
            // freeze catches several.
            max_tokens: 16,
            per_token_ms: 60.0,
            ttft_ms: 150,
        };
        let short = match redis {
            ChaosRedis::Standalone => short,
            ChaosRedis::Cluster | ChaosRedis::Sentinel => ChaosSettings {
                requests: 600,
                fault_window: Duration::from_secs(30),
                races: 0,
                ..short
            },
        };
        match profile {
            Profile::Short => short,
            Profile::Long => ChaosSettings {
                requests: 15_000,
                rate: 16.0,
                deadline: Duration::from_secs(120),
                fault_window: Duration::from_secs(15 * 60),
                fault_gap: (Duration::from_millis(800), Duration::from_millis(4000)),
                quiesce_limit: Duration::from_secs(150),
                ..short
            },
        }
    }
}

pub(crate) mod millis {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

mod millis_pair {
    use std::time::Duration;

    pub(crate) fn serialize<S: serde::Serializer>(
        d: &(Duration, Duration),
        s: S,
    ) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeTuple;
        let ms = |d: &Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let mut t = s.serialize_tuple(2)?;
        t.serialize_element(&ms(&d.0))?;
        t.serialize_element(&ms(&d.1))?;
        t.end()
    }
}
