//! Where a poll looks down its queue, and how far: the byte bound that sizes each peek
//! ([`Bound`]), the spread of racing instances past the head ([`Spread`]), the limits of one
//! look, and the requests passed over until the next tick ([`TurnedAway`]). The consumer keeps
//! them from poll to poll; [`super::poll`] reads and updates them.

use std::collections::HashMap;

/// How many members a peek asks for while their size is unknown (no member seen yet): a queue
/// of members of many megabytes is not first read a whole batch at a time.
pub(super) const FIRST_LOOK: usize = 16;

/// How many bytes of members one poll may claim, and the size of the largest member the last
/// poll peeked at, which sizes this poll's peek (and is updated by it).
pub(super) struct Bound<'a> {
    pub(super) budget: usize,
    pub(super) largest: &'a mut usize,
    /// Polls failed in a row before this one: each halves the peek, so a read too big for
    /// Redis to answer in time (or at all) is not asked for again and again at the same size.
    pub(super) failures: u32,
    /// How many members a peek asks for while none has been seen: [`FIRST_LOOK`], or a
    /// `fair-share` lane's whole turn (already bounded by its burst).
    pub(super) first_look: usize,
}

impl Bound<'_> {
    /// How many members a peek may ask for, at most `page`: as many as the budget holds at the
    /// size of the largest member seen (last poll, or this one so far), `first_look` while
    /// none has been seen, halved for each poll failed in a row; at least one.
    pub(super) fn page(&self, page: usize, seen_largest: usize) -> usize {
        let known = (*self.largest).max(seen_largest);
        let fits = match self.budget.checked_div(known) {
            Some(fits) => fits.max(1),
            None => self.first_look,
        };
        page.min(fits)
            .checked_shr(self.failures)
            .unwrap_or(0)
            .max(1)
    }
}

/// How far down the queue a poll starts to look while other instances take the same requests.
///
/// Every instance with room peeks the head of the queue, and when two peek it at once, the
/// first claim takes the batch and the second finds it gone: its peek, its decoding and its
/// claim were for nothing, and it peeks the new head straight away, alongside the others that
/// lost. Eight busy instances on one queue spent seven claims for each that took anything
/// (Redis's CPU per request doubled). An instance that keeps losing starts its polls at a
/// random one of `2^level` windows of a batch each (level up to [`MAX_SPREAD`]), so instances
/// racing for work spread over the first few batches of the queue instead of all taking the
/// head; every [`CLEAN_POLLS`] polls in a row that lose nothing bring it one level back towards
/// the head, and so does a poll that finds the queue shorter than where it started. A queue
/// served by one instance never leaves the head. Requests are then taken out of deadline
/// order by at most `2^MAX_SPREAD` batches, which latency-insensitive work does not notice.
#[derive(Default)]
pub(super) struct Spread {
    level: u32,
    /// Polls in a row that lost nothing.
    clean: u32,
}

/// At most `2^MAX_SPREAD` windows: with batches of 256, a poll starts within the first 4,096
/// requests of the queue (and never past [`MAX_LOOK`]`/ 2`).
const MAX_SPREAD: u32 = 4;

/// Polls in a row that lose nothing before a poll starts one level nearer the head. Coming
/// back at once after every clean poll put the instances back on the head together: in drains
/// of 40,000 requests by four and by eight instances, a level back after 4–16 clean polls lost
/// a third to a half as many requests to other instances as a level back after each one.
const CLEAN_POLLS: u32 = 8;

impl Spread {
    /// Where the next poll of `want` members starts: the head, or a random window past it.
    pub(super) fn start(&self, want: usize) -> usize {
        if self.level == 0 {
            return 0;
        }
        let windows = 1usize << self.level;
        let window = rand::random_range(0..windows);
        window.saturating_mul(want).min(MAX_LOOK / 2)
    }

    /// Learns from a poll that claimed `admitted` members of which `lost` were gone (taken by
    /// another instance between the peek and the claim), and that found the queue shorter than
    /// its start when `overshot`.
    pub(super) fn note(&mut self, admitted: usize, lost: usize, overshot: bool) {
        if overshot {
            // Too short a queue to spread over this many windows.
            self.level = self.level.saturating_sub(1);
        }
        if admitted > 0 && lost.saturating_mul(2) >= admitted {
            self.level = (self.level + 1).min(MAX_SPREAD);
            self.clean = 0;
        } else if lost == 0 {
            self.clean += 1;
            if self.clean >= CLEAN_POLLS {
                self.level = self.level.saturating_sub(1);
                self.clean = 0;
            }
        }
    }
}

/// With a gate, a poll's first look reaches this many times further than it may take, so a
/// few requests the gate refuses at the head cost no second look.
pub(super) const GATED_LOOKAHEAD: usize = 4;

/// How many members one poll looks at, at most, page after page, for requests it may take past
/// those it may not take now (turned away by the gate, or held back by the last-chance rule):
/// past that many at the head, the requests behind them wait until the head clears.
pub(super) const MAX_LOOK: usize = 10_000;

/// Requests (by claim key) the queue gate turned away lately, or that the last-chance rule held
/// back, each with the time until which it is not asked again: Go puts a refused request to the
/// gate once per poll tick, and so does inferq, however often it polls for the work behind it.
/// Each entry lasts one tick.
#[derive(Default)]
pub(super) struct TurnedAway {
    until: HashMap<String, tokio::time::Instant>,
}

impl TurnedAway {
    pub(super) fn is_empty(&self) -> bool {
        self.until.is_empty()
    }

    pub(super) fn is_recent(&self, key: &str, now: tokio::time::Instant) -> bool {
        self.until.get(key).is_some_and(|until| *until > now)
    }

    pub(super) fn note(&mut self, key: String, until: tokio::time::Instant) {
        self.until.insert(key, until);
    }

    pub(super) fn forget_before(&mut self, now: tokio::time::Instant) {
        self.until.retain(|_, until| *until > now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(budget: usize, largest: usize, failures: u32, seen: usize, page: usize) -> usize {
        let mut largest = largest;
        Bound {
            budget,
            largest: &mut largest,
            failures,
            first_look: FIRST_LOOK,
        }
        .page(page, seen)
    }

    #[test]
    fn a_lone_instance_always_starts_at_the_head() {
        let mut spread = Spread::default();
        for _ in 0..100 {
            spread.note(256, 0, false);
            assert_eq!(spread.start(256), 0);
        }
    }

    #[test]
    fn instances_that_keep_losing_spread_over_more_windows_and_come_back() {
        let mut spread = Spread::default();
        // Half a batch lost is a race lost.
        spread.note(256, 128, false);
        assert_eq!(spread.level, 1);
        for _ in 0..10 {
            spread.note(256, 256, false);
        }
        assert_eq!(spread.level, MAX_SPREAD);
        let starts: std::collections::BTreeSet<usize> =
            (0..2000).map(|_| spread.start(256)).collect();
        let windows: Vec<usize> = (0..1 << MAX_SPREAD).map(|w| w * 256).collect();
        assert_eq!(starts.into_iter().collect::<Vec<_>>(), windows);
        // Huge batches never start past half of the furthest a poll may look.
        assert!((0..200).all(|_| spread.start(5_000) <= MAX_LOOK / 2));
        // A few lost members are no race; clean polls bring it back a level at a time.
        spread.note(256, 3, false);
        assert_eq!(spread.level, MAX_SPREAD);
        for _ in 0..CLEAN_POLLS - 1 {
            spread.note(256, 0, false);
        }
        assert_eq!(spread.level, MAX_SPREAD);
        spread.note(256, 0, false);
        assert_eq!(spread.level, MAX_SPREAD - 1);
        // A queue shorter than the start brings it back at once.
        spread.note(0, 0, true);
        assert_eq!(spread.level, MAX_SPREAD - 2);
    }

    #[test]
    fn a_peek_is_sized_by_the_bytes_it_may_claim() {
        let mib = 1 << 20;
        // Small members: the batch.
        assert_eq!(page(64 * mib, 300, 0, 0, 256), 256);
        // 8 MB members: as many as 64 MiB holds.
        assert_eq!(page(64 * mib, 8 * mib, 0, 0, 256), 8);
        // Bigger than the whole budget, or no budget left: still one.
        assert_eq!(page(64 * mib, 100 * mib, 0, 0, 256), 1);
        assert_eq!(page(0, 300, 0, 0, 256), 1);
        // Nothing seen yet: a first look, not a whole batch; a small batch as it is.
        assert_eq!(page(64 * mib, 0, 0, 0, 256), FIRST_LOOK);
        assert_eq!(page(64 * mib, 0, 0, 0, 10), 10);
        // A big member seen earlier in this poll counts as the last poll's would.
        assert_eq!(page(64 * mib, 300, 0, 16 * mib, 256), 4);
    }

    #[test]
    fn failed_polls_in_a_row_shrink_the_peek_to_one() {
        let mib = 1 << 20;
        assert_eq!(page(64 * mib, 300, 1, 0, 256), 128);
        assert_eq!(page(64 * mib, 300, 3, 0, 256), 32);
        assert_eq!(page(64 * mib, 300, 8, 0, 256), 1);
        assert_eq!(page(64 * mib, 300, 10_000, 0, 256), 1);
        assert_eq!(page(64 * mib, 0, 2, 0, 256), FIRST_LOOK / 4);
    }
}
