//! Go's lenient gate-parameter coercion (go-compat §6.2): strings, numbers and bools are accepted
//! for string parameters (empty string = default); numbers accept a number or a numeric string;
//! integers an integral number or string; durations Go syntax (`1m`, `10s`); map and gate
//! parameters a JSON string or an object. Every error names the gate and the parameter.
//!
//! It lives in `config` because both sides read gate parameters: the pools config (a
//! `local-max-concurrency` gate's limit) and the gate factories downstream in
//! `dispatch::gates`, whose error type takes a [`ParamError`] in.

use std::time::Duration;

use serde_json::{Map, Value};

/// A gate parameter that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gate {gate}: parameter {param}: {reason}")]
pub struct ParamError {
    pub gate: &'static str,
    pub param: String,
    pub reason: String,
}

/// The parameters of one gate, with the gate's name for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Params<'a> {
    pub gate: &'static str,
    pub map: &'a Map<String, Value>,
}

impl<'a> Params<'a> {
    pub fn new(gate: &'static str, map: &'a Map<String, Value>) -> Params<'a> {
        Params { gate, map }
    }

    fn err(&self, param: &str, reason: impl Into<String>) -> ParamError {
        ParamError {
            gate: self.gate,
            param: param.to_owned(),
            reason: reason.into(),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Value> {
        match self.map.get(name) {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(v) => Some(v),
        }
    }

    /// A string parameter (numbers and bools are rendered as text).
    pub fn string(&self, name: &str) -> Option<String> {
        self.get(name).map(|v| match v {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
    }

    pub fn string_or(&self, name: &str, default: &str) -> String {
        self.string(name).unwrap_or_else(|| default.to_owned())
    }

    pub fn required_string(&self, name: &str) -> Result<String, ParamError> {
        self.string(name).ok_or_else(|| self.err(name, "required"))
    }

    pub fn float(&self, name: &str) -> Result<Option<f64>, ParamError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => Ok(n.as_f64()),
            Some(Value::String(s)) => s
                .trim()
                .parse::<f64>()
                .map(Some)
                .map_err(|_| self.err(name, format!("not a number: {s:?}"))),
            Some(other) => Err(self.err(name, format!("not a number: {other}"))),
        }
    }

    pub fn float_or(&self, name: &str, default: f64) -> Result<f64, ParamError> {
        Ok(self.float(name)?.unwrap_or(default))
    }

    pub fn int(&self, name: &str) -> Result<Option<i64>, ParamError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Number(n)) => match (n.as_i64(), n.as_f64()) {
                (Some(i), _) => Ok(Some(i)),
                (None, Some(f)) if f.fract() == 0.0 && f.abs() < 9.0e15 => Ok(Some(f as i64)),
                _ => Err(self.err(name, format!("not an integer: {n}"))),
            },
            Some(Value::String(s)) => s
                .trim()
                .parse::<i64>()
                .map(Some)
                .map_err(|_| self.err(name, format!("not an integer: {s:?}"))),
            Some(other) => Err(self.err(name, format!("not an integer: {other}"))),
        }
    }

    pub fn duration_or(&self, name: &str, default: Duration) -> Result<Duration, ParamError> {
        match self.get(name) {
            None => Ok(default),
            Some(Value::String(s)) => crate::config::parse_duration(s)
                .map_err(|e| self.err(name, format!("invalid duration {s:?} ({e:?})"))),
            Some(other) => Err(self.err(name, format!("not a duration: {other}"))),
        }
    }

    /// An object parameter given as an object or as a JSON string.
    pub fn object(&self, name: &str) -> Result<Option<Map<String, Value>>, ParamError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Object(m)) => Ok(Some(m.clone())),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Object(m)) => Ok(Some(m)),
                _ => Err(self.err(name, "not a JSON object")),
            },
            Some(other) => Err(self.err(name, format!("not a JSON object: {other}"))),
        }
    }

    /// An array parameter given as an array or as a JSON string.
    pub fn array(&self, name: &str) -> Result<Option<Vec<Value>>, ParamError> {
        match self.get(name) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a.clone())),
            Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                Ok(Value::Array(a)) => Ok(Some(a)),
                _ => Err(self.err(name, "not a JSON array")),
            },
            Some(other) => Err(self.err(name, format!("not a JSON array: {other}"))),
        }
    }

    /// A map of strings given as an object or as a JSON string.
    pub fn string_map(&self, name: &str) -> Result<Vec<(String, String)>, ParamError> {
        Ok(self
            .object(name)?
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| match v {
                Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coerces_like_go() {
        let map: Map<String, Value> = serde_json::from_str(
            r#"{"s":"x","n":2.5,"ns":"3.5","i":4,"is":"5","f":6.0,"d":"1m30s","e":"","o":"{\"a\":1}","a":"[1,2]","b":true}"#,
        )
        .unwrap();
        let p = Params::new("test", &map);
        assert_eq!(p.string("s").as_deref(), Some("x"));
        assert_eq!(p.string("b").as_deref(), Some("true"));
        assert_eq!(p.string("e"), None, "empty string means default");
        assert_eq!(p.float("n").unwrap(), Some(2.5));
        assert_eq!(p.float("ns").unwrap(), Some(3.5));
        assert_eq!(p.int("i").unwrap(), Some(4));
        assert_eq!(p.int("is").unwrap(), Some(5));
        assert_eq!(p.int("f").unwrap(), Some(6));
        assert!(p.int("n").is_err());
        assert_eq!(
            p.duration_or("d", Duration::ZERO).unwrap(),
            Duration::from_secs(90)
        );
        assert_eq!(p.object("o").unwrap().unwrap()["a"], 1);
        assert_eq!(p.array("a").unwrap().unwrap().len(), 2);
        let e = p.required_string("missing").unwrap_err().to_string();
        assert_eq!(e, "gate test: parameter missing: required");
    }
}
