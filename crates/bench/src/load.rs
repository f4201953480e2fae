//! The work a benchmark pushes through: requests with the reference's payload (the same
//! 200-character chat message BullMQ's jobs carry), pre-loaded through the library producer
//! ([`Producer::submit_many`]), and the two ways results are watched: `LLEN` of the result list
//! (drains, which must not add a consumer's commands per result) and a `BRPOP` loop that stamps
//! each result's arrival (open-loop phases).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::BenchError;
use inferq_client::producer::Producer;
use inferq_client::producer::{unix_ms, Popper, ProducerError};
use inferq_client::wire::NewRequest;
use inferq_sim::unix_us;

/// Requests per pipelined pre-load round trip.
pub(crate) const PRELOAD_BATCH: u64 = 1000;

/// The id of request `i` of a phase tagged `tag`.
pub(crate) fn request_id(tag: &str, i: u64) -> String {
    format!("{tag}-{i:07}")
}

/// Request `i` of a phase: deadline an hour away, the reference's payload.
pub(crate) fn request(tag: &str, i: u64) -> Result<NewRequest, BenchError> {
    let now_s = unix_ms() / 1000;
    let payload = serde_json::value::to_raw_value(&serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "x".repeat(200)}],
    }))
    .map_err(|e| BenchError::Phase(format!("cannot encode a payload: {e}")))?;
    Ok(NewRequest::new(request_id(tag, i), now_s + 3600, payload).with_created(now_s))
}

/// Submits requests `from..to` of `tag` in one pipelined round trip; fails if any is refused.
pub(crate) async fn submit_range(
    producer: &Producer,
    tag: &str,
    from: u64,
    to: u64,
) -> Result<(), BenchError> {
    let batch = (from..to)
        .map(|i| request(tag, i))
        .collect::<Result<Vec<_>, _>>()?;
    for outcome in producer.submit_many(batch).await? {
        outcome?;
    }
    Ok(())
}

/// Submits `n` requests of `tag` in batches of [`PRELOAD_BATCH`].
pub(crate) async fn preload(producer: &Producer, tag: &str, n: u64) -> Result<(), BenchError> {
    let mut next = 0;
    while next < n {
        let end = (next + PRELOAD_BATCH).min(n);
        submit_range(producer, tag, next, end).await?;
        next = end;
    }
    Ok(())
}

/// Waits until redis-server has no AOF rewrite running or scheduled (one that a pre-load set
/// off would otherwise run, on a core of its own, into the drain after it and be counted in
/// Redis's CPU for the drain, inferq's and BullMQ's alike). Returns the `INFO` calls it sent,
/// to leave out of the command counts; gives up waiting after `limit`.
pub(crate) async fn settle_aof(
    con: &mut MultiplexedConnection,
    limit: Duration,
) -> Result<u64, BenchError> {
    let started = Instant::now();
    let mut polls = 0u64;
    loop {
        let info: String = redis::cmd("INFO")
            .arg("persistence")
            .query_async(con)
            .await?;
        polls += 1;
        let busy = |field: &str| {
            info.lines()
                .any(|l| l.trim().strip_prefix(field).is_some_and(|v| v != "0"))
        };
        if !busy("aof_rewrite_in_progress:") && !busy("aof_rewrite_scheduled:") {
            return Ok(polls);
        }
        if started.elapsed() >= limit {
            return Ok(polls);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls `LLEN results` every few milliseconds until it reaches `n`; returns when the first
/// result was seen, when the last was, and how many `LLEN`s it sent (to leave out of the
/// command counts). `alive` is asked between
/// polls and ends the wait with its error (e.g. the processor died).
pub(crate) async fn wait_for_results(
    con: &mut MultiplexedConnection,
    results: &str,
    n: u64,
    limit: Duration,
    mut alive: impl FnMut() -> Result<(), BenchError>,
) -> Result<Watched, BenchError> {
    let started = Instant::now();
    let mut polls = 0u64;
    let mut first = None;
    loop {
        let len: u64 = redis::cmd("LLEN").arg(results).query_async(con).await?;
        polls += 1;
        let now = Instant::now();
        if len > 0 && first.is_none() {
            first = Some(now);
        }
        if len >= n {
            return Ok(Watched {
                first: first.unwrap_or(now),
                last: now,
                polls,
            });
        }
        if started.elapsed() > limit {
            return Err(BenchError::Phase(format!(
                "only {len} of {n} results after {} s",
                limit.as_secs()
            )));
        }
        alive()?;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// What [`wait_for_results`] saw.
pub(crate) struct Watched {
    pub first: Instant,
    pub last: Instant,
    pub polls: u64,
}

/// A `BRPOP` loop in its own task, stamping each result's arrival in Unix microseconds.
pub(crate) struct Collector {
    stamps: Arc<Mutex<HashMap<String, u64>>>,
    /// Set once the number to expect is known: (count, give up at).
    until: Arc<Mutex<Option<(u64, Instant)>>>,
    task: tokio::task::JoinHandle<Result<(), BenchError>>,
}

impl Collector {
    pub(crate) fn start(mut popper: Popper) -> Collector {
        let stamps = Arc::new(Mutex::new(HashMap::new()));
        let until: Arc<Mutex<Option<(u64, Instant)>>> = Arc::new(Mutex::new(None));
        let (s, u) = (Arc::clone(&stamps), Arc::clone(&until));
        let task = tokio::spawn(async move {
            loop {
                let target = *u.lock().unwrap_or_else(PoisonError::into_inner);
                let have = s.lock().unwrap_or_else(PoisonError::into_inner).len() as u64;
                if let Some((expected, give_up)) = target {
                    if have >= expected || Instant::now() >= give_up {
                        return Ok(());
                    }
                }
                match popper.pop(Duration::from_millis(200)).await {
                    Ok(Some(result)) => {
                        let at = unix_us();
                        s.lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .entry(result.id)
                            .or_insert(at);
                    }
                    Ok(None) => {}
                    Err(ProducerError::Redis(e)) => return Err(BenchError::Redis(e)),
                    // A result that does not parse is not one of ours.
                    Err(_) => {}
                }
            }
        });
        Collector {
            stamps,
            until,
            task,
        }
    }

    /// Waits for `expected` results (or `limit`), then returns each id's arrival time.
    pub(crate) async fn finish(
        self,
        expected: u64,
        limit: Duration,
    ) -> Result<HashMap<String, u64>, BenchError> {
        *self.until.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((expected, Instant::now() + limit));
        self.task
            .await
            .map_err(|e| BenchError::Phase(format!("the result reader failed: {e}")))??;
        let stamps =
            std::mem::take(&mut *self.stamps.lock().unwrap_or_else(PoisonError::into_inner));
        Ok(stamps)
    }
}
