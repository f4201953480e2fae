//! The `fair-share` merge (issue 34): a pool's queues belong to tenants, and the pool's workers
//! go to the tenants with a request ready in proportion to their weights; within one tenant the
//! earliest deadline goes first. A tenant alone gets every worker (nothing is held back for
//! tenants without work).
//!
//! The order is start-time fair queueing, which gives what deficit round robin gives without
//! its quantum: each tenant carries a virtual finish tag; the ready tenant with the smallest
//! `max(tag, clock)` is served, its tag moves on by `1 / weight`, and the clock moves to where
//! it started. A tenant that had no work cannot bank credit (its tag is raised to the clock), so
//! a tenant coming back shares from then on instead of taking the pool until it catches up.
//!
//! A tenant picked is served up to `burst` requests in a row while it has one ready (its tag
//! moving on for each), so its requests claimed, sent and acked together share their Redis
//! calls as one queue's do: shares stay exact over many requests, and the order within a few
//! `burst`s is coarser. With `burst` 1 every pick goes to the smallest tag.
//!
//! Requests enter from the queues' channels (each queue's next request is staged with its
//! tenant and deadline, as in `tier-priority`) and leave to the pool's workers. With a cap
//! (`max_in_flight_per_tenant`) a tenant with that many requests in this pool's workers is
//! passed over until one ends: the pool holds the [`TenantSlot`] of each request it starts.

use std::collections::HashMap;
use std::future::poll_fn;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::task::Poll;

use futures::task::AtomicWaker;
use tokio::sync::mpsc::Receiver;

/// Tenant -> weight, shared with the discovery that keeps it up to date.
#[derive(Debug, Clone)]
pub struct Weights {
    pub by_tenant: HashMap<String, f64>,
    pub default: f64,
}

impl Weights {
    pub fn of(&self, tenant: &str) -> f64 {
        self.by_tenant
            .get(tenant)
            .copied()
            .filter(|w| w.is_finite() && *w > 0.0)
            .unwrap_or(self.default)
    }
}

impl Default for Weights {
    fn default() -> Self {
        Weights {
            by_tenant: HashMap::new(),
            default: 1.0,
        }
    }
}

pub type SharedWeights = Arc<RwLock<Weights>>;

/// The requests each tenant has in the pool's workers, against the cap.
#[derive(Debug)]
pub struct InFlight {
    cap: usize,
    counts: Mutex<HashMap<Arc<str>, usize>>,
    /// The merge waiting for a tenant to come under its cap.
    waker: AtomicWaker,
}

impl InFlight {
    pub fn new(cap: usize) -> Arc<InFlight> {
        Arc::new(InFlight {
            cap,
            counts: Mutex::default(),
            waker: AtomicWaker::new(),
        })
    }

    fn at_cap(&self, tenant: &str) -> bool {
        let counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        counts.get(tenant).is_some_and(|n| *n >= self.cap)
    }

    fn take(self: &Arc<Self>, tenant: Arc<str>) -> TenantSlot {
        let mut counts = self.counts.lock().unwrap_or_else(PoisonError::into_inner);
        *counts.entry(tenant.clone()).or_insert(0) += 1;
        TenantSlot {
            in_flight: self.clone(),
            tenant,
        }
    }
}

/// One request of a tenant in a worker; dropping it frees the tenant's place under the cap.
#[derive(Debug)]
pub struct TenantSlot {
    in_flight: Arc<InFlight>,
    tenant: Arc<str>,
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        {
            let mut counts = self
                .in_flight
                .counts
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(n) = counts.get_mut(&self.tenant) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(&self.tenant);
                }
            }
        }
        self.in_flight.waker.wake();
    }
}

/// What a request is sorted by: its tenant and its deadline (Unix seconds).
pub type KeyFn<T> = Box<dyn Fn(&T) -> (Arc<str>, i64) + Send + Sync>;

struct Staged<T> {
    tenant: Arc<str>,
    deadline: i64,
    item: T,
}

/// The `fair-share` merge of a pool's queues.
pub struct FairShare<T> {
    pub(super) inputs: Vec<Receiver<T>>,
    staged: Vec<Option<Staged<T>>>,
    open: Vec<bool>,
    key: KeyFn<T>,
    weights: SharedWeights,
    /// Each tenant's virtual finish tag.
    finish: HashMap<Arc<str>, f64>,
    /// The start tag of the last request served.
    clock: f64,
    in_flight: Option<Arc<InFlight>>,
    /// The slot of the request `next` returned last, for the pool to hold.
    last_slot: Option<TenantSlot>,
    /// Most requests of one tenant served in a row.
    burst: usize,
    /// The tenant served last, and how many in a row.
    current: Option<(Arc<str>, usize)>,
    /// Counts each request served under its tenant (`inferq_fair_share_served_total`).
    served: Option<Served>,
}

/// Where a pool's merge counts the requests it serves: the family and the pool's name.
#[derive(Debug)]
pub struct Served {
    pub family: prometheus_client::metrics::family::Family<
        crate::ops::fair_share_metrics::TenantLabels,
        prometheus_client::metrics::counter::Counter,
    >,
    pub pool: String,
}

impl Served {
    fn count(&self, tenant: &str) {
        self.family
            .get_or_create(&crate::ops::fair_share_metrics::TenantLabels {
                pool_name: self.pool.clone(),
                tenant: tenant.to_owned(),
            })
            .inc();
    }
}

impl<T> std::fmt::Debug for FairShare<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FairShare").finish_non_exhaustive()
    }
}

impl<T> FairShare<T> {
    pub fn new(
        inputs: Vec<Receiver<T>>,
        key: KeyFn<T>,
        weights: SharedWeights,
        cap: Option<usize>,
        burst: usize,
    ) -> Self {
        let n = inputs.len();
        FairShare {
            inputs,
            staged: (0..n).map(|_| None).collect(),
            open: vec![true; n],
            key,
            weights,
            finish: HashMap::new(),
            clock: 0.0,
            in_flight: cap.map(InFlight::new),
            last_slot: None,
            burst: burst.max(1),
            current: None,
            served: None,
        }
    }

    /// Counts the requests served per tenant in `served`.
    pub fn counting(mut self, served: Served) -> Self {
        self.served = Some(served);
        self
    }

    pub(super) fn add(&mut self, input: Receiver<T>) {
        self.inputs.push(input);
        self.staged.push(None);
        self.open.push(true);
    }

    /// The slot of the request last returned (with a cap), for the worker to hold.
    pub fn take_slot(&mut self) -> Option<TenantSlot> {
        self.last_slot.take()
    }

    /// Forgets the inputs that are closed and have nothing staged (a removed queue's).
    fn prune(&mut self) {
        let mut i = 0;
        while i < self.inputs.len() {
            if self.open[i] || self.staged[i].is_some() {
                i += 1;
                continue;
            }
            self.inputs.swap_remove(i);
            self.staged.swap_remove(i);
            self.open.swap_remove(i);
        }
        // Tags at or behind the clock mean nothing more than no tag.
        if self.finish.len() > 2 * self.inputs.len() + 16 {
            let clock = self.clock;
            self.finish.retain(|_, tag| *tag > clock);
        }
    }

    /// Stages the next request of every open input that has none staged.
    fn stage(&mut self, cx: &mut std::task::Context<'_>) {
        for i in 0..self.inputs.len() {
            if self.staged[i].is_some() || !self.open[i] {
                continue;
            }
            match self.inputs[i].poll_recv(cx) {
                Poll::Ready(Some(item)) => {
                    let (tenant, deadline) = (self.key)(&item);
                    self.staged[i] = Some(Staged {
                        tenant,
                        deadline,
                        item,
                    });
                }
                Poll::Ready(None) => self.open[i] = false,
                Poll::Pending => {}
            }
        }
    }

    /// The staged request to serve now: the input holding it, its start tag, and whether it
    /// continues the current tenant's burst.
    fn pick(&self) -> Option<(usize, f64, bool)> {
        // Each ready tenant's earliest-deadline request.
        let mut heads: HashMap<&Arc<str>, usize> = HashMap::new();
        for (i, s) in self.staged.iter().enumerate() {
            let Some(s) = s else { continue };
            heads
                .entry(&s.tenant)
                .and_modify(|best| {
                    if let Some(b) = &self.staged[*best] {
                        if s.deadline < b.deadline {
                            *best = i;
                        }
                    }
                })
                .or_insert(i);
        }
        if let Some((tenant, served)) = &self.current {
            let at_cap = self.in_flight.as_ref().is_some_and(|f| f.at_cap(tenant));
            if *served < self.burst && !at_cap {
                if let Some(i) = heads.get(tenant) {
                    let tag = self.finish.get(tenant).copied().unwrap_or(self.clock);
                    return Some((*i, tag, true));
                }
            }
        }
        let mut best: Option<(f64, i64, &str, usize)> = None;
        for (tenant, i) in heads {
            if self.in_flight.as_ref().is_some_and(|f| f.at_cap(tenant)) {
                continue;
            }
            let start = self
                .finish
                .get(tenant)
                .copied()
                .unwrap_or(self.clock)
                .max(self.clock);
            let deadline = self.staged[i].as_ref().map_or(i64::MAX, |s| s.deadline);
            let better = best.is_none_or(|(b_start, b_deadline, b_tenant, _)| {
                start
                    .total_cmp(&b_start)
                    .then(deadline.cmp(&b_deadline))
                    .then((**tenant).cmp(b_tenant))
                    .is_lt()
            });
            if better {
                best = Some((start, deadline, &**tenant, i));
            }
        }
        best.map(|(start, _, _, i)| (i, start, false))
    }

    /// The next request in fair-share order; `None` once every input is closed and nothing is
    /// staged. Cancel-safe: a request is taken from its input only when it is returned.
    pub async fn next(&mut self) -> Option<T> {
        poll_fn(|cx| {
            self.prune();
            if let Some(f) = &self.in_flight {
                f.waker.register(cx.waker());
            }
            self.stage(cx);
            if let Some((i, start, bursting)) = self.pick() {
                if let Some(s) = self.staged[i].take() {
                    let weight = self
                        .weights
                        .read()
                        .unwrap_or_else(PoisonError::into_inner)
                        .of(&s.tenant);
                    self.finish.insert(s.tenant.clone(), start + 1.0 / weight);
                    if bursting {
                        if let Some((_, served)) = &mut self.current {
                            *served += 1;
                        }
                    } else {
                        self.clock = start;
                        self.current = Some((s.tenant.clone(), 1));
                    }
                    if let Some(served) = &self.served {
                        served.count(&s.tenant);
                    }
                    self.last_slot = self.in_flight.as_ref().map(|f| f.take(s.tenant));
                    return Poll::Ready(Some(s.item));
                }
            }
            if self.open.iter().any(|o| *o) || self.staged.iter().any(Option::is_some) {
                Poll::Pending
            } else {
                self.prune();
                Poll::Ready(None)
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests;
mod turns;

pub use turns::{for_pools, LaneTurns, Reserved, Turn, Turns};
