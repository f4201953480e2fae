//! Which in-flight requests an eviction takes: the `eviction-sheddable-filter` (priority < 0
//! only) and the `eviction-priority-then-time-ordering` (lowest priority first, and among equals
//! the most recently dispatched, which has done the least work). Candidates enter as plain
//! values; the chosen ids leave, so the order is tested without a router.

use std::time::Instant;

/// An in-flight request as eviction sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Candidate {
    pub id: u64,
    pub priority: i32,
    pub dispatched: Instant,
}

/// Whether a request may be evicted at all: sheddable (priority < 0).
pub(super) fn evictable(c: &Candidate) -> bool {
    c.priority < 0
}

/// Up to `n` victims for a demand of priority `demand`, in eviction order; none at or above
/// the demand's priority.
pub(super) fn choose(candidates: &[Candidate], n: usize, demand: i32) -> Vec<u64> {
    let mut eligible: Vec<&Candidate> = candidates.iter().filter(|c| evictable(c)).collect();
    eligible.sort_by(|a, b| {
        a.priority
            .cmp(&b.priority)
            .then(b.dispatched.cmp(&a.dispatched))
    });
    eligible
        .into_iter()
        .take_while(|c| c.priority < demand)
        .take(n)
        .map(|c| c.id)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn at(t0: Instant, id: u64, priority: i32, ms: u64) -> Candidate {
        Candidate {
            id,
            priority,
            dispatched: t0 + Duration::from_millis(ms),
        }
    }

    #[test]
    fn lowest_priority_first_then_newest_and_never_the_unsheddable() {
        let t0 = Instant::now();
        let candidates = [
            at(t0, 1, -1, 0),
            at(t0, 2, -1, 30),
            at(t0, 3, -2, 10),
            at(t0, 4, 0, 40),
            at(t0, 5, -1, 20),
            at(t0, 6, 5, 50),
        ];
        assert_eq!(choose(&candidates, 10, 0), vec![3, 2, 5, 1]);
        assert_eq!(choose(&candidates, 2, 0), vec![3, 2]);
        // A demand of priority -1 may take only what is below it.
        assert_eq!(choose(&candidates, 10, -1), vec![3]);
        assert!(choose(&candidates, 10, -2).is_empty());
    }
}
