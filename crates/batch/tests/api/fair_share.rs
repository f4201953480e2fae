//! Fair share across tenants (issue 34), end to end: replicas with `--queue-per-tenant` and a
//! processor with the `fair-share` merge policy.
//!
//! - Through the official `openai` SDK (`fair_share_sdk.py`): tenant b's small batch, posted while
//!   tenant a's large one runs, ends first.
//! - The per-tenant line metrics: every tenant of the keys file at 0 from start-up, then the
//!   lines done counted per tenant.
//! - On a Redis Cluster (tenants' queues in different slots): both tenants' batches run to the
//!   end through the index of queues with work, and a Go-format queue that no index names is
//!   found by its prefix (`SCAN` of every primary) and served.

use std::time::Duration;

use crate::common::{until, Deployment, Fallible};
use inferq_testkit::RedisCluster;

const KEY_A: &str = "sk-tenant-a-0123456789";
const KEY_B: &str = "sk-tenant-b-0123456789";

/// The keys, the `fair-share` policy (its queues found by the replicas' prefix) and the
/// replicas' `--queue-per-tenant`.
fn fair(d: &mut Deployment, policy: serde_json::Value) -> Fallible {
    d.keys(&format!(r#"{{"{KEY_A}":"a","{KEY_B}":"b"}}"#))?;
    d.extra_flags.push("--queue-per-tenant".into());
    let path = d.dir.path().join("merge-policy.json");
    std::fs::write(&path, policy.to_string())?;
    d.processor_flags.extend([
        "--request-merge-policy-config-file".into(),
        path.display().to_string(),
    ]);
    Ok(())
}

/// `/metrics` of replica `i`.
async fn metrics(d: &Deployment, i: usize) -> Fallible<String> {
    let url = format!("http://127.0.0.1:{}/metrics", d.replicas[i].1);
    Ok(reqwest::get(url).await?.text().await?)
}

fn series(page: &str, tenant: &str, state: &str) -> Option<f64> {
    let name = format!("inferq_batch_tenant_lines{{tenant=\"{tenant}\",state=\"{state}\"}} ");
    page.lines()
        .find_map(|l| l.strip_prefix(&name))
        .and_then(|v| v.trim().parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_batch_posted_later_ends_first() -> Fallible {
    // 4 workers at 50 ms a request: 80 lines/s, so a's 2,000 lines take 25 s.
    let mut d = Deployment::start(50).await?;
    fair(
        &mut d,
        serde_json::json!({"type": "fair-share", "parameters": {
            "queue_prefix": "inferq-tenant:", "discover_interval_ms": 100}}),
    )?;
    d.processor_flags
        .extend(["--concurrency".into(), "4".into()]);
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    // Every tenant the keys name is there from the start, at 0.
    let page = metrics(&d, 0).await?;
    for tenant in ["a", "b"] {
        for state in ["waiting", "running", "done"] {
            assert_eq!(
                series(&page, tenant, state),
                Some(0.0),
                "{tenant} {state}: {page}"
            );
        }
    }
    d.run_sdk(
        "fair_share_sdk.py",
        &[
            ("INFERQ_KEY_A", KEY_A),
            ("INFERQ_KEY_B", KEY_B),
            ("INFERQ_LARGE", "2000"),
            ("INFERQ_SMALL", "20"),
        ],
    )
    .await?;
    // b's 20 lines are counted done; a's are counted as theirs (its cancel files a `CANCELLED`
    // result for each line left, which may all be counted by now), never more than its lines.
    let page = until(
        "the lines done per tenant",
        Duration::from_secs(10),
        Duration::from_millis(200),
        async || {
            let page = metrics(&d, 1).await?;
            Ok((series(&page, "b", "done") == Some(20.0)).then_some(page))
        },
    )
    .await?;
    let a_done = series(&page, "a", "done").unwrap_or(0.0);
    assert!((10.0..=2000.0).contains(&a_done), "{page}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_queues_are_found_on_a_redis_cluster() -> Fallible {
    let cluster = RedisCluster::start()?;
    let mut d = Deployment::start(5).await?;
    let addrs: Vec<String> = cluster.addrs()[1..].to_vec();
    d.point_at(
        serde_json::json!({"url": cluster.seed_urls()[0], "mode": "cluster", "addrs": addrs}),
    )?;
    fair(
        &mut d,
        serde_json::json!({"type": "fair-share", "parameters": {
            "queue_prefix": "inferq-tenant:", "discover_interval_ms": 100,
            "scan_interval_ms": 1000}}),
    )?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    // The two tenants' queues hash to different slots.
    assert_ne!(
        inferq_client::hash_slot("inferq-tenant:a"),
        inferq_client::hash_slot("inferq-tenant:b")
    );
    let mut ids = Vec::new();
    for (key, n) in [(KEY_A, 150), (KEY_B, 50)] {
        ids.push((
            key,
            n,
            crate::common::start_batch_as(&d.url(0), key, n).await?,
        ));
    }
    for (key, n, id) in ids {
        let ended = crate::common::wait_ended_as(&d.url(1), key, &id, Duration::from_secs(60))
            .await
            .map_err(|e| format!("{e}\n{}", d.logs()))?;
        assert_eq!(ended["status"], "completed", "{ended}\n{}", d.logs());
        assert_eq!(ended["request_counts"]["completed"], n, "{ended}");
    }
    // A Go-format producer writes a tenant queue and no index entry: the SCAN finds it.
    let url = cluster.seed_urls()[0].clone();
    let client = redis::cluster::ClusterClient::new(vec![url])?;
    let mut con = client.get_async_connection().await?;
    let deadline = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs()
        + 600;
    let member = serde_json::json!({
        "internal": {"request_token": "tok-go-1", "result_queue_name": "go-results"},
        "request_kind": "plain",
        "data": {"id": "go-1", "created": deadline - 600, "deadline": deadline,
                 "payload": {"model": "m", "messages": [{"role": "user", "content": "hi"}]},
                 "endpoint": "/v1/chat/completions"}
    });
    let _: i64 = redis::cmd("ZADD")
        .arg("inferq-tenant:go")
        .arg(deadline)
        .arg(member.to_string())
        .query_async(&mut con)
        .await?;
    let result: Option<(String, String)> = redis::cmd("BRPOP")
        .arg("go-results")
        .arg(20)
        .query_async(&mut con)
        .await?;
    let (_, result) = result.ok_or_else(|| format!("no result for the Go queue\n{}", d.logs()))?;
    let result: serde_json::Value = serde_json::from_str(&result)?;
    assert_eq!(result["id"], "go-1", "{result}");
    assert_eq!(result["status_code"], 200, "{result}");
    Ok(())
}

/// A tenant's requests are claimed at its turn: with 40 tenants of 5 requests each written
/// straight into their queues, a pool of 4 workers with `burst` 4 holds no more claimed at once
/// than its room (2 x 4 waiting), its 4 workers' requests and the outcomes being written (at
/// most 24 on a busy machine; 13 seen here), where each queue would otherwise claim its whole
/// backlog while it waits (all 200), and a bound per queue alone would leave at least one claim
/// in each of the 40; and every request still ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_are_claimed_only_at_their_turn() -> Fallible {
    let (tenants, each) = (40usize, 5usize);
    let mut d = Deployment::start(100).await?;
    let path = d.dir.path().join("merge-policy.json");
    let policy = serde_json::json!({"type": "fair-share", "parameters": {
        "queue_prefix": "inferq-tenant:", "discover_interval_ms": 100, "burst": 4}});
    std::fs::write(&path, policy.to_string())?;
    d.processor_flags.extend([
        "--request-merge-policy-config-file".into(),
        path.display().to_string(),
        "--concurrency".into(),
        "4".into(),
    ]);
    let url = d.redis.url();
    inferq_testkit::tenants::fill(&inferq_testkit::tenants::TenantQueues {
        url: &url,
        prefix: "inferq-tenant:",
        index: Some("inferq-tenants:index"),
        shared: "batch-q",
        results: "turn-results",
        tenants,
        each,
    })
    .await?;
    let mut con = redis::Client::open(url.as_str())?
        .get_multiplexed_async_connection()
        .await?;
    d.add_processor()?;
    let started = std::time::Instant::now();
    let (mut most, mut done) = (0i64, 0i64);
    let total = i64::try_from(tenants * each)?;
    while done < total && started.elapsed() < Duration::from_secs(60) {
        let mut pipe = redis::pipe();
        for t in 0..tenants {
            pipe.cmd("HLEN").arg(format!("inferq-tenant:t{t}:claimed"));
        }
        let held: Vec<i64> = pipe.query_async(&mut con).await?;
        most = most.max(held.iter().sum());
        done = redis::cmd("LLEN")
            .arg("turn-results")
            .query_async(&mut con)
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(done, total, "every request ends");
    assert!(most >= 4, "the workers were busy: at most {most} claimed");
    assert!(
        most <= 24,
        "{most} claimed at once: more than the room and the workers hold"
    );
    Ok(())
}

/// `/readyz` of replica `i`: its status and body.
async fn readyz(d: &Deployment, i: usize) -> Fallible<(u16, String)> {
    let r = reqwest::get(format!("http://127.0.0.1:{}/readyz", d.replicas[i].1)).await?;
    Ok((r.status().as_u16(), r.text().await?))
}

/// Issue 44: `--queue-per-tenant` without a processor serving fair share stalled with nothing
/// said, and a cancelled batch's lines stayed pending in the tenant's queue. Now the replica is
/// not ready (and says why, in `/readyz`, a metric and its log) until a `fair-share` processor
/// with its prefix announces itself; a batch cancelled meanwhile leaves no line pending
/// (`inferq status` counts 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_queues_nobody_serves_are_not_ready_and_a_cancel_leaves_nothing_pending() -> Fallible
{
    let mut d = Deployment::start(5).await?;
    fair(
        &mut d,
        serde_json::json!({"type": "fair-share", "parameters": {
            "queue_prefix": "inferq-tenant:", "discover_interval_ms": 100}}),
    )?;
    let policy_flags = std::mem::take(&mut d.processor_flags);
    // A processor without fair share: it serves the shared queue only.
    d.add_processor()?;
    d.spawn_replica()?;
    let (status, body) = until(
        "the replica answers /readyz",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || Ok(readyz(&d, 0).await.ok()),
    )
    .await?;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("fair-share"), "{body}");
    let page = metrics(&d, 0).await?;
    assert!(page.contains("inferq_batch_fair_share_served 0"), "{page}");
    // A batch taken anyway waits in tenant a's queue; cancelled, it leaves nothing there.
    let id = crate::common::start_batch_as(&d.url(0), KEY_A, 5).await?;
    let mut con = redis::Client::open(d.redis.url())?
        .get_multiplexed_async_connection()
        .await?;
    until(
        "the lines in tenant a's queue",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let n: i64 = redis::cmd("ZCARD")
                .arg("inferq-tenant:a")
                .query_async(&mut con)
                .await?;
            Ok((n == 5).then_some(()))
        },
    )
    .await?;
    let cancelled = reqwest::Client::new()
        .post(format!("{}/batches/{id}/cancel", d.url(0)))
        .bearer_auth(KEY_A)
        .send()
        .await?;
    assert_eq!(cancelled.status(), 200);
    let ended =
        crate::common::wait_ended_as(&d.url(0), KEY_A, &id, Duration::from_secs(30)).await?;
    assert_eq!(ended["status"], "cancelled", "{ended}");
    let out = std::process::Command::new(inferq_testkit::inferq_binary()?)
        .args(["status", "--json", "--queue", "inferq-tenant:a"])
        .env("REDIS_URL", d.redis.url())
        .output()?;
    let line: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(line["pending"], 0, "{line}\n{}", d.logs());
    let log = std::fs::read_to_string(d.dir.path().join("replica-0.log"))?;
    assert!(log.contains("no processor serving fair share"), "{log}");
    // A fair-share processor comes: the replica is ready.
    d.processor_flags = policy_flags;
    d.add_processor()?;
    let (status, body) = until(
        "the replica ready",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || Ok(readyz(&d, 0).await.ok().filter(|(s, _)| *s == 200)),
    )
    .await?;
    assert_eq!(status, 200, "{body}");
    assert!(
        metrics(&d, 0)
            .await?
            .contains("inferq_batch_fair_share_served 1"),
        "{}",
        d.logs()
    );
    Ok(())
}
