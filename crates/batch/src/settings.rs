//! What a batch-api replica is told at start: where Redis and the request queue are (from the
//! processors' transport config, read by the `inferq batch-api` command), where files live,
//! who may call it, and the limits OpenAI sets (configurable).

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
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_lines: 50_000,
            max_file_bytes: 200 * 1000 * 1000,
            max_line_bytes: 16 * 1024 * 1024,
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
    /// Completion windows accepted besides OpenAI's `24h`.
    pub extra_windows: Vec<String>,
    /// How long a steward's lease on a batch lasts unrenewed (how soon another replica takes
    /// over the batch of one that died).
    pub lease: Duration,
    /// How long a cancel waits for the results of requests in flight before ending the batch.
    pub cancel_grace: Duration,
    /// The front door's settings (single requests).
    pub front: crate::front::FrontSettings,
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
