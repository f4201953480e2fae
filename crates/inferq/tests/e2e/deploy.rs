//! The dashboard and the alert rules of `deploy/` against live metrics: every metric name their
//! PromQL uses (listed by `scripts/check-deploy.sh`, which parses it) is on the `/metrics` page
//! of a real processor or of a real Batch API, after real work has made the series appear.
//!
//! The page leaves out a family without a series (as Go's does). Every series whose labels are
//! known exists from start-up (checked on fresh pages by the last test here); the work of the
//! first is chosen to touch the rest too: successes, a retry, a 429, a 400, a passed deadline, a
//! renewal, a dead letter, a cancel in flight, a config reload, gates of every kind the panels
//! show, a processor killed mid-request whose claim expires, two processors racing for claims,
//! one frozen past its lease, a claim taken over while its request is at the gateway, the
//! redis-pubsub transport, and a batch through the Batch API.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use inferq_testkit::{free_port, RedisServer};
use redis::AsyncCommands;

use crate::common::{self, con, producer, request, Gateway, Processor, ProcessorOpts, Reply};

const Q: &str = "request-sortedset";
const OK: &str = r#"{"id":"cmpl-1","choices":[{"text":"ok"}]}"#;

/// Metric families that only a fault this test cannot make on demand creates, each with why.
/// `deploy/check.py` still checks them against the families the source registers.
const ONLY_CHECKED_IN_THE_SOURCE: &[(&str, &str)] = &[(
    "inferq_outbox_dropped_total",
    "an outcome dropped because its lease ran out while Redis was unreachable: whether the \
     frozen processor below drops, fences or aborts depends on timing",
)];

/// The names the dashboard and the rules use: the file `INFERQ_DEPLOY_METRIC_NAMES` names
/// (`scripts/test.sh` makes it), or else a run of `scripts/check-deploy.sh`.
fn used_names() -> Vec<String> {
    let path = match std::env::var_os("INFERQ_DEPLOY_METRIC_NAMES") {
        Some(path) => PathBuf::from(path),
        None => {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
            let out = root.join("target/deploy-metric-names.txt");
            let status = Command::new(root.join("scripts/check-deploy.sh"))
                .arg("--metric-names-out")
                .arg(&out)
                .stdout(Stdio::null())
                .status()
                .unwrap();
            assert!(status.success(), "scripts/check-deploy.sh failed");
            out
        }
    };
    let names: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    assert!(
        names.len() >= 20,
        "too few names in {}: {names:?}",
        path.display()
    );
    names
}

/// Every name a page offers: each sample's name, each family a `# TYPE` line declares, and
/// the sample names such a family has (a counter's `_total`, a histogram's `_bucket`, `_sum`,
/// `_count`).
fn offered(page: &str, into: &mut BTreeSet<String>) {
    for line in page.lines() {
        if let Some(declared) = line.strip_prefix("# TYPE ") {
            let mut words = declared.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            into.insert(name.to_owned());
            let suffixes: &[&str] = match kind {
                "counter" => &["_total"],
                "histogram" => &["_bucket", "_sum", "_count"],
                _ => &[],
            };
            for suffix in suffixes {
                into.insert(format!("{}{suffix}", name.trim_end_matches("_total")));
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            if end > 0 {
                into.insert(line[..end].to_owned());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_the_alerts_use_is_exported() {
    let used = used_names();
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut pages = Vec::new();

    pages.extend(a_crash_a_race_and_a_freeze(&redis, &gw).await);
    pages.push(a_claim_taken_over(&redis, &gw).await);
    pages.push(gated_work(&redis, &gw).await);
    pages.push(a_budget_and_a_leased_rate(&redis, &gw).await);
    pages.push(pubsub(&redis, &gw).await);
    pages.push(batch_api(&redis, &gw).await);

    let mut names = BTreeSet::new();
    for page in &pages {
        offered(page, &mut names);
    }
    let excused: BTreeSet<&str> = ONLY_CHECKED_IN_THE_SOURCE.iter().map(|(n, _)| *n).collect();
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !names.contains(*n) && !excused.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "used by deploy/ but on no live page: {missing:?}\nthe pages offer: {names:?}"
    );
    // The excuses stay honest: each is still used, and still not on any page.
    for (name, why) in ONLY_CHECKED_IN_THE_SOURCE {
        assert!(used.iter().any(|n| n == name), "{name} is no longer used");
        if names.contains(*name) {
            eprintln!("{name} appeared after all ({why}): it could leave the excuses");
        }
    }
}

fn opts(lease_s: f64) -> ProcessorOpts {
    ProcessorOpts {
        lease_s,
        reclaim_ms: 300,
        extra_args: vec!["--metrics-backlog-poll-interval=1s".to_owned()],
        ..ProcessorOpts::default()
    }
}

/// How many results the default result list holds, once it holds `n` (or a minute passed).
async fn results_reach(con: &mut redis::aio::ConnectionManager, n: usize) -> usize {
    common::wait_results_in(con, "result-list", n, Duration::from_secs(60))
        .await
        .len()
}

/// A processor killed mid-request (its claim expires and is redelivered), two processors
/// racing for 300 claims, and one frozen (SIGSTOP) past its lease while it holds a request.
async fn a_crash_a_race_and_a_freeze(redis: &RedisServer, gw: &Gateway) -> Vec<String> {
    let producer = producer(redis, Q).await;
    let mut con = con(redis).await;
    let slow = Reply::ok(OK).after(Duration::from_secs(30));
    gw.script("crash-0", vec![slow, Reply::ok(OK)]);
    let mut crashed = Processor::start(redis, gw, &opts(2.0)).await;
    producer
        .submit(request("crash-0", 120, "{}"))
        .await
        .unwrap();
    gw.wait_seen("crash-0", Duration::from_secs(10)).await;
    crashed.kill();

    let a = Processor::start(redis, gw, &opts(2.0)).await;
    let b = Processor::start(redis, gw, &opts(2.0)).await;
    let reqs = (0..300)
        .map(|i| request(&format!("race-{i}"), 120, "{}"))
        .collect();
    for outcome in producer.submit_many(reqs).await.unwrap() {
        outcome.unwrap();
    }
    assert_eq!(
        results_reach(&mut con, 301).await,
        301,
        "{}\n{}",
        a.log(),
        b.log()
    );
    let mut pages = vec![a.metrics().await];

    // b freezes holding freeze-0; a new processor reclaims it once the lease is out.
    drop(a);
    gw.script(
        "freeze-0",
        vec![Reply::ok(OK).after(Duration::from_secs(2)), Reply::ok(OK)],
    );
    producer
        .submit(request("freeze-0", 120, "{}"))
        .await
        .unwrap();
    gw.wait_seen("freeze-0", Duration::from_secs(10)).await;
    b.signal("STOP");
    let c = Processor::start(redis, gw, &opts(2.0)).await;
    assert_eq!(results_reach(&mut con, 302).await, 302, "{}", c.log());
    b.signal("CONT");
    // b finds its lease gone: its renewal fails and its answer is refused or dropped.
    tokio::time::sleep(Duration::from_secs(3)).await;
    pages.push(b.metrics().await);
    pages.push(c.metrics().await);
    pages
}

/// A claim taken over while its request is at the gateway: another owner's token is written
/// over the processor's (as a reclaim by another instance does), so the answer's finish is
/// fenced. The lease is long, so no renewal learns of it first; a queue of its own keeps the
/// orphaned claim away from the other steps.
async fn a_claim_taken_over(redis: &RedisServer, gw: &Gateway) -> String {
    let queue = "taken-over";
    let mut opts = opts(30.0);
    opts.queue = queue.to_owned();
    let p = Processor::start(redis, gw, &opts).await;
    gw.script("taken-0", vec![Reply::ok(OK).after(Duration::from_secs(2))]);
    producer(redis, queue)
        .await
        .submit(request("taken-0", 120, "{}"))
        .await
        .unwrap();
    gw.wait_seen("taken-0", Duration::from_secs(10)).await;
    let mut con = con(redis).await;
    let owners = format!("{queue}:claim-owners");
    let claims: Vec<String> = con.hkeys(&owners).await.unwrap();
    assert_eq!(claims.len(), 1, "{}", p.log());
    let _: () = con
        .hset(&owners, &claims[0], "another-instance")
        .await
        .unwrap();
    let page = p.metrics_with(&["inferq_fenced_finishes_total{"]).await;
    assert!(
        page.contains("inferq_fenced_finishes_total{"),
        "no fenced finish counted\n{}",
        p.log()
    );
    page
}

/// One processor with a metric gate on its queue and a saturation gate on its pool, and work
/// that ends every way a request can end; then its config file changes and it gets a SIGHUP.
async fn gated_work(redis: &RedisServer, gw: &Gateway) -> String {
    let (prom, _value) = crate::gates::fake_prometheus("0.8").await;
    let queue = |name: &str| {
        format!(
            r#"{{"queue_name":"{name}","igw_base_url":"{}","gate_type":"wait-on-refuse","gate_params":{{"gate":{{"gate_type":"prometheus-query","gate_params":{{"query":"free_capacity","pool":"pool-a"}}}}}}}}"#,
            gw.url()
        )
    };
    let config = |queues: &[String]| {
        format!(
            r#"{{"url":"{}","poll_interval_ms":50,"claim_lease_ttl_seconds":2,"claim_reclaim_interval_ms":300,"queues":[{}]}}"#,
            redis.url(),
            queues.join(",")
        )
    };
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), config(&[queue("gated")])).unwrap();
    let mut opts = opts(2.0);
    opts.transport_args = Some(vec![
        "--transport=redis-sortedset".to_owned(),
        format!("--transport-config-file={}", file.path().display()),
    ]);
    opts.pools = Some(
        r#"[{"id":"default","workers":8,"gate_type":"tier-priority-admission","gate_params":{"saturation_gate":"prometheus-saturation","saturation_gate_params":{"pool":"pool-b"}}}]"#
            .to_owned(),
    );
    opts.extra_args
        .push(format!("--prometheus-url=http://{prom}"));
    opts.extra_args.push("--prometheus-cache-ttl=0s".to_owned());
    let p = Processor::start(redis, gw, &opts).await;
    let producer = producer(redis, "gated").await;
    let mut con = con(redis).await;
    let before = results_reach(&mut con, 0).await;
    gw.script("retry", vec![Reply::status(503, "busy"), Reply::ok(OK)]);
    gw.script("shed", vec![Reply::status(429, "slow down"), Reply::ok(OK)]);
    gw.script("fail", vec![Reply::status(400, "bad")]);
    gw.script("renew", vec![Reply::ok(OK).after(Duration::from_secs(3))]);
    gw.script("held", vec![Reply::ok(OK).after(Duration::from_secs(60))]);
    for id in ["ok", "retry", "shed", "fail", "renew", "held"] {
        producer.submit(request(id, 120, "{}")).await.unwrap();
    }
    let past = inferq_client::producer::unix_ms() / 1000 - 5;
    let late = format!(
        r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"late","deadline":{past},"payload":{{}}}}}}"#
    );
    let _: () = con.zadd("gated", &late, past).await.unwrap();
    let _: () = con.zadd("gated", "not json", past).await.unwrap();
    gw.wait_seen("held", Duration::from_secs(10)).await;
    producer.cancel(&["held".to_owned()]).await.unwrap();
    std::fs::write(file.path(), config(&[queue("gated"), queue("gated-2")])).unwrap();
    p.signal("HUP");
    let got = results_reach(&mut con, before + 7).await;
    assert_eq!(got, before + 7, "{}", p.log());
    p.metrics_with(&[
        "inferq_dead_letters_total{",
        "llm_d_async_async_queue_config_reloads_total{",
        "inferq_aborted_requests_total{",
    ])
    .await
}

/// A `redis` budget gate on the queue and a `redis-leased-rate` pool gate with a valid lease.
async fn a_budget_and_a_leased_rate(redis: &RedisServer, gw: &Gateway) -> String {
    let mut con = con(redis).await;
    let _: () = con.set("dispatch-gate-budget", "1").await.unwrap();
    let (now_s, _): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let lease = [
        ("api_version", "llm-d.ai/v1alpha1".to_owned()),
        ("pool_id", "default".to_owned()),
        ("max_admission_rps", "100".to_owned()),
        ("valid_until_unix_ms", ((now_s + 600) * 1000).to_string()),
        ("decision_id", "d-1".to_owned()),
    ];
    let _: () = con.hset_multiple("drain:default", &lease).await.unwrap();
    let mut opts = opts(2.0);
    opts.queue = "budgeted".to_owned();
    opts.extra_queue_fields = format!(
        r#","gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}"#,
        redis.port()
    );
    opts.pools = Some(format!(
        r#"[{{"id":"default","workers":8,"gate_type":"wait-on-refuse","gate_params":{{"gate":{{"gate_type":"redis-leased-rate","gate_params":{{"address":"127.0.0.1:{}","control_key":"drain:default"}}}}}}}}]"#,
        redis.port()
    ));
    let p = Processor::start(redis, gw, &opts).await;
    let before = results_reach(&mut con, 0).await;
    let producer = producer(redis, "budgeted").await;
    producer
        .submit(request("budgeted-0", 120, "{}"))
        .await
        .unwrap();
    assert_eq!(
        results_reach(&mut con, before + 1).await,
        before + 1,
        "{}",
        p.log()
    );
    p.metrics_with(&[
        "llm_d_async_async_dispatch_budget{",
        "llm_d_async_async_drain_limit_rps{",
    ])
    .await
}

/// The redis-pubsub transport, one message published and answered.
async fn pubsub(redis: &RedisServer, gw: &Gateway) -> String {
    let config = format!(
        r#"{{"url":"{}","queues":[{{"queue_name":"request-queue","igw_base_url":"{}"}}]}}"#,
        redis.url(),
        gw.url()
    );
    let opts = ProcessorOpts {
        transport_args: Some(vec![
            "--transport".into(),
            "redis-pubsub".into(),
            "--transport-config".into(),
            config,
        ]),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(redis, gw, &opts).await;
    let now = inferq_client::producer::unix_ms() / 1000;
    let envelope = format!(
        r#"{{"internal":{{}},"request_kind":"redis","data":{{"id":"ps-0","created":{now},"deadline":{},"payload":{{}}}}}}"#,
        now + 60
    );
    let mut con = con(redis).await;
    let started = Instant::now();
    loop {
        let receivers: u64 = con.publish("request-queue", &envelope).await.unwrap();
        if receivers > 0 || started.elapsed() > Duration::from_secs(10) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    p.metrics_with(&["inferq_pubsub_messages_total{"]).await
}

/// `inferq batch-api` beside a processor on the sorted-set queue, its page once a batch of
/// two lines has completed.
async fn batch_api(redis: &RedisServer, gw: &Gateway) -> String {
    let _processor = Processor::start(redis, gw, &opts(2.0)).await;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("transport.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"url":"{}","queues":[{{"queue_name":"{Q}","igw_base_url":"{}"}}]}}"#,
            redis.url(),
            gw.url()
        ),
    )
    .unwrap();
    let port = free_port().unwrap();
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_inferq"))
        .arg("batch-api")
        .arg("--transport-config-file")
        .arg(&config)
        .arg("--files-dir")
        .arg(dir.path().join("files"))
        .arg("--insecure-no-auth")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::new();
    let started = Instant::now();
    while !matches!(client.get(format!("{base}/readyz")).send().await, Ok(r) if r.status().is_success())
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the Batch API is not ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines: String = (0..2)
        .map(|i| {
            format!(
                "{{\"custom_id\":\"c{i}\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{{\"model\":\"m\",\"messages\":[]}}}}\n"
            )
        })
        .collect();
    let form = reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::text(lines).file_name("in.jsonl"),
        );
    let file: serde_json::Value = client
        .post(format!("{base}/v1/files"))
        .multipart(form)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let batch: serde_json::Value = client
        .post(format!("{base}/v1/batches"))
        .json(&serde_json::json!({"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = format!("{base}/v1/batches/{}", batch["id"].as_str().unwrap());
    let started = Instant::now();
    loop {
        let now: serde_json::Value = client.get(&url).send().await.unwrap().json().await.unwrap();
        if now["status"] == "completed" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the batch did not complete: {now}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let page = client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    page
}

/// Families that a processor without the matching gate or transport cannot have, each with
/// why; every other family the dashboard and the rules use must have a series at 0 on a fresh
/// page.
const ONLY_WITH_A_GATE_OR_TRANSPORT: &[(&str, &str)] = &[
    (
        "llm_d_async_async_dispatch_budget",
        "a queue gate's budget: only a gated queue has one",
    ),
    (
        "llm_d_async_async_gate_metric_value",
        "a metric gate's reading: only with a prometheus-* or endpoint-scrape gate, once read",
    ),
    (
        "llm_d_async_async_gate_metric_threshold",
        "a metric gate's threshold: as its reading",
    ),
    (
        "llm_d_async_async_gate_metric_source_available",
        "a metric gate's source: as its reading",
    ),
    (
        "llm_d_async_async_drain_limit_rps",
        "a redis-leased-rate gate's lease: only with that gate",
    ),
    (
        "llm_d_async_async_drain_limit_lease_valid",
        "a redis-leased-rate gate's lease: only with that gate",
    ),
    (
        "inferq_pubsub_messages_total",
        "the redis-pubsub transport's messages: checked on a fresh pub/sub processor below",
    ),
];

/// The names of a page's samples (not its `# TYPE` lines: a family declared without a series
/// charts "No data").
fn sampled(page: &str, into: &mut BTreeSet<String>) {
    for line in page.lines().filter(|l| !l.starts_with('#')) {
        let end = line.find(['{', ' ']).unwrap_or(line.len());
        if end > 0 {
            into.insert(line[..end].to_owned());
        }
    }
}

/// Starts `inferq batch-api` on the queue `Q`; returns it, its base URL and its directory.
async fn start_batch_api(redis: &RedisServer, gw: &Gateway) -> (Child, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("transport.json");
    std::fs::write(
        &config,
        format!(
            r#"{{"url":"{}","queues":[{{"queue_name":"{Q}","igw_base_url":"{}"}}]}}"#,
            redis.url(),
            gw.url()
        ),
    )
    .unwrap();
    let port = free_port().unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_inferq"))
        .arg("batch-api")
        .arg("--transport-config-file")
        .arg(&config)
        .arg("--files-dir")
        .arg(dir.path().join("files"))
        .arg("--insecure-no-auth")
        .arg("--listen")
        .arg(format!("127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    while !matches!(reqwest::get(format!("{base}/readyz")).await, Ok(r) if r.status().is_success())
    {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the Batch API is not ready"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (child, base, dir)
}

/// go-v011 §4: every family the dashboard and the rules use whose label values are known at
/// start-up has its series at 0 on a fresh `inferq run` and a fresh `inferq batch-api`, before
/// any request: per queue, per pool, per gate reason, per batch status. (A series that appears
/// only after its first event breaks ratios, `absent()` alerts and the dashboard's panels.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_processor_and_batch_api_chart_every_family_at_zero() {
    let used = used_names();
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &opts(30.0)).await;
    let pubsub_opts = ProcessorOpts {
        transport_args: Some(vec![
            "--transport".into(),
            "redis-pubsub".into(),
            "--transport-config".into(),
            format!(
                r#"{{"url":"{}","queues":[{{"queue_name":"request-queue","igw_base_url":"{}"}}]}}"#,
                redis.url(),
                gw.url()
            ),
        ]),
        ..ProcessorOpts::default()
    };
    let pubsub = Processor::start(&redis, &gw, &pubsub_opts).await;
    let (mut batch, base, _dir) = start_batch_api(&redis, &gw).await;
    let batch_page = reqwest::get(format!("{base}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let _ = batch.kill();
    let _ = batch.wait();
    // The first backlog poll runs as the queue's lane starts.
    let page = p.metrics_with(&["llm_d_async_async_broker_backlog{"]).await;
    let mut names = BTreeSet::new();
    sampled(&page, &mut names);
    sampled(&batch_page, &mut names);
    let mut pubsub_names = BTreeSet::new();
    sampled(&pubsub.metrics().await, &mut pubsub_names);
    assert!(
        pubsub_names.contains("inferq_pubsub_messages_total"),
        "{pubsub_names:?}"
    );
    let excused: BTreeSet<&str> = ONLY_WITH_A_GATE_OR_TRANSPORT
        .iter()
        .map(|(n, _)| *n)
        .collect();
    let missing: Vec<&String> = used
        .iter()
        .filter(|n| !names.contains(*n) && !excused.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "no series on a fresh page: {missing:?}\nprocessor:\n{page}\nbatch api:\n{batch_page}"
    );
    let results: u64 = con(&redis).await.llen("result-list").await.unwrap();
    assert_eq!(results, 0, "no request was made");
    for series in [
        r#"inferq_batch_batches{status="completed"} 0"#,
        r#"llm_d_async_async_failed_requests_total{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0"#,
        r#"llm_d_async_async_gate_decisions_total{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset",reason="gate_closed"} 0"#,
        r#"inferq_dead_letters_total{outcome="deliveries",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0"#,
    ] {
        assert!(
            page.contains(series) || batch_page.contains(series),
            "{series} missing"
        );
    }
}
