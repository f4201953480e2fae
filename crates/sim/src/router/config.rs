//! The router's flow-control knobs: priority bands, the saturation detector and its ceiling, the
//! per-band TTL, and in-flight eviction with the reclamation controller's pacing. They enter as
//! flags flattened into [`crate::SimConfig`] (`--priority-bands`, `--eviction`, …), each eviction
//! knob with the llm-d router's default; [`RouterConfig::validate`] names the first bad one.

use std::collections::HashMap;
use std::time::Duration;

use crate::SimError;

/// Default `--objective-priorities`: the simulator's sheddable objective is `batch`.
pub(super) const DEFAULT_OBJECTIVE_PRIORITIES: &str = "batch=-1";
/// The router's `defaultRequestTTL` (60 s).
pub(super) const DEFAULT_REQUEST_TTL_MS: u64 = 60_000;
/// The router's `defaultMaxRevocationsPerDecision`.
pub(super) const DEFAULT_MAX_REVOCATIONS: usize = 2;
/// The grace the router derives for the concurrency detector (`evictionLeadingSensorGrace`):
/// its gauge falls when the victim's stream ends.
pub(super) const CONCURRENCY_GRACE_MS: u64 = 10;
/// The grace the router derives for the utilization detector with its default flags:
/// `--refresh-metrics-interval` 50 ms + `--metrics-staleness-threshold` 2 s + 250 ms for the
/// engine to reclaim the slot (`evictionEngineReclaimBudget`).
pub(super) const UTILIZATION_GRACE_MS: u64 = 2_300;
/// The router's `defaultEvictionConfirmationTimeout`.
pub(super) const DEFAULT_CONFIRMATION_TIMEOUT_MS: u64 = 10_000;

/// How the router reckons the pool's saturation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SaturationDetector {
    /// `utilization-detector`: the mean over engines of `max(waiting / 5, kv / 0.8)`.
    #[default]
    Utilization,
    /// `concurrency-detector` (requests mode): requests in flight over
    /// `--pods × --max-concurrency`.
    Concurrency,
}

/// The router's flow control with priority bands and in-flight eviction (llm-d feature gate
/// `flowControl`). Off unless `--priority-bands` or `--eviction` is given; needs `--pods`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct RouterConfig {
    /// Queue requests in priority bands at the router and dispatch them in strict priority order
    /// while the pool's saturation is under --saturation-ceiling (the llm-d router's flow control).
    #[arg(long, default_value_t = false)]
    pub priority_bands: bool,

    /// Each objective's priority (`x-llm-d-inference-objective` value = InferenceObjective
    /// `spec.priority`), comma-separated `name=priority`; unknown objectives and requests naming
    /// none are priority 0. Priority < 0 is sheddable (evictable).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_OBJECTIVE_PRIORITIES)]
    pub objective_priorities: Vec<String>,

    /// How the router measures saturation: utilization or concurrency.
    #[arg(long, value_enum, default_value_t = SaturationDetector::Utilization)]
    pub saturation_detector: SaturationDetector,

    /// The concurrency detector's `maxConcurrency` per engine (default: --max-num-seqs).
    #[arg(long)]
    pub max_concurrency: Option<usize>,

    /// A band's head is dispatched while the pool's saturation is under this ceiling.
    #[arg(long, default_value_t = 1.0)]
    pub saturation_ceiling: f64,

    /// How long a request may wait in its band before it is answered 429
    /// `rejected-ttl-expired`, in milliseconds (the router's default 60 s).
    #[arg(long, default_value_t = DEFAULT_REQUEST_TTL_MS)]
    pub request_ttl_ms: u64,

    /// Evict in-flight sheddable requests (priority < 0) when a band's head is blocked by
    /// saturation (implies --priority-bands). The victim's client gets 429 `evicted`.
    #[arg(long, default_value_t = false)]
    pub eviction: bool,

    /// `MaxRevocationsPerDecision`: the most victims one reclamation decision evicts.
    #[arg(long, default_value_t = DEFAULT_MAX_REVOCATIONS)]
    pub max_revocations_per_decision: usize,

    /// `ConfirmationGrace`: after every earlier eviction is confirmed (its stream ended), how
    /// long before the next decision, in milliseconds (default: what the router derives from
    /// the detector, 10 for concurrency, 2300 for utilization).
    #[arg(long)]
    pub confirmation_grace_ms: Option<u64>,

    /// `ConfirmationTimeout`: an eviction not confirmed by then counts as confirmed
    /// (`timed_out`), in milliseconds.
    #[arg(long, default_value_t = DEFAULT_CONFIRMATION_TIMEOUT_MS)]
    pub confirmation_timeout_ms: u64,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            priority_bands: false,
            objective_priorities: vec![DEFAULT_OBJECTIVE_PRIORITIES.to_owned()],
            saturation_detector: SaturationDetector::Utilization,
            max_concurrency: None,
            saturation_ceiling: 1.0,
            request_ttl_ms: DEFAULT_REQUEST_TTL_MS,
            eviction: false,
            max_revocations_per_decision: DEFAULT_MAX_REVOCATIONS,
            confirmation_grace_ms: None,
            confirmation_timeout_ms: DEFAULT_CONFIRMATION_TIMEOUT_MS,
        }
    }
}

impl RouterConfig {
    /// Whether requests queue in the router's bands.
    pub fn enabled(&self) -> bool {
        self.priority_bands || self.eviction
    }

    /// The objective → priority map, or the first bad pair.
    pub fn priorities(&self) -> Result<HashMap<String, i32>, SimError> {
        let mut map = HashMap::new();
        for pair in self.objective_priorities.iter().map(|p| p.trim()) {
            if pair.is_empty() {
                continue;
            }
            let parsed = pair.split_once('=').and_then(|(name, priority)| {
                let name = name.trim();
                let priority = priority.trim().parse::<i32>().ok()?;
                (!name.is_empty()).then(|| (name.to_owned(), priority))
            });
            let Some((name, priority)) = parsed else {
                return Err(invalid(
                    "objective-priorities",
                    format!("expected name=integer, got {pair:?}"),
                ));
            };
            map.insert(name, priority);
        }
        Ok(map)
    }

    /// The pacing grace: the flag, else what the router derives from its detector.
    pub fn confirmation_grace(&self) -> Duration {
        Duration::from_millis(self.confirmation_grace_ms.unwrap_or(
            match self.saturation_detector {
                SaturationDetector::Concurrency => CONCURRENCY_GRACE_MS,
                SaturationDetector::Utilization => UTILIZATION_GRACE_MS,
            },
        ))
    }

    /// The per-band wait before `rejected-ttl-expired`.
    pub fn request_ttl(&self) -> Duration {
        Duration::from_millis(self.request_ttl_ms)
    }

    /// Checks every router knob (given whether the engine model is on), naming the first bad one.
    pub fn validate(&self, engines: bool, shedding: bool) -> Result<(), SimError> {
        self.priorities()?;
        if !self.enabled() {
            return Ok(());
        }
        let knob = if self.eviction {
            "eviction"
        } else {
            "priority-bands"
        };
        if !engines {
            return Err(invalid(knob, "needs the engine model (--pods ≥ 1)".into()));
        }
        if shedding {
            return Err(invalid(
                knob,
                "cannot be combined with --flow-control (which sheds instead of queueing)".into(),
            ));
        }
        if !self.saturation_ceiling.is_finite() || self.saturation_ceiling <= 0.0 {
            return Err(invalid(
                "saturation-ceiling",
                format!(
                    "must be a finite number > 0, got {}",
                    self.saturation_ceiling
                ),
            ));
        }
        if self.max_concurrency == Some(0) {
            return Err(invalid("max-concurrency", "must be at least 1".into()));
        }
        if self.request_ttl_ms == 0 {
            return Err(invalid("request-ttl-ms", "must be at least 1".into()));
        }
        if self.max_revocations_per_decision == 0 {
            return Err(invalid(
                "max-revocations-per-decision",
                "must be at least 1".into(),
            ));
        }
        if self.confirmation_timeout_ms == 0 {
            return Err(invalid(
                "confirmation-timeout-ms",
                "must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

fn invalid(knob: &'static str, reason: String) -> SimError {
    SimError::InvalidKnob { knob, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_parse_and_bad_pairs_are_named() {
        let cfg = RouterConfig {
            objective_priorities: vec!["batch=-1".into(), " chat = 10 ".into()],
            ..RouterConfig::default()
        };
        let map = cfg.priorities().unwrap();
        assert_eq!(map.get("batch"), Some(&-1));
        assert_eq!(map.get("chat"), Some(&10));
        for bad in ["batch", "=3", "batch=high"] {
            let cfg = RouterConfig {
                objective_priorities: vec![bad.into()],
                ..RouterConfig::default()
            };
            let err = cfg.priorities().unwrap_err().to_string();
            assert!(err.contains("--objective-priorities"), "{err}");
        }
    }

    #[test]
    fn eviction_needs_engines_and_excludes_shedding() {
        let cfg = RouterConfig {
            eviction: true,
            ..RouterConfig::default()
        };
        assert!(cfg.validate(true, false).is_ok());
        assert!(cfg
            .validate(false, false)
            .unwrap_err()
            .to_string()
            .contains("--eviction"));
        assert!(cfg
            .validate(true, true)
            .unwrap_err()
            .to_string()
            .contains("--flow-control"));
        let zero = RouterConfig {
            max_revocations_per_decision: 0,
            ..cfg
        };
        assert!(zero
            .validate(true, false)
            .unwrap_err()
            .to_string()
            .contains("--max-revocations-per-decision"));
    }
}
