//! inferq: durable, lease-based dispatch of latency-insensitive LLM requests.
//!
//! Producers put requests into Redis sorted sets (scored by deadline), or publish them on Redis
//! channels that inferq admits into such sets; inferq claims them under leases, sends them to an inference gateway, retries what fails and publishes exactly one result
//! per request generation. The durability contract lives in `../shared/design/durable-queue.md`
//! and is summarised in the README.
//!
//! # Layout
//!
//! One request travels top to bottom through these modules, and no module reaches back upstream:
//!
//! - [`wire`]: the Go-compatible JSON formats (envelope, public request, result message). Request
//!   payloads are kept as the producer's exact bytes.
//! - [`roots`]: the certificate authorities trusted by default on every outgoing TLS connection
//!   (gateway, `rediss://`, OTLP collector): the system store plus the bundled Mozilla roots.
//! - [`queue`]: Redis keys, the Lua scripts that make every move of the contract atomic
//!   (admit, claim, renew, ack, park, promote, release, reclaim, dead-letter), the producer side
//!   (submit, cancel, results), and the operator's reads and moves (census, dead letters).
//! - [`config`]: the Go transport-config JSON, pool and merge-policy files, and flags, validated
//!   into settings; a bad field is a clear error that names it.
//! - [`dispatch`]: the processor: the pub/sub ingress, per-queue consumers, merge into worker
//!   pools, heartbeats, reclaim, the result outbox, graceful shutdown.
//! - [`gateway`]: the HTTP client to the inference gateway and the classification of what came
//!   back into an outcome (result, retry, terminal error).
//! - [`ops`]: Prometheus metrics under the Go names and the health / readiness server.
//! - [`sim`]: a stand-alone OpenAI-compatible simulator gateway for demos and tests.
//! - [`chaos`]: the chaos harness (`inferq chaos`): real processes, injected faults, and a
//!   check of the whole history.
//! - [`bench`]: `inferq bench`, the benchmark of drains, latency, Redis commands and memory.
//! - [`cli`]: the `inferq` subcommands; `src/main.rs` only calls into it.
//! - [`testkit`]: real `redis-server` processes on free ports for tests and the demo.

pub mod bench;
pub mod chaos;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod gateway;
pub mod ops;
pub mod queue;
pub mod roots;
pub mod sim;
pub mod testkit;
pub mod wire;
