//! Redis's memory policy, watched: inferq's promises rest on Redis keeping every key it was
//! given, which `maxmemory-policy noeviction` guarantees and an evicting policy does not. Under
//! `allkeys-*` Redis deletes any key once `maxmemory` is reached (a queue, its claims, a result
//! list: requests and results vanish without a trace); under `volatile-*` it deletes keys that
//! carry a TTL (cancel markers, the redis-pubsub admit markers).
//!
//! In: the processor's connection. Out: log lines only. At start-up ([`check_at_start`]) the
//! policy is read once (`INFO memory stats`, which a least-privilege user may run where `CONFIG` is
//! refused) and an evicting one is warned about before the processor says it is ready. While it
//! runs ([`watch`]), the policy and the server's `evicted_keys` count are read every
//! [`WATCH_EVERY`]: a policy changed at run time is warned about, and keys evicted under an
//! evicting policy are an error naming how many. Nothing here changes how work moves: whether
//! to run on such a Redis is the operator's decision, and the log tells them what it costs.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::queue::traced::Con;

/// How often the policy and the eviction count are read while the processor runs.
pub const WATCH_EVERY: Duration = Duration::from_secs(5);

/// What `INFO memory` and `INFO stats` say about evictions.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryState {
    /// `maxmemory_policy`, when Redis told it.
    pub policy: Option<String>,
    /// `maxmemory` in bytes (0: no limit), when Redis told it.
    pub maxmemory: Option<u64>,
    /// `evicted_keys` since the server started, when Redis told it.
    pub evicted: Option<u64>,
}

/// What an eviction policy can take from inferq, or `None` for `noeviction`.
pub fn policy_risk(policy: &str) -> Option<&'static str> {
    if policy == "noeviction" {
        None
    } else if policy.starts_with("allkeys-") {
        Some(
            "once maxmemory is reached Redis deletes any key: queued requests, claims and \
             result lists can vanish without a result (set maxmemory-policy noeviction)",
        )
    } else {
        Some(
            "once maxmemory is reached Redis deletes keys that carry a TTL: a cancel marker can \
             vanish before its request is cancelled, and a redis-pubsub message be admitted \
             twice (set maxmemory-policy noeviction)",
        )
    }
}

/// The value of `field` in an `INFO` reply.
fn info_field<'a>(info: &'a str, field: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(str::trim)
    })
}

/// Reads the memory policy and the eviction count (`INFO memory stats`, one call). A field Redis
/// does not report is `None`.
///
/// On a Redis Cluster `INFO` is answered by every node: the state is the riskiest node's (the
/// first whose policy evicts, else the first), with the evictions of all nodes added up.
pub async fn read(con: &Con) -> Result<MemoryState, redis::RedisError> {
    use redis::FromRedisValue;
    // Both sections in one call (Redis 7 and Valkey take several section names).
    let reply: redis::Value = redis::cmd("INFO")
        .arg("memory")
        .arg("stats")
        .query_async(&mut con.clone())
        .await?;
    let texts: Vec<String> = match reply {
        redis::Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(_, info)| String::from_redis_value(info).ok())
            .collect(),
        one => vec![String::from_redis_value(one)?],
    };
    let states: Vec<MemoryState> = texts
        .iter()
        .map(|info| MemoryState {
            policy: info_field(info, "maxmemory_policy").map(str::to_owned),
            maxmemory: info_field(info, "maxmemory").and_then(|v| v.parse().ok()),
            evicted: info_field(info, "evicted_keys").and_then(|v| v.parse().ok()),
        })
        .collect();
    let evicted = states
        .iter()
        .filter_map(|s| s.evicted)
        .reduce(|a, b| a.saturating_add(b));
    let riskiest = states
        .iter()
        .position(|s| s.policy.as_deref().and_then(policy_risk).is_some())
        .unwrap_or(0);
    Ok(match states.into_iter().nth(riskiest) {
        Some(state) => MemoryState { evicted, ..state },
        None => MemoryState {
            policy: None,
            maxmemory: None,
            evicted: None,
        },
    })
}

/// Warns when Redis runs with an evicting policy. Returns what was read, for [`watch`] to go on
/// from (`None` when Redis would not say).
pub async fn check_at_start(con: &Con) -> Option<MemoryState> {
    match read(con).await {
        Ok(state) => {
            warn_policy(&state);
            Some(state)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot ask Redis for its maxmemory-policy (INFO memory); if it evicts keys, requests and results can vanish");
            None
        }
    }
}

fn warn_policy(state: &MemoryState) {
    let Some(policy) = state.policy.as_deref() else {
        return;
    };
    if let Some(risk) = policy_risk(policy) {
        tracing::warn!(
            maxmemory_policy = policy,
            maxmemory = state.maxmemory.unwrap_or(0),
            "Redis runs with an evicting maxmemory-policy: {risk}"
        );
    }
}

/// Reads the policy and the eviction count every [`WATCH_EVERY`] until `stop`: a policy that
/// changed is warned about as at start-up, and keys evicted since the last look under an
/// evicting policy are an error. `last` is what [`check_at_start`] read.
pub async fn watch(con: Con, mut last: Option<MemoryState>, stop: CancellationToken) {
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(WATCH_EVERY) => {}
        }
        // A failed read (Redis down, INFO refused) is someone else's to report.
        let Ok(now) = read(&con).await else {
            continue;
        };
        let before = last.as_ref();
        if before.and_then(|b| b.policy.as_deref()) != now.policy.as_deref() {
            warn_policy(&now);
        }
        let evicting = now.policy.as_deref().and_then(policy_risk).is_some();
        let since = evicted_since(before, &now);
        if evicting && since > 0 {
            tracing::error!(
                evicted_keys = since,
                maxmemory_policy = now.policy.as_deref().unwrap_or(""),
                "Redis evicted keys to stay under maxmemory: requests, claims or results of inferq's queues may be gone without a result (set maxmemory-policy noeviction)"
            );
        }
        last = Some(now);
    }
}

/// Keys evicted between two reads. A count lower than the last is a restarted server (or
/// `CONFIG RESETSTAT`): all of its evictions are new. Without a last count (start-up could not
/// read one) the first is only a baseline: the server may have evicted them long before inferq
/// started, and naming them as just evicted would send an operator after a loss that is not one.
fn evicted_since(before: Option<&MemoryState>, now: &MemoryState) -> u64 {
    match (before.and_then(|b| b.evicted), now.evicted) {
        (Some(b), Some(n)) if n >= b => n - b,
        (Some(_), Some(n)) => n,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::RedisServer;

    #[test]
    fn only_noeviction_is_safe() {
        assert_eq!(policy_risk("noeviction"), None);
        assert!(policy_risk("allkeys-lru").is_some_and(|r| r.contains("queued requests")));
        assert!(policy_risk("volatile-ttl").is_some_and(|r| r.contains("TTL")));
    }

    #[test]
    fn reads_fields_of_an_info_reply() {
        let info = "# Memory\r\nmaxmemory:1024\r\nmaxmemory_human:1.00K\r\nmaxmemory_policy:allkeys-lru\r\n";
        assert_eq!(info_field(info, "maxmemory"), Some("1024"));
        assert_eq!(info_field(info, "maxmemory_policy"), Some("allkeys-lru"));
        assert_eq!(info_field(info, "evicted_keys"), None);
    }

    /// Evictions are counted between two reads; a first read after a start-up that could not
    /// read the count is a baseline (it used to be reported whole, evictions from before inferq
    /// started included), and a count that went down (a restarted server) is all new.
    #[test]
    fn evictions_are_counted_from_the_last_read() {
        let at = |evicted: Option<u64>| MemoryState {
            policy: Some("allkeys-lru".to_owned()),
            maxmemory: Some(1 << 20),
            evicted,
        };
        assert_eq!(evicted_since(Some(&at(Some(10))), &at(Some(15))), 5);
        assert_eq!(evicted_since(Some(&at(Some(10))), &at(Some(10))), 0);
        assert_eq!(evicted_since(None, &at(Some(1_000))), 0);
        assert_eq!(evicted_since(Some(&at(None)), &at(Some(1_000))), 0);
        assert_eq!(evicted_since(Some(&at(Some(1_000))), &at(Some(3))), 3);
    }

    /// The policy and the eviction count come from a real server, and follow `CONFIG SET`.
    #[tokio::test]
    async fn reads_the_policy_and_evictions_of_a_real_server() {
        let server = RedisServer::start().expect("redis-server");
        let client = server.client().expect("client");
        let con = Con::plain(
            inferq_client::connect::manager(&client)
                .await
                .expect("connect"),
        );
        let state = read(&con).await.expect("info");
        assert_eq!(state.policy.as_deref(), Some("noeviction"));
        assert_eq!(state.evicted, Some(0));
        inferq_testkit::config_set(&mut con.clone(), "maxmemory-policy", "allkeys-lru")
            .await
            .expect("config set");
        let state = read(&con).await.expect("info");
        assert_eq!(state.policy.as_deref(), Some("allkeys-lru"));
    }
}
