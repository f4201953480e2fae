//! Claims and their fences: a claim is read for its owner only, a stale owner moves nothing,
//! renewals extend leases by Redis time, generations of a reused id stay apart, lost replies are
//! retried safely, scripts survive a flush.

use super::*;

/// `claimed` reads what a claim holds for its owner only: a stale token reads nothing, and
/// after the ack nobody does. An ack turned into a bury of that member (what the outbox does
/// with a refused result) dead-letters it with the result in its record and publishes nothing.
#[tokio::test]
async fn claimed_reads_the_member_for_its_owner_only() {
    let r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let held = claim_head(&r.queue, 10).await.remove(0);
    let Some((member, deliveries)) = r.queue.claimed(&held.fence).await.unwrap() else {
        panic!("the owner reads nothing");
    };
    assert_eq!(Envelope::decode(&member).unwrap().request.id, "a");
    assert_eq!(deliveries, 0);
    let stale = Fence {
        key: held.fence.key.clone(),
        token: "not-the-owner".to_owned(),
    };
    assert!(r.queue.claimed(&stale).await.unwrap().is_none());

    let acked = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    let Some(bury) = acked.bury_unpublished(Q, &member, deliveries, "NOPERM") else {
        panic!("an ack has a bury instead");
    };
    let mut con = r.con.clone();
    assert_eq!(
        r.queue.finish(&[bury]).await.unwrap(),
        vec![Finished::Published]
    );
    assert!(results(&mut con).await.is_empty());
    let records: Vec<String> = con.lrange("q:dead", 0, -1).await.unwrap();
    let record: DeadRecord = serde_json::from_str(&records[0]).unwrap();
    assert_eq!(record.id, "a");
    assert!(record.reason.contains("NOPERM"), "{}", record.reason);
    let kept: ResultMessage = serde_json::from_str(&record.result).unwrap();
    assert_eq!((kept.id.as_str(), kept.status_code), ("a", 200));
    assert!(r.queue.claimed(&held.fence).await.unwrap().is_none());
}

/// Which failures mean Redis was lost, so that owners could not renew either (the reclaimer
/// then holds back a lease): an unreachable server is; a missing script (reloaded by the next
/// call) and a script error (a refusal of this caller alone) are not.
#[tokio::test]
async fn lost_redis_is_an_outage_not_a_refusal() {
    let mut r = rig(30_000, 5).await;
    let con = r.con.clone();
    let error_of = |command: &str, arg: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(arg).arg(0);
        let mut con = con.clone();
        async move { cmd.query_async::<()>(&mut con).await.unwrap_err() }
    };
    let noscript = error_of("EVALSHA", "0000000000000000000000000000000000000000").await;
    assert_eq!(noscript.code(), Some("NOSCRIPT"));
    assert!(!QueueError::from(noscript).lost_redis());
    let script_error = error_of("EVAL", "return redis.call('no-such-command')").await;
    assert!(!QueueError::from(script_error).lost_redis());
    assert!(r.queue.ping().await.is_ok());

    r.server.kill();
    let down = r.queue.ping().await.unwrap_err();
    assert!(down.lost_redis(), "{down}");
}

/// A cluster's `MOVED` or `ASK` that reaches the caller (the slot map still changing after a
/// fail-over) is passing, not a refusal: a staged result met with one is pushed again later,
/// not set aside in the dead list without its result (found by `inferq-dev chaos --redis cluster`,
/// seed 11: 16 requests lost at a master's fail-over). A script error and `NOPERM` stay
/// refusals.
#[test]
fn a_redirect_is_passing_and_a_script_error_is_a_refusal() {
    let error = |reply: &str| match redis::parse_redis_value(reply.as_bytes()) {
        Ok(redis::Value::ServerError(e)) => redis::RedisError::from(e),
        other => panic!("{other:?}"),
    };
    for passing in [
        "-MOVED 15286 127.0.0.1:21793\r\n",
        "-ASK 15286 127.0.0.1:21793\r\n",
        "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        "-CLUSTERDOWN The cluster is down\r\n",
    ] {
        let e = error(passing);
        assert!(!moves::is_refusal(&e), "{passing}: {e:?}");
        assert!(QueueError::from(e).lost_redis(), "{passing}");
    }
    for refusal in [
        "-ERR Error running script (call to f_0): @user_script:1: Unknown Redis command\r\n",
        "-NOPERM this user has no permissions to run the 'lpush' command\r\n",
        "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    ] {
        assert!(moves::is_refusal(&error(refusal)), "{refusal}");
    }
}

/// Rule 1 (fencing): a stale owner's renew, ack, park and release change nothing.
#[tokio::test]
async fn stale_owner_moves_change_nothing() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let held = claim_head(&r.queue, 10).await.remove(0);
    let stale = Fence {
        key: held.fence.key.clone(),
        token: "not-the-owner".to_owned(),
    };
    assert_eq!(
        r.queue.renew(std::slice::from_ref(&stale)).await.unwrap(),
        vec![false]
    );
    let mut forged = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    if let Finish::Ack { fence, .. } = &mut forged {
        *fence = stale.clone();
    }
    assert_eq!(
        r.queue.finish(&[forged]).await.unwrap(),
        vec![Finished::NotYours]
    );
    assert!(!r
        .queue
        .park(&stale, &held.envelope, Duration::ZERO)
        .await
        .unwrap());
    assert_eq!(
        r.queue.release(std::slice::from_ref(&stale)).await.unwrap(),
        vec![false]
    );
    // Still held by the real owner, nothing published, nothing pending or parked.
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 1);
    let owner: String = r.con.hget("q:claim-owners", &held.fence.key).await.unwrap();
    assert_eq!(owner, held.fence.token);
    assert!(results(&mut r.con).await.is_empty());
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
    // The real owner's ack works once.
    let real = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    assert_eq!(
        r.queue.finish(&[real]).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
}

/// Rule 1 + 6: after a lease expires and another instance reclaims and claims the request, the
/// old owner (a zombie coming back) cannot renew or publish; exactly one result appears.
#[tokio::test]
async fn zombie_owner_cannot_publish_after_takeover() {
    let mut r = rig(300, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let zombie = claim_head(&r.queue, 1).await.remove(0);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let reclaimed = r.queue.reclaim(100).await.unwrap();
    assert_eq!(reclaimed.requeued, 1);
    let survivor = claim_head(&r.queue, 1).await.remove(0);
    assert_ne!(survivor.fence.token, zombie.fence.token);
    assert_eq!(
        r.queue
            .renew(std::slice::from_ref(&zombie.fence))
            .await
            .unwrap(),
        vec![false]
    );
    let late = ack(&zombie, &ResultMessage::http("a", 200, b"late"));
    assert_eq!(
        r.queue.finish(&[late]).await.unwrap(),
        vec![Finished::NotYours]
    );
    let good = ack(&survivor, &ResultMessage::http("a", 200, b"good"));
    assert_eq!(
        r.queue.finish(&[good]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].payload, "good");
}

/// Rule 3: renew extends the lease by Redis TIME, for all held claims in one call.
#[tokio::test]
async fn renew_extends_every_held_lease_by_redis_time() {
    // Seconds, so a stall after the last renewal cannot outlast the renewed lease.
    let lease_ms = 2_000;
    let mut r = rig(lease_ms, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 3);
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    let mut renewed = (0, 0);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let before = redis_now_ms(&mut r.con).await;
        assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; 3]);
        renewed = (before, redis_now_ms(&mut r.con).await);
    }
    // 2.4 s after claiming with a 2 s lease: renewals kept every claim alive.
    assert_eq!(r.queue.reclaim(100).await.unwrap().requeued, 0);
    // Each lease runs until the last renewal's Redis TIME plus the lease.
    let (before, after) = renewed;
    for fence in &fences {
        let expiry: f64 = r.con.zscore("q:claims-idx", &fence.key).await.unwrap();
        let expiry_ms = (expiry * 1000.0).round() as u64;
        assert!(
            (before + lease_ms..=after + lease_ms).contains(&expiry_ms),
            "expiry {expiry_ms} vs a renewal between {before} and {after}"
        );
    }
}

/// Rule 3 out of memory: Redis at `maxmemory` with noeviction refuses a script's first write
/// when that write may grow memory. A renewal grows nothing, so it still keeps every held lease
/// (before, its ZADD was refused with `OOM`: every lease ran out under its live owner, whose work
/// in flight was aborted and stranded in claimed until Redis had memory again).
#[tokio::test]
async fn renew_keeps_leases_while_redis_is_out_of_memory() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let held = claim_head(&r.queue, 10).await;
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    let before: f64 = r.con.zscore("q:claims-idx", &fences[0].key).await.unwrap();
    out_of_memory(&mut r.con).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; 2]);
    let after: f64 = r.con.zscore("q:claims-idx", &fences[0].key).await.unwrap();
    assert!(
        after > before,
        "the lease was extended: {before} -> {after}"
    );
    assert_eq!(r.con.zcard::<_, u64>("q:claims-idx").await.unwrap(), 2);
}

/// ID reuse: two live generations of one id never touch each other, and cancel and cleanup
/// only ever affect the generation whose token they carry.
#[tokio::test]
async fn reused_id_generations_are_independent() {
    let mut r = rig(30_000, 5).await;
    let first = r.producer.submit(request("dup", 60)).await.unwrap();
    let second = r.producer.submit(request("dup", 61)).await.unwrap();
    assert_ne!(first.request_token, second.request_token);
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 2);
    assert_ne!(held[0].fence.key, held[1].fence.key);
    // Cancel marks only the newest generation.
    assert_eq!(
        r.producer.cancel(&["dup".to_owned()]).await.unwrap(),
        vec![true]
    );
    let marker: String = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!(marker, second.request_token);
    // The old generation finishing does not clear the new one's state.
    let old = held
        .iter()
        .find(|h| h.envelope.internal.request_token == first.request_token)
        .unwrap();
    let new = held
        .iter()
        .find(|h| h.envelope.internal.request_token == second.request_token)
        .unwrap();
    r.queue
        .finish(&[ack(old, &ResultMessage::http("dup", 200, b"1"))])
        .await
        .unwrap();
    let active: String = r.con.get("request-active:dup").await.unwrap();
    assert_eq!(active, second.request_token);
    let marker: Option<String> = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!(marker.as_deref(), Some(second.request_token.as_str()));
    // The new generation is still held and publishes its own result; then its state is cleaned.
    assert_eq!(
        r.queue
            .renew(std::slice::from_ref(&new.fence))
            .await
            .unwrap(),
        vec![true]
    );
    r.queue
        .finish(&[ack(new, &ResultMessage::cancelled("dup"))])
        .await
        .unwrap();
    assert_eq!(results(&mut r.con).await.len(), 2);
    let active: Option<String> = r.con.get("request-active:dup").await.unwrap();
    let marker: Option<String> = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!((active, marker), (None, None));
}

/// Lost replies: a claim whose reply was lost is not claimed twice (a retry finds it gone and
/// the lost claim comes back by reclaim); an ack whose reply was lost, retried, publishes once.
#[tokio::test]
async fn lost_replies_are_retried_safely() {
    let mut r = rig(300, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    // The first claim ran but its caller never learned of it.
    let lost = claim_head(&r.queue, 1).await;
    assert_eq!(lost.len(), 1);
    drop(lost);
    assert!(
        claim_head(&r.queue, 1).await.is_empty(),
        "a claimed member must not be claimable"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    let held = claim_head(&r.queue, 1).await.remove(0);
    // The ack ran, its reply was lost, and the caller retries the same ack.
    let finish = ack(&held, &ResultMessage::http("a", 200, b"x"));
    assert_eq!(
        r.queue.finish(std::slice::from_ref(&finish)).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(
        r.queue.finish(&[finish]).await.unwrap(),
        vec![Finished::NotYours]
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// Earliest deadline first.
#[tokio::test]
async fn peek_and_claim_go_earliest_deadline_first() {
    let r = rig(30_000, 5).await;
    for (id, secs) in [("late", 300), ("soon", 10), ("mid", 100)] {
        r.producer.submit(request(id, secs)).await.unwrap();
    }
    let held = claim_head(&r.queue, 2).await;
    let ids: Vec<&str> = held
        .iter()
        .map(|h| h.envelope.request.id.as_str())
        .collect();
    assert_eq!(ids, ["soon", "mid"]);
}

/// Scripts survive SCRIPT FLUSH (between a claim and a batched finish) and a Redis restart.
#[tokio::test]
async fn scripts_survive_script_flush_and_restart() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r.con)
        .await
        .unwrap();
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 3);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r.con)
        .await
        .unwrap();
    let batch: Vec<Finish> = held[..2]
        .iter()
        .map(|h| ack(h, &ResultMessage::http(&h.envelope.request.id, 200, b"{}")))
        .collect();
    assert_eq!(
        r.queue.finish(&batch).await.unwrap(),
        vec![Finished::Published; 2]
    );
    // A kill -9 and restart: the AOF keeps the claim, the script cache is empty.
    r.server.kill();
    r.server.restart().unwrap();
    let mut renewed = None;
    for _ in 0..50 {
        match r.queue.renew(std::slice::from_ref(&held[2].fence)).await {
            Ok(v) => {
                renewed = Some(v);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(renewed, Some(vec![true]));
    let last = ack(&held[2], &ResultMessage::http("c", 200, b"{}"));
    assert_eq!(
        r.queue.finish(&[last]).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(results(&mut r.con).await.len(), 3);
}

/// A claim whose delivery count is not a number (written by hand or by another program) is
/// reclaimed counting it as 0: before, the count's HINCRBY failed after the lease entry was
/// removed, leaving a claim no reclaim would ever find again.
#[tokio::test]
async fn a_delivery_count_that_is_not_a_number_does_not_strand_the_claim() {
    let mut r = rig(200, 5).await;
    // Not numbers, and numbers Lua reads that no count can be (they would never reach the
    // limit, and the consumer reads counts as whole numbers).
    for (i, garbage) in ["x", "nan", "-inf", "-3"].into_iter().enumerate() {
        let id = format!("a{i}");
        let held = submit_and_claim(&r, &[&id]).await;
        let _: () = r
            .con
            .hset("q:deliveries", &held[0].fence.key, garbage)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let reclaimed = r.queue.reclaim(10).await.unwrap();
        assert_eq!(reclaimed.requeued, 1, "{garbage}: {reclaimed:?}");
        assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
        let count: Option<String> = r
            .con
            .hget("q:deliveries", &held[0].fence.key)
            .await
            .unwrap();
        assert_eq!(count.as_deref(), Some("1"), "{garbage}");
        let _: () = r.con.del(Q).await.unwrap();
    }
}

/// The claim checks cancel markers in the same step: a cancelled generation is claimed (so it
/// still gets its one record) and flagged; a marker of an older generation does not count.
#[tokio::test]
async fn claim_reports_cancelled_generations() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    assert_eq!(
        r.producer
            .cancel(&["a".to_owned(), "c".to_owned()])
            .await
            .unwrap(),
        vec![true, true]
    );
    let _: () = r
        .con
        .set("request-cancel:c", "an-older-token")
        .await
        .unwrap();
    let held = claim_head(&r.queue, 10).await;
    let mut flags: Vec<(String, bool)> = held
        .iter()
        .map(|h| (h.envelope.request.id.clone(), h.cancelled))
        .collect();
    flags.sort();
    assert_eq!(
        flags,
        vec![
            ("a".to_owned(), true),
            ("b".to_owned(), false),
            ("c".to_owned(), false)
        ]
    );
}
