//! Real `redis-server` processes for tests, the demo and benchmarks: each on a free loopback port
//! with its own data directory (AOF on), so fault tests can kill, restart and flush it.
//!
//! A [`RedisServer`] is started from the `redis-server` on `PATH` (or `$INFERQ_REDIS_SERVER`),
//! answers `PING` before [`RedisServer::start`] returns, and is killed when dropped. Its data
//! directory is a fresh temporary one (removed on drop), or one the caller names with
//! [`RedisServer::start_in`] (kept: a restarted server, or a later run, finds the AOF there).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why a test Redis could not be started.
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
}

/// How the server persists writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fsync {
    /// `appendfsync always`: a kill -9 loses no acknowledged write.
    Always,
    /// `appendfsync everysec`: the production default; about a second at risk.
    EverySec,
}

/// A redis-server child process on a free port.
pub struct RedisServer {
    port: u16,
    dir: DataDir,
    fsync: Fsync,
    /// More `redis-server` arguments (TLS listeners in the security tests).
    extra: Vec<String>,
    child: Option<Child>,
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
/// same port, and each candidate is bound once (on every address) to skip ports in use.
pub fn free_port() -> std::io::Result<u16> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static CURSOR: AtomicU32 = AtomicU32::new(u32::MAX);
    let (low, high) = server_port_range();
    let span = u32::from(high - low);
    if CURSOR.load(Ordering::Relaxed) == u32::MAX {
        let seed = std::process::id()
            ^ std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
        let _ =
            CURSOR.compare_exchange(u32::MAX, seed % span, Ordering::Relaxed, Ordering::Relaxed);
    }
    next_free(&CURSOR, low, high).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!("no free port in {low}..{high}"),
        )
    })
}

/// The first port from `cursor` on (wrapping within `low..high`) that nothing listens on.
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

/// The ports [`free_port`] hands out: up to 12,000 ports just below the ephemeral range, and
/// above the privileged ones.
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
        let mut server = RedisServer {
            port: free_port()?,
            dir,
            fsync,
            extra,
            child: None,
        };
        // Another process may bind the port between `free_port` and the server: try new ports.
        let mut attempts = 0;
        loop {
            match server.spawn() {
                Err(TestkitError::Exited { log, .. }) if attempts < 3 && port_taken(&log) => {
                    attempts += 1;
                    server.port = free_port()?;
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
        let child = Command::new(redis_binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--save", "", "--appendonly", "yes", "--appendfsync", fsync])
            .args(["--maxmemory-policy", "noeviction", "--protected-mode", "no"])
            .arg("--logfile")
            .arg(&log)
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
            if ours.is_some() && server_pid(self.port) == ours {
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

    /// Whether the server process is running.
    /// The exit status, once the process has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

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
fn server_pid(port: u16) -> Option<u32> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).ok()?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
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
        let distinct: std::collections::HashSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len());
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
