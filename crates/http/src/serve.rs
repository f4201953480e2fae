//! The accept loop: each connection a listener hands over is taken while the bound of open
//! connections allows (else answered `503` and closed), served HTTP/1.1 on its own task with
//! its requests marked in progress, and closed by its watchdog when its head or idle limit
//! passes. When `stop` is cancelled the loop stops accepting and open calls get `drain`.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::serve::{Listener, ListenerExt};
use axum::Router;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::activity::{Activity, Watched};
use crate::bodies::{Guarded, InProgress, Stalling};
use crate::ConnLimits;

/// Refusals of connections past the bound written at once; more are closed without one.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refusal may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

/// The answer to a connection past the bound (OpenAI's error shape).
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
Connection: close\r\nRetry-After: 1\r\nContent-Length: 134\r\n\r\n\
{\"error\":{\"message\":\"Too many open connections: try again shortly.\",\"type\":\"server_error\",\"param\":null,\"code\":\"too_many_connections\"}}";

/// A connection the server can serve: a byte stream that may hand each of its requests
/// something of the connection (the simulator's handle that resets it) as request extensions.
pub trait Connection: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Adds to `extensions`, copied into every request on this connection, what its handlers
    /// may want of the connection. Nothing by default.
    fn tag(&self, _extensions: &mut http::Extensions) {}
}

impl Connection for TcpStream {}

/// The per-connection service: the router, with the request marked in progress.
#[derive(Clone)]
struct Service {
    router: Router,
    activity: Arc<Activity>,
    gap: Duration,
    tags: http::Extensions,
}

impl hyper::service::Service<axum::http::Request<Incoming>> for Service {
    type Response = axum::http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, req: axum::http::Request<Incoming>) -> Self::Future {
        self.activity.start();
        let request = InProgress(self.activity.clone());
        let gap = self.gap;
        let mut req = req.map(|inner| Body::new(Stalling::new(inner, gap)));
        req.extensions_mut().extend(self.tags.clone());
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

/// Serves `router` on `listener` until `stop`, one bounded HTTP/1.1 connection per task (see
/// the crate's comment), with `TCP_NODELAY` on every connection, then lets open calls finish
/// for up to `drain`.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnLimits,
    stop: CancellationToken,
    drain: Duration,
) {
    // Small answers on kept-alive connections must not wait for Nagle.
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("could not set TCP_NODELAY: {e}");
        }
    });
    serve_from(listener, router, limits, stop, drain).await;
}

/// [`serve`] over any listener whose connections are a [`Connection`] (axum's `Listener`
/// retries failed accepts itself, backing off when descriptors run out).
pub async fn serve_from<L>(
    mut listener: L,
    router: Router,
    limits: ConnLimits,
    stop: CancellationToken,
    drain: Duration,
) where
    L: Listener,
    L::Io: Connection,
{
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The watchdog keeps the head and idle limits (see the crate's comment).
    builder.timer(hyper_util::rt::TokioTimer::new());
    builder.header_read_timeout(None);
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            refuse(stream, &refusals, limits.max_connections);
            continue;
        };
        let activity = Arc::new(Activity::new());
        let mut tags = http::Extensions::new();
        stream.tag(&mut tags);
        let io = Watched {
            inner: stream,
            activity: activity.clone(),
        };
        let service = Service {
            router: router.clone(),
            activity: activity.clone(),
            gap: limits.header_read_timeout,
            tags,
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
fn refuse<S>(mut stream: S, refusals: &Arc<Semaphore>, max: usize)
where
    S: AsyncWrite + Unpin + Send + 'static,
{
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
}
