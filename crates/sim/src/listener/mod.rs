//! The simulator's own accept loop, so a handler can kill the very connection its request came
//! on. Each accepted TCP stream is wrapped in a [`ConnIo`] whose [`ConnControl`] reaches the
//! handlers through axum's `ConnectInfo`; when a handler calls [`ConnControl::reset`], the next
//! read or write on the stream fails, hyper drops the connection, and the socket closes with a
//! TCP reset instead of an answer.
//!
//! [`TlsSimListener`] does the same over TLS: each accepted TCP stream's handshake runs in its own
//! task (a slow or failing client never holds up the others), and [`Resettable`] on the TLS stream
//! delegates to its TCP stream.
//!
//! Both listeners count every TCP connection they accept (before any TLS handshake) on the
//! counter they are given, the simulator's `connections_accepted`, and hand their connections
//! to `inferq_http::serve_from`, which bounds them as it bounds inferq's own listeners (head and
//! idle timeouts, a bound on open connections: [`ListenerConfig`]); each request on a connection
//! carries its [`ConnControl`] as axum's `ConnectInfo`.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::ConnectInfo;
use axum::serve::Listener;
use inferq_http::{ConnLimits, Connection};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A transport that can be made to close abruptly.
pub(crate) trait Resettable {
    /// Arranges for the coming close to send a reset rather than an orderly shutdown.
    fn arm_reset(&self);
}

impl Resettable for TcpStream {
    #[allow(deprecated)] // Tokio deprecates SO_LINGER because a non-zero linger blocks on drop;
                         // a zero linger never blocks, it just makes close send RST.
    fn arm_reset(&self) {
        if let Err(e) = self.set_linger(Some(Duration::ZERO)) {
            tracing::debug!("could not arm a connection reset: {e}");
        }
    }
}

/// A handle on one connection, cloned into every request that arrives on it.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnControl {
    killed: Arc<AtomicBool>,
}

impl ConnControl {
    /// Condemns the connection: its next I/O fails and it closes without a response.
    pub(crate) fn reset(&self) {
        self.killed.store(true, Ordering::Release);
    }

    fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }
}

/// An accepted stream that fails all I/O once its [`ConnControl`] has been reset.
#[derive(Debug)]
pub(crate) struct ConnIo<S> {
    inner: S,
    control: ConnControl,
    armed: bool,
}

impl<S: Resettable> ConnIo<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            control: ConnControl::default(),
            armed: false,
        }
    }

    /// `Some(error)` once the connection has been condemned; arms the reset on first call.
    fn killed(&mut self) -> Option<io::Error> {
        if !self.control.is_killed() {
            return None;
        }
        if !self.armed {
            self.inner.arm_reset();
            self.armed = true;
        }
        Some(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "connection reset by the simulator's reset fault",
        ))
    }
}

impl<S: AsyncRead + Resettable + Unpin> AsyncRead for ConnIo<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Resettable + Unpin> AsyncWrite for ConnIo<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if let Some(e) = self.killed() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl<S> Connection for ConnIo<S>
where
    S: AsyncRead + AsyncWrite + Resettable + Unpin + Send + 'static,
{
    /// Every request on the connection carries its [`ConnControl`], for the reset fault.
    fn tag(&self, extensions: &mut http::Extensions) {
        extensions.insert(ConnectInfo(self.control.clone()));
    }
}

/// A TCP listener that hands out [`ConnIo`] streams with `TCP_NODELAY` set.
#[derive(Debug)]
pub(crate) struct SimListener {
    inner: TcpListener,
    accepted: Arc<AtomicU64>,
}

impl SimListener {
    /// Wraps a bound listener; every accepted connection adds one to `accepted`.
    pub(crate) fn new(inner: TcpListener, accepted: Arc<AtomicU64>) -> Self {
        Self { inner, accepted }
    }
}

impl Listener for SimListener {
    type Io = ConnIo<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        let (stream, addr) = accept_tcp(&self.inner, &self.accepted).await;
        (ConnIo::new(stream), addr)
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// Accepts the next TCP connection, with `TCP_NODELAY` set (small answers on kept-alive
/// connections must not wait for Nagle), and counts it on `accepted`. Cancel-safe: no
/// connection is lost (or counted without being returned) if dropped.
async fn accept_tcp(listener: &TcpListener, accepted: &AtomicU64) -> (TcpStream, SocketAddr) {
    loop {
        match listener.accept().await {
            Ok((stream, addr)) => {
                accepted.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!("could not set TCP_NODELAY: {e}");
                }
                return (stream, addr);
            }
            // The peer gave up before we accepted; nothing to wait for.
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                ) => {}
            // Out of file descriptors and the like: back off rather than spin.
            Err(e) => {
                tracing::warn!("simulator accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

impl Resettable for TlsStream<TcpStream> {
    fn arm_reset(&self) {
        self.get_ref().0.arm_reset();
    }
}

/// How long a TLS handshake may take before the connection is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

type Handshaken = (ConnIo<TlsStream<TcpStream>>, SocketAddr);

/// A TCP listener that hands out TLS streams once their handshake is done.
pub(crate) struct TlsSimListener {
    inner: TcpListener,
    accepted: Arc<AtomicU64>,
    acceptor: TlsAcceptor,
    done_tx: mpsc::Sender<Handshaken>,
    done_rx: mpsc::Receiver<Handshaken>,
}

impl TlsSimListener {
    /// Wraps a bound listener; every accepted TCP connection adds one to `accepted`, whether
    /// or not its handshake then succeeds.
    pub(crate) fn new(inner: TcpListener, accepted: Arc<AtomicU64>, acceptor: TlsAcceptor) -> Self {
        let (done_tx, done_rx) = mpsc::channel(64);
        Self {
            inner,
            accepted,
            acceptor,
            done_tx,
            done_rx,
        }
    }

    fn handshake(&self, stream: TcpStream, addr: SocketAddr) {
        let acceptor = self.acceptor.clone();
        let done = self.done_tx.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = done.send((ConnIo::new(tls), addr)).await;
                }
                Ok(Err(e)) => tracing::debug!(%addr, "simulator TLS handshake failed: {e}"),
                Err(_) => tracing::debug!(%addr, "simulator TLS handshake timed out"),
            }
        });
    }
}

impl Listener for TlsSimListener {
    type Io = ConnIo<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            tokio::select! {
                Some(ready) = self.done_rx.recv() => return ready,
                (stream, addr) = accept_tcp(&self.inner, &self.accepted) => self.handshake(stream, addr),
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// How the simulator bounds its connections (`--header-read-timeout`, `--idle-timeout`,
/// `--max-connections`), with the defaults of inferq's own listeners: a test or benchmark that
/// leaves connections open against the simulator sees what it would see against inferq.
#[derive(Debug, Clone, clap::Args)]
pub struct ListenerConfig {
    /// A connection that has not sent a whole request head this long after it opened (or after
    /// the first byte of a new request) is closed; a request body stalled this long fails.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,

    /// A keep-alive connection idle between requests this long is closed. A request in
    /// progress (a hang, a long stream) is never idle.
    #[arg(long, default_value = "620s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,

    /// Most connections open at once; past it a connection is answered 503 in OpenAI's error
    /// shape and closed. Default: nine tenths of the open-file limit (raised to the hard limit
    /// at start), less 64.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        Self {
            header_read_timeout: inferq_http::DEFAULT_HEADER_READ_TIMEOUT,
            idle_timeout: inferq_http::DEFAULT_IDLE_TIMEOUT,
            max_connections: None,
        }
    }
}

/// Descriptors the simulator keeps besides its connections (standard streams, the runtime's,
/// the listener, outgoing scrapes).
const FD_RESERVE: u64 = 64;

impl ListenerConfig {
    /// The first bad knob, named as its flag, with why.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        let floor = Duration::from_millis(100);
        if self.header_read_timeout < floor {
            return Err(("header-read-timeout", "must be at least 100ms".into()));
        }
        if self.idle_timeout < floor {
            return Err(("idle-timeout", "must be at least 100ms".into()));
        }
        if self.max_connections == Some(0) {
            return Err(("max-connections", "must be at least 1".into()));
        }
        Ok(())
    }

    /// The bounds to serve with; the default bound of connections raises the open-file limit
    /// to its hard limit first.
    pub(crate) fn limits(&self) -> ConnLimits {
        let max_connections = self.max_connections.unwrap_or_else(|| {
            let soft = inferq_http::fd_limit::raise().soft;
            ConnLimits::default_max_connections(soft, FD_RESERVE)
        });
        ConnLimits {
            header_read_timeout: self.header_read_timeout,
            idle_timeout: self.idle_timeout,
            max_connections,
        }
    }
}

#[cfg(test)]
mod tests;
