//! The durable queue: Redis keys, the Lua scripts of every move, the typed moves, dead-letter
//! records and the producer side.
//!
//! ```text
//!   producer ──ZADD──▶ pending ──claim──▶ claimed ──ack──▶ done (result list, or channel)
//!                        ▲  ▲               │ │ │
//!                        │  └──release──────┘ │ └──bury──▶ dead (+ result)
//!                        │  └──reclaim (lease expired)
//!   parked ──promote─────┘      ◀──park────────┘
//!   pending ──dead_letter (undecodable)──▶ dead
//!   dead ──requeue (operator; a new generation)──▶ pending
//!   channel (redis-pubsub) ──admit (once per message)──▶ pending
//! ```
//!
//! The census ([`census`]) reads how many requests are in each place, moving none. Bodies a
//! producer stored apart from their members (payload keys) are read by [`payloads`]. Results
//! are taken from their lists destructively, or under leases by Go's durable consumer protocol
//! ([`durable_results`]).

pub mod census;
pub mod cross_slot;
pub mod dead;
pub mod dead_letters;
pub mod moves;
pub mod payload_census;
pub mod payloads;
pub mod traced;

#[cfg(test)]
mod tests;

pub use moves::{
    Claimed, Fence, Finish, Finished, Held, Peeked, Promoted, Queue, QueueError, Reclaimed,
    ResultRoute, SetAside, TakenOver, Takeover,
};
