//! What one gateway attempt amounted to, and the rules that decide it (go-compat §5.3, with
//! inferq's §12.5 improvement).
//!
//! The client hands in the raw facts (a status and headers plus how reading the body went, or a
//! transport error); an [`Outcome`] leaves, carrying the Go-style [`ClientError`] text used in
//! logs and in `INFERENCE_ERROR` results.
//!
//! | Situation                                  | Outcome                                   | Category      |
//! |--------------------------------------------|-------------------------------------------|---------------|
//! | bad URL / request cannot be built          | `Fatal`                                   | `INVALID_REQ` |
//! | response body over the size limit          | `Fatal`                                   | `UNKNOWN`     |
//! | redirect loop / bad redirect               | `Fatal`                                   | `UNKNOWN`     |
//! | connect refused, DNS, TLS, reset, other transport error | `Retry` (status `None`)      | `UNKNOWN`     |
//! | per-attempt timeout before the response    | `Retry` (status `None`)                   | `UNKNOWN`     |
//! | body read error or timeout mid-body (a cut) | `Retry` (no status, no body, RA)         | `SERVER_ERROR`|
//! | 429                                        | `Retry` (`shed`, Retry-After)             | `RATE_LIMIT`  |
//! | other 4xx                                  | `Terminal` (status + body)                | `INVALID_REQ` |
//! | 5xx (and anything ≥ 600)                   | `Retry` (Retry-After)                     | `SERVER_ERROR`|
//! | 1xx / 2xx / 3xx                            | `Success` (status + body)                 | —             |
//!
//! Go made the two transport rows terminal `INFERENCE_ERROR`s; inferq retries them until the
//! deadline.
//!
//! Only a whole answer is an HTTP answer. A body that did not arrive in full (the connection
//! failed, or the attempt's time ran out, mid-body) carries neither its status nor its bytes:
//! at the deadline it ends as `DEADLINE_EXCEEDED` (cut by the deadline) or `INFERENCE_ERROR`
//! naming the cut and the bytes that arrived, never as the status line it began with. Go keeps
//! the status and the partial body and publishes them at the deadline as if they were the
//! answer; a consumer could not tell a truncated answer from a whole one. An oversized body is not retried: the same request would most likely produce the
//! same answer, and retrying it would only burn gateway capacity until the deadline.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

/// The decision about one attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The gateway answered 1xx/2xx/3xx: publish `{status_code, payload: body}`.
    Success { status: u16, body: Bytes },
    /// The gateway answered a 4xx other than 429: publish the HTTP result (status + raw body)
    /// without retrying.
    Terminal {
        status: u16,
        body: Bytes,
        error: ClientError,
    },
    /// Try again after a backoff (see [`super::backoff::retry_decision`]). If the deadline runs
    /// out, the last response with a status (if any) is what gets published.
    Retry {
        /// The status, when a whole response arrived (`None` for transport failures, timeouts
        /// before the response head, and answers whose body was cut).
        status: Option<u16>,
        /// The body of that response.
        body: Option<Bytes>,
        /// The gateway's `Retry-After`, already parsed (absent, unparsable or not applicable ⇒
        /// `None`).
        retry_after: Option<Duration>,
        reason: RetryReason,
        /// The gateway shed the request (429): counted separately.
        shed: bool,
        error: ClientError,
    },
    /// The request could not be made or its answer cannot be used: publish `INFERENCE_ERROR`
    /// with [`ClientError::inference_error_message`].
    Fatal { error: ClientError },
}

impl Outcome {
    /// The Go-style error of a non-success outcome (for logs, spans and result messages).
    pub fn client_error(&self) -> Option<&ClientError> {
        match self {
            Outcome::Success { .. } => None,
            Outcome::Terminal { error, .. }
            | Outcome::Retry { error, .. }
            | Outcome::Fatal { error } => Some(error),
        }
    }

    /// Whether the router's flow control evicted the request after dispatch: a 429 whose
    /// `x-llm-d-request-dropped-reason` starts with `evicted` (`evicted`, `evicted-priority`, …).
    /// The worker puts such a request back at once; it is not a failure.
    pub fn evicted(&self) -> bool {
        matches!(
            self,
            Outcome::Retry { status: Some(429), error, .. }
                if error.dropped_reason.as_deref().is_some_and(|r| r.starts_with("evicted"))
        )
    }

    /// The HTTP status received, if any.
    pub fn status(&self) -> Option<u16> {
        match self {
            Outcome::Success { status, .. } | Outcome::Terminal { status, .. } => Some(*status),
            Outcome::Retry { status, .. } => *status,
            Outcome::Fatal { .. } => None,
        }
    }
}

/// Why an attempt is retried (a label for logs and metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RetryReason {
    /// 429.
    RateLimited,
    /// 5xx.
    ServerError,
    /// The response head arrived but reading the body failed.
    BodyRead,
    /// The per-attempt timeout expired (before or during the response).
    Timeout,
    /// The connection could not be established (refused, DNS, TLS handshake).
    Connect,
    /// Any other transport failure (e.g. the connection was reset mid-request).
    Transport,
}

impl RetryReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RetryReason::RateLimited => "rate_limited",
            RetryReason::ServerError => "server_error",
            RetryReason::BodyRead => "body_read",
            RetryReason::Timeout => "timeout",
            RetryReason::Connect => "connect",
            RetryReason::Transport => "transport",
        }
    }
}

impl fmt::Display for RetryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Go's `ClientError` categories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCategory {
    RateLimit,
    ServerError,
    InvalidReq,
    Unknown,
}

impl ErrorCategory {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCategory::RateLimit => "RATE_LIMIT",
            ErrorCategory::ServerError => "SERVER_ERROR",
            ErrorCategory::InvalidReq => "INVALID_REQ",
            ErrorCategory::Unknown => "UNKNOWN",
        }
    }
}

impl fmt::Display for ErrorCategory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Go's `ClientError`, kept for its text: `<CATEGORY>: <message>[ (dropped: <reason>)][ (caused
/// by: <raw err>)]`, e.g. `RATE_LIMIT: rate limited: status code 429 (dropped:
/// rejected-saturated)`. In inferq the [`Outcome`] variant, not the category, decides what
/// happens next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    pub category: ErrorCategory,
    pub message: String,
    /// The gateway's `x-llm-d-request-dropped-reason`, when present and non-empty.
    pub dropped_reason: Option<String>,
    /// The underlying error text, for transport and read failures.
    pub cause: Option<String>,
}

impl ClientError {
    pub fn new(category: ErrorCategory, message: impl Into<String>) -> Self {
        ClientError {
            category,
            message: message.into(),
            dropped_reason: None,
            cause: None,
        }
    }

    pub fn with_dropped_reason(mut self, reason: Option<String>) -> Self {
        self.dropped_reason = reason.filter(|r| !r.is_empty());
        self
    }

    pub fn with_cause(mut self, cause: impl Into<String>) -> Self {
        self.cause = Some(cause.into());
        self
    }

    /// The `error_message` of an `INFERENCE_ERROR` result, as Go words it.
    pub fn inference_error_message(&self) -> String {
        format!("Failed to send request to inference: {self}")
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.category, self.message)?;
        if let Some(reason) = &self.dropped_reason {
            write!(f, " (dropped: {reason})")?;
        }
        if let Some(cause) = &self.cause {
            write!(f, " (caused by: {cause})")?;
        }
        Ok(())
    }
}

impl std::error::Error for ClientError {}

/// The facts of a response head that classification needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct ResponseHead {
    pub status: u16,
    pub retry_after: Option<Duration>,
    pub dropped_reason: Option<String>,
}

/// How reading the response body ended.
#[derive(Debug)]
pub(crate) enum BodyRead {
    Complete(Bytes),
    /// Reading failed part-way (`timed_out`: the per-attempt timeout expired).
    Failed {
        partial: Bytes,
        cause: String,
        timed_out: bool,
    },
    /// The body is larger than the configured limit.
    TooLarge {
        limit: usize,
    },
}

/// Classifies a response whose head arrived (go-compat §5.3; a body-read failure is checked
/// first, whatever the status, as in Go).
pub(crate) fn classify_response(head: ResponseHead, body: BodyRead) -> Outcome {
    let ResponseHead {
        status,
        retry_after,
        dropped_reason,
    } = head;
    let body = match body {
        BodyRead::Complete(body) => body,
        BodyRead::Failed {
            partial,
            cause,
            timed_out,
        } => {
            return Outcome::Retry {
                status: None,
                body: None,
                retry_after,
                reason: if timed_out {
                    RetryReason::Timeout
                } else {
                    RetryReason::BodyRead
                },
                shed: false,
                error: ClientError::new(
                    ErrorCategory::ServerError,
                    cut_message(status, &partial, timed_out),
                )
                .with_dropped_reason(dropped_reason)
                .with_cause(cause),
            };
        }
        BodyRead::TooLarge { limit } => {
            return Outcome::Fatal {
                error: ClientError::new(
                    ErrorCategory::Unknown,
                    format!("response body exceeds {limit} bytes: status code {status}"),
                )
                .with_dropped_reason(dropped_reason),
            };
        }
    };
    match status {
        429 => Outcome::Retry {
            status: Some(status),
            body: Some(body),
            retry_after,
            reason: RetryReason::RateLimited,
            shed: true,
            error: ClientError::new(ErrorCategory::RateLimit, "rate limited: status code 429")
                .with_dropped_reason(dropped_reason),
        },
        400..=499 => Outcome::Terminal {
            status,
            body,
            error: ClientError::new(
                ErrorCategory::InvalidReq,
                format!("client error: status code {status}"),
            )
            .with_dropped_reason(dropped_reason),
        },
        500.. => Outcome::Retry {
            status: Some(status),
            body: Some(body),
            retry_after,
            reason: RetryReason::ServerError,
            shed: false,
            error: ClientError::new(
                ErrorCategory::ServerError,
                format!("server error: status code {status}"),
            )
            .with_dropped_reason(dropped_reason),
        },
        _ => Outcome::Success { status, body },
    }
}

/// What a cut answer says: its status, that its body was cut, and how many bytes arrived.
fn cut_message(status: u16, partial: &Bytes, timed_out: bool) -> String {
    let by = if timed_out {
        "the attempt's time ran out"
    } else {
        "the connection failed"
    };
    format!(
        "failed to read response: status code {status}, body cut after {} bytes ({by})",
        partial.len()
    )
}

/// A failure before any response head: inferq retries it (Go did not).
pub(crate) fn transport_failure(reason: RetryReason, cause: String) -> Outcome {
    Outcome::Retry {
        status: None,
        body: None,
        retry_after: None,
        reason,
        shed: false,
        error: ClientError::new(ErrorCategory::Unknown, "failed to send request").with_cause(cause),
    }
}

/// The request could not be built (bad URL, unsupported scheme).
pub(crate) fn request_failure(cause: String) -> Outcome {
    Outcome::Fatal {
        error: ClientError::new(ErrorCategory::InvalidReq, "failed to create request")
            .with_cause(cause),
    }
}

/// The exchange failed in a way retrying will not fix (e.g. a redirect loop).
pub(crate) fn unusable_exchange(cause: String) -> Outcome {
    Outcome::Fatal {
        error: ClientError::new(ErrorCategory::Unknown, "failed to send request").with_cause(cause),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(status: u16) -> ResponseHead {
        ResponseHead {
            status,
            retry_after: Some(Duration::from_secs(3)),
            dropped_reason: Some("rejected-saturated".to_string()),
        }
    }

    fn body(text: &'static str) -> BodyRead {
        BodyRead::Complete(Bytes::from_static(text.as_bytes()))
    }

    #[test]
    fn status_table() {
        for status in [100, 200, 201, 204, 302, 304, 399] {
            assert!(
                matches!(classify_response(head(status), body("b")), Outcome::Success { status: s, .. } if s == status),
                "{status}"
            );
        }
        for status in [400, 401, 404, 413, 499] {
            let outcome = classify_response(head(status), body("b"));
            assert!(matches!(outcome, Outcome::Terminal { .. }), "{status}");
        }
        for status in [500, 502, 503, 504, 599, 600] {
            let outcome = classify_response(head(status), body("b"));
            assert!(
                matches!(outcome, Outcome::Retry { reason: RetryReason::ServerError, shed: false, status: Some(s), retry_after: Some(_), .. } if s == status),
                "{status}"
            );
        }
        let outcome = classify_response(head(429), body("busy"));
        assert!(matches!(
            outcome,
            Outcome::Retry {
                reason: RetryReason::RateLimited,
                shed: true,
                status: Some(429),
                retry_after: Some(_),
                ..
            }
        ));
    }

    #[test]
    fn only_a_429_with_an_evicted_reason_is_an_eviction() {
        let with = |status, reason: Option<&str>| {
            let head = ResponseHead {
                status,
                retry_after: None,
                dropped_reason: reason.map(str::to_owned),
            };
            classify_response(head, body("request evicted by flow control")).evicted()
        };
        assert!(with(429, Some("evicted")));
        assert!(with(429, Some("evicted-priority")));
        assert!(!with(429, Some("rejected-saturated")));
        assert!(!with(429, None));
        assert!(!with(503, Some("evicted")));
        assert!(!with(200, Some("evicted")));
    }

    #[test]
    fn terminal_ignores_retry_after_but_keeps_body() {
        let outcome = classify_response(head(400), body(r#"{"error":"bad model"}"#));
        match outcome {
            Outcome::Terminal {
                status,
                body,
                error,
            } => {
                assert_eq!(status, 400);
                assert_eq!(&body[..], br#"{"error":"bad model"}"#);
                assert_eq!(
                    error.to_string(),
                    "INVALID_REQ: client error: status code 400 (dropped: rejected-saturated)"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_cut_body_is_retried_without_its_status_or_bytes_whatever_the_status() {
        for status in [200, 400, 429, 503] {
            for timed_out in [false, true] {
                let outcome = classify_response(
                    head(status),
                    BodyRead::Failed {
                        partial: Bytes::from_static(b"par"),
                        cause: "connection closed".to_string(),
                        timed_out,
                    },
                );
                match outcome {
                    Outcome::Retry {
                        status: s,
                        body,
                        reason,
                        retry_after,
                        shed,
                        error,
                    } => {
                        assert_eq!(s, None, "a cut {status} is no HTTP answer");
                        assert_eq!(body, None);
                        assert!(!shed);
                        let (want, by) = if timed_out {
                            (RetryReason::Timeout, "the attempt's time ran out")
                        } else {
                            (RetryReason::BodyRead, "the connection failed")
                        };
                        assert_eq!(reason, want);
                        assert_eq!(retry_after, Some(Duration::from_secs(3)));
                        assert_eq!(
                            error.to_string(),
                            format!(
                                "SERVER_ERROR: failed to read response: status code {status}, \
                                 body cut after 3 bytes ({by}) (dropped: rejected-saturated) \
                                 (caused by: connection closed)"
                            )
                        );
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn oversized_body_is_fatal() {
        let outcome = classify_response(head(200), BodyRead::TooLarge { limit: 10 });
        assert!(matches!(outcome, Outcome::Fatal { .. }));
        assert_eq!(outcome.status(), None);
    }

    #[test]
    fn client_error_text_matches_go() {
        let e = ClientError::new(ErrorCategory::RateLimit, "rate limited: status code 429")
            .with_dropped_reason(Some("rejected-saturated".to_string()));
        assert_eq!(
            e.to_string(),
            "RATE_LIMIT: rate limited: status code 429 (dropped: rejected-saturated)"
        );
        let e = ClientError::new(ErrorCategory::Unknown, "failed to send request")
            .with_dropped_reason(Some(String::new()))
            .with_cause("connection refused");
        assert_eq!(
            e.to_string(),
            "UNKNOWN: failed to send request (caused by: connection refused)"
        );
        assert_eq!(
            e.inference_error_message(),
            "Failed to send request to inference: UNKNOWN: failed to send request \
             (caused by: connection refused)"
        );
        let fatal = request_failure("relative URL without a base".to_string());
        assert_eq!(
            fatal.client_error().map(ToString::to_string).as_deref(),
            Some("INVALID_REQ: failed to create request (caused by: relative URL without a base)")
        );
    }
}
