//! `inferq results`: writes results as JSONL until N results or a timeout. By default it pops
//! destructively (Go's BRPOP); `--consumer NAME` takes results reliably into an in-progress
//! list under a leased name (a second live consumer of the name is refused), acknowledges each
//! once written and flushed, and at start hands back what a previous consumer of that name took
//! but never acknowledged. SIGINT or SIGTERM stops it between results, as the timeout does:
//! a reliable consumer gives its name up, so a successor under the name starts at once.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{Failure, RedisArgs};

#[derive(Debug, clap::Args)]
// Results are read from the result list alone: the request queue is not asked for.
#[command(mut_arg("queue", |a| a.hide(true)))]
pub struct ResultsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Stop after this many results (0 = until the timeout).
    #[arg(long, short = 'n', default_value_t = 0)]
    pub count: u64,
    /// Stop after this long in all (e.g. 30s, 5m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Reliable mode under this consumer name.
    #[arg(long)]
    pub consumer: Option<String>,
    /// Write here instead of standard output (appends).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

pub async fn results(args: ResultsArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let mut out: Box<dyn Write> = match &args.output {
        Some(p) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open {}", p.display()))
                .map_err(Failure::bad_input)?,
        ),
        None => Box::new(std::io::stdout().lock()),
    };
    let mut written = 0u64;
    // The timeout bounds the connection too: a Redis that accepts connections and never
    // answers (frozen) is given up at the timeout. Waiting for a consumer name is bounded by
    // the name's own lease instead (below).
    let connected = tokio::time::timeout(args.timeout, async {
        let producer = args.redis.producer().await?;
        let popper = producer.popper().await.context("cannot connect to Redis")?;
        Ok::<_, Failure>((producer, popper))
    })
    .await;
    let Ok(connected) = connected else {
        tell!(
            "inferq results: Redis did not answer within the timeout ({}); no result was taken",
            humantime::format_duration(args.timeout)
        );
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("timed out before Redis answered"),
        });
    };
    let (producer, mut popper) = connected?;
    let mut reliable = match &args.consumer {
        Some(name) => {
            let mut c = producer
                .reliable(name)
                .await
                .context("cannot open a reliable consumer")?;
            let n = c.hand_back().await.context("hand back failed")?;
            if n > 0 {
                tracing::info!(handed_back = n, consumer = %name, "returned unacknowledged results");
            }
            Some(c)
        }
        None => None,
    };
    // Only from here: a signal while the name is still awaited ends the process as before.
    let stop = CancellationToken::new();
    tokio::spawn(watch_signals(stop.clone()));
    let mut interrupted = false;
    while args.count == 0 || written < args.count {
        let left = args.timeout.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        let wait = left
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        // Either way a result is written as it was stored (fields inferq does not know kept),
        // and one that does not parse is written too, with a warning, rather than lost.
        // A signal ends the wait, never a write and its acknowledgement. A result Redis moved
        // for the abandoned wait stays in the taken list and is handed back at the next start
        // (in plain mode it is lost with the connection, as with Go's BRPOP).
        let taken = tokio::select! {
            biased;
            () = stop.cancelled() => {
                interrupted = true;
                break;
            }
            taken = async {
                match reliable.as_mut() {
                    Some(c) => c.take(wait).await.context("take failed"),
                    None => popper.pop_raw(wait).await.context("pop failed"),
                }
            } => taken?,
        };
        let Some(taken) = taken else {
            continue;
        };
        if let Err(e) = &taken.result {
            tracing::warn!(error = %e, "writing a result that does not parse as it is");
        }
        out.write_all(&taken.raw)?;
        out.write_all(b"\n")?;
        out.flush()?;
        if let Some(c) = reliable.as_mut() {
            c.ack(&taken).await.context("ack failed")?;
        }
        written += 1;
    }
    out.flush()?;
    if let Some(c) = reliable {
        // Give the name up so the next consumer under it starts at once; if this fails the
        // lease lapses by itself.
        if let Err(e) = c.close().await {
            tracing::warn!(error = %e, "could not give the consumer name up");
        }
    }
    if interrupted {
        tell!("inferq results: stopped by a signal after {written} result(s)");
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("stopped by a signal"),
        });
    }
    if args.count > 0 && written < args.count {
        tell!(
            "inferq results: timed out after {written} of {} results",
            args.count
        );
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("timed out"),
        });
    }
    Ok(())
}

/// The first SIGINT or SIGTERM stops the loop; a second exits at once (giving the name up can
/// wait on a Redis that does not answer).
pub(super) async fn watch_signals(stop: CancellationToken) {
    super::run::wait_for_signal().await;
    stop.cancel();
    super::run::wait_for_signal().await;
    std::process::exit(1);
}
