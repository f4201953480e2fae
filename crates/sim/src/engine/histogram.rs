//! A Prometheus histogram of durations with fixed buckets, kept in atomics so an engine's step
//! loop records into it without a lock and `/metrics` reads it at any time. Durations enter
//! through [`Histogram::observe`]; they leave as `_bucket`/`_sum`/`_count` lines from
//! [`Histogram::render`].

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of `vllm:time_to_first_token_seconds` (vLLM's, which start at 1 ms).
pub(super) const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// Upper bounds of `vllm:inter_token_latency_seconds` (vLLM's, with finer ones below 10 ms).
pub(super) const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
    0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
];
/// Upper bounds of `vllm:e2e_request_latency_seconds` (vLLM's, with finer ones below 300 ms).
pub(super) const E2E_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
];

/// Counts of observed durations per bucket, their sum and their number.
#[derive(Debug)]
pub(super) struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative; the last is `+Inf`'s own).
    counts: Vec<AtomicU64>,
    /// Sum of observations in microseconds, so it adds up exactly in an integer.
    sum_us: AtomicU64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending, in seconds).
    pub(super) fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// Records one duration.
    pub(super) fn observe(&self, value: Duration) {
        let secs = value.as_secs_f64();
        let bucket = self
            .bounds
            .iter()
            .position(|&bound| secs <= bound)
            .unwrap_or(self.bounds.len());
        if let Some(count) = self.counts.get(bucket) {
            count.fetch_add(1, Relaxed);
        }
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// Appends the `_bucket`, `_sum` and `_count` samples of `name` with `labels` (already
    /// rendered, e.g. `model_name="m",pod="engine-0"`).
    pub(super) fn render(&self, out: &mut String, name: &str, labels: &str) {
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count.load(Relaxed);
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            // Writing to a String cannot fail.
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let sum = self.sum_us.load(Relaxed) as f64 / 1e6;
        let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}");
        let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_end_with_inf() {
        let h = Histogram::new(&[0.01, 0.1]);
        h.observe(Duration::from_millis(5));
        h.observe(Duration::from_millis(50));
        h.observe(Duration::from_secs(2));
        let mut out = String::new();
        h.render(&mut out, "x_seconds", "pod=\"p\"");
        assert!(
            out.contains("x_seconds_bucket{pod=\"p\",le=\"0.01\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{pod=\"p\",le=\"0.1\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("x_seconds_bucket{pod=\"p\",le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("x_seconds_sum{pod=\"p\"} 2.055\n"), "{out}");
        assert!(out.contains("x_seconds_count{pod=\"p\"} 3\n"), "{out}");
    }
}
