//! How a held generation ends, as values: a [`Finish`] the caller decides (ack, bury, park or
//! release), the [`Finished`] status the `finish` script answers for it, and [`SetAside`] for a
//! member dead-lettered straight from pending.
//!
//! The rewrites of a `Finish` that Redis would not take (a bury without its result, an ack
//! turned into a bury, a result too big for Redis) live here too: they take a `Finish` and give
//! back another, touching no connection.

use super::Fence;
use crate::queue::dead::DeadRecord;
use inferq_client::wire::{ErrorCode, ResultMessage};

/// Where a queue's result goes: the list, and the TTL (seconds, 0 for none) its every push
/// sets on it (Go's per-queue `result_ttl_seconds`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultRoute {
    pub list: String,
    pub ttl_s: u64,
}

/// How one generation ends.
#[derive(Debug, Clone)]
pub enum Finish {
    /// claimed -> done: push the result, drop the claim.
    Ack {
        fence: Fence,
        id: String,
        request_token: String,
        result_list: String,
        /// The TTL (seconds, 0 for none) the push sets on `result_list`.
        result_ttl_s: u64,
        result: String,
        /// The key the generation's body was stored at apart from its member (newer Go's
        /// `internal.payload_ref`), deleted with the ack; empty for a body carried inline.
        payload_ref: String,
    },
    /// claimed -> dead: push the result and a dead-letter record, drop the claim.
    Bury {
        fence: Fence,
        id: String,
        request_token: String,
        result_list: String,
        /// The TTL (seconds, 0 for none) the push sets on `result_list`.
        result_ttl_s: u64,
        result: String,
        record: String,
    },
    /// claimed -> parked: retry after `backoff` (by Redis time); `member` is the generation's
    /// envelope with its `retry_count` already bumped (see
    /// [`Queue::retry_member`](super::Queue::retry_member)).
    Park {
        fence: Fence,
        member: Vec<u8>,
        backoff: std::time::Duration,
    },
    /// claimed -> pending at the original score (work not done; no delivery counted).
    Release { fence: Fence },
}

impl Finish {
    /// The bytes this outcome carries to Redis (its result, record or member).
    pub fn size(&self) -> usize {
        match self {
            Finish::Ack { id, result, .. } => id.len() + result.len(),
            Finish::Bury {
                id, result, record, ..
            } => id.len() + result.len() + record.len(),
            Finish::Park { member, .. } => member.len(),
            Finish::Release { .. } => 0,
        }
    }

    /// For a bury whose result Redis refused to take (say, the message names a result list this
    /// user may not write): the same bury without the result, its record saying why, so the
    /// member still reaches the dead list instead of coming back at every lease expiry.
    /// `None` for anything else.
    pub fn bury_without_result(&self, refusal: &str) -> Option<Finish> {
        let Finish::Bury {
            fence,
            id,
            request_token,
            result_list,
            result,
            record,
            ..
        } = self
        else {
            return None;
        };
        if result.is_empty() {
            return None;
        }
        let mut dead: DeadRecord = serde_json::from_str(record).ok()?;
        dead.reason = format!(
            "{}; its result could not be published to {result_list:?}: {refusal}",
            dead.reason
        );
        let record = serde_json::to_string(&dead).ok()?;
        Some(resultless_bury(
            fence,
            id,
            request_token,
            result_list,
            record,
        ))
    }

    /// For an ack Redis refused to take (the result list is outside this user's rights, say):
    /// a bury of the same claim without pushing the result, its record saying why and keeping
    /// the result, so the request is set aside after one execution instead of running again at
    /// every lease expiry until the delivery limit. `member` and `deliveries` are what
    /// [`Queue::claimed`](super::Queue::claimed) read. `None` for anything else.
    pub fn bury_unpublished(
        &self,
        queue: &str,
        member: &[u8],
        deliveries: u32,
        refusal: &str,
    ) -> Option<Finish> {
        let Finish::Ack {
            fence,
            id,
            request_token,
            result_list,
            result,
            ..
        } = self
        else {
            return None;
        };
        let reason = format!("its result could not be published to {result_list:?}: {refusal}");
        let mut record = DeadRecord::new(queue, &reason, member);
        record.id = id.clone();
        record.request_token = request_token.clone();
        record.deliveries = deliveries;
        record.result = result.clone();
        Some(resultless_bury(
            fence,
            id,
            request_token,
            result_list,
            record.to_json(),
        ))
    }

    /// For an ack or a bury Redis will not take because of its size (it closes the connection
    /// at every write carrying it: a result over `proto-max-bulk-len`): the same ack with an
    /// `INFERENCE_ERROR` result saying `why`, or the same bury without its result. `None` for a
    /// park or a release.
    pub fn too_big_for_redis(&self, why: &str) -> Option<Finish> {
        match self {
            Finish::Ack {
                fence,
                id,
                request_token,
                result_list,
                result_ttl_s,
                payload_ref,
                ..
            } => Some(Finish::Ack {
                payload_ref: payload_ref.clone(),
                fence: fence.clone(),
                id: id.clone(),
                request_token: request_token.clone(),
                result_list: result_list.clone(),
                result_ttl_s: *result_ttl_s,
                result: {
                    let mut msg = ResultMessage::error(id, ErrorCode::InferenceError, why);
                    msg.request_token = request_token.clone();
                    msg.to_json()
                },
            }),
            Finish::Bury { .. } => self.bury_without_result(why),
            Finish::Park { .. } | Finish::Release { .. } => None,
        }
    }

    /// The TTL (seconds, 0 for none) an ack or a bury with a result sets on its list.
    pub fn result_ttl_s(&self) -> u64 {
        match self {
            Finish::Ack { result_ttl_s, .. } | Finish::Bury { result_ttl_s, .. } => *result_ttl_s,
            Finish::Park { .. } | Finish::Release { .. } => 0,
        }
    }

    /// The result list an ack or a bury with a result pushes to.
    pub fn result_list(&self) -> Option<&str> {
        match self {
            Finish::Ack { result_list, .. } => Some(result_list),
            Finish::Bury {
                result_list,
                result,
                ..
            } if !result.is_empty() => Some(result_list),
            _ => None,
        }
    }

    pub fn fence(&self) -> &Fence {
        match self {
            Finish::Ack { fence, .. }
            | Finish::Bury { fence, .. }
            | Finish::Park { fence, .. }
            | Finish::Release { fence } => fence,
        }
    }
}

/// A bury of the claim under `fence` that pushes no result to `result_list`, with `record` as
/// its dead letter.
fn resultless_bury(
    fence: &Fence,
    id: &str,
    request_token: &str,
    result_list: &str,
    record: String,
) -> Finish {
    Finish::Bury {
        fence: fence.clone(),
        id: id.to_owned(),
        request_token: request_token.to_owned(),
        result_list: result_list.to_owned(),
        result_ttl_s: 0,
        result: String::new(),
        record,
    }
}

/// How a dead-lettering went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetAside {
    /// pending -> dead (with its result, when one was given).
    Moved,
    /// No longer pending (another instance moved it): nothing was written.
    Gone,
    /// Nothing was written: Redis refused the result (the reason), or its list holds another
    /// type. The member can be set aside without it.
    ResultRefused(String),
}

/// How a finish went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finished {
    Published,
    /// The claim is gone or names another owner: already done, or taken over after a lease
    /// expiry. Nothing was written.
    NotYours,
    /// Redis refused this one call (the others in the batch still count).
    Failed(String),
}
