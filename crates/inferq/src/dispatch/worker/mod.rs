//! One worker's handling of one claimed request: build the URL and headers, send it to the
//! gateway bounded by min(--request-timeout, deadline), and turn what came back into the
//! request's next move: publish a result, park a retry, put it back when the router evicted it,
//! or — when the claim is no longer ours or the processor is shutting down — abandon or release
//! it.
//!
//! A cancel marker, a lost lease or the end of the drain time aborts the in-flight HTTP request
//! at once: GPU time spent on a result that cannot be published is waste.
//!
//! [`work`] reads as the request's journey: taken up, checked, through the pool gate (its wait
//! is in [`pool_gate`]), made ready, sent, and decided.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::value::RawValue;
use tokio_util::sync::CancellationToken;

use super::context::{Job, QueueCtx};
use super::gates::Feedback;
use super::holdings::Abort;
use super::lane_stamp::lane_stamps;
use super::trace::{RequestFacts, RequestSpan, RequestTracer};
use crate::config::merge::TierPriority;
use crate::config::Fairness;
use crate::gateway::transform::{Transformed, Transforms};
use crate::gateway::{
    self, Attempt, ClientError, ErrorCategory, GatewayClient, Outcome, RetryDecision, RetryReason,
    Target,
};
use inferq_client::producer::unix_ms;
use inferq_client::wire::{ErrorCode, RequestView, ResultMessage};

mod evicted;
mod pool_gate;

use pool_gate::through_pool_gate;

/// What every worker shares.
#[derive(Debug)]
pub struct WorkerEnv {
    pub client: GatewayClient,
    pub request_timeout: Duration,
    /// `--gate-wait-timeout` (`None`: until the deadline).
    pub gate_wait_timeout: Option<Duration>,
    /// `--max-evictions`: evictions one request may take before it ends with an error.
    pub max_evictions: u32,
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

/// Handles one request to the end: its journey through the worker, step by step, in Go's
/// order. Each step either hands the job on or ends the request itself (a result, a park, a
/// release), and then the journey stops there.
pub async fn work(job: Job, env: Arc<WorkerEnv>) {
    take_up(&job);
    // Go's validation when a worker takes a request up, in Go's order: a deadline that passed
    // while the request waited for a worker ends it before its transforms and the pool gate
    // (a cancelled request, or one whose claim was lost, is left to the abort below).
    if job.ticket.reason().is_none() && deadline_passed(&job) {
        return expired(job);
    }
    // Ends (is exported) when this function returns, however it returns.
    let span = start_span(&job, &env);
    // Go validates the transforms before the pool gate: a request they refuse takes no slot.
    if let Err(msg) = validate_transforms(&job, &env.transforms) {
        return invalid(job, &msg);
    }
    let journey = Journey {
        ctx: job.ctx.clone(),
        priority: priority_stamp(&job, &env),
        span,
        env: &env,
    };
    let Some(job) = through_pool_gate(job, &env.stop_claiming, env.gate_wait_timeout).await else {
        return;
    };
    let Some((job, ready)) = journey.make_ready(job) else {
        return;
    };
    let Some((job, attempt)) = journey.send(job, ready).await else {
        return;
    };
    journey.note(&attempt);
    if attempt.outcome.evicted() {
        return evicted::put_back(job, &attempt.outcome, env.max_evictions);
    }
    decide(job, attempt.outcome);
}

/// What travels with one request from step to step, besides the job itself (which each step
/// takes and hands back unless it ended the request).
struct Journey<'a> {
    env: &'a WorkerEnv,
    ctx: Arc<QueueCtx>,
    /// The request's `process-request` span, when tracing is on: it ends when the journey is
    /// dropped, at the end of [`work`].
    span: Option<RequestSpan>,
    /// The tier-priority stamps (objective, priority) of the lane the merge took the request
    /// by, when that is the merge policy.
    priority: Vec<(&'a str, String)>,
}

/// A request made ready to send.
struct Ready<'a> {
    /// Where it goes: most requests to the queue's default URL, parsed once.
    target: Cow<'a, Target>,
    /// The HTTP body: the payload's bytes as they are, or a transform's body.
    body: Bytes,
    /// The transform's content type, when a transform made the body.
    content_type: Option<String>,
    /// Milliseconds left before the request's deadline, as the last check found them.
    left_ms: i64,
}

/// A worker took the request up: it leaves the queue's depth, its time waiting is observed,
/// and a first delivery counts as a request.
fn take_up(job: &Job) {
    let ctx = &job.ctx;
    ctx.series.queue_depth.get().dec();
    ctx.series
        .residence
        .get()
        .observe(job.claimed_at.elapsed().as_secs_f64() * 1000.0);
    if job.held.envelope.internal.retry_count == 0 {
        ctx.series.requests.get().inc();
    }
}

/// Whether the request's deadline has passed.
fn deadline_passed(job: &Job) -> bool {
    job.held.envelope.request.deadline.saturating_mul(1000) <= unix_ms()
}

/// Starts the request's `process-request` span when tracing is on.
fn start_span(job: &Job, env: &WorkerEnv) -> Option<RequestSpan> {
    let labels = &job.ctx.labels;
    env.tracer.as_ref().map(|tracer| {
        tracer.start(&RequestFacts {
            id: &job.held.envelope.request.id,
            retry_count: job.held.envelope.internal.retry_count,
            queue_id: &labels.queue_id,
            queue_name: &labels.queue_name,
            metadata: &job.held.envelope.request.metadata,
            model: &job.held.envelope.request.model,
            payload: &job.held.envelope.request.payload,
        })
    })
}

/// Checks the request against the transforms (none: nothing to check); the error is the
/// `INVALID_REQUEST` message.
fn validate_transforms(job: &Job, transforms: &Transforms) -> Result<(), String> {
    if transforms.is_empty() {
        return Ok(());
    }
    let request = &job.held.envelope.request;
    transforms
        .validate(&request.payload, &request.metadata, request.deadline)
        .map_err(|e| format!("Failed to validate request for transform: {e}"))
}

/// The stamps of the lane (bucket) the merge took the request by, as Go's policy stamps them:
/// decided before the pool gate (whose classification does not change them).
fn priority_stamp<'a>(job: &Job, env: &'a WorkerEnv) -> Vec<(&'a str, String)> {
    env.priority
        .as_ref()
        .map(|tier| lane_stamps(tier, &job.held.envelope.internal.labels))
        .unwrap_or_default()
}

impl Journey<'_> {
    /// The last checks before the send, in Go's order: not aborted, not out of time, a URL, the
    /// transforms' body, legal headers; then the body is taken out of the request. A request
    /// failing one is ended here (`None`).
    fn make_ready(&self, mut job: Job) -> Option<(Job, Ready<'_>)> {
        let span = self.span.as_ref();
        if let Some(reason) = job.ticket.reason() {
            aborted(job, reason, span);
            return None;
        }
        let left_ms = job.held.envelope.request.deadline.saturating_mul(1000) - unix_ms();
        if left_ms <= 0 {
            expired(job);
            return None;
        }
        let target = match self.target(&job.held.envelope.request) {
            Ok(target) => target,
            Err(e) => {
                let error = ClientError::new(ErrorCategory::InvalidReq, "failed to create request");
                unsendable(job, span, error.with_cause(e));
                return None;
            }
        };
        let request = &job.held.envelope.request;
        // A transform that handles the request gives the body and its content type.
        let transformed = match self
            .env
            .transforms
            .apply(&request.payload, &request.metadata)
        {
            Ok(t) => t,
            Err(e) => {
                invalid(job, &format!("Failed to transform request body: {e}"));
                return None;
            }
        };
        // A header Go's client refuses at send time fails the request after the transforms, as
        // in Go, but before anything is sent, instead of sending it without a header its
        // producer asked for.
        if let Err(e) = gateway::check_message_headers(
            request
                .headers
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str())),
        ) {
            let error = ClientError::new(ErrorCategory::Unknown, "failed to send request");
            unsendable(job, span, error.with_cause(e));
            return None;
        }
        let (body, content_type) = take_body(&mut job, transformed);
        let ready = Ready {
            target,
            body,
            content_type,
            left_ms,
        };
        Some((job, ready))
    }

    /// Most requests go to the queue's default URL, parsed once; a request naming its own
    /// endpoint has it joined and parsed here. Either failure is Go's "failed to create
    /// request".
    fn target(&self, request: &RequestView) -> Result<Cow<'_, Target>, String> {
        if request.endpoint.is_empty() {
            self.ctx
                .default_url
                .as_ref()
                .map(Cow::Borrowed)
                .map_err(Clone::clone)
        } else {
            gateway::join_url(&self.ctx.spec.igw_base_url, &request.endpoint)
                .map_err(|e| e.to_string())
                .and_then(|url| gateway::parse_target(&url))
                .map(Cow::Owned)
        }
    }

    /// Sends the request to the gateway, bounded by min(--request-timeout, deadline) and counted
    /// in flight meanwhile. A cancel marker, a lost lease or the end of the drain time aborts it
    /// at once, and the request is ended here (`None`).
    async fn send(&self, job: Job, ready: Ready<'_>) -> Option<(Job, Attempt)> {
        let env = self.env;
        let request = &job.held.envelope.request;
        let fairness = env.fairness.header.as_deref().and_then(|header| {
            request
                .metadata
                .get(&env.fairness.attribute)
                .map(|value| (header, value.as_str()))
        });
        let objective = self.ctx.spec.inference_objective.as_deref().unwrap_or("");
        let http_span = self
            .span
            .as_ref()
            .map(|span| span.attempt(ready.target.url()));
        let trace_headers = http_span.as_ref().map_or(&[][..], |s| &s.headers[..]);
        // Made as the request is sent (and again only if a gateway redirects it). The trace
        // context comes after the message's headers and wins over them, as Go's otelhttp
        // injects it last.
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
            for (name, value) in &self.priority {
                gateway::stamp_header(&mut headers, name, value);
            }
            if let Some(value) = &ready.content_type {
                gateway::stamp_header(&mut headers, "content-type", value);
            }
            headers
        };
        super::fault::before_dispatch(&request.id, &ready.body);
        let timeout = env.request_timeout.min(Duration::from_millis(
            u64::try_from(ready.left_ms).unwrap_or(0),
        ));
        let inflight = self.ctx.series.inflight.get().clone();
        inflight.inc();
        let sent_at = std::time::Instant::now();
        let preempt = job.preempt.clone();
        super::tokens::dispatched(&self.ctx);
        let attempt = tokio::select! {
            biased;
            reason = job.ticket.aborted() => Err(Some(reason)),
            _ = preempted(preempt.as_ref()) => Err(None),
            attempt = env.client.send_to(&ready.target, headers, ready.body, timeout) => Ok(attempt),
        };
        inflight.dec();
        let attempt = match attempt {
            Ok(a) => a,
            Err(Some(reason)) => {
                aborted(job, reason, self.span.as_ref());
                return None;
            }
            Err(None) => {
                // Its gate took the room back for traffic that needs it: the request goes back
                // to the queue unchanged (not a retry), to be sent again when there is room.
                job.put_back(Duration::ZERO);
                return None;
            }
        };
        if let Some(http_span) = http_span {
            http_span.end(attempt.outcome.status());
        }
        let mut job = job;
        if job.wants_feedback() {
            job.observe(feedback(&attempt, sent_at));
        }
        Some((job, attempt))
    }

    /// Records how the attempt went: on the request's span, and its latency.
    fn note(&self, attempt: &Attempt) {
        if let Some(span) = &self.span {
            span.outcome(&attempt.outcome);
        }
        self.ctx
            .series
            .inference_latency
            .get()
            .observe(attempt.elapsed.as_secs_f64() * 1000.0);
    }
}

/// Resolves when a feedback gate takes the request back (never, without such a gate).
async fn preempted(token: Option<&CancellationToken>) {
    match token {
        Some(token) => token.cancelled().await,
        None => std::future::pending().await,
    }
}

/// What a feedback gate learns from an attempt.
fn feedback(attempt: &Attempt, sent_at: std::time::Instant) -> Feedback {
    let outcome = &attempt.outcome;
    let (retry_after, body) = match outcome {
        Outcome::Retry { retry_after, .. } => (*retry_after, None),
        Outcome::Success { body, .. } => (None, Some(body.clone())),
        _ => (None, None),
    };
    Feedback {
        status: outcome.status(),
        dropped_reason: outcome
            .client_error()
            .and_then(|e| e.dropped_reason.clone()),
        retry_after,
        sent_at,
        elapsed: attempt.elapsed,
        body,
    }
}

/// One claim, one attempt: the payload's bytes become the HTTP body as they are, without a
/// copy (a retry is a new claim that decodes the member again). A transform's body comes with
/// its content type.
fn take_body(job: &mut Job, transformed: Option<Transformed>) -> (Bytes, Option<String>) {
    match transformed {
        Some(t) => (t.body, Some(t.content_type)),
        None => {
            let payload = std::mem::replace(
                &mut job.held.envelope.request.payload,
                RawValue::NULL.to_owned(),
            );
            (Bytes::from(String::from(Box::<str>::from(payload))), None)
        }
    }
}

/// Turns what the gateway answered into the request's next move: its result published
/// (success, a terminal status, a fatal error), or a retry parked for later unless the
/// deadline leaves no time for one.
fn decide(job: Job, outcome: Outcome) {
    let ctx = job.ctx.clone();
    let id = job.held.envelope.request.id.clone();
    match outcome {
        Outcome::Success { status, body } => {
            ctx.series.successful.get().inc();
            super::tokens::count(&ctx, &body);
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
            reason,
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
                    job.publish(at_deadline(&id, status, body.as_deref(), reason, &error));
                }
            }
        }
    }
}

/// The result of a request whose deadline leaves no time for another try: the last whole HTTP
/// answer (a 429 or 5xx with its body) as Go publishes it; for an answer whose body was cut by
/// a failed connection, an `INFERENCE_ERROR` naming the cut and the bytes that arrived; else
/// (no answer, or one cut by the deadline) `DEADLINE_EXCEEDED`. A cut body never carries
/// the status line it began with: a consumer could not tell it from a whole answer.
fn at_deadline(
    id: &str,
    status: Option<u16>,
    body: Option<&[u8]>,
    reason: RetryReason,
    error: &ClientError,
) -> ResultMessage {
    match (status, reason) {
        (Some(status), _) => ResultMessage::http(id, status, body.unwrap_or(b"")),
        (None, RetryReason::BodyRead) => ResultMessage::error(
            id,
            ErrorCode::InferenceError,
            &error.inference_error_message(),
        ),
        (None, _) => ResultMessage::deadline_exceeded(id),
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
