//! The producer side, as the Go producer does it: `submit` (one MULTI of DEL cancel marker /
//! SET active token PX / ZADD deadline member, then a PUBLISH on the queue's doorbell channel
//! per batch so idle processors wake at once), `cancel` (copy the active token to the cancel
//! marker), and results — Go's destructive `BRPOP`, Go's durable consumer protocol
//! ([`super::durable_results`]), and the older inferq-only reliable mode of [`super::reliable`].

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use redis::{RedisError, Value};

use super::connect;
use super::keys::{active_key, cancel_key, doorbell_channel, fresh_token};
use super::scripts::SCRIPTS;
use super::settings::ReplicaWait;
use super::target::{Link, LinkError, Target, Topology};
use crate::wire::{MemberError, NewRequest, ResultMessage, Routing};

pub use super::reliable::ReliableConsumer;

/// How long a cancel marker lives (Go: seven days).
pub const CANCEL_MARKER_TTL_SECS: u64 = 604_800;

/// Producer errors, with the Go producer's texts where it has them.
#[derive(Debug, thiserror::Error)]
pub enum ProducerError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error(transparent)]
    Connect(#[from] connect::ConnectError),
    #[error(transparent)]
    Link(#[from] LinkError),
    #[error("request ID is required")]
    MissingId,
    #[error("deadline is required and must be a positive Unix timestamp")]
    BadDeadline,
    #[error("deadline has already expired")]
    Expired,
    #[error("request could not be encoded: {0}")]
    Encode(#[from] MemberError),
    #[error("failed to unmarshal result: {0}")]
    BadResult(String),
    #[error("result missing 'id' field")]
    ResultWithoutId,
    #[error("ResultQueueName is required")]
    NoResultQueue,
    #[error(
        "queued on the primary, but {acked} of the {wanted} replicas asked for had it within \
         {timeout:?}: a fail-over now could lose it (submitting it again makes a second \
         generation)"
    )]
    NotReplicated {
        acked: u32,
        wanted: u32,
        timeout: Duration,
    },
    #[error(
        "consumer name {name:?} is in use by another live consumer (its lease was renewed for \
         {waited:?}); give this one another name"
    )]
    NameInUse { name: String, waited: Duration },
    #[error(
        "consumer name {name:?} was taken over by another process (this one could not renew its \
         lease in time): stopped without acknowledging"
    )]
    NameLost { name: String },
    /// A blocking pop got no answer by its own timeout plus [`BLOCKING_GRACE`]: Redis stopped
    /// answering (frozen, `DEBUG SLEEP`, a network path that drops packets). The connection is
    /// given up: a reply arriving later would be one nobody reads.
    #[error("redis: no answer within {waited:?} (Redis is not answering); gave up the connection")]
    NoAnswer { waited: Duration },
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
#[derive(Clone)]
pub struct Producer {
    target: Target,
    con: Link,
    request_queue: String,
    result_queue: String,
    /// Whether to ring the queue's doorbell after submitting (off once Redis refused it).
    doorbell: Arc<AtomicBool>,
    /// Replicas a submission must reach before it is reported accepted.
    replica_wait: Option<ReplicaWait>,
}

/// What `submit` wrote.
#[derive(Debug, Clone)]
pub struct Submitted {
    pub id: String,
    /// The generation's token (also the value of `request-active:<id>`).
    pub request_token: String,
}

/// What `publish_many` sent on the channel (Go's redis-pubsub producer).
#[derive(Debug, Clone)]
pub struct Published {
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
pub struct TakenResult {
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
    async fn replicated(&self, outcomes: &mut [Result<Submitted, ProducerError>]) {
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

    pub fn request_queue(&self) -> &str {
        &self.request_queue
    }

    pub fn result_queue(&self) -> &str {
        &self.result_queue
    }

    fn prepare(
        &self,
        req: NewRequest,
        now_ms: i64,
    ) -> Result<(Vec<u8>, i64, Submitted), ProducerError> {
        if req.id.is_empty() {
            return Err(ProducerError::MissingId);
        }
        if req.deadline <= 0 {
            return Err(ProducerError::BadDeadline);
        }
        let ttl_ms = req.deadline.saturating_mul(1000) - now_ms;
        if ttl_ms <= 0 {
            return Err(ProducerError::Expired);
        }
        let token = fresh_token();
        let routing = Routing {
            request_token: token.clone(),
            request_queue_name: self.request_queue.clone(),
            result_queue_name: self.result_queue.clone(),
            ..Routing::default()
        };
        let id = req.id.clone();
        let member = req.into_envelope(routing)?.encode();
        Ok((
            member,
            ttl_ms,
            Submitted {
                id,
                request_token: token,
            },
        ))
    }

    /// Submits one request: a new generation of its id.
    pub async fn submit(&self, req: NewRequest) -> Result<Submitted, ProducerError> {
        let mut out = self.submit_many(vec![req]).await?;
        match out.pop() {
            Some(r) => r,
            None => Err(ProducerError::MissingId),
        }
    }

    /// Submits many requests in one round trip (one MULTI per request, pipelined).
    /// Each request gets its own outcome; validation errors do not stop the others, and neither
    /// does Redis refusing one request's transaction (`OOM` at `maxmemory`, say: the refused
    /// request is not queued, since Redis discards a transaction with a refused command whole,
    /// and its outcome says why), so a caller knows exactly which to submit again. An outer
    /// error means the replies are unknown.
    pub async fn submit_many(
        &self,
        reqs: Vec<NewRequest>,
    ) -> Result<Vec<Result<Submitted, ProducerError>>, ProducerError> {
        /// Replies per request: MULTI, DEL, SET, ZADD, EXEC.
        const REPLIES: usize = 5;
        if self.con.is_cluster() {
            return self.submit_many_in_steps(reqs).await;
        }
        let now = unix_ms();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut outcomes = Vec::with_capacity(reqs.len());
        for req in reqs {
            let deadline = req.deadline;
            match self.prepare(req, now) {
                Ok((member, ttl_ms, submitted)) => {
                    pipe.cmd("MULTI");
                    pipe.cmd("DEL").arg(cancel_key(&submitted.id));
                    pipe.cmd("SET")
                        .arg(active_key(&submitted.id))
                        .arg(&submitted.request_token)
                        .arg("PX")
                        .arg(ttl_ms);
                    pipe.cmd("ZADD")
                        .arg(&self.request_queue)
                        .arg(deadline)
                        .arg(member);
                    pipe.cmd("EXEC");
                    outcomes.push(Ok(submitted));
                }
                Err(e) => outcomes.push(Err(e)),
            }
        }
        let sent = outcomes.iter().filter(|o| o.is_ok()).count();
        if sent == 0 {
            return Ok(outcomes);
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.con.clone()).await?;
        if replies.len() != sent * REPLIES {
            return Err(ProducerError::Redis(RedisError::from((
                redis::ErrorKind::Client,
                "unexpected number of replies to a submission",
            ))));
        }
        let mut queued = 0;
        let mut each = replies.chunks(REPLIES);
        for outcome in outcomes.iter_mut().filter(|o| o.is_ok()) {
            let Some(replies) = each.next() else { break };
            // The first refusal is the reason (an EXEC after one is only EXECABORT). A command
            // that fails only as it runs (`WRONGTYPE` when the queue name holds another type)
            // is an error inside EXEC's reply, with the commands before it done: the request
            // is not queued either.
            let exec_errors = match replies.last() {
                Some(Value::Array(executed)) => executed.as_slice(),
                _ => &[],
            };
            let refusal = replies.iter().chain(exec_errors).find_map(|v| match v {
                Value::ServerError(e) => Some(e.clone()),
                _ => None,
            });
            match (refusal, replies.last()) {
                (None, Some(Value::Array(_))) => queued += 1,
                (Some(e), _) => *outcome = Err(ProducerError::Redis(e.into())),
                (None, _) => {
                    *outcome = Err(ProducerError::Redis(RedisError::from((
                        redis::ErrorKind::Client,
                        "the submission's transaction was not executed",
                    ))))
                }
            }
        }
        if queued > 0 {
            self.replicated(&mut outcomes).await;
            self.ring().await;
        }
        Ok(outcomes)
    }

    /// [`Producer::submit_many`] on a Redis Cluster, where the markers and the queue live in
    /// different slots and no transaction can hold them all: each request's `DEL
    /// request-cancel:<id>` and `SET request-active:<id>` first (one command each, all at once),
    /// then one pipeline of `ZADD`s to the queue's slot for those whose markers were written.
    /// A request is queued only after its marker, so a cancel always finds what it cancels.
    async fn submit_many_in_steps(
        &self,
        reqs: Vec<NewRequest>,
    ) -> Result<Vec<Result<Submitted, ProducerError>>, ProducerError> {
        let now = unix_ms();
        let mut outcomes = Vec::with_capacity(reqs.len());
        let mut ready = Vec::new();
        for req in reqs {
            let deadline = req.deadline;
            match self.prepare(req, now) {
                Ok((member, ttl_ms, submitted)) => {
                    ready.push((outcomes.len(), deadline, member, ttl_ms));
                    outcomes.push(Ok(submitted));
                }
                Err(e) => outcomes.push(Err(e)),
            }
        }
        let marks = ready.iter().map(|(at, _, _, ttl_ms)| {
            let mut con = self.con.clone();
            let (id, token) = match &outcomes[*at] {
                Ok(s) => (s.id.clone(), s.request_token.clone()),
                Err(_) => (String::new(), String::new()),
            };
            let ttl_ms = *ttl_ms;
            async move {
                let _: i64 = redis::cmd("DEL")
                    .arg(cancel_key(&id))
                    .query_async(&mut con)
                    .await?;
                redis::cmd("SET")
                    .arg(active_key(&id))
                    .arg(token)
                    .arg("PX")
                    .arg(ttl_ms)
                    .query_async::<()>(&mut con)
                    .await
            }
        });
        let marked = join_all(marks).await;
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        let mut queued_at = Vec::new();
        for ((at, deadline, member, _), mark) in ready.iter().zip(marked) {
            match mark {
                Ok(()) => {
                    pipe.cmd("ZADD")
                        .arg(&self.request_queue)
                        .arg(*deadline)
                        .arg(member);
                    queued_at.push(*at);
                }
                Err(e) => outcomes[*at] = Err(ProducerError::Redis(e)),
            }
        }
        if queued_at.is_empty() {
            return Ok(outcomes);
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.con.clone()).await?;
        let mut queued = 0;
        for (at, reply) in queued_at.into_iter().zip(replies) {
            match reply {
                Value::ServerError(e) => outcomes[at] = Err(ProducerError::Redis(e.into())),
                _ => queued += 1,
            }
        }
        if queued > 0 {
            self.replicated(&mut outcomes).await;
            self.ring().await;
        }
        Ok(outcomes)
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
        let keys = super::QueueKeys::for_layout(&self.request_queue, self.con.is_cluster());
        let mut pipe = redis::pipe();
        let mut outcomes = Vec::with_capacity(reqs.len());
        for req in reqs {
            match self.prepare(req, now) {
                Ok((member, _, submitted)) => {
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
    async fn ring(&self) {
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
        self.reliable_waiting(consumer, super::reliable::NAME_PATIENCE)
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
    /// [`super::reliable`]) took and never acknowledged, so an upgrade strands nothing: nothing
    /// to do (one `LLEN`) unless something was left, else it waits for the old name's lease
    /// as [`Producer::reliable`] does.
    pub async fn hand_back_older(
        &self,
        consumer: &str,
    ) -> Result<super::reliable::Older, ProducerError> {
        use super::reliable::Older;
        let mut con = self.con.clone();
        let taken = super::reliable::taken_list(&self.result_queue, consumer, con.is_cluster());
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
    /// list, on this producer's connection: see [`super::durable_results`].
    pub fn durable_results(
        &self,
        name: &str,
        settings: super::durable_results::DurableSettings,
    ) -> Result<super::durable_results::DurableResults, super::durable_results::DurableResultError>
    {
        super::durable_results::DurableResults::new(
            self.con.clone(),
            &self.result_queue,
            name,
            settings,
        )
    }
}

/// Pops results destructively (`BRPOP`), as Go consumers do.
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
