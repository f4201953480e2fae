//! inferq: durable, lease-based dispatch of latency-insensitive LLM requests (the processor).
//!
//! Producers put requests into Redis sorted sets (scored by deadline), or publish them on Redis
//! channels that inferq admits into such sets; inferq claims them under leases, sends them to an
//! inference gateway, retries what fails and publishes exactly one result per request
//! generation. The durability contract lives in `../shared/design/durable-queue.md`
//! and is summarised in the README.
//!
//! # Layout
//!
//! One request travels top to bottom through these modules, and no module reaches back upstream:
//!
//! - [`wire`], [`roots`]: re-exported from the `inferq-client` crate, which also holds the Redis
//!   keys, the Lua scripts, the connections and the producer side (submit, cancel, results);
//!   `queue` re-exports those modules under their old paths.
//! - [`queue`]: the typed moves of the contract (admit, claim, renew, ack, park, promote,
//!   release, reclaim, dead-letter) over the client's scripts, and the operator's reads and
//!   moves (census, dead letters).
//! - [`config`]: the Go transport-config JSON, pool and merge-policy files, and flags, validated
//!   into settings; a bad field is a clear error that names it.
//! - [`dispatch`]: the processor: the pub/sub ingress, per-queue consumers, merge into worker
//!   pools, heartbeats, reclaim, the result outbox, graceful shutdown.
//! - [`gateway`]: the HTTP client to the inference gateway and the classification of what came
//!   back into an outcome (result, retry, terminal error).
//! - [`ops`]: Prometheus metrics under the Go names and the health / readiness server.
//! - [`cli`]: the `inferq` subcommands; `src/main.rs` only calls into it.
//!
//! The simulator, the chaos harness, the benchmark, the demo and the test kit live in crates of
//! their own (`inferq-sim`, `inferq-chaos`, `inferq-bench`, `inferq-testkit`, and the
//! `inferq-dev` binary), so this crate and its binary do not link them.

pub mod cli;
pub mod config;
pub mod dispatch;
pub mod gateway;
pub mod ops;
pub mod queue;
