//! Batch work behind the router's flow control with in-flight eviction (the simulator's
//! `--eviction`, its detector counting requests): ungated, inferq's batch requests fill the
//! engine, an interactive request that finds it full evicts the newest batch sequence, and the
//! evicted request goes back to its queue at once (not a retry) to end, like every other, with
//! exactly one result.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use inferq_client::wire::ResultMessage;
use inferq_sim::interactive::{self, InteractiveSettings, Phase, Profile};
use inferq_sim::{EngineConfig, RouterConfig, SaturationDetector, Sim, SimConfig};
use inferq_testkit::RedisServer;
use tokio_util::sync::CancellationToken;

const Q: &str = "evict-batch";
const RESULTS: &str = "evict-results";
/// Batch requests, each of [`BATCH_TOKENS`] tokens: about 12 s of the engine's work.
const BATCH: usize = 120;
const BATCH_TOKENS: u64 = 100;

/// One engine of 8 sequences, 4 ms steps that double when full, behind a router that evicts
/// (its pacing at the router's defaults: 2 a decision, 500 ms grace).
fn pool(eviction: bool) -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            pods: 1,
            max_num_seqs: 8,
            inter_token_latency_ms: 4.0,
            time_factor_under_load: 2.0,
            prefill_overhead_ms: 5.0,
            ..EngineConfig::default()
        },
        router: RouterConfig {
            eviction,
            priority_bands: true,
            saturation_detector: SaturationDetector::Concurrency,
            ..RouterConfig::default()
        },
        ..SimConfig::default()
    }
}

/// The interactive requests' p99 TTFT (ms) in the measured phase.
async fn interactive_p99(sim: &Sim) -> f64 {
    let profile = Profile {
        phases: vec![
            Phase::steady("warmup", Duration::from_secs(2), 6.0),
            Phase::steady("load", Duration::from_secs(8), 6.0),
        ],
    };
    let settings = InteractiveSettings {
        max_tokens: 16,
        seed: 5,
        ..InteractiveSettings::default()
    };
    let report = interactive::run(
        &sim.base_url(),
        &profile,
        &settings,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    load_ttft_p99(&report)
}

/// The value of the first series of `family` on `page` whose line holds `filter`.
fn series(page: &str, family: &str, filter: &str) -> Option<f64> {
    page.lines()
        .filter(|l| l.starts_with(family) && l.contains(filter))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn evicted_batch_requests_come_back_and_interactive_latency_stays_bounded() {
    // Interactive alone, on the same pool.
    let alone = {
        let sim = Sim::start(pool(true), "127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let p99 = interactive_p99(&sim).await;
        sim.stop().await;
        p99
    };

    let redis = RedisServer::start().unwrap();
    let sim = Sim::start(pool(true), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dummy = Gateway::start().await;
    let mut con = con(&redis).await;
    let producer = inferq_client::producer::Producer::connect(&redis.url(), Q, RESULTS)
        .await
        .unwrap();
    let payload = format!(
        r#"{{"model":"m","max_tokens":{BATCH_TOKENS},"messages":[{{"role":"user","content":"summarise this"}}]}}"#
    );
    let backlog: Vec<_> = (0..BATCH)
        .map(|i| request(&format!("b{i:03}"), 600, &payload))
        .collect();
    for outcome in producer.submit_many(backlog).await.unwrap() {
        outcome.unwrap();
    }
    let transport = serde_json::json!({
        "url": redis.url(),
        "poll_interval_ms": 50,
        "batch_size": 16,
        "result_queue_name": RESULTS,
        "queues": [{"queue_name": Q, "igw_base_url": sim.base_url(),
                    "request_path_url": "/v1/chat/completions",
                    "inference_objective": "batch"}],
    });
    let opts = ProcessorOpts {
        concurrency: 24,
        // One eviction more than any request should take here, so a regression that loops
        // shows as errors rather than as a hang.
        extra_args: vec!["--max-evictions".into(), "50".into()],
        transport_args: Some(vec![
            "--transport".into(),
            "redis-sortedset".into(),
            "--transport-config".into(),
            transport.to_string(),
        ]),
        ..ProcessorOpts::default()
    };
    let processor = Processor::start(&redis, &dummy, &opts).await;
    let before = processor.metrics().await;
    assert_eq!(
        series(
            &before,
            "llm_d_async_async_evicted_requests_total",
            "queue_name=\"evict-batch\""
        ),
        Some(0.0),
        "the eviction counter exists from start-up:\n{before}"
    );

    // Batch work fills the engine while the interactive profile runs beside it.
    let fill = {
        let sim_url = sim.base_url();
        tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut running = Vec::new();
            for _ in 0..40 {
                tokio::time::sleep(Duration::from_millis(200)).await;
                let page = http
                    .get(format!("{sim_url}/metrics"))
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap();
                running.push(series(&page, "vllm:num_requests_running", "").unwrap_or(0.0));
            }
            running
        })
    };
    let p99 = interactive_p99(&sim).await;
    let running = fill.await.unwrap();

    let raw = wait_results_in(&mut con, RESULTS, BATCH, Duration::from_secs(60)).await;
    let results: Vec<ResultMessage> = raw
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    let metrics = processor.metrics().await;
    let evicted = series(
        &metrics,
        "llm_d_async_async_evicted_requests_total",
        "queue_name=\"evict-batch\"",
    )
    .unwrap_or(-1.0);
    let retries = series(
        &metrics,
        "llm_d_async_async_request_retries_total",
        "queue_name=\"evict-batch\"",
    )
    .unwrap_or(-1.0);
    let executions = sim.executions();
    let again: u64 = executions.values().map(|n| n.saturating_sub(1)).sum();
    eprintln!(
        "alone p99 {alone:.0} ms; with batch work and eviction p99 {p99:.0} ms; {} evictions \
         at the router, {evicted} counted by inferq, {again} executions again; engine running \
         {:?}",
        sim.evictions(),
        running
    );

    // Every batch request ends with exactly one result, and a successful one.
    let mut per_id: HashMap<&str, usize> = HashMap::new();
    for r in &results {
        *per_id.entry(r.id.as_str()).or_default() += 1;
    }
    assert_eq!(results.len(), BATCH, "log:\n{}", processor.log());
    assert!(per_id.values().all(|n| *n == 1), "a duplicate result");
    assert!(
        results.iter().all(|r| r.status_code == 200),
        "a batch request failed: {:?}",
        results.iter().find(|r| r.status_code != 200)
    );
    // The router evicted; inferq put each evicted request back, not as a retry.
    assert!(
        sim.evictions() > 0,
        "nothing was evicted: the test means nothing"
    );
    assert_eq!(evicted, sim.evictions() as f64);
    assert_eq!(
        again,
        sim.evictions(),
        "each eviction ran its request once more"
    );
    assert_eq!(retries, 0.0, "an eviction counted as a retry");
    // Batch work filled the engine: most readings while it ran show every slot taken.
    let busy = running.iter().take(25).filter(|r| **r >= 7.0).count();
    assert!(busy >= 15, "the engine ran {running:?}");
    // Loose: an interactive request waits for an eviction (paced by the router's 500 ms
    // grace) or a batch sequence's end, not behind the engine's queue of batch work.
    let bound = (alone * 5.0).max(alone + 750.0);
    assert!(
        p99 <= bound,
        "interactive p99 TTFT {p99:.0} ms beside evictable batch work (alone {alone:.0} ms, \
         bound {bound:.0} ms)"
    );
    sim.stop().await;
}
