//! The request merge policy (go-compat §7.1–7.4): the `--request-merge-policy-config-file` JSON
//! `{"type": ..., "parameters": {...}}`, or `random-robin` with default parameters without the
//! file. inferq implements `random-robin`; `tier-priority` is refused as not supported yet. Out
//! comes a [`MergePolicy`]; errors name `merge_policy.<path>`.

use serde::Deserialize;
use serde_json::Value;

use super::gate::json_kind;
use super::json::{decode, decode_value};
use super::ConfigError;

/// Header stamped with the fairness id when the policy does not name another.
pub const DEFAULT_FAIRNESS_HEADER: &str = "x-llm-d-inference-fairness-id";
/// Metadata key whose value becomes the fairness id by default.
pub const DEFAULT_FAIRNESS_ATTRIBUTE: &str = "userid";

/// Which policy merges a pool's queues into its workers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergePolicyKind {
    /// Uniformly random among the queues that have a request ready.
    RandomRobin,
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
#[derive(Debug, Clone, PartialEq, Eq)]
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

/// Decodes and validates the merge-policy file's text.
pub(crate) fn parse_merge_policy(text: &str) -> Result<MergePolicy, ConfigError> {
    let raw: RawPolicy = decode(
        text,
        "merge_policy",
        "--request-merge-policy-config-file",
        &[""],
    )?;
    let kind = raw.kind.unwrap_or_default();
    match kind.as_str() {
        "random-robin" => {}
        "tier-priority" => {
            return Err(ConfigError::unsupported(
                "merge_policy.type",
                "\"tier-priority\" is not supported by inferq yet; use \"random-robin\" (or leave \
                 out --request-merge-policy-config-file)",
            ))
        }
        "" => {
            return Err(ConfigError::invalid(
                "merge_policy.type",
                "required (\"random-robin\")",
            ))
        }
        other => {
            return Err(ConfigError::invalid(
                "merge_policy.type",
                format!("unknown merge policy {other:?} (known: random-robin, tier-priority)"),
            ))
        }
    }
    let params = match raw.parameters {
        None | Some(Value::Null) => Value::Object(Default::default()),
        Some(v @ Value::Object(_)) => v,
        Some(other) => {
            return Err(ConfigError::invalid(
                "merge_policy.parameters",
                format!("must be a JSON object, got {}", json_kind(&other)),
            ))
        }
    };
    let params: RawRandomRobin = decode_value(params, "merge_policy.parameters")?;
    let header = match params.fairness_header {
        None => Some(DEFAULT_FAIRNESS_HEADER.to_owned()),
        Some(h) if h.is_empty() => None,
        Some(h) if is_header_name(&h) => Some(h),
        Some(h) => {
            return Err(ConfigError::invalid(
                "merge_policy.parameters.fairness_header",
                format!("invalid HTTP header name {h:?}"),
            ))
        }
    };
    let attribute = params
        .fairness_attribute
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| DEFAULT_FAIRNESS_ATTRIBUTE.to_owned());
    Ok(MergePolicy {
        kind: MergePolicyKind::RandomRobin,
        fairness: Fairness { header, attribute },
    })
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
    fn rules_name_their_field() {
        assert_eq!(
            err(r#"{"type":"tier-priority","parameters":{}}"#),
            "invalid config: merge_policy.type: \"tier-priority\" is not supported by inferq yet; \
             use \"random-robin\" (or leave out --request-merge-policy-config-file)"
        );
        assert_eq!(
            err(r#"{"type":"round-robin"}"#),
            "invalid config: merge_policy.type: unknown merge policy \"round-robin\" (known: \
             random-robin, tier-priority)"
        );
        assert_eq!(
            err(r#"{}"#),
            "invalid config: merge_policy.type: required (\"random-robin\")"
        );
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
