//! The front door's HTTP handlers: the three OpenAI endpoints (wait, stream, enqueue) and
//! `/v1/requests` (read, long-poll, cancel). Every check happens before anything is written;
//! a wait holds a [`super::Slot`] while open, and a wait whose client goes away cancels the
//! request it made.

use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferq_client::producer::unix_ms;
use serde_json::{json, Value};

use super::answer;
use super::inbound::{self, Endpoint, Mode};
use super::record::{self, Cancel, Record};
use crate::error::ApiError;
use crate::state::App;

/// How often a waiting stream sends a keepalive comment.
const KEEPALIVE: Duration = Duration::from_secs(5);
/// A wait reads its record again at least this often, in case an announcement was lost with
/// a connection that failed silently.
const RECHECK: Duration = Duration::from_secs(30);
/// Longest `?wait=` of a long poll, in seconds.
const MAX_POLL_SECS: u64 = 600;
/// Most ids in one `POST /v1/requests/cancel`.
const MAX_CANCEL_IDS: usize = 1000;

pub async fn chat(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    answer_or_error(post(app, Endpoint::Chat, headers, body).await)
}

pub async fn completions(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    answer_or_error(post(app, Endpoint::Completions, headers, body).await)
}

pub async fn embeddings(State(app): State<App>, headers: HeaderMap, body: Bytes) -> Response {
    answer_or_error(post(app, Endpoint::Embeddings, headers, body).await)
}

fn answer_or_error(r: Result<Response, ApiError>) -> Response {
    r.unwrap_or_else(IntoResponse::into_response)
}

fn busy() -> Response {
    let mut r = ApiError::invalid(
        "This replica holds as many waiting clients as --max-waiting-clients allows; retry \
         shortly, or use X-AP-Mode: enqueue",
        None,
    )
    .with_status(StatusCode::TOO_MANY_REQUESTS)
    .with_code("too_many_waiting_clients")
    .into_response();
    r.headers_mut().insert(
        axum::http::header::RETRY_AFTER,
        HeaderValue::from_static("1"),
    );
    r
}

async fn post(
    app: App,
    endpoint: Endpoint,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let inbound = inbound::parse(&app.front.settings, endpoint, &headers, &body)?;
    let mode = match inbound.mode {
        Mode::Wait if inbound.stream => "stream",
        Mode::Wait => "wait",
        Mode::Enqueue => "enqueue",
    };
    if inbound.mode == Mode::Enqueue {
        app.metrics.front_request(mode);
        let opened = record::open(&app, &tenant, &inbound).await?;
        let rec = match opened.record {
            Some(r) => r,
            None => record::read(&app, &tenant, &opened.id)
                .await?
                .ok_or_else(|| ApiError::unavailable(&"the request's record is gone"))?,
        };
        return Ok((StatusCode::ACCEPTED, Json(answer::object(&rec, false))).into_response());
    }
    let Some(slot) = app.front.slot() else {
        app.metrics.front_busy.inc();
        return Ok(busy());
    };
    app.metrics.front_request(mode);
    let opened = record::open(&app, &tenant, &inbound).await?;
    let guard = CancelOnDrop {
        app: app.clone(),
        tenant: tenant.clone(),
        id: opened.id.clone(),
        armed: opened.created,
    };
    if inbound.stream {
        return Ok(stream(app, tenant, guard, slot, inbound));
    }
    let waited = wait_keyed(&app, &tenant, &opened.id, &inbound).await;
    let mut guard = guard;
    guard.armed = false;
    drop(slot);
    Ok(match waited? {
        Waited::Ended(rec) => match &rec.ended {
            Some(e) => answer::ended(&rec.id, e),
            None => answer::timed_out(&rec.id),
        },
        Waited::Pending(rec) => answer::timed_out(&rec.id),
        Waited::NotFound => ApiError::unavailable(&"the request's record is gone").into_response(),
    })
}

/// Cancels the request it names when dropped armed: a wait whose client went away (the
/// handler's future, or the stream's task, is dropped) takes its request with it.
struct CancelOnDrop {
    app: App,
    tenant: String,
    id: String,
    armed: bool,
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.armed || self.app.front.is_stopping() {
            return;
        }
        let (app, tenant, id) = (self.app.clone(), self.tenant.clone(), self.id.clone());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                match record::cancel(&app, &tenant, &id).await {
                    Ok(Cancel::Cancelled(_)) => {
                        app.metrics.front_disconnect_cancels.inc();
                        tracing::info!(request = %id, "client went away: request cancelled");
                    }
                    Ok(_) => {}
                    Err(e) => tracing::warn!(request = %id, error = %e.message, "client went away, but its request could not be cancelled"),
                }
            });
        }
    }
}

/// How a wait ended.
enum Waited {
    Ended(Record),
    /// Still open at the deadline (or the long poll's limit).
    Pending(Record),
    NotFound,
}

/// Waits until `id` ends, its deadline passes, or `limit` (a long poll's) passes.
async fn wait(
    app: &App,
    tenant: &str,
    id: &str,
    limit: Option<tokio::time::Instant>,
) -> Result<Waited, ApiError> {
    let registration = app.front.waiters.register(id);
    loop {
        let notified = registration.notify.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let Some(rec) = record::read(app, tenant, id).await? else {
            return Ok(Waited::NotFound);
        };
        if rec.ended.is_some() {
            return Ok(Waited::Ended(rec));
        }
        let to_deadline = u64::try_from(rec.deadline_ms.saturating_sub(unix_ms())).unwrap_or(0);
        let until = limit
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_millis(to_deadline));
        let now = tokio::time::Instant::now();
        if until <= now {
            return Ok(Waited::Pending(rec));
        }
        let recheck = now + RECHECK;
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep_until(until.min(recheck)) => {
                if until <= recheck {
                    // One last read: the result may have come with the deadline.
                    return Ok(match record::read(app, tenant, id).await? {
                        Some(r) if r.ended.is_some() => Waited::Ended(r),
                        Some(r) => Waited::Pending(r),
                        None => Waited::NotFound,
                    });
                }
            }
        }
    }
}

/// A wait-mode wait: until `id` ends or its deadline passes. With an `Idempotency-Key` it
/// looks every [`record::RESUBMIT_AFTER_MS`] whether the request was ever queued: one recorded
/// by a replica that died (or lost Redis) before queueing it is queued again through the key
/// (`create-2.lua` answers `resubmit` to one caller), so the client that retried gets its answer.
async fn wait_keyed(
    app: &App,
    tenant: &str,
    id: &str,
    inbound: &inbound::Inbound,
) -> Result<Waited, ApiError> {
    if inbound.idempotency_key.is_none() {
        return wait(app, tenant, id, None).await;
    }
    let every = Duration::from_millis(record::RESUBMIT_AFTER_MS.unsigned_abs() + 500);
    loop {
        let limit = tokio::time::Instant::now() + every;
        match wait(app, tenant, id, Some(limit)).await? {
            Waited::Pending(rec) if rec.deadline_ms > unix_ms() => {
                if rec.token.is_none() {
                    record::open(app, tenant, inbound).await?;
                }
            }
            other => return Ok(other),
        }
    }
}

/// A streaming wait: keepalive comments until the request ends, then its answer as chunks
/// and `[DONE]`. A client that goes away closes the channel, and the request is cancelled.
fn stream(
    app: App,
    tenant: String,
    guard: CancelOnDrop,
    slot: super::Slot,
    inbound: inbound::Inbound,
) -> Response {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(8);
    let id = guard.id.clone();
    let header = HeaderValue::from_str(&id).ok();
    tokio::spawn(async move {
        let mut guard = guard;
        let _slot = slot;
        let waiting = wait_keyed(&app, &tenant, &id, &inbound);
        tokio::pin!(waiting);
        let mut tick = tokio::time::interval(KEEPALIVE);
        let waited = loop {
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
        let events = match waited {
            Ok(Waited::Ended(rec)) => rec.ended.as_ref().map(answer::stream_events),
            _ => None,
        }
        .unwrap_or_else(|| {
            vec![
                format!(
                    "data: {}\n\n",
                    answer::error_body(
                        "DEADLINE_EXCEEDED",
                        &format!("no answer before the request's deadline; GET /v1/requests/{id} reads it if one comes")
                    )
                ),
                "data: [DONE]\n\n".to_owned(),
            ]
        });
        guard.armed = false;
        for e in events {
            if tx.send(Bytes::from(e)).await.is_err() {
                return;
            }
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
    if let Some(v) = header {
        h.insert(answer::REQUEST_ID_HEADER, v);
    }
    r
}

#[derive(Debug, serde::Deserialize)]
pub struct PollQuery {
    wait: Option<String>,
}

/// `GET /v1/requests/{id}`, with `?wait=SECONDS` to long-poll until it ends.
pub async fn retrieve(
    State(app): State<App>,
    Path(id): Path<String>,
    Query(q): Query<PollQuery>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
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
            })?,
    };
    let not_found = || ApiError::not_found("Request", &id);
    let rec = if secs > 0.0 {
        let Some(_slot) = app.front.slot() else {
            app.metrics.front_busy.inc();
            return Ok(busy());
        };
        let limit = tokio::time::Instant::now() + Duration::from_secs_f64(secs);
        match wait(&app, &tenant, &id, Some(limit)).await? {
            Waited::Ended(r) | Waited::Pending(r) => r,
            Waited::NotFound => return Err(not_found()),
        }
    } else {
        record::read(&app, &tenant, &id)
            .await?
            .ok_or_else(not_found)?
    };
    let in_flight = rec.ended.is_none() && record::in_flight(&app, &rec).await?;
    Ok(Json(answer::object(&rec, in_flight)).into_response())
}

/// `DELETE /v1/requests/{id}`: cancels it, pending or in flight.
pub async fn delete(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    match record::cancel(&app, &tenant, &id).await? {
        Cancel::Cancelled(r) => Ok(Json(answer::object(&r, false)).into_response()),
        Cancel::Ended(r) if answer::status(&r, false) == "cancelled" => {
            Ok(Json(answer::object(&r, false)).into_response())
        }
        Cancel::Ended(r) => Err(ApiError::conflict(format!(
            "Request {id} has already ended ({}) and cannot be cancelled",
            answer::status(&r, false)
        ))),
        Cancel::NotFound => Err(ApiError::not_found("Request", &id)),
    }
}

#[derive(Debug, serde::Deserialize)]
pub struct CancelMany {
    ids: Vec<String>,
}

/// `POST /v1/requests/cancel {"ids": [...]}`: cancels each; a list of the request objects
/// (an unknown id gets `{"id", "error": {"code": "not_found"}}`).
pub async fn cancel_many(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let req: CancelMany = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            format!("the body must be {{\"ids\": [...]}}: {e}"),
            Some("ids"),
        )
    })?;
    if req.ids.len() > MAX_CANCEL_IDS {
        return Err(ApiError::invalid(
            format!("at most {MAX_CANCEL_IDS} ids per call"),
            Some("ids"),
        ));
    }
    let mut data: Vec<Value> = Vec::with_capacity(req.ids.len());
    for id in &req.ids {
        data.push(match record::cancel(&app, &tenant, id).await? {
            Cancel::Cancelled(r) | Cancel::Ended(r) => answer::object(&r, false),
            Cancel::NotFound => {
                json!({"id": id, "object": "async.request", "error": {"code": "not_found", "message": format!("No such Request object: {id}")}})
            }
        });
    }
    Ok(Json(json!({"object": "list", "data": data})).into_response())
}
