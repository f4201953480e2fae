//! Bodies stored apart from their members (newer Go's payload keys): a producer may write a
//! request's body to `request-payload:<id>:<request_token>` and leave `data.payload` `null`,
//! naming the key in `internal.payload_ref`. The processor reads those bodies only for requests
//! it has claimed and will send: one `MGET` per poll on one Redis, one `GET` per key (all at
//! once) on a cluster, where each key lives in its own slot. The ack deletes the key (see
//! `finish-11.lua`); retries and dead letters keep it until its TTL, the request's deadline plus
//! ten minutes, past which a requeue is refused anyway.
//!
//! In: the refs of claimed generations. Out: each one's bytes, or `None` where the key is gone.

use futures::future::join_all;

use super::moves::{Queue, QueueError};

pub use inferq_client::keys::PAYLOAD_GRACE_MS;

impl Queue {
    /// The bodies stored at `refs`, in order: `None` for a key that does not exist.
    pub async fn payloads(&self, refs: &[&str]) -> Result<Vec<Option<Vec<u8>>>, QueueError> {
        if refs.is_empty() {
            return Ok(Vec::new());
        }
        let con = self.connection();
        if !con.is_cluster() {
            let bodies: Vec<Option<Vec<u8>>> = redis::cmd("MGET")
                .arg(refs)
                .query_async(&mut con.clone())
                .await?;
            return Ok(bodies);
        }
        let reads = refs.iter().map(|key| {
            let mut con = con.clone();
            async move {
                redis::cmd("GET")
                    .arg(*key)
                    .query_async::<Option<Vec<u8>>>(&mut con)
                    .await
            }
        });
        let mut bodies = Vec::with_capacity(refs.len());
        for read in join_all(reads).await {
            bodies.push(read?);
        }
        Ok(bodies)
    }
}
