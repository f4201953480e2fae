//! A request's wait at its pool's gate, between the worker taking it up and sending it.
//!
//! The job enters with the worker; it comes back holding the gate's reservations when the gate
//! lets it through, or it is finished here (dropped, failed, refused and put back, out of time,
//! aborted, or released at shutdown) and nothing comes back.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::aborted;
use crate::dispatch::consumer::dropped_result;
use crate::dispatch::context::Job;
use crate::dispatch::gate_wait::{self, GateWait};
use crate::dispatch::gates::{Decision, Gate, GateError, GateInput, Verdict};
use crate::dispatch::holdings::{Abort, Ticket};
use crate::queue::Held;
use inferq_client::producer::unix_ms;
use inferq_client::wire::{ErrorCode, ResultMessage};

/// How often a request waiting at its pool gate asks again.
const POOL_GATE_RETRY: Duration = Duration::from_millis(50);

/// How long a request its pool gate refused stays parked at least. Go re-enqueues it with
/// backoff 0 into its retry set, which its mover empties every `poll_interval`; here the
/// promoter's tick (`poll_interval`, at most 500 ms) paces it the same way, and this floor keeps
/// a refused request from cycling park → claim → refuse faster than a waiting one re-asks, however
/// short the poll interval.
const POOL_GATE_REFUSED: Duration = POOL_GATE_RETRY;

/// Why a request left its pool gate without a decision to follow.
enum LeftGate {
    Aborted(Abort),
    /// The processor stops claiming: the request has not started; give it back.
    Stopped,
    OutOfTime,
    /// Waited `--gate-wait-timeout`: put it back in its queue.
    WaitedTooLong,
    Failed(GateError),
}

/// What a verdict left of the request.
enum AfterVerdict {
    /// Let through, holding the gate's reservations.
    Through(Job),
    /// Told to wait, and waited: ask the gate again.
    AskAgain(Job),
    /// Finished at the gate.
    Ended,
}

/// Passes the request through its pool's gate, when the pool has one (see [`pass_pool_gate`]).
pub(super) async fn through_pool_gate(
    job: Job,
    stop: &CancellationToken,
    wait_timeout: Option<Duration>,
) -> Option<Job> {
    match job.ctx.pool_gate.clone() {
        Some(gate) => pass_pool_gate(job, gate, stop, GateWait::start(wait_timeout)).await,
        None => Some(job),
    }
}

/// Waits at the pool gate until it lets the request through (the job comes back, holding the
/// gate's reservations) or the request is finished some other way: dropped by the gate, failed
/// by it, refused (put back to the queue, as Go re-enqueues it), out of time, cancelled, lost,
/// or shut down (a request still at the gate when claiming stops has not started: it is
/// released to pending at once). Unlike Go, the wait is bounded by the
/// request's deadline, not by `--request-timeout`; and, as newer Go, by `--gate-wait-timeout`,
/// after which the request is put back in its queue ([`gate_wait`]).
async fn pass_pool_gate(
    mut job: Job,
    gate: Arc<dyn Gate>,
    stop: &CancellationToken,
    wait: GateWait,
) -> Option<Job> {
    let mut counted = false;
    loop {
        let decision = match ask(&job.held, &job.ticket, &*gate, stop, wait).await {
            Ok(decision) => decision,
            Err(left) => {
                leave(job, left);
                return None;
            }
        };
        stamp_classification(&mut job, &decision);
        job = match follow_verdict(job, decision, &mut counted, stop).await {
            AfterVerdict::Through(job) => return Some(job),
            AfterVerdict::AskAgain(job) if wait.over() => {
                gate_wait::requeue(job);
                return None;
            }
            AfterVerdict::AskAgain(job) => job,
            AfterVerdict::Ended => return None,
        };
    }
}

/// Asks the gate about the request once, within the time its deadline leaves; a cancel, a lost
/// lease, a shutdown or the processor ceasing to claim interrupts the question.
/// (It takes the job's parts, not the job: a job is not `Sync`, and the worker's future must be
/// `Send`.)
async fn ask(
    held: &Held,
    ticket: &Ticket,
    gate: &dyn Gate,
    stop: &CancellationToken,
    wait: GateWait,
) -> Result<Decision, LeftGate> {
    let left_ms = held.envelope.request.deadline.saturating_mul(1000) - unix_ms();
    if left_ms <= 0 {
        return Err(LeftGate::OutOfTime);
    }
    let input = GateInput {
        metadata: &held.envelope.request.metadata,
        labels: &held.envelope.internal.labels,
    };
    let left = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
    let (left, wait_ends) = wait.bound(left);
    tokio::select! {
        biased;
        reason = ticket.aborted() => Err(LeftGate::Aborted(reason)),
        _ = stop.cancelled() => Err(LeftGate::Stopped),
        decided = tokio::time::timeout(left, gate.apply(input)) => match decided {
            Ok(decided) => decided.map_err(LeftGate::Failed),
            Err(_) if wait_ends => Err(LeftGate::WaitedTooLong),
            Err(_) => Err(LeftGate::OutOfTime),
        },
    }
}

/// Finishes a request that left the gate undecided: aborted, released, out of time
/// (`DEADLINE_EXCEEDED`) or failed by the gate (`GATE_ERROR`).
fn leave(job: Job, left: LeftGate) {
    match left {
        LeftGate::Aborted(reason) => aborted(job, reason, None),
        LeftGate::Stopped => job.release(),
        LeftGate::WaitedTooLong => gate_wait::requeue(job),
        LeftGate::OutOfTime => {
            job.ctx.series.exceeded.get().inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::deadline_exceeded(&id));
        }
        LeftGate::Failed(e) => {
            let ctx = job.ctx.clone();
            ctx.metrics
                .gate_decisions
                .get_or_create(&ctx.pool_labels.with_reason("error"))
                .inc();
            let id = job.held.envelope.request.id.clone();
            let msg = format!("Pool gating error: {e}");
            job.publish(ResultMessage::error(&id, ErrorCode::GateError, &msg));
        }
    }
}

/// Stamps the gate's classification into the request's labels, where later asks (and the
/// member put back) see it.
fn stamp_classification(job: &mut Job, decision: &Decision) {
    if let Some(class) = &decision.classification {
        job.held
            .envelope
            .internal
            .labels
            .insert("classification".to_owned(), class.clone());
    }
}

/// Follows the gate's verdict: through, dropped with the gate's result, refused (put back), or
/// told to wait (counted the first time only, and then asked again after a pause).
async fn follow_verdict(
    mut job: Job,
    decision: Decision,
    counted: &mut bool,
    stop: &CancellationToken,
) -> AfterVerdict {
    let ctx = job.ctx.clone();
    match decision.verdict {
        Verdict::Continue => {
            job.hold_releases(decision.releases, decision.preempt);
            AfterVerdict::Through(job)
        }
        Verdict::Drop(result) => {
            ctx.metrics
                .gate_decisions
                .get_or_create(&ctx.pool_labels.with_reason("dropped"))
                .inc();
            job.hold_releases(decision.releases, None);
            let id = job.held.envelope.request.id.clone();
            job.publish(dropped_result(&id, result));
            AfterVerdict::Ended
        }
        Verdict::Refuse => {
            // As Go: counted once per refusal, and the request goes back to the queue,
            // freeing the worker for requests the gate would let through (another tenant's).
            ctx.turn_away(decision, &ctx.pool_labels, true).await;
            job.put_back(POOL_GATE_REFUSED);
            AfterVerdict::Ended
        }
        Verdict::Wait => {
            // Counted once per message, as Go records a wait.
            ctx.turn_away(decision, &ctx.pool_labels, !*counted).await;
            *counted = true;
            pause(job, stop).await
        }
    }
}

/// The pause before a waiting request asks again; an abort or the processor ceasing to claim
/// ends the wait (and the request, aborted or released).
async fn pause(job: Job, stop: &CancellationToken) -> AfterVerdict {
    let interrupted = tokio::select! {
        biased;
        reason = job.ticket.aborted() => Some(LeftGate::Aborted(reason)),
        _ = stop.cancelled() => Some(LeftGate::Stopped),
        _ = tokio::time::sleep(POOL_GATE_RETRY) => None,
    };
    match interrupted {
        Some(left) => {
            leave(job, left);
            AfterVerdict::Ended
        }
        None => AfterVerdict::AskAgain(job),
    }
}
