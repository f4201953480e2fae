//! `inferq-dev demo`: the whole system on one machine, in one command. It starts a real
//! `redis-server` (AOF, `appendfsync everysec`) in a data directory, the simulator gateway
//! in-process (realistic latency, a few injected 5xx and 429 answers so the retry path shows),
//! and `inferq run` (the production binary built beside this one) as a child process; then it submits N requests through
//! the producer, reads their results back with BRPOP, and prints what happened.
//!
//! Data enters as the demo flags. It leaves as the summary on standard output — throughput,
//! submit→result latency percentiles, outcomes by kind, retries (scraped from the processor's
//! `/metrics`), re-executions seen by the simulator, and the no-loss line — and as the exit code:
//! 0 when every request has its result and the processor drained and exited 0, 1 otherwise,
//! 130 when interrupted. Progress bars (on a terminal) and diagnostics go to standard error.
//!
//! Everything started here is owned by a guard (data directory, Redis, simulator, processor),
//! so an error, Ctrl-C, SIGTERM or SIGHUP stops it all: the processor gets SIGTERM and a few
//! seconds to drain before SIGKILL, Redis is killed, the temporary data directory is removed.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context};
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget};

use inferq::cli::submit::progress;
use inferq::cli::Failure;
use inferq_client::producer::{unix_ms, Popper, Producer, ProducerError};
use inferq_client::wire::{NewRequest, ResultMessage};
use inferq_sim::config::DEFAULT_MODEL_NAME;
use inferq_sim::{Sim, SimConfig, SimStats};
use inferq_testkit::{free_port, Fsync, RedisServer};

/// Names of one run's keys and request ids. Each run has its own request sorted set and result
/// list, so a reused `--data-dir` (whose AOF still holds an earlier run's unfinished requests
/// and unread results) cannot mix another run's work into this run's counts.
struct RunKeys {
    /// `demo-<unix ms>`: the prefix of every request id.
    tag: String,
    /// The request sorted set the producer and the processor share.
    queue: String,
    /// The result list.
    results: String,
}

impl RunKeys {
    fn new() -> RunKeys {
        let tag = format!("demo-{}", unix_ms());
        RunKeys {
            queue: format!("{tag}:requests"),
            results: format!("{tag}:results"),
            tag,
        }
    }
}

/// The processor counter of retries scheduled with a backoff.
const RETRIES_METRIC: &str = "llm_d_async_async_request_retries_total";
/// The processor counter of requests the gateway answered 429.
const SHED_METRIC: &str = "llm_d_async_async_shedded_requests_total";
/// How long the processor may take to answer `/readyz`.
const READY_LIMIT: Duration = Duration::from_secs(30);
/// How long the processor may take to drain and exit after SIGTERM at the end of a run.
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// How long a processor left behind by an error or an interrupt gets before SIGKILL.
const ABANDON_LIMIT: Duration = Duration::from_secs(5);
/// Exit code after SIGINT / SIGTERM / SIGHUP (128 + SIGINT, as shells report Ctrl-C).
pub(super) const EXIT_INTERRUPTED: u8 = 130;

#[derive(Debug, clap::Args)]
pub(crate) struct DemoArgs {
    /// Requests to submit.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
    pub requests: u64,
    /// Processor workers (`inferq run --concurrency`).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency: u32,
    /// Seconds each request may take: its deadline is its submission time plus this.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub timeout_s: u64,
    /// Seconds to wait for all results [default: --timeout-s + 30, when every request is past
    /// its deadline and must have a result].
    #[arg(long)]
    pub wait_s: Option<u64>,
    /// Requests per pipelined submission round trip.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Output tokens each request asks for (`max_tokens`).
    #[arg(long, default_value_t = 16)]
    pub max_tokens: u64,
    /// Simulator: probability that an admitted request fails with 500 or 503 (retried).
    #[arg(long, default_value_t = 0.02)]
    pub error_rate: f64,
    /// Simulator: probability that a request is refused with 429 (retried).
    #[arg(long, default_value_t = 0.01)]
    pub rate_limit_rate: f64,
    /// Simulator: time to first token, in milliseconds.
    #[arg(long, default_value_t = 20)]
    pub ttft_ms: u64,
    /// Simulator: decode time per output token, in milliseconds.
    #[arg(long, default_value_t = 1.0)]
    pub per_token_ms: f64,
    /// Simulator: random spread of each latency, as a fraction in [0, 1].
    #[arg(long, default_value_t = 0.2)]
    pub jitter: f64,
    /// Redis data directory, created if missing and never removed [default: a fresh temporary
    /// directory, removed at the end].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the temporary data directory (AOF, Redis and processor logs) and print its path.
    #[arg(long)]
    pub keep_data: bool,
}

impl DemoArgs {
    fn sim_config(&self) -> SimConfig {
        SimConfig {
            ttft_ms: self.ttft_ms,
            per_token_ms: self.per_token_ms,
            jitter: self.jitter,
            error_rate: self.error_rate,
            rate_limit_rate: self.rate_limit_rate,
            ..SimConfig::default()
        }
    }

    fn wait(&self) -> Duration {
        Duration::from_secs(self.wait_s.unwrap_or(self.timeout_s.saturating_add(30)))
    }
}

pub(crate) async fn demo(args: DemoArgs) -> Result<(), Failure> {
    let sim_config = args.sim_config();
    sim_config.validate().map_err(Failure::bad_input)?;
    // Dropping the run (on a signal) drops its guards, which stop what it started.
    tokio::select! {
        biased;
        signal = interrupted() => {
            tell!("inferq-dev demo: {signal}: stopping the processor, the simulator and Redis");
            Err(Failure {
                code: EXIT_INTERRUPTED,
                error: anyhow!("interrupted by {signal}"),
            })
        }
        outcome = run(args, sim_config) => outcome,
    }
}

/// Resolves when the demo is asked to stop; installs the handlers on first poll.
pub(super) async fn interrupted() -> &'static str {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
            signal(SignalKind::hangup()),
        ) {
            return tokio::select! {
                _ = int.recv() => "SIGINT",
                _ = term.recv() => "SIGTERM",
                _ = hup.recv() => "SIGHUP",
            };
        }
    }
    match tokio::signal::ctrl_c().await {
        Ok(()) => "Ctrl-C",
        Err(_) => std::future::pending().await,
    }
}

async fn run(args: DemoArgs, sim_config: SimConfig) -> Result<(), Failure> {
    // Declared in start order, so they drop in reverse: processor, simulator, Redis, directory.
    let data = DataDir::new(args.data_dir.as_deref(), args.keep_data)?;
    let redis = {
        let dir = data.path().to_owned();
        tokio::task::spawn_blocking(move || RedisServer::start_in(&dir, Fsync::EverySec))
            .await
            .context("starting redis-server")??
    };
    say!("inferq-dev demo");
    say!(
        "  redis      redis-server on 127.0.0.1:{}, AOF with appendfsync everysec, data in {}",
        redis.port(),
        data.path().display()
    );

    let sim = Sim::start(sim_config.clone(), ([127, 0, 0, 1], 0).into()).await?;
    say!(
        "  simulator  {}: ttft {} ms + {} ms/token × {} tokens, jitter {}%, 5xx rate {}%, 429 rate {}%",
        sim.base_url(),
        sim_config.ttft_ms,
        sim_config.per_token_ms,
        args.max_tokens,
        sim_config.jitter * 100.0,
        sim_config.error_rate * 100.0,
        sim_config.rate_limit_rate * 100.0,
    );

    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .context("cannot build an HTTP client")?;
    let keys = RunKeys::new();
    let mut processor = Processor::spawn(&redis.url(), &sim.base_url(), &keys, &args, data.path())?;
    let ready_after = processor.wait_ready(&http).await?;
    say!(
        "  processor  inferq run (pid {}), concurrency {}, ready after {:.2} s; health :{}, metrics :{}",
        processor.pid,
        args.concurrency,
        ready_after.as_secs_f64(),
        processor.health_port,
        processor.metrics_port
    );

    let producer = Producer::connect(&redis.url(), &keys.queue, &keys.results)
        .await
        .context("cannot connect to Redis")?;
    let popper = producer.popper().await.context("cannot connect to Redis")?;
    say!(
        "  load       {} requests, deadline +{} s, batches of {}; keys {} and {}",
        args.requests,
        args.timeout_s,
        args.batch,
        keys.queue,
        keys.results
    );
    say!();

    let draw = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        ProgressDrawTarget::stderr()
    } else {
        ProgressDrawTarget::hidden()
    };
    let bars = MultiProgress::with_draw_target(draw);
    let submitting = bars.add(progress(args.requests));
    submitting.set_message("submitting");
    let completing = bars.add(progress(args.requests));
    completing.set_message("completing");

    let book = Book::new(args.requests);
    let started = Instant::now();
    // One task, two halves: results are read while requests are still being submitted.
    let (submitted, collected) = tokio::try_join!(
        submit_all(&producer, &args, &keys.tag, &book, &submitting),
        collect(popper, &keys.tag, &book, &completing, started, args.wait()),
    )?;
    let wall = started.elapsed();

    let metrics = processor.scrape(&http).await;
    let exit = processor.stop().await;
    let executions = sim.executions();
    let sim_stats = sim.stats();
    sim.stop().await;

    let summary = Summary {
        submitted,
        collected,
        wall,
        metrics,
        executions,
        sim_stats,
        exit,
    };
    let verdict = summary.print(&book);
    if data.kept() {
        say!(
            "data kept in {} (redis.log, processor.log, appendonlydir/)",
            data.path().display()
        );
    }
    if let Err(e) = &summary.exit {
        processor.print_log_tail();
        return Err(Failure::from(anyhow!(
            "the processor did not stop cleanly: {e:#}"
        )));
    }
    verdict
}

/// The demo's data directory: the caller's (kept) or a fresh temporary one (removed on drop
/// unless `--keep-data`).
struct DataDir {
    path: PathBuf,
    /// Holds a temporary directory so that dropping it removes it.
    _temp: Option<tempfile::TempDir>,
    kept: bool,
}

impl DataDir {
    fn new(given: Option<&Path>, keep: bool) -> Result<DataDir, Failure> {
        if let Some(path) = given {
            std::fs::create_dir_all(path)
                .with_context(|| format!("cannot create --data-dir {}", path.display()))
                .map_err(Failure::bad_input)?;
            return Ok(DataDir {
                path: path.to_owned(),
                _temp: None,
                kept: true,
            });
        }
        let temp = tempfile::Builder::new()
            .prefix("inferq-demo-")
            .disable_cleanup(keep)
            .tempdir()
            .context("cannot create a temporary data directory")?;
        Ok(DataDir {
            path: temp.path().to_owned(),
            _temp: Some(temp),
            kept: keep,
        })
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn kept(&self) -> bool {
        self.kept
    }
}

/// `inferq run` as a child process of this binary, logging to `processor.log`. Dropped while
/// still running, it is sent SIGTERM and, after [`ABANDON_LIMIT`], SIGKILL.
struct Processor {
    child: Child,
    pid: u32,
    health_port: u16,
    metrics_port: u16,
    log: PathBuf,
}

impl Processor {
    fn spawn(
        redis_url: &str,
        gateway: &str,
        keys: &RunKeys,
        args: &DemoArgs,
        dir: &Path,
    ) -> Result<Processor, Failure> {
        let exe = inferq_testkit::inferq_binary()?;
        let health_port = free_port().context("no free port")?;
        let mut metrics_port = free_port().context("no free port")?;
        while metrics_port == health_port {
            metrics_port = free_port().context("no free port")?;
        }
        let transport = serde_json::json!({
            "url": redis_url,
            "poll_interval_ms": 50,
            "batch_size": 64,
            "result_queue_name": keys.results,
            "queues": [{"queue_name": keys.queue, "igw_base_url": gateway}],
        });
        let log = dir.join("processor.log");
        let out = File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let mut command = Command::new(exe);
        command
            .arg("run")
            .args(["--transport", "redis-sortedset"])
            .arg("--transport-config")
            .arg(transport.to_string())
            .args(["--health-port", &health_port.to_string()])
            .args(["--metrics-port", &metrics_port.to_string()])
            .arg("--metrics-endpoint-auth=false")
            .args(["--concurrency", &args.concurrency.to_string()])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        // Its own process group: a Ctrl-C at the terminal reaches only the demo, which then
        // sends the processor one SIGTERM (a second signal would make it exit without draining).
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            command.process_group(0);
            // Started through /proc/self/exe: show a readable name in `ps`.
            command.arg0("inferq");
        }
        let child = command
            .spawn()
            .context("cannot start the processor (inferq run)")?;
        Ok(Processor {
            pid: child.id(),
            child,
            health_port,
            metrics_port,
            log,
        })
    }

    /// Waits for `/readyz` to answer 200; fails if the processor exits first.
    async fn wait_ready(&mut self, http: &reqwest::Client) -> Result<Duration, Failure> {
        let url = format!("http://127.0.0.1:{}/readyz", self.health_port);
        let started = Instant::now();
        while started.elapsed() < READY_LIMIT {
            if let Some(status) = self.child.try_wait()? {
                self.print_log_tail();
                return Err(Failure::from(anyhow!(
                    "the processor exited before it was ready ({status})"
                )));
            }
            if let Ok(resp) = http.get(&url).send().await {
                if resp.status() == reqwest::StatusCode::OK {
                    return Ok(started.elapsed());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.print_log_tail();
        Err(Failure::from(anyhow!(
            "the processor did not answer {url} with 200 within {} s",
            READY_LIMIT.as_secs()
        )))
    }

    /// The processor's `/metrics` text.
    async fn scrape(&self, http: &reqwest::Client) -> Result<String, String> {
        let url = format!("http://127.0.0.1:{}/metrics", self.metrics_port);
        let resp = http.get(&url).send().await.map_err(|e| e.to_string())?;
        resp.text().await.map_err(|e| e.to_string())
    }

    /// Sends SIGTERM while the child is not yet reaped (so its pid cannot have been reused).
    fn terminate(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        // The signal goes by the kill(2) call itself, not a `kill` program: a minimal image
        // (the demo image's Debian minbase) has none.
        let pid = i32::try_from(self.pid)
            .ok()
            .and_then(rustix::process::Pid::from_raw);
        let sent = pid.map(|pid| rustix::process::kill_process(pid, rustix::process::Signal::TERM));
        if matches!(sent, Some(Ok(()))) {
            return;
        }
        let _ = self.child.kill();
    }

    /// SIGTERM, then waits for the graceful drain; SIGKILL after [`STOP_LIMIT`].
    async fn stop(&mut self) -> Result<ExitStatus, anyhow::Error> {
        self.terminate();
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait()? {
                return if status.success() {
                    Ok(status)
                } else {
                    Err(anyhow!("it exited with {status}"))
                };
            }
            if started.elapsed() >= STOP_LIMIT {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return Err(anyhow!(
                    "still running {} s after SIGTERM; killed",
                    STOP_LIMIT.as_secs()
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn print_log_tail(&self) {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        tell!("--- last lines of {} ---", self.log.display());
        for line in &lines[lines.len().saturating_sub(20)..] {
            tell!("{line}");
        }
        tell!("---");
    }
}

impl Drop for Processor {
    fn drop(&mut self) {
        if !matches!(self.child.try_wait(), Ok(None)) {
            return;
        }
        self.terminate();
        let started = Instant::now();
        while started.elapsed() < ABANDON_LIMIT {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// When each request was submitted, and how many results to wait for. Shared by the submitting
/// and the collecting halves of the run, which take turns on one task.
struct Book {
    submitted_at: Mutex<HashMap<String, Instant>>,
    /// Results to wait for: the requests asked for, less those the producer refused.
    expected: Cell<u64>,
}

impl Book {
    fn new(requests: u64) -> Book {
        Book {
            submitted_at: Mutex::new(HashMap::new()),
            expected: Cell::new(requests),
        }
    }

    fn map(&self) -> MutexGuard<'_, HashMap<String, Instant>> {
        self.submitted_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, id: &str, at: Instant) {
        self.map().insert(id.to_owned(), at);
    }

    fn submitted_at(&self, id: &str) -> Option<Instant> {
        self.map().get(id).copied()
    }

    fn forget(&self, id: &str) {
        self.map().remove(id);
        self.expected.set(self.expected.get().saturating_sub(1));
    }

    fn ids(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }
}

/// What submission did.
struct Submitted {
    accepted: u64,
    refused: u64,
}

fn request_id(tag: &str, i: u64) -> String {
    format!("{tag}-{i:06}")
}

async fn submit_all(
    producer: &Producer,
    args: &DemoArgs,
    tag: &str,
    book: &Book,
    bar: &ProgressBar,
) -> Result<Submitted, Failure> {
    let mut out = Submitted {
        accepted: 0,
        refused: 0,
    };
    let mut next = 0u64;
    while next < args.requests {
        let end = next.saturating_add(args.batch).min(args.requests);
        let now_s = unix_ms() / 1000;
        let deadline = now_s.saturating_add(i64::try_from(args.timeout_s).unwrap_or(i64::MAX));
        let mut batch = Vec::new();
        for i in next..end {
            let payload = serde_json::value::to_raw_value(&serde_json::json!({
                "model": DEFAULT_MODEL_NAME,
                "prompt": format!("Demo request {i}: write a haiku about durable queues."),
                "max_tokens": args.max_tokens,
            }))?;
            batch.push(NewRequest::new(request_id(tag, i), deadline, payload).with_created(now_s));
        }
        // Stamped before the round trip, so no result can arrive before its stamp.
        let at = Instant::now();
        for r in &batch {
            book.record(&r.id, at);
        }
        let ids: Vec<String> = batch.iter().map(|r| r.id.clone()).collect();
        let outcomes = producer.submit_many(batch).await.context("submit failed")?;
        for (id, outcome) in ids.iter().zip(outcomes) {
            match outcome {
                Ok(_) => out.accepted += 1,
                Err(e) => {
                    out.refused += 1;
                    book.forget(id);
                    bar.suspend(|| tell!("inferq-dev demo: {id} refused: {e}"));
                }
            }
        }
        bar.inc(end - next);
        next = end;
    }
    bar.finish();
    Ok(out)
}

/// What came back on the result list.
struct Collected {
    /// Submit→result latency of each request of this run.
    latencies: Vec<Duration>,
    /// When each result arrived, from the first submission, in arrival order.
    arrivals: Vec<Duration>,
    /// Results by kind: `HTTP <status>` or the `error_code`.
    outcomes: BTreeMap<String, u64>,
    /// HTTP 200 results, to compare with the simulator's 200 answers.
    http_200: u64,
    /// Ids of this run with a result.
    seen: HashSet<String>,
    /// Second (or later) results for an id already seen.
    duplicate_results: u64,
    /// Results that are not of this run's requests, or that do not parse (there should be
    /// none: the result list is this run's own).
    strays: u64,
}

async fn collect(
    mut popper: Popper,
    tag: &str,
    book: &Book,
    bar: &ProgressBar,
    started: Instant,
    wait: Duration,
) -> Result<Collected, Failure> {
    let mut out = Collected {
        latencies: Vec::new(),
        arrivals: Vec::new(),
        outcomes: BTreeMap::new(),
        http_200: 0,
        seen: HashSet::new(),
        duplicate_results: 0,
        strays: 0,
    };
    let prefix = format!("{tag}-");
    while (out.seen.len() as u64) < book.expected.get() {
        let left = wait.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        let slice = left
            .min(Duration::from_secs(1))
            .max(Duration::from_millis(10));
        let result = match popper.pop(slice).await {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(ProducerError::Redis(e)) => {
                return Err(Failure::from(anyhow!("reading results failed: {e}")))
            }
            Err(e) => {
                bar.suspend(|| tell!("inferq-dev demo: a result that does not parse: {e}"));
                out.strays += 1;
                continue;
            }
        };
        let now = Instant::now();
        let Some(at) = book
            .submitted_at(&result.id)
            .filter(|_| result.id.starts_with(&prefix))
        else {
            out.strays += 1;
            continue;
        };
        if !out.seen.insert(result.id.clone()) {
            out.duplicate_results += 1;
            continue;
        }
        out.latencies.push(now.saturating_duration_since(at));
        out.arrivals.push(now.saturating_duration_since(started));
        if result.status_code == 200 {
            out.http_200 += 1;
        }
        *out.outcomes.entry(kind(&result)).or_default() += 1;
        bar.inc(1);
    }
    bar.abandon();
    Ok(out)
}

fn kind(result: &ResultMessage) -> String {
    if result.status_code != 0 {
        format!("HTTP {}", result.status_code)
    } else if !result.error_code.is_empty() {
        result.error_code.clone()
    } else {
        "unknown".to_owned()
    }
}

/// Sums every sample of a counter in Prometheus / OpenMetrics text.
fn counter_sum(text: &str, name: &str) -> u64 {
    let mut sum = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let metric = series.split('{').next().unwrap_or_default();
        if metric == name {
            sum += value.trim().parse::<f64>().unwrap_or(0.0);
        }
    }
    // Counters are whole numbers; the cast saturates on nonsense.
    sum.round() as u64
}

/// The nearest-rank percentile of sorted samples.
fn percentile(sorted: &[Duration], p: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len()) - 1).copied()
}

fn rate(n: u64, over: Duration) -> f64 {
    if over.is_zero() {
        0.0
    } else {
        n as f64 / over.as_secs_f64()
    }
}

fn human(d: Option<Duration>) -> String {
    match d {
        None => "-".to_owned(),
        Some(d) if d < Duration::from_secs(1) => format!("{:.1} ms", d.as_secs_f64() * 1000.0),
        Some(d) => format!("{:.2} s", d.as_secs_f64()),
    }
}

/// Everything the summary reports, gathered once everything has stopped.
struct Summary {
    submitted: Submitted,
    collected: Collected,
    wall: Duration,
    metrics: Result<String, String>,
    executions: HashMap<String, u64>,
    sim_stats: SimStats,
    exit: Result<ExitStatus, anyhow::Error>,
}

impl Summary {
    /// Prints the table and the no-loss line; an error when any result is missing.
    fn print(&self, book: &Book) -> Result<(), Failure> {
        let c = &self.collected;
        let mut latencies = c.latencies.clone();
        latencies.sort_unstable();
        let results = c.seen.len() as u64;
        // First submission to the last result (or to giving up on the missing ones).
        let wall = self.wall;
        let row = |label: &str, value: String| say!("  {label:<24}{value}");

        say!("summary");
        row("requests", self.submitted.accepted.to_string());
        if self.submitted.refused > 0 {
            row("refused at submit", self.submitted.refused.to_string());
        }
        row("wall time", format!("{:.2} s", wall.as_secs_f64()));
        row(
            "throughput",
            format!(
                "{:.1} req/s overall; {}",
                rate(results, wall),
                match percentile(&c.arrivals, 0.90) {
                    Some(t90) => {
                        let n90 = c.arrivals.iter().filter(|&&a| a <= t90).count() as u64;
                        format!(
                            "{:.1} req/s until 90% of results were in ({}); the tail waits out retry backoffs",
                            rate(n90, t90),
                            human(Some(t90))
                        )
                    }
                    None => "no results".to_owned(),
                }
            ),
        );
        for (label, p) in [
            ("latency p50", 0.50),
            ("latency p90", 0.90),
            ("latency p99", 0.99),
        ] {
            row(label, human(percentile(&latencies, p)));
        }
        row("latency max", human(latencies.last().copied()));
        let mut first = true;
        for (k, n) in &c.outcomes {
            row(if first { "outcomes" } else { "" }, format!("{k}: {n}"));
            first = false;
        }
        if first {
            row("outcomes", "none".to_owned());
        }
        match &self.metrics {
            Ok(text) => row(
                "retries",
                format!(
                    "{} ({} after a 429), from the processor's {RETRIES_METRIC}",
                    counter_sum(text, RETRIES_METRIC),
                    counter_sum(text, SHED_METRIC)
                ),
            ),
            Err(e) => row("retries", format!("unknown: /metrics failed: {e}")),
        }
        let s = &self.sim_stats;
        let reruns: u64 = self.executions.values().map(|n| n.saturating_sub(1)).sum();
        let rerun_ids = self.executions.values().filter(|&&n| n > 1).count();
        let faulted = s.server_error + s.resets + s.hangs;
        row(
            "simulator",
            format!(
                "{} executions of {} ids; {} answered 200, {} injected 5xx, {} injected 429",
                s.executed,
                self.executions.len(),
                s.ok,
                s.server_error,
                s.too_many_requests
            ),
        );
        row(
            "ids run more than once",
            if reruns == 0 {
                "0".to_owned()
            } else if reruns <= faulted {
                format!("{rerun_ids} (every re-run follows an injected failure: {reruns} re-runs, {faulted} failed runs)")
            } else {
                format!(
                    "{rerun_ids} ({reruns} re-runs but only {faulted} failed runs: {} unexplained)",
                    reruns - faulted
                )
            },
        );
        row(
            "duplicate executions",
            format!(
                "{} (simulator 200 answers {} − HTTP 200 results {})",
                s.ok.saturating_sub(c.http_200),
                s.ok,
                c.http_200
            ),
        );
        if c.duplicate_results > 0 {
            row("duplicate results", c.duplicate_results.to_string());
        }
        if c.strays > 0 {
            row(
                "stray results",
                format!("{} (not of this run's requests; ignored)", c.strays),
            );
        }
        row(
            "processor exit",
            match &self.exit {
                Ok(status) => format!("{status} after SIGTERM (graceful drain)"),
                Err(e) => format!("FAILED: {e:#}"),
            },
        );
        say!();

        let missing = self.submitted.accepted.saturating_sub(results);
        if missing == 0 {
            say!(
                "no loss: {} submitted, {results} results, 0 missing",
                self.submitted.accepted
            );
            return Ok(());
        }
        say!(
            "LOSS: {} submitted, {results} results, {missing} missing",
            self.submitted.accepted
        );
        let mut absent: Vec<String> = book
            .ids()
            .into_iter()
            .filter(|id| !c.seen.contains(id))
            .collect();
        absent.sort();
        for id in absent.iter().take(10) {
            say!("  missing {id}");
        }
        Err(Failure::from(anyhow!(
            "{missing} of {} requests have no result",
            self.submitted.accepted
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_summed_across_label_sets() {
        // As the processor writes them: Go's 0.0.4 text, large counts in Go's float spelling.
        let text = "# HELP llm_d_async_async_request_retries_total y\n\
                    # TYPE llm_d_async_async_request_retries_total counter\n\
                    llm_d_async_async_request_retries_total{queue_id=\"a\"} 3\n\
                    llm_d_async_async_request_retries_total{queue_id=\"b\"} 1.5e+06\n\
                    llm_d_async_async_request_total{queue_id=\"a\"} 100\n";
        assert_eq!(counter_sum(text, RETRIES_METRIC), 1_500_003);
        assert_eq!(counter_sum(text, SHED_METRIC), 0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let ms: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&ms, 0.5), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&ms, 0.99), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&ms, 1.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&ms[..1], 0.5), Some(Duration::from_millis(1)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn outcome_kinds_name_status_or_error_code() {
        let ok = ResultMessage::http("a", 200, b"{}");
        assert_eq!(kind(&ok), "HTTP 200");
        let late = ResultMessage::error(
            "b",
            inferq_client::wire::ErrorCode::DeadlineExceeded,
            "late",
        );
        assert_eq!(kind(&late), "DEADLINE_EXCEEDED");
    }
}
