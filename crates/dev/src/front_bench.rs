//! `inferq-dev bench-front`: the front door (single requests over HTTP) measured in one run,
//! each part on a fresh deployment (Redis, the simulator, one `inferq run`, one `inferq
//! batch-api` replica):
//!
//! 1. latency: an open loop of `--rate` chat requests a second for `--seconds`, first straight
//!    to the simulator (the reference), then through the front door: `X-AP-Mode: wait` (queued,
//!    a processor takes it), `passthrough` (live, quota-classified) and no header (live); each
//!    request's time from send to the whole answer. It prints p50 and p99 of each and what the
//!    front door adds to the reference.
//! 2. capacity: `--waiting` clients held waiting at once against a simulator that takes
//!    `--hold-secs`; how many the replica held (its `inferq_front_waiting_clients`) and its
//!    RSS then and at its peak (`VmHWM`).
//! 3. enqueue: `--enqueue` requests in enqueue mode from `--enqueue-clients` clients, with no
//!    processor running (the rate the replica and Redis take them at).
//!
//! A benchmark, not a test: the figures depend on the machine, and it says which targets of
//! issues 33 and 43 each reached.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use inferq::cli::Failure;
use inferq_chaos::batch::BatchDeployment;
use inferq_testkit::Fsync;

#[derive(Debug, clap::Args)]
pub(crate) struct FrontBenchArgs {
    /// Requests a second of the latency run (open loop).
    #[arg(long, default_value_t = 500)]
    pub rate: u32,
    /// Seconds of each latency run (after one second of warm-up).
    #[arg(long, default_value_t = 10)]
    pub seconds: u32,
    /// The simulator's time to first token in the latency run, ms.
    #[arg(long, default_value_t = 20)]
    pub ttft_ms: u64,
    /// Clients held waiting at once in the capacity run (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pub waiting: usize,
    /// The simulator's latency in the capacity run, seconds.
    #[arg(long, default_value_t = 30)]
    pub hold_secs: u64,
    /// Requests of the enqueue run (0 skips it).
    #[arg(long, default_value_t = 20_000)]
    pub enqueue: usize,
    /// Concurrent clients of the enqueue run.
    #[arg(long, default_value_t = 64)]
    pub enqueue_clients: usize,
    /// Workers of the processor.
    #[arg(long, default_value_t = 256)]
    pub concurrency: u32,
    /// Redis's `appendfsync`.
    #[arg(long, default_value = "everysec")]
    pub fsync: Fsync,
    /// Skip the latency run.
    #[arg(long)]
    pub no_latency: bool,
}

fn rss_mib(pid: u32, field: &str) -> f64 {
    let read = || -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with(field))?;
        let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    };
    read().unwrap_or(f64::NAN)
}

fn body(i: u64) -> serde_json::Value {
    serde_json::json!({"model": "m", "messages": [{"role": "user", "content": format!("q{i}")}], "max_tokens": 4})
}

fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let at = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn deployment(
    dir: &std::path::Path,
    name: &str,
    ttft_ms: u64,
    args: &FrontBenchArgs,
    replica_flags: Vec<String>,
    processor: bool,
) -> anyhow::Result<BatchDeployment> {
    let exe = inferq_testkit::inferq_binary()?;
    let fail = |e: Box<dyn std::error::Error + Send + Sync>| anyhow!("{e}");
    let mut d = BatchDeployment::start(exe, dir.join(name), ttft_ms, args.fsync)
        .await
        .map_err(fail)?;
    d.processor_flags = vec!["--concurrency".into(), args.concurrency.to_string()];
    d.replica_flags = replica_flags;
    if processor {
        d.add_processor().map_err(fail)?;
    }
    d.add_replica().await.map_err(fail)?;
    Ok(d)
}

/// An open loop of `rate` requests a second to `url` for `seconds`: each one's latency (only
/// 2xx answers count; the others are counted apart).
async fn open_loop(
    client: &reqwest::Client,
    url: &str,
    mode: Option<&'static str>,
    rate: u32,
    seconds: u32,
) -> anyhow::Result<(Vec<Duration>, u64)> {
    let total = u64::from(rate) * u64::from(seconds);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.max(1))));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..total {
        tick.tick().await;
        let (client, url) = (client.clone(), url.to_owned());
        tasks.spawn(async move {
            let t = Instant::now();
            let mut req = client
                .post(&url)
                .header("content-type", "application/json")
                .body(body(i).to_string());
            if let Some(mode) = mode {
                req = req.header("X-AP-Mode", mode);
            }
            let r = req.send().await.ok()?;
            let ok = r.status().is_success();
            r.bytes().await.ok()?;
            ok.then(|| t.elapsed())
        });
    }
    let mut out = Vec::with_capacity(total as usize);
    let mut failed = 0;
    while let Some(r) = tasks.join_next().await {
        match r.context("a request task")? {
            Some(d) => out.push(d),
            None => failed += 1,
        }
    }
    out.sort();
    Ok((out, failed))
}

async fn latency(dir: &std::path::Path, args: &FrontBenchArgs) -> anyhow::Result<()> {
    let d = deployment(dir, "latency", args.ttft_ms, args, Vec::new(), true).await?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(4096)
        .build()?;
    let direct = format!("{}/v1/chat/completions", d.sim.base_url());
    let front = format!("{}/chat/completions", d.base(0));
    let _ = open_loop(&client, &direct, None, args.rate, 1).await?;
    let (reference, ref_failed) =
        open_loop(&client, &direct, None, args.rate, args.seconds).await?;
    let (r50, r99) = (quantile(&reference, 0.5), quantile(&reference, 0.99));
    say!(
        "latency     {} req/s for {} s, simulator ttft {} ms",
        args.rate,
        args.seconds,
        args.ttft_ms
    );
    say!(
        "  direct               p50 {:.1} ms  p99 {:.1} ms  ({} answered, {ref_failed} failed)",
        ms(r50),
        ms(r99),
        reference.len()
    );
    for (name, mode) in [
        ("wait (queued)", Some("wait")),
        ("passthrough (live)", Some("passthrough")),
        ("no header (live)", None),
    ] {
        let _ = open_loop(&client, &front, mode, args.rate, 1).await?;
        let (through, failed) = open_loop(&client, &front, mode, args.rate, args.seconds).await?;
        let (f50, f99) = (quantile(&through, 0.5), quantile(&through, 0.99));
        let add50 = ms(f50) - ms(r50);
        let add99 = ms(f99) - ms(r99);
        say!(
            "  {name:<20} p50 {:.1} ms  p99 {:.1} ms  ({} answered, {failed} failed); added p50 {add50:+.1} ms (target <= 3)  p99 {add99:+.1} ms (target <= 15)  {}",
            ms(f50),
            ms(f99),
            through.len(),
            if add50 <= 3.0 && add99 <= 15.0 && failed == 0 {
                "met"
            } else {
                "NOT met"
            }
        );
    }
    Ok(())
}

async fn capacity(dir: &std::path::Path, args: &FrontBenchArgs) -> anyhow::Result<()> {
    let flags = vec![
        "--max-waiting-clients".to_owned(),
        (args.waiting + 100).to_string(),
    ];
    let d = deployment(dir, "capacity", args.hold_secs * 1000, args, flags, true).await?;
    let pid = d.replicas[0].0.id();
    let idle = rss_mib(pid, "VmRSS:");
    let url = format!("{}/chat/completions", d.base(0));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(args.hold_secs * 4 + 60))
        .build()?;
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..args.waiting as u64 {
        let (client, url, refused) = (client.clone(), url.clone(), refused.clone());
        tasks.spawn(async move {
            match client
                .post(&url)
                .header("X-AP-Mode", "wait")
                .header("X-Request-Timeout-Seconds", "600")
                .header("content-type", "application/json")
                .body(body(i).to_string())
                .send()
                .await
            {
                Ok(r) if r.status().is_success() => {}
                _ => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        if i % 500 == 499 {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let metrics = format!("http://127.0.0.1:{}/metrics", d.replicas[0].1);
    let mut held = 0u64;
    let until = Instant::now() + Duration::from_secs(120);
    while Instant::now() < until {
        let page = reqwest::get(&metrics).await?.text().await?;
        held = page
            .lines()
            .find_map(|l| l.strip_prefix("inferq_front_waiting_clients "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if held as usize >= args.waiting
            || held + refused.load(Ordering::Relaxed) >= args.waiting as u64
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let ramp = started.elapsed();
    let rss = rss_mib(pid, "VmRSS:");
    let peak = rss_mib(pid, "VmHWM:");
    say!(
        "capacity    {} clients waiting on one replica (simulator {} s), ramped in {:.1} s",
        args.waiting,
        args.hold_secs,
        ramp.as_secs_f64()
    );
    say!(
        "  held {held}, refused or failed {}; replica RSS {idle:.1} MiB idle, {rss:.1} MiB holding them, peak {peak:.1} MiB (target <= 300)  {}",
        refused.load(Ordering::Relaxed),
        if held as usize >= args.waiting && peak <= 300.0 { "met" } else { "NOT met" }
    );
    tasks.abort_all();
    Ok(())
}

async fn enqueue(dir: &std::path::Path, args: &FrontBenchArgs) -> anyhow::Result<()> {
    let d = deployment(dir, "enqueue", 5, args, Vec::new(), false).await?;
    let url = format!("{}/chat/completions", d.base(0));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(args.enqueue_clients)
        .build()?;
    let next = Arc::new(AtomicU64::new(0));
    let n = args.enqueue as u64;
    // A warm-up of a thousand, not counted.
    let run = |count: u64, next: Arc<AtomicU64>| {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..args.enqueue_clients {
            let (client, url, next) = (client.clone(), url.clone(), next.clone());
            tasks.spawn(async move {
                let mut lat = Vec::new();
                let mut bad = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= count {
                        return (lat, bad);
                    }
                    let t = Instant::now();
                    match client
                        .post(&url)
                        .header("X-AP-Mode", "enqueue")
                        .header("content-type", "application/json")
                        .body(body(i).to_string())
                        .send()
                        .await
                    {
                        Ok(r) if r.status().as_u16() == 202 => {
                            let _ = r.bytes().await;
                            lat.push(t.elapsed());
                        }
                        _ => bad += 1,
                    }
                }
            });
        }
        tasks
    };
    let mut warm = run(1000, Arc::new(AtomicU64::new(0)));
    while warm.join_next().await.is_some() {}
    let started = Instant::now();
    let mut tasks = run(n, next);
    let mut lat = Vec::new();
    let mut bad = 0;
    while let Some(r) = tasks.join_next().await {
        let (l, b) = r.context("an enqueue task")?;
        lat.extend(l);
        bad += b;
    }
    let took = started.elapsed().as_secs_f64();
    lat.sort();
    let rate = lat.len() as f64 / took;
    say!(
        "enqueue     {} requests from {} clients in {took:.2} s: {rate:.0} req/s (target >= 5000) {}; p50 {:.2} ms p99 {:.2} ms; {bad} not 202",
        lat.len(),
        args.enqueue_clients,
        if rate >= 5000.0 { "met" } else { "NOT met" },
        ms(quantile(&lat, 0.5)),
        ms(quantile(&lat, 0.99))
    );
    Ok(())
}

pub(crate) async fn bench_front(args: FrontBenchArgs) -> Result<(), Failure> {
    let dir = tempfile::Builder::new()
        .prefix("inferq-bench-front-")
        .tempdir()
        .context("data dir")?;
    say!(
        "inferq-dev bench-front: one replica, one processor with {} workers, appendfsync {:?}, {} cores",
        args.concurrency,
        args.fsync,
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    if !args.no_latency {
        latency(dir.path(), &args).await?;
    }
    if args.enqueue > 0 {
        enqueue(dir.path(), &args).await?;
    }
    if args.waiting > 0 {
        capacity(dir.path(), &args).await?;
    }
    Ok(())
}
