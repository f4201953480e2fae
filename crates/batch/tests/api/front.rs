//! The front door, the router's `async-broker` contract, against a real deployment: Redis, the
//! simulator, `inferq run` and two `inferq batch-api` replicas (see [`crate::common`]), plus a
//! gateway of the test's own that answers with what it received (to see what a live request
//! carried). Each test drives it over raw HTTP as a client of the router's step would, and
//! reads Redis to check the router's layout.

use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::common::{until, Deployment, Fallible};

fn chat(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4})
}

/// A deployment of one processor and two replicas over a simulator of `ttft_ms` latency.
async fn deployment(ttft_ms: u64, extra: &[&str]) -> Fallible<Deployment> {
    let mut d = Deployment::start(ttft_ms).await?;
    d.extra_flags = extra.iter().map(|s| s.to_string()).collect();
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    Ok(d)
}

/// Writes `text` as the replicas' `--broker-config` (added to the flags of replicas started
/// after).
fn broker_config(d: &mut Deployment, text: &str) -> Fallible {
    let path = d.dir.path().join("broker.yaml");
    std::fs::write(&path, text)?;
    d.extra_flags
        .extend(["--broker-config".to_owned(), path.display().to_string()]);
    Ok(())
}

/// Adds a queue `echo-q` whose gateway is `echo` to the transport config.
fn add_echo_queue(d: &Deployment, echo: &str) -> Fallible {
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&d.config)?)?;
    if let Some(q) = config["queues"].as_array_mut() {
        q.push(json!({"queue_name": "echo-q", "igw_base_url": echo}));
    }
    std::fs::write(&d.config, config.to_string())?;
    Ok(())
}

pub(crate) struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
}

impl Answer {
    pub(crate) fn id(&self) -> String {
        self.headers
            .get("x-request-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    }
}

pub(crate) async fn post(url: &str, headers: &[(&str, &str)], body: &Value) -> Fallible<Answer> {
    post_raw(url, headers, body.to_string().into_bytes()).await
}

async fn post_raw(url: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Fallible<Answer> {
    let mut r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await?;
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await?;
    let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok(Answer {
        status,
        headers,
        body,
    })
}

pub(crate) async fn get(url: &str, headers: &[(&str, &str)]) -> Fallible<(u16, Value)> {
    let mut r = reqwest::Client::new().get(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    ))
}

async fn delete(url: &str, headers: &[(&str, &str)]) -> Fallible<u16> {
    let mut r = reqwest::Client::new().delete(url);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    Ok(r.send().await?.status().as_u16())
}

/// The front door's and the router's keys in Redis now (markers, mailboxes, join keys, and
/// the queue's members).
async fn front_keys(d: &Deployment) -> Fallible<Vec<String>> {
    let mut con = d.redis.connection().await?;
    let mut out = Vec::new();
    for pattern in ["request-*", "results:req:*", "inferq-front:*", "quota:*"] {
        let keys: Vec<String> = con.keys(pattern).await?;
        out.extend(keys);
    }
    let members: Vec<String> = con.zrange("batch-q", 0, -1).await?;
    out.extend(members);
    Ok(out)
}

/// A gateway that answers each POST with what it received: `{"object":"echo","path","headers",
/// "body"}`, after `x-echo-delay-ms`; a body with `stream: true` is answered as three SSE chunks
/// 100 ms apart. Its base URL.
async fn echo_gateway() -> Fallible<String> {
    async fn echo(uri: axum::http::Uri, headers: HeaderMap, body: Bytes) -> Response {
        if let Some(ms) = headers
            .get("x-echo-delay-ms")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
        {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let seen: serde_json::Map<String, Value> = headers
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or_default())))
            .collect();
        if body["stream"] == json!(true) {
            let chunks = futures::stream::unfold(0, |n| async move {
                if n > 3 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                let line = if n == 3 {
                    "data: [DONE]\n\n".to_owned()
                } else {
                    format!(
                        "data: {}\n\n",
                        json!({"object": "chat.completion.chunk", "n": n})
                    )
                };
                Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), n + 1))
            });
            return (
                [("content-type", "text/event-stream")],
                Body::from_stream(chunks),
            )
                .into_response();
        }
        axum::Json(
            json!({"object": "echo", "path": uri.to_string(), "headers": seen, "body": body}),
        )
        .into_response()
    }
    let app = axum::Router::new().fallback(axum::routing::post(echo));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok(url)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_header_is_served_live_and_passthrough_is_classified_and_stamped() -> Fallible {
    let echo = echo_gateway().await?;
    let mut d = Deployment::start(5).await?;
    add_echo_queue(&d, &echo)?;
    broker_config(
        &mut d,
        "default_queue: batch-q\nroutes:\n  - {model: e, queue: echo-q, tier: interactive}\n\
         objectives:\n  interactive: {reserved: int-reserved, overflow: int-overflow}\n\
         quota:\n  limits: {acme: 1}\n",
    )?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let url = format!("{}/chat/completions?probe=1", d.url(0));
    let body = json!({"model": "e", "messages": []});
    // No X-AP-Mode: untouched, the client's own objective header included, nothing in Redis.
    let live = post(
        &url,
        &[("x-llm-d-inference-objective", "mine"), ("x-team", "acme")],
        &body,
    )
    .await?;
    assert_eq!(live.status, 200, "{}", live.body);
    assert_eq!(
        live.body["path"], "/v1/chat/completions?probe=1",
        "{}",
        live.body
    );
    assert_eq!(live.body["headers"]["x-llm-d-inference-objective"], "mine");
    assert!(live.body["headers"]["x-llm-d-inference-fairness-id"].is_null());
    assert_eq!(live.body["body"], body);
    // Passthrough: the tenant's slot is taken while the gateway works (quota:userid:acme, the
    // redis-quota gate's counter), a second request meanwhile is overflow, and the slot is
    // given back at the end.
    let held = {
        let url = url.clone();
        let body = body.clone();
        tokio::spawn(async move {
            post(
                &url,
                &[
                    ("X-AP-Mode", "passthrough"),
                    ("x-team", "acme"),
                    ("x-echo-delay-ms", "1500"),
                    ("x-llm-d-inference-objective", "forged"),
                ],
                &body,
            )
            .await
            .map_err(|e| e.to_string())
        })
    };
    let mut con = d.redis.connection().await?;
    until(
        "the slot taken",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let n: Option<i64> = con.get("quota:userid:acme").await?;
            Ok((n == Some(1)).then_some(()))
        },
    )
    .await?;
    let over = post(
        &url,
        &[("X-AP-Mode", "PassThrough"), ("x-team", "acme")],
        &body,
    )
    .await?;
    assert_eq!(over.status, 200, "{}", over.body);
    assert_eq!(
        over.body["headers"]["x-llm-d-inference-objective"],
        "int-overflow"
    );
    assert_eq!(
        over.body["headers"]["x-llm-d-inference-fairness-id"],
        "acme"
    );
    assert!(over.body["headers"]["x-ap-mode"].is_null(), "{}", over.body);
    let first = held.await??;
    assert_eq!(
        first.body["headers"]["x-llm-d-inference-objective"],
        "int-reserved"
    );
    until(
        "the slot given back",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let n: Option<i64> = con.get("quota:userid:acme").await?;
            Ok((n.unwrap_or(0) == 0).then_some(()))
        },
    )
    .await?;
    // A tenant without a limit is reserved; a model without a route goes to the default queue's
    // gateway (the simulator).
    let other = post(
        &url,
        &[("X-AP-Mode", "passthrough"), ("x-team", "zed")],
        &body,
    )
    .await?;
    assert_eq!(
        other.body["headers"]["x-llm-d-inference-objective"], "int-reserved",
        "{}",
        other.body
    );
    assert_eq!(
        other.body["headers"]["x-llm-d-inference-fairness-id"],
        "zed"
    );
    let sim = post(&url, &[("X-AP-Mode", "passthrough")], &chat("to the sim")).await?;
    assert_eq!(sim.body["object"], "chat.completion", "{}", sim.body);
    // A stream stays a stream: its chunks arrive as the gateway sends them.
    let started = Instant::now();
    let mut r = reqwest::Client::new()
        .post(&url)
        .header("X-AP-Mode", "passthrough")
        .json(&json!({"model": "e", "stream": true}))
        .send()
        .await?;
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let first_chunk = r.chunk().await?.unwrap_or_default();
    let first_at = started.elapsed();
    assert!(
        String::from_utf8_lossy(&first_chunk).contains("\"n\":0"),
        "{first_chunk:?}"
    );
    let mut rest = Vec::new();
    while let Some(c) = r.chunk().await? {
        rest.extend_from_slice(&c);
    }
    assert!(String::from_utf8_lossy(&rest).ends_with("data: [DONE]\n\n"));
    assert!(
        started.elapsed() >= first_at + Duration::from_millis(250),
        "the stream came whole"
    );
    let m = d.metrics(0).await?;
    assert!(
        m.contains("inferq_front_requests_total{mode=\"live\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("inferq_front_requests_total{mode=\"passthrough\"} 5"),
        "{m}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_writes_the_routers_layout_and_any_replica_fetches_the_answer() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.add_replica().await?;
    d.add_replica().await?;
    let before = unix();
    let a = post(
        &format!("{}/chat/completions", d.url(0)),
        &[
            ("X-AP-Mode", "enqueue"),
            ("X-Team", "acme"),
            ("X-Request-Id", "job-4217"),
            ("X-Request-Timeout-Seconds", "120"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("x-llm-d-slo-ttft-ms", "250"),
        ],
        &chat("later"),
    )
    .await?;
    assert_eq!(a.status, 202, "{}", a.body);
    assert_eq!(a.body, json!({"id": "job-4217", "status": "pending"}));
    assert_eq!(a.id(), "job-4217");
    // No processor yet: the member, the marker and no mailbox, as producer v0.9.0 writes them.
    let mut con = d.redis.connection().await?;
    let members: Vec<(String, f64)> = con.zrange_withscores("batch-q", 0, -1).await?;
    assert_eq!(members.len(), 1, "{members:?}");
    let (member, score) = &members[0];
    let m: Value = serde_json::from_str(member)?;
    let token: Option<String> = con.get("request-active:acme:job-4217").await?;
    let token = token.unwrap_or_default();
    assert!(
        token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit()),
        "{token}"
    );
    let deadline = m["data"]["deadline"].as_i64().unwrap_or(0);
    assert!((before + 119..=before + 121).contains(&deadline), "{m}");
    assert_eq!(*score, deadline as f64);
    assert_eq!(
        m,
        json!({"internal": {"request_token": token, "request_queue_name": "batch-q", "result_queue_name": "results:req:acme:job-4217"},
               "request_kind": "redis",
               "data": {"id": "acme:job-4217", "created": m["data"]["created"], "deadline": deadline,
                        "payload": chat("later"),
                        "metadata": {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "userid": "acme"},
                        "headers": {"x-llm-d-slo-ttft-ms": "250"},
                        "endpoint": "/v1/chat/completions",
                        "request_queue_name": "batch-q", "result_queue_name": "results:req:acme:job-4217"}})
    );
    let pttl: i64 = con.pttl("request-active:acme:job-4217").await?;
    assert!((110_000..=120_000).contains(&pttl), "{pttl}");
    let team = [("X-Team", "acme")];
    let (s, v) = get(&format!("{}/requests/job-4217", d.url(1)), &team).await?;
    assert_eq!(
        (s, &v),
        (202, &json!({"id": "job-4217", "status": "pending"}))
    );
    // Another tenant, or an id never given: 410.
    let (s, v) = get(
        &format!("{}/requests/job-4217", d.url(1)),
        &[("X-Team", "other")],
    )
    .await?;
    assert_eq!(
        (s, v["error"]["code"].as_str()),
        (410, Some("UNKNOWN_REQUEST")),
        "{v}"
    );
    // The processor answers; a long poll on the other replica wakes with the model's own body.
    d.add_processor()?;
    let started = Instant::now();
    let (s, body) = get(&format!("{}/requests/job-4217?wait=30", d.url(1)), &team).await?;
    assert_eq!(s, 200, "{body}\n{}", d.logs());
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The marker is cleared, the mailbox stays for the fetch grace, then the same again.
    let active: bool = con.exists("request-active:acme:job-4217").await?;
    assert!(!active);
    let ttl: i64 = con.ttl("results:req:acme:job-4217").await?;
    assert!((1..=60).contains(&ttl), "{ttl}");
    let (s, again) = get(&format!("{}/requests/job-4217", d.url(0)), &team).await?;
    assert_eq!((s, &again), (200, &body));
    // DELETE: 204, then 410.
    assert_eq!(
        delete(&format!("{}/requests/job-4217", d.url(0)), &team).await?,
        204
    );
    let (s, _) = get(&format!("{}/requests/job-4217", d.url(1)), &team).await?;
    assert_eq!(s, 410);
    assert!(
        front_keys(&d).await?.is_empty(),
        "{:?}",
        front_keys(&d).await?
    );
    // The models of the routes (none here).
    let (s, models) = get(&format!("{}/models", d.url(0)), &[]).await?;
    assert_eq!((s, models), (200, json!({"object": "list", "data": []})));
    Ok(())
}

fn unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_answers_status_for_status_and_falls_back_at_the_cap() -> Fallible {
    let mut d = Deployment::start(1500).await?;
    broker_config(
        &mut d,
        "default_queue: batch-q\nwait_cap_seconds: 1\nroutes: [{model: m}, {model: n}]\n",
    )?;
    d.add_processor()?;
    d.add_replica().await?;
    let url = d.url(0);
    // At the cap (1 s, before the 1.5 s answer): 202 pending, and the request stays fetchable.
    let started = Instant::now();
    let a = post(
        &format!("{url}/chat/completions"),
        &[("X-AP-Mode", "wait")],
        &chat("slow"),
    )
    .await?;
    assert_eq!(a.status, 202, "{}", a.body);
    assert!(
        started.elapsed() < Duration::from_millis(1400),
        "{:?}",
        started.elapsed()
    );
    let id = a.id();
    assert_eq!(a.body, json!({"id": id, "status": "pending"}));
    let (s, body) = get(&format!("{url}/requests/{id}?wait=20"), &[]).await?;
    assert_eq!(
        (s, body["object"].as_str()),
        (200, Some("chat.completion")),
        "{body}"
    );
    let (s, models) = get(&format!("{url}/models"), &[]).await?;
    assert_eq!(s, 200);
    assert_eq!(
        models,
        json!({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "llm-d-async"}, {"id": "n", "object": "model", "owned_by": "llm-d-async"}]})
    );
    // Without the cap: the model's answer on the held connection, the mailbox deleted after.
    let mut d2 = Deployment::start(5).await?;
    d2.add_processor()?;
    d2.add_replica().await?;
    let url = d2.url(0);
    let w = post(
        &format!("{url}/chat/completions"),
        &[("X-AP-Mode", "wait")],
        &chat("hi"),
    )
    .await?;
    assert_eq!(
        (w.status, w.body["object"].as_str()),
        (200, Some("chat.completion")),
        "{}",
        w.body
    );
    assert_eq!(
        w.headers.get("content-type").and_then(|v| v.to_str().ok()),
        Some("application/json")
    );
    let id = w.id();
    assert_eq!(id.len(), 36, "a minted UUID: {id}");
    let (s, _) = get(&format!("{url}/requests/{id}"), &[]).await?;
    assert_eq!(s, 410, "wait mode deletes what it delivered");
    // The gateway's own error status and body pass through (the simulator has neither route).
    for path in ["/embeddings", "/../inference/v1/generate"] {
        let e = post(
            &format!("{url}{path}"),
            &[("X-AP-Mode", "wait")],
            &json!({"model": "m", "input": "x"}),
        )
        .await?;
        assert_eq!(e.status, 404, "{path}: {}", e.body);
    }
    // A deadline before the answer: 504 in the step's envelope, at the deadline.
    let mut d3 = Deployment::start(4000).await?;
    d3.add_processor()?;
    d3.add_replica().await?;
    let started = Instant::now();
    let t = post(
        &format!("{}/chat/completions", d3.url(0)),
        &[("X-AP-Mode", "wait"), ("X-Request-Timeout-Seconds", "1")],
        &chat("too slow"),
    )
    .await?;
    assert_eq!(t.status, 504, "{}", t.body);
    assert_eq!(t.body["error"]["type"], "timeout_error");
    assert_eq!(t.body["error"]["code"], "DEADLINE_EXCEEDED");
    assert!(
        started.elapsed() < Duration::from_millis(2500),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_id_joins_its_request_across_replicas_and_another_body_is_409() -> Fallible {
    let d = deployment(1500, &[]).await?;
    let sim = d.sim.base_url();
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let url = format!("{}/chat/completions", d.url(i % 2));
            let key = if i < 2 {
                "X-Request-Id"
            } else {
                "Idempotency-Key"
            };
            tokio::spawn(async move {
                post(
                    &url,
                    &[("X-AP-Mode", "wait"), (key, "job-1")],
                    &chat("once"),
                )
                .await
                .map_err(|e| e.to_string())
            })
        })
        .collect();
    // Meanwhile another body under the id: 409, and nothing of it queued.
    let url1 = format!("{}/chat/completions", d.url(1));
    until(
        "the request queued",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            let mut con = d.redis.connection().await?;
            Ok(con
                .exists::<_, bool>("request-active:default:job-1")
                .await?
                .then_some(()))
        },
    )
    .await?;
    let c = post(
        &url1,
        &[("X-AP-Mode", "enqueue"), ("X-Request-Id", "job-1")],
        &chat("other"),
    )
    .await?;
    assert_eq!(
        (c.status, c.body["error"]["code"].as_str()),
        (409, Some("REQUEST_ID_CONFLICT")),
        "{}",
        c.body
    );
    let mut ids = Vec::new();
    for c in calls {
        let a = c.await??;
        assert_eq!(a.status, 200, "{}\n{}", a.body, d.logs());
        ids.push(a.body["id"].clone());
    }
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    let runs: Value = reqwest::get(format!("{sim}/executions"))
        .await?
        .json()
        .await?;
    assert_eq!(runs["default:job-1"], 1, "{runs}");
    let m = d.metrics(0).await? + &d.metrics(1).await?;
    assert!(m.contains("inferq_front_joined_total"), "{m}");
    // Delivered, and kept for the fetch grace: a repeat gets the same answer (a client that
    // lost it), without running again.
    let again = post(
        &url1,
        &[("X-AP-Mode", "wait"), ("X-Request-Id", "job-1")],
        &chat("once"),
    )
    .await?;
    assert_eq!(
        (again.status, &again.body["id"]),
        (200, &ids[0]),
        "{}",
        again.body
    );
    // Deleted: the id is free again, and a repeat is new work.
    assert_eq!(
        delete(&format!("{}/requests/job-1", d.url(0)), &[]).await?,
        204
    );
    let new = post(
        &url1,
        &[("X-AP-Mode", "wait"), ("X-Request-Id", "job-1")],
        &chat("other"),
    )
    .await?;
    assert_eq!(new.status, 200, "{}", new.body);
    assert_ne!(new.body["id"], ids[0]);
    let runs: Value = reqwest::get(format!("{sim}/executions"))
        .await?
        .json()
        .await?;
    assert_eq!(runs["default:job-1"], 2, "{runs}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_a_clear_4xx_and_leaves_nothing_in_redis() -> Fallible {
    let d = deployment(5, &[]).await?;
    let url = format!("{}/chat/completions", d.url(0));
    let ok = chat("x");
    /// Headers, body, the field named, what the message says.
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<u8>, &'a str, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec![("X-AP-Mode", "later")],
            ok.to_string().into_bytes(),
            "X-AP-Mode",
            "unknown X-AP-Mode",
        ),
        (
            vec![("X-AP-Mode", "wait"), ("X-Team", "a:b")],
            ok.to_string().into_bytes(),
            "X-Team",
            "must not contain",
        ),
        (
            vec![("X-AP-Mode", "enqueue")],
            br#"{"messages":[]}"#.to_vec(),
            "model",
            "model is required",
        ),
        (
            vec![("X-AP-Mode", "passthrough")],
            br#"{"messages":[]}"#.to_vec(),
            "model",
            "model is required",
        ),
        (
            vec![("X-AP-Mode", "wait"), ("X-Request-Timeout-Seconds", "soon")],
            ok.to_string().into_bytes(),
            "X-Request-Timeout-Seconds",
            "whole number",
        ),
        (
            vec![("X-AP-Mode", "enqueue"), ("X-Request-Timeout-Seconds", "0")],
            ok.to_string().into_bytes(),
            "X-Request-Timeout-Seconds",
            "above 0",
        ),
        (
            vec![("X-AP-Mode", "wait")],
            b"{not json".to_vec(),
            "body",
            "not valid JSON",
        ),
        (
            vec![("X-AP-Mode", "enqueue")],
            br#"{"model":"m","stream":true}"#.to_vec(),
            "stream",
            "stream",
        ),
    ];
    for (headers, body, param, says) in cases {
        let a = post_raw(&url, &headers, body).await?;
        assert_eq!(a.status, 400, "{headers:?}: {}", a.body);
        let e = &a.body["error"];
        assert_eq!(e["type"], "invalid_request_error", "{}", a.body);
        assert_eq!(e["code"], "INVALID_REQUEST", "{}", a.body);
        assert_eq!(e["param"], param, "{}", a.body);
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(says)),
            "{says}: {}",
            a.body
        );
    }
    let (s, v) = get(&format!("{}/requests/x?wait=never", d.url(0)), &[]).await?;
    assert_eq!(
        (s, v["error"]["param"].as_str()),
        (400, Some("wait")),
        "{v}"
    );
    assert!(
        front_keys(&d).await?.is_empty(),
        "{:?}",
        front_keys(&d).await?
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_cancels_in_flight_and_a_client_going_away_cancels_its_wait() -> Fallible {
    let d = deployment(3000, &[]).await?;
    let sim = d.sim.base_url();
    let team = [("X-Team", "t")];
    let a = post(
        &format!("{}/chat/completions", d.url(0)),
        &[
            ("X-AP-Mode", "enqueue"),
            ("X-Team", "t"),
            ("X-Request-Id", "gone-1"),
        ],
        &chat("stop me"),
    )
    .await?;
    assert_eq!(a.status, 202);
    until(
        "the request at the gateway",
        Duration::from_secs(10),
        Duration::from_millis(20),
        async || {
            let arrived: Value = reqwest::get(format!("{sim}/executions"))
                .await?
                .json()
                .await?;
            Ok((arrived["t:gone-1"] == 1).then_some(()))
        },
    )
    .await?;
    let started = Instant::now();
    assert_eq!(
        delete(&format!("{}/requests/gone-1", d.url(1)), &team).await?,
        204
    );
    // The processor aborts the call it has in flight and answers CANCELLED: 499 `cancelled`,
    // well before the gateway's 3 s.
    let (s, v) = get(&format!("{}/requests/gone-1?wait=10", d.url(0)), &team).await?;
    assert_eq!(s, 499, "{v}\n{}", d.logs());
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
        (Some("cancelled"), Some("CANCELLED")),
        "{v}"
    );
    assert!(
        started.elapsed() < Duration::from_millis(2800),
        "{:?}",
        started.elapsed()
    );
    // A waiting client that goes away takes its request with it.
    let gone = reqwest::Client::builder()
        .timeout(Duration::from_millis(500))
        .build()?
        .post(format!("{}/chat/completions", d.url(0)))
        .header("X-AP-Mode", "wait")
        .header("X-Request-Id", "gone-2")
        .json(&chat("bye"))
        .send()
        .await;
    assert!(gone.is_err(), "the client timed out");
    let (s, v) = get(&format!("{}/requests/gone-2?wait=10", d.url(1)), &[]).await?;
    assert_eq!(s, 499, "{v}\n{}", d.logs());
    let m = d.metrics(0).await?;
    assert!(m.contains("inferq_front_disconnect_cancels_total 1"), "{m}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_api_keys_the_keys_tenant_wins_and_another_x_team_is_403() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.keys(r#"{"sk-aaaaaaaaaaaaaaaa":"a","sk-bbbbbbbbbbbbbbbb":"b"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    let url = d.url(0);
    let ka = ("authorization", "Bearer sk-aaaaaaaaaaaaaaaa");
    let kb = ("authorization", "Bearer sk-bbbbbbbbbbbbbbbb");
    let none = post(
        &format!("{url}/chat/completions"),
        &[("X-AP-Mode", "wait")],
        &chat("x"),
    )
    .await?;
    assert_eq!(none.status, 401);
    let f = post(
        &format!("{url}/chat/completions"),
        &[ka, ("X-AP-Mode", "enqueue"), ("X-Team", "b")],
        &chat("x"),
    )
    .await?;
    assert_eq!(f.status, 403, "{}", f.body);
    let e = post(
        &format!("{url}/chat/completions"),
        &[
            ka,
            ("X-AP-Mode", "enqueue"),
            ("X-Team", "a"),
            ("X-Request-Id", "mine"),
        ],
        &chat("x"),
    )
    .await?;
    assert_eq!(e.status, 202, "{}", e.body);
    let (s, _) = get(&format!("{url}/requests/mine?wait=20"), &[ka]).await?;
    assert_eq!(s, 200);
    let (s, _) = get(&format!("{url}/requests/mine"), &[kb]).await?;
    assert_eq!(s, 410, "another tenant's request");
    let (s, _) = get(&format!("{url}/requests/mine"), &[kb, ("X-Team", "a")]).await?;
    assert_eq!(s, 403);
    let mut con = d.redis.connection().await?;
    assert!(con.exists::<_, bool>("results:req:a:mine").await?);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_streams_and_waiting_clients_are_bounded_and_counted() -> Fallible {
    let d = deployment(1200, &["--max-waiting-clients", "1"]).await?;
    for page in [d.metrics(0).await?, d.metrics(1).await?] {
        for series in [
            "inferq_front_requests_total{mode=\"live\"} 0",
            "inferq_front_requests_total{mode=\"passthrough\"} 0",
            "inferq_front_requests_total{mode=\"enqueue\"} 0",
            "inferq_front_requests_total{mode=\"wait\"} 0",
            "inferq_front_requests_total{mode=\"stream\"} 0",
            "inferq_front_waiting_clients 0",
            "inferq_front_busy_total 0",
            "inferq_front_joined_total 0",
            "inferq_front_disconnect_cancels_total 0",
        ] {
            assert!(page.contains(series), "{series} missing:\n{page}");
        }
    }
    let mut body = chat("stream me");
    body["stream"] = json!(true);
    let url = format!("{}/chat/completions", d.url(0));
    let streaming = {
        let (url, body) = (url.clone(), body.clone());
        tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(url)
                .header("X-AP-Mode", "wait")
                .json(&body)
                .send()
                .await?;
            let kind = r
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            Ok::<_, reqwest::Error>((kind, r.text().await?))
        })
    };
    until(
        "the stream's slot taken",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            Ok(d.metrics(0)
                .await?
                .contains("inferq_front_waiting_clients 1")
                .then_some(()))
        },
    )
    .await?;
    let busy = post(&url, &[("X-AP-Mode", "wait")], &chat("no room")).await?;
    assert_eq!(busy.status, 429, "{}", busy.body);
    assert_eq!(
        busy.headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()),
        Some("1")
    );
    // Enqueue holds no connection, so it is taken.
    let e = post(&url, &[("X-AP-Mode", "enqueue")], &chat("room")).await?;
    assert_eq!(e.status, 202);
    let (kind, text) = streaming.await??;
    assert_eq!(kind.as_deref(), Some("text/event-stream"));
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let first: Value = serde_json::from_str(data[0])?;
    assert_eq!(first["object"], "chat.completion.chunk", "{text}");
    assert!(
        data.iter().any(|l| l.contains("\"finish_reason\":\"")),
        "{text}"
    );
    let m = d.metrics(0).await?;
    assert!(
        m.contains("inferq_front_requests_total{mode=\"stream\"} 1"),
        "{m}"
    );
    assert!(m.contains("inferq_front_busy_total 1"), "{m}");
    assert!(m.contains("inferq_front_waiting_clients 0"), "{m}");
    Ok(())
}
