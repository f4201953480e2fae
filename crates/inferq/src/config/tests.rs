//! End-to-end tests of [`super::load_with_env`]: flags parsed by clap, files on disk, an
//! injected environment, and the exact error texts users see.

use std::io::Write;
use std::time::Duration;

use super::args::tests::parse;
use super::*;
use inferq_client::ClaimSettings;

/// go-compat §3.2's example, verbatim.
const GO_EXAMPLE: &str = r#"{"url":"redis://...","retry_queue_name":"retry-sortedset","result_queue_name":"result-list",
 "poll_interval_ms":1000,"batch_size":10,"enable_tracing":false,
 "queues":[{"id":"q1","queue_name":"request-sortedset","result_queue_name":"","worker_pool_id":"default",
            "inference_objective":"","request_path_url":"/v1/completions","igw_base_url":"http://gw:80",
            "gate_type":"redis","gate_params":{"address":"redis:6379"},"labels":{"tier":"batch"}}]}"#;

/// A minimal valid transport config.
const MINIMAL: &str =
    r#"{"url":"redis://r:6379","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;

fn no_env(_: &str) -> Option<String> {
    None
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn path(f: &tempfile::NamedTempFile) -> String {
    f.path().display().to_string()
}

fn load_ok(flags: &[&str]) -> RunConfig {
    let args = parse(flags).unwrap();
    load_with_env(&args, no_env).unwrap_or_else(|e| panic!("{e}"))
}

fn load_err(flags: &[&str]) -> String {
    load_err_env(flags, &no_env)
}

fn load_err_env(flags: &[&str], env: &dyn Fn(&str) -> Option<String>) -> String {
    let args = parse(flags).unwrap();
    match load_with_env(&args, env) {
        Ok(c) => format!("loaded {c:?}"),
        Err(e) => e.to_string(),
    }
}

fn inline(json: &str) -> String {
    format!("--transport-config={json}")
}

const SS: &str = "--transport=redis-sortedset";

#[test]
fn go_example_file_loads_with_go_defaults() {
    let f = file(GO_EXAMPLE);
    let file_flag = format!("--transport-config-file={}", path(&f));
    let c = load_ok(&[SS, &file_flag]);
    assert_eq!(c.transport_source, TransportSource::File(f.path().into()));
    assert_eq!(c.transport.url.expose(), "redis://...");
    assert_eq!(c.transport.retry_queue_name, "retry-sortedset");
    assert_eq!(c.transport.result_queue_name, "result-list");
    assert_eq!(c.transport.poll_interval, Duration::from_secs(1));
    assert_eq!(c.transport.batch_size, 10);
    let q = &c.transport.queues[0];
    assert_eq!(
        (q.id.as_str(), q.queue_name.as_str()),
        ("q1", "request-sortedset")
    );
    assert_eq!(q.worker_pool_id, "default");
    assert_eq!(q.request_path_url, "/v1/completions");
    assert_eq!(q.gate.as_ref().map(|g| g.kind), Some(GateType::Redis));
    assert_eq!(
        c.pools,
        vec![PoolConfig {
            id: "default".into(),
            workers: 64,
            gate: None
        }]
    );
    assert_eq!(c.total_workers(), 64);
    assert!(c.pool("default").is_some());
    assert_eq!(c.merge_policy, MergePolicy::default());
    assert_eq!(c.claim, ClaimSettings::default());
    assert_eq!(c.request_timeout, Duration::from_secs(300));
    assert_eq!(c.drain_timeout, Duration::from_secs(120));
    assert_eq!((c.health_port, c.metrics_port), (8081, 9090));
    assert_eq!(
        c.metrics_backlog_poll_interval,
        Some(Duration::from_secs(15))
    );
    assert_eq!(c.tls, None);
    assert_eq!(
        c.prometheus,
        PrometheusSettings {
            url: None,
            cache_ttl: Duration::from_secs(5)
        }
    );
    assert_eq!(c.verbosity, 2);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.starts_with("--metrics-endpoint-auth is ignored")));
}

#[test]
fn zero_drain_timeout_means_do_not_wait() {
    let c = load_ok(&[SS, &inline(MINIMAL), "--drain-timeout=0s"]);
    assert_eq!(c.drain_timeout, Duration::ZERO);
}

/// `--gate-wait-timeout` (go-v011 §2): Go's default 5m; `0` waits until the deadline; a bad or
/// negative value exits naming the flag.
#[test]
fn gate_wait_timeout_defaults_to_five_minutes_and_zero_means_the_deadline() {
    let c = load_ok(&[SS, &inline(MINIMAL)]);
    assert_eq!(c.gate_wait_timeout, Some(Duration::from_secs(300)));
    let c = load_ok(&[SS, &inline(MINIMAL), "--gate-wait-timeout=0"]);
    assert_eq!(c.gate_wait_timeout, None);
    let c = load_ok(&[SS, &inline(MINIMAL), "--gate-wait-timeout=1m30s"]);
    assert_eq!(c.gate_wait_timeout, Some(Duration::from_secs(90)));
    for bad in ["--gate-wait-timeout=soon", "--gate-wait-timeout=-1s"] {
        assert!(
            load_err(&[SS, &inline(MINIMAL), bad])
                .starts_with("invalid config: --gate-wait-timeout:"),
            "{bad}"
        );
    }
}

#[test]
fn inline_config_and_flag_values() {
    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        "--concurrency=3",
        "--request-timeout=1m30s",
        "--drain-timeout=500ms",
        "--metrics-backlog-poll-interval=0",
        "--metrics-endpoint-auth=false",
        "--prometheus-url=http://prom:9090",
        "--prometheus-cache-ttl=0",
        "-v",
        "4",
    ]);
    assert_eq!(c.transport_source, TransportSource::Inline);
    assert_eq!(c.pools[0].workers, 3);
    assert_eq!(c.request_timeout, Duration::from_secs(90));
    assert_eq!(c.drain_timeout, Duration::from_millis(500));
    assert_eq!(c.metrics_backlog_poll_interval, None);
    assert_eq!(c.prometheus.url.as_deref(), Some("http://prom:9090"));
    assert_eq!(c.prometheus.cache_ttl, Duration::ZERO);
    assert_eq!(c.verbosity, 4);
    assert!(c.warnings.is_empty(), "{:?}", c.warnings);
}

#[test]
fn transport_surface_rules() {
    assert_eq!(
        load_err(&[&inline(MINIMAL)]),
        "invalid config: --transport: not set, so Go would use redis-pubsub; inferq asks for the \
         choice to be explicit: pass --transport=redis-pubsub or --transport=redis-sortedset"
    );
    assert_eq!(
        load_err(&["--transport=gcp-pubsub", &inline(MINIMAL)]),
        "invalid config: --transport: \"gcp-pubsub\" is not supported; inferq supports \
         redis-sortedset and redis-pubsub (gcp-pubsub is not supported)"
    );
    assert_eq!(
        load_err(&[SS]),
        "invalid config: --transport-config: required with --transport: set --transport-config \
         or --transport-config-file"
    );
    let f = file(MINIMAL);
    assert_eq!(
        load_err(&[
            SS,
            &inline(MINIMAL),
            &format!("--transport-config-file={}", path(&f))
        ]),
        "invalid config: --transport-config: set only one of --transport-config and \
         --transport-config-file"
    );
    assert_eq!(
        load_err(&[]),
        "invalid config: --transport: no transport configured; pass --transport=redis-sortedset \
         with --transport-config or --transport-config-file"
    );
    let missing = load_err(&[SS, "--transport-config-file=/nonexistent/t.json"]);
    assert!(
        missing.starts_with(
            "invalid config: --transport-config-file: cannot read \"/nonexistent/t.json\": "
        ),
        "{missing}"
    );
    assert!(load_err(&[SS, &inline("{")])
        .starts_with("invalid config: --transport-config: invalid JSON: "));
}

#[test]
fn unknown_field_is_named_with_its_path() {
    let text = MINIMAL.replace("igw_base_url", "igw_base_ur");
    let err = load_err(&[SS, &inline(&text)]);
    assert!(
        err.starts_with("invalid config: queues[0].igw_base_ur: unknown field"),
        "{err}"
    );
}

#[test]
fn an_objective_that_is_no_header_value_is_refused() {
    let text = MINIMAL.replace(
        r#""igw_base_url""#,
        r#""inference_objective":"batch\u0000","igw_base_url""#,
    );
    let err = load_err(&[SS, &inline(&text)]);
    assert!(
        err.starts_with("invalid config: queues[0].inference_objective: not a legal HTTP header"),
        "{err}"
    );
    let text = MINIMAL.replace(
        r#""igw_base_url""#,
        r#""inference_objective":"batch-é","igw_base_url""#,
    );
    load_ok(&[SS, &inline(&text)]);
}

#[test]
fn redis_url_falls_back_to_env_only_when_empty() {
    let env = |k: &str| (k == "REDIS_URL").then(|| "redis://env:6379".to_owned());
    let args = parse(&[SS, &inline(MINIMAL)]).unwrap();
    let c = load_with_env(&args, env).unwrap();
    assert_eq!(c.transport.url.expose(), "redis://r:6379");
    let args = parse(&[SS, &inline(&MINIMAL.replace("redis://r:6379", ""))]).unwrap();
    let c = load_with_env(&args, env).unwrap();
    assert_eq!(c.transport.url.expose(), "redis://env:6379");
    assert_eq!(
        load_err(&[SS, &inline(&MINIMAL.replace("redis://r:6379", ""))]),
        "invalid config: url: required (or set the REDIS_URL environment variable)"
    );
}

#[test]
fn legacy_flags_synthesise_a_single_queue() {
    let c = load_ok(&[
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://:pw@r:6379",
        "--redis.ss.igw-base-url=http://gw:8000",
        "--redis.ss.request-path-url=/v1/chat/completions",
        "--redis.ss.inference-objective=batch",
        "--redis.ss.request-queue-name=my-queue",
        "--redis.ss.result-queue-name=my-results",
        "--redis.ss.poll-interval-ms=250",
        "--redis.ss.batch-size=5",
        "--redis.ss.gate-type=redis",
        r#"--redis.ss.gate-params={"address":"g:6379"}"#,
        "--concurrency=7",
        "--claim-lease-ttl=20s",
    ]);
    assert_eq!(c.transport_source, TransportSource::LegacyFlags);
    let t = &c.transport;
    assert_eq!(t.url.expose(), "redis://:pw@r:6379");
    assert_eq!(t.result_queue_name, "my-results");
    assert_eq!(t.retry_queue_name, "retry-sortedset");
    assert_eq!(t.poll_interval, Duration::from_millis(250));
    assert_eq!(t.batch_size, 5);
    let q = &t.queues[0];
    assert_eq!(
        (q.id.as_str(), q.queue_name.as_str()),
        ("my-queue", "my-queue")
    );
    assert_eq!(q.igw_base_url, "http://gw:8000");
    assert_eq!(q.request_path_url, "/v1/chat/completions");
    assert_eq!(q.inference_objective.as_deref(), Some("batch"));
    assert_eq!(q.worker_pool_id, "default");
    assert_eq!(q.gate.as_ref().map(|g| g.kind), Some(GateType::Redis));
    assert_eq!(c.pools[0].workers, 7);
    assert_eq!(c.claim.lease, Duration::from_secs(20));
    assert!(
        c.warnings.iter().any(|w| w.contains("deprecated")),
        "{:?}",
        c.warnings
    );
    assert!(!format!("{c:?}").contains(":pw@"));

    // Defaults of the legacy flags.
    let env = |k: &str| (k == "REDIS_URL").then(|| "redis://env".to_owned());
    let args = parse(&[
        "--message-queue-impl=redis-sortedset",
        "--redis.ss.igw-base-url=http://gw",
    ])
    .unwrap();
    let c = load_with_env(&args, env).unwrap();
    assert_eq!(c.transport.url.expose(), "redis://env");
    assert_eq!(c.transport.queues[0].queue_name, "request-sortedset");
    assert_eq!(c.transport.result_queue_name, "result-list");
}

#[test]
fn legacy_errors_name_the_legacy_flag() {
    let base = [
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://r",
    ];
    assert_eq!(
        load_err(&base),
        "invalid config: --redis.ss.igw-base-url: required"
    );
    let with =
        |extra: &str| load_err(&[base[0], base[1], "--redis.ss.igw-base-url=http://gw", extra]);
    assert_eq!(
        with("--redis.ss.batch-size=-1"),
        "invalid config: --redis.ss.batch-size: must be at least 1, got -1"
    );
    assert!(with("--redis.ss.gate-type=nope")
        .starts_with("invalid config: --redis.ss.gate-type: unknown gate type \"nope\""));
    assert!(load_err(&[
        base[0],
        "--redis.url=http://r",
        "--redis.ss.igw-base-url=http://gw"
    ])
    .starts_with("invalid config: --redis.url: scheme must be"));
    assert!(
        with("--redis.ss.inference-objective=batch\r\nx-admin: 1").starts_with(
            "invalid config: --redis.ss.inference-objective: not a legal HTTP header value"
        ),
        "an objective every request would carry as a header"
    );
    let pools = file(r#"[{"id":"default","workers":1}]"#);
    assert_eq!(
        with(&format!("--pool-config-file={}", path(&pools))),
        "invalid config: --pool-config-file: pool-config-file can only be specified when a \
         transport/queues config is also specified (--transport-config, --transport-config-file, \
         or the deprecated --redis.ss.queues-config or --redis.ss.queues-config-file)"
    );
}

/// The gate factory reads gate parameters after loading; the name it reports them under is the
/// one the user wrote (before: `queues[0].gate_params`, a path in a JSON the legacy user never
/// saw).
#[test]
fn gate_parameters_are_named_as_the_user_wrote_them() {
    let json = MINIMAL.replace(
        r#""igw_base_url""#,
        r#""gate_type":"redis","gate_params":{},"igw_base_url""#,
    );
    let c = load_ok(&[SS, &inline(&json)]);
    assert_eq!(
        c.transport.queues[0].gate_params_field,
        "queues[0].gate_params"
    );

    let legacy = [
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://r",
        "--redis.ss.igw-base-url=http://gw",
        "--redis.ss.gate-type=redis",
        "--redis.ss.gate-params={}",
    ];
    let c = load_ok(&legacy);
    assert_eq!(
        c.transport.queues[0].gate_params_field,
        "--redis.ss.gate-params"
    );

    let queues = r#"--redis.ss.queues-config=[{"queue_name":"a","igw_base_url":"http://gw"},
        {"queue_name":"b","igw_base_url":"http://gw","gate_type":"redis"}]"#;
    let c = load_ok(&[legacy[0], legacy[1], queues]);
    let fields: Vec<&str> = c
        .transport
        .queues
        .iter()
        .map(|q| q.gate_params_field.as_str())
        .collect();
    assert_eq!(
        fields,
        [
            "--redis.ss.queues-config: [0].gate_params",
            "--redis.ss.queues-config: [1].gate_params"
        ]
    );
}

#[test]
fn legacy_flags_are_ignored_with_a_warning_under_the_new_surface() {
    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        "--redis.ss.batch-size=99",
        "--message-queue-impl=redis-pubsub",
    ]);
    assert_eq!(c.transport.batch_size, 10);
    assert!(
        c.warnings.iter().any(|w| w.starts_with(
            "ignoring the deprecated flags --message-queue-impl, --redis.ss.batch-size"
        )),
        "{:?}",
        c.warnings
    );
}

/// The message clap gives a command line it refuses (printed, then exit code 2), or "parsed".
fn refused(flags: &[&str]) -> String {
    match parse(flags) {
        Ok(_) => "parsed".to_owned(),
        Err(e) => e.to_string(),
    }
}

/// A Go deployment's command line with the zap logging flags and `-v` in Go's forms loads; the
/// level comes from `-v` (in Go too, `-v` always wins over `--zap-log-level`), and the zap flags
/// inferq cannot honour are named in warnings. A value Go's zap would refuse is refused here too,
/// naming the flag.
#[test]
fn zap_flags_and_go_verbosity_forms_are_accepted() {
    let go = [
        SS,
        MINIMAL,
        "--zap-devel",
        "--zap-encoder=console",
        "--zap-log-level=debug",
        "--zap-stacktrace-level=panic",
        "--zap-time-encoding=RFC3339Nano",
        "-v=3",
    ];
    let mut flags = vec![go[0].to_owned(), inline(go[1])];
    flags.extend(go[2..].iter().map(|s| s.to_string()));
    let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
    let c = load_ok(&refs);
    assert_eq!(c.verbosity, 3);
    assert_eq!(
        c.warnings
            .iter()
            .filter(|w| w.contains("zap"))
            .collect::<Vec<_>>(),
        vec![
            "--zap-log-level=debug is ignored: -v sets the log level (in the Go processor too, -v \
             always wins)"
        ]
    );
    for (v, level) in [
        (&["--v", "4"][..], 4),
        (&["--v=5"], 5),
        (&["-v", "0"], 0),
        (&["-v3"], 3),
    ] {
        let mut argv = vec![SS.to_owned(), inline(MINIMAL)];
        argv.extend(v.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        assert_eq!(load_ok(&refs).verbosity, level, "{v:?}");
    }
    let warnings = |flags: &[&str]| {
        let mut argv = vec![SS.to_owned(), inline(MINIMAL)];
        argv.extend(flags.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        let all = load_ok(&refs).warnings;
        all.into_iter()
            .filter(|w| w.contains("zap") || w.contains("log"))
            .collect::<Vec<_>>()
    };
    // The format flags are honoured (the binary writes zap's JSON lines): no warning.
    assert!(warnings(&["--zap-encoder=JSON", "--zap-time-encoding=epoch"]).is_empty());
    assert!(warnings(&["--zap-devel=false"]).is_empty());
    assert_eq!(
        warnings(&["--zap-log-level=7"]),
        vec![
            "--zap-log-level=7 is ignored: -v sets the log level (in the Go processor too, -v \
             always wins)"
        ]
    );

    for (bad, flag) in [
        ("--zap-encoder=yaml", "--zap-encoder"),
        ("--zap-log-level=warn", "--zap-log-level"),
        ("--zap-log-level=0", "--zap-log-level"),
        ("--zap-stacktrace-level=debug", "--zap-stacktrace-level"),
        ("--zap-time-encoding=unix", "--zap-time-encoding"),
        ("--zap-devel=yes", "--zap-devel"),
    ] {
        let text = refused(&[bad]);
        assert!(
            text.contains("invalid value") && text.contains(flag),
            "{bad}: {text}"
        );
    }
}

/// Boolean flags take every spelling Go's flag packages accept (and a bare flag means true);
/// anything else is refused naming the flag.
#[test]
fn bool_flags_take_go_spellings() {
    let with = |extra: &str| {
        let args = parse(&[SS, &inline(MINIMAL), extra]).unwrap_or_else(|e| panic!("{e}"));
        load_with_env(&args, no_env).unwrap_or_else(|e| panic!("{e}"))
    };
    let auth_warned = |c: &RunConfig| {
        c.warnings
            .iter()
            .any(|w| w.starts_with("--metrics-endpoint-auth is ignored"))
    };
    for yes in ["1", "t", "T", "TRUE", "true", "True"] {
        let c = with(&format!("--tls-insecure-skip-verify={yes}"));
        assert_eq!(c.tls.map(|t| t.insecure_skip_verify), Some(true), "{yes}");
        assert!(auth_warned(&with(&format!(
            "--metrics-endpoint-auth={yes}"
        ))));
    }
    for no in ["0", "f", "F", "FALSE", "false", "False"] {
        let c = with(&format!("--tls-insecure-skip-verify={no}"));
        assert_eq!(c.tls, None, "{no}");
        assert!(!auth_warned(&with(&format!(
            "--metrics-endpoint-auth={no}"
        ))));
    }
    assert!(with("--tls-insecure-skip-verify").tls.is_some());
    assert!(auth_warned(&with("--metrics-endpoint-auth")));
    for bad in ["yes", "no", "tRUE", "2", ""] {
        for flag in ["--metrics-endpoint-auth", "--tls-insecure-skip-verify"] {
            let text = refused(&[&format!("{flag}={bad}")]);
            assert!(
                text.contains(&format!("invalid value '{bad}' for '{flag}")),
                "{flag}={bad}: {text}"
            );
        }
    }
}

/// `--redis.ss.queues-config-file` (Go's legacy multi-queue path) makes the transport config from
/// the queues in the file, with pools from `--pool-config-file`; inline `--redis.ss.queues-config`
/// wins over the file, the single-queue flags it replaces are named in a warning, and
/// `--redis-tracing` sets `enable_tracing`.
#[test]
fn legacy_queues_config_makes_the_queues() {
    let queues = file(
        r#"[{"queue_name":"fast","igw_base_url":"http://gw-a","worker_pool_id":"gpu",
             "labels":{"tier":"interactive"}},
            {"id":"slow-q","queue_name":"slow","igw_base_url":"http://gw-b",
             "request_path_url":"/v1/chat/completions","gate_type":"constant"}]"#,
    );
    let pools = file(r#"[{"id":"gpu","workers":3},{"id":"default","workers":2}]"#);
    let legacy = |extra: &[&str]| {
        let mut argv = vec![
            "--message-queue-impl=redis-sortedset".to_owned(),
            "--redis.url=redis://r:6379".to_owned(),
            format!("--redis.ss.queues-config-file={}", path(&queues)),
            format!("--pool-config-file={}", path(&pools)),
            "--redis.ss.batch-size=4".to_owned(),
        ];
        argv.extend(extra.iter().map(|s| s.to_string()));
        argv
    };
    let argv = legacy(&["--redis-tracing"]);
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let c = load_ok(&refs);
    assert_eq!(c.transport_source, TransportSource::LegacyFlags);
    let t = &c.transport;
    assert!(t.enable_tracing);
    assert_eq!(t.batch_size, 4);
    let names: Vec<(&str, &str, &str, &str)> = t
        .queues
        .iter()
        .map(|q| {
            (
                q.id.as_str(),
                q.queue_name.as_str(),
                q.worker_pool_id.as_str(),
                q.igw_base_url.as_str(),
            )
        })
        .collect();
    assert_eq!(
        names,
        vec![
            ("fast", "fast", "gpu", "http://gw-a"),
            ("slow-q", "slow", "default", "http://gw-b")
        ]
    );
    assert_eq!(t.queues[0].labels["tier"], "interactive");
    assert_eq!(t.queues[1].request_path_url, "/v1/chat/completions");
    assert_eq!(
        t.queues[1].gate.as_ref().map(|g| g.kind),
        Some(GateType::Constant)
    );
    assert_eq!(c.total_workers(), 5);
    assert!(!c.warnings.iter().any(|w| w.contains("--concurrency")));
    // --concurrency sizes only the implicit pool: given with a pool file, it is named as ignored.
    let argv = legacy(&["--concurrency=16"]);
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let c = load_ok(&refs);
    assert_eq!(c.total_workers(), 5);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("--concurrency 16 is ignored")),
        "{:?}",
        c.warnings
    );

    // Inline JSON wins over the file; the flags it makes moot are named.
    let argv = legacy(&[
        r#"--redis.ss.queues-config=[{"queue_name":"inline","igw_base_url":"http://gw-c"}]"#,
        "--redis.ss.igw-base-url=http://ignored",
        "--redis.ss.request-queue-name=ignored",
    ]);
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let c = load_ok(&refs);
    assert_eq!(c.transport.queues.len(), 1);
    assert_eq!(c.transport.queues[0].queue_name, "inline");
    assert!(!c.transport.enable_tracing);
    assert!(
        c.warnings.iter().any(|w| w
            == "ignoring --redis.ss.igw-base-url, --redis.ss.request-queue-name, \
                --redis.ss.queues-config-file because --redis.ss.queues-config is set"),
        "{:?}",
        c.warnings
    );

    // Errors name the flag and the queue's index in its array.
    let err = |extra: &[&str]| {
        let argv = legacy(extra);
        let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
        load_err(&refs)
    };
    assert_eq!(
        err(&[r#"--redis.ss.queues-config=[{"queue_name":"a"}]"#]),
        "invalid config: --redis.ss.queues-config: [0].igw_base_url: required"
    );
    assert_eq!(
        err(&["--redis.ss.queues-config=[]"]),
        "invalid config: --redis.ss.queues-config: at least one queue is required"
    );
    assert!(err(&[r#"--redis.ss.queues-config=[{"queue":"a"}]"#])
        .starts_with("invalid config: --redis.ss.queues-config: [0].queue: unknown field"));
    assert!(err(&[r#"--redis.ss.queues-config={"queue_name":"a"}"#])
        .starts_with("invalid config: --redis.ss.queues-config: invalid type: map"));
    assert_eq!(
        err(&[
            r#"--redis.ss.queues-config=[{"queue_name":"a","igw_base_url":"http://g","worker_pool_id":"cpu"}]"#
        ]),
        "invalid config: --redis.ss.queues-config: [0].worker_pool_id: pool \"cpu\" is not \
         defined (defined pools: gpu, default)"
    );
    let broken = file(r#"[{"queue_name":"a","#);
    let argv = [
        "--message-queue-impl=redis-sortedset".to_owned(),
        "--redis.url=redis://r".to_owned(),
        format!("--redis.ss.queues-config-file={}", path(&broken)),
    ];
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    assert!(
        load_err(&refs).starts_with("invalid config: --redis.ss.queues-config-file: invalid JSON")
    );
    assert!(load_err(&[
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://r",
        "--redis.ss.queues-config-file=/nonexistent/queues.json",
    ])
    .starts_with("invalid config: --redis.ss.queues-config-file: cannot read"));
}

/// The flags of Go's redis-pubsub and gcp-pubsub transports parse. gcp-pubsub is refused when
/// selected; when the sorted-set transport is, the others' flags are ignored with a warning
/// naming them; when none is, redis-pubsub runs, as in Go, unless sorted-set flags are set.
#[test]
fn flags_of_other_transports_are_ignored_with_a_warning() {
    let pubsub_flags = [
        "--redis.url=redis://r",
        "--redis.igw-base-url=http://gw",
        "--redis.request-path-url=/v1/completions",
        "--redis.inference-objective=o",
        "--redis.request-queue-name=rq",
        "--redis.retry-queue-name=retry",
        "--redis.result-queue-name=res",
        "--redis.queues-config=[]",
        "--redis.queues-config-file=/q.json",
        "--pubsub.igw-base-url=http://gw",
        "--pubsub.project-id=p",
        "--pubsub.request-path-url=/v1/completions",
        "--pubsub.inference-objective=o",
        "--pubsub.request-subscriber-id=s",
        "--pubsub.result-topic-id=t",
        "--pubsub.topics-config-file=/t.json",
        "--pubsub.batch-size=10",
        "--redis-tracing=false",
    ];
    fn with<'a>(first: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
        let mut argv = first.to_vec();
        argv.extend(rest);
        argv
    }
    for (imp, shown) in [
        ("--message-queue-impl=gcp-pubsub", "gcp-pubsub"),
        ("--message-queue-impl=gcp-pubsub-gated", "gcp-pubsub-gated"),
    ] {
        assert_eq!(
            load_err(&with(&[imp], &pubsub_flags)),
            format!(
                "invalid config: --message-queue-impl: \"{shown}\" is not supported; inferq \
                 supports redis-sortedset and redis-pubsub (gcp-pubsub is not supported)"
            )
        );
    }
    // Without --message-queue-impl, Go's default: redis-pubsub, said in a warning.
    let go_pubsub = [
        "--redis.url=redis://r",
        "--redis.igw-base-url=http://gw",
        "--pubsub.project-id=p",
    ];
    let c = load_ok(&go_pubsub);
    assert_eq!(c.transport.kind, TransportKind::PubSub);
    assert_eq!(c.transport.queues[0].queue_name, "request-queue");
    assert_eq!(c.transport.queues[0].igw_base_url, "http://gw");
    assert!(
        c.warnings
            .iter()
            .any(|w| w == "--message-queue-impl is not set: running redis-pubsub, Go's default"),
        "{:?}",
        c.warnings
    );
    // Unless sorted-set flags are set, which Go would silently ignore then.
    assert_eq!(
        load_err(&with(
            &[
                "--redis.ss.igw-base-url=http://gw-ss",
                "--redis.ss.batch-size=5"
            ],
            &go_pubsub
        )),
        "invalid config: --message-queue-impl: not set, so Go would use redis-pubsub and \
         ignore --redis.ss.igw-base-url, --redis.ss.batch-size; pass \
         --message-queue-impl=redis-sortedset to use them, or --message-queue-impl=redis-pubsub \
         (or, better, --transport with --transport-config or --transport-config-file)"
    );

    let c = load_ok(&with(
        &[
            "--message-queue-impl=redis-sortedset",
            "--redis.ss.igw-base-url=http://gw-ss",
        ],
        &pubsub_flags,
    ));
    assert_eq!(c.transport.queues[0].igw_base_url, "http://gw-ss");
    assert!(
        c.warnings.iter().any(|w| {
            w.starts_with(
            "ignoring --redis.igw-base-url, --redis.request-path-url, --redis.inference-objective, \
             --redis.request-queue-name, --redis.retry-queue-name, --redis.result-queue-name, \
             --redis.queues-config, --redis.queues-config-file, --pubsub.igw-base-url, \
             --pubsub.project-id, --pubsub.request-path-url, --pubsub.inference-objective, \
             --pubsub.request-subscriber-id, --pubsub.result-topic-id, \
             --pubsub.topics-config-file, --pubsub.batch-size: they configure another of Go's \
             transports, and --message-queue-impl=redis-sortedset is selected"
        )
        }),
        "{:?}",
        c.warnings
    );

    let mut argv = vec![SS.to_owned(), inline(MINIMAL)];
    argv.extend(pubsub_flags.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = argv.iter().map(String::as_str).collect();
    let c = load_ok(&refs);
    assert!(
        c.warnings.iter().any(|w| w.starts_with(
            "ignoring the deprecated flags --redis-tracing, --redis.url, --redis.igw-base-url"
        ) && w.contains("--pubsub.batch-size because --transport")),
        "{:?}",
        c.warnings
    );
}

#[test]
fn claim_flags_apply_only_when_json_lacks_the_field() {
    let flags = ["--claim-lease-ttl=1m", "--claim-reclaim-interval=10s"];
    let c = load_ok(&[SS, &inline(MINIMAL), flags[0], flags[1]]);
    assert_eq!(c.claim.lease, Duration::from_secs(60));
    assert_eq!(c.claim.reclaim_interval, Duration::from_secs(10));

    let json = MINIMAL.replace(
        r#""queues""#,
        r#""claim_lease_ttl_seconds":1.5,"claim_reclaim_interval_ms":1000,"max_deliveries":2,"queues""#,
    );
    let c = load_ok(&[SS, &inline(&json), flags[0], flags[1]]);
    assert_eq!(
        c.claim,
        ClaimSettings {
            lease: Duration::from_millis(1500),
            reclaim_interval: Duration::from_secs(1),
            max_deliveries: 2,
            replica_wait: None,
        }
    );
    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), "--claim-lease-ttl=soon"]),
        "invalid config: --claim-lease-ttl: invalid duration \"soon\""
    );
    let c = load_ok(&[SS, &inline(MINIMAL), "--result-dedup-ttl=24h"]);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.starts_with("--result-dedup-ttl is ignored")));
}

/// Values beyond Go's longest duration (about 292 years): a lease that long made the consumer
/// panic on its first claim (a claim's deadline overflowed), and Go's poll ticker overflows.
#[test]
fn durations_in_the_json_stop_at_gos_longest() {
    let with = |field: &str| MINIMAL.replace(r#""queues""#, &format!("{field},\"queues\""));
    assert_eq!(
        load_err(&[SS, &inline(&with(r#""claim_lease_ttl_seconds":1.8e19"#))]),
        "invalid config: claim_lease_ttl_seconds: must be at most 9223372036 seconds (about 292 \
         years), got 18000000000000000000"
    );
    let c = load_ok(&[
        SS,
        &inline(&with(r#""claim_lease_ttl_seconds":9223372036"#)),
    ]);
    assert_eq!(c.claim.lease, Duration::from_secs(9_223_372_036));
    assert_eq!(
        load_err(&[SS, &inline(&with(r#""poll_interval_ms":9223372036855"#))]),
        "invalid config: poll_interval_ms: must be at most 9223372036854 (about 292 years), got \
         9223372036855"
    );
    let c = load_ok(&[SS, &inline(&with(r#""poll_interval_ms":9223372036854"#))]);
    assert_eq!(
        c.transport.poll_interval,
        Duration::from_millis(9_223_372_036_854)
    );
}

/// go-redis reads `?db=N` as the database and refuses options it does not know; redis-rs ignored
/// both on TCP (before: `redis://r?db=3` ran against database 0, and `?dbb=3` was accepted).
#[test]
fn redis_url_options_are_read_as_go_redis_reads_them() {
    let with_url = |url: &str| MINIMAL.replace("redis://r:6379", url);
    let c = load_ok(&[SS, &inline(&with_url("redis://:pw@r:6379?db=3"))]);
    assert_eq!(c.transport.url.expose(), "redis://:pw@r:6379/3");
    let env = |k: &str| (k == "REDIS_URL").then(|| "redis://e?db=2".to_owned());
    let args = parse(&[SS, &inline(&with_url(""))]).unwrap();
    let c = load_with_env(&args, env).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.transport.url.expose(), "redis://e/2");
    assert_eq!(
        load_err(&[SS, &inline(&with_url("redis://:pw@r?dbb=3"))]),
        "invalid config: url: \"redis://:***@r?dbb=3\": unexpected option dbb (go-redis refuses \
         it too; the options are db, protocol and go-redis's connection settings)"
    );
    assert!(load_err(&[
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://r?db=x",
        "--redis.ss.igw-base-url=http://gw",
    ])
    .starts_with("invalid config: --redis.url: \"redis://r?db=x\": db must be a database number"));
    let c = load_ok(&[SS, &inline(&with_url("redis://r?pool_size=9"))]);
    assert_eq!(c.transport.url.expose(), "redis://r");
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("ignoring the go-redis connection option pool_size")),
        "{:?}",
        c.warnings
    );
    assert_eq!(
        load_err(&[SS, &inline(&with_url("redis://"))]),
        "invalid config: url: \"redis://\" names no host"
    );
}

/// A JSON array (or null) where a config has an object is refused as such (before: serde read an
/// array of field values as the object, so `[["default",4,null,null]]` was a pool, and a pool
/// file given as the transport config failed with "[0]: invalid type: map, expected a string").
#[test]
fn arrays_are_not_objects() {
    let pools = file(r#"[{"id":"default","workers":4}]"#);
    assert_eq!(
        load_err(&[SS, &format!("--transport-config-file={}", path(&pools))]),
        format!(
            "invalid config: --transport-config-file: must be a JSON object, got an array (in {})",
            path(&pools)
        )
    );
    assert_eq!(
        load_err(&[SS, &inline("null")]),
        "invalid config: --transport-config: must be a JSON object, got null"
    );
    assert_eq!(
        load_err(&[
            SS,
            &inline(
                r#"{"url":"redis://r","queues":[{"queue_name":"q","igw_base_url":"http://gw"},null]}"#
            )
        ]),
        "invalid config: queues[1]: must be a JSON object, got null"
    );
    let as_array = r#"["redis://r",null,null,null,null,null,[["q",null,null,null,null,null,"http://gw",null,null,null]],null,null,null]"#;
    assert_eq!(
        load_err(&[SS, &inline(as_array)]),
        "invalid config: --transport-config: must be a JSON object, got an array"
    );
    let array_pool = file(r#"[["default",4,null,null]]"#);
    assert_eq!(
        load_err(&[
            SS,
            &inline(MINIMAL),
            &format!("--pool-config-file={}", path(&array_pool))
        ]),
        format!(
            "invalid config: pools[0]: must be a JSON object, got an array (in {})",
            path(&array_pool)
        )
    );
    let merge = file(r#"["random-robin",null]"#);
    assert_eq!(
        load_err(&[
            SS,
            &inline(MINIMAL),
            &format!("--request-merge-policy-config-file={}", path(&merge))
        ]),
        format!(
            "invalid config: merge_policy: must be a JSON object, got an array (in {})",
            path(&merge)
        )
    );
    assert_eq!(
        load_err(&[
            "--message-queue-impl=redis-sortedset",
            "--redis.url=redis://r",
            r#"--redis.ss.queues-config=[["q",null,null,null,null,null,"http://gw",null,null,null]]"#,
        ]),
        "invalid config: --redis.ss.queues-config: [0]: must be a JSON object, got an array"
    );
}

/// A bad `REDIS_URL` is named as such (before: as `url` of a JSON that has no url, or as
/// `--redis.url`, a flag that was not given).
#[test]
fn a_bad_redis_url_variable_is_named_as_the_variable() {
    let env = |k: &str| (k == "REDIS_URL").then(|| "http://u:pw@x".to_owned());
    let no_url = r#"{"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    assert_eq!(
        load_err_env(&[SS, &inline(no_url)], &env),
        "invalid config: REDIS_URL: scheme must be redis://, rediss://, or unix://, got http:// \
         in \"http://u:***@x\""
    );
    let legacy = [
        "--message-queue-impl=redis-sortedset",
        "--redis.ss.igw-base-url=http://gw",
    ];
    assert!(load_err_env(&legacy, &env).starts_with("invalid config: REDIS_URL: scheme must be"));
    // The flag, when given, is what is named (and wins over the variable).
    assert!(
        load_err_env(&[legacy[0], legacy[1], "--redis.url=redis://r?x=1"], &env)
            .starts_with("invalid config: --redis.url: \"redis://r?x=1\": unexpected option x")
    );
}

#[test]
fn pool_file_rules() {
    let json = MINIMAL.replace(
        r#""igw_base_url""#,
        r#""worker_pool_id":"gpu","igw_base_url""#,
    );
    let pools = file(
        r#"[{"id":"gpu","workers":4,"gate_type":"local-max-concurrency","gate_params":{"limit":2}}]"#,
    );
    let pool_flag = format!("--pool-config-file={}", path(&pools));
    let c = load_ok(&[SS, &inline(&json), &pool_flag, "--concurrency=99"]);
    assert_eq!(c.pools.len(), 1);
    assert_eq!((c.pools[0].id.as_str(), c.pools[0].workers), ("gpu", 4));
    assert_eq!(c.total_workers(), 4);

    assert_eq!(
        load_err(&[SS, &inline(&json)]),
        "invalid config: queues[0].worker_pool_id: pool \"gpu\" is not defined (defined pools: \
         default)"
    );
    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), &pool_flag]),
        "invalid config: queues[0].worker_pool_id: pool \"default\" is not defined (defined \
         pools: gpu)"
    );
    let bad = file(r#"[{"id":"gpu","workers":0}]"#);
    assert_eq!(
        load_err(&[
            SS,
            &inline(&json),
            &format!("--pool-config-file={}", path(&bad))
        ]),
        format!(
            "invalid config: pools[0].workers: must be at least 1, got 0 (in {})",
            path(&bad)
        )
    );
    assert!(load_err(&[
        SS,
        &inline(MINIMAL),
        "--pool-config-file=/nonexistent/p.json"
    ])
    .starts_with("invalid config: --pool-config-file: cannot read"));
}

#[test]
fn merge_policy_file_rules() {
    let rr = file(
        r#"{"type":"random-robin","parameters":{"fairness_header":"","fairness_attribute":"tenant"}}"#,
    );
    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        &format!("--request-merge-policy-config-file={}", path(&rr)),
    ]);
    assert_eq!(c.merge_policy.kind, MergePolicyKind::RandomRobin);
    assert_eq!(
        c.merge_policy.fairness,
        Fairness {
            header: None,
            attribute: "tenant".into()
        }
    );

    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        &format!("--request-merge-policy-config={}", path(&rr)),
    ]);
    assert_eq!(c.merge_policy.fairness.header, None);
    assert!(c
        .warnings
        .iter()
        .any(|w| w.starts_with("--request-merge-policy-config is deprecated")));

    // Both flags: the canonical one's file is the policy.
    let tier = file(r#"{"type":"tier-priority"}"#);
    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        &format!("--request-merge-policy-config-file={}", path(&tier)),
        &format!("--request-merge-policy-config={}", path(&rr)),
    ]);
    assert!(
        matches!(c.merge_policy.kind, MergePolicyKind::TierPriority(_)),
        "{:?}",
        c.merge_policy
    );
    let extra = file(r#"{"type":"random-robin","name":"x"}"#);
    assert!(load_err(&[
        SS,
        &inline(MINIMAL),
        &format!("--request-merge-policy-config-file={}", path(&extra))
    ])
    .starts_with("invalid config: merge_policy.name: unknown field"));
}

#[test]
fn flag_rules() {
    let t = [SS, MINIMAL];
    let with = |extra: &[&str]| {
        let mut flags = vec![t[0].to_owned(), inline(t[1])];
        flags.extend(extra.iter().map(|s| s.to_string()));
        let refs: Vec<&str> = flags.iter().map(String::as_str).collect();
        load_err(&refs)
    };
    assert_eq!(
        with(&["--concurrency=0"]),
        "invalid config: --concurrency: must be at least 1, got 0"
    );
    assert_eq!(
        with(&["--drain-timeout=5x"]),
        "invalid config: --drain-timeout: invalid duration \"5x\""
    );
    assert_eq!(
        with(&["--request-timeout=0s"]),
        "invalid config: --request-timeout: must be greater than 0, got \"0s\""
    );
    assert_eq!(
        with(&["--request-timeout=-1m"]),
        "invalid config: --request-timeout: must not be negative, got \"-1m\""
    );
    assert_eq!(
        with(&["--metrics-backlog-poll-interval=often"]),
        "invalid config: --metrics-backlog-poll-interval: invalid duration \"often\""
    );
    assert_eq!(
        with(&["--health-port=9090"]),
        "invalid config: --metrics-port: must differ from --health-port (both are 9090)"
    );
    assert!(
        with(&["--transform-config-file=/nonexistent/t.json"]).contains("--transform-config-file"),
        "{}",
        with(&["--transform-config-file=/nonexistent/t.json"])
    );
    assert!(with(&["--prometheus-url=prom:9090"])
        .starts_with("invalid config: --prometheus-url: must be an http(s) URL"));
}

#[test]
fn tls_rules() {
    let cert = file("cert");
    let key = file("key");
    let ca = file("ca");
    let c = load_ok(&[
        SS,
        &inline(MINIMAL),
        &format!("--tls-cert={}", path(&cert)),
        &format!("--tls-key={}", path(&key)),
        &format!("--tls-ca-cert={}", path(&ca)),
    ]);
    let tls = c.tls.unwrap();
    assert_eq!(tls.ca_cert.as_deref(), Some(ca.path()));
    assert_eq!(
        tls.client,
        Some(ClientCert {
            cert: cert.path().into(),
            key: key.path().into()
        })
    );
    assert!(!tls.insecure_skip_verify);

    let c = load_ok(&[SS, &inline(MINIMAL), "--tls-insecure-skip-verify"]);
    assert_eq!(
        c.tls,
        Some(TlsFiles {
            ca_cert: None,
            client: None,
            insecure_skip_verify: true
        })
    );

    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), &format!("--tls-cert={}", path(&cert))]),
        "invalid config: --tls-key: required when --tls-cert is set"
    );
    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), &format!("--tls-key={}", path(&key))]),
        "invalid config: --tls-cert: required when --tls-key is set"
    );
    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), "--tls-ca-cert=/nonexistent/ca.pem"]),
        "invalid config: --tls-ca-cert: file \"/nonexistent/ca.pem\" does not exist or is not a file"
    );
}

#[test]
fn prometheus_gates_need_the_prometheus_url() {
    let json = MINIMAL.replace(
        r#""igw_base_url""#,
        r#""gate_type":"prometheus-budget","gate_params":{"pool":"p"},"igw_base_url""#,
    );
    assert_eq!(
        load_err(&[SS, &inline(&json)]),
        "invalid config: queues[0].gate_type: \"prometheus-budget\" requires --prometheus-url flag \
         to be set"
    );
    let c = load_ok(&[SS, &inline(&json), "--prometheus-url=https://prom"]);
    assert_eq!(
        c.transport.queues[0].gate.as_ref().map(|g| g.kind),
        Some(GateType::PrometheusBudget)
    );

    let pools = file(
        r#"[{"id":"default","workers":2,"gate_type":"prometheus-query","gate_params":{"query":"up"}}]"#,
    );
    assert_eq!(
        load_err(&[
            SS,
            &inline(MINIMAL),
            &format!("--pool-config-file={}", path(&pools))
        ]),
        "invalid config: pools[0].gate_type: \"prometheus-query\" requires --prometheus-url flag \
         to be set"
    );
}

#[test]
fn passwords_never_show() {
    let secret = "hunter2secret";
    let json = MINIMAL.replace("redis://r:6379", &format!("redis://u:{secret}@r:6379"));
    let args = parse(&[SS, &inline(&json), "--redis.url=redis://:hunter2secret@x"]).unwrap();
    assert!(!format!("{args:?}").contains(secret));
    let c = load_with_env(&args, no_env).unwrap();
    assert!(!format!("{c:?}").contains(secret));
    assert!(!c.warnings.join("\n").contains(secret));

    let bad = MINIMAL.replace("redis://r:6379", &format!("http://u:{secret}@r:6379"));
    let err = load_err(&[SS, &inline(&bad)]);
    assert!(err.starts_with("invalid config: url: "), "{err}");
    assert!(!err.contains(secret), "{err}");
    let args = parse(&[SS, &inline(&bad)]).unwrap();
    let debug = format!("{:?}", load_with_env(&args, no_env).err());
    assert!(!debug.contains(secret), "{debug}");

    // A URL in the wrong field, echoed back by the JSON decoder.
    let misplaced = MINIMAL.replace(
        r#""queues""#,
        &format!(r#""batch_size":"redis://:{secret}@r","queues""#),
    );
    let err = load_err(&[SS, &inline(&misplaced)]);
    assert!(
        err.starts_with("invalid config: batch_size: invalid type"),
        "{err}"
    );
    assert!(!err.contains(secret), "{err}");

    // Legacy path: the synthesised-config warning is redacted too.
    let args = parse(&[
        "--message-queue-impl=redis-sortedset",
        "--redis.url=redis://:hunter2secret@r",
        "--redis.ss.igw-base-url=http://gw",
    ])
    .unwrap();
    let c = load_with_env(&args, no_env).unwrap();
    assert!(!c.warnings.join("\n").contains(secret), "{:?}", c.warnings);
}

#[test]
fn exit_code_is_two() {
    assert_eq!(EXIT_CODE, 2);
    let args = parse(&[]).unwrap();
    let err = load_with_env(&args, no_env).err().unwrap();
    assert_eq!(err.exit_code(), 2);
}

#[test]
fn redis_tls_rules() {
    let (ca, cert, key) = (file("ca"), file("cert"), file("key"));
    let tls_url = r#"{"url":"rediss://u:pw@r:6380","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    let c = load_ok(&[
        SS,
        &inline(tls_url),
        &format!("--redis-tls-ca-cert={}", path(&ca)),
        &format!("--redis-tls-cert={}", path(&cert)),
        &format!("--redis-tls-key={}", path(&key)),
    ]);
    assert_eq!(c.redis_tls.ca_cert.as_deref(), Some(ca.path()));
    assert_eq!(
        c.redis_tls.client,
        Some((cert.path().to_path_buf(), key.path().to_path_buf()))
    );
    assert!(!load_ok(&[SS, &inline(MINIMAL)]).redis_tls.is_configured());

    let ca_flag = format!("--redis-tls-ca-cert={}", path(&ca));
    assert_eq!(
        load_err(&[SS, &inline(MINIMAL), &ca_flag]),
        "invalid config: --redis-tls-ca-cert: Redis TLS files were given, but the Redis URL \
         redis://r:6379 is not rediss://"
    );
    let cert_flag = format!("--redis-tls-cert={}", path(&cert));
    assert_eq!(
        load_err(&[SS, &inline(tls_url), &cert_flag]),
        "invalid config: --redis-tls-key: required when --redis-tls-cert is set"
    );
    assert_eq!(
        load_err(&[SS, &inline(tls_url), "--redis-tls-ca-cert=/no/such/ca.pem"]),
        "invalid config: --redis-tls-ca-cert: file \"/no/such/ca.pem\" does not exist or is not a file"
    );
    let insecure = r#"{"url":"rediss://u:pw@r:6380/#insecure","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    let e = load_err(&[SS, &inline(insecure)]);
    assert!(
        e.starts_with("invalid config: url: ") && e.contains("#insecure"),
        "{e}"
    );
    assert!(
        e.contains("--redis-tls-ca-cert") && !e.contains("pw@"),
        "{e}"
    );
}

mod props {
    use proptest::prelude::*;
    use serde_json::Value;

    use super::*;

    const FIELDS: &[&str] = &[
        "url",
        "queues",
        "poll_interval_ms",
        "batch_size",
        "claim_lease_ttl_seconds",
        "claim_reclaim_interval_ms",
        "max_deliveries",
        "retry_queue_name",
        "result_queue_name",
        "queue_name",
        "igw_base_url",
        "id",
        "worker_pool_id",
        "gate_type",
        "gate_params",
        "labels",
        "request_path_url",
        "inference_objective",
        "enable_tracing",
    ];

    fn key() -> impl Strategy<Value = String> {
        prop_oneof![
            4 => prop::sample::select(FIELDS).prop_map(str::to_owned),
            1 => "[a-z_]{0,8}",
        ]
    }

    fn json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            prop::sample::select(vec![
                "redis://r:6379",
                "http://gw",
                "q",
                "",
                "constant",
                "1.5"
            ])
            .prop_map(Value::from),
            "\\PC{0,10}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 32, 5, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                prop::collection::btree_map(key(), inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// A transport config that is mostly the right shape, so loading gets past the first check.
    fn transport() -> impl Strategy<Value = Value> {
        (
            prop::collection::btree_map(key(), json(), 0..6),
            prop::collection::vec(prop::collection::btree_map(key(), json(), 0..6), 0..3),
        )
            .prop_map(|(top, queues)| {
                let mut top: serde_json::Map<String, Value> = top.into_iter().collect();
                top.entry("url")
                    .or_insert_with(|| Value::from("redis://r:6379"));
                top.insert(
                    "queues".to_owned(),
                    Value::Array(
                        queues
                            .into_iter()
                            .map(|q| Value::Object(q.into_iter().collect()))
                            .collect(),
                    ),
                );
                Value::Object(top)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_transport_json_loads_or_names_a_field(
            v in prop_oneof![transport(), json()],
        ) {
            let Ok(args) = parse(&[SS, &inline(&v.to_string())]) else {
                return Ok(());
            };
            if let Err(e) = load_with_env(&args, no_env) {
                prop_assert!(!e.field().is_empty(), "{}", e);
            }
        }

        #[test]
        fn arbitrary_pool_and_merge_files_load_or_name_a_field(
            pools in json(),
            merge in json(),
        ) {
            let pools = file(&pools.to_string());
            let merge = file(&merge.to_string());
            let args = parse(&[
                SS,
                &inline(MINIMAL),
                &format!("--pool-config-file={}", path(&pools)),
                &format!("--request-merge-policy-config-file={}", path(&merge)),
            ])
            .unwrap();
            if let Err(e) = load_with_env(&args, no_env) {
                prop_assert!(!e.field().is_empty(), "{}", e);
            }
        }

        #[test]
        fn arbitrary_flag_words_parse_or_are_refused(
            words in prop::collection::vec(
                prop_oneof![
                    prop::sample::select(vec![
                        "--concurrency", "--request-timeout", "--drain-timeout",
                        "--claim-lease-ttl", "--claim-reclaim-interval", "--redis.url",
                        "--redis.ss.batch-size", "--transport", "-v", "0", "-1", "5m", "1.5s", "x",
                        "--redis-tracing", "--zap-devel", "--zap-log-level", "--zap-encoder",
                        "--message-queue-impl", "--redis.ss.queues-config", "--pubsub.batch-size",
                        "--metrics-endpoint-auth", "=", "T", "[]", "redis-sortedset",
                    ]).prop_map(str::to_owned),
                    "\\PC{0,8}",
                ],
                0..6,
            ),
        ) {
            let mut argv = vec![SS.to_owned(), inline(MINIMAL)];
            argv.extend(words);
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            let Ok(args) = parse(&argv) else {
                return Ok(());
            };
            if let Err(e) = load_with_env(&args, no_env) {
                prop_assert!(!e.field().is_empty(), "{}", e);
            }
        }
    }
}

/// `OTEL_EXPORTER_OTLP_ENDPOINT` switches request tracing on without a warning (the exporter's
/// settings are in the config); Go's `enable_tracing`, which asks for spans of Redis commands,
/// loads with a warning when there is no endpoint to export them to, and silently with one.
#[test]
fn tracing_follows_the_otlp_endpoint_and_enable_tracing_warns_without_it() {
    let c = load_ok(&[SS, &inline(MINIMAL)]);
    assert_eq!(c.otel, None);
    assert!(
        !c.warnings.iter().any(|w| w.contains("spans")),
        "{:?}",
        c.warnings
    );
    let with_field = MINIMAL.replacen('{', r#"{"enable_tracing":true,"#, 1);
    let c = load_ok(&[SS, &inline(&with_field)]);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.starts_with("enable_tracing is true") && w.contains("Redis commands")),
        "{:?}",
        c.warnings
    );
    let args = parse(&[SS, &inline(MINIMAL)]).unwrap();
    let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "http://otel:4317".to_owned());
    let c = load_with_env(&args, env).unwrap();
    assert_eq!(
        c.otel.map(|o| (o.endpoint, o.service_name)),
        Some(("http://otel:4317".to_owned(), "llm-d-async".to_owned()))
    );
    assert!(
        !c.warnings.iter().any(|w| w.contains("spans")),
        "{:?}",
        c.warnings
    );
    let args = parse(&[SS, &inline(&with_field)]).unwrap();
    let c = load_with_env(&args, env).unwrap();
    assert!(c.transport.enable_tracing);
    assert!(
        !c.warnings.iter().any(|w| w.contains("spans")),
        "{:?}",
        c.warnings
    );
    let env = |k: &str| (k == "OTEL_EXPORTER_OTLP_ENDPOINT").then(|| "otel:x".to_owned());
    let e = load_with_env(&args, env)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(e.contains("OTEL_EXPORTER_OTLP_ENDPOINT"), "{e}");
}

const PUBSUB: &str = "--transport=redis-pubsub";

/// Go's redis-pubsub config: its defaults (result channel `result-queue`, retry set
/// `retry-sortedset`), every queue's results on the result channel whatever a message names,
/// and the queue fields Go ignores on this transport ignored with a warning naming them.
#[test]
fn redis_pubsub_config_loads_with_go_defaults() {
    let c = load_ok(&[
        PUBSUB,
        &inline(
            r#"{"url":"redis://r","queues":[
                {"queue_name":"chan-a","igw_base_url":"http://gw","inference_objective":"o"},
                {"queue_name":"chan-b","igw_base_url":"http://gw","id":"b","gate_type":"redis","result_queue_name":"mine"}]}"#,
        ),
    ]);
    assert_eq!(c.transport.kind, TransportKind::PubSub);
    assert_eq!(c.transport.result_queue_name, "result-queue");
    assert_eq!(c.transport.retry_queue_name, "retry-sortedset");
    let q = &c.transport.queues;
    assert_eq!((q[0].queue_name.as_str(), q[0].id.as_str()), ("chan-a", ""));
    assert_eq!(q[0].inference_objective.as_deref(), Some("o"));
    assert_eq!(q[1].id, "", "Go's pub/sub queues have no id");
    assert_eq!(q[1].gate, None);
    for queue in q {
        assert_eq!(queue.result_queue_name.as_deref(), Some("result-queue"));
    }
    assert!(
        c.warnings.iter().any(|w| w.starts_with(
            "ignoring queues[1].id, queues[1].gate_type, queues[1].result_queue_name: Go's \
             redis-pubsub transport has no such queue fields"
        )),
        "{:?}",
        c.warnings
    );
    // Two queues of one channel are refused (each message would be admitted twice).
    let twice = load_err(&[
        PUBSUB,
        &inline(
            r#"{"url":"redis://r","queues":[
                {"queue_name":"chan-a","igw_base_url":"http://gw"},
                {"queue_name":"chan-a","igw_base_url":"http://gw2"}]}"#,
        ),
    ]);
    assert!(
        twice.starts_with("invalid config: queues[1].queue_name: duplicate queue name \"chan-a\""),
        "{twice}"
    );
    // A field neither transport has is still refused, by name.
    assert_eq!(
        load_err(&[
            PUBSUB,
            &inline(
                r#"{"url":"redis://r","queues":[{"queue_name":"c","igw_base_url":"http://gw","chanel":"x"}]}"#
            )
        ]),
        "invalid config: queues[0].chanel: unknown field (expected one of `id`, `queue_name`, \
         `result_queue_name`, `result_ttl_seconds`, `worker_pool_id`, `inference_objective`, \
         `request_path_url`, `igw_base_url`, `gate_type`, `gate_params`, `labels`, `allowed_result_lists`)"
    );
}

/// Go's legacy redis-pubsub flags describe the same transport; errors name the flag written.
#[test]
fn legacy_redis_pubsub_flags() {
    let c = load_ok(&[
        "--message-queue-impl=redis-pubsub",
        "--redis.url=redis://r",
        "--redis.igw-base-url=http://gw",
        "--redis.request-queue-name=jobs",
        "--redis.result-queue-name=answers",
        "--redis.retry-queue-name=later",
        "--redis.ss.batch-size=5",
    ]);
    assert_eq!(c.transport.kind, TransportKind::PubSub);
    assert_eq!(c.transport_source, TransportSource::LegacyFlags);
    assert_eq!(c.transport.queues[0].queue_name, "jobs");
    assert_eq!(c.transport.result_queue_name, "answers");
    assert_eq!(c.transport.retry_queue_name, "later");
    assert_eq!(c.transport.batch_size, 10, "a sorted-set flag is ignored");
    assert!(
        c.warnings.iter().any(|w| w
            == "ignoring --redis.ss.batch-size: they configure another of Go's transports, and \
                --message-queue-impl=redis-pubsub is selected"),
        "{:?}",
        c.warnings
    );
    assert!(c
        .warnings
        .iter()
        .any(|w| w.contains("--transport=redis-pubsub --transport-config=")));
    let defaults = load_ok(&[
        "--message-queue-impl=redis-pubsub",
        "--redis.url=redis://r",
        "--redis.igw-base-url=http://gw",
    ]);
    assert_eq!(defaults.transport.queues[0].queue_name, "request-queue");
    assert_eq!(defaults.transport.result_queue_name, "result-queue");
    assert!(load_err(&[
        "--message-queue-impl=redis-pubsub",
        "--redis.url=redis://r",
        "--redis.igw-base-url=ftp://gw",
    ])
    .starts_with("invalid config: --redis.igw-base-url: "));
    assert!(load_err(&[
        "--message-queue-impl=redis-pubsub",
        "--redis.url=redis://r",
        "--redis.queues-config=[{\"igw_base_url\":\"http://gw\"}]",
    ])
    .starts_with("invalid config: --redis.queues-config: [0].queue_name: required"));
}

/// Go's per-queue `result_ttl_seconds` (newer Go): accepted (a config that sets it used to
/// exit 2), 0 when absent; a negative TTL is refused naming the field.
#[test]
fn result_ttl_seconds_per_queue() {
    let c = load_ok(&[
        SS,
        &inline(
            r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw","result_ttl_seconds":3600},{"queue_name":"b","igw_base_url":"http://gw"}]}"#,
        ),
    ]);
    assert_eq!(c.transport.queues[0].result_ttl_seconds, 3600);
    assert_eq!(c.transport.queues[1].result_ttl_seconds, 0);
    let err = load_err(&[
        SS,
        &inline(
            r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw","result_ttl_seconds":-5}]}"#,
        ),
    ]);
    assert!(
        err.starts_with("invalid config: queues[0].result_ttl_seconds: -5 is negative"),
        "{err}"
    );
}

/// Issue 44: an error in a config file names the file, not only the field.
#[test]
fn errors_in_a_config_file_name_the_file() {
    let t = file(
        r#"{"url":"redis://127.0.0.1:6379","queues":[{"queue_name":"q","igw_base_url":"ftp://x"}]}"#,
    );
    let err = load_err(&[SS, &format!("--transport-config-file={}", path(&t))]);
    assert!(err.contains("queues[0].igw_base_url"), "{err}");
    assert!(err.contains(&path(&t)), "{err}");
    let good = file(
        r#"{"url":"redis://127.0.0.1:6379","queues":[{"queue_name":"q","igw_base_url":"http://x"}]}"#,
    );
    let policy = file(r#"{"type":"fair-share","parameters":{"burst":0}}"#);
    let err = load_err(&[
        SS,
        &format!("--transport-config-file={}", path(&good)),
        &format!("--request-merge-policy-config-file={}", path(&policy)),
    ]);
    assert!(err.contains("merge_policy.parameters.burst"), "{err}");
    assert!(err.contains(&path(&policy)), "{err}");
}
