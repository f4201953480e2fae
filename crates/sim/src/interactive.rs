//! The interactive traffic generator: open-loop streaming chat requests, sent at the rates of a
//! [`Profile`] of phases (idle, bursts, ramps), to one base URL, measuring what a chat user feels.
//!
//! ```text
//!  Profile ──► arrival schedule (Poisson, seeded; thinning for ramps)
//!                 │ at each arrival: spawn one POST /v1/chat/completions, stream: true
//!                 ▼
//!  per request: send → first content chunk = TTFT; gaps after it → mean ITL; non-2xx → failure
//!                 │ profile over: wait at most `grace` for requests in flight, then cut them
//!                 ▼
//!  Report: per phase occurrence (idle#1, burst#1, idle#2…) counts and p50/p99, plus raw samples
//! ```
//!
//! A profile, [`InteractiveSettings`] and a cancellation token enter through [`run`]; a
//! [`Report`] leaves. It sends only to the URL it is given.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::engine::OBJECTIVE_HEADER;

/// One stretch of a profile at one arrival rate (or a linear ramp between two).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Its name in the report (`idle`, `burst`…); a repeated name is numbered per occurrence.
    pub name: String,
    /// How long it lasts.
    pub duration: Duration,
    /// Requests a second at its start (0 = idle).
    pub rate_per_s: f64,
    /// Requests a second at its end, rising or falling linearly; `None` keeps `rate_per_s`.
    pub ramp_to: Option<f64>,
}

impl Phase {
    /// A phase at a steady rate.
    pub fn steady(name: &str, duration: Duration, rate_per_s: f64) -> Self {
        Self {
            name: name.to_owned(),
            duration,
            rate_per_s,
            ramp_to: None,
        }
    }

    /// The arrival rate `into` the phase.
    fn rate_at(&self, into: Duration) -> f64 {
        let Some(end) = self.ramp_to else {
            return self.rate_per_s;
        };
        let share = if self.duration.is_zero() {
            1.0
        } else {
            (into.as_secs_f64() / self.duration.as_secs_f64()).clamp(0.0, 1.0)
        };
        self.rate_per_s + (end - self.rate_per_s) * share
    }
}

/// Phases played one after the other.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// In the order they are played.
    pub phases: Vec<Phase>,
}

impl Profile {
    /// How long the whole profile lasts.
    pub fn duration(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }
}

/// How each interactive request looks and how long the run waits for stragglers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InteractiveSettings {
    /// `model` of each request.
    pub model: String,
    /// `max_tokens` of each request.
    pub max_tokens: u64,
    /// The user message.
    pub prompt: String,
    /// `x-llm-d-inference-objective` header value, if any.
    pub objective: Option<String>,
    /// Seed of the arrival schedule: the same seed gives the same arrivals.
    pub seed: u64,
    /// After the profile ends, how long requests still in flight may take before they are cut
    /// and reported as unfinished.
    pub grace: Duration,
}

impl Default for InteractiveSettings {
    fn default() -> Self {
        Self {
            model: crate::config::DEFAULT_MODEL_NAME.to_owned(),
            max_tokens: 64,
            prompt: "Say hello in a short sentence.".to_owned(),
            objective: None,
            seed: 1,
            grace: Duration::from_secs(10),
        }
    }
}

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// 2xx and the stream ran to its end.
    Ok,
    /// Answered with this non-2xx status.
    Status(u16),
    /// The connection failed or the stream broke off (the message says how).
    Transport(String),
    /// Still in flight when the grace ran out or the run was cancelled.
    Unfinished,
}

/// One request's measurements.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The phase occurrence it was sent in (`burst#1`).
    pub phase: String,
    /// When it was sent, in milliseconds since the run started.
    pub sent_at_ms: f64,
    /// Send to first content chunk, in milliseconds.
    pub ttft_ms: Option<f64>,
    /// Mean gap between content chunks after the first, in milliseconds.
    pub mean_itl_ms: Option<f64>,
    /// How it ended.
    pub outcome: Outcome,
}

/// The 50th and 99th percentiles of some milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile (nearest rank).
    pub p99: f64,
}

/// What one occurrence of a phase saw.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseReport {
    /// `name#occurrence`, e.g. `idle#2`.
    pub label: String,
    /// The phase's name.
    pub name: String,
    /// 1 for the first phase of this name, 2 for the second…
    pub occurrence: usize,
    /// Requests sent in it.
    pub count: usize,
    /// Of them, the ones that streamed to the end.
    pub ok: usize,
    /// TTFT of the requests that got a first token.
    pub ttft_ms: Option<Percentiles>,
    /// Mean ITL of the requests that got two tokens or more.
    pub itl_ms: Option<Percentiles>,
    /// Non-2xx answers by status.
    pub failures: BTreeMap<u16, usize>,
    /// Connection failures and broken streams.
    pub transport_errors: usize,
    /// Still in flight at the end.
    pub unfinished: usize,
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// One entry per phase of the profile, in order.
    pub phases: Vec<PhaseReport>,
    /// Every request, in the order sent.
    pub samples: Vec<Sample>,
}

impl Report {
    /// The report of the phase occurrence labelled `label` (`burst#1`).
    pub fn phase(&self, label: &str) -> Option<&PhaseReport> {
        self.phases.iter().find(|p| p.label == label)
    }
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
pub enum InteractiveError {
    /// A phase's rate is negative or not a number.
    #[error("phase {phase:?}: rate must be a finite number >= 0, got {rate}")]
    BadRate {
        /// The phase's name.
        phase: String,
        /// The rate at fault.
        rate: f64,
    },
    /// The HTTP client could not be built.
    #[error("cannot build the HTTP client: {0}")]
    Client(#[source] reqwest::Error),
}

/// One planned arrival: when, and in which phase occurrence.
#[derive(Debug, Clone, Copy)]
struct Arrival {
    at: Duration,
    phase: usize,
}

/// Labels `name#n` of each phase, numbering repeated names.
fn phase_labels(profile: &Profile) -> Vec<(String, usize)> {
    let mut seen: HashMap<&str, usize> = HashMap::new();
    profile
        .phases
        .iter()
        .map(|p| {
            let n = seen.entry(p.name.as_str()).or_insert(0);
            *n += 1;
            (format!("{}#{n}", p.name), *n)
        })
        .collect()
}

/// The arrival times of the whole profile: Poisson at each phase's rate, thinned for ramps.
fn schedule(profile: &Profile, seed: u64) -> Vec<Arrival> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut arrivals = Vec::new();
    let mut phase_start = Duration::ZERO;
    for (index, phase) in profile.phases.iter().enumerate() {
        let peak = phase.rate_per_s.max(phase.ramp_to.unwrap_or(0.0));
        let length = phase.duration.as_secs_f64();
        let mut t = 0.0;
        // An idle phase (peak 0) has no arrivals.
        while peak > 0.0 && t < length {
            let uniform: f64 = rng.random();
            t += -(1.0 - uniform).ln() / peak;
            if t >= length {
                continue;
            }
            let into = Duration::from_secs_f64(t);
            let keep: f64 = rng.random();
            if keep * peak < phase.rate_at(into) {
                arrivals.push(Arrival {
                    at: phase_start + into,
                    phase: index,
                });
            }
        }
        phase_start += phase.duration;
    }
    arrivals
}

/// Plays `profile` against `base_url` (e.g. `http://127.0.0.1:8000`) and reports what the
/// requests saw. Ends by itself once the profile is over and the requests in flight are done or
/// `settings.grace` has passed; `cancel` ends it early (requests in flight count as
/// unfinished).
pub async fn run(
    base_url: &str,
    profile: &Profile,
    settings: &InteractiveSettings,
    cancel: CancellationToken,
) -> Result<Report, InteractiveError> {
    for phase in &profile.phases {
        for rate in [Some(phase.rate_per_s), phase.ramp_to]
            .into_iter()
            .flatten()
        {
            if !rate.is_finite() || rate < 0.0 {
                return Err(InteractiveError::BadRate {
                    phase: phase.name.clone(),
                    rate,
                });
            }
        }
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .map_err(InteractiveError::Client)?;
    let url = format!("{}/v1/chat/completions", base_url.trim_end_matches('/'));
    let body = serde_json::json!({
        "model": settings.model,
        "messages": [{"role": "user", "content": settings.prompt}],
        "max_tokens": settings.max_tokens,
        "stream": true,
    })
    .to_string();
    let labels = phase_labels(profile);
    let plan = schedule(profile, settings.seed);

    let started = Instant::now();
    let mut samples: Vec<Sample> = Vec::with_capacity(plan.len());
    let mut in_flight: JoinSet<(usize, Measured)> = JoinSet::new();
    let mut cancelled = false;
    for arrival in &plan {
        tokio::select! {
            biased;
            _ = cancel.cancelled() => { cancelled = true; break; }
            _ = tokio::time::sleep_until(started + arrival.at) => {}
        }
        let index = samples.len();
        samples.push(Sample {
            phase: labels
                .get(arrival.phase)
                .map(|(label, _)| label.clone())
                .unwrap_or_default(),
            sent_at_ms: ms(started.elapsed()),
            ttft_ms: None,
            mean_itl_ms: None,
            outcome: Outcome::Unfinished,
        });
        let mut request = client
            .post(&url)
            .header("content-type", "application/json")
            .body(body.clone());
        if let Some(objective) = &settings.objective {
            request = request.header(OBJECTIVE_HEADER, objective);
        }
        in_flight.spawn(async move { (index, measure(request).await) });
    }
    if !cancelled {
        // Idle phases at the end still take their time.
        tokio::select! {
            biased;
            _ = cancel.cancelled() => cancelled = true,
            _ = tokio::time::sleep_until(started + profile.duration()) => {}
        }
    }
    let cut_off = Instant::now()
        + if cancelled {
            Duration::ZERO
        } else {
            settings.grace
        };
    loop {
        let next = tokio::select! {
            biased;
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep_until(cut_off) => break,
            next = in_flight.join_next() => next,
        };
        let Some(joined) = next else { break };
        // A task that panicked or was aborted stays unfinished.
        if let Ok((index, measured)) = joined {
            if let Some(sample) = samples.get_mut(index) {
                sample.ttft_ms = measured.ttft_ms;
                sample.mean_itl_ms = measured.mean_itl_ms;
                sample.outcome = measured.outcome;
            }
        }
    }
    in_flight.abort_all();

    let phases = labels
        .iter()
        .zip(&profile.phases)
        .map(|((label, occurrence), phase)| summarise(label, &phase.name, *occurrence, &samples))
        .collect();
    Ok(Report { phases, samples })
}

/// What one request measured.
struct Measured {
    ttft_ms: Option<f64>,
    mean_itl_ms: Option<f64>,
    outcome: Outcome,
}

/// Sends one streaming request and times its content chunks.
async fn measure(request: reqwest::RequestBuilder) -> Measured {
    let sent = Instant::now();
    let mut measured = Measured {
        ttft_ms: None,
        mean_itl_ms: None,
        outcome: Outcome::Ok,
    };
    let mut response = match request.send().await {
        Ok(response) => response,
        Err(e) => {
            measured.outcome = Outcome::Transport(e.to_string());
            return measured;
        }
    };
    if !response.status().is_success() {
        measured.outcome = Outcome::Status(response.status().as_u16());
        return measured;
    }
    let mut buffer = String::new();
    let mut first: Option<Instant> = None;
    let mut last: Option<Instant> = None;
    let mut tokens = 0u32;
    loop {
        let bytes = match response.chunk().await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(e) => {
                measured.outcome = Outcome::Transport(e.to_string());
                break;
            }
        };
        let now = Instant::now();
        buffer.push_str(&String::from_utf8_lossy(&bytes));
        while let Some(end) = buffer.find("\n\n") {
            let event: String = buffer.drain(..end + 2).collect();
            if carries_content(&event) {
                tokens += 1;
                first.get_or_insert(now);
                last = Some(now);
            }
        }
    }
    if let Some(first) = first {
        measured.ttft_ms = Some(ms(first - sent));
        if let (Some(last), true) = (last, tokens > 1) {
            measured.mean_itl_ms = Some(ms(last - first) / f64::from(tokens - 1));
        }
    }
    measured
}

/// Whether an SSE event is a chat chunk with non-empty `delta.content`.
fn carries_content(event: &str) -> bool {
    event.lines().any(|line| {
        let Some(data) = line.strip_prefix("data:") else {
            return false;
        };
        let Ok(chunk) = serde_json::from_str::<serde_json::Value>(data.trim()) else {
            return false;
        };
        chunk["choices"][0]["delta"]["content"]
            .as_str()
            .is_some_and(|c| !c.is_empty())
    })
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Nearest-rank percentiles, or `None` for no values.
fn percentiles(mut values: Vec<f64>) -> Option<Percentiles> {
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let rank = |q: f64| {
        let i = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len()) - 1;
        values.get(i).copied().unwrap_or(f64::NAN)
    };
    Some(Percentiles {
        p50: rank(0.50),
        p99: rank(0.99),
    })
}

fn summarise(label: &str, name: &str, occurrence: usize, samples: &[Sample]) -> PhaseReport {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.phase == label).collect();
    let mut failures = BTreeMap::new();
    let (mut ok, mut transport_errors, mut unfinished) = (0, 0, 0);
    for sample in &mine {
        match &sample.outcome {
            Outcome::Ok => ok += 1,
            Outcome::Status(code) => *failures.entry(*code).or_insert(0) += 1,
            Outcome::Transport(_) => transport_errors += 1,
            Outcome::Unfinished => unfinished += 1,
        }
    }
    PhaseReport {
        label: label.to_owned(),
        name: name.to_owned(),
        occurrence,
        count: mine.len(),
        ok,
        ttft_ms: percentiles(mine.iter().filter_map(|s| s.ttft_ms).collect()),
        itl_ms: percentiles(mine.iter().filter_map(|s| s.mean_itl_ms).collect()),
        failures,
        transport_errors,
        unfinished,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrivals_follow_the_rate_of_each_phase_and_ramp() {
        let profile = Profile {
            phases: vec![
                Phase::steady("idle", Duration::from_secs(10), 0.0),
                Phase::steady("burst", Duration::from_secs(10), 100.0),
                Phase {
                    name: "ramp".into(),
                    duration: Duration::from_secs(10),
                    rate_per_s: 0.0,
                    ramp_to: Some(100.0),
                },
            ],
        };
        let plan = schedule(&profile, 7);
        let in_phase = |i| plan.iter().filter(|a| a.phase == i).count();
        assert_eq!(in_phase(0), 0);
        // 1,000 expected; Poisson spread is about 32.
        assert!((880..1120).contains(&in_phase(1)), "{}", in_phase(1));
        // A linear ramp 0→100 over 10 s: 500, most of them late.
        assert!((420..580).contains(&in_phase(2)), "{}", in_phase(2));
        let late = plan
            .iter()
            .filter(|a| a.phase == 2 && a.at >= Duration::from_secs(25))
            .count();
        assert!(late * 2 > in_phase(2), "{late} of {}", in_phase(2));
        assert!(plan.windows(2).all(|w| w[0].at <= w[1].at));
        // Same seed, same arrivals.
        assert_eq!(schedule(&profile, 7).len(), plan.len());
    }

    #[test]
    fn repeated_phase_names_are_numbered() {
        let profile = Profile {
            phases: ["idle", "burst", "idle"]
                .iter()
                .map(|n| Phase::steady(n, Duration::from_secs(1), 1.0))
                .collect(),
        };
        let labels: Vec<String> = phase_labels(&profile).into_iter().map(|(l, _)| l).collect();
        assert_eq!(labels, ["idle#1", "burst#1", "idle#2"]);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        let p = percentiles(values).unwrap();
        assert_eq!((p.p50, p.p99), (50.0, 99.0));
        assert_eq!(percentiles(Vec::new()), None);
    }
}
