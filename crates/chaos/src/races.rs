//! Forced stale-owner races at the library level: owner A claims a request under a short
//! lease and "pauses" past it; owner B, on its own connection, reclaims the expired claim and
//! claims the request again; then both try to finish it. A must never publish: its ack, park,
//! release and renew are fenced by its stale owner token. B's ack is the one terminal record.
//!
//! Many races run at once (one task each, one background reclaimer for B), so 1,000 take a few
//! seconds. The order in which A and B finish is drawn per race from the seeded RNG: A first,
//! B first, both at once, or A trying renew + park or release before B acks. Results enter
//! Redis through the real [`Queue`] moves; the verdict ([`RaceReport`]) is read back from the
//! result list, whose records say which owner wrote them.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::ChaosError;
use inferq::queue::moves::{Claimed, Finish, Finished, Held, Queue};
use inferq_client::connect;
use inferq_client::producer::{unix_ms, Producer};
use inferq_client::wire::{Envelope, NewRequest, ResultMessage};
use inferq_client::ClaimSettings;

/// The stale owner's result body; never allowed on the result list.
const STALE_BODY: &[u8] = br#"{"by":"stale-owner"}"#;
const NEW_BODY: &[u8] = br#"{"by":"new-owner"}"#;

/// What the races showed.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RaceReport {
    pub races: u64,
    /// Races where B got the request after A's lease ran out.
    pub taken_over: u64,
    /// Moves by the stale owner A that Redis accepted (ack, park, release, renew): must be 0.
    pub stale_moves_accepted: u64,
    /// Records on the result list written by A: must be 0.
    pub results_by_stale_owner: u64,
    /// B's acks that published.
    pub new_owner_published: u64,
    /// Requests with no result, or more than one.
    pub missing: u64,
    pub duplicates: u64,
    /// Races that went wrong in another way (a move failed, B never got the claim).
    pub errors: Vec<String>,
    /// Claims, parked or pending entries left behind.
    pub stranded: u64,
    /// Races by finishing order.
    pub orders: HashMap<String, u64>,
    pub wall_ms: u64,
}

impl RaceReport {
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut bad = |what: &str, n: u64| {
            if n > 0 {
                out.push(format!("races: {n} {what}"));
            }
        };
        bad(
            "moves by a stale owner were accepted",
            self.stale_moves_accepted,
        );
        bad(
            "results were published by a stale owner",
            self.results_by_stale_owner,
        );
        bad("requests have no result", self.missing);
        bad("requests have more than one result", self.duplicates);
        bad("entries stranded in queue keys", self.stranded);
        bad(
            "races never reached a takeover",
            self.races - self.taken_over,
        );
        if !self.errors.is_empty() {
            out.push(format!("races: errors: {:?}", self.errors));
        }
        out
    }
}

/// The order in which the two owners finish.
#[derive(Debug, Clone, Copy)]
enum Order {
    StaleFirst,
    NewFirst,
    Together,
    StaleRenewsAndParks,
    StaleReleases,
}

impl Order {
    fn draw(rng: &mut StdRng) -> Order {
        match rng.random_range(0..5) {
            0 => Order::StaleFirst,
            1 => Order::NewFirst,
            2 => Order::Together,
            3 => Order::StaleRenewsAndParks,
            _ => Order::StaleReleases,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Order::StaleFirst => "stale ack, then new ack",
            Order::NewFirst => "new ack, then stale ack",
            Order::Together => "both ack at once",
            Order::StaleRenewsAndParks => "stale renew + park, then new ack",
            Order::StaleReleases => "stale release, then new ack",
        }
    }
}

fn ack(held: &Held, list: &str, body: &[u8]) -> Finish {
    Finish::Ack {
        fence: held.fence.clone(),
        id: held.envelope.request.id.clone(),
        request_token: held.envelope.internal.request_token.clone(),
        result_list: list.to_owned(),
        result_ttl_s: 0,
        result: ResultMessage::http(&held.envelope.request.id, 200, body).to_json(),
        payload_ref: held.envelope.internal.payload_ref.clone(),
    }
}

/// Counts a stale owner's move that Redis accepted.
fn accepted(outcome: Result<Vec<Finished>, inferq::queue::QueueError>) -> Result<u64, String> {
    let done = outcome.map_err(|e| e.to_string())?;
    Ok(done
        .iter()
        .filter(|f| matches!(f, Finished::Published))
        .count() as u64)
}

/// One race's outcome.
struct Raced {
    order: Order,
    stale_accepted: u64,
    new_published: u64,
}

async fn race(
    a: Queue,
    b: Queue,
    list: String,
    member: Vec<u8>,
    envelope: Envelope,
    order: Order,
    pause: Duration,
) -> Result<Raced, String> {
    let claim = |q: &Queue| {
        let q = q.clone();
        let item = vec![(member.clone(), envelope.clone())];
        async move { q.claim(item).await.map_err(|e| e.to_string()) }
    };
    let held_a = match claim(&a).await?.pop() {
        Some(Claimed::Held(h)) => h,
        other => return Err(format!("A could not claim: {other:?}")),
    };
    // A is paused past its lease; B's reclaimer puts the request back, and B claims it.
    tokio::time::sleep(pause).await;
    let started = Instant::now();
    let held_b = loop {
        match claim(&b).await?.pop() {
            Some(Claimed::Held(h)) => break h,
            _ if started.elapsed() > Duration::from_secs(20) => {
                return Err("B never got the request back".to_owned())
            }
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let stale = ack(&held_a, &list, STALE_BODY);
    let fresh = ack(&held_b, &list, NEW_BODY);
    let mut stale_accepted = 0;
    let new_published;
    match order {
        Order::StaleFirst => {
            stale_accepted += accepted(a.finish(&[stale]).await)?;
            new_published = accepted(b.finish(&[fresh]).await)?;
        }
        Order::NewFirst => {
            new_published = accepted(b.finish(&[fresh]).await)?;
            stale_accepted += accepted(a.finish(&[stale]).await)?;
        }
        Order::Together => {
            let s = [stale];
            let n = [fresh];
            let (s, n) = tokio::join!(a.finish(&s), b.finish(&n));
            stale_accepted += accepted(s)?;
            new_published = accepted(n)?;
        }
        Order::StaleRenewsAndParks => {
            let renewed = a
                .renew(std::slice::from_ref(&held_a.fence))
                .await
                .map_err(|e| e.to_string())?;
            stale_accepted += renewed.iter().filter(|r| **r).count() as u64;
            let parked = a
                .park(&held_a.fence, &held_a.envelope, Duration::from_millis(10))
                .await
                .map_err(|e| e.to_string())?;
            stale_accepted += u64::from(parked);
            new_published = accepted(b.finish(&[fresh]).await)?;
        }
        Order::StaleReleases => {
            let released = a
                .release(std::slice::from_ref(&held_a.fence))
                .await
                .map_err(|e| e.to_string())?;
            stale_accepted += released.iter().filter(|r| **r).count() as u64;
            new_published = accepted(b.finish(&[fresh]).await)?;
        }
    }
    Ok(Raced {
        order,
        stale_accepted,
        new_published,
    })
}

/// Runs `count` stale-owner races on queue `queue` of the Redis at `url`.
pub async fn run(url: &str, queue: &str, count: u64, seed: u64) -> Result<RaceReport, ChaosError> {
    let started = Instant::now();
    let list = format!("{queue}:results");
    let client = redis::Client::open(url)?;
    let stale_lease = Duration::from_millis(300);
    let a = Queue::new(
        connect::manager(&client).await?,
        queue,
        ClaimSettings {
            lease: stale_lease,
            reclaim_interval: Duration::from_millis(100),
            max_deliveries: u32::MAX,
            replica_wait: None,
        },
    );
    let b = Queue::new(
        connect::manager(&client).await?,
        queue,
        ClaimSettings {
            lease: Duration::from_secs(60),
            reclaim_interval: Duration::from_millis(100),
            max_deliveries: u32::MAX,
            replica_wait: None,
        },
    );

    // The requests, one per race.
    let producer = Producer::connect(url, queue, &list)
        .await
        .map_err(|e| ChaosError::Process(format!("races: cannot connect the producer: {e}")))?;
    let now_s = unix_ms() / 1000;
    let mut requests = Vec::new();
    for i in 0..count {
        let payload = serde_json::value::to_raw_value(&serde_json::json!({"prompt": i}))
            .map_err(|e| ChaosError::Process(e.to_string()))?;
        requests.push(
            NewRequest::new(format!("race-{i:05}"), now_s + 3600, payload).with_created(now_s),
        );
    }
    for chunk in requests.chunks(500) {
        producer
            .submit_many(chunk.to_vec())
            .await
            .map_err(|e| ChaosError::Process(format!("races: submit failed: {e}")))?;
    }
    let members: Vec<(Vec<u8>, Envelope)> = a
        .peek(usize::try_from(count).unwrap_or(usize::MAX))
        .await?
        .into_iter()
        .filter_map(|p| Envelope::decode(&p.member).ok().map(|e| (p.member, e)))
        .collect();

    // B's reclaimer: expired leases back to pending, as any instance's reclaim loop does.
    let stop = tokio_util::sync::CancellationToken::new();
    let reclaimer = {
        let b = b.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            while !stop.is_cancelled() {
                let _ = b.reclaim(500).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    let mut rng = StdRng::seed_from_u64(seed);
    let mut tasks = tokio::task::JoinSet::new();
    let mut report = RaceReport {
        races: members.len() as u64,
        ..RaceReport::default()
    };
    for (member, envelope) in members {
        let order = Order::draw(&mut rng);
        let pause = stale_lease + Duration::from_millis(rng.random_range(50..300));
        tasks.spawn(race(
            a.clone(),
            b.clone(),
            list.clone(),
            member,
            envelope,
            order,
            pause,
        ));
    }
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok(Ok(r)) => {
                report.taken_over += 1;
                report.stale_moves_accepted += r.stale_accepted;
                report.new_owner_published += r.new_published;
                *report.orders.entry(r.order.name().to_owned()).or_default() += 1;
            }
            Ok(Err(e)) => report.errors.push(e),
            Err(e) => report.errors.push(format!("race task failed: {e}")),
        }
    }
    stop.cancel();
    let _ = reclaimer.await;
    report.errors.truncate(20);

    // The verdict, from what Redis holds.
    let mut con = a.connection();
    let raw: Vec<Vec<u8>> = redis::cmd("LRANGE")
        .arg(&list)
        .arg(0)
        .arg(-1)
        .query_async(&mut con)
        .await?;
    let mut per_id: HashMap<String, u64> = HashMap::new();
    for r in &raw {
        if let Ok(msg) = serde_json::from_slice::<ResultMessage>(r) {
            if msg.payload.as_bytes() == STALE_BODY {
                report.results_by_stale_owner += 1;
            }
            *per_id.entry(msg.id).or_default() += 1;
        }
    }
    report.missing = count.saturating_sub(per_id.len() as u64);
    report.duplicates = per_id.values().filter(|&&n| n > 1).count() as u64;
    report.stranded = super::observe::key_sizes(&mut con, a.keys())
        .await?
        .iter()
        .filter(|(k, _)| **k != a.keys().dead)
        .map(|(_, n)| n)
        .sum();
    report.wall_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::RedisServer;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_stale_owner_ever_publishes() {
        let redis = RedisServer::start().unwrap();
        let report = run(&redis.url(), "races", 200, 42).await.unwrap();
        assert!(report.failures().is_empty(), "{report:?}");
        assert_eq!(report.races, 200);
        assert_eq!(report.new_owner_published, 200);
        assert_eq!(
            report.orders.len(),
            5,
            "every order is exercised: {report:?}"
        );
    }
}
