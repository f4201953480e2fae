//! The pub/sub plumbing the wake-up listener ([`super::doorbell`]) and the redis-pubsub ingress
//! ([`super::ingress`]) share: subscribing to a set of channels, and reading messages, each
//! without holding up a shutdown (a Redis that stops answering holds up `SUBSCRIBE` and reads
//! for as long as it does).

use futures::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;

/// Why a subscription could not be made.
#[derive(Debug)]
pub struct Failed {
    pub error: redis::RedisError,
    /// The connection was made and then cut before every `SUBSCRIBE` was answered: Redis closed
    /// it (an output buffer overflowed by a burst, a `CLIENT KILL`), rather than refused it.
    pub cut: bool,
}

/// A pub/sub connection subscribed to every channel in `channels`; `None` once `stop` is
/// cancelled. The node is asked of `target` at every subscription: the primary Sentinel names
/// now, or a cluster node that answers.
pub async fn subscribe<'a>(
    target: &inferq_client::target::Target,
    channels: impl IntoIterator<Item = &'a [u8]>,
    stop: &CancellationToken,
) -> Option<Result<redis::aio::PubSub, Failed>> {
    let not_cut = |error| Failed { error, cut: false };
    let subscribing = async {
        let client = target.node_client().await.map_err(|e| match e {
            inferq_client::target::LinkError::Redis(e) => not_cut(e),
            other => not_cut(redis::RedisError::from((
                redis::ErrorKind::Io,
                "no node to subscribe on",
                crate::config::redact_in_text(&other.to_string()),
            ))),
        })?;
        let mut pubsub = client.get_async_pubsub().await.map_err(not_cut)?;
        for channel in channels {
            pubsub.subscribe(channel).await.map_err(|error| Failed {
                cut: error.is_connection_dropped(),
                error,
            })?;
        }
        Ok(pubsub)
    };
    tokio::select! {
        biased;
        _ = stop.cancelled() => None,
        s = subscribing => Some(s),
    }
}

/// What reading the next message came to.
#[derive(Debug)]
pub enum Next {
    Message(redis::Msg),
    /// The connection is gone: subscribe again.
    Lost,
    /// `stop` was cancelled.
    Stopped,
}

/// The next message of `messages`, unless `stop` comes first.
pub async fn next(
    messages: &mut (impl Stream<Item = redis::Msg> + Unpin),
    stop: &CancellationToken,
) -> Next {
    tokio::select! {
        biased;
        _ = stop.cancelled() => Next::Stopped,
        m = messages.next() => m.map_or(Next::Lost, Next::Message),
    }
}
