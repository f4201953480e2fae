//! The finish across Redis Cluster slots (`src/queue/cross_slot.rs`), as pure functions of the
//! model's [`Redis`]: `stage` in the queue's slot (`finish-11.lua`, `deadLetter-5.lua`),
//! `deliverOnce` in the result list's slot (`deliverOnce-2.lua`), `unstage` back in the queue's
//! slot (`unstage-3.lua`), the age test of upkeep (`staleStaged-2.lua`) and the trimming of
//! delivered markers. Also Go's three-step ack (planted bug). The moves in `moves.rs` call these
//! and keep what a settler holds between the steps in [`Settling`].

use std::fmt;

use crate::world::{
    ClaimKey, DeadReason, Generation, ModelCfg, Outcome, OwnerToken, Redis, Status, MAX_GENERATIONS,
};

/// How a finish reaches the result list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FinishPath {
    /// The list is in the queue's slot (or on one server): one script drops the claim and
    /// pushes the record.
    OneScript,
    /// The list is in another slot: stage, deliver once, unstage.
    CrossSlot,
    /// Planted bug, Go's cluster ack: a fenced renew, an `LPUSH`, then a fenced drop of the
    /// claim, each its own call. The push and the fence are one step here (in Go's favour).
    GoThreeSteps,
}

/// When a delivered marker may be trimmed. The real markers go after a retention (ten leases,
/// at least ten minutes, trimmed by the next `deliverOnce` on the list); which of these the
/// retention achieves is a matter of timing the model does not see, so it names the cases.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MarkerTrim {
    /// Only once nothing is staged under the claim key and no settler holds its staged result:
    /// what the retention must guarantee.
    Settled,
    /// Also while a settler still holds a staged result it read before the unstage (a push in
    /// transit, or an upkeep pass stalled, for longer than the retention).
    WhileInFlight,
    /// Also while the result is still staged (no upkeep ran for the whole retention after a
    /// finisher died between deliver and unstage).
    Anytime,
}

/// A set of claim keys, by [`ClaimKey::slot`]: the list's `{<list>}:delivered:<q>` markers.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct KeyMarks(pub(crate) u8);

impl KeyMarks {
    pub(crate) fn contains(self, key: ClaimKey) -> bool {
        self.0 & (1 << key.slot) != 0
    }

    pub(crate) fn insert(&mut self, key: ClaimKey) {
        self.0 |= 1 << key.slot;
    }

    pub(crate) fn remove(&mut self, key: ClaimKey) {
        self.0 &= !(1 << key.slot);
    }

    fn slots(self) -> impl Iterator<Item = u8> {
        (0..MAX_GENERATIONS as u8).filter(move |s| self.0 & (1 << s) != 0)
    }
}

/// A staged result in `{q}:finishing`: the record and the generation it is for (the real value
/// names the list and holds the JSON, which names the id; the claim key names the generation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Staged {
    pub(crate) member: Generation,
    pub(crate) outcome: Outcome,
    /// Staged longer ago than a lease (by Redis `TIME`): upkeep may settle it.
    pub(crate) older_than_lease: bool,
}

/// The next cross-slot step a settler makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SettleStep {
    Deliver,
    Unstage,
}

/// A staged result a settler holds between the steps: the finisher after a delivered `stage`,
/// or upkeep after `staleStaged` read it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settling {
    pub(crate) member: Generation,
    pub(crate) outcome: Outcome,
    pub(crate) step: SettleStep,
    pub(crate) by_upkeep: bool,
}

impl Settling {
    /// A settler's first step: deliver, unless the order is (wrongly) swapped.
    pub(crate) fn start(
        cfg: &ModelCfg,
        member: Generation,
        outcome: Outcome,
        by_upkeep: bool,
    ) -> Self {
        let step = if cfg.unstage_first {
            SettleStep::Unstage
        } else {
            SettleStep::Deliver
        };
        Self {
            member,
            outcome,
            step,
            by_upkeep,
        }
    }

    /// The step after `self.step`, or `None` when both are done.
    pub(crate) fn next(self, cfg: &ModelCfg) -> Option<Self> {
        let last = if cfg.unstage_first {
            SettleStep::Deliver
        } else {
            SettleStep::Unstage
        };
        (self.step != last).then_some(Self { step: last, ..self })
    }

    /// One byte of the canonical encoding (never 0xFF).
    pub(crate) fn encode(self) -> u8 {
        self.member.0 * 32
            + self.outcome as u8 * 4
            + u8::from(self.step == SettleStep::Unstage) * 2
            + u8::from(self.by_upkeep)
    }
}

impl fmt::Debug for Settling {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let who = if self.by_upkeep { "upkeep" } else { "finisher" };
        write!(
            f,
            "{who} of {:?} {:?}, next {:?}",
            self.member, self.outcome, self.step
        )
    }
}

impl Staged {
    /// One byte of the canonical encoding (never 0xFF).
    pub(crate) fn encode(self) -> u8 {
        self.member.0 * 16 + self.outcome as u8 * 2 + u8::from(self.older_than_lease)
    }
}

impl Redis {
    pub(crate) fn staged_at(&self, key: ClaimKey) -> Option<Staged> {
        self.staged[key.index()]
    }

    fn put_staged(&mut self, key: ClaimKey, member: Generation, outcome: Outcome) {
        self.staged[key.index()] = Some(Staged {
            member,
            outcome,
            older_than_lease: false,
        });
    }

    /// stage (`finish-11.lua` with the list index 0): fenced by the owner token; drops the
    /// claim and keeps the record in `{q}:finishing` under the claim key, in one script. A
    /// burial also goes to the dead list in the same script.
    pub(crate) fn stage(&mut self, key: ClaimKey, token: OwnerToken, outcome: Outcome) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        if outcome == Outcome::OverDeliveryLimit {
            self.dead[claim.member.index()].push(DeadReason::OverDeliveryLimit);
        }
        self.put_staged(key, claim.member, outcome);
        Status::Ok
    }

    /// dead_letter with "stage" (`deadLetter-5.lua`): a malformed pending member -> dead, and
    /// its `INVALID_REQUEST` record staged under its claim key.
    pub(crate) fn stage_dead_letter(&mut self, cfg: &ModelCfg, member: Generation) -> Status {
        if !member.submission().malformed || !self.pending.remove(member) {
            return Status::Gone;
        }
        self.dead[member.index()].push(DeadReason::Malformed);
        self.put_staged(cfg.claim_key(member), member, Outcome::InvalidRequest);
        Status::Ok
    }

    /// deliverOnce (`deliverOnce-2.lua`, the list's slot): pushes the record and marks the
    /// claim key, unless a marker already names it.
    pub(crate) fn deliver_once(&mut self, cfg: &ModelCfg, key: ClaimKey, s: Settling) -> Status {
        if cfg.deliver_checks_marker && self.delivered.contains(key) {
            return Status::AlreadyDelivered;
        }
        self.results[s.member.index()].push(s.outcome);
        self.delivered.insert(key);
        Status::Ok
    }

    /// unstage (`unstage-3.lua`, the queue's slot): drops the staged result, if still there.
    pub(crate) fn unstage(&mut self, key: ClaimKey) -> Status {
        match self.staged[key.index()].take() {
            Some(_) => Status::Ok,
            None => Status::NotStaged,
        }
    }

    /// What `staleStaged-2.lua` hands upkeep under `key`: the staged result, if there and (as
    /// the script asks) staged longer ago than a lease.
    pub(crate) fn stale_staged(&self, cfg: &ModelCfg, key: ClaimKey) -> Option<Staged> {
        let s = self.staged_at(key)?;
        (cfg.upkeep && (s.older_than_lease || !cfg.upkeep_waits_a_lease)).then_some(s)
    }

    /// Go's second step (planted bug): after a fenced renew, `LPUSH` the record. Nothing ties
    /// the push to the claim: the claim stays until the third step drops it.
    pub(crate) fn go_push(&mut self, key: ClaimKey, token: OwnerToken, outcome: Outcome) -> Status {
        let Some(claim) = self.claim_at(key).filter(|c| c.owner == token) else {
            return Status::Stale;
        };
        self.results[claim.member.index()].push(outcome);
        Status::Ok
    }

    /// Go's third step: the fenced drop of the claim.
    pub(crate) fn go_drop(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        self.take_claim(key);
        Status::Ok
    }

    /// The cross-slot keys, for [`Redis`]'s `Debug` (nothing when they are empty).
    pub(crate) fn fmt_cross_slot(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let staged: Vec<String> = self
            .staged
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                let s = (*s)?;
                let age = if s.older_than_lease { ", old" } else { "" };
                let key = ClaimKey {
                    slot: u8::try_from(slot).ok()?,
                    with_request_token: true,
                };
                Some(format!("{key:?}: {:?} {:?}{age}", s.member, s.outcome))
            })
            .collect();
        if !staged.is_empty() {
            write!(f, ", staged {{{}}}", staged.join(", "))?;
        }
        if self.delivered.0 != 0 {
            let marks: Vec<String> = self
                .delivered
                .slots()
                .map(|slot| {
                    let key = ClaimKey {
                        slot,
                        with_request_token: true,
                    };
                    format!("{key:?}")
                })
                .collect();
            write!(f, ", delivered markers {{{}}}", marks.join(", "))?;
        }
        Ok(())
    }
}
