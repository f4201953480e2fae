//! Hot reload of the queues (Go's `--transport-config-watch-interval`, go-newer §5, plus
//! SIGHUP): [`watch`] reads the transport config file once at once and then every tick, and
//! whenever a SIGHUP arrives (even with no interval); what it read goes through
//! [`ReloadSource::check`] (unchanged, refused, or new valid queues) and new queues through
//! [`Lanes::apply`]. Any refusal or failure keeps the running queues and is logged and counted
//! (`llm_d_async_async_queue_config_reloads_total{result="error"}`); an applied reload logs
//! `Applied queues config reload` with the queues `added` and `removed` (and `changed`), and
//! counts and timestamps the success.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::gates::{Gate, GateError};
use super::lanes::Lanes;
use crate::config::reload::{Checked, ReloadError, ReloadSource};
use crate::config::QueueConfig;
use crate::ops::metrics::ResultLabels;
use crate::ops::Metrics;

/// Builds a new or changed queue's gate (with the queue as owner of its metrics).
pub type GateFactory =
    Arc<dyn Fn(&QueueConfig) -> Result<Option<Arc<dyn Gate>>, GateError> + Send + Sync>;

/// What a reload works with: the file, the running lanes, and how to build a queue's gate.
pub struct Reloader {
    pub source: ReloadSource,
    /// Shared with `fair-share`'s discovery, which adds the queues it finds.
    pub lanes: Arc<std::sync::Mutex<Lanes>>,
    pub gates: GateFactory,
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

/// Reloads at once and every `interval` (when set), and at every SIGHUP `hangups` brings,
/// until `stop`.
pub async fn watch(
    mut reloader: Reloader,
    interval: Option<Duration>,
    mut hangups: Option<mpsc::Receiver<()>>,
    stop: CancellationToken,
) {
    // An interval's first tick is at once: Go reloads once when the watch starts.
    let mut ticks = interval.map(|every| {
        let mut ticks = tokio::time::interval(every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticks
    });
    loop {
        let forced = tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            hangup = next_hangup(&mut hangups) => match hangup {
                Some(()) => {
                    tracing::info!(path = %reloader.source.path().display(), "SIGHUP: reloading the queues config");
                    true
                }
                None => {
                    hangups = None;
                    continue;
                }
            },
            _ = next_tick(&mut ticks) => false,
        };
        reloader.reload(forced);
    }
}

async fn next_tick(ticks: &mut Option<tokio::time::Interval>) {
    match ticks {
        Some(ticks) => {
            ticks.tick().await;
        }
        None => std::future::pending().await,
    }
}

async fn next_hangup(hangups: &mut Option<mpsc::Receiver<()>>) -> Option<()> {
    match hangups {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

impl Reloader {
    /// One reload: read, check, apply. `forced` (SIGHUP) reads a file whose text has not
    /// changed since the last read too.
    pub fn reload(&mut self, forced: bool) {
        let path = self.source.path().display().to_string();
        let candidate = match self.source.check(forced) {
            Ok(Checked::Unchanged) => {
                if forced {
                    tracing::info!(%path, "queues config unchanged; nothing to reload");
                }
                return;
            }
            Ok(Checked::Queues(candidate)) => candidate,
            Err(ReloadError::RestartRequired { field }) => {
                tracing::error!(%path, %field, "Rejected transport config reload; restart required");
                self.count("error");
                return;
            }
            Err(e) => {
                tracing::error!(%path, error = %e, "Rejected transport config reload; the running queues stay");
                self.count("error");
                return;
            }
        };
        for warning in &candidate.warnings {
            tracing::warn!("{warning}");
        }
        let gates = &self.gates;
        let applied = self
            .lanes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .apply(&candidate.queues, |q| gates(q));
        match applied {
            Ok(change) => {
                tracing::info!(
                    %path,
                    added = ?change.added,
                    removed = ?change.removed,
                    changed = ?change.changed,
                    queues = candidate.queues.len(),
                    "Applied queues config reload"
                );
                self.count("success");
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                self.metrics.config_last_success.set(now);
                self.source.applied(candidate);
            }
            Err((field, e)) => {
                let error = format!("invalid config: {field}: {e}");
                tracing::error!(%path, %error, "Rejected transport config reload; the running queues stay");
                self.count("error");
            }
        }
    }

    fn count(&self, result: &str) {
        self.metrics
            .config_reloads
            .get_or_create(&ResultLabels {
                result: result.to_owned(),
            })
            .inc();
    }
}
