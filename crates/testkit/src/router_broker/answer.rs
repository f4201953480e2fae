//! What the step answers over HTTP, as values: a stored result mapped to a status and body, the
//! OpenAI error envelope, the pending answer and the model list, each with the bytes Go's
//! `json.NewEncoder(w).Encode` writes (compact, HTML-escaped, one trailing newline).
//!
//! Data enters as a mailbox's JSON text ([`StoredResult::parse`]) or the step's own outcomes, and
//! leaves as an [`Answer`]: status, headers, body.

use serde::Deserialize;

use super::go_json;

/// An HTTP answer of the step: status, headers (lower-case names) and the body's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Answer {
    /// The value of header `name` (any case), if set.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Value::Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    fn json_body(status: u16, body: String) -> Answer {
        Answer {
            status,
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: body.into_bytes(),
        }
    }

    /// Adds (or replaces) a header.
    pub(crate) fn with_header(mut self, name: &str, value: &str) -> Answer {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// A result as the step reads it from a mailbox (Go's `api.ResultMessage`; unknown fields are
/// ignored, as Go's decoder ignores them).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct StoredResult {
    #[serde(default)]
    pub id: String,
    #[serde(default)]
    pub status_code: i64,
    #[serde(default)]
    pub payload: String,
    #[serde(default)]
    pub error_code: String,
    #[serde(default)]
    pub error_message: String,
}

impl StoredResult {
    /// Parses a mailbox entry; `Err` is the step's 500 `LOOKUP_FAILED`.
    pub fn parse(text: &str) -> Result<StoredResult, serde_json::Error> {
        serde_json::from_str(text)
    }
}

/// `{"error":{"message":..,"type":..,"code":..}}` and a newline; `code` left out when empty.
pub fn openai_error(status: u16, kind: &str, code: &str, message: &str) -> Answer {
    let mut body = format!(
        r#"{{"error":{{"message":{},"type":{}"#,
        go_json::string(message),
        go_json::string(kind)
    );
    if !code.is_empty() {
        body.push_str(&format!(r#","code":{}"#, go_json::string(code)));
    }
    body.push_str("}}\n");
    Answer::json_body(status, body)
}

/// `202 {"id":"<id>","status":"pending"}` and a newline.
pub fn pending(id: &str) -> Answer {
    Answer::json_body(
        202,
        format!(
            "{}\n",
            go_json::string_map([("id", id), ("status", "pending")])
        ),
    )
}

/// A stored result as the step answers it: `status_code > 0` is that status with the payload
/// verbatim; otherwise the error code picks status and type (`GATE_DROPPED` 429,
/// `DEADLINE_EXCEEDED` 504, `INVALID_REQUEST` 400, `CANCELLED` 499, anything else 502) in the
/// OpenAI error envelope, with the result's `error_message`.
pub fn answer_of(result: &StoredResult) -> Answer {
    if result.status_code > 0 {
        return Answer {
            status: u16::try_from(result.status_code).unwrap_or(u16::MAX),
            headers: vec![("content-type".to_owned(), "application/json".to_owned())],
            body: result.payload.as_bytes().to_vec(),
        };
    }
    let (status, kind) = match result.error_code.as_str() {
        "GATE_DROPPED" => (429, "rate_limit_error"),
        "DEADLINE_EXCEEDED" => (504, "timeout_error"),
        "INVALID_REQUEST" => (400, "invalid_request_error"),
        "CANCELLED" => (499, "cancelled"),
        _ => (502, "api_error"),
    };
    openai_error(status, kind, &result.error_code, &result.error_message)
}

/// `GET /v1/models`: the routes' models (each once, in route order), owned by `llm-d-async`.
/// Go encodes a `map[string]any`, so `data` comes before `object`.
pub fn models<'a>(route_models: impl IntoIterator<Item = &'a str>) -> Answer {
    let mut seen: Vec<&str> = Vec::new();
    for model in route_models {
        if !model.is_empty() && !seen.contains(&model) {
            seen.push(model);
        }
    }
    let data: Vec<String> = seen
        .iter()
        .map(|m| {
            format!(
                r#"{{"id":{},"object":"model","owned_by":"llm-d-async"}}"#,
                go_json::string(m)
            )
        })
        .collect();
    Answer::json_body(
        200,
        format!(r#"{{"data":[{}],"object":"list"}}"#, data.join(",")) + "\n",
    )
}

/// Go's `http.Error`: plain text and a newline (the coordinator's answer to a body that is not a
/// JSON object, before the step runs).
pub(crate) fn plain_error(status: u16, message: &str) -> Answer {
    Answer {
        status,
        headers: vec![
            (
                "content-type".to_owned(),
                "text/plain; charset=utf-8".to_owned(),
            ),
            ("x-content-type-options".to_owned(), "nosniff".to_owned()),
        ],
        body: format!("{message}\n").into_bytes(),
    }
}
