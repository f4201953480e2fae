//! Park, promote and release: a parked retry comes back when due (Go's retry set too), a release
//! returns a claim at once, and a key of the wrong type or an out-of-memory Redis loses nothing.

use super::*;

/// Rule 7: park is one fenced move into the parked set with a bumped retry_count, and promote
/// moves it back to pending at its deadline only once due.
#[tokio::test]
async fn park_then_promote_when_due() {
    let mut r = rig(30_000, 5).await;
    let sub = r.producer.submit(request("retry", 60)).await.unwrap();
    let held = claim_head(&r.queue, 1).await.remove(0);
    // Seconds, so the retry is not due yet at the first promote however the test is scheduled.
    assert!(r
        .queue
        .park(&held.fence, &held.envelope, Duration::from_secs(2))
        .await
        .unwrap());
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
    let early = r.queue.promote(10, None, true).await.unwrap();
    assert_eq!(early.moved, 0, "not due yet");
    let until_due = early.until_due.unwrap();
    assert!(
        until_due > Duration::ZERO && until_due <= Duration::from_secs(2),
        "the parked retry is due within its backoff: {until_due:?}"
    );
    let promoted = first_nonzero("the retry to be due", || async {
        r.queue.promote(10, None, true).await.unwrap().moved
    })
    .await;
    assert_eq!(promoted, 1);
    assert_eq!(
        r.queue.promote(10, None, true).await.unwrap().until_due,
        None,
        "nothing is parked any more"
    );
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].score, fifo_score(&held.envelope));
    let env = Envelope::decode(&pending[0].member).unwrap();
    assert_eq!(env.internal.retry_count, 1);
    assert_eq!(
        env.internal.request_token, sub.request_token,
        "same generation"
    );
    assert_eq!(
        env.request.payload.get(),
        held.envelope.request.payload.get()
    );
    // A parked retry keeps its generation's claim key, so its deliveries count carries on.
    let again = claim_head(&r.queue, 1).await.remove(0);
    assert_eq!(again.fence.key, held.fence.key);
}

/// Promote also drains the Go processor's shared retry set, but only this queue's entries.
#[tokio::test]
async fn promote_moves_due_entries_out_of_the_go_retry_set() {
    let mut r = rig(30_000, 5).await;
    let deadline = unix_ms() / 1000 + 60;
    let ours = format!(
        r#"{{"internal":{{"request_queue_name":"q","retry_count":1}},"request_kind":"plain","data":{{"id":"g1","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let other = format!(
        r#"{{"internal":{{"request_queue_name":"other"}},"request_kind":"plain","data":{{"id":"g2","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let unnamed = format!(
        r#"{{"internal":{{}},"request_kind":"plain","data":{{"id":"g3","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let future = format!(
        r#"{{"internal":{{"request_queue_name":"q"}},"request_kind":"plain","data":{{"id":"g4","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let now = unix_ms() as f64 / 1000.0;
    for (m, due) in [
        (&ours, now - 1.0),
        (&other, now - 1.0),
        (&unnamed, now - 1.0),
        (&future, now + 60.0),
    ] {
        let _: () = r.con.zadd("retry-sortedset", m, due).await.unwrap();
    }
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved,
        1
    );
    let score: f64 = r.con.zscore(Q, &ours).await.unwrap();
    assert_eq!(score, deadline as f64);
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 3);
    // As the default queue it also takes members naming no queue.
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), true)
            .await
            .unwrap()
            .moved,
        1
    );
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 2);
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    // Another queue's entry is due and stays: the promoter looks again at the Go pace.
    let left = r
        .queue
        .promote(10, Some("retry-sortedset"), true)
        .await
        .unwrap();
    assert_eq!(left.until_due, Some(Duration::ZERO));
    let _: () = r.con.zrem("retry-sortedset", &other).await.unwrap();
    let left = r
        .queue
        .promote(10, Some("retry-sortedset"), true)
        .await
        .unwrap();
    let until_due = left.until_due.unwrap();
    assert!(
        until_due > Duration::from_secs(50) && until_due <= Duration::from_secs(60),
        "the one entry left is due in a minute: {until_due:?}"
    );
}

/// Rule 8: release hands unstarted claims back at once, at their original score, without
/// counting a delivery.
#[tokio::test]
async fn release_returns_claims_at_once() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    r.producer.submit(request("b", 70)).await.unwrap();
    let held = claim_head(&r.queue, 10).await;
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    assert_eq!(r.queue.release(&fences).await.unwrap(), vec![true, true]);
    assert_eq!(
        r.queue.release(&fences).await.unwrap(),
        vec![false, false],
        "already released"
    );
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0].score, fifo_score(&held[0].envelope));
    assert_eq!(hlen(&mut r.con, "q:deliveries").await, 0);
}

/// promote (parked -> pending) and an operator's requeue (dead -> pending) into a pending key
/// of the wrong type are errors that move nothing: before, each removed the member from where
/// it was and then failed to add it, leaving it nowhere. With the key mended, both move it.
#[tokio::test]
async fn promote_and_requeue_into_a_pending_key_of_the_wrong_type_lose_nothing() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("p", 60)).await.unwrap();
    r.producer.submit(request("d", 60)).await.unwrap();
    let members: Vec<String> = r.con.zrange(Q, 0, -1).await.unwrap();
    let _: () = r.con.del(Q).await.unwrap();
    let (parked, dead): (Vec<&String>, Vec<&String>) =
        members.iter().partition(|m| m.contains("\"p\""));
    let (parked, dead) = (parked[0].clone(), dead[0].clone());
    let now = unix_ms() as f64 / 1000.0;
    let _: () = r.con.zadd("q:parked", &parked, now - 1.0).await.unwrap();
    let mut record = DeadRecord::new(Q, "poison", dead.as_bytes());
    record.id = "d".to_owned();
    record.request_token = Envelope::decode(dead.as_bytes())
        .unwrap()
        .internal
        .request_token;
    let _: () = r.con.lpush("q:dead", record.to_json()).await.unwrap();
    let dead_letters = dead_letters::DeadLetters::new(r.con.clone(), Q);
    let listed = dead_letters.list().await.unwrap();
    assert_eq!(listed.len(), 1);

    let _: () = r.con.set(Q, "x").await.unwrap();
    for _ in 0..2 {
        let promoted = r.queue.promote(10, None, false).await;
        assert!(
            matches!(&promoted, Err(e) if e.to_string().contains("WRONGTYPE")),
            "{promoted:?}"
        );
        let requeued = dead_letters.requeue(&listed[0], unix_ms()).await;
        assert!(
            matches!(&requeued, Err(e) if e.to_string().contains("WRONGTYPE")),
            "{requeued:?}"
        );
    }
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    let still_dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(still_dead, 1);

    let _: () = r.con.del(Q).await.unwrap();
    assert_eq!(r.queue.promote(10, None, false).await.unwrap().moved, 1);
    let requeued = dead_letters.requeue(&listed[0], unix_ms()).await;
    assert!(matches!(requeued, Ok(Ok(_))), "{requeued:?}");
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
}

/// Due entries of other queues ahead of this queue's in the Go retry set are passed over call
/// by call: each promote goes on scanning where the last one stopped, so this queue's entries
/// behind a hundred of another queue's are moved within a few calls. Before, every call looked
/// at the same first page and never reached them.
#[tokio::test]
async fn promote_scans_past_other_queues_go_retries() {
    let mut r = rig(30_000, 5).await;
    let now = unix_ms() as f64 / 1000.0;
    let entry = |queue: &str, id: &str| {
        format!(
            r#"{{"internal":{{"request_queue_name":"{queue}"}},"request_kind":"plain","data":{{"id":"{id}","deadline":{},"payload":{{}}}}}}"#,
            unix_ms() / 1000 + 60
        )
    };
    for i in 0..100 {
        let _: () = r
            .con
            .zadd(
                "retry-sortedset",
                entry("other", &format!("o{i}")),
                now - 100.0 + f64::from(i) / 1000.0,
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        let _: () = r
            .con
            .zadd("retry-sortedset", entry(Q, &format!("mine{i}")), now - 1.0)
            .await
            .unwrap();
    }
    let mut moved = 0;
    for _ in 0..4 {
        moved += r
            .queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved;
    }
    assert_eq!(moved, 3);
    assert_eq!(zcard(&mut r.con, Q).await, 3);
    assert_eq!(
        zcard(&mut r.con, "retry-sortedset").await,
        100,
        "others' stay"
    );
}

/// With Redis out of memory, the moves that hand work back keep working, as `renew` does: a due
/// retry is promoted and an expired claim reclaimed (each removes before it adds, and Redis lets
/// a script's writes through once its first write was a removal), and then claimed, acked and
/// parked. Before, promote's first write was its `ZADD` and reclaim's its `HINCRBY`, both
/// refused, so parked retries and a dead instance's claims waited for memory.
#[tokio::test]
async fn promote_and_reclaim_work_while_redis_is_out_of_memory() {
    let mut r = rig(200, 5).await;
    let held = submit_and_claim(&r, &["parked", "expired"]).await;
    assert!(r
        .queue
        .park(
            &held[0].fence,
            &held[0].envelope,
            Duration::from_millis(100)
        )
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    out_of_memory(&mut r.con).await;
    assert_eq!(r.queue.promote(10, None, true).await.unwrap().moved, 1);
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 2, "both are pending again");
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
    // And the rest of a request's way: claimed again, one acked, one parked.
    let again = claim_head(&r.queue, 10).await;
    assert_eq!(again.len(), 2);
    let done = ResultMessage::http(&again[0].envelope.request.id, 200, b"{}");
    let finished = r
        .queue
        .finish(&[ack(&again[0], &done), park_of(&again[1])])
        .await
        .unwrap();
    assert_eq!(finished, [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
}
