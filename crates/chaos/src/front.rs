//! The front-door profile: single requests over HTTP under kills. A real deployment (a
//! `redis-server` with AOF and fsync always, the simulator, two `inferq run` processors and two
//! `inferq batch-api` replicas) serves clients that each send requests one after another, every
//! request with its own `X-Request-Id` (the router's contract), in `X-AP-Mode: wait` or in
//! `enqueue` followed by long polls, while a seeded fault plan SIGKILLs replicas and processors
//! (each started again at once) and restarts Redis. A client whose call fails (its replica
//! died, Redis was away) retries with the same id through either replica until it has an answer:
//! a repeat of the id joins the request it names.
//!
//! The checker then asks, for every id: was it answered (none lost), was every answer of the id
//! the same one (one request per id, whatever the retries), and does its mailbox hold that
//! answer (read back through both replicas, the same each time).
//!
//! Data enters as [`FrontChaosSettings`]; the [`FrontReport`] leaves.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::batch::{BatchDeployment, Fallible, Odds, Struck};

/// The faults: replicas killed 50 %, processors 45 %, Redis restarted once.
const ODDS: Odds = Odds {
    replica: 50,
    processor: 95,
    restarts: 1,
};

/// What a front-door chaos run does.
#[derive(Debug, Clone)]
pub struct FrontChaosSettings {
    /// Clients sending at once.
    pub clients: usize,
    /// Requests each client sends, one after another.
    pub per_client: usize,
    /// How long faults are injected.
    pub faults_for: Duration,
    pub seed: u64,
    pub dir: std::path::PathBuf,
    /// The `inferq` binary.
    pub exe: std::path::PathBuf,
}

/// What a run found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct FrontReport {
    pub seed: u64,
    /// Keys sent (one request each).
    pub keys: usize,
    /// Keys answered 200 (wait) or read `completed` (enqueue).
    pub answered: usize,
    /// Keys never answered: lost.
    pub lost: Vec<String>,
    /// Keys answered with more than one answer (the retries made new requests).
    pub split: Vec<String>,
    /// Keys whose request read back otherwise than its answer (another result, or none).
    pub mismatched: Vec<String>,
    /// Calls that failed and were retried with their key.
    pub retries: u64,
    /// Gateway runs beyond one per request (at-least-once execution after kills).
    pub re_executed: u64,
    #[serde(flatten)]
    pub struck: Struck,
    pub seconds: f64,
    pub passed: bool,
}

/// What one key's client saw.
#[derive(Debug, Default, Clone)]
struct Seen {
    /// The answer bodies' `id`s (the gateway's): one when every retry joined its request.
    answers: BTreeSet<String>,
    /// The answer body's `id` (the gateway's), when answered.
    answer: Option<String>,
}

async fn json_of(r: reqwest::Response) -> Option<Value> {
    serde_json::from_slice(&r.bytes().await.ok()?).ok()
}

fn chat(key: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": key}], "max_tokens": 4})
}

/// One key, sent until answered (or `give_up` passes): wait mode, or enqueue then long polls.
async fn one_key(
    client: &reqwest::Client,
    bases: &[String],
    key: &str,
    enqueue: bool,
    give_up: Instant,
    retries: &std::sync::atomic::AtomicU64,
) -> Seen {
    let mut seen = Seen::default();
    let mut turn = key.len();
    let mut enqueued = false;
    while Instant::now() < give_up {
        turn += 1;
        let base = &bases[turn % bases.len()];
        if enqueued {
            // Long-poll: 200 is the answer, 202 still pending; 410 (its replica died before
            // queueing it) or a failure: enqueue it again with its id.
            let r = client
                .get(format!("{base}/requests/{key}?wait=10"))
                .send()
                .await;
            match r {
                Ok(r) if r.status().as_u16() == 200 => {
                    if let Some(v) = json_of(r).await {
                        if let Some(id) = v["id"].as_str() {
                            seen.answers.insert(id.to_owned());
                            seen.answer = Some(id.to_owned());
                            return seen;
                        }
                    }
                }
                Ok(r) if r.status().as_u16() == 202 => continue,
                Ok(r) if r.status().as_u16() == 410 => enqueued = false,
                _ => {}
            }
            retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        let req = client
            .post(format!("{base}/chat/completions"))
            .header("X-Request-Id", key)
            .header("X-AP-Mode", if enqueue { "enqueue" } else { "wait" })
            .header("X-Request-Timeout-Seconds", "150")
            .header("content-type", "application/json")
            .body(chat(key).to_string());
        match req.send().await {
            Ok(r) if r.status().as_u16() == 200 && !enqueue => {
                if let Some(v) = json_of(r).await {
                    if let Some(id) = v["id"].as_str() {
                        seen.answers.insert(id.to_owned());
                        seen.answer = Some(id.to_owned());
                        return seen;
                    }
                }
            }
            Ok(r) if r.status().as_u16() == 202 && enqueue => {
                enqueued = true;
                continue;
            }
            _ => {}
        }
        retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// Runs the front-door profile.
pub async fn run(s: &FrontChaosSettings) -> Fallible<FrontReport> {
    let started = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(s.seed);
    let mut d = BatchDeployment::start(
        s.exe.clone(),
        s.dir.clone(),
        150,
        inferq_testkit::Fsync::Always,
    )
    .await?;
    d.processor_flags = vec!["--concurrency".into(), "16".into()];
    // Answers are kept an hour after their first delivery, so the checker reads each back.
    let broker = s.dir.join("broker.yaml");
    std::fs::write(
        &broker,
        "default_queue: batch-q\nfetch_grace_seconds: 3600\n",
    )?;
    d.replica_flags
        .extend(["--broker-config".to_owned(), broker.display().to_string()]);
    for _ in 0..2 {
        d.add_processor()?;
    }
    for _ in 0..2 {
        d.add_replica().await?;
    }
    let bases: Vec<String> = (0..d.replicas.len()).map(|i| d.base(i)).collect();
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(200))
        .build()?;
    let retries = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let seen: Arc<Mutex<BTreeMap<String, Seen>>> = Arc::new(Mutex::new(BTreeMap::new()));
    let give_up = Instant::now() + s.faults_for + Duration::from_secs(180);
    let mut clients = tokio::task::JoinSet::new();
    for c in 0..s.clients {
        let (client, bases, retries, seen) =
            (client.clone(), bases.clone(), retries.clone(), seen.clone());
        let per_client = s.per_client;
        let seed = s.seed;
        clients.spawn(async move {
            for k in 0..per_client {
                let key = format!("s{seed}-c{c}-k{k}");
                let got = one_key(&client, &bases, &key, k % 3 == 2, give_up, &retries).await;
                if let Ok(mut all) = seen.lock() {
                    all.insert(key, got);
                }
            }
        });
    }
    let mut report = FrontReport {
        seed: s.seed,
        keys: s.clients * s.per_client,
        ..FrontReport::default()
    };
    let until = Instant::now() + s.faults_for;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(400..1200))).await;
        let half = until
            .checked_sub(s.faults_for / 2)
            .is_some_and(|h| Instant::now() >= h);
        d.strike(&mut rng, ODDS, half, &mut report.struck)?;
    }
    while clients.join_next().await.is_some() {}
    report.retries = retries.load(std::sync::atomic::Ordering::Relaxed);
    let all = seen.lock().map(|m| m.clone()).unwrap_or_default();
    check(&bases, &all, &d, &mut report).await?;
    report.seconds = started.elapsed().as_secs_f64();
    report.passed = report.answered == report.keys
        && report.lost.is_empty()
        && report.split.is_empty()
        && report.mismatched.is_empty();
    Ok(report)
}

/// Reads request `id`'s answer through the first replica that answers: the last fault may
/// have been a replica killed, and its successor may not listen yet.
async fn read_request(bases: &[String], id: &str) -> Fallible<(u16, Value)> {
    let mut last = None;
    for round in 0..20 {
        for base in bases {
            match reqwest::get(format!("{base}/requests/{id}")).await {
                Ok(r) => {
                    let status = r.status().as_u16();
                    return Ok((status, serde_json::from_slice(&r.bytes().await?)?));
                }
                Err(e) => last = Some(e),
            }
        }
        tokio::time::sleep(Duration::from_millis(100 * (round + 1))).await;
    }
    Err(last.map_or_else(|| "no replica to read from".into(), Into::into))
}

async fn check(
    bases: &[String],
    all: &BTreeMap<String, Seen>,
    d: &BatchDeployment,
    report: &mut FrontReport,
) -> Fallible {
    for (key, seen) in all {
        let Some(answer) = &seen.answer else {
            report.lost.push(key.clone());
            continue;
        };
        report.answered += 1;
        if seen.answers.len() != 1 {
            report.split.push(format!("{key}: {:?}", seen.answers));
            continue;
        }
        for base in bases {
            let (status, v) = read_request(std::slice::from_ref(base), key).await?;
            if status != 200 || v["id"].as_str() != Some(answer.as_str()) {
                report
                    .mismatched
                    .push(format!("{key}: answered {answer}, reads {status} {v}"));
                break;
            }
        }
    }
    let counts: BTreeMap<String, u64> = serde_json::from_slice(
        &reqwest::get(format!("{}/executions", d.sim.base_url()))
            .await?
            .bytes()
            .await?,
    )?;
    report.re_executed = counts.values().map(|n| n.saturating_sub(1)).sum();
    Ok(())
}
