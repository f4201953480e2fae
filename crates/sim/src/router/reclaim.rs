//! The reclamation controller: how many in-flight requests one decision evicts, and when the
//! next decision may run. Plain state with the time passed in, so pacing is tested without a
//! clock. A decision enters as [`Reclamation::size`] (the pool's saturation, the blocked band's
//! ceiling, what is in flight and evictable); the ids evicted come back through
//! [`Reclamation::issued`], their stream's end through [`Reclamation::confirm`].
//!
//! As the llm-d router sizes and paces it:
//!
//! - `reclaimTarget = saturation − ceiling`, `credit = saturation / inFlight`,
//!   `n = max(1, ceil((reclaimTarget − pendingReclaim) / credit))`, capped at
//!   `MaxRevocationsPerDecision` and the evictable count;
//! - stop-and-wait: a decision runs only when every earlier eviction is confirmed and its
//!   `ConfirmationGrace` has passed (each confirmed eviction's credit stays pending until then);
//!   an eviction unconfirmed after `ConfirmationTimeout` counts as confirmed (`timed_out`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One issued eviction not yet confirmed.
#[derive(Debug, Clone, Copy)]
struct Revocation {
    credit: f64,
    issued_at: Instant,
}

/// A confirmed eviction's credit, pending until its grace ends.
#[derive(Debug, Clone, Copy)]
struct Cooling {
    credit: f64,
    until: Instant,
}

/// The controller's pacing knobs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pacing {
    pub max_per_decision: usize,
    pub grace: Duration,
    pub timeout: Duration,
}

/// How revocations ended, for `llm_d_epp_flow_control_revocations_total{outcome}`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Outcomes {
    pub confirmed: u64,
    pub timed_out: u64,
}

/// The reclamation controller's state.
#[derive(Debug)]
pub(super) struct Reclamation {
    pacing: Pacing,
    outstanding: HashMap<u64, Revocation>,
    cooling: Vec<Cooling>,
    pending: f64,
    pub outcomes: Outcomes,
}

impl Reclamation {
    pub(super) fn new(pacing: Pacing) -> Self {
        Self {
            pacing,
            outstanding: HashMap::new(),
            cooling: Vec::new(),
            pending: 0.0,
            outcomes: Outcomes::default(),
        }
    }

    /// Whether a decision may run now: every eviction confirmed (or timed out) and its grace
    /// over.
    pub(super) fn gate_open(&mut self, now: Instant) -> bool {
        let timeout = self.pacing.timeout;
        let timed_out: Vec<u64> = self
            .outstanding
            .iter()
            .filter(|(_, r)| now.duration_since(r.issued_at) >= timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in timed_out {
            if let Some(r) = self.outstanding.remove(&id) {
                self.outcomes.timed_out += 1;
                self.cool(r, now);
            }
        }
        let before = self.cooling.len();
        let mut freed = 0.0;
        self.cooling.retain(|c| {
            let keep = now < c.until;
            if !keep {
                freed += c.credit;
            }
            keep
        });
        if self.cooling.len() != before {
            self.pending = (self.pending - freed).max(0.0);
        }
        self.outstanding.is_empty() && self.cooling.is_empty()
    }

    /// How many to evict for a band blocked at `ceiling` while the pool is at `saturation`, with
    /// `in_flight` requests tracked and `evictable` of them eligible; 0 for none. Also the credit
    /// each eviction is worth, for [`Reclamation::issued`].
    pub(super) fn size(
        &self,
        saturation: f64,
        ceiling: f64,
        in_flight: usize,
        evictable: usize,
    ) -> (usize, f64) {
        if in_flight == 0 || evictable == 0 {
            return (0, 0.0);
        }
        let credit = saturation / in_flight as f64;
        if !(credit.is_finite() && credit > 0.0) {
            return (0, 0.0);
        }
        let net = (saturation - ceiling) - self.pending;
        if net < 0.0 || (net == 0.0 && self.pending > 0.0) {
            return (0, credit);
        }
        let n = ((net / credit).ceil() as usize).max(1);
        (n.min(self.pacing.max_per_decision).min(evictable), credit)
    }

    /// Takes note of evictions issued at `now`, each worth `credit`.
    pub(super) fn issued(&mut self, ids: &[u64], credit: f64, now: Instant) {
        for id in ids {
            self.outstanding.insert(
                *id,
                Revocation {
                    credit,
                    issued_at: now,
                },
            );
            self.pending += credit;
        }
    }

    /// The evicted request `id`'s stream ended: its grace starts.
    pub(super) fn confirm(&mut self, id: u64, now: Instant) {
        if let Some(r) = self.outstanding.remove(&id) {
            self.outcomes.confirmed += 1;
            self.cool(r, now);
        }
    }

    fn cool(&mut self, r: Revocation, now: Instant) {
        self.cooling.push(Cooling {
            credit: r.credit,
            until: now + self.pacing.grace,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn controller() -> Reclamation {
        Reclamation::new(Pacing {
            max_per_decision: 2,
            grace: Duration::from_millis(500),
            timeout: Duration::from_secs(10),
        })
    }

    #[test]
    fn sizing_follows_the_routers_formula_and_caps() {
        let c = controller();
        // Concurrency detector at its ceiling: one victim.
        assert_eq!(c.size(1.0, 1.0, 32, 20).0, 1);
        // 1.25 over a ceiling of 1 with 10 in flight: credit 0.125, 0.25 / 0.125 = 2.
        let (n, credit) = c.size(1.25, 1.0, 10, 10);
        assert_eq!((n, credit), (2, 0.125));
        // Far over: capped at MaxRevocationsPerDecision, and at the evictable count.
        assert_eq!(c.size(3.0, 1.0, 10, 10).0, 2);
        assert_eq!(c.size(3.0, 1.0, 10, 1).0, 1);
        assert_eq!(c.size(3.0, 1.0, 10, 0).0, 0);
        // Under the ceiling: nothing.
        assert_eq!(c.size(0.5, 1.0, 10, 10).0, 0);
    }

    #[test]
    fn pacing_is_stop_and_wait_with_a_grace() {
        let mut c = controller();
        let t0 = Instant::now();
        assert!(c.gate_open(t0));
        c.issued(&[1, 2], 0.1, t0);
        // Unconfirmed: closed; and their credit is pending.
        assert!(!c.gate_open(t0 + Duration::from_millis(100)));
        assert_eq!(c.size(1.15, 1.0, 10, 10).0, 0);
        c.confirm(1, t0 + Duration::from_millis(20));
        assert!(
            !c.gate_open(t0 + Duration::from_millis(600)),
            "one still out"
        );
        c.confirm(2, t0 + Duration::from_millis(30));
        // Both confirmed; the grace runs from each confirmation.
        assert!(!c.gate_open(t0 + Duration::from_millis(529)));
        assert!(c.gate_open(t0 + Duration::from_millis(530)));
        assert_eq!(c.outcomes.confirmed, 2);
        // The pending credit is gone with the grace.
        assert_eq!(c.size(1.15, 1.0, 10, 10).0, 2);
    }

    #[test]
    fn an_unconfirmed_eviction_times_out_as_confirmed() {
        let mut c = controller();
        let t0 = Instant::now();
        c.issued(&[7], 0.1, t0);
        assert!(!c.gate_open(t0 + Duration::from_millis(9_999)));
        // Timed out at 10 s, then its grace.
        assert!(!c.gate_open(t0 + Duration::from_secs(10)));
        assert!(c.gate_open(t0 + Duration::from_millis(10_500)));
        assert_eq!(
            c.outcomes,
            Outcomes {
                confirmed: 0,
                timed_out: 1
            }
        );
    }
}
