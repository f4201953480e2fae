//! The transport config exactly as written: every field optional, so that `resolve` can apply
//! Go's defaults and name the field of each problem. Decoded by `json::decode` (which reports
//! unknown fields with their path), and serialised again for a reload to compare with.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The transport config exactly as written; every field optional so defaults can apply.
#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSortedSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addrs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_tracing: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<RawQueue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_lease_ttl_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_reclaim_interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_wait: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_wait_timeout_ms: Option<i64>,
}

/// Where [`RawSortedSet`]'s JSON must hold objects (see `json::decode`): the root and each queue.
pub(crate) const RAW_SORTED_SET_OBJECTS: [&str; 2] = ["", "queues[]"];

/// One queue exactly as written.
#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_ttl_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_pool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference_objective: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_path_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub igw_base_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_params: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub allowed_result_lists: Option<Vec<String>>,
}
