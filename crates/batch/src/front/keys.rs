//! The router's Redis layout, which the front door writes and reads so that a client of the
//! router's `async-broker` step and a client of inferq's front door are served alike, over the
//! same keys, by inferq or Go processors:
//!
//! ```text
//!   <queue>                              zset: the member (score: the deadline), as Go v0.9.0
//!   request-active:<tenant>:<id>         string: the generation's token, TTL to the deadline
//!   request-cancel:<tenant>:<id>         string: a cancelled generation's token (7 days)
//!   results:req:<tenant>:<id>            list: the mailbox, one result (LPUSHed by the processor)
//!   inferq-front:join:<tenant>:<id>      string: "<body digest> <token> <unix ms>" (inferq's own)
//! ```
//!
//! None carries a hash tag (the router's names have none), so on a Redis Cluster each lives in
//! a slot of its own: the front door writes them one command at a time in an order that never
//! shows a processor a member without its marker, and every script it runs touches one key.

use sha2::{Digest, Sha256};

/// The tenant of a request with no tenant header.
pub const DEFAULT_TENANT: &str = "default";
/// What every mailbox starts with.
pub const MAILBOX_PREFIX: &str = "results:req:";
/// What every join key starts with.
pub const JOIN_PREFIX: &str = "inferq-front:join:";

/// The envelope id: `<tenant>:<id>` (the processors' markers are named by it).
pub fn envelope(tenant: &str, id: &str) -> String {
    format!("{tenant}:{id}")
}

/// The mailbox the processor pushes the request's result onto.
pub fn mailbox(tenant: &str, id: &str) -> String {
    format!("{MAILBOX_PREFIX}{tenant}:{id}")
}

/// The generation marker (Go's `request-active:`).
pub fn active(tenant: &str, id: &str) -> String {
    inferq_client::keys::active_key(&envelope(tenant, id))
}

/// The cancel marker (Go's `request-cancel:`).
pub fn cancel(tenant: &str, id: &str) -> String {
    inferq_client::keys::cancel_key(&envelope(tenant, id))
}

/// What makes a repeated id join its request: its body's digest, token and time.
pub fn join(tenant: &str, id: &str) -> String {
    format!("{JOIN_PREFIX}{tenant}:{id}")
}

/// Whether `id` is an id a client may choose: letters, digits and `-`, 1 to 128 of them (the
/// step's rule; any other is replaced by a minted one).
pub fn is_client_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 128 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A minted id: a random UUID (version 4), as the router mints.
pub fn mint_id() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let h = hex(&b);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The digest a repeated id compares bodies by: the endpoint and the body's bytes.
pub fn body_digest(endpoint: &str, body: &[u8]) -> String {
    let mut h = Sha256::new();
    h.update(endpoint.as_bytes());
    h.update([0]);
    h.update(body);
    hex(&h.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_the_routers() {
        assert_eq!(mailbox("acme", "job-1"), "results:req:acme:job-1");
        assert_eq!(active("acme", "job-1"), "request-active:acme:job-1");
        assert_eq!(cancel("acme", "job-1"), "request-cancel:acme:job-1");
        assert!(is_client_id("job-4217"));
        for bad in ["", "a b", "a:b", "é", &"x".repeat(129)] {
            assert!(!is_client_id(bad), "{bad:?}");
        }
        let m = mint_id();
        assert!(is_client_id(&m) && m.len() == 36, "{m}");
    }
}
