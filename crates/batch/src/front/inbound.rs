//! A request as it arrives at the front door, checked before anything is written, by the
//! router's step's rules: no mode header is a live request; otherwise the mode, the body (a JSON
//! object with a `model`), the tenant, the id, the deadline and the forwarded headers. Every
//! refusal is an OpenAI-shaped 4xx naming the field.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::config::BrokerConfig;
use super::keys;
use crate::error::ApiError;

/// The endpoints, by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
    Generate,
    Embeddings,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/inference/v1/generate",
            Endpoint::Embeddings => "/v1/embeddings",
        }
    }
}

/// How the caller wants its answer (`X-AP-Mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Served live, classified against the tenant's quota.
    Passthrough,
    /// Queued; answered 202 with the id at once.
    Enqueue,
    /// Queued; the connection held until the answer.
    Wait,
}

/// A queued request that passed every check.
#[derive(Debug)]
pub struct Queued {
    pub endpoint: Endpoint,
    pub enqueue: bool,
    /// `stream: true` in the body (wait mode only): answered as Server-Sent Events.
    pub stream: bool,
    pub tenant: String,
    /// The client-visible id (fetch id; names the mailbox).
    pub id: String,
    /// Whether the client chose the id (`X-Request-Id` or `Idempotency-Key`): a repeat joins.
    pub chosen: bool,
    pub model: String,
    /// The deadline, seconds from now.
    pub timeout_secs: i64,
    /// What is submitted: the body, without `stream` and `stream_options` when it streams (the
    /// gateway answers whole; the front door makes the chunks).
    pub payload: Value,
    /// The quota attribute and `traceparent`.
    pub metadata: BTreeMap<String, String>,
    /// The allow-listed client headers.
    pub headers: BTreeMap<String, String>,
    /// What a repeated id compares: the endpoint and the body's bytes as sent.
    pub digest: String,
}

/// A request with `X-AP-Mode: passthrough`, checked.
#[derive(Debug)]
pub struct Passthrough {
    pub tenant: String,
    pub model: String,
}

/// What a POST is.
#[derive(Debug)]
pub enum Inbound {
    /// No mode header: served live, untouched.
    Live,
    Passthrough(Passthrough),
    Queued(Box<Queued>),
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(Some)
            .map_err(|_| invalid(format!("{name} is not visible ASCII"), name)),
    }
}

fn invalid(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::invalid(message, Some(param)).with_code("INVALID_REQUEST")
}

/// The tenant of a call: the API key's when keys are configured (an `X-Team` naming another is
/// a 403), else the tenant header's, else `default`; a `:` in it is a 400.
pub fn tenant(
    config: &BrokerConfig,
    headers: &HeaderMap,
    keyed: Option<&str>,
) -> Result<String, ApiError> {
    let named = header(headers, &config.tenant_header)?.filter(|t| !t.is_empty());
    let tenant = match (keyed, named) {
        (Some(k), Some(n)) if k != n => {
            return Err(ApiError::invalid(
                format!(
                    "{} names tenant {n:?}, but the API key belongs to another tenant",
                    config.tenant_header
                ),
                Some(&config.tenant_header),
            )
            .with_status(StatusCode::FORBIDDEN)
            .with_code("TENANT_MISMATCH"))
        }
        (Some(k), _) => k.to_owned(),
        (None, Some(n)) => n.to_owned(),
        (None, None) => keys::DEFAULT_TENANT.to_owned(),
    };
    if tenant.contains(':') {
        return Err(invalid(
            format!("{} must not contain \":\"", config.tenant_header),
            &config.tenant_header,
        ));
    }
    Ok(tenant)
}

/// Checks a POST; `body` is its bytes as received, `keyed` the API key's tenant.
pub fn parse(
    config: &BrokerConfig,
    endpoint: Endpoint,
    headers: &HeaderMap,
    body: &[u8],
    keyed: Option<&str>,
) -> Result<Inbound, ApiError> {
    let Some(mode) = header(headers, &config.mode_header)?.filter(|m| !m.is_empty()) else {
        return Ok(Inbound::Live);
    };
    let mode = match mode.trim().to_ascii_lowercase().as_str() {
        "passthrough" => Mode::Passthrough,
        "enqueue" => Mode::Enqueue,
        "wait" => Mode::Wait,
        _ => {
            return Err(invalid(
                format!(
                    "unknown {} value {mode:?} (passthrough, enqueue or wait)",
                    config.mode_header
                ),
                &config.mode_header,
            ))
        }
    };
    let mut object = match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => m,
        Ok(_) => return Err(invalid("The request body must be a JSON object.", "body")),
        Err(e) => {
            return Err(invalid(
                format!("The request body is not valid JSON: {e}"),
                "body",
            ))
        }
    };
    let stream = match object.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(invalid("stream must be a boolean", "stream")),
    };
    if stream && mode == Mode::Enqueue {
        return Err(invalid(
            "stream cannot be used with X-AP-Mode enqueue: fetch the result with GET \
             /v1/requests/{id}",
            "stream",
        ));
    }
    if stream && mode == Mode::Wait && endpoint == Endpoint::Embeddings {
        return Err(invalid("stream is not supported for embeddings", "stream"));
    }
    let model = match object.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(invalid("model is required", "model")),
    };
    let tenant = tenant(config, headers, keyed)?;
    if mode == Mode::Passthrough {
        return Ok(Inbound::Passthrough(Passthrough { tenant, model }));
    }
    let enqueue = mode == Mode::Enqueue;
    let bounds = config.bounds(enqueue);
    let mut timeout_secs = match header(headers, &config.timeout_header)? {
        None => bounds.default_seconds,
        Some(t) => match t.trim().parse::<i64>() {
            Ok(n) if n > 0 => n,
            _ => {
                return Err(invalid(
                    format!(
                        "{} must be a whole number of seconds above 0, got {t:?}",
                        config.timeout_header
                    ),
                    &config.timeout_header,
                ))
            }
        },
    };
    if bounds.max_seconds > 0 {
        timeout_secs = timeout_secs.min(bounds.max_seconds);
    }
    let chosen_id = [
        header(headers, "x-request-id")?,
        header(headers, "idempotency-key")?,
    ]
    .into_iter()
    .flatten()
    .find(|id| keys::is_client_id(id));
    let (id, chosen) = match chosen_id {
        Some(id) => (id.to_owned(), true),
        None => (keys::mint_id(), false),
    };
    let mut metadata = BTreeMap::new();
    metadata.insert(config.quota.attribute.clone(), tenant.clone());
    if let Some(tp) = header(headers, "traceparent")?.filter(|t| !t.is_empty()) {
        metadata.insert("traceparent".to_owned(), tp.to_owned());
    }
    let mut forwarded = BTreeMap::new();
    for name in config.forward_headers() {
        if let Some(v) = header(headers, name)?.filter(|v| !v.is_empty()) {
            forwarded.insert(name.clone(), v.to_owned());
        }
    }
    if stream {
        object.remove("stream");
        object.remove("stream_options");
    }
    Ok(Inbound::Queued(Box::new(Queued {
        endpoint,
        enqueue,
        stream,
        tenant,
        id,
        chosen,
        model,
        timeout_secs,
        payload: Value::Object(object),
        metadata,
        headers: forwarded,
        digest: keys::body_digest(endpoint.path(), body),
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            if let Ok(v) = v.parse() {
                h.insert(*k, v);
            }
        }
        h
    }

    fn refusal(c: &BrokerConfig, h: &[(&'static str, &str)], body: &[u8]) -> Option<(u16, String)> {
        parse(c, Endpoint::Chat, &headers(h), body, None)
            .err()
            .map(|e| (e.status.as_u16(), e.param.unwrap_or_default()))
    }

    const CHAT: &[u8] = br#"{"model":"m","messages":[]}"#;

    #[test]
    fn no_mode_header_is_live_whatever_the_body() {
        let c = BrokerConfig::default();
        assert!(matches!(
            parse(&c, Endpoint::Chat, &HeaderMap::new(), b"not json", None),
            Ok(Inbound::Live)
        ));
    }

    #[test]
    fn queued_modes_take_the_steps_headers_and_defaults() {
        let c = BrokerConfig::parse("timeouts: {enqueue: {max_seconds: 100}}").unwrap_or_default();
        let h = headers(&[
            ("x-ap-mode", "Enqueue"),
            ("x-team", "acme"),
            ("x-request-id", "job-1"),
            ("x-request-timeout-seconds", "500"),
            ("traceparent", "00-t-s-01"),
            ("x-llm-d-slo-ttft-ms", "150"),
            ("x-other", "no"),
        ]);
        let Ok(Inbound::Queued(q)) = parse(&c, Endpoint::Chat, &h, CHAT, None) else {
            panic!("not queued")
        };
        assert!(q.enqueue && q.chosen);
        assert_eq!((q.tenant.as_str(), q.id.as_str()), ("acme", "job-1"));
        assert_eq!(q.timeout_secs, 100);
        assert_eq!(q.metadata.get("userid").map(String::as_str), Some("acme"));
        assert_eq!(
            q.metadata.get("traceparent").map(String::as_str),
            Some("00-t-s-01")
        );
        assert_eq!(q.headers.len(), 1);
        let h = headers(&[("x-ap-mode", "wait"), ("x-request-id", "bad id!")]);
        let Ok(Inbound::Queued(q)) = parse(&c, Endpoint::Chat, &h, CHAT, None) else {
            panic!("not queued")
        };
        assert!(!q.chosen && q.id.len() == 36 && q.timeout_secs == 60 && q.tenant == "default");
    }

    #[test]
    fn each_refusal_names_its_field() {
        let c = BrokerConfig::default();
        let wait = ("x-ap-mode", "wait");
        assert_eq!(
            refusal(&c, &[("x-ap-mode", "later")], CHAT),
            Some((400, "X-AP-Mode".into()))
        );
        assert_eq!(refusal(&c, &[wait], b"{"), Some((400, "body".into())));
        assert_eq!(refusal(&c, &[wait], b"[1]"), Some((400, "body".into())));
        assert_eq!(
            refusal(&c, &[wait], br#"{"messages":[]}"#),
            Some((400, "model".into()))
        );
        assert_eq!(
            refusal(&c, &[wait, ("x-team", "a:b")], CHAT),
            Some((400, "X-Team".into()))
        );
        for t in ["soon", "0", "-5", "1.5"] {
            assert_eq!(
                refusal(&c, &[wait, ("x-request-timeout-seconds", t)], CHAT),
                Some((400, "X-Request-Timeout-Seconds".into()))
            );
        }
        assert_eq!(
            refusal(
                &c,
                &[("x-ap-mode", "enqueue")],
                br#"{"model":"m","stream":true}"#
            ),
            Some((400, "stream".into()))
        );
        let forbidden = parse(
            &c,
            Endpoint::Chat,
            &headers(&[wait, ("x-team", "b")]),
            CHAT,
            Some("a"),
        );
        assert_eq!(forbidden.err().map(|e| e.status.as_u16()), Some(403));
    }
}
