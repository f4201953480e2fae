//! The `fair-share` merge policy's parameters (`{"type": "fair-share", "parameters": {...}}` in
//! the `--request-merge-policy-config-file`): the tenants' weights, and where queues beyond the
//! listed ones are found (a name prefix, the index of queues with work, a periodic `SCAN`).
//! In: the policy's `parameters` object. Out: a [`FairShare`]; errors name
//! `merge_policy.parameters.<field>`.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use super::json::decode_value;
use super::ConfigError;

/// The index of queues with work the Batch API writes (zset queue name -> last time work was
/// added, Unix ms), when the policy names no other.
pub const DEFAULT_INDEX_KEY: &str = "inferq-tenants:index";
/// The hash of tenant -> weight the Batch API writes from its keys file, when the policy names
/// no other.
pub const DEFAULT_WEIGHTS_KEY: &str = "inferq-tenants:weights";

/// Requests of one tenant served in a row when the policy names no other.
pub const DEFAULT_BURST: usize = 32;

/// The `fair-share` parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct FairShare {
    /// Tenant -> weight (a tenant's share of the pool is its weight over the sum of the
    /// weights of the tenants with work); tenants not named weigh `default_weight`.
    pub weights: BTreeMap<String, f64>,
    pub default_weight: f64,
    /// Redis hash of tenant -> weight read every discovery pass; its entries win over
    /// `weights` (the Batch API keeps it in step with its keys file). Empty: not read.
    pub weights_key: String,
    /// Queues whose names start with it are served as they are found, each as its tenant's
    /// (the rest of the name, without `{}`); empty: only the listed queues.
    pub queue_prefix: String,
    /// The zset of queues with work (queue name -> Unix ms work was last added), read every
    /// `discover_interval`.
    pub index_key: String,
    /// The id of the listed queue whose settings (pool, gateway, gate, result list) the
    /// queues found take; empty: the first listed queue.
    pub template_queue: String,
    pub discover_interval: Duration,
    /// How often the prefix is also looked for with `SCAN` (queues of producers that do not
    /// write the index, such as Go's); `None`: never.
    pub scan_interval: Option<Duration>,
    /// How long an index entry may go without new work before a processor that finds its
    /// queue empty (nothing pending, claimed or parked) removes it.
    pub idle_after: Duration,
    /// Most requests one tenant may have in this processor's workers at once (`None`: no cap).
    pub max_in_flight_per_tenant: Option<usize>,
    /// Most requests of one tenant served in a row, so they are claimed and acked together.
    pub burst: usize,
}

impl Default for FairShare {
    fn default() -> Self {
        FairShare {
            weights: BTreeMap::new(),
            default_weight: 1.0,
            weights_key: DEFAULT_WEIGHTS_KEY.to_owned(),
            queue_prefix: String::new(),
            index_key: DEFAULT_INDEX_KEY.to_owned(),
            template_queue: String::new(),
            discover_interval: Duration::from_secs(1),
            scan_interval: None,
            idle_after: Duration::from_secs(10),
            max_in_flight_per_tenant: None,
            burst: DEFAULT_BURST,
        }
    }
}

impl FairShare {
    /// The tenant a queue is served as: the name after `queue_prefix` without `{}` when it
    /// starts with the prefix, else the queue's id.
    pub fn tenant_of<'a>(&self, queue_name: &'a str, queue_id: &'a str) -> &'a str {
        match queue_name.strip_prefix(self.queue_prefix.as_str()) {
            Some(rest) if !self.queue_prefix.is_empty() && !rest.is_empty() => {
                rest.trim_start_matches('{').trim_end_matches('}')
            }
            _ => queue_id,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFairShare {
    pub fairness_header: Option<String>,
    pub fairness_attribute: Option<String>,
    weights: Option<BTreeMap<String, f64>>,
    default_weight: Option<f64>,
    weights_key: Option<String>,
    queue_prefix: Option<String>,
    index_key: Option<String>,
    template_queue: Option<String>,
    discover_interval_ms: Option<u64>,
    scan_interval_ms: Option<u64>,
    idle_after_ms: Option<u64>,
    max_in_flight_per_tenant: Option<u64>,
    burst: Option<u64>,
}

fn invalid(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::invalid(format!("merge_policy.parameters.{field}"), reason.into())
}

/// A weight: a finite number above 0 (and at most a million, so shares stay countable).
fn weight(field: &str, w: f64) -> Result<f64, ConfigError> {
    if w.is_finite() && w > 0.0 && w <= 1e6 {
        Ok(w)
    } else {
        Err(invalid(
            field,
            format!("must be a number above 0 and at most 1000000, got {w}"),
        ))
    }
}

/// Decodes and checks the parameters; the fairness fields are left to the caller.
pub(crate) fn parse(params: Value) -> Result<(FairShare, RawFairShare), ConfigError> {
    let mut raw: RawFairShare = decode_value(params, "merge_policy.parameters")?;
    let mut fs = FairShare::default();
    for (tenant, w) in raw.weights.take().unwrap_or_default() {
        if tenant.is_empty() {
            return Err(invalid("weights", "a tenant name is empty"));
        }
        let w = weight(&format!("weights.{tenant}"), w)?;
        fs.weights.insert(tenant, w);
    }
    if let Some(w) = raw.default_weight {
        fs.default_weight = weight("default_weight", w)?;
    }
    if let Some(k) = raw.weights_key.take() {
        fs.weights_key = k;
    }
    fs.queue_prefix = raw.queue_prefix.take().unwrap_or_default();
    if let Some(k) = raw.index_key.take().filter(|k| !k.is_empty()) {
        fs.index_key = k;
    }
    if !fs.queue_prefix.is_empty() && fs.index_key.starts_with(&fs.queue_prefix) {
        return Err(invalid(
            "index_key",
            format!(
                "{:?} starts with queue_prefix {:?}: the index would be taken for a queue",
                fs.index_key, fs.queue_prefix
            ),
        ));
    }
    fs.template_queue = raw.template_queue.take().unwrap_or_default();
    if let Some(ms) = raw.discover_interval_ms {
        if !(10..=60_000).contains(&ms) {
            return Err(invalid(
                "discover_interval_ms",
                format!("must be between 10 and 60000, got {ms}"),
            ));
        }
        fs.discover_interval = Duration::from_millis(ms);
    }
    fs.scan_interval = match raw.scan_interval_ms {
        None | Some(0) => None,
        Some(ms) if ms < 1000 => {
            return Err(invalid(
                "scan_interval_ms",
                format!("must be 0 (no scan) or at least 1000 (a SCAN reads every key), got {ms}"),
            ))
        }
        Some(ms) => Some(Duration::from_millis(ms)),
    };
    if fs.scan_interval.is_some() && fs.queue_prefix.is_empty() {
        return Err(invalid(
            "scan_interval_ms",
            "needs a queue_prefix to look for",
        ));
    }
    if let Some(ms) = raw.idle_after_ms {
        if ms < 1000 {
            return Err(invalid(
                "idle_after_ms",
                format!("must be at least 1000, got {ms}"),
            ));
        }
        fs.idle_after = Duration::from_millis(ms);
    }
    fs.max_in_flight_per_tenant = match raw.max_in_flight_per_tenant {
        None => None,
        Some(0) => return Err(invalid("max_in_flight_per_tenant", "must be at least 1")),
        Some(n) => Some(usize::try_from(n).unwrap_or(usize::MAX)),
    };
    fs.burst = match raw.burst {
        None => DEFAULT_BURST,
        Some(n @ 1..=10_000) => usize::try_from(n).unwrap_or(DEFAULT_BURST),
        Some(n) => {
            return Err(invalid(
                "burst",
                format!("must be between 1 and 10000, got {n}"),
            ))
        }
    };
    Ok((fs, raw))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn err(v: Value) -> String {
        match parse(v) {
            Ok((fs, _)) => format!("ok {fs:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_and_values() {
        let (fs, _) = parse(json!({})).unwrap();
        assert_eq!(fs, FairShare::default());
        let (fs, raw) = parse(json!({
            "weights": {"a": 2, "b": 0.5}, "default_weight": 3, "queue_prefix": "t:",
            "index_key": "idx", "template_queue": "batch", "discover_interval_ms": 200,
            "scan_interval_ms": 5000, "idle_after_ms": 2000, "max_in_flight_per_tenant": 8, "burst": 4,
            "fairness_header": ""
        }))
        .unwrap();
        assert_eq!(fs.weights["a"], 2.0);
        assert_eq!(fs.weights["b"], 0.5);
        assert_eq!(fs.default_weight, 3.0);
        assert_eq!(fs.index_key, "idx");
        assert_eq!(fs.discover_interval, Duration::from_millis(200));
        assert_eq!(fs.scan_interval, Some(Duration::from_secs(5)));
        assert_eq!(fs.max_in_flight_per_tenant, Some(8));
        assert_eq!(fs.burst, 4);
        assert_eq!(raw.fairness_header.as_deref(), Some(""));
    }

    #[test]
    fn tenants_of_queues() {
        let fs = FairShare {
            queue_prefix: "inferq-tenant:".into(),
            ..FairShare::default()
        };
        assert_eq!(fs.tenant_of("inferq-tenant:alice", "x"), "alice");
        assert_eq!(fs.tenant_of("inferq-tenant:{bob}", "x"), "bob");
        assert_eq!(fs.tenant_of("other", "other-id"), "other-id");
        assert_eq!(FairShare::default().tenant_of("q", "id"), "id");
    }

    #[test]
    fn bad_values_name_their_field() {
        assert_eq!(
            err(json!({"weights": {"a": 0}})),
            "invalid config: merge_policy.parameters.weights.a: must be a number above 0 and \
             at most 1000000, got 0"
        );
        assert!(err(json!({"default_weight": -1}))
            .starts_with("invalid config: merge_policy.parameters.default_weight:"));
        assert!(err(json!({"weights": {"a": "x"}}))
            .starts_with("invalid config: merge_policy.parameters.weights.a:"));
        assert!(err(json!({"scan_interval_ms": 5000}))
            .starts_with("invalid config: merge_policy.parameters.scan_interval_ms: needs"));
        assert!(err(json!({"queue_prefix": "t", "index_key": "t-index"}))
            .starts_with("invalid config: merge_policy.parameters.index_key:"));
        assert!(err(json!({"max_in_flight_per_tenant": 0}))
            .starts_with("invalid config: merge_policy.parameters.max_in_flight_per_tenant:"));
        assert!(
            err(json!({"burst": 0})).starts_with("invalid config: merge_policy.parameters.burst:")
        );
        assert!(err(json!({"discover_interval_ms": 1}))
            .starts_with("invalid config: merge_policy.parameters.discover_interval_ms:"));
        assert!(err(json!({"weight": {}}))
            .starts_with("invalid config: merge_policy.parameters.weight: unknown field"));
    }
}
