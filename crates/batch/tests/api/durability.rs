//! What the Batch API promises when pods die: exactly one output-or-error line per
//! `custom_id`, and no batch left in `in_progress`, `finalizing` or `cancelling`, across
//! SIGKILLed replicas and processors and a Redis restart; a cancel ends a batch within seconds
//! with its partial output; a window that passes expires it with the rest as `batch_expired`.

use std::time::{Duration, Instant};

use crate::common::{
    chat_lines, create, lines_per_id, start_batch, until, upload, wait_ended, Deployment, Fallible,
};

pub(crate) fn every_id_once(seen: &std::collections::BTreeMap<String, usize>, n: usize) {
    let missing: Vec<String> = (0..n)
        .map(|i| format!("req-{i}"))
        .filter(|id| !seen.contains_key(id))
        .collect();
    let doubled: Vec<(&String, &usize)> = seen.iter().filter(|(_, c)| **c != 1).collect();
    assert!(
        missing.is_empty(),
        "{} custom_ids have no line: {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    assert!(
        doubled.is_empty(),
        "custom_ids with more than one line: {doubled:?}"
    );
    assert_eq!(
        seen.len(),
        n,
        "lines name custom_ids that were never submitted"
    );
}

pub(crate) async fn counts(base: &str, id: &str) -> Fallible<(u64, u64)> {
    let b = crate::common::get(&format!("{base}/batches/{id}")).await?;
    let c = &b["request_counts"];
    Ok((
        c["completed"].as_u64().unwrap_or(0),
        c["failed"].as_u64().unwrap_or(0),
    ))
}

/// Polls the batch until `at_least` of its lines have completed or `within` has passed; returns
/// the count it last saw.
pub(crate) async fn until_completed(
    base: &str,
    id: &str,
    at_least: u64,
    within: Duration,
) -> Fallible<u64> {
    let started = Instant::now();
    loop {
        let done = counts(base, id).await?.0;
        if done >= at_least || started.elapsed() >= within {
            return Ok(done);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kills_and_a_redis_restart_lose_and_double_no_line() -> Fallible {
    let n = 3000;
    let mut d = Deployment::start(20).await?;
    d.processor_flags = vec!["--concurrency".into(), "32".into()];
    d.add_processor()?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let file = upload(&d.url(0), chat_lines(n)).await?;
    let batch = create(&d.url(0), file["id"].as_str().unwrap_or_default(), "24h").await?;
    let id = batch["id"].as_str().unwrap_or_default().to_owned();
    // Replica 0 is likely the steward now (validating or ingesting): kill it.
    tokio::time::sleep(Duration::from_millis(150)).await;
    d.kill_replica(0);
    let survivor = d.url(1);
    // Once results flow, kill a processor in the middle of its work, and start another.
    until_completed(&survivor, &id, 300, Duration::from_secs(60)).await?;
    d.kill_processor(0);
    d.add_processor()?;
    // Then restart Redis (SIGKILL; the AOF, fsync always, brings everything back).
    until_completed(&survivor, &id, 1200, Duration::from_secs(30)).await?;
    d.redis.restart()?;
    // A new replica joins; the survivor and it finish the batch.
    d.add_replica().await?;
    let bases = vec![survivor.clone(), d.url(2)];
    let ended = wait_ended(&bases, &id, Duration::from_secs(180))
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    assert_eq!(ended["status"], "completed", "{ended}\n{}", d.logs());
    let c = &ended["request_counts"];
    assert_eq!(
        (
            c["total"].as_u64(),
            c["completed"].as_u64(),
            c["failed"].as_u64()
        ),
        (Some(n as u64), Some(n as u64), Some(0)),
        "{ended}"
    );
    every_id_once(&lines_per_id(&survivor, &ended).await?, n);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_batch_within_seconds_with_its_partial_output() -> Fallible {
    let n = 400;
    let mut d = Deployment::start(300).await?;
    d.processor_flags = vec!["--concurrency".into(), "8".into()];
    d.add_processor()?;
    d.add_replica().await?;
    let base = d.url(0);
    let id = start_batch(&base, n).await?;
    until_completed(&base, &id, 8, Duration::from_secs(30)).await?;
    let r = reqwest::Client::new()
        .post(format!("{base}/batches/{id}/cancel"))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let cancelling: serde_json::Value = r.json().await?;
    assert_eq!(cancelling["status"], "cancelling", "{cancelling}");
    assert!(cancelling["cancelling_at"].is_i64());
    let asked = Instant::now();
    let ended = wait_ended(std::slice::from_ref(&base), &id, Duration::from_secs(20)).await?;
    let took = asked.elapsed();
    assert_eq!(ended["status"], "cancelled", "{ended}");
    assert!(took < Duration::from_secs(8), "the cancel took {took:?}");
    assert!(
        ended["cancelled_at"].is_i64()
            && ended["output_file_id"].is_string()
            && ended["error_file_id"].is_string(),
        "{ended}"
    );
    let seen = lines_per_id(&base, &ended).await?;
    every_id_once(&seen, n);
    let c = &ended["request_counts"];
    let completed = c["completed"].as_u64().unwrap_or(0);
    assert!(completed >= 8 && completed < n as u64 / 2, "{ended}");
    assert_eq!(c["failed"].as_u64().unwrap_or(0) + completed, n as u64);
    // A second cancel is accepted and changes nothing; the processor stopped working it.
    let again: serde_json::Value = reqwest::Client::new()
        .post(format!("{base}/batches/{id}/cancel"))
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(again["status"], "cancelled");
    Ok(())
}

/// A cancel that comes while a batch's lines are going onto the queue marks every line that
/// went (the round trip then on its way to Redis included) and sends no more; a processor
/// started after the cancel then sends none of them to the gateway.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_mid_ingestion_marks_every_line_it_submitted() -> Fallible {
    use inferq_client::{keys::cancel_key, wire::Envelope};
    use redis::AsyncCommands;
    let n = 20_000;
    let mut d = Deployment::start(50).await?;
    d.add_replica().await?;
    let base = d.url(0);
    let id = start_batch(&base, n).await?;
    let mut con = d.redis.connection().await?;
    let hash = inferq_batch::keys::batch(&id);
    until(
        "a first round trip ingested",
        Duration::from_secs(30),
        Duration::from_millis(2),
        async || {
            let ingested: Option<u64> = con.hget(&hash, "ingested").await?;
            Ok(ingested.filter(|n| *n > 0))
        },
    )
    .await?;
    let r = reqwest::Client::new()
        .post(format!("{base}/batches/{id}/cancel"))
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let ended = wait_ended(std::slice::from_ref(&base), &id, Duration::from_secs(30)).await?;
    assert_eq!(ended["status"], "cancelled", "{ended}");

    let ingested: u64 = con.hget(&hash, "ingested").await?;
    assert!(
        ingested < n as u64,
        "the cancel came after all {n} lines went"
    );
    let members: Vec<Vec<u8>> = con.zrange("batch-q", 0, -1).await?;
    assert_eq!(
        members.len() as u64,
        ingested,
        "lines queued beyond those recorded"
    );
    let mut unmarked = Vec::new();
    for member in &members {
        let env = Envelope::decode(member)?;
        let marker: Option<String> = con.get(cancel_key(&env.request.id)).await?;
        if marker.as_deref() != Some(env.internal.request_token.as_str()) {
            unmarked.push(env.request.id);
        }
    }
    assert!(
        unmarked.is_empty(),
        "{} of {ingested} queued lines have no cancel marker, e.g. {:?}",
        unmarked.len(),
        &unmarked[..unmarked.len().min(5)]
    );

    d.add_processor()?;
    until(
        "the queue drained",
        Duration::from_secs(30),
        Duration::from_millis(50),
        async || {
            let left: u64 = con.zcard("batch-q").await?;
            Ok((left == 0).then_some(()))
        },
    )
    .await?;
    assert_eq!(
        d.sim.total_requests(),
        0,
        "cancelled lines reached the gateway"
    );
    every_id_once(&lines_per_id(&base, &ended).await?, n);
    assert_eq!(ended["request_counts"]["completed"], 0, "{ended}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_passed_window_expires_the_batch_with_the_rest_as_batch_expired() -> Fallible {
    let n = 300;
    let mut d = Deployment::start(250).await?;
    d.extra_flags = vec!["--allow-completion-window".into(), "3s".into()];
    d.processor_flags = vec!["--concurrency".into(), "8".into()];
    d.add_processor()?;
    d.add_replica().await?;
    let base = d.url(0);
    let file = upload(&base, chat_lines(n)).await?;
    let batch = create(&base, file["id"].as_str().unwrap_or_default(), "3s").await?;
    let id = batch["id"].as_str().unwrap_or_default().to_owned();
    assert_eq!(
        batch["expires_at"].as_i64(),
        batch["created_at"].as_i64().map(|c| c + 3)
    );
    let ended = wait_ended(std::slice::from_ref(&base), &id, Duration::from_secs(20)).await?;
    assert_eq!(ended["status"], "expired", "{ended}");
    assert!(ended["expired_at"].is_i64(), "{ended}");
    let seen = lines_per_id(&base, &ended).await?;
    every_id_once(&seen, n);
    let errors = reqwest::get(format!(
        "{base}/files/{}/content",
        ended["error_file_id"].as_str().unwrap_or_default()
    ))
    .await?
    .text()
    .await?;
    let expired = errors
        .lines()
        .filter(|l| l.contains("\"batch_expired\""))
        .count();
    let completed = ended["request_counts"]["completed"].as_u64().unwrap_or(0);
    assert!(completed > 0, "some lines ran within the window: {ended}");
    assert_eq!(
        expired as u64 + completed,
        n as u64,
        "every other line is batch_expired"
    );
    Ok(())
}
