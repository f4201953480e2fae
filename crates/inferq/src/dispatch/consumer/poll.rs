//! One poll of a queue: look down it page after page (peek, decode, triage), claim what may be
//! taken in one script call, and hand each claim on: finished at once (dropped by the gate,
//! cancelled, past its deadline, its body unavailable), released (its body unread), or sent
//! into the pool channel for a worker.
//!
//! The consumer hands in a [`Poll`] (how many to take, where to start, the byte bound, the
//! requests turned away lately) and gets back what the poll saw and did ([`Polled`]), which
//! paces its next poll.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc::Sender;

use super::dead::set_aside;
use super::dropped_result;
use super::triage::{admit, last_chance_slots, stamp, Admission};
use super::window::{Bound, TurnedAway, GATED_LOOKAHEAD, MAX_LOOK};
use crate::dispatch::bodies::{self, Attached};
use crate::dispatch::context::{Job, QueueCtx};
use crate::dispatch::fair_share::{Reserved, Turn};
use crate::dispatch::gates::Decision;
use crate::dispatch::last_chance::Slot;
use crate::queue::{Claimed, Held, Peeked, QueueError};
use inferq_client::keys::claim_key;
use inferq_client::wire::{Envelope, ErrorCode, ResultMessage};

/// What one poll is asked to do.
pub(super) struct Poll<'a> {
    pub(super) ctx: &'a Arc<QueueCtx>,
    /// How many requests it may take.
    pub(super) want: usize,
    /// The rank its first page starts at: past the head while instances race (see
    /// [`super::window::Spread`]).
    pub(super) start: usize,
    pub(super) bound: Bound<'a>,
    pub(super) away: &'a mut TurnedAway,
    /// How long a request turned away now is passed over: one tick (`poll_interval`).
    pub(super) interval: Duration,
    /// The room this poll may fill in a `fair-share` pool: a place for each request sent on.
    pub(super) turns: Option<&'a mut Reserved>,
}

/// What one poll saw and did.
pub(super) struct Polled {
    /// Members peeked, over every page.
    pub(super) seen: usize,
    /// Members admitted by the gate and the last-chance rule (claimed or not).
    pub(super) admitted: usize,
    /// Members the gate turned away or the last-chance rule held back, in this poll or lately
    /// (see [`TurnedAway`]).
    pub(super) turned_away: usize,
    /// How many were asked for, over every page.
    pub(super) window: usize,
    /// Members the claim found gone: taken by another instance after this poll peeked them.
    pub(super) lost: usize,
    /// The queue ended before the rank this poll started at (it looked at the head instead).
    pub(super) overshot: bool,
}

/// What the look down the queue found.
struct Look {
    seen: usize,
    window: usize,
    overshot: bool,
    turned_away: usize,
    /// The largest member peeked in this poll.
    largest: usize,
    /// Bytes of the candidates so far.
    bytes: usize,
    /// Whether the byte budget ended the look before `want`.
    spent: bool,
    /// When the look began: the clock of the requests turned away in this poll.
    now: tokio::time::Instant,
    /// The members that may be claimed, decoded and stamped, and the queue gate's word on each.
    candidates: Vec<(Vec<u8>, Envelope)>,
    admissions: Vec<Admission>,
}

/// A request this poll claimed.
struct Taken {
    held: Held,
    admission: Admission,
    /// Its last-chance slot, when it is on its last delivery.
    slot: Option<Slot>,
    /// Its member's size, counted against the queue's intake while it waits for a worker.
    size: usize,
}

/// What the claim made of the candidates.
struct Claim {
    /// Those now held.
    taken: Vec<Taken>,
    /// How many were gone.
    lost: usize,
    time: ClaimTime,
}

/// The clock of one claim.
struct ClaimTime {
    /// When the claim was sent: its lease's start in the holdings.
    taken_at: Instant,
    /// Unix milliseconds once it answered: what deadlines are checked against.
    now_ms: i64,
}

/// One poll: peek, triage, gate, claim, hand over.
pub(super) async fn poll_once(mut poll: Poll<'_>, tx: &Sender<Job>) -> Result<Polled, QueueError> {
    let ctx = poll.ctx;
    let mut look = poll.look().await?;
    if look.seen > 0 {
        *poll.bound.largest = look.largest;
    }
    if look.spent {
        // The budget, not the queue, ended this poll: look again as soon as there is room.
        look.window = look.seen;
    }
    if look.seen == 0 {
        return Ok(Polled {
            seen: look.seen,
            admitted: 0,
            turned_away: 0,
            window: look.window,
            lost: 0,
            overshot: look.overshot,
        });
    }
    let slots = poll.hold_back_last_chances(&mut look).await?;
    let admitted = look.candidates.len();
    let Claim {
        mut taken,
        lost,
        time,
    } = claim(ctx, look.candidates, look.admissions, slots).await?;
    let bodies = attach_bodies(ctx, &mut taken, time.now_ms).await;
    for (taken, body) in taken.into_iter().zip(bodies) {
        let turn = poll.turns.as_mut().and_then(|r| r.turn());
        hand_over(ctx, tx, (taken, turn), body, &time).await;
    }
    Ok(Polled {
        seen: look.seen,
        admitted,
        turned_away: look.turned_away,
        window: look.window,
        lost,
        overshot: look.overshot,
    })
}

impl Poll<'_> {
    /// Looks down the queue page after page while the head holds requests that may not be
    /// taken now: rule 9, a refused request does not block the requests behind it. Ranks shift
    /// as other instances claim and producers add: a member missed is seen next poll, and one
    /// seen twice is claimed once (the claim script answers "gone" for the second).
    async fn look(&mut self) -> Result<Look, QueueError> {
        let want = self.want;
        let mut page = if self.ctx.gate.is_some() {
            (want * GATED_LOOKAHEAD).min(1000)
        } else {
            want
        };
        let mut look = Look {
            seen: 0,
            window: 0,
            overshot: false,
            turned_away: 0,
            largest: 0,
            bytes: 0,
            spent: false,
            now: tokio::time::Instant::now(),
            candidates: Vec::with_capacity(want),
            admissions: Vec::with_capacity(want),
        };
        // The rank the next page starts at: past the head while instances race.
        let mut rank = self.start;
        while look.candidates.len() < want && look.window < MAX_LOOK && !look.spent {
            let asked = self
                .bound
                .page(page, look.largest)
                .min(MAX_LOOK - look.window);
            let peeked = self.ctx.queue.peek_from(rank, asked).await?;
            if rank > 0 && look.window == 0 && peeked.len() < asked {
                // The queue ends before a whole window past the head: look at the head instead.
                rank = 0;
                look.overshot = true;
                continue;
            }
            rank += asked;
            look.window += asked;
            look.seen += peeked.len();
            let full = peeked.len() == asked;
            look.largest = peeked
                .iter()
                .map(|p| p.member.len())
                .fold(look.largest, usize::max);
            self.sift(&mut look, peeked).await?;
            if !full || look.turned_away == 0 {
                break;
            }
            // A long head of them is crossed in few round trips.
            page = page.max((page * 2).min(1000));
        }
        Ok(look)
    }

    /// Takes a page's members into the candidates, in order, until `want` or the byte budget.
    async fn sift(&mut self, look: &mut Look, peeked: Vec<Peeked>) -> Result<(), QueueError> {
        for Peeked { member, .. } in peeked {
            if look.candidates.len() >= self.want {
                break;
            }
            // Past the budget: this member and those behind it wait for the next poll.
            if !look.candidates.is_empty()
                && look.bytes.saturating_add(member.len()) > self.bound.budget
            {
                look.spent = true;
                break;
            }
            self.triage(look, member).await?;
        }
        Ok(())
    }

    /// Decodes one member and puts it to the queue gate, unless it was turned away lately;
    /// the look gains a candidate, or a request turned away (now or lately, or not a request
    /// and refused the dead list), or nothing (not a request: dead-lettered).
    async fn triage(&mut self, look: &mut Look, member: Vec<u8>) -> Result<(), QueueError> {
        let (ctx, now) = (self.ctx, look.now);
        let until = now + self.interval;
        let env = match Envelope::decode(&member) {
            Ok(env) => stamp(ctx, env),
            Err(e) => {
                // Dead-lettered; one Redis refuses to set aside (the dead list outside
                // the ACL, or of the wrong type) stays pending and is passed over until
                // the next tick, so it does not stop the queue behind it (rule 10).
                let key = claim_key("", "", &member);
                let passed_over = self.away.is_recent(&key, now) || {
                    let refused = !set_aside(ctx, &member, &e.to_string()).await?;
                    if refused {
                        self.away.note(key, until);
                    }
                    refused
                };
                look.turned_away += usize::from(passed_over);
                return Ok(());
            }
        };
        // The claim key is made only while some request is turned away, or for a new
        // refusal.
        let key_of =
            |env: &Envelope| claim_key(&env.request.id, &env.internal.request_token, &member);
        if !self.away.is_empty() && self.away.is_recent(&key_of(&env), now) {
            look.turned_away += 1;
            return Ok(());
        }
        match admit(ctx, env).await {
            Ok((env, admission)) => {
                look.bytes = look.bytes.saturating_add(member.len());
                look.candidates.push((member, env));
                look.admissions.push(admission);
            }
            Err(env) => {
                look.turned_away += 1;
                self.away.note(key_of(&env), until);
            }
        }
        Ok(())
    }

    /// A request the last-chance rule holds back counts as turned away: it is not looked at
    /// again before the next tick, so a head of them neither spins the poll nor hides the
    /// requests behind it. Returns the slots of the candidates kept.
    async fn hold_back_last_chances(
        &mut self,
        look: &mut Look,
    ) -> Result<Vec<Option<Slot>>, QueueError> {
        let held_back =
            last_chance_slots(self.ctx, &mut look.candidates, &mut look.admissions).await?;
        for key in held_back.keys {
            look.turned_away += 1;
            self.away.note(key, look.now + self.interval);
        }
        Ok(held_back.slots)
    }
}

/// Claims the candidates in one script call; a gone one's gate reservations are undone at
/// once.
async fn claim(
    ctx: &QueueCtx,
    candidates: Vec<(Vec<u8>, Envelope)>,
    admissions: Vec<Admission>,
    slots: Vec<Option<Slot>>,
) -> Result<Claim, QueueError> {
    let taken_at = Instant::now();
    let sizes: Vec<usize> = candidates.iter().map(|(member, _)| member.len()).collect();
    let claimed = ctx.queue.claim(candidates).await?;
    let lost = claimed
        .iter()
        .filter(|claim| matches!(claim, Claimed::Gone))
        .count();
    ctx.series.claims_lost.get().inc_by(lost as u64);
    let now_ms = inferq_client::producer::unix_ms();
    let mut taken = Vec::with_capacity(claimed.len());
    for (((claim, admission), slot), size) in
        claimed.into_iter().zip(admissions).zip(slots).zip(sizes)
    {
        let Claimed::Held(held) = claim else {
            // Not ours after all: undo the gate's reservations now.
            Decision::release_all(admission.releases).await;
            continue;
        };
        taken.push(Taken {
            held: *held,
            admission,
            slot,
            size,
        });
    }
    Ok(Claim {
        taken,
        lost,
        time: ClaimTime { taken_at, now_ms },
    })
}

/// Reads the bodies stored apart of the claims that will be sent (not dropped, cancelled or
/// past their deadline), one read for the poll; [`Attached::Ready`] for the others.
async fn attach_bodies(ctx: &QueueCtx, taken: &mut [Taken], now_ms: i64) -> Vec<Attached> {
    let sent = |t: &Taken| {
        t.admission.dropped.is_none()
            && !t.held.cancelled
            && t.held.envelope.request.deadline.saturating_mul(1000) > now_ms
    };
    let at: Vec<usize> = (0..taken.len()).filter(|&i| sent(&taken[i])).collect();
    let mut envelopes: Vec<&mut Envelope> = taken
        .iter_mut()
        .filter(|t| sent(t))
        .map(|t| &mut t.held.envelope)
        .collect();
    let attached = bodies::attach(&ctx.queue, &mut envelopes).await;
    let mut out = vec![Attached::Ready; taken.len()];
    for (i, a) in at.into_iter().zip(attached) {
        out[i] = a;
    }
    out
}

/// Makes the claim a job held by this instance and hands it on: finished at once (dropped by
/// the gate, cancelled, past its deadline, its body unavailable), released (its body could not
/// be read), or sent into the pool channel to wait for a worker.
async fn hand_over(
    ctx: &Arc<QueueCtx>,
    tx: &Sender<Job>,
    (taken, turn): (Taken, Option<Turn>),
    body: Attached,
    time: &ClaimTime,
) {
    let Taken {
        held,
        admission,
        slot,
        size,
    } = taken;
    let cancelled = held.cancelled;
    ctx.series.deliveries.get().inc();
    let env = &held.envelope;
    let ticket = ctx.holdings.insert(
        held.fence.clone(),
        &env.request.id,
        &env.internal.request_token,
        time.taken_at,
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
    } else if job.held.envelope.request.deadline.saturating_mul(1000) <= time.now_ms {
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
        send_to_pool(ctx, tx, job, size, turn).await;
    }
}

/// Sends the job into the pool channel, counted in the queue's depth and, by its member's
/// size, in the queue's intake until a worker takes it up.
async fn send_to_pool(
    ctx: &QueueCtx,
    tx: &Sender<Job>,
    mut job: Job,
    size: usize,
    turn: Option<Turn>,
) {
    ctx.series.queue_depth.get().inc();
    job.wait_for_worker(size, turn);
    if let Err(returned) = tx.send(job).await {
        // The pool is gone (shutdown): dropping the job releases its claim.
        ctx.series.queue_depth.get().dec();
        drop(returned);
    }
}
