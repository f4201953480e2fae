//! The planted bugs: each test switches one part of a correct configuration to a known wrong
//! design and asserts that the checker finds a counterexample, printing a shortest one (run
//! with `-- --nocapture`). A property that no planted bug can break would be a property that
//! checks nothing.

use crate::cross_slot::{FinishPath, MarkerTrim};
use crate::moves::Action;
use crate::properties::{NO_LOSS, NO_STRANDED_CLAIM, ONE_RESULT};
use crate::shortest_counterexample;
use crate::world::ModelCfg;

/// An ack that does not check the owner token publishes a second result (a retried ack whose
/// reply was lost, or a zombie's).
#[test]
fn planted_unfenced_ack_publishes_two_results() {
    let cfg = ModelCfg {
        fenced_ack: false,
        ..ModelCfg::correct()
    };
    assert!(!shortest_counterexample(cfg, ONE_RESULT).is_empty());
}

/// Claims keyed by id alone: claiming the second generation of a re-used id overwrites the
/// first one's claim, which vanishes.
#[test]
fn planted_claims_keyed_by_id_alone_lose_a_reused_id() {
    let cfg = ModelCfg {
        claim_key_has_request_token: false,
        ..ModelCfg::correct()
    };
    assert!(!shortest_counterexample(cfg, NO_LOSS).is_empty());
}

/// An unfenced heartbeat lets a zombie keep alive a claim whose real owner crashed.
#[test]
fn planted_unfenced_renew_strands_a_claim() {
    let cfg = ModelCfg {
        fenced_renew: false,
        ..ModelCfg::correct()
    };
    assert!(!shortest_counterexample(cfg, NO_STRANDED_CLAIM).is_empty());
}

/// Without reclaim, a claim whose owner crashed is never moved again.
#[test]
fn planted_missing_reclaim_strands_a_claim() {
    let cfg = ModelCfg {
        reclaim: false,
        ..ModelCfg::correct()
    };
    assert!(!shortest_counterexample(cfg, NO_STRANDED_CLAIM).is_empty());
}

/// Go's cluster ack: a fenced renew, a push, a fenced drop. The push leaves the claim in
/// place, so when the drop does not follow (the instance crashed or stalled, or the push's
/// reply was lost and the ack is retried) the generation is run and pushed again. With lost
/// replies the shortest counterexample is the retry; without them it is a reclaim of the claim
/// whose record was already pushed.
#[test]
fn planted_go_three_step_ack_pushes_twice() {
    let cfg = ModelCfg {
        finish: FinishPath::GoThreeSteps,
        ..ModelCfg::cross_slot()
    };
    assert!(!shortest_counterexample(cfg.clone(), ONE_RESULT).is_empty());
    let no_lost_replies = ModelCfg {
        lost_replies: false,
        ..cfg
    };
    let path = shortest_counterexample(no_lost_replies, ONE_RESULT);
    let pushed = path
        .iter()
        .position(|a| matches!(a, Action::Owner { .. }))
        .expect("a push");
    assert!(
        path[pushed..]
            .iter()
            .any(|a| matches!(a, Action::Reclaim { .. })),
        "the second record comes from a reclaim after the first push: {path:?}"
    );
}

/// `deliverOnce` without the marker check pushes a record once per settler step: a retry
/// after a lost reply, or the finisher and upkeep racing. Without lost replies the shortest
/// counterexample is the race.
#[test]
fn planted_deliver_without_the_marker_check_pushes_twice() {
    let cfg = ModelCfg {
        deliver_checks_marker: false,
        ..ModelCfg::cross_slot()
    };
    assert!(!shortest_counterexample(cfg.clone(), ONE_RESULT).is_empty());
    let no_lost_replies = ModelCfg {
        lost_replies: false,
        ..cfg
    };
    let path = shortest_counterexample(no_lost_replies, ONE_RESULT);
    assert!(
        path.iter().any(|a| matches!(a, Action::Upkeep { .. })),
        "without lost replies only upkeep can push a second time: {path:?}"
    );
}

/// Unstaging before delivering leaves the record only in the settler's memory: a crash then
/// loses it, and NO_LOSS sees the generation in no place as soon as the unstage ran.
#[test]
fn planted_unstage_before_deliver_loses_the_result() {
    let cfg = ModelCfg {
        unstage_first: true,
        ..ModelCfg::cross_slot()
    };
    assert!(!shortest_counterexample(cfg, NO_LOSS).is_empty());
}

/// Without upkeep, a record whose finisher died (or never heard its stage answered) stays
/// staged for ever.
#[test]
fn planted_missing_upkeep_strands_a_staged_result() {
    let cfg = ModelCfg {
        upkeep: false,
        ..ModelCfg::cross_slot()
    };
    assert!(!shortest_counterexample(cfg, NO_STRANDED_CLAIM).is_empty());
}

/// A marker trimmed while its record is still staged (the finisher died or stalled between
/// deliver and unstage, and no upkeep settled it within the retention) lets upkeep push it
/// again. The real `deliverOnce` trims by age alone, so this is the case the retention must
/// rule out: see `docs/src/redis-deployments.md`.
#[test]
fn planted_marker_trimmed_while_staged_pushes_twice() {
    let cfg = ModelCfg {
        marker_trim: MarkerTrim::Anytime,
        lost_replies: false,
        ..ModelCfg::cross_slot()
    };
    let path = shortest_counterexample(cfg, ONE_RESULT);
    assert!(path.iter().any(|a| matches!(a, Action::TrimMarker { .. })));
}

/// A marker trimmed after the unstage, while a settler that read the record before it has yet
/// to push (an upkeep pass stalled longer than the retention), lets that push through.
#[test]
fn planted_marker_trimmed_before_a_stalled_push_pushes_twice() {
    let cfg = ModelCfg {
        marker_trim: MarkerTrim::WhileInFlight,
        lost_replies: false,
        ..ModelCfg::cross_slot()
    };
    let path = shortest_counterexample(cfg, ONE_RESULT);
    assert!(path.iter().any(|a| matches!(a, Action::TrimMarker { .. })));
}
