//! Durable result delivery (Go's Receive/Renew/Ack consumer protocol) on a real Redis: the
//! library's semantics, a Go consumer's claims written by hand beside inferq's, two
//! `inferq results --durable` processes sharing a list while one is killed with SIGKILL, and
//! the `{route}:result-*` keys on a Redis Cluster.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inferq_client::durable_results::{
    Acked, Delivery, DurableResultError, DurableResults, DurableSettings, Poll, Received,
};
use inferq_client::target::Link;
use inferq_client::wire::ResultMessage;
use inferq_testkit::cluster::RedisCluster;
use inferq_testkit::{Fsync, RedisServer};
use redis::AsyncCommands;

/// A server that never restarts in these tests, so `appendfsync everysec`: with `always`, one
/// slow fsync on a busy CI disk stalled Redis past the 3 s answer timeout and a 1 s lease.
fn redis_server() -> RedisServer {
    RedisServer::start_with(Fsync::EverySec).unwrap()
}

const LIST: &str = "result-list";

fn result_json(id: &str, token: &str) -> String {
    let mut r = ResultMessage::http(id, 200, br#"{"ok":true}"#);
    r.request_token = token.to_owned();
    r.to_json()
}

fn lease(ms: u64) -> DurableSettings {
    DurableSettings {
        lease: Duration::from_millis(ms),
        reclaim_interval: Duration::from_millis(50),
        ..DurableSettings::default()
    }
}

/// A consumer named `name` of `LIST` on `redis` with a lease of `ms`.
async fn consumer(redis: &RedisServer, name: &str, ms: u64) -> DurableResults {
    common::producer(redis, "request-sortedset")
        .await
        .durable_results(name, lease(ms))
        .unwrap()
}

/// Redis's clock, Unix ms.
async fn redis_ms<C: redis::aio::ConnectionLike>(con: &mut C) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(con).await.unwrap();
    s * 1000 + us / 1000
}

async fn got(c: &mut DurableResults) -> Delivery {
    c.receive(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("a result to receive")
}

fn id_of(d: &Delivery) -> String {
    match &d.received {
        Received::Result(r) => r.id.clone(),
        other => panic!("not a result: {other:?}"),
    }
}

/// Receive takes the oldest result into Go's claim keys; renew and ack are fenced by owner and
/// lease; expired claims are put back ahead of everything else (earliest expiry first) and their
/// old owner can neither renew nor ack it; a repeated ack answers 2; copies of an acked result
/// or of a held one are dropped, while a new generation of the id is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receive_renew_and_ack_follow_gos_protocol() {
    let redis = redis_server();
    let mut con = common::con(&redis).await;
    for (id, token) in [("a", "t1"), ("b", "t2"), ("c", "t3")] {
        let _: () = con.lpush(LIST, result_json(id, token)).await.unwrap();
    }
    let mut short = consumer(&redis, "short", 400).await;
    let mut long = consumer(&redis, "long", 60_000).await;
    let before = redis_ms(&mut con).await;
    let da = got(&mut short).await;
    let db = got(&mut short).await;
    assert_eq!((id_of(&da).as_str(), id_of(&db).as_str()), ("a", "b"));
    // Go's keys, Go's claim ID, the owner token naming the consumer, expiry in ms.
    assert_eq!(da.claim_id, b"a\0t1");
    assert!(
        da.owner.starts_with("short/") && da.owner.len() == 6 + 32,
        "{}",
        da.owner
    );
    assert_ne!(da.owner, db.owner, "every receive mints its own owner");
    let claimed: Vec<u8> = con
        .hget("result-list:result-claimed", "a\0t1")
        .await
        .unwrap();
    assert_eq!(claimed, da.raw);
    let owner: String = con
        .hget("result-list:result-claim-owners", "a\0t1")
        .await
        .unwrap();
    assert_eq!(owner, da.owner);
    let expiry: f64 = con
        .zscore("result-list:result-claims-idx", "a\0t1")
        .await
        .unwrap();
    let after = redis_ms(&mut con).await;
    assert!(
        expiry >= (before + 400) as f64 && expiry <= (after + 400) as f64,
        "{expiry} not in {before}+400..{after}+400"
    );
    // Renewed a few ms after b was received, so a's lease ends strictly after b's: claims whose
    // leases end in the same millisecond go back in claim-ID order, a before b (in CI, b's
    // receive and a's renewal once fell in one millisecond).
    tokio::time::sleep(Duration::from_millis(20)).await;
    short.renew(&da).await.unwrap();
    // Both leases run out; nobody has put them back yet, but they are no longer the owner's.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(matches!(
        short.renew(&da).await,
        Err(DurableResultError::OwnershipLost)
    ));
    assert!(matches!(
        short.ack(&db).await,
        Err(DurableResultError::OwnershipLost)
    ));
    let _: () = con.lpush(LIST, result_json("d", "t4")).await.unwrap();
    // The next receive puts both back at the tail, the earliest expiry last so it is taken
    // first: b (a was renewed, so its lease ran out later), a, then c and d.
    let rb = got(&mut long).await;
    let ra = got(&mut long).await;
    assert_eq!((id_of(&rb).as_str(), id_of(&ra).as_str()), ("b", "a"));
    assert!(matches!(
        short.ack(&da).await,
        Err(DurableResultError::OwnershipLost)
    ));
    let order = [id_of(&got(&mut long).await), id_of(&got(&mut long).await)];
    assert_eq!(order, ["c", "d"]);
    // Acked once; a repeated ack is idempotent (2), and leaves a seven-day tombstone.
    assert_eq!(long.ack(&ra).await.unwrap(), Acked::Now);
    assert_eq!(long.ack(&ra).await.unwrap(), Acked::Before);
    let now = redis_ms(&mut con).await as f64;
    let tomb: f64 = con
        .zscore("result-list:result-ack-tombstones", "a\0t1")
        .await
        .unwrap();
    let week = 7.0 * 24.0 * 3600.0 * 1000.0;
    assert!((tomb - now - week).abs() < 5_000.0, "{tomb} vs {now}");
    let ttl: i64 = con.pttl("result-list:result-ack-tombstones").await.unwrap();
    assert!(ttl > week as i64 - 5_000, "{ttl}");
    let held: bool = con
        .hexists("result-list:result-claimed", "a\0t1")
        .await
        .unwrap();
    assert!(!held, "an acked claim is dropped");
    // Copies of a (acked) and b (held by `long`) are dropped; a's new generation comes through.
    for json in [
        result_json("a", "t1"),
        result_json("b", "t2"),
        result_json("a", "t9"),
    ] {
        let _: () = con.lpush(LIST, json).await.unwrap();
    }
    let next = got(&mut long).await;
    assert_eq!(next.claim_id, b"a\0t9");
    let left: u64 = con.llen(LIST).await.unwrap();
    assert_eq!(left, 0, "the duplicates were dropped");
    assert!(matches!(long.receive_once().await.unwrap(), Poll::Empty));
}

/// Entries that are no result are claimed one by one under the unparsable claim ID, reported
/// with the reason, and can be acked; several held at once stay apart. `inferq results
/// --durable` writes them to standard error and acks them, and writes the result behind them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unparsable_entries_are_claimed_reported_and_acked() {
    let redis = redis_server();
    let mut con = common::con(&redis).await;
    let bad = [
        "not json",
        r#"{"id":5}"#,
        r#"{"id":"x","request_token":7}"#,
        "[1,2]",
    ];
    for b in bad {
        let _: () = con.lpush(LIST, b).await.unwrap();
    }
    let mut c = consumer(&redis, "w", 60_000).await;
    let mut held = Vec::new();
    for b in bad {
        let d = got(&mut c).await;
        assert_eq!(d.raw, b.as_bytes());
        let Received::Unparsable(why) = &d.received else {
            panic!("{b}: {:?}", d.received);
        };
        assert!(!why.is_empty());
        let mut expected = b"\0unparsable-result\0".to_vec();
        expected.extend_from_slice(d.owner.as_bytes());
        assert_eq!(d.claim_id, expected);
        held.push(d);
    }
    let n: u64 = con.hlen("result-list:result-claimed").await.unwrap();
    assert_eq!(
        n, 4,
        "four unparsable claims held at once, none overwritten"
    );
    for d in &held {
        assert_eq!(c.ack(d).await.unwrap(), Acked::Now);
    }
    let n: u64 = con.hlen("result-list:result-claimed").await.unwrap();
    assert_eq!(n, 0);

    // The command line: the bad entry goes to standard error, acked; the result is written.
    let _: () = con.lpush(LIST, "{broken").await.unwrap();
    let _: () = con.lpush(LIST, result_json("good", "tg")).await.unwrap();
    let out = common::cli(
        &["results", "--durable", "w", "-n", "1", "--timeout", "10s"],
        &[("REDIS_URL", &redis.url())],
        "",
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(stdout.contains(r#""id":"good""#), "{stdout}");
    assert!(
        err.contains("is no result (not JSON") && err.contains("{broken"),
        "{err}"
    );
    let idx: u64 = con.zcard("result-list:result-claims-idx").await.unwrap();
    assert_eq!(idx, 0, "nothing left claimed: {err}");
    let tombs: u64 = con
        .zcard("result-list:result-ack-tombstones")
        .await
        .unwrap();
    assert_eq!(tombs, 6, "both acked (and the four before)");
}

/// A Go consumer's claim, written byte for byte as Go's ReceiveResult leaves it (claimed,
/// owners, idx in ms, Go's 32-hex owner), is not taken by inferq while its lease lives, and is
/// taken once it ran out, after which Go's renew is refused. A tombstone Go's ack left makes
/// inferq drop a copy of that result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_consumers_claims_and_tombstones_are_honoured() {
    let redis = redis_server();
    let mut con = common::con(&redis).await;
    let go_owner = "0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let held = result_json("g", "tg");
    let now = redis_ms(&mut con).await;
    let _: () = redis::pipe()
        .hset("result-list:result-claimed", "g\0tg", &held)
        .hset("result-list:result-claim-owners", "g\0tg", go_owner)
        .zadd("result-list:result-claims-idx", "g\0tg", now + 1_500)
        .zadd(
            "result-list:result-ack-tombstones",
            "done\0td",
            now + 7 * 24 * 3600 * 1000,
        )
        .query_async(&mut con)
        .await
        .unwrap();
    // A copy of the result Go acked, and a copy of the one Go holds, then a new one.
    for json in [
        result_json("done", "td"),
        held.clone(),
        result_json("n", "tn"),
    ] {
        let _: () = con.lpush(LIST, json).await.unwrap();
    }
    let mut c = consumer(&redis, "rs", 60_000).await;
    let first = got(&mut c).await;
    assert_eq!(
        id_of(&first),
        "n",
        "Go's acked and held results are skipped"
    );
    c.ack(&first).await.unwrap();
    assert!(matches!(c.receive_once().await.unwrap(), Poll::Empty));
    let owner: String = con
        .hget("result-list:result-claim-owners", "g\0tg")
        .await
        .unwrap();
    assert_eq!(
        owner, go_owner,
        "Go's claim is untouched while its lease lives"
    );
    // Go's consumer died: once its lease ran out, inferq takes the result.
    let started = Instant::now();
    let taken = c.receive(Duration::from_secs(5)).await.unwrap().unwrap();
    assert!(started.elapsed() >= Duration::from_millis(1_000));
    assert_eq!(taken.raw, held.as_bytes());
    assert_eq!(taken.claim_id, b"g\0tg");
    // Go's renew (same script, Go's owner) is refused: its ownership is lost.
    let mut go_delivery = taken.clone();
    go_delivery.owner = go_owner.to_owned();
    assert!(matches!(
        c.renew(&go_delivery).await,
        Err(DurableResultError::OwnershipLost)
    ));
    assert_eq!(c.ack(&taken).await.unwrap(), Acked::Now);
}

/// `inferq results --durable` as a process with its output file.
fn spawn_durable(redis: &RedisServer, name: &str, out: &std::path::Path) -> Child {
    Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args([
            "results",
            "--durable",
            name,
            "--result-lease",
            "2s",
            "--result-reclaim-interval",
            "100ms",
            "--timeout",
            "60s",
            "-o",
        ])
        .arg(out)
        .env("REDIS_URL", redis.url())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn kill(pid: u32, sig: &str) {
    assert!(Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap()
        .success());
}

/// The (id, request_token) of every line of `path`.
fn lines_of(path: &std::path::Path) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let r: ResultMessage = serde_json::from_str(l).unwrap();
            (r.id, r.request_token)
        })
        .collect()
}

/// Two `inferq results --durable` processes share a list while results are pushed; one is
/// killed with SIGKILL while it holds a claim. Every result is written, each by one of them,
/// except at most the one the killed consumer held: the survivor writes it again once its lease
/// ran out. Every result is acked once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_durable_consumers_share_a_list_and_survive_a_kill() {
    const N: usize = 150;
    // `appendfsync always` on purpose: each ack waits for its fsync, which keeps a claim in a
    // consumer's hands long enough for the freeze below to catch one.
    let redis = RedisServer::start().unwrap();
    let mut con = common::con(&redis).await;
    let dir = tempfile::tempdir().unwrap();
    let (file_a, file_b) = (dir.path().join("a.jsonl"), dir.path().join("b.jsonl"));
    let mut a = spawn_durable(&redis, "ca", &file_a);
    let mut b = spawn_durable(&redis, "cb", &file_b);
    let pusher = {
        let mut con = con.clone();
        tokio::spawn(async move {
            for i in 0..N {
                let _: () = con
                    .lpush(LIST, result_json(&format!("r{i}"), &format!("t{i}")))
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_millis(8)).await;
            }
        })
    };
    // Kill `a` while it holds a claim: freeze it until one is seen in its hands.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let held_by_a = loop {
        kill(a.id(), "-STOP");
        let owners: HashMap<Vec<u8>, String> = con
            .hgetall("result-list:result-claim-owners")
            .await
            .unwrap();
        if let Some((claim, _)) = owners.iter().find(|(_, o)| o.starts_with("ca/")) {
            break claim.clone();
        }
        kill(a.id(), "-CONT");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "`a` never seen holding a claim"
        );
        tokio::time::sleep(Duration::from_millis(3)).await;
    };
    kill(a.id(), "-KILL");
    let _ = a.wait();
    pusher.await.unwrap();
    // Everything acked once: list and claims empty, one tombstone per result.
    let started = Instant::now();
    loop {
        let (list, idx, tombs): (u64, u64, u64) = redis::pipe()
            .llen(LIST)
            .zcard("result-list:result-claims-idx")
            .zcard("result-list:result-ack-tombstones")
            .query_async(&mut con)
            .await
            .unwrap();
        if list == 0 && idx == 0 && tombs == N as u64 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "list {list}, claims {idx}, acked {tombs} of {N}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    kill(b.id(), "-TERM");
    let status = b.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut b.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(err.contains("stopped by a signal"), "{err}");

    let (by_a, by_b) = (lines_of(&file_a), lines_of(&file_b));
    assert!(
        !by_a.is_empty() && !by_b.is_empty(),
        "{} {}",
        by_a.len(),
        by_b.len()
    );
    let set_a: HashSet<_> = by_a.iter().cloned().collect();
    let set_b: HashSet<_> = by_b.iter().cloned().collect();
    assert_eq!(set_a.len(), by_a.len(), "`a` wrote a result twice");
    assert_eq!(set_b.len(), by_b.len(), "`b` wrote a result twice");
    let all: HashSet<_> = set_a.union(&set_b).cloned().collect();
    assert_eq!(all.len(), N, "every result written");
    let both: Vec<_> = set_a.intersection(&set_b).collect();
    assert!(both.len() <= 1, "written by both: {both:?}");
    // The claim `a` died holding went to `b` after its lease.
    let held = String::from_utf8(held_by_a).unwrap();
    let (id, token) = held.split_once('\0').unwrap();
    assert!(
        set_b.contains(&(id.to_owned(), token.to_owned())),
        "{id} held by the killed consumer was never written by the survivor"
    );
}

/// On a Redis Cluster the claim keys are `{<route>}:result-*` (a route with its own tag keeps
/// it), in the route's slot, and `inferq results --durable` drains both kinds of route.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_uses_the_tagged_claim_keys() {
    let cluster = RedisCluster::start_with(3, 0).unwrap();
    let mut con = cluster.connection().await.unwrap();
    let link: Link = cluster.target().unwrap().connect().await.unwrap();
    let seed = cluster.seed_urls()[0].clone();
    let addrs = cluster.addrs()[1..].join(",");
    for (route, prefix) in [
        ("results", "{results}"),
        ("{pool-a}:results", "{pool-a}:results"),
    ] {
        for i in 0..3 {
            let _: () = con
                .lpush(route, result_json(&format!("{route}-{i}"), "tk"))
                .await
                .unwrap();
        }
        let mut c = DurableResults::new(link.clone(), route, "cl", lease(60_000)).unwrap();
        let d = got(&mut c).await;
        assert_eq!(id_of(&d), format!("{route}-0"));
        let claimed = format!("{prefix}:result-claimed");
        let here: bool = con.hexists(&claimed, &d.claim_id).await.unwrap();
        assert!(here, "{route}: not in {claimed}");
        let plain: bool = con.exists(format!("{route}:result-claimed")).await.unwrap();
        assert_eq!(
            plain,
            prefix == route,
            "{route}: the untagged name is unused"
        );
        assert_eq!(c.ack(&d).await.unwrap(), Acked::Now);
        let tomb: Option<f64> = con
            .zscore(format!("{prefix}:result-ack-tombstones"), &d.claim_id)
            .await
            .unwrap();
        assert!(tomb.is_some(), "{route}");
        let out = common::cli(
            &[
                "results",
                "--durable",
                "cl",
                "--redis-url",
                &seed,
                "--redis-mode",
                "cluster",
                "--redis-addrs",
                &addrs,
                "--result-queue",
                route,
                "-n",
                "2",
                "--timeout",
                "20s",
            ],
            &[],
            "",
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{route}: {err}");
        let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<ResultMessage>(l).unwrap().id)
            .collect();
        assert_eq!(ids, [format!("{route}-1"), format!("{route}-2")], "{err}");
        let tombs: u64 = con
            .zcard(format!("{prefix}:result-ack-tombstones"))
            .await
            .unwrap();
        assert_eq!(tombs, 3, "{route}");
    }
}

/// A write that blocks (a reader that does not read: a 300 KB result fills the pipe) keeps its
/// claim: `inferq results --durable` renews the lease while it waits, and acks once written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_write_keeps_its_claim_by_renewing() {
    let redis = redis_server();
    let mut con = common::con(&redis).await;
    let big = ResultMessage::http("big", 200, "x".repeat(300_000).as_bytes()).to_json();
    let _: () = con.lpush(LIST, &big).await.unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args([
            "results",
            "--durable",
            "w",
            "--result-lease",
            "1s",
            "-n",
            "1",
        ])
        .args(["--timeout", "30s"])
        .env("REDIS_URL", redis.url())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Nobody reads for three leases; the claim's expiry keeps moving on.
    let mut expiries = Vec::new();
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let e: Option<f64> = con
            .zscore("result-list:result-claims-idx", "big")
            .await
            .unwrap();
        expiries.extend(e);
    }
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(status.success(), "{err}");
    assert_eq!(stdout.trim_end(), big);
    assert!(!err.contains("lease ran out"), "{err}");
    let mut distinct = expiries.clone();
    distinct.dedup();
    assert!(
        distinct.len() >= 3,
        "the lease was not renewed: {expiries:?}"
    );
    let acked: u64 = con
        .zcard("result-list:result-ack-tombstones")
        .await
        .unwrap();
    assert_eq!(acked, 1, "{err}");
}
