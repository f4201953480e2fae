//! Latency summaries: samples in microseconds go in, a [`Latency`] of nearest-rank p50 / p99
//! and the maximum in milliseconds comes out.

use serde::Serialize;

/// p50, p99 and max of a set of latencies, in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Latency {
    pub samples: u64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// Summarises samples given in microseconds (any order).
    pub fn from_us(mut samples: Vec<u64>) -> Latency {
        samples.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        Latency {
            samples: samples.len() as u64,
            p50_ms: percentile(&samples, 0.50).map_or(0.0, ms),
            p99_ms: percentile(&samples, 0.99).map_or(0.0, ms),
            max_ms: samples.last().copied().map_or(0.0, ms),
        }
    }
}

/// The nearest-rank percentile of sorted samples.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_in_milliseconds() {
        let l = Latency::from_us((1..=100).rev().map(|i| i * 1000).collect());
        assert_eq!(l.samples, 100);
        assert_eq!(l.p50_ms, 50.0);
        assert_eq!(l.p99_ms, 99.0);
        assert_eq!(l.max_ms, 100.0);
        assert_eq!(Latency::from_us(vec![]), Latency::default());
    }
}
