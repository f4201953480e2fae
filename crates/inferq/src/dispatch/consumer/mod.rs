//! A queue's consumer: peeks at the earliest deadlines, dead-letters members that cannot be
//! requests, claims what is left in one script call that also checks their cancel markers, and
//! hands each claim to its pool. Expired and cancelled claims are finished at
//! once without a worker.
//!
//! It only claims as many requests as its pool channel has room for, so claims wait for a
//! worker for a short time at most. It polls again at once when a batch came back full, and
//! after 10 ms when it came back partly full. After an empty poll it waits for a wake-up
//! ([`super::doorbell`]) for up to `poll_interval`; without wake-ups it polls again after a pause
//! that grows from 10 ms to `poll_interval` while the queue stays empty. A wake-up always cuts
//! the pause short. A queue gate whose budget allows less than a full batch makes the budget a
//! rate, as in Go: one poll of `floor(batch × budget)` per `poll_interval`, wake-ups or not.
//! A request the queue gate turns away is not put to the gate again for `poll_interval` (Go asks
//! once per tick), and a poll that found only such requests waits like an empty one, so a
//! refused head costs the gate, Redis and the decision counters what it costs under Go.
//! While the queue's outbox cannot write results, it claims nothing.
//!
//! Claims are bounded by bytes as well as by count, so long-context prompts of megabytes are
//! no heavier on the processor or on Redis than small ones: while more than
//! [`MAX_WAITING_BYTES`] of claimed members wait in the pool channel for a worker, it claims
//! nothing, and a poll claims no more than the room left (but at least one member). A poll
//! peeks at as many members as the room left holds at the size of the largest member of the
//! previous poll ([`FIRST_LOOK`](window::FIRST_LOOK) members while none has been seen; halved
//! for each poll that failed in a row), so a queue of big members is not read in whole batches
//! either.
//!
//! This file is the poll loop ([`run_consumer`]: room, budget, poll, pause); the rest is in
//! rooms of its own:
//! - [`window`]: where a poll looks down the queue, and how far.
//! - [`poll`]: one poll: look (peek, decode, triage), claim, hand each claim on.
//! - [`triage`]: the queue gate and the last-chance rule, before the claim.
//! - [`dead`]: members that cannot be requests, set aside.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use super::context::{Job, QueueCtx};
use super::fair_share::Reserved;
use crate::ops::Trouble;
use crate::queue::QueueError;

mod dead;
mod poll;
mod triage;
mod window;

pub use triage::dropped_result;

use poll::{poll_once, Poll, Polled};
use window::{Bound, Spread, TurnedAway, FIRST_LOOK};

/// How a consumer polls.
#[derive(Debug, Clone, Copy)]
pub struct Polling {
    pub interval: Duration,
    pub batch: usize,
}

/// How often a consumer looks again whether its outbox can write.
const STALLED_PAUSE: Duration = Duration::from_millis(100);

/// How long a found queue's consumer (`fair-share`) waits for a ring once its queue is empty.
const FOUND_IDLE_PAUSE: Duration = Duration::from_secs(5);

/// The first pause after a poll that found less than a full batch, when no wake-ups arrive.
const FIRST_IDLE_PAUSE: Duration = Duration::from_millis(10);

/// Bytes of claimed members waiting in a queue's pool channel for a worker past which its
/// consumer claims no more (a poll may pass it by one member).
pub const MAX_WAITING_BYTES: usize = 64 << 20;

/// Runs until `stop` is cancelled.
pub async fn run_consumer(
    ctx: Arc<QueueCtx>,
    tx: Sender<Job>,
    polling: Polling,
    stop: CancellationToken,
) {
    let mut consumer = Consumer {
        ctx,
        tx,
        polling,
        stop,
        failures: 0,
        idle: FIRST_IDLE_PAUSE,
        largest: 0,
        away: TurnedAway::default(),
        spread: Spread::default(),
    };
    while consumer.round().await.is_some() {}
}

/// One queue's consumer, and what it carries from one poll to the next.
struct Consumer {
    ctx: Arc<QueueCtx>,
    tx: Sender<Job>,
    polling: Polling,
    stop: CancellationToken,
    /// Polls failed in a row.
    failures: u32,
    /// The pause after the next empty poll while no wake-ups arrive.
    idle: Duration,
    /// The largest member the last poll peeked at (0: none yet).
    largest: usize,
    away: TurnedAway,
    spread: Spread,
}

/// How much the next poll may take, once there is room for it.
struct Sizing {
    want: usize,
    /// Set when the queue gate's budget cut this poll below a full batch: the budget is then
    /// a rate (Go takes floor(batch × budget) once per `poll_interval` tick), so the next
    /// poll waits for the next tick.
    paced_until: Option<tokio::time::Instant>,
}

impl Consumer {
    /// One round: wait for the outbox, for room in the pool, for the gate's budget; poll;
    /// pause. `None` once stopped (or the pool is gone).
    async fn round(&mut self) -> Option<()> {
        // While the outbox cannot write results, claiming more would only pile up finished work
        // (and, when Redis refuses the results, send it all to the gateway for nothing).
        if self.ctx.state.is_outbox_stalled() {
            return self.sleep(STALLED_PAUSE.min(self.polling.interval)).await;
        }
        let room = self.room_in_pool().await?;
        // Claimed members waiting for a worker are bounded by bytes too.
        if !self.ctx.intake_load.has_room() {
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                _ = self.ctx.intake_load.room() => {}
            }
        }
        let budget = self.ctx.intake_load.room_left();
        let want = room.min(self.polling.batch).max(1);
        let Some(Sizing { want, paced_until }) = self.size_by_gate(want).await else {
            record_closed(&self.ctx).await;
            return self.sleep(self.polling.interval).await;
        };
        // In a `fair-share` pool, only at the tenant's turn (see `fair_share::turns`).
        let mut reserved = match &self.ctx.turns {
            Some(turns) => tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                r = turns.reserve(want) => Some(r),
            },
            None => None,
        };
        let want = reserved
            .as_ref()
            .map_or(want, |r| want.min(r.left()).max(1));
        self.away.forget_before(tokio::time::Instant::now());
        let polled = self.poll(want, budget, reserved.as_mut()).await;
        drop(reserved);
        let pause = match polled {
            Ok(polled) => self.after_poll(polled),
            Err(e) => self.after_failure(e).await,
        };
        self.pause(pause, paced_until).await
    }

    /// Sleeps for `pause`; `None` when stopped meanwhile.
    async fn sleep(&self, pause: Duration) -> Option<()> {
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => None,
            _ = tokio::time::sleep(pause) => Some(()),
        }
    }

    /// Waits until the pool can take a whole batch (the channel holds two), so a busy pool is
    /// fed in full batches rather than one poll per freed slot; the room then left.
    async fn room_in_pool(&self) -> Option<usize> {
        let tx = &self.tx;
        let chunk = self.polling.batch.min(tx.max_capacity()).max(1);
        tokio::select! {
            biased;
            _ = self.stop.cancelled() => None,
            permits = tx.reserve_many(chunk) => match permits {
                Ok(p) => { drop(p); Some(tx.capacity()) }
                Err(_) => None,
            },
        }
    }

    /// Cuts `want` to the queue gate's budget, when the queue has a gate. `None`: the gate is
    /// closed.
    async fn size_by_gate(&self, want: usize) -> Option<Sizing> {
        let Some(gate) = &self.ctx.gate else {
            return Some(Sizing {
                want,
                paced_until: None,
            });
        };
        let batch = self.polling.batch;
        let budget = gate.budget().await.clamp(0.0, 1.0);
        self.ctx
            .metrics
            .dispatch_budget
            .get_or_create(&self.ctx.labels)
            .set(budget);
        // Go's sizing: floor(batch × budget); a budget under 1/batch closes the queue.
        let allowed = (batch as f64 * budget).floor() as usize;
        if allowed == 0 {
            return None;
        }
        let paced_until =
            (allowed < batch).then(|| tokio::time::Instant::now() + self.polling.interval);
        Some(Sizing {
            want: want.min(allowed),
            paced_until,
        })
    }

    /// One poll of `want` requests within `budget` bytes (each sent to the pool taking a place
    /// of `turns`, when the pool bounds its waiting claims).
    async fn poll(
        &mut self,
        want: usize,
        budget: usize,
        turns: Option<&mut Reserved>,
    ) -> Result<Polled, QueueError> {
        let bound = Bound {
            budget,
            largest: &mut self.largest,
            failures: self.failures,
            first_look: if turns.is_some() { want } else { FIRST_LOOK },
        };
        let start = self.spread.start(want);
        let poll = Poll {
            ctx: &self.ctx,
            want,
            start,
            bound,
            away: &mut self.away,
            interval: self.polling.interval,
            turns,
        };
        poll_once(poll, &self.tx).await
    }

    /// Learns from a poll that worked, and says how long to pause before the next.
    fn after_poll(&mut self, polled: Polled) -> Duration {
        let Polled {
            seen,
            admitted,
            turned_away,
            window,
            lost,
            overshot,
        } = polled;
        let interval = self.polling.interval;
        self.ctx.state.polled(seen);
        self.spread.note(admitted, lost, overshot);
        if self.failures > 0 {
            self.ctx.readiness.note(&polls_of(&self.ctx), None);
        }
        self.failures = 0;
        if seen >= window && admitted > 0 {
            // A full batch: more is probably waiting.
            self.idle = FIRST_IDLE_PAUSE;
            Duration::ZERO
        } else if admitted == 0 && turned_away > 0 {
            // Only requests the gate turned away or the last-chance rule held back:
            // nothing changes for them before the next tick; a wake-up (new work,
            // perhaps admissible) cuts the wait short.
            interval
        } else if seen > 0 {
            // Work is trickling in (perhaps from producers that ring no bell): look
            // again soon.
            self.idle = FIRST_IDLE_PAUSE;
            FIRST_IDLE_PAUSE.min(interval)
        } else if self.ctx.found {
            // A found queue, empty: the doorbell or the discovery (new work in the index)
            // rings; polling a thousand idle tenants' queues would cost what they serve.
            FOUND_IDLE_PAUSE.max(interval)
        } else if self.ctx.listening.load(Ordering::SeqCst) {
            // Empty: a ring wakes us when work arrives; the interval is the safety net.
            interval
        } else {
            // Empty and no wake-ups: back off to the interval while it stays empty.
            let pause = self.idle.min(interval);
            self.idle = (self.idle * 2).min(interval);
            pause
        }
    }

    /// Takes note of a failed poll (logged the first time and every 50th), and says how long
    /// to pause before the next.
    async fn after_failure(&mut self, e: QueueError) -> Duration {
        let ctx = &self.ctx;
        self.failures = self.failures.saturating_add(1);
        let failures = self.failures;
        ctx.note_failure(&e);
        // Redis refusing the polls makes the processor not ready (an unreachable Redis
        // shows by itself in /readyz's PING).
        if let Some(refused) = e.redis_refusal() {
            ctx.readiness
                .note(&polls_of(ctx), Some(Trouble::Refused(refused.to_string())));
        }
        if failures == 1 || failures % 50 == 0 {
            let error = match &e {
                QueueError::Redis(e) => {
                    format!("redis: {}", ctx.readiness.explain(e).await)
                }
                other => other.to_string(),
            };
            tracing::warn!(queue = %ctx.queue.name(), %error, "cannot poll the queue; retrying");
        }
        self.polling
            .interval
            .min(Duration::from_millis(200) * failures.min(10))
    }

    /// The pause after a poll: until the gate's next tick when the gate paces the polls, else
    /// `pause`, cut short by a wake-up unless the poll failed.
    async fn pause(
        &self,
        pause: Duration,
        paced_until: Option<tokio::time::Instant>,
    ) -> Option<()> {
        let failures = self.failures;
        if let Some(tick) = paced_until.filter(|_| failures == 0) {
            // Wake-ups do not cut this wait short: they would let a busy producer lift the cap.
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                _ = tokio::time::sleep_until(tick) => {}
            }
        } else if !pause.is_zero() {
            tokio::select! {
                biased;
                _ = self.stop.cancelled() => return None,
                _ = self.ctx.wake.notified(), if failures == 0 => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
        Some(())
    }
}

/// Forgets what this queue's consumer told `/readyz` (refused polls or dead letters): for a
/// consumer stopped for good by a queues config reload.
pub(super) fn forget_troubles(ctx: &QueueCtx) {
    ctx.readiness.note(&polls_of(ctx), None);
    ctx.readiness.note(&dead::dead_letters_of(ctx), None);
}

/// What `/readyz` names while Redis refuses this queue's polls.
fn polls_of(ctx: &QueueCtx) -> String {
    format!("the polls of queue {:?}", ctx.queue.name())
}

/// A closed gate is counted as Go counts it: once per poll, and only when work is waiting.
async fn record_closed(ctx: &QueueCtx) {
    let depth: Result<u64, _> = redis::cmd("ZCARD")
        .arg(ctx.queue.name())
        .query_async(&mut ctx.queue.connection())
        .await;
    if depth.is_ok_and(|d| d > 0) {
        ctx.metrics
            .gate_decisions
            .get_or_create(&ctx.labels.with_reason("gate_closed"))
            .inc();
    }
}
