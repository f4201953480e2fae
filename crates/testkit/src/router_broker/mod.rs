//! An emulation of the llm-d router's `async-broker` step (llm-d-router #2325, with the logging
//! follow-up #2505; it enqueues through llm-d-async's producer v0.9.0), written here from its
//! source and `shared/spec/router-async-broker.md`, so inferq's tests can drive inferq the way
//! the router does and check inferq's own front door against the router's bytes.
//!
//! What it writes and reads in Redis is the router's, byte for byte:
//! - **enqueue** (modes `enqueue` and `wait`): one MULTI of `DEL request-cancel:<env>`,
//!   `SET request-active:<env> <token> PX <ms to the deadline>` (go-redis sends `PX` for a TTL
//!   that is not whole seconds, as `time.Until(deadline)` never is) and
//!   `ZADD <queue> <deadline> <member>`, the member being Go's compact JSON of the envelope
//!   (`internal`, `request_kind: "redis"`, `data`) with Go's field order, sorted map keys,
//!   float64 numbers and HTML escapes (module `go_json`); `<env>` is `<tenant>:<id>`, the mailbox
//!   `results:req:<tenant>:<id>`;
//! - **fetch**: `LRANGE <mailbox> 0 0`, else `EXISTS request-active:<env>` (pending), else
//!   unknown; a delivered fetch shrinks the mailbox's TTL to `fetch_grace_seconds` (`EXPIRE`,
//!   or `DEL` at 0); `wait` deletes the mailbox it delivered;
//! - **cancel**: the producer's script, `request-active` copied into `request-cancel` (EX 7 days);
//! - **DELETE**: `DEL <mailbox>`, 204 whatever was there;
//! - **passthrough**: the quota counters' acquire and release scripts.
//!
//! What it answers is the router's too: the validations in the router's order (a body that is
//! not a JSON object; the mode; `stream` in a queued mode; the model; `:` in the tenant), the id
//! (a valid `X-Request-Id`, `[A-Za-z0-9-]{1,128}`, else a minted UUID v4), the stored result's
//! mapping to status and body ([`answer_of`]), and Go's encoder's bytes (compact JSON and a
//! newline).
//!
//! Two ways in. [`RouterBroker`] is a Rust API: a test calls [`RouterBroker::post`],
//! [`RouterBroker::fetch`], [`RouterBroker::delete`], [`RouterBroker::cancel`] and reads the
//! [`Queued`] record of what was written. [`http::BrokerServer`] puts the same step behind a real
//! HTTP listener on a free port, because a client written for the router (the `openai` SDK, raw
//! HTTP) is what issue 43 has point at both the router and `inferq batch-api`: one client, two
//! servers, the same answers. Requests without the mode header, and `passthrough` ones, go on
//! to a gateway the server is given, as the router's pipeline would send them.
//!
//! Not emulated: the rest of the router's pipeline (EPP phases, disaggregation), streaming
//! through passthrough (the front buffers a gateway's answer), and the server's body-size limit.

mod answer;
mod config;
pub(crate) mod go_json;
pub mod http;
mod step;

#[cfg(test)]
mod tests;

pub use answer::{answer_of, models, openai_error, pending, Answer, StoredResult};
pub use config::{
    BrokerConfig, BrokerRoute, ConfigError, ObjectivePair, QuotaConfig, TimeoutBounds,
};
pub use step::{
    envelope_id, mailbox, mint_uuid, valid_request_id, ActiveTtl, BrokerError, Lookup, Mode,
    Passthrough, Queued, QuotaSlot, RouterBroker, Served, CANCEL_MARKER_TTL_SECONDS,
};
