//! A real Prometheus server for tests: the `prometheus` binary (`$INFERQ_PROMETHEUS`, else
//! `prometheus` on `PATH`; `scripts/ensure-prometheus.sh` unpacks Debian's package when there is
//! none) on a free loopback port, with its own temporary directory holding its config file and
//! TSDB. It scrapes the targets the test names at a short interval and evaluates the rule files
//! it is given, so a test can check what a query, a gate or an alert sees on live data.
//!
//! ```text
//! PrometheusServer::start(PrometheusConfig { jobs, scrape_interval, rule_files,
//!                                            evaluation_interval }).await   // ready on return
//! prom.url() -> "http://127.0.0.1:<port>"       // what --prometheus-url takes
//! prom.query("sum(up)").await -> Vec<Sample>     // an instant vector's samples
//! prom.wait_until_scraped("127.0.0.1:8080", limit).await   // up{instance=…} == 1
//! prom.alerts().await -> Vec<Alert>              // /api/v1/alerts
//! prom.rules().await -> Vec<RuleState>           // /api/v1/rules, alerting and recording
//! prom.wait_for_alert("Name", &["pending", "firing"], limit).await -> Alert
//! prom.log() -> String                           // its stdout and stderr
//! drop(prom)                                     // SIGKILL, the directory removed
//! ```
//!
//! Data enters as [`PrometheusConfig`] and PromQL text; it leaves as decoded samples, alerts and
//! rule states, or a [`PrometheusError`] carrying the tail of the server's log.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::{free_port, log_tail};

/// How long one HTTP call to the server may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a test Prometheus could not be started or asked.
#[derive(Debug, thiserror::Error)]
pub enum PrometheusError {
    #[error(
        "prometheus not found at {binary:?} ({error}): set INFERQ_PROMETHEUS to a prometheus \
         binary, put one on PATH, or run scripts/ensure-prometheus.sh (it unpacks Debian's \
         prometheus package and prints the path to export)"
    )]
    NotInstalled {
        binary: PathBuf,
        error: std::io::Error,
    },
    #[error("io error: {0}")]
    Io(#[from] std::io::Error),
    #[error("prometheus on port {port} exited ({status}) before it was ready; log:\n{log}")]
    Exited {
        port: u16,
        status: std::process::ExitStatus,
        log: String,
    },
    #[error("prometheus on port {port} was not ready within {secs} s; log:\n{log}")]
    NotReady { port: u16, secs: u64, log: String },
    #[error("GET {path} on prometheus: {error}")]
    Http { path: String, error: String },
    #[error("prometheus answered {path} with {answer}")]
    Answer { path: String, answer: String },
    #[error(
        "timed out after {secs} s waiting for {what}; last seen: {last}\nprometheus log:\n{log}"
    )]
    Timeout {
        what: String,
        secs: u64,
        last: String,
        log: String,
    },
}

/// One scrape job: its name (the `job` label, which alert rules may match on) and its targets.
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    pub name: String,
    /// `host:port` of each target.
    pub targets: Vec<String>,
    /// The page's path; `/metrics` by default.
    pub metrics_path: String,
}

impl ScrapeJob {
    /// A job scraping `/metrics` of each `host:port` in `targets`.
    pub fn new<I, S>(name: &str, targets: I) -> ScrapeJob
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        ScrapeJob {
            name: name.to_owned(),
            targets: targets.into_iter().map(Into::into).collect(),
            metrics_path: "/metrics".to_owned(),
        }
    }
}

/// What the server scrapes and evaluates.
#[derive(Debug, Clone)]
pub struct PrometheusConfig {
    pub jobs: Vec<ScrapeJob>,
    /// Every job's scrape interval (and timeout): short, so a test sees a change within a
    /// second.
    pub scrape_interval: Duration,
    /// Rule files loaded as they are (`rule_files:`).
    pub rule_files: Vec<PathBuf>,
    /// How often the rules are evaluated.
    pub evaluation_interval: Duration,
}

impl Default for PrometheusConfig {
    fn default() -> Self {
        PrometheusConfig {
            jobs: Vec::new(),
            scrape_interval: Duration::from_millis(250),
            rule_files: Vec::new(),
            evaluation_interval: Duration::from_millis(250),
        }
    }
}

/// One sample of an instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// One alert of `/api/v1/alerts`.
#[derive(Debug, Clone, Deserialize)]
pub struct Alert {
    pub labels: BTreeMap<String, String>,
    /// `pending` or `firing`.
    pub state: String,
}

impl Alert {
    /// The `alertname` label.
    pub fn name(&self) -> &str {
        self.labels.get("alertname").map_or("", String::as_str)
    }
}

/// One rule of `/api/v1/rules`, with how its last evaluation went.
#[derive(Debug, Clone, Deserialize)]
pub struct RuleState {
    pub name: String,
    /// `ok`, `err` or `unknown` (not evaluated yet).
    pub health: String,
    /// An alerting rule's state: `inactive`, `pending` or `firing` (none for a recording one).
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default, rename = "lastError")]
    pub last_error: Option<String>,
    /// When it was last evaluated, as Prometheus writes it (Go's zero time before the first).
    #[serde(default, rename = "lastEvaluation")]
    pub last_evaluation: Option<String>,
}

/// A prometheus child process on a free loopback port.
#[derive(Debug)]
pub struct PrometheusServer {
    port: u16,
    child: Option<Child>,
    /// Holds the config file, the TSDB and the log; removed on drop.
    dir: tempfile::TempDir,
    client: reqwest::Client,
}

/// The binary to run: `$INFERQ_PROMETHEUS` when set, else `prometheus` from `PATH`.
pub fn prometheus_binary() -> PathBuf {
    std::env::var_os("INFERQ_PROMETHEUS")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("prometheus"))
}

impl PrometheusServer {
    /// Starts [`prometheus_binary`] and returns once `/-/ready` answers 200. A port taken
    /// between its choice and the server's bind is retried on another.
    pub async fn start(config: PrometheusConfig) -> Result<PrometheusServer, PrometheusError> {
        Self::start_with(&prometheus_binary(), config).await
    }

    /// [`PrometheusServer::start`] with the given binary.
    pub async fn start_with(
        binary: &Path,
        config: PrometheusConfig,
    ) -> Result<PrometheusServer, PrometheusError> {
        let client = reqwest::Client::builder()
            .timeout(CALL_TIMEOUT)
            .build()
            .map_err(|e| PrometheusError::Http {
                path: String::new(),
                error: e.to_string(),
            })?;
        let mut last = None;
        for _ in 0..3 {
            let dir = tempfile::Builder::new().prefix("inferq-prom-").tempdir()?;
            let port = free_port()?;
            let mut server = PrometheusServer {
                port,
                child: None,
                dir,
                client: client.clone(),
            };
            server.spawn(binary, &config)?;
            match server.wait_ready().await {
                Ok(()) => return Ok(server),
                Err(e @ PrometheusError::Exited { .. })
                    if server.log().contains("address already in use") =>
                {
                    last = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(PrometheusError::NotReady {
            port: 0,
            secs: 0,
            log: String::new(),
        }))
    }

    fn spawn(&mut self, binary: &Path, config: &PrometheusConfig) -> Result<(), PrometheusError> {
        let config_path = self.dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config_text(config))?;
        let log = std::fs::File::create(self.log_path())?;
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{}", self.port))
            .arg("--log.level=info")
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|error| match error.kind() {
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied => {
                    PrometheusError::NotInstalled {
                        binary: binary.to_path_buf(),
                        error,
                    }
                }
                _ => PrometheusError::Io(error),
            })?;
        self.child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self) -> Result<(), PrometheusError> {
        let started = Instant::now();
        let url = format!("{}/-/ready", self.url());
        while started.elapsed() < READY_TIMEOUT {
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                self.child = None;
                return Err(PrometheusError::Exited {
                    port: self.port,
                    status,
                    log: self.log(),
                });
            }
            if let Ok(r) = self.client.get(&url).send().await {
                if r.status().is_success() {
                    return Ok(());
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(PrometheusError::NotReady {
            port: self.port,
            secs: READY_TIMEOUT.as_secs(),
            log: self.log(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The base URL, as `--prometheus-url` takes it.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("prometheus.log")
    }

    /// The tail of the server's log.
    pub fn log(&self) -> String {
        log_tail(&self.log_path(), 60)
    }

    /// GETs `/api/v1/<path>` with `params` and returns its `data`.
    async fn api(
        &self,
        path: &str,
        params: &[(&str, &str)],
    ) -> Result<serde_json::Value, PrometheusError> {
        let http = |error: String| PrometheusError::Http {
            path: path.to_owned(),
            error,
        };
        let response = self
            .client
            .get(format!("{}/api/v1/{path}", self.url()))
            .query(params)
            .send()
            .await
            .map_err(|e| http(e.to_string()))?;
        let body = response.bytes().await.map_err(|e| http(e.to_string()))?;
        let answer: ApiAnswer = serde_json::from_slice(&body).map_err(|e| {
            http(format!(
                "not an API answer ({e}): {}",
                String::from_utf8_lossy(&body)
            ))
        })?;
        match (answer.status.as_str(), answer.data) {
            ("success", Some(data)) => Ok(data),
            _ => Err(PrometheusError::Answer {
                path: path.to_owned(),
                answer: String::from_utf8_lossy(&body).into_owned(),
            }),
        }
    }

    /// Evaluates `promql` now; the result must be an instant vector.
    pub async fn query(&self, promql: &str) -> Result<Vec<Sample>, PrometheusError> {
        let data = self.api("query", &[("query", promql)]).await?;
        let bad = |why: &str| PrometheusError::Answer {
            path: format!("query {promql:?}"),
            answer: format!("{why}: {data}"),
        };
        let vector: Vector =
            serde_json::from_value(data.clone()).map_err(|e| bad(&e.to_string()))?;
        if vector.result_type != "vector" {
            return Err(bad("not an instant vector"));
        }
        vector
            .result
            .into_iter()
            .map(|s| {
                let value = parse_value(&s.value.1).ok_or_else(|| bad("a bad sample value"))?;
                Ok(Sample {
                    labels: s.metric,
                    value,
                })
            })
            .collect()
    }

    /// Waits until the target `host:port` has been scraped successfully (`up == 1`).
    pub async fn wait_until_scraped(
        &self,
        target: &str,
        limit: Duration,
    ) -> Result<(), PrometheusError> {
        let promql = format!("up{{instance=\"{target}\"}} == 1");
        self.wait_for_samples(&promql, limit).await.map(drop)
    }

    /// Waits until Prometheus has tried the target `host:port` once, whatever the outcome, and
    /// returns its `up` samples: what a test asserts about a target that may be down.
    pub async fn wait_until_tried(
        &self,
        target: &str,
        limit: Duration,
    ) -> Result<Vec<Sample>, PrometheusError> {
        self.wait_for_samples(&format!("up{{instance=\"{target}\"}}"), limit)
            .await
    }

    /// Waits until `promql` has at least one sample and returns them: a test that asserts on a
    /// query's samples waits for that very query, not for a neighbouring condition.
    pub async fn wait_for_samples(
        &self,
        promql: &str,
        limit: Duration,
    ) -> Result<Vec<Sample>, PrometheusError> {
        self.wait_for(&format!("samples of {promql}"), limit, || async {
            let samples = self.query(promql).await?;
            let seen = format!("{samples:?}");
            Ok(((!samples.is_empty()).then_some(samples), seen))
        })
        .await
    }

    /// The alerts that are pending or firing now.
    pub async fn alerts(&self) -> Result<Vec<Alert>, PrometheusError> {
        #[derive(Deserialize)]
        struct Alerts {
            alerts: Vec<Alert>,
        }
        let data = self.api("alerts", &[]).await?;
        let alerts: Alerts =
            serde_json::from_value(data.clone()).map_err(|e| PrometheusError::Answer {
                path: "alerts".to_owned(),
                answer: format!("{e}: {data}"),
            })?;
        Ok(alerts.alerts)
    }

    /// Every loaded rule, in file order, with its last evaluation's health.
    pub async fn rules(&self) -> Result<Vec<RuleState>, PrometheusError> {
        #[derive(Deserialize)]
        struct Groups {
            groups: Vec<Group>,
        }
        #[derive(Deserialize)]
        struct Group {
            rules: Vec<RuleState>,
        }
        let data = self.api("rules", &[]).await?;
        let groups: Groups =
            serde_json::from_value(data.clone()).map_err(|e| PrometheusError::Answer {
                path: "rules".to_owned(),
                answer: format!("{e}: {data}"),
            })?;
        Ok(groups.groups.into_iter().flat_map(|g| g.rules).collect())
    }

    /// Waits until every loaded rule has been evaluated `rounds` times from now on, and returns
    /// the rules as the last of those rounds left them: a test that asserts on rules' health, or
    /// that nothing fires over a quiet spell, waits for the evaluations it asserts on.
    pub async fn wait_for_evaluations(
        &self,
        rounds: usize,
        limit: Duration,
    ) -> Result<Vec<RuleState>, PrometheusError> {
        use std::collections::{BTreeMap, BTreeSet};
        // A round is seen as a new `lastEvaluation` stamp; the one read first may be older than
        // this call, so it does not count.
        let first: BTreeMap<String, Option<String>> = self
            .rules()
            .await?
            .into_iter()
            .map(|r| (r.name, r.last_evaluation))
            .collect();
        let seen: std::cell::RefCell<BTreeMap<String, BTreeSet<String>>> = Default::default();
        let (seen, first) = (&seen, &first);
        self.wait_for(
            &format!("{rounds} evaluations of every rule"),
            limit,
            || async move {
                let rules = self.rules().await?;
                let mut seen = seen.borrow_mut();
                for rule in &rules {
                    let stamp = rule.last_evaluation.clone().unwrap_or_default();
                    if rule.health != "unknown"
                        && first.get(&rule.name) != Some(&Some(stamp.clone()))
                    {
                        seen.entry(rule.name.clone()).or_default().insert(stamp);
                    }
                }
                let done = !rules.is_empty()
                    && rules
                        .iter()
                        .all(|r| seen.get(&r.name).is_some_and(|s| s.len() >= rounds));
                let counts = format!("{:?}", *seen);
                Ok((done.then_some(rules), counts))
            },
        )
        .await
    }

    /// Waits until an alert named `name` is in one of `states`, and returns it.
    pub async fn wait_for_alert(
        &self,
        name: &str,
        states: &[&str],
        limit: Duration,
    ) -> Result<Alert, PrometheusError> {
        self.wait_for(&format!("alert {name} {states:?}"), limit, || async {
            let alerts = self.alerts().await?;
            let found = alerts
                .iter()
                .find(|a| a.name() == name && states.contains(&a.state.as_str()))
                .cloned();
            Ok((found, format!("{alerts:?}")))
        })
        .await
    }

    /// Polls `check` (which answers what it found, if anything, and what it saw) every 100 ms
    /// until it finds something or `limit` has passed.
    async fn wait_for<T, F, Fut>(
        &self,
        what: &str,
        limit: Duration,
        mut check: F,
    ) -> Result<T, PrometheusError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<(Option<T>, String), PrometheusError>>,
    {
        let started = Instant::now();
        loop {
            let last = match check().await {
                Ok((Some(found), _)) => return Ok(found),
                Ok((None, seen)) => seen,
                Err(e) => e.to_string(),
            };
            if started.elapsed() >= limit {
                return Err(PrometheusError::Timeout {
                    what: what.to_owned(),
                    secs: limit.as_secs(),
                    last,
                    log: self.log(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[derive(Deserialize)]
struct ApiAnswer {
    status: String,
    data: Option<serde_json::Value>,
}

#[derive(Deserialize)]
struct Vector {
    #[serde(rename = "resultType")]
    result_type: String,
    result: Vec<VectorSample>,
}

#[derive(Deserialize)]
struct VectorSample {
    metric: BTreeMap<String, String>,
    /// `[unix time, "value"]`.
    value: (serde_json::Value, String),
}

/// A sample value as the API writes it (`"0.5"`, `"NaN"`, `"+Inf"`).
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        other => other.parse().ok(),
    }
}

/// Go's duration text for a [`Duration`] in whole milliseconds (`250ms`), as the config takes it.
fn prom_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis().max(1))
}

/// The `prometheus.yml` for `config`. Values are JSON strings, which YAML reads as they are.
fn config_text(config: &PrometheusConfig) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    let mut text = format!(
        "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {eval}\n",
        interval = prom_duration(config.scrape_interval),
        eval = prom_duration(config.evaluation_interval),
    );
    if !config.rule_files.is_empty() {
        text.push_str("rule_files:\n");
        for file in &config.rule_files {
            text.push_str(&format!("  - {}\n", quote(&path_text(file))));
        }
    }
    text.push_str("scrape_configs:\n");
    for job in &config.jobs {
        text.push_str(&format!(
            "  - job_name: {}\n    metrics_path: {}\n    static_configs:\n      - targets: [{}]\n",
            quote(&job.name),
            quote(&job.metrics_path),
            job.targets
                .iter()
                .map(|t| quote(t))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    text
}

/// An absolute path's text (a rule file named relative to the test's directory still loads from
/// the server's own).
fn path_text(path: &Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_jobs_rules_and_intervals() {
        let text = config_text(&PrometheusConfig {
            jobs: vec![ScrapeJob::new("router", ["127.0.0.1:1", "127.0.0.1:2"])],
            scrape_interval: Duration::from_millis(200),
            rule_files: vec![PathBuf::from("/nonexistent/rules.yaml")],
            evaluation_interval: Duration::from_secs(1),
        });
        assert_eq!(
            text,
            "global:\n  scrape_interval: 200ms\n  scrape_timeout: 200ms\n  evaluation_interval: 1000ms\n\
             rule_files:\n  - \"/nonexistent/rules.yaml\"\n\
             scrape_configs:\n  - job_name: \"router\"\n    metrics_path: \"/metrics\"\n    static_configs:\n      - targets: [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n"
        );
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert!(parse_value("NaN").is_some_and(f64::is_nan));
        assert_eq!(parse_value("x"), None);
    }

    /// A missing binary is an error naming the variable and the script.
    #[tokio::test]
    async fn a_missing_binary_names_the_way_to_get_one() {
        let missing = Path::new("/nonexistent/prometheus");
        let err = PrometheusServer::start_with(missing, PrometheusConfig::default())
            .await
            .expect_err("no server from a missing binary");
        let text = err.to_string();
        assert!(
            text.contains("INFERQ_PROMETHEUS") && text.contains("scripts/ensure-prometheus.sh"),
            "{text}"
        );
    }

    /// A page served on a free port, the same text to every GET, until the test ends.
    fn serve_page(text: &'static str) -> String {
        use std::io::{Read, Write};
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        std::thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf);
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}",
                    text.len()
                );
            }
        });
        addr
    }

    /// The real server scrapes a page, answers a query over it, evaluates a rule file and
    /// reports the alert it raises; an unreachable target reads `up == 0`.
    #[tokio::test]
    async fn scrapes_queries_and_raises_alerts() {
        let page = serve_page("# TYPE demo_gauge gauge\ndemo_gauge{pool=\"a\"} 0.75\n");
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yaml");
        std::fs::write(
            &rules,
            "groups:\n  - name: t\n    rules:\n      - alert: DemoHigh\n        expr: demo_gauge > 0.5\n      - alert: DemoSlow\n        expr: demo_gauge > 0.5\n        for: 1h\n      - alert: DemoLow\n        expr: demo_gauge < 0.5\n",
        )
        .unwrap();
        let dead = format!("127.0.0.1:{}", crate::free_port().unwrap());
        let prom = PrometheusServer::start(PrometheusConfig {
            jobs: vec![
                ScrapeJob::new("page", [page.as_str()]),
                ScrapeJob::new("dead", [dead.as_str()]),
            ],
            rule_files: vec![rules],
            ..PrometheusConfig::default()
        })
        .await
        .unwrap();
        prom.wait_until_scraped(&page, Duration::from_secs(10))
            .await
            .unwrap();
        let samples = prom.query("demo_gauge").await.unwrap();
        assert_eq!(samples.len(), 1, "{samples:?}");
        assert_eq!(samples[0].value, 0.75);
        assert_eq!(samples[0].labels.get("pool").map(String::as_str), Some("a"));
        assert_eq!(
            samples[0].labels.get("job").map(String::as_str),
            Some("page")
        );
        let firing = prom
            .wait_for_alert("DemoHigh", &["firing"], Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(firing.labels.get("pool").map(String::as_str), Some("a"));
        prom.wait_for_alert("DemoSlow", &["pending"], Duration::from_secs(10))
            .await
            .unwrap();
        let alerts = prom.alerts().await.unwrap();
        assert!(alerts.iter().all(|a| a.name() != "DemoLow"), "{alerts:?}");
        let rules = prom.rules().await.unwrap();
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["DemoHigh", "DemoSlow", "DemoLow"]);
        assert!(rules.iter().all(|r| r.health == "ok"), "{rules:?}");
        // The dead target is scraped on its own schedule, not the page's: wait for its first
        // try, then assert what it found.
        let up = prom
            .wait_until_tried(&dead, Duration::from_secs(10))
            .await
            .unwrap();
        assert_eq!(up.iter().map(|s| s.value).collect::<Vec<_>>(), [0.0]);
    }
}
