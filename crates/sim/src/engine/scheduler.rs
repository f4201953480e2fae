//! One simulated vLLM engine: a FIFO waiting queue, at most `--max-num-seqs` running sequences,
//! and a step loop that gives every running sequence one token per step (continuous batching).
//!
//! ```text
//!  Engine::enqueue ──► waiting (FIFO) ──step boundary──► running ──each step──► one token
//!                           ▲ client gone: dropped            │                to its channel
//!                           └─────────── at the next boundary ◄┘ last token: finished
//! ```
//!
//! Sequences enter through [`Engine::enqueue`], which hands back the receiving end of a channel
//! that gets one `TokenMade` per generated token; the channel closes early only when the
//! simulator stops. A dropped receiver (the client went away) aborts the sequence at the next
//! step boundary, freeing its slot or its place in the queue. Gauges leave through
//! [`Engine::load`], latencies through the engine's histograms.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::histogram::{Histogram, E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS};
use super::EngineConfig;

/// One generated token, sent to the sequence's client side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TokenMade;

/// What a request asks of an engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SequenceSpec {
    /// Estimated prompt tokens (prefill time and KV cache).
    pub prompt_tokens: u64,
    /// Tokens to generate (at least 1).
    pub output_tokens: u64,
}

/// A sequence inside the engine.
#[derive(Debug)]
struct Sequence {
    spec: SequenceSpec,
    generated: u64,
    /// Closed when the client went away: the sequence is aborted.
    tokens: mpsc::UnboundedSender<TokenMade>,
    /// When it entered the waiting queue: TTFT and end-to-end latency count from here.
    arrived: Instant,
    /// When its last token was made, for the inter-token latency.
    last_token: Option<Instant>,
}

impl Sequence {
    /// KV-cache tokens it holds while running.
    fn kv_tokens(&self) -> u64 {
        self.spec.prompt_tokens + self.generated
    }
}

/// The queues of one engine, behind its lock.
#[derive(Debug, Default)]
struct Queues {
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
}

/// How loaded an engine is now.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct EngineLoad {
    /// Sequences in the running batch (`vllm:num_requests_running`).
    pub running: usize,
    /// Sequences in the waiting queue (`vllm:num_requests_waiting`).
    pub waiting: usize,
    /// KV-cache tokens held by running sequences over the capacity, at most 1
    /// (`vllm:kv_cache_usage_perc`).
    pub kv_cache_usage: f64,
}

impl EngineLoad {
    /// The router's saturation of this engine: `max(waiting / 5, kv_cache_usage / 0.8)`.
    pub fn saturation(&self) -> f64 {
        (self.waiting as f64 / 5.0).max(self.kv_cache_usage / 0.8)
    }
}

/// The latency histograms of one engine.
#[derive(Debug)]
pub(super) struct EngineLatencies {
    /// Arrival to first token, queueing included.
    pub ttft: Histogram,
    /// Gaps between consecutive tokens of a sequence.
    pub itl: Histogram,
    /// Arrival to last token.
    pub e2e: Histogram,
}

/// One engine, shared by the router (enqueue, load) and its step loop.
#[derive(Debug)]
pub(super) struct Engine {
    queues: Mutex<Queues>,
    /// Wakes an idle step loop when a sequence arrives.
    work: Notify,
    max_num_seqs: usize,
    kv_capacity: u64,
    /// Latencies recorded by the step loop, read by `/metrics`.
    pub latencies: EngineLatencies,
}

/// What the step about to run holds.
#[derive(Debug, Clone, Copy)]
struct StepPlan {
    length: Duration,
}

impl Engine {
    /// An idle engine.
    pub(super) fn new(cfg: &EngineConfig) -> Self {
        Self {
            queues: Mutex::default(),
            work: Notify::new(),
            max_num_seqs: cfg.max_num_seqs,
            kv_capacity: cfg.kv_capacity(),
            latencies: EngineLatencies {
                ttft: Histogram::new(TTFT_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
            },
        }
    }

    fn queues(&self) -> MutexGuard<'_, Queues> {
        // A poisoned lock only means a panic elsewhere; the queues are still consistent.
        self.queues.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Running and waiting counts and KV-cache usage now.
    pub(super) fn load(&self) -> EngineLoad {
        // An aborted sequence (its client gone, or evicted) leaves at the next step; the
        // router already counts its slot as free.
        let queues = self.queues();
        let live = |s: &&Sequence| !s.tokens.is_closed();
        let held: u64 = queues
            .running
            .iter()
            .filter(live)
            .map(Sequence::kv_tokens)
            .sum();
        EngineLoad {
            running: queues.running.iter().filter(live).count(),
            waiting: queues.waiting.iter().filter(live).count(),
            kv_cache_usage: (held as f64 / self.kv_capacity as f64).min(1.0),
        }
    }

    /// Sequences waiting beyond the free slots: how far over its batch size this engine is.
    pub(super) fn backlog(&self) -> usize {
        let queues = self.queues();
        let free = self.max_num_seqs.saturating_sub(queues.running.len());
        queues.waiting.len().saturating_sub(free)
    }

    /// Puts a sequence at the back of the waiting queue; tokens arrive on the returned channel.
    pub(super) fn enqueue(&self, spec: SequenceSpec) -> mpsc::UnboundedReceiver<TokenMade> {
        let (tokens, receiver) = mpsc::unbounded_channel();
        self.queues().waiting.push_back(Sequence {
            spec: SequenceSpec {
                output_tokens: spec.output_tokens.max(1),
                ..spec
            },
            generated: 0,
            tokens,
            arrived: Instant::now(),
            last_token: None,
        });
        self.work.notify_one();
        receiver
    }

    /// Starts a step: drops sequences whose client left, admits waiting ones FIFO while a slot
    /// and their prompt's KV cache are free, and says how long the step lasts. `None` when
    /// there is nothing to run.
    fn begin_step(&self, cfg: &EngineConfig) -> Option<StepPlan> {
        let mut queues = self.queues();
        queues.running.retain(|s| !s.tokens.is_closed());
        queues.waiting.retain(|s| !s.tokens.is_closed());
        let mut held: u64 = queues.running.iter().map(Sequence::kv_tokens).sum();
        let mut admitted_prompt = 0;
        let mut admitted = false;
        while queues.running.len() < self.max_num_seqs {
            let Some(next) = queues.waiting.front() else {
                break;
            };
            let prompt = next.spec.prompt_tokens;
            // An empty engine takes any prompt; otherwise it must fit in the free KV cache.
            if !queues.running.is_empty() && held + prompt > self.kv_capacity {
                break;
            }
            let Some(next) = queues.waiting.pop_front() else {
                break;
            };
            held += prompt;
            admitted_prompt += prompt;
            admitted = true;
            queues.running.push(next);
        }
        if queues.running.is_empty() {
            return None;
        }
        Some(StepPlan {
            length: cfg.step_length(queues.running.len(), admitted, admitted_prompt),
        })
    }

    /// Ends a step: one token for every running sequence; finished and abandoned ones leave.
    fn end_step(&self) {
        let now = Instant::now();
        let mut queues = self.queues();
        let latencies = &self.latencies;
        queues.running.retain_mut(|seq| {
            seq.generated += 1;
            match seq.last_token {
                None => latencies.ttft.observe(now - seq.arrived),
                Some(last) => latencies.itl.observe(now - last),
            }
            seq.last_token = Some(now);
            if seq.tokens.send(TokenMade).is_err() {
                return false;
            }
            if seq.generated >= seq.spec.output_tokens {
                latencies.e2e.observe(now - seq.arrived);
                return false;
            }
            true
        });
    }

    /// Drops every sequence, closing their channels (the simulator is stopping).
    fn abandon_all(&self) {
        let mut queues = self.queues();
        queues.running.clear();
        queues.waiting.clear();
    }

    /// The step loop: runs steps back to back while there is work, sleeps on [`Notify`] when
    /// idle, and ends (abandoning every sequence) when `shutdown` is cancelled. Each step ends
    /// at a deadline counted from the previous one, so sleeping late does not add up.
    pub(super) async fn run(&self, cfg: EngineConfig, shutdown: CancellationToken) {
        let mut step_start: Option<Instant> = None;
        loop {
            let Some(plan) = self.begin_step(&cfg) else {
                step_start = None;
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => break,
                    _ = self.work.notified() => continue,
                }
            };
            let deadline = step_start.unwrap_or_else(Instant::now) + plan.length;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep_until(deadline) => {}
            }
            self.end_step();
            // Late by more than a step (an overloaded machine): start afresh rather than race.
            let now = Instant::now();
            step_start = Some(if now > deadline + plan.length {
                now
            } else {
                deadline
            });
        }
        self.abandon_all();
    }
}
