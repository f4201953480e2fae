//! The `text/event-stream` answer of a streaming request in engine mode. Tokens enter as
//! messages on the sequence's channel (one per step of its engine); each leaves at once as one
//! `data: {chunk}` event, then an optional usage chunk and `data: [DONE]`. Dropping the body (the
//! client went away) drops the channel's receiver, which aborts the sequence in its engine. A
//! request the router evicts mid-stream ends there (its body is cut short, as a reset stream).

use std::convert::Infallible;

use axum::body::{Body, Bytes};
use tokio::sync::mpsc::UnboundedReceiver;

use super::request::evicted_by_router;
use super::scheduler::TokenMade;
use crate::openai::{self, Answer, Endpoint};
use crate::router::Lease;

/// What the answer says, owned so the body can outlive the handler.
#[derive(Debug, Clone)]
pub(super) struct AnswerHead {
    /// Makes the answer's id.
    pub seq: u64,
    /// Unix seconds.
    pub created: u64,
    /// Model echoed in every chunk.
    pub model: String,
    /// For `usage`.
    pub prompt_tokens: u64,
    /// Tokens the engine will make.
    pub completion_tokens: u64,
    /// Finish reason `length` (true) or `stop`.
    pub hit_limit: bool,
}

impl AnswerHead {
    /// The borrowed form the wire-shape functions take.
    pub(super) fn answer(&self) -> Answer<'_> {
        Answer {
            seq: self.seq,
            created: self.created,
            model: &self.model,
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            hit_limit: self.hit_limit,
        }
    }
}

/// Where the stream is.
enum Stage {
    /// Waiting for token number `made` (0-based).
    Tokens { made: u64 },
    /// Every token sent; the usage chunk is next.
    Usage,
    /// `[DONE]` is next.
    Done,
    /// Nothing more.
    Ended,
}

/// The state the body's stream carries between events.
struct Events {
    endpoint: Endpoint,
    head: AnswerHead,
    include_usage: bool,
    tokens: UnboundedReceiver<TokenMade>,
    stage: Stage,
    /// Called once, when the last token has been sent.
    on_complete: Option<Box<dyn FnOnce() + Send>>,
    /// Its place at the router, held until the stream ends.
    lease: Option<Lease>,
}

/// One server-sent event carrying `json`.
fn event(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// The body of a streaming answer; `on_complete` runs when its last token has been sent.
pub(super) fn event_stream(
    endpoint: Endpoint,
    head: AnswerHead,
    include_usage: bool,
    tokens: UnboundedReceiver<TokenMade>,
    on_complete: Box<dyn FnOnce() + Send>,
    lease: Option<Lease>,
) -> Body {
    let events = Events {
        endpoint,
        head,
        include_usage,
        tokens,
        stage: Stage::Tokens { made: 0 },
        on_complete: Some(on_complete),
        lease,
    };
    let stream = futures::stream::unfold(events, |mut events| async move {
        let bytes = next_event(&mut events).await?;
        Some((Ok::<Bytes, Infallible>(bytes), events))
    });
    Body::from_stream(stream)
}

/// The next event, or `None` at the end (or when the engine stopped before the last token).
async fn next_event(events: &mut Events) -> Option<Bytes> {
    loop {
        match events.stage {
            Stage::Tokens { made } => {
                let evicted = events.lease.as_ref().map(|l| l.evicted.clone());
                tokio::select! {
                    biased;
                    _ = evicted_by_router(evicted.as_ref()) => {
                        events.stage = Stage::Ended;
                        if let Some(lease) = events.lease.take() {
                            lease.wasted(made);
                        }
                        return None;
                    }
                    token = events.tokens.recv() => token?,
                };
                let answer = events.head.answer();
                let last = made + 1 >= answer.completion_tokens;
                events.stage = match (last, events.include_usage) {
                    (false, _) => Stage::Tokens { made: made + 1 },
                    (true, true) => Stage::Usage,
                    (true, false) => Stage::Done,
                };
                if last {
                    if let Some(done) = events.on_complete.take() {
                        done();
                    }
                }
                match openai::token_chunk_body(events.endpoint, &answer, made) {
                    Ok(json) => return Some(event(&json)),
                    // Not reachable with these plain types; skip the chunk rather than fail.
                    Err(_) => continue,
                }
            }
            Stage::Usage => {
                events.stage = Stage::Done;
                if let Ok(json) = openai::usage_chunk_body(events.endpoint, &events.head.answer()) {
                    return Some(event(&json));
                }
            }
            Stage::Done => {
                events.stage = Stage::Ended;
                events.lease = None;
                return Some(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            Stage::Ended => return None,
        }
    }
}
