//! What can go wrong with a move: [`QueueError`], and how to tell Redis refusing a call for
//! good ([`is_refusal`]) from Redis being out of reach for now.
//!
//! Every move returns its failures as a `QueueError`; callers ask it whether Redis refused this
//! caller, refused by an ACL rule, or was lost, and decide whether repeating the call can help.

use redis::RedisError;

/// Errors of the queue layer.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("redis: {0}")]
    Redis(#[from] RedisError),
    #[error("unexpected reply from the {script} script: {detail}")]
    Reply {
        script: &'static str,
        detail: String,
    },
}

impl QueueError {
    /// Redis's own error reply, when Redis answered the call with one (`NOPERM` for a user
    /// missing a command, `READONLY` from a replica, `OOM`, `LOADING`), as opposed to being
    /// unreachable or answering something unexpected. `NOSCRIPT` is left out: the next call
    /// reloads the scripts. Wider than [`is_refusal`], which asks whether repeating could help.
    pub fn redis_refusal(&self) -> Option<&RedisError> {
        match self {
            QueueError::Redis(e) => match e.code() {
                Some("NOSCRIPT") | None => None,
                Some(_) => Some(e),
            },
            QueueError::Reply { .. } => None,
        }
    }

    /// Redis's refusal of a command to this user by its ACL rule: `NOPERM` for a command sent
    /// as is, or the error Redis 7 answers when a script calls one (`ERR The user executing the
    /// script can't run this command or subcommand`). Such a call fails the same way until the
    /// rule changes.
    pub fn acl_refusal(&self) -> Option<&RedisError> {
        self.redis_refusal().filter(|e| {
            e.code() == Some("NOPERM")
                || e.detail()
                    .is_some_and(|d| d.contains("can't run this command"))
        })
    }

    /// Whether this call failing means Redis is out of reach or unable to write for now (down,
    /// unreachable, timing out, loading, a read-only replica), so that the owners of claims
    /// could not renew them either. Not a refusal of this caller alone (`NOPERM`, a script
    /// error: see [`is_refusal`]), not `NOSCRIPT` (the next call reloads the scripts), not an
    /// unexpected reply.
    pub fn lost_redis(&self) -> bool {
        match self {
            QueueError::Redis(e) => !is_refusal(e) && e.code() != Some("NOSCRIPT"),
            QueueError::Reply { .. } => false,
        }
    }
}

/// Whether Redis refused a call for good (a script error, an ACL refusal), as opposed to the
/// transport failing or Redis being briefly unable (loading, read-only), where the reply is
/// unknown or the call is worth repeating. On a cluster, a `MOVED` or `ASK` the connection
/// did not follow in its own retries (the slot map still changing after a fail-over or a
/// migration) and a node it has no connection to are passing too: the next call lands.
pub(in crate::queue) fn is_refusal(e: &RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_timeout() {
        return false;
    }
    !matches!(
        e.kind(),
        ErrorKind::ClusterConnectionNotFound
            | ErrorKind::Server(
                S::BusyLoading
                    | S::TryAgain
                    | S::MasterDown
                    | S::ReadOnly
                    | S::ClusterDown
                    | S::NoScript
                    | S::Moved
                    | S::Ask
            )
    )
}
