//! Request body transforms (go-compat §5.8): a chain built from the transform file, asked twice
//! per request. [`Transforms::validate`] runs every transform before the pool gate (first error
//! wins); [`Transforms::apply`] runs them in order just before the send, and the first that
//! handles the request gives its body and `Content-Type` (errors stop the chain). An error
//! becomes the request's `INVALID_REQUEST` result in the worker.
//!
//! The one type, `gcs_uri_multipart`, handles a request whose `metadata.provider` is one of its
//! providers and whose payload has a non-empty string `gcs_uri` (a signed GCS URL): validating
//! checks the URL is still signed for after the request's deadline, and applying turns the payload
//! into a `multipart/form-data` body: field `url` first, then every other top-level field (strings
//! as they are, other values as JSON), without `gcs_uri` and `file_base64`.

use std::collections::BTreeMap;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::config::transform::{TransformKind, TransformSpec};

/// Why a transform refused a request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("transform {name}/{kind}: {reason}")]
pub struct TransformError {
    pub name: String,
    pub kind: &'static str,
    pub reason: String,
}

/// A body a transform made, with its content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transformed {
    pub body: Bytes,
    pub content_type: String,
}

/// The configured chain; empty when no transform file was given.
#[derive(Debug, Clone, Default)]
pub struct Transforms {
    chain: Vec<TransformSpec>,
}

impl Transforms {
    pub fn new(specs: &[TransformSpec]) -> Transforms {
        Transforms {
            chain: specs.to_vec(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.chain.is_empty()
    }

    /// Runs every transform's check on a request due by `deadline` (Unix seconds).
    pub fn validate(
        &self,
        payload: &RawValue,
        metadata: &BTreeMap<String, String>,
        deadline: i64,
    ) -> Result<(), TransformError> {
        for spec in &self.chain {
            let TransformKind::GcsUriMultipart { providers } = &spec.kind;
            let Some((_, gcs_uri)) = gcs_request(providers, payload, metadata) else {
                continue;
            };
            let fail = |reason: String| error(spec, reason);
            let expiry = signed_url_expiry(&gcs_uri).map_err(fail)?;
            if expiry <= deadline {
                return Err(error(
                    spec,
                    format!(
                        "the signed gcs_uri expires at {expiry} (Unix seconds), not after the \
                         request's deadline {deadline}"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The body the first transform that handles the request makes; `None` when none does.
    pub fn apply(
        &self,
        payload: &RawValue,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Option<Transformed>, TransformError> {
        for spec in &self.chain {
            let TransformKind::GcsUriMultipart { providers } = &spec.kind;
            let Some((fields, gcs_uri)) = gcs_request(providers, payload, metadata) else {
                continue;
            };
            if fields
                .get("file_base64")
                .and_then(Value::as_str)
                .is_some_and(|s| !s.is_empty())
            {
                return Err(error(
                    spec,
                    "the payload has both gcs_uri and file_base64; send one".to_owned(),
                ));
            }
            return Ok(Some(multipart(&gcs_uri, &fields)));
        }
        Ok(None)
    }
}

fn error(spec: &TransformSpec, reason: String) -> TransformError {
    TransformError {
        name: spec.name.clone(),
        kind: spec.kind.type_name(),
        reason,
    }
}

/// The payload's fields and its `gcs_uri` when the transform applies to this request.
fn gcs_request(
    providers: &[String],
    payload: &RawValue,
    metadata: &BTreeMap<String, String>,
) -> Option<(Map<String, Value>, String)> {
    let provider = metadata.get("provider")?;
    if !providers.iter().any(|p| p == provider) {
        return None;
    }
    let fields: Map<String, Value> = serde_json::from_str(payload.get()).ok()?;
    let gcs_uri = fields.get("gcs_uri")?.as_str()?.to_owned();
    (!gcs_uri.is_empty()).then_some((fields, gcs_uri))
}

/// When a signed GCS URL stops working, in Unix seconds: V4 signing's `X-Goog-Date`
/// (`yyyymmddThhmmssZ`) plus `X-Goog-Expires` seconds, else V2 signing's `Expires`.
fn signed_url_expiry(gcs_uri: &str) -> Result<i64, String> {
    let url = url::Url::parse(gcs_uri).map_err(|e| format!("gcs_uri is not a URL: {e}"))?;
    let query: BTreeMap<String, String> = url
        .query_pairs()
        .map(|(k, v)| (k.to_ascii_lowercase(), v.into_owned()))
        .collect();
    if let Some(date) = query.get("x-goog-date") {
        let start =
            v4_date(date).ok_or_else(|| format!("X-Goog-Date {date:?} is not yyyymmddThhmmssZ"))?;
        let seconds = query
            .get("x-goog-expires")
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|s| *s >= 0)
            .ok_or("X-Goog-Date without a whole number of X-Goog-Expires seconds")?;
        return Ok(start.saturating_add(seconds));
    }
    match query.get("expires") {
        Some(text) => text
            .parse::<i64>()
            .map_err(|_| format!("Expires {text:?} is not Unix seconds")),
        None => Err(
            "gcs_uri is not a signed URL: it has neither X-Goog-Date with \
                     X-Goog-Expires nor Expires"
                .to_owned(),
        ),
    }
}

/// `yyyymmddThhmmssZ` as Unix seconds.
fn v4_date(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let rfc3339 = format!(
        "{}-{}-{}T{}:{}:{}Z",
        &text[0..4],
        &text[4..6],
        &text[6..8],
        &text[9..11],
        &text[11..13],
        &text[13..15]
    );
    let at = humantime::parse_rfc3339(&rfc3339).ok()?;
    at.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .and_then(|d| i64::try_from(d.as_secs()).ok())
}

/// The multipart/form-data body: `url` first, then the other fields.
fn multipart(gcs_uri: &str, fields: &Map<String, Value>) -> Transformed {
    let boundary: String = (0..30)
        .map(|_| char::from(b"0123456789abcdef"[rand::random_range(0..16usize)]))
        .collect();
    let mut body = String::new();
    let mut part = |name: &str, value: &str| {
        body.push_str(&format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"\r\n\r\n{value}\r\n",
            escape_quotes(name)
        ));
    };
    part("url", gcs_uri);
    for (name, value) in fields {
        if name == "gcs_uri" || name == "file_base64" {
            continue;
        }
        match value {
            Value::String(s) => part(name, s),
            other => part(name, &other.to_string()),
        }
    }
    body.push_str(&format!("--{boundary}--\r\n"));
    Transformed {
        body: Bytes::from(body),
        content_type: format!("multipart/form-data; boundary={boundary}"),
    }
}

/// A form field name inside its quotes (as Go's `mime/multipart` escapes it).
fn escape_quotes(name: &str) -> String {
    name.replace('\\', "\\\\").replace('"', "\\\"")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain() -> Transforms {
        Transforms::new(&[TransformSpec {
            name: "audio".into(),
            kind: TransformKind::GcsUriMultipart {
                providers: vec!["openai".into()],
            },
        }])
    }

    fn raw(json: &str) -> Box<RawValue> {
        RawValue::from_string(json.to_owned()).unwrap_or_else(|_| RawValue::NULL.to_owned())
    }

    fn meta(provider: &str) -> BTreeMap<String, String> {
        [("provider".to_owned(), provider.to_owned())].into()
    }

    /// 2026-01-01T00:00:00Z.
    const JAN1: i64 = 1_767_225_600;

    #[test]
    fn only_requests_of_its_providers_with_a_gcs_uri_are_handled() {
        let c = chain();
        let payload = raw(r#"{"gcs_uri":"https://storage.googleapis.com/b/o?Expires=9999999999"}"#);
        assert!(c.apply(&payload, &meta("anthropic")).unwrap().is_none());
        assert!(c.apply(&payload, &BTreeMap::new()).unwrap().is_none());
        assert!(c
            .apply(&raw(r#"{"gcs_uri":""}"#), &meta("openai"))
            .unwrap()
            .is_none());
        assert!(c
            .apply(&raw(r#"{"gcs_uri":7}"#), &meta("openai"))
            .unwrap()
            .is_none());
        assert!(c
            .apply(&raw(r#"["x"]"#), &meta("openai"))
            .unwrap()
            .is_none());
        assert!(c.apply(&payload, &meta("openai")).unwrap().is_some());
        assert!(Transforms::default()
            .apply(&payload, &meta("openai"))
            .unwrap()
            .is_none());
    }

    #[test]
    fn the_body_is_multipart_with_url_first_and_values_as_go_writes_them() {
        let payload = raw(
            r#"{"model":"whisper","gcs_uri":"https://g/o?Expires=1","temperature":0.2,
                "file_base64":"","options":{"a":[1,2]}}"#,
        );
        let t = chain().apply(&payload, &meta("openai")).unwrap().unwrap();
        let boundary = t
            .content_type
            .strip_prefix("multipart/form-data; boundary=")
            .unwrap()
            .to_owned();
        assert_eq!(boundary.len(), 30);
        let body = String::from_utf8(t.body.to_vec()).unwrap();
        let part = |name: &str, value: &str| {
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
        };
        let want = [
            part("url", "https://g/o?Expires=1"),
            part("model", "whisper"),
            part("options", r#"{"a":[1,2]}"#),
            part("temperature", "0.2"),
            format!("--{boundary}--\r\n"),
        ]
        .concat();
        assert_eq!(body, want);
    }

    #[test]
    fn a_payload_with_file_base64_too_is_refused_naming_the_transform() {
        let payload = raw(r#"{"gcs_uri":"https://g/o","file_base64":"AAAA"}"#);
        let e = chain().apply(&payload, &meta("openai")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "transform audio/gcs_uri_multipart: the payload has both gcs_uri and file_base64; \
             send one"
        );
    }

    #[test]
    fn the_signed_url_must_outlive_the_deadline() {
        let c = chain();
        let check = |uri: &str, deadline: i64| {
            let payload = raw(&serde_json::json!({ "gcs_uri": uri }).to_string());
            c.validate(&payload, &meta("openai"), deadline)
                .map_err(|e| e.reason)
        };
        // V4: signed at Jan 1 for an hour.
        let v4 = "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256\
                  &X-Goog-Date=20260101T000000Z&X-Goog-Expires=3600&X-Goog-Signature=ab";
        assert_eq!(check(v4, JAN1 + 3599), Ok(()));
        assert!(check(v4, JAN1 + 3600)
            .unwrap_err()
            .contains("expires at 1767229200"));
        // V2: Expires in Unix seconds.
        let v2 = format!(
            "https://storage.googleapis.com/b/o?GoogleAccessId=x&Expires={}",
            JAN1
        );
        assert_eq!(check(&v2, JAN1 - 1), Ok(()));
        assert!(check(&v2, JAN1).is_err());
        for (bad, why) in [
            (
                "https://g/o?X-Goog-Date=2026-01-01&X-Goog-Expires=1",
                "is not yyyymmddThhmmssZ",
            ),
            ("https://g/o?X-Goog-Date=20260101T000000Z", "X-Goog-Expires"),
            ("https://g/o?Expires=soon", "is not Unix seconds"),
            ("https://g/o", "is not a signed URL"),
            ("not a url", "is not a URL"),
        ] {
            let e = check(bad, JAN1).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // Not handled: nothing to check.
        let payload = raw(r#"{"gcs_uri":"https://g/o"}"#);
        assert_eq!(c.validate(&payload, &meta("other"), JAN1), Ok(()));
    }
}
