//! The sorted-set transport config (go-compat §3.2): the JSON of `--transport-config` /
//! `--transport-config-file` (or the one the legacy flags synthesise) is decoded into
//! `RawSortedSet`, then `resolve` applies Go's load order — `REDIS_URL` fallback, defaults,
//! validation — and hands back a typed [`SortedSetConfig`] plus the claim fields, which the loader
//! combines with the claim flags.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::queue::QueueKeys;

use super::claim::ClaimFields;
use super::gate::{parse_gate, GateSpec};
use super::redis_url::check_redis_url;
use super::topology::{resolve_topology, TopologyFields, CONFIG_FIELDS};
use super::{redact_url, ConfigError};
use crate::queue::target::Topology;

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
}

/// The transport config exactly as written; every field optional so defaults can apply.
#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSortedSet {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub addrs: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub master_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub poll_interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enable_tracing: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queues: Option<Vec<RawQueue>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_lease_ttl_seconds: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub claim_reclaim_interval_ms: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_deliveries: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_wait: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub replica_wait_timeout_ms: Option<i64>,
}

/// Where [`RawSortedSet`]'s JSON must hold objects (see `json::decode`): the root and each queue.
pub(crate) const RAW_SORTED_SET_OBJECTS: [&str; 2] = ["", "queues[]"];

/// One queue exactly as written.
#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQueue {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_queue_name: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result_ttl_seconds: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_pool_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub inference_objective: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub request_path_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub igw_base_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gate_params: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
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
pub(crate) fn resolve_with(
    raw: RawSortedSet,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
    at_least_one: bool,
) -> Result<(SortedSetConfig, ClaimFields), ConfigError> {
    // Errors about the URL name where it came from: the field, or the environment variable.
    let (url, url_field) = match non_empty(raw.url) {
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
    let url = check_redis_url(&url, url_field, warnings)
        .map_err(|reason| ConfigError::invalid(url_field, reason))?;
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
    let poll_interval_ms = match raw.poll_interval_ms.unwrap_or(0) {
        0 => DEFAULT_POLL_INTERVAL_MS,
        n if n < 0 => {
            return Err(ConfigError::invalid(
                "poll_interval_ms",
                format!("must be at least 1, got {n}"),
            ))
        }
        n if n.unsigned_abs() > MAX_POLL_INTERVAL_MS => {
            return Err(ConfigError::invalid(
                "poll_interval_ms",
                format!("must be at most {MAX_POLL_INTERVAL_MS} (about 292 years), got {n}"),
            ))
        }
        n => n.unsigned_abs(),
    };
    let batch_size = match raw.batch_size.unwrap_or(0) {
        0 => DEFAULT_BATCH_SIZE,
        n if n < 0 => {
            return Err(ConfigError::invalid(
                "batch_size",
                format!("must be at least 1, got {n}"),
            ))
        }
        n => u32::try_from(n)
            .ok()
            .filter(|&b| b <= MAX_BATCH_SIZE)
            .ok_or_else(|| {
                ConfigError::invalid(
                    "batch_size",
                    format!("must be at most {MAX_BATCH_SIZE}, got {n}"),
                )
            })?,
    };

    let raw_queues = raw.queues.unwrap_or_default();
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
    check_key_kinds(&queues, &retry_queue_name, &result_queue_name)?;

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
    let claim = ClaimFields {
        lease_seconds: raw.claim_lease_ttl_seconds,
        reclaim_interval_ms: raw.claim_reclaim_interval_ms,
        max_deliveries: raw.max_deliveries,
        replica_wait: raw.replica_wait,
        replica_wait_timeout_ms: raw.replica_wait_timeout_ms,
    };
    Ok((config, claim))
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

/// Defaults and per-queue checks for `queues[i]`.
fn resolve_queue(
    i: usize,
    q: RawQueue,
    warnings: &mut Vec<String>,
) -> Result<QueueConfig, ConfigError> {
    let at = |field: &str| format!("queues[{i}].{field}");
    let queue_name = non_empty(q.queue_name)
        .ok_or_else(|| ConfigError::invalid(at("queue_name"), "required"))?;
    let igw_base_url = non_empty(q.igw_base_url)
        .ok_or_else(|| ConfigError::invalid(at("igw_base_url"), "required"))?;
    check_http_url(&igw_base_url)
        .map_err(|reason| ConfigError::invalid(at("igw_base_url"), reason))?;
    let inference_objective = non_empty(q.inference_objective);
    if let Some(objective) = &inference_objective {
        // Sent as a header on every request: Go's client would refuse each one at send time.
        if reqwest::header::HeaderValue::from_str(objective).is_err() {
            return Err(ConfigError::invalid(
                at("inference_objective"),
                "not a legal HTTP header value (it is sent as x-gateway-inference-objective): \
                 control characters such as a line break are not allowed",
            ));
        }
    }
    let result_ttl_seconds = match q.result_ttl_seconds {
        None => 0,
        Some(ttl) => u64::try_from(ttl).map_err(|_| {
            ConfigError::invalid(
                at("result_ttl_seconds"),
                format!("{ttl} is negative: 0 (or leaving it out) keeps results for good, a positive number of seconds sets the result list's TTL at every push"),
            )
        })?,
    };
    let gate = parse_gate(
        q.gate_type.as_deref(),
        q.gate_params.as_ref(),
        &at("gate_type"),
        &at("gate_params"),
        warnings,
    )?;
    Ok(QueueConfig {
        id: non_empty(q.id).unwrap_or_else(|| queue_name.clone()),
        result_queue_name: non_empty(q.result_queue_name),
        result_ttl_seconds,
        worker_pool_id: non_empty(q.worker_pool_id).unwrap_or_else(|| DEFAULT_POOL_ID.to_owned()),
        inference_objective,
        request_path_url: non_empty(q.request_path_url)
            .unwrap_or_else(|| DEFAULT_REQUEST_PATH.to_owned()),
        igw_base_url,
        gate,
        gate_params_field: at("gate_params"),
        labels: q.labels.unwrap_or_default(),
        queue_name,
    })
}

/// Ids unique and queue names unique.
fn check_unique(queues: &[QueueConfig]) -> Result<(), ConfigError> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, q) in queues.iter().enumerate() {
        if let Some(first) = names.insert(&q.queue_name, i) {
            return Err(ConfigError::invalid(
                format!("queues[{i}].queue_name"),
                format!(
                    "duplicate queue name {:?} (queues[{first}] has it too)",
                    q.queue_name
                ),
            ));
        }
        if let Some(first) = ids.insert(&q.id, i) {
            let hint = if q.id == q.queue_name {
                "; an empty id defaults to queue_name"
            } else {
                ""
            };
            return Err(ConfigError::invalid(
                format!("queues[{i}].id"),
                format!("duplicate id {:?} (queues[{first}] has it too{hint})", q.id),
            ));
        }
    }
    Ok(())
}

/// Request queues are sorted sets, result queues lists: one key cannot be both, and the retry set
/// cannot double as a request queue. None of them may be one of the keys inferq derives from a
/// queue's name (`<queue>:dead`, `<queue>:parked`, ...).
fn check_key_kinds(
    queues: &[QueueConfig],
    retry: &str,
    default_result: &str,
) -> Result<(), ConfigError> {
    check_derived_keys(queues, retry, default_result)?;
    let queue_with = |name: &str| queues.iter().position(|q| q.queue_name == name);
    if let Some(j) = queue_with(retry) {
        return Err(ConfigError::invalid(
            "retry_queue_name",
            format!("{retry:?} is also queues[{j}].queue_name; the retry set must be its own key"),
        ));
    }
    let mut results: Vec<(String, &str)> = vec![("result_queue_name".to_owned(), default_result)];
    for (i, q) in queues.iter().enumerate() {
        if let Some(name) = &q.result_queue_name {
            results.push((format!("queues[{i}].result_queue_name"), name));
        }
    }
    for (field, name) in results {
        if let Some(j) = queue_with(name) {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "{name:?} is also queues[{j}].queue_name; a result list must be its own key"
                ),
            ));
        }
        if name == retry {
            return Err(ConfigError::invalid(
                field,
                format!("{name:?} is also retry_queue_name; a result list must be its own key"),
            ));
        }
    }
    Ok(())
}

/// No configured key is a key derived from a queue's name: results pushed onto `q:dead` would
/// mix with its dead letters, a queue named `q:parked` would be q's retry set.
fn check_derived_keys(
    queues: &[QueueConfig],
    retry: &str,
    default_result: &str,
) -> Result<(), ConfigError> {
    let mut configured: Vec<(String, &str)> = vec![
        ("retry_queue_name".to_owned(), retry),
        ("result_queue_name".to_owned(), default_result),
    ];
    for (i, q) in queues.iter().enumerate() {
        configured.push((format!("queues[{i}].queue_name"), &q.queue_name));
        if let Some(name) = &q.result_queue_name {
            configured.push((format!("queues[{i}].result_queue_name"), name));
        }
    }
    for (j, q) in queues.iter().enumerate() {
        // Either layout: a config that names no mode may still meet a cluster later.
        let plain = QueueKeys::new(&q.queue_name);
        let tagged = QueueKeys::clustered(&q.queue_name);
        for (field, name) in &configured {
            if plain.all()[1..].contains(name) || tagged.all()[1..].contains(name) {
                return Err(ConfigError::invalid(
                    field.as_str(),
                    format!(
                        "{name:?} is a key inferq keeps for queues[{j}] ({:?}); give it another \
                         name",
                        q.queue_name
                    ),
                ));
            }
        }
    }
    Ok(())
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
mod tests {
    use super::super::json::decode;
    use super::*;

    /// The example of go-compat §3.2, verbatim.
    pub(crate) const GO_EXAMPLE: &str = r#"{"url":"redis://...","retry_queue_name":"retry-sortedset","result_queue_name":"result-list",
 "poll_interval_ms":1000,"batch_size":10,"enable_tracing":false,
 "queues":[{"id":"q1","queue_name":"request-sortedset","result_queue_name":"","worker_pool_id":"default",
            "inference_objective":"","request_path_url":"/v1/completions","igw_base_url":"http://gw:80",
            "gate_type":"redis","gate_params":{"address":"redis:6379"},"labels":{"tier":"batch"}}]}"#;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn load_text(text: &str) -> Result<SortedSetConfig, ConfigError> {
        let raw: RawSortedSet = decode(text, "", "--transport-config", &RAW_SORTED_SET_OBJECTS)?;
        resolve(raw, &no_env, &mut Vec::new()).map(|(c, _)| c)
    }

    fn err(text: &str) -> String {
        match load_text(text) {
            Ok(c) => format!("loaded {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    /// A minimal valid config with `extra` spliced into the top level and `queue` into the queue.
    fn cfg(extra: &str, queue: &str) -> String {
        format!(
            r#"{{"url":"redis://r:6379"{extra},"queues":[{{"queue_name":"q","igw_base_url":"http://gw"{queue}}}]}}"#
        )
    }

    #[test]
    fn go_example_loads_with_go_defaults() {
        let c = load_text(GO_EXAMPLE).unwrap();
        assert_eq!(c.url.expose(), "redis://...");
        assert_eq!(c.retry_queue_name, "retry-sortedset");
        assert_eq!(c.result_queue_name, "result-list");
        assert_eq!(c.poll_interval, Duration::from_millis(1000));
        assert_eq!(c.batch_size, 10);
        assert!(!c.enable_tracing);
        assert_eq!(c.queues.len(), 1);
        let q = &c.queues[0];
        assert_eq!(q.id, "q1");
        assert_eq!(q.queue_name, "request-sortedset");
        assert_eq!(q.result_queue_name, None);
        assert_eq!(q.worker_pool_id, "default");
        assert_eq!(q.inference_objective, None);
        assert_eq!(q.request_path_url, "/v1/completions");
        assert_eq!(q.igw_base_url, "http://gw:80");
        let gate = q.gate.as_ref().map(|g| (g.kind.as_str(), g.params.clone()));
        let expected = serde_json::json!({"address": "redis:6379"});
        assert_eq!(
            gate,
            Some(("redis", expected.as_object().cloned().unwrap_or_default()))
        );
        assert_eq!(q.labels.get("tier").map(String::as_str), Some("batch"));
    }

    #[test]
    fn defaults_when_fields_are_absent_or_zero() {
        let c = load_text(&cfg(
            r#","poll_interval_ms":0,"batch_size":0,"retry_queue_name":"""#,
            "",
        ));
        let c = match c {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(c.retry_queue_name, DEFAULT_RETRY_QUEUE);
        assert_eq!(c.result_queue_name, DEFAULT_RESULT_QUEUE);
        assert_eq!(c.poll_interval, Duration::from_millis(1000));
        assert_eq!(c.batch_size, 10);
        let q = &c.queues[0];
        assert_eq!(q.id, "q");
        assert_eq!(q.worker_pool_id, "default");
        assert_eq!(q.request_path_url, "/v1/completions");
        assert_eq!(q.gate, None);
        assert!(q.labels.is_empty());
    }

    #[test]
    fn unknown_fields_are_errors_with_their_path() {
        assert_eq!(
            err(&cfg("", r#","igw_base_ur":"http://x""#))
                .split(" (")
                .next()
                .unwrap_or(""),
            "invalid config: queues[0].igw_base_ur: unknown field"
        );
        assert!(err(&cfg(r#","poll_interval":5"#, ""))
            .starts_with("invalid config: poll_interval: unknown field"));
    }

    #[test]
    fn redis_url_falls_back_to_env_only_when_empty() {
        let env = |k: &str| (k == "REDIS_URL").then(|| "redis://from-env:6379".to_owned());
        let with_url: RawSortedSet = decode(&cfg("", ""), "", "x", &[]).unwrap_or_default();
        let (c, _) = resolve(with_url, &env, &mut Vec::new())
            .map_err(|e| e.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.url.expose(), "redis://r:6379");

        let empty = cfg("", "").replace("redis://r:6379", "");
        let raw: RawSortedSet = decode(&empty, "", "x", &[]).unwrap_or_default();
        let (c, _) = resolve(raw, &env, &mut Vec::new())
            .map_err(|e| e.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.url.expose(), "redis://from-env:6379");

        let absent = r#"{"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
        let raw: RawSortedSet = decode(absent, "", "x", &[]).unwrap_or_default();
        let (c, _) = resolve(raw, &env, &mut Vec::new())
            .map_err(|e| e.to_string())
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.url.expose(), "redis://from-env:6379");
    }

    #[test]
    fn validation_rules_name_their_field() {
        let no_url = r#"{"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
        assert_eq!(
            err(no_url),
            "invalid config: url: required (or set the REDIS_URL environment variable)"
        );
        let bad_scheme = cfg("", "").replace("redis://r:6379", "http://u:pw9@r:6379");
        let text = err(&bad_scheme);
        assert!(
            text.starts_with("invalid config: url: scheme must be redis://, rediss://, or unix://"),
            "{text}"
        );
        assert!(!text.contains("pw9"), "{text}");
        assert!(err(&cfg("", "").replace("redis://r:6379", "r:6379"))
            .starts_with("invalid config: url: "));
        assert!(
            err(&cfg("", "").replace("redis://r:6379", "redis://r:6379/x"))
                .starts_with("invalid config: url: ")
        );
        assert!(
            err(&cfg("", "").replace("redis://r:6379", "redis://r:port"))
                .starts_with("invalid config: url: cannot parse")
        );
        assert!(err(&cfg("", "").replace("redis://r:6379", "unix://"))
            .starts_with("invalid config: url: "));
        for ok in [
            "rediss://:pw@r:6380/2",
            "unix:///var/run/redis.sock",
            "REDIS://r",
        ] {
            let text = err(&cfg("", "").replace("redis://r:6379", ok));
            assert!(text.starts_with("loaded"), "{ok}: {text}");
        }

        assert_eq!(
            err(r#"{"url":"redis://r","queues":[]}"#),
            "invalid config: queues: at least one queue is required"
        );
        assert_eq!(
            err(r#"{"url":"redis://r"}"#),
            "invalid config: queues: at least one queue is required"
        );
        assert_eq!(
            err(r#"{"url":"redis://r","queues":[{"igw_base_url":"http://gw"}]}"#),
            "invalid config: queues[0].queue_name: required"
        );
        assert_eq!(
            err(
                r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"b"}]}"#
            ),
            "invalid config: queues[1].igw_base_url: required"
        );
        assert!(err(&cfg("", "").replace("http://gw", "gw:80"))
            .starts_with("invalid config: queues[0].igw_base_url: must be an http(s) URL"));
        assert!(err(&cfg("", "").replace("http://gw", "ftp://gw"))
            .starts_with("invalid config: queues[0].igw_base_url: must be an http(s) URL"));
        assert_eq!(
            err(
                r#"{"url":"redis://r","queues":[{"id":"x","queue_name":"a","igw_base_url":"http://gw"},{"id":"x","queue_name":"b","igw_base_url":"http://gw"}]}"#
            ),
            "invalid config: queues[1].id: duplicate id \"x\" (queues[0] has it too)"
        );
        assert_eq!(
            err(r#"{"url":"redis://r","queues":[{"id":"b","queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"b","igw_base_url":"http://gw"}]}"#),
            "invalid config: queues[1].id: duplicate id \"b\" (queues[0] has it too; an empty id defaults to queue_name)"
        );
        assert_eq!(
            err(r#"{"url":"redis://r","queues":[{"id":"1","queue_name":"a","igw_base_url":"http://gw"},{"id":"2","queue_name":"a","igw_base_url":"http://gw"}]}"#),
            "invalid config: queues[1].queue_name: duplicate queue name \"a\" (queues[0] has it too)"
        );
        assert_eq!(
            err(&cfg(r#","batch_size":-1"#, "")),
            "invalid config: batch_size: must be at least 1, got -1"
        );
        assert_eq!(
            err(&cfg(r#","batch_size":10001"#, "")),
            "invalid config: batch_size: must be at most 10000, got 10001"
        );
        assert_eq!(
            err(&cfg(r#","poll_interval_ms":-5"#, "")),
            "invalid config: poll_interval_ms: must be at least 1, got -5"
        );
        assert!(err(&cfg("", r#","gate_type":"reddis""#))
            .starts_with("invalid config: queues[0].gate_type: unknown gate type \"reddis\""));
        assert_eq!(
            err(&cfg("", r#","gate_type":"redis","gate_params":[1]"#)),
            "invalid config: queues[0].gate_params: must be a JSON object, got an array"
        );
        assert_eq!(
            err(&cfg(r#","retry_queue_name":"q""#, "")),
            "invalid config: retry_queue_name: \"q\" is also queues[0].queue_name; the retry set must be its own key"
        );
        assert_eq!(
            err(&cfg("", r#","result_queue_name":"q""#)),
            "invalid config: queues[0].result_queue_name: \"q\" is also queues[0].queue_name; a result list must be its own key"
        );
        assert_eq!(
            err(&cfg(r#","result_queue_name":"retry-sortedset""#, "")),
            "invalid config: result_queue_name: \"retry-sortedset\" is also retry_queue_name; a result list must be its own key"
        );
        assert_eq!(
            err(&cfg("", r#","labels":{"tier":1}"#)),
            "invalid config: queues[0].labels.tier: invalid type: integer `1`, expected a string"
        );
    }

    /// Before: accepted, and results went onto q's dead-letter list, or a queue was another
    /// queue's retry set.
    #[test]
    fn keys_derived_from_a_queue_name_are_not_configured_names() {
        assert_eq!(
            err(&cfg(r#","result_queue_name":"q:dead""#, "")),
            "invalid config: result_queue_name: \"q:dead\" is a key inferq keeps for queues[0] \
             (\"q\"); give it another name"
        );
        assert_eq!(
            err(&cfg(r#","retry_queue_name":"q:parked""#, "")),
            "invalid config: retry_queue_name: \"q:parked\" is a key inferq keeps for queues[0] \
             (\"q\"); give it another name"
        );
        assert_eq!(
            err(&cfg("", r#","result_queue_name":"q:claimed""#)),
            "invalid config: queues[0].result_queue_name: \"q:claimed\" is a key inferq keeps \
             for queues[0] (\"q\"); give it another name"
        );
        assert_eq!(
            err(
                r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"a:dead","igw_base_url":"http://gw"}]}"#
            ),
            "invalid config: queues[1].queue_name: \"a:dead\" is a key inferq keeps for \
             queues[0] (\"a\"); give it another name"
        );
        // Names that merely start with a queue's name are fine.
        assert!(err(&cfg(r#","result_queue_name":"q:results""#, "")).starts_with("loaded"));
    }

    #[test]
    fn url_is_redacted_in_debug() {
        let c = load_text(&cfg("", "").replace("redis://r:6379", "redis://u:hunter2@r:6379"));
        let c = match c {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        let shown = format!("{c:?} {}", c.url);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://u:***@r:6379"), "{shown}");
        assert_eq!(c.url.expose(), "redis://u:hunter2@r:6379");
        assert!(!c.url.is_tls());
        assert!(RedisUrl("REDISS://h".into()).is_tls());
        assert!(!RedisUrl("redisé://h".into()).is_tls());
    }
}
