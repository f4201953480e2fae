//! The `slack` gate's controller: the window, the requests it has at the gateway, and what it
//! has learnt. Plain state with the time passed in, so every reaction is tested without a clock.
//!
//! Requests enter by [`Controller::admit`] and leave by [`Controller::settle`] with their answer;
//! once per control period [`Controller::tick`] moves the window and names the requests to take
//! back. It steers by one of two signals, whichever it has:
//!
//! - **A standing queue** (a fresh [`Reading`] of `signal_url`). With the pool's running count
//!   beside it, the controller learns the pool's *capacity* (what it runs when a queue stands),
//!   reckons the *others'* share (running + waiting − its own), and fills to
//!   `capacity − others − headroom × √others − 1`: shrinking at once, growing by `increase` per
//!   period. Without a running count it steers like TCP Vegas on the queue alone.
//! - **Delay** (no signal, or a stale one): its own requests' latency per output token against
//!   their no-load baseline; past `latency_tolerance` × baseline it cuts the window once per
//!   flight, under 0.9 × that it grows.
//!
//! Rejections act as in `aimd`: a capacity rejection cuts the window once per flight, and a
//! `Retry-After` closes the gate until then. An eviction by the router's flow control (429
//! `evicted…`) means the pool was needed: each one takes one off the window, and the window holds
//! (no growth, no probing) for `memory` after the last.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::super::signal::Reading;
use super::super::Answer;

/// A reading older than this many control periods is stale: the controller steers on delay.
const STALE_PERIODS: u32 = 3;
/// The latency samples the delay signal looks at, at most (the newest).
const SAMPLES: usize = 8;
/// How long one bucket of the baseline's minimum lasts (the baseline is the smaller of this
/// bucket's and the last one's, so a baseline measured under a lighter load fades out).
const BASELINE_BUCKET: Duration = Duration::from_secs(300);
/// Growth stops while the latency is above this share of the tolerance.
const GROW_BELOW: f64 = 0.9;
/// Readings in a row of a queue that mean the pool's capacity fell (a pod left, or the KV
/// cache holds fewer sequences): the capacity is then what it runs, even below the peak.
pub(super) const FELL_STREAK: u32 = 8;
/// How long the peak of what the pool ran is remembered (the capacity never falls below it on
/// a short queue: a queue seen while a slot is being refilled is no news of the capacity).
const PEAK_MEMORY: Duration = Duration::from_secs(30);
/// Readings in a row of a queue that stands while the pool runs less than its capacity. An
/// engine admits at step boundaries, so with requests arriving every step a queue is seen in a
/// third of the readings or more; two in a row happen every few seconds, three rarely.
pub(super) const STANDING_STREAK: u32 = 3;
/// The longest wait between probes, in `memory`s.
const PROBE_BACKOFF: u32 = 4;

/// The controller's settings (the gate's parameters, read and checked).
#[derive(Debug, Clone)]
pub struct Settings {
    pub min_window: f64,
    pub max_window: f64,
    pub signal_target: f64,
    pub interval: Duration,
    pub headroom: f64,
    pub memory: Duration,
    pub latency_tolerance: f64,
    pub increase: f64,
    pub decrease_factor: f64,
    pub preempt: bool,
}

/// One request at the gateway.
struct Flight {
    seq: u64,
    preempt: CancellationToken,
}

/// A latency sample: when its request was sent, and its latency per output token (seconds).
#[derive(Debug, Clone, Copy)]
struct Sample {
    sent_at: Instant,
    per_token: f64,
}

/// Which signal steered the last period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Steer {
    Queue,
    Delay,
}

/// The controller.
pub struct Controller {
    s: Settings,
    pub window: f64,
    flights: VecDeque<Flight>,
    next_seq: u64,
    closed_until: Option<Instant>,
    last_decrease: Option<Instant>,
    samples: VecDeque<Sample>,
    /// Answers learnt from since the last period: delay-steered growth waits for evidence.
    answered: u32,
    /// The window was full at some moment of this period (growing an unused window means
    /// nothing).
    bound: bool,
    /// The minimum per-token latency in this bucket and the last.
    baseline_now: Option<f64>,
    baseline_before: Option<f64>,
    bucket_started: Instant,
    /// The last good reading, and when.
    pub reading: Option<(Instant, Reading)>,
    streak: u32,
    /// When a queue last stood (or the capacity was last probed upward).
    last_standing: Instant,
    /// Sequences the pool runs before it queues, once seen.
    pub capacity: Option<f64>,
    /// The capacity last seen with evidence (a queue while the pool ran that much): a queue
    /// below the capacity sets back only what probing added above it.
    confirmed: f64,
    /// How long without a standing queue before the capacity is probed one higher.
    probe_after: Duration,
    /// The most the pool ran lately, and when.
    peak_running: (f64, Instant),
    /// The others' share now, and its running mean over `memory`.
    others_mean: f64,
    pub others: f64,
    pub steer: Steer,
    /// The window holds (does not grow) until then: the router evicted one of ours.
    held_until: Option<Instant>,
    /// Whether it holds in this period.
    holding: bool,
    /// Evictions seen, for the gate's counter.
    pub evictions: u64,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller").finish_non_exhaustive()
    }
}

impl Controller {
    pub fn new(s: Settings, now: Instant) -> Controller {
        let memory = s.memory;
        Controller {
            window: s.min_window,
            s,
            flights: VecDeque::new(),
            next_seq: 0,
            closed_until: None,
            last_decrease: None,
            samples: VecDeque::new(),
            answered: 0,
            bound: false,
            baseline_now: None,
            baseline_before: None,
            bucket_started: now,
            reading: None,
            streak: 0,
            last_standing: now,
            capacity: None,
            confirmed: 0.0,
            probe_after: memory,
            peak_running: (0.0, now),
            others_mean: 0.0,
            others: 0.0,
            steer: Steer::Delay,
            held_until: None,
            holding: false,
            evictions: 0,
        }
    }

    pub fn inflight(&self) -> usize {
        self.flights.len()
    }

    /// Takes a slot when the gate is open and the window has room: the request's sequence
    /// number and the token that preempts it.
    pub fn admit(&mut self, now: Instant) -> Option<(u64, CancellationToken)> {
        if self.closed_until.is_some_and(|t| now < t) {
            return None;
        }
        self.closed_until = None;
        if (self.flights.len() as f64) + 1.0 > self.window.floor().max(1.0) {
            self.bound = true;
            return None;
        }
        if (self.flights.len() as f64) + 2.0 > self.window.floor() {
            self.bound = true;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let preempt = CancellationToken::new();
        self.flights.push_back(Flight {
            seq,
            preempt: preempt.clone(),
        });
        Some((seq, preempt))
    }

    /// Frees request `seq`'s slot and learns from its answer: `(answer, sent_at, retry_after,
    /// seconds per output token)`, or `None` when it was not sent or was taken back.
    pub fn settle(
        &mut self,
        seq: u64,
        answer: Option<(Answer, Instant, Option<Duration>, f64)>,
        now: Instant,
    ) {
        self.flights.retain(|f| f.seq != seq);
        let Some((answer, sent_at, retry_after, per_token)) = answer else {
            return;
        };
        let new_flight = self.last_decrease.is_none_or(|t| sent_at >= t);
        match answer {
            Answer::Accepted => self.learn_latency(sent_at, per_token, now),
            Answer::Saturated => {
                if new_flight {
                    self.cut(self.s.decrease_factor, now);
                }
                if let Some(ra) = retry_after {
                    self.window = self.s.min_window;
                    self.closed_until = Some(now + ra);
                }
            }
            Answer::Expired if new_flight => self.cut(0.9, now),
            Answer::Evicted => self.evicted(now),
            _ => {}
        }
    }

    /// The router evicted one of ours: the pool needed that slot. One off the window, and hold
    /// it for `memory`.
    fn evicted(&mut self, now: Instant) {
        self.evictions += 1;
        self.window = (self.window - 1.0).max(self.s.min_window);
        self.held_until = Some(now + self.s.memory);
        self.holding = true;
    }

    fn learn_latency(&mut self, sent_at: Instant, per_token: f64, now: Instant) {
        if !(per_token.is_finite() && per_token > 0.0) {
            return;
        }
        if now.duration_since(self.bucket_started) >= BASELINE_BUCKET {
            self.baseline_before = self.baseline_now.take();
            self.bucket_started = now;
        }
        self.baseline_now = Some(self.baseline_now.map_or(per_token, |b| b.min(per_token)));
        self.samples.push_back(Sample { sent_at, per_token });
        self.answered += 1;
        while self.samples.len() > SAMPLES {
            self.samples.pop_front();
        }
    }

    /// The no-load latency per output token: the least seen lately.
    pub fn baseline(&self) -> Option<f64> {
        match (self.baseline_now, self.baseline_before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The median latency per token of the newest samples sent since the last decrease.
    pub fn latency(&self) -> Option<f64> {
        let mut recent: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| self.last_decrease.is_none_or(|t| s.sent_at >= t))
            .map(|s| s.per_token)
            .collect();
        if recent.is_empty() {
            return None;
        }
        recent.sort_by(f64::total_cmp);
        Some(recent[recent.len() / 2])
    }

    fn cut(&mut self, by: f64, now: Instant) {
        self.window = (self.window * by).max(self.s.min_window);
        self.last_decrease = Some(now);
    }

    /// Whether the window held the gate back this period, or is full now.
    fn window_binds(&self) -> bool {
        self.bound || self.flights.len() as f64 + 1.0 >= self.window.floor()
    }

    fn grow(&mut self) {
        if self.window_binds() && !self.holding {
            self.window += self.s.increase;
        }
    }

    /// One control period: takes a fresh reading (or none), moves the window, and returns the
    /// tokens of the requests to take back (the youngest first), when preemption is on.
    pub fn tick(&mut self, reading: Option<Reading>, now: Instant) -> Vec<CancellationToken> {
        if let Some(r) = reading {
            self.reading = Some((now, r));
        }
        self.holding = self.held_until.is_some_and(|t| now < t);
        let stale = self.s.interval * STALE_PERIODS;
        let fresh = self
            .reading
            .filter(|(at, _)| now.duration_since(*at) <= stale)
            .map(|(_, r)| r);
        let mut preempt = Vec::new();
        match fresh {
            Some(r) => {
                self.steer = Steer::Queue;
                self.answered = 0;
                self.steer_by_queue(r, now);
                if self.standing(r) && self.s.preempt {
                    // Requests already taken back but not yet released count as taken.
                    let leaving = self
                        .flights
                        .iter()
                        .filter(|f| f.preempt.is_cancelled())
                        .count();
                    let active = self.flights.len() - leaving;
                    let over = active.saturating_sub(self.window.floor() as usize);
                    preempt = self.take_back(over.min(self.hurting(r).saturating_sub(leaving)));
                }
            }
            None => {
                self.steer = Steer::Delay;
                self.steer_by_delay(now);
            }
        }
        self.window = self.window.clamp(self.s.min_window, self.s.max_window);
        self.bound = false;
        preempt
    }

    /// How many to take back for a queue: as many as wait past the target, times the engines
    /// over those that queue (its requests are spread over every engine, and only a slot freed
    /// where the queue stands serves it).
    fn hurting(&self, r: Reading) -> usize {
        let waiting = (r.waiting - self.s.signal_target).max(0.0);
        let spread = if r.queued_series > 0 && r.series > r.queued_series {
            r.series as f64 / r.queued_series as f64
        } else {
            1.0
        };
        (waiting * spread).ceil() as usize
    }

    /// The youngest `n` requests' tokens (they have done the least work), removed from the
    /// window's count as their releases will be.
    fn take_back(&mut self, n: usize) -> Vec<CancellationToken> {
        let mut out = Vec::with_capacity(n);
        for flight in self.flights.iter().rev() {
            if out.len() == n {
                break;
            }
            if !flight.preempt.is_cancelled() {
                out.push(flight.preempt.clone());
            }
        }
        out
    }

    /// Whether the last reading shows a queue that stands. An engine admits new requests at
    /// step boundaries, so a request waits one step even in a pool with room, and one reading
    /// of a queue is often such a flicker. A queue counts at once while the pool runs all it
    /// can, else after [`STANDING_STREAK`] readings in a row.
    fn standing(&self, r: Reading) -> bool {
        self.streak >= STANDING_STREAK || (self.streak >= 1 && self.full(r))
    }

    /// Whether the pool runs at least its learnt capacity.
    fn full(&self, r: Reading) -> bool {
        match (r.running, self.capacity) {
            (Some(running), Some(capacity)) => running >= capacity,
            _ => false,
        }
    }

    fn steer_by_queue(&mut self, r: Reading, now: Instant) {
        let queued = r.waiting > self.s.signal_target;
        self.streak = if queued { self.streak + 1 } else { 0 };
        let Some(running) = r.running else {
            // Vegas on the queue alone: a standing queue cuts the window, none lets it grow.
            if self.streak >= 2 {
                self.cut(self.s.decrease_factor, now);
                self.streak = 0;
            } else if !queued {
                self.grow();
            }
            return;
        };
        let mine = self.flights.len() as f64;
        self.others = (running + r.waiting - mine).max(0.0);
        self.remember_others();
        self.learn_capacity(r, running, now);
        match self.capacity {
            Some(capacity) => {
                let expect = self.others.max(self.others_mean);
                let room = capacity - expect - self.s.headroom * expect.sqrt() - 1.0;
                if room < self.window {
                    self.window = room;
                } else if !queued && self.window_binds() && !self.holding {
                    self.window = (self.window + self.s.increase).min(room);
                }
            }
            // Not learnt yet: probe upward until a queue that stands shows the capacity, and
            // hold while one is seen.
            None if !queued => self.grow(),
            None => {}
        }
    }

    /// The others' mean over `memory` (an exponential mean with that time constant).
    fn remember_others(&mut self) {
        let alpha = (self.s.interval.as_secs_f64() / self.s.memory.as_secs_f64()).min(1.0);
        self.others_mean += alpha * (self.others - self.others_mean);
    }

    /// Learns the pool's capacity from what it runs. The pool never runs more than it can, so
    /// what it runs while a queue stands is evidence (*confirmed*), and the peak of the last
    /// [`PEAK_MEMORY`] is a floor. A queue that stands below the capacity sets back only what
    /// probing added (to the confirmed capacity or the peak, whichever is more): a flicker
    /// seen three times cannot ratchet it down. A queue that stands for [`FELL_STREAK`]
    /// readings whatever the pool runs means the capacity fell. Probing adds one sequence
    /// after `memory` without a standing queue while the window is used; the pool may have
    /// grown. The window's headroom keeps the pool below its capacity, so a probe usually
    /// brings no evidence, and a capacity probed up without it eats the headroom: unless the
    /// pool ran the full capacity since, each probe waits twice as long as the last (at most
    /// [`PROBE_BACKOFF`] × `memory`), and a standing queue sets the wait back to `memory`.
    /// The first capacity is learnt from a queue that stands [`FELL_STREAK`] readings: while
    /// the window opens, the requests just sent wait for a step, and a queue seen three times
    /// then is no capacity.
    fn learn_capacity(&mut self, r: Reading, running: f64, now: Instant) {
        let (peak, at) = self.peak_running;
        if running >= peak || now.duration_since(at) > PEAK_MEMORY {
            self.peak_running = (running, now);
        }
        let peak = self.peak_running.0;
        let standing = self.standing(r);
        // Every FELL_STREAK readings of one queue (not each reading past the first eight: a
        // queue that goes on after the capacity was learnt from it is read afresh).
        if self.streak % FELL_STREAK == 0 && self.streak > 0 {
            self.capacity = Some(running);
            self.confirmed = running;
            self.peak_running = (running, now);
            self.stood(now);
        } else if standing && self.full(r) {
            let capacity = running.max(peak);
            self.capacity = Some(capacity);
            self.confirmed = capacity;
            self.stood(now);
        } else if standing && self.capacity.is_some() {
            let floor = running.max(peak).max(self.confirmed);
            if let Some(c) = self.capacity.as_mut().filter(|c| **c > floor) {
                *c = floor;
                self.stood(now);
            }
        } else if self.capacity.is_some_and(|c| running > c) {
            self.capacity = Some(running);
        } else if now.duration_since(self.last_standing) >= self.probe_after
            && self.window_binds()
            && !self.holding
        {
            if let Some(c) = &mut self.capacity {
                // The pool ran all the capacity allowed with no queue: probe again soon.
                // Without that evidence, each probe waits twice as long as the last.
                self.probe_after = if peak >= *c {
                    self.s.memory
                } else {
                    (self.probe_after * 2).min(self.s.memory * PROBE_BACKOFF)
                };
                *c += 1.0;
            }
            self.last_standing = now;
        }
    }

    /// A queue stood (or taught the capacity): the next probe waits `memory` from now.
    fn stood(&mut self, now: Instant) {
        self.last_standing = now;
        self.probe_after = self.s.memory;
    }

    /// Steers on delay. It grows only in a period that brought answers (the first one gives
    /// the baseline at the smallest window), so the window never runs ahead of its evidence,
    /// and it cuts once per flight (the latency it reads is of requests sent since the last cut).
    fn steer_by_delay(&mut self, now: Instant) {
        let answered = std::mem::take(&mut self.answered);
        let (Some(latency), Some(baseline)) = (self.latency(), self.baseline()) else {
            return;
        };
        let ratio = latency / baseline;
        if ratio > self.s.latency_tolerance {
            self.cut(self.s.decrease_factor, now);
        } else if answered > 0 && ratio < self.s.latency_tolerance * GROW_BELOW {
            self.grow();
        }
    }
}
