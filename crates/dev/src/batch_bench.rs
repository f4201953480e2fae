//! `inferq-dev bench-batch`: the Batch API measured against a reference in the same run. One
//! Redis, the simulator and one `inferq run` serve both runs:
//!
//! 1. reference: the same lines through `inferq submit` (it reads OpenAI batch input lines),
//!    timed from the start of the submit until every result is on the result list;
//! 2. the Batch API: upload, create, and the batch polled until it completes, timed from the
//!    start of the upload; ingestion timed from the batch turning `in_progress` until every
//!    line is on the queue; then the output file downloaded.
//!
//! It prints each figure, the ratio of the two drains, and the replica's peak RSS (`VmHWM`).
//! With `--ingest-only`, a third run measures what Redis alone takes in: the same lines' three
//! commands each (the cancel marker's `DEL`, the active marker's `SET`, the `ZADD` of the line),
//! pipelined a thousand lines a round trip with no script and no replica in between. Batch
//! ingestion is printed as a ratio to it. It is a reference, not a ceiling: with `appendfsync
//! always` Redis fsyncs once per event-loop turn, and a script call of a hundred lines is one
//! turn, so batch ingestion can beat it.

use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use inferq::cli::Failure;
use inferq_chaos::batch::{batch_file, retrieve, BatchDeployment};
use inferq_testkit::Fsync;
use redis::AsyncCommands;

#[derive(Debug, clap::Args)]
pub(crate) struct BatchBenchArgs {
    /// Lines in the batch.
    #[arg(long, default_value_t = 50_000)]
    pub lines: usize,
    /// Filler bytes in each line's prompt (3,840 makes 50,000 lines just under 200 MB, the default limit).
    #[arg(long, default_value_t = 3_840)]
    pub pad: usize,
    /// Workers of the processor.
    #[arg(long, default_value_t = 128)]
    pub concurrency: u32,
    /// Measure only upload, validation and ingestion, with no processor running (the rate the
    /// Batch API and Redis reach on their own).
    #[arg(long)]
    pub ingest_only: bool,
    /// Redis's `appendfsync` for the run: `always` (every write on disk before it is answered,
    /// as the chaos tests run) or `everysec` (Redis's default).
    #[arg(long, default_value = "always")]
    pub fsync: Fsync,
    /// Fair share across tenants instead (see `tenants_bench`): today's one queue against
    /// `--queue-per-tenant` with the `fair-share` policy.
    #[arg(long)]
    pub tenants: bool,
    /// The simulator's latency per request, in ms (`--tenants`; the plain run uses 1 ms).
    #[arg(long, default_value_t = 20)]
    pub ttft_ms: u64,
    /// With `--tenants`: how long after A's batch tenant B posts its own.
    #[arg(long, default_value = "5s", value_parser = humantime_secs)]
    pub b_after: Duration,
    /// With `--tenants`: tenants holding work in the Redis-calls run.
    #[arg(long, default_value_t = 1000)]
    pub tenant_count: usize,
    /// With `--tenants`: requests of each tenant in the Redis-calls run.
    #[arg(long, default_value_t = 20)]
    pub tenant_lines: usize,
    /// With `--tenants`: the `fair-share` policy's `burst` (default: the policy's own).
    #[arg(long)]
    pub burst: Option<usize>,
    /// With `--tenants`: rounds of the Redis-calls run (today, then fair share, each round).
    #[arg(long, default_value_t = 3)]
    pub calls_rounds: usize,
    /// With `--tenants`: only the Redis-calls run (step 5).
    #[arg(long)]
    pub calls_only: bool,
}

/// A duration such as `5s` or `500ms`.
fn humantime_secs(text: &str) -> Result<Duration, String> {
    let (n, unit) = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((text, "s"), |at| text.split_at(at));
    let n: f64 = n
        .parse()
        .map_err(|_| format!("{text:?} is not a duration such as 5s"))?;
    match unit {
        "s" => Ok(Duration::from_secs_f64(n)),
        "ms" => Ok(Duration::from_secs_f64(n / 1000.0)),
        _ => Err(format!("{text:?} is not a duration such as 5s or 500ms")),
    }
}

fn peak_rss_mib(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

async fn wait_for(
    what: &str,
    within: Duration,
    mut done: impl AsyncFnMut() -> anyhow::Result<bool>,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while started.elapsed() < within {
        if done().await? {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Err(anyhow!("{what} did not happen within {within:?}"))
}

pub(crate) async fn bench_batch(args: BatchBenchArgs) -> Result<(), Failure> {
    if args.tenants {
        return super::tenants_bench::bench_tenants(args).await;
    }
    let exe = inferq_testkit::inferq_binary()?;
    let dir = tempfile::Builder::new()
        .prefix("inferq-bench-batch-")
        .tempdir()
        .context("data dir")?;
    let fail = |e: Box<dyn std::error::Error + Send + Sync>| anyhow!("{e}");
    let mut d = BatchDeployment::start(exe.clone(), dir.path().to_owned(), 1, args.fsync)
        .await
        .map_err(fail)?;
    d.processor_flags = vec!["--concurrency".into(), args.concurrency.to_string()];
    if !args.ingest_only {
        d.add_processor().map_err(fail)?;
    }
    let text = batch_file(0, args.lines, args.pad);
    let mb = text.len() as f64 / 1e6;
    let input = dir.path().join("input.jsonl");
    std::fs::write(&input, &text).context("write input")?;
    say!(
        "inferq-dev bench-batch: {} lines, {mb:.1} MB, 1 processor with {} workers",
        args.lines,
        args.concurrency
    );
    let client = redis::Client::open(d.redis.url()).context("redis")?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .context("redis")?;
    let (_, fsync): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("appendfsync")
        .query_async(&mut con)
        .await
        .context("CONFIG GET appendfsync")?;
    say!("redis       appendfsync {fsync}");

    let n = args.lines as u64;
    let reference = if args.ingest_only {
        Duration::ZERO
    } else {
        reference(&d, &exe, &input, n, &mut con).await?
    };

    // 2. The Batch API.
    let base = d.add_replica().await.map_err(fail)?;
    let pid = d.replicas[0].0.id();
    let started = Instant::now();
    let id = inferq_chaos::batch::submit(&base, text, "24h")
        .await
        .map_err(fail)?;
    let uploaded = started.elapsed();
    let key = format!("{{inferq-batch}}:batch:{id}");
    let c3 = con.clone();
    let k3 = key.clone();
    wait_for("in_progress", Duration::from_secs(300), async || {
        let mut c = c3.clone();
        Ok(c.hget::<_, _, Option<String>>(&k3, "status")
            .await?
            .as_deref()
            != Some("validating"))
    })
    .await?;
    let validated = started.elapsed();
    wait_for("ingestion", Duration::from_secs(300), async || {
        let mut c = c3.clone();
        let (ingested, total): (Option<u64>, Option<u64>) = redis::cmd("HMGET")
            .arg(&k3)
            .arg("ingested")
            .arg("total")
            .query_async(&mut c)
            .await?;
        Ok(total.is_some() && ingested >= total
            || c.hget::<_, _, Option<String>>(&k3, "sealed")
                .await?
                .is_some())
    })
    .await?;
    let ingested = started.elapsed();
    let ingest_s = (ingested - validated).as_secs_f64();
    say!("batch api   upload {:.2} s ({:.0} MB/s), validation {:.2} s, ingestion {:.2} s ({:.0} lines/s)", uploaded.as_secs_f64(), mb / uploaded.as_secs_f64(), (validated - uploaded).as_secs_f64(), ingest_s, n as f64 / ingest_s);
    if args.ingest_only {
        say!(
            "peak RSS    batch-api replica {:.1} MiB",
            peak_rss_mib(pid).unwrap_or(f64::NAN)
        );
        let text = std::fs::read_to_string(&input).context("read input")?;
        let alone = redis_alone(&text, &mut con).await?.as_secs_f64();
        say!(
            "redis alone {alone:.2} s ({:.0} lines/s); batch ingestion / redis alone = {:.3}",
            n as f64 / alone,
            alone / ingest_s
        );
        return Ok(());
    }
    let b3 = base.clone();
    let i3 = id.clone();
    wait_for("completion", Duration::from_secs(900), async || {
        let b = retrieve(&b3, &i3).await.map_err(|e| anyhow!("{e}"))?;
        Ok(b["status"] == "completed")
    })
    .await?;
    let drained = started.elapsed();
    let batch = retrieve(&base, &id).await.map_err(fail)?;
    let out_id = batch["output_file_id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let t = Instant::now();
    let output = reqwest::get(format!("{base}/files/{out_id}/content"))
        .await
        .context("download")?
        .bytes()
        .await
        .context("download")?;
    let downloaded = t.elapsed();
    let rss = peak_rss_mib(pid).unwrap_or(f64::NAN);
    say!(
        "batch api   drain {:.2} s (upload to completed), output {:.1} MB downloaded in {:.2} s",
        drained.as_secs_f64(),
        output.len() as f64 / 1e6,
        downloaded.as_secs_f64()
    );
    say!(
        "batch api   completed {} failed {}",
        batch["request_counts"]["completed"],
        batch["request_counts"]["failed"]
    );
    say!(
        "ratio       batch drain / submit drain = {:.3}",
        drained.as_secs_f64() / reference.as_secs_f64()
    );
    say!("peak RSS    batch-api replica {rss:.1} MiB");
    Ok(())
}

/// The reference: each line's three commands straight into Redis, pipelined a thousand lines a
/// round trip, on keys of their own (`bench-redis-alone:*`).
async fn redis_alone(
    text: &str,
    con: &mut redis::aio::MultiplexedConnection,
) -> Result<Duration, Failure> {
    let started = Instant::now();
    let mut pipe = redis::pipe();
    let mut lines = text.lines().enumerate().peekable();
    while let Some((i, line)) = lines.next() {
        pipe.del(format!("bench-redis-alone:cancel:{i}")).ignore();
        pipe.cmd("SET")
            .arg(format!("bench-redis-alone:active:{i}"))
            .arg(i)
            .arg("PX")
            .arg(86_400_000)
            .ignore();
        pipe.zadd("bench-redis-alone:q", line, 1.9e9).ignore();
        if (i + 1) % 1000 == 0 || lines.peek().is_none() {
            let _: () = pipe.query_async(con).await.context("redis alone")?;
            pipe.clear();
        }
    }
    Ok(started.elapsed())
}

/// The reference: `inferq submit` of the same lines, then every result on the list.
async fn reference(
    d: &BatchDeployment,
    exe: &std::path::Path,
    input: &std::path::Path,
    n: u64,
    con: &mut redis::aio::MultiplexedConnection,
) -> Result<Duration, Failure> {
    let started = Instant::now();
    let out = tokio::process::Command::new(exe)
        .args([
            "submit",
            "--redis-url",
            &d.redis.url(),
            "--queue",
            "batch-q",
            "--result-queue",
            "bench-results",
            "--default-timeout-s",
            "3600",
            "-f",
        ])
        .arg(input)
        .output()
        .await
        .context("inferq submit")?;
    if !out.status.success() {
        return Err(Failure::from(anyhow!(
            "inferq submit failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let submitted = started.elapsed();
    let c2 = con.clone();
    wait_for(
        "the reference drain",
        Duration::from_secs(900),
        async || {
            let mut c = c2.clone();
            Ok(c.llen::<_, u64>("bench-results").await? >= n)
        },
    )
    .await?;
    let reference = started.elapsed();
    let _: () = con.del("bench-results").await.context("redis")?;
    say!(
        "reference   submit {:.2} s ({:.0} lines/s), drain {:.2} s",
        submitted.as_secs_f64(),
        n as f64 / submitted.as_secs_f64(),
        reference.as_secs_f64()
    );
    Ok(reference)
}
