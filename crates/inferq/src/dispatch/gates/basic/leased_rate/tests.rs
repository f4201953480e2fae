//! Tests of `redis-leased-rate` against a real `redis-server`: the admit and refuse cases of the
//! lease and the token bucket, the gauges, a Redis that is down or answers `MOVED`, and the
//! parameter errors.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::{json, Value};

use super::super::testing::*;
use super::*;
use crate::config::{GateSpec, GateType};
use crate::dispatch::gates::GateOwner;
use crate::ops::QueueLabels;
use inferq_testkit::{RedisCluster, RedisServer};

const CONTROL: &str = "drain:batch";

/// Lease fields to change: a value, or `None` to leave the field out.
type Changes<'a> = Vec<(&'a str, Option<&'a str>)>;

/// Redis's clock in Unix milliseconds.
async fn redis_ms(con: &mut redis::aio::MultiplexedConnection) -> i64 {
    let (s, us): (i64, i64) = redis::cmd("TIME").query_async(con).await.unwrap();
    s * 1000 + us / 1000
}

/// Writes a lease for pool `batch` of `rate` requests a second, valid for `valid_ms` from
/// Redis's now, then applies `changes` (a field set to `None` is deleted).
async fn lease(
    con: &mut redis::aio::MultiplexedConnection,
    rate: &str,
    valid_ms: i64,
    changes: &[(&str, Option<&str>)],
) -> i64 {
    let until = redis_ms(con).await + valid_ms;
    let _: () = con.del(CONTROL).await.unwrap();
    let until_text = until.to_string();
    let mut fields = vec![
        ("api_version", Some(API_VERSION)),
        ("pool_id", Some("batch")),
        ("max_admission_rps", Some(rate)),
        ("valid_until_unix_ms", Some(until_text.as_str())),
        ("decision_id", Some("d-1")),
    ];
    for (name, value) in changes {
        if let Some(f) = fields.iter_mut().find(|(n, _)| n == name) {
            f.1 = *value;
        }
    }
    for (name, value) in fields {
        if let Some(v) = value {
            let _: () = con.hset(CONTROL, name, v).await.unwrap();
        }
    }
    until
}

fn params(address: String, extra: Value) -> Value {
    let mut p = json!({"address": address, "control_key": CONTROL, "pool_id": "batch"});
    if let (Some(p), Value::Object(extra)) = (p.as_object_mut(), extra) {
        p.extend(extra);
    }
    p
}

/// How many of `n` requests in a row the gate admits.
async fn admitted(gate: &dyn Gate, n: usize) -> usize {
    let mut count = 0;
    for _ in 0..n {
        if name(&apply(gate, &[], &[]).await.verdict) == "continue" {
            count += 1;
        }
    }
    count
}

#[tokio::test]
async fn a_valid_lease_admits_its_burst_and_refills_at_its_rate() {
    let server = RedisServer::start().unwrap();
    let mut con = server.connection().await.unwrap();
    let g = gate("redis-leased-rate", params(server.url(), json!({}))).unwrap();
    lease(&mut con, "2", 60_000, &[]).await;
    assert_eq!(g.budget().await, 1.0, "a positive lease opens the budget");
    assert_eq!(admitted(g.as_ref(), 5).await, 2, "capacity max(1, 2 × 1 s)");
    assert_eq!(
        g.budget().await,
        1.0,
        "the budget does not follow the bucket"
    );

    // One second of Redis time later the bucket is full again, never fuller.
    let now = redis_ms(&mut con).await;
    let _: () = con
        .hset(format!("{CONTROL}:state"), "last_ms", now - 1000)
        .await
        .unwrap();
    assert_eq!(admitted(g.as_ref(), 5).await, 2, "refilled to its capacity");
    let _: () = con
        .hset(format!("{CONTROL}:state"), "last_ms", now - 60_000)
        .await
        .unwrap();
    assert_eq!(
        admitted(g.as_ref(), 5).await,
        2,
        "a long idle refills no more"
    );

    // Half a second refills one token at rate 2.
    let _: () = con
        .hset_multiple(
            format!("{CONTROL}:state"),
            &[("tokens", "0"), ("last_ms", &(now - 500).to_string())],
        )
        .await
        .unwrap();
    assert_eq!(admitted(g.as_ref(), 5).await, 1);

    // A Redis clock that went back refills nothing (the bucket's time stands still).
    let _: () = con
        .hset_multiple(
            format!("{CONTROL}:state"),
            &[("tokens", "0"), ("last_ms", &(now + 60_000).to_string())],
        )
        .await
        .unwrap();
    assert_eq!(admitted(g.as_ref(), 3).await, 0);
    let last: i64 = con
        .hget(format!("{CONTROL}:state"), "last_ms")
        .await
        .unwrap();
    assert_eq!(
        last,
        now + 60_000,
        "the bucket's time does not go back with the clock, so no interval refills twice"
    );

    // A burst of 3 s at rate 2 holds 6; a burst under a token holds one.
    let _: () = con.del(format!("{CONTROL}:state")).await.unwrap();
    let g3 = gate(
        "redis-leased-rate",
        params(server.url(), json!({"burst_seconds": "3"})),
    )
    .unwrap();
    assert_eq!(admitted(g3.as_ref(), 10).await, 6);
    let small = gate(
        "redis-leased-rate",
        params(
            server.url(),
            json!({"burst_seconds": 0.1, "state_key": "elsewhere"}),
        ),
    )
    .unwrap();
    assert_eq!(admitted(small.as_ref(), 3).await, 1, "capacity at least 1");
    let elsewhere: bool = con.exists("elsewhere").await.unwrap();
    assert!(elsewhere, "state_key names the bucket");
}

#[tokio::test]
async fn the_bucket_expires_a_second_after_its_lease() {
    let server = RedisServer::start().unwrap();
    let mut con = server.connection().await.unwrap();
    let g = gate("redis-leased-rate", params(server.url(), json!({}))).unwrap();
    lease(&mut con, "5", 30_000, &[]).await;
    assert_eq!(admitted(g.as_ref(), 1).await, 1);
    let ttl: i64 = con.pttl(format!("{CONTROL}:state")).await.unwrap();
    assert!((29_000..=31_000).contains(&ttl), "ttl {ttl} ms");
    lease(&mut con, "5", 100, &[]).await;
    assert_eq!(admitted(g.as_ref(), 1).await, 1);
    let ttl: i64 = con.pttl(format!("{CONTROL}:state")).await.unwrap();
    assert!((900..=1100).contains(&ttl), "at least a second: {ttl} ms");
}

/// Every lease the spec calls invalid refuses (and reads as an invalid lease); rate 0 refuses
/// under a valid lease.
#[tokio::test]
async fn an_invalid_lease_or_rate_0_admits_nothing() {
    let server = RedisServer::start().unwrap();
    let mut con = server.connection().await.unwrap();
    let g = gate("redis-leased-rate", params(server.url(), json!({}))).unwrap();
    assert_eq!(g.budget().await, 0.0, "no lease at all");
    assert_eq!(admitted(g.as_ref(), 2).await, 0);
    let cases: Vec<(&str, &str, i64, Changes)> = vec![
        ("expired", "5", -1, vec![]),
        ("ends now", "5", 0, vec![]),
        (
            "another version",
            "5",
            60_000,
            vec![("api_version", Some("llm-d.ai/v2"))],
        ),
        (
            "another pool",
            "5",
            60_000,
            vec![("pool_id", Some("other"))],
        ),
        ("no decision id", "5", 60_000, vec![("decision_id", None)]),
        (
            "empty decision id",
            "5",
            60_000,
            vec![("decision_id", Some(""))],
        ),
        ("no rate", "5", 60_000, vec![("max_admission_rps", None)]),
        ("negative rate", "-1", 60_000, vec![]),
        ("NaN rate", "nan", 60_000, vec![]),
        ("infinite rate", "inf", 60_000, vec![]),
        ("words for a rate", "fast", 60_000, vec![]),
        (
            "fractional end",
            "5",
            60_000,
            vec![("valid_until_unix_ms", Some("99999999999999.5"))],
        ),
        (
            "words for an end",
            "5",
            60_000,
            vec![("valid_until_unix_ms", Some("soon"))],
        ),
    ];
    for (case, rate, valid_ms, changes) in cases {
        lease(&mut con, rate, valid_ms, &changes).await;
        assert_eq!(g.budget().await, 0.0, "{case}: budget");
        assert_eq!(admitted(g.as_ref(), 2).await, 0, "{case}: apply");
    }

    lease(&mut con, "0", 60_000, &[]).await;
    assert_eq!(g.budget().await, 0.0, "rate 0 is a pause");
    assert_eq!(admitted(g.as_ref(), 2).await, 0);
    let state: bool = con.exists(format!("{CONTROL}:state")).await.unwrap();
    assert!(!state, "a refused lease leaves the bucket alone");

    // The same lease, once valid again, admits: nothing above was a sticky state.
    lease(&mut con, "1", 60_000, &[]).await;
    assert_eq!(admitted(g.as_ref(), 2).await, 1);
}

/// The three gauges start at 0 when the gate is built and follow each decision.
#[tokio::test]
async fn each_decision_sets_the_drain_limit_gauges() {
    let server = RedisServer::start().unwrap();
    let mut con = server.connection().await.unwrap();
    let metrics = Arc::new(Metrics::new());
    let env = GateEnv {
        owner: Some(GateOwner {
            metrics: metrics.clone(),
            labels: QueueLabels {
                queue_id: String::new(),
                queue_name: String::new(),
                pool_name: "batch".into(),
            },
        }),
        ..GateEnv::default()
    };
    // No pool_id: the owning pool's.
    let mut p = params(server.url(), json!({}));
    p.as_object_mut().unwrap().remove("pool_id");
    let spec = GateSpec {
        kind: GateType::RedisLeasedRate,
        params: serde_json::from_value(p).unwrap(),
    };
    let g = crate::dispatch::gates::build(&spec, &env).unwrap();
    let series = |m: &Metrics| {
        let text = m.encode().unwrap();
        ["rps", "lease_valid", "valid_until_seconds"].map(|g| {
            let prefix = format!("llm_d_async_async_drain_limit_{g}{{pool_name=\"batch\"}} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(str::to_owned)
                .unwrap_or_else(|| panic!("{prefix} missing from {text}"))
        })
    };
    assert_eq!(series(&metrics), ["0", "0", "0"], "at start");
    let until = lease(&mut con, "2.5", 60_000, &[]).await;
    assert_eq!(admitted(g.as_ref(), 1).await, 1);
    let seconds = crate::ops::gofloat::go_float(until as f64 / 1000.0);
    assert_eq!(
        series(&metrics),
        ["2.5".to_owned(), "1".into(), seconds.clone()]
    );
    let until = lease(&mut con, "0", 60_000, &[]).await;
    assert_eq!(g.budget().await, 0.0);
    let seconds = crate::ops::gofloat::go_float(until as f64 / 1000.0);
    assert_eq!(
        series(&metrics),
        ["0".to_owned(), "1".into(), seconds],
        "a pause is a valid lease"
    );
    lease(&mut con, "2", -5, &[]).await;
    assert_eq!(admitted(g.as_ref(), 1).await, 0);
    assert_eq!(series(&metrics), ["0", "0", "0"], "expired");
}

/// Redis unreachable: refused quickly (not a gate error, which would fail the request).
#[tokio::test]
async fn redis_down_refuses() {
    let mut server = RedisServer::start().unwrap();
    let mut con = server.connection().await.unwrap();
    let g = gate("redis-leased-rate", params(server.url(), json!({}))).unwrap();
    lease(&mut con, "100", 60_000, &[]).await;
    assert_eq!(admitted(g.as_ref(), 1).await, 1);
    server.kill();
    let started = Instant::now();
    assert_eq!(admitted(g.as_ref(), 2).await, 0);
    assert_eq!(g.budget().await, 0.0);
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// A gate pointed at a cluster node that does not serve the control key gets `MOVED`, and
/// refuses: the gate is a plain client, as in Go.
#[tokio::test]
async fn moved_refuses() {
    let cluster = RedisCluster::start_with(3, 0).unwrap();
    let mut con = cluster.connection().await.unwrap();
    let tagged = "{drain}:batch";
    let owner = cluster.master_for_key(tagged).unwrap();
    let other = cluster.ports().into_iter().find(|p| *p != owner).unwrap();
    let until = {
        let (s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
        s * 1000 + 60_000
    };
    let _: () = redis::cmd("HSET")
        .arg(tagged)
        .arg(&[
            ("api_version", API_VERSION.to_owned()),
            ("pool_id", "batch".to_owned()),
            ("max_admission_rps", "10".to_owned()),
            ("valid_until_unix_ms", until.to_string()),
            ("decision_id", "d".to_owned()),
        ])
        .query_async(&mut con)
        .await
        .unwrap();
    let at = |port: u16| json!({"address": format!("127.0.0.1:{port}"), "control_key": tagged, "pool_id": "batch"});
    let right = gate("redis-leased-rate", at(owner)).unwrap();
    assert_eq!(
        admitted(right.as_ref(), 1).await,
        1,
        "the serving node admits"
    );
    let wrong = gate("redis-leased-rate", at(other)).unwrap();
    assert_eq!(admitted(wrong.as_ref(), 2).await, 0, "MOVED refuses");
    assert_eq!(wrong.budget().await, 0.0);
}

#[test]
fn parameter_errors_name_the_parameter() {
    let e = |p: Value| build_error("redis-leased-rate", p);
    assert_eq!(
        e(json!({"control_key": "k", "pool_id": "p"})),
        "gate redis-leased-rate: parameter address: required"
    );
    assert_eq!(
        e(json!({"address": "h:1", "pool_id": "p"})),
        "gate redis-leased-rate: parameter control_key: required"
    );
    assert_eq!(
        e(json!({"address": "h:1", "control_key": "k"})),
        "gate redis-leased-rate: parameter pool_id: required when the gate has no owning pool"
    );
    for (burst, shown) in [(json!(0), "0"), (json!("-1"), "-1"), (json!("NaN"), "NaN")] {
        assert_eq!(
            e(
                json!({"address": "h:1", "control_key": "k", "pool_id": "p", "burst_seconds": burst})
            ),
            format!(
                "gate redis-leased-rate: parameter burst_seconds: must be a finite number > 0, \
                 got {shown}"
            )
        );
    }
    assert!(
        e(json!({"address": "h:1", "control_key": "k", "pool_id": "p", "burst_seconds": "x"}))
            .starts_with("gate redis-leased-rate: parameter burst_seconds: not a number")
    );
}
