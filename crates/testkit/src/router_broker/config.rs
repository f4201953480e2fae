//! The step's `params` block: what an operator writes under `type: async-broker`, with the
//! router's defaults applied and its validation, so a test configures the emulation with the
//! same YAML/JSON keys it would give the router.
//!
//! Data enters as JSON ([`BrokerConfig::from_params`]) or as a struct literal with
//! `..BrokerConfig::default()`, and leaves as a [`BrokerConfig`] whose empty fields hold the
//! router's defaults ([`BrokerConfig::resolved`]).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

/// A route: requests for `model` from `tenant` (empty: any) go to `queue` under `tier`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerRoute {
    pub model: String,
    pub tenant: String,
    pub queue: String,
    pub tier: String,
}

/// A queued mode's deadline: its default and the clamp (0: none), in seconds.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct TimeoutBounds {
    pub default_seconds: i64,
    pub max_seconds: i64,
}

/// The objective names stamped on a tier's passthrough requests, by classification.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ObjectivePair {
    pub reserved: String,
    pub overflow: String,
}

/// Passthrough's quota classification: the redis-quota gate's counters
/// (`<prefix><attribute>:<tenant>`), a concurrency limit per tenant.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct QuotaConfig {
    pub prefix: String,
    pub attribute: String,
    pub limits: BTreeMap<String, i64>,
    pub window_seconds: i64,
}

/// The step's params. Go's zero values mean "unset" here as there; `forward_headers` absent
/// (`None`) takes the SLO headers, present and empty forwards none.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct BrokerConfig {
    pub redis_url: String,
    pub mode_header: String,
    pub tenant_header: String,
    pub timeout_header: String,
    pub timeouts: BTreeMap<String, TimeoutBounds>,
    pub wait_cap_seconds: i64,
    pub fetch_grace_seconds: Option<i64>,
    pub routes: Vec<BrokerRoute>,
    pub default_queue: String,
    pub default_tier: String,
    pub quota: QuotaConfig,
    pub forward_headers: Option<Vec<String>>,
    pub wakeup_mode: String,
    pub objectives: BTreeMap<String, ObjectivePair>,
    pub objective_header: String,
    pub fairness_header: String,
}

/// Why a params block is refused (the router refuses it at start-up with the same reasons).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("invalid params: {0}")]
    Params(#[from] serde_json::Error),
    #[error("{0}")]
    Invalid(String),
}

/// The router's defaults (`applyDefaults`).
const DEFAULT_MODE_HEADER: &str = "X-AP-Mode";
const DEFAULT_TENANT_HEADER: &str = "X-Team";
const DEFAULT_TIMEOUT_HEADER: &str = "X-Request-Timeout-Seconds";
const DEFAULT_QUEUE: &str = "request-sortedset";
const DEFAULT_FETCH_GRACE_SECONDS: i64 = 60;
pub(crate) const DEFAULT_WAIT_SECONDS: i64 = 60;
pub(crate) const DEFAULT_ENQUEUE_SECONDS: i64 = 3600;

impl BrokerConfig {
    /// Decodes a params block (unknown keys refused, as the router's decoder refuses them),
    /// applies the defaults and validates.
    pub fn from_params(params: serde_json::Value) -> Result<BrokerConfig, ConfigError> {
        let config: BrokerConfig = serde_json::from_value(params)?;
        config.resolved()
    }

    /// This config with the router's defaults in its empty fields, validated.
    pub fn resolved(mut self) -> Result<BrokerConfig, ConfigError> {
        fn fill(field: &mut String, default: &str) {
            if field.is_empty() {
                *field = default.to_owned();
            }
        }
        fill(&mut self.mode_header, DEFAULT_MODE_HEADER);
        fill(&mut self.tenant_header, DEFAULT_TENANT_HEADER);
        fill(&mut self.timeout_header, DEFAULT_TIMEOUT_HEADER);
        fill(&mut self.default_queue, DEFAULT_QUEUE);
        fill(&mut self.quota.prefix, "quota:");
        fill(&mut self.quota.attribute, "userid");
        if self.quota.window_seconds <= 0 {
            self.quota.window_seconds = 300;
        }
        fill(&mut self.wakeup_mode, "auto");
        if self.forward_headers.is_none() {
            self.forward_headers = Some(vec![
                "x-llm-d-slo-ttft-ms".to_owned(),
                "x-llm-d-slo-tpot-ms".to_owned(),
            ]);
        }
        fill(&mut self.objective_header, "x-llm-d-inference-objective");
        fill(&mut self.fairness_header, "x-llm-d-inference-fairness-id");
        self.validate()?;
        Ok(self)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |reason: String| Err(ConfigError::Invalid(reason));
        if !matches!(self.wakeup_mode.as_str(), "auto" | "notify" | "poll") {
            return invalid(format!(
                "wakeup_mode must be auto, notify, or poll, got {:?}",
                self.wakeup_mode
            ));
        }
        if let Some(grace) = self.fetch_grace_seconds.filter(|g| *g < 0) {
            return invalid(format!(
                "fetch_grace_seconds must not be negative, got {grace}"
            ));
        }
        for (mode, bounds) in &self.timeouts {
            if mode != "enqueue" && mode != "wait" {
                return invalid(format!(
                    "timeouts keys must be enqueue or wait, got {mode:?}"
                ));
            }
            if bounds.max_seconds > 0 && bounds.default_seconds > bounds.max_seconds {
                return invalid(format!(
                    "timeouts.{mode}: default_seconds {} exceeds max_seconds {}",
                    bounds.default_seconds, bounds.max_seconds
                ));
            }
        }
        let banned = [
            &self.mode_header,
            &self.objective_header,
            &self.fairness_header,
        ];
        for header in self.forward_headers.iter().flatten() {
            if banned.iter().any(|b| b.eq_ignore_ascii_case(header)) {
                return invalid(format!("forward_headers must not include {header}"));
            }
        }
        Ok(())
    }

    /// The deadline bounds of a queued mode (`"wait"` or `"enqueue"`), each field defaulting
    /// on its own.
    pub(crate) fn bounds(&self, mode: &str) -> TimeoutBounds {
        let mut bounds = self.timeouts.get(mode).copied().unwrap_or_default();
        if bounds.default_seconds <= 0 {
            bounds.default_seconds = if mode == "enqueue" {
                DEFAULT_ENQUEUE_SECONDS
            } else {
                DEFAULT_WAIT_SECONDS
            };
        }
        bounds
    }

    /// The mailbox TTL after a delivered fetch (zero: delete it).
    pub(crate) fn fetch_grace(&self) -> Duration {
        let secs = self
            .fetch_grace_seconds
            .unwrap_or(DEFAULT_FETCH_GRACE_SECONDS);
        Duration::from_secs(u64::try_from(secs).unwrap_or(0))
    }

    /// The queue and tier of `(model, tenant)`: the first matching route (its empty queue or
    /// tier filled from the defaults), else the defaults.
    pub fn route(&self, model: &str, tenant: &str) -> (String, String) {
        let matched = self.routes.iter().find(|r| {
            (r.model.is_empty() || r.model == model) && (r.tenant.is_empty() || r.tenant == tenant)
        });
        let (queue, tier) = match matched {
            Some(r) => (r.queue.as_str(), r.tier.as_str()),
            None => ("", ""),
        };
        let queue = if queue.is_empty() {
            &self.default_queue
        } else {
            queue
        };
        let tier = if tier.is_empty() {
            &self.default_tier
        } else {
            tier
        };
        (queue.to_owned(), tier.to_owned())
    }
}
