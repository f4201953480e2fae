//! A request the router's flow control evicted after dispatch (429 with an `evicted…` drop
//! reason): not a failure. The router took its slot back for more urgent work, so the request
//! goes back to its queue at once, as a `slack` gate's own preemption puts one back: same score,
//! same generation token, no backoff, not a retry and no delivery toward `max_deliveries`. Its
//! eviction count travels in its member (`internal.evictions`); past `--max-evictions` it ends
//! with an `INFERENCE_ERROR` that says so, so a request evicted forever still gets its one
//! result. Each eviction counts in `llm_d_async_async_evicted_requests_total`.

use std::time::Duration;

use inferq_client::wire::{ErrorCode, ResultMessage};

use crate::dispatch::context::Job;
use crate::gateway::Outcome;

/// Puts an evicted request back (or ends it past `max_evictions`).
pub(super) fn put_back(mut job: Job, outcome: &Outcome, max_evictions: u32) {
    let ctx = job.ctx.clone();
    ctx.metrics
        .dispatch
        .evicted
        .get_or_create(&ctx.labels)
        .inc();
    let routing = &mut job.held.envelope.internal;
    routing.evictions = routing.evictions.saturating_add(1);
    let evictions = routing.evictions;
    let id = job.held.envelope.request.id.clone();
    let reason = outcome
        .client_error()
        .and_then(|e| e.dropped_reason.as_deref())
        .unwrap_or("evicted")
        .to_owned();
    if evictions > max_evictions {
        ctx.series.failed.get().inc();
        tracing::debug!(%id, evictions, %reason, "evicted more than --max-evictions; giving up");
        let msg = format!(
            "Failed to send request to inference: evicted by the router's flow control \
             {evictions} times (dropped: {reason}); --max-evictions is {max_evictions}"
        );
        job.publish(ResultMessage::error(&id, ErrorCode::InferenceError, &msg));
        return;
    }
    tracing::debug!(
        %id,
        evictions,
        %reason,
        queue = %ctx.queue.name(),
        "evicted by the router's flow control; put back in its queue"
    );
    job.put_back(Duration::ZERO);
}
