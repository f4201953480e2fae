//! The sorted-set transport config (go-compat §3.2): the JSON of `--transport-config` /
//! `--transport-config-file` (or the one the legacy flags synthesise) is decoded into
//! `RawSortedSet`, then `resolve` applies Go's load order — `REDIS_URL` fallback, defaults,
//! validation — and hands back a typed [`SortedSetConfig`] plus the claim fields, which the loader
//! combines with the claim flags.
//!
//! The JSON as written lives in [`raw`], the per-queue defaults and the checks across queues in
//! [`queues`]; this file holds the typed config and the load order.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use super::claim::ClaimFields;
use super::gate::GateSpec;
use super::redis_url::check_redis_url;
use super::topology::{resolve_topology, TopologyFields, CONFIG_FIELDS};
use super::{redact_url, ConfigError};
use inferq_client::target::Topology;

mod queues;
mod raw;

use queues::{check_key_kinds, check_unique, resolve_queue};
pub(crate) use raw::{RawQueue, RawSortedSet, RAW_SORTED_SET_OBJECTS};

/// Default retry sorted set, shared by all queues of a transport.
pub const DEFAULT_RETRY_QUEUE: &str = "retry-sortedset";
/// Default result list.
pub const DEFAULT_RESULT_QUEUE: &str = "result-list";
/// Default poll interval in milliseconds.
pub const DEFAULT_POLL_INTERVAL_MS: u64 = 1000;
/// Longest accepted `poll_interval_ms`: Go's longest duration (about 292 years) in milliseconds;
/// Go's `poll_interval_ms × time.Millisecond` overflows beyond it.
pub const MAX_POLL_INTERVAL_MS: u64 = i64::MAX as u64 / 1_000_000;
/// Default number of requests taken per poll.
pub const DEFAULT_BATCH_SIZE: u32 = 10;
/// Largest accepted `batch_size`.
pub const MAX_BATCH_SIZE: u32 = 10_000;
/// Default path appended to `igw_base_url`.
pub const DEFAULT_REQUEST_PATH: &str = "/v1/completions";
/// Default worker pool of a queue.
pub const DEFAULT_POOL_ID: &str = "default";

/// The Redis URL. Its `Debug` and `Display` hide the password; [`RedisUrl::expose`] gives the
/// real text to the connection code only.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as configured, password included. Use it to connect, never to log.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with its password replaced by `***`, for logs.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }

    /// Whether the URL asks for TLS (`rediss://`).
    pub fn is_tls(&self) -> bool {
        self.0
            .get(..9)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"))
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("RedisUrl").field(&self.redacted()).finish()
    }
}

impl fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

/// Which of Go's Redis transports the config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// `redis-sortedset`: producers ZADD into each queue's pending set; results are LPUSHed.
    SortedSet,
    /// `redis-pubsub`: producers PUBLISH on each queue's channel; results are PUBLISHed on
    /// `result_queue_name`. inferq admits each message into a durable queue of the channel's
    /// name (see `admit-1.lua`), so from there on it is handled as a sorted-set request.
    PubSub,
}

impl TransportKind {
    /// The name `--transport` takes.
    pub const fn name(self) -> &'static str {
        match self {
            TransportKind::SortedSet => "redis-sortedset",
            TransportKind::PubSub => "redis-pubsub",
        }
    }
}

/// Go's default result channel of the redis-pubsub transport.
pub const DEFAULT_RESULT_CHANNEL: &str = "result-queue";

/// The validated sorted-set transport.
#[derive(Debug, Clone, PartialEq)]
pub struct SortedSetConfig {
    /// Which Go transport producers and consumers speak.
    pub kind: TransportKind,
    /// Where Redis is (`redis://`, `rediss://` or `unix://`): the server, the first seed node
    /// of a cluster, or the first sentinel.
    pub url: RedisUrl,
    /// Go's `mode`, `addrs` and `master_name`: one server, a cluster or a Sentinel primary.
    pub topology: Topology,
    /// The Go retry sorted set; inferq moves due entries out of it so a mixed fleet loses nothing.
    pub retry_queue_name: String,
    /// Result list used when neither the queue nor the message names one.
    pub result_queue_name: String,
    /// How often each queue is polled.
    pub poll_interval: Duration,
    /// Most requests taken from one queue per poll.
    pub batch_size: u32,
    /// Go's switch for spans of Redis commands: accepted, with a warning that inferq does not
    /// export those (request spans follow `OTEL_EXPORTER_OTLP_ENDPOINT`).
    pub enable_tracing: bool,
    /// The request queues, in config order (the first is Go's retry fallback queue).
    pub queues: Vec<QueueConfig>,
}

/// One request queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// Metrics label and `internal.queue_id`; defaults to `queue_name` (empty for redis-pubsub,
    /// as in Go).
    pub id: String,
    /// The pending sorted set the producer ZADDs into.
    pub queue_name: String,
    /// Result list for this queue's results; beats the message's own and the transport default.
    pub result_queue_name: Option<String>,
    /// When above 0, every push of this queue's results sets this TTL (seconds) on the list
    /// (Go's `result_ttl_seconds`), so lists nobody reads do not grow Redis for good.
    pub result_ttl_seconds: u64,
    /// Worker pool that serves this queue.
    pub worker_pool_id: String,
    /// Sent as `x-gateway-inference-objective` when set.
    pub inference_objective: Option<String>,
    /// Path joined to `igw_base_url` unless the message carries its own `endpoint`.
    pub request_path_url: String,
    /// The inference gateway (http or https).
    pub igw_base_url: String,
    /// Queue-level gate, if any.
    pub gate: Option<GateSpec>,
    /// How errors about the gate's parameters name them: `queues[0].gate_params`, or the legacy
    /// flag they came from (`--redis.ss.gate-params`). The gate factory reads the parameters
    /// after loading, so its errors need the name the user wrote.
    pub gate_params_field: String,
    /// Copied into each request's `internal.labels` (queue labels win), e.g. `tier`.
    pub labels: BTreeMap<String, String>,
    /// Glob patterns (Redis's syntax) a result list named by a message or a stamp must match;
    /// empty: any list that is not a key of inferq's. The queue's own list is always allowed.
    pub allowed_result_lists: Vec<String>,
}

/// `Some(s)` for a non-empty string, like Go's zero-value checks.
fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|s| !s.is_empty())
}

/// Applies Go's load order to a decoded transport config: `url` ← `REDIS_URL` when empty,
/// defaults, then validation. Pool references are checked by the loader, which knows the pools.
pub(crate) fn resolve(
    raw: RawSortedSet,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<(SortedSetConfig, ClaimFields), ConfigError> {
    resolve_with(raw, env, warnings, true)
}

/// [`resolve`], where `at_least_one` says whether an empty `queues` is refused (at start-up) or
/// allowed (a reload that drains every queue).
///
/// Fields are checked in Go's order, the first problem winning: the URL and topology, the poll
/// interval, the batch size, then the queues.
pub(crate) fn resolve_with(
    raw: RawSortedSet,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
    at_least_one: bool,
) -> Result<(SortedSetConfig, ClaimFields), ConfigError> {
    let claim = claim_fields(&raw);
    let url = redis_url(raw.url, env, warnings)?;
    let topology = resolve_topology(&TopologyFields {
        mode: raw.mode.as_deref(),
        addrs: raw.addrs.as_deref().unwrap_or_default(),
        master_name: raw.master_name.as_deref(),
        url: &url,
        names: CONFIG_FIELDS,
    })?;

    let retry_queue_name =
        non_empty(raw.retry_queue_name).unwrap_or_else(|| DEFAULT_RETRY_QUEUE.to_owned());
    let result_queue_name =
        non_empty(raw.result_queue_name).unwrap_or_else(|| DEFAULT_RESULT_QUEUE.to_owned());
    let poll_interval_ms = poll_interval_ms(raw.poll_interval_ms)?;
    let batch_size = batch_size(raw.batch_size)?;
    let queues = resolve_queues(
        raw.queues.unwrap_or_default(),
        at_least_one,
        &retry_queue_name,
        &result_queue_name,
        warnings,
    )?;

    let config = SortedSetConfig {
        kind: TransportKind::SortedSet,
        url: RedisUrl(url),
        topology,
        retry_queue_name,
        result_queue_name,
        poll_interval: Duration::from_millis(poll_interval_ms),
        batch_size,
        enable_tracing: raw.enable_tracing.unwrap_or(false),
        queues,
    };
    Ok((config, claim))
}

/// The claim fields of the config, left for the loader to combine with the claim flags.
fn claim_fields(raw: &RawSortedSet) -> ClaimFields {
    ClaimFields {
        lease_seconds: raw.claim_lease_ttl_seconds,
        reclaim_interval_ms: raw.claim_reclaim_interval_ms,
        max_deliveries: raw.max_deliveries,
        replica_wait: raw.replica_wait,
        replica_wait_timeout_ms: raw.replica_wait_timeout_ms,
    }
}

/// The checked Redis URL: `url`, or `REDIS_URL` when it is empty.
fn redis_url(
    url: Option<String>,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<String, ConfigError> {
    // Errors about the URL name where it came from: the field, or the environment variable.
    let (url, url_field) = match non_empty(url) {
        Some(url) => (url, "url"),
        None => match non_empty(env("REDIS_URL")) {
            Some(url) => (url, "REDIS_URL"),
            None => {
                return Err(ConfigError::invalid(
                    "url",
                    "required (or set the REDIS_URL environment variable)",
                ))
            }
        },
    };
    check_redis_url(&url, url_field, warnings)
        .map_err(|reason| ConfigError::invalid(url_field, reason))
}

/// `poll_interval_ms`: 0 (or absent) for the default, else 1 to [`MAX_POLL_INTERVAL_MS`].
fn poll_interval_ms(raw: Option<i64>) -> Result<u64, ConfigError> {
    match raw.unwrap_or(0) {
        0 => Ok(DEFAULT_POLL_INTERVAL_MS),
        n if n < 0 => Err(ConfigError::invalid(
            "poll_interval_ms",
            format!("must be at least 1, got {n}"),
        )),
        n if n.unsigned_abs() > MAX_POLL_INTERVAL_MS => Err(ConfigError::invalid(
            "poll_interval_ms",
            format!("must be at most {MAX_POLL_INTERVAL_MS} (about 292 years), got {n}"),
        )),
        n => Ok(n.unsigned_abs()),
    }
}

/// `batch_size`: 0 (or absent) for the default, else 1 to [`MAX_BATCH_SIZE`].
fn batch_size(raw: Option<i64>) -> Result<u32, ConfigError> {
    match raw.unwrap_or(0) {
        0 => Ok(DEFAULT_BATCH_SIZE),
        n if n < 0 => Err(ConfigError::invalid(
            "batch_size",
            format!("must be at least 1, got {n}"),
        )),
        n => u32::try_from(n)
            .ok()
            .filter(|&b| b <= MAX_BATCH_SIZE)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "batch_size",
                    format!("must be at most {MAX_BATCH_SIZE}, got {n}"),
                )
            }),
    }
}

/// Every queue in config order, then the checks across them (unique names and ids, keys that
/// do one job each).
fn resolve_queues(
    raw_queues: Vec<RawQueue>,
    at_least_one: bool,
    retry_queue_name: &str,
    result_queue_name: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<QueueConfig>, ConfigError> {
    if raw_queues.is_empty() && at_least_one {
        return Err(ConfigError::invalid(
            "queues",
            "at least one queue is required",
        ));
    }
    let mut queues = Vec::with_capacity(raw_queues.len());
    for (i, q) in raw_queues.into_iter().enumerate() {
        queues.push(resolve_queue(i, q, warnings)?);
    }
    check_unique(&queues)?;
    check_key_kinds(&queues, retry_queue_name, result_queue_name)?;
    Ok(queues)
}

/// [`resolve`] for Go's redis-pubsub transport. Its queues are channels; what Go's
/// `PubSubConfig` does not have but inferq's queues use (`poll_interval_ms`, `batch_size`, the
/// claim settings) is accepted, and what Go ignores there (a queue's `id`, `gate_type`,
/// `gate_params` and `result_queue_name`) is ignored with a warning. Every result goes to the
/// transport's `result_queue_name` channel (Go's default `result-queue`), whatever the message
/// names.
pub(crate) fn resolve_pubsub(
    mut raw: RawSortedSet,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<(SortedSetConfig, ClaimFields), ConfigError> {
    for (i, q) in raw.queues.iter_mut().flatten().enumerate() {
        let present = [
            ("id", q.id.take().is_some()),
            ("gate_type", q.gate_type.take().is_some()),
            ("gate_params", q.gate_params.take().is_some()),
            ("result_queue_name", q.result_queue_name.take().is_some()),
        ];
        let ignored: Vec<String> = present
            .iter()
            .filter(|(_, set)| *set)
            .map(|(field, _)| format!("queues[{i}].{field}"))
            .collect();
        if !ignored.is_empty() {
            warnings.push(format!(
                "ignoring {}: Go's redis-pubsub transport has no such queue fields (a queue is \
                 named by its channel, is not gated, and every result goes to the transport's \
                 result_queue_name)",
                ignored.join(", ")
            ));
        }
    }
    if non_empty(raw.result_queue_name.clone()).is_none() {
        raw.result_queue_name = Some(DEFAULT_RESULT_CHANNEL.to_owned());
    }
    // `resolve` refuses two queues of one channel (a duplicate queue name).
    let (mut config, claim) = resolve(raw, env, warnings)?;
    if config.topology.is_cluster() {
        // A result published to no listener is kept on a list named after its channel, in
        // another slot than the queue's: no one script could do both.
        return Err(ConfigError::unsupported(
            "mode",
            "cluster with --transport redis-pubsub; use redis-sortedset on a Redis Cluster",
        ));
    }
    config.kind = TransportKind::PubSub;
    for q in &mut config.queues {
        q.result_queue_name = Some(config.result_queue_name.clone());
        // Go's flow never sets a queue id: its metric series carry `queue_id=""`, and a
        // message's `internal.queue_id` stays empty.
        q.id.clear();
    }
    Ok((config, claim))
}

/// An absolute `http://` or `https://` URL with a host.
pub(crate) fn check_http_url(url: &str) -> Result<(), String> {
    let shown = redact_url(url);
    let parsed = reqwest::Url::parse(url)
        .map_err(|e| format!("must be an http(s) URL, got {shown:?}: {e}"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!("must be an http(s) URL, got {shown:?}"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(format!("must name a host, got {shown:?}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
