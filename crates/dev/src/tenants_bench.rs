//! `inferq-dev bench-batch --tenants`: fair share across tenants (issue 34) measured against
//! today's single shared queue in the same run. Every run starts its own Redis, simulator
//! (`--ttft-ms` latency), one `inferq run` with `--concurrency` workers and, for the batch runs,
//! one `inferq batch-api` with a keys file of the tenants:
//!
//! 1. today, A alone: tenant A's `--lines`-line batch on the one queue (random-robin), timed
//!    from its create until it completes: today's rate;
//! 2. fair share, A alone: the same with `--queue-per-tenant` and the `fair-share` policy;
//! 3. fair share, A then B: B's 100-line batch posted `--b-after` after A's, B's time from its
//!    create to completed, against the bound: the time half the fleet (at today's rate) needs
//!    for 100 lines, plus 10 s;
//! 4. today, A then B: the same on the one queue, for comparison;
//! 5. 1,000 tenants: `--tenant-lines` requests for each of `--tenant-count` tenants written
//!    straight into the queues (one queue, or one per tenant with the index), then one processor
//!    started and timed until every result is on the list. Redis calls are the growth of
//!    `INFO commandstats` (every command, those scripts run included) over that drain, less the
//!    bench's own; the figure is calls per request, fair share over today.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use inferq::cli::Failure;
use inferq_chaos::batch::{batch_file, BatchDeployment};
use inferq_testkit::Fsync;
use serde_json::Value;

use super::batch_bench::BatchBenchArgs;

const PREFIX: &str = "inferq-tenant:";
const INDEX: &str = "inferq-tenants:index";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Today,
    Fair,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Today => "today (one queue)",
            Mode::Fair => "fair share",
        }
    }

    /// The word its runs' folders start with.
    fn dir(self) -> &'static str {
        match self {
            Mode::Today => "today",
            Mode::Fair => "fair",
        }
    }
}

struct Run {
    /// A's create to completed.
    a: Duration,
    /// B's create to completed, when B ran.
    b: Option<Duration>,
}

type Fail = Box<dyn std::error::Error + Send + Sync>;

fn fail(e: Fail) -> anyhow::Error {
    anyhow!("{e}")
}

fn key_of(tenant: &str) -> String {
    format!("bench-key-of-tenant-{tenant}")
}

/// A deployment for `mode`: the policy and keys files written, the flags set, one processor.
async fn deploy(
    exe: &Path,
    dir: &Path,
    mode: Mode,
    args: &BatchBenchArgs,
    tenants: &[String],
) -> Result<BatchDeployment, Failure> {
    let mut d = BatchDeployment::start(exe.to_owned(), dir.to_owned(), args.ttft_ms, args.fsync)
        .await
        .map_err(fail)?;
    d.processor_flags = vec!["--concurrency".into(), args.concurrency.to_string()];
    let keys: BTreeMap<String, String> = tenants.iter().map(|t| (key_of(t), t.clone())).collect();
    let keys_file = dir.join("keys.json");
    std::fs::write(&keys_file, serde_json::to_string(&keys).context("keys")?).context("keys")?;
    d.replica_flags = vec!["--api-keys-file".into(), keys_file.display().to_string()];
    if mode == Mode::Fair {
        let policy = dir.join("merge-policy.json");
        let mut text = serde_json::json!({"type": "fair-share", "parameters": {
            "queue_prefix": PREFIX, "discover_interval_ms": 200}});
        if let Some(burst) = args.burst {
            text["parameters"]["burst"] = burst.into();
        }
        std::fs::write(&policy, text.to_string()).context("policy")?;
        d.processor_flags.extend([
            "--request-merge-policy-config-file".into(),
            policy.display().to_string(),
        ]);
        d.replica_flags.push("--queue-per-tenant".into());
    }
    Ok(d)
}

async fn json_of(r: reqwest::Response) -> Result<Value, Failure> {
    let status = r.status();
    let v: Value = serde_json::from_slice(&r.bytes().await.context("read")?).context("json")?;
    if !status.is_success() {
        return Err(anyhow!("{status}: {v}").into());
    }
    Ok(v)
}

/// Uploads `text` and creates a batch of it as `tenant`; the batch's id.
async fn submit_as(base: &str, tenant: &str, text: String) -> Result<String, Failure> {
    let c = reqwest::Client::new();
    let auth = format!("Bearer {}", key_of(tenant));
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(text).file_name("in.jsonl"),
        );
    let r = c
        .post(format!("{base}/files"))
        .header("authorization", &auth);
    let file = json_of(r.multipart(form).send().await.context("upload")?).await?;
    let body = serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    let r = c
        .post(format!("{base}/batches"))
        .header("authorization", &auth)
        .header("content-type", "application/json")
        .body(body.to_string());
    let batch = json_of(r.send().await.context("create")?).await?;
    Ok(batch["id"].as_str().unwrap_or_default().to_owned())
}

async fn status_of(base: &str, tenant: &str, id: &str) -> Result<String, Failure> {
    let r = reqwest::Client::new()
        .get(format!("{base}/batches/{id}"))
        .header("authorization", format!("Bearer {}", key_of(tenant)));
    let v = json_of(r.send().await.context("retrieve")?).await?;
    Ok(v["status"].as_str().unwrap_or_default().to_owned())
}

/// One fairness run: A's batch, and B's `b_after` later when `with_b`.
async fn fairness_run(
    exe: &Path,
    root: &Path,
    mode: Mode,
    args: &BatchBenchArgs,
    with_b: bool,
) -> Result<Run, Failure> {
    let dir = root.join(format!(
        "{}-{}",
        mode.dir(),
        if with_b { "ab" } else { "a" }
    ));
    let tenants = ["a".to_owned(), "b".to_owned()];
    let mut d = deploy(exe, &dir, mode, args, &tenants).await?;
    d.add_processor().map_err(fail)?;
    let base = d.add_replica().await.map_err(fail)?;
    let a_text = batch_file(0, args.lines, args.pad);
    let a_started = Instant::now();
    let a = submit_as(&base, "a", a_text).await?;
    let mut b: Option<(String, Instant)> = None;
    let mut a_done = None;
    let mut b_done = None;
    let limit = Duration::from_secs(1800);
    while a_started.elapsed() < limit {
        if with_b && b.is_none() && a_started.elapsed() >= args.b_after {
            let b_started = Instant::now();
            b = Some((
                submit_as(&base, "b", batch_file(1, 100, args.pad)).await?,
                b_started,
            ));
        }
        if a_done.is_none() && status_of(&base, "a", &a).await? == "completed" {
            a_done = Some(a_started.elapsed());
        }
        if let (Some((id, at)), None) = (&b, b_done) {
            if status_of(&base, "b", id).await? == "completed" {
                b_done = Some(at.elapsed());
            }
        }
        if a_done.is_some() && (!with_b || b_done.is_some()) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = a_done.ok_or_else(|| anyhow!("{}: A did not complete", mode.name()))?;
    if with_b && b_done.is_none() {
        return Err(anyhow!("{}: B did not complete", mode.name()).into());
    }
    Ok(Run { a, b: b_done })
}

/// `calls=` of each command in `INFO commandstats`.
async fn command_calls(
    con: &mut redis::aio::MultiplexedConnection,
) -> Result<BTreeMap<String, u64>, Failure> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .context("INFO")?;
    let mut by_command = BTreeMap::new();
    for line in info.lines() {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
        if let Some(name) = name.strip_prefix("cmdstat_") {
            by_command.insert(name.to_owned(), calls);
        }
    }
    Ok(by_command)
}

/// The growth of each command's calls from `before` to `after`, largest first.
fn growth(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut grown: Vec<(String, u64)> = after
        .iter()
        .map(|(c, n)| (c.clone(), n - before.get(c).copied().unwrap_or(0)))
        .filter(|(_, n)| *n > 0)
        .collect();
    grown.sort_by_key(|g| std::cmp::Reverse(g.1));
    grown
}

/// What one 1,000-tenant drain cost.
struct Calls {
    requests: u64,
    drain: Duration,
    calls: u64,
    evalsha: u64,
    /// The commands that grew most.
    top: Vec<(String, u64)>,
}

/// Writes `per` requests for each of `count` tenants, then drains them with one processor.
async fn calls_run(
    exe: &Path,
    root: &Path,
    mode: Mode,
    args: &BatchBenchArgs,
    round: usize,
) -> Result<Calls, Failure> {
    let dir = root.join(format!("calls-{}-{round}", mode.dir()));
    let mut d = deploy(exe, &dir, mode, args, &[]).await?;
    let url = d.redis.url();
    inferq_testkit::tenants::fill(&inferq_testkit::tenants::TenantQueues {
        url: &url,
        prefix: PREFIX,
        index: (mode == Mode::Fair).then_some(INDEX),
        shared: "batch-q",
        results: "bench-results",
        tenants: args.tenant_count,
        each: args.tenant_lines,
    })
    .await
    .map_err(|e| anyhow!("filling the queues: {e}"))?;
    let client = redis::Client::open(url.as_str()).context("redis")?;
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .context("redis")?;
    let requests = (args.tenant_count * args.tenant_lines) as u64;
    let before = command_calls(&mut con).await?;
    let started = Instant::now();
    d.add_processor().map_err(fail)?;
    // The bench's own calls in the window: this INFO and the last one, and each LLEN.
    let mut own = 2u64;
    loop {
        own += 1;
        let n: u64 = redis::cmd("LLEN")
            .arg("bench-results")
            .query_async(&mut con)
            .await
            .context("LLEN")?;
        if n >= requests {
            break;
        }
        if started.elapsed() > Duration::from_secs(1800) {
            return Err(anyhow!("{}: the drain did not end", mode.name()).into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let drain = started.elapsed();
    let after = command_calls(&mut con).await?;
    let grown = growth(&before, &after);
    let total: u64 = grown.iter().map(|(_, n)| n).sum();
    Ok(Calls {
        requests,
        drain,
        calls: total.saturating_sub(own),
        evalsha: grown
            .iter()
            .find(|(c, _)| c == "evalsha")
            .map_or(0, |(_, n)| *n),
        top: grown.into_iter().take(6).collect(),
    })
}

/// Steps 1 to 4: A alone and A then B, today and with fair share.
async fn ab_runs(exe: &Path, root: &Path, args: &BatchBenchArgs) -> Result<(), Failure> {
    let rate = |d: Duration| args.lines as f64 / d.as_secs_f64();
    let today_a = fairness_run(exe, root, Mode::Today, args, false).await?;
    say!(
        "today       A alone {:.2} s ({:.0} lines/s)",
        today_a.a.as_secs_f64(),
        rate(today_a.a)
    );
    let fair_a = fairness_run(exe, root, Mode::Fair, args, false).await?;
    say!(
        "fair share  A alone {:.2} s ({:.0} lines/s); rate / today's = {:.3} (target >= 0.95)",
        fair_a.a.as_secs_f64(),
        rate(fair_a.a),
        rate(fair_a.a) / rate(today_a.a)
    );
    let half_fleet = Duration::from_secs_f64(100.0 / (rate(today_a.a) / 2.0));
    let bound = half_fleet + Duration::from_secs(10);
    let fair_ab = fairness_run(exe, root, Mode::Fair, args, true).await?;
    let b = fair_ab.b.unwrap_or_default();
    say!(
        "fair share  A then B: B completed {:.2} s after its create (bound: half the fleet {:.2} s + 10 s = {:.2} s: {}); A {:.2} s ({:.0} lines/s)",
        b.as_secs_f64(),
        half_fleet.as_secs_f64(),
        bound.as_secs_f64(),
        if b <= bound { "met" } else { "MISSED" },
        fair_ab.a.as_secs_f64(),
        rate(fair_ab.a)
    );
    let today_ab = fairness_run(exe, root, Mode::Today, args, true).await?;
    say!(
        "today       A then B: B completed {:.2} s after its create; A {:.2} s",
        today_ab.b.unwrap_or_default().as_secs_f64(),
        today_ab.a.as_secs_f64()
    );
    Ok(())
}

/// The whole benchmark.
pub(crate) async fn bench_tenants(args: BatchBenchArgs) -> Result<(), Failure> {
    let exe = inferq_testkit::inferq_binary()?;
    let dir = tempfile::Builder::new()
        .prefix("inferq-bench-tenants-")
        .tempdir()
        .context("data dir")?;
    let root: PathBuf = dir.path().to_owned();
    say!(
        "inferq-dev bench-batch --tenants: A {} lines, B 100 lines {:?} later; 1 processor with {} workers; simulator ttft {} ms; appendfsync {}",
        args.lines,
        args.b_after,
        args.concurrency,
        args.ttft_ms,
        match args.fsync { Fsync::Always => "always", Fsync::EverySec => "everysec" }
    );
    if !args.calls_only {
        ab_runs(&exe, &root, &args).await?;
    }
    // Today's calls per request swing with how full its batches run (0.8 to 2.6 on this
    // machine, as load comes and goes), so the two modes alternate and the ratio is the median.
    let mut ratios = Vec::new();
    for round in 1..=args.calls_rounds.max(1) {
        let today = calls_run(&exe, &root, Mode::Today, &args, round).await?;
        let fair = calls_run(&exe, &root, Mode::Fair, &args, round).await?;
        for (name, c) in [("today", &today), ("fair share", &fair)] {
            say!(
                "{name:<11} round {round}: {} tenants x {} requests: drain {:.2} s ({:.0}/s), Redis calls {} ({:.3} per request; EVALSHA {:.3} per request)",
                args.tenant_count,
                args.tenant_lines,
                c.drain.as_secs_f64(),
                c.requests as f64 / c.drain.as_secs_f64(),
                c.calls,
                c.calls as f64 / c.requests as f64,
                c.evalsha as f64 / c.requests as f64
            );
            let top: Vec<String> = c.top.iter().map(|(cmd, n)| format!("{cmd} {n}")).collect();
            say!("            most called: {}", top.join(", "));
        }
        let ratio = (fair.calls as f64 / fair.requests as f64)
            / (today.calls as f64 / today.requests as f64);
        say!("ratio       round {round}: calls per request, fair share / today = {ratio:.3}");
        ratios.push(ratio);
    }
    ratios.sort_by(f64::total_cmp);
    let median = ratios.get(ratios.len() / 2).copied().unwrap_or(f64::NAN);
    say!(
        "ratio       median of {} rounds = {median:.3} (target <= 1.5: {})",
        ratios.len(),
        if median <= 1.5 { "met" } else { "MISSED" }
    );
    Ok(())
}
