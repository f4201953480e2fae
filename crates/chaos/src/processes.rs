//! The processes a chaos run starts and breaks: `inferq run` children of this executable, and
//! the signals sent to them (SIGKILL, SIGSTOP/SIGCONT, SIGTERM). Redis itself is a
//! [`inferq_testkit::RedisServer`], which already kills and restarts on the same port and
//! data directory.
//!
//! A [`ProcessorSpec`] (what every processor is started with) goes in; a [`Processor`] handle
//! comes out, which knows whether its process is running, stopped or gone, restarts it with
//! the same ports, and SIGKILLs it when dropped. Each processor's output is appended to its own
//! log file, across restarts.

use std::fs::OpenOptions;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::ChaosError;
use inferq_testkit::free_port;

/// Sends `signal` (a name such as `STOP`) to `pid` with `kill(1)`, as the rest of inferq's
/// tooling does.
pub fn send_signal(pid: u32, signal: &str) -> Result<(), ChaosError> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| ChaosError::Process(format!("kill -{signal} {pid}: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(ChaosError::Process(format!(
            "kill -{signal} {pid} failed: {status}"
        )))
    }
}

/// How every processor of a run is started.
#[derive(Debug, Clone)]
pub struct ProcessorSpec {
    /// The inferq executable (`inferq run` is started from it).
    pub exe: PathBuf,
    /// `--transport`.
    pub transport: super::ChaosTransport,
    pub queue: String,
    pub result_list: String,
    pub gateway: String,
    pub lease: Duration,
    pub reclaim_interval: Duration,
    pub concurrency: u32,
    /// Per-attempt gateway timeout: ends simulated hangs.
    pub request_timeout: Duration,
    /// Where the logs go.
    pub dir: PathBuf,
    /// More transport-config fields: the deployment (`mode`, `addrs`, `master_name`) and
    /// `replica_wait` on a cluster or behind Sentinel; empty on a standalone Redis.
    pub redis_fields: serde_json::Map<String, serde_json::Value>,
}

/// What state a processor's process is in, as far as the harness knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Life {
    Running,
    /// SIGSTOPped: frozen, holding its claims, its leases running out.
    Stopped,
    /// Killed or exited; restart it.
    Gone,
}

/// One `inferq run` child, reachable through its own proxy URL.
#[derive(Debug)]
pub struct Processor {
    pub index: usize,
    spec: ProcessorSpec,
    redis_url: String,
    health_port: u16,
    metrics_port: u16,
    child: Option<Child>,
    life: Life,
    /// Exit statuses of earlier incarnations that exited on their own (not killed by us).
    pub unexpected_exits: Vec<String>,
    pub starts: u32,
}

impl Processor {
    /// Starts processor `index`, talking to Redis at `redis_url`.
    pub fn start(index: usize, spec: &ProcessorSpec, redis_url: &str) -> Result<Self, ChaosError> {
        let port = || free_port().map_err(|e| ChaosError::Process(format!("no free port: {e}")));
        let health_port = port()?;
        let mut metrics_port = port()?;
        while metrics_port == health_port {
            metrics_port = port()?;
        }
        let mut p = Processor {
            index,
            spec: spec.clone(),
            redis_url: redis_url.to_owned(),
            health_port,
            metrics_port,
            child: None,
            life: Life::Gone,
            unexpected_exits: Vec::new(),
            starts: 0,
        };
        p.spawn()?;
        Ok(p)
    }

    fn spawn(&mut self) -> Result<(), ChaosError> {
        let s = &self.spec;
        let mut transport = serde_json::json!({
            "url": self.redis_url,
            "poll_interval_ms": 50,
            "batch_size": 16,
            "claim_lease_ttl_seconds": s.lease.as_secs_f64(),
            "claim_reclaim_interval_ms": s.reclaim_interval.as_millis() as u64,
            "result_queue_name": s.result_list,
            "queues": [{"queue_name": s.queue, "igw_base_url": s.gateway}],
        });
        if let Some(fields) = transport.as_object_mut() {
            fields.extend(s.redis_fields.clone());
        }
        let log = s.dir.join(format!("processor-{}.log", self.index));
        let open = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| ChaosError::Process(format!("cannot open {}: {e}", log.display())))
        };
        let mut command = Command::new(&s.exe);
        command
            .arg("run")
            .args(["--transport", s.transport.flag()])
            .arg("--transport-config")
            .arg(transport.to_string())
            .args(["--health-port", &self.health_port.to_string()])
            .args(["--metrics-port", &self.metrics_port.to_string()])
            .arg("--metrics-endpoint-auth=false")
            .args(["--concurrency", &s.concurrency.to_string()])
            .arg("--request-timeout")
            .arg(format!("{}ms", s.request_timeout.as_millis()))
            .args(["--drain-timeout", "5s"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(open()?)
            .stderr(open()?);
        #[cfg(unix)]
        {
            // Its own process group: a Ctrl-C at the terminal reaches only the harness.
            use std::os::unix::process::CommandExt;
            command.process_group(0);
        }
        let child = command
            .spawn()
            .map_err(|e| ChaosError::Process(format!("cannot start inferq run: {e}")))?;
        self.child = Some(child);
        self.life = Life::Running;
        self.starts += 1;
        Ok(())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The state, noticing a process that exited by itself.
    pub fn life(&mut self) -> Life {
        if let Some(child) = self.child.as_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                self.unexpected_exits.push(status.to_string());
                self.child = None;
                self.life = Life::Gone;
            }
        }
        self.life
    }

    /// SIGKILL: no drain, no release; its claims wait out their leases.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        self.life = Life::Gone;
    }

    /// SIGSTOP: the process freezes with its claims.
    pub fn pause(&mut self) -> Result<(), ChaosError> {
        if self.life() != Life::Running {
            return Ok(());
        }
        if let Some(pid) = self.pid() {
            send_signal(pid, "STOP")?;
            self.life = Life::Stopped;
        }
        Ok(())
    }

    /// SIGCONT: a frozen process carries on as if nothing happened.
    pub fn resume(&mut self) -> Result<(), ChaosError> {
        if self.life != Life::Stopped {
            return Ok(());
        }
        if let Some(pid) = self.pid() {
            send_signal(pid, "CONT")?;
        }
        self.life = Life::Running;
        Ok(())
    }

    /// Starts it again (same ports and proxy) if it is gone; resumes it if stopped.
    pub fn revive(&mut self) -> Result<(), ChaosError> {
        match self.life() {
            Life::Running => Ok(()),
            Life::Stopped => self.resume(),
            Life::Gone => self.spawn(),
        }
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self, http: &reqwest::Client) -> bool {
        let url = format!("http://127.0.0.1:{}/readyz", self.health_port);
        matches!(http.get(&url).send().await, Ok(r) if r.status().is_success())
    }

    /// Waits up to `limit` for `/readyz`.
    pub async fn wait_ready(
        &mut self,
        http: &reqwest::Client,
        limit: Duration,
    ) -> Result<(), ChaosError> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.life() == Life::Gone {
                return Err(ChaosError::Process(format!(
                    "processor {} exited before it was ready; see {}",
                    self.index,
                    self.log_path().display()
                )));
            }
            if self.ready(http).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(ChaosError::Process(format!(
            "processor {} not ready within {limit:?}; see {}",
            self.index,
            self.log_path().display()
        )))
    }

    pub fn log_path(&self) -> PathBuf {
        self.spec.dir.join(format!("processor-{}.log", self.index))
    }

    /// SIGTERM (after SIGCONT if stopped) and waits up to `limit` for the graceful drain;
    /// SIGKILL after that. Returns how it ended.
    pub async fn stop(&mut self, limit: Duration) -> String {
        let _ = self.resume();
        let Some(pid) = self.pid() else {
            return "not running".to_owned();
        };
        if self.life() == Life::Gone {
            return "exited before the stop".to_owned();
        }
        let _ = send_signal(pid, "TERM");
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    self.life = Life::Gone;
                    return describe(status);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.kill();
        format!("still running {limit:?} after SIGTERM; killed")
    }
}

fn describe(status: ExitStatus) -> String {
    if status.success() {
        "exit 0 after SIGTERM".to_owned()
    } else {
        format!("{status} after SIGTERM")
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        self.kill();
    }
}
