//! The engine model's Prometheus text, appended to the simulator's `/metrics` page: per engine
//! (labels `model_name` and `pod="engine-<i>"`) vLLM's request gauges, KV-cache usage and latency
//! histograms; for the router, the flow-control saturation gauge under the name(s) chosen by
//! `--saturation-metric-names`. It reads the pool's engines and writes text; nothing else.

use std::fmt::Write as _;

use super::{EngineLoad, Pool, SaturationMetricNames};

/// Reads one gauge's value from an engine's load.
type ReadGauge = fn(&EngineLoad) -> f64;

/// Escapes a label value (backslash, double quote, newline) for the text exposition format.
pub(super) fn label_value(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Pool {
    /// Appends the engines' and the router's metrics for `model_name` to `out`.
    pub(crate) fn render_prometheus(&self, model_name: &str, out: &mut String) {
        let model = label_value(model_name);
        let labels: Vec<String> = (0..self.engines.len())
            .map(|i| format!("model_name=\"{model}\",pod=\"engine-{i}\""))
            .collect();
        let snapshot = self.snapshot();
        let gauges: [(&str, &str, ReadGauge); 3] = [
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                |l| l.running as f64,
            ),
            (
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                |l| l.waiting as f64,
            ),
            (
                "vllm:kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                |l| l.kv_cache_usage,
            ),
        ];
        // Writing to a String cannot fail.
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (load, labels) in snapshot.engines.iter().zip(&labels) {
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(load));
            }
        }
        let histograms: [(&str, &str, usize); 3] = [
            (
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                0,
            ),
            (
                "vllm:inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
                1,
            ),
            (
                "vllm:e2e_request_latency_seconds",
                "Histogram of end to end request latency in seconds.",
                2,
            ),
        ];
        for (name, help, which) in histograms {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (engine, labels) in self.engines.iter().zip(&labels) {
                let latencies = &engine.latencies;
                let histogram = match which {
                    0 => &latencies.ttft,
                    1 => &latencies.itl,
                    _ => &latencies.e2e,
                };
                histogram.render(out, name, labels);
            }
        }
        let pool = label_value(&self.cfg.inference_pool);
        if let Some(flow) = self.flow() {
            flow.render(&pool, &model, out);
        }
        let names = self.cfg.saturation_metric_names;
        if matches!(
            names,
            SaturationMetricNames::New | SaturationMetricNames::Both
        ) {
            let name = "llm_d_epp_flow_control_pool_saturation";
            let _ = writeln!(
                out,
                "# HELP {name} Saturation of the inference pool (1.0 is the set point).\n\
                 # TYPE {name} gauge\n\
                 {name}{{inference_pool=\"{pool}\",stage=\"effective\"}} {}",
                snapshot.saturation
            );
        }
        if matches!(
            names,
            SaturationMetricNames::Old | SaturationMetricNames::Both
        ) {
            let name = "inference_extension_flow_control_pool_saturation";
            let _ = writeln!(
                out,
                "# HELP {name} Saturation of the inference pool (deprecated name).\n\
                 # TYPE {name} gauge\n\
                 {name}{{inference_pool=\"{pool}\"}} {}",
                snapshot.saturation
            );
        }
    }
}
