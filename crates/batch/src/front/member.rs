//! The queue member the router's step writes, byte for byte as the Go producer v0.9.0 marshals
//! it: the envelope `{"internal":{...},"request_kind":"redis","data":{...}}` with Go's field
//! order and `omitempty`s, and the body re-encoded as Go re-encodes a `map[string]any` (keys
//! sorted, numbers as float64, `<`, `>`, `&`, U+2028 and U+2029 escaped). Hand-written because
//! it is Go's encoding, not JSON in general: no crate writes Go's number and escape forms.
//!
//! In: the request's parts. Out: the member's bytes.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value;

/// What one member carries.
#[derive(Debug, Clone)]
pub struct Member<'a> {
    /// `<tenant>:<id>`.
    pub envelope_id: &'a str,
    pub token: &'a str,
    pub queue: &'a str,
    pub mailbox: &'a str,
    pub created: i64,
    pub deadline: i64,
    pub payload: &'a Value,
    pub metadata: &'a BTreeMap<String, String>,
    pub headers: &'a BTreeMap<String, String>,
    pub endpoint: &'a str,
}

impl Member<'_> {
    /// The member's bytes.
    pub fn encode(&self) -> String {
        let mut o = String::with_capacity(256);
        o.push_str("{\"internal\":{");
        let mut first = true;
        for (name, value) in [
            ("request_token", self.token),
            ("request_queue_name", self.queue),
            ("result_queue_name", self.mailbox),
        ] {
            if !value.is_empty() {
                if !first {
                    o.push(',');
                }
                first = false;
                string(&mut o, name);
                o.push(':');
                string(&mut o, value);
            }
        }
        o.push_str("},\"request_kind\":\"redis\",\"data\":{\"id\":");
        string(&mut o, self.envelope_id);
        let _ = write!(
            o,
            ",\"created\":{},\"deadline\":{},\"payload\":",
            self.created, self.deadline
        );
        value(&mut o, self.payload);
        for (name, map) in [("metadata", self.metadata), ("headers", self.headers)] {
            if !map.is_empty() {
                o.push(',');
                string(&mut o, name);
                o.push_str(":{");
                for (i, (k, v)) in map.iter().enumerate() {
                    if i > 0 {
                        o.push(',');
                    }
                    string(&mut o, k);
                    o.push(':');
                    string(&mut o, v);
                }
                o.push('}');
            }
        }
        for (name, v) in [
            ("endpoint", self.endpoint),
            ("request_queue_name", self.queue),
            ("result_queue_name", self.mailbox),
        ] {
            if !v.is_empty() {
                o.push(',');
                string(&mut o, name);
                o.push(':');
                string(&mut o, v);
            }
        }
        o.push_str("}}");
        o
    }
}

/// A JSON value as Go's `json.Marshal` writes what `json.Unmarshal` into `any` made of it.
pub fn value(o: &mut String, v: &Value) {
    match v {
        Value::Null => o.push_str("null"),
        Value::Bool(b) => o.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => number(o, n.as_f64().unwrap_or(0.0)),
        Value::String(s) => string(o, s),
        Value::Array(a) => {
            o.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                value(o, x);
            }
            o.push(']');
        }
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            o.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    o.push(',');
                }
                string(o, k);
                o.push(':');
                if let Some(x) = m.get(k) {
                    value(o, x);
                }
            }
            o.push('}');
        }
    }
}

/// A float64 as Go's encoder writes it: the shortest form that reads back, in `%f` style from
/// 1e-6 to 1e21 and `%e` style outside (`1e+21`, `1e-7`).
fn number(o: &mut String, f: f64) {
    let a = f.abs();
    if a != 0.0 && !(1e-6..1e21).contains(&a) {
        let e = format!("{f:e}");
        match e.split_once('e') {
            Some((mant, exp)) => {
                let n: i32 = exp.parse().unwrap_or(0);
                if n < 0 {
                    let _ = write!(o, "{mant}e-{}", -n);
                } else {
                    let _ = write!(o, "{mant}e+{n:02}");
                }
            }
            None => o.push_str(&e),
        }
    } else {
        let _ = write!(o, "{f}");
    }
}

/// A string as Go's encoder writes it (HTML-safe).
fn string(o: &mut String, s: &str) {
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            '<' | '>' | '&' | '\u{2028}' | '\u{2029}' => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn go(v: &Value) -> String {
        let mut o = String::new();
        value(&mut o, v);
        o
    }

    #[test]
    fn bodies_are_re_encoded_as_go_re_encodes_them() {
        assert_eq!(
            go(
                &json!({"z": 1, "a": [1.5, 2e21, 1e-7, 12345678901234567890u64, -0.0], "m": "<a&b>\u{2028}\u{1}\n"})
            ),
            r#"{"a":[1.5,2e+21,1e-7,12345678901234567000,-0],"m":"\u003ca\u0026b\u003e\u2028\u0001\n","z":1}"#
        );
    }

    #[test]
    fn the_member_is_the_go_producers() {
        let mut metadata = BTreeMap::new();
        metadata.insert("userid".to_owned(), "acme".to_owned());
        metadata.insert("traceparent".to_owned(), "00-a-b-01".to_owned());
        let mut headers = BTreeMap::new();
        headers.insert("x-llm-d-slo-ttft-ms".to_owned(), "200".to_owned());
        let payload = json!({"model": "m", "messages": []});
        let m = Member {
            envelope_id: "acme:job-1",
            token: "00ff",
            queue: "q",
            mailbox: "results:req:acme:job-1",
            created: 10,
            deadline: 70,
            payload: &payload,
            metadata: &metadata,
            headers: &headers,
            endpoint: "/v1/chat/completions",
        };
        assert_eq!(
            m.encode(),
            concat!(
                r#"{"internal":{"request_token":"00ff","request_queue_name":"q","result_queue_name":"results:req:acme:job-1"},"#,
                r#""request_kind":"redis","data":{"id":"acme:job-1","created":10,"deadline":70,"#,
                r#""payload":{"messages":[],"model":"m"},"metadata":{"traceparent":"00-a-b-01","userid":"acme"},"#,
                r#""headers":{"x-llm-d-slo-ttft-ms":"200"},"endpoint":"/v1/chat/completions","#,
                r#""request_queue_name":"q","result_queue_name":"results:req:acme:job-1"}}"#
            )
        );
    }
}
