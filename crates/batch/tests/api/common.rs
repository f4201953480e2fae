//! A whole Batch API deployment for tests, from real parts: a `redis-server` (AOF, fsync
//! always) on a free port, the simulator gateway, `inferq run` processors and `inferq
//! batch-api` replicas as child processes on free ports, sharing one files folder. Each part
//! can be SIGKILLed and started again.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inferq_sim::{Sim, SimConfig};
use inferq_testkit::{free_port, inferq_binary, RedisServer};

pub(crate) type Fallible<T = ()> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

pub(crate) struct Deployment {
    pub redis: RedisServer,
    pub sim: Sim,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub processors: Vec<Child>,
    pub replicas: Vec<(Child, u16)>,
    pub extra_flags: Vec<String>,
    pub processor_flags: Vec<String>,
    /// Replaces `--files-dir <dir>` (e.g. `--files-url s3://…`).
    pub store_flags: Option<Vec<String>>,
    pub replica_env: Vec<(String, String)>,
}

impl Deployment {
    /// Redis, a simulator with `ttft_ms` latency, and the config; no processes yet.
    pub(crate) async fn start(ttft_ms: u64) -> Fallible<Deployment> {
        let redis = RedisServer::start()?;
        let cfg = SimConfig {
            ttft_ms,
            ..SimConfig::default()
        };
        let sim = Sim::start(cfg, "127.0.0.1:0".parse::<SocketAddr>()?).await?;
        let dir = tempfile::tempdir()?;
        let config = dir.path().join("transport.json");
        std::fs::write(
            &config,
            serde_json::json!({
                "url": redis.url(),
                "poll_interval_ms": 50,
                "batch_size": 100,
                "queues": [{"queue_name": "batch-q", "igw_base_url": sim.base_url()}],
            })
            .to_string(),
        )?;
        Ok(Deployment {
            redis,
            sim,
            dir,
            config,
            processors: Vec::new(),
            replicas: Vec::new(),
            extra_flags: Vec::new(),
            processor_flags: Vec::new(),
            store_flags: None,
            replica_env: Vec::new(),
        })
    }

    /// Points the processors and replicas at another Redis: `fields` (`url`, `mode`, `addrs`)
    /// replace the standalone server's in the transport config.
    pub(crate) fn point_at(&self, fields: serde_json::Value) -> Fallible {
        let mut config = serde_json::json!({
            "poll_interval_ms": 50,
            "batch_size": 100,
            "queues": [{"queue_name": "batch-q", "igw_base_url": self.sim.base_url()}],
        });
        if let (Some(c), Some(f)) = (config.as_object_mut(), fields.as_object()) {
            c.extend(f.clone());
        }
        std::fs::write(&self.config, config.to_string())?;
        Ok(())
    }

    /// Writes an API keys file (`{"<key>": "<tenant>", …}`) and passes it to the replicas
    /// started after, in place of any extra flags.
    pub(crate) fn keys(&mut self, keys: &str) -> Fallible {
        let path = self.dir.path().join("keys.json");
        std::fs::write(&path, keys)?;
        self.extra_flags = vec!["--api-keys-file".into(), path.display().to_string()];
        Ok(())
    }

    /// Runs an `openai` SDK script of `tests/api` against the first two replicas, with `env`
    /// (the tenants' keys), and checks it passed. The SDK comes from the venv
    /// `scripts/ensure-openai.sh` makes; `$INFERQ_PYTHON` names its python.
    pub(crate) async fn run_sdk(&self, script: &str, env: &[(&str, &str)]) -> Fallible {
        self.sdk_output(script, env).await.map(|_| ())
    }

    /// [`Deployment::run_sdk`], giving the script's standard output.
    pub(crate) async fn sdk_output(&self, script: &str, env: &[(&str, &str)]) -> Fallible<String> {
        let python = std::env::var("INFERQ_PYTHON").map_err(|_| {
            "INFERQ_PYTHON is not set: run scripts/test.sh, or `export INFERQ_PYTHON=$(scripts/ensure-openai.sh)`"
        })?;
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/api")
            .join(script);
        let out = tokio::process::Command::new(python)
            .arg(script)
            .env(
                "INFERQ_BATCH_URLS",
                format!("{},{}", self.url(0), self.url(1)),
            )
            .envs(env.iter().copied())
            .output()
            .await?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the SDK checks failed:\n{stdout}\n{stderr}\n{}",
            self.logs()
        );
        assert!(stdout.contains("all SDK checks passed"), "{stdout}");
        Ok(stdout.into_owned())
    }

    /// The `/metrics` page of replica `i`.
    pub(crate) async fn metrics(&self, i: usize) -> Fallible<String> {
        let port = self.replicas[i].1;
        Ok(reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await?
            .text()
            .await?)
    }

    pub(crate) fn files_dir(&self) -> PathBuf {
        self.dir.path().join("files")
    }

    fn log(&self, name: &str) -> Fallible<std::fs::File> {
        Ok(std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(name))?)
    }

    /// Starts one more `inferq run`.
    pub(crate) fn add_processor(&mut self) -> Fallible {
        let n = self.processors.len();
        let child = Command::new(inferq_binary()?)
            .args([
                "run",
                "--transport",
                "redis-sortedset",
                "--transport-config-file",
            ])
            .arg(&self.config)
            .args([
                "--health-port",
                &free_port()?.to_string(),
                "--metrics-port",
                &free_port()?.to_string(),
            ])
            .args([
                "--metrics-endpoint-auth=false",
                "--claim-lease-ttl",
                "3s",
                "--claim-reclaim-interval",
                "1s",
            ])
            .args(&self.processor_flags)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("processor-{n}.log"))?)
            .spawn()?;
        self.processors.push(child);
        Ok(())
    }

    /// Starts one more `inferq batch-api` and waits until it answers.
    pub(crate) async fn add_replica(&mut self) -> Fallible<u16> {
        let port = self.spawn_replica()?;
        wait_ready(port).await?;
        Ok(port)
    }

    /// Starts one more `inferq batch-api` without waiting for it to be ready; its port.
    pub(crate) fn spawn_replica(&mut self) -> Fallible<u16> {
        let port = free_port()?;
        let n = self.replicas.len();
        let store = self
            .store_flags
            .clone()
            .unwrap_or_else(|| vec!["--files-dir".into(), self.files_dir().display().to_string()]);
        let child = Command::new(inferq_binary()?)
            .args(["batch-api", "--transport-config-file"])
            .arg(&self.config)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(&store)
            .envs(self.replica_env.iter().map(|(k, v)| (k, v)))
            .args(["--lease", "2s", "--cancel-grace", "3s"])
            .args(&self.extra_flags)
            .stdout(Stdio::null())
            .stderr(self.log(&format!("replica-{n}.log"))?)
            .spawn()?;
        self.replicas.push((child, port));
        Ok(port)
    }

    pub(crate) fn url(&self, replica: usize) -> String {
        format!("http://127.0.0.1:{}/v1", self.replicas[replica].1)
    }

    pub(crate) fn kill_replica(&mut self, i: usize) {
        let _ = self.replicas[i].0.kill();
        let _ = self.replicas[i].0.wait();
    }

    pub(crate) fn kill_processor(&mut self, i: usize) {
        let _ = self.processors[i].kill();
        let _ = self.processors[i].wait();
    }

    pub(crate) fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(entries) = std::fs::read_dir(self.dir.path()) {
            for e in entries.flatten() {
                let p = e.path();
                if p.extension().is_some_and(|x| x == "log") {
                    out.push_str(&format!(
                        "--- {}\n{}\n",
                        p.display(),
                        inferq_testkit::log_tail(&p, 30)
                    ));
                }
            }
        }
        out
    }
}

impl Drop for Deployment {
    fn drop(&mut self) {
        for (c, _) in &mut self.replicas {
            let _ = c.kill();
            let _ = c.wait();
        }
        for c in &mut self.processors {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Calls `check` every `every` until it gives `Some`, and returns that; once `within` has
/// passed, an error saying what never happened. An error from `check` ends the wait at once.
pub(crate) async fn until<T>(
    what: &str,
    within: Duration,
    every: Duration,
    mut check: impl AsyncFnMut() -> Fallible<Option<T>>,
) -> Fallible<T> {
    let started = Instant::now();
    loop {
        if let Some(v) = check().await? {
            return Ok(v);
        }
        if started.elapsed() >= within {
            return Err(format!("{what} not within {within:?}").into());
        }
        tokio::time::sleep(every).await;
    }
}

pub(crate) async fn wait_ready(port: u16) -> Fallible {
    let url = format!("http://127.0.0.1:{port}/readyz");
    let what = format!("batch-api on port {port} ready");
    until(
        &what,
        Duration::from_secs(20),
        Duration::from_millis(50),
        async || {
            Ok(reqwest::get(&url)
                .await
                .is_ok_and(|r| r.status().is_success())
                .then_some(()))
        },
    )
    .await
}

/// A JSONL batch of `n` chat lines, custom ids `req-0`…
pub(crate) fn chat_lines(n: usize) -> String {
    let mut text = String::new();
    for i in 0..n {
        text.push_str(
            &serde_json::json!({
                "custom_id": format!("req-{i}"),
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"model": "m", "messages": [{"role": "user", "content": format!("line {i}")}], "max_tokens": 4},
            })
            .to_string(),
        );
        text.push('\n');
    }
    text
}

/// Uploads `text` as a batch file; the File object.
pub(crate) async fn upload(base: &str, text: String) -> Fallible<serde_json::Value> {
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(text).file_name("in.jsonl"),
        );
    let r = reqwest::Client::new()
        .post(format!("{base}/files"))
        .multipart(form)
        .send()
        .await?;
    let status = r.status();
    let v: serde_json::Value = r.json().await?;
    if !status.is_success() {
        return Err(format!("upload: {status} {v}").into());
    }
    Ok(v)
}

pub(crate) async fn create(base: &str, file: &str, window: &str) -> Fallible<serde_json::Value> {
    let r = reqwest::Client::new()
        .post(format!("{base}/batches"))
        .json(&serde_json::json!({"input_file_id": file, "endpoint": "/v1/chat/completions", "completion_window": window}))
        .send()
        .await?;
    Ok(r.json().await?)
}

/// Uploads `n` chat lines ([`chat_lines`]) and creates a batch of them with a `24h` window;
/// returns the batch's id.
pub(crate) async fn start_batch(base: &str, n: usize) -> Fallible<String> {
    let file = upload(base, chat_lines(n)).await?;
    let batch = create(base, file["id"].as_str().unwrap_or_default(), "24h").await?;
    match batch["id"].as_str() {
        Some(id) => Ok(id.to_owned()),
        None => Err(format!("create: {batch}").into()),
    }
}

pub(crate) async fn get(url: &str) -> Fallible<serde_json::Value> {
    Ok(reqwest::get(url).await?.json().await?)
}

/// Polls a batch through `bases` in turn (any replica answers) until it ends.
pub(crate) async fn wait_ended(
    bases: &[String],
    id: &str,
    within: Duration,
) -> Fallible<serde_json::Value> {
    let mut i = 0;
    let what = format!("batch {id} ended");
    until(&what, within, Duration::from_millis(100), async || {
        let base = &bases[i % bases.len()];
        i += 1;
        Ok(get(&format!("{base}/batches/{id}")).await.ok().filter(|b| {
            matches!(
                b["status"].as_str(),
                Some("completed" | "failed" | "expired" | "cancelled")
            )
        }))
    })
    .await
}

/// custom_id -> how many lines name it, over the batch's output and error files.
pub(crate) async fn lines_per_id(
    base: &str,
    batch: &serde_json::Value,
) -> Fallible<std::collections::BTreeMap<String, usize>> {
    let mut seen = std::collections::BTreeMap::new();
    for key in ["output_file_id", "error_file_id"] {
        if let Some(id) = batch[key].as_str() {
            let text = reqwest::get(format!("{base}/files/{id}/content"))
                .await?
                .text()
                .await?;
            for line in text.lines() {
                let v: serde_json::Value = serde_json::from_str(line)?;
                let cid = v["custom_id"].as_str().unwrap_or_default().to_owned();
                *seen.entry(cid).or_insert(0) += 1;
            }
        }
    }
    Ok(seen)
}

/// [`start_batch`] as the tenant of `key`.
pub(crate) async fn start_batch_as(base: &str, key: &str, n: usize) -> Fallible<String> {
    let c = reqwest::Client::new();
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(chat_lines(n)).file_name("in.jsonl"),
        );
    let file: serde_json::Value = c
        .post(format!("{base}/files"))
        .bearer_auth(key)
        .multipart(form)
        .send()
        .await?
        .json()
        .await?;
    let batch: serde_json::Value = c
        .post(format!("{base}/batches"))
        .bearer_auth(key)
        .json(&serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .send()
        .await?
        .json()
        .await?;
    match batch["id"].as_str() {
        Some(id) => Ok(id.to_owned()),
        None => Err(format!("create: {file} {batch}").into()),
    }
}

/// [`wait_ended`] as the tenant of `key`, through one replica.
pub(crate) async fn wait_ended_as(
    base: &str,
    key: &str,
    id: &str,
    within: Duration,
) -> Fallible<serde_json::Value> {
    let c = reqwest::Client::new();
    let what = format!("batch {id} ended");
    until(&what, within, Duration::from_millis(100), async || {
        let b: serde_json::Value = c
            .get(format!("{base}/batches/{id}"))
            .bearer_auth(key)
            .send()
            .await?
            .json()
            .await?;
        Ok(matches!(
            b["status"].as_str(),
            Some("completed" | "failed" | "expired" | "cancelled")
        )
        .then_some(b))
    })
    .await
}

/// Asserts OpenAI's error shape: `{"error": {"message": <non-empty>, "type": <string>, "param",
/// "code"}}`.
pub(crate) fn assert_openai_error(v: &serde_json::Value) {
    let e = &v["error"];
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e["type"].is_string(), "{v}");
    assert!(
        e.as_object()
            .is_some_and(|o| o.contains_key("param") && o.contains_key("code")),
        "{v}"
    );
}
