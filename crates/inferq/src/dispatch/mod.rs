//! The processor: takes requests from the queues under leases, dispatches them to the inference
//! gateway, and writes each one's outcome back through the queue moves.
//!
//! ```text
//!  Redis pending ──peek/claim──▶ consumer (per queue) ──▶ channel ─┐
//!                                   │ dead-letter, CANCELLED,       │ merge policy
//!                                   │ DEADLINE_EXCEEDED             ▼
//!                                   │                        pool (N workers) ──▶ gateway
//!                                   ▼                               │
//!  Redis result list / parked ◀── outbox (batched ack/park/release) ◀┘
//!          ▲
//!  heartbeat (renew), cancel watch, reclaimer, promoter: per queue, in the background
//! ```
//!
//! ## A claim's life
//!
//! What a claimed request holds, who takes each part and who frees it on every path. A
//! [`context::Job`] carries the parts from the claim to its outcome; dropping a job without an
//! outcome releases the claim, so no path leaks one.
//!
//! | held | taken by | freed by: outcome written | lease lost | turned away / never started | shutdown |
//! |---|---|---|---|---|---|
//! | the Redis claim (lease, fence) | the consumer's claim ([`consumer`]), or reclaim taking over a finish ([`upkeep`]) | the outbox's ack, park or release ([`outbox`]) | nothing: another instance reclaims it after the lease | the job's drop: a release through the outbox | release through the outbox; unwritten, the lease returns it to pending |
//! | its entry in [`holdings`] (local lease clock, abort) | the consumer, at the claim | the outbox, once the outcome is written | [`context::Job::abandon`], a renewal that says "not yours", or the local lease running out ([`upkeep`]) | the outbox, after the release | the outbox, after the release |
//! | gate reservations ([`gates::Release`]) | the queue gate between peek and claim, the pool gate before the send ([`worker`]) | the job's settle, with the gateway's [`gates::Feedback`] | the job's settle, without feedback | [`context::QueueCtx::turn_away`] (refused before a job existed) or the job's settle | the job's settle |
//! | its bytes waiting for a worker ([`load::Charge`] of `intake_load`) | the consumer, when it hands the job to the pool | the worker, when it takes the job up | the job's drop | the job's drop | the job's drop |
//! | its place in a `fair-share` pool's room ([`fair_share::Turn`]), only in such a pool | the consumer, when it hands the job to the pool (reserved before the poll) | the worker, when it takes the job up | the job's drop | the job's drop | the job's drop |
//! | its outcome's bytes ([`load::Charge`] of `outbox_load`) | handing the outcome to the outbox | the outbox, once written or given up | the outbox, dropping an outcome whose lease is gone | the outbox, after the release | the outbox, when it stops |
//! | the last-chance slot ([`last_chance::Slot`]), only on its last delivery | the consumer's triage | the outbox, once the outcome is written or given up | the job's drop after its abandon, or the outbox dropping the outcome | the outbox, after the release | the outbox, when it stops |
//!
//! The lane's own conditions (outbox stalled, Redis lost, retired) are in [`lane_state`].
//!
//! ## Modules
//!
//! - [`holdings`]: what this instance holds, with local lease validity and abort handles.
//! - [`context`]: what one queue's tasks share.
//! - [`consumer`]: peek → triage (queue gate, last chance) → claim → hand to the pool.
//! - [`bodies`]: the bodies stored apart (payload keys) read for the claimed requests.
//! - [`gates`]: the queue and pool gates.
//! - [`merge`]: random-robin, tier-priority or fair-share ([`fair_share`]) across a pool's
//!   queues.
//! - [`discovery`]: `fair-share`'s queues found by prefix, through the index of queues with
//!   work (and a periodic `SCAN`), served and retired as they come and go; the tenants' weights.
//! - [`worker`]: one request → one HTTP attempt → its next move.
//! - [`trace`]: the request's OpenTelemetry spans and the trace headers sent to the gateway.
//! - [`outbox`]: batched, outage-tolerant writing of outcomes.
//! - [`load`]: the byte bounds on the members waiting for a worker and the outcomes waiting in
//!   the outbox.
//! - [`doorbell`]: wake-ups by pub/sub when work arrives; polling is the fallback.
//! - [`ingress`]: Go's redis-pubsub transport: messages published on a queue's channel are
//!   admitted into its durable pending set.
//! - [`subscription`]: the pub/sub plumbing of the two listeners above.
//! - [`upkeep`]: renewals, cancel checks, reclaim, promotion, backlog.
//! - [`processor`]: the lifecycle and graceful shutdown.
//! - [`lanes`]: one queue's tasks, started, and retired without losing what they hold.
//! - [`lane_state`]: a lane's conditions (outbox stalled, Redis lost, retired) and who moves them.
//! - [`reload`]: the queues config reload (a watch interval, SIGHUP).
//! - [`last_chance`]: at most one last-chance request per queue and instance, so a poison
//!   request does not take its neighbours to the dead list.
//! - [`memory`]: warns when Redis may evict keys (`maxmemory-policy`), and when it did.
//! - [`fault`]: the `INFERQ_FAULT_CRASH_ON` crash hook for poison-request tests.

pub mod bodies;
pub mod consumer;
pub mod context;
pub mod discovery;
pub mod doorbell;
pub mod fair_share;
pub mod fault;
pub mod gate_wait;
pub mod gates;
pub mod holdings;
pub mod ingress;
pub mod lane_stamp;
pub mod lane_state;
pub mod lanes;
pub mod last_chance;
pub mod load;
pub mod memory;
pub mod merge;
pub mod outbox;
pub mod processor;
pub mod proximity;
pub mod reload;
pub mod reserved;
pub mod subscription;
pub mod tokens;
pub mod trace;
pub mod upkeep;
pub mod worker;

pub use processor::{run, run_with, DispatchError};
