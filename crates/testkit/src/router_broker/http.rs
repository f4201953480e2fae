//! The emulated step behind a real HTTP listener: the router's paths on a free loopback port,
//! so one client (the `openai` SDK, raw HTTP) can be pointed at the router's step and at
//! `inferq batch-api` in turn and must see the same answers.
//!
//! Data enters as HTTP requests: `POST` to any path is the coordinator's inference handler
//! ([`RouterBroker::post`]); `GET`/`DELETE /v1/requests/{id}` and `GET /v1/models` are the
//! step's routes. It leaves as the step's answers, or, for a request the step leaves alone (no
//! mode header) or labels (`passthrough`), as the gateway's answer to the request sent on to it
//! (buffered, not streamed), with the passthrough labels applied and the quota slot released
//! when the gateway has answered.

use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use axum::routing::get;
use axum::Router;
use tokio::sync::oneshot;

use super::answer::{openai_error, Answer};
use super::step::{BrokerError, RouterBroker, Served};

/// A running HTTP front of the emulated step; stopped when dropped.
#[derive(Debug)]
pub struct BrokerServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
}

#[derive(Debug, Clone)]
struct Front {
    broker: RouterBroker,
    /// Where untouched and passthrough requests go (`http://host:port`), if anywhere.
    gateway: Option<String>,
    http: reqwest::Client,
}

impl BrokerServer {
    /// Serves `broker` on a free loopback port; `gateway` (a base URL) receives what the step
    /// lets through (without one, such requests are answered 502).
    pub async fn start(
        broker: RouterBroker,
        gateway: Option<String>,
    ) -> Result<BrokerServer, BrokerError> {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", crate::free_port()?)).await?;
        let addr = listener.local_addr()?;
        let front = Front {
            broker,
            gateway: gateway.map(|g| g.trim_end_matches('/').to_owned()),
            http: reqwest::Client::new(),
        };
        let app = Router::new()
            .route("/v1/models", get(models))
            .route("/v1/requests/{id}", get(fetch).delete(delete))
            .fallback(inference)
            .with_state(front);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(BrokerServer {
            addr,
            stop: Some(stop),
        })
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for BrokerServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn respond(answer: Answer) -> Response {
    let mut response = Response::new(Body::from(answer.body));
    *response.status_mut() = StatusCode::from_u16(answer.status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in answer.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            response.headers_mut().insert(name, value);
        }
    }
    response
}

fn tenant(front: &Front, headers: &HeaderMap) -> Option<String> {
    headers
        .get(front.broker.config().tenant_header.as_str())
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

async fn models(State(front): State<Front>) -> Response {
    respond(front.broker.models())
}

async fn fetch(State(front): State<Front>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    respond(
        front
            .broker
            .fetch(tenant(&front, &headers).as_deref(), &id)
            .await,
    )
}

async fn delete(
    State(front): State<Front>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    respond(
        front
            .broker
            .delete(tenant(&front, &headers).as_deref(), &id)
            .await,
    )
}

async fn inference(
    State(front): State<Front>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if method != Method::POST {
        return respond(openai_error(404, "invalid_request_error", "", "not found"));
    }
    let pairs: Vec<(String, String)> = headers
        .iter()
        .filter_map(|(n, v)| Some((n.as_str().to_owned(), v.to_str().ok()?.to_owned())))
        .collect();
    let borrowed: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_str()))
        .collect();
    match front.broker.post(uri.path(), &borrowed, &body).await {
        Served::Queued { answer, .. } | Served::Answered(answer) => respond(answer),
        Served::Untouched => forward(&front, &uri, headers, body).await,
        Served::Passthrough(labels) => {
            let mut headers = headers;
            for name in &labels.strip {
                headers.remove(name.as_str());
            }
            for (name, value) in &labels.stamp {
                if let (Ok(name), Ok(value)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    headers.insert(name, value);
                }
            }
            let response = forward(&front, &uri, headers, body).await;
            if let Some(slot) = labels.slot {
                let _ = slot.release().await;
            }
            response
        }
    }
}

/// Sends the request on to the gateway and relays its answer (buffered).
async fn forward(front: &Front, uri: &Uri, mut headers: HeaderMap, body: Bytes) -> Response {
    let Some(gateway) = &front.gateway else {
        return respond(openai_error(
            502,
            "api_error",
            "",
            "no gateway behind the step",
        ));
    };
    for hop in ["host", "content-length", "connection", "transfer-encoding"] {
        headers.remove(hop);
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let sent = front
        .http
        .post(format!("{gateway}{path}"))
        .headers(headers)
        .body(body)
        .send()
        .await;
    let reply = match sent {
        Ok(reply) => reply,
        Err(e) => return respond(openai_error(502, "api_error", "", &e.to_string())),
    };
    let status = reply.status().as_u16();
    let content_type = reply
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    match reply.bytes().await {
        Ok(bytes) => {
            let mut answer = Answer {
                status,
                headers: Vec::new(),
                body: bytes.to_vec(),
            };
            if let Some(content_type) = content_type {
                answer
                    .headers
                    .push(("content-type".to_owned(), content_type));
            }
            respond(answer)
        }
        Err(e) => respond(openai_error(502, "api_error", "", &e.to_string())),
    }
}
