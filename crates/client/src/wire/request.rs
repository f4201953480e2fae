//! The public request (Go's `RequestMessage`) inside an envelope's `data`: a typed view for
//! reading ([`RequestView`]) and a builder for producers ([`NewRequest`]). The `payload` is a
//! [`RawValue`]: the exact bytes the producer wrote, POSTed upstream unchanged.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::envelope::{Envelope, MemberError, Routing};

/// What inferq reads from a request's `data`.
#[derive(Debug, Clone, Deserialize)]
pub struct RequestView {
    /// The request's id.
    pub id: String,
    #[serde(default)]
    /// When it was created, Unix seconds.
    pub created: i64,
    /// When it must be answered by, Unix seconds.
    pub deadline: i64,
    /// The OpenAI-style body, byte for byte (`null` when absent).
    pub payload: Box<RawValue>,
    #[serde(default)]
    /// Metadata gates read.
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    /// Headers sent to the gateway with the request.
    pub headers: BTreeMap<String, String>,
    #[serde(default)]
    /// The gateway path it goes to; empty for its queue's.
    pub endpoint: String,
    /// The model named beside the body (newer Go's `data.model`), for traces; empty when the
    /// producer left it out (the body's `model` is read instead).
    #[serde(default)]
    pub model: String,
}

#[derive(Deserialize)]
struct LooseView {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    created: Option<i64>,
    #[serde(default)]
    deadline: Option<serde_json::Value>,
    #[serde(default)]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    headers: Option<BTreeMap<String, String>>,
    #[serde(default)]
    endpoint: Option<String>,
    #[serde(default)]
    model: Option<String>,
}

impl RequestView {
    pub(crate) fn decode(data: &RawValue) -> Result<RequestView, MemberError> {
        let loose: LooseView =
            serde_json::from_str(data.get()).map_err(|e| MemberError::BadData(e.to_string()))?;
        let id = loose
            .id
            .filter(|id| !id.is_empty())
            .ok_or(MemberError::MissingId)?;
        let deadline = loose
            .deadline
            .and_then(|d| d.as_i64())
            .filter(|d| *d > 0)
            .ok_or(MemberError::BadDeadline)?;
        let payload = match loose.payload {
            Some(p) => {
                // Go's RequestMessage.Payload is map[string]any: an object, or null.
                let kind = match p.get().trim_start().as_bytes().first() {
                    Some(b'{') | Some(b'n') => None,
                    Some(b'[') => Some("an array"),
                    Some(b'"') => Some("a string"),
                    Some(b't') | Some(b'f') => Some("a boolean"),
                    _ => Some("a number"),
                };
                if let Some(kind) = kind {
                    return Err(MemberError::BadData(format!(
                        "payload must be a JSON object (the OpenAI-style request body), not {kind}"
                    )));
                }
                p
            }
            None => RawValue::from_string("null".to_owned())
                .map_err(|e| MemberError::BadData(e.to_string()))?,
        };
        Ok(RequestView {
            id,
            created: loose.created.unwrap_or(0),
            deadline,
            payload,
            metadata: loose.metadata.unwrap_or_default(),
            headers: loose.headers.unwrap_or_default(),
            endpoint: loose.endpoint.unwrap_or_default(),
            model: loose.model.unwrap_or_default(),
        })
    }
}

/// A request a producer is about to submit: made with [`NewRequest::new`] and the `with_*`
/// setters, so that a field added later (as `model` was) breaks no producer.
///
/// ```
/// use inferq_client::wire::NewRequest;
/// use serde_json::value::RawValue;
///
/// let body = RawValue::from_string(r#"{"model":"m","prompt":"hi"}"#.to_owned()).unwrap();
/// let request = NewRequest::new("summary-0001", 1_900_000_000, body)
///     .with_endpoint("/v1/completions")
///     .with_metadata([("tenant".to_owned(), "a".to_owned())].into());
/// assert_eq!(request.deadline, 1_900_000_000);
/// ```
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct NewRequest {
    /// The request's id, unique among its queue's live requests.
    pub id: String,
    /// When it was created, Unix seconds.
    pub created: i64,
    /// Unix seconds; also the sorted-set score.
    pub deadline: i64,
    /// The OpenAI request body, sent to the gateway as it is.
    pub payload: Box<RawValue>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    /// Metadata gates read (a tenant, a tier label).
    pub metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    /// Headers sent to the gateway with the request.
    pub headers: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    /// The gateway path it goes to; empty for its queue's.
    pub endpoint: String,
    /// The model, named beside the body (newer Go's `data.model`); omitted when empty.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub model: String,
}

impl NewRequest {
    /// A request `id`, due by `deadline` (Unix seconds, also its score in the queue), whose
    /// body is `payload` (the OpenAI request), created now; no metadata, headers, endpoint or
    /// model until a `with_*` setter gives them.
    pub fn new(id: impl Into<String>, deadline: i64, payload: Box<RawValue>) -> NewRequest {
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        NewRequest {
            id: id.into(),
            created,
            deadline,
            payload,
            metadata: BTreeMap::new(),
            headers: BTreeMap::new(),
            endpoint: String::new(),
            model: String::new(),
        }
    }

    /// When it was created (Unix seconds), in place of now.
    pub fn with_created(mut self, created: i64) -> NewRequest {
        self.created = created;
        self
    }

    /// Its metadata (what gates read, e.g. a tenant or a tier label).
    pub fn with_metadata(mut self, metadata: BTreeMap<String, String>) -> NewRequest {
        self.metadata = metadata;
        self
    }

    /// The headers the processor sends to the gateway with it.
    pub fn with_headers(mut self, headers: BTreeMap<String, String>) -> NewRequest {
        self.headers = headers;
        self
    }

    /// The gateway path it goes to (`/v1/completions`), in place of its queue's.
    pub fn with_endpoint(mut self, endpoint: impl Into<String>) -> NewRequest {
        self.endpoint = endpoint.into();
        self
    }

    /// The model, named beside the body (newer Go's `data.model`).
    pub fn with_model(mut self, model: impl Into<String>) -> NewRequest {
        self.model = model.into();
        self
    }

    /// Wraps the request in a Go `plain` envelope with the given routing.
    pub fn into_envelope(self, internal: Routing) -> Result<Envelope, MemberError> {
        let data = serde_json::value::to_raw_value(&self)
            .map_err(|e| MemberError::BadData(e.to_string()))?;
        let request = RequestView {
            id: self.id,
            created: self.created,
            deadline: self.deadline,
            payload: self.payload,
            metadata: self.metadata,
            headers: self.headers,
            endpoint: self.endpoint,
            model: self.model,
        };
        Ok(Envelope {
            internal,
            request_kind: "plain".to_owned(),
            data,
            request,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_request_encodes_like_the_go_producer() {
        let req = NewRequest::new(
            "req-1",
            1764045130,
            RawValue::from_string(r#"{"model":"m","prompt":"hi"}"#.into()).unwrap(),
        )
        .with_created(1764044000)
        .with_metadata([("userid".to_string(), "u1".to_string())].into());
        let routing = Routing {
            request_token: "9f0c1e00000000000000000000000000".into(),
            request_queue_name: "request-sortedset".into(),
            result_queue_name: "result-list".into(),
            ..Routing::default()
        };
        let env = req.into_envelope(routing).unwrap();
        assert_eq!(
            String::from_utf8(env.encode()).unwrap(),
            r#"{"internal":{"request_token":"9f0c1e00000000000000000000000000","request_queue_name":"request-sortedset","result_queue_name":"result-list"},"request_kind":"plain","data":{"id":"req-1","created":1764044000,"deadline":1764045130,"payload":{"model":"m","prompt":"hi"},"metadata":{"userid":"u1"}}}"#
        );
    }

    #[test]
    fn endpoint_and_headers_round_trip_and_are_omitted_when_empty() {
        let req = NewRequest::new("a", 10, RawValue::from_string("{}".into()).unwrap())
            .with_created(0)
            .with_headers([("x-a".to_string(), "1".to_string())].into())
            .with_endpoint("/v1/chat/completions");
        let env = req.into_envelope(Routing::default()).unwrap();
        let bytes = env.encode();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(!text.contains("metadata"), "{text}");
        let back = Envelope::decode(&bytes).unwrap();
        assert_eq!(back.request.endpoint, "/v1/chat/completions");
        assert_eq!(
            back.request.headers.get("x-a").map(String::as_str),
            Some("1")
        );
    }
}
