//! A chaos run on a Redis Cluster or behind Sentinel (`inferq-dev chaos --redis cluster|sentinel`):
//! the test kit's [`RedisCluster`] (3 masters, a replica each) or [`SentinelSet`] (primary,
//! replica, 3 sentinels), the simulator, and three `inferq run` children with `mode: "cluster"`
//! or `mode: "sentinel"` and `replica_wait: 1`, reaching Redis directly (no proxies: the faults
//! here are the topology's own).
//!
//! Two producers, both waiting for a replica, take turns at the batches: one names the result
//! list in the queue's slot (`{chaos:requests}:results`, the one-script finish), the other a
//! list in another slot (`chaos:results`, the staged three-step finish of
//! `crates/inferq/src/queue/cross_slot.rs`). The plan ([`super::schedule`]) kills and freezes processors and
//! kills masters, fails over and migrates the queue's slot (cluster), or kills the primary and
//! forces fail-overs (Sentinel); [`Topo`] carries those out with the fixtures' own calls. Then
//! everything is brought back, the run waits for quiescence, reads both lists and every queue
//! key back, and checks the history as the standalone run does ([`super::history`]).
//!
//! In: [`ChaosSettings`] whose `redis` is not standalone. Out: the [`Report`]. The fixtures'
//! calls block (they poll the topology), so they run in `block_in_place` while the workload runs
//! on a task of its own; this needs tokio's multi-threaded runtime.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::harness::{ms, quiesce};
use super::history::{self, History};
use super::inject::FaultRecord;
use super::observe::{key_sizes, lrange};
use super::processes::{Processor, ProcessorSpec};
use super::report::Report;
use super::schedule::{Fault, SlotOf};
use super::workload::{Fate, Ledger, Workload};
use super::{ChaosError, ChaosRedis, ChaosSettings};
use inferq::config::hash_slot;
use inferq_client::keys::QueueKeys;
use inferq_client::producer::Producer;
use inferq_client::target::{Link, Target};
use inferq_client::ReplicaWait;
use inferq_sim::Sim;
use inferq_testkit::{RedisCluster, SentinelSet, TestkitError};

const QUEUE: &str = "chaos:requests";
/// The result list in the queue's slot: the finish is one script.
pub const BESIDE: &str = "{chaos:requests}:results";
/// The result list in another slot: the finish is staged, delivered once, unstaged.
pub const APART: &str = "chaos:results";
/// Both result lists.
const LISTS: [&str; 2] = [BESIDE, APART];
const MASTER_NAME: &str = "inferq-chaos";
/// How long a killed master's or primary's replica may take to be promoted.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);
/// The replica wait of the producers and the processors.
const REPLICA_WAIT: ReplicaWait = ReplicaWait {
    replicas: 1,
    timeout: Duration::from_secs(1),
};

/// The Redis deployment of a run and the node a fault left down, if any.
enum Topo {
    Cluster {
        cluster: Box<RedisCluster>,
        /// A master killed whose restart has not happened yet (a fault failed half-way).
        down: Option<u16>,
    },
    Sentinel {
        set: Box<SentinelSet>,
        down: Option<u16>,
        /// When the last fail-over ended: the sentinels start no new one for twice their
        /// failover timeout after it ([`SENTINEL_REST`]).
        failed_over: Option<Instant>,
    },
}

/// How long a Sentinel fault waits after the last fail-over: the sentinels refuse another for
/// twice their failover timeout (5 s in the test kit), and a `SENTINEL FAILOVER` sent sooner
/// is accepted but never carried out.
const SENTINEL_REST: Duration = Duration::from_secs(11);

fn process(what: &str) -> impl Fn(String) -> ChaosError + '_ {
    move |e| ChaosError::Process(format!("{what}: {e}"))
}

impl Topo {
    /// Starts the deployment `redis` names (blocks until it is stable).
    fn start(redis: ChaosRedis) -> Result<Topo, ChaosError> {
        tokio::task::block_in_place(|| match redis {
            ChaosRedis::Cluster => Ok(Topo::Cluster {
                cluster: Box::new(RedisCluster::start()?),
                down: None,
            }),
            ChaosRedis::Sentinel => Ok(Topo::Sentinel {
                set: Box::new(SentinelSet::start(MASTER_NAME)?),
                down: None,
                failed_over: None,
            }),
            ChaosRedis::Standalone => Err(ChaosError::Process(
                "a standalone run is not a deployed one".to_owned(),
            )),
        })
    }

    fn is_cluster(&self) -> bool {
        matches!(self, Topo::Cluster { .. })
    }

    /// The client target of producers and the checker.
    fn target(&self) -> Result<Target, ChaosError> {
        let t = match self {
            Topo::Cluster { cluster, .. } => cluster.target(),
            Topo::Sentinel { set, .. } => set.target(),
        };
        t.map_err(|e| process("target")(e.to_string()))
    }

    /// The processors' `url` and the transport-config fields that name the deployment.
    fn processor_config(&self) -> (String, serde_json::Map<String, serde_json::Value>) {
        let (url, fields) = match self {
            Topo::Cluster { cluster, .. } => (
                cluster.seed_urls()[0].clone(),
                serde_json::json!({"mode": "cluster", "addrs": cluster.addrs()[1..]}),
            ),
            Topo::Sentinel { set, .. } => (
                set.sentinel_urls()[0].clone(),
                serde_json::json!({
                    "mode": "sentinel",
                    "master_name": MASTER_NAME,
                    "addrs": set.sentinel_addrs()[1..],
                }),
            ),
        };
        let mut fields = match fields {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        fields.insert("replica_wait".into(), REPLICA_WAIT.replicas.into());
        (url, fields)
    }

    /// Carries out one topology fault (blocking).
    fn inject(&mut self, fault: &Fault) -> Result<(), String> {
        let e = |e: TestkitError| e.to_string();
        match (self, fault) {
            (Topo::Cluster { cluster, down }, Fault::KillMaster { of }) => {
                let port = cluster.master_for_key(key_of(*of)).map_err(e)?;
                cluster.kill_master(port).map_err(e)?;
                *down = Some(port);
                cluster.wait_for_failover(port, FAILOVER_LIMIT).map_err(e)?;
                cluster.restart_node(port).map_err(e)?;
                *down = None;
                Ok(())
            }
            (Topo::Cluster { cluster, .. }, Fault::ClusterFailover { of }) => {
                let master = cluster.master_for_key(key_of(*of)).map_err(e)?;
                let replicas = cluster.replicas_of(master).map_err(e)?;
                let replica = replicas
                    .first()
                    .ok_or_else(|| format!("the master on {master} has no replica"))?;
                cluster.manual_failover(replica.port).map_err(e)
            }
            (
                Topo::Sentinel {
                    set,
                    down,
                    failed_over,
                },
                Fault::KillPrimary | Fault::SentinelFailover,
            ) => {
                if let Some(at) = failed_over {
                    std::thread::sleep(SENTINEL_REST.saturating_sub(at.elapsed()));
                }
                let done = if *fault == Fault::KillPrimary {
                    set.kill_master().and_then(|old| {
                        *down = Some(old);
                        set.wait_for_new_master(old, FAILOVER_LIMIT)?;
                        set.restart_node(old)?;
                        *down = None;
                        Ok(())
                    })
                } else {
                    set.failover().map(|_| ())
                };
                *failed_over = Some(Instant::now());
                done.map_err(e)
            }
            (_, other) => Err(format!("not a fault of this deployment: {}", other.kind())),
        }
    }

    /// Moves the queue's slot to another master: `first_keys` keys, a pause of `halfway` with
    /// the slot half-way (clients meet `ASK`), then the rest.
    async fn migrate_queue_slot(
        &mut self,
        first_keys: usize,
        halfway: Duration,
    ) -> Result<(), String> {
        let Topo::Cluster { cluster, .. } = self else {
            return Err("a slot migration needs a cluster".to_owned());
        };
        let slot = hash_slot(QUEUE);
        let half = tokio::task::block_in_place(|| {
            let from = cluster.master_for_slot(slot)?;
            let to = cluster
                .masters()?
                .into_iter()
                .map(|m| m.port)
                .find(|&port| port != from)
                .ok_or_else(|| TestkitError::Topology("no other master".to_owned()))?;
            cluster.begin_slot_migration(slot, to, first_keys)
        })
        .map_err(|e| e.to_string())?;
        tokio::time::sleep(halfway).await;
        tokio::task::block_in_place(|| cluster.finish_slot_migration(half))
            .map_err(|e| e.to_string())
    }

    /// Brings back a node a failed fault left down and waits for a stable topology.
    fn restore(&mut self) -> Result<(), TestkitError> {
        match self {
            Topo::Cluster { cluster, down } => {
                if let Some(port) = down.take() {
                    cluster.restart_node(port)?;
                }
                cluster.wait_stable()
            }
            Topo::Sentinel { set, down, .. } => {
                if let Some(port) = down.take() {
                    set.restart_node(port)?;
                }
                set.wait_ready()
            }
        }
    }
}

/// The key whose slot a cluster fault aims at.
fn key_of(of: SlotOf) -> &'static str {
    match of {
        SlotOf::Queue => QUEUE,
        SlotOf::ResultList => APART,
    }
}

/// Everything a deployed run started.
struct Rig {
    topo: Topo,
    processors: Vec<Processor>,
    sim: Sim,
}

impl Rig {
    /// Carries out `fault`, the `index`-th of the run.
    async fn inject(&mut self, index: usize, fault: &Fault, run_started: Instant) -> FaultRecord {
        let began = Instant::now();
        let outcome = match fault {
            Fault::KillProcessor { index: p, down } => match self.processors.get_mut(*p) {
                Some(proc) => {
                    proc.kill();
                    tokio::time::sleep(*down).await;
                    proc.revive().map_err(|e| e.to_string())
                }
                None => Err(format!("no processor {p}")),
            },
            Fault::PauseProcessor { index: p, stopped } => match self.processors.get_mut(*p) {
                Some(proc) => match proc.pause() {
                    Ok(()) => {
                        tokio::time::sleep(*stopped).await;
                        proc.resume().map_err(|e| e.to_string())
                    }
                    Err(e) => Err(e.to_string()),
                },
                None => Err(format!("no processor {p}")),
            },
            Fault::MigrateQueueSlot {
                first_keys,
                halfway,
            } => self.topo.migrate_queue_slot(*first_keys, *halfway).await,
            other => tokio::task::block_in_place(|| self.topo.inject(other)),
        };
        let record = FaultRecord::new(index, fault, (run_started, began), outcome, None);
        tracing::info!(
            fault = index,
            at_s = record.at_ms as f64 / 1000.0,
            took_s = record.took_ms as f64 / 1000.0,
            outcome = %record.outcome,
            "{}",
            record.label
        );
        record
    }

    /// After the last fault: every node up, the topology stable, every processor running.
    fn restore(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Err(e) = tokio::task::block_in_place(|| self.topo.restore()) {
            problems.push(format!("topology: {e}"));
        }
        for p in &mut self.processors {
            if let Err(e) = p.revive() {
                problems.push(format!("processor {}: {e}", p.index));
            }
        }
        problems
    }
}

/// Starts the simulator and the processors on `topo`.
async fn start_rig(settings: &ChaosSettings, topo: Topo) -> Result<Rig, ChaosError> {
    let sim = super::harness::start_sim(settings).await?;
    let (url, redis_fields) = topo.processor_config();
    let spec = ProcessorSpec {
        exe: settings.exe.clone(),
        transport: settings.transport,
        queue: QUEUE.to_owned(),
        result_list: APART.to_owned(),
        gateway: sim.base_url(),
        lease: settings.lease,
        reclaim_interval: settings.reclaim_interval,
        concurrency: settings.concurrency,
        request_timeout: settings.request_timeout,
        dir: settings.dir.clone(),
        redis_fields,
    };
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ChaosError::Process(format!("http client: {e}")))?;
    let mut processors = Vec::new();
    for i in 0..settings.processors {
        processors.push(Processor::start(i, &spec, &url)?);
    }
    for p in &mut processors {
        p.wait_ready(&http, Duration::from_secs(30)).await?;
    }
    Ok(Rig {
        topo,
        processors,
        sim,
    })
}

/// One producer per result list, each waiting for a replica.
async fn producers(target: &Target) -> Result<Vec<Producer>, ChaosError> {
    let mut out = Vec::new();
    for list in LISTS {
        let p = Producer::connect_target(target, QUEUE, list)
            .await
            .map_err(|e| process("producer")(e.to_string()))?;
        out.push(p.with_replica_wait(Some(REPLICA_WAIT)));
    }
    Ok(out)
}

/// Runs the whole chaos test on a cluster or behind Sentinel.
pub async fn run(settings: ChaosSettings) -> Result<Report, ChaosError> {
    let started = Instant::now();
    let topo = Topo::start(settings.redis)?;
    tracing::info!(redis = settings.redis.flag(), "redis deployment started");
    let target = topo.target()?;
    let keys = QueueKeys::for_layout(QUEUE, topo.is_cluster());
    let mut rig = start_rig(&settings, topo).await?;
    tracing::info!(processors = rig.processors.len(), "processors ready");
    let producers = producers(&target).await?;
    let mut admin: Link = target
        .connect()
        .await
        .map_err(|e| process("admin connection")(e.to_string()))?;
    let driven = drive(&settings, &mut rig, producers).await?;
    let restore_problems = rig.restore();
    let quiet_from = Instant::now();
    let accepted: HashSet<String> = driven
        .ledger
        .ids
        .iter()
        .filter(|(_, (_, f))| *f == Fate::Accepted)
        .map(|(id, _)| id.clone())
        .collect();
    let quiesced = quiesce(&mut admin, &LISTS, &keys, &accepted, settings.quiesce_limit).await;
    let quiesced_after_ms = quiesced.then(|| ms(quiet_from.elapsed()));
    tracing::info!(?quiesced_after_ms, "quiescence");
    // A frozen owner's late writes would land now: give them time before reading.
    tokio::time::sleep(settings.lease * 2).await;
    let (history, results_by_list) = read_history(&mut admin, &keys, &rig, driven.ledger).await?;
    let findings = history::check(&history);
    let gateway = Some(rig.sim.stats());
    let summaries = super::harness::stop_all(&mut rig.processors).await;
    let mut report = Report {
        passed: false,
        failures: Vec::new(),
        seed: settings.seed,
        wall_ms: ms(started.elapsed()),
        submit_ms: ms(driven.submit_took),
        faults_ms: ms(driven.faults_took),
        quiesced_after_ms,
        restore_problems,
        history: findings,
        gateway,
        faults: driven.faults,
        faults_by_kind: Default::default(),
        results_by_list,
        processors: summaries,
        races: None,
        data_dir: settings.dir.display().to_string(),
        settings,
    };
    report.collect_failures();
    Ok(report)
}

/// What the workload and the fault plan left.
struct Driven {
    ledger: Ledger,
    faults: Vec<FaultRecord>,
    submit_took: Duration,
    faults_took: Duration,
}

/// Submits the workload on a task of its own while the seeded fault plan runs here; returns
/// once both are done.
async fn drive(
    settings: &ChaosSettings,
    rig: &mut Rig,
    producers: Vec<Producer>,
) -> Result<Driven, ChaosError> {
    let plan = super::harness::fault_plan(settings);
    let workload = Workload {
        tag: "chaos".to_owned(),
        requests: settings.requests,
        rate: settings.rate,
        deadline: settings.deadline,
        max_tokens: settings.max_tokens,
        short_deadline_every: 20,
        short_deadline: Duration::from_secs(3),
        cancel_every: 25,
        publish: false,
    };
    let t0 = Instant::now();
    let shared = Arc::new(Mutex::new(Ledger::default()));
    // Its own task: the fixtures' blocking calls below must not hold up the submissions.
    let submitting = {
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            workload.run(&producers, &shared).await;
            t0.elapsed()
        })
    };
    let mut faults = Vec::new();
    for (i, planned) in plan.iter().enumerate() {
        tokio::time::sleep(planned.gap).await;
        faults.push(rig.inject(i, &planned.fault, t0).await);
    }
    let faults_took = t0.elapsed();
    let submit_took = submitting
        .await
        .map_err(|e| process("workload")(e.to_string()))?;
    let ledger = shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    tracing::info!(
        accepted = ledger.accepted(),
        unreplicated = ledger.unreplicated(),
        uncertain = ledger.uncertain(),
        "workload submitted, faults over; restoring"
    );
    Ok(Driven {
        ledger,
        faults,
        submit_took,
        faults_took,
    })
}

/// Reads everything the checker needs back (nothing consumed): both result lists, the dead
/// list, every queue key's size; and how many results each list holds.
async fn read_history(
    admin: &mut Link,
    keys: &QueueKeys,
    rig: &Rig,
    ledger: Ledger,
) -> Result<(History, BTreeMap<String, u64>), ChaosError> {
    let mut results = Vec::new();
    let mut by_list = BTreeMap::new();
    for list in LISTS {
        let got = lrange(admin, list).await?;
        by_list.insert(list.to_owned(), got.len() as u64);
        results.extend(got);
    }
    let history = History {
        ledger,
        results,
        dead: lrange(admin, &keys.dead).await?,
        keys: key_sizes(admin, keys).await?,
        dead_key: keys.dead.clone(),
        claimed_key: keys.claimed.clone(),
        staged_key: keys.finishing.clone(),
        executions: rig.sim.execution_times(),
        orphans: Vec::new(),
    };
    Ok((history, by_list))
}
