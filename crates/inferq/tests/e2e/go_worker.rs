//! What newer Go's worker does with a gateway's answers and headers (go-newer §7), and its
//! backlog source gauge (§6), checked end to end through `inferq run` with a real Redis and the
//! test gateway: `Retry-After` on a 503 (in seconds and as an HTTP date), the gateway's
//! `x-llm-d-request-dropped-reason` in a result's error message, the fairness header replacing
//! a caller's own, and `broker_backlog_source_available` following Redis.

use crate::common;

use std::time::{Duration, SystemTime};

use common::*;
use inferq_testkit::RedisServer;

const Q: &str = "request-sortedset";

/// A 503's `Retry-After` is honoured whether it gives seconds or an HTTP date: the retry waits
/// at least that long (Go's first backoff alone is [2, 4) s), and each is one retry, not a shed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_retry_after_in_seconds_or_as_a_date_is_honoured() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "ra-seconds",
        vec![
            Reply::status(503, "busy").header("retry-after", "5"),
            Reply::ok("{}"),
        ],
    );
    // Whole seconds: 6 to 7 s from now when formatted, at least 5 s when the 503 is read.
    let date = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(7));
    gw.script(
        "ra-date",
        vec![
            Reply::status(503, "busy").header("retry-after", &date),
            Reply::ok("{}"),
        ],
    );
    let p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let producer = producer(&redis, Q).await;
    for id in ["ra-seconds", "ra-date"] {
        producer.submit(request(id, 120, "{}")).await.unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.status_code == 200), "{got:?}");
    for (id, at_least) in [("ra-seconds", 4900), ("ra-date", 4500)] {
        let seen = gw.seen(id);
        assert_eq!(seen.len(), 2, "{id}");
        let gap = seen[1].at - seen[0].at;
        assert!(
            gap >= Duration::from_millis(at_least) && gap < Duration::from_secs(15),
            "{id}: Retry-After honoured, waited {gap:?}"
        );
    }
    let metrics = p.metrics().await;
    assert!(metrics.contains(r#"llm_d_async_async_request_retries_total{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 2"#), "{metrics}");
    assert!(
        metrics.contains(r#"llm_d_async_async_shedded_requests_total{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0"#),
        "{metrics}"
    );
}

/// The gateway's `x-llm-d-request-dropped-reason` reaches the error message of a request that
/// ends in an error (here a body past inferq's 64 MiB limit): `(dropped: <reason>)`, as Go's
/// error strings carry it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_s_dropped_reason_is_in_the_error_message() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let huge = "x".repeat(inferq::gateway::DEFAULT_BODY_LIMIT + 1);
    gw.script(
        "evicted",
        vec![Reply::status(503, &huge).header("x-llm-d-request-dropped-reason", "evicted-ttl")],
    );
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("evicted", 60, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].error_code, "INFERENCE_ERROR");
    assert!(
        got[0].error_message.ends_with(" (dropped: evicted-ttl)"),
        "{}",
        got[0].error_message
    );
    assert_eq!(gw.seen("evicted").len(), 1, "not retried");
}

/// The fairness header is stamped from the `userid` metadata and replaces a caller's own
/// `X-LLM-D-Inference-Fairness-Id` (any letter case): one value reaches the gateway. A value
/// too long to stamp (over 256 bytes) leaves the caller's header as it was, as in Go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fairness_header_replaces_a_caller_s_value() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let producer = producer(&redis, Q).await;
    let long = "u".repeat(257);
    for (id, user, header) in [
        ("f-upper", Some("alice"), "X-LLM-D-Inference-Fairness-Id"),
        ("f-mixed", Some("bob"), "x-llm-d-INFERENCE-fairness-id"),
        (
            "f-long",
            Some(long.as_str()),
            "X-LLM-D-Inference-Fairness-Id",
        ),
        ("f-none", None, "X-LLM-D-Inference-Fairness-Id"),
    ] {
        let mut r = request(id, 60, "{}");
        r.headers.insert(header.into(), "spoofed".into());
        if let Some(user) = user {
            r.metadata.insert("userid".into(), user.into());
        }
        producer.submit(r).await.unwrap();
    }
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 4, Duration::from_secs(10))
            .await
            .len(),
        4
    );
    for (id, want) in [
        ("f-upper", "alice"),
        ("f-mixed", "bob"),
        ("f-long", "spoofed"),
        ("f-none", "spoofed"),
    ] {
        let seen = gw.seen(id);
        let values: Vec<_> = seen[0]
            .headers
            .get_all("x-llm-d-inference-fairness-id")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect();
        assert_eq!(values, [want], "{id}");
    }
}

/// `broker_backlog_source_available` is 1 while the backlog can be read, 0 while Redis is
/// unreachable (the backlog then reads 0, as Go's), and 1 again once Redis is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backlog_source_gauge_follows_redis() {
    let mut redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_args: vec!["--metrics-backlog-poll-interval=200ms".to_owned()],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let series = |v: u8| {
        format!(
            r#"llm_d_async_async_broker_backlog_source_available{{pool_name="default",queue_id="{Q}",queue_name="{Q}"}} {v}"#
        )
    };
    let metrics = p.metrics_with(&[&series(1)]).await;
    assert!(metrics.contains(&series(1)), "{metrics}");
    redis.kill();
    let metrics = p.metrics_with(&[&series(0)]).await;
    assert!(metrics.contains(&series(0)), "Redis down: {metrics}");
    assert!(
        metrics.contains(&format!(
            r#"llm_d_async_async_broker_backlog{{pool_name="default",queue_id="{Q}",queue_name="{Q}"}} 0"#
        )),
        "{metrics}"
    );
    redis.restart().unwrap();
    let metrics = p.metrics_with(&[&series(1)]).await;
    assert!(metrics.contains(&series(1)), "Redis back: {metrics}");
}
