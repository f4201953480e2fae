//! The steps of the model: every [`Action`] an actor can take in a [`World`], what each does
//! ([`ClaimModel::step`], which calls the scripts of `world.rs` and `cross_slot.rs`), and the
//! `stateright` [`Model`] that enumerates them. The properties are in `properties.rs`.

use std::fmt;

use stateright::{Model, Property};

use crate::cross_slot::{FinishPath, MarkerTrim, SettleStep, Settling};
use crate::state::{Held, Instance, Phase, World};
use crate::world::{ClaimKey, Generation, ModelCfg, Outcome, OwnerToken, Reclaimed, Status};

/// Whether the caller hears the script's reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    Delivered,
    Lost,
}

const REPLIES: [Reply; 2] = [Reply::Delivered, Reply::Lost];

/// A fenced move an instance makes on a claim it holds, with the token it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OwnerMove {
    Renew,
    /// One script, a `stage` (cross-slot) or Go's push, by [`ModelCfg::finish`].
    Ack(Outcome),
    Park,
    Release,
    /// One script, or a `stage` (cross-slot).
    Bury,
    /// Go's third step: drop the claim after the push.
    GoDrop,
}

impl OwnerMove {
    /// The record a finishing move makes.
    fn finishes(self) -> Option<Outcome> {
        match self {
            OwnerMove::Ack(o) => Some(o),
            OwnerMove::Bury => Some(Outcome::OverDeliveryLimit),
            _ => None,
        }
    }
}

/// One step of the world.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
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
    /// An instance runs `dead_letter` on a malformed pending member. (On one server the caller
    /// and its reply make no difference; only `i0` hearing it is explored.)
    DeadLetter {
        instance: usize,
        member: Generation,
        reply: Reply,
    },
    /// Redis `TIME` passes a claim's lease expiry.
    ExpireLease { key: ClaimKey },
    /// An instance drops one claim locally (its own lease timer ran out, its outbox gave up).
    Abandon { instance: usize, key: ClaimKey },
    /// An instance crashes and restarts holding nothing.
    Crash { instance: usize },
    /// Cross-slot: a settler makes its next step (`deliverOnce` or `unstage`).
    Settle {
        instance: usize,
        key: ClaimKey,
        reply: Reply,
    },
    /// Cross-slot: an instance's upkeep reads a staged result with `staleStaged` and becomes
    /// its settler. (A lost reply of this read-only script changes nothing: not explored.)
    Upkeep { instance: usize, key: ClaimKey },
    /// Cross-slot: a settler gives up (an error, or its finish took over half a lease), leaving
    /// the staged result to upkeep.
    GiveUp { instance: usize, key: ClaimKey },
    /// Cross-slot: Redis `TIME` passes a lease since the result was staged.
    StagedAges { key: ClaimKey },
    /// Cross-slot: a `deliverOnce` on the list trims the marker of `key`.
    TrimMarker { key: ClaimKey },
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
            Action::DeadLetter {
                instance,
                member,
                reply,
            } => write!(f, "i{instance} dead_letter {member:?}{}", lost(reply)),
            Action::ExpireLease { key } => write!(f, "lease of {key:?} expires"),
            Action::Abandon { instance, key } => write!(f, "i{instance} abandons {key:?}"),
            Action::Crash { instance } => write!(f, "i{instance} crashes"),
            Action::Settle {
                instance,
                key,
                reply,
            } => write!(f, "i{instance} settles {key:?}{}", lost(reply)),
            Action::Upkeep { instance, key } => {
                write!(f, "i{instance} upkeep reads staged {key:?}")
            }
            Action::GiveUp { instance, key } => {
                write!(f, "i{instance} leaves staged {key:?} to upkeep")
            }
            Action::StagedAges { key } => write!(f, "staged {key:?} is older than a lease"),
            Action::TrimMarker { key } => write!(f, "the marker of {key:?} is trimmed"),
        }
    }
}

/// What the step's script answered, for reading counterexamples.
#[derive(Debug)]
pub(crate) enum Answer {
    Nothing,
    Script(Status, OwnerToken),
    Reclaim(Reclaimed, OwnerToken),
    /// A script without a token (`dead_letter`, `deliverOnce`, `unstage`).
    Status(SettleStep, Status),
    DeadLetter(Status),
    OutOfBudget,
}

impl fmt::Display for Answer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Answer::Nothing => Ok(()),
            Answer::Script(s, t) => write!(f, " -> {s:?} with {t:?}"),
            Answer::Reclaim(r @ Reclaimed::ReOwned(_), t) => write!(f, " -> {r:?} as {t:?}"),
            Answer::Reclaim(r, _) => write!(f, " -> {r:?}"),
            Answer::Status(step, s) => write!(f, ": {step:?} -> {s:?}"),
            Answer::DeadLetter(s) => write!(f, " -> {s:?}"),
            Answer::OutOfBudget => write!(f, " -> (beyond the bounds)"),
        }
    }
}

/// The model: the configuration is all it holds.
pub(crate) struct ClaimModel {
    pub(crate) cfg: ModelCfg,
}

impl ClaimModel {
    /// The reply variants explored for a call.
    fn replies(&self) -> &'static [Reply] {
        if self.cfg.lost_replies {
            &REPLIES
        } else {
            &REPLIES[..1]
        }
    }

    /// The reply variants explored for a call whose lost reply leaves the same state whoever
    /// made it (a call that creates a claim or a staged result nobody learns of): only `i0`
    /// loses it.
    fn replies_heard_by(&self, instance: usize) -> &'static [Reply] {
        if instance == 0 {
            self.replies()
        } else {
            &REPLIES[..1]
        }
    }

    /// Applies `action` to `world`.
    pub(crate) fn step(&self, world: &mut World, action: Action) -> Answer {
        let cfg = &self.cfg;
        match action {
            Action::Claim {
                instance,
                member,
                reply,
            } => self.claim(world, instance, member, reply),
            Action::Owner {
                instance,
                key,
                op,
                reply,
            } => self.owner_move(world, instance, key, op, reply),
            Action::Reclaim {
                instance,
                key,
                deadline_passed,
                reply,
            } => self.reclaim(world, instance, key, deadline_passed, reply),
            Action::Promote { member } => {
                world.redis.promote(member);
                Answer::Nothing
            }
            Action::DeadLetter {
                instance,
                member,
                reply,
            } => self.dead_letter(world, instance, member, reply),
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
            Action::Crash { instance } => self.crash(world, instance),
            Action::Settle {
                instance,
                key,
                reply,
            } => self.settle(world, instance, key, reply),
            Action::Upkeep { instance, key } => {
                if let Some(s) = world.redis.stale_staged(cfg, key) {
                    world.instances[instance].settling[key.index()] =
                        Some(Settling::start(cfg, s.member, s.outcome, true));
                }
                Answer::Nothing
            }
            Action::GiveUp { instance, key } => {
                world.instances[instance].settling[key.index()] = None;
                Answer::Nothing
            }
            Action::StagedAges { key } => {
                if let Some(s) = &mut world.redis.staged[key.index()] {
                    s.older_than_lease = true;
                }
                Answer::Nothing
            }
            Action::TrimMarker { key } => {
                world.redis.delivered.remove(key);
                Answer::Nothing
            }
        }
    }

    fn claim(
        &self,
        world: &mut World,
        instance: usize,
        member: Generation,
        reply: Reply,
    ) -> Answer {
        let cfg = &self.cfg;
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

    fn owner_move(
        &self,
        world: &mut World,
        instance: usize,
        key: ClaimKey,
        op: OwnerMove,
        reply: Reply,
    ) -> Answer {
        let cfg = &self.cfg;
        let Some(held) = world.instances[instance].holding(key) else {
            return Answer::Nothing;
        };
        let (redis, token) = (&mut world.redis, held.token);
        let status = match (op, cfg.finish) {
            (OwnerMove::Renew, _) => redis.renew(cfg, key, token),
            (OwnerMove::Ack(o), FinishPath::OneScript) => {
                redis.ack(cfg, key, token, held.member, o)
            }
            (OwnerMove::Ack(o), FinishPath::GoThreeSteps) => redis.go_push(key, token, o),
            (OwnerMove::Ack(o), FinishPath::CrossSlot) => redis.stage(key, token, o),
            (OwnerMove::Bury, FinishPath::CrossSlot) => {
                redis.stage(key, token, Outcome::OverDeliveryLimit)
            }
            (OwnerMove::Bury, _) => redis.bury(key, token),
            (OwnerMove::Park, _) => redis.park(key, token),
            (OwnerMove::Release, _) => redis.release(key, token),
            (OwnerMove::GoDrop, _) => redis.go_drop(key, token),
        };
        if reply == Reply::Lost {
            return Answer::Script(status, token);
        }
        // A renewed claim stays held, and so does a claim Go pushed the record of (it must
        // drop it next); any other OK, and every refusal, drops it.
        let inst = &mut world.instances[instance];
        inst.held[key.index()] = match (op, status) {
            (OwnerMove::Renew, Status::Ok) => Some(held),
            (OwnerMove::Ack(_), Status::Ok) if cfg.finish == FinishPath::GoThreeSteps => {
                Some(Held {
                    phase: Phase::GoMustDrop,
                    ..held
                })
            }
            _ => None,
        };
        if let (Some(outcome), Status::Ok, true) = (op.finishes(), status, cfg.cross_slot_finish())
        {
            inst.settling[key.index()] = Some(Settling::start(cfg, held.member, outcome, false));
        }
        Answer::Script(status, token)
    }

    fn reclaim(
        &self,
        world: &mut World,
        instance: usize,
        key: ClaimKey,
        deadline_passed: bool,
        reply: Reply,
    ) -> Answer {
        let cfg = &self.cfg;
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

    fn dead_letter(
        &self,
        world: &mut World,
        instance: usize,
        member: Generation,
        reply: Reply,
    ) -> Answer {
        let cfg = &self.cfg;
        if !cfg.cross_slot_finish() {
            return Answer::DeadLetter(world.redis.dead_letter(member));
        }
        let status = world.redis.stage_dead_letter(cfg, member);
        if status == Status::Ok && reply == Reply::Delivered {
            let key = cfg.claim_key(member);
            world.instances[instance].settling[key.index()] =
                Some(Settling::start(cfg, member, Outcome::InvalidRequest, false));
        }
        Answer::DeadLetter(status)
    }

    fn crash(&self, world: &mut World, instance: usize) -> Answer {
        if world.crashes >= self.cfg.max_crashes {
            return Answer::OutOfBudget;
        }
        world.crashes += 1;
        let inst = &world.instances[instance];
        for (slot, s) in inst.settling.iter().enumerate() {
            let after_deliver =
                s.is_some_and(|s| s.step == SettleStep::Unstage && !self.cfg.unstage_first);
            if after_deliver && world.redis.staged[slot].is_some() {
                let key = self
                    .cfg
                    .claim_key(Generation(u8::try_from(slot).expect("few")));
                world.crashed_before_unstage.insert(key);
            }
        }
        world.instances[instance] = Instance::EMPTY;
        Answer::Nothing
    }

    fn settle(&self, world: &mut World, instance: usize, key: ClaimKey, reply: Reply) -> Answer {
        let cfg = &self.cfg;
        let Some(s) = world.instances[instance].settling(key) else {
            return Answer::Nothing;
        };
        let status = match s.step {
            SettleStep::Deliver => world.redis.deliver_once(cfg, key, s),
            SettleStep::Unstage => world.redis.unstage(key),
        };
        let unstaged = s.step == SettleStep::Unstage && status == Status::Ok;
        if unstaged && s.by_upkeep && world.crashed_before_unstage.contains(key) {
            world.upkeep_settled_after_crash = true;
        }
        if reply == Reply::Delivered {
            world.instances[instance].settling[key.index()] = s.next(cfg);
        }
        Answer::Status(s.step, status)
    }

    /// Whether the marker of `key` may be trimmed now (see [`MarkerTrim`]).
    fn may_trim(&self, world: &World, key: ClaimKey) -> bool {
        let staged = world.redis.staged_at(key).is_some();
        let in_flight = world.instances.iter().any(|i| i.settling(key).is_some());
        match self.cfg.marker_trim {
            MarkerTrim::Settled => !staged && !in_flight,
            MarkerTrim::WhileInFlight => !staged,
            MarkerTrim::Anytime => true,
        }
    }

    /// The moves of one instance: claims, moves on the claims it holds, settling, crashing.
    fn instance_actions(&self, world: &World, instance: usize, actions: &mut Vec<Action>) {
        let (cfg, redis) = (&self.cfg, &world.redis);
        let inst = &world.instances[instance];
        for member in redis.pending.iter() {
            if !member.submission().malformed {
                for &reply in self.replies_heard_by(instance) {
                    actions.push(Action::Claim {
                        instance,
                        member,
                        reply,
                    });
                }
            }
        }
        for held in inst.all_held() {
            let key = held.key;
            for &op in held.phase.moves(cfg) {
                // A lost renew reply leaves the same state as a delivered OK, and a lost
                // refusal changes nothing.
                let replies = if op == OwnerMove::Renew {
                    &REPLIES[..1]
                } else {
                    self.replies()
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
        for g in cfg.all_generations() {
            let key = cfg.claim_key(g);
            if inst.settling(key).is_some() {
                for &reply in self.replies() {
                    actions.push(Action::Settle {
                        instance,
                        key,
                        reply,
                    });
                }
                actions.push(Action::GiveUp { instance, key });
            } else if redis.stale_staged(cfg, key).is_some() {
                actions.push(Action::Upkeep { instance, key });
            }
        }
        if !inst.is_empty() {
            actions.push(Action::Crash { instance });
        }
    }

    /// Redis `TIME` passing a lease, and `reclaim` of expired claims.
    fn lease_actions(&self, world: &World, actions: &mut Vec<Action>) {
        let (cfg, redis) = (&self.cfg, &world.redis);
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
                            for &reply in self.replies_heard_by(instance) {
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
    }

    /// Moves on pending and parked members, staged results and markers.
    fn queue_actions(&self, world: &World, actions: &mut Vec<Action>) {
        let (cfg, redis) = (&self.cfg, &world.redis);
        for member in redis.parked.iter() {
            actions.push(Action::Promote { member });
        }
        for member in redis.pending.iter() {
            if !member.submission().malformed {
                continue;
            }
            if cfg.cross_slot_finish() {
                for instance in cfg.all_instances() {
                    for &reply in self.replies_heard_by(instance) {
                        actions.push(Action::DeadLetter {
                            instance,
                            member,
                            reply,
                        });
                    }
                }
            } else {
                actions.push(Action::DeadLetter {
                    instance: 0,
                    member,
                    reply: Reply::Delivered,
                });
            }
        }
        for g in cfg.all_generations() {
            let key = cfg.claim_key(g);
            if redis.staged_at(key).is_some_and(|s| !s.older_than_lease) {
                actions.push(Action::StagedAges { key });
            }
            if redis.delivered.contains(key) && self.may_trim(world, key) {
                actions.push(Action::TrimMarker { key });
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
        for instance in self.cfg.all_instances() {
            self.instance_actions(world, instance, actions);
        }
        self.lease_actions(world, actions);
        self.queue_actions(world, actions);
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
        crate::properties::all(&self.cfg)
    }
}
