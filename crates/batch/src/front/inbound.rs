//! A request as it arrives at the front door, checked before anything is written: its
//! endpoint, mode (`X-AP-Mode`, or `service_tier: "flex"`), queue (`x-llm-d-async-queue`),
//! deadline (`x-llm-d-async-timeout`, or the body's `timeout`), whether it streams, its
//! `Idempotency-Key`, and the body to submit. Every refusal is a 400 naming the field.

use std::time::Duration;

use axum::http::HeaderMap;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::duration::parse_go;
use super::settings::FrontSettings;
use crate::error::ApiError;

/// The three endpoints, as the path and the body's OpenAI object kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }
}

/// How the caller wants its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Hold the connection until the answer (the default).
    Wait,
    /// Answer 202 with the request's id at once.
    Enqueue,
}

/// The longest `Idempotency-Key` taken.
pub const MAX_KEY_LEN: usize = 255;

/// A request that passed every check.
#[derive(Debug)]
pub struct Inbound {
    pub endpoint: Endpoint,
    pub mode: Mode,
    /// `stream: true` in the body (wait mode only).
    pub stream: bool,
    /// The `queue_name` it goes to.
    pub queue: String,
    /// How long from now its deadline is.
    pub timeout: Duration,
    /// What is submitted: the body as sent, or without `stream` and `stream_options` when it
    /// streams (the gateway answers whole; the front door makes the chunks).
    pub payload: Box<RawValue>,
    /// The body's `model`, when a string.
    pub model: String,
    pub idempotency_key: Option<String>,
    /// What idempotency compares: the endpoint and the body's bytes as sent.
    pub digest: String,
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| ApiError::invalid(format!("{name} is not visible ASCII"), Some(name))),
    }
}

/// Checks a request; `body` is its bytes as received.
pub fn parse(
    settings: &FrontSettings,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<Inbound, ApiError> {
    let object: Map<String, Value> = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => {
            return Err(ApiError::invalid(
                "The request body must be a JSON object.",
                Some("body"),
            ))
        }
        Err(e) => {
            return Err(ApiError::invalid(
                format!("The request body is not valid JSON: {e}"),
                Some("body"),
            ))
        }
    };
    // `service_tier: "flex"` asks for what wait mode is, the default: it needs no mode of its
    // own, only a well-formed value.
    match object.get("service_tier") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(_) => {
            return Err(ApiError::invalid(
                "service_tier must be a string",
                Some("service_tier"),
            ))
        }
    }
    let mode =
        match header(headers, "x-ap-mode")?.map(|m| m.trim().to_ascii_lowercase()) {
            None => Mode::Wait,
            Some(m) if m == "wait" || m.is_empty() => Mode::Wait,
            Some(m) if m == "enqueue" => Mode::Enqueue,
            Some(m) if m == "passthrough" => return Err(ApiError::invalid(
                "X-AP-Mode passthrough is not served by inferq: send the request to the gateway \
                 itself (modes: wait, enqueue)",
                Some("X-AP-Mode"),
            )),
            Some(m) => {
                return Err(ApiError::invalid(
                    format!("X-AP-Mode {m:?} is not a mode (wait, enqueue)"),
                    Some("X-AP-Mode"),
                ))
            }
        };
    // OpenAI's limits on a body's `metadata`, checked here as the Batch API checks a batch's.
    crate::metadata::check(object.get("metadata"))?;
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid(
                "stream must be a boolean",
                Some("stream"),
            ))
        }
    };
    if stream && endpoint == Endpoint::Embeddings {
        return Err(ApiError::invalid(
            "stream is not supported for embeddings",
            Some("stream"),
        ));
    }
    if stream && mode == Mode::Enqueue {
        return Err(ApiError::invalid(
            "stream cannot be used with X-AP-Mode enqueue: read the result with GET \
             /v1/requests/{id}",
            Some("stream"),
        ));
    }
    let queue = settings
        .queue(header(headers, "x-llm-d-async-queue")?)
        .map_err(|why| ApiError::invalid(why, Some("x-llm-d-async-queue")))?
        .to_owned();
    let timeout = match header(headers, "x-llm-d-async-timeout")? {
        Some(t) => parse_go(t).map_err(|why| {
            ApiError::invalid(
                format!("x-llm-d-async-timeout: {why}"),
                Some("x-llm-d-async-timeout"),
            )
        })?,
        None => match object.get("timeout") {
            None | Some(Value::Null) => settings.request_timeout,
            Some(Value::Number(n)) => n
                .as_f64()
                .filter(|s| s.is_finite() && *s > 0.0 && *s < 1e10)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| {
                    ApiError::invalid(
                        "timeout must be a positive number of seconds or a Go duration",
                        Some("timeout"),
                    )
                })?,
            Some(Value::String(t)) => parse_go(t)
                .map_err(|why| ApiError::invalid(format!("timeout: {why}"), Some("timeout")))?,
            Some(_) => {
                return Err(ApiError::invalid(
                    "timeout must be a positive number of seconds or a Go duration",
                    Some("timeout"),
                ))
            }
        },
    };
    if timeout < Duration::from_millis(1) {
        return Err(ApiError::invalid(
            "the timeout is under 1ms",
            Some("timeout"),
        ));
    }
    let idempotency_key = match header(headers, "idempotency-key")? {
        None => None,
        Some(k) if k.is_empty() || k.len() > MAX_KEY_LEN => {
            return Err(ApiError::invalid(
                format!("Idempotency-Key must be 1 to {MAX_KEY_LEN} characters"),
                Some("Idempotency-Key"),
            ))
        }
        Some(k) => Some(k.to_owned()),
    };
    let model = match object.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => String::new(),
    };
    let payload = if stream {
        let mut whole = object;
        whole.remove("stream");
        whole.remove("stream_options");
        serde_json::value::to_raw_value(&whole)
            .map_err(|e| ApiError::invalid(e.to_string(), Some("body")))?
    } else {
        let text = std::str::from_utf8(body)
            .map_err(|e| ApiError::invalid(format!("The body is not UTF-8: {e}"), Some("body")))?;
        RawValue::from_string(text.to_owned())
            .map_err(|e| ApiError::invalid(e.to_string(), Some("body")))?
    };
    Ok(Inbound {
        endpoint,
        mode,
        stream,
        queue,
        timeout,
        payload,
        model,
        idempotency_key,
        digest: super::keys::body_digest(endpoint.path(), body),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::front::settings::FrontQueue;

    fn settings() -> FrontSettings {
        FrontSettings {
            queues: vec![
                FrontQueue {
                    id: "main".into(),
                    queue_name: "q-main".into(),
                    refused: None,
                },
                FrontQueue {
                    id: "own".into(),
                    queue_name: "q-own".into(),
                    refused: Some("queue own sends its results to its own list".into()),
                },
            ],
            default_queue: "q-main".into(),
            ..FrontSettings::default()
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            if let Ok(v) = v.parse() {
                h.insert(*k, v);
            }
        }
        h
    }

    fn param(r: Result<Inbound, ApiError>) -> Option<String> {
        r.err().and_then(|e| e.param)
    }

    const CHAT: &[u8] = br#"{"model":"m","messages":[]}"#;

    #[test]
    fn defaults_are_wait_the_default_queue_and_the_request_timeout() {
        let s = settings();
        let i = parse(&s, Endpoint::Chat, &HeaderMap::new(), CHAT).ok();
        let i = i.as_ref();
        assert_eq!(i.map(|i| i.mode), Some(Mode::Wait));
        assert_eq!(i.map(|i| i.queue.as_str()), Some("q-main"));
        assert_eq!(i.map(|i| i.timeout), Some(s.request_timeout));
        assert_eq!(i.map(|i| i.payload.get().as_bytes()), Some(CHAT));
    }

    #[test]
    fn headers_pick_mode_queue_and_deadline() {
        let s = settings();
        let h = headers(&[
            ("x-ap-mode", "Enqueue"),
            ("x-llm-d-async-queue", "main"),
            ("x-llm-d-async-timeout", "1m30s"),
        ]);
        let i = parse(
            &s,
            Endpoint::Completions,
            &h,
            br#"{"prompt":"x","timeout":5}"#,
        )
        .ok();
        assert_eq!(i.as_ref().map(|i| i.mode), Some(Mode::Enqueue));
        assert_eq!(i.as_ref().map(|i| i.timeout), Some(Duration::from_secs(90)));
        let i = parse(
            &s,
            Endpoint::Chat,
            &HeaderMap::new(),
            br#"{"timeout":"2s","service_tier":"flex"}"#,
        )
        .ok();
        assert_eq!(
            i.as_ref().map(|i| (i.mode, i.timeout)),
            Some((Mode::Wait, Duration::from_secs(2)))
        );
    }

    #[test]
    fn each_refusal_names_its_field() {
        let s = settings();
        let none = HeaderMap::new();
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &none, b"[1]")),
            Some("body".into())
        );
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &none, b"{")),
            Some("body".into())
        );
        let h = headers(&[("x-ap-mode", "later")]);
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &h, CHAT)),
            Some("X-AP-Mode".into())
        );
        let h = headers(&[("x-llm-d-async-timeout", "10")]);
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &h, CHAT)),
            Some("x-llm-d-async-timeout".into())
        );
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &none, br#"{"timeout":-1}"#)),
            Some("timeout".into())
        );
        for q in ["nope", "own"] {
            let h = headers(&[("x-llm-d-async-queue", q)]);
            assert_eq!(
                param(parse(&s, Endpoint::Chat, &h, CHAT)),
                Some("x-llm-d-async-queue".into())
            );
        }
        assert_eq!(
            param(parse(
                &s,
                Endpoint::Embeddings,
                &none,
                br#"{"stream":true}"#
            )),
            Some("stream".into())
        );
        let h = headers(&[("x-ap-mode", "enqueue")]);
        assert_eq!(
            param(parse(&s, Endpoint::Chat, &h, br#"{"stream":true}"#)),
            Some("stream".into())
        );
    }

    #[test]
    fn a_stream_is_submitted_without_stream() {
        let s = settings();
        let i = parse(
            &s,
            Endpoint::Chat,
            &HeaderMap::new(),
            br#"{"model":"m","stream":true,"stream_options":{}}"#,
        )
        .ok();
        assert_eq!(i.as_ref().map(|i| i.stream), Some(true));
        assert_eq!(
            i.as_ref().map(|i| i.payload.get()),
            Some(r#"{"model":"m"}"#)
        );
    }
}
