//! Retries: claimed -> parked ([`Queue::park`], with a bumped `retry_count`), and parked ->
//! pending once due ([`Queue::promote`], with this queue's due entries in Go's retry set).

use std::sync::atomic::Ordering;

use super::reply::{bad_reply, int_array};
use super::{Fence, Finish, Finished, Queue, QueueError};
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::Envelope;

/// What one promote pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Promoted {
    /// Due retries moved back to pending.
    pub moved: u64,
    /// How long until the earliest entry left in parked or the Go retry set is due (by Redis
    /// time; zero when one is due already); `None` when both are empty.
    pub until_due: Option<std::time::Duration>,
}

impl Queue {
    /// The member a retry parks: the same generation with `retry_count` bumped.
    pub fn retry_member(envelope: &Envelope) -> Vec<u8> {
        let mut next = envelope.clone();
        next.internal.retry_count = next.internal.retry_count.saturating_add(1);
        next.encode()
    }

    /// claimed -> parked with a bumped `retry_count`, due after `backoff` (by Redis time).
    /// Returns `false` when the claim is no longer ours.
    pub async fn park(
        &self,
        fence: &Fence,
        envelope: &Envelope,
        backoff: std::time::Duration,
    ) -> Result<bool, QueueError> {
        let park = Finish::Park {
            fence: fence.clone(),
            member: Self::retry_member(envelope),
            backoff,
        };
        match self.finish(&[park]).await?.pop() {
            Some(Finished::Published) => Ok(true),
            Some(Finished::NotYours) => Ok(false),
            Some(Finished::Failed(detail)) => Err(QueueError::Reply {
                script: "park",
                detail,
            }),
            None => Err(QueueError::Reply {
                script: "park",
                detail: "no reply".to_owned(),
            }),
        }
    }

    /// Due parked retries (and, when given, this queue's due entries in the Go retry set)
    /// -> pending. Returns how many moved.
    pub async fn promote(
        &self,
        limit: usize,
        go_retry_set: Option<&str>,
        default_for_go_retries: bool,
    ) -> Result<Promoted, QueueError> {
        let mut keys = vec![self.keys.parked.as_str(), self.keys.pending.as_str()];
        let mut go_moved = 0;
        match go_retry_set {
            // In a slot of its own on a cluster: moved in steps of its own.
            Some(set) if self.cluster => {
                go_moved = self
                    .promote_go_retries(set, limit, default_for_go_retries)
                    .await?;
            }
            Some(set) => keys.push(set),
            None => {}
        }
        let args = [
            limit.max(1).to_string(),
            self.keys.pending.clone(),
            if default_for_go_retries { "1" } else { "0" }.to_owned(),
            self.go_retry_scan.load(Ordering::Relaxed).to_string(),
        ];
        let cmd = SCRIPTS.promote.cmd(&keys, &args);
        let reply = SCRIPTS.promote.run(&mut self.con.clone(), &cmd).await?;
        match int_array(&reply).as_deref() {
            Some(&[moved, next, until_due]) => {
                self.go_retry_scan
                    .store(u64::try_from(next).unwrap_or(0), Ordering::Relaxed);
                Ok(Promoted {
                    moved: u64::try_from(moved).unwrap_or(0) + go_moved,
                    until_due: u64::try_from(until_due)
                        .ok()
                        .map(std::time::Duration::from_millis),
                })
            }
            _ => Err(bad_reply("promote", &reply)),
        }
    }
}
