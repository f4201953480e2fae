//! Newer Go's payload keys and FIFO scores (go-newer §1, §2), against real Redis and the real
//! `inferq` binary. The members, payload keys, counters and scores here are written by hand,
//! byte for byte as the newest Go producer writes them, so they test inferq against Go's format
//! rather than against inferq's own producer; the last tests check that inferq's producer
//! writes the same.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

use common::go::{GoRequest, Q, RESULTS};

fn body_of(id: &str) -> String {
    // Spacing and a big integer serde would not write: the bytes must arrive as stored.
    format!(r#"{{"model":"m", "prompt":"summarise {id}","n":12345678901234567890}}"#)
}

fn now_s() -> i64 {
    inferq_client::producer::unix_ms() / 1000
}

async fn exists(con: &mut redis::aio::ConnectionManager, key: &str) -> bool {
    con.exists(key).await.unwrap()
}

/// Thirty Go members with payload keys are sent their stored bodies byte for byte (the v0.9
/// behaviour sent `null` for all 30), with one read of Redis per poll; a missing key and a body
/// that is not an object end as `PAYLOAD_UNAVAILABLE` without a gateway call; acks delete the
/// keys; a retry keeps its key and parks only the envelope, with `dispatch_epoch` and
/// `enqueue_seq` carried through untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn go_payload_key_members_are_sent_their_stored_bodies() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "go-retried",
        vec![
            Reply::status(503, "busy").header("retry-after", "1"),
            Reply::ok(r#"{"ok":true}"#),
        ],
    );
    let mut con = con(&redis).await;
    let deadline = now_s() + 300;
    let mut reqs: Vec<GoRequest> = (0..30)
        .map(|i| {
            GoRequest::new(
                &format!("go-{i}"),
                deadline,
                i + 1,
                &body_of(&format!("go-{i}")),
            )
        })
        .collect();
    let mut retried = GoRequest::new("go-retried", deadline, 31, &body_of("go-retried"));
    retried.extra_internal = r#","dispatch_epoch":7"#.to_owned();
    let retried_key = retried.payload_key();
    reqs.push(retried);
    let missing = GoRequest::new("go-missing", deadline, 32, &body_of("go-missing"));
    let not_object = GoRequest::new("go-array", deadline, 33, "[1,2]");
    for r in reqs.iter().chain([&missing, &not_object]) {
        r.enqueue(&mut con).await;
    }
    let _: () = con.del(missing.payload_key()).await.unwrap();
    let opts = ProcessorOpts {
        batch_size: 40,
        concurrency: 40,
        ..ProcessorOpts::default()
    };
    let reads = ClientCommands::start(redis.port()).await;
    let _p = Processor::start(&redis, &gw, &opts).await;
    // The retry parks the envelope alone, its key kept.
    let started = Instant::now();
    let parked = loop {
        let parked: Vec<String> = con.zrange(format!("{Q}:parked"), 0, -1).await.unwrap();
        if let Some(m) = parked.first() {
            break m.clone();
        }
        assert!(started.elapsed() < Duration::from_secs(10), "never parked");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let env: serde_json::Value = serde_json::from_str(&parked).unwrap();
    assert_eq!(env["data"]["payload"], serde_json::Value::Null, "{parked}");
    assert!(
        !parked.contains("summarise"),
        "the body was parked: {parked}"
    );
    assert_eq!(
        env["internal"]["payload_ref"],
        retried_key.clone(),
        "{parked}"
    );
    assert_eq!(env["internal"]["dispatch_epoch"], 7, "{parked}");
    assert_eq!(env["internal"]["enqueue_seq"], 31, "{parked}");
    assert!(
        exists(&mut con, &retried_key.clone()).await,
        "a retry must keep its key"
    );

    let raw = wait_results_in(&mut con, RESULTS, 33, Duration::from_secs(30)).await;
    assert_eq!(raw.len(), 33, "{raw:?}");
    let results: Vec<inferq_client::wire::ResultMessage> = raw
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect();
    for r in &reqs {
        let got = results.iter().find(|m| m.id == r.id).unwrap();
        assert_eq!(got.status_code, 200, "{got:?}");
        assert_eq!(got.request_token, r.token);
        let seen = gw.seen(&r.id);
        let last = seen.last().unwrap();
        assert_eq!(
            std::str::from_utf8(&last.body).unwrap(),
            r.body,
            "{} was not sent its stored body",
            r.id
        );
        assert!(
            !exists(&mut con, &r.payload_key()).await,
            "{}'s key outlived its ack",
            r.id
        );
    }
    for (r, why) in [
        (&missing, "request payload is missing"),
        (&not_object, "request payload could not be attached"),
    ] {
        let got = results.iter().find(|m| m.id == r.id).unwrap();
        assert_eq!(got.error_code, "PAYLOAD_UNAVAILABLE", "{got:?}");
        assert_eq!(got.error_message, why, "{got:?}");
        assert!(gw.seen(&r.id).is_empty(), "{} reached the gateway", r.id);
        assert!(!exists(&mut con, &r.payload_key()).await);
    }
    // One read per poll, not one per request: the first poll claims all 33 (the retry and a
    // poll or two that came as workers freed make the rest).
    let (mgets, gets) = (reads.count("mget"), reads.count("get"));
    assert!((1..=4).contains(&mgets), "{mgets} MGETs for 33 bodies");
    assert_eq!(gets, 0, "bodies read one by one");
}

/// Cancelled requests, and requests past their deadline, are finished without reading their
/// bodies; their keys still go with the ack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_and_late_requests_never_read_their_payload() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let deadline = now_s() + 300;
    let mut reqs: Vec<GoRequest> = (0..5)
        .map(|i| GoRequest::new(&format!("c-{i}"), deadline, i + 1, "{}"))
        .collect();
    for r in &reqs {
        r.enqueue(&mut con).await;
        // Go's cancel: the active token copied to the cancel marker.
        let _: () = con
            .set(format!("request-cancel:{}", r.id), &r.token)
            .await
            .unwrap();
    }
    // Two whose deadline passes before any processor looks.
    let soon = now_s() + 1;
    for i in 0..2 {
        let late = GoRequest::new(&format!("late-{i}"), soon, i + 1, "{}");
        late.enqueue(&mut con).await;
        reqs.push(late);
    }
    tokio::time::sleep(Duration::from_millis(
        u64::try_from((soon + 1) * 1000 - inferq_client::producer::unix_ms()).unwrap_or(0),
    ))
    .await;
    let reads = ClientCommands::start(redis.port()).await;
    let _p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let raw = wait_results_in(&mut con, RESULTS, 7, Duration::from_secs(15)).await;
    assert_eq!(raw.len(), 7);
    for r in &raw {
        let code = if r.contains(r#""id":"late-"#) {
            "DEADLINE_EXCEEDED"
        } else {
            "CANCELLED"
        };
        assert!(r.contains(&format!(r#""error_code":"{code}""#)), "{r}");
    }
    assert!(gw.executions().is_empty(), "a request reached the gateway");
    assert_eq!(reads.count("mget"), 0, "a body was read");
    assert_eq!(reads.count("get"), 0, "a body was read");
    for r in &reqs {
        assert!(!exists(&mut con, &r.payload_key()).await);
    }
}

/// Among equal deadlines, one worker serves Go's members in `enqueue_seq` order, whatever the
/// order of their bytes (which is how Redis breaks ties of equal scores).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_deadlines_are_served_first_in_first_out() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let deadline = now_s() + 300;
    // Ids whose bytes sort against the submission order: z-20 first, a-01 last.
    let reqs: Vec<GoRequest> = (1..=20)
        .map(|seq| {
            let letter = (b'z' - seq as u8) as char;
            let mut r = GoRequest::new(&format!("{letter}-{seq:02}"), deadline, seq, "{}");
            r.apart = seq % 2 == 0;
            r
        })
        .collect();
    for r in &reqs {
        r.enqueue(&mut con).await;
    }
    let opts = ProcessorOpts {
        concurrency: 1,
        batch_size: 1,
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gw, &opts).await;
    gw.wait_executions(20, Duration::from_secs(20)).await;
    let submitted: Vec<String> = reqs.iter().map(|r| r.id.clone()).collect();
    assert_eq!(
        gw.first_served(&submitted),
        submitted,
        "served out of submission order"
    );
}

/// inferq's producer numbers requests as Go's does: `request-seq:<queue>:<deadline>` counted up
/// inside the submit script and expiring an hour after the deadline, `enqueue_seq` in the
/// member, the score `deadline + seq / 2^21`; with payload keys the body goes to its key (TTL
/// ten minutes past the deadline) and the member holds `payload_ref` and a `null` payload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inferq_submit_numbers_requests_and_stores_bodies_apart() {
    let redis = RedisServer::start().unwrap();
    let mut con = con(&redis).await;
    let deadline = now_s() + 600;
    let small = r#"{"model":"m","prompt":"hi"}"#;
    let large = format!(r#"{{"model":"m","prompt":"{}"}}"#, "x".repeat(300));
    let lines = [("s-1", small), ("l-2", large.as_str()), ("s-3", small)]
        .iter()
        .map(|(id, body)| format!(r#"{{"id":"{id}","deadline":{deadline},"payload":{body}}}"#))
        .collect::<Vec<_>>()
        .join("\n");
    let out = cli(
        &["submit", "--payload-keys-above", "100"],
        &[("REDIS_URL", &redis.url())],
        &lines,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let scored: Vec<(String, f64)> = con.zrange_withscores(Q, 0, -1).await.unwrap();
    assert_eq!(scored.len(), 3);
    for (i, (member, score)) in scored.iter().enumerate() {
        let env: serde_json::Value = serde_json::from_str(member).unwrap();
        let seq = i as i64 + 1;
        assert_eq!(env["internal"]["enqueue_seq"], seq, "{member}");
        assert_eq!(*score, deadline as f64 + seq as f64 / 2097152.0, "{member}");
        let id = env["data"]["id"].as_str().unwrap();
        let token = env["internal"]["request_token"].as_str().unwrap();
        let key = format!("request-payload:{id}:{token}");
        if id == "l-2" {
            assert_eq!(env["internal"]["payload_ref"], key, "{member}");
            assert!(member.contains(r#""payload":null"#), "{member}");
            let stored: String = con.get(&key).await.unwrap();
            assert_eq!(stored, large);
            let ttl: i64 = con.pttl(&key).await.unwrap();
            let want = (deadline * 1000 - inferq_client::producer::unix_ms()) + 600_000;
            assert!(
                (want - 5_000..=want + 1_000).contains(&ttl),
                "payload TTL {ttl}, want ~{want}"
            );
        } else {
            assert!(env["internal"].get("payload_ref").is_none(), "{member}");
            assert!(!exists(&mut con, &key).await);
        }
    }
    let counter = format!("request-seq:{Q}:{deadline}");
    let n: i64 = con.get(&counter).await.unwrap();
    assert_eq!(n, 3);
    let expire_at: i64 = redis::cmd("EXPIRETIME")
        .arg(&counter)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(expire_at, deadline + 3600);
    // --payload-keys stores every body apart.
    let out = cli(
        &["submit", "--payload-keys"],
        &[("REDIS_URL", &redis.url())],
        &format!(r#"{{"id":"all","deadline":{deadline},"payload":{small}}}"#),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let members: Vec<String> = con.zrange(Q, 0, -1).await.unwrap();
    let all = members
        .iter()
        .find(|m| m.contains(r#""id":"all""#))
        .unwrap();
    assert!(
        all.contains(r#""payload_ref":"request-payload:all:"#),
        "{all}"
    );
    assert!(all.contains(r#""enqueue_seq":4"#), "{all}");

    // status --payloads counts them, and tells an ended generation's body from a live one's.
    let payloads = |redis: &RedisServer| {
        let out = cli(
            &["status", "--payloads", "--json"],
            &[("REDIS_URL", &redis.url())],
            "",
        );
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let line = text.lines().find(|l| l.contains("payload_keys")).unwrap();
        serde_json::from_str::<serde_json::Value>(line).unwrap()
    };
    let counted = payloads(&redis);
    assert_eq!(counted["payload_keys"], 2, "{counted}");
    assert_eq!(
        counted["payload_bytes"],
        (large.len() + small.len()) as u64,
        "{counted}"
    );
    assert_eq!(counted["payload_keys_ended"], 0, "{counted}");
    let _: () = con.del("request-active:all").await.unwrap();
    assert_eq!(payloads(&redis)["payload_keys_ended"], 1);
}

/// The pending score of the member of `id` (whatever its token).
async fn score_of_id(con: &mut redis::aio::ConnectionManager, id: &str) -> Option<f64> {
    let scored: Vec<(String, f64)> = con.zrange_withscores(Q, 0, -1).await.unwrap();
    scored
        .into_iter()
        .find(|(m, _)| m.contains(&format!(r#""id":"{id}""#)))
        .map(|(_, s)| s)
}

/// Claims the whole head of the queue.
async fn claim_all(queue: &inferq::queue::Queue) -> Vec<inferq::queue::Held> {
    let peeked = queue.peek(100).await.unwrap();
    let members = peeked
        .into_iter()
        .map(|p| {
            let env = inferq_client::wire::Envelope::decode(&p.member).unwrap();
            (p.member, env)
        })
        .collect();
    queue
        .claim(members)
        .await
        .unwrap()
        .into_iter()
        .map(|c| match c {
            inferq::queue::Claimed::Held(h) => *h,
            other => panic!("not claimed: {other:?}"),
        })
        .collect()
}

/// Every way back into pending puts a Go member at exactly the score Go gave it (its deadline
/// plus its `enqueue_seq` fraction): release, park then promote, reclaim of a claim Go made
/// (which keeps no score of its own), and a dead-letter requeue, which also refuses a member
/// whose body stored apart is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_reentry_restores_the_fifo_score() {
    use inferq::queue::dead::DeadRecord;
    use inferq::queue::dead_letters::{DeadLetters, Unrequeueable};
    use inferq::queue::Queue;
    use inferq_client::ClaimSettings;

    let redis = RedisServer::start().unwrap();
    let mut con = con(&redis).await;
    let settings = ClaimSettings {
        lease: Duration::from_millis(300),
        reclaim_interval: Duration::from_millis(300),
        max_deliveries: 10,
        replica_wait: None,
    };
    let queue = Queue::new(con.clone(), Q, settings);
    let deadline = now_s() + 300;
    let go = GoRequest::new("fifo", deadline, 1234, "{}");
    go.enqueue(&mut con).await;
    let want = Some(go.score());
    assert_ne!(
        go.score(),
        deadline as f64,
        "the fraction must show in the score"
    );

    let held = claim_all(&queue).await;
    assert_eq!(
        queue.release(&[held[0].fence.clone()]).await.unwrap(),
        vec![true]
    );
    assert_eq!(score_of_id(&mut con, "fifo").await, want, "release");

    let held = claim_all(&queue).await;
    assert!(queue
        .park(&held[0].fence, &held[0].envelope, Duration::ZERO)
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(queue.promote(10, None, false).await.unwrap().moved, 1);
    assert_eq!(score_of_id(&mut con, "fifo").await, want, "promote");

    // A claim Go made: its three keys written by hand, the lease long gone.
    let member = go.member();
    let _: () = con.del(Q).await.unwrap();
    let ck = format!("fifo\0{}", go.token);
    let k = queue.keys();
    let _: () = con.hset(&k.claimed, &ck, &member).await.unwrap();
    let _: () = con.hset(&k.owners, &ck, "go-owner").await.unwrap();
    let _: () = con.zadd(&k.idx, &ck, now_s() - 10).await.unwrap();
    let reclaimed = queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 1, "{reclaimed:?}");
    assert_eq!(score_of_id(&mut con, "fifo").await, want, "reclaim");

    // A dead letter of it, requeued as a new generation at the same place.
    let _: () = con.del(Q).await.unwrap();
    let mut record = DeadRecord::new(Q, "poison", member.as_bytes());
    record.id = "fifo".into();
    record.request_token = go.token.clone();
    let _: () = con.lpush(&k.dead, record.to_json()).await.unwrap();
    let dead = DeadLetters::new(con.clone(), Q);
    let listed = dead.list().await.unwrap();
    let now_ms = inferq_client::producer::unix_ms();
    // Its body is gone: refused, and the record stays.
    let _: () = con.del(go.payload_key()).await.unwrap();
    let refused = dead.requeue(&listed[0], now_ms).await.unwrap();
    assert!(
        matches!(&refused, Err(Unrequeueable::PayloadGone(key)) if *key == go.payload_key()),
        "{refused:?}"
    );
    assert_eq!(dead.list().await.unwrap().len(), 1);
    // With its body back, requeued at its score, still naming its body.
    let _: () = con.set(go.payload_key(), "{}").await.unwrap();
    let requeued = dead.requeue(&listed[0], now_ms).await.unwrap().unwrap();
    assert_ne!(requeued.request_token, go.token);
    assert_eq!(score_of_id(&mut con, "fifo").await, want, "requeue");
    let members: Vec<String> = con.zrange(Q, 0, -1).await.unwrap();
    assert!(members[0].contains(&format!(r#""payload_ref":"{}""#, go.payload_key())));
}

/// On a Redis Cluster, where every payload key lives in a slot of its own: inferq's producer
/// writes the bodies apart and numbers the requests with the queue's tagged counter
/// (`request-seq:{<queue>}:<deadline>`); one processor worker serves equal deadlines in that
/// order, sends each its body, and deletes the keys after its acks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payload_keys_and_fifo_on_a_cluster() {
    use inferq_client::producer::{PayloadKeys, Producer};
    use inferq_testkit::cluster::RedisCluster;

    let cluster = RedisCluster::start().unwrap();
    let gw = Gateway::start().await;
    let target = cluster.target().unwrap();
    let producer = Producer::connect_target(&target, Q, RESULTS)
        .await
        .unwrap()
        .with_payload_keys(PayloadKeys::Always);
    let deadline = now_s() + 300;
    let ids: Vec<String> = (0..20)
        .map(|i| format!("{}-{i:02}", (b'z' - i) as char))
        .collect();
    let reqs = ids
        .iter()
        .map(|id| {
            let mut r = request(id, 0, &body_of(id));
            r.deadline = deadline;
            r
        })
        .collect();
    let mut tokens = Vec::new();
    for (i, outcome) in producer
        .submit_many(reqs)
        .await
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let s = outcome.unwrap();
        assert_eq!(s.enqueue_seq, i as i64 + 1);
        tokens.push(s.request_token);
    }
    let mut link = cluster.connection().await.unwrap();
    // status --payloads scans every primary.
    let addrs = cluster.addrs()[1..].join(",");
    let out = cli(
        &[
            "status",
            "--payloads",
            "--json",
            "--redis-url",
            cluster.seed_urls()[0].as_str(),
            "--redis-mode",
            "cluster",
            "--redis-addrs",
            addrs.as_str(),
        ],
        &[],
        "",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(r#"{"payload_keys":20,"#),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let counter: i64 = redis::cmd("GET")
        .arg(format!("request-seq:{{{Q}}}:{deadline}"))
        .query_async(&mut link)
        .await
        .unwrap();
    assert_eq!(counter, 20);
    let addrs: Vec<String> = cluster.addrs()[1..]
        .iter()
        .map(|a| format!("{a:?}"))
        .collect();
    let opts = ProcessorOpts {
        concurrency: 1,
        batch_size: 1,
        extra_transport_fields: format!(r#","mode":"cluster","addrs":[{}]"#, addrs.join(",")),
        ..ProcessorOpts::default()
    };
    let _p = Processor::start_at(&cluster.seed_urls()[0], &gw, &opts).await;
    gw.wait_executions(20, Duration::from_secs(30)).await;
    assert_eq!(gw.first_served(&ids), ids, "served out of submission order");
    for id in &ids {
        assert_eq!(
            std::str::from_utf8(&gw.seen(id)[0].body).unwrap(),
            body_of(id)
        );
    }
    let started = Instant::now();
    loop {
        let results: i64 = redis::cmd("LLEN")
            .arg(RESULTS)
            .query_async(&mut link)
            .await
            .unwrap();
        let mut left = 0;
        for (id, token) in ids.iter().zip(&tokens) {
            let there: bool = redis::cmd("EXISTS")
                .arg(format!("request-payload:{id}:{token}"))
                .query_async(&mut link)
                .await
                .unwrap();
            left += usize::from(there);
        }
        if results == 20 && left == 0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{results} results, {left} payload keys left"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
