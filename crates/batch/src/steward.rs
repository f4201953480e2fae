//! Stewards move batches along. Every replica looks at `{inferq-batch}:live` (batches not
//! ended, each with the time it is next due) several times a second; for a due batch it takes
//! the batch's lease (`lease-1.lua`) and works its next moves while renewing the lease:
//!
//! ```text
//!   validating ──validate──▶ in_progress ──ingest──▶ (results arrive: collect-4.lua)
//!       │  bad file ▶ failed      │ all filed ▶ finalizing ─seal─▶ write files ▶ completed
//!       │                         │ window passed ─seal─▶ write files ▶ expired
//!       └────── cancel ─────▶ cancelling ─cancel markers, grace─seal─▶ write files ▶ cancelled
//! ```
//!
//! A replica that dies stops renewing; once its lease lapses any other replica takes the batch
//! where Redis says it is (the ingestion cursor, the cancel cursor, the seal), so no batch is
//! left in `in_progress`, `finalizing` or `cancelling` because a pod died (batch-gateway #645).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::error::BatchError;
use crate::ids;
use crate::ingest::{self, Stopped, Validated};
use crate::keys;
use crate::model::{is_ended, Fields};
use crate::scripts::SCRIPTS;
use crate::state::{now_secs, App};

/// How often the live set is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// Cancel markers written per round trip.
const CANCEL_CHUNK: u64 = 2000;

/// Runs this replica's stewards until `stop`.
pub async fn run(app: App, stop: CancellationToken) {
    while !stop.is_cancelled() {
        if let Err(e) = look(&app).await {
            tracing::warn!(error = %e, "cannot read the live batches (retrying)");
        }
        refresh_counts(&app).await;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(LOOK_EVERY) => {}
        }
    }
}

async fn refresh_counts(app: &App) {
    let mut con = app.redis.clone();
    let counts: Result<std::collections::HashMap<String, i64>, _> =
        con.hgetall(keys::counts()).await;
    if let Ok(counts) = counts {
        for (status, n) in counts {
            app.metrics
                .batches
                .get_or_create(&crate::metrics::StatusLabel { status })
                .set(n);
        }
    }
}

async fn look(app: &App) -> Result<(), BatchError> {
    let mut con = app.redis.clone();
    let now = inferq_client::producer::unix_ms();
    let due: Vec<String> = con
        .zrangebyscore_limit(keys::live(), "-inf", now, 0, 16)
        .await?;
    for id in due {
        {
            let Ok(mut working) = app.working.lock() else {
                return Ok(());
            };
            if working.contains(&id) {
                continue;
            }
            working.insert(id.clone());
        }
        if lease(app, &id, "take").await.unwrap_or(false) {
            tokio::spawn(work(app.clone(), id));
        } else if let Ok(mut working) = app.working.lock() {
            working.remove(&id);
        }
    }
    Ok(())
}

async fn lease(app: &App, id: &str, how: &str) -> Result<bool, BatchError> {
    let script = &SCRIPTS.lease;
    let ms = app.settings.lease.as_millis().to_string();
    let cmd = script.cmd(&[keys::lease(id)], &[how, app.owner.as_str(), ms.as_str()]);
    let mut con = app.redis.clone();
    let held: i64 = redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    Ok(held == 1)
}

/// Works one batch under its lease, renewing it, then says when it is next due.
async fn work(app: App, id: String) {
    let held = Arc::new(AtomicBool::new(true));
    let done = CancellationToken::new();
    let renewer = {
        let (app, id, held, done) = (app.clone(), id.clone(), held.clone(), done.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = done.cancelled() => return,
                    _ = tokio::time::sleep(app.settings.lease / 3) => {}
                }
                if !lease(&app, &id, "renew").await.unwrap_or(false) {
                    held.store(false, Ordering::SeqCst);
                    return;
                }
            }
        })
    };
    let still = held.clone();
    let outcome = advance(&app, &id, &move || still.load(Ordering::SeqCst)).await;
    done.cancel();
    let _ = renewer.await;
    let next = match outcome {
        Ok(next) => next,
        Err(e) => {
            tracing::warn!(batch = %id, error = %e, "batch step failed (retrying)");
            Some(inferq_client::producer::unix_ms() + 2000)
        }
    };
    let mut con = app.redis.clone();
    if let Some(at) = next {
        let again: Result<(), _> = redis::cmd("ZADD")
            .arg(keys::live())
            .arg("XX")
            .arg(at)
            .arg(&id)
            .query_async(&mut con)
            .await;
        if let Err(e) = again {
            tracing::warn!(batch = %id, error = %e, "cannot schedule the batch's next look");
        }
    }
    if held.load(Ordering::SeqCst) {
        let _ = lease(&app, &id, "drop").await;
    }
    if let Ok(mut working) = app.working.lock() {
        working.remove(&id);
    }
}

fn num(f: &Fields, name: &str) -> i64 {
    f.get(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// The batch's next moves; `Some(ms)`: look again then, `None`: it ended.
async fn advance(
    app: &App,
    id: &str,
    held: &(dyn Fn() -> bool + Sync),
) -> Result<Option<i64>, BatchError> {
    loop {
        if !held() {
            return Err(BatchError::LeaseLost(id.to_owned()));
        }
        let mut con = app.redis.clone();
        let f: Fields = con.hgetall(keys::batch(id)).await?;
        let status = f.get("status").cloned().unwrap_or_default();
        let sealed = f.get("sealed").cloned().unwrap_or_default();
        if f.is_empty() || is_ended(&status) {
            let _: () = con.zrem(keys::live(), id).await?;
            return Ok(None);
        }
        if !sealed.is_empty() {
            crate::finalize::finalize(app, &f, &sealed).await?;
            continue;
        }
        let now = now_secs();
        match status.as_str() {
            "validating" => begin(app, id, &f).await?,
            "finalizing" => seal(app, id, "completed").await?,
            "in_progress" if now >= num(&f, "expires_at") => {
                withdraw(app, id, &f).await?;
                seal(app, id, "expired").await?
            }
            "in_progress" if num(&f, "ingested") < num(&f, "total") => {
                if ingest::ingest(app, &f, held).await? == Stopped::Done {
                    tracing::info!(batch = %id, lines = num(&f, "total"), "batch ingested");
                    return Ok(Some(inferq_client::producer::unix_ms() + 200));
                }
            }
            "in_progress" => {
                let expiry = num(&f, "expires_at") * 1000;
                return Ok(Some(expiry.min(inferq_client::producer::unix_ms() + 5000)));
            }
            "cancelling" => {
                if let Some(next) = cancelling(app, id, &f).await? {
                    return Ok(Some(next));
                }
            }
            other => {
                tracing::warn!(batch = %id, status = %other, "batch in an unknown status: left alone");
                return Ok(Some(inferq_client::producer::unix_ms() + 60_000));
            }
        }
    }
}

async fn begin(app: &App, id: &str, f: &Fields) -> Result<(), BatchError> {
    let (outcome, detail) = match ingest::validate(app, f).await? {
        Validated::Lines(n) => ("ok", n.to_string()),
        Validated::Failed(errors) => ("failed", errors),
    };
    let script = &SCRIPTS.begin;
    let input = f.get("input_file_id").map_or("", String::as_str);
    let keep = crate::retention::secs(app.settings.retention.batches).to_string();
    let cmd = script.cmd(
        &[
            keys::batch(id),
            keys::counts(),
            keys::live(),
            keys::enqueued(),
            keys::expiries(),
            keys::file(input),
        ],
        &[outcome, detail.as_str(), id, keep.as_str()],
    );
    let mut con = app.redis.clone();
    let status: String = redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    tracing::info!(batch = %id, status = %status, "batch validated");
    Ok(())
}

/// Takes a cancelled or expired batch's lines still pending out of its tenant's queue (see
/// [`crate::tenants::withdraw`]), before it is sealed.
async fn withdraw(app: &App, id: &str, f: &Fields) -> Result<(), BatchError> {
    let n = crate::tenants::withdraw(app, id, f).await?;
    if n > 0 {
        tracing::info!(batch = %id, lines = n, "took the batch's pending lines out of its tenant's queue");
    }
    Ok(())
}

async fn seal(app: &App, id: &str, ending: &str) -> Result<(), BatchError> {
    let script = &SCRIPTS.seal;
    let cmd = script.cmd(&[keys::batch(id)], &[ending]);
    let mut con = app.redis.clone();
    let _: String = redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    Ok(())
}

/// Cancels the batch's submitted requests (their cancel markers, resumable by `cancel_cursor`),
/// then seals it once every submitted request has its result or the grace has passed.
async fn cancelling(app: &App, id: &str, f: &Fields) -> Result<Option<i64>, BatchError> {
    let cursor = u64::try_from(num(f, "cursor")).unwrap_or(0);
    let mut marked = u64::try_from(num(f, "cancel_cursor")).unwrap_or(0);
    let mut con = app.redis.clone();
    while marked < cursor {
        let upto = (marked + CANCEL_CHUNK).min(cursor);
        let request_ids: Vec<String> = (marked + 1..=upto)
            .map(|n| ids::request_id(id, n))
            .collect();
        app.producer.cancel(&request_ids).await?;
        let _: () = con.hset(keys::batch(id), "cancel_cursor", upto).await?;
        marked = upto;
    }
    let done = num(f, "completed") + num(f, "failed");
    let waited = now_secs() - num(f, "cancelling_at");
    let grace = i64::try_from(app.settings.cancel_grace.as_secs()).unwrap_or(i64::MAX);
    if done >= num(f, "ingested") || waited >= grace {
        withdraw(app, id, f).await?;
        seal(app, id, "cancelled").await?;
        return Ok(None);
    }
    Ok(Some(inferq_client::producer::unix_ms() + 250))
}
