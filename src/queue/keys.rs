//! Redis key names for one queue and claim keys for one request generation.
//!
//! The pending key is the queue name itself (what the Go producer ZADDs into). The claim
//! bookkeeping uses the names the Go durable-claims version uses, so Go and inferq instances can
//! share a queue; inferq's extra keys are ones Go ignores. Every derived key starts with the
//! queue name, so a `{hash tag}` in it keeps all of a queue's keys in one Redis Cluster slot.

/// All keys a queue's scripts touch (result lists are per message and passed separately).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueKeys {
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
}

impl QueueKeys {
    pub fn new(queue: &str) -> QueueKeys {
        let derived = |suffix: &str| format!("{queue}:{suffix}");
        QueueKeys {
            pending: queue.to_owned(),
            claimed: derived("claimed"),
            owners: derived("claim-owners"),
            idx: derived("claims-idx"),
            scores: derived("claim-scores"),
            deliveries: derived("deliveries"),
            deliveries_idx: derived("deliveries-idx"),
            parked: derived("parked"),
            dead: derived("dead"),
        }
    }

    /// The marker of a message admitted from pub/sub (see `admit-1.lua`), keyed by the digest
    /// of its bytes: `<queue>:seen:<sha1>`.
    pub fn seen(&self, message: &[u8]) -> String {
        let digest = sha1_smol::Sha1::from(message).digest().to_string();
        format!("{}:seen:{digest}", self.pending)
    }

    /// Every key, for slot checks and ACL rules.
    pub fn all(&self) -> [&str; 9] {
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
        ]
    }
}

/// The pub/sub channel rung when work is added to `queue` (inferq only; it starts with the
/// queue name, so a `{hash tag}` in the name is kept).
pub fn doorbell_channel(queue: &str) -> String {
    format!("{queue}:doorbell")
}

/// The producer's cancellation keys for a request id (Go names).
pub fn active_key(id: &str) -> String {
    format!("request-active:{id}")
}

/// See [`active_key`].
pub fn cancel_key(id: &str) -> String {
    format!("request-cancel:{id}")
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
