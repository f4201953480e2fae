//! `aimd`: Go's proposed feedback gate (go-aimd §1), with Go's parameters, so a Go user's config
//! works. One congestion window per band — reserved/overflow × interactive/async/batch, highest
//! first — grown on accepted answers (slow start, then additive) and cut on the router's capacity
//! rejections, at most once per flight; `Retry-After` closes the band and the bands below it.
//!
//! A request enters [`Aimd::apply`] and takes a slot of its band's window; a full or closed band
//! makes a reserved request wait and refuses an overflow one back to the queue (its redelivery is
//! the band's probe). The slot leaves through its release with the answer's
//! [`Feedback`](crate::dispatch::gates::Feedback), which [`Bands::settle`] turns into the band's
//! next window. [`Bands`] is plain state with the time passed in, so its reactions are tested
//! without a clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tokio::sync::Notify;

use super::slots::wait_for_slot;
use super::{classify, factor, max_window, min_window, param, Answer};
use crate::config::gate_params::Params;
use crate::dispatch::gates::basic::{CLASSIFICATION, RESERVED};
use crate::dispatch::gates::{
    Decision, Feedback, Gate, GateEnv, GateError, GateInput, Release, Verdict,
};
use crate::ops::feedback_metrics::{BandLabels, BandOutcomeLabels, FloatGauge};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

const GATE: &str = "aimd";

/// The gentle decrease of an expired request (go-aimd §1).
const GENTLE: f64 = 0.9;

/// The bands, highest first (the `tier-priority` merge policy's lane order).
pub const BANDS: [&str; 6] = [
    "reserved-interactive",
    "reserved-async",
    "reserved-batch",
    "overflow-interactive",
    "overflow-async",
    "overflow-batch",
];

/// The band of a request: its classification (`reserved`, else overflow) and its tier (an unknown
/// one counts as batch).
pub fn band_of(classification: Option<&str>, tier: Option<&str>) -> usize {
    let tier = match tier {
        Some("interactive") => 0,
        Some("async") => 1,
        _ => 2,
    };
    if classification == Some(RESERVED) {
        tier
    } else {
        3 + tier
    }
}

/// The gate's parameters (go-aimd §1's table).
#[derive(Debug, Clone)]
pub struct AimdParams {
    pub min_window: f64,
    pub max_window: f64,
    pub increase: f64,
    pub decrease_factor: f64,
    pub hold: Duration,
    pub tier_label: String,
}

impl AimdParams {
    fn read(p: &Params<'_>, env: &GateEnv) -> Result<AimdParams, GateError> {
        let max_window = max_window(p, env, Some(256.0))?;
        let min_window = min_window(p, max_window)?;
        let increase = p.float_or("increase", 1.0)?;
        if increase.is_nan() || increase <= 0.0 {
            return Err(param(
                GATE,
                "increase",
                format!("must be > 0, got {increase}"),
            ));
        }
        Ok(AimdParams {
            min_window,
            max_window,
            increase,
            decrease_factor: factor(p, "decrease_factor", 0.5)?,
            hold: p.duration_or("hold_duration", Duration::from_secs(1))?,
            tier_label: {
                // `queue_duration_target` is read (a bad one is refused, as in Go) and changes
                // nothing: the router reports no queue duration yet (Go's 0 turns it off too).
                p.duration_or("queue_duration_target", Duration::ZERO)?;
                p.string_or("tier_label", "tier")
            },
        })
    }
}

/// One band's window.
#[derive(Debug, Clone)]
pub struct Band {
    pub window: f64,
    pub ssthresh: f64,
    pub inflight: u32,
    /// Closed by a `Retry-After` until then.
    closed_until: Option<Instant>,
    /// The last decrease: a rejection of a request sent before it is of the same flight.
    last_decrease: Option<Instant>,
    /// Growth held until then (a lower band was rejected), and when the hold was set.
    hold: Option<(Instant, Instant)>,
}

/// Every band's window: the gate's whole state, driven with explicit times.
#[derive(Debug, Clone)]
pub struct Bands {
    params: AimdParams,
    pub bands: [Band; 6],
}

impl Bands {
    pub fn new(params: AimdParams) -> Bands {
        let band = Band {
            window: params.min_window,
            ssthresh: params.max_window,
            inflight: 0,
            closed_until: None,
            last_decrease: None,
            hold: None,
        };
        Bands {
            bands: std::array::from_fn(|_| band.clone()),
            params,
        }
    }

    /// Takes a slot of band `b` if it is open and has room.
    pub fn admit(&mut self, b: usize, now: Instant) -> bool {
        let band = &mut self.bands[b];
        if let Some(until) = band.closed_until {
            if now < until {
                return false;
            }
            band.closed_until = None;
        }
        if f64::from(band.inflight) + 1.0 <= band.window.floor().max(1.0) {
            band.inflight += 1;
            true
        } else {
            false
        }
    }

    /// Frees band `b`'s slot and learns from the answer (`None`: the request was not sent).
    pub fn settle(
        &mut self,
        b: usize,
        answer: Option<(Answer, Instant, Option<Duration>)>,
        now: Instant,
    ) {
        let band = &mut self.bands[b];
        band.inflight = band.inflight.saturating_sub(1);
        let Some((answer, sent_at, retry_after)) = answer else {
            return;
        };
        match answer {
            Answer::Accepted => self.grow(b, sent_at, now),
            Answer::Saturated => {
                if self.is_new_flight(b, sent_at) {
                    for lower in b..BANDS.len() {
                        self.decrease(lower, self.params.decrease_factor, now);
                    }
                    self.hold_above(b, now);
                }
                if let Some(ra) = retry_after {
                    for lower in b..BANDS.len() {
                        self.close(lower, now + ra);
                    }
                }
            }
            Answer::Expired => {
                if self.is_new_flight(b, sent_at) {
                    self.decrease(b, GENTLE, now);
                    self.hold_above(b, now);
                }
            }
            Answer::Evicted | Answer::Other | Answer::Error => {}
        }
    }

    /// A request sent after the band's last decrease: its rejection is news.
    fn is_new_flight(&self, b: usize, sent_at: Instant) -> bool {
        self.bands[b].last_decrease.is_none_or(|t| sent_at >= t)
    }

    fn grow(&mut self, b: usize, sent_at: Instant, now: Instant) {
        // An answer at b clears the holds above b that were set before it was sent.
        for higher in 0..b {
            if let Some((_, set_at)) = self.bands[higher].hold {
                if set_at <= sent_at {
                    self.bands[higher].hold = None;
                }
            }
        }
        let p = &self.params;
        let band = &mut self.bands[b];
        if band.hold.is_some_and(|(until, _)| now < until) {
            return;
        }
        band.hold = None;
        band.window = if band.window < band.ssthresh {
            band.window + p.increase
        } else {
            band.window + p.increase / band.window
        }
        .min(p.max_window);
    }

    fn decrease(&mut self, b: usize, by: f64, now: Instant) {
        let min = self.params.min_window;
        let band = &mut self.bands[b];
        band.ssthresh = (band.window * by).max(min);
        band.window = band.ssthresh;
        band.last_decrease = Some(now);
    }

    fn hold_above(&mut self, b: usize, now: Instant) {
        let until = now + self.params.hold;
        for higher in 0..b {
            self.bands[higher].hold = Some((until, now));
        }
    }

    fn close(&mut self, b: usize, until: Instant) {
        let band = &mut self.bands[b];
        band.window = self.params.min_window;
        band.closed_until = Some(band.closed_until.map_or(until, |t| t.max(until)));
    }

    /// Go's budget: the largest free share of a band's window.
    pub fn budget(&self) -> f64 {
        self.bands
            .iter()
            .map(|b| ((b.window - f64::from(b.inflight)) / b.window).clamp(0.0, 1.0))
            .fold(0.0, f64::max)
    }
}

/// One band's series.
struct BandSeries {
    window: FloatGauge,
    ssthresh: FloatGauge,
    inflight: Gauge,
    outcomes: Vec<Counter>,
}

/// The gate.
pub struct Aimd {
    bands: Mutex<Bands>,
    /// Woken when a slot frees or a window grows.
    room: Notify,
    tier_label: String,
    series: Option<Vec<BandSeries>>,
}

impl std::fmt::Debug for Aimd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Aimd").finish_non_exhaustive()
    }
}

/// Builds an `aimd` gate.
pub fn build(p: Params<'_>, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let params = AimdParams::read(&p, env)?;
    let series = env.owner.as_ref().map(|owner| {
        let m = &owner.metrics.feedback;
        BANDS
            .iter()
            .map(|band| {
                let labels = BandLabels {
                    pool_name: owner.labels.pool_name.clone(),
                    band: (*band).to_owned(),
                };
                let outcomes = Answer::ALL
                    .iter()
                    .map(|a| {
                        m.aimd_outcomes
                            .get_or_create(&BandOutcomeLabels {
                                pool_name: labels.pool_name.clone(),
                                band: labels.band.clone(),
                                outcome: a.as_str().to_owned(),
                            })
                            .clone()
                    })
                    .collect();
                BandSeries {
                    window: m.aimd_window.get_or_create(&labels).clone(),
                    ssthresh: m.aimd_ssthresh.get_or_create(&labels).clone(),
                    inflight: m.aimd_inflight.get_or_create(&labels).clone(),
                    outcomes,
                }
            })
            .collect()
    });
    let gate = Arc::new(Aimd {
        tier_label: params.tier_label.clone(),
        bands: Mutex::new(Bands::new(params)),
        room: Notify::new(),
        series,
    });
    gate.publish(None);
    Ok(Arc::new(gate))
}

impl Aimd {
    fn lock(&self) -> std::sync::MutexGuard<'_, Bands> {
        self.bands.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the gauges from the state (after a change).
    fn publish(&self, answer: Option<(usize, Answer)>) {
        let Some(series) = &self.series else { return };
        let bands = self.lock();
        for (s, b) in series.iter().zip(bands.bands.iter()) {
            s.window.set(b.window);
            s.ssthresh.set(b.ssthresh);
            s.inflight.set(i64::from(b.inflight));
        }
        if let Some((b, answer)) = answer {
            if let Some(i) = Answer::ALL.iter().position(|a| *a == answer) {
                series[b].outcomes[i].inc();
            }
        }
    }

    /// The slot's release: it learns from the answer.
    fn release(self: &Arc<Self>, b: usize) -> Release {
        let gate = self.clone();
        Release::observing(move |feedback: Option<&Feedback>| {
            let answer = feedback.map(|f| (classify(f), f.sent_at, f.retry_after));
            gate.lock().settle(b, answer, Instant::now());
            gate.publish(answer.map(|(a, _, _)| (b, a)));
            gate.room.notify_waiters();
            Box::pin(std::future::ready(()))
        })
    }
}

impl Gate for Arc<Aimd> {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(std::future::ready(self.lock().budget()))
    }

    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let classification = input.labels.get(CLASSIFICATION).map(String::as_str);
            let tier = input
                .labels
                .get(&self.tier_label)
                .or_else(|| input.metadata.get(&self.tier_label))
                .map(String::as_str);
            let b = band_of(classification, tier);
            let reserved = b < 3;
            let take = || self.lock().admit(b, Instant::now()).then_some(());
            let admitted = if reserved {
                wait_for_slot(&self.room, take).await
            } else {
                take()
            };
            if admitted.is_none() {
                return Ok(Decision::verdict(if reserved {
                    Verdict::Wait
                } else {
                    Verdict::Refuse
                }));
            }
            self.publish(None);
            let mut decision = Decision::go();
            decision.releases.push(self.release(b));
            Ok(decision)
        })
    }
}

#[cfg(test)]
mod tests;
