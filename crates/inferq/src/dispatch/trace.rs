//! A request's OpenTelemetry spans, as the Go processor makes them (go-compat §9.3): a
//! `process-request` span per worker run, its parent taken from the message's `metadata`
//! (`traceparent`, `tracestate`, `baggage`), a client span `http-request` per attempt whose
//! context travels to the gateway in W3C `traceparent`/`tracestate`/`baggage` headers, and a
//! `re-enqueue` span (a new trace linked to the request's) when the drain timeout sends an
//! in-flight request back to its queue.
//!
//! In: the tracer `ops::otel` started (none when tracing is off: then nothing here runs). Out:
//! spans to the exporter, and the header pairs the worker adds to its gateway request.

use std::collections::BTreeMap;
use std::sync::Arc;

use opentelemetry::propagation::{
    Extractor, Injector, TextMapCompositePropagator, TextMapPropagator,
};
use opentelemetry::trace::{Span as _, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::{BaggagePropagator, TraceContextPropagator};
use opentelemetry_sdk::trace::SdkTracer;

use crate::gateway::{ClientError, Outcome};

/// The body's top-level `model`, as newer Go falls back to when `data.model` is empty.
fn body_model(payload: &serde_json::value::RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Model {
        #[serde(default)]
        model: Option<String>,
    }
    serde_json::from_str::<Model>(payload.get()).ok()?.model
}

/// The request's id (`gen_ai.request.id`; before go-v011 `request.id`).
const ID: &str = "gen_ai.request.id";
const OLD_ID: &str = "request.id";
/// Its queue's id and name.
const QUEUE_ID: &str = "llm_d.async.queue.id";
const OLD_QUEUE_ID: &str = "queue.id";
const QUEUE_NAME: &str = "llm_d.async.queue.name";
const OLD_QUEUE_NAME: &str = "queue.name";
/// The attempt's retry count.
const RETRY_COUNT: &str = "llm_d.async.retry_count";
const OLD_RETRY_COUNT: &str = "retry.count";
/// Why an attempt failed ([`crate::gateway::ErrorCategory`]).
const ERROR_CATEGORY: &str = "llm_d.async.error.category";
const OLD_ERROR_CATEGORY: &str = "error.category";

/// Sets the error category under both names.
fn set_category(span: &opentelemetry::trace::SpanRef<'_>, category: &'static str) {
    for key in [ERROR_CATEGORY, OLD_ERROR_CATEGORY] {
        span.set_attribute(KeyValue::new(key, category));
    }
}

/// Makes the spans of requests; cheap to clone.
#[derive(Debug, Clone)]
pub struct RequestTracer {
    tracer: SdkTracer,
    propagator: Arc<TextMapCompositePropagator>,
}

/// What a span says of the request it covers.
#[derive(Debug)]
pub struct RequestFacts<'a> {
    pub id: &'a str,
    pub retry_count: u32,
    pub queue_id: &'a str,
    pub queue_name: &'a str,
    pub metadata: &'a BTreeMap<String, String>,
    /// The request's `data.model` (newer Go), or empty to read the body's `model`.
    pub model: &'a str,
    /// The body, for its `model` when `data.model` is empty.
    pub payload: &'a serde_json::value::RawValue,
}

impl RequestTracer {
    pub fn new(tracer: SdkTracer) -> RequestTracer {
        let propagator = TextMapCompositePropagator::new(vec![
            Box::new(TraceContextPropagator::new()),
            Box::new(BaggagePropagator::new()),
        ]);
        RequestTracer {
            tracer,
            propagator: Arc::new(propagator),
        }
    }

    /// Starts the `process-request` span of one worker run, a child of the trace the message
    /// carries (a new trace when it carries none). It ends when the returned span is dropped.
    pub fn start(&self, facts: &RequestFacts<'_>) -> RequestSpan {
        let parent = self.propagator.extract(&Metadata(facts.metadata));
        // Newer Go's names (semantic conventions v1.41.0), each with the old name beside it for
        // one release, as Go emits them.
        let mut attributes = Vec::with_capacity(9);
        for key in [ID, OLD_ID] {
            attributes.push(KeyValue::new(key, facts.id.to_owned()));
        }
        for key in [RETRY_COUNT, OLD_RETRY_COUNT] {
            attributes.push(KeyValue::new(key, i64::from(facts.retry_count)));
        }
        for (keys, value) in [
            ([QUEUE_ID, OLD_QUEUE_ID], facts.queue_id),
            ([QUEUE_NAME, OLD_QUEUE_NAME], facts.queue_name),
        ] {
            if !value.is_empty() {
                for key in keys {
                    attributes.push(KeyValue::new(key, value.to_owned()));
                }
            }
        }
        let model = if facts.model.is_empty() {
            body_model(facts.payload)
        } else {
            Some(facts.model.to_owned())
        };
        if let Some(model) = model.filter(|m| !m.is_empty()) {
            attributes.push(KeyValue::new("gen_ai.request.model", model));
        }
        let span = self
            .tracer
            .span_builder("process-request")
            .with_attributes(attributes)
            .start_with_context(&self.tracer, &parent);
        RequestSpan {
            cx: parent.with_span(span),
            tracer: self.clone(),
        }
    }
}

/// The `process-request` span of one worker run.
#[derive(Debug)]
pub struct RequestSpan {
    cx: Context,
    tracer: RequestTracer,
}

impl RequestSpan {
    /// Starts the `http-request` client span of one attempt at `url` and returns it with the
    /// headers that carry its context.
    pub fn attempt(&self, url: &url::Url) -> AttemptSpan {
        let mut attributes = vec![
            KeyValue::new("http.request.method", "POST"),
            // Passwords stay out of spans as out of logs: the project's one URL redaction.
            KeyValue::new("url.full", crate::config::redact_url(url.as_str())),
        ];
        if let Some(host) = url.host_str() {
            attributes.push(KeyValue::new("server.address", host.to_owned()));
        }
        if let Some(port) = url.port_or_known_default() {
            attributes.push(KeyValue::new("server.port", i64::from(port)));
        }
        let tracer = &self.tracer.tracer;
        let span = tracer
            .span_builder("http-request")
            .with_kind(SpanKind::Client)
            .with_attributes(attributes)
            .start_with_context(tracer, &self.cx);
        let cx = self.cx.with_span(span);
        let mut headers = Headers(Vec::new());
        self.tracer.propagator.inject_context(&cx, &mut headers);
        AttemptSpan {
            cx,
            headers: headers.0,
        }
    }

    /// Records how the attempt ended: `error.category` on a failure, and an error status when
    /// it is final (a retry is not a failure of the request yet).
    pub fn outcome(&self, outcome: &Outcome) {
        let Some(error) = outcome.client_error() else {
            return;
        };
        let span = self.cx.span();
        set_category(&span, error.category.as_str());
        if !matches!(outcome, Outcome::Retry { .. }) {
            span.set_status(Status::error(error.to_string()));
        }
    }

    /// Go's `re-enqueue` span: a request aborted by the drain timeout goes back to its queue
    /// (inferq releases its claim to pending). A new trace, linked to the `process-request`
    /// span, as Go starts it; it covers only the decision (the release is written by the
    /// outbox).
    pub fn reenqueue(&self, id: &str) {
        let tracer = &self.tracer.tracer;
        let link = opentelemetry::trace::Link::with_context(self.cx.span().span_context().clone());
        let mut span = tracer
            .span_builder("re-enqueue")
            .with_attributes(vec![
                KeyValue::new(ID, id.to_owned()),
                KeyValue::new(OLD_ID, id.to_owned()),
            ])
            .with_links(vec![link])
            .start_with_context(tracer, &Context::new());
        span.end();
    }

    /// Records a request that failed before an attempt (its URL cannot be made).
    pub fn fatal(&self, error: &ClientError) {
        let span = self.cx.span();
        set_category(&span, error.category.as_str());
        span.set_status(Status::error(error.to_string()));
    }
}

impl Drop for RequestSpan {
    fn drop(&mut self) {
        self.cx.span().end();
    }
}

/// The `http-request` span of one attempt.
#[derive(Debug)]
pub struct AttemptSpan {
    cx: Context,
    /// `traceparent` (and `tracestate`, `baggage` when there are any) for the gateway request.
    pub headers: Vec<(String, String)>,
}

impl AttemptSpan {
    /// Ends the span with the response's status code, if one came (an error status from 500 on
    /// or without a response, as client spans are marked).
    pub fn end(self, status: Option<u16>) {
        let span = self.cx.span();
        match status {
            Some(code) => {
                span.set_attribute(KeyValue::new("http.response.status_code", i64::from(code)));
                if code >= 500 {
                    span.set_status(Status::error(format!("HTTP {code}")));
                }
            }
            None => span.set_status(Status::error("no response")),
        }
        span.end();
    }
}

/// The message's metadata as the propagators read it (keys are case-sensitive, as Go's
/// `MapCarrier`).
struct Metadata<'a>(&'a BTreeMap<String, String>);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(String::as_str).collect()
    }
}

/// The header pairs the propagators write.
struct Headers(Vec<(String, String)>);

impl Injector for Headers {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}
