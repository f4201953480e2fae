//! The `slack` gate on a pool that queues like vLLM (the simulator's engine model), with
//! interactive traffic beside a backlog of batch requests: ungated, the batch work fills the
//! engine's queue and the interactive requests wait behind it; behind `slack` reading the
//! engine's page, interactive p99 TTFT stays within a loose bound of its value alone while batch
//! work still completes.

use crate::common;

use std::time::Duration;

use common::*;
use inferq_sim::interactive::{self, InteractiveSettings, Phase, Profile};
use inferq_sim::{EngineConfig, Sim, SimConfig};
use inferq_testkit::RedisServer;
use tokio_util::sync::CancellationToken;

const Q: &str = "slack-batch";

/// The pool: one engine of 8 sequences, 4 ms steps that double when full.
fn pool() -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            pods: 1,
            max_num_seqs: 8,
            inter_token_latency_ms: 4.0,
            time_factor_under_load: 2.0,
            prefill_overhead_ms: 5.0,
            ..EngineConfig::default()
        },
        ..SimConfig::default()
    }
}

/// Interactive p99 TTFT (ms) over the measured phase, and the batch results that landed.
struct Measured {
    ttft_p99: f64,
    batch_done: u64,
}

/// Runs the interactive profile against a fresh pool, beside `inferq run` with `gate` (a pool
/// `slack` gate whose parameters are made from the engine's `/metrics` address) draining a
/// backlog, or alone when `batch` is false.
async fn measure(batch: bool, gate: Option<fn(&str) -> serde_json::Value>) -> Measured {
    let redis = RedisServer::start().unwrap();
    let sim = Sim::start(pool(), "127.0.0.1:0".parse().unwrap())
        .await
        .unwrap();
    let dummy = Gateway::start().await;
    let mut con = con(&redis).await;
    let results = "slack-results";
    let _processor = if batch {
        let producer = inferq_client::producer::Producer::connect(&redis.url(), Q, results)
            .await
            .unwrap();
        let mut backlog = Vec::new();
        for i in 0..2000 {
            backlog.push(request(
                &format!("b{i}"),
                600,
                r#"{"model":"m","max_tokens":48,"messages":[{"role":"user","content":"summarise this"}]}"#,
            ));
        }
        for chunk in backlog.chunks(500) {
            for outcome in producer.submit_many(chunk.to_vec()).await.unwrap() {
                outcome.unwrap();
            }
        }
        let transport = serde_json::json!({
            "url": redis.url(),
            "poll_interval_ms": 50,
            "batch_size": 16,
            "result_queue_name": results,
            "queues": [{"queue_name": Q, "igw_base_url": sim.base_url(),
                        "request_path_url": "/v1/chat/completions"}],
        });
        let mut pool = serde_json::json!({"id": "default", "workers": 24});
        if let Some(params) = gate {
            pool["gate_type"] = "slack".into();
            pool["gate_params"] = params(&format!("{}/metrics", sim.base_url()));
        }
        let opts = ProcessorOpts {
            concurrency: 24,
            pools: Some(serde_json::json!([pool]).to_string()),
            transport_args: Some(vec![
                "--transport".into(),
                "redis-sortedset".into(),
                "--transport-config".into(),
                transport.to_string(),
            ]),
            ..ProcessorOpts::default()
        };
        Some(Processor::start(&redis, &dummy, &opts).await)
    } else {
        None
    };
    let profile = Profile {
        phases: vec![
            Phase::steady("warmup", Duration::from_secs(4), 6.0),
            Phase::steady("load", Duration::from_secs(8), 6.0),
        ],
    };
    let settings = InteractiveSettings {
        max_tokens: 16,
        seed: 11,
        ..InteractiveSettings::default()
    };
    let before: u64 = redis::cmd("LLEN")
        .arg(results)
        .query_async(&mut con)
        .await
        .unwrap();
    let report = interactive::run(
        &sim.base_url(),
        &profile,
        &settings,
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let after: u64 = redis::cmd("LLEN")
        .arg(results)
        .query_async(&mut con)
        .await
        .unwrap();
    let ttft_p99 = load_ttft_p99(&report);
    sim.stop().await;
    Measured {
        ttft_p99,
        batch_done: after - before,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slack_keeps_interactive_latency_while_batch_work_runs() {
    let alone = measure(false, None).await;
    let ungated = measure(true, None).await;
    // Loose: a queued interactive request waits at most until the gate has taken room back.
    let bound = (alone.ttft_p99 * 5.0).max(alone.ttft_p99 + 250.0);
    eprintln!(
        "alone p99 {:.0} ms; ungated p99 {:.0} ms with {} batch results; bound {bound:.0} ms",
        alone.ttft_p99, ungated.ttft_p99, ungated.batch_done
    );
    assert!(
        ungated.ttft_p99 > bound,
        "the bound means something only if ungated batch work breaks it"
    );
    let slack = measure(
        true,
        Some(|page: &str| serde_json::json!({"signal_url": page, "interval": "100ms"})),
    )
    .await;
    eprintln!(
        "slack p99 {:.0} ms with {} batch results",
        slack.ttft_p99, slack.batch_done
    );
    assert!(
        slack.ttft_p99 <= bound,
        "slack let interactive p99 TTFT reach {:.0} ms (alone {:.0} ms, bound {bound:.0} ms)",
        slack.ttft_p99,
        alone.ttft_p99
    );
    assert!(
        slack.batch_done * 5 >= ungated.batch_done,
        "slack completed {} batch requests, under a fifth of ungated's {}",
        slack.batch_done,
        ungated.batch_done
    );
}
