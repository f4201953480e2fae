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
//! retried as in an outage, the consumer claims no more work meanwhile (see `LaneState`),
//! and `/readyz` names the list until the results land. (Since the consumer stops polling
//! whenever the outbox is stalled, the outbox also reports a refusal that stalls it, such as
//! `READONLY` from a replica.) For a list one message chose, the others
//! are unaffected: that outcome becomes a dead letter wherever that keeps the request from being
//! sent again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::context::QueueCtx;
use super::last_chance::Slot;
use super::load::Charge;
use crate::ops::Trouble;
use crate::queue::{Finish, Finished, QueueError};

/// Most outcomes written per round trip.
pub const MAX_BATCH: usize = 256;

/// How long a `fair-share` lane's outbox waits for its other claims' outcomes before writing
/// (see [`Outbox::linger`]).
const LINGER: Duration = Duration::from_millis(10);

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
#[derive(Debug)]
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
    let depth = ctx.metrics.outbox_depth.get_or_create(&ctx.labels).clone();
    let mut outbox = Outbox {
        ctx,
        waiting: VecDeque::new(),
        backoff: Duration::from_millis(50),
        refused_in_a_row: 0,
        alone: 0,
        cut_alone: 0,
        reported: false,
        depth,
    };
    while outbox.collect(&mut rx, &flush).await {
        outbox.drop_lost();
        if outbox.waiting.is_empty() {
            // Nothing left to write (what was kept lost its lease): nothing is refused or
            // stalled now; the next outcome tells again.
            report(&outbox.ctx, &mut outbox.reported, None);
            continue;
        }
        if outbox.write_next().await {
            outbox.show_depth();
        }
    }
    outbox.depth.set(0);
}

/// One queue's outbox: the outcomes waiting, and what it remembers between round trips.
struct Outbox {
    ctx: Arc<QueueCtx>,
    waiting: VecDeque<Outgoing>,
    /// The pause before the next try after a failed or refused write.
    backoff: Duration,
    /// Round trips in a row in which Redis refused this queue's results.
    refused_in_a_row: u32,
    /// Round trips still to make one outcome at a time (after a write with a big outcome in it
    /// lost the connection).
    alone: usize,
    /// How often in a row a big outcome alone lost the connection.
    cut_alone: u32,
    /// Whether /readyz was told that Redis refuses (or does not take) this queue's results.
    reported: bool,
    /// `inferq_outbox_depth` of this queue.
    depth: Gauge,
}

/// What the statuses of one round trip add up to.
#[derive(Default)]
struct Round {
    /// Outcomes for a result list this queue is configured with that Redis refused: kept and
    /// retried, as in an outage (see the module comment).
    kept: Vec<Outgoing>,
    /// The last such refusal: the list and Redis's error.
    refusal: Option<(String, String)>,
    /// Whether a retry was parked: the promoter looks again.
    parked: bool,
}

impl Outbox {
    /// Waits for an outcome while none waits, then takes every one that has arrived. `false`
    /// once nothing is left: the channel closed, or flushing with the channel empty.
    async fn collect(
        &mut self,
        rx: &mut UnboundedReceiver<Outgoing>,
        flush: &CancellationToken,
    ) -> bool {
        if self.waiting.is_empty() {
            let next = tokio::select! {
                biased;
                f = rx.recv() => f,
                _ = flush.cancelled() => rx.try_recv().ok(),
            };
            match next {
                Some(f) => self.waiting.push_back(f),
                None => return false,
            }
            if self.ctx.turns.is_some() {
                self.linger(rx, flush).await;
            }
        }
        while let Ok(f) = rx.try_recv() {
            self.waiting.push_back(f);
        }
        true
    }

    /// In a `fair-share` pool, where a tenant's requests are claimed and started together at
    /// its turn and so end close together: waits up to [`LINGER`] for the outcomes of the
    /// lane's other held claims, so they share one `finish` call instead of one each.
    async fn linger(&mut self, rx: &mut UnboundedReceiver<Outgoing>, flush: &CancellationToken) {
        let until = tokio::time::Instant::now() + LINGER;
        while self.waiting.len() < self.ctx.holdings.len() {
            let next = tokio::select! {
                biased;
                _ = flush.cancelled() => return,
                _ = tokio::time::sleep_until(until) => return,
                f = rx.recv() => f,
            };
            match next {
                Some(f) => self.waiting.push_back(f),
                None => return,
            }
        }
    }

    /// Drops the outcomes whose lease is lost (another instance redoes those requests).
    fn drop_lost(&mut self) {
        let ctx = &self.ctx;
        self.waiting.retain(|f| {
            let valid = ctx.holdings.is_held(f.finish.fence());
            if !valid {
                ctx.metrics.outbox_dropped.get_or_create(&ctx.labels).inc();
                tracing::warn!(queue = %ctx.queue.name(), "dropping an outcome: its lease is lost and another instance will redo the request");
            }
            valid
        });
        self.show_depth();
    }

    fn show_depth(&self) {
        self.depth
            .set(i64::try_from(self.waiting.len()).unwrap_or(i64::MAX));
    }

    /// One round trip: the next batch (one outcome while writing them alone), written and
    /// settled, or held back. `false` when a big outcome was replaced and goes first: the
    /// next round writes it at once.
    async fn write_next(&mut self) -> bool {
        let n = if self.alone > 0 {
            1
        } else {
            batch_len(&self.waiting)
        };
        let mut batch: Vec<Outgoing> = Vec::with_capacity(n);
        for o in self.waiting.drain(..n).collect::<Vec<_>>() {
            match o
                .finish
                .result_list()
                .and_then(|l| self.ctx.route_refusal(l))
            {
                Some(refusal) => self.refuse_route(o, &refusal.to_string()).await,
                None => batch.push(o),
            }
        }
        if batch.is_empty() {
            return true;
        }
        match self.ctx.queue.finish(&batch).await {
            Ok(statuses) => {
                self.alone = self.alone.saturating_sub(1);
                self.cut_alone = 0;
                let mut round = Round::default();
                for (o, status) in batch.into_iter().zip(statuses) {
                    self.settle(o, status, &mut round).await;
                }
                self.after_round(round).await;
                true
            }
            Err(e) => self.not_written(batch, e).await,
        }
    }

    /// An outcome whose result list no message may name (a key of inferq's, or one outside the
    /// queue's `allowed_result_lists`) is never pushed: the request is dead-lettered at once
    /// with its result kept in the record, as for a list Redis refuses, and its queue goes on.
    async fn refuse_route(&mut self, o: Outgoing, refusal: &str) {
        let ctx = &self.ctx;
        match instead_of_refused(ctx, &o.finish, refusal).await {
            Some(instead) => {
                let charge = ctx.outbox_load.charge(instead.size());
                self.waiting.push_back(Outgoing {
                    finish: instead,
                    last_chance: o.last_chance,
                    charge,
                });
            }
            None => {
                tracing::error!(queue = %ctx.queue.name(), error = %refusal, "an outcome names a result list no message may name; the claim will be redelivered when its lease ends");
                ctx.holdings.remove(o.finish.fence());
            }
        }
    }

    /// Settles one written outcome by its status: done (its claim leaves the holdings),
    /// replaced (too big for Redis, or refused for a list a message chose), or kept (refused
    /// for a list this queue is configured with).
    async fn settle(&mut self, o: Outgoing, status: Finished, round: &mut Round) {
        let ctx = &self.ctx;
        // Redis said the outcome is too big for it: no try will do better.
        let status = match status {
            Finished::Failed(e)
                if o.finish.size() >= BIG_OUTCOME && e.contains(OVERSIZE_REFUSAL) =>
            {
                match too_big(ctx, &o.finish, &format!("Redis refused it ({e})")) {
                    Some(instead) => {
                        self.waiting.push_back(o.replaced(ctx, instead));
                        return;
                    }
                    None => Finished::Failed(e),
                }
            }
            status => status,
        };
        let f = &o.finish;
        let own_list = configured_list(ctx, f);
        match status {
            Finished::Published => {
                round.parked |= matches!(f, Finish::Park { .. });
            }
            Finished::NotYours => {
                ctx.series.fenced.get().inc();
            }
            Finished::Failed(e) => {
                if let Some(list) = own_list {
                    round.refusal = Some((list.to_owned(), e));
                    round.kept.push(o);
                    return;
                }
                if let Some(instead) = instead_of_refused(ctx, f, &e).await {
                    let charge = ctx.outbox_load.charge(instead.size());
                    self.waiting.push_back(Outgoing {
                        finish: instead,
                        last_chance: o.last_chance,
                        charge,
                    });
                    return;
                }
                tracing::error!(queue = %ctx.queue.name(), error = %e, "Redis refused an outcome; the claim will be redelivered when its lease ends");
            }
        }
        ctx.holdings.remove(f.fence());
    }

    /// After a round trip Redis answered: wakes the promoter for a parked retry, and either
    /// clears the trouble or, when Redis refused this queue's results, says so and holds the
    /// kept outcomes back.
    async fn after_round(&mut self, round: Round) {
        let ctx = &self.ctx;
        if round.parked {
            ctx.parked.notify_one();
        }
        match round.refusal {
            None => {
                self.refused_in_a_row = 0;
                self.backoff = Duration::from_millis(50);
                report(ctx, &mut self.reported, None);
            }
            Some((list, e)) => {
                let why = format!("{e} (result list {list:?})");
                report(ctx, &mut self.reported, Some(Trouble::Refused(why)));
                if self.refused_in_a_row % 50 == 0 {
                    tracing::error!(queue = %ctx.queue.name(), result_list = %list, error = %e, outcomes = round.kept.len(), "Redis refuses this queue's results; keeping them, claiming no more work, and retrying");
                }
                self.refused_in_a_row = self.refused_in_a_row.saturating_add(1);
                hold_back(&mut self.waiting, round.kept, &mut self.backoff).await;
            }
        }
    }

    /// After a round trip that failed: a big outcome may be what Redis cuts (see
    /// [`Outbox::cut_by_size`]); otherwise the failure is noted, told to `/readyz` and the
    /// batch held back. `false` when a big outcome was replaced instead.
    async fn not_written(&mut self, mut batch: Vec<Outgoing>, e: QueueError) -> bool {
        if e.lost_redis()
            && batch.iter().any(|o| o.finish.size() >= BIG_OUTCOME)
            && self.cut_by_size(&mut batch).await
        {
            return false;
        }
        let ctx = &self.ctx;
        ctx.note_failure(&e);
        // The consumer claims nothing meanwhile, so its polls cannot report this.
        // Either way `/readyz` says so: a write that times out while PING still
        // answers (writes paused, a stalled script) is no more ready than a refusal.
        let trouble = match e.redis_refusal() {
            Some(refused) => Trouble::Refused(refused.to_string()),
            None => Trouble::Stalled(e.to_string()),
        };
        report(ctx, &mut self.reported, Some(trouble));
        tracing::warn!(queue = %ctx.queue.name(), error = %e, outcomes = batch.len(), "cannot write outcomes yet; keeping them while their leases last");
        hold_back(&mut self.waiting, batch, &mut self.backoff).await;
        true
    }

    /// A write with a big outcome in it lost the connection: its outcomes are then written one
    /// at a time; and a big outcome alone cut [`TOO_BIG_TRIES`] times in a row while Redis
    /// answers `PING` is replaced, at the front of the queue (`true`).
    async fn cut_by_size(&mut self, batch: &mut Vec<Outgoing>) -> bool {
        if batch.len() > 1 {
            self.alone = self.alone.max(batch.len());
            return false;
        }
        if !answers_ping(&self.ctx).await {
            return false;
        }
        self.cut_alone += 1;
        if self.cut_alone < TOO_BIG_TRIES {
            return false;
        }
        self.cut_alone = 0;
        let Some(o) = batch.pop() else {
            return false;
        };
        let cause = format!("Redis closed the connection at each of {TOO_BIG_TRIES} writes of it while it answered PING");
        match too_big(&self.ctx, &o.finish, &cause) {
            Some(instead) => {
                self.waiting.push_front(o.replaced(&self.ctx, instead));
                true
            }
            None => {
                batch.push(o);
                false
            }
        }
    }
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
/// them: the consumer claims no more work meanwhile (`LaneState::outbox_blocked`), and `/readyz` names the
/// trouble until it is over (`reported` remembers it was told).
fn report(ctx: &QueueCtx, reported: &mut bool, trouble: Option<Trouble>) {
    if trouble.is_some() {
        ctx.state.outbox_blocked();
    } else {
        ctx.state.outbox_flowing();
    }
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
