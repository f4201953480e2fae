//! The result outbox: every outcome of a queue (ack, bury, park, release) goes through here and
//! is written in batches, one `finish` script call (a constant number of Redis commands) for up
//! to [`MAX_BATCH`] outcomes.
//!
//! When Redis cannot be reached the outcomes stay here and are retried with backoff, so an
//! outage throws no finished work away — not even one that outlasts the lease: the write is
//! fenced, so it lands if no other instance has reclaimed the claim meanwhile and changes nothing
//! if one has. An outcome is dropped only once its lease is known lost (a renewal said "not
//! yours"); a survivor then redoes the work. The claim leaves
//! [`Holdings`](super::holdings::Holdings) when its outcome is written, and so does the job's
//! last-chance slot (see [`super::last_chance`]): a crash before the write would still charge the
//! request a delivery.
//!
//! The outbox is bounded by bytes: while more than [`MAX_WAITING_BYTES`] of outcomes wait, the
//! pool starts none of the queue's requests (see [`super::load`]), so a gateway that answers faster
//! than Redis takes the results (large results, a slow Redis) slows the pool instead of piling
//! results up in memory; a round trip writes at most [`MAX_BATCH_BYTES`] (and at least one
//! outcome).
//!
//! An outcome of 1 MiB or more ([`BIG_OUTCOME`]) can be bigger than Redis takes in one
//! argument (`proto-max-bulk-len`, `client-query-buffer-limit`, whose least values are 1 MiB):
//! Redis then closes the connection at every write carrying it, which looks like an outage.
//! When a write with such an outcome in it loses the connection, the outcomes of that write
//! are written one at a time, so the others land; and when Redis closed the connection on the
//! same big outcome alone [`TOO_BIG_TRIES`] times in a row while it answered `PING` in
//! between, the outcome is replaced by one Redis takes (see [`Finish::too_big_for_redis`]):
//! the request ends with an `INFERENCE_ERROR` that says why, instead of holding the queue's
//! outbox, and so its claims, forever. When Redis's answer arrives before it closes the
//! connection (`Protocol error: invalid bulk length`), the big outcome is replaced at once.
//!
//! An outcome Redis refuses for itself, not for an outage (a result list outside this user's
//! rights), is handled by whose list it is. For a list this queue is configured with, the fix is
//! the operator's and every request would meet the same refusal: the outcomes are kept and
//! retried as in an outage, the consumer claims no more work meanwhile (see `outbox_stalled`),
//! and `/readyz` names the list until the results land. (Since the consumer stops polling
//! whenever the outbox is stalled, the outbox also reports a refusal that stalls it, such as
//! `READONLY` from a replica.) For a list one message chose, the others
//! are unaffected: that outcome becomes a dead letter wherever that keeps the request from being
//! sent again.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::context::QueueCtx;
use super::last_chance::Slot;
use super::load::Charge;
use crate::ops::Trouble;
use crate::queue::{Finish, Finished};

/// Most outcomes written per round trip.
pub const MAX_BATCH: usize = 256;

/// Bytes of outcomes waiting to be written past which finished workers wait for room.
pub const MAX_WAITING_BYTES: usize = 64 << 20;
/// Most bytes of outcomes written per round trip (a bigger single outcome goes alone).
pub const MAX_BATCH_BYTES: usize = 16 << 20;

/// Outcomes this big may exceed what Redis takes in one argument (see the module comment).
pub const BIG_OUTCOME: usize = 1 << 20;
/// Writes of a big outcome alone that Redis cut, while answering `PING`, before it is replaced.
pub const TOO_BIG_TRIES: u32 = 3;
/// What Redis answers (when its answer arrives before it closes the connection) to an argument
/// over `proto-max-bulk-len`: `Protocol error: invalid bulk length`.
const OVERSIZE_REFUSAL: &str = "Protocol error";

/// One outcome on its way, with the last-chance slot of its job if it held one, and its share
/// of the outbox's [`Load`](super::load::Load) (returned when it is dropped: written or given up).
pub struct Outgoing {
    pub finish: Finish,
    pub last_chance: Option<Slot>,
    pub charge: Charge,
}

impl std::borrow::Borrow<Finish> for Outgoing {
    fn borrow(&self) -> &Finish {
        &self.finish
    }
}

/// Writes outcomes until `flush` is cancelled and nothing is left to write (or everything left
/// has lost its lease).
pub async fn run_outbox(
    ctx: Arc<QueueCtx>,
    mut rx: UnboundedReceiver<Outgoing>,
    flush: CancellationToken,
) {
    let mut waiting: VecDeque<Outgoing> = VecDeque::new();
    let mut backoff = Duration::from_millis(50);
    let mut refused_in_a_row = 0u32;
    // Round trips still to make one outcome at a time (after a write with a big outcome in it
    // lost the connection), and how often in a row a big outcome alone lost it.
    let mut alone = 0usize;
    let mut cut_alone = 0u32;
    // Whether /readyz was told that Redis refuses (or does not take) this queue's results.
    let mut reported = false;
    let depth = ctx.metrics.outbox_depth.get_or_create(&ctx.labels).clone();
    loop {
        if waiting.is_empty() {
            let next = tokio::select! {
                biased;
                f = rx.recv() => f,
                _ = flush.cancelled() => rx.try_recv().ok(),
            };
            match next {
                Some(f) => waiting.push_back(f),
                None => break,
            }
        }
        while let Ok(f) = rx.try_recv() {
            waiting.push_back(f);
        }
        waiting.retain(|f| {
            let valid = ctx.holdings.is_held(f.finish.fence());
            if !valid {
                ctx.metrics.outbox_dropped.get_or_create(&ctx.labels).inc();
                tracing::warn!(queue = %ctx.queue.name(), "dropping an outcome: its lease is lost and another instance will redo the request");
            }
            valid
        });
        depth.set(i64::try_from(waiting.len()).unwrap_or(i64::MAX));
        if waiting.is_empty() {
            // Nothing left to write (what was kept lost its lease): nothing is refused or
            // stalled now; the next outcome tells again.
            report(&ctx, &mut reported, None);
            continue;
        }
        let n = if alone > 0 { 1 } else { batch_len(&waiting) };
        let mut batch: Vec<Outgoing> = waiting.drain(..n).collect();
        match ctx.queue.finish(&batch).await {
            Ok(statuses) => {
                alone = alone.saturating_sub(1);
                cut_alone = 0;
                // Outcomes for a result list this queue is configured with that Redis refused:
                // kept and retried, as in an outage (see the module comment).
                let mut kept: Vec<Outgoing> = Vec::new();
                let mut refusal: Option<(String, String)> = None;
                let mut parked = false;
                for (o, status) in batch.into_iter().zip(statuses) {
                    // Redis said the outcome is too big for it: no try will do better.
                    let (o, status) = match status {
                        Finished::Failed(e)
                            if o.finish.size() >= BIG_OUTCOME && e.contains(OVERSIZE_REFUSAL) =>
                        {
                            match too_big(&ctx, &o.finish, &format!("Redis refused it ({e})")) {
                                Some(instead) => {
                                    waiting.push_back(o.replaced(&ctx, instead));
                                    continue;
                                }
                                None => (o, Finished::Failed(e)),
                            }
                        }
                        status => (o, status),
                    };
                    let f = &o.finish;
                    let own_list = configured_list(&ctx, f);
                    match status {
                        Finished::Published => {
                            parked |= matches!(f, Finish::Park { .. });
                        }
                        Finished::NotYours => {
                            ctx.series.fenced.get().inc();
                        }
                        Finished::Failed(e) => {
                            if let Some(list) = own_list {
                                refusal = Some((list.to_owned(), e));
                                kept.push(o);
                                continue;
                            }
                            if let Some(instead) = instead_of_refused(&ctx, f, &e).await {
                                let charge = ctx.outbox_load.charge(instead.size());
                                waiting.push_back(Outgoing {
                                    finish: instead,
                                    last_chance: o.last_chance,
                                    charge,
                                });
                                continue;
                            }
                            tracing::error!(queue = %ctx.queue.name(), error = %e, "Redis refused an outcome; the claim will be redelivered when its lease ends");
                        }
                    }
                    ctx.holdings.remove(f.fence());
                }
                if parked {
                    ctx.parked.notify_one();
                }
                match refusal {
                    None => {
                        refused_in_a_row = 0;
                        backoff = Duration::from_millis(50);
                        report(&ctx, &mut reported, None);
                    }
                    Some((list, e)) => {
                        let why = format!("{e} (result list {list:?})");
                        report(&ctx, &mut reported, Some(Trouble::Refused(why)));
                        if refused_in_a_row % 50 == 0 {
                            tracing::error!(queue = %ctx.queue.name(), result_list = %list, error = %e, outcomes = kept.len(), "Redis refuses this queue's results; keeping them, claiming no more work, and retrying");
                        }
                        refused_in_a_row = refused_in_a_row.saturating_add(1);
                        hold_back(&mut waiting, kept, &mut backoff).await;
                    }
                }
            }
            Err(e) => {
                if e.lost_redis() && batch.iter().any(|o| o.finish.size() >= BIG_OUTCOME) {
                    if batch.len() > 1 {
                        alone = alone.max(batch.len());
                    } else if answers_ping(&ctx).await {
                        cut_alone += 1;
                        if cut_alone >= TOO_BIG_TRIES {
                            cut_alone = 0;
                            if let Some(o) = batch.pop() {
                                let cause = format!("Redis closed the connection at each of {TOO_BIG_TRIES} writes of it while it answered PING");
                                match too_big(&ctx, &o.finish, &cause) {
                                    Some(instead) => {
                                        waiting.push_front(o.replaced(&ctx, instead));
                                        continue;
                                    }
                                    None => batch.push(o),
                                }
                            }
                        }
                    }
                }
                ctx.note_failure(&e);
                // The consumer claims nothing meanwhile, so its polls cannot report this.
                // Either way `/readyz` says so: a write that times out while PING still
                // answers (writes paused, a stalled script) is no more ready than a refusal.
                let trouble = match e.redis_refusal() {
                    Some(refused) => Trouble::Refused(refused.to_string()),
                    None => Trouble::Stalled(e.to_string()),
                };
                report(&ctx, &mut reported, Some(trouble));
                tracing::warn!(queue = %ctx.queue.name(), error = %e, outcomes = batch.len(), "cannot write outcomes yet; keeping them while their leases last");
                hold_back(&mut waiting, batch, &mut backoff).await;
            }
        }
        depth.set(i64::try_from(waiting.len()).unwrap_or(i64::MAX));
    }
    depth.set(0);
}

/// Whether Redis answers `PING` within about half a second (the connection it just closed is
/// opened again meanwhile).
async fn answers_ping(ctx: &QueueCtx) -> bool {
    for _ in 0..5 {
        if ctx.queue.ping().await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// What to write instead of `f`, an outcome Redis will not take for its size; `None` when
/// nothing better can be written (a park or a release, which carries no result: its lease runs
/// out and the request is redelivered).
fn too_big(ctx: &QueueCtx, f: &Finish, cause: &str) -> Option<Finish> {
    let size = f.size();
    let why = format!(
        "the result ({size} bytes) could not be written to Redis: {cause}; is its proto-max-bulk-len or client-query-buffer-limit smaller than the result?"
    );
    let instead = f.too_big_for_redis(&why)?;
    tracing::error!(queue = %ctx.queue.name(), bytes = size, "Redis will not take a result this big; publishing an INFERENCE_ERROR instead");
    Some(instead)
}

impl Outgoing {
    /// This outcome's place, last-chance slot included, taken by `instead`.
    fn replaced(self, ctx: &QueueCtx, instead: Finish) -> Outgoing {
        let charge = ctx.outbox_load.charge(instead.size());
        Outgoing {
            finish: instead,
            last_chance: self.last_chance,
            charge,
        }
    }
}

/// How many outcomes from the front of `waiting` the next round trip writes: at most
/// [`MAX_BATCH`], and no more than [`MAX_BATCH_BYTES`] unless the first alone is bigger.
fn batch_len(waiting: &VecDeque<Outgoing>) -> usize {
    let mut bytes = 0usize;
    let mut n = 0;
    for o in waiting.iter().take(MAX_BATCH) {
        bytes = bytes.saturating_add(o.charge.bytes());
        if n > 0 && bytes > MAX_BATCH_BYTES {
            break;
        }
        n += 1;
    }
    n
}

/// Puts `outcomes` back at the front of `waiting`, in their order, and waits `backoff` before
/// the next try, doubling it up to 2 s.
async fn hold_back(
    waiting: &mut VecDeque<Outgoing>,
    outcomes: Vec<Outgoing>,
    backoff: &mut Duration,
) {
    for o in outcomes.into_iter().rev() {
        waiting.push_front(o);
    }
    tokio::time::sleep(*backoff).await;
    *backoff = (*backoff * 2).min(Duration::from_secs(2));
}

/// The result list `f` pushes to, when this queue is configured with it (not one a message
/// chose for itself).
fn configured_list<'f>(ctx: &QueueCtx, f: &'f Finish) -> Option<&'f str> {
    let list = match f {
        Finish::Ack { result_list, .. } => result_list,
        Finish::Bury {
            result_list,
            result,
            ..
        } if !result.is_empty() => result_list,
        _ => return None,
    };
    ctx.is_configured_result_list(list).then_some(list.as_str())
}

/// Says whether this queue's results are written (`None`) or what keeps Redis from taking
/// them: the consumer claims no more work meanwhile (`outbox_stalled`), and `/readyz` names the
/// trouble until it is over (`reported` remembers it was told).
fn report(ctx: &QueueCtx, reported: &mut bool, trouble: Option<Trouble>) {
    ctx.outbox_stalled
        .store(trouble.is_some(), Ordering::SeqCst);
    match trouble {
        Some(trouble) => {
            ctx.readiness.note(&results_of(ctx), Some(trouble));
            *reported = true;
        }
        None if std::mem::take(reported) => ctx.readiness.note(&results_of(ctx), None),
        None => {}
    }
}

/// What `/readyz` names while Redis refuses this queue's results.
fn results_of(ctx: &QueueCtx) -> String {
    format!("the results of queue {:?}", ctx.queue.name())
}

/// What to write instead of an outcome Redis refused for itself (a result list outside this
/// user's rights, say) while it took its neighbours: a dead letter's bury without its result,
/// or, for an ack, a bury of the served request that keeps the result in its record. Either way
/// the request is set aside once instead of coming back at every lease expiry, each time sent
/// to the gateway again. `None` when there is nothing better to do than let the lease run out.
async fn instead_of_refused(ctx: &QueueCtx, f: &Finish, refusal: &str) -> Option<Finish> {
    let queue = ctx.queue.name();
    if let Some(bury) = f.bury_without_result(refusal) {
        tracing::error!(%queue, error = %refusal, "Redis refused a dead letter's result; burying it without one");
        return Some(bury);
    }
    if !matches!(f, Finish::Ack { .. }) {
        return None;
    }
    let (member, deliveries) = match ctx.queue.claimed(f.fence()).await {
        Ok(Some(claimed)) => claimed,
        Ok(None) => return None,
        Err(e) => {
            tracing::warn!(%queue, error = %e, "cannot read a claim whose result Redis refused");
            return None;
        }
    };
    let bury = f.bury_unpublished(queue, &member, deliveries, refusal)?;
    tracing::error!(%queue, error = %refusal, "Redis refused a result; dead-lettering the request with the result in its record");
    ctx.metrics
        .dead_letters
        .get_or_create(&ctx.labels.with_outcome("result_refused"))
        .inc();
    Some(bury)
}
