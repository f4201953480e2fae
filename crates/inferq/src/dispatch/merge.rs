//! How a pool takes its next request from its queues' channels (go-compat §7.2, §7.4):
//!
//! - [`RandomRobin`] (`random-robin`): uniformly at random among the queues that have one ready,
//!   so no queue can starve another;
//! - [`TierPriority`] (`tier-priority`): the most urgent [`tier_bucket`] first, round-robin among
//!   queues whose next request is in the same bucket;
//! - [`FairShare`] (`fair-share`, in [`super::fair_share`]): weighted fair share among the
//!   queues' tenants, earliest deadline first within one.
//!
//! Requests enter from the consumers' channels and leave to the pool's workers. Neither merge
//! holds more than one request per queue beyond what the channels hold: Go's tier-priority reads
//! up to 1,000 requests per bucket ahead; here each queue's next request is looked at, and the
//! queue's own order is kept (Go may take a `reserved` request of a queue before an `overflow` one
//! that came first).

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::task::Poll;

use tokio::sync::mpsc::Receiver;

pub use super::fair_share::{FairShare, TenantSlot};

/// A request's tier-priority bucket, 0 (most urgent) to 5: `class × 3 + tier`, where class is 0
/// for a request a gate classified `reserved` and 1 otherwise, and tier is 0 for `interactive`, 1
/// for `async` and 2 for anything else (`batch`, missing) in the label `tier_label`.
pub fn tier_bucket(labels: &BTreeMap<String, String>, tier_label: &str) -> u8 {
    let class = match labels.get("classification").map(String::as_str) {
        Some("reserved") => 0,
        _ => 1,
    };
    let tier = match labels.get(tier_label).map(String::as_str) {
        Some("interactive") => 0,
        Some("async") => 1,
        _ => 2,
    };
    class * 3 + tier
}

/// A pool's merge, as its policy says.
#[derive(Debug)]
pub enum Merge<T> {
    Random(RandomRobin<T>),
    Tier(TierPriority<T>),
    Fair(FairShare<T>),
}

impl<T> Merge<T> {
    /// The next request; `None` once every input is closed and empty. Cancel-safe: a request
    /// is taken from its input only when it is returned.
    pub async fn next(&mut self) -> Option<T> {
        match self {
            Merge::Random(m) => m.next().await,
            Merge::Tier(m) => m.next().await,
            Merge::Fair(m) => m.next().await,
        }
    }

    /// The tenant slot of the request `next` returned last (`fair-share` with a cap): the
    /// worker holds it until the request ends.
    pub fn take_slot(&mut self) -> Option<TenantSlot> {
        match self {
            Merge::Fair(m) => m.take_slot(),
            _ => None,
        }
    }

    /// Adds the channel of a queue the pool serves from now on (a queues config reload).
    pub fn add(&mut self, input: Receiver<T>) {
        match self {
            Merge::Random(m) => m.inputs.push(input),
            Merge::Tier(m) => m.add(input),
            Merge::Fair(m) => m.add(input),
        }
    }

    /// Whether no input is left (every one closed and emptied, or none given).
    pub fn is_empty(&self) -> bool {
        match self {
            Merge::Random(m) => m.inputs.is_empty(),
            Merge::Tier(m) => m.inputs.is_empty(),
            Merge::Fair(m) => m.inputs.is_empty(),
        }
    }
}

/// The `tier-priority` merge: each queue's next request is staged with its bucket, and the most
/// urgent staged one goes first; ties go round-robin from the queue after the last one taken.
pub struct TierPriority<T> {
    inputs: Vec<Receiver<T>>,
    staged: Vec<Option<(u8, T)>>,
    open: Vec<bool>,
    bucket: Box<dyn Fn(&T) -> u8 + Send + Sync>,
    next_start: usize,
}

impl<T> std::fmt::Debug for TierPriority<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TierPriority").finish_non_exhaustive()
    }
}

impl<T> TierPriority<T> {
    pub fn new(inputs: Vec<Receiver<T>>, bucket: Box<dyn Fn(&T) -> u8 + Send + Sync>) -> Self {
        let n = inputs.len();
        TierPriority {
            inputs,
            staged: (0..n).map(|_| None).collect(),
            open: vec![true; n],
            bucket,
            next_start: 0,
        }
    }

    fn add(&mut self, input: Receiver<T>) {
        self.inputs.push(input);
        self.staged.push(None);
        self.open.push(true);
    }

    /// Forgets the inputs that are closed and have nothing staged (a removed queue's).
    fn prune(&mut self) {
        let mut i = 0;
        while i < self.inputs.len() {
            if self.open[i] || self.staged[i].is_some() {
                i += 1;
                continue;
            }
            self.inputs.remove(i);
            self.staged.remove(i);
            self.open.remove(i);
            if self.next_start > i {
                self.next_start -= 1;
            }
        }
        if self.next_start >= self.inputs.len() {
            self.next_start = 0;
        }
    }

    /// The most urgent ready request; `None` once every input is closed and nothing is staged.
    pub async fn next(&mut self) -> Option<T> {
        poll_fn(|cx| {
            self.prune();
            let n = self.inputs.len();
            for i in 0..n {
                if self.staged[i].is_some() || !self.open[i] {
                    continue;
                }
                match self.inputs[i].poll_recv(cx) {
                    Poll::Ready(Some(item)) => self.staged[i] = Some(((self.bucket)(&item), item)),
                    Poll::Ready(None) => self.open[i] = false,
                    Poll::Pending => {}
                }
            }
            let start = self.next_start;
            let best = (0..n)
                .map(|k| (start + k) % n)
                .filter_map(|i| self.staged[i].as_ref().map(|(b, _)| (*b, i)))
                .min_by_key(|(b, _)| *b);
            if let Some((_, i)) = best {
                self.next_start = (i + 1) % n;
                return Poll::Ready(self.staged[i].take().map(|(_, item)| item));
            }
            if self.open.iter().any(|o| *o) {
                Poll::Pending
            } else {
                self.prune();
                Poll::Ready(None)
            }
        })
        .await
    }
}

/// The queues feeding one pool.
#[derive(Debug)]
pub struct RandomRobin<T> {
    inputs: Vec<Receiver<T>>,
}

impl<T> RandomRobin<T> {
    pub fn new(inputs: Vec<Receiver<T>>) -> Self {
        RandomRobin { inputs }
    }

    /// The next item from a random ready input; `None` once every input is closed and empty.
    pub async fn next(&mut self) -> Option<T> {
        poll_fn(|cx| {
            let n = self.inputs.len();
            if n == 0 {
                return Poll::Ready(None);
            }
            let start = rand::random_range(0..n);
            let mut closed = Vec::new();
            for i in 0..n {
                let idx = (start + i) % n;
                match self.inputs[idx].poll_recv(cx) {
                    Poll::Ready(Some(item)) => return Poll::Ready(Some(item)),
                    Poll::Ready(None) => closed.push(idx),
                    Poll::Pending => {}
                }
            }
            closed.sort_unstable();
            for idx in closed.into_iter().rev() {
                self.inputs.swap_remove(idx);
            }
            if self.inputs.is_empty() {
                Poll::Ready(None)
            } else {
                Poll::Pending
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::sync::mpsc::channel;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn buckets_order_class_then_tier() {
        let b = |pairs: &[(&str, &str)]| tier_bucket(&labels(pairs), "tier");
        assert_eq!(
            b(&[("classification", "reserved"), ("tier", "interactive")]),
            0
        );
        assert_eq!(b(&[("classification", "reserved"), ("tier", "async")]), 1);
        assert_eq!(b(&[("classification", "reserved"), ("tier", "batch")]), 2);
        assert_eq!(b(&[("tier", "interactive")]), 3);
        assert_eq!(b(&[("classification", "overflow"), ("tier", "async")]), 4);
        assert_eq!(b(&[]), 5);
        assert_eq!(tier_bucket(&labels(&[("class", "async")]), "class"), 4);
    }

    #[tokio::test]
    async fn the_most_urgent_queue_goes_first_and_equals_take_turns() {
        // Items are (bucket, name); three queues, two of them in the same bucket.
        let (batch_tx, batch_rx) = channel(10);
        let (a_tx, a_rx) = channel(10);
        let (b_tx, b_rx) = channel(10);
        for i in 0..3 {
            batch_tx.send((5u8, format!("batch{i}"))).await.unwrap();
            a_tx.send((3u8, format!("a{i}"))).await.unwrap();
            b_tx.send((3u8, format!("b{i}"))).await.unwrap();
        }
        drop((batch_tx, a_tx, b_tx));
        let mut merge = TierPriority::new(
            vec![batch_rx, a_rx, b_rx],
            Box::new(|item: &(u8, String)| item.0),
        );
        let mut order = Vec::new();
        while let Some((_, name)) = merge.next().await {
            order.push(name);
        }
        assert_eq!(
            order,
            ["a0", "b0", "a1", "b1", "a2", "b2", "batch0", "batch1", "batch2"]
        );
    }

    #[tokio::test]
    async fn a_waiting_urgent_request_is_not_passed_by_a_staged_later_one() {
        let (low_tx, low_rx) = channel(10);
        let (high_tx, high_rx) = channel(10);
        let mut merge = TierPriority::new(vec![low_rx, high_rx], Box::new(|b: &u8| *b));
        low_tx.send(5).await.unwrap();
        low_tx.send(5).await.unwrap();
        assert_eq!(merge.next().await, Some(5));
        // The low queue's next request is staged when the urgent one arrives: urgent goes first.
        high_tx.send(0).await.unwrap();
        assert_eq!(merge.next().await, Some(0));
        assert_eq!(merge.next().await, Some(5));
        drop((low_tx, high_tx));
        assert_eq!(merge.next().await, None);
    }

    #[tokio::test]
    async fn takes_from_every_ready_queue_and_ends_when_all_close() {
        let (a_tx, a_rx) = channel(1000);
        let (b_tx, b_rx) = channel(1000);
        for i in 0..500 {
            a_tx.send(("a", i)).await.unwrap();
            b_tx.send(("b", i)).await.unwrap();
        }
        drop((a_tx, b_tx));
        let mut merge = RandomRobin::new(vec![a_rx, b_rx]);
        let mut first_half_a = 0;
        for _ in 0..500 {
            if merge.next().await.unwrap().0 == "a" {
                first_half_a += 1;
            }
        }
        // Both queues had work: each gets roughly half of the first 500 picks.
        assert!((150..350).contains(&first_half_a), "{first_half_a}");
        let mut rest = 0;
        while merge.next().await.is_some() {
            rest += 1;
        }
        assert_eq!(rest, 500);
    }

    /// A queue added by a reload is served; a removed one (its channel closed) is forgotten
    /// once emptied, by both merges.
    #[tokio::test]
    async fn queues_come_and_go() {
        for tier in [false, true] {
            let (a_tx, a_rx) = channel::<u8>(4);
            let mut merge = if tier {
                Merge::Tier(TierPriority::new(vec![a_rx], Box::new(|b: &u8| *b)))
            } else {
                Merge::Random(RandomRobin::new(vec![a_rx]))
            };
            let (b_tx, b_rx) = channel::<u8>(4);
            merge.add(b_rx);
            b_tx.send(2).await.unwrap();
            assert_eq!(merge.next().await, Some(2));
            a_tx.send(1).await.unwrap();
            drop(a_tx);
            assert_eq!(merge.next().await, Some(1));
            drop(b_tx);
            assert_eq!(merge.next().await, None);
            assert!(merge.is_empty(), "tier {tier}");
        }
    }

    #[tokio::test]
    async fn a_busy_queue_does_not_block_an_idle_one() {
        let (a_tx, a_rx) = channel::<u32>(1);
        let (b_tx, b_rx) = channel::<u32>(1);
        let mut merge = RandomRobin::new(vec![a_rx, b_rx]);
        b_tx.send(7).await.unwrap();
        assert_eq!(merge.next().await, Some(7));
        drop((a_tx, b_tx));
        assert_eq!(merge.next().await, None);
    }
}
