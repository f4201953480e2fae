//! `inferq run`: the processor, configured exactly like the Go processor (same flags, same
//! transport-config JSON, pool and merge-policy files). A bad config exits with code 2 naming
//! the field. SIGTERM or SIGINT starts a graceful shutdown; a second signal exits at once.
//! SIGHUP reloads the queues of `--transport-config-file` (see `dispatch::reload`); where no
//! reload can be made it is logged and ignored instead of ending the process.

use tokio_util::sync::CancellationToken;

use super::Failure;
use crate::config::{load, RunArgs};

pub(super) async fn run(args: RunArgs) -> Result<(), Failure> {
    let config = load(&args).map_err(Failure::bad_input)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    let hangups = watch_hangups(config.reload.is_some());
    crate::dispatch::run_with(config, shutdown, hangups)
        .await
        .map_err(|e| {
            if e.is_bad_input() {
                Failure::bad_input(e)
            } else {
                Failure::from(e)
            }
        })
}

async fn watch_signals(shutdown: CancellationToken) {
    wait_for_signal().await;
    tracing::info!("signal received: draining (send another to exit at once)");
    shutdown.cancel();
    wait_for_signal().await;
    tracing::warn!("second signal: exiting at once");
    std::process::exit(1);
}

/// Forwards each SIGHUP to the processor's reload when `reloadable`, and otherwise says why it
/// is ignored. `None` where there is no SIGHUP (or it cannot be caught).
fn watch_hangups(reloadable: bool) -> Option<tokio::sync::mpsc::Receiver<()>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangup = match signal(SignalKind::hangup()) {
            Ok(hangup) => hangup,
            Err(e) => {
                tracing::warn!(error = %e, "cannot catch SIGHUP; the queues config reloads only on its watch interval");
                return None;
            }
        };
        // One waiting is enough: hang-ups while a reload runs make one more reload.
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            while hangup.recv().await.is_some() {
                if !reloadable {
                    tracing::warn!("SIGHUP ignored: the queues config reloads only with --transport=redis-sortedset and --transport-config-file");
                    continue;
                }
                match tx.try_send(()) {
                    Ok(()) | Err(tokio::sync::mpsc::error::TrySendError::Full(())) => {}
                    Err(tokio::sync::mpsc::error::TrySendError::Closed(())) => return,
                }
            }
        });
        Some(rx)
    }
    #[cfg(not(unix))]
    {
        let _ = reloadable;
        None
    }
}

/// The next SIGTERM or SIGINT.
pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
