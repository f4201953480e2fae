//! `inferq-dev`: the developer's binary beside the production `inferq`. It runs the tools that
//! must never be linked into `inferq`: the one-command demo, the simulator gateway, the chaos
//! harness and the benchmark. Flags enter through clap; each subcommand lives in its own file
//! and calls into its tool crate. It finds `inferq` (for `inferq run` and `inferq submit`) next
//! to itself, as cargo builds both into one directory. Exit codes: 0 success, 2 bad input, 1
//! anything else, 130 interrupted.
//!
//! The benchmarks and the chaos harness sit behind the default features `bench` and `chaos`;
//! `scripts/demo.sh` builds without them, and that binary has only `demo` and `sim`.

/// `println!` that does not panic when standard output is closed (a reader such as `head` went
/// away): the line is dropped, as the reader no longer wants it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that does not panic when standard error is closed.
macro_rules! tell {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

#[cfg(feature = "bench")]
mod accept_bench;
#[cfg(feature = "bench")]
mod batch_bench;
#[cfg(feature = "bench")]
mod bench;
#[cfg(feature = "chaos")]
mod chaos;
mod demo;
#[cfg(feature = "bench")]
mod front_bench;
#[cfg(feature = "bench")]
mod slack_bench;
#[cfg(feature = "bench")]
mod tenants_bench;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use inferq::cli::logs::{self, LogFormat};
use inferq::cli::{Failure, EXIT_BAD_INPUT};

#[derive(Debug, Parser)]
#[command(
    name = "inferq-dev",
    version,
    about = "inferq's tools: the demo, the simulator gateway, the chaos harness and the benchmark"
)]
#[cfg_attr(
    not(all(feature = "bench", feature = "chaos")),
    command(
        after_help = "Built without the benchmarks or the chaos harness (as scripts/demo.sh \
        builds it); `cargo build --release -p inferq-dev` builds them all."
    )
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything locally (redis-server, the simulator, `inferq run`), push N requests
    /// through and print throughput, latency, outcomes, retries and the no-loss check.
    Demo(demo::DemoArgs),
    /// Run the OpenAI-compatible simulator gateway.
    Sim(Box<SimArgs>),
    /// Break things on purpose (kill and freeze processors, restart Redis, cut connections,
    /// fail the gateway) under load, then check every request has exactly one result.
    #[cfg(feature = "chaos")]
    Chaos(chaos::ChaosArgs),
    /// Benchmark: drains, open-loop latency, Redis commands per request, CPU and
    /// memory, redelivery after kill -9, and BullMQ on the same Redis when installed.
    #[cfg(feature = "bench")]
    Bench(bench::BenchArgs),
    /// Benchmark the Batch API: a batch's upload, ingestion, drain and output against the
    /// same lines through `inferq submit`, and the replica's peak memory.
    #[cfg(feature = "bench")]
    BenchBatch(batch_bench::BatchBenchArgs),
    /// Benchmark durable acceptance: Batch API ingestion with and without `replica_wait`
    /// (a primary and one replica), printing both rates and the ratio.
    #[cfg(feature = "bench")]
    BenchBatchWait(accept_bench::AcceptBenchArgs),
    /// Benchmark the front door (single requests over HTTP): wait-mode latency against the
    /// simulator called directly, clients held waiting per replica and its memory, and the
    /// enqueue rate.
    #[cfg(feature = "bench")]
    BenchFront(front_bench::FrontBenchArgs),
    /// Benchmark filling the slack: batch work beside interactive traffic on a pool that queues
    /// like vLLM, ungated and behind each gate (static, aimd, slack), with the picture.
    #[cfg(feature = "bench")]
    BenchSlack(slack_bench::SlackBenchArgs),
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: std::net::SocketAddr,
    #[command(flatten)]
    sim: inferq_sim::SimConfig,
    #[command(flatten)]
    tls: inferq_sim::SimTls,
}

async fn sim(args: SimArgs) -> Result<(), Failure> {
    inferq_sim::run_foreground(args.sim, args.listen, &args.tls)
        .await
        .map_err(|e| match e {
            inferq_sim::SimError::InvalidKnob { .. } | inferq_sim::SimError::Tls(_) => {
                Failure::bad_input(e)
            }
            other => Failure::from(other),
        })
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EXIT_BAD_INPUT } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    logs::init("info", LogFormat::Text);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            logs::fatal(
                LogFormat::Text,
                &format!("cannot start the async runtime: {e}"),
            );
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(async move {
        match cli.command {
            Command::Demo(args) => demo::demo(args).await,
            Command::Sim(args) => sim(*args).await,
            #[cfg(feature = "chaos")]
            Command::Chaos(args) => chaos::chaos(args).await,
            #[cfg(feature = "bench")]
            Command::Bench(args) => bench::bench(args).await,
            #[cfg(feature = "bench")]
            Command::BenchBatch(args) => batch_bench::bench_batch(args).await,
            #[cfg(feature = "bench")]
            Command::BenchBatchWait(args) => accept_bench::bench_batch_wait(args).await,
            #[cfg(feature = "bench")]
            Command::BenchFront(args) => front_bench::bench_front(args).await,
            #[cfg(feature = "bench")]
            Command::BenchSlack(args) => slack_bench::bench_slack(args).await,
        }
    });
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            logs::fatal(
                LogFormat::Text,
                &inferq::gateway::error_chain(f.error.as_ref()),
            );
            ExitCode::from(f.code)
        }
    }
}
