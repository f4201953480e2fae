//! A census of one queue: how many of its requests are in each place of the durability contract
//! (pending, claimed, parked, dead) and how many of those need attention (deadline passed, lease
//! run out, backoff elapsed, delivered again), read in one step by the `census` script.
//!
//! A queue name (and optionally its result list) comes in; a [`Census`] goes out, for
//! `inferq status`. Nothing is moved, and the script also runs on a read-only replica.

use redis::aio::ConnectionLike;
use redis::Value;

use super::moves::QueueError;
use inferq_client::keys::QueueKeys;
use inferq_client::scripts::SCRIPTS;
use inferq_client::target::Link;

/// Where a queue's requests are, at one instant of Redis's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Census {
    /// Redis's clock when the census was taken, Unix milliseconds.
    pub at_ms: i64,
    /// Waiting to be claimed.
    pub pending: u64,
    /// Of those, requests whose deadline has passed (each will be answered DEADLINE_EXCEEDED).
    pub overdue: u64,
    /// Held by a processor under a lease.
    pub claimed: u64,
    /// Of those, claims whose lease ran out and that no reclaim has moved yet: their owner is
    /// gone or cannot reach Redis.
    pub lease_expired: u64,
    /// Waiting out a retry backoff.
    pub parked: u64,
    /// Of those, retries whose backoff has elapsed (a processor promotes them at its next tick).
    pub parked_due: u64,
    /// Dead-letter records (`inferq dead-letter list`).
    pub dead: u64,
    /// Unfinished requests whose lease ran out at least once, so they are being run again.
    pub redelivered: u64,
    /// Results waiting in the result list, when one was named.
    pub results: Option<u64>,
}

impl Census {
    /// Requests not yet finished: pending, claimed or parked.
    pub fn unfinished(&self) -> u64 {
        self.pending + self.claimed + self.parked
    }
}

/// Takes the census of `queue` (and the length of `results`, a list, when given) on a
/// standalone or Sentinel-managed Redis.
pub async fn census<C: ConnectionLike>(
    con: &mut C,
    queue: &str,
    results: Option<&str>,
) -> Result<Census, QueueError> {
    census_of(con, &QueueKeys::new(queue), results).await
}

/// [`census`] on any [`Link`]. On a cluster the result list is in a slot of its own, so its
/// length is read apart from the script (a moment later).
pub async fn census_on(
    con: &mut Link,
    queue: &str,
    results: Option<&str>,
) -> Result<Census, QueueError> {
    if !con.is_cluster() {
        return census(con, queue, results).await;
    }
    let mut census = census_of(con, &QueueKeys::clustered(queue), None).await?;
    if let Some(list) = results {
        let n: u64 = redis::cmd("LLEN").arg(list).query_async(con).await?;
        census.results = Some(n);
    }
    Ok(census)
}

async fn census_of<C: ConnectionLike>(
    con: &mut C,
    keys: &QueueKeys,
    results: Option<&str>,
) -> Result<Census, QueueError> {
    let mut names = vec![
        keys.pending.as_str(),
        &keys.claimed,
        &keys.idx,
        &keys.parked,
        &keys.dead,
        &keys.deliveries,
    ];
    names.extend(results);
    let cmd = SCRIPTS.census.cmd(&names, &[] as &[&str]);
    let reply = SCRIPTS.census.run(con, &cmd).await?;
    let bad = || QueueError::Reply {
        script: "census",
        detail: format!("{reply:?}"),
    };
    let numbers: Vec<i64> = match &reply {
        Value::Array(items) => items
            .iter()
            .map(|v| match v {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(bad)?,
        _ => return Err(bad()),
    };
    let count = |i: usize| {
        numbers
            .get(i)
            .and_then(|&n| u64::try_from(n).ok())
            .ok_or_else(bad)
    };
    Ok(Census {
        at_ms: numbers.first().copied().ok_or_else(bad)?,
        pending: count(1)?,
        overdue: count(2)?,
        claimed: count(3)?,
        lease_expired: count(4)?,
        parked: count(5)?,
        parked_due: count(6)?,
        dead: count(7)?,
        redelivered: count(8)?,
        results: results.map(|_| count(9)).transpose()?,
    })
}
