//! Wake-ups: one pub/sub connection that listens for "work arrived" on every queue and rings the
//! queue's consumer, so an idle queue is polled the moment a request lands instead of after its
//! `poll_interval`.
//!
//! Two sources, both optional:
//! - the doorbell channel `<queue>:doorbell`, which `inferq submit` (and [`Producer`]) rings
//!   after each batch of submissions;
//! - the keyspace notifications of the pending key (`__keyspace@<db>__:<queue>`, event `zadd`),
//!   which arrive when an operator has enabled them (`notify-keyspace-events` with `K` and `z` or
//!   `A`), so a Go producer's `ZADD` wakes the consumer too. The channel is always subscribed;
//!   inferq neither reads nor changes the server's setting.
//!
//! Rings coalesce: a burst of submissions while the consumer is polling becomes one more poll.
//! Polling stays the fallback: when pub/sub is unavailable (an ACL denying it, a lost connection)
//! the listener says so once and consumers keep polling on their own.
//!
//! [`Producer`]: inferq_client::producer::Producer

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::context::QueueCtx;
use super::subscription::{self, Next};
use inferq_client::keys::doorbell_channel;

/// The wait before subscribing again after a failure; it doubles with each failure in a row, up
/// to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(500);
const MAX_PAUSE: Duration = Duration::from_secs(30);

/// Listens until `stop` is cancelled, reconnecting when the connection drops.
pub async fn listen(
    client: inferq_client::target::Target,
    queues: Vec<Arc<QueueCtx>>,
    stop: CancellationToken,
) {
    let db = client.client().get_connection_info().redis_settings().db();
    let mut warned = false;
    let mut losses = Losses::default();
    let mut pause = FIRST_PAUSE;
    loop {
        let channels = bells(&queues, db);
        let Some(subscribed) =
            subscription::subscribe(&client, channels.keys().map(Vec::as_slice), &stop).await
        else {
            return;
        };
        match subscribed {
            Ok(mut pubsub) => {
                if warned {
                    tracing::info!("wake-ups available again");
                }
                warned = false;
                pause = FIRST_PAUSE;
                set_listening(&queues, true);
                tracing::debug!("listening for wake-ups");
                // Anything that arrived while not listening is found by one poll now.
                ring_all(&queues);
                if let Heard::Stopped = ring_until_lost(&mut pubsub, &channels, &stop).await {
                    return;
                }
                set_listening(&queues, false);
                losses.lost();
            }
            // Made, then cut before every SUBSCRIBE was answered: a burst published meanwhile
            // overflowed the output buffer just as it does once subscribed.
            Err(e) if e.cut => losses.lost(),
            Err(e) => {
                if !warned {
                    warned = true;
                    tracing::warn!(error = %e.error, "cannot subscribe for wake-ups; consumers find new work by polling alone (at most poll_interval apart)");
                }
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// The channels to subscribe to, each with the bell it rings: every queue's doorbell and the
/// keyspace channel of its pending key in database `db`.
fn bells(queues: &[Arc<QueueCtx>], db: i64) -> HashMap<Vec<u8>, Bell> {
    let mut channels: HashMap<Vec<u8>, Bell> = HashMap::new();
    for ctx in queues {
        let name = ctx.queue.name();
        let bell = |source: &str| Bell {
            ctx: ctx.clone(),
            keyspace: source == "keyspace",
            rings: ctx
                .metrics
                .wakeups
                .get_or_create(&ctx.labels.with_source(source))
                .clone(),
        };
        channels.insert(doorbell_channel(name).into_bytes(), bell("doorbell"));
        // Subscribed whether or not the server publishes keyspace events: reading the
        // setting would need CONFIG, which a least-privilege user should not have, and a
        // silent channel costs nothing.
        channels.insert(
            format!("__keyspace@{db}__:{name}").into_bytes(),
            bell("keyspace"),
        );
    }
    channels
}

/// How listening on one subscription ended.
enum Heard {
    /// The connection is gone: subscribe again.
    Lost,
    /// `stop` was cancelled.
    Stopped,
}

/// Rings the bell of every message that means work arrived, until the subscription is lost or
/// `stop` is cancelled.
async fn ring_until_lost(
    pubsub: &mut redis::aio::PubSub,
    channels: &HashMap<Vec<u8>, Bell>,
    stop: &CancellationToken,
) -> Heard {
    let mut messages = pubsub.on_message();
    loop {
        let msg = match subscription::next(&mut messages, stop).await {
            Next::Message(msg) => msg,
            Next::Lost => return Heard::Lost,
            Next::Stopped => return Heard::Stopped,
        };
        let Some(bell) = channels.get(msg.get_channel_name().as_bytes()) else {
            continue;
        };
        // Of the pending key's events only additions mean work arrived.
        if bell.keyspace && !matches!(msg.get_payload_bytes(), b"zadd" | b"zincr") {
            continue;
        }
        bell.rings.inc();
        bell.ctx.wake.notify_one();
    }
}

/// How often a lost wake-up subscription is warned about, at most: a server whose
/// `client-output-buffer-limit pubsub` is too small for a burst of keyspace events cuts it at
/// every burst.
const LOSS_WARN_EVERY: Duration = Duration::from_secs(60);

/// Counts the losses of the wake-up subscription and warns about them: the first at once, then
/// at most once per [`LOSS_WARN_EVERY`] with how many there were meanwhile.
#[derive(Default)]
struct Losses {
    unreported: u64,
    warned_at: Option<std::time::Instant>,
}

impl Losses {
    fn lost(&mut self) {
        self.unreported += 1;
        if self
            .warned_at
            .is_some_and(|at| at.elapsed() < LOSS_WARN_EVERY)
        {
            return;
        }
        tracing::warn!(
            losses = self.unreported,
            "Redis closed the wake-up subscription (a client-output-buffer-limit for pubsub too \
             small for a burst of keyspace events or doorbell rings, a CLIENT KILL, or a restart); \
             consumers poll until it is made again (within a second)"
        );
        self.unreported = 0;
        self.warned_at = Some(std::time::Instant::now());
    }
}

/// What a message on one channel rings.
struct Bell {
    ctx: Arc<QueueCtx>,
    /// A keyspace channel (its messages name the event) rather than the doorbell.
    keyspace: bool,
    rings: prometheus_client::metrics::counter::Counter,
}

fn set_listening(queues: &[Arc<QueueCtx>], on: bool) {
    for ctx in queues {
        ctx.listening.store(on, Ordering::SeqCst);
    }
}

fn ring_all(queues: &[Arc<QueueCtx>]) {
    for ctx in queues {
        ctx.wake.notify_one();
    }
}
