//! The front door: the router's `async-broker` contract, served by `inferq batch-api` beside the
//! Batch API, with its keys, tenants, Redis and metrics, over the router's Redis layout, so a
//! client of the router's step and a client of inferq are served alike and either side's
//! requests can be fetched from the other (and served by inferq or Go processors).
//!
//! ```text
//!  client ──POST (X-AP-Mode)──▶ inbound (mode, body, model, tenant, id, deadline)
//!    no header / passthrough ──▶ passthrough: quota class, stamps ──▶ gateway, streamed back
//!    enqueue / wait ──join-1.lua──▶ inferq-front:join:<tenant>:<id> (a repeated id joins)
//!                   ──MULTI──▶ DEL request-cancel:<env>, SET request-active:<env>, ZADD <queue>
//!  processors (inferq or Go): claim, call the gateway, LPUSH results:req:<tenant>:<id>
//!  waiters ◀─keyspace notification (or the sweep)── wake the wait ──▶ answer, mailbox TTL shrinks
//! ```
//!
//! A replica keeps only its open waits: every request's state is in Redis, so any replica (or
//! the router's step) answers for any request, and a client whose replica died fetches its
//! result through another, or repeats its id there and joins the same request.

pub mod answer;
pub mod broker;
pub mod config;
pub mod http;
pub mod inbound;
pub mod keys;
pub mod member;
pub mod passthrough;
pub mod scripts;
pub mod settings;
pub mod waiters;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metrics::Metrics;
pub use config::BrokerConfig;
pub use settings::FrontSettings;

/// The front door's share of a replica.
#[derive(Debug)]
pub struct Front {
    pub settings: FrontSettings,
    pub waiters: Arc<waiters::Waiters>,
    /// The client live requests go to the gateway with.
    pub http: reqwest::Client,
    /// Open waits on this replica (bounded by `max_waiting_clients`).
    waiting: AtomicUsize,
    /// Set once the replica is stopping: the waits it drops then do not cancel their requests
    /// (their clients retry elsewhere with their ids).
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
    /// The front door of a replica.
    pub fn new(settings: FrontSettings, metrics: Arc<Metrics>) -> Result<Front, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(5))
            .pool_max_idle_per_host(1024)
            .build()?;
        Ok(Front {
            settings,
            waiters: Arc::new(waiters::Waiters::default()),
            http,
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
}
