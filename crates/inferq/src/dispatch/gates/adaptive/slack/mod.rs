//! `slack`: inferq's own pool gate, which fills the spare capacity of an inference pool without a
//! threshold tuned by hand. Its [`Controller`](control::Controller) keeps a window of requests
//! at the gateway, moved once per control period (`interval`) by a standing queue seen on a
//! scraped page (`signal_url`) or, without one, by its own requests' latency per output token;
//! rejections cut it as in `aimd`.
//!
//! A request enters [`Slack::apply`]: it takes a slot (waiting for one while the window is full)
//! and leaves with a release that hands the answer's [`Feedback`] to the controller, and a
//! preemption token the controller fires to take the room back at once when a queue stands
//! (the worker aborts the request and puts it back, unchanged). The period's work — reading the
//! signal, moving the window, preempting — runs on a task started by the first request, which
//! ends with the gate. When the signal cannot be read, the gate steers by delay and says so in
//! `inferq_slack_signal_available` and one log line.

mod control;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;

pub use control::{Controller, Settings, Steer};

use super::signal::{Reading, Signal};
use super::slots::wait_for_slot;
use super::{classify, factor, max_window, min_window, param};
use crate::config::gate_params::Params;
use crate::dispatch::gates::{
    Decision, Feedback, Gate, GateEnv, GateError, GateInput, Release, Verdict,
};
use crate::ops::feedback_metrics::FloatGauge;
use crate::ops::metrics::PoolLabels;

const GATE: &str = "slack";

/// Builds a `slack` gate.
pub fn build(p: Params<'_>, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let settings = settings(&p, env)?;
    let signal = signal(&p)?;
    let series = env.owner.as_ref().map(|owner| {
        let m = &owner.metrics.feedback;
        let labels = PoolLabels {
            pool_name: owner.labels.pool_name.clone(),
        };
        Series {
            window: m.slack_window.get_or_create(&labels).clone(),
            inflight: m.slack_inflight.get_or_create(&labels).clone(),
            signal: m.slack_signal.get_or_create(&labels).clone(),
            available: m.slack_signal_available.get_or_create(&labels).clone(),
            capacity: m.slack_capacity.get_or_create(&labels).clone(),
            others: m.slack_others.get_or_create(&labels).clone(),
            baseline: m.slack_baseline.get_or_create(&labels).clone(),
            latency: m.slack_latency.get_or_create(&labels).clone(),
            preempted: m.slack_preempted.get_or_create(&labels).clone(),
        }
    });
    let gate = Arc::new(Slack {
        interval: settings.interval,
        control: Mutex::new(Controller::new(settings, Instant::now())),
        room: Notify::new(),
        signal,
        signal_down: AtomicBool::new(false),
        started: AtomicBool::new(false),
        series,
    });
    gate.publish();
    Ok(Arc::new(gate))
}

/// Reads the controller's settings; every default works with only `max_window` set (or none:
/// the pool's workers).
fn settings(p: &Params<'_>, env: &GateEnv) -> Result<Settings, GateError> {
    let max_window = max_window(p, env, None)?;
    let min_window = min_window(p, max_window)?;
    let positive = |name: &str, v: f64| {
        if v > 0.0 && v.is_finite() {
            Ok(v)
        } else {
            Err(param(GATE, name, format!("must be > 0, got {v}")))
        }
    };
    let non_negative = |name: &str, v: f64| {
        if v >= 0.0 && v.is_finite() {
            Ok(v)
        } else {
            Err(param(GATE, name, format!("must be ≥ 0, got {v}")))
        }
    };
    let interval = p.duration_or("interval", Duration::from_millis(250))?;
    if interval < Duration::from_millis(10) {
        return Err(param(
            GATE,
            "interval",
            format!("must be ≥ 10ms, got {interval:?}"),
        ));
    }
    let memory = p.duration_or("memory", Duration::from_secs(5))?;
    if memory < interval {
        return Err(param(
            GATE,
            "memory",
            "must be at least interval".to_owned(),
        ));
    }
    let tolerance = p.float_or("latency_tolerance", 1.8)?;
    if tolerance.is_nan() || tolerance <= 1.0 {
        return Err(param(
            GATE,
            "latency_tolerance",
            format!("must be > 1, got {tolerance}"),
        ));
    }
    let preempt = match p.string_or("preempt", "true").as_str() {
        "true" => true,
        "false" => false,
        other => {
            return Err(param(
                GATE,
                "preempt",
                format!("must be true or false, got {other:?}"),
            ))
        }
    };
    Ok(Settings {
        min_window,
        max_window,
        signal_target: non_negative("signal_target", p.float_or("signal_target", 0.0)?)?,
        interval,
        headroom: non_negative("headroom", p.float_or("headroom", 2.0)?)?,
        memory,
        latency_tolerance: tolerance,
        increase: positive("increase", p.float_or("increase", 1.0)?)?,
        decrease_factor: factor(p, "decrease_factor", 0.7)?,
        preempt,
    })
}

/// The signal, when `signal_url` is given.
fn signal(p: &Params<'_>) -> Result<Option<Signal>, GateError> {
    let Some(url) = p.string("signal_url") else {
        return Ok(None);
    };
    let url = reqwest::Url::parse(&url)
        .map_err(|e| param(GATE, "signal_url", format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(param(
            GATE,
            "signal_url",
            "must be http or https".to_owned(),
        ));
    }
    let mut labels = p.string_map("signal_labels")?;
    labels.sort();
    Ok(Some(Signal {
        url,
        metric: p.string_or("signal_metric", "vllm:num_requests_waiting"),
        running_metric: p.string_or("running_metric", "vllm:num_requests_running"),
        labels,
    }))
}

/// The gate's series (a gate built without an owner, in tests, has none).
struct Series {
    window: FloatGauge,
    inflight: Gauge,
    signal: FloatGauge,
    available: Gauge,
    capacity: FloatGauge,
    others: FloatGauge,
    baseline: FloatGauge,
    latency: FloatGauge,
    preempted: Counter,
}

/// The gate.
pub struct Slack {
    control: Mutex<Controller>,
    /// Woken when a slot frees or the window moves.
    room: Notify,
    interval: Duration,
    signal: Option<Signal>,
    /// The signal failed at its last read (logged once per outage).
    signal_down: AtomicBool,
    /// The period task was started.
    started: AtomicBool,
    series: Option<Series>,
}

impl std::fmt::Debug for Slack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slack").finish_non_exhaustive()
    }
}

impl Slack {
    fn lock(&self) -> std::sync::MutexGuard<'_, Controller> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the gauges from the controller.
    fn publish(&self) {
        let Some(s) = &self.series else { return };
        let c = self.lock();
        s.window.set(c.window);
        s.inflight.set(c.inflight() as i64);
        s.capacity.set(c.capacity.unwrap_or(0.0));
        s.others.set(c.others);
        s.baseline.set(c.baseline().unwrap_or(0.0));
        s.latency.set(c.latency().unwrap_or(0.0));
        s.signal.set(c.reading.map_or(0.0, |(_, r)| r.waiting));
        s.available.set(i64::from(c.steer == Steer::Queue));
    }

    /// Starts the period task on the first request (a gate is built before the runtime serves
    /// anything, and one that is never used costs nothing).
    fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let weak = Arc::downgrade(self);
        tokio::spawn(periods(weak, self.interval));
    }

    /// One control period, with the signal's read (`None` when there is no signal).
    fn period(&self, read: Option<Result<Reading, String>>) {
        let reading = match read {
            Some(Ok(r)) => {
                if self.signal_down.swap(false, Ordering::AcqRel) {
                    tracing::info!(
                        gate = GATE,
                        "slack gate: signal_url answers again; steering by its queue"
                    );
                }
                Some(r)
            }
            Some(Err(e)) => {
                if !self.signal_down.swap(true, Ordering::AcqRel) {
                    tracing::warn!(gate = GATE, error = %e, "slack gate: cannot read signal_url; steering by latency until it answers (inferq_slack_signal_available 0)");
                }
                None
            }
            None => None,
        };
        let preempt = self.lock().tick(reading, Instant::now());
        if let Some(s) = &self.series {
            s.preempted.inc_by(preempt.len() as u64);
        }
        for token in preempt {
            token.cancel();
        }
        self.publish();
        self.room.notify_waiters();
    }

    /// The slot's release: hands the answer to the controller.
    fn release(self: &Arc<Self>, seq: u64) -> Release {
        let gate = self.clone();
        Release::observing(move |feedback: Option<&Feedback>| {
            let answer = feedback.map(|f| {
                let tokens = f.output_tokens().unwrap_or(1).max(1);
                let per_token = f.elapsed.as_secs_f64() / tokens as f64;
                (classify(f), f.sent_at, f.retry_after, per_token)
            });
            gate.lock().settle(seq, answer, Instant::now());
            gate.publish();
            gate.room.notify_waiters();
            Box::pin(std::future::ready(()))
        })
    }
}

/// The period task: every `interval`, read the signal and steer, until the gate is gone.
async fn periods(gate: Weak<Slack>, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(gate) = gate.upgrade() else { return };
        let read = match &gate.signal {
            Some(signal) => Some(signal.read(interval.max(Duration::from_millis(500))).await),
            None => None,
        };
        gate.period(read);
    }
}

impl Gate for Arc<Slack> {
    fn budget(&self) -> BoxFuture<'_, f64> {
        let c = self.lock();
        let free = ((c.window - c.inflight() as f64) / c.window).clamp(0.0, 1.0);
        Box::pin(std::future::ready(free))
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            self.start();
            let taken = wait_for_slot(&self.room, || self.lock().admit(Instant::now())).await;
            let Some((seq, preempt)) = taken else {
                return Ok(Decision::verdict(Verdict::Wait));
            };
            self.publish();
            let mut decision = Decision::go();
            decision.releases.push(self.release(seq));
            decision.preempt = Some(preempt);
            Ok(decision)
        })
    }
}
