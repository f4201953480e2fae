//! Parsing `inferq submit` input lines into requests. Two shapes are accepted per line:
//!
//! - native: `{"id", "deadline" | "timeout_s", "payload", "metadata"?, "headers"?, "endpoint"?,
//!   "model"?}`
//! - OpenAI Batch input: `{"custom_id", "method": "POST", "url", "body"}` → id, endpoint, payload
//!
//! The payload (or body) is kept as the exact bytes of the line. A bad line is an error that
//! names its line number and what is wrong (a header that could not be sent among them).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use inferq_client::wire::NewRequest;

/// The longest `timeout_s` taken: 100 years (a larger one is a mistake, and past the range of
/// Unix seconds the producer can store).
pub(super) const MAX_TIMEOUT_S: f64 = 100.0 * 365.0 * 86_400.0;

/// Why a line was refused.
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
pub(super) struct LineError {
    pub line: usize,
    pub reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    deadline: Option<i64>,
    #[serde(default)]
    timeout_s: Option<f64>,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    /// The model named beside the body (newer Go's `data.model`), for traces.
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    endpoint: Option<String>,
    // OpenAI Batch input fields.
    #[serde(default)]
    custom_id: Option<String>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    url: Option<String>,
    #[serde(default)]
    body: Option<Box<RawValue>>,
}

/// Parses one non-empty line. `now_s` is the current Unix time; `default_timeout_s` applies
/// when the line gives neither `deadline` nor `timeout_s`.
pub(super) fn parse_line(
    line_no: usize,
    text: &str,
    now_s: i64,
    default_timeout_s: f64,
) -> Result<NewRequest, LineError> {
    let err = |reason: String| LineError {
        line: line_no,
        reason,
    };
    let line: Line = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
    let batch = line.custom_id.is_some() || line.body.is_some() || line.url.is_some();
    let (id, endpoint, payload) = if batch {
        if line.id.is_some() || line.payload.is_some() || line.endpoint.is_some() {
            return Err(err(
                "mixes OpenAI Batch fields (custom_id/url/body) with native ones (id/endpoint/payload)"
                    .into(),
            ));
        }
        match line.method.as_deref() {
            None | Some("POST") => {}
            Some(other) => return Err(err(format!("method {other:?}: only POST is supported"))),
        }
        let body = line
            .body
            .ok_or_else(|| err("OpenAI Batch line has no body".into()))?;
        (line.custom_id, line.url.unwrap_or_default(), body)
    } else {
        let payload = line
            .payload
            .ok_or_else(|| err("payload is required".into()))?;
        (line.id, line.endpoint.unwrap_or_default(), payload)
    };
    let id = id.filter(|id| !id.is_empty()).ok_or_else(|| {
        err(if batch {
            "custom_id is required"
        } else {
            "id is required"
        }
        .into())
    })?;
    if !payload.get().starts_with('{') {
        return Err(err("payload must be a JSON object".into()));
    }
    let deadline =
        deadline_of(line.deadline, line.timeout_s, now_s, default_timeout_s).map_err(err)?;
    let headers = line.headers.unwrap_or_default();
    // Such a request would only end in an INFERENCE_ERROR naming the header: say so now.
    crate::gateway::check_message_headers(headers.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .map_err(|e| err(format!("headers: {e}")))?;
    Ok(NewRequest::new(id, deadline, payload)
        .with_created(now_s)
        .with_metadata(line.metadata.unwrap_or_default())
        .with_headers(headers)
        .with_endpoint(endpoint)
        .with_model(line.model.unwrap_or_default()))
}

/// The deadline a line asks for: its `deadline` (Unix seconds, in the future, within 100
/// years), or `timeout_s` (else `default_timeout_s`) from `now_s`; never both.
fn deadline_of(
    deadline: Option<i64>,
    timeout_s: Option<f64>,
    now_s: i64,
    default_timeout_s: f64,
) -> Result<i64, String> {
    match (deadline, timeout_s) {
        (Some(_), Some(_)) => Err("give deadline or timeout_s, not both".into()),
        (Some(d), None) if d <= now_s => Err(format!("deadline {d} is not in the future")),
        // A deadline more than 100 years out is a mistake, most likely milliseconds for
        // seconds: it would never expire.
        (Some(d), None) if d as f64 > now_s as f64 + MAX_TIMEOUT_S => Err(format!(
            "deadline {d} is more than 100 years away: it is in Unix seconds, not milliseconds"
        )),
        (Some(d), None) => Ok(d),
        (None, t) => {
            let t = t.unwrap_or(default_timeout_s);
            if !(t.is_finite() && t >= 1.0) {
                return Err(format!("timeout_s {t} must be at least 1 second"));
            }
            if t > MAX_TIMEOUT_S {
                return Err(format!(
                    "timeout_s is too large ({t:e} s; at most {MAX_TIMEOUT_S} s, 100 years)"
                ));
            }
            Ok(now_s.saturating_add(t.ceil() as i64))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_line_keeps_payload_bytes() {
        let r = parse_line(
            1,
            r#"{"id":"a","timeout_s":60,"payload":{"n":12345678901234567890,"p":"<tags>"},"metadata":{"userid":"u"}}"#,
            1000,
            3600.0,
        )
        .unwrap();
        assert_eq!(r.deadline, 1060);
        assert_eq!(
            r.payload.get(),
            r#"{"n":12345678901234567890,"p":"<tags>"}"#
        );
        assert_eq!(r.metadata["userid"], "u");
    }

    #[test]
    fn openai_batch_line_maps_to_id_endpoint_payload() {
        let r = parse_line(
            3,
            r#"{"custom_id":"task-1","method":"POST","url":"/v1/chat/completions","body":{"model":"m","messages":[]}}"#,
            1000,
            3600.0,
        )
        .unwrap();
        assert_eq!(
            (r.id.as_str(), r.endpoint.as_str()),
            ("task-1", "/v1/chat/completions")
        );
        assert_eq!(r.payload.get(), r#"{"model":"m","messages":[]}"#);
        assert_eq!(r.deadline, 4600);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_reason() {
        let cases = [
            ("not json", "line 7: expected"),
            (r#"{"payload":{}}"#, "line 7: id is required"),
            (r#"{"id":"a"}"#, "line 7: payload is required"),
            (
                r#"{"id":"a","payload":[1]}"#,
                "payload must be a JSON object",
            ),
            (
                r#"{"id":"a","payload":{},"deadline":5}"#,
                "not in the future",
            ),
            (
                r#"{"id":"a","payload":{},"deadline":5000,"timeout_s":3}"#,
                "not both",
            ),
            (
                r#"{"id":"a","payload":{},"deadline":4102444800000}"#,
                "in Unix seconds, not milliseconds",
            ),
            (
                r#"{"id":"a","payload":{},"timeout_s":0}"#,
                "at least 1 second",
            ),
            (
                r#"{"id":"a","payload":{},"extra":1}"#,
                "unknown field `extra`",
            ),
            (
                r#"{"custom_id":"a","method":"GET","url":"/v1/x","body":{}}"#,
                "only POST",
            ),
            (r#"{"custom_id":"a","url":"/v1/x"}"#, "has no body"),
            (
                r#"{"id":"a","payload":{},"headers":{"x-tenant":"a\nb"}}"#,
                "line 7: headers: the value of message header \"x-tenant\" is not a legal",
            ),
        ];
        for (text, want) in cases {
            let e = parse_line(7, text, 1000, 3600.0).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
