//! OpenAI's `metadata`: at most 16 pairs of strings, keys up to 64 characters, values up to
//! 512. [`check`] takes a request's `metadata` value (a batch's, or a front-door request's)
//! and gives it back as JSON text to keep, or OpenAI's 400 naming what is over.

use serde_json::Value;

use crate::error::ApiError;

/// Most pairs.
pub const MAX_PAIRS: usize = 16;
/// Longest key, in characters.
pub const MAX_KEY_CHARS: usize = 64;
/// Longest value, in characters.
pub const MAX_VALUE_CHARS: usize = 512;

/// `None` for no metadata (absent or null), the object as JSON text, or a 400.
pub fn check(value: Option<&Value>) -> Result<Option<String>, ApiError> {
    let m = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(m)) => m,
        Some(other) => {
            return Err(ApiError::invalid(
                format!(
                    "Invalid type for 'metadata': expected an object, but got {} instead.",
                    kind(other)
                ),
                Some("metadata"),
            )
            .with_code("invalid_type"))
        }
    };
    if m.len() > MAX_PAIRS {
        return Err(ApiError::invalid(
            format!(
                "Invalid 'metadata': too many properties. Expected an object with at most {MAX_PAIRS} properties, but got an object with {} properties instead.",
                m.len()
            ),
            Some("metadata"),
        )
        .with_code("object_above_max_properties"));
    }
    for (k, v) in m {
        let key_chars = k.chars().count();
        if key_chars > MAX_KEY_CHARS {
            return Err(ApiError::invalid(
                format!(
                    "Invalid 'metadata': string too long. Expected a string with maximum length {MAX_KEY_CHARS}, but got a string with length {key_chars} instead."
                ),
                Some("metadata"),
            )
            .with_code("string_above_max_length"));
        }
        let param = format!("metadata.{k}");
        match v {
            Value::String(s) if s.chars().count() > MAX_VALUE_CHARS => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid '{param}': string too long. Expected a string with maximum length {MAX_VALUE_CHARS}, but got a string with length {} instead.",
                        s.chars().count()
                    ),
                    Some(&param),
                )
                .with_code("string_above_max_length"))
            }
            Value::String(_) => {}
            other => {
                return Err(ApiError::invalid(
                    format!(
                        "Invalid type for '{param}': expected a string, but got {} instead.",
                        kind(other)
                    ),
                    Some(&param),
                )
                .with_code("invalid_type"))
            }
        }
    }
    Ok(Some(Value::Object(m.clone()).to_string()))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(v: Value) -> (Option<String>, Option<String>) {
        match check(Some(&v)) {
            Err(e) => (e.param, e.code),
            Ok(_) => (None, None),
        }
    }

    #[test]
    fn the_limits_are_sixteen_pairs_and_64_and_512_characters() {
        let full: serde_json::Map<String, Value> = (0..16)
            .map(|i| (format!("{i:0>64}"), json!("é".repeat(512))))
            .collect();
        assert!(check(Some(&Value::Object(full.clone()))).is_ok());
        let mut more = full;
        more.insert("x".into(), json!("y"));
        assert_eq!(
            refused(Value::Object(more)),
            (
                Some("metadata".into()),
                Some("object_above_max_properties".into())
            )
        );
        assert_eq!(
            refused(json!({"k".repeat(65): "v"})),
            (
                Some("metadata".into()),
                Some("string_above_max_length".into())
            )
        );
        assert_eq!(
            refused(json!({"k": "v".repeat(513)})),
            (
                Some("metadata.k".into()),
                Some("string_above_max_length".into())
            )
        );
        assert_eq!(
            refused(json!({"k": 1})),
            (Some("metadata.k".into()), Some("invalid_type".into()))
        );
        assert_eq!(refused(json!(["a"])).1.as_deref(), Some("invalid_type"));
        assert_eq!(check(Some(&Value::Null)).ok(), Some(None));
        assert_eq!(check(None).ok(), Some(None));
    }
}
