//! The `prometheus-*` gates and deploy/'s alert rules against a real Prometheus (the test kit's
//! [`PrometheusServer`], `$INFERQ_PROMETHEUS`): Prometheus scrapes a router stand-in (a tiny HTTP
//! server in the test serving the text page the test sets, as an llm-d router's EPP or a vLLM
//! engine would) every 200 ms, and `inferq run` gates a queue on what Prometheus answers. The
//! alert rules are loaded from the chart's canonical rules file and evaluated on a live
//! processor's page.
//!
//! Every page change is waited for in Prometheus itself before requests are submitted, so a
//! request dispatched in a "held" phase is the gate's fault, not a stale scrape's.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use inferq_testkit::{PrometheusConfig, PrometheusServer, RedisServer, ScrapeJob};
use redis::AsyncCommands;

use crate::common::{con, producer, request, wait_results, Gateway, Processor, ProcessorOpts};

const Q: &str = "request-sortedset";
/// The queue gate's labels on the processor's `gate_metric_*` gauges.
const GATE_LABELS: &str = r#"{inference_pool="pool-a",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"}"#;
/// How long a held queue is watched for a request that should not go.
const HOLD: Duration = Duration::from_millis(800);

/// A router (or engine) stand-in: `/metrics` serves the text the test sets.
struct Page {
    text: Arc<Mutex<String>>,
    addr: SocketAddr,
}

impl Page {
    async fn start(text: &str) -> Page {
        let text = Arc::new(Mutex::new(text.to_owned()));
        let served = text.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let body = served.lock().unwrap().clone();
                async move { body }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Page { text, addr }
    }

    fn set(&self, text: &str) {
        *self.text.lock().unwrap() = text.to_owned();
    }

    fn target(&self) -> String {
        self.addr.to_string()
    }
}

/// A Prometheus scraping `pages` (job `router`) every 200 ms, once it has scraped each.
async fn prometheus(pages: &[&Page]) -> PrometheusServer {
    let prom = PrometheusServer::start(PrometheusConfig {
        jobs: vec![ScrapeJob::new("router", pages.iter().map(|p| p.target()))],
        scrape_interval: Duration::from_millis(200),
        ..PrometheusConfig::default()
    })
    .await
    .unwrap();
    for page in pages {
        prom.wait_until_scraped(&page.target(), Duration::from_secs(15))
            .await
            .unwrap();
    }
    prom
}

/// Waits until Prometheus answers `promql` with one sample of `want` (or, for `None`, with no
/// sample): the page the test set has been scraped.
async fn wait_prom(prom: &PrometheusServer, promql: &str, want: Option<f64>) {
    let started = Instant::now();
    loop {
        let samples = prom.query(promql).await.unwrap();
        let got: Vec<f64> = samples.iter().map(|s| s.value).collect();
        if got == want.into_iter().collect::<Vec<_>>() {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{promql}: want {want:?}, Prometheus says {samples:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A processor whose queue is gated by `gate` (a `gate_type` and `gate_params` JSON pair)
/// reading `prom`, with no cache, so every poll asks Prometheus.
fn gated(prom: &PrometheusServer, gate: &str) -> ProcessorOpts {
    ProcessorOpts {
        extra_queue_fields: format!(",{gate}"),
        extra_args: vec![
            format!("--prometheus-url={}", prom.url()),
            "--prometheus-cache-ttl=0s".to_owned(),
        ],
        ..ProcessorOpts::default()
    }
}

/// Waits until the processor's page has the line `line` (a series and its value).
async fn wait_line(p: &Processor, line: &str) {
    let started = Instant::now();
    loop {
        let metrics = p.metrics().await;
        if metrics.lines().any(|l| l == line) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no line {line} on the processor's page:\n{metrics}\nlog:\n{}",
            p.log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Submits `ids` to the queue, each with a deadline two minutes off.
async fn submit(redis: &RedisServer, ids: &[&str]) {
    let producer = producer(redis, Q).await;
    for id in ids {
        producer.submit(request(id, 120, "{}")).await.unwrap();
    }
}

/// The gate has read `value` (a budget-space reading) from a live source, and for a while
/// after that no more than `sent` requests reached the gateway.
async fn held(p: &Processor, gw: &Gateway, value: &str, sent: usize) {
    wait_line(
        p,
        &format!("llm_d_async_async_gate_metric_value{GATE_LABELS} {value}"),
    )
    .await;
    wait_line(
        p,
        &format!("llm_d_async_async_gate_metric_source_available{GATE_LABELS} 1"),
    )
    .await;
    tokio::time::sleep(HOLD).await;
    assert_eq!(
        gw.executions().len(),
        sent,
        "the gate is closed: nothing more may be sent; log:\n{}",
        p.log()
    );
}

/// A router page with the pool saturation under the current name (as the llm-d router writes
/// it: a series per stage, `effective` the larger) and/or the old one; another pool's series
/// beside it.
fn saturation_page(current: Option<f64>, old: Option<f64>) -> String {
    let mut page = String::new();
    if let Some(v) = current {
        page.push_str("# TYPE llm_d_epp_flow_control_pool_saturation gauge\n");
        for (stage, s) in [("prefill", v / 2.0), ("decode", v), ("effective", v)] {
            page.push_str(&format!(
                "llm_d_epp_flow_control_pool_saturation{{inference_pool=\"pool-a\",stage=\"{stage}\"}} {s}\n"
            ));
        }
        page.push_str("llm_d_epp_flow_control_pool_saturation{inference_pool=\"pool-b\",stage=\"effective\"} 0\n");
    }
    if let Some(v) = old {
        page.push_str(&format!(
            "# TYPE inference_extension_flow_control_pool_saturation gauge\n\
             inference_extension_flow_control_pool_saturation{{inference_pool=\"pool-a\"}} {v}\n\
             inference_extension_flow_control_pool_saturation{{inference_pool=\"pool-b\"}} 0\n"
        ));
    }
    page
}

const SAT_CURRENT: &str =
    r#"1 - max(llm_d_epp_flow_control_pool_saturation{inference_pool="pool-a"})"#;
const SAT_OLD: &str =
    r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="pool-a"}"#;

/// `prometheus-saturation` (threshold 0.8) on a router exporting only the current name, then
/// only the old name, then both: at saturation 1.0 nothing is dispatched, at 0.2 the queue
/// drains. Before the gate read the current name, a router exporting only it left the gate on
/// its fail-open fallback and every request was sent at saturation 1.0; with both names, the
/// current one is the one obeyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturation_gate_reads_the_current_name_then_the_old_one() {
    let router = Page::start(&saturation_page(Some(1.0), None)).await;
    let prom = prometheus(&[&router]).await;
    wait_prom(&prom, SAT_CURRENT, Some(0.0)).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = gated(
        &prom,
        r#""gate_type":"prometheus-saturation","gate_params":{"pool":"pool-a","threshold":0.8}"#,
    );
    let p = Processor::start(&redis, &gw, &opts).await;
    let mut con = con(&redis).await;

    // The current name only, saturated (decode and effective 1.0, prefill 0.5): held.
    submit(&redis, &["new-1", "new-2", "new-3"]).await;
    held(&p, &gw, "0", 0).await;
    router.set(&saturation_page(Some(0.2), None));
    assert_eq!(
        wait_results(&mut con, 3, Duration::from_secs(10))
            .await
            .len(),
        3
    );

    // The old name only: the current gives no series, the old is read.
    router.set(&saturation_page(None, Some(1.0)));
    wait_prom(&prom, SAT_CURRENT, None).await;
    wait_prom(&prom, SAT_OLD, Some(0.0)).await;
    submit(&redis, &["old-1", "old-2", "old-3"]).await;
    held(&p, &gw, "0", 3).await;
    router.set(&saturation_page(None, Some(0.2)));
    assert_eq!(
        wait_results(&mut con, 6, Duration::from_secs(10))
            .await
            .len(),
        6
    );

    // Both: the current name is obeyed, whichever way the two disagree.
    router.set(&saturation_page(Some(1.0), Some(0.2)));
    wait_prom(&prom, SAT_CURRENT, Some(0.0)).await;
    submit(&redis, &["both-1", "both-2", "both-3"]).await;
    held(&p, &gw, "0", 6).await;
    router.set(&saturation_page(Some(0.2), Some(1.0)));
    assert_eq!(
        wait_results(&mut con, 9, Duration::from_secs(10))
            .await
            .len(),
        9
    );
    wait_line(
        &p,
        &format!("llm_d_async_async_gate_metric_value{GATE_LABELS} 0.8"),
    )
    .await;
}

/// One router replica's page: its flow-control queue for pool-a and the pool's ready
/// endpoints, under the current names only.
fn replica_page(queue: u32, ready: u32) -> String {
    format!(
        "# TYPE llm_d_epp_flow_control_queue_size gauge\n\
         llm_d_epp_flow_control_queue_size{{fairness_id=\"batch\",inference_pool=\"pool-a\",model_name=\"m\",priority=\"-10\",target_model_name=\"m\"}} {queue}\n\
         # TYPE llm_d_epp_ready_endpoints gauge\n\
         llm_d_epp_ready_endpoints{{name=\"pool-a\"}} {ready}\n"
    )
}

const BUDGET_GATE: &str = r#""gate_type":"prometheus-budget","gate_params":{"pool":"pool-a","max_concurrency":10,"baseline":0.05}"#;

/// `prometheus-budget` on two router replicas exporting only the current names: the budget is
/// `1 − Σ queue / (Σ ready × max_concurrency)` over both. Queues of 20 and 0 with one ready
/// endpoint each close the gate (one replica's reading alone would open it); 5 and 0 open it at
/// 0.75 (one replica's alone reads 0.5 or 1). Go's query read the old names (its fallback 0
/// then stops dispatch for good) and could not match two replicas' ready counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_gate_sums_two_router_replicas_on_current_names() {
    let one = Page::start(&replica_page(20, 1)).await;
    let two = Page::start(&replica_page(0, 1)).await;
    let prom = prometheus(&[&one, &two]).await;
    let budget = r#"1 - (sum(llm_d_epp_flow_control_queue_size{inference_pool="pool-a"}) / on() (sum(llm_d_epp_ready_endpoints{name="pool-a"}) * 10))"#;
    wait_prom(&prom, budget, Some(0.0)).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &gated(&prom, BUDGET_GATE)).await;

    submit(&redis, &["b-1", "b-2", "b-3"]).await;
    held(&p, &gw, "0", 0).await;
    one.set(&replica_page(5, 1));
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 3, Duration::from_secs(10))
            .await
            .len(),
        3
    );
    wait_line(
        &p,
        &format!("llm_d_async_async_gate_metric_value{GATE_LABELS} 0.75"),
    )
    .await;
}

/// A `prometheus-budget` gate whose router exports none of the names it reads says so in
/// `gate_metric_source_available` (0) and in one warning line naming every metric it tried,
/// however often it polls, and takes its fallback (0: the queue is held) as before; once the
/// router's metrics appear it reads them, logs that once, and the queue drains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn budget_gate_without_router_metrics_says_so_once() {
    let router = Page::start(
        "# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 0\n",
    )
    .await;
    let prom = prometheus(&[&router]).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let p = Processor::start(&redis, &gw, &gated(&prom, BUDGET_GATE)).await;

    submit(&redis, &["u-1", "u-2"]).await;
    wait_line(
        &p,
        &format!("llm_d_async_async_gate_metric_source_available{GATE_LABELS} 0"),
    )
    .await;
    // About 20 polls a second, each asking Prometheus every query of the cascade.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(gw.executions().is_empty(), "the fallback 0 holds the queue");
    let log = p.log();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("metric source unavailable"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning, not one per poll:\n{log}");
    for name in [
        "llm_d_epp_flow_control_queue_size",
        "llm_d_epp_ready_endpoints",
        "llm_d_epp_per_endpoint_queue_size",
        "inference_extension_flow_control_queue_size",
        "inference_pool_ready_pods",
        "inference_pool_per_pod_queue_size",
        "vllm:num_requests_running",
    ] {
        assert!(
            warnings[0].contains(name),
            "{name} not named: {}",
            warnings[0]
        );
    }

    router.set(&replica_page(0, 2));
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 2, Duration::from_secs(10))
            .await
            .len(),
        2
    );
    wait_line(
        &p,
        &format!("llm_d_async_async_gate_metric_value{GATE_LABELS} 1"),
    )
    .await;
    let log = p.log();
    assert_eq!(log.matches("metric source unavailable").count(), 1, "{log}");
    assert_eq!(
        log.matches("metric source available again").count(),
        1,
        "{log}"
    );
}

/// `prometheus-query` with a user's PromQL over vLLM's `vllm:num_requests_waiting` (an engine
/// stand-in with two pods): 6 + 4 waiting against a capacity of 10 closes the queue, 1 + 1
/// opens it at 0.8.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_gate_follows_a_user_query_over_vllm_waiting() {
    let engine_page = |a: u32, b: u32| {
        format!(
            "# TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"m\",pod=\"e1\"}} {a}\n\
             vllm:num_requests_waiting{{model_name=\"m\",pod=\"e2\"}} {b}\n\
             vllm:num_requests_waiting{{model_name=\"other\",pod=\"e3\"}} 50\n"
        )
    };
    let engine = Page::start(&engine_page(6, 4)).await;
    let prom = prometheus(&[&engine]).await;
    let query = r#"1 - sum(vllm:num_requests_waiting{model_name="m"}) / 10"#;
    wait_prom(&prom, query, Some(0.0)).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let gate = format!(
        r#""gate_type":"prometheus-query","gate_params":{{"query":{},"pool":"pool-a"}}"#,
        serde_json::Value::from(query)
    );
    let p = Processor::start(&redis, &gw, &gated(&prom, &gate)).await;

    submit(&redis, &["q-1", "q-2", "q-3"]).await;
    held(&p, &gw, "0", 0).await;
    engine.set(&engine_page(1, 1));
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 3, Duration::from_secs(10))
            .await
            .len(),
        3
    );
    wait_line(
        &p,
        &format!("llm_d_async_async_gate_metric_value{GATE_LABELS} 0.8"),
    )
    .await;
}

/// The chart's canonical rules file, loaded as it is (the PrometheusRule template ships the
/// same file; one source of truth).
fn alert_rules() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/helm/inferq/files/inferq-alerts.yaml")
}

/// deploy/'s alert rules on a live processor scraped as job `inferq`: every rule evaluates
/// without error and a quiet processor raises no alert; a member that is no request is
/// dead-lettered and InferqDeadLettersGrowing fires (it has no `for:`); Redis killed makes
/// InferqRedisUnreachable pending, and the processor killed makes InferqTargetDown pending
/// (both have `for: 5m`, so pending is what a test of seconds can see: the condition holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alert_rules_fire_on_a_live_processor() {
    let mut redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut p = Processor::start(&redis, &gw, &ProcessorOpts::default()).await;
    let target = format!("127.0.0.1:{}", p.metrics_port);
    let prom = PrometheusServer::start(PrometheusConfig {
        jobs: vec![ScrapeJob::new("inferq", [target.as_str()])],
        scrape_interval: Duration::from_millis(200),
        rule_files: vec![alert_rules()],
        evaluation_interval: Duration::from_millis(250),
    })
    .await
    .unwrap();
    prom.wait_until_scraped(&target, Duration::from_secs(15))
        .await
        .unwrap();

    // Quiet: a request served, then several evaluations on an idle processor.
    submit(&redis, &["quiet-1"]).await;
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 1, Duration::from_secs(10))
            .await
            .len(),
        1
    );
    // Several evaluations on the idle processor, waited for rather than slept through.
    let rules = prom
        .wait_for_evaluations(4, Duration::from_secs(20))
        .await
        .unwrap();
    assert!(rules.len() >= 7, "{rules:?}");
    for rule in &rules {
        assert_eq!(rule.health, "ok", "{rule:?}\n{}", prom.log());
    }
    let alerts = prom.alerts().await.unwrap();
    assert!(
        alerts.is_empty(),
        "a quiet processor raises no alert: {alerts:?}"
    );

    // A dead letter.
    let now = inferq_client::producer::unix_ms() / 1000;
    let _: () = con.zadd(Q, "this is not a request", now).await.unwrap();
    let alert = prom
        .wait_for_alert(
            "InferqDeadLettersGrowing",
            &["firing"],
            Duration::from_secs(15),
        )
        .await
        .unwrap();
    assert_eq!(
        alert.labels.get("queue_name").map(String::as_str),
        Some(Q),
        "{alert:?}"
    );

    // Redis gone: the processor cannot read its backlog.
    redis.kill();
    prom.wait_for_alert(
        "InferqRedisUnreachable",
        &["pending"],
        Duration::from_secs(20),
    )
    .await
    .unwrap();

    // The processor gone: its target is down.
    p.kill();
    prom.wait_for_alert("InferqTargetDown", &["pending"], Duration::from_secs(15))
        .await
        .unwrap();
}
