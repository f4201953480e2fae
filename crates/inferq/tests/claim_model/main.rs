//! Exhaustive model check of the durable-queue moves (`shared/design/durable-queue.md`), on one
//! server and across Redis Cluster slots.
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
//! | `ack`           | fenced: drop the claim and `LPUSH` the terminal result (`finish-11`)     |
//! | `park`          | fenced: claimed -> parked (retry backoff, bumped `retry_count`)          |
//! | `promote`       | due parked member -> pending                                             |
//! | `release`       | fenced: claimed -> pending at its original score (graceful shutdown)     |
//! | `reclaim`       | expired lease (by Redis `TIME`) -> one more delivery and back to pending;|
//! |                 | at `max_deliveries` or past its deadline the claim is re-owned by the    |
//! |                 | reclaimer, which then acks `DEADLINE_EXCEEDED` or buries it              |
//! | `bury`          | fenced: claimed -> dead plus a terminal record                           |
//! | `dead_letter`   | malformed pending member -> dead plus an `INVALID_REQUEST` record        |
//! |                 | (`deadLetter-5`)                                                         |
//!
//! Across slots (a Redis Cluster whose result list hashes to another slot than the queue,
//! `src/queue/cross_slot.rs`), the moves that make a record finish in three steps instead:
//!
//! | model move      | real script                                                              |
//! |-----------------|--------------------------------------------------------------------------|
//! | `Ack`, `Bury`   | *stage* (`finish-11` with list index 0), fenced: drop the claim (a       |
//! |                 | burial also `LPUSH`es dead) and keep the record in `{q}:finishing` under |
//! |                 | the claim key; the finisher then holds a settler of it                   |
//! | `dead_letter`   | *stage* (`deadLetter-5` with `stage`): pending -> dead, record staged    |
//! | `settles`       | the settler's next step: *deliver once* (`deliverOnce-2`, list slot):    |
//! |                 | `LPUSH` the record and mark the claim key in the queue's markers beside  |
//! |                 | the list (`{<list>}:delivered:<q>`), unless marked already; then         |
//! |                 | *unstage* (`unstage-3`, queue slot): drop the staged record              |
//! | `upkeep reads`  | `staleStaged-2`: a record staged longer ago than a lease; the reader     |
//! |                 | becomes a second settler (`Queue::settle_staged`)                        |
//! | `leaves ...`    | a settler gives up (an error, or half a lease passed since its stage)    |
//! | `staged ... is  | Redis `TIME` passes a lease since the stage                              |
//! | older`          |                                                                          |
//! | `marker ...     | a later `deliverOnce` on the list trims an old marker (see below)        |
//! | trimmed`        |                                                                          |
//! | `Ack`, `GoDrop` | planted bug only, Go's cluster ack: a fenced renew and `LPUSH` (one step |
//! |                 | here, in Go's favour), then a fenced drop of the claim                   |
//!
//! Not modelled: a result list that refuses the record (`unstage` then sets it aside in dead,
//! record kept: one place either way), the wait for replicas before `unstage`, and the Go
//! retry-set mover (`ZADD` to the queue, then `ZREM`), which by design may run a retry twice
//! after a crash between its two steps, so it would break `ONE_RESULT` by construction.
//!
//! [`world::Redis`] holds the pending set, the claims hash (claim key -> member, owner token,
//! whether the lease has expired), the parked set, the dead list, the result list (each
//! terminal record names the generation it is for; on the wire only the id travels), each
//! generation's delivery count, and across slots the staged hash (claim key -> record, whether
//! older than a lease) and the list's delivered markers (claim keys). Scores are left out: they
//! order work but do not affect safety.
//!
//! Each [`state::Instance`] holds the claims it believes it owns (claim key -> generation,
//! owner token and phase: working on it / must ack `DEADLINE_EXCEEDED` / must bury it), and
//! across slots the staged records it is settling (generation, record, next step, whether it is
//! the finisher or upkeep).
//!
//! Nondeterminism explored at every step:
//! - any instance issues any move its local state allows. Every script call has two variants,
//!   *reply delivered* and *reply lost*: with a lost reply the script ran in Redis but the
//!   instance never learns, keeps its local state and may retry the same call later with the
//!   same token. A delivered OK updates the local state; LOST/STALE/GONE drops the claim.
//!   (`renew` and upkeep's `staleStaged` read only have the delivered variant: a lost renew
//!   reply leaves the same state as a delivered OK, a lost refusal and a lost read change
//!   nothing.) A settler whose `deliverOnce` or `unstage` reply is lost repeats the step.
//! - any lease may expire at any moment (slow heartbeats, a GC pause, a partition). A paused
//!   instance keeps its token and comes back later as a zombie: the fence must refuse it.
//! - an instance may crash (its local state is wiped; it restarts empty) or abandon one claim
//!   (its own monotonic lease timer ran out, or its outbox gave up) or one settler. A crash can
//!   fall between any two steps of a finish, including between deliver and unstage.
//! - a request's deadline may pass at any moment. Only `reclaim` reads the deadline, so each
//!   `reclaim` comes in both variants, "deadline passed" and "not yet". That over-approximates
//!   a deadline that, once passed, stays passed: the real behaviours are a subset.
//! - across slots, any staged record may become older than a lease at any moment, after which
//!   any instance's upkeep may take it, also while its finisher is still settling it: the
//!   finisher and upkeep race (each instance settles a record at most once at a time, so with
//!   two instances two settlers race, the finisher and one upkeep, or two upkeeps).
//!
//! Taking a call and its reply as one step loses nothing: between the script running and the
//! reply arriving, no other actor reads the caller's local state, so every interleaving is
//! equivalent to "reply at once" or "reply lost", followed by the other steps.
//!
//! ## Markers and their retention
//!
//! The real markers are trimmed after a retention (ten leases, at least ten minutes) by a later
//! `deliverOnce` of the same queue on the list. The model trims them explicitly, at any moment the
//! [`cross_slot::MarkerTrim`] of the configuration allows. The correct system uses
//! `MarkerTrim::Settled`: a marker may go once nothing is staged under its claim key and no
//! settler holds its record. That is what the retention must guarantee, and the planted tests
//! show why: a marker trimmed while its record is still staged (a finisher died between deliver
//! and unstage and no upkeep ran for the whole retention), or while a settler that read the
//! record before its unstage has yet to push (a push or an upkeep pass stalled that long),
//! lets a second push through.
//!
//! How the real system keeps to `Settled` (`deliverOnce-2`): each queue has its own markers
//! beside a list, and a push trims only those older than the retention *and* older than the
//! queue's oldest staged record (as read by the caller, less a minute for clock skew between
//! nodes), so no staged record's marker goes; and a caller whose read of the staged state is
//! older than half the retention is refused (it reads again), so no settler that could still
//! push outlives the markers it relies on.
//!
//! # Bounds
//!
//! Single slot ([`world::ModelCfg::correct`]):
//! - Two instances (interchangeable: states equal up to swapping them are explored once, see
//!   `World::canonical`).
//! - Four generations, all pre-loaded in pending (submission only adds to pending, and a member
//!   that sits in pending is inert): `A#1` and `A#2` re-use the id `A` (two submissions with
//!   different request tokens), `B#1` is another request, and `M#1` is malformed (exercises
//!   `dead_letter`).
//! - `max_deliveries` = 2: the first lease expiry of a generation sends it back to pending, the
//!   second to dead (as `reclaim-7.lua` counts: the expiry that brings the count to
//!   `max_deliveries` buries).
//! - At most 4 owner tokens are minted over a run (each `claim` and each re-owning `reclaim`
//!   mints one), so at most four claims happen: enough for every generation to finish plus one
//!   redelivery, or for one generation to be claimed, reclaimed, claimed again and buried. At
//!   most 2 crashes. Lost replies, lease expiries, abandons, retries and park/promote rounds
//!   need no bound of their own: every way back to `claimed` mints a token.
//! - Reductions that lose no behaviour: states equal up to swapping the instances or renaming
//!   tokens are explored once (`World::canonical`); a `claim` or re-owning `reclaim` whose reply
//!   is lost is explored for `i0` only (nobody learns the token, so the caller does not
//!   matter), and a `reclaim` back to pending once (its caller and reply do not matter).
//!
//! With these bounds the single-slot system has 187,566 distinct states.
//!
//! Across slots ([`world::ModelCfg::cross_slot`]), the same with smaller bounds, because each
//! finish now takes three steps, each with its own lost reply, crash and race:
//! - two generations: `A#1`, `A#2` (the re-used id: their markers must not shadow each
//!   other), or, in [`world::ModelCfg::cross_slot_dead_letter`], `A#1` and `M#1` (a staged
//!   dead letter); `B#1` adds nothing `A#2` does not.
//! - 3 owner tokens: every generation finishes, or one is claimed, reclaimed, claimed again and
//!   buried, or reclaimed past its deadline.
//! - no `park` and `release`: they do not touch the result list, and the single-slot run checks
//!   them.
//! - two instances, `max_deliveries` = 2, 2 crashes, as above; a `dead_letter` whose reply is
//!   lost is explored for `i0` only.
//!
//! The two cross-slot configurations split the generations because their keys never meet
//! (each generation has its own claim key, staged entry and marker; they share only the token
//! and crash budgets), while three generations at these bounds take over ten minutes: 323,350
//! states for `A#1`, `A#2`; 218,527 for `A#1`, `M#1` (652,663 and 430,608 with upkeep that
//! does not wait a lease). The counts and times are printed by the `*_keep_the_contract` tests
//! (run with `-- --nocapture`) and recorded in `docs/src/testing.md`.
//!
//! # Properties
//!
//! - `NO_LOSS`: every generation is in exactly one place (pending, one claim, parked,
//!   finished); a dead generation also has its terminal record and is dead only once. Across
//!   slots a staged record counts as finished: a generation staged and already pushed (between
//!   deliver and unstage) is in one place, and one unstaged before its push is in none.
//! - `ONE_RESULT`: no generation ever has two terminal records on the result list (and
//!   `ALL_DONE` witnesses that each can end with exactly one, nothing left staged).
//! - `NO_STRANDED_CLAIM`: every claim is owned by a token a running instance holds (which
//!   will ack, park, release or bury it), or else the reclaim path can move it: no running
//!   instance keeps its lease alive, and once the lease expires, `reclaim` (the model's own move
//!   function, evaluated on that hypothetical state) takes it from the lost owner. Likewise
//!   every staged record is held by a running settler, or else upkeep, once it is older than a
//!   lease, delivers and unstages it (the model's own functions on that hypothetical state).
//! - `sometimes` witnesses that the model is not vacuous: all generations done, both
//!   generations of the re-used id claimed at once, a zombie holding a token the fence refuses,
//!   a claim that outlived its owner, `DEADLINE_EXCEEDED`, burial over the delivery limit, a
//!   dead letter; across slots also a settler that crashed between deliver and unstage whose
//!   record upkeep then settled, and a finisher and upkeep settling one record at once.
//!
//! [`world::ModelCfg`] can also plant bugs; the `planted_*` tests (in `planted.rs`) assert that
//! the checker finds each of them.
//!
//! # Reading a counterexample
//!
//! A counterexample is printed as the start state, then one numbered line per step with the
//! script's answer, e.g. `i0 claim A#1 -> Ok with t0` or
//! `i1 Ack(Result) key(A#1) [reply lost] -> Ok with t0`, each followed by the state after the
//! step: Redis, then what each instance holds (claim key -> generation, token, phase, and the
//! records it settles). The `planted_*` tests print a shortest one (they raise the BFS depth one
//! step at a time; run them with `-- --nocapture`); a failure of a correct model prints the
//! path the checker kept. `key(A#1)` is the claim key `A` NUL `request_token`; `key(A)`
//! appears only when claims are (wrongly) keyed by id alone. Tokens are `t<n>`, numbered in
//! minting order.

mod cross_slot;
mod moves;
mod planted;
mod properties;
mod state;
mod world;

use std::collections::BTreeSet;
use std::time::Instant;

use stateright::{Checker, HasDiscoveries, Model, Path};

use crate::moves::{Action, ClaimModel};
use crate::state::World;
use crate::world::ModelCfg;

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

/// Explores every state of `cfg` within its bounds, fails with the kept path if a property
/// fails or a witness was never seen, and returns the number of unique states.
fn check_all(name: &str, cfg: ModelCfg) -> usize {
    let started = Instant::now();
    let checker = ClaimModel { cfg }.checker().threads(2).spawn_bfs().join();
    let unique = checker.unique_state_count();
    println!(
        "claim model, {name}: {unique} unique states, {} generated, max depth {}, {:?}",
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
    let unseen: Vec<&str> = checker
        .model()
        .properties()
        .iter()
        .filter(|p| !p.expectation.discovery_is_failure() && checker.discovery(p.name).is_none())
        .map(|p| p.name)
        .collect();
    assert!(
        unseen.is_empty(),
        "never seen within the bounds: {unseen:?}"
    );
    checker.assert_properties();
    assert!(
        unique > 10_000,
        "only {unique} states explored: too few to mean anything"
    );
    unique
}

/// Explores every state of the single-slot system within the bounds.
#[test]
fn correct_moves_keep_the_contract() {
    check_all("correct moves", ModelCfg::correct());
}

/// Explores every state of the cross-slot finish within its bounds: acks, burials and
/// `DEADLINE_EXCEEDED` of a re-used id.
#[test]
fn cross_slot_finish_keeps_the_contract() {
    check_all("cross-slot finish", ModelCfg::cross_slot());
}

/// The same for a staged dead letter beside an acked request.
#[test]
fn cross_slot_dead_letter_keeps_the_contract() {
    check_all("cross-slot dead letter", ModelCfg::cross_slot_dead_letter());
}

/// Upkeep that settles staged records at once, without waiting a lease, races every finisher
/// on every record, and still keeps the contract: the marker makes the second push a no-op.
/// The lease-age condition only keeps the race rare; it is not what makes it safe.
#[test]
fn upkeep_without_the_lease_age_condition_is_still_safe() {
    for (name, cfg) in [
        ("cross-slot finish, eager upkeep", ModelCfg::cross_slot()),
        (
            "cross-slot dead letter, eager upkeep",
            ModelCfg::cross_slot_dead_letter(),
        ),
    ] {
        let eager = ModelCfg {
            upkeep_waits_a_lease: false,
            ..cfg
        };
        check_all(name, eager);
    }
}

/// Runs the checker on a model with a planted bug until `property` fails, prints the
/// counterexample and returns its actions.
///
/// The BFS checker keeps the *last* violating state it checked, so the depth is raised one
/// step at a time and the first depth with a discovery gives a shortest counterexample.
fn shortest_counterexample(cfg: ModelCfg, property: &'static str) -> Vec<Action> {
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
            let actions = path.clone().into_actions();
            println!(
                "planted bug {cfg:?}\n  \"{property}\" fails after {} steps \
                 ({explored} unique states over all depths, {:?}):\n{}",
                actions.len(),
                started.elapsed(),
                explain(checker.model(), path)
            );
            return actions;
        }
    }
    panic!("the checker missed the planted bug {cfg:?}: \"{property}\" holds");
}
