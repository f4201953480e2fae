//! What a tenant is promised beyond a single batch, against real deployments and through the
//! official `openai` SDK: its bound on lines not yet finished (429 past it, nothing left behind,
//! taken again once the work finishes), `usage` summed from the results and live while a batch
//! runs, OpenAI's metadata limits, expiry and retention (files, output files and ended batches
//! removed with their objects and keys, exactly once across two sweeping replicas, and orphaned
//! objects swept), and durable acceptance: a batch answered behind Sentinel with `replica_wait`
//! survives the master's death right after.

use std::time::Duration;

use inferq_testkit::SentinelSet;
use redis::AsyncCommands;

use crate::common::{start_batch, until, wait_ended, Deployment, Fallible};

/// The value of `series` on a metrics page (0 when absent).
fn series(page: &str, series: &str) -> u64 {
    page.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_refuse_then_accept_usage_is_live_and_metadata_is_bounded() -> Fallible {
    let mut d = Deployment::start(100).await?;
    d.keys(
        r#"{"sk-tenant-a-0123456789":{"tenant":"a","weight":2,"max_enqueued_lines":30},
            "sk-tenant-b-0123456789":"b"}"#,
    )?;
    d.extra_flags
        .extend(["--max-enqueued-lines".into(), "50".into()]);
    d.processor_flags = vec!["--concurrency".into(), "2".into()];
    d.add_replica().await?;
    d.add_replica().await?;
    for (i, tenant) in ["a", "b"].into_iter().enumerate() {
        let page = d.metrics(i).await?;
        let at_zero = format!("inferq_batch_limit_refusals_total{{tenant=\"{tenant}\"}} 0");
        assert!(
            page.contains(&at_zero),
            "{at_zero} missing from the start:\n{page}"
        );
    }
    let keys = [
        ("INFERQ_KEY_A", "sk-tenant-a-0123456789"),
        ("INFERQ_KEY_B", "sk-tenant-b-0123456789"),
    ];
    // No processor yet: nothing finishes, so the bounds refuse.
    d.run_sdk(
        "tenants_sdk.py",
        &[keys[0], keys[1], ("INFERQ_PHASE", "refuse")],
    )
    .await?;
    let a = series(
        &d.metrics(0).await?,
        "inferq_batch_limit_refusals_total{tenant=\"a\"}",
    );
    let b = series(
        &d.metrics(1).await?,
        "inferq_batch_limit_refusals_total{tenant=\"b\"}",
    );
    assert_eq!((a, b), (2, 1), "refusals counted per tenant");
    d.add_processor()?;
    d.run_sdk(
        "tenants_sdk.py",
        &[keys[0], keys[1], ("INFERQ_PHASE", "accept")],
    )
    .await?;
    // Every line finished: no tenant holds any.
    let mut con = d.redis.connection().await?;
    let held: std::collections::HashMap<String, i64> =
        con.hgetall("{inferq-batch}:enqueued").await?;
    assert!(held.values().all(|n| *n == 0), "lines still held: {held:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_files_and_batches_go_with_their_objects_once_and_orphans_are_swept() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.extra_flags = [
        "--min-expires-after",
        "1s",
        "--file-retention",
        "6s",
        "--batch-retention",
        "3s",
        "--sweep-interval",
        "1s",
        "--orphan-grace",
        "2s",
    ]
    .map(String::from)
    .to_vec();
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    // An object no key names: a replica killed between writing it and recording it.
    let objects = d.files_dir().join("files");
    std::fs::create_dir_all(&objects)?;
    let orphan = objects.join("file-orphan0000000000000000000");
    std::fs::write(&orphan, "{}\n")?;
    let out = d.sdk_output("expiry_sdk.py", &[]).await?;
    let made: serde_json::Value = out
        .lines()
        .find_map(|l| l.strip_prefix("made: "))
        .map(serde_json::from_str)
        .transpose()?
        .unwrap_or_default();
    let files: Vec<String> = serde_json::from_value(made["files"].clone())?;
    assert_eq!(files.len(), 3, "{out}");
    for id in &files {
        assert!(
            !objects.join(id).exists(),
            "the object of {id} is still stored"
        );
    }
    until(
        "the orphan swept",
        Duration::from_secs(10),
        Duration::from_millis(200),
        async || Ok((!orphan.exists()).then_some(())),
    )
    .await?;
    // No key of them is left, and each was removed by exactly one replica.
    let mut con = d.redis.connection().await?;
    let left: Vec<String> = con.keys("{inferq-batch}:*").await?;
    let left: Vec<&String> = left
        .iter()
        .filter(|k| {
            files.iter().any(|f| k.ends_with(f.as_str()))
                || made["batch"].as_str().is_some_and(|b| k.contains(b))
        })
        .collect();
    assert!(left.is_empty(), "keys left: {left:?}");
    let expiries: Vec<String> = con.zrange("{inferq-batch}:expiries", 0, -1).await?;
    assert!(expiries.is_empty(), "{expiries:?}");
    // A replica counts a removal once its script has run, so the keys can be gone an instant
    // before the counters move: wait for the counts asserted, not for the keys.
    let sum = |p0: &str, p1: &str, kind: &str| {
        let s = format!("inferq_batch_swept_total{{kind=\"{kind}\"}}");
        series(p0, &s) + series(p1, &s)
    };
    let (p0, p1) = until(
        "the removals counted",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let (p0, p1) = (d.metrics(0).await?, d.metrics(1).await?);
            let counted = sum(&p0, &p1, "file") >= 3
                && sum(&p0, &p1, "batch") >= 1
                && sum(&p0, &p1, "orphan") >= 1;
            Ok(counted.then_some((p0, p1)))
        },
    )
    .await?;
    assert_eq!(
        (sum(&p0, &p1, "file"), sum(&p0, &p1, "batch")),
        (3, 1),
        "each removed once\n{p0}\n{p1}"
    );
    assert!(sum(&p0, &p1, "orphan") >= 1, "{p0}\n{p1}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_answered_with_replica_wait_survives_its_master_killed_right_after() -> Fallible {
    let mut set = SentinelSet::start("inferq-accept")?;
    let mut d = Deployment::start(5).await?;
    d.point_at(serde_json::json!({
        "url": set.sentinel_urls()[0],
        "mode": "sentinel",
        "master_name": "inferq-accept",
        "addrs": set.sentinel_addrs()[1..].to_vec(),
        "replica_wait": 1,
    }))?;
    d.add_replica().await?;
    d.add_replica().await?;
    let id = start_batch(&d.url(0), 20).await?;
    // Answered: the replica holds it. Kill the master at once (no time to replicate later).
    let killed = tokio::task::block_in_place(|| set.kill_master())?;
    tokio::task::block_in_place(|| set.wait_for_new_master(killed, Duration::from_secs(30)))?;
    d.add_processor()?;
    let bases = vec![d.url(0), d.url(1)];
    let ended = wait_ended(&bases, &id, Duration::from_secs(90))
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    assert_eq!(ended["status"], "completed", "{ended}\n{}", d.logs());
    assert_eq!(ended["request_counts"]["completed"], 20, "{ended}");
    Ok(())
}
