//! A front-door request's life in Redis: [`open`] records it (or finds the one its
//! `Idempotency-Key` names) with `create-2.lua` and submits it with the producer of its queue,
//! as a Go-format request whose result route is the front door's result list; [`read`] gives
//! its record and result to its tenant; [`cancel`] ends it. The waiting is in
//! [`super::waiters`], the filing of results in [`super::collect`].

use std::collections::BTreeMap;

use inferq_client::keys::{claim_key, QueueKeys};
use inferq_client::producer::{unix_ms, ProducerError};
use inferq_client::wire::{ErrorCode, NewRequest, ResultMessage};
use redis::AsyncCommands;

use super::inbound::Inbound;
use super::keys;
use super::scripts::SCRIPTS;
use crate::error::ApiError;
use crate::state::App;

/// How old a request recorded but never marked submitted must be before a call with its
/// `Idempotency-Key` submits it again (the replica that recorded it died before submitting).
pub const RESUBMIT_AFTER_MS: i64 = 10_000;

/// A request's id: `req_` and 24 lowercase letters and digits.
pub fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let suffix: String = (0..24)
        .map(|_| char::from(ALPHABET[rand::random_range(0..ALPHABET.len())]))
        .collect();
    format!("req_{suffix}")
}

/// Whether `id` has the shape of a request id this server makes.
pub fn is_id(id: &str) -> bool {
    id.strip_prefix("req_").is_some_and(|s| {
        !s.is_empty()
            && s.len() <= 64
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
    })
}

/// How a request ended.
#[derive(Debug, Clone)]
pub struct Ended {
    /// The HTTP status of the answer (`"200"`), or inferq's error code (`"CANCELLED"`).
    pub code: String,
    pub ended_at: i64,
    /// The result, or `None` once the retention has dropped it.
    pub result: Option<ResultMessage>,
}

/// A request's record, as its tenant reads it.
#[derive(Debug, Clone)]
pub struct Record {
    pub id: String,
    pub queue: String,
    pub endpoint: String,
    pub created_at: i64,
    /// The deadline, Unix seconds (also the queue score).
    pub expires_at: i64,
    /// The deadline, Unix ms (what wait mode answers 504 at).
    pub deadline_ms: i64,
    /// The request token of the submitted generation, once submitted.
    pub token: Option<String>,
    pub ended: Option<Ended>,
}

/// What [`open`] did.
#[derive(Debug)]
pub struct Opened {
    pub id: String,
    /// Made by this call (not found by its `Idempotency-Key`).
    pub created: bool,
    /// The record as this call wrote it, when it made it (no need to read it back).
    pub record: Option<Record>,
}

fn num(fields: &BTreeMap<String, String>, name: &str) -> i64 {
    fields.get(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The record of `id` if it belongs to `tenant`; `None` for an unknown id, an id of another
/// shape, or another tenant's (all alike, so ids cannot be probed).
pub async fn read(app: &App, tenant: &str, id: &str) -> Result<Option<Record>, ApiError> {
    if !is_id(id) {
        return Ok(None);
    }
    let mut con = app.redis.clone();
    let (fields, raw): (BTreeMap<String, String>, Option<Vec<u8>>) = redis::pipe()
        .hgetall(keys::request(id))
        .get(keys::result(id))
        .query_async(&mut con)
        .await?;
    if fields.get("tenant").map(String::as_str) != Some(tenant) {
        return Ok(None);
    }
    let ended = (fields.get("status").map(String::as_str) == Some("ended")).then(|| Ended {
        code: fields.get("code").cloned().unwrap_or_default(),
        ended_at: num(&fields, "ended_at"),
        result: raw.and_then(|r| serde_json::from_slice(&r).ok()),
    });
    Ok(Some(Record {
        id: id.to_owned(),
        queue: fields.get("queue").cloned().unwrap_or_default(),
        endpoint: fields.get("endpoint").cloned().unwrap_or_default(),
        created_at: num(&fields, "created_at"),
        expires_at: num(&fields, "expires_at"),
        deadline_ms: num(&fields, "deadline_ms"),
        token: fields.get("submitted").cloned(),
        ended,
    }))
}

/// Whether a processor holds the request's generation now (its claim exists).
pub async fn in_flight(app: &App, record: &Record) -> Result<bool, ApiError> {
    let Some(token) = &record.token else {
        return Ok(false);
    };
    let mut con = app.redis.clone();
    let queue_keys = QueueKeys::for_layout(&record.queue, con.is_cluster());
    Ok(con
        .hexists(queue_keys.claimed, claim_key(&record.id, token, b""))
        .await?)
}

/// Records the request (or finds the one its key names) and submits it.
pub async fn open(app: &App, tenant: &str, inbound: &Inbound) -> Result<Opened, ApiError> {
    let front = &app.front;
    let now_ms = unix_ms();
    let timeout_ms = i64::try_from(inbound.timeout.as_millis()).unwrap_or(i64::MAX / 4);
    let deadline_ms = now_ms.saturating_add(timeout_ms);
    let expires_at = (deadline_ms + 999) / 1000;
    let retention = front.retention_secs();
    let to_deadline = (expires_at - now_ms / 1000).max(1);
    let id = new_id();
    let mut keys_ = vec![keys::request(&id)];
    if let Some(k) = &inbound.idempotency_key {
        keys_.push(keys::idempotency(tenant, k));
    }
    let mut args: Vec<String> = vec![
        id.clone(),
        inbound.digest.clone(),
        (to_deadline + front.record_ttl_secs()).to_string(),
        (to_deadline + retention).to_string(),
        now_ms.to_string(),
        RESUBMIT_AFTER_MS.to_string(),
        crate::keys::PREFIX.to_owned(),
    ];
    for (k, v) in [
        ("tenant", tenant.to_owned()),
        ("queue", inbound.queue.clone()),
        ("endpoint", inbound.endpoint.path().to_owned()),
        ("created_at", (now_ms / 1000).to_string()),
        ("expires_at", expires_at.to_string()),
        ("deadline_ms", deadline_ms.to_string()),
        ("model", inbound.model.clone()),
    ] {
        args.push(k.to_owned());
        args.push(v);
    }
    let script = &SCRIPTS.create;
    let mut con = app.redis.clone();
    let (outcome, found): (String, String) =
        redis::from_redis_value(script.run(&mut con, &script.cmd(&keys_, &args)).await?)?;
    match outcome.as_str() {
        "conflict" => Err(ApiError::conflict(format!(
            "Idempotency-Key {:?} was used with another request body (request {found}); use a \
             new key for a new request",
            inbound.idempotency_key.as_deref().unwrap_or_default()
        ))
        .with_code("idempotency_key_reused")),
        "existing" => Ok(Opened {
            id: found,
            created: false,
            record: None,
        }),
        "resubmit" => {
            let record = read(app, tenant, &found).await?;
            let (created, deadline) = record
                .map(|r| (r.created_at, r.expires_at))
                .unwrap_or((now_ms / 1000, expires_at));
            submit(app, &found, inbound, created, deadline)
                .await
                .map_err(ApiError::from)?;
            Ok(Opened {
                id: found,
                created: false,
                record: None,
            })
        }
        _ => {
            if let Some(wait) = front.settings.replica_wait {
                // The record must survive a fail-over as the submission does.
                let _ = con.wait_replicas(&keys_[0], wait).await;
            }
            if let Err(e) = submit(app, &id, inbound, now_ms / 1000, expires_at).await {
                if !e.queued() {
                    let forget = &SCRIPTS.forget;
                    let undone = forget
                        .run(&mut con, &forget.cmd(&keys_, &[id.as_str()]))
                        .await;
                    if let Err(u) = undone {
                        tracing::warn!(request = %id, error = %u, "cannot undo a request whose submission failed");
                    }
                }
                return Err(e.into());
            }
            let record = Record {
                id: id.clone(),
                queue: inbound.queue.clone(),
                endpoint: inbound.endpoint.path().to_owned(),
                created_at: now_ms / 1000,
                expires_at,
                deadline_ms,
                token: None,
                ended: None,
            };
            Ok(Opened {
                id,
                created: true,
                record: Some(record),
            })
        }
    }
}

/// Why a submission failed.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    #[error("no producer for queue {0:?}")]
    NoProducer(String),
    #[error("submitting the request: {0}")]
    Producer(#[from] ProducerError),
}

impl SubmitError {
    /// Whether the request is queued all the same (only its replication was not confirmed in
    /// time), so its record must stay.
    fn queued(&self) -> bool {
        matches!(
            self,
            SubmitError::Producer(ProducerError::NotReplicated { .. })
        )
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> ApiError {
        match e {
            SubmitError::Producer(ProducerError::Expired) => {
                ApiError::invalid("the deadline has already passed", Some("timeout"))
            }
            SubmitError::NoProducer(_) => {
                ApiError::invalid(e.to_string(), Some("x-llm-d-async-queue"))
            }
            other => ApiError::unavailable(&other),
        }
    }
}

/// Submits one generation of `id` and marks the record submitted.
async fn submit(
    app: &App,
    id: &str,
    inbound: &Inbound,
    created: i64,
    deadline: i64,
) -> Result<(), SubmitError> {
    let Some(producer) = app.front.producers.get(&inbound.queue) else {
        return Err(SubmitError::NoProducer(inbound.queue.clone()));
    };
    let mut metadata = BTreeMap::new();
    metadata.insert("front_door".to_owned(), "1".to_owned());
    let req = NewRequest::new(id.to_owned(), deadline, inbound.payload.clone())
        .with_created(created)
        .with_metadata(metadata)
        .with_endpoint(inbound.endpoint.path().to_owned())
        .with_model(inbound.model.clone());
    let submitted = producer.submit(req).await?;
    // The mark is not waited for: the request is queued whatever becomes of it. Without it
    // (a replica that dies first, Redis failing) a retry with the key after RESUBMIT_AFTER_MS
    // submits a second generation, whose result collect-1.lua drops if the first's came.
    let mut con = app.redis.clone();
    let (key, token, id) = (
        keys::request(id),
        submitted.request_token.clone(),
        id.to_owned(),
    );
    tokio::spawn(async move {
        let marked: Result<(), redis::RedisError> = con.hset(key, "submitted", token).await;
        if let Err(e) = marked {
            tracing::warn!(request = %id, error = %e, "cannot mark a request submitted");
        }
    });
    Ok(())
}

/// What a cancel found.
#[derive(Debug)]
pub enum Cancel {
    /// Ended `cancelled` now.
    Cancelled(Record),
    /// It had ended already (its ending stays).
    Ended(Record),
    NotFound,
}

/// Cancels `id` for `tenant`: the processors' cancel marker first (so a processor that holds
/// it stops), then the record ends `cancelled` and its waiters wake.
pub async fn cancel(app: &App, tenant: &str, id: &str) -> Result<Cancel, ApiError> {
    let Some(record) = read(app, tenant, id).await? else {
        return Ok(Cancel::NotFound);
    };
    if record.ended.is_some() {
        return Ok(Cancel::Ended(record));
    }
    if let Some(producer) = app.front.producers.values().next() {
        producer
            .cancel(&[id.to_owned()])
            .await
            .map_err(|e| ApiError::unavailable(&e))?;
    }
    let mut result = ResultMessage::error(id, ErrorCode::Cancelled, "cancelled by the client");
    if let Some(t) = &record.token {
        result.request_token = t.clone();
    }
    let script = &SCRIPTS.cancel;
    let front = &app.front;
    let mut con = app.redis.clone();
    let answer: i64 = redis::from_redis_value(
        script
            .run(
                &mut con,
                &script.cmd(
                    &[keys::request(id), keys::result(id)],
                    &[
                        tenant.to_owned(),
                        result.to_json(),
                        front.retention_secs().to_string(),
                        front.record_ttl_secs().to_string(),
                        keys::done_channel(),
                        id.to_owned(),
                        (unix_ms() / 1000).to_string(),
                    ],
                ),
            )
            .await?,
    )?;
    let record = read(app, tenant, id).await?;
    Ok(match (answer, record) {
        (1, Some(r)) => Cancel::Cancelled(r),
        (_, Some(r)) => Cancel::Ended(r),
        (_, None) => Cancel::NotFound,
    })
}
