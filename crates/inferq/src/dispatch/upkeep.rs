//! The background loops of one queue: renew held leases (one call, every third of the lease),
//! watch cancel markers of in-flight requests, reclaim expired leases (holding back for a lease
//! after Redis was out of reach), promote due retries, and report the backlog. Each runs until
//! its stop token is cancelled.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::context::QueueCtx;
use super::holdings::Abort;
use crate::queue::{TakenOver, Takeover};
use inferq_client::wire::ResultMessage;

/// Most claims renewed per script call.
const RENEW_CHUNK: usize = 2000;
/// Most claims reclaimed per script call.
const RECLAIM_BATCH: usize = 200;
/// Most retries promoted per script call.
const PROMOTE_BATCH: usize = 500;

async fn tick(stop: &CancellationToken, every: Duration) -> bool {
    tokio::select! {
        biased;
        _ = stop.cancelled() => false,
        _ = tokio::time::sleep(every) => true,
    }
}

/// Renews every held claim every `lease / 3`; drops (and aborts) claims that are no longer ours
/// or whose lease ran out locally while Redis could not be reached.
pub async fn heartbeat(ctx: Arc<QueueCtx>, stop: CancellationToken) {
    let every = ctx
        .queue
        .settings()
        .renew_every()
        .max(Duration::from_millis(50));
    let depth = ctx.metrics.claim_depth.get_or_create(&ctx.labels).clone();
    while tick(&stop, every).await {
        let fences = ctx.holdings.fences();
        for chunk in fences.chunks(RENEW_CHUNK) {
            let sent_at = Instant::now();
            match ctx.queue.renew(chunk).await {
                Ok(statuses) => {
                    let lost = ctx.holdings.renewed(chunk, &statuses, sent_at);
                    let renewed = chunk.len() - lost;
                    let m = &ctx.metrics.renewals;
                    m.get_or_create(&ctx.labels.with_outcome("renewed"))
                        .inc_by(renewed as u64);
                    if lost > 0 {
                        m.get_or_create(&ctx.labels.with_outcome("lost"))
                            .inc_by(lost as u64);
                        tracing::warn!(queue = %ctx.queue.name(), lost, "claims no longer ours (another instance reclaimed them after their lease, or Redis lost them: restarted without its data); their work is aborted");
                    }
                }
                Err(e) => {
                    ctx.note_failure(&e);
                    ctx.metrics
                        .renewals
                        .get_or_create(&ctx.labels.with_outcome("error"))
                        .inc();
                    tracing::warn!(queue = %ctx.queue.name(), error = %e, "cannot renew leases; keeping work while they last");
                }
            }
        }
        let expired = ctx.holdings.expire_overdue(Instant::now());
        if expired > 0 {
            tracing::warn!(queue = %ctx.queue.name(), expired, "leases ran out while Redis was unreachable; that work is abandoned to the next owner");
        }
        depth.set(i64::try_from(ctx.holdings.len()).unwrap_or(i64::MAX));
    }
}

/// Checks the cancel markers of in-flight requests (one MGET per check; single GETs on a
/// cluster, whose markers are in many slots) and aborts cancelled ones, which then publish
/// `CANCELLED`.
pub async fn cancel_watch(ctx: Arc<QueueCtx>, every: Duration, stop: CancellationToken) {
    while tick(&stop, every).await {
        let working = ctx.holdings.cancellable();
        for chunk in working.chunks(500) {
            let keys: Vec<String> = chunk
                .iter()
                .map(|(_, id, _)| inferq_client::keys::cancel_key(id))
                .collect();
            let markers = match ctx.queue.read_markers(&keys).await {
                Ok(m) => m,
                Err(_) => break,
            };
            for ((claim_key, _, token), marker) in chunk.iter().zip(markers) {
                if marker.as_deref() == Some(token.as_str()) {
                    ctx.holdings.abort(claim_key, Abort::Cancelled);
                }
            }
        }
    }
}

/// Moves expired leases back to pending; finishes what reclaim takes over (passed deadline →
/// `DEADLINE_EXCEEDED`; delivery limit → dead letter).
///
/// It sleeps until the earliest lease in the claims index runs out (by Redis time, plus a small
/// margin), but never longer than the reclaim interval: a crashed instance's work is back in
/// pending moments after its lease ends, not up to an interval later. A queue `fair-share` found
/// is swept every [`FOUND_IDLE_PASS`] (at least) instead.
///
/// After Redis was out of reach (this instance's renewals, polls, reclaims or outcome writes
/// failed: `LaneState::lost_redis`), it waits until Redis answers and then one more lease before it
/// reclaims. The outage let every lease run out, the live owners' included; they renew every
/// third of a lease and write the outcomes they kept, so waiting a lease hands back only work
/// whose owner is really gone, instead of having work that was done, or is nearly done, done
/// again.
pub async fn reclaimer(ctx: Arc<QueueCtx>, stop: CancellationToken) {
    let every = idle_pass(&ctx, ctx.queue.settings().reclaim_interval).max(MIN_RECLAIM_SLEEP);
    let mut sleep = every;
    // Indexing delivery counts that have no deadline entry goes on until Redis refuses it for
    // good (a user whose ACL rule predates `+hscan`): said once, then left off.
    let mut adopting = true;
    while tick(&stop, sleep).await {
        sleep = every;
        if ctx.state.is_outbox_stalled() {
            // This instance's finished outcomes are waiting for Redis: let them land first (the
            // outbox retries within 2 s), or this reclaim would have their work done again.
            sleep = MIN_RECLAIM_SLEEP;
            continue;
        }
        if ctx.state.is_redis_lost() {
            match grace_after_outage(&ctx, &stop).await {
                Grace::RedisStillOut => {
                    sleep = PROBE_SLEEP;
                    continue;
                }
                Grace::Stopped => return,
                Grace::Over => {}
            }
        }
        // A found queue's earliest lease is mostly this instance's own, renewed: waking for it
        // would cost a pass per lease per tenant.
        if let Some(next) = reclaim_expired(&ctx, every).await.filter(|_| !ctx.found) {
            sleep = next;
        }
        settle_staged(&ctx).await;
        if adopting {
            adopting = adopt_counts(&ctx).await;
        }
    }
}

/// How the grace after an outage went.
enum Grace {
    /// Redis does not answer yet: probe again soon.
    RedisStillOut,
    /// Stopped during the grace.
    Stopped,
    /// A lease has passed since Redis answered: reclaim.
    Over,
}

/// Every owner lost Redis too, so leases ran out that nobody abandoned. Once Redis answers, give
/// the owners a lease to renew them and write what they finished, as a claim is only ever
/// reclaimed after a lease in which its owner could have renewed.
async fn grace_after_outage(ctx: &QueueCtx, stop: &CancellationToken) -> Grace {
    if ctx.queue.ping().await.is_err() {
        return Grace::RedisStillOut;
    }
    let grace = ctx.queue.settings().lease;
    tracing::info!(queue = %ctx.queue.name(), ?grace, "Redis answers again; reclaiming after a lease, so live owners renew first");
    if !tick(stop, grace).await {
        return Grace::Stopped;
    }
    // Failures during the grace count as the same outage: reclaim now rather than wait
    // again, so a flaky Redis postpones reclaiming by a lease at a time, never for good.
    ctx.state.outage_over();
    Grace::Over
}

/// Reclaims expired leases a batch at a time until a batch comes back short, finishing what
/// reclaim takes over. Returns how long to sleep before the next pass when the last batch
/// said when the next lease runs out (at most `every`).
async fn reclaim_expired(ctx: &QueueCtx, every: Duration) -> Option<Duration> {
    loop {
        let taken_at = Instant::now();
        let reclaimed = match ctx.queue.reclaim(RECLAIM_BATCH).await {
            Ok(r) => r,
            Err(e) => {
                ctx.note_failure(&e);
                tracing::debug!(queue = %ctx.queue.name(), error = %e, "reclaim failed; will retry");
                return None;
            }
        };
        let n = reclaimed.requeued as usize + reclaimed.taken_over.len();
        if n > 0 {
            ctx.metrics
                .claims_expired
                .get_or_create(&ctx.labels)
                .inc_by(n as u64);
            tracing::info!(queue = %ctx.queue.name(), requeued = reclaimed.requeued, taken_over = reclaimed.taken_over.len(), "reclaimed expired leases");
        }
        if reclaimed.requeued > 0 {
            ctx.wake.notify_one();
        }
        for taken in reclaimed.taken_over {
            finish_taken(ctx, taken, taken_at);
        }
        if n < RECLAIM_BATCH {
            return reclaimed
                .next_expiry
                .map(|next| (next + RECLAIM_MARGIN).clamp(MIN_RECLAIM_SLEEP, every));
        }
    }
}

/// On a cluster: results a finisher staged but did not push (it died between steps).
async fn settle_staged(ctx: &QueueCtx) {
    match ctx.queue.settle_staged().await {
        Ok(0) => {}
        Ok(n) => {
            tracing::info!(queue = %ctx.queue.name(), settled = n, "delivered results whose finisher stopped half-way")
        }
        Err(e) => {
            tracing::debug!(queue = %ctx.queue.name(), error = %e, "settling staged results failed; will retry")
        }
    }
}

/// One page of [`crate::queue::Queue::adopt_counts`]: delivery counts an earlier release left
/// without a deadline entry (or one still running beside this one leaves) are indexed, so a
/// reclaim pass drops them in time instead of keeping them for good. False once the user's
/// ACL rule refuses it (the caller stops asking); other failures are tried again next pass.
async fn adopt_counts(ctx: &QueueCtx) -> bool {
    match ctx.queue.adopt_counts(RECLAIM_BATCH).await {
        Ok(0) => true,
        Ok(indexed) => {
            tracing::info!(queue = %ctx.queue.name(), indexed, "indexed delivery counts that had no deadline entry (left by an earlier release), so they go in time");
            true
        }
        Err(e) => match e.acl_refusal() {
            Some(refusal) => {
                tracing::warn!(queue = %ctx.queue.name(), error = %refusal, "cannot index delivery counts left by an earlier release (the processor's ACL rule needs +hscan); those whose request left the queue without a result stay in Redis");
                false
            }
            None => {
                ctx.note_failure(&e);
                tracing::debug!(queue = %ctx.queue.name(), error = %e, "indexing delivery counts failed; will retry");
                true
            }
        },
    }
}

/// The longest a queue `fair-share` found goes between reclaim and promote passes: with a
/// thousand tenants, a pass per tenant every reclaim interval would cost Redis more than their
/// work. Work this instance holds or parks in such a queue is looked after as in any other.
pub const FOUND_IDLE_PASS: Duration = Duration::from_secs(5);

/// The longest between two passes of a queue's reclaimer or promoter: `interval`, or
/// [`FOUND_IDLE_PASS`] when longer for a queue `fair-share` found.
fn idle_pass(ctx: &QueueCtx, interval: Duration) -> Duration {
    if ctx.found {
        interval.max(FOUND_IDLE_PASS)
    } else {
        interval
    }
}

/// Slack after the earliest lease expiry before reclaiming it (Redis rounds nothing, but the
/// renewal of a live holder may be in flight).
const RECLAIM_MARGIN: Duration = Duration::from_millis(25);
/// How often the reclaimer asks whether Redis answers again after losing it.
const PROBE_SLEEP: Duration = Duration::from_millis(200);
/// The reclaimer's shortest sleep, so a lease about to be renewed is not polled in a busy loop.
const MIN_RECLAIM_SLEEP: Duration = Duration::from_millis(50);

fn finish_taken(ctx: &QueueCtx, taken: TakenOver, taken_at: Instant) {
    let (id, request_token) = taken
        .envelope
        .as_ref()
        .map(|e| (e.request.id.clone(), e.internal.request_token.clone()))
        .unwrap_or_default();
    ctx.holdings
        .insert(taken.fence.clone(), &id, &request_token, taken_at);
    match (taken.reason, &taken.envelope) {
        (Takeover::Deadline, Some(env)) => {
            ctx.series.exceeded.get().inc();
            ctx.publish(&taken.fence, env, ResultMessage::deadline_exceeded(&id));
        }
        (Takeover::Deliveries, _) | (Takeover::Deadline, None) => {
            let reason = format!(
                "delivery limit reached: its lease expired {} times (max_deliveries) without a result",
                taken.deliveries
            );
            tracing::warn!(queue = %ctx.queue.name(), %id, deliveries = taken.deliveries, "dead-lettering a request whose deliveries keep dying");
            ctx.bury(
                &taken.fence,
                &taken.member,
                taken.envelope.as_ref(),
                &reason,
                taken.deliveries,
            );
        }
    }
}

/// Moves due retries (ours, and this queue's entries in the Go retry set) back to pending.
///
/// Between passes it sleeps until the earliest entry left is due (by Redis time), but never
/// longer than the reclaim interval (retries another instance parked before it died), and
/// never shorter than `every` while entries it does not move are due (another queue's in the Go
/// retry set). When this instance parks a retry it looks again within `every`, as often as it
/// looked before it slept, and not sooner: a pool gate's refusals, parked for 50 ms, so come
/// back at most once per `every` each. An idle queue costs one pass per reclaim interval
/// instead of one every `every`. A queue `fair-share` found waits [`FOUND_IDLE_PASS`] (at
/// least) instead of the reclaim interval, before its first pass too.
pub async fn promoter(
    ctx: Arc<QueueCtx>,
    every: Duration,
    go_retry_set: Option<String>,
    default_queue: Arc<AtomicBool>,
    stop: CancellationToken,
) {
    let longest = idle_pass(&ctx, ctx.queue.settings().reclaim_interval.max(every));
    // A queue `fair-share` found was found for new work: what it has parked, another
    // instance parked and looks after; a survivor's pass comes within `longest`.
    let mut sleep = ctx.found.then_some(longest);
    loop {
        if let Some(sleep) = sleep {
            if !wait_for_pass(&ctx, sleep, every, &stop).await {
                return;
            }
        }
        // Whether this is the first queue of the config (Go's fallback for retry-set entries
        // naming no queue); a queues config reload may change it.
        let first = default_queue.load(Ordering::SeqCst);
        sleep = Some(
            match ctx
                .queue
                .promote(PROMOTE_BATCH, go_retry_set.as_deref(), first)
                .await
            {
                Ok(p) => {
                    if p.moved > 0 {
                        ctx.wake.notify_one();
                    }
                    if p.moved as usize >= PROMOTE_BATCH {
                        sleep = None;
                        continue;
                    }
                    promote_sleep(p.until_due, every, longest)
                }
                Err(e) => {
                    tracing::debug!(queue = %ctx.queue.name(), error = %e, "promote failed; will retry");
                    every
                }
            },
        );
    }
}

/// Sleeps `sleep` before the promoter's next pass, cut to `every` from now when this instance
/// parks a retry meanwhile; `false` when stopped.
async fn wait_for_pass(
    ctx: &QueueCtx,
    sleep: Duration,
    every: Duration,
    stop: &CancellationToken,
) -> bool {
    let mut next_pass = tokio::time::Instant::now() + sleep;
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return false,
            _ = tokio::time::sleep_until(next_pass) => return true,
            _ = ctx.parked.notified() => {
                next_pass = next_pass.min(tokio::time::Instant::now() + every);
            }
        }
    }
}

/// How long the promoter sleeps after a pass that left the earliest entry `until_due` away.
fn promote_sleep(until_due: Option<Duration>, every: Duration, longest: Duration) -> Duration {
    match until_due {
        None => longest,
        // Due already yet not moved: another queue's entry in the Go retry set, which is
        // looked at again at the Go processor's pace.
        Some(d) if d.is_zero() => every,
        Some(d) => d.min(longest),
    }
}

/// Reports the pending backlog (ZCARD) every `every`, and whether that read succeeded: a failed
/// read reports a backlog of 0, as Go does, and `broker_backlog_source_available` 0 tells it
/// from an empty queue. The same round trip reads the deadline proximity snapshot (see
/// [`super::proximity`]), left as it was when the read fails.
pub async fn backlog(ctx: Arc<QueueCtx>, every: Duration, stop: CancellationToken) {
    let gauge = ctx.metrics.backlog.get_or_create(&ctx.labels).clone();
    let available = ctx
        .metrics
        .backlog_source_available
        .get_or_create(&ctx.labels)
        .clone();
    let proximity = ctx
        .metrics
        .dispatch
        .deadline_proximity
        .get_or_create(&ctx.labels)
        .clone();
    loop {
        let now_ms = inferq_client::producer::unix_ms();
        let reading =
            super::proximity::read(&mut ctx.queue.connection(), ctx.queue.name(), now_ms).await;
        available.set(i64::from(reading.is_ok()));
        match reading {
            Ok(r) => {
                gauge.set(i64::try_from(r.pending).unwrap_or(i64::MAX));
                proximity.set(&r.within, r.pending);
            }
            Err(_) => {
                gauge.set(0);
            }
        }
        if !tick(&stop, every).await {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_idle_promoter_sleeps_until_the_earliest_retry_is_due_at_most_the_longest_pause() {
        let every = Duration::from_millis(500);
        let longest = Duration::from_secs(5);
        assert_eq!(
            promote_sleep(None, every, longest),
            longest,
            "nothing parked"
        );
        assert_eq!(
            promote_sleep(Some(Duration::from_millis(1200)), every, longest),
            Duration::from_millis(1200),
            "wakes when the retry is due, not a tick later"
        );
        assert_eq!(
            promote_sleep(Some(Duration::from_millis(3)), every, longest),
            Duration::from_millis(3)
        );
        assert_eq!(
            promote_sleep(Some(Duration::from_secs(60)), every, longest),
            longest,
            "an instance that died before it moved its retries"
        );
        assert_eq!(
            promote_sleep(Some(Duration::ZERO), every, longest),
            every,
            "due yet not ours: Go's pace, not a spin"
        );
    }
}
