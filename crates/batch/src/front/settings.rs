//! What the front door is told at start (by the `inferq batch-api` command, from its flags and
//! the processors' transport config): the queues a request may name, the default one, the
//! deadline a request gets when it names none, how long results are kept, how many clients
//! one replica holds waiting, and the replicas a submission must reach.

use std::time::Duration;

use inferq_client::ReplicaWait;

/// One queue of the transport config, as a request may name it.
#[derive(Debug, Clone)]
pub struct FrontQueue {
    /// The queue's `id` in the config (its `queue_name` when it has none).
    pub id: String,
    /// The sorted set requests are submitted to.
    pub queue_name: String,
    /// Why requests cannot go to this queue (it sends every result to its own
    /// `result_queue_name`, which the front door never reads), or `None` when they can.
    pub refused: Option<String>,
}

/// The front door's settings.
#[derive(Debug, Clone)]
pub struct FrontSettings {
    /// Every queue of the transport config.
    pub queues: Vec<FrontQueue>,
    /// The `queue_name` a request goes to when it names none (`--queue`, else the first).
    pub default_queue: String,
    /// `--request-timeout`: the deadline of a request that gives none.
    pub request_timeout: Duration,
    /// `--result-retention`: how long a result is kept once it has arrived.
    pub result_retention: Duration,
    /// `--max-waiting-clients`: open waits (wait mode, streams, long polls) per replica.
    pub max_waiting_clients: usize,
    /// The queue's `replica_wait`: replicas a submission must reach before it is answered.
    pub replica_wait: Option<ReplicaWait>,
}

impl Default for FrontSettings {
    fn default() -> FrontSettings {
        FrontSettings {
            queues: Vec::new(),
            default_queue: "request-sortedset".to_owned(),
            request_timeout: Duration::from_secs(600),
            result_retention: Duration::from_secs(24 * 3600),
            max_waiting_clients: 10_000,
            replica_wait: None,
        }
    }
}

impl FrontSettings {
    /// The queue a request names (by `id` or `queue_name`), or the default one when it names
    /// none; `Err` says why the name cannot be used.
    pub fn queue(&self, named: Option<&str>) -> Result<&str, String> {
        let Some(name) = named.map(str::trim).filter(|n| !n.is_empty()) else {
            return Ok(&self.default_queue);
        };
        let found = self
            .queues
            .iter()
            .find(|q| q.id == name)
            .or_else(|| self.queues.iter().find(|q| q.queue_name == name));
        match found {
            None => Err(format!(
                "no queue named {name:?} is configured (known: {})",
                self.queues
                    .iter()
                    .map(|q| q.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(q) => match &q.refused {
                Some(why) => Err(why.clone()),
                None => Ok(&q.queue_name),
            },
        }
    }

    /// Every queue requests may go to.
    pub fn usable(&self) -> impl Iterator<Item = &str> {
        self.queues
            .iter()
            .filter(|q| q.refused.is_none())
            .map(|q| q.queue_name.as_str())
    }
}
