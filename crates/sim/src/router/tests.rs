//! The router's flow control over HTTP: each test starts a real [`Sim`] with `--pods` and
//! `--eviction` on a free local port and talks to it as the router's clients would.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;

use super::{RouterConfig, SaturationDetector};
use crate::{
    EngineConfig, Sim, SimConfig, DROPPED_REASON_HEADER, OBJECTIVE_HEADER, OLD_OBJECTIVE_HEADER,
};

/// One engine of two slots behind a router that evicts, its detector counting requests, with a
/// short grace so the tests need not wait the router's 500 ms.
fn evicting(grace_ms: u64) -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            pods: 1,
            max_num_seqs: 2,
            inter_token_latency_ms: 5.0,
            time_factor_under_load: 1.0,
            prefill_overhead_ms: 0.0,
            prefill_time_per_token_ms: 0.0,
            ..EngineConfig::default()
        },
        router: RouterConfig {
            eviction: true,
            saturation_detector: SaturationDetector::Concurrency,
            confirmation_grace_ms: Some(grace_ms),
            ..RouterConfig::default()
        },
        max_tokens_cap: 10_000,
        ..SimConfig::default()
    }
}

async fn start(cfg: SimConfig) -> Sim {
    Sim::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
}

/// Sends one non-streaming completion of `tokens` tokens, naming `objective` if given.
async fn complete(
    sim_url: String,
    tokens: u64,
    objective: Option<&'static str>,
) -> (reqwest::StatusCode, Option<String>, String, Duration) {
    complete_as(sim_url, tokens, objective, OBJECTIVE_HEADER).await
}

/// [`complete`], naming the objective in `header`.
async fn complete_as(
    sim_url: String,
    tokens: u64,
    objective: Option<&'static str>,
    header: &'static str,
) -> (reqwest::StatusCode, Option<String>, String, Duration) {
    let client = reqwest::Client::new();
    let mut req = client
        .post(format!("{sim_url}/v1/completions"))
        .header("content-type", "application/json")
        .body(json!({"model": "m", "prompt": "hi", "max_tokens": tokens}).to_string());
    if let Some(o) = objective {
        req = req.header(header, o);
    }
    let started = Instant::now();
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let reason = resp
        .headers()
        .get(DROPPED_REASON_HEADER)
        .map(|v| v.to_str().unwrap().to_owned());
    let body = resp.text().await.unwrap();
    (status, reason, body, started.elapsed())
}

/// Waits until the engine runs `n` sequences.
async fn until_running(sim: &Sim, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.pool_snapshot().unwrap().engines[0].running < n {
        assert!(Instant::now() < deadline, "the engine never ran {n}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn metrics(sim: &Sim) -> String {
    reqwest::get(format!("{}/metrics", sim.base_url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_blocked_interactive_request_evicts_the_newest_batch_sequence_with_a_429() {
    let sim = start(evicting(50)).await;
    let url = sim.base_url();
    // 2,000 tokens at 5 ms: 10 s each, far longer than the test. The newer names its
    // objective under the deprecated alias (as inferq and Go send it).
    let older = tokio::spawn(complete(url.clone(), 2_000, Some("batch")));
    until_running(&sim, 1).await;
    let newer = tokio::spawn(complete_as(
        url.clone(),
        2_000,
        Some("batch"),
        OLD_OBJECTIVE_HEADER,
    ));
    until_running(&sim, 2).await;
    let before = metrics(&sim).await;
    assert!(before.contains(
        "llm_d_epp_flow_control_revocations_issued_total{priority=\"0\",inference_pool=\"inferq-sim\"} 0"
    ));
    assert!(before.contains(
        "llm_d_epp_flow_control_revocations_total{outcome=\"confirmed\",inference_pool=\"inferq-sim\"} 0"
    ));

    let (status, _, _, took) = complete(url.clone(), 5, Some("chat")).await;
    assert_eq!(status, 200);
    assert!(took < Duration::from_secs(3), "interactive took {took:?}");

    let (status, reason, body, took) = newer.await.unwrap();
    assert_eq!(status, 429);
    assert_eq!(reason.as_deref(), Some("evicted"));
    assert_eq!(body, "request evicted by flow control");
    assert!(took < Duration::from_secs(5), "the victim waited {took:?}");
    // The older sequence, with more work done, runs on.
    assert!(!older.is_finished());
    assert_eq!(sim.evictions(), 1);
    let after = metrics(&sim).await;
    assert!(after.contains(
        "llm_d_epp_flow_control_revocations_issued_total{priority=\"0\",inference_pool=\"inferq-sim\"} 1"
    ));
    assert!(after.contains(
        "llm_d_epp_flow_control_revocations_total{outcome=\"confirmed\",inference_pool=\"inferq-sim\"} 1"
    ));
    older.abort();
    sim.stop().await;
}

#[tokio::test]
async fn unsheddable_work_is_never_evicted_and_bands_go_in_priority_order() {
    let sim = start(evicting(50)).await;
    let url = sim.base_url();
    // Two interactive sequences fill the engine: nothing may be evicted for a third.
    let a = tokio::spawn(complete(url.clone(), 60, None));
    let b = tokio::spawn(complete(url.clone(), 120, None));
    until_running(&sim, 2).await;
    let timed = |objective| {
        let url = url.clone();
        tokio::spawn(async move {
            let answer = complete(url, 1, Some(objective)).await;
            (answer.0, Instant::now())
        })
    };
    // A batch request queued first still waits behind the interactive one queued after it.
    let batch = timed("batch");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let chat = timed("chat");
    let (chat, batch) = (chat.await.unwrap(), batch.await.unwrap());
    assert_eq!(chat.0, 200);
    assert_eq!(batch.0, 200);
    // The first slot to free (a's) went to the interactive request, though it came later.
    assert!(chat.1 < batch.1);
    assert_eq!(a.await.unwrap().0, 200);
    assert_eq!(b.await.unwrap().0, 200);
    assert_eq!(sim.evictions(), 0);
    sim.stop().await;
}

#[tokio::test]
async fn a_request_waiting_past_its_ttl_is_answered_429_ttl_expired() {
    let mut cfg = evicting(50);
    cfg.router.request_ttl_ms = 100;
    cfg.router.eviction = false;
    cfg.router.priority_bands = true;
    let sim = start(cfg).await;
    let url = sim.base_url();
    let a = tokio::spawn(complete(url.clone(), 200, None));
    let b = tokio::spawn(complete(url.clone(), 200, None));
    until_running(&sim, 2).await;
    let (status, reason, _, took) = complete(url.clone(), 1, Some("chat")).await;
    assert_eq!(status, 429);
    assert_eq!(reason.as_deref(), Some("rejected-ttl-expired"));
    assert!(took >= Duration::from_millis(100));
    a.abort();
    b.abort();
    sim.stop().await;
}
