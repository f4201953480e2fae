//! The OpenAI wire shapes the simulator speaks. A request body enters as bytes and is read by
//! [`parse_request`] into the few fields that matter (model, token limits, prompt size, whether
//! to stream); an answer leaves as the JSON of [`completion_body`], as streamed chunks
//! ([`token_chunk_body`], [`usage_chunk_body`]) or, on failure, [`error_body`].

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// Which completion endpoint a request came to; it decides the request's required field and
/// the answer's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `POST /v1/completions`: a `prompt`, answered with `text`.
    Completions,
    /// `POST /v1/chat/completions`: `messages`, answered with an assistant `message`.
    Chat,
}

/// The fields of a completion request the simulator looks at; everything else is ignored.
#[derive(Debug, Deserialize)]
struct RawRequest<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    stream_options: Option<StreamOptions>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
    #[serde(default, borrow)]
    messages: Option<&'a RawValue>,
}

/// `stream_options` of a streaming request.
#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: Option<bool>,
}

/// A request the simulator can answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompletionRequest {
    /// The model named by the request, echoed back; `None` if it named none.
    pub model: Option<String>,
    /// `max_tokens` (or chat's `max_completion_tokens`), before the simulator's cap.
    pub max_tokens: Option<u64>,
    /// Estimated prompt size: the JSON length of the prompt or messages over four.
    pub prompt_tokens: u64,
    /// `"stream": true`: answer with server-sent events.
    pub stream: bool,
    /// `stream_options.include_usage`: end the stream with a chunk carrying `usage`.
    pub include_usage: bool,
}

/// Reads a request body, or explains in the words of a 400 why it cannot be answered.
/// `streaming` says whether `"stream": true` can be answered (the engine model only).
pub(crate) fn parse_request(
    endpoint: Endpoint,
    body: &[u8],
    streaming: bool,
) -> Result<CompletionRequest, String> {
    let raw: RawRequest<'_> =
        serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if raw.stream == Some(true) && !streaming {
        return Err("stream=true is not supported by the inferq simulator".into());
    }
    let prompt = match endpoint {
        Endpoint::Completions => raw.prompt.ok_or("missing field `prompt`")?,
        Endpoint::Chat => raw.messages.ok_or("missing field `messages`")?,
    };
    Ok(CompletionRequest {
        model: raw.model,
        max_tokens: raw.max_tokens.or(raw.max_completion_tokens),
        prompt_tokens: (prompt.get().len() as u64).div_ceil(4).max(1),
        stream: raw.stream == Some(true),
        include_usage: raw
            .stream_options
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
    })
}

#[derive(Serialize)]
struct Completion<'a, C> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [C; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct TextChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct ChatChoice<'a> {
    index: u32,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: &'a str,
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
}

/// What a successful answer says, decided by the server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Answer<'a> {
    /// Server-unique number, made into the answer's `id`.
    pub seq: u64,
    /// Unix seconds for `created`.
    pub created: u64,
    /// Model to echo.
    pub model: &'a str,
    /// Prompt tokens for `usage`.
    pub prompt_tokens: u64,
    /// Output tokens to generate.
    pub completion_tokens: u64,
    /// Whether generation stopped at the request's `max_tokens` ("length") or not ("stop").
    pub hit_limit: bool,
}

/// The JSON body of a successful answer.
pub(crate) fn completion_body(endpoint: Endpoint, answer: &Answer<'_>) -> Result<Vec<u8>, String> {
    let text = generate_text(answer.completion_tokens);
    let finish_reason = if answer.hit_limit { "length" } else { "stop" };
    let usage = Usage {
        prompt_tokens: answer.prompt_tokens,
        completion_tokens: answer.completion_tokens,
        total_tokens: answer.prompt_tokens + answer.completion_tokens,
    };
    let encoded = match endpoint {
        Endpoint::Completions => serde_json::to_vec(&Completion {
            id: format!("cmpl-sim-{}", answer.seq),
            object: "text_completion",
            created: answer.created,
            model: answer.model,
            choices: [TextChoice {
                index: 0,
                text: &text,
                logprobs: None,
                finish_reason,
            }],
            usage,
        }),
        Endpoint::Chat => serde_json::to_vec(&Completion {
            id: format!("chatcmpl-sim-{}", answer.seq),
            object: "chat.completion",
            created: answer.created,
            model: answer.model,
            choices: [ChatChoice {
                index: 0,
                message: Message {
                    role: "assistant",
                    content: &text,
                },
                logprobs: None,
                finish_reason,
            }],
            usage,
        }),
    };
    encoded.map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct Chunk<'a, C> {
    id: String,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<C>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

#[derive(Serialize)]
struct TextChunkChoice<'a> {
    index: u32,
    text: &'a str,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct ChatChunkChoice<'a> {
    index: u32,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    content: &'a str,
}

/// The id and object name of an answer's chunks (`chatcmpl-…`/`cmpl-…`).
fn chunk_identity(endpoint: Endpoint, seq: u64) -> (String, &'static str) {
    match endpoint {
        Endpoint::Completions => (format!("cmpl-sim-{seq}"), "text_completion"),
        Endpoint::Chat => (format!("chatcmpl-sim-{seq}"), "chat.completion.chunk"),
    }
}

/// The streamed chunk of token `index` (0-based) of an answer: one word, the assistant role
/// on the first chat chunk, and the finish reason on the last.
pub(crate) fn token_chunk_body(
    endpoint: Endpoint,
    answer: &Answer<'_>,
    index: u64,
) -> Result<Vec<u8>, String> {
    let word = WORDS[(index % WORDS.len() as u64) as usize];
    let text = if index == 0 {
        word.to_owned()
    } else {
        format!(" {word}")
    };
    let last = index + 1 >= answer.completion_tokens;
    let finish_reason = last.then_some(if answer.hit_limit { "length" } else { "stop" });
    let (id, object) = chunk_identity(endpoint, answer.seq);
    let encoded = match endpoint {
        Endpoint::Completions => serde_json::to_vec(&Chunk {
            id,
            object,
            created: answer.created,
            model: answer.model,
            choices: vec![TextChunkChoice {
                index: 0,
                text: &text,
                logprobs: None,
                finish_reason,
            }],
            usage: None,
        }),
        Endpoint::Chat => serde_json::to_vec(&Chunk {
            id,
            object,
            created: answer.created,
            model: answer.model,
            choices: vec![ChatChunkChoice {
                index: 0,
                delta: Delta {
                    role: (index == 0).then_some("assistant"),
                    content: &text,
                },
                logprobs: None,
                finish_reason,
            }],
            usage: None,
        }),
    };
    encoded.map_err(|e| e.to_string())
}

/// The last streamed chunk when `stream_options.include_usage` is set: no choices, `usage`.
pub(crate) fn usage_chunk_body(endpoint: Endpoint, answer: &Answer<'_>) -> Result<Vec<u8>, String> {
    let (id, object) = chunk_identity(endpoint, answer.seq);
    serde_json::to_vec(&Chunk::<TextChunkChoice<'_>> {
        id,
        object,
        created: answer.created,
        model: answer.model,
        choices: Vec::new(),
        usage: Some(Usage {
            prompt_tokens: answer.prompt_tokens,
            completion_tokens: answer.completion_tokens,
            total_tokens: answer.prompt_tokens + answer.completion_tokens,
        }),
    })
    .map_err(|e| e.to_string())
}

#[derive(Serialize)]
struct ErrorBody<'a> {
    error: ErrorDetail<'a>,
}

#[derive(Serialize)]
struct ErrorDetail<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    param: Option<()>,
    code: Option<()>,
}

/// The OpenAI error JSON: `{"error":{"message":…,"type":…,"param":null,"code":null}}`.
pub(crate) fn error_body(message: &str, kind: &str) -> Vec<u8> {
    let body = ErrorBody {
        error: ErrorDetail {
            message,
            kind,
            param: None,
            code: None,
        },
    };
    // Serialising strings and unit options cannot fail; fall back to a fixed body regardless.
    serde_json::to_vec(&body).unwrap_or_else(|_| {
        br#"{"error":{"message":"error","type":"server_error","param":null,"code":null}}"#.to_vec()
    })
}

/// Filler words for generated text: one word stands for one token.
const WORDS: [&str; 8] = [
    "lorem",
    "ipsum",
    "dolor",
    "sit",
    "amet",
    "consectetur",
    "adipiscing",
    "elit",
];

/// `tokens` words of filler text.
fn generate_text(tokens: u64) -> String {
    let mut text = String::with_capacity(tokens as usize * 7);
    for i in 0..tokens {
        if i > 0 {
            text.push(' ');
        }
        text.push_str(WORDS[(i % WORDS.len() as u64) as usize]);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fields_it_needs_and_ignores_the_rest() {
        let req = parse_request(
            Endpoint::Chat,
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":7,"temperature":0.2}"#,
            false,
        );
        let req = req.unwrap();
        assert_eq!(req.model.as_deref(), Some("m"));
        assert_eq!(req.max_tokens, Some(7));
        assert!(req.prompt_tokens > 0);
    }

    #[test]
    fn refuses_what_it_cannot_answer() {
        for (endpoint, body) in [
            (Endpoint::Completions, &b"not json"[..]),
            (Endpoint::Completions, br#"{"model":"m"}"#),
            (Endpoint::Chat, br#"{"prompt":"p"}"#),
            (Endpoint::Completions, br#"{"prompt":"p","max_tokens":-1}"#),
            (Endpoint::Completions, br#"{"prompt":"p","stream":true}"#),
        ] {
            assert!(parse_request(endpoint, body, false).is_err(), "{body:?}");
        }
    }

    #[test]
    fn the_engine_model_reads_stream_and_include_usage() {
        let req = parse_request(
            Endpoint::Completions,
            br#"{"prompt":"p","stream":true,"stream_options":{"include_usage":true}}"#,
            true,
        )
        .unwrap();
        assert!(req.stream && req.include_usage);
        assert_eq!(req.prompt_tokens, 1);
        let plain = parse_request(Endpoint::Completions, br#"{"prompt":"p"}"#, true).unwrap();
        assert!(!plain.stream && !plain.include_usage);
    }

    #[test]
    fn generated_text_has_one_word_per_token() {
        assert_eq!(generate_text(0), "");
        assert_eq!(generate_text(3), "lorem ipsum dolor");
        assert_eq!(generate_text(20).split(' ').count(), 20);
    }
}
