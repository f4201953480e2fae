//! The Batch API behind Redis Sentinel (a master, a replica, three sentinels): replicas and
//! processors find the master through the sentinels. In the middle of one batch, a forced
//! fail-over, then a SIGKILL of the new master: both are followed, the batch still ends
//! `completed` with exactly one line per `custom_id`, and every replica is ready again.

use std::time::Duration;

use crate::common::{lines_per_id, start_batch, wait_ended, Deployment, Fallible};
use crate::durability::{every_id_once, until_completed};
use inferq_testkit::SentinelSet;

/// Waits until `at_least` lines of the batch are done; fails if the batch had finished.
async fn until_done(d: &Deployment, id: &str, at_least: u64, n: u64) -> Fallible {
    let done = until_completed(&d.url(1), id, at_least, Duration::from_secs(60)).await?;
    assert!(
        done < n,
        "the batch was over before the fault ({done} lines)"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failover_and_a_killed_master_mid_batch_lose_and_double_no_line() -> Fallible {
    let n = 2000;
    let mut set = SentinelSet::start("inferq-batch")?;
    let mut d = Deployment::start(20).await?;
    d.point_at(serde_json::json!({
        "url": set.sentinel_urls()[0],
        "mode": "sentinel",
        "master_name": "inferq-batch",
        "addrs": set.sentinel_addrs()[1..].to_vec(),
        "replica_wait": 1,
    }))?;
    d.processor_flags = vec!["--concurrency".into(), "16".into()];
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let id = start_batch(&d.url(0), n).await?;
    until_done(&d, &id, 200, n as u64).await?;
    let first = set.master_port()?;
    let second = tokio::task::block_in_place(|| set.failover())?;
    assert_ne!(first, second, "the sentinels kept the old master");
    until_done(&d, &id, 600, n as u64).await?;
    let killed = tokio::task::block_in_place(|| set.kill_master())?;
    let third =
        tokio::task::block_in_place(|| set.wait_for_new_master(killed, Duration::from_secs(30)))?;
    assert_eq!(third, first, "the old master, now a replica, is promoted");
    let bases = vec![d.url(0), d.url(1)];
    let ended = wait_ended(&bases, &id, Duration::from_secs(120))
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    assert_eq!(ended["status"], "completed", "{ended}\n{}", d.logs());
    assert_eq!(ended["request_counts"]["completed"], n, "{ended}");
    every_id_once(&lines_per_id(&d.url(1), &ended).await?, n);
    for (_, port) in &d.replicas {
        let ready = reqwest::get(format!("http://127.0.0.1:{port}/readyz")).await?;
        assert!(ready.status().is_success(), "{}", d.logs());
    }
    Ok(())
}
