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
pub mod lanes;
pub mod last_chance;
pub mod load;
pub mod memory;
pub mod merge;
pub mod outbox;
pub mod processor;
pub mod proximity;
pub mod reload;
pub mod subscription;
pub mod tokens;
pub mod trace;
pub mod upkeep;
pub mod worker;

pub use processor::{run, run_with, DispatchError};
