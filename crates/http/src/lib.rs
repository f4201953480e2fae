//! Bounded HTTP/1.1 serving: every HTTP listener of inferq (the Batch API and front door,
//! `inferq run`'s health and metrics) and of its simulator gateway serves through [`serve`] or
//! [`serve_from`], so no client can hold a connection for good.
//!
//! Connections enter from a listener (a `TcpListener`, or any [`axum::serve::Listener`]: the
//! simulator's own, whose connections a handler can reset, plain or TLS); requests leave to an
//! axum `Router`; a connection leaves when its client closes it, when a bound below is passed,
//! or when the server stops (open calls then get a drain).
//!
//! - **Header-read timeout:** a connection that began a request head (sent its first byte) and
//!   has not sent the whole head within [`ConnLimits::header_read_timeout`] is closed; so is a
//!   new connection that sends nothing for as long.
//! - **Idle timeout:** a keep-alive connection with no request in progress is closed after
//!   [`ConnLimits::idle_timeout`]. The default is longer than the idle timeouts of the load
//!   balancers that sit in front (AWS ALB 60 s, GCP 600 s), so a balancer never reuses a
//!   connection inferq is closing.
//! - **Request bodies:** a body that stalls, no byte for the header-read timeout, fails (a
//!   slow-POST client cannot hold a handler).
//! - **Open connections:** at most [`ConnLimits::max_connections`]; past it a connection is
//!   answered `503` with OpenAI's error shape and `Connection: close`, and closed.
//! - A request in progress is never idle: a client waiting on `wait` mode, or reading a long
//!   stream, keeps its connection for the whole wait.
//!
//! Written here rather than taken from hyper: hyper's own `header_read_timeout` also runs while
//! a keep-alive connection is idle, so one value cannot be both a short head limit and an idle
//! limit longer than a load balancer's, and neither hyper nor axum bounds open connections.
//! Instead each connection's activity is kept by its I/O (a byte read while idle starts a head)
//! and its service (a request in progress, until its response body is done), and a watchdog
//! closes the connection when its state's limit passes.
//!
//! - `activity`: one connection's state and its watchdog, and the stream that feeds it.
//! - `bodies`: the request body that fails when it stalls, the response body that keeps its
//!   request in progress.
//! - `serve`: the accept loop, the per-connection service, the refusal past the bound.
//! - [`fd_limit`]: the open-file limit the default bound of connections derives from.

mod activity;
mod bodies;
pub mod fd_limit;
mod serve;

use std::time::Duration;

pub use bodies::BodyStalled;
pub use serve::{serve, serve_from, Connection};

/// The default header-read timeout.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The default keep-alive idle timeout: longer than GCP's load balancers' 600 s (and AWS ALB's
/// 60 s), so the balancer, not inferq, closes an idle connection first.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(620);

/// The bounds of one listener's connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
}

impl ConnLimits {
    /// The default bound of open connections for a process whose open-file limit is `soft`
    /// (`None`: unlimited) and which keeps `reserve` descriptors for everything else: nine
    /// tenths of what is left, at least 16 (a listener that takes no connection is no use).
    pub fn default_max_connections(soft: Option<u64>, reserve: u64) -> usize {
        let Some(soft) = soft else {
            return 1 << 20;
        };
        let left = soft.saturating_sub(reserve) / 10 * 9;
        usize::try_from(left).unwrap_or(usize::MAX).max(16)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_bound_follows_the_file_limit() {
        assert_eq!(ConnLimits::default_max_connections(Some(1024), 64), 864);
        assert_eq!(ConnLimits::default_max_connections(Some(10), 64), 16);
        assert_eq!(ConnLimits::default_max_connections(None, 64), 1 << 20);
    }
}
