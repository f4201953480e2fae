//! The redis-pubsub transport: published messages are admitted once, results reach subscribers or
//! are kept (the newest 100,000), and a refused publish or write moves nothing of its item.

use super::*;

/// channel -> pending: every instance admits what it received, and each message is queued
/// once, scored by its deadline (a message that is not a request at 0, for the consumer to
/// dead-letter); a message admitted, executed and finished is not queued again when a late
/// subscriber admits it. Markers outlive the deadline by the margin, no more.
#[tokio::test]
async fn admit_queues_each_published_message_once() {
    let mut r = rig(30_000, 5).await;
    let other = Queue::new(r.con.clone(), Q, *r.queue.settings());
    let (late, soon, bad) = (published("late", 60), published("soon", 30), b"xx".to_vec());
    let batch = vec![late.clone(), soon.clone(), bad.clone()];
    assert_eq!(r.queue.admit(&batch).await.unwrap(), 3);
    assert_eq!(other.admit(&batch).await.unwrap(), 0);
    let order: Vec<Vec<u8>> = r
        .queue
        .peek(10)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.member)
        .collect();
    assert_eq!(order, [bad.clone(), soon.clone(), late.clone()]);
    let ttl: i64 = r.con.ttl(r.queue.keys().seen(&late)).await.unwrap();
    assert!((655..=661).contains(&ttl), "{ttl}");
    let ttl: i64 = r.con.ttl(r.queue.keys().seen(&bad)).await.unwrap();
    assert!((595..=600).contains(&ttl), "{ttl}");

    let _: () = r.con.zrem(Q, &bad).await.unwrap();
    let held = claim_head(&r.queue, 1).await;
    assert_eq!(held[0].envelope.request.id, "soon");
    let done = ResultMessage::http("soon", 200, b"{}");
    r.queue.finish(&[ack(&held[0], &done)]).await.unwrap();
    assert_eq!(other.admit(&[soon]).await.unwrap(), 0);
    assert_eq!(zcard(&mut r.con, Q).await, 1, "only `late` is left");
}

/// With results published (redis-pubsub), an ack PUBLISHes its result on the channel of the
/// result list's name; one nobody is subscribed to hear is pushed onto that list instead, so
/// it is not lost. A dead-lettered message's result goes the same way.
#[tokio::test]
async fn published_results_reach_subscribers_or_are_kept() {
    let mut r = rig(30_000, 5).await;
    let queue = r.queue.clone().publishing_results();
    let held = submit_and_claim(&r, &["heard", "unheard"]).await;
    let mut sub = r.server.client().unwrap().get_async_pubsub().await.unwrap();
    sub.subscribe(RESULTS).await.unwrap();
    let heard = ResultMessage::http("heard", 200, b"{}");
    let got = queue.finish(&[ack(&held[0], &heard)]).await.unwrap();
    assert_eq!(got, [Finished::Published]);
    let msg = tokio::time::timeout(Duration::from_secs(5), sub.on_message().next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), heard.to_json());
    assert!(results(&mut r.con).await.is_empty());
    drop(sub);
    // The unsubscribed connection is gone once PUBSUB NUMSUB says so.
    let started = std::time::Instant::now();
    loop {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(RESULTS)
            .query_async::<Vec<(String, u64)>>(&mut r.con)
            .await
            .unwrap()
            .remove(0);
        if n == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unheard = ResultMessage::http("unheard", 200, b"{}");
    queue.finish(&[ack(&held[1], &unheard)]).await.unwrap();
    let kept = results(&mut r.con).await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].id, "unheard");

    let bad = br#"{"internal":{},"request_kind":"plain","data":{"id":"no-deadline"}}"#;
    let _: () = r.con.zadd(Q, &bad[..], 0).await.unwrap();
    let invalid = ResultMessage::http("no-deadline", 400, b"{}");
    let moved = queue
        .dead_letter(bad, "{}", Some((&route(RESULTS), &invalid)))
        .await
        .unwrap();
    assert_eq!(moved, SetAside::Moved);
    assert_eq!(results(&mut r.con).await.len(), 2, "kept beside `unheard`");
}

/// The list that keeps unheard published results holds the newest 100,000: a deployment whose
/// consumers never read it does not grow Redis without bound (Go keeps none).
#[tokio::test]
async fn unheard_results_keep_the_newest_hundred_thousand() {
    let mut r = rig(30_000, 5).await;
    let queue = r.queue.clone().publishing_results();
    let held = submit_and_claim(&r, &["newest"]).await;
    for chunk in 0..100 {
        let older: Vec<String> = (0..1000)
            .map(|i| format!("older-{}", chunk * 1000 + i))
            .collect();
        let _: () = r.con.lpush(RESULTS, older).await.unwrap();
    }
    let unheard = ResultMessage::http("newest", 200, b"{}");
    assert_eq!(
        queue.finish(&[ack(&held[0], &unheard)]).await.unwrap(),
        [Finished::Published]
    );
    let len: u64 = r.con.llen(RESULTS).await.unwrap();
    assert_eq!(len, 100_000);
    let newest: String = r.con.lindex(RESULTS, 0).await.unwrap();
    assert_eq!(newest, unheard.to_json());
    let oldest: String = r.con.lindex(RESULTS, -1).await.unwrap();
    assert_eq!(oldest, "older-1", "the oldest one was dropped");
}

/// Under an ACL rule written before the unheard-results trim (everything but `LTRIM`), a finish
/// that keeps an unheard result still makes every other move of its batch: the trim is best
/// effort, and a park in the same call is not lost.
#[tokio::test]
async fn a_rule_without_ltrim_loses_no_move() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["unheard", "parked"]).await;
    let queue = publishing_as(&mut r, "old-rule", &["&*", "+@all", "-ltrim"]).await;
    let unheard = ResultMessage::http("unheard", 200, b"{}");
    let statuses = queue
        .finish(&[ack(&held[0], &unheard), park_of(&held[1])])
        .await
        .unwrap();
    assert_eq!(statuses, [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await, [unheard]);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1, "the park was made");
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// Under an ACL user that may write the result list but not PUBLISH on its channel (Redis checks
/// a channel's rights only when the PUBLISH runs), the refused ack moves nothing and says why,
/// so the outbox keeps it and `/readyz` names the refusal, while a park in the same call is
/// made. Before, the claims were dropped first and the script then failed on the PUBLISH: the
/// ack's request and the park were both lost. With the channel granted, the ack goes through.
#[tokio::test]
async fn a_refused_publish_moves_nothing_of_its_item() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["refused", "parked"]).await;
    let queue = publishing_as(&mut r, "no-channel", &["resetchannels", "&other", "+@all"]).await;
    let result = ResultMessage::http("refused", 200, b"{}");
    let statuses = queue
        .finish(&[ack(&held[0], &result), park_of(&held[1])])
        .await
        .unwrap();
    assert!(
        matches!(&statuses[0], Finished::Failed(e) if e.contains("can't publish") && e.contains(RESULTS)),
        "{statuses:?}"
    );
    assert_eq!(statuses[1], Finished::Published);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1, "the park was made");
    assert_eq!(
        queue.claimed(&held[0].fence).await.unwrap().map(|c| c.1),
        Some(0),
        "the refused ack's claim is still held by its owner"
    );
    assert!(results(&mut r.con).await.is_empty());

    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "no-channel", "&*"])
        .query_async(&mut r.con)
        .await
        .unwrap();
    let statuses = queue.finish(&[ack(&held[0], &result)]).await.unwrap();
    assert_eq!(statuses, [Finished::Published]);
    assert_eq!(results(&mut r.con).await, [result], "unheard, so kept");
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// While Redis refuses writes (here too few replicas; a failed background save or a read-only
/// replica alike), a pub/sub finish publishes nothing: the refusal comes at the script's first
/// write, which now precedes the first PUBLISH. Before, every try published its results and
/// then failed, and the outbox's retries published them again: a subscriber heard 14 messages
/// for 2 results. Once writes are taken again, each result is heard once.
#[tokio::test]
async fn a_refused_write_publishes_nothing() {
    use futures::StreamExt as _;
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b"]).await;
    let queue = Queue::new(r.con.clone(), Q, *r.queue.settings()).publishing_results();
    let mut sub = redis::Client::open(r.server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    sub.subscribe(RESULTS).await.unwrap();
    let batch = [
        ack(&held[0], &ResultMessage::http("a", 200, b"{}")),
        ack(&held[1], &ResultMessage::http("b", 200, b"{}")),
    ];
    let _: () = config_set(&mut r.con, "min-replicas-to-write", 1)
        .await
        .unwrap();
    for _ in 0..3 {
        let statuses = queue.finish(&batch).await.unwrap();
        assert!(
            statuses
                .iter()
                .all(|s| matches!(s, Finished::Failed(e) if e.contains("NOREPLICAS"))),
            "{statuses:?}"
        );
    }
    let _: () = config_set(&mut r.con, "min-replicas-to-write", 0)
        .await
        .unwrap();
    assert_eq!(
        queue.finish(&batch).await.unwrap(),
        [Finished::Published, Finished::Published]
    );
    let mut heard = Vec::new();
    let mut messages = sub.on_message();
    while let Ok(Some(msg)) =
        tokio::time::timeout(Duration::from_millis(500), messages.next()).await
    {
        heard.push(msg.get_payload::<String>().unwrap());
    }
    assert_eq!(heard.len(), 2, "{heard:?}");
}
