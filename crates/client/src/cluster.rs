//! A Redis Cluster as one connection that starts afresh when it has stopped answering.
//!
//! In: a built `ClusterClient` (seeds, timeouts, TLS: see [`crate::target`]). Out: [`Cluster`],
//! a `ConnectionLike` whose commands go to the node serving their key's slot, as redis-rs's
//! own cluster connection sends them. Every answer is judged: when nothing but timeouts has
//! come back for [`STUCK_AFTER`], the connection is dropped and a new one is made from the
//! seeds. The timeouts themselves still go back to the caller, who keeps what it holds and
//! retries, as on any Redis outage.
//!
//! Written here because redis-rs 1.8's cluster connection can wedge for good: a slot-map
//! refresh that began while a node was down (a master killed, its replica promoted, then a
//! manual fail-over) never finishes, and every command after it times out, for as long as the
//! process lives. A new connection has none of that state; the old one ends with its last
//! clone.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::ConnectionLike;
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::RoutingInfo;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

/// How long only timeouts may come back before the connection is made again. A fail-over
/// takes a few seconds of timeouts by itself; a new connection then is harmless, if early.
pub const STUCK_AFTER: Duration = Duration::from_secs(10);

/// How long making the new connection may take.
const REMAKE_WAIT: Duration = Duration::from_secs(10);

/// The connection to the cluster; clones share it (and its replacement).
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").finish_non_exhaustive()
    }
}

struct Inner {
    client: ClusterClient,
    stuck_after: Duration,
    state: Mutex<State>,
    /// Held while a new connection is made, so a burst of timeouts makes one.
    remaking: tokio::sync::Mutex<()>,
}

struct State {
    /// Bumped at every new connection, so a late answer of an old one judges nothing.
    generation: u64,
    con: ClusterConnection,
    /// When the first of an unbroken run of timeouts came back (`None`: the last answer was
    /// not a timeout).
    timeouts_since: Option<Instant>,
}

impl Cluster {
    /// Connects through `client`'s seeds.
    pub async fn connect(client: ClusterClient) -> RedisResult<Cluster> {
        Cluster::connect_with(client, STUCK_AFTER).await
    }

    /// As [`Cluster::connect`], starting afresh after `stuck_after` of timeouts.
    pub async fn connect_with(
        client: ClusterClient,
        stuck_after: Duration,
    ) -> RedisResult<Cluster> {
        let con = client.get_async_connection().await?;
        Ok(Cluster {
            inner: Arc::new(Inner {
                client,
                stuck_after,
                state: Mutex::new(State {
                    generation: 0,
                    con,
                    timeouts_since: None,
                }),
                remaking: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// How many connections were made after the first (for tests and logs).
    pub fn remakes(&self) -> u64 {
        self.inner.lock().generation
    }

    /// Sends `cmd` where `routing` says (one node, all primaries, …).
    pub async fn route_command(&self, cmd: Cmd, routing: RoutingInfo) -> RedisResult<Value> {
        let (generation, mut con) = self.inner.current();
        let answer = con.route_command(cmd, routing).await;
        self.inner.judge(generation, answer.as_ref().err()).await;
        answer
    }
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn current(&self) -> (u64, ClusterConnection) {
        let state = self.lock();
        (state.generation, state.con.clone())
    }

    /// Notes an answer of connection `generation`; makes a new connection when only timeouts
    /// have come back for `stuck_after`.
    async fn judge(&self, generation: u64, error: Option<&RedisError>) {
        let stuck = {
            let mut state = self.lock();
            if state.generation != generation {
                return;
            }
            match error {
                Some(e) if e.is_timeout() => {
                    let since = *state.timeouts_since.get_or_insert_with(Instant::now);
                    since.elapsed() >= self.stuck_after
                }
                _ => {
                    state.timeouts_since = None;
                    false
                }
            }
        };
        if stuck {
            self.remake(generation).await;
        }
    }

    /// Replaces connection `generation` with a new one from the seeds (once, however many
    /// callers ask). When that fails the old one stays, and the next run of timeouts tries again.
    async fn remake(&self, generation: u64) {
        let Ok(_remaking) = self.remaking.try_lock() else {
            return;
        };
        if self.lock().generation != generation {
            return;
        }
        let made = tokio::time::timeout(REMAKE_WAIT, self.client.get_async_connection()).await;
        let mut state = self.lock();
        match made {
            Ok(Ok(con)) => {
                state.generation += 1;
                state.con = con;
                state.timeouts_since = None;
                tracing::warn!(
                    stuck_for = ?self.stuck_after,
                    "the cluster connection answered only with timeouts; made a new one from the seeds"
                );
            }
            Ok(Err(e)) => {
                state.timeouts_since = Some(Instant::now());
                tracing::warn!(error = %crate::redact::redact_in_text(&e.to_string()),
                    "the cluster connection answers only with timeouts, and a new one could not be made yet");
            }
            Err(_) => {
                state.timeouts_since = Some(Instant::now());
                tracing::warn!(
                    "the cluster connection answers only with timeouts, and a new one took too long to make"
                );
            }
        }
    }
}

impl ConnectionLike for Cluster {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut con) = self.inner.current();
            let answer = con.req_packed_command(cmd).await;
            self.inner.judge(generation, answer.as_ref().err()).await;
            answer
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut con) = self.inner.current();
            let answer = con.req_packed_commands(pipeline, offset, count).await;
            self.inner.judge(generation, answer.as_ref().err()).await;
            answer
        })
    }

    fn get_db(&self) -> i64 {
        0
    }
}
