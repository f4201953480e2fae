//! The header set of one gateway request, built in Go's order so that later writes win the same
//! way they do in the Go processor (go-compat §5.1, fairness §7.3).
//!
//! Inputs: the queue's inference objective, the message's own `headers` map, the merge policy's
//! fairness stamp and the request id. Output: a `HeaderMap` for [`super::GatewayClient::send`].
//!
//! Order (each step may overwrite the previous ones):
//! 1. `Content-Type: application/json`;
//! 2. `x-gateway-inference-objective: <objective>` if the objective is non-empty;
//! 3. every message header (so a message may override both of the above);
//! 4. the fairness header, if its value is non-empty, at most 256 bytes and a legal header value
//!    (any header of the same name, in any letter case, is replaced);
//! 5. inferq's own `x-inferq-request-id: <id>` (last, so a message cannot forge it; the simulator
//!    counts executions by it).
//!
//! A message header whose name or value is not legal HTTP fails the request before anything is
//! sent, as in Go (whose client refuses it at send time): the worker asks
//! [`check_message_headers`] first and answers with an error result naming the header, rather
//! than sending the request without a header its producer asked for. The framing headers Go's
//! transport ignores (`Host`, `Content-Length`, `Transfer-Encoding`, `Trailer`) are skipped with a
//! warning, since hyper would otherwise honour them and corrupt the request. Header names are
//! case-insensitive (stored lower-case), as after Go's `Header.Set` canonicalisation.

use reqwest::header::{HeaderMap, HeaderName, HeaderValue, CONTENT_TYPE};

/// The header carrying the queue's inference objective to the gateway.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";
/// inferq's own header: the request id of the message being executed.
pub const REQUEST_ID_HEADER: &str = "x-inferq-request-id";
/// The gateway's response header explaining why it dropped a request (logs only).
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";
/// The longest fairness value that is stamped (Go's limit).
pub const MAX_FAIRNESS_VALUE_BYTES: usize = 256;

/// Message headers that never reach the wire: Go's transport ignores them, hyper would not.
const FRAMING_HEADERS: [&str; 4] = ["host", "content-length", "transfer-encoding", "trailer"];

/// Builds the header set of one gateway request (see the module comment for the order).
///
/// `message_headers` is the message's `headers` object in any shape, e.g.
/// `map.iter().map(|(k, v)| (k.as_str(), v.as_str()))`. `fairness` is `(header name, value)` as
/// resolved by the merge policy; `None` (or an empty value) stamps nothing.
pub fn build_headers<'a, I>(
    objective: &str,
    message_headers: I,
    fairness: Option<(&str, &str)>,
    request_id: &str,
) -> HeaderMap
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    let mut headers = HeaderMap::new();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if !objective.is_empty() {
        set_or_warn(&mut headers, OBJECTIVE_HEADER, objective, "objective");
    }
    for (name, value) in message_headers {
        if is_framing(name) {
            tracing::warn!(
                header = name,
                "message header ignored: framing headers are set by the HTTP client"
            );
            continue;
        }
        set_or_warn(&mut headers, name, value, "message");
    }
    if let Some((name, value)) = fairness {
        if !value.is_empty() && value.len() <= MAX_FAIRNESS_VALUE_BYTES {
            // An illegal value is left out silently in Go; here it is at least logged.
            set_or_warn(&mut headers, name, value, "fairness");
        }
    }
    set_or_warn(&mut headers, REQUEST_ID_HEADER, request_id, "request id");
    headers
}

/// The first of a message's headers that cannot be sent, described for its error result: a name
/// or a value that is not legal HTTP (a line break in a value, a space in a name). Framing headers
/// are not checked: they are never sent.
pub fn check_message_headers<'a, I>(message_headers: I) -> Result<(), String>
where
    I: IntoIterator<Item = (&'a str, &'a str)>,
{
    for (name, value) in message_headers {
        if is_framing(name) {
            continue;
        }
        if name.is_empty() || !name.bytes().all(is_token_byte) {
            return Err(format!(
                "message header {name:?} is not a legal HTTP header name"
            ));
        }
        if !value.bytes().all(is_value_byte) {
            return Err(format!(
                "the value of message header {name:?} is not a legal HTTP header value"
            ));
        }
    }
    Ok(())
}

/// A byte HTTP allows in a header name (RFC 9110 `tchar`; upper case too, as stored lower-case),
/// checked without building the name: this runs for every request that carries headers.
fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A byte the `http` crate takes in a header value: visible ASCII, space, tab and bytes from
/// 0x80 (obs-text); not other control characters such as a line break.
fn is_value_byte(b: u8) -> bool {
    (b >= 0x20 && b != 0x7f) || b == b'\t'
}

fn is_framing(name: &str) -> bool {
    FRAMING_HEADERS
        .iter()
        .any(|framing| framing.eq_ignore_ascii_case(name))
}

/// Sets `name: value`, replacing every existing header of that name (in any letter case).
/// Returns `false`, changing nothing, when either is not legal HTTP. Used for the fairness and
/// tier-priority stamps.
pub fn stamp_header(headers: &mut HeaderMap, name: &str, value: &str) -> bool {
    match (
        HeaderName::from_bytes(name.as_bytes()),
        HeaderValue::from_str(value),
    ) {
        (Ok(name), Ok(value)) => {
            headers.insert(name, value);
            true
        }
        _ => false,
    }
}

fn set_or_warn(headers: &mut HeaderMap, name: &str, value: &str, source: &'static str) {
    if !stamp_header(headers, name, value) {
        tracing::warn!(
            header = name,
            source,
            "header skipped: not a legal HTTP header name or value"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
        headers.get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn defaults_objective_and_request_id() {
        let h = build_headers("batch", std::iter::empty(), None, "req-1");
        assert_eq!(get(&h, "content-type"), Some("application/json"));
        assert_eq!(get(&h, OBJECTIVE_HEADER), Some("batch"));
        assert_eq!(get(&h, REQUEST_ID_HEADER), Some("req-1"));
        assert_eq!(h.len(), 3);

        let h = build_headers("", std::iter::empty(), None, "req-1");
        assert!(h.get(OBJECTIVE_HEADER).is_none());
    }

    #[test]
    fn message_headers_override_content_type_and_objective() {
        let message = [
            ("Content-Type", "text/plain"),
            ("X-Gateway-Inference-Objective", "interactive"),
            ("X-Custom", "1"),
        ];
        let h = build_headers("batch", message, None, "r");
        assert_eq!(get(&h, "content-type"), Some("text/plain"));
        assert_eq!(get(&h, OBJECTIVE_HEADER), Some("interactive"));
        assert_eq!(get(&h, "x-custom"), Some("1"));
    }

    #[test]
    fn fairness_replaces_any_case_and_respects_limits() {
        let message = [("X-LLM-D-Inference-Fairness-Id", "spoofed")];
        let h = build_headers(
            "",
            message,
            Some(("x-llm-d-inference-fairness-id", "alice")),
            "r",
        );
        assert_eq!(
            h.get_all("x-llm-d-inference-fairness-id")
                .iter()
                .collect::<Vec<_>>(),
            vec!["alice"]
        );

        let too_long = "a".repeat(MAX_FAIRNESS_VALUE_BYTES + 1);
        for value in ["", too_long.as_str(), "bad\nvalue"] {
            let h = build_headers(
                "",
                message,
                Some(("x-llm-d-inference-fairness-id", value)),
                "r",
            );
            assert_eq!(get(&h, "x-llm-d-inference-fairness-id"), Some("spoofed"));
        }
        let exactly = "a".repeat(MAX_FAIRNESS_VALUE_BYTES);
        let h = build_headers(
            "",
            message,
            Some(("x-llm-d-inference-fairness-id", &exactly)),
            "r",
        );
        assert_eq!(
            get(&h, "x-llm-d-inference-fairness-id"),
            Some(exactly.as_str())
        );
    }

    /// The byte-level checks agree with the `http` crate's own, which builds the header.
    #[test]
    fn the_byte_checks_agree_with_the_http_crate() {
        for b in 0..=255u8 {
            let one = [b];
            assert_eq!(
                is_token_byte(b),
                HeaderName::from_bytes(&one).is_ok(),
                "name byte {b:#x}"
            );
            let value = [b'a', b, b'a'];
            assert_eq!(
                is_value_byte(b),
                HeaderValue::from_bytes(&value).is_ok(),
                "value byte {b:#x}"
            );
        }
    }

    #[test]
    fn a_message_header_that_cannot_be_sent_is_named() {
        assert_eq!(
            check_message_headers([("x-ok", "fine"), ("Host", "bad\nhost")]),
            Ok(()),
            "framing headers are never sent, so never checked"
        );
        assert_eq!(
            check_message_headers([("x-ok", "fine"), ("bad name", "x")]),
            Err("message header \"bad name\" is not a legal HTTP header name".to_owned())
        );
        let refused = check_message_headers([("authorization", "Bearer s3cret\r\nx: 1")]);
        assert_eq!(
            refused,
            Err(
                "the value of message header \"authorization\" is not a legal HTTP header value"
                    .to_owned()
            ),
        );
        assert!(
            !refused.unwrap_err().contains("s3cret"),
            "the value, maybe a secret, is not repeated"
        );
    }

    #[test]
    fn illegal_and_framing_message_headers_are_skipped() {
        let message = [
            ("bad name", "x"),
            ("x-bad-value", "a\r\nInjected: 1"),
            ("Host", "elsewhere"),
            ("Content-Length", "1"),
            ("transfer-encoding", "chunked"),
            ("x-ok", "fine"),
        ];
        let h = build_headers("", message, None, "r");
        assert_eq!(get(&h, "x-ok"), Some("fine"));
        for gone in [
            "x-bad-value",
            "host",
            "content-length",
            "transfer-encoding",
            "injected",
        ] {
            assert!(h.get(gone).is_none(), "{gone} should be skipped");
        }
        assert_eq!(h.len(), 3); // content-type, x-ok, request id
    }

    #[test]
    fn request_id_cannot_be_forged_by_a_message() {
        let h = build_headers("", [(REQUEST_ID_HEADER, "forged")], None, "real");
        assert_eq!(get(&h, REQUEST_ID_HEADER), Some("real"));
    }

    #[test]
    fn stamp_header_rejects_illegal_input() {
        let mut h = HeaderMap::new();
        assert!(stamp_header(&mut h, "X-Priority", "0"));
        assert!(!stamp_header(&mut h, "x priority", "0"));
        assert!(!stamp_header(&mut h, "x-priority", "\u{7f}"));
        assert_eq!(get(&h, "x-priority"), Some("0"));
    }
}
