//! Dead-letter records: what inferq writes to `<queue>:dead` when it sets a member aside
//! (undecodable, over the delivery limit, poison), so an operator can see why and act on it.

use serde::{Deserialize, Serialize};

use inferq_client::wire::{Envelope, Routing, MAX_MEMBER_BYTES};

/// One dead-letter record (JSON, newest first in the list).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadRecord {
    /// The request id, when one could be read.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_token: String,
    /// The queue it was taken from.
    pub queue: String,
    /// Why it was set aside.
    pub reason: String,
    /// Lease expiries it went through (0 for members that never decoded).
    #[serde(default)]
    pub deliveries: u32,
    /// When, in Unix milliseconds (this processor's clock; informational).
    pub at_ms: u64,
    /// The member as it was stored: byte for byte when it is UTF-8 and within the size limit.
    /// A member over [`MAX_MEMBER_BYTES`] keeps only its first [`KEPT_PREFIX_BYTES`] (see
    /// `member_truncated`); one that is not UTF-8 keeps a lossy copy (see `member_lossy`).
    pub member: String,
    /// The stored member's size in bytes (0 in records written before this field existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub member_bytes: usize,
    /// `member` is only the start of an oversized member, which could never be served: keeping
    /// all of it again in Redis would only cost memory. `member_sha1` identifies it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub member_truncated: bool,
    /// The member was not valid UTF-8: `member` has U+FFFD where its bad bytes were.
    #[serde(default, skip_serializing_if = "is_false")]
    pub member_lossy: bool,
    /// SHA-1 of the stored member's bytes, when `member` is not an exact copy.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub member_sha1: String,
    /// The result the request got but that could not be published (its JSON, as it would have
    /// been pushed), so the work done is not lost with it. Empty for requests set aside unserved.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub result: String,
}

/// How much of an oversized member a dead record keeps.
pub const KEPT_PREFIX_BYTES: usize = 4096;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl DeadRecord {
    pub fn new(queue: &str, reason: &str, member: &[u8]) -> DeadRecord {
        let truncated = member.len() > MAX_MEMBER_BYTES;
        let kept = if truncated {
            &member[..KEPT_PREFIX_BYTES]
        } else {
            member
        };
        let (text, lossy) = match std::str::from_utf8(kept) {
            Ok(text) => (text.to_owned(), false),
            // A prefix cut inside a character is not a lossy member: drop the partial character.
            Err(e) if truncated && e.error_len().is_none() => (
                String::from_utf8_lossy(&kept[..e.valid_up_to()]).into_owned(),
                false,
            ),
            Err(_) => (String::from_utf8_lossy(kept).into_owned(), true),
        };
        let member_sha1 = if truncated || lossy {
            sha1_smol::Sha1::from(member).digest().to_string()
        } else {
            String::new()
        };
        DeadRecord {
            id: String::new(),
            request_token: String::new(),
            queue: queue.to_owned(),
            reason: reason.to_owned(),
            deliveries: 0,
            at_ms: now_ms(),
            member: text,
            member_bytes: member.len(),
            member_truncated: truncated,
            member_lossy: lossy,
            member_sha1,
            result: String::new(),
        }
    }

    /// The member's exact bytes, when the record holds them (not cut short, not lossy).
    pub fn exact_member(&self) -> Option<&[u8]> {
        (!self.member_truncated && !self.member_lossy).then_some(self.member.as_bytes())
    }

    /// A record for `member` that names its generation where it can be read: from `known` (an
    /// envelope the caller already decoded), else salvaged from the bytes. The routing comes back
    /// with it when an id was found, so the caller can also publish a result.
    pub fn about(
        queue: &str,
        reason: &str,
        member: &[u8],
        known: Option<&Envelope>,
    ) -> (DeadRecord, Option<(String, Routing)>) {
        let mut record = DeadRecord::new(queue, reason, member);
        let who = match known {
            Some(env) => Some((env.request.id.clone(), env.internal.clone())),
            None => Envelope::salvage_id(member),
        };
        if let Some((id, routing)) = &who {
            record.id = id.clone();
            record.request_token = routing.request_token.clone();
        }
        (record, who)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(0))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_generation_when_it_can() {
        let good = br#"{"internal":{"request_token":"t1"},"request_kind":"plain","data":{"id":"a","deadline":9}}"#;
        let env = Envelope::decode(good).unwrap();
        let (record, who) = DeadRecord::about("q", "poison", good, Some(&env));
        assert_eq!(
            (record.id.as_str(), record.request_token.as_str()),
            ("a", "t1")
        );
        assert_eq!(who.map(|(id, _)| id).as_deref(), Some("a"));
        // Undecodable, but the id can still be read: salvaged.
        let partial =
            br#"{"internal":{"request_token":"t2"},"request_kind":"plain","data":{"id":"b"}}"#;
        let (record, who) = DeadRecord::about("q", "no deadline", partial, None);
        assert_eq!(
            (record.id.as_str(), record.request_token.as_str()),
            ("b", "t2")
        );
        assert!(who.is_some());
        // Nothing readable: the record keeps the bytes and the reason, and names nobody.
        let (record, who) = DeadRecord::about("q", "not JSON", b"garbage", None);
        assert!(record.id.is_empty() && who.is_none());
        assert_eq!(
            (record.member.as_str(), record.reason.as_str()),
            ("garbage", "not JSON")
        );
    }

    #[test]
    fn oversized_and_non_utf8_members_are_marked_not_exact() {
        let mut big = "é".repeat(MAX_MEMBER_BYTES / 2).into_bytes();
        big.extend_from_slice(b"xx");
        let record = DeadRecord::new("q", "too large", &big);
        assert!(record.member_truncated && !record.member_lossy);
        assert!(record.member.len() <= KEPT_PREFIX_BYTES && record.member.starts_with("éé"));
        assert_eq!(record.member_bytes, big.len());
        assert_eq!(record.member_sha1.len(), 40);
        assert!(record.exact_member().is_none());
        let record = DeadRecord::new("q", "not JSON", b"{\"a\":\"\xff\"}");
        assert!(record.member_lossy && record.exact_member().is_none());
        let record = DeadRecord::new("q", "not JSON", b"plain");
        assert_eq!(record.exact_member(), Some(&b"plain"[..]));
        let back: DeadRecord = serde_json::from_str(&record.to_json()).unwrap();
        assert_eq!(back, record);
    }
}
