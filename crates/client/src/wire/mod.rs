//! The Go-compatible JSON formats that cross Redis: the request envelope stored as a sorted-set
//! member, the public request inside it, and the result message pushed onto a result list.
//!
//! Data enters as member bytes read from Redis ([`Envelope::decode`]) or as a request a producer
//! builds ([`NewRequest`]); it leaves as member bytes ([`Envelope::encode`]) and result JSON
//! ([`ResultMessage::to_json`]). The request's `data` object — and so its `payload` — is kept as
//! the exact bytes the producer wrote: inferq never re-sorts keys, rounds numbers or escapes HTML.

mod envelope;
mod request;
mod result;

pub use envelope::{score_of, Envelope, MemberError, Routing, MAX_ENQUEUE_SEQ, MAX_MEMBER_BYTES};
pub use request::{NewRequest, RequestView};
pub use result::{ErrorCode, ResultMessage};
