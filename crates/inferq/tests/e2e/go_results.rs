//! What newer Go (after v0.9) writes around results, end to end through `inferq run` on a real
//! Redis: a `request_token` on every result, a queue's `result_ttl_seconds` set on the result
//! list at every push, and the result route stamped into a member that goes back to Redis
//! (`internal.result_routing_resolved`, `result_queue_name`, `result_ttl_seconds`) and kept by
//! every processor after it.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

const Q: &str = "request-sortedset";

/// The request token of each pending member, by id.
async fn pending_tokens(con: &mut redis::aio::ConnectionManager) -> HashMap<String, String> {
    let members: Vec<String> = con.zrange(Q, 0, -1).await.unwrap();
    members
        .iter()
        .map(|m| {
            let env: serde_json::Value = serde_json::from_str(m).unwrap();
            (
                env["data"]["id"].as_str().unwrap().to_owned(),
                env["internal"]["request_token"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            )
        })
        .collect()
}

/// Every result names its generation's token, including one that went through a retry; the
/// queue's TTL is on the result list after each push; and the retry's parked member carries the
/// route it was resolved to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_carry_their_token_and_the_list_its_ttl() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "retried",
        vec![Reply::status(503, "busy"), Reply::ok(r#"{"ok":true}"#)],
    );
    let producer = producer(&redis, Q).await;
    for id in ["plain", "retried"] {
        producer.submit(request(id, 120, "{}")).await.unwrap();
    }
    let mut con = con(&redis).await;
    let tokens = pending_tokens(&mut con).await;
    let opts = ProcessorOpts {
        extra_queue_fields: r#","result_ttl_seconds":600"#.to_owned(),
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gw, &opts).await;
    // The retry waits in the parked set with its route stamped in.
    let started = Instant::now();
    let parked = loop {
        let parked: Vec<String> = con.zrange(format!("{Q}:parked"), 0, -1).await.unwrap();
        if let Some(m) = parked.first() {
            break serde_json::from_str::<serde_json::Value>(m).unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the 503 was never parked"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let internal = &parked["internal"];
    assert_eq!(internal["retry_count"], 1, "{parked}");
    assert_eq!(internal["result_routing_resolved"], true, "{parked}");
    assert_eq!(internal["result_queue_name"], "result-list", "{parked}");
    assert_eq!(internal["result_ttl_seconds"], 600, "{parked}");
    let raw = wait_results_in(&mut con, "result-list", 2, Duration::from_secs(20)).await;
    assert_eq!(raw.len(), 2, "{raw:?}");
    for r in &raw {
        let msg: inferq_client::wire::ResultMessage = serde_json::from_str(r).unwrap();
        assert_eq!(msg.status_code, 200, "{r}");
        assert_eq!(msg.request_token, tokens[&msg.id], "{r}");
        assert!(
            r.starts_with(&format!(
                r#"{{"id":"{}","request_token":"{}","#,
                msg.id, tokens[&msg.id]
            )),
            "the token stands beside the id: {r}"
        );
    }
    let ttl: i64 = con.ttl("result-list").await.unwrap();
    assert!((590..=600).contains(&ttl), "result-list TTL {ttl}");
}

/// A member whose route another processor already resolved keeps it: its result goes to the
/// stamped list with the stamped TTL, though this processor's queue names another list and
/// TTL. An unstamped member follows Go's precedence: the queue's list before the message's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stamped_route_wins_over_the_queue_config() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let deadline = inferq_client::producer::unix_ms() / 1000 + 120;
    let member = |id: &str, internal: &str| {
        format!(
            r#"{{"internal":{{{internal}}},"request_kind":"plain","data":{{"id":"{id}","created":1,"deadline":{deadline},"payload":{{}}}}}}"#
        )
    };
    let stamped = member(
        "stamped",
        r#""retry_count":1,"request_token":"00000000000000000000000000000001","result_queue_name":"stamped-list","result_ttl_seconds":120,"result_routing_resolved":true"#,
    );
    let unstamped = member(
        "unstamped",
        r#""request_token":"00000000000000000000000000000002","result_queue_name":"message-list""#,
    );
    for m in [&stamped, &unstamped] {
        let _: () = con.zadd(Q, m, deadline).await.unwrap();
    }
    let opts = ProcessorOpts {
        extra_queue_fields: r#","result_queue_name":"queue-list","result_ttl_seconds":900"#
            .to_owned(),
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gw, &opts).await;
    let on_stamped = wait_results_in(&mut con, "stamped-list", 1, Duration::from_secs(10)).await;
    assert_eq!(on_stamped.len(), 1);
    assert!(
        on_stamped[0].starts_with(
            r#"{"id":"stamped","request_token":"00000000000000000000000000000001","status_code":200"#
        ),
        "{}",
        on_stamped[0]
    );
    let on_queue = wait_results_in(&mut con, "queue-list", 1, Duration::from_secs(10)).await;
    assert_eq!(on_queue.len(), 1);
    assert!(
        on_queue[0].contains(r#""id":"unstamped""#),
        "{}",
        on_queue[0]
    );
    let stamped_ttl: i64 = con.ttl("stamped-list").await.unwrap();
    let queue_ttl: i64 = con.ttl("queue-list").await.unwrap();
    assert!(
        (110..=120).contains(&stamped_ttl),
        "stamped TTL {stamped_ttl}"
    );
    assert!((890..=900).contains(&queue_ttl), "queue TTL {queue_ttl}");
    let elsewhere: i64 = con.llen("message-list").await.unwrap();
    assert_eq!(elsewhere, 0, "the queue's list beats the message's");
}
