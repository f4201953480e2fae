//! The bodies a bounded connection wraps: the request body, [`Stalling`], fails when no byte
//! arrives for the header-read timeout; the response body, [`Guarded`], keeps its request in
//! progress (never idle) until it is done or dropped.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use hyper::body::{Frame, Incoming, SizeHint};
use tokio::time::Sleep;

use crate::activity::Activity;

/// Ends its request on the [`Activity`] when dropped (the response body done, or the request
/// abandoned).
pub(crate) struct InProgress(pub(crate) Arc<Activity>);

impl Drop for InProgress {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// A response body that keeps its request in progress until it is done.
pub(crate) struct Guarded {
    pub(crate) inner: Body,
    pub(crate) _request: InProgress,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request body that fails when no byte arrives for `gap`.
pub(crate) struct Stalling {
    inner: Incoming,
    gap: Duration,
    /// Armed while the reader waits for bytes.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Stalling {
    pub(crate) fn new(inner: Incoming, gap: Duration) -> Stalling {
        Stalling {
            inner,
            gap,
            timer: None,
        }
    }
}

/// The error of a request body that stalled.
#[derive(Debug, thiserror::Error)]
#[error("the request body stalled: no byte for {0:?}")]
pub struct BodyStalled(Duration);

impl hyper::body::Body for Stalling {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(frame) => {
                self.timer = None;
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let gap = self.gap;
                let timer = self
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(gap)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(BodyStalled(gap))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
