//! The collector: every replica runs one, taking results off `{inferq-batch}:results` and
//! filing each under its batch's line with `collect-4.lua`, one atomic move per call. A replica
//! killed between calls loses nothing (nothing is held outside Redis), and two replicas never
//! take one result; that is what keeps a second replica from losing results (batch-gateway
//! #644, where each replica popped a shared list and threw away what it did not own).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::keys;
use crate::scripts::SCRIPTS;
use crate::state::App;

/// Results taken per call.
const PER_CALL: u32 = 500;
/// How long an empty result list waits before it is asked again.
const IDLE: Duration = Duration::from_millis(20);

/// What one call did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Collected {
    pub taken: u64,
    pub filed: u64,
    pub dropped: u64,
    pub finalizing: u64,
}

/// One `collect-4.lua` call.
pub async fn collect_once(app: &App) -> Result<Collected, redis::RedisError> {
    let script = &SCRIPTS.collect;
    let cmd = script.cmd(
        &[
            keys::results(),
            keys::counts(),
            keys::live(),
            keys::enqueued(),
        ],
        &[PER_CALL.to_string(), keys::PREFIX.to_owned()],
    );
    let mut con = app.redis.clone();
    let (taken, filed, dropped, finalizing): (u64, u64, u64, u64) =
        redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    app.metrics.results_filed.inc_by(filed);
    app.metrics.results_dropped.inc_by(dropped);
    Ok(Collected {
        taken,
        filed,
        dropped,
        finalizing,
    })
}

/// Collects until `stop`.
pub async fn run(app: App, stop: CancellationToken) {
    let mut failing = false;
    while !stop.is_cancelled() {
        let pause = match collect_once(&app).await {
            Ok(c) => {
                if failing {
                    tracing::info!("collecting batch results again");
                    failing = false;
                }
                if c.taken >= u64::from(PER_CALL) {
                    continue;
                }
                IDLE
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "cannot collect batch results (retrying)");
                    failing = true;
                }
                Duration::from_millis(500)
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
    }
}
