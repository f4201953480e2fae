//! End-to-end tests of `inferq status`, run as the built binary against a real Redis, a real
//! processor and a gateway that holds some requests: what an operator sees of a queue while a
//! processor serves it and after that processor dies.

use crate::common;

use std::time::{Duration, Instant};

use common::{con, producer, request, wait_results, Gateway, Processor, ProcessorOpts, Reply};
use inferq_testkit::RedisServer;

/// `inferq status --json` for the default queue and result list: its one line, parsed.
fn status(redis: &RedisServer, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec!["status", "--json", "--result-queue", "result-list"];
    args.extend(extra);
    let out = common::cli(&args, &[("REDIS_URL", &redis.url())], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn counts(line: &serde_json::Value, fields: &[&str]) -> Vec<u64> {
    fields
        .iter()
        .map(|f| {
            line[f]
                .as_u64()
                .unwrap_or_else(|| panic!("no {f} in {line}"))
        })
        .collect()
}

/// Requests a live processor holds are counted claimed, a finished one as a waiting result;
/// once the processor is killed, their leases are counted as run out (nobody reclaims them
/// here), which is how an operator sees that the queue's owner is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_counts_what_a_processor_holds_and_when_its_leases_run_out() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    for id in ["slow1", "slow2"] {
        gw.script(id, vec![Reply::ok("{}").after(Duration::from_secs(60))]);
    }
    let opts = ProcessorOpts {
        lease_s: 1.0,
        reclaim_ms: 1_000,
        ..ProcessorOpts::default()
    };
    let mut p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, &opts.queue).await;
    producer.submit(request("fast", 60, "{}")).await.unwrap();
    let mut con = con(&redis).await;
    wait_results(&mut con, 1, Duration::from_secs(10)).await;
    for id in ["slow1", "slow2"] {
        producer.submit(request(id, 60, "{}")).await.unwrap();
    }
    for id in ["slow1", "slow2"] {
        gw.wait_seen(id, Duration::from_secs(10)).await;
    }

    let fields = ["pending", "claimed", "lease_expired", "results", "dead"];
    let lines = status(&redis, &[]);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["queue"], "request-sortedset");
    assert_eq!(counts(&lines[0], &fields), [0, 2, 0, 1, 0], "{}", lines[0]);

    p.kill();
    let started = Instant::now();
    let line = loop {
        let line = status(&redis, &[]).remove(0);
        if line["lease_expired"] == 2 || started.elapsed() > Duration::from_secs(10) {
            break line;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(counts(&line, &fields), [0, 2, 2, 1, 0], "{line}");
}

/// `--watch` with `--samples` counts again at the interval and adds the drain rate; two
/// queues give a line each per count; an interval too short to mean anything is bad input.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_watch_repeats_per_queue_and_refuses_a_silly_interval() {
    let redis = RedisServer::start().unwrap();
    producer(&redis, "request-sortedset")
        .await
        .submit(request("a", 60, "{}"))
        .await
        .unwrap();
    let lines = status(
        &redis,
        &[
            "--queue",
            "request-sortedset",
            "--queue",
            "other",
            "--watch",
            "100ms",
            "--samples",
            "2",
        ],
    );
    let queues: Vec<&str> = lines.iter().map(|l| l["queue"].as_str().unwrap()).collect();
    assert_eq!(
        queues,
        ["request-sortedset", "other", "request-sortedset", "other"]
    );
    assert_eq!(lines[0]["pending"], 1);
    assert!(lines[0].get("drained_per_s").is_none(), "{}", lines[0]);
    assert_eq!(lines[2]["drained_per_s"], 0.0, "{}", lines[2]);

    let out = common::cli(
        &["status", "--watch", "10ms"],
        &[("REDIS_URL", &redis.url())],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("must be at least 100ms"));
}

/// `inferq status --transport-config-file` counts the config's queues on the config's Redis,
/// and `--tenant-queue-prefix` adds the tenant queues in the index of queues with work (issue
/// 44: it wanted `--redis-url` and one `--queue` per tenant queue again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_reads_its_queues_from_the_transport_config() {
    let redis = RedisServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("transport.json");
    let json = serde_json::json!({"url": redis.url(), "queues": [
        {"queue_name": "listed-a", "igw_base_url": "http://127.0.0.1:1"},
        {"queue_name": "listed-b", "igw_base_url": "http://127.0.0.1:1"}]});
    std::fs::write(&config, json.to_string()).unwrap();
    producer(&redis, "listed-b")
        .await
        .submit(request("b-1", 60, "{}"))
        .await
        .unwrap();
    let tenant = producer(&redis, "inferq-tenant:team-a").await;
    for id in ["t-1", "t-2"] {
        tenant.submit(request(id, 60, "{}")).await.unwrap();
    }
    let mut c = con(&redis).await;
    let _: i64 = redis::cmd("ZADD")
        .arg("inferq-tenants:index")
        .arg(1)
        .arg("inferq-tenant:team-a")
        .query_async(&mut c)
        .await
        .unwrap();
    let path = config.display().to_string();
    // No REDIS_URL: the config says where Redis is.
    let out = common::cli(
        &[
            "status",
            "--json",
            "--transport-config-file",
            &path,
            "--tenant-queue-prefix",
            "inferq-tenant:",
        ],
        &[],
        "",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let pending: Vec<(String, u64)> = lines
        .iter()
        .map(|l| {
            (
                l["queue"].as_str().unwrap_or_default().to_owned(),
                counts(l, &["pending"])[0],
            )
        })
        .collect();
    assert_eq!(
        pending,
        [
            ("listed-a".to_owned(), 0),
            ("listed-b".to_owned(), 1),
            ("inferq-tenant:team-a".to_owned(), 2)
        ]
    );
    // A --queue beside the config is refused: one source of queues.
    let out = common::cli(
        &["status", "--transport-config-file", &path, "--queue", "x"],
        &[],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
}
