//! The engine model's knobs: how many engines, how each batches and paces its steps, and what the
//! router in front of them refuses. They enter as flags flattened into [`crate::SimConfig`]
//! (`--pods`, `--max-num-seqs`, …); [`EngineConfig::validate`] names the first bad one before the
//! server starts, and the pool reads them once at start.

use std::time::Duration;

use crate::SimError;

/// Default `--max-num-seqs`.
pub(super) const DEFAULT_MAX_NUM_SEQS: usize = 16;
/// Default `--inter-token-latency-ms`.
pub(super) const DEFAULT_INTER_TOKEN_LATENCY_MS: f64 = 12.0;
/// Default `--time-factor-under-load`.
pub(super) const DEFAULT_TIME_FACTOR_UNDER_LOAD: f64 = 2.0;
/// Default `--prefill-overhead-ms`.
pub(super) const DEFAULT_PREFILL_OVERHEAD_MS: f64 = 10.0;
/// Default `--prefill-time-per-token-ms`.
pub(super) const DEFAULT_PREFILL_TIME_PER_TOKEN_MS: f64 = 0.05;
/// KV-cache tokens per sequence slot when `--kv-cache-tokens` is not given.
pub(super) const DEFAULT_KV_TOKENS_PER_SEQ: u64 = 1024;
/// Default `--inference-pool`.
pub(super) const DEFAULT_INFERENCE_POOL: &str = "inferq-sim";
/// Default `--sheddable-objectives`.
pub(super) const DEFAULT_SHEDDABLE_OBJECTIVE: &str = "batch";

/// Which name the router's saturation gauge is exported under (it was renamed in llm-d).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum SaturationMetricNames {
    /// `llm_d_epp_flow_control_pool_saturation{inference_pool, stage="effective"}`.
    #[default]
    New,
    /// Only the deprecated `inference_extension_flow_control_pool_saturation{inference_pool}`.
    Old,
    /// Both, for routers on either side of the rename.
    Both,
}

/// A pool of simulated vLLM engines behind one port, and the router in front of them. Off
/// (`--pods 0`) unless asked for: then the fixed-latency simulator answers as before.
///
/// In engine mode the fault knobs (`--error-rate` and the other rates, `--slow-*`, `--jitter`,
/// `--ttft-ms`, `--per-token-ms`) are ignored: latency comes from the step model alone.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct EngineConfig {
    /// Simulated vLLM engines behind the one port (0 = off: the fixed-latency simulator). Cannot
    /// be combined with --capacity or --queue; fault rates are ignored in engine mode.
    #[arg(long, default_value_t = 0)]
    pub pods: usize,

    /// Sequences one engine runs at once; more wait in its FIFO queue.
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,

    /// Base length of one decode step (one token for every running sequence), in milliseconds.
    #[arg(long, default_value_t = DEFAULT_INTER_TOKEN_LATENCY_MS)]
    pub inter_token_latency_ms: f64,

    /// How much slower a step is with --max-num-seqs sequences running than with one (>= 1).
    #[arg(long, default_value_t = DEFAULT_TIME_FACTOR_UNDER_LOAD)]
    pub time_factor_under_load: f64,

    /// Extra time of a step that admits any sequence, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_PREFILL_OVERHEAD_MS)]
    pub prefill_overhead_ms: f64,

    /// Extra time per prompt token of the sequences a step admits, in milliseconds.
    #[arg(long, default_value_t = DEFAULT_PREFILL_TIME_PER_TOKEN_MS)]
    pub prefill_time_per_token_ms: f64,

    /// Requests one engine lets wait beyond its free slots before the router answers 429
    /// `rejected-saturated` (0 = unbounded, as vLLM).
    #[arg(long, default_value_t = 0)]
    pub max_waiting: usize,

    /// KV-cache capacity of one engine in tokens (default: --max-num-seqs × 1024).
    #[arg(long)]
    pub kv_cache_tokens: Option<u64>,

    /// Router flow control: shed requests of a --sheddable-objectives objective with 429
    /// `rejected-saturated` while the pool's saturation is at least 1.0.
    #[arg(long, default_value_t = false)]
    pub flow_control: bool,

    /// Objectives (values of the `x-llm-d-inference-objective` header) that --flow-control may
    /// shed, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_SHEDDABLE_OBJECTIVE)]
    pub sheddable_objectives: Vec<String>,

    /// The `inference_pool` label of the saturation gauge.
    #[arg(long, default_value = DEFAULT_INFERENCE_POOL)]
    pub inference_pool: String,

    /// Under which name the saturation gauge is exported: new, old or both.
    #[arg(long, value_enum, default_value_t = SaturationMetricNames::New)]
    pub saturation_metric_names: SaturationMetricNames,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            pods: 0,
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            inter_token_latency_ms: DEFAULT_INTER_TOKEN_LATENCY_MS,
            time_factor_under_load: DEFAULT_TIME_FACTOR_UNDER_LOAD,
            prefill_overhead_ms: DEFAULT_PREFILL_OVERHEAD_MS,
            prefill_time_per_token_ms: DEFAULT_PREFILL_TIME_PER_TOKEN_MS,
            max_waiting: 0,
            kv_cache_tokens: None,
            flow_control: false,
            sheddable_objectives: vec![DEFAULT_SHEDDABLE_OBJECTIVE.to_owned()],
            inference_pool: DEFAULT_INFERENCE_POOL.to_owned(),
            saturation_metric_names: SaturationMetricNames::New,
        }
    }
}

impl EngineConfig {
    /// Whether the engine model answers (`--pods` ≥ 1).
    pub fn enabled(&self) -> bool {
        self.pods > 0
    }

    /// One engine's KV-cache capacity in tokens.
    pub fn kv_capacity(&self) -> u64 {
        self.kv_cache_tokens
            .unwrap_or(self.max_num_seqs as u64 * DEFAULT_KV_TOKENS_PER_SEQ)
    }

    /// How long a step takes with `running` sequences in it, `admitted_prompt_tokens` of which
    /// were admitted at its start (`admitted` tells whether any were).
    pub fn step_length(
        &self,
        running: usize,
        admitted: bool,
        admitted_prompt_tokens: u64,
    ) -> Duration {
        let load = if self.max_num_seqs > 1 && running > 1 {
            (running - 1) as f64 / (self.max_num_seqs - 1) as f64
        } else {
            0.0
        };
        let factor = 1.0 + (self.time_factor_under_load - 1.0) * load;
        let mut ms = self.inter_token_latency_ms * factor;
        if admitted {
            ms += self.prefill_overhead_ms
                + self.prefill_time_per_token_ms * admitted_prompt_tokens as f64;
        }
        Duration::from_secs_f64(ms.max(0.0) / 1000.0)
    }

    /// Whether a request naming `objective` may be shed by flow control.
    pub fn is_sheddable(&self, objective: &str) -> bool {
        self.sheddable_objectives
            .iter()
            .any(|o| o.trim() == objective.trim() && !o.trim().is_empty())
    }

    /// Checks every engine knob, naming the first bad one.
    pub fn validate(&self) -> Result<(), SimError> {
        if self.max_num_seqs == 0 {
            return Err(invalid("max-num-seqs", "must be at least 1".into()));
        }
        let times = [
            ("inter-token-latency-ms", self.inter_token_latency_ms),
            ("prefill-overhead-ms", self.prefill_overhead_ms),
            ("prefill-time-per-token-ms", self.prefill_time_per_token_ms),
        ];
        for (knob, value) in times {
            if !value.is_finite() || value < 0.0 {
                return Err(invalid(
                    knob,
                    format!("must be a finite number >= 0, got {value}"),
                ));
            }
        }
        if !self.time_factor_under_load.is_finite() || self.time_factor_under_load < 1.0 {
            return Err(invalid(
                "time-factor-under-load",
                format!(
                    "must be a finite number >= 1, got {}",
                    self.time_factor_under_load
                ),
            ));
        }
        if self.kv_cache_tokens == Some(0) {
            return Err(invalid("kv-cache-tokens", "must be at least 1".into()));
        }
        if self.inference_pool.trim().is_empty() {
            return Err(invalid("inference-pool", "must not be empty".into()));
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
    fn a_full_batch_steps_time_factor_times_slower_than_one_sequence() {
        let cfg = EngineConfig {
            max_num_seqs: 5,
            inter_token_latency_ms: 10.0,
            time_factor_under_load: 3.0,
            ..EngineConfig::default()
        };
        assert_eq!(cfg.step_length(1, false, 0), Duration::from_millis(10));
        assert_eq!(cfg.step_length(3, false, 0), Duration::from_millis(20));
        assert_eq!(cfg.step_length(5, false, 0), Duration::from_millis(30));
        // Prefill: 10 ms once, plus 0.05 ms a prompt token.
        assert_eq!(cfg.step_length(1, true, 200), Duration::from_millis(30));
    }

    #[test]
    fn kv_capacity_defaults_to_1024_tokens_a_slot() {
        let cfg = EngineConfig {
            max_num_seqs: 4,
            ..EngineConfig::default()
        };
        assert_eq!(cfg.kv_capacity(), 4096);
        let set = EngineConfig {
            kv_cache_tokens: Some(10),
            ..cfg
        };
        assert_eq!(set.kv_capacity(), 10);
    }
}
