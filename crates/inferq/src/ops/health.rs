//! The health server (Go semantics): `GET /healthz` is always 200 `{"status":"ok"}`; `/readyz`
//! is 503 until the processor has started and after a shutdown signal, and otherwise PINGs Redis
//! (3 s budget) so it tells the truth when Redis is unreachable; before start, it names what
//! start-up is stuck on (an unreachable Redis, a refused TLS handshake). Unlike Go, an answering
//! Redis is not enough: while Redis refuses a queue's polls (say `NOPERM` for a user missing a
//! command, or `READONLY` from a replica) or the results it writes to its configured result
//! list, `/readyz` is 503 and names the queue and the refusal.
//! Also the metrics server, which answers every scrape with the page and `Content-Type` Go's
//! promhttp would ([`super::exposition`], [`super::accept`]), gzipped when asked
//! ([`super::encoding`]).
//!
//! Both listeners bound their connections (header-read and idle timeouts, a bound on open
//! connections: see [`inferq_http`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use axum::Router;
use tokio_util::sync::CancellationToken;

use inferq_http::ConnLimits;

use super::encoding::Coding;
use super::metrics::Metrics;

/// How long open calls may finish after a stop (a probe or a scrape takes milliseconds).
const DRAIN: Duration = Duration::from_secs(5);

/// Whether the processor says it is ready, plus what it checks before saying so.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    started: Arc<AtomicBool>,
    con: Arc<OnceLock<crate::queue::traced::Con>>,
    /// The client `con` was made with, to ask a server that drops new connections why.
    client: Arc<OnceLock<redis::Client>>,
    /// Why the processor could not start yet (e.g. Redis refuses the TLS handshake), shown by
    /// `/readyz` while it is not started.
    problem: Arc<Mutex<Option<String>>>,
    /// What Redis refuses or does not take (`the polls of queue "q"`) and why; `/readyz` is 503
    /// while there is any.
    troubles: Arc<Mutex<BTreeMap<String, Trouble>>>,
}

/// Why Redis does not serve one of the processor's needs, though it answers PING.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trouble {
    /// Redis refuses it (`NOPERM`, `READONLY`, `OOM`): the reason it gave.
    Refused(String),
    /// Its writes fail without a refusal (they time out while writes are paused, say).
    Stalled(String),
}

impl Readiness {
    pub fn new() -> Readiness {
        Readiness::default()
    }

    /// The connection `/readyz` PINGs, once there is one, and the client it was made with.
    pub fn set_connection(&self, con: impl Into<crate::queue::traced::Con>, client: redis::Client) {
        let _ = self.con.set(con.into());
        let _ = self.client.set(client);
    }

    /// `e`, a failed Redis call's error, followed by why Redis refuses new connections when it
    /// says so (`maxclients` reached: see [`inferq_client::connect::refusal`]); a reconnecting
    /// client sees only a reset or a broken pipe.
    pub async fn explain(&self, e: &redis::RedisError) -> String {
        match self.client.get() {
            Some(client) => inferq_client::connect::explained(client, e).await,
            None => e.to_string(),
        }
    }

    /// Records why start-up is stuck (`None` once it is not).
    pub fn set_problem(&self, problem: Option<String>) {
        *self.problem.lock().unwrap_or_else(PoisonError::into_inner) = problem;
    }

    /// Records what keeps Redis from serving `what` (`the polls of queue "q"`), or (`None`)
    /// that it serves it again.
    pub fn note(&self, what: &str, trouble: Option<Trouble>) {
        let mut troubles = self.troubles.lock().unwrap_or_else(PoisonError::into_inner);
        match trouble {
            Some(trouble) => {
                troubles.insert(what.to_owned(), trouble);
            }
            None => {
                troubles.remove(what);
            }
        }
    }

    pub fn set(&self, ready: bool) {
        self.started.store(ready, Ordering::SeqCst);
    }

    /// `Ok` when started, Redis answers PING within 3 s, refuses no queue's polls or results, and
    /// takes every queue's results.
    pub async fn check(&self) -> Result<(), String> {
        if !self.started.load(Ordering::SeqCst) {
            let problem = self
                .problem
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            return Err(problem.unwrap_or_default());
        }
        let Some(con) = self.con.get() else {
            return Err("redis: not connected yet".to_owned());
        };
        let mut con = con.clone();
        let cmd = redis::cmd("PING");
        let ping = cmd.query_async::<String>(&mut con);
        match tokio::time::timeout(Duration::from_secs(3), ping).await {
            Ok(Ok(_)) => {
                let troubles = self.troubles.lock().unwrap_or_else(PoisonError::into_inner);
                // A refusal is named first: it is the one an operator can act on.
                let refused = troubles.iter().find_map(|(what, t)| match t {
                    Trouble::Refused(reason) => Some(format!("redis refuses {what}: {reason}")),
                    Trouble::Stalled(_) => None,
                });
                let stalled = || {
                    troubles.iter().find_map(|(what, t)| match t {
                        Trouble::Stalled(reason) => {
                            Some(format!("redis does not take {what}: {reason}"))
                        }
                        Trouble::Refused(_) => None,
                    })
                };
                match refused.or_else(stalled) {
                    Some(text) => Err(text),
                    None => Ok(()),
                }
            }
            Ok(Err(e)) => Err(format!("redis: {}", self.explain(&e).await)),
            Err(_) => Err("redis: no answer to PING within 3s".to_owned()),
        }
    }
}

fn json(status: StatusCode, body: serde_json::Value) -> Response {
    let mut text = body.to_string();
    text.push('\n');
    (status, [(header::CONTENT_TYPE, "application/json")], text).into_response()
}

/// Binds `addr` and serves `/healthz` and `/readyz` until `stop`.
pub async fn serve_health(
    addr: SocketAddr,
    readiness: Readiness,
    limits: ConnLimits,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = super::listen::listen(addr).await?;
    let app = Router::new()
        .route(
            "/healthz",
            any(|| async { json(StatusCode::OK, serde_json::json!({"status": "ok"})) }),
        )
        .route(
            "/readyz",
            any(move || {
                let readiness = readiness.clone();
                async move {
                    match readiness.check().await {
                        Ok(()) => json(StatusCode::OK, serde_json::json!({"status": "ready"})),
                        Err(e) if e.is_empty() => json(
                            StatusCode::SERVICE_UNAVAILABLE,
                            serde_json::json!({"status": "not ready"}),
                        ),
                        Err(e) => json(
                            StatusCode::SERVICE_UNAVAILABLE,
                            serde_json::json!({"status": "not ready", "error": e}),
                        ),
                    }
                }
            }),
        );
    Ok(tokio::spawn(inferq_http::serve(
        listener, app, limits, stop, DRAIN,
    )))
}

/// Binds `addr` and serves `/metrics` until `stop`.
pub async fn serve_metrics(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    limits: ConnLimits,
    stop: CancellationToken,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let listener = super::listen::listen(addr).await?;
    let app = Router::new().route(
        "/metrics",
        any(move |headers: HeaderMap| {
            let metrics = metrics.clone();
            async move {
                // Always the 0.0.4 text, as Go's promhttp without OpenMetrics serves it, and
                // gzipped when the scraper asks for it, as Go's does.
                let header_of = |name| headers.get(name).and_then(|v| v.to_str().ok());
                let content_type = super::accept::content_type(header_of(header::ACCEPT));
                let coding = super::encoding::negotiate(header_of(header::ACCEPT_ENCODING));
                let page = match metrics.encode() {
                    Ok(page) => page,
                    Err(e) => {
                        return (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
                    }
                };
                match coding {
                    Coding::Identity => {
                        ([(header::CONTENT_TYPE, content_type)], page).into_response()
                    }
                    Coding::Gzip => match super::encoding::gzip(page.as_bytes()) {
                        Ok(packed) => (
                            [
                                (header::CONTENT_TYPE, content_type),
                                (header::CONTENT_ENCODING, "gzip".to_owned()),
                            ],
                            packed,
                        )
                            .into_response(),
                        Err(e) => {
                            (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response()
                        }
                    },
                }
            }
        }),
    );
    Ok(tokio::spawn(inferq_http::serve(
        listener, app, limits, stop, DRAIN,
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::RedisServer;

    /// With PING answering, a refusal or a stall of a queue's results keeps the processor not
    /// ready, naming what Redis does not take; clearing it makes it ready again.
    #[tokio::test]
    async fn refusals_and_stalls_keep_readyz_honest_while_ping_answers() {
        let server = RedisServer::start().expect("redis-server");
        let client = redis::Client::open(server.url()).expect("client");
        let con = inferq_client::connect::manager(&client)
            .await
            .expect("connect");
        let ready = Readiness::new();
        ready.set_connection(con, client);
        ready.set(true);
        assert_eq!(ready.check().await, Ok(()));
        let what = "the results of queue \"q\"";
        ready.note(what, Some(Trouble::Stalled("timed out".to_owned())));
        assert_eq!(
            ready.check().await,
            Err("redis does not take the results of queue \"q\": timed out".to_owned())
        );
        ready.note(what, Some(Trouble::Refused("NOPERM".to_owned())));
        assert_eq!(
            ready.check().await,
            Err("redis refuses the results of queue \"q\": NOPERM".to_owned())
        );
        ready.note(what, None);
        assert_eq!(ready.check().await, Ok(()));
    }
}
