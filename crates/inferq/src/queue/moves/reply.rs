//! Decoding the replies of the Lua scripts: the shapes every move's reply is built from
//! (arrays of integers, bulk strings), and the error a reply of any other shape becomes.

use redis::Value;

use super::QueueError;

pub(super) fn bad_reply(script: &'static str, v: &Value) -> QueueError {
    QueueError::Reply {
        script,
        detail: format!("{v:?}"),
    }
}

pub(super) fn int_array(v: &Value) -> Option<Vec<i64>> {
    match v {
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::Int(n) => Some(*n),
                _ => None,
            })
            .collect(),
        _ => None,
    }
}

pub(super) fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}
