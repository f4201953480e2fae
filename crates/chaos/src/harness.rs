//! One whole chaos run, start to verdict: start Redis, the simulator, the proxies and the
//! processors; submit the workload while the fault plan runs; restore everything; wait for
//! quiescence; read the whole history back and check it; stop the processors; run the
//! stale-owner races; return the [`Report`].
//!
//! [`run`] takes [`ChaosSettings`] (handing a cluster or Sentinel run to [`super::deployed`])
//! and returns the report (a failed check is in the report,
//! not an error). [`races_only`] runs just the races against a Redis of its own. Progress goes
//! to the log (`tracing`, standard error). Both need tokio's multi-threaded runtime: Redis is
//! stopped and started in `block_in_place`. Dropping a run stops everything it started.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;

use super::history::{self, History, Orphans};
use super::inject::{FaultRecord, Rig};
use super::observe::{key_sizes, lrange};
use super::processes::{Processor, ProcessorSpec};
use super::proxy::Proxy;
use super::report::{ProcessorSummary, Report};
use super::schedule::{self, PlanShape};
use super::workload::{admitted, Ledger, Workload};
use super::{races, ChaosError, ChaosRedis, ChaosSettings, ChaosTransport};
use inferq_client::connect;
use inferq_client::keys::QueueKeys;
use inferq_client::producer::Producer;
use inferq_client::wire::ResultMessage;
use inferq_sim::{Sim, SimConfig};
use inferq_testkit::{Fsync, RedisServer};

const QUEUE: &str = "chaos:requests";
const RESULTS: &str = "chaos:results";
/// How often published requests are settled during a run (their markers outlive this by far).
const SETTLE_EVERY: Duration = Duration::from_secs(5);

pub(super) fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Runs the whole chaos test.
pub async fn run(settings: ChaosSettings) -> Result<Report, ChaosError> {
    if settings.redis != ChaosRedis::Standalone {
        return super::deployed::run(settings).await;
    }
    let started = Instant::now();
    let redis_dir = settings.dir.join("redis");
    let redis = tokio::task::block_in_place(|| RedisServer::start_in(&redis_dir, Fsync::Always))?;
    tracing::info!(
        port = redis.port(),
        "redis-server started (AOF, appendfsync always)"
    );
    let sim = start_sim(&settings).await?;
    let upstream = ([127, 0, 0, 1], redis.port()).into();
    let mut proxies = Vec::new();
    for _ in 0..settings.processors {
        proxies.push(Proxy::start(upstream).await?);
    }
    let spec = ProcessorSpec {
        exe: settings.exe.clone(),
        transport: settings.transport,
        queue: QUEUE.to_owned(),
        result_list: RESULTS.to_owned(),
        gateway: sim.base_url(),
        lease: settings.lease,
        reclaim_interval: settings.reclaim_interval,
        concurrency: settings.concurrency,
        request_timeout: settings.request_timeout,
        dir: settings.dir.clone(),
        redis_fields: serde_json::Map::new(),
    };
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
        .map_err(|e| ChaosError::Process(format!("http client: {e}")))?;
    let mut processors = Vec::new();
    for (i, proxy) in proxies.iter().enumerate() {
        processors.push(Processor::start(i, &spec, &proxy.redis_url())?);
    }
    for p in &mut processors {
        p.wait_ready(&http, Duration::from_secs(30)).await?;
    }
    tracing::info!(processors = processors.len(), "processors ready");

    let client = redis::Client::open(redis.url())?;
    let admin = connect::manager(&client).await?;
    let producer = Producer::connect(&redis.url(), QUEUE, RESULTS)
        .await
        .map_err(|e| ChaosError::Process(format!("producer: {e}")))?;
    let mut rig = Rig {
        redis,
        proxies,
        processors,
        sim,
        admin,
        keys: QueueKeys::new(QUEUE),
        lease: settings.lease,
    };

    let plan = fault_plan(&settings);
    let publish = settings.transport == ChaosTransport::RedisPubsub;
    let workload = Workload {
        tag: "chaos".to_owned(),
        requests: settings.requests,
        rate: settings.rate,
        deadline: settings.deadline,
        max_tokens: settings.max_tokens,
        short_deadline_every: 20,
        short_deadline: Duration::from_secs(3),
        // Pub/sub requests have no cancellation markers (Go's producer writes none).
        cancel_every: if publish { 0 } else { 25 },
        publish,
    };

    let t0 = Instant::now();
    let shared = Arc::new(Mutex::new(Ledger::default()));
    // Published requests are settled as they are admitted, while their markers live.
    let settling =
        publish.then(|| tokio::spawn(settle_while_running(Arc::clone(&shared), rig.admin.clone())));
    let submitting = async {
        workload.run(std::slice::from_ref(&producer), &shared).await;
        t0.elapsed()
    };
    let injecting = async {
        let mut log: Vec<FaultRecord> = Vec::new();
        let mut orphans: Vec<Orphans> = Vec::new();
        for (i, planned) in plan.iter().enumerate() {
            tokio::time::sleep(planned.gap).await;
            let (record, o) = rig.inject(i, &planned.fault, t0).await;
            log.push(record);
            orphans.extend(o);
        }
        (log, orphans, t0.elapsed())
    };
    let (submit_took, (faults, orphans, faults_took)) = tokio::join!(submitting, injecting);
    if let Some(task) = settling {
        task.abort();
    }
    let mut ledger = shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    tracing::info!(
        accepted = ledger.accepted(),
        uncertain = ledger.uncertain(),
        "workload submitted, faults over; restoring"
    );

    let restore_problems = rig.restore().await;
    if publish {
        // Messages an instance received while cut off from Redis are admitted once it is back.
        tokio::time::sleep(rig.lease * 2).await;
        settle_published(&mut ledger, &mut rig.admin).await?;
        tracing::info!(
            admitted = ledger.accepted(),
            not_admitted = ledger.uncertain(),
            "published requests settled by their admit markers"
        );
    }
    let quiet_from = Instant::now();
    let accepted: HashSet<String> = ledger
        .ids
        .iter()
        .filter(|(_, (_, f))| *f == super::workload::Fate::Accepted)
        .map(|(id, _)| id.clone())
        .collect();
    let quiesced = quiesce(
        &mut rig.admin,
        &[RESULTS],
        &rig.keys,
        &accepted,
        settings.quiesce_limit,
    )
    .await;
    let quiesced_after_ms = quiesced.then(|| ms(quiet_from.elapsed()));
    tracing::info!(?quiesced_after_ms, "quiescence");
    // A frozen owner's late writes would land now: give them time before reading.
    tokio::time::sleep(settings.lease * 2).await;

    let history = History {
        ledger,
        results: lrange(&mut rig.admin, RESULTS).await?,
        dead: lrange(&mut rig.admin, &rig.keys.dead).await?,
        keys: key_sizes(&mut rig.admin, &rig.keys).await?,
        dead_key: rig.keys.dead.clone(),
        claimed_key: rig.keys.claimed.clone(),
        staged_key: rig.keys.finishing.clone(),
        executions: rig.sim.execution_times(),
        orphans,
    };
    let findings = history::check(&history);
    let gateway = Some(rig.sim.stats());

    let summaries = stop_all(&mut rig.processors).await;

    let races = if settings.races > 0 {
        tracing::info!(count = settings.races, "stale-owner races");
        Some(
            races::run(
                &rig.redis.url(),
                "chaos:races",
                settings.races,
                settings.seed,
            )
            .await?,
        )
    } else {
        None
    };

    let mut report = Report {
        passed: false,
        failures: Vec::new(),
        seed: settings.seed,
        wall_ms: ms(started.elapsed()),
        submit_ms: ms(submit_took),
        faults_ms: ms(faults_took),
        quiesced_after_ms,
        restore_problems,
        history: findings,
        gateway,
        faults,
        faults_by_kind: Default::default(),
        results_by_list: Default::default(),
        processors: summaries,
        races,
        data_dir: settings.dir.display().to_string(),
        settings,
    };
    report.collect_failures();
    Ok(report)
}

/// Runs only the stale-owner races, against a Redis of its own.
pub async fn races_only(settings: ChaosSettings) -> Result<Report, ChaosError> {
    let started = Instant::now();
    let redis_dir = settings.dir.join("redis");
    let redis = tokio::task::block_in_place(|| RedisServer::start_in(&redis_dir, Fsync::Always))?;
    let races = races::run(&redis.url(), "chaos:races", settings.races, settings.seed).await?;
    let mut report = Report {
        passed: false,
        failures: Vec::new(),
        seed: settings.seed,
        wall_ms: ms(started.elapsed()),
        submit_ms: 0,
        faults_ms: 0,
        quiesced_after_ms: Some(0),
        restore_problems: Vec::new(),
        history: Default::default(),
        gateway: None,
        faults: Vec::new(),
        faults_by_kind: Default::default(),
        results_by_list: Default::default(),
        processors: Vec::new(),
        races: Some(races),
        data_dir: settings.dir.display().to_string(),
        settings,
    };
    report.collect_failures();
    Ok(report)
}

/// Every few seconds, marks accepted the published requests an instance has admitted since.
/// A round that fails (Redis down or cut off) changes nothing; the next one tries again. Runs
/// until aborted.
async fn settle_while_running(
    ledger: Arc<Mutex<Ledger>>,
    mut admin: redis::aio::ConnectionManager,
) {
    loop {
        tokio::time::sleep(SETTLE_EVERY).await;
        let unsettled = ledger
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .unsettled();
        let round = tokio::time::timeout(SETTLE_EVERY, admitted(&mut admin, &unsettled));
        if let Ok(Ok(ids)) = round.await {
            ledger
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .mark_admitted(&ids);
        }
    }
}

/// Settles the published requests by their admit markers. The admin connection may find
/// Redis's last restart only now (a broken pipe, after which it reconnects): each try settles
/// what the last one did not, for at most about 10 s.
async fn settle_published(
    ledger: &mut Ledger,
    admin: &mut redis::aio::ConnectionManager,
) -> Result<(), ChaosError> {
    let mut tries = 0;
    loop {
        match ledger.resolve_published(admin).await {
            Ok(()) => return Ok(()),
            Err(e) if tries < 20 => {
                tries += 1;
                tracing::info!(error = %e, "settling published requests: retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits until every accepted request has a result on one of `lists` and every queue key but
/// the dead list is empty, for at most `limit`; returns whether it got there.
pub(super) async fn quiesce<C: ConnectionLike>(
    con: &mut C,
    lists: &[&str],
    keys: &QueueKeys,
    accepted: &HashSet<String>,
    limit: Duration,
) -> bool {
    let started = Instant::now();
    let mut last_log = Instant::now();
    while started.elapsed() < limit {
        if let (Ok(results), Ok(sizes)) = (results_of(con, lists).await, key_sizes(con, keys).await)
        {
            let done: HashSet<String> = results
                .iter()
                .filter_map(|r| serde_json::from_slice::<ResultMessage>(r).ok())
                .map(|r| r.id)
                .collect();
            let missing = accepted.iter().filter(|id| !done.contains(*id)).count();
            let busy: u64 = sizes
                .iter()
                .filter(|(k, _)| **k != keys.dead)
                .map(|(_, n)| n)
                .sum();
            if missing == 0 && busy == 0 {
                return true;
            }
            if last_log.elapsed() > Duration::from_secs(5) {
                tracing::info!(missing, busy, "waiting for quiescence");
                last_log = Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    false
}

/// Every entry of every list in `lists`, one after another.
async fn results_of<C: ConnectionLike>(
    con: &mut C,
    lists: &[&str],
) -> Result<Vec<Vec<u8>>, redis::RedisError> {
    let mut out = Vec::new();
    for list in lists {
        out.extend(lrange(con, list).await?);
    }
    Ok(out)
}

/// The seeded fault plan of a run, logged as the workload starts (every profile's).
pub(super) fn fault_plan(settings: &ChaosSettings) -> Vec<schedule::Planned> {
    let plan = schedule::plan(
        settings.seed,
        &PlanShape {
            processors: settings.processors,
            lease: settings.lease,
            window: settings.fault_window,
            gap: settings.fault_gap,
            redis: settings.redis,
        },
    );
    tracing::info!(
        seed = settings.seed,
        faults = plan.len(),
        requests = settings.requests,
        "workload and faults start"
    );
    plan
}

/// The simulator gateway of a run, on a free port: the settings' pace, with some jitter.
pub(super) async fn start_sim(settings: &ChaosSettings) -> Result<Sim, ChaosError> {
    Ok(Sim::start(
        SimConfig {
            ttft_ms: settings.ttft_ms,
            per_token_ms: settings.per_token_ms,
            jitter: 0.3,
            ..SimConfig::default()
        },
        ([127, 0, 0, 1], 0).into(),
    )
    .await?)
}

/// Stops every processor of a run (20 s each to exit) and sums up how each lived.
pub(super) async fn stop_all(processors: &mut [Processor]) -> Vec<ProcessorSummary> {
    let mut summaries = Vec::with_capacity(processors.len());
    for p in processors {
        let final_stop = p.stop(Duration::from_secs(20)).await;
        summaries.push(ProcessorSummary {
            index: p.index,
            starts: p.starts,
            unexpected_exits: p.unexpected_exits.clone(),
            final_stop,
        });
    }
    summaries
}
