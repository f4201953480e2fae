//! A real Redis Cluster for tests: N masters with R replicas each (3 × 1 = 6 nodes by default),
//! each a `redis-server --cluster-enabled yes` child process with AOF on, its own temporary data
//! directory (holding its `nodes.conf` and `redis.log`) and a free loopback port whose cluster
//! bus port (port + 10000) is free too. The fixture drives the cluster through the faults a
//! product test needs: a killed master and its failover, a manual failover, slot migrations
//! (whole, or stopped half-way so clients get `ASK` redirects) and restarted nodes.
//!
//! Data enters as [`ClusterOptions`] and as calls naming nodes by port and slots by number; it
//! leaves as seed URLs and addresses for a cluster client, node info read from `CLUSTER NODES`,
//! and [`TestkitError`]s that carry the tails of the nodes' logs. The cluster is created with
//! `redis-cli --cluster create` (so `redis-cli`, Debian's `redis-tools`, must be installed, and
//! there must be at least 3 masters); every call that changes the topology returns only once
//! every live node says `cluster_state:ok` with all 16384 slots served, every live node agrees on
//! which master serves which slot, and every live replica's link to its master is up.
//!
//! ```text
//! RedisCluster::start() -> Result<RedisCluster, TestkitError>                  // 3 masters × 1 replica
//! RedisCluster::start_with(masters, replicas) -> Result<RedisCluster, _>
//! RedisCluster::start_with_binary(binary: &Path, masters, replicas) -> Result<RedisCluster, _>
//! RedisCluster::start_valkey(masters, replicas) -> Result<Option<RedisCluster>, _>
//!     // Valkey from valkey_server(); Ok(None) when missing outside CI, an error when $CI is set
//! RedisCluster::start_opts(ClusterOptions { masters, replicas, node_timeout_ms, binary,
//!                                           extra_args, ready_timeout }) -> Result<RedisCluster, _>
//!
//! cluster.seed_urls() -> Vec<String>        // "redis://127.0.0.1:<port>/" for every node
//! cluster.addrs() -> Vec<String>            // "127.0.0.1:<port>" for every node
//! cluster.ports() -> Vec<u16>               // every node started, live or killed
//! cluster.client() -> RedisResult<redis::cluster::ClusterClient>   // 10 s timeouts
//! cluster.target() -> Result<queue::target::Target, ConnectError>  // first node's URL, the
//!                                           // others as seeds (`addrs`), for inferq's clients
//! cluster.connection().await -> RedisResult<redis::cluster_async::ClusterConnection>
//! cluster.masters() -> Result<Vec<ClusterNodeInfo>, _>          // live masters, by port
//! cluster.replicas_of(master_port) -> Result<Vec<ClusterNodeInfo>, _>
//! cluster.master_for_slot(slot) -> Result<u16, _>                // the master's port
//! cluster.master_for_key(key) -> Result<u16, _>                  // via config::cluster::hash_slot
//! cluster.node_id(port) -> Option<&str>
//! cluster.node_cli(port, &["CLUSTER", "INFO"]) -> Result<String, _>  // redis-cli on one node
//! cluster.node_log(port) -> String                                // tail of its log
//! cluster.kill_node(port) / cluster.kill_master(port) -> Result<(), _>   // SIGKILL
//! cluster.wait_for_failover(old_master_port, timeout) -> Result<u16, _>  // the promoted port
//! cluster.manual_failover(replica_port) -> Result<(), _>          // CLUSTER FAILOVER, roles swap
//! cluster.migrate_slot(slot, to_master_port) -> Result<(), _>     // the whole protocol
//! cluster.begin_slot_migration(slot, to_master_port, max_keys) -> Result<SlotMigration, _>
//!     // IMPORTING/MIGRATING set, at most max_keys keys moved: the slot stays half-way, so a
//!     // moved key's command on the old master gets `-ASK <slot> 127.0.0.1:<to>`
//! cluster.finish_slot_migration(migration) -> Result<(), _>       // the rest, SETSLOT NODE
//! cluster.restart_node(port) -> Result<(), _>   // same port and dir; a failed-over master
//!                                               // rejoins as a replica
//! cluster.wait_stable() -> Result<(), _>        // the condition every call above waits for
//! drop(cluster)                                 // SIGKILLs every node, removes the dirs
//! ```
//!
//! Failovers take about a node timeout and a half (2000 ms by default: long enough that a
//! loaded machine stalling a node for a second does not fail it over) plus the replica's
//! election delay (0.5–1 s): 3–5 s on an idle machine. `cluster-replica-validity-factor 0` lets any
//! replica fail over, and replica migration is off, so the topology changes only when asked.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{
    cmd, info_field, log_tail, poll, redis_binary, redis_cli_binary, Conns, RedisServer,
    TestkitError,
};
use inferq_client::{hash_slot, SLOTS};

/// How to start a [`RedisCluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Masters (at least 3: `redis-cli --cluster create` wants them).
    pub masters: usize,
    /// Replicas of each master.
    pub replicas: usize,
    /// `cluster-node-timeout`: how long a silent node takes to be marked failing.
    pub node_timeout_ms: u64,
    /// The server binary; `None` is `$INFERQ_REDIS_SERVER` or `redis-server`.
    pub binary: Option<PathBuf>,
    /// More arguments for every node (`--user …`, `--maxmemory …`).
    pub extra_args: Vec<String>,
    /// How long start-up, and every later step that waits for a stable cluster, may take.
    pub ready_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> ClusterOptions {
        ClusterOptions {
            masters: 3,
            replicas: 1,
            node_timeout_ms: 2000,
            binary: None,
            extra_args: Vec::new(),
            ready_timeout: Duration::from_secs(60),
        }
    }
}

/// One node as `CLUSTER NODES` describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNodeInfo {
    pub port: u16,
    /// The 40-character node id.
    pub id: String,
    /// The master's node id, for a replica; `None` for a master.
    pub master_id: Option<String>,
    /// The slot ranges (inclusive) a master serves; empty for a replica.
    pub slots: Vec<(u16, u16)>,
}

/// A slot migration under way, from [`RedisCluster::begin_slot_migration`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMigration {
    pub slot: u16,
    pub from_port: u16,
    pub to_port: u16,
    /// The keys moved so far; a command on one of them at `from_port` gets `-ASK`.
    pub moved: Vec<String>,
}

/// A running Redis Cluster; see the module documentation for its API.
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Node ids by node index (kept across restarts: `nodes.conf` stays in the node's dir).
    ids: Vec<String>,
    /// The slots a master served when [`RedisCluster::kill_master`] killed it, by node index.
    killed_slots: BTreeMap<usize, Vec<(u16, u16)>>,
    options: ClusterOptions,
    conns: Conns,
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster").finish_non_exhaustive()
    }
}

/// Which master (port) serves which slot ranges, as one node sees it.
type SlotMap = BTreeMap<u16, Vec<(u16, u16)>>;

/// A line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
struct NodeLine {
    info: ClusterNodeInfo,
    flags: Vec<String>,
}

impl NodeLine {
    fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }

    fn failing(&self) -> bool {
        self.flags
            .iter()
            .any(|f| f == "fail" || f == "fail?" || f == "noaddr")
    }
}

/// Parses `CLUSTER NODES` (`<id> <ip:port@bus[,host]> <flags> <master|-> <ping> <pong> <epoch>
/// <link> <slot ranges…>`); migration markers (`[slot->-id]`) are left out of the slots.
fn parse_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let addr = fields[1].split(['@', ',']).next()?;
            let port = addr.rsplit(':').next()?.parse().ok()?;
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|s| match s.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => s.parse().ok().map(|n| (n, n)),
                })
                .collect();
            Some(NodeLine {
                info: ClusterNodeInfo {
                    port,
                    id: fields[0].to_owned(),
                    master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                    slots,
                },
                flags: fields[2].split(',').map(str::to_owned).collect(),
            })
        })
        .collect()
}

/// A free port below 55536 whose cluster bus port (+10000) is free as well. Both come from below
/// the kernel's ephemeral range, and from bands [`super::free_port`] never hands out, when that
/// range leaves room (see [`super::port_bands`]): a single server started beside a cluster
/// cannot take a node's bus port between this check and the node's start.
pub fn free_cluster_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let (low, high) = super::port_bands().cluster;
    super::seed_cursor(&CURSOR, u32::from(high - low), 7919);
    let free = |p: u16| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok();
    pick_cluster_port(low, high, || CURSOR.fetch_add(1, Ordering::Relaxed), free)
}

/// The first port of `low..high` (from the offsets `next` gives, wrapping) below 55536 for which
/// `free` holds of both the port and its bus port.
fn pick_cluster_port(
    low: u16,
    high: u16,
    mut next: impl FnMut() -> u32,
    free: impl Fn(u16) -> bool,
) -> std::io::Result<u16> {
    let span = u32::from(high - low);
    for _ in 0..span {
        let offset = next() % span;
        let Ok(port) = u16::try_from(u32::from(low) + offset) else {
            continue;
        };
        if port < 55_536 && free(port) && free(port + 10_000) {
            return Ok(port);
        }
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::AddrInUse,
        format!("no free port pair (port, port + 10000) in {low}..{high}"),
    ))
}

impl RedisCluster {
    /// 3 masters with one replica each, from `redis-server`.
    pub fn start() -> Result<RedisCluster, TestkitError> {
        Self::start_opts(ClusterOptions::default())
    }

    /// `masters` (at least 3) with `replicas` replicas each.
    pub fn start_with(masters: usize, replicas: usize) -> Result<RedisCluster, TestkitError> {
        Self::start_opts(ClusterOptions {
            masters,
            replicas,
            ..ClusterOptions::default()
        })
    }

    /// [`RedisCluster::start_with`] from another server binary (a `valkey-server`).
    pub fn start_with_binary(
        binary: &Path,
        masters: usize,
        replicas: usize,
    ) -> Result<RedisCluster, TestkitError> {
        Self::start_opts(ClusterOptions {
            masters,
            replicas,
            binary: Some(binary.to_path_buf()),
            ..ClusterOptions::default()
        })
    }

    /// A Valkey cluster from [`super::valkey_server`]: `Ok(None)` when there is none and `$CI` is unset,
    /// [`TestkitError::ValkeyMissing`] when there is none in CI.
    pub fn start_valkey(
        masters: usize,
        replicas: usize,
    ) -> Result<Option<RedisCluster>, TestkitError> {
        match super::require_valkey()? {
            Some(binary) => Self::start_with_binary(&binary, masters, replicas).map(Some),
            None => Ok(None),
        }
    }

    /// Starts the nodes, creates the cluster and waits until it is stable.
    pub fn start_opts(options: ClusterOptions) -> Result<RedisCluster, TestkitError> {
        if options.masters < 3 {
            return Err(TestkitError::Topology(format!(
                "a cluster needs at least 3 masters (redis-cli --cluster create), not {}",
                options.masters
            )));
        }
        let binary = options.binary.clone().unwrap_or_else(redis_binary);
        let count = options.masters * (1 + options.replicas);
        let mut args: Vec<String> = [
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-node-timeout",
            &options.node_timeout_ms.to_string(),
            "--cluster-replica-validity-factor",
            "0",
            "--cluster-allow-replica-migration",
            "no",
            "--cluster-require-full-coverage",
            "yes",
            "--repl-diskless-sync-delay",
            "0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(options.extra_args.iter().cloned());
        let mut nodes = Vec::with_capacity(count);
        for _ in 0..count {
            let dir = tempfile::Builder::new()
                .prefix("inferq-cluster-")
                .tempdir()?;
            nodes.push(RedisServer::start_node(
                &binary,
                dir,
                Vec::new(),
                args.clone(),
                None,
                free_cluster_port,
                true,
            )?);
        }
        let mut cluster = RedisCluster {
            nodes,
            ids: Vec::new(),
            killed_slots: BTreeMap::new(),
            options,
            conns: Conns::new(None),
        };
        cluster.create()?;
        Ok(cluster)
    }

    /// `redis-cli --cluster create`, the node ids, then a stable cluster.
    fn create(&mut self) -> Result<(), TestkitError> {
        let addrs = self.addrs();
        let replicas = self.options.replicas.to_string();
        let mut args: Vec<&str> = vec!["--cluster", "create"];
        args.extend(addrs.iter().map(String::as_str));
        args.extend(["--cluster-replicas", &replicas, "--cluster-yes"]);
        let out = std::process::Command::new(redis_cli_binary())
            .args(&args)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(TestkitError::CliNotInstalled)?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let failed = |log: String| TestkitError::Cli {
            port: self.nodes[0].port(),
            args: args.join(" "),
            status: out.status.to_string(),
            output: format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr)),
            log,
        };
        if !out.status.success() {
            return Err(failed(self.logs()));
        }
        let mut ids = Vec::with_capacity(self.nodes.len());
        for node in &self.nodes {
            ids.push(self.query::<String>(node.port(), &["CLUSTER", "MYID"])?);
        }
        self.ids = ids;
        // On a loaded machine the final check of `--cluster create` can run before gossip has
        // told every node of every other ("Not all 16384 slots are covered", though every slot
        // was assigned): the cluster settles by itself, which wait_stable waits for.
        self.wait_stable()
            .map_err(|e| failed(format!("{e}\n{}", self.logs())))
    }

    /// `redis://127.0.0.1:<port>/` for every node started (live or not).
    pub fn seed_urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// `127.0.0.1:<port>` for every node started (live or not).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect()
    }

    /// Every node's port.
    pub fn ports(&self) -> Vec<u16> {
        self.nodes.iter().map(RedisServer::port).collect()
    }

    /// A cluster client seeded with every node, 10 s connection and response timeouts (a loaded
    /// machine stalls a test longer than redis-rs's defaults allow).
    pub fn client(&self) -> redis::RedisResult<redis::cluster::ClusterClient> {
        redis::cluster::ClusterClientBuilder::new(self.seed_urls())
            .connection_timeout(Duration::from_secs(10))
            .response_timeout(Duration::from_secs(10))
            .build()
    }

    /// A [`inferq_client::target::Target`] for inferq's own clients (producers, links): the first
    /// node's URL, every other node a seed, as Go's `url` and `addrs` would name them.
    pub fn target(
        &self,
    ) -> Result<inferq_client::target::Target, inferq_client::connect::ConnectError> {
        let addrs = self.addrs();
        inferq_client::target::Target::new(
            &self.nodes[0].url(),
            &Default::default(),
            inferq_client::target::Topology::Cluster {
                addrs: addrs[1..].to_vec(),
            },
        )
    }

    /// An async cluster connection from [`RedisCluster::client`].
    pub async fn connection(&self) -> redis::RedisResult<redis::cluster_async::ClusterConnection> {
        self.client()?.get_async_connection().await
    }

    /// The node id of the node on `port`.
    pub fn node_id(&self, port: u16) -> Option<&str> {
        let index = self.index(port).ok()?;
        self.ids.get(index).map(String::as_str)
    }

    /// Runs `redis-cli` against the node on `port` (see [`super::node_cli`]).
    pub fn node_cli(&self, port: u16, args: &[&str]) -> Result<String, TestkitError> {
        let index = self.index(port)?;
        super::node_cli(port, None, args, Some(&self.nodes[index].log_path()))
    }

    /// The last 40 lines of the log of the node on `port`.
    pub fn node_log(&self, port: u16) -> String {
        self.index(port)
            .map(|i| self.nodes[i].log_tail(40))
            .unwrap_or_default()
    }

    /// The live masters (by port), as the first live node's `CLUSTER NODES` has them.
    pub fn masters(&self) -> Result<Vec<ClusterNodeInfo>, TestkitError> {
        let mut masters: Vec<ClusterNodeInfo> = self
            .live_view()?
            .into_iter()
            .filter(|l| l.is_master() && !l.failing() && self.is_live(l.info.port))
            .map(|l| l.info)
            .collect();
        masters.sort_by_key(|m| m.port);
        Ok(masters)
    }

    /// The live replicas of the master on `master_port`.
    pub fn replicas_of(&self, master_port: u16) -> Result<Vec<ClusterNodeInfo>, TestkitError> {
        let index = self.index(master_port)?;
        let id = &self.ids[index];
        let mut replicas: Vec<ClusterNodeInfo> = self
            .live_view()?
            .into_iter()
            .filter(|l| l.info.master_id.as_ref() == Some(id))
            .filter(|l| !l.failing() && self.is_live(l.info.port))
            .map(|l| l.info)
            .collect();
        replicas.sort_by_key(|r| r.port);
        Ok(replicas)
    }

    /// The port of the master serving `slot`.
    pub fn master_for_slot(&self, slot: u16) -> Result<u16, TestkitError> {
        self.live_view()?
            .into_iter()
            .find(|l| l.is_master() && l.info.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|l| l.info.port)
            .ok_or_else(|| TestkitError::Topology(format!("no master serves slot {slot}")))
    }

    /// The port of the master serving `key`'s slot ([`hash_slot`]).
    pub fn master_for_key(&self, key: &str) -> Result<u16, TestkitError> {
        self.master_for_slot(hash_slot(key))
    }

    /// SIGKILLs the node on `port`, whatever its role.
    pub fn kill_node(&mut self, port: u16) -> Result<(), TestkitError> {
        let index = self.index(port)?;
        self.nodes[index].kill();
        self.conns.forget(port);
        Ok(())
    }

    /// SIGKILLs the master on `port` (an error if it is not a live master); then
    /// [`RedisCluster::wait_for_failover`] waits for its replica to take over.
    pub fn kill_master(&mut self, port: u16) -> Result<(), TestkitError> {
        let index = self.index(port)?;
        let line = self
            .live_view()?
            .into_iter()
            .find(|l| l.info.port == port)
            .filter(|l| l.is_master() && self.is_live(port))
            .ok_or_else(|| TestkitError::Topology(format!("port {port} is not a live master")))?;
        self.killed_slots.insert(index, line.info.slots);
        self.kill_node(port)
    }

    /// Waits up to `timeout` until a replica of the master [`RedisCluster::kill_master`] killed
    /// on `old_master_port` serves its slots and the cluster is stable; returns its port.
    pub fn wait_for_failover(
        &self,
        old_master_port: u16,
        timeout: Duration,
    ) -> Result<u16, TestkitError> {
        let index = self.index(old_master_port)?;
        let Some(&(first, _)) = self.killed_slots.get(&index).and_then(|s| s.first()) else {
            return Err(TestkitError::Topology(format!(
                "port {old_master_port} was not killed by kill_master, or served no slots"
            )));
        };
        poll(
            &format!("a replica of port {old_master_port} to take over slot {first}"),
            timeout,
            || {
                self.stable()?;
                let port = self.master_for_slot(first).map_err(|e| e.to_string())?;
                if port == old_master_port {
                    return Err(format!("slot {first} is still on {old_master_port}"));
                }
                Ok(Some(port))
            },
            || self.logs(),
        )
    }

    /// `CLUSTER FAILOVER` on the replica on `replica_port`; returns once it is a master, its old
    /// master (if live) a replica of it with its link up, and the cluster stable.
    pub fn manual_failover(&self, replica_port: u16) -> Result<(), TestkitError> {
        let info = self.query::<String>(replica_port, &["INFO", "replication"])?;
        let old_master = info_field(&info, "master_port").and_then(|p| p.parse::<u16>().ok());
        let Some(old_master) = old_master.filter(|_| info_field(&info, "role") == Some("slave"))
        else {
            return Err(TestkitError::Topology(format!(
                "port {replica_port} is not a replica"
            )));
        };
        let _: String = self.query(replica_port, &["CLUSTER", "FAILOVER"])?;
        poll(
            &format!("replica {replica_port} to take over from {old_master}"),
            self.options.ready_timeout,
            || {
                let role = self.role(replica_port)?;
                if role != "master" {
                    return Err(format!("{replica_port} is still {role}"));
                }
                if self.is_live(old_master) {
                    let role = self.role(old_master)?;
                    if role != "slave" {
                        return Err(format!("old master {old_master} is {role}"));
                    }
                }
                self.stable().map(Some)
            },
            || self.logs(),
        )
    }

    /// Moves `slot` with every key in it to the master on `to_master_port`: `SETSLOT IMPORTING`
    /// and `MIGRATING`, `GETKEYSINSLOT` + `MIGRATE … KEYS` in batches of 100, then `SETSLOT NODE`
    /// on every master; returns once the cluster is stable.
    pub fn migrate_slot(&self, slot: u16, to_master_port: u16) -> Result<(), TestkitError> {
        let migration = self.begin_slot_migration(slot, to_master_port, usize::MAX)?;
        self.finish_slot_migration(migration)
    }

    /// Starts moving `slot` to the master on `to_master_port` and moves at most `max_keys` of its
    /// keys: the slot is then `MIGRATING` on its master and `IMPORTING` on the target, and a
    /// command on a moved key sent to the old master gets `-ASK <slot> 127.0.0.1:<to>`.
    /// [`RedisCluster::finish_slot_migration`] completes it.
    pub fn begin_slot_migration(
        &self,
        slot: u16,
        to_master_port: u16,
        max_keys: usize,
    ) -> Result<SlotMigration, TestkitError> {
        if slot >= SLOTS {
            return Err(TestkitError::Topology(format!("no slot {slot}")));
        }
        let from_port = self.master_for_slot(slot)?;
        let masters = self.masters()?;
        if !masters.iter().any(|m| m.port == to_master_port) {
            return Err(TestkitError::Topology(format!(
                "port {to_master_port} is not a live master"
            )));
        }
        if from_port == to_master_port {
            return Err(TestkitError::Topology(format!(
                "slot {slot} is already on {to_master_port}"
            )));
        }
        let from_id = self.ids[self.index(from_port)?].clone();
        let to_id = self.ids[self.index(to_master_port)?].clone();
        let slot_arg = slot.to_string();
        let _: String = self.query(
            to_master_port,
            &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &from_id],
        )?;
        let _: String = self.query(
            from_port,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &to_id],
        )?;
        let mut migration = SlotMigration {
            slot,
            from_port,
            to_port: to_master_port,
            moved: Vec::new(),
        };
        self.move_keys(&mut migration, max_keys)?;
        Ok(migration)
    }

    /// Moves the keys still in the old master, then `CLUSTER SETSLOT <slot> NODE <target>` on the
    /// target, the old master and every other master; returns once the cluster is stable.
    pub fn finish_slot_migration(&self, mut migration: SlotMigration) -> Result<(), TestkitError> {
        self.move_keys(&mut migration, usize::MAX)?;
        let to_id = self.ids[self.index(migration.to_port)?].clone();
        let slot_arg = migration.slot.to_string();
        let setslot = ["CLUSTER", "SETSLOT", &slot_arg, "NODE", &to_id];
        let _: String = self.query(migration.to_port, &setslot)?;
        let _: String = self.query(migration.from_port, &setslot)?;
        for master in self.masters()? {
            if master.port != migration.to_port && master.port != migration.from_port {
                let _: String = self.query(master.port, &setslot)?;
            }
        }
        poll(
            &format!(
                "slot {} to be served by {}",
                migration.slot, migration.to_port
            ),
            self.options.ready_timeout,
            || {
                self.stable()?;
                let port = self
                    .master_for_slot(migration.slot)
                    .map_err(|e| e.to_string())?;
                Ok((port == migration.to_port).then_some(()))
            },
            || self.logs(),
        )
    }

    /// `GETKEYSINSLOT` and `MIGRATE … KEYS` until the slot is empty on the old master or
    /// `max_keys` moved.
    fn move_keys(
        &self,
        migration: &mut SlotMigration,
        max_keys: usize,
    ) -> Result<(), TestkitError> {
        let slot_arg = migration.slot.to_string();
        let to_port = migration.to_port.to_string();
        while migration.moved.len() < max_keys {
            let batch = (max_keys - migration.moved.len()).min(100).to_string();
            let keys: Vec<String> = self.query(
                migration.from_port,
                &["CLUSTER", "GETKEYSINSLOT", &slot_arg, &batch],
            )?;
            if keys.is_empty() {
                break;
            }
            let mut args = vec!["MIGRATE", "127.0.0.1", &to_port, "", "0", "10000", "KEYS"];
            args.extend(keys.iter().map(String::as_str));
            let _: String = self.query(migration.from_port, &args)?;
            migration.moved.extend(keys);
        }
        Ok(())
    }

    /// Starts the killed node on `port` again, in its own dir (its `nodes.conf`), and waits until
    /// it has rejoined and the cluster is stable: a master that was failed over comes back as a
    /// replica of the node that took its slots.
    pub fn restart_node(&mut self, port: u16) -> Result<(), TestkitError> {
        let index = self.index(port)?;
        self.conns.forget(port);
        self.nodes[index].restart()?;
        self.killed_slots.remove(&index);
        self.wait_stable()
    }

    /// Waits until every live node says `cluster_state:ok` with all slots served and every node
    /// known, all agree on the slots' masters (none of them a killed node), every live node sees
    /// every other live node healthy and in the role that node reports itself (a replica of the
    /// master it replicates), and every live replica's link to its master is up.
    pub fn wait_stable(&self) -> Result<(), TestkitError> {
        poll(
            "a stable cluster",
            self.options.ready_timeout,
            || self.stable().map(Some),
            || self.logs(),
        )
    }

    /// `Ok` when the cluster is stable (see [`RedisCluster::wait_stable`]), else what is not.
    fn stable(&self) -> Result<(), String> {
        // Each live node's own word on its role: `None` for a master, its master's id for a
        // replica (whose link must be up).
        let mut roles: BTreeMap<u16, Option<String>> = BTreeMap::new();
        for node in self.nodes.iter().filter(|n| n.started()) {
            let port = node.port();
            let replication: String = self
                .conns
                .query(port, &cmd(&["INFO", "replication"]))
                .map_err(|e| format!("{port}: INFO replication: {e}"))?;
            let master = match info_field(&replication, "role") {
                Some("slave") => {
                    let link = info_field(&replication, "master_link_status").unwrap_or("?");
                    let syncing =
                        info_field(&replication, "master_sync_in_progress").unwrap_or("?");
                    let of = info_field(&replication, "master_port").unwrap_or("?");
                    if link != "up" || syncing != "0" {
                        return Err(format!(
                            "replica {port} of {of}: master_link_status {link}, sync in \
                             progress {syncing}"
                        ));
                    }
                    let id = of
                        .parse()
                        .ok()
                        .and_then(|p| self.node_id(p))
                        .ok_or_else(|| format!("replica {port} of unknown port {of}"))?;
                    Some(id.to_owned())
                }
                _ => None,
            };
            roles.insert(port, master);
        }
        let mut first: Option<(u16, SlotMap)> = None;
        for &port in roles.keys() {
            let info: String = self
                .conns
                .query(port, &cmd(&["CLUSTER", "INFO"]))
                .map_err(|e| format!("{port}: CLUSTER INFO: {e}"))?;
            let state = info_field(&info, "cluster_state").unwrap_or("?");
            let ok = info_field(&info, "cluster_slots_ok").unwrap_or("?");
            let known = info_field(&info, "cluster_known_nodes").unwrap_or("?");
            if state != "ok" || ok != "16384" || known != self.nodes.len().to_string() {
                return Err(format!(
                    "{port}: cluster_state {state}, slots_ok {ok}, known_nodes {known}"
                ));
            }
            let view = self.view(port)?;
            // Every live node is seen healthy, in the role it has itself.
            for (&other, master) in &roles {
                let line = view
                    .iter()
                    .find(|l| l.info.port == other)
                    .ok_or_else(|| format!("{port} does not know {other}"))?;
                if line.failing() {
                    return Err(format!("{port} flags live node {other} {:?}", line.flags));
                }
                if line.is_master() != master.is_none() || line.info.master_id != *master {
                    return Err(format!(
                        "{port} sees {other} as {:?} of {:?}, it is a replica of {master:?}",
                        line.flags, line.info.master_id
                    ));
                }
            }
            // The masters serving slots, as this node sees them: the same for every node.
            let map: SlotMap = view
                .iter()
                .filter(|l| l.is_master() && !l.info.slots.is_empty())
                .map(|l| (l.info.port, l.info.slots.clone()))
                .collect();
            if let Some(dead) = map.keys().find(|p| !self.is_live(**p)) {
                return Err(format!("{port} has killed node {dead} serving slots"));
            }
            match &first {
                None => first = Some((port, map)),
                Some((first_port, first_map)) if *first_map != map => {
                    return Err(format!(
                        "{port} sees slots {map:?}, {first_port} sees {first_map:?}"
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// `ROLE`'s first element (`master` / `slave`) of the node on `port`.
    fn role(&self, port: u16) -> Result<String, String> {
        let role: Vec<redis::Value> = self
            .conns
            .query(port, &cmd(&["ROLE"]))
            .map_err(|e| format!("{port}: ROLE: {e}"))?;
        match role.first() {
            Some(redis::Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into()),
            other => Err(format!("{port}: ROLE starts with {other:?}")),
        }
    }

    /// `CLUSTER NODES` of the node on `port`, parsed.
    fn view(&self, port: u16) -> Result<Vec<NodeLine>, String> {
        let text: String = self
            .conns
            .query(port, &cmd(&["CLUSTER", "NODES"]))
            .map_err(|e| format!("{port}: CLUSTER NODES: {e}"))?;
        Ok(parse_nodes(&text))
    }

    /// The first live node's view.
    fn live_view(&self) -> Result<Vec<NodeLine>, TestkitError> {
        let mut last = String::from("no live node");
        for node in self.nodes.iter().filter(|n| n.started()) {
            match self.view(node.port()) {
                Ok(view) => return Ok(view),
                Err(e) => last = e,
            }
        }
        Err(TestkitError::Topology(format!(
            "no live node answered CLUSTER NODES: {last}"
        )))
    }

    /// Runs `args` on the node on `port`, an error carrying its log tail.
    fn query<T: redis::FromRedisValue>(&self, port: u16, args: &[&str]) -> Result<T, TestkitError> {
        self.conns
            .query(port, &cmd(args))
            .map_err(|error| TestkitError::Command {
                port,
                command: args.join(" "),
                error,
                log: self.node_log(port),
            })
    }

    fn index(&self, port: u16) -> Result<usize, TestkitError> {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .ok_or_else(|| TestkitError::Topology(format!("no node of this cluster on {port}")))
    }

    fn is_live(&self, port: u16) -> bool {
        self.nodes.iter().any(|n| n.port() == port && n.started())
    }

    /// The tail of every node's log, for timeout messages.
    fn logs(&self) -> String {
        self.nodes
            .iter()
            .map(|n| {
                format!(
                    "--- node {} ({}) ---\n{}",
                    n.port(),
                    if n.started() { "live" } else { "killed" },
                    log_tail(&n.log_path(), 15)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::AsyncCommands;
    use std::time::Instant;

    /// Keys `prefix-0…` spread over the slots of every master.
    fn keys(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    #[test]
    fn parses_cluster_nodes() {
        let text = "\
07c37dfeb2352e0b0b7e4c7a8d3f2d5b1c1d1e1f 127.0.0.1:30004@40004 slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected
67ed2db8d677e59ec4a4cefb06858cf2a1a89fa1 127.0.0.1:30002@40002,host-2 master - 0 1426238316232 2 connected 5461-10922 [10923->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]
e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460 16000
6ec23923021cf3ffec47632106199cb7f496ce01 :0@0 master,fail,noaddr - 0 0 5 disconnected
";
        let lines = parse_nodes(text);
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0].info.port, 30004);
        assert_eq!(
            lines[0].info.master_id.as_deref(),
            Some("e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca")
        );
        assert!(!lines[0].is_master());
        assert_eq!(lines[1].info.port, 30002);
        assert_eq!(lines[1].info.slots, vec![(5461, 10922)]);
        assert_eq!(lines[2].info.slots, vec![(0, 5460), (16000, 16000)]);
        assert!(lines[2].is_master() && !lines[2].failing());
        assert!(lines[3].failing());
    }

    #[test]
    fn cluster_ports_leave_room_for_the_bus_port() {
        let bands = crate::port_bands();
        let (s_low, s_high) = bands.single;
        let apart = bands.cluster.1 - bands.cluster.0 < 10_000;
        for _ in 0..50 {
            let port = free_cluster_port().unwrap();
            assert!(port < 55_536);
            // Neither the node's port nor its bus port is one a single server can be given
            // (where the range leaves room for bands).
            if apart {
                for p in [port, port + 10_000] {
                    assert!(!(s_low..s_high).contains(&p), "{p} in {s_low}..{s_high}");
                }
            }
        }
    }

    /// A port whose bus port is taken is passed over, whichever of the two is taken; a range
    /// with no free pair is an error naming the range, not a port that cannot start a node.
    /// (Whether the bus port is still free a moment later is not asked of a live machine: any
    /// process may take it.)
    #[test]
    fn a_port_whose_bus_port_is_taken_is_passed_over() {
        let mut offsets = 0..;
        let next = || offsets.next().unwrap_or(0);
        // 30000's bus port is taken, 30001 itself is taken: 30002 is the first whole pair.
        let busy = [40_000u16, 30_001];
        let free = |p: u16| !busy.contains(&p);
        assert_eq!(
            pick_cluster_port(30_000, 30_010, next, free).unwrap(),
            30_002
        );
        // Ports whose bus port would pass 65535 are never handed out.
        let mut offsets = 0..;
        let next = || offsets.next().unwrap_or(0);
        assert_eq!(
            pick_cluster_port(55_530, 55_540, next, |_| true).unwrap(),
            55_530
        );
        let mut offsets = 6..;
        let next = || offsets.next().unwrap_or(0);
        assert_eq!(
            pick_cluster_port(55_530, 55_540, next, |_| true).unwrap(),
            55_530
        );
        let mut offsets = 0..;
        let next = || offsets.next().unwrap_or(0);
        let err = pick_cluster_port(30_000, 30_004, next, |p| p < 40_000).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse);
        assert!(err.to_string().contains("30000..30004"), "{err}");
    }

    /// SET/GET across every master's slots through a cluster client; a whole slot migration
    /// (more keys than one MIGRATE batch) moves every key, which the client still finds; a
    /// migration stopped half-way answers ASK for a moved key at the old master, the client
    /// follows it, and finishing it moves the rest.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn serves_across_slots_and_migrates_slots() {
        let started = Instant::now();
        let cluster = RedisCluster::start().unwrap();
        eprintln!("3x1 cluster up in {:?}", started.elapsed());
        assert_eq!(cluster.seed_urls().len(), 6);
        assert_eq!(cluster.addrs().len(), 6);
        let masters = cluster.masters().unwrap();
        assert_eq!(masters.len(), 3, "{masters:?}");
        for master in &masters {
            let replicas = cluster.replicas_of(master.port).unwrap();
            assert_eq!(replicas.len(), 1, "{replicas:?}");
            assert_eq!(replicas[0].master_id.as_deref(), Some(master.id.as_str()));
            assert_eq!(cluster.node_id(master.port), Some(master.id.as_str()));
        }
        let mut con = cluster.connection().await.unwrap();

        let spread = keys("spread", 60);
        let mut owners = std::collections::BTreeSet::new();
        for key in &spread {
            let _: () = con.set(key, format!("v-{key}")).await.unwrap();
            owners.insert(cluster.master_for_key(key).unwrap());
        }
        assert_eq!(owners.len(), 3, "60 keys land on every master");
        for key in &spread {
            let v: String = con.get(key).await.unwrap();
            assert_eq!(v, format!("v-{key}"));
            // The key really lives on the master the fixture names for its slot.
            let direct = cluster
                .node_cli(cluster.master_for_key(key).unwrap(), &["GET", key])
                .unwrap();
            assert_eq!(direct, format!("v-{key}"));
        }

        // A whole migration of a slot with 250 keys (3 MIGRATE batches).
        let tagged: Vec<String> = (0..250).map(|i| format!("{{mig}}:{i}")).collect();
        for key in &tagged {
            let _: () = con.set(key, key).await.unwrap();
        }
        let slot = hash_slot("mig");
        let from = cluster.master_for_slot(slot).unwrap();
        let to = masters.iter().map(|m| m.port).find(|&p| p != from).unwrap();
        let t = Instant::now();
        cluster.migrate_slot(slot, to).unwrap();
        eprintln!("migrated slot {slot} (250 keys) in {:?}", t.elapsed());
        assert_eq!(cluster.master_for_slot(slot).unwrap(), to);
        let slot_arg = slot.to_string();
        let count = cluster
            .node_cli(to, &["CLUSTER", "COUNTKEYSINSLOT", &slot_arg])
            .unwrap();
        assert_eq!(count, "250");
        let left = cluster
            .node_cli(from, &["CLUSTER", "COUNTKEYSINSLOT", &slot_arg])
            .unwrap();
        assert_eq!(left, "0");
        for key in &tagged {
            let v: String = con.get(key).await.unwrap();
            assert_eq!(&v, key);
        }

        // Half-way: 4 of 10 keys moved.
        let half: Vec<String> = (0..10).map(|i| format!("{{ask}}:{i}")).collect();
        for key in &half {
            let _: () = con.set(key, key).await.unwrap();
        }
        let slot = hash_slot("ask");
        let from = cluster.master_for_slot(slot).unwrap();
        let to = masters.iter().map(|m| m.port).find(|&p| p != from).unwrap();
        let migration = cluster.begin_slot_migration(slot, to, 4).unwrap();
        assert_eq!(migration.moved.len(), 4);
        assert_eq!((migration.from_port, migration.to_port), (from, to));
        let mut old = redis::Client::open(format!("redis://127.0.0.1:{from}/"))
            .unwrap()
            .get_connection()
            .unwrap();
        let moved = &migration.moved[0];
        let err = redis::cmd("GET")
            .arg(moved)
            .query::<String>(&mut old)
            .unwrap_err();
        assert_eq!(err.code(), Some("ASK"), "{err:?}");
        let target = format!("127.0.0.1:{to}");
        assert_eq!(
            err.redirect_node(),
            Some((target.as_str(), slot)),
            "{err:?}"
        );
        let unmoved = half.iter().find(|k| !migration.moved.contains(k)).unwrap();
        let v: String = redis::cmd("GET").arg(unmoved).query(&mut old).unwrap();
        assert_eq!(&v, unmoved);
        // The cluster client follows the ASK (and finds the unmoved keys where they are).
        for key in &half {
            let v: String = con.get(key).await.unwrap();
            assert_eq!(&v, key);
        }
        cluster.finish_slot_migration(migration).unwrap();
        assert_eq!(cluster.master_for_slot(slot).unwrap(), to);
        for key in &half {
            let v: String = con.get(key).await.unwrap();
            assert_eq!(&v, key);
        }
    }

    /// A killed master's replica takes over its slots; the keys it had are served through the
    /// cluster client, new writes land; the restarted old master rejoins as a replica, and a
    /// manual failover makes it master again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_a_killed_master_and_fails_back() {
        let mut cluster = RedisCluster::start().unwrap();
        let mut con = cluster.connection().await.unwrap();
        let victim = cluster.master_for_key("fo").unwrap();
        let replica = cluster.replicas_of(victim).unwrap()[0].port;
        let on_victim: Vec<String> = keys("fo", 200)
            .into_iter()
            .filter(|k| cluster.master_for_key(k).unwrap() == victim)
            .collect();
        assert!(!on_victim.is_empty());
        for key in &on_victim {
            let _: () = con.set(key, key).await.unwrap();
        }
        // Replication is asynchronous: wait until the replica holds every key.
        let want = on_victim.len().to_string();
        let deadline = Instant::now() + Duration::from_secs(30);
        while cluster.node_cli(replica, &["DBSIZE"]).unwrap() != want {
            assert!(Instant::now() < deadline, "replica never caught up");
            std::thread::sleep(Duration::from_millis(50));
        }

        let t = Instant::now();
        cluster.kill_master(victim).unwrap();
        let promoted = cluster
            .wait_for_failover(victim, Duration::from_secs(60))
            .unwrap();
        eprintln!("failover after kill_master in {:?}", t.elapsed());
        assert_eq!(promoted, replica);
        assert!(cluster.masters().unwrap().iter().all(|m| m.port != victim));
        for key in &on_victim {
            let v: String = con.get(key).await.unwrap();
            assert_eq!(&v, key);
        }
        let _: () = con.set(&on_victim[0], "after").await.unwrap();

        let t = Instant::now();
        cluster.restart_node(victim).unwrap();
        eprintln!("killed master rejoined in {:?}", t.elapsed());
        let replicas = cluster.replicas_of(promoted).unwrap();
        assert_eq!(
            replicas.iter().map(|r| r.port).collect::<Vec<_>>(),
            vec![victim]
        );

        let t = Instant::now();
        cluster.manual_failover(victim).unwrap();
        eprintln!("manual failover in {:?}", t.elapsed());
        assert_eq!(cluster.master_for_key("fo").unwrap(), victim);
        assert_eq!(cluster.replicas_of(victim).unwrap()[0].port, promoted);
        let v: String = con.get(&on_victim[0]).await.unwrap();
        assert_eq!(v, "after");
    }

    /// A Valkey cluster (valkey-server from `valkey_server()`) starts, serves keys on every
    /// master through the cluster client and migrates a slot. Fails in CI without Valkey.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_valkey_cluster_starts_and_serves() {
        let started = Instant::now();
        let Some(cluster) = RedisCluster::start_valkey(3, 1).unwrap() else {
            return;
        };
        eprintln!("3x1 valkey cluster up in {:?}", started.elapsed());
        let version = cluster
            .node_cli(cluster.ports()[0], &["INFO", "server"])
            .unwrap();
        assert!(version.contains("valkey_version:"), "{version}");
        let mut con = cluster.connection().await.unwrap();
        for key in keys("vk", 30) {
            let _: () = con.set(&key, &key).await.unwrap();
            let v: String = con.get(&key).await.unwrap();
            assert_eq!(v, key);
        }
        let _: () = con.set("{vmig}:1", "x").await.unwrap();
        let slot = hash_slot("vmig");
        let from = cluster.master_for_slot(slot).unwrap();
        let to = cluster
            .masters()
            .unwrap()
            .iter()
            .map(|m| m.port)
            .find(|&p| p != from)
            .unwrap();
        cluster.migrate_slot(slot, to).unwrap();
        assert_eq!(cluster.master_for_slot(slot).unwrap(), to);
        let v: String = con.get("{vmig}:1").await.unwrap();
        assert_eq!(v, "x");
    }
}
