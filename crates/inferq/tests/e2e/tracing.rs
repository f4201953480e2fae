//! End-to-end tests of OpenTelemetry tracing: `inferq run` with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! pointing at a real OTLP gRPC receiver (tonic, the collector's own protocol) exports Go's spans
//! and carries the trace to the gateway in a `traceparent` header.

use crate::common;
use crate::harness;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use inferq_testkit::RedisServer;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::status::StatusCode;

/// One exported span with what the tests look at.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    scope: String,
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
    status: i32,
    /// (trace id, span id) of each linked span.
    links: Vec<(String, String)>,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn text(kv: &KeyValue) -> String {
    match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// An OTLP trace receiver keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver {
    spans: Arc<Mutex<Vec<Got>>>,
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let hex = |bytes: &[u8]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .map(text)
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                let scope = scope_spans.scope.map(|s| s.name).unwrap_or_default();
                for span in scope_spans.spans {
                    spans.push(Got {
                        service: service.clone(),
                        scope: scope.clone(),
                        name: span.name,
                        kind: span.kind,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv)))
                            .collect(),
                        status: span.status.map(|s| s.code).unwrap_or_default(),
                        links: span
                            .links
                            .iter()
                            .map(|l| (hex(&l.trace_id), hex(&l.span_id)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// How a receiver serves TLS: its certificate and key (PEM), and the CA its clients'
/// certificates must chain to when it asks for one.
struct ReceiverTls {
    cert: Vec<u8>,
    key: Vec<u8>,
    client_ca: Option<Vec<u8>>,
}

/// A receiver on a free port; with `tls`, serving TLS so.
async fn start_receiver(tls: Option<ReceiverTls>) -> (Receiver, SocketAddr) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let receiver = Receiver::default();
    let service = TraceServiceServer::new(receiver.clone());
    let mut server = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        let identity = tonic::transport::Identity::from_pem(tls.cert, tls.key);
        let mut config = tonic::transport::ServerTlsConfig::new().identity(identity);
        if let Some(ca) = tls.client_ca {
            config = config.client_ca_root(tonic::transport::Certificate::from_pem(ca));
        }
        server = server.tls_config(config).unwrap();
    }
    tokio::spawn(async move {
        let incoming = tokio_stream_of(listener);
        let _ = server
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
    });
    (receiver, addr)
}

/// The listener's connections as the stream tonic's server takes.
fn tokio_stream_of(
    listener: tokio::net::TcpListener,
) -> impl futures::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
    futures::stream::unfold(listener, |listener| async move {
        let next = listener.accept().await.map(|(stream, _)| stream);
        Some((next, listener))
    })
}

/// Waits for `n` results, stops the processor (SIGTERM; it flushes its spans before exiting 0)
/// and returns every span the receiver got.
async fn spans_after_results(
    p: &mut Processor,
    con: &mut redis::aio::ConnectionManager,
    n: usize,
    receiver: &Receiver,
) -> Vec<Got> {
    let got = wait_results(con, n, Duration::from_secs(10)).await;
    assert_eq!(got.len(), n, "{}", p.log());
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(20)).await, Some(0));
    receiver.spans.lock().unwrap().clone()
}

/// A message carrying a W3C trace context in its metadata gets a `process-request` span in that
/// trace, an `http-request` client span under it, and the gateway sees the client span's
/// context in `traceparent`; a request the gateway refuses gets `error.category` and an error
/// status; every span reaches the collector by the time the processor has stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_spans_reach_the_collector_and_the_trace_reaches_the_gateway() {
    let (receiver, addr) = start_receiver(None).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script("bad", vec![Reply::status(400, r#"{"error":"no"}"#)]);
    let opts = ProcessorOpts {
        env: vec![(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            format!("http://{addr}"),
        )],
        ..ProcessorOpts::default()
    };
    let mut p = Processor::start(&redis, &gw, &opts).await;

    let parent_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let parent_span = "00f067aa0ba902b7";
    let mut traced = request("traced", 60, r#"{"model":"m-body","prompt":"a"}"#);
    // Newer Go's data.model names the model before the body does.
    traced.model = "m-data".to_owned();
    traced.metadata.insert(
        "traceparent".to_owned(),
        format!("00-{parent_trace}-{parent_span}-01"),
    );
    traced.headers.insert(
        "traceparent".to_owned(),
        "00-ffffffffffffffffffffffffffffffff-ffffffffffffffff-01".to_owned(),
    );
    let producer = producer(&redis, &opts.queue).await;
    producer.submit(traced).await.unwrap();
    producer
        .submit(request("bad", 60, r#"{"model":"m-body","prompt":"b"}"#))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let spans = spans_after_results(&mut p, &mut con, 2, &receiver).await;
    let find = |name: &str, id: &str| {
        spans
            .iter()
            .find(|s| s.name == name && (s.attr("request.id") == Some(id) || s.trace_id == id))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} span for {id} in {spans:#?}"))
    };
    assert!(
        !spans.iter().any(|s| s.attr("db.system") == Some("redis")),
        "no spans of Redis commands unless enable_tracing asks: {spans:#?}"
    );
    let process = find("process-request", "traced");
    assert_eq!(process.service, "llm-d-async");
    assert_eq!(process.scope, "llm-d-async");
    assert_eq!(
        process.trace_id, parent_trace,
        "the message's trace is continued"
    );
    assert_eq!(process.parent_span_id, parent_span);
    assert_eq!(process.attr("retry.count"), Some("0"));
    assert_eq!(process.attr("queue.name"), Some(opts.queue.as_str()));
    assert_eq!(process.attr("error.category"), None);
    assert_ne!(process.status, StatusCode::Error as i32);
    assert_eq!(process.attr("gen_ai.request.model"), Some("m-data"));
    // go-v011 §5: the semantic-convention names, with the old ones beside them.
    assert_eq!(process.attr("gen_ai.request.id"), Some("traced"));
    assert_eq!(process.attr("request.id"), Some("traced"));
    assert_eq!(process.attr("llm_d.async.retry_count"), Some("0"));
    assert_eq!(
        process.attr("llm_d.async.queue.name"),
        Some(opts.queue.as_str())
    );
    assert_eq!(
        process.attr("llm_d.async.queue.id"),
        process.attr("queue.id")
    );
    assert!(
        process.attr("llm_d.async.queue.id").is_some(),
        "{process:?}"
    );
    assert_eq!(process.attr("llm_d.async.error.category"), None);

    let http = spans
        .iter()
        .find(|s| s.name == "http-request" && s.parent_span_id == process.span_id)
        .unwrap_or_else(|| panic!("no http-request under process-request: {spans:#?}"));
    assert_eq!(http.kind, SpanKind::Client as i32);
    assert_eq!(http.trace_id, parent_trace);
    assert_eq!(http.attr("http.response.status_code"), Some("200"));
    assert_eq!(http.attr("http.request.method"), Some("POST"));

    // The gateway saw the client span's context, not the message's own traceparent header.
    let seen = gw.seen("traced");
    let traceparent = seen[0].headers["traceparent"].to_str().unwrap().to_owned();
    assert_eq!(
        traceparent,
        format!("00-{parent_trace}-{}-01", http.span_id),
        "{seen:?}"
    );

    let refused = find("process-request", "bad");
    assert_ne!(
        refused.trace_id, parent_trace,
        "no parent: a trace of its own"
    );
    assert_eq!(refused.parent_span_id, "");
    // Without data.model, the body's model.
    assert_eq!(refused.attr("gen_ai.request.model"), Some("m-body"));
    assert!(refused.attr("error.category").is_some(), "{refused:?}");
    assert_eq!(
        refused.attr("llm_d.async.error.category"),
        refused.attr("error.category")
    );
    assert_eq!(refused.status, StatusCode::Error as i32, "{refused:?}");
}

/// Go's `re-enqueue` span: a request still at the gateway when the drain timeout ends goes back
/// to its queue, and a span `re-enqueue` starts a new trace linked to the request's
/// `process-request` span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_timeout_sends_a_request_back_with_a_linked_reenqueue_span() {
    let (receiver, addr) = start_receiver(None).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script("slow", vec![Reply::ok("{}").after(Duration::from_secs(30))]);
    let opts = ProcessorOpts {
        env: vec![(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            format!("http://{addr}"),
        )],
        drain: "1s",
        ..ProcessorOpts::default()
    };
    let mut p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, &opts.queue).await;
    producer.submit(request("slow", 60, "{}")).await.unwrap();
    gw.wait_seen("slow", Duration::from_secs(10)).await;
    p.signal("TERM");
    assert_eq!(p.wait_exit(Duration::from_secs(20)).await, Some(0));
    let mut con = con(&redis).await;
    let pending: u64 = redis::AsyncCommands::zcard(&mut con, &opts.queue)
        .await
        .unwrap();
    assert_eq!(pending, 1, "the request went back to its queue");

    let spans = receiver.spans.lock().unwrap().clone();
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name && s.attr("request.id") == Some("slow"))
            .cloned()
            .unwrap_or_else(|| {
                panic!(
                    "no {name} span in {spans:#?}
{}",
                    p.log()
                )
            })
    };
    let process = named("process-request");
    let reenqueue = named("re-enqueue");
    assert_eq!(reenqueue.parent_span_id, "", "a new trace");
    assert_eq!(reenqueue.attr("gen_ai.request.id"), Some("slow"));
    assert_ne!(reenqueue.trace_id, process.trace_id);
    assert_eq!(
        reenqueue.links,
        vec![(process.trace_id.clone(), process.span_id.clone())]
    );
}

/// Go's `enable_tracing`: every Redis command the processor sends is a client span named after
/// the command, a root span of its own; a script call names its script; the server's address is
/// there, and no span carries a request's payload. A command Redis refuses is an error span.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enable_tracing_exports_a_span_per_redis_command_without_the_payloads() {
    let (receiver, addr) = start_receiver(None).await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        env: vec![(
            "OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(),
            format!("http://{addr}"),
        )],
        extra_transport_fields: r#","enable_tracing":true"#.to_owned(),
        ..ProcessorOpts::default()
    };
    let mut p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, &opts.queue).await;
    for id in ["r1", "r2"] {
        producer
            .submit(request(id, 60, r#"{"prompt":"secret-prompt-text"}"#))
            .await
            .unwrap();
    }
    let mut con = con(&redis).await;
    assert_eq!(
        wait_results(&mut con, 2, Duration::from_secs(10))
            .await
            .len(),
        2
    );
    // A SCRIPT FLUSH makes the next call of each script fail with NOSCRIPT (then it is loaded
    // and called again): the failed call is an error span.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query_async(&mut con)
        .await
        .unwrap();
    producer
        .submit(request("r3", 60, r#"{"prompt":"secret-prompt-text"}"#))
        .await
        .unwrap();
    let spans = spans_after_results(&mut p, &mut con, 3, &receiver).await;
    let redis_spans: Vec<&Got> = spans
        .iter()
        .filter(|s| s.attr("db.system") == Some("redis"))
        .collect();
    let script = |name: &str| {
        redis_spans
            .iter()
            .filter(|s| s.name == "evalsha" && s.attr("db.stored_procedure.name") == Some(name))
            .count()
    };
    assert!(script("take") >= 1, "{redis_spans:#?}");
    assert!(script("finish") >= 1, "{redis_spans:#?}");
    assert!(
        redis_spans.iter().any(|s| s.name == "script load"),
        "{redis_spans:#?}"
    );
    let port = redis.port().to_string();
    for s in &redis_spans {
        assert_eq!(s.kind, SpanKind::Client as i32, "{s:?}");
        assert_eq!(s.parent_span_id, "", "a root span: {s:?}");
        assert_eq!(s.attr("server.address"), Some("127.0.0.1"), "{s:?}");
        assert_eq!(s.attr("server.port"), Some(port.as_str()), "{s:?}");
        assert_eq!(s.service, "llm-d-async");
    }
    assert!(
        redis_spans.iter().any(|s| s.name == "evalsha"
            && s.status == StatusCode::Error as i32
            && s.attr("error.type") == Some("NOSCRIPT")),
        "the NOSCRIPT call is an error span: {redis_spans:#?}"
    );
    let all = format!("{spans:?}");
    assert!(!all.contains("secret-prompt-text"), "{all}");
    // The request spans are there as before.
    assert!(spans.iter().any(|s| s.name == "process-request"));
}

/// One request through a processor with these OTLP variables; the spans the receiver got once
/// the processor has stopped, and the processor's log.
async fn spans_of_one_request(receiver: &Receiver, env: &[(&str, String)]) -> (Vec<Got>, String) {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        env: env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        ..ProcessorOpts::default()
    };
    let p = one_request_then_stop(&redis, &gw, &opts, "one").await;
    let spans = receiver.spans.lock().unwrap().clone();
    (spans, p.log())
}

/// The spans of a served request reached the collector: its `process-request` and the attempt's
/// `http-request`.
fn assert_request_spans(spans: &[Got], log: &str) {
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"process-request") && names.contains(&"http-request"),
        "{names:?}\n{log}"
    );
}

/// An `https://` collector with a private CA: trusted through `OTEL_EXPORTER_OTLP_CERTIFICATE`,
/// or because the system certificate store holds the CA (`SSL_CERT_FILE`, as Go's exporter trusts
/// the system pool), and refused otherwise (the machine's store and the bundled public roots do
/// not know the CA): the export failure is logged and the request is served all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_collector_is_trusted_through_the_certificate_variable() {
    let certs = harness::Certs::new();
    let pem = |name: &str| std::fs::read(certs.path(name)).unwrap();
    let (receiver, addr) = start_receiver(Some(ReceiverTls {
        cert: pem("server.crt"),
        key: pem("server.key"),
        client_ca: None,
    }))
    .await;
    let endpoint = format!("https://localhost:{}", addr.port());

    let (spans, log) = spans_of_one_request(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_CERTIFICATE", certs.arg("ca.crt")),
        ],
    )
    .await;
    assert_request_spans(&spans, &log);

    receiver.spans.lock().unwrap().clear();
    let (spans, log) = spans_of_one_request(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            ("SSL_CERT_FILE", certs.arg("ca.crt")),
        ],
    )
    .await;
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"process-request"), "{names:?}\n{log}");

    receiver.spans.lock().unwrap().clear();
    let (spans, log) =
        spans_of_one_request(&receiver, &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)]).await;
    assert!(spans.is_empty(), "{spans:?}");
    assert!(log.contains("ExportError"), "{log}");
}

/// A collector that asks for a client certificate gets the one the standard variables
/// (`OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `_CLIENT_KEY`) name, as Go's exporter presents
/// it: the spans arrive. Without it the handshake is refused: the export failure is logged and
/// the request is served all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_asking_for_a_client_certificate_gets_the_variables_one() {
    let certs = harness::Certs::new();
    let pem = |name: &str| std::fs::read(certs.path(name)).unwrap();
    let (receiver, addr) = start_receiver(Some(ReceiverTls {
        cert: pem("server.crt"),
        key: pem("server.key"),
        client_ca: Some(pem("ca.crt")),
    }))
    .await;
    let endpoint = format!("https://localhost:{}", addr.port());
    let trusted = ("OTEL_EXPORTER_OTLP_CERTIFICATE", certs.arg("ca.crt"));

    let (spans, log) = spans_of_one_request(
        &receiver,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.clone()),
            trusted.clone(),
            (
                "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
                certs.arg("client.crt"),
            ),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", certs.arg("client.key")),
        ],
    )
    .await;
    assert_request_spans(&spans, &log);

    receiver.spans.lock().unwrap().clear();
    let (spans, log) = spans_of_one_request(
        &receiver,
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint), trusted],
    )
    .await;
    assert!(spans.is_empty(), "{spans:?}");
    assert!(log.contains("ExportError"), "{log}");
}
