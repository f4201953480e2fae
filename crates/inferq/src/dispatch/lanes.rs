//! The queues the processor serves, one lane each: a lane is a queue's [`QueueCtx`], its
//! consumer, outbox and upkeep tasks, and the channel that feeds its pool. [`Lanes`] starts them
//! (at start-up, from the transport config) and changes them when a queues config reload asks
//! (see [`super::reload`]):
//!
//! - an unchanged queue (same `id`, same settings) keeps its lane: consumer, gate, channel and
//!   claims are untouched;
//! - a new or changed queue gets its gate and channel built first; only when every one could be
//!   built are they swapped in (one that cannot leaves everything as it was);
//! - a removed (or replaced) lane is retired: its consumer, reclaimer and promoter stop, its
//!   requests still waiting for a worker are released back to pending by the pool, in-flight
//!   ones may finish for `--drain-timeout` and are then aborted and released, their outcomes are
//!   written, and only then do its lease renewals stop. Its backlog stays in Redis; its claim
//!   and outbox depths read 0 and its backlog series is removed, so `/metrics` shows no lane
//!   that no longer runs.
//!
//! The queues run are the config's (replaced by [`Lanes::apply`]) followed by those `fair-share`
//! found (replaced by [`Lanes::discover`], see [`super::discovery`]); a found queue the config
//! also lists runs once, with the config's settings.
//!
//! Every lane's tasks also run on the processor's trackers, so a shutdown waits for a lane being
//! retired just as for a running one.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::consumer::{self, run_consumer, Polling};
use super::context::{Job, QueueCtx};
use super::fair_share::{LaneTurns, Turns};
use super::gates::Gate;
use super::holdings::{Abort, Holdings};
use super::load::Load;
use super::outbox::{self, run_outbox};
use super::upkeep;
use crate::config::{QueueConfig, TransportKind};
use crate::gateway;
use crate::ops::{Metrics, QueueLabels, Readiness};
use crate::queue::{traced::Con, Queue};
use inferq_client::target::Target;
use inferq_client::ClaimSettings;

/// How often in-flight requests' cancel markers are checked.
const CANCEL_CHECK_EVERY: Duration = Duration::from_millis(500);

/// How often a retiring lane looks whether its claims are all done.
const RETIRE_LOOK_EVERY: Duration = Duration::from_millis(50);

/// A queue's metric labels.
pub fn queue_labels(q: &QueueConfig) -> QueueLabels {
    QueueLabels {
        queue_id: q.id.clone(),
        queue_name: q.queue_name.clone(),
        pool_name: q.worker_pool_id.clone(),
    }
}

/// What every lane is wired to: the connection, the settings shared by all queues, the pools'
/// inputs, and the processor's stop tokens and task trackers.
pub struct Wiring {
    pub con: Con,
    pub target: Target,
    pub claim: ClaimSettings,
    pub kind: TransportKind,
    /// The transport's `result_queue_name`.
    pub default_result_list: String,
    /// The Go retry set, whose due entries the promoters move.
    pub retry_queue_name: String,
    /// The key names no message may name as its result list, updated as queues change.
    pub reserved: Arc<super::reserved::Reserved>,
    pub polling: Polling,
    pub promote_every: Duration,
    /// `--metrics-backlog-poll-interval`, when on.
    pub backlog_every: Option<Duration>,
    /// How long a removed queue's in-flight requests may finish.
    pub drain_timeout: Duration,
    pub metrics: Arc<Metrics>,
    pub readiness: Readiness,
    /// Each pool's gate, by pool id.
    pub pool_gates: HashMap<String, Arc<dyn Gate>>,
    /// Each pool's intake of new queue channels, by pool id (see `processor::run_pool`).
    pub pools: HashMap<String, mpsc::UnboundedSender<mpsc::Receiver<Job>>>,
    /// Each `fair-share` pool's room for claimed requests waiting for a worker, by pool id.
    pub turns: HashMap<String, Arc<Turns>>,
    pub stop_claiming: CancellationToken,
    pub stop_upkeep: CancellationToken,
    pub flush: CancellationToken,
    pub consumers: TaskTracker,
    pub outboxes: TaskTracker,
    pub upkeep: TaskTracker,
}

impl std::fmt::Debug for Wiring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Wiring").finish_non_exhaustive()
    }
}

/// One running queue.
struct Lane {
    ctx: Arc<QueueCtx>,
    /// Stops its consumer, reclaimer and promoter (a child of the processor's).
    claiming: CancellationToken,
    /// Stops its renewals, cancel checks and backlog reports.
    upkeep: CancellationToken,
    /// Lets its outbox end once nothing is left to write.
    flush: CancellationToken,
    consumer: TaskTracker,
    outbox: TaskTracker,
    tasks: TaskTracker,
    /// Whether it is the config's first queue (Go's fallback for retry entries naming none).
    first: Arc<AtomicBool>,
}

/// A lane built but not started yet.
struct Built {
    lane: Lane,
    jobs: mpsc::Sender<Job>,
    intake: mpsc::Receiver<Job>,
    outcomes: mpsc::UnboundedReceiver<outbox::Outgoing>,
}

/// What a reload changed, by queue id.
#[derive(Default, PartialEq, Eq)]
pub struct Change {
    pub added: Vec<String>,
    pub changed: Vec<String>,
    pub removed: Vec<String>,
}

impl std::fmt::Debug for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Change").finish_non_exhaustive()
    }
}

/// The lanes the processor runs, and those being retired.
pub struct Lanes {
    wiring: Wiring,
    /// The running lanes, in config order.
    running: Vec<Lane>,
    /// Every queue context that may hold claims: running lanes and retiring ones.
    alive: Arc<Mutex<Vec<Arc<QueueCtx>>>>,
    /// Stops the wake-up listener of the current set of lanes.
    doorbell: CancellationToken,
    /// The queues of the config, as last applied.
    configured: Vec<QueueConfig>,
    /// The queues `fair-share` found, as last applied.
    discovered: Vec<QueueConfig>,
}

impl std::fmt::Debug for Lanes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lanes").finish_non_exhaustive()
    }
}

impl Lanes {
    pub fn new(wiring: Wiring) -> Lanes {
        Lanes {
            wiring,
            running: Vec::new(),
            alive: Arc::default(),
            doorbell: CancellationToken::new(),
            configured: Vec::new(),
            discovered: Vec::new(),
        }
    }

    /// Runs the config's `queues` and the found `discovered` ones (see [`Lanes::apply`]): the
    /// found ones are replaced, the config's kept.
    pub fn discover<E>(
        &mut self,
        discovered: Vec<QueueConfig>,
        gate: impl FnMut(&QueueConfig) -> Result<Option<Arc<dyn Gate>>, E>,
    ) -> Result<Change, (String, E)> {
        let configured = self.configured.clone();
        let before = std::mem::replace(&mut self.discovered, discovered);
        let applied = self.apply(&configured, gate);
        if applied.is_err() {
            self.discovered = before;
        }
        applied
    }

    /// The running lane of the queue named `queue_name`.
    pub fn context_of(&self, queue_name: &str) -> Option<Arc<QueueCtx>> {
        self.running
            .iter()
            .find(|l| l.ctx.spec.queue_name == queue_name)
            .map(|l| l.ctx.clone())
    }

    /// The running queues' contexts, in config order.
    pub fn contexts(&self) -> Vec<Arc<QueueCtx>> {
        self.running.iter().map(|l| l.ctx.clone()).collect()
    }

    /// Every context that may still hold claims, as lanes start and retire (for a shutdown's
    /// abort).
    pub fn alive_handle(&self) -> Arc<Mutex<Vec<Arc<QueueCtx>>>> {
        self.alive.clone()
    }

    /// Whether a queue like `q` runs now with the same settings.
    fn unchanged(&self, q: &QueueConfig) -> bool {
        self.running
            .iter()
            .any(|l| l.ctx.spec.id == q.id && same(&l.ctx.spec, q))
    }

    /// Runs `queues` (in config order) instead of the running ones. `gate` builds the queue gate
    /// of a new or changed queue; if any fails, nothing changes and the error is returned with
    /// where the queue's gate parameters are (`queues[1].gate_params`).
    pub fn apply<E>(
        &mut self,
        queues: &[QueueConfig],
        gate: impl FnMut(&QueueConfig) -> Result<Option<Arc<dyn Gate>>, E>,
    ) -> Result<Change, (String, E)> {
        let mut all = queues.to_vec();
        for d in &self.discovered {
            if !all
                .iter()
                .any(|q| q.queue_name == d.queue_name || q.id == d.id)
            {
                all.push(d.clone());
            }
        }
        let before = std::mem::replace(&mut self.configured, queues.to_vec());
        let applied = self.run_queues(&all, gate);
        if applied.is_err() {
            self.configured = before;
        } else {
            self.wiring.reserved.update(&all);
        }
        applied
    }

    /// Runs `queues` instead of the running ones (see [`Lanes::apply`]).
    fn run_queues<E>(
        &mut self,
        queues: &[QueueConfig],
        mut gate: impl FnMut(&QueueConfig) -> Result<Option<Arc<dyn Gate>>, E>,
    ) -> Result<Change, (String, E)> {
        let mut change = Change::default();
        // Built first, all of them: a gate that cannot be built changes nothing.
        let mut built = HashMap::new();
        for q in queues.iter().filter(|q| !self.unchanged(q)) {
            let g = gate(q).map_err(|e| (q.gate_params_field.clone(), e))?;
            built.insert(q.id.clone(), self.build(q, g));
        }
        let mut old: HashMap<String, Lane> = std::mem::take(&mut self.running)
            .into_iter()
            .map(|l| (l.ctx.spec.id.clone(), l))
            .collect();
        for q in queues {
            let lane = match built.remove(&q.id) {
                Some(b) => {
                    match old.remove(&q.id) {
                        Some(replaced) => {
                            change.changed.push(q.id.clone());
                            self.retire(replaced);
                        }
                        None => change.added.push(q.id.clone()),
                    }
                    self.launch(b)
                }
                None => match old.remove(&q.id) {
                    Some(kept) => kept,
                    None => continue,
                },
            };
            self.running.push(lane);
        }
        let mut removed: Vec<Lane> = old.into_values().collect();
        removed.sort_by(|a, b| a.ctx.spec.id.cmp(&b.ctx.spec.id));
        for lane in removed {
            change.removed.push(lane.ctx.spec.id.clone());
            self.retire(lane);
        }
        for (i, lane) in self.running.iter().enumerate() {
            lane.first.store(i == 0, Ordering::SeqCst);
        }
        self.ring_for(&change);
        Ok(change)
    }

    /// Listens for wake-ups of the running queues, in place of the listener of the last set.
    fn ring_for(&mut self, change: &Change) {
        if change == &Change::default() {
            return;
        }
        self.doorbell.cancel();
        self.doorbell = self.wiring.stop_claiming.child_token();
        if !self.running.is_empty() {
            self.wiring.upkeep.spawn(super::doorbell::listen(
                self.wiring.target.clone(),
                self.contexts(),
                self.doorbell.clone(),
            ));
        }
    }

    /// A lane for `q`, with its channels, not started.
    fn build(&self, q: &QueueConfig, gate: Option<Arc<dyn Gate>>) -> Built {
        let w = &self.wiring;
        let (outbox_tx, outcomes) = mpsc::unbounded_channel();
        let labels = queue_labels(q);
        let pool_labels = QueueLabels {
            queue_id: String::new(),
            queue_name: String::new(),
            pool_name: q.worker_pool_id.clone(),
        };
        let default_url = gateway::join_url(&q.igw_base_url, &q.request_path_url)
            .map_err(|e| e.to_string())
            .and_then(|url| gateway::parse_target(&url));
        let queue = Queue::new(w.con.clone(), &q.queue_name, w.claim);
        let ctx = Arc::new(QueueCtx {
            spec: q.clone(),
            queue: match w.kind {
                TransportKind::SortedSet => queue,
                TransportKind::PubSub => queue.publishing_results(),
            },
            holdings: Holdings::new(w.claim.lease),
            outbox: outbox_tx,
            outbox_load: Arc::new(Load::new(outbox::MAX_WAITING_BYTES)),
            intake_load: Arc::new(Load::new(consumer::MAX_WAITING_BYTES)),
            series: w.metrics.queue_series(&labels),
            labels,
            metrics: w.metrics.clone(),
            wake: tokio::sync::Notify::new(),
            parked: tokio::sync::Notify::new(),
            listening: AtomicBool::new(false),
            default_result_list: w.default_result_list.clone(),
            reserved: matches!(w.kind, TransportKind::SortedSet).then(|| w.reserved.clone()),
            default_url,
            gate,
            pool_gate: w.pool_gates.get(&q.worker_pool_id).cloned(),
            pool_labels,
            last_chance: Default::default(),
            readiness: w.readiness.clone(),
            state: Default::default(),
            found: !self.configured.iter().any(|c| c.id == q.id),
            turns: w.turns.get(&q.worker_pool_id).map(|t| LaneTurns::new(t, q)),
        });
        // Room for two batches: one being worked off while the next is claimed.
        let (jobs, intake) = mpsc::channel(w.polling.batch.saturating_mul(2));
        Built {
            lane: Lane {
                ctx,
                claiming: w.stop_claiming.child_token(),
                upkeep: w.stop_upkeep.child_token(),
                flush: w.flush.child_token(),
                consumer: TaskTracker::new(),
                outbox: TaskTracker::new(),
                tasks: TaskTracker::new(),
                first: Arc::new(AtomicBool::new(false)),
            },
            jobs,
            intake,
            outcomes,
        }
    }

    /// Starts a built lane's tasks and hands its channel to its pool.
    fn launch(&self, b: Built) -> Lane {
        let w = &self.wiring;
        let Built {
            lane,
            jobs,
            intake,
            outcomes,
        } = b;
        let ctx = &lane.ctx;
        // Alive before its series are made: a lane of the same labels retiring meanwhile
        // leaves them to this one (see `Lanes::retire`).
        self.alive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(ctx.clone());
        w.metrics
            .precreate_queue(&ctx.labels, matches!(w.kind, TransportKind::PubSub));
        let upkeep = |fut| spawn_on(&w.upkeep, &lane.tasks, fut);
        w.outboxes.spawn(lane.outbox.track_future(run_outbox(
            ctx.clone(),
            outcomes,
            lane.flush.clone(),
        )));
        upkeep(Box::pin(upkeep::heartbeat(
            ctx.clone(),
            lane.upkeep.clone(),
        )));
        upkeep(Box::pin(upkeep::cancel_watch(
            ctx.clone(),
            CANCEL_CHECK_EVERY,
            lane.upkeep.clone(),
        )));
        // Reclaim and promote move work towards this instance: they stop with claiming, so a
        // shutting-down (or retiring) lane takes over nothing it would not finish.
        upkeep(Box::pin(upkeep::reclaimer(
            ctx.clone(),
            lane.claiming.clone(),
        )));
        upkeep(Box::pin(upkeep::promoter(
            ctx.clone(),
            w.promote_every,
            Some(w.retry_queue_name.clone()),
            lane.first.clone(),
            lane.claiming.clone(),
        )));
        // A found queue (`fair-share`) reports its backlog as a listed one does: one pipeline
        // per tenant and interval (15 s by default), while its lane runs.
        if let Some(every) = w.backlog_every {
            upkeep(Box::pin(upkeep::backlog(
                ctx.clone(),
                every,
                lane.upkeep.clone(),
            )));
        }
        w.consumers.spawn(lane.consumer.track_future(run_consumer(
            ctx.clone(),
            jobs,
            w.polling,
            lane.claiming.clone(),
        )));
        if let Some(pool) = w.pools.get(&ctx.spec.worker_pool_id) {
            // A pool that is gone (shutting down) drops the channel: the consumer then
            // releases what it claimed.
            let _ = pool.send(intake);
        }
        lane
    }

    /// Retires a lane in the background (see the module comment). Once it has stopped, its
    /// readings are retired too ([`Metrics::retire_queue`]) unless a lane of the same labels
    /// runs again (a found queue found again, a reload that changed a queue's settings).
    fn retire(&self, lane: Lane) {
        let alive = self.alive.clone();
        let drain = self.wiring.drain_timeout;
        self.wiring.upkeep.spawn(async move {
            let ctx = lane.ctx.clone();
            retire(lane, drain).await;
            let mut alive = alive.lock().unwrap_or_else(PoisonError::into_inner);
            alive.retain(|c| !Arc::ptr_eq(c, &ctx));
            if !alive.iter().any(|c| c.labels == ctx.labels) {
                ctx.metrics.retire_queue(&ctx.labels);
            }
        });
    }
}

/// A lane's background task, on the processor's tracker and the lane's own.
type Task = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

fn spawn_on(processor: &TaskTracker, lane: &TaskTracker, task: Task) {
    processor.spawn(lane.track_future(task));
}

/// Whether two configs of a queue are the same but for where in the file it is.
fn same(a: &QueueConfig, b: &QueueConfig) -> bool {
    let mut b = b.clone();
    b.gate_params_field.clone_from(&a.gate_params_field);
    *a == b
}

/// Stops a lane without losing what it holds: no more claims; what waits for a worker goes
/// back to pending (the pool drops it, which releases it); in-flight requests get the drain
/// time, then are aborted and released; once every outcome is written, its upkeep stops.
async fn retire(lane: Lane, drain: Duration) {
    let ctx = &lane.ctx;
    ctx.state.retire();
    lane.claiming.cancel();
    lane.consumer.close();
    lane.consumer.wait().await;
    consumer::forget_troubles(ctx);
    if !settled(ctx, Some(drain), &lane.upkeep).await && !lane.upkeep.is_cancelled() {
        tracing::warn!(queue = %ctx.queue.name(), drain_timeout = ?drain, held = ctx.holdings.len(), "removed queue: drain timeout; aborting its in-flight requests and releasing their claims");
        ctx.holdings.abort_all(Abort::Shutdown);
        settled(ctx, None, &lane.upkeep).await;
    }
    lane.flush.cancel();
    lane.outbox.close();
    lane.outbox.wait().await;
    lane.upkeep.cancel();
    lane.tasks.close();
    lane.tasks.wait().await;
    tracing::info!(queue = %ctx.queue.name(), id = %ctx.spec.id, "removed queue stopped; its backlog stays in Redis");
}

/// Waits until the lane holds no claim (every outcome written), for at most `limit`, or until
/// the processor stops its upkeep (a shutdown, which then takes over). Whether it holds none.
async fn settled(ctx: &QueueCtx, limit: Option<Duration>, stop: &CancellationToken) -> bool {
    let until = limit.map(|l| tokio::time::Instant::now() + l);
    loop {
        if ctx.holdings.is_empty() {
            return true;
        }
        if stop.is_cancelled() || until.is_some_and(|u| tokio::time::Instant::now() >= u) {
            return false;
        }
        tokio::time::sleep(RETIRE_LOOK_EVERY).await;
    }
}
