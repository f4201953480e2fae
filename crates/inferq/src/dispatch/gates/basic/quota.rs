//! `redis-quota`: a quota per value of one metadata attribute (`attribute`, default `userid`),
//! kept in Redis under `<prefix><attribute>:<value>` (prefix default `quota:`), so every processor
//! replica shares it.
//!
//! - `mode: concurrency`: at most `limit` requests in flight per value. Taking a slot is one Lua
//!   step (inferq-client's `quotaAcquire-1.lua`, shared with the front door's passthrough); the
//!   slot is given back by the decision's release (`quotaRelease-1.lua`), or in the background
//!   if the release is dropped unrun; one that cannot reach Redis is tried again in the background for up to the counter's TTL. The
//!   counter expires `window` after its last take (300 s for a zero window) in case holders die.
//! - `mode: rate-limit` (default): at most `limit` admissions per sliding `window` (default
//!   `1m`), one Lua step reckoned by Redis's clock (`lua/rateAdmit-1.lua`), scored in Unix
//!   nanoseconds as Go scores them, so both share a window. Nothing to give back.
//! - any other mode is refused at start-up (Go let every request through, so a misspelt mode
//!   switched the quota off).
//!
//! A request gets classification `reserved` (it got a unit) or `overflow`. `gating_mode: blocking`
//! (default) refuses overflow; `classifying` lets it continue, labelled, for a later gate (e.g.
//! `tier-priority-admission`) to judge. Go read any other gating mode as `classifying`; inferq
//! refuses it. A request without the attribute
//! continues unclassified. A Redis failure is a gate error. Budget is always 1.0.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::future::BoxFuture;
use inferq_client::scripts::SCRIPTS;
use redis::Script;

use super::link::{self, Link};
use super::{OVERFLOW, RESERVED};
use crate::config::gate_params::Params;
use crate::dispatch::gates::{Decision, Gate, GateError, GateInput, Release, Verdict};

static RATE_ADMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/rateAdmit-1.lua")));

/// The counter TTL of a concurrency quota whose window is zero (Go's value).
const DEFAULT_SLOT_TTL_SECS: u64 = 300;
/// The TTL of a rate-limit window set whose window is zero (Go's value).
const DEFAULT_WINDOW_TTL: Duration = Duration::from_secs(3600);

/// The longest rate-limit window, in nanoseconds: the script does exact arithmetic on it in
/// Lua's doubles (2^53 − 1 ns, about 104 days).
const MAX_WINDOW_NS: u64 = (1 << 53) - 1;

const GATE: &str = "redis-quota";

/// Builds a `redis-quota` gate.
pub(super) fn build(p: Params<'_>) -> Result<Arc<dyn Gate>, GateError> {
    let link = link::link(&p)?;
    let limit = match p.int("limit")? {
        None => return Err(param_error("limit", "required")),
        Some(n) if n <= 0 => return Err(param_error("limit", format!("must be > 0, got {n}"))),
        Some(n) => n,
    };
    let window = p.duration_or("window", Duration::from_secs(60))?;
    let mode = match p.string_or("mode", "rate-limit").as_str() {
        "rate-limit" => Mode::RateLimit,
        "concurrency" => Mode::Concurrency,
        other => {
            return Err(param_error(
                "mode",
                format!("must be rate-limit or concurrency, got {other:?}"),
            ))
        }
    };
    // Newest Go refuses a zero window in rate-limit mode at start-up (go-v011 §1): it admitted
    // every request before.
    if mode == Mode::RateLimit && window.is_zero() {
        return Err(param_error("window", "must be > 0 in rate-limit mode"));
    }
    let gating_mode = p.string_or("gating_mode", "blocking");
    if gating_mode != "blocking" && gating_mode != "classifying" {
        return Err(param_error(
            "gating_mode",
            format!("must be blocking or classifying, got {gating_mode:?}"),
        ));
    }
    Ok(Arc::new(Quota {
        link,
        attribute: p.string_or("attribute", "userid"),
        prefix: p.string_or("prefix", "quota:"),
        mode,
        limit,
        window,
        blocking: gating_mode == "blocking",
    }))
}

fn param_error(param: &str, reason: impl Into<String>) -> GateError {
    GateError::Param {
        gate: GATE,
        param: param.to_owned(),
        reason: reason.into(),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    RateLimit,
    Concurrency,
}

/// What a take got.
enum Taken {
    /// A unit, with the release that gives it back when there is one to give back.
    Reserved(Option<Release>),
    /// Nothing: the quota is used up.
    Overflow,
}

struct Quota {
    link: Arc<Link>,
    attribute: String,
    prefix: String,
    mode: Mode,
    limit: i64,
    window: Duration,
    /// Refuse overflow (`blocking`) rather than only label it (`classifying`).
    blocking: bool,
}

impl Quota {
    /// The concurrency counter's TTL: the window in whole seconds, rounded up.
    fn slot_ttl_secs(&self) -> u64 {
        if self.window.is_zero() {
            DEFAULT_SLOT_TTL_SECS
        } else {
            self.window.as_secs() + u64::from(self.window.subsec_nanos() > 0)
        }
    }

    /// Tries to take a unit of the quota under `key`; an error is a Redis failure.
    async fn take(&self, key: &str) -> Result<Taken, link::CallError> {
        match self.mode {
            Mode::Concurrency => {
                let ttl = self.slot_ttl_secs();
                let call = async {
                    let mut con = self.link.con().await?;
                    let script = &SCRIPTS.quota_acquire;
                    let cmd = script.cmd(&[key], &[self.limit.to_string(), ttl.to_string()]);
                    script.run(&mut con, &cmd).await
                };
                if link::within(&self.link, call).await? != redis::Value::Int(1) {
                    return Ok(Taken::Overflow);
                }
                let slot = Slot {
                    link: self.link.clone(),
                    key: key.to_owned(),
                    ttl,
                    given_back: false,
                };
                Ok(Taken::Reserved(Some(Release::new(move || {
                    Box::pin(slot.give_back())
                }))))
            }
            Mode::RateLimit => {
                let window_ns = u64::try_from(self.window.as_nanos())
                    .unwrap_or(u64::MAX)
                    .min(MAX_WINDOW_NS);
                let ttl = if self.window.is_zero() {
                    DEFAULT_WINDOW_TTL
                } else {
                    self.window.saturating_mul(2)
                };
                let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
                let nonce = format!("{:016x}", rand::random::<u64>());
                let call = async {
                    let mut con = self.link.con().await?;
                    RATE_ADMIT
                        .key(key)
                        .arg(self.limit)
                        .arg(window_ns)
                        .arg(ttl_ms)
                        .arg(&nonce)
                        .invoke_async::<i64>(&mut con)
                        .await
                };
                Ok(if link::within(&self.link, call).await? == 1 {
                    Taken::Reserved(None)
                } else {
                    Taken::Overflow
                })
            }
        }
    }
}

impl Gate for Quota {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(std::future::ready(1.0))
    }

    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let value = match input.metadata.get(&self.attribute) {
                Some(v) if !v.is_empty() => v,
                _ => return Ok(Decision::go()),
            };
            let key = format!("{}{}:{}", self.prefix, self.attribute, value);
            let (classification, releases) = match self.take(&key).await {
                Ok(Taken::Reserved(release)) => (RESERVED, release.into_iter().collect()),
                Ok(Taken::Overflow) => (OVERFLOW, Vec::new()),
                Err(source) => {
                    return Err(GateError::Redis {
                        gate: GATE,
                        source: Arc::new(source),
                    })
                }
            };
            let verdict = if classification == OVERFLOW && self.blocking {
                Verdict::Refuse
            } else {
                Verdict::Continue
            };
            Ok(Decision {
                verdict,
                classification: Some(classification.to_owned()),
                releases,
                preempt: None,
            })
        })
    }
}

/// A taken concurrency slot. Given back by its release; if the release is dropped without
/// running (a cancelled chain), the drop gives it back in the background.
struct Slot {
    link: Arc<Link>,
    key: String,
    ttl: u64,
    given_back: bool,
}

impl Slot {
    async fn give_back(mut self) {
        self.given_back = true;
        give_back(self.link.clone(), std::mem::take(&mut self.key), self.ttl).await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.given_back {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (link, key, ttl) = (self.link.clone(), std::mem::take(&mut self.key), self.ttl);
            runtime.spawn(give_back(link, key, ttl));
        }
    }
}

/// The first pause before a give-back that could not reach Redis is tried again; it doubles up
/// to [`GIVE_BACK_PAUSE_MAX`].
const GIVE_BACK_PAUSE: Duration = Duration::from_millis(100);
const GIVE_BACK_PAUSE_MAX: Duration = Duration::from_secs(2);

/// Why one give-back did not land.
struct NotGivenBack {
    reason: String,
    /// The connection failed (refused, reset, dropped), so Redis most likely never ran it and
    /// it is tried again. Should it have run, the slot is given back twice: the counter then
    /// admits one request too many until it drops to its floor of zero, the next time the
    /// user has nothing in flight; a slot never given back, by contrast, stays held for as long
    /// as the user keeps sending. A call that timed out on a live connection may well have
    /// run, so it is not tried again.
    unsent: bool,
}

/// Gives one slot of `key` back. When Redis cannot be reached (restarting, a blip), the slot
/// is offered back again in the background, with backoff, for up to the counter's TTL: under
/// steady traffic every take refreshes that TTL, so a slot given up would stay held for as long
/// as the user keeps sending, and each blip would shrink their quota for good.
async fn give_back(link: Arc<Link>, key: String, ttl: u64) {
    let Err(first) = give_back_once(&link, &key, ttl).await else {
        return;
    };
    if !first.unsent {
        tracing::warn!(key, reason = %first.reason, "redis-quota gate: slot not given back; it expires with its counter");
        return;
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    tracing::warn!(key, reason = %first.reason, "redis-quota gate: cannot give a slot back yet; trying again while Redis is unreachable");
    runtime.spawn(async move {
        let until = tokio::time::Instant::now() + Duration::from_secs(ttl);
        let mut pause = GIVE_BACK_PAUSE;
        loop {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(GIVE_BACK_PAUSE_MAX);
            match give_back_once(&link, &key, ttl).await {
                Ok(()) => return,
                Err(e) if e.unsent && tokio::time::Instant::now() < until => {}
                Err(e) => {
                    tracing::warn!(key, reason = %e.reason, "redis-quota gate: slot not given back; it expires with its counter");
                    return;
                }
            }
        }
    });
}

/// One `quotaRelease` call, bounded by [`link::CALL_TIMEOUT`].
async fn give_back_once(link: &Link, key: &str, ttl: u64) -> Result<(), NotGivenBack> {
    let call = async {
        let mut con = link.con().await?;
        let script = &SCRIPTS.quota_release;
        script.run(&mut con, &script.cmd(&[key], &[ttl])).await
    };
    match tokio::time::timeout(link::CALL_TIMEOUT, call).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(e)) => Err(NotGivenBack {
            unsent: e.is_connection_refusal() || e.is_io_error() || e.is_connection_dropped(),
            reason: format!("redis {}: {e}", link.shown),
        }),
        Err(_) => Err(NotGivenBack {
            reason: format!(
                "redis {}: no answer within {} ms",
                link.shown,
                link::CALL_TIMEOUT.as_millis()
            ),
            unsent: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use redis::AsyncCommands;
    use serde_json::{json, Value};

    use super::super::testing::*;
    use super::*;
    use inferq_testkit::RedisServer;

    fn params(server: &RedisServer, extra: Value) -> Value {
        let mut p = json!({"address": format!("127.0.0.1:{}", server.port())});
        if let (Some(p), Value::Object(extra)) = (p.as_object_mut(), extra) {
            p.extend(extra);
        }
        p
    }

    #[tokio::test]
    async fn concurrency_limit_release_and_ttl() {
        let server = RedisServer::start().unwrap();
        let mut con = server.connection().await.unwrap();
        let p = params(
            &server,
            json!({"mode": "concurrency", "limit": "2", "window": "10s"}),
        );
        let g = gate("redis-quota", p).unwrap();
        assert_eq!(g.budget().await, 1.0);
        let alice = [("userid", "alice")];

        let first = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(name(&first.verdict), "continue");
        assert_eq!(first.classification.as_deref(), Some("reserved"));
        assert_eq!(first.releases.len(), 1);
        let ttl: i64 = con.ttl("quota:userid:alice").await.unwrap();
        assert!((9..=10).contains(&ttl), "ttl {ttl}");

        let _: () = con.expire("quota:userid:alice", 3).await.unwrap();
        let second = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(second.classification.as_deref(), Some("reserved"));
        let ttl: i64 = con.ttl("quota:userid:alice").await.unwrap();
        assert!(ttl >= 9, "ttl refreshed on take: {ttl}");

        let third = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(name(&third.verdict), "refuse");
        assert_eq!(third.classification.as_deref(), Some("overflow"));
        assert!(third.releases.is_empty());
        let bob = apply(g.as_ref(), &[("userid", "bob")], &[]).await;
        assert_eq!(name(&bob.verdict), "continue", "quotas are per value");

        let _: () = con.expire("quota:userid:alice", 3).await.unwrap();
        Decision::release_all(first.releases).await;
        let held: i64 = con.get("quota:userid:alice").await.unwrap();
        assert_eq!(held, 1);
        let ttl: i64 = con.ttl("quota:userid:alice").await.unwrap();
        assert!(ttl >= 9, "ttl refreshed on release: {ttl}");
        let again = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(name(&again.verdict), "continue", "a release frees a slot");

        // A release dropped unrun still gives its slot back (from a task of its own).
        drop(again);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let held: i64 = con.get("quota:userid:alice").await.unwrap();
            if held == 1 {
                break;
            }
            assert_eq!(held, 2, "only the dropped release may give a slot back");
            assert!(
                std::time::Instant::now() < deadline,
                "the dropped release never gave its slot back"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Decision::release_all(second.releases).await;
        give_back(g_link(&server), "quota:userid:alice".to_owned(), 10).await;
        let held: i64 = con.get("quota:userid:alice").await.unwrap();
        assert_eq!(held, 0, "never below zero");
    }

    /// A slot given back while Redis is unreachable (restarting, a blip) is given back once it
    /// answers again. It used to be given up at the first failure: under steady traffic the
    /// counter's TTL is refreshed by every take and never runs out, so each blip left the user
    /// one slot short for good (a soak saw 13 slots lost in one Redis restart).
    #[tokio::test]
    async fn a_give_back_that_meets_redis_down_lands_once_it_is_back() {
        let mut server = RedisServer::start().unwrap();
        let p = params(
            &server,
            json!({"mode": "concurrency", "limit": 1, "window": "60s"}),
        );
        let g = gate("redis-quota", p).unwrap();
        let alice = [("userid", "alice")];
        let taken = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(name(&taken.verdict), "continue");

        server.kill();
        Decision::release_all(taken.releases).await;
        server.restart().unwrap();

        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // Just restarted, Redis may still refuse a connection or answer LOADING: asked again.
        let mut con = loop {
            match server.connection().await {
                Ok(con) => break con,
                Err(e) => assert!(std::time::Instant::now() < deadline, "{e}"),
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        loop {
            let held: Option<i64> = match con.get("quota:userid:alice").await {
                Ok(held) => held,
                Err(e) => {
                    assert!(std::time::Instant::now() < deadline, "{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            if held == Some(0) {
                break;
            }
            assert_eq!(held, Some(1), "the slot taken before the restart");
            assert!(
                std::time::Instant::now() < deadline,
                "the slot was never given back: alice stays a slot short"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let again = apply(g.as_ref(), &alice, &[]).await;
        assert_eq!(name(&again.verdict), "continue", "the slot is free again");
    }

    fn g_link(server: &RedisServer) -> Arc<Link> {
        let p = params(server, json!({}));
        let map = p.as_object().cloned().unwrap_or_default();
        link::link(&Params::new(GATE, &map)).unwrap()
    }

    #[tokio::test]
    async fn classifying_and_missing_attribute() {
        let server = RedisServer::start().unwrap();
        let p = params(
            &server,
            json!({"mode": "concurrency", "limit": 1, "gating_mode": "classifying",
                   "attribute": "tenant", "prefix": "q/"}),
        );
        let g = gate("redis-quota", p).unwrap();
        let acme = [("tenant", "acme")];
        let first = apply(g.as_ref(), &acme, &[]).await;
        assert_eq!(first.classification.as_deref(), Some("reserved"));
        for _ in 0..3 {
            let over = apply(g.as_ref(), &acme, &[]).await;
            assert_eq!(name(&over.verdict), "continue", "classifying never refuses");
            assert_eq!(over.classification.as_deref(), Some("overflow"));
            assert!(over.releases.is_empty(), "overflow holds nothing");
        }
        let mut con = server.connection().await.unwrap();
        let held: i64 = con.get("q/tenant:acme").await.unwrap();
        assert_eq!(held, 1);

        let none = apply(g.as_ref(), &[("userid", "acme")], &[]).await;
        assert_eq!(name(&none.verdict), "continue");
        assert!(none.classification.is_none() && none.releases.is_empty());
    }

    #[tokio::test]
    async fn rate_limit_window() {
        let server = RedisServer::start().unwrap();
        let p = params(&server, json!({"limit": 2, "window": "1s"}));
        let g = gate("redis-quota", p).unwrap();
        let u = [("userid", "u")];
        for _ in 0..2 {
            let d = apply(g.as_ref(), &u, &[]).await;
            assert_eq!(name(&d.verdict), "continue");
            assert_eq!(d.classification.as_deref(), Some("reserved"));
            assert!(d.releases.is_empty());
        }
        let d = apply(g.as_ref(), &u, &[]).await;
        assert_eq!(name(&d.verdict), "refuse");
        assert_eq!(d.classification.as_deref(), Some("overflow"));
        let mut con = server.connection().await.unwrap();
        let n: i64 = con.zcard("quota:userid:u").await.unwrap();
        assert_eq!(n, 2, "refusals are not recorded");
        let ttl: i64 = con.pttl("quota:userid:u").await.unwrap();
        assert!(ttl > 1000 && ttl <= 2000, "ttl {ttl}");

        tokio::time::sleep(Duration::from_millis(1050)).await;
        let d = apply(g.as_ref(), &u, &[]).await;
        assert_eq!(name(&d.verdict), "continue", "the window slid on");
    }

    /// Redis's clock in Unix nanoseconds, exact.
    async fn redis_now_ns(con: &mut redis::aio::MultiplexedConnection) -> u128 {
        let (secs, micros): (u128, u128) = redis::cmd("TIME").query_async(con).await.unwrap();
        (secs * 1_000_000 + micros) * 1000
    }

    /// A window shared with Go processors, which score entries in Unix nanoseconds: a Go entry
    /// two windows old is pruned by the next admission, a fresh one counts, and inferq's own
    /// entries are nanoseconds too.
    #[tokio::test]
    async fn rate_limit_shares_go_nanosecond_window() {
        let server = RedisServer::start().unwrap();
        let mut con = server.connection().await.unwrap();
        let key = "quota:userid:mixed";
        let window_ns: u128 = 10_000_000_000;
        let now = redis_now_ns(&mut con).await;
        let old = now - 2 * window_ns;
        // As Go writes them: ZADD key now now, the score an integer of nanoseconds.
        for stamp in [old, now] {
            let _: () = redis::cmd("ZADD")
                .arg(key)
                .arg(stamp.to_string())
                .arg(stamp.to_string())
                .query_async(&mut con)
                .await
                .unwrap();
        }
        let p = params(&server, json!({"limit": 2, "window": "10s"}));
        let g = gate("redis-quota", p).unwrap();
        let u = [("userid", "mixed")];
        let d = apply(g.as_ref(), &u, &[]).await;
        assert_eq!(
            name(&d.verdict),
            "continue",
            "the old Go entry is out of the window, the fresh one is the only one in it"
        );
        let gone: Option<f64> = con.zscore(key, old.to_string()).await.unwrap();
        assert_eq!(gone, None, "the Go entry two windows old is pruned");
        let d = apply(g.as_ref(), &u, &[]).await;
        assert_eq!(
            name(&d.verdict),
            "refuse",
            "the fresh Go entry and ours fill a limit of 2"
        );
        let entries: Vec<(String, f64)> = con.zrange_withscores(key, 0, -1).await.unwrap();
        assert_eq!(entries.len(), 2, "{entries:?}");
        let ours = &entries
            .iter()
            .find(|(m, _)| m != &now.to_string())
            .unwrap()
            .0;
        let stamp: u128 = ours.split('-').next().unwrap().parse().unwrap();
        let after = redis_now_ns(&mut con).await;
        assert!(
            (now..=after).contains(&stamp),
            "our entry is scored in nanoseconds: {stamp} not in {now}..={after}"
        );
    }

    #[tokio::test]
    async fn redis_down_is_an_error() {
        let mut server = RedisServer::start().unwrap();
        let g = gate("redis-quota", params(&server, json!({"limit": 1}))).unwrap();
        server.kill();
        let metadata = map(&[("userid", "u")]);
        let labels = map(&[]);
        let input = GateInput {
            metadata: &metadata,
            labels: &labels,
        };
        let e = g
            .apply(input)
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("gate redis-quota: redis 127.0.0.1:"), "{e}");
    }

    #[test]
    fn parameter_errors() {
        let address = json!({"address": "127.0.0.1:1"});
        let with = |extra: Value| {
            let mut p = address.clone();
            if let (Some(p), Value::Object(extra)) = (p.as_object_mut(), extra) {
                p.extend(extra);
            }
            build_error("redis-quota", p)
        };
        assert_eq!(
            build_error("redis-quota", json!({"limit": 1})),
            "gate redis-quota: parameter address: required"
        );
        assert_eq!(
            with(json!({})),
            "gate redis-quota: parameter limit: required"
        );
        assert_eq!(
            with(json!({"limit": 0})),
            "gate redis-quota: parameter limit: must be > 0, got 0"
        );
        assert!(with(json!({"limit": "many"})).starts_with("gate redis-quota: parameter limit: "));
        assert!(with(json!({"limit": 1, "window": "soon"}))
            .starts_with("gate redis-quota: parameter window: "));
        assert_eq!(
            with(json!({"limit": 1, "window": "0s"})),
            "gate redis-quota: parameter window: must be > 0 in rate-limit mode"
        );
        assert_eq!(
            with(json!({"limit": 1, "window": "0s", "mode": "concurrency"})),
            "(built)"
        );
        // Before: a misspelt mode let every request through (as in Go), with a log line.
        assert_eq!(
            with(json!({"limit": 1, "mode": "ratelimit"})),
            "gate redis-quota: parameter mode: must be rate-limit or concurrency, got \"ratelimit\""
        );
        assert_eq!(
            with(json!({"limit": 1, "gating_mode": "block"})),
            "gate redis-quota: parameter gating_mode: must be blocking or classifying, got \"block\""
        );
    }
}
