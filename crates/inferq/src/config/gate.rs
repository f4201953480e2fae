//! Gate settings as written in the transport config (`queues[].gate_type/gate_params`) and the
//! pool file (`gate_type/gate_params`). Only the type name is checked here, against the Go gate
//! names; the parameters are kept as the JSON object the user wrote and interpreted by the gate
//! factory in `dispatch`.

use serde_json::{Map, Value};

use super::ConfigError;

/// The Go gate types (go-compat §6.2, and go-newer §6 for `redis-leased-rate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GateType {
    /// Always open.
    Constant,
    /// Budget read from a Redis key.
    Redis,
    /// Per-attribute rate limit or concurrency quota in Redis.
    RedisQuota,
    /// A pool-wide admission rate leased by a controller through a Redis hash.
    RedisLeasedRate,
    /// In-process concurrency limit.
    LocalMaxConcurrency,
    /// All inner gates must admit.
    Composite,
    /// Inner gate's refusals become waits.
    WaitOnRefuse,
    /// Saturation-driven admission by tier and classification.
    TierPriorityAdmission,
    /// Budget from the pool saturation metric.
    PrometheusSaturation,
    /// Budget from a cascade of queue-size metrics.
    PrometheusBudget,
    /// Budget from an arbitrary PromQL query.
    PrometheusQuery,
    /// Budget from a scraped metrics endpoint.
    EndpointScrape,
    /// Go's proposed feedback gate: a congestion window per band, driven by the router's
    /// rejections.
    Aimd,
    /// inferq's own feedback gate: fills the pool's spare capacity from delay, a standing queue
    /// and rejections, with no threshold to tune.
    Slack,
}

impl GateType {
    /// Every gate type with its Go name.
    pub const ALL: [(&'static str, GateType); 14] = [
        ("constant", GateType::Constant),
        ("redis", GateType::Redis),
        ("redis-quota", GateType::RedisQuota),
        ("redis-leased-rate", GateType::RedisLeasedRate),
        ("local-max-concurrency", GateType::LocalMaxConcurrency),
        ("composite", GateType::Composite),
        ("wait-on-refuse", GateType::WaitOnRefuse),
        ("tier-priority-admission", GateType::TierPriorityAdmission),
        ("prometheus-saturation", GateType::PrometheusSaturation),
        ("prometheus-budget", GateType::PrometheusBudget),
        ("prometheus-query", GateType::PrometheusQuery),
        ("endpoint-scrape", GateType::EndpointScrape),
        ("aimd", GateType::Aimd),
        ("slack", GateType::Slack),
    ];

    /// The Go name, as written in config files.
    pub fn as_str(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, t)| *t == self)
            .map_or("", |(name, _)| name)
    }

    /// Looks a Go name up.
    pub fn from_name(name: &str) -> Option<GateType> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|&(_, t)| t)
    }

    /// The parameters this gate type reads (go-compat §6.2). Go ignores any other; inferq refuses
    /// it, so a misspelt optional parameter cannot silently fall back to its default.
    pub fn params(self) -> &'static [&'static str] {
        match self {
            GateType::Constant => &[],
            GateType::Redis => &["address", "budget_key"],
            GateType::RedisQuota => &[
                "address",
                "attribute",
                "mode",
                "limit",
                "window",
                "prefix",
                "gating_mode",
            ],
            GateType::RedisLeasedRate => &[
                "address",
                "control_key",
                "pool_id",
                "state_key",
                "burst_seconds",
            ],
            GateType::LocalMaxConcurrency => &["limit", "gating_mode"],
            GateType::Composite => &["gates"],
            GateType::WaitOnRefuse => &["gate"],
            GateType::TierPriorityAdmission => {
                &["saturation_gate", "saturation_gate_params", "tier_label"]
            }
            GateType::PrometheusSaturation => &["pool", "namespace", "threshold", "fallback"],
            GateType::PrometheusBudget => &[
                "pool",
                "namespace",
                "max_concurrency",
                "baseline",
                "fallback",
            ],
            GateType::PrometheusQuery => &["query", "fallback", "pool"],
            GateType::EndpointScrape => &[
                "url",
                "metric",
                "labels",
                "max_count_per_pod",
                "baseline",
                "fallback",
                "pods_url",
                "pods_metric",
                "pods_labels",
                "value_type",
                "absent_value",
                "admission",
            ],
            GateType::Aimd => &[
                "min_window",
                "max_window",
                "increase",
                "decrease_factor",
                "hold_duration",
                "tier_label",
                "queue_duration_target",
            ],
            GateType::Slack => &[
                "min_window",
                "max_window",
                "signal_url",
                "signal_metric",
                "signal_labels",
                "signal_target",
                "running_metric",
                "interval",
                "headroom",
                "memory",
                "latency_tolerance",
                "increase",
                "decrease_factor",
                "preempt",
            ],
        }
    }

    /// Whether creating this gate needs `--prometheus-url`.
    pub fn needs_prometheus(self) -> bool {
        matches!(
            self,
            GateType::PrometheusSaturation | GateType::PrometheusBudget | GateType::PrometheusQuery
        )
    }
}

/// A gate as configured: its type and its parameters, still as JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct GateSpec {
    /// Which gate.
    pub kind: GateType,
    /// The `gate_params` object (empty when absent or null); interpreted by the gate factory.
    pub params: Map<String, Value>,
}

/// Turns a `gate_type`/`gate_params` pair into a gate, or none for an empty type.
///
/// `type_field` and `params_field` are how errors name the two settings: JSON paths
/// (`queues[0].gate_type`) or legacy flags (`--redis.ss.gate-type`). Parameters without a type
/// are ignored with a warning, as Go ignores them.
pub(crate) fn parse_gate(
    gate_type: Option<&str>,
    gate_params: Option<&Value>,
    type_field: &str,
    params_field: &str,
    warnings: &mut Vec<String>,
) -> Result<Option<GateSpec>, ConfigError> {
    let params = match gate_params {
        None | Some(Value::Null) => Map::new(),
        Some(Value::Object(map)) => map.clone(),
        Some(other) => {
            return Err(ConfigError::invalid(
                params_field,
                format!("must be a JSON object, got {}", json_kind(other)),
            ))
        }
    };
    let name = gate_type.unwrap_or("");
    if name.is_empty() {
        if !params.is_empty() {
            warnings.push(format!(
                "{params_field} is set but {type_field} is empty; the parameters are ignored"
            ));
        }
        return Ok(None);
    }
    let kind = GateType::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = GateType::ALL.iter().map(|(n, _)| *n).collect();
        ConfigError::invalid(
            type_field,
            format!("unknown gate type {name:?} (known: {})", known.join(", ")),
        )
    })?;
    Ok(Some(GateSpec { kind, params }))
}

/// A word for the JSON type of a value, for error messages.
pub(crate) fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_round_trip() {
        for (name, kind) in GateType::ALL {
            assert_eq!(kind.as_str(), name);
            assert_eq!(GateType::from_name(name), Some(kind));
        }
        assert_eq!(GateType::from_name("Redis"), None);
    }

    #[test]
    fn parse_gate_rules() {
        let mut warnings = Vec::new();
        let params = json!({"address": "redis:6379"});
        let gate = parse_gate(Some("redis"), Some(&params), "t", "p", &mut warnings);
        assert!(matches!(
            gate,
            Ok(Some(GateSpec {
                kind: GateType::Redis,
                ..
            }))
        ));
        assert!(matches!(
            parse_gate(None, None, "t", "p", &mut warnings),
            Ok(None)
        ));
        assert!(matches!(
            parse_gate(Some(""), Some(&Value::Null), "t", "p", &mut warnings),
            Ok(None)
        ));
        assert!(warnings.is_empty());

        assert!(matches!(
            parse_gate(Some(""), Some(&params), "t", "p", &mut warnings),
            Ok(None)
        ));
        assert_eq!(warnings.len(), 1);

        let err = parse_gate(
            Some("redis-qouta"),
            None,
            "queues[0].gate_type",
            "p",
            &mut warnings,
        );
        let text = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert!(
            text.starts_with(
                "invalid config: queues[0].gate_type: unknown gate type \"redis-qouta\""
            ),
            "{text}"
        );
        let err = parse_gate(
            Some("redis"),
            Some(&json!("x")),
            "t",
            "queues[0].gate_params",
            &mut warnings,
        );
        let text = err.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            text,
            "invalid config: queues[0].gate_params: must be a JSON object, got a string"
        );
    }
}
