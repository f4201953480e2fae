use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Path};
use axum::http::StatusCode;
use axum::routing::{any, post};
use axum::{Json, Router};
use reqwest::header::HeaderValue;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::response::BodyReader;
use super::*;
use crate::gateway::h1::Sent;
use crate::gateway::headers::DROPPED_REASON_HEADER;
use crate::gateway::outcome::BodyRead;
use crate::gateway::{build_headers, ErrorCategory, RetryReason, REQUEST_ID_HEADER};

const GENEROUS: Duration = Duration::from_secs(5);

fn client() -> GatewayClient {
    match GatewayClient::new(&GatewayTls::default(), 4) {
        Ok(client) => client,
        Err(e) => panic!("client: {e}"),
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("local_addr: {e}"),
    };
    (listener, addr)
}

/// The stand-in gateway: one route per behaviour under test.
async fn gateway() -> SocketAddr {
    let app = Router::new()
        .merge(answering_routes())
        .merge(refusing_routes())
        .merge(stalling_routes())
        .merge(redirecting_routes())
        .merge(big_body_routes());
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    addr
}

/// Routes that answer: `/created` echoes the body with 201, `/headers` the request's headers.
fn answering_routes() -> Router {
    Router::new()
        .route(
            "/created",
            post(|body: Bytes| async move { (StatusCode::CREATED, body) }),
        )
        .route(
            "/headers",
            post(|headers: axum::http::HeaderMap| async move {
                let mut seen: BTreeMap<String, String> = BTreeMap::new();
                for (name, value) in &headers {
                    let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
                    seen.entry(name.to_string())
                        .and_modify(|v| {
                            v.push_str(", ");
                            v.push_str(&value);
                        })
                        .or_insert(value);
                }
                Json(seen)
            }),
        )
}

/// Routes that refuse: 429s (with a dropped reason, Retry-After in seconds or as a date), a 400,
/// a 503 with Retry-After.
fn refusing_routes() -> Router {
    Router::new()
        .route(
            "/429",
            post(|| async {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(DROPPED_REASON_HEADER, "rejected-saturated")],
                    "busy",
                )
            }),
        )
        .route(
            "/429-seconds",
            post(|| async {
                (
                    StatusCode::TOO_MANY_REQUESTS,
                    [("retry-after", "7")],
                    "slow down",
                )
            }),
        )
        .route(
            "/429-date",
            post(|| async {
                let at = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(120));
                (StatusCode::TOO_MANY_REQUESTS, [("retry-after", at)], "")
            }),
        )
        .route(
            "/400",
            post(|| async { (StatusCode::BAD_REQUEST, r#"{"error":"bad model"}"#) }),
        )
        .route(
            "/503",
            post(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "5")],
                    "overloaded",
                )
            }),
        )
}

/// `/hang`: answers only after a minute.
fn stalling_routes() -> Router {
    Router::new().route(
        "/hang",
        post(|| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            "late"
        }),
    )
}

/// Redirects: 307 to `/created`, 308 to `/headers`.
fn redirecting_routes() -> Router {
    Router::new()
        .route(
            "/redirect",
            post(|| async { (StatusCode::TEMPORARY_REDIRECT, [("location", "/created")]) }),
        )
        .route(
            "/redirect-to-headers",
            post(|| async { (StatusCode::PERMANENT_REDIRECT, [("location", "/headers")]) }),
        )
}

/// Bodies of 4,000 bytes and more: `/big` in one piece, `/big-chunked` in four chunks.
fn big_body_routes() -> Router {
    Router::new()
        .route("/big", post(|| async { vec![b'x'; 4096] }))
        .route(
            "/big-chunked",
            post(|| async {
                let chunks = (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b'y'; 1000])));
                axum::body::Body::from_stream(futures::stream::iter(chunks))
            }),
        )
}

async fn post_to(
    client: &GatewayClient,
    addr: SocketAddr,
    path: &str,
    body: &'static str,
) -> Attempt {
    let headers = build_headers("", std::iter::empty(), None, "req-1");
    client
        .send(
            &format!("http://{addr}{path}"),
            headers,
            Bytes::from_static(body.as_bytes()),
            GENEROUS,
        )
        .await
}

/// Reads one HTTP/1.1 request (head and Content-Length body) off a raw connection.
async fn read_request(stream: &mut TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return buf;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return buf,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// A raw server for one connection: reads the request, then runs `respond`.
async fn raw_server<F, Fut>(respond: F) -> SocketAddr
where
    F: FnOnce(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        if let Ok((mut stream, _)) = listener.accept().await {
            read_request(&mut stream).await;
            respond(stream).await;
        }
    });
    addr
}

#[tokio::test]
async fn success_keeps_status_and_body() {
    let addr = gateway().await;
    let attempt = post_to(&client(), addr, "/created", r#"{"prompt":"hi"}"#).await;
    assert_eq!(
        attempt.outcome,
        Outcome::Success {
            status: 201,
            body: Bytes::from_static(br#"{"prompt":"hi"}"#)
        }
    );
    assert!(attempt.elapsed < GENEROUS);
}

#[tokio::test]
async fn redirects_are_followed_with_the_body() {
    let addr = gateway().await;
    let attempt = post_to(&client(), addr, "/redirect", "again").await;
    assert_eq!(
        attempt.outcome,
        Outcome::Success {
            status: 201,
            body: Bytes::from_static(b"again")
        }
    );
}

/// POSTs `{}` with `headers` to `url`, which ends at the test gateway's `/headers`, and gives
/// the headers that arrived there (repeated ones joined with ", ").
async fn echoed_headers(url: &str, headers: HeaderMap) -> BTreeMap<String, String> {
    let attempt = client()
        .send(url, headers, Bytes::from_static(b"{}"), GENEROUS)
        .await;
    let Outcome::Success { status: 200, body } = attempt.outcome else {
        panic!("{:?}", attempt.outcome);
    };
    match serde_json::from_slice(&body) {
        Ok(seen) => seen,
        Err(e) => panic!("{e}: {}", String::from_utf8_lossy(&body)),
    }
}

/// A gateway whose `/moved` redirects with `status` to `location` (no body), noting the
/// client address of each request `/moved` gets; `/method` answers with the method, the body
/// and its `Content-Type`, and `/hop/{n}` redirects to `/hop/{n-1}` until `/hop/0` answers
/// 201.
async fn redirecting(
    status: StatusCode,
    location: String,
) -> (SocketAddr, Arc<Mutex<Vec<SocketAddr>>>) {
    let hits = Arc::new(Mutex::new(Vec::new()));
    // Notes the client address of a request to either redirecting route.
    let note = {
        let hits = hits.clone();
        move |peer: SocketAddr| {
            hits.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(peer);
        }
    };
    let (counted, paged) = (note.clone(), note);
    let page_location = location.clone();
    let app =
        Router::new()
            .route(
                "/moved",
                any(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
                    counted(peer);
                    let location = location.clone();
                    async move { (status, [("location", location)]) }
                }),
            )
            .route(
                "/moved-with-a-page",
                any(move |ConnectInfo(peer): ConnectInfo<SocketAddr>| {
                    paged(peer);
                    let location = page_location.clone();
                    let page = format!("<a href=\"{location}\">Temporary Redirect</a>.\n");
                    async move { (status, [("location", location)], page) }
                }),
            )
            .route(
                "/method",
                any(
                    |method: axum::http::Method,
                     headers: axum::http::HeaderMap,
                     body: Bytes| async move {
                        let kind = headers
                            .get("content-type")
                            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                            .unwrap_or_default();
                        format!("{method} {:?} {kind:?}", String::from_utf8_lossy(&body))
                    },
                ),
            )
            .route(
                "/hop/{n}",
                any(|Path(n): Path<u32>| async move {
                    match n {
                        0 => (StatusCode::CREATED, HeaderMap::new()),
                        n => {
                            let mut to = HeaderMap::new();
                            if let Ok(value) = format!("/hop/{}", n - 1).parse() {
                                to.insert("location", value);
                            }
                            (StatusCode::TEMPORARY_REDIRECT, to)
                        }
                    }
                }),
            );
    let (listener, addr) = listener().await;
    tokio::spawn(async move {
        let app = app.into_make_service_with_connect_info::<SocketAddr>();
        let _ = axum::serve(listener, app).await;
    });
    (addr, hits)
}

/// A gateway's redirect goes on to its `Location`: the redirecting endpoint sees the
/// request once, not once more from a resend that follows the redirect from the start. 307
/// and 308 resend the POST with its body; 301, 302 and 303 send a GET without the body or its
/// headers, as reqwest and Go's client do on every hop.
#[tokio::test]
async fn a_redirect_reaches_the_redirecting_endpoint_once() {
    let post: &[u8] = br#"POST "again" "application/json""#;
    let get: &[u8] = br#"GET "" """#;
    for (status, arrived) in [
        (StatusCode::TEMPORARY_REDIRECT, post),
        (StatusCode::PERMANENT_REDIRECT, post),
        (StatusCode::MOVED_PERMANENTLY, get),
        (StatusCode::FOUND, get),
        (StatusCode::SEE_OTHER, get),
    ] {
        let (addr, hits) = redirecting(status, "/method".to_string()).await;
        let attempt = post_to(&client(), addr, "/moved", "again").await;
        assert_eq!(
            attempt.outcome,
            Outcome::Success {
                status: 200,
                body: Bytes::from_static(arrived)
            },
            "{status}"
        );
        assert_eq!(hits.lock().map(|h| h.len()).ok(), Some(1), "{status}");
    }
}

/// A redirect leaves its connection to the gateway open for the next request, whether it
/// comes without a body or with a short page (as nginx sends one): a gateway that redirects
/// every request does not cost a TCP connection per request.
#[tokio::test]
async fn a_redirect_keeps_its_connection() {
    for path in ["/moved", "/moved-with-a-page"] {
        let (addr, hits) = redirecting(StatusCode::TEMPORARY_REDIRECT, "/method".to_string()).await;
        let client = client();
        for _ in 0..3 {
            let attempt = post_to(&client, addr, path, "again").await;
            assert!(
                matches!(attempt.outcome, Outcome::Success { status: 200, .. }),
                "{path}: {:?}",
                attempt.outcome
            );
        }
        let peers = hits.lock().map(|h| h.clone()).unwrap_or_default();
        assert_eq!(peers.len(), 3, "{path}");
        assert!(
            peers.iter().all(|p| *p == peers[0]),
            "{path}: one connection for the three requests: {peers:?}"
        );
    }
}

/// Nine redirects are followed and the tenth fails the request, as Go's default policy has
/// it, the first hop made on inferq's own connection included.
#[tokio::test]
async fn nine_redirects_are_followed_and_the_tenth_fails() {
    let (addr, _) = redirecting(StatusCode::TEMPORARY_REDIRECT, String::new()).await;
    let attempt = post_to(&client(), addr, "/hop/9", "again").await;
    assert_eq!(
        attempt.outcome,
        Outcome::Success {
            status: 201,
            body: Bytes::new()
        }
    );
    let attempt = post_to(&client(), addr, "/hop/10", "again").await;
    let Outcome::Fatal { error } = &attempt.outcome else {
        panic!("{:?}", attempt.outcome);
    };
    // Go's words: `Post "<Location>": stopped after 10 redirects`, naming the Location of
    // the tenth redirect (the one not followed).
    let refused = format!("Post \"http://{addr}/hop/0\": stopped after 10 redirects");
    assert!(error.to_string().contains(&refused), "{error}");
}

/// Credentials do not follow a redirect to another host or port; the rest of the headers do.
#[tokio::test]
async fn credentials_stay_behind_when_a_redirect_leaves_the_host() {
    let elsewhere = gateway().await;
    let (addr, _) = redirecting(
        StatusCode::TEMPORARY_REDIRECT,
        format!("http://{elsewhere}/headers"),
    )
    .await;
    let mut headers = build_headers("batch", [("X-Custom", "1")], None, "req-8");
    headers.insert("authorization", HeaderValue::from_static("Bearer secret"));
    let seen = echoed_headers(&format!("http://{addr}/moved"), headers).await;
    assert_eq!(seen.get("authorization"), None);
    assert_eq!(seen.get("x-custom").map(String::as_str), Some("1"));
    assert_eq!(
        seen.get("referer").map(String::as_str),
        Some(format!("http://{addr}/moved").as_str())
    );
}

/// A redirected request (a gateway's redirect goes on through reqwest) carries
/// the same headers to where it is sent.
#[tokio::test]
async fn redirected_requests_keep_their_headers() {
    let addr = gateway().await;
    let headers = build_headers("batch", [("X-Custom", "1")], None, "req-7");
    let seen = echoed_headers(&format!("http://{addr}/redirect-to-headers"), headers).await;
    assert_eq!(
        seen.get(REQUEST_ID_HEADER).map(String::as_str),
        Some("req-7")
    );
    assert_eq!(seen.get("x-custom").map(String::as_str), Some("1"));
}

#[tokio::test]
async fn headers_are_forwarded() {
    let addr = gateway().await;
    let message = [
        ("X-Custom", "1"),
        ("x-gateway-inference-objective", "interactive"),
        ("x-llm-d-inference-fairness-id", "spoofed"),
    ];
    let headers = build_headers(
        "batch",
        message,
        Some(("x-llm-d-inference-fairness-id", "alice")),
        "req-42",
    );
    let seen = echoed_headers(&format!("http://{addr}/headers"), headers).await;
    let get = |name: &str| seen.get(name).map(String::as_str);
    assert_eq!(get("content-type"), Some("application/json"));
    assert_eq!(get("x-gateway-inference-objective"), Some("interactive"));
    assert_eq!(get("x-custom"), Some("1"));
    assert_eq!(get("x-llm-d-inference-fairness-id"), Some("alice"));
    assert_eq!(get(REQUEST_ID_HEADER), Some("req-42"));
    assert_eq!(get("content-length"), Some("2"));
    assert!(get("user-agent").is_some_and(|ua| ua.starts_with("inferq/")));
    assert_eq!(get("host"), Some(addr.to_string().as_str()));
}

/// A gateway that closes each keep-alive connection after one answer (as servers do when
/// their idle timeout runs out) costs no request: the next one goes out on a new connection.
#[tokio::test]
async fn a_connection_the_gateway_closed_while_idle_costs_no_request() {
    let (listener, addr) = listener().await;
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    // Each answered connection is closed when the test says so, and the test told once it is.
    let (close_tx, mut close_rx) = tokio::sync::mpsc::unbounded_channel::<oneshot::Sender<()>>();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            read_request(&mut stream).await;
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                .await;
            // No `Connection: close`: the client learns of the close only from the socket,
            // after the connection went back to its idle list.
            let closed = close_rx.recv().await;
            drop(stream);
            if let Some(closed) = closed {
                let _ = closed.send(());
            }
        }
    });
    let client = client();
    for n in 1..=3 {
        let attempt = post_to(&client, addr, "/", "{}").await;
        assert_eq!(
            attempt.outcome,
            Outcome::Success {
                status: 200,
                body: Bytes::from_static(b"ok")
            },
            "request {n}"
        );
        assert_eq!(
            client.direct.idle_and_closed(),
            (1, 0),
            "request {n}: its connection is idle"
        );
        let (closed_tx, closed_rx) = oneshot::channel();
        let _ = close_tx.send(closed_tx);
        match tokio::time::timeout(GENEROUS, closed_rx).await {
            Ok(Ok(())) => {}
            _ => panic!("request {n}: the gateway did not close the connection"),
        }
        // The close reaches the client before the next request.
        let deadline = Instant::now() + Duration::from_secs(10);
        while client.direct.idle_and_closed() != (1, 1) {
            assert!(
                Instant::now() < deadline,
                "request {n}: the client never saw the close"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn rate_limited_is_shed_and_retried() {
    let addr = gateway().await;
    let client = client();

    let attempt = post_to(&client, addr, "/429", "").await;
    match &attempt.outcome {
        Outcome::Retry {
            status: Some(429),
            body: Some(body),
            retry_after: None,
            reason: RetryReason::RateLimited,
            shed: true,
            error,
        } => {
            assert_eq!(&body[..], b"busy");
            assert_eq!(
                error.to_string(),
                "RATE_LIMIT: rate limited: status code 429 (dropped: rejected-saturated)"
            );
        }
        other => panic!("{other:?}"),
    }

    let attempt = post_to(&client, addr, "/429-seconds", "").await;
    assert!(
        matches!(&attempt.outcome, Outcome::Retry { retry_after: Some(ra), shed: true, .. } if *ra == Duration::from_secs(7)),
        "{:?}",
        attempt.outcome
    );

    let attempt = post_to(&client, addr, "/429-date", "").await;
    assert!(
        matches!(&attempt.outcome, Outcome::Retry { retry_after: Some(ra), shed: true, .. }
            if *ra > Duration::from_secs(100) && *ra <= Duration::from_secs(121)),
        "{:?}",
        attempt.outcome
    );
}

#[tokio::test]
async fn client_error_is_terminal_with_raw_body() {
    let addr = gateway().await;
    let attempt = post_to(&client(), addr, "/400", "{}").await;
    match attempt.outcome {
        Outcome::Terminal {
            status: 400,
            body,
            error,
        } => {
            assert_eq!(&body[..], br#"{"error":"bad model"}"#);
            assert_eq!(error.category, ErrorCategory::InvalidReq);
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn server_error_is_retried_with_retry_after() {
    let addr = gateway().await;
    let attempt = post_to(&client(), addr, "/503", "{}").await;
    match attempt.outcome {
        Outcome::Retry {
            status: Some(503),
            body: Some(body),
            retry_after: Some(ra),
            reason: RetryReason::ServerError,
            shed: false,
            error,
        } => {
            assert_eq!(&body[..], b"overloaded");
            assert_eq!(ra, Duration::from_secs(5));
            assert_eq!(
                error.to_string(),
                "SERVER_ERROR: server error: status code 503"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn connection_refused_is_retried_without_status() {
    let (listener, addr) = listener().await;
    drop(listener);
    let attempt = post_to(&client(), addr, "/x", "{}").await;
    match &attempt.outcome {
        Outcome::Retry {
            status: None,
            body: None,
            reason: RetryReason::Connect,
            shed: false,
            error,
            ..
        } => {
            assert_eq!(error.category, ErrorCategory::Unknown);
            let text = error.to_string();
            assert!(
                text.starts_with("UNKNOWN: failed to send request (caused by: Post "),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(attempt.elapsed < GENEROUS);
}

#[tokio::test]
async fn per_attempt_timeout_is_retried_quickly() {
    let addr = gateway().await;
    let attempt = client()
        .send(
            &format!("http://{addr}/hang"),
            HeaderMap::new(),
            Bytes::new(),
            Duration::from_millis(200),
        )
        .await;
    assert!(
        matches!(
            attempt.outcome,
            Outcome::Retry {
                status: None,
                reason: RetryReason::Timeout,
                ..
            }
        ),
        "{:?}",
        attempt.outcome
    );
    assert!(
        attempt.elapsed >= Duration::from_millis(200),
        "{:?}",
        attempt.elapsed
    );
    assert!(attempt.elapsed < GENEROUS, "{:?}", attempt.elapsed);
}

#[tokio::test]
async fn timeout_mid_body_is_a_cut_without_status_or_body() {
    let addr = raw_server(|mut stream| async move {
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npar")
            .await;
        tokio::time::sleep(Duration::from_secs(60)).await;
    })
    .await;
    // Seconds: the head and the first bytes must arrive within it on a loaded machine too.
    let attempt = client()
        .send(
            &format!("http://{addr}/"),
            HeaderMap::new(),
            Bytes::new(),
            Duration::from_secs(2),
        )
        .await;
    match attempt.outcome {
        Outcome::Retry {
            status: None,
            body: None,
            reason: RetryReason::Timeout,
            error,
            ..
        } => {
            let text = error.to_string();
            assert!(
                text.contains("status code 200, body cut after 3 bytes"),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(attempt.elapsed < GENEROUS);
}

#[tokio::test]
async fn body_read_failure_is_retried_as_a_cut() {
    let addr = raw_server(|mut stream| async move {
        let _ = stream
            .write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nRetry-After: 3\r\n\
                  x-llm-d-request-dropped-reason: cut\r\n\r\npartial",
            )
            .await;
        let _ = stream.flush().await;
        // Dropping the stream closes the connection 93 bytes early.
    })
    .await;
    let attempt = post_to(&client(), addr, "/", "{}").await;
    match attempt.outcome {
        Outcome::Retry {
            status: None,
            body: None,
            retry_after: Some(ra),
            reason: RetryReason::BodyRead,
            shed: false,
            error,
        } => {
            assert_eq!(ra, Duration::from_secs(3));
            let text = error.to_string();
            assert!(
                text.starts_with(
                    "SERVER_ERROR: failed to read response: status code 200, body cut after 7 \
                     bytes (the connection failed) (dropped: cut) (caused by: "
                ),
                "{text}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn dropping_send_aborts_the_request() {
    let (received_tx, received_rx) = oneshot::channel::<()>();
    let (closed_tx, closed_rx) = oneshot::channel::<()>();
    let addr = raw_server(|mut stream| async move {
        let _ = received_tx.send(());
        // Never answer; report when the client goes away.
        let mut buf = [0u8; 64];
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
        let _ = closed_tx.send(());
    })
    .await;

    let client = client();
    let url = format!("http://{addr}/hang");
    let send = client.send(
        &url,
        HeaderMap::new(),
        Bytes::from_static(b"{}"),
        Duration::from_secs(60),
    );
    // The way inferq aborts: a select! whose other branch (cancellation) wins.
    let aborted = tokio::select! {
        attempt = send => panic!("the server never answers, yet: {attempt:?}"),
        _ = received_rx => true,
    };
    assert!(aborted);
    match tokio::time::timeout(GENEROUS, closed_rx).await {
        Ok(Ok(())) => {}
        Ok(Err(_)) => panic!("server task ended without seeing the close"),
        Err(_) => panic!("the connection stayed open after the send future was dropped"),
    }
}

/// A server on a thread of its own (as a gateway runs in a process of its own): each TCP
/// connection it accepts is counted and handed to `serve` in a task of its own.
fn threaded_server<F, Fut>(serve: F) -> (SocketAddr, Arc<AtomicUsize>)
where
    F: Fn(TcpStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = match std::net::TcpListener::bind("127.0.0.1:0") {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("local_addr: {e}"),
    };
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => panic!("runtime: {e}"),
        };
        runtime.block_on(async move {
            let _ = listener.set_nonblocking(true);
            let listener = match TcpListener::from_std(listener) {
                Ok(l) => l,
                Err(e) => panic!("listener: {e}"),
            };
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(serve(stream));
            }
        });
    });
    (addr, accepted)
}

/// A keep-alive server answering every request at once (chunked), counting the connections
/// it accepts.
fn counting_server() -> (SocketAddr, Arc<AtomicUsize>) {
    threaded_server(|mut stream| async move {
        loop {
            if read_request(&mut stream).await.is_empty() {
                break;
            }
            let answer =
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
            if stream.write_all(answer).await.is_err() {
                break;
            }
        }
    })
}

/// An HTTPS gateway that speaks HTTP/2 only (ALPN `h2`), on a thread of its own, answering
/// every request with 200 and a small JSON body. Counts the TCP connections it accepts and
/// the requests it answers.
fn http2_server() -> (SocketAddr, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::PrivateKeyDer;
    let chain = vec![crate::gateway::leaf::tests::der(
        crate::gateway::leaf::tests::SELF_SIGNED_PEM,
    )];
    let key = match PrivateKeyDer::from_pem_slice(
        crate::gateway::leaf::tests::SELF_SIGNED_KEY_PEM.as_bytes(),
    ) {
        Ok(key) => key,
        Err(e) => panic!("key: {e}"),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = match rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
    {
        Ok(config) => config,
        Err(e) => panic!("server config: {e}"),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let answered = Arc::new(AtomicUsize::new(0));
    let served = answered.clone();
    let (addr, accepted) = threaded_server(move |stream| {
        let (acceptor, served) = (acceptor.clone(), served.clone());
        async move {
            let Ok(stream) = acceptor.accept(stream).await else {
                return;
            };
            let Ok(mut connection) = h2::server::handshake(stream).await else {
                return;
            };
            while let Some(Ok((_request, mut respond))) = connection.accept().await {
                let head = axum::http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(());
                let Ok(head) = head else { return };
                let Ok(mut body) = respond.send_response(head, false) else {
                    return;
                };
                served.fetch_add(1, Ordering::SeqCst);
                let _ = body.send_data(Bytes::from_static(b"{\"ok\":true}"), true);
            }
        }
    });
    (addr, accepted, answered)
}

/// Trust in the test certificate the HTTP/2 server serves (`--tls-ca-cert` naming it); the
/// folder holding the file lives as long as the first value.
fn self_signed_trust() -> (tempfile::TempDir, GatewayTls) {
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let trust = GatewayTls {
        ca_cert: Some(inferq_testkit::certs::temp_file(
            &dir,
            "gateway.crt",
            crate::gateway::leaf::tests::SELF_SIGNED_PEM,
        )),
        ..GatewayTls::default()
    };
    (dir, trust)
}

/// A TLS gateway that chooses HTTP/2 by ALPN is served over HTTP/2 (through reqwest), as
/// before inferq's own connections took HTTPS: the connection that found out is closed, and
/// later requests go straight to HTTP/2 without dialling again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_gateway_is_served_over_http2() {
    const WORKERS: usize = 8;
    let (addr, accepted, answered) = http2_server();
    let (_dir, trust) = self_signed_trust();
    let client = match GatewayClient::new(&trust, WORKERS) {
        Ok(client) => client,
        Err(e) => panic!("client: {e}"),
    };
    let url = format!("https://127.0.0.1:{}/v1/completions", addr.port());
    let first = client
        .send(&url, HeaderMap::new(), Bytes::from_static(b"{}"), GENEROUS)
        .await;
    assert!(
        matches!(first.outcome, Outcome::Success { status: 200, .. }),
        "{first:?}"
    );
    // One connection found out and closed, one carrying HTTP/2.
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
    let mut sends = tokio::task::JoinSet::new();
    for _ in 0..WORKERS * 20 {
        let (client, url) = (client.clone(), url.clone());
        sends.spawn(async move {
            client
                .send(&url, HeaderMap::new(), Bytes::from_static(b"{}"), GENEROUS)
                .await
                .outcome
        });
    }
    while let Some(done) = sends.join_next().await {
        assert!(
            matches!(done, Ok(Outcome::Success { status: 200, .. })),
            "{done:?}"
        );
    }
    assert_eq!(answered.load(Ordering::SeqCst), 1 + WORKERS * 20);
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "no more connections");
}

/// A gateway serving a certificate that the system store holds (here a store file, as
/// `SSL_CERT_FILE` names one) is trusted without `--tls-ca-cert`, on both of inferq's paths:
/// its own connection (which finds out the gateway chooses HTTP/2) and reqwest's HTTP/2 one.
/// With a store that lacks it the handshake is refused, once: a certificate problem is fatal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_certificate_in_the_system_store_is_trusted() {
    use inferq_client::Roots;
    let (addr, accepted, answered) = http2_server();
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let store = inferq_testkit::certs::temp_file(
        &dir,
        "store.pem",
        crate::gateway::leaf::tests::SELF_SIGNED_PEM,
    );
    let url = format!("https://127.0.0.1:{}/v1/completions", addr.port());
    let send = |roots: Roots| {
        let url = url.clone();
        async move {
            match GatewayClient::on_roots(&GatewayTls::default(), 2, &roots) {
                Ok(client) => {
                    client
                        .send(&url, HeaderMap::new(), Bytes::from_static(b"{}"), GENEROUS)
                        .await
                        .outcome
                }
                Err(e) => panic!("client: {e}"),
            }
        }
    };

    let trusted = send(Roots::from_paths(Some(&store), None)).await;
    assert!(
        matches!(trusted, Outcome::Success { status: 200, .. }),
        "{trusted:?}"
    );
    assert_eq!(answered.load(Ordering::SeqCst), 1);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "inferq's own, then HTTP/2"
    );

    let refused = send(Roots::from_paths(None, None)).await;
    match &refused {
        Outcome::Fatal { error } => assert!(
            error.to_string().to_lowercase().contains("certificate"),
            "{error}"
        ),
        other => panic!("an untrusted gateway: {other:?}"),
    }
    assert_eq!(answered.load(Ordering::SeqCst), 1, "nothing more answered");
}

/// An origin that chose HTTP/2 is remembered for a while, not for the process's life: within
/// the memory no connection is dialled to ask again; after it, the next request asks again
/// (here the gateway still chooses HTTP/2, so it is remembered anew).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http2_memory_lapses() {
    use super::super::h1::Connections;
    let (addr, accepted, _answered) = http2_server();
    let (_dir, trust) = self_signed_trust();
    let config = match trust.client_config_on(inferq_client::Roots::system()) {
        Ok(config) => Arc::new(config),
        Err(e) => panic!("tls: {e}"),
    };
    // Seconds, so a stall between two requests cannot outlast it where they must fall within.
    let memory = Duration::from_secs(2);
    let connections = Connections::new(4, "test", config).with_http2_memory(memory);
    let url = format!("https://127.0.0.1:{}/v1/completions", addr.port());
    let target = match parse_target(&url) {
        Ok(Target {
            direct: Some(direct),
            ..
        }) => direct,
        other => panic!("{other:?}"),
    };
    let send = || connections.send(&target, HeaderMap::new(), Bytes::from_static(b"{}"));
    for (round, dialled) in [(1, 1), (2, 1)] {
        let sent = send().await;
        assert!(matches!(sent, Ok(Sent::Http2)), "round {round}");
        assert_eq!(accepted.load(Ordering::SeqCst), dialled, "round {round}");
    }
    tokio::time::sleep(memory + Duration::from_millis(100)).await;
    assert!(matches!(send().await, Ok(Sent::Http2)));
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        2,
        "asked again after the memory"
    );
    assert!(matches!(send().await, Ok(Sent::Http2)));
    assert_eq!(accepted.load(Ordering::SeqCst), 2, "and remembered anew");
}

/// A TLS gateway whose connection is lost during the handshake (here: closed at once) is a
/// connect failure to retry, not a refused certificate that ends the request.
#[tokio::test]
async fn a_handshake_cut_short_is_a_connect_failure() {
    let listener = match TcpListener::bind("127.0.0.1:0").await {
        Ok(l) => l,
        Err(e) => panic!("bind: {e}"),
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => panic!("local_addr: {e}"),
    };
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            drop(stream);
        }
    });
    let attempt = client()
        .send(
            &format!("https://{addr}/v1/completions"),
            HeaderMap::new(),
            Bytes::from_static(b"{}"),
            GENEROUS,
        )
        .await;
    assert!(
        matches!(
            attempt.outcome,
            Outcome::Retry {
                reason: RetryReason::Connect,
                ..
            }
        ),
        "{:?}",
        attempt.outcome
    );
}

/// Like the processor: a task per request, `workers` at once, each sending again as soon as
/// its request is done, `workers × each` requests in all; every one must come back 200.
async fn send_back_to_back(
    client: &GatewayClient,
    target: &Arc<Target>,
    workers: usize,
    each: usize,
    body: &'static [u8],
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(workers));
    let mut sends = tokio::task::JoinSet::new();
    let ok = |done: &Result<Outcome, tokio::task::JoinError>| {
        matches!(done, Ok(Outcome::Success { status: 200, .. }))
    };
    for _ in 0..workers * each {
        let slot = match slots.clone().acquire_owned().await {
            Ok(slot) => slot,
            Err(e) => panic!("semaphore: {e}"),
        };
        let (client, target) = (client.clone(), target.clone());
        sends.spawn(async move {
            let attempt = client
                .send_to(&target, HeaderMap::new, Bytes::from_static(body), GENEROUS)
                .await;
            drop(slot);
            attempt.outcome
        });
        while let Some(done) = sends.try_join_next() {
            assert!(ok(&done), "{done:?}");
        }
    }
    while let Some(done) = sends.join_next().await {
        assert!(ok(&done), "{done:?}");
    }
}

/// Workers sending back to back to an HTTPS gateway keep their connections: each new TLS
/// connection is a handshake on both sides, many times the cost of the request itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_workers_keep_their_connections() {
    const WORKERS: usize = 16;
    const EACH: usize = 100;
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let tls = inferq_sim::SimTls {
        cert: Some(inferq_testkit::certs::temp_file(
            &dir,
            "server.crt",
            crate::gateway::leaf::tests::SELF_SIGNED_PEM,
        )),
        key: Some(inferq_testkit::certs::temp_file(
            &dir,
            "server.key",
            crate::gateway::leaf::tests::SELF_SIGNED_KEY_PEM,
        )),
        client_ca: None,
    };
    let config = inferq_sim::SimConfig {
        ttft_ms: 0,
        per_token_ms: 0.0,
        ..inferq_sim::SimConfig::default()
    };
    let sim = match inferq_sim::Sim::start_tls(config, ([127, 0, 0, 1], 0).into(), &tls).await {
        Ok(sim) => sim,
        Err(e) => panic!("sim: {e}"),
    };
    // Trusted as Go trusts it: the self-signed certificate (marked as a CA, as
    // `openssl req -x509` makes it) listed as the CA file.
    let trust = GatewayTls {
        ca_cert: tls.cert.clone(),
        ..GatewayTls::default()
    };
    let client = match GatewayClient::new(&trust, WORKERS) {
        Ok(client) => client,
        Err(e) => panic!("client: {e}"),
    };
    let target = match parse_target(&format!("{}/v1/completions", sim.base_url())) {
        Ok(target) => Arc::new(target),
        Err(e) => panic!("target: {e}"),
    };
    send_back_to_back(
        &client,
        &target,
        WORKERS,
        EACH,
        br#"{"prompt":"hi","max_tokens":1}"#,
    )
    .await;
    let opened = sim.stats().connections_accepted;
    assert!(
        opened <= 2 * WORKERS as u64,
        "{WORKERS} workers sending {EACH} requests each over TLS opened {opened} connections"
    );
}

/// Workers that send back to back keep their connections: a new request that races a
/// connection on its way back to the pool must not leave the pool one connection too full,
/// closing it and dialling (with TLS: handshaking) again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_to_back_workers_do_not_churn_connections() {
    const WORKERS: usize = 16;
    const EACH: usize = 400;
    let (addr, accepted) = counting_server();
    let client = match GatewayClient::new(&GatewayTls::default(), WORKERS) {
        Ok(client) => client,
        Err(e) => panic!("client: {e}"),
    };
    let target = match parse_target(&format!("http://{addr}/v1/chat/completions")) {
        Ok(target) => Arc::new(target),
        Err(e) => panic!("target: {e}"),
    };
    send_back_to_back(&client, &target, WORKERS, EACH, b"{}").await;
    let opened = accepted.load(Ordering::SeqCst);
    assert!(
        opened <= 2 * WORKERS,
        "{WORKERS} workers sending {EACH} requests each opened {opened} connections"
    );
}

#[tokio::test]
async fn bad_urls_are_fatal() {
    let client = client();
    for url in [
        "",
        "not a url",
        "/v1/completions",
        "localhost:8000",
        "ftp://gw/v1",
        "http://gw:99999/v1",
    ] {
        let attempt = client
            .send(url, HeaderMap::new(), Bytes::new(), GENEROUS)
            .await;
        match &attempt.outcome {
            Outcome::Fatal { error } => {
                assert_eq!(error.category, ErrorCategory::InvalidReq, "{url:?}");
                assert!(error
                    .to_string()
                    .starts_with("INVALID_REQ: failed to create request"));
            }
            other => panic!("{url:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn oversized_bodies_are_fatal() {
    let addr = gateway().await;
    let client = client().with_body_limit(1024);
    assert_eq!(client.body_limit(), 1024);
    for path in ["/big", "/big-chunked"] {
        let attempt = post_to(&client, addr, path, "").await;
        match &attempt.outcome {
            Outcome::Fatal { error } => {
                assert!(error.to_string().contains("exceeds 1024 bytes"), "{error}");
            }
            other => panic!("{path}: {other:?}"),
        }
    }
    // Within the limit is fine.
    let attempt = post_to(&client, addr, "/created", "small").await;
    assert!(matches!(
        attempt.outcome,
        Outcome::Success { status: 201, .. }
    ));
}

/// A body announced over the limit is refused before any of it is read, and before any room
/// for it is reserved: a gateway announcing 10 GB costs nothing.
#[test]
fn an_announced_oversized_body_reserves_nothing() {
    let reader = BodyReader::new(1024, Some(10 << 30));
    assert_eq!(reader.body.capacity(), 0);
    assert!(matches!(
        reader.done(),
        Some(BodyRead::TooLarge { limit: 1024 })
    ));
    let reader = BodyReader::new(1024, Some(100));
    assert!(reader.body.capacity() >= 100);
    assert!(reader.done().is_none());
}

#[test]
fn tls_errors_surface_from_new() {
    let tls = GatewayTls {
        key: Some("/nonexistent/key.pem".into()),
        ..GatewayTls::default()
    };
    match GatewayClient::new(&tls, 1) {
        Ok(_) => panic!("key without cert accepted"),
        Err(e) => assert!(e.to_string().contains("must be given together"), "{e}"),
    }
    let dir = match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    };
    let tls = GatewayTls {
        ca_cert: Some(inferq_testkit::certs::temp_file(&dir, "ca.pem", "garbage")),
        ..GatewayTls::default()
    };
    match GatewayClient::new(&tls, 1) {
        Ok(_) => panic!("unparsable CA accepted"),
        Err(e) => assert!(e.to_string().contains("no PEM certificates"), "{e}"),
    }
    let tls = GatewayTls {
        ca_cert: Some(inferq_testkit::certs::temp_file(
            &dir,
            "good.pem",
            inferq_testkit::certs::TEST_CA_PEM,
        )),
        ..GatewayTls::default()
    };
    assert!(GatewayClient::new(&tls, 1).is_ok());
}
