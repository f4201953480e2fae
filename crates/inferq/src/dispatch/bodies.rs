//! Attaches the bodies newer Go producers store apart (payload keys, see
//! [`crate::queue::payloads`]) to the requests a poll claimed, before they go to a worker.
//!
//! In: the claimed envelopes that will be sent (not dropped, cancelled or past their deadline:
//! those never cost a read). Out: each envelope's `request.payload` replaced by its stored body,
//! or the reason it cannot be sent, which becomes its `PAYLOAD_UNAVAILABLE` result. The member
//! itself is not touched: a retry parks the envelope with its ref, never the body.

use serde_json::value::RawValue;

use crate::queue::Queue;
use inferq_client::wire::Envelope;

/// What became of one envelope's stored body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Attached {
    /// The body is in `request.payload` (or the member carried it inline).
    Ready,
    /// The request cannot be sent: its result says why (Go's messages).
    Unavailable(&'static str),
    /// Redis could not be read: the claim goes back to pending to be tried again.
    Unread(String),
}

/// Go's message for a payload key that is gone.
pub const MISSING: &str = "request payload is missing";
/// Go's message for a body that is there but cannot be sent (not a JSON object or null).
pub const UNATTACHABLE: &str = "request payload could not be attached";

/// Reads the stored bodies of `envelopes` in one call and puts each in place.
pub async fn attach(queue: &Queue, envelopes: &mut [&mut Envelope]) -> Vec<Attached> {
    let wanted: Vec<usize> = (0..envelopes.len())
        .filter(|&i| !envelopes[i].internal.payload_ref.is_empty())
        .collect();
    let mut out = vec![Attached::Ready; envelopes.len()];
    if wanted.is_empty() {
        return out;
    }
    let refs: Vec<&str> = wanted
        .iter()
        .map(|&i| envelopes[i].internal.payload_ref.as_str())
        .collect();
    let bodies = match queue.payloads(&refs).await {
        Ok(bodies) => bodies,
        Err(e) => {
            let why = e.to_string();
            for &i in &wanted {
                out[i] = Attached::Unread(why.clone());
            }
            return out;
        }
    };
    for (&i, body) in wanted.iter().zip(bodies) {
        out[i] = match body.map(parse) {
            None => Attached::Unavailable(MISSING),
            Some(None) => Attached::Unavailable(UNATTACHABLE),
            Some(Some(body)) => {
                envelopes[i].request.payload = body;
                Attached::Ready
            }
        };
    }
    out
}

/// A stored body as the request's payload: a JSON object or `null`, as Go's producer accepts.
fn parse(bytes: Vec<u8>) -> Option<Box<RawValue>> {
    let text = String::from_utf8(bytes).ok()?;
    let body = RawValue::from_string(text).ok()?;
    match body.get().trim_start().as_bytes().first() {
        Some(b'{') | Some(b'n') => Some(body),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn only_an_object_or_null_is_a_body() {
        assert!(parse(br#"{"model":"m"}"#.to_vec()).is_some());
        assert!(parse(b"null".to_vec()).is_some());
        assert!(parse(b"[1]".to_vec()).is_none());
        assert!(parse(b"\"text\"".to_vec()).is_none());
        assert!(parse(b"{not json".to_vec()).is_none());
        assert!(parse(vec![0xff, 0xfe]).is_none());
    }
}
