//! The conditions of one queue's lane that its tasks tell each other, with who sets them,
//! who clears them and who acts on them in one place. Each is a flag, read without a lock on
//! every round of the loop that acts on it; the transitions are named for the event that makes
//! them, so a reader of `ctx.state.retire()` need not look up what a stored `true` means.
//!
//! | condition | set by | cleared by | acted on by |
//! |---|---|---|---|
//! | outbox stalled: outcomes it cannot write | the outbox, when Redis is out of reach or refuses this queue's results ([`LaneState::outbox_blocked`]) | the outbox, once they are written ([`LaneState::outbox_flowing`]) | the consumer claims no more; the reclaimer waits for them to land before reclaiming |
//! | Redis lost: a call of this lane could not reach Redis | the consumer, upkeep and outbox on such a failure ([`LaneState::lost_redis`]) | the reclaimer, a lease after Redis answers again ([`LaneState::outage_over`]) | the reclaimer gives live owners that lease to renew before it reclaims |
//! | seen empty: the consumer's last poll found nothing | the consumer, after each poll ([`LaneState::polled`]) | the consumer, after a poll that found work | `fair-share`'s discovery takes an empty found queue off the index of queues with work |
//! | retired: a queues reload removed the lane | [`super::lanes`] when it retires the lane ([`LaneState::retire`]) | never: a retired lane is not revived, a new one is made | the pool releases the lane's waiting requests back to pending instead of starting them |

use std::sync::atomic::{AtomicBool, Ordering};

/// A lane's conditions (see the module's table).
#[derive(Debug, Default)]
pub struct LaneState {
    outbox_stalled: AtomicBool,
    redis_lost: AtomicBool,
    seen_empty: AtomicBool,
    retired: AtomicBool,
}

impl LaneState {
    /// The outbox holds outcomes Redis will not take yet.
    pub fn outbox_blocked(&self) {
        self.outbox_stalled.store(true, Ordering::SeqCst);
    }

    /// The outbox wrote what it held.
    pub fn outbox_flowing(&self) {
        self.outbox_stalled.store(false, Ordering::SeqCst);
    }

    /// Whether the outbox holds outcomes Redis will not take yet.
    pub fn is_outbox_stalled(&self) -> bool {
        self.outbox_stalled.load(Ordering::SeqCst)
    }

    /// A call of this lane could not reach Redis.
    pub fn lost_redis(&self) {
        self.redis_lost.store(true, Ordering::SeqCst);
    }

    /// Redis answered and a lease has passed since: the outage is over for the reclaimer.
    pub fn outage_over(&self) {
        self.redis_lost.store(false, Ordering::SeqCst);
    }

    /// Whether a call of this lane failed to reach Redis since the last outage ended.
    pub fn is_redis_lost(&self) -> bool {
        self.redis_lost.load(Ordering::SeqCst)
    }

    /// The consumer polled and found `seen` requests.
    pub fn polled(&self, seen: usize) {
        self.seen_empty.store(seen == 0, Ordering::SeqCst);
    }

    /// Whether the consumer's last poll found the queue empty.
    pub fn is_seen_empty(&self) -> bool {
        self.seen_empty.load(Ordering::SeqCst)
    }

    /// The lane is removed: what still waits for a worker goes back to pending.
    pub fn retire(&self) {
        self.retired.store(true, Ordering::SeqCst);
    }

    /// Whether the lane was removed.
    pub fn is_retired(&self) -> bool {
        self.retired.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each transition moves only its own condition: a stalled outbox during an outage, cleared
    /// when its outcomes land, leaves the outage for the reclaimer to end, and retiring the lane
    /// changes neither.
    #[test]
    fn transitions_move_only_their_own_condition() {
        let state = LaneState::default();
        assert!(!state.is_outbox_stalled() && !state.is_redis_lost() && !state.is_retired());
        state.lost_redis();
        state.outbox_blocked();
        assert!(state.is_outbox_stalled() && state.is_redis_lost());
        state.outbox_flowing();
        assert!(!state.is_outbox_stalled());
        assert!(state.is_redis_lost(), "only the reclaimer ends an outage");
        state.retire();
        assert!(state.is_retired() && state.is_redis_lost() && !state.is_outbox_stalled());
        state.outage_over();
        assert!(!state.is_redis_lost() && state.is_retired());
    }
}
