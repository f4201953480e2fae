//! Refusals before reading, all in OpenAI's shape: the layers [`crate::server::router`] puts
//! around the `/v1` routes.
//!
//! - [`key_first`]: a call whose API key is missing or unknown is refused from its headers,
//!   before any byte of its body is read (an unauthenticated 15 MB body costs a read buffer,
//!   not 15 MB). hyper then reads at most one more chunk of the unread body and closes.
//! - [`openai_errors`]: axum's extractor rejections (413 over a body limit, 415 without a
//!   JSON content type, bad JSON, bad UTF-8, a bad path or query) answer plain text; every
//!   `/v1` answer of 400 or more that is not JSON gets OpenAI's `{"error": {...}}` shape with
//!   its status and text kept.
//! - [`upload_budget`]: an upload's body carries a [`Budget`]: while the form is read, the file
//!   limit plus room for the form's small fields; once the upload is refused, the drain cap.
//!   The budget counts bytes as they come off the connection, so a refusal stops reading at the
//!   cap even when multer would read an unfinished field through first.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper::body::{Frame, SizeHint};

use crate::error::ApiError;
use crate::state::App;

/// The most of a plain-text refusal's body kept as its message.
const MAX_REFUSAL_TEXT: usize = 16 * 1024;

/// Room for an upload's form fields and multipart framing besides the file itself.
const FORM_ROOM: u64 = 1 << 20;

/// Refuses a call without a known API key before its body is read.
pub async fn key_first(State(app): State<App>, req: Request, next: Next) -> Response {
    if let Err(e) = app.keys.tenant(req.headers()) {
        return e.into_response();
    }
    next.run(req).await
}

/// Gives a plain-text refusal of a `/v1` route OpenAI's error shape.
pub async fn openai_errors(req: Request, next: Next) -> Response {
    let response = next.run(req).await;
    let status = response.status();
    if status.as_u16() < 400 {
        return response;
    }
    let json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/json"));
    if json {
        return response;
    }
    let text = match axum::body::to_bytes(response.into_body(), MAX_REFUSAL_TEXT).await {
        Ok(bytes) if !bytes.is_empty() => String::from_utf8_lossy(&bytes).into_owned(),
        _ => status
            .canonical_reason()
            .unwrap_or("The request was refused")
            .to_owned(),
    };
    refusal(status, text).into_response()
}

/// An OpenAI-shaped refusal of `status` saying `message`.
fn refusal(status: StatusCode, message: String) -> ApiError {
    let error = ApiError::invalid(message, None).with_status(status);
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => error.with_code("request_too_large"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => error.with_code("unsupported_media_type"),
        s if s.is_server_error() => ApiError {
            kind: "server_error",
            ..error
        },
        _ => error,
    }
}

/// How many more bytes of an upload's body may be read, shared by its body and its handler.
#[derive(Debug, Clone)]
pub struct Budget(Arc<AtomicU64>);

impl Budget {
    /// The upload was refused: at most `cap` more bytes are read (fewer when fewer were left).
    pub fn drain(&self, cap: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left.min(cap))
            });
    }

    /// Takes `n` bytes; `false` when fewer were left.
    fn take(&self, n: u64) -> bool {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                left.checked_sub(n)
            })
            .is_ok()
    }
}

/// The body of an upload, read within its [`Budget`].
struct Budgeted {
    inner: Body,
    budget: Budget,
}

/// The error of an upload body read past its budget.
#[derive(Debug, thiserror::Error)]
#[error("the upload is larger than the server reads")]
struct OverBudget;

impl hyper::body::Body for Budgeted {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::BoxError>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                let n = frame.data_ref().map_or(0, |d| d.len() as u64);
                if self.budget.take(n) {
                    Poll::Ready(Some(Ok(frame)))
                } else {
                    Poll::Ready(Some(Err(Box::new(OverBudget))))
                }
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// Puts an upload's body under a [`Budget`] (the file limit and room for the form), handed to
/// the handler as an extension.
pub async fn upload_budget(State(app): State<App>, req: Request, next: Next) -> Response {
    let budget = Budget(Arc::new(AtomicU64::new(
        app.settings.limits.max_file_bytes.saturating_add(FORM_ROOM),
    )));
    let (mut parts, body) = req.into_parts();
    parts.extensions.insert(budget.clone());
    let body = Body::new(Budgeted {
        inner: body,
        budget,
    });
    next.run(Request::from_parts(parts, body)).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_only_lowers_the_budget() {
        let b = Budget(Arc::new(AtomicU64::new(100)));
        assert!(b.take(60));
        b.drain(1000);
        assert!(!b.take(41));
        assert!(b.take(40));
        let b = Budget(Arc::new(AtomicU64::new(100)));
        b.drain(10);
        assert!(!b.take(11));
    }
}
