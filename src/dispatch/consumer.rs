//! A queue's consumer: peeks at the earliest deadlines, dead-letters members that cannot be
//! requests, checks cancel markers for the batch in one round trip, claims what is left in one
//! script call, and hands each claim to its pool. Expired and cancelled claims are finished at
//! once without a worker.
//!
//! It only claims as many requests as its pool channel has room for, so claims wait for a
//! worker for a short time at most, and it polls again at once when a batch came back full.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use super::context::{Job, QueueCtx};
use crate::queue::dead::DeadRecord;
use crate::queue::{Claimed, Peeked, QueueError};
use crate::wire::{Envelope, ErrorCode, ResultMessage};

/// How a consumer polls.
#[derive(Debug, Clone, Copy)]
pub struct Polling {
    pub interval: Duration,
    pub batch: usize,
}

/// Runs until `stop` is cancelled.
pub async fn run_consumer(
    ctx: Arc<QueueCtx>,
    tx: Sender<Job>,
    polling: Polling,
    stop: CancellationToken,
) {
    let mut failures = 0u32;
    loop {
        // Wait until the pool can take at least one more request.
        let room = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            permit = tx.reserve() => match permit {
                Ok(p) => { drop(p); tx.capacity() }
                Err(_) => return,
            },
        };
        let want = room.min(polling.batch).max(1);
        let pause = match poll_once(&ctx, &tx, want).await {
            Ok(seen) => {
                failures = 0;
                if seen >= want {
                    Duration::ZERO
                } else {
                    polling.interval
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 || failures % 50 == 0 {
                    tracing::warn!(queue = %ctx.queue.name(), error = %e, "cannot poll the queue; retrying");
                }
                polling
                    .interval
                    .min(Duration::from_millis(200) * failures.min(10))
            }
        };
        if !pause.is_zero() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// One poll. Returns how many members it saw at the head of the queue.
async fn poll_once(
    ctx: &Arc<QueueCtx>,
    tx: &Sender<Job>,
    want: usize,
) -> Result<usize, QueueError> {
    let peeked = ctx.queue.peek(want).await?;
    let seen = peeked.len();
    if seen == 0 {
        return Ok(0);
    }
    let mut candidates = Vec::with_capacity(seen);
    for Peeked { member, .. } in peeked {
        match Envelope::decode(&member) {
            Ok(env) => candidates.push((member, stamp(ctx, env))),
            Err(e) => dead_letter(ctx, &member, &e.to_string()).await?,
        }
    }
    let cancelled = cancel_markers(ctx, &candidates).await?;
    let taken_at = Instant::now();
    let claimed = ctx.queue.claim(candidates).await?;
    let now_ms = crate::queue::producer::unix_ms();
    for (claim, cancelled) in claimed.into_iter().zip(cancelled) {
        let Claimed::Held(held) = claim else {
            continue;
        };
        let held = *held;
        ctx.metrics.deliveries.get_or_create(&ctx.labels).inc();
        let env = &held.envelope;
        let ticket = ctx.holdings.insert(
            held.fence.clone(),
            &env.request.id,
            &env.internal.request_token,
            taken_at,
        );
        let job = Job::new(ctx.clone(), held, ticket);
        if cancelled {
            ctx.metrics.cancelled.get_or_create(&ctx.labels).inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::cancelled(&id));
        } else if job.held.envelope.request.deadline.saturating_mul(1000) <= now_ms {
            ctx.metrics.exceeded.get_or_create(&ctx.labels).inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::deadline_exceeded(&id));
        } else {
            ctx.metrics.queue_depth.get_or_create(&ctx.labels).inc();
            if let Err(returned) = tx.send(job).await {
                // The pool is gone (shutdown): dropping the job releases its claim.
                ctx.metrics.queue_depth.get_or_create(&ctx.labels).dec();
                drop(returned);
            }
        }
    }
    Ok(seen)
}

/// Stamps the queue's routing into the in-process envelope, as Go does at dequeue.
fn stamp(ctx: &QueueCtx, mut env: Envelope) -> Envelope {
    if env.internal.request_queue_name.is_empty() {
        env.internal.request_queue_name = ctx.spec.queue_name.clone();
    }
    if env.internal.queue_id.is_empty() {
        env.internal.queue_id = ctx.spec.id.clone();
    }
    for (k, v) in &ctx.spec.labels {
        env.internal.labels.insert(k.clone(), v.clone());
    }
    env
}

/// Which candidates the producer has cancelled (one MGET for the batch).
async fn cancel_markers(
    ctx: &QueueCtx,
    candidates: &[(Vec<u8>, Envelope)],
) -> Result<Vec<bool>, QueueError> {
    let keys: Vec<String> = candidates
        .iter()
        .filter(|(_, e)| !e.internal.request_token.is_empty())
        .map(|(_, e)| crate::queue::keys::cancel_key(&e.request.id))
        .collect();
    if keys.is_empty() {
        return Ok(vec![false; candidates.len()]);
    }
    let markers: Vec<Option<String>> = redis::cmd("MGET")
        .arg(&keys)
        .query_async(&mut ctx.queue.connection())
        .await?;
    let mut markers = markers.into_iter();
    Ok(candidates
        .iter()
        .map(|(_, e)| {
            if e.internal.request_token.is_empty() {
                return false;
            }
            markers.next().flatten().as_deref() == Some(e.internal.request_token.as_str())
        })
        .collect())
}

/// pending -> dead for a member that cannot be a request.
async fn dead_letter(ctx: &QueueCtx, member: &[u8], reason: &str) -> Result<(), QueueError> {
    let mut record = DeadRecord::new(ctx.queue.name(), reason, member);
    let salvaged = Envelope::salvage_id(member);
    let result = salvaged.as_ref().map(|(id, routing)| {
        record.id = id.clone();
        record.request_token = routing.request_token.clone();
        (
            ctx.result_list(routing),
            ResultMessage::error(id, ErrorCode::InvalidRequest, &format!("Failed: {reason}")),
        )
    });
    let moved = ctx
        .queue
        .dead_letter(
            member,
            &record.to_json(),
            result.as_ref().map(|(list, msg)| (list.as_str(), msg)),
        )
        .await?;
    if moved {
        ctx.metrics
            .dead_letters
            .get_or_create(&ctx.labels.with_outcome("undecodable"))
            .inc();
        tracing::warn!(queue = %ctx.queue.name(), id = %record.id, %reason, "dead-lettered a member that is not a valid request");
    }
    Ok(())
}
