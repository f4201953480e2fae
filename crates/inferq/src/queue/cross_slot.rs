//! The moves of a queue on a Redis Cluster that reach keys in other slots than the queue's:
//! the producer's cancel markers, result lists with another hash tag, and the markers cleared
//! after a finish. One script can only touch one slot, so these take steps of their own, each
//! safe to repeat and to be cut short by a crash.
//!
//! **One terminal record per generation, across slots.** A finish whose result list is in
//! another slot runs in three steps:
//!
//! 1. *stage* (queue slot, fenced: `finish-11.lua`, `deadLetter-5.lua`): the claim is dropped
//!    and the result is kept in `{q}:finishing` under the claim key, in one script. From here
//!    on no owner can move the generation again, so no second result can be made for it.
//! 2. *deliver once* (result list's slot: `deliverOnce-2.lua`): the result is pushed unless the
//!    list's `{<list>}:delivered` markers already hold the claim key; the push leaves that
//!    marker. Repeating the step pushes nothing.
//! 3. *unstage* (queue slot: `unstage-3.lua`): the staged result is dropped (or, when the list
//!    refuses it, set aside in the dead list, result kept).
//!
//! A finisher that dies between steps leaves a staged result; any instance's upkeep
//! ([`Queue::settle_staged`]) takes those older than the queue's lease and runs steps 2 and 3
//! for them. A finisher that took longer than half that lease since its stage leaves its push
//! to upkeep, so the two hardly ever overlap; when they do, the marker makes the second push a
//! no-op. Markers (one set per queue and list) are kept [`delivered_retention`] (at least ten
//! minutes) and, beyond that, as long as the queue has an older staged result; a push whose
//! caller read the staged state more than half the retention ago is refused and read again. So
//! a marker outlives both its staged result and every caller that could still push it.
//!
//! Result lists named with the queue's tag (`{q}:results`) stay on the one-script path of a
//! single server; this module is not used for them.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::future::join_all;
use redis::Value;
use serde::{Deserialize, Serialize};

use super::dead::DeadRecord;
use super::moves::{Finish, Finished, Queue, QueueError};
use crate::config::hash_slot;
use inferq_client::keys::{active_key, cancel_key, delivered_key};
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::Envelope;

/// What a staged result holds: where it goes, and what.
#[derive(Debug, Serialize, Deserialize)]
struct Staged {
    list: String,
    result: String,
    /// The TTL (seconds) the push sets on the list; 0 (or absent, as older stages wrote) for
    /// none.
    #[serde(default, skip_serializing_if = "is_zero")]
    ttl_s: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// What a caller read of the queue's staged results before pushing some (both Unix ms of the
/// queue's node, as text for `deliverOnce-2.lua`): when it read, and the oldest staged result
/// then (empty when none).
struct StagedRead {
    at_ms: String,
    oldest_ms: String,
}

fn staged_reply(reply: &Value) -> QueueError {
    QueueError::Reply {
        script: "staleStaged",
        detail: format!("{reply:?}"),
    }
}

/// Most staged results one upkeep pass settles.
const SETTLE_BATCH: usize = 200;

/// How long the markers of delivered results are kept: ten leases, at least ten minutes.
pub fn delivered_retention(lease: Duration) -> Duration {
    lease.saturating_mul(10).max(Duration::from_secs(600))
}

/// The value a finish stages for `f` instead of its result, when `staged(list)` says its result
/// list is in another slot; `None` when it pushes (or carries) no result there.
pub(super) fn staging(f: &Finish, staged: impl Fn(&str) -> bool) -> Option<String> {
    let (list, result) = match f {
        Finish::Ack {
            result_list,
            result,
            ..
        }
        | Finish::Bury {
            result_list,
            result,
            ..
        } if !result.is_empty() => (result_list, result),
        _ => return None,
    };
    staged(list).then(|| {
        serde_json::to_string(&Staged {
            list: list.clone(),
            result: result.clone(),
            ttl_s: f.result_ttl_s(),
        })
        .unwrap_or_default()
    })
}

impl Queue {
    /// Whether a result for `list` is staged: on a cluster, when `list` hashes to another slot
    /// than the queue.
    pub(super) fn staged(&self, list: &str) -> bool {
        self.cluster && hash_slot(list) != hash_slot(&self.keys.pending)
    }

    /// The values of string keys in any slots (the producer's markers): one `MGET` on one
    /// server, one `GET` each (all at once) on a cluster, where an `MGET` across slots is
    /// refused.
    pub async fn read_markers(&self, keys: &[String]) -> Result<Vec<Option<String>>, QueueError> {
        if !self.cluster {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            return Ok(redis::cmd("MGET")
                .arg(keys)
                .query_async(&mut self.con.clone())
                .await?);
        }
        let reads = keys.iter().map(|key| {
            let mut con = self.con.clone();
            async move {
                redis::cmd("GET")
                    .arg(key)
                    .query_async::<Option<String>>(&mut con)
                    .await
            }
        });
        Ok(join_all(reads)
            .await
            .into_iter()
            .collect::<Result<Vec<_>, _>>()?)
    }

    /// Whether the producer has cancelled each generation, read from its `request-cancel:<id>`
    /// marker (a generation without a request token cannot be cancelled).
    pub(super) async fn cancelled(&self, envelopes: &[&Envelope]) -> Result<Vec<bool>, QueueError> {
        let tokened: Vec<&&Envelope> = envelopes
            .iter()
            .filter(|env| !env.internal.request_token.is_empty())
            .collect();
        let keys: Vec<String> = tokened
            .iter()
            .map(|env| cancel_key(&env.request.id))
            .collect();
        let mut markers = self.read_markers(&keys).await?.into_iter();
        Ok(envelopes
            .iter()
            .map(|env| {
                let token = &env.internal.request_token;
                !token.is_empty() && markers.next().flatten().as_deref() == Some(token.as_str())
            })
            .collect())
    }

    /// Steps 2 and 3 for the results `finish` staged, then the producer's markers of every
    /// generation it finished. Failures are left to upkeep (staged results) or to the markers'
    /// own expiry, and logged.
    pub(super) async fn after_cluster_finish<F: std::borrow::Borrow<Finish>>(
        &self,
        batch: &[F],
        staged: &[Option<String>],
        finished: &[Finished],
    ) {
        let started = Instant::now();
        let mut settle = Vec::new();
        let mut forget = Vec::new();
        let mut payloads = Vec::new();
        for ((f, staged), done) in batch.iter().map(|f| f.borrow()).zip(staged).zip(finished) {
            if *done != Finished::Published {
                continue;
            }
            if let Finish::Ack { payload_ref, .. } = f {
                if !payload_ref.is_empty() {
                    payloads.push(payload_ref.clone());
                }
            }
            if let Some(staged) = staged {
                settle.push((f.fence().key.clone(), staged.clone()));
            }
            if let Finish::Ack {
                id, request_token, ..
            }
            | Finish::Bury {
                id, request_token, ..
            } = f
            {
                if !request_token.is_empty() {
                    forget.push((id.as_str(), request_token.as_str()));
                }
            }
        }
        if !settle.is_empty() && started.elapsed() < self.settings().lease / 2 {
            if let Err(e) = self.settle_now(settle).await {
                tracing::debug!(error = %e, queue = %self.name(), "staged results left to upkeep");
            }
        }
        self.forget_markers(&forget).await;
        self.drop_payloads(&payloads).await;
    }

    /// `DEL` of the payload keys of acked generations, each in its own slot: a failure leaves
    /// the key to its TTL (the request's deadline plus ten minutes), as Go does.
    async fn drop_payloads(&self, keys: &[String]) {
        let calls = keys.iter().map(|key| {
            let mut con = self.con.clone();
            async move {
                redis::cmd("DEL")
                    .arg(key)
                    .query_async::<i64>(&mut con)
                    .await
            }
        });
        for (key, done) in keys.iter().zip(futures::future::join_all(calls).await) {
            if let Err(e) = done {
                tracing::debug!(error = %e, key, "a payload key is left to its TTL");
            }
        }
    }

    /// Steps 2 and 3 for one staged result; a failure leaves it to upkeep.
    pub(super) async fn settle_one(&self, ck: String, value: String) {
        if let Err(e) = self.settle_now(vec![(ck, value)]).await {
            tracing::debug!(error = %e, queue = %self.name(), "a staged result is left to upkeep");
        }
    }

    /// Steps 2 and 3 for results this caller has just staged: it reads the staged state first,
    /// which the push needs to trim markers safely.
    async fn settle_now(&self, items: Vec<(String, String)>) -> Result<u64, QueueError> {
        let (read, _) = self.read_staged(Duration::MAX, 0).await?;
        self.settle(items, &read).await
    }

    /// Compare-and-delete of `request-active:<id>` and `request-cancel:<id>` for each finished
    /// `(id, request token)`.
    pub(super) async fn forget_markers(&self, finished: &[(&str, &str)]) {
        let calls = finished.iter().flat_map(|(id, token)| {
            [active_key(id), cancel_key(id)].map(|key| {
                let mut con = self.con.clone();
                let token = (*token).to_owned();
                async move {
                    let cmd = SCRIPTS.forget.cmd(&[key], &[token]);
                    SCRIPTS.forget.run(&mut con, &cmd).await
                }
            })
        });
        for answer in join_all(calls).await {
            if let Err(e) = answer {
                tracing::debug!(error = %e, "a finished request's marker is left to expire");
            }
        }
    }

    /// Steps 2 and 3 for staged results `(claim key, staged value)`, read in the staged state
    /// `read`.
    async fn settle(
        &self,
        items: Vec<(String, String)>,
        read: &StagedRead,
    ) -> Result<u64, QueueError> {
        let (by_list, unreadable) = group_by_list(items);
        let retention = delivered_retention(self.settings().lease)
            .as_millis()
            .to_string();
        let deliveries = by_list
            .into_iter()
            .map(|(list, (ttl_s, items))| self.deliver_once(list, ttl_s, items, &retention, read));
        let mut settled = Settled::default();
        for (list, items, answer) in join_all(deliveries).await {
            self.take_answer(&mut settled, list, items, answer).await;
        }
        for (ck, why, value) in unreadable {
            let record = self.refused_record(&ck, &why, value);
            settled.unstage.push((ck, record));
        }
        let dropped = self.unstage(&settled.unstage).await?;
        match settled.first_error {
            Some(e) => Err(e),
            None => Ok(dropped),
        }
    }

    /// Step 2 for one list: pushes its `(claim key, result)` pairs once each (`deliverOnce`).
    /// Gives back the list and its pairs with Redis's answer.
    async fn deliver_once(
        &self,
        list: String,
        ttl_s: u64,
        items: Vec<(String, String)>,
        retention: &str,
        read: &StagedRead,
    ) -> (String, Vec<(String, String)>, redis::RedisResult<Value>) {
        let mut con = self.con.clone();
        let keys = [list.clone(), delivered_key(&list, self.name())];
        let ttl_s = ttl_s.to_string();
        let mut args: Vec<&str> = vec![retention, &ttl_s, &read.at_ms, &read.oldest_ms];
        for (ck, result) in &items {
            args.push(ck);
            args.push(result);
        }
        let cmd = SCRIPTS.deliver_once.cmd(&keys, &args);
        let answer = SCRIPTS.deliver_once.run(&mut con, &cmd).await;
        (list, items, answer)
    }

    /// What one list's delivery means for its staged entries: dropped once pushed (and on the
    /// replicas, when asked), set aside when Redis refuses the list, kept otherwise.
    async fn take_answer(
        &self,
        settled: &mut Settled,
        list: String,
        items: Vec<(String, String)>,
        answer: redis::RedisResult<Value>,
    ) {
        match answer {
            // With a replica wait, a staged result stays until its push is on the replicas:
            // upkeep pushes it again if a fail-over lost the push (and its marker).
            // The read was too old to push on (a stalled caller): read again later.
            Ok(Value::BulkString(s)) if s == b"stale" => {
                settled.first_error.get_or_insert(QueueError::Reply {
                    script: "deliverOnce",
                    detail: "the staged state was read too long ago; upkeep reads it again"
                        .to_owned(),
                });
            }
            Ok(Value::Array(_)) => match self.settings().replica_wait {
                Some(wait) if !self.wait_for_replicas(&list, wait).await => {}
                _ => settled
                    .unstage
                    .extend(items.into_iter().map(|(ck, _)| (ck, String::new()))),
            },
            Ok(other) => {
                settled.first_error.get_or_insert(QueueError::Reply {
                    script: "deliverOnce",
                    detail: format!("{other:?}"),
                });
            }
            // Redis refuses the list for good (another type, an ACL rule): set aside.
            Err(e) if super::moves::is_refusal(&e) => {
                for (ck, result) in items {
                    let why = format!("its result could not be published to {list:?}: {e}");
                    settled
                        .unstage
                        .push((ck.clone(), self.refused_record(&ck, &why, result)));
                }
            }
            Err(e) => {
                settled.first_error.get_or_insert(QueueError::Redis(e));
            }
        }
    }

    /// The dead-letter record of a staged result its list would not take.
    fn refused_record(&self, ck: &str, why: &str, result: String) -> String {
        let mut record = DeadRecord::new(self.name(), why, b"");
        let (id, token) = ck.split_once('\0').unwrap_or((ck, ""));
        record.id = id.to_owned();
        if !token.starts_with("sha1:") {
            record.request_token = token.to_owned();
        }
        record.result = result;
        record.to_json()
    }

    async fn unstage(&self, items: &[(String, String)]) -> Result<u64, QueueError> {
        if items.is_empty() {
            return Ok(0);
        }
        let k = &self.keys;
        let keys = [&k.finishing, &k.finishing_idx, &k.dead];
        let args: Vec<&str> = items
            .iter()
            .flat_map(|(ck, record)| [ck.as_str(), record.as_str()])
            .collect();
        let cmd = SCRIPTS.unstage.cmd(&keys, &args);
        match SCRIPTS.unstage.run(&mut self.con.clone(), &cmd).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(QueueError::Reply {
                script: "unstage",
                detail: format!("{other:?}"),
            }),
        }
    }

    /// Upkeep: settles the results staged longer ago than the queue's lease (by Redis time),
    /// whose finisher died (or stalled) between the steps; at most [`SETTLE_BATCH`] a call.
    /// Returns how many it settled. A no-op off a cluster.
    pub async fn settle_staged(&self) -> Result<u64, QueueError> {
        if !self.cluster {
            return Ok(0);
        }
        let (read, items) = self
            .read_staged(self.settings().lease, SETTLE_BATCH)
            .await?;
        if items.is_empty() {
            return Ok(0);
        }
        self.settle(items, &read).await
    }

    /// The staged state (`staleStaged-2.lua`): when it was read and the oldest staged result,
    /// and up to `limit` staged results older than `age`.
    async fn read_staged(
        &self,
        age: Duration,
        limit: usize,
    ) -> Result<(StagedRead, Vec<(String, String)>), QueueError> {
        let k = &self.keys;
        let cmd = SCRIPTS.stale_staged.cmd(
            &[&k.finishing, &k.finishing_idx],
            &[age.as_millis().to_string(), limit.to_string()],
        );
        let reply = SCRIPTS
            .stale_staged
            .run(&mut self.con.clone(), &cmd)
            .await?;
        let text = |v: &Value| match v {
            Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Value::SimpleString(s) => Some(s.clone()),
            _ => None,
        };
        let (read, rest) = match &reply {
            Value::Array(flat) if flat.len() >= 2 && flat.len() % 2 == 0 => {
                match (text(&flat[0]), text(&flat[1])) {
                    (Some(at_ms), Some(oldest_ms)) => (StagedRead { at_ms, oldest_ms }, &flat[2..]),
                    _ => return Err(staged_reply(&reply)),
                }
            }
            _ => return Err(staged_reply(&reply)),
        };
        let items = rest
            .chunks(2)
            .filter_map(|pair| match pair {
                [ck, value] => Some((text(ck)?, text(value)?)),
                _ => None,
            })
            .collect();
        Ok((read, items))
    }

    /// Due entries of the Go retry set (`retry-sortedset`, in a slot of its own) -> this queue,
    /// in two steps as Go's own retry mover takes them: `ZADD` to pending first, then `ZREM`
    /// from the retry set, so a crash between the two leaves the member in both (run again,
    /// at worst) and never in neither. Only members naming this queue move (and, when
    /// `default_queue`, those naming none). Returns how many moved.
    pub(super) async fn promote_go_retries(
        &self,
        set: &str,
        limit: usize,
        default_queue: bool,
    ) -> Result<u64, QueueError> {
        let mut con = self.con.clone();
        let now = inferq_client::producer::unix_ms() as f64 / 1000.0;
        let due: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(set)
            .arg("-inf")
            .arg(format!("{now:.6}"))
            .arg("BYSCORE")
            .arg("LIMIT")
            .arg(0)
            .arg(limit.max(1) * 4)
            .query_async(&mut con)
            .await?;
        let mut moved = 0;
        for member in due {
            let (origin, deadline) = origin_and_deadline(&member);
            let ours = match origin.as_deref() {
                Some("") | None => default_queue,
                Some(name) => name == self.keys.pending,
            };
            if !ours {
                continue;
            }
            let _: i64 = redis::cmd("ZADD")
                .arg(&self.keys.pending)
                .arg(deadline.unwrap_or(0))
                .arg(&member)
                .query_async(&mut con)
                .await?;
            let _: i64 = redis::cmd("ZREM")
                .arg(set)
                .arg(&member)
                .query_async(&mut con)
                .await?;
            moved += 1;
            if moved >= limit.max(1) as u64 {
                break;
            }
        }
        Ok(moved)
    }
}

/// Per result list: its TTL (the longest asked), and its `(claim key, result)` pairs.
type ByList = BTreeMap<String, (u64, Vec<(String, String)>)>;

/// Staged results `(claim key, staged value)` grouped [`ByList`]; apart, those that do not
/// parse, as `(claim key, why, staged value)`.
fn group_by_list(items: Vec<(String, String)>) -> (ByList, Vec<(String, String, String)>) {
    let mut by_list = ByList::new();
    let mut unreadable = Vec::new();
    for (ck, value) in items {
        match serde_json::from_str::<Staged>(&value) {
            Ok(s) => {
                let (ttl_s, pairs) = by_list.entry(s.list).or_default();
                *ttl_s = (*ttl_s).max(s.ttl_s);
                pairs.push((ck, s.result));
            }
            Err(e) => unreadable.push((ck, format!("staged result does not parse: {e}"), value)),
        }
    }
    (by_list, unreadable)
}

/// What the deliveries of one settling leave to do.
#[derive(Default)]
struct Settled {
    /// Staged entries to drop `(claim key, dead-letter record)`: the record empty for a
    /// result delivered, else the record of a result set aside.
    unstage: Vec<(String, String)>,
    /// The first failure met; the rest still settle.
    first_error: Option<QueueError>,
}

/// A Go retry member's origin queue (`internal.request_queue_name`; `None` when it does not
/// parse) and deadline (`data.deadline`), read loosely: a member that does not decode still
/// moves, to be dead-lettered by the consumer with a reason.
fn origin_and_deadline(member: &[u8]) -> (Option<String>, Option<i64>) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(member) else {
        return (None, None);
    };
    let origin = v
        .pointer("/internal/request_queue_name")
        .map(|o| o.as_str().unwrap_or_default().to_owned())
        .or_else(|| Some(String::new()));
    let deadline = v
        .pointer("/data/deadline")
        .and_then(serde_json::Value::as_i64);
    (origin, deadline)
}
