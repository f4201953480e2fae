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
//! previous poll ([`FIRST_LOOK`] members while none has been seen; halved for each poll that
//! failed in a row), so a queue of big members is not read in whole batches either.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::Sender;
use tokio_util::sync::CancellationToken;

use super::bodies::{self, Attached};
use super::context::{Job, QueueCtx};
use super::gates::{Decision, GateInput, Release, Verdict};
use super::last_chance::{LastChance, Slot};
use crate::ops::Trouble;
use crate::queue::dead::DeadRecord;
use crate::queue::keys::claim_key;
use crate::queue::{Claimed, Held, Peeked, QueueError, SetAside};
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
    let mut idle = FIRST_IDLE_PAUSE;
    // The largest member the last poll peeked at (0: none yet).
    let mut largest = 0usize;
    let mut away = TurnedAway::default();
    let mut spread = Spread::default();
    loop {
        // While the outbox cannot write results, claiming more would only pile up finished work
        // (and, when Redis refuses the results, send it all to the gateway for nothing).
        if ctx.outbox_stalled.load(Ordering::SeqCst) {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(STALLED_PAUSE.min(polling.interval)) => {}
            }
            continue;
        }
        // Wait until the pool can take a whole batch (the channel holds two), so a busy pool
        // is fed in full batches rather than one poll per freed slot.
        let chunk = polling.batch.min(tx.max_capacity()).max(1);
        let room = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            permits = tx.reserve_many(chunk) => match permits {
                Ok(p) => { drop(p); tx.capacity() }
                Err(_) => return,
            },
        };
        // Claimed members waiting for a worker are bounded by bytes too.
        if !ctx.intake_load.has_room() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = ctx.intake_load.room() => {}
            }
        }
        let budget = ctx.intake_load.room_left();
        let mut want = room.min(polling.batch).max(1);
        // Set when the queue gate's budget cut this poll below a full batch: the budget is then
        // a rate (Go takes floor(batch × budget) once per `poll_interval` tick), so the next
        // poll waits for the next tick.
        let mut paced_until = None;
        if let Some(gate) = &ctx.gate {
            let budget = gate.budget().await.clamp(0.0, 1.0);
            ctx.metrics
                .dispatch_budget
                .get_or_create(&ctx.labels)
                .set(budget);
            // Go's sizing: floor(batch × budget); a budget under 1/batch closes the queue.
            let allowed = (polling.batch as f64 * budget).floor() as usize;
            if allowed == 0 {
                record_closed(&ctx).await;
                tokio::select! {
                    biased;
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(polling.interval) => {}
                }
                continue;
            }
            if allowed < polling.batch {
                paced_until = Some(tokio::time::Instant::now() + polling.interval);
            }
            want = want.min(allowed);
        }
        away.forget_before(tokio::time::Instant::now());
        let bound = Bound {
            budget,
            largest: &mut largest,
            failures,
        };
        let start = spread.start(want);
        let pause = match poll_once(&ctx, &tx, want, start, bound, &mut away, polling.interval)
            .await
        {
            Ok(Polled {
                seen,
                admitted,
                turned_away,
                window,
                lost,
                overshot,
            }) => {
                spread.note(admitted, lost, overshot);
                if failures > 0 {
                    ctx.readiness.note(&polls_of(&ctx), None);
                }
                failures = 0;
                if seen >= window && admitted > 0 {
                    // A full batch: more is probably waiting.
                    idle = FIRST_IDLE_PAUSE;
                    Duration::ZERO
                } else if admitted == 0 && turned_away > 0 {
                    // Only requests the gate turned away or the last-chance rule held back:
                    // nothing changes for them before the next tick; a wake-up (new work,
                    // perhaps admissible) cuts the wait short.
                    polling.interval
                } else if seen > 0 {
                    // Work is trickling in (perhaps from producers that ring no bell): look
                    // again soon.
                    idle = FIRST_IDLE_PAUSE;
                    FIRST_IDLE_PAUSE.min(polling.interval)
                } else if ctx.listening.load(Ordering::SeqCst) {
                    // Empty: a ring wakes us when work arrives; the interval is the safety net.
                    polling.interval
                } else {
                    // Empty and no wake-ups: back off to the interval while it stays empty.
                    let pause = idle.min(polling.interval);
                    idle = (idle * 2).min(polling.interval);
                    pause
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                ctx.note_failure(&e);
                // Redis refusing the polls makes the processor not ready (an unreachable Redis
                // shows by itself in /readyz's PING).
                if let Some(refused) = e.redis_refusal() {
                    ctx.readiness
                        .note(&polls_of(&ctx), Some(Trouble::Refused(refused.to_string())));
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
                polling
                    .interval
                    .min(Duration::from_millis(200) * failures.min(10))
            }
        };
        if let Some(tick) = paced_until.filter(|_| failures == 0) {
            // Wake-ups do not cut this wait short: they would let a busy producer lift the cap.
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(tick) => {}
            }
        } else if !pause.is_zero() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => return,
                _ = ctx.wake.notified(), if failures == 0 => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }
}

/// Forgets what this queue's consumer told `/readyz` (refused polls or dead letters): for a
/// consumer stopped for good by a queues config reload.
pub(super) fn forget_troubles(ctx: &QueueCtx) {
    ctx.readiness.note(&polls_of(ctx), None);
    ctx.readiness.note(&dead_letters_of(ctx), None);
}

/// What `/readyz` names while Redis refuses this queue's polls.
fn polls_of(ctx: &QueueCtx) -> String {
    format!("the polls of queue {:?}", ctx.queue.name())
}

/// How often a consumer looks again whether its outbox can write.
const STALLED_PAUSE: Duration = Duration::from_millis(100);

/// The first pause after a poll that found less than a full batch, when no wake-ups arrive.
const FIRST_IDLE_PAUSE: Duration = Duration::from_millis(10);

/// Bytes of claimed members waiting in a queue's pool channel for a worker past which its
/// consumer claims no more (a poll may pass it by one member).
pub const MAX_WAITING_BYTES: usize = 64 << 20;

/// How many members a peek asks for while their size is unknown (no member seen yet): a queue
/// of members of many megabytes is not first read a whole batch at a time.
const FIRST_LOOK: usize = 16;

/// How many bytes of members one poll may claim, and the size of the largest member the last
/// poll peeked at, which sizes this poll's peek (and is updated by it).
struct Bound<'a> {
    budget: usize,
    largest: &'a mut usize,
    /// Polls failed in a row before this one: each halves the peek, so a read too big for
    /// Redis to answer in time (or at all) is not asked for again and again at the same size.
    failures: u32,
}

impl Bound<'_> {
    /// How many members a peek may ask for, at most `page`: as many as the budget holds at the
    /// size of the largest member seen (last poll, or this one so far), [`FIRST_LOOK`] while
    /// none has been seen, halved for each poll failed in a row; at least one.
    fn page(&self, page: usize, seen_largest: usize) -> usize {
        let known = (*self.largest).max(seen_largest);
        let fits = match self.budget.checked_div(known) {
            Some(fits) => fits.max(1),
            None => FIRST_LOOK,
        };
        page.min(fits)
            .checked_shr(self.failures)
            .unwrap_or(0)
            .max(1)
    }
}

/// How far down the queue a poll starts to look while other instances take the same requests.
///
/// Every instance with room peeks the head of the queue, and when two peek it at once, the
/// first claim takes the batch and the second finds it gone: its peek, its decoding and its
/// claim were for nothing, and it peeks the new head straight away, alongside the others that
/// lost. Eight busy instances on one queue spent seven claims for each that took anything
/// (Redis's CPU per request doubled). An instance that keeps losing starts its polls at a
/// random one of `2^level` windows of a batch each (level up to [`MAX_SPREAD`]), so instances
/// racing for work spread over the first few batches of the queue instead of all taking the
/// head; every [`CLEAN_POLLS`] polls in a row that lose nothing bring it one level back towards
/// the head, and so does a poll that finds the queue shorter than where it started. A queue
/// served by one instance never leaves the head. Requests are then taken out of deadline
/// order by at most `2^MAX_SPREAD` batches, which latency-insensitive work does not notice.
#[derive(Default)]
struct Spread {
    level: u32,
    /// Polls in a row that lost nothing.
    clean: u32,
}

/// At most `2^MAX_SPREAD` windows: with batches of 256, a poll starts within the first 4,096
/// requests of the queue (and never past [`MAX_LOOK`]`/ 2`).
const MAX_SPREAD: u32 = 4;

/// Polls in a row that lose nothing before a poll starts one level nearer the head. Coming
/// back at once after every clean poll put the instances back on the head together: in drains
/// of 40,000 requests by four and by eight instances, a level back after 4–16 clean polls lost
/// a third to a half as many requests to other instances as a level back after each one.
const CLEAN_POLLS: u32 = 8;

impl Spread {
    /// Where the next poll of `want` members starts: the head, or a random window past it.
    fn start(&self, want: usize) -> usize {
        if self.level == 0 {
            return 0;
        }
        let windows = 1usize << self.level;
        let window = rand::random_range(0..windows);
        window.saturating_mul(want).min(MAX_LOOK / 2)
    }

    /// Learns from a poll that claimed `admitted` members of which `lost` were gone (taken by
    /// another instance between the peek and the claim), and that found the queue shorter than
    /// its start when `overshot`.
    fn note(&mut self, admitted: usize, lost: usize, overshot: bool) {
        if overshot {
            // Too short a queue to spread over this many windows.
            self.level = self.level.saturating_sub(1);
        }
        if admitted > 0 && lost.saturating_mul(2) >= admitted {
            self.level = (self.level + 1).min(MAX_SPREAD);
            self.clean = 0;
        } else if lost == 0 {
            self.clean += 1;
            if self.clean >= CLEAN_POLLS {
                self.level = self.level.saturating_sub(1);
                self.clean = 0;
            }
        }
    }
}

/// What one poll saw and did.
struct Polled {
    /// Members peeked, over every page.
    seen: usize,
    /// Members admitted by the gate and the last-chance rule (claimed or not).
    admitted: usize,
    /// Members the gate turned away or the last-chance rule held back, in this poll or lately
    /// (see [`TurnedAway`]).
    turned_away: usize,
    /// How many were asked for, over every page.
    window: usize,
    /// Members the claim found gone: taken by another instance after this poll peeked them.
    lost: usize,
    /// The queue ended before the rank this poll started at (it looked at the head instead).
    overshot: bool,
}

/// With a gate, a poll's first look reaches this many times further than it may take, so a
/// few requests the gate refuses at the head cost no second look.
const GATED_LOOKAHEAD: usize = 4;

/// How many members one poll looks at, at most, page after page, for requests it may take past
/// those it may not take now (turned away by the gate, or held back by the last-chance rule):
/// past that many at the head, the requests behind them wait until the head clears.
const MAX_LOOK: usize = 10_000;

/// Requests (by claim key) the queue gate turned away lately, or that the last-chance rule held
/// back, each with the time until which it is not asked again: Go puts a refused request to the
/// gate once per poll tick, and so does inferq, however often it polls for the work behind it.
/// Each entry lasts one tick.
#[derive(Default)]
struct TurnedAway {
    until: HashMap<String, tokio::time::Instant>,
}

impl TurnedAway {
    fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    fn is_recent(&self, key: &str, now: tokio::time::Instant) -> bool {
        self.until.get(key).is_some_and(|until| *until > now)
    }

    fn note(&mut self, key: String, until: tokio::time::Instant) {
        self.until.insert(key, until);
    }

    fn forget_before(&mut self, now: tokio::time::Instant) {
        self.until.retain(|_, until| *until > now);
    }
}

/// One poll: peek, triage, gate, claim, hand over.
async fn poll_once(
    ctx: &Arc<QueueCtx>,
    tx: &Sender<Job>,
    want: usize,
    start: usize,
    bound: Bound<'_>,
    away: &mut TurnedAway,
    interval: Duration,
) -> Result<Polled, QueueError> {
    let mut page = if ctx.gate.is_some() {
        (want * GATED_LOOKAHEAD).min(1000)
    } else {
        want
    };
    // Bytes of the candidates so far, and whether the budget ended the poll before `want`.
    let mut bytes = 0usize;
    let mut spent = false;
    let mut largest = 0usize;
    let mut window = 0;
    // The rank the next page starts at: past the head while instances race (see [`Spread`]).
    let mut rank = start;
    let mut overshot = false;
    let mut seen = 0;
    let mut candidates = Vec::with_capacity(want);
    let mut admissions = Vec::with_capacity(want);
    let mut turned_away = 0;
    let now = tokio::time::Instant::now();
    // Page after page while the head holds requests that may not be taken now: rule 9, a
    // refused request does not block the requests behind it. Ranks shift as other instances
    // claim and producers add: a member missed is seen next poll, and one seen twice is
    // claimed once (the claim script answers "gone" for the second).
    while candidates.len() < want && window < MAX_LOOK && !spent {
        let asked = bound.page(page, largest).min(MAX_LOOK - window);
        let peeked = ctx.queue.peek_from(rank, asked).await?;
        if rank > 0 && window == 0 && peeked.len() < asked {
            // The queue ends before a whole window past the head: look at the head instead.
            rank = 0;
            overshot = true;
            continue;
        }
        rank += asked;
        window += asked;
        seen += peeked.len();
        let full = peeked.len() == asked;
        largest = peeked
            .iter()
            .map(|p| p.member.len())
            .fold(largest, usize::max);
        for Peeked { member, .. } in peeked {
            if candidates.len() >= want {
                break;
            }
            // Past the budget: this member and those behind it wait for the next poll.
            if !candidates.is_empty() && bytes.saturating_add(member.len()) > bound.budget {
                spent = true;
                break;
            }
            let env = match Envelope::decode(&member) {
                Ok(env) => stamp(ctx, env),
                Err(e) => {
                    // Dead-lettered; one Redis refuses to set aside (the dead list outside
                    // the ACL, or of the wrong type) stays pending and is passed over until
                    // the next tick, so it does not stop the queue behind it (rule 10).
                    let key = claim_key("", "", &member);
                    let passed_over = away.is_recent(&key, now) || {
                        let refused = !set_aside(ctx, &member, &e.to_string()).await?;
                        if refused {
                            away.note(key, now + interval);
                        }
                        refused
                    };
                    turned_away += usize::from(passed_over);
                    continue;
                }
            };
            // The claim key is made only while some request is turned away, or for a new
            // refusal.
            let key_of =
                |env: &Envelope| claim_key(&env.request.id, &env.internal.request_token, &member);
            if !away.is_empty() && away.is_recent(&key_of(&env), now) {
                turned_away += 1;
                continue;
            }
            match admit(ctx, env).await {
                Ok((env, admission)) => {
                    bytes = bytes.saturating_add(member.len());
                    candidates.push((member, env));
                    admissions.push(admission);
                }
                Err(env) => {
                    turned_away += 1;
                    away.note(key_of(&env), now + interval);
                }
            }
        }
        if !full || turned_away == 0 {
            break;
        }
        // A long head of them is crossed in few round trips.
        page = page.max((page * 2).min(1000));
    }
    if seen > 0 {
        *bound.largest = largest;
    }
    if spent {
        // The budget, not the queue, ended this poll: look again as soon as there is room.
        window = seen;
    }
    if seen == 0 {
        return Ok(Polled {
            seen,
            admitted: 0,
            turned_away: 0,
            window,
            lost: 0,
            overshot,
        });
    }
    // A request the last-chance rule holds back counts as turned away: it is not looked at
    // again before the next tick, so a head of them neither spins the poll nor hides the
    // requests behind it.
    let held_back = last_chance_slots(ctx, &mut candidates, &mut admissions).await?;
    let slots = held_back.slots;
    for key in held_back.keys {
        turned_away += 1;
        away.note(key, now + interval);
    }
    let admitted = candidates.len();
    let taken_at = Instant::now();
    let sizes: Vec<usize> = candidates.iter().map(|(member, _)| member.len()).collect();
    let claimed = ctx.queue.claim(candidates).await?;
    let lost = claimed
        .iter()
        .filter(|claim| matches!(claim, Claimed::Gone))
        .count();
    ctx.series.claims_lost.get().inc_by(lost as u64);
    let now_ms = crate::queue::producer::unix_ms();
    let mut held_now = Vec::with_capacity(claimed.len());
    for (((claim, admission), slot), size) in
        claimed.into_iter().zip(admissions).zip(slots).zip(sizes)
    {
        let Claimed::Held(held) = claim else {
            // Not ours after all: undo the gate's reservations now.
            Decision::release_all(admission.releases).await;
            continue;
        };
        held_now.push((*held, admission, slot, size));
    }
    let bodies = attach_bodies(ctx, &mut held_now, now_ms).await;
    for ((held, admission, slot, size), body) in held_now.into_iter().zip(bodies) {
        let cancelled = held.cancelled;
        ctx.series.deliveries.get().inc();
        let env = &held.envelope;
        let ticket = ctx.holdings.insert(
            held.fence.clone(),
            &env.request.id,
            &env.internal.request_token,
            taken_at,
        );
        let mut job = Job::new(ctx.clone(), held, ticket, admission.releases);
        job.hold_last_chance(slot);
        if let Some(result) = admission.dropped {
            ctx.metrics
                .gate_decisions
                .get_or_create(&ctx.labels.with_reason("dropped"))
                .inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(dropped_result(&id, result));
        } else if cancelled {
            ctx.series.cancelled.get().inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::cancelled(&id));
        } else if job.held.envelope.request.deadline.saturating_mul(1000) <= now_ms {
            ctx.series.exceeded.get().inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::deadline_exceeded(&id));
        } else if let Attached::Unavailable(why) = body {
            let id = job.held.envelope.request.id.clone();
            tracing::warn!(queue = %ctx.queue.name(), id, payload_ref = %job.held.envelope.internal.payload_ref, why, "request not sent: its body stored apart cannot be read");
            job.publish(ResultMessage::error(
                &id,
                ErrorCode::PayloadUnavailable,
                why,
            ));
        } else if let Attached::Unread(error) = body {
            // Dropping the job releases its claim: it is tried again at the next poll.
            tracing::warn!(queue = %ctx.queue.name(), error, "cannot read request bodies stored apart; the claims go back to pending");
            drop(job);
        } else {
            ctx.series.queue_depth.get().inc();
            job.wait_for_worker(size);
            if let Err(returned) = tx.send(job).await {
                // The pool is gone (shutdown): dropping the job releases its claim.
                ctx.series.queue_depth.get().dec();
                drop(returned);
            }
        }
    }
    Ok(Polled {
        seen,
        admitted,
        turned_away,
        window,
        lost,
        overshot,
    })
}

/// Reads the bodies stored apart of the claims that will be sent (not dropped, cancelled or
/// past their deadline), one read for the poll; [`Attached::Ready`] for the others.
async fn attach_bodies(
    ctx: &QueueCtx,
    held: &mut [(Held, Admission, Option<Slot>, usize)],
    now_ms: i64,
) -> Vec<Attached> {
    let sent = |(h, a, _, _): &(Held, Admission, Option<Slot>, usize)| {
        a.dropped.is_none()
            && !h.cancelled
            && h.envelope.request.deadline.saturating_mul(1000) > now_ms
    };
    let at: Vec<usize> = (0..held.len()).filter(|&i| sent(&held[i])).collect();
    let mut envelopes: Vec<&mut Envelope> = held
        .iter_mut()
        .filter(|h| sent(h))
        .map(|(h, _, _, _)| &mut h.envelope)
        .collect();
    let attached = bodies::attach(&ctx.queue, &mut envelopes).await;
    let mut out = vec![Attached::Ready; held.len()];
    for (i, a) in at.into_iter().zip(attached) {
        out[i] = a;
    }
    out
}

/// The queue gate's word on one request, when it may be claimed.
struct Admission {
    releases: Vec<Release>,
    /// `Some` when the gate drops the request: claim it and finish it with this result.
    dropped: Option<Option<ResultMessage>>,
}

/// Asks the queue gate. `Err`: leave the request pending (refused, waiting, or the gate failed).
async fn admit(ctx: &QueueCtx, mut env: Envelope) -> Result<(Envelope, Admission), Envelope> {
    let Some(gate) = &ctx.gate else {
        return Ok((
            env,
            Admission {
                releases: Vec::new(),
                dropped: None,
            },
        ));
    };
    let input = GateInput {
        metadata: &env.request.metadata,
        labels: &env.internal.labels,
    };
    let decision = match gate.apply(input).await {
        Ok(d) => d,
        Err(e) => {
            ctx.metrics
                .gate_decisions
                .get_or_create(&ctx.labels.with_reason("error"))
                .inc();
            tracing::warn!(queue = %ctx.queue.name(), error = %e, "queue gate failed; the request stays pending");
            return Err(env);
        }
    };
    if let Some(class) = &decision.classification {
        env.internal
            .labels
            .insert("classification".to_owned(), class.clone());
    }
    match decision.verdict {
        Verdict::Continue => Ok((
            env,
            Admission {
                releases: decision.releases,
                dropped: None,
            },
        )),
        Verdict::Drop(result) => Ok((
            env,
            Admission {
                releases: decision.releases,
                dropped: Some(result),
            },
        )),
        Verdict::Wait | Verdict::Refuse => {
            ctx.turn_away(decision, &ctx.labels, true).await;
            Err(env)
        }
    }
}

/// The result of a gate's drop: its own (with the request's id) or `GATE_DROPPED`.
pub fn dropped_result(id: &str, result: Option<ResultMessage>) -> ResultMessage {
    match result {
        Some(mut r) => {
            r.id = id.to_owned();
            r
        }
        None => ResultMessage::error(id, ErrorCode::GateDropped, "Pool gating dropped request"),
    }
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

/// What the last-chance rule made of a poll's candidates.
struct LastChances {
    /// Per candidate kept, the slot it holds (a request on its last chance) or none.
    slots: Vec<Option<Slot>>,
    /// The claim keys of the candidates held back: on their last chance while this instance
    /// runs another.
    keys: Vec<String>,
}

/// Applies the last-chance rule (see [`super::last_chance`]) to the candidates: a request on
/// its last delivery gets the queue's one slot, or stays pending (and its gate reservations
/// are returned) while this instance runs another. One HMGET of the delivery counts.
async fn last_chance_slots(
    ctx: &QueueCtx,
    candidates: &mut Vec<(Vec<u8>, Envelope)>,
    admissions: &mut Vec<Admission>,
) -> Result<LastChances, QueueError> {
    let mut out = LastChances {
        slots: Vec::new(),
        keys: Vec::new(),
    };
    if candidates.is_empty() {
        return Ok(out);
    }
    let keys: Vec<String> = candidates
        .iter()
        .map(|(member, e)| claim_key(&e.request.id, &e.internal.request_token, member))
        .collect();
    let counts: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(&ctx.queue.keys().deliveries)
        .arg(&keys)
        .query_async(&mut ctx.queue.connection())
        .await?;
    let threshold = LastChance::threshold(ctx.queue.settings().max_deliveries);
    let mut kept = Vec::with_capacity(candidates.len());
    let mut kept_admissions = Vec::with_capacity(candidates.len());
    for (((candidate, admission), count), key) in candidates
        .drain(..)
        .zip(admissions.drain(..))
        .zip(counts.into_iter().chain(std::iter::repeat(None)))
        .zip(keys)
    {
        if count.unwrap_or(0) < threshold {
            out.slots.push(None);
        } else if let Some(slot) = ctx.last_chance.try_take() {
            out.slots.push(Some(slot));
        } else {
            Decision::release_all(admission.releases).await;
            out.keys.push(key);
            continue;
        }
        kept.push(candidate);
        kept_admissions.push(admission);
    }
    *candidates = kept;
    *admissions = kept_admissions;
    Ok(out)
}

/// What `/readyz` names while Redis refuses to set this queue's bad members aside.
fn dead_letters_of(ctx: &QueueCtx) -> String {
    format!("the dead list of queue {:?}", ctx.queue.name())
}

/// [`dead_letter`], and whether it was done: `false` when Redis refuses it (a dead list outside
/// this user's rights or of the wrong type), which `/readyz` then names until a bad member is
/// set aside again. An outage is an error, as for any poll.
async fn set_aside(ctx: &QueueCtx, member: &[u8], reason: &str) -> Result<bool, QueueError> {
    match dead_letter(ctx, member, reason).await {
        Ok(()) => {
            ctx.readiness.note(&dead_letters_of(ctx), None);
            Ok(true)
        }
        Err(e) => match e.redis_refusal() {
            Some(refused) => {
                tracing::warn!(queue = %ctx.queue.name(), error = %refused, "Redis refuses to dead-letter a member that is not a valid request; it stays pending and the queue behind it goes on");
                ctx.readiness.note(
                    &dead_letters_of(ctx),
                    Some(Trouble::Refused(refused.to_string())),
                );
                Ok(false)
            }
            None => Err(e),
        },
    }
}

/// pending -> dead for a member that cannot be a request. When Redis will not take its
/// `INVALID_REQUEST` result (a result list the member names that this user may not write, or
/// that holds another type), the member is set aside without it, its record saying why: one bad
/// member must not stop the queue behind it.
async fn dead_letter(ctx: &QueueCtx, member: &[u8], reason: &str) -> Result<(), QueueError> {
    let (mut record, who) = DeadRecord::about(ctx.queue.name(), reason, member, None);
    let result = who.map(|(id, routing)| {
        // Go's form: `Failed: deadline is missing or invalid (Unix seconds).`
        let mut msg = ResultMessage::error(
            &id,
            ErrorCode::InvalidRequest,
            &format!("Failed: {reason}."),
        );
        msg.request_token = routing.request_token.clone();
        (ctx.result_route(&routing), msg)
    });
    let with_result = result.as_ref().map(|(route, msg)| (route, msg));
    let list = with_result.map(|(route, _)| route.list.as_str());
    let mut outcome = ctx
        .queue
        .dead_letter(member, &record.to_json(), with_result)
        .await?;
    if let (SetAside::ResultRefused(why), Some(list)) = (&outcome, list) {
        tracing::error!(queue = %ctx.queue.name(), result_list = %list, error = %why, "Redis refused an INVALID_REQUEST result; dead-lettering the member without it");
        record.reason = format!(
            "{}; its INVALID_REQUEST result could not be published to {list:?}: {why}",
            record.reason
        );
        outcome = ctx
            .queue
            .dead_letter(member, &record.to_json(), None)
            .await?;
    }
    if outcome == SetAside::Moved {
        ctx.metrics
            .dead_letters
            .get_or_create(&ctx.labels.with_outcome("undecodable"))
            .inc();
        tracing::warn!(queue = %ctx.queue.name(), id = %record.id, %reason, "dead-lettered a member that is not a valid request");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(budget: usize, largest: usize, failures: u32, seen: usize, page: usize) -> usize {
        let mut largest = largest;
        Bound {
            budget,
            largest: &mut largest,
            failures,
        }
        .page(page, seen)
    }

    #[test]
    fn a_lone_instance_always_starts_at_the_head() {
        let mut spread = Spread::default();
        for _ in 0..100 {
            spread.note(256, 0, false);
            assert_eq!(spread.start(256), 0);
        }
    }

    #[test]
    fn instances_that_keep_losing_spread_over_more_windows_and_come_back() {
        let mut spread = Spread::default();
        // Half a batch lost is a race lost.
        spread.note(256, 128, false);
        assert_eq!(spread.level, 1);
        for _ in 0..10 {
            spread.note(256, 256, false);
        }
        assert_eq!(spread.level, MAX_SPREAD);
        let starts: std::collections::BTreeSet<usize> =
            (0..2000).map(|_| spread.start(256)).collect();
        let windows: Vec<usize> = (0..1 << MAX_SPREAD).map(|w| w * 256).collect();
        assert_eq!(starts.into_iter().collect::<Vec<_>>(), windows);
        // Huge batches never start past half of the furthest a poll may look.
        assert!((0..200).all(|_| spread.start(5_000) <= MAX_LOOK / 2));
        // A few lost members are no race; clean polls bring it back a level at a time.
        spread.note(256, 3, false);
        assert_eq!(spread.level, MAX_SPREAD);
        for _ in 0..CLEAN_POLLS - 1 {
            spread.note(256, 0, false);
        }
        assert_eq!(spread.level, MAX_SPREAD);
        spread.note(256, 0, false);
        assert_eq!(spread.level, MAX_SPREAD - 1);
        // A queue shorter than the start brings it back at once.
        spread.note(0, 0, true);
        assert_eq!(spread.level, MAX_SPREAD - 2);
    }

    #[test]
    fn a_peek_is_sized_by_the_bytes_it_may_claim() {
        let mib = 1 << 20;
        // Small members: the batch.
        assert_eq!(page(64 * mib, 300, 0, 0, 256), 256);
        // 8 MB members: as many as 64 MiB holds.
        assert_eq!(page(64 * mib, 8 * mib, 0, 0, 256), 8);
        // Bigger than the whole budget, or no budget left: still one.
        assert_eq!(page(64 * mib, 100 * mib, 0, 0, 256), 1);
        assert_eq!(page(0, 300, 0, 0, 256), 1);
        // Nothing seen yet: a first look, not a whole batch; a small batch as it is.
        assert_eq!(page(64 * mib, 0, 0, 0, 256), FIRST_LOOK);
        assert_eq!(page(64 * mib, 0, 0, 0, 10), 10);
        // A big member seen earlier in this poll counts as the last poll's would.
        assert_eq!(page(64 * mib, 300, 0, 16 * mib, 256), 4);
    }

    #[test]
    fn failed_polls_in_a_row_shrink_the_peek_to_one() {
        let mib = 1 << 20;
        assert_eq!(page(64 * mib, 300, 1, 0, 256), 128);
        assert_eq!(page(64 * mib, 300, 3, 0, 256), 32);
        assert_eq!(page(64 * mib, 300, 8, 0, 256), 1);
        assert_eq!(page(64 * mib, 300, 10_000, 0, 256), 1);
        assert_eq!(page(64 * mib, 0, 2, 0, 256), FIRST_LOOK / 4);
    }
}
