//! Reliable result consumers. Go's consumers `BRPOP`, and a consumer that dies between popping
//! and storing a result loses it. A [`ReliableConsumer`] takes each result into its own
//! in-progress list `<result list>:taken:<name>` (`BLMOVE`), acknowledges it once stored (`LREM`),
//! and at start hands back what its name took but never acknowledged (`handBack`).
//!
//! The name is leased (`<result list>:taken:<name>:lease`, `holdName`): a consumer takes the
//! lease before handing back, renews it in the background, and gives it up when it stops
//! (`dropName`). A second live consumer under the same name is refused instead of handing the
//! first one's results back under it; one whose lease went to another process stops without
//! acknowledging, since the entry it would remove may be the other's.
//!
//! This scheme is inferq's own, and a Go durable consumer cannot share a list with it:
//! `inferq results --consumer` now runs Go's durable protocol ([`crate::durable_results`]), and
//! this module remains for [`crate::producer::Producer::hand_back_older`], which returns what an
//! older inferq left under a name.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::target::Link;

use crate::keys::fresh_token;
use crate::producer::{blocking_pop, ProducerError, TakenResult};
use crate::scripts::SCRIPTS;

/// How long a name's lease lasts without renewal: how long a successor waits after a consumer
/// was killed.
pub const NAME_LEASE: Duration = Duration::from_secs(15);
/// How long a starting consumer waits for its name by default: past a lapsing lease, so only a
/// live holder makes it fail.
pub const NAME_PATIENCE: Duration = Duration::from_secs(17);
/// How often a running consumer renews its name's lease.
const RENEW_EVERY: Duration = Duration::from_secs(3);
/// How often a starting consumer asks again for a lease another holds.
const ASK_AGAIN: Duration = Duration::from_millis(250);

/// Takes results reliably under a leased consumer name; see the module comment.
#[derive(Debug)]
pub struct ReliableConsumer {
    con: Link,
    blocking: Link,
    name: String,
    results: String,
    taken: String,
    lease: String,
    token: String,
    lost: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl ReliableConsumer {
    /// Takes the name's lease (waiting up to `patience` for one another holds: a stopped
    /// consumer's lapses within [`NAME_LEASE`]) and starts renewing it.
    pub(super) async fn open(
        mut con: Link,
        blocking: Link,
        result_list: &str,
        name: &str,
        patience: Duration,
    ) -> Result<ReliableConsumer, ProducerError> {
        let taken = taken_list(result_list, name, con.is_cluster());
        let lease = format!("{taken}:lease");
        let token = fresh_token();
        let started = Instant::now();
        let mut said = false;
        while !hold(&mut con, &lease, &token).await? {
            if started.elapsed() > patience {
                return Err(ProducerError::NameInUse {
                    name: name.to_owned(),
                    waited: started.elapsed(),
                });
            }
            if !said {
                tracing::info!(
                    consumer = name,
                    "waiting for the consumer name's lease (another consumer holds it, or one \
                     that stopped without giving it up)"
                );
                said = true;
            }
            tokio::time::sleep(ASK_AGAIN).await;
        }
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = tokio::spawn(renew(
            con.clone(),
            lease.clone(),
            token.clone(),
            lost.clone(),
        ));
        Ok(ReliableConsumer {
            con,
            blocking,
            name: name.to_owned(),
            results: result_list.to_owned(),
            taken,
            lease,
            token,
            lost,
            renewer,
        })
    }

    fn still_held(&self) -> Result<(), ProducerError> {
        if self.lost.load(Ordering::Acquire) {
            return Err(ProducerError::NameLost {
                name: self.name.clone(),
            });
        }
        Ok(())
    }

    /// Takes the oldest result, waiting up to `timeout`.
    pub async fn take(&mut self, timeout: Duration) -> Result<Option<TakenResult>, ProducerError> {
        self.still_held()?;
        // A result Redis moves after this gives up is not lost: it waits in the taken list
        // and is handed back at the next start under this name.
        let mut blmove = redis::cmd("BLMOVE");
        blmove
            .arg(&self.results)
            .arg(&self.taken)
            .arg("RIGHT")
            .arg("LEFT")
            .arg(timeout.as_secs_f64());
        let take = blmove.query_async::<Option<Vec<u8>>>(&mut self.blocking);
        let raw = blocking_pop(timeout, take).await?;
        Ok(raw.map(TakenResult::of))
    }

    /// The result is stored: forget it. Refused once the name's lease is lost.
    pub async fn ack(&mut self, taken: &TakenResult) -> Result<(), ProducerError> {
        self.still_held()?;
        let _: i64 = redis::cmd("LREM")
            .arg(&self.taken)
            .arg(1)
            .arg(&taken.raw)
            .query_async(&mut self.con)
            .await?;
        Ok(())
    }

    /// Returns every taken-but-unacknowledged result to the result list (oldest popped first).
    /// Run at start-up by a consumer that restarts under the same name.
    pub async fn hand_back(&mut self) -> Result<u64, ProducerError> {
        self.still_held()?;
        let cmd = SCRIPTS
            .hand_back
            .cmd(&[&self.taken, &self.results], &[] as &[&str]);
        match SCRIPTS.hand_back.run(&mut self.con, &cmd).await? {
            redis::Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            _ => Ok(0),
        }
    }

    /// Stops renewing and gives the name up, so a successor starts at once.
    pub async fn close(mut self) -> Result<(), ProducerError> {
        self.renewer.abort();
        let cmd = SCRIPTS.drop_name.cmd(&[&self.lease], &[&self.token]);
        SCRIPTS.drop_name.run(&mut self.con, &cmd).await?;
        Ok(())
    }
}

impl Drop for ReliableConsumer {
    /// Without [`ReliableConsumer::close`], the lease lapses after [`NAME_LEASE`].
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// What a durable consumer's start found of this scheme under its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Older {
    /// Nothing was left under the name.
    Nothing,
    /// This many results were handed back to the list, to be taken first.
    HandedBack(u64),
    /// An older consumer under the name kept its lease: it still runs and keeps what it holds.
    StillRunning,
}

/// `<result list>:taken:<name>`; on a cluster the taken list shares the result list's slot
/// (BLMOVE, handBack).
pub(super) fn taken_list(result_list: &str, name: &str, cluster: bool) -> String {
    let prefix = if cluster {
        crate::keys::slot_key(result_list)
    } else {
        result_list.to_owned()
    };
    format!("{prefix}:taken:{name}")
}

/// One `holdName` call: whether this token holds the lease now.
async fn hold(con: &mut Link, lease: &str, token: &str) -> Result<bool, ProducerError> {
    let ms = NAME_LEASE.as_millis().to_string();
    let cmd = SCRIPTS.hold_name.cmd(&[lease], &[token, ms.as_str()]);
    Ok(matches!(
        SCRIPTS.hold_name.run(con, &cmd).await?,
        redis::Value::Int(1)
    ))
}

/// Renews the lease until it is found in another's hands (then `lost` is set). A Redis error is
/// tried again at the next tick: the lease outlasts several.
async fn renew(mut con: Link, lease: String, token: String, lost: Arc<AtomicBool>) {
    loop {
        tokio::time::sleep(RENEW_EVERY).await;
        match hold(&mut con, &lease, &token).await {
            Ok(true) => {}
            Ok(false) => {
                lost.store(true, Ordering::Release);
                return;
            }
            Err(e) => tracing::warn!(error = %e, "could not renew the consumer name's lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::producer::Producer;
    use inferq_testkit::RedisServer;
    use redis::AsyncCommands;

    const RESULTS: &str = "results";

    async fn setup() -> (RedisServer, Producer, redis::aio::MultiplexedConnection) {
        let server = RedisServer::start().expect("redis-server");
        let producer = Producer::connect(&server.url(), "q", RESULTS)
            .await
            .unwrap();
        let con = server.connection().await.unwrap();
        (server, producer, con)
    }

    #[tokio::test]
    async fn a_live_consumers_name_is_refused_to_a_second_and_freed_by_close() {
        let (_server, producer, _con) = setup().await;
        let first = producer.reliable("c1").await.unwrap();
        let started = Instant::now();
        let second = producer
            .reliable_waiting("c1", Duration::from_millis(600))
            .await;
        match second {
            Err(ProducerError::NameInUse { name, .. }) => assert_eq!(name, "c1"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("two live consumers share the name c1"),
        }
        assert!(started.elapsed() >= Duration::from_millis(600));
        // Another name is free; and once the first closes, its name is taken at once.
        producer
            .reliable("c2")
            .await
            .unwrap()
            .close()
            .await
            .unwrap();
        first.close().await.unwrap();
        // Well before the 15 s lease could lapse.
        producer
            .reliable_waiting("c1", Duration::from_secs(5))
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_killed_consumers_name_is_taken_once_its_lease_lapses() {
        let (_server, producer, mut con) = setup().await;
        drop(producer.reliable("c1").await.unwrap()); // killed: the lease stays
        let ttl: i64 = con.pttl("results:taken:c1:lease").await.unwrap();
        assert!(ttl > 10_000, "{ttl}");
        // Time passes (shortened from 15 s): the successor waits, then takes it. Timed from
        // before the lease is shortened, so a stall in between cannot eat into the wait.
        let started = Instant::now();
        let _: () = con.pexpire("results:taken:c1:lease", 700).await.unwrap();
        producer
            .reliable_waiting("c1", Duration::from_secs(5))
            .await
            .unwrap();
        assert!(
            started.elapsed() >= Duration::from_millis(400),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn a_consumer_whose_name_was_taken_over_stops_without_acknowledging() {
        let (_server, producer, mut con) = setup().await;
        let json = crate::wire::ResultMessage::http("r1", 200, b"{}").to_json();
        let _: () = con.lpush(RESULTS, json).await.unwrap();
        let mut first = producer.reliable("c1").await.unwrap();
        let r1 = first.take(Duration::from_secs(1)).await.unwrap().unwrap();
        // Its lease went to another process (it stalled past the lease, say).
        let _: () = con
            .set("results:taken:c1:lease", "someone-else")
            .await
            .unwrap();
        tokio::time::sleep(RENEW_EVERY + Duration::from_millis(500)).await;
        assert!(matches!(
            first.ack(&r1).await,
            Err(ProducerError::NameLost { .. })
        ));
        assert!(matches!(
            first.take(Duration::from_millis(10)).await,
            Err(ProducerError::NameLost { .. })
        ));
        // r1 is still owed a store by whoever holds the name now.
        let taken: Vec<String> = con.lrange("results:taken:c1", 0, -1).await.unwrap();
        assert_eq!(taken.len(), 1);
        // Closing does not drop the other holder's lease.
        first.close().await.unwrap();
        let holder: String = con.get("results:taken:c1:lease").await.unwrap();
        assert_eq!(holder, "someone-else");
    }
}
