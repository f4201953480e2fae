//! JSON written as Go's `encoding/json` writes it, so the emulated step's queue members are the
//! router's bytes and not merely equal JSON.
//!
//! Data enters as a [`serde_json::Value`] (the request body the step parsed into Go's
//! `map[string]any`) or a string, and leaves as the compact text `json.Marshal` would produce:
//! - object keys sorted bytewise (Go sorts a map's keys; the body's own order is lost);
//! - every number a float64 (`map[string]any` holds float64), printed as Go prints one: the
//!   shortest digits that read back, plainly between 1e-6 and 1e21, else with an exponent that
//!   has a sign and no padding zero (`1e+21`, `1e-7`); `1.0` is `1`, `2^64` is
//!   `18446744073709552000`;
//! - strings with Go's escapes: `\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`, other control bytes as
//!   `\u00XX` (lower-case hex), the HTML-sensitive `<`, `>`, `&` as `\u003c`, `\u003e`,
//!   `\u0026`, and U+2028, U+2029 as `\u2028`, `\u2029`; everything else as it is.
//!
//! Hand-written because serde_json writes keys in its map's order, numbers as parsed and no
//! HTML escapes: no crate writes Go's bytes.

use serde_json::Value;

/// `value` as Go's `json.Marshal` of the `any` it would have unmarshalled to.
pub(crate) fn marshal(value: &Value) -> String {
    let mut out = String::new();
    write_value(&mut out, value);
    out
}

/// A Go string literal of `s`, quotes included.
pub(crate) fn string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    write_string(&mut out, s);
    out
}

/// `{"k":"v",...}`: a Go `map[string]string`, keys sorted.
pub(crate) fn string_map<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut pairs: Vec<(&str, &str)> = pairs.into_iter().collect();
    pairs.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut out = String::from("{");
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(&mut out, k);
        out.push(':');
        write_string(&mut out, v);
    }
    out.push('}');
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&float(n.as_f64().unwrap_or(f64::NAN))),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            // Sorted here, not by trusting the map: serde_json keeps insertion order when any
            // crate in the build turns on its `preserve_order` feature.
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_value(out, &map[key]);
            }
            out.push('}');
        }
    }
}

/// Go's float64 encoder: `strconv.AppendFloat(f, 'f' or 'e', -1, 64)`, `e` outside
/// [1e-6, 1e21), with `e-07` cleaned to `e-7`. Rust's shortest digits are the same digits;
/// only the exponent's spelling differs (`1e21` against Go's `1e+21`).
fn float(f: f64) -> String {
    let abs = f.abs();
    if abs != 0.0 && !(1e-6..1e21).contains(&abs) {
        let rust = format!("{f:e}");
        match rust.split_once('e') {
            Some((mantissa, exp)) if !exp.starts_with('-') => format!("{mantissa}e+{exp}"),
            _ => rust,
        }
    } else {
        format!("{f}")
    }
}

fn write_string(out: &mut String, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '<' | '>' | '&' | '\u{0}'..='\u{1f}' => {
                let b = c as u32 as u8;
                out.push_str("\\u00");
                out.push(HEX[usize::from(b >> 4)] as char);
                out.push(HEX[usize::from(b & 0xf)] as char);
            }
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each expected string is what Go 1.26's `json.Marshal` prints for the value after
    /// `json.Unmarshal` into `any`.
    #[test]
    fn numbers_print_as_go_prints_float64() {
        let cases = [
            ("16", "16"),
            ("1.0", "1"),
            ("0.7", "0.7"),
            ("-0.0", "-0"),
            ("1e3", "1000"),
            ("1e20", "100000000000000000000"),
            ("1e21", "1e+21"),
            ("123456789e20", "1.23456789e+28"),
            ("0.000001", "0.000001"),
            ("0.0000001", "1e-7"),
            ("1.5e-10", "1.5e-10"),
            ("18446744073709551616", "18446744073709552000"),
            ("9007199254740993", "9007199254740992"),
            ("5e-324", "5e-324"),
        ];
        for (input, go) in cases {
            let value: Value = serde_json::from_str(input).unwrap();
            assert_eq!(marshal(&value), go, "{input}");
        }
    }

    #[test]
    fn strings_take_go_escapes() {
        let value =
            Value::String("a\"b\\c\u{8}\u{c}\n\r\t\u{1}\u{1f}<>&\u{7f}é\u{2028}\u{2029}😀/".into());
        assert_eq!(
            marshal(&value),
            "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f\\u003c\\u003e\\u0026\u{7f}é\\u2028\\u2029😀/\""
        );
    }

    #[test]
    fn objects_sort_keys_at_every_depth() {
        let value: Value =
            serde_json::from_str(r#"{"z":1,"a":{"y":[{"b":2,"a":1}],"x":null},"B":true,"<":"&"}"#)
                .unwrap();
        assert_eq!(
            marshal(&value),
            r#"{"\u003c":"\u0026","B":true,"a":{"x":null,"y":[{"a":1,"b":2}]},"z":1}"#
        );
        assert_eq!(
            string_map([("userid", "t"), ("traceparent", "00-1")]),
            r#"{"traceparent":"00-1","userid":"t"}"#
        );
    }
}
