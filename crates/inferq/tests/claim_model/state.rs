//! One state of the model: [`Redis`] plus what each processor [`Instance`] holds (claims it
//! believes it owns, staged results it is settling), with the canonical encoding the checker
//! hashes (symmetry reduction) and the two "can anything still move this?" questions the
//! no-stranding property asks.

use std::fmt;
use std::hash::{Hash, Hasher};

use crate::cross_slot::{KeyMarks, SettleStep, Settling};
use crate::moves::OwnerMove;
use crate::world::{
    ClaimKey, Generation, ModelCfg, OwnerToken, Reclaimed, Redis, MAX_GENERATIONS, MAX_INSTANCES,
};

/// What an instance means to do with a claim it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Claimed it itself: runs the request, then acks the result, parks it for a retry, or
    /// releases it on shutdown. Renews meanwhile.
    Working,
    /// Got it from `reclaim` past its deadline: acks `DEADLINE_EXCEEDED`.
    MustAckDeadlineExceeded,
    /// Got it from `reclaim` over the delivery limit: buries it.
    MustBury,
    /// Go's three-step ack (planted bug): pushed the record, must drop the claim.
    GoMustDrop,
}

impl Phase {
    /// The fenced moves an instance makes on a claim in this phase.
    pub(crate) fn moves(self, cfg: &ModelCfg) -> &'static [OwnerMove] {
        use crate::world::Outcome;
        match self {
            Phase::Working if cfg.park_and_release => &[
                OwnerMove::Renew,
                OwnerMove::Ack(Outcome::Result),
                OwnerMove::Park,
                OwnerMove::Release,
            ],
            Phase::Working => &[OwnerMove::Renew, OwnerMove::Ack(Outcome::Result)],
            Phase::MustAckDeadlineExceeded => {
                &[OwnerMove::Renew, OwnerMove::Ack(Outcome::DeadlineExceeded)]
            }
            Phase::MustBury => &[OwnerMove::Renew, OwnerMove::Bury],
            Phase::GoMustDrop => &[OwnerMove::GoDrop],
        }
    }
}

/// A claim an instance believes it owns.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) key: ClaimKey,
    pub(crate) member: Generation,
    pub(crate) token: OwnerToken,
    pub(crate) phase: Phase,
}

/// A processor instance's local view, indexed by [`ClaimKey::slot`]: the claims it holds, and
/// (cross-slot) the staged results it is settling.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Instance {
    pub(crate) held: [Option<Held>; MAX_GENERATIONS],
    pub(crate) settling: [Option<Settling>; MAX_GENERATIONS],
}

impl Instance {
    pub(crate) const EMPTY: Self = Instance {
        held: [None; MAX_GENERATIONS],
        settling: [None; MAX_GENERATIONS],
    };

    pub(crate) fn holding(&self, key: ClaimKey) -> Option<Held> {
        self.held[key.index()]
    }

    pub(crate) fn all_held(&self) -> impl Iterator<Item = Held> + '_ {
        self.held.iter().flatten().copied()
    }

    pub(crate) fn settling(&self, key: ClaimKey) -> Option<Settling> {
        self.settling[key.index()]
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.held.iter().all(Option::is_none) && self.settling.iter().all(Option::is_none)
    }
}

impl fmt::Debug for Instance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.all_held().map(|h| {
            format!(
                "{:?}: ({:?}, {:?}, {:?})",
                h.key, h.member, h.token, h.phase
            )
        });
        let settling = self.settling.iter().flatten().map(|s| format!("{s:?}"));
        let all: Vec<String> = held.chain(settling).collect();
        write!(f, "{{{}}}", all.join(", "))
    }
}

/// Redis plus every instance's local state: one state of the model.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct World {
    pub(crate) redis: Redis,
    /// The processor instances; only the first `instance_count` run.
    pub(crate) instances: [Instance; MAX_INSTANCES],
    pub(crate) instance_count: usize,
    /// Owner tokens minted so far (the next token is `OwnerToken(minted)`).
    pub(crate) minted: u8,
    /// Crashes so far.
    pub(crate) crashes: u8,
    /// History, for a witness: claim keys whose settler crashed after its `deliverOnce` and
    /// before its `unstage`, while the result was still staged.
    pub(crate) crashed_before_unstage: KeyMarks,
    /// History, for a witness: upkeep unstaged a result of such a key.
    pub(crate) upkeep_settled_after_crash: bool,
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
const ENCODING: usize = 16 + 14 * MAX_GENERATIONS + 6 * MAX_GENERATIONS * MAX_INSTANCES;

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
    pub(crate) fn new(cfg: &ModelCfg) -> Self {
        assert!(cfg.instances <= MAX_INSTANCES);
        World {
            redis: Redis::new(cfg),
            instances: [Instance::EMPTY; MAX_INSTANCES],
            instance_count: cfg.instances,
            minted: 0,
            crashes: 0,
            crashed_before_unstage: KeyMarks::default(),
            upkeep_settled_after_crash: false,
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
        e.put(r.delivered.0);
        e.put(self.crashed_before_unstage.0);
        e.put(u8::from(self.upkeep_settled_after_crash));
        for (claim, ((dead, results), (deliveries, staged))) in r.claims.iter().zip(
            r.dead
                .iter()
                .zip(&r.results)
                .zip(r.deliveries.iter().zip(&r.staged)),
        ) {
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
            e.put(staged.map_or(0xFF, |s| s.encode()));
        }
        for &i in order {
            let inst = &self.instances[i];
            for (held, settling) in inst.held.iter().zip(&inst.settling) {
                match held {
                    None => e.put(0xFF),
                    Some(h) => {
                        e.key(h.key);
                        e.put(h.member.0);
                        e.token(h.token);
                        e.put(h.phase as u8);
                    }
                }
                e.put(settling.map_or(0xFF, |s| s.encode()));
            }
        }
        e.bytes
    }

    pub(crate) fn fresh_token(&self) -> OwnerToken {
        OwnerToken(self.minted)
    }

    /// Whether some instance holds `key` with exactly this token.
    pub(crate) fn holds(&self, key: ClaimKey, token: OwnerToken) -> bool {
        self.instances
            .iter()
            .any(|i| i.holding(key).is_some_and(|h| h.token == token))
    }

    /// Claims in Redis that no instance owns and that nothing can move: some instance keeps
    /// their lease alive without owning them, or `reclaim` would not take them from the lost
    /// owner even once the lease expired.
    pub(crate) fn stranded_claims<'a>(
        &'a self,
        cfg: &'a ModelCfg,
    ) -> impl Iterator<Item = ClaimKey> + 'a {
        self.redis.claims().filter_map(move |claim| {
            if self.holds(claim.key, claim.owner) {
                return None; // its owner is alive and will ack, park, release or bury it
            }
            let kept_alive = self.instances.iter().any(|i| {
                i.holding(claim.key)
                    .is_some_and(|h| self.redis.renew_succeeds(cfg, claim.key, h.token))
            });
            let mut expired = self.redis;
            expired.claims[claim.key.index()] = Some(crate::world::Claim {
                lease_expired: true,
                ..claim
            });
            let reclaimed = expired.reclaim(cfg, claim.key, self.fresh_token(), false);
            let stranded = kept_alive || reclaimed == Reclaimed::NotExpired;
            stranded.then_some(claim.key)
        })
    }

    /// Staged results that no running instance is settling and that upkeep would not settle
    /// once they are older than a lease: `staleStaged`, `deliverOnce` and `unstage` (the
    /// model's own functions, run on that hypothetical state) must leave the key unstaged and
    /// its generation with a record.
    pub(crate) fn stranded_staged<'a>(
        &'a self,
        cfg: &'a ModelCfg,
    ) -> impl Iterator<Item = ClaimKey> + 'a {
        self.redis
            .staged
            .iter()
            .enumerate()
            .filter_map(move |(slot, staged)| {
                let staged = (*staged)?;
                let key = cfg.claim_key(staged.member);
                debug_assert_eq!(key.index(), slot);
                if self.instances.iter().any(|i| i.settling(key).is_some()) {
                    return None; // a settler holds it and will deliver and unstage it
                }
                let mut aged = self.redis;
                aged.staged[slot] = Some(crate::cross_slot::Staged {
                    older_than_lease: true,
                    ..staged
                });
                let settled = aged.stale_staged(cfg, key).is_some_and(|s| {
                    let mut settler = Settling::start(cfg, s.member, s.outcome, true);
                    loop {
                        match settler.step {
                            SettleStep::Deliver => aged.deliver_once(cfg, key, settler),
                            SettleStep::Unstage => aged.unstage(key),
                        };
                        match settler.next(cfg) {
                            Some(next) => settler = next,
                            None => break,
                        }
                    }
                    aged.staged_at(key).is_none() && aged.results[s.member.index()].count() > 0
                });
                (!settled).then_some(key)
            })
    }
}
