//! A stand-in OpenAI-compatible inference gateway for the demo, the end-to-end tests and
//! benchmarks. It answers `/v1/completions` and `/v1/chat/completions` with filler text after a
//! configurable latency, enforces a capacity with 429s, injects faults (errors, rate limits,
//! slow answers, hangs, connection resets, bad requests) at configured rates, and counts how
//! often each `x-inferq-request-id` was executed so tests can check for lost or duplicated work
//! (and how many TCP connections it accepted, so they can check that clients keep theirs).
//! With `--pods N` it models instead a pool of N vLLM engines behind a router: continuous
//! batching, queueing, steps that slow down with load, streaming answers, saturation and
//! vLLM's metrics. [`interactive`] drives it (or any OpenAI-compatible URL) with open-loop
//! streaming chat traffic and measures TTFT and inter-token latency.
//!
//! Knobs enter through [`SimConfig`] (flags of `inferq-dev sim`); [`Sim::start`] serves them on a
//! socket, and counts leave through [`Sim`]'s accessors and the `/stats`, `/executions` and
//! `/metrics` endpoints. Fault rates can be changed while it runs (`GET`/`POST /faults`).
//!
//! # Layout
//!
//! - [`config`]: [`SimConfig`], its defaults and validation.
//! - `server`: the routes and the life of one request (parse → admission → run stage).
//! - `faults`: turning rates into a fault and a latency per request; [`FaultRates`] can be
//!   replaced at run time (`POST /faults`, [`Sim::set_faults`]).
//! - `metrics`: lock-free counters, Prometheus text.
//! - `arrivals`: when each id was admitted to run (`/arrivals`, and counted for `/executions`).
//! - `openai`: request parsing and the JSON of answers, streamed chunks and errors.
//! - `engine`: the engine model (`--pods`): the pool, its router, each engine's step loop, the
//!   streamed answer and the engines' metrics; [`EngineConfig`] holds its flags.
//! - `router`: the llm-d router's flow control in front of the engines (`--priority-bands`,
//!   `--eviction`): priority bands, strict priority dispatch, in-flight eviction and its
//!   metrics; [`RouterConfig`] holds its flags.
//! - [`interactive`]: the interactive traffic generator (profiles of phases, TTFT/ITL report).
//! - `listener`: the accept loop whose connections a handler can reset (plain or TLS).
//! - [`tls`]: `--tls-cert`, `--tls-key` and `--tls-client-ca` (HTTPS, optionally mutual TLS).

mod arrivals;
pub mod config;
mod engine;
mod faults;
pub mod interactive;
mod listener;
mod metrics;
mod openai;
mod router;
mod server;
pub mod tls;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use arrivals::unix_us;
pub use config::SimConfig;
pub use engine::{
    EngineConfig, EngineLoad, PoolSnapshot, SaturationMetricNames, DROPPED_REASON_HEADER,
    OBJECTIVE_HEADER, OLD_OBJECTIVE_HEADER, REJECTED_SATURATED,
};
pub use faults::FaultRates;
pub use metrics::SimStats;
pub use router::{RouterConfig, SaturationDetector, EVICTED, EVICTED_BODY, REJECTED_TTL_EXPIRED};
pub use server::REQUEST_ID_HEADER;
pub use tls::SimTls;

pub use listener::ListenerConfig;
use listener::{SimListener, TlsSimListener};
use server::SimState;

/// How long [`Sim::stop`] waits for open connections to finish before abandoning them.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// What can go wrong starting or running the simulator.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A knob is out of range; `knob` is its flag name without dashes.
    #[error("invalid --{knob}: {reason}")]
    InvalidKnob {
        /// Flag name, e.g. `error-rate`.
        knob: &'static str,
        /// What is wrong with its value.
        reason: String,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why binding failed.
        #[source]
        source: io::Error,
    },
    /// The TLS flags do not make a usable server configuration.
    #[error("invalid TLS setting: {0}")]
    Tls(String),
    /// Ctrl-C / SIGTERM handlers could not be installed.
    #[error("cannot listen for shutdown signals: {0}")]
    Signal(#[source] io::Error),
}

/// A running simulator. Stops when [`Sim::stop`] is called or when it is dropped.
#[derive(Debug)]
pub struct Sim {
    addr: SocketAddr,
    /// `http` or `https`.
    scheme: &'static str,
    state: Arc<SimState>,
    /// Cancelled to stop accepting, end in-flight sleeps and hangs, and close connections.
    shutdown: CancellationToken,
    /// The accept loop; `None` once stopped.
    server: Option<JoinHandle<()>>,
}

impl Sim {
    /// Binds `addr` (use "127.0.0.1:0" for a free port) and serves until [`Sim::stop`] is
    /// called or the `Sim` is dropped.
    pub async fn start(cfg: SimConfig, addr: SocketAddr) -> Result<Sim, SimError> {
        Self::start_tls(cfg, addr, &SimTls::default()).await
    }

    /// [`Sim::start`], serving HTTPS when `tls` names a certificate and key.
    pub async fn start_tls(
        cfg: SimConfig,
        addr: SocketAddr,
        tls: &SimTls,
    ) -> Result<Sim, SimError> {
        cfg.validate()?;
        let acceptor = tls.acceptor()?;
        let bind_error = |source| SimError::Bind { addr, source };
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(bind_error)?;
        let local = tcp.local_addr().map_err(bind_error)?;

        let limits = cfg.listener.limits();
        let shutdown = CancellationToken::new();
        let state = Arc::new(SimState::new(cfg, shutdown.clone()));
        let app = server::router(Arc::clone(&state));
        let stop = shutdown.clone();
        let accepted = Arc::clone(&state.stats.connections_accepted);
        let scheme = if acceptor.is_some() { "https" } else { "http" };
        let server = match acceptor {
            None => tokio::spawn(inferq_http::serve_from(
                SimListener::new(tcp, accepted),
                app,
                limits,
                stop,
                STOP_GRACE,
            )),
            Some(acceptor) => tokio::spawn(inferq_http::serve_from(
                TlsSimListener::new(tcp, accepted, acceptor),
                app,
                limits,
                stop,
                STOP_GRACE,
            )),
        };
        tracing::debug!(%local, "simulator started");

        Ok(Sim {
            addr: local,
            scheme,
            state,
            shutdown,
            server: Some(server),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://IP:PORT` (or `https://`), the base URL to configure as the gateway.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.scheme, self.addr)
    }

    /// How many times each `x-inferq-request-id` was admitted to run (faulted runs included).
    pub fn executions(&self) -> HashMap<String, u64> {
        self.state.arrivals.counts()
    }

    /// When each `x-inferq-request-id` was admitted to run, in Unix milliseconds, oldest first.
    pub fn execution_times(&self) -> HashMap<String, Vec<u64>> {
        let mut times = self.state.arrivals.snapshot("");
        for list in times.values_mut() {
            for t in list.iter_mut() {
                *t /= 1000;
            }
        }
        times
    }

    /// Unix-microsecond times at which each id starting with `prefix` was admitted to run.
    pub fn arrivals(&self, prefix: &str) -> HashMap<String, Vec<u64>> {
        self.state.arrivals.snapshot(prefix)
    }

    /// The fault rates now in force.
    pub fn faults(&self) -> FaultRates {
        self.state.fault_rates()
    }

    /// Replaces the fault rates while the simulator runs (what `POST /faults` does); the
    /// latency knobs stay. A bad rate is refused and the old rates stay in force.
    pub fn set_faults(&self, rates: FaultRates) -> Result<(), SimError> {
        self.state.set_fault_rates(rates)
    }

    /// Every request that reached a completion endpoint, admitted or not.
    pub fn total_requests(&self) -> u64 {
        self.state.stats.snapshot().requests
    }

    /// Each engine's running and waiting counts and KV-cache usage, and the router's
    /// saturation; `None` when the engine model is off (`--pods 0`).
    pub fn pool_snapshot(&self) -> Option<PoolSnapshot> {
        self.state.pool.as_ref().map(|pool| pool.snapshot())
    }

    /// Requests the router's flow control evicted so far (0 without `--eviction`).
    pub fn evictions(&self) -> u64 {
        self.state
            .pool
            .as_ref()
            .and_then(|pool| pool.flow().map(|flow| flow.evictions()))
            .unwrap_or(0)
    }

    /// Output tokens the evicted requests had made before the router evicted them.
    pub fn evicted_tokens(&self) -> u64 {
        self.state
            .pool
            .as_ref()
            .and_then(|pool| pool.flow().map(|flow| flow.redone()))
            .unwrap_or(0)
    }

    /// A snapshot of all counters and gauges, as `GET /stats` serves it.
    pub fn stats(&self) -> SimStats {
        self.state.stats.snapshot()
    }

    /// Stops accepting, answers 503 to requests still sleeping or hanging, and waits (up to a
    /// few seconds) for open connections to close.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        let Some(mut server) = self.server.take() else {
            return;
        };
        // The server drains open calls for STOP_GRACE itself; a second more is for its task.
        match tokio::time::timeout(STOP_GRACE + Duration::from_secs(1), &mut server).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("simulator server task failed: {e}"),
            Err(_) => {
                tracing::warn!("simulator connections still open after {STOP_GRACE:?}");
                server.abort();
            }
        }
        tracing::debug!(addr = %self.addr, "simulator stopped");
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Runs the simulator in the foreground until ctrl-c / SIGTERM (for `inferq-dev sim`), printing its
/// URL.
pub async fn run_foreground(
    cfg: SimConfig,
    addr: SocketAddr,
    tls: &SimTls,
) -> Result<(), SimError> {
    let sim = Sim::start_tls(cfg, addr, tls).await?;
    // Not println!: a closed standard output must not stop the simulator.
    let _ = std::io::Write::write_fmt(
        &mut std::io::stdout(),
        format_args!("inferq simulator listening on {}\n", sim.base_url()),
    );
    let signalled = shutdown_signal().await;
    sim.stop().await;
    signalled
}

/// Waits for ctrl-c or, on Unix, SIGTERM.
async fn shutdown_signal() -> Result<(), SimError> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).map_err(SimError::Signal)?;
        tokio::select! {
            ctrl_c = tokio::signal::ctrl_c() => ctrl_c.map_err(SimError::Signal),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.map_err(SimError::Signal)
    }
}
