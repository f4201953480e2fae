//! `inferq-dev bench`: the benchmark of issue 5, in one run on one machine. It starts its own
//! `redis-server` (AOF, `appendfsync everysec`), the stand-in gateways (`inferq-dev sim` with no
//! latency and, when node is installed, a node gateway), and `inferq run` processors as child
//! processes, and measures: each gateway's own ceiling; drains of N requests at a fixed
//! concurrency (requests/s, Redis commands per request, processor CPU and peak RSS, connections
//! the gateway accepted); BullMQ's drain on the same Redis and node gateway when BullMQ is
//! installed; the node drains of both again with the gateway on CPUs of its own (the split
//! placement, see `placement`); one drain through the simulator by fleets of 1, 4 and 8
//! processors sharing the workers (what instances racing for one queue cost); open-loop
//! submission at fixed rates (enqueue→dispatch and submit→result latency); redelivery after a
//! kill -9; a cluster section (queues spread over the masters of a 3-master Redis Cluster
//! against the standalone Redis, with the capacity projection and the cost of a replica wait:
//! see `cluster`).
//!
//! In: [`BenchOptions`]. Out: a [`report::Report`] printed as a table with targets and
//! pass/miss, written as `bench.json`, and plotted as `bench.png` in the output folder.
//!
//! # Layout
//!
//! - `procs`: the child processes (gateways, processors) and their `/proc` readings.
//! - `measure`: INFO commandstats, CPU and peak RSS, the machine.
//! - `load`: requests, pre-loading, watching results.
//! - `ceiling`: the gateway's own ceiling (an in-process HTTP load generator).
//! - `census`: top-level commands vs commands inside scripts, from MONITOR.
//! - `drain`, `open_loop`, `redelivery`, `bullmq`: the phases.
//! - `cluster`: the cluster section (its drains, MONITOR census, replica wait and table).
//! - `placement`: the split placement (the gateway on CPUs of its own) of the second drains.
//! - [`slack`]: `inferq-dev bench-slack`, the fill-the-slack benchmark (its own run).
//! - `stats`: latency percentiles. `report`: targets, table, JSON. `plot`: the PNG.

mod bullmq;
mod ceiling;
mod census;
pub mod cluster;
mod drain;
mod load;
mod measure;
mod open_loop;
mod placement;
mod plot;
mod procs;
mod redelivery;
pub mod report;
pub mod slack;
mod stats;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use cluster::report::ClusterSection;
use inferq_testkit::{Fsync, RedisServer};
use procs::{Gateway, GatewayKind, ProcessorSpec};
use report::{BullmqSection, Ceilings, FleetSection, Report, Settings, SplitSection};

/// How long a Redis reply of the bench's own connection may take.
const FLUSH_LIMIT: Duration = Duration::from_secs(120);

/// What can stop a benchmark run.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("{what}: {source}")]
    Setup {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot start redis-server: {0}")]
    RedisServer(#[from] inferq_testkit::TestkitError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("producer: {0}")]
    Producer(#[from] inferq_client::producer::ProducerError),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("{0}")]
    Phase(String),
    #[error("cannot draw the plot: {0}")]
    Plot(String),
    #[error("{phase}: {source}")]
    During {
        phase: String,
        #[source]
        source: Box<BenchError>,
    },
}

impl BenchError {
    /// This error, saying which phase it stopped.
    fn during(self, phase: impl Into<String>) -> BenchError {
        BenchError::During {
            phase: phase.into(),
            source: Box::new(self),
        }
    }

    fn setup(what: impl Into<String>, source: std::io::Error) -> BenchError {
        BenchError::Setup {
            what: what.into(),
            source,
        }
    }
}

/// Everything a run is told.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// "quick" or "full", for the report.
    pub profile: String,
    /// The command line, for the report.
    pub command: String,
    pub out: PathBuf,
    pub drains: Vec<u64>,
    pub rates: Vec<u64>,
    pub concurrency: u32,
    pub open_loop: Duration,
    pub ceiling: Duration,
    pub poll_interval_ms: u64,
    pub batch_size: u32,
    pub lease_s: u64,
    pub reclaim_interval_ms: u64,
    pub redelivery_requests: u64,
    /// Skip node (its gateway and BullMQ) even when installed.
    pub no_node: bool,
    /// Processors per fleet drain (none: no fleet drains), and the requests of each.
    pub fleet: Vec<u32>,
    pub fleet_n: u64,
    pub bullmq_dir: Option<PathBuf>,
    /// Requests of each cluster-section drain; 0 skips the section.
    pub cluster_n: u64,
    /// Extra arguments for every `inferq run`.
    pub run_args: Vec<String>,
}

/// What the phases share: Redis, a scratch folder, an HTTP client and the options.
#[derive(Debug)]
pub struct Ctx {
    pub redis_url: String,
    /// redis-server's pid, for its CPU time.
    pub redis_pid: Option<u32>,
    pub redis_port: u16,
    pub con: MultiplexedConnection,
    pub dir: PathBuf,
    pub http: reqwest::Client,
    pub opts: BenchOptions,
}

impl Ctx {
    /// Empties Redis (FLUSHALL) so a phase starts from fresh state.
    pub async fn flush(&mut self) -> Result<(), BenchError> {
        let () = redis::cmd("FLUSHALL").query_async(&mut self.con).await?;
        Ok(())
    }

    /// A processor on queue `TAG:q` and result list `TAG:r` in front of `gateway_url`.
    pub fn spec(&self, gateway_url: &str, tag: &str) -> ProcessorSpec {
        ProcessorSpec {
            redis_url: self.redis_url.clone(),
            gateway_url: gateway_url.to_owned(),
            queue: format!("{tag}:q"),
            results: format!("{tag}:r"),
            concurrency: self.opts.concurrency,
            poll_interval_ms: self.opts.poll_interval_ms,
            batch_size: self.opts.batch_size,
            lease_s: None,
            reclaim_interval_ms: None,
            extra_args: self.opts.run_args.clone(),
            cpus: None,
            transport_json: None,
        }
    }
}

/// Prints a progress line to standard error.
fn say(line: impl AsRef<str>) {
    eprintln!("inferq-dev bench: {}", line.as_ref());
}

/// Runs every phase, prints the table and writes `bench.json` and `bench.png` into `opts.out`.
pub async fn run(opts: BenchOptions) -> Result<Report, BenchError> {
    let began = Instant::now();
    let machine = measure::Machine::read();
    let (scratch, redis, mut ctx) = start(&opts).await?;
    let dir = scratch.path().to_owned();

    let mut gateways = vec![Gateway::sim(&ctx.http, &dir, 0).await?];
    let node_js = dir.join("gateway.js");
    let node_ready = !opts.no_node && machine.node.is_some();
    let no_node = if opts.no_node {
        "--no-node given"
    } else {
        "node not found"
    };
    if node_ready {
        std::fs::write(&node_js, bullmq::GATEWAY_JS)
            .map_err(|e| BenchError::setup("cannot write gateway.js", e))?;
        // The node gateway comes first: it is the one BullMQ is measured against.
        gateways.insert(0, Gateway::node(&ctx.http, &dir, &node_js).await?);
    } else {
        say(format!(
            "{no_node}: the node gateway and BullMQ are skipped"
        ));
    }

    let mut ceilings = Vec::new();
    for g in &gateways {
        let c = ceiling::measure(g.port, opts.concurrency, opts.ceiling)
            .await
            .map_err(|e| e.during(format!("{} gateway ceiling", g.kind.name())))?;
        say(format!(
            "gateway {} ceiling: {:.0} req/s ({} answered, {} failed, concurrency {})",
            g.kind.name(),
            c.requests_per_s,
            c.answered,
            c.failed,
            c.concurrency
        ));
        ceilings.push(Ceilings {
            gateway: g.kind,
            ceiling: c,
        });
    }

    let mut drains = Vec::new();
    for g in &gateways {
        for &n in &opts.drains {
            let mut d = drain::run(&mut ctx, g, n, None, 1)
                .await
                .map_err(|e| e.during(format!("drain {n} via {}", g.kind.name())))?;
            d.ratio_to_gateway_ceiling = ceilings
                .iter()
                .find(|c| c.gateway == g.kind)
                .map(|c| d.requests_per_s / c.ceiling.requests_per_s);
            say(format!(
                "drain {n} via {}: {:.0} req/s in {:.2} s, {:.2} Redis calls/request ({:.3} scripts), {:.3} CPU s/1k, peak RSS {:.1} MiB",
                g.kind.name(),
                d.requests_per_s,
                d.seconds,
                d.commands.per_request,
                d.commands.script_calls_per_request,
                d.cpu_s_per_1k,
                d.peak_rss_mib
            ));
            drains.push(d);
        }
    }

    let census_n = opts.drains.iter().copied().min().unwrap_or(1000).min(5000);
    let census = census::run(&mut ctx, &gateways[gateways.len() - 1], census_n)
        .await
        .map_err(|e| e.during("command census"))?;
    say(format!(
        "command census ({census_n} requests under MONITOR): {:.2} top-level commands/request, {:.2} inside scripts",
        census.top_level_per_request, census.inside_scripts_per_request
    ));

    let node = gateways.iter().find(|g| g.kind == GatewayKind::Node);
    // BullMQ's folder and the drain script, when BullMQ can run here.
    let bull = match (node, node_ready) {
        (Some(_), true) => match bullmq::locate(opts.bullmq_dir.as_deref()) {
            Ok(bull_dir) => {
                let script = dir.join("bullmq_drain.js");
                std::fs::write(&script, bullmq::BULLMQ_DRAIN_JS)
                    .map_err(|e| BenchError::setup("cannot write bullmq_drain.js", e))?;
                Ok((bull_dir, script))
            }
            Err(reason) => {
                say(format!("BullMQ skipped: {reason}"));
                Err(reason)
            }
        },
        _ => Err(no_node.to_owned()),
    };
    let bullmq = match (node, &bull) {
        (Some(node), Ok((bull_dir, script))) => {
            let runs = bullmq_drains(&mut ctx, bull_dir, script, node, None).await?;
            BullmqSection::measured(runs, &drains)
        }
        (_, Err(reason)) => BullmqSection::skipped(reason.clone()),
        (None, Ok(_)) => BullmqSection::skipped("no node gateway".to_owned()),
    };

    let split = match node {
        Some(node) => split_drains(&mut ctx, node, bull.as_ref().ok()).await?,
        None => SplitSection::skipped(no_node.to_owned()),
    };
    let fleet = fleet_drains(&mut ctx, &gateways[gateways.len() - 1]).await?;
    let cluster = cluster_section(&mut ctx, &gateways[gateways.len() - 1]).await?;
    drop(gateways);

    let open_sim = Gateway::sim(&ctx.http, &dir, 0).await?;
    let mut open = Vec::new();
    for &rate in &opts.rates {
        let o = open_loop::run(&mut ctx, &open_sim, rate, opts.open_loop)
            .await
            .map_err(|e| e.during(format!("open loop at {rate}/s")))?;
        say(format!(
            "open loop {rate}/s: submitted {:.0}/s, {} of {} results; enqueue→dispatch p50 {:.2} ms p99 {:.2} ms; submit→result p50 {:.2} ms p99 {:.2} ms",
            o.achieved_submit_rps,
            o.completed,
            o.submitted,
            o.enqueue_to_dispatch.p50_ms,
            o.enqueue_to_dispatch.p99_ms,
            o.submit_to_result.p50_ms,
            o.submit_to_result.p99_ms
        ));
        open.push(o);
    }
    drop(open_sim);

    let redelivery = redelivery::run(&mut ctx, opts.redelivery_requests)
        .await
        .map_err(|e| e.during("redelivery"))?;
    say(format!(
        "redelivery after kill -9 ({} requests, lease {} s): p50 {:.2} s, max {:.2} s",
        redelivery.requests, redelivery.lease_s, redelivery.p50_s, redelivery.max_s
    ));
    drop(redis);

    let report = Report::new(
        machine,
        Settings::from_options(&opts),
        ceilings,
        drains,
        census,
        bullmq,
        split,
        fleet,
        cluster,
        open,
        redelivery,
        began.elapsed(),
    );
    report.print_table();
    report.write_json(&opts.out.join("bench.json"))?;
    match plot::draw(&report, &opts.out.join("bench.png")) {
        Ok(()) => {}
        Err(e) => say(format!("plot not drawn: {e}")),
    }
    say(format!(
        "wrote {} and {}",
        opts.out.join("bench.json").display(),
        opts.out.join("bench.png").display()
    ));
    Ok(report)
}

/// The output folder, a scratch folder, the bench's redis-server (AOF, everysec) and the
/// [`Ctx`] over them. The scratch folder and the server live as long as the values returned.
async fn start(opts: &BenchOptions) -> Result<(tempfile::TempDir, RedisServer, Ctx), BenchError> {
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| BenchError::setup(format!("cannot create {}", opts.out.display()), e))?;
    let scratch = tempfile::Builder::new()
        .prefix("inferq-bench-")
        .tempdir()
        .map_err(|e| BenchError::setup("cannot create a scratch folder", e))?;
    let dir = scratch.path().to_owned();
    let redis = {
        let redis_dir = dir.join("redis");
        tokio::task::spawn_blocking(move || RedisServer::start_in(&redis_dir, Fsync::EverySec))
            .await
            .map_err(|e| BenchError::Phase(format!("starting redis-server: {e}")))??
    };
    say(format!(
        "redis-server on port {} (AOF, appendfsync everysec); scratch {}",
        redis.port(),
        dir.display()
    ));
    let mut con = redis.client()?.get_multiplexed_async_connection().await?;
    // FLUSHALL after a large drain (BullMQ keeps every completed job) takes a while.
    con.set_response_timeout(FLUSH_LIMIT);
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()?;
    let ctx = Ctx {
        redis_url: redis.url(),
        redis_pid: redis.pid(),
        redis_port: redis.port(),
        con,
        dir,
        http,
        opts: opts.clone(),
    };
    Ok((scratch, redis, ctx))
}

/// Only the cluster section (`inferq-dev bench --cluster-only`): its table on standard output and
/// `cluster.json` in `opts.out`.
pub async fn run_cluster_only(opts: BenchOptions) -> Result<ClusterSection, BenchError> {
    let (_scratch, redis, mut ctx) = start(&opts).await?;
    let sim = Gateway::sim(&ctx.http, &ctx.dir.clone(), 0).await?;
    let section = cluster_section(&mut ctx, &sim).await?;
    drop(sim);
    drop(redis);
    println!();
    section.print();
    let path = opts.out.join("cluster.json");
    let text = serde_json::to_string_pretty(&section)
        .map_err(|e| BenchError::Phase(format!("cannot encode the cluster section: {e}")))?;
    std::fs::write(&path, text)
        .map_err(|e| BenchError::setup(format!("cannot write {}", path.display()), e))?;
    say(format!("wrote {}", path.display()));
    Ok(section)
}

/// The cluster section through `sim`, unless `--no-cluster` said not to.
async fn cluster_section(ctx: &mut Ctx, sim: &Gateway) -> Result<ClusterSection, BenchError> {
    if ctx.opts.cluster_n == 0 {
        return Ok(ClusterSection::skipped("--no-cluster given".to_owned()));
    }
    cluster::run(ctx, sim)
        .await
        .map_err(|e| e.during("cluster section"))
}

/// One drain of `fleet_n` requests through `sim` by each fleet size: the run's workers shared by
/// that many processors on one queue.
async fn fleet_drains(ctx: &mut Ctx, sim: &Gateway) -> Result<FleetSection, BenchError> {
    if ctx.opts.fleet.is_empty() {
        return Ok(FleetSection::skipped("--no-fleet given".to_owned()));
    }
    let n = ctx.opts.fleet_n;
    let mut drains = Vec::new();
    for processors in ctx.opts.fleet.clone() {
        let d = drain::run(ctx, sim, n, None, processors)
            .await
            .map_err(|e| e.during(format!("fleet drain of {n} by {processors} processors")))?;
        say(format!(
            "fleet drain {n} via sim by {processors} processors of {} workers: {:.0} req/s in {:.2} s, {} requests lost to another's claim per request",
            d.concurrency / processors.max(1),
            d.requests_per_s,
            d.seconds,
            d.claims_lost_per_request
                .map_or("-".to_owned(), |l| format!("{l:.2}"))
        ));
        drains.push(d);
    }
    Ok(FleetSection::measured(n, drains))
}

/// BullMQ's drains of every N against `node`, its worker on `cpus` or on every CPU.
async fn bullmq_drains(
    ctx: &mut Ctx,
    bull_dir: &std::path::Path,
    script: &std::path::Path,
    node: &Gateway,
    cpus: Option<&str>,
) -> Result<Vec<bullmq::BullmqDrain>, BenchError> {
    let mut runs = Vec::new();
    for n in ctx.opts.drains.clone() {
        let b = bullmq::run(ctx, bull_dir, script, node, n, cpus)
            .await
            .map_err(|e| e.during(format!("BullMQ drain {n}")))?;
        say(format!(
            "BullMQ drain {n} via node{}: {:.0} jobs/s in {:.2} s",
            if cpus.is_some() { ", split" } else { "" },
            b.jobs_per_s,
            b.seconds
        ));
        runs.push(b);
    }
    Ok(runs)
}

/// The drains again in the split placement (see [`placement`]): the node gateway on CPUs of its
/// own, redis-server and the worker (inferq's processor, then BullMQ's) on the others. Skipped,
/// with the reason, where the machine cannot be split.
async fn split_drains(
    ctx: &mut Ctx,
    node: &Gateway,
    bull: Option<&(PathBuf, PathBuf)>,
) -> Result<SplitSection, BenchError> {
    let mut split = match placement::Split::plan() {
        Ok(split) => split,
        Err(reason) => {
            say(format!("split placement skipped: {reason}"));
            return Ok(SplitSection::skipped(reason));
        }
    };
    let Some(redis_pid) = ctx.redis_pid else {
        return Ok(SplitSection::skipped(
            "redis-server's pid is unknown".to_owned(),
        ));
    };
    let pinned = split
        .pin(redis_pid, placement::Side::Queue)
        .and_then(|()| split.pin(node.pid(), placement::Side::Gateway));
    if let Err(reason) = pinned {
        say(format!("split placement skipped: {reason}"));
        return Ok(SplitSection::skipped(reason));
    }
    say(format!(
        "split placement: the gateway on CPU {}, redis-server and the worker on CPU {}",
        split.gateway, split.queue
    ));
    let mut drains = Vec::new();
    for n in ctx.opts.drains.clone() {
        let d = drain::run(ctx, node, n, Some(&split.queue), 1)
            .await
            .map_err(|e| e.during(format!("split drain {n} via node")))?;
        say(format!(
            "drain {n} via node, split: {:.0} req/s in {:.2} s",
            d.requests_per_s, d.seconds
        ));
        drains.push(d);
    }
    let bullmq = match bull {
        Some((bull_dir, script)) => {
            let runs = bullmq_drains(ctx, bull_dir, script, node, Some(&split.queue)).await?;
            BullmqSection::measured(runs, &drains)
        }
        None => BullmqSection::skipped("BullMQ not measured in this run".to_owned()),
    };
    Ok(SplitSection::measured(&split, drains, bullmq))
}
