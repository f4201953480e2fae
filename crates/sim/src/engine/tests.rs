//! End-to-end tests of the engine model: each starts a real [`Sim`] with `--pods` on a free
//! local port and talks to it over HTTP, as a client of a vLLM pool would.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::interactive::{self, InteractiveSettings, Outcome, Phase, Profile};
use crate::{EngineConfig, SaturationMetricNames, Sim, SimConfig, REQUEST_ID_HEADER};

/// A pool of `pods` engines with small, round latencies: no prefill, a flat step unless the
/// test sets a time factor.
fn pool(pods: usize, max_num_seqs: usize, itl_ms: f64) -> SimConfig {
    SimConfig {
        engine: EngineConfig {
            pods,
            max_num_seqs,
            inter_token_latency_ms: itl_ms,
            time_factor_under_load: 1.0,
            prefill_overhead_ms: 0.0,
            prefill_time_per_token_ms: 0.0,
            ..EngineConfig::default()
        },
        max_tokens_cap: 1000,
        ..SimConfig::default()
    }
}

async fn start(cfg: SimConfig) -> Sim {
    Sim::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn chat(max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": "m",
        "messages": [{"role": "user", "content": "Tell me something."}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

async fn send(
    c: &reqwest::Client,
    sim: &Sim,
    body: &Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = c
        .post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(body.to_string());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

/// The events of a streamed answer as they arrive: each `data:` payload with its arrival time.
async fn events(resp: &mut reqwest::Response) -> Vec<(Instant, String)> {
    let mut out = Vec::new();
    let mut buffer = String::new();
    while let Some(bytes) = resp.chunk().await.unwrap() {
        let now = Instant::now();
        buffer.push_str(std::str::from_utf8(&bytes).unwrap());
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap().to_owned();
            out.push((now, data));
        }
    }
    out
}

/// Times of the events that carry a token.
fn token_times(events: &[(Instant, String)]) -> Vec<Instant> {
    events
        .iter()
        .filter(|(_, data)| data != "[DONE]")
        .filter(|(_, data)| {
            let chunk: Value = serde_json::from_str(data).unwrap();
            chunk["choices"].as_array().is_some_and(|c| !c.is_empty())
        })
        .map(|(t, _)| *t)
        .collect()
}

async fn json_of(resp: reqwest::Response) -> Value {
    serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap()
}

fn mean_gap(times: &[Instant]) -> Duration {
    let (first, last) = (times[0], times[times.len() - 1]);
    (last - first) / (times.len() as u32 - 1)
}

async fn metrics(c: &reqwest::Client, sim: &Sim) -> String {
    c.get(format!("{}/metrics", sim.base_url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// Polls `cond` every 5 ms for up to 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// (running, waiting) of each engine.
fn loads(sim: &Sim) -> Vec<(usize, usize)> {
    sim.pool_snapshot()
        .unwrap()
        .engines
        .iter()
        .map(|e| (e.running, e.waiting))
        .collect()
}

#[tokio::test]
async fn a_request_beyond_max_num_seqs_waits_and_its_ttft_includes_the_wait() {
    let sim = start(pool(1, 2, 5.0)).await;
    let c = client();
    let mut first_two = Vec::new();
    for _ in 0..2 {
        let (c, url) = (c.clone(), sim.base_url());
        first_two.push(tokio::spawn(async move {
            let resp = c
                .post(format!("{url}/v1/chat/completions"))
                .header("content-type", "application/json")
                .body(chat(40, false).to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            resp.bytes().await.unwrap();
            Instant::now()
        }));
    }
    eventually("two running", || loads(&sim) == vec![(2, 0)]).await;

    let sent = Instant::now();
    let mut third = send(&c, &sim, &chat(5, true), &[]).await;
    eventually("the third waiting", || loads(&sim) == vec![(2, 1)]).await;
    let text = metrics(&c, &sim).await;
    assert!(
        text.contains("vllm:num_requests_waiting{model_name=\"inferq-sim\",pod=\"engine-0\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("vllm:num_requests_running{model_name=\"inferq-sim\",pod=\"engine-0\"} 2\n")
    );

    let tokens = token_times(&events(&mut third).await);
    assert_eq!(tokens.len(), 5);
    let mut done = Vec::new();
    for task in first_two {
        done.push(task.await.unwrap());
    }
    let first_free = done.iter().min().copied().unwrap();
    // Its first token came only once a running request had finished (40 steps of 5 ms).
    assert!(tokens[0] + Duration::from_millis(5) >= first_free);
    assert!(
        tokens[0] - sent >= Duration::from_millis(120),
        "{:?}",
        tokens[0] - sent
    );
}

#[tokio::test]
async fn steps_slow_down_by_the_time_factor_when_the_batch_is_full() {
    let mut cfg = pool(1, 4, 10.0);
    cfg.engine.time_factor_under_load = 3.0;
    let sim = start(cfg).await;
    let c = client();

    let mut alone = send(&c, &sim, &chat(20, true), &[]).await;
    let alone_gap = mean_gap(&token_times(&events(&mut alone).await));

    let mut others = Vec::new();
    for _ in 0..3 {
        others.push(send(&c, &sim, &chat(200, true), &[]).await);
    }
    eventually("three running", || loads(&sim) == vec![(3, 0)]).await;
    let mut crowded = send(&c, &sim, &chat(20, true), &[]).await;
    let crowded_gap = mean_gap(&token_times(&events(&mut crowded).await));
    drop(others);

    // One sequence: 10 ms a step; four (max-num-seqs): 10 × 3 = 30 ms.
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    assert!((9.0..14.0).contains(&ms(alone_gap)), "alone {alone_gap:?}");
    let ratio = ms(crowded_gap) / ms(alone_gap);
    assert!(
        (2.4..3.4).contains(&ratio),
        "alone {alone_gap:?}, crowded {crowded_gap:?}"
    );
}

#[tokio::test]
async fn usage_matches_max_tokens_and_executions_are_counted() {
    let sim = start(pool(1, 4, 1.0)).await;
    let c = client();
    let resp = send(&c, &sim, &chat(7, false), &[(REQUEST_ID_HEADER, "job-1")]).await;
    assert_eq!(resp.status(), 200);
    let body: Value = json_of(resp).await;
    assert_eq!(body["object"], "chat.completion");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split(' ').count(), 7);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let usage = &body["usage"];
    assert_eq!(usage["completion_tokens"], 7);
    let prompt = usage["prompt_tokens"].as_u64().unwrap();
    assert!(prompt >= 1);
    assert_eq!(usage["total_tokens"].as_u64(), Some(prompt + 7));

    // No max_tokens: --default-tokens; past the cap: the cap.
    let mut cfg = pool(1, 4, 1.0);
    cfg.default_tokens = 3;
    cfg.max_tokens_cap = 5;
    let capped = start(cfg).await;
    let body = c
        .post(format!("{}/v1/completions", capped.base_url()))
        .header("content-type", "application/json")
        .body(json!({"prompt": "p"}).to_string())
        .send()
        .await
        .unwrap();
    let body = json_of(body).await;
    assert_eq!(body["usage"]["completion_tokens"], 3);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    let body = send(&c, &capped, &chat(50, false), &[]).await;
    let body = json_of(body).await;
    assert_eq!(body["usage"]["completion_tokens"], 5);

    assert_eq!(sim.executions().get("job-1"), Some(&1));
    assert_eq!(sim.stats().ok, 1);
}

#[tokio::test]
async fn a_stream_has_one_chunk_per_token_then_usage_then_done() {
    let sim = start(pool(1, 4, 1.0)).await;
    let c = client();

    let mut body = chat(5, true);
    body["stream_options"] = json!({"include_usage": true});
    let mut resp = send(&c, &sim, &body, &[]).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = events(&mut resp).await;
    let data: Vec<&str> = events.iter().map(|(_, d)| d.as_str()).collect();
    assert_eq!(data.len(), 7, "{data:?}");
    assert_eq!(data[6], "[DONE]");
    let chunks: Vec<Value> = data[..6]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks[..5]
        .iter()
        .map(|c| {
            assert_eq!(c["object"], "chat.completion.chunk");
            c["choices"][0]["delta"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(text.split(' ').count(), 5);
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert!(chunks[3]["choices"][0]["finish_reason"].is_null());
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);

    // The completions endpoint, without include_usage: tokens then [DONE].
    let mut resp = c
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(json!({"prompt": "p", "max_tokens": 3, "stream": true}).to_string())
        .send()
        .await
        .unwrap();
    let events = super::tests::events(&mut resp).await;
    assert_eq!(events.len(), 4);
    assert_eq!(events[3].1, "[DONE]");
    let first: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(first["object"], "text_completion");
    assert_eq!(first["choices"][0]["text"], "lorem");
}

#[tokio::test]
async fn a_client_that_goes_away_frees_its_slot_for_the_queue() {
    let sim = start(pool(1, 1, 10.0)).await;
    let c = client();
    // 256 tokens of 10 ms: 2.5 s if it ran to the end.
    let mut long = send(&c, &sim, &chat(256, true), &[]).await;
    long.chunk().await.unwrap();
    let (c2, url) = (c.clone(), sim.base_url());
    let queued = tokio::spawn(async move {
        let sent = Instant::now();
        let resp = c2
            .post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(chat(2, false).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
        sent.elapsed()
    });
    eventually("one waiting", || loads(&sim) == vec![(1, 1)]).await;
    drop(long);
    let took = queued.await.unwrap();
    assert!(took < Duration::from_secs(1), "{took:?}");
    eventually("idle", || loads(&sim) == vec![(0, 0)]).await;
}

#[tokio::test]
async fn requests_go_to_the_least_loaded_engine() {
    let sim = start(pool(2, 4, 10.0)).await;
    let c = client();
    let mut held = Vec::new();
    let expected = [
        vec![(1, 0), (0, 0)],
        vec![(1, 0), (1, 0)],
        vec![(2, 0), (1, 0)],
        vec![(2, 0), (2, 0)],
    ];
    for want in expected {
        held.push(send(&c, &sim, &chat(300, true), &[]).await);
        eventually("placement", || loads(&sim) == want).await;
    }
}

#[tokio::test]
async fn past_max_waiting_the_router_answers_429_rejected_saturated() {
    let mut cfg = pool(1, 1, 10.0);
    cfg.engine.max_waiting = 1;
    cfg.retry_after_s = 3;
    let sim = start(cfg).await;
    let c = client();
    let _running = send(&c, &sim, &chat(300, true), &[]).await;
    eventually("one running", || loads(&sim) == vec![(1, 0)]).await;
    let _waiting = send(&c, &sim, &chat(300, true), &[]).await;
    eventually("one waiting", || loads(&sim) == vec![(1, 1)]).await;

    let refused = send(&c, &sim, &chat(3, false), &[(REQUEST_ID_HEADER, "refused")]).await;
    assert_eq!(refused.status(), 429);
    assert_eq!(
        refused.headers()["x-llm-d-request-dropped-reason"],
        "rejected-saturated"
    );
    assert_eq!(refused.headers()["retry-after"], "3");
    assert!(!sim.executions().contains_key("refused"));
    assert_eq!(sim.stats().rejected_capacity, 1);
}

#[tokio::test]
async fn flow_control_sheds_sheddable_requests_only_while_saturated() {
    let mut cfg = pool(1, 1, 10.0);
    cfg.engine.flow_control = true;
    // A running request fills 80 % of this cache after a few tokens: saturation 1.
    cfg.engine.kv_cache_tokens = Some(20);
    let sim = start(cfg).await;
    let c = client();
    let batch = [("x-llm-d-inference-objective", "batch")];

    let ok = send(&c, &sim, &chat(2, false), &batch).await;
    assert_eq!(ok.status(), 200, "not saturated yet");
    ok.bytes().await.unwrap();

    let _long = send(&c, &sim, &chat(300, true), &[]).await;
    eventually("saturation", || {
        sim.pool_snapshot().unwrap().saturation >= 1.0
    })
    .await;
    let shed = send(&c, &sim, &chat(2, false), &batch).await;
    assert_eq!(shed.status(), 429);
    assert_eq!(
        shed.headers()["x-llm-d-request-dropped-reason"],
        "rejected-saturated"
    );
    assert!(shed.headers().contains_key("retry-after"));

    let interactive = [("x-llm-d-inference-objective", "chat")];
    let queued = send(&c, &sim, &chat(2, true), &interactive).await;
    assert_eq!(queued.status(), 200);
    eventually("the non-sheddable one queued", || {
        loads(&sim) == vec![(1, 1)]
    })
    .await;
}

#[tokio::test]
async fn the_saturation_gauge_is_exported_under_the_chosen_names() {
    let c = client();
    let new =
        "llm_d_epp_flow_control_pool_saturation{inference_pool=\"pool-a\",stage=\"effective\"} ";
    let old = "inference_extension_flow_control_pool_saturation{inference_pool=\"pool-a\"} ";
    for (names, want_new, want_old) in [
        (SaturationMetricNames::New, true, false),
        (SaturationMetricNames::Old, false, true),
        (SaturationMetricNames::Both, true, true),
    ] {
        let mut cfg = pool(2, 4, 1.0);
        cfg.engine.saturation_metric_names = names;
        cfg.engine.inference_pool = "pool-a".into();
        let sim = start(cfg).await;
        let text = metrics(&c, &sim).await;
        assert_eq!(text.contains(new), want_new, "{names:?}: {text}");
        assert_eq!(text.contains(old), want_old, "{names:?}: {text}");
        // Idle: 0.
        assert!(!want_new || text.contains(&format!("{new}0\n")));
    }
}

#[tokio::test]
async fn latency_histograms_count_each_request_per_pod() {
    let sim = start(pool(2, 4, 1.0)).await;
    let c = client();
    send(&c, &sim, &chat(4, false), &[])
        .await
        .bytes()
        .await
        .unwrap();
    let text = metrics(&c, &sim).await;
    let pod0 = "{model_name=\"inferq-sim\",pod=\"engine-0\"}";
    let pod1 = "{model_name=\"inferq-sim\",pod=\"engine-1\"}";
    assert!(
        text.contains(&format!("vllm:time_to_first_token_seconds_count{pod0} 1\n")),
        "{text}"
    );
    assert!(text.contains(&format!("vllm:inter_token_latency_seconds_count{pod0} 3\n")));
    assert!(text.contains(&format!("vllm:e2e_request_latency_seconds_count{pod0} 1\n")));
    assert!(text.contains(&format!("vllm:e2e_request_latency_seconds_count{pod1} 0\n")));
    assert!(text.contains(&format!("vllm:kv_cache_usage_perc{pod1} 0\n")));
    // One family, one TYPE line, even though the fixed-latency page had its own.
    assert_eq!(
        text.matches("# TYPE vllm:num_requests_running gauge")
            .count(),
        1
    );
}

#[tokio::test]
async fn pods_cannot_be_combined_with_the_capacity_gate() {
    let mut cfg = pool(1, 4, 1.0);
    cfg.capacity = 2;
    let err = Sim::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("--capacity"), "{err}");
}

#[tokio::test]
async fn the_generator_reports_each_phase_and_sees_ttft_rise_when_the_pool_is_full() {
    let sim = start(pool(1, 4, 2.0)).await;
    let phase = Duration::from_millis(600);
    let profile = Profile {
        phases: vec![
            Phase::steady("calm", phase, 30.0),
            Phase::steady("crowded", phase, 30.0),
        ],
    };
    let settings = InteractiveSettings {
        max_tokens: 5,
        grace: Duration::from_secs(5),
        ..InteractiveSettings::default()
    };
    // From the second phase on, 8 long requests hold the 4 slots (300 steps of 2 ms each, two
    // rounds) and the interactive ones queue behind them.
    let (c, url) = (client(), sim.base_url());
    let crowd = tokio::spawn(async move {
        tokio::time::sleep(phase).await;
        let mut held = Vec::new();
        for _ in 0..8 {
            let (c, url) = (c.clone(), url.clone());
            held.push(tokio::spawn(async move {
                let resp = c
                    .post(format!("{url}/v1/chat/completions"))
                    .header("content-type", "application/json")
                    .body(chat(300, false).to_string())
                    .send()
                    .await
                    .unwrap();
                resp.bytes().await.unwrap();
            }));
        }
        for task in held {
            task.await.unwrap();
        }
    });
    let report = interactive::run(
        &sim.base_url(),
        &profile,
        &settings,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    crowd.await.unwrap();

    let calm = report.phase("calm#1").unwrap();
    let crowded = report.phase("crowded#1").unwrap();
    for p in [calm, crowded] {
        // 30/s for 0.6 s: 18 expected.
        assert!((8..=30).contains(&p.count), "{p:?}");
        assert_eq!(p.ok, p.count, "{p:?}");
        assert!(p.failures.is_empty() && p.unfinished == 0, "{p:?}");
    }
    let calm_ttft = calm.ttft_ms.unwrap();
    let crowded_ttft = crowded.ttft_ms.unwrap();
    assert!(calm_ttft.p50 < 60.0, "{calm:?}");
    assert!(
        crowded_ttft.p50 > calm_ttft.p50 + 100.0,
        "calm {calm:?}, crowded {crowded:?}"
    );
    // Interactive ITL: 5 tokens, steps of 2 ms.
    assert!(calm.itl_ms.unwrap().p50 < 20.0, "{calm:?}");
    assert_eq!(report.samples.len(), calm.count + crowded.count);
    assert!(report
        .samples
        .iter()
        .all(|s| s.outcome == Outcome::Ok && s.sent_at_ms < 1300.0));
}

#[tokio::test]
async fn the_generator_stops_after_its_grace_and_reports_the_rest_unfinished() {
    // One slot, 10 ms steps, 300 tokens: each request takes 3 s, far past the grace.
    let sim = start(pool(1, 1, 10.0)).await;
    let profile = Profile {
        phases: vec![Phase::steady("burst", Duration::from_millis(200), 20.0)],
    };
    let settings = InteractiveSettings {
        max_tokens: 300,
        grace: Duration::from_millis(200),
        ..InteractiveSettings::default()
    };
    let started = Instant::now();
    let report = interactive::run(
        &sim.base_url(),
        &profile,
        &settings,
        tokio_util::sync::CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    let burst = report.phase("burst#1").unwrap();
    assert!(burst.count >= 1, "{burst:?}");
    assert_eq!(burst.unfinished, burst.count, "{burst:?}");
    // The cut requests let go of the engine.
    eventually("idle", || loads(&sim) == vec![(0, 0)]).await;
}
