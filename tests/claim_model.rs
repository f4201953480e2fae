//! Exhaustive model check of the durable-queue moves (`shared/design/durable-queue.md`).
//!
//! # What is modelled
//!
//! One queue in Redis, and processor instances that move request *generations* (an
//! `(id, request_token)` pair) between the places of the contract. Every move is one step of
//! the model because every move is one atomic Lua script in the real system:
//!
//! | model move      | real script                                                              |
//! |-----------------|--------------------------------------------------------------------------|
//! | `claim`         | pending member -> `<q>:claimed` / `<q>:claim-owners` / `<q>:claims-idx`  |
//! |                 | under a fresh owner token, lease valid                                   |
//! | `renew`         | fenced lease extension (one batched call per queue in the real system)   |
//! | `ack`           | fenced: drop the claim and `LPUSH` the terminal result                   |
//! | `park`          | fenced: claimed -> parked (retry backoff, bumped `retry_count`)          |
//! | `promote`       | due parked member -> pending                                             |
//! | `release`       | fenced: claimed -> pending at its original score (graceful shutdown)     |
//! | `reclaim`       | expired lease (by Redis `TIME`) -> one more delivery and back to pending;|
//! |                 | at `max_deliveries` or past its deadline the claim is re-owned by the    |
//! |                 | reclaimer, which then acks `DEADLINE_EXCEEDED` or buries it              |
//! | `bury`          | fenced: claimed -> dead plus a terminal record                           |
//! | `dead_letter`   | malformed pending member -> dead plus an `INVALID_REQUEST` record        |
//!
//! [`Redis`] holds the pending set, the claims hash (claim key -> member, owner token, whether
//! the lease has expired), the parked set, the dead list, the result list (each terminal record
//! names the generation it is for; on the wire only the id travels) and each generation's
//! delivery count. Scores are left out: they order work but do not affect safety.
//!
//! Each [`Instance`] holds the claims it believes it owns: claim key -> generation, owner token
//! and phase (working on it / must ack `DEADLINE_EXCEEDED` / must bury it).
//!
//! Nondeterminism explored at every step:
//! - any instance issues any move its local state allows. Every script call has two variants,
//!   *reply delivered* and *reply lost*: with a lost reply the script ran in Redis but the
//!   instance never learns, keeps its local state and may retry the same call later with the
//!   same token. A delivered OK updates the local state; LOST/STALE/GONE drops the claim.
//!   (`renew` only has the delivered variant: a lost renew reply leaves the same state as a
//!   delivered OK, and a lost refusal changes nothing.)
//! - any lease may expire at any moment (slow heartbeats, a GC pause, a partition). A paused
//!   instance keeps its token and comes back later as a zombie: the fence must refuse it.
//! - an instance may crash (its local state is wiped; it restarts empty) or abandon one claim
//!   (its own monotonic lease timer ran out, or its outbox gave up on the ack).
//! - a request's deadline may pass at any moment. Only `reclaim` reads the deadline, so each
//!   `reclaim` comes in both variants, "deadline passed" and "not yet". That over-approximates
//!   a deadline that, once passed, stays passed: the real behaviours are a subset.
//!
//! Taking a call and its reply as one step loses nothing: between the script running and the
//! reply arriving, no other actor reads the caller's local state, so every interleaving is
//! equivalent to "reply at once" or "reply lost", followed by the other steps.
//!
//! # Bounds (see [`ModelCfg::correct`])
//!
//! - Two instances (interchangeable: states equal up to swapping them are explored once, see
//!   [`World::canonical`]).
//! - Four generations, all pre-loaded in pending (submission only adds to pending, and a member
//!   that sits in pending is inert): `A#1` and `A#2` re-use the id `A` (two submissions with
//!   different request tokens), `B#1` is another request, and `M#1` is malformed (exercises
//!   `dead_letter`).
//! - `max_deliveries` = 2: the first lease expiry of a generation sends it back to pending, the
//!   second to dead (as `reclaim-7.lua` counts: the expiry that brings the count to
//!   `max_deliveries` buries).
//! - At most [`ModelCfg::max_tokens`] = 4 owner tokens are minted over a run (each `claim` and
//!   each re-owning `reclaim` mints one), so at most four claims happen: enough for every
//!   generation to finish plus one redelivery, or for one generation to be claimed, reclaimed,
//!   claimed again and buried. At most [`ModelCfg::max_crashes`] = 2 crashes. Lost replies,
//!   lease expiries, abandons, retries and park/promote rounds need no bound of their own:
//!   every way back to `claimed` mints a token.
//! - Reductions that lose no behaviour: states equal up to swapping the instances or renaming
//!   tokens are explored once ([`World::canonical`]); a `claim` or re-owning `reclaim` whose
//!   reply is lost is explored for `i0` only (nobody learns the token, so the caller does not
//!   matter), and a `reclaim` back to pending once (its caller and reply do not matter).
//!
//! With these bounds the correct system has about 190 000 distinct states; the BFS takes
//! 10-20 s in a debug build on two cores.
//!
//! # Properties
//!
//! - [`NO_LOSS`]: every generation is in exactly one place (pending, one claim, parked,
//!   finished); a dead generation also has its terminal record and is dead only once.
//! - [`ONE_RESULT`]: no generation ever has two terminal records.
//! - [`NO_STRANDED_CLAIM`]: every claim is owned by a token a running instance holds (which
//!   will ack, park, release or bury it), or else the reclaim path can move it: no running
//!   instance keeps its lease alive, and once the lease expires, `reclaim` (the model's own move
//!   function, evaluated on that hypothetical state) takes it from the lost owner.
//! - `sometimes` witnesses that the model is not vacuous: all generations done, both
//!   generations of the re-used id claimed at once, a zombie holding a token the fence refuses,
//!   a claim that outlived its owner, `DEADLINE_EXCEEDED`, burial over the delivery limit, a
//!   dead letter.
//!
//! [`ModelCfg`] can also plant bugs: an ack without any fence, claims keyed by id alone and an
//! unfenced heartbeat (the last two were found in review of the first Go version), or no
//! reclaim at all; the `planted_*` tests assert that the checker finds each of them.
//!
//! # Reading a counterexample
//!
//! A counterexample is printed as the start state, then one numbered line per step with the
//! script's answer, e.g. `i0 claim A#1 -> Ok with t0` or
//! `i1 Ack(Result) key(A#1) [reply lost] -> Ok with t0`, each followed by the state after the
//! step: Redis, then what each instance holds (claim key -> generation, token, phase). The
//! `planted_*` tests print a shortest one (they raise the BFS depth one step at a time; run
//! them with `-- --nocapture`); a failure of the correct model prints the path the checker
//! kept. `key(A#1)` is the claim key `A` NUL
//! `request_token`; `key(A)` appears only when claims are (wrongly) keyed by id alone. Tokens
//! are `t<n>`, numbered in minting order.

use std::collections::BTreeSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path, Property};

// ---------------------------------------------------------------------------------------------
// Generations, claim keys and owner tokens
// ---------------------------------------------------------------------------------------------

/// What a producer submitted: an id plus the request token it minted for this submission.
struct Submission {
    id: char,
    request_token: u8,
    /// Does not decode: the only way out of pending is `dead_letter`.
    malformed: bool,
}

const MAX_GENERATIONS: usize = 4;
const MAX_INSTANCES: usize = 3;

/// The generations the model can use, in order; [`ModelCfg::generations`] picks how many.
const SUBMISSIONS: [Submission; MAX_GENERATIONS] = [
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
struct Generation(u8);

impl Generation {
    fn submission(self) -> &'static Submission {
        &SUBMISSIONS[self.index()]
    }

    fn index(self) -> usize {
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
struct GenerationSet(u8);

impl GenerationSet {
    fn contains(self, g: Generation) -> bool {
        self.0 & (1 << g.0) != 0
    }

    fn insert(&mut self, g: Generation) {
        self.0 |= 1 << g.0;
    }

    /// `ZREM`: whether it was there.
    fn remove(&mut self, g: Generation) -> bool {
        let was = self.contains(g);
        self.0 &= !(1 << g.0);
        was
    }

    fn iter(self) -> impl Iterator<Item = Generation> {
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
struct ClaimKey {
    slot: u8,
    with_request_token: bool,
}

impl ClaimKey {
    fn index(self) -> usize {
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
struct OwnerToken(u8);

impl fmt::Debug for OwnerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t{}", self.0)
    }
}

// ---------------------------------------------------------------------------------------------
// Configuration: the correct system, or planted bugs
// ---------------------------------------------------------------------------------------------

/// Bounds and switches. [`ModelCfg::correct`] is the system the design describes; the other
/// switches plant known bugs so the tests can show the checker catches them.
#[derive(Clone, Debug)]
struct ModelCfg {
    /// Processor instances (at most [`MAX_INSTANCES`]).
    instances: usize,
    /// How many of [`SUBMISSIONS`] start in pending.
    generations: usize,
    /// Lease expiries a generation survives; the next one sends it to dead.
    max_deliveries: u8,
    /// Owner tokens minted over a run (each `claim`, each re-owning `reclaim`).
    max_tokens: u8,
    /// Instance crashes over a run.
    max_crashes: u8,
    /// `ack` deletes the claim only if it still names the caller's token. When false the ack
    /// checks nothing: an `HDEL` + `LPUSH`. (An ack that checked only that the claim still
    /// exists, but not its token, would still publish once per generation in this model,
    /// since a claim key belongs to one generation and a deleted claim never comes back; what
    /// the token adds is that only the current attempt, not a zombie, moves the claim.)
    fenced_ack: bool,
    /// Claim key = id NUL request_token. When false, the id alone (a hole found in the first
    /// Go durable-claims version).
    claim_key_has_request_token: bool,
    /// `renew` succeeds only for the claim's current owner token. When false any instance
    /// holding the key keeps (or brings back) the lease, like the first Go version's
    /// heartbeat.
    fenced_renew: bool,
    /// Whether instances run `reclaim` at all.
    reclaim: bool,
}

impl ModelCfg {
    fn correct() -> Self {
        Self {
            instances: 2,
            generations: 4,
            max_deliveries: 2,
            max_tokens: 4,
            max_crashes: 2,
            fenced_ack: true,
            claim_key_has_request_token: true,
            fenced_renew: true,
            reclaim: true,
        }
    }

    fn claim_key(&self, g: Generation) -> ClaimKey {
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

    fn all_generations(&self) -> impl Iterator<Item = Generation> {
        (0..self.generations).map(|i| Generation(u8::try_from(i).expect("few generations")))
    }

    fn all_instances(&self) -> std::ops::Range<usize> {
        0..self.instances
    }
}

// ---------------------------------------------------------------------------------------------
// Redis and the atomic scripts
// ---------------------------------------------------------------------------------------------

/// A claim in Redis: the `claimed`, `claim-owners` and `claims-idx` entries of one key.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Claim {
    key: ClaimKey,
    member: Generation,
    owner: OwnerToken,
    /// Redis `TIME` has passed the lease expiry: `reclaim` may take it (until the owner renews).
    lease_expired: bool,
}

/// What a terminal record says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
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
enum DeadReason {
    OverDeliveryLimit,
    Malformed,
}

/// The entries one generation has in a Redis list. Two are kept, which is enough to see a
/// duplicate; a third would not change any verdict.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Records<T>([Option<T>; 2]);

impl<T: Copy> Records<T> {
    const NONE: Self = Records([None, None]);

    fn push(&mut self, record: T) {
        if self.0[0].is_none() {
            self.0[0] = Some(record);
        } else {
            self.0[1] = Some(record);
        }
    }

    fn count(&self) -> usize {
        self.0.iter().flatten().count()
    }

    fn iter(&self) -> impl Iterator<Item = T> + '_ {
        self.0.iter().flatten().copied()
    }
}

/// The Redis keys of one queue.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Redis {
    pending: GenerationSet,
    /// The claims hash, indexed by [`ClaimKey::slot`].
    claims: [Option<Claim>; MAX_GENERATIONS],
    parked: GenerationSet,
    /// The dead list, per generation.
    dead: [Records<DeadReason>; MAX_GENERATIONS],
    /// The result list, per generation.
    results: [Records<Outcome>; MAX_GENERATIONS],
    /// Lease expiries counted so far, per generation, saturating one above `max_deliveries`
    /// (the reclaimer that re-owned a claim to bury it can crash, and the next expiry counts).
    /// Persists across pending and claimed.
    deliveries: [u8; MAX_GENERATIONS],
}

/// The reply of a script.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    Ok,
    /// `claim`: the member is no longer pending.
    Gone,
    /// `renew`: the claim is not yours (any more).
    Lost,
    /// A fenced move refused: the claim is gone or names another token. Nothing changed.
    Stale,
}

/// What `reclaim` did with one claim.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reclaimed {
    /// The claim is gone or its lease has not expired: nothing changed.
    NotExpired,
    /// Back to pending, one more delivery counted.
    BackToPending,
    /// Past the deadline or over the limit: re-owned by the reclaimer, which must finish it.
    ReOwned(Phase),
}

impl Redis {
    fn new(cfg: &ModelCfg) -> Self {
        let mut pending = GenerationSet::default();
        cfg.all_generations().for_each(|g| pending.insert(g));
        Self {
            pending,
            claims: [None; MAX_GENERATIONS],
            parked: GenerationSet::default(),
            dead: [Records::NONE; MAX_GENERATIONS],
            results: [Records::NONE; MAX_GENERATIONS],
            deliveries: [0; MAX_GENERATIONS],
        }
    }

    fn claim_at(&self, key: ClaimKey) -> Option<Claim> {
        self.claims[key.index()]
    }

    fn claims(&self) -> impl Iterator<Item = Claim> + '_ {
        self.claims.iter().flatten().copied()
    }

    /// The fence every owner move shares: the claim exists and names `token`.
    fn owned_by(&self, key: ClaimKey, token: OwnerToken) -> bool {
        self.claim_at(key).is_some_and(|c| c.owner == token)
    }

    /// Deletes a claim the fence has let through.
    fn take_claim(&mut self, key: ClaimKey) -> Claim {
        self.claims[key.index()]
            .take()
            .expect("the fence checked the claim")
    }

    /// claim: pending -> claimed under a fresh owner token with a valid lease.
    fn claim(&mut self, cfg: &ModelCfg, member: Generation, token: OwnerToken) -> Status {
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
    fn renew_succeeds(&self, cfg: &ModelCfg, key: ClaimKey, token: OwnerToken) -> bool {
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
    fn renew(&mut self, cfg: &ModelCfg, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.renew_succeeds(cfg, key, token) {
            return Status::Lost;
        }
        if let Some(c) = &mut self.claims[key.index()] {
            c.lease_expired = false;
        }
        Status::Ok
    }

    /// ack: fenced; drop the claim and push the terminal record, in one step.
    fn ack(
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
    fn park(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        self.parked.insert(claim.member);
        Status::Ok
    }

    /// promote: a due parked member -> pending.
    fn promote(&mut self, member: Generation) {
        if self.parked.remove(member) {
            self.pending.insert(member);
        }
    }

    /// release: fenced; claimed -> pending at the original score.
    fn release(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
        if !self.owned_by(key, token) {
            return Status::Stale;
        }
        let claim = self.take_claim(key);
        self.pending.insert(claim.member);
        Status::Ok
    }

    /// bury: fenced; claimed -> dead plus its terminal record.
    fn bury(&mut self, key: ClaimKey, token: OwnerToken) -> Status {
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
    fn reclaim_would(
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
    fn reclaim(
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

    /// dead_letter: a malformed pending member -> dead plus an `INVALID_REQUEST` record.
    fn dead_letter(&mut self, member: Generation) {
        if member.submission().malformed && self.pending.remove(member) {
            self.dead[member.index()].push(DeadReason::Malformed);
            self.results[member.index()].push(Outcome::InvalidRequest);
        }
    }

    /// Whether the generation has left the queue: a terminal record or a dead entry.
    fn finished(&self, g: Generation) -> bool {
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
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Instances and the whole world
// ---------------------------------------------------------------------------------------------

/// What an instance means to do with a claim it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Claimed it itself: runs the request, then acks the result, parks it for a retry, or
    /// releases it on shutdown. Renews meanwhile.
    Working,
    /// Got it from `reclaim` past its deadline: acks `DEADLINE_EXCEEDED`.
    MustAckDeadlineExceeded,
    /// Got it from `reclaim` over the delivery limit: buries it.
    MustBury,
}

impl Phase {
    /// The fenced moves an instance makes on a claim in this phase.
    fn moves(self) -> &'static [OwnerMove] {
        match self {
            Phase::Working => &[
                OwnerMove::Renew,
                OwnerMove::Ack(Outcome::Result),
                OwnerMove::Park,
                OwnerMove::Release,
            ],
            Phase::MustAckDeadlineExceeded => {
                &[OwnerMove::Renew, OwnerMove::Ack(Outcome::DeadlineExceeded)]
            }
            Phase::MustBury => &[OwnerMove::Renew, OwnerMove::Bury],
        }
    }
}

/// A claim an instance believes it owns.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Held {
    key: ClaimKey,
    member: Generation,
    token: OwnerToken,
    phase: Phase,
}

/// A processor instance's local view: the claims it holds, indexed by [`ClaimKey::slot`].
#[derive(Clone, Copy, PartialEq, Eq)]
struct Instance {
    held: [Option<Held>; MAX_GENERATIONS],
}

impl Instance {
    const EMPTY: Self = Instance {
        held: [None; MAX_GENERATIONS],
    };

    fn holding(&self, key: ClaimKey) -> Option<Held> {
        self.held[key.index()]
    }

    fn all_held(&self) -> impl Iterator<Item = Held> + '_ {
        self.held.iter().flatten().copied()
    }

    fn is_empty(&self) -> bool {
        self.held.iter().all(Option::is_none)
    }
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map()
            .entries(
                self.all_held()
                    .map(|h| (h.key, (h.member, h.token, h.phase))),
            )
            .finish()
    }
}

/// Redis plus every instance's local state: one state of the model.
#[derive(Clone, Copy, PartialEq, Eq)]
struct World {
    redis: Redis,
    /// The processor instances; only the first `instance_count` run.
    instances: [Instance; MAX_INSTANCES],
    instance_count: usize,
    /// Owner tokens minted so far (the next token is `OwnerToken(minted)`).
    minted: u8,
    /// Crashes so far.
    crashes: u8,
}

impl fmt::Debug for World {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "redis: {:?}", self.redis)?;
        for (i, inst) in self.instances.iter().enumerate() {
            if !inst.is_empty() {
                write!(f, "\n        i{i} holds {inst:?}")?;
            }
        }
        Ok(())
    }
}

/// The checker identifies states by hash. Hashing the canonical encoding makes states that
/// differ only in which instance is which, or in the names of tokens, one state (symmetry
/// reduction). Equal worlds encode equally, so this agrees with `Eq`.
impl Hash for World {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.canonical().hash(state);
    }
}

/// Bytes of a world's canonical encoding (more than enough for the bounds above).
const ENCODING: usize = 8 + 12 * MAX_GENERATIONS + 5 * MAX_GENERATIONS * MAX_INSTANCES;

/// An append-only byte buffer on the stack.
struct Encoder {
    bytes: [u8; ENCODING],
    len: usize,
    /// Owner tokens in order of first appearance; a token is encoded as its position here.
    tokens: [Option<OwnerToken>; 16],
}

impl Encoder {
    fn put(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    fn token(&mut self, t: OwnerToken) {
        let i = self
            .tokens
            .iter()
            .position(|n| *n == Some(t) || n.is_none())
            .expect("few tokens");
        self.tokens[i] = Some(t);
        self.put(u8::try_from(i).expect("few tokens"));
    }

    fn key(&mut self, k: ClaimKey) {
        self.put(k.slot * 2 + u8::from(k.with_request_token));
    }
}

impl World {
    fn new(cfg: &ModelCfg) -> Self {
        assert!(cfg.instances <= MAX_INSTANCES && cfg.generations <= MAX_GENERATIONS);
        World {
            redis: Redis::new(cfg),
            instances: [Instance::EMPTY; MAX_INSTANCES],
            instance_count: cfg.instances,
            minted: 0,
            crashes: 0,
        }
    }

    /// The least encoding over all orders of the instances, with owner tokens renamed in order
    /// of first appearance. Renaming is sound because tokens are only ever compared for
    /// equality and a new token is always fresh; reordering because the instances run the same
    /// code.
    fn canonical(&self) -> [u8; ENCODING] {
        const ORDERS: [[usize; MAX_INSTANCES]; 6] = [
            [0, 1, 2],
            [1, 0, 2],
            [0, 2, 1],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        // Instances past `instance_count` never act; only the running ones are reordered.
        let orders = match self.instance_count {
            0 | 1 => 1,
            2 => 2,
            _ => 6,
        };
        ORDERS[..orders]
            .iter()
            .map(|order| self.encode(order))
            .min()
            .expect("at least one order")
    }

    fn encode(&self, order: &[usize; MAX_INSTANCES]) -> [u8; ENCODING] {
        let mut e = Encoder {
            bytes: [0; ENCODING],
            len: 0,
            tokens: [None; 16],
        };
        let r = &self.redis;
        e.put(self.minted);
        e.put(self.crashes);
        e.put(r.pending.0);
        e.put(r.parked.0);
        for (claim, ((dead, results), deliveries)) in r
            .claims
            .iter()
            .zip(r.dead.iter().zip(&r.results).zip(&r.deliveries))
        {
            match claim {
                None => e.put(0xFF),
                Some(c) => {
                    e.key(c.key);
                    e.put(c.member.0);
                    e.token(c.owner);
                    e.put(u8::from(c.lease_expired));
                }
            }
            for d in dead.0 {
                e.put(d.map_or(0xFF, |d| d as u8));
            }
            for o in results.0 {
                e.put(o.map_or(0xFF, |o| o as u8));
            }
            e.put(*deliveries);
        }
        for &i in order {
            for held in self.instances[i].held {
                match held {
                    None => e.put(0xFF),
                    Some(h) => {
                        e.key(h.key);
                        e.put(h.member.0);
                        e.token(h.token);
                        e.put(h.phase as u8);
                    }
                }
            }
        }
        e.bytes
    }

    fn fresh_token(&self) -> OwnerToken {
        OwnerToken(self.minted)
    }

    /// Whether some instance holds `key` with exactly this token.
    fn holds(&self, key: ClaimKey, token: OwnerToken) -> bool {
        self.instances
            .iter()
            .any(|i| i.holding(key).is_some_and(|h| h.token == token))
    }

    /// Claims in Redis that no instance owns and that nothing can move: some instance keeps
    /// their lease alive without owning them, or `reclaim` would not take them from the lost
    /// owner even once the lease expired.
    fn stranded_claims<'a>(&'a self, cfg: &'a ModelCfg) -> impl Iterator<Item = ClaimKey> + 'a {
        self.redis.claims().filter_map(move |claim| {
            if self.holds(claim.key, claim.owner) {
                return None; // its owner is alive and will ack, park, release or bury it
            }
            let kept_alive = self.instances.iter().any(|i| {
                i.holding(claim.key)
                    .is_some_and(|h| self.redis.renew_succeeds(cfg, claim.key, h.token))
            });
            let mut expired = self.redis;
            expired.claims[claim.key.index()] = Some(Claim {
                lease_expired: true,
                ..claim
            });
            let reclaimed = expired.reclaim(cfg, claim.key, self.fresh_token(), false);
            let stranded = kept_alive || reclaimed == Reclaimed::NotExpired;
            stranded.then_some(claim.key)
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

/// Whether the caller hears the script's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reply {
    Delivered,
    Lost,
}

const REPLIES: [Reply; 2] = [Reply::Delivered, Reply::Lost];

/// The reply variants explored for a call that creates a claim (`claim`, a re-owning
/// `reclaim`) made by `instance`: when the reply is lost nobody learns the new token, so which
/// instance made the call makes no difference and only `i0` is explored.
fn replies_heard_by(instance: usize) -> &'static [Reply] {
    if instance == 0 {
        &REPLIES
    } else {
        &REPLIES[..1]
    }
}

/// A fenced move an instance makes on a claim it holds, with the token it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OwnerMove {
    Renew,
    Ack(Outcome),
    Park,
    Release,
    Bury,
}

/// One step of the world.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Action {
    /// An instance runs `claim` on a pending member.
    Claim {
        instance: usize,
        member: Generation,
        reply: Reply,
    },
    /// An instance runs a fenced move on a claim it holds.
    Owner {
        instance: usize,
        key: ClaimKey,
        op: OwnerMove,
        reply: Reply,
    },
    /// An instance runs `reclaim` on an expired claim. (When it goes back to pending, which
    /// instance ran it and whether it heard back make no difference; only `i0` is explored.)
    Reclaim {
        instance: usize,
        key: ClaimKey,
        deadline_passed: bool,
        reply: Reply,
    },
    /// Some instance runs `promote` on a parked member.
    Promote { member: Generation },
    /// Some instance runs `dead_letter` on a malformed pending member.
    DeadLetter { member: Generation },
    /// Redis `TIME` passes a claim's lease expiry.
    ExpireLease { key: ClaimKey },
    /// An instance drops one claim locally (its own lease timer ran out, its outbox gave up).
    Abandon { instance: usize, key: ClaimKey },
    /// An instance crashes and restarts holding nothing.
    Crash { instance: usize },
}

fn lost(reply: Reply) -> &'static str {
    match reply {
        Reply::Delivered => "",
        Reply::Lost => " [reply lost]",
    }
}

impl fmt::Debug for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Action::Claim {
                instance,
                member,
                reply,
            } => write!(f, "i{instance} claim {member:?}{}", lost(reply)),
            Action::Owner {
                instance,
                key,
                op,
                reply,
            } => write!(f, "i{instance} {op:?} {key:?}{}", lost(reply)),
            Action::Reclaim {
                instance,
                key,
                deadline_passed,
                reply,
            } => {
                let deadline = if deadline_passed {
                    " (deadline passed)"
                } else {
                    ""
                };
                write!(f, "i{instance} reclaim {key:?}{deadline}{}", lost(reply))
            }
            Action::Promote { member } => write!(f, "promote {member:?}"),
            Action::DeadLetter { member } => write!(f, "dead_letter {member:?}"),
            Action::ExpireLease { key } => write!(f, "lease of {key:?} expires"),
            Action::Abandon { instance, key } => write!(f, "i{instance} abandons {key:?}"),
            Action::Crash { instance } => write!(f, "i{instance} crashes"),
        }
    }
}

/// What the step's script answered, for reading counterexamples.
#[derive(Debug)]
enum Answer {
    Nothing,
    Script(Status, OwnerToken),
    Reclaim(Reclaimed, OwnerToken),
    OutOfBudget,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Nothing => Ok(()),
            Answer::Script(s, t) => write!(f, " -> {s:?} with {t:?}"),
            Answer::Reclaim(r @ Reclaimed::ReOwned(_), t) => write!(f, " -> {r:?} as {t:?}"),
            Answer::Reclaim(r, _) => write!(f, " -> {r:?}"),
            Answer::OutOfBudget => write!(f, " -> (beyond the bounds)"),
        }
    }
}

struct ClaimModel {
    cfg: ModelCfg,
}

const NO_LOSS: &str = "no loss: every generation is in exactly one place";
const ONE_RESULT: &str = "one terminal record per generation";
const NO_STRANDED_CLAIM: &str = "no stranded claim";
const ALL_DONE: &str = "all generations can reach done";
const REUSED_ID_CLAIMED_TWICE: &str = "both generations of a re-used id claimed at once";
const ZOMBIE: &str = "a zombie holds a token the fence refuses";
const ORPHANED_CLAIM: &str = "a claim outlives its owner and awaits reclaim";
const DEADLINE_EXCEEDED: &str = "a claim is finished as DEADLINE_EXCEEDED";
const BURIED: &str = "a claim is buried over the delivery limit";
const DEAD_LETTERED: &str = "a malformed member is dead-lettered";

impl ClaimModel {
    /// Applies `action` to `world`.
    fn step(&self, world: &mut World, action: Action) -> Answer {
        let cfg = &self.cfg;
        match action {
            Action::Claim {
                instance,
                member,
                reply,
            } => {
                if world.minted >= cfg.max_tokens {
                    return Answer::OutOfBudget;
                }
                let token = world.fresh_token();
                world.minted += 1;
                let status = world.redis.claim(cfg, member, token);
                if status == Status::Ok && reply == Reply::Delivered {
                    let key = cfg.claim_key(member);
                    world.instances[instance].held[key.index()] = Some(Held {
                        key,
                        member,
                        token,
                        phase: Phase::Working,
                    });
                }
                Answer::Script(status, token)
            }
            Action::Owner {
                instance,
                key,
                op,
                reply,
            } => {
                let Some(held) = world.instances[instance].holding(key) else {
                    return Answer::Nothing;
                };
                let (redis, token) = (&mut world.redis, held.token);
                let status = match op {
                    OwnerMove::Renew => redis.renew(cfg, key, token),
                    OwnerMove::Ack(outcome) => redis.ack(cfg, key, token, held.member, outcome),
                    OwnerMove::Park => redis.park(key, token),
                    OwnerMove::Release => redis.release(key, token),
                    OwnerMove::Bury => redis.bury(key, token),
                };
                // A renewed claim stays held; any other OK, and every refusal, drops it.
                let keep = op == OwnerMove::Renew && status == Status::Ok;
                if reply == Reply::Delivered && !keep {
                    world.instances[instance].held[key.index()] = None;
                }
                Answer::Script(status, token)
            }
            Action::Reclaim {
                instance,
                key,
                deadline_passed,
                reply,
            } => {
                let Some(claim) = world.redis.claim_at(key) else {
                    return Answer::Nothing;
                };
                let token = world.fresh_token();
                let reowns = matches!(
                    world
                        .redis
                        .reclaim_would(cfg, claim.member, deadline_passed),
                    Reclaimed::ReOwned(_)
                );
                if reowns && world.minted >= cfg.max_tokens {
                    return Answer::OutOfBudget;
                }
                let outcome = world.redis.reclaim(cfg, key, token, deadline_passed);
                if let Reclaimed::ReOwned(phase) = outcome {
                    world.minted += 1;
                    if reply == Reply::Delivered {
                        world.instances[instance].held[key.index()] = Some(Held {
                            key,
                            member: claim.member,
                            token,
                            phase,
                        });
                    }
                }
                Answer::Reclaim(outcome, token)
            }
            Action::Promote { member } => {
                world.redis.promote(member);
                Answer::Nothing
            }
            Action::DeadLetter { member } => {
                world.redis.dead_letter(member);
                Answer::Nothing
            }
            Action::ExpireLease { key } => {
                if let Some(c) = &mut world.redis.claims[key.index()] {
                    c.lease_expired = true;
                }
                Answer::Nothing
            }
            Action::Abandon { instance, key } => {
                world.instances[instance].held[key.index()] = None;
                Answer::Nothing
            }
            Action::Crash { instance } => {
                if world.crashes >= cfg.max_crashes {
                    return Answer::OutOfBudget;
                }
                world.crashes += 1;
                world.instances[instance] = Instance::EMPTY;
                Answer::Nothing
            }
        }
    }
}

impl Model for ClaimModel {
    type State = World;
    type Action = Action;

    fn init_states(&self) -> Vec<World> {
        vec![World::new(&self.cfg)]
    }

    fn actions(&self, world: &World, actions: &mut Vec<Action>) {
        let (cfg, redis) = (&self.cfg, &world.redis);
        for instance in cfg.all_instances() {
            for member in redis.pending.iter() {
                if !member.submission().malformed {
                    for &reply in replies_heard_by(instance) {
                        actions.push(Action::Claim {
                            instance,
                            member,
                            reply,
                        });
                    }
                }
            }
            for held in world.instances[instance].all_held() {
                let key = held.key;
                for &op in held.phase.moves() {
                    let replies: &[Reply] = if op == OwnerMove::Renew {
                        &[Reply::Delivered]
                    } else {
                        &REPLIES
                    };
                    for &reply in replies {
                        actions.push(Action::Owner {
                            instance,
                            key,
                            op,
                            reply,
                        });
                    }
                }
                actions.push(Action::Abandon { instance, key });
            }
            if !world.instances[instance].is_empty() {
                actions.push(Action::Crash { instance });
            }
        }
        for claim in redis.claims() {
            let key = claim.key;
            if !claim.lease_expired {
                actions.push(Action::ExpireLease { key });
                continue;
            }
            for deadline_passed in [false, true] {
                match redis.reclaim_would(cfg, claim.member, deadline_passed) {
                    Reclaimed::BackToPending => actions.push(Action::Reclaim {
                        instance: 0,
                        key,
                        deadline_passed,
                        reply: Reply::Delivered,
                    }),
                    _ => {
                        for instance in cfg.all_instances() {
                            for &reply in replies_heard_by(instance) {
                                actions.push(Action::Reclaim {
                                    instance,
                                    key,
                                    deadline_passed,
                                    reply,
                                });
                            }
                        }
                    }
                }
            }
        }
        for member in redis.parked.iter() {
            actions.push(Action::Promote { member });
        }
        for member in redis.pending.iter() {
            if member.submission().malformed {
                actions.push(Action::DeadLetter { member });
            }
        }
    }

    fn next_state(&self, world: &World, action: Action) -> Option<World> {
        let mut next = *world;
        self.step(&mut next, action);
        (next != *world).then_some(next)
    }

    fn format_step(&self, world: &World, action: Action) -> Option<String> {
        let mut next = *world;
        let answer = self.step(&mut next, action);
        Some(format!("{action:?}{answer}\n        {next:?}"))
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(NO_LOSS, |m: &Self, w: &World| {
                let r = &w.redis;
                m.cfg.all_generations().all(|g| {
                    let places = usize::from(r.pending.contains(g))
                        + r.claims().filter(|c| c.member == g).count()
                        + usize::from(r.parked.contains(g))
                        + usize::from(r.finished(g));
                    let dead = r.dead[g.index()].count();
                    places == 1 && dead <= 1 && (dead == 0 || r.results[g.index()].count() > 0)
                })
            }),
            Property::always(ONE_RESULT, |m: &Self, w: &World| {
                m.cfg
                    .all_generations()
                    .all(|g| w.redis.results[g.index()].count() <= 1)
            }),
            Property::always(NO_STRANDED_CLAIM, |m: &Self, w: &World| {
                w.stranded_claims(&m.cfg).next().is_none()
            }),
            Property::sometimes(ALL_DONE, |m: &Self, w: &World| {
                m.cfg
                    .all_generations()
                    .all(|g| w.redis.results[g.index()].count() == 1)
            }),
            Property::sometimes(REUSED_ID_CLAIMED_TWICE, |_: &Self, w: &World| {
                let claimed = |g| w.redis.claims().any(|c| c.member == Generation(g));
                claimed(0) && claimed(1)
            }),
            Property::sometimes(ZOMBIE, |_: &Self, w: &World| {
                w.instances
                    .iter()
                    .flat_map(Instance::all_held)
                    .any(|h| w.redis.claim_at(h.key).is_some() && !w.redis.owned_by(h.key, h.token))
            }),
            Property::sometimes(ORPHANED_CLAIM, |_: &Self, w: &World| {
                w.redis.claims().any(|c| !w.holds(c.key, c.owner))
            }),
            Property::sometimes(DEADLINE_EXCEEDED, |_: &Self, w: &World| {
                w.redis
                    .results
                    .iter()
                    .any(|r| r.iter().any(|o| o == Outcome::DeadlineExceeded))
            }),
            Property::sometimes(BURIED, |_: &Self, w: &World| {
                w.redis
                    .dead
                    .iter()
                    .any(|d| d.iter().any(|r| r == DeadReason::OverDeliveryLimit))
            }),
            Property::sometimes(DEAD_LETTERED, |_: &Self, w: &World| {
                w.redis
                    .dead
                    .iter()
                    .any(|d| d.iter().any(|r| r == DeadReason::Malformed))
            }),
        ]
    }
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// Renders a path: the start state, then one numbered step per line with the script's answer
/// and the state after it.
fn explain(model: &ClaimModel, path: Path<World, Action>) -> String {
    let steps = path.into_vec();
    let mut out = format!("    start\n        {:?}\n", steps[0].0);
    for (n, (world, action)) in steps.iter().enumerate() {
        if let Some(action) = action {
            let line = model.format_step(world, *action).expect("always rendered");
            out.push_str(&format!("{:>4}. {line}\n", n + 1));
        }
    }
    out
}

/// Explores every state of the correct system within the bounds.
#[test]
fn correct_moves_keep_the_contract() {
    let started = Instant::now();
    let model = ClaimModel {
        cfg: ModelCfg::correct(),
    };
    let checker = model.checker().threads(2).spawn_bfs().join();
    let unique = checker.unique_state_count();
    println!(
        "claim model, correct moves: {unique} unique states, {} generated, max depth {}, {:?}",
        checker.state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    for p in checker.model().properties() {
        if let (true, Some(path)) = (
            p.expectation.discovery_is_failure(),
            checker.discovery(p.name),
        ) {
            panic!(
                "counterexample to \"{}\":\n{}",
                p.name,
                explain(checker.model(), path)
            );
        }
    }
    checker.assert_properties();
    assert!(
        unique > 10_000,
        "only {unique} states explored: too few to mean anything"
    );
}

/// Runs the checker on a model with a planted bug until `property` fails, prints the
/// counterexample and returns its length in steps.
///
/// The BFS checker keeps the *last* violating state it checked, so the depth is raised one
/// step at a time and the first depth with a discovery gives a shortest counterexample.
fn shortest_counterexample(cfg: ModelCfg, property: &'static str) -> usize {
    let started = Instant::now();
    let mut explored = 0;
    for depth in 2..=40 {
        let checker = ClaimModel { cfg: cfg.clone() }
            .checker()
            .target_max_depth(depth)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        explored += checker.unique_state_count();
        if let Some(path) = checker.discovery(property) {
            let steps = path.clone().into_actions().len();
            println!(
                "planted bug {cfg:?}\n  \"{property}\" fails after {steps} steps \
                 ({explored} unique states over all depths, {:?}):\n{}",
                started.elapsed(),
                explain(checker.model(), path)
            );
            return steps;
        }
    }
    panic!("the checker missed the planted bug {cfg:?}: \"{property}\" holds");
}

/// An ack that does not check the owner token publishes a second result (a retried ack whose
/// reply was lost, or a zombie's).
#[test]
fn planted_unfenced_ack_publishes_two_results() {
    let cfg = ModelCfg {
        fenced_ack: false,
        ..ModelCfg::correct()
    };
    assert!(shortest_counterexample(cfg, ONE_RESULT) > 0);
}

/// Claims keyed by id alone: claiming the second generation of a re-used id overwrites the
/// first one's claim, which vanishes.
#[test]
fn planted_claims_keyed_by_id_alone_lose_a_reused_id() {
    let cfg = ModelCfg {
        claim_key_has_request_token: false,
        ..ModelCfg::correct()
    };
    assert!(shortest_counterexample(cfg, NO_LOSS) > 0);
}

/// An unfenced heartbeat lets a zombie keep alive a claim whose real owner crashed.
#[test]
fn planted_unfenced_renew_strands_a_claim() {
    let cfg = ModelCfg {
        fenced_renew: false,
        ..ModelCfg::correct()
    };
    assert!(shortest_counterexample(cfg, NO_STRANDED_CLAIM) > 0);
}

/// Without reclaim, a claim whose owner crashed is never moved again.
#[test]
fn planted_missing_reclaim_strands_a_claim() {
    let cfg = ModelCfg {
        reclaim: false,
        ..ModelCfg::correct()
    };
    assert!(shortest_counterexample(cfg, NO_STRANDED_CLAIM) > 0);
}
