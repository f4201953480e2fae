//! The front door's HTTP handlers, as the router's step serves them: the POST endpoints (live,
//! passthrough, enqueue, wait and a wait's stream), `GET` and `DELETE /v1/requests/{id}` and
//! `GET /v1/models`. Every check happens before anything is written; a wait holds a
//! [`super::Slot`] while open, and a wait whose client goes away cancels the request it made.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferq_client::wire::ResultMessage;
use serde_json::{json, Value};
use tokio::time::Instant;

use super::answer;
use super::broker::{self, State as Stand};
use super::inbound::{self, Endpoint, Inbound, Queued};
use super::keys;
use super::waiters::RECHECK;
use crate::error::ApiError;
use crate::state::App;

/// How often a waiting stream sends a keepalive comment.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// Longest `?wait=` of a long poll, in seconds.
const MAX_POLL_SECS: u64 = 600;

pub async fn chat(app: State<App>, uri: Uri, h: HeaderMap, body: Bytes) -> Response {
    post(app.0, Endpoint::Chat, uri, h, body).await
}

pub async fn completions(app: State<App>, uri: Uri, h: HeaderMap, body: Bytes) -> Response {
    post(app.0, Endpoint::Completions, uri, h, body).await
}

pub async fn generate(app: State<App>, uri: Uri, h: HeaderMap, body: Bytes) -> Response {
    post(app.0, Endpoint::Generate, uri, h, body).await
}

pub async fn embeddings(app: State<App>, uri: Uri, h: HeaderMap, body: Bytes) -> Response {
    post(app.0, Endpoint::Embeddings, uri, h, body).await
}

/// The API key's tenant when keys are configured (401 without a good key), else `None`.
fn keyed(app: &App, headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    if app.keys.is_empty() {
        return Ok(None);
    }
    app.keys.tenant(headers).map(Some)
}

#[derive(serde::Deserialize)]
struct ModelOnly {
    #[serde(default)]
    model: Option<Value>,
}

async fn post(app: App, endpoint: Endpoint, uri: Uri, headers: HeaderMap, body: Bytes) -> Response {
    let keyed = match keyed(&app, &headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let inbound = match inbound::parse(
        &app.front.settings.broker,
        endpoint,
        &headers,
        &body,
        keyed.as_deref(),
    ) {
        Ok(i) => i,
        Err(e) => return e.into_response(),
    };
    // The live futures are boxed, and a queued request lets go of the request's headers and
    // bytes before it waits: what a held wait keeps is its own small state, not the largest
    // of every path's (see `queued`).
    match inbound {
        Inbound::Live => {
            app.metrics.front_request("live");
            let model = serde_json::from_slice::<ModelOnly>(&body)
                .ok()
                .and_then(|m| m.model)
                .and_then(|m| m.as_str().map(str::to_owned))
                .unwrap_or_default();
            let path = path_of(&uri, endpoint);
            Box::pin(super::passthrough::forward(
                &app, &path, &model, headers, body, None,
            ))
            .await
        }
        Inbound::Passthrough(p) => {
            app.metrics.front_request("passthrough");
            let model = p.model.clone();
            let path = path_of(&uri, endpoint);
            Box::pin(super::passthrough::forward(
                &app,
                &path,
                &model,
                headers,
                body,
                Some(&p),
            ))
            .await
        }
        Inbound::Queued(q) => {
            drop((uri, headers, body));
            let id = q.id.clone();
            let r = queued(app, *q)
                .await
                .unwrap_or_else(IntoResponse::into_response);
            answer::with_id(r, &id)
        }
    }
}

/// The path and query a live request is sent on with.
fn path_of(uri: &Uri, endpoint: Endpoint) -> String {
    uri.path_and_query()
        .map_or(endpoint.path(), |p| p.as_str())
        .to_owned()
}

/// What a held wait keeps of its request once submitted.
struct Held {
    tenant: String,
    id: String,
    chosen: bool,
}

/// A queued request: enqueued and answered at once, or submitted and held until its answer.
/// The submit (the largest future on the way) is boxed and gone before the hold, and the body
/// is dropped with it: a held wait keeps its cancel guard (which holds [`Held`]), its slot
/// and its mailbox's registration, in a future of about 3 KiB beside the connection's own buffers
/// (`tests::a_held_wait_keeps_a_small_future`).
async fn queued(app: App, q: Queued) -> Result<Response, ApiError> {
    if q.enqueue {
        app.metrics.front_request("enqueue");
        Box::pin(broker::submit(&app, &q)).await?;
        return Ok(answer::pending(&q.id));
    }
    let Some(slot) = app.front.slot() else {
        app.metrics.front_busy.inc();
        return Ok(answer::busy());
    };
    app.metrics
        .front_request(if q.stream { "stream" } else { "wait" });
    let submitted = Box::pin(broker::submit(&app, &q)).await?;
    let (stream_it, timeout_secs) = (q.stream, q.timeout_secs);
    let mut guard = CancelOnDrop {
        app: app.clone(),
        held: Held {
            tenant: q.tenant,
            id: q.id,
            chosen: q.chosen,
        },
        armed: submitted.created,
    };
    // The hold runs to the deadline, or to the wait cap when that is shorter.
    let to_deadline = Duration::from_secs(u64::try_from(timeout_secs).unwrap_or(0));
    let cap = u64::try_from(app.front.settings.broker.wait_cap_seconds).unwrap_or(0);
    let capped = cap > 0 && Duration::from_secs(cap) < to_deadline;
    let hold = if capped {
        Duration::from_secs(cap)
    } else {
        to_deadline
    };
    let until = Instant::now() + hold;
    if stream_it {
        return Ok(stream(app, guard, slot, until));
    }
    let q = &guard.held;
    let got = wait_for(&app, &q.tenant, &q.id, until).await;
    guard.armed = false;
    drop(slot);
    Ok(match got? {
        Some(r) => {
            broker::delivered(&app, &q.tenant, &q.id, !q.chosen).await;
            answer::result(&r)
        }
        None if capped => answer::pending(&q.id),
        None => answer::timed_out(),
    })
}

/// Waits until the mailbox of `id` holds a result (then that result) or `until` passes
/// (then `None`, after one last read).
async fn wait_for(
    app: &App,
    tenant: &str,
    id: &str,
    until: Instant,
) -> Result<Option<ResultMessage>, ApiError> {
    let mailbox = keys::mailbox(tenant, id);
    let registration = app.front.waiters.register(&mailbox);
    loop {
        let notified = registration.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        if let Stand::Ready(r) = broker::lookup(app, tenant, id).await? {
            return Ok(Some(r));
        }
        let now = Instant::now();
        if now >= until {
            return Ok(None);
        }
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(until.min(now + RECHECK)) => {}
        }
    }
}

/// Cancels the request it names when dropped armed: a wait whose client went away (the
/// handler's future, or the stream's task, is dropped) takes its request with it, queued or in
/// flight.
struct CancelOnDrop {
    app: App,
    held: Held,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed || self.app.front.is_stopping() {
            return;
        }
        let (app, tenant, id) = (
            self.app.clone(),
            self.held.tenant.clone(),
            self.held.id.clone(),
        );
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                match broker::cancel(&app, &tenant, &id).await {
                    Ok(true) => {
                        app.metrics.front_disconnect_cancels.inc();
                        tracing::info!(request = %id, "client went away: request cancelled");
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(request = %id, error = %e.message, "client went away, but its request could not be cancelled"),
                }
            });
        }
    }
}

/// A streaming wait: keepalive comments until the result comes, then it as chunks and
/// `[DONE]`. A client that goes away closes the channel, and the request is cancelled.
fn stream(app: App, guard: CancelOnDrop, slot: super::Slot, until: Instant) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    tokio::spawn(async move {
        let mut guard = guard;
        let _slot = slot;
        let q = &guard.held;
        let waiting = wait_for(&app, &q.tenant, &q.id, until);
        tokio::pin!(waiting);
        let mut tick = tokio::time::interval(KEEPALIVE);
        let got = loop {
            tokio::select! {
                w = &mut waiting => break w,
                _ = tx.closed() => return,
                _ = tick.tick() => {
                    if tx.send(Bytes::from_static(b": waiting\n\n")).await.is_err() {
                        return;
                    }
                }
            }
        };
        guard.armed = false;
        let result = got.ok().flatten();
        let events = answer::stream_events(result.as_ref());
        let mut sent = true;
        for e in events {
            if tx.send(Bytes::from(e)).await.is_err() {
                sent = false;
                break;
            }
        }
        if sent && result.is_some() {
            broker::delivered(&app, &q.tenant, &q.id, !q.chosen).await;
        }
    });
    let body =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>)));
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(
        axum::http::header::CACHE_CONTROL,
        HeaderValue::from_static("no-cache"),
    );
    r
}

#[derive(Debug, serde::Deserialize)]
pub struct PollQuery {
    wait: Option<String>,
}

/// The tenant of a `/v1/requests` call.
fn tenant(app: &App, headers: &HeaderMap) -> Result<String, ApiError> {
    let keyed = keyed(app, headers)?;
    inbound::tenant(&app.front.settings.broker, headers, keyed.as_deref())
}

/// `GET /v1/requests/{id}`, with `?wait=SECONDS` to long-poll while it is pending.
pub async fn retrieve(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<PollQuery>,
    headers: HeaderMap,
) -> Response {
    fetch(app, id, q, headers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn fetch(
    app: App,
    id: String,
    q: PollQuery,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = tenant(&app, &headers)?;
    let secs = match q.wait.as_deref() {
        None => 0.0,
        Some(w) => w
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && (0.0..=MAX_POLL_SECS as f64).contains(s))
            .ok_or_else(|| {
                ApiError::invalid(
                    format!("wait must be a number of seconds from 0 to {MAX_POLL_SECS}"),
                    Some("wait"),
                )
                .with_code("INVALID_REQUEST")
            })?,
    };
    if !keys::is_client_id(&id) {
        return Ok(answer::unknown());
    }
    let mut state = broker::lookup(&app, &tenant, &id).await?;
    if matches!(state, Stand::Pending) && secs > 0.0 {
        let Some(_slot) = app.front.slot() else {
            app.metrics.front_busy.inc();
            return Ok(answer::busy());
        };
        let until = Instant::now() + Duration::from_secs_f64(secs);
        state = match wait_for(&app, &tenant, &id, until).await? {
            Some(r) => Stand::Ready(r),
            None => broker::lookup(&app, &tenant, &id).await?,
        };
    }
    Ok(match state {
        Stand::Ready(r) => {
            broker::delivered(&app, &tenant, &id, false).await;
            answer::result(&r)
        }
        Stand::Pending => answer::pending(&id),
        Stand::Unknown => answer::unknown(),
    })
}

/// `DELETE /v1/requests/{id}`: cancels it when pending (queued or in flight), deletes its
/// result; 204.
pub async fn delete(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let done = async {
        let tenant = tenant(&app, &headers)?;
        if keys::is_client_id(&id) {
            broker::delete(&app, &tenant, &id).await?;
        }
        Ok::<_, ApiError>(axum::http::StatusCode::NO_CONTENT.into_response())
    };
    done.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/models`: the routes' models.
pub async fn models(State(app): State<App>) -> Response {
    let data: Vec<Value> = app
        .front
        .settings
        .broker
        .models()
        .into_iter()
        .map(|m| json!({"id": m, "object": "model", "owned_by": "llm-d-async"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` makes, without making one.
    fn future_size<A, F>(_f: impl Fn(A) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Each held wait keeps its handler's future for as long as it waits, 10,000 at once on
    /// one replica: the submit and the live paths are boxed so that they do not set its size.
    /// Unboxed it was 4.7 KiB, and `bench-front`'s 10,000 waiters took 321 MiB instead of 257.
    #[test]
    fn a_held_wait_keeps_a_small_future() {
        let post =
            future_size(|a: (App, Uri, HeaderMap, Bytes)| post(a.0, Endpoint::Chat, a.1, a.2, a.3));
        let submit = future_size(|a: (&'static App, &'static Queued)| broker::submit(a.0, a.1));
        assert!(
            post < submit + 1024 && post <= 3 * 1024 + 512,
            "a held wait's future is {post} bytes (the submit's alone is {submit})"
        );
    }
}
