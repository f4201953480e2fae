//! End-to-end tests of the simulator: each starts a real [`Sim`] on a free local port and talks
//! to it over HTTP with reqwest, as the processor would.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use super::*;

fn any_port() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

async fn start(cfg: SimConfig) -> Sim {
    Sim::start(cfg, any_port()).await.unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}

fn to_body(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

fn from_body(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap()
}

fn completion(max_tokens: Option<u64>) -> Value {
    let mut body = json!({"model": "tiny-llm", "prompt": "Say something."});
    if let Some(n) = max_tokens {
        body["max_tokens"] = json!(n);
    }
    body
}

async fn post(c: &reqwest::Client, sim: &Sim, id: Option<&str>) -> reqwest::Response {
    let mut req = c
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&completion(Some(4))));
    if let Some(id) = id {
        req = req.header(REQUEST_ID_HEADER, id);
    }
    req.send().await.unwrap()
}

async fn get_json(c: &reqwest::Client, url: String) -> Value {
    c.get(url)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| from_body(&b))
        .unwrap()
}

async fn get_text(c: &reqwest::Client, url: String) -> String {
    c.get(url).send().await.unwrap().text().await.unwrap()
}

/// Polls `cond` every 10 ms for up to 10 s.
async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn assert_openai_error(body: &Value, kind: &str) {
    assert_eq!(body["error"]["type"], kind, "{body}");
    assert!(body["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test]
async fn completions_answer_in_openai_shape_and_echo_the_model() {
    let sim = start(SimConfig::instant()).await;
    let c = client();

    let resp = c
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&completion(Some(5))))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.bytes().await.map(|b| from_body(&b)).unwrap();
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], "tiny-llm");
    assert!(body["id"]
        .as_str()
        .is_some_and(|id| id.starts_with("cmpl-")));
    assert!(body["created"].as_u64().is_some_and(|t| t > 1_600_000_000));
    let text = body["choices"][0]["text"].as_str().unwrap();
    assert_eq!(text.split(' ').count(), 5);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["completion_tokens"], 5);
    let usage = &body["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64(),
        Some(usage["prompt_tokens"].as_u64().unwrap() + 5)
    );

    let resp = c
        .post(format!("{}/v1/chat/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(
            &json!({"model": "chatty", "messages": [{"role": "user", "content": "hi"}]}),
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.bytes().await.map(|b| from_body(&b)).unwrap();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "chatty");
    assert_eq!(body["choices"][0]["message"]["role"], "assistant");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    // No max_tokens: the default number of tokens.
    assert_eq!(
        body["usage"]["completion_tokens"],
        config::DEFAULT_OUTPUT_TOKENS
    );
    sim.stop().await;
}

#[tokio::test]
async fn max_tokens_is_capped() {
    let sim = start(SimConfig {
        max_tokens_cap: 8,
        ..SimConfig::instant()
    })
    .await;
    let body: Value = client()
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&completion(Some(1000))))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| from_body(&b))
        .unwrap();
    assert_eq!(body["usage"]["completion_tokens"], 8);
    assert_eq!(body["choices"][0]["finish_reason"], "stop");
    sim.stop().await;
}

#[tokio::test]
async fn a_long_context_prompt_of_several_megabytes_is_answered() {
    let sim = start(SimConfig::instant()).await;
    let prompt = "word ".repeat(2_000_000);
    let body = json!({"model": "tiny-llm", "max_tokens": 4, "prompt": prompt});
    let resp = client()
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&body))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer = from_body(&resp.bytes().await.unwrap());
    assert_eq!(answer["usage"]["prompt_tokens"], 2_500_001);
    sim.stop().await;
}

#[tokio::test]
async fn bad_bodies_unknown_paths_and_health() {
    let sim = start(SimConfig::instant()).await;
    let c = client();
    let url = sim.base_url();

    let resp = c
        .post(format!("{url}/v1/chat/completions"))
        .body("this is not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_openai_error(
        &resp.bytes().await.map(|b| from_body(&b)).unwrap(),
        "invalid_request_error",
    );

    let resp = c.get(format!("{url}/v2/nothing")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    assert_openai_error(
        &resp.bytes().await.map(|b| from_body(&b)).unwrap(),
        "invalid_request_error",
    );

    let resp = c.get(format!("{url}/healthz")).send().await.unwrap();
    assert_eq!(resp.status(), 200);

    let models = get_json(&c, format!("{url}/v1/models")).await;
    assert_eq!(models["data"][0]["id"], config::DEFAULT_MODEL_NAME);

    // Malformed bodies never reach the run stage.
    assert_eq!(sim.stats().executed, 0);
    assert_eq!(sim.stats().bad_request, 1);
    sim.stop().await;
}

#[tokio::test]
async fn latency_knobs_delay_the_answer() {
    let sim = start(SimConfig {
        ttft_ms: 100,
        per_token_ms: 10.0,
        ..SimConfig::default()
    })
    .await;
    let c = client();
    let started = Instant::now();
    let resp = c
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&completion(Some(5))))
        .send()
        .await
        .unwrap();
    let elapsed = started.elapsed();
    assert_eq!(resp.status(), 200);
    assert!(elapsed >= Duration::from_millis(150), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    sim.stop().await;

    let sim = start(SimConfig {
        slow_rate: 1.0,
        slow_ms: 200,
        ..SimConfig::instant()
    })
    .await;
    let started = Instant::now();
    assert_eq!(post(&c, &sim, None).await.status(), 200);
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(200), "{elapsed:?}");
    assert!(elapsed < Duration::from_secs(2), "{elapsed:?}");
    assert_eq!(sim.stats().slow, 1);
    sim.stop().await;
}

/// How long a request of a [`holding`] simulator runs: far longer than a stall of a loaded
/// machine, so it still holds its slot while the test goes on; the test ends it with [`leave`].
const HOLD_MS: u64 = 5_000;

/// A simulator whose requests run for [`HOLD_MS`]. The slow fault makes them slow, so
/// `set_faults(FaultRates::default())` has the requests that arrive after it answer at once.
fn holding() -> SimConfig {
    SimConfig {
        slow_rate: 1.0,
        slow_ms: HOLD_MS,
        ..SimConfig::instant()
    }
}

/// Ends requests started by [`occupy`] that are still running, by their clients leaving (which
/// drops their handlers and frees their slots), and checks that none had ended on its own.
async fn leave(tasks: Vec<tokio::task::JoinHandle<u16>>) {
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        let end = task.await;
        assert!(
            end.as_ref().is_err_and(|e| e.is_cancelled()),
            "a request that was to be still running had ended: {end:?}"
        );
    }
}

/// Starts `n` requests that will keep running for a while, in the background.
fn occupy(sim: &Sim, c: &reqwest::Client, n: usize) -> Vec<tokio::task::JoinHandle<u16>> {
    (0..n)
        .map(|_| {
            let req = c
                .post(format!("{}/v1/completions", sim.base_url()))
                .header("content-type", "application/json")
                .body(to_body(&completion(Some(1))));
            tokio::spawn(async move { req.send().await.map_or(0, |r| r.status().as_u16()) })
        })
        .collect()
}

#[tokio::test]
async fn capacity_turns_excess_requests_away_with_retry_after() {
    let sim = start(SimConfig {
        capacity: 2,
        retry_after_s: 3,
        ..holding()
    })
    .await;
    let c = client();
    let busy = occupy(&sim, &c, 2);
    eventually("two running", || sim.stats().running == 2).await;

    let resp = post(&c, &sim, Some("late")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("3")
    );
    assert_openai_error(
        &resp.bytes().await.map(|b| from_body(&b)).unwrap(),
        "rate_limit_error",
    );

    // Slots are free again once the runners end (their clients leave).
    sim.set_faults(FaultRates::default()).unwrap();
    leave(busy).await;
    eventually("the runners to end", || sim.stats().running == 0).await;
    assert_eq!(post(&c, &sim, Some("later")).await.status(), 200);
    let stats = sim.stats();
    assert_eq!(stats.rejected_capacity, 1);
    assert_eq!(stats.max_running_seen, 2);
    assert_eq!(sim.executions().get("late"), None);
    sim.stop().await;
}

#[tokio::test]
async fn queue_holds_requests_until_a_slot_frees() {
    let sim = start(SimConfig {
        capacity: 1,
        queue: 1,
        ..holding()
    })
    .await;
    let c = client();
    let first = occupy(&sim, &c, 1);
    eventually("one running", || sim.stats().running == 1).await;
    // The queued request answers at once when it gets the slot.
    sim.set_faults(FaultRates::default()).unwrap();
    let queued = occupy(&sim, &c, 1);
    eventually("one waiting", || sim.stats().waiting == 1).await;

    let metrics = get_text(&c, format!("{}/metrics", sim.base_url())).await;
    assert!(metrics.contains("vllm:num_requests_waiting{model_name=\"inferq-sim\"} 1"));

    assert_eq!(post(&c, &sim, None).await.status(), 429);
    // The running request ends (its client leaves): the queued one takes the slot.
    leave(first).await;
    for task in queued {
        assert_eq!(task.await.unwrap(), 200);
    }
    let stats = sim.stats();
    assert_eq!(
        (
            stats.executed,
            stats.ok,
            stats.waiting,
            stats.max_running_seen
        ),
        (2, 1, 0, 1)
    );
    sim.stop().await;
}

#[tokio::test]
async fn error_fault_answers_5xx_with_a_body() {
    let sim = start(SimConfig {
        error_rate: 1.0,
        ..SimConfig::instant()
    })
    .await;
    let resp = post(&client(), &sim, Some("e")).await;
    let status = resp.status().as_u16();
    assert!(status == 500 || status == 503, "{status}");
    let body: Value = resp.bytes().await.map(|b| from_body(&b)).unwrap();
    assert!(body["error"]["message"].is_string());
    // A faulted run is still an execution.
    assert_eq!(sim.executions().get("e"), Some(&1));
    assert_eq!(sim.stats().server_error, 1);
    sim.stop().await;
}

#[tokio::test]
async fn rate_limit_fault_answers_429_and_executes_nothing() {
    let sim = start(SimConfig {
        rate_limit_rate: 1.0,
        ..SimConfig::instant()
    })
    .await;
    let resp = post(&client(), &sim, Some("r")).await;
    assert_eq!(resp.status(), 429);
    assert_eq!(
        resp.headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_openai_error(
        &resp.bytes().await.map(|b| from_body(&b)).unwrap(),
        "rate_limit_error",
    );
    assert!(sim.executions().is_empty());
    assert_eq!((sim.total_requests(), sim.stats().executed), (1, 0));
    sim.stop().await;
}

#[tokio::test]
async fn bad_request_fault_answers_400() {
    let sim = start(SimConfig {
        bad_request_rate: 1.0,
        ..SimConfig::instant()
    })
    .await;
    let resp = post(&client(), &sim, Some("b")).await;
    assert_eq!(resp.status(), 400);
    assert_openai_error(
        &resp.bytes().await.map(|b| from_body(&b)).unwrap(),
        "invalid_request_error",
    );
    assert_eq!(sim.executions().get("b"), Some(&1));
    sim.stop().await;
}

/// Whether the error chain bottoms out in an OS-level connection reset (not, say, a clean
/// close before the response).
fn is_connection_reset(err: &reqwest::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionReset;
        }
        source = e.source();
    }
    false
}

#[tokio::test]
async fn reset_fault_is_a_connection_error_not_a_status() {
    let sim = start(SimConfig {
        reset_rate: 1.0,
        ..SimConfig::instant()
    })
    .await;
    let c = client();
    // Twice on one pooled client: a reset must not poison later requests either.
    for _ in 0..2 {
        let err = c
            .post(format!("{}/v1/completions", sim.base_url()))
            .header(REQUEST_ID_HEADER, "x")
            .header("content-type", "application/json")
            .body(to_body(&completion(Some(1))))
            .send()
            .await
            .expect_err("a reset connection must not produce a response");
        assert!(err.status().is_none(), "{err:?}");
        assert!(!err.is_timeout(), "{err:?}");
        assert!(is_connection_reset(&err), "{err:?}");
    }
    assert_eq!(sim.stats().resets, 2);
    assert_eq!(sim.executions().get("x"), Some(&2));
    // The server itself is unharmed.
    let health = c.get(format!("{}/healthz", sim.base_url())).send().await;
    assert_eq!(health.unwrap().status(), 200);
    sim.stop().await;
}

#[tokio::test]
async fn hang_fault_holds_until_the_client_gives_up() {
    let sim = start(SimConfig {
        hang_rate: 1.0,
        ..SimConfig::instant()
    })
    .await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Instant::now();
    let err = impatient
        .post(format!("{}/v1/completions", sim.base_url()))
        .header("content-type", "application/json")
        .body(to_body(&completion(Some(1))))
        .send()
        .await
        .expect_err("a hung request must not be answered");
    assert!(err.is_timeout(), "{err:?}");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(sim.stats().hangs, 1);
    // The client closed its connection: the hanging handler is dropped, not leaked.
    eventually("the hang to end", || {
        let s = sim.stats();
        s.hanging == 0 && s.running == 0
    })
    .await;

    // A hang still open at stop time is ended by the stop.
    let c = client();
    let pending = occupy(&sim, &c, 1);
    eventually("a new hang", || sim.stats().hanging == 1).await;
    let stopping = Instant::now();
    sim.stop().await;
    assert!(stopping.elapsed() < Duration::from_secs(3));
    for task in pending {
        assert_eq!(task.await.unwrap(), 503);
    }
}

#[tokio::test]
async fn executions_are_counted_per_request_id() {
    let sim = start(SimConfig::instant()).await;
    let c = client();
    for id in ["a", "a", "b", "a"] {
        assert_eq!(post(&c, &sim, Some(id)).await.status(), 200);
    }
    assert_eq!(post(&c, &sim, None).await.status(), 200);

    let over_http = get_json(&c, format!("{}/executions", sim.base_url())).await;
    assert_eq!(over_http, json!({"a": 3, "b": 1}));
    let direct = sim.executions();
    assert_eq!((direct["a"], direct["b"], direct.len()), (3, 1, 2));
    assert_eq!(sim.total_requests(), 5);

    let stats = get_json(&c, format!("{}/stats", sim.base_url())).await;
    assert_eq!(stats["requests"], 5);
    assert_eq!(stats["executed"], 5);
    assert_eq!(stats["ok"], 5);
    assert_eq!(stats["running"], 0);
    for field in [
        "too_many_requests",
        "server_error",
        "resets",
        "hangs",
        "waiting",
    ] {
        assert_eq!(stats[field], 0, "{field}");
    }
    sim.stop().await;
}

/// Sends one `POST /v1/completions` on `stream` (HTTP/1.1, kept alive) and reads the answer
/// through its `content-length`; returns the status code. Raw, so the test decides exactly
/// which connection each request rides on.
async fn post_on(stream: &mut tokio::io::BufReader<tokio::net::TcpStream>) -> u16 {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
    let body = to_body(&completion(Some(2)));
    let head = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    stream.get_mut().write_all(head.as_bytes()).await.unwrap();
    stream.get_mut().write_all(&body).await.unwrap();
    let mut status = String::new();
    stream.read_line(&mut status).await.unwrap();
    let code = status.split(' ').nth(1).unwrap().parse().unwrap();
    let mut length = 0;
    loop {
        let mut line = String::new();
        stream.read_line(&mut line).await.unwrap();
        let line = line.trim_end().to_ascii_lowercase();
        if line.is_empty() {
            break;
        }
        if let Some(n) = line.strip_prefix("content-length:") {
            length = n.trim().parse().unwrap();
        }
    }
    let mut answer = vec![0; length];
    stream.read_exact(&mut answer).await.unwrap();
    code
}

#[tokio::test]
async fn accepted_connections_are_counted_not_requests() {
    let sim = start(SimConfig::instant()).await;
    let connect = || async {
        tokio::io::BufReader::new(
            tokio::net::TcpStream::connect(sim.local_addr())
                .await
                .unwrap(),
        )
    };
    assert_eq!(sim.stats().connections_accepted, 0);

    // Two requests kept alive on one connection: one connection.
    let mut first = connect().await;
    assert_eq!(post_on(&mut first).await, 200);
    assert_eq!(post_on(&mut first).await, 200);
    let stats = sim.stats();
    assert_eq!((stats.requests, stats.connections_accepted), (2, 1));

    // A second client connection, while the first stays open: two.
    let mut second = connect().await;
    assert_eq!(post_on(&mut second).await, 200);
    assert_eq!(post_on(&mut first).await, 200);
    let stats = sim.stats();
    assert_eq!((stats.requests, stats.connections_accepted), (4, 2));

    // A connection that never sends a request counts as well (it was accepted).
    let _silent = connect().await;
    eventually("the silent connection counted", || {
        sim.stats().connections_accepted == 3
    })
    .await;

    // Served by /stats and /metrics (the reqwest client's own connection makes it 4).
    let c = client();
    let stats = get_json(&c, format!("{}/stats", sim.base_url())).await;
    assert_eq!(stats["connections_accepted"], 4, "{stats}");
    let metrics = get_text(&c, format!("{}/metrics", sim.base_url())).await;
    let line = metrics
        .lines()
        .find(|l| l.starts_with("inferq_sim_connections_accepted_total{"))
        .unwrap_or_else(|| panic!("no connection counter in:\n{metrics}"));
    let count: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((4..=5).contains(&count), "{line}");
    sim.stop().await;
}

#[tokio::test]
async fn metrics_expose_vllm_gauges_that_follow_running_requests() {
    let sim = start(SimConfig {
        served_model_name: "sim-7b".into(),
        ..holding()
    })
    .await;
    let c = client();
    let metrics_url = format!("{}/metrics", sim.base_url());
    let scrape = || async {
        let resp = c.get(&metrics_url).send().await.unwrap();
        assert!(resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|ct| ct.starts_with("text/plain")));
        resp.text().await.unwrap()
    };

    let idle = scrape().await;
    assert!(idle.contains("# TYPE vllm:num_requests_running gauge"));
    assert!(idle.contains("vllm:num_requests_running{model_name=\"sim-7b\"} 0"));
    assert!(idle.contains("vllm:num_requests_waiting{model_name=\"sim-7b\"} 0"));

    let busy = occupy(&sim, &c, 3);
    eventually("three running", || sim.stats().running == 3).await;
    assert!(scrape()
        .await
        .contains("vllm:num_requests_running{model_name=\"sim-7b\"} 3"));

    // They end (their clients leave); three more run to the end.
    sim.set_faults(FaultRates::default()).unwrap();
    leave(busy).await;
    for task in occupy(&sim, &c, 3) {
        assert_eq!(task.await.unwrap(), 200);
    }
    eventually("none running", || sim.stats().running == 0).await;
    let done = scrape().await;
    assert!(done.contains("vllm:num_requests_running{model_name=\"sim-7b\"} 0"));
    assert!(done.contains(
        "vllm:request_success_total{model_name=\"sim-7b\",finished_reason=\"length\"} 3"
    ));
    sim.stop().await;
}

#[tokio::test]
async fn invalid_knobs_are_refused_at_start() {
    let err = Sim::start(
        SimConfig {
            reset_rate: 1.5,
            ..SimConfig::default()
        },
        any_port(),
    )
    .await
    .expect_err("a rate above 1 must be refused");
    assert!(
        matches!(
            err,
            SimError::InvalidKnob {
                knob: "reset-rate",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("--reset-rate"));
}

#[tokio::test]
async fn stop_closes_the_port() {
    let sim = start(SimConfig::instant()).await;
    let c = client();
    assert_eq!(post(&c, &sim, None).await.status(), 200);
    let url = sim.base_url();
    sim.stop().await;
    let after = reqwest::Client::new()
        .get(format!("{url}/healthz"))
        .send()
        .await;
    assert!(after.is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_keep_alive_requests_all_succeed() {
    let sim = start(SimConfig::default()).await;
    let c = client();
    let started = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|worker| {
            let c = c.clone();
            let url = format!("{}/v1/completions", sim.base_url());
            tokio::spawn(async move {
                for i in 0..8 {
                    let resp = c
                        .post(&url)
                        .header(REQUEST_ID_HEADER, format!("w{worker}-{i}"))
                        .body(to_body(&completion(None)))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200);
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    // 8 rounds of ~36 ms each with default knobs; generous bound.
    assert!(started.elapsed() < Duration::from_secs(5));
    let executions = sim.executions();
    assert_eq!(executions.len(), 512);
    assert!(executions.values().all(|&n| n == 1));
    assert!(sim.stats().max_running_seen >= 16);
    sim.stop().await;
}

/// Throughput with zero latency: `cargo test --release --lib sim::tests::throughput -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn throughput() {
    let sim = start(SimConfig::instant()).await;
    let c = reqwest::Client::new();
    let per_worker = 2_000;
    let workers = 64;
    let started = Instant::now();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let c = c.clone();
            let url = format!("{}/v1/completions", sim.base_url());
            tokio::spawn(async move {
                for i in 0..per_worker {
                    let resp = c
                        .post(&url)
                        .header(REQUEST_ID_HEADER, format!("{w}-{i}"))
                        .header("content-type", "application/json")
                        .body(to_body(&completion(Some(16))))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(resp.status(), 200);
                    resp.bytes().await.unwrap();
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    let n = (per_worker * workers) as f64;
    let secs = started.elapsed().as_secs_f64();
    println!("{n} requests in {secs:.2}s = {:.0} req/s", n / secs);
    sim.stop().await;
}

#[tokio::test]
async fn fault_rates_switch_at_run_time_over_http_and_in_process() {
    let sim = start(SimConfig::instant()).await;
    let c = client();
    let url = format!("{}/faults", sim.base_url());
    assert_eq!(post(&c, &sim, Some("a")).await.status(), 200);

    let set = c
        .post(&url)
        .body(r#"{"error_rate": 1.0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), 200);
    assert_eq!(from_body(&set.bytes().await.unwrap())["error_rate"], 1.0);
    assert!(post(&c, &sim, Some("a")).await.status().is_server_error());
    assert_eq!(get_json(&c, url.clone()).await["error_rate"], 1.0);

    // A bad rate is refused with the knob's name, and the old rates stay in force.
    let bad = c
        .post(&url)
        .body(r#"{"hang_rate": 2.0}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let body = from_body(&bad.bytes().await.unwrap());
    assert!(body.to_string().contains("hang-rate"), "{body}");
    assert_eq!(sim.faults().error_rate, 1.0);
    let unknown = c
        .post(&url)
        .body(r#"{"eror_rate": 1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 400);

    sim.set_faults(FaultRates::default()).unwrap();
    assert_eq!(post(&c, &sim, Some("a")).await.status(), 200);
    let times = sim.execution_times();
    assert_eq!(times["a"].len(), 3);
    sim.stop().await;
}

#[tokio::test]
async fn arrivals_are_served_per_id_with_a_prefix_filter() {
    let sim = start(SimConfig::instant()).await;
    let c = client();
    for id in ["run-a", "run-a", "other"] {
        assert_eq!(post(&c, &sim, Some(id)).await.status(), 200);
    }
    let url = format!("{}/arrivals?prefix=run-", sim.base_url());
    let body: Value = from_body(&c.get(&url).send().await.unwrap().bytes().await.unwrap());
    let times = body["run-a"].as_array().unwrap();
    assert_eq!(times.len(), 2);
    assert!(times[0].as_u64().unwrap() <= times[1].as_u64().unwrap());
    assert!(body.get("other").is_none());
    assert_eq!(sim.arrivals("").len(), 2);
    sim.stop().await;
}

/// A simulator serving for days keeps the execution times of at most `--remember-ids` ids: the
/// ids seen first are forgotten, and `/stats` says how many, so a reader of `/executions`
/// knows it no longer names every id.
#[tokio::test]
async fn only_the_newest_ids_are_remembered() {
    let sim = start(SimConfig {
        remember_ids: 64,
        ..SimConfig::instant()
    })
    .await;
    let c = client();
    for i in 0..300 {
        assert_eq!(post(&c, &sim, Some(&format!("r-{i}"))).await.status(), 200);
    }
    let executions = get_json(&c, format!("{}/executions", sim.base_url())).await;
    let kept = executions.as_object().unwrap().len() as u64;
    assert!(kept <= 64, "{kept} ids kept");
    assert_eq!(executions["r-299"], 1, "the newest id is kept");
    let stats = get_json(&c, format!("{}/stats", sim.base_url())).await;
    assert_eq!(stats["forgotten_ids"].as_u64(), Some(300 - kept));
    assert_eq!(stats["executed"], 300, "counted, though forgotten");
    sim.stop().await;
}
