//! Dead-letter records: what inferq writes to `<queue>:dead` when it sets a member aside
//! (undecodable, over the delivery limit, poison), so an operator can see why and act on it.

use serde::{Deserialize, Serialize};

use crate::wire::{Envelope, Routing};

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
    /// The member exactly as it was stored (lossless for the JSON members producers write).
    pub member: String,
}

impl DeadRecord {
    pub fn new(queue: &str, reason: &str, member: &[u8]) -> DeadRecord {
        DeadRecord {
            id: String::new(),
            request_token: String::new(),
            queue: queue.to_owned(),
            reason: reason.to_owned(),
            deliveries: 0,
            at_ms: now_ms(),
            member: String::from_utf8_lossy(member).into_owned(),
        }
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
}
