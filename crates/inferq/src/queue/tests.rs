//! One or more tests for every rule of the durability contract, each against its own real
//! `redis-server` (see [`inferq_testkit`]). Leases that must run out are short (hundreds of ms)
//! so expiry is real; a lease or backoff that a test checks has not run out yet lasts seconds, so
//! a stalled test thread on a loaded machine cannot outlast it.

use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::value::RawValue;

use super::dead::DeadRecord;
use super::producer::{unix_ms, Producer, ProducerError};
use super::*;
use crate::wire::{Envelope, NewRequest, ResultMessage};
use inferq_testkit::{config_set, RedisServer};

const Q: &str = "q";
const RESULTS: &str = "results";

struct Rig {
    server: RedisServer,
    queue: Queue,
    producer: Producer,
    con: redis::aio::ConnectionManager,
}

async fn rig(lease_ms: u64, max_deliveries: u32) -> Rig {
    let server = RedisServer::start().expect("redis-server");
    let client = redis::Client::open(server.url()).unwrap();
    let con = connect::manager(&client).await.unwrap();
    let settings = ClaimSettings {
        lease: Duration::from_millis(lease_ms),
        reclaim_interval: Duration::from_millis(lease_ms),
        max_deliveries,
        replica_wait: None,
    };
    let queue = Queue::new(con.clone(), Q, settings);
    let producer = Producer::connect(&server.url(), Q, RESULTS).await.unwrap();
    Rig {
        server,
        queue,
        producer,
        con,
    }
}

fn request(id: &str, deadline_in_s: i64) -> NewRequest {
    NewRequest {
        id: id.to_owned(),
        created: unix_ms() / 1000,
        deadline: unix_ms() / 1000 + deadline_in_s,
        payload: RawValue::from_string(r#"{"model":"m","prompt":"hi"}"#.to_owned()).unwrap(),
        metadata: Default::default(),
        headers: Default::default(),
        endpoint: String::new(),
        model: String::new(),
    }
}

/// The score newer Go gives a member: its deadline plus its `enqueue_seq` fraction.
fn fifo_score(env: &Envelope) -> f64 {
    crate::wire::score_of(env.request.deadline, env.internal.enqueue_seq)
        .parse()
        .unwrap()
}

/// Peeks up to `n`, decodes and claims them all.
async fn claim_head(queue: &Queue, n: usize) -> Vec<Held> {
    let peeked = queue.peek(n).await.unwrap();
    let members = peeked
        .into_iter()
        .map(|p| {
            let env = Envelope::decode(&p.member).unwrap();
            (p.member, env)
        })
        .collect();
    queue
        .claim(members)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| match c {
            Claimed::Held(h) => Some(*h),
            _ => None,
        })
        .collect()
}

/// The route to `list`, without a TTL.
fn route(list: &str) -> super::ResultRoute {
    super::ResultRoute {
        list: list.to_owned(),
        ttl_s: 0,
    }
}

fn ack(held: &Held, result: &ResultMessage) -> Finish {
    Finish::Ack {
        fence: held.fence.clone(),
        id: held.envelope.request.id.clone(),
        request_token: held.envelope.internal.request_token.clone(),
        result_list: RESULTS.to_owned(),
        result_ttl_s: 0,
        result: result.to_json(),
        payload_ref: held.envelope.internal.payload_ref.clone(),
    }
}

/// Submits `ids` (deadlines 60 s out) and claims them all: the claims in the order of `ids`.
async fn submit_and_claim(r: &Rig, ids: &[&str]) -> Vec<Held> {
    for id in ids {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let mut held = claim_head(&r.queue, ids.len() + 5).await;
    assert_eq!(held.len(), ids.len());
    held.sort_by_key(|h| ids.iter().position(|id| *id == h.envelope.request.id));
    held
}

/// A park of `held` for a minute, its retry_count bumped.
fn park_of(held: &Held) -> Finish {
    Finish::Park {
        fence: held.fence.clone(),
        member: Queue::retry_member(&held.envelope),
        backoff: Duration::from_secs(60),
    }
}

async fn results(con: &mut redis::aio::ConnectionManager) -> Vec<ResultMessage> {
    let raw: Vec<String> = con.lrange(RESULTS, 0, -1).await.unwrap();
    raw.iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

async fn zcard(con: &mut redis::aio::ConnectionManager, key: &str) -> u64 {
    con.zcard(key).await.unwrap()
}

/// Redis's clock in Unix milliseconds, as the scripts' `nowMs()` reads it.
async fn redis_now_ms(con: &mut redis::aio::ConnectionManager) -> u64 {
    let (secs, micros): (u64, u64) = redis::cmd("TIME").query_async(con).await.unwrap();
    secs * 1000 + micros / 1000
}

/// Calls `step` every 20 ms until it answers more than 0 (for up to 10 s): that answer.
async fn first_nonzero<F, Fut>(what: &str, mut step: F) -> u64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = u64>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let n = step().await;
        if n > 0 {
            return n;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn hlen(con: &mut redis::aio::ConnectionManager, key: &str) -> u64 {
    con.hlen(key).await.unwrap()
}

/// `claimed` reads what a claim holds for its owner only: a stale token reads nothing, and
/// after the ack nobody does. An ack turned into a bury of that member (what the outbox does
/// with a refused result) dead-letters it with the result in its record and publishes nothing.
#[tokio::test]
async fn claimed_reads_the_member_for_its_owner_only() {
    let r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let held = claim_head(&r.queue, 10).await.remove(0);
    let Some((member, deliveries)) = r.queue.claimed(&held.fence).await.unwrap() else {
        panic!("the owner reads nothing");
    };
    assert_eq!(Envelope::decode(&member).unwrap().request.id, "a");
    assert_eq!(deliveries, 0);
    let stale = Fence {
        key: held.fence.key.clone(),
        token: "not-the-owner".to_owned(),
    };
    assert!(r.queue.claimed(&stale).await.unwrap().is_none());

    let acked = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    let Some(bury) = acked.bury_unpublished(Q, &member, deliveries, "NOPERM") else {
        panic!("an ack has a bury instead");
    };
    let mut con = r.con.clone();
    assert_eq!(
        r.queue.finish(&[bury]).await.unwrap(),
        vec![Finished::Published]
    );
    assert!(results(&mut con).await.is_empty());
    let records: Vec<String> = con.lrange("q:dead", 0, -1).await.unwrap();
    let record: DeadRecord = serde_json::from_str(&records[0]).unwrap();
    assert_eq!(record.id, "a");
    assert!(record.reason.contains("NOPERM"), "{}", record.reason);
    let kept: ResultMessage = serde_json::from_str(&record.result).unwrap();
    assert_eq!((kept.id.as_str(), kept.status_code), ("a", 200));
    assert!(r.queue.claimed(&held.fence).await.unwrap().is_none());
}

/// Which failures mean Redis was lost, so that owners could not renew either (the reclaimer
/// then holds back a lease): an unreachable server is; a missing script (reloaded by the next
/// call) and a script error (a refusal of this caller alone) are not.
#[tokio::test]
async fn lost_redis_is_an_outage_not_a_refusal() {
    let mut r = rig(30_000, 5).await;
    let con = r.con.clone();
    let error_of = |command: &str, arg: &str| {
        let mut cmd = redis::cmd(command);
        cmd.arg(arg).arg(0);
        let mut con = con.clone();
        async move { cmd.query_async::<()>(&mut con).await.unwrap_err() }
    };
    let noscript = error_of("EVALSHA", "0000000000000000000000000000000000000000").await;
    assert_eq!(noscript.code(), Some("NOSCRIPT"));
    assert!(!QueueError::from(noscript).lost_redis());
    let script_error = error_of("EVAL", "return redis.call('no-such-command')").await;
    assert!(!QueueError::from(script_error).lost_redis());
    assert!(r.queue.ping().await.is_ok());

    r.server.kill();
    let down = r.queue.ping().await.unwrap_err();
    assert!(down.lost_redis(), "{down}");
}

/// A cluster's `MOVED` or `ASK` that reaches the caller (the slot map still changing after a
/// fail-over) is passing, not a refusal: a staged result met with one is pushed again later,
/// not set aside in the dead list without its result (found by `inferq-dev chaos --redis cluster`,
/// seed 11: 16 requests lost at a master's fail-over). A script error and `NOPERM` stay
/// refusals.
#[test]
fn a_redirect_is_passing_and_a_script_error_is_a_refusal() {
    let error = |reply: &str| match redis::parse_redis_value(reply.as_bytes()) {
        Ok(redis::Value::ServerError(e)) => redis::RedisError::from(e),
        other => panic!("{other:?}"),
    };
    for passing in [
        "-MOVED 15286 127.0.0.1:21793\r\n",
        "-ASK 15286 127.0.0.1:21793\r\n",
        "-TRYAGAIN Multiple keys request during rehashing of slot\r\n",
        "-CLUSTERDOWN The cluster is down\r\n",
    ] {
        let e = error(passing);
        assert!(!moves::is_refusal(&e), "{passing}: {e:?}");
        assert!(QueueError::from(e).lost_redis(), "{passing}");
    }
    for refusal in [
        "-ERR Error running script (call to f_0): @user_script:1: Unknown Redis command\r\n",
        "-NOPERM this user has no permissions to run the 'lpush' command\r\n",
        "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n",
    ] {
        assert!(moves::is_refusal(&error(refusal)), "{refusal}");
    }
}

/// Rule 1 (fencing): a stale owner's renew, ack, park and release change nothing.
#[tokio::test]
async fn stale_owner_moves_change_nothing() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let held = claim_head(&r.queue, 10).await.remove(0);
    let stale = Fence {
        key: held.fence.key.clone(),
        token: "not-the-owner".to_owned(),
    };
    assert_eq!(
        r.queue.renew(std::slice::from_ref(&stale)).await.unwrap(),
        vec![false]
    );
    let mut forged = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    if let Finish::Ack { fence, .. } = &mut forged {
        *fence = stale.clone();
    }
    assert_eq!(
        r.queue.finish(&[forged]).await.unwrap(),
        vec![Finished::NotYours]
    );
    assert!(!r
        .queue
        .park(&stale, &held.envelope, Duration::ZERO)
        .await
        .unwrap());
    assert_eq!(
        r.queue.release(std::slice::from_ref(&stale)).await.unwrap(),
        vec![false]
    );
    // Still held by the real owner, nothing published, nothing pending or parked.
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 1);
    let owner: String = r.con.hget("q:claim-owners", &held.fence.key).await.unwrap();
    assert_eq!(owner, held.fence.token);
    assert!(results(&mut r.con).await.is_empty());
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
    // The real owner's ack works once.
    let real = ack(&held, &ResultMessage::http("a", 200, b"{}"));
    assert_eq!(
        r.queue.finish(&[real]).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
}

/// Rule 1 + 6: after a lease expires and another instance reclaims and claims the request, the
/// old owner (a zombie coming back) cannot renew or publish; exactly one result appears.
#[tokio::test]
async fn zombie_owner_cannot_publish_after_takeover() {
    let mut r = rig(300, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    let zombie = claim_head(&r.queue, 1).await.remove(0);
    tokio::time::sleep(Duration::from_millis(450)).await;
    let reclaimed = r.queue.reclaim(100).await.unwrap();
    assert_eq!(reclaimed.requeued, 1);
    let survivor = claim_head(&r.queue, 1).await.remove(0);
    assert_ne!(survivor.fence.token, zombie.fence.token);
    assert_eq!(
        r.queue
            .renew(std::slice::from_ref(&zombie.fence))
            .await
            .unwrap(),
        vec![false]
    );
    let late = ack(&zombie, &ResultMessage::http("a", 200, b"late"));
    assert_eq!(
        r.queue.finish(&[late]).await.unwrap(),
        vec![Finished::NotYours]
    );
    let good = ack(&survivor, &ResultMessage::http("a", 200, b"good"));
    assert_eq!(
        r.queue.finish(&[good]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].payload, "good");
}

/// Rule 3: renew extends the lease by Redis TIME, for all held claims in one call.
#[tokio::test]
async fn renew_extends_every_held_lease_by_redis_time() {
    // Seconds, so a stall after the last renewal cannot outlast the renewed lease.
    let lease_ms = 2_000;
    let mut r = rig(lease_ms, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 3);
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    let mut renewed = (0, 0);
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let before = redis_now_ms(&mut r.con).await;
        assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; 3]);
        renewed = (before, redis_now_ms(&mut r.con).await);
    }
    // 2.4 s after claiming with a 2 s lease: renewals kept every claim alive.
    assert_eq!(r.queue.reclaim(100).await.unwrap().requeued, 0);
    // Each lease runs until the last renewal's Redis TIME plus the lease.
    let (before, after) = renewed;
    for fence in &fences {
        let expiry: f64 = r.con.zscore("q:claims-idx", &fence.key).await.unwrap();
        let expiry_ms = (expiry * 1000.0).round() as u64;
        assert!(
            (before + lease_ms..=after + lease_ms).contains(&expiry_ms),
            "expiry {expiry_ms} vs a renewal between {before} and {after}"
        );
    }
}

/// Rule 3 out of memory: Redis at `maxmemory` with noeviction refuses a script's first write
/// when that write may grow memory. A renewal grows nothing, so it still keeps every held lease
/// (before, its ZADD was refused with `OOM`: every lease ran out under its live owner, whose work
/// in flight was aborted and stranded in claimed until Redis had memory again).
#[tokio::test]
async fn renew_keeps_leases_while_redis_is_out_of_memory() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let held = claim_head(&r.queue, 10).await;
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    let before: f64 = r.con.zscore("q:claims-idx", &fences[0].key).await.unwrap();
    out_of_memory(&mut r.con).await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; 2]);
    let after: f64 = r.con.zscore("q:claims-idx", &fences[0].key).await.unwrap();
    assert!(
        after > before,
        "the lease was extended: {before} -> {after}"
    );
    assert_eq!(r.con.zcard::<_, u64>("q:claims-idx").await.unwrap(), 2);
}

/// ID reuse: two live generations of one id never touch each other, and cancel and cleanup
/// only ever affect the generation whose token they carry.
#[tokio::test]
async fn reused_id_generations_are_independent() {
    let mut r = rig(30_000, 5).await;
    let first = r.producer.submit(request("dup", 60)).await.unwrap();
    let second = r.producer.submit(request("dup", 61)).await.unwrap();
    assert_ne!(first.request_token, second.request_token);
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 2);
    assert_ne!(held[0].fence.key, held[1].fence.key);
    // Cancel marks only the newest generation.
    assert_eq!(
        r.producer.cancel(&["dup".to_owned()]).await.unwrap(),
        vec![true]
    );
    let marker: String = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!(marker, second.request_token);
    // The old generation finishing does not clear the new one's state.
    let old = held
        .iter()
        .find(|h| h.envelope.internal.request_token == first.request_token)
        .unwrap();
    let new = held
        .iter()
        .find(|h| h.envelope.internal.request_token == second.request_token)
        .unwrap();
    r.queue
        .finish(&[ack(old, &ResultMessage::http("dup", 200, b"1"))])
        .await
        .unwrap();
    let active: String = r.con.get("request-active:dup").await.unwrap();
    assert_eq!(active, second.request_token);
    let marker: Option<String> = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!(marker.as_deref(), Some(second.request_token.as_str()));
    // The new generation is still held and publishes its own result; then its state is cleaned.
    assert_eq!(
        r.queue
            .renew(std::slice::from_ref(&new.fence))
            .await
            .unwrap(),
        vec![true]
    );
    r.queue
        .finish(&[ack(new, &ResultMessage::cancelled("dup"))])
        .await
        .unwrap();
    assert_eq!(results(&mut r.con).await.len(), 2);
    let active: Option<String> = r.con.get("request-active:dup").await.unwrap();
    let marker: Option<String> = r.con.get("request-cancel:dup").await.unwrap();
    assert_eq!((active, marker), (None, None));
}

/// Lost replies: a claim whose reply was lost is not claimed twice (a retry finds it gone and
/// the lost claim comes back by reclaim); an ack whose reply was lost, retried, publishes once.
#[tokio::test]
async fn lost_replies_are_retried_safely() {
    let mut r = rig(300, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    // The first claim ran but its caller never learned of it.
    let lost = claim_head(&r.queue, 1).await;
    assert_eq!(lost.len(), 1);
    drop(lost);
    assert!(
        claim_head(&r.queue, 1).await.is_empty(),
        "a claimed member must not be claimable"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    let held = claim_head(&r.queue, 1).await.remove(0);
    // The ack ran, its reply was lost, and the caller retries the same ack.
    let finish = ack(&held, &ResultMessage::http("a", 200, b"x"));
    assert_eq!(
        r.queue.finish(std::slice::from_ref(&finish)).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(
        r.queue.finish(&[finish]).await.unwrap(),
        vec![Finished::NotYours]
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// Rule 6: an expired claim goes back to pending at its original score (also when that score
/// is not the deadline, as with hand-written members), counting a delivery.
#[tokio::test]
async fn reclaim_returns_expired_claims_at_their_original_score() {
    // Seconds, so the lease is still valid at the first reclaim however the test is scheduled.
    let mut r = rig(2_000, 5).await;
    let deadline = unix_ms() / 1000 + 60;
    let member = format!(
        r#"{{"request_kind":"redis","internal":{{}},"data":{{"id":"hand","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let _: () = r.con.zadd(Q, &member, 42).await.unwrap();
    let held = claim_head(&r.queue, 1).await;
    assert_eq!(held.len(), 1);
    assert_eq!(
        r.queue.reclaim(10).await.unwrap().requeued,
        0,
        "lease still valid"
    );
    let requeued = first_nonzero("the lease to expire", || async {
        r.queue.reclaim(10).await.unwrap().requeued
    })
    .await;
    assert_eq!(requeued, 1);
    let score: f64 = r.con.zscore(Q, &member).await.unwrap();
    assert_eq!(score, 42.0);
    let deliveries: u32 = r
        .con
        .hget("q:deliveries", &held[0].fence.key)
        .await
        .unwrap();
    assert_eq!(deliveries, 1);
    for key in ["q:claimed", "q:claim-owners", "q:claim-scores"] {
        assert_eq!(hlen(&mut r.con, key).await, 0, "{key}");
    }
    assert_eq!(zcard(&mut r.con, "q:claims-idx").await, 0);
}

/// Rule 6: reclaim works in bounded batches.
#[tokio::test]
async fn reclaim_is_bounded() {
    let mut r = rig(100, 5).await;
    for i in 0..7 {
        r.producer
            .submit(request(&format!("r{i}"), 60))
            .await
            .unwrap();
    }
    assert_eq!(claim_head(&r.queue, 10).await.len(), 7);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 3);
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 3);
    assert_eq!(r.queue.reclaim(3).await.unwrap().requeued, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 7);
}

/// Rule 6: a request whose every delivery dies is dead-lettered at the delivery limit with a
/// terminal record, instead of crash-looping.
#[tokio::test]
async fn delivery_limit_dead_letters_with_a_terminal_record() {
    let mut r = rig(100, 2).await;
    r.producer.submit(request("poison", 60)).await.unwrap();
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(
        r.queue.reclaim(10).await.unwrap().requeued,
        1,
        "first expiry: redeliver"
    );
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 0);
    assert_eq!(reclaimed.taken_over.len(), 1);
    let taken = &reclaimed.taken_over[0];
    assert_eq!(taken.reason, Takeover::Deliveries);
    assert_eq!(taken.deliveries, 2);
    let env = taken.envelope.as_ref().unwrap();
    let mut record = DeadRecord::new(Q, "delivery limit reached", &taken.member);
    record.id = env.request.id.clone();
    record.deliveries = taken.deliveries;
    let result = crate::wire::ResultMessage::error(
        "poison",
        crate::wire::ErrorCode::DeadLettered,
        "dead-lettered after 2 deliveries",
    );
    let bury = Finish::Bury {
        fence: taken.fence.clone(),
        id: env.request.id.clone(),
        request_token: env.internal.request_token.clone(),
        result_list: RESULTS.to_owned(),
        result_ttl_s: 0,
        result: result.to_json(),
        record: record.to_json(),
    };
    assert_eq!(
        r.queue.finish(&[bury]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].error_code, "DEAD_LETTERED");
    let dead: Vec<String> = r.con.lrange("q:dead", 0, -1).await.unwrap();
    let dead: DeadRecord = serde_json::from_str(&dead[0]).unwrap();
    assert_eq!((dead.id.as_str(), dead.deliveries), ("poison", 2));
    assert_eq!(
        zcard(&mut r.con, Q).await + hlen(&mut r.con, "q:claimed").await,
        0
    );
    let deliveries: Option<u32> = r.con.hget("q:deliveries", &taken.fence.key).await.unwrap();
    assert_eq!(deliveries, None);
}

/// Rule 6: an expired claim whose deadline has passed is taken over to finish with
/// DEADLINE_EXCEEDED, not put back in the queue.
#[tokio::test]
async fn passed_deadline_is_taken_over_for_deadline_exceeded() {
    let mut r = rig(200, 5).await;
    r.producer.submit(request("late", 1)).await.unwrap();
    claim_head(&r.queue, 1).await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 0);
    let taken = &reclaimed.taken_over[0];
    assert_eq!(taken.reason, Takeover::Deadline);
    let env = taken.envelope.as_ref().unwrap();
    let finish = Finish::Ack {
        fence: taken.fence.clone(),
        id: env.request.id.clone(),
        request_token: env.internal.request_token.clone(),
        result_list: RESULTS.to_owned(),
        result_ttl_s: 0,
        result: ResultMessage::deadline_exceeded("late").to_json(),
        payload_ref: env.internal.payload_ref.clone(),
    };
    assert_eq!(
        r.queue.finish(&[finish]).await.unwrap(),
        vec![Finished::Published]
    );
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].error_code, "DEADLINE_EXCEEDED");
    assert_eq!(zcard(&mut r.con, Q).await, 0);
}

/// Rule 10: malformed members are dead-lettered with a reason, with INVALID_REQUEST when an
/// id can be read, and never block or vanish.
#[tokio::test]
async fn malformed_members_are_dead_lettered_with_a_reason() {
    let mut r = rig(30_000, 5).await;
    let bad = [
        ("not json at all".to_owned(), None),
        (
            r#"{"request_kind":"plain","data":{"id":"noDeadline"}}"#.to_owned(),
            Some("noDeadline"),
        ),
        (
            r#"{"request_kind":"plain","data":{"deadline":5}}"#.to_owned(),
            None,
        ),
    ];
    for (i, (member, _)) in bad.iter().enumerate() {
        let _: () = r.con.zadd(Q, member, i).await.unwrap();
    }
    let results_route = route(RESULTS);
    for p in r.queue.peek(10).await.unwrap() {
        let err = Envelope::decode(&p.member).unwrap_err();
        let record = DeadRecord::new(Q, &err.to_string(), &p.member);
        let salvaged = Envelope::salvage_id(&p.member);
        let result = salvaged.as_ref().map(|(id, _)| {
            ResultMessage::error(
                id,
                crate::wire::ErrorCode::InvalidRequest,
                &format!("Failed: {err}"),
            )
        });
        let moved = r
            .queue
            .dead_letter(
                &p.member,
                &record.to_json(),
                result.as_ref().map(|m| (&results_route, m)),
            )
            .await
            .unwrap();
        assert_eq!(moved, SetAside::Moved);
    }
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    let dead: Vec<String> = r.con.lrange("q:dead", 0, -1).await.unwrap();
    assert_eq!(dead.len(), 3);
    let reasons: Vec<String> = dead
        .iter()
        .map(|d| serde_json::from_str::<DeadRecord>(d).unwrap().reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r.contains("not valid JSON")),
        "{reasons:?}"
    );
    assert!(
        reasons.iter().any(|r| r.contains("deadline")),
        "{reasons:?}"
    );
    assert!(reasons.iter().any(|r| r.contains("no id")), "{reasons:?}");
    let all = results(&mut r.con).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].id.as_str(), all[0].error_code.as_str()),
        ("noDeadline", "INVALID_REQUEST")
    );
    // Dead-lettering a member another instance already moved changes nothing.
    assert_eq!(
        r.queue
            .dead_letter(b"not json at all", "{}", None)
            .await
            .unwrap(),
        SetAside::Gone
    );
}

/// A member naming a result list that holds another type than a list: the dead-lettering
/// moves nothing and says so (Redis would not undo the member's removal when the push fails),
/// so the caller can set it aside without its result.
#[tokio::test]
async fn dead_letter_to_a_result_list_of_another_type_moves_nothing() {
    let mut r = rig(30_000, 5).await;
    let member = r#"{"request_kind":"plain","data":{"id":"x","payload":{}}}"#;
    let _: () = r.con.zadd(Q, member, 1).await.unwrap();
    let _: () = r.con.set("a-string", "x").await.unwrap();
    let msg = ResultMessage::error("x", crate::wire::ErrorCode::InvalidRequest, "Failed: x.");
    let outcome = r
        .queue
        .dead_letter(member.as_bytes(), "{}", Some((&route("a-string"), &msg)))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SetAside::ResultRefused(why) if why.contains("WRONGTYPE")),
        "{outcome:?}"
    );
    assert_eq!(zcard(&mut r.con, Q).await, 1, "still pending");
    let dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(dead, 0);
    assert_eq!(
        r.queue
            .dead_letter(member.as_bytes(), "{}", None)
            .await
            .unwrap(),
        SetAside::Moved
    );
    assert_eq!(zcard(&mut r.con, Q).await, 0);
}

/// Earliest deadline first.
#[tokio::test]
async fn peek_and_claim_go_earliest_deadline_first() {
    let r = rig(30_000, 5).await;
    for (id, secs) in [("late", 300), ("soon", 10), ("mid", 100)] {
        r.producer.submit(request(id, secs)).await.unwrap();
    }
    let held = claim_head(&r.queue, 2).await;
    let ids: Vec<&str> = held
        .iter()
        .map(|h| h.envelope.request.id.as_str())
        .collect();
    assert_eq!(ids, ["soon", "mid"]);
}

/// Rule 7: park is one fenced move into the parked set with a bumped retry_count, and promote
/// moves it back to pending at its deadline only once due.
#[tokio::test]
async fn park_then_promote_when_due() {
    let mut r = rig(30_000, 5).await;
    let sub = r.producer.submit(request("retry", 60)).await.unwrap();
    let held = claim_head(&r.queue, 1).await.remove(0);
    // Seconds, so the retry is not due yet at the first promote however the test is scheduled.
    assert!(r
        .queue
        .park(&held.fence, &held.envelope, Duration::from_secs(2))
        .await
        .unwrap());
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
    let early = r.queue.promote(10, None, true).await.unwrap();
    assert_eq!(early.moved, 0, "not due yet");
    let until_due = early.until_due.unwrap();
    assert!(
        until_due > Duration::ZERO && until_due <= Duration::from_secs(2),
        "the parked retry is due within its backoff: {until_due:?}"
    );
    let promoted = first_nonzero("the retry to be due", || async {
        r.queue.promote(10, None, true).await.unwrap().moved
    })
    .await;
    assert_eq!(promoted, 1);
    assert_eq!(
        r.queue.promote(10, None, true).await.unwrap().until_due,
        None,
        "nothing is parked any more"
    );
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].score, fifo_score(&held.envelope));
    let env = Envelope::decode(&pending[0].member).unwrap();
    assert_eq!(env.internal.retry_count, 1);
    assert_eq!(
        env.internal.request_token, sub.request_token,
        "same generation"
    );
    assert_eq!(
        env.request.payload.get(),
        held.envelope.request.payload.get()
    );
    // A parked retry keeps its generation's claim key, so its deliveries count carries on.
    let again = claim_head(&r.queue, 1).await.remove(0);
    assert_eq!(again.fence.key, held.fence.key);
}

/// Promote also drains the Go processor's shared retry set, but only this queue's entries.
#[tokio::test]
async fn promote_moves_due_entries_out_of_the_go_retry_set() {
    let mut r = rig(30_000, 5).await;
    let deadline = unix_ms() / 1000 + 60;
    let ours = format!(
        r#"{{"internal":{{"request_queue_name":"q","retry_count":1}},"request_kind":"plain","data":{{"id":"g1","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let other = format!(
        r#"{{"internal":{{"request_queue_name":"other"}},"request_kind":"plain","data":{{"id":"g2","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let unnamed = format!(
        r#"{{"internal":{{}},"request_kind":"plain","data":{{"id":"g3","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let future = format!(
        r#"{{"internal":{{"request_queue_name":"q"}},"request_kind":"plain","data":{{"id":"g4","deadline":{deadline},"payload":{{}}}}}}"#
    );
    let now = unix_ms() as f64 / 1000.0;
    for (m, due) in [
        (&ours, now - 1.0),
        (&other, now - 1.0),
        (&unnamed, now - 1.0),
        (&future, now + 60.0),
    ] {
        let _: () = r.con.zadd("retry-sortedset", m, due).await.unwrap();
    }
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved,
        1
    );
    let score: f64 = r.con.zscore(Q, &ours).await.unwrap();
    assert_eq!(score, deadline as f64);
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 3);
    // As the default queue it also takes members naming no queue.
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), true)
            .await
            .unwrap()
            .moved,
        1
    );
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 2);
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    // Another queue's entry is due and stays: the promoter looks again at the Go pace.
    let left = r
        .queue
        .promote(10, Some("retry-sortedset"), true)
        .await
        .unwrap();
    assert_eq!(left.until_due, Some(Duration::ZERO));
    let _: () = r.con.zrem("retry-sortedset", &other).await.unwrap();
    let left = r
        .queue
        .promote(10, Some("retry-sortedset"), true)
        .await
        .unwrap();
    let until_due = left.until_due.unwrap();
    assert!(
        until_due > Duration::from_secs(50) && until_due <= Duration::from_secs(60),
        "the one entry left is due in a minute: {until_due:?}"
    );
}

/// Rule 8: release hands unstarted claims back at once, at their original score, without
/// counting a delivery.
#[tokio::test]
async fn release_returns_claims_at_once() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("a", 60)).await.unwrap();
    r.producer.submit(request("b", 70)).await.unwrap();
    let held = claim_head(&r.queue, 10).await;
    let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
    assert_eq!(r.queue.release(&fences).await.unwrap(), vec![true, true]);
    assert_eq!(
        r.queue.release(&fences).await.unwrap(),
        vec![false, false],
        "already released"
    );
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 2);
    assert_eq!(pending[0].score, fifo_score(&held[0].envelope));
    assert_eq!(hlen(&mut r.con, "q:deliveries").await, 0);
}

/// Scripts survive SCRIPT FLUSH (between a claim and a batched finish) and a Redis restart.
#[tokio::test]
async fn scripts_survive_script_flush_and_restart() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r.con)
        .await
        .unwrap();
    let held = claim_head(&r.queue, 10).await;
    assert_eq!(held.len(), 3);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut r.con)
        .await
        .unwrap();
    let batch: Vec<Finish> = held[..2]
        .iter()
        .map(|h| ack(h, &ResultMessage::http(&h.envelope.request.id, 200, b"{}")))
        .collect();
    assert_eq!(
        r.queue.finish(&batch).await.unwrap(),
        vec![Finished::Published; 2]
    );
    // A kill -9 and restart: the AOF keeps the claim, the script cache is empty.
    r.server.kill();
    r.server.restart().unwrap();
    let mut renewed = None;
    for _ in 0..50 {
        match r.queue.renew(std::slice::from_ref(&held[2].fence)).await {
            Ok(v) => {
                renewed = Some(v);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(renewed, Some(vec![true]));
    let last = ack(&held[2], &ResultMessage::http("c", 200, b"{}"));
    assert_eq!(
        r.queue.finish(&[last]).await.unwrap(),
        vec![Finished::Published]
    );
    assert_eq!(results(&mut r.con).await.len(), 3);
}

/// The producer writes what the newest Go producer writes, in one script: INCR the FIFO counter,
/// DEL the cancel marker, SET the active marker PX, ZADD at the numbered score.
#[tokio::test]
async fn submit_writes_the_go_keys() {
    let mut r = rig(30_000, 5).await;
    let _: () = r.con.set("request-cancel:a", "stale").await.unwrap();
    let req = request("a", 60);
    let deadline = req.deadline;
    let sub = r.producer.submit(req).await.unwrap();
    let marker: Option<String> = r.con.get("request-cancel:a").await.unwrap();
    assert_eq!(marker, None, "resubmission clears a stale cancel marker");
    let active: String = r.con.get("request-active:a").await.unwrap();
    assert_eq!(active, sub.request_token);
    let ttl: i64 = r.con.pttl("request-active:a").await.unwrap();
    assert!(ttl > 55_000 && ttl <= 60_000, "{ttl}");
    let pending = r.queue.peek(1).await.unwrap();
    let env = Envelope::decode(&pending[0].member).unwrap();
    // Numbered as newer Go numbers: the first of its queue and deadline.
    assert_eq!(sub.enqueue_seq, 1);
    assert_eq!(env.internal.enqueue_seq, 1);
    assert_eq!(pending[0].score, deadline as f64 + 1.0 / 2097152.0);
    let counter: i64 = r
        .con
        .get(format!("request-seq:{Q}:{deadline}"))
        .await
        .unwrap();
    assert_eq!(counter, 1);
    assert_eq!(env.internal.request_queue_name, Q);
    assert_eq!(env.internal.result_queue_name, RESULTS);
    // Go's validation texts.
    let mut bad = request("", 60);
    assert_eq!(
        r.producer
            .submit(bad.clone())
            .await
            .unwrap_err()
            .to_string(),
        "request ID is required"
    );
    bad.id = "x".into();
    bad.deadline = 0;
    assert!(r
        .producer
        .submit(bad.clone())
        .await
        .unwrap_err()
        .to_string()
        .contains("positive Unix timestamp"));
    bad.deadline = 1;
    assert_eq!(
        r.producer.submit(bad).await.unwrap_err().to_string(),
        "deadline has already expired"
    );
    assert_eq!(
        r.producer
            .cancel(&["unknown".into(), String::new()])
            .await
            .unwrap(),
        vec![false, false]
    );
}

/// Reliable results: a consumer that dies after taking a result does not lose it.
#[tokio::test]
async fn reliable_consumer_hands_back_what_it_did_not_ack() {
    let mut r = rig(30_000, 5).await;
    for id in ["r1", "r2", "r3"] {
        let json = ResultMessage::http(id, 200, b"{}").to_json();
        let _: () = r.con.lpush(RESULTS, json).await.unwrap();
    }
    let mut first = r.producer.reliable("c1").await.unwrap();
    let a = first.take(Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!(a.result.as_ref().unwrap().id, "r1");
    first.ack(&a).await.unwrap();
    let b = first.take(Duration::from_secs(1)).await.unwrap().unwrap();
    assert_eq!(b.result.as_ref().unwrap().id, "r2");
    drop(first); // dies before storing r2
                 // Its name's lease lapses as a dead consumer's does (shortened here from 15 s).
    let _: () = r.con.pexpire("results:taken:c1:lease", 300).await.unwrap();
    let mut again = r.producer.reliable("c1").await.unwrap();
    assert_eq!(again.hand_back().await.unwrap(), 1);
    let ids: Vec<String> = {
        let mut ids = Vec::new();
        while let Some(t) = again.take(Duration::from_millis(100)).await.unwrap() {
            again.ack(&t).await.unwrap();
            ids.push(t.result.unwrap().id);
        }
        ids
    };
    assert_eq!(ids, ["r2", "r3"]);
    let taken: u64 = r.con.llen("results:taken:c1").await.unwrap();
    assert_eq!(taken, 0);
    assert_eq!(
        r.producer
            .pop_result(Duration::from_millis(100))
            .await
            .unwrap(),
        None
    );
}

/// Total calls Redis counted (INFO commandstats), scripts' inner commands included.
async fn commands_so_far(con: &mut redis::aio::ConnectionManager) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// Rules 1, 4 and 7 in one call: a mixed batch of ack, bury, park and release moves each item
/// on its own fence; a stale token and a repeated claim key change nothing.
#[tokio::test]
async fn one_finish_call_moves_a_mixed_batch_each_item_fenced() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d", "e"]).await;
    let (a, b, c, d, e) = (&held[0], &held[1], &held[2], &held[3], &held[4]);
    let mut stale = ack(e, &ResultMessage::http("e", 200, b"{}"));
    if let Finish::Ack { fence, .. } = &mut stale {
        fence.token = "not-the-owner".to_owned();
    }
    let batch = vec![
        ack(a, &ResultMessage::http("a", 200, b"{}")),
        Finish::Bury {
            fence: b.fence.clone(),
            id: "b".to_owned(),
            request_token: b.envelope.internal.request_token.clone(),
            result_list: RESULTS.to_owned(),
            result_ttl_s: 0,
            result: ResultMessage::http("b", 500, b"{}").to_json(),
            record: "{\"id\":\"b\"}".to_owned(),
        },
        park_of(c),
        Finish::Release {
            fence: d.fence.clone(),
        },
        stale,
        ack(a, &ResultMessage::http("a", 200, b"again")),
    ];
    assert_eq!(
        r.queue.finish(&batch).await.unwrap(),
        vec![
            Finished::Published,
            Finished::Published,
            Finished::Published,
            Finished::Published,
            Finished::NotYours,
            Finished::NotYours,
        ]
    );
    let ids: Vec<String> = results(&mut r.con)
        .await
        .into_iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(
        ids,
        vec!["b", "a"],
        "one record each, in batch order (newest first)"
    );
    let dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(dead, 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    let pending = r.queue.peek(10).await.unwrap();
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].score, fifo_score(&d.envelope));
    assert_eq!(
        hlen(&mut r.con, "q:claimed").await,
        1,
        "only e is still held"
    );
    assert_eq!(hlen(&mut r.con, "q:claim-owners").await, 1);
    assert_eq!(zcard(&mut r.con, "q:claims-idx").await, 1);
    // The acked and buried generations' producer keys are gone; the others' stay.
    for (id, left) in [("a", false), ("b", false), ("c", true), ("e", true)] {
        let active: Option<String> = r.con.get(format!("request-active:{id}")).await.unwrap();
        assert_eq!(active.is_some(), left, "request-active:{id}");
    }
}

/// An item whose result list holds another type than a list is refused alone, its claim kept;
/// the rest of the batch moves. Before, the claims of the whole batch were dropped first and
/// the failing push ended the script: every item of the batch was lost.
#[tokio::test]
async fn a_result_list_of_another_type_refuses_only_its_item() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d"]).await;
    let (a, b, c, d) = (&held[0], &held[1], &held[2], &held[3]);
    let _: () = r.con.set("not-a-list", "x").await.unwrap();
    let mut to_string = ack(b, &ResultMessage::http("b", 200, b"{}"));
    if let Finish::Ack { result_list, .. } = &mut to_string {
        *result_list = "not-a-list".to_owned();
    }
    let batch = vec![
        ack(a, &ResultMessage::http("a", 200, b"{}")),
        to_string,
        park_of(c),
        Finish::Release {
            fence: d.fence.clone(),
        },
    ];
    let statuses = r.queue.finish(&batch).await.unwrap();
    assert_eq!(statuses[0], Finished::Published);
    assert!(
        matches!(&statuses[1], Finished::Failed(e) if e.contains("not-a-list")),
        "{statuses:?}"
    );
    assert_eq!(statuses[2..], [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 1);
    assert_eq!(
        r.queue.claimed(&b.fence).await.unwrap().map(|c| c.1),
        Some(0),
        "b is still held by its owner"
    );
}

/// One of the queue's own keys holding the wrong type: a call that writes it is an error
/// before anything is written. The batch is then tried item by item: the ack goes through,
/// the park is refused and its claim is still held (before, its claim was dropped and the
/// failing ZADD left it nowhere).
#[tokio::test]
async fn a_queue_key_of_the_wrong_type_moves_nothing() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "c"]).await;
    let (a, c) = (&held[0], &held[1]);
    let _: () = r.con.set("q:parked", "x").await.unwrap();
    let batch = vec![ack(a, &ResultMessage::http("a", 200, b"{}")), park_of(c)];
    let statuses = r.queue.finish(&batch).await.unwrap();
    assert_eq!(statuses[0], Finished::Published);
    assert!(
        matches!(&statuses[1], Finished::Failed(e) if e.contains("q:parked")),
        "{statuses:?}"
    );
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(
        r.queue.claimed(&c.fence).await.unwrap().map(|c| c.1),
        Some(0),
        "c is still held by its owner"
    );
}

/// promote (parked -> pending) and an operator's requeue (dead -> pending) into a pending key
/// of the wrong type are errors that move nothing: before, each removed the member from where
/// it was and then failed to add it, leaving it nowhere. With the key mended, both move it.
#[tokio::test]
async fn promote_and_requeue_into_a_pending_key_of_the_wrong_type_lose_nothing() {
    let mut r = rig(30_000, 5).await;
    r.producer.submit(request("p", 60)).await.unwrap();
    r.producer.submit(request("d", 60)).await.unwrap();
    let members: Vec<String> = r.con.zrange(Q, 0, -1).await.unwrap();
    let _: () = r.con.del(Q).await.unwrap();
    let (parked, dead): (Vec<&String>, Vec<&String>) =
        members.iter().partition(|m| m.contains("\"p\""));
    let (parked, dead) = (parked[0].clone(), dead[0].clone());
    let now = unix_ms() as f64 / 1000.0;
    let _: () = r.con.zadd("q:parked", &parked, now - 1.0).await.unwrap();
    let mut record = DeadRecord::new(Q, "poison", dead.as_bytes());
    record.id = "d".to_owned();
    record.request_token = Envelope::decode(dead.as_bytes())
        .unwrap()
        .internal
        .request_token;
    let _: () = r.con.lpush("q:dead", record.to_json()).await.unwrap();
    let dead_letters = dead_letters::DeadLetters::new(r.con.clone(), Q);
    let listed = dead_letters.list().await.unwrap();
    assert_eq!(listed.len(), 1);

    let _: () = r.con.set(Q, "x").await.unwrap();
    for _ in 0..2 {
        let promoted = r.queue.promote(10, None, false).await;
        assert!(
            matches!(&promoted, Err(e) if e.to_string().contains("WRONGTYPE")),
            "{promoted:?}"
        );
        let requeued = dead_letters.requeue(&listed[0], unix_ms()).await;
        assert!(
            matches!(&requeued, Err(e) if e.to_string().contains("WRONGTYPE")),
            "{requeued:?}"
        );
    }
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
    let still_dead: u64 = r.con.llen("q:dead").await.unwrap();
    assert_eq!(still_dead, 1);

    let _: () = r.con.del(Q).await.unwrap();
    assert_eq!(r.queue.promote(10, None, false).await.unwrap().moved, 1);
    let requeued = dead_letters.requeue(&listed[0], unix_ms()).await;
    assert!(matches!(requeued, Ok(Ok(_))), "{requeued:?}");
    assert_eq!(zcard(&mut r.con, Q).await, 2);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
}

/// Due entries of other queues ahead of this queue's in the Go retry set are passed over call
/// by call: each promote goes on scanning where the last one stopped, so this queue's entries
/// behind a hundred of another queue's are moved within a few calls. Before, every call looked
/// at the same first page and never reached them.
#[tokio::test]
async fn promote_scans_past_other_queues_go_retries() {
    let mut r = rig(30_000, 5).await;
    let now = unix_ms() as f64 / 1000.0;
    let entry = |queue: &str, id: &str| {
        format!(
            r#"{{"internal":{{"request_queue_name":"{queue}"}},"request_kind":"plain","data":{{"id":"{id}","deadline":{},"payload":{{}}}}}}"#,
            unix_ms() / 1000 + 60
        )
    };
    for i in 0..100 {
        let _: () = r
            .con
            .zadd(
                "retry-sortedset",
                entry("other", &format!("o{i}")),
                now - 100.0 + f64::from(i) / 1000.0,
            )
            .await
            .unwrap();
    }
    for i in 0..3 {
        let _: () = r
            .con
            .zadd("retry-sortedset", entry(Q, &format!("mine{i}")), now - 1.0)
            .await
            .unwrap();
    }
    let mut moved = 0;
    for _ in 0..4 {
        moved += r
            .queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved;
    }
    assert_eq!(moved, 3);
    assert_eq!(zcard(&mut r.con, Q).await, 3);
    assert_eq!(
        zcard(&mut r.con, "retry-sortedset").await,
        100,
        "others' stay"
    );
}

/// A claim whose delivery count is not a number (written by hand or by another program) is
/// reclaimed counting it as 0: before, the count's HINCRBY failed after the lease entry was
/// removed, leaving a claim no reclaim would ever find again.
#[tokio::test]
async fn a_delivery_count_that_is_not_a_number_does_not_strand_the_claim() {
    let mut r = rig(200, 5).await;
    // Not numbers, and numbers Lua reads that no count can be (they would never reach the
    // limit, and the consumer reads counts as whole numbers).
    for (i, garbage) in ["x", "nan", "-inf", "-3"].into_iter().enumerate() {
        let id = format!("a{i}");
        let held = submit_and_claim(&r, &[&id]).await;
        let _: () = r
            .con
            .hset("q:deliveries", &held[0].fence.key, garbage)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        let reclaimed = r.queue.reclaim(10).await.unwrap();
        assert_eq!(reclaimed.requeued, 1, "{garbage}: {reclaimed:?}");
        assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
        let count: Option<String> = r
            .con
            .hget("q:deliveries", &held[0].fence.key)
            .await
            .unwrap();
        assert_eq!(count.as_deref(), Some("1"), "{garbage}");
        let _: () = r.con.del(Q).await.unwrap();
    }
}

/// A member whose deadline cjson reads as NaN (`"deadline":nan`, or the string "nan") is
/// placed at score 0, where the consumer dead-letters it with a reason, instead of vanishing:
/// promote removed it from the retry set and then failed to add it with a NaN score, and
/// reclaim did the same with a claim that has no recorded score (a Go instance's claim).
#[tokio::test]
async fn a_nan_deadline_is_not_lost_by_promote_or_reclaim() {
    let mut r = rig(1_000, 5).await;
    let parked = r#"{"internal":{"request_queue_name":"q"},"request_kind":"plain","data":{"id":"x","deadline":"nan","payload":{}}}"#;
    let now = unix_ms() as f64 / 1000.0;
    let _: () = r
        .con
        .zadd("retry-sortedset", parked, now - 1.0)
        .await
        .unwrap();
    assert_eq!(
        r.queue
            .promote(10, Some("retry-sortedset"), false)
            .await
            .unwrap()
            .moved,
        1
    );
    let score: Option<f64> = r.con.zscore(Q, parked).await.unwrap();
    assert_eq!(score, Some(0.0));
    assert_eq!(zcard(&mut r.con, "retry-sortedset").await, 0);

    // A Go instance's claim (no claim-scores entry) whose lease has expired.
    let claimed = r#"{"request_kind":"plain","data":{"id":"y","deadline":nan,"payload":{}}}"#;
    let ck = "y\0tok";
    let _: () = r.con.hset("q:claimed", ck, claimed).await.unwrap();
    let _: () = r.con.hset("q:claim-owners", ck, "go-owner").await.unwrap();
    let _: () = r.con.zadd("q:claims-idx", ck, now - 10.0).await.unwrap();
    let reclaimed = r.queue.reclaim(10).await.unwrap();
    assert_eq!(reclaimed.requeued, 1, "{reclaimed:?}");
    let score: Option<f64> = r.con.zscore(Q, claimed).await.unwrap();
    assert_eq!(score, Some(0.0));
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// The claim checks cancel markers in the same step: a cancelled generation is claimed (so it
/// still gets its one record) and flagged; a marker of an older generation does not count.
#[tokio::test]
async fn claim_reports_cancelled_generations() {
    let mut r = rig(30_000, 5).await;
    for id in ["a", "b", "c"] {
        r.producer.submit(request(id, 60)).await.unwrap();
    }
    assert_eq!(
        r.producer
            .cancel(&["a".to_owned(), "c".to_owned()])
            .await
            .unwrap(),
        vec![true, true]
    );
    let _: () = r
        .con
        .set("request-cancel:c", "an-older-token")
        .await
        .unwrap();
    let held = claim_head(&r.queue, 10).await;
    let mut flags: Vec<(String, bool)> = held
        .iter()
        .map(|h| (h.envelope.request.id.clone(), h.cancelled))
        .collect();
    flags.sort();
    assert_eq!(
        flags,
        vec![
            ("a".to_owned(), true),
            ("b".to_owned(), false),
            ("c".to_owned(), false)
        ]
    );
}

/// Claiming, renewing and finishing a batch costs a constant number of Redis commands (scripts'
/// inner commands included): a batch of 200 costs what a batch of 20 does.
#[tokio::test]
async fn a_batch_costs_a_constant_number_of_commands() {
    let mut r = rig(30_000, 5).await;
    let mut costs = Vec::new();
    // The first round also loads the scripts (NOSCRIPT, SCRIPT LOAD): it is not compared.
    for n in [20usize, 20, 200] {
        let reqs: Vec<NewRequest> = (0..n).map(|i| request(&format!("r{n}-{i}"), 60)).collect();
        r.producer.submit_many(reqs).await.unwrap();
        let before = commands_so_far(&mut r.con).await;
        let held = claim_head(&r.queue, n).await;
        assert_eq!(held.len(), n);
        let claimed = commands_so_far(&mut r.con).await;
        let fences: Vec<Fence> = held.iter().map(|h| h.fence.clone()).collect();
        assert_eq!(r.queue.renew(&fences).await.unwrap(), vec![true; n]);
        let renewed = commands_so_far(&mut r.con).await;
        let batch: Vec<Finish> = held
            .iter()
            .map(|h| ack(h, &ResultMessage::http(&h.envelope.request.id, 200, b"{}")))
            .collect();
        assert_eq!(
            r.queue.finish(&batch).await.unwrap(),
            vec![Finished::Published; n]
        );
        let finished = commands_so_far(&mut r.con).await;
        costs.push((claimed - before, renewed - claimed, finished - renewed));
    }
    assert_eq!(results(&mut r.con).await.len(), 240);
    assert_eq!(
        costs[1], costs[2],
        "(claim, renew, finish) commands for 20 and for 200"
    );
    assert!(costs[2].0 + costs[2].2 < 40, "{costs:?}");
}

/// An envelope as Go's redis-pubsub producer publishes it, due in `secs`.
fn published(id: &str, secs: i64) -> Vec<u8> {
    let now = unix_ms() / 1000;
    format!(
        r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"{id}","created":{now},"deadline":{},"payload":{{}}}}}}"#,
        now + secs
    )
    .into_bytes()
}

/// channel -> pending: every instance admits what it received, and each message is queued
/// once, scored by its deadline (a message that is not a request at 0, for the consumer to
/// dead-letter); a message admitted, executed and finished is not queued again when a late
/// subscriber admits it. Markers outlive the deadline by the margin, no more.
#[tokio::test]
async fn admit_queues_each_published_message_once() {
    let mut r = rig(30_000, 5).await;
    let other = Queue::new(r.con.clone(), Q, *r.queue.settings());
    let (late, soon, bad) = (published("late", 60), published("soon", 30), b"xx".to_vec());
    let batch = vec![late.clone(), soon.clone(), bad.clone()];
    assert_eq!(r.queue.admit(&batch).await.unwrap(), 3);
    assert_eq!(other.admit(&batch).await.unwrap(), 0);
    let order: Vec<Vec<u8>> = r
        .queue
        .peek(10)
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.member)
        .collect();
    assert_eq!(order, [bad.clone(), soon.clone(), late.clone()]);
    let ttl: i64 = r.con.ttl(r.queue.keys().seen(&late)).await.unwrap();
    assert!((655..=661).contains(&ttl), "{ttl}");
    let ttl: i64 = r.con.ttl(r.queue.keys().seen(&bad)).await.unwrap();
    assert!((595..=600).contains(&ttl), "{ttl}");

    let _: () = r.con.zrem(Q, &bad).await.unwrap();
    let held = claim_head(&r.queue, 1).await;
    assert_eq!(held[0].envelope.request.id, "soon");
    let done = ResultMessage::http("soon", 200, b"{}");
    r.queue.finish(&[ack(&held[0], &done)]).await.unwrap();
    assert_eq!(other.admit(&[soon]).await.unwrap(), 0);
    assert_eq!(zcard(&mut r.con, Q).await, 1, "only `late` is left");
}

/// With results published (redis-pubsub), an ack PUBLISHes its result on the channel of the
/// result list's name; one nobody is subscribed to hear is pushed onto that list instead, so
/// it is not lost. A dead-lettered message's result goes the same way.
#[tokio::test]
async fn published_results_reach_subscribers_or_are_kept() {
    let mut r = rig(30_000, 5).await;
    let queue = r.queue.clone().publishing_results();
    let held = submit_and_claim(&r, &["heard", "unheard"]).await;
    let mut sub = r.server.client().unwrap().get_async_pubsub().await.unwrap();
    sub.subscribe(RESULTS).await.unwrap();
    let heard = ResultMessage::http("heard", 200, b"{}");
    let got = queue.finish(&[ack(&held[0], &heard)]).await.unwrap();
    assert_eq!(got, [Finished::Published]);
    let msg = tokio::time::timeout(Duration::from_secs(5), sub.on_message().next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(msg.get_payload::<String>().unwrap(), heard.to_json());
    assert!(results(&mut r.con).await.is_empty());
    drop(sub);
    // The unsubscribed connection is gone once PUBSUB NUMSUB says so.
    let started = std::time::Instant::now();
    loop {
        let (_, n): (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(RESULTS)
            .query_async::<Vec<(String, u64)>>(&mut r.con)
            .await
            .unwrap()
            .remove(0);
        if n == 0 {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let unheard = ResultMessage::http("unheard", 200, b"{}");
    queue.finish(&[ack(&held[1], &unheard)]).await.unwrap();
    let kept = results(&mut r.con).await;
    assert_eq!(kept.len(), 1);
    assert_eq!(kept[0].id, "unheard");

    let bad = br#"{"internal":{},"request_kind":"plain","data":{"id":"no-deadline"}}"#;
    let _: () = r.con.zadd(Q, &bad[..], 0).await.unwrap();
    let invalid = ResultMessage::http("no-deadline", 400, b"{}");
    let moved = queue
        .dead_letter(bad, "{}", Some((&route(RESULTS), &invalid)))
        .await
        .unwrap();
    assert_eq!(moved, SetAside::Moved);
    assert_eq!(results(&mut r.con).await.len(), 2, "kept beside `unheard`");
}

/// The list that keeps unheard published results holds the newest 100,000: a deployment whose
/// consumers never read it does not grow Redis without bound (Go keeps none).
#[tokio::test]
async fn unheard_results_keep_the_newest_hundred_thousand() {
    let mut r = rig(30_000, 5).await;
    let queue = r.queue.clone().publishing_results();
    let held = submit_and_claim(&r, &["newest"]).await;
    for chunk in 0..100 {
        let older: Vec<String> = (0..1000)
            .map(|i| format!("older-{}", chunk * 1000 + i))
            .collect();
        let _: () = r.con.lpush(RESULTS, older).await.unwrap();
    }
    let unheard = ResultMessage::http("newest", 200, b"{}");
    assert_eq!(
        queue.finish(&[ack(&held[0], &unheard)]).await.unwrap(),
        [Finished::Published]
    );
    let len: u64 = r.con.llen(RESULTS).await.unwrap();
    assert_eq!(len, 100_000);
    let newest: String = r.con.lindex(RESULTS, 0).await.unwrap();
    assert_eq!(newest, unheard.to_json());
    let oldest: String = r.con.lindex(RESULTS, -1).await.unwrap();
    assert_eq!(oldest, "older-1", "the oldest one was dropped");
}

/// The rig's queue publishing its results (redis-pubsub), as a new ACL user `name` (password
/// `pw`, every key) with these `rules`.
async fn publishing_as(r: &mut Rig, name: &str, rules: &[&str]) -> Queue {
    let mut args = vec!["SETUSER", name, "on", ">pw", "~*"];
    args.extend_from_slice(rules);
    let _: () = redis::cmd("ACL")
        .arg(&args)
        .query_async(&mut r.con)
        .await
        .unwrap();
    let url = format!("redis://{name}:pw@127.0.0.1:{}/", r.server.port());
    let con = connect::manager(&redis::Client::open(url).unwrap())
        .await
        .unwrap();
    Queue::new(con, Q, *r.queue.settings()).publishing_results()
}

/// Under an ACL rule written before the unheard-results trim (everything but `LTRIM`), a finish
/// that keeps an unheard result still makes every other move of its batch: the trim is best
/// effort, and a park in the same call is not lost.
#[tokio::test]
async fn a_rule_without_ltrim_loses_no_move() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["unheard", "parked"]).await;
    let queue = publishing_as(&mut r, "old-rule", &["&*", "+@all", "-ltrim"]).await;
    let unheard = ResultMessage::http("unheard", 200, b"{}");
    let statuses = queue
        .finish(&[ack(&held[0], &unheard), park_of(&held[1])])
        .await
        .unwrap();
    assert_eq!(statuses, [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await, [unheard]);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1, "the park was made");
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// Under an ACL user that may write the result list but not PUBLISH on its channel (Redis checks
/// a channel's rights only when the PUBLISH runs), the refused ack moves nothing and says why,
/// so the outbox keeps it and `/readyz` names the refusal, while a park in the same call is
/// made. Before, the claims were dropped first and the script then failed on the PUBLISH: the
/// ack's request and the park were both lost. With the channel granted, the ack goes through.
#[tokio::test]
async fn a_refused_publish_moves_nothing_of_its_item() {
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["refused", "parked"]).await;
    let queue = publishing_as(&mut r, "no-channel", &["resetchannels", "&other", "+@all"]).await;
    let result = ResultMessage::http("refused", 200, b"{}");
    let statuses = queue
        .finish(&[ack(&held[0], &result), park_of(&held[1])])
        .await
        .unwrap();
    assert!(
        matches!(&statuses[0], Finished::Failed(e) if e.contains("can't publish") && e.contains(RESULTS)),
        "{statuses:?}"
    );
    assert_eq!(statuses[1], Finished::Published);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1, "the park was made");
    assert_eq!(
        queue.claimed(&held[0].fence).await.unwrap().map(|c| c.1),
        Some(0),
        "the refused ack's claim is still held by its owner"
    );
    assert!(results(&mut r.con).await.is_empty());

    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "no-channel", "&*"])
        .query_async(&mut r.con)
        .await
        .unwrap();
    let statuses = queue.finish(&[ack(&held[0], &result)]).await.unwrap();
    assert_eq!(statuses, [Finished::Published]);
    assert_eq!(results(&mut r.con).await, [result], "unheard, so kept");
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
}

/// While Redis refuses writes (here too few replicas; a failed background save or a read-only
/// replica alike), a pub/sub finish publishes nothing: the refusal comes at the script's first
/// write, which now precedes the first PUBLISH. Before, every try published its results and
/// then failed, and the outbox's retries published them again: a subscriber heard 14 messages
/// for 2 results. Once writes are taken again, each result is heard once.
#[tokio::test]
async fn a_refused_write_publishes_nothing() {
    use futures::StreamExt as _;
    let mut r = rig(30_000, 5).await;
    let held = submit_and_claim(&r, &["a", "b"]).await;
    let queue = Queue::new(r.con.clone(), Q, *r.queue.settings()).publishing_results();
    let mut sub = redis::Client::open(r.server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    sub.subscribe(RESULTS).await.unwrap();
    let batch = [
        ack(&held[0], &ResultMessage::http("a", 200, b"{}")),
        ack(&held[1], &ResultMessage::http("b", 200, b"{}")),
    ];
    let _: () = config_set(&mut r.con, "min-replicas-to-write", 1)
        .await
        .unwrap();
    for _ in 0..3 {
        let statuses = queue.finish(&batch).await.unwrap();
        assert!(
            statuses
                .iter()
                .all(|s| matches!(s, Finished::Failed(e) if e.contains("NOREPLICAS"))),
            "{statuses:?}"
        );
    }
    let _: () = config_set(&mut r.con, "min-replicas-to-write", 0)
        .await
        .unwrap();
    assert_eq!(
        queue.finish(&batch).await.unwrap(),
        [Finished::Published, Finished::Published]
    );
    let mut heard = Vec::new();
    let mut messages = sub.on_message();
    while let Ok(Some(msg)) =
        tokio::time::timeout(Duration::from_millis(500), messages.next()).await
    {
        heard.push(msg.get_payload::<String>().unwrap());
    }
    assert_eq!(heard.len(), 2, "{heard:?}");
}

/// Puts Redis out of memory (noeviction, `maxmemory` 1 byte): a plain write is refused `OOM`.
async fn out_of_memory(con: &mut redis::aio::ConnectionManager) {
    config_set(con, "maxmemory", 1).await.unwrap();
    let refused: redis::RedisResult<()> = con.set("grow", "x").await;
    assert_eq!(refused.expect_err("out of memory").code(), Some("OOM"));
}

/// With Redis out of memory, the moves that hand work back keep working, as `renew` does: a due
/// retry is promoted and an expired claim reclaimed (each removes before it adds, and Redis lets
/// a script's writes through once its first write was a removal), and then claimed, acked and
/// parked. Before, promote's first write was its `ZADD` and reclaim's its `HINCRBY`, both
/// refused, so parked retries and a dead instance's claims waited for memory.
#[tokio::test]
async fn promote_and_reclaim_work_while_redis_is_out_of_memory() {
    let mut r = rig(200, 5).await;
    let held = submit_and_claim(&r, &["parked", "expired"]).await;
    assert!(r
        .queue
        .park(
            &held[0].fence,
            &held[0].envelope,
            Duration::from_millis(100)
        )
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    out_of_memory(&mut r.con).await;
    assert_eq!(r.queue.promote(10, None, true).await.unwrap().moved, 1);
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    assert_eq!(zcard(&mut r.con, Q).await, 2, "both are pending again");
    assert_eq!(zcard(&mut r.con, "q:parked").await, 0);
    assert_eq!(hlen(&mut r.con, "q:claimed").await, 0);
    // And the rest of a request's way: claimed again, one acked, one parked.
    let again = claim_head(&r.queue, 10).await;
    assert_eq!(again.len(), 2);
    let done = ResultMessage::http(&again[0].envelope.request.id, 200, b"{}");
    let finished = r
        .queue
        .finish(&[ack(&again[0], &done), park_of(&again[1])])
        .await
        .unwrap();
    assert_eq!(finished, [Finished::Published, Finished::Published]);
    assert_eq!(results(&mut r.con).await.len(), 1);
    assert_eq!(zcard(&mut r.con, "q:parked").await, 1);
}

/// `inferq status`'s census counts each request in the one place it is, and the ones that need
/// attention there: overdue in pending, a lease run out but not reclaimed, a backoff elapsed, a
/// request delivered again, a result waiting.
#[tokio::test]
async fn census_counts_each_place_and_what_needs_attention() {
    let mut r = rig(300, 5).await;
    let held = submit_and_claim(&r, &["a", "b", "c", "d"]).await;
    let done = ResultMessage::http("a", 200, b"{}");
    let now_s = unix_ms() / 1000;
    let parked_due = Finish::Park {
        fence: held[2].fence.clone(),
        member: Queue::retry_member(&held[2].envelope),
        backoff: Duration::ZERO,
    };
    r.queue
        .finish(&[ack(&held[0], &done), park_of(&held[1]), parked_due])
        .await
        .unwrap();
    // Overdue: a Go producer's member whose deadline passed while it waited.
    let _: () = r.con.zadd(Q, "late", now_s - 10).await.unwrap();
    let _: () = r.con.lpush("q:dead", "a record").await.unwrap();

    let mut con = r.con.clone();
    let census = census::census(&mut con, Q, Some(RESULTS)).await.unwrap();
    let want = census::Census {
        at_ms: census.at_ms,
        pending: 1,
        overdue: 1,
        claimed: 1,
        lease_expired: 0,
        parked: 2,
        parked_due: 1,
        dead: 1,
        redelivered: 0,
        results: Some(1),
    };
    assert_eq!(census, want);
    assert!(census.at_ms.abs_diff(redis_now_ms(&mut con).await as i64) < 5_000);

    // d's lease runs out: it is still claimed, and counted as needing a reclaim ...
    let expired = first_nonzero("d's lease to run out", || async {
        let mut con = r.con.clone();
        census::census(&mut con, Q, None)
            .await
            .unwrap()
            .lease_expired
    })
    .await;
    assert_eq!(expired, 1);
    // ... which moves it back to pending, delivered again.
    assert_eq!(r.queue.reclaim(10).await.unwrap().requeued, 1);
    let after = census::census(&mut con, Q, None).await.unwrap();
    assert_eq!(
        (
            after.pending,
            after.claimed,
            after.lease_expired,
            after.redelivered
        ),
        (2, 0, 0, 1)
    );
    assert_eq!(after.results, None, "no result list named");
    assert_eq!(after.unfinished(), 4);

    let _: () = r.con.set(Q, "not a sorted set").await.unwrap();
    let refused = census::census(&mut con, Q, None).await.unwrap_err();
    assert!(refused.to_string().contains("WRONGTYPE"), "{refused}");
}

/// The census moves nothing, so it runs on a read-only replica too (an operator may point
/// `inferq status` at one to spare the primary).
#[tokio::test]
async fn census_runs_on_a_read_only_replica() {
    let mut r = rig(30_000, 5).await;
    config_set(&mut r.con, "repl-diskless-sync-delay", 0)
        .await
        .unwrap();
    submit_and_claim(&r, &["a"]).await;
    r.producer.submit(request("b", 60)).await.unwrap();
    let replica = RedisServer::start_with_args(vec![
        "--replicaof".to_owned(),
        "127.0.0.1".to_owned(),
        r.server.port().to_string(),
    ])
    .unwrap();
    let client = redis::Client::open(replica.url()).unwrap();
    let con = connect::manager(&client).await.unwrap();
    let seen = first_nonzero("the replica to copy the queue", || {
        let mut con = con.clone();
        async move {
            match census::census(&mut con, Q, None).await {
                Ok(c) => c.pending * 10 + c.claimed,
                Err(_) => 0, // still syncing
            }
        }
    })
    .await;
    assert_eq!(seen, 11, "one pending, one claimed");
}

/// With Redis out of memory, a batch of submissions comes back with one refusal per request,
/// naming `OOM`, and none is queued; once memory is free, the same batch is queued whole, once.
/// Before, the first refusal failed the whole call: every line of the batch was "in doubt",
/// though Redis had refused each one, and a partly refused batch could not be told apart from a
/// partly queued one (submitting it again made second generations of the queued requests).
#[tokio::test]
async fn submissions_refused_for_memory_each_say_so_and_nothing_is_queued() {
    let mut r = rig(30_000, 5).await;
    out_of_memory(&mut r.con).await;
    let batch = || vec![request("a", 60), request("b", 60)];
    let outcomes = r.producer.submit_many(batch()).await.unwrap();
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        match outcome {
            Err(ProducerError::Redis(e)) => assert!(e.to_string().contains("OOM"), "{e}"),
            other => panic!("refused for memory: {other:?}"),
        }
    }
    assert_eq!(zcard(&mut r.con, Q).await, 0);
    config_set(&mut r.con, "maxmemory", 0).await.unwrap();
    let outcomes = r.producer.submit_many(batch()).await.unwrap();
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(zcard(&mut r.con, Q).await, 2);
}

/// A submission whose transaction Redis ran but whose `ZADD` it refused at run time (the queue
/// name holds another type, `--queue` naming a list by mistake, say) is not queued, and its
/// outcome says so with Redis's `WRONGTYPE`; it was counted as submitted, and `inferq submit`
/// exited 0 having queued nothing.
#[tokio::test]
async fn a_submission_whose_zadd_fails_in_its_transaction_is_refused() {
    let mut r = rig(30_000, 5).await;
    let _: () = r.con.rpush(Q, "not a sorted set").await.unwrap();
    let outcomes = r
        .producer
        .submit_many(vec![request("a", 60), request("b", 60)])
        .await
        .unwrap();
    assert_eq!(outcomes.len(), 2);
    for outcome in &outcomes {
        match outcome {
            Err(ProducerError::Redis(e)) => assert!(e.to_string().contains("WRONGTYPE"), "{e}"),
            other => panic!("refused by Redis: {other:?}"),
        }
    }
    let single = r.producer.submit(request("c", 60)).await;
    assert!(
        matches!(&single, Err(ProducerError::Redis(e)) if e.to_string().contains("WRONGTYPE")),
        "{single:?}"
    );
}

/// The list-side step of a finish across cluster slots (`deliverOnce-2.lua`, run here on one
/// server): a marker outlives its retention while the queue still has an older staged result,
/// so a result whose finisher died after pushing it is not pushed again by the upkeep that
/// comes back after the retention (before: pushed twice, found by the model check); it goes
/// once nothing older is staged; and a caller whose read of the staged state is older than half
/// the retention is refused, writing nothing.
#[tokio::test]
async fn a_delivered_marker_outlives_its_staged_result_and_stale_readers() {
    use super::scripts::SCRIPTS;
    let mut r = rig(1_000, 5).await;
    let markers = super::keys::delivered_key(RESULTS, Q);
    let now_ms = |con: &mut redis::aio::ConnectionManager| {
        let mut con = con.clone();
        async move {
            let (s, us): (u64, u64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
            s * 1000 + us / 1000
        }
    };
    // Retention 1 s, no TTL; `read_at` and `oldest` as the caller read them.
    let deliver =
        |con: &redis::aio::ConnectionManager, read_at: u64, oldest: Option<u64>, ck: &str| {
            let mut con = con.clone();
            let cmd = SCRIPTS.deliver_once.cmd(
                &[RESULTS, markers.as_str()],
                &[
                    "1000".to_owned(),
                    "0".to_owned(),
                    read_at.to_string(),
                    oldest.map(|o| o.to_string()).unwrap_or_default(),
                    ck.to_owned(),
                    format!("result of {ck}"),
                ],
            );
            async move { SCRIPTS.deliver_once.run(&mut con, &cmd).await.unwrap() }
        };
    let staged_at = now_ms(&mut r.con).await;
    let first = deliver(&r.con, staged_at, Some(staged_at), "a\0t").await;
    assert_eq!(first, redis::Value::Array(vec![redis::Value::Int(1)]));
    // The finisher died before its unstage; upkeep comes back after the retention, the result
    // still staged (the oldest): not pushed again.
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let read_at = now_ms(&mut r.con).await;
    let again = deliver(&r.con, read_at, Some(staged_at), "a\0t").await;
    assert_eq!(again, redis::Value::Array(vec![redis::Value::Int(0)]));
    assert_eq!(r.con.llen::<_, u64>(RESULTS).await.unwrap(), 1);
    // Unstaged (nothing older staged): the next push of the queue trims the old marker.
    let read_at = now_ms(&mut r.con).await;
    let other = deliver(&r.con, read_at, None, "b\0t").await;
    assert_eq!(other, redis::Value::Array(vec![redis::Value::Int(1)]));
    let left: Option<f64> = r.con.zscore(&markers, "a\0t").await.unwrap();
    assert_eq!(left, None, "the old marker was trimmed");
    // A reader that stalled longer than half the retention is refused.
    let stale = deliver(&r.con, read_at - 600, None, "c\0t").await;
    assert_eq!(stale, redis::Value::BulkString(b"stale".to_vec()));
    assert_eq!(r.con.llen::<_, u64>(RESULTS).await.unwrap(), 2);
}
