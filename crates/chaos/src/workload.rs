//! The workload: N requests submitted at a steady rate with the library [`Producer`],
//! straight to Redis (not through the processors' proxies), whatever faults are going on; or,
//! for the redis-pubsub transport, published on the queue's channel.
//!
//! On a cluster or behind Sentinel the producers wait for a replica ([`Producer::with_replica_wait`]):
//! a request the replica did not confirm in time is [`Fate::Unreplicated`] (queued, but a
//! fail-over may lose it), counted apart from the accepted ones. Batches alternate between the
//! producers given (one per result list), so both finish paths run.
//!
//! Each batch is submitted by its own task, so a Redis outage delays only the batches it
//! catches and the rate holds. What comes out is a [`Ledger`]: for every id, when it was
//! submitted and whether Redis accepted it. A submit that failed is never retried under the
//! same id — its fate is unknown (the transaction may have run before the reply was lost), so
//! the checker allows it zero or one terminal record, never two. Some requests get a short
//! deadline and some are cancelled soon after submission, so the `DEADLINE_EXCEEDED` and
//! `CANCELLED` endings happen under the faults too.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde::Serialize;

use inferq_client::producer::{unix_ms, Producer, ProducerError};
use inferq_client::wire::NewRequest;
use inferq_sim::config::DEFAULT_MODEL_NAME;

/// How a submit went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Fate {
    /// Redis answered the transaction: the generation is accepted.
    Accepted,
    /// The call failed (Redis down, connection cut): accepted or not, nobody knows.
    Uncertain(String),
    /// Queued on the primary, but the replica wait timed out before a replica confirmed it
    /// (`ProducerError::NotReplicated`): a fail-over may lose it, so it is allowed zero or one
    /// terminal record, never two.
    Unreplicated(String),
    /// Published on the channel (redis-pubsub) and received by at least one instance: accepted
    /// once one of them has admitted it, which the marker key (`<channel>:seen:<sha1>`) tells
    /// ([`Ledger::resolve_published`]).
    Published(String),
}

/// Every submitted id, with when and how.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    /// id -> (submit time in Unix ms, fate).
    pub ids: BTreeMap<String, (i64, Fate)>,
    /// Ids whose cancellation Redis accepted (the generation was still active).
    pub cancelled: u64,
    /// Cancellations that failed or found nothing active.
    pub cancel_missed: u64,
}

impl Ledger {
    pub fn accepted(&self) -> usize {
        self.ids
            .values()
            .filter(|(_, f)| *f == Fate::Accepted)
            .count()
    }

    /// Submits whose fate nobody knows (not accepted, not [`Fate::Unreplicated`]).
    pub fn uncertain(&self) -> usize {
        self.ids.len() - self.accepted() - self.unreplicated()
    }

    /// Submits queued on the primary that no replica confirmed in time.
    pub fn unreplicated(&self) -> usize {
        self.ids
            .values()
            .filter(|(_, f)| matches!(f, Fate::Unreplicated(_)))
            .count()
    }

    /// The published requests not yet seen admitted, each with its marker key.
    pub fn unsettled(&self) -> Vec<(String, String)> {
        self.ids
            .iter()
            .filter_map(|(id, (_, fate))| match fate {
                Fate::Published(marker) => Some((id.clone(), marker.clone())),
                _ => None,
            })
            .collect()
    }

    /// Marks these published requests accepted: an instance admitted them.
    pub fn mark_admitted(&mut self, ids: &[String]) {
        for id in ids {
            if let Some((_, fate @ Fate::Published(_))) = self.ids.get_mut(id) {
                *fate = Fate::Accepted;
            }
        }
    }

    /// Settles every published request still unsettled: accepted if an instance admitted it
    /// (its marker exists), otherwise uncertain (every instance that received it died or was
    /// cut off before admitting it: pub/sub keeps nothing, as for Go). A marker lives until
    /// the request's deadline plus ten minutes, so a long run also settles during the run
    /// ([`admitted`]), before the first markers expire.
    pub async fn resolve_published(
        &mut self,
        con: &mut redis::aio::ConnectionManager,
    ) -> redis::RedisResult<()> {
        let ids = admitted(con, &self.unsettled()).await?;
        self.mark_admitted(&ids);
        for (_, fate) in self.ids.values_mut() {
            if let Fate::Published(_) = fate {
                *fate = Fate::Uncertain("published, never admitted".to_owned());
            }
        }
        Ok(())
    }
}

/// Which of these published requests (id, marker) an instance has admitted so far.
pub async fn admitted(
    con: &mut redis::aio::ConnectionManager,
    published: &[(String, String)],
) -> redis::RedisResult<Vec<String>> {
    let mut ids = Vec::new();
    for chunk in published.chunks(500) {
        let mut pipe = redis::pipe();
        for (_, marker) in chunk {
            pipe.exists(marker);
        }
        let found: Vec<bool> = pipe.query_async(con).await?;
        ids.extend(
            chunk
                .iter()
                .zip(found)
                .filter(|(_, found)| *found)
                .map(|((id, _), _)| id.clone()),
        );
    }
    Ok(ids)
}

/// What to submit.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Prefix of every id: `<tag>-000042`.
    pub tag: String,
    pub requests: u64,
    /// Requests per second.
    pub rate: f64,
    /// Each request's deadline, from its submission.
    pub deadline: Duration,
    /// Output tokens each asks for (the simulated inference time grows with it).
    pub max_tokens: u64,
    /// Every n-th request (0: none) gets [`Workload::short_deadline`] instead, so some expire
    /// under the faults and end `DEADLINE_EXCEEDED` (on claim, on reclaim or after a retry).
    pub short_deadline_every: u64,
    pub short_deadline: Duration,
    /// Every n-th request (0: none) is cancelled by the producer within a second of its
    /// submission, so some end `CANCELLED` before or during dispatch.
    pub cancel_every: u64,
    /// PUBLISH the requests on the queue's channel (redis-pubsub) instead of submitting them.
    pub publish: bool,
}

impl Workload {
    pub fn id(&self, i: u64) -> String {
        format!("{}-{i:06}", self.tag)
    }

    fn request(&self, i: u64, now_s: i64) -> Result<NewRequest, serde_json::Error> {
        let payload = serde_json::value::to_raw_value(&serde_json::json!({
            "model": DEFAULT_MODEL_NAME,
            "prompt": format!("chaos request {i}"),
            "max_tokens": self.max_tokens,
        }))?;
        let short = self.short_deadline_every > 0 && i % self.short_deadline_every == 1;
        let deadline = if short {
            self.short_deadline
        } else {
            self.deadline
        };
        let deadline_s = i64::try_from(deadline.as_secs()).unwrap_or(i64::MAX);
        Ok(
            NewRequest::new(self.id(i), now_s.saturating_add(deadline_s.max(1)), payload)
                .with_created(now_s),
        )
    }

    /// Submits every request at the configured rate, batches taking turns among `producers`
    /// (at least one), recording each in `ledger`; returns once every submit has an answer.
    pub async fn run(&self, producers: &[Producer], ledger: &Arc<Mutex<Ledger>>) {
        let Some(first) = producers.first() else {
            return;
        };
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut tasks = tokio::task::JoinSet::new();
        let mut next = 0u64;
        let mut turn = 0usize;
        while next < self.requests {
            tick.tick().await;
            let due = (started.elapsed().as_secs_f64() * self.rate).ceil() as u64;
            let end = due.clamp(next + 1, self.requests);
            let now = unix_ms();
            let mut batch = Vec::new();
            for i in next..end {
                match self.request(i, now / 1000) {
                    Ok(r) => batch.push(r),
                    Err(e) => record(ledger, self.id(i), now, Fate::Uncertain(e.to_string())),
                }
            }
            next = end;
            let producer = producers
                .get(turn % producers.len())
                .unwrap_or(first)
                .clone();
            turn += 1;
            let ledger = Arc::clone(ledger);
            let cancel_every = self.cancel_every;
            if self.publish {
                tasks.spawn(publish(producer, batch, ledger));
                continue;
            }
            tasks.spawn(async move {
                let ids: Vec<String> = batch.iter().map(|r| r.id.clone()).collect();
                let at = unix_ms();
                match producer.submit_many(batch).await {
                    Ok(outcomes) => {
                        let mut to_cancel = Vec::new();
                        for (id, outcome) in ids.into_iter().zip(outcomes) {
                            let fate = match outcome {
                                Ok(_) => Fate::Accepted,
                                Err(e @ ProducerError::NotReplicated { .. }) => {
                                    Fate::Unreplicated(e.to_string())
                                }
                                Err(e) => Fate::Uncertain(e.to_string()),
                            };
                            if fate == Fate::Accepted
                                && cancel_every > 0
                                && number(&id) % cancel_every == 0
                            {
                                to_cancel.push(id.clone());
                            }
                            record(&ledger, id, at, fate);
                        }
                        if !to_cancel.is_empty() {
                            let wait = rand::random_range(0..1000);
                            tokio::time::sleep(Duration::from_millis(wait)).await;
                            let (hit, missed) = match producer.cancel(&to_cancel).await {
                                Ok(done) => {
                                    let hit = done.iter().filter(|d| **d).count() as u64;
                                    (hit, done.len() as u64 - hit)
                                }
                                Err(_) => (0, to_cancel.len() as u64),
                            };
                            let mut l = ledger.lock().unwrap_or_else(PoisonError::into_inner);
                            l.cancelled += hit;
                            l.cancel_missed += missed;
                        }
                    }
                    Err(e) => {
                        let why = match e {
                            ProducerError::Redis(e) => format!("redis: {e}"),
                            other => other.to_string(),
                        };
                        for id in ids {
                            record(&ledger, id, at, Fate::Uncertain(why.clone()));
                        }
                    }
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    }
}

/// Publishes one batch (redis-pubsub) and records each request's fate.
async fn publish(producer: Producer, batch: Vec<NewRequest>, ledger: Arc<Mutex<Ledger>>) {
    let ids: Vec<String> = batch.iter().map(|r| r.id.clone()).collect();
    let at = unix_ms();
    match producer.publish_many(batch).await {
        Ok(outcomes) => {
            for (id, outcome) in ids.into_iter().zip(outcomes) {
                let fate = match outcome {
                    Ok(p) if p.receivers > 0 => Fate::Published(p.admitted_marker),
                    Ok(_) => Fate::Uncertain("published, no instance subscribed".to_owned()),
                    Err(e) => Fate::Uncertain(e.to_string()),
                };
                record(&ledger, id, at, fate);
            }
        }
        Err(e) => {
            for id in ids {
                record(&ledger, id, at, Fate::Uncertain(format!("publish: {e}")));
            }
        }
    }
}

/// The number at the end of an id.
fn number(id: &str) -> u64 {
    id.rsplit('-')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

fn record(ledger: &Mutex<Ledger>, id: String, at: i64, fate: Fate) {
    ledger
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .ids
        .insert(id, (at, fate));
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::RedisServer;
    use redis::AsyncCommands;

    fn published(ids: &[&str]) -> Ledger {
        let mut l = Ledger::default();
        for id in ids {
            let fate = Fate::Published(format!("q:seen:{id}"));
            l.ids.insert((*id).to_owned(), (1_000, fate));
        }
        l
    }

    #[tokio::test]
    async fn a_request_seen_admitted_during_the_run_stays_accepted_after_its_marker_expires() {
        let redis = RedisServer::start().expect("redis-server");
        let client = redis::Client::open(redis.url()).expect("client");
        let mut con = inferq_client::connect::manager(&client).await.expect("con");
        let mut ledger = published(&["a", "b", "c"]);
        ledger
            .ids
            .insert("d".into(), (1_000, Fate::Uncertain("cut".into())));
        let _: () = con.set("q:seen:a", 1).await.expect("set");
        let _: () = con.set("q:seen:d", 1).await.expect("set");

        // A round during the run: a is admitted; b and c not yet.
        let ids = admitted(&mut con, &ledger.unsettled())
            .await
            .expect("admitted");
        assert_eq!(ids, ["a"]);
        ledger.mark_admitted(&ids);
        // d's fate was never published: a marker of its name does not make it accepted.
        ledger.mark_admitted(&["d".to_owned()]);
        assert_eq!(ledger.accepted(), 1);

        // a's marker expires; b is admitted late (an instance buffered it while cut off).
        let _: () = con.del("q:seen:a").await.expect("del");
        let _: () = con.set("q:seen:b", 1).await.expect("set");
        ledger.resolve_published(&mut con).await.expect("resolve");

        let fate = |id: &str| ledger.ids[id].1.clone();
        assert_eq!(fate("a"), Fate::Accepted);
        assert_eq!(fate("b"), Fate::Accepted);
        assert_eq!(
            fate("c"),
            Fate::Uncertain("published, never admitted".into())
        );
        assert_eq!(fate("d"), Fate::Uncertain("cut".into()));
        assert!(ledger.unsettled().is_empty());
    }
}
