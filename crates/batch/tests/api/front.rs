//! The front door (single requests: wait, stream, enqueue, `/v1/requests`) against a real
//! deployment: Redis, the simulator, `inferq run` and two `inferq batch-api` replicas (see
//! [`crate::common`]). Each test drives it over HTTP as a client would.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{until, Deployment, Fallible};

/// Header pairs of a call.
type Headers = Vec<(&'static str, &'static str)>;

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

async fn post(
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Fallible<(u16, reqwest::header::HeaderMap, Value)> {
    let mut r = reqwest::Client::new().post(url).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await?;
    let status = r.status().as_u16();
    let h = r.headers().clone();
    let text = r.text().await?;
    let v = serde_json::from_str(&text).unwrap_or(Value::String(text));
    Ok((status, h, v))
}

async fn get(url: &str) -> Fallible<(u16, Value)> {
    let r = reqwest::get(url).await?;
    Ok((r.status().as_u16(), r.json().await?))
}

/// Keys in the replicas' Redis.
async fn dbsize(d: &Deployment) -> Fallible<i64> {
    let mut con = d.redis.connection().await?;
    Ok(redis::cmd("DBSIZE").query_async(&mut con).await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_mode_answers_with_the_gateways_own_status_and_body() -> Fallible {
    let d = deployment(5, &[]).await?;
    let (status, headers, body) = post(
        &format!("{}/chat/completions", d.url(0)),
        &[],
        &chat("hello"),
    )
    .await?;
    assert_eq!(status, 200, "{body}\n{}", d.logs());
    assert_eq!(body["object"], "chat.completion", "{body}");
    let id = headers
        .get("x-inferq-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    assert!(id.starts_with("req_"), "{headers:?}");
    // Any replica reads it afterwards.
    let (status, got) = get(&format!("{}/requests/{id}", d.url(1))).await?;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["status"], "completed", "{got}");
    assert_eq!(got["response"]["status_code"], 200, "{got}");
    assert_eq!(got["response"]["body"]["id"], body["id"], "{got}");
    // service_tier flex waits too; completions are served alike.
    let (status, _, body) = post(
        &format!("{}/completions", d.url(1)),
        &[],
        &json!({"model": "m", "prompt": "p", "max_tokens": 3, "service_tier": "flex"}),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["object"], "text_completion", "{body}");
    // A gateway's error answer passes through: the simulator has no embeddings route.
    let (status, _, body) = post(
        &format!("{}/embeddings", d.url(0)),
        &[],
        &json!({"model": "m", "input": "x"}),
    )
    .await?;
    assert_eq!(status, 404, "{body}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_sends_keepalives_then_chunks_then_done() -> Fallible {
    let d = deployment(1500, &[]).await?;
    let mut body = chat("stream me");
    body["stream"] = json!(true);
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", d.url(0)))
        .json(&body)
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("text/event-stream")
    );
    let text = r.text().await?;
    assert!(text.starts_with(": waiting"), "{text}");
    let data: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{text}");
    let first: Value = serde_json::from_str(data[0])?;
    assert_eq!(first["object"], "chat.completion.chunk", "{text}");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant", "{text}");
    assert!(
        data.iter().any(|l| l.contains("\"finish_reason\":\"")),
        "{text}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_answers_at_once_and_any_replica_long_polls_the_result() -> Fallible {
    let d = deployment(800, &[]).await?;
    let started = Instant::now();
    let (status, _, obj) = post(
        &format!("{}/chat/completions", d.url(0)),
        &[("X-AP-Mode", "enqueue")],
        &chat("later"),
    )
    .await?;
    assert_eq!(status, 202, "{obj}");
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "{:?}",
        started.elapsed()
    );
    for field in ["id", "created_at", "expires_at"] {
        assert!(!obj[field].is_null(), "{field} missing: {obj}");
    }
    assert_eq!(obj["object"], "async.request");
    assert_eq!(obj["status"], "queued");
    let expires = obj["expires_at"].as_i64().unwrap_or(0) - obj["created_at"].as_i64().unwrap_or(0);
    assert!(
        (599..=601).contains(&expires),
        "default deadline 10m: {obj}"
    );
    let id = obj["id"].as_str().unwrap_or_default().to_owned();
    let (status, got) = get(&format!("{}/requests/{id}?wait=30", d.url(1))).await?;
    assert_eq!(status, 200, "{got}");
    assert_eq!(got["status"], "completed", "{got}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the long poll woke late: {:?}",
        started.elapsed()
    );
    // A long poll on an ended request answers at once; a short one on an open one at its limit.
    let (_, again) = get(&format!("{}/requests/{id}?wait=30", d.url(0))).await?;
    assert_eq!(again["status"], "completed");
    let (_, _, open) = post(
        &format!("{}/chat/completions", d.url(0)),
        &[("X-AP-Mode", "enqueue")],
        &chat("slow"),
    )
    .await?;
    let open_id = open["id"].as_str().unwrap_or_default().to_owned();
    // Once a processor holds it, it is in_progress (the simulator takes 800 ms).
    until(
        "in_progress",
        Duration::from_secs(5),
        Duration::from_millis(20),
        async || {
            let (_, v) = get(&format!("{}/requests/{open_id}", d.url(1))).await?;
            assert_ne!(v["status"], "completed", "never seen in_progress: {v}");
            Ok((v["status"] == "in_progress").then_some(()))
        },
    )
    .await?;
    let t = Instant::now();
    let (_, polled) = get(&format!("{}/requests/{open_id}?wait=0.2", d.url(1))).await?;
    assert!(
        matches!(polled["status"].as_str(), Some("queued" | "in_progress")),
        "{polled}"
    );
    assert!(
        t.elapsed() < Duration::from_millis(700),
        "{:?}",
        t.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotency_key_names_one_request_across_replicas() -> Fallible {
    let d = deployment(5, &[]).await?;
    let key = [("Idempotency-Key", "order-42")];
    let enqueue = [("Idempotency-Key", "order-42"), ("X-AP-Mode", "enqueue")];
    let (s1, h1, first) = post(
        &format!("{}/chat/completions", d.url(0)),
        &key,
        &chat("once"),
    )
    .await?;
    assert_eq!(s1, 200, "{first}");
    let id = h1
        .get("x-inferq-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // The same key and body on the other replica: the same request, its result, no new run.
    let (s2, h2, second) = post(
        &format!("{}/chat/completions", d.url(1)),
        &key,
        &chat("once"),
    )
    .await?;
    assert_eq!(s2, 200, "{second}");
    assert_eq!(second, first);
    assert_eq!(
        h2.get("x-inferq-request-id").and_then(|v| v.to_str().ok()),
        Some(id.as_str())
    );
    let (s3, _, obj) = post(
        &format!("{}/chat/completions", d.url(1)),
        &enqueue,
        &chat("once"),
    )
    .await?;
    assert_eq!((s3, obj["id"].as_str()), (202, Some(id.as_str())), "{obj}");
    assert_eq!(obj["status"], "completed", "{obj}");
    // Another body with the key: 409 naming it, and nothing new in Redis.
    let before = dbsize(&d).await?;
    let (s4, _, err) = post(
        &format!("{}/chat/completions", d.url(0)),
        &key,
        &chat("twice"),
    )
    .await?;
    assert_eq!(s4, 409, "{err}");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("order-42"),
        "{err}"
    );
    assert_eq!(dbsize(&d).await?, before);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_are_400_naming_the_field_and_leave_nothing_in_redis() -> Fallible {
    let d = deployment(5, &[]).await?;
    let url = format!("{}/chat/completions", d.url(0));
    let before = dbsize(&d).await?;
    let cases: Vec<(Headers, Value, &str)> = vec![
        (vec![], json!([1, 2]), "body"),
        (vec![("X-AP-Mode", "sometime")], chat("x"), "X-AP-Mode"),
        (vec![("X-AP-Mode", "passthrough")], chat("x"), "X-AP-Mode"),
        (
            vec![("x-llm-d-async-timeout", "soon")],
            chat("x"),
            "x-llm-d-async-timeout",
        ),
        (
            vec![("x-llm-d-async-timeout", "-5s")],
            chat("x"),
            "x-llm-d-async-timeout",
        ),
        (vec![], json!({"model": "m", "timeout": "nope"}), "timeout"),
        (
            vec![("x-llm-d-async-queue", "no-such-queue")],
            chat("x"),
            "x-llm-d-async-queue",
        ),
        (vec![], json!({"model": "m", "stream": "yes"}), "stream"),
        (
            vec![("X-AP-Mode", "enqueue")],
            json!({"model": "m", "stream": true}),
            "stream",
        ),
        (
            vec![],
            json!({"model": "m", "metadata": {"k": "v".repeat(513)}}),
            "metadata.k",
        ),
        (
            vec![],
            json!({"model": "m", "metadata": (0..17).map(|i| (format!("k{i}"), json!("v"))).collect::<serde_json::Map<_, _>>()}),
            "metadata",
        ),
    ];
    for (headers, body, param) in cases {
        let (status, _, err) = post(&url, &headers, &body).await?;
        assert_eq!(status, 400, "{headers:?} {body}: {err}");
        assert_eq!(err["error"]["param"], param, "{headers:?} {body}: {err}");
        assert_eq!(err["error"]["type"], "invalid_request_error");
    }
    let r = reqwest::Client::new()
        .post(&url)
        .body("{not json")
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 400);
    assert_eq!(
        dbsize(&d).await?,
        before,
        "a refused request left keys behind"
    );
    // Unknown ids and ids of another shape are 404, in OpenAI's shape.
    for id in ["req_unknown0000", "batch_abc", "..%2Fx"] {
        let (status, err) = get(&format!("{}/requests/{id}", d.url(1))).await?;
        assert_eq!(status, 404, "{id}: {err}");
    }
    let (status, err) = get(&format!("{}/requests/req_x?wait=forever", d.url(1))).await?;
    assert_eq!(
        (status, err["error"]["param"].as_str()),
        (400, Some("wait"))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadlines_cancels_and_disconnects_end_requests() -> Fallible {
    let d = deployment(4000, &["--max-waiting-clients", "2"]).await?;
    let url = format!("{}/chat/completions", d.url(0));
    // Past its deadline, wait answers 504 in OpenAI's shape, naming the request.
    let t = Instant::now();
    let (status, h, err) = post(&url, &[("x-llm-d-async-timeout", "1s")], &chat("late")).await?;
    assert_eq!(status, 504, "{err}");
    assert_eq!(err["error"]["code"], "deadline_exceeded", "{err}");
    assert!(h.get("x-inferq-request-id").is_some());
    assert!(
        t.elapsed() < Duration::from_millis(2500),
        "{:?}",
        t.elapsed()
    );
    // DELETE cancels a queued or running request; its waiters answer 409 CANCELLED.
    let (_, _, obj) = post(&url, &[("X-AP-Mode", "enqueue")], &chat("withdrawn")).await?;
    let id = obj["id"].as_str().unwrap_or_default().to_owned();
    let waiter = {
        let url = format!("{}/requests/{id}?wait=20", d.url(1));
        tokio::spawn(async move { get(&url).await.map_err(|e| e.to_string()) })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let r = reqwest::Client::new()
        .delete(format!("{}/requests/{id}", d.url(1)))
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    let cancelled: Value = r.json().await?;
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert_eq!(cancelled["error"]["code"], "CANCELLED", "{cancelled}");
    let (_, polled) = waiter.await?.map_err(|e| e.to_string())?;
    assert_eq!(polled["status"], "cancelled", "{polled}");
    // Cancelling many: known ones end, unknown ones say so.
    let (_, _, a) = post(&url, &[("X-AP-Mode", "enqueue")], &chat("a")).await?;
    let (status, _, list) = post(
        &format!("{}/requests/cancel", d.url(0)),
        &[],
        &json!({"ids": [a["id"], "req_nosuch000"]}),
    )
    .await?;
    assert_eq!(status, 200, "{list}");
    assert_eq!(list["data"][0]["status"], "cancelled", "{list}");
    assert_eq!(list["data"][1]["error"]["code"], "not_found", "{list}");
    // A waiting client that goes away cancels the request it made.
    let gone = reqwest::Client::new()
        .post(&url)
        .header("Idempotency-Key", "walk-away")
        .timeout(Duration::from_millis(500))
        .json(&chat("bye"))
        .send()
        .await;
    assert!(gone.is_err(), "the call should have timed out");
    let (_, _, same) = post(
        &url,
        &[("X-AP-Mode", "enqueue"), ("Idempotency-Key", "walk-away")],
        &chat("bye"),
    )
    .await?;
    let gone_id = same["id"].as_str().unwrap_or_default().to_owned();
    let ended = until(
        "the abandoned request cancelled",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || {
            let (_, v) = get(&format!("{}/requests/{gone_id}", d.url(1))).await?;
            Ok((v["status"] == "cancelled").then_some(v))
        },
    )
    .await?;
    assert_eq!(ended["error"]["code"], "CANCELLED");
    // --max-waiting-clients 2: a third open wait on one replica is 429 with Retry-After.
    let hold = |n: u32| {
        let url = url.clone();
        tokio::spawn(async move {
            reqwest::Client::new()
                .post(&url)
                .header("x-llm-d-async-timeout", "3s")
                .json(&chat(&format!("hold {n}")))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .map_err(|e| e.to_string())
        })
    };
    let held = [hold(1), hold(2)];
    tokio::time::sleep(Duration::from_millis(400)).await;
    let before = dbsize(&d).await?;
    let (status, h, err) = post(&url, &[], &chat("one too many")).await?;
    assert_eq!(status, 429, "{err}");
    assert_eq!(
        h.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    assert_eq!(dbsize(&d).await?, before, "a refused wait left keys behind");
    for h in held {
        assert_eq!(h.await?.map_err(|e| e.to_string())?, 504);
    }
    let (status, _, _) = post(&url, &[("X-AP-Mode", "enqueue")], &chat("room again")).await?;
    assert_eq!(status, 202);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_see_only_their_own_requests_and_keys() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.keys(r#"{"sk-tenant-a-0123456789":"a","sk-tenant-b-0123456789":"b"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    let url = format!("{}/chat/completions", d.url(0));
    let a = [
        ("Authorization", "Bearer sk-tenant-a-0123456789"),
        ("Idempotency-Key", "k1"),
        ("X-AP-Mode", "enqueue"),
    ];
    let b = [
        ("Authorization", "Bearer sk-tenant-b-0123456789"),
        ("Idempotency-Key", "k1"),
        ("X-AP-Mode", "enqueue"),
    ];
    let (status, _, mine) = post(&url, &a, &chat("a's")).await?;
    assert_eq!(status, 202, "{mine}");
    // The same key from another tenant is another request, even with another body.
    let (status, _, theirs) = post(&url, &b, &chat("b's")).await?;
    assert_eq!(status, 202, "{theirs}");
    assert_ne!(mine["id"], theirs["id"]);
    let id = mine["id"].as_str().unwrap_or_default();
    let client = reqwest::Client::new();
    let as_b = client
        .get(format!("{}/requests/{id}", d.url(0)))
        .bearer_auth("sk-tenant-b-0123456789")
        .send()
        .await?;
    assert_eq!(as_b.status().as_u16(), 404);
    let del_b = client
        .delete(format!("{}/requests/{id}", d.url(0)))
        .bearer_auth("sk-tenant-b-0123456789")
        .send()
        .await?;
    assert_eq!(del_b.status().as_u16(), 404);
    let nobody = client.post(&url).json(&chat("x")).send().await?;
    assert_eq!(nobody.status().as_u16(), 401);
    let as_a = client
        .get(format!("{}/requests/{id}?wait=10", d.url(0)))
        .bearer_auth("sk-tenant-a-0123456789")
        .send()
        .await?;
    let v: Value = as_a.json().await?;
    assert_eq!(v["status"], "completed", "{v}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_errors_pass_through_and_metrics_count_modes() -> Fallible {
    let d = deployment(5, &[]).await?;
    let faults = json!({"error_rate": 0.0, "rate_limit_rate": 0.0, "hang_rate": 0.0, "reset_rate": 0.0, "bad_request_rate": 1.0, "slow_rate": 0.0});
    let r = reqwest::Client::new()
        .post(format!("{}/faults", d.sim.base_url()))
        .json(&faults)
        .send()
        .await?;
    assert!(r.status().is_success(), "{}", r.text().await?);
    let (status, _, body) =
        post(&format!("{}/chat/completions", d.url(0)), &[], &chat("bad")).await?;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"].is_object(),
        "the simulator's own error body: {body}"
    );
    let page = reqwest::get(format!("http://127.0.0.1:{}/metrics", d.replicas[0].1))
        .await?
        .text()
        .await?;
    assert!(
        page.contains("inferq_front_requests_total{mode=\"wait\"} 1"),
        "{page}"
    );
    assert!(
        page.contains("inferq_front_requests_total{mode=\"enqueue\"} 0"),
        "{page}"
    );
    assert!(page.contains("inferq_front_waiting_clients 0"), "{page}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_is_kept_for_the_retention_then_reads_expired() -> Fallible {
    let d = deployment(5, &["--result-retention", "1s"]).await?;
    let (status, h, _) = post(
        &format!("{}/chat/completions", d.url(0)),
        &[],
        &chat("brief"),
    )
    .await?;
    assert_eq!(status, 200);
    let id = h
        .get("x-inferq-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let (_, v) = get(&format!("{}/requests/{id}", d.url(1))).await?;
    assert_eq!(v["status"], "completed", "{v}");
    let gone = until(
        "the result expired",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || {
            let (_, v) = get(&format!("{}/requests/{id}", d.url(1))).await?;
            Ok((v["status"] == "expired").then_some(v))
        },
    )
    .await?;
    assert_eq!(gone["error"]["code"], "RESULT_EXPIRED", "{gone}");
    assert!(gone["response"].is_null(), "{gone}");
    // The record goes too, after as long again: then the id is unknown.
    until(
        "the record gone",
        Duration::from_secs(5),
        Duration::from_millis(100),
        async || {
            let (status, _) = get(&format!("{}/requests/{id}", d.url(0))).await?;
            Ok((status == 404).then_some(()))
        },
    )
    .await?;
    Ok(())
}

/// A request recorded by a replica that died before queueing it (written here as `create-2.lua`
/// writes it, with no `submitted` mark and its submission begun 20 s ago): a retry with its
/// key queues it, once, and gets its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_with_the_key_queues_a_request_its_replica_never_queued() -> Fallible {
    use sha2::{Digest, Sha256};
    let d = deployment(5, &[]).await?;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"orphan"}],"max_tokens":4}"#;
    let mut h = Sha256::new();
    h.update(b"/v1/chat/completions\0");
    h.update(body.as_bytes());
    let digest: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    let key_digest: String = Sha256::digest(b"orphan-key")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let id = "req_orphan0000000000000000";
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as i64;
    let mut con = d.redis.connection().await?;
    let _: () = redis::cmd("HSET")
        .arg(format!("{{inferq-batch}}:req:{id}"))
        .arg(&[
            "tenant",
            "default",
            "queue",
            "batch-q",
            "endpoint",
            "/v1/chat/completions",
            "status",
            "queued",
        ])
        .arg("created_at")
        .arg(now_ms / 1000 - 20)
        .arg("expires_at")
        .arg(now_ms / 1000 + 300)
        .arg("deadline_ms")
        .arg(now_ms + 300_000)
        .arg("submit_ms")
        .arg(now_ms - 20_000)
        .query_async(&mut con)
        .await?;
    let _: () = redis::cmd("SET")
        .arg(format!("{{inferq-batch}}:idem:default:{key_digest}"))
        .arg(format!("{id} {digest}"))
        .query_async(&mut con)
        .await?;
    let r = reqwest::Client::new()
        .post(format!("{}/chat/completions", d.url(1)))
        .header("Idempotency-Key", "orphan-key")
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await?;
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(
        r.headers()
            .get("x-inferq-request-id")
            .and_then(|v| v.to_str().ok()),
        Some(id)
    );
    let answer: Value = r.json().await?;
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    let (_, got) = get(&format!("{}/requests/{id}", d.url(0))).await?;
    assert_eq!(got["status"], "completed", "{got}");
    Ok(())
}
