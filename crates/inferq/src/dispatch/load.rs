//! A byte bound on what a queue holds in memory. Two places hold payloads: claimed members
//! waiting in the pool channel for a worker (the consumer's intake) and outcomes waiting to be
//! written (the outbox). Each has a [`Load`] per queue.
//!
//! In: a [`Charge`] for each member or outcome while it is held ([`Load::charge`]; dropping the
//! charge gives its bytes back, whichever way the holder ends). Out: [`Load::has_room`],
//! [`Load::room_left`] and [`Load::room`], which the consumer and the pool ask before they take
//! on more; a wait for room ends when the bytes fall to the limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// The bytes a queue holds in one place, against the bound past which it takes on no more.
#[derive(Debug)]
pub struct Load {
    bytes: AtomicUsize,
    limit: usize,
    /// Rung when the bytes fall from above the limit to it or below.
    drained: Notify,
}

impl Load {
    pub fn new(limit: usize) -> Load {
        Load {
            bytes: AtomicUsize::new(0),
            limit,
            drained: Notify::new(),
        }
    }

    /// Counts `bytes` more until the returned charge is dropped.
    pub fn charge(self: &Arc<Self>, bytes: usize) -> Charge {
        self.bytes.fetch_add(bytes, Ordering::AcqRel);
        Charge {
            load: self.clone(),
            bytes,
        }
    }

    /// The bytes held now.
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Acquire)
    }

    /// How many bytes more may be taken on before the limit is reached.
    pub fn room_left(&self) -> usize {
        self.limit.saturating_sub(self.bytes())
    }

    /// Whether no more than the limit is held.
    pub fn has_room(&self) -> bool {
        self.bytes() <= self.limit
    }

    /// Returns once no more than the limit is held.
    pub async fn room(&self) {
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            if self.has_room() {
                return;
            }
            drained.await;
        }
    }
}

/// One member's or outcome's share of a [`Load`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    load: Arc<Load>,
    bytes: usize,
}

impl Charge {
    /// The bytes this share counts.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let load = &self.load;
        let before = load.bytes.fetch_sub(self.bytes, Ordering::AcqRel);
        // Only a fall to the limit can end a wait: the usual drop rings no one.
        if before > load.limit && before - self.bytes <= load.limit {
            load.drained.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn room_waits_until_the_held_bytes_drop_to_the_limit() {
        let load = Arc::new(Load::new(100));
        let first = load.charge(60);
        let second = load.charge(60);
        assert_eq!(load.bytes(), 120);
        assert!(!load.has_room());
        assert_eq!(load.room_left(), 0);
        let waiter = tokio::spawn({
            let load = load.clone();
            async move { load.room().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        drop(first);
        assert_eq!(load.bytes(), 60);
        assert_eq!(load.room_left(), 40);
        assert!(waiter.await.is_ok());
        drop(second);
        assert_eq!(load.bytes(), 0);
    }
}
