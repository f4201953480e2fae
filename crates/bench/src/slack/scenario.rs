//! One scenario of the slack benchmark: a fresh Redis, the engine-model pool, a deep backlog of
//! batch requests drained by one `inferq run` with the scenario's gate (none for interactive
//! alone), and the interactive generator's profile run beside it. While it runs, a sampler reads
//! the result list's length and the processor's window every [`SAMPLE_EVERY`]; out comes a
//! [`Run`]: the interactive samples, and batch completions and the window over time.

use std::path::Path;
use std::time::{Duration, Instant};

use inferq_client::producer::{unix_ms, Producer};
use inferq_client::wire::NewRequest;
use inferq_sim::interactive::{self, InteractiveSettings, Profile, Sample};
use inferq_sim::{Sim, SimConfig};
use inferq_testkit::{Fsync, RedisServer};
use tokio_util::sync::CancellationToken;

use super::{Gate, Router, SlackOptions};
use crate::procs::{Processor, ProcessorSpec};
use crate::BenchError;

/// How often the sampler reads completions and the window.
pub(super) const SAMPLE_EVERY: Duration = Duration::from_millis(250);
const QUEUE: &str = "slack-batch";
const RESULTS: &str = "slack-results";

/// What one scenario measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Run {
    pub scenario: String,
    pub router: Router,
    /// Every interactive request.
    pub samples: Vec<Sample>,
    /// (seconds since the profile started, batch results so far, the gate's window).
    pub timeline: Vec<(f64, u64, Option<f64>)>,
    /// Requests the gateway executed (a preempted or retried request counts again).
    pub executions: u64,
    /// Requests the router evicted, and the output tokens they had made (work redone).
    pub evictions: u64,
    pub tokens_redone: u64,
    /// Seconds the profile ran (evictions per second are over this).
    pub seconds: f64,
}

/// Runs one scenario.
pub(super) async fn run(
    opts: &SlackOptions,
    gate: &Gate,
    router: Router,
    dir: &Path,
) -> Result<Run, BenchError> {
    let redis_dir = dir.join(format!(
        "redis-{}-{router:?}",
        gate.name().replace(' ', "_")
    ));
    std::fs::create_dir_all(&redis_dir).map_err(|e| BenchError::setup("redis dir", e))?;
    let redis =
        tokio::task::spawn_blocking(move || RedisServer::start_in(&redis_dir, Fsync::EverySec))
            .await
            .map_err(|e| BenchError::Phase(format!("redis start: {e}")))??;
    let mut sim_cfg = SimConfig {
        engine: opts.engine.clone(),
        ..SimConfig::default()
    };
    match router {
        Router::Off => {}
        Router::Shed => sim_cfg.engine.flow_control = true,
        Router::Evict => {
            sim_cfg.router.eviction = true;
            sim_cfg.router.saturation_detector = inferq_sim::SaturationDetector::Concurrency;
        }
    }
    let sim = Sim::start(
        sim_cfg,
        "127.0.0.1:0"
            .parse()
            .map_err(|_| BenchError::Phase("addr".into()))?,
    )
    .await
    .map_err(|e| BenchError::Phase(format!("simulator: {e}")))?;
    let http = reqwest::Client::new();
    let processor = match gate {
        Gate::Alone => None,
        _ => {
            let producer = Producer::connect(&redis.url(), QUEUE, RESULTS).await?;
            preload(&producer, opts).await?;
            Some(start_processor(opts, gate, router, &redis, &sim, dir, &http).await?)
        }
    };
    let cancel = CancellationToken::new();
    let settings = InteractiveSettings {
        max_tokens: opts.interactive_tokens,
        seed: opts.seed,
        ..InteractiveSettings::default()
    };
    let base = sim.base_url();
    let sampler = tokio::spawn(sample(
        redis.url(),
        processor.as_ref().map(Processor::metrics_url),
        gate.window_metric(),
        cancel.clone(),
    ));
    let started = Instant::now();
    let report = interactive::run(&base, &opts.profile, &settings, CancellationToken::new())
        .await
        .map_err(|e| BenchError::Phase(format!("interactive generator: {e}")))?;
    let seconds = started.elapsed().as_secs_f64();
    let (evictions, tokens_redone) = (sim.evictions(), sim.evicted_tokens());
    cancel.cancel();
    let timeline = sampler
        .await
        .map_err(|e| BenchError::Phase(format!("sampler: {e}")))??;
    let executions = sim.executions().values().sum();
    drop(processor);
    sim.stop().await;
    drop(redis);
    Ok(Run {
        scenario: gate.name(),
        router,
        samples: report.samples,
        timeline,
        executions,
        evictions,
        tokens_redone,
        seconds,
    })
}

/// The backlog: more batch requests than the run can finish, each asking for
/// `batch_tokens` output tokens.
async fn preload(producer: &Producer, opts: &SlackOptions) -> Result<(), BenchError> {
    let now_s = unix_ms() / 1000;
    let payload = serde_json::value::to_raw_value(&serde_json::json!({
        "model": "m",
        "max_tokens": opts.batch_tokens,
        "messages": [{"role": "user", "content": "summarise: ".to_owned() + &"x".repeat(400)}],
    }))
    .map_err(|e| BenchError::Phase(format!("payload: {e}")))?;
    let mut next = 0;
    while next < opts.backlog {
        let end = (next + 1000).min(opts.backlog);
        let batch: Vec<NewRequest> = (next..end)
            .map(|i| {
                NewRequest::new(format!("b-{i:07}"), now_s + 3600, payload.clone())
                    .with_created(now_s)
            })
            .collect();
        for outcome in producer.submit_many(batch).await? {
            outcome?;
        }
        next = end;
    }
    Ok(())
}

async fn start_processor(
    opts: &SlackOptions,
    gate: &Gate,
    router: Router,
    redis: &RedisServer,
    sim: &Sim,
    dir: &Path,
    http: &reqwest::Client,
) -> Result<Processor, BenchError> {
    let metrics_url = format!("{}/metrics", sim.base_url());
    let mut queue = serde_json::json!({
        "queue_name": QUEUE,
        "igw_base_url": sim.base_url(),
        "request_path_url": "/v1/chat/completions",
        "inference_objective": "batch",
    });
    if let Some((kind, params)) = gate.queue_gate(&metrics_url) {
        queue["gate_type"] = kind.into();
        queue["gate_params"] = params;
    }
    let transport = serde_json::json!({
        "url": redis.url(),
        "poll_interval_ms": 100,
        "batch_size": 32,
        "result_queue_name": RESULTS,
        "queues": [queue],
    });
    let mut pool = serde_json::json!({"id": "default", "workers": opts.workers});
    if let Some((kind, params)) = gate.pool_gate(&metrics_url, router) {
        pool["gate_type"] = kind.into();
        pool["gate_params"] = params;
    }
    let mut extra_args = gate.processor_args();
    let pools = dir.join(format!(
        "pools-{}.json",
        gate.name().replace([' ', '(', ')', ','], "_")
    ));
    std::fs::write(&pools, serde_json::json!([pool]).to_string())
        .map_err(|e| BenchError::setup("pool config", e))?;
    let spec = ProcessorSpec {
        redis_url: redis.url(),
        gateway_url: sim.base_url(),
        queue: QUEUE.to_owned(),
        results: RESULTS.to_owned(),
        concurrency: opts.workers,
        poll_interval_ms: 100,
        batch_size: 32,
        lease_s: None,
        reclaim_interval_ms: None,
        extra_args: {
            extra_args.extend(["--pool-config-file".to_owned(), pools.display().to_string()]);
            extra_args
        },
        cpus: None,
        transport_json: Some(transport),
    };
    Processor::start(&spec, dir, http).await
}

/// Reads the results' count and the window every [`SAMPLE_EVERY`] until cancelled.
async fn sample(
    redis_url: String,
    metrics_url: Option<String>,
    window_metric: Option<(&'static str, &'static str)>,
    stop: CancellationToken,
) -> Result<Vec<(f64, u64, Option<f64>)>, BenchError> {
    let client = redis::Client::open(redis_url)?;
    let mut con = client.get_multiplexed_async_connection().await?;
    let http = reqwest::Client::new();
    let start = Instant::now();
    let mut timeline = Vec::new();
    let mut ticks = tokio::time::interval(SAMPLE_EVERY);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(timeline),
            _ = ticks.tick() => {}
        }
        let done: u64 = redis::cmd("LLEN")
            .arg(RESULTS)
            .query_async(&mut con)
            .await?;
        let window = match (&metrics_url, window_metric) {
            (Some(url), Some((metric, filter))) => read_sum(&http, url, metric, filter).await,
            _ => None,
        };
        timeline.push((start.elapsed().as_secs_f64(), done, window));
    }
}

/// The sum of a family's samples on a page whose line holds `filter` (None when unreadable or
/// absent).
async fn read_sum(http: &reqwest::Client, url: &str, metric: &str, filter: &str) -> Option<f64> {
    let page = http.get(url).send().await.ok()?.text().await.ok()?;
    let values: Vec<f64> = page
        .lines()
        .filter(|l| l.starts_with(metric) && l[metric.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .collect();
    (!values.is_empty()).then(|| values.iter().sum())
}

/// The profile's phases with their start and end, in seconds since it started.
pub(super) fn phase_spans(profile: &Profile) -> Vec<(String, f64, f64)> {
    let mut t = 0.0;
    profile
        .phases
        .iter()
        .map(|p| {
            let span = (p.name.clone(), t, t + p.duration.as_secs_f64());
            t = span.2;
            span
        })
        .collect()
}
