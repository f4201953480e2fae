//! Tests of the metric gates against a real fake Prometheus: an axum server on a free local port
//! that answers `/api/v1/query` with canned vectors chosen by the `query` parameter (recording
//! every query it receives) and serves text-format pages for `endpoint-scrape`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::*;

/// What the fake answers to one query.
#[derive(Clone)]
enum Answer {
    /// An instant vector with these sample values (as Prometheus writes them).
    Vector(Vec<&'static str>),
    /// This status with an error body.
    Status(u16),
    /// This exact JSON.
    Raw(Value),
}

#[derive(Default)]
struct Fake {
    answers: HashMap<String, Answer>,
    queries: Vec<String>,
    /// Page name → (status, text) for `/pages/{name}`.
    pages: HashMap<String, (u16, String)>,
    scrapes: usize,
}

type Shared = Arc<Mutex<Fake>>;

async fn query(State(fake): State<Shared>, Query(q): Query<HashMap<String, String>>) -> Response {
    let text = q.get("query").cloned().unwrap_or_default();
    let answer = {
        let mut f = fake.lock().unwrap();
        f.queries.push(text.clone());
        f.answers.get(&text).cloned()
    };
    match answer.unwrap_or(Answer::Vector(vec![])) {
        Answer::Vector(values) => {
            let result: Vec<Value> = values
                .iter()
                .map(|v| json!({"metric": {"inference_pool": "p1"}, "value": [1712345678.123, v]}))
                .collect();
            Json(json!({"status": "success", "data": {"resultType": "vector", "result": result}}))
                .into_response()
        }
        Answer::Status(code) => (
            StatusCode::from_u16(code).unwrap(),
            Json(json!({"status": "error", "errorType": "internal", "error": "boom"})),
        )
            .into_response(),
        Answer::Raw(v) => Json(v).into_response(),
    }
}

async fn page(State(fake): State<Shared>, Path(name): Path<String>) -> Response {
    let mut f = fake.lock().unwrap();
    f.scrapes += 1;
    match f.pages.get(&name) {
        Some((code, text)) => (StatusCode::from_u16(*code).unwrap(), text.clone()).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

struct Server {
    fake: Shared,
    base: String,
}

impl Server {
    async fn start() -> Server {
        let fake = Shared::default();
        let app = Router::new()
            .route("/api/v1/query", get(query))
            .route("/pages/{name}", get(page))
            .with_state(fake.clone());
        let listener = tokio::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0)))
            .await
            .unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Server { fake, base }
    }

    fn answer(&self, query: &str, answer: Answer) {
        self.fake
            .lock()
            .unwrap()
            .answers
            .insert(query.to_owned(), answer);
    }

    fn page(&self, name: &str, status: u16, text: &str) {
        self.fake
            .lock()
            .unwrap()
            .pages
            .insert(name.to_owned(), (status, text.to_owned()));
    }

    fn page_url(&self, name: &str) -> String {
        format!("{}/pages/{name}", self.base)
    }

    /// The queries received so far, emptying the record.
    fn take_queries(&self) -> Vec<String> {
        std::mem::take(&mut self.fake.lock().unwrap().queries)
    }

    fn env(&self, ttl: Duration) -> GateEnv {
        GateEnv {
            pool_workers: None,
            prometheus_url: Some(format!("{}/", self.base)),
            prometheus_cache_ttl: ttl,
            owner: None,
        }
    }

    fn gate(&self, kind: GateType, params: Value) -> Arc<MetricGate> {
        build_metric(&spec(kind, params), &self.env(Duration::ZERO)).unwrap()
    }
}

fn spec(kind: GateType, params: Value) -> GateSpec {
    let params: Map<String, Value> = serde_json::from_value(params).unwrap();
    GateSpec { kind, params }
}

async fn verdict(gate: &MetricGate) -> Verdict {
    let (metadata, labels) = (BTreeMap::new(), BTreeMap::new());
    let input = GateInput {
        metadata: &metadata,
        labels: &labels,
    };
    gate.apply(input).await.unwrap().verdict
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// The saturation gate's query on the current name, then on the old one.
const SAT_P1: &str = r#"1 - max(llm_d_epp_flow_control_pool_saturation{inference_pool="p1"})"#;
const OLD_SAT_P1: &str =
    r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1"}"#;

#[tokio::test]
async fn saturation_threshold_fallback_and_apply() {
    let s = Server::start().await;
    let gate = s.gate(GateType::PrometheusSaturation, json!({"pool": "p1"}));
    assert!(gate.last_reading().is_none());

    // Budget value v = 1 − saturation; gate threshold = 1 − 0.8 = 0.2.
    for (v, want) in [("0.5", 0.3), ("0.2", 0.0), ("0.1", 0.0), ("1", 0.8)] {
        s.answer(SAT_P1, Answer::Vector(vec![v, "0.99"]));
        let b = gate.budget().await;
        assert!(close(b, want), "v={v}: {b}");
    }
    // The current name answers: the old one is not asked.
    assert_eq!(s.take_queries(), vec![SAT_P1; 4]);
    let r = gate.last_reading().unwrap();
    assert_eq!(r.value, Some(1.0));
    assert!(close(r.threshold, 0.2) && r.source_available());
    assert_eq!(verdict(&gate).await, Verdict::Continue);
    // Saturation exactly 0.8: Prometheus computes 1 − 0.8 in float64, as the gate does.
    s.answer(SAT_P1, Answer::Vector(vec!["0.19999999999999996"]));
    assert_eq!(gate.budget().await, 0.0);
    assert_eq!(verdict(&gate).await, Verdict::Refuse);

    // Unavailable (on both names): the default fallback (saturation 0) fails open, as Go.
    s.answer(OLD_SAT_P1, Answer::Vector(vec![]));
    for bad in [
        Answer::Vector(vec![]),
        Answer::Vector(vec!["NaN"]),
        Answer::Vector(vec!["+Inf"]),
        Answer::Status(503),
        Answer::Raw(
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1, "0.5"]}}),
        ),
    ] {
        s.answer(SAT_P1, bad);
        assert_eq!(gate.budget().await, 1.0);
        let r = gate.last_reading().unwrap();
        assert!(!r.source_available());
        assert_eq!(r.budget, 1.0);
    }

    s.take_queries();

    // A saturation fallback of 1 fails closed; of 0.25 gives 0.75; out-of-range values clamp.
    for (fallback, want) in [
        (json!(1), 0.0),
        (json!("0.25"), 0.75),
        (json!(-3), 1.0),
        (json!(7), 0.0),
    ] {
        let g = s.gate(
            GateType::PrometheusSaturation,
            json!({"pool": "p1", "namespace": "ns", "fallback": fallback, "threshold": 0.5}),
        );
        assert_eq!(g.budget().await, want);
        assert!(close(g.last_reading().unwrap().threshold, 0.5));
    }
    // With a namespace, the queries name it (nothing answers them, hence the fallbacks above).
    let with_ns = [
        r#"1 - max(llm_d_epp_flow_control_pool_saturation{inference_pool="p1",namespace="ns"})"#,
        r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1",namespace="ns"}"#,
    ];
    assert_eq!(s.take_queries(), with_ns.repeat(4));
}

#[tokio::test]
async fn query_gate_arithmetic() {
    let s = Server::start().await;
    let gate = s.gate(
        GateType::PrometheusQuery,
        json!({"query": "my_budget", "pool": "p9"}),
    );
    assert_eq!(gate.pool(), Some("p9"));
    for (v, want) in [
        ("0.4", 0.4),
        ("1.5", 1.0),
        ("0", 0.0),
        ("-0.3", 0.0),
        ("-Inf", 0.0),
    ] {
        s.answer("my_budget", Answer::Vector(vec![v]));
        assert!(close(gate.budget().await, want), "{v}");
    }
    assert_eq!(s.take_queries(), vec!["my_budget"; 5]);

    // Default fallback 0 fails closed; a set fallback is answered, clamped.
    s.answer("my_budget", Answer::Status(500));
    assert_eq!(gate.budget().await, 0.0);
    assert_eq!(verdict(&gate).await, Verdict::Refuse);
    let g = s.gate(
        GateType::PrometheusQuery,
        json!({"query": "my_budget", "fallback": 0.6}),
    );
    assert_eq!(g.budget().await, 0.6);
    assert_eq!(verdict(&g).await, Verdict::Continue);
    let g = s.gate(
        GateType::PrometheusQuery,
        json!({"query": "my_budget", "fallback": 2}),
    );
    assert_eq!(g.budget().await, 1.0);
}

#[tokio::test]
async fn budget_cascade_falls_through() {
    let s = Server::start().await;
    let gate = s.gate(
        GateType::PrometheusBudget,
        json!({"pool": "p1", "namespace": "prod", "max_concurrency": "64", "baseline": 0.1}),
    );
    let q: Vec<String> = promql::budget_cascade("p1", Some("prod"), 64.0)
        .into_iter()
        .map(|q| q.promql)
        .collect();
    assert!(
        q[0].contains(r#"{name="p1",namespace="prod"}) * 64))"#),
        "{}",
        q[0]
    );

    // Nothing answers: all six are asked in order, then the fail-closed fallback.
    assert_eq!(gate.budget().await, 0.0);
    assert_eq!(s.take_queries(), q);
    assert!(!gate.last_reading().unwrap().source_available());

    // Only the last (vLLM's running requests against the old ready-pod count) has a sample,
    // the one before it fails: the last wins.
    s.answer(&q[4], Answer::Status(500));
    s.answer(&q[5], Answer::Vector(vec!["0.7"]));
    assert!(close(gate.budget().await, 0.6));
    assert_eq!(s.take_queries(), q);

    // The per-endpoint queue on the old name has a sample: nothing after it is asked.
    s.answer(&q[3], Answer::Vector(vec!["0.05"]));
    assert_eq!(gate.budget().await, 0.0, "0.05 ≤ baseline 0.1");
    assert_eq!(s.take_queries(), q[..4].to_vec());

    // The first has a sample, even NaN: it wins, and NaN means the fallback.
    s.answer(&q[0], Answer::Vector(vec!["0.9"]));
    assert!(close(gate.budget().await, 0.8));
    s.answer(&q[0], Answer::Vector(vec!["NaN"]));
    assert_eq!(gate.budget().await, 0.0);
    assert_eq!(s.take_queries(), vec![q[0].clone(); 2]);

    // Without a namespace, with the defaults (max_concurrency 100, baseline 0.05).
    let gate = s.gate(
        GateType::PrometheusBudget,
        json!({"pool": "p1", "fallback": 0.5}),
    );
    assert_eq!(gate.budget().await, 0.5);
    let q: Vec<String> = promql::budget_cascade("p1", None, 100.0)
        .into_iter()
        .map(|q| q.promql)
        .collect();
    assert_eq!(s.take_queries(), q);
    s.answer(&q[0], Answer::Vector(vec!["0.55"]));
    assert!(close(gate.budget().await, 0.5));
    assert!(close(gate.last_reading().unwrap().threshold, 0.05));
}

/// Each query is asked on the router's current names first and on the old ones only when the
/// current give no series: a router exporting only new names, only old names, or both (the
/// current then win) is read; with neither, the failure names every metric tried.
#[tokio::test]
async fn current_names_first_then_old_per_query() {
    let s = Server::start().await;
    let sat = s.gate(GateType::PrometheusSaturation, json!({"pool": "p1"}));
    // Old only: asked after the current name, and read.
    s.answer(OLD_SAT_P1, Answer::Vector(vec!["0.5"]));
    assert!(close(sat.budget().await, 0.3));
    assert_eq!(s.take_queries(), [SAT_P1, OLD_SAT_P1]);
    // Both: the current wins, the old is not asked.
    s.answer(SAT_P1, Answer::Vector(vec!["0"]));
    assert_eq!(sat.budget().await, 0.0);
    assert_eq!(verdict(&sat).await, Verdict::Refuse);
    assert_eq!(s.take_queries(), [SAT_P1, SAT_P1]);
    // An erroring current query is a failed source like an empty one: the old is asked.
    s.answer(SAT_P1, Answer::Status(500));
    assert!(close(sat.budget().await, 0.3));
    assert_eq!(s.take_queries(), [SAT_P1, OLD_SAT_P1]);

    // The budget cascade, step by step: a current-name step that has no series falls to the
    // same step on the old names before the next step.
    let q: Vec<String> = promql::budget_cascade("p1", None, 100.0)
        .into_iter()
        .map(|q| q.promql)
        .collect();
    let budget = s.gate(GateType::PrometheusBudget, json!({"pool": "p1"}));
    s.answer(&q[1], Answer::Vector(vec!["0.75"]));
    assert!(close(budget.budget().await, 0.7));
    assert_eq!(s.take_queries(), q[..2].to_vec());
    s.answer(&q[0], Answer::Vector(vec!["0.45"]));
    assert!(close(budget.budget().await, 0.4));
    assert_eq!(s.take_queries(), q[..1].to_vec());

    // Nothing anywhere: the reason names each metric tried once, current names first.
    let none = s.gate(GateType::PrometheusBudget, json!({"pool": "other"}));
    let cascade = Source::cascade(
        Prometheus::new(source::client().unwrap(), &s.base).unwrap(),
        "prometheus-budget",
        promql::budget_cascade("other", None, 100.0).into(),
    );
    let err = Cached::new(cascade, Duration::ZERO)
        .read()
        .await
        .unwrap_err();
    assert_eq!(
        err,
        "Prometheus has no series of any metric the gate reads (tried \
         llm_d_epp_flow_control_queue_size, llm_d_epp_ready_endpoints, \
         inference_extension_flow_control_queue_size, inference_pool_ready_pods, \
         llm_d_epp_per_endpoint_queue_size, inference_pool_per_pod_queue_size, \
         vllm:num_requests_running): is it scraping the router, and does the pool name match?"
    );
    assert_eq!(none.budget().await, 0.0);
    assert!(!none.last_reading().unwrap().source_available());
}

#[tokio::test]
async fn cache_answers_within_the_ttl() {
    let s = Server::start().await;
    s.answer(SAT_P1, Answer::Vector(vec!["0.6"]));
    let params = json!({"pool": "p1"});
    let cached = build_metric(
        &spec(GateType::PrometheusSaturation, params.clone()),
        &s.env(Duration::from_secs(60)),
    )
    .unwrap();
    assert!(close(cached.budget().await, 0.4));
    assert!(close(cached.budget().await, 0.4));
    assert_eq!(s.take_queries().len(), 1);

    let uncached = s.gate(GateType::PrometheusSaturation, params);
    uncached.budget().await;
    uncached.budget().await;
    assert_eq!(s.take_queries().len(), 2);

    // Errors are cached too; a short TTL expires. Short, but seconds: a stalled test must not
    // outlast it between the first two reads.
    s.answer("q", Answer::Status(500));
    let ttl = Duration::from_secs(2);
    let gate = build_metric(
        &spec(GateType::PrometheusQuery, json!({"query": "q"})),
        &s.env(ttl),
    )
    .unwrap();
    assert_eq!(gate.budget().await, 0.0);
    s.answer("q", Answer::Vector(vec!["0.3"]));
    assert_eq!(gate.budget().await, 0.0, "the error is still cached");
    assert_eq!(s.take_queries().len(), 1);
    tokio::time::sleep(ttl + Duration::from_millis(50)).await;
    assert!(close(gate.budget().await, 0.3));
    assert_eq!(s.take_queries().len(), 1);
}

const VLLM_PAGE: &str = r#"# HELP vllm:num_requests_running Running requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m",pod="a"} 3 1712345678000
vllm:num_requests_running{model_name="m",pod="b"} 5
vllm:num_requests_running{model_name="other",pod="a"} 40
# TYPE kv gauge
kv{pod="a"} 0.25
kv{pod="b"} 0.75
"#;

const EPP_PAGE: &str = "# TYPE inference_pool_ready_pods gauge\n\
                        inference_pool_ready_pods{name=\"p1\"} 2\n\
                        inference_pool_ready_pods{name=\"empty\"} 0\n";

#[tokio::test]
async fn endpoint_scrape() {
    let s = Server::start().await;
    s.page("vllm", 200, VLLM_PAGE);
    s.page("epp", 200, EPP_PAGE);
    s.page("down", 500, "oops");
    s.page("broken", 200, "m{a=\"x\"} one\n");
    // No --prometheus-url needed.
    let scrape = |params: Value| {
        build_metric(&spec(GateType::EndpointScrape, params), &GateEnv::default()).unwrap()
    };
    let vllm = s.page_url("vllm");

    // Static capacity: matching counts are summed (3 + 5 = 8 of 10), budget 0.2.
    let g = scrape(json!({"url": vllm, "metric": "vllm:num_requests_running",
        "labels": {"model_name": "m"}, "max_count_per_pod": 10}));
    assert!(close(g.budget().await, 0.2));
    assert_eq!(g.pool(), None);
    // Labels as a JSON string, one series; a baseline.
    let g = scrape(json!({"url": vllm, "metric": "vllm:num_requests_running",
        "labels": "{\"model_name\":\"m\",\"pod\":\"b\"}", "max_count_per_pod": 10, "baseline": 0.1}));
    assert!(close(g.budget().await, 0.4), "1 − 5/10 − 0.1");
    // Over capacity clamps to a value of 0.
    let g = scrape(
        json!({"url": vllm, "metric": "vllm:num_requests_running", "max_count_per_pod": 10}),
    );
    assert_eq!(g.budget().await, 0.0);
    assert_eq!(g.last_reading().unwrap().value, Some(0.0));
    // No capacity: values are fractions, the largest counts (1 − 0.75).
    let g = scrape(json!({"url": vllm, "metric": "kv"}));
    assert!(close(g.budget().await, 0.25));

    // Pods: capacity = 2 ready × 5 = 10.
    let with_pods = |pods_labels: Value| {
        scrape(json!({"url": vllm, "metric": "vllm:num_requests_running",
            "labels": {"model_name": "m"}, "max_count_per_pod": 5,
            "pods_url": s.page_url("epp"), "pods_metric": "inference_pool_ready_pods",
            "pods_labels": pods_labels, "fallback": 0.9}))
    };
    assert!(close(with_pods(json!({"name": "p1"})).budget().await, 0.2));
    // Zero ready pods, or none found: the fallback.
    assert_eq!(with_pods(json!({"name": "empty"})).budget().await, 0.9);
    assert_eq!(with_pods(json!({"name": "nope"})).budget().await, 0.9);

    // Unavailable: no matching series, a non-200 page, a malformed page.
    for (url, metric) in [
        (&vllm, "absent"),
        (&s.page_url("down"), "m"),
        (&s.page_url("broken"), "m"),
    ] {
        let g = scrape(json!({"url": url, "metric": metric, "fallback": 0.3}));
        assert_eq!(g.budget().await, 0.3, "{url} {metric}");
        assert!(!g.last_reading().unwrap().source_available());
    }
}

#[tokio::test]
async fn scrape_cache() {
    let s = Server::start().await;
    s.page("vllm", 200, VLLM_PAGE);
    let env = GateEnv {
        pool_workers: None,
        prometheus_url: None,
        prometheus_cache_ttl: Duration::from_secs(60),
        owner: None,
    };
    let params = json!({"url": s.page_url("vllm"), "metric": "kv"});
    let g = build_metric(&spec(GateType::EndpointScrape, params), &env).unwrap();
    g.budget().await;
    g.budget().await;
    assert_eq!(s.fake.lock().unwrap().scrapes, 1);
}

#[test]
fn build_errors_name_the_parameter() {
    let env = GateEnv {
        pool_workers: None,
        prometheus_url: Some("http://127.0.0.1:9".to_owned()),
        prometheus_cache_ttl: Duration::ZERO,
        owner: None,
    };
    let err = |kind: GateType, params: Value| match build_metric(&spec(kind, params), &env) {
        Ok(_) => panic!("{kind:?} built"),
        Err(e) => e.to_string(),
    };
    use GateType::*;
    for (kind, params, want) in [
        (
            PrometheusSaturation,
            json!({}),
            "gate prometheus-saturation: parameter pool: required",
        ),
        (
            PrometheusSaturation,
            json!({"pool": "p", "threshold": "high"}),
            "parameter threshold: not a number",
        ),
        // Before: accepted, and a gate that could never close (80 meant as percent) or open.
        (
            PrometheusSaturation,
            json!({"pool": "p", "threshold": 80}),
            "parameter threshold: must be in [0, 1], got 80",
        ),
        (
            PrometheusSaturation,
            json!({"pool": "p", "threshold": -0.2}),
            "parameter threshold: must be in [0, 1], got -0.2",
        ),
        (
            EndpointScrape,
            json!({"url": "http://s/metrics", "metric": "m", "baseline": 5}),
            "parameter baseline: must be in [0, 1), got 5",
        ),
        (
            PrometheusBudget,
            json!({"pool": ""}),
            "gate prometheus-budget: parameter pool: required",
        ),
        (
            PrometheusBudget,
            json!({"pool": "p", "max_concurrency": 0}),
            "parameter max_concurrency: must be > 0, got 0",
        ),
        (
            PrometheusBudget,
            json!({"pool": "p", "baseline": 1}),
            "parameter baseline: must be in [0, 1), got 1",
        ),
        (
            PrometheusBudget,
            json!({"pool": "p", "fallback": "NaN"}),
            "parameter fallback: must be a finite number",
        ),
        (
            PrometheusQuery,
            json!({"pool": "p"}),
            "gate prometheus-query: parameter query: required",
        ),
        (
            EndpointScrape,
            json!({"metric": "m"}),
            "gate endpoint-scrape: parameter url: required",
        ),
        (
            EndpointScrape,
            json!({"url": "http://x/metrics"}),
            "parameter metric: required",
        ),
        (
            EndpointScrape,
            json!({"url": "ftp://x", "metric": "m"}),
            "parameter url: \"ftp://x\" is not an http(s) URL",
        ),
        (
            EndpointScrape,
            json!({"url": "http://x", "metric": "m", "labels": "[1]"}),
            "parameter labels: not a JSON object",
        ),
        (
            EndpointScrape,
            json!({"url": "http://x", "metric": "m", "max_count_per_pod": -1}),
            "parameter max_count_per_pod: must be >= 0",
        ),
        (
            EndpointScrape,
            json!({"url": "http://x", "metric": "m", "pods_url": "x"}),
            "parameter pods_url: \"x\" is not a URL",
        ),
        (Constant, json!({}), "\"constant\" is not a metric gate"),
    ] {
        let e = err(kind, params);
        assert!(e.contains(want), "{kind:?}: {e}");
    }

    // The prometheus-* types need --prometheus-url; endpoint-scrape does not.
    for kind in [PrometheusSaturation, PrometheusBudget, PrometheusQuery] {
        for url in [None, Some(String::new())] {
            let env = GateEnv {
                pool_workers: None,
                prometheus_url: url,
                prometheus_cache_ttl: Duration::ZERO,
                owner: None,
            };
            let e = super::build(&spec(kind, json!({"pool": "p", "query": "q"})), &env);
            let e = e.err().map(|e| e.to_string()).unwrap_or_default();
            let name = kind.as_str();
            assert_eq!(
                e,
                format!("gate {name}: \"{name}\" requires --prometheus-url flag to be set")
            );
        }
    }
    let scrape = spec(
        EndpointScrape,
        json!({"url": "http://x/metrics", "metric": "m"}),
    );
    assert!(crate::dispatch::gates::build(&scrape, &GateEnv::default()).is_ok());
}

#[tokio::test]
async fn unreachable_prometheus_gives_the_fallback() {
    // Port 9 (discard) is closed on loopback: the connection is refused at once.
    let env = GateEnv {
        pool_workers: None,
        prometheus_url: Some("http://127.0.0.1:9".to_owned()),
        prometheus_cache_ttl: Duration::ZERO,
        owner: None,
    };
    let g = build_metric(
        &spec(GateType::PrometheusBudget, json!({"pool": "p"})),
        &env,
    )
    .unwrap();
    assert_eq!(g.budget().await, 0.0);
    let g = build_metric(
        &spec(GateType::PrometheusSaturation, json!({"pool": "p"})),
        &env,
    )
    .unwrap();
    assert_eq!(g.budget().await, 1.0, "fails open, as Go");
}

/// An EPP-style page: the batch queue's depth and the ready endpoints, as written.
fn epp_page(queue: &str, ready: &str) -> String {
    format!(
        "llm_d_epp_ready_endpoints{{name=\"pool\"}} {ready}\n\
         llm_d_epp_flow_control_queue_size{{priority=\"-10\"}} {queue}\n"
    )
}

/// A counted endpoint-scrape gate on page `name`, `per_pod` slots per ready endpoint, one
/// reading per `every`, with these extra parameters.
fn counted(s: &Server, name: &str, per_pod: u32, every: Duration, extra: Value) -> Arc<dyn Gate> {
    let mut params = json!({
        "url": s.page_url(name), "metric": "llm_d_epp_flow_control_queue_size",
        "labels": {"priority": "-10"}, "max_count_per_pod": per_pod,
        "pods_url": s.page_url(name), "pods_metric": "llm_d_epp_ready_endpoints",
        "admission": "counted",
    });
    if let (Some(p), Value::Object(extra)) = (params.as_object_mut(), extra) {
        p.extend(extra);
    }
    let env = GateEnv {
        pool_workers: None,
        prometheus_cache_ttl: every,
        ..GateEnv::default()
    };
    build(&spec(GateType::EndpointScrape, params), &env).unwrap()
}

/// How many of `n` requests in a row the gate admits.
async fn admitted(gate: &dyn Gate, n: usize) -> usize {
    let (metadata, labels) = (BTreeMap::new(), BTreeMap::new());
    let mut count = 0;
    for _ in 0..n {
        let input = GateInput {
            metadata: &metadata,
            labels: &labels,
        };
        if gate.apply(input).await.unwrap().verdict == Verdict::Continue {
            count += 1;
        }
    }
    count
}

/// Each reading admits floor(capacity − used), and no more until the next reading, which comes
/// at most once per cache TTL; capacity follows the ready endpoints.
#[tokio::test]
async fn counted_admission_grants_each_readings_headroom() {
    let s = Server::start().await;
    s.page("epp", 200, &epp_page("60", "8"));
    let g = counted(&s, "epp", 8, Duration::from_millis(800), json!({}));
    assert_eq!(
        admitted(g.as_ref(), 10).await,
        4,
        "8 × 8 = 64 slots, 60 used"
    );
    s.page("epp", 200, &epp_page("10", "8"));
    assert_eq!(
        admitted(g.as_ref(), 10).await,
        0,
        "no new reading within the TTL"
    );
    assert_eq!(
        s.fake.lock().unwrap().scrapes,
        2,
        "one reading: queue and pods"
    );
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(
        admitted(g.as_ref(), 100).await,
        54,
        "the next reading's own headroom"
    );
    s.page("epp", 200, &epp_page("0", "4"));
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(admitted(g.as_ref(), 100).await, 32, "4 ready endpoints");

    // Without a cache every call reads: admits while a slot is free.
    let every_call = counted(&s, "epp", 8, Duration::ZERO, json!({}));
    assert_eq!(admitted(every_call.as_ref(), 3).await, 3);
    s.page("epp", 200, &epp_page("32", "4"));
    assert_eq!(admitted(every_call.as_ref(), 3).await, 0);
}

/// A failed reading (an error page, no ready endpoint, an invalid count) admits nothing, and
/// the gate opens again with the next good reading. There is no fallback.
#[tokio::test]
async fn counted_admission_fails_closed() {
    let s = Server::start().await;
    let every_call = Duration::ZERO;
    s.page("epp", 503, &epp_page("0", "8"));
    let g = counted(&s, "epp", 8, every_call, json!({}));
    assert_eq!(g.budget().await, 0.0);
    assert_eq!(admitted(g.as_ref(), 10).await, 0, "an error page");
    s.page("epp", 200, &epp_page("0", "0"));
    assert_eq!(
        admitted(g.as_ref(), 10).await,
        0,
        "an empty pool has no capacity"
    );
    for (queue, ready) in [
        ("NaN", "8"),
        ("-5", "8"),
        ("+Inf", "8"),
        ("0", "NaN"),
        ("0", "+Inf"),
    ] {
        s.page("epp", 200, &epp_page(queue, ready));
        assert_eq!(g.budget().await, 0.0, "queue {queue}, ready {ready}");
        assert_eq!(
            admitted(g.as_ref(), 10).await,
            0,
            "queue {queue}, ready {ready}"
        );
    }
    s.page("epp", 200, &epp_page("0", "8"));
    assert_eq!(admitted(g.as_ref(), 100).await, 100, "open again");

    // A page without the series reads as `absent_value` when one is set, else admits nothing.
    s.page(
        "nothing",
        200,
        "llm_d_epp_ready_endpoints{name=\"pool\"} 2\n",
    );
    let absent = counted(
        &s,
        "nothing",
        8,
        Duration::from_secs(60),
        json!({"absent_value": 0}),
    );
    assert_eq!(admitted(absent.as_ref(), 100).await, 16);
    let strict = counted(&s, "nothing", 8, Duration::from_secs(60), json!({}));
    assert_eq!(admitted(strict.as_ref(), 10).await, 0);
}

/// The budget stays 1 while one admission is left (the dispatcher scales its batch by it, so a
/// fraction would strand the last slots), and concurrent workers never admit more than a
/// reading granted.
#[tokio::test]
async fn counted_admission_budget_and_concurrency() {
    let s = Server::start().await;
    s.page("one", 200, &epp_page("0", "1"));
    let g = counted(&s, "one", 4, Duration::from_secs(60), json!({}));
    assert_eq!(g.budget().await, 1.0);
    assert_eq!(admitted(g.as_ref(), 3).await, 3);
    assert_eq!(g.budget().await, 1.0, "one slot left");
    assert_eq!(admitted(g.as_ref(), 1).await, 1);
    assert_eq!(g.budget().await, 0.0);

    s.page("busy", 200, &epp_page("54", "8"));
    let g = counted(&s, "busy", 8, Duration::from_secs(60), json!({}));
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let g = g.clone();
            tokio::spawn(async move { admitted(g.as_ref(), 1).await })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, 10);
}

/// `absent_value` and `value_type` with budget admission: a page read without the series
/// gives the absent value (the source stays available), and a budget-typed metric is the
/// budget itself.
#[tokio::test]
async fn scrape_absent_value_and_budget_value_type() {
    let s = Server::start().await;
    s.page("vllm", 200, VLLM_PAGE);
    let scrape = |params: Value| {
        build_metric(&spec(GateType::EndpointScrape, params), &GateEnv::default()).unwrap()
    };
    let vllm = s.page_url("vllm");
    let g = scrape(
        json!({"url": vllm, "metric": "absent", "max_count_per_pod": 10,
        "absent_value": "2", "fallback": 0.9}),
    );
    assert!(close(g.budget().await, 0.8), "1 − 2/10");
    assert!(g.last_reading().unwrap().source_available());
    let g = scrape(json!({"url": vllm, "metric": "absent", "fallback": 0.9}));
    assert_eq!(g.budget().await, 0.9, "without absent_value: unavailable");
    // An error page is still unavailable, absent_value or not.
    s.page("down", 500, "oops");
    let g = scrape(
        json!({"url": s.page_url("down"), "metric": "m", "absent_value": 0, "fallback": 0.3}),
    );
    assert_eq!(g.budget().await, 0.3);

    // value_type budget: the metric is the budget (the smallest of several), or the count
    // over the capacity.
    let g = scrape(json!({"url": vllm, "metric": "kv", "value_type": "budget"}));
    assert!(close(g.budget().await, 0.25));
    let g = scrape(json!({"url": vllm, "metric": "vllm:num_requests_running",
        "labels": {"model_name": "m", "pod": "a"}, "max_count_per_pod": 10, "value_type": "budget"}));
    assert!(close(g.budget().await, 0.3));
}

#[test]
fn counted_and_value_type_parameter_errors() {
    let base = || {
        json!({"url": "http://x/metrics", "metric": "m", "max_count_per_pod": 8,
            "admission": "counted"})
    };
    type Change = dyn Fn(&mut Map<String, Value>);
    let error = |change: &Change| {
        let mut p = base();
        change(p.as_object_mut().unwrap());
        match build(&spec(GateType::EndpointScrape, p), &GateEnv::default()) {
            Ok(_) => "(built)".to_owned(),
            Err(e) => e.to_string(),
        }
    };
    assert_eq!(error(&|_| {}), "(built)");
    let cases: [(&str, &Change); 7] = [
        (
            "max_count_per_pod: must be > 0 with admission counted",
            &|p| {
                p.remove("max_count_per_pod");
            },
        ),
        (
            "value_type: must be saturation with admission counted",
            &|p| {
                p.insert("value_type".into(), json!("budget"));
            },
        ),
        ("baseline: not taken with admission counted", &|p| {
            p.insert("baseline".into(), json!(0.1));
        }),
        ("fallback: not taken with admission counted", &|p| {
            p.insert("fallback".into(), json!(1));
        }),
        (
            "admission: must be budget or counted, got \"greedy\"",
            &|p| {
                p.insert("admission".into(), json!("greedy"));
            },
        ),
        (
            "value_type: must be saturation or budget, got \"ratio\"",
            &|p| {
                p.insert("value_type".into(), json!("ratio"));
            },
        ),
        ("absent_value: must be a finite number, got NaN", &|p| {
            p.insert("absent_value".into(), json!("NaN"));
        }),
    ];
    for (want, change) in cases {
        let got = error(change);
        assert!(
            got.starts_with(&format!("gate endpoint-scrape: parameter {want}")),
            "{got}"
        );
    }
    // A zero baseline or fallback is no setting, as in Go.
    assert_eq!(
        error(&|p| {
            p.insert("baseline".into(), json!(0));
            p.insert("fallback".into(), json!("0"));
        }),
        "(built)"
    );
}
