//! The moves of the durability contract as typed calls on one queue: `peek`, `claim`, `renew`,
//! `finish` (ack, bury, park and release, many in one call), `park`, `promote`, `release`,
//! `reclaim` and `dead_letter`.
//!
//! Each move is one Lua script (see [`super::scripts`]); this module builds its keys and
//! arguments and decodes its reply. Callers hand in envelopes and results; they get back who
//! holds what. A [`Fence`] (claim key + owner token) travels with every held request and is the
//! only thing that lets a caller move it again.

use std::borrow::Borrow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use redis::{RedisError, Value};

use super::dead::DeadRecord;
use super::keys::{active_key, cancel_key, claim_key, fresh_token, QueueKeys};
use super::scripts::SCRIPTS;
use super::settings::ClaimSettings;
use super::traced::Con;
use crate::wire::{Envelope, ErrorCode, ResultMessage};

/// Errors of the queue layer.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from the {script} script: {detail}")]
    Reply {
        script: &'static str,
        detail: String,
    },
}

impl QueueError {
    /// Redis's own error reply, when Redis answered the call with one (`NOPERM` for a user
    /// missing a command, `READONLY` from a replica, `OOM`, `LOADING`), as opposed to being
    /// unreachable or answering something unexpected. `NOSCRIPT` is left out: the next call
    /// reloads the scripts. Wider than [`is_refusal`], which asks whether repeating could help.
    pub fn redis_refusal(&self) -> Option<&RedisError> {
        match self {
            QueueError::Redis(e) => match e.code() {
                Some("NOSCRIPT") | None => None,
                Some(_) => Some(e),
            },
            QueueError::Reply { .. } => None,
        }
    }

    /// Redis's refusal of a command to this user by its ACL rule: `NOPERM` for a command sent
    /// as is, or the error Redis 7 answers when a script calls one (`ERR The user executing the
    /// script can't run this command or subcommand`). Such a call fails the same way until the
    /// rule changes.
    pub fn acl_refusal(&self) -> Option<&RedisError> {
        self.redis_refusal().filter(|e| {
            e.code() == Some("NOPERM")
                || e.detail()
                    .is_some_and(|d| d.contains("can't run this command"))
        })
    }

    /// Whether this call failing means Redis is out of reach or unable to write for now (down,
    /// unreachable, timing out, loading, a read-only replica), so that the owners of claims
    /// could not renew them either. Not a refusal of this caller alone (`NOPERM`, a script
    /// error: see [`is_refusal`]), not `NOSCRIPT` (the next call reloads the scripts), not an
    /// unexpected reply.
    pub fn lost_redis(&self) -> bool {
        match self {
            QueueError::Redis(e) => !is_refusal(e) && e.code() != Some("NOSCRIPT"),
            QueueError::Reply { .. } => false,
        }
    }
}

fn bad_reply(script: &'static str, v: &Value) -> QueueError {
    QueueError::Reply {
        script,
        detail: format!("{v:?}"),
    }
}

/// The right to move one claimed generation: its claim key and the owner token of this claim.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Fence {
    pub key: String,
    pub token: String,
}

/// A member seen at the head of the queue, not yet claimed.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub member: Vec<u8>,
    pub score: f64,
}

/// A generation this instance holds under a lease.
#[derive(Debug, Clone)]
pub struct Held {
    pub fence: Fence,
    pub envelope: Envelope,
    /// The producer had cancelled this generation when it was claimed: finish it as
    /// `CANCELLED` without sending it.
    pub cancelled: bool,
}

/// What `claim` did with one member.
#[derive(Debug)]
pub enum Claimed {
    Held(Box<Held>),
    /// No longer pending: another instance claimed it, or it was removed.
    Gone,
    /// The same generation is already claimed; the stray pending copy was removed.
    Duplicate,
}

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

/// What one promote pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Promoted {
    /// Due retries moved back to pending.
    pub moved: u64,
    /// How long until the earliest entry left in parked or the Go retry set is due (by Redis
    /// time; zero when one is due already); `None` when both are empty.
    pub until_due: Option<std::time::Duration>,
}

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
    /// envelope with its `retry_count` already bumped (see [`Queue::retry_member`]).
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
    /// [`Queue::claimed`] read. `None` for anything else.
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

/// One queue's moves.
#[derive(Clone)]
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

/// Seconds an admitted message's marker outlives its deadline (see `admit-1.lua`): far longer
/// than pub/sub takes to hand one message to every subscriber.
const ADMIT_MARGIN_S: u64 = 600;
/// Longest an admit marker lives, whatever the deadline.
const ADMIT_LONGEST_S: u64 = 7 * 24 * 3600;

/// How long a delivery count without a deadline entry is kept once [`Queue::adopt_counts`]
/// indexes it, when its generation is not claimed (its deadline is in its member, which is not
/// at hand): a day, the longest an OpenAI batch is given. Reclaim puts the real deadline in
/// place the next time it counts a delivery of a generation still in the queue.
pub const UNINDEXED_COUNT_LIFETIME: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The keys every `finish` call passes before its result lists and producer keys (see
/// `finish-9.lua`).
const FINISH_FIXED_KEYS: usize = 11;

/// Most members claimed per script call (Lua's `unpack` takes a few thousand values at most).
pub const TAKE_CHUNK: usize = 500;

/// Most bytes of members claimed per script call (a bigger single member goes alone): the
/// script holds its arguments several times over while it runs, and Redis serves no other
/// client meanwhile.
pub const TAKE_CHUNK_BYTES: usize = 16 << 20;

/// Whether Redis refused a call for good (a script error, an ACL refusal), as opposed to the
/// transport failing or Redis being briefly unable (loading, read-only), where the reply is
/// unknown or the call is worth repeating. On a cluster, a `MOVED` or `ASK` the connection
/// did not follow in its own retries (the slot map still changing after a fail-over or a
/// migration) and a node it has no connection to are passing too: the next call lands.
pub(super) fn is_refusal(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return false;
    }
    !matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                S::BusyLoading
                    | S::TryAgain
                    | S::MasterDown
                    | S::ReadOnly
                    | S::ClusterDown
                    | S::NoScript
                    | S::Moved
                    | S::Ask
            )
    )
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

    /// channel -> pending: admits messages that arrived by pub/sub, each scored by its deadline.
    /// Bytes already admitted (by this or another subscribed instance) are skipped, so a
    /// message every instance received is still queued once. Returns how many were new.
    pub async fn admit(&self, messages: &[Vec<u8>]) -> Result<usize, QueueError> {
        if messages.is_empty() {
            return Ok(0);
        }
        let mut keys = Vec::with_capacity(messages.len() + 1);
        keys.push(self.keys.pending.clone());
        keys.extend(messages.iter().map(|m| self.keys.seen(m)));
        let margin = ADMIT_MARGIN_S.to_string();
        let longest = ADMIT_LONGEST_S.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(messages.len() + 2);
        args.push(margin.as_bytes());
        args.push(longest.as_bytes());
        args.extend(messages.iter().map(Vec::as_slice));
        let cmd = SCRIPTS.admit.cmd(&keys, &args);
        match SCRIPTS.admit.run(&mut self.con.clone(), &cmd).await? {
            Value::Int(n) => Ok(usize::try_from(n).unwrap_or(0)),
            other => Err(bad_reply("admit", &other)),
        }
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

    /// The member held under `fence` and the lease expiries its generation has gone through,
    /// read without moving anything; `None` once the claim names another owner token (or none).
    /// Not one atomic step, and need not be: an owner token is never reused, so a claim that is
    /// still ours at a later fenced move was ours, with this member, all along.
    pub async fn claimed(&self, fence: &Fence) -> Result<Option<(Vec<u8>, u32)>, QueueError> {
        let mut con = self.con.clone();
        let (owner, member, deliveries): (Option<String>, Option<Vec<u8>>, Option<u32>) =
            redis::pipe()
                .hget(&self.keys.owners, &fence.key)
                .hget(&self.keys.claimed, &fence.key)
                .hget(&self.keys.deliveries, &fence.key)
                .query_async(&mut con)
                .await?;
        Ok(match (owner, member) {
            (Some(owner), Some(member)) if owner == fence.token => {
                Some((member, deliveries.unwrap_or(0)))
            }
            _ => None,
        })
    }

    /// Whether Redis answers (`PING`).
    pub async fn ping(&self) -> Result<(), QueueError> {
        let _: String = redis::cmd("PING")
            .query_async(&mut self.con.clone())
            .await?;
        Ok(())
    }

    /// The `n` members with the earliest deadlines, without taking them.
    pub async fn peek(&self, n: usize) -> Result<Vec<Peeked>, QueueError> {
        self.peek_from(0, n).await
    }

    /// The `n` members from rank `start` on (0: the earliest deadline), without taking them.
    pub async fn peek_from(&self, start: usize, n: usize) -> Result<Vec<Peeked>, QueueError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut con = self.con.clone();
        let rows: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.pending)
            .arg(start)
            .arg(start + n - 1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(member, score)| Peeked { member, score })
            .collect())
    }

    /// Claims a batch of decoded members: pending -> claimed, checking each one's cancel
    /// marker in the same step. One script call per [`TAKE_CHUNK`] members or
    /// [`TAKE_CHUNK_BYTES`] of them, whichever comes first.
    pub async fn claim(
        &self,
        members: Vec<(Vec<u8>, Envelope)>,
    ) -> Result<Vec<Claimed>, QueueError> {
        let mut out = Vec::with_capacity(members.len());
        let mut members = members.into_iter().peekable();
        while members.peek().is_some() {
            let mut chunk: Vec<(Vec<u8>, Envelope)> =
                Vec::with_capacity(members.len().min(TAKE_CHUNK));
            let mut bytes = 0usize;
            while let Some((member, _)) = members.peek() {
                bytes = bytes.saturating_add(member.len());
                if chunk.len() == TAKE_CHUNK || (!chunk.is_empty() && bytes > TAKE_CHUNK_BYTES) {
                    break;
                }
                chunk.extend(members.next());
            }
            out.extend(self.take(chunk).await?);
        }
        Ok(out)
    }

    async fn take(&self, members: Vec<(Vec<u8>, Envelope)>) -> Result<Vec<Claimed>, QueueError> {
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let fences: Vec<Fence> = members
            .iter()
            .map(|(member, env)| Fence {
                key: claim_key(&env.request.id, &env.internal.request_token, member),
                token: fresh_token(),
            })
            .collect();
        let k = &self.keys;
        let mut keys: Vec<String> = vec![
            k.pending.clone(),
            k.claimed.clone(),
            k.owners.clone(),
            k.idx.clone(),
            k.scores.clone(),
        ];
        let lease = ms(self.settings.lease).to_string();
        let mut cancel_at: Vec<String> = Vec::with_capacity(members.len());
        if self.cluster {
            // The markers live in other slots: read first, passed in as a verdict.
            let envelopes: Vec<&Envelope> = members.iter().map(|(_, env)| env).collect();
            for cancelled in self.cancelled(&envelopes).await? {
                cancel_at.push(if cancelled { "-1" } else { "0" }.to_owned());
            }
        } else {
            for (_, env) in &members {
                if env.internal.request_token.is_empty() {
                    cancel_at.push("0".to_owned());
                } else {
                    keys.push(cancel_key(&env.request.id));
                    cancel_at.push(keys.len().to_string());
                }
            }
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + members.len() * 5);
        args.push(lease.as_bytes());
        for (((member, env), fence), at) in members.iter().zip(&fences).zip(&cancel_at) {
            args.push(member);
            args.push(fence.key.as_bytes());
            args.push(fence.token.as_bytes());
            args.push(at.as_bytes());
            args.push(env.internal.request_token.as_bytes());
        }
        // The command encodes the arguments, so the members are not copied again after this.
        let cmd = SCRIPTS.take.cmd(&keys, &args);
        let reply = SCRIPTS.take.run(&mut self.con.clone(), &cmd).await?;
        let statuses = int_array(&reply).ok_or_else(|| bad_reply("take", &reply))?;
        if statuses.len() != members.len() + 1 {
            return Err(bad_reply("take", &reply));
        }
        Ok(members
            .into_iter()
            .zip(fences)
            .zip(statuses.into_iter().skip(1))
            .map(|(((_, envelope), fence), status)| match status {
                1 | 2 => Claimed::Held(Box::new(Held {
                    fence,
                    envelope,
                    cancelled: status == 2,
                })),
                -1 => Claimed::Duplicate,
                _ => Claimed::Gone,
            })
            .collect())
    }

    /// Renews every given claim in one call. `true` = still ours, lease extended.
    pub async fn renew(&self, fences: &[Fence]) -> Result<Vec<bool>, QueueError> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let mut args: Vec<&str> = Vec::with_capacity(1 + fences.len() * 2);
        let lease = ms(self.settings.lease).to_string();
        args.push(&lease);
        for f in fences {
            args.push(&f.key);
            args.push(&f.token);
        }
        let cmd = SCRIPTS
            .renew
            .cmd(&[&self.keys.owners, &self.keys.idx], &args);
        let reply = SCRIPTS.renew.run(&mut self.con.clone(), &cmd).await?;
        let statuses = int_array(&reply).ok_or_else(|| bad_reply("renew", &reply))?;
        if statuses.len() != fences.len() + 1 {
            return Err(bad_reply("renew", &reply));
        }
        Ok(statuses.into_iter().skip(1).map(|s| s == 1).collect())
    }

    /// Acks, buries, parks and releases a batch of generations in one script call, each item
    /// fenced on its own. An outer error means the replies are unknown: retrying the whole
    /// batch is safe, because a repeated finish of a generation already done answers `NotYours`
    /// and writes nothing. A script error Redis answers (not a transport failure) fails every
    /// item of the batch: their claims are redelivered when their leases end.
    pub async fn finish<F: Borrow<Finish> + Sync>(
        &self,
        batch: &[F],
    ) -> Result<Vec<Finished>, QueueError> {
        let statuses = self.finish_call(batch).await?;
        if batch.len() < 2 || !statuses.iter().all(|s| matches!(s, Finished::Failed(_))) {
            return Ok(statuses);
        }
        // Redis refused the whole call. One item can be the cause (say, one naming a result list
        // this user may not write), and it must not fail its neighbours: each is tried alone.
        // Items are fenced, so one the refused call did move answers "not yours" now.
        let mut one_by_one = Vec::with_capacity(batch.len());
        for item in batch.chunks(1) {
            one_by_one.extend(self.finish_call(item).await?);
        }
        Ok(one_by_one)
    }

    /// One `finish` script call for `batch`; a refusal fails every item of it.
    async fn finish_call<F: Borrow<Finish> + Sync>(
        &self,
        batch: &[F],
    ) -> Result<Vec<Finished>, QueueError> {
        if batch.is_empty() {
            return Ok(Vec::new());
        }
        let k = &self.keys;
        let mut keys: Vec<String> = vec![
            k.claimed.clone(),
            k.owners.clone(),
            k.idx.clone(),
            k.scores.clone(),
            k.deliveries.clone(),
            k.pending.clone(),
            k.parked.clone(),
            k.dead.clone(),
            k.deliveries_idx.clone(),
            k.finishing.clone(),
            k.finishing_idx.clone(),
        ];
        // Per item: (index of its result list, index of its producer keys, backoff, the list's
        // TTL) as text; Lua indexes KEYS from 1, so an index is the length of `keys` after a push.
        let mut numbers: Vec<[String; 5]> = Vec::with_capacity(batch.len());
        for f in batch.iter().map(Borrow::borrow) {
            let (list, forget, backoff) = match f {
                Finish::Ack {
                    id,
                    request_token,
                    result_list,
                    ..
                }
                | Finish::Bury {
                    id,
                    request_token,
                    result_list,
                    ..
                } => {
                    let pushes = !matches!(f, Finish::Bury { result, .. } if result.is_empty());
                    let list = match keys[FINISH_FIXED_KEYS..]
                        .iter()
                        .position(|k| k == result_list)
                    {
                        // A bury without a result names no list: the call needs no right to it.
                        _ if !pushes => 0,
                        // A list in another cluster slot: the result is staged (index 0).
                        _ if self.staged(result_list) => 0,
                        Some(at) => at + FINISH_FIXED_KEYS + 1,
                        None => {
                            keys.push(result_list.clone());
                            keys.len()
                        }
                    };
                    // Negated: publish on the channel of that name (see `deliver.lua`).
                    let list = if self.publish_results {
                        -i64::try_from(list).unwrap_or(0)
                    } else {
                        i64::try_from(list).unwrap_or(0)
                    };
                    // On a cluster the markers are cleared after the call (`forget-1.lua`).
                    let forget = if request_token.is_empty() || self.cluster {
                        0
                    } else {
                        keys.push(active_key(id));
                        keys.push(cancel_key(id));
                        keys.len() - 1
                    };
                    (list, forget, 0)
                }
                Finish::Park { backoff, .. } => {
                    (0, 0, u64::try_from(backoff.as_millis()).unwrap_or(u64::MAX))
                }
                Finish::Release { .. } => (0, 0, 0),
            };
            // An ack deletes the body stored apart in the same fenced step (on a cluster, where
            // it lives in another slot, after the call).
            let payload = match f {
                Finish::Ack { payload_ref, .. } if !payload_ref.is_empty() && !self.cluster => {
                    keys.push(payload_ref.clone());
                    keys.len()
                }
                _ => 0,
            };
            numbers.push([
                list.to_string(),
                forget.to_string(),
                backoff.to_string(),
                f.result_ttl_s().to_string(),
                payload.to_string(),
            ]);
        }
        // What a staged item carries instead of its result: the list and the result together.
        let staged: Vec<Option<String>> = batch
            .iter()
            .map(|f| super::cross_slot::staging(f.borrow(), |list| self.staged(list)))
            .collect();
        let mut args: Vec<&[u8]> = Vec::with_capacity(batch.len() * 10);
        for ((f, [list, forget, backoff, ttl, payload]), staged) in
            batch.iter().map(Borrow::borrow).zip(&numbers).zip(&staged)
        {
            let item: [&[u8]; 10] = match f {
                Finish::Ack {
                    fence,
                    request_token,
                    result,
                    ..
                } => [
                    b"ack",
                    fence.key.as_bytes(),
                    fence.token.as_bytes(),
                    list.as_bytes(),
                    staged.as_deref().unwrap_or(result).as_bytes(),
                    b"",
                    forget.as_bytes(),
                    request_token.as_bytes(),
                    ttl.as_bytes(),
                    payload.as_bytes(),
                ],
                Finish::Bury {
                    fence,
                    request_token,
                    result,
                    record,
                    ..
                } => [
                    b"bury",
                    fence.key.as_bytes(),
                    fence.token.as_bytes(),
                    list.as_bytes(),
                    staged.as_deref().unwrap_or(result).as_bytes(),
                    record.as_bytes(),
                    forget.as_bytes(),
                    request_token.as_bytes(),
                    ttl.as_bytes(),
                    b"0",
                ],
                Finish::Park { fence, member, .. } => [
                    b"park",
                    fence.key.as_bytes(),
                    fence.token.as_bytes(),
                    member,
                    backoff.as_bytes(),
                    b"",
                    b"0",
                    b"",
                    b"0",
                    b"0",
                ],
                Finish::Release { fence } => [
                    b"release",
                    fence.key.as_bytes(),
                    fence.token.as_bytes(),
                    b"",
                    b"",
                    b"",
                    b"0",
                    b"",
                    b"0",
                    b"0",
                ],
            };
            args.extend(item);
        }
        let cmd = SCRIPTS.finish.cmd(&keys, &args);
        let reply = match SCRIPTS.finish.run(&mut self.con.clone(), &cmd).await {
            Ok(reply) => reply,
            Err(e) if is_refusal(&e) => {
                return Ok(vec![Finished::Failed(e.to_string()); batch.len()]);
            }
            Err(e) => return Err(e.into()),
        };
        let statuses = match &reply {
            Value::Array(items) if items.len() == batch.len() => items,
            _ => return Err(bad_reply("finish", &reply)),
        };
        let finished: Vec<Finished> = statuses
            .iter()
            .zip(batch.iter().map(Borrow::borrow))
            .map(|(s, f)| match s {
                Value::Int(1) => Ok(Finished::Published),
                Value::Int(-2) => Ok(Finished::Failed(format!(
                    "WRONGTYPE the result list {:?} holds another type than a list",
                    f.result_list().unwrap_or_default()
                ))),
                Value::Int(_) => Ok(Finished::NotYours),
                // Redis refused to PUBLISH the result (redis-pubsub): nothing of it moved.
                Value::BulkString(refusal) => Ok(Finished::Failed(format!(
                    "{} (PUBLISH on the channel {:?})",
                    String::from_utf8_lossy(refusal),
                    f.result_list().unwrap_or_default()
                ))),
                _ => Err(bad_reply("finish", &reply)),
            })
            .collect::<Result<_, _>>()?;
        let done = |(f, s): (&F, &Finished)| {
            *s == Finished::Published
                && matches!(f.borrow(), Finish::Ack { .. } | Finish::Bury { .. })
        };
        if let Some(wait) = self.settings.replica_wait {
            if batch.iter().zip(&finished).any(done) {
                self.wait_for_replicas(&self.keys.pending, wait).await;
            }
        }
        if self.cluster {
            self.after_cluster_finish(batch, &staged, &finished).await;
        }
        Ok(finished)
    }

    /// Waits for `wait.replicas` replicas to hold the writes sent to `key`'s primary; `true`
    /// when they do. A shortfall is logged: the writes stand on the primary alone, and a
    /// fail-over before they reach a replica undoes them (the request then runs again).
    pub(super) async fn wait_for_replicas(&self, key: &str, wait: super::ReplicaWait) -> bool {
        match self.con.clone().wait_replicas(key, wait).await {
            Ok(acked) if acked >= wait.replicas => true,
            Ok(acked) => {
                tracing::warn!(queue = %self.name(), acked, wanted = wait.replicas, timeout = ?wait.timeout, "finished requests reached fewer replicas than asked within the timeout");
                false
            }
            Err(e) => {
                tracing::warn!(queue = %self.name(), error = %e, "cannot ask Redis how many replicas hold the finished requests (WAIT)");
                false
            }
        }
    }

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

    /// pending -> dead for a member that cannot be a request; with a result when an id could
    /// be read.
    pub async fn dead_letter(
        &self,
        member: &[u8],
        record: &str,
        result: Option<(&ResultRoute, &ResultMessage)>,
    ) -> Result<SetAside, QueueError> {
        let (list, ttl_s, json) = match result {
            Some((route, msg)) => (route.list.clone(), route.ttl_s, msg.to_json()),
            None => (self.keys.dead.clone(), 0, String::new()),
        };
        let k = &self.keys;
        let keys = [&k.pending, &k.dead, &list, &k.finishing, &k.finishing_idx];
        // On a cluster, a result list in another slot gets its result staged, then delivered.
        let staged = match result {
            Some((route, msg)) if self.staged(&route.list) => Some((
                claim_key(&msg.id, "", member),
                super::cross_slot::staging(
                    &Finish::Ack {
                        fence: Fence {
                            key: String::new(),
                            token: String::new(),
                        },
                        id: msg.id.clone(),
                        request_token: String::new(),
                        result_list: route.list.clone(),
                        result_ttl_s: route.ttl_s,
                        result: json.clone(),
                        payload_ref: String::new(),
                    },
                    |_| true,
                )
                .unwrap_or_default(),
            )),
            _ => None,
        };
        let mode: &[u8] = match (&staged, self.publish_results) {
            (Some(_), _) => b"stage",
            (None, true) => b"publish",
            (None, false) => b"",
        };
        let (ck, carried) = match &staged {
            Some((ck, value)) => (ck.as_bytes(), value.as_bytes()),
            None => (&b""[..], json.as_bytes()),
        };
        let ttl_s = ttl_s.to_string();
        let args: [&[u8]; 6] = [
            member,
            record.as_bytes(),
            carried,
            mode,
            ck,
            ttl_s.as_bytes(),
        ];
        let cmd = SCRIPTS.dead_letter.cmd(&keys, &args);
        let reply = match SCRIPTS.dead_letter.run(&mut self.con.clone(), &cmd).await {
            Ok(reply) => reply,
            // Refused with a result to push: the result list can be the cause (outside this
            // user's rights); the caller can set the member aside without it.
            Err(e) if result.is_some() && is_refusal(&e) => {
                return Ok(SetAside::ResultRefused(e.to_string()))
            }
            Err(e) => return Err(e.into()),
        };
        match reply {
            Value::Int(1) => {
                if let Some((ck, value)) = staged {
                    self.settle_one(ck, value).await;
                }
                Ok(SetAside::Moved)
            }
            Value::Int(0) => Ok(SetAside::Gone),
            Value::Int(-1) => Ok(SetAside::ResultRefused(format!(
                "WRONGTYPE the result list {list:?} holds another type than a list"
            ))),
            other => Err(bad_reply("deadLetter", &other)),
        }
    }
}

fn int_array(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}
