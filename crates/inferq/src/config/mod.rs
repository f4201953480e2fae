//! Configuration: the Go processor's flags, transport-config JSON, pool file and merge-policy
//! file, validated into one typed [`RunConfig`]. A user swapping the Go binary for inferq keeps
//! all four unchanged (go-compat §3.2, §7, §8); inferq is stricter where Go was silent (unknown
//! JSON fields, unknown gate types, keys that would collide) and every refusal is a
//! [`ConfigError`] naming the flag or JSON path and the reason.
//!
//! Data flow: clap fills [`RunArgs`] → [`load`] reads the files the flags name and the
//! environment (`REDIS_URL`) → [`RunConfig`], consumed by the CLI's `run` command.
//!
//! - [`args`]: the flags, spelled and defaulted as Go's.
//! - [`run`]: [`load`], flag checks, choice of transport surface, cross-checks; [`RunConfig`].
//! - [`transport`]: the sorted-set transport JSON and its queues.
//! - [`reload`]: reading the transport config file again while running (its `queues` only).
//! - `legacy`: the deprecated `--message-queue-impl`/`--redis.*`/`--pubsub.*` flags → a transport
//!   config (one queue, or the queues of `--redis.ss.queues-config[-file]`).
//! - `claim`: lease, reclaim interval and delivery limit from the JSON or the claim flags.
//! - [`pools`], [`merge`], [`gate`]: worker pools, merge policy, gate type names.
//! - `redis_url`: the Redis URL as go-redis reads it (`?db=N`, its options).
//! - [`cluster`]: Redis Cluster hash slots, to refuse queues whose keys cannot share a slot.
//! - [`transform`]: the request-transform file.
//! - [`otel`]: OpenTelemetry settings from the standard `OTEL_*` variables.
//! - [`duration`]: Go duration syntax. `json`: strict decoding with JSON paths in errors.
//! - [`error`]: [`ConfigError`], exit code, password redaction.

pub mod args;
pub(crate) mod claim;
pub mod cluster;
pub mod duration;
pub mod error;
pub mod fair_share;
pub mod gate;
pub mod gate_params;
mod json;
mod legacy;
pub mod merge;
pub mod otel;
pub mod pools;
mod redis_url;
pub mod reload;
pub mod run;
pub mod topology;
pub mod transform;
pub mod transport;

pub use args::{Redacted, RunArgs};
pub use cluster::{check_same_slot, hash_slot, shared_slot};
pub use duration::parse_duration;
pub use error::{redact_in_text, redact_url, ConfigError, EXIT_CODE};
pub use fair_share::FairShare;
pub use gate::{GateSpec, GateType};
pub use merge::{Fairness, MergePolicy, MergePolicyKind};
pub use pools::PoolConfig;
pub use redis_url::check_redis_url;
pub use run::{
    load, load_with_env, ClientCert, PrometheusSettings, RunConfig, TlsFiles, TransportSource,
};
pub use transport::{QueueConfig, RedisUrl, SortedSetConfig, TransportKind};

#[cfg(test)]
mod tests;
