//! pending -> claimed: reading the head of the queue ([`Queue::peek`]), claiming members under
//! a lease ([`Queue::claim`]), keeping the lease ([`Queue::renew`]) and reading what a fence
//! holds ([`Queue::claimed`]).
//!
//! Members and their decoded envelopes come in; [`Claimed`] verdicts go out, each held one with
//! the [`Fence`] that lets the caller move it again.

use super::reply::{bad_reply, int_array};
use super::{ms, Fence, Queue, QueueError};
use inferq_client::keys::{cancel_key, claim_key, fresh_token};
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::Envelope;

/// Most members claimed per script call (Lua's `unpack` takes a few thousand values at most).
pub const TAKE_CHUNK: usize = 500;

/// Most bytes of members claimed per script call (a bigger single member goes alone): the
/// script holds its arguments several times over while it runs, and Redis serves no other
/// client meanwhile.
pub const TAKE_CHUNK_BYTES: usize = 16 << 20;

/// A member seen at the head of the queue, not yet claimed.
#[derive(Debug, Clone)]
pub struct Peeked {
    pub member: Vec<u8>,
    pub score: f64,
}

/// A generation this instance holds under a lease.
#[derive(Debug, Clone)]
pub struct Held {
    pub fence: Fence,
    pub envelope: Envelope,
    /// The producer had cancelled this generation when it was claimed: finish it as
    /// `CANCELLED` without sending it.
    pub cancelled: bool,
}

/// What `claim` did with one member.
#[derive(Debug)]
pub enum Claimed {
    Held(Box<Held>),
    /// No longer pending: another instance claimed it, or it was removed.
    Gone,
    /// The same generation is already claimed; the stray pending copy was removed.
    Duplicate,
}

impl Queue {
    /// The member held under `fence` and the lease expiries its generation has gone through,
    /// read without moving anything; `None` once the claim names another owner token (or none).
    /// Not one atomic step, and need not be: an owner token is never reused, so a claim that is
    /// still ours at a later fenced move was ours, with this member, all along.
    pub async fn claimed(&self, fence: &Fence) -> Result<Option<(Vec<u8>, u32)>, QueueError> {
        let mut con = self.con.clone();
        let (owner, member, deliveries): (Option<String>, Option<Vec<u8>>, Option<u32>) =
            redis::pipe()
                .hget(&self.keys.owners, &fence.key)
                .hget(&self.keys.claimed, &fence.key)
                .hget(&self.keys.deliveries, &fence.key)
                .query_async(&mut con)
                .await?;
        Ok(match (owner, member) {
            (Some(owner), Some(member)) if owner == fence.token => {
                Some((member, deliveries.unwrap_or(0)))
            }
            _ => None,
        })
    }

    /// The `n` members with the earliest deadlines, without taking them.
    pub async fn peek(&self, n: usize) -> Result<Vec<Peeked>, QueueError> {
        self.peek_from(0, n).await
    }

    /// The `n` members from rank `start` on (0: the earliest deadline), without taking them.
    pub async fn peek_from(&self, start: usize, n: usize) -> Result<Vec<Peeked>, QueueError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let mut con = self.con.clone();
        let rows: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
            .arg(&self.keys.pending)
            .arg(start)
            .arg(start + n - 1)
            .arg("WITHSCORES")
            .query_async(&mut con)
            .await?;
        Ok(rows
            .into_iter()
            .map(|(member, score)| Peeked { member, score })
            .collect())
    }

    /// Claims a batch of decoded members: pending -> claimed, checking each one's cancel
    /// marker in the same step. One script call per [`TAKE_CHUNK`] members or
    /// [`TAKE_CHUNK_BYTES`] of them, whichever comes first.
    pub async fn claim(
        &self,
        members: Vec<(Vec<u8>, Envelope)>,
    ) -> Result<Vec<Claimed>, QueueError> {
        let mut out = Vec::with_capacity(members.len());
        let mut members = members.into_iter().peekable();
        while members.peek().is_some() {
            let mut chunk: Vec<(Vec<u8>, Envelope)> =
                Vec::with_capacity(members.len().min(TAKE_CHUNK));
            let mut bytes = 0usize;
            while let Some((member, _)) = members.peek() {
                bytes = bytes.saturating_add(member.len());
                if chunk.len() == TAKE_CHUNK || (!chunk.is_empty() && bytes > TAKE_CHUNK_BYTES) {
                    break;
                }
                chunk.extend(members.next());
            }
            out.extend(self.take(chunk).await?);
        }
        Ok(out)
    }

    async fn take(&self, members: Vec<(Vec<u8>, Envelope)>) -> Result<Vec<Claimed>, QueueError> {
        if members.is_empty() {
            return Ok(Vec::new());
        }
        let fences: Vec<Fence> = members
            .iter()
            .map(|(member, env)| Fence {
                key: claim_key(&env.request.id, &env.internal.request_token, member),
                token: fresh_token(),
            })
            .collect();
        let k = &self.keys;
        let mut keys: Vec<String> = vec![
            k.pending.clone(),
            k.claimed.clone(),
            k.owners.clone(),
            k.idx.clone(),
            k.scores.clone(),
        ];
        let lease = ms(self.settings.lease).to_string();
        let mut cancel_at: Vec<String> = Vec::with_capacity(members.len());
        if self.cluster {
            // The markers live in other slots: read first, passed in as a verdict.
            let envelopes: Vec<&Envelope> = members.iter().map(|(_, env)| env).collect();
            for cancelled in self.cancelled(&envelopes).await? {
                cancel_at.push(if cancelled { "-1" } else { "0" }.to_owned());
            }
        } else {
            for (_, env) in &members {
                if env.internal.request_token.is_empty() {
                    cancel_at.push("0".to_owned());
                } else {
                    keys.push(cancel_key(&env.request.id));
                    cancel_at.push(keys.len().to_string());
                }
            }
        }
        let mut args: Vec<&[u8]> = Vec::with_capacity(1 + members.len() * 5);
        args.push(lease.as_bytes());
        for (((member, env), fence), at) in members.iter().zip(&fences).zip(&cancel_at) {
            args.push(member);
            args.push(fence.key.as_bytes());
            args.push(fence.token.as_bytes());
            args.push(at.as_bytes());
            args.push(env.internal.request_token.as_bytes());
        }
        // The command encodes the arguments, so the members are not copied again after this.
        let cmd = SCRIPTS.take.cmd(&keys, &args);
        let reply = SCRIPTS.take.run(&mut self.con.clone(), &cmd).await?;
        let statuses = int_array(&reply).ok_or_else(|| bad_reply("take", &reply))?;
        if statuses.len() != members.len() + 1 {
            return Err(bad_reply("take", &reply));
        }
        Ok(members
            .into_iter()
            .zip(fences)
            .zip(statuses.into_iter().skip(1))
            .map(|(((_, envelope), fence), status)| match status {
                1 | 2 => Claimed::Held(Box::new(Held {
                    fence,
                    envelope,
                    cancelled: status == 2,
                })),
                -1 => Claimed::Duplicate,
                _ => Claimed::Gone,
            })
            .collect())
    }

    /// Renews every given claim in one call. `true` = still ours, lease extended.
    pub async fn renew(&self, fences: &[Fence]) -> Result<Vec<bool>, QueueError> {
        if fences.is_empty() {
            return Ok(Vec::new());
        }
        let mut args: Vec<&str> = Vec::with_capacity(1 + fences.len() * 2);
        let lease = ms(self.settings.lease).to_string();
        args.push(&lease);
        for f in fences {
            args.push(&f.key);
            args.push(&f.token);
        }
        let cmd = SCRIPTS
            .renew
            .cmd(&[&self.keys.owners, &self.keys.idx], &args);
        let reply = SCRIPTS.renew.run(&mut self.con.clone(), &cmd).await?;
        let statuses = int_array(&reply).ok_or_else(|| bad_reply("renew", &reply))?;
        if statuses.len() != fences.len() + 1 {
            return Err(bad_reply("renew", &reply));
        }
        Ok(statuses.into_iter().skip(1).map(|s| s == 1).collect())
    }
}
