//! Reclaim and the dead list: expired claims go back at their score, reclaim is bounded, the
//! delivery limit and a passed deadline end a request with one terminal record, malformed members
//! are dead-lettered with a reason.

use super::*;

/// Rule 6: an expired claim goes back to pending at its original score (also when that score
/// is not the deadline, as with hand-written members), counting a delivery.
#[tokio::test]
async fn reclaim_returns_expired_claims_at_their_original_score() {
    // Seconds, so the lease is still valid at the first reclaim however the test is scheduled.
    let mut r = rig(2_000, 5).await;
    let deadline = unix_ms() / 1000 + 60;
    let member = format!(
        r#"{{"request_kind":"redis","internal":{{}},"data":{{"id":"hand","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let _: () = r.con.zadd(Q, &member, 42).await.unwrap();
    let held = claim_head(&r.queue, 1).await;
    assert_eq!(held.len(), 1);
    assert_eq!(
        r.queue.reclaim(10).await.unwrap().requeued,
        0,
        "lease still valid"
    );
    let requeued = first_nonzero("the lease to expire", || async {
        r.queue.reclaim(10).await.unwrap().requeued
    })
    .await;
    assert_eq!(requeued, 1);
    let score: f64 = r.con.zscore(Q, &member).await.unwrap();
    assert_eq!(score, 42.0);
    let deliveries: u32 = r
        .con
        .hget("q:deliveries", &held[0].fence.key)
        .await
        .unwrap();
    assert_eq!(deliveries, 1);
    for key in ["q:claimed", "q:claim-owners", "q:claim-scores"] {
        assert_eq!(hlen(&mut r.con, key).await, 0, "{key}");
    }
    assert_eq!(zcard(&mut r.con, "q:claims-idx").await, 0);
}

/// Rule 6: reclaim works in bounded batches.
#[tokio::test]
async fn reclaim_is_bounded() {
    let mut r = rig(100, 5).await;
    for i in 0..7 {
        r.producer
            .submit(request(&format!("r{i}"), 60))
            .await
            .unwrap();
    }
    assert_eq!(claim_head(&r.queue, 10).await.len(), 7);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 3);
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 3);
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 7);
}

/// Rule 6: a request whose every delivery dies is dead-lettered at the delivery limit with a
/// terminal record, instead of crash-looping.
#[tokio::test]
async fn delivery_limit_dead_letters_with_a_terminal_record() {
    let mut r = rig(100, 2).await;
    r.producer.submit(request("poison", 60)).await.unwrap();
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        r.queue.reclaim(10).await.unwrap().requeued,
        1,
        "first expiry: redeliver"
    );
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 0);
    assert_eq!(reclaimed.taken_over.len(), 1);
    let taken = &reclaimed.taken_over[0];
    assert_eq!(taken.reason, Takeover::Deliveries);
    assert_eq!(taken.deliveries, 2);
    let env = taken.envelope.as_ref().unwrap();
    let mut record = DeadRecord::new(Q, "delivery limit reached", &taken.member);
    record.id = env.request.id.clone();
    record.deliveries = taken.deliveries;
    let result = inferq_client::wire::ResultMessage::error(
        "poison",
        inferq_client::wire::ErrorCode::DeadLettered,
        "dead-lettered after 2 deliveries",
    );
    let bury = Finish::Bury {
        fence: taken.fence.clone(),
        id: env.request.id.clone(),
        request_token: env.internal.request_token.clone(),
        result_list: RESULTS.to_owned(),
        result_ttl_s: 0,
        result: result.to_json(),
        record: record.to_json(),
    };
    assert_eq!(
        r.queue.finish(&[bury]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].error_code, "DEAD_LETTERED");
    let dead: Vec<String> = r.con.lrange("q:dead", 0, -1).await.unwrap();
    let dead: DeadRecord = serde_json::from_str(&dead[0]).unwrap();
    assert_eq!((dead.id.as_str(), dead.deliveries), ("poison", 2));
    assert_eq!(
        zcard(&mut r.con, Q).await + hlen(&mut r.con, "q:claimed").await,
        0
    );
    let deliveries: Option<u32> = r.con.hget("q:deliveries", &taken.fence.key).await.unwrap();
    assert_eq!(deliveries, None);
}

/// Rule 6: an expired claim whose deadline has passed is taken over to finish with
/// DEADLINE_EXCEEDED, not put back in the queue.
#[tokio::test]
async fn passed_deadline_is_taken_over_for_deadline_exceeded() {
    let mut r = rig(200, 5).await;
    r.producer.submit(request("late", 1)).await.unwrap();
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 0);
    let taken = &reclaimed.taken_over[0];
    assert_eq!(taken.reason, Takeover::Deadline);
    let env = taken.envelope.as_ref().unwrap();
    let finish = Finish::Ack {
        fence: taken.fence.clone(),
        id: env.request.id.clone(),
        request_token: env.internal.request_token.clone(),
        result_list: RESULTS.to_owned(),
        result_ttl_s: 0,
        result: ResultMessage::deadline_exceeded("late").to_json(),
        payload_ref: env.internal.payload_ref.clone(),
    };
    assert_eq!(
        r.queue.finish(&[finish]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].error_code, "DEADLINE_EXCEEDED");
    assert_eq!(zcard(&mut r.con, Q).await, 0);
}

/// Rule 10: malformed members are dead-lettered with a reason, with INVALID_REQUEST when an
/// id can be read, and never block or vanish.
#[tokio::test]
async fn malformed_members_are_dead_lettered_with_a_reason() {
    let mut r = rig(30_000, 5).await;
    let bad = [
        ("not json at all".to_owned(), None),
        (
            r#"{"request_kind":"plain","data":{"id":"noDeadline"}}"#.to_owned(),
            Some("noDeadline"),
        ),
        (
            r#"{"request_kind":"plain","data":{"deadline":5}}"#.to_owned(),
            None,
        ),
    ];
    for (i, (member, _)) in bad.iter().enumerate() {
        let _: () = r.con.zadd(Q, member, i).await.unwrap();
    }
    let results_route = route(RESULTS);
    for p in r.queue.peek(10).await.unwrap() {
        let err = Envelope::decode(&p.member).unwrap_err();
        let record = DeadRecord::new(Q, &err.to_string(), &p.member);
        let salvaged = Envelope::salvage_id(&p.member);
        let result = salvaged.as_ref().map(|(id, _)| {
            ResultMessage::error(
                id,
                inferq_client::wire::ErrorCode::InvalidRequest,
                &format!("Failed: {err}"),
            )
        });
        let moved = r
            .queue
            .dead_letter(
                &p.member,
                &record.to_json(),
                result.as_ref().map(|m| (&results_route, m)),
            )
            .await
            .unwrap();
        assert_eq!(moved, SetAside::Moved);
    }
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    let dead: Vec<String> = r.con.lrange("q:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 3);
    let reasons: Vec<String> = dead
        .iter()
        .map(|d| serde_json::from_str::<DeadRecord>(d).unwrap().reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("not valid JSON")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("deadline")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("no id")), "{reasons:?}");
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].id.as_str(), all[0].error_code.as_str()),
        ("noDeadline", "INVALID_REQUEST")
    );
    // Dead-lettering a member another instance already moved changes nothing.
    assert_eq!(
        r.queue
            .dead_letter(b"not json at all", "{}", None)
            .await
            .unwrap(),
        SetAside::Gone
    );
}

/// A member naming a result list that holds another type than a list: the dead-lettering
/// moves nothing and says so (Redis would not undo the member's removal when the push fails),
/// so the caller can set it aside without its result.
#[tokio::test]
async fn dead_letter_to_a_result_list_of_another_type_moves_nothing() {
    let mut r = rig(30_000, 5).await;
    let member = r#"{"request_kind":"plain","data":{"id":"x","payload":{}}}"#;
    let _: () = r.con.zadd(Q, member, 1).await.unwrap();
    let _: () = r.con.set("a-string", "x").await.unwrap();
    let msg = ResultMessage::error(
        "x",
        inferq_client::wire::ErrorCode::InvalidRequest,
        "Failed: x.",
    );
    let outcome = r
        .queue
        .dead_letter(member.as_bytes(), "{}", Some((&route("a-string"), &msg)))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SetAside::ResultRefused(why) if why.contains("WRONGTYPE")),
        "{outcome:?}"
    );
    assert_eq!(zcard(&mut r.con, Q).await, 1, "still pending");
    let dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(dead, 0);
    assert_eq!(
        r.queue
            .dead_letter(member.as_bytes(), "{}", None)
            .await
            .unwrap(),
        SetAside::Moved
    );
    assert_eq!(zcard(&mut r.con, Q).await, 0);
}

/// A member whose deadline cjson reads as NaN (`"deadline":nan`, or the string "nan") is
/// placed at score 0, where the consumer dead-letters it with a reason, instead of vanishing:
/// promote removed it from the retry set and then failed to add it with a NaN score, and
/// reclaim did the same with a claim that has no recorded score (a Go instance's claim).
#[tokio::test]
async fn a_nan_deadline_is_not_lost_by_promote_or_reclaim() {
    let mut r = rig(1_000, 5).await;
    let parked = r#"{"internal":{"request_queue_name":"q"},"request_kind":"plain","data":{"id":"x","deadline":"nan","payload":{}}}"#;
    let now = unix_ms() as f64 / 1000.0;
    let _: () = r
        .con
        .zadd("retry-sortedset", parked, now - 1.0)
        .await
        .unwrap();
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved,
        1
    );
    let score: Option<f64> = r.con.zscore(Q, parked).await.unwrap();
    assert_eq!(score, Some(0.0));
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 0);

    // A Go instance's claim (no claim-scores entry) whose lease has expired.
    let claimed = r#"{"request_kind":"plain","data":{"id":"y","deadline":nan,"payload":{}}}"#;
    let ck = "y\0tok";
    let _: () = r.con.hset("q:claimed", ck, claimed).await.unwrap();
    let _: () = r.con.hset("q:claim-owners", ck, "go-owner").await.unwrap();
    let _: () = r.con.zadd("q:claims-idx", ck, now - 10.0).await.unwrap();
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 1, "{reclaimed:?}");
    let score: Option<f64> = r.con.zscore(Q, claimed).await.unwrap();
    assert_eq!(score, Some(0.0));
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}
