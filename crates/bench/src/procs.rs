//! The processes a benchmark run starts and measures: the stand-in gateways (`inferq-dev sim` and,
//! when node is present, the node gateway script) and `inferq run` processors, each a child of
//! this very binary so that its CPU time and peak memory are its own. Settings enter as
//! [`ProcessorSpec`]; what leaves is a running child with its ports, its `/proc` readings
//! ([`super::measure::ProcUsage`]) and a kill -9 or SIGTERM. Every child is killed on drop.
//! A gateway also says how many TCP connections it has accepted ([`Gateway::connections`]).

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::measure::{proc_usage, ProcUsage};
use super::BenchError;
use inferq_testkit::free_port;

/// How long a child may take to answer its health URL.
const READY_LIMIT: Duration = Duration::from_secs(30);

/// This binary (`inferq-dev`, which serves `sim`): `/proc/self/exe` on Linux (the very file
/// running, even if since rebuilt).
pub(crate) fn own_binary() -> Result<PathBuf, BenchError> {
    let proc_self = Path::new("/proc/self/exe");
    if proc_self.exists() {
        return Ok(proc_self.to_owned());
    }
    std::env::current_exe().map_err(|e| BenchError::setup("cannot find the inferq-dev binary", e))
}

/// The production binary `inferq` (for `run` and `submit`), built next to this one.
pub(crate) fn inferq_binary() -> Result<PathBuf, BenchError> {
    inferq_testkit::inferq_binary().map_err(|e| BenchError::Phase(e.to_string()))
}

/// A child process killed (SIGKILL) when dropped, with its output in a log file.
pub(crate) struct ChildProc {
    child: Child,
    log: PathBuf,
}

impl ChildProc {
    fn spawn(mut command: Command, log: PathBuf, what: &str) -> Result<ChildProc, BenchError> {
        let out = File::create(&log)
            .map_err(|e| BenchError::setup(format!("cannot create {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| BenchError::setup("cannot duplicate a log handle", e))?;
        command.stdin(Stdio::null()).stdout(out).stderr(err);
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group: a Ctrl-C at the terminal reaches only the bench.
            command.process_group(0);
        }
        let child = command
            .spawn()
            .map_err(|e| BenchError::setup(format!("cannot start {what}"), e))?;
        Ok(ChildProc { child, log })
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// CPU seconds and peak RSS so far, from `/proc/PID`.
    pub(crate) fn usage(&self) -> Result<ProcUsage, BenchError> {
        proc_usage(self.pid())
    }

    /// SIGKILL, and reap.
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines of the child's log, for error messages.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// Polls `url` until it answers 2xx; fails when the child exits first.
    async fn wait_ready(&mut self, http: &reqwest::Client, url: &str) -> Result<(), BenchError> {
        let started = Instant::now();
        while started.elapsed() < READY_LIMIT {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BenchError::Phase(format!(
                    "{} exited before it was ready ({status}):\n{}",
                    self.log.display(),
                    self.log_tail()
                )));
            }
            if let Ok(resp) = http.get(url).send().await {
                if resp.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(BenchError::Phase(format!(
            "{url} did not answer within {} s:\n{}",
            READY_LIMIT.as_secs(),
            self.log_tail()
        )))
    }
}

impl Drop for ChildProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Which stand-in gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GatewayKind {
    /// `inferq-dev sim --ttft-ms 0 --per-token-ms 0` (or slower, for the redelivery phase).
    Sim,
    /// The node gateway script, the one BullMQ is measured against.
    Node,
}

impl GatewayKind {
    pub fn name(self) -> &'static str {
        match self {
            GatewayKind::Sim => "sim",
            GatewayKind::Node => "node",
        }
    }
}

/// A running stand-in gateway.
pub struct Gateway {
    pub kind: GatewayKind,
    pub port: u16,
    /// Held so the gateway is killed with this value.
    proc: ChildProc,
    /// Keeps no idle connection, so that each reading of [`Gateway::connections`] opens
    /// exactly one connection of its own.
    counter: reqwest::Client,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

/// A client that opens a fresh connection for every request and keeps none.
fn one_shot_client() -> Result<reqwest::Client, BenchError> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()?)
}

/// The TCP connections a gateway accepted between two readings of [`Gateway::connections`],
/// the second reading's own connection left out (the first one's is in `before`); `None` when
/// either reading failed.
pub(crate) fn connections_between(before: Option<u64>, after: Option<u64>) -> Option<u64> {
    after?.checked_sub(before?)?.checked_sub(1)
}

impl Gateway {
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The gateway's CPU seconds so far (`None` if `/proc` cannot say).
    pub fn cpu_s(&self) -> Option<f64> {
        super::measure::proc_usage(self.proc.pid())
            .ok()
            .map(|u| u.cpu_s)
    }

    /// The TCP connections the gateway has accepted so far, this reading's own included (it
    /// opens one of its own: see [`connections_between`]): the node gateway's
    /// `GET /connections`, the simulator's `connections_accepted` in `GET /stats`. `None` when
    /// the gateway does not answer or the answer does not parse.
    pub async fn connections(&self) -> Option<u64> {
        let path = match self.kind {
            GatewayKind::Node => "connections",
            GatewayKind::Sim => "stats",
        };
        let read = async {
            let resp = self
                .counter
                .get(format!("{}/{path}", self.base_url()))
                .send()
                .await
                .ok()?
                .error_for_status()
                .ok()?;
            let body = resp.bytes().await.ok()?;
            match self.kind {
                GatewayKind::Node => std::str::from_utf8(&body).ok()?.trim().parse().ok(),
                GatewayKind::Sim => serde_json::from_slice::<serde_json::Value>(&body).ok()?
                    ["connections_accepted"]
                    .as_u64(),
            }
        };
        let count = read.await;
        if count.is_none() {
            super::say(format!(
                "the {} gateway's /{path} did not say how many connections it accepted",
                self.kind.name()
            ));
        }
        count
    }

    /// `inferq-dev sim` answering after `ttft_ms` (0: at once).
    pub async fn sim(
        http: &reqwest::Client,
        dir: &Path,
        ttft_ms: u64,
    ) -> Result<Gateway, BenchError> {
        let port = free_port().map_err(|e| BenchError::setup("no free port", e))?;
        let mut command = Command::new(own_binary()?);
        command
            .arg("sim")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--ttft-ms", &ttft_ms.to_string(), "--per-token-ms", "0"]);
        let log = dir.join(format!("sim-{port}.log"));
        let mut proc = ChildProc::spawn(command, log, "the simulator (inferq-dev sim)")?;
        proc.wait_ready(http, &format!("http://127.0.0.1:{port}/healthz"))
            .await?;
        Ok(Gateway {
            kind: GatewayKind::Sim,
            port,
            proc,
            counter: one_shot_client()?,
        })
    }

    /// `node gateway.js PORT` from `script`.
    pub async fn node(
        http: &reqwest::Client,
        dir: &Path,
        script: &Path,
    ) -> Result<Gateway, BenchError> {
        let port = free_port().map_err(|e| BenchError::setup("no free port", e))?;
        let mut command = Command::new("node");
        command.arg(script).arg(port.to_string());
        let log = dir.join(format!("node-gateway-{port}.log"));
        let mut proc = ChildProc::spawn(command, log, "the node gateway")?;
        proc.wait_ready(http, &format!("http://127.0.0.1:{port}/count"))
            .await?;
        Ok(Gateway {
            kind: GatewayKind::Node,
            port,
            proc,
            counter: one_shot_client()?,
        })
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The simulator's `/arrivals` of ids starting with `prefix` (Unix microseconds).
    pub async fn arrivals(
        &self,
        http: &reqwest::Client,
        prefix: &str,
    ) -> Result<HashMap<String, Vec<u64>>, BenchError> {
        let url = format!("{}/arrivals", self.base_url());
        let resp = http
            .get(url)
            .query(&[("prefix", prefix)])
            .send()
            .await?
            .error_for_status()?;
        let body = resp.bytes().await?;
        serde_json::from_slice(&body).map_err(|e| {
            BenchError::Phase(format!("the simulator's /arrivals does not parse: {e}"))
        })
    }
}

/// How to configure one `inferq run`.
#[derive(Debug, Clone)]
pub struct ProcessorSpec {
    pub redis_url: String,
    pub gateway_url: String,
    pub queue: String,
    pub results: String,
    pub concurrency: u32,
    pub poll_interval_ms: u64,
    pub batch_size: u32,
    /// `claim_lease_ttl_seconds` and `claim_reclaim_interval_ms`, when set.
    pub lease_s: Option<u64>,
    pub reclaim_interval_ms: Option<u64>,
    /// Extra `inferq run` arguments given to the bench.
    pub extra_args: Vec<String>,
    /// The CPUs it runs on (a `taskset` list; see [`super::placement`]), or all of them.
    pub cpus: Option<String>,
    /// The whole transport config, when a phase writes its own (the cluster drains: several
    /// queues, `mode` and `addrs`); the fields above then give only the concurrency, the CPUs
    /// and the extra arguments.
    pub transport_json: Option<serde_json::Value>,
}

impl ProcessorSpec {
    /// The transport-config JSON.
    pub fn transport(&self) -> serde_json::Value {
        if let Some(t) = &self.transport_json {
            return t.clone();
        }
        let mut t = serde_json::json!({
            "url": self.redis_url,
            "poll_interval_ms": self.poll_interval_ms,
            "batch_size": self.batch_size,
            "result_queue_name": self.results,
            "queues": [{
                "queue_name": self.queue,
                "igw_base_url": self.gateway_url,
                "request_path_url": "/v1/chat/completions",
            }],
        });
        if let Some(lease) = self.lease_s {
            t["claim_lease_ttl_seconds"] = lease.into();
        }
        if let Some(ms) = self.reclaim_interval_ms {
            t["claim_reclaim_interval_ms"] = ms.into();
        }
        t
    }
}

/// A running `inferq run`.
pub(crate) struct Processor {
    pub started: Instant,
    proc: ChildProc,
    metrics: u16,
}

impl Processor {
    /// Starts `inferq run` with `spec`; returns once it is spawned (not yet ready).
    pub(crate) fn spawn(spec: &ProcessorSpec, dir: &Path) -> Result<(Processor, u16), BenchError> {
        let health = free_port().map_err(|e| BenchError::setup("no free port", e))?;
        let mut metrics = free_port().map_err(|e| BenchError::setup("no free port", e))?;
        while metrics == health {
            metrics = free_port().map_err(|e| BenchError::setup("no free port", e))?;
        }
        // `taskset` execs what it is given, so a pinned processor is started by its path.
        let program = inferq_binary()?;
        let mut command = super::placement::command_on(spec.cpus.as_deref(), program);
        command
            .arg("run")
            .args(["--transport", "redis-sortedset"])
            .arg("--transport-config")
            .arg(spec.transport().to_string())
            .args(["--health-port", &health.to_string()])
            .args(["--metrics-port", &metrics.to_string()])
            .arg("--metrics-endpoint-auth=false")
            .args(["--concurrency", &spec.concurrency.to_string()])
            .args(&spec.extra_args);
        let log = dir.join(format!("processor-{health}.log"));
        let started = Instant::now();
        let proc = ChildProc::spawn(command, log, "the processor (inferq run)")?;
        Ok((
            Processor {
                started,
                proc,
                metrics,
            },
            health,
        ))
    }

    /// Starts `inferq run` and waits for `/readyz`.
    pub(crate) async fn start(
        spec: &ProcessorSpec,
        dir: &Path,
        http: &reqwest::Client,
    ) -> Result<Processor, BenchError> {
        let (mut p, health) = Processor::spawn(spec, dir)?;
        p.proc
            .wait_ready(http, &format!("http://127.0.0.1:{health}/readyz"))
            .await?;
        Ok(p)
    }

    pub(crate) fn usage(&self) -> Result<ProcUsage, BenchError> {
        self.proc.usage()
    }

    /// Its `/metrics` page's address.
    pub(crate) fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.metrics)
    }

    /// Its `inferq_claims_lost_total` over every queue: requests another instance claimed
    /// between this one's peek and its claim (`None` when `/metrics` did not answer).
    pub(crate) async fn claims_lost(&self, http: &reqwest::Client) -> Option<u64> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics);
        let page = http.get(url).send().await.ok()?.text().await.ok()?;
        Some(
            page.lines()
                .filter(|l| l.starts_with("inferq_claims_lost_total{"))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .sum(),
        )
    }

    pub(crate) fn kill9(&mut self) {
        self.proc.kill9();
    }

    /// An error with the log's tail if the processor has exited.
    pub(crate) fn check_alive(&mut self) -> Result<(), BenchError> {
        match self.proc.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(BenchError::Phase(format!(
                "the processor exited ({status}):\n{}",
                self.proc.log_tail()
            ))),
            Err(e) => Err(BenchError::setup("cannot check the processor", e)),
        }
    }

    pub(crate) fn log_tail(&self) -> String {
        self.proc.log_tail()
    }
}
