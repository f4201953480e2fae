//! `inferq status --payloads`: the bodies stored apart (payload keys) in Redis, counted by a
//! `SCAN` of `request-payload:*` (every primary's, on a cluster): how many, how many bytes, and
//! how many belong to generations that have ended (the id's `request-active` marker no longer
//! names their token: a dead letter's body, which waits for its TTL, ten minutes past the
//! deadline). A queue's census cannot count them: the keys are per request, not per queue.
//!
//! In: a link to Redis. Out: a [`PayloadCensus`]. Written by hand over `SCAN`: redis-rs has no
//! cluster-wide scan, so a cluster's primaries are read from `CLUSTER NODES` and each scanned
//! in turn.

use futures::future::join_all;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::Cmd;

use super::QueueError;
use inferq_client::keys::active_key;
use inferq_client::target::Link;

/// The payload keys in Redis.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PayloadCensus {
    pub payload_keys: u64,
    pub payload_bytes: u64,
    /// Of those, bodies of generations that have ended (kept for a dead letter until their TTL).
    pub payload_keys_ended: u64,
}

const PATTERN: &str = "request-payload:*";
const PAGE: u64 = 1000;

/// Counts the payload keys.
pub async fn payload_census(link: &mut Link) -> Result<PayloadCensus, QueueError> {
    let mut census = PayloadCensus::default();
    let nodes = primaries(link).await?;
    for node in nodes {
        let mut cursor = 0u64;
        loop {
            let mut scan = redis::cmd("SCAN");
            scan.arg(cursor)
                .arg("MATCH")
                .arg(PATTERN)
                .arg("COUNT")
                .arg(PAGE);
            let (next, keys): (u64, Vec<String>) = on(link, node.as_ref(), &scan).await?;
            count(link, &keys, &mut census).await?;
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(census)
}

/// The cluster's primaries as `(host, port)`; one `None` (the link's own server) otherwise.
pub(crate) async fn primaries(link: &mut Link) -> Result<Vec<Option<(String, u16)>>, QueueError> {
    if !link.is_cluster() {
        return Ok(vec![None]);
    }
    let nodes: String = redis::cmd("CLUSTER").arg("NODES").query_async(link).await?;
    let mut out = Vec::new();
    for line in nodes.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
            continue;
        }
        let addr = addr.split('@').next().unwrap_or("");
        if let Some((host, port)) = addr.rsplit_once(':') {
            if let Ok(port) = port.parse() {
                out.push(Some((host.to_owned(), port)));
            }
        }
    }
    Ok(out)
}

/// Runs `cmd` on `node` (a cluster's primary), or on the link's server.
pub(crate) async fn on<T: redis::FromRedisValue>(
    link: &mut Link,
    node: Option<&(String, u16)>,
    cmd: &Cmd,
) -> Result<T, QueueError> {
    match (node, link) {
        (Some((host, port)), Link::Cluster(c)) => {
            let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
                host: host.clone(),
                port: *port,
            });
            let reply = c.route_command(cmd.clone(), routing).await?;
            Ok(redis::from_redis_value(reply).map_err(redis::RedisError::from)?)
        }
        (_, link) => Ok(cmd.query_async(link).await?),
    }
}

/// Adds a page of keys: each one's size, and whether its generation is still the active one.
async fn count(link: &Link, keys: &[String], census: &mut PayloadCensus) -> Result<(), QueueError> {
    let reads = keys.iter().map(|key| {
        let mut con = link.clone();
        async move {
            let bytes: u64 = redis::cmd("STRLEN").arg(key).query_async(&mut con).await?;
            // request-payload:<id>:<token>; an id may hold ':' itself.
            let (id, token) = key
                .strip_prefix("request-payload:")
                .and_then(|rest| rest.rsplit_once(':'))
                .unwrap_or(("", ""));
            let active: Option<String> = redis::cmd("GET")
                .arg(active_key(id))
                .query_async(&mut con)
                .await?;
            Ok::<_, redis::RedisError>((bytes, active.as_deref() != Some(token)))
        }
    });
    for read in join_all(reads).await {
        let (bytes, ended) = read?;
        census.payload_keys += 1;
        census.payload_bytes += bytes;
        census.payload_keys_ended += u64::from(ended);
    }
    Ok(())
}
