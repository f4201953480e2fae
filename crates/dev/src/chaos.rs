//! `inferq-dev chaos`: the chaos harness (see [`inferq_chaos`]). Flags pick a profile, how Redis is
//! deployed (`--redis standalone|cluster|sentinel`), a seed and where the JSON report goes;
//! `inferq-dev chaos races` runs only the stale-owner races. The
//! summary table goes to standard output, progress to standard error; the exit code is 0 when
//! every check passed, 1 when any failed, 130 when interrupted (everything started is stopped).

use std::path::PathBuf;

use anyhow::{anyhow, Context};

use super::demo::{interrupted, EXIT_INTERRUPTED};
use inferq::cli::Failure;
use inferq_chaos::{harness, ChaosRedis, ChaosSettings, ChaosTransport, Profile, Report};

#[derive(Debug, clap::Args)]
pub(crate) struct ChaosArgs {
    /// Only the stale-owner races.
    #[command(subcommand)]
    pub only: Option<ChaosOnly>,
    /// Size of the run: `short` (≤ 3 minutes, CI) or `long` (about 15 minutes of faults).
    #[arg(long, value_enum, default_value = "short", global = true)]
    pub profile: Profile,
    /// How Redis is deployed: one server behind breakable proxies (standalone), a Redis Cluster
    /// of 3 masters with a replica each (cluster: masters killed and failed over, manual
    /// fail-overs, the queue's slot migrated), or a primary, a replica and 3 sentinels
    /// (sentinel: the primary killed, forced fail-overs). Cluster and Sentinel runs submit with
    /// a replica wait and run no stale-owner races.
    #[arg(long, value_enum, default_value = "standalone")]
    pub redis: ChaosRedis,
    /// Seed of the fault plan and the races [default: random, printed].
    #[arg(long, global = true)]
    pub seed: Option<u64>,
    /// Where the JSON report goes.
    #[arg(long, default_value = "chaos-report.json", global = true)]
    pub report: PathBuf,
    /// Requests to submit [default: the profile's].
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stale-owner races after the run [default: 1000; 0 for none].
    #[arg(long)]
    pub races: Option<u64>,
    /// How requests reach the processors: submitted into the queue (redis-sortedset) or
    /// published on its channel (redis-pubsub, Go's producer; the processors admit them).
    #[arg(long, value_enum, default_value = "redis-sortedset")]
    pub transport: ChaosTransport,
    /// Keep the data directory (Redis AOF, processor logs) even when the run passes.
    #[arg(long, global = true)]
    pub keep_data: bool,
}

#[derive(Debug, clap::Subcommand)]
pub(crate) enum ChaosOnly {
    /// Forced stale-owner races at the library level, against a Redis of their own.
    Races {
        /// How many races.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        count: u64,
    },
    /// The batch profile: the Batch API under replica and processor kills and Redis
    /// restarts, then every batch's output and error files checked line by line.
    Batch {
        /// Batches to run.
        #[arg(long, default_value_t = 4)]
        batches: usize,
        /// Lines per batch.
        #[arg(long, default_value_t = 1500)]
        lines: usize,
        /// Seconds of faults.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
    /// The front-door profile: single requests over HTTP, each with its own Idempotency-Key,
    /// in wait mode or enqueue mode, while replicas and processors are SIGKILLed and Redis
    /// restarts; clients retry with their keys. Then every key must have been answered by
    /// exactly one request holding exactly one result.
    Front {
        /// Clients sending at once.
        #[arg(long, default_value_t = 16)]
        clients: usize,
        /// Requests each client sends, one after another.
        #[arg(long, default_value_t = 40)]
        per_client: usize,
        /// Seconds of faults.
        #[arg(long, default_value_t = 20)]
        seconds: u64,
    },
}

pub(crate) async fn chaos(args: ChaosArgs) -> Result<(), Failure> {
    if args.redis != ChaosRedis::Standalone && args.transport != ChaosTransport::RedisSortedset {
        return Err(Failure::bad_input(anyhow!(
            "--transport {}: only with --redis standalone",
            args.transport.flag()
        )));
    }
    let seed = args.seed.unwrap_or_else(rand::random);
    let exe = inferq_testkit::inferq_binary()?;
    let dir = tempfile::Builder::new()
        .prefix("inferq-chaos-")
        .tempdir()
        .context("cannot create a data directory")?;
    if let Some(ChaosOnly::Batch {
        batches,
        lines,
        seconds,
    }) = args.only
    {
        let settings = inferq_chaos::batch::BatchChaosSettings {
            batches,
            lines,
            faults_for: std::time::Duration::from_secs(seconds),
            seed,
            dir: dir.path().to_owned(),
            exe,
        };
        return batch(settings, dir, &args.report).await;
    }
    if let Some(ChaosOnly::Front {
        clients,
        per_client,
        seconds,
    }) = args.only
    {
        let settings = inferq_chaos::front::FrontChaosSettings {
            clients,
            per_client,
            faults_for: std::time::Duration::from_secs(seconds),
            seed,
            dir: dir.path().to_owned(),
            exe,
        };
        return front(settings, dir, &args.report).await;
    }
    let mut settings =
        ChaosSettings::deployed(args.profile, args.redis, seed, exe, dir.path().to_owned());
    if let Some(n) = args.requests {
        settings.requests = n;
    }
    if let Some(n) = args.races {
        settings.races = n;
    }
    settings.transport = args.transport;
    say!(
        "inferq-dev chaos: profile {:?}, redis {}, transport {}, seed {seed} (replay with --seed \
         {seed})",
        args.profile,
        args.redis.flag(),
        args.transport.flag()
    );
    let (report_path, keep_data) = (args.report.clone(), args.keep_data);
    let run = async move {
        match args.only {
            Some(ChaosOnly::Races { count }) => {
                settings.races = count;
                harness::races_only(settings).await
            }
            Some(ChaosOnly::Batch { .. } | ChaosOnly::Front { .. }) | None => {
                harness::run(settings).await
            }
        }
    };
    // On a signal the run is dropped, and with it everything it started: processors
    // (SIGKILL), Redis, the simulator, the proxies; then the data directory.
    let report = tokio::select! {
        biased;
        signal = interrupted() => {
            return Err(Failure {
                code: EXIT_INTERRUPTED,
                error: anyhow!("interrupted by {signal} (seed {seed})"),
            });
        }
        report = run => report?,
    };
    finish(&report, &report_path)?;
    if keep_data || !report.passed {
        let kept = dir.keep();
        say!("data kept in {}", kept.display());
    }
    if report.passed {
        Ok(())
    } else {
        Err(Failure::from(anyhow!(
            "chaos checks failed (seed {seed}): {}",
            report.failures.join("; ")
        )))
    }
}

fn finish(report: &Report, path: &PathBuf) -> Result<(), Failure> {
    write_report(report, path)?;
    print!("{}", report.table());
    say!("report written to {}", path.display());
    Ok(())
}

/// `inferq-dev chaos batch`: runs the batch profile and prints its figures.
async fn batch(
    settings: inferq_chaos::batch::BatchChaosSettings,
    dir: tempfile::TempDir,
    report_path: &PathBuf,
) -> Result<(), Failure> {
    say!(
        "inferq-dev chaos batch: {} batches of {} lines, {} s of faults, seed {} (replay with --seed {})",
        settings.batches,
        settings.lines,
        settings.faults_for.as_secs(),
        settings.seed,
        settings.seed
    );
    let report = until_interrupted(inferq_chaos::batch::run(&settings)).await?;
    write_report(&report, report_path)?;
    say!("batches            {}", report.batches);
    say!("lines              {}", report.lines);
    say!("replica kills      {}", report.struck.replica_kills);
    say!("processor kills    {}", report.struck.processor_kills);
    say!("redis restarts     {}", report.struck.redis_restarts);
    say!("statuses           {:?}", report.statuses);
    say!("lines missing      {}", report.lines_missing);
    say!("lines doubled      {}", report.lines_doubled);
    say!("seconds            {:.1}", report.seconds);
    say!("report written to {}", report_path.display());
    if report.passed {
        return Ok(());
    }
    let kept = dir.keep();
    Err(Failure::from(anyhow!(
        "batch chaos checks failed (seed {}; data kept in {}): stuck {:?}",
        report.seed,
        kept.display(),
        report.stuck
    )))
}

/// `inferq-dev chaos front`: runs the front-door profile and prints its figures.
async fn front(
    settings: inferq_chaos::front::FrontChaosSettings,
    dir: tempfile::TempDir,
    report_path: &PathBuf,
) -> Result<(), Failure> {
    say!(
        "inferq-dev chaos front: {} clients x {} keys, {} s of faults, seed {} (replay with --seed {})",
        settings.clients,
        settings.per_client,
        settings.faults_for.as_secs(),
        settings.seed,
        settings.seed
    );
    let report = until_interrupted(inferq_chaos::front::run(&settings)).await?;
    write_report(&report, report_path)?;
    say!("keys               {}", report.keys);
    say!("answered           {}", report.answered);
    say!("lost               {}", report.lost.len());
    say!("split (2+ ids)     {}", report.split.len());
    say!("mismatched         {}", report.mismatched.len());
    say!("client retries     {}", report.retries);
    say!("gateway re-runs    {}", report.re_executed);
    say!("replica kills      {}", report.struck.replica_kills);
    say!("processor kills    {}", report.struck.processor_kills);
    say!("redis restarts     {}", report.struck.redis_restarts);
    say!("seconds            {:.1}", report.seconds);
    say!("report written to {}", report_path.display());
    if report.passed {
        return Ok(());
    }
    let kept = dir.keep();
    Err(Failure::from(anyhow!(
        "front chaos checks failed (seed {}; data kept in {}): lost {:?}, split {:?}, mismatched {:?}",
        report.seed,
        kept.display(),
        report.lost,
        report.split,
        report.mismatched
    )))
}

/// Runs a profile until it ends or a signal comes (the run is dropped, and with it everything
/// it started).
async fn until_interrupted<R, E: std::fmt::Display>(
    run: impl std::future::Future<Output = Result<R, E>>,
) -> Result<R, Failure> {
    tokio::select! {
        biased;
        signal = interrupted() => Err(Failure {
            code: EXIT_INTERRUPTED,
            error: anyhow!("interrupted by {signal}"),
        }),
        report = run => report.map_err(|e| Failure::from(anyhow!("{e}"))),
    }
}

/// Writes a profile's report as JSON.
fn write_report(report: &impl serde::Serialize, path: &PathBuf) -> Result<(), Failure> {
    let json = serde_json::to_vec_pretty(report).context("cannot encode the report")?;
    std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
