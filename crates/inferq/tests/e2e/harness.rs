//! The security tests' harness: README's ACL rules and a Redis with them, `inferq run` and the
//! producer subcommands as child processes (a processor may be watched while it cannot start),
//! result helpers, and test certificates made with the `openssl` command line.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use inferq_client::wire::ResultMessage;
use inferq_testkit::{free_port, port_taken, RedisServer};
use redis::aio::ConnectionManager;
use redis::AsyncCommands;

pub(crate) const Q: &str = "request-sortedset";
pub(crate) const OK: &str = r#"{"id":"cmpl-1","choices":[{"text":"ok"}]}"#;
pub(crate) const PROCESSOR_PW: &str = "proc-Pw-93ff1c";
pub(crate) const PRODUCER_PW: &str = "prod-Pw-51ac2e";
pub(crate) const ADMIN_PW: &str = "admin-Pw-77d0aa";

/// The ACL rules exactly as README.md gives them (as `ACL` arguments), passwords filled in.
pub(crate) fn readme_rules() -> Vec<Vec<String>> {
    let rules: Vec<Vec<String>> = include_str!("../../../../README.md")
        .lines()
        .filter(|l| l.starts_with("ACL SETUSER inferq-"))
        .map(|l| {
            l.replace("<processor-password>", PROCESSOR_PW)
                .replace("<producer-password>", PRODUCER_PW)
                .split_whitespace()
                .skip(1)
                .map(str::to_owned)
                .collect()
        })
        .collect();
    assert_eq!(
        rules.len(),
        3,
        "README.md gives the processor's and the producer's rule, and the redis-pubsub \
         processor's"
    );
    rules
}

pub(crate) fn url(user: &str, pw: &str, port: u16) -> String {
    format!("redis://{user}:{pw}@127.0.0.1:{port}/")
}

pub(crate) async fn manager(url: &str) -> ConnectionManager {
    let client = redis::Client::open(url).unwrap();
    inferq_client::connect::manager(&client).await.unwrap()
}

/// A Redis with README's two users, an `admin` user for the test, and `default` switched off.
/// Returns the server and an admin connection.
pub(crate) async fn acl_redis() -> (RedisServer, ConnectionManager) {
    let redis = RedisServer::start().unwrap();
    let mut con = manager(&redis.url()).await;
    for rule in readme_rules() {
        let _: () = redis::cmd("ACL")
            .arg(&rule)
            .query_async(&mut con)
            .await
            .unwrap_or_else(|e| panic!("README rule {rule:?} refused: {e}"));
    }
    let admin_rule = [
        "SETUSER",
        "admin",
        "on",
        &format!(">{ADMIN_PW}"),
        "~*",
        "&*",
        "+@all",
    ];
    acl(&mut con, &admin_rule).await;
    let mut admin = manager(&url("admin", ADMIN_PW, redis.port())).await;
    acl(&mut admin, &["SETUSER", "default", "off"]).await;
    acl(&mut admin, &["LOG", "RESET"]).await;
    (redis, admin)
}

/// Runs `ACL args…` (say `SETUSER name rule…`) on an admin connection; panics if refused.
pub(crate) async fn acl(admin: &mut ConnectionManager, args: &[&str]) {
    let _: () = redis::cmd("ACL")
        .arg(args)
        .query_async(admin)
        .await
        .unwrap_or_else(|e| panic!("ACL {args:?} refused: {e}"));
}

/// Everything Redis refused to an ACL user since the last reset.
pub(crate) async fn acl_denials(admin: &mut ConnectionManager) -> Vec<String> {
    let log: Vec<redis::Value> = redis::cmd("ACL")
        .arg("LOG")
        .query_async(admin)
        .await
        .unwrap();
    log.iter().map(|entry| format!("{entry:?}")).collect()
}

/// A transport config for one queue.
pub(crate) fn transport(
    redis_url: &str,
    gateway: &str,
    lease_s: f64,
    max_deliveries: u32,
    extra: &str,
) -> String {
    format!(
        r#"{{"url":"{redis_url}","poll_interval_ms":50,"batch_size":10,"claim_lease_ttl_seconds":{lease_s},"claim_reclaim_interval_ms":300,"max_deliveries":{max_deliveries},"queues":[{{"queue_name":"{Q}","igw_base_url":"{gateway}"{extra}}}]}}"#
    )
}

/// `inferq run` as a child process; unlike the shared harness it does not wait to be ready,
/// so tests can watch a processor that cannot start.
pub(crate) struct Proc {
    child: Option<Child>,
    health: u16,
    log: tempfile::NamedTempFile,
}

impl Proc {
    pub(crate) fn spawn(transport: &str, extra: &[&str]) -> Proc {
        Self::spawn_as("redis-sortedset", transport, extra)
    }

    /// [`Proc::spawn`] with another `--transport` (`redis-pubsub`). A processor that finds a
    /// port of its own taken (by another test process, between `free_port` and its bind) is
    /// started again on new ports; it binds them before it logs "inferq starting".
    pub(crate) fn spawn_as(kind: &str, transport: &str, extra: &[&str]) -> Proc {
        Self::spawn_with_env(kind, transport, extra, &[])
    }

    /// [`Proc::spawn_as`] with these environment variables set (`Some`) or removed (`None`).
    pub(crate) fn spawn_with_env(
        kind: &str,
        transport: &str,
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Proc {
        for _ in 0..3 {
            let mut p = Self::spawn_once(kind, transport, extra, env);
            let started = Instant::now();
            loop {
                let exited = p.child.as_mut().and_then(|c| c.try_wait().unwrap());
                let log = p.log();
                if exited.is_some() && port_taken(&log) {
                    break;
                }
                if exited.is_some()
                    || log.contains("inferq starting")
                    || started.elapsed() > Duration::from_secs(10)
                {
                    return p;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        panic!("three processors in a row found their ports taken");
    }

    fn spawn_once(
        kind: &str,
        transport: &str,
        extra: &[&str],
        env: &[(&str, Option<&str>)],
    ) -> Proc {
        let health = free_port().unwrap();
        let metrics = free_port().unwrap();
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_inferq"));
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let child = command
            .arg("run")
            .args(["--transport", kind, "--transport-config", transport])
            .args(["--health-port", &health.to_string()])
            .args(["--metrics-port", &metrics.to_string()])
            .args(["--metrics-endpoint-auth=false", "--concurrency", "8"])
            .args(["--drain-timeout", "1s", "--request-timeout", "30s"])
            .args(extra)
            .env_remove("REDIS_URL")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.reopen().unwrap())
            .stderr(log.reopen().unwrap())
            .spawn()
            .unwrap();
        Proc {
            child: Some(child),
            health,
            log,
        }
    }

    /// `/readyz`: status and body (`None` while the server is not up).
    pub(crate) async fn readyz(&self) -> Option<(u16, String)> {
        let r = reqwest::get(format!("http://127.0.0.1:{}/readyz", self.health))
            .await
            .ok()?;
        let status = r.status().as_u16();
        Some((status, r.text().await.unwrap_or_default()))
    }

    pub(crate) async fn wait_ready(&self) {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if matches!(self.readyz().await, Some((200, _))) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("processor not ready; log:\n{}", self.log());
    }

    /// Waits until `/readyz` is 503 with an error naming what start-up is stuck on.
    pub(crate) async fn wait_not_ready_because(&self) -> String {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Some((503, body)) = self.readyz().await {
                if body.contains("\"error\"") {
                    return body;
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("/readyz never named a problem; log:\n{}", self.log());
    }

    pub(crate) fn log(&self) -> String {
        let mut s = String::new();
        let _ = std::fs::File::open(self.log.path()).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub(crate) fn terminate(&self) {
        if let Some(c) = &self.child {
            let status = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()
                .unwrap();
            assert!(status.success());
        }
    }

    pub(crate) async fn wait_exit(&mut self, limit: Duration) -> Option<i32> {
        let started = Instant::now();
        while started.elapsed() < limit {
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(status)) = c.try_wait() {
                    self.child = None;
                    return status.code();
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- processor log ---\n{}", self.log());
        }
        self.kill();
    }
}

pub(crate) fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub(crate) fn parse_results(out: &Output) -> Vec<ResultMessage> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect()
}

pub(crate) fn submit_lines(ids: &[&str]) -> String {
    ids.iter()
        .map(|id| {
            format!("{{\"id\":\"{id}\",\"timeout_s\":120,\"payload\":{{\"prompt\":\"hi\"}}}}\n")
        })
        .collect()
}

/// Results on the default list, by id (read by an admin connection, without taking them).
pub(crate) async fn results_by_id(
    admin: &mut ConnectionManager,
) -> BTreeMap<String, ResultMessage> {
    let raw: Vec<String> = admin.lrange("result-list", 0, -1).await.unwrap();
    raw.iter()
        .map(|r| serde_json::from_str::<ResultMessage>(r).unwrap())
        .map(|r| (r.id.clone(), r))
        .collect()
}

pub(crate) async fn wait_result(
    admin: &mut ConnectionManager,
    id: &str,
    limit: Duration,
) -> ResultMessage {
    let started = Instant::now();
    loop {
        if let Some(r) = results_by_id(admin).await.remove(id) {
            return r;
        }
        assert!(
            started.elapsed() < limit,
            "no result for {id} within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A private CA, a second CA nobody trusts, a server certificate for 127.0.0.1 / localhost and
/// a client certificate, all made with the `openssl` command line.
pub(crate) struct Certs {
    dir: tempfile::TempDir,
}

impl Certs {
    pub(crate) fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let certs = Certs { dir };
        certs.ca("ca");
        certs.ca("other-ca");
        certs.leaf(
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        certs.leaf("client", "extendedKeyUsage=clientAuth\n");
        certs.self_signed("self-signed");
        certs
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The path as a string, for command lines.
    pub(crate) fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    pub(crate) fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("the openssl command line is needed to make test certificates");
        assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
    }

    pub(crate) fn ca(&self, name: &str) {
        self.req_x509(name, &[]);
    }

    /// `openssl req -x509`: a self-signed certificate `name.crt` and its key `name.key`, with
    /// `extra` arguments.
    fn req_x509(&self, name: &str, extra: &[&str]) {
        let (key, crt, subject) = (
            format!("{name}.key"),
            format!("{name}.crt"),
            format!("/CN=inferq test {name}"),
        );
        let mut args = vec![
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &crt,
            "-days",
            "2",
            "-subj",
            &subject,
        ];
        args.extend_from_slice(extra);
        self.openssl(&args);
    }

    /// A server certificate for 127.0.0.1 / localhost signed by its own key, as a quick
    /// `openssl req -x509` makes it for a gateway: marked as a CA.
    pub(crate) fn self_signed(&self, name: &str) {
        self.req_x509(
            name,
            &["-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
        );
    }

    pub(crate) fn leaf(&self, name: &str, extensions: &str) {
        std::fs::write(self.path(&format!("{name}.ext")), extensions).unwrap();
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ]);
    }
}
