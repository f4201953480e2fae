//! `inferq-dev bench`: flags in, [`inferq_bench::run`] does the work. `--quick` picks small sizes
//! (under a minute); each size can also be set on its own. Exit 0 when the run completed
//! (targets missed are reported in the table, not as a failure), 1 when a phase failed.
//! `--cluster-only` runs just the cluster section; `--no-cluster` leaves it out.

use std::path::PathBuf;
use std::time::Duration;

use inferq::cli::Failure;
use inferq_bench::{self as bench, BenchOptions};

#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Small sizes and short phases: finishes in under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Folder for bench.json and bench.png.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Drain sizes N [default: 20000,100000,200000; quick: 1000,2000,4000].
    #[arg(long, value_delimiter = ',')]
    pub drains: Option<Vec<u64>>,
    /// Open-loop rates in requests/s [default: 100,1000,5000].
    #[arg(long, value_delimiter = ',')]
    pub rates: Option<Vec<u64>>,
    /// Processor workers and load-generator senders.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
    /// Seconds of each open-loop phase [default: 10; quick: 2].
    #[arg(long)]
    pub open_loop_s: Option<f64>,
    /// Seconds of each gateway-ceiling measurement [default: 5; quick: 1].
    #[arg(long)]
    pub ceiling_s: Option<f64>,
    /// The processor's poll_interval_ms.
    #[arg(long, default_value_t = 50)]
    pub poll_interval_ms: u64,
    /// The processor's batch_size (requests claimed per poll). 256 rather than Go's 10: a poll
    /// and a finish cost a constant number of Redis calls, so bigger batches drain faster.
    #[arg(long, default_value_t = 256)]
    pub batch_size: u32,
    /// Claim lease of the redelivery phase's processors, in seconds.
    #[arg(long, default_value_t = 3)]
    pub lease_s: u64,
    /// Reclaim interval of the redelivery phase's processors, in milliseconds.
    #[arg(long, default_value_t = 250)]
    pub reclaim_interval_ms: u64,
    /// Requests held by the processor killed in the redelivery phase [default: 32; quick: 8].
    #[arg(long)]
    pub redelivery_requests: Option<u64>,
    /// Skip node (its gateway and BullMQ) even when installed.
    #[arg(long)]
    pub no_node: bool,
    /// Processors of each fleet drain, which share the --concurrency workers on one queue
    /// [default: 1,4,8; quick: 1,4].
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    pub fleet: Option<Vec<u32>>,
    /// Requests of each fleet drain [default: 100000; quick: 4000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub fleet_n: Option<u64>,
    /// Skip the fleet drains.
    #[arg(long, conflicts_with = "fleet")]
    pub no_fleet: bool,
    /// Requests of each cluster drain: a 3-master Redis Cluster against the standalone Redis
    /// [default: 20000; quick: 2000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub cluster_n: Option<u64>,
    /// Skip the cluster section.
    #[arg(long, conflicts_with_all = ["cluster_n", "cluster_only"])]
    pub no_cluster: bool,
    /// Run only the cluster section (with its standalone reference and the replica-wait cost):
    /// its table, and cluster.json in --out.
    #[arg(long)]
    pub cluster_only: bool,
    /// Folder holding node_modules/bullmq [default: $BULLMQ_DIR or ~/.cache/inferq-bench/bullmq].
    #[arg(long)]
    pub bullmq_dir: Option<PathBuf>,
    /// An extra argument for every `inferq run` (repeat for more).
    #[arg(long, allow_hyphen_values = true)]
    pub run_arg: Vec<String>,
}

fn seconds(s: f64, flag: &str) -> Result<Duration, Failure> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| {
            Failure::bad_input(anyhow::anyhow!(
                "--{flag}: must be a positive number of seconds, got {s}"
            ))
        })
}

pub(crate) async fn bench(args: BenchArgs) -> Result<(), Failure> {
    let quick = args.quick;
    let drains = args.drains.unwrap_or_else(|| {
        if quick {
            vec![1000, 2000, 4000]
        } else {
            vec![20_000, 100_000, 200_000]
        }
    });
    let rates = args.rates.unwrap_or_else(|| vec![100, 1000, 5000]);
    if drains.is_empty() || drains.contains(&0) || rates.is_empty() || rates.contains(&0) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--drains and --rates: need one or more positive numbers"
        )));
    }
    let opts = BenchOptions {
        profile: if quick { "quick" } else { "full" }.to_owned(),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        out: args.out,
        drains,
        rates,
        concurrency: args.concurrency,
        open_loop: seconds(
            args.open_loop_s.unwrap_or(if quick { 2.0 } else { 10.0 }),
            "open-loop-s",
        )?,
        ceiling: seconds(
            args.ceiling_s.unwrap_or(if quick { 1.0 } else { 5.0 }),
            "ceiling-s",
        )?,
        poll_interval_ms: args.poll_interval_ms,
        batch_size: args.batch_size,
        lease_s: args.lease_s,
        reclaim_interval_ms: args.reclaim_interval_ms,
        redelivery_requests: args
            .redelivery_requests
            .unwrap_or(if quick { 8 } else { 32 })
            .max(1),
        no_node: args.no_node,
        fleet: if args.no_fleet {
            Vec::new()
        } else {
            args.fleet
                .unwrap_or_else(|| if quick { vec![1, 4] } else { vec![1, 4, 8] })
        },
        fleet_n: args.fleet_n.unwrap_or(if quick { 4000 } else { 100_000 }),
        bullmq_dir: args.bullmq_dir,
        cluster_n: if args.no_cluster {
            0
        } else {
            args.cluster_n.unwrap_or(if quick { 2000 } else { 20_000 })
        },
        run_args: args.run_arg,
    };
    if args.cluster_only {
        bench::run_cluster_only(opts).await?;
    } else {
        bench::run(opts).await?;
    }
    Ok(())
}
