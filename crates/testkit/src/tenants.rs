//! Tenants' queues filled straight, as a producer that keeps `fair-share`'s index writes them:
//! each tenant's requests submitted into its own queue (`<prefix><tenant>`), then the queue
//! added to the index of queues with work. For fair-share tests and `bench-batch --tenants`.
//!
//! In: a Redis URL, the prefix and index, how many tenants (`t0`, `t1`, ...) with how many
//! requests each (ids `t<n>-<i>`, a small chat body, a deadline an hour away), and the result
//! list they name. Out: the queues filled; the first error (connect, submit, `ZADD`) ends it.

use inferq_client::producer::{unix_ms, Producer};
use inferq_client::NewRequest;

/// Why filling the queues stopped.
pub type FillError = Box<dyn std::error::Error + Send + Sync>;

/// Where and what to write.
#[derive(Debug, Clone)]
pub struct TenantQueues<'a> {
    pub url: &'a str,
    /// Queue names are the prefix and the tenant.
    pub prefix: &'a str,
    /// The zset of queues with work; `None`: all requests go to `shared` instead, no index.
    pub index: Option<&'a str>,
    /// The one queue of a run without an index.
    pub shared: &'a str,
    pub results: &'a str,
    pub tenants: usize,
    pub each: usize,
}

/// Writes every tenant's requests, and each queue into the index.
pub async fn fill(q: &TenantQueues<'_>) -> Result<(), FillError> {
    let producer = Producer::connect(q.url, q.shared, q.results).await?;
    let mut con = redis::Client::open(q.url)?
        .get_multiplexed_async_connection()
        .await?;
    let deadline = unix_ms() / 1000 + 3600;
    let body = r#"{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#;
    for t in 0..q.tenants {
        let reqs = (0..q.each)
            .map(|i| {
                let payload = serde_json::value::RawValue::from_string(body.to_owned())?;
                Ok(NewRequest::new(format!("t{t}-{i}"), deadline, payload)
                    .with_created(deadline - 3600)
                    .with_endpoint("/v1/chat/completions"))
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        let queue = format!("{}t{t}", q.prefix);
        let p = match q.index {
            Some(_) => producer.for_queue(&queue),
            None => producer.clone(),
        };
        for outcome in p.submit_many(reqs).await? {
            outcome?;
        }
        if let Some(index) = q.index {
            let _: i64 = redis::cmd("ZADD")
                .arg(index)
                .arg(unix_ms())
                .arg(&queue)
                .query_async(&mut con)
                .await?;
        }
    }
    Ok(())
}
