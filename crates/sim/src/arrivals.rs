//! When each request id reached the run stage: the server records the wall-clock time (Unix
//! microseconds) of every execution of an `x-inferq-request-id`, and the times leave as
//! `GET /arrivals` (`{"id": [t1, t2, ...]}`, oldest first) or [`super::Sim::arrivals`].
//! Benchmarks read them to measure enqueue→dispatch latency and how soon a killed processor's
//! requests run again. `GET /arrivals?prefix=P` returns only ids starting with `P`.
//!
//! At most `--remember-ids` ids are kept (spread over the shards); past that the id seen first
//! is forgotten, so a simulator serving for days stays bounded in memory.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasher, RandomState};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

/// Shards of the map, so concurrent handlers rarely meet on one lock.
const SHARDS: usize = 32;

/// Arrival times per request id, sharded by a hash of the id.
#[derive(Debug)]
pub(crate) struct Arrivals {
    hasher: RandomState,
    shards: Vec<Mutex<Shard>>,
    /// Ids one shard keeps before it forgets its oldest.
    per_shard: usize,
}

/// One shard's ids, with the order they were first seen in, to forget the oldest.
#[derive(Debug, Default)]
struct Shard {
    times: HashMap<Arc<str>, Vec<u64>>,
    order: VecDeque<Arc<str>>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Self::new(super::config::DEFAULT_REMEMBER_IDS)
    }
}

/// Now, in Unix microseconds.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Arrivals {
    /// Keeps the times of about `limit` ids (at least one per shard).
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard: limit.div_ceil(SHARDS).max(1),
        }
    }

    /// Records that `id` reached the run stage now. True when an older id was forgotten to
    /// make room for it.
    pub(crate) fn record(&self, id: &str) -> bool {
        self.record_at(id, unix_us())
    }

    fn record_at(&self, id: &str, at_us: u64) -> bool {
        let shard = &self.shards[self.hasher.hash_one(id) as usize % SHARDS];
        // A poisoned shard only means a panic elsewhere mid-insert; the times are still usable.
        let mut shard = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(times) = shard.times.get_mut(id) {
            times.push(at_us);
            return false;
        }
        let id: Arc<str> = Arc::from(id);
        shard.times.insert(id.clone(), vec![at_us]);
        shard.order.push_back(id);
        if shard.order.len() <= self.per_shard {
            return false;
        }
        if let Some(oldest) = shard.order.pop_front() {
            shard.times.remove(&oldest);
        }
        true
    }

    /// Copies the times of every id starting with `prefix` ("" for all).
    pub(crate) fn snapshot(&self, prefix: &str) -> HashMap<String, Vec<u64>> {
        let mut all = HashMap::new();
        for shard in &self.shards {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.extend(
                shard
                    .times
                    .iter()
                    .filter(|(id, _)| id.starts_with(prefix))
                    .map(|(id, times)| (id.to_string(), times.clone())),
            );
        }
        all
    }
}

impl Arrivals {
    /// How many times each id was admitted to run (`GET /executions`).
    pub(crate) fn counts(&self) -> HashMap<String, u64> {
        let mut all = HashMap::new();
        for shard in &self.shards {
            let shard = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.extend(
                shard
                    .times
                    .iter()
                    .map(|(id, times)| (id.to_string(), times.len() as u64)),
            );
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_id_across_shards() {
        let arrivals = Arrivals::default();
        for i in 0..100 {
            for _ in 0..(i % 3 + 1) {
                arrivals.record(&format!("id-{i}"));
            }
        }
        let snap = arrivals.counts();
        assert_eq!(snap.len(), 100);
        assert_eq!(snap["id-0"], 1);
        assert_eq!(snap["id-5"], 3);
        assert_eq!(snap.values().sum::<u64>(), 199);
    }

    #[test]
    fn times_are_kept_per_id_in_order_and_filtered_by_prefix() {
        let arrivals = Arrivals::default();
        arrivals.record_at("a-1", 10);
        arrivals.record_at("b-1", 11);
        arrivals.record_at("a-1", 12);
        let all = arrivals.snapshot("");
        assert_eq!(all.len(), 2);
        assert_eq!(all["a-1"], vec![10, 12]);
        let only_a = arrivals.snapshot("a-");
        assert_eq!(only_a.len(), 1);
        assert!(only_a.contains_key("a-1"));
    }

    #[test]
    fn the_ids_seen_first_are_forgotten_past_the_limit() {
        let arrivals = Arrivals::new(SHARDS * 2);
        let mut forgotten = 0;
        for i in 0..SHARDS * 50 {
            let id = format!("id-{i}");
            forgotten += usize::from(arrivals.record(&id));
            // Seen again: its times grow, nothing is forgotten for it.
            assert!(!arrivals.record(&id));
        }
        let kept = arrivals.counts();
        assert_eq!(kept.len() + forgotten, SHARDS * 50);
        assert!(kept.len() <= SHARDS * 2, "{} kept", kept.len());
        assert!(kept.values().all(|&n| n == 2));
        // The newest id of each shard is kept; the very first is long gone.
        assert!(kept.contains_key(&format!("id-{}", SHARDS * 50 - 1)));
        assert!(!kept.contains_key("id-0"));
    }

    #[test]
    fn record_uses_the_wall_clock() {
        let arrivals = Arrivals::default();
        let before = unix_us();
        arrivals.record("x");
        let times = &arrivals.snapshot("x")["x"];
        assert!(times[0] >= before && times[0] <= unix_us());
    }
}
