//! The cost of a replica wait on submissions: a primary (AOF everysec) and one replica started
//! here, then `inferq submit` of N requests from a JSONL file with `--replica-wait 0` and with
//! `--replica-wait 1`, each twice (alternating, the faster kept), timed from start to exit. In: N and the scratch
//! folder; out: a [`ReplicaWaitCost`].

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use super::report::{ReplicaWaitCost, Submit};
use crate::procs::inferq_binary;
use crate::BenchError;
use inferq_testkit::RedisServer;

/// `submit --batch`: the CLI's default, one `WAIT` per batch.
const BATCH: u64 = 500;

/// How long the replica may take to link up.
const LINK_LIMIT: Duration = Duration::from_secs(30);

fn server(args: Vec<String>) -> Result<RedisServer, BenchError> {
    let mut all: Vec<String> = [
        "--appendfsync",
        "everysec",
        "--repl-diskless-sync-delay",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    all.extend(args);
    Ok(RedisServer::start_with_args(all)?)
}

/// Waits until the replica's link to its primary is up.
async fn linked(replica: &RedisServer) -> Result<(), BenchError> {
    let mut con = replica.connection().await?;
    let started = Instant::now();
    loop {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut con)
            .await?;
        if info.lines().any(|l| l.trim() == "master_link_status:up") {
            return Ok(());
        }
        if started.elapsed() > LINK_LIMIT {
            return Err(BenchError::Phase(format!(
                "the replica did not link up with its primary in {} s:\n{}",
                LINK_LIMIT.as_secs(),
                replica.log_tail(15)
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `inferq submit -f FILE --replica-wait WAIT` against `url`, timed.
async fn submit(url: &str, file: &Path, wait: u32, n: u64) -> Result<Submit, BenchError> {
    let mut command = tokio::process::Command::new(inferq_binary()?);
    command
        .arg("submit")
        .args(["--redis-url", url, "--batch", &BATCH.to_string()])
        .args(["--replica-wait", &wait.to_string()])
        .arg("--file")
        .arg(file)
        .stdin(std::process::Stdio::null());
    let started = Instant::now();
    let out = command
        .output()
        .await
        .map_err(|e| BenchError::setup("cannot run inferq submit", e))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        return Err(BenchError::Phase(format!(
            "inferq submit --replica-wait {wait} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(Submit {
        replica_wait: wait,
        seconds,
        requests_per_s: n as f64 / seconds,
        us_per_request: seconds * 1e6 / n as f64,
    })
}

/// Measures the cost of `--replica-wait 1` on `n` submissions.
pub(super) async fn run(dir: &Path, n: u64) -> Result<ReplicaWaitCost, BenchError> {
    let primary = tokio::task::spawn_blocking(|| server(Vec::new()))
        .await
        .map_err(|e| BenchError::Phase(format!("starting the primary: {e}")))??;
    let of = vec![
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        primary.port().to_string(),
    ];
    let replica = tokio::task::spawn_blocking(move || server(of))
        .await
        .map_err(|e| BenchError::Phase(format!("starting the replica: {e}")))??;
    linked(&replica).await?;

    // Each setting twice, alternating, the faster of the two kept: the first submit of a run
    // also pays for cold caches.
    let mut best: [Option<Submit>; 2] = [None, None];
    let mut con = primary.connection().await?;
    for round in 0..2 {
        for wait in [0u32, 1] {
            let file = dir.join(format!("replica-wait-{round}-{wait}.jsonl"));
            write_requests(&file, &format!("wait{round}{wait}"), n)?;
            let s = submit(&primary.url(), &file, wait, n).await?;
            let queued: u64 = redis::cmd("ZCARD")
                .arg("request-sortedset")
                .query_async(&mut con)
                .await?;
            if queued != n {
                return Err(BenchError::Phase(format!(
                    "inferq submit --replica-wait {wait} queued {queued} of {n} requests"
                )));
            }
            let () = redis::cmd("FLUSHALL").query_async(&mut con).await?;
            let slot = &mut best[wait as usize];
            if slot.as_ref().is_none_or(|b| s.seconds < b.seconds) {
                *slot = Some(s);
            }
        }
    }
    let runs: Vec<Submit> = best.into_iter().flatten().collect();
    if runs.len() != 2 {
        return Err(BenchError::Phase(
            "a replica-wait submit was not timed".into(),
        ));
    }
    let extra = runs[1].us_per_request - runs[0].us_per_request;
    Ok(ReplicaWaitCost {
        n,
        batch: BATCH,
        runs,
        extra_us_per_request: extra,
    })
}

/// `n` request lines for `inferq submit`, ids `<tag>-<i>`, the bench's 200-character message.
fn write_requests(path: &Path, tag: &str, n: u64) -> Result<(), BenchError> {
    let file = std::fs::File::create(path)
        .map_err(|e| BenchError::setup(format!("cannot create {}", path.display()), e))?;
    let mut out = std::io::BufWriter::new(file);
    let content = "x".repeat(200);
    for i in 0..n {
        let line = serde_json::json!({
            "id": format!("{tag}-{i:07}"),
            "timeout_s": 3600,
            "payload": {"model": "m", "messages": [{"role": "user", "content": content}]},
        });
        writeln!(out, "{line}")
            .map_err(|e| BenchError::setup(format!("cannot write {}", path.display()), e))?;
    }
    out.flush()
        .map_err(|e| BenchError::setup(format!("cannot write {}", path.display()), e))
}
