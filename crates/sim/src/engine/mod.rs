//! The engine model: `--pods` simulated vLLM engines behind the simulator's one port, and the
//! router in front of them that picks an engine and sheds load.
//!
//! ```text
//!  request ──► (--priority-bands / --eviction: the router's bands, `crate::router`) ──┐
//!          ──► Pool::submit ──► shed? (--flow-control, sheddable, saturation ≥ 1) ──► 429
//!                 │          ──► least-loaded engine's queue full? (--max-waiting) ──► 429
//!                 ▼
//!          Engine::enqueue (least running + waiting, ties to the lowest index)
//!                 │  one TokenMade per step, on the sequence's channel
//!                 ▼
//!          request::answer: SSE chunks or, at the last token, one JSON answer
//! ```
//!
//! Knobs enter as [`EngineConfig`]; each engine's step loop runs on its own tokio task
//! (`scheduler`). Load leaves as a [`PoolSnapshot`] ([`crate::Sim::pool_snapshot`]) and as
//! Prometheus text (`exposition`).
//!
//! # Layout
//!
//! - `config`: [`EngineConfig`], the step-length formula and validation.
//! - `scheduler`: one engine's queues and step loop (continuous batching).
//! - `histogram`: the latency histograms.
//! - `exposition`: the per-engine and router metrics.
//! - `request`: one engine-mode request, from routing to its answer.
//! - `stream`: the `text/event-stream` answer body.

mod config;
mod exposition;
mod histogram;
pub(crate) mod request;
mod scheduler;
mod stream;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::router::{Engines, FlowControl, Lease, RouterConfig, PASS_PERIOD};

pub use config::{EngineConfig, SaturationMetricNames};
pub use scheduler::EngineLoad;
pub(crate) use scheduler::SequenceSpec;
use scheduler::{Engine, TokenMade};

/// The header naming a request's InferenceObjective, read by `--flow-control`.
pub const OBJECTIVE_HEADER: &str = "x-llm-d-inference-objective";
/// Its deprecated alias, which the router still reads (and inferq, like Go, sends).
pub const OLD_OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// The header explaining a router's 429.
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
/// Its value when the pool is saturated or an engine's queue is full.
pub const REJECTED_SATURATED: &str = "rejected-saturated";

/// The pool's load at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PoolSnapshot {
    /// Each engine's load, by index (`pod="engine-<index>"`).
    pub engines: Vec<EngineLoad>,
    /// The router's saturation: the mean over engines of `max(waiting / 5, kv / 0.8)`.
    pub saturation: f64,
}

/// Why the router refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// `--flow-control` shed a sheddable request while the pool was saturated.
    Shed,
    /// Every engine had `--max-waiting` requests waiting beyond its free slots.
    QueueFull,
    /// It waited in its router band past `--request-ttl-ms`.
    TtlExpired,
}

/// A request placed on an engine: its tokens arrive on `tokens`.
#[derive(Debug)]
pub(crate) struct Placed {
    /// One message per generated token; closes early only if the simulator stops.
    pub tokens: tokio::sync::mpsc::UnboundedReceiver<TokenMade>,
}

/// The engines and the router's settings.
#[derive(Debug)]
pub(crate) struct Pool {
    cfg: EngineConfig,
    engines: Vec<Arc<Engine>>,
    /// The router's flow control with priority bands, when on.
    flow: Option<Arc<FlowControl>>,
    /// Held while choosing and enqueueing, so concurrent arrivals see each other's placement.
    routing: Mutex<()>,
}

impl Pool {
    /// Starts `cfg.pods` engines, each stepping on its own task until `shutdown`, and the
    /// router's passes when its flow control is on.
    pub(crate) fn start(
        cfg: &EngineConfig,
        router: &RouterConfig,
        shutdown: &CancellationToken,
    ) -> Arc<Self> {
        let engines: Vec<Arc<Engine>> = (0..cfg.pods).map(|_| Arc::new(Engine::new(cfg))).collect();
        for engine in &engines {
            let engine = Arc::clone(engine);
            let cfg = cfg.clone();
            let shutdown = shutdown.clone();
            tokio::spawn(async move { engine.run(cfg, shutdown).await });
        }
        let flow = router
            .enabled()
            .then(|| Arc::new(FlowControl::new(router, cfg.pods, cfg.max_num_seqs)));
        let pool = Arc::new(Self {
            cfg: cfg.clone(),
            engines,
            flow,
            routing: Mutex::new(()),
        });
        if pool.flow.is_some() {
            let weak = Arc::downgrade(&pool);
            let shutdown = shutdown.clone();
            tokio::spawn(async move {
                let mut ticks = tokio::time::interval(PASS_PERIOD);
                ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tokio::select! {
                        biased;
                        _ = shutdown.cancelled() => return,
                        _ = ticks.tick() => {}
                    }
                    let Some(pool) = weak.upgrade() else { return };
                    if let Some(flow) = &pool.flow {
                        flow.pass(pool.as_ref(), Instant::now());
                    }
                }
            });
        }
        pool
    }

    /// Routes a request through the router's bands when they are on (it may wait there, and
    /// its lease says whether it gets evicted), else straight to an engine.
    pub(crate) async fn admit(
        &self,
        spec: SequenceSpec,
        objective: Option<&str>,
    ) -> Result<(Placed, Option<Lease>), Rejection> {
        match &self.flow {
            Some(flow) => {
                let admitted = flow.admit(self, spec, objective).await?;
                Ok((admitted.placed, Some(admitted.lease)))
            }
            None => self.submit(spec, objective).map(|placed| (placed, None)),
        }
    }

    /// The router's flow control, when on.
    pub(crate) fn flow(&self) -> Option<&FlowControl> {
        self.flow.as_deref()
    }

    /// Every engine's load and the pool's saturation now.
    pub(crate) fn snapshot(&self) -> PoolSnapshot {
        let engines: Vec<EngineLoad> = self.engines.iter().map(|e| e.load()).collect();
        let saturation = if engines.is_empty() {
            // The router's reading of an empty pool.
            1.0
        } else {
            engines.iter().map(EngineLoad::saturation).sum::<f64>() / engines.len() as f64
        };
        PoolSnapshot {
            engines,
            saturation,
        }
    }

    /// Routes a request to the least-loaded engine, or says why the router refuses it.
    /// `objective` is its `x-llm-d-inference-objective` header, if any.
    pub(crate) fn submit(
        &self,
        spec: SequenceSpec,
        objective: Option<&str>,
    ) -> Result<Placed, Rejection> {
        let _routing = self.routing.lock().unwrap_or_else(PoisonError::into_inner);
        let sheddable = objective.is_some_and(|o| self.cfg.is_sheddable(o));
        if self.cfg.flow_control && sheddable && self.snapshot().saturation >= 1.0 {
            return Err(Rejection::Shed);
        }
        let index = self.place_least_loaded()?;
        self.enqueue(index, spec)
    }

    /// Places a request on the least-loaded engine with room in its queue.
    fn place_least_loaded(&self) -> Result<usize, Rejection> {
        let mut best: Option<(usize, usize)> = None;
        for (index, engine) in self.engines.iter().enumerate() {
            if self.cfg.max_waiting > 0 && engine.backlog() >= self.cfg.max_waiting {
                continue;
            }
            let load = engine.load();
            let queued = load.running + load.waiting;
            if best.is_none_or(|(_, least)| queued < least) {
                best = Some((index, queued));
            }
        }
        best.map(|(index, _)| index).ok_or(Rejection::QueueFull)
    }

    /// Enqueues on engine `index`.
    fn enqueue(&self, index: usize, spec: SequenceSpec) -> Result<Placed, Rejection> {
        let engine = self.engines.get(index).ok_or(Rejection::QueueFull)?;
        Ok(Placed {
            tokens: engine.enqueue(spec),
        })
    }
}

impl Engines for Pool {
    fn utilization(&self) -> f64 {
        self.snapshot().saturation
    }

    fn place(&self, spec: SequenceSpec) -> Result<Placed, Rejection> {
        let _routing = self.routing.lock().unwrap_or_else(PoisonError::into_inner);
        let index = self.place_least_loaded()?;
        self.enqueue(index, spec)
    }
}
