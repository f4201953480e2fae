//! Abusive HTTP clients against a real `inferq batch-api` (short timeout flags keep it quick):
//! slowloris heads and silent connections are closed at the header-read timeout, an idle
//! keep-alive connection at the (longer) idle timeout, a client waiting in `wait` mode keeps
//! its connection past both, connections past `--max-connections` are refused in OpenAI's
//! shape; an unauthenticated body is refused before it is read; every refusal of the HTTP
//! layer (a body over its limit, bad JSON, bad UTF-8 in a path, a bad query) is OpenAI-shaped; a refused upload stops being read at the drain cap.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{assert_openai_error, Deployment, Fallible};

const KEY: &str = "sk-hostile-test-0123456789";

/// Whether the server closed `stream` within `within` (a read that ends or fails).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 4096];
    let started = Instant::now();
    while started.elapsed() < within {
        let left = within.saturating_sub(started.elapsed());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
    false
}

/// One replica with `flags`, over a simulator of `ttft_ms`, with a processor.
async fn replica(ttft_ms: u64, flags: &[&str]) -> Fallible<(Deployment, u16)> {
    let mut d = Deployment::start(ttft_ms).await?;
    d.extra_flags = flags.iter().map(|s| s.to_string()).collect();
    d.add_processor()?;
    let port = d.add_replica().await?;
    Ok((d, port))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_are_bounded_but_a_waiting_client_keeps_its_own() -> Fallible {
    let (d, port) = replica(
        5000,
        &[
            "--header-read-timeout",
            "1s",
            "--idle-timeout",
            "4s",
            "--max-connections",
            "12",
        ],
    )
    .await?;
    let addr = format!("127.0.0.1:{port}");
    // A waiting client: its answer takes 5 s, past both timeouts, on one connection.
    let waiting = {
        let url = format!("{}/chat/completions", d.url(0));
        tokio::spawn(async move {
            let client = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .build()?;
            let r = client
                .post(url)
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
                .send()
                .await?;
            Ok::<_, reqwest::Error>(r.status().as_u16())
        })
    };
    // Slowloris: a head dripped a byte every 200 ms; a connection that sends nothing.
    let mut slow = TcpStream::connect(&addr).await?;
    let drip = tokio::spawn(async move {
        let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Pad: ";
        let started = Instant::now();
        for b in head.iter().chain(std::iter::repeat(&b'a')) {
            if slow.write_all(&[*b]).await.is_err() {
                return Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            if started.elapsed() > Duration::from_secs(10) {
                return None;
            }
        }
        None
    });
    let mut silent = TcpStream::connect(&addr).await?;
    let silent_since = Instant::now();
    // Keep-alive: one whole request, then idle.
    let mut idle = TcpStream::connect(&addr).await?;
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut buf = [0u8; 1024];
    let n = idle.read(&mut buf).await?;
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    assert!(
        closed_within(&mut silent, Duration::from_secs(3)).await,
        "a silent connection outlived the header-read timeout"
    );
    assert!(silent_since.elapsed() >= Duration::from_millis(700));
    // Idle is not a head: still open past the header-read timeout, closed at the idle one.
    assert!(!closed_within(&mut idle, Duration::from_millis(1500)).await);
    assert!(closed_within(&mut idle, Duration::from_secs(4)).await);
    let dripped = drip.await?;
    assert!(
        dripped.is_some_and(|t| t < Duration::from_secs(4)),
        "a dripped head was not cut off: {dripped:?}"
    );
    assert_eq!(waiting.await??, 200, "{}", d.logs());
    // Past the bound: a clear refusal.
    // Each held connection is answered first, so it is known to hold its slot.
    let mut held = Vec::new();
    for _ in 0..12 {
        held.push(inferq_testkit::connections::slot_taken(&addr).await?);
    }
    let mut over = TcpStream::connect(&addr).await?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), over.read_to_end(&mut answer)).await??;
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 503"), "{text}");
    assert!(text.contains("too_many_connections"), "{text}");
    drop(held);
    Ok(())
}

/// The RSS of a process, in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_come_before_reading_and_in_openais_shape() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.keys(&json!({ KEY: "team" }).to_string())?;
    d.extra_flags
        .extend(["--max-line-bytes".into(), "20000000".into()]);
    let port = d.add_replica().await?;
    let pid = d.replicas[0].0.id();
    let url = d.url(0);
    let before = rss_mib(pid);
    // 20 unauthenticated 15 MB bodies at once: each refused from its headers.
    let body = vec![b'x'; 15_000_000];
    let mut calls = Vec::new();
    for _ in 0..20 {
        let (url, body) = (url.clone(), body.clone());
        calls.push(tokio::spawn(async move {
            let r = reqwest::Client::new()
                .post(format!("{url}/chat/completions"))
                .header("content-type", "application/json")
                .body(body)
                .send()
                .await;
            r.map(|r| r.status().as_u16()).unwrap_or(0)
        }));
    }
    for c in calls {
        let status = c.await?;
        // A client still sending when the refusal closes the connection may see a reset.
        assert!(status == 401 || status == 0, "{status}");
    }
    let growth = rss_mib(pid) - before;
    assert!(growth < 30.0, "RSS grew {growth:.1} MiB for refused bodies");
    // A refusal with a 100-continue: answered without the body ever being asked for.
    let mut s = TcpStream::connect(format!("127.0.0.1:{port}")).await?;
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 15000000\r\nExpect: 100-continue\r\n\r\n",
    )
    .await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(3), s.read(&mut buf)).await??;
    let text = String::from_utf8_lossy(&buf[..n]);
    assert!(text.starts_with("HTTP/1.1 401"), "{text}");

    // With the key: the HTTP layer's own refusals are OpenAI-shaped too.
    let client = reqwest::Client::new();
    let auth = format!("Bearer {KEY}");
    let cases: Vec<(reqwest::RequestBuilder, u16)> = vec![
        (
            client
                .post(format!("{url}/batches"))
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .body(vec![b'['; 100_000]),
            413,
        ),
        (
            client
                .get(format!("{url}/files/file-%ff%fe"))
                .header("authorization", &auth),
            400,
        ),
        (
            client
                .post(format!("{url}/batches"))
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .body("{not json"),
            400,
        ),
        (
            client
                .post(format!("{url}/batches"))
                .header("authorization", &auth)
                .header("content-type", "application/json")
                .body(vec![b'"', 0xff, 0xfe, b'"']),
            400,
        ),
        (
            client
                .get(format!("{url}/files?limit=many"))
                .header("authorization", &auth),
            400,
        ),
    ];
    for (call, status) in cases {
        let r = call.send().await?;
        assert_eq!(r.status().as_u16(), status);
        let text = r.text().await?;
        let v: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("not OpenAI-shaped ({e}): {text}"));
        assert_openai_error(&v);
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upload_stops_being_read_at_the_drain_cap() -> Fallible {
    let (d, port) = replica(5, &["--max-file-bytes", "1000"]).await?;
    // A 160 MiB file field: refused at 1000 bytes, then read for at most 64 MiB more.
    let total: u64 = 160 << 20;
    let boundary = "hostileboundary";
    let head = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n\
         --{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\
         Content-Type: application/octet-stream\r\n\r\n"
    );
    let tail = format!("\r\n--{boundary}--\r\n");
    let length = head.len() as u64 + total + tail.len() as u64;
    let mut s = TcpStream::connect(format!("127.0.0.1:{port}")).await?;
    s.write_all(
        format!(
            "POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; \
             boundary={boundary}\r\nContent-Length: {length}\r\n\r\n{head}"
        )
        .as_bytes(),
    )
    .await?;
    let (mut reader, mut writer) = s.into_split();
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = sent.clone();
    let line =
        b"{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n";
    let chunk: Vec<u8> = line.iter().copied().cycle().take(1 << 16).collect();
    let writing = tokio::spawn(async move {
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if writer.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            counter.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            left -= n as u64;
        }
        let _ = writer.write_all(tail.as_bytes()).await;
    });
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(20), reader.read(&mut answer)).await??;
    let at_answer = sent.load(std::sync::atomic::Ordering::Relaxed);
    writing.abort();
    let text = String::from_utf8_lossy(&answer[..n]);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}\n{}", d.logs());
    // The cap (64 MiB) plus what the kernel's socket buffers hold.
    assert!(
        at_answer < 100 << 20,
        "{} MiB were read before the refusal",
        at_answer >> 20
    );
    Ok(())
}
