//! What `inferq status --batches` shows: batches by status (the counts hash every move keeps)
//! and each batch not yet ended with its status and request counts, read from Redis.

use std::collections::BTreeMap;

use redis::AsyncCommands;

use crate::keys;

/// `HMGET` of a batch's status, total, completed, failed and ingested.
type Row = (
    Option<String>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
);

/// One batch not yet ended.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveBatch {
    pub id: String,
    pub status: String,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
    pub ingested: u64,
}

/// The batches of a deployment.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BatchCensus {
    pub by_status: BTreeMap<String, i64>,
    pub live: Vec<LiveBatch>,
}

/// Counts the batches; lists at most `most` live ones (the oldest due first).
pub async fn census<C: redis::aio::ConnectionLike + Send + Sync>(
    con: &mut C,
    most: isize,
) -> Result<BatchCensus, redis::RedisError> {
    let by_status: BTreeMap<String, i64> = con.hgetall(keys::counts()).await?;
    let ids: Vec<String> = con.zrange(keys::live(), 0, most - 1).await?;
    let mut live = Vec::with_capacity(ids.len());
    for id in ids {
        let f: Row = redis::cmd("HMGET")
            .arg(keys::batch(&id))
            .arg(&["status", "total", "completed", "failed", "ingested"])
            .query_async(con)
            .await?;
        live.push(LiveBatch {
            id,
            status: f.0.unwrap_or_default(),
            total: f.1.unwrap_or(0),
            completed: f.2.unwrap_or(0),
            failed: f.3.unwrap_or(0),
            ingested: f.4.unwrap_or(0),
        });
    }
    Ok(BatchCensus { by_status, live })
}
