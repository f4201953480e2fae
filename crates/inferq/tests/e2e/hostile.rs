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
use inferq_client::producer::Producer;
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

/// The processor config's second queue, after `request-sortedset`'s own fields.
fn second_queue(gw: &Gateway, own_fields: &str) -> String {
    format!(
        r#"{own_fields}}},{{"queue_name":"other-queue","igw_base_url":"{}","inference_objective":"batch-obj""#,
        gw.url()
    )
}

/// A Go-style member of `queue` whose stamp (`result_routing_resolved`) routes it to `list`.
fn stamped_member(id: &str, queue: &str, list: &str) -> (String, i64) {
    let now = inferq_client::producer::unix_ms() / 1000;
    let deadline = now + 60;
    let member = serde_json::json!({
        "internal": {
            "request_token": format!("{:0>32}", id.len()),
            "request_queue_name": queue,
            "result_queue_name": list,
            "result_routing_resolved": true,
        },
        "request_kind": "plain",
        "data": {"id": id, "created": now, "deadline": deadline, "payload": {"prompt": "a"}},
    });
    (member.to_string(), deadline)
}

/// The dead records on `queue`'s dead list, by id.
async fn dead_records(
    con: &mut redis::aio::ConnectionManager,
    queue: &str,
) -> HashMap<String, serde_json::Value> {
    use redis::AsyncCommands;
    let raw: Vec<String> = con.lrange(format!("{queue}:dead"), 0, -1).await.unwrap();
    raw.iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(r)
                .unwrap_or_else(|e| panic!("a dead list entry is no record ({e}): {r}"));
            assert!(
                v.get("reason").is_some(),
                "a dead list entry is no record: {r}"
            );
            (v["id"].as_str().unwrap_or("").to_owned(), v)
        })
        .collect()
}

#[tokio::test]
async fn no_message_can_name_a_key_of_inferqs() {
    use redis::AsyncCommands;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_queue_fields: second_queue(&gw, r#","result_queue_name":"configured""#),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let q = "request-sortedset";
    let hostile = [
        q.to_owned(),
        "other-queue".to_owned(),
        format!("{q}:deliveries"),
        format!("{q}:deliveries-idx"),
        format!("{q}:parked"),
        format!("{q}:finishing"),
        format!("{q}:finishing-idx"),
        format!("{q}:dead"),
        format!("{{{q}}}:claimed"),
        "other-queue:claims-idx".to_owned(),
        "retry-sortedset".to_owned(),
        "request-active:x".to_owned(),
        "request-seq:other-queue:1".to_owned(),
        "inferq-tenant:alice".to_owned(),
        "{inferq-batch}:live".to_owned(),
    ];
    let mut con = con(&redis).await;
    // Named by messages of other-queue (no list of its own, so the message's is used) ...
    for (i, list) in hostile.iter().enumerate() {
        Producer::connect(&redis.url(), "other-queue", list)
            .await
            .unwrap()
            .submit(request(&format!("named-{i}"), 60, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    // ... and stamped into members of request-sortedset, whose own list a stamp beats.
    for (i, list) in hostile.iter().enumerate() {
        let (member, deadline) = stamped_member(&format!("stamped-{i}"), q, list);
        let _: i64 = con.zadd(q, member, deadline).await.unwrap();
    }
    let n = hostile.len();
    let started = std::time::Instant::now();
    let (mut dead_q, mut dead_other) = (HashMap::new(), HashMap::new());
    while started.elapsed() < Duration::from_secs(20) {
        dead_q = dead_records(&mut con, q).await;
        dead_other = dead_records(&mut con, "other-queue").await;
        if dead_q.len() >= n && dead_other.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (i, list) in hostile.iter().enumerate() {
        for (id, dead) in [
            (format!("named-{i}"), &dead_other),
            (format!("stamped-{i}"), &dead_q),
        ] {
            let record = dead
                .get(&id)
                .unwrap_or_else(|| panic!("{id} ({list}) not dead-lettered; log:\n{}", p.log()));
            let result: ResultMessage =
                serde_json::from_str(record["result"].as_str().unwrap_or(""))
                    .unwrap_or_else(|e| panic!("{id}: the record keeps no result ({e}): {record}"));
            assert_eq!(result.status_code, 200, "{id}: {record}");
            assert!(
                record["reason"].as_str().unwrap_or("").contains("refused"),
                "{id}: {record}"
            );
        }
    }
    // No key of inferq's changed type, and both queues go on.
    for (key, want) in [
        (q.to_owned(), ["zset", "none"]),
        ("other-queue".to_owned(), ["zset", "none"]),
        (format!("{q}:deliveries"), ["hash", "none"]),
        (format!("{q}:deliveries-idx"), ["zset", "none"]),
        (format!("{q}:parked"), ["zset", "none"]),
        (format!("{q}:finishing"), ["hash", "none"]),
        (format!("{q}:finishing-idx"), ["zset", "none"]),
        ("other-queue:claims-idx".to_owned(), ["zset", "none"]),
        ("retry-sortedset".to_owned(), ["zset", "none"]),
        ("request-active:x".to_owned(), ["string", "none"]),
        ("inferq-tenant:alice".to_owned(), ["zset", "none"]),
    ] {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(want.contains(&kind.as_str()), "{key} is a {kind}");
    }
    for queue in [q, "other-queue"] {
        Producer::connect(&redis.url(), queue, "after")
            .await
            .unwrap()
            .submit(request(&format!("after-{queue}"), 60, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    let configured = wait_results_in(&mut con, "configured", 1, Duration::from_secs(10)).await;
    let after = wait_results_in(&mut con, "after", 1, Duration::from_secs(10)).await;
    assert_eq!((configured.len(), after.len()), (1, 1), "log:\n{}", p.log());
}

#[tokio::test]
async fn the_allow_list_narrows_the_lists_a_message_may_name() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_queue_fields: r#","allowed_result_lists":["results:*"]"#.to_owned(),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let q = "request-sortedset";
    for (id, list) in [("in", "results:alice"), ("out", "elsewhere")] {
        Producer::connect(&redis.url(), q, list)
            .await
            .unwrap()
            .submit(request(id, 60, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results_in(&mut con, "results:alice", 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "log:\n{}", p.log());
    let started = std::time::Instant::now();
    let mut dead = HashMap::new();
    while started.elapsed() < Duration::from_secs(10) && dead.is_empty() {
        dead = dead_records(&mut con, q).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let record = &dead["out"];
    assert!(
        record["reason"]
            .as_str()
            .unwrap_or("")
            .contains("allowed_result_lists"),
        "{record}"
    );
    assert!(raw_results(&mut con, "elsewhere").await.is_empty());
}

#[tokio::test]
async fn the_health_and_metrics_listeners_bound_their_connections() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_args: [
            "--http-header-read-timeout",
            "1s",
            "--http-idle-timeout",
            "60s",
            "--http-max-connections",
            "4",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    for port in [p.health_port, p.metrics_port] {
        let addr = format!("127.0.0.1:{port}");
        // A silent connection and a dripped head are closed at the header-read timeout.
        let mut silent = TcpStream::connect(&addr).await.unwrap();
        let mut slow = TcpStream::connect(&addr).await.unwrap();
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHo")
            .await
            .unwrap();
        let started = std::time::Instant::now();
        for s in [&mut silent, &mut slow] {
            let mut buf = [0u8; 256];
            let read = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await;
            assert!(
                matches!(read, Ok(Ok(0)) | Ok(Err(_))),
                "port {port}: still open after {:?}",
                started.elapsed()
            );
        }
        // Past the bound, a connection is refused with a 503. Each held connection is answered
        // first, so it is known to hold its slot (the two closed above free theirs only just
        // after their close).
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(
                inferq_testkit::connections::slot_taken(&addr)
                    .await
                    .unwrap(),
            );
        }
        let mut over = TcpStream::connect(&addr).await.unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), over.read_to_end(&mut answer)).await;
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 503"), "port {port}: {text}");
    }
    // The processor still answers its probes.
    let r = reqwest::get(format!("http://127.0.0.1:{}/healthz", p.health_port))
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
}
