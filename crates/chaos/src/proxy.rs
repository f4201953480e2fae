//! A TCP proxy between the processors and Redis that the chaos run can break: [`Proxy::cut`]
//! drops every open connection at once (the clients see a reset and reconnect), and
//! [`Proxy::stall`] stops forwarding bytes in both directions — connections stay open, commands
//! and replies wait in the proxy — until it is lifted.
//!
//! Bytes enter on the listener (the processor side), leave to `upstream` (Redis), and replies
//! come back the same way. Connections to an upstream that is down are closed at once, as a
//! refused connection would be.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A running proxy; stops (closing every connection) when dropped.
pub struct Proxy {
    addr: SocketAddr,
    control: Arc<Control>,
    accept: JoinHandle<()>,
}

impl std::fmt::Debug for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Proxy").finish_non_exhaustive()
    }
}

/// What the fault injector switches, shared with every connection task.
struct Control {
    upstream: SocketAddr,
    /// `true` while forwarding is stopped.
    stalled: watch::Sender<bool>,
    /// Cancelled to drop every connection open now; replaced by a fresh token for later ones.
    cut: Mutex<CancellationToken>,
    /// Cancelled when the proxy is dropped.
    closed: CancellationToken,
}

impl Control {
    fn current_cut(&self) -> CancellationToken {
        self.cut
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let control = Arc::new(Control {
            upstream,
            stalled: watch::Sender::new(false),
            cut: Mutex::new(CancellationToken::new()),
            closed: CancellationToken::new(),
        });
        let accept = tokio::spawn(accept_loop(listener, Arc::clone(&control)));
        Ok(Proxy {
            addr,
            control,
            accept,
        })
    }

    /// `redis://127.0.0.1:<port>/`: the Redis URL to hand the processor.
    pub fn redis_url(&self) -> String {
        format!("redis://{}/", self.addr)
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection open now; new ones are accepted as usual.
    pub fn cut(&self) {
        let old = std::mem::replace(
            &mut *self
                .control
                .cut
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
            CancellationToken::new(),
        );
        old.cancel();
    }

    /// Stops (`true`) or resumes (`false`) forwarding on every connection, old and new.
    pub fn stall(&self, on: bool) {
        self.control.stalled.send_replace(on);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.control.closed.cancel();
        self.accept.abort();
    }
}

async fn accept_loop(listener: TcpListener, control: Arc<Control>) {
    loop {
        let accepted = tokio::select! {
            _ = control.closed.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        let Ok((client, _)) = accepted else {
            continue;
        };
        let control = Arc::clone(&control);
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(control.upstream).await else {
                return; // Redis is down: the client sees its connection closed.
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let cut = control.current_cut();
            let (client_read, client_write) = client.into_split();
            let (server_read, server_write) = server.into_split();
            let stalled = control.stalled.subscribe();
            // Either direction ending (EOF, error, cut) ends both: dropping the halves closes
            // both sockets.
            tokio::select! {
                _ = cut.cancelled() => {}
                _ = control.closed.cancelled() => {}
                _ = pump(client_read, server_write, stalled.clone()) => {}
                _ = pump(server_read, client_write, stalled) => {}
            }
        });
    }
}

/// Copies bytes from `from` to `to`, holding each chunk while the proxy is stalled.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, msg: &[u8], limit: Duration) -> Option<Vec<u8>> {
        s.write_all(msg).await.ok()?;
        let mut got = vec![0u8; msg.len()];
        match tokio::time::timeout(limit, s.read_exact(&mut got)).await {
            Ok(Ok(_)) => Some(got),
            _ => None,
        }
    }

    #[tokio::test]
    async fn forwards_stalls_resumes_and_cuts() {
        let proxy = Proxy::start(echo().await).await.unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let long = Duration::from_secs(5);
        assert_eq!(round_trip(&mut s, b"ping", long).await.unwrap(), b"ping");

        proxy.stall(true);
        s.write_all(b"held").await.unwrap();
        let mut got = [0u8; 4];
        let waited = tokio::time::timeout(Duration::from_millis(300), s.read_exact(&mut got)).await;
        assert!(waited.is_err(), "nothing may come back while stalled");
        proxy.stall(false);
        tokio::time::timeout(long, s.read_exact(&mut got))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            &got, b"held",
            "held bytes are delivered once the stall lifts"
        );

        proxy.cut();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(long, s.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
        // New connections work after a cut.
        let mut again = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(
            round_trip(&mut again, b"more", long).await.unwrap(),
            b"more"
        );
    }

    #[tokio::test]
    async fn a_down_upstream_closes_the_connection() {
        let port = inferq_testkit::free_port().unwrap();
        let proxy = Proxy::start(SocketAddr::from(([127, 0, 0, 1], port)))
            .await
            .unwrap();
        let mut s = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "{closed:?}");
    }
}
