//! What the checker asserts of every state it reaches: the three properties of the contract
//! (`always`), and the witnesses (`sometimes`) that show the model is not vacuous. The
//! cross-slot witnesses are asked only of a configuration that finishes across slots.

use stateright::Property;

use crate::moves::ClaimModel;
use crate::state::{Instance, World};
use crate::world::{DeadReason, Generation, ModelCfg, Outcome};

pub(crate) const NO_LOSS: &str = "no loss: every generation is in exactly one place";
pub(crate) const ONE_RESULT: &str = "one terminal record per generation";
pub(crate) const NO_STRANDED_CLAIM: &str = "no stranded claim or staged result";
const ALL_DONE: &str = "all generations can reach done";
const REUSED_ID_CLAIMED_TWICE: &str = "both generations of a re-used id claimed at once";
const ZOMBIE: &str = "a zombie holds a token the fence refuses";
const ORPHANED_CLAIM: &str = "a claim outlives its owner and awaits reclaim";
const DEADLINE_EXCEEDED: &str = "a claim is finished as DEADLINE_EXCEEDED";
const BURIED: &str = "a claim is buried over the delivery limit";
const DEAD_LETTERED: &str = "a malformed member is dead-lettered";
const SETTLED_AFTER_CRASH: &str =
    "a settler crashed between deliver and unstage, and upkeep settled its staged result";
const RACING_SETTLERS: &str = "a finisher and upkeep settle one staged result at once";

/// Every generation is in exactly one place: pending, one claim, parked, or finished (a
/// terminal record or a dead entry, or, across slots, a staged result, which counts as one
/// place with the record it becomes). A dead generation is dead once and has its record, or
/// has it staged.
fn no_loss(cfg: &ModelCfg, w: &World) -> bool {
    let r = &w.redis;
    cfg.all_generations().all(|g| {
        let staged = r.staged.iter().flatten().filter(|s| s.member == g).count();
        let places = usize::from(r.pending.contains(g))
            + r.claims().filter(|c| c.member == g).count()
            + usize::from(r.parked.contains(g))
            + usize::from(r.finished(g) || staged > 0);
        let dead = r.dead[g.index()].count();
        let recorded = r.results[g.index()].count() > 0 || staged > 0;
        places == 1 && staged <= 1 && dead <= 1 && (dead == 0 || recorded)
    })
}

fn all_done(cfg: &ModelCfg, w: &World) -> bool {
    let r = &w.redis;
    r.staged.iter().all(Option::is_none)
        && cfg
            .all_generations()
            .all(|g| r.results[g.index()].count() == 1)
}

fn zombie(w: &World) -> bool {
    w.instances
        .iter()
        .flat_map(Instance::all_held)
        .any(|h| w.redis.claim_at(h.key).is_some() && !w.redis.owned_by(h.key, h.token))
}

fn racing_settlers(cfg: &ModelCfg, w: &World) -> bool {
    cfg.all_generations().any(|g| {
        let key = cfg.claim_key(g);
        let settlers = || w.instances.iter().filter_map(|i| i.settling(key));
        settlers().any(|s| s.by_upkeep) && settlers().any(|s| !s.by_upkeep)
    })
}

/// The properties of `cfg`'s model.
pub(crate) fn all(cfg: &ModelCfg) -> Vec<Property<ClaimModel>> {
    let mut all = vec![
        Property::always(NO_LOSS, |m: &ClaimModel, w: &World| no_loss(&m.cfg, w)),
        Property::always(ONE_RESULT, |m: &ClaimModel, w: &World| {
            m.cfg
                .all_generations()
                .all(|g| w.redis.results[g.index()].count() <= 1)
        }),
        Property::always(NO_STRANDED_CLAIM, |m: &ClaimModel, w: &World| {
            w.stranded_claims(&m.cfg).next().is_none() && w.stranded_staged(&m.cfg).next().is_none()
        }),
        Property::sometimes(ALL_DONE, |m: &ClaimModel, w: &World| all_done(&m.cfg, w)),
        Property::sometimes(ZOMBIE, |_: &ClaimModel, w: &World| zombie(w)),
        Property::sometimes(ORPHANED_CLAIM, |_: &ClaimModel, w: &World| {
            w.redis.claims().any(|c| !w.holds(c.key, c.owner))
        }),
        Property::sometimes(DEADLINE_EXCEEDED, |_: &ClaimModel, w: &World| {
            w.redis
                .results
                .iter()
                .any(|r| r.iter().any(|o| o == Outcome::DeadlineExceeded))
        }),
        Property::sometimes(BURIED, |_: &ClaimModel, w: &World| {
            w.redis
                .dead
                .iter()
                .any(|d| d.iter().any(|r| r == DeadReason::OverDeliveryLimit))
        }),
    ];
    // The witnesses of generations the configuration has.
    let has = |g| cfg.generations.contains(Generation(g));
    if has(0) && has(1) {
        all.push(Property::sometimes(
            REUSED_ID_CLAIMED_TWICE,
            |_: &ClaimModel, w: &World| {
                let claimed = |g| w.redis.claims().any(|c| c.member == Generation(g));
                claimed(0) && claimed(1)
            },
        ));
    }
    if cfg.all_generations().any(|g| g.submission().malformed) {
        all.push(Property::sometimes(
            DEAD_LETTERED,
            |_: &ClaimModel, w: &World| {
                w.redis
                    .dead
                    .iter()
                    .any(|d| d.iter().any(|r| r == DeadReason::Malformed))
            },
        ));
    }
    if cfg.cross_slot_finish() {
        all.push(Property::sometimes(
            SETTLED_AFTER_CRASH,
            |_: &ClaimModel, w: &World| w.upkeep_settled_after_crash,
        ));
        all.push(Property::sometimes(
            RACING_SETTLERS,
            |m: &ClaimModel, w: &World| racing_settlers(&m.cfg, w),
        ));
    }
    all
}
