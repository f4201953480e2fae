//! The front door: OpenAI's `POST /v1/chat/completions`, `/v1/completions` and
//! `/v1/embeddings`, each taken as one inferq request, answered when it ends (wait mode, or a
//! stream) or at once with its id (enqueue mode), then read, long-polled or cancelled under
//! `/v1/requests`. Served by `inferq batch-api` beside the Batch API, with its keys, tenants,
//! Redis and metrics.
//!
//! ```text
//!  client ──POST /v1/chat/completions──▶ inbound (checks: mode, queue, deadline, key)
//!     record::open ──create-2.lua──▶ {inferq-batch}:req:<id> (+ the Idempotency-Key)
//!                  ──producer────▶ <queue> (a Go-format request; route: front:results)
//!  inferq run processors: claim, call the gateway, LPUSH the result onto front:results
//!  collect (every replica) ──collect-1.lua──▶ {inferq-batch}:res:<id>, PUBLISH front:done <id>
//!  waiters (every replica) ◀─SUBSCRIBE front:done── wake the waits of <id> ──▶ answer
//! ```
//!
//! A replica keeps only its open waits: every request's record and result are in Redis, so
//! any replica answers for any request, and a client whose replica died reads its result
//! through another (or retries with its `Idempotency-Key` and gets the same request).

pub mod answer;
pub mod collect;
pub mod duration;
pub mod http;
pub mod inbound;
pub mod keys;
pub mod record;
pub mod scripts;
pub mod settings;
pub mod waiters;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use inferq_client::producer::Producer;
use inferq_client::target::Target;

use crate::metrics::Metrics;
pub use settings::{FrontQueue, FrontSettings};

/// The front door's share of a replica.
#[derive(Debug)]
pub struct Front {
    pub settings: FrontSettings,
    /// One producer per queue a request may name (by `queue_name`), routing results to
    /// [`keys::results`].
    pub producers: HashMap<String, Producer>,
    pub waiters: Arc<waiters::Waiters>,
    /// Open waits on this replica (bounded by `max_waiting_clients`).
    waiting: AtomicUsize,
    /// Set once the replica is stopping: the waits it drops then do not cancel their requests
    /// (their clients retry elsewhere with their keys).
    stopping: std::sync::atomic::AtomicBool,
    metrics: Arc<Metrics>,
}

/// One open wait, counted while it lives.
#[derive(Debug)]
pub struct Slot {
    front: Arc<Front>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let left = self
            .front
            .waiting
            .fetch_sub(1, Ordering::AcqRel)
            .saturating_sub(1);
        self.front
            .metrics
            .front_waiting
            .set(i64::try_from(left).unwrap_or(i64::MAX));
    }
}

impl Front {
    /// Connects a producer for each usable queue.
    pub async fn connect(
        target: &Target,
        settings: FrontSettings,
        metrics: Arc<Metrics>,
    ) -> Result<Front, inferq_client::ProducerError> {
        let mut producers = HashMap::new();
        for queue in settings.usable() {
            let p = Producer::connect_target(target, queue, &keys::results())
                .await?
                .with_replica_wait(settings.replica_wait);
            producers.insert(queue.to_owned(), p);
        }
        Ok(Front {
            settings,
            producers,
            waiters: Arc::new(waiters::Waiters::default()),
            waiting: AtomicUsize::new(0),
            stopping: std::sync::atomic::AtomicBool::new(false),
            metrics,
        })
    }

    /// A wait slot, or `None` when `max_waiting_clients` are waiting already.
    pub fn slot(self: &Arc<Front>) -> Option<Slot> {
        let max = self.settings.max_waiting_clients;
        let taken = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        self.metrics
            .front_waiting
            .set(i64::try_from(taken + 1).unwrap_or(i64::MAX));
        Some(Slot {
            front: Arc::clone(self),
        })
    }

    /// Marks the replica stopping (see [`Front::is_stopping`]).
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
    }

    /// Whether the replica is stopping: a wait dropped now was dropped by the replica, not by
    /// its client going away.
    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// `--result-retention` in seconds (at least 1).
    pub fn retention_secs(&self) -> i64 {
        i64::try_from(self.settings.result_retention.as_secs())
            .unwrap_or(i64::MAX / 4)
            .max(1)
    }

    /// How long a record is kept once its request ended: twice the retention, so a request
    /// whose result was dropped reads `expired` for as long again before it reads 404.
    pub fn record_ttl_secs(&self) -> i64 {
        self.retention_secs().saturating_mul(2)
    }
}
