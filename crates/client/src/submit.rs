//! `submit`, as the newest Go producer enqueues: each request is numbered among requests of its
//! queue with the same deadline (`request-seq:<queue>:<deadline>`, so equal deadlines are served
//! first in, first out) and queued at the score `deadline + seq / 2^21`, its cancel marker
//! cleared and its active marker set, all in one script call (`submit-5.lua`); a body stored
//! apart (payload keys) is written in the same call. On a Redis Cluster the markers and the body
//! live in other slots: they are written first, one command each, and `enqueue-2.lua` then
//! numbers and queues the member in the queue's slot, so a member never names a body or marker
//! that is not there.
//!
//! In: [`NewRequest`]s. Out: one outcome per request ([`Submitted`] with its token and number,
//! or why it was not queued), then the doorbell rung.

use futures::future::join_all;
use redis::{ErrorKind, RedisError, ServerErrorKind, Value};
use serde_json::value::RawValue;

use crate::keys::PAYLOAD_GRACE_MS;
use crate::keys::{active_key, cancel_key, fresh_token, payload_key, seq_key};
use crate::producer::{unix_ms, Producer, ProducerError, Submitted};
use crate::scripts::{Script, SCRIPTS};
use crate::wire::{NewRequest, Routing};

/// Which request bodies a producer stores apart from their members (newer Go's
/// `WithPayloadKeys`): a member then carries `internal.payload_ref` and a `null` payload, and
/// the body lives at `request-payload:<id>:<request_token>` until ten minutes past the
/// deadline. Only for processors that read payload keys (inferq, newer Go): an older one sends
/// a `null` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum PayloadKeys {
    /// Every body inline (Go's default).
    #[default]
    Inline,
    /// Every body apart.
    Always,
    /// Bodies of more than this many bytes apart, the others inline.
    Above(usize),
}

impl PayloadKeys {
    fn apart(self, body: &RawValue) -> bool {
        match self {
            PayloadKeys::Inline => false,
            PayloadKeys::Always => true,
            PayloadKeys::Above(n) => body.get().len() > n,
        }
    }
}

/// What a request is prepared for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Prepare {
    /// The durable queue: numbered by the enqueue script, body apart when asked.
    Queue,
    /// Go's redis-pubsub: the member as it is published, body inline, unnumbered.
    Publish,
}

/// A request ready to be written.
pub(super) struct Prepared {
    pub member: Vec<u8>,
    pub deadline: i64,
    /// Milliseconds the active marker lives (until the deadline).
    pub ttl_ms: i64,
    /// The body to store apart, at `submitted`'s payload key.
    pub body: Option<Box<RawValue>>,
    pub submitted: Submitted,
}

impl Prepared {
    fn payload_key(&self) -> String {
        payload_key(&self.submitted.id, &self.submitted.request_token)
    }
}

impl Producer {
    /// Stores request bodies apart from their members as `keys` says (see [`PayloadKeys`]).
    pub fn with_payload_keys(mut self, keys: PayloadKeys) -> Producer {
        self.payload_keys = keys;
        self
    }

    pub(super) fn prepare(
        &self,
        mut req: NewRequest,
        now_ms: i64,
        what: Prepare,
    ) -> Result<Prepared, ProducerError> {
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
        let mut routing = Routing {
            request_token: token.clone(),
            request_queue_name: self.request_queue.clone(),
            result_queue_name: self.result_queue.clone(),
            ..Routing::default()
        };
        let mut body = None;
        if what == Prepare::Queue {
            // The enqueue script puts the number in place of this placeholder, as Go's does.
            routing.enqueue_seq = -1;
            if self.payload_keys.apart(&req.payload) {
                routing.payload_ref = payload_key(&req.id, &token);
                body = Some(std::mem::replace(
                    &mut req.payload,
                    RawValue::NULL.to_owned(),
                ));
            }
        }
        let id = req.id.clone();
        let deadline = req.deadline;
        let member = req.into_envelope(routing)?.encode();
        Ok(Prepared {
            member,
            deadline,
            ttl_ms,
            body,
            submitted: Submitted {
                id,
                request_token: token,
                enqueue_seq: 0,
            },
        })
    }

    /// Submits one request: a new generation of its id.
    pub async fn submit(&self, req: NewRequest) -> Result<Submitted, ProducerError> {
        let mut out = self.submit_many(vec![req]).await?;
        match out.pop() {
            Some(r) => r,
            None => Err(ProducerError::MissingId),
        }
    }

    /// Submits many requests in one round trip (one script call each, pipelined). Each
    /// request gets its own outcome; validation errors do not stop the others, and neither does
    /// Redis refusing one request (`OOM` at `maxmemory`, say: the script then wrote nothing of
    /// it, and its outcome says why), so a caller knows exactly which to submit again. An outer
    /// error means the replies are unknown.
    pub async fn submit_many(
        &self,
        reqs: Vec<NewRequest>,
    ) -> Result<Vec<Result<Submitted, ProducerError>>, ProducerError> {
        let now = unix_ms();
        let mut outcomes = Vec::with_capacity(reqs.len());
        let mut ready = Vec::new();
        for req in reqs {
            match self.prepare(req, now, Prepare::Queue) {
                Ok(p) => {
                    ready.push((outcomes.len(), p));
                    outcomes.push(Err(ProducerError::MissingId));
                }
                Err(e) => outcomes.push(Err(e)),
            }
        }
        if self.con.is_cluster() {
            ready = self.write_apart(ready, &mut outcomes).await;
        }
        if ready.is_empty() {
            return Ok(outcomes);
        }
        let mut queued = 0;
        let mut left = ready;
        for attempt in 0..2 {
            let replies = self.enqueue(&left).await?;
            let mut unloaded = Vec::new();
            for ((at, p), reply) in left.into_iter().zip(replies) {
                match reply {
                    Value::Int(seq) => {
                        let mut submitted = p.submitted;
                        submitted.enqueue_seq = seq;
                        outcomes[at] = Ok(submitted);
                        queued += 1;
                    }
                    // The script was not loaded (a restart, a fail-over): nothing of it ran.
                    Value::ServerError(e)
                        if attempt == 0 && e.kind() == Some(ServerErrorKind::NoScript) =>
                    {
                        unloaded.push((at, p));
                    }
                    Value::ServerError(e) => outcomes[at] = Err(ProducerError::Redis(e.into())),
                    other => {
                        outcomes[at] = Err(ProducerError::Redis(RedisError::from((
                            ErrorKind::Client,
                            "unexpected reply to a submission",
                            format!("{other:?}"),
                        ))))
                    }
                }
            }
            if unloaded.is_empty() {
                break;
            }
            self.script().load(&mut self.con.clone()).await?;
            left = unloaded;
        }
        if queued > 0 {
            self.replicated(&mut outcomes).await;
            self.ring().await;
        }
        Ok(outcomes)
    }

    fn script(&self) -> &'static Script {
        if self.con.is_cluster() {
            &SCRIPTS.enqueue
        } else {
            &SCRIPTS.submit
        }
    }

    /// One pipelined script call per request; one reply each (errors included).
    async fn enqueue(&self, ready: &[(usize, Prepared)]) -> Result<Vec<Value>, ProducerError> {
        let cluster = self.con.is_cluster();
        let script = self.script();
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        for (_, p) in ready {
            let seq = seq_key(&self.request_queue, p.deadline, cluster);
            let deadline = p.deadline.to_string();
            if cluster {
                pipe.add_command(script.cmd(
                    &[seq.as_str(), self.request_queue.as_str()],
                    &[p.member.as_slice(), deadline.as_bytes()],
                ));
                continue;
            }
            let id = &p.submitted.id;
            let ttl = p.ttl_ms.to_string();
            let mut keys = vec![
                seq,
                cancel_key(id),
                active_key(id),
                self.request_queue.clone(),
            ];
            let mut args: Vec<&[u8]> = vec![
                &p.member,
                deadline.as_bytes(),
                p.submitted.request_token.as_bytes(),
                ttl.as_bytes(),
            ];
            let body_ttl = (p.ttl_ms + PAYLOAD_GRACE_MS).to_string();
            if let Some(body) = &p.body {
                keys.push(p.payload_key());
                args.push(body.get().as_bytes());
                args.push(body_ttl.as_bytes());
            }
            pipe.add_command(script.cmd(&keys, &args));
        }
        let replies: Vec<Value> = pipe.query_async(&mut self.con.clone()).await?;
        if replies.len() != ready.len() {
            return Err(ProducerError::Redis(RedisError::from((
                ErrorKind::Client,
                "unexpected number of replies to a submission",
            ))));
        }
        Ok(replies)
    }

    /// On a Redis Cluster, where each request's markers and body live in other slots than the
    /// queue: `DEL request-cancel:<id>`, `SET request-active:<id>` and the body's `SET`, one
    /// command each and all at once. The requests whose writes all succeeded are returned, to
    /// be queued; the others get the error. A request is queued only after its marker and body,
    /// so a cancel always finds what it cancels and a processor always finds the body.
    async fn write_apart(
        &self,
        ready: Vec<(usize, Prepared)>,
        outcomes: &mut [Result<Submitted, ProducerError>],
    ) -> Vec<(usize, Prepared)> {
        let writes = ready.iter().map(|(_, p)| {
            let mut con = self.con.clone();
            let id = p.submitted.id.clone();
            let token = p.submitted.request_token.clone();
            let ttl_ms = p.ttl_ms;
            let body = p
                .body
                .as_ref()
                .map(|b| (p.payload_key(), b.get().to_owned()));
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
                    .await?;
                if let Some((key, body)) = body {
                    redis::cmd("SET")
                        .arg(key)
                        .arg(body)
                        .arg("PX")
                        .arg(ttl_ms + PAYLOAD_GRACE_MS)
                        .query_async::<()>(&mut con)
                        .await?;
                }
                Ok::<(), RedisError>(())
            }
        });
        let written = join_all(writes).await;
        let mut out = Vec::with_capacity(ready.len());
        for ((at, p), done) in ready.into_iter().zip(written) {
            match done {
                Ok(()) => out.push((at, p)),
                Err(e) => outcomes[at] = Err(ProducerError::Redis(e)),
            }
        }
        out
    }
}
