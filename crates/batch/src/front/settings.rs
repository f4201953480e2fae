//! What the front door is told at start (by the `inferq batch-api` command, from its flags, the
//! `--broker-config` file and the processors' transport config): the router's step config, the
//! gateway each queue's requests go to live, how many clients one replica holds waiting, and the
//! replicas a submission must reach.

use std::collections::BTreeMap;

use inferq_client::ReplicaWait;

use super::config::BrokerConfig;

/// The front door's settings.
#[derive(Debug, Clone)]
pub struct FrontSettings {
    /// The router's step config (`--broker-config`, else the step's defaults with the batch
    /// queue as `default_queue`).
    pub broker: BrokerConfig,
    /// Each queue's gateway (its `igw_base_url` in the transport config): where a passthrough
    /// request routed to that queue is sent live.
    pub gateways: BTreeMap<String, String>,
    /// `--max-waiting-clients`: open waits (wait mode, streams, long polls) per replica.
    pub max_waiting_clients: usize,
    /// The queue's `replica_wait`: replicas a submission must reach before it is answered.
    pub replica_wait: Option<ReplicaWait>,
}

impl Default for FrontSettings {
    fn default() -> FrontSettings {
        FrontSettings {
            broker: BrokerConfig::default(),
            gateways: BTreeMap::new(),
            max_waiting_clients: 10_000,
            replica_wait: None,
        }
    }
}

impl FrontSettings {
    /// The gateway a live request routed to `queue` goes to (the default queue's when that
    /// queue has none).
    pub fn gateway(&self, queue: &str) -> Option<&str> {
        self.gateways
            .get(queue)
            .or_else(|| self.gateways.get(&self.broker.default_queue))
            .map(String::as_str)
    }
}
