//! Rolling upgrades: for minutes, processors of the previous release and of this one share a
//! queue, and this one inherits what the previous one wrote (claims, delivery counts). CI does
//! not build old commits: each test writes into a real `redis-server` the keys the previous
//! release leaves, then runs this release's processor on them, as in `residue.rs`.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

/// The claim key of a generation (`id NUL request_token`), as every release writes it.
fn claim_key(id: &str, token: &str) -> String {
    format!("{id}\0{token}")
}

/// Redis's clock, in Unix seconds.
async fn redis_now(con: &mut redis::aio::ConnectionManager) -> f64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    s as f64 + us as f64 / 1e6
}

/// The release before `<queue>:deliveries-idx` (886b266) counted a lease expiry in
/// `<queue>:deliveries` with no deadline entry, and still does while it runs beside this one.
/// Such a count whose request then left the queue without a finish (its producer withdrew it,
/// a Go instance finished it) stayed for good, and `inferq status` counted its request as
/// "delivered again" for good: after a mixed fleet of the two drained 600 requests, 12 such
/// counts were left, and status said `"redelivered":12` on an empty queue.
///
/// Here the previous release left three counts of withdrawn requests, a count of a request one
/// of its live instances holds (deadline in 3 s), and a count of a pending request. This
/// release serves the pending one (its count goes with the ack), drops the held one's count
/// once its deadline has passed, and gives each withdrawn one a deadline entry a day ahead, so
/// reclaim drops it then.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivery_counts_of_the_previous_release_are_dropped_in_time() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    let queue = "upgrade";
    let deliveries = format!("{queue}:deliveries");
    let deliveries_idx = format!("{queue}:deliveries-idx");
    let mut con = con(&redis).await;
    let producer = producer(&redis, queue).await;

    // What the previous release left.
    let kept = producer
        .submit(request("kept", 120, r#"{"prompt":"a"}"#))
        .await
        .unwrap();
    let held = producer
        .submit(request("held", 3, r#"{"prompt":"a"}"#))
        .await
        .unwrap();
    let members: Vec<(Vec<u8>, f64)> = con.zrange_withscores(queue, 0, -1).await.unwrap();
    let (held_member, held_deadline) = members
        .iter()
        .find(|(m, _)| String::from_utf8_lossy(m).contains(r#""id":"held""#))
        .cloned()
        .unwrap();
    let held_key = claim_key("held", &held.request_token);
    let now = redis_now(&mut con).await;
    let _: () = redis::pipe()
        .zrem(queue, &held_member)
        .hset(format!("{queue}:claimed"), &held_key, &held_member)
        .hset(
            format!("{queue}:claim-owners"),
            &held_key,
            "an-old-instance",
        )
        .zadd(format!("{queue}:claims-idx"), &held_key, now + 60.0)
        .hset(format!("{queue}:claim-scores"), &held_key, held_deadline)
        .hset(&deliveries, &held_key, 1)
        .hset(&deliveries, claim_key("kept", &kept.request_token), 1)
        .query_async(&mut con)
        .await
        .unwrap();
    let withdrawn: Vec<String> = (0..3)
        .map(|i| claim_key(&format!("w{i}"), &format!("{i:032x}")))
        .collect();
    for key in &withdrawn {
        let _: () = con.hset(&deliveries, key, 1).await.unwrap();
    }

    let started_at = redis_now(&mut con).await;
    let p = Processor::start(
        &redis,
        &gateway,
        &ProcessorOpts {
            queue: queue.to_owned(),
            lease_s: 1.0,
            reclaim_ms: 500,
            ..ProcessorOpts::default()
        },
    )
    .await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "log:\n{}", p.log());
    assert_eq!((got[0].id.as_str(), got[0].status_code), ("kept", 200));

    // Past the held request's deadline, only the withdrawn requests' counts are left, each
    // with its entry.
    let started = Instant::now();
    let mut counts: Vec<String> = con.hkeys(&deliveries).await.unwrap();
    let mut entries: Vec<(String, f64)> =
        con.zrange_withscores(&deliveries_idx, 0, -1).await.unwrap();
    while (counts.len() > 3 || entries.len() < 3) && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(200)).await;
        counts = con.hkeys(&deliveries).await.unwrap();
        entries = con.zrange_withscores(&deliveries_idx, 0, -1).await.unwrap();
    }
    counts.sort();
    assert_eq!(
        counts,
        withdrawn,
        "the served request's and the held one's counts are gone; log:\n{}",
        p.log()
    );
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let indexed: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
    assert_eq!(
        indexed,
        withdrawn.iter().collect::<Vec<_>>(),
        "every count left has a deadline entry; log:\n{}",
        p.log()
    );
    let day = 24.0 * 3600.0;
    for (key, at) in &entries {
        assert!(
            *at >= started_at + day - 1.0 && *at <= started_at + day + 60.0,
            "{key:?} is dropped a day after this release found it, not at {at} (started at {started_at})"
        );
    }
    assert_eq!(results(&mut con).await.len(), 1, "one result, no more");
}
