//! Claim settings: how long a lease lasts, how often expired leases are reclaimed, and how many
//! lease expiries a request survives before it is dead-lettered. Built by [`crate::config`] from
//! the transport-config JSON (or the Go durable-claims flags) and read by the queue moves.

use std::time::Duration;

/// The lease and reclaim knobs of the durability contract.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClaimSettings {
    /// Crash-detection window: a claim whose holder stops renewing goes back to pending after
    /// this long. Renewed every third of it, so it need not cover a long inference.
    pub lease: Duration,
    /// How often any instance scans for expired leases.
    pub reclaim_interval: Duration,
    /// Lease expiries that dead-letter a request: the one that brings its count to this buries
    /// it (it survives one fewer).
    pub max_deliveries: u32,
    /// Replicas that must have a finish before it counts as done (`WAIT`); `None`: none.
    pub replica_wait: Option<ReplicaWait>,
}

/// How many replicas must acknowledge a write, and how long to wait for them (`WAIT n ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    /// Replicas that must hold a write.
    pub replicas: u32,
    /// How long to wait for them.
    pub timeout: Duration,
}

impl Default for ClaimSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            reclaim_interval: Duration::from_millis(5000),
            max_deliveries: 5,
            replica_wait: None,
        }
    }
}

impl ClaimSettings {
    /// How often held claims are renewed: a third of the lease.
    pub fn renew_every(&self) -> Duration {
        self.lease / 3
    }
}
