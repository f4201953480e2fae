//! What a long-running deployment leaves in Redis: once every request has ended, a queue's keys
//! must hold nothing but what the design keeps (results until consumed, dead records until
//! purged, markers that expire by themselves). Anything else grows with the requests served.
//! Real processes against a real `redis-server`, as in `processor.rs`.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

/// Every key whose name starts with `prefix`, with its type and size.
async fn keys_of(con: &mut redis::aio::ConnectionManager, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, page): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(con)
            .await
            .unwrap();
        names.extend(page);
        if next == 0 {
            break;
        }
        cursor = next;
    }
    names.sort();
    for key in names {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(con).await.unwrap();
        let size: u64 = match kind.as_str() {
            "hash" => con.hlen(&key).await.unwrap(),
            "zset" => con.zcard(&key).await.unwrap(),
            "list" => con.llen(&key).await.unwrap(),
            _ => 1,
        };
        out.push(format!("{key} ({kind}, {size})"));
    }
    out
}

/// A processor dies with requests in flight; a survivor reclaims them, counting a delivery for
/// each; the producer then withdraws three of them from pending itself (`ZREM`), and the fourth
/// is served. Once the withdrawn requests' deadline has passed, the queue's keys are all gone:
/// the delivery counts of the withdrawn generations used to stay in `<queue>:deliveries` for
/// good (one field per such generation, no TTL), and `inferq status` counted them as requests
/// "delivered again" for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_request_leaves_no_delivery_count_behind() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let withdrawn = ["w0", "w1", "w2"];
    for id in withdrawn.iter().chain(&["kept"]) {
        gateway.script(
            id,
            vec![
                Reply::ok(r#"{"id":"cmpl-1"}"#).after(Duration::from_secs(60)),
                Reply::ok(r#"{"id":"cmpl-2"}"#),
            ],
        );
    }
    let queue = "residue";
    let opts = ProcessorOpts {
        queue: queue.to_owned(),
        lease_s: 1.0,
        reclaim_ms: 500,
        ..ProcessorOpts::default()
    };
    let mut con = con(&redis).await;
    let mut first = Processor::start(&redis, &gateway, &opts).await;
    let producer = producer(&redis, queue).await;
    for id in withdrawn {
        producer
            .submit(request(id, 10, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    producer
        .submit(request("kept", 120, r#"{"prompt":"a"}"#))
        .await
        .unwrap();
    gateway.wait_executions(4, Duration::from_secs(10)).await;
    assert_eq!(gateway.executions().len(), 4, "log:\n{}", first.log());
    first.kill();

    // The survivor's queue gate stays closed (budget 0) until the producer has withdrawn its
    // requests: it reclaims the dead instance's claims but takes none of them.
    let _: () = con.set("gate-budget", "0").await.unwrap();
    let gated = ProcessorOpts {
        extra_queue_fields: format!(
            r#","gate_type":"redis","gate_params":{{"address":"{}","budget_key":"gate-budget"}}"#,
            redis.url()
        ),
        ..opts.clone()
    };
    let survivor = Processor::start(&redis, &gateway, &gated).await;
    let deliveries = format!("{queue}:deliveries");
    let started = Instant::now();
    loop {
        let counted: u64 = con.hlen(&deliveries).await.unwrap();
        let pending: u64 = con.zcard(queue).await.unwrap();
        if (counted, pending) == (4, 4) || started.elapsed() > Duration::from_secs(15) {
            assert_eq!(
                (counted, pending),
                (4, 4),
                "the four requests are back in pending with a delivery counted; log:\n{}",
                survivor.log()
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The producer withdraws three of them itself.
    let members: Vec<Vec<u8>> = con.zrange(queue, 0, -1).await.unwrap();
    for member in members {
        let env: serde_json::Value = serde_json::from_slice(&member).unwrap();
        if withdrawn.contains(&env["data"]["id"].as_str().unwrap()) {
            let removed: u64 = con.zrem(queue, &member).await.unwrap();
            assert_eq!(removed, 1);
        }
    }
    let _: () = con.set("gate-budget", "1").await.unwrap();
    let got = wait_results(&mut con, 1, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 1, "log:\n{}", survivor.log());
    assert_eq!((got[0].id.as_str(), got[0].status_code), ("kept", 200));

    // Past the withdrawn requests' deadline (10 s) the survivor's reclaim passes drop their
    // counts: nothing of the queue is left.
    let started = Instant::now();
    let mut left = keys_of(&mut con, queue).await;
    while !left.is_empty() && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = keys_of(&mut con, queue).await;
    }
    assert!(
        left.is_empty(),
        "keys left behind after every request ended: {left:?}; log:\n{}",
        survivor.log()
    );
    assert_eq!(results(&mut con).await.len(), 1, "one result, no more");
}
