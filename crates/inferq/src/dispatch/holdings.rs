//! What one queue's processor holds: every claim it owns, how long its lease is known to be valid
//! (a monotonic clock, so work it no longer owns stops without asking Redis), and a handle to
//! abort the claim's in-flight request.
//!
//! Claims enter when the consumer (or reclaim) takes them and leave when the outbox has written
//! their outcome, when a renewal says "not yours", or when their local lease runs out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::queue::Fence;

/// Why an in-flight request was aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abort {
    /// The lease is lost (renewal said "not yours", or it ran out locally): someone else will
    /// do the work; publish nothing.
    Lost = 1,
    /// The producer cancelled this generation: publish `CANCELLED`.
    Cancelled = 2,
    /// Shutdown ran out of drain time: release the claim.
    Shutdown = 3,
}

/// A job's view of its claim: the fence, and the signal that it must stop.
#[derive(Debug, Clone)]
pub struct Ticket {
    pub fence: Fence,
    abort: CancellationToken,
    reason: Arc<AtomicU8>,
}

impl Ticket {
    /// Resolves when the claim's work must stop.
    pub async fn aborted(&self) -> Abort {
        self.abort.cancelled().await;
        self.reason().unwrap_or(Abort::Lost)
    }

    pub fn reason(&self) -> Option<Abort> {
        match self.reason.load(Ordering::SeqCst) {
            1 => Some(Abort::Lost),
            2 => Some(Abort::Cancelled),
            3 => Some(Abort::Shutdown),
            _ => None,
        }
    }
}

struct Holding {
    token: String,
    id: String,
    request_token: String,
    valid_until: Instant,
    /// The outcome is written (or being written): no cancel check needed any more.
    finishing: bool,
    abort: CancellationToken,
    reason: Arc<AtomicU8>,
}

/// The claims one queue's processor holds.
pub struct Holdings {
    lease: Duration,
    inner: Mutex<HashMap<String, Holding>>,
}

impl std::fmt::Debug for Holdings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holdings").finish_non_exhaustive()
    }
}

impl Holdings {
    pub fn new(lease: Duration) -> Holdings {
        Holdings {
            lease,
            inner: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Holding>> {
        // A panic while holding this lock cannot leave the map inconsistent (single inserts and
        // removes), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records a claim taken at `taken_at` (when the claim call was sent). A claim of the same
    /// generation held under another token (this instance took it again after its lease was
    /// lost, or reclaim took it over) is lost: its in-flight work is aborted, as a renewal
    /// saying "not yours" would, rather than left running for a result nobody can publish.
    pub fn insert(&self, fence: Fence, id: &str, request_token: &str, taken_at: Instant) -> Ticket {
        let abort = CancellationToken::new();
        let reason = Arc::new(AtomicU8::new(0));
        let replaced = self.lock().insert(
            fence.key.clone(),
            Holding {
                token: fence.token.clone(),
                id: id.to_owned(),
                request_token: request_token.to_owned(),
                valid_until: taken_at + self.lease,
                finishing: false,
                abort: abort.clone(),
                reason: reason.clone(),
            },
        );
        if let Some(old) = replaced.filter(|old| old.token != fence.token) {
            signal(&old, Abort::Lost);
        }
        Ticket {
            fence,
            abort,
            reason,
        }
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Every held fence, for one renewal call.
    pub fn fences(&self) -> Vec<Fence> {
        self.lock()
            .iter()
            .map(|(key, h)| Fence {
                key: key.clone(),
                token: h.token.clone(),
            })
            .collect()
    }

    /// Applies a renewal sent at `sent_at`: renewed claims are valid for another lease, lost
    /// ones are dropped and their work aborted. Returns how many were lost. A claim whose
    /// outcome is already on its way to Redis is not counted lost when the renewal missed it:
    /// the outcome may simply have landed first.
    pub fn renewed(&self, fences: &[Fence], statuses: &[bool], sent_at: Instant) -> usize {
        let mut lost = 0;
        let mut map = self.lock();
        for (fence, ok) in fences.iter().zip(statuses) {
            let Some(h) = map.get_mut(&fence.key) else {
                continue;
            };
            if h.token != fence.token {
                continue;
            }
            if *ok {
                h.valid_until = h.valid_until.max(sent_at + self.lease);
            } else if h.finishing {
                // Its outcome is on the way, and has perhaps landed already (which is why Redis
                // no longer knows the claim): not a takeover. The outbox's fenced write settles
                // it either way, and the lease is not extended meanwhile.
                continue;
            } else if let Some(h) = map.remove(&fence.key) {
                lost += 1;
                signal(&h, Abort::Lost);
            }
        }
        lost
    }

    /// Drops claims whose lease ran out locally (renewals failing, e.g. Redis unreachable) and
    /// aborts their work: it may no longer be ours to finish. Returns how many. A claim whose
    /// outcome is already on its way stays: its work is done, and unless another instance has
    /// reclaimed it meanwhile (which only Redis can say), the outbox's fenced write still lands
    /// once Redis answers — so a long outage does not make a survivor redo finished work.
    pub fn expire_overdue(&self, now: Instant) -> usize {
        let mut map = self.lock();
        let overdue: Vec<String> = map
            .iter()
            .filter(|(_, h)| h.valid_until <= now && !h.finishing)
            .map(|(k, _)| k.clone())
            .collect();
        for key in &overdue {
            if let Some(h) = map.remove(key) {
                signal(&h, Abort::Lost);
            }
        }
        overdue.len()
    }

    /// Whether `fence` is still held: not known to be lost (a renewal said "not yours", or its
    /// work was abandoned).
    pub fn is_held(&self, fence: &Fence) -> bool {
        self.lock()
            .get(&fence.key)
            .is_some_and(|h| h.token == fence.token)
    }

    /// Whether `fence` is still held with a lease valid at `now`.
    #[cfg(test)]
    pub fn is_valid(&self, fence: &Fence, now: Instant) -> bool {
        self.lock()
            .get(&fence.key)
            .is_some_and(|h| h.token == fence.token && h.valid_until > now)
    }

    /// The outcome of `fence` is on its way to Redis: stop cancel checks for it.
    pub fn mark_finishing(&self, fence: &Fence) {
        if let Some(h) = self.lock().get_mut(&fence.key) {
            if h.token == fence.token {
                h.finishing = true;
            }
        }
    }

    /// Forgets `fence` (its outcome is written, or it is gone).
    pub fn remove(&self, fence: &Fence) {
        let mut map = self.lock();
        if map.get(&fence.key).is_some_and(|h| h.token == fence.token) {
            map.remove(&fence.key);
        }
    }

    /// Aborts the work of the claim `key` for `reason` (the claim stays held).
    pub fn abort(&self, key: &str, reason: Abort) {
        if let Some(h) = self.lock().get(key) {
            signal(h, reason);
        }
    }

    /// Aborts every claim's work for `reason`.
    pub fn abort_all(&self, reason: Abort) {
        for h in self.lock().values() {
            signal(h, reason);
        }
    }

    /// (claim key, id, request token) of claims still working, for cancellation checks.
    pub fn cancellable(&self) -> Vec<(String, String, String)> {
        self.lock()
            .iter()
            .filter(|(_, h)| !h.finishing && !h.request_token.is_empty())
            .map(|(k, h)| (k.clone(), h.id.clone(), h.request_token.clone()))
            .collect()
    }
}

fn signal(h: &Holding, reason: Abort) {
    // The first reason wins: a request already being cancelled is not re-labelled as lost.
    let _ = h
        .reason
        .compare_exchange(0, reason as u8, Ordering::SeqCst, Ordering::SeqCst);
    h.abort.cancel();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(k: &str, t: &str) -> Fence {
        Fence {
            key: k.into(),
            token: t.into(),
        }
    }

    /// The same generation taken again under a new token: the old claim's work is aborted as
    /// lost, and the new one is held.
    #[tokio::test]
    async fn a_generation_taken_again_aborts_the_old_claims_work() {
        let h = Holdings::new(Duration::from_secs(10));
        let now = Instant::now();
        let old = h.insert(fence("g", "1"), "g", "t", now);
        let other = h.insert(fence("h", "1"), "h", "t", now);
        let new = h.insert(fence("g", "2"), "g", "t", now);
        let aborted = tokio::time::timeout(Duration::from_secs(5), old.aborted()).await;
        assert_eq!(aborted, Ok(Abort::Lost));
        assert_eq!(new.reason(), None);
        assert_eq!(other.reason(), None);
        assert!(h.is_valid(&fence("g", "2"), now));
        assert!(!h.is_valid(&fence("g", "1"), now));
    }

    #[tokio::test]
    async fn lost_renewal_drops_and_aborts() {
        let h = Holdings::new(Duration::from_secs(10));
        let now = Instant::now();
        let a = h.insert(fence("a", "1"), "a", "t", now);
        let _b = h.insert(fence("b", "1"), "b", "t", now);
        let fences = h.fences();
        let statuses: Vec<bool> = fences.iter().map(|f| f.key == "b").collect();
        assert_eq!(h.renewed(&fences, &statuses, now), 1);
        assert_eq!(a.aborted().await, Abort::Lost);
        assert_eq!(h.len(), 1);
        assert!(h.is_valid(&fence("b", "1"), now));
        assert!(
            !h.is_valid(&fence("b", "2"), now),
            "another token is not ours"
        );
    }

    #[test]
    fn a_renewal_that_misses_a_finishing_claim_is_not_a_takeover() {
        let lease = Duration::from_secs(10);
        let h = Holdings::new(lease);
        let start = Instant::now();
        let t = h.insert(fence("a", "1"), "a", "t", start);
        h.mark_finishing(&t.fence);
        // The outcome landed before the renewal ran: Redis answers "not yours".
        let later = start + Duration::from_secs(5);
        assert_eq!(h.renewed(&h.fences(), &[false], later), 0);
        assert_eq!(t.reason(), None, "the finished work is not aborted as lost");
        assert!(
            h.is_valid(&t.fence, later),
            "still held until the outbox settles it"
        );
        assert!(
            !h.is_valid(&t.fence, start + lease),
            "but its lease is not extended"
        );
    }

    #[test]
    fn a_finishing_claim_outlives_its_local_lease() {
        let h = Holdings::new(Duration::from_millis(100));
        let start = Instant::now();
        let t = h.insert(fence("a", "1"), "a", "", start);
        h.mark_finishing(&t.fence);
        assert_eq!(h.expire_overdue(start + Duration::from_secs(60)), 0);
        assert_eq!(t.reason(), None);
        assert!(h.is_held(&t.fence), "its outcome may still be written");
        assert_eq!(h.renewed(&h.fences(), &[false], start), 0);
        assert!(h.is_held(&t.fence));
        h.remove(&t.fence);
        assert!(!h.is_held(&t.fence));
    }

    #[tokio::test]
    async fn local_lease_runs_out_without_renewals() {
        let h = Holdings::new(Duration::from_millis(100));
        let start = Instant::now();
        let t = h.insert(fence("a", "1"), "a", "", start);
        assert_eq!(h.expire_overdue(start + Duration::from_millis(50)), 0);
        assert_eq!(h.expire_overdue(start + Duration::from_millis(100)), 1);
        assert_eq!(t.aborted().await, Abort::Lost);
        assert!(h.is_empty());
    }

    #[tokio::test]
    async fn first_abort_reason_wins_and_finishing_claims_are_not_cancellable() {
        let h = Holdings::new(Duration::from_secs(10));
        let t = h.insert(fence("a", "1"), "a", "tok", Instant::now());
        assert_eq!(h.cancellable().len(), 1);
        h.abort("a", Abort::Cancelled);
        h.abort_all(Abort::Shutdown);
        assert_eq!(t.aborted().await, Abort::Cancelled);
        h.mark_finishing(&t.fence);
        assert!(h.cancellable().is_empty());
    }
}
