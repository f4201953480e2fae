//! What a batch-api replica is told at start: where Redis and the request queue are (from the
//! processors' transport config, read by the `inferq batch-api` command), where files live,
//! who may call it, the limits OpenAI sets (configurable), a tenant's bound on lines not yet
//! finished, and how long files and ended batches are kept.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use inferq_client::target::Target;

/// Where file bytes live.
#[derive(Debug, Clone)]
pub enum StoreChoice {
    Dir(PathBuf),
    Url(String),
}

/// OpenAI's limits, configurable.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most requests (non-blank lines) per input file (OpenAI: 50,000).
    pub max_lines: u64,
    /// Largest upload in bytes (OpenAI: 200 MB).
    pub max_file_bytes: u64,
    /// Longest line in bytes.
    pub max_line_bytes: usize,
    /// `--max-enqueued-lines`: a tenant's batch lines not yet finished (a key's
    /// `max_enqueued_lines` overrides it); `None`: unbounded.
    pub max_enqueued_lines: Option<u64>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_lines: 50_000,
            max_file_bytes: 200 * 1000 * 1000,
            max_line_bytes: 16 * 1024 * 1024,
            max_enqueued_lines: None,
        }
    }
}

/// How long things are kept, and how the sweeper that removes them runs.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// `--file-retention`: the life of a file uploaded without `expires_after`, and of a
    /// batch's output and error files when it gave no `output_expires_after`.
    pub files: Duration,
    /// `--batch-retention`: how long an ended batch's record is kept.
    pub batches: Duration,
    /// `--min-expires-after`: the shortest `expires_after[seconds]` and
    /// `output_expires_after[seconds]` taken (OpenAI: 3600; tests make it short).
    pub min_expires_after: Duration,
    /// `--sweep-interval`: how often each replica's sweeper looks for what expired.
    pub sweep_interval: Duration,
    /// `--orphan-grace`: how old an object no key names must be before it is removed (longer
    /// than any write between an object's completion and its record).
    pub orphan_grace: Duration,
}

/// OpenAI's longest `expires_after[seconds]`: 30 days.
pub const MAX_EXPIRES_AFTER: u64 = 2_592_000;

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            files: Duration::from_secs(MAX_EXPIRES_AFTER),
            batches: Duration::from_secs(MAX_EXPIRES_AFTER),
            min_expires_after: Duration::from_secs(3600),
            sweep_interval: Duration::from_secs(60),
            orphan_grace: Duration::from_secs(3600),
        }
    }
}

/// Everything a replica needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub target: Target,
    /// The request queue (sorted set) batches feed.
    pub request_queue: String,
    pub listen: SocketAddr,
    pub store: StoreChoice,
    /// `--api-keys-file`: a JSON object of key -> tenant; `None` is one open tenant.
    pub api_keys_file: Option<PathBuf>,
    pub limits: Limits,
    /// How long files and ended batches are kept.
    pub retention: Retention,
    /// Completion windows accepted besides OpenAI's `24h`.
    pub extra_windows: Vec<String>,
    /// How long a steward's lease on a batch lasts unrenewed (how soon another replica takes
    /// over the batch of one that died).
    pub lease: Duration,
    /// How long a cancel waits for the results of requests in flight before ending the batch.
    pub cancel_grace: Duration,
    /// The front door's settings (single requests).
    pub front: crate::front::FrontSettings,
    /// The bounds of the listener's connections (`--header-read-timeout`, `--idle-timeout`,
    /// `--max-connections`).
    pub connections: inferq_http::ConnLimits,
    /// `--queue-per-tenant`: each tenant's lines wait in a queue of their own (see
    /// [`crate::tenants`]); `None`: every line goes to `request_queue`.
    pub tenant_queues: Option<TenantQueues>,
}

/// Where each tenant's lines wait when every tenant has a queue of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantQueues {
    /// A tenant's queue is this followed by the tenant's name (`inferq-tenant:alice`).
    pub prefix: String,
    /// The index of queues with work (zset: queue name -> Unix ms lines were last added), which
    /// `fair-share` processors read instead of polling every tenant's queue.
    pub index_key: String,
    /// The hash of tenant -> weight written at start-up for `fair-share` processors.
    pub weights_key: String,
}

/// The prefix of the tenants' queues when none is given.
pub const DEFAULT_TENANT_QUEUE_PREFIX: &str = "inferq-tenant:";

impl TenantQueues {
    /// The default names (those `fair-share` reads by default), under `prefix`.
    pub fn new(prefix: &str) -> TenantQueues {
        TenantQueues {
            prefix: prefix.to_owned(),
            index_key: "inferq-tenants:index".to_owned(),
            weights_key: "inferq-tenants:weights".to_owned(),
        }
    }

    /// The queue of `tenant`'s lines.
    pub fn queue(&self, tenant: &str) -> String {
        format!("{}{tenant}", self.prefix)
    }
}

/// A completion window as a duration: `24h`, or one of `extra` (humantime, e.g. `30s`).
pub fn window(text: &str, extra: &[String]) -> Option<Duration> {
    if text == "24h" || extra.iter().any(|w| w == text) {
        humantime::parse_duration(text)
            .ok()
            .filter(|d| !d.is_zero())
    } else {
        None
    }
}
