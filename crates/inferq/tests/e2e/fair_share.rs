//! `fair-share`'s queues found by their prefix, as an operator watches them on `/metrics`: a
//! found tenant queue's series are those of a listed queue (backlog, claim depth, …), a lane
//! retired once its queue went idle leaves no stale reading behind, and the policy's own
//! families (requests served per tenant, weights, tenants with work) tell what shares it gives.

use std::time::{Duration, Instant};

use crate::common::{con, producer, request, Gateway, Processor, ProcessorOpts, Reply};
use inferq_testkit::RedisServer;

const PREFIX: &str = "inferq-tenant:";
const INDEX: &str = "inferq-tenants:index";

/// A processor whose `fair-share` policy finds the queues of `PREFIX` (every 100 ms, an idle
/// entry forgotten after `idle_ms`), with a lease of `lease_s`.
async fn fair_processor(
    redis: &RedisServer,
    gateway: &Gateway,
    idle_ms: u64,
    lease_s: f64,
    policy_dir: &tempfile::TempDir,
) -> Processor {
    let path = policy_dir.path().join("merge-policy.json");
    let policy = serde_json::json!({"type": "fair-share", "parameters": {
        "queue_prefix": PREFIX, "discover_interval_ms": 100, "idle_after_ms": idle_ms,
        "weights": {"team-a": 3}}});
    std::fs::write(&path, policy.to_string()).unwrap();
    let opts = ProcessorOpts {
        lease_s,
        extra_args: vec![
            "--request-merge-policy-config-file".into(),
            path.display().to_string(),
            "--metrics-backlog-poll-interval".into(),
            "200ms".into(),
        ],
        ..ProcessorOpts::default()
    };
    Processor::start(redis, gateway, &opts).await
}

/// Writes `ids` into tenant `tenant`'s queue and the queue into the index.
async fn submit_as(redis: &RedisServer, tenant: &str, ids: &[&str]) {
    let queue = format!("{PREFIX}{tenant}");
    let p = producer(redis, &queue).await;
    for id in ids {
        p.submit(request(id, 600, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    let mut c = con(redis).await;
    let _: i64 = redis::cmd("ZADD")
        .arg(INDEX)
        .arg(inferq_client::producer::unix_ms())
        .arg(&queue)
        .query_async(&mut c)
        .await
        .unwrap();
}

/// The value of the series `name{labels}` on `page`, if it is there.
fn value(page: &str, series: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// Reads `/metrics` until `check` holds for it, for at most `within`; the last page read.
async fn page_until(p: &Processor, within: Duration, check: impl Fn(&str) -> bool) -> String {
    let started = Instant::now();
    loop {
        let page = p.metrics().await;
        if check(&page) || started.elapsed() > within {
            return page;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

const CLAIM_DEPTH_A: &str = r#"llm_d_async_async_claim_depth{pool_name="default",queue_id="inferq-tenant:team-a",queue_name="inferq-tenant:team-a"}"#;

/// The operator's report (issue 44): `claim_depth` of a tenant queue still read 2 long after
/// its work ended, while `inferq status` said 0 claimed. Its lane was retired (the queue went
/// idle) between two renewals, and nothing set the gauge again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_tenant_lane_leaves_no_stale_claim_depth() {
    let redis = RedisServer::start().unwrap();
    let gateway = Gateway::start().await;
    // Both requests take 2.5 s: the renewal every lease / 3 (2 s) counts them held.
    for id in ["a-1", "a-2"] {
        gateway.script(
            id,
            vec![Reply::ok(r#"{"choices":[]}"#).after(Duration::from_millis(2500))],
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let p = fair_processor(&redis, &gateway, 1000, 6.0, &dir).await;
    // The policy's own families, from start-up: the tenant its weights name at 0 served.
    let page = p.metrics().await;
    assert_eq!(value(&page, SERVED_A), Some(0.0), "{page}");
    assert_eq!(value(&page, WEIGHT_A), Some(3.0), "{page}");
    assert_eq!(
        value(&page, "inferq_fair_share_default_weight"),
        Some(1.0),
        "{page}"
    );
    assert_eq!(value(&page, TENANTS), Some(0.0), "{page}");
    submit_as(&redis, "team-a", &["a-1", "a-2"]).await;
    let page = page_until(&p, Duration::from_secs(10), |page| {
        value(page, CLAIM_DEPTH_A) == Some(2.0)
    })
    .await;
    assert_eq!(value(&page, CLAIM_DEPTH_A), Some(2.0), "{page}");
    // The found queue's backlog is polled as a listed queue's is.
    assert_eq!(value(&page, BACKLOG_A), Some(0.0), "{page}");
    assert_eq!(value(&page, TENANTS), Some(1.0), "{page}");
    let mut c = con(&redis).await;
    let done = crate::common::wait_results(&mut c, 2, Duration::from_secs(20)).await;
    assert_eq!(done.len(), 2, "{}", p.log());
    // The entry goes idle after 1 s and the lane is retired; a renewal would come 2 s on.
    let page = page_until(&p, Duration::from_secs(6), |page| {
        value(page, CLAIM_DEPTH_A).unwrap_or(0.0) == 0.0
    })
    .await;
    assert_eq!(
        value(&page, CLAIM_DEPTH_A).unwrap_or(0.0),
        0.0,
        "claim depth after the work ended and the lane retired:\n{page}\n{}",
        p.log()
    );
    // No backlog reading of a lane that no longer runs; the tenant's requests counted served.
    assert_eq!(value(&page, BACKLOG_A), None, "{page}");
    assert_eq!(value(&page, SERVED_A), Some(2.0), "{page}");
    assert_eq!(value(&page, TENANTS), Some(0.0), "{page}");
}

const BACKLOG_A: &str = r#"llm_d_async_async_broker_backlog{pool_name="default",queue_id="inferq-tenant:team-a",queue_name="inferq-tenant:team-a"}"#;
const SERVED_A: &str = r#"inferq_fair_share_served_total{pool_name="default",tenant="team-a"}"#;
const WEIGHT_A: &str = r#"inferq_fair_share_weight{tenant="team-a"}"#;
const TENANTS: &str = "inferq_fair_share_tenants_with_work";
