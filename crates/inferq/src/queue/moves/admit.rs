//! channel -> pending: [`Queue::admit`] queues the messages that arrived by pub/sub (Go's
//! redis-pubsub transport), each once however many instances received it.

use redis::Value;

use super::reply::bad_reply;
use super::{Queue, QueueError};
use inferq_client::scripts::SCRIPTS;

/// Seconds an admitted message's marker outlives its deadline (see `admit-1.lua`): far longer
/// than pub/sub takes to hand one message to every subscriber.
const ADMIT_MARGIN_S: u64 = 600;
/// Longest an admit marker lives, whatever the deadline.
const ADMIT_LONGEST_S: u64 = 7 * 24 * 3600;

impl Queue {
    /// channel -> pending: admits messages that arrived by pub/sub, each scored by its deadline.
    /// Bytes already admitted (by this or another subscribed instance) are skipped, so a
    /// message every instance received is still queued once. Returns how many were new.
    pub async fn admit(&self, messages: &[Vec<u8>]) -> Result<usize, QueueError> {
        if messages.is_empty() {
            return Ok(0);
        }
        let mut keys = Vec::with_capacity(messages.len() + 1);
        keys.push(self.keys.pending.clone());
        keys.extend(messages.iter().map(|m| self.keys.seen(m)));
        let margin = ADMIT_MARGIN_S.to_string();
        let longest = ADMIT_LONGEST_S.to_string();
        let mut args: Vec<&[u8]> = Vec::with_capacity(messages.len() + 2);
        args.push(margin.as_bytes());
        args.push(longest.as_bytes());
        args.extend(messages.iter().map(Vec::as_slice));
        let cmd = SCRIPTS.admit.cmd(&keys, &args);
        match SCRIPTS.admit.run(&mut self.con.clone(), &cmd).await? {
            Value::Int(n) => Ok(usize::try_from(n).unwrap_or(0)),
            other => Err(bad_reply("admit", &other)),
        }
    }
}
