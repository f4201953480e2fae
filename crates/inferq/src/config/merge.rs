//! The request merge policy (go-compat §7.1–7.4): the `--request-merge-policy-config-file` JSON
//! `{"type": ..., "parameters": {...}}`, or `random-robin` with default parameters without the
//! file: `random-robin`, `tier-priority` or `fair-share` (its parameters in [`super::fair_share`]).
//! Out comes a [`MergePolicy`]; errors name
//! `merge_policy.<path>`.

use serde::Deserialize;
use serde_json::Value;

use super::gate::json_kind;
use super::json::{decode, decode_value};
use super::ConfigError;

/// Header stamped with the fairness id when the policy does not name another.
pub const DEFAULT_FAIRNESS_HEADER: &str = "x-llm-d-inference-fairness-id";
/// Metadata key whose value becomes the fairness id by default.
pub const DEFAULT_FAIRNESS_ATTRIBUTE: &str = "userid";

/// Header stamped with a lane's InferenceObjective when the policy does not name another
/// (go-v011 §3, Go #443).
pub const DEFAULT_OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// Go's six lanes, in bucket order (bucket 0 most urgent): `lane_objectives`' keys.
pub const LANES: [&str; 6] = [
    "reserved-interactive",
    "reserved-async",
    "reserved-batch",
    "overflow-interactive",
    "overflow-async",
    "overflow-batch",
];
/// Queue label naming a queue's tier when the policy does not name another.
pub const DEFAULT_TIER_LABEL: &str = "tier";

/// Which policy merges a pool's queues into its workers.
#[derive(Debug, Clone, PartialEq)]
pub enum MergePolicyKind {
    /// Uniformly random among the queues that have a request ready.
    RandomRobin,
    /// Strictly by priority bucket, most urgent first (go-compat §7.4).
    TierPriority(TierPriority),
    /// Weighted fair share among tenants, deadline order within one (issue 34).
    FairShare(super::fair_share::FairShare),
}

/// The `tier-priority` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierPriority {
    /// The header the bucket (`"0"`, most urgent, to `"5"`) is stamped into; empty (Go's
    /// default since #443) stamps nothing.
    pub priority_header: String,
    /// The request label (copied from the queue's `labels`) that names its tier.
    pub tier_label: String,
    /// The header a lane's objective is stamped into.
    pub objective_header: String,
    /// Each lane's InferenceObjective, by bucket ([`LANES`] order); a lane without one is not
    /// stamped.
    pub lane_objectives: Box<[Option<String>; 6]>,
}

impl TierPriority {
    /// Go's defaults: no priority header, the objective header, no lane objectives.
    pub fn new(tier_label: &str) -> TierPriority {
        TierPriority {
            priority_header: String::new(),
            tier_label: tier_label.to_owned(),
            objective_header: DEFAULT_OBJECTIVE_HEADER.to_owned(),
            lane_objectives: Default::default(),
        }
    }
}

/// Fairness stamping: copy `metadata[attribute]` into the `header` request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fairness {
    /// The header to set; `None` when the policy disables stamping with `""`.
    pub header: Option<String>,
    /// The metadata key read.
    pub attribute: String,
}

impl Default for Fairness {
    fn default() -> Self {
        Self {
            header: Some(DEFAULT_FAIRNESS_HEADER.to_owned()),
            attribute: DEFAULT_FAIRNESS_ATTRIBUTE.to_owned(),
        }
    }
}

/// The merge policy and its parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct MergePolicy {
    /// The policy.
    pub kind: MergePolicyKind,
    /// Its fairness parameters.
    pub fairness: Fairness,
}

impl Default for MergePolicy {
    fn default() -> Self {
        Self {
            kind: MergePolicyKind::RandomRobin,
            fairness: Fairness::default(),
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(rename = "type")]
    kind: Option<String>,
    parameters: Option<Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRandomRobin {
    fairness_header: Option<String>,
    fairness_attribute: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTierPriority {
    fairness_header: Option<String>,
    fairness_attribute: Option<String>,
    priority_header: Option<String>,
    tier_label: Option<String>,
    objective_header: Option<String>,
    lane_objectives: Option<std::collections::BTreeMap<String, String>>,
}

/// Decodes and validates the merge-policy file's text.
///
/// Checked in this order, the first problem winning: the type, that the parameters are an
/// object, the policy's own parameters, then the fairness header.
pub(crate) fn parse_merge_policy(text: &str) -> Result<MergePolicy, ConfigError> {
    let raw: RawPolicy = decode(
        text,
        "merge_policy",
        "--request-merge-policy-config-file",
        &[""],
    )?;
    let kind = policy_type(&raw.kind.unwrap_or_default())?;
    let params = parameters_object(raw.parameters)?;
    let policy = match kind {
        "tier-priority" => tier_priority(params)?,
        "fair-share" => fair_share(params)?,
        _ => random_robin(params)?,
    };
    let header = fairness_header(policy.fairness_header)?;
    let attribute = policy
        .fairness_attribute
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_FAIRNESS_ATTRIBUTE.to_owned());
    Ok(MergePolicy {
        kind: policy.kind,
        fairness: Fairness { header, attribute },
    })
}

/// A policy's own parameters, decoded, with the fairness fields both policies share, not yet
/// checked.
struct PolicyParameters {
    kind: MergePolicyKind,
    fairness_header: Option<String>,
    fairness_attribute: Option<String>,
}

/// `merge_policy.type`: one of the known policies.
fn policy_type(kind: &str) -> Result<&'static str, ConfigError> {
    match kind {
        "random-robin" => Ok("random-robin"),
        "tier-priority" => Ok("tier-priority"),
        "fair-share" => Ok("fair-share"),
        "" => Err(ConfigError::invalid(
            "merge_policy.type",
            "required (\"random-robin\", \"tier-priority\" or \"fair-share\")",
        )),
        other => Err(ConfigError::invalid(
            "merge_policy.type",
            format!(
                "unknown merge policy {other:?} (known: random-robin, tier-priority, fair-share)"
            ),
        )),
    }
}

/// The parameters of `fair-share` (see [`super::fair_share`]).
fn fair_share(params: Value) -> Result<PolicyParameters, ConfigError> {
    let (fs, raw) = super::fair_share::parse(params)?;
    Ok(PolicyParameters {
        kind: MergePolicyKind::FairShare(fs),
        fairness_header: raw.fairness_header,
        fairness_attribute: raw.fairness_attribute,
    })
}

/// `merge_policy.parameters`: an object, empty when absent or null.
fn parameters_object(parameters: Option<Value>) -> Result<Value, ConfigError> {
    match parameters {
        None | Some(Value::Null) => Ok(Value::Object(Default::default())),
        Some(v @ Value::Object(_)) => Ok(v),
        Some(other) => Err(ConfigError::invalid(
            "merge_policy.parameters",
            format!("must be a JSON object, got {}", json_kind(&other)),
        )),
    }
}

/// The parameters of `tier-priority`: the priority and objective headers (checked), the tier
/// label and the lanes' objectives.
fn tier_priority(params: Value) -> Result<PolicyParameters, ConfigError> {
    let p: RawTierPriority = decode_value(params, "merge_policy.parameters")?;
    let priority_header = match p.priority_header {
        None => String::new(),
        Some(h) if h.is_empty() || is_header_name(&h) => h,
        Some(h) => {
            return Err(ConfigError::invalid(
                "merge_policy.parameters.priority_header",
                format!("invalid HTTP header name {h:?}"),
            ))
        }
    };
    let objective_header = match p.objective_header {
        None => DEFAULT_OBJECTIVE_HEADER.to_owned(),
        Some(h) if h.is_empty() => DEFAULT_OBJECTIVE_HEADER.to_owned(),
        Some(h) if is_header_name(&h) => h,
        Some(h) => {
            return Err(ConfigError::invalid(
                "merge_policy.parameters.objective_header",
                format!("invalid HTTP header name {h:?}"),
            ))
        }
    };
    let tier_label = p
        .tier_label
        .filter(|l| !l.is_empty())
        .unwrap_or_else(|| DEFAULT_TIER_LABEL.to_owned());
    Ok(PolicyParameters {
        kind: MergePolicyKind::TierPriority(TierPriority {
            priority_header,
            tier_label,
            objective_header,
            lane_objectives: Box::new(lane_objectives(p.lane_objectives.unwrap_or_default())?),
        }),
        fairness_header: p.fairness_header,
        fairness_attribute: p.fairness_attribute,
    })
}

/// `lane_objectives`: Go's six lane names only; each objective a legal header value (an empty
/// one stamps nothing).
fn lane_objectives(
    map: std::collections::BTreeMap<String, String>,
) -> Result<[Option<String>; 6], ConfigError> {
    let mut by_bucket: [Option<String>; 6] = Default::default();
    for (lane, objective) in map {
        let field = format!("merge_policy.parameters.lane_objectives.{lane}");
        let Some(bucket) = LANES.iter().position(|l| *l == lane) else {
            return Err(ConfigError::invalid(
                field,
                format!("unknown lane (known: {})", LANES.join(", ")),
            ));
        };
        if !objective
            .bytes()
            .all(|b| (b >= 0x20 && b != 0x7f) || b == b'\t')
        {
            return Err(ConfigError::invalid(
                field,
                format!("{objective:?} is not a legal HTTP header value"),
            ));
        }
        by_bucket[bucket] = Some(objective).filter(|o| !o.is_empty());
    }
    Ok(by_bucket)
}

/// The parameters of `random-robin`: the fairness fields only.
fn random_robin(params: Value) -> Result<PolicyParameters, ConfigError> {
    let p: RawRandomRobin = decode_value(params, "merge_policy.parameters")?;
    Ok(PolicyParameters {
        kind: MergePolicyKind::RandomRobin,
        fairness_header: p.fairness_header,
        fairness_attribute: p.fairness_attribute,
    })
}

/// `fairness_header`: the default when absent, none when empty, else a valid header name.
fn fairness_header(header: Option<String>) -> Result<Option<String>, ConfigError> {
    match header {
        None => Ok(Some(DEFAULT_FAIRNESS_HEADER.to_owned())),
        Some(h) if h.is_empty() => Ok(None),
        Some(h) if is_header_name(&h) => Ok(Some(h)),
        Some(h) => Err(ConfigError::invalid(
            "merge_policy.parameters.fairness_header",
            format!("invalid HTTP header name {h:?}"),
        )),
    }
}

/// An RFC 9110 token: the characters allowed in a header name.
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse_merge_policy(text) {
            Ok(p) => format!("ok {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn random_robin_with_defaults_and_overrides() {
        let p = parse_merge_policy(r#"{"type":"random-robin"}"#).unwrap();
        assert_eq!(p, MergePolicy::default());
        assert_eq!(
            p.fairness.header.as_deref(),
            Some("x-llm-d-inference-fairness-id")
        );
        assert_eq!(p.fairness.attribute, "userid");

        let p = parse_merge_policy(
            r#"{"type":"random-robin","parameters":{"fairness_header":"X-Tenant","fairness_attribute":"tenant"}}"#,
        )
        .unwrap();
        assert_eq!(p.fairness.header.as_deref(), Some("X-Tenant"));
        assert_eq!(p.fairness.attribute, "tenant");

        let p =
            parse_merge_policy(r#"{"type":"random-robin","parameters":{"fairness_header":""}}"#)
                .unwrap();
        assert_eq!(p.fairness.header, None);

        let p = parse_merge_policy(r#"{"type":"random-robin","parameters":null}"#).unwrap();
        assert_eq!(p, MergePolicy::default());
    }

    #[test]
    fn tier_priority_with_defaults_and_overrides() {
        let p = parse_merge_policy(r#"{"type":"tier-priority"}"#).unwrap();
        assert_eq!(
            p.kind,
            MergePolicyKind::TierPriority(TierPriority::new("tier"))
        );
        let MergePolicyKind::TierPriority(tier) = &p.kind else {
            unreachable!()
        };
        assert_eq!(
            tier.priority_header, "",
            "Go #443: nothing stamped by default"
        );
        assert_eq!(tier.objective_header, "x-llm-d-inference-objective");
        assert_eq!(p.fairness, Fairness::default());
        let p = parse_merge_policy(
            r#"{"type":"tier-priority","parameters":{"priority_header":"X-Prio",
                "tier_label":"class","fairness_header":""}}"#,
        )
        .unwrap();
        assert_eq!(
            p.kind,
            MergePolicyKind::TierPriority(TierPriority {
                priority_header: "X-Prio".to_owned(),
                ..TierPriority::new("class")
            })
        );
        assert_eq!(p.fairness.header, None);
    }

    /// Go's format (#443): `objective_header` and `lane_objectives` by Go's six lane names.
    #[test]
    fn tier_priority_reads_go_s_lane_objectives() {
        let p = parse_merge_policy(
            r#"{"type":"tier-priority","parameters":{"objective_header":"X-Obj",
                "lane_objectives":{"reserved-interactive":"chat","overflow-batch":"bulk",
                "reserved-async":""}}}"#,
        )
        .unwrap();
        let MergePolicyKind::TierPriority(tier) = p.kind else {
            panic!("{p:?}")
        };
        assert_eq!(tier.objective_header, "X-Obj");
        assert_eq!(
            *tier.lane_objectives,
            [
                Some("chat".to_owned()),
                None,
                None,
                None,
                None,
                Some("bulk".to_owned())
            ]
        );
        assert_eq!(
            err(r#"{"type":"tier-priority","parameters":{"lane_objectives":{"urgent":"x"}}}"#),
            "invalid config: merge_policy.parameters.lane_objectives.urgent: unknown lane \
             (known: reserved-interactive, reserved-async, reserved-batch, \
             overflow-interactive, overflow-async, overflow-batch)"
        );
        assert!(err(
            r#"{"type":"tier-priority","parameters":{"lane_objectives":{"reserved-batch":"a\nb"}}}"#
        )
        .starts_with("invalid config: merge_policy.parameters.lane_objectives.reserved-batch:"));
        assert!(
            err(r#"{"type":"tier-priority","parameters":{"objective_header":"a b"}}"#)
                .starts_with("invalid config: merge_policy.parameters.objective_header:")
        );
    }

    #[test]
    fn rules_name_their_field() {
        assert_eq!(
            err(r#"{"type":"tier-priority","parameters":{"priority_header":"x y"}}"#),
            "invalid config: merge_policy.parameters.priority_header: invalid HTTP header name \
             \"x y\""
        );
        assert!(
            err(r#"{"type":"tier-priority","parameters":{"priority":"x"}}"#)
                .starts_with("invalid config: merge_policy.parameters.priority: unknown field"),
        );
        assert_eq!(
            err(r#"{"type":"round-robin"}"#),
            "invalid config: merge_policy.type: unknown merge policy \"round-robin\" (known: \
             random-robin, tier-priority, fair-share)"
        );
        assert_eq!(
            err(r#"{}"#),
            "invalid config: merge_policy.type: required (\"random-robin\", \"tier-priority\" \
             or \"fair-share\")"
        );
        let p = parse_merge_policy(
            r#"{"type":"fair-share","parameters":{"weights":{"a":2},"fairness_header":""}}"#,
        )
        .unwrap();
        assert!(matches!(&p.kind, MergePolicyKind::FairShare(fs) if fs.weights["a"] == 2.0));
        assert_eq!(p.fairness.header, None);
        assert!(err(r#"{"type":"random-robin","params":{}}"#)
            .starts_with("invalid config: merge_policy.params: unknown field"));
        assert!(
            err(r#"{"type":"random-robin","parameters":{"fairness_headr":"x"}}"#).starts_with(
                "invalid config: merge_policy.parameters.fairness_headr: unknown field"
            )
        );
        assert_eq!(
            err(r#"{"type":"random-robin","parameters":{"fairness_header":"bad header"}}"#),
            "invalid config: merge_policy.parameters.fairness_header: invalid HTTP header name \
             \"bad header\""
        );
        assert_eq!(
            err(r#"{"type":"random-robin","parameters":"x"}"#),
            "invalid config: merge_policy.parameters: must be a JSON object, got a string"
        );
    }

    #[test]
    fn header_names() {
        assert!(is_header_name("x-llm-d-inference-fairness-id"));
        assert!(is_header_name("X_Y.z~1"));
        for bad in ["", "a b", "a:b", "é", "a\n"] {
            assert!(!is_header_name(bad), "{bad:?}");
        }
    }
}
