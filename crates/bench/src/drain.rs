//! A drain: N requests pre-loaded into a fresh queue, then `inferq run` started against a
//! stand-in gateway (one processor, or a fleet of several sharing the workers), timed until all
//! N results are on the result list. In: the gateway, N and the number of processors; out: a
//! [`Drain`] with requests/s (from processor start, and first to last result), Redis
//! commands per request and redis-server CPU over the drain only (INFO commandstats delta taken after the pre-load,
//! the bench's own `LLEN` polls and `INFO` left out), the processors' CPU and peak RSS, the
//! requests they lost to one another's claims, and
//! the TCP connections the gateway accepted over the drain (read from the gateway before and
//! after).
//! Also measured on the way: the producer's commands per submit during the pre-load.

use std::time::Duration;

use serde::Serialize;

use super::load::{preload, settle_aof, wait_for_results};
use super::measure::{commandstats, delta, proc_usage, script_calls, spent, CommandCounts};
use super::procs::{connections_between, Gateway, GatewayKind, Processor};
use super::{BenchError, Ctx};
use inferq_client::producer::Producer;

/// Redis commands over a phase.
#[derive(Debug, Clone, Serialize)]
pub struct Commands {
    /// All calls, commands run inside Lua scripts included.
    pub total: u64,
    pub per_request: f64,
    /// Script invocations (EVAL/EVALSHA): each one top-level round trip.
    pub script_calls: u64,
    pub script_calls_per_request: f64,
    /// Calls per command name.
    pub by_command: CommandCounts,
}

impl Commands {
    pub fn over(counts: CommandCounts, requests: u64) -> Commands {
        let total: u64 = counts.values().sum();
        let scripts = script_calls(&counts);
        let per = |n: u64| n as f64 / requests.max(1) as f64;
        Commands {
            total,
            per_request: per(total),
            script_calls: scripts,
            script_calls_per_request: per(scripts),
            by_command: counts,
        }
    }
}

/// One drain's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Drain {
    pub gateway: GatewayKind,
    pub n: u64,
    /// Workers over every processor.
    pub concurrency: u32,
    /// Processors sharing the queue (each with `concurrency / processors` workers).
    pub processors: u32,
    /// Requests peeked and claimed for nothing, because another processor claimed them first,
    /// per request drained (`None` when a processor's `/metrics` did not answer).
    pub claims_lost_per_request: Option<f64>,
    /// From starting `inferq run` to the last result.
    pub seconds: f64,
    pub requests_per_s: f64,
    /// From the first result to the last.
    pub seconds_first_to_last: f64,
    pub requests_per_s_first_to_last: f64,
    /// `requests_per_s` over the gateway's ceiling measured in this run.
    pub ratio_to_gateway_ceiling: Option<f64>,
    pub commands: Commands,
    /// Producer commands during the pre-load, per submitted request.
    pub producer_commands_per_submit: f64,
    /// Over every processor.
    pub cpu_s: f64,
    pub cpu_s_per_1k: f64,
    /// The largest of the processors' peaks.
    pub peak_rss_mib: f64,
    /// redis-server's CPU seconds per 1k requests over the drain.
    pub redis_cpu_s_per_1k: Option<f64>,
    /// The gateway's CPU seconds per 1k requests over the drain.
    pub gateway_cpu_s_per_1k: Option<f64>,
    /// TCP connections the gateway accepted during the drain (the bench's own readings left
    /// out): about the concurrency when the processor keeps its connections alive, far more
    /// when it churns them. `None` when the gateway could not say.
    pub gateway_connections: Option<u64>,
}

impl Drain {
    /// CPU microseconds per request of the processor, redis-server and the gateway together:
    /// what one request costs the machine (`None` when a part could not be read).
    pub fn machine_cpu_us(&self) -> Option<f64> {
        Some(self.cpu_s_per_1k + self.redis_cpu_s_per_1k? + self.gateway_cpu_s_per_1k?)
            .map(|s_per_1k| s_per_1k * 1000.0)
    }
}

/// redis-server's CPU seconds so far.
fn redis_cpu(ctx: &Ctx) -> Option<f64> {
    ctx.redis_pid
        .and_then(|pid| proc_usage(pid).ok())
        .map(|u| u.cpu_s)
}

/// Runs one drain of `n` requests against `gateway` by `processors` processors that share the
/// run's workers, on `cpus` (a `taskset` list) or on every CPU.
pub(crate) async fn run(
    ctx: &mut Ctx,
    gateway: &Gateway,
    n: u64,
    cpus: Option<&str>,
    processors: u32,
) -> Result<Drain, BenchError> {
    ctx.flush().await?;
    let processors = processors.max(1);
    let tag = format!("drain-{}-{n}-{processors}", gateway.kind.name());
    let mut spec = ctx.spec(&gateway.base_url(), &tag);
    spec.cpus = cpus.map(str::to_owned);
    spec.concurrency = (spec.concurrency / processors).max(1);
    let producer = Producer::connect(&ctx.redis_url, &spec.queue, &spec.results).await?;

    let before_load = commandstats(&mut ctx.con).await?;
    preload(&producer, &tag, n).await?;
    let before = commandstats(&mut ctx.con).await?;
    let own_info = CommandCounts::from([("info".to_owned(), 1)]);
    let producer_counts = delta(&before_load, &before, &own_info);
    let settling = settle_aof(&mut ctx.con, Duration::from_secs(120)).await?;

    let connections_before = gateway.connections().await;
    let redis_before = redis_cpu(ctx);
    let gateway_before = gateway.cpu_s();
    let mut fleet = Vec::new();
    for _ in 0..processors {
        fleet.push(Processor::spawn(&spec, &ctx.dir)?.0);
    }
    let started = fleet.iter().map(|p| p.started).min();
    let limit = Duration::from_secs(120 + n / 200);
    let watched = wait_for_results(&mut ctx.con, &spec.results, n, limit, || {
        fleet.iter_mut().try_for_each(Processor::check_alive)
    })
    .await;
    let watched = match watched {
        Ok(w) => w,
        Err(e) => {
            let logs: Vec<String> = fleet.iter().map(Processor::log_tail).collect();
            return Err(BenchError::Phase(format!(
                "drain of {n} via {}: {e}\nprocessor log:\n{}",
                gateway.kind.name(),
                logs.join("\n---\n")
            )));
        }
    };
    let mut cpu_s = 0.0;
    let mut peak_rss_mib = 0.0f64;
    for p in &fleet {
        let usage = p.usage()?;
        cpu_s += usage.cpu_s;
        peak_rss_mib = peak_rss_mib.max(usage.peak_rss_mib);
    }
    let redis_cpu_s = spent(redis_before, redis_cpu(ctx));
    let gateway_cpu_s = spent(gateway_before, gateway.cpu_s());
    let connections = connections_between(connections_before, gateway.connections().await);
    let after = commandstats(&mut ctx.con).await?;
    let mut lost = Some(0u64);
    for p in &fleet {
        let of_one = p.claims_lost(&ctx.http).await;
        lost = lost.zip(of_one).map(|(a, b)| a + b);
    }
    for p in &mut fleet {
        p.kill9();
    }

    let own = CommandCounts::from([
        ("info".to_owned(), 1 + settling),
        ("llen".to_owned(), watched.polls),
    ]);
    let seconds = started
        .map_or(Duration::ZERO, |s| watched.last.duration_since(s))
        .as_secs_f64();
    let first_to_last = watched.last.duration_since(watched.first).as_secs_f64();
    let producer = Commands::over(producer_counts, n);
    Ok(Drain {
        gateway: gateway.kind,
        n,
        concurrency: spec.concurrency * processors,
        processors,
        claims_lost_per_request: lost.map(|l| l as f64 / n as f64),
        seconds,
        requests_per_s: n as f64 / seconds,
        seconds_first_to_last: first_to_last,
        requests_per_s_first_to_last: if first_to_last > 0.0 {
            n as f64 / first_to_last
        } else {
            0.0
        },
        ratio_to_gateway_ceiling: None,
        commands: Commands::over(delta(&before, &after, &own), n),
        producer_commands_per_submit: producer.per_request,
        cpu_s,
        cpu_s_per_1k: cpu_s * 1000.0 / n as f64,
        peak_rss_mib,
        redis_cpu_s_per_1k: redis_cpu_s.map(|s| s * 1000.0 / n as f64),
        gateway_cpu_s_per_1k: gateway_cpu_s.map(|s| s * 1000.0 / n as f64),
        gateway_connections: connections,
    })
}
