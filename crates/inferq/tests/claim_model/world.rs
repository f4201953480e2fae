//! The things the model moves and the Redis keys they sit in: generations, claim keys, owner
//! tokens, the configuration ([`ModelCfg`]: the correct systems and the planted bugs), and
//! [`Redis`] with the single-slot scripts as pure functions of its state. The cross-slot
//! scripts are in `cross_slot.rs`; the moves in `moves.rs` call both.

use std::fmt;

use crate::cross_slot::{FinishPath, KeyMarks, MarkerTrim, Staged};
use crate::state::Phase;

// ---------------------------------------------------------------------------------------------
// Generations, claim keys and owner tokens
// ---------------------------------------------------------------------------------------------

/// What a producer submitted: an id plus the request token it minted for this submission.
pub(crate) struct Submission {
    pub(crate) id: char,
    pub(crate) request_token: u8,
    /// Does not decode: the only way out of pending is `dead_letter`.
    pub(crate) malformed: bool,
}

pub(crate) const MAX_GENERATIONS: usize = 4;
pub(crate) const MAX_INSTANCES: usize = 3;

/// The generations the model can use; [`ModelCfg::generations`] picks which.
pub(crate) const SUBMISSIONS: [Submission; MAX_GENERATIONS] = [
    Submission {
        id: 'A',
        request_token: 1,
        malformed: false,
    },
    Submission {
        id: 'A',
        request_token: 2,
        malformed: false,
    },
    Submission {
        id: 'B',
        request_token: 1,
        malformed: false,
    },
    Submission {
        id: 'M',
        request_token: 1,
        malformed: true,
    },
];

/// One request generation: an index into [`SUBMISSIONS`].
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Generation(pub(crate) u8);

impl Generation {
    pub(crate) fn submission(self) -> &'static Submission {
        &SUBMISSIONS[self.index()]
    }

    pub(crate) fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Debug for Generation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.submission();
        write!(f, "{}#{}", s.id, s.request_token)
    }
}

/// A set of generations (a Redis sorted set without the scores).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct GenerationSet(pub(crate) u8);

impl GenerationSet {
    pub(crate) fn contains(self, g: Generation) -> bool {
        self.0 & (1 << g.0) != 0
    }

    pub(crate) fn insert(&mut self, g: Generation) {
        self.0 |= 1 << g.0;
    }

    /// `ZREM`: whether it was there.
    pub(crate) fn remove(&mut self, g: Generation) -> bool {
        let was = self.contains(g);
        self.0 &= !(1 << g.0);
        was
    }

    pub(crate) fn iter(self) -> impl Iterator<Item = Generation> {
        (0..MAX_GENERATIONS as u8)
            .map(Generation)
            .filter(move |g| self.contains(*g))
    }
}

impl fmt::Debug for GenerationSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// A field of the claims hash: `id` NUL `request_token`, or (planted bug) the id alone.
///
/// `slot` is the first generation that maps to this key; it indexes the claims arrays.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimKey {
    pub(crate) slot: u8,
    pub(crate) with_request_token: bool,
}

impl ClaimKey {
    pub(crate) fn index(self) -> usize {
        usize::from(self.slot)
    }
}

impl fmt::Debug for ClaimKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let g = Generation(self.slot);
        if self.with_request_token {
            write!(f, "key({g:?})")
        } else {
            write!(f, "key({})", g.submission().id)
        }
    }
}

/// A fresh owner token minted by `claim`, or by `reclaim` when it re-owns a claim: the serial
/// number of the mint, so a token is never handed out twice.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct OwnerToken(pub(crate) u8);

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration: the correct systems, or planted bugs
// ---------------------------------------------------------------------------------------------

/// Bounds and switches. [`ModelCfg::correct`] is the single-slot system the design describes,
/// [`ModelCfg::cross_slot`] the same on a Redis Cluster whose result list is in another slot;
/// the other switches plant known bugs so the tests can show the checker catches them.
#[derive(Clone, Debug)]
pub(crate) struct ModelCfg {
    /// Processor instances (at most [`MAX_INSTANCES`]).
    pub(crate) instances: usize,
    /// Which of [`SUBMISSIONS`] start in pending.
    pub(crate) generations: GenerationSet,
    /// Lease expiries a generation survives; the next one sends it to dead.
    pub(crate) max_deliveries: u8,
    /// Owner tokens minted over a run (each `claim`, each re-owning `reclaim`).
    pub(crate) max_tokens: u8,
    /// Instance crashes over a run.
    pub(crate) max_crashes: u8,
    /// Whether a reply can be lost. Always true for the correct systems; turned off only to
    /// make a planted bug show its second-shortest counterexample.
    pub(crate) lost_replies: bool,
    /// Whether an instance parks and releases claims (off in the cross-slot run, to keep its
    /// state space small: neither move touches the result list).
    pub(crate) park_and_release: bool,
    /// `ack` deletes the claim only if it still names the caller's token. When false the ack
    /// checks nothing: an `HDEL` + `LPUSH`. (An ack that checked only that the claim still
    /// exists, but not its token, would still publish once per generation in this model,
    /// since a claim key belongs to one generation and a deleted claim never comes back; what
    /// the token adds is that only the current attempt, not a zombie, moves the claim.)
    pub(crate) fenced_ack: bool,
    /// Claim key = id NUL request_token. When false, the id alone (a hole found in the first
    /// Go durable-claims version).
    pub(crate) claim_key_has_request_token: bool,
    /// `renew` succeeds only for the claim's current owner token. When false any instance
    /// holding the key keeps (or brings back) the lease, like the first Go version's
    /// heartbeat.
    pub(crate) fenced_renew: bool,
    /// Whether instances run `reclaim` at all.
    pub(crate) reclaim: bool,
    /// How a finish (ack, bury, dead letter) reaches the result list.
    pub(crate) finish: FinishPath,
    /// Cross-slot: `deliverOnce` pushes only if no marker names the claim key.
    pub(crate) deliver_checks_marker: bool,
    /// Cross-slot: a settler runs `unstage` before `deliverOnce` (planted bug).
    pub(crate) unstage_first: bool,
    /// Cross-slot: whether instances run upkeep (`staleStaged`, then steps 2 and 3) at all.
    pub(crate) upkeep: bool,
    /// Cross-slot: upkeep takes only results staged longer than a lease ago. When false it
    /// takes any staged result, racing every finisher (not a bug: see the tests).
    pub(crate) upkeep_waits_a_lease: bool,
    /// Cross-slot: when a delivered marker may be trimmed.
    pub(crate) marker_trim: MarkerTrim,
}

impl ModelCfg {
    /// The single-slot system: every finish is one script.
    pub(crate) fn correct() -> Self {
        Self {
            instances: 2,
            generations: GenerationSet(0b1111),
            max_deliveries: 2,
            max_tokens: 4,
            max_crashes: 2,
            lost_replies: true,
            park_and_release: true,
            fenced_ack: true,
            claim_key_has_request_token: true,
            fenced_renew: true,
            reclaim: true,
            finish: FinishPath::OneScript,
            deliver_checks_marker: true,
            unstage_first: false,
            upkeep: true,
            upkeep_waits_a_lease: true,
            marker_trim: MarkerTrim::Settled,
        }
    }

    /// The cross-slot system: every finish stages, delivers once and unstages. Smaller bounds
    /// than [`ModelCfg::correct`] (see the module doc): the re-used id `A#1`, `A#2`, three
    /// owner tokens, no park or release.
    pub(crate) fn cross_slot() -> Self {
        Self {
            generations: GenerationSet(0b0011),
            max_tokens: 3,
            park_and_release: false,
            finish: FinishPath::CrossSlot,
            ..Self::correct()
        }
    }

    /// [`ModelCfg::cross_slot`] with `A#1` and the malformed `M#1`, whose `INVALID_REQUEST`
    /// record is staged by `dead_letter` instead of a claim owner.
    pub(crate) fn cross_slot_dead_letter() -> Self {
        Self {
            generations: GenerationSet(0b1001),
            ..Self::cross_slot()
        }
    }

    pub(crate) fn claim_key(&self, g: Generation) -> ClaimKey {
        let slot = if self.claim_key_has_request_token {
            g.0
        } else {
            let first = SUBMISSIONS.iter().position(|s| s.id == g.submission().id);
            u8::try_from(first.expect("g itself matches")).expect("few generations")
        };
        ClaimKey {
            slot,
            with_request_token: self.claim_key_has_request_token,
        }
    }

    pub(crate) fn all_generations(&self) -> impl Iterator<Item = Generation> {
        self.generations.iter()
    }

    pub(crate) fn all_instances(&self) -> std::ops::Range<usize> {
        0..self.instances
    }

    pub(crate) fn cross_slot_finish(&self) -> bool {
        self.finish == FinishPath::CrossSlot
    }
}

// ---------------------------------------------------------------------------------------------
// Redis and the single-slot scripts
// ---------------------------------------------------------------------------------------------

/// A claim in Redis: the `claimed`, `claim-owners` and `claims-idx` entries of one key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Claim {
    pub(crate) key: ClaimKey,
    pub(crate) member: Generation,
    pub(crate) owner: OwnerToken,
    /// Redis `TIME` has passed the lease expiry: `reclaim` may take it (until the owner renews).
    pub(crate) lease_expired: bool,
}

/// What a terminal record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The gateway's real result.
    Result,
    DeadlineExceeded,
    /// The record that goes with a burial over the delivery limit.
    OverDeliveryLimit,
    /// The record that goes with a dead letter.
    InvalidRequest,
}

/// Why a generation was set aside in dead.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeadReason {
    OverDeliveryLimit,
    Malformed,
}

/// The entries one generation has in a Redis list. Two are kept, which is enough to see a
/// duplicate; a third would not change any verdict.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Records<T>(pub(crate) [Option<T>; 2]);

impl<T: Copy> Records<T> {
    pub(crate) const NONE: Self = Records([None, None]);

    pub(crate) fn push(&mut self, record: T) {
        if self.0[0].is_none() {
            self.0[0] = Some(record);
        } else {
            self.0[1] = Some(record);
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.0.iter().flatten().count()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.0.iter().flatten().copied()
    }
}

/// The Redis keys of one queue, and (cross-slot) of its result list's slot.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Redis {
    pub(crate) pending: GenerationSet,
    /// The claims hash, indexed by [`ClaimKey::slot`].
    pub(crate) claims: [Option<Claim>; MAX_GENERATIONS],
    pub(crate) parked: GenerationSet,
    /// The dead list, per generation.
    pub(crate) dead: [Records<DeadReason>; MAX_GENERATIONS],
    /// The result list, per generation.
    pub(crate) results: [Records<Outcome>; MAX_GENERATIONS],
    /// Lease expiries counted so far, per generation, saturating one above `max_deliveries`
    /// (the reclaimer that re-owned a claim to bury it can crash, and the next expiry counts).
    /// Persists across pending and claimed.
    pub(crate) deliveries: [u8; MAX_GENERATIONS],
    /// `{q}:finishing` (queue slot): claim key -> staged result, indexed by
    /// [`ClaimKey::slot`]. Empty unless the finish is [`FinishPath::CrossSlot`].
    pub(crate) staged: [Option<Staged>; MAX_GENERATIONS],
    /// `{<list>}:delivered:<q>` (the list's slot): the claim keys whose result was pushed.
    pub(crate) delivered: KeyMarks,
}

/// The reply of a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Status {
    Ok,
    /// `claim`: the member is no longer pending.
    Gone,
    /// `renew`: the claim is not yours (any more).
    Lost,
    /// A fenced move refused: the claim is gone or names another token. Nothing changed.
    Stale,
    /// `deliverOnce`: a marker already names the claim key; nothing pushed.
    AlreadyDelivered,
    /// `unstage`: nothing staged under the claim key (any more).
    NotStaged,
}

/// What `reclaim` did with one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reclaimed {
    /// The claim is gone or its lease has not expired: nothing changed.
    NotExpired,
    /// Back to pending, one more delivery counted.
    BackToPending,
    /// Past the deadline or over the limit: re-owned by the reclaimer, which must finish it.
    ReOwned(Phase),
}

impl Redis {
    pub(crate) fn new(cfg: &ModelCfg) -> Self {
        Self {
            pending: cfg.generations,
            claims: [None; MAX_GENERATIONS],
            parked: GenerationSet::default(),
            dead: [Records::NONE; MAX_GENERATIONS],
            results: [Records::NONE; MAX_GENERATIONS],
            deliveries: [0; MAX_GENERATIONS],
            staged: [None; MAX_GENERATIONS],
            delivered: KeyMarks::default(),
        }
    }

    pub(crate) fn claim_at(&self, key: ClaimKey) -> Option<Claim> {
        self.claims[key.index()]
    }

    pub(crate) fn claims(&self) -> impl Iterator<Item = Claim> + '_ {
        self.claims.iter().flatten().copied()
    }

    /// The fence every owner move shares: the claim exists and names `token`.
    pub(crate) fn owned_by(&self, key: ClaimKey, token: OwnerToken) -> bool {
        self.claim_at(key).is_some_and(|c| c.owner == token)
    }

    /// Deletes a claim the fence has let through.
    pub(crate) fn take_claim(&mut self, key: ClaimKey) -> Claim {
        self.claims[key.index()]
            .take()
            .expect("the fence checked the claim")
    }

    /// claim: pending -> claimed under a fresh owner token with a valid lease.
    pub(crate) fn claim(
        &mut self,
        cfg: &ModelCfg,
        member: Generation,
        token: OwnerToken,
    ) -> Status {
        if !self.pending.remove(member) {
            return Status::Gone;
        }
        let key = cfg.claim_key(member);
        // HSET: a claim already stored under the same key is overwritten.
        self.claims[key.index()] = Some(Claim {
            key,
            member,
            owner: token,
            lease_expired: false,
        });
        Status::Ok
    }

    /// Would `renew(key, token)` answer OK?
    pub(crate) fn renew_succeeds(&self, cfg: &ModelCfg, key: ClaimKey, token: OwnerToken) -> bool {
        match self.claim_at(key) {
            None => false,
            // As renew-2.lua: the owner token is the only fence. A lease that ran out but was
            // not reclaimed yet is still the owner's (nobody else can hold it), so it renews.
            Some(c) if cfg.fenced_renew => c.owner == token,
            // The unfenced heartbeat: "the claim exists, push its expiry out".
            Some(_) => true,
        }
    }

    /// renew: the lease is valid again, only for its owner (also after it ran out, as long as
    /// nobody reclaimed it).
    pub(crate) fn renew(&mut self, cfg: &ModelCfg, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.renew_succeeds(cfg, key, token) {
            return Status::Lost;
        }
        if let Some(c) = &mut self.claims[key.index()] {
            c.lease_expired = false;
        }
        Status::Ok
    }

    /// ack on one server: fenced; drop the claim and push the terminal record, in one step.
    /// (On a cluster the ack stages instead: [`Redis::stage`].)
    pub(crate) fn ack(
        &mut self,
        cfg: &ModelCfg,
        key: ClaimKey,
        token: OwnerToken,
        member: Generation,
        outcome: Outcome,
    ) -> Status {
        if cfg.fenced_ack {
            if !self.owned_by(key, token) {
                return Status::Stale;
            }
            let claim = self.take_claim(key);
            self.results[claim.member.index()].push(outcome);
        } else {
            // Planted bug: no fence at all; the record is for what the caller worked on.
            self.claims[key.index()] = None;
            self.results[member.index()].push(outcome);
        }
        Status::Ok
    }

    /// park: fenced; claimed -> parked (due later, `retry_count` bumped).
    pub(crate) fn park(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        self.parked.insert(claim.member);
        Status::Ok
    }

    /// promote: a due parked member -> pending.
    pub(crate) fn promote(&mut self, member: Generation) {
        if self.parked.remove(member) {
            self.pending.insert(member);
        }
    }

    /// release: fenced; claimed -> pending at the original score.
    pub(crate) fn release(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        self.pending.insert(claim.member);
        Status::Ok
    }

    /// bury on one server: fenced; claimed -> dead plus its terminal record.
    pub(crate) fn bury(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        let g = claim.member.index();
        self.dead[g].push(DeadReason::OverDeliveryLimit);
        self.results[g].push(Outcome::OverDeliveryLimit);
        Status::Ok
    }

    /// Which way `reclaim` goes for an expired claim of `member`.
    pub(crate) fn reclaim_would(
        &self,
        cfg: &ModelCfg,
        member: Generation,
        deadline_passed: bool,
    ) -> Reclaimed {
        if deadline_passed {
            Reclaimed::ReOwned(Phase::MustAckDeadlineExceeded)
        } else if self.deliveries[member.index()] + 1 >= cfg.max_deliveries {
            Reclaimed::ReOwned(Phase::MustBury)
        } else {
            Reclaimed::BackToPending
        }
    }

    /// reclaim: an expired claim counts a delivery and goes back to pending, or, past its
    /// deadline or over the limit, is re-owned by the reclaimer under `fresh` with a valid lease.
    pub(crate) fn reclaim(
        &mut self,
        cfg: &ModelCfg,
        key: ClaimKey,
        fresh: OwnerToken,
        deadline_passed: bool,
    ) -> Reclaimed {
        let Some(claim) = self.claim_at(key) else {
            return Reclaimed::NotExpired;
        };
        if !cfg.reclaim || !claim.lease_expired {
            return Reclaimed::NotExpired;
        }
        let outcome = self.reclaim_would(cfg, claim.member, deadline_passed);
        let g = claim.member.index();
        self.deliveries[g] = (self.deliveries[g] + 1).min(cfg.max_deliveries + 1);
        self.claims[key.index()] = match outcome {
            Reclaimed::BackToPending => {
                self.pending.insert(claim.member);
                None
            }
            _ => Some(Claim {
                owner: fresh,
                lease_expired: false,
                ..claim
            }),
        };
        outcome
    }

    /// dead_letter on one server: a malformed pending member -> dead plus an
    /// `INVALID_REQUEST` record. (On a cluster the record is staged: [`Redis::stage`].)
    pub(crate) fn dead_letter(&mut self, member: Generation) -> Status {
        if !member.submission().malformed || !self.pending.remove(member) {
            return Status::Gone;
        }
        self.dead[member.index()].push(DeadReason::Malformed);
        self.results[member.index()].push(Outcome::InvalidRequest);
        Status::Ok
    }

    /// Whether the generation has left the queue: a terminal record or a dead entry.
    pub(crate) fn finished(&self, g: Generation) -> bool {
        self.results[g.index()].count() > 0 || self.dead[g.index()].count() > 0
    }
}

impl fmt::Debug for Redis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pending {:?}, claims {{", self.pending)?;
        for (i, c) in self.claims().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            let lease = if c.lease_expired { "expired" } else { "valid" };
            write!(
                f,
                "{sep}{:?}: {:?} by {:?} {lease}",
                c.key, c.member, c.owner
            )?;
        }
        let per_generation = |what: &dyn Fn(Generation) -> Option<String>| {
            let items: Vec<String> = (0..MAX_GENERATIONS as u8)
                .map(Generation)
                .filter_map(|g| what(g).map(|s| format!("{g:?}: {s}")))
                .collect();
            format!("{{{}}}", items.join(", "))
        };
        let records = |g: Generation| {
            let mut all: Vec<String> = self.dead[g.index()]
                .iter()
                .map(|r| format!("dead {r:?}"))
                .collect();
            all.extend(self.results[g.index()].iter().map(|o| format!("{o:?}")));
            (!all.is_empty()).then(|| all.join(" + "))
        };
        let deliveries = |g: Generation| {
            let d = self.deliveries[g.index()];
            (d > 0).then(|| d.to_string())
        };
        write!(
            f,
            "}}, parked {:?}, records {}, deliveries {}",
            self.parked,
            per_generation(&records),
            per_generation(&deliveries)
        )?;
        self.fmt_cross_slot(f)
    }
}
