//! The File and Batch objects as OpenAI's SDKs parse them, built from their Redis hashes. Every
//! field OpenAI defines is present (`null` when unset), so typed clients never miss one.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

/// A Redis hash as read (`HGETALL`).
pub type Fields = HashMap<String, String>;

fn int(f: &Fields, name: &str) -> Value {
    f.get(name)
        .and_then(|v| v.parse::<i64>().ok())
        .map_or(Value::Null, Value::from)
}

fn count(f: &Fields, name: &str) -> i64 {
    f.get(name).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn text(f: &Fields, name: &str) -> Value {
    f.get(name)
        .filter(|v| !v.is_empty())
        .map_or(Value::Null, |v| Value::from(v.as_str()))
}

fn raw_json(f: &Fields, name: &str) -> Value {
    f.get(name)
        .filter(|v| !v.is_empty())
        .and_then(|v| serde_json::from_str(v).ok())
        .unwrap_or(Value::Null)
}

/// The File object.
pub fn file_object(f: &Fields) -> Value {
    json!({
        "id": text(f, "id"),
        "object": "file",
        "bytes": count(f, "bytes"),
        "created_at": int(f, "created_at"),
        "filename": text(f, "filename"),
        "purpose": text(f, "purpose"),
        "status": "processed",
        "status_details": null,
        "expires_at": int(f, "expires_at"),
    })
}

/// The Batch object.
pub fn batch_object(f: &Fields) -> Value {
    let mut o = Map::new();
    o.insert("id".into(), text(f, "id"));
    o.insert("object".into(), "batch".into());
    for name in ["endpoint", "input_file_id", "completion_window", "status"] {
        o.insert(name.into(), text(f, name));
    }
    o.insert("errors".into(), raw_json(f, "errors"));
    for name in ["output_file_id", "error_file_id"] {
        o.insert(name.into(), text(f, name));
    }
    for name in [
        "created_at",
        "in_progress_at",
        "expires_at",
        "finalizing_at",
        "completed_at",
        "failed_at",
        "expired_at",
        "cancelling_at",
        "cancelled_at",
    ] {
        o.insert(name.into(), int(f, name));
    }
    o.insert(
        "request_counts".into(),
        json!({
            "total": count(f, "total"),
            "completed": count(f, "completed"),
            "failed": count(f, "failed"),
        }),
    );
    o.insert("metadata".into(), raw_json(f, "metadata"));
    o.insert("model".into(), text(f, "model"));
    o.insert("usage".into(), usage(f));
    Value::Object(o)
}

/// The Batch object's `usage`: the tokens of the results collected so far (live while it runs).
fn usage(f: &Fields) -> Value {
    json!({
        "input_tokens": count(f, "usage_input"),
        "input_tokens_details": {"cached_tokens": count(f, "usage_cached")},
        "output_tokens": count(f, "usage_output"),
        "output_tokens_details": {"reasoning_tokens": count(f, "usage_reasoning")},
        "total_tokens": count(f, "usage_total"),
    })
}

/// A list object of `data`, with OpenAI's cursor fields.
pub fn list_object(data: Vec<Value>, has_more: bool) -> Value {
    let id_of = |v: Option<&Value>| v.and_then(|o| o.get("id")).cloned().unwrap_or(Value::Null);
    json!({
        "object": "list",
        "first_id": id_of(data.first()),
        "last_id": id_of(data.last()),
        "has_more": has_more,
        "data": data,
    })
}

/// Whether a status is an ending (the batch will not move again).
pub fn is_ended(status: &str) -> bool {
    matches!(status, "completed" | "failed" | "expired" | "cancelled")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_batch_has_every_field_and_nulls_where_unset() {
        let f: Fields = [
            ("id", "batch_x"),
            ("status", "validating"),
            ("endpoint", "/v1/chat/completions"),
            ("created_at", "100"),
            ("metadata", r#"{"k":"v"}"#),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let b = batch_object(&f);
        assert_eq!(b["object"], "batch");
        assert_eq!(b["created_at"], 100);
        assert_eq!(b["metadata"]["k"], "v");
        assert!(b["completed_at"].is_null());
        assert!(b["errors"].is_null());
        assert_eq!(b["request_counts"]["total"], 0);
        assert_eq!(b["usage"]["total_tokens"], 0);
        assert_eq!(b["usage"]["input_tokens_details"]["cached_tokens"], 0);
        assert_eq!(b.as_object().map(|o| o.len()), Some(22));
    }
}
