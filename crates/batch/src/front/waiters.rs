//! Waking the clients a replica holds: each open wait (wait mode, a stream, a long poll)
//! registers its request id here; one subscription per replica to the channel `collect-1.lua`
//! and `cancel-2.lua` PUBLISH ended ids on wakes the waits of that id, which then read the
//! record. Nothing polls Redis: a wait reads the record when it starts, when woken, and when
//! the subscription is (re)made (a message may have been missed while it was down).
//!
//! ```text
//!  collect-1.lua / cancel-2.lua ──PUBLISH {inferq-batch}:front:done <id>──▶ every replica's
//!  subscription ──wake(id)──▶ the waits of <id> ──read──▶ record + result ──▶ the answer
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use inferq_client::target::Target;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The waits of one replica, by request id.
#[derive(Debug, Default)]
pub struct Waiters {
    waits: Mutex<HashMap<String, (Arc<Notify>, usize)>>,
}

/// One registered wait: dropping it unregisters it.
#[derive(Debug)]
pub struct Registration<'a> {
    waiters: &'a Waiters,
    id: String,
    pub notify: Arc<Notify>,
}

impl Waiters {
    /// Registers a wait on `id`.
    pub fn register(&self, id: &str) -> Registration<'_> {
        let notify = match self.waits.lock() {
            Ok(mut waits) => {
                let entry = waits
                    .entry(id.to_owned())
                    .or_insert_with(|| (Arc::new(Notify::new()), 0));
                entry.1 += 1;
                entry.0.clone()
            }
            Err(_) => Arc::new(Notify::new()),
        };
        Registration {
            waiters: self,
            id: id.to_owned(),
            notify,
        }
    }

    /// Wakes the waits of `id`.
    pub fn wake(&self, id: &str) {
        if let Ok(waits) = self.waits.lock() {
            if let Some((n, _)) = waits.get(id) {
                n.notify_waiters();
            }
        }
    }

    /// Wakes every wait (the subscription was just made: what it missed is read again).
    pub fn wake_all(&self) {
        if let Ok(waits) = self.waits.lock() {
            for (n, _) in waits.values() {
                n.notify_waiters();
            }
        }
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Ok(mut waits) = self.waiters.waits.lock() {
            if let Some(entry) = waits.get_mut(&self.id) {
                entry.1 = entry.1.saturating_sub(1);
                if entry.1 == 0 {
                    waits.remove(&self.id);
                }
            }
        }
    }
}

/// Subscribes to `channel` until `stop`, waking the waits of each id announced; made again
/// after any failure (a Redis restart, a fail-over: a cluster or Sentinel target is asked for
/// a node again).
pub async fn listen(
    target: Target,
    channel: String,
    waiters: Arc<Waiters>,
    stop: CancellationToken,
) {
    let mut failing = false;
    while !stop.is_cancelled() {
        let subscribed = async {
            let client = target.node_client().await.map_err(|e| e.to_string())?;
            let mut pubsub = client.get_async_pubsub().await.map_err(|e| e.to_string())?;
            pubsub
                .subscribe(&channel)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(pubsub)
        };
        let pubsub = tokio::select! {
            _ = stop.cancelled() => return,
            s = subscribed => s,
        };
        match pubsub {
            Ok(mut pubsub) => {
                if failing {
                    tracing::info!("front door: listening for results again");
                    failing = false;
                }
                waiters.wake_all();
                let mut messages = pubsub.on_message();
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        m = messages.next() => match m {
                            Some(m) => {
                                if let Ok(id) = m.get_payload::<String>() {
                                    waiters.wake(&id);
                                }
                            }
                            None => break,
                        },
                    }
                }
                tracing::warn!("front door: the result subscription ended (reconnecting)");
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(error = %e, "front door: cannot subscribe to result announcements (retrying)");
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
