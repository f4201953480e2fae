//! Everything one queue's tasks share: its config, its [`Queue`] of moves, what it holds, the
//! sender into its outbox and its metric labels. Consumers, workers and upkeep tasks each get an
//! `Arc<QueueCtx>`.

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use super::gates::{Decision, Feedback, Gate, Release};
use super::holdings::{Holdings, Ticket};
use super::lane_state::LaneState;
use super::last_chance::{LastChance, Slot};
use super::load::{Charge, Load};
use super::outbox::Outgoing;
use crate::config::QueueConfig;
use crate::ops::metrics::QueueSeries;
use crate::ops::{Metrics, QueueLabels};
use crate::queue::dead::DeadRecord;
use crate::queue::{Fence, Finish, Held, Queue, ResultRoute};
use inferq_client::result_route::{decide, RouteRefusal};
use inferq_client::wire::{Envelope, ErrorCode, ResultMessage, Routing};

/// One queue's shared state.
pub struct QueueCtx {
    pub spec: QueueConfig,
    pub queue: Queue,
    pub holdings: Holdings,
    pub outbox: UnboundedSender<Outgoing>,
    /// The bytes of outcomes in the outbox: while over its bound, the pool starts none of this
    /// queue's requests (see [`super::outbox`]).
    pub outbox_load: Arc<Load>,
    /// The bytes of the members claimed and waiting in the pool channel for a worker: while
    /// over its bound the consumer claims no more (see [`super::consumer`]).
    pub intake_load: Arc<Load>,
    pub labels: QueueLabels,
    pub metrics: Arc<Metrics>,
    /// The per-request series of this queue, resolved once.
    pub series: QueueSeries,
    /// Rung when work may have arrived (doorbell, keyspace event, local requeue): the consumer
    /// polls at once instead of waiting out its interval. Rings coalesce into one poll.
    pub wake: tokio::sync::Notify,
    /// Rung when this instance parked a retry: the promoter, which otherwise sleeps until the
    /// earliest parked entry is due, looks again.
    pub parked: tokio::sync::Notify,
    /// Whether the wake-up listener is subscribed: while it is, a consumer with nothing to do
    /// may wait its whole `poll_interval` for a ring.
    pub listening: std::sync::atomic::AtomicBool,
    /// The transport's `result_queue_name`, used when neither queue nor message names one.
    pub default_result_list: String,
    /// The key names no message may name as its result list (`None` for redis-pubsub, whose
    /// results go to channels, not keys).
    pub reserved: Option<Arc<super::reserved::Reserved>>,
    /// The queue's default URL (base joined with `request_path_url`), precomputed.
    /// (Parsed once: most requests are sent there. The error is why it cannot be used.)
    pub default_url: Result<crate::gateway::Target, String>,
    /// The queue-level gate, consulted between peek and claim.
    pub gate: Option<Arc<dyn Gate>>,
    /// The gate of this queue's pool, consulted by a worker before it sends.
    pub pool_gate: Option<Arc<dyn Gate>>,
    /// Labels of the pool gate's decisions (Go: empty queue labels, the pool's name).
    pub pool_labels: QueueLabels,
    /// The one slot for a request on its last delivery (see [`super::last_chance`]).
    pub last_chance: LastChance,
    /// The processor's readiness: the consumer and the outbox report there whether Redis
    /// refuses the queue's polls or its results.
    pub readiness: crate::ops::Readiness,
    /// Whether the outbox is stalled, Redis was lost, or the lane was retired: what the
    /// consumer, the reclaimer and the pool act on (see [`super::lane_state`]).
    pub state: LaneState,
    /// Set for a queue `fair-share` found (not a listed one): while it is empty its consumer
    /// waits for a ring (the doorbell, or the discovery seeing new work in the index) with a
    /// long safety net instead of polling every `poll_interval`, so a thousand idle tenants'
    /// queues cost no polls.
    pub found: bool,
    /// Its way into its pool's room for claimed requests waiting for a worker, in a
    /// `fair-share` pool (see [`super::fair_share::Turns`]): it claims only at its tenant's turn.
    pub turns: Option<super::fair_share::LaneTurns>,
}

impl std::fmt::Debug for QueueCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueCtx").finish_non_exhaustive()
    }
}

impl QueueCtx {
    /// A gate turned a request away (refused it, or told it to wait): its reservations are
    /// undone and, when `count`, the decision is counted under `labels` (a queue's, or a pool
    /// gate's).
    pub async fn turn_away(&self, decision: Decision, labels: &QueueLabels, count: bool) {
        let reason = decision.refusal_reason();
        Decision::release_all(decision.releases).await;
        if count {
            self.metrics
                .gate_decisions
                .get_or_create(&labels.with_reason(reason))
                .inc();
        }
    }

    /// Where a result goes and how long its list lives: the route a processor already stamped
    /// into the message (`result_routing_resolved`), else the queue's result list, the
    /// message's, or the default (Go's precedence), with the queue's `result_ttl_seconds`.
    pub fn result_route(&self, routing: &Routing) -> ResultRoute {
        if routing.result_routing_resolved && !routing.result_queue_name.is_empty() {
            return ResultRoute {
                list: routing.result_queue_name.clone(),
                ttl_s: u64::try_from(routing.result_ttl_seconds).unwrap_or(0),
            };
        }
        let list = match self.spec.result_queue_name.as_deref() {
            Some(list) if !list.is_empty() => list.to_owned(),
            _ if !routing.result_queue_name.is_empty() => routing.result_queue_name.clone(),
            _ => self.default_result_list.clone(),
        };
        ResultRoute {
            list,
            ttl_s: self.spec.result_ttl_seconds,
        }
    }

    /// `envelope` with its result route stamped into `internal` (`result_routing_resolved`,
    /// `result_queue_name`, `result_ttl_seconds`), as newer Go writes a member it puts back.
    pub fn stamped(&self, envelope: &Envelope) -> Envelope {
        let route = self.result_route(&envelope.internal);
        let mut next = envelope.clone();
        next.internal.result_routing_resolved = true;
        next.internal.result_queue_name = route.list;
        next.internal.result_ttl_seconds = i64::try_from(route.ttl_s).unwrap_or(i64::MAX);
        next
    }

    /// Takes note of a failed Redis call of this queue's loops: one that could not reach Redis
    /// is an outage for the reclaimer (a refusal of this caller alone is not).
    pub fn note_failure(&self, e: &crate::queue::QueueError) {
        if e.lost_redis() {
            self.state.lost_redis();
        }
    }

    /// Whether `list` is a result list this queue is configured with (its own, or the
    /// processor's default), as opposed to one a message named for itself.
    pub fn is_configured_result_list(&self, list: &str) -> bool {
        self.spec.result_queue_name.as_deref() == Some(list) || self.default_result_list == list
    }

    /// Why the result list `list` may not be pushed to, when it may not: a list a message (or
    /// a stamp) named that is a key of inferq's, or that the queue's `allowed_result_lists`
    /// do not match. The queue's own list and the transport's default are always allowed.
    pub fn route_refusal(&self, list: &str) -> Option<RouteRefusal> {
        let reserved = self.reserved.as_ref()?.current();
        decide(
            &reserved,
            list,
            self.is_configured_result_list(list),
            &self.spec.allowed_result_lists,
        )
        .err()
    }

    /// Hands an outcome to the outbox.
    pub fn finish(&self, finish: Finish) {
        self.finish_holding(finish, None);
    }

    /// Hands an outcome to the outbox with the job's last-chance slot, which the outbox frees
    /// once the outcome is written (or given up): until then a crash would still charge this
    /// request a delivery, so no other last-chance request may start beside it.
    fn finish_holding(&self, finish: Finish, last_chance: Option<Slot>) {
        self.holdings.mark_finishing(finish.fence());
        // The outbox lives until every holder has finished, so the send only fails after a
        // shutdown that already gave up; the lease then returns the claim to pending.
        let charge = self.outbox_load.charge(finish.size());
        let _ = self.outbox.send(Outgoing {
            finish,
            last_chance,
            charge,
        });
    }

    /// Publishes `result` as the generation's terminal record.
    pub fn publish(&self, fence: &Fence, envelope: &Envelope, result: ResultMessage) {
        self.finish(self.ack(fence, envelope, result));
    }

    /// The ack that publishes `result` for the generation `envelope`, with its request token.
    fn ack(&self, fence: &Fence, envelope: &Envelope, mut result: ResultMessage) -> Finish {
        let route = self.result_route(&envelope.internal);
        result.request_token = envelope.internal.request_token.clone();
        Finish::Ack {
            fence: fence.clone(),
            id: envelope.request.id.clone(),
            request_token: envelope.internal.request_token.clone(),
            result_list: route.list,
            result_ttl_s: route.ttl_s,
            result: result.to_json(),
            payload_ref: envelope.internal.payload_ref.clone(),
        }
    }

    /// Sets a claimed generation aside with `reason`, publishing a `DEAD_LETTERED` result when
    /// its id can be read. `known` is its envelope when the caller already decoded it.
    pub fn bury(
        &self,
        fence: &Fence,
        member: &[u8],
        known: Option<&Envelope>,
        reason: &str,
        deliveries: u32,
    ) {
        let (mut record, who) = DeadRecord::about(self.queue.name(), reason, member, known);
        record.deliveries = deliveries;
        let (result, routing) = match who {
            Some((id, routing)) => {
                let mut result = ResultMessage::error(&id, ErrorCode::DeadLettered, reason);
                result.request_token = routing.request_token.clone();
                (result.to_json(), routing)
            }
            None => (String::new(), Routing::default()),
        };
        let route = self.result_route(&routing);
        self.metrics
            .dead_letters
            .get_or_create(&self.labels.with_outcome("deliveries"))
            .inc();
        self.finish(Finish::Bury {
            fence: fence.clone(),
            id: record.id.clone(),
            request_token: routing.request_token.clone(),
            result_list: route.list,
            result_ttl_s: route.ttl_s,
            result,
            record: record.to_json(),
        });
    }
}

/// A claimed request on its way to a worker. Dropped without an outcome (a panic, a shutdown
/// that empties the queues), it releases its claim: no path leaks a claim until its lease ends.
#[derive(Debug)]
pub struct Job {
    pub ctx: Arc<QueueCtx>,
    pub held: Held,
    pub ticket: Ticket,
    pub claimed_at: Instant,
    /// Gate reservations, undone once the outcome is decided.
    releases: Vec<Release>,
    /// What the gateway did with the request, handed to the releases (feedback gates learn
    /// from it); none when it was not sent.
    feedback: Option<Feedback>,
    /// Fired by a feedback gate to take the request back from the gateway.
    pub preempt: Option<CancellationToken>,
    /// The last-chance slot, when this request is on its last delivery; freed when its outcome
    /// is written (or the job ends without one).
    last_chance: Option<Slot>,
    /// Its member's share of the queue's `intake_load` while it waits for a worker.
    waiting: Option<Charge>,
    /// Its place in its `fair-share` pool's room while it waits for a worker.
    turn: Option<super::fair_share::Turn>,
    done: bool,
}

impl Job {
    pub fn new(ctx: Arc<QueueCtx>, held: Held, ticket: Ticket, releases: Vec<Release>) -> Job {
        Job {
            ctx,
            held,
            ticket,
            claimed_at: Instant::now(),
            releases,
            feedback: None,
            preempt: None,
            last_chance: None,
            waiting: None,
            turn: None,
            done: false,
        }
    }

    /// Counts the job's member against its queue's `intake_load`, and holds its place in a
    /// `fair-share` pool's room, until a worker takes it up.
    pub fn wait_for_worker(&mut self, bytes: usize, turn: Option<super::fair_share::Turn>) {
        self.waiting = Some(self.ctx.intake_load.charge(bytes));
        self.turn = turn;
    }

    /// A worker took the job up: it no longer counts as waiting.
    pub fn started(&mut self) {
        self.waiting = None;
        self.turn = None;
    }

    /// Holds the queue's last-chance slot until the job is done.
    pub fn hold_last_chance(&mut self, slot: Option<Slot>) {
        self.last_chance = slot;
    }

    /// Adds a pool gate's reservations, to undo with the outcome, and its preemption token.
    pub fn hold_releases(&mut self, releases: Vec<Release>, preempt: Option<CancellationToken>) {
        self.releases.extend(releases);
        if preempt.is_some() {
            self.preempt = preempt;
        }
    }

    /// Whether a gate waits to learn what the gateway did (most requests hold no release, and
    /// their feedback is never made).
    pub fn wants_feedback(&self) -> bool {
        !self.releases.is_empty()
    }

    /// Keeps what the gateway did with the request, for the releases.
    pub fn observe(&mut self, feedback: Feedback) {
        self.feedback = Some(feedback);
    }

    fn settle(&mut self) {
        self.done = true;
        let releases = std::mem::take(&mut self.releases);
        if !releases.is_empty() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(Decision::settle_all(releases, self.feedback.take()));
            }
        }
    }

    /// Settles the job and hands its outcome, with its last-chance slot, to the outbox.
    fn hand_over(&mut self, finish: Finish) {
        self.settle();
        let slot = self.last_chance.take();
        self.ctx.finish_holding(finish, slot);
    }

    /// Publishes the terminal result.
    pub fn publish(mut self, result: ResultMessage) {
        let ack = self.ctx.ack(&self.held.fence, &self.held.envelope, result);
        self.hand_over(ack);
    }

    /// Parks for a retry after `backoff`.
    pub fn park(mut self, backoff: std::time::Duration) {
        self.hand_over(Finish::Park {
            fence: self.held.fence.clone(),
            member: Queue::retry_member(&self.ctx.stamped(&self.held.envelope)),
            backoff,
        });
    }

    /// Parks the request unchanged (same `retry_count`: not a retry) to be taken again after
    /// `backoff`, freeing its worker: for a pool gate's refusal, which Go re-enqueues with
    /// backoff 0 (see [`super::worker`] for the pace).
    pub fn put_back(mut self, backoff: std::time::Duration) {
        self.hand_over(Finish::Park {
            fence: self.held.fence.clone(),
            member: self.ctx.stamped(&self.held.envelope).encode(),
            backoff,
        });
    }

    /// Gives the claim back to pending untouched.
    pub fn release(mut self) {
        self.hand_over(Finish::Release {
            fence: self.held.fence.clone(),
        });
    }

    /// The lease is lost: someone else owns the request now; write nothing.
    pub fn abandon(mut self) {
        self.settle();
        self.ctx.holdings.remove(&self.held.fence);
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if !self.done {
            self.hand_over(Finish::Release {
                fence: self.held.fence.clone(),
            });
        }
    }
}
