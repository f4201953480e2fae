//! A mixed fleet (issue "Catch up with the newest Go", item 8): a producer writing the newest
//! Go's format (bodies at payload keys, FIFO sequence numbers) and two inferq processors, one
//! SIGKILLed mid-run. Every generation gets exactly one result, every attempt is sent its stored
//! body, and no payload key is left once the queue is drained; a processor with one worker then
//! serves equal deadlines in submission order.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::go::{GoRequest, Q, RESULTS};
use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

fn body_of(id: &str) -> String {
    format!(r#"{{"model":"m","prompt":"classify {id}", "n":98765432109876543210}}"#)
}

async fn payload_keys_left(con: &mut redis::aio::ConnectionManager) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut iter: redis::AsyncIter<String> = con.scan_match("request-payload:*").await.unwrap();
    while let Some(k) = iter.next_item().await {
        keys.push(k.unwrap());
    }
    keys
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_format_producer_two_processors_one_killed() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let now = inferq_client::producer::unix_ms() / 1000;
    // 150 requests over three deadlines, so many share one; every third inline.
    let mut reqs = Vec::new();
    let mut seq: HashMap<i64, i64> = HashMap::new();
    for i in 0..150 {
        let deadline = now + 300 + (i % 3) as i64;
        let n = seq.entry(deadline).or_default();
        *n += 1;
        let id = format!("mix-{i:03}");
        let mut r = GoRequest::new(&id, deadline, *n, &body_of(&id));
        r.apart = i % 3 != 0;
        r.enqueue(&mut con).await;
        reqs.push(r);
    }
    for r in &reqs {
        gw.script(
            &r.id,
            vec![Reply::ok(r#"{"ok":1}"#).after(Duration::from_millis(150))],
        );
    }
    let opts = ProcessorOpts {
        lease_s: 2.0,
        reclaim_ms: 300,
        concurrency: 8,
        batch_size: 8,
        ..ProcessorOpts::default()
    };
    let mut a = Processor::start(&redis, &gw, &opts).await;
    let b = Processor::start(&redis, &gw, &opts).await;
    // Killed with requests in flight.
    let started = Instant::now();
    while raw_results(&mut con, RESULTS).await.len() < 40 {
        assert!(started.elapsed() < Duration::from_secs(30), "no progress");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.kill();
    let raw = wait_results_in(&mut con, RESULTS, 150, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let raw_after = raw_results(&mut con, RESULTS).await;
    assert_eq!(
        raw_after.len(),
        raw.len(),
        "results kept coming after all 150"
    );
    let mut per_generation: HashMap<(String, String), usize> = HashMap::new();
    for r in &raw_after {
        let msg: inferq_client::wire::ResultMessage = serde_json::from_str(r).unwrap();
        assert_eq!(msg.status_code, 200, "{r}");
        *per_generation
            .entry((msg.id, msg.request_token))
            .or_default() += 1;
    }
    for r in &reqs {
        assert_eq!(
            per_generation.get(&(r.id.clone(), r.token.clone())),
            Some(&1),
            "{} has not exactly one result",
            r.id
        );
        for attempt in gw.seen(&r.id) {
            assert_eq!(
                std::str::from_utf8(&attempt.body).unwrap(),
                r.body,
                "{}",
                r.id
            );
        }
    }
    assert_eq!(per_generation.len(), 150);
    let redone = reqs.iter().filter(|r| gw.seen(&r.id).len() > 1).count();
    eprintln!("{redone} requests ran twice: in flight on the killed processor");
    assert!(
        redone > 0,
        "the kill caught nothing in flight: the test proved nothing"
    );
    let left = payload_keys_left(&mut con).await;
    assert!(left.is_empty(), "payload keys left: {left:?}");
    let pending: i64 = con.zcard(Q).await.unwrap();
    assert_eq!(pending, 0);
    drop(b);

    // One worker: equal deadlines in submission order.
    let deadline = now + 400;
    let fifo: Vec<GoRequest> = (1..=15)
        .map(|n| {
            GoRequest::new(
                &format!("{}-fifo", (b'z' - n as u8) as char),
                deadline,
                n,
                "{}",
            )
        })
        .collect();
    for r in &fifo {
        r.enqueue(&mut con).await;
    }
    let one = ProcessorOpts {
        concurrency: 1,
        batch_size: 1,
        ..opts
    };
    let _c = Processor::start(&redis, &gw, &one).await;
    gw.wait_executions(165, Duration::from_secs(30)).await;
    let submitted: Vec<String> = fifo.iter().map(|r| r.id.clone()).collect();
    assert_eq!(gw.first_served(&submitted), submitted);
}
