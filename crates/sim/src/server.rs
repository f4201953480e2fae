//! The HTTP face of the simulator: the axum router and its handlers. A completion request comes
//! in as a POST body plus an optional `x-inferq-request-id` header and goes through three stages:
//!
//! ```text
//!  arrive ──► parse body ──► rate-limit fault ──► admission ──► run stage ──► answer
//!  (requests)    │ 400            │ 429              │ 429     (executed, per-id count)
//!                ▼                ▼                  ▼          fault: 400 / 5xx / reset / hang
//!                                                               else: sleep latency, 200
//! ```
//!
//! With `--pods` the engine model answers instead (`engine::request`): no faults, no admission
//! gate, the engines' queues and steps decide latency.
//!
//! Only requests that pass admission count as executions; what then happens to them (success
//! or an injected fault) does not change that; an id that is not a visible-ASCII header value
//! counts in the totals only. Counts leave through `/stats`, `/executions`,
//! `/arrivals` (when each id ran) and `/metrics`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, State};
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use super::arrivals::Arrivals;
use super::engine::{self, Pool};
use super::faults::{Fault, FaultPlan, FaultRates};
use super::listener::ConnControl;
use super::metrics::Stats;
use super::openai::{self, Answer, Endpoint};
use super::{SimConfig, SimError};

/// The header carrying the processor's request id.
pub const REQUEST_ID_HEADER: &str = "x-inferq-request-id";

/// Everything the handlers share, behind one `Arc`.
#[derive(Debug)]
pub(crate) struct SimState {
    cfg: SimConfig,
    /// The fault rates now in force: set at start, replaced at run time by `POST /faults`
    /// (or [`super::Sim::set_faults`]) so a chaos run can switch gateway faults on and off.
    faults: RwLock<FaultPlan>,
    admission: Admission,
    /// Numbers answers so their ids are unique.
    seq: AtomicU64,
    /// `Retry-After` value of every 429, rendered once.
    retry_after: HeaderValue,
    /// Cancelled when the simulator stops; ends sleeps and hangs.
    shutdown: CancellationToken,
    pub(crate) stats: Stats,
    pub(crate) arrivals: Arrivals,
    /// The engine model, when `--pods` ≥ 1; requests then go to it instead of the run stage.
    pub(crate) pool: Option<Arc<Pool>>,
}

impl SimState {
    /// Shared state for a validated config.
    /// Starts the engines' step loops when the engine model is on, so it must run inside a
    /// tokio runtime.
    pub(crate) fn new(cfg: SimConfig, shutdown: CancellationToken) -> Self {
        let pool = cfg
            .engine
            .enabled()
            .then(|| Pool::start(&cfg.engine, &cfg.router, &shutdown));
        Self {
            pool,
            faults: RwLock::new(FaultPlan::new(&cfg)),
            admission: Admission::new(cfg.capacity, cfg.queue),
            seq: AtomicU64::new(0),
            retry_after: HeaderValue::from(cfg.retry_after_s),
            shutdown,
            stats: Stats::default(),
            arrivals: Arrivals::new(cfg.remember_ids),
            cfg,
        }
    }
}

impl SimState {
    /// The knobs it was started with.
    pub(crate) fn config(&self) -> &SimConfig {
        &self.cfg
    }

    /// A number for the next answer's id.
    pub(crate) fn next_answer_seq(&self) -> u64 {
        self.seq.fetch_add(1, Relaxed)
    }

    /// Counts a request as executed, and its `x-inferq-request-id` if it has one.
    pub(crate) fn record_execution(&self, headers: &HeaderMap) {
        self.stats.executed.fetch_add(1, Relaxed);
        if let Some(id) = headers.get(REQUEST_ID_HEADER).and_then(|v| v.to_str().ok()) {
            if self.arrivals.record(id) {
                self.stats.forgotten_ids.fetch_add(1, Relaxed);
            }
        }
    }

    /// The fault plan now in force.
    fn fault_plan(&self) -> FaultPlan {
        self.faults
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The fault rates now in force.
    pub(crate) fn fault_rates(&self) -> FaultRates {
        self.fault_plan().rates()
    }

    /// Replaces the fault rates (latency knobs stay), after checking them as the flags are.
    pub(crate) fn set_fault_rates(&self, rates: FaultRates) -> Result<(), SimError> {
        let cfg = rates.apply(&self.cfg);
        cfg.validate()?;
        *self.faults.write().unwrap_or_else(PoisonError::into_inner) = FaultPlan::new(&cfg);
        Ok(())
    }
}

/// All routes of the simulator.
pub(crate) fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/executions", get(executions))
        .route("/faults", get(current_faults).post(set_faults))
        .route("/arrivals", get(arrivals))
        .route("/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { StatusCode::OK }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// The longest request body the simulator reads: a long-context prompt as big as the processor
/// sends (a member of up to 16 MiB) fits, where axum's own 2 MB limit answered 413.
pub(crate) const MAX_BODY_BYTES: usize = 64 << 20;

async fn completions(
    State(state): State<Arc<SimState>>,
    ConnectInfo(conn): ConnectInfo<ConnControl>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    complete(&state, &conn, Endpoint::Completions, &headers, &body).await
}

async fn chat_completions(
    State(state): State<Arc<SimState>>,
    ConnectInfo(conn): ConnectInfo<ConnControl>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    complete(&state, &conn, Endpoint::Chat, &headers, &body).await
}

/// One completion request through parse, admission and the run stage.
async fn complete(
    state: &Arc<SimState>,
    conn: &ConnControl,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let stats = &state.stats;
    stats.requests.fetch_add(1, Relaxed);
    if let Some(pool) = &state.pool {
        return engine::request::complete(state, pool, endpoint, headers, body).await;
    }

    let request = match openai::parse_request(endpoint, body, false) {
        Ok(request) => request,
        Err(message) => return bad_request(stats, &message),
    };

    // One copy per request, so a rate change mid-request cannot mix two plans.
    let faults = state.fault_plan();
    if faults.rate_limited() {
        return too_many_requests(state, "rate limit exceeded (injected fault)");
    }
    let _slot = match state.admission.admit(stats, &state.shutdown).await {
        Ok(slot) => slot,
        Err(Refusal::Full) => {
            stats.rejected_capacity.fetch_add(1, Relaxed);
            return too_many_requests(state, "the simulator is at capacity");
        }
        Err(Refusal::ShuttingDown) => return shutting_down(stats),
    };

    // The run stage: from here on the request counts as executed.
    let _running = Gauge::enter(&stats.running, Some(&stats.max_running_seen));
    state.record_execution(headers);

    match faults.draw() {
        Fault::None => {}
        Fault::BadRequest => return bad_request(stats, "invalid request (injected fault)"),
        Fault::ServerError { unavailable } => {
            stats.server_error.fetch_add(1, Relaxed);
            let (status, kind) = if unavailable {
                (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable")
            } else {
                (StatusCode::INTERNAL_SERVER_ERROR, "server_error")
            };
            return error_response(status, "internal error (injected fault)", kind);
        }
        Fault::Reset => {
            stats.resets.fetch_add(1, Relaxed);
            conn.reset();
            // Never delivered: writing it fails and hyper drops the connection.
            return StatusCode::INTERNAL_SERVER_ERROR.into_response();
        }
        Fault::Hang => {
            stats.hangs.fetch_add(1, Relaxed);
            let _hanging = Gauge::enter(&stats.hanging, None);
            // Dropped with the connection when the client gives up; ended here on shutdown.
            state.shutdown.cancelled().await;
            return shutting_down(stats);
        }
    }

    let cap = state.cfg.max_tokens_cap;
    let tokens = request
        .max_tokens
        .unwrap_or(state.cfg.default_tokens)
        .min(cap);
    let hit_limit = request.max_tokens == Some(tokens);
    let (delay, slow) = faults.latency(tokens);
    if slow {
        stats.slow.fetch_add(1, Relaxed);
    }
    if !delay.is_zero() {
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = state.shutdown.cancelled() => return shutting_down(stats),
        }
    }

    let answer = Answer {
        seq: state.seq.fetch_add(1, Relaxed),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: request
            .model
            .as_deref()
            .unwrap_or(&state.cfg.served_model_name),
        prompt_tokens: request.prompt_tokens,
        completion_tokens: tokens,
        hit_limit,
    };
    match openai::completion_body(endpoint, &answer) {
        Ok(body) => {
            stats.count_success(request.prompt_tokens, tokens, hit_limit);
            json_response(StatusCode::OK, body)
        }
        Err(e) => {
            stats.server_error.fetch_add(1, Relaxed);
            error_response(StatusCode::INTERNAL_SERVER_ERROR, &e, "server_error")
        }
    }
}

async fn models(State(state): State<Arc<SimState>>) -> Response {
    let body = serde_json::json!({
        "object": "list",
        "data": [{
            "id": state.cfg.served_model_name,
            "object": "model",
            "owned_by": "inferq-sim",
        }],
    });
    axum::Json(body).into_response()
}

async fn executions(State(state): State<Arc<SimState>>) -> Response {
    axum::Json(state.arrivals.counts()).into_response()
}

async fn current_faults(State(state): State<Arc<SimState>>) -> Response {
    axum::Json(state.fault_rates()).into_response()
}

/// `POST /faults` with a [`FaultRates`] JSON body: 200 with the rates now in force, or 400
/// naming the bad knob.
async fn set_faults(State(state): State<Arc<SimState>>, body: Bytes) -> Response {
    let rates: FaultRates = match serde_json::from_slice(&body) {
        Ok(rates) => rates,
        Err(e) => {
            return error_response(
                StatusCode::BAD_REQUEST,
                &format!("bad fault rates: {e}"),
                "invalid_request_error",
            )
        }
    };
    match state.set_fault_rates(rates) {
        Ok(()) => axum::Json(state.fault_rates()).into_response(),
        Err(e) => error_response(
            StatusCode::BAD_REQUEST,
            &e.to_string(),
            "invalid_request_error",
        ),
    }
}

/// `GET /arrivals[?prefix=P]`: Unix-microsecond arrival times of each id's executions.
async fn arrivals(
    State(state): State<Arc<SimState>>,
    axum::extract::Query(query): axum::extract::Query<ArrivalsQuery>,
) -> Response {
    axum::Json(state.arrivals.snapshot(&query.prefix)).into_response()
}

/// The query of `GET /arrivals`.
#[derive(Debug, Default, serde::Deserialize)]
struct ArrivalsQuery {
    #[serde(default)]
    prefix: String,
}

async fn stats(State(state): State<Arc<SimState>>) -> Response {
    axum::Json(state.stats.snapshot()).into_response()
}

async fn metrics(State(state): State<Arc<SimState>>) -> Response {
    let model = &state.cfg.served_model_name;
    let text = match &state.pool {
        None => state.stats.render_prometheus(model, true),
        Some(pool) => {
            // The engines export the request gauges per pod; one family must not appear twice.
            let mut text = state.stats.render_prometheus(model, false);
            pool.render_prometheus(model, &mut text);
            text
        }
    };
    (
        [(
            CONTENT_TYPE,
            HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
        )],
        text,
    )
        .into_response()
}

async fn not_found() -> Response {
    error_response(
        StatusCode::NOT_FOUND,
        "unknown request URL",
        "invalid_request_error",
    )
}

pub(crate) fn json_response(status: StatusCode, body: Vec<u8>) -> Response {
    (
        status,
        [(CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body,
    )
        .into_response()
}

pub(crate) fn error_response(status: StatusCode, message: &str, kind: &str) -> Response {
    json_response(status, openai::error_body(message, kind))
}

pub(crate) fn bad_request(stats: &Stats, message: &str) -> Response {
    stats.bad_request.fetch_add(1, Relaxed);
    error_response(StatusCode::BAD_REQUEST, message, "invalid_request_error")
}

pub(crate) fn too_many_requests(state: &SimState, message: &str) -> Response {
    state.stats.too_many_requests.fetch_add(1, Relaxed);
    let mut response = error_response(StatusCode::TOO_MANY_REQUESTS, message, "rate_limit_error");
    response
        .headers_mut()
        .insert(RETRY_AFTER, state.retry_after.clone());
    response
}

pub(crate) fn shutting_down(stats: &Stats) -> Response {
    stats.server_error.fetch_add(1, Relaxed);
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        "the simulator is shutting down",
        "service_unavailable",
    )
}

/// Holds a gauge up by one for as long as it lives, so no exit path forgets to lower it.
struct Gauge<'a> {
    gauge: &'a AtomicU64,
}

impl<'a> Gauge<'a> {
    /// Raises `gauge`, recording the new level in `high_water` if given.
    fn enter(gauge: &'a AtomicU64, high_water: Option<&AtomicU64>) -> Self {
        let level = gauge.fetch_add(1, Relaxed) + 1;
        if let Some(high_water) = high_water {
            high_water.fetch_max(level, Relaxed);
        }
        Self { gauge }
    }
}

impl Drop for Gauge<'_> {
    fn drop(&mut self) {
        self.gauge.fetch_sub(1, Relaxed);
    }
}

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// All slots busy and the queue full.
    Full,
    /// The simulator stopped while the request waited.
    ShuttingDown,
}

/// The capacity gate: `capacity` run slots and up to `queue` requests waiting for one.
#[derive(Debug)]
struct Admission {
    /// `None` when capacity is unlimited.
    slots: Option<Arc<Semaphore>>,
    queue: u64,
}

impl Admission {
    fn new(capacity: usize, queue: usize) -> Self {
        Self {
            slots: (capacity > 0).then(|| Arc::new(Semaphore::new(capacity))),
            queue: queue as u64,
        }
    }

    /// A run slot (held until dropped), after waiting in the queue if there is room in it.
    /// `Ok(None)` means capacity is unlimited.
    async fn admit(
        &self,
        stats: &Stats,
        shutdown: &CancellationToken,
    ) -> Result<Option<OwnedSemaphorePermit>, Refusal> {
        let Some(slots) = &self.slots else {
            return Ok(None);
        };
        if let Ok(permit) = Arc::clone(slots).try_acquire_owned() {
            return Ok(Some(permit));
        }
        let queue = self.queue;
        let joined = stats
            .waiting
            .fetch_update(Relaxed, Relaxed, |w| (w < queue).then_some(w + 1));
        if joined.is_err() {
            return Err(Refusal::Full);
        }
        // Lowers `waiting` whether the wait ends in a slot, a shutdown or a vanished client.
        let _waiting = Leave(&stats.waiting);
        tokio::select! {
            permit = Arc::clone(slots).acquire_owned() => permit.map(Some).map_err(|_| Refusal::ShuttingDown),
            _ = shutdown.cancelled() => Err(Refusal::ShuttingDown),
        }
    }
}

/// Lowers a gauge raised elsewhere when dropped.
struct Leave<'a>(&'a AtomicU64);

impl Drop for Leave<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}
