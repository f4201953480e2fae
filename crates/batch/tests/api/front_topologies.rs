//! The front door on a Redis Cluster and behind Sentinel, and through a killed replica: the
//! router's keys fall in many slots of a Cluster (each write and script touches one key), waits
//! wake by keyspace notifications (standalone, Sentinel) or the sweep (Cluster), and results
//! are read by any replica. Behind Sentinel with `replica_wait`, a fail-over in the middle of
//! queued requests loses none, and a repeat of each id joins its request.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{until, Deployment, Fallible};
use inferq_testkit::{RedisCluster, SentinelSet};

fn chat(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": content}], "max_tokens": 4})
}

async fn call(
    url: &str,
    headers: &[(&str, &str)],
    body: &Value,
) -> Result<(u16, Value, Option<String>), String> {
    let mut r = reqwest::Client::new().post(url).json(body);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    let r = r.send().await.map_err(|e| e.to_string())?;
    let status = r.status().as_u16();
    let id = r
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let v = r.json().await.map_err(|e| e.to_string())?;
    Ok((status, v, id))
}

/// Waits, enqueues and long-polls, repeats an id and conflicts, and passes through, across both
/// replicas.
async fn exercise(d: &Deployment) -> Fallible {
    let wait = [("X-AP-Mode", "wait")];
    let (s, body, id) = call(&format!("{}/chat/completions", d.url(0)), &wait, &chat("w")).await?;
    assert_eq!(s, 200, "{body}\n{}", d.logs());
    assert_eq!(body["object"], "chat.completion", "{body}");
    assert_eq!(id.map(|i| i.len()), Some(36));
    let (s, got, _) = call(
        &format!("{}/chat/completions", d.url(1)),
        &[("X-AP-Mode", "enqueue"), ("X-Request-Id", "k")],
        &chat("e"),
    )
    .await?;
    assert_eq!((s, &got), (202, &json!({"id": "k", "status": "pending"})));
    let polled: Value = reqwest::get(format!("{}/requests/k?wait=20", d.url(0)))
        .await?
        .json()
        .await?;
    assert_eq!(
        polled["object"],
        "chat.completion",
        "{polled}\n{}",
        d.logs()
    );
    let (s, same, again) = call(
        &format!("{}/chat/completions", d.url(0)),
        &[("X-AP-Mode", "wait"), ("X-Request-Id", "k")],
        &chat("e"),
    )
    .await?;
    assert_eq!((s, again.as_deref()), (200, Some("k")), "{same}");
    assert_eq!(same["id"], polled["id"], "a repeat of the id ran it again");
    let (s, _, _) = call(
        &format!("{}/chat/completions", d.url(1)),
        &[("X-AP-Mode", "enqueue"), ("X-Request-Id", "k")],
        &chat("another body"),
    )
    .await?;
    assert_eq!(s, 409);
    let (s, live, _) = call(
        &format!("{}/chat/completions", d.url(1)),
        &[("X-AP-Mode", "passthrough")],
        &chat("live"),
    )
    .await?;
    assert_eq!(
        (s, live["object"].as_str()),
        (200, Some("chat.completion")),
        "{live}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_requests_run_on_a_redis_cluster() -> Fallible {
    let cluster = RedisCluster::start()?;
    let mut d = Deployment::start(5).await?;
    let addrs: Vec<String> = cluster.addrs()[1..].to_vec();
    d.point_at(json!({"url": cluster.seed_urls()[0], "mode": "cluster", "addrs": addrs}))?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    exercise(&d).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_behind_sentinel_loses_no_single_request() -> Fallible {
    let n = 40;
    let set = SentinelSet::start("inferq-front")?;
    let mut d = Deployment::start(300).await?;
    d.point_at(json!({
        "url": set.sentinel_urls()[0],
        "mode": "sentinel",
        "master_name": "inferq-front",
        "addrs": set.sentinel_addrs()[1..].to_vec(),
        "replica_wait": 1,
    }))?;
    d.processor_flags = vec!["--concurrency".into(), "8".into()];
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    exercise(&d).await?;
    // n enqueued requests, each with its key; then a fail-over while they run.
    let mut ids = BTreeSet::new();
    for i in 0..n {
        let key = format!("job-{i}");
        let (s, v, _) = call(
            &format!("{}/chat/completions", d.url(i % 2)),
            &[("X-AP-Mode", "enqueue"), ("X-Request-Id", &key)],
            &chat(&key),
        )
        .await?;
        assert_eq!(s, 202, "{v}");
        ids.insert(v["id"].as_str().unwrap_or_default().to_owned());
    }
    let first = set.master_port()?;
    let second = tokio::task::block_in_place(|| set.failover())?;
    assert_ne!(first, second, "the sentinels kept the old master");
    // Every request ends answered, read through either replica; a repeat of each id joins its
    // request.
    for (i, id) in ids.iter().enumerate() {
        let base = d.url(i % 2);
        let what = format!("request {id} answered");
        until(
            &what,
            Duration::from_secs(60),
            Duration::from_millis(200),
            async || {
                let r = match reqwest::get(format!("{base}/requests/{id}?wait=5")).await {
                    Ok(r) => r,
                    Err(_) => return Ok(None),
                };
                let status = r.status().as_u16();
                let v: Value = r.json().await.unwrap_or(Value::Null);
                assert!(matches!(status, 200 | 202 | 503), "{status} {v}");
                Ok((status == 200 && v["object"] == "chat.completion").then_some(()))
            },
        )
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    }
    for i in 0..n {
        let key = format!("job-{i}");
        let (s, v, _) = call(
            &format!("{}/chat/completions", d.url(1 - i % 2)),
            &[("X-AP-Mode", "enqueue"), ("X-Request-Id", &key)],
            &chat(&key),
        )
        .await?;
        assert_eq!(s, 202, "{v}");
    }
    // Each repeat joined its request (the gateway may have run one twice across the fail-over:
    // execution is at least once, a request's result one).
    let mut joined = 0u64;
    for i in 0..2 {
        let page = d.metrics(i).await?;
        joined += page
            .lines()
            .find_map(|l| l.strip_prefix("inferq_front_joined_total "))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0);
    }
    assert!(
        joined >= n as u64,
        "{joined} of {n} repeats joined their request"
    );
    Ok(())
}

/// How many runs the simulator at `sim` has admitted, all ids together, and its `/executions`.
async fn executions(sim: &str) -> Fallible<(u64, Value)> {
    let counts: Value = reqwest::get(format!("{sim}/executions"))
        .await?
        .json()
        .await?;
    let runs = counts
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    Ok((runs, counts))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_replica_died_retries_with_its_key_through_another() -> Fallible {
    let mut d = Deployment::start(2500).await?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let url0 = format!("{}/chat/completions", d.url(0));
    let waiting = tokio::spawn(async move {
        call(
            &url0,
            &[("X-AP-Mode", "wait"), ("Idempotency-Key", "survivor")],
            &chat("keep me"),
        )
        .await
    });
    // The gateway is running it (so the retry below must join that run, not start another)
    // before the replica it came through dies.
    let sim = d.sim.base_url();
    until(
        "the request running at the gateway",
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || Ok((executions(&sim).await?.0 >= 1).then_some(())),
    )
    .await?;
    d.kill_replica(0);
    assert!(waiting.await?.is_err(), "the killed replica answered");
    // The retry, on the other replica: the same request (no second run), answered when done.
    let (s, body, id) = call(
        &format!("{}/chat/completions", d.url(1)),
        &[("X-AP-Mode", "wait"), ("Idempotency-Key", "survivor")],
        &chat("keep me"),
    )
    .await?;
    assert_eq!(s, 200, "{body}\n{}", d.logs());
    assert_eq!(id.as_deref(), Some("survivor"));
    let (runs, counts) = executions(&sim).await?;
    assert_eq!(runs, 1, "the gateway ran it {runs} times: {counts}");
    let got: Value = reqwest::get(format!("{}/requests/survivor", d.url(1)))
        .await?
        .json()
        .await?;
    assert_eq!(got["id"], body["id"], "{got}");
    Ok(())
}
