//! Security end to end, with real processes: the least-privilege Redis ACL rules of README.md
//! (every script path run under them, `ACL LOG` empty), `rediss://` with a private CA and client
//! certificates, passwords kept out of every log line and error, the gateway TLS flags
//! against the simulator serving HTTPS (optionally requiring client certificates), and a private
//! CA trusted for the gateway and for `rediss://` because the system certificate store holds it
//! (`SSL_CERT_FILE`), without any TLS flag.
//!
//! Certificates are made per test with the `openssl` command line into a temporary directory.

use crate::common;
use crate::harness;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{cli, Gateway, Reply};
use harness::*;
use inferq_client::producer::Producer;
use inferq_client::wire::ResultMessage;
use inferq_sim::{Sim, SimConfig, SimTls};
use inferq_testkit::{free_port, RedisServer};
use redis::AsyncCommands;

/// What the tests here start from: the stand-in gateway, a Redis under README's ACL users (bind
/// it, as `_redis` where unused: dropping it stops the server), the admin's connection, and the
/// processor's and producer's URLs.
async fn rig() -> (
    Gateway,
    RedisServer,
    redis::aio::ConnectionManager,
    String,
    String,
) {
    let gw = Gateway::start().await;
    let (redis, admin) = acl_redis().await;
    let processor_url = url("inferq-processor", PROCESSOR_PW, redis.port());
    let producer_url = url("inferq-producer", PRODUCER_PW, redis.port());
    (gw, redis, admin, processor_url, producer_url)
}

// ---------------------------------------------------------------------------------------------
// 1. Least-privilege ACL

/// Under README's two ACL users (default user off): the CLI submits, the processor claims,
/// renews, acks, parks a 503 and promotes it back, stops a cancelled request, dead-letters
/// malformed members and reads a `redis` gate's budget through its own user; `results` reads in
/// both modes (plain, and durable under its older spelling `--consumer`). Nothing is refused along the way: Redis's ACL LOG stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_rules_cover_submit_processing_cancel_dead_letters_and_results() {
    let (gw, _redis, mut admin, processor_url, producer_url) = rig().await;
    gw.script("retry-me", vec![Reply::status(503, "busy"), Reply::ok(OK)]);
    gw.script(
        "cancel-me",
        vec![Reply::ok(OK).after(Duration::from_secs(60))],
    );
    let gate = format!(r#","gate_type":"redis","gate_params":{{"address":"{processor_url}"}}"#);
    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 30.0, 5, &gate), &[]);
    p.wait_ready().await;

    let env = [("REDIS_URL", producer_url.as_str())];
    // Bodies stored apart: the producer writes payload keys and FIFO counters, the processor
    // reads and deletes the keys.
    let out = cli(
        &["submit", "--payload-keys"],
        &env,
        &submit_lines(&["cli-1", "cli-2", "retry-me", "cancel-me"]),
    );
    assert!(out.status.success(), "{}", text(&out));
    gw.wait_seen("cancel-me", Duration::from_secs(15)).await;
    assert_eq!(gw.seen("cancel-me").len(), 1, "{}", p.log());
    let out = cli(&["cancel", "cancel-me"], &env, "");
    assert!(out.status.success(), "{}", text(&out));
    // Malformed members, as a foreign writer might leave them.
    let _: () = admin.zadd(Q, "not json at all", 1).await.unwrap();
    let _: () = admin
        .zadd(Q, r#"{"request_kind":"plain","data":{"id":"bad-1"}}"#, 2)
        .await
        .unwrap();

    let plain = cli(&["results", "-n", "2", "--timeout", "60s"], &env, "");
    assert!(plain.status.success(), "{}", text(&plain));
    let reliable = cli(
        &["results", "-n", "3", "--timeout", "60s", "--consumer", "c1"],
        &env,
        "",
    );
    assert!(reliable.status.success(), "{}", text(&reliable));
    let got: BTreeMap<String, ResultMessage> = parse_results(&plain)
        .into_iter()
        .chain(parse_results(&reliable))
        .map(|r| (r.id.clone(), r))
        .collect();
    let ids: Vec<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        ids,
        ["bad-1", "cancel-me", "cli-1", "cli-2", "retry-me"],
        "{got:?}"
    );
    for id in ["cli-1", "cli-2", "retry-me"] {
        assert_eq!(got[id].status_code, 200, "{id}: {:?}", got[id]);
    }
    assert_eq!(got["cancel-me"].error_code, "CANCELLED");
    assert!(!got["bad-1"].error_code.is_empty(), "{:?}", got["bad-1"]);
    assert_eq!(gw.seen("retry-me").len(), 2, "503, parked, promoted, 200");
    let dead: u64 = admin.llen(format!("{Q}:dead")).await.unwrap();
    assert_eq!(dead, 2, "both malformed members are dead-lettered");
    let acked: u64 = admin
        .zcard("result-list:result-ack-tombstones")
        .await
        .unwrap();
    assert_eq!(acked, 3, "the durable consumer acknowledged what it wrote");

    assert_eq!(acl_denials(&mut admin).await, Vec::<String>::new());
    let log = p.log();
    assert!(
        log.contains("inferq ready") && !log.contains("NOPERM"),
        "{log}"
    );
    assert!(
        !log.contains(PROCESSOR_PW),
        "the password leaked into the log:\n{log}"
    );
}

/// `inferq status` under README's operator advice: the processor user with `+zcount +hlen
/// +llen` added counts the queue with nothing refused; the processor user alone is refused and
/// the command says by what, exiting 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_runs_as_the_processor_user_with_the_readme_additions() {
    let (redis, mut admin) = acl_redis().await;
    let processor_url = url("inferq-processor", PROCESSOR_PW, redis.port());
    let _: () = admin.zadd(Q, "a member", 1).await.unwrap();
    let env = [("REDIS_URL", processor_url.as_str())];
    let status = || {
        cli(
            &["status", "--json", "--result-queue", "result-list"],
            &env,
            "",
        )
    };

    let refused = status();
    assert_eq!(refused.status.code(), Some(1), "{}", text(&refused));
    assert!(text(&refused).contains("NOPERM"), "{}", text(&refused));

    acl(
        &mut admin,
        &["SETUSER", "inferq-processor", "+zcount", "+hlen", "+llen"],
    )
    .await;
    acl(&mut admin, &["LOG", "RESET"]).await;
    let out = status();
    assert!(out.status.success(), "{}", text(&out));
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (line["pending"].as_u64(), line["overdue"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(acl_denials(&mut admin).await, Vec::<String>::new());
}

/// Under README's redis-pubsub processor user: requests published on the channel are admitted,
/// served (one after a 503, so parked and promoted), a message that is not a request is
/// dead-lettered, results are published on the result channel, and one published while nobody
/// listens is kept in the list of that name. Redis's ACL LOG stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_rule_of_the_pubsub_processor_covers_admit_serve_and_publish() {
    use futures::StreamExt;
    let (gw, redis, mut admin, _, _) = rig().await;
    gw.script("ps-retry", vec![Reply::status(503, "busy"), Reply::ok(OK)]);
    let processor_url = url("inferq-processor-pubsub", PROCESSOR_PW, redis.port());
    let config = format!(
        r#"{{"url":"{processor_url}","poll_interval_ms":50,"queues":[{{"queue_name":"request-queue","igw_base_url":"{}"}}]}}"#,
        gw.url()
    );
    let p = Proc::spawn_as("redis-pubsub", &config, &[]);
    p.wait_ready().await;
    let admin_url = url("admin", ADMIN_PW, redis.port());
    let mut sub = redis::Client::open(admin_url)
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    sub.subscribe("result-queue").await.unwrap();
    let now = inferq_client::producer::unix_ms() / 1000;
    let envelope = |id: &str| {
        format!(
            r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"{id}","created":{now},"deadline":{},"payload":{{}}}}}}"#,
            now + 60
        )
    };
    for message in [
        envelope("ps-ok"),
        envelope("ps-retry"),
        "not json".to_owned(),
    ] {
        let _: u64 = admin.publish("request-queue", message).await.unwrap();
    }
    let mut heard = BTreeMap::new();
    {
        let mut messages = sub.on_message();
        while heard.len() < 2 {
            let msg = tokio::time::timeout(Duration::from_secs(15), messages.next())
                .await
                .unwrap_or_else(|_| {
                    panic!(
                        "results not heard; log:
{}",
                        p.log()
                    )
                })
                .unwrap();
            let r: ResultMessage =
                serde_json::from_str(&msg.get_payload::<String>().unwrap()).unwrap();
            heard.insert(r.id.clone(), r);
        }
    }
    assert_eq!(heard["ps-ok"].status_code, 200);
    assert_eq!(heard["ps-retry"].status_code, 200);
    assert_eq!(gw.seen("ps-retry").len(), 2, "503, parked, promoted, 200");
    drop(sub);
    let started = Instant::now();
    loop {
        let subscribers: Vec<(String, u64)> = redis::cmd("PUBSUB")
            .arg(&["NUMSUB", "result-queue"])
            .query_async(&mut admin)
            .await
            .unwrap();
        if subscribers[0].1 == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _: u64 = admin
        .publish("request-queue", envelope("ps-unheard"))
        .await
        .unwrap();
    let started = Instant::now();
    let kept: Vec<String> = loop {
        let kept: Vec<String> = admin.lrange("result-queue", 0, -1).await.unwrap();
        if !kept.is_empty() || started.elapsed() > Duration::from_secs(15) {
            break kept;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(kept.len(), 1, "{}", p.log());
    assert!(kept[0].contains("ps-unheard"), "{kept:?}");
    let dead: u64 = admin.llen("request-queue:dead").await.unwrap();
    assert_eq!(
        dead, 1,
        "the message that is not a request is dead-lettered"
    );
    assert_eq!(acl_denials(&mut admin).await, Vec::<String>::new());
    assert!(!p.log().contains("NOPERM"), "{}", p.log());
}

/// Under the processor's ACL user: a SIGKILLed processor's claims are reclaimed and finished by
/// the next one, a request that kills every processor is buried at the delivery limit, and a
/// SIGTERM releases unfinished work to pending. ACL LOG stays empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_rules_cover_reclaim_bury_and_release() {
    let (gw, _redis, mut admin, processor_url, producer_url) = rig().await;
    let hang = Reply::ok(OK).after(Duration::from_secs(60));
    gw.script("requeue-me", vec![hang.clone(), Reply::ok(OK)]);
    gw.script("poison", vec![hang.clone()]);
    gw.script("release-me", vec![hang]);
    let producer = Producer::connect(&producer_url, Q, "result-list")
        .await
        .unwrap();
    // requeue-me's earlier deadline puts it first in line. After the first kill both requests
    // are one delivery from the limit, and a processor runs one such last-chance request at a
    // time per queue (so a crash cannot take a neighbour to the dead list with the poison).
    for (id, timeout_s) in [("requeue-me", 100), ("poison", 120)] {
        producer
            .submit(common::request(id, timeout_s, "{}"))
            .await
            .unwrap();
    }
    // A 2 s lease and a delivery limit of 2.
    let config = transport(&processor_url, &gw.url(), 2.0, 2, "");

    let mut first = Proc::spawn(&config, &[]);
    first.wait_ready().await;
    gw.wait_executions(2, Duration::from_secs(15)).await;
    first.kill();

    let mut second = Proc::spawn(&config, &[]);
    second.wait_ready().await;
    let done = wait_result(&mut admin, "requeue-me", Duration::from_secs(20)).await;
    assert_eq!(done.status_code, 200, "{done:?}");
    let started = Instant::now();
    while gw.seen("poison").len() < 2 && started.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(gw.seen("poison").len(), 2, "{}", second.log());
    second.kill();

    let mut third = Proc::spawn(&config, &[]);
    third.wait_ready().await;
    let buried = wait_result(&mut admin, "poison", Duration::from_secs(20)).await;
    assert_eq!(buried.error_code, "DEAD_LETTERED", "{buried:?}");
    let dead: u64 = admin.llen(format!("{Q}:dead")).await.unwrap();
    assert_eq!(dead, 1);

    producer
        .submit(common::request("release-me", 120, "{}"))
        .await
        .unwrap();
    gw.wait_seen("release-me", Duration::from_secs(15)).await;
    third.terminate();
    assert_eq!(
        third.wait_exit(Duration::from_secs(20)).await,
        Some(0),
        "{}",
        third.log()
    );
    let pending: Vec<String> = admin.zrange(Q, 0, -1).await.unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0].contains("release-me"), "{pending:?}");

    assert_eq!(acl_denials(&mut admin).await, Vec::<String>::new());
}

/// A processor user that may connect, PING and load scripts but not run them (README's rule
/// less `evalsha`): Redis answers PING, yet refuses every claim. `/readyz` says not ready and
/// names the queue and the refusal (a PING-only check, like Go's, would say ready); once the
/// command is granted the processor reports ready on its own and the request is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_not_ready_while_redis_refuses_the_queue() {
    let (gw, _redis, mut admin, processor_url, producer_url) = rig().await;
    acl(&mut admin, &["SETUSER", "inferq-processor", "-evalsha"]).await;
    let producer = Producer::connect(&producer_url, Q, "result-list")
        .await
        .unwrap();
    producer
        .submit(common::request("refused", 120, "{}"))
        .await
        .unwrap();

    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 30.0, 5, ""), &[]);
    let why = p.wait_not_ready_because().await;
    assert!(
        why.to_lowercase().contains("noperm") && why.contains(Q) && why.contains("evalsha"),
        "{why}"
    );
    assert!(!why.contains(PROCESSOR_PW), "{why}");
    assert!(gw.seen("refused").is_empty());

    acl(&mut admin, &["SETUSER", "inferq-processor", "+evalsha"]).await;
    p.wait_ready().await;
    let done = wait_result(&mut admin, "refused", Duration::from_secs(20)).await;
    assert_eq!(done.status_code, 200, "{done:?}");
}

/// A processor user whose rule predates `+hscan` (README's rule of the previous release, kept
/// through an upgrade): the processor serves the queue as before, says once that it cannot
/// index the delivery counts an earlier release left, and stops asking. Before, it asked on
/// every reclaim pass (13 refusals in Redis's ACL LOG within 7 s at a 500 ms interval) without
/// a word in its log: Redis answers a script's refused command with `ERR`, not `NOPERM`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rule_without_hscan_is_refused_once_and_named_in_the_log() {
    let (gw, _redis, mut admin, processor_url, producer_url) = rig().await;
    acl(&mut admin, &["SETUSER", "inferq-processor", "-hscan"]).await;
    // A count the previous release left, with no deadline entry.
    let _: () = admin
        .hset(format!("{Q}:deliveries"), "gone\0aaaa", 1)
        .await
        .unwrap();
    let producer = Producer::connect(&producer_url, Q, "result-list")
        .await
        .unwrap();
    producer
        .submit(common::request("served", 120, "{}"))
        .await
        .unwrap();
    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 1.0, 5, ""), &[]);
    p.wait_ready().await;
    let done = wait_result(&mut admin, "served", Duration::from_secs(20)).await;
    assert_eq!(done.status_code, 200, "{done:?}");
    // A few reclaim passes (300 ms apart).
    tokio::time::sleep(Duration::from_secs(3)).await;
    // Redis keeps like refusals as one ACL LOG entry with a count.
    let log: Vec<Vec<redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(&mut admin)
        .await
        .unwrap();
    let field = |entry: &[redis::Value], name: &str| -> Option<redis::Value> {
        entry.chunks(2).find_map(|kv| match kv {
            [redis::Value::BulkString(k), v] if k == name.as_bytes() => Some(v.clone()),
            _ => None,
        })
    };
    let refusals: Vec<(String, i64)> = log
        .iter()
        .map(|entry| {
            let object = match field(entry, "object") {
                Some(redis::Value::BulkString(o)) => String::from_utf8_lossy(&o).into_owned(),
                other => format!("{other:?}"),
            };
            let count = match field(entry, "count") {
                Some(redis::Value::Int(n)) => n,
                _ => -1,
            };
            (object, count)
        })
        .collect();
    assert_eq!(refusals, vec![("hscan".to_owned(), 1)], "{log:?}");
    let log = p.log();
    assert_eq!(
        log.matches("cannot index delivery counts").count(),
        1,
        "{log}"
    );
    assert!(log.contains("+hscan"), "{log}");
}

/// A processor user that may not write the queue's own result list (README's rule less
/// `~result-list`): every result would be refused, so the processor keeps the results it has,
/// claims no more work, and `/readyz` names the list; nothing is dead-lettered, and nothing is
/// sent to the gateway twice. Once the list is granted, the kept results land and the rest of
/// the queue is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_result_list_stops_claiming_and_loses_nothing() {
    let (gw, _redis, mut admin, processor_url, producer_url) = rig().await;
    let rules = readme_rules();
    let processor_rule = rules
        .iter()
        .find(|r| r.get(1).map(String::as_str) == Some("inferq-processor"))
        .unwrap();
    let mut keys = vec!["SETUSER", "inferq-processor", "resetkeys"];
    keys.extend(
        processor_rule
            .iter()
            .map(String::as_str)
            .filter(|a| (a.starts_with('~') || a.starts_with('%')) && *a != "~result-list"),
    );
    acl(&mut admin, &keys).await;
    let producer = Producer::connect(&producer_url, Q, "result-list")
        .await
        .unwrap();
    let ids = |batch: &'static str| (0..5).map(move |i| format!("{batch}-{i}"));
    for id in ids("first") {
        producer
            .submit(common::request(&id, 120, "{}"))
            .await
            .unwrap();
    }

    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 2.0, 2, ""), &[]);
    let why = p.wait_not_ready_because().await;
    assert!(
        why.contains("refuses the results of queue")
            && why.contains("result-list")
            && why.to_lowercase().contains("noperm"),
        "{why}"
    );
    // Submitted while the results are refused: left pending, not sent. The wait spans the
    // lease, so the kept claims are renewed rather than reclaimed and sent again.
    for id in ids("second") {
        producer
            .submit(common::request(&id, 120, "{}"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    for id in ids("second") {
        assert!(gw.seen(&id).is_empty(), "{id} was sent; log:\n{}", p.log());
    }
    let dead: u64 = admin.llen(format!("{Q}:dead")).await.unwrap();
    assert_eq!(dead, 0);

    acl(&mut admin, &["SETUSER", "inferq-processor", "~result-list"]).await;
    p.wait_ready().await;
    for id in ids("first").chain(ids("second")) {
        let done = wait_result(&mut admin, &id, Duration::from_secs(20)).await;
        assert_eq!(done.status_code, 200, "{done:?}");
        assert_eq!(gw.seen(&id).len(), 1, "{id} sent again; log:\n{}", p.log());
    }
    assert_eq!(results_by_id(&mut admin).await.len(), 10);
    let dead: u64 = admin.llen(format!("{Q}:dead")).await.unwrap();
    assert_eq!(dead, 0);
}

/// A redis-pubsub processor user that may not publish on the result channel (README's rule less
/// `&result-queue`; Redis checks a channel only when the PUBLISH runs): as with a refused result
/// list, the processor keeps the results it has, claims no more work and `/readyz` names the
/// refusal; nothing is lost or sent twice. Once the channel is granted the results land (kept
/// in the list of the channel's name, since nobody is subscribed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_result_channel_stops_claiming_and_loses_nothing() {
    let (gw, redis, mut admin, _, _) = rig().await;
    let user = "inferq-processor-pubsub";
    let rules = readme_rules();
    let rule = rules
        .iter()
        .find(|r| r.get(1).map(String::as_str) == Some(user))
        .unwrap();
    let mut channels = vec!["SETUSER", user, "resetchannels"];
    channels.extend(
        rule.iter()
            .map(String::as_str)
            .filter(|a| a.starts_with('&') && *a != "&result-queue"),
    );
    acl(&mut admin, &channels).await;
    let processor_url = url(user, PROCESSOR_PW, redis.port());
    let config = format!(
        r#"{{"url":"{processor_url}","poll_interval_ms":50,"queues":[{{"queue_name":"request-queue","igw_base_url":"{}"}}]}}"#,
        gw.url()
    );
    let p = Proc::spawn_as("redis-pubsub", &config, &[]);
    p.wait_ready().await;
    let now = inferq_client::producer::unix_ms() / 1000;
    let ids: Vec<String> = (0..3).map(|i| format!("ch-{i}")).collect();
    for id in &ids {
        let message = format!(
            r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"{id}","created":{now},"deadline":{},"payload":{{}}}}}}"#,
            now + 120
        );
        let _: u64 = admin.publish("request-queue", message).await.unwrap();
    }
    let why = p.wait_not_ready_because().await;
    assert!(
        why.contains("result-queue") && why.contains("can't publish"),
        "{why}"
    );
    let held: u64 = admin.hlen("request-queue:claimed").await.unwrap();
    let pending: u64 = admin.zcard("request-queue").await.unwrap();
    assert_eq!(held + pending, 3, "log:\n{}", p.log());
    let kept: u64 = admin.llen("result-queue").await.unwrap();
    assert_eq!(kept, 0);

    acl(&mut admin, &["SETUSER", user, "&result-queue"]).await;
    p.wait_ready().await;
    let started = std::time::Instant::now();
    let mut got = BTreeMap::new();
    while got.len() < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{got:?}; log:\n{}",
            p.log()
        );
        let raw: Vec<String> = admin.lrange("result-queue", 0, -1).await.unwrap();
        got = raw
            .iter()
            .map(|r| serde_json::from_str::<ResultMessage>(r).unwrap())
            .map(|r| (r.id.clone(), r))
            .collect();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for id in &ids {
        assert_eq!(got[id].status_code, 200, "{:?}", got[id]);
        assert_eq!(gw.seen(id).len(), 1, "{id} sent again; log:\n{}", p.log());
    }
    let raw: Vec<String> = admin.lrange("result-queue", 0, -1).await.unwrap();
    assert_eq!(raw.len(), 3, "one result each");
}

/// A message naming a result list the processor's user may not write (README's rule allows
/// `result-list` only) fails alone: Redis refuses the outcome batch that carries it, the batch is
/// retried item by item, and its neighbours are each executed once and published once. The
/// message itself is executed once too: it lands in the dead list at once, without a result in
/// the forbidden list, its record naming that list and keeping the result it got.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_list_outside_the_acl_fails_alone() {
    let (gw, redis, mut admin, processor_url, _) = rig().await;
    let admin_url = url("admin", ADMIN_PW, redis.port());
    let good = Producer::connect(&admin_url, Q, "result-list")
        .await
        .unwrap();
    let bad = Producer::connect(&admin_url, Q, "forbidden-results")
        .await
        .unwrap();
    // By deadline the bad one sits in the middle of the queue, so batches carry it with others.
    for i in 0..20 {
        good.submit(common::request(&format!("good-{i:02}"), 100 + i, "{}"))
            .await
            .unwrap();
    }
    bad.submit(common::request("bad", 110, "{}")).await.unwrap();

    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 1.0, 2, ""), &[]);
    p.wait_ready().await;
    let started = Instant::now();
    let dead_list = format!("{Q}:dead");
    // The good requests of later batches may still be in flight when the bad one is buried.
    let results = loop {
        let dead: u64 = admin.llen(&dead_list).await.unwrap();
        let results = results_by_id(&mut admin).await;
        if dead > 0 && results.len() >= 20 {
            break results;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "dead-lettered: {dead}, results: {}; log:\n{}",
            results.len(),
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(results.len(), 20, "{results:?}");
    for i in 0..20 {
        let id = format!("good-{i:02}");
        assert_eq!(results[&id].status_code, 200, "{:?}", results[&id]);
        assert_eq!(
            gw.seen(&id).len(),
            1,
            "{id} executed again; log:\n{}",
            p.log()
        );
    }
    let forbidden: u64 = admin.llen("forbidden-results").await.unwrap();
    assert_eq!(forbidden, 0);
    let records: Vec<String> = admin.lrange(&dead_list, 0, -1).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: serde_json::Value = serde_json::from_str(&records[0]).unwrap();
    assert_eq!(record["id"], "bad", "{record}");
    let reason = record["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("could not be published to \"forbidden-results\"")
            && reason.to_ascii_lowercase().contains("noperm"),
        "{reason}"
    );
    let kept: ResultMessage = serde_json::from_str(record["result"].as_str().unwrap_or_default())
        .unwrap_or_else(|e| panic!("the record keeps no result ({e}): {record}"));
    assert_eq!(
        (kept.id.as_str(), kept.status_code),
        ("bad", 200),
        "{kept:?}"
    );
    assert_eq!(gw.seen("bad").len(), 1, "log:\n{}", p.log());
    assert!(pending_and_claimed_are_empty(&mut admin).await);
}

/// A malformed member (no deadline) naming a result list the processor's user may not write:
/// Redis refuses the dead-lettering that would push its `INVALID_REQUEST` there, so it is set
/// aside without the result, its record saying why, and the requests behind it are served.
/// Before, the refused call failed the whole poll and the same member came back at the head
/// of every poll: nothing behind it was ever claimed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_member_naming_a_forbidden_list_does_not_stop_the_queue() {
    let (gw, redis, mut admin, processor_url, _) = rig().await;
    let admin_url = url("admin", ADMIN_PW, redis.port());
    let good = Producer::connect(&admin_url, Q, "result-list")
        .await
        .unwrap();
    for i in 0..5 {
        good.submit(common::request(&format!("good-{i}"), 100 + i, "{}"))
            .await
            .unwrap();
    }
    // At the head of the queue (score 1), ahead of every good request.
    let bad = r#"{"internal":{"result_queue_name":"forbidden-results"},"request_kind":"plain","data":{"id":"nodeadline","payload":{}}}"#;
    let _: () = admin.zadd(Q, bad, 1).await.unwrap();

    let p = Proc::spawn(&transport(&processor_url, &gw.url(), 1.0, 2, ""), &[]);
    p.wait_ready().await;
    let started = Instant::now();
    while admin.llen::<_, u64>("result-list").await.unwrap() < 5 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the queue is stuck behind the malformed member; log:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let forbidden: u64 = admin.llen("forbidden-results").await.unwrap();
    assert_eq!(forbidden, 0);
    let records: Vec<String> = admin.lrange(format!("{Q}:dead"), 0, -1).await.unwrap();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: serde_json::Value = serde_json::from_str(&records[0]).unwrap();
    let reason = record["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("deadline")
            && reason.contains("could not be published to \"forbidden-results\"")
            && reason.to_ascii_lowercase().contains("noperm"),
        "{reason}"
    );
    assert!(pending_and_claimed_are_empty(&mut admin).await);
}

/// Whether nothing is left pending or claimed on the queue.
async fn pending_and_claimed_are_empty(admin: &mut redis::aio::ConnectionManager) -> bool {
    let pending: u64 = admin.zcard(Q).await.unwrap();
    let claimed: u64 = admin.hlen(format!("{Q}:claimed")).await.unwrap();
    pending == 0 && claimed == 0
}

// ---------------------------------------------------------------------------------------------
// 2. rediss:// with a private CA

/// A Redis that speaks only TLS to clients with certificates from the private CA: the processor
/// and the producer subcommands work with the CA and a client certificate; with the wrong CA the
/// processor stays not ready and says why, and `submit` fails with a clear error — neither
/// shows the password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_with_a_private_ca_and_client_certificate() {
    const PW: &str = "tls-Pw-c0ffee";
    let certs = Certs::new();
    let (redis, tls_port) = tls_redis(&certs, true);
    let mut admin = manager(&redis.url()).await;
    let rule = [
        "SETUSER",
        "inferq",
        "on",
        &format!(">{PW}"),
        "~*",
        "&*",
        "+@all",
    ];
    acl(&mut admin, &rule).await;
    let rediss = format!("rediss://inferq:{PW}@127.0.0.1:{tls_port}/");
    let gw = Gateway::start().await;
    let config = transport(&rediss, &gw.url(), 30.0, 5, "");
    let (ca, cert, key) = (
        certs.arg("ca.crt"),
        certs.arg("client.crt"),
        certs.arg("client.key"),
    );

    let p = Proc::spawn(
        &config,
        &[
            "--redis-tls-ca-cert",
            &ca,
            "--redis-tls-cert",
            &cert,
            "--redis-tls-key",
            &key,
        ],
    );
    p.wait_ready().await;
    let env = [
        ("REDIS_URL", rediss.as_str()),
        ("REDIS_TLS_CA_CERT", ca.as_str()),
        ("REDIS_TLS_CERT", cert.as_str()),
        ("REDIS_TLS_KEY", key.as_str()),
    ];
    let out = cli(&["submit"], &env, &submit_lines(&["tls-1", "tls-2"]));
    assert!(out.status.success(), "{}", text(&out));
    let out = cli(&["results", "-n", "2", "--timeout", "30s"], &env, "");
    assert!(out.status.success(), "{}", text(&out));
    let got = parse_results(&out);
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|r| r.status_code == 200), "{got:?}");
    assert!(!p.log().contains(PW));
    // The operator's dead-letter commands take the same TLS settings.
    let out = cli(&["dead-letter", "list", "--json"], &env, "");
    assert!(out.status.success(), "{}", text(&out));

    // The wrong CA: not ready, with the reason; no password anywhere.
    let other = certs.arg("other-ca.crt");
    let wrong = Proc::spawn(
        &config,
        &[
            "--redis-tls-ca-cert",
            &other,
            "--redis-tls-cert",
            &cert,
            "--redis-tls-key",
            &key,
        ],
    );
    let body = wrong.wait_not_ready_because().await;
    assert!(body.contains("UnknownIssuer"), "{body}");
    let log = wrong.log();
    assert!(
        log.contains("cannot reach Redis") && log.contains("UnknownIssuer"),
        "{log}"
    );
    assert!(!log.contains(PW) && !body.contains(PW), "{log}\n{body}");

    let wrong_env = [
        ("REDIS_URL", rediss.as_str()),
        ("REDIS_TLS_CA_CERT", other.as_str()),
    ];
    let out = cli(&["submit"], &wrong_env, &submit_lines(&["never"]));
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let shown = text(&out);
    assert!(
        shown.contains("cannot connect to Redis") && shown.contains("UnknownIssuer"),
        "{shown}"
    );
    assert!(!shown.contains(PW), "{shown}");
    // No client certificate, where the server requires one: refused, clearly.
    let no_cert_env = [
        ("REDIS_URL", rediss.as_str()),
        ("REDIS_TLS_CA_CERT", ca.as_str()),
    ];
    let out = cli(&["cancel", "x"], &no_cert_env, "");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(!text(&out).contains(PW), "{}", text(&out));
    let pending: u64 = admin.zcard(Q).await.unwrap();
    assert_eq!(pending, 0);
}

// ---------------------------------------------------------------------------------------------
// 3. Passwords never shown

/// The processor and the producer subcommands, given passwords in their URLs, fail for a wrong
/// password, an unreachable Redis, a URL that is not valid, `#insecure`, an unreachable
/// Prometheus and an unreachable gateway; no password appears in any output, `/readyz` or result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_never_appear_in_logs_errors_or_results() {
    let redis = RedisServer::start().unwrap();
    let mut admin = manager(&redis.url()).await;
    let rule = [
        "SETUSER",
        "inferq",
        "on",
        ">right-Pw-1",
        "~*",
        "&*",
        "+@all",
    ];
    acl(&mut admin, &rule).await;
    let gw = Gateway::start().await;
    let secrets = [
        "Wrong-Secret-1",
        "Unreach-Secret-2",
        "Config-Secret-3",
        "Insecure-Secret-4",
        "Prom-Secret-5",
        "Gateway-Secret-6",
    ];
    let wrong = url("inferq", secrets[0], redis.port());
    let unreachable = url("inferq", secrets[1], 1);
    let bad_db = format!(
        "redis://inferq:{}@127.0.0.1:{}/notadb",
        secrets[2],
        redis.port()
    );
    let insecure = format!(
        "rediss://inferq:{}@127.0.0.1:{}/#insecure",
        secrets[3],
        redis.port()
    );
    let good = url("inferq", "right-Pw-1", redis.port());
    let clean = |what: &str, shown: &str| {
        for s in secrets {
            assert!(
                !shown.contains(s),
                "{what} shows the password {s}:\n{shown}"
            );
        }
    };

    // The processor: wrong password and unreachable Redis keep it not ready, with a reason.
    let mut procs = Vec::new();
    for redis_url in [&wrong, &unreachable] {
        let p = Proc::spawn(&transport(redis_url, &gw.url(), 30.0, 5, ""), &[]);
        procs.push(p);
    }
    // Invalid URL and #insecure: config errors, exit 2.
    for redis_url in [&bad_db, &insecure] {
        let mut p = Proc::spawn(&transport(redis_url, &gw.url(), 30.0, 5, ""), &[]);
        assert_eq!(
            p.wait_exit(Duration::from_secs(15)).await,
            Some(2),
            "{}",
            p.log()
        );
        assert!(p.log().contains("invalid config: url"), "{}", p.log());
        clean("a config error", &p.log());
    }
    // Prometheus (unreachable) and gateway (refusing TLS) with credentials in their URLs.
    let prom_gate = r#","gate_type":"prometheus-query","gate_params":{"query":"up","fallback":1}"#;
    // https:// to a plain-HTTP gateway: the TLS handshake fails, and the result names the URL.
    let gateway = format!("https://gw-user:{}@{}", secrets[5], gw.addr);
    let prom = format!("http://prom-user:{}@127.0.0.1:1", secrets[4]);
    let working = Proc::spawn(
        &transport(&good, &gateway, 30.0, 5, prom_gate),
        &["--prometheus-url", &prom],
    );
    working.wait_ready().await;
    let producer = Producer::connect(&good, Q, "result-list").await.unwrap();
    producer
        .submit(common::request("to-nowhere", 60, "{}"))
        .await
        .unwrap();
    let result = wait_result(&mut admin, "to-nowhere", Duration::from_secs(20)).await;
    assert_eq!(result.error_code, "INFERENCE_ERROR", "{result:?}");
    assert!(result.error_message.contains("gw-user:***@"), "{result:?}");
    clean("a result", &serde_json::to_string(&result).unwrap());
    assert!(
        working.log().contains("metric source unavailable"),
        "{}",
        working.log()
    );
    clean("the processor's log", &working.log());

    for p in &procs {
        let body = p.wait_not_ready_because().await;
        clean("/readyz", &body);
        clean("the processor's log", &p.log());
        assert!(p.log().contains("cannot reach Redis"), "{}", p.log());
    }

    // The producer subcommands.
    for redis_url in [&wrong, &unreachable, &bad_db, &insecure] {
        let env = [("REDIS_URL", redis_url.as_str())];
        for args in [
            &["submit"][..],
            &["cancel", "some-id"][..],
            &["results", "-n", "1", "--timeout", "1s"][..],
        ] {
            let out = cli(args, &env, &submit_lines(&["x"]));
            assert_ne!(out.status.code(), Some(0), "{args:?}: {}", text(&out));
            assert!(text(&out).contains("inferq: "), "{args:?}: {}", text(&out));
            clean(&format!("inferq {args:?}"), &text(&out));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// 4. Gateway TLS against the simulator

fn sim_config() -> SimConfig {
    SimConfig {
        ttft_ms: 1,
        per_token_ms: 0.0,
        ..SimConfig::default()
    }
}

/// One processor per case, each on its own queue and result list, sharing one Redis.
async fn gateway_case(
    redis: &RedisServer,
    sim: &Sim,
    name: &str,
    flags: &[&str],
) -> (Proc, ResultMessage) {
    gateway_case_with_env(redis, sim, name, flags, &[]).await
}

/// [`gateway_case`] with environment variables set (`Some`) or removed (`None`).
async fn gateway_case_with_env(
    redis: &RedisServer,
    sim: &Sim,
    name: &str,
    flags: &[&str],
    env: &[(&str, Option<&str>)],
) -> (Proc, ResultMessage) {
    let config = format!(
        r#"{{"url":"{}","poll_interval_ms":50,"queues":[{{"queue_name":"{name}","result_queue_name":"{name}-results","igw_base_url":"{}"}}]}}"#,
        redis.url(),
        sim.base_url()
    );
    let p = Proc::spawn_with_env("redis-sortedset", &config, flags, env);
    p.wait_ready().await;
    let producer = Producer::connect(&redis.url(), name, &format!("{name}-results"))
        .await
        .unwrap();
    producer
        .submit(common::request(
            name,
            60,
            r#"{"prompt":"hi","max_tokens":2}"#,
        ))
        .await
        .unwrap();
    let got = producer
        .pop_result(Duration::from_secs(20))
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{name}: no result; log:\n{}", p.log()));
    (p, got)
}

/// The simulator serving HTTPS from the private CA: trusted with `--tls-ca-cert` → 200;
/// without it → INFERENCE_ERROR at once naming the certificate problem (Go: TLS errors are not
/// retried); `--tls-insecure-skip-verify` → 200; a self-signed gateway certificate given as
/// `--tls-ca-cert` → 200. A simulator requiring client certificates:
/// `--tls-cert`/`--tls-key` → 200, none → INFERENCE_ERROR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_tls_flags_against_the_simulator() {
    let certs = Certs::new();
    let redis = RedisServer::start().unwrap();
    let server_tls = SimTls {
        cert: Some(certs.path("server.crt")),
        key: Some(certs.path("server.key")),
        client_ca: None,
    };
    let addr = "127.0.0.1:0".parse().unwrap();
    let sim = Sim::start_tls(sim_config(), addr, &server_tls)
        .await
        .unwrap();
    assert!(sim.base_url().starts_with("https://"));
    let mtls = Sim::start_tls(
        sim_config(),
        addr,
        &SimTls {
            client_ca: Some(certs.path("ca.crt")),
            ..server_tls.clone()
        },
    )
    .await
    .unwrap();
    let (ca, cert, key) = (
        certs.arg("ca.crt"),
        certs.arg("client.crt"),
        certs.arg("client.key"),
    );

    let (_a, trusted) = gateway_case(&redis, &sim, "trusted", &["--tls-ca-cert", &ca]).await;
    assert_eq!(trusted.status_code, 200, "{trusted:?}");

    let (_b, untrusted) = gateway_case(&redis, &sim, "untrusted", &[]).await;
    assert_eq!(untrusted.error_code, "INFERENCE_ERROR", "{untrusted:?}");
    assert!(
        untrusted.error_message.contains("UnknownIssuer"),
        "{untrusted:?}"
    );

    let (_c, skip) = gateway_case(&redis, &sim, "skip", &["--tls-insecure-skip-verify"]).await;
    assert_eq!(skip.status_code, 200, "{skip:?}");

    let (_d, mutual) = gateway_case(
        &redis,
        &mtls,
        "mutual",
        &["--tls-ca-cert", &ca, "--tls-cert", &cert, "--tls-key", &key],
    )
    .await;
    assert_eq!(mutual.status_code, 200, "{mutual:?}");

    // A gateway serving the self-signed certificate of a quick `openssl req -x509` (marked as a
    // CA), given as the CA file: Go trusts a served certificate its root pool holds, and so does
    // inferq (webpki alone refused it as a CA used as an end entity).
    let self_signed = Sim::start_tls(
        sim_config(),
        addr,
        &SimTls {
            cert: Some(certs.path("self-signed.crt")),
            key: Some(certs.path("self-signed.key")),
            client_ca: None,
        },
    )
    .await
    .unwrap();
    let (_f, own) = gateway_case(
        &redis,
        &self_signed,
        "self-signed",
        &["--tls-ca-cert", &certs.arg("self-signed.crt")],
    )
    .await;
    assert_eq!(own.status_code, 200, "{own:?}");

    let (_e, anonymous) = gateway_case(&redis, &mtls, "anonymous", &["--tls-ca-cert", &ca]).await;
    assert_eq!(anonymous.error_code, "INFERENCE_ERROR", "{anonymous:?}");
    assert!(
        anonymous
            .error_message
            .to_lowercase()
            .contains("certificate"),
        "{anonymous:?}"
    );
    // Each untrusted exchange was tried once: TLS failures are not retried.
    let stats = sim.stats();
    assert_eq!(
        stats.requests, 2,
        "only the trusted and skip-verify requests arrived: {stats:?}"
    );
    // The TLS listener counts every TCP connection it accepts, failed handshakes included: the
    // trusted, untrusted and skip-verify processors each opened at least one.
    assert!(stats.connections_accepted >= 3, "{stats:?}");
}

/// `inferq-dev sim --tls-cert --tls-key --tls-client-ca` serves HTTPS and turns away a client
/// without a certificate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_command_serves_https_with_client_certificates() {
    let certs = Certs::new();
    let port = free_port().unwrap();
    let mut sim = Command::new(inferq_testkit::dev_binary().unwrap())
        .args(["sim", "--listen", &format!("127.0.0.1:{port}")])
        .args([
            "--tls-cert",
            &certs.arg("server.crt"),
            "--tls-key",
            &certs.arg("server.key"),
        ])
        .args(["--tls-client-ca", &certs.arg("ca.crt")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ca = reqwest::Certificate::from_pem(&std::fs::read(certs.path("ca.crt")).unwrap()).unwrap();
    let mut identity = std::fs::read(certs.path("client.crt")).unwrap();
    identity.extend(std::fs::read(certs.path("client.key")).unwrap());
    let with_cert = reqwest::Client::builder()
        .add_root_certificate(ca.clone())
        .identity(reqwest::Identity::from_pem(&identity).unwrap())
        .build()
        .unwrap();
    let without = reqwest::Client::builder()
        .add_root_certificate(ca)
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/v1/completions");
    let body = r#"{"prompt":"hi","max_tokens":1}"#;
    let started = Instant::now();
    let answer = loop {
        match with_cert
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
        {
            Ok(r) => break r,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("the simulator did not answer over TLS: {e}"),
        }
    };
    assert_eq!(answer.status(), 200);
    let refused = without
        .post(&url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await;
    assert!(refused.is_err(), "{refused:?}");
    let _ = sim.kill();
    let _ = sim.wait();
}

// ---------------------------------------------------------------------------------------------
// 5. The system certificate store

/// The environment of a processor whose system certificate store is the file `store` alone (as
/// Go's, `SSL_CERT_FILE` names it; `SSL_CERT_DIR` is not set).
fn store_env(store: &str) -> [(&'static str, Option<&str>); 2] {
    [("SSL_CERT_FILE", Some(store)), ("SSL_CERT_DIR", None)]
}

/// The environment of a processor that reads the machine's own system store (which does not
/// hold the test's private CA).
const MACHINE_STORE: [(&str, Option<&str>); 2] = [("SSL_CERT_FILE", None), ("SSL_CERT_DIR", None)];

/// A gateway whose certificate chains to a CA of the system certificate store (here the bundle
/// `SSL_CERT_FILE` names, as `update-ca-certificates` would make it) is trusted with no TLS flag,
/// as Go trusts its system pool: 200. With the machine's own store, which lacks that CA:
/// INFERENCE_ERROR naming the unknown issuer. `--tls-ca-cert` adds to the store, it does not
/// replace it: another CA given there leaves the store's CA trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_signed_by_a_ca_of_the_system_store_is_trusted_without_flags() {
    let certs = Certs::new();
    let redis = RedisServer::start().unwrap();
    let sim = Sim::start_tls(
        sim_config(),
        "127.0.0.1:0".parse().unwrap(),
        &SimTls {
            cert: Some(certs.path("server.crt")),
            key: Some(certs.path("server.key")),
            client_ca: None,
        },
    )
    .await
    .unwrap();
    let store = certs.arg("ca.crt");

    let (_a, trusted) = gateway_case_with_env(&redis, &sim, "store", &[], &store_env(&store)).await;
    assert_eq!(trusted.status_code, 200, "{trusted:?}");

    let (_b, untrusted) =
        gateway_case_with_env(&redis, &sim, "machine-store", &[], &MACHINE_STORE).await;
    assert_eq!(untrusted.error_code, "INFERENCE_ERROR", "{untrusted:?}");
    assert!(
        untrusted.error_message.contains("UnknownIssuer"),
        "{untrusted:?}"
    );

    let other = certs.arg("other-ca.crt");
    let (_c, added) = gateway_case_with_env(
        &redis,
        &sim,
        "store-and-flag",
        &["--tls-ca-cert", &other],
        &store_env(&store),
    )
    .await;
    assert_eq!(added.status_code, 200, "{added:?}");
}

/// A `rediss://` Redis whose certificate chains to a CA of the system certificate store is
/// trusted with no `--redis-tls-ca-cert`: the processor becomes ready and serves a request, and
/// `inferq submit` and `results` work. With the machine's own store the processor stays not
/// ready naming the unknown issuer, and `submit` fails saying so. `--redis-tls-ca-cert` means
/// that CA alone: naming another CA there, the store's CA is not trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_signed_by_a_ca_of_the_system_store_is_trusted_without_flags() {
    let certs = Certs::new();
    let (_redis, tls_port) = tls_redis(&certs, false);
    let rediss = format!("rediss://127.0.0.1:{tls_port}/");
    let gw = Gateway::start().await;
    let config = transport(&rediss, &gw.url(), 30.0, 5, "");
    let store = certs.arg("ca.crt");

    let p = Proc::spawn_with_env("redis-sortedset", &config, &[], &store_env(&store));
    p.wait_ready().await;
    let env = [
        ("REDIS_URL", rediss.as_str()),
        ("SSL_CERT_FILE", store.as_str()),
    ];
    let out = cli(&["submit"], &env, &submit_lines(&["store-1"]));
    assert!(out.status.success(), "{}", text(&out));
    let out = cli(&["results", "-n", "1", "--timeout", "30s"], &env, "");
    assert!(out.status.success(), "{}", text(&out));
    let got = parse_results(&out);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].status_code, 200, "{got:?}");

    let machine = Proc::spawn_with_env("redis-sortedset", &config, &[], &MACHINE_STORE);
    let body = machine.wait_not_ready_because().await;
    assert!(body.contains("UnknownIssuer"), "{body}");
    let other = certs.arg("other-ca.crt");
    let out = cli(
        &["submit"],
        &[
            ("REDIS_URL", rediss.as_str()),
            ("SSL_CERT_FILE", other.as_str()),
        ],
        &submit_lines(&["never"]),
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("UnknownIssuer"), "{}", text(&out));

    let only = Proc::spawn_with_env(
        "redis-sortedset",
        &config,
        &["--redis-tls-ca-cert", &other],
        &store_env(&store),
    );
    let body = only.wait_not_ready_because().await;
    assert!(body.contains("UnknownIssuer"), "{body}");
}

/// A Redis serving TLS on a port of its own with the private CA's server certificate, asking
/// clients for a certificate from that CA when `client_certs`: the server and its TLS port.
fn tls_redis(certs: &Certs, client_certs: bool) -> (RedisServer, u16) {
    let tls_port = free_port().unwrap();
    let redis = RedisServer::start_with_args(vec![
        "--tls-port".into(),
        tls_port.to_string(),
        "--tls-cert-file".into(),
        certs.arg("server.crt"),
        "--tls-key-file".into(),
        certs.arg("server.key"),
        "--tls-ca-cert-file".into(),
        certs.arg("ca.crt"),
        "--tls-auth-clients".into(),
        if client_certs { "yes" } else { "no" }.into(),
    ])
    .unwrap();
    (redis, tls_port)
}
