//! What is read of a gateway's response, on either path, for classification
//! ([`super::super::outcome`]): the facts of its head ([`response_head`]), and its body as it
//! arrives, up to the client's limit ([`BodyReader`]).

use bytes::BytesMut;
use reqwest::header::{HeaderMap, RETRY_AFTER};

use super::super::backoff;
use super::super::headers::DROPPED_REASON_HEADER;
use super::super::outcome::{BodyRead, ResponseHead};

/// What classification needs of a response head, on either path.
pub(super) fn response_head(status: u16, headers: &HeaderMap) -> ResponseHead {
    ResponseHead {
        status,
        retry_after: header_text(headers, RETRY_AFTER.as_str())
            .and_then(|v| backoff::parse_retry_after(&v, std::time::SystemTime::now())),
        dropped_reason: header_text(headers, DROPPED_REASON_HEADER),
    }
}

/// A response header as text (lossy for non-UTF-8), `None` if absent.
fn header_text(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

/// A response body as it arrives, up to a limit.
pub(super) struct BodyReader {
    pub(super) body: BytesMut,
    limit: usize,
    too_large: bool,
}

impl BodyReader {
    /// `announced`: the `Content-Length`, when there is one; a body announced over the limit is
    /// not read at all.
    pub(super) fn new(limit: usize, announced: Option<u64>) -> BodyReader {
        let too_large = announced.is_some_and(|n| n > limit as u64);
        let capacity = match announced {
            Some(n) if !too_large => usize::try_from(n).unwrap_or(0),
            _ => 0,
        };
        BodyReader {
            body: BytesMut::with_capacity(capacity),
            limit,
            too_large,
        }
    }

    /// The end of the read, once the body outgrew the limit.
    pub(super) fn done(&self) -> Option<BodyRead> {
        self.too_large
            .then_some(BodyRead::TooLarge { limit: self.limit })
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
        if self.body.len() + chunk.len() > self.limit {
            self.too_large = true;
        } else {
            self.body.extend_from_slice(chunk);
        }
    }

    pub(super) fn complete(self) -> BodyRead {
        BodyRead::Complete(self.body.freeze())
    }

    pub(super) fn failed(self, cause: String) -> BodyRead {
        BodyRead::Failed {
            partial: self.body.freeze(),
            cause,
            timed_out: false,
        }
    }

    pub(super) fn timed_out(self) -> BodyRead {
        BodyRead::Failed {
            partial: self.body.freeze(),
            cause: "per-attempt timeout expired while reading the body".to_string(),
            timed_out: true,
        }
    }
}
