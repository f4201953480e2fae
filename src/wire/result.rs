//! The result message (Go's `ResultMessage`) that inferq pushes onto a result list: `id`,
//! `status_code` (only when an HTTP response was received), `payload` (always a string, the raw
//! response body or `{"error":"…"}`), and `error_code` / `error_message` for non-HTTP outcomes.

use serde::{Deserialize, Serialize};

/// Go's error codes, plus `DEAD_LETTERED` for requests inferq set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    DeadlineExceeded,
    Cancelled,
    GateDropped,
    GateError,
    InferenceError,
    InvalidRequest,
    /// inferq only: the request was moved to the dead-letter list (poison, over the delivery
    /// limit). Go consumers see an unfamiliar code and a clear message.
    DeadLettered,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::GateDropped => "GATE_DROPPED",
            ErrorCode::GateError => "GATE_ERROR",
            ErrorCode::InferenceError => "INFERENCE_ERROR",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::DeadLettered => "DEAD_LETTERED",
        }
    }
}

/// One terminal record, as consumers read it from the result list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultMessage {
    pub id: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub status_code: u16,
    #[serde(default)]
    pub payload: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_code: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error_message: String,
}

fn is_zero(n: &u16) -> bool {
    *n == 0
}

impl ResultMessage {
    /// An HTTP response (any status) carried back verbatim.
    pub fn http(id: &str, status: u16, body: &[u8]) -> Self {
        ResultMessage {
            id: id.to_owned(),
            status_code: status,
            payload: String::from_utf8_lossy(body).into_owned(),
            error_code: String::new(),
            error_message: String::new(),
        }
    }

    /// A non-HTTP outcome: `payload` is `{"error":"<message>"}` as Go writes it.
    pub fn error(id: &str, code: ErrorCode, message: &str) -> Self {
        let payload = serde_json::to_string(&serde_json::json!({ "error": message }))
            .unwrap_or_else(|_| r#"{"error": "internal error"}"#.to_owned());
        ResultMessage {
            id: id.to_owned(),
            status_code: 0,
            payload,
            error_code: code.as_str().to_owned(),
            error_message: message.to_owned(),
        }
    }

    pub fn deadline_exceeded(id: &str) -> Self {
        Self::error(id, ErrorCode::DeadlineExceeded, "deadline exceeded")
    }

    pub fn cancelled(id: &str) -> Self {
        Self::error(id, ErrorCode::Cancelled, "cancelled")
    }

    /// The JSON consumers pop.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| {
            format!(
                r#"{{"id":{},"payload":"{{\"error\":\"marshal failed\"}}"}}"#,
                serde_json::Value::String(self.id.clone())
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_go_examples() {
        let ok = ResultMessage::http("r1", 200, br#"{"id":"cmpl-1","choices":[]}"#);
        assert_eq!(
            ok.to_json(),
            r#"{"id":"r1","status_code":200,"payload":"{\"id\":\"cmpl-1\",\"choices\":[]}"}"#
        );
        let bad = ResultMessage::http("r2", 400, br#"{"error":"bad model"}"#);
        assert_eq!(
            bad.to_json(),
            r#"{"id":"r2","status_code":400,"payload":"{\"error\":\"bad model\"}"}"#
        );
        assert_eq!(
            ResultMessage::deadline_exceeded("r3").to_json(),
            r#"{"id":"r3","payload":"{\"error\":\"deadline exceeded\"}","error_code":"DEADLINE_EXCEEDED","error_message":"deadline exceeded"}"#
        );
    }

    #[test]
    fn payload_is_always_present() {
        let empty = ResultMessage::http("r", 204, b"");
        assert_eq!(
            empty.to_json(),
            r#"{"id":"r","status_code":204,"payload":""}"#
        );
    }

    #[test]
    fn decodes_what_go_writes() {
        let r: ResultMessage = serde_json::from_str(
            r#"{"id":"r4","payload":"{\"error\": \"Too Many Requests\", \"code\": 429}"}"#,
        )
        .unwrap();
        assert_eq!(r.status_code, 0);
        assert!(r.error_code.is_empty());
    }
}
