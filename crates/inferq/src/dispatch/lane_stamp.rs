//! What the `tier-priority` merge stamps on a request it takes (go-v011 §3, Go #443): the lane's
//! InferenceObjective in `objective_header` when `lane_objectives` names one for the lane, and
//! the bucket number in `priority_header` when that is set (Go's default is now `""`: no
//! priority header). The lane is the bucket the merge took the request by, before the pool gate.
//!
//! The worker stamps these after the message's own headers and the fairness header, so each
//! replaces a caller's header of the same name, whatever its letter case.

use std::collections::BTreeMap;

use super::merge::tier_bucket;
use crate::config::merge::TierPriority;

/// The `(header, value)` pairs to stamp for a request with these labels, objective first.
pub fn lane_stamps<'a>(
    tier: &'a TierPriority,
    labels: &BTreeMap<String, String>,
) -> Vec<(&'a str, String)> {
    let bucket = tier_bucket(labels, &tier.tier_label);
    let mut stamps = Vec::new();
    if let Some(objective) = &tier.lane_objectives[usize::from(bucket)] {
        stamps.push((tier.objective_header.as_str(), objective.clone()));
    }
    if !tier.priority_header.is_empty() {
        stamps.push((tier.priority_header.as_str(), bucket.to_string()));
    }
    stamps
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn lanes_stamp_their_objective_and_the_priority_only_when_named() {
        let mut tier = TierPriority::new("tier");
        assert!(lane_stamps(&tier, &labels(&[("tier", "interactive")])).is_empty());
        tier.lane_objectives[3] = Some("chat".to_owned());
        tier.lane_objectives[1] = Some("soon".to_owned());
        assert_eq!(
            lane_stamps(&tier, &labels(&[("tier", "interactive")])),
            [("x-llm-d-inference-objective", "chat".to_owned())]
        );
        assert_eq!(
            lane_stamps(
                &tier,
                &labels(&[("tier", "async"), ("classification", "reserved")])
            ),
            [("x-llm-d-inference-objective", "soon".to_owned())]
        );
        assert!(lane_stamps(&tier, &labels(&[("tier", "batch")])).is_empty());
        tier.priority_header = "x-gateway-priority".to_owned();
        assert_eq!(
            lane_stamps(&tier, &labels(&[("tier", "batch")])),
            [("x-gateway-priority", "5".to_owned())]
        );
    }
}
