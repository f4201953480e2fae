//! inferq on a real Redis Cluster (3 masters, 1 replica each) and a real Sentinel set (master,
//! replica, 3 sentinels), started by the test kit: every accepted request gets exactly one
//! result through drains, a master killed with SIGKILL and its replica promoted, a manual
//! `CLUSTER FAILOVER`, a slot migrated mid-load, and a Sentinel fail-over; on Valkey too.
//!
//! Results go to two lists: `result-list` (another slot than the queue: the staged,
//! deliver-once finish) and `{request-sortedset}:results` (the queue's own slot: one script).

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{cli, request, Gateway, Processor, ProcessorOpts};
use inferq::config::hash_slot;
use inferq_client::producer::Producer;
use inferq_client::target::{Link, Target, Topology};
use inferq_client::wire::ResultMessage;
use inferq_testkit::cluster::RedisCluster;
use inferq_testkit::sentinel::SentinelSet;

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
        // Every push sets the list's TTL, on both finish paths.
        extra_queue_fields: r#","result_ttl_seconds":3600"#.to_owned(),
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
        .arg("{result-list}:delivered:request-sortedset")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(marked, 300);
    // The queue's result_ttl_seconds is on both lists, the staged path's too.
    for list in [APART, BESIDE] {
        let ttl: i64 = redis::cmd("TTL")
            .arg(list)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!((3500..=3600).contains(&ttl), "{list} TTL {ttl}");
    }
    // The producer's markers of finished requests are cleared, as on one server.
    let active: Option<String> = redis::cmd("GET")
        .arg("request-active:apart-7")
        .query_async(&mut con)
        .await
        .unwrap();
    assert_eq!(active, None);
    // INFO is answered by every node of a cluster: the memory policy is read all the same.
    assert!(
        !p.log()
            .contains("cannot ask Redis for its maxmemory-policy"),
        "{}",
        p.log()
    );
    drop(p);
}

/// Polls a processor's `/readyz` every 100 ms from its start, keeping the statuses seen.
struct ReadyzWatch {
    seen: std::sync::Arc<std::sync::Mutex<Vec<u16>>>,
    task: tokio::task::JoinHandle<()>,
}

impl ReadyzWatch {
    fn start(health_port: u16) -> ReadyzWatch {
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let into = seen.clone();
        let url = format!("http://127.0.0.1:{health_port}/readyz");
        let task = tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .unwrap();
            loop {
                if let Ok(r) = client.get(&url).send().await {
                    into.lock().unwrap().push(r.status().as_u16());
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        ReadyzWatch { seen, task }
    }

    fn saw(&self, status: u16) -> bool {
        self.seen.lock().unwrap().contains(&status)
    }

    /// Waits up to `limit` for the latest status to be `status`.
    async fn wait_for(&self, status: u16, limit: Duration) -> bool {
        let started = Instant::now();
        while started.elapsed() < limit {
            if self.seen.lock().unwrap().last() == Some(&status) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }
}

impl Drop for ReadyzWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
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
    let readyz = ReadyzWatch::start(p.health_port);
    cluster.kill_master(queue_master).unwrap();
    let promoted = cluster
        .wait_for_failover(queue_master, Duration::from_secs(30))
        .unwrap();
    // /readyz said 503 while a master was gone, and is 200 again once its replica serves.
    assert!(
        readyz.saw(503),
        "readyz stayed 200 with a master down: {}",
        p.log()
    );
    assert!(
        readyz.wait_for(200, Duration::from_secs(30)).await,
        "readyz is not 200 again after the fail-over: {}",
        p.log()
    );
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

/// A cluster connection that gets nothing but timeouts (here: the key's master frozen with
/// SIGSTOP) makes itself again from the seeds once `stuck_after` has passed, and answers again
/// when the node does. redis-rs's own connection can stay wedged after a fail-over; this is the
/// way out inferq takes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_connection_answering_only_timeouts_is_made_again() {
    use inferq_client::Cluster;
    let cluster = RedisCluster::start().unwrap();
    let client = redis::cluster::ClusterClientBuilder::new(cluster.seed_urls())
        .connection_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .retries(0)
        .build()
        .unwrap();
    let mut con = Cluster::connect_with(client, Duration::from_secs(1))
        .await
        .unwrap();
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("v")
        .query_async(&mut con)
        .await
        .unwrap();
    let master = cluster.master_for_key("k").unwrap();
    let info = cluster.node_cli(master, &["INFO", "server"]).unwrap();
    let pid = info
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .unwrap()
        .trim()
        .to_owned();
    let signal = |sig: &str| {
        assert!(std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success())
    };
    // Frozen for less than the cluster's node timeout (2 s), so no fail-over starts.
    signal("-STOP");
    let frozen = Instant::now();
    let mut timeouts = 0;
    while con.remakes() == 0 && frozen.elapsed() < Duration::from_millis(1_700) {
        let got: redis::RedisResult<String> =
            redis::cmd("GET").arg("k").query_async(&mut con).await;
        if got.as_ref().is_err_and(|e| e.is_timeout()) {
            timeouts += 1;
        }
    }
    signal("-CONT");
    assert!(timeouts >= 2, "{timeouts} timeouts");
    assert_eq!(
        con.remakes(),
        1,
        "no new connection after {timeouts} timeouts in a row"
    );
    let started = Instant::now();
    let answer = loop {
        let got: redis::RedisResult<String> =
            redis::cmd("GET").arg("k").query_async(&mut con).await;
        if got.is_ok() || started.elapsed() > Duration::from_secs(10) {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(answer.unwrap(), "v");
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

/// What a Go processor on a cluster claims with, under its tagged keys: the head member of the
/// queue, held by `owner` until `lease_s` from now (Go reckons leases in Unix seconds of its own
/// clock). Returns the claim key (`id` NUL `request_token`) and the member.
const GO_CLAIM: &str = r#"
local m = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
if not m then return false end
local env = cjson.decode(m)
local ck = env.data.id .. '\0' .. env.internal.request_token
redis.call('ZREM', KEYS[1], m)
redis.call('HSET', KEYS[2], ck, m)
redis.call('HSET', KEYS[3], ck, ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ck)
return {ck, m}
"#;

/// Go's fenced drop of its claim, the last of its three steps on a cluster.
const GO_DROP: &str = r#"
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
"#;

fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

const GO_KEYS: [&str; 4] = [
    QUEUE,
    "{request-sortedset}:claimed",
    "{request-sortedset}:claim-owners",
    "{request-sortedset}:claims-idx",
];

/// Claims the queue's head as a Go instance would; returns (claim key, request id).
async fn go_claim(con: &mut Link, owner: &str, lease_s: f64) -> (String, String) {
    let (ck, member): (String, String) = redis::cmd("EVAL")
        .arg(GO_CLAIM)
        .arg(4)
        .arg(&GO_KEYS[..])
        .arg(owner)
        .arg(unix_s() + lease_s)
        .query_async(con)
        .await
        .unwrap();
    let env: serde_json::Value = serde_json::from_str(&member).unwrap();
    (ck, env["data"]["id"].as_str().unwrap().to_owned())
}

/// Finishes a Go claim with Go's three steps on a cluster whose result list is in another slot:
/// renew, push, drop (the push is the result Go's worker made).
async fn go_finish(con: &mut Link, ck: &str, owner: &str, id: &str) {
    let renewed: i64 = redis::cmd("EVAL")
        .arg("if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1]) return 1")
        .arg(2)
        .arg(GO_KEYS[2])
        .arg(GO_KEYS[3])
        .arg(ck)
        .arg(owner)
        .arg(unix_s() + 120.0)
        .query_async(con)
        .await
        .unwrap();
    assert_eq!(renewed, 1, "the Go claim of {id} is still Go's");
    let result = format!(r#"{{"id":"{id}","status_code":200,"payload":"{{\"by\":\"go\"}}"}}"#);
    let _: i64 = redis::cmd("LPUSH")
        .arg(APART)
        .arg(result)
        .query_async(con)
        .await
        .unwrap();
    let dropped: i64 = redis::cmd("EVAL")
        .arg(GO_DROP)
        .arg(3)
        .arg(&GO_KEYS[1..])
        .arg(ck)
        .arg(owner)
        .query_async(con)
        .await
        .unwrap();
    assert_eq!(dropped, 1);
}

/// A Go processor and an inferq processor share one queue on a cluster. Go claims three
/// requests under its tagged keys: one it never finishes (its pod died with a 1 s lease), two it
/// finishes with its renew-push-drop steps while inferq drains the rest. Every request gets
/// exactly one result; inferq runs the dead Go pod's request once and never the ones Go holds;
/// and inferq's own claims sit in the keys Go's reclaimer reads, scored in Unix seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_processor_shares_the_cluster_queue() {
    let cluster = RedisCluster::start().unwrap();
    let gateway = Gateway::start().await;
    let target = cluster_target(&cluster);
    let ids = submit(&target, APART, "g", 200).await;
    let mut con = target.connect().await.unwrap();
    let (_, dead_id) = go_claim(&mut con, "go-pod-dead", 1.0).await;
    let (ck1, id1) = go_claim(&mut con, "go-pod-live", 120.0).await;
    let (ck2, id2) = go_claim(&mut con, "go-pod-live", 120.0).await;
    // One request of inferq's is slow, so its claim can be looked at while held.
    let slow = "g-150";
    gateway.script(
        slow,
        vec![common::Reply::ok(r#"{"slow":true}"#).after(Duration::from_secs(3))],
    );
    let p = Processor::start_at(&cluster.seed_urls()[0], &gateway, &cluster_opts(&cluster)).await;
    go_finish(&mut con, &ck1, "go-pod-live", &id1).await;
    gateway.wait_seen(slow, Duration::from_secs(30)).await;
    let held: Vec<String> = redis::cmd("HKEYS")
        .arg(GO_KEYS[1])
        .query_async(&mut con)
        .await
        .unwrap();
    let inferq_ck = held
        .iter()
        .find(|ck| ck.starts_with("g-150\0"))
        .unwrap_or_else(|| panic!("inferq's claim of {slow} is in {}: {held:?}", GO_KEYS[1]));
    let expiry: f64 = redis::cmd("ZSCORE")
        .arg(GO_KEYS[3])
        .arg(inferq_ck)
        .query_async(&mut con)
        .await
        .unwrap();
    let now = unix_s();
    assert!(
        expiry > now - 1.0 && expiry < now + 3.0,
        "inferq's lease expiry {expiry} is in Unix seconds, about now ({now}) plus its 2 s lease"
    );
    let owner: Option<String> = redis::cmd("HGET")
        .arg(GO_KEYS[2])
        .arg(inferq_ck)
        .query_async(&mut con)
        .await
        .unwrap();
    assert!(
        owner.is_some(),
        "inferq names its claim's owner where Go reads it"
    );
    // Go's second claim outlives several of inferq's reclaim passes before Go finishes it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    go_finish(&mut con, &ck2, "go-pod-live", &id2).await;
    let got = wait_results(&mut con, APART, ids.len(), Duration::from_secs(60)).await;
    exactly_one_each(&ids, &got, "a queue shared with a Go processor");
    let runs = gateway.executions();
    for id in [&id1, &id2] {
        assert_eq!(
            runs.get(id.as_str()),
            None,
            "inferq ran {id}, which Go held"
        );
        let by_go = got.iter().find(|r| &r.id == id).unwrap();
        assert!(by_go.payload.contains("go"), "{id}'s result is Go's");
    }
    assert_eq!(
        runs.get(dead_id.as_str()),
        Some(&1),
        "the dead Go pod's request ran once, after its lease expired"
    );
    nothing_left(&mut con).await;
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
    use inferq_testkit::{Auth, SentinelOptions, TestCerts};
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
        &inferq_client::connect::RedisTls {
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
    use inferq_client::producer::ProducerError;
    use inferq_client::ReplicaWait;
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
