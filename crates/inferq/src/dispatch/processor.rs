//! The processor's lifecycle: start the health and metrics servers, connect to Redis (retrying
//! while it is down, not ready meanwhile), start one dispatcher per pool and one lane of tasks
//! per queue ([`super::lanes`]), watch the queues config for reloads ([`super::reload`]), report
//! ready, and on shutdown: stop claiming, release unstarted claims at once, drain
//! in-flight work for `--drain-timeout`, release what is left, flush the outbox, stop.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::consumer::Polling;
use super::context::{Job, QueueCtx};
use super::fair_share::SharedWeights;
use super::gates::{self, Gate, GateEnv, GateOwner};
use super::holdings::Abort;
use super::lanes::{queue_labels, Lanes, Wiring};
use super::merge::{tier_bucket, FairShare, Merge, RandomRobin, TierPriority};
use super::reload::{GateFactory, Reloader};
use super::trace::RequestTracer;
use super::worker::{work, WorkerEnv};
use crate::config::reload::{ReloadSource, ReloadSpec};
use crate::config::{MergePolicyKind, RunConfig, TlsFiles, TransportKind};
use crate::gateway::{self, GatewayClient, GatewayTls};
use crate::ops::{
    metrics::PoolLabels, otel::Otel, serve_health, serve_metrics, Metrics, QueueLabels, Readiness,
};
use crate::queue::traced::Con;
use inferq_client::connect;
use inferq_client::scripts::SCRIPTS;
use inferq_client::target::{Link, Target};

/// Why the processor could not run.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error("cannot listen for {what} on {addr}: {source}")]
    Bind {
        what: &'static str,
        addr: SocketAddr,
        source: std::io::Error,
    },
    /// The Redis server runs in cluster mode but the transport says otherwise.
    #[error(
        "invalid config: mode: this Redis runs in cluster mode; set \"mode\": \"cluster\" in the \
         transport config (and seed nodes in \"addrs\")"
    )]
    ClusterMode,
    /// A queue's or pool's gate cannot be built; `field` names it as the user wrote it
    /// (`queues[0].gate_params`, `pools[1].gate_params`, or the legacy flag it came from).
    #[error("invalid config: {field}: {source}")]
    Gate {
        field: String,
        #[source]
        source: gates::GateError,
    },
    /// The Redis target (URL, TLS files, topology) cannot be used.
    #[error("invalid config: {0}")]
    Target(#[source] inferq_client::connect::ConnectError),
    #[error("gateway client: {0}")]
    Gateway(#[from] gateway::GatewayError),
    #[error(transparent)]
    Otel(#[from] crate::ops::otel::OtelError),
}

impl DispatchError {
    /// Whether the user's input is at fault (exit code 2), not the world.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            DispatchError::ClusterMode
                | DispatchError::Gate { .. }
                | DispatchError::Target(_)
                | DispatchError::Gateway(_)
        )
    }
}

fn gateway_tls(tls: &Option<TlsFiles>) -> GatewayTls {
    match tls {
        None => GatewayTls::default(),
        Some(t) => GatewayTls {
            ca_cert: t.ca_cert.clone(),
            cert: t.client.as_ref().map(|c| c.cert.clone()),
            key: t.client.as_ref().map(|c| c.key.clone()),
            insecure_skip_verify: t.insecure_skip_verify,
        },
    }
}

async fn connect_until_up(
    target: &Target,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Option<Link> {
    let mut attempt = 0u32;
    loop {
        match target.connect().await {
            Ok(mut con) => match SCRIPTS.load_all(&mut con).await {
                Ok(()) => {
                    readiness.set_problem(None);
                    return Some(con);
                }
                // Logged before /readyz says so, so whoever reads it finds the log line too.
                Err(e) => {
                    let e = connect::explained(target.client(), &e).await;
                    if attempt % 10 == 0 {
                        tracing::warn!(error = %e, "cannot load scripts into Redis; retrying (not ready meanwhile)");
                    }
                    readiness.set_problem(Some(format!("redis: cannot load scripts: {e}")));
                }
            },
            Err(e) => {
                // A server at maxclients shows only as a reset: it is asked why.
                let e = match e.redis() {
                    Some(re) => connect::explained(target.client(), re).await,
                    None => e.to_string(),
                };
                if attempt % 10 == 0 {
                    tracing::warn!(error = %e, mode = target.topology().mode(), "cannot reach Redis; retrying (not ready meanwhile)");
                }
                readiness.set_problem(Some(format!("redis: cannot connect: {e}")));
            }
        }
        attempt = attempt.saturating_add(1);
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
    }
}

/// A server in cluster mode given as standalone or Sentinel would refuse the first script that
/// touches two slots: refused at start-up instead, saying what to set.
async fn refuse_cluster(con: &mut Link) -> Result<(), DispatchError> {
    let info: String = match redis::cmd("INFO").arg("cluster").query_async(con).await {
        Ok(info) => info,
        Err(e) => {
            // A user without INFO: the check is skipped, and said so (a cluster would then
            // refuse the first script touching two slots).
            tracing::warn!(error = %e, "cannot ask Redis whether it runs in cluster mode (INFO); going on as if not");
            String::new()
        }
    };
    if info.contains("cluster_enabled:1") {
        return Err(DispatchError::ClusterMode);
    }
    Ok(())
}

/// A queue gate that cannot be built, named as the user wrote it (`queues[0].gate_params`, or
/// the legacy flag it came from).
fn queue_gate_error(q: &crate::config::QueueConfig, e: gates::GateError) -> DispatchError {
    DispatchError::Gate {
        field: q.gate_params_field.clone(),
        source: e,
    }
}

/// Runs the processor until `shutdown` is cancelled, then shuts down gracefully.
pub async fn run(config: RunConfig, shutdown: CancellationToken) -> Result<(), DispatchError> {
    run_with(config, shutdown, None).await
}

/// Logged at start-up on the redis-pubsub transport, as Go does since #442.
pub const PUBSUB_DEPRECATED: &str = "the redis-pubsub transport is deprecated and will be removed \
    (in Go no earlier than v0.12): move to --transport=redis-sortedset, whose queues inferq \
    already admits the channel's messages into";

/// [`run`], reloading the queues config at every message of `hangups` (SIGHUP) when
/// `config.reload` allows it.
///
/// Start-up checks everything it can before it listens or connects (the Redis target, the
/// gateway client, every gate), then serves health and metrics, connects, starts the pools,
/// the queues' lanes and the background tasks, and reports ready; on shutdown it drains.
pub async fn run_with(
    config: RunConfig,
    shutdown: CancellationToken,
    hangups: Option<mpsc::Receiver<()>>,
) -> Result<(), DispatchError> {
    let metrics = Arc::new(Metrics::new());
    metrics.precreate_process();
    let transport = &config.transport;
    if transport.kind == TransportKind::PubSub {
        tracing::warn!("{PUBSUB_DEPRECATED}");
    }
    raise_fd_limit(&config);
    let target = Target::new(
        transport.url.expose(),
        &config.redis_tls,
        transport.topology.clone(),
    )
    .map_err(DispatchError::Target)?;
    let gateway_client = GatewayClient::new(
        &gateway_tls(&config.tls),
        usize::try_from(config.total_workers()).unwrap_or(64),
    )?;
    let gates = Gates::build(&config, &metrics)?;
    let servers = Servers::start(&config, &metrics).await?;

    tracing::info!(transport = transport.kind.name(), redis = %transport.url.redacted(), mode = transport.topology.mode(), queues = transport.queues.len(), "inferq starting");
    let Some(con) = connect(&target, &servers.readiness, &shutdown).await? else {
        servers.stop.cancel();
        return Ok(());
    };
    let otel = start_otel(&config)?;
    let con = traced_if_asked(con, otel.as_ref(), &config, &target);
    // Before "ready": an operator reading the start-up lines sees that Redis may evict keys.
    let memory = super::memory::check_at_start(&con).await;

    arm_fault_injection();
    let processor = Processor {
        config: &config,
        metrics,
        readiness: servers.readiness.clone(),
        target,
        con,
        tasks: Tasks::new(),
        weights: match &config.merge_policy.kind {
            MergePolicyKind::FairShare(fs) => Some(Arc::new(std::sync::RwLock::new(
                super::discovery::initial_weights(fs),
            ))),
            _ => None,
        },
    };
    let env = processor.worker_env(gateway_client, otel.as_ref());
    let lanes = processor.start_lanes(&env, gates.pools, gates.queues);
    let alive = lanes.alive_handle();
    processor.start_background(&lanes, memory);
    let lanes = Arc::new(Mutex::new(lanes));
    let factory = gate_factory(&processor.metrics, gates.env);
    processor.start_discovery(&lanes, &factory);
    if let Some(spec) = config.reload.clone() {
        processor.watch_reloads(spec, lanes, factory, hangups);
    }
    servers.readiness.set(true);
    tracing::info!(health = %servers.health_addr, metrics = %servers.metrics_addr, "inferq ready");

    shutdown.cancelled().await;
    processor.drain(&alive).await;
    if let Some(otel) = otel {
        otel.shutdown().await;
    }
    servers.stop().await;
    tracing::info!("inferq stopped");
    Ok(())
}

/// Raises the open-file limit to its hard limit, and warns when even that is short for the
/// workers: done before anything opens a descriptor, as every busy worker holds a gateway
/// connection.
fn raise_fd_limit(config: &RunConfig) {
    let fds = crate::ops::fd_limit::raise();
    if fds.soft != fds.before {
        tracing::info!(from = ?fds.before, to = ?fds.soft, "raised the open-file limit (RLIMIT_NOFILE) to its hard limit");
    }
    if let Some(warning) = crate::ops::fd_limit::shortfall(&fds, config.total_workers()) {
        tracing::warn!("{warning}");
    }
}

/// Every gate of the config, built at start-up so that a bad one is reported before anything
/// listens or connects (and a metric gate logs its start-up lines once).
struct Gates {
    /// What building a gate needs: kept for the gates a reload builds.
    env: GateEnv,
    /// Each pool's gate, by pool id.
    pools: HashMap<String, Arc<dyn Gate>>,
    /// Each queue's gate, one per queue in config order.
    queues: Vec<Option<Arc<dyn Gate>>>,
}

impl Gates {
    fn build(config: &RunConfig, metrics: &Arc<Metrics>) -> Result<Gates, DispatchError> {
        let env = GateEnv {
            prometheus_url: config.prometheus.url.clone(),
            prometheus_cache_ttl: config.prometheus.cache_ttl,
            owner: None,
            pool_workers: None,
        };
        // Each gate is built with its owner, so its metric gates (wrapped or not) record their
        // readings under the owner's labels.
        let owned = |labels: &QueueLabels| GateEnv {
            owner: Some(GateOwner {
                metrics: metrics.clone(),
                labels: labels.clone(),
            }),
            ..env.clone()
        };
        let mut pools: HashMap<String, Arc<dyn Gate>> = HashMap::new();
        for (i, pool) in config.pools.iter().enumerate() {
            if let Some(spec) = &pool.gate {
                let labels = QueueLabels {
                    queue_id: String::new(),
                    queue_name: String::new(),
                    pool_name: pool.id.clone(),
                };
                let env = GateEnv {
                    pool_workers: Some(pool.workers),
                    ..owned(&labels)
                };
                let gate = gates::build(spec, &env).map_err(|source| DispatchError::Gate {
                    field: format!("pools[{i}].gate_params"),
                    source,
                })?;
                metrics.precreate_gate_series(&labels);
                pools.insert(pool.id.clone(), gate);
            }
        }
        let mut queues = Vec::new();
        for q in &config.transport.queues {
            queues.push(match &q.gate {
                Some(spec) => Some(
                    gates::build(spec, &owned(&queue_labels(q)))
                        .map_err(|e| queue_gate_error(q, e))?,
                ),
                None => None,
            });
        }
        Ok(Gates { env, pools, queues })
    }
}

/// The health and metrics servers, and the readiness the health server reports.
struct Servers {
    readiness: Readiness,
    /// Stops both servers.
    stop: CancellationToken,
    health: tokio::task::JoinHandle<()>,
    metrics: tokio::task::JoinHandle<()>,
    health_addr: SocketAddr,
    metrics_addr: SocketAddr,
}

/// The bounds of the health and metrics listeners' connections: the flags, and by default
/// each listener holds at most 1024 connections, fewer when the open-file limit left after the
/// workers' needs is small.
fn http_limits(config: &RunConfig) -> inferq_http::ConnLimits {
    let workers: u64 = config.pools.iter().map(|p| u64::from(p.workers)).sum();
    let reserve = crate::ops::fd_limit::needed(workers);
    let soft = crate::ops::fd_limit::raise().soft;
    inferq_http::ConnLimits {
        header_read_timeout: config.http_header_read_timeout,
        idle_timeout: config.http_idle_timeout,
        max_connections: config.http_max_connections.unwrap_or_else(|| {
            (inferq_http::ConnLimits::default_max_connections(soft, reserve) / 2).clamp(16, 1024)
        }),
    }
}

impl Servers {
    /// Listens on `--health-address` and `--metrics-address`: by default every address, IPv6
    /// and IPv4, as Go's `:port` (see `ops::listen`).
    async fn start(config: &RunConfig, metrics: &Arc<Metrics>) -> Result<Servers, DispatchError> {
        let readiness = Readiness::new();
        let stop = CancellationToken::new();
        let health_addr = SocketAddr::from((config.health_address, config.health_port));
        let metrics_addr = SocketAddr::from((config.metrics_address, config.metrics_port));
        let limits = http_limits(config);
        let health = serve_health(health_addr, readiness.clone(), limits, stop.clone())
            .await
            .map_err(|source| DispatchError::Bind {
                what: "health",
                addr: health_addr,
                source,
            })?;
        let metrics = serve_metrics(metrics_addr, metrics.clone(), limits, stop.clone())
            .await
            .map_err(|source| DispatchError::Bind {
                what: "metrics",
                addr: metrics_addr,
                source,
            })?;
        Ok(Servers {
            readiness,
            stop,
            health,
            metrics,
            health_addr,
            metrics_addr,
        })
    }

    /// Stops both servers and waits for them.
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.health.await;
        let _ = self.metrics.await;
    }
}

/// Connects to Redis (retrying while it is down, not ready meanwhile; `None` when shutdown
/// comes first), refuses a cluster given as standalone, and lets readiness check the
/// connection.
async fn connect(
    target: &Target,
    readiness: &Readiness,
    shutdown: &CancellationToken,
) -> Result<Option<Link>, DispatchError> {
    let Some(mut con) = connect_until_up(target, readiness, shutdown).await else {
        return Ok(None);
    };
    if !target.is_cluster() {
        refuse_cluster(&mut con).await?;
    }
    readiness.set_connection(con.clone(), target.client().clone());
    Ok(Some(con))
}

/// Starts the OTLP export of request spans, when configured.
fn start_otel(config: &RunConfig) -> Result<Option<Otel>, DispatchError> {
    let Some(settings) = &config.otel else {
        return Ok(None);
    };
    let otel = Otel::start(settings)?;
    tracing::info!(
        endpoint = %crate::config::redact_url(&settings.endpoint),
        service = %settings.service_name,
        redis_commands = config.transport.enable_tracing,
        "exporting request spans over OTLP"
    );
    Ok(Some(otel))
}

/// Go's `enable_tracing`: a span per Redis command the moves send.
fn traced_if_asked(con: Link, otel: Option<&Otel>, config: &RunConfig, target: &Target) -> Con {
    match otel {
        Some(otel) if config.transport.enable_tracing => {
            Con::traced(con, otel.tracer(), target.client().get_connection_info())
        }
        _ => Con::plain(con),
    }
}

/// Arms the `INFERQ_FAULT_CRASH_ON` crash hook when it is set, and says so.
fn arm_fault_injection() {
    if let Some(marker) = super::fault::arm_from_env() {
        tracing::warn!(
            marker = %String::from_utf8_lossy(marker),
            "fault injection armed: a request whose payload carries the marker aborts this process"
        );
    }
}

/// The processor's task groups, and the tokens that stop them, in the order shutdown stops
/// them: reloads, then claiming (consumers and pools), workers (drained), outboxes (flushed),
/// and last the upkeep.
struct Tasks {
    stop_reload: CancellationToken,
    reloads: TaskTracker,
    stop_claiming: CancellationToken,
    consumers: TaskTracker,
    pools: TaskTracker,
    workers: TaskTracker,
    flush: CancellationToken,
    outboxes: TaskTracker,
    stop_upkeep: CancellationToken,
    upkeep: TaskTracker,
}

impl Tasks {
    fn new() -> Tasks {
        Tasks {
            stop_reload: CancellationToken::new(),
            reloads: TaskTracker::new(),
            stop_claiming: CancellationToken::new(),
            consumers: TaskTracker::new(),
            pools: TaskTracker::new(),
            workers: TaskTracker::new(),
            flush: CancellationToken::new(),
            outboxes: TaskTracker::new(),
            stop_upkeep: CancellationToken::new(),
            upkeep: TaskTracker::new(),
        }
    }
}

/// The processor once connected: what its remaining start-up steps and its shutdown share.
struct Processor<'a> {
    config: &'a RunConfig,
    metrics: Arc<Metrics>,
    readiness: Readiness,
    target: Target,
    con: Con,
    tasks: Tasks,
    /// The tenants' weights `fair-share`'s merges read (and its discovery updates).
    weights: Option<SharedWeights>,
}

/// Builds a new or changed queue's gate, with the queue as owner of its metrics (for reloads
/// and found queues).
fn gate_factory(metrics: &Arc<Metrics>, gate_env: GateEnv) -> GateFactory {
    let owner = metrics.clone();
    Arc::new(move |q| {
        let env = GateEnv {
            owner: Some(GateOwner {
                metrics: owner.clone(),
                labels: queue_labels(q),
            }),
            ..gate_env.clone()
        };
        q.gate
            .as_ref()
            .map(|spec| gates::build(spec, &env))
            .transpose()
    })
}

impl Processor<'_> {
    /// What every worker shares.
    fn worker_env(&self, client: GatewayClient, otel: Option<&Otel>) -> Arc<WorkerEnv> {
        let config = self.config;
        Arc::new(WorkerEnv {
            client,
            request_timeout: config.request_timeout,
            gate_wait_timeout: config.gate_wait_timeout,
            max_evictions: config.max_evictions,
            fairness: config.merge_policy.fairness.clone(),
            stop_claiming: self.tasks.stop_claiming.clone(),
            tracer: otel.map(|o| RequestTracer::new(o.tracer())),
            priority: match &config.merge_policy.kind {
                MergePolicyKind::TierPriority(tier) => Some(tier.clone()),
                MergePolicyKind::RandomRobin | MergePolicyKind::FairShare(_) => None,
            },
            transforms: gateway::transform::Transforms::new(&config.transforms),
        })
    }

    /// Starts the pools, then one lane of tasks per queue, with the queue gates built at
    /// start-up.
    fn start_lanes(
        &self,
        env: &Arc<WorkerEnv>,
        pool_gates: HashMap<String, Arc<dyn Gate>>,
        queue_gates: Vec<Option<Arc<dyn Gate>>>,
    ) -> Lanes {
        let (config, tasks) = (self.config, &self.tasks);
        let transport = &config.transport;
        let polling = Polling {
            interval: transport.poll_interval,
            batch: usize::try_from(transport.batch_size).unwrap_or(10).max(1),
        };
        let pool_inputs = start_pools(
            config,
            self.weights.as_ref(),
            &self.metrics,
            env,
            &tasks.pools,
            &tasks.workers,
            &tasks.stop_claiming,
        );
        let mut lanes = Lanes::new(Wiring {
            con: self.con.clone(),
            target: self.target.clone(),
            claim: config.claim,
            kind: transport.kind,
            default_result_list: transport.result_queue_name.clone(),
            retry_queue_name: transport.retry_queue_name.clone(),
            reserved: super::reserved::Reserved::new(
                &transport.retry_queue_name,
                match &config.merge_policy.kind {
                    MergePolicyKind::FairShare(fs) => Some(fs),
                    MergePolicyKind::TierPriority(_) | MergePolicyKind::RandomRobin => None,
                },
            ),
            polling,
            promote_every: transport.poll_interval.min(Duration::from_millis(500)),
            backlog_every: config
                .metrics_backlog_poll_interval
                .filter(|d| !d.is_zero()),
            drain_timeout: config.drain_timeout,
            metrics: self.metrics.clone(),
            readiness: self.readiness.clone(),
            pool_gates,
            pools: pool_inputs,
            turns: super::fair_share::for_pools(
                &config.merge_policy.kind,
                &config.pools,
                self.weights.as_ref(),
            ),
            stop_claiming: tasks.stop_claiming.clone(),
            stop_upkeep: tasks.stop_upkeep.clone(),
            flush: tasks.flush.clone(),
            consumers: tasks.consumers.clone(),
            outboxes: tasks.outboxes.clone(),
            upkeep: tasks.upkeep.clone(),
        });
        // The gates were built at start-up, one per queue in config order, as `apply` asks for
        // them.
        let mut built = queue_gates.into_iter();
        let _ = lanes.apply(&transport.queues, |_| {
            Ok::<_, std::convert::Infallible>(built.next().flatten())
        });
        lanes
    }

    /// Starts the processor-wide background tasks: the eviction watch and, for the
    /// redis-pubsub transport, the ingress.
    fn start_background(&self, lanes: &Lanes, memory: Option<super::memory::MemoryState>) {
        let tasks = &self.tasks;
        tasks.upkeep.spawn(super::memory::watch(
            self.con.clone(),
            memory,
            tasks.stop_upkeep.clone(),
        ));
        // So does the redis-pubsub ingress: what it admits after that waits in pending for others.
        // (Its queues are not reloaded: see `config::reload::spec`.)
        if self.config.transport.kind == TransportKind::PubSub {
            super::ingress::start(
                &tasks.upkeep,
                self.target.clone(),
                lanes.contexts(),
                tasks.stop_claiming.clone(),
            );
        }
    }

    /// Watches the queues config for reloads (`spec`'s interval, SIGHUP); the reloader owns the
    /// lanes from then on.
    fn watch_reloads(
        &self,
        spec: ReloadSpec,
        lanes: Arc<Mutex<Lanes>>,
        gates: GateFactory,
        hangups: Option<mpsc::Receiver<()>>,
    ) {
        let interval = spec.interval;
        let reloader = Reloader {
            source: ReloadSource::new(spec),
            lanes,
            gates,
            metrics: self.metrics.clone(),
        };
        self.tasks.reloads.spawn(super::reload::watch(
            reloader,
            interval,
            hangups,
            self.tasks.stop_reload.clone(),
        ));
    }

    /// Starts `fair-share`'s discovery of the queues named by its prefix (see
    /// [`super::discovery`]); on the reload tracker, so a shutdown stops it before claiming
    /// stops.
    fn start_discovery(&self, lanes: &Arc<Mutex<Lanes>>, gates: &GateFactory) {
        let MergePolicyKind::FairShare(fs) = &self.config.merge_policy.kind else {
            return;
        };
        let Some(weights) = &self.weights else {
            return;
        };
        if fs.queue_prefix.is_empty() && fs.weights_key.is_empty() {
            return;
        }
        let queues = &self.config.transport.queues;
        let template = queues
            .iter()
            .find(|q| q.id == fs.template_queue)
            .or_else(|| queues.first());
        let Some(template) = template else {
            return;
        };
        let discovery = super::discovery::Discovery {
            policy: fs.clone(),
            scores: HashMap::new(),
            template: template.clone(),
            lanes: lanes.clone(),
            gates: gates.clone(),
            weights: weights.clone(),
            con: self.con.clone(),
            metrics: self.metrics.clone(),
        };
        self.tasks.reloads.spawn(super::discovery::run(
            discovery,
            self.tasks.stop_reload.clone(),
        ));
    }

    /// The graceful shutdown: no longer ready, no reloads, no new claims (unstarted work is
    /// released), in-flight work drained for `--drain-timeout` (then aborted and released), the
    /// outboxes flushed within a lease, and the upkeep stopped.
    async fn drain(&self, alive: &Mutex<Vec<Arc<QueueCtx>>>) {
        let (config, tasks) = (self.config, &self.tasks);
        self.readiness.set(false);
        tracing::info!("shutting down: no new claims; releasing unstarted work");
        // No reload starts or retires a queue from here on.
        tasks.stop_reload.cancel();
        tasks.reloads.close();
        tasks.reloads.wait().await;
        tasks.stop_claiming.cancel();
        tasks.consumers.close();
        tasks.pools.close();
        tasks.consumers.wait().await;
        tasks.pools.wait().await;
        tasks.workers.close();
        if tokio::time::timeout(config.drain_timeout, tasks.workers.wait())
            .await
            .is_err()
        {
            tracing::warn!(drain_timeout = ?config.drain_timeout, "drain timeout: aborting in-flight requests and releasing their claims");
            for ctx in alive.lock().unwrap_or_else(PoisonError::into_inner).iter() {
                ctx.holdings.abort_all(Abort::Shutdown);
            }
            let _ = tokio::time::timeout(Duration::from_secs(5), tasks.workers.wait()).await;
        }
        tasks.flush.cancel();
        tasks.outboxes.close();
        let flush_limit = config.claim.lease + Duration::from_secs(1);
        if tokio::time::timeout(flush_limit, tasks.outboxes.wait())
            .await
            .is_err()
        {
            tracing::warn!("could not write every outcome before the leases ran out; survivors will redo that work");
        }
        tasks.stop_upkeep.cancel();
        tasks.upkeep.close();
        tasks.upkeep.wait().await;
    }
}

/// Starts one task per pool (each fed by the channels of its queues, which [`Lanes`] hands it
/// at start-up and on a reload), and returns each pool's intake of those channels.
fn start_pools(
    config: &RunConfig,
    weights: Option<&SharedWeights>,
    metrics: &Metrics,
    env: &Arc<WorkerEnv>,
    pools: &TaskTracker,
    workers: &TaskTracker,
    stop: &CancellationToken,
) -> HashMap<String, mpsc::UnboundedSender<mpsc::Receiver<Job>>> {
    let mut intakes = HashMap::new();
    for pool in &config.pools {
        // Set at start-up for every configured pool, as Go sets it, serving a queue or not.
        metrics
            .pool_worker_limit
            .get_or_create(&PoolLabels {
                pool_name: pool.id.clone(),
            })
            .set(i64::from(pool.workers));
        let merge = match &config.merge_policy.kind {
            MergePolicyKind::RandomRobin => Merge::Random(RandomRobin::new(Vec::new())),
            MergePolicyKind::TierPriority(tier) => {
                let label = tier.tier_label.clone();
                Merge::Tier(TierPriority::new(
                    Vec::new(),
                    Box::new(move |job: &Job| {
                        tier_bucket(&job.held.envelope.internal.labels, &label)
                    }),
                ))
            }
            MergePolicyKind::FairShare(fs) => {
                let policy = fs.clone();
                let weights = weights.cloned().unwrap_or_default();
                Merge::Fair(
                    FairShare::new(
                        Vec::new(),
                        Box::new(move |job: &Job| {
                            let spec = &job.ctx.spec;
                            let tenant = policy.tenant_of(&spec.queue_name, &spec.id);
                            (Arc::from(tenant), job.held.envelope.request.deadline)
                        }),
                        weights,
                        fs.max_in_flight_per_tenant,
                        fs.burst,
                    )
                    .counting(super::fair_share::Served {
                        family: metrics.fair_share.served.clone(),
                        pool: pool.id.clone(),
                    }),
                )
            }
        };
        if let MergePolicyKind::FairShare(fs) = &config.merge_policy.kind {
            precreate_fair_share(metrics, fs, &config.transport.queues, &pool.id);
        }
        let (intake, queues) = mpsc::unbounded_channel();
        intakes.insert(pool.id.clone(), intake);
        pools.spawn(run_pool(
            usize::try_from(pool.workers).unwrap_or(1).max(1),
            merge,
            queues,
            env.clone(),
            workers.clone(),
            stop.clone(),
        ));
    }
    intakes
}

/// `fair-share`'s series whose labels the config names, at their values from start-up: the
/// served count of each tenant its weights name and of each listed queue of `pool`, the weights.
fn precreate_fair_share(
    metrics: &Metrics,
    fs: &crate::config::FairShare,
    queues: &[crate::config::QueueConfig],
    pool: &str,
) {
    let listed = queues
        .iter()
        .filter(|q| q.worker_pool_id == pool)
        .map(|q| fs.tenant_of(&q.queue_name, &q.id));
    for tenant in fs.weights.keys().map(String::as_str).chain(listed) {
        metrics.fair_share.precreate_served(pool, tenant);
    }
    let weights = super::discovery::initial_weights(fs);
    metrics.fair_share.set_weights(
        weights.by_tenant.iter().map(|(t, w)| (t, *w)),
        weights.default,
    );
}

/// One pool: takes the next request from its queues (random-robin) whenever a worker is free.
/// `queues` brings the channel of each queue it serves (at start-up and on a reload). A request
/// of a queue a reload removed is released instead of started.
async fn run_pool(
    workers: usize,
    mut merge: Merge<Job>,
    mut queues: mpsc::UnboundedReceiver<mpsc::Receiver<Job>>,
    env: Arc<WorkerEnv>,
    tracker: TaskTracker,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(workers));
    // Whether more queues may come (no more once the processor has no reload to make).
    let mut more = true;
    'pool: loop {
        let permit = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            p = slots.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let job = loop {
            if merge.is_empty() && !more {
                break 'pool;
            }
            tokio::select! {
                biased;
                _ = stop.cancelled() => break 'pool,
                input = queues.recv(), if more => match input {
                    Some(input) => merge.add(input),
                    None => more = false,
                },
                j = merge.next(), if !merge.is_empty() => {
                    if let Some(j) = j {
                        break j;
                    }
                }
            }
        };
        // Held by the worker until the request ends (`fair-share`'s per-tenant cap).
        let slot = merge.take_slot();
        if job.ctx.state.is_retired() {
            // Dropped, it releases its claim back to pending.
            job.ctx.series.queue_depth.get().dec();
            drop(job);
            continue;
        }
        // A request starts only while its queue's outbox has room: results the gateway sends
        // faster than Redis takes them slow the pool down instead of piling up.
        if !job.ctx.outbox_load.has_room() {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = job.ctx.outbox_load.room() => {}
            }
        }
        let env = env.clone();
        tracker.spawn(async move {
            let mut job = job;
            job.started();
            work(job, env).await;
            drop(slot);
            drop(permit);
        });
    }
    // Dropping the merge drops every claimed request still waiting for a worker, and each
    // releases its claim back to pending at once.
    drop(merge);
}
