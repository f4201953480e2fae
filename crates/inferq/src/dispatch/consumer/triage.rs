//! The triage of a poll's candidates before the claim: each decoded request is stamped with
//! its queue's routing and put to the queue gate ([`admit`]), and the admitted ones pass the
//! last-chance rule ([`last_chance_slots`]). A request leaves admitted (with the gate's
//! reservations, or its drop), or stays pending.

use crate::dispatch::context::QueueCtx;
use crate::dispatch::gates::{Decision, GateInput, Release, Verdict};
use crate::dispatch::last_chance::{LastChance, Slot};
use crate::queue::QueueError;
use inferq_client::keys::claim_key;
use inferq_client::wire::{Envelope, ErrorCode, ResultMessage};

/// The queue gate's word on one request, when it may be claimed.
pub(super) struct Admission {
    pub(super) releases: Vec<Release>,
    /// `Some` when the gate drops the request: claim it and finish it with this result.
    pub(super) dropped: Option<Option<ResultMessage>>,
}

/// Asks the queue gate. `Err`: leave the request pending (refused, waiting, or the gate failed).
pub(super) async fn admit(
    ctx: &QueueCtx,
    mut env: Envelope,
) -> Result<(Envelope, Admission), Envelope> {
    let Some(gate) = &ctx.gate else {
        return Ok((
            env,
            Admission {
                releases: Vec::new(),
                dropped: None,
            },
        ));
    };
    let input = GateInput {
        metadata: &env.request.metadata,
        labels: &env.internal.labels,
    };
    let decision = match gate.apply(input).await {
        Ok(d) => d,
        Err(e) => {
            ctx.metrics
                .gate_decisions
                .get_or_create(&ctx.labels.with_reason("error"))
                .inc();
            tracing::warn!(queue = %ctx.queue.name(), error = %e, "queue gate failed; the request stays pending");
            return Err(env);
        }
    };
    if let Some(class) = &decision.classification {
        env.internal
            .labels
            .insert("classification".to_owned(), class.clone());
    }
    match decision.verdict {
        Verdict::Continue => Ok((
            env,
            Admission {
                releases: decision.releases,
                dropped: None,
            },
        )),
        Verdict::Drop(result) => Ok((
            env,
            Admission {
                releases: decision.releases,
                dropped: Some(result),
            },
        )),
        Verdict::Wait | Verdict::Refuse => {
            ctx.turn_away(decision, &ctx.labels, true).await;
            Err(env)
        }
    }
}

/// The result of a gate's drop: its own (with the request's id) or `GATE_DROPPED`.
pub fn dropped_result(id: &str, result: Option<ResultMessage>) -> ResultMessage {
    match result {
        Some(mut r) => {
            r.id = id.to_owned();
            r
        }
        None => ResultMessage::error(id, ErrorCode::GateDropped, "Pool gating dropped request"),
    }
}

/// Stamps the queue's routing into the in-process envelope, as Go does at dequeue.
pub(super) fn stamp(ctx: &QueueCtx, mut env: Envelope) -> Envelope {
    if env.internal.request_queue_name.is_empty() {
        env.internal.request_queue_name = ctx.spec.queue_name.clone();
    }
    if env.internal.queue_id.is_empty() {
        env.internal.queue_id = ctx.spec.id.clone();
    }
    for (k, v) in &ctx.spec.labels {
        env.internal.labels.insert(k.clone(), v.clone());
    }
    env
}

/// What the last-chance rule made of a poll's candidates.
pub(super) struct LastChances {
    /// Per candidate kept, the slot it holds (a request on its last chance) or none.
    pub(super) slots: Vec<Option<Slot>>,
    /// The claim keys of the candidates held back: on their last chance while this instance
    /// runs another.
    pub(super) keys: Vec<String>,
}

/// Applies the last-chance rule (see [`crate::dispatch::last_chance`]) to the candidates: a request on
/// its last delivery gets the queue's one slot, or stays pending (and its gate reservations
/// are returned) while this instance runs another. One HMGET of the delivery counts.
pub(super) async fn last_chance_slots(
    ctx: &QueueCtx,
    candidates: &mut Vec<(Vec<u8>, Envelope)>,
    admissions: &mut Vec<Admission>,
) -> Result<LastChances, QueueError> {
    let mut out = LastChances {
        slots: Vec::new(),
        keys: Vec::new(),
    };
    if candidates.is_empty() {
        return Ok(out);
    }
    let keys: Vec<String> = candidates
        .iter()
        .map(|(member, e)| claim_key(&e.request.id, &e.internal.request_token, member))
        .collect();
    let counts: Vec<Option<u64>> = redis::cmd("HMGET")
        .arg(&ctx.queue.keys().deliveries)
        .arg(&keys)
        .query_async(&mut ctx.queue.connection())
        .await?;
    let threshold = LastChance::threshold(ctx.queue.settings().max_deliveries);
    let mut kept = Vec::with_capacity(candidates.len());
    let mut kept_admissions = Vec::with_capacity(candidates.len());
    for (((candidate, admission), count), key) in candidates
        .drain(..)
        .zip(admissions.drain(..))
        .zip(counts.into_iter().chain(std::iter::repeat(None)))
        .zip(keys)
    {
        if count.unwrap_or(0) < threshold {
            out.slots.push(None);
        } else if let Some(slot) = ctx.last_chance.try_take() {
            out.slots.push(Some(slot));
        } else {
            Decision::release_all(admission.releases).await;
            out.keys.push(key);
            continue;
        }
        kept.push(candidate);
        kept_admissions.push(admission);
    }
    *candidates = kept;
    *admissions = kept_admissions;
    Ok(out)
}
