//! One connection's state as its watchdog sees it (reading a head, serving requests, or idle),
//! and [`Watched`], the stream that reports bytes read to it. The service marks requests in
//! progress ([`Activity::start`], [`Activity::end`]); [`Activity::expired`] resolves when the
//! state has lasted past its limit, and the server then closes the connection.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::ConnLimits;

const IDLE: u8 = 0;
const HEAD: u8 = 1;
const BUSY: u8 = 2;

/// One connection's state: idle, reading a head, or serving requests.
#[derive(Debug)]
pub(crate) struct Activity {
    base: Instant,
    state: AtomicU8,
    /// Milliseconds after `base` the state began.
    since_ms: AtomicU64,
    in_flight: AtomicUsize,
    changed: Notify,
}

impl Activity {
    pub(crate) fn new() -> Activity {
        Activity {
            base: Instant::now(),
            // A new connection is reading its first head: it has the header-read timeout.
            state: AtomicU8::new(HEAD),
            since_ms: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            changed: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.base.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Bytes arrived: on an idle connection, a head has begun.
    fn read_some(&self) {
        if self.in_flight.load(Ordering::Acquire) == 0
            && self
                .state
                .compare_exchange(IDLE, HEAD, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            self.since_ms.store(self.now_ms(), Ordering::Release);
            self.changed.notify_one();
        }
    }

    /// A whole head arrived: a request is in progress.
    pub(crate) fn start(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.state.store(BUSY, Ordering::Release);
        self.changed.notify_one();
    }

    /// A request's response is done (or dropped).
    pub(crate) fn end(&self) {
        if self.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.since_ms.store(self.now_ms(), Ordering::Release);
            self.state.store(IDLE, Ordering::Release);
            self.changed.notify_one();
        }
    }

    /// Resolves when the connection has been in one state past its limit, with why.
    pub(crate) async fn expired(&self, limits: &ConnLimits) -> &'static str {
        loop {
            let (limit, why) = match self.state.load(Ordering::Acquire) {
                HEAD => (limits.header_read_timeout, "no whole request head in time"),
                IDLE => (limits.idle_timeout, "idle"),
                _ => {
                    self.changed.notified().await;
                    continue;
                }
            };
            let since = Duration::from_millis(self.since_ms.load(Ordering::Acquire));
            let deadline = self.base + since + limit;
            if Instant::now() >= deadline {
                return why;
            }
            tokio::select! {
                _ = tokio::time::sleep_until(deadline) => {}
                _ = self.changed.notified() => {}
            }
        }
    }
}

/// A stream that tells its [`Activity`] when bytes arrive.
pub(crate) struct Watched<S> {
    pub(crate) inner: S,
    pub(crate) activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
