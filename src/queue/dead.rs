//! Dead-letter records: what inferq writes to `<queue>:dead` when it sets a member aside
//! (undecodable, over the delivery limit, poison), so an operator can see why and act on it.

use serde::{Deserialize, Serialize};

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
