//! The producer side, as the Go producer does it: `submit` (one script
//! call per request that numbers it, clears its cancel marker, sets its active token and queues
//! it, then a PUBLISH on the queue's doorbell channel per batch so idle processors wake at once),
//! `cancel` (copy the active token to the cancel marker), and results — Go's destructive
//! `BRPOP`, Go's durable consumer protocol ([`crate::durable_results`]), and the older
//! inferq-only reliable mode of [`crate::reliable`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::RedisError;

use crate::connect;
use crate::keys::{active_key, cancel_key, doorbell_channel};
use crate::scripts::SCRIPTS;
use crate::settings::ReplicaWait;
use crate::submit::{Prepare, Prepared};
use crate::target::{Link, LinkError, Target, Topology};
use crate::wire::{MemberError, NewRequest, ResultMessage};

pub use crate::reliable::ReliableConsumer;
pub use crate::submit::PayloadKeys;

/// How long a cancel marker lives (Go: seven days).
pub const CANCEL_MARKER_TTL_SECS: u64 = 604_800;

/// Producer errors, with the Go producer's texts where it has them.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// Redis refused or failed a call.
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    /// The URL or TLS files cannot make a client.
    #[error(transparent)]
    Connect(#[from] connect::ConnectError),
    /// No connection could be opened.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// A request without an id.
    #[error("request ID is required")]
    MissingId,
    /// A request whose deadline is not a positive Unix time.
    #[error("deadline is required and must be a positive Unix timestamp")]
    BadDeadline,
    /// A request whose deadline has passed.
    #[error("deadline has already expired")]
    Expired,
    /// A request that does not encode as a Go envelope.
    #[error("request could not be encoded: {0}")]
    Encode(#[from] MemberError),
    /// A result list entry that is no result message.
    #[error("failed to unmarshal result: {0}")]
    BadResult(String),
    /// A result message without its request's id.
    #[error("result missing 'id' field")]
    ResultWithoutId,
    /// No result list was named.
    #[error("ResultQueueName is required")]
    NoResultQueue,
    /// The request is on the primary but fewer replicas than asked hold it.
    #[error(
        "queued on the primary, but {acked} of the {wanted} replicas asked for had it within \
         {timeout:?}: a fail-over now could lose it (submitting it again makes a second \
         generation)"
    )]
    NotReplicated {
        /// Replicas that hold it.
        acked: u32,
        /// Replicas asked for.
        wanted: u32,
        /// How long the wait was.
        timeout: Duration,
    },
    /// Another live consumer holds the consumer name.
    #[error(
        "consumer name {name:?} is in use by another live consumer (its lease was renewed for \
         {waited:?}); give this one another name"
    )]
    NameInUse {
        /// The consumer name.
        name: String,
        /// How long its lease was seen renewed.
        waited: Duration,
    },
    /// Another process took the consumer name over.
    #[error(
        "consumer name {name:?} was taken over by another process (this one could not renew its \
         lease in time): stopped without acknowledging"
    )]
    NameLost {
        /// The consumer name.
        name: String,
    },
    /// A blocking pop got no answer by its own timeout plus [`BLOCKING_GRACE`]: Redis stopped
    /// answering (frozen, `DEBUG SLEEP`, a network path that drops packets). The connection is
    /// given up: a reply arriving later would be one nobody reads.
    #[error("redis: no answer within {waited:?} (Redis is not answering); gave up the connection")]
    NoAnswer {
        /// How long the pop waited.
        waited: Duration,
    },
}

/// How long past a blocking pop's own timeout Redis may take to answer before the pop fails. The
/// blocking connection has no response timeout of its own (the pop's timeout rules), so without
/// this bound a Redis that stops answering held `inferq results --timeout 5s` for ever.
pub const BLOCKING_GRACE: Duration = connect::RESPONSE_TIMEOUT;

/// Runs one blocking pop that waits up to `timeout` in Redis, failing with
/// [`ProducerError::NoAnswer`] when Redis has not answered [`BLOCKING_GRACE`] after that.
pub(super) async fn blocking_pop<T>(
    timeout: Duration,
    pop: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, ProducerError> {
    let waited = timeout.saturating_add(BLOCKING_GRACE);
    match tokio::time::timeout(waited, pop).await {
        Ok(answer) => Ok(answer?),
        Err(_) => Err(ProducerError::NoAnswer { waited }),
    }
}

/// Submits to one request queue and reads one result list.
#[derive(Debug, Clone)]
pub struct Producer {
    target: Target,
    pub(super) con: Link,
    pub(super) request_queue: String,
    pub(super) result_queue: String,
    /// Whether to ring the queue's doorbell after submitting (off once Redis refused it).
    doorbell: Arc<AtomicBool>,
    /// Replicas a submission must reach before it is reported accepted.
    replica_wait: Option<ReplicaWait>,
    /// Which bodies are stored apart from their members (newer Go's payload keys).
    pub(super) payload_keys: PayloadKeys,
}

/// What `submit` wrote.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Submitted {
    /// The request's id.
    pub id: String,
    /// The generation's token (also the value of `request-active:<id>`).
    pub request_token: String,
    /// Its place among requests of the queue with the same deadline (1-based; newer Go's
    /// `internal.enqueue_seq`), once Redis has numbered it.
    pub enqueue_seq: i64,
}

/// What `publish_many` sent on the channel (Go's redis-pubsub producer).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Published {
    /// The request's id.
    pub id: String,
    /// How many subscribers received it (`PUBLISH`'s answer); 0 means no instance will ever see
    /// it, as with Go's producer.
    pub receivers: u64,
    /// The key an instance sets when it admits this message (`<channel>:seen:<sha1>`): once it
    /// exists, the request is durable and will get exactly one result.
    pub admitted_marker: String,
}

/// A result taken by a reliable consumer: acknowledge it once stored, or it is handed back.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TakenResult {
    /// The entry exactly as it was stored.
    pub raw: Vec<u8>,
    /// The parsed result, or why it does not parse (it was still taken, so it cannot wedge
    /// the consumer; the caller decides whether to store it raw).
    pub result: Result<ResultMessage, String>,
}

/// Now, in Unix milliseconds (this host's clock: used only for deadlines, never for leases).
pub fn unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn parse_result(raw: &[u8]) -> Result<ResultMessage, ProducerError> {
    let result: ResultMessage =
        serde_json::from_slice(raw).map_err(|e| ProducerError::BadResult(e.to_string()))?;
    if result.id.is_empty() {
        return Err(ProducerError::ResultWithoutId);
    }
    Ok(result)
}

impl Producer {
    /// Connects (and checks the connection) to the Redis at `url`.
    pub async fn connect(
        url: &str,
        request_queue: &str,
        result_queue: &str,
    ) -> Result<Producer, ProducerError> {
        Self::connect_tls(
            url,
            &connect::RedisTls::default(),
            request_queue,
            result_queue,
        )
        .await
    }

    /// [`Producer::connect`] with TLS files for a `rediss://` URL (private CA, client
    /// certificate).
    pub async fn connect_tls(
        url: &str,
        tls: &connect::RedisTls,
        request_queue: &str,
        result_queue: &str,
    ) -> Result<Producer, ProducerError> {
        Self::connect_target(
            &Target::new(url, tls, Topology::Standalone)?,
            request_queue,
            result_queue,
        )
        .await
    }

    /// [`Producer::connect`] to any [`Target`]: one server, a cluster, or a Sentinel primary.
    pub async fn connect_target(
        target: &Target,
        request_queue: &str,
        result_queue: &str,
    ) -> Result<Producer, ProducerError> {
        if result_queue.is_empty() {
            return Err(ProducerError::NoResultQueue);
        }
        let con = target.connect().await?;
        Ok(Producer {
            target: target.clone(),
            con,
            request_queue: if request_queue.is_empty() {
                "request-sortedset".to_owned()
            } else {
                request_queue.to_owned()
            },
            result_queue: result_queue.to_owned(),
            doorbell: Arc::new(AtomicBool::new(true)),
            replica_wait: None,
            payload_keys: PayloadKeys::Inline,
        })
    }

    /// Reports a submission accepted only once `wait.replicas` replicas hold it (`WAIT`), so a
    /// fail-over cannot lose what the caller was told is queued. A submission that reached
    /// fewer in time is reported [`ProducerError::NotReplicated`]: it is queued on the primary,
    /// but may be lost.
    pub fn with_replica_wait(mut self, wait: Option<ReplicaWait>) -> Producer {
        self.replica_wait = wait;
        self
    }

    /// When asked to, waits for the replicas after `outcomes` were queued, and turns the
    /// queued ones into [`ProducerError::NotReplicated`] when too few replicas have them.
    pub(super) async fn replicated(&self, outcomes: &mut [Result<Submitted, ProducerError>]) {
        let Some(wait) = self.replica_wait else {
            return;
        };
        let acked = match self
            .con
            .clone()
            .wait_replicas(&self.request_queue, wait)
            .await
        {
            Ok(acked) if acked >= wait.replicas => return,
            Ok(acked) => acked,
            Err(e) => {
                tracing::warn!(error = %e, "cannot ask Redis how many replicas hold the submissions (WAIT)");
                0
            }
        };
        for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
            *outcome = Err(ProducerError::NotReplicated {
                acked,
                wanted: wait.replicas,
                timeout: wait.timeout,
            });
        }
    }

    /// The request queue this producer submits to.
    pub fn request_queue(&self) -> &str {
        &self.request_queue
    }

    /// The same producer (connection, result list, settings) submitting to `queue` instead.
    pub fn for_queue(&self, queue: &str) -> Producer {
        Producer {
            request_queue: queue.to_owned(),
            ..self.clone()
        }
    }

    /// The result list this producer reads.
    pub fn result_queue(&self) -> &str {
        &self.result_queue
    }

    /// Publishes requests on the request queue's name as a channel, as Go's redis-pubsub
    /// producer does (one pipelined `PUBLISH` each): inferq instances subscribed to it admit
    /// them into the durable queue of that name. Unlike [`Producer::submit_many`], nothing is
    /// kept if no instance is subscribed; [`Published::receivers`] says whether one was.
    pub async fn publish_many(
        &self,
        reqs: Vec<NewRequest>,
    ) -> Result<Vec<Result<Published, ProducerError>>, ProducerError> {
        let now = unix_ms();
        let keys = crate::keys::QueueKeys::for_layout(&self.request_queue, self.con.is_cluster());
        let mut pipe = redis::pipe();
        let mut outcomes = Vec::with_capacity(reqs.len());
        for req in reqs {
            match self.prepare(req, now, Prepare::Publish) {
                Ok(Prepared {
                    member, submitted, ..
                }) => {
                    let admitted_marker = keys.seen(&member);
                    pipe.cmd("PUBLISH").arg(&self.request_queue).arg(member);
                    outcomes.push(Ok(Published {
                        id: submitted.id,
                        receivers: 0,
                        admitted_marker,
                    }));
                }
                Err(e) => outcomes.push(Err(e)),
            }
        }
        if outcomes.iter().any(Result::is_ok) {
            let receivers: Vec<u64> = pipe.query_async(&mut self.con.clone()).await?;
            let published = outcomes.iter_mut().filter_map(|o| o.as_mut().ok());
            for (p, n) in published.zip(receivers) {
                p.receivers = n;
            }
        }
        Ok(outcomes)
    }

    /// Rings the queue's doorbell so idle processors poll at once (one PUBLISH per batch of
    /// submissions). A wake-up only saves latency: processors poll anyway, so a refusal (an
    /// ACL without pub/sub rights) is reported once and ringing stops.
    pub(super) async fn ring(&self) {
        if !self.doorbell.load(Ordering::Relaxed) {
            return;
        }
        let rung: Result<i64, RedisError> = redis::cmd("PUBLISH")
            .arg(doorbell_channel(&self.request_queue))
            .arg("1")
            .query_async(&mut self.con.clone())
            .await;
        if let Err(e) = rung {
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
                self.doorbell.store(false, Ordering::Relaxed);
                tracing::warn!(error = %e, "cannot ring the queue's doorbell; processors will find the requests by polling");
            }
        }
    }

    /// Cancels the newest generation of each id. `true` where an active generation was marked;
    /// unknown ids are a no-op, empty ids are skipped.
    pub async fn cancel(&self, ids: &[String]) -> Result<Vec<bool>, ProducerError> {
        let mut out = Vec::with_capacity(ids.len());
        let mut con = self.con.clone();
        for id in ids {
            if id.is_empty() {
                out.push(false);
                continue;
            }
            if con.is_cluster() {
                // The two markers are in different slots: read, then mark, as Go does there.
                let active: Option<String> = redis::cmd("GET")
                    .arg(active_key(id))
                    .query_async(&mut con)
                    .await?;
                if let Some(token) = &active {
                    let _: () = redis::cmd("SET")
                        .arg(cancel_key(id))
                        .arg(token)
                        .arg("EX")
                        .arg(CANCEL_MARKER_TTL_SECS)
                        .query_async(&mut con)
                        .await?;
                }
                out.push(active.is_some());
                continue;
            }
            let cmd = SCRIPTS
                .cancel
                .cmd(&[active_key(id), cancel_key(id)], &[CANCEL_MARKER_TTL_SECS]);
            let v = SCRIPTS.cancel.run(&mut con, &cmd).await?;
            out.push(matches!(v, redis::Value::Int(1)));
        }
        Ok(out)
    }

    async fn blocking(&self) -> Result<Link, ProducerError> {
        Ok(self.target.blocking().await?)
    }

    /// Pops one result (Go's destructive `BRPOP`): `None` after `timeout` without one.
    pub async fn pop_result(
        &self,
        timeout: Duration,
    ) -> Result<Option<ResultMessage>, ProducerError> {
        self.popper().await?.pop(timeout).await
    }

    /// A destructive popper with its own blocking connection, for reading many results.
    pub async fn popper(&self) -> Result<Popper, ProducerError> {
        Ok(Popper {
            con: self.blocking().await?,
            results: self.result_queue.clone(),
            given_up: None,
        })
    }

    /// A reliable consumer named `consumer` on this producer's result list, holding the name's
    /// lease: waits for a lease a stopped consumer left to lapse, and fails with
    /// [`ProducerError::NameInUse`] while a live consumer keeps it.
    pub async fn reliable(&self, consumer: &str) -> Result<ReliableConsumer, ProducerError> {
        self.reliable_waiting(consumer, crate::reliable::NAME_PATIENCE)
            .await
    }

    /// [`Producer::reliable`], waiting at most `patience` for the name.
    pub async fn reliable_waiting(
        &self,
        consumer: &str,
        patience: Duration,
    ) -> Result<ReliableConsumer, ProducerError> {
        ReliableConsumer::open(
            self.con.clone(),
            self.blocking().await?,
            &self.result_queue,
            consumer,
            patience,
        )
        .await
    }
}

impl Producer {
    /// Hands back what an older inferq's `results --consumer <consumer>` (the scheme of
    /// [`crate::reliable`]) took and never acknowledged, so an upgrade strands nothing: nothing
    /// to do (one `LLEN`) unless something was left, else it waits for the old name's lease
    /// as [`Producer::reliable`] does.
    pub async fn hand_back_older(
        &self,
        consumer: &str,
    ) -> Result<crate::reliable::Older, ProducerError> {
        use crate::reliable::Older;
        let mut con = self.con.clone();
        let taken = crate::reliable::taken_list(&self.result_queue, consumer, con.is_cluster());
        let left: u64 = redis::cmd("LLEN").arg(&taken).query_async(&mut con).await?;
        if left == 0 {
            return Ok(Older::Nothing);
        }
        match self.reliable(consumer).await {
            Ok(mut older) => {
                let handed = older.hand_back().await;
                older.close().await?;
                Ok(Older::HandedBack(handed?))
            }
            Err(ProducerError::NameInUse { .. }) => Ok(Older::StillRunning),
            Err(e) => Err(e),
        }
    }

    /// A durable consumer (Go's Receive/Renew/Ack) named `name` of this producer's result
    /// list, on this producer's connection: see [`crate::durable_results`].
    pub fn durable_results(
        &self,
        name: &str,
        settings: crate::durable_results::DurableSettings,
    ) -> Result<crate::durable_results::DurableResults, crate::durable_results::DurableResultError>
    {
        crate::durable_results::DurableResults::new(
            self.con.clone(),
            &self.result_queue,
            name,
            settings,
        )
    }
}

/// Pops results destructively (`BRPOP`), as Go consumers do.
#[derive(Debug)]
pub struct Popper {
    con: Link,
    results: String,
    /// Set once a pop got no answer: a later reply on this connection could carry a result
    /// Redis already popped, which nobody would read, so the popper refuses to go on.
    given_up: Option<Duration>,
}

impl Popper {
    /// One result, or `None` after `timeout` without one.
    pub async fn pop(&mut self, timeout: Duration) -> Result<Option<ResultMessage>, ProducerError> {
        self.brpop(timeout)
            .await?
            .map(|raw| parse_result(&raw))
            .transpose()
    }

    /// One result as it was stored, with its parse (or why it does not parse), or `None` after
    /// `timeout`: a popped entry that does not parse is not lost to the caller.
    pub async fn pop_raw(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<TakenResult>, ProducerError> {
        Ok(self.brpop(timeout).await?.map(TakenResult::of))
    }

    async fn brpop(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, ProducerError> {
        if let Some(waited) = self.given_up {
            return Err(ProducerError::NoAnswer { waited });
        }
        let mut brpop = redis::cmd("BRPOP");
        brpop.arg(&self.results).arg(timeout.as_secs_f64());
        let pop = brpop.query_async::<Option<(String, Vec<u8>)>>(&mut self.con);
        match blocking_pop(timeout, pop).await {
            Ok(got) => Ok(got.map(|(_, raw)| raw)),
            Err(ProducerError::NoAnswer { waited }) => {
                self.given_up = Some(waited);
                Err(ProducerError::NoAnswer { waited })
            }
            Err(e) => Err(e),
        }
    }
}

impl TakenResult {
    pub(super) fn of(raw: Vec<u8>) -> TakenResult {
        let result = parse_result(&raw).map_err(|e| e.to_string());
        TakenResult { raw, result }
    }
}
