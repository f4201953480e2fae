//! Shared harness for the end-to-end tests: a real redis-server (from `inferq_testkit`), a
//! scriptable gateway (a real axum HTTP server in the test) that records what it received, and
//! `inferq run` as a child process of the built binary, which tests signal and kill.

#![allow(dead_code)]

pub(crate) mod go;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use inferq_client::producer::Producer;
use inferq_client::wire::{NewRequest, ResultMessage};
use inferq_testkit::{free_port, port_taken, RedisServer};
use redis::AsyncCommands;
use serde_json::value::RawValue;

/// What the gateway answers for one attempt.
#[derive(Clone, Debug)]
pub(crate) struct Reply {
    pub status: u16,
    pub body: String,
    pub headers: Vec<(String, String)>,
    pub delay: Duration,
}

impl Reply {
    pub(crate) fn ok(body: &str) -> Reply {
        Reply::status(200, body)
    }
    pub(crate) fn status(status: u16, body: &str) -> Reply {
        Reply {
            status,
            body: body.to_owned(),
            headers: Vec::new(),
            delay: Duration::ZERO,
        }
    }
    pub(crate) fn after(mut self, delay: Duration) -> Reply {
        self.delay = delay;
        self
    }
    pub(crate) fn header(mut self, k: &str, v: &str) -> Reply {
        self.headers.push((k.to_owned(), v.to_owned()));
        self
    }
}

/// One request the gateway received.
#[derive(Clone, Debug)]
pub(crate) struct Seen {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub at: Instant,
}

#[derive(Default)]
struct Script {
    /// Per request id: replies for successive attempts; the last one repeats.
    replies: HashMap<String, Vec<Reply>>,
    seen: HashMap<String, Vec<Seen>>,
    /// Attempts whose handler was dropped before answering (the client went away).
    aborted: HashMap<String, u32>,
}

/// A scriptable gateway on a free port.
#[derive(Clone)]
pub(crate) struct Gateway {
    script: Arc<Mutex<Script>>,
    pub addr: SocketAddr,
}

struct AbortWatch {
    script: Arc<Mutex<Script>>,
    id: String,
    done: bool,
}

impl Drop for AbortWatch {
    fn drop(&mut self) {
        if !self.done {
            *self
                .script
                .lock()
                .unwrap()
                .aborted
                .entry(self.id.clone())
                .or_default() += 1;
        }
    }
}

async fn handle(
    State(script): State<Arc<Mutex<Script>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let id = headers
        .get("x-inferq-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let reply = {
        let mut s = script.lock().unwrap();
        let seen = s.seen.entry(id.clone()).or_default();
        seen.push(Seen {
            path: uri.path().to_owned(),
            headers: headers.clone(),
            body: body.clone(),
            at: Instant::now(),
        });
        let attempt = seen.len() - 1;
        match s.replies.get(&id) {
            Some(list) if !list.is_empty() => list[attempt.min(list.len() - 1)].clone(),
            _ => Reply::ok(r#"{"id":"cmpl-1","choices":[{"text":"ok"}]}"#),
        }
    };
    let mut watch = AbortWatch {
        script: script.clone(),
        id,
        done: false,
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    watch.done = true;
    let mut response = (
        StatusCode::from_u16(reply.status).unwrap(),
        reply.body.clone(),
    )
        .into_response();
    for (k, v) in &reply.headers {
        response.headers_mut().insert(
            axum::http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
            v.parse().unwrap(),
        );
    }
    response
}

impl Gateway {
    pub(crate) async fn start() -> Gateway {
        let script = Arc::new(Mutex::new(Script::default()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(script.clone());
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Gateway { script, addr }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn script(&self, id: &str, replies: Vec<Reply>) {
        self.script
            .lock()
            .unwrap()
            .replies
            .insert(id.to_owned(), replies);
    }

    pub(crate) fn seen(&self, id: &str) -> Vec<Seen> {
        self.script
            .lock()
            .unwrap()
            .seen
            .get(id)
            .cloned()
            .unwrap_or_default()
    }

    /// Waits (up to `limit`) until the request `id` has reached the gateway.
    pub(crate) async fn wait_seen(&self, id: &str, limit: Duration) {
        let started = Instant::now();
        while self.seen(id).is_empty() && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits (up to `limit`) until `n` distinct requests have reached the gateway.
    pub(crate) async fn wait_executions(&self, n: usize, limit: Duration) {
        let started = Instant::now();
        while self.executions().len() < n && started.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The ids given, in the order their first attempt reached the gateway.
    pub(crate) fn first_served(&self, ids: &[String]) -> Vec<String> {
        let mut order: Vec<(Instant, String)> = ids
            .iter()
            .map(|id| (self.seen(id)[0].at, id.clone()))
            .collect();
        order.sort();
        order.into_iter().map(|(_, id)| id).collect()
    }

    pub(crate) fn aborted(&self, id: &str) -> u32 {
        self.script
            .lock()
            .unwrap()
            .aborted
            .get(id)
            .copied()
            .unwrap_or(0)
    }

    pub(crate) fn executions(&self) -> HashMap<String, usize> {
        self.script
            .lock()
            .unwrap()
            .seen
            .iter()
            .map(|(k, v)| (k.clone(), v.len()))
            .collect()
    }
}

/// Settings for one processor.
#[derive(Clone, Debug)]
pub(crate) struct ProcessorOpts {
    pub queue: String,
    pub lease_s: f64,
    pub reclaim_ms: u64,
    pub concurrency: u32,
    pub drain: &'static str,
    pub request_timeout: &'static str,
    pub extra_queue_fields: String,
    /// More fields of the transport config (`,"enable_tracing":true`).
    pub extra_transport_fields: String,
    /// A pool config file's JSON (`--pool-config-file`), when set.
    pub pools: Option<String>,
    /// More flags for `inferq run`.
    pub extra_args: Vec<String>,
    /// The Redis URL to give the processor instead of the server's plain one.
    pub redis_url: Option<String>,
    /// The transport's `poll_interval_ms`.
    pub poll_interval_ms: u64,
    /// The transport's `batch_size`.
    pub batch_size: u32,
    /// Flags that name the transport instead of `--transport`/`--transport-config` with the
    /// JSON above (a Go deployment's legacy flags).
    pub transport_args: Option<Vec<String>>,
    /// Environment variables for the processor.
    pub env: Vec<(String, String)>,
    /// Standard output and error are pipes whose reader is gone (as under `| head`), instead of
    /// the log file.
    pub closed_output: bool,
    /// `ulimit` arguments the processor starts under (`"-n 256"`), through `sh`.
    pub ulimit: Option<&'static str>,
}

impl Default for ProcessorOpts {
    fn default() -> Self {
        ProcessorOpts {
            queue: "request-sortedset".to_owned(),
            lease_s: 30.0,
            reclaim_ms: 5000,
            concurrency: 8,
            drain: "30s",
            request_timeout: "30s",
            extra_queue_fields: String::new(),
            extra_transport_fields: String::new(),
            pools: None,
            extra_args: Vec::new(),
            redis_url: None,
            poll_interval_ms: 50,
            batch_size: 10,
            transport_args: None,
            env: Vec::new(),
            closed_output: false,
            ulimit: None,
        }
    }
}

/// How a started processor's first 20 s went.
enum Start {
    Ready,
    /// Exited with this code.
    Exited(Option<i32>),
    /// Running, never ready.
    Silent,
}

/// `inferq run` as a child process.
pub(crate) struct Processor {
    child: Option<Child>,
    pub health_port: u16,
    pub metrics_port: u16,
    log: tempfile::NamedTempFile,
    _pools: tempfile::NamedTempFile,
}

impl Processor {
    pub(crate) async fn start(
        redis: &RedisServer,
        gateway: &Gateway,
        opts: &ProcessorOpts,
    ) -> Processor {
        Self::start_at(&redis.url(), gateway, opts).await
    }

    /// [`Processor::start`] against the Redis at `url` (a cluster's seed, a sentinel), unless
    /// `opts.redis_url` names another.
    pub(crate) async fn start_at(url: &str, gateway: &Gateway, opts: &ProcessorOpts) -> Processor {
        // A port found free can still be bound by another process before the processor binds
        // it; the processor then exits saying so, and is started again on new ports.
        for _ in 0..3 {
            let mut p = Self::spawn_at(url, gateway, opts);
            match p.wait_ready_or_exit().await {
                Start::Ready => return p,
                Start::Exited(_) if port_taken(&p.log()) => continue,
                Start::Exited(code) => panic!(
                    "processor exited ({code:?}) before it was ready; log:\n{}",
                    p.log()
                ),
                Start::Silent => panic!("processor not ready; log:\n{}", p.log()),
            }
        }
        panic!("three processors in a row found their ports taken");
    }

    /// Starts a processor without waiting for it to be ready (tests of an unready one use it
    /// directly).
    pub(crate) fn spawn(redis: &RedisServer, gateway: &Gateway, opts: &ProcessorOpts) -> Processor {
        Self::spawn_at(&redis.url(), gateway, opts)
    }

    /// [`Processor::spawn`] against the Redis at `url`.
    pub(crate) fn spawn_at(url: &str, gateway: &Gateway, opts: &ProcessorOpts) -> Processor {
        let health_port = free_port().unwrap();
        let metrics_port = free_port().unwrap();
        let config = format!(
            r#"{{"url":"{}","poll_interval_ms":{},"batch_size":{},"claim_lease_ttl_seconds":{},"claim_reclaim_interval_ms":{}{},"queues":[{{"queue_name":"{}","igw_base_url":"{}","inference_objective":"batch-obj"{}}}]}}"#,
            opts.redis_url.clone().unwrap_or_else(|| url.to_owned()),
            opts.poll_interval_ms,
            opts.batch_size,
            opts.lease_s,
            opts.reclaim_ms,
            opts.extra_transport_fields,
            opts.queue,
            gateway.url(),
            opts.extra_queue_fields
        );
        let log = tempfile::NamedTempFile::new().unwrap();
        let pools = tempfile::NamedTempFile::new().unwrap();
        let mut command = match opts.ulimit {
            Some(limit) => {
                let mut sh = Command::new("sh");
                sh.args([
                    "-c",
                    &format!("ulimit {limit} && exec \"$0\" \"$@\""),
                    env!("CARGO_BIN_EXE_inferq"),
                ]);
                sh
            }
            None => Command::new(env!("CARGO_BIN_EXE_inferq")),
        };
        command.arg("run");
        if let Some(json) = &opts.pools {
            std::fs::write(pools.path(), json).unwrap();
            command.arg("--pool-config-file").arg(pools.path());
        }
        command.args(&opts.extra_args);
        match &opts.transport_args {
            Some(args) => command.args(args),
            None => command.args([
                "--transport",
                "redis-sortedset",
                "--transport-config",
                &config,
            ]),
        };
        let child = command
            .args(["--health-port", &health_port.to_string()])
            .args(["--metrics-port", &metrics_port.to_string()])
            .args(["--metrics-endpoint-auth=false"])
            .args(["--concurrency", &opts.concurrency.to_string()])
            .args([
                "--drain-timeout",
                opts.drain,
                "--request-timeout",
                opts.request_timeout,
            ])
            .env("RUST_LOG", "info")
            .envs(opts.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null());
        let child = if opts.closed_output {
            let mut child = child
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            drop(child.stdout.take());
            drop(child.stderr.take());
            child
        } else {
            child
                .stdout(log.reopen().unwrap())
                .stderr(log.reopen().unwrap())
                .spawn()
                .unwrap()
        };
        Processor {
            child: Some(child),
            health_port,
            metrics_port,
            log,
            _pools: pools,
        }
    }

    /// Waits until `/readyz` says ready or the process exits, for at most 20 s.
    async fn wait_ready_or_exit(&mut self) -> Start {
        let url = format!("http://127.0.0.1:{}/readyz", self.health_port);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                return Start::Exited(status.code());
            }
            if let Ok(r) = reqwest::get(&url).await {
                if r.status().is_success() {
                    return Start::Ready;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Start::Silent
    }

    /// Waits until `/readyz` says ready (or panics after 20 s).
    pub(crate) async fn wait_ready(&self) {
        let url = format!("http://127.0.0.1:{}/readyz", self.health_port);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            if let Ok(r) = reqwest::get(&url).await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("processor not ready; log:\n{}", self.log());
    }

    pub(crate) fn log(&self) -> String {
        let mut s = String::new();
        let _ = std::fs::File::open(self.log.path()).and_then(|mut f| f.read_to_string(&mut s));
        s
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    pub(crate) fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGKILL: no shutdown of any kind.
    pub(crate) fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits for the process to exit; returns its exit code.
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

    pub(crate) async fn metrics(&self) -> String {
        reqwest::get(format!("http://127.0.0.1:{}/metrics", self.metrics_port))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The metrics once they contain every one of `series` (at most 10 s; then as they are,
    /// for the caller's assertion to show).
    pub(crate) async fn metrics_with(&self, series: &[&str]) -> String {
        let started = Instant::now();
        loop {
            let metrics = self.metrics().await;
            if series.iter().all(|s| metrics.contains(s))
                || started.elapsed() > Duration::from_secs(10)
            {
                return metrics;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- processor log ---\n{}", self.log());
        }
        self.kill();
    }
}

/// A request with a deadline `secs` from now.
pub(crate) fn request(id: &str, secs: i64, payload: &str) -> NewRequest {
    let now = inferq_client::producer::unix_ms() / 1000;
    NewRequest::new(
        id.to_owned(),
        now + secs,
        RawValue::from_string(payload.to_owned()).unwrap(),
    )
    .with_created(now)
}

pub(crate) async fn producer(redis: &RedisServer, queue: &str) -> Producer {
    Producer::connect(&redis.url(), queue, "result-list")
        .await
        .unwrap()
}

pub(crate) async fn con(redis: &RedisServer) -> redis::aio::ConnectionManager {
    let client = redis::Client::open(redis.url()).unwrap();
    inferq_client::connect::manager(&client).await.unwrap()
}

/// Raw result JSON strings on `list`, oldest first.
/// How many times Redis has run `command` (lower case; inside scripts too) since its statistics
/// were last reset (`INFO commandstats`).
pub(crate) async fn command_calls(con: &mut redis::aio::ConnectionManager, command: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(con)
        .await
        .unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

pub(crate) async fn raw_results(
    con: &mut redis::aio::ConnectionManager,
    list: &str,
) -> Vec<String> {
    let mut v: Vec<String> = con.lrange(list, 0, -1).await.unwrap();
    v.reverse();
    v
}

pub(crate) async fn results(con: &mut redis::aio::ConnectionManager) -> Vec<ResultMessage> {
    raw_results(con, "result-list")
        .await
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

/// Starts a processor with `opts`, has it serve the request `id` to its result, and stops it
/// with SIGTERM (it must exit 0): the stopped processor, for its log.
pub(crate) async fn one_request_then_stop(
    redis: &RedisServer,
    gateway: &Gateway,
    opts: &ProcessorOpts,
    id: &str,
) -> Processor {
    let mut p = Processor::start(redis, gateway, opts).await;
    producer(redis, &opts.queue)
        .await
        .submit(request(id, 60, r#"{"prompt":"a"}"#))
        .await
        .unwrap();
    let mut con = con(redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1, "no result for {id}; log:\n{}", p.log());
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(20)).await, Some(0));
    p
}

/// Waits until `n` results are on the default result list (or panics after `limit`).
/// The raw results on `list`, oldest first, once there are `n` (or `limit` has passed).
pub(crate) async fn wait_results_in(
    con: &mut redis::aio::ConnectionManager,
    list: &str,
    n: usize,
    limit: Duration,
) -> Vec<String> {
    let started = Instant::now();
    loop {
        let r = raw_results(con, list).await;
        if r.len() >= n || started.elapsed() > limit {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

pub(crate) async fn wait_results(
    con: &mut redis::aio::ConnectionManager,
    n: usize,
    limit: Duration,
) -> Vec<ResultMessage> {
    wait_results_in(con, "result-list", n, limit)
        .await
        .iter()
        .map(|r| serde_json::from_str(r).unwrap())
        .collect()
}

/// Runs an `inferq` subcommand with only the given environment for Redis.
pub(crate) fn cli(args: &[&str], env: &[(&str, &str)], stdin: &str) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_inferq"));
    command
        .args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDIS_TLS_CA_CERT")
        .env_remove("REDIS_TLS_CERT")
        .env_remove("REDIS_TLS_KEY")
        .env_remove("REDIS_MODE")
        .env_remove("REDIS_ADDRS")
        .env_remove("REDIS_MASTER_NAME");
    for (k, v) in env {
        command.env(k, v);
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A command that fails before reading its input (say, Redis refuses it) closes the pipe; its
    // exit status and output are what the caller checks, so a broken pipe here is not an error.
    if let Err(e) = child.stdin.take().unwrap().write_all(stdin.as_bytes()) {
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::BrokenPipe,
            "writing stdin: {e}"
        );
    }
    child.wait_with_output().unwrap()
}

/// Counts the commands clients send to a Redis (not those its scripts run), by lower-case name,
/// from a `MONITOR` started now: `MONITOR` marks a command a script ran `[<db> lua]`, where
/// `INFO commandstats` counts both alike.
pub(crate) struct ClientCommands {
    counts: Arc<Mutex<HashMap<String, u64>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl ClientCommands {
    pub(crate) async fn start(port: u16) -> ClientCommands {
        use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        stream.write_all(b"MONITOR\r\n").await.unwrap();
        let mut lines = tokio::io::BufReader::new(stream).lines();
        // "+OK" first: from then on every command is seen.
        lines.next_line().await.unwrap();
        let counts = Arc::new(Mutex::new(HashMap::new()));
        let into = counts.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Some((source, command)) = line.split_once("] \"") else {
                    continue;
                };
                if source.ends_with(" lua") {
                    continue;
                }
                let name = command.split('"').next().unwrap_or("").to_ascii_lowercase();
                *into.lock().unwrap().entry(name).or_insert(0) += 1;
            }
        });
        ClientCommands { counts, reader }
    }

    pub(crate) fn count(&self, name: &str) -> u64 {
        self.counts.lock().unwrap().get(name).copied().unwrap_or(0)
    }
}

impl Drop for ClientCommands {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// The p99 TTFT (ms) of the interactive answers of a run's `load*` phases, asserting at least
/// 30 of them (fewer make no p99).
pub(crate) fn load_ttft_p99(report: &inferq_sim::interactive::Report) -> f64 {
    use inferq_sim::interactive::Outcome;
    let mut ttft: Vec<f64> = report
        .samples
        .iter()
        .filter(|s| s.phase.starts_with("load") && s.outcome == Outcome::Ok)
        .filter_map(|s| s.ttft_ms)
        .collect();
    assert!(
        ttft.len() >= 30,
        "too few interactive answers: {}",
        ttft.len()
    );
    ttft.sort_by(f64::total_cmp);
    let rank = ((0.99 * ttft.len() as f64).ceil() as usize).clamp(1, ttft.len());
    ttft[rank - 1]
}
