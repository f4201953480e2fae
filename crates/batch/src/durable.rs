//! Durable acceptance: with the queue's `replica_wait` set, the Batch API's own writes wait
//! for the replicas (`WAIT`) before it answers or moves on: a create before its answer
//! ([`crate::batches_api`]), each ingestion round trip before the next ([`crate::ingest`]), a
//! batch's ending before its steward moves on ([`crate::finalize`]). So a Sentinel fail-over
//! right after any of them keeps what was answered.

use crate::error::BatchError;
use crate::state::App;

/// What a wait found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replicated {
    /// No `replica_wait` is set: nothing was asked.
    NotAsked,
    /// Enough replicas hold every write before the wait.
    Held,
    /// Only `acked` of `wanted` did within the timeout.
    Short { acked: u32, wanted: u32 },
}

/// Waits until the replicas hold every write this replica sent before, on the node of `key`.
pub async fn wait(app: &App, key: &str) -> Result<Replicated, BatchError> {
    let Some(wait) = app.settings.front.replica_wait else {
        return Ok(Replicated::NotAsked);
    };
    let mut con = app.redis.clone();
    let acked = con.wait_replicas(key, wait).await?;
    if acked >= wait.replicas {
        return Ok(Replicated::Held);
    }
    Ok(Replicated::Short {
        acked,
        wanted: wait.replicas,
    })
}
