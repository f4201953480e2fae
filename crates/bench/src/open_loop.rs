//! Open-loop load: requests submitted on a fixed schedule (rate R for a few seconds), whatever
//! the processor does, against the simulator (which stamps when each request reached it). In:
//! the offered rate and duration; out: an [`OpenLoop`] with the rate actually submitted, the
//! completion throughput, enqueue→dispatch latency (the sim's arrival stamp minus the moment
//! the submit round trip was sent) and submit→result latency (the bench's `BRPOP` reader's
//! stamp minus the same moment), and the processor's CPU and peak RSS.

use std::time::{Duration, Instant};

use serde::Serialize;

use super::load::{request_id, submit_range, Collector};
use super::procs::{Gateway, Processor};
use super::stats::Latency;
use super::{BenchError, Ctx};
use inferq_client::producer::Producer;
use inferq_sim::unix_us;

/// Most requests sent in one round trip when the submitter is behind schedule.
const MAX_BATCH: u64 = 500;
/// How long to wait for the last results after the last submission.
const RESULT_GRACE: Duration = Duration::from_secs(30);

/// One open-loop phase's figures.
#[derive(Debug, Clone, Serialize)]
pub struct OpenLoop {
    pub offered_rps: u64,
    pub seconds: f64,
    pub submitted: u64,
    /// Submissions per second actually achieved.
    pub achieved_submit_rps: f64,
    pub completed: u64,
    /// Results per second, from the first submission to the last result.
    pub throughput_rps: f64,
    pub enqueue_to_dispatch: Latency,
    pub submit_to_result: Latency,
    pub cpu_s_per_1k: f64,
    pub peak_rss_mib: f64,
}

/// Offers `rate` requests/s for `duration` to a fresh processor in front of `sim`.
pub(crate) async fn run(
    ctx: &mut Ctx,
    sim: &Gateway,
    rate: u64,
    duration: Duration,
) -> Result<OpenLoop, BenchError> {
    ctx.flush().await?;
    let tag = format!("open-{rate}");
    let spec = ctx.spec(&sim.base_url(), &tag);
    let mut processor = Processor::start(&spec, &ctx.dir, &ctx.http).await?;
    let producer = Producer::connect(&ctx.redis_url, &spec.queue, &spec.results).await?;
    let collector = Collector::start(producer.popper().await?);

    let total = ((rate as f64) * duration.as_secs_f64()).round().max(1.0) as u64;
    let mut sent_at = Vec::with_capacity(total as usize);
    let t0 = Instant::now();
    let mut next = 0u64;
    while next < total {
        let due = ((t0.elapsed().as_secs_f64() * rate as f64).floor() as u64 + 1).min(total);
        if due <= next {
            let at = t0 + Duration::from_secs_f64(next as f64 / rate as f64);
            tokio::time::sleep_until(at.into()).await;
            continue;
        }
        let end = due.min(next + MAX_BATCH);
        let stamp = unix_us();
        submit_range(&producer, &tag, next, end).await?;
        sent_at.extend(std::iter::repeat_n(stamp, (end - next) as usize));
        next = end;
    }
    let submit_seconds = t0.elapsed().as_secs_f64();
    processor.check_alive()?;
    let results = collector.finish(total, RESULT_GRACE).await?;
    let usage = processor.usage()?;
    processor.kill9();
    let arrivals = sim.arrivals(&ctx.http, &format!("{tag}-")).await?;

    let mut to_dispatch = Vec::with_capacity(sent_at.len());
    let mut to_result = Vec::with_capacity(sent_at.len());
    let mut last_result = 0u64;
    for (i, &sent) in sent_at.iter().enumerate() {
        let id = request_id(&tag, i as u64);
        if let Some(first) = arrivals.get(&id).and_then(|t| t.first()) {
            to_dispatch.push(first.saturating_sub(sent));
        }
        if let Some(&at) = results.get(&id) {
            to_result.push(at.saturating_sub(sent));
            last_result = last_result.max(at);
        }
    }
    let completed = to_result.len() as u64;
    let first_sent = sent_at.first().copied().unwrap_or(0);
    let span_s = last_result.saturating_sub(first_sent) as f64 / 1e6;
    Ok(OpenLoop {
        offered_rps: rate,
        seconds: duration.as_secs_f64(),
        submitted: total,
        achieved_submit_rps: total as f64 / submit_seconds.max(1e-9),
        completed,
        throughput_rps: if span_s > 0.0 {
            completed as f64 / span_s
        } else {
            0.0
        },
        enqueue_to_dispatch: Latency::from_us(to_dispatch),
        submit_to_result: Latency::from_us(to_result),
        cpu_s_per_1k: usage.cpu_s * 1000.0 / completed.max(1) as f64,
        peak_rss_mib: usage.peak_rss_mib,
    })
}
