//! The moves of the durability contract as typed calls on one queue: `peek`, `claim`, `renew`,
//! `finish` (ack, bury, park and release, many in one call), `park`, `promote`, `release`,
//! `reclaim` and `dead_letter`.
//!
//! Each move is one Lua script (see [`inferq_client::scripts`]); this module builds its keys and
//! arguments and decodes its reply. Callers hand in envelopes and results; they get back who
//! holds what. A [`Fence`] (claim key + owner token) travels with every held request and is the
//! only thing that lets a caller move it again.
//!
//! The moves live in pieces of their own, each adding its calls to [`Queue`]:
//! [`claim`] (peek, claim, renew), [`finish`] (ack, bury, park and release in one call),
//! [`retry`] (park, promote), [`reclaim`] (release, reclaim), [`admit`] (pub/sub messages),
//! [`dead_letter`]; [`outcome`] holds the values a finish is made of, [`reply`] the decoding
//! of script replies and [`error`] the errors.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use super::traced::Con;
use inferq_client::keys::QueueKeys;
use inferq_client::ClaimSettings;

mod admit;
mod claim;
mod dead_letter;
mod error;
mod finish;
mod outcome;
mod reclaim;
mod reply;
mod retry;

pub use claim::{Claimed, Held, Peeked, TAKE_CHUNK, TAKE_CHUNK_BYTES};
pub(super) use error::is_refusal;
pub use error::QueueError;
pub use outcome::{Finish, Finished, ResultRoute, SetAside};
pub use reclaim::{Reclaimed, TakenOver, Takeover, UNINDEXED_COUNT_LIFETIME};
pub use retry::Promoted;

/// The right to move one claimed generation: its claim key and the owner token of this claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    pub key: String,
    pub token: String,
}

/// One queue's moves.
#[derive(Debug, Clone)]
pub struct Queue {
    pub(super) keys: QueueKeys,
    settings: ClaimSettings,
    pub(super) con: Con,
    /// A Redis Cluster: keys are hash-tagged, and what lives in other slots than the queue's
    /// (cancel markers, result lists of another tag, the Go retry set) is reached in steps of
    /// its own (see [`super::cross_slot`]).
    pub(super) cluster: bool,
    /// Results are PUBLISHed on a channel of the result list's name (redis-pubsub) instead of
    /// LPUSHed; one no subscriber hears is kept in the list.
    publish_results: bool,
    /// Where the next promote's scan of the Go retry set starts (shared by the clones).
    go_retry_scan: Arc<AtomicU64>,
    /// Where the next [`Queue::adopt_counts`] page of the delivery counts starts (an `HSCAN`
    /// cursor, shared by the clones).
    count_scan: Arc<AtomicU64>,
}

fn ms(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

impl Queue {
    pub fn new(con: impl Into<Con>, queue_name: &str, settings: ClaimSettings) -> Queue {
        let con = con.into();
        let cluster = con.is_cluster();
        Queue {
            keys: QueueKeys::for_layout(queue_name, cluster),
            settings,
            con,
            cluster,
            publish_results: false,
            go_retry_scan: Arc::default(),
            count_scan: Arc::default(),
        }
    }

    /// This queue's results are PUBLISHed on the channel named by their result list, as Go's
    /// redis-pubsub transport delivers them; a result no subscriber receives is LPUSHed onto the
    /// list of that name instead, so it is not lost.
    pub fn publishing_results(mut self) -> Queue {
        self.publish_results = true;
        self
    }

    pub fn keys(&self) -> &QueueKeys {
        &self.keys
    }

    pub fn name(&self) -> &str {
        &self.keys.pending
    }

    pub fn settings(&self) -> &ClaimSettings {
        &self.settings
    }

    /// A connection handle (cheap to clone; reconnects by itself).
    pub fn connection(&self) -> Con {
        self.con.clone()
    }

    /// Whether Redis answers (`PING`).
    pub async fn ping(&self) -> Result<(), QueueError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.con.clone())
            .await?;
        Ok(())
    }
}
