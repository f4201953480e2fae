//! `inferq results`: writes results as JSONL until N results or a timeout. By default it pops
//! destructively (Go's BRPOP); `--durable NAME` (or its older spelling `--consumer NAME`) takes
//! each result under a lease by Go's durable consumer protocol (`queue::durable_results`),
//! writes and flushes it, renewing the lease while the write takes long, then acks it, so an
//! inferq and a Go durable consumer can share a result list and each result is taken once. An
//! entry that is no result goes to standard error with the reason and is acked. SIGINT or
//! SIGTERM stops either mode between results, as the timeout does.
//!
//! `--consumer` named an older inferq-only scheme (`queue::reliable`); a durable consumer
//! starting under NAME first hands back what that scheme left unacknowledged under the name.

use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_util::sync::CancellationToken;

use super::{Failure, RedisArgs};
use inferq_client::durable_results::{
    Delivery, DurableResultError, DurableResults, DurableSettings, Received,
};
use inferq_client::producer::{Popper, Producer};

#[derive(Debug, clap::Args)]
// Results are read from the result list alone: the request queue is not asked for.
#[command(mut_arg("queue", |a| a.hide(true)))]
pub(super) struct ResultsArgs {
    #[command(flatten)]
    pub redis: RedisArgs,
    /// Stop after this many results (0 = until the timeout).
    #[arg(long, short = 'n', default_value_t = 0)]
    pub count: u64,
    /// Stop after this long in all (e.g. 30s, 5m).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Take results under leases by Go's durable consumer protocol, as the consumer NAME (shown
    /// in its owner tokens); inferq and Go durable consumers may share the list. `--consumer`
    /// is the same.
    #[arg(long, visible_alias = "consumer", value_name = "NAME")]
    pub durable: Option<String>,
    /// Durable mode: how long a claimed result waits unrenewed (a killed consumer's results
    /// go to another consumer after it).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub result_lease: Duration,
    /// Durable mode: how often an empty list is asked again.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub result_reclaim_interval: Duration,
    /// Write here instead of standard output (appends).
    #[arg(long, short)]
    pub output: Option<PathBuf>,
}

type Out = Box<dyn Write + Send>;

/// Where results come from.
enum Source {
    Plain(Popper),
    Durable(DurableResults),
}

/// How the loop ended.
struct Ended {
    written: u64,
    interrupted: bool,
}

pub(super) async fn results(args: ResultsArgs) -> Result<(), Failure> {
    let started = Instant::now();
    let out: Out = match &args.output {
        Some(p) => Box::new(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("cannot open {}", p.display()))
                .map_err(Failure::bad_input)?,
        ),
        None => Box::new(std::io::stdout()),
    };
    let settings = DurableSettings {
        lease: args.result_lease,
        reclaim_interval: args.result_reclaim_interval,
        ..DurableSettings::default()
    };
    settings.check().map_err(Failure::bad_input)?;
    // The timeout bounds the connection too: a Redis that accepts connections and never
    // answers (frozen) is given up at the timeout.
    let connected = tokio::time::timeout(args.timeout, async {
        let producer = args.redis.producer().await?;
        let source = match &args.durable {
            Some(name) => Source::Durable(
                producer
                    .durable_results(name, settings)
                    .map_err(Failure::bad_input)?,
            ),
            None => Source::Plain(producer.popper().await.context("cannot connect to Redis")?),
        };
        Ok::<_, Failure>((producer, source))
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
    let (producer, source) = connected?;
    // Waiting for an older consumer's name is bounded by that name's own lease (15 s), not by
    // the timeout; only when it left something.
    if let Some(name) = &args.durable {
        hand_back_older(&producer, name).await;
    }
    let stop = CancellationToken::new();
    tokio::spawn(watch_signals(stop.clone()));
    let ended = match source {
        Source::Plain(popper) => plain(&args, popper, out, &stop, started).await?,
        Source::Durable(durable) => self::durable(&args, durable, out, &stop, started).await?,
    };
    if ended.interrupted {
        tell!(
            "inferq results: stopped by a signal after {} result(s)",
            ended.written
        );
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("stopped by a signal"),
        });
    }
    if args.count > 0 && ended.written < args.count {
        tell!(
            "inferq results: timed out after {} of {} results",
            ended.written,
            args.count
        );
        return Err(Failure {
            code: 1,
            error: anyhow::anyhow!("timed out"),
        });
    }
    Ok(())
}

/// What is left of `timeout` since `started`, or `None` once it is over.
fn left(args: &ResultsArgs, started: Instant) -> Option<Duration> {
    Some(args.timeout.saturating_sub(started.elapsed())).filter(|l| !l.is_zero())
}

/// Go's destructive `BRPOP`: a result is written as it was stored (fields inferq does not know
/// kept), and one that does not parse is written too, with a warning, rather than lost. A
/// signal ends the wait, never a write; a result Redis pops for an abandoned wait is lost with
/// the connection, as with Go's BRPOP.
async fn plain(
    args: &ResultsArgs,
    mut popper: Popper,
    mut out: Out,
    stop: &CancellationToken,
    started: Instant,
) -> Result<Ended, Failure> {
    let mut ended = Ended {
        written: 0,
        interrupted: false,
    };
    while args.count == 0 || ended.written < args.count {
        let Some(left) = left(args, started) else {
            break;
        };
        let wait = left
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        let taken = tokio::select! {
            biased;
            () = stop.cancelled() => {
                ended.interrupted = true;
                break;
            }
            taken = popper.pop_raw(wait) => taken.context("pop failed")?,
        };
        let Some(taken) = taken else {
            continue;
        };
        if let Err(e) = &taken.result {
            tracing::warn!(error = %e, "writing a result that does not parse as it is");
        }
        out.write_all(&line(&taken.raw))?;
        out.flush()?;
        ended.written += 1;
    }
    out.flush()?;
    Ok(ended)
}

/// Go's durable protocol: receive, write and flush (renewing the lease meanwhile), ack. A
/// signal ends the wait between receives, never a write and its ack, so no claim is left held
/// by a consumer that stops.
async fn durable(
    args: &ResultsArgs,
    mut durable: DurableResults,
    mut out: Out,
    stop: &CancellationToken,
    started: Instant,
) -> Result<Ended, Failure> {
    let mut ended = Ended {
        written: 0,
        interrupted: false,
    };
    while args.count == 0 || ended.written < args.count {
        let Some(left) = left(args, started) else {
            break;
        };
        if stop.is_cancelled() {
            ended.interrupted = true;
            break;
        }
        let polled = durable.receive_once().await.context("receive failed")?;
        let d = match polled {
            inferq_client::durable_results::Poll::Got(d) => d,
            inferq_client::durable_results::Poll::Empty => {
                let pause = left.min(durable.settings().reclaim_interval);
                tokio::select! {
                    biased;
                    () = stop.cancelled() => {
                        ended.interrupted = true;
                        break;
                    }
                    () = tokio::time::sleep(pause) => continue,
                }
            }
            // Skipped, or a kind of poll a newer client knows: nothing to write this round.
            _ => continue,
        };
        let is_result = match &d.received {
            Received::Result(_) => true,
            Received::Unreadable(why) => {
                tracing::warn!(error = %why, "writing a result that does not parse as it is");
                true
            }
            Received::Unparsable(why) => {
                tell!(
                    "inferq results: an entry of {} is no result ({why}); it is written here and \
                     acknowledged so it does not come back: {}",
                    durable.keys().route,
                    String::from_utf8_lossy(&d.raw)
                );
                false
            }
            // A kind of entry a newer client knows: written as it is, as an unreadable result is.
            _ => true,
        };
        if is_result {
            out = write_renewing(out, line(&d.raw), &mut durable, &d).await?;
        }
        match durable.ack(&d).await {
            Ok(_) => {}
            Err(DurableResultError::OwnershipLost) => tell!(
                "inferq results: a result's lease ran out before it was acknowledged (writing \
                 took longer than --result-lease, or Redis was away): another consumer may \
                 write it again"
            ),
            Err(e) => return Err(anyhow::Error::new(e).context("ack failed").into()),
        }
        if is_result {
            ended.written += 1;
        }
    }
    Ok(ended)
}

/// `raw` and a line break, in one buffer so a consumer killed mid-write leaves no half line
/// but a whole one or none (for entries that fit one `write`).
fn line(raw: &[u8]) -> Vec<u8> {
    let mut line = Vec::with_capacity(raw.len() + 1);
    line.extend_from_slice(raw);
    line.push(b'\n');
    line
}

/// Writes and flushes `line` on a blocking thread, renewing `d`'s lease every third of it
/// until the write is done (a reader that stalls the pipe must not cost the claim).
async fn write_renewing(
    mut out: Out,
    line: Vec<u8>,
    durable: &mut DurableResults,
    d: &Delivery,
) -> Result<Out, Failure> {
    let mut write = tokio::task::spawn_blocking(move || {
        let done = out.write_all(&line).and_then(|()| out.flush());
        (out, done)
    });
    let every = durable.settings().lease / 3;
    loop {
        tokio::select! {
            joined = &mut write => {
                let (out, done) = joined.context("the writer stopped")?;
                done?;
                return Ok(out);
            }
            () = tokio::time::sleep(every) => match durable.renew(d).await {
                Ok(()) => tracing::debug!("renewed the lease of a result being written"),
                Err(e) => tracing::warn!(error = %e, "could not renew a result being written"),
            },
        }
    }
}

/// Hands back what the older inferq-only `--consumer NAME` scheme left under `name`; a
/// failure is only a warning (the durable protocol does not need it).
async fn hand_back_older(producer: &Producer, name: &str) {
    use inferq_client::reliable::Older;
    match producer.hand_back_older(name).await {
        Ok(Older::Nothing) => {}
        Ok(Older::HandedBack(n)) => tracing::info!(
            handed_back = n,
            consumer = name,
            "returned results an older `results --consumer` took and never acknowledged"
        ),
        Ok(Older::StillRunning) => tracing::warn!(
            consumer = name,
            "an older inferq runs `results --consumer` under this name: what it took stays with it"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "could not hand back an older consumer's results"),
    }
}

/// The first SIGINT or SIGTERM stops the loop; a second exits at once.
pub(super) async fn watch_signals(stop: CancellationToken) {
    super::run::wait_for_signal().await;
    stop.cancel();
    super::run::wait_for_signal().await;
    std::process::exit(1);
}
