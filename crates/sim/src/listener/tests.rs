//! The simulator's connections are bounded as inferq's listeners are: a head that does not
//! arrive in time and a keep-alive connection left idle are closed, a request in progress is
//! never idle, and past `--max-connections` a connection is answered 503 and closed. Each test
//! talks raw TCP to a real simulator on a free port.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{Sim, SimConfig};

async fn start(listener: super::ListenerConfig, cfg: SimConfig) -> Sim {
    let cfg = SimConfig { listener, ..cfg };
    Sim::start(cfg, SocketAddr::from(([127, 0, 0, 1], 0)))
        .await
        .unwrap()
}

fn timeouts(header_read_ms: u64, idle_ms: u64) -> super::ListenerConfig {
    super::ListenerConfig {
        header_read_timeout: Duration::from_millis(header_read_ms),
        idle_timeout: Duration::from_millis(idle_ms),
        max_connections: None,
    }
}

/// Reads until the server closes the connection (or 10 s pass), returning what arrived and
/// how long the close took.
async fn until_closed(conn: &mut TcpStream) -> (String, Duration) {
    let started = Instant::now();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let read = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf)).await;
        match read {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => panic!("the connection was still open after 10 s"),
        }
    }
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// A new connection that asked for `/healthz`, kept open, and its answer's status line start.
async fn health(sim: &Sim) -> (TcpStream, [u8; 12]) {
    let mut conn = TcpStream::connect(sim.local_addr()).await.unwrap();
    conn.write_all(b"GET /healthz HTTP/1.1\r\nHost: sim\r\n\r\n")
        .await
        .unwrap();
    let mut status = [0u8; 12];
    conn.read_exact(&mut status).await.unwrap();
    (conn, status)
}

const COMPLETION: &str = r#"{"model":"m","prompt":"p","max_tokens":1}"#;

fn post(path: &str, body: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::test]
async fn a_head_that_does_not_arrive_in_time_is_closed_whether_begun_or_not() {
    let sim = start(timeouts(400, 60_000), SimConfig::instant()).await;
    let mut silent = TcpStream::connect(sim.local_addr()).await.unwrap();
    let mut slowloris = TcpStream::connect(sim.local_addr()).await.unwrap();
    slowloris
        .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: sim\r\nX-A: ")
        .await
        .unwrap();
    for conn in [&mut silent, &mut slowloris] {
        let (answer, took) = until_closed(conn).await;
        assert!(answer.is_empty(), "{answer}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    // Neither ran anything, and the simulator serves the next client.
    assert_eq!(sim.stats().requests, 0);
    let mut next = TcpStream::connect(sim.local_addr()).await.unwrap();
    next.write_all(post("/v1/completions", COMPLETION).as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 12];
    next.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"HTTP/1.1 200");
    sim.stop().await;
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_request_in_progress_is_not_idle() {
    // Each request takes 1.2 s, three times the idle timeout.
    let slow = SimConfig {
        slow_rate: 1.0,
        slow_ms: 1200,
        ..SimConfig::instant()
    };
    let sim = start(timeouts(60_000, 400), slow).await;
    let mut conn = TcpStream::connect(sim.local_addr()).await.unwrap();
    conn.write_all(post("/v1/completions", COMPLETION).as_bytes())
        .await
        .unwrap();
    // The answer arrives whole, then the kept-alive connection is closed for idling.
    let (answer, took) = until_closed(&mut conn).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"choices\""), "{answer}");
    assert!(took >= Duration::from_millis(1200), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    sim.stop().await;
}

#[tokio::test]
async fn past_max_connections_a_connection_is_refused_in_openais_shape() {
    let bounded = super::ListenerConfig {
        max_connections: Some(2),
        ..super::ListenerConfig::default()
    };
    let sim = start(bounded, SimConfig::instant()).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        // A whole answer shows the simulator took the connection before the next connects.
        let (conn, status) = health(&sim).await;
        assert_eq!(&status, b"HTTP/1.1 200");
        held.push(conn);
    }
    let mut third = TcpStream::connect(sim.local_addr()).await.unwrap();
    let (answer, _) = until_closed(&mut third).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(
        answer.contains("\"code\":\"too_many_connections\""),
        "{answer}"
    );
    // A slot freed is a slot taken again.
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if &health(&sim).await.1 == b"HTTP/1.1 200" {
            break;
        }
        assert!(Instant::now() < deadline, "the freed slot was never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sim.stop().await;
}

#[test]
fn bad_bounds_are_refused_naming_the_flag() {
    for (listener, flag) in [
        (timeouts(10, 60_000), "header-read-timeout"),
        (timeouts(60_000, 10), "idle-timeout"),
        (
            super::ListenerConfig {
                max_connections: Some(0),
                ..super::ListenerConfig::default()
            },
            "max-connections",
        ),
    ] {
        let cfg = SimConfig {
            listener,
            ..SimConfig::default()
        };
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains(flag), "{err}");
    }
}
