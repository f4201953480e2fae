//! The Redis keys of the Batch API. Every key carries the hash tag `{inferq-batch}`, so on a
//! Redis Cluster all of them sit in one slot and each Lua move stays atomic; the request queue
//! and the processors' keys are elsewhere and spread as before.
//!
//! ```text
//!   {inferq-batch}:file:<file id>        hash: a File object, its tenant and the batch using it
//!   {inferq-batch}:files:<tenant>        zset: the tenant's files by creation time (ms)
//!   {inferq-batch}:batch:<batch id>      hash: a Batch object, its tenant, cursors and ending
//!   {inferq-batch}:batches:<tenant>      zset: the tenant's batches by creation time (ms)
//!   {inferq-batch}:live                  zset: batches not ended -> when a steward is due (ms)
//!   {inferq-batch}:lease:<batch id>      string: the steward holding the batch, with a TTL
//!   {inferq-batch}:out:<batch id>        hash: line -> its result, until the files are written
//!   {inferq-batch}:results               list: where processors push batch results
//!   {inferq-batch}:counts                hash: status -> batches in it
//!   {inferq-batch}:enqueued              hash: tenant -> its batch lines not yet finished
//!   {inferq-batch}:expiries              zset: file or ended batch id -> when it is removed (s)
//!   {inferq-batch}:tenant-ingested       hash: tenant -> lines submitted to the queue, ever
//!   {inferq-batch}:tenant-done           hash: tenant -> results filed, ever
//! ```
//!
//! With `--queue-per-tenant` a tenant's lines wait in a queue of its own, outside the tag
//! (`inferq-tenant:<tenant>`, spread over the slots), listed in an index of queues with work
//! (see [`crate::tenants`]).

/// The hash tag and prefix of every key.
pub const PREFIX: &str = "{inferq-batch}";

/// The result list batch requests are routed to.
pub fn results() -> String {
    format!("{PREFIX}:results")
}

pub fn live() -> String {
    format!("{PREFIX}:live")
}

pub fn counts() -> String {
    format!("{PREFIX}:counts")
}

pub fn enqueued() -> String {
    format!("{PREFIX}:enqueued")
}

pub fn expiries() -> String {
    format!("{PREFIX}:expiries")
}

pub fn tenant_ingested() -> String {
    format!("{PREFIX}:tenant-ingested")
}

pub fn tenant_done() -> String {
    format!("{PREFIX}:tenant-done")
}

pub fn file(id: &str) -> String {
    format!("{PREFIX}:file:{id}")
}

pub fn files(tenant: &str) -> String {
    format!("{PREFIX}:files:{tenant}")
}

pub fn batch(id: &str) -> String {
    format!("{PREFIX}:batch:{id}")
}

pub fn batches(tenant: &str) -> String {
    format!("{PREFIX}:batches:{tenant}")
}

pub fn lease(id: &str) -> String {
    format!("{PREFIX}:lease:{id}")
}

pub fn out(id: &str) -> String {
    format!("{PREFIX}:out:{id}")
}
