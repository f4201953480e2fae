//! `deadline_proximity_millis` (go-v011 §4): how far a queue's pending requests are from their
//! deadlines, read as one pipeline beside the backlog's `ZCARD`: one `ZCOUNT <queue> -inf
//! <now + bound>` per histogram bound (a member's score is its deadline in seconds, plus the FIFO
//! fraction under a second). One round trip per backlog poll
//! (`--metrics-backlog-poll-interval`), not per request; each `ZCOUNT` is O(log n) in Redis.
//! The measured cost on a queue of a million members is in `docs/benchmarks.md`.

use redis::aio::ConnectionLike;

use crate::ops::dispatch_metrics::PROXIMITY_BOUNDS_MS;

/// One reading: the pending requests, and how many are within each bound of their deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    pub pending: u64,
    /// Cumulative, one per [`PROXIMITY_BOUNDS_MS`].
    pub within: Vec<u64>,
}

/// The pipeline: `ZCARD`, then the `ZCOUNT`s, for a queue at Unix time `now_ms`.
pub fn pipeline(queue: &str, now_ms: i64) -> redis::Pipeline {
    let mut p = redis::pipe();
    p.cmd("ZCARD").arg(queue);
    for bound in PROXIMITY_BOUNDS_MS {
        let max = (now_ms as f64 + bound) / 1000.0;
        p.cmd("ZCOUNT").arg(queue).arg("-inf").arg(max);
    }
    p
}

/// Reads the queue's backlog and proximity in one round trip.
pub async fn read<C: ConnectionLike>(
    con: &mut C,
    queue: &str,
    now_ms: i64,
) -> redis::RedisResult<Reading> {
    let counts: Vec<u64> = pipeline(queue, now_ms).query_async(con).await?;
    let (pending, within) = counts.split_first().map_or((0, &[][..]), |(p, w)| (*p, w));
    Ok(Reading {
        pending,
        within: within.to_vec(),
    })
}
