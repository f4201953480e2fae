//! The envelope `{"internal":{…},"request_kind":"…","data":{…}}` that Go producers write as a
//! sorted-set member. `internal` (routing) is decoded and may be rewritten (a retry bumps
//! `retry_count`); `data` stays the producer's bytes, with a typed view decoded beside it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use super::request::RequestView;

/// Members larger than this are dead-lettered as absurd rather than decoded (16 MiB).
pub const MAX_MEMBER_BYTES: usize = 16 * 1024 * 1024;

/// Why a member could not be accepted. The text is the dead-letter reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemberError {
    #[error("member is {0} bytes, over the {MAX_MEMBER_BYTES}-byte (16 MiB) limit; send a smaller request")]
    /// The member is larger than the limit (its size in bytes).
    TooLarge(usize),
    #[error("member is not valid JSON: {0}")]
    /// The member is not JSON.
    NotJson(String),
    #[error("member is JSON but not an envelope object {{\"internal\", \"request_kind\", \"data\"}}: {0}")]
    /// The member is JSON but no envelope.
    NotEnvelope(String),
    #[error("member has no request_kind")]
    /// The envelope names no request kind.
    MissingKind,
    #[error("member has unknown request_kind {0:?}")]
    /// The envelope names a kind inferq does not know.
    UnknownKind(String),
    #[error("member has no data")]
    /// The envelope has no request data.
    MissingData,
    #[error("member data is not a request: {0}")]
    /// The request data does not decode.
    BadData(String),
    #[error("member has no id")]
    /// The request has no id.
    MissingId,
    #[error("deadline is missing or invalid (Unix seconds)")]
    /// The request's deadline is not a positive Unix time.
    BadDeadline,
}

/// Go's `InternalRouting`: fields in declaration order, each omitted when empty.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Routing {
    #[serde(default, skip_serializing_if = "is_zero")]
    /// Deliveries that ended in a retry so far.
    pub retry_count: u32,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The id of the queue config that took the request.
    pub queue_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The generation's token (its `request-active:<id>` value).
    pub request_token: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The queue the request was submitted to.
    pub request_queue_name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The result list its result goes to (empty: the queue's or the default).
    pub result_queue_name: String,
    /// The result list's TTL the request was routed with (newer Go; see `result_routing_resolved`).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub result_ttl_seconds: i64,
    /// Set once a processor has resolved where the result goes: `result_queue_name` and
    /// `result_ttl_seconds` then name the route, and every later processor keeps it.
    #[serde(default, skip_serializing_if = "is_false")]
    pub result_routing_resolved: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    /// The transport's correlation id (Go's pub/sub message id).
    pub transport_correlation_id: String,
    /// The key the request's body is stored at, apart from the member (newer Go's payload keys:
    /// `request-payload:<id>:<request_token>`); `data.payload` is then `null`. Empty for a body
    /// carried inline.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub payload_ref: String,
    /// The request's 1-based submission order among requests of its queue with the same
    /// deadline (newer Go); 0 when unstamped. It places the member in pending (see
    /// [`score_of`]).
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub enqueue_seq: i64,
    /// Newer Go's dispatch epoch: carried through untouched.
    #[serde(default, skip_serializing_if = "is_zero_i64")]
    pub dispatch_epoch: i64,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    /// Labels the processor stamped (a gate's classification, the tier).
    pub labels: BTreeMap<String, String>,
    /// inferq's own: how many times a router's flow control evicted the request (each put it
    /// back at once, not as a retry); bounded by `--max-evictions`. Absent while 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub evictions: u32,
    /// Fields a newer producer may add; carried through untouched.
    #[serde(flatten)]
    pub extra: BTreeMap<String, serde_json::Value>,
}

/// Sequence numbers past this tie (they share the last fraction of the second).
pub const MAX_ENQUEUE_SEQ: i64 = (1 << 21) - 1;

/// A member's score in pending, as the newest Go producer writes it: the deadline plus its
/// submission order among requests of the same queue and deadline as a fraction of 2^21, so
/// equal deadlines are served first in, first out. Written as text that reads back as the same
/// double Redis stores (Go's `%.17g`).
pub fn score_of(deadline: i64, enqueue_seq: i64) -> String {
    let seq = enqueue_seq.clamp(0, MAX_ENQUEUE_SEQ);
    if seq == 0 {
        return deadline.to_string();
    }
    let score = deadline as f64 + seq as f64 / (1u64 << 21) as f64;
    // Rust prints the shortest text that parses back to the same f64.
    format!("{score}")
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

fn is_zero_i64(n: &i64) -> bool {
    *n == 0
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// A decoded member: routing, kind, the raw `data` bytes and a typed view of them.
#[derive(Debug, Clone)]
pub struct Envelope {
    /// The processor's routing and bookkeeping (Go's `internal`).
    pub internal: Routing,
    /// The request's kind: `plain`, the only one Go writes.
    pub request_kind: String,
    /// The producer's `data` object, byte for byte.
    pub data: Box<RawValue>,
    /// What inferq reads out of `data`.
    pub request: RequestView,
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(default)]
    internal: Option<Routing>,
    #[serde(default)]
    request_kind: Option<String>,
    #[serde(default, borrow)]
    data: Option<&'a RawValue>,
}

#[derive(Serialize)]
struct OutEnvelope<'a> {
    internal: &'a Routing,
    request_kind: &'a str,
    data: &'a RawValue,
}

impl Envelope {
    /// Decodes a member, checking everything a request needs before it may be claimed.
    pub fn decode(member: &[u8]) -> Result<Envelope, MemberError> {
        if member.len() > MAX_MEMBER_BYTES {
            return Err(MemberError::TooLarge(member.len()));
        }
        if member.trim_ascii_start().first() != Some(&b'{') {
            // Valid JSON of another shape (an array would even fill the struct by position).
            return Err(
                match serde_json::from_slice::<serde::de::IgnoredAny>(member) {
                    Ok(_) => MemberError::NotEnvelope("the member is not a JSON object".to_owned()),
                    Err(e) => MemberError::NotJson(e.to_string()),
                },
            );
        }
        let raw: RawEnvelope<'_> = serde_json::from_slice(member).map_err(|e| {
            if e.classify() == serde_json::error::Category::Data {
                MemberError::NotEnvelope(e.to_string())
            } else {
                MemberError::NotJson(e.to_string())
            }
        })?;
        let kind = raw.request_kind.ok_or(MemberError::MissingKind)?;
        if !matches!(kind.as_str(), "plain" | "redis" | "pubsub") {
            return Err(MemberError::UnknownKind(kind));
        }
        let data = raw.data.ok_or(MemberError::MissingData)?;
        if data.get() == "null" {
            return Err(MemberError::MissingData);
        }
        let request = RequestView::decode(data)?;
        Ok(Envelope {
            internal: raw.internal.unwrap_or_default(),
            request_kind: kind,
            data: data.to_owned(),
            request,
        })
    }

    /// Reads just the id of a member that failed to decode, when one can be read, so that a
    /// dead-lettered member can still get an `INVALID_REQUEST` result.
    pub fn salvage_id(member: &[u8]) -> Option<(String, Routing)> {
        #[derive(Deserialize)]
        struct Id {
            #[serde(default)]
            id: Option<String>,
        }
        #[derive(Deserialize)]
        struct Partial {
            #[serde(default)]
            internal: Option<Routing>,
            #[serde(default)]
            data: Option<Id>,
        }
        if member.trim_ascii_start().first() != Some(&b'{') {
            return None;
        }
        let p: Partial = serde_json::from_slice(member).ok()?;
        let id = p.data?.id.filter(|id| !id.is_empty())?;
        Some((id, p.internal.unwrap_or_default()))
    }

    /// Encodes the envelope as Go does (`internal`, `request_kind`, `data`), with `data` verbatim.
    pub fn encode(&self) -> Vec<u8> {
        let out = OutEnvelope {
            internal: &self.internal,
            request_kind: &self.request_kind,
            data: &self.data,
        };
        // Serializing plain structs, string maps and a RawValue into a Vec cannot fail.
        serde_json::to_vec(&out).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GO_MEMBER: &str = r#"{"internal":{"request_token":"9f0c1e00000000000000000000000000","request_queue_name":"request-sortedset","result_queue_name":"result-list"},"request_kind":"plain","data":{"id":"req-1","created":1764044000,"deadline":1764045130,"payload":{"model":"m","prompt":"hi"},"metadata":{"userid":"u1"}}}"#;

    #[test]
    fn go_member_round_trips_byte_for_byte() {
        let env = Envelope::decode(GO_MEMBER.as_bytes()).unwrap();
        assert_eq!(env.request.id, "req-1");
        assert_eq!(env.request.deadline, 1764045130);
        assert_eq!(env.internal.request_queue_name, "request-sortedset");
        assert_eq!(
            env.request.metadata.get("userid").map(String::as_str),
            Some("u1")
        );
        assert_eq!(String::from_utf8(env.encode()).unwrap(), GO_MEMBER);
    }

    #[test]
    fn payload_bytes_are_kept_exactly() {
        let member = r#"{"internal":{},"request_kind":"redis","data":{"id":"a","deadline":9999999999,"payload":{"z":1,"big":12345678901234567890,"html":"<tags> & stuff","f":1.0}}}"#;
        let mut env = Envelope::decode(member.as_bytes()).unwrap();
        assert_eq!(
            env.request.payload.get(),
            r#"{"z":1,"big":12345678901234567890,"html":"<tags> & stuff","f":1.0}"#
        );
        env.internal.retry_count = 2;
        let out = String::from_utf8(env.encode()).unwrap();
        assert!(out.starts_with(r#"{"internal":{"retry_count":2},"request_kind":"redis","#));
        assert!(out.contains(r#""big":12345678901234567890,"html":"<tags> & stuff","f":1.0"#));
    }

    #[test]
    fn unknown_routing_fields_survive() {
        let member = r#"{"internal":{"queue_id":"q","future_field":[1,2]},"request_kind":"plain","data":{"id":"a","deadline":5}}"#;
        let env = Envelope::decode(member.as_bytes()).unwrap();
        let out = String::from_utf8(env.encode()).unwrap();
        assert!(out.contains(r#""future_field":[1,2]"#), "{out}");
    }

    #[test]
    fn malformed_members_are_named() {
        let cases: &[(&str, MemberError)] = &[
            ("not json", MemberError::NotJson(String::new())),
            (
                r#"{"data":{"id":"a","deadline":5}}"#,
                MemberError::MissingKind,
            ),
            (
                r#"{"request_kind":"x","data":{}}"#,
                MemberError::UnknownKind("x".into()),
            ),
            (r#"{"request_kind":"plain"}"#, MemberError::MissingData),
            (
                r#"{"request_kind":"plain","data":null}"#,
                MemberError::MissingData,
            ),
            (
                r#"{"request_kind":"plain","data":{"deadline":5}}"#,
                MemberError::MissingId,
            ),
            (
                r#"{"request_kind":"plain","data":{"id":"a"}}"#,
                MemberError::BadDeadline,
            ),
            (
                r#"{"request_kind":"plain","data":{"id":"a","deadline":0}}"#,
                MemberError::BadDeadline,
            ),
            (
                r#"{"request_kind":"plain","data":{"id":"a","deadline":"5"}}"#,
                MemberError::BadDeadline,
            ),
            (
                r#"{"request_kind":"plain","data":[1]}"#,
                MemberError::BadData(String::new()),
            ),
            ("[1,2,3]", MemberError::NotEnvelope(String::new())),
            (r#""text""#, MemberError::NotEnvelope(String::new())),
            (
                r#"{"internal":7,"request_kind":"plain","data":{"id":"a","deadline":5}}"#,
                MemberError::NotEnvelope(String::new()),
            ),
            (
                r#"{"request_kind":"plain","data":{"id":"a","deadline":5,"payload":"hi"}}"#,
                MemberError::BadData(String::new()),
            ),
            (
                r#"{"request_kind":"plain","data":{"id":"a","deadline":5,"payload":7}}"#,
                MemberError::BadData(String::new()),
            ),
        ];
        for (member, want) in cases {
            let got = Envelope::decode(member.as_bytes()).unwrap_err();
            assert_eq!(
                std::mem::discriminant(&got),
                std::mem::discriminant(want),
                "{member}: {got}"
            );
        }
        let huge = vec![b' '; MAX_MEMBER_BYTES + 1];
        assert!(matches!(
            Envelope::decode(&huge),
            Err(MemberError::TooLarge(_))
        ));
    }

    mod props {
        use proptest::prelude::*;
        use serde_json::value::RawValue;
        use serde_json::Value;

        use super::super::*;
        use crate::wire::NewRequest;

        fn json() -> impl Strategy<Value = Value> {
            let leaf = prop_oneof![
                Just(Value::Null),
                any::<bool>().prop_map(Value::from),
                any::<i64>().prop_map(Value::from),
                (-1e12f64..1e12).prop_map(Value::from),
                "\\PC{0,12}".prop_map(Value::from),
            ];
            leaf.prop_recursive(3, 24, 4, |inner| {
                prop_oneof![
                    prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                    prop::collection::btree_map("\\PC{0,6}", inner, 0..4)
                        .prop_map(|m| Value::Object(m.into_iter().collect())),
                ]
            })
        }

        /// A payload object as text, with a big integer and spacing serde would not write.
        fn payload() -> impl Strategy<Value = String> {
            (json(), "[1-9][0-9]{19,30}", "[ \t\n]{0,2}").prop_map(|(v, big, ws)| {
                format!("{{{ws}\"v\":{ws}{v},\"big\":{big}, \"f\":1.0{ws}}}")
            })
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn arbitrary_bytes_decode_or_are_named(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
                match Envelope::decode(&bytes) {
                    Ok(env) => prop_assert!(!env.request.id.is_empty() && env.request.deadline > 0),
                    Err(e) => prop_assert!(!e.to_string().is_empty()),
                }
                let _ = Envelope::salvage_id(&bytes);
            }

            #[test]
            fn json_shaped_members_decode_or_are_named(v in json(), wrap in any::<bool>()) {
                let text = if wrap {
                    format!(r#"{{"request_kind":"plain","data":{v}}}"#)
                } else {
                    v.to_string()
                };
                if let Err(e) = Envelope::decode(text.as_bytes()) {
                    prop_assert!(!e.to_string().is_empty());
                }
            }

            #[test]
            fn encode_decode_keeps_the_data_and_payload_bytes(
                id in "[A-Za-z0-9._:-]{1,24}",
                deadline in 1i64..=i64::MAX / 1000,
                body in payload(),
                token in "[0-9a-f]{32}",
                meta in prop::collection::btree_map("[a-z]{1,5}", "\\PC{0,8}", 0..3),
            ) {
                let req = NewRequest::new(id, deadline, RawValue::from_string(body.clone()).unwrap()).with_created(1).with_metadata(meta);
                let routing = Routing { request_token: token, ..Routing::default() };
                let env = req.into_envelope(routing).unwrap();
                let back = Envelope::decode(&env.encode()).unwrap();
                prop_assert_eq!(back.data.get(), env.data.get());
                prop_assert_eq!(back.request.payload.get(), body.as_str());
            }
        }
    }

    #[test]
    fn salvages_an_id_from_a_bad_member() {
        let (id, _) =
            Envelope::salvage_id(br#"{"request_kind":"plain","data":{"id":"x"}}"#).unwrap();
        assert_eq!(id, "x");
        assert!(Envelope::salvage_id(b"garbage").is_none());
        // An array fills a struct by position in serde; it is still not an envelope.
        assert!(Envelope::salvage_id(br#"[{},{"id":"x"}]"#).is_none());
        // A null payload is Go's nil map: accepted.
        let ok = br#"{"request_kind":"plain","data":{"id":"a","deadline":5,"payload":null}}"#;
        assert_eq!(Envelope::decode(ok).unwrap().request.payload.get(), "null");
    }
}
