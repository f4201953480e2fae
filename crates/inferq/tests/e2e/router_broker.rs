//! inferq behind the llm-d router's `async-broker` step (issue 43), the step emulated by
//! `inferq_testkit::router_broker`: requests enqueued as the step enqueues them, results read as
//! the step reads them.
//!
//! The step's own docs say delivery through it is at most once (a Go processor that pops a
//! message and crashes loses it). Through inferq it is exactly one result per request: the
//! SIGKILL test keeps that true. The others check what the step expects of a processor: the
//! mailbox and its TTL, the `request-active` marker cleared by compare-and-delete on its token,
//! `CANCELLED` and `DEADLINE_EXCEEDED` answered as the step maps them, the SLO headers and the
//! `endpoint` honoured.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use inferq_testkit::router_broker::{BrokerConfig, Queued, RouterBroker, Served};
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

use crate::common::{con, Gateway, Processor, ProcessorOpts, Reply};

/// The queue config the router's docs ask for: no `result_queue_name` (each message names its
/// mailbox), a result TTL.
const RESULT_TTL: &str = r#","result_ttl_seconds":600"#;

fn opts() -> ProcessorOpts {
    ProcessorOpts {
        lease_s: 1.5,
        reclaim_ms: 300,
        extra_queue_fields: RESULT_TTL.to_owned(),
        ..ProcessorOpts::default()
    }
}

/// A Redis with the keyspace notifications the step's `wait` wakes on.
async fn redis() -> (RedisServer, redis::aio::ConnectionManager) {
    let redis = RedisServer::start().unwrap();
    let mut con = con(&redis).await;
    inferq_testkit::config_set(&mut con, "notify-keyspace-events", "Kl")
        .await
        .unwrap();
    (redis, con)
}

async fn enqueue(broker: &RouterBroker, path: &str, headers: &[(&str, &str)]) -> Queued {
    let mut all = vec![("x-ap-mode", "enqueue")];
    all.extend_from_slice(headers);
    match broker
        .post(path, &all, br#"{"model":"m","prompt":"hi"}"#)
        .await
    {
        Served::Queued { queued, .. } => queued,
        other => panic!("not queued: {other:?}"),
    }
}

/// Polls `check` every 20 ms until it holds, failing after `limit`.
async fn until<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `mailbox` holds at least `n` results, failing after `limit`.
async fn until_results(
    con: &redis::aio::ConnectionManager,
    mailbox: &str,
    n: i64,
    limit: Duration,
) {
    let what = format!("{n} result(s) in {mailbox}");
    until(&what, limit, || {
        let mut con = con.clone();
        let mailbox = mailbox.to_owned();
        async move { con.llen::<_, i64>(mailbox).await.unwrap() >= n }
    })
    .await;
}

/// 300 requests through the step, a third of them held in `wait`, two tenants, both paths, a few
/// with SLO headers and a traceparent; the processor SIGKILLed with requests in flight and
/// restarted. Every request gets exactly one result in its own mailbox (with the queue's TTL),
/// every marker is cleared, every `wait` is answered with its request's own result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_through_the_step_and_a_sigkill_get_one_result_each() {
    let (redis, mut con) = redis().await;
    let gw = Gateway::start().await;
    let broker = RouterBroker::connect(&redis.url(), BrokerConfig::default())
        .await
        .unwrap();
    assert!(broker.notify());

    let mut queued: Vec<Queued> = Vec::new();
    let mut waits = Vec::new();
    for i in 0..300 {
        let tenant = if i % 2 == 0 { "acme" } else { "beta" };
        let id = format!("r{i}");
        let env = format!("{tenant}:{id}");
        gw.script(
            &env,
            vec![Reply::ok(&format!(r#"{{"answer":"{env}"}}"#)).after(Duration::from_millis(60))],
        );
        let path = if i % 3 == 1 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let mut headers = vec![("x-team", tenant), ("x-request-id", id.as_str())];
        if i % 50 == 0 {
            headers.push(("x-llm-d-slo-ttft-ms", "250"));
            headers.push(("x-llm-d-slo-tpot-ms", "20"));
            headers.push((
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ));
        }
        if i % 3 == 0 {
            let broker = broker.clone();
            let owned: Vec<(String, String)> = headers
                .iter()
                .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
                .chain([("x-ap-mode".to_owned(), "wait".to_owned())])
                .collect();
            let path = path.to_owned();
            waits.push((
                env.clone(),
                tokio::spawn(async move {
                    let headers: Vec<(&str, &str)> = owned
                        .iter()
                        .map(|(n, v)| (n.as_str(), v.as_str()))
                        .collect();
                    broker
                        .post(&path, &headers, br#"{"model":"m","prompt":"hi"}"#)
                        .await
                }),
            ));
        } else {
            queued.push(enqueue(&broker, path, &headers).await);
        }
    }
    until("the waits to be queued", Duration::from_secs(20), || {
        let mut con = con.clone();
        async move { con.zcard::<_, i64>("request-sortedset").await.unwrap() == 300 }
    })
    .await;

    let mut first = Processor::start(&redis, &gw, &opts()).await;
    until("60 requests served", Duration::from_secs(30), || {
        let n = gw.executions().len();
        async move { n >= 60 }
    })
    .await;
    first.kill();
    let _second = Processor::start(&redis, &gw, &opts()).await;

    for (env, wait) in waits {
        let Served::Queued { answer, .. } = wait.await.unwrap() else {
            panic!("{env}: not queued");
        };
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!(r#"{{"answer":"{env}"}}"#)),
            "{env}"
        );
    }
    for q in &queued {
        until_results(&con, &q.mailbox, 1, Duration::from_secs(60)).await;
    }
    // Every request's marker goes when its result is written: when the last is gone, nothing
    // is in flight and a duplicate result would already be there.
    until("every marker cleared", Duration::from_secs(20), || {
        let mut con = con.clone();
        async move {
            let left: Vec<String> = con.keys("request-active:*").await.unwrap();
            left.is_empty()
        }
    })
    .await;

    for q in &queued {
        let results: Vec<String> = con.lrange(&q.mailbox, 0, -1).await.unwrap();
        assert_eq!(results.len(), 1, "{}: {results:?}", q.mailbox);
        let result: serde_json::Value = serde_json::from_str(&results[0]).unwrap();
        assert_eq!(result["id"], q.envelope_id.as_str());
        assert_eq!(result["status_code"], 200);
        let ttl: i64 = con.ttl(&q.mailbox).await.unwrap();
        assert!((1..=600).contains(&ttl), "{}: ttl {ttl}", q.mailbox);
        let answer = broker.fetch(Some(&q.tenant), &q.id).await;
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!(r#"{{"answer":"{}"}}"#, q.envelope_id))
        );
    }
    // A delivered wait's mailbox was deleted: no second result brought it back.
    let mailboxes: Vec<String> = con.keys("results:req:*").await.unwrap();
    assert_eq!(mailboxes.len(), queued.len(), "{mailboxes:?}");
    let queue_left: i64 = con.zcard("request-sortedset").await.unwrap();
    assert_eq!(queue_left, 0);

    let executions: HashMap<String, usize> = gw.executions();
    assert_eq!(executions.len(), 300);
    let redone = executions.values().filter(|n| **n > 1).count();
    assert!(
        redone > 0,
        "the kill caught nothing in flight: the test proved nothing"
    );
    eprintln!(
        "{redone} requests ran twice (in flight on the killed processor), each answered once"
    );

    for i in 0..300 {
        let tenant = if i % 2 == 0 { "acme" } else { "beta" };
        let seen = gw.seen(&format!("{tenant}:r{i}"));
        let path = if i % 3 == 1 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        for attempt in &seen {
            assert_eq!(attempt.path, path, "r{i}: the endpoint is honoured");
            let slo = attempt
                .headers
                .get("x-llm-d-slo-ttft-ms")
                .map(|v| v.to_str().unwrap().to_owned());
            let expected = (i % 50 == 0).then(|| "250".to_owned());
            assert_eq!(slo, expected, "r{i}");
            if i % 50 == 0 {
                assert_eq!(attempt.headers["x-llm-d-slo-tpot-ms"], "20");
            }
        }
    }
}

/// What the step's cancel and deadline become: a request cancelled through the producer's
/// script, and a `wait` whose client went away, are answered `CANCELLED` (the step's 499), one
/// whose deadline passed before dispatch `DEADLINE_EXCEEDED` (504); none reaches the gateway,
/// and their markers are cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_deadline_read_as_the_step_expects() {
    let (redis, mut con) = redis().await;
    let gw = Gateway::start().await;
    let broker = RouterBroker::connect(&redis.url(), BrokerConfig::default())
        .await
        .unwrap();
    let cancelled = enqueue(&broker, "/v1/completions", &[("x-request-id", "c1")]).await;
    assert!(broker.cancel("default", "c1").await.unwrap());
    let held = {
        let broker = broker.clone();
        tokio::spawn(async move {
            let headers = [("x-ap-mode", "wait"), ("x-request-id", "c2")];
            broker
                .post("/v1/completions", &headers, br#"{"model":"m"}"#)
                .await
        })
    };
    let late = enqueue(
        &broker,
        "/v1/completions",
        &[("x-request-id", "d1"), ("x-request-timeout-seconds", "1")],
    )
    .await;
    until("the wait to be queued", Duration::from_secs(10), || {
        let mut con = con.clone();
        async move { con.zcard::<_, i64>("request-sortedset").await.unwrap() == 3 }
    })
    .await;
    // The client goes away: the step cancels.
    held.abort();
    until("the wait's cancel marker", Duration::from_secs(10), || {
        let mut con = con.clone();
        async move {
            con.exists::<_, bool>("request-cancel:default:c2")
                .await
                .unwrap()
        }
    })
    .await;
    until("d1's deadline to pass", Duration::from_secs(10), || {
        let now = inferq_client::producer::unix_ms() / 1000;
        async move { now > late.deadline }
    })
    .await;

    let _processor = Processor::start(&redis, &gw, &opts()).await;
    for (id, status, code) in [
        ("c1", 499, "CANCELLED"),
        ("c2", 499, "CANCELLED"),
        ("d1", 504, "DEADLINE_EXCEEDED"),
    ] {
        let mailbox = format!("results:req:default:{id}");
        until_results(&con, &mailbox, 1, Duration::from_secs(20)).await;
        let answer = broker.fetch(None, id).await;
        assert_eq!(answer.status, status, "{id}: {}", answer.text());
        assert_eq!(answer.json()["error"]["code"], code, "{id}");
        let ttl: i64 = con.ttl(&mailbox).await.unwrap();
        assert!(
            (1..=60).contains(&ttl),
            "{id}: the fetch's grace, ttl {ttl}"
        );
        let active: bool = con
            .exists(format!("request-active:default:{id}"))
            .await
            .unwrap();
        assert!(!active, "{id}: marker cleared");
        assert!(
            gw.seen(&format!("default:{id}")).is_empty(),
            "{id} was sent"
        );
    }
    assert_eq!(cancelled.envelope_id, "default:c1");
}

/// Compare-and-delete on the token: a request resubmitted under the same id while its first
/// generation is in flight keeps its marker when the first finishes; the marker goes when the
/// newer generation's own result is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_generation_does_not_clear_a_newer_marker() {
    let (redis, mut con) = redis().await;
    let gw = Gateway::start().await;
    gw.script(
        "acme:s1",
        vec![
            Reply::ok("first").after(Duration::from_millis(1500)),
            Reply::ok("second").after(Duration::from_secs(6)),
        ],
    );
    let broker = RouterBroker::connect(&redis.url(), BrokerConfig::default())
        .await
        .unwrap();
    let _processor = Processor::start(&redis, &gw, &opts()).await;
    let headers = [("x-team", "acme"), ("x-request-id", "s1")];
    let first = enqueue(&broker, "/v1/completions", &headers).await;
    gw.wait_seen("acme:s1", Duration::from_secs(10)).await;
    let second = enqueue(&broker, "/v1/completions", &headers).await;
    assert_ne!(first.token, second.token);

    until_results(&con, "results:req:acme:s1", 1, Duration::from_secs(10)).await;
    let active: Option<String> = con.get("request-active:acme:s1").await.unwrap();
    assert_eq!(
        active.as_deref(),
        Some(second.token.as_str()),
        "the first generation's finish cleared the second's marker"
    );
    assert_eq!(broker.fetch(Some("acme"), "s1").await.text(), "first");

    until_results(&con, "results:req:acme:s1", 2, Duration::from_secs(20)).await;
    let active: Option<String> = con.get("request-active:acme:s1").await.unwrap();
    assert_eq!(active, None);
    assert_eq!(broker.fetch(Some("acme"), "s1").await.text(), "second");
    assert_eq!(gw.seen("acme:s1").len(), 2);
}
