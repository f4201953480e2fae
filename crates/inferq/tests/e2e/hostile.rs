//! Hostile neighbours, end to end: a gateway that misbehaves on purpose (a raw TCP socket the
//! test drives byte by byte: a slow drip, headers with no body, an endless chunked stream, an
//! endless SSE stream, a body cut by a closed connection), and producers that name inferq's own
//! keys as result lists. Each runs a real redis-server and `inferq run`, and checks that every
//! request ends with exactly one truthful result and that no key of inferq's changes type.

use crate::common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use inferq_client::wire::ResultMessage;
use inferq_testkit::RedisServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads one request (head and its `Content-Length` body) and returns its
/// `x-inferq-request-id`; `None` when the connection ends first.
async fn read_request(stream: &mut TcpStream) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    header("x-inferq-request-id")
}

/// How the hostile gateway answers a request whose id starts with the key.
async fn misbehave(mut stream: TcpStream) {
    let Some(id) = read_request(&mut stream).await else {
        return;
    };
    let kind = id.split('-').next().unwrap_or("").to_owned();
    let forever = Duration::from_secs(3600);
    match kind.as_str() {
        // One byte of a 1000-byte body every 100 ms.
        "drip" => {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                .await;
            loop {
                if stream.write_all(b"x").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Headers promising a body that never comes.
        "nobody" => {
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n")
                .await;
            tokio::time::sleep(forever).await;
        }
        // A chunked body that never ends (no content-length), of a 503 too.
        "chunked" | "chunked503" => {
            let status = if kind == "chunked" {
                "200 OK"
            } else {
                "503 Busy"
            };
            let head = format!("HTTP/1.1 {status}\r\nTransfer-Encoding: chunked\r\n\r\n");
            let _ = stream.write_all(head.as_bytes()).await;
            loop {
                if stream.write_all(b"5\r\nhello\r\n").await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // An SSE stream that never ends.
        "sse" => {
            let _ = stream
                .write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                      Transfer-Encoding: chunked\r\n\r\n",
                )
                .await;
            let event = b"data: {\"choices\":[{\"text\":\"x\"}]}\n\n";
            let frame = [format!("{:x}\r\n", event.len()).as_bytes(), event, b"\r\n"].concat();
            loop {
                if stream.write_all(&frame).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        // Ten bytes of a 100-byte body, then the connection closes (a 200 and a 429).
        "cut" | "cut429" => {
            let status = if kind == "cut" {
                "200 OK"
            } else {
                "429 Too Many Requests"
            };
            let head = format!("HTTP/1.1 {status}\r\nContent-Length: 100\r\n\r\n0123456789");
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.flush().await;
        }
        // A whole answer.
        _ => {
            let body = r#"{"choices":[{"text":"whole"}]}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.flush().await;
        }
    }
}

/// The hostile gateway on a free port.
async fn hostile_gateway() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(misbehave(stream));
        }
    });
    addr
}

/// A processor whose gateway is the hostile one.
async fn processor_behind(redis: &RedisServer, gateway: SocketAddr) -> Processor {
    let mut gw = Gateway::start().await;
    gw.addr = gateway;
    Processor::start(redis, &gw, &ProcessorOpts::default()).await
}

#[tokio::test]
async fn only_a_whole_answer_is_published_as_an_http_answer() {
    let redis = RedisServer::start().unwrap();
    let p = processor_behind(&redis, hostile_gateway().await).await;
    let producer = producer(&redis, "request-sortedset").await;
    let ids = [
        "drip-1",
        "nobody-1",
        "chunked-1",
        "chunked503-1",
        "sse-1",
        "cut-1",
        "cut429-1",
        "whole-1",
    ];
    for id in ids {
        producer
            .submit(request(id, 3, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    let mut con = con(&redis).await;
    wait_results(&mut con, ids.len(), Duration::from_secs(20)).await;
    // A moment more: a second result for any id would show up now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let got: Vec<ResultMessage> = results(&mut con).await;
    assert_eq!(got.len(), ids.len(), "{got:#?}\nlog:\n{}", p.log());
    let by_id: HashMap<&str, &ResultMessage> = got.iter().map(|r| (r.id.as_str(), r)).collect();
    for id in ["drip-1", "nobody-1", "chunked-1", "chunked503-1", "sse-1"] {
        let r = by_id[id];
        assert_eq!(
            (r.status_code, r.error_code.as_str()),
            (0, "DEADLINE_EXCEEDED"),
            "{id}: {r:?}"
        );
        // Nothing of the cut body is passed off as the answer.
        assert!(
            !["xx", "hello", "data:"]
                .iter()
                .any(|b| r.payload.contains(b)),
            "{id}: {r:?}"
        );
    }
    // A cut body is retried; the deadline ends it as an INFERENCE_ERROR naming the cut, or as
    // DEADLINE_EXCEEDED when its last backoff ran past the deadline. Never as its status.
    for (id, status) in [("cut-1", 200), ("cut429-1", 429)] {
        let r = by_id[id];
        assert_eq!(r.status_code, 0, "{id}: {r:?}");
        assert!(!r.payload.contains("0123456789"), "{id}: {r:?}");
        match r.error_code.as_str() {
            "INFERENCE_ERROR" => assert!(
                r.error_message
                    .contains(&format!("status code {status}, body cut after 10 bytes")),
                "{id}: {r:?}"
            ),
            "DEADLINE_EXCEEDED" => {}
            other => panic!("{id}: {other} {r:?}"),
        }
    }
    let whole = by_id["whole-1"];
    assert_eq!(whole.status_code, 200);
    assert!(whole.payload.contains("whole"), "{whole:?}");
}
