//! How long a file lives: `expires_after` on an upload and `output_expires_after` on a batch
//! (`{"anchor": "created_at", "seconds": N}`, N from `--min-expires-after` (OpenAI: 3600) to
//! 30 days), else `--file-retention`. [`expires_after`] checks what a request gives and answers
//! OpenAI's 400s; the lifetime it gives goes into the File object's `expires_at` and the
//! expiries zset the sweeper ([`crate::sweeper`]) reads.

use std::time::Duration;

use crate::error::ApiError;
use crate::settings::{Retention, MAX_EXPIRES_AFTER};

/// The lifetime in seconds an `expires_after`-shaped parameter `param` asks for (`anchor` and
/// `seconds` as the request gave them), or `None` when it gives neither.
pub fn expires_after(
    param: &str,
    anchor: Option<&str>,
    seconds: Option<&str>,
    retention: &Retention,
) -> Result<Option<u64>, ApiError> {
    let (anchor, seconds) = match (anchor, seconds) {
        (None, None) => return Ok(None),
        (None, Some(_)) => {
            return Err(ApiError::invalid(
                format!("Missing required parameter: '{param}.anchor'."),
                Some(&format!("{param}.anchor")),
            )
            .with_code("missing_required_parameter"))
        }
        (Some(_), None) => {
            return Err(ApiError::invalid(
                format!("Missing required parameter: '{param}.seconds'."),
                Some(&format!("{param}.seconds")),
            )
            .with_code("missing_required_parameter"))
        }
        (Some(a), Some(s)) => (a, s),
    };
    if anchor != "created_at" {
        return Err(ApiError::invalid(
            format!("Invalid '{param}.anchor': '{anchor}'. Supported values are: 'created_at'."),
            Some(&format!("{param}.anchor")),
        )
        .with_code("invalid_value"));
    }
    let seconds_param = format!("{param}.seconds");
    let Ok(n) = seconds.trim().parse::<i64>() else {
        return Err(ApiError::invalid(
            format!("Invalid type for '{seconds_param}': expected an integer, but got '{seconds}' instead."),
            Some(&seconds_param),
        )
        .with_code("invalid_type"));
    };
    let min = i64::try_from(retention.min_expires_after.as_secs()).unwrap_or(3600);
    let max = i64::try_from(MAX_EXPIRES_AFTER).unwrap_or(i64::MAX);
    if n < min {
        return Err(ApiError::invalid(
            format!("Invalid '{seconds_param}': integer below minimum value. Expected a value greater than or equal to {min}, but got {n} instead."),
            Some(&seconds_param),
        )
        .with_code("integer_below_min_value"));
    }
    if n > max {
        return Err(ApiError::invalid(
            format!("Invalid '{seconds_param}': integer above maximum value. Expected a value less than or equal to {max}, but got {n} instead."),
            Some(&seconds_param),
        )
        .with_code("integer_above_max_value"));
    }
    Ok(u64::try_from(n).ok())
}

/// The same from a JSON body's object (`output_expires_after`).
pub fn expires_after_json(
    param: &str,
    value: Option<&serde_json::Value>,
    retention: &Retention,
) -> Result<Option<u64>, ApiError> {
    use serde_json::Value;
    let o = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(o)) => o,
        Some(_) => {
            return Err(ApiError::invalid(
                format!("Invalid type for '{param}': expected an object."),
                Some(param),
            )
            .with_code("invalid_type"))
        }
    };
    let anchor = o.get("anchor").map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    let seconds = o.get("seconds").map(|v| match v {
        Value::String(s) => format!("'{s}'"),
        other => other.to_string(),
    });
    expires_after(param, anchor.as_deref(), seconds.as_deref(), retention)
}

/// Seconds as a whole number for a Lua argument.
pub fn secs(d: Duration) -> u64 {
    d.as_secs().max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_expiry_is_anchored_at_creation_and_within_the_bounds() {
        let r = Retention::default();
        let code = |a: Option<&str>, s: Option<&str>| {
            expires_after("expires_after", a, s, &r)
                .err()
                .and_then(|e| e.code)
        };
        assert_eq!(
            expires_after("expires_after", Some("created_at"), Some("3600"), &r).ok(),
            Some(Some(3600))
        );
        assert_eq!(
            expires_after("expires_after", None, None, &r).ok(),
            Some(None)
        );
        assert_eq!(
            code(Some("created_at"), Some("3599")).as_deref(),
            Some("integer_below_min_value")
        );
        assert_eq!(
            code(Some("created_at"), Some("2592001")).as_deref(),
            Some("integer_above_max_value")
        );
        assert_eq!(
            code(Some("last_active_at"), Some("3600")).as_deref(),
            Some("invalid_value")
        );
        assert_eq!(
            code(None, Some("3600")).as_deref(),
            Some("missing_required_parameter")
        );
        assert_eq!(
            code(Some("created_at"), Some("soon")).as_deref(),
            Some("invalid_type")
        );
        let short = Retention {
            min_expires_after: Duration::from_secs(1),
            ..Retention::default()
        };
        assert_eq!(
            expires_after("expires_after", Some("created_at"), Some("2"), &short).ok(),
            Some(Some(2))
        );
        let json = serde_json::json!({"anchor": "created_at", "seconds": 7200});
        assert_eq!(
            expires_after_json("output_expires_after", Some(&json), &r).ok(),
            Some(Some(7200))
        );
        let bad = serde_json::json!({"anchor": "created_at", "seconds": "7200"});
        assert!(expires_after_json("output_expires_after", Some(&bad), &r).is_err());
    }
}
