//! What each send to the gateway adds to newer Go's counters (go-v011 §4):
//! `dispatched_requests_total` (every send, retries included) and `tokens_total{direction}`
//! from the answer's OpenAI `usage` object.
//!
//! The answer is read only when it names `usage` at all; then only its top-level `usage` is
//! decoded (every other value is skipped without being built). An answer without one counts
//! nothing. Both the Chat/Completions names (`prompt_tokens`, `completion_tokens`) and the
//! Responses API's (`input_tokens`, `output_tokens`) are read.

use serde::Deserialize;

use super::context::QueueCtx;

/// Counts one send to the gateway.
pub fn dispatched(ctx: &QueueCtx) {
    ctx.metrics
        .dispatch
        .dispatched
        .get_or_create(&ctx.labels)
        .inc();
}

/// Counts the tokens an answer's `usage` reports, if it has one.
pub fn count(ctx: &QueueCtx, body: &[u8]) {
    let Some((input, output)) = usage(body) else {
        return;
    };
    let tokens = &ctx.metrics.dispatch.tokens;
    for (direction, n) in [("input", input), ("output", output)] {
        if n > 0 {
            tokens
                .get_or_create(&ctx.labels.with_direction(direction))
                .inc_by(n);
        }
    }
}

#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default, alias = "input_tokens")]
    prompt_tokens: Option<u64>,
    #[serde(default, alias = "output_tokens")]
    completion_tokens: Option<u64>,
}

/// `(input, output)` tokens of an answer's top-level `usage`; `None` without one.
fn usage(body: &[u8]) -> Option<(u64, u64)> {
    if !mentions_usage(body) {
        return None;
    }
    let answer: Answer = serde_json::from_slice(body).ok()?;
    let usage = answer.usage?;
    Some((
        usage.prompt_tokens.unwrap_or(0),
        usage.completion_tokens.unwrap_or(0),
    ))
}

/// Whether `"usage"` occurs in the body at all: most answers without it are passed over
/// without decoding.
fn mentions_usage(body: &[u8]) -> bool {
    const NEEDLE: &[u8] = b"\"usage\"";
    body.windows(NEEDLE.len()).any(|w| w == NEEDLE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_the_top_level_only() {
        assert_eq!(
            usage(br#"{"id":"c","choices":[{"text":"hi"}],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#),
            Some((12, 5))
        );
        assert_eq!(
            usage(br#"{"output":[],"usage":{"input_tokens":3,"output_tokens":4}}"#),
            Some((3, 4))
        );
        assert_eq!(usage(br#"{"choices":[]}"#), None);
        assert_eq!(
            usage(br#"{"choices":[{"usage":{"prompt_tokens":1}}]}"#),
            None
        );
        assert_eq!(usage(br#"{"usage":null}"#), None);
        assert_eq!(usage(b"not json \"usage\""), None);
    }
}
