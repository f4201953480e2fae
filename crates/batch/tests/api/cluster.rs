//! The Batch API on a Redis Cluster (3 masters, a replica each): its keys share the slot of
//! `{inferq-batch}`, so every Lua move stays atomic; lines go through the producer's cluster
//! submit (their markers live in other slots). A batch runs end to end, then a cancel.

use std::time::Duration;

use crate::common::{lines_per_id, start_batch, wait_ended, Deployment, Fallible};
use inferq_testkit::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_on_a_redis_cluster() -> Fallible {
    let cluster = RedisCluster::start()?;
    let mut d = Deployment::start(5).await?;
    let addrs: Vec<String> = cluster.addrs()[1..].to_vec();
    d.point_at(
        serde_json::json!({"url": cluster.seed_urls()[0], "mode": "cluster", "addrs": addrs}),
    )?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let id = start_batch(&d.url(0), 200).await?;
    let ended = wait_ended(&[d.url(1)], &id, Duration::from_secs(60))
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    assert_eq!(ended["status"], "completed", "{ended}\n{}", d.logs());
    assert_eq!(ended["request_counts"]["completed"], 200, "{ended}");
    let seen = lines_per_id(&d.url(0), &ended).await?;
    assert!(
        seen.len() == 200 && seen.values().all(|n| *n == 1),
        "{seen:?}"
    );
    Ok(())
}
