//! inferq on a real Redis Cluster (3 masters, 1 replica each) and a real Sentinel set (master,
//! replica, 3 sentinels), started by the test kit: every accepted request gets exactly one
//! result through drains, a master killed with SIGKILL and its replica promoted, a manual
//! `CLUSTER FAILOVER`, a slot migrated mid-load, and a Sentinel fail-over; on Valkey too.
//!
//! Results go to two lists: `result-list` (another slot than the queue: the staged,
//! deliver-once finish) and `{request-sortedset}:results` (the queue's own slot: one script).

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{cli, request, Gateway, Processor, ProcessorOpts};
use inferq::config::hash_slot;
use inferq::queue::producer::Producer;
use inferq::queue::target::{Link, Target, Topology};
use inferq::testkit::cluster::RedisCluster;
use inferq::testkit::sentinel::SentinelSet;
use inferq::wire::ResultMessage;

const QUEUE: &str = "request-sortedset";
/// In another slot than the queue.
const APART: &str = "result-list";
/// In the queue's slot.
const BESIDE: &str = "{request-sortedset}:results";

fn cluster_target(c: &RedisCluster) -> Target {
    c.target().unwrap()
}

fn cluster_opts(c: &RedisCluster) -> ProcessorOpts {
    let addrs: Vec<String> = c.addrs()[1..].iter().map(|a| format!("{a:?}")).collect();
    ProcessorOpts {
        lease_s: 2.0,
        reclaim_ms: 500,
        concurrency: 16,
        batch_size: 50,
        extra_transport_fields: format!(r#","mode":"cluster","addrs":[{}]"#, addrs.join(",")),
        ..ProcessorOpts::default()
    }
}

/// Submits `n` requests `<prefix>-<i>` to `list`'s producer.
async fn submit(target: &Target, list: &str, prefix: &str, n: usize) -> Vec<String> {
    let producer = Producer::connect_target(target, QUEUE, list).await.unwrap();
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i}")).collect();
    for chunk in ids.chunks(100) {
        let reqs = chunk
            .iter()
            .map(|id| request(id, 600, r#"{"model":"m","prompt":"hi"}"#))
            .collect();
        for outcome in producer.submit_many(reqs).await.unwrap() {
            outcome.unwrap();
        }
    }
    ids
}

/// Every result on `list`, oldest first.
async fn results(con: &mut Link, list: &str) -> Vec<ResultMessage> {
    let raw: Vec<String> = redis::cmd("LRANGE")
        .arg(list)
        .arg(0)
        .arg(-1)
        .query_async(con)
        .await
        .unwrap_or_default();
    raw.iter()
        .rev()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

/// Waits until `list` holds `n` results (or `limit` passes), then returns them.
async fn wait_results(con: &mut Link, list: &str, n: usize, limit: Duration) -> Vec<ResultMessage> {
    let started = Instant::now();
    loop {
        let len: usize = redis::cmd("LLEN")
            .arg(list)
            .query_async(con)
            .await
            .unwrap_or(0);
        if len >= n || started.elapsed() > limit {
            // A little longer: a duplicate would show now.
            tokio::time::sleep(Duration::from_millis(300)).await;
            return results(con, list).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Asserts each id has exactly one result, a 200.
fn exactly_one_each(ids: &[String], got: &[ResultMessage], what: &str) {
    let mut count: HashMap<&str, usize> = HashMap::new();
    for r in got {
        *count.entry(r.id.as_str()).or_default() += 1;
    }
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !count.contains_key(id.as_str()))
        .collect();
    let doubled: Vec<(&&str, &usize)> = count.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        missing.is_empty() && doubled.is_empty() && got.len() == ids.len(),
        "{what}: {} results for {} ids; missing {:?}; doubled {:?}",
        got.len(),
        ids.len(),
        &missing[..missing.len().min(10)],
        &doubled[..doubled.len().min(10)]
    );
    assert!(
        got.iter().all(|r| r.status_code == 200),
        "{what}: not all 200"
    );
}

/// Waits for `ids`' results on `list`, checks there is exactly one each, and that the queue
/// holds nothing any more.
async fn drained_once(con: &mut Link, list: &str, ids: &[String], limit: Duration, what: &str) {
    let got = wait_results(con, list, ids.len(), limit).await;
    exactly_one_each(ids, &got, what);
    nothing_left(con).await;
}

/// No claim, staged result or pending request is left of the queue.
async fn nothing_left(con: &mut Link) {
    for (key, kind) in [
        ("{request-sortedset}:claimed", "HLEN"),
        ("{request-sortedset}:finishing", "HLEN"),
        (QUEUE, "ZCARD"),
        ("{request-sortedset}:dead", "LLEN"),
    ] {
        let n: u64 = redis::cmd(kind).arg(key).query_async(con).await.unwrap();
        assert_eq!(n, 0, "{key} holds {n}");
    }
}

#[test]
fn the_two_result_lists_are_in_the_slots_the_test_says() {
    assert_ne!(hash_slot(APART), hash_slot(QUEUE));
    assert_eq!(hash_slot(BESIDE), hash_slot(QUEUE));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_drains_with_one_result_per_request_on_both_finish_paths() {
    let cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let apart = submit(&target, APART, "apart", 300).await;
    let beside = submit(&target, BESIDE, "beside", 300).await;
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    let mut con = target.connect().await.unwrap();
    let got = wait_results(&mut con, APART, apart.len(), Duration::from_secs(60)).await;
    exactly_one_each(&apart, &got, "result list in another slot");
    drained_once(
        &mut con,
        BESIDE,
        &beside,
        Duration::from_secs(60),
        "result list in the queue's slot",
    )
    .await;
    // Every staged result was delivered once and marked; the markers sit in the list's slot.
    let marked: u64 = redis::cmd("ZCARD")
        .arg("{result-list}:delivered")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(marked, 300);
    // The producer's markers of finished requests are cleared, as on one server.
    let active: Option<String> = redis::cmd("GET")
        .arg("request-active:apart-7")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(active, None);
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_and_a_manual_failover_lose_nothing_and_double_nothing() {
    let mut cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    let mut ids = submit(&target, APART, "a", 400).await;
    ids.extend(submit(&target, BESIDE, "b", 400).await);
    // Let replication catch up with what was accepted (without a replica wait, a fail-over
    // may lose a write Redis acknowledged: the docs say so).
    tokio::time::sleep(Duration::from_millis(500)).await;
    let queue_master = cluster.master_for_key(QUEUE).unwrap();
    cluster.kill_master(queue_master).unwrap();
    let promoted = cluster
        .wait_for_failover(queue_master, Duration::from_secs(30))
        .unwrap();
    let more = submit(&target, APART, "c", 200).await;
    // A manual fail-over of the list's master while results are being written.
    let list_master = cluster.master_for_key(APART).unwrap();
    if let Some(replica) = cluster.replicas_of(list_master).unwrap().first() {
        cluster.manual_failover(replica.port).unwrap();
    }
    let mut con = target.connect().await.unwrap();
    let mut apart: Vec<String> = ids
        .iter()
        .filter(|i| i.starts_with("a-"))
        .cloned()
        .collect();
    apart.extend(more);
    let beside: Vec<String> = ids
        .iter()
        .filter(|i| i.starts_with("b-"))
        .cloned()
        .collect();
    let got = wait_results(&mut con, APART, apart.len(), Duration::from_secs(90)).await;
    exactly_one_each(&apart, &got, "apart, across fail-overs");
    drained_once(
        &mut con,
        BESIDE,
        &beside,
        Duration::from_secs(60),
        "beside, across fail-overs",
    )
    .await;
    assert_ne!(promoted, queue_master);
    assert!(
        p.log().contains("inferq ready"),
        "the processor kept running: {}",
        p.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queues_slot_migrated_mid_load_loses_nothing() {
    let cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let ids = submit(&target, BESIDE, "m", 600).await;
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    let slot = hash_slot(QUEUE);
    let from = cluster.master_for_slot(slot).unwrap();
    let to = cluster
        .masters()
        .unwrap()
        .into_iter()
        .map(|m| m.port)
        .find(|&port| port != from)
        .unwrap();
    // Half-way first (clients meet ASK and TRYAGAIN), then the rest.
    let half = cluster.begin_slot_migration(slot, to, 3).unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    cluster.finish_slot_migration(half).unwrap();
    assert_eq!(cluster.master_for_slot(slot).unwrap(), to);
    let mut con = target.connect().await.unwrap();
    drained_once(
        &mut con,
        BESIDE,
        &ids,
        Duration::from_secs(90),
        "across a slot migration",
    )
    .await;
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_cluster_drains_too() {
    let Some(cluster) = RedisCluster::start_valkey(3, 1).unwrap() else {
        eprintln!("valkey-server not found outside CI: skipped");
        return;
    };
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let apart = submit(&target, APART, "v", 200).await;
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    let mut con = target.connect().await.unwrap();
    drained_once(
        &mut con,
        APART,
        &apart,
        Duration::from_secs(60),
        "valkey cluster",
    )
    .await;
    drop(p);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_speak_cluster() {
    let cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let seed = cluster.seed_urls()[0].clone();
    let addrs = cluster.addrs()[1..].join(",");
    let flags = [
        "--redis-url",
        seed.as_str(),
        "--redis-mode",
        "cluster",
        "--redis-addrs",
        addrs.as_str(),
    ];
    let lines: String = (0..20)
        .map(|i| {
            format!("{{\"id\":\"cli-{i}\",\"payload\":{{\"prompt\":\"x\"}},\"timeout_s\":600}}\n")
        })
        .collect();
    let mut args = vec!["submit"];
    args.extend(flags);
    let out = cli(&args, &[], &lines);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let p = Processor::start_at(&seed, &gateway, &cluster_opts(&cluster)).await;
    let mut args = vec!["results", "-n", "20", "--timeout", "60s"];
    args.extend(flags);
    let out = cli(&args, &[], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<ResultMessage>(l).unwrap().id)
        .collect();
    let want: Vec<String> = (0..20).map(|i| format!("cli-{i}")).collect();
    let mut sorted = ids.clone();
    sorted.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(sorted, want_sorted);
    let mut args = vec!["status", "--queue", QUEUE, "--json"];
    args.extend(flags);
    let out = cli(&args, &[], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(line["pending"], 0, "{line}");
    assert_eq!(line["claimed"], 0, "{line}");
    drop(p);
}

#[test]
fn bad_mode_combinations_exit_2_naming_the_field() {
    let cases: [(&[&str], &str); 4] = [
        (
            &["--redis-mode", "clustr"],
            "--redis-mode: must be standalone, cluster or sentinel",
        ),
        (
            &["--redis-addrs", "h:1"],
            "--redis-addrs: only with --redis-mode cluster or sentinel",
        ),
        (
            &["--redis-mode", "sentinel"],
            "--redis-master-name: required with --redis-mode sentinel",
        ),
        (
            &[
                "--redis-mode",
                "cluster",
                "--redis-url",
                "redis://127.0.0.1:1/3",
            ],
            "--redis-url: a Redis Cluster has only database 0",
        ),
    ];
    for (flags, said) in cases {
        let mut args = vec!["status", "--queue", "q"];
        args.extend(flags);
        let out = cli(&args, &[], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(said), "{flags:?}: {err}");
    }
    // The transport config's fields, for `inferq run`.
    for (fields, said) in [
        (
            r#","mode":"sentinel""#,
            "master_name: required with mode sentinel",
        ),
        (
            r#","addrs":["h:1"]"#,
            "addrs: only with mode cluster or sentinel",
        ),
        (
            r#","mode":"cluster","master_name":"m""#,
            "master_name: only with mode sentinel",
        ),
    ] {
        let config = format!(
            r#"{{"url":"redis://127.0.0.1:1"{fields},"queues":[{{"queue_name":"q","igw_base_url":"http://gw"}}]}}"#
        );
        let out = cli(
            &[
                "run",
                "--transport",
                "redis-sortedset",
                "--transport-config",
                &config,
            ],
            &[],
            "",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{fields}: {err}");
        assert!(err.contains(said), "{fields}: {err}");
    }
}

fn sentinel_target(s: &SentinelSet) -> (String, Vec<String>, Target) {
    let addrs = s.sentinel_addrs()[1..].to_vec();
    (s.sentinel_urls()[0].clone(), addrs, s.target().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_and_loses_nothing() {
    let mut set = SentinelSet::start("inferq-main").unwrap();
    let gateway = Gateway::start().await;
    let (url, addrs, target) = sentinel_target(&set);
    let quoted: Vec<String> = addrs.iter().map(|a| format!("{a:?}")).collect();
    let opts = ProcessorOpts {
        lease_s: 2.0,
        reclaim_ms: 500,
        concurrency: 16,
        batch_size: 50,
        extra_transport_fields: format!(
            r#","mode":"sentinel","master_name":"inferq-main","replica_wait":1,"addrs":[{}]"#,
            quoted.join(",")
        ),
        ..ProcessorOpts::default()
    };
    let p = Processor::start_at(&url, &gateway, &opts).await;
    let mut ids = submit(&target, "result-list", "s", 300).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old = set.kill_master().unwrap();
    let new = set
        .wait_for_new_master(old, Duration::from_secs(30))
        .unwrap();
    assert_ne!(old, new);
    // Requests accepted by the new primary are served too.
    ids.extend(submit(&target, "result-list", "t", 200).await);
    let mut con = target.connect().await.unwrap();
    let got = wait_results(&mut con, "result-list", ids.len(), Duration::from_secs(90)).await;
    exactly_one_each(&ids, &got, "across a Sentinel fail-over");
    let claimed: u64 = redis::cmd("HLEN")
        .arg("request-sortedset:claimed")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(claimed, 0, "standalone names are kept under Sentinel");
    // /readyz is honest again once the new primary serves.
    let ready = reqwest::get(format!("http://127.0.0.1:{}/readyz", p.health_port))
        .await
        .unwrap();
    assert!(ready.status().is_success(), "{}", p.log());
}

/// One ACL user on the data nodes and the sentinels alike (Go's one URL carries one login),
/// `default` off everywhere, and TLS on every port: a processor-side producer finds the primary
/// through a sentinel's TLS port, logs in, and submits; a fail-over is followed the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_and_tls_work_through_sentinel() {
    use inferq::testkit::{Auth, SentinelOptions, TestCerts};
    let certs = TestCerts::new().unwrap();
    let login = Auth::new("inferq-app", "app-Pw-41c7");
    let set = SentinelSet::start_opts(
        "inferq-tls",
        SentinelOptions {
            data_auth: Some(login.clone()),
            sentinel_auth: Some(login.clone()),
            tls: Some(certs.node_files()),
            ..SentinelOptions::default()
        },
    )
    .unwrap();
    let addrs = set.sentinel_tls_addrs();
    let url = format!("rediss://{}:{}@{}/", login.user, login.pass, addrs[0]);
    let target = Target::new(
        &url,
        &inferq::queue::connect::RedisTls {
            ca_cert: Some(certs.ca_cert()),
            client: Some((certs.client_cert(), certs.client_key())),
        },
        Topology::Sentinel {
            addrs: addrs[1..].to_vec(),
            master_name: "inferq-tls".to_owned(),
        },
    )
    .unwrap();
    let ids = submit(&target, "result-list", "tls", 20).await;
    let mut con = target.connect().await.unwrap();
    let queued = |mut con: Link| async move {
        redis::cmd("ZCARD")
            .arg(QUEUE)
            .query_async::<u64>(&mut con)
            .await
    };
    assert_eq!(queued(con.clone()).await.unwrap(), ids.len() as u64);
    tokio::time::sleep(Duration::from_millis(500)).await;
    set.failover().unwrap();
    // The link asks the sentinels again once the old primary refuses a write (READONLY) or
    // drops the connection; reads a demoted primary still answers.
    let started = Instant::now();
    let after = loop {
        let wrote = redis::cmd("SET")
            .arg("probe")
            .arg("1")
            .query_async::<()>(&mut con)
            .await;
        if wrote.is_ok() {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(&mut con).await.unwrap();
            assert!(
                matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master"),
                "a write went through to a server that is not the primary: {role:?}"
            );
            break queued(con.clone()).await.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "never reached the new primary"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(after, ids.len() as u64);
}

/// A submission is reported accepted only once the replicas asked for hold it; one that reaches
/// fewer in time says it is queued but may be lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_wait_reports_what_the_replicas_hold() {
    use inferq::queue::producer::ProducerError;
    use inferq::queue::ReplicaWait;
    let set = SentinelSet::start("inferq-wait").unwrap();
    let (_, _, target) = sentinel_target(&set);
    let wait = |replicas| {
        Some(ReplicaWait {
            replicas,
            timeout: Duration::from_millis(200),
        })
    };
    let one = Producer::connect_target(&target, QUEUE, APART)
        .await
        .unwrap()
        .with_replica_wait(wait(1));
    let outcomes = one
        .submit_many(vec![request("w-1", 600, "{}"), request("w-2", 600, "{}")])
        .await
        .unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    let three = one.clone().with_replica_wait(wait(3));
    let started = Instant::now();
    let outcomes = three
        .submit_many(vec![request("w-3", 600, "{}")])
        .await
        .unwrap();
    match &outcomes[0] {
        Err(ProducerError::NotReplicated { acked, wanted, .. }) => {
            assert_eq!((*acked, *wanted), (1, 3));
            let said = outcomes[0].as_ref().unwrap_err().to_string();
            assert!(said.contains("queued on the primary"), "{said}");
        }
        other => panic!("{other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    // It is queued all the same: the report is about its safety, not its place.
    let mut con = target.connect().await.unwrap();
    let queued: u64 = redis::cmd("ZCARD")
        .arg(QUEUE)
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(queued, 3);
}

/// A cancel reaches a request before its claim (the marker is read beside the claim) and while
/// the gateway works on it (the in-flight check reads markers in many slots one by one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_are_seen_before_and_during_dispatch_on_a_cluster() {
    use common::Reply;
    let cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let producer = Producer::connect_target(&target, QUEUE, APART)
        .await
        .unwrap();
    for outcome in producer
        .submit_many(vec![request("early", 600, "{}")])
        .await
        .unwrap()
    {
        outcome.unwrap();
    }
    assert_eq!(
        producer.cancel(&["early".to_owned()]).await.unwrap(),
        vec![true]
    );
    gateway.script("late", vec![Reply::ok("{}").after(Duration::from_secs(20))]);
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    producer.submit(request("late", 600, "{}")).await.unwrap();
    gateway.wait_seen("late", Duration::from_secs(10)).await;
    assert_eq!(
        producer.cancel(&["late".to_owned()]).await.unwrap(),
        vec![true]
    );
    let mut con = target.connect().await.unwrap();
    let got = wait_results(&mut con, APART, 2, Duration::from_secs(10)).await;
    let codes: HashMap<&str, &str> = got
        .iter()
        .map(|r| (r.id.as_str(), r.error_code.as_str()))
        .collect();
    assert_eq!(codes.get("early"), Some(&"CANCELLED"), "{got:?}");
    assert_eq!(codes.get("late"), Some(&"CANCELLED"), "{got:?}");
    assert!(
        gateway.seen("early").is_empty(),
        "a cancelled request was sent"
    );
    assert_eq!(got.len(), 2);
    drop(p);
}
