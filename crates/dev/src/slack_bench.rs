//! `inferq-dev bench-slack`: flags in, [`inferq_bench::slack::run`] does the work. The pool's
//! knobs are the simulator's engine-model flags; the profile is a warm-up, then idle and burst
//! phases twice. Exit 0 when the run completed (missed targets are reported in the table), 2 on
//! a bad flag, 1 when a scenario failed.

use std::path::PathBuf;
use std::time::Duration;

use inferq::cli::Failure;
use inferq_bench::slack::{self, Gate, SlackOptions};
use inferq_sim::EngineConfig;

#[derive(Debug, clap::Args)]
pub(crate) struct SlackBenchArgs {
    /// Folder for slack.json and slack.png.
    #[arg(long, default_value = "bench-out")]
    pub out: PathBuf,
    /// Seconds of each idle and burst phase.
    #[arg(long, default_value_t = 20.0)]
    pub phase_s: f64,
    /// Interactive requests per second in idle phases.
    #[arg(long, default_value_t = 2.0)]
    pub idle_rate: f64,
    /// Interactive requests per second in burst phases.
    #[arg(long, default_value_t = 8.0)]
    pub burst_rate: f64,
    /// Output tokens of each interactive request.
    #[arg(long, default_value_t = 64)]
    pub interactive_tokens: u64,
    /// Output tokens of each batch request.
    #[arg(long, default_value_t = 128)]
    pub batch_tokens: u64,
    /// Batch requests queued before each scenario.
    #[arg(long, default_value_t = 20_000)]
    pub backlog: u64,
    /// The processor's workers.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub workers: u32,
    /// Seed of the interactive arrivals (every scenario gets the same ones).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The router settings to run, comma-separated: off (no flow control), shed (the pool's
    /// --flow-control refuses sheddable batch work at saturation), evict (the router's flow
    /// control with priority bands and in-flight eviction of batch work at priority -1).
    #[arg(long, value_delimiter = ',', default_value = "off,evict", value_parser = ["off", "shed", "evict"])]
    pub routers: Vec<String>,
    /// Earlier runs' way to pick one setting: off, or on (= shed). Overrides --routers.
    #[arg(long, value_parser = ["off", "on"], hide = true)]
    pub only_flow_control: Option<String>,
    /// Also run these static pool sizes (the trade-off curve).
    #[arg(long, value_delimiter = ',')]
    pub sweep_sizes: Vec<u32>,
    /// Also run a static occupancy threshold at these counts of running sequences
    /// (`endpoint-scrape`, counted admission on vllm:num_requests_running).
    #[arg(long, value_delimiter = ',')]
    pub sweep_occupancy: Vec<u32>,
    /// Also run `slack` with signal_url at these headrooms (the trade-off curve).
    #[arg(long, value_delimiter = ',')]
    pub sweep_headroom: Vec<f64>,
    /// Also run `slack` with signal_url at these signal targets (a queue it tolerates).
    #[arg(long, value_delimiter = ',')]
    pub sweep_target: Vec<f64>,
    /// Also run `slack` with signal_url at these control periods (milliseconds).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..))]
    pub sweep_interval_ms: Vec<u64>,
    /// Of the six scenarios run only the references (interactive alone, ungated), then the
    /// sweep.
    #[arg(long)]
    pub references_only: bool,
    /// The pool (2 engines of 16 sequences unless told otherwise).
    #[command(flatten)]
    pub engine: EngineConfig,
}

pub(crate) async fn bench_slack(args: SlackBenchArgs) -> Result<(), Failure> {
    let phase = Duration::try_from_secs_f64(args.phase_s)
        .ok()
        .filter(|d| *d >= Duration::from_secs(1))
        .ok_or_else(|| Failure::bad_input(anyhow::anyhow!("--phase-s: must be at least 1")))?;
    for (flag, rate) in [
        ("idle-rate", args.idle_rate),
        ("burst-rate", args.burst_rate),
    ] {
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--{flag}: must be ≥ 0, got {rate}"
            )));
        }
    }
    let mut engine = args.engine;
    if engine.pods == 0 {
        engine.pods = 2;
    }
    let sim = inferq_sim::SimConfig {
        engine: engine.clone(),
        ..inferq_sim::SimConfig::default()
    };
    sim.validate().map_err(Failure::bad_input)?;
    let names = match args.only_flow_control.as_deref() {
        Some("on") => vec!["shed".to_owned()],
        Some(_) => vec!["off".to_owned()],
        None => args.routers.clone(),
    };
    let mut routers = Vec::new();
    for name in &names {
        let router = match name.as_str() {
            "off" => slack::Router::Off,
            "shed" => slack::Router::Shed,
            _ => slack::Router::Evict,
        };
        if !routers.contains(&router) {
            routers.push(router);
        }
    }
    let tune = |headroom: Option<f64>, target: Option<f64>, interval_ms: Option<u64>| {
        Gate::SlackSignal(slack::Tune {
            headroom,
            target,
            interval_ms,
        })
    };
    let sweep = args
        .sweep_sizes
        .iter()
        .map(|n| Gate::Size(*n))
        .chain(args.sweep_occupancy.iter().map(|n| Gate::Occupancy(*n)))
        .chain(
            args.sweep_headroom
                .iter()
                .map(|h| tune(Some(*h), None, None)),
        )
        .chain(args.sweep_target.iter().map(|q| tune(None, Some(*q), None)))
        .chain(
            args.sweep_interval_ms
                .iter()
                .map(|ms| tune(None, None, Some(*ms))),
        )
        .collect();
    let opts = SlackOptions {
        out: args.out,
        engine,
        profile: slack::default_profile(phase, args.idle_rate, args.burst_rate),
        interactive_tokens: args.interactive_tokens,
        batch_tokens: args.batch_tokens,
        backlog: args.backlog,
        workers: args.workers,
        seed: args.seed,
        sweep,
        routers,
        references_only: args.references_only,
    };
    slack::run(&opts).await?;
    Ok(())
}
