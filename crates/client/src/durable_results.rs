//! Durable result delivery: Go's consumer protocol (`DurableResultProducer`: Receive, Renew,
//! Ack), so an inferq consumer and a Go consumer can share a result list and each result is
//! taken once.
//!
//! In: a result list (the route) that processors `LPUSH` onto. Out: [`Delivery`]s, each a
//! result claimed under a lease in Go's keys beside the route, until the consumer acks it once
//! stored:
//!
//! ```text
//!   route ──receive──▶ <route>:result-claimed / -claim-owners / -claims-idx ──ack──▶ tombstone
//!     ▲                         │ lease ran out (put back by the next receive, first in line)
//!     └─────────────────────────┘
//! ```
//!
//! Every call is one script (`resultReceive-5.lua`, `resultRenew-2.lua`, `resultAck-4.lua`),
//! reckoned by Redis `TIME` in milliseconds. Every receive mints a fresh owner token,
//! `<name>/<32 hex>`: the consumer's name shows in `<route>:result-claim-owners` for operators,
//! and the random part keeps two live consumers of one name from acking each other's claims
//! (it also keeps the claim IDs of two unparsable entries one consumer holds apart, as Go's
//! per-receive token does). On a Redis Cluster the four keys are `{<route>}:result-*` by Go's
//! `slotKey` rule, in the route's slot.

use std::time::Duration;

use redis::{RedisError, Value};

use crate::keys::{fresh_token, slot_key};
use crate::scripts::SCRIPTS;
use crate::target::{Link, LinkError};
use crate::wire::ResultMessage;

/// How long a claim lasts unrenewed (Go's default): how long a killed consumer's results wait.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(300);
/// How often an empty route is asked again (Go's default reclaim interval).
pub const DEFAULT_RECLAIM_INTERVAL: Duration = Duration::from_secs(1);
/// How long an ack's tombstone suppresses copies of the result (Go: seven days).
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Most expired claims put back, entries looked at, and tombstones dropped per call (Go's).
const BATCH: u32 = 100;

/// Errors of durable result delivery.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurableResultError {
    /// Redis refused or failed a call.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// No connection could be opened.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// Renew or ack found the claim in another owner's hands, gone, or its lease run out: the
    /// result is (or will be) delivered to another receive.
    #[error("result delivery ownership lost (its lease ran out or it went to another consumer)")]
    OwnershipLost,
    /// Redis did not answer a call in time.
    #[error("redis: no answer within {waited:?} (Redis is not answering)")]
    NoAnswer {
        /// How long the call waited.
        waited: Duration,
    },
    /// A script answered in a shape it never answers in.
    #[error("unexpected answer from {script}: {answer}")]
    Unexpected {
        /// The script's name.
        script: &'static str,
        /// What it answered.
        answer: String,
    },
    /// A setting that must be above zero is not.
    #[error("{setting} must be longer than zero")]
    BadSetting {
        /// The setting's name.
        setting: &'static str,
    },
}

impl DurableResultError {
    fn of(e: RedisError) -> DurableResultError {
        if e.is_timeout() {
            DurableResultError::NoAnswer {
                waited: crate::connect::RESPONSE_TIMEOUT,
            }
        } else {
            DurableResultError::Redis(e)
        }
    }
}

/// The four claim keys of a route, as Go names them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResultClaimKeys {
    /// The result list itself (plain name everywhere).
    pub route: String,
    /// hash claim ID -> the result as stored.
    pub claimed: String,
    /// hash claim ID -> owner token.
    pub owners: String,
    /// zset claim ID -> lease expiry, Unix ms.
    pub idx: String,
    /// zset claim ID -> tombstone expiry, Unix ms.
    pub tombstones: String,
}

impl ResultClaimKeys {
    /// The keys of `route`; on a cluster prefixed by [`slot_key`] (`{results}:result-claimed`).
    pub fn new(route: &str, cluster: bool) -> ResultClaimKeys {
        let prefix = if cluster {
            slot_key(route)
        } else {
            route.to_owned()
        };
        ResultClaimKeys {
            route: route.to_owned(),
            claimed: format!("{prefix}:result-claimed"),
            owners: format!("{prefix}:result-claim-owners"),
            idx: format!("{prefix}:result-claims-idx"),
            tombstones: format!("{prefix}:result-ack-tombstones"),
        }
    }
}

/// Lease, polling and tombstone times of a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableSettings {
    /// A claim's lease; renew well before it runs out while storing takes long.
    pub lease: Duration,
    /// How long [`DurableResults::receive`] waits before asking an empty route again.
    pub reclaim_interval: Duration,
    /// How long an ack's tombstone lives.
    pub tombstone_ttl: Duration,
}

impl Default for DurableSettings {
    fn default() -> Self {
        DurableSettings {
            lease: DEFAULT_LEASE,
            reclaim_interval: DEFAULT_RECLAIM_INTERVAL,
            tombstone_ttl: TOMBSTONE_TTL,
        }
    }
}

impl DurableSettings {
    /// Refuses times that cannot work (Go refuses non-positive ones too).
    pub fn check(&self) -> Result<(), DurableResultError> {
        for (setting, d) in [
            ("the result lease", self.lease),
            ("the reclaim interval", self.reclaim_interval),
            ("the tombstone lifetime", self.tombstone_ttl),
        ] {
            if ms(d) == 0 {
                return Err(DurableResultError::BadSetting { setting });
            }
        }
        Ok(())
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What a claimed entry holds.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Received {
    /// A result, parsed.
    Result(ResultMessage),
    /// A result by the protocol (a string `id`, a string `request_token` if any) that inferq's
    /// [`ResultMessage`] does not read (a field of another type): why.
    Unreadable(String),
    /// An entry that is no result (Go's `-1`): why. It is claimed like any other, so it can be
    /// reported and acked instead of put back at every lease.
    Unparsable(String),
}

/// One claimed entry: store it, then [`DurableResults::ack`] it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Delivery {
    /// The entry exactly as it was stored.
    pub raw: Vec<u8>,
    /// How the entry reads: a result, an unreadable one, or no result at all.
    pub received: Received,
    /// `id NUL request_token` (or `id` alone), or the unparsable claim ID.
    pub claim_id: Vec<u8>,
    /// The owner token of the receive that claimed it.
    pub owner: String,
}

/// One receive call's outcome.
#[derive(Debug)]
#[non_exhaustive]
pub enum Poll {
    /// The route is empty.
    Empty,
    /// Only copies of results acked or held by others were found (and dropped).
    Skipped,
    /// An entry, claimed under this consumer's lease.
    Got(Delivery),
}

/// How an ack went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acked {
    /// The claim was dropped and its tombstone written.
    Now,
    /// It was acked before (a repeated ack, after a lost reply).
    Before,
}

/// A durable result consumer of one route; see the module comment.
#[derive(Debug)]
pub struct DurableResults {
    con: Link,
    keys: ResultClaimKeys,
    name: String,
    settings: DurableSettings,
}

impl DurableResults {
    /// A consumer named `name` (for logs and the owner tokens) of `route` on `con`.
    pub fn new(
        con: Link,
        route: &str,
        name: &str,
        settings: DurableSettings,
    ) -> Result<DurableResults, DurableResultError> {
        settings.check()?;
        let keys = ResultClaimKeys::new(route, con.is_cluster());
        Ok(DurableResults {
            con,
            keys,
            name: name.to_owned(),
            settings,
        })
    }

    /// The keys of the result route and its claims.
    pub fn keys(&self) -> &ResultClaimKeys {
        &self.keys
    }

    /// The lease and reclaim settings.
    pub fn settings(&self) -> &DurableSettings {
        &self.settings
    }

    /// The consumer's name (its owner token's prefix).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One receive: puts back expired claims, then claims the oldest result (see
    /// `resultReceive-5.lua`).
    pub async fn receive_once(&mut self) -> Result<Poll, DurableResultError> {
        let owner = if self.name.is_empty() {
            fresh_token()
        } else {
            format!("{}/{}", self.name, fresh_token())
        };
        let k = &self.keys;
        let script = &SCRIPTS.result_receive;
        let cmd = script.cmd(
            &[&k.route, &k.claimed, &k.owners, &k.idx, &k.tombstones],
            &[
                owner.clone(),
                ms(self.settings.lease).to_string(),
                BATCH.to_string(),
                BATCH.to_string(),
                BATCH.to_string(),
            ],
        );
        let answer = script
            .run(&mut self.con, &cmd)
            .await
            .map_err(DurableResultError::of)?;
        let unexpected = |answer: &Value| DurableResultError::Unexpected {
            script: script.name,
            answer: format!("{answer:?}"),
        };
        let Value::Array(items) = &answer else {
            return Err(unexpected(&answer));
        };
        match items.as_slice() {
            [] => Ok(Poll::Empty),
            [Value::Int(0)] => Ok(Poll::Skipped),
            [Value::Int(status @ (1 | -1)), Value::BulkString(raw), Value::BulkString(claim)] => {
                let received = if *status == 1 {
                    match serde_json::from_slice::<ResultMessage>(raw) {
                        Ok(r) => Received::Result(r),
                        Err(e) => Received::Unreadable(e.to_string()),
                    }
                } else {
                    Received::Unparsable(why_unparsable(raw))
                };
                Ok(Poll::Got(Delivery {
                    raw: raw.clone(),
                    received,
                    claim_id: claim.clone(),
                    owner,
                }))
            }
            _ => Err(unexpected(&answer)),
        }
    }

    /// The next claimed entry, asking an empty route again every reclaim interval, or `None`
    /// once `wait` passed without one.
    pub async fn receive(
        &mut self,
        wait: Duration,
    ) -> Result<Option<Delivery>, DurableResultError> {
        let started = tokio::time::Instant::now();
        loop {
            match self.receive_once().await? {
                Poll::Got(d) => return Ok(Some(d)),
                Poll::Skipped => continue,
                Poll::Empty => {}
            }
            let left = wait.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok(None);
            }
            tokio::time::sleep(left.min(self.settings.reclaim_interval)).await;
        }
    }

    /// Extends `d`'s lease by the lease from now; [`DurableResultError::OwnershipLost`] once it
    /// is no longer `d`'s owner's or its lease ran out.
    pub async fn renew(&mut self, d: &Delivery) -> Result<(), DurableResultError> {
        let k = &self.keys;
        let script = &SCRIPTS.result_renew;
        let lease = ms(self.settings.lease).to_string();
        let cmd = script.cmd(
            &[&k.owners, &k.idx],
            &[d.claim_id.as_slice(), d.owner.as_bytes(), lease.as_bytes()],
        );
        match script
            .run(&mut self.con, &cmd)
            .await
            .map_err(DurableResultError::of)?
        {
            Value::Int(1) => Ok(()),
            Value::Int(0) => Err(DurableResultError::OwnershipLost),
            other => Err(DurableResultError::Unexpected {
                script: script.name,
                answer: format!("{other:?}"),
            }),
        }
    }

    /// `d` is stored: drops its claim and writes its tombstone. A repeated ack answers
    /// [`Acked::Before`]; [`DurableResultError::OwnershipLost`] once its lease ran out or
    /// another owner holds it.
    pub async fn ack(&mut self, d: &Delivery) -> Result<Acked, DurableResultError> {
        let k = &self.keys;
        let script = &SCRIPTS.result_ack;
        let ttl = ms(self.settings.tombstone_ttl).to_string();
        let batch = BATCH.to_string();
        let cmd = script.cmd(
            &[&k.claimed, &k.owners, &k.idx, &k.tombstones],
            &[
                d.claim_id.as_slice(),
                d.owner.as_bytes(),
                ttl.as_bytes(),
                batch.as_bytes(),
            ],
        );
        match script
            .run(&mut self.con, &cmd)
            .await
            .map_err(DurableResultError::of)?
        {
            Value::Int(1) => Ok(Acked::Now),
            Value::Int(2) => Ok(Acked::Before),
            Value::Int(0) => Err(DurableResultError::OwnershipLost),
            other => Err(DurableResultError::Unexpected {
                script: script.name,
                answer: format!("{other:?}"),
            }),
        }
    }
}

/// Why the receive script found `raw` to be no result, in words.
fn why_unparsable(raw: &[u8]) -> String {
    let value = match serde_json::from_slice::<serde_json::Value>(raw) {
        Ok(v) => v,
        Err(e) => return format!("not JSON ({e})"),
    };
    let Some(object) = value.as_object() else {
        return "not a JSON object".to_owned();
    };
    match object.get("id") {
        Some(serde_json::Value::String(id)) if !id.is_empty() => {}
        Some(serde_json::Value::String(_)) => return "its \"id\" is empty".to_owned(),
        Some(_) => return "its \"id\" is not a string".to_owned(),
        None => return "it has no \"id\"".to_owned(),
    }
    match object.get("request_token") {
        Some(serde_json::Value::String(_)) | None => "Redis's JSON decoder refused it".to_owned(),
        Some(_) => "its \"request_token\" is not a string".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_gos_and_tagged_on_a_cluster() {
        let k = ResultClaimKeys::new("results", false);
        assert_eq!(k.claimed, "results:result-claimed");
        assert_eq!(k.owners, "results:result-claim-owners");
        assert_eq!(k.idx, "results:result-claims-idx");
        assert_eq!(k.tombstones, "results:result-ack-tombstones");
        let c = ResultClaimKeys::new("results", true);
        assert_eq!(c.route, "results");
        assert_eq!(c.claimed, "{results}:result-claimed");
        assert_eq!(c.tombstones, "{results}:result-ack-tombstones");
        let t = ResultClaimKeys::new("{pool-a}:results", true);
        assert_eq!(t.owners, "{pool-a}:results:result-claim-owners");
    }

    #[test]
    fn reasons_name_what_is_wrong() {
        assert!(why_unparsable(b"nope").starts_with("not JSON"));
        assert_eq!(why_unparsable(b"[1]"), "not a JSON object");
        assert_eq!(why_unparsable(br#"{"id":5}"#), "its \"id\" is not a string");
        assert_eq!(why_unparsable(br#"{"x":1}"#), "it has no \"id\"");
        assert_eq!(
            why_unparsable(br#"{"id":"a","request_token":7}"#),
            "its \"request_token\" is not a string"
        );
    }
}
