//! The HTTP side of inferq: how one claimed request becomes one POST to the inference gateway, and
//! how whatever came back becomes an [`Outcome`] the dispatcher can act on.
//!
//! Data enters as a base URL plus an endpoint, the queue's objective, the message's headers and
//! its payload bytes; it leaves as an [`Attempt`] (an [`Outcome`] and how long it took). Deciding
//! *when* to retry lives in [`backoff`]; applying the outcome to Redis is the dispatcher's job.
//!
//! ```text
//!   base URL + endpoint ──join_url──► URL ─┐
//!   objective, message headers,            │
//!   fairness, request id ──build_headers──► HeaderMap ─┤
//!   payload bytes ─────────────────────────────────────┤
//!                                                      ▼
//!                                   GatewayClient::send(url, headers, body, timeout)
//!                                                      │ (drop the future = abort the request)
//!                                                      ▼
//!                      Attempt { outcome: Success | Terminal | Retry | Fatal, elapsed }
//!                                                      │ Retry?
//!                                                      ▼
//!                    backoff::retry_decision(n, seconds left, Retry-After) ─► Backoff(d) | DeadlineExceeded
//! ```
//!
//! Compatibility: request building, classification and backoff follow the Go llm-d-async worker
//! (`shared/spec/go-compat.md` §5.1–5.5). Where Go is weak inferq does better (§12 item 5):
//! connection failures, DNS errors and per-attempt timeouts are **retried** (Go made them
//! terminal `INFERENCE_ERROR`s).
//!
//! Layout:
//! - [`url`]: `join_url`, Go's `url.JoinPath` rebuilt from its documented behaviour.
//! - [`headers`]: the outgoing header set (content type, objective, message headers, fairness,
//!   inferq's request id).
//! - [`tls`]: the `--tls-*` flags and how they become a rustls configuration.
//! - `trust`: whether a gateway's certificate is trusted, as Go decides it (a listed
//!   self-signed certificate served as it is); `leaf` reads the dates and usage that needs.
//! - [`client`]: the keep-alive client and the cancel-safe `send`.
//! - [`h1`]: inferq's own keep-alive HTTP/1.1 connections to `http` and `https` gateways.
//! - [`redirect`]: the first hop of a redirect a gateway answers inferq's own connections with.
//! - [`outcome`]: the outcome enum, Go's `ClientError` text, and the classification rules.
//! - [`backoff`]: equal-jitter exponential backoff, `Retry-After`, the retry decision.
//! - [`transform`]: request body transforms (`--transform-config-file`).

pub mod backoff;
pub mod client;
pub mod h1;
pub mod headers;
mod leaf;
pub mod outcome;
pub mod redirect;
pub mod tls;
pub mod transform;
mod trust;
pub mod url;

use std::path::PathBuf;

pub use backoff::{exp_backoff, parse_retry_after, retry_decision, RetryDecision};
pub use client::{parse_target, Attempt, GatewayClient, Target, DEFAULT_BODY_LIMIT};
pub use headers::{
    build_headers, check_message_headers, stamp_header, DROPPED_REASON_HEADER, OBJECTIVE_HEADER,
    REQUEST_ID_HEADER,
};
pub use outcome::{ClientError, ErrorCategory, Outcome, RetryReason};
pub use tls::GatewayTls;
pub use url::{join_url, validate_base_url};

/// Everything in this layer that is an error of configuration or construction (a failed HTTP
/// exchange is not an error here: it is an [`Outcome`]).
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The base URL (or the URL joined from it) is not a URL Go's `net/url` would accept, or it
    /// cannot be used to reach a gateway.
    #[error("invalid gateway URL {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    /// A `--tls-*` setting cannot be turned into a TLS configuration.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// A `--tls-*` file could not be read.
    #[error("reading {path}: {source}")]
    ReadFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// reqwest refused the assembled client configuration.
    #[error("building the gateway HTTP client: {0}")]
    Client(String),
}

/// Renders an error with all of its sources, `outer: inner: innermost`, skipping a source whose
/// text the previous level already contains (reqwest and hyper often repeat themselves).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(inner) = source {
        let piece = inner.to_string();
        if !piece.is_empty() && !text.contains(&piece) {
            text.push_str(": ");
            text.push_str(&piece);
        }
        source = inner.source();
    }
    text
}
