//! One worker's handling of one claimed request: build the URL and headers, send it to the
//! gateway bounded by min(--request-timeout, deadline), and turn what came back into the
//! request's next move: publish a result, park a retry, or — when the claim is no longer ours or
//! the processor is shutting down — abandon or release it.
//!
//! A cancel marker, a lost lease or the end of the drain time aborts the in-flight HTTP request
//! at once: GPU time spent on a result that cannot be published is waste.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::consumer::dropped_result;
use super::context::Job;
use super::gates::{Decision, Gate, GateError, GateInput, Verdict};
use super::holdings::Abort;
use super::merge::tier_bucket;
use super::trace::{RequestFacts, RequestSpan, RequestTracer};
use crate::config::merge::TierPriority;
use crate::config::Fairness;
use crate::gateway::transform::Transforms;
use crate::gateway::{self, ClientError, ErrorCategory, GatewayClient, Outcome, RetryDecision};
use crate::queue::producer::unix_ms;
use crate::wire::{ErrorCode, ResultMessage};

/// What every worker shares.
pub struct WorkerEnv {
    pub client: GatewayClient,
    pub request_timeout: Duration,
    pub fairness: Fairness,
    /// Cancelled when the processor stops claiming (shutdown): a request still waiting at its
    /// pool gate has not started, so it is released to pending at once rather than after the
    /// drain time.
    pub stop_claiming: CancellationToken,
    /// Makes each request's spans when OpenTelemetry tracing is on.
    pub tracer: Option<RequestTracer>,
    /// The `tier-priority` merge policy's header and tier label, when it is the policy.
    pub priority: Option<TierPriority>,
    /// Request body transforms (empty without `--transform-config-file`).
    pub transforms: Transforms,
}

/// How often a request waiting at its pool gate asks again.
const POOL_GATE_RETRY: Duration = Duration::from_millis(50);

/// How long a request its pool gate refused stays parked at least. Go re-enqueues it with
/// backoff 0 into its retry set, which its mover empties every `poll_interval`; here the
/// promoter's tick (`poll_interval`, at most 500 ms) paces it the same way, and this floor keeps
/// a refused request from cycling park → claim → refuse faster than a waiting one re-asks, however
/// short the poll interval.
const POOL_GATE_REFUSED: Duration = POOL_GATE_RETRY;

enum AtGate {
    Aborted(Abort),
    /// The processor stops claiming: the request has not started; give it back.
    Stopped,
    OutOfTime,
    Decided(Result<Decision, GateError>),
}

/// Waits at the pool gate until it lets the request through (the job comes back, holding the
/// gate's reservations) or the request is finished some other way: dropped by the gate, failed
/// by it, refused (put back to the queue, as Go re-enqueues it), out of time, cancelled, lost,
/// or shut down (a request still at the gate when claiming stops has not started: it is
/// released to pending at once). Unlike Go, the wait is bounded by the
/// request's deadline, not by `--request-timeout`.
async fn pass_pool_gate(
    mut job: Job,
    gate: Arc<dyn Gate>,
    stop: &CancellationToken,
) -> Option<Job> {
    let ctx = job.ctx.clone();
    let mut counted = false;
    loop {
        let left_ms = job.held.envelope.request.deadline.saturating_mul(1000) - unix_ms();
        let at_gate = if left_ms <= 0 {
            AtGate::OutOfTime
        } else {
            let input = GateInput {
                metadata: &job.held.envelope.request.metadata,
                labels: &job.held.envelope.internal.labels,
            };
            let left = Duration::from_millis(u64::try_from(left_ms).unwrap_or(0));
            tokio::select! {
                biased;
                reason = job.ticket.aborted() => AtGate::Aborted(reason),
                _ = stop.cancelled() => AtGate::Stopped,
                decided = tokio::time::timeout(left, gate.apply(input)) => match decided {
                    Ok(d) => AtGate::Decided(d),
                    Err(_) => AtGate::OutOfTime,
                },
            }
        };
        let decision = match at_gate {
            AtGate::Aborted(reason) => {
                aborted(job, reason, None);
                return None;
            }
            AtGate::Stopped => {
                job.release();
                return None;
            }
            AtGate::OutOfTime => {
                ctx.series.exceeded.get().inc();
                let id = job.held.envelope.request.id.clone();
                job.publish(ResultMessage::deadline_exceeded(&id));
                return None;
            }
            AtGate::Decided(Err(e)) => {
                ctx.metrics
                    .gate_decisions
                    .get_or_create(&ctx.pool_labels.with_reason("error"))
                    .inc();
                let id = job.held.envelope.request.id.clone();
                let msg = format!("Pool gating error: {e}");
                job.publish(ResultMessage::error(&id, ErrorCode::GateError, &msg));
                return None;
            }
            AtGate::Decided(Ok(d)) => d,
        };
        if let Some(class) = &decision.classification {
            job.held
                .envelope
                .internal
                .labels
                .insert("classification".to_owned(), class.clone());
        }
        match decision.verdict {
            Verdict::Continue => {
                job.hold_releases(decision.releases);
                return Some(job);
            }
            Verdict::Drop(result) => {
                ctx.metrics
                    .gate_decisions
                    .get_or_create(&ctx.pool_labels.with_reason("dropped"))
                    .inc();
                job.hold_releases(decision.releases);
                let id = job.held.envelope.request.id.clone();
                job.publish(dropped_result(&id, result));
                return None;
            }
            Verdict::Refuse => {
                // As Go: counted once per refusal, and the request goes back to the queue,
                // freeing the worker for requests the gate would let through (another tenant's).
                ctx.turn_away(decision, &ctx.pool_labels, true).await;
                job.put_back(POOL_GATE_REFUSED);
                return None;
            }
            Verdict::Wait => {
                // Counted once per message, as Go records a wait.
                ctx.turn_away(decision, &ctx.pool_labels, !counted).await;
                counted = true;
                let next = tokio::select! {
                    biased;
                    reason = job.ticket.aborted() => AtGate::Aborted(reason),
                    _ = stop.cancelled() => AtGate::Stopped,
                    _ = tokio::time::sleep(POOL_GATE_RETRY) => continue,
                };
                match next {
                    AtGate::Aborted(reason) => aborted(job, reason, None),
                    _ => job.release(),
                }
                return None;
            }
        }
    }
}

/// Handles one request to the end.
pub async fn work(job: Job, env: Arc<WorkerEnv>) {
    let ctx = job.ctx.clone();
    ctx.series.queue_depth.get().dec();
    ctx.series
        .residence
        .get()
        .observe(job.claimed_at.elapsed().as_secs_f64() * 1000.0);
    if job.held.envelope.internal.retry_count == 0 {
        ctx.series.requests.get().inc();
    }
    // Go's validation when a worker takes a request up, in Go's order: a deadline that passed
    // while the request waited for a worker ends it before its transforms and the pool gate
    // (a cancelled request, or one whose claim was lost, is left to the abort below).
    if job.ticket.reason().is_none()
        && job.held.envelope.request.deadline.saturating_mul(1000) <= unix_ms()
    {
        return expired(job);
    }
    // Ends (is exported) when this function returns, however it returns.
    let span = env.tracer.as_ref().map(|tracer| {
        tracer.start(&RequestFacts {
            id: &job.held.envelope.request.id,
            retry_count: job.held.envelope.internal.retry_count,
            queue_id: &ctx.labels.queue_id,
            queue_name: &ctx.labels.queue_name,
            metadata: &job.held.envelope.request.metadata,
            model: &job.held.envelope.request.model,
            payload: &job.held.envelope.request.payload,
        })
    });
    // Go validates the transforms before the pool gate: a request they refuse takes no slot.
    if !env.transforms.is_empty() {
        let request = &job.held.envelope.request;
        let checked =
            env.transforms
                .validate(&request.payload, &request.metadata, request.deadline);
        if let Err(e) = checked {
            return invalid(
                job,
                &format!("Failed to validate request for transform: {e}"),
            );
        }
    }
    // The bucket the merge took the request by, stamped as Go's policy stamps it: before the
    // pool gate (whose classification does not change it).
    let priority = env.priority.as_ref().map(|tier| {
        let bucket = tier_bucket(&job.held.envelope.internal.labels, &tier.tier_label);
        (tier.priority_header.as_str(), bucket.to_string())
    });
    let mut job = match ctx.pool_gate.clone() {
        Some(gate) => match pass_pool_gate(job, gate, &env.stop_claiming).await {
            Some(job) => job,
            None => return,
        },
        None => job,
    };
    let request = &job.held.envelope.request;
    if let Some(reason) = job.ticket.reason() {
        return aborted(job, reason, span.as_ref());
    }
    let deadline_ms = request.deadline.saturating_mul(1000);
    let left_ms = deadline_ms - unix_ms();
    if left_ms <= 0 {
        return expired(job);
    }
    // Most requests go to the queue's default URL, parsed once; a request naming its own
    // endpoint has it joined and parsed here. Either failure is Go's "failed to create request".
    let target = if request.endpoint.is_empty() {
        ctx.default_url
            .as_ref()
            .map(Cow::Borrowed)
            .map_err(Clone::clone)
    } else {
        gateway::join_url(&ctx.spec.igw_base_url, &request.endpoint)
            .map_err(|e| e.to_string())
            .and_then(|url| gateway::parse_target(&url))
            .map(Cow::Owned)
    };
    let target = match target {
        Ok(target) => target,
        Err(e) => {
            let error = ClientError::new(ErrorCategory::InvalidReq, "failed to create request");
            return unsendable(job, span.as_ref(), error.with_cause(e));
        }
    };
    // A transform that handles the request gives the body and its content type.
    let transformed = match env.transforms.apply(&request.payload, &request.metadata) {
        Ok(t) => t,
        Err(e) => return invalid(job, &format!("Failed to transform request body: {e}")),
    };
    // A header Go's client refuses at send time fails the request after the transforms, as in
    // Go, but before anything is sent, instead of sending it without a header its producer
    // asked for.
    if let Err(e) = gateway::check_message_headers(
        request
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str())),
    ) {
        let error = ClientError::new(ErrorCategory::Unknown, "failed to send request");
        return unsendable(job, span.as_ref(), error.with_cause(e));
    }
    // One claim, one attempt: the payload's bytes become the HTTP body as they are, without a
    // copy (a retry is a new claim that decodes the member again).
    let (body, content_type) = match transformed {
        Some(t) => (t.body, Some(t.content_type)),
        None => {
            let payload = std::mem::replace(
                &mut job.held.envelope.request.payload,
                RawValue::NULL.to_owned(),
            );
            (Bytes::from(String::from(Box::<str>::from(payload))), None)
        }
    };
    let request = &job.held.envelope.request;
    let fairness = env.fairness.header.as_deref().and_then(|header| {
        request
            .metadata
            .get(&env.fairness.attribute)
            .map(|value| (header, value.as_str()))
    });
    let objective = ctx.spec.inference_objective.as_deref().unwrap_or("");
    let http_span = span.as_ref().map(|span| span.attempt(target.url()));
    let trace_headers = http_span.as_ref().map_or(&[][..], |s| &s.headers[..]);
    // Made as the request is sent (and again only if a gateway redirects it). The trace
    // context comes after the message's headers and wins over them, as Go's otelhttp injects
    // it last.
    let headers = || {
        let mut headers = gateway::build_headers(
            objective,
            request
                .headers
                .iter()
                .chain(trace_headers.iter().map(|(k, v)| (k, v)))
                .map(|(k, v)| (k.as_str(), v.as_str())),
            fairness,
            &request.id,
        );
        if let Some((name, value)) = &priority {
            gateway::stamp_header(&mut headers, name, value);
        }
        if let Some(value) = &content_type {
            gateway::stamp_header(&mut headers, "content-type", value);
        }
        headers
    };
    super::fault::before_dispatch(&request.id, &body);
    let timeout = env
        .request_timeout
        .min(Duration::from_millis(u64::try_from(left_ms).unwrap_or(0)));
    let inflight = ctx.series.inflight.get().clone();
    inflight.inc();
    let attempt = tokio::select! {
        biased;
        reason = job.ticket.aborted() => Err(reason),
        attempt = env.client.send_to(&target, headers, body, timeout) => Ok(attempt),
    };
    inflight.dec();
    let attempt = match attempt {
        Ok(a) => a,
        Err(reason) => return aborted(job, reason, span.as_ref()),
    };
    if let Some(http_span) = http_span {
        http_span.end(attempt.outcome.status());
    }
    if let Some(span) = &span {
        span.outcome(&attempt.outcome);
    }
    ctx.series
        .inference_latency
        .get()
        .observe(attempt.elapsed.as_secs_f64() * 1000.0);
    let id = job.held.envelope.request.id.clone();
    match attempt.outcome {
        Outcome::Success { status, body } => {
            ctx.series.successful.get().inc();
            job.publish(ResultMessage::http(&id, status, &body));
        }
        Outcome::Terminal { status, body, .. } => {
            ctx.series.failed.get().inc();
            job.publish(ResultMessage::http(&id, status, &body));
        }
        Outcome::Fatal { error } => {
            ctx.series.failed.get().inc();
            let msg = error.inference_error_message();
            job.publish(ResultMessage::error(&id, ErrorCode::InferenceError, &msg));
        }
        Outcome::Retry {
            status,
            body,
            retry_after,
            shed,
            error,
            ..
        } => {
            if shed {
                ctx.series.shedded.get().inc();
            }
            let retry_count = job.held.envelope.internal.retry_count.saturating_add(1);
            let seconds_left = job.held.envelope.request.deadline - unix_ms() / 1000;
            let decision =
                gateway::retry_decision(retry_count, seconds_left, retry_after, &mut rand::rng());
            match decision {
                RetryDecision::Backoff(backoff) => {
                    ctx.series.retries.get().inc();
                    tracing::debug!(%id, %error, ?backoff, retry_count, "retrying later");
                    job.park(backoff);
                }
                RetryDecision::DeadlineExceeded => {
                    ctx.series.exceeded.get().inc();
                    let result = match status {
                        Some(status) => {
                            ResultMessage::http(&id, status, body.as_deref().unwrap_or(b""))
                        }
                        None => ResultMessage::deadline_exceeded(&id),
                    };
                    job.publish(result);
                }
            }
        }
    }
}

/// Ends a request whose deadline passed: Go's `DEADLINE_EXCEEDED`, counted as exceeded.
fn expired(job: Job) {
    job.ctx.series.exceeded.get().inc();
    let id = job.held.envelope.request.id.clone();
    job.publish(ResultMessage::deadline_exceeded(&id));
}

/// Ends a request that cannot be made into an HTTP request (its endpoint does not join into a
/// URL, or a message header is not legal HTTP): Go's `INFERENCE_ERROR` result for a request it
/// failed to create or to send, counted as failed.
fn unsendable(job: Job, span: Option<&RequestSpan>, error: ClientError) {
    job.ctx.series.failed.get().inc();
    let id = job.held.envelope.request.id.clone();
    if let Some(span) = span {
        span.fatal(&error);
    }
    let msg = error.inference_error_message();
    job.publish(ResultMessage::error(&id, ErrorCode::InferenceError, &msg));
}

/// Ends a request the transforms refused: Go's `INVALID_REQUEST` result, counted as failed.
fn invalid(job: Job, msg: &str) {
    job.ctx.series.failed.get().inc();
    let id = job.held.envelope.request.id.clone();
    job.publish(ResultMessage::error(&id, ErrorCode::InvalidRequest, msg));
}

fn aborted(job: Job, reason: Abort, span: Option<&RequestSpan>) {
    let ctx = job.ctx.clone();
    let tag = match reason {
        Abort::Lost => "lost",
        Abort::Cancelled => "cancelled",
        Abort::Shutdown => "shutdown",
    };
    ctx.metrics
        .aborted
        .get_or_create(&ctx.labels.with_outcome(tag))
        .inc();
    match reason {
        Abort::Lost => job.abandon(),
        Abort::Cancelled => {
            ctx.series.cancelled.get().inc();
            let id = job.held.envelope.request.id.clone();
            job.publish(ResultMessage::cancelled(&id));
        }
        Abort::Shutdown => {
            if let Some(span) = span {
                span.reenqueue(&job.held.envelope.request.id);
            }
            job.release();
        }
    }
}
