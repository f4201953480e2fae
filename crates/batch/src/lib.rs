//! inferq's OpenAI-compatible Batch API: the Files and Batches API over inferq's durable queue,
//! so a batch survives the death of any pod.
//!
//! A batch travels like this:
//!
//! ```text
//!  client ──POST /v1/files──▶ file store (streamed, checked JSONL)
//!  client ──POST /v1/batches─▶ Redis: batch hash, status validating   (batches_api)
//!  steward: validate ▶ in_progress ▶ submit each line as a request     (steward, ingest)
//!  inferq run processors: claim, call the gateway, push the result     (unchanged)
//!  collector: result list ──collect-4.lua──▶ the batch's filed results   (collect)
//!  steward: seal ▶ write output + error files ▶ completed / expired / cancelled (finalize)
//!  sweeper: expired files and ended batches ▶ removed, with their objects    (sweeper)
//! ```
//!
//! Every piece of state is in Redis (keys in [`keys`]) or the file store ([`store`]); a replica
//! holds none, so any number of replicas serve one deployment, and any answers for any batch.
//! [`serve`] runs a replica: the HTTP server, one collector, the stewards and a sweeper that
//! removes expired files, ended batches past their retention and orphaned objects.
//!
//! The same replica serves the front door ([`front`]): single OpenAI requests, answered when
//! they end or at once with an id, over the same queue, keys and tenants.

pub mod auth;
pub mod batches_api;
pub mod census;
pub mod collect;
pub mod durable;
pub mod error;
pub mod files_api;
pub mod finalize;
pub mod front;
pub mod guard;
pub mod ids;
pub mod ingest;
pub mod keys;
pub mod lines;
pub mod listing;
pub mod metadata;
pub mod metrics;
pub mod model;
pub mod retention;
pub mod scripts;
pub mod server;
pub mod settings;
pub mod state;
pub mod steward;
pub mod store;
pub mod sweeper;
pub mod tenants;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use inferq_client::producer::Producer;
use tokio_util::sync::CancellationToken;

pub use error::{ApiError, BatchError};
pub use settings::{Limits, Settings, StoreChoice, TenantQueues};

/// Why a replica could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// `--api-keys-file` is wrong (exit code 2): the message names it.
    #[error(transparent)]
    Keys(#[from] auth::KeysError),
    /// The file store cannot be used (exit code 2): the message names it.
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error("cannot connect to Redis: {0}")]
    Redis(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: String,
        #[source]
        source: std::io::Error,
    },
}

impl ServeError {
    /// Whether the user's settings are at fault (exit code 2), not the world.
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            ServeError::Keys(_) | ServeError::Store(_) | ServeError::Listen { .. }
        )
    }

    fn redis(e: impl std::error::Error + Send + Sync + 'static) -> ServeError {
        ServeError::Redis(Box::new(e))
    }
}

/// Builds a replica's shared state: the keys, the store, the Redis link and the producer.
pub async fn app(settings: Settings) -> Result<state::App, ServeError> {
    let keys = match &settings.api_keys_file {
        Some(path) => auth::Keys::load(path)?,
        None => auth::Keys::default(),
    };
    let store = match &settings.store {
        StoreChoice::Dir(dir) => store::Store::local(dir),
        StoreChoice::Url(url) => store::Store::s3(url),
    }?;
    let redis = settings.target.connect().await.map_err(ServeError::redis)?;
    let producer =
        Producer::connect_target(&settings.target, &settings.request_queue, &keys::results())
            .await
            .map_err(ServeError::redis)?
            .with_replica_wait(settings.front.replica_wait);
    let metrics = Arc::new(metrics::Metrics::new());
    metrics.known_tenants(&keys.known_tenants());
    let tenant_weights = tenants::weights_of(&keys);
    metrics.tenants.start_with(tenant_weights.keys());
    let front =
        front::Front::new(settings.front.clone(), metrics.clone()).map_err(ServeError::redis)?;
    Ok(state::App {
        front: Arc::new(front),
        redis,
        producer: Arc::new(producer),
        store,
        keys,
        settings: Arc::new(settings),
        metrics,
        owner: inferq_client::keys::fresh_token(),
        working: Arc::new(Mutex::new(HashSet::new())),
        tenant_weights: Arc::new(tenant_weights),
    })
}

/// Runs a replica until `stop`: the API on `settings.listen`, a collector and the stewards.
pub async fn serve(settings: Settings, stop: CancellationToken) -> Result<(), ServeError> {
    let listen = settings.listen;
    let app = app(settings).await?;
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen {
            addr: listen.to_string(),
            source,
        })?;
    tracing::info!(
        listen = %listener.local_addr().map_or(listen.to_string(), |a| a.to_string()),
        store = %app.store.describe,
        queue = %app.settings.request_queue,
        auth = !app.keys.is_empty(),
        "batch API serving"
    );
    let background = CancellationToken::new();
    let collector = tokio::spawn(collect::run(app.clone(), background.clone()));
    let stewards = tokio::spawn(steward::run(app.clone(), background.clone()));
    let sweeper = tokio::spawn(sweeper::run(app.clone(), background.clone()));
    let tenant_census = tokio::spawn(tenants::run(app.clone(), background.clone()));
    let front_listener = tokio::spawn(front::waiters::run(
        app.settings.target.clone(),
        app.redis.clone(),
        app.settings
            .front
            .broker
            .wakeup()
            .unwrap_or(front::config::Wakeup::Auto),
        app.front.waiters.clone(),
        background.clone(),
    ));
    {
        let (front, stop) = (app.front.clone(), stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            front.stop();
        });
    }
    let connections = app.settings.connections;
    server::serve_http1(listener, server::router(app), connections, stop).await;
    background.cancel();
    let _ = collector.await;
    let _ = stewards.await;
    let _ = sweeper.await;
    let _ = tenant_census.await;
    let _ = front_listener.await;
    Ok(())
}
