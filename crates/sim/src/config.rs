//! The simulator's knobs: latency, capacity and fault-injection rates. They enter as command-line
//! flags (`SimConfig` is a `clap::Args` the CLI flattens) or are built in code from
//! [`SimConfig::default`]; [`SimConfig::validate`] turns bad values into a [`SimError`] naming
//! the flag before the server starts.

use super::engine::EngineConfig;
use super::listener::ListenerConfig;
use super::router::RouterConfig;
use super::SimError;

/// Default `--served-model-name`.
pub const DEFAULT_MODEL_NAME: &str = "inferq-sim";
/// Default `--ttft-ms`.
pub const DEFAULT_TTFT_MS: u64 = 20;
/// Default `--per-token-ms`.
pub const DEFAULT_PER_TOKEN_MS: f64 = 1.0;
/// Default `--default-tokens`.
pub const DEFAULT_OUTPUT_TOKENS: u64 = 16;
/// Default `--max-tokens-cap`.
pub const DEFAULT_MAX_TOKENS_CAP: u64 = 256;
/// Default `--retry-after-s`.
pub const DEFAULT_RETRY_AFTER_S: u64 = 1;
/// Default `--slow-ms`.
pub const DEFAULT_SLOW_MS: u64 = 1000;
/// Default `--remember-ids`.
pub const DEFAULT_REMEMBER_IDS: usize = 1_000_000;

/// How the simulated gateway behaves. Every field is a `--long-flag`; the defaults answer every
/// request successfully in about 36 ms, so a demo of 1,000 requests at concurrency 64 takes well
/// under a second of simulated inference.
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Model name reported in `/metrics` labels and `/v1/models`, and echoed when a request
    /// names no model.
    #[arg(long, default_value = DEFAULT_MODEL_NAME)]
    pub served_model_name: String,

    /// Simulated time to first token, in milliseconds, paid by every successful request.
    #[arg(long, default_value_t = DEFAULT_TTFT_MS)]
    pub ttft_ms: u64,

    /// Simulated decode time per output token, in milliseconds (fractions allowed).
    #[arg(long, default_value_t = DEFAULT_PER_TOKEN_MS)]
    pub per_token_ms: f64,

    /// Random spread of the total latency as a fraction in [0, 1]: 0.2 makes each request take
    /// between 80% and 120% of its nominal time.
    #[arg(long, default_value_t = 0.0)]
    pub jitter: f64,

    /// Output tokens generated when the request sets no `max_tokens`.
    #[arg(long, default_value_t = DEFAULT_OUTPUT_TOKENS)]
    pub default_tokens: u64,

    /// Upper bound on output tokens, whatever `max_tokens` the request asks for.
    #[arg(long, default_value_t = DEFAULT_MAX_TOKENS_CAP)]
    pub max_tokens_cap: u64,

    /// Requests that may run at once; one more is queued (see --queue) or refused with 429.
    /// 0 means unlimited.
    #[arg(long, default_value_t = 0)]
    pub capacity: usize,

    /// Requests allowed to wait for a free slot when all --capacity slots are busy, before new
    /// arrivals are refused with 429. Ignored when capacity is unlimited.
    #[arg(long, default_value_t = 0)]
    pub queue: usize,

    /// Seconds sent in the `Retry-After` header of every 429.
    #[arg(long, default_value_t = DEFAULT_RETRY_AFTER_S)]
    pub retry_after_s: u64,

    /// Probability in [0, 1] that an admitted request fails with 500 or 503 (even odds).
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,

    /// Probability in [0, 1] that an arriving request is refused with 429 and `Retry-After`,
    /// whatever the free capacity. Drawn before admission, so it never counts as an execution.
    #[arg(long, default_value_t = 0.0)]
    pub rate_limit_rate: f64,

    /// Probability in [0, 1] that a successful request is delayed by an extra --slow-ms.
    #[arg(long, default_value_t = 0.0)]
    pub slow_rate: f64,

    /// Extra delay, in milliseconds, of a request picked by --slow-rate.
    #[arg(long, default_value_t = DEFAULT_SLOW_MS)]
    pub slow_ms: u64,

    /// Probability in [0, 1] that an admitted request never answers: the connection stays open
    /// until the client gives up or the simulator stops.
    #[arg(long, default_value_t = 0.0)]
    pub hang_rate: f64,

    /// Probability in [0, 1] that an admitted request has its TCP connection reset instead of
    /// an answer.
    #[arg(long, default_value_t = 0.0)]
    pub reset_rate: f64,

    /// Probability in [0, 1] that an admitted request is answered 400 as if it were invalid.
    #[arg(long, default_value_t = 0.0)]
    pub bad_request_rate: f64,

    /// Request ids whose execution times are kept for `/executions` and `/arrivals`; past
    /// this, the ids seen first are forgotten (counted as `forgotten_ids` in `/stats`), so a
    /// long-running simulator stays bounded in memory (about 100 bytes an id).
    #[arg(long, default_value_t = DEFAULT_REMEMBER_IDS)]
    pub remember_ids: usize,

    /// The engine model (`--pods` and its knobs); off by default.
    #[command(flatten)]
    pub engine: EngineConfig,

    /// The router's flow control with priority bands and eviction (`--priority-bands`,
    /// `--eviction` and their knobs); off by default.
    #[command(flatten)]
    pub router: RouterConfig,

    /// How connections are bounded (`--header-read-timeout`, `--idle-timeout`,
    /// `--max-connections`).
    #[command(flatten)]
    pub listener: ListenerConfig,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            served_model_name: DEFAULT_MODEL_NAME.to_owned(),
            ttft_ms: DEFAULT_TTFT_MS,
            per_token_ms: DEFAULT_PER_TOKEN_MS,
            jitter: 0.0,
            default_tokens: DEFAULT_OUTPUT_TOKENS,
            max_tokens_cap: DEFAULT_MAX_TOKENS_CAP,
            capacity: 0,
            queue: 0,
            retry_after_s: DEFAULT_RETRY_AFTER_S,
            error_rate: 0.0,
            rate_limit_rate: 0.0,
            slow_rate: 0.0,
            slow_ms: DEFAULT_SLOW_MS,
            hang_rate: 0.0,
            reset_rate: 0.0,
            bad_request_rate: 0.0,
            remember_ids: DEFAULT_REMEMBER_IDS,
            engine: EngineConfig::default(),
            router: RouterConfig::default(),
            listener: ListenerConfig::default(),
        }
    }
}

impl SimConfig {
    /// A config with every latency knob at zero: answers as fast as the server can.
    pub fn instant() -> Self {
        Self {
            ttft_ms: 0,
            per_token_ms: 0.0,
            ..Self::default()
        }
    }

    /// Checks every knob, naming the first bad one.
    ///
    /// Rates and jitter must lie in [0, 1]. The faults that replace the answer of an admitted
    /// request (error, bad request, reset, hang) are drawn as one outcome, so their rates must
    /// add up to at most 1.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.served_model_name.trim().is_empty() {
            return Err(invalid("served-model-name", "must not be empty".into()));
        }
        if !self.per_token_ms.is_finite() || self.per_token_ms < 0.0 {
            return Err(invalid(
                "per-token-ms",
                format!("must be a finite number >= 0, got {}", self.per_token_ms),
            ));
        }
        if self.max_tokens_cap == 0 {
            return Err(invalid("max-tokens-cap", "must be at least 1".into()));
        }
        if self.remember_ids == 0 {
            return Err(invalid("remember-ids", "must be at least 1".into()));
        }
        if self.capacity > tokio::sync::Semaphore::MAX_PERMITS {
            return Err(invalid(
                "capacity",
                format!("must be at most {}", tokio::sync::Semaphore::MAX_PERMITS),
            ));
        }
        let fractions = [
            ("jitter", self.jitter),
            ("error-rate", self.error_rate),
            ("rate-limit-rate", self.rate_limit_rate),
            ("slow-rate", self.slow_rate),
            ("hang-rate", self.hang_rate),
            ("reset-rate", self.reset_rate),
            ("bad-request-rate", self.bad_request_rate),
        ];
        for (knob, value) in fractions {
            if !(0.0..=1.0).contains(&value) {
                return Err(invalid(
                    knob,
                    format!("must be between 0 and 1, got {value}"),
                ));
            }
        }
        self.listener
            .check()
            .map_err(|(knob, reason)| invalid(knob, reason))?;
        self.engine.validate()?;
        self.router
            .validate(self.engine.enabled(), self.engine.flow_control)?;
        if self.engine.enabled() {
            // The engines queue by themselves; a gate in front would hide their queues.
            if self.capacity > 0 {
                return Err(invalid("capacity", "cannot be combined with --pods".into()));
            }
            if self.queue > 0 {
                return Err(invalid("queue", "cannot be combined with --pods".into()));
            }
        }
        let exclusive = self.error_rate + self.bad_request_rate + self.reset_rate + self.hang_rate;
        // A little slack so that e.g. 0.1 + 0.2 + 0.7 is not refused for rounding.
        if exclusive > 1.0 + 1e-9 {
            return Err(invalid(
                "error-rate",
                format!(
                    "error-rate + bad-request-rate + reset-rate + hang-rate must be at most 1, \
                     got {exclusive}"
                ),
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
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimConfig,
    }

    #[test]
    fn clap_defaults_match_default_impl() {
        let parsed = Cli::parse_from(["sim"]).sim;
        let built = SimConfig::default();
        assert_eq!(format!("{parsed:?}"), format!("{built:?}"));
        assert!(built.validate().is_ok());
    }

    #[test]
    fn flags_parse_by_long_name() {
        let cfg = Cli::parse_from([
            "sim",
            "--ttft-ms",
            "5",
            "--per-token-ms",
            "0.5",
            "--capacity",
            "8",
            "--queue",
            "2",
            "--error-rate",
            "0.25",
            "--served-model-name",
            "m",
        ])
        .sim;
        assert_eq!(cfg.ttft_ms, 5);
        assert_eq!(cfg.per_token_ms, 0.5);
        assert_eq!(cfg.capacity, 8);
        assert_eq!(cfg.queue, 2);
        assert_eq!(cfg.error_rate, 0.25);
        assert_eq!(cfg.served_model_name, "m");
    }

    #[test]
    fn engine_flags_parse_by_long_name() {
        let cfg = Cli::parse_from([
            "sim",
            "--pods",
            "2",
            "--max-num-seqs",
            "8",
            "--time-factor-under-load",
            "3",
            "--flow-control",
            "--sheddable-objectives",
            "batch,bulk",
            "--saturation-metric-names",
            "both",
        ])
        .sim;
        assert_eq!(cfg.engine.pods, 2);
        assert_eq!(cfg.engine.max_num_seqs, 8);
        assert_eq!(cfg.engine.time_factor_under_load, 3.0);
        assert!(cfg.engine.flow_control);
        assert!(cfg.engine.is_sheddable("bulk"));
        assert!(!cfg.engine.is_sheddable("chat"));
        assert_eq!(
            cfg.engine.saturation_metric_names,
            crate::engine::SaturationMetricNames::Both
        );
        assert!(cfg.validate().is_ok());
    }

    fn knob_of(cfg: &SimConfig) -> Option<&'static str> {
        match cfg.validate() {
            Err(SimError::InvalidKnob { knob, .. }) => Some(knob),
            _ => None,
        }
    }

    #[test]
    fn out_of_range_knobs_are_named() {
        let bad = [
            (
                SimConfig {
                    error_rate: 1.5,
                    ..SimConfig::default()
                },
                "error-rate",
            ),
            (
                SimConfig {
                    hang_rate: -0.1,
                    ..SimConfig::default()
                },
                "hang-rate",
            ),
            (
                SimConfig {
                    jitter: f64::NAN,
                    ..SimConfig::default()
                },
                "jitter",
            ),
            (
                SimConfig {
                    per_token_ms: -1.0,
                    ..SimConfig::default()
                },
                "per-token-ms",
            ),
            (
                SimConfig {
                    max_tokens_cap: 0,
                    ..SimConfig::default()
                },
                "max-tokens-cap",
            ),
            (
                SimConfig {
                    served_model_name: " ".into(),
                    ..SimConfig::default()
                },
                "served-model-name",
            ),
            (
                SimConfig {
                    error_rate: 0.6,
                    reset_rate: 0.6,
                    ..SimConfig::default()
                },
                "error-rate",
            ),
        ];
        let with_pods = |engine: EngineConfig| SimConfig {
            engine: EngineConfig { pods: 1, ..engine },
            ..SimConfig::default()
        };
        let bad_engines = [
            (
                with_pods(EngineConfig {
                    max_num_seqs: 0,
                    ..EngineConfig::default()
                }),
                "max-num-seqs",
            ),
            (
                with_pods(EngineConfig {
                    time_factor_under_load: 0.5,
                    ..EngineConfig::default()
                }),
                "time-factor-under-load",
            ),
            (
                with_pods(EngineConfig {
                    inter_token_latency_ms: -1.0,
                    ..EngineConfig::default()
                }),
                "inter-token-latency-ms",
            ),
            (
                with_pods(EngineConfig {
                    prefill_overhead_ms: f64::NAN,
                    ..EngineConfig::default()
                }),
                "prefill-overhead-ms",
            ),
            (
                with_pods(EngineConfig {
                    prefill_time_per_token_ms: -0.1,
                    ..EngineConfig::default()
                }),
                "prefill-time-per-token-ms",
            ),
            (
                with_pods(EngineConfig {
                    kv_cache_tokens: Some(0),
                    ..EngineConfig::default()
                }),
                "kv-cache-tokens",
            ),
            (
                SimConfig {
                    capacity: 4,
                    ..with_pods(EngineConfig::default())
                },
                "capacity",
            ),
            (
                SimConfig {
                    queue: 4,
                    ..with_pods(EngineConfig::default())
                },
                "queue",
            ),
        ];
        for (cfg, knob) in bad.into_iter().chain(bad_engines) {
            assert_eq!(knob_of(&cfg), Some(knob), "{cfg:?}");
        }
        let fine = SimConfig {
            error_rate: 0.1,
            bad_request_rate: 0.2,
            reset_rate: 0.7,
            slow_rate: 1.0,
            rate_limit_rate: 1.0,
            ..SimConfig::default()
        };
        assert_eq!(knob_of(&fine), None);
    }
}
