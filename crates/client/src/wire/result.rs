//! The result message (Go's `ResultMessage`) that inferq pushes onto a result list: `id`, the
//! generation's `request_token` (newer Go), `status_code` (only when an HTTP response was received), `payload` (always a string, the raw
//! response body or `{"error":"…"}`), and `error_code` / `error_message` for non-HTTP outcomes.
//!
//! It is written as Go's `json.Marshal` writes it, byte for byte: besides the escapes every
//! JSON encoder makes, `<`, `>`, `&`, U+2028 and U+2029 in a string become `\u003c`, `\u003e`,
//! `\u0026`, `\u2028` and `\u2029` (Go's HTML-safe strings), so a response body with markup in it
//! reaches a consumer as the same bytes from a Go and an inferq processor.

use std::io;

use serde::{Deserialize, Serialize};
use serde_json::ser::Formatter;

/// Go's error codes, plus `DEAD_LETTERED` for requests inferq set aside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The deadline passed before the request was answered.
    DeadlineExceeded,
    /// The producer cancelled the request.
    Cancelled,
    /// A gate dropped the request.
    GateDropped,
    /// A gate failed while deciding.
    GateError,
    /// The gateway failed the request for good.
    InferenceError,
    /// The request cannot be sent as it is.
    InvalidRequest,
    /// inferq only: the request was moved to the dead-letter list (poison, over the delivery
    /// limit). Go consumers see an unfamiliar code and a clear message.
    DeadLettered,
    /// Newer Go: the request's body was stored apart (a payload key) and is gone, or is not a
    /// JSON object: it was not sent.
    PayloadUnavailable,
}

impl ErrorCode {
    /// The code as Go writes it in `error_code`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::DeadlineExceeded => "DEADLINE_EXCEEDED",
            ErrorCode::Cancelled => "CANCELLED",
            ErrorCode::GateDropped => "GATE_DROPPED",
            ErrorCode::GateError => "GATE_ERROR",
            ErrorCode::InferenceError => "INFERENCE_ERROR",
            ErrorCode::InvalidRequest => "INVALID_REQUEST",
            ErrorCode::DeadLettered => "DEAD_LETTERED",
            ErrorCode::PayloadUnavailable => "PAYLOAD_UNAVAILABLE",
        }
    }
}

/// One terminal record, as consumers read it from the result list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultMessage {
    /// The request's id.
    pub id: String,
    /// The generation's request token (newer Go writes it on every result), so a consumer can
    /// tell two submissions under one id apart; empty for a member that had none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub request_token: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    /// The gateway's HTTP status (0 when none was reached).
    pub status_code: u16,
    #[serde(default)]
    /// The gateway's answer body.
    pub payload: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The error code (see [`ErrorCode`]); empty on success.
    pub error_code: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// What went wrong, for people; empty on success.
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
            request_token: String::new(),
            status_code: status,
            payload: String::from_utf8_lossy(body).into_owned(),
            error_code: String::new(),
            error_message: String::new(),
        }
    }

    /// A non-HTTP outcome: `payload` is `{"error":"<message>"}` as Go writes it.
    pub fn error(id: &str, code: ErrorCode, message: &str) -> Self {
        let payload = go_json(&serde_json::json!({ "error": message }))
            .unwrap_or_else(|| r#"{"error": "internal error"}"#.to_owned());
        ResultMessage {
            id: id.to_owned(),
            request_token: String::new(),
            status_code: 0,
            payload,
            error_code: code.as_str().to_owned(),
            error_message: message.to_owned(),
        }
    }

    /// The result of a request whose deadline passed.
    pub fn deadline_exceeded(id: &str) -> Self {
        Self::error(id, ErrorCode::DeadlineExceeded, "deadline exceeded")
    }

    /// The result of a request its producer cancelled.
    pub fn cancelled(id: &str) -> Self {
        Self::error(id, ErrorCode::Cancelled, "cancelled")
    }

    /// The JSON consumers pop.
    pub fn to_json(&self) -> String {
        go_json(self).unwrap_or_else(|| {
            format!(
                r#"{{"id":{},"payload":"{{\"error\":\"marshal failed\"}}"}}"#,
                serde_json::Value::String(self.id.clone())
            )
        })
    }
}

/// `value` as compact JSON with Go's HTML-safe string escapes; `None` if it cannot be serialized.
fn go_json<T: Serialize + ?Sized>(value: &T) -> Option<String> {
    let mut out = Vec::with_capacity(128);
    value
        .serialize(&mut serde_json::Serializer::with_formatter(
            &mut out, GoEscapes,
        ))
        .ok()?;
    String::from_utf8(out).ok()
}

/// serde_json's compact output, plus the escapes Go's encoder adds to every string.
struct GoEscapes;

impl Formatter for GoEscapes {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        // A byte scan: the three ASCII characters, and U+2028/U+2029 (E2 80 A8/A9 in UTF-8).
        let bytes = fragment.as_bytes();
        let mut plain = 0;
        let mut at = 0;
        while at < bytes.len() {
            let (escape, len): (&[u8], usize) = match bytes[at] {
                b'<' => (b"\\u003c", 1),
                b'>' => (b"\\u003e", 1),
                b'&' => (b"\\u0026", 1),
                0xE2 if bytes.get(at + 1) == Some(&0x80) && bytes.get(at + 2) == Some(&0xA8) => {
                    (b"\\u2028", 3)
                }
                0xE2 if bytes.get(at + 1) == Some(&0x80) && bytes.get(at + 2) == Some(&0xA9) => {
                    (b"\\u2029", 3)
                }
                _ => {
                    at += 1;
                    continue;
                }
            };
            writer.write_all(&bytes[plain..at])?;
            writer.write_all(escape)?;
            at += len;
            plain = at;
        }
        writer.write_all(&bytes[plain..])
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
    fn strings_carry_gos_html_safe_escapes() {
        // What Go's json.Marshal writes for the same ResultMessage.
        let r = ResultMessage::http(
            "<r&1>",
            200,
            "<b>a & b</b>\u{2028}\u{2029}\n\"é\"".as_bytes(),
        );
        assert_eq!(
            r.to_json(),
            r#"{"id":"\u003cr\u00261\u003e","status_code":200,"payload":"\u003cb\u003ea \u0026 b\u003c/b\u003e\u2028\u2029\n\"é\""}"#
        );
        let back: ResultMessage = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(back, r, "consumers decode the same strings");
        assert_eq!(
            ResultMessage::error("x", ErrorCode::InferenceError, "<html> & more").to_json(),
            r#"{"id":"x","payload":"{\"error\":\"\\u003chtml\\u003e \\u0026 more\"}","error_code":"INFERENCE_ERROR","error_message":"\u003chtml\u003e \u0026 more"}"#
        );
    }

    proptest::proptest! {
        #[test]
        fn any_text_round_trips_without_raw_html_characters(id in ".*", body in ".*") {
            let r = ResultMessage::http(&id, 200, body.as_bytes());
            let json = r.to_json();
            let raw = ['<', '>', '&', '\u{2028}', '\u{2029}'];
            proptest::prop_assert!(!json.contains(raw), "raw HTML character in {}", json);
            let back: ResultMessage = serde_json::from_str(&json).unwrap();
            proptest::prop_assert_eq!(back, r);
        }
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
