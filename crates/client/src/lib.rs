//! inferq-client: what a Rust producer or result consumer embeds to talk to inferq through
//! Redis, without the processor.
//!
//! It holds the wire contract shared with the Go `llm-d-async` processor and with `inferq run`:
//! the JSON formats, the Redis key names, and the Lua scripts that make each move atomic. A
//! request enters as a [`wire::NewRequest`] handed to a [`producer::Producer`], which submits it
//! (one script: numbered, its body stored inline or apart, the queue's doorbell rung); a result
//! leaves as a [`wire::ResultMessage`] taken from its result list, destructively
//! ([`producer::Producer::pop_result`]), under a named consumer lease ([`reliable`]), or by
//! Go's durable consumer protocol ([`durable_results`]).
//!
//! # Layout
//!
//! - [`wire`]: the Go-compatible JSON formats (envelope, public request, result message).
//! - [`keys`]: every Redis key name derived from a queue, as Go names them.
//! - [`scripts`]: the Lua scripts (in `src/lua/`, one per move) and how they are called.
//! - [`target`], [`connect`], [`cluster`], [`sentinel`]: where Redis is (standalone, Cluster,
//!   Sentinel, TLS) and the connections to it; [`roots`]: the certificate authorities trusted for `rediss://`.
//! - [`producer`], [`submit`]: submit, cancel and take results.
//! - [`reliable`], [`durable_results`]: result consumers that lose nothing when they die.
//! - [`settings`]: the lease settings the scripts take; [`slot`]: Redis Cluster key slots;
//!   [`redact`]: passwords out of every message.
//!
//! Its dependencies are redis, serde, serde_json, tokio and thiserror, plus what TLS to Redis
//! needs (rustls and the root stores) and a few small ones (tracing, url, rand, sha1_smol,
//! futures, base64).

pub mod cluster;
pub mod connect;
pub mod durable_results;
pub mod keys;
pub mod producer;
pub mod redact;
pub mod reliable;
pub mod roots;
pub mod scripts;
pub mod sentinel;
pub mod settings;
pub mod slot;
pub mod submit;
pub mod target;
pub mod wire;

pub use producer::{Producer, ProducerError};
pub use wire::{NewRequest, ResultMessage};
