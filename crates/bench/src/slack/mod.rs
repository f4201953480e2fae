//! `inferq-dev bench-slack`: does inferq fill a pool's spare capacity without hurting the
//! interactive traffic that shares it? Each scenario runs the same interactive profile (idle and
//! burst phases, open-loop) against a pool that queues like vLLM (the simulator's engine model),
//! beside a deep backlog of batch requests drained by one `inferq run` behind a different gate:
//!
//! 1. interactive alone (no batch: the reference for latency);
//! 2. ungated (the reference for batch throughput);
//! 3. Go's static gate (`endpoint-scrape` on the router's saturation metric, Go's defaults);
//! 4. `aimd` (Go's proposed feedback gate);
//! 5. `slack` with `signal_url` (the engines' `/metrics`);
//! 6. `slack` alone (its own latencies and rejections).
//!
//! The set runs under up to three router settings ([`Router`]): flow control off (the engines
//! never refuse), on and shedding (sheddable batch requests are refused while the pool is
//! saturated), and the router's flow control with in-flight eviction (priority bands, batch at
//! priority −1 evicted for blocked interactive requests). The sweep flags add static pool sizes,
//! static occupancy thresholds, and `slack` headrooms and signal targets, for the trade-off
//! curve.
//!
//! In: [`SlackOptions`]. Out: a table per setting and phase (batch completions and tokens per
//! second, harvest against the ungated run, interactive TTFT and ITL p50/p99 and their ratio to
//! interactive alone), `slack.json`, and `slack.png` (interactive p99 TTFT, batch throughput and
//! the window over time, per scenario).
//!
//! # Layout
//! - `scenario`: one scenario's run (Redis, pool, processor, generator, sampler).
//! - `report`: per-phase figures, the table, the targets.
//! - `plot`: the PNG over time (the six scenarios).
//! - `tradeoff`: harvest against latency, a point per scenario and a curve per sweep.

mod plot;
pub mod report;
mod scenario;
pub mod tradeoff;

use std::path::PathBuf;
use std::time::Duration;

use inferq_sim::interactive::{Phase, Profile};
use inferq_sim::EngineConfig;

use crate::BenchError;
pub use scenario::Run;

/// Everything a run is told.
#[derive(Debug, Clone)]
pub struct SlackOptions {
    pub out: PathBuf,
    /// The pool: engines, sequences, step times (flow control is set per scenario).
    pub engine: EngineConfig,
    /// The interactive profile (a `warmup` phase is left out of every figure).
    pub profile: Profile,
    pub interactive_tokens: u64,
    pub batch_tokens: u64,
    /// Batch requests queued before each scenario (more than it can finish).
    pub backlog: u64,
    /// The processor's workers.
    pub workers: u32,
    pub seed: u64,
    /// Also run static pool sizes and slack headrooms (the trade-off curve).
    pub sweep: Vec<Gate>,
    /// Which router settings to run.
    pub routers: Vec<Router>,
    /// Run only the references (alone, ungated) of the six scenarios, and the sweep.
    pub references_only: bool,
}

/// The warm-up, left out of every figure. It covers a processor's start: `slack` opens its
/// window by one a period and learns the pool's capacity from a queue that stands for 2 s,
/// about 12 s after the start on this pool (the book's *Filling the slack* gives the cost).
pub const WARMUP: Duration = Duration::from_secs(15);

/// The default profile: a warm-up, then idle and burst phases twice.
pub fn default_profile(phase: Duration, idle_rate: f64, burst_rate: f64) -> Profile {
    Profile {
        phases: vec![
            Phase::steady("warmup", WARMUP, idle_rate),
            Phase::steady("idle", phase, idle_rate),
            Phase::steady("burst", phase, burst_rate),
            Phase::steady("idle", phase, idle_rate),
            Phase::steady("burst", phase, burst_rate),
        ],
    }
}

/// What the router in front of the engines does with batch work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Router {
    /// No flow control: the engines queue everything.
    Off,
    /// The engine model's `--flow-control`: sheddable requests refused at saturation.
    Shed,
    /// The router's flow control with in-flight eviction (`--eviction`, concurrency detector at
    /// the engines' `--max-num-seqs`, the router's pacing defaults).
    Evict,
}

impl Router {
    pub const ALL: [Router; 3] = [Router::Off, Router::Shed, Router::Evict];

    /// How the tables and pictures name it.
    pub fn label(self) -> &'static str {
        match self {
            Router::Off => "flow control off",
            Router::Shed => "flow control on (shed)",
            Router::Evict => "router eviction on",
        }
    }

    /// `slack`'s p99 TTFT target under this setting (harvest ≥ 0.9 within it).
    pub fn slack_target_ratio(self) -> f64 {
        match self {
            Router::Evict => 1.5,
            Router::Off | Router::Shed => 2.0,
        }
    }
}

/// `slack`'s tuning in a scenario: each `None` keeps the gate's default.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tune {
    pub headroom: Option<f64>,
    pub target: Option<f64>,
    /// The control period, in milliseconds.
    pub interval_ms: Option<u64>,
}

impl Tune {
    pub const DEFAULT: Tune = Tune {
        headroom: None,
        target: None,
        interval_ms: None,
    };
}

/// A scenario's gate.
#[derive(Debug, Clone, PartialEq)]
pub enum Gate {
    /// No batch work at all.
    Alone,
    /// Batch work, no gate.
    Ungated,
    /// Go's static gate: `endpoint-scrape` as a queue gate on the pool's saturation, Go's
    /// defaults (budget 1 − saturation, closed at saturation 1).
    Static,
    /// A fixed pool size (`local-max-concurrency` with this limit, waiting for a permit).
    Size(u32),
    /// A static occupancy threshold: `endpoint-scrape` counting the pool's running sequences
    /// against this many, read every control period (`admission: counted`).
    Occupancy(u32),
    /// Go's proposed `aimd`.
    Aimd,
    /// `slack` reading the engines' page, tuned (the defaults when nothing is set).
    SlackSignal(Tune),
    /// `slack` on its own latencies and rejections.
    SlackAlone,
}

impl Gate {
    /// The six scenarios of every run.
    pub const SET: [Gate; 6] = [
        Gate::Alone,
        Gate::Ungated,
        Gate::Static,
        Gate::Aimd,
        Gate::SlackSignal(Tune::DEFAULT),
        Gate::SlackAlone,
    ];

    pub fn name(&self) -> String {
        match self {
            Gate::Alone => "interactive-alone".into(),
            Gate::Ungated => "ungated".into(),
            Gate::Static => "static (endpoint-scrape)".into(),
            Gate::Size(n) => format!("static size {n}"),
            Gate::Occupancy(n) => format!("static occupancy {n}"),
            Gate::Aimd => "aimd".into(),
            Gate::SlackSignal(t) => {
                let mut name = String::from("slack + signal_url");
                if let Some(h) = t.headroom {
                    name += &format!(", headroom {h}");
                }
                if let Some(q) = t.target {
                    name += &format!(", target {q}");
                }
                if let Some(ms) = t.interval_ms {
                    name += &format!(", interval {ms}ms");
                }
                name
            }
            Gate::SlackAlone => "slack alone".into(),
        }
    }

    /// The queue gate `(type, params)`, when the scenario has one.
    fn queue_gate(&self, pool_metrics: &str) -> Option<(&'static str, serde_json::Value)> {
        match self {
            Gate::Static => Some((
                "endpoint-scrape",
                serde_json::json!({
                    "url": pool_metrics,
                    "metric": "llm_d_epp_flow_control_pool_saturation",
                }),
            )),
            Gate::Occupancy(n) => Some((
                "endpoint-scrape",
                serde_json::json!({
                    "url": pool_metrics,
                    "metric": "vllm:num_requests_running",
                    "max_count_per_pod": n,
                    "admission": "counted",
                }),
            )),
            _ => None,
        }
    }

    /// The pool gate `(type, params)`, when the scenario has one.
    fn pool_gate(
        &self,
        pool_metrics: &str,
        router: Router,
    ) -> Option<(&'static str, serde_json::Value)> {
        match self {
            Gate::Size(n) => Some((
                "local-max-concurrency",
                serde_json::json!({"limit": n, "gating_mode": "blocking"}),
            )),
            Gate::Aimd => Some(("aimd", serde_json::json!({}))),
            Gate::SlackSignal(t) => {
                let mut p = serde_json::json!({"signal_url": pool_metrics});
                if router == Router::Evict {
                    // The router holds the queue: its interactive band is the signal.
                    p["signal_metric"] = "llm_d_epp_flow_control_queue_size".into();
                    p["signal_labels"] = serde_json::json!({"priority": "0"});
                }
                if let Some(h) = t.headroom {
                    p["headroom"] = h.into();
                }
                if let Some(q) = t.target {
                    p["signal_target"] = q.into();
                }
                if let Some(ms) = t.interval_ms {
                    p["interval"] = format!("{ms}ms").into();
                }
                Some(("slack", p))
            }
            Gate::SlackAlone => Some(("slack", serde_json::json!({}))),
            _ => None,
        }
    }

    /// Flags the processor needs for this gate: a counted scrape reads the page every control
    /// period, not every 5 s.
    fn processor_args(&self) -> Vec<String> {
        match self {
            Gate::Occupancy(_) => vec!["--prometheus-cache-ttl".into(), "250ms".into()],
            _ => Vec::new(),
        }
    }

    /// Whether the scenario is one of the six of every run (the sweep's are drawn on the
    /// trade-off picture only).
    pub fn in_set(name: &str) -> bool {
        Gate::SET.iter().any(|g| g.name() == name)
    }

    /// The processor's series for the window, and a label filter.
    fn window_metric(&self) -> Option<(&'static str, &'static str)> {
        match self {
            Gate::Aimd => Some(("llm_d_async_async_aimd_window", "overflow-batch")),
            Gate::SlackSignal(_) | Gate::SlackAlone => Some(("inferq_slack_window", "")),
            _ => None,
        }
    }
}

/// Runs every scenario under every flow-control setting, prints the table, writes the JSON and
/// the PNG.
pub async fn run(opts: &SlackOptions) -> Result<report::SlackReport, BenchError> {
    std::fs::create_dir_all(&opts.out).map_err(|e| BenchError::setup("output folder", e))?;
    let dir = tempfile::tempdir().map_err(|e| BenchError::setup("scratch folder", e))?;
    let mut runs = Vec::new();
    for &router in &opts.routers {
        let set = Gate::SET
            .iter()
            .filter(|g| !opts.references_only || matches!(g, Gate::Alone | Gate::Ungated));
        for gate in set.chain(opts.sweep.iter()) {
            eprintln!("bench-slack: {} ({})…", gate.name(), router.label());
            let run = scenario::run(opts, gate, router, dir.path())
                .await
                .map_err(|e| e.during(gate.name()))?;
            runs.push(run);
        }
    }
    let report = report::SlackReport::new(opts, runs);
    let points = tradeoff::points(&report.rows);
    println!("{}{}", report.table(), tradeoff::table(&points));
    let json = serde_json::to_string_pretty(&report)
        .map_err(|e| BenchError::Phase(format!("cannot encode slack.json: {e}")))?;
    std::fs::write(opts.out.join("slack.json"), json)
        .map_err(|e| BenchError::setup("slack.json", e))?;
    plot::draw(&report, &opts.out.join("slack.png"))?;
    tradeoff::draw(&points, &opts.out.join("slack-tradeoff.png"))?;
    println!(
        "wrote {}, {} and {}",
        opts.out.join("slack.json").display(),
        opts.out.join("slack.png").display(),
        opts.out.join("slack-tradeoff.png").display()
    );
    Ok(report)
}
