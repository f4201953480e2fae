//! An HTTP/1.1 server whose connections are bounded: every HTTP listener of inferq (the Batch
//! API and front door, `inferq run`'s health and metrics) serves through [`serve`].
//!
//! - **Header-read timeout:** a connection that began a request head (sent its first byte) and
//!   has not sent the whole head within [`ConnLimits::header_read_timeout`] is closed; so is a
//!   new connection that sends nothing for as long.
//! - **Idle timeout:** a keep-alive connection with no request in progress is closed after
//!   [`ConnLimits::idle_timeout`]. The default is longer than the idle timeouts of the load
//!   balancers that sit in front (AWS ALB 60 s, GCP 600 s), so a balancer never reuses a
//!   connection inferq is closing.
//! - **Request bodies:** a body that stalls, no byte for the header-read timeout, fails
//!   (a slow-POST client cannot hold a handler).
//! - **Open connections:** at most [`ConnLimits::max_connections`]; past it a connection is
//!   answered `503` with OpenAI's error shape and `Connection: close`, and closed.
//! - A request in progress is never idle: a client waiting on `wait` mode keeps its connection
//!   for the whole wait.
//!
//! hyper's own `header_read_timeout` is not used: its clock also runs while a keep-alive
//! connection is idle, so one value cannot be both a short head limit and an idle limit longer
//! than a load balancer's. Instead each connection's [`Activity`] is kept by its I/O (a byte
//! read while idle starts a head) and its service (a request in progress, until its response
//! body is done), and a watchdog closes the connection when its state's limit passes.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

/// The default header-read timeout.
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The default keep-alive idle timeout: longer than GCP's load balancers' 600 s (and AWS ALB's
/// 60 s), so the balancer, not inferq, closes an idle connection first.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(620);

/// Refusals of connections past the bound written at once; more are closed without one.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refusal may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

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

/// What a connection is doing, as its watchdog sees it.
const IDLE: u8 = 0;
const HEAD: u8 = 1;
const BUSY: u8 = 2;

/// One connection's state: idle, reading a head, or serving requests.
#[derive(Debug)]
struct Activity {
    base: Instant,
    state: AtomicU8,
    /// Milliseconds after `base` the state began.
    since_ms: AtomicU64,
    in_flight: AtomicUsize,
    changed: Notify,
}

impl Activity {
    fn new() -> Activity {
        Activity {
            base: Instant::now(),
            // A new connection is reading its first head: it has the header-read timeout.
            state: AtomicU8::new(HEAD),
            since_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived: on an idle connection, a head has begun.
    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .state
                .compare_exchange(IDLE, HEAD, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.since_ms.store(self.now_ms(), Ordering::Release);
            self.changed.notify_one();
        }
    }

    /// A whole head arrived: a request is in progress.
    fn start(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.state.store(BUSY, Ordering::Release);
        self.changed.notify_one();
    }

    /// A request's response is done (or dropped).
    fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.since_ms.store(self.now_ms(), Ordering::Release);
            self.state.store(IDLE, Ordering::Release);
            self.changed.notify_one();
        }
    }

    /// Resolves when the connection has been in one state past its limit, with why.
    async fn expired(&self, limits: &ConnLimits) -> &'static str {
        loop {
            let (limit, why) = match self.state.load(Ordering::Acquire) {
                HEAD => (limits.header_read_timeout, "no whole request head in time"),
                IDLE => (limits.idle_timeout, "idle"),
                _ => {
                    self.changed.notified().await;
                    continue;
                }
            };
            let since = Duration::from_millis(self.since_ms.load(Ordering::Acquire));
            let deadline = self.base + since + limit;
            if Instant::now() >= deadline {
                return why;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.changed.notified() => {}
            }
        }
    }
}

/// A TCP stream that tells its [`Activity`] when bytes arrive.
struct Watched {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Watched {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

/// Ends its request on the [`Activity`] when dropped (the response body done, or the request
/// abandoned).
struct InProgress(Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A response body that keeps its request in progress until it is done.
struct Guarded {
    inner: Body,
    _request: InProgress,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails when no byte arrives for `gap`.
struct Stalling {
    inner: Incoming,
    gap: Duration,
    /// Armed while the reader waits for bytes.
    timer: Option<Pin<Box<Sleep>>>,
}

/// The error of a request body that stalled.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled: no byte for {0:?}")]
pub struct BodyStalled(Duration);

impl hyper::body::Body for Stalling {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let gap = self.gap;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(gap))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The per-connection service: the router, with the request marked in progress.
#[derive(Clone)]
struct Service {
    router: Router,
    activity: Arc<Activity>,
    gap: Duration,
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Service {
    type Response = axum::http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        self.activity.start();
        let request = InProgress(self.activity.clone());
        let gap = self.gap;
        let req = req.map(|inner| {
            Body::new(Stalling {
                inner,
                gap,
                timer: None,
            })
        });
        let svc = hyper_util::service::TowerToHyperService::new(self.router.clone());
        Box::pin(async move {
            let response = match hyper::service::Service::call(&svc, req).await {
                Ok(response) => response,
                Err(never) => match never {},
            };
            Ok(response.map(|inner| {
                Body::new(Guarded {
                    inner,
                    _request: request,
                })
            }))
        })
    }
}

/// The answer to a connection past the bound (OpenAI's error shape).
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Connection: close\r\nRetry-After: 1\r\nContent-Length: 134\r\n\r\n\
{\"error\":{\"message\":\"Too many open connections: try again shortly.\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}";

/// Serves `router` on `listener` until `stop`, one bounded HTTP/1.1 connection per task (see
/// the module comment), then lets open calls finish for up to `drain`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    stop: CancellationToken,
    drain: Duration,
) {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog keeps the head and idle limits (see the module comment).
    builder.timer(hyper_util::rt::TokioTimer::new());
    builder.header_read_timeout(None);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => break,
            a = listener.accept() => a,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors, say: give the ones in use a moment to close.
                tracing::warn!(error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(stream, &refusals, limits.max_connections);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity::new());
        let io = Watched {
            inner: stream,
            activity: activity.clone(),
        };
        let service = Service {
            router: router.clone(),
            activity: activity.clone(),
            gap: limits.header_read_timeout,
        };
        let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), service);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            tokio::select! {
                ended = conn => {
                    if let Err(e) = ended {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                }
                why = activity.expired(&limits) => {
                    tracing::debug!(why, "connection closed");
                }
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::info!("calls still open after the drain: dropped");
    }
}

/// Answers a connection past the bound with a 503 and closes it (without an answer when too
/// many refusals are being written already).
fn refuse(mut stream: TcpStream, refusals: &Arc<Semaphore>, max: usize) {
    tracing::warn!(
        max_connections = max,
        "refusing a connection: the listener holds as many as it may"
    );
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _ = tokio::time::timeout(REFUSAL_WRITE, async {
            let _ = stream.write_all(REFUSAL).await;
            let _ = stream.shutdown().await;
        })
        .await;
        drop(permit);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_refusal_is_well_formed() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "too_many_connections");
    }

    #[test]
    fn the_default_bound_follows_the_file_limit() {
        assert_eq!(ConnLimits::default_max_connections(Some(1024), 64), 864);
        assert_eq!(ConnLimits::default_max_connections(Some(10), 64), 16);
        assert_eq!(ConnLimits::default_max_connections(None, 64), 1 << 20);
    }
}
