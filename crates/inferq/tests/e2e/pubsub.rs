//! End-to-end tests of Go's `redis-pubsub` transport: a Go producer PUBLISHes envelopes on a
//! queue's channel and a Go consumer SUBSCRIBEs to the result channel. Real processes, a real
//! Redis, a real HTTP gateway. Where Go executes a message once per subscribed instance and
//! loses it with the instance that received it, inferq admits it into a durable queue once.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

const CHANNEL: &str = "request-queue";
const RESULTS: &str = "result-queue";

fn opts(redis: &RedisServer, gw: &Gateway, lease_s: f64) -> ProcessorOpts {
    let config = format!(
        r#"{{"url":"{}","claim_lease_ttl_seconds":{lease_s},"claim_reclaim_interval_ms":300,"queues":[{{"queue_name":"{CHANNEL}","igw_base_url":"{}","gate_type":"redis"}}]}}"#,
        redis.url(),
        gw.url()
    );
    ProcessorOpts {
        transport_args: Some(vec![
            "--transport".into(),
            "redis-pubsub".into(),
            "--transport-config".into(),
            config,
        ]),
        ..ProcessorOpts::default()
    }
}

/// An envelope as Go's redis-pubsub producer publishes it.
fn envelope(id: &str, secs: i64, kind: &str) -> String {
    let now = inferq_client::producer::unix_ms() / 1000;
    format!(
        r#"{{"internal":{{"request_queue_name":"{CHANNEL}","result_queue_name":"somewhere-else"}},"request_kind":"{kind}","data":{{"id":"{id}","created":{now},"deadline":{},"payload":{{"model":"m","prompt":"p","seed":12345678901234567890}},"metadata":{{"userid":"u"}}}}}}"#,
        now + secs
    )
}

async fn publish(redis: &RedisServer, message: &str) -> u64 {
    let mut con = con(redis).await;
    con.publish(CHANNEL, message).await.unwrap()
}

/// A Go consumer: the results published on the result channel, as they arrive.
async fn subscriber(redis: &RedisServer) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    let mut pubsub = redis.client().unwrap().get_async_pubsub().await.unwrap();
    pubsub.subscribe(RESULTS).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = pubsub.on_message();
        while let Some(m) = messages.next().await {
            if tx.send(m.get_payload::<String>().unwrap()).is_err() {
                break;
            }
        }
    });
    rx
}

/// What arrives on `rx` within `limit`, stopping early once `n` have.
async fn receive(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<String>,
    n: usize,
    limit: Duration,
) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    let until = Instant::now() + limit;
    while got.len() < n {
        match tokio::time::timeout_at(until.into(), rx.recv()).await {
            Ok(Some(text)) => got.push(serde_json::from_str(&text).unwrap()),
            _ => break,
        }
    }
    got
}

/// The Go wire format end to end: a published envelope (of either request kind) reaches the
/// gateway with its payload bytes unchanged and its result is published on `result-queue` as
/// Go's ResultMessage, whatever result list the message names (Go ignores it on this
/// transport). Nothing is left in Redis but the admit markers. The config's `gate_type` is
/// ignored with a warning, as Go ignores it, and the metrics carry Go's labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_published_request_is_answered_on_the_result_channel() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script("ps-1", vec![Reply::status(201, r#"{"text":"one"}"#)]);
    gw.script("ps-2", vec![Reply::ok(r#"{"text":"two"}"#)]);
    let p = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    let mut results = subscriber(&redis).await;
    assert_eq!(publish(&redis, &envelope("ps-1", 60, "plain")).await, 1);
    assert_eq!(publish(&redis, &envelope("ps-2", 60, "redis")).await, 1);
    let got = receive(&mut results, 2, Duration::from_secs(10)).await;
    let mut ids: Vec<&str> = got.iter().map(|r| r["id"].as_str().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, ["ps-1", "ps-2"], "{got:?}\n{}", p.log());
    let one = got.iter().find(|r| r["id"] == "ps-1").unwrap();
    assert_eq!(one["status_code"], 201);
    assert_eq!(one["payload"], r#"{"text":"one"}"#);
    let seen = gw.seen("ps-1");
    assert_eq!(seen.len(), 1);
    assert_eq!(
        &seen[0].body[..],
        br#"{"model":"m","prompt":"p","seed":12345678901234567890}"#
    );
    assert_eq!(seen[0].headers["x-llm-d-inference-fairness-id"], "u");
    let mut con = con(&redis).await;
    let heard: u64 = con.llen(RESULTS).await.unwrap();
    let elsewhere: u64 = con.llen("somewhere-else").await.unwrap();
    let pending: u64 = con.zcard(CHANNEL).await.unwrap();
    let claimed: u64 = con.hlen(format!("{CHANNEL}:claimed")).await.unwrap();
    assert_eq!((heard, elsewhere, pending, claimed), (0, 0, 0, 0));
    assert!(
        p.log().contains("ignoring queues[0].gate_type"),
        "{}",
        p.log()
    );
    // Go's series for the redis-pubsub flow: no queue id, the channel as queue name.
    let series = format!(
        r#"llm_d_async_async_request_total{{pool_name="default",queue_id="",queue_name="{CHANNEL}"}} 2"#
    );
    let metrics = p.metrics_with(&[&series]).await;
    assert!(metrics.contains(&series), "{metrics}");
}

/// Two instances subscribed to the channel both receive every message (Go executes it twice,
/// and publishes two results): inferq admits each message once, so the gateway sees each
/// request once and one result per request is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_execute_each_published_request_once() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let a = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    let b = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    let mut results = subscriber(&redis).await;
    for i in 0..20 {
        let receivers = publish(&redis, &envelope(&format!("two-{i}"), 60, "redis")).await;
        assert_eq!(receivers, 2, "both instances are subscribed");
    }
    let got = receive(&mut results, 40, Duration::from_secs(6)).await;
    assert_eq!(got.len(), 20, "{got:?}\n{}\n{}", a.log(), b.log());
    let ids: std::collections::HashSet<_> = got.iter().map(|r| r["id"].to_string()).collect();
    assert_eq!(ids.len(), 20);
    let executions = gw.executions();
    assert_eq!(executions.len(), 20);
    assert!(executions.values().all(|&n| n == 1), "{executions:?}");
    // Between them, the two instances admitted each message once and skipped its copy (the
    // slower instance's admits may still be on their way: wait for them).
    let started = Instant::now();
    loop {
        let mut counted = (0, 0);
        for text in [a.metrics().await, b.metrics().await] {
            for line in text
                .lines()
                .filter(|l| l.starts_with("inferq_pubsub_messages_total"))
            {
                let n: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                if line.contains("outcome=\"admitted\"") {
                    counted.0 += n;
                } else if line.contains("outcome=\"duplicate\"") {
                    counted.1 += n;
                }
            }
        }
        if counted == (20, 20) || started.elapsed() > Duration::from_secs(5) {
            assert_eq!(counted, (20, 20));
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A result published while no consumer is subscribed is kept in the list of the result
/// channel's name (Go's is lost), where `inferq results` or any BRPOP consumer finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_nobody_hears_is_kept() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let _p = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    publish(&redis, &envelope("unheard", 60, "plain")).await;
    let mut con = con(&redis).await;
    let kept = wait_results_in(&mut con, RESULTS, 1, Duration::from_secs(10)).await;
    assert_eq!(kept.len(), 1);
    let r: serde_json::Value = serde_json::from_str(&kept[0]).unwrap();
    assert_eq!(
        (r["id"].as_str(), r["status_code"].as_u64()),
        (Some("unheard"), Some(200))
    );
}

/// An instance killed (SIGKILL) while a published request is at the gateway: Go loses the
/// request with it. In inferq the request was admitted before it was sent, so a second
/// instance reclaims it when the lease runs out and publishes its one result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_instance_loses_no_published_request() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "crash",
        vec![
            Reply::ok(r#"{"first":true}"#).after(Duration::from_secs(30)),
            Reply::ok(r#"{"second":true}"#),
        ],
    );
    let mut a = Processor::start(&redis, &gw, &opts(&redis, &gw, 1.5)).await;
    let mut results = subscriber(&redis).await;
    publish(&redis, &envelope("crash", 60, "redis")).await;
    gw.wait_seen("crash", Duration::from_secs(10)).await;
    a.kill();
    let b = Processor::start(&redis, &gw, &opts(&redis, &gw, 1.5)).await;
    let got = receive(&mut results, 2, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "{got:?}\n{}", b.log());
    assert_eq!(got[0]["id"], "crash");
    assert_eq!(got[0]["payload"], r#"{"second":true}"#);
}

/// A message that is not a request (not JSON) is dead-lettered with a reason, not dropped
/// silently as Go drops it, and does not hold up the request published after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_message_is_dead_lettered() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    let mut results = subscriber(&redis).await;
    publish(&redis, "not a request").await;
    publish(&redis, &envelope("after-bad", 60, "plain")).await;
    let got = receive(&mut results, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "{}", p.log());
    assert_eq!(got[0]["id"], "after-bad");
    let mut con = con(&redis).await;
    let started = Instant::now();
    loop {
        let dead: Vec<String> = con.lrange(format!("{CHANNEL}:dead"), 0, -1).await.unwrap();
        if let Some(record) = dead.first() {
            assert!(record.contains("not a request"), "{record}");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "never dead-lettered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `/readyz` is not ready while the request channels cannot be listened on: here the user's
/// ACL denies SUBSCRIBE, so published requests would reach no one. The reason is named.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_subscription_redis_refuses() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut admin = con(&redis).await;
    let _: () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nosub",
            "on",
            ">pw",
            "~*",
            "&*",
            "+@all",
            "-subscribe",
        ])
        .query_async(&mut admin)
        .await
        .unwrap();
    let mut o = opts(&redis, &gw, 30.0);
    let url = format!("redis://nosub:pw@127.0.0.1:{}/", redis.port());
    if let Some(args) = o.transport_args.as_mut() {
        args[3] = args[3].replace(&redis.url(), &url);
    }
    let p = Processor::spawn(&redis, &gw, &o);
    let readyz = format!("http://127.0.0.1:{}/readyz", p.health_port);
    let started = Instant::now();
    let body = loop {
        if let Ok(r) = reqwest::get(&readyz).await {
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            if status == 503 && body.contains("refuses the subscription") {
                break body;
            }
            assert_ne!(status, 200, "ready without a subscription: {body}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no readiness answer naming the subscription\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(body.to_lowercase().contains("noperm"), "{body}");
}

/// A Go command line of the redis-pubsub transport (its deprecated `--redis.*` flags, without
/// `--message-queue-impl`: Go's default) runs unchanged: requests published on the channel the
/// flags name are answered on the result channel they name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_legacy_pubsub_command_line_serves_requests() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let o = ProcessorOpts {
        transport_args: Some(vec![
            format!("--redis.url={}", redis.url()),
            format!("--redis.igw-base-url={}", gw.url()),
            format!("--redis.request-queue-name={CHANNEL}"),
            format!("--redis.result-queue-name={RESULTS}"),
        ]),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &o).await;
    let mut results = subscriber(&redis).await;
    publish(&redis, &envelope("legacy-1", 60, "redis")).await;
    let got = receive(&mut results, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "{}", p.log());
    assert_eq!(got[0]["id"], "legacy-1");
    for said in [
        "--transport=redis-pubsub --transport-config=",
        "--message-queue-impl is not set: running redis-pubsub, Go's default",
    ] {
        assert!(p.log().contains(said), "{said}: {}", p.log());
    }
}

/// Two instances serve a stream of published requests and one is killed (SIGKILL) in the middle
/// of it, with requests in flight: every request published gets exactly one result. Both
/// instances received every message, so what the dead one had received but not admitted is
/// admitted by the other, and what it held under a lease is reclaimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_survives_the_kill_of_one_of_two_instances() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    const N: usize = 200;
    for i in 0..N {
        let reply = Reply::ok(r#"{"ok":true}"#).after(Duration::from_millis(200));
        gw.script(&format!("s-{i}"), vec![reply.clone(), reply]);
    }
    let mut a = Processor::start(&redis, &gw, &opts(&redis, &gw, 1.5)).await;
    let b = Processor::start(&redis, &gw, &opts(&redis, &gw, 1.5)).await;
    let mut results = subscriber(&redis).await;
    let mut con = con(&redis).await;
    for i in 0..N {
        if i == N / 2 {
            a.kill();
        }
        let receivers: u64 = con
            .publish(CHANNEL, envelope(&format!("s-{i}"), 120, "redis"))
            .await
            .unwrap();
        assert!(receivers >= 1, "s-{i} reached no instance");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut got = receive(&mut results, N, Duration::from_secs(20)).await;
    // A second result of any request would arrive after the first: wait a little for one.
    got.extend(receive(&mut results, 1, Duration::from_secs(2)).await);
    let kept = raw_results(&mut con, RESULTS).await;
    let mut count: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    for r in got
        .iter()
        .cloned()
        .chain(kept.iter().map(|k| serde_json::from_str(k).unwrap()))
    {
        assert_eq!(r["status_code"], 200, "{r}");
        *count
            .entry(r["id"].as_str().unwrap_or_default().to_owned())
            .or_default() += 1;
    }
    assert_eq!(count.len(), N, "every request has a result\n{}", b.log());
    assert!(
        count.values().all(|&n| n == 1),
        "one result each: {count:?}"
    );
    let executions: usize = gw.executions().values().sum();
    assert!(
        executions > N,
        "the kill caught requests in flight, which were sent again ({executions})"
    );
}

/// `inferq submit --queue <channel>` (here the library's producer) writes into the durable
/// queue the channel feeds, without going through pub/sub: the request is served and its
/// result published like a published one's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn submitting_into_the_channels_queue_needs_no_subscription() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &opts(&redis, &gw, 30.0)).await;
    let mut results = subscriber(&redis).await;
    let producer = producer(&redis, CHANNEL).await;
    producer
        .submit(request("submitted", 60, r#"{"prompt":"p"}"#))
        .await
        .unwrap();
    let got = receive(&mut results, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "{}", p.log());
    assert_eq!(got[0]["id"], "submitted");
    assert_eq!(gw.seen("submitted").len(), 1);
}
