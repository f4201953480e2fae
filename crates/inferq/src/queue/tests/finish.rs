//! Finishing: one call moves a mixed batch with each item fenced, at a constant number of commands;
//! a result list or queue key of the wrong type refuses only what it must; a delivered marker
//! outlives its staged result.

use super::*;

/// Rules 1, 4 and 7 in one call: a mixed batch of ack, bury, park and release moves each item
/// on its own fence; a stale token and a repeated claim key change nothing.
#[tokio::test]
async fn one_finish_call_moves_a_mixed_batch_each_item_fenced() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d", "e"]).await;
    let (a, b, c, d, e) = (&held[0], &held[1], &held[2], &held[3], &held[4]);
    let mut stale = ack(e, &ResultMessage::http("e", 200, b"{}"));
    if let Finish::Ack { fence, .. } = &mut stale {
        fence.token = "not-the-owner".to_owned();
    }
    let batch = vec![
        ack(a, &ResultMessage::http("a", 200, b"{}")),
        Finish::Bury {
            fence: b.fence.clone(),
            id: "b".to_owned(),
            request_token: b.envelope.internal.request_token.clone(),
            result_list: RESULTS.to_owned(),
            result_ttl_s: 0,
            result: ResultMessage::http("b", 500, b"{}").to_json(),
            record: "{\"id\":\"b\"}".to_owned(),
        },
        park_of(c),
        Finish::Release {
            fence: d.fence.clone(),
        },
        stale,
        ack(a, &ResultMessage::http("a", 200, b"again")),
    ];
    assert_eq!(
        r.queue.finish(&batch).await.unwrap(),
        vec![
            Finished::Published,
            Finished::Published,
            Finished::Published,
            Finished::Published,
            Finished::NotYours,
            Finished::NotYours,
        ]
    );
    let ids: Vec<String> = results(&mut r.con)
        .await
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(
        ids,
        vec!["b", "a"],
        "one record each, in batch order (newest first)"
    );
    let dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(dead, 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].score, fifo_score(&d.envelope));
    assert_eq!(
        hlen(&mut r.con, "q:claimed").await,
        1,
        "only e is still held"
    );
    assert_eq!(hlen(&mut r.con, "q:claim-owners").await, 1);
    assert_eq!(zcard(&mut r.con, "q:claims-idx").await, 1);
    // The acked and buried generations' producer keys are gone; the others' stay.
    for (id, left) in [("a", false), ("b", false), ("c", true), ("e", true)] {
        let active: Option<String> = r.con.get(format!("request-active:{id}")).await.unwrap();
        assert_eq!(active.is_some(), left, "request-active:{id}");
    }
}

/// An item whose result list holds another type than a list is refused alone, its claim kept;
/// the rest of the batch moves. Before, the claims of the whole batch were dropped first and
/// the failing push ended the script: every item of the batch was lost.
#[tokio::test]
async fn a_result_list_of_another_type_refuses_only_its_item() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d"]).await;
    let (a, b, c, d) = (&held[0], &held[1], &held[2], &held[3]);
    let _: () = r.con.set("not-a-list", "x").await.unwrap();
    let mut to_string = ack(b, &ResultMessage::http("b", 200, b"{}"));
    if let Finish::Ack { result_list, .. } = &mut to_string {
        *result_list = "not-a-list".to_owned();
    }
    let batch = vec![
        ack(a, &ResultMessage::http("a", 200, b"{}")),
        to_string,
        park_of(c),
        Finish::Release {
            fence: d.fence.clone(),
        },
    ];
    let statuses = r.queue.finish(&batch).await.unwrap();
    assert_eq!(statuses[0], Finished::Published);
    assert!(
        matches!(&statuses[1], Finished::Failed(e) if e.contains("not-a-list")),
        "{statuses:?}"
    );
    assert_eq!(statuses[2..], [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 1);
    assert_eq!(
        r.queue.claimed(&b.fence).await.unwrap().map(|c| c.1),
        Some(0),
        "b is still held by its owner"
    );
}

/// One of the queue's own keys holding the wrong type: a call that writes it is an error
/// before anything is written. The batch is then tried item by item: the ack goes through,
/// the park is refused and its claim is still held (before, its claim was dropped and the
/// failing ZADD left it nowhere).
#[tokio::test]
async fn a_queue_key_of_the_wrong_type_moves_nothing() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "c"]).await;
    let (a, c) = (&held[0], &held[1]);
    let _: () = r.con.set("q:parked", "x").await.unwrap();
    let batch = vec![ack(a, &ResultMessage::http("a", 200, b"{}")), park_of(c)];
    let statuses = r.queue.finish(&batch).await.unwrap();
    assert_eq!(statuses[0], Finished::Published);
    assert!(
        matches!(&statuses[1], Finished::Failed(e) if e.contains("q:parked")),
        "{statuses:?}"
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(
        r.queue.claimed(&c.fence).await.unwrap().map(|c| c.1),
        Some(0),
        "c is still held by its owner"
    );
}

/// Claiming, renewing and finishing a batch costs a constant number of Redis commands (scripts'
/// inner commands included): a batch of 200 costs what a batch of 20 does.
#[tokio::test]
async fn a_batch_costs_a_constant_number_of_commands() {
    let mut r = rig(30_000, 5).await;
    let mut costs = Vec::new();
    // The first round also loads the scripts (NOSCRIPT, SCRIPT LOAD): it is not compared.
    for n in [20usize, 20, 200] {
        let reqs: Vec<NewRequest> = (0..n).map(|i| request(&format!("r{n}-{i}"), 60)).collect();
        r.producer.submit_many(reqs).await.unwrap();
        let before = commands_so_far(&mut r.con).await;
        let held = claim_head(&r.queue, n).await;
        assert_eq!(held.len(), n);
        let claimed = commands_so_far(&mut r.con).await;
        let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
        assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; n]);
        let renewed = commands_so_far(&mut r.con).await;
        let batch: Vec<Finish> = held
            .iter()
            .map(|h| ack(h, &ResultMessage::http(&h.envelope.request.id, 200, b"{}")))
            .collect();
        assert_eq!(
            r.queue.finish(&batch).await.unwrap(),
            vec![Finished::Published; n]
        );
        let finished = commands_so_far(&mut r.con).await;
        costs.push((claimed - before, renewed - claimed, finished - renewed));
    }
    assert_eq!(results(&mut r.con).await.len(), 240);
    assert_eq!(
        costs[1], costs[2],
        "(claim, renew, finish) commands for 20 and for 200"
    );
    assert!(costs[2].0 + costs[2].2 < 40, "{costs:?}");
}

/// The list-side step of a finish across cluster slots (`deliverOnce-2.lua`, run here on one
/// server): a marker outlives its retention while the queue still has an older staged result,
/// so a result whose finisher died after pushing it is not pushed again by the upkeep that
/// comes back after the retention (before: pushed twice, found by the model check); it goes
/// once nothing older is staged; and a caller whose read of the staged state is older than half
/// the retention is refused, writing nothing.
#[tokio::test]
async fn a_delivered_marker_outlives_its_staged_result_and_stale_readers() {
    use inferq_client::scripts::SCRIPTS;
    let mut r = rig(1_000, 5).await;
    let markers = inferq_client::keys::delivered_key(RESULTS, Q);
    let now_ms = |con: &mut redis::aio::ConnectionManager| {
        let mut con = con.clone();
        async move {
            let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
            s * 1000 + us / 1000
        }
    };
    // Retention 1 s, no TTL; `read_at` and `oldest` as the caller read them.
    let deliver =
        |con: &redis::aio::ConnectionManager, read_at: u64, oldest: Option<u64>, ck: &str| {
            let mut con = con.clone();
            let cmd = SCRIPTS.deliver_once.cmd(
                &[RESULTS, markers.as_str()],
                &[
                    "1000".to_owned(),
                    "0".to_owned(),
                    read_at.to_string(),
                    oldest.map(|o| o.to_string()).unwrap_or_default(),
                    ck.to_owned(),
                    format!("result of {ck}"),
                ],
            );
            async move { SCRIPTS.deliver_once.run(&mut con, &cmd).await.unwrap() }
        };
    let staged_at = now_ms(&mut r.con).await;
    let first = deliver(&r.con, staged_at, Some(staged_at), "a\0t").await;
    assert_eq!(first, redis::Value::Array(vec![redis::Value::Int(1)]));
    // The finisher died before its unstage; upkeep comes back after the retention, the result
    // still staged (the oldest): not pushed again.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let read_at = now_ms(&mut r.con).await;
    let again = deliver(&r.con, read_at, Some(staged_at), "a\0t").await;
    assert_eq!(again, redis::Value::Array(vec![redis::Value::Int(0)]));
    assert_eq!(r.con.llen::<_, u64>(RESULTS).await.unwrap(), 1);
    // Unstaged (nothing older staged): the next push of the queue trims the old marker.
    let read_at = now_ms(&mut r.con).await;
    let other = deliver(&r.con, read_at, None, "b\0t").await;
    assert_eq!(other, redis::Value::Array(vec![redis::Value::Int(1)]));
    let left: Option<f64> = r.con.zscore(&markers, "a\0t").await.unwrap();
    assert_eq!(left, None, "the old marker was trimmed");
    // A reader that stalled longer than half the retention is refused.
    let stale = deliver(&r.con, read_at - 600, None, "c\0t").await;
    assert_eq!(stale, redis::Value::BulkString(b"stale".to_vec()));
    assert_eq!(r.con.llen::<_, u64>(RESULTS).await.unwrap(), 2);
}
