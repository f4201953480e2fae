//! The census: each place counted and what needs attention, on a read-only replica too.

use super::*;
use crate::queue::census;

/// `inferq status`'s census counts each request in the one place it is, and the ones that need
/// attention there: overdue in pending, a lease run out but not reclaimed, a backoff elapsed, a
/// request delivered again, a result waiting.
#[tokio::test]
async fn census_counts_each_place_and_what_needs_attention() {
    let mut r = rig(300, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d"]).await;
    let done = ResultMessage::http("a", 200, b"{}");
    let now_s = unix_ms() / 1000;
    let parked_due = Finish::Park {
        fence: held[2].fence.clone(),
        member: Queue::retry_member(&held[2].envelope),
        backoff: Duration::ZERO,
    };
    r.queue
        .finish(&[ack(&held[0], &done), park_of(&held[1]), parked_due])
        .await
        .unwrap();
    // Overdue: a Go producer's member whose deadline passed while it waited.
    let _: () = r.con.zadd(Q, "late", now_s - 10).await.unwrap();
    let _: () = r.con.lpush("q:dead", "a record").await.unwrap();

    let mut con = r.con.clone();
    let census = census::census(&mut con, Q, Some(RESULTS)).await.unwrap();
    let want = census::Census {
        at_ms: census.at_ms,
        pending: 1,
        overdue: 1,
        claimed: 1,
        lease_expired: 0,
        parked: 2,
        parked_due: 1,
        dead: 1,
        redelivered: 0,
        results: Some(1),
    };
    assert_eq!(census, want);
    assert!(census.at_ms.abs_diff(redis_now_ms(&mut con).await as i64) < 5_000);

    // d's lease runs out: it is still claimed, and counted as needing a reclaim ...
    let expired = first_nonzero("d's lease to run out", || async {
        let mut con = r.con.clone();
        census::census(&mut con, Q, None)
            .await
            .unwrap()
            .lease_expired
    })
    .await;
    assert_eq!(expired, 1);
    // ... which moves it back to pending, delivered again.
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    let after = census::census(&mut con, Q, None).await.unwrap();
    assert_eq!(
        (
            after.pending,
            after.claimed,
            after.lease_expired,
            after.redelivered
        ),
        (2, 0, 0, 1)
    );
    assert_eq!(after.results, None, "no result list named");
    assert_eq!(after.unfinished(), 4);

    let _: () = r.con.set(Q, "not a sorted set").await.unwrap();
    let refused = census::census(&mut con, Q, None).await.unwrap_err();
    assert!(refused.to_string().contains("WRONGTYPE"), "{refused}");
}

/// The census moves nothing, so it runs on a read-only replica too (an operator may point
/// `inferq status` at one to spare the primary).
#[tokio::test]
async fn census_runs_on_a_read_only_replica() {
    let mut r = rig(30_000, 5).await;
    config_set(&mut r.con, "repl-diskless-sync-delay", 0)
        .await
        .unwrap();
    submit_and_claim(&r, &["a"]).await;
    r.producer.submit(request("b", 60)).await.unwrap();
    let replica = RedisServer::start_with_args(vec![
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        r.server.port().to_string(),
    ])
    .unwrap();
    let client = redis::Client::open(replica.url()).unwrap();
    let con = connect::manager(&client).await.unwrap();
    let seen = first_nonzero("the replica to copy the queue", || {
        let mut con = con.clone();
        async move {
            match census::census(&mut con, Q, None).await {
                Ok(c) => c.pending * 10 + c.claimed,
                Err(_) => 0, // still syncing
            }
        }
    })
    .await;
    assert_eq!(seen, 11, "one pending, one claimed");
}
