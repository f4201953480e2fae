//! The front door's Redis keys and channel. They carry the Batch API's hash tag
//! (`{inferq-batch}`), so on a Redis Cluster they share its slot and every Lua move stays in
//! one slot; the request queues' keys are elsewhere, as for any producer.
//!
//! ```text
//!   {inferq-batch}:req:<id>              hash: a request's tenant, queue, times, status, ending
//!   {inferq-batch}:res:<id>              string: its result (a Go ResultMessage), for the retention
//!   {inferq-batch}:idem:<tenant>:<sha>   string: "<id> <body digest>" of an Idempotency-Key
//!   {inferq-batch}:front:results         list: where processors push front-door results
//!   {inferq-batch}:front:done            channel: the id of each request that just ended
//! ```

use sha2::{Digest, Sha256};

use crate::keys::PREFIX;

/// The record of a request.
pub fn request(id: &str) -> String {
    format!("{PREFIX}:req:{id}")
}

/// The result of a request, once it has one.
pub fn result(id: &str) -> String {
    format!("{PREFIX}:res:{id}")
}

/// The key an `Idempotency-Key` of `tenant` is kept under (the key itself is hashed, so any
/// bytes a client sends make a safe name of fixed length).
pub fn idempotency(tenant: &str, key: &str) -> String {
    format!(
        "{PREFIX}:idem:{tenant}:{}",
        hex(&Sha256::digest(key.as_bytes()))
    )
}

/// The result list every front-door request names as its route.
pub fn results() -> String {
    format!("{PREFIX}:front:results")
}

/// The channel `collect-1.lua` and `cancel-2.lua` announce ended requests on.
pub fn done_channel() -> String {
    format!("{PREFIX}:front:done")
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest idempotency compares bodies by: the endpoint and the body's bytes.
pub fn body_digest(endpoint: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(endpoint.as_bytes());
    h.update([0]);
    h.update(body);
    hex(&h.finalize())
}
