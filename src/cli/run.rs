//! `inferq run`: the processor, configured exactly like the Go processor (same flags, same
//! transport-config JSON, pool and merge-policy files). A bad config exits with code 2 naming
//! the field. SIGTERM or SIGINT starts a graceful shutdown; a second signal exits at once.

use tokio_util::sync::CancellationToken;

use super::Failure;
use crate::config::{load, RunArgs};

pub async fn run(args: RunArgs) -> Result<(), Failure> {
    let config = load(&args).map_err(Failure::bad_input)?;
    for warning in &config.warnings {
        tracing::warn!("{warning}");
    }
    let shutdown = CancellationToken::new();
    tokio::spawn(watch_signals(shutdown.clone()));
    crate::dispatch::run(config, shutdown)
        .await
        .map_err(|e| match e {
            crate::dispatch::DispatchError::Config(_)
            | crate::dispatch::DispatchError::Gateway(_) => Failure::bad_input(e),
            other => Failure::from(other),
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
