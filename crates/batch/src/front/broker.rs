//! A queued request's life in the router's Redis layout ([`super::keys`]): [`submit`] writes
//! it as the Go producer v0.9.0 does (one MULTI: clear the cancel marker, set the active marker
//! until the deadline, add the member at the deadline), after `join-1.lua` decided whether a
//! client-chosen id is new or joins the request already under it; [`lookup`] reads it as the
//! step reads it; [`delivered`], [`cancel`] and [`forget`] end it.
//!
//! On a Redis Cluster the router's keys carry no hash tag and fall in different slots, so no
//! MULTI can hold them: the three writes go one at a time, markers first and the member last, so
//! a processor never takes a member whose marker is missing (what inferq's own producer does
//! there too).

use std::time::Duration;

use inferq_client::keys::{doorbell_channel, fresh_token};
use inferq_client::producer::unix_ms;
use inferq_client::wire::ResultMessage;
use redis::AsyncCommands;

use super::inbound::Queued;
use super::keys;
use super::member::Member;
use super::scripts::SCRIPTS;
use crate::error::ApiError;
use crate::state::App;

/// How long after a join key was written its request must show in Redis (marker or result)
/// before a repeat of its id takes its place: the replica that wrote it died (or lost Redis)
/// before submitting, or the request was fetched through the router's step.
pub const TAKE_OVER_AFTER_MS: i64 = 3_000;
/// How long a join key outlives its request's deadline: about as long as a result is kept.
pub const JOIN_TTL_PAST_DEADLINE_SECS: i64 = 24 * 3600;

/// What [`submit`] did.
#[derive(Debug)]
pub struct Submitted {
    /// Written now by this call (not joined).
    pub created: bool,
    /// The Unix time of the deadline.
    pub deadline: i64,
}

/// Where a request stands, as the step's fetch reads it.
#[derive(Debug)]
pub enum State {
    /// Its result (the newest in its mailbox).
    Ready(ResultMessage),
    /// Its active marker exists: queued or in flight.
    Pending,
    /// Neither: never submitted, expired, deleted, or another tenant's.
    Unknown,
}

fn enqueue_failed(e: &dyn std::fmt::Display) -> ApiError {
    tracing::warn!(error = %e, "front door: cannot enqueue a request");
    ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        message: format!("failed to enqueue request: {e}"),
        kind: "api_error",
        param: None,
        code: Some("ENQUEUE_FAILED".to_owned()),
    }
}

/// The request's state: the active marker first, then the mailbox, so a result pushed (and
/// its marker cleared) between the two reads is still seen.
pub async fn lookup(app: &App, tenant: &str, id: &str) -> Result<State, redis::RedisError> {
    let mut con = app.redis.clone();
    let (active, newest): (bool, Vec<Vec<u8>>) = if con.is_cluster() {
        let active: bool = con.exists(keys::active(tenant, id)).await?;
        let newest: Vec<Vec<u8>> = con.lrange(keys::mailbox(tenant, id), 0, 0).await?;
        (active, newest)
    } else {
        redis::pipe()
            .exists(keys::active(tenant, id))
            .lrange(keys::mailbox(tenant, id), 0, 0)
            .query_async(&mut con)
            .await?
    };
    if let Some(raw) = newest.first() {
        return Ok(match serde_json::from_slice::<ResultMessage>(raw) {
            Ok(r) => State::Ready(r),
            // Not a result: answered as the processor's failure, in the error envelope.
            Err(e) => State::Ready(ResultMessage::error(
                &keys::envelope(tenant, id),
                inferq_client::wire::ErrorCode::InferenceError,
                &format!("the stored result is not a result message: {e}"),
            )),
        });
    }
    Ok(if active {
        State::Pending
    } else {
        State::Unknown
    })
}

/// Whether a joined generation still stands: its result is there, or it is pending and not
/// cancelled.
async fn stands(app: &App, q: &Queued, token: &str) -> Result<bool, redis::RedisError> {
    let mut con = app.redis.clone();
    let cancelled: Option<String> = con.get(keys::cancel(&q.tenant, &q.id)).await?;
    Ok(match lookup(app, &q.tenant, &q.id).await? {
        State::Ready(_) => true,
        State::Pending => cancelled.as_deref() != Some(token),
        State::Unknown => false,
    })
}

/// Queues `q` (or joins the request its id names), as the step enqueues.
pub async fn submit(app: &App, q: &Queued) -> Result<Submitted, ApiError> {
    let now_ms = unix_ms();
    let deadline = now_ms / 1000 + q.timeout_secs;
    if !q.chosen {
        write(app, q, &fresh_token(), now_ms, deadline).await?;
        return Ok(Submitted {
            created: true,
            deadline,
        });
    }
    let join = keys::join(&q.tenant, &q.id);
    let ttl = (q.timeout_secs + JOIN_TTL_PAST_DEADLINE_SECS).to_string();
    let mut replace = String::new();
    for _ in 0..4 {
        let token = fresh_token();
        let script = &SCRIPTS.join;
        let mut con = app.redis.clone();
        let cmd = script.cmd(
            &[join.as_str()],
            &[&q.digest, &token, &now_ms.to_string(), &ttl, &replace],
        );
        let (outcome, held, at): (String, String, i64) = redis::from_redis_value(
            script
                .run(&mut con, &cmd)
                .await
                .map_err(|e| enqueue_failed(&e))?,
        )
        .map_err(|e| enqueue_failed(&e))?;
        if outcome == "created" {
            if let Err(e) = write(app, q, &token, now_ms, deadline).await {
                forget(app, &q.tenant, &q.id, &token).await;
                return Err(e);
            }
            return Ok(Submitted {
                created: true,
                deadline,
            });
        }
        if stands(app, q, &held).await? {
            if outcome == "conflict" {
                return Err(ApiError::conflict(format!(
                    "request id {:?} is in use by another request body (pending or not yet \
                     fetched); use a new id for a new request",
                    q.id
                ))
                .with_code("REQUEST_ID_CONFLICT"));
            }
            app.metrics.front_joined.inc();
            return Ok(Submitted {
                created: false,
                deadline,
            });
        }
        // Nothing of that generation shows: give its writer the time a submission takes, then
        // take its place.
        let age = unix_ms().saturating_sub(at);
        if age < TAKE_OVER_AFTER_MS {
            let left = u64::try_from(TAKE_OVER_AFTER_MS - age).unwrap_or(0);
            tokio::time::sleep(Duration::from_millis(left)).await;
            if stands(app, q, &held).await? {
                continue;
            }
        }
        replace = held;
    }
    Err(enqueue_failed(&"the request id kept changing hands; retry"))
}

/// Writes one generation: the router's MULTI (one command at a time on a Cluster), then rings
/// the queue's doorbell so idle inferq processors take it at once (a PUBLISH, which Go ignores).
async fn write(
    app: &App,
    q: &Queued,
    token: &str,
    now_ms: i64,
    deadline: i64,
) -> Result<(), ApiError> {
    let ttl_ms = deadline.saturating_mul(1000) - now_ms;
    if ttl_ms <= 0 {
        return Err(ApiError::invalid("the deadline has already passed", None));
    }
    let front = &app.front;
    let (queue, _) = front.settings.broker.route(&q.model, &q.tenant);
    let envelope = keys::envelope(&q.tenant, &q.id);
    let mailbox = keys::mailbox(&q.tenant, &q.id);
    let member = Member {
        envelope_id: &envelope,
        token,
        queue,
        mailbox: &mailbox,
        created: now_ms / 1000,
        deadline,
        payload: &q.payload,
        metadata: &q.metadata,
        headers: &q.headers,
        endpoint: q.endpoint.path(),
    }
    .encode();
    let mut con = app.redis.clone();
    let (cancel, active) = (
        keys::cancel(&q.tenant, &q.id),
        keys::active(&q.tenant, &q.id),
    );
    let written: Result<(), redis::RedisError> = if con.is_cluster() {
        async {
            let _: () = con.del(&cancel).await?;
            let _: () = redis::cmd("SET")
                .arg(&active)
                .arg(token)
                .arg("PX")
                .arg(ttl_ms)
                .query_async(&mut con)
                .await?;
            let _: () = con.zadd(queue, &member, deadline).await?;
            Ok(())
        }
        .await
    } else {
        redis::pipe()
            .atomic()
            .del(&cancel)
            .ignore()
            .cmd("SET")
            .arg(&active)
            .arg(token)
            .arg("PX")
            .arg(ttl_ms)
            .ignore()
            .zadd(queue, &member, deadline)
            .ignore()
            .query_async(&mut con)
            .await
    };
    if let Err(e) = written {
        if con.is_cluster() {
            forget_marker(app, &active, token).await;
        }
        return Err(enqueue_failed(&e));
    }
    if let Some(wait) = front.settings.replica_wait {
        match con.wait_replicas(queue, wait).await {
            Ok(acked) if acked >= wait.replicas => {}
            Ok(acked) => tracing::warn!(acked, wanted = wait.replicas, queue, "front door: a request is queued on the primary but not yet on the replicas asked for"),
            Err(e) => tracing::warn!(error = %e, "front door: WAIT for replicas failed"),
        }
    }
    let rung: Result<(), redis::RedisError> = con.publish(doorbell_channel(queue), "1").await;
    if let Err(e) = rung {
        tracing::debug!(error = %e, "front door: cannot ring the queue's doorbell");
    }
    Ok(())
}

/// Clears an active marker this replica set when the rest of its submission failed (Cluster).
async fn forget_marker(app: &App, active: &str, token: &str) {
    let mut con = app.redis.clone();
    let held: Result<Option<String>, _> = con.get(active).await;
    if let Ok(Some(t)) = held {
        if t == token {
            let _: Result<(), _> = con.del(active).await;
        }
    }
}

/// Removes the join key of generation `token` (its submission failed).
pub async fn forget(app: &App, tenant: &str, id: &str, token: &str) {
    let script = &SCRIPTS.unjoin;
    let mut con = app.redis.clone();
    let key = keys::join(tenant, id);
    let cmd = script.cmd(&[key.as_str()], &[token]);
    if let Err(e) = script.run(&mut con, &cmd).await {
        tracing::warn!(error = %e, "front door: cannot remove a join key");
    }
}

/// After a result was answered: the mailbox is deleted (`delete`), or its TTL shrinks to the
/// fetch grace (deleted when that is 0). While it lasts, a repeat of the id joins it and gets
/// the same answer (a client that lost the answer, an SDK retrying a 504); after, the id is free.
pub async fn delivered(app: &App, tenant: &str, id: &str, delete: bool) {
    let grace = app.front.settings.broker.fetch_grace();
    let mut con = app.redis.clone();
    let mailbox = keys::mailbox(tenant, id);
    let done: Result<(), redis::RedisError> = if delete || grace <= 0 {
        con.del(&mailbox).await
    } else {
        con.expire(&mailbox, grace).await
    };
    if let Err(e) = done {
        tracing::info!(request = %id, error = %e, "front door: cannot shrink a delivered result's TTL");
    }
}

/// Cancels the pending generation of `id` (the producer's `CancelRequests`: its active token is
/// copied to the cancel marker), which inferq processors honour before dispatch and in flight;
/// whether there was one.
pub async fn cancel(app: &App, tenant: &str, id: &str) -> Result<bool, ApiError> {
    let marked = app
        .producer
        .cancel(&[keys::envelope(tenant, id)])
        .await
        .map_err(|e| ApiError::unavailable(&e))?;
    Ok(marked.first().copied().unwrap_or(false))
}

/// `DELETE /v1/requests/{id}`: cancels a pending request, deletes the mailbox and the join key.
pub async fn delete(app: &App, tenant: &str, id: &str) -> Result<(), ApiError> {
    cancel(app, tenant, id).await?;
    let mut con = app.redis.clone();
    let _: () = con.del(keys::mailbox(tenant, id)).await?;
    let _: () = con.del(keys::join(tenant, id)).await?;
    Ok(())
}
