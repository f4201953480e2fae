//! Strict JSON decoding for the config files: text in, a typed raw struct out, or a
//! [`ConfigError`] naming the JSON path at fault (`queues[0].igw_base_ur: unknown field`).
//! Unlike Go's `encoding/json`, unknown fields are errors (the raw structs deny them).

use serde::de::DeserializeOwned;
use serde_json::Value;
use serde_path_to_error::Segment;

use super::gate::json_kind;
use super::ConfigError;

/// Decodes `text` as `T`. `root` prefixes every path (`""` for the transport config, whose
/// fields are named bare; `"pools"` for the pool file) and `source` names syntax errors.
///
/// `objects` says where `T` has structs, which must be JSON objects: `""` the root, `"[]"` each
/// item of a root array, `"queues[]"` each item of the root's `queues`. serde alone would also
/// read a struct from an array of its field values, which Go refuses, and its errors would then
/// name fields that do not exist (`[0]: invalid type: map, expected a string` for a pool file
/// given as the transport config).
pub(crate) fn decode<T: DeserializeOwned>(
    text: &str,
    root: &str,
    source: &str,
    objects: &[&str],
) -> Result<T, ConfigError> {
    if !objects.is_empty() {
        let value: Value =
            serde_json::from_str(text).map_err(|e| describe(e, String::new(), source))?;
        check_objects(&value, root, source, objects)?;
    }
    let mut de = serde_json::Deserializer::from_str(text);
    let decoded: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = match decoded {
        Ok(value) => value,
        Err(err) => {
            let path = render_path(root, err.path());
            let inner = err.into_inner();
            return Err(describe(inner, path, source));
        }
    };
    de.end()
        .map_err(|e| ConfigError::invalid(source, format!("invalid JSON: {e}")))?;
    Ok(value)
}

/// Decodes an already-parsed JSON value as `T`; paths are prefixed with `root`, which also names
/// the value when the error has no deeper path.
pub(crate) fn decode_value<T: DeserializeOwned>(
    value: serde_json::Value,
    root: &str,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(value).map_err(|err| {
        let path = render_path(root, err.path());
        describe(err.into_inner(), path, root)
    })
}

/// Checks that `value` holds JSON objects where `objects` (see [`decode`]) says it must.
fn check_objects(
    value: &Value,
    root: &str,
    source: &str,
    objects: &[&str],
) -> Result<(), ConfigError> {
    let not_object = |field: String, got: &Value| {
        ConfigError::invalid(
            field,
            format!("must be a JSON object, got {}", json_kind(got)),
        )
    };
    for pattern in objects {
        let (container, items) = match pattern.strip_suffix("[]") {
            Some(key) => (key, true),
            None => (*pattern, false),
        };
        let (at, found) = if container.is_empty() {
            (root.to_owned(), Some(value))
        } else {
            let at = if root.is_empty() {
                container.to_owned()
            } else {
                format!("{root}.{container}")
            };
            (at, value.get(container))
        };
        match found {
            Some(Value::Array(list)) if items => {
                for (i, item) in list.iter().enumerate() {
                    if !item.is_object() {
                        return Err(not_object(format!("{at}[{i}]"), item));
                    }
                }
            }
            Some(other) if !items && !other.is_object() => {
                let field = if at.is_empty() { source.to_owned() } else { at };
                return Err(not_object(field, other));
            }
            // Anything else is left to the decoder, whose message names the type expected.
            _ => {}
        }
    }
    Ok(())
}

/// `root` followed by the path segments, e.g. `queues[0].labels.tier`.
fn render_path(root: &str, path: &serde_path_to_error::Path) -> String {
    let mut out = root.to_owned();
    for segment in path {
        match segment {
            Segment::Seq { index } => out.push_str(&format!("[{index}]")),
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !out.is_empty() {
                    out.push('.');
                }
                // An empty key would leave the error naming no field at all (found by fuzzing).
                out.push_str(if key.is_empty() { "\"\"" } else { key });
            }
            Segment::Unknown => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push('?');
            }
        }
    }
    out
}

/// Turns a serde error at `path` into a config error.
fn describe(err: serde_json::Error, path: String, source: &str) -> ConfigError {
    let message = err.to_string();
    if err.is_syntax() || err.is_eof() {
        return ConfigError::invalid(source, format!("invalid JSON: {message}"));
    }
    // serde: "unknown field `x`, expected one of `a`, `b` at line 1 column 9"
    let message = strip_position(&message);
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let expected = rest
            .split_once("`, ")
            .map(|(_, tail)| tail.to_owned())
            .unwrap_or_default();
        let reason = if expected.is_empty() {
            "unknown field".to_owned()
        } else {
            format!("unknown field ({expected})")
        };
        return ConfigError::invalid(path, reason);
    }
    let field = if path.is_empty() {
        source.to_owned()
    } else {
        path
    };
    ConfigError::invalid(field, message)
}

/// Drops serde_json's trailing ` at line L column C`.
fn strip_position(message: &str) -> &str {
    match message.rfind(" at line ") {
        Some(i) if message[i..].contains(" column ") => &message[..i],
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        name: Option<String>,
        size: Option<u32>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        items: Option<Vec<Inner>>,
    }

    fn err_text(text: &str, root: &str) -> String {
        match decode::<Outer>(text, root, "--source", &["", "items[]"]) {
            Ok(v) => format!("decoded {v:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn unknown_field_names_its_path() {
        assert_eq!(
            err_text(r#"{"items":[{"name":"a"},{"nmae":"b"}]}"#, ""),
            "invalid config: items[1].nmae: unknown field (expected `name` or `size`)"
        );
        assert_eq!(
            err_text(r#"{"itms":[]}"#, "root"),
            "invalid config: root.itms: unknown field (expected `items`)"
        );
        assert_eq!(
            err_text(r#"{"":1}"#, ""),
            "invalid config: \"\": unknown field (expected `items`)"
        );
        assert_eq!(
            err_text(r#"{"items":[{"":1}]}"#, ""),
            "invalid config: items[0].\"\": unknown field (expected `name` or `size`)"
        );
    }

    #[test]
    fn type_errors_name_their_path_and_syntax_errors_the_source() {
        assert_eq!(
            err_text(r#"{"items":[{"size":-1}]}"#, ""),
            "invalid config: items[0].size: invalid value: integer `-1`, expected u32"
        );
        let syntax = err_text(r#"{"items": [}"#, "");
        assert!(
            syntax.starts_with("invalid config: --source: invalid JSON: "),
            "{syntax}"
        );
        let trailing = err_text(r#"{} x"#, "");
        assert!(
            trailing.starts_with("invalid config: --source: invalid JSON: "),
            "{trailing}"
        );
    }
}
