//! Live requests: sent to the gateway of their route's queue as they came, the gateway's answer
//! streamed back as it comes (status, headers and body; a stream stays a stream).
//!
//! - No `X-AP-Mode`: untouched, as the router serves a request the step does not see.
//! - `X-AP-Mode: passthrough`: classified against the tenant's quota first, with the
//!   redis-quota gate's concurrency counter (`<prefix><attribute>:<tenant>`, default
//!   `quota:userid:<tenant>`; inferq-client's `quotaAcquire-1.lua`, given back by `quotaRelease-1.lua` when
//!   the answer ends or the client goes away), so the front door, the router's step and the
//!   processors' gates share one account. A tenant without a limit is `reserved`; a Redis
//!   failure fails open as `reserved`. The client's objective and fairness headers are removed,
//!   and the tier's objective for the classification and `fairness id = tenant` are stamped.

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use futures::StreamExt;

use super::inbound::Passthrough;
use crate::state::App;

/// Headers that belong to one hop (and `host`), never copied across the proxy.
const HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
    "content-length",
];

/// A slot of the tenant's quota, given back when dropped (the answer's body ended or was
/// dropped with its client).
struct Held {
    app: App,
    key: String,
}

impl Drop for Held {
    fn drop(&mut self) {
        let (app, key) = (self.app.clone(), std::mem::take(&mut self.key));
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let window = app.front.settings.broker.quota.window_seconds.to_string();
                let script = &inferq_client::scripts::SCRIPTS.quota_release;
                let mut con = app.redis.clone();
                let cmd = script.cmd(&[key.as_str()], &[window.as_str()]);
                if let Err(e) = script.run(&mut con, &cmd).await {
                    tracing::warn!(error = %e, counter = %key, "front door: cannot give back a quota slot (it expires with its window)");
                }
            });
        }
    }
}

/// The quota classification of `tenant`: overflow or not, and the slot to give back.
async fn classify(app: &App, tenant: &str) -> (bool, Option<Held>) {
    let quota = &app.front.settings.broker.quota;
    let Some(limit) = quota.limits.get(tenant).copied().filter(|l| *l > 0) else {
        return (false, None);
    };
    let key = format!("{}{}:{tenant}", quota.prefix, quota.attribute);
    let script = &inferq_client::scripts::SCRIPTS.quota_acquire;
    let mut con = app.redis.clone();
    let cmd = script.cmd(
        &[key.as_str()],
        &[limit.to_string(), quota.window_seconds.to_string()],
    );
    match script.run(&mut con, &cmd).await {
        Ok(redis::Value::Int(1)) => (
            false,
            Some(Held {
                app: app.clone(),
                key,
            }),
        ),
        Ok(_) => (true, None),
        Err(e) => {
            tracing::warn!(error = %e, %tenant, "front door: quota classification failed open (reserved)");
            (false, None)
        }
    }
}

/// Sends the request to the gateway and streams its answer back; `labels` is `Some` for
/// `X-AP-Mode: passthrough` (classify and stamp), `None` for a request without the header.
pub async fn forward(
    app: &App,
    path_and_query: &str,
    model: &str,
    mut headers: HeaderMap,
    body: Bytes,
    labels: Option<&Passthrough>,
) -> Response {
    let broker = &app.front.settings.broker;
    let tenant = labels.map(|l| l.tenant.as_str()).unwrap_or_default();
    let (queue, tier) = broker.route(model, tenant);
    let Some(gateway) = app.front.settings.gateway(queue) else {
        return super::answer::error(
            503,
            "api_error",
            "NO_GATEWAY",
            "no gateway is configured for live requests (the queue has no igw_base_url)",
        );
    };
    for name in HOP {
        headers.remove(*name);
    }
    if !app.keys.is_empty() {
        // The caller's inferq API key is not the gateway's.
        headers.remove(axum::http::header::AUTHORIZATION);
    }
    let mut held = None;
    if let Some(l) = labels {
        headers.remove(broker.mode_header.as_str());
        headers.remove(broker.objective_header.as_str());
        headers.remove(broker.fairness_header.as_str());
        let (overflow, slot) = classify(app, &l.tenant).await;
        held = slot;
        let stamp = |h: &mut HeaderMap, name: &str, value: &str| {
            if let (Ok(n), Ok(v)) = (
                HeaderName::from_bytes(name.as_bytes()),
                HeaderValue::from_str(value),
            ) {
                h.insert(n, v);
            }
        };
        if let Some(objective) = broker.objective(tier, overflow) {
            stamp(&mut headers, &broker.objective_header, objective);
        }
        stamp(&mut headers, &broker.fairness_header, &l.tenant);
    }
    let url = format!("{}{path_and_query}", gateway.trim_end_matches('/'));
    let sent = app
        .front
        .http
        .request(Method::POST, &url)
        .headers(headers)
        .body(body)
        .send()
        .await;
    let answer = match sent {
        Ok(a) => a,
        Err(e) => {
            tracing::warn!(error = %e, %url, "front door: the gateway did not answer a live request");
            return super::answer::error(
                502,
                "api_error",
                "GATEWAY_UNREACHABLE",
                &format!("the gateway did not answer: {e}"),
            );
        }
    };
    let status = StatusCode::from_u16(answer.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut out_headers = HeaderMap::new();
    for (name, value) in answer.headers() {
        if !HOP.contains(&name.as_str()) {
            out_headers.append(name.clone(), value.clone());
        }
    }
    let stream = answer.bytes_stream().map(move |chunk| {
        // The slot is held as long as the body is being sent.
        let _ = &held;
        chunk.map_err(std::io::Error::other)
    });
    let mut r = Response::new(Body::from_stream(stream));
    *r.status_mut() = status;
    *r.headers_mut() = out_headers;
    r
}
