//! The llm-d router's flow control with in-flight eviction, in front of the engine model
//! (`--priority-bands`, `--eviction`; shared/spec/router-eviction.md).
//!
//! ```text
//!  request ──► priority of its objective ──► its band (FIFO, TTL) ──► 429 rejected-ttl-expired
//!                                               │ strict priority, while saturation < ceiling
//!                                               ▼
//!                                  engines.place ──► in flight (tracked)
//!  a band's head blocked ──► reclamation: sheddable victims, lowest priority then newest,
//!                             n sized and paced (reclaim) ──► victim's client: 429 evicted,
//!                                                            its sequence aborted next step
//! ```
//!
//! A request enters by [`FlowControl::admit`] and waits in its band; every pass
//! ([`FlowControl::pass`], run at each arrival and every [`PASS_PERIOD`] by the pool's task)
//! expires, dispatches and evicts. A dispatched request leaves with a [`Lease`]: its eviction
//! token, and on drop (the answer ended, however) it leaves the in-flight set and, if it was
//! evicted, confirms the eviction. Counters leave as Prometheus text ([`FlowControl::render`]).

mod config;
mod reclaim;
#[cfg(test)]
mod tests;
mod victims;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

pub use config::{RouterConfig, SaturationDetector};
use reclaim::{Pacing, Reclamation};
use victims::{choose, Candidate};

use crate::engine::{Placed, Rejection, SequenceSpec};

/// How often the pool's task runs a pass while nothing arrives (saturation changes with steps).
pub(crate) const PASS_PERIOD: Duration = Duration::from_millis(5);
/// Its `x-llm-d-request-dropped-reason` and body.
pub const EVICTED: &str = "evicted";
/// The body of an eviction's 429, as the router words it.
pub const EVICTED_BODY: &str = "request evicted by flow control";
/// The reason of a request that waited in its band past the TTL.
pub const REJECTED_TTL_EXPIRED: &str = "rejected-ttl-expired";

/// What the router places requests on: the engines.
pub(crate) trait Engines {
    /// The utilization detector's saturation now.
    fn utilization(&self) -> f64;
    /// Places a request on an engine.
    fn place(&self, spec: SequenceSpec) -> Result<Placed, Rejection>;
}

/// A dispatched request: its tokens, and the lease that ties it to the router.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub placed: Placed,
    pub lease: Lease,
}

/// A request in flight at the router. Cancelled `evicted` means the router evicted it; dropping
/// the lease ends its stream at the router.
#[derive(Debug)]
pub(crate) struct Lease {
    flow: Arc<FlowControl>,
    id: u64,
    pub evicted: CancellationToken,
}

impl Lease {
    /// The evicted request had made `tokens` output tokens: work thrown away.
    pub(crate) fn wasted(&self, tokens: u64) {
        self.flow.redone.fetch_add(tokens, Relaxed);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.flow
            .finish(self.id, self.evicted.is_cancelled(), Instant::now());
    }
}

/// An answer to a waiter, sent once the router's lock is released.
type Reply = (
    oneshot::Sender<Result<Admitted, Rejection>>,
    Result<Admitted, Rejection>,
);

/// A request waiting in its band.
#[derive(Debug)]
struct Waiter {
    spec: SequenceSpec,
    arrived: Instant,
    reply: oneshot::Sender<Result<Admitted, Rejection>>,
}

/// A request in flight, as eviction sees it.
#[derive(Debug)]
struct Tracked {
    id: u64,
    priority: i32,
    dispatched: Instant,
    evict: CancellationToken,
}

/// The router's state, behind one lock.
#[derive(Debug)]
struct State {
    bands: BTreeMap<i32, VecDeque<Waiter>>,
    /// In flight and not (yet) evicted: eviction's candidates and its in-flight count.
    tracked: Vec<Tracked>,
    /// In flight, evicted or not, until the answer ends: the concurrency detector's count.
    dispatched: usize,
    next_id: u64,
    reclaim: Reclamation,
    /// `revocations_issued_total` by the demand's priority.
    issued: BTreeMap<i32, u64>,
    /// `requests_total` by (outcome, priority).
    outcomes: BTreeMap<(&'static str, i32), u64>,
}

/// The router's flow control.
#[derive(Debug)]
pub(crate) struct FlowControl {
    cfg: RouterConfig,
    priorities: HashMap<String, i32>,
    /// The concurrency detector's capacity: engines × max concurrency.
    capacity: f64,
    state: Mutex<State>,
    /// Output tokens evicted requests had made (their work, done again when they come back).
    redone: AtomicU64,
}

impl FlowControl {
    /// The router for `pods` engines of `max_num_seqs` slots (`cfg` validated).
    pub(crate) fn new(cfg: &RouterConfig, pods: usize, max_num_seqs: usize) -> Self {
        let priorities = cfg.priorities().unwrap_or_default();
        let mut bands = BTreeMap::new();
        bands.insert(0, VecDeque::new());
        for p in priorities.values() {
            bands.insert(*p, VecDeque::new());
        }
        let per_engine = cfg.max_concurrency.unwrap_or(max_num_seqs).max(1);
        Self {
            capacity: (pods.max(1) * per_engine) as f64,
            state: Mutex::new(State {
                bands,
                tracked: Vec::new(),
                dispatched: 0,
                next_id: 0,
                reclaim: Reclamation::new(Pacing {
                    max_per_decision: cfg.max_revocations_per_decision,
                    grace: cfg.confirmation_grace(),
                    timeout: Duration::from_millis(cfg.confirmation_timeout_ms),
                }),
                issued: BTreeMap::new(),
                outcomes: BTreeMap::new(),
            }),
            priorities,
            cfg: cfg.clone(),
            redone: AtomicU64::new(0),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The priority of a request naming `objective` (none or unknown: 0).
    pub(crate) fn priority_of(&self, objective: Option<&str>) -> i32 {
        objective
            .and_then(|o| self.priorities.get(o.trim()))
            .copied()
            .unwrap_or(0)
    }

    /// Queues a request in its band and waits until it is dispatched or refused.
    pub(crate) async fn admit(
        self: &Arc<Self>,
        engines: &impl Engines,
        spec: SequenceSpec,
        objective: Option<&str>,
    ) -> Result<Admitted, Rejection> {
        let priority = self.priority_of(objective);
        let (reply, answer) = oneshot::channel();
        self.state()
            .bands
            .entry(priority)
            .or_default()
            .push_back(Waiter {
                spec,
                arrived: Instant::now(),
                reply,
            });
        self.pass(engines, Instant::now());
        // Dropped unanswered only when the simulator stops.
        answer.await.unwrap_or(Err(Rejection::QueueFull))
    }

    /// The pool's saturation as the configured detector reads it.
    fn saturation(&self, state: &State, engines: &impl Engines) -> f64 {
        match self.cfg.saturation_detector {
            SaturationDetector::Utilization => engines.utilization(),
            SaturationDetector::Concurrency => state.dispatched as f64 / self.capacity,
        }
    }

    /// One pass: expires waiters past the TTL, dispatches bands' heads in strict priority order
    /// while saturation is under the ceiling, and evicts for the first blocked band.
    pub(crate) fn pass(self: &Arc<Self>, engines: &impl Engines, now: Instant) {
        // Answers are sent after the lock is released: an answer nobody takes drops its lease,
        // which takes the lock.
        let mut replies: Vec<Reply> = Vec::new();
        {
            let mut state = self.state();
            self.expire(&mut state, now, &mut replies);
            let ceiling = self.cfg.saturation_ceiling;
            let mut blocked = None;
            let priorities: Vec<i32> = state.bands.keys().rev().copied().collect();
            'bands: for priority in priorities {
                loop {
                    let has_head = state
                        .bands
                        .get(&priority)
                        .is_some_and(|band| !band.is_empty());
                    if !has_head {
                        break;
                    }
                    let saturation = self.saturation(&state, engines);
                    if saturation >= ceiling {
                        blocked = Some((priority, saturation));
                        break 'bands;
                    }
                    let Some(waiter) = state.bands.get_mut(&priority).and_then(VecDeque::pop_front)
                    else {
                        break;
                    };
                    let answer = self.dispatch(&mut state, engines, priority, waiter.spec, now);
                    replies.push((waiter.reply, answer));
                }
            }
            if let (Some((priority, saturation)), true) = (blocked, self.cfg.eviction) {
                self.reclaim(&mut state, priority, saturation, now);
            }
        }
        for (reply, answer) in replies {
            // A client that left drops the answer (and with it the lease) here, unlocked.
            drop(reply.send(answer));
        }
    }

    /// Answers waiters past the TTL (and forgets those whose client left).
    fn expire(&self, state: &mut State, now: Instant, replies: &mut Vec<Reply>) {
        let ttl = self.cfg.request_ttl();
        let State {
            bands, outcomes, ..
        } = state;
        for (priority, band) in bands.iter_mut() {
            let mut kept = VecDeque::with_capacity(band.len());
            for waiter in band.drain(..) {
                if waiter.reply.is_closed() {
                    *outcomes
                        .entry(("EvictedContextCancelled", *priority))
                        .or_default() += 1;
                } else if now.duration_since(waiter.arrived) >= ttl {
                    *outcomes.entry(("EvictedTTL", *priority)).or_default() += 1;
                    replies.push((waiter.reply, Err(Rejection::TtlExpired)));
                } else {
                    kept.push_back(waiter);
                }
            }
            *band = kept;
        }
    }

    /// Places one request and tracks it in flight.
    fn dispatch(
        self: &Arc<Self>,
        state: &mut State,
        engines: &impl Engines,
        priority: i32,
        spec: SequenceSpec,
        now: Instant,
    ) -> Result<Admitted, Rejection> {
        let placed = engines.place(spec)?;
        let id = state.next_id;
        state.next_id += 1;
        let evicted = CancellationToken::new();
        state.tracked.push(Tracked {
            id,
            priority,
            dispatched: now,
            evict: evicted.clone(),
        });
        state.dispatched += 1;
        *state.outcomes.entry(("Dispatched", priority)).or_default() += 1;
        Ok(Admitted {
            placed,
            lease: Lease {
                flow: Arc::clone(self),
                id,
                evicted,
            },
        })
    }

    /// The reclamation decision for a band of `demand` priority blocked at `saturation`.
    fn reclaim(&self, state: &mut State, demand: i32, saturation: f64, now: Instant) {
        if !state.reclaim.gate_open(now) {
            return;
        }
        let candidates: Vec<Candidate> = state
            .tracked
            .iter()
            .map(|t| Candidate {
                id: t.id,
                priority: t.priority,
                dispatched: t.dispatched,
            })
            .collect();
        let evictable = candidates.iter().filter(|c| victims::evictable(c)).count();
        let (n, credit) = state.reclaim.size(
            saturation,
            self.cfg.saturation_ceiling,
            state.tracked.len(),
            evictable,
        );
        let victims = choose(&candidates, n, demand);
        if victims.is_empty() {
            return;
        }
        state.tracked.retain(|t| {
            let victim = victims.contains(&t.id);
            if victim {
                t.evict.cancel();
            }
            !victim
        });
        state.reclaim.issued(&victims, credit, now);
        *state.issued.entry(demand).or_default() += victims.len() as u64;
        tracing::debug!(
            saturation,
            demand,
            evicted = victims.len(),
            "router: evicted in-flight requests"
        );
    }

    /// A dispatched request's answer ended (`evicted`: by eviction).
    fn finish(&self, id: u64, evicted: bool, now: Instant) {
        let mut state = self.state();
        state.tracked.retain(|t| t.id != id);
        state.dispatched = state.dispatched.saturating_sub(1);
        if evicted {
            state.reclaim.confirm(id, now);
        }
    }

    /// Appends the router's flow-control metrics to `out`.
    pub(crate) fn render(&self, pool: &str, model: &str, out: &mut String) {
        let state = self.state();
        // Writing to a String cannot fail.
        let name = "llm_d_epp_flow_control_queue_size";
        let _ = writeln!(
            out,
            "# HELP {name} Requests held in the flow control queue.\n# TYPE {name} gauge"
        );
        for (priority, band) in &state.bands {
            let _ = writeln!(
                out,
                "{name}{{fairness_id=\"\",priority=\"{priority}\",inference_pool=\"{pool}\",\
                 model_name=\"{model}\",target_model_name=\"{model}\"}} {}",
                band.len()
            );
        }
        let name = "llm_d_epp_flow_control_requests_total";
        let _ = writeln!(
            out,
            "# HELP {name} Requests finalized by flow control.\n# TYPE {name} counter"
        );
        for priority in state.bands.keys() {
            for outcome in ["Dispatched", "EvictedTTL", "EvictedContextCancelled"] {
                let n = state
                    .outcomes
                    .get(&(outcome, *priority))
                    .copied()
                    .unwrap_or(0);
                let _ = writeln!(
                    out,
                    "{name}{{outcome=\"{outcome}\",priority=\"{priority}\",\
                     inference_pool=\"{pool}\"}} {n}"
                );
            }
        }
        let name = "llm_d_epp_flow_control_revocations_issued_total";
        let _ = writeln!(
            out,
            "# HELP {name} Revocations issued, by the demand's priority.\n# TYPE {name} counter"
        );
        for priority in state.bands.keys() {
            let n = state.issued.get(priority).copied().unwrap_or(0);
            let _ = writeln!(
                out,
                "{name}{{priority=\"{priority}\",inference_pool=\"{pool}\"}} {n}"
            );
        }
        let name = "llm_d_epp_flow_control_revocations_total";
        let outcomes = state.reclaim.outcomes;
        let _ = writeln!(
            out,
            "# HELP {name} Revocations by terminal outcome.\n# TYPE {name} counter\n\
             {name}{{outcome=\"confirmed\",inference_pool=\"{pool}\"}} {}\n\
             {name}{{outcome=\"timed_out\",inference_pool=\"{pool}\"}} {}",
            outcomes.confirmed, outcomes.timed_out
        );
    }

    /// Output tokens evicted requests had made.
    pub(crate) fn redone(&self) -> u64 {
        self.redone.load(Relaxed)
    }

    /// Revocations issued so far, over every priority.
    pub(crate) fn evictions(&self) -> u64 {
        self.state().issued.values().sum()
    }
}
