//! One completion request in engine mode, from the router to its answer:
//!
//! ```text
//!  parse ──► Pool::admit ──► 429 rejected-saturated (shed, or every queue full)
//!   │ 400        │          ──► 429 rejected-ttl-expired (waited past its router band's TTL)
//!                ▼ placed: counted as executed (per-id count too)
//!         stream: true ──► SSE, one chunk per token as its engine makes it
//!         otherwise    ──► wait for the last token, then one JSON answer with usage
//!         evicted by the router meanwhile ──► 429 `evicted` (a stream is cut short)
//! ```
//!
//! Faults are not drawn here: the engine model's latency and refusals are its own. A client
//! that goes away drops the token channel's receiver, which aborts its sequence.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::header::{CACHE_CONTROL, CONTENT_TYPE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use super::scheduler::SequenceSpec;
use super::stream::{event_stream, AnswerHead};
use super::{
    Pool, Rejection, DROPPED_REASON_HEADER, OBJECTIVE_HEADER, OLD_OBJECTIVE_HEADER,
    REJECTED_SATURATED,
};
use crate::openai::{self, Endpoint};
use crate::router::{EVICTED, EVICTED_BODY, REJECTED_TTL_EXPIRED};
use crate::server::{self, SimState};

/// Answers one completion request on the engine pool.
pub(crate) async fn complete(
    state: &Arc<SimState>,
    pool: &Pool,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let stats = &state.stats;
    let request = match openai::parse_request(endpoint, body, true) {
        Ok(request) => request,
        Err(message) => return server::bad_request(stats, &message),
    };
    let cfg = state.config();
    let tokens = request
        .max_tokens
        .unwrap_or(cfg.default_tokens)
        .min(cfg.max_tokens_cap)
        .max(1);
    let spec = SequenceSpec {
        prompt_tokens: request.prompt_tokens,
        output_tokens: tokens,
    };
    // The router reads the objective under its name or the deprecated alias.
    let objective = headers
        .get(OBJECTIVE_HEADER)
        .or_else(|| headers.get(OLD_OBJECTIVE_HEADER))
        .and_then(|v| v.to_str().ok());
    let (placed, lease) = match pool.admit(spec, objective).await {
        Ok(admitted) => admitted,
        Err(rejection) => {
            let (message, reason) = match rejection {
                Rejection::Shed => (
                    "the pool is saturated; sheddable request rejected",
                    REJECTED_SATURATED,
                ),
                Rejection::QueueFull => {
                    stats.rejected_capacity.fetch_add(1, Relaxed);
                    ("every engine's waiting queue is full", REJECTED_SATURATED)
                }
                Rejection::TtlExpired => (
                    "the request waited in flow control past its TTL",
                    REJECTED_TTL_EXPIRED,
                ),
            };
            let mut response = server::too_many_requests(state, message);
            response
                .headers_mut()
                .insert(DROPPED_REASON_HEADER, HeaderValue::from_static(reason));
            return response;
        }
    };
    state.record_execution(headers);

    let head = AnswerHead {
        seq: state.next_answer_seq(),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: request
            .model
            .clone()
            .unwrap_or_else(|| cfg.served_model_name.clone()),
        prompt_tokens: request.prompt_tokens,
        completion_tokens: tokens,
        hit_limit: request.max_tokens == Some(tokens),
    };

    if request.stream {
        let done_state = Arc::clone(state);
        let (prompt_tokens, hit_limit) = (head.prompt_tokens, head.hit_limit);
        let on_complete = Box::new(move || {
            done_state
                .stats
                .count_success(prompt_tokens, tokens, hit_limit)
        });
        let body = event_stream(
            endpoint,
            head,
            request.include_usage,
            placed.tokens,
            on_complete,
            lease,
        );
        return (
            StatusCode::OK,
            [
                (CONTENT_TYPE, HeaderValue::from_static("text/event-stream")),
                (CACHE_CONTROL, HeaderValue::from_static("no-cache")),
            ],
            body,
        )
            .into_response();
    }

    let mut receiver = placed.tokens;
    let evicted = lease.as_ref().map(|l| l.evicted.clone());
    for made in 0..tokens {
        let token = tokio::select! {
            biased;
            _ = evicted_by_router(evicted.as_ref()) => None,
            token = receiver.recv() => Some(token),
        };
        match token {
            Some(Some(_)) => {}
            Some(None) => return server::shutting_down(stats),
            None => {
                // Dropping the receiver aborts the sequence at its engine's next step.
                drop(receiver);
                if let Some(lease) = &lease {
                    lease.wasted(made);
                }
                return evicted_response(state);
            }
        }
    }
    drop(lease);
    match openai::completion_body(endpoint, &head.answer()) {
        Ok(body) => {
            stats.count_success(head.prompt_tokens, tokens, head.hit_limit);
            server::json_response(StatusCode::OK, body)
        }
        Err(e) => {
            stats.server_error.fetch_add(1, Relaxed);
            server::error_response(StatusCode::INTERNAL_SERVER_ERROR, &e, "server_error")
        }
    }
}

/// Resolves when the router evicts the request (never without flow control).
pub(super) async fn evicted_by_router(token: Option<&tokio_util::sync::CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

/// The router's answer to an evicted request: 429, `x-llm-d-request-dropped-reason: evicted`,
/// and its plain-text body.
fn evicted_response(state: &server::SimState) -> Response {
    state.stats.too_many_requests.fetch_add(1, Relaxed);
    (
        StatusCode::TOO_MANY_REQUESTS,
        [
            (CONTENT_TYPE, HeaderValue::from_static("text/plain")),
            (
                axum::http::HeaderName::from_static(DROPPED_REASON_HEADER),
                HeaderValue::from_static(EVICTED),
            ),
        ],
        EVICTED_BODY,
    )
        .into_response()
}
