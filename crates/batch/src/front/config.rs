//! The router's `async-broker` step configuration (its `params` block), which `inferq
//! batch-api --broker-config <file>` reads as YAML or JSON so an operator copies theirs
//! unchanged: header names, routes, objectives, quota, timeouts, the wait cap, the fetch grace,
//! the wake-up mode and the forwarded headers. Unknown fields are refused (as the step refuses
//! them), and the defaults are the step's own.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// One route: requests whose model and tenant match (an empty field matches all) go to `queue`
/// and are classified under `tier`; the first match wins.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Route {
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub tenant: String,
    #[serde(default)]
    pub queue: String,
    #[serde(default)]
    pub tier: String,
}

/// The default and the most seconds of one queued mode's deadline.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Bounds {
    #[serde(default)]
    pub default_seconds: i64,
    #[serde(default)]
    pub max_seconds: i64,
}

/// The objective names of one tier, by quota classification.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Objectives {
    #[serde(default)]
    pub reserved: String,
    #[serde(default)]
    pub overflow: String,
}

/// Passthrough's quota classification: the redis-quota gate's concurrency counters.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Quota {
    #[serde(default)]
    pub prefix: String,
    #[serde(default)]
    pub attribute: String,
    #[serde(default)]
    pub limits: BTreeMap<String, i64>,
    #[serde(default)]
    pub window_seconds: i64,
}

/// How a held `wait` learns its result landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wakeup {
    /// Keyspace notifications when Redis has (or takes) them, else inferq's sweep.
    Auto,
    /// Keyspace notifications (turned on at start-up when Redis allows it).
    Notify,
    /// inferq's sweep: one round trip per replica per tick for all its waits.
    Poll,
}

/// The step's `params` block, with the step's defaults applied.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Read for compatibility and not used: Redis is the transport config's.
    #[serde(default)]
    pub redis_url: String,
    #[serde(default)]
    pub mode_header: String,
    #[serde(default)]
    pub tenant_header: String,
    #[serde(default)]
    pub timeout_header: String,
    #[serde(default)]
    pub timeouts: BTreeMap<String, Bounds>,
    #[serde(default)]
    pub wait_cap_seconds: i64,
    #[serde(default)]
    pub fetch_grace_seconds: Option<i64>,
    #[serde(default)]
    pub routes: Vec<Route>,
    #[serde(default)]
    pub default_queue: String,
    #[serde(default)]
    pub default_tier: String,
    #[serde(default)]
    pub quota: Quota,
    #[serde(default)]
    pub forward_headers: Option<Vec<String>>,
    #[serde(default)]
    pub wakeup_mode: String,
    #[serde(default)]
    pub objectives: BTreeMap<String, Objectives>,
    #[serde(default)]
    pub objective_header: String,
    #[serde(default)]
    pub fairness_header: String,
}

/// The step's default deadline of `wait`, seconds.
pub const WAIT_DEFAULT_SECS: i64 = 60;
/// The step's default deadline of `enqueue`, seconds.
pub const ENQUEUE_DEFAULT_SECS: i64 = 3600;
/// The step's default mailbox TTL after a delivered fetch, seconds.
pub const FETCH_GRACE_SECS: i64 = 60;

/// Why a broker config was refused (the field, then the reason).
#[derive(Debug, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    pub field: String,
    pub reason: String,
}

fn refuse(field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

impl Default for BrokerConfig {
    fn default() -> BrokerConfig {
        let mut c = BrokerConfig {
            redis_url: String::new(),
            mode_header: String::new(),
            tenant_header: String::new(),
            timeout_header: String::new(),
            timeouts: BTreeMap::new(),
            wait_cap_seconds: 0,
            fetch_grace_seconds: None,
            routes: Vec::new(),
            default_queue: String::new(),
            default_tier: String::new(),
            quota: Quota::default(),
            forward_headers: None,
            wakeup_mode: String::new(),
            objectives: BTreeMap::new(),
            objective_header: String::new(),
            fairness_header: String::new(),
        };
        c.apply_defaults();
        c
    }
}

impl BrokerConfig {
    /// Reads `path` (YAML, of which JSON is a part), applies the defaults and checks it. The
    /// block may be the `params` object itself or the whole step entry (`type: async-broker`,
    /// `params: {...}`).
    pub fn load(path: &Path) -> Result<BrokerConfig, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| refuse("--broker-config", format!("{}: {e}", path.display())))?;
        BrokerConfig::parse(&text).map_err(|e| {
            refuse(
                &format!("--broker-config {}: {}", path.display(), e.field),
                e.reason,
            )
        })
    }

    /// [`BrokerConfig::load`] of a text.
    pub fn parse(text: &str) -> Result<BrokerConfig, ConfigError> {
        let value: serde_norway::Value =
            serde_norway::from_str(text).map_err(|e| refuse("params", e.to_string()))?;
        let params = match value.get("params") {
            Some(p) if value.get("type").is_some() => p.clone(),
            _ => value,
        };
        let mut c: BrokerConfig =
            serde_norway::from_value(params).map_err(|e| refuse("params", e.to_string()))?;
        c.apply_defaults();
        c.check()?;
        Ok(c)
    }

    fn apply_defaults(&mut self) {
        let set = |field: &mut String, default: &str| {
            if field.is_empty() {
                *field = default.to_owned();
            }
        };
        set(&mut self.mode_header, "X-AP-Mode");
        set(&mut self.tenant_header, "X-Team");
        set(&mut self.timeout_header, "X-Request-Timeout-Seconds");
        set(&mut self.default_queue, "request-sortedset");
        set(&mut self.quota.prefix, "quota:");
        set(&mut self.quota.attribute, "userid");
        set(&mut self.wakeup_mode, "auto");
        set(&mut self.objective_header, "x-llm-d-inference-objective");
        set(&mut self.fairness_header, "x-llm-d-inference-fairness-id");
        if self.quota.window_seconds <= 0 {
            self.quota.window_seconds = 300;
        }
        if self.forward_headers.is_none() {
            self.forward_headers = Some(vec![
                "x-llm-d-slo-ttft-ms".to_owned(),
                "x-llm-d-slo-tpot-ms".to_owned(),
            ]);
        }
    }

    fn check(&self) -> Result<(), ConfigError> {
        self.wakeup()?;
        if self.fetch_grace_seconds.is_some_and(|g| g < 0) {
            return Err(refuse("fetch_grace_seconds", "must not be negative"));
        }
        if self.wait_cap_seconds < 0 {
            return Err(refuse("wait_cap_seconds", "must not be negative"));
        }
        for (mode, b) in &self.timeouts {
            if mode != "wait" && mode != "enqueue" {
                return Err(refuse(
                    "timeouts",
                    format!("keys must be enqueue or wait, got {mode:?}"),
                ));
            }
            if b.max_seconds > 0 && b.default_seconds > b.max_seconds {
                return Err(refuse(
                    &format!("timeouts.{mode}"),
                    format!(
                        "default_seconds {} exceeds max_seconds {}",
                        b.default_seconds, b.max_seconds
                    ),
                ));
            }
        }
        for h in self.forward_headers() {
            for banned in [
                &self.mode_header,
                &self.objective_header,
                &self.fairness_header,
            ] {
                if h.eq_ignore_ascii_case(banned) {
                    return Err(refuse(
                        "forward_headers",
                        format!("must not include {h}: that header is the step's own"),
                    ));
                }
            }
            if axum::http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                return Err(refuse(
                    "forward_headers",
                    format!("{h:?} is not a header name"),
                ));
            }
        }
        for (field, name) in [
            ("mode_header", &self.mode_header),
            ("tenant_header", &self.tenant_header),
            ("timeout_header", &self.timeout_header),
            ("objective_header", &self.objective_header),
            ("fairness_header", &self.fairness_header),
        ] {
            if axum::http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(refuse(field, format!("{name:?} is not a header name")));
            }
        }
        if let Some((t, _)) = self.quota.limits.iter().find(|(t, _)| t.contains(':')) {
            return Err(refuse(
                "quota.limits",
                format!("tenant {t:?} contains ':', which no tenant may"),
            ));
        }
        Ok(())
    }

    /// `wakeup_mode`.
    pub fn wakeup(&self) -> Result<Wakeup, ConfigError> {
        match self.wakeup_mode.as_str() {
            "auto" => Ok(Wakeup::Auto),
            "notify" => Ok(Wakeup::Notify),
            "poll" => Ok(Wakeup::Poll),
            other => Err(refuse(
                "wakeup_mode",
                format!("must be auto, notify, or poll, got {other:?}"),
            )),
        }
    }

    /// The client headers copied onto queued messages.
    pub fn forward_headers(&self) -> &[String] {
        self.forward_headers.as_deref().unwrap_or_default()
    }

    /// The mailbox TTL after a delivered fetch, seconds (0: deleted on delivery).
    pub fn fetch_grace(&self) -> i64 {
        self.fetch_grace_seconds.unwrap_or(FETCH_GRACE_SECS)
    }

    /// The default and the most seconds of a queued mode (`wait` or `enqueue`); each falls back
    /// on its own (a max of 0: no clamp).
    pub fn bounds(&self, enqueue: bool) -> Bounds {
        let mut b = self
            .timeouts
            .get(if enqueue { "enqueue" } else { "wait" })
            .copied()
            .unwrap_or_default();
        if b.default_seconds <= 0 {
            b.default_seconds = if enqueue {
                ENQUEUE_DEFAULT_SECS
            } else {
                WAIT_DEFAULT_SECS
            };
        }
        b
    }

    /// The queue and tier of a request (the first matching route, else the defaults).
    pub fn route(&self, model: &str, tenant: &str) -> (&str, &str) {
        for r in &self.routes {
            if (r.model.is_empty() || r.model == model)
                && (r.tenant.is_empty() || r.tenant == tenant)
            {
                let q = if r.queue.is_empty() {
                    &self.default_queue
                } else {
                    &r.queue
                };
                let t = if r.tier.is_empty() {
                    &self.default_tier
                } else {
                    &r.tier
                };
                return (q, t);
            }
        }
        (&self.default_queue, &self.default_tier)
    }

    /// Every queue a request may be routed to.
    pub fn queues(&self) -> Vec<&str> {
        let mut out: Vec<&str> = vec![self.default_queue.as_str()];
        for r in &self.routes {
            if !r.queue.is_empty() && !out.contains(&r.queue.as_str()) {
                out.push(&r.queue);
            }
        }
        out
    }

    /// The routes' models, once each, in order (`GET /v1/models`).
    pub fn models(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for r in &self.routes {
            if !r.model.is_empty() && !out.contains(&r.model.as_str()) {
                out.push(&r.model);
            }
        }
        out
    }

    /// The objective stamped on a passthrough request of `tier` classified `overflow` or not.
    pub fn objective(&self, tier: &str, overflow: bool) -> Option<&str> {
        let pair = self.objectives.get(tier)?;
        let name = if overflow {
            &pair.overflow
        } else {
            &pair.reserved
        };
        (!name.is_empty()).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_steps_params_block_parses_as_yaml_or_json_with_its_defaults() {
        let yaml = r#"
type: async-broker
params:
  redis_url: "redis://redis:6379"
  routes:
    - model: "my-model"
      queue: "team-a-queue"
      tier: "interactive"
  objectives:
    interactive:
      reserved: "interactive-reserved"
      overflow: "interactive-overflow"
  quota:
    limits:
      team-a: 8
"#;
        let c = BrokerConfig::parse(yaml).ok();
        let c = c.as_ref();
        assert_eq!(
            c.map(|c| c.route("my-model", "x")),
            Some(("team-a-queue", "interactive"))
        );
        assert_eq!(
            c.map(|c| c.route("other", "x")),
            Some(("request-sortedset", ""))
        );
        assert_eq!(c.map(|c| c.quota.window_seconds), Some(300));
        assert_eq!(c.map(|c| c.bounds(false).default_seconds), Some(60));
        assert_eq!(c.map(|c| c.bounds(true).default_seconds), Some(3600));
        assert_eq!(c.map(|c| c.fetch_grace()), Some(60));
        assert_eq!(
            c.map(|c| c.objective("interactive", true)),
            Some(Some("interactive-overflow"))
        );
        let json = r#"{"redis_url":"redis://r","fetch_grace_seconds":0,"timeouts":{"wait":{"max_seconds":5}}}"#;
        let c = BrokerConfig::parse(json).ok();
        assert_eq!(c.as_ref().map(|c| c.fetch_grace()), Some(0));
        assert_eq!(
            c.as_ref().map(|c| c.bounds(false)),
            Some(Bounds {
                default_seconds: 60,
                max_seconds: 5
            })
        );
    }

    #[test]
    fn a_bad_block_is_refused_naming_its_field() {
        let field = |t: &str| BrokerConfig::parse(t).err().map(|e| e.field);
        assert_eq!(field("{\"rooutes\": []}"), Some("params".into()));
        assert_eq!(field("wakeup_mode: sometimes"), Some("wakeup_mode".into()));
        assert_eq!(
            field("fetch_grace_seconds: -1"),
            Some("fetch_grace_seconds".into())
        );
        assert_eq!(
            field("timeouts: {later: {default_seconds: 1}}"),
            Some("timeouts".into())
        );
        assert_eq!(
            field("timeouts: {wait: {default_seconds: 9, max_seconds: 5}}"),
            Some("timeouts.wait".into())
        );
        assert_eq!(
            field("forward_headers: [X-AP-Mode]"),
            Some("forward_headers".into())
        );
    }
}
