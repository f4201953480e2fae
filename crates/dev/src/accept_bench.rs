//! `inferq-dev bench-batch-wait`: the cost of durable acceptance on Batch API ingestion. One
//! Redis primary (AOF) with one replica, no processor (so ingestion alone is timed), and the
//! same batch ingested twice by a fresh `inferq batch-api` replica each time:
//!
//! 1. reference: the transport config without `replica_wait`;
//! 2. with `replica_wait: 1`: each ingestion round trip (a thousand lines) waits for the
//!    replica (`WAIT`) before the next, and the create before it is answered.
//!
//! Each run is timed from the batch turning `in_progress` until every line is on the queue; the
//! create's answer is timed too. It prints both runs' lines/s and the ratio.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use inferq::cli::Failure;
use inferq_chaos::batch::{batch_file, BatchDeployment};
use inferq_testkit::{Fsync, RedisServer};
use redis::AsyncCommands;

#[derive(Debug, clap::Args)]
pub(crate) struct AcceptBenchArgs {
    /// Lines in the batch.
    #[arg(long, default_value_t = 20_000)]
    pub lines: usize,
    /// Filler bytes in each line's prompt.
    #[arg(long, default_value_t = 1_000)]
    pub pad: usize,
    /// Redis's `appendfsync` on the primary.
    #[arg(long, default_value = "everysec")]
    pub fsync: Fsync,
}

/// One run's figures.
struct Run {
    create: Duration,
    ingest: Duration,
}

pub(crate) async fn bench_batch_wait(args: AcceptBenchArgs) -> Result<(), Failure> {
    let exe = inferq_testkit::inferq_binary()?;
    let dir = tempfile::Builder::new()
        .prefix("inferq-bench-wait-")
        .tempdir()
        .context("data dir")?;
    let fail = |e: Box<dyn std::error::Error + Send + Sync>| anyhow!("{e}");
    let mut d = BatchDeployment::start(exe, dir.path().to_owned(), 1, args.fsync)
        .await
        .map_err(fail)?;
    let replica = RedisServer::start_with_args(vec![
        "--replicaof".into(),
        "127.0.0.1".into(),
        d.redis.port().to_string(),
    ])
    .context("the Redis replica")?;
    let client = redis::Client::open(d.redis.url()).context("redis")?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .context("redis")?;
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await
            .context("INFO replication")?;
        if info.contains("state=online") {
            break;
        }
        if started.elapsed() > Duration::from_secs(30) {
            return Err(Failure::from(anyhow!("the replica did not catch up")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let text = batch_file(0, args.lines, args.pad);
    say!(
        "inferq-dev bench-batch-wait: {} lines, {:.1} MB, primary (appendfsync {:?}) + 1 replica (port {}), no processor",
        args.lines,
        text.len() as f64 / 1e6,
        args.fsync,
        replica.port()
    );
    let mut runs = Vec::new();
    for (i, wait) in [None, Some(1)].into_iter().enumerate() {
        let mut config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&d.config).context("config")?)
                .context("config")?;
        if let Some(n) = wait {
            config["replica_wait"] = n.into();
        }
        std::fs::write(&d.config, config.to_string()).context("config")?;
        let base = d.add_replica().await.map_err(fail)?;
        let run = one_run(&base, text.clone(), &mut con).await?;
        let label = if wait.is_some() {
            "replica_wait"
        } else {
            "reference   "
        };
        say!(
            "{label}  create answered in {:.1} ms, ingestion {:.2} s ({:.0} lines/s)",
            run.create.as_secs_f64() * 1e3,
            run.ingest.as_secs_f64(),
            args.lines as f64 / run.ingest.as_secs_f64()
        );
        let _ = d.replicas[i].0.kill();
        let _ = d.replicas[i].0.wait();
        // Each run starts on an empty queue; UNLINK frees it apart, on the replica too.
        let _: () = con.unlink("batch-q").await.context("redis")?;
        runs.push(run);
    }
    if let [reference, waited] = runs.as_slice() {
        say!(
            "ratio        ingestion lines/s with replica_wait / without = {:.3}",
            reference.ingest.as_secs_f64() / waited.ingest.as_secs_f64()
        );
    }
    Ok(())
}

/// Uploads and creates the batch, and times its create and its ingestion.
async fn one_run(
    base: &str,
    text: String,
    con: &mut redis::aio::MultiplexedConnection,
) -> Result<Run, Failure> {
    let http = reqwest::Client::new();
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(text).file_name("in.jsonl"),
        );
    let file = http
        .post(format!("{base}/files"))
        .multipart(form)
        .send()
        .await
        .context("upload")?
        .bytes()
        .await
        .context("upload")?;
    let file: serde_json::Value = serde_json::from_slice(&file).context("upload")?;
    let t = Instant::now();
    let body = serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let batch = http
        .post(format!("{base}/batches"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .context("create")?
        .bytes()
        .await
        .context("create")?;
    let create = t.elapsed();
    let batch: serde_json::Value = serde_json::from_slice(&batch).context("create")?;
    let id = batch["id"]
        .as_str()
        .ok_or_else(|| anyhow!("create: {batch}"))?;
    let key = format!("{{inferq-batch}}:batch:{id}");
    let mut began: Option<Instant> = None;
    let limit = Instant::now() + Duration::from_secs(600);
    while Instant::now() < limit {
        let (status, ingested, total): (Option<String>, Option<u64>, Option<u64>) =
            redis::cmd("HMGET")
                .arg(&key)
                .arg("status")
                .arg("ingested")
                .arg("total")
                .query_async(con)
                .await
                .context("redis")?;
        if began.is_none() && status.as_deref() != Some("validating") {
            began = Some(Instant::now());
        }
        if let (Some(b), Some(n), Some(total)) = (began, ingested, total) {
            if n >= total {
                return Ok(Run {
                    create,
                    ingest: b.elapsed(),
                });
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Err(Failure::from(anyhow!(
        "batch {id} was not ingested in time"
    )))
}
