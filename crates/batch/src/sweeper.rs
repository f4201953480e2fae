//! The sweeper: every replica runs one. Every `--sweep-interval` it removes what expired, in
//! `sweep-2.lua` moves over `{inferq-batch}:expiries` (a file or an ended batch's record, once its
//! time has come): one move removes each, so two replicas never both do, and the replica whose
//! move removed a file deletes its object. Every `--orphan-grace` it also lists the store and
//! deletes objects older than the grace that no file key names: the objects of a replica killed
//! between writing them and recording them (or between a sweep move and its object's delete).
//!
//! ```text
//!   expiries zset ──sweep-2.lua──▶ keys gone ──▶ store.delete(object)
//!   store listing (older than the grace) ──EXISTS file key? no──▶ store.delete(object)
//! ```

use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::error::BatchError;
use crate::keys;
use crate::scripts::SCRIPTS;
use crate::state::{now_secs, App};

/// Entries one `sweep-2.lua` call removes at most.
const PER_CALL: usize = 200;
/// Keys one orphan check asks about per round trip.
const ORPHAN_CHUNK: usize = 500;

/// What one sweep removed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub files: u64,
    pub batches: u64,
    pub orphans: u64,
}

/// Sweeps until `stop`.
pub async fn run(app: App, stop: CancellationToken) {
    let retention = app.settings.retention;
    let mut orphans_due = Instant::now() + retention.orphan_grace;
    while !stop.is_cancelled() {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(retention.sweep_interval) => {}
        }
        if let Err(e) = sweep_expired(&app).await {
            tracing::warn!(error = %e, "cannot sweep expired files and batches (retrying)");
        }
        if Instant::now() >= orphans_due {
            match sweep_orphans(&app).await {
                Ok(_) => orphans_due = Instant::now() + retention.orphan_grace,
                Err(e) => tracing::warn!(error = %e, "cannot sweep orphaned objects (retrying)"),
            }
        }
    }
}

/// Removes every file and ended batch whose time has come.
pub async fn sweep_expired(app: &App) -> Result<Swept, BatchError> {
    let script = &SCRIPTS.sweep;
    let later = app.settings.retention.sweep_interval.as_secs().max(1);
    let mut swept = Swept::default();
    loop {
        let cmd = script.cmd(
            &[keys::expiries(), keys::counts()],
            &[
                now_secs().to_string(),
                PER_CALL.to_string(),
                keys::PREFIX.to_owned(),
                later.to_string(),
            ],
        );
        let mut con = app.redis.clone();
        let (files, batches, kept): (Vec<String>, u64, u64) =
            redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
        for id in &files {
            // A replica that dies here leaves the object to the orphan sweep.
            app.store.delete(id).await?;
            tracing::info!(file = %id, "expired file removed");
        }
        let n = files.len() as u64;
        app.metrics.count_swept("file", n);
        app.metrics.count_swept("batch", batches);
        swept.files += n;
        swept.batches += batches;
        if n + batches + kept < PER_CALL as u64 {
            return Ok(swept);
        }
    }
}

/// Deletes the objects older than `--orphan-grace` that no file key names.
pub async fn sweep_orphans(app: &App) -> Result<Swept, BatchError> {
    let grace = i64::try_from(app.settings.retention.orphan_grace.as_secs()).unwrap_or(i64::MAX);
    let old = app.store.written_before(now_secs() - grace).await?;
    let mut swept = Swept::default();
    for chunk in old.chunks(ORPHAN_CHUNK) {
        let mut pipe = redis::pipe();
        for id in chunk {
            pipe.exists(keys::file(id));
        }
        let mut con = app.redis.clone();
        let named: Vec<bool> = pipe.query_async(&mut con).await?;
        for (id, named) in chunk.iter().zip(named) {
            if !named {
                app.store.delete(id).await?;
                tracing::info!(file = %id, "orphaned object removed");
                swept.orphans += 1;
            }
        }
    }
    app.metrics.count_swept("orphan", swept.orphans);
    Ok(swept)
}
