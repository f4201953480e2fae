//! One or more tests for every rule of the durability contract, each against its own real
//! `redis-server` (see [`inferq_testkit`]). Leases that must run out are short (hundreds of ms)
//! so expiry is real; a lease or backoff that a test checks has not run out yet lasts seconds, so
//! a stalled test thread on a loaded machine cannot outlast it.
//!
//! One file per move; the rig and the helpers they share are here.

use std::time::{Duration, Instant};

use futures::StreamExt;
use redis::AsyncCommands;
use serde_json::value::RawValue;

use super::dead::DeadRecord;
use super::*;
use inferq_client::connect;
use inferq_client::producer::{unix_ms, Producer, ProducerError};
use inferq_client::wire::{Envelope, NewRequest, ResultMessage};
use inferq_client::ClaimSettings;
use inferq_testkit::{config_set, RedisServer};

const Q: &str = "q";
const RESULTS: &str = "results";

struct Rig {
    server: RedisServer,
    queue: Queue,
    producer: Producer,
    con: redis::aio::ConnectionManager,
}

mod census;
mod claim;
mod finish;
mod park;
mod publish;
mod reclaim;
mod submit;

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
    NewRequest::new(
        id.to_owned(),
        unix_ms() / 1000 + deadline_in_s,
        RawValue::from_string(r#"{"model":"m","prompt":"hi"}"#.to_owned()).unwrap(),
    )
    .with_created(unix_ms() / 1000)
}

/// The score newer Go gives a member: its deadline plus its `enqueue_seq` fraction.
fn fifo_score(env: &Envelope) -> f64 {
    inferq_client::wire::score_of(env.request.deadline, env.internal.enqueue_seq)
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

/// An envelope as Go's redis-pubsub producer publishes it, due in `secs`.
fn published(id: &str, secs: i64) -> Vec<u8> {
    let now = unix_ms() / 1000;
    format!(
        r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"{id}","created":{now},"deadline":{},"payload":{{}}}}}}"#,
        now + secs
    )
    .into_bytes()
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

/// Puts Redis out of memory (noeviction, `maxmemory` 1 byte): a plain write is refused `OOM`.
async fn out_of_memory(con: &mut redis::aio::ConnectionManager) {
    config_set(con, "maxmemory", 1).await.unwrap();
    let refused: redis::RedisResult<()> = con.set("grow", "x").await;
    assert_eq!(refused.expect_err("out of memory").code(), Some("OOM"));
}
