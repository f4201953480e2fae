//! The front door driven by the official `openai` Python SDK (`tests/api/front_sdk.py`): live,
//! passthrough, wait, a wait's stream, enqueue, a joined id, a conflict, GET, DELETE, the
//! errors and the models, against a real deployment with API keys (two replicas, one processor
//! and the simulator) on a standalone Redis, a Redis Cluster and behind Sentinel. The SDK comes
//! from the venv `scripts/ensure-openai.sh` makes; `$INFERQ_PYTHON` names its python
//! (scripts/test.sh sets it). Without it the test fails, saying how to get it.

use serde_json::json;

use crate::common::{Deployment, Fallible};
use inferq_testkit::{RedisCluster, SentinelSet};

const KEY: (&str, &str) = ("INFERQ_KEY_A", "sk-tenant-a-0123456789");

/// Starts the processor and two replicas with keys and a route for model `m`, then runs the
/// SDK script.
async fn sdk_checks(mut d: Deployment) -> Fallible {
    d.keys(r#"{"sk-tenant-a-0123456789":"a"}"#)?;
    let broker = d.dir.path().join("broker.yaml");
    std::fs::write(&broker, "default_queue: batch-q\nroutes: [{model: m}]\n")?;
    d.extra_flags
        .extend(["--broker-config".to_owned(), broker.display().to_string()]);
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    d.run_sdk("front_sdk.py", &[KEY]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_speaks_the_routers_contract_to_the_front_door() -> Fallible {
    sdk_checks(Deployment::start(300).await?).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_speaks_the_routers_contract_on_a_redis_cluster() -> Fallible {
    let cluster = RedisCluster::start()?;
    let d = Deployment::start(300).await?;
    let addrs: Vec<String> = cluster.addrs()[1..].to_vec();
    d.point_at(json!({"url": cluster.seed_urls()[0], "mode": "cluster", "addrs": addrs}))?;
    sdk_checks(d).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_speaks_the_routers_contract_behind_sentinel() -> Fallible {
    let set = SentinelSet::start("inferq-front-sdk")?;
    let d = Deployment::start(300).await?;
    d.point_at(json!({
        "url": set.sentinel_urls()[0],
        "mode": "sentinel",
        "master_name": "inferq-front-sdk",
        "addrs": set.sentinel_addrs()[1..].to_vec(),
        "replica_wait": 1,
    }))?;
    sdk_checks(d).await
}

/// The SDK's default retries at a passed deadline (issue 44): the front door answers 504 and
/// the `openai` SDK (max_retries=2) tries twice more. With an `X-Request-Id` every retry joins
/// the same request (its 504 is kept for the fetch grace), so the gateway runs it once; without
/// one each retry is a new request, which is why the book's SDK examples pass an id (or
/// max_retries=0 to wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_retries_at_a_passed_deadline_run_the_work_once_with_a_request_id() -> Fallible {
    let mut d = Deployment::start(3000).await?;
    d.keys(r#"{"sk-tenant-a-0123456789":"a"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let out = d
        .sdk_output("retry_sdk.py", &[KEY, ("INFERQ_CASE", "keyed")])
        .await?;
    // Whatever the processor still had in hand has reached the gateway by now.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(d.sim.total_requests(), 1, "{out}\n{}", d.logs());
    let out = d
        .sdk_output("retry_sdk.py", &[KEY, ("INFERQ_CASE", "unkeyed")])
        .await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        d.sim.total_requests() >= 3,
        "without an id each retry is new work: {} runs\n{out}",
        d.sim.total_requests()
    );
    Ok(())
}
