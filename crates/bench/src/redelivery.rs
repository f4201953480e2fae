//! Redelivery after a crash: processor A (short lease) takes M requests to a simulator that
//! answers only after two minutes, so it holds them all in flight; processor B runs beside it;
//! A is killed with SIGKILL; the phase measures, per request, the time from the kill to the
//! request's second arrival at the gateway (B running it). In: M, the lease and the reclaim
//! interval; out: a [`Redelivery`] with p50 and max.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::preload;
use super::procs::{Gateway, Processor};
use super::stats::percentile;
use super::{BenchError, Ctx};
use inferq_client::producer::Producer;
use inferq_sim::unix_us;

/// How long the slow simulator takes to answer: longer than the phase.
const SLOW_TTFT_MS: u64 = 120_000;
/// How long to wait for A to hold every request.
const HOLD_LIMIT: Duration = Duration::from_secs(30);

/// The redelivery phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct Redelivery {
    pub requests: u64,
    pub lease_s: u64,
    pub reclaim_interval_ms: u64,
    /// Requests that ran again after the kill.
    pub redelivered: u64,
    pub p50_s: f64,
    pub max_s: f64,
}

pub(crate) async fn run(ctx: &mut Ctx, requests: u64) -> Result<Redelivery, BenchError> {
    ctx.flush().await?;
    let slow = Gateway::sim(&ctx.http, &ctx.dir, SLOW_TTFT_MS).await?;
    let tag = "redeliver";
    let prefix = format!("{tag}-");
    let mut spec = ctx.spec(&slow.base_url(), tag);
    spec.lease_s = Some(ctx.opts.lease_s);
    spec.reclaim_interval_ms = Some(ctx.opts.reclaim_interval_ms);
    let producer = Producer::connect(&ctx.redis_url, &spec.queue, &spec.results).await?;
    preload(&producer, tag, requests).await?;

    let mut a = Processor::start(&spec, &ctx.dir, &ctx.http).await?;
    let started = Instant::now();
    loop {
        let held = slow.arrivals(&ctx.http, &prefix).await?.len() as u64;
        if held >= requests {
            break;
        }
        if started.elapsed() > HOLD_LIMIT {
            return Err(BenchError::Phase(format!(
                "redelivery: processor A took only {held} of {requests} requests:\n{}",
                a.log_tail()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut b = Processor::start(&spec, &ctx.dir, &ctx.http).await?;
    // Let B settle into its idle polling before the crash.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed_at = unix_us();
    a.kill9();

    let limit = Duration::from_secs(ctx.opts.lease_s + 30);
    let waited = Instant::now();
    let arrivals = loop {
        let arrivals = slow.arrivals(&ctx.http, &prefix).await?;
        let again = arrivals.values().filter(|t| t.len() >= 2).count() as u64;
        if again >= requests || waited.elapsed() > limit {
            break arrivals;
        }
        b.check_alive()?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    b.kill9();

    let mut delays: Vec<u64> = arrivals
        .values()
        .filter_map(|t| t.get(1))
        .map(|&again| again.saturating_sub(killed_at))
        .collect();
    delays.sort_unstable();
    let s = |us: Option<u64>| us.map_or(f64::NAN, |us| us as f64 / 1e6);
    Ok(Redelivery {
        requests,
        lease_s: ctx.opts.lease_s,
        reclaim_interval_ms: ctx.opts.reclaim_interval_ms,
        redelivered: delays.len() as u64,
        p50_s: s(percentile(&delays, 0.5)),
        max_s: s(delays.last().copied()),
    })
}
