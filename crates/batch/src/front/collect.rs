//! The front door's collector: every replica runs one. It waits on the result list without
//! taking anything (`BLMOVE` of the list onto its own tail, which leaves it as it was), then
//! files what is there with `collect-1.lua`: each result under its request, announced on the
//! done channel so every replica's waits wake. Any replica files any result, and none pops a
//! result another is waiting for (the batch gateway's #644); one killed between calls loses
//! nothing.

use std::time::Duration;

use inferq_client::producer::unix_ms;
use inferq_client::target::Link;
use tokio_util::sync::CancellationToken;

use super::keys;
use super::scripts::SCRIPTS;
use crate::state::App;

/// Results taken per call.
const PER_CALL: u32 = 500;
/// How long one blocking look waits before it is made again (seconds).
const LOOK_SECS: f64 = 2.0;

/// What one call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub taken: u64,
    pub filed: u64,
    pub dropped: u64,
}

/// One `collect-1.lua` call.
pub async fn collect_once(app: &App) -> Result<Collected, redis::RedisError> {
    let script = &SCRIPTS.collect;
    let front = &app.front;
    let cmd = script.cmd(
        &[keys::results()],
        &[
            PER_CALL.to_string(),
            crate::keys::PREFIX.to_owned(),
            front.retention_secs().to_string(),
            front.record_ttl_secs().to_string(),
            keys::done_channel(),
            (unix_ms() / 1000).to_string(),
        ],
    );
    let mut con = app.redis.clone();
    let (taken, filed, dropped): (u64, u64, u64) =
        redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    app.metrics.front_results_filed.inc_by(filed);
    app.metrics.front_results_dropped.inc_by(dropped);
    Ok(Collected {
        taken,
        filed,
        dropped,
    })
}

/// Waits until the result list holds something (or `LOOK_SECS` pass): true when it does.
async fn look(link: &mut Link) -> Result<bool, redis::RedisError> {
    let list = keys::results();
    let moved: Option<Vec<u8>> = redis::cmd("BLMOVE")
        .arg(&list)
        .arg(&list)
        .arg("RIGHT")
        .arg("RIGHT")
        .arg(LOOK_SECS)
        .query_async(link)
        .await?;
    Ok(moved.is_some())
}

/// Collects until `stop`.
pub async fn run(app: App, stop: CancellationToken) {
    let mut failing = false;
    let mut link: Option<Link> = None;
    while !stop.is_cancelled() {
        let round = async {
            if link.is_none() {
                link = Some(
                    app.settings
                        .target
                        .blocking()
                        .await
                        .map_err(|e| e.to_string())?,
                );
            }
            if let Some(l) = link.as_mut() {
                let waited = tokio::time::timeout(
                    Duration::from_secs_f64(LOOK_SECS) + Duration::from_secs(5),
                    look(l),
                )
                .await;
                match waited {
                    Ok(Ok(false)) => return Ok(()),
                    Ok(Ok(true)) => {}
                    Ok(Err(e)) => {
                        link = None;
                        return Err(e.to_string());
                    }
                    Err(_) => {
                        link = None;
                        return Err("no answer to BLMOVE".to_owned());
                    }
                }
            }
            loop {
                let c = collect_once(&app).await.map_err(|e| e.to_string())?;
                if c.taken < u64::from(PER_CALL) {
                    return Ok(());
                }
            }
        };
        let outcome = tokio::select! {
            _ = stop.cancelled() => return,
            r = round => r,
        };
        match outcome {
            Ok(()) => {
                if failing {
                    tracing::info!("front door: collecting results again");
                    failing = false;
                }
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "front door: cannot collect results (retrying)");
                    failing = true;
                }
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                }
            }
        }
    }
}
