//! Pub/sub ingress, for Go's `redis-pubsub` transport: producers PUBLISH each request's envelope
//! on its queue's channel, where Go's processor executed it straight from the subscription
//! (lost if the processor died meanwhile, executed once per subscribed instance). inferq
//! instead admits every message into the durable queue of the channel's name
//! ([`Queue::admit`]): from there it is claimed under a lease, retried, reclaimed after a crash
//! and finished once, exactly like a request a producer ZADDed, and each message is admitted
//! once however many instances received it.
//!
//! ```text
//!   PUBLISH <channel> ──▶ subscription (one per instance) ──▶ per-queue batcher
//!        ──admit (EVALSHA, ≤ ADMIT_BATCH messages)──▶ pending ──▶ the queue's consumer, woken
//! ```
//!
//! What pub/sub cannot give stays as in Go: a message published while no instance is subscribed
//! (all down, or reconnecting) reaches no one, and one received but not yet admitted when the
//! process is killed is lost. While the subscription is down, or Redis refuses the admits,
//! `/readyz` says so. Messages wait in memory while an admit is retried; a subscriber that does
//! not keep up is disconnected by Redis's `client-output-buffer-limit pubsub` and subscribes
//! again.
//!
//! [`Queue::admit`]: crate::queue::Queue::admit

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::context::QueueCtx;
use super::subscription::{self, Next};
use crate::ops::Trouble;

/// Most messages admitted by one script call.
const ADMIT_BATCH: usize = 256;
/// Messages received and waiting for their admit, per queue, before the subscription stops
/// reading (and Redis buffers, then disconnects it): four batches, so memory stays bounded
/// while Redis refuses the admits.
const WAITING: usize = 4 * ADMIT_BATCH;

/// Starts the ingress of `queues` (those fed by a channel) on `tracker`: it subscribes to their
/// channels until `stop`, admitting what arrives; messages already received when `stop` comes
/// are still admitted (while Redis takes them). `/readyz` is not ready until the subscription
/// is made, so a producer waiting for readiness publishes to a listening instance.
pub fn start(
    tracker: &TaskTracker,
    client: inferq_client::target::Target,
    queues: Vec<Arc<QueueCtx>>,
    stop: CancellationToken,
) {
    let Some(first) = queues.first() else {
        return;
    };
    first.readiness.note(
        &subscription_name(&queues),
        Some(Trouble::Stalled("not subscribed yet".to_owned())),
    );
    tracker.spawn(listen(client, queues, stop));
}

async fn listen(
    client: inferq_client::target::Target,
    queues: Vec<Arc<QueueCtx>>,
    stop: CancellationToken,
) {
    let admitters = TaskTracker::new();
    let mut routes: HashMap<Vec<u8>, mpsc::Sender<Vec<u8>>> = HashMap::new();
    for ctx in &queues {
        let (tx, rx) = mpsc::channel(WAITING);
        routes.insert(ctx.queue.name().as_bytes().to_vec(), tx);
        admitters.spawn(admit(ctx.clone(), rx, stop.clone()));
    }
    admitters.close();
    subscribe_loop(&client, &queues, &routes, &stop).await;
    drop(routes);
    admitters.wait().await;
}

/// What `/readyz` calls the subscription.
fn subscription_name(queues: &[Arc<QueueCtx>]) -> String {
    let names: Vec<String> = queues
        .iter()
        .map(|q| format!("{:?}", q.queue.name()))
        .collect();
    format!(
        "the subscription to the request channels {}",
        names.join(", ")
    )
}

async fn subscribe_loop(
    client: &inferq_client::target::Target,
    queues: &[Arc<QueueCtx>],
    routes: &HashMap<Vec<u8>, mpsc::Sender<Vec<u8>>>,
    stop: &CancellationToken,
) {
    let readiness = &queues[0].readiness;
    let what = subscription_name(queues);
    let mut pause = Duration::from_millis(200);
    loop {
        let Some(subscribed) =
            subscription::subscribe(client, routes.keys().map(Vec::as_slice), stop).await
        else {
            break;
        };
        match subscribed {
            Ok(mut pubsub) => {
                readiness.note(&what, None);
                pause = Duration::from_millis(200);
                tracing::info!(
                    channels = routes.len(),
                    "subscribed to the request channels"
                );
                let mut messages = pubsub.on_message();
                loop {
                    let msg = match subscription::next(&mut messages, stop).await {
                        Next::Message(msg) => msg,
                        Next::Lost => break,
                        Next::Stopped => return,
                    };
                    let Some(route) = routes.get(msg.get_channel_name().as_bytes()) else {
                        continue;
                    };
                    let sent = tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        s = route.send(msg.get_payload_bytes().to_vec()) => s,
                    };
                    if sent.is_err() {
                        return;
                    }
                }
                tracing::warn!("the subscription to the request channels was lost; messages published until it is back reach no one here");
                readiness.note(
                    &what,
                    Some(Trouble::Stalled("the connection was lost".to_owned())),
                );
            }
            Err(subscription::Failed { error: e, .. }) => {
                tracing::warn!(error = %e, "cannot subscribe to the request channels; retrying");
                let trouble = if e.code().is_some() {
                    Trouble::Refused(e.to_string())
                } else {
                    Trouble::Stalled(e.to_string())
                };
                readiness.note(&what, Some(trouble));
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(10));
    }
}

/// Admits one queue's messages in batches, retrying while Redis does not take them, and wakes
/// the queue's consumer after each admit. After `stop` it admits what it still holds and gives
/// up at the first failure.
async fn admit(ctx: Arc<QueueCtx>, mut rx: mpsc::Receiver<Vec<u8>>, stop: CancellationToken) {
    let what = format!("the admits of channel {:?}", ctx.queue.name());
    let mut batch: Vec<Vec<u8>> = Vec::with_capacity(ADMIT_BATCH);
    while let Some(first) = rx.recv().await {
        batch.push(first);
        while batch.len() < ADMIT_BATCH {
            match rx.try_recv() {
                Ok(m) => batch.push(m),
                Err(_) => break,
            }
        }
        let mut pause = Duration::from_millis(100);
        loop {
            match ctx.queue.admit(&batch).await {
                Ok(admitted) => {
                    ctx.readiness.note(&what, None);
                    if admitted > 0 {
                        ctx.wake.notify_one();
                    }
                    count(&ctx, "admitted", admitted);
                    count(&ctx, "duplicate", batch.len().saturating_sub(admitted));
                    tracing::trace!(received = batch.len(), admitted, queue = %ctx.queue.name(), "admitted");
                    break;
                }
                Err(e) if stop.is_cancelled() => {
                    let lost = batch.len() + rx.len();
                    tracing::error!(error = %e, queue = %ctx.queue.name(), messages = lost, "shutting down with messages Redis did not take; they are lost, as in Go");
                    count(&ctx, "lost", lost);
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, queue = %ctx.queue.name(), messages = batch.len(), "Redis did not take received messages; keeping them and retrying");
                    let trouble = match e.redis_refusal() {
                        Some(refusal) => Trouble::Refused(refusal.to_string()),
                        None => Trouble::Stalled(e.to_string()),
                    };
                    ctx.readiness.note(&what, Some(trouble));
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
            }
        }
        batch.clear();
    }
}

/// Counts `n` received messages of `ctx`'s channel under `outcome`.
fn count(ctx: &QueueCtx, outcome: &str, n: usize) {
    if n > 0 {
        ctx.metrics
            .pubsub_messages
            .get_or_create(&ctx.labels.with_outcome(outcome))
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}
