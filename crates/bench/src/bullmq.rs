//! The BullMQ reference, run in the same run on the same Redis and the same node gateway when
//! node and BullMQ are installed (`scripts/bench.sh` installs BullMQ into
//! `~/.cache/inferq-bench/bullmq`). In: the folder holding `node_modules/bullmq`, N and the
//! concurrency; out: BullMQ's jobs/s from the JSON line the drain script prints, and what the
//! drain cost in CPU: the node process and redis-server (both read by the script over the drain
//! alone) and the gateway (read here from `/proc`; it is idle while the jobs are added), and
//! the TCP connections the gateway accepted over the run (asked of the gateway before and
//! after).

use std::path::{Path, PathBuf};

use serde::Serialize;

use super::procs::{connections_between, Gateway};
use super::{BenchError, Ctx};

/// The node gateway script, written into the run's folder.
pub(crate) const GATEWAY_JS: &str = include_str!("node/gateway.js");
/// The BullMQ drain script, written into the run's folder.
pub(crate) const BULLMQ_DRAIN_JS: &str = include_str!("node/bullmq_drain.js");

/// One BullMQ drain.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct BullmqDrain {
    pub n: u64,
    pub concurrency: u32,
    pub seconds: f64,
    pub jobs_per_s: f64,
    #[serde(default)]
    pub failed: u64,
    /// CPU seconds of the BullMQ node process over the drain.
    #[serde(default)]
    pub node_cpu_s: Option<f64>,
    /// redis-server's CPU seconds over the drain.
    #[serde(default)]
    pub redis_cpu_s: Option<f64>,
    /// The gateway's CPU seconds over the run.
    #[serde(default)]
    pub gateway_cpu_s: Option<f64>,
    /// TCP connections the gateway accepted over the run (the bench's own readings left out):
    /// about the concurrency when BullMQ's worker keeps its connections alive.
    #[serde(default)]
    pub gateway_connections: Option<u64>,
}

impl BullmqDrain {
    /// CPU microseconds per job of the BullMQ worker, redis-server and the gateway together.
    pub fn machine_cpu_us(&self) -> Option<f64> {
        let total = self.node_cpu_s? + self.redis_cpu_s? + self.gateway_cpu_s?;
        Some(total * 1e6 / self.n.max(1) as f64)
    }
}

/// Where BullMQ is: `given`, else `$BULLMQ_DIR`, else `~/.cache/inferq-bench/bullmq`; an error
/// saying why not when it is not there.
pub(crate) fn locate(given: Option<&Path>) -> Result<PathBuf, String> {
    let dir = given
        .map(Path::to_owned)
        .or_else(|| std::env::var_os("BULLMQ_DIR").map(PathBuf::from))
        .or_else(|| {
            std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".cache/inferq-bench/bullmq"))
        })
        .ok_or("no --bullmq-dir, $BULLMQ_DIR or $HOME")?;
    if dir.join("node_modules/bullmq/package.json").is_file() {
        Ok(dir)
    } else {
        Err(format!(
            "BullMQ not found in {} (scripts/bench.sh installs it with npm)",
            dir.display()
        ))
    }
}

/// Drains `n` jobs through BullMQ against `gateway` on the run's Redis, the node worker on
/// `cpus` (a `taskset` list) or on every CPU.
pub(crate) async fn run(
    ctx: &mut Ctx,
    bullmq_dir: &Path,
    script: &Path,
    gateway: &Gateway,
    n: u64,
    cpus: Option<&str>,
) -> Result<BullmqDrain, BenchError> {
    ctx.flush().await?;
    let connections_before = gateway.connections().await;
    let gateway_before = gateway.cpu_s();
    let out = tokio::process::Command::from(super::placement::command_on(cpus, "node"))
        .arg(script)
        .arg(ctx.redis_port.to_string())
        .arg(gateway.port.to_string())
        .arg(n.to_string())
        .arg(ctx.opts.concurrency.to_string())
        .env("BULLMQ_DIR", bullmq_dir)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| BenchError::setup("cannot run node", e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with('{'));
    match (out.status.success(), line) {
        (true, Some(line)) => {
            let mut drain: BullmqDrain = serde_json::from_str(line)
                .map_err(|e| BenchError::Phase(format!("BullMQ printed {line:?}: {e}")))?;
            drain.gateway_cpu_s = super::measure::spent(gateway_before, gateway.cpu_s());
            drain.gateway_connections =
                connections_between(connections_before, gateway.connections().await);
            Ok(drain)
        }
        _ => Err(BenchError::Phase(format!(
            "the BullMQ drain failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))),
    }
}
