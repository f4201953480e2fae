//! Redis key names for one queue and claim keys for one request generation.
//!
//! The pending key is the queue name itself (what the Go producer ZADDs into). The claim
//! bookkeeping uses the names the Go durable-claims version uses, so Go and inferq instances can
//! share a queue; inferq's extra keys are ones Go ignores. Every derived key starts with the
//! queue name, so a `{hash tag}` in it keeps all of a queue's keys in one Redis Cluster slot.
//!
//! On a Redis Cluster every private key of a queue is named by Go's `slotKey` rule
//! ([`slot_key`]): `{<queue>}:claimed` and so on, inferq's own bookkeeping too, so each move of a
//! queue stays one script in one slot. The pending set, result lists, `retry-sortedset` and the
//! producer's `request-active:`/`request-cancel:` markers keep their plain names everywhere;
//! standalone and Sentinel keep today's names for everything.

/// All keys a queue's scripts touch (result lists are per message and passed separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
    /// What every private key starts with: the queue name, hash-tagged on a cluster.
    pub prefix: String,
    /// zset member -> deadline: requests waiting to be claimed.
    pub pending: String,
    /// hash claim key -> member (Go: `<queue>:claimed`).
    pub claimed: String,
    /// hash claim key -> owner token (Go: `<queue>:claim-owners`).
    pub owners: String,
    /// zset claim key -> lease expiry in Unix seconds (Go: `<queue>:claims-idx`).
    pub idx: String,
    /// hash claim key -> original pending score, for release and reclaim (inferq).
    pub scores: String,
    /// hash claim key -> lease expiries so far (inferq).
    pub deliveries: String,
    /// zset claim key -> the generation's deadline, Unix seconds: one entry per field of
    /// `deliveries`, so a count is dropped once its deadline has passed even when the generation
    /// left pending without a finish (a producer's own `ZREM`) (inferq).
    pub deliveries_idx: String,
    /// zset member -> due time: retries waiting out their backoff (inferq).
    pub parked: String,
    /// list of dead-letter records, newest first (inferq).
    pub dead: String,
    /// hash claim key -> result staged for a result list in another cluster slot, between the
    /// finish that dropped its claim and the push (inferq; see `finish-11.lua`).
    pub finishing: String,
    /// zset claim key -> when its result was staged, Unix ms, for upkeep to settle the ones a
    /// finisher left (inferq).
    pub finishing_idx: String,
}

/// Go's `slotKey`: `{k}`, unless `k` already holds a non-empty `{…}` hash tag, then `k` as it
/// is. `{k}` hashes like `k` itself, so a queue's tagged keys share the slot of its plain
/// pending set.
pub fn slot_key(k: &str) -> String {
    if let Some(open) = k.find('{') {
        if let Some(close) = k[open + 1..].find('}') {
            if close > 0 {
                return k.to_owned();
            }
        }
    }
    format!("{{{k}}}")
}

impl QueueKeys {
    /// The keys of `queue` on a standalone or Sentinel-managed Redis.
    pub fn new(queue: &str) -> QueueKeys {
        QueueKeys::named(queue, queue)
    }

    /// The keys of `queue` on a Redis Cluster: every private key hash-tagged by [`slot_key`].
    pub fn clustered(queue: &str) -> QueueKeys {
        QueueKeys::named(queue, &slot_key(queue))
    }

    /// The keys of `queue`, for a cluster or not.
    pub fn for_layout(queue: &str, cluster: bool) -> QueueKeys {
        if cluster {
            QueueKeys::clustered(queue)
        } else {
            QueueKeys::new(queue)
        }
    }

    /// `queue`'s keys whose private ones start with `prefix`.
    fn named(queue: &str, prefix: &str) -> QueueKeys {
        let derived = |suffix: &str| format!("{prefix}:{suffix}");
        QueueKeys {
            prefix: prefix.to_owned(),
            pending: queue.to_owned(),
            claimed: derived("claimed"),
            owners: derived("claim-owners"),
            idx: derived("claims-idx"),
            scores: derived("claim-scores"),
            deliveries: derived("deliveries"),
            deliveries_idx: derived("deliveries-idx"),
            parked: derived("parked"),
            dead: derived("dead"),
            finishing: derived("finishing"),
            finishing_idx: derived("finishing-idx"),
        }
    }

    /// The marker of a message admitted from pub/sub (see `admit-1.lua`), keyed by the digest
    /// of its bytes: `<queue>:seen:<sha1>`.
    pub fn seen(&self, message: &[u8]) -> String {
        let digest = sha1_smol::Sha1::from(message).digest().to_string();
        format!("{}:seen:{digest}", self.prefix)
    }

    /// Every key, for slot checks and ACL rules.
    pub fn all(&self) -> [&str; 11] {
        [
            &self.pending,
            &self.claimed,
            &self.owners,
            &self.idx,
            &self.scores,
            &self.deliveries,
            &self.deliveries_idx,
            &self.parked,
            &self.dead,
            &self.finishing,
            &self.finishing_idx,
        ]
    }
}

/// The pub/sub channel rung when work is added to `queue` (inferq only; it starts with the
/// queue name, so a `{hash tag}` in the name is kept). A channel is no key: the name is the same
/// on a cluster, whose every node hears every `PUBLISH`.
pub fn doorbell_channel(queue: &str) -> String {
    format!("{queue}:doorbell")
}

/// The markers of the results `queue` pushed to `list` by the cross-slot finish
/// (`deliverOnce-2.lua`): `{<list>}:delivered:<queue>`, in the list's slot. One set per queue, because each queue trims its own markers no earlier
/// than its own oldest staged result (see `deliverOnce-2.lua`).
pub fn delivered_key(list: &str, queue: &str) -> String {
    format!("{}:delivered:{queue}", slot_key(list))
}

/// The producer's cancellation keys for a request id (Go names).
pub fn active_key(id: &str) -> String {
    format!("request-active:{id}")
}

/// See [`active_key`].
pub fn cancel_key(id: &str) -> String {
    format!("request-cancel:{id}")
}

/// Where newer Go's producer stores a generation's body apart from its member (payload keys):
/// `request-payload:<id>:<request_token>`, a plain name on a cluster too.
pub fn payload_key(id: &str, request_token: &str) -> String {
    format!("request-payload:{id}:{request_token}")
}

/// Newer Go's FIFO counter of a queue and deadline: `request-seq:<queue>:<deadline>`, with the
/// queue's name as hash tag on a cluster (`request-seq:{<queue>}:<deadline>`), so it lives in
/// the queue's slot and the enqueue script can take its next number.
pub fn seq_key(queue: &str, deadline: i64, cluster: bool) -> String {
    if cluster {
        format!("request-seq:{}:{deadline}", slot_key(queue))
    } else {
        format!("request-seq:{queue}:{deadline}")
    }
}

/// The claim key of a generation: `id NUL request_token`, as Go durable-claims writes it, so two
/// generations of a re-used id never share a claim. A hand-written member without a token is
/// keyed by a digest of its bytes instead, so two such members with one id stay distinct too.
pub fn claim_key(id: &str, request_token: &str, member: &[u8]) -> String {
    if request_token.is_empty() {
        let digest = sha1_smol::Sha1::from(member).digest().to_string();
        format!("{id}\0sha1:{digest}")
    } else {
        format!("{id}\0{request_token}")
    }
}

/// A fresh random token (32 lowercase hex characters, as the Go producer mints).
pub fn fresh_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// How long a payload key outlives its request's active marker (Go: ten minutes), so a body
/// is still there for a request claimed at its deadline.
pub const PAYLOAD_GRACE_MS: i64 = 600_000;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_keys_keep_the_hash_tag_and_go_names() {
        let k = QueueKeys::new("{tenant-a}jobs");
        assert_eq!(k.claimed, "{tenant-a}jobs:claimed");
        assert_eq!(k.owners, "{tenant-a}jobs:claim-owners");
        assert_eq!(k.idx, "{tenant-a}jobs:claims-idx");
        assert!(k.all().iter().all(|key| key.starts_with("{tenant-a}")));
    }

    #[test]
    fn cluster_keys_follow_gos_slot_key() {
        assert_eq!(slot_key("q"), "{q}");
        assert_eq!(slot_key("{pool-a}:results"), "{pool-a}:results");
        assert_eq!(slot_key("a{b"), "{a{b}");
        assert_eq!(slot_key("a{}b"), "{a{}b}");
        let k = QueueKeys::clustered("request-sortedset");
        assert_eq!(k.pending, "request-sortedset");
        assert_eq!(k.claimed, "{request-sortedset}:claimed");
        assert_eq!(k.owners, "{request-sortedset}:claim-owners");
        assert_eq!(k.idx, "{request-sortedset}:claims-idx");
        assert_eq!(k.dead, "{request-sortedset}:dead");
        assert_eq!(k.parked, "{request-sortedset}:parked");
        let slot = crate::slot::hash_slot("request-sortedset");
        assert!(k
            .all()
            .iter()
            .all(|key| crate::slot::hash_slot(key) == slot));
        assert_eq!(crate::slot::hash_slot(&k.seen(b"m")), slot);
        // Standalone and Sentinel keep today's names.
        assert_eq!(QueueKeys::new("q").claimed, "q:claimed");
        // A name with its own tag is the same either way.
        assert_eq!(QueueKeys::clustered("{t}q"), QueueKeys::new("{t}q"));
    }

    #[test]
    fn claim_keys_separate_generations() {
        assert_eq!(claim_key("a", "t1", b"m"), "a\0t1");
        assert_ne!(claim_key("a", "t1", b"m"), claim_key("a", "t2", b"m"));
        assert_ne!(claim_key("a", "", b"m1"), claim_key("a", "", b"m2"));
        let t = fresh_token();
        assert_eq!(t.len(), 32);
        assert!(t
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(t, fresh_token());
    }
}
