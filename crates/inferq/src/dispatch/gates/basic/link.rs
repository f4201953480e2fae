//! Redis connections for the `redis` and `redis-quota` gates.
//!
//! A gate's `address` parameter is Go's `host:port`, or (beyond Go) a full `redis://` /
//! `rediss://` URL with password and database (a `rediss://` server is trusted as the queue's is
//! without `--redis-tls-ca-cert`: by the system store and the bundled roots). Gates naming the
//! same address share one [`Link`]: a client made when the gate is built (building is
//! synchronous) and a self-healing connection opened on first use. Every call through [`within`]
//! is bounded by [`CALL_TIMEOUT`], so a dead Redis answers an error quickly instead of stalling
//! the dispatch path.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, LazyLock, Mutex, PoisonError, Weak};
use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Client, RedisResult};
use tokio::sync::OnceCell;

use crate::config::gate_params::Params;
use crate::dispatch::gates::GateError;
use inferq_client::connect;

/// How long one gate call to Redis (connecting included) may take before it counts as failed.
pub(super) const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// One Redis server as the gates see it.
pub(super) struct Link {
    client: Client,
    /// Opened on first use; a failed open leaves it empty, so the next call tries again.
    con: OnceCell<ConnectionManager>,
    /// `host:port` for messages (never the password).
    pub shown: String,
}

impl Link {
    /// The connection, opened now if it is not yet.
    pub(super) async fn con(&self) -> RedisResult<ConnectionManager> {
        self.con
            .get_or_try_init(|| connect::manager(&self.client))
            .await
            .cloned()
    }
}

/// Links by URL. Weak, so a link goes away with the last gate that uses it.
static LINKS: LazyLock<Mutex<HashMap<String, Weak<Link>>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// The link for a gate's `address` parameter (required).
pub(super) fn link(p: &Params<'_>) -> Result<Arc<Link>, GateError> {
    let address = p.required_string("address")?;
    let url = if address.contains("://") {
        address
    } else {
        format!("redis://{address}")
    };
    let mut links = LINKS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(link) = links.get(&url).and_then(Weak::upgrade) {
        return Ok(link);
    }
    let client =
        connect::client(&url, &connect::RedisTls::default()).map_err(|e| GateError::Param {
            gate: p.gate,
            param: "address".to_owned(),
            reason: format!("neither host:port nor a redis:// or rediss:// URL ({e})"),
        })?;
    let link = Arc::new(Link {
        shown: client.get_connection_info().addr().to_string(),
        client,
        con: OnceCell::new(),
    });
    links.retain(|_, weak| weak.strong_count() > 0);
    links.insert(url, Arc::downgrade(&link));
    Ok(link)
}

/// Runs one Redis call within [`CALL_TIMEOUT`]; a failure is described for logs and errors.
pub(super) async fn within<T>(
    link: &Link,
    call: impl Future<Output = RedisResult<T>>,
) -> Result<T, CallError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(CallError::Failed {
            shown: link.shown.clone(),
            source,
        }),
        Err(_) => Err(CallError::TimedOut {
            shown: link.shown.clone(),
            ms: CALL_TIMEOUT.as_millis(),
        }),
    }
}

/// Why a gate's Redis call gave no answer. Its text holds its cause too, for the logs and the
/// error results that show only the text.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("redis {shown}: {source}")]
    Failed {
        /// The gate's Redis, without its password.
        shown: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("redis {shown}: no answer within {ms} ms")]
    TimedOut { shown: String, ms: u128 },
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn params(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        match v {
            serde_json::Value::Object(m) => m,
            _ => serde_json::Map::new(),
        }
    }

    #[test]
    fn addresses_and_sharing() {
        let a = params(json!({"address": "127.0.0.1:1"}));
        let b = params(json!({"address": "redis://:secret@127.0.0.1:1/3"}));
        let one = link(&Params::new("redis", &a)).unwrap();
        let again = link(&Params::new("redis-quota", &a)).unwrap();
        assert!(Arc::ptr_eq(&one, &again), "one link per address");
        let url = link(&Params::new("redis", &b)).unwrap();
        assert!(!Arc::ptr_eq(&one, &url));
        assert_eq!(url.shown, "127.0.0.1:1", "no password in messages");
        assert_eq!(url.client.get_connection_info().redis_settings().db(), 3);

        let bad = params(json!({"address": "http://x"}));
        let e = link(&Params::new("redis", &bad)).err().unwrap().to_string();
        assert!(e.starts_with("gate redis: parameter address: "), "{e}");
        let none = params(json!({}));
        let e = link(&Params::new("redis", &none))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e, "gate redis: parameter address: required");
    }
}
