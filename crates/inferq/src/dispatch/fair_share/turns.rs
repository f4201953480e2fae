//! Claiming at a tenant's turn: a `fair-share` pool bounds the requests its queues hold claimed
//! while they wait for a worker, across all of them, so a tenant's requests are claimed when
//! the pool is about to start them and not before.
//!
//! Without the bound every queue claims as much as its own channel holds: with 1,000 tenants,
//! 1,000 queues hold claims that wait seconds for a worker, and each waiting claim costs Redis
//! renewals and cancel checks, and is taken and finished in smaller batches. With it, at most
//! `2 × max(workers, burst)` requests wait claimed in the whole pool; a queue waits for its share of that
//! room in arrival order (a tenant that wants room while another is served gets it before that
//! other claims again) and waits for at most `burst × weight` at a time (the merge's turn), so
//! the tenants staged in the merge take turns in proportion to their weights. Room free beyond
//! that (no other queue waits) it takes as well: a tenant alone claims whole batches.
//!
//! In: a consumer's [`Turns::reserve`] before it polls (waiting while the pool's room is taken).
//! Out: a [`Reserved`] room the poll hands one [`Turn`] of to each job it sends to the pool; a
//! worker taking the job up drops its turn, and the room left unused goes back when the
//! reservation drops. Written on tokio's semaphore, whose waiters are served in order.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Semaphore;

use super::SharedWeights;
use crate::config::{FairShare as Policy, MergePolicyKind, PoolConfig, QueueConfig};

/// Each `fair-share` pool's room, by pool id; none under another policy.
pub fn for_pools(
    policy: &MergePolicyKind,
    pools: &[PoolConfig],
    weights: Option<&SharedWeights>,
) -> HashMap<String, Arc<Turns>> {
    let MergePolicyKind::FairShare(fs) = policy else {
        return HashMap::new();
    };
    pools
        .iter()
        .map(|pool| {
            let workers = usize::try_from(pool.workers).unwrap_or(1).max(1);
            let weights = weights.cloned().unwrap_or_default();
            (pool.id.clone(), Turns::new(workers, fs.clone(), weights))
        })
        .collect()
}

/// One queue's way into its pool's room: the room and the queue's tenant.
#[derive(Debug, Clone)]
pub struct LaneTurns {
    turns: Arc<Turns>,
    tenant: String,
}

impl LaneTurns {
    /// The way in for `queue`'s tenant.
    pub fn new(turns: &Arc<Turns>, queue: &QueueConfig) -> LaneTurns {
        let tenant = turns.policy.tenant_of(&queue.queue_name, &queue.id);
        LaneTurns {
            turns: turns.clone(),
            tenant: tenant.to_owned(),
        }
    }

    /// See [`Turns::reserve`].
    pub async fn reserve(&self, want: usize) -> Reserved {
        self.turns.reserve(&self.tenant, want).await
    }
}

/// The room for claimed requests waiting for a worker in one `fair-share` pool.
#[derive(Debug)]
pub struct Turns {
    room: Arc<Semaphore>,
    /// The whole room: no queue asks for more at once.
    most: usize,
    /// The policy: `burst` (requests of one tenant served in a row), and how a queue's
    /// tenant is named.
    policy: Policy,
    weights: SharedWeights,
}

impl Turns {
    /// Room for `2 × workers` waiting requests (at least `2 × burst`).
    pub fn new(workers: usize, policy: Policy, weights: SharedWeights) -> Arc<Turns> {
        let most = workers.max(policy.burst.max(1)).saturating_mul(2);
        Arc::new(Turns {
            room: Arc::new(Semaphore::new(most)),
            most,
            policy,
            weights,
        })
    }

    /// Waits for room for up to `want` of `tenant`'s requests (no more than a burst times its
    /// weight: what the merge serves in one turn), and holds it.
    pub async fn reserve(&self, tenant: &str, want: usize) -> Reserved {
        let weight = self
            .weights
            .read()
            .map(|w| w.of(tenant))
            .unwrap_or_else(|p| p.into_inner().of(tenant));
        let share = (self.policy.burst.max(1) as f64 * weight).ceil().max(1.0) as usize;
        let want = want.clamp(1, self.most);
        let n = want.min(share);
        let mut taken = match self.room.clone().acquire_many_owned(n as u32).await {
            Ok(permit) => {
                permit.forget();
                n
            }
            // Never closed: no room is as good as none wanted.
            Err(_) => 0,
        };
        // Room free beyond its share means no queue waits (released room goes to waiters
        // first): a tenant alone claims whole batches.
        let spare = (want - n).min(self.room.available_permits());
        if spare > 0 {
            if let Ok(permit) = self.room.clone().try_acquire_many_owned(spare as u32) {
                permit.forget();
                taken += spare;
            }
        }
        Reserved {
            room: self.room.clone(),
            left: taken,
        }
    }

    /// Room free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.room.available_permits()
    }
}

/// Room held for a poll; what the poll does not hand to jobs goes back when this drops.
#[derive(Debug)]
pub struct Reserved {
    room: Arc<Semaphore>,
    left: usize,
}

impl Reserved {
    /// How many requests the poll may claim.
    pub fn left(&self) -> usize {
        self.left
    }

    /// One request's place, for a job sent to the pool; `None` once the room is used up (the
    /// job then waits unbounded, as in any other pool).
    pub fn turn(&mut self) -> Option<Turn> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(Turn {
            room: self.room.clone(),
        })
    }
}

impl Drop for Reserved {
    fn drop(&mut self) {
        if self.left > 0 {
            self.room.add_permits(self.left);
        }
    }
}

/// One claimed request's place in the pool's room, given back when a worker takes it up (or
/// the job ends without one).
#[derive(Debug)]
pub struct Turn {
    room: Arc<Semaphore>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.room.add_permits(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::RwLock;

    fn policy(burst: usize) -> Policy {
        Policy {
            burst,
            ..Policy::default()
        }
    }

    fn weights(pairs: &[(&str, f64)]) -> SharedWeights {
        Arc::new(RwLock::new(super::super::Weights {
            by_tenant: pairs.iter().map(|(t, w)| ((*t).to_owned(), *w)).collect(),
            default: 1.0,
        }))
    }

    #[tokio::test]
    async fn room_is_shared_and_comes_back_when_work_starts_or_is_unused() {
        let turns = Turns::new(8, policy(4), weights(&[]));
        assert_eq!(turns.free(), 16);
        // Alone, a queue takes what its channel has room for, up to the whole room.
        let mut a = turns.reserve("a", 12).await;
        assert_eq!(a.left(), 12);
        let jobs: Vec<Turn> = (0..3).filter_map(|_| a.turn()).collect();
        drop(a);
        // Nine unused places came back; three wait with their jobs.
        assert_eq!(turns.free(), 13);
        drop(jobs);
        assert_eq!(turns.free(), 16);
    }

    #[tokio::test]
    async fn heavier_tenants_ask_for_more_and_waiters_are_served_in_order() {
        let turns = Turns::new(4, policy(4), weights(&[("heavy", 3.0)]));
        let mut heavy = turns.reserve("heavy", 100).await;
        // The whole room of 8 (its share, 4 x 3 = 12, cut to it).
        assert_eq!(heavy.left(), 8);
        let mut held: Vec<Turn> = (0..8).filter_map(|_| heavy.turn()).collect();
        drop(heavy);
        let waiter = |tenant: &'static str| {
            let turns = turns.clone();
            tokio::spawn(async move { turns.reserve(tenant, 100).await })
        };
        let light = waiter("light");
        tokio::task::yield_now().await;
        let other = waiter("other");
        tokio::task::yield_now().await;
        assert!(!light.is_finished(), "no room while every place is held");
        // Places freed go to the first waiter until its share (a burst: 4) is met, and only
        // then to the next: no one waiting takes more than its share.
        held.truncate(5);
        tokio::task::yield_now().await;
        assert!(!light.is_finished());
        held.truncate(4);
        let light = light.await.ok();
        assert_eq!(light.as_ref().map(Reserved::left), Some(4));
        tokio::task::yield_now().await;
        assert!(!other.is_finished());
        held.clear();
        let other = other.await.ok();
        assert_eq!(other.as_ref().map(Reserved::left), Some(4));
        assert_eq!(turns.free(), 0);
        drop((light, other));
        assert_eq!(turns.free(), 8);
    }
}
