//! The gateway's own ceiling, measured in the same run: an in-process HTTP/1.1 load generator
//! in the manner of wrk — a fixed number of keep-alive connections, each sending one POST
//! (the requests' payload) after another for a few seconds, with a pre-built request and a
//! minimal response reader (`Content-Length` or chunked bodies), so the generator costs the
//! machine as little as it can. In: the gateway's address, concurrency and duration; out:
//! answered requests per second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::BenchError;

/// What the load generator achieved.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Ceiling {
    pub requests_per_s: f64,
    pub answered: u64,
    pub failed: u64,
    pub seconds: f64,
    pub concurrency: u32,
}

/// POSTs to `http://127.0.0.1:port/v1/chat/completions` from `concurrency` connections for
/// `duration`, after a short warm-up that is not counted.
pub(crate) async fn measure(
    port: u16,
    concurrency: u32,
    duration: Duration,
) -> Result<Ceiling, BenchError> {
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x".repeat(200)}],
    })
    .to_string();
    let request: Arc<[u8]> = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
    .into();
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let warm_up = Duration::from_millis(300);
    let started = Instant::now();
    let end = started + warm_up + duration;
    let mut senders = Vec::new();
    for _ in 0..concurrency {
        let request = Arc::clone(&request);
        let (answered, failed, counting) = (
            Arc::clone(&answered),
            Arc::clone(&failed),
            Arc::clone(&counting),
        );
        senders.push(tokio::spawn(async move {
            let mut conn: Option<Conn> = None;
            while Instant::now() < end {
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => match TcpStream::connect(("127.0.0.1", port)).await {
                        Ok(s) => {
                            let _ = s.set_nodelay(true);
                            conn.insert(Conn::new(s))
                        }
                        Err(_) => {
                            failed.fetch_add(1, Relaxed);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let ok = c.exchange(&request).await;
                if !counting.load(Relaxed) {
                    continue;
                }
                match ok {
                    Ok(true) => answered.fetch_add(1, Relaxed),
                    Ok(false) => failed.fetch_add(1, Relaxed),
                    Err(_) => {
                        conn = None;
                        failed.fetch_add(1, Relaxed)
                    }
                };
            }
        }));
    }
    tokio::time::sleep(warm_up).await;
    counting.store(true, Relaxed);
    let counted_from = Instant::now();
    for s in senders {
        s.await
            .map_err(|e| BenchError::Phase(format!("a load sender failed: {e}")))?;
    }
    let seconds = counted_from.elapsed().as_secs_f64();
    let answered = answered.load(Relaxed);
    Ok(Ceiling {
        requests_per_s: answered as f64 / seconds,
        answered,
        failed: failed.load(Relaxed),
        seconds,
        concurrency,
    })
}

/// One keep-alive connection and its read buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl Conn {
    fn new(stream: TcpStream) -> Conn {
        Conn {
            stream,
            buf: Vec::with_capacity(4096),
        }
    }

    /// Sends the request and reads one whole response: `Ok(true)` for a 2xx.
    async fn exchange(&mut self, request: &[u8]) -> std::io::Result<bool> {
        self.stream.write_all(request).await?;
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.fill().await?;
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).to_ascii_lowercase();
        let ok = head.get(9..10) == Some("2");
        let length = head.lines().find_map(|l| {
            l.strip_prefix("content-length:")
                .and_then(|v| v.trim().parse::<usize>().ok())
        });
        self.buf.drain(..head_end);
        match length {
            Some(n) => {
                while self.buf.len() < n {
                    self.fill().await?;
                }
                self.buf.drain(..n);
            }
            None if head.contains("transfer-encoding: chunked") => self.skip_chunks().await?,
            None => return Err(std::io::Error::other("a response without a length")),
        }
        Ok(ok)
    }

    /// Reads past a chunked body.
    async fn skip_chunks(&mut self) -> std::io::Result<()> {
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf, b"\r\n") {
                    break i;
                }
                self.fill().await?;
            };
            let size_text = String::from_utf8_lossy(&self.buf[..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .map_err(|_| std::io::Error::other("a bad chunk size"))?;
            let need = line_end + 2 + size + 2;
            while self.buf.len() < need {
                self.fill().await?;
            }
            self.buf.drain(..need);
            if size == 0 {
                return Ok(());
            }
        }
    }

    async fn fill(&mut self) -> std::io::Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}
