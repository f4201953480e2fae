//! Newer Go's behaviour (go-v011) against real processes: a Go merge-policy file with
//! `lane_objectives` and its stamping, `--gate-wait-timeout` putting a request back, the new
//! counters (`dispatched_requests_total`, `tokens_total`, `deadline_proximity_millis`), a
//! transport error retried, a transform's `Content-Type` replacing the caller's whatever its
//! case, and the redis-pubsub deprecation warning.

use std::time::{Duration, Instant};

use inferq_testkit::RedisServer;
use redis::AsyncCommands;

use crate::common::{
    con, producer, request, wait_results, Gateway, Processor, ProcessorOpts, Reply,
};

const Q: &str = "request-sortedset";

/// The value of the series `series` (its full name and labels) on `page`.
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The default queue's labels, as the page writes them.
const LABELS: &str =
    r#"pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset""#;

/// A Go config of the `tier-priority` policy (#443) with `lane_objectives` and
/// `fairness_attribute`: each lane's objective is stamped into `x-llm-d-inference-objective`,
/// replacing a caller's header of that name in any case; no `x-gateway-priority` is stamped
/// (its default is now `""`); the fairness id is stamped when non-empty, at most 256 bytes and
/// a legal header value, replacing the caller's, and left out otherwise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_tier_priority_config_stamps_each_lane_s_objective() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let policy = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        policy.path(),
        r#"{"type":"tier-priority","parameters":{"objective_header":"x-llm-d-inference-objective",
            "lane_objectives":{"overflow-interactive":"chat-objective","overflow-batch":"bulk-objective"},
            "fairness_attribute":"tenant"}}"#,
    )
    .unwrap();
    let config = format!(
        r#"{{"url":"{}","poll_interval_ms":50,"queues":[
            {{"queue_name":"batch-q","igw_base_url":"{gw}","labels":{{"tier":"batch"}}}},
            {{"queue_name":"live-q","igw_base_url":"{gw}","labels":{{"tier":"interactive"}}}}]}}"#,
        redis.url(),
        gw = gateway.url()
    );
    let opts = ProcessorOpts {
        transport_args: Some(vec![
            "--transport=redis-sortedset".to_owned(),
            format!("--transport-config={config}"),
            format!(
                "--request-merge-policy-config-file={}",
                policy.path().display()
            ),
        ]),
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gateway, &opts).await;
    let mut live = request("live", 60, "{}");
    live.headers.insert(
        "X-LLM-D-Inference-Objective".to_owned(),
        "spoofed".to_owned(),
    );
    live.headers.insert(
        "X-LLM-D-INFERENCE-FAIRNESS-ID".to_owned(),
        "mallory".to_owned(),
    );
    live.metadata
        .insert("tenant".to_owned(), "alice".to_owned());
    producer(&redis, "live-q").await.submit(live).await.unwrap();
    let batch = producer(&redis, "batch-q").await;
    let mut long = request("long-tenant", 60, "{}");
    long.metadata.insert("tenant".to_owned(), "t".repeat(257));
    let mut exact = request("exact-tenant", 60, "{}");
    exact.metadata.insert("tenant".to_owned(), "e".repeat(256));
    let mut empty = request("empty-tenant", 60, "{}");
    empty.metadata.insert("tenant".to_owned(), String::new());
    let mut illegal = request("illegal-tenant", 60, "{}");
    illegal
        .metadata
        .insert("tenant".to_owned(), "line\nbreak".to_owned());
    for r in [long, exact, empty, illegal] {
        batch.submit(r).await.unwrap();
    }
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 5, Duration::from_secs(20))
            .await
            .len(),
        5
    );
    let headers = |id: &str| gateway.seen(id)[0].headers.clone();
    let all = |h: &reqwest::header::HeaderMap, name: &str| -> Vec<String> {
        h.get_all(name)
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect()
    };
    let h = headers("live");
    assert_eq!(
        all(&h, "x-llm-d-inference-objective"),
        ["chat-objective"],
        "{h:?}"
    );
    assert_eq!(all(&h, "x-llm-d-inference-fairness-id"), ["alice"], "{h:?}");
    for id in [
        "long-tenant",
        "exact-tenant",
        "empty-tenant",
        "illegal-tenant",
    ] {
        let h = headers(id);
        assert_eq!(
            all(&h, "x-llm-d-inference-objective"),
            ["bulk-objective"],
            "{id}: {h:?}"
        );
        assert!(h.get("x-gateway-priority").is_none(), "{id}: {h:?}");
        let fairness = all(&h, "x-llm-d-inference-fairness-id");
        let want: Vec<String> = match id {
            "exact-tenant" => vec!["e".repeat(256)],
            _ => vec![],
        };
        assert_eq!(fairness, want, "{id}");
    }
    assert!(headers("live").get("x-gateway-priority").is_none());
}

/// `--gate-wait-timeout`: a request waiting at a pool gate that stays shut is put back in its
/// queue after the timeout (not failed, not a retry), counted in `gate_wait_requeues_total`
/// (there at 0 from start-up), and completes once the gate opens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waiting_past_the_gate_wait_timeout_goes_back_and_completes_later() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("dispatch-gate-budget", "0").await.unwrap();
    let opts = ProcessorOpts {
        pools: Some(format!(
            r#"[{{"id":"default","workers":2,"gate_type":"wait-on-refuse","gate_params":{{"gate":{{"gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}}}}}}}]"#,
            redis.port()
        )),
        extra_args: vec!["--gate-wait-timeout=700ms".to_owned()],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let requeues = format!("llm_d_async_async_gate_wait_requeues_total{{{LABELS}}}");
    let page = p.metrics().await;
    assert_eq!(value(&page, &requeues), Some(0.0), "{page}");
    let held = request("held", 60, "{}");
    // Its score: the deadline plus its FIFO fraction (newer Go's enqueue_seq / 2^21).
    let deadline = held.deadline;
    let submitted = producer(&redis, Q).await.submit(held).await.unwrap();
    let score = deadline as f64 + submitted.enqueue_seq as f64 / 2_097_152.0;
    // Put back at least twice: it was claimed again after the first. Whenever it is seen back
    // in pending, it has its first score.
    let started = Instant::now();
    loop {
        let page = p.metrics().await;
        if value(&page, &requeues).unwrap_or(0.0) >= 2.0 {
            break;
        }
        let pending: Vec<(String, f64)> = con.zrange_withscores(Q, 0, -1).await.unwrap();
        for (_, seen) in &pending {
            assert_eq!(*seen, score, "put back with another score");
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "not put back: {page}\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gw.executions().is_empty(), "the gate never opened");
    let results: u64 = con.llen("result-list").await.unwrap();
    assert_eq!(results, 0, "put back, not failed");
    let page = p.metrics().await;
    let retries = format!("llm_d_async_async_request_retries_total{{{LABELS}}}");
    assert_eq!(value(&page, &retries), Some(0.0), "not a retry: {page}");
    let _: () = con.set("dispatch-gate-budget", "1").await.unwrap();
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1, "{}", p.log());
    assert_eq!((got[0].id.as_str(), got[0].status_code), ("held", 200));
    assert_eq!(
        got[0].request_token, submitted.request_token,
        "the same generation"
    );
    assert_eq!(gw.seen("held").len(), 1);
}

/// `dispatched_requests_total` counts every send, retries included; `tokens_total` adds the
/// answers' `usage`, and an answer without one adds nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sends_and_tokens_are_counted() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "twice",
        vec![
            Reply::status(503, "{}"),
            Reply::ok(r#"{"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":3}}"#),
        ],
    );
    gw.script(
        "once",
        vec![Reply::ok(
            r#"{"usage":{"prompt_tokens":10,"completion_tokens":20,"total_tokens":30}}"#,
        )],
    );
    gw.script("none", vec![Reply::ok(r#"{"choices":[{"text":"usage"}]}"#)]);
    let p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let dispatched = format!("llm_d_async_async_dispatched_requests_total{{{LABELS}}}");
    let input = format!(r#"llm_d_async_async_tokens_total{{direction="input",{LABELS}}}"#);
    let output = format!(r#"llm_d_async_async_tokens_total{{direction="output",{LABELS}}}"#);
    let page = p.metrics().await;
    for series in [&dispatched, &input, &output] {
        assert_eq!(value(&page, series), Some(0.0), "{series}: {page}");
    }
    let producer = producer(&redis, Q).await;
    for id in ["twice", "once", "none"] {
        producer.submit(request(id, 60, "{}")).await.unwrap();
    }
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 3, Duration::from_secs(20))
            .await
            .len(),
        3
    );
    let page = p.metrics().await;
    assert_eq!(value(&page, &dispatched), Some(4.0), "{page}");
    assert_eq!(value(&page, &input), Some(17.0), "{page}");
    assert_eq!(value(&page, &output), Some(23.0), "{page}");
}

/// `deadline_proximity_millis`: the backlog poll's snapshot of the pending requests by
/// milliseconds to their deadline (one passed, one 20 s away, one an hour away).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deadline_proximity_snapshot_counts_pending_requests_by_time_left() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("dispatch-gate-budget", "0").await.unwrap();
    let opts = ProcessorOpts {
        // A shut queue gate keeps them pending.
        extra_queue_fields: format!(
            r#","gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}"#,
            redis.port()
        ),
        extra_args: vec!["--metrics-backlog-poll-interval=200ms".to_owned()],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for (id, secs) in [("soon", 20), ("later", 3600)] {
        producer.submit(request(id, secs, "{}")).await.unwrap();
    }
    // A producer refuses a passed deadline; a member whose deadline passed while it waited
    // scores as this one (the queue gate is shut: nothing is claimed).
    let past = inferq_client::producer::unix_ms() / 1000 - 5;
    let _: () = con.zadd(Q, "past", past).await.unwrap();
    let bucket = |le: &str| {
        format!(r#"llm_d_async_async_deadline_proximity_millis_bucket{{{LABELS},le="{le}"}}"#)
    };
    let inf = bucket("+Inf");
    let started = Instant::now();
    let page = loop {
        let page = p.metrics().await;
        if value(&page, &inf) == Some(3.0) || started.elapsed() > Duration::from_secs(10) {
            break page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (le, want) in [
        ("0", 1.0),
        ("10000", 1.0),
        ("30000", 2.0),
        ("3.6e+06", 3.0),
        ("+Inf", 3.0),
    ] {
        assert_eq!(value(&page, &bucket(le)), Some(want), "le {le}: {page}");
    }
    assert!(
        page.contains("# TYPE llm_d_async_async_deadline_proximity_millis histogram"),
        "{page}"
    );
}

/// #483: a connection refused before any answer is retried with backoff (counted as a retry
/// and as a second send), not a terminal `INFERENCE_ERROR`; out of time, it ends
/// `DEADLINE_EXCEEDED`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_is_retried_until_the_deadline() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let closed = inferq_testkit::free_port().unwrap();
    let config = format!(
        r#"{{"url":"{}","poll_interval_ms":50,"queues":[{{"queue_name":"{Q}","igw_base_url":"http://127.0.0.1:{closed}"}}]}}"#,
        redis.url()
    );
    let opts = ProcessorOpts {
        transport_args: Some(vec![
            "--transport=redis-sortedset".to_owned(),
            format!("--transport-config={config}"),
        ]),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    producer(&redis, Q)
        .await
        .submit(request("nowhere", 6, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].error_code, "DEADLINE_EXCEEDED", "{:?}", got[0]);
    let page = p.metrics().await;
    let retries = format!("llm_d_async_async_request_retries_total{{{LABELS}}}");
    let dispatched = format!("llm_d_async_async_dispatched_requests_total{{{LABELS}}}");
    assert!(value(&page, &retries).unwrap_or(0.0) >= 1.0, "{page}");
    assert!(value(&page, &dispatched).unwrap_or(0.0) >= 2.0, "{page}");
}

/// #442: the processor warns at start-up that the redis-pubsub transport is deprecated, and
/// says nothing of it on the sorted-set transport.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_pubsub_is_announced_deprecated_at_start_up() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let sorted = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let opts = ProcessorOpts {
        transport_args: Some(vec![
            "--transport".into(),
            "redis-pubsub".into(),
            "--transport-config".into(),
            format!(
                r#"{{"url":"{}","queues":[{{"queue_name":"request-queue","igw_base_url":"{}"}}]}}"#,
                redis.url(),
                gw.url()
            ),
        ]),
        ..ProcessorOpts::default()
    };
    let pubsub = Processor::start(&redis, &gw, &opts).await;
    let warning = "the redis-pubsub transport is deprecated";
    let log = pubsub.log();
    let line = log.lines().find(|l| l.contains(warning));
    assert!(
        line.is_some_and(|l| l.contains("WARN")),
        "no warning in:\n{log}"
    );
    assert!(!sorted.log().contains(warning), "{}", sorted.log());
}

/// The cost of one `deadline_proximity_millis` reading (the backlog poll's one pipeline: `ZCARD`
/// and 13 `ZCOUNT`s) on a queue of a million pending members, beside a bare `ZCARD` round trip.
/// Run by hand (`--ignored --nocapture`); the figure is in docs/benchmarks.md.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: fills a million members"]
async fn deadline_proximity_costs_one_round_trip_on_a_million_members() {
    let redis = RedisServer::start().unwrap();
    let mut con = con(&redis).await;
    let now_ms = inferq_client::producer::unix_ms();
    // Deadlines spread over the next two days, 10,000 members a script call.
    let fill = redis::Script::new(
        r"for i = tonumber(ARGV[1]), tonumber(ARGV[1]) + 9999 do
            redis.call('ZADD', KEYS[1], tonumber(ARGV[2]) + (i % 172800) + i / 2097152, 'member-' .. i)
          end",
    );
    for chunk in 0..100 {
        let _: () = fill
            .key(Q)
            .arg(chunk * 10_000)
            .arg(now_ms / 1000)
            .invoke_async(&mut con)
            .await
            .unwrap();
    }
    let n: u64 = con.zcard(Q).await.unwrap();
    assert_eq!(n, 1_000_000);
    let time = |samples: &mut Vec<Duration>| {
        samples.sort();
        (
            samples[samples.len() / 2],
            samples[samples.len() * 99 / 100],
        )
    };
    let mut zcard = Vec::new();
    let mut reading = Vec::new();
    for _ in 0..500 {
        let t = Instant::now();
        let _: u64 = con.zcard(Q).await.unwrap();
        zcard.push(t.elapsed());
        let t = Instant::now();
        let r = inferq::dispatch::proximity::read(&mut con, Q, now_ms)
            .await
            .unwrap();
        reading.push(t.elapsed());
        assert_eq!(r.pending, 1_000_000);
        assert!(r.within.windows(2).all(|w| w[0] <= w[1]), "{r:?}");
    }
    let (zcard_median, zcard_p99) = time(&mut zcard);
    let (median, p99) = time(&mut reading);
    // Redis's own time per command, from its statistics.
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut con)
        .await
        .unwrap();
    let zcount = stats
        .lines()
        .find(|l| l.starts_with("cmdstat_zcount:"))
        .unwrap_or("")
        .to_owned();
    println!(
        "1M members: ZCARD round trip median {zcard_median:?} p99 {zcard_p99:?}; \
         proximity pipeline (ZCARD + 13 ZCOUNT) median {median:?} p99 {p99:?}; {zcount}"
    );
}
