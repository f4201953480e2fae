//! Submitting: the Go keys are written, a reliable consumer hands back what it did not ack, and a
//! refused submission queues nothing.

use super::*;

/// The producer writes what the newest Go producer writes, in one script: INCR the FIFO counter,
/// DEL the cancel marker, SET the active marker PX, ZADD at the numbered score.
#[tokio::test]
async fn submit_writes_the_go_keys() {
    let mut r = rig(30_000, 5).await;
    let _: () = r.con.set("request-cancel:a", "stale").await.unwrap();
    let req = request("a", 60);
    let deadline = req.deadline;
    let sub = r.producer.submit(req).await.unwrap();
    let marker: Option<String> = r.con.get("request-cancel:a").await.unwrap();
    assert_eq!(marker, None, "resubmission clears a stale cancel marker");
    let active: String = r.con.get("request-active:a").await.unwrap();
    assert_eq!(active, sub.request_token);
    let ttl: i64 = r.con.pttl("request-active:a").await.unwrap();
    assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");
    let pending = r.queue.peek(1).await.unwrap();
    let env = Envelope::decode(&pending[0].member).unwrap();
    // Numbered as newer Go numbers: the first of its queue and deadline.
    assert_eq!(sub.enqueue_seq, 1);
    assert_eq!(env.internal.enqueue_seq, 1);
    assert_eq!(pending[0].score, deadline as f64 + 1.0 / 2097152.0);
    let counter: i64 = r
        .con
        .get(format!("request-seq:{Q}:{deadline}"))
        .await
        .unwrap();
    assert_eq!(counter, 1);
    assert_eq!(env.internal.request_queue_name, Q);
    assert_eq!(env.internal.result_queue_name, RESULTS);
    // Go's validation texts.
    let mut bad = request("", 60);
    assert_eq!(
        r.producer
            .submit(bad.clone())
            .await
            .unwrap_err()
            .to_string(),
        "request ID is required"
    );
    bad.id = "x".into();
    bad.deadline = 0;
    assert!(r
        .producer
        .submit(bad.clone())
        .await
        .unwrap_err()
        .to_string()
        .contains("positive Unix timestamp"));
    bad.deadline = 1;
    assert_eq!(
        r.producer.submit(bad).await.unwrap_err().to_string(),
        "deadline has already expired"
    );
    assert_eq!(
        r.producer
            .cancel(&["unknown".into(), String::new()])
            .await
            .unwrap(),
        vec![false, false]
    );
}

/// Reliable results: a consumer that dies after taking a result does not lose it.
#[tokio::test]
async fn reliable_consumer_hands_back_what_it_did_not_ack() {
    let mut r = rig(30_000, 5).await;
    for id in ["r1", "r2", "r3"] {
        let json = ResultMessage::http(id, 200, b"{}").to_json();
        let _: () = r.con.lpush(RESULTS, json).await.unwrap();
    }
    let mut first = r.producer.reliable("c1").await.unwrap();
    let a = first.take(Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!(a.result.as_ref().unwrap().id, "r1");
    first.ack(&a).await.unwrap();
    let b = first.take(Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!(b.result.as_ref().unwrap().id, "r2");
    drop(first); // dies before storing r2
                 // Its name's lease lapses as a dead consumer's does (shortened here from 15 s).
    let _: () = r.con.pexpire("results:taken:c1:lease", 300).await.unwrap();
    let mut again = r.producer.reliable("c1").await.unwrap();
    assert_eq!(again.hand_back().await.unwrap(), 1);
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        while let Some(t) = again.take(Duration::from_millis(100)).await.unwrap() {
            again.ack(&t).await.unwrap();
            ids.push(t.result.unwrap().id);
        }
        ids
    };
    assert_eq!(ids, ["r2", "r3"]);
    let taken: u64 = r.con.llen("results:taken:c1").await.unwrap();
    assert_eq!(taken, 0);
    assert_eq!(
        r.producer
            .pop_result(Duration::from_millis(100))
            .await
            .unwrap(),
        None
    );
}

/// With Redis out of memory, a batch of submissions comes back with one refusal per request,
/// naming `OOM`, and none is queued; once memory is free, the same batch is queued whole, once.
/// Before, the first refusal failed the whole call: every line of the batch was "in doubt",
/// though Redis had refused each one, and a partly refused batch could not be told apart from a
/// partly queued one (submitting it again made second generations of the queued requests).
#[tokio::test]
async fn submissions_refused_for_memory_each_say_so_and_nothing_is_queued() {
    let mut r = rig(30_000, 5).await;
    out_of_memory(&mut r.con).await;
    let batch = || vec![request("a", 60), request("b", 60)];
    let outcomes = r.producer.submit_many(batch()).await.unwrap();
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        match outcome {
            Err(ProducerError::Redis(e)) => assert!(e.to_string().contains("OOM"), "{e}"),
            other => panic!("refused for memory: {other:?}"),
        }
    }
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    config_set(&mut r.con, "maxmemory", 0).await.unwrap();
    let outcomes = r.producer.submit_many(batch()).await.unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(zcard(&mut r.con, Q).await, 2);
}

/// A submission whose transaction Redis ran but whose `ZADD` it refused at run time (the queue
/// name holds another type, `--queue` naming a list by mistake, say) is not queued, and its
/// outcome says so with Redis's `WRONGTYPE`; it was counted as submitted, and `inferq submit`
/// exited 0 having queued nothing.
#[tokio::test]
async fn a_submission_whose_zadd_fails_in_its_transaction_is_refused() {
    let mut r = rig(30_000, 5).await;
    let _: () = r.con.rpush(Q, "not a sorted set").await.unwrap();
    let outcomes = r
        .producer
        .submit_many(vec![request("a", 60), request("b", 60)])
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        match outcome {
            Err(ProducerError::Redis(e)) => assert!(e.to_string().contains("WRONGTYPE"), "{e}"),
            other => panic!("refused by Redis: {other:?}"),
        }
    }
    let single = r.producer.submit(request("c", 60)).await;
    assert!(
        matches!(&single, Err(ProducerError::Redis(e)) if e.to_string().contains("WRONGTYPE")),
        "{single:?}"
    );
}
