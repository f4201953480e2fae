//! End-to-end tests of a processor against a Redis at its resource limits: `maxclients`
//! reached (at start-up and while running, after its connections were killed), an evicting
//! `maxmemory-policy`, and a `client-output-buffer-limit pubsub` too small for a burst of
//! keyspace events, an open-file limit smaller than the workers need. Each runs a real redis-server, the test gateway and `inferq run`, and checks
//! that every request gets exactly one result, that `/readyz` and the log name what is wrong
//! while it lasts, and that the processor recovers by itself.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;

/// `/readyz`'s status code and body.
async fn readyz(p: &Processor) -> (u16, String) {
    match reqwest::get(format!("http://127.0.0.1:{}/readyz", p.health_port)).await {
        Ok(r) => {
            let status = r.status().as_u16();
            (status, r.text().await.unwrap_or_default())
        }
        Err(e) => (0, e.to_string()),
    }
}

/// Waits (up to `limit`) until `/readyz` answers 503 with a body containing `needle`; the last
/// body seen otherwise.
async fn wait_not_ready_naming(p: &Processor, needle: &str, limit: Duration) -> Result<(), String> {
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < limit {
        let (status, body) = readyz(p).await;
        if status == 503 && body.contains(needle) {
            return Ok(());
        }
        last = format!("{status} {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last)
}

/// Waits (up to `limit`) until the processor's log contains `needle`.
async fn wait_log(p: &Processor, needle: &str, limit: Duration) -> bool {
    let started = Instant::now();
    while started.elapsed() < limit {
        if p.log().contains(needle) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn config_set(admin: &mut MultiplexedConnection, key: &str, value: &str) {
    inferq_testkit::config_set(admin, key, value).await.unwrap();
}

/// Kills every client of the server but `admin`: the processor's command and pub/sub
/// connections.
async fn kill_others(admin: &mut MultiplexedConnection) {
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query_async(admin)
        .await
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query_async(admin)
        .await
        .unwrap();
}

/// Submits `ids` (deadline a minute away) and waits for one result each; asserts there is
/// exactly one per id.
async fn served_once_each(redis: &RedisServer, queue: &str, ids: &[String], p: &Processor) {
    let producer = producer(redis, queue).await;
    for id in ids {
        producer
            .submit(request(id, 60, r#"{"prompt":"x"}"#))
            .await
            .unwrap();
    }
    let mut con = con(redis).await;
    let got = wait_results(&mut con, ids.len(), Duration::from_secs(30)).await;
    let mut seen: Vec<String> = got.iter().map(|r| r.id.clone()).collect();
    seen.sort();
    let mut want = ids.to_vec();
    want.sort();
    assert_eq!(seen, want, "one result per request; log:\n{}", p.log());
}

/// A Redis at `maxclients` turns the processor's reconnections away with
/// `ERR max number of clients reached`, which a reconnecting client sees only as a reset or a
/// broken pipe. `/readyz` and the log name the real reason while it lasts (before, they said
/// "broken pipe" or "connection reset by peer", pointing an operator at the network), the
/// processor is ready again by itself once connections are taken, and work in flight gets one
/// result each.
#[tokio::test]
async fn maxclients_reached_while_running_is_named_and_recovered_from() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let opts = ProcessorOpts {
        lease_s: 3.0,
        reclaim_ms: 1000,
        ..Default::default()
    };
    let p = Processor::start(&redis, &gateway, &opts).await;
    let slow: Vec<String> = (0..4).map(|i| format!("slow-{i}")).collect();
    for id in &slow {
        gateway.script(id, vec![Reply::ok("{}").after(Duration::from_secs(2))]);
    }
    let producer = producer(&redis, &opts.queue).await;
    for id in &slow {
        producer
            .submit(request(id, 60, r#"{"prompt":"x"}"#))
            .await
            .unwrap();
    }
    gateway
        .wait_executions(slow.len(), Duration::from_secs(10))
        .await;

    let mut admin = redis.connection().await.unwrap();
    config_set(&mut admin, "maxclients", "1").await;
    kill_others(&mut admin).await;
    let named =
        wait_not_ready_naming(&p, "max number of clients reached", Duration::from_secs(15)).await;
    assert!(named.is_ok(), "readyz: {named:?}; log:\n{}", p.log());
    assert!(
        wait_log(&p, "max number of clients reached", Duration::from_secs(15)).await,
        "the log names the refusal:\n{}",
        p.log()
    );

    config_set(&mut admin, "maxclients", "10000").await;
    p.wait_ready().await;
    // The test's own producer lost its connection to the CLIENT KILL too.
    common::producer(&redis, &opts.queue)
        .await
        .submit(request("after", 60, r#"{"prompt":"x"}"#))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, slow.len() + 1, Duration::from_secs(30)).await;
    let mut ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), slow.len() + 1, "one result each: {got:?}");
    assert_eq!(got.len(), slow.len() + 1, "no duplicates: {got:?}");
}

/// A processor started while Redis is at `maxclients` says so in `/readyz` (before: "cannot
/// connect: broken pipe") and starts by itself once a connection is taken.
#[tokio::test]
async fn maxclients_reached_at_start_up_is_named_and_waited_out() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let mut admin = redis.connection().await.unwrap();
    config_set(&mut admin, "maxclients", "1").await;
    let opts = ProcessorOpts::default();
    let p = Processor::spawn(&redis, &gateway, &opts);
    let named =
        wait_not_ready_naming(&p, "max number of clients reached", Duration::from_secs(20)).await;
    assert!(named.is_ok(), "readyz: {named:?}; log:\n{}", p.log());
    config_set(&mut admin, "maxclients", "10000").await;
    p.wait_ready().await;
    served_once_each(&redis, &opts.queue, &["a".to_owned()], &p).await;
}

/// An evicting `maxmemory-policy` is warned about at start-up, before "inferq ready" (before:
/// not a word, and under allkeys-lru a full Redis deletes queues and results), and keys that
/// Redis then evicts are an error naming how many.
#[tokio::test]
async fn an_evicting_policy_is_warned_about_and_evictions_reported() {
    let redis =
        RedisServer::start_with_args(vec!["--maxmemory-policy".into(), "allkeys-lru".into()])
            .unwrap();
    let gateway = Gateway::start().await;
    let p = Processor::start(&redis, &gateway, &ProcessorOpts::default()).await;
    let log = p.log();
    let warned = log
        .find("evicting maxmemory-policy")
        .expect("a warning about the policy");
    let ready = log.find("inferq ready").expect("ready");
    assert!(warned < ready, "warned before ready:\n{log}");
    assert!(log.contains("allkeys-lru"), "{log}");

    let mut admin = redis.connection().await.unwrap();
    let used: String = redis::cmd("INFO")
        .arg("memory")
        .query_async(&mut admin)
        .await
        .unwrap();
    let used: u64 = used
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap();
    config_set(&mut admin, "maxmemory", &(used + 500_000).to_string()).await;
    let filler = "x".repeat(10_000);
    for i in 0..200 {
        let _: () = admin.set(format!("filler:{i}"), &filler).await.unwrap();
    }
    assert!(
        wait_log(&p, "Redis evicted keys", Duration::from_secs(20)).await,
        "evictions reported:\n{}",
        p.log()
    );
}

/// A `client-output-buffer-limit pubsub` too small for a burst of wake-ups (doorbell rings, or
/// keyspace events) makes Redis cut the wake-up subscription at every burst. The log says so (before: nothing), the
/// consumers poll meanwhile, and every request gets one result.
#[tokio::test]
async fn a_wake_up_subscription_cut_by_the_output_buffer_limit_is_reported() {
    let redis = RedisServer::start_with_args(vec![
        "--client-output-buffer-limit".into(),
        "pubsub 1kb 1kb 1".into(),
    ])
    .unwrap();
    let gateway = Gateway::start().await;
    let opts = ProcessorOpts {
        poll_interval_ms: 500,
        ..Default::default()
    };
    let p = Processor::start(&redis, &gateway, &opts).await;
    // A burst of rings in one script: Redis queues them all for the subscriber at once, past
    // the hard limit, and cuts it.
    let mut admin = redis.connection().await.unwrap();
    let _: () = redis::cmd("EVAL")
        .arg("for i = 1, 2000 do redis.call('PUBLISH', KEYS[1], 'ring') end")
        .arg(1)
        .arg(inferq_client::keys::doorbell_channel(&opts.queue))
        .query_async(&mut admin)
        .await
        .unwrap();
    assert!(
        wait_log(
            &p,
            "closed the wake-up subscription",
            Duration::from_secs(20)
        )
        .await,
        "the loss is reported:\n{}",
        p.log()
    );
    let ids: Vec<String> = (0..300).map(|i| format!("r{i}")).collect();
    let requests: Vec<_> = ids
        .iter()
        .map(|id| request(id, 60, r#"{"prompt":"x"}"#))
        .collect();
    producer(&redis, &opts.queue)
        .await
        .submit_many(requests)
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, ids.len(), Duration::from_secs(30)).await;
    let mut seen: Vec<String> = got.iter().map(|r| r.id.clone()).collect();
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), ids.len(), "one result each");
    assert_eq!(got.len(), ids.len(), "no duplicates");
}

/// The open-file limit of a running process (`soft`, `hard`), from `/proc/<pid>/limits`.
fn open_files(pid: u32) -> Option<(String, String)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    let mut fields = line.split_whitespace().skip(3);
    Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
}

/// A hard open-file limit below what the workers need (1,024 workers, `ulimit -n 256`): the
/// processor says so at start-up, naming the limit and the need, instead of running silently
/// with gateway connects failing and its probes refused; and every request still gets its one
/// result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_file_limit_below_the_workers_need_is_named_at_start() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        concurrency: 1024,
        ulimit: Some("-n 256"),
        ..Default::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    assert_eq!(
        open_files(p.pid()),
        Some(("256".to_owned(), "256".to_owned()))
    );
    let log = p.log();
    assert!(
        log.contains("the open-file limit (RLIMIT_NOFILE, ulimit -n) is 256 (hard limit 256), but 1024 workers need about 1088"),
        "no warning naming the limit; log:\n{log}"
    );
    let producer = producer(&redis, &opts.queue).await;
    for i in 0..20 {
        producer
            .submit(request(&format!("fd-{i}"), 600, r#"{"prompt":"x"}"#))
            .await
            .unwrap();
    }
    let mut con = con(&redis).await;
    let results = wait_results(&mut con, 20, Duration::from_secs(30)).await;
    let mut ids: Vec<String> = results.iter().map(|r| r.id.clone()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
}

/// A soft open-file limit below the hard one is raised to it at start-up, as the Go runtime
/// does, so `ulimit -Sn 256` under a hard limit with room costs nothing and warns of nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_soft_open_file_limit_is_raised_to_the_hard_one() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        concurrency: 1024,
        ulimit: Some("-Sn 256 && ulimit -Hn 2048"),
        ..Default::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    assert_eq!(
        open_files(p.pid()),
        Some(("2048".to_owned(), "2048".to_owned()))
    );
    let log = p.log();
    assert!(log.contains("raised the open-file limit"), "log:\n{log}");
    assert!(!log.contains("workers need about"), "log:\n{log}");
}

/// A result bigger than Redis's `proto-max-bulk-len` (an operator set it to its 1 MiB minimum):
/// Redis closes the connection at every write that carries it, which looks like an outage. The
/// outbox writes it alone, so the small results that shared its batch land, and once Redis has
/// closed the connection on it three times while still answering PING, the request gets an
/// `INFERENCE_ERROR` result saying why instead of holding the queue's outbox forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_bigger_than_redis_takes_ends_with_an_error_and_holds_nothing_back() {
    let redis =
        RedisServer::start_with_args(vec!["--proto-max-bulk-len".into(), "1mb".into()]).unwrap();
    let gw = Gateway::start().await;
    let huge = format!(r#"{{"text":"{}"}}"#, "y".repeat(1_500_000));
    gw.script("huge", vec![Reply::ok(&huge)]);
    let opts = ProcessorOpts {
        queue: "big-results".into(),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, &opts.queue).await;
    let mut ids = vec!["huge".to_owned()];
    ids.extend((0..5).map(|i| format!("small-{i}")));
    let requests: Vec<_> = ids
        .iter()
        .map(|id| request(id, 600, r#"{"prompt":"p"}"#))
        .collect();
    producer.submit_many(requests).await.unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, ids.len(), Duration::from_secs(60)).await;
    let mut seen: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    seen.sort_unstable();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort_unstable();
    assert_eq!(seen, want, "one result per request; log:\n{}", p.log());
    for r in &got {
        if r.id == "huge" {
            assert_eq!(r.error_code, "INFERENCE_ERROR");
            assert!(
                r.error_message.contains("proto-max-bulk-len"),
                "{}",
                r.error_message
            );
        } else {
            assert_eq!(r.status_code, 200, "{r:?}");
        }
    }
    let claimed: u64 = con.hlen("big-results:claimed").await.unwrap();
    assert_eq!(claimed, 0);
}
