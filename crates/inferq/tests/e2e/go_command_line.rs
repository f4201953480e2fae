//! End-to-end tests of `inferq run` started with a Go deployment's command line: the
//! deprecated `--message-queue-impl`/`--redis.*` flags, Go's zap logging flags and Go's boolean
//! spellings, as the Go processor's chart and older manifests pass them.

use crate::common;

use std::time::Duration;

use common::*;
use inferq_testkit::RedisServer;

/// A Go command line on the legacy multi-queue path (`--redis.ss.queues-config-file` with a pool
/// file), with the zap flags and Go's `0`/`F` booleans, starts the processor, and each queue's
/// requests are served by its pool with its own settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_legacy_command_line_serves_the_queues_of_its_queues_file() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let queues = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        queues.path(),
        format!(
            r#"[{{"queue_name":"interactive","igw_base_url":"{gw}","inference_objective":"fast"}},
                {{"queue_name":"nightly","igw_base_url":"{gw}","worker_pool_id":"batch",
                  "request_path_url":"/v1/chat/completions"}}]"#,
            gw = gw.url()
        ),
    )
    .unwrap();
    let go_flags = [
        "--message-queue-impl=redis-sortedset".to_owned(),
        format!("--redis.url={}", redis.url()),
        format!("--redis.ss.queues-config-file={}", queues.path().display()),
        "--redis.ss.poll-interval-ms=50".to_owned(),
        "--redis-tracing=0".to_owned(),
        "--tls-insecure-skip-verify=F".to_owned(),
        "--zap-devel".to_owned(),
        "--zap-encoder=console".to_owned(),
        "--zap-log-level=info".to_owned(),
        "--zap-stacktrace-level=error".to_owned(),
        "--zap-time-encoding=iso8601".to_owned(),
        "-v=2".to_owned(),
    ];
    let opts = ProcessorOpts {
        pools: Some(r#"[{"id":"default","workers":2},{"id":"batch","workers":1}]"#.to_owned()),
        transport_args: Some(go_flags.to_vec()),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;

    producer(&redis, "interactive")
        .await
        .submit(request("i-1", 60, r#"{"prompt":"a"}"#))
        .await
        .unwrap();
    producer(&redis, "nightly")
        .await
        .submit(request("n-1", 60, r#"{"prompt":"b"}"#))
        .await
        .unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 2, Duration::from_secs(10)).await;
    let mut ids: Vec<(&str, u16)> = got.iter().map(|r| (r.id.as_str(), r.status_code)).collect();
    ids.sort();
    assert_eq!(ids, vec![("i-1", 200), ("n-1", 200)]);

    let interactive = gw.seen("i-1");
    assert_eq!(interactive[0].path, "/v1/completions");
    assert_eq!(
        interactive[0].headers["x-gateway-inference-objective"],
        "fast"
    );
    let nightly = gw.seen("n-1");
    assert_eq!(nightly[0].path, "/v1/chat/completions");
    assert!(!nightly[0]
        .headers
        .contains_key("x-gateway-inference-objective"));
    assert!(
        p.log().contains("--zap-log-level=info is ignored"),
        "{}",
        p.log()
    );
}

/// A Go production command line (`--zap-devel=false`) gets zap's JSON log lines: every line the
/// processor writes from start to shutdown is one object with zap's keys, `ts` in the encoding
/// `--zap-time-encoding` names, warnings at level `warn`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_production_zap_command_line_writes_json_log_lines() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_args: [
            "--zap-devel=false",
            "--zap-time-encoding=epoch",
            "--zap-log-level=info",
        ]
        .map(str::to_owned)
        .to_vec(),
        ..ProcessorOpts::default()
    };
    let p = one_request_then_stop(&redis, &gw, &opts, "j-1").await;

    let log = p.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(lines.len() >= 3, "{log}");
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    for line in &lines {
        for key in ["level", "logger", "msg"] {
            assert!(line[key].is_string(), "{key} in {line}");
        }
        let ts = line["ts"]
            .as_f64()
            .unwrap_or_else(|| panic!("ts in {line}"));
        assert!(
            (started - ts).abs() < 120.0,
            "ts {ts} is not epoch seconds: {line}"
        );
    }
    assert!(
        lines.iter().any(|l| l["level"] == "warn"
            && l["msg"]
                .as_str()
                .is_some_and(|m| m.contains("--zap-log-level=info is ignored"))),
        "{log}"
    );
}

/// What Go refuses is refused with exit code 2 naming the flag, and a Go command line for the
/// gcp-pubsub transport is refused for that transport, not for its flags.
#[test]
fn go_values_and_transports_inferq_refuses_exit_2_naming_why() {
    let refused = |args: &[&str]| {
        let out = cli(args, &[], "");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = refused(&[
        "run",
        "--message-queue-impl=gcp-pubsub",
        "--pubsub.project-id=p",
        "--pubsub.igw-base-url=http://gw",
        "--pubsub.request-subscriber-id=requests",
        "--pubsub.result-topic-id=results",
        "--zap-devel=false",
    ]);
    assert_eq!(code, Some(2), "{err}");
    // --zap-devel=false: the error is Go's production log line, one JSON object.
    let line: serde_json::Value = serde_json::from_str(err.trim()).unwrap_or_else(|e| {
        panic!("not one JSON line ({e}): {err}");
    });
    assert_eq!(line["level"], "error", "{err}");
    assert_eq!(
        line["msg"],
        "invalid config: --message-queue-impl: \"gcp-pubsub\" is not supported; inferq \
         supports redis-sortedset and redis-pubsub (gcp-pubsub is not supported)",
        "{err}"
    );
    for (arg, flag) in [
        ("--zap-log-level=warn", "--zap-log-level"),
        ("--redis-tracing=yes", "--redis-tracing"),
        ("--metrics-endpoint-auth=on", "--metrics-endpoint-auth"),
    ] {
        let (code, err) = refused(&["run", arg]);
        assert_eq!(code, Some(2), "{arg}: {err}");
        let value = arg.split_once('=').map_or("", |(_, v)| v);
        assert!(
            err.contains(&format!("invalid value '{value}' for '{flag}")),
            "{arg}: {err}"
        );
    }
}

/// A gate whose parameters are wrong, given with the legacy flags, is refused naming the flag the
/// user wrote, and before anything listens: with the health port taken, the answer is still the
/// gate (before: exit 1 "cannot listen for health", and with the port free the message named
/// `queues[0].gate_params`, a field of a JSON the user never wrote).
#[test]
fn a_bad_legacy_gate_is_named_by_its_flag_before_anything_listens() {
    let taken = std::net::TcpListener::bind("[::]:0")
        .or_else(|_| std::net::TcpListener::bind("0.0.0.0:0"))
        .unwrap();
    let health_port = format!("--health-port={}", taken.local_addr().unwrap().port());
    let legacy = [
        "run",
        "--metrics-endpoint-auth=false",
        &health_port,
        "--metrics-port=0",
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://127.0.0.1:1",
    ];
    let single = [
        "--redis.ss.igw-base-url=http://gw",
        "--redis.ss.gate-type=local-max-concurrency",
        r#"--redis.ss.gate-params={"limit":0}"#,
    ];
    let queues = r#"--redis.ss.queues-config=[{"queue_name":"a","igw_base_url":"http://gw"},
        {"queue_name":"b","igw_base_url":"http://gw","gate_type":"redis"}]"#;
    let cases: [(Vec<&str>, &str); 2] = [
        (
            single.to_vec(),
            "invalid config: --redis.ss.gate-params: gate local-max-concurrency: parameter limit: \
             must be > 0, got 0",
        ),
        (
            vec![queues],
            "invalid config: --redis.ss.queues-config: [1].gate_params: gate redis: parameter \
             address: required",
        ),
    ];
    for (flags, expected) in cases {
        let args: Vec<&str> = legacy.iter().copied().chain(flags).collect();
        let out = cli(&args, &[], "");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(expected), "{expected}\n{err}");
    }
}
