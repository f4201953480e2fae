//! When each request id reached the run stage: the server records the wall-clock time (Unix
//! microseconds) of every execution of an `x-inferq-request-id`, and the times leave as
//! `GET /arrivals` (`{"id": [t1, t2, ...]}`, oldest first) or [`super::Sim::arrivals`].
//! Benchmarks read them to measure enqueue→dispatch latency and how soon a killed processor's
//! requests run again. `GET /arrivals?prefix=P` returns only ids starting with `P`.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

/// Shards of the map, so concurrent handlers rarely meet on one lock.
const SHARDS: usize = 32;

/// Arrival times per request id, sharded by a hash of the id.
#[derive(Debug)]
pub struct Arrivals {
    hasher: RandomState,
    shards: Vec<Mutex<HashMap<String, Vec<u64>>>>,
}

impl Default for Arrivals {
    fn default() -> Self {
        Self {
            hasher: RandomState::new(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// Now, in Unix microseconds.
pub fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Arrivals {
    /// Records that `id` reached the run stage now.
    pub fn record(&self, id: &str) {
        self.record_at(id, unix_us());
    }

    fn record_at(&self, id: &str, at_us: u64) {
        let shard = &self.shards[self.hasher.hash_one(id) as usize % SHARDS];
        // A poisoned shard only means a panic elsewhere mid-insert; the times are still usable.
        let mut map = shard
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match map.get_mut(id) {
            Some(times) => times.push(at_us),
            None => {
                map.insert(id.to_owned(), vec![at_us]);
            }
        }
    }

    /// Copies the times of every id starting with `prefix` ("" for all).
    pub fn snapshot(&self, prefix: &str) -> HashMap<String, Vec<u64>> {
        let mut all = HashMap::new();
        for shard in &self.shards {
            let map = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.extend(
                map.iter()
                    .filter(|(id, _)| id.starts_with(prefix))
                    .map(|(id, times)| (id.clone(), times.clone())),
            );
        }
        all
    }
}

impl Arrivals {
    /// How many times each id was admitted to run (`GET /executions`).
    pub fn counts(&self) -> HashMap<String, u64> {
        let mut all = HashMap::new();
        for shard in &self.shards {
            let map = shard
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            all.extend(
                map.iter()
                    .map(|(id, times)| (id.clone(), times.len() as u64)),
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
    fn record_uses_the_wall_clock() {
        let arrivals = Arrivals::default();
        let before = unix_us();
        arrivals.record("x");
        let times = &arrivals.snapshot("x")["x"];
        assert!(times[0] >= before && times[0] <= unix_us());
    }
}
