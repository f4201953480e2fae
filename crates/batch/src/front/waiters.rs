//! Waking the clients a replica holds (wait mode, streams, long polls) when their mailbox
//! fills. Each open wait registers its mailbox here; one task per replica wakes them:
//!
//! - **keyspace notifications** (standalone and Sentinel, where Redis has them: `notify-keyspace-
//!   events` with `K` and `l`, turned on at start-up when `CONFIG SET` is allowed): one pattern
//!   subscription per replica, `__keyspace@<db>__:results:req:*`, whose `lpush` events wake the
//!   waits of that mailbox. The processor's `LPUSH` of the result is the wake-up.
//! - **the sweep** (a Cluster, whose notifications are per node and would need a subscription
//!   per primary kept up through resharding and fail-over; a Redis that refuses notifications;
//!   `wakeup_mode: poll`): every [`SWEEP`], one pipelined `EXISTS` of every mailbox this replica
//!   waits on, in one round trip whatever their number, waking those that filled.
//!
//! A wait also reads its mailbox when it starts, when woken, and every [`RECHECK`] (a lost
//! notification, a subscription made again after a fail-over), so none waits for ever on a
//! missed event; nothing polls per wait.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use inferq_client::target::{Link, Target};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::config::Wakeup;
use super::keys::MAILBOX_PREFIX;

/// How often the sweep looks at the waited mailboxes.
pub const SWEEP: Duration = Duration::from_millis(200);
/// How often a wait reads its mailbox whatever it was told.
pub const RECHECK: Duration = Duration::from_secs(2);
/// Most mailboxes in one pipelined look.
const PER_LOOK: usize = 1000;

/// The waits of one replica, by mailbox.
#[derive(Debug, Default)]
pub struct Waiters {
    waits: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
    /// Whether keyspace notifications are the wake-up now (else the sweep is).
    notified: AtomicBool,
}

/// One registered wait: dropping it unregisters it.
#[derive(Debug)]
pub struct Registration<'a> {
    waiters: &'a Waiters,
    key: String,
    pub notify: Arc<Notify>,
}

impl Waiters {
    /// Registers a wait on `mailbox`.
    pub fn register(&self, mailbox: &str) -> Registration<'_> {
        let notify = match self.waits.lock() {
            Ok(mut waits) => {
                let entry = waits
                    .entry(mailbox.to_owned())
                    .or_insert_with(|| (Arc::new(Notify::new()), 0));
                entry.1 += 1;
                entry.0.clone()
            }
            Err(_) => Arc::new(Notify::new()),
        };
        Registration {
            waiters: self,
            key: mailbox.to_owned(),
            notify,
        }
    }

    /// Wakes the waits of `mailbox`.
    pub fn wake(&self, mailbox: &str) {
        if let Ok(waits) = self.waits.lock() {
            if let Some((n, _)) = waits.get(mailbox) {
                n.notify_waiters();
            }
        }
    }

    /// Wakes every wait (a subscription was just made: what it missed is read again).
    pub fn wake_all(&self) {
        if let Ok(waits) = self.waits.lock() {
            for (n, _) in waits.values() {
                n.notify_waiters();
            }
        }
    }

    /// Every waited mailbox.
    fn mailboxes(&self) -> Vec<String> {
        self.waits
            .lock()
            .map(|w| w.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Whether keyspace notifications wake the waits now.
    pub fn notified(&self) -> bool {
        self.notified.load(Ordering::Acquire)
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Ok(mut waits) = self.waiters.waits.lock() {
            if let Some(entry) = waits.get_mut(&self.key) {
                entry.1 = entry.1.saturating_sub(1);
                if entry.1 == 0 {
                    waits.remove(&self.key);
                }
            }
        }
    }
}

/// Whether `flags` (`notify-keyspace-events`) publish list events on keyspace channels.
pub fn has_list_events(flags: &str) -> bool {
    flags.contains('K') && (flags.contains('l') || flags.contains('A'))
}

/// Makes sure the node of `client` publishes list events on keyspace channels, adding `Kl` to
/// its flags when it does not; whether it does now.
async fn ensure_notifications(client: &redis::Client) -> Result<bool, redis::RedisError> {
    let mut con = client.get_multiplexed_async_connection().await?;
    let got: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(&mut con)
        .await?;
    let flags = got.get(1).cloned().unwrap_or_default();
    if has_list_events(&flags) {
        return Ok(true);
    }
    let wanted = format!("{flags}Kl");
    let set: Result<(), redis::RedisError> = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg(&wanted)
        .query_async(&mut con)
        .await;
    match set {
        Ok(()) => {
            tracing::info!(flags = %wanted, "front door: turned on keyspace notifications of lists (notify-keyspace-events) for the wait wake-up");
            Ok(true)
        }
        Err(e) => {
            tracing::info!(error = %e, "front door: Redis has no keyspace notifications of lists and refuses to turn them on; waits are woken by the sweep");
            Ok(false)
        }
    }
}

/// Wakes this replica's waits until `stop`, by keyspace notifications or the sweep (see the
/// module comment); a subscription is made again after any failure, on the node the target
/// names then (a Sentinel fail-over's new primary is asked for its flags again).
pub async fn run(
    target: Target,
    redis: Link,
    wakeup: Wakeup,
    waiters: Arc<Waiters>,
    stop: CancellationToken,
) {
    if target.is_cluster() || wakeup == Wakeup::Poll {
        tracing::info!("front door: waits are woken by the sweep");
        return sweep(redis, waiters, stop).await;
    }
    let db = redis::aio::ConnectionLike::get_db(&redis);
    let pattern = format!("__keyspace@{db}__:{MAILBOX_PREFIX}*");
    let mut failing = false;
    while !stop.is_cancelled() {
        let subscribed = async {
            let client = target.node_client().await.map_err(|e| e.to_string())?;
            if !ensure_notifications(&client)
                .await
                .map_err(|e| e.to_string())?
            {
                return Ok(None);
            }
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub
                .psubscribe(&pattern)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(Some(pubsub))
        };
        let pubsub = tokio::select! {
            _ = stop.cancelled() => return,
            s = subscribed => s,
        };
        match pubsub {
            Ok(None) => {
                waiters.notified.store(false, Ordering::Release);
                return sweep(redis, waiters, stop).await;
            }
            Ok(Some(mut pubsub)) => {
                if failing {
                    tracing::info!("front door: listening for results again");
                    failing = false;
                }
                waiters.notified.store(true, Ordering::Release);
                waiters.wake_all();
                let prefix_len = pattern.len() - 1 - MAILBOX_PREFIX.len();
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => match m {
                            Some(m) => {
                                let event: String = m.get_payload().unwrap_or_default();
                                if event == "lpush" || event == "rpush" {
                                    if let Some(key) = m.get_channel_name().get(prefix_len..) {
                                        waiters.wake(key);
                                    }
                                }
                            }
                            None => break,
                        },
                    }
                }
                waiters.notified.store(false, Ordering::Release);
                tracing::warn!("front door: the keyspace subscription ended (subscribing again)");
            }
            Err(e) => {
                waiters.notified.store(false, Ordering::Release);
                if !failing {
                    tracing::warn!(error = %e, "front door: cannot subscribe to keyspace notifications (retrying)");
                    failing = true;
                }
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(250)) => {}
        }
    }
}

/// The sweep: every [`SWEEP`], one pipelined `EXISTS` per waited mailbox; wakes those that are
/// there.
async fn sweep(mut redis: Link, waiters: Arc<Waiters>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(SWEEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mailboxes = waiters.mailboxes();
        for chunk in mailboxes.chunks(PER_LOOK) {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.exists(key);
            }
            let there: Result<Vec<bool>, _> = pipe.query_async(&mut redis).await;
            match there {
                Ok(there) => {
                    for (key, filled) in chunk.iter().zip(there) {
                        if filled {
                            waiters.wake(key);
                        }
                    }
                }
                Err(e) => {
                    tracing::debug!(error = %e, "front door: the sweep failed (the waits read again on their own)");
                    break;
                }
            }
        }
    }
}
