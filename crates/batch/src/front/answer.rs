//! From the router's Redis state to what a client sees, status for status and shape for shape
//! as the step answers: a stored result with a status is that status and the body verbatim;
//! one without is OpenAI's error envelope by its code; pending is `202 {"id","status":"pending"}`;
//! unknown is 410. A wait-mode stream gets the whole answer as Server-Sent Events (OpenAI chunks,
//! then `[DONE]`), which the step does not offer.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use inferq_client::wire::ResultMessage;
use serde_json::{json, Value};

use crate::error::ApiError;

/// The header queued answers echo the request's id in.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// The status a result code is answered with (499: the client closed the request).
pub fn error_status(code: &str) -> (u16, &'static str) {
    match code {
        "GATE_DROPPED" => (429, "rate_limit_error"),
        "DEADLINE_EXCEEDED" => (504, "timeout_error"),
        "INVALID_REQUEST" => (400, "invalid_request_error"),
        "CANCELLED" => (499, "cancelled"),
        _ => (502, "api_error"),
    }
}

/// An error in the step's envelope `{"error":{"message","type","code"}}`.
pub fn error(status: u16, kind: &'static str, code: &str, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "code": code}})),
    )
        .into_response()
}

/// A stored result, as the step answers it.
pub fn result(r: &ResultMessage) -> Response {
    if r.status_code > 0 {
        let status = StatusCode::from_u16(r.status_code).unwrap_or(StatusCode::BAD_GATEWAY);
        return (
            status,
            [(axum::http::header::CONTENT_TYPE, "application/json")],
            r.payload.clone(),
        )
            .into_response();
    }
    let (status, kind) = error_status(&r.error_code);
    error(status, kind, &r.error_code, &r.error_message)
}

/// `202 {"id":"<id>","status":"pending"}`.
pub fn pending(id: &str) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(json!({"id": id, "status": "pending"})),
    )
        .into_response()
}

/// 410: unknown, expired, deleted or another tenant's.
pub fn unknown() -> Response {
    error(
        410,
        "invalid_request_error",
        "UNKNOWN_REQUEST",
        "request id is unknown, expired, or already deleted",
    )
}

/// 504 at a held wait's deadline.
pub fn timed_out() -> Response {
    error(
        504,
        "timeout_error",
        "DEADLINE_EXCEEDED",
        "request deadline exceeded before a result was produced",
    )
}

/// `r` with the request's id in [`REQUEST_ID_HEADER`].
pub fn with_id(mut r: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        r.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    r
}

/// The 429 of a replica holding `--max-waiting-clients` already.
pub fn busy() -> Response {
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

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

fn error_event(status: u16, kind: &str, code: &str, message: &str) -> String {
    event(&json!({"error": {"message": message, "type": kind, "code": code, "status": status}}))
}

/// The events of a stream once its result came: the answer as chunks, or an error event, then
/// `[DONE]`.
pub fn stream_events(r: Option<&ResultMessage>) -> Vec<String> {
    let mut out = Vec::new();
    match r {
        Some(r) if (200..300).contains(&r.status_code) => match serde_json::from_str(&r.payload) {
            Ok(body) => out.extend(chunks(&body).iter().map(event)),
            Err(_) => out.push(error_event(
                502,
                "api_error",
                "BAD_GATEWAY_ANSWER",
                "the gateway's answer is not JSON",
            )),
        },
        Some(r) if r.status_code > 0 => {
            let body: Value = serde_json::from_str(&r.payload).unwrap_or(Value::Null);
            match body.get("error") {
                Some(e) if e.is_object() => out.push(event(&json!({"error": e}))),
                _ => out.push(error_event(
                    r.status_code,
                    "api_error",
                    &r.status_code.to_string(),
                    &r.payload,
                )),
            }
        }
        Some(r) => {
            let (status, kind) = error_status(&r.error_code);
            out.push(error_event(status, kind, &r.error_code, &r.error_message));
        }
        None => out.push(error_event(
            504,
            "timeout_error",
            "DEADLINE_EXCEEDED",
            "request deadline exceeded before a result was produced",
        )),
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// A whole chat completion or completion as the chunks a stream of it would have carried:
/// per choice its content, then per choice its finish reason, then the usage when given.
pub fn chunks(body: &Value) -> Vec<Value> {
    let chat = body.get("object").and_then(Value::as_str) != Some("text_completion");
    let kind = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let head = |choices: Value| {
        let mut c = json!({
            "id": body.get("id").cloned().unwrap_or(Value::Null),
            "object": kind,
            "created": body.get("created").cloned().unwrap_or(json!(0)),
            "model": body.get("model").cloned().unwrap_or(json!("")),
            "choices": choices,
        });
        if let Some(f) = body.get("system_fingerprint") {
            c["system_fingerprint"] = f.clone();
        }
        c
    };
    let empty = Vec::new();
    let choices = body
        .get("choices")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    let mut out = Vec::new();
    for (n, choice) in choices.iter().enumerate() {
        let index = choice.get("index").cloned().unwrap_or(json!(n));
        let piece = if chat {
            let mut delta = choice.get("message").cloned().unwrap_or(json!({}));
            if let Some(calls) = delta.get_mut("tool_calls").and_then(Value::as_array_mut) {
                for (i, call) in calls.iter_mut().enumerate() {
                    call["index"] = json!(i);
                }
            }
            json!({"index": index, "delta": delta, "logprobs": choice.get("logprobs").cloned().unwrap_or(Value::Null), "finish_reason": null})
        } else {
            json!({"index": index, "text": choice.get("text").cloned().unwrap_or(json!("")), "logprobs": choice.get("logprobs").cloned().unwrap_or(Value::Null), "finish_reason": null})
        };
        out.push(head(json!([piece])));
    }
    for (n, choice) in choices.iter().enumerate() {
        let index = choice.get("index").cloned().unwrap_or(json!(n));
        let finish = choice
            .get("finish_reason")
            .cloned()
            .unwrap_or(json!("stop"));
        let piece = if chat {
            json!({"index": index, "delta": {}, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": index, "text": "", "logprobs": null, "finish_reason": finish})
        };
        out.push(head(json!([piece])));
    }
    if let Some(usage) = body.get("usage").filter(|u| !u.is_null()) {
        let mut last = head(json!([]));
        last["usage"] = usage.clone();
        out.push(last);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chat_answer_becomes_content_then_finish_then_usage_chunks() {
        let body = json!({"id": "c1", "object": "chat.completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}});
        let c = chunks(&body);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0]["object"], "chat.completion.chunk");
        assert_eq!(c[0]["choices"][0]["delta"]["content"], "hi");
        assert_eq!(c[1]["choices"][0]["finish_reason"], "length");
        assert_eq!(c[2]["usage"]["total_tokens"], 2);
    }

    #[test]
    fn error_codes_map_as_the_step_maps_them() {
        for (code, status) in [
            ("GATE_DROPPED", 429),
            ("DEADLINE_EXCEEDED", 504),
            ("INVALID_REQUEST", 400),
            ("CANCELLED", 499),
            ("INFERENCE_ERROR", 502),
            ("GATE_ERROR", 502),
        ] {
            assert_eq!(error_status(code).0, status, "{code}");
        }
    }
}
