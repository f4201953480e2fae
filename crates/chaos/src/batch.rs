//! The batch profile: the Batch API under kills. A real deployment (a `redis-server` with AOF
//! and fsync always, the simulator, `inferq run` processors and `inferq batch-api` replicas
//! sharing a files folder) runs several batches while a seeded fault plan SIGKILLs replicas and
//! processors (each started again at once) and restarts Redis. One batch is cancelled midway.
//! The checker then reads every batch's output and error files: each `custom_id` of each batch
//! must have exactly one line, and every batch must have ended (`completed`, or `cancelled` for
//! the cancelled one) — none stuck in `in_progress`, `finalizing` or `cancelling`.
//!
//! Data enters as [`BatchChaosSettings`]; the [`BatchReport`] leaves (counts of faults, lines
//! missing and doubled, batch statuses).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inferq_sim::{Sim, SimConfig};
use inferq_testkit::{free_port, RedisServer};
use rand::{Rng, SeedableRng};
use serde_json::Value;

/// The faults: replicas killed 45 %, processors 43 %, Redis restarted at most twice.
const ODDS: Odds = Odds {
    replica: 45,
    processor: 88,
    restarts: 2,
};

pub type Fallible<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// What a batch chaos run does.
#[derive(Debug, Clone)]
pub struct BatchChaosSettings {
    pub batches: usize,
    pub lines: usize,
    /// How long faults are injected.
    pub faults_for: Duration,
    pub seed: u64,
    pub dir: PathBuf,
    /// The `inferq` binary.
    pub exe: PathBuf,
}

/// What a run found.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BatchReport {
    pub seed: u64,
    pub batches: usize,
    pub lines: usize,
    #[serde(flatten)]
    pub struck: Struck,
    pub lines_missing: usize,
    pub lines_doubled: usize,
    pub statuses: BTreeMap<String, usize>,
    pub stuck: Vec<String>,
    pub seconds: f64,
    pub passed: bool,
}

/// The faults a run struck (flattened into its report's JSON).
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Struck {
    pub replica_kills: u32,
    pub processor_kills: u32,
    pub redis_restarts: u32,
}

/// How often each fault is struck: a roll in 0..100 below `replica` kills a replica, below
/// `processor` a processor, else restarts Redis (at most `restarts` times a run).
#[derive(Debug, Clone, Copy)]
pub struct Odds {
    pub replica: u32,
    pub processor: u32,
    pub restarts: u32,
}

/// A deployment of the Batch API from real parts.
#[derive(Debug)]
pub struct BatchDeployment {
    pub redis: RedisServer,
    pub sim: Sim,
    pub exe: PathBuf,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub processors: Vec<Child>,
    pub replicas: Vec<(Child, u16)>,
    pub processor_flags: Vec<String>,
    pub replica_flags: Vec<String>,
}

impl BatchDeployment {
    /// Redis (AOF with `fsync`), the simulator with `ttft_ms` latency and the config.
    pub async fn start(
        exe: PathBuf,
        dir: PathBuf,
        ttft_ms: u64,
        fsync: inferq_testkit::Fsync,
    ) -> Fallible<BatchDeployment> {
        std::fs::create_dir_all(&dir)?;
        let redis = RedisServer::start_in(&dir.join("redis"), fsync)?;
        let cfg = SimConfig {
            ttft_ms,
            ..SimConfig::default()
        };
        let sim = Sim::start(cfg, "127.0.0.1:0".parse::<SocketAddr>()?).await?;
        let config = dir.join("transport.json");
        let text = serde_json::json!({
            "url": redis.url(), "poll_interval_ms": 50, "batch_size": 100,
            "queues": [{"queue_name": "batch-q", "igw_base_url": sim.base_url()}],
        });
        std::fs::write(&config, text.to_string())?;
        Ok(BatchDeployment {
            redis,
            sim,
            exe,
            dir,
            config,
            processors: Vec::new(),
            replicas: Vec::new(),
            processor_flags: Vec::new(),
            replica_flags: Vec::new(),
        })
    }

    fn log(&self, name: &str) -> Fallible<std::fs::File> {
        Ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(name))?)
    }

    fn spawn_processor(&self, n: usize) -> Fallible<Child> {
        Ok(Command::new(&self.exe)
            .args([
                "run",
                "--transport",
                "redis-sortedset",
                "--transport-config-file",
            ])
            .arg(&self.config)
            .args([
                "--health-port",
                &free_port()?.to_string(),
                "--metrics-port",
                &free_port()?.to_string(),
            ])
            .args([
                "--metrics-endpoint-auth=false",
                "--claim-lease-ttl",
                "3s",
                "--claim-reclaim-interval",
                "1s",
            ])
            .args(&self.processor_flags)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("processor-{n}.log"))?)
            .spawn()?)
    }

    fn spawn_replica(&self, n: usize, port: u16) -> Fallible<Child> {
        Ok(Command::new(&self.exe)
            .args(["batch-api", "--transport-config-file"])
            .arg(&self.config)
            .args(["--listen", &format!("127.0.0.1:{port}"), "--files-dir"])
            .arg(self.dir.join("files"))
            .args(["--lease", "2s", "--cancel-grace", "3s"])
            .args(&self.replica_flags)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("replica-{n}.log"))?)
            .spawn()?)
    }

    pub fn add_processor(&mut self) -> Fallible {
        let child = self.spawn_processor(self.processors.len())?;
        self.processors.push(child);
        Ok(())
    }

    /// One more replica; its base URL once it answers.
    pub async fn add_replica(&mut self) -> Fallible<String> {
        let port = free_port()?;
        let child = self.spawn_replica(self.replicas.len(), port)?;
        self.replicas.push((child, port));
        wait_ready(port).await?;
        Ok(self.base(self.replicas.len() - 1))
    }

    pub fn base(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}/v1", self.replicas[i].1)
    }

    /// SIGKILLs replica `i` and starts it again on its port.
    pub fn kill_replica(&mut self, i: usize) -> Fallible {
        let _ = self.replicas[i].0.kill();
        let _ = self.replicas[i].0.wait();
        let port = self.replicas[i].1;
        self.replicas[i].0 = self.spawn_replica(i, port)?;
        Ok(())
    }

    /// Strikes one fault by `odds`; when `restart_due` and Redis was not restarted yet, the
    /// fault is a Redis restart (so one always falls in the second half of the faults).
    pub fn strike(
        &mut self,
        rng: &mut impl Rng,
        odds: Odds,
        restart_due: bool,
        struck: &mut Struck,
    ) -> Fallible {
        let roll = if restart_due && struck.redis_restarts == 0 {
            100
        } else {
            rng.random_range(0..100)
        };
        if roll < odds.replica {
            let i = rng.random_range(0..self.replicas.len());
            self.kill_replica(i)?;
            struck.replica_kills += 1;
        } else if roll < odds.processor {
            let i = rng.random_range(0..self.processors.len());
            self.kill_processor(i)?;
            struck.processor_kills += 1;
        } else if struck.redis_restarts < odds.restarts {
            self.redis.restart()?;
            struck.redis_restarts += 1;
        }
        Ok(())
    }

    /// SIGKILLs processor `i` and starts another in its place.
    pub fn kill_processor(&mut self, i: usize) -> Fallible {
        let _ = self.processors[i].kill();
        let _ = self.processors[i].wait();
        self.processors[i] = self.spawn_processor(i)?;
        Ok(())
    }
}

impl Drop for BatchDeployment {
    fn drop(&mut self) {
        for c in self
            .replicas
            .iter_mut()
            .map(|(c, _)| c)
            .chain(self.processors.iter_mut())
        {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn wait_ready(port: u16) -> Fallible {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(30) {
        if let Ok(r) = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await {
            if r.status().is_success() {
                return Ok(());
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(format!("batch-api on port {port} did not become ready").into())
}

/// `n` chat lines of batch `b`: custom ids `b<b>-<i>`.
pub fn batch_file(b: usize, n: usize, pad: usize) -> String {
    let filler = "x".repeat(pad);
    let mut text = String::with_capacity(n * (120 + pad));
    for i in 0..n {
        let line = serde_json::json!({
            "custom_id": format!("b{b}-{i}"), "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": format!("{i} {filler}")}]},
        });
        text.push_str(&line.to_string());
        text.push('\n');
    }
    text
}

async fn json_of(r: reqwest::Response) -> Fallible<Value> {
    let status = r.status();
    let v: Value = serde_json::from_slice(&r.bytes().await?)?;
    if !status.is_success() {
        return Err(format!("{status}: {v}").into());
    }
    Ok(v)
}

/// Uploads `text` and creates a batch of it; the batch's id.
pub async fn submit(base: &str, text: String, window: &str) -> Fallible<String> {
    let c = reqwest::Client::new();
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(text).file_name("in.jsonl"),
        );
    let file = json_of(
        c.post(format!("{base}/files"))
            .multipart(form)
            .send()
            .await?,
    )
    .await?;
    let body = serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": window});
    let batch = json_of(
        c.post(format!("{base}/batches"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await?,
    )
    .await?;
    Ok(batch["id"].as_str().unwrap_or_default().to_owned())
}

pub async fn retrieve(base: &str, id: &str) -> Fallible<Value> {
    json_of(reqwest::get(format!("{base}/batches/{id}")).await?).await
}

/// custom_id -> lines naming it, over a batch's output and error files.
pub async fn lines_per_id(base: &str, batch: &Value) -> Fallible<BTreeMap<String, usize>> {
    let mut seen = BTreeMap::new();
    for key in ["output_file_id", "error_file_id"] {
        if let Some(id) = batch[key].as_str() {
            let text = reqwest::get(format!("{base}/files/{id}/content"))
                .await?
                .text()
                .await?;
            for line in text.lines() {
                let v: Value = serde_json::from_str(line)?;
                *seen
                    .entry(v["custom_id"].as_str().unwrap_or_default().to_owned())
                    .or_insert(0) += 1;
            }
        }
    }
    Ok(seen)
}

fn ended(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "expired" | "cancelled")
}

/// Runs the batch profile.
pub async fn run(s: &BatchChaosSettings) -> Fallible<BatchReport> {
    let started = Instant::now();
    let mut rng = rand::rngs::StdRng::seed_from_u64(s.seed);
    let mut d = BatchDeployment::start(
        s.exe.clone(),
        s.dir.clone(),
        15,
        inferq_testkit::Fsync::Always,
    )
    .await?;
    d.processor_flags = vec!["--concurrency".into(), "16".into()];
    for _ in 0..2 {
        d.add_processor()?;
    }
    for _ in 0..3 {
        d.add_replica().await?;
    }
    let mut report = BatchReport {
        seed: s.seed,
        batches: s.batches,
        lines: s.lines * s.batches,
        ..BatchReport::default()
    };
    let mut ids = Vec::new();
    let mut next_batch = 0;
    let mut cancelled: Option<String> = None;
    let until = Instant::now() + s.faults_for;
    while Instant::now() < until || next_batch < s.batches {
        if next_batch < s.batches {
            let base = d.base(rng.random_range(0..d.replicas.len()));
            match submit(&base, batch_file(next_batch, s.lines, 64), "24h").await {
                Ok(id) => {
                    ids.push(id);
                    next_batch += 1;
                }
                Err(e) => {
                    tracing::info!(error = %e, "a submission failed (a replica was down): trying again")
                }
            }
        }
        if cancelled.is_none() && ids.len() >= 2 {
            let base = d.base(rng.random_range(0..d.replicas.len()));
            let r = reqwest::Client::new()
                .post(format!("{base}/batches/{}/cancel", ids[1]))
                .send()
                .await;
            if r.is_ok_and(|r| r.status().is_success()) {
                cancelled = Some(ids[1].clone());
            }
        }
        if Instant::now() >= until {
            continue;
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(300..900))).await;
        // One Redis restart always falls in the second half of the faults.
        let half = until
            .checked_sub(s.faults_for / 2)
            .is_some_and(|h| Instant::now() >= h);
        d.strike(&mut rng, ODDS, half, &mut report.struck)?;
    }
    check(&d, &ids, cancelled.as_deref(), s, &mut report).await?;
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn check(
    d: &BatchDeployment,
    ids: &[String],
    cancelled: Option<&str>,
    s: &BatchChaosSettings,
    report: &mut BatchReport,
) -> Fallible {
    for port in d.replicas.iter().map(|(_, p)| *p) {
        wait_ready(port).await?;
    }
    let base = d.base(0);
    let deadline = Instant::now() + Duration::from_secs(180);
    for (b, id) in ids.iter().enumerate() {
        let mut batch = retrieve(&base, id).await?;
        while !ended(batch["status"].as_str().unwrap_or_default()) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
            batch = retrieve(&base, id).await?;
        }
        let status = batch["status"].as_str().unwrap_or_default().to_owned();
        let want = if Some(id.as_str()) == cancelled {
            "cancelled"
        } else {
            "completed"
        };
        if status != want {
            report.stuck.push(format!("{id}: {status} (wanted {want})"));
        }
        *report.statuses.entry(status).or_insert(0) += 1;
        let seen = lines_per_id(&base, &batch).await?;
        let prefix = format!("b{b}-");
        report.lines_missing += (0..s.lines)
            .filter(|i| !seen.contains_key(&format!("{prefix}{i}")))
            .count();
        report.lines_doubled += seen
            .values()
            .filter(|c| **c > 1)
            .map(|c| c - 1)
            .sum::<usize>();
        report.lines_doubled += seen.keys().filter(|k| !k.starts_with(&prefix)).count();
    }
    report.passed =
        report.lines_missing == 0 && report.lines_doubled == 0 && report.stuck.is_empty();
    Ok(())
}
