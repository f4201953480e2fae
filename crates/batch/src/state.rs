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
#[derive(Debug, Clone)]
pub struct App {
    pub redis: Link,
    pub producer: Arc<Producer>,
    pub store: Store,
    pub keys: Keys,
    pub settings: Arc<Settings>,
    pub metrics: Arc<Metrics>,
    /// The front door's producers, waits and settings.
    pub front: Arc<crate::front::Front>,
    /// This replica's steward token (lease owner).
    pub owner: String,
    /// Batches this replica's stewards are working now.
    pub working: Arc<Mutex<HashSet<String>>>,
    /// Every tenant the keys name, with its `fair-share` weight (see [`crate::tenants`]).
    pub tenant_weights: Arc<std::collections::BTreeMap<String, f64>>,
}

/// Now, Unix seconds.
pub fn now_secs() -> i64 {
    inferq_client::producer::unix_ms() / 1000
}

/// The two kinds of object a tenant owns.
#[derive(Debug, Clone, Copy)]
pub enum Owned {
    File,
    Batch,
}

impl App {
    /// A file or batch of `tenant` by its id, or 404: an id of the wrong shape, an unknown
    /// one and another tenant's all answer alike, so a caller learns nothing of others.
    pub async fn owned(
        &self,
        kind: Owned,
        tenant: &str,
        id: &str,
    ) -> Result<crate::model::Fields, crate::error::ApiError> {
        use redis::AsyncCommands;
        let (shape_ok, key, name) = match kind {
            Owned::File => (crate::ids::is_file_id(id), crate::keys::file(id), "File"),
            Owned::Batch => (crate::ids::is_batch_id(id), crate::keys::batch(id), "Batch"),
        };
        let not_found = || crate::error::ApiError::not_found(name, id);
        if !shape_ok {
            return Err(not_found());
        }
        let mut con = self.redis.clone();
        let f: crate::model::Fields = con.hgetall(key).await?;
        if f.get("tenant").map(String::as_str) != Some(tenant) {
            return Err(not_found());
        }
        Ok(f)
    }
}
