//! The key names no message may name as its result list, kept current as queues come and go.
//!
//! Built from the one list of key names ([`inferq_client::result_route`]): every running
//! queue (listed, reloaded in, or found by `fair-share`), the retry set, the producers' keys,
//! the tenants' queues and the fair-share index and weights, the Batch API's and front door's
//! keys (`{inferq-batch}:…`, but for the result list it names; the front door's join keys), while the mailboxes `results:req:…` stay open, and the keys a queue's
//! gate parameters name. [`Lanes`](super::lanes::Lanes) updates it whenever the queues change;
//! each result's outcome reads it in the outbox (see [`super::outbox`]) and in the dead-letter
//! path of members that cannot be requests.

use std::sync::{Arc, RwLock};

use inferq_client::result_route::{ReservedKeys, ReservedKeysBuilder};

use crate::config::fair_share::{FairShare, DEFAULT_INDEX_KEY, DEFAULT_WEIGHTS_KEY};
use crate::config::QueueConfig;

/// The prefix of the Batch API's tenants' queues when it is given none.
const TENANT_QUEUE_PREFIX: &str = inferq_batch::settings::DEFAULT_TENANT_QUEUE_PREFIX;

/// The reserved names, shared by every lane.
#[derive(Debug)]
pub struct Reserved {
    retry: String,
    fair_share: Option<FairShare>,
    current: RwLock<Arc<ReservedKeys>>,
}

impl Reserved {
    pub fn new(retry: &str, fair_share: Option<&FairShare>) -> Arc<Reserved> {
        let reserved = Reserved {
            retry: retry.to_owned(),
            fair_share: fair_share.cloned(),
            current: RwLock::new(Arc::new(ReservedKeys::default())),
        };
        reserved.update(&[]);
        Arc::new(reserved)
    }

    /// The names as of now.
    pub fn current(&self) -> Arc<ReservedKeys> {
        match self.current.read() {
            Ok(keys) => keys.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Takes the running queues into account (replacing the ones before).
    pub fn update(&self, queues: &[QueueConfig]) {
        let keys = Arc::new(self.build(queues));
        match self.current.write() {
            Ok(mut current) => *current = keys,
            Err(poisoned) => *poisoned.into_inner() = keys,
        }
    }

    fn build(&self, queues: &[QueueConfig]) -> ReservedKeys {
        let mut b = ReservedKeys::builder()
            .key(&self.retry)
            .prefix(TENANT_QUEUE_PREFIX)
            .prefix(DEFAULT_INDEX_KEY)
            .prefix(DEFAULT_WEIGHTS_KEY)
            .prefix(&format!("{}:", inferq_batch::keys::PREFIX))
            .open(&inferq_batch::keys::results())
            .prefix(inferq_batch::front::keys::JOIN_PREFIX);
        if let Some(fs) = &self.fair_share {
            b = b
                .prefix(&fs.queue_prefix)
                .key(&fs.index_key)
                .key(&fs.weights_key);
        }
        for q in queues {
            b = b.queue(&q.queue_name);
            if let Some(gate) = &q.gate {
                b = gate_keys(b, &gate.params);
            }
        }
        b.build()
    }
}

/// The keys a gate's parameters name: a `…_key` is reserved with everything under it
/// (`<key>:…`, as `leased-rate`'s `<control_key>:state`), a `…prefix` as a prefix.
fn gate_keys(
    mut b: ReservedKeysBuilder,
    params: &serde_json::Map<String, serde_json::Value>,
) -> ReservedKeysBuilder {
    for (name, value) in params {
        let Some(value) = value.as_str() else {
            continue;
        };
        if name.ends_with("_key") || name == "key" {
            b = b.key(value).prefix(&format!("{value}:"));
        } else if name.ends_with("prefix") {
            b = b.prefix(value);
        }
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_keys_and_batch_keys_are_reserved_but_batch_result_lists_are_open() {
        let mut params = serde_json::Map::new();
        params.insert("budget_key".into(), "my-budget".into());
        params.insert("key_prefix".into(), "quota:".into());
        params.insert("limit".into(), 5.into());
        let b = gate_keys(ReservedKeys::builder(), &params).build();
        assert!(b.owner("my-budget").is_some());
        assert!(b.owner("my-budget:state").is_some());
        assert!(b.owner("quota:tenant:a").is_some());
        assert!(b.owner("limit").is_none());

        let r = Reserved::new("retry-sortedset", None);
        let keys = r.current();
        assert!(keys.owner("retry-sortedset").is_some());
        assert!(keys.owner("inferq-tenant:alice").is_some());
        assert!(keys.owner("inferq-tenants:index").is_some());
        assert!(keys.owner("{inferq-batch}:live").is_some());
        assert!(keys.owner(&inferq_batch::keys::results()).is_none());
        // The front door's (and the router's) mailboxes are result lists; its join keys are not.
        assert!(keys.owner("results:req:acme:job-1").is_none());
        assert!(keys.owner("inferq-front:join:acme:job-1").is_some());
        assert!(keys.owner("q").is_none());
    }
}
