//! End-to-end tests of `inferq run`: real processes, a real Redis, a real HTTP gateway.
//! Each test states the user-visible behaviour it checks.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

const Q: &str = "request-sortedset";

/// Success path: the gateway gets the exact payload bytes, Go's headers and URL; the result
/// list gets the Go ResultMessage with the raw body as a string.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn success_path_speaks_the_go_wire_format() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let body = r#"{"id":"cmpl-7","choices":[{"text":"<b>hi</b>"}]}"#;
    gw.script("ok-1", vec![Reply::status(201, body)]);
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let producer = producer(&redis, Q).await;
    let payload = r#"{"model":"m","prompt":"<tags> & more","seed":12345678901234567890,"t":1.0}"#;
    let mut req = request("ok-1", 60, payload);
    req.metadata.insert("userid".into(), "alice".into());
    req.headers.insert("X-Custom".into(), "yes".into());
    producer.submit(req).await.unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let raw = raw_results(&mut con, "result-list").await;
    // As newer Go's json.Marshal writes it: the generation's token beside the id, the body as a
    // string, with `<` and `>` escaped.
    let token = &got[0].request_token;
    assert_eq!(token.len(), 32, "the producer's token: {}", raw[0]);
    assert_eq!(
        raw[0],
        format!(
            r#"{{"id":"ok-1","request_token":"{token}","status_code":201,"payload":"{{\"id\":\"cmpl-7\",\"choices\":[{{\"text\":\"\u003cb\u003ehi\u003c/b\u003e\"}}]}}"}}"#
        )
    );
    let seen = gw.seen("ok-1");
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].path, "/v1/completions");
    assert_eq!(
        &seen[0].body[..],
        payload.as_bytes(),
        "payload bytes must pass through unchanged"
    );
    let h = &seen[0].headers;
    assert_eq!(h["content-type"], "application/json");
    assert_eq!(h["x-gateway-inference-objective"], "batch-obj");
    assert_eq!(h["x-custom"], "yes");
    assert_eq!(h["x-llm-d-inference-fairness-id"], "alice");
    // Nothing left behind: no claim, nothing pending, producer keys cleaned up.
    let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
    let pending: u64 = con.zcard(Q).await.unwrap();
    let active: Option<String> = con.get("request-active:ok-1").await.unwrap();
    assert_eq!((claimed, pending, active), (0, 0, None));
}

/// A member written by hand exactly as the Go producer writes it (envelope, token, routing)
/// is processed and its result lands on the result list the member names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_producer_member_written_by_hand() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let mut con = con(&redis).await;
    let deadline = inferq_client::producer::unix_ms() / 1000 + 60;
    let member = format!(
        r#"{{"internal":{{"request_token":"9f0c1e0000000000000000000000abcd","request_queue_name":"{Q}","result_queue_name":"go-results"}},"request_kind":"plain","data":{{"id":"go-1","created":1764044000,"deadline":{deadline},"payload":{{"model":"m","prompt":"hi"}},"metadata":{{"userid":"u1"}}}}}}"#
    );
    let _: () = redis::pipe()
        .atomic()
        .del("request-cancel:go-1")
        .set_ex(
            "request-active:go-1",
            "9f0c1e0000000000000000000000abcd",
            60,
        )
        .zadd(Q, &member, deadline)
        .query_async(&mut con)
        .await
        .unwrap();
    let started = Instant::now();
    let mut raw = Vec::new();
    while raw.is_empty() && started.elapsed() < Duration::from_secs(10) {
        raw = raw_results(&mut con, "go-results").await;
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(raw.len(), 1);
    assert!(
        raw[0].starts_with(r#"{"id":"go-1","request_token":"9f0c1e0000000000000000000000abcd","status_code":200,"payload":"{\"id\":\"cmpl-1\""#),
        "{}",
        raw[0]
    );
    assert_eq!(
        gw.seen("go-1")[0].body.as_ref(),
        br#"{"model":"m","prompt":"hi"}"#
    );
}

/// 503 is retried (parked with Go's backoff) until the gateway answers 200: one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_error_then_success() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "r503",
        vec![Reply::status(503, "busy"), Reply::ok(r#"{"ok":true}"#)],
    );
    let p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("r503", 60, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].status_code, got[0].payload.as_str()),
        (200, r#"{"ok":true}"#)
    );
    let seen = gw.seen("r503");
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(1900),
        "first retry waits [2,4) s, waited {gap:?}"
    );
    assert!(p.metrics().await.contains("llm_d_async_async_request_retries_total{pool_name=\"default\",queue_id=\"request-sortedset\",queue_name=\"request-sortedset\"} 1"));
}

/// 429 with Retry-After is honoured (and counted as shed), then the request succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limited_with_retry_after() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "r429",
        vec![
            Reply::status(429, "slow down").header("retry-after", "5"),
            Reply::ok("{}"),
        ],
    );
    let p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("r429", 60, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status_code, 200);
    let seen = gw.seen("r429");
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(4900),
        "Retry-After 5 s must be honoured, waited {gap:?}"
    );
    assert!(p.metrics().await.contains("llm_d_async_async_shedded_requests_total{pool_name=\"default\",queue_id=\"request-sortedset\",queue_name=\"request-sortedset\"} 1"));
}

/// A parked retry goes back to pending when it is due, not when the promoter next happens to
/// look: with a reclaim interval of a minute (the idle promoter's longest sleep), the 503's
/// retry still comes after Go's first backoff of [2, 4) s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_retry_runs_when_due_however_long_the_idle_promoter_sleeps() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "due",
        vec![Reply::status(503, "busy"), Reply::ok(r#"{"ok":true}"#)],
    );
    let opts = ProcessorOpts {
        lease_s: 60.0,
        reclaim_ms: 60_000,
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gw, &opts).await;
    // Idle first, so the promoter is in its long sleep when the retry is parked.
    tokio::time::sleep(Duration::from_millis(500)).await;
    producer(&redis, Q)
        .await
        .submit(request("due", 120, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(30)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].status_code, 200);
    let seen = gw.seen("due");
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at - seen[0].at;
    assert!(
        gap >= Duration::from_millis(1900) && gap < Duration::from_secs(10),
        "the retry is due after [2, 4) s and runs then, not at the minute: {gap:?}"
    );
}

/// An idle queue costs Redis little: the promoter looks once per reclaim interval when nothing
/// is parked, instead of every poll interval (here 50 ms: 40 `ZRANGEBYSCORE`s a second, two
/// per pass, before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_queue_is_not_searched_for_retries_every_poll() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let mut con = con(&redis).await;
    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut con)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let searches = command_calls(&mut con, "zrangebyscore").await;
    // A promote pass (two searches) and a reclaim pass (one) per 5 s interval, two of each at
    // most in 3 s.
    assert!(
        searches <= 6,
        "{searches} ZRANGEBYSCOREs in 3 s on an idle queue"
    );
}

/// A 4xx other than 429 is terminal: one attempt, the status and body as the result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_error_is_terminal() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script("r400", vec![Reply::status(400, r#"{"error":"bad model"}"#)]);
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("r400", 60, "{}"))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(
        (got[0].status_code, got[0].payload.as_str()),
        (400, r#"{"error":"bad model"}"#)
    );
    assert!(got[0].error_code.is_empty());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.seen("r400").len(), 1, "no retry of a 4xx");
}

/// A request whose deadline has passed gets DEADLINE_EXCEEDED without reaching the gateway;
/// one that keeps failing until its deadline ends with exactly one terminal record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passed_deadlines_end_with_deadline_exceeded() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let past = inferq_client::producer::unix_ms() / 1000 - 5;
    let member = format!(
        r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"late","deadline":{past},"payload":{{}}}}}}"#
    );
    let _: () = con.zadd(Q, &member, past).await.unwrap();
    gw.script("doomed", vec![Reply::status(503, "down")]);
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("doomed", 3, "{}"))
        .await
        .unwrap();
    let got = wait_results(&mut con, 2, Duration::from_secs(12)).await;
    assert_eq!(got.len(), 2, "{got:?}");
    let late = got.iter().find(|r| r.id == "late").unwrap();
    assert_eq!(late.error_code, "DEADLINE_EXCEEDED");
    assert_eq!(late.payload, r#"{"error":"deadline exceeded"}"#);
    assert!(gw.seen("late").is_empty());
    let doomed = got.iter().find(|r| r.id == "doomed").unwrap();
    assert!(
        doomed.error_code == "DEADLINE_EXCEEDED" || doomed.status_code == 503,
        "the last HTTP response or DEADLINE_EXCEEDED: {doomed:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        results(&mut con).await.len(),
        2,
        "exactly one terminal record each"
    );
}

/// Cancel before dispatch: CANCELLED, and the gateway never sees the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_before_dispatch() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let producer = producer(&redis, Q).await;
    producer.submit(request("c1", 60, "{}")).await.unwrap();
    assert_eq!(
        producer.cancel(&["c1".to_owned()]).await.unwrap(),
        vec![true]
    );
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(
        (got[0].id.as_str(), got[0].error_code.as_str()),
        ("c1", "CANCELLED")
    );
    assert_eq!(got[0].error_message, "cancelled");
    assert!(gw.seen("c1").is_empty());
}

/// Cancel during dispatch: the in-flight HTTP request is aborted and CANCELLED published
/// promptly (Go let it run to the end).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_dispatch_aborts_the_request() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = in_flight(&redis, &gw, "c2", Duration::from_secs(20)).await;
    let producer = producer(&redis, Q).await;
    assert_eq!(gw.seen("c2").len(), 1);
    let cancelled_at = Instant::now();
    producer.cancel(&["c2".to_owned()]).await.unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].error_code, "CANCELLED");
    // Cancellations are checked every 500 ms; the bound leaves room for a loaded machine, and
    // is far below the gateway's 20 s answer.
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(8),
        "took {:?}",
        cancelled_at.elapsed()
    );
    let seen_abort = Instant::now();
    while gw.aborted("c2") == 0 && seen_abort.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gw.aborted("c2"), 1, "the gateway saw the request abandoned");
}

/// SIGTERM: claimed-but-unstarted work goes back to pending at once, in-flight work drains,
/// and the process exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_and_releases_unstarted_work() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        concurrency: 2,
        ..ProcessorOpts::default()
    };
    let producer = producer(&redis, Q).await;
    let mut deadlines = Vec::new();
    for i in 0..8 {
        let id = format!("d{i}");
        gw.script(
            &id,
            // In flight long enough that the release below is seen before they finish.
            vec![Reply::ok("{}").after(Duration::from_secs(6))],
        );
        let req = request(&id, 60 + i, "{}");
        deadlines.push((id, req.deadline));
        producer.submit(req).await.unwrap();
    }
    let mut p = Processor::start(&redis, &gw, &opts).await;
    let mut con = con(&redis).await;
    gw.wait_executions(2, Duration::from_secs(10)).await;
    // Two in flight; the consumer holds more claims waiting for a worker.
    let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
    assert!(claimed > 2, "claimed {claimed}");
    p.signal("TERM");
    // The release is prompt; the two in flight end 6 s after they started.
    let released = tokio::time::Instant::now() + Duration::from_secs(4);
    let (claimed, pending) = loop {
        let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
        let pending: Vec<(String, f64)> = con.zrange_withscores(Q, 0, -1).await.unwrap();
        if (claimed == 2 && pending.len() == 6) || tokio::time::Instant::now() > released {
            break (claimed, pending);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(
        claimed, 2,
        "only the two in-flight claims remain after SIGTERM"
    );
    assert_eq!(pending.len(), 6);
    for (member, score) in &pending {
        let env = inferq_client::wire::Envelope::decode(member.as_bytes()).unwrap();
        let want = deadlines
            .iter()
            .find(|(id, _)| *id == env.request.id)
            .unwrap()
            .1;
        // The original score: the deadline plus the request's FIFO fraction (newer Go).
        let original: f64 = inferq_client::wire::score_of(want, env.internal.enqueue_seq)
            .parse()
            .unwrap();
        assert!(env.internal.enqueue_seq > 0, "{member}");
        assert_eq!(*score, original, "released at the original score");
    }
    assert_eq!(p.wait_exit(Duration::from_secs(10)).await, Some(0));
    let got = results(&mut con).await;
    assert_eq!(got.len(), 2, "the in-flight pair finished during the drain");
    let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
    assert_eq!(claimed, 0);
}

/// SIGKILL mid-request with a short lease: a second processor reclaims the request after the
/// lease and finishes it; exactly one result, two executions (at least once, said plainly).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_request_is_finished_by_a_survivor() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "k1",
        vec![
            Reply::ok("first").after(Duration::from_secs(30)),
            Reply::ok("second"),
        ],
    );
    let opts = ProcessorOpts {
        lease_s: 1.5,
        reclaim_ms: 300,
        ..ProcessorOpts::default()
    };
    let mut a = Processor::start(&redis, &gw, &opts).await;
    producer(&redis, Q)
        .await
        .submit(request("k1", 60, "{}"))
        .await
        .unwrap();
    gw.wait_seen("k1", Duration::from_secs(10)).await;
    a.kill();
    let killed_at = Instant::now();
    let _b = Processor::start(&redis, &gw, &opts).await;
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].payload, "second");
    // The lease is 1.5 s (the bench measures redelivery precisely); this bound leaves room for
    // the survivor's start on a loaded machine, and is far below the first answer's 30 s.
    let redelivered = killed_at.elapsed();
    assert!(
        redelivered < Duration::from_secs(10),
        "redelivered after {redelivered:?}"
    );
    assert_eq!(gw.seen("k1").len(), 2);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(results(&mut con).await.len(), 1);
}

/// Two processors on one queue: every request gets exactly one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processors_one_result_each() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _a = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let _b = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let producer = producer(&redis, Q).await;
    let reqs = (0..300)
        .map(|i| request(&format!("m{i}"), 60, "{}"))
        .collect();
    for r in producer.submit_many(reqs).await.unwrap() {
        r.unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 300, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got_again = results(&mut con).await;
    assert_eq!(got.len(), 300);
    assert_eq!(got_again.len(), 300, "no extra results");
    let ids: std::collections::HashSet<_> = got_again.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), 300);
}

/// The requests of one processor's `inferq_claims_lost_total` (0 when absent).
fn claims_lost(metrics: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("inferq_claims_lost_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Four processors draining one deep queue do not spend their polls taking the same requests
/// from one another: an instance that keeps finding its peeked requests claimed by another
/// looks further down the queue. Without that, each request here was peeked, decoded and sent
/// back in a claim for nothing about twice over (15,500–17,700 lost for 8,000; with it,
/// 1,900–3,000), and Redis's CPU per request rose by half with four instances. Still one
/// result each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processors_sharing_a_queue_do_not_keep_racing_for_its_head() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    const N: usize = 8000;
    let producer = producer(&redis, Q).await;
    for chunk in (0..N).collect::<Vec<_>>().chunks(1000) {
        let reqs = chunk
            .iter()
            .map(|i| request(&format!("r{i}"), 600, "{}"))
            .collect();
        for r in producer.submit_many(reqs).await.unwrap() {
            r.unwrap();
        }
    }
    let opts = ProcessorOpts {
        concurrency: 8,
        batch_size: 128,
        ..ProcessorOpts::default()
    };
    let mut procs = Vec::new();
    for _ in 0..4 {
        procs.push(Processor::start(&redis, &gw, &opts).await);
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, N, Duration::from_secs(120)).await;
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.id.clone()).collect();
    assert_eq!((got.len(), ids.len()), (N, N), "one result per request");
    let mut lost = 0.0;
    for p in &procs {
        lost += claims_lost(&p.metrics().await);
    }
    assert!(
        lost < N as f64,
        "{lost} requests peeked and claimed for nothing while {N} were drained"
    );
}

/// Bad members are dead-lettered with a reason (and INVALID_REQUEST when an id is readable)
/// while good work behind them flows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_members_do_not_block_the_queue() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.zadd(Q, "garbage", 1).await.unwrap();
    let _: () = con
        .zadd(
            Q,
            r#"{"request_kind":"plain","data":{"id":"nodl","payload":{}}}"#,
            2,
        )
        .await
        .unwrap();
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("good", 60, "{}"))
        .await
        .unwrap();
    let got = wait_results(&mut con, 2, Duration::from_secs(10)).await;
    let bad = got.iter().find(|r| r.id == "nodl").unwrap();
    assert_eq!(bad.error_code, "INVALID_REQUEST");
    assert!(got.iter().any(|r| r.id == "good" && r.status_code == 200));
    let dead: Vec<String> = con.lrange(format!("{Q}:dead"), 0, -1).await.unwrap();
    assert_eq!(dead.len(), 2);
    assert!(dead.iter().any(|d| d.contains("not valid JSON")));
    let pending: u64 = con.zcard(Q).await.unwrap();
    assert_eq!(pending, 0);
}

/// A bad config exits with code 2 and names the field.
#[test]
fn bad_config_exits_2_naming_the_field() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args([
            "run",
            "--transport",
            "redis-sortedset",
            "--transport-config",
            r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_ur":"http://x"}]}"#,
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("queues[0].igw_base_ur"), "{err}");
}

/// The start of the Redis-outage tests: a Redis, a gateway, and a processor with a `lease_s`
/// lease (reclaim scan every `reclaim_ms`) to which six requests, `{prefix}0` to `{prefix}5`,
/// were submitted that the gateway answers after `answer_after`; returns once all six have
/// reached the gateway.
async fn six_sent(
    lease_s: f64,
    reclaim_ms: u64,
    prefix: &str,
    answer_after: Duration,
) -> (RedisServer, Gateway, ProcessorOpts, Processor) {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        lease_s,
        reclaim_ms,
        ..ProcessorOpts::default()
    };
    let ids: Vec<String> = (0..6).map(|i| format!("{prefix}{i}")).collect();
    for id in &ids {
        gw.script(id, vec![Reply::ok("{}").after(answer_after)]);
    }
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for id in &ids {
        producer.submit(request(id, 120, "{}")).await.unwrap();
    }
    gw.wait_executions(6, Duration::from_secs(10)).await;
    (redis, gw, opts, p)
}

/// Redis killed (kill -9, AOF always) while requests are in flight, then restarted: `/readyz`
/// says not ready during the outage, finished work waits in the outbox instead of being thrown
/// away, and every request ends with exactly one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_loses_nothing_and_readyz_is_honest() {
    let (mut redis, gw, _, p) = six_sent(10.0, 1000, "o", Duration::from_millis(800)).await;
    redis.kill();
    let readyz = format!("http://127.0.0.1:{}/readyz", p.health_port);
    // The processor notices at its next Redis call: wait for /readyz to say so (a busy machine
    // took longer than a fixed 1.2 s), then check what it says.
    let noticed = Instant::now();
    let during = loop {
        let during = reqwest::get(&readyz).await.unwrap();
        if during.status().as_u16() != 200 || noticed.elapsed() > Duration::from_secs(10) {
            break during;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(during.status().as_u16(), 503);
    let body = during.text().await.unwrap();
    assert!(
        body.contains("not ready") && body.contains("redis"),
        "{body}"
    );
    redis.restart().unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 6, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 6, "{got:?}");
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r.id.clone()).collect();
    assert_eq!(ids.len(), 6);
    assert!(got.iter().all(|r| r.status_code == 200));
    let executions: usize = gw.executions().values().sum();
    assert_eq!(executions, 6, "finished work was kept, not redone");
    let started = Instant::now();
    while !reqwest::get(&readyz).await.unwrap().status().is_success() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "ready again after Redis is back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Redis down for longer than the lease (kill -9, AOF always; 3 s lease, 7 s outage) after the
/// gateway has answered: the finished outcomes wait in the outbox past the lease, and once Redis
/// is back their fenced writes land, because no instance reclaimed the claims meanwhile. Every
/// request is executed once (before, outcomes were dropped when the local lease ran out, and the
/// reclaim made the gateway redo all of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finished_work_outlives_an_outage_longer_than_the_lease() {
    let (mut redis, gw, _, p) = six_sent(3.0, 500, "l", Duration::from_millis(500)).await;
    redis.kill();
    tokio::time::sleep(Duration::from_secs(7)).await;
    redis.restart().unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 6, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 6, "{got:?}\n{}", p.log());
    assert!(got.iter().all(|r| r.status_code == 200), "{got:?}");
    let executions: usize = gw.executions().values().sum();
    assert_eq!(
        executions, 6,
        "finished work was kept past the lease, not redone"
    );
    let claimed: u64 = redis::AsyncCommands::hlen(&mut con, format!("{Q}:claimed"))
        .await
        .unwrap();
    assert_eq!(claimed, 0);
}

/// The same outage with a second instance running: when Redis is back, that instance's
/// reclaimer finds the first one's claims expired. It must give their owner time to renew them
/// and write the finished outcomes it kept, instead of handing the work back to pending to be
/// executed again. (The grace is one lease, 3 s here: the owner reconnects and renews within it
/// even on a loaded machine.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_outage_a_survivor_lets_the_owner_finish_first() {
    let (mut redis, gw, opts, owner) = six_sent(3.0, 500, "o", Duration::from_millis(500)).await;
    let survivor = Processor::start(&redis, &gw, &opts).await;
    redis.kill();
    tokio::time::sleep(Duration::from_secs(7)).await;
    redis.restart().unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 6, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 6, "{got:?}");
    let executions: usize = gw.executions().values().sum();
    assert_eq!(
        executions,
        6,
        "work finished before the outage was done again\nowner:\n{}\nsurvivor:\n{}",
        owner.log(),
        survivor.log()
    );
}

/// A claim taken over by another owner (here: its owner token overwritten, as a reclaim by a
/// survivor would) is dropped at the next renewal: the in-flight HTTP request is aborted and the
/// old owner publishes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_renewal_aborts_the_in_flight_request() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script("t1", vec![Reply::ok("{}").after(Duration::from_secs(20))]);
    let opts = ProcessorOpts {
        lease_s: 1.5,
        reclaim_ms: 1000,
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    producer(&redis, Q)
        .await
        .submit(request("t1", 60, "{}"))
        .await
        .unwrap();
    gw.wait_seen("t1", Duration::from_secs(10)).await;
    let mut con = con(&redis).await;
    let keys: Vec<String> = con.hkeys(format!("{Q}:claim-owners")).await.unwrap();
    assert_eq!(keys.len(), 1);
    let _: () = con
        .hset(format!("{Q}:claim-owners"), &keys[0], "a-survivor's-token")
        .await
        .unwrap();
    let stolen_at = Instant::now();
    while gw.aborted("t1") == 0 && stolen_at.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        gw.aborted("t1"),
        1,
        "the request was aborted at the gateway"
    );
    // One renewal period is 0.5 s; the bound leaves room for a loaded machine, and is far
    // below the gateway's 20 s answer.
    assert!(
        stolen_at.elapsed() < Duration::from_secs(5),
        "at the next renewal, took {:?}",
        stolen_at.elapsed()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        results(&mut con).await.is_empty(),
        "the old owner publishes nothing"
    );
    let owner: String = con
        .hget(format!("{Q}:claim-owners"), &keys[0])
        .await
        .unwrap();
    assert_eq!(
        owner, "a-survivor's-token",
        "and leaves the new owner's claim alone"
    );
    assert!(p.metrics().await.contains("inferq_renewals_total{outcome=\"lost\",pool_name=\"default\",queue_id=\"request-sortedset\",queue_name=\"request-sortedset\"} 1"));
}

/// A request that cannot be made into an HTTP request is a terminal INFERENCE_ERROR with Go's
/// client-error text, and nothing is sent: an endpoint that cannot be joined to the gateway URL
/// (an invalid `%` escape), and a message header whose value is not legal HTTP (Go's client
/// refuses it at send time; sending the request without it would drop what the producer asked
/// for, a tenant or an authorisation). A good request beside them is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsendable_requests_are_inference_errors_and_nothing_is_sent() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let producer = producer(&redis, Q).await;
    let mut bad_url = request("badurl", 60, "{}");
    bad_url.endpoint = "/v1/%zz".to_owned();
    let mut bad_header = request("badheader", 60, "{}");
    bad_header.headers = [
        ("x-ok".to_owned(), "1".to_owned()),
        ("x-tenant".to_owned(), "acme\r\nx-admin: 1".to_owned()),
    ]
    .into();
    for req in [bad_url, bad_header, request("good", 60, "{}")] {
        producer.submit(req).await.unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 3, Duration::from_secs(10)).await;
    let of = |id: &str| {
        got.iter()
            .find(|r| r.id == id)
            .unwrap_or_else(|| panic!("no result for {id}: {got:?}"))
    };
    assert_eq!(of("good").status_code, 200, "{:?}", of("good"));
    for (id, text) in [
        ("badurl", "INVALID_REQ: failed to create request (caused by: "),
        (
            "badheader",
            "UNKNOWN: failed to send request (caused by: the value of message header \"x-tenant\" is not a legal HTTP header value)",
        ),
    ] {
        let r = of(id);
        assert_eq!(r.error_code, "INFERENCE_ERROR", "{r:?}");
        assert!(
            r.error_message
                .starts_with(&format!("Failed to send request to inference: {text}")),
            "{}",
            r.error_message
        );
        assert!(gw.seen(id).is_empty(), "{id} reached the gateway");
    }
    assert!(!got.iter().any(|r| r.error_message.contains("acme")));
}

/// The value of the `inferq_wakeups_total` series of `source` (0 when absent).
fn wakeups(metrics: &str, source: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("inferq_wakeups_total{"))
        .filter(|l| l.contains(&format!(r#"source="{source}""#)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// An idle queue is polled the moment work arrives instead of after its poll interval:
/// `inferq submit` rings the queue's doorbell, and a member a Go producer ZADDs wakes it through
/// the pending key's keyspace notifications when the server has them enabled. The poll
/// interval here is a minute, so only a wake-up brings the results within the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_bring_new_work_without_waiting_the_poll_interval() {
    let redis = RedisServer::start().unwrap();
    let mut con = con(&redis).await;
    inferq_testkit::config_set(&mut con, "notify-keyspace-events", "Kz")
        .await
        .unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        poll_interval_ms: 60_000,
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let started = Instant::now();
    loop {
        let subs: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(format!("{Q}:doorbell"))
            .arg(format!("__keyspace@0__:{Q}"))
            .query_async(&mut con)
            .await
            .unwrap();
        if subs.iter().all(|(_, n)| *n == 1) {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "never subscribed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let the consumer settle into its long wait.
    tokio::time::sleep(Duration::from_millis(500)).await;
    producer(&redis, Q)
        .await
        .submit(request("bell-1", 60, "{}"))
        .await
        .unwrap();
    let got = wait_results(&mut con, 1, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 1, "the doorbell woke the consumer");
    assert!(wakeups(&p.metrics().await, "doorbell") >= 1.0);
    // A Go producer's ZADD (no doorbell): the keyspace notification wakes the consumer.
    let deadline = inferq_client::producer::unix_ms() / 1000 + 60;
    let member = format!(
        r#"{{"internal":{{"request_token":"9f0c1e0000000000000000000000beef"}},"request_kind":"plain","data":{{"id":"ks-1","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let _: () = con.zadd(Q, &member, deadline).await.unwrap();
    let got = wait_results(&mut con, 2, Duration::from_secs(20)).await;
    assert_eq!(got.len(), 2, "the keyspace event woke the consumer");
    assert!(wakeups(&p.metrics().await, "keyspace") >= 1.0);
}

/// Redis demoted to a read-only replica under a running processor (a failover that turned the
/// old primary into a replica of the new one): it still answers PING and reads, but the result
/// of the request in flight cannot be written (`READONLY`). `/readyz` says not ready and names
/// the refusal, where a PING-only check (Go's) says ready; promoted again (`REPLICAOF NO ONE`),
/// the processor is ready on its own and serves new work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_not_ready_while_redis_is_a_read_only_replica() {
    let redis = RedisServer::start().unwrap();
    let new_primary = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = in_flight(&redis, &gw, "in-flight", Duration::from_secs(1)).await;

    let mut admin = con(&redis).await;
    let demoted: String = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(new_primary.port())
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(demoted, "OK");
    let readyz = format!("http://127.0.0.1:{}/readyz", p.health_port);
    let started = Instant::now();
    let body = loop {
        let answer = reqwest::get(&readyz).await.unwrap();
        if answer.status().as_u16() == 503 {
            break answer.text().await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "still ready on a read-only replica; log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.to_lowercase().contains("readonly"), "{body}");

    let promoted: String = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(promoted, "OK");
    p.wait_ready().await;
    producer(&redis, "request-sortedset")
        .await
        .submit(request("after", 120, "{}"))
        .await
        .unwrap();
    let started = Instant::now();
    let got = loop {
        let got = results(&mut admin).await;
        if got.iter().any(|r| r.id == "after") || started.elapsed() > Duration::from_secs(15) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let of = |id: &str| got.iter().filter(|r| r.id == id).count();
    assert_eq!(of("after"), 1, "{got:?}");
    assert!(got.iter().all(|r| r.status_code == 200), "{got:?}");
    // Whether the in-flight result survives depends on how far the demoted Redis got with its
    // sync from the (empty) new primary; either way it is never published twice.
    assert!(of("in-flight") <= 1, "{got:?}");
}

/// While Redis takes no writes (`CLIENT PAUSE … WRITE`) `/readyz` stays 503 (PING queued
/// behind the paused writes, or, once it answers, the results the outbox cannot write); once
/// writes resume it is ready again and the in-flight request's result is published once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_not_ready_while_redis_takes_no_writes() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = in_flight(&redis, &gw, "paused", Duration::from_secs(1)).await;
    let mut admin = con(&redis).await;
    let paused: String = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(24_000)
        .arg("WRITE")
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(paused, "OK");
    let pause_began = Instant::now();
    let readyz = format!("http://127.0.0.1:{}/readyz", p.health_port);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    // From 8 s into the pause (after the first write has timed out) until 20 s: never ready.
    tokio::time::sleep(Duration::from_secs(8)).await;
    while pause_began.elapsed() < Duration::from_secs(20) {
        let answer = client.get(&readyz).send().await.unwrap();
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap_or_default();
        assert_eq!(
            status,
            503,
            "ready {:?} into a write pause: {body}; log:\n{}",
            pause_began.elapsed(),
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    p.wait_ready().await;
    let started = Instant::now();
    let got = loop {
        let got = results(&mut admin).await;
        if !got.is_empty() || started.elapsed() > Duration::from_secs(20) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["paused"], "{got:?}");
}

/// The health and metrics ports answer on IPv6 as on IPv4, as Go's `:8081` does: probes and
/// scrapes on an IPv6-only cluster reach them (before, only 0.0.0.0 was bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_answer_on_ipv6_and_ipv4() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let p = Processor::start(&redis, &gateway, &ProcessorOpts::default()).await;
    for host in ["127.0.0.1", "[::1]"] {
        for (port, path) in [(p.health_port, "healthz"), (p.metrics_port, "metrics")] {
            let url = format!("http://{host}:{port}/{path}");
            let status = reqwest::get(&url)
                .await
                .unwrap_or_else(|e| panic!("{url}: {e}"))
                .status();
            assert_eq!(status, 200, "{url}");
        }
    }
}

/// `--health-address` and `--metrics-address` bind the ports to the address given (issue 44:
/// on a shared host an operator keeps them on loopback): they answer there and on no other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_and_metrics_listen_where_told() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_args: vec![
            "--health-address".into(),
            "127.0.0.1".into(),
            "--metrics-address".into(),
            "::1".into(),
        ],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gateway, &opts).await;
    for (host, port, path, answers) in [
        ("127.0.0.1", p.health_port, "healthz", true),
        ("[::1]", p.health_port, "healthz", false),
        ("[::1]", p.metrics_port, "metrics", true),
        ("127.0.0.1", p.metrics_port, "metrics", false),
    ] {
        let url = format!("http://{host}:{port}/{path}");
        let got = reqwest::get(&url).await.map(|r| r.status().as_u16());
        match answers {
            true => assert_eq!(got.ok(), Some(200), "{url}"),
            false => assert!(got.is_err(), "{url} answered: {got:?}"),
        }
    }
}

/// `async_pool_worker_limit` is set at start-up for every configured pool, as Go sets it, also
/// for a pool no queue uses yet (before, only pools serving a queue had the gauge).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_pool_reports_its_worker_limit() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let opts = ProcessorOpts {
        pools: Some(r#"[{"id":"default","workers":4},{"id":"spare","workers":3}]"#.to_owned()),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gateway, &opts).await;
    let metrics = p.metrics().await;
    for series in [
        r#"llm_d_async_async_pool_worker_limit{pool_name="default"} 4"#,
        r#"llm_d_async_async_pool_worker_limit{pool_name="spare"} 3"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}

/// The `tier-priority` merge policy: with one worker and both queues backed up, the interactive
/// queue's requests go first and carry `x-gateway-priority: 3`, the batch queue's follow with
/// `5` (Go's buckets: unclassified, tier interactive = 3; batch = 5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tier_priority_sends_the_interactive_queue_first_and_stamps_its_bucket() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let batch: Vec<String> = (0..6).map(|i| format!("batch-{i}")).collect();
    let live: Vec<String> = (0..4).map(|i| format!("live-{i}")).collect();
    // Long enough that the two queues' first polls, however far apart on a loaded machine,
    // fall within the first request or two.
    for id in batch.iter().chain(&live) {
        gateway.script(id, vec![Reply::ok("{}").after(Duration::from_millis(400))]);
    }
    // Both queues are backed up before the processor starts.
    for (queue, ids) in [("batch-q", &batch), ("live-q", &live)] {
        let producer = producer(&redis, queue).await;
        for id in ids {
            producer.submit(request(id, 60, "{}")).await.unwrap();
        }
    }
    let policy = tempfile::NamedTempFile::new().unwrap();
    // Go's default is now no priority header (#443); a config that names it still works.
    std::fs::write(
        policy.path(),
        r#"{"type":"tier-priority","parameters":{"priority_header":"x-gateway-priority"}}"#,
    )
    .unwrap();
    let config = format!(
        r#"{{"url":"{}","poll_interval_ms":50,"batch_size":10,"queues":[
            {{"queue_name":"batch-q","igw_base_url":"{gw}","labels":{{"tier":"batch"}}}},
            {{"queue_name":"live-q","igw_base_url":"{gw}","labels":{{"tier":"interactive"}}}}]}}"#,
        redis.url(),
        gw = gateway.url()
    );
    let opts = ProcessorOpts {
        concurrency: 1,
        transport_args: Some(vec![
            "--transport".to_owned(),
            "redis-sortedset".to_owned(),
            "--transport-config".to_owned(),
            config,
            format!(
                "--request-merge-policy-config-file={}",
                policy.path().display()
            ),
        ]),
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gateway, &opts).await;
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 10, Duration::from_secs(20))
            .await
            .len(),
        10
    );

    let mut order: Vec<(Instant, String, String)> = batch
        .iter()
        .chain(&live)
        .map(|id| {
            let seen = gateway.seen(id);
            let priority = seen[0].headers["x-gateway-priority"]
                .to_str()
                .unwrap()
                .to_owned();
            (seen[0].at, id.clone(), priority)
        })
        .collect();
    order.sort();
    for (_, id, priority) in &order {
        let want = if id.starts_with("live") { "3" } else { "5" };
        assert_eq!(priority, want, "{id}");
    }
    // Only what was sent before the interactive queue's first poll landed (one request, two on
    // a loaded machine) goes ahead of an interactive one; random-robin puts them all over.
    let last_live = order
        .iter()
        .rposition(|(_, id, _)| id.starts_with("live"))
        .unwrap();
    let ids: Vec<&str> = order.iter().map(|(_, id, _)| id.as_str()).collect();
    assert!(
        last_live <= 5,
        "interactive requests waited behind batch ones: {ids:?}"
    );
}

/// `opts` with a `gcs_uri_multipart` transform for provider `openai` (`--transform-config-file`),
/// and the file, which must live as long as the processor.
fn with_gcs_transform(mut opts: ProcessorOpts) -> (tempfile::NamedTempFile, ProcessorOpts) {
    let transforms = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        transforms.path(),
        r#"{"requestTransforms":[{"name":"audio","type":"gcs_uri_multipart",
            "parameters":{"providers":["openai"]}}]}"#,
    )
    .unwrap();
    opts.extra_args.push(format!(
        "--transform-config-file={}",
        transforms.path().display()
    ));
    (transforms, opts)
}

/// `--transform-config-file` with a `gcs_uri_multipart` transform: a request of its provider
/// naming a signed GCS URL reaches the gateway as multipart/form-data (field `url` first), a
/// request of another provider is sent as it is, and one whose URL expires before its deadline
/// ends with Go's `INVALID_REQUEST` text without reaching the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcs_uri_multipart_transform_rewrites_only_its_providers_requests() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let (_transforms, opts) = with_gcs_transform(ProcessorOpts::default());
    let _p = Processor::start(&redis, &gateway, &opts).await;
    let signed = |expires: i64| format!("https://storage.googleapis.com/b/a.wav?Expires={expires}");
    let far = inferq_client::producer::unix_ms() / 1000 + 3600;
    let with = |id: &str, provider: &str, uri: &str| {
        let payload = serde_json::json!({"model": "whisper", "gcs_uri": uri}).to_string();
        let mut r = request(id, 60, &payload);
        r.metadata
            .insert("provider".to_owned(), provider.to_owned());
        if provider == "openai" {
            // #494: the caller's own content type, in lower case and in another casing.
            r.headers
                .insert("content-type".to_owned(), "application/json".to_owned());
            r.headers
                .insert("CONTENT-TYPE".to_owned(), "text/plain".to_owned());
        }
        r
    };
    let producer = producer(&redis, &opts.queue).await;
    for r in [
        with("mp", "openai", &signed(far)),
        with("plain", "other", &signed(far)),
        with("stale", "openai", &signed(far - 3600)),
    ] {
        producer.submit(r).await.unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 3, Duration::from_secs(10)).await;
    let result = |id: &str| got.iter().find(|r| r.id == id).unwrap().clone();

    assert_eq!(result("mp").status_code, 200);
    let seen = gateway.seen("mp");
    let types = seen[0].headers.get_all("content-type").iter().count();
    assert_eq!(types, 1, "the transform's replaces the caller's: {seen:?}");
    let content_type = seen[0].headers["content-type"].to_str().unwrap().to_owned();
    let boundary = content_type
        .strip_prefix("multipart/form-data; boundary=")
        .unwrap_or_else(|| panic!("{content_type}"));
    let body = String::from_utf8(seen[0].body.to_vec()).unwrap();
    assert!(
        body.starts_with(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"url\"\r\n\r\n{}\r\n",
            signed(far)
        )),
        "{body}"
    );
    assert!(body.contains("name=\"model\"\r\n\r\nwhisper\r\n"), "{body}");
    assert!(!body.contains("gcs_uri"), "{body}");

    let plain = gateway.seen("plain");
    assert_eq!(plain[0].headers["content-type"], "application/json");
    assert!(String::from_utf8_lossy(&plain[0].body).contains("\"gcs_uri\""));

    let stale = result("stale");
    assert_eq!(stale.error_code, "INVALID_REQUEST");
    assert!(
        stale.error_message.starts_with(
            "Failed to validate request for transform: transform audio/gcs_uri_multipart: the \
             signed gcs_uri expires at"
        ),
        "{stale:?}"
    );
    assert!(gateway.seen("stale").is_empty());
}

/// A request whose deadline passes while it waits for a worker ends with Go's
/// `DEADLINE_EXCEEDED` when the worker takes it up, before its transforms are validated (Go's
/// order), even when a transform would also refuse it; the gateway never sees it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_that_passed_in_the_pool_wins_over_a_failing_transform() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let (_transforms, opts) = with_gcs_transform(ProcessorOpts {
        concurrency: 1,
        ..ProcessorOpts::default()
    });
    let _p = Processor::start(&redis, &gateway, &opts).await;
    let producer = producer(&redis, &opts.queue).await;
    // The one worker is busy for 4 s.
    gateway.script("busy", vec![Reply::ok("{}").after(Duration::from_secs(4))]);
    producer.submit(request("busy", 60, "{}")).await.unwrap();
    gateway.wait_seen("busy", Duration::from_secs(10)).await;
    // Due in 1–2 s, with a signed URL that expires before that: the transform refuses it.
    let now = inferq_client::producer::unix_ms() / 1000;
    let payload = serde_json::json!({
        "model": "whisper",
        "gcs_uri": format!("https://storage.googleapis.com/b/a.wav?Expires={now}"),
    });
    let mut late = request("late", 2, &payload.to_string());
    late.metadata
        .insert("provider".to_owned(), "openai".to_owned());
    producer.submit(late).await.unwrap();

    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 2, Duration::from_secs(15)).await;
    let late = got.iter().find(|r| r.id == "late").unwrap();
    assert_eq!(late.error_code, "DEADLINE_EXCEEDED", "{late:?}");
    assert!(gateway.seen("late").is_empty());
}

/// A processor whose standard output and error nobody reads any more (started under
/// `2>&1 | head -1`, say) serves requests and still stops cleanly on SIGTERM: a log line it
/// cannot write is dropped. Before, the log subscriber reported the failed write with
/// `eprintln!`, whose panic killed the task that logged: the processor exited 101 at start-up,
/// or, when the dead task was the one waiting for signals, ignored SIGTERM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_log_pipe_neither_kills_the_processor_nor_deafens_it() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let opts = ProcessorOpts {
        closed_output: true,
        ..ProcessorOpts::default()
    };
    // Serves the request, then exits 0 on SIGTERM.
    one_request_then_stop(&redis, &gateway, &opts, "piped").await;
    let got = results(&mut con(&redis).await).await;
    assert_eq!(got[0].status_code, 200);
}

/// Rule 10 when Redis refuses the dead list: a member that is not a request, which Redis will not
/// let the processor set aside (here the dead list holds another type; an ACL without it is the
/// same refusal), stays pending and is passed over, so the request behind it is served, while
/// `/readyz` names the dead list. Once the dead list is mended the member is set aside and the
/// processor is ready again. Before, every poll failed on it and the queue stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_member_redis_will_not_set_aside_does_not_stop_the_queue() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("request-sortedset:dead", "x").await.unwrap();
    let _: () = con
        .zadd("request-sortedset", "not a request", 0)
        .await
        .unwrap();
    let p = Processor::spawn(&redis, &gateway, &ProcessorOpts::default());
    producer(&redis, "request-sortedset")
        .await
        .submit(request("behind", 60, "{}"))
        .await
        .unwrap();
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got[0].id, "behind", "{got:?}; log:\n{}", p.log());
    let readyz = format!("http://127.0.0.1:{}/readyz", p.health_port);
    let answer = reqwest::get(&readyz).await.unwrap();
    assert_eq!(answer.status(), 503);
    let body = answer.text().await.unwrap();
    assert!(
        body.contains("dead list") && body.contains("WRONGTYPE"),
        "{body}"
    );

    let _: () = con.del("request-sortedset:dead").await.unwrap();
    p.wait_ready().await;
    let dead: u64 = con.llen("request-sortedset:dead").await.unwrap();
    assert_eq!(dead, 1, "the bad member is set aside");
}

/// A head of requests on their last chance (one delivery short of the dead list) while this
/// instance already runs one: they wait for its slot, and neither hide the fresh requests
/// behind them nor spin the consumer. Before, each poll peeked the same held-back head, claimed
/// nothing and polled again at once: the fresh requests never ran, and Redis saw tens of
/// thousands of peeks a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_head_of_last_chance_requests_neither_hides_work_nor_spins() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let producer = producer(&redis, "request-sortedset").await;
    let mut con = con(&redis).await;
    // Twelve requests on their last chance (one lease expiry already counted, of two), each
    // held by the gateway for a minute, then three fresh ones behind them.
    for i in 0..12 {
        let id = format!("last-{i:02}");
        gateway.script(&id, vec![Reply::ok("{}").after(Duration::from_secs(60))]);
        producer.submit(request(&id, 60 + i, "{}")).await.unwrap();
    }
    let members: Vec<String> = con.zrange("request-sortedset", 0, -1).await.unwrap();
    for member in &members {
        let env = inferq_client::wire::Envelope::decode(member.as_bytes()).unwrap();
        let key = format!("{}\0{}", env.request.id, env.internal.request_token);
        let _: () = con
            .hset("request-sortedset:deliveries", key, 1)
            .await
            .unwrap();
    }
    for i in 0..3 {
        producer
            .submit(request(&format!("fresh-{i}"), 200, "{}"))
            .await
            .unwrap();
    }
    let opts = ProcessorOpts {
        extra_transport_fields: r#","max_deliveries":2"#.to_owned(),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gateway, &opts).await;
    for i in 0..3 {
        let id = format!("fresh-{i}");
        gateway.wait_seen(&id, Duration::from_secs(5)).await;
        assert_eq!(gateway.seen(&id).len(), 1, "{id} is stuck behind the head");
    }
    assert_eq!(gateway.seen("last-00").len(), 1);
    assert!(
        gateway.seen("last-01").is_empty(),
        "one last chance at a time"
    );

    let before = command_calls(&mut con, "zrange").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = command_calls(&mut con, "zrange").await - before;
    // A look per 50 ms poll interval, a page or two each: about 80. Spinning, it was tens of
    // thousands.
    assert!(during < 400, "{during} peeks in 2 s; log:\n{}", p.log());
}

/// The standard process metrics a Go dashboard reads beside the processor's own (Go's
/// controller-runtime registry serves them): CPU seconds, resident memory, file descriptors and
/// the start time, with this process's values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standard_process_metrics_are_served() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let p = Processor::start(&redis, &gateway, &ProcessorOpts::default()).await;
    let metrics = p.metrics().await;
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} missing:\n{metrics}"))
    };
    assert!(
        metrics.contains("# TYPE process_cpu_seconds_total counter"),
        "{metrics}"
    );
    assert!(value("process_cpu_seconds_total") >= 0.0);
    let rss = value("process_resident_memory_bytes");
    assert!((1e6..1e9).contains(&rss), "{rss}");
    assert!(value("process_open_fds") >= 5.0);
    assert!(value("process_max_fds") >= value("process_open_fds"));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let started = value("process_start_time_seconds");
    assert!(
        (0.0..120.0).contains(&(now - started)),
        "started {started}, now {now}"
    );
}

/// `/metrics` is the page Go's processor serves, so a fleet mixing Go and inferq replicas, and a
/// rule filtering on `le="1000"`, see one series per bucket even on a Prometheus 2 that keeps
/// `le` as written: the 0.0.4 text under Go's Content-Type even when the scraper prefers
/// OpenMetrics, labels in client_golang's (sorted) order, `le` spelled as Go spells floats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_page_is_go_s_text_format() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    producer(&redis, Q)
        .await
        .submit(request("m-1", 60, "{}"))
        .await
        .unwrap();
    let labels = format!(r#"pool_name="default",queue_id="{Q}",queue_name="{Q}""#);
    let latency_bucket = format!(
        r#"llm_d_async_async_inference_latency_time_millis_bucket{{{labels},le="1000"}} 1"#
    );
    let residence_bucket = format!(
        r#"llm_d_async_async_queue_residence_time_millis_bucket{{{labels},le="1.8e+06"}} 1"#
    );
    p.metrics_with(&[&latency_bucket, &residence_bucket]).await;
    // Prometheus 2's default Accept, which prefers OpenMetrics.
    let accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                  version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    let answer = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/metrics", p.metrics_port))
        .header("accept", accept)
        .send()
        .await
        .unwrap();
    assert_eq!(
        answer.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
    );
    assert!(answer.headers().get("content-encoding").is_none());
    let page = answer.text().await.unwrap();
    for line in [
        latency_bucket.as_str(),
        &residence_bucket,
        "# TYPE llm_d_async_async_request_total counter",
        &format!("llm_d_async_async_request_total{{{labels}}} 1"),
        "# TYPE llm_d_async_async_inference_latency_time_millis histogram",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing:\n{page}");
    }
    assert!(
        !page.contains("# EOF") && !page.contains("# UNIT"),
        "{page}"
    );
    assert!(
        !page.contains("_created") && !page.contains(".0\""),
        "{page}"
    );
    // Prometheus asks for gzip, and Go's promhttp gzips: the same page, in a tenth of the bytes.
    let packed = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{}/metrics", p.metrics_port))
        .header("accept", accept)
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(packed.headers()["content-encoding"], "gzip");
    assert_eq!(
        packed.headers()["content-type"],
        "text/plain; version=0.0.4; charset=utf-8; escaping=underscores"
    );
    let packed = packed.bytes().await.unwrap();
    let mut unpacked = String::new();
    std::io::Read::read_to_string(
        &mut flate2::read::GzDecoder::new(packed.as_ref()),
        &mut unpacked,
    )
    .unwrap();
    assert!(packed.len() * 4 < unpacked.len(), "{} bytes", packed.len());
    for line in [latency_bucket.as_str(), &residence_bucket] {
        assert!(
            unpacked.lines().any(|l| l == line),
            "{line} missing:\n{unpacked}"
        );
    }
}

/// A processor with the request `id` in flight: the gateway answers it after `answer_after`,
/// and it has reached the gateway when this returns.
async fn in_flight(
    redis: &RedisServer,
    gw: &Gateway,
    id: &str,
    answer_after: Duration,
) -> Processor {
    gw.script(id, vec![Reply::ok("{}").after(answer_after)]);
    let p = Processor::start(redis, gw, &ProcessorOpts::default()).await;
    producer(redis, Q)
        .await
        .submit(request(id, 120, "{}"))
        .await
        .unwrap();
    gw.wait_seen(id, Duration::from_secs(10)).await;
    p
}

/// Long-context prompts of 1 MiB, a batch size of 256 and one busy worker: the requests claimed
/// and waiting for a worker are bounded by their bytes (64 MiB), not by the pool channel's two
/// batches (512 requests, 512 MiB of prompts held in the processor and in Redis's claims), and
/// every request still gets exactly one result with its prompt sent unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn big_prompts_waiting_for_a_worker_are_bounded_by_bytes() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    // The first request holds the only worker while the consumer fills its pool.
    gw.script(
        "big-000",
        vec![Reply::ok(r#"{"ok":1}"#).after(Duration::from_secs(3))],
    );
    let opts = ProcessorOpts {
        concurrency: 1,
        batch_size: 256,
        ..ProcessorOpts::default()
    };
    let producer = producer(&redis, Q).await;
    let payload = format!(r#"{{"prompt":"{}"}}"#, "x".repeat(1 << 20));
    const N: usize = 100;
    for i in 0..N {
        // Earlier ids have earlier deadlines: big-000 is claimed first.
        let req = request(&format!("big-{i:03}"), 600 + i as i64, &payload);
        producer.submit(req).await.unwrap();
    }
    let _p = Processor::start(&redis, &gw, &opts).await;
    gw.wait_seen("big-000", Duration::from_secs(20)).await;
    let mut con = con(&redis).await;
    let mut most_claimed = 0u64;
    while gw.seen("big-001").is_empty() {
        // (A read Redis is too busy to answer in time is skipped.)
        if let Ok(claimed) = con.hlen::<_, u64>(format!("{Q}:claimed")).await {
            most_claimed = most_claimed.max(claimed);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 64 MiB of 1 MiB prompts waiting, one more past the bound, one at the worker, one
    // between the pool and the worker.
    assert!(
        most_claimed <= 67,
        "{most_claimed} of {N} big requests claimed while one worker was busy"
    );
    let got = wait_results(&mut con, N, Duration::from_secs(60)).await;
    let ids: std::collections::BTreeSet<_> = got.iter().map(|r| r.id.clone()).collect();
    assert_eq!((got.len(), ids.len()), (N, N), "one result per request");
    assert!(got.iter().all(|r| r.status_code == 200));
    assert_eq!(&gw.seen("big-050")[0].body[..], payload.as_bytes());
}
