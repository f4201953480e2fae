//! From a request's record to what a client sees: the request object of `GET
//! /v1/requests/{id}` and of enqueue mode, wait mode's answer (the gateway's own status and
//! body, or inferq's error in OpenAI's shape), and a stream's Server-Sent Events made from the
//! whole answer (OpenAI chunks, then `[DONE]`).

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use super::record::{Ended, Record};
use crate::error::ApiError;

/// The header every wait-mode answer names its request in (to read it again later).
pub const REQUEST_ID_HEADER: &str = "x-inferq-request-id";

/// A request's status: `queued`, `in_progress`, `completed`, `failed`, `cancelled` or
/// `expired` (its deadline passed, or its result outlived the retention).
pub fn status(record: &Record, in_flight: bool) -> &'static str {
    match &record.ended {
        None if in_flight => "in_progress",
        None => "queued",
        Some(e) if e.result.is_none() => "expired",
        Some(e) => match e.code.as_str() {
            "CANCELLED" => "cancelled",
            "DEADLINE_EXCEEDED" => "expired",
            code => match code.parse::<u16>() {
                Ok(s) if (200..300).contains(&s) => "completed",
                _ => "failed",
            },
        },
    }
}

/// A body as JSON when it is, else as a string (as Batch output lines keep it).
fn body_value(payload: &str) -> Value {
    serde_json::from_str(payload).unwrap_or_else(|_| Value::String(payload.to_owned()))
}

/// The request object.
pub fn object(record: &Record, in_flight: bool) -> Value {
    let mut o = json!({
        "id": record.id,
        "object": "async.request",
        "status": status(record, in_flight),
        "endpoint": record.endpoint,
        "created_at": record.created_at,
        "expires_at": record.expires_at,
        "completed_at": record.ended.as_ref().map(|e| e.ended_at),
        "response": null,
        "error": null,
    });
    match record.ended.as_ref().map(|e| (e, &e.result)) {
        None => {}
        Some((_, None)) => {
            o["error"] = json!({"code": "RESULT_EXPIRED", "message": "the result outlived the retention and was dropped"});
        }
        Some((_, Some(r))) if r.status_code > 0 => {
            o["response"] = json!({"status_code": r.status_code, "request_id": r.request_token, "body": body_value(&r.payload)});
        }
        Some((e, Some(r))) => {
            let code = if r.error_code.is_empty() {
                e.code.clone()
            } else {
                r.error_code.clone()
            };
            o["error"] = json!({"code": code, "message": r.error_message});
        }
    }
    o
}

/// inferq's error code as an OpenAI error: DEADLINE_EXCEEDED 504, GATE_DROPPED 429, CANCELLED
/// 409, GATE_ERROR 503, INVALID_REQUEST 400, anything else 502.
pub fn error(code: &str, message: &str) -> ApiError {
    let (status, kind) = match code {
        "DEADLINE_EXCEEDED" => (StatusCode::GATEWAY_TIMEOUT, "timeout_error"),
        "GATE_DROPPED" => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
        "CANCELLED" => (StatusCode::CONFLICT, "invalid_request_error"),
        "GATE_ERROR" => (StatusCode::SERVICE_UNAVAILABLE, "server_error"),
        "INVALID_REQUEST" => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        "RESULT_EXPIRED" => (StatusCode::GONE, "invalid_request_error"),
        _ => (StatusCode::BAD_GATEWAY, "server_error"),
    };
    let message = if message.is_empty() {
        code.to_owned()
    } else {
        message.to_owned()
    };
    ApiError {
        status,
        message,
        kind,
        param: None,
        code: Some(code.to_ascii_lowercase()),
    }
}

fn with_id(mut r: Response, id: &str) -> Response {
    if let Ok(v) = HeaderValue::from_str(id) {
        r.headers_mut().insert(REQUEST_ID_HEADER, v);
    }
    r
}

/// Wait mode's answer to a request that ended.
pub fn ended(id: &str, e: &Ended) -> Response {
    let r = match &e.result {
        None => error(
            "RESULT_EXPIRED",
            "the result outlived the retention and was dropped",
        )
        .into_response(),
        Some(r) if r.status_code > 0 => {
            let status = StatusCode::from_u16(r.status_code).unwrap_or(StatusCode::BAD_GATEWAY);
            let kind = if serde_json::from_str::<serde::de::IgnoredAny>(&r.payload).is_ok() {
                "application/json"
            } else {
                "text/plain; charset=utf-8"
            };
            (
                status,
                [(axum::http::header::CONTENT_TYPE, kind)],
                r.payload.clone(),
            )
                .into_response()
        }
        Some(r) => error(&r.error_code, &r.error_message).into_response(),
    };
    with_id(r, id)
}

/// Wait mode's answer when the deadline passes first.
pub fn timed_out(id: &str) -> Response {
    with_id(
        error(
            "DEADLINE_EXCEEDED",
            &format!("no answer before the request's deadline; GET /v1/requests/{id} reads it if one comes"),
        )
        .into_response(),
        id,
    )
}

fn event(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// The events of a stream once its request ended: the answer as chunks, or an error event,
/// then `[DONE]`.
pub fn stream_events(e: &Ended) -> Vec<String> {
    let mut out = Vec::new();
    match &e.result {
        Some(r) if (200..300).contains(&r.status_code) => match serde_json::from_str(&r.payload) {
            Ok(body) => out.extend(chunks(&body).iter().map(event)),
            Err(_) => out.push(event(&json!({"error": {"message": "the gateway's answer is not JSON", "type": "server_error", "param": null, "code": "bad_gateway_answer"}}))),
        },
        Some(r) if r.status_code > 0 => {
            let body = body_value(&r.payload);
            let err = match body.get("error") {
                Some(e) if e.is_object() => e.clone(),
                _ => json!({"message": r.payload, "type": "server_error", "param": null, "code": r.status_code.to_string()}),
            };
            out.push(event(&json!({"error": err})));
        }
        Some(r) => out.push(event(&error_body(&r.error_code, &r.error_message))),
        None => out.push(event(&error_body("RESULT_EXPIRED", "the result was dropped"))),
    }
    out.push("data: [DONE]\n\n".to_owned());
    out
}

/// An error event's body.
pub fn error_body(code: &str, message: &str) -> Value {
    let e = error(code, message);
    json!({"error": {"message": e.message, "type": e.kind, "param": null, "code": e.code}})
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
    fn error_codes_map_to_openai_statuses() {
        for (code, status) in [
            ("DEADLINE_EXCEEDED", 504),
            ("GATE_DROPPED", 429),
            ("CANCELLED", 409),
            ("GATE_ERROR", 503),
            ("INVALID_REQUEST", 400),
            ("INFERENCE_ERROR", 502),
        ] {
            assert_eq!(error(code, "").status.as_u16(), status, "{code}");
        }
    }
}
