//! The keep-alive HTTP client to the inference gateway and its one operation, [`GatewayClient::send`].
//!
//! A URL (from [`super::join_url`]), headers (from [`super::build_headers`]), the payload bytes
//! and a per-attempt timeout enter; an [`Attempt`] leaves. `send` never fails: every way an
//! exchange can end is an [`Outcome`].
//!
//! Like Go's worker transport: one pooled client shared by all workers (idle timeout 90 s), no
//! client-level timeout (the caller passes `min(--request-timeout, time to the deadline)` per
//! attempt), redirects followed as Go's default policy follows them (the tenth fails the
//! request), and no proxy (Go's hand-built transport ignores `HTTP_PROXY`; so does inferq).
//! HTTP/2 is used when a TLS gateway chooses it by ALPN; cleartext gateways get HTTP/1.1.
//!
//! Cancel safety: `send` owns everything it uses, so dropping its future (for example from a
//! `tokio::select!` branch that lost) drops the in-flight request. For HTTP/1.1 hyper then closes
//! that connection, and for HTTP/2 it resets the stream; the gateway sees the request go away.
//! That is how inferq abandons work it no longer owns or that was cancelled.
//!
//! Two paths: an `http://` or `https://` URL without user info goes over inferq's own keep-alive
//! HTTP/1.1 connections ([`super::h1`]: no per-request URL conversion, redirect or retry layer,
//! or general pool; it took the processor's CPU per request from about 41 µs to 28 µs on the
//! benchmark's drain, and over TLS from about 40 µs to 30 µs). Everything else goes through
//! reqwest: a TLS gateway that chooses HTTP/2, URLs with user info, and the redirects a gateway
//! answers with (a redirect goes on to its `Location` through reqwest, the first hop changed as
//! reqwest changes every hop, [`super::redirect`], so the redirecting endpoint sees the request
//! once). Both paths share one TLS configuration ([`super::tls`]).
//!
//! Connection reuse on the reqwest path: a finished HTTP/1.1 connection goes back to the pool
//! from a task of its own, a moment after the caller has read the body (with a chunked body, only
//! once the last chunk is parsed). A worker that sends again at once would find no idle
//! connection and dial a new one, and once the pool held its limit it closed one for every one it
//! dialled: with a chunked gateway (node's `http`, for one) 16 back-to-back workers opened over
//! 1,100 connections for 6,400 requests, each a TCP (and with TLS, a handshake) setup on both
//! sides. So `send` yields once after the body, letting the connection reach the pool first, and
//! the pool keeps up to twice the worker count idle, so the odd connection dialled in such a race
//! is kept rather than closed. Go's transport keeps as many idle connections as there are
//! workers. inferq's own path waits for a checked-out connection to be ready instead, and keeps
//! as many idle.
//!
//! Layout (each piece under `client/`):
//! - this file: the client itself, building it, and `send`, which picks the path;
//! - `target`: a gateway URL parsed once, and whether inferq's own connections serve it;
//! - `direct`: the path over inferq's own connections, and a redirect's first hop;
//! - `general`: the path through reqwest;
//! - `response`: what classification needs of a response: its head, and its body up to a limit;
//! - `failure`: how an exchange that failed before any response head becomes an [`Outcome`];
//! - `redirect_limit`: Go's limit on redirects, on the reqwest path.

mod direct;
mod failure;
mod general;
mod redirect_limit;
mod response;
mod target;
#[cfg(test)]
mod tests;

use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use tokio::time::Instant;

use super::h1::{Connections, IDLE_TIMEOUT};
use super::outcome::request_failure;
use super::{error_chain, GatewayError, GatewayTls, Outcome};
use redirect_limit::{stop_after, MAX_REDIRECTS};

pub use target::{parse_target, Target};

/// The largest response body inferq reads (64 MiB); a larger one is a `Fatal` outcome.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024 * 1024;

const USER_AGENT: &str = concat!("inferq/", env!("CARGO_PKG_VERSION"));

/// One attempt at one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub outcome: Outcome,
    /// From the start of the send to the end of the body (or the failure): the inference latency.
    pub elapsed: Duration,
}

/// The shared client to the inference gateway. Cheap to clone (the connection pool is shared).
#[derive(Debug, Clone)]
pub struct GatewayClient {
    http: reqwest::Client,
    /// The rest of a redirect chain whose first hop a gateway answered on inferq's own
    /// connections (see [`super::redirect`]): one redirect fewer allowed, so the chain is as long
    /// as reqwest's.
    onward: reqwest::Client,
    /// The HTTP/1.1 connections of `http` and `https` targets (see [`super::h1`]).
    direct: std::sync::Arc<Connections>,
    /// Bodies longer than this are not read to the end (see [`DEFAULT_BODY_LIMIT`]).
    body_limit: usize,
}

impl GatewayClient {
    /// Builds the client. `pool_size` is the total number of workers across all pools; twice as
    /// many idle connections are kept (see the module comment on connection reuse).
    pub fn new(tls: &GatewayTls, pool_size: usize) -> Result<Self, GatewayError> {
        Self::on_roots(tls, pool_size, inferq_client::Roots::system())
    }

    /// [`GatewayClient::new`] with `roots` as the default roots instead of the process's.
    pub(crate) fn on_roots(
        tls: &GatewayTls,
        pool_size: usize,
        roots: &inferq_client::Roots,
    ) -> Result<Self, GatewayError> {
        let tls_config = tls.client_config_on(roots)?;
        let build = |redirects: usize| {
            let builder = reqwest::Client::builder()
                .use_preconfigured_tls(tls_config.clone())
                .no_proxy()
                .redirect(stop_after(redirects))
                .pool_max_idle_per_host(pool_size.max(1).saturating_mul(2))
                .pool_idle_timeout(IDLE_TIMEOUT)
                .user_agent(USER_AGENT);
            builder.build().map_err(|e| {
                let mut text = error_chain(&e);
                if tls.is_configured() {
                    text.push_str(" (check the --tls-* files)");
                }
                GatewayError::Client(text)
            })
        };
        Ok(GatewayClient {
            http: build(MAX_REDIRECTS)?,
            onward: build(MAX_REDIRECTS - 1)?,
            direct: std::sync::Arc::new(Connections::new(
                pool_size.max(1).saturating_mul(2),
                USER_AGENT,
                std::sync::Arc::new(tls_config),
            )),
            body_limit: DEFAULT_BODY_LIMIT,
        })
    }

    /// Replaces the response body limit (bytes).
    pub fn with_body_limit(mut self, limit: usize) -> Self {
        self.body_limit = limit;
        self
    }

    pub fn body_limit(&self) -> usize {
        self.body_limit
    }

    /// POSTs `body` to `url` with `headers`, giving the whole exchange (connect, response head and
    /// body) at most `timeout`, and classifies the result. Dropping the returned future aborts the
    /// request (see the module comment).
    pub async fn send(
        &self,
        url: &str,
        headers: HeaderMap,
        body: Bytes,
        timeout: Duration,
    ) -> Attempt {
        match parse_target(url) {
            Ok(target) => {
                self.send_to(&target, || headers.clone(), body, timeout)
                    .await
            }
            Err(cause) => Attempt {
                outcome: request_failure(cause),
                elapsed: Duration::ZERO,
            },
        }
    }

    /// [`GatewayClient::send`] to a URL parsed beforehand with [`parse_target`] (a queue's
    /// default URL is parsed once): the per-request cost of parsing is skipped. `headers` makes
    /// the request's header set: it is called once, and a second time only when a gateway
    /// answers with a redirect or chooses HTTP/2 and the request goes through reqwest, so no copy
    /// is made for those rare cases.
    pub async fn send_to<H: Fn() -> HeaderMap>(
        &self,
        target: &Target,
        headers: H,
        body: Bytes,
        timeout: Duration,
    ) -> Attempt {
        let started = Instant::now();
        let outcome = self
            .exchange(target, &headers, body, started.checked_add(timeout))
            .await;
        Attempt {
            outcome,
            elapsed: started.elapsed(),
        }
    }

    /// Sends on the path `target` takes: inferq's own connections ([`direct`]) or reqwest
    /// ([`general`]). `deadline: None` means the timeout is too large to represent: no limit.
    async fn exchange<H: Fn() -> HeaderMap>(
        &self,
        target: &Target,
        headers: &H,
        body: Bytes,
        deadline: Option<Instant>,
    ) -> Outcome {
        match &target.direct {
            Some(direct) => {
                self.exchange_direct(target, direct, headers, body, deadline)
                    .await
            }
            None => {
                self.exchange_general(target, headers(), body, deadline)
                    .await
            }
        }
    }
}

/// Runs `future` until `deadline`; `None` if the deadline came first.
async fn within<F: std::future::Future>(deadline: Option<Instant>, future: F) -> Option<F::Output> {
    match deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, future).await.ok(),
        None => Some(future.await),
    }
}
