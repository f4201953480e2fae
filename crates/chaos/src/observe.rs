//! Reading what Redis holds for the checker: whole lists (LRANGE, without consuming them)
//! and the size of every key a queue uses.

use std::collections::BTreeMap;

use redis::aio::ConnectionLike;

use inferq_client::keys::QueueKeys;

/// Every entry of a list, newest first.
pub async fn lrange<C: ConnectionLike>(
    con: &mut C,
    key: &str,
) -> Result<Vec<Vec<u8>>, redis::RedisError> {
    redis::cmd("LRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query_async(con)
        .await
}

/// The size of every key the queue uses (ZCARD, HLEN or LLEN by type; 0 when absent).
pub async fn key_sizes<C: ConnectionLike>(
    con: &mut C,
    keys: &QueueKeys,
) -> Result<BTreeMap<String, u64>, redis::RedisError> {
    let mut out = BTreeMap::new();
    for key in keys.all() {
        let kind: String = redis::cmd("TYPE").arg(key).query_async(con).await?;
        let n: u64 = match kind.as_str() {
            "zset" => redis::cmd("ZCARD").arg(key).query_async(con).await?,
            "hash" => redis::cmd("HLEN").arg(key).query_async(con).await?,
            "list" => redis::cmd("LLEN").arg(key).query_async(con).await?,
            "none" => 0,
            // A key of an unexpected type is itself a finding: count it as one entry.
            _ => 1,
        };
        out.insert(key.to_owned(), n);
    }
    Ok(out)
}
