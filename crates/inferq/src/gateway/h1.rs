//! The HTTP/1.1 path to the gateway, cleartext or TLS: keep-alive connections that inferq holds
//! itself, one request at a time on each, with nothing between a worker and hyper's connection
//! but a short lock on the idle list.
//!
//! A [`Direct`] target (an `http://` or `https://` URL without user info, its `Host` header,
//! origin-form URI and certificate name worked out once per queue) and a request's headers and
//! body enter [`Connections::send`]; a response head with its body stream leaves, together with
//! the [`Held`] connection that the caller hands back with [`Connections::keep`] once it has read
//! the body to the end. A TLS gateway is offered HTTP/2 and HTTP/1.1 by ALPN, as reqwest offers
//! them; one that chooses HTTP/2 is remembered (for [`HTTP2_MEMORY`], then asked again) and
//! answered [`Sent::Http2`], and its requests go through reqwest in [`super::client`], as do URLs
//! with user info and redirects to follow.
//!
//! Why: reqwest is built for any request to anywhere. Each call converts the URL, goes through
//! the redirect and retry layers and checks a connection out of a general pool keyed by scheme
//! and host. For the one POST per request that inferq sends to one gateway, that was a third of
//! the processor's CPU per request (41 µs before, 28 µs after, on the benchmark's drain through
//! the node gateway; docs/benchmarks.md has the figures), and over TLS about 40 µs before and
//! 30 µs after (100k drains through the simulator serving HTTPS/1.1).
//!
//! Semantics kept from the reqwest path: a request that hyper reports as not sent (its connection
//! closed while idle) is sent again on a new connection, as Go's transport does for a request
//! nothing of which was written; an idle connection is not used after [`IDLE_TIMEOUT`], and is
//! closed by then or within a [`SWEEP_EVERY`] after (a sweep runs while any are kept, so a
//! processor gone quiet does not hold the gateway's sockets open); at most `max_idle` are kept
//! per origin; dropping the future of
//! a send closes its connection, so the gateway sees the request go away. A checked-out
//! connection is awaited until it is ready: one whose last response was read a moment ago is
//! reused rather than replaced by a new dial.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::{HeaderMap, HeaderValue, ACCEPT, HOST, USER_AGENT};
use hyper::{Method, Request, Response, Uri};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_rustls::TlsConnector;

/// How long an idle keep-alive connection is kept (Go's `IdleConnTimeout`).
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// How often the idle connections are looked over for ones past [`IDLE_TIMEOUT`] or closed.
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(15);

/// How long a TLS origin that chose HTTP/2 goes through the general client before a new
/// connection asks it again: a gateway that goes back to HTTP/1.1 (a changed ingress) gets
/// inferq's own connections back without a restart.
pub(crate) const HTTP2_MEMORY: Duration = Duration::from_secs(600);

/// A target of inferq's own connections, worked out once from its URL.
#[derive(Debug, Clone)]
pub(crate) struct Direct {
    /// `scheme://host[:port]`: the pool key (an `http` and an `https` target on one host never
    /// share connections).
    origin: String,
    /// `host[:port]`.
    host_header: HeaderValue,
    /// What to dial.
    host: String,
    port: u16,
    /// `/path?query`.
    uri: Uri,
    /// The name the certificate must carry, for `https`; `None` for cleartext.
    server_name: Option<ServerName<'static>>,
}

impl Direct {
    /// `None` when the URL needs the general client: neither `http` nor `https`, or with user
    /// info (reqwest turns it into an `Authorization` header), or with parts hyper's URI would
    /// not take as they are.
    pub(crate) fn of(url: &reqwest::Url) -> Option<Direct> {
        let tls = match url.scheme() {
            "http" => false,
            "https" => true,
            _ => return None,
        };
        if !url.username().is_empty() || url.password().is_some() {
            return None;
        }
        let host = match url.host()? {
            url::Host::Domain(name) => name.to_owned(),
            url::Host::Ipv4(ip) => ip.to_string(),
            url::Host::Ipv6(ip) => ip.to_string(),
        };
        let port = url.port_or_known_default()?;
        let authority = &url[url::Position::BeforeHost..url::Position::AfterPort];
        let origin = format!("{}://{authority}", url.scheme());
        let uri = url[url::Position::BeforePath..url::Position::AfterQuery]
            .parse::<Uri>()
            .ok()?;
        let host_header = HeaderValue::from_str(authority).ok()?;
        let server_name = match tls {
            true => Some(ServerName::try_from(host.clone()).ok()?),
            false => None,
        };
        Some(Direct {
            origin,
            host_header,
            host,
            port,
            uri,
            server_name,
        })
    }
}

/// A connection checked out for one request.
pub(crate) struct Held {
    sender: Sender,
}

/// What a send came to, short of a failure.
pub(crate) enum Sent {
    /// The response head, its body to read, and the connection to hand back after.
    Response(Response<Incoming>, Held),
    /// The TLS gateway chose HTTP/2 by ALPN (now or on an earlier connection): nothing was sent,
    /// and the request goes through the general client, which speaks it.
    Http2,
}

/// Why a send failed before a response head.
#[derive(Debug)]
pub(crate) enum SendFailure {
    /// Dialling failed (refused, DNS, HTTP handshake).
    Connect(std::io::Error),
    /// The TLS handshake failed: refused (the certificate not trusted, expired or for another
    /// name, or the gateway refusing ours), or cut short.
    Tls(std::io::Error),
    /// The connection failed with the request on it.
    Transport(hyper::Error),
}

/// One side of a connection, as hyper hands it out.
type Sender = SendRequest<Full<Bytes>>;

/// What the connections and their sweep task share.
struct Pool {
    /// Idle connections, per origin, newest last, each with the time it went idle.
    idle: Mutex<HashMap<String, Vec<(Sender, Instant)>>>,
    /// Whether a sweep task is running (it ends once nothing is idle).
    sweeping: AtomicBool,
    /// The TLS origins that chose HTTP/2, each until when it is remembered: meanwhile their
    /// requests go through the general client.
    http2: Mutex<HashMap<String, Instant>>,
}

impl Pool {
    fn idle(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<(Sender, Instant)>>> {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn http2(&self) -> std::sync::MutexGuard<'_, HashMap<String, Instant>> {
        self.http2.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `origin` chose HTTP/2 within its memory; a lapsed entry is forgotten.
    fn remembers_http2(&self, origin: &str, now: Instant) -> bool {
        let mut http2 = self.http2();
        match http2.get(origin) {
            Some(until) if *until > now => true,
            Some(_) => {
                http2.remove(origin);
                false
            }
            None => false,
        }
    }
}

/// How long a connection may stay idle, and how often that is looked at.
#[derive(Debug, Clone, Copy)]
struct Timing {
    idle_timeout: Duration,
    sweep_every: Duration,
}

/// The idle connections and how many to keep.
pub(crate) struct Connections {
    pool: Arc<Pool>,
    max_idle: usize,
    /// [`IDLE_TIMEOUT`] and [`SWEEP_EVERY`] (shorter in tests).
    timing: Timing,
    user_agent: HeaderValue,
    /// For `https` targets; offers HTTP/2 and HTTP/1.1, as the general client does.
    tls: TlsConnector,
    /// [`HTTP2_MEMORY`] (shorter in tests).
    http2_memory: Duration,
}

impl std::fmt::Debug for Connections {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connections")
            .field("max_idle", &self.max_idle)
            .finish_non_exhaustive()
    }
}

impl Connections {
    pub(crate) fn new(
        max_idle: usize,
        user_agent: &'static str,
        tls: Arc<rustls::ClientConfig>,
    ) -> Connections {
        Connections {
            pool: Arc::new(Pool {
                idle: Mutex::new(HashMap::new()),
                sweeping: AtomicBool::new(false),
                http2: Mutex::new(HashMap::new()),
            }),
            max_idle,
            timing: Timing {
                idle_timeout: IDLE_TIMEOUT,
                sweep_every: SWEEP_EVERY,
            },
            user_agent: HeaderValue::from_static(user_agent),
            tls: TlsConnector::from(tls),
            http2_memory: HTTP2_MEMORY,
        }
    }

    /// The same with a shorter HTTP/2 memory, for tests.
    #[cfg(test)]
    pub(crate) fn with_http2_memory(mut self, memory: Duration) -> Connections {
        self.http2_memory = memory;
        self
    }

    /// The idle connections kept, over all origins: how many, and how many of them are known
    /// to be closed (their hyper task saw the gateway close them). For tests.
    #[cfg(test)]
    pub(crate) fn idle_and_closed(&self) -> (usize, usize) {
        let idle = self.pool.idle();
        let kept: Vec<&Sender> = idle.values().flatten().map(|(sender, _)| sender).collect();
        let closed = kept.iter().filter(|sender| sender.is_closed()).count();
        (kept.len(), closed)
    }

    /// POSTs `body` to `target` with `headers` (plus `Host`, `User-Agent` and `Accept` as reqwest
    /// sent them). A request that an idle connection refused unsent goes out on a new one.
    pub(crate) async fn send(
        &self,
        target: &Direct,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Sent, SendFailure> {
        headers.insert(HOST, target.host_header.clone());
        if !headers.contains_key(USER_AGENT) {
            headers.insert(USER_AGENT, self.user_agent.clone());
        }
        if !headers.contains_key(ACCEPT) {
            headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        }
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = target.uri.clone();
        *request.headers_mut() = headers;

        while let Some(mut sender) = self.idle_one(&target.origin) {
            // A connection whose last response was just read may not have taken note yet.
            if sender.ready().await.is_err() {
                continue;
            }
            match sender.try_send_request(request).await {
                Ok(response) => return Ok(Sent::Response(response, Held { sender })),
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(SendFailure::Transport(failed.into_error())),
                },
            }
        }
        // Boxed: a dial (with its TLS handshake) is rare, and inline its state would more than
        // double the size of every request's future, which is moved as the request's task.
        // An origin that chose HTTP/2 never has idle connections, so it is only looked up here.
        let Some(mut sender) = Box::pin(self.dial(target)).await? else {
            return Ok(Sent::Http2);
        };
        match sender.send_request(request).await {
            Ok(response) => Ok(Sent::Response(response, Held { sender })),
            Err(e) => Err(SendFailure::Transport(e)),
        }
    }

    /// Hands a connection whose response was read to the end back for the next request.
    pub(crate) fn keep(&self, target: &Direct, held: Held) {
        let mut idle = self.pool.idle();
        if !idle.contains_key(&target.origin) {
            idle.insert(target.origin.clone(), Vec::new());
        }
        let Some(list) = idle.get_mut(&target.origin) else {
            return;
        };
        let now = Instant::now();
        if list.len() >= self.max_idle {
            // The oldest entries may be connections the gateway has closed since, or past the
            // idle timeout: make room by dropping those before turning a live one away.
            list.retain(|(sender, since)| usable(sender, *since, now, self.timing));
        }
        if list.len() < self.max_idle && !held.sender.is_closed() {
            list.push((held.sender, now));
            drop(idle);
            self.start_sweep();
        }
    }

    /// Starts a sweep task unless one is running.
    fn start_sweep(&self) {
        let sweeping = &self.pool.sweeping;
        // Read first: the flag's line stays shared while a sweep runs.
        if sweeping.load(Ordering::Acquire) || sweeping.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(sweep(Arc::downgrade(&self.pool), self.timing));
            }
            // Outside a runtime nothing sweeps; the next `keep` in one tries again.
            Err(_) => sweeping.store(false, Ordering::Release),
        }
    }

    /// The newest idle connection to `origin` that is still open and not past the idle timeout.
    fn idle_one(&self, origin: &str) -> Option<Sender> {
        let mut idle = self.pool.idle();
        let list = idle.get_mut(origin)?;
        let now = Instant::now();
        while let Some((sender, since)) = list.pop() {
            if usable(&sender, since, now, self.timing) {
                return Some(sender);
            }
        }
        None
    }
}

/// Every [`SWEEP_EVERY`], drops the idle connections that may carry no more requests (which
/// closes them); ends when nothing is left idle (the next [`Connections::keep`] starts another)
/// or the connections themselves are gone.
async fn sweep(pool: Weak<Pool>, timing: Timing) {
    loop {
        tokio::time::sleep(timing.sweep_every).await;
        let Some(pool) = pool.upgrade() else {
            return;
        };
        let mut idle = pool.idle();
        let now = Instant::now();
        for list in idle.values_mut() {
            list.retain(|(sender, since)| usable(sender, *since, now, timing));
        }
        idle.retain(|_, list| !list.is_empty());
        if idle.is_empty() {
            // Cleared under the lock: a `keep` pushing after this starts the next sweep.
            pool.sweeping.store(false, Ordering::Release);
            return;
        }
    }
}

/// Whether an idle connection may carry another request: still open, and idle for less than
/// [`IDLE_TIMEOUT`]. One that is not is dropped, which closes it.
fn usable(sender: &Sender, idle_since: Instant, now: Instant, timing: Timing) -> bool {
    !sender.is_closed() && now.duration_since(idle_since) < timing.idle_timeout
}

impl Connections {
    /// Opens a connection to `target` (with TLS for `https`) and starts its hyper task; `None`
    /// when the TLS gateway chose HTTP/2, now (the connection is closed again and the origin
    /// remembered) or before.
    async fn dial(&self, target: &Direct) -> Result<Option<Sender>, SendFailure> {
        if target.server_name.is_some() && self.pool.remembers_http2(&target.origin, Instant::now())
        {
            return Ok(None);
        }
        let stream = TcpStream::connect((target.host.as_str(), target.port))
            .await
            .map_err(SendFailure::Connect)?;
        stream.set_nodelay(true).map_err(SendFailure::Connect)?;
        let Some(name) = &target.server_name else {
            return handshake(stream).await.map(Some);
        };
        let stream = self
            .tls
            .connect(name.clone(), stream)
            .await
            .map_err(SendFailure::Tls)?;
        if stream.get_ref().1.alpn_protocol() == Some(b"h2") {
            let until = Instant::now() + self.http2_memory;
            self.pool.http2().insert(target.origin.clone(), until);
            return Ok(None);
        }
        handshake(stream).await.map(Some)
    }
}

/// Starts HTTP/1.1 on a connected `stream`, and its hyper task.
async fn handshake<S>(stream: S) -> Result<Sender, SendFailure>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (sender, connection) = http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| SendFailure::Connect(std::io::Error::other(e)))?;
    tokio::spawn(async move {
        // The connection's end (the gateway closed it, or its sender was dropped) is no error of
        // any request: a request on it has already seen its own failure.
        let _ = connection.await;
    });
    Ok(sender)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn direct(url: &str) -> Option<Direct> {
        match reqwest::Url::parse(url) {
            Ok(parsed) => Direct::of(&parsed),
            Err(e) => panic!("{url}: {e}"),
        }
    }

    /// A kept connection that carries no further request is closed once past the idle timeout,
    /// not held open until a request next looks at the idle list.
    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(l) => l,
            Err(e) => panic!("bind: {e}"),
        };
        let addr = match listener.local_addr() {
            Ok(a) => a,
            Err(e) => panic!("local_addr: {e}"),
        };
        let (closed_tx, closed_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut seen = Vec::new();
            let mut chunk = [0u8; 1024];
            while !seen.ends_with(b"\r\n\r\n{}") {
                match stream.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => seen.extend_from_slice(&chunk[..n]),
                }
            }
            let reply = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(reply).await.is_err() {
                return;
            }
            // Keep-alive: the connection stays open until the client closes it.
            while let Ok(n) = stream.read(&mut chunk).await {
                if n == 0 {
                    break;
                }
            }
            let _ = closed_tx.send(Instant::now());
        });

        let tls = match crate::gateway::GatewayTls::default()
            .client_config_on(inferq_client::Roots::system())
        {
            Ok(config) => Arc::new(config),
            Err(e) => panic!("tls: {e}"),
        };
        let mut connections = Connections::new(4, "test", tls);
        connections.timing = Timing {
            idle_timeout: Duration::from_millis(400),
            sweep_every: Duration::from_millis(100),
        };
        let Some(target) = direct(&format!("http://{addr}/v1")) else {
            panic!("a cleartext URL");
        };
        let sent = connections
            .send(&target, HeaderMap::new(), Bytes::from_static(b"{}"))
            .await;
        let (response, held) = match sent {
            Ok(Sent::Response(response, held)) => (response, held),
            Ok(Sent::Http2) => panic!("a cleartext target never goes HTTP/2"),
            Err(e) => panic!("send: {e:?}"),
        };
        if let Err(e) = http_body_util::BodyExt::collect(response.into_body()).await {
            panic!("body: {e}");
        }
        let kept = Instant::now();
        connections.keep(&target, held);

        let closed = match tokio::time::timeout(Duration::from_secs(5), closed_rx).await {
            Ok(Ok(at)) => at,
            _ => panic!("the idle connection was still open 5 s after it went idle"),
        };
        let idle_for = closed.duration_since(kept);
        assert!(
            idle_for >= Duration::from_millis(400),
            "closed after {idle_for:?} idle, before the idle timeout"
        );
    }

    /// Which gateway URLs inferq's own connections serve, and what they dial and send.
    #[test]
    fn urls_without_user_info_take_the_own_path() {
        let Some(p) = direct("http://gw.example:8000/v1/chat/completions?x=1#frag") else {
            panic!("a cleartext URL must take the own path");
        };
        assert_eq!((p.host.as_str(), p.port), ("gw.example", 8000));
        assert_eq!(p.origin, "http://gw.example:8000");
        assert_eq!(p.host_header, "gw.example:8000");
        assert_eq!(p.uri.to_string(), "/v1/chat/completions?x=1");

        // The default port is dialled but not written into Host, as reqwest and Go write it.
        let Some(p) = direct("http://gw.example/v1") else {
            panic!("default port");
        };
        assert_eq!(
            (p.port, p.host_header.to_str().ok()),
            (80, Some("gw.example"))
        );

        // An IPv6 literal is dialled without its brackets and sent with them.
        let Some(p) = direct("http://[::1]:9000/v1") else {
            panic!("IPv6");
        };
        assert_eq!(
            (p.host.as_str(), p.host_header.to_str().ok()),
            ("::1", Some("[::1]:9000"))
        );

        // HTTPS too, checking the certificate against the host's name; URLs with user info (an
        // Authorization header) stay with reqwest.
        let Some(p) = direct("https://gw.example/v1") else {
            panic!("https");
        };
        assert_eq!(p.port, 443);
        assert_eq!(
            p.server_name.as_ref().map(|n| n.to_str().into_owned()),
            Some("gw.example".to_owned())
        );
        // The same host over http and https: never each other's connections.
        assert_eq!(p.host_header, "gw.example");
        assert_eq!(p.origin, "https://gw.example");
        assert_eq!(
            direct("http://gw.example/v1").map(|p| p.origin),
            Some("http://gw.example".to_owned())
        );
        assert_eq!(
            direct("http://gw.example/v1").map(|p| p.server_name),
            Some(None)
        );
        assert!(direct("https://user:secret@gw.example/v1").is_none());
        assert!(direct("http://user:secret@gw.example/v1").is_none());
        assert!(direct("http://user@gw.example/v1").is_none());
    }
}
