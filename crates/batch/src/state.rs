//! What every handler and background task of a replica shares: the Redis link, the producer
//! that submits batch lines, the file store, the keys, the settings and the metrics. A replica
//! keeps nothing else: every batch's state is in Redis and every file in the store.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use inferq_client::producer::Producer;
use inferq_client::target::Link;

use crate::auth::Keys;
use crate::metrics::Metrics;
use crate::settings::Settings;
use crate::store::Store;

/// The shared state (cheap to clone).
#[derive(Clone)]
pub struct App {
    pub redis: Link,
    pub producer: Arc<Producer>,
    pub store: Store,
    pub keys: Keys,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// This replica's steward token (lease owner).
    pub owner: String,
    /// Batches this replica's stewards are working now.
    pub working: Arc<Mutex<HashSet<String>>>,
}

/// Now, Unix seconds.
pub fn now_secs() -> i64 {
    inferq_client::producer::unix_ms() / 1000
}
