//! One completion request in engine mode, from the router to its answer:
//!
//! ```text
//!  parse ──► Pool::submit ──► 429 rejected-saturated (shed, or every queue full)
//!   │ 400        │
//!                ▼ placed: counted as executed (per-id count too)
//!         stream: true ──► SSE, one chunk per token as its engine makes it
//!         otherwise    ──► wait for the last token, then one JSON answer with usage
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
use super::{Pool, Rejection, DROPPED_REASON_HEADER, OBJECTIVE_HEADER, REJECTED_SATURATED};
use crate::openai::{self, Endpoint};
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
    let objective = headers.get(OBJECTIVE_HEADER).and_then(|v| v.to_str().ok());
    let placed = match pool.submit(spec, objective) {
        Ok(placed) => placed,
        Err(rejection) => {
            let message = match rejection {
                Rejection::Shed => "the pool is saturated; sheddable request rejected",
                Rejection::QueueFull => {
                    stats.rejected_capacity.fetch_add(1, Relaxed);
                    "every engine's waiting queue is full"
                }
            };
            let mut response = server::too_many_requests(state, message);
            response.headers_mut().insert(
                DROPPED_REASON_HEADER,
                HeaderValue::from_static(REJECTED_SATURATED),
            );
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
    for _ in 0..tokens {
        if receiver.recv().await.is_none() {
            return server::shutting_down(stats);
        }
    }
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
