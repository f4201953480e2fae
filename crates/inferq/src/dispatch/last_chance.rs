//! Keeps a poison request from taking innocent requests to the dead list with it.
//!
//! A lease expiry counts a delivery against *every* claim the dead instance held, not just the
//! one that killed it; and after a reclaim the poison and its fellow victims go back to pending
//! side by side, so the next instance tends to claim them in one batch and die with all of them
//! again. Left alone, the requests next to a poison reach `max_deliveries` together with it.
//!
//! The rule: a request on its last chance (its next lease expiry would dead-letter it:
//! deliveries ≥ `max_deliveries − 1`, and at least 1) is claimed by an instance only while that
//! instance holds no other last-chance request of the queue. Two last-chance requests are then
//! never in one process, so a crash can push at most one of them — the one being run — over the
//! limit; a victim is charged at most up to its last chance, and the poison alone is buried.
//! Ordinary crashes are not slowed: the rule bites only at the last delivery.
//!
//! The consumer asks [`LastChance::threshold`] which peeked requests are on their last chance
//! and [`LastChance::try_take`] for the one slot; the [`Slot`] travels with the job, then with
//! its outcome through the outbox, and frees the slot once the outcome is written (or given up).
//! Freed any earlier, a second last-chance request could start while the first one's ack is
//! still unwritten, and a crash then would push the first over the limit although it succeeded.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One queue's last-chance slot in this instance.
#[derive(Debug, Default, Clone)]
pub struct LastChance {
    taken: Arc<AtomicBool>,
}

/// The slot, held by one job.
#[derive(Debug)]
pub struct Slot {
    taken: Arc<AtomicBool>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.taken.store(false, Ordering::SeqCst);
    }
}

impl LastChance {
    /// Deliveries from which a request is on its last chance.
    pub fn threshold(max_deliveries: u32) -> u64 {
        u64::from(max_deliveries.saturating_sub(1).max(1))
    }

    /// The slot, if no other job of this queue holds it.
    pub fn try_take(&self) -> Option<Slot> {
        self.taken
            .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| Slot {
                taken: self.taken.clone(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_slot_freed_when_its_job_is_done() {
        let lc = LastChance::default();
        let slot = lc.try_take().unwrap();
        assert!(lc.try_take().is_none());
        drop(slot);
        assert!(lc.try_take().is_some());
    }

    #[test]
    fn the_last_delivery_before_the_limit() {
        assert_eq!(LastChance::threshold(5), 4);
        assert_eq!(LastChance::threshold(3), 2);
        assert_eq!(LastChance::threshold(2), 1);
        assert_eq!(LastChance::threshold(1), 1);
    }
}
