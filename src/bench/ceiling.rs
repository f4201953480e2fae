//! The gateway's own ceiling, measured in the same run: an in-process HTTP load generator
//! (keep-alive connections, a fixed number of concurrent senders, each POSTing the requests'
//! payload back to back for a few seconds) against a stand-in gateway. In: the gateway URL,
//! concurrency and duration; out: answered requests per second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

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

/// Sends POSTs to `url` from `concurrency` senders for `duration`.
pub async fn measure(
    url: &str,
    concurrency: u32,
    duration: Duration,
) -> Result<Ceiling, BenchError> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency as usize)
        .timeout(Duration::from_secs(10))
        .build()?;
    let body = serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x".repeat(200)}],
    })
    .to_string();
    let answered = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let end = started + duration;
    let mut senders = Vec::new();
    for _ in 0..concurrency {
        let (client, url, body) = (client.clone(), url.to_owned(), body.clone());
        let (answered, failed) = (Arc::clone(&answered), Arc::clone(&failed));
        senders.push(tokio::spawn(async move {
            while Instant::now() < end {
                let sent = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await;
                let ok = match sent {
                    Ok(resp) => resp.status().is_success() && resp.bytes().await.is_ok(),
                    Err(_) => false,
                };
                if ok { &answered } else { &failed }.fetch_add(1, Relaxed);
            }
        }));
    }
    for s in senders {
        s.await
            .map_err(|e| BenchError::Phase(format!("a load sender failed: {e}")))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let answered = answered.load(Relaxed);
    Ok(Ceiling {
        requests_per_s: answered as f64 / seconds,
        answered,
        failed: failed.load(Relaxed),
        seconds,
        concurrency,
    })
}
