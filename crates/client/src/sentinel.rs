//! The primary that Redis Sentinel names, as one connection that follows fail-overs.
//!
//! In: the sentinels' clients (the URL's host and `addrs`, with the URL's credentials and TLS)
//! and the monitored name. Out: a [`Primary`], a `ConnectionLike` that sends every command to the
//! server the sentinels name as primary now. It asks them (`SENTINEL get-master-addr-by-name`),
//! checks that the server named calls itself a primary (`ROLE`: a sentinel's view can lag a
//! fail-over), and keeps that connection until a command fails in a way that says the server
//! may no longer be the primary: a dropped or refused connection, a timeout, or `READONLY` from a
//! demoted one. That failure goes back to the caller (who keeps what it holds and retries, as on
//! any Redis outage); the next command asks the sentinels again.
//!
//! Written here rather than with `redis::sentinel`, which finds a primary but neither follows a
//! fail-over on a live connection nor takes our TLS trust roots and client certificates as one
//! [`crate::connect::RedisTls`], nor falls back to asking a sentinel without the URL's
//! credentials when the sentinel itself has none (the usual set-up: an ACL on the data nodes,
//! open sentinels on a private network).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
use redis::{Client, Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::connect;
use crate::target::{LinkError, Target};

/// How long one sentinel or candidate primary may take to answer during a look-up.
const ASK_WAIT: Duration = Duration::from_secs(2);

/// The connection to the current primary; clones share it.
#[derive(Clone)]
pub struct Primary {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Primary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Primary").finish_non_exhaustive()
    }
}

struct Inner {
    target: Target,
    /// The sentinels' URLs (the data nodes' scheme and credentials, no database).
    sentinels: Vec<String>,
    master_name: String,
    /// `None`: a connection without a response timeout (blocking pops).
    response_timeout: Option<Duration>,
    /// The connection in use and its generation (bumped at every new primary), or `None` when
    /// the next command must ask the sentinels first.
    current: Mutex<(u64, Option<NodeCon>)>,
    /// Held while asking the sentinels, so concurrent failures ask once.
    finding: tokio::sync::Mutex<()>,
}

#[derive(Clone)]
enum NodeCon {
    Managed(ConnectionManager),
    Plain(MultiplexedConnection),
}

impl Primary {
    /// Asks the sentinels for `master_name` and connects to it.
    pub(super) async fn find(
        target: Target,
        sentinels: Vec<String>,
        master_name: &str,
        response_timeout: Option<Duration>,
    ) -> Result<Primary, LinkError> {
        let primary = Primary {
            inner: Arc::new(Inner {
                target,
                sentinels,
                master_name: master_name.to_owned(),
                response_timeout,
                current: Mutex::new((0, None)),
                finding: tokio::sync::Mutex::new(()),
            }),
        };
        primary.inner.connection().await?;
        Ok(primary)
    }
}

impl Inner {
    fn snapshot(&self) -> (u64, Option<NodeCon>) {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The connection to use, asking the sentinels first when there is none.
    async fn connection(&self) -> Result<(u64, NodeCon), LinkError> {
        if let (generation, Some(con)) = self.snapshot() {
            return Ok((generation, con));
        }
        let _finding = self.finding.lock().await;
        if let (generation, Some(con)) = self.snapshot() {
            return Ok((generation, con));
        }
        let client = primary_client_of(&self.target, &self.sentinels, &self.master_name).await?;
        let con = match self.response_timeout {
            Some(_) => NodeCon::Managed(connect::manager(&client).await?),
            None => NodeCon::Plain(connect::blocking(&client).await?),
        };
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        current.0 += 1;
        current.1 = Some(con.clone());
        tracing::debug!(
            master_name = %self.master_name,
            primary = ?client.get_connection_info().addr(),
            "connected to the primary Sentinel names"
        );
        Ok((current.0, con))
    }

    /// Drops connection `generation` when `answer` (a command's, or a pipeline's) says its
    /// server may not be the primary any more.
    fn judge(&self, generation: u64, answer: Result<&[Value], &RedisError>) {
        let lost = match answer {
            Err(e) => lost_primary(e),
            Ok(values) => lost_primary_in(values),
        };
        if lost {
            self.forget(generation);
        }
    }

    /// Drops connection `generation`.
    fn forget(&self, generation: u64) {
        let mut current = self.current.lock().unwrap_or_else(PoisonError::into_inner);
        if current.0 == generation {
            current.1 = None;
        }
    }
}

/// Whether `e` says the server may no longer be the primary (or is gone).
fn lost_primary(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_timeout()
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN"))
}

fn lost_primary_in(values: &[Value]) -> bool {
    values.iter().any(
        |v| matches!(v, Value::ServerError(e) if matches!(e.code(), "READONLY" | "MASTERDOWN")),
    )
}

fn link_failure(e: LinkError) -> RedisError {
    match e {
        LinkError::Redis(e) => e,
        other => RedisError::from((
            redis::ErrorKind::Io,
            "no primary",
            crate::redact::redact_in_text(&other.to_string()),
        )),
    }
}

impl ConnectionLike for Primary {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, con) = self.inner.connection().await.map_err(link_failure)?;
            let answer = match con {
                NodeCon::Managed(mut c) => c.req_packed_command(cmd).await,
                NodeCon::Plain(mut c) => c.req_packed_command(cmd).await,
            };
            self.inner
                .judge(generation, answer.as_ref().map(std::slice::from_ref));
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
            let (generation, con) = self.inner.connection().await.map_err(link_failure)?;
            let answer = match con {
                NodeCon::Managed(mut c) => c.req_packed_commands(pipeline, offset, count).await,
                NodeCon::Plain(mut c) => c.req_packed_commands(pipeline, offset, count).await,
            };
            self.inner
                .judge(generation, answer.as_ref().map(Vec::as_slice));
            answer
        })
    }

    fn get_db(&self) -> i64 {
        self.inner
            .target
            .client()
            .get_connection_info()
            .redis_settings()
            .db()
    }
}

/// A client of the server the sentinels name `master_name` now (checked with `ROLE`).
pub(super) async fn primary_client(
    target: &Target,
    sentinels: &[String],
    master_name: &str,
) -> Result<Client, LinkError> {
    primary_client_of(target, sentinels, master_name).await
}

async fn primary_client_of(
    target: &Target,
    sentinels: &[String],
    master_name: &str,
) -> Result<Client, LinkError> {
    let mut why = Vec::new();
    for sentinel in sentinels {
        let shown = format!("sentinel {}", crate::redact::redact_url(sentinel));
        let addr = match ask_sentinel(target, sentinel, master_name).await {
            Ok(Some(addr)) => addr,
            Ok(None) => {
                why.push(format!("{shown}: does not monitor it"));
                continue;
            }
            Err(e) => {
                why.push(format!("{shown}: {e}"));
                continue;
            }
        };
        let client = connect::client(&target.url_at(&addr), target.tls())?;
        match is_primary(&client).await {
            Ok(true) => return Ok(client),
            Ok(false) => why.push(format!("{addr}: named primary but is not (yet) one")),
            Err(e) => why.push(format!(
                "{addr}: {}",
                crate::redact::redact_in_text(&e.to_string())
            )),
        }
    }
    Err(LinkError::NoPrimary {
        name: master_name.to_owned(),
        detail: why.join("; "),
    })
}

/// The primary's `host:port` as the sentinel at `url` sees it (`None`: it monitors no such
/// name). A sentinel that refuses the URL's credentials (it has none, or other ones) is asked
/// again without them. The error text never holds a password.
async fn ask_sentinel(
    target: &Target,
    url: &str,
    master_name: &str,
) -> Result<Option<String>, LinkError> {
    let with_credentials = connect::client(url, target.tls())?;
    match ask_once(&with_credentials, master_name).await {
        Err(e) if is_auth_refusal(&e) => {
            let bare = connect::client(&without_credentials(url), target.tls())?;
            Ok(ask_once(&bare, master_name).await?)
        }
        other => Ok(other?),
    }
}

/// `url` without its user and password.
fn without_credentials(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            let _ = parsed.set_username("");
            let _ = parsed.set_password(None);
            parsed.to_string()
        }
        Err(_) => url.to_owned(),
    }
}

async fn ask_once(sentinel: &Client, master_name: &str) -> RedisResult<Option<String>> {
    let asking = async {
        let mut con = sentinel.get_multiplexed_async_connection().await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(master_name)
            .query_async(&mut con)
            .await?;
        Ok(addr.map(|(host, port)| {
            if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            }
        }))
    };
    tokio::time::timeout(ASK_WAIT, asking)
        .await
        .map_err(|_| RedisError::from((redis::ErrorKind::Io, "sentinel did not answer in time")))?
}

fn is_auth_refusal(e: &RedisError) -> bool {
    matches!(e.code(), Some("WRONGPASS" | "NOAUTH" | "NOPERM"))
        || e.to_string().contains("without any password configured")
        || e.kind() == redis::ErrorKind::AuthenticationFailed
}

/// Whether the server behind `client` says it is a primary (`ROLE`'s first word `master`).
async fn is_primary(client: &Client) -> RedisResult<bool> {
    let asking = async {
        let mut con = client.get_multiplexed_async_connection().await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut con).await?;
        Ok(
            matches!(role.first(), Some(Value::BulkString(b)) if b == b"master")
                || matches!(role.first(), Some(Value::SimpleString(s)) if s == "master"),
        )
    };
    tokio::time::timeout(ASK_WAIT, asking)
        .await
        .map_err(|_| RedisError::from((redis::ErrorKind::Io, "no answer to ROLE in time")))?
}
