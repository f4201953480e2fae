//! claimed -> pending when a claim is given up: [`Queue::release`] by its owner (no delivery
//! counted), [`Queue::reclaim`] once its lease expired (a delivery counted, or taken over for
//! the caller to finish), and [`Queue::adopt_counts`], which gives old delivery counts the
//! deadline entry reclaim drops them by.

use std::sync::atomic::Ordering;

use redis::Value;

use super::reply::{bad_reply, bytes, int_array};
use super::{ms, Fence, Queue, QueueError};
use inferq_client::keys::fresh_token;
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::Envelope;

/// How long a delivery count without a deadline entry is kept once [`Queue::adopt_counts`]
/// indexes it, when its generation is not claimed (its deadline is in its member, which is not
/// at hand): a day, the longest an OpenAI batch is given. Reclaim puts the real deadline in
/// place the next time it counts a delivery of a generation still in the queue.
pub const UNINDEXED_COUNT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Why reclaim took over an expired claim instead of requeueing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Takeover {
    /// The deadline passed: finish it with `DEADLINE_EXCEEDED`.
    Deadline,
    /// It reached the delivery limit: bury it.
    Deliveries,
}

/// A claim reclaim took over for the caller to finish.
#[derive(Debug)]
pub struct TakenOver {
    pub fence: Fence,
    pub member: Vec<u8>,
    /// `None` when the member does not decode (written by something other than inferq).
    pub envelope: Option<Envelope>,
    pub reason: Takeover,
    pub deliveries: u32,
}

/// What one reclaim pass did.
#[derive(Debug, Default)]
pub struct Reclaimed {
    /// Expired claims put back in pending at their original score.
    pub requeued: u64,
    /// How long until the earliest remaining lease expires (by Redis time); `None` when no
    /// claim is held.
    pub next_expiry: Option<std::time::Duration>,
    pub taken_over: Vec<TakenOver>,
}

impl Queue {
    /// claimed -> pending at the original score, without counting a delivery.
    pub async fn release(&self, fences: &[Fence]) -> Result<Vec<bool>, QueueError> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let k = &self.keys;
        let keys = [&k.claimed, &k.owners, &k.idx, &k.scores, &k.pending];
        let args: Vec<&str> = fences
            .iter()
            .flat_map(|f| [f.key.as_str(), f.token.as_str()])
            .collect();
        let cmd = SCRIPTS.release.cmd(&keys, &args);
        let reply = SCRIPTS.release.run(&mut self.con.clone(), &cmd).await?;
        let statuses = int_array(&reply).ok_or_else(|| bad_reply("release", &reply))?;
        Ok(statuses.into_iter().map(|s| s == 1).collect())
    }

    /// Gives a deadline entry to the delivery counts of one `HSCAN` page of about `page` that
    /// have none (written by a release before `<queue>:deliveries-idx`, or by one still running
    /// beside this one), so that reclaim drops them in time like its own: by the deadline of a
    /// claimed generation, or [`UNINDEXED_COUNT_LIFETIME`] from now for one that is not claimed.
    /// Each call goes on where the last one stopped. Returns how many it indexed.
    pub async fn adopt_counts(&self, page: usize) -> Result<u64, QueueError> {
        let k = &self.keys;
        let keys = [&k.deliveries, &k.deliveries_idx, &k.claimed];
        let args = [
            self.count_scan.load(Ordering::Relaxed).to_string(),
            page.max(1).to_string(),
            UNINDEXED_COUNT_LIFETIME.as_secs().to_string(),
        ];
        let cmd = SCRIPTS.adopt_counts.cmd(&keys, &args);
        let reply = SCRIPTS
            .adopt_counts
            .run(&mut self.con.clone(), &cmd)
            .await?;
        let Value::Array(items) = &reply else {
            return Err(bad_reply("adoptCounts", &reply));
        };
        let [cursor, Value::Int(indexed)] = items.as_slice() else {
            return Err(bad_reply("adoptCounts", &reply));
        };
        let cursor = bytes(cursor)
            .and_then(|c| std::str::from_utf8(c).ok())
            .and_then(|c| c.parse::<u64>().ok())
            .ok_or_else(|| bad_reply("adoptCounts", &reply))?;
        self.count_scan.store(cursor, Ordering::Relaxed);
        Ok(u64::try_from(*indexed).unwrap_or(0))
    }

    /// Expired leases -> pending, or taken over for the caller to finish (deadline passed or
    /// delivery limit reached). At most `limit` claims per call.
    pub async fn reclaim(&self, limit: usize) -> Result<Reclaimed, QueueError> {
        let limit = limit.max(1);
        let k = &self.keys;
        let keys = [
            &k.claimed,
            &k.owners,
            &k.idx,
            &k.scores,
            &k.deliveries,
            &k.pending,
            &k.deliveries_idx,
        ];
        let mut args = vec![
            limit.to_string(),
            self.settings.max_deliveries.max(1).to_string(),
            ms(self.settings.lease).to_string(),
        ];
        args.extend((0..limit).map(|_| fresh_token()));
        let cmd = SCRIPTS.reclaim.cmd(&keys, &args);
        let reply = SCRIPTS.reclaim.run(&mut self.con.clone(), &cmd).await?;
        let Value::Array(items) = &reply else {
            return Err(bad_reply("reclaim", &reply));
        };
        let [Value::Int(requeued), Value::Int(next_ms), rest @ ..] = items.as_slice() else {
            return Err(bad_reply("reclaim", &reply));
        };
        let mut out = Reclaimed {
            requeued: u64::try_from(*requeued).unwrap_or(0),
            next_expiry: u64::try_from(*next_ms)
                .ok()
                .map(std::time::Duration::from_millis),
            taken_over: Vec::new(),
        };
        for chunk in rest.chunks(5) {
            let [key, member, token, reason, deliveries] = chunk else {
                return Err(bad_reply("reclaim", &reply));
            };
            let (Some(key), Some(member), Some(token), Some(reason)) =
                (bytes(key), bytes(member), bytes(token), bytes(reason))
            else {
                return Err(bad_reply("reclaim", &reply));
            };
            let Value::Int(deliveries) = deliveries else {
                return Err(bad_reply("reclaim", &reply));
            };
            out.taken_over.push(TakenOver {
                fence: Fence {
                    key: String::from_utf8_lossy(key).into_owned(),
                    token: String::from_utf8_lossy(token).into_owned(),
                },
                envelope: Envelope::decode(member).ok(),
                member: member.to_vec(),
                reason: if reason == b"deadline" {
                    Takeover::Deadline
                } else {
                    Takeover::Deliveries
                },
                deliveries: u32::try_from(*deliveries).unwrap_or(u32::MAX),
            });
        }
        Ok(out)
    }
}
