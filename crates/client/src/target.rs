//! Where Redis is: one server, a Redis Cluster, or a primary that Redis Sentinel manages (Go's
//! transport fields `mode`, `addrs` and `master_name`), and the connections each one needs.
//!
//! In: the URL (credentials, TLS, database), the TLS files beside it and a [`Topology`]. Out: a
//! [`Target`] that opens a self-healing [`Link`] for the moves, a [`Link`] without a response
//! timeout for blocking pops, and a plain client of one node for pub/sub. A standalone target
//! hands out `redis-rs` connection managers as before; a cluster target hands out `redis-rs`
//! cluster connections, which follow `MOVED` and `ASK` and refresh their slot map by themselves;
//! a Sentinel target asks the sentinels for the primary and asks again whenever the primary it
//! had stops serving (see [`crate::Primary`]).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, MultiplexedConnection};
#[cfg(feature = "cluster")]
use redis::cluster::ClusterClient;
use redis::{Client, Cmd, IntoConnectionInfo, Pipeline, RedisFuture, RedisResult, Value};

use crate::settings::ReplicaWait;

#[cfg(feature = "cluster")]
use crate::cluster::Cluster;
use crate::connect::{self, ConnectError, RedisTls, RESPONSE_TIMEOUT};
#[cfg(feature = "sentinel")]
use crate::sentinel::Primary;

/// How the Redis behind a URL is deployed (Go's `mode`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Topology {
    /// One server (or a primary with replicas that nobody fails over automatically).
    #[default]
    Standalone,
    /// A Redis Cluster. The URL's host and `addrs` are seed nodes; the slot map is learned from
    /// them.
    Cluster {
        /// More seed nodes (`host:port`) beside the URL's host.
        addrs: Vec<String>,
    },
    /// A primary that Redis Sentinel watches. The URL's host and `addrs` are sentinels; the
    /// primary is the one they name `master_name`.
    Sentinel {
        /// More sentinels (`host:port`) beside the URL's host.
        addrs: Vec<String>,
        /// The name the sentinels monitor the primary under.
        master_name: String,
    },
}

impl Topology {
    /// The `mode` Go writes for this topology.
    pub fn mode(&self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::Cluster { .. } => "cluster",
            Topology::Sentinel { .. } => "sentinel",
        }
    }

    /// Whether keys must be hash-tagged (see [`crate::keys::slot_key`]).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster { .. })
    }
}

/// A Redis deployment to connect to: its URL, TLS files and topology. Cheap to clone.
#[derive(Clone)]
pub struct Target {
    /// The client of the URL itself: the standalone server, the first seed node, or the first
    /// sentinel. It also carries the credentials, database and TLS every other node gets.
    client: Client,
    url: String,
    tls: RedisTls,
    topology: Topology,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("url", &crate::redact::redact_url(&self.url))
            .field("topology", &self.topology)
            .finish()
    }
}

impl Target {
    /// A target for `url` (checked by `config::check_redis_url`), its TLS files and topology.
    /// Nothing is connected yet.
    pub fn new(url: &str, tls: &RedisTls, topology: Topology) -> Result<Target, ConnectError> {
        let client = connect::client(url, tls)?;
        Ok(Target {
            client,
            url: url.to_owned(),
            tls: tls.clone(),
            topology,
        })
    }

    /// A standalone target for `url` without TLS files.
    pub fn standalone(url: &str) -> Result<Target, ConnectError> {
        Target::new(url, &RedisTls::default(), Topology::Standalone)
    }

    /// How the Redis is deployed.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Whether it is a Redis Cluster (keys must then be hash-tagged).
    pub fn is_cluster(&self) -> bool {
        self.topology.is_cluster()
    }

    /// The URL's own client (see the field).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The URL with its password hidden, for logs.
    pub fn redacted(&self) -> String {
        crate::redact::redact_url(&self.url)
    }

    #[cfg(feature = "sentinel")]
    pub(super) fn tls(&self) -> &RedisTls {
        &self.tls
    }

    /// The clients of every node named: the URL's host, then `addrs`, each with the URL's
    /// credentials, database and TLS.
    pub(super) fn named_clients(&self, addrs: &[String]) -> Result<Vec<Client>, ConnectError> {
        let mut clients = vec![self.client.clone()];
        for addr in addrs {
            clients.push(connect::client(&self.url_at(addr), &self.tls)?);
        }
        Ok(clients)
    }

    /// The sentinels' URLs: the URL's host, then `addrs`, with the URL's scheme and
    /// credentials but no database (a sentinel has none to select).
    #[cfg(feature = "sentinel")]
    pub(super) fn sentinel_urls(&self, addrs: &[String]) -> Vec<String> {
        let mut urls = vec![self.url.clone()];
        urls.extend(addrs.iter().map(|a| self.url_at(a)));
        urls.into_iter()
            .map(|u| match url::Url::parse(&u) {
                Ok(mut parsed) => {
                    parsed.set_path("");
                    parsed.set_query(None);
                    parsed.to_string()
                }
                Err(_) => u,
            })
            .collect()
    }

    /// The URL with its host and port replaced by `addr` (`host:port`).
    pub(super) fn url_at(&self, addr: &str) -> String {
        match url::Url::parse(&self.url) {
            Ok(mut parsed) => {
                let (host, port) = split_addr(addr);
                let _ = parsed.set_host(Some(host));
                let _ = parsed.set_port(port);
                parsed.to_string()
            }
            Err(_) => self.url.clone(),
        }
    }

    /// A self-healing connection for the moves: commands time out after
    /// [`RESPONSE_TIMEOUT`], and the connection reconnects (a cluster: to whichever node now
    /// serves a slot; Sentinel: to whichever primary the sentinels now name).
    pub async fn connect(&self) -> Result<Link, LinkError> {
        self.open(Some(RESPONSE_TIMEOUT)).await
    }

    /// A connection for blocking pops (`BRPOP`, `BLMOVE`): no response timeout, the command's
    /// own timeout rules.
    pub async fn blocking(&self) -> Result<Link, LinkError> {
        self.open(None).await
    }

    async fn open(&self, response_timeout: Option<Duration>) -> Result<Link, LinkError> {
        match &self.topology {
            Topology::Standalone => Ok(match response_timeout {
                Some(_) => Link::Single(connect::manager(&self.client).await?),
                None => Link::Blocking(connect::blocking(&self.client).await?),
            }),
            #[cfg(feature = "cluster")]
            Topology::Cluster { addrs } => {
                let client = self.cluster_client(addrs, response_timeout)?;
                Ok(Link::Cluster(Cluster::connect(client).await?))
            }
            #[cfg(not(feature = "cluster"))]
            Topology::Cluster { .. } => Err(LinkError::NotBuilt("cluster")),
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { addrs, master_name } => {
                let sentinels = self.sentinel_urls(addrs);
                let primary =
                    Primary::find(self.clone(), sentinels, master_name, response_timeout).await?;
                Ok(Link::Sentinel(primary))
            }
            #[cfg(not(feature = "sentinel"))]
            Topology::Sentinel { .. } => Err(LinkError::NotBuilt("sentinel")),
        }
    }

    #[cfg(feature = "cluster")]
    fn cluster_client(
        &self,
        addrs: &[String],
        response_timeout: Option<Duration>,
    ) -> Result<ClusterClient, LinkError> {
        let mut seeds = vec![self.url.clone()];
        seeds.extend(addrs.iter().map(|a| self.url_at(a)));
        let infos = seeds
            .iter()
            .map(|s| s.as_str().into_connection_info())
            .collect::<Result<Vec<_>, _>>()?;
        let mut builder = ClusterClient::builder(infos)
            .connection_timeout(Duration::from_secs(2))
            // MOVED, ASK, TRYAGAIN and CLUSTERDOWN are retried inside the connection this
            // often (with a slot-map refresh); what still fails goes back to the caller, which
            // keeps what it holds and tries again.
            .retries(6)
            .min_retry_wait(50)
            .max_retry_wait(1_000);
        builder = match response_timeout {
            Some(t) => builder.response_timeout(t),
            None => builder.response_timeout(Duration::from_secs(24 * 3600)),
        };
        #[cfg(feature = "tls")]
        if let Some(certs) = connect::tls_certificates(&self.client, &self.tls)? {
            builder = builder.certs(certs);
        }
        Ok(builder.build()?)
    }

    /// A client of one node, for pub/sub: the standalone server, the current primary of a
    /// Sentinel target, or the first seed of a cluster that answers (a cluster delivers every
    /// `PUBLISH` on every node).
    pub async fn node_client(&self) -> Result<Client, LinkError> {
        match &self.topology {
            Topology::Standalone => Ok(self.client.clone()),
            Topology::Cluster { addrs } => {
                let clients = self.named_clients(addrs)?;
                let mut last = None;
                for client in clients {
                    match client.get_multiplexed_async_connection().await {
                        Ok(_) => return Ok(client),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.map_or(LinkError::NoNode, LinkError::Redis))
            }
            #[cfg(feature = "sentinel")]
            Topology::Sentinel { addrs, master_name } => {
                let sentinels = self.sentinel_urls(addrs);
                crate::sentinel::primary_client(self, &sentinels, master_name).await
            }
            #[cfg(not(feature = "sentinel"))]
            Topology::Sentinel { .. } => Err(LinkError::NotBuilt("sentinel")),
        }
    }
}

/// `host:port` split; a bare host gets no port (the URL's stays).
fn split_addr(addr: &str) -> (&str, Option<u16>) {
    match addr.rsplit_once(':') {
        Some((host, port)) => match port.parse() {
            Ok(port) => (
                host.trim_start_matches('[').trim_end_matches(']'),
                Some(port),
            ),
            Err(_) => (addr, None),
        },
        None => (addr, None),
    }
}

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    #[error(transparent)]
    /// The URL or TLS files cannot make a client.
    Connect(#[from] ConnectError),
    #[error("{0}")]
    /// Redis refused or failed the connection.
    Redis(#[from] redis::RedisError),
    /// No sentinel names a primary by that name.
    #[error("no sentinel knows a primary named {name:?}: {detail}")]
    NoPrimary {
        /// The primary's name.
        name: String,
        /// What the sentinels answered.
        detail: String,
    },
    #[error("no node of the cluster answers")]
    /// No seed node of the cluster answered.
    NoNode,
    /// The target needs a part this build of inferq-client left out.
    #[error("this build of inferq-client has no {0} support (its `{0}` feature is off)")]
    NotBuilt(&'static str),
}

impl LinkError {
    /// The Redis error beneath, when there is one (for `connect::explained`).
    pub fn redis(&self) -> Option<&redis::RedisError> {
        match self {
            LinkError::Redis(e) => Some(e),
            _ => None,
        }
    }
}

/// One connection to a [`Target`], whatever its topology; cheap to clone (clones share it).
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Link {
    /// A standalone server's self-healing multiplexed connection.
    Single(ConnectionManager),
    /// A standalone server's connection without a response timeout (blocking pops).
    Blocking(MultiplexedConnection),
    /// A cluster: commands go to the node serving their key's slot (a connection made afresh
    /// when it answers only with timeouts: [`crate::Cluster`]).
    #[cfg(feature = "cluster")]
    Cluster(Cluster),
    /// The primary Sentinel names now.
    #[cfg(feature = "sentinel")]
    Sentinel(Primary),
}

impl Link {
    /// Whether keys on this link must be hash-tagged.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Link::Cluster(_))
    }

    /// `WAIT`s until `wait.replicas` replicas hold every write this link sent before, or
    /// `wait.timeout` passes; returns how many do. On a cluster it goes to the primary of
    /// `key`'s slot, where those writes went. `WAIT` counts replication, not their disks: pair
    /// it with `appendonly yes` on the replicas.
    pub async fn wait_replicas(&mut self, key: &str, wait: ReplicaWait) -> RedisResult<u32> {
        let mut cmd = redis::cmd("WAIT");
        cmd.arg(wait.replicas).arg(
            u64::try_from(wait.timeout.as_millis())
                .unwrap_or(u64::MAX)
                .max(1),
        );
        let acked: i64 = match self {
            #[cfg(feature = "cluster")]
            Link::Cluster(c) => {
                use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
                let route = Route::new(crate::slot::hash_slot(key), SlotAddr::Master);
                let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
                redis::from_redis_value(c.route_command(cmd, routing).await?)?
            }
            other => cmd.query_async(other).await?,
        };
        Ok(u32::try_from(acked).unwrap_or(0))
    }
}

impl From<ConnectionManager> for Link {
    fn from(con: ConnectionManager) -> Link {
        Link::Single(con)
    }
}

impl ConnectionLike for Link {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Blocking(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Link::Cluster(c) => c.req_packed_command(cmd),
            #[cfg(feature = "sentinel")]
            Link::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Blocking(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "sentinel")]
            Link::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Link::Single(c) => c.get_db(),
            Link::Blocking(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Link::Cluster(c) => c.get_db(),
            #[cfg(feature = "sentinel")]
            Link::Sentinel(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_addr_replaces_the_urls_host_and_port_and_keeps_the_rest() {
        let t = Target::new(
            "redis://u:pw@h1:6379/0",
            &RedisTls::default(),
            Topology::Cluster { addrs: vec![] },
        )
        .unwrap();
        assert_eq!(t.url_at("h2:7001"), "redis://u:pw@h2:7001/0");
        assert_eq!(t.url_at("127.0.0.1:7002"), "redis://u:pw@127.0.0.1:7002/0");
        assert_eq!(split_addr("[::1]:7003"), ("::1", Some(7003)));
        assert_eq!(split_addr("h3"), ("h3", None));
    }
}
