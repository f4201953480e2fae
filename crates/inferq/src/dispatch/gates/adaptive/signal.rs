//! The `slack` gate's signal: a Prometheus text page (`signal_url`, the engines' or the
//! router's `/metrics`) read once per control period. A read leaves as a [`Reading`]: the sum of
//! `signal_metric` over its matching series (the pool's standing queue), how many of those series
//! (engines) show a queue, and, when the page has it, the sum of `running_metric` (what the
//! pool runs); or as the reason there is none.

use std::time::Duration;

use crate::dispatch::gates::metric::scrape_series;

/// One read of the page.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// `signal_metric`, summed: requests waiting in the pool.
    pub waiting: f64,
    /// `running_metric`, summed, when the page has it: sequences the pool runs.
    pub running: Option<f64>,
    /// Series of `signal_metric` (engines, on an engines' page), and how many show a queue.
    pub series: usize,
    pub queued_series: usize,
}

impl Reading {
    /// A reading of one series (a router's page, or a test's).
    pub fn pooled(waiting: f64, running: Option<f64>) -> Reading {
        Reading {
            waiting,
            running,
            series: 1,
            queued_series: usize::from(waiting > 0.0),
        }
    }
}

/// Where and what the signal reads.
#[derive(Debug, Clone)]
pub(super) struct Signal {
    pub url: reqwest::Url,
    pub metric: String,
    pub running_metric: String,
    pub labels: Vec<(String, String)>,
}

impl Signal {
    /// Reads the page once, within `timeout`.
    pub(super) async fn read(&self, timeout: Duration) -> Result<Reading, String> {
        let families = [self.metric.as_str(), self.running_metric.as_str()];
        let series = scrape_series(&self.url, &families, &self.labels, timeout).await?;
        let waiting = series.first().filter(|v| !v.is_empty()).ok_or_else(|| {
            format!(
                "{}: no series of {} matches {:?}",
                crate::config::redact_url(self.url.as_str()),
                self.metric,
                self.labels
            )
        })?;
        Ok(Reading {
            waiting: waiting.iter().sum(),
            running: series
                .get(1)
                .filter(|v| !v.is_empty())
                .map(|v| v.iter().sum()),
            series: waiting.len(),
            queued_series: waiting.iter().filter(|w| **w > 0.0).count(),
        })
    }
}
