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
//! # A producer
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use inferq_client::{NewRequest, Producer};
//! use serde_json::value::RawValue;
//!
//! # async fn produce() -> Result<(), Box<dyn std::error::Error>> {
//! // The queues a default `inferq run` (or the Go processor) serves.
//! let producer =
//!     Producer::connect("redis://127.0.0.1:6379/", "request-sortedset", "result-list").await?;
//! let deadline = inferq_client::producer::unix_ms() / 1000 + 3600;
//! let body = RawValue::from_string(r#"{"model":"m","prompt":"Say hello."}"#.to_owned())?;
//! let request = NewRequest::new("hello-1", deadline, body).with_endpoint("/v1/completions");
//! let submitted = producer.submit(request).await?;
//! println!("submitted {}", submitted.id);
//! if let Some(result) = producer.pop_result(Duration::from_secs(60)).await? {
//!     println!("{}", result.to_json());
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Layout
//!
//! - [`wire`]: the Go-compatible JSON formats (envelope, public request, result message).
//! - [`keys`]: every Redis key name derived from a queue, as Go names them.
//! - [`scripts`]: the Lua scripts (in `src/lua/`, one per move) and how they are called.
//! - [`target`], [`connect`] (with [`Cluster`] and [`Primary`]): where Redis is (standalone,
//!   Cluster, Sentinel, TLS) and the connections to it; [`Roots`]: the certificate authorities
//!   trusted for `rediss://`.
//! - [`producer`]: submit, cancel and take results ([`PayloadKeys`]: where large bodies go).
//! - [`reliable`], [`durable_results`]: result consumers that lose nothing when they die.
//! - [`ClaimSettings`], [`ReplicaWait`]: the lease settings the scripts take; [`hash_slot`]: Redis
//!   Cluster key slots; [`redact_url`], [`redact_in_text`]: passwords out of every message.
//!
//! Its dependencies are redis, serde, serde_json, tokio and thiserror, plus what TLS to Redis
//! needs (rustls and the root stores) and a few small ones (tracing, url, rand, sha1_smol,
//! futures, base64).

#![warn(missing_docs)]

#[cfg(feature = "cluster")]
mod cluster;
pub mod connect;
pub mod durable_results;
pub mod keys;
pub mod producer;
mod redact;
pub mod reliable;
pub mod result_route;
#[cfg(feature = "tls")]
mod roots;
pub mod scripts;
#[cfg(feature = "sentinel")]
mod sentinel;
mod settings;
mod slot;
mod submit;
pub mod target;
pub mod wire;

#[cfg(feature = "cluster")]
pub use cluster::{Cluster, STUCK_AFTER};
pub use producer::{Producer, ProducerError};
pub use redact::{redact_in_text, redact_url};
#[cfg(feature = "tls")]
pub use roots::{Roots, StorePaths};
#[cfg(feature = "sentinel")]
pub use sentinel::Primary;
pub use settings::{ClaimSettings, ReplicaWait};
pub use slot::{crc16_xmodem, hash_slot, SLOTS};
pub use submit::PayloadKeys;
pub use wire::{NewRequest, ResultMessage};
