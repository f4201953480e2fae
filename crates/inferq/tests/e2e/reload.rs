//! End-to-end tests of the queues config reload (`--transport-config-watch-interval`, SIGHUP):
//! the real `inferq` binary against a real Redis and the scriptable gateway, its transport
//! config in a file the test rewrites.

use crate::common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

/// A queue of the transport config, served by the gateway.
fn queue(name: &str, gw: &Gateway) -> String {
    format!(r#"{{"queue_name":"{name}","igw_base_url":"{}"}}"#, gw.url())
}

/// The transport config with these queues (and `extra` top-level fields).
fn config(redis: &RedisServer, extra: &str, queues: &[String]) -> String {
    format!(
        r#"{{"url":"{}","poll_interval_ms":50,"batch_size":10,"claim_lease_ttl_seconds":10,"claim_reclaim_interval_ms":2000{extra},"queues":[{}]}}"#,
        redis.url(),
        queues.join(",")
    )
}

/// Rewrites the config file in one step (a reader never sees half a file).
fn write(file: &tempfile::NamedTempFile, text: &str) {
    let next = file.path().with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, file.path()).unwrap();
}

/// A processor reading its transport config from `file`, with `flags` (the watch interval).
async fn start(
    redis: &RedisServer,
    gw: &Gateway,
    file: &tempfile::NamedTempFile,
    concurrency: u32,
    flags: &[&str],
) -> Processor {
    let opts = ProcessorOpts {
        concurrency,
        transport_args: Some(vec![
            "--transport=redis-sortedset".to_owned(),
            format!("--transport-config-file={}", file.path().display()),
        ]),
        extra_args: flags.iter().map(|f| f.to_string()).collect(),
        ..ProcessorOpts::default()
    };
    Processor::start(redis, gw, &opts).await
}

/// Submits `n` requests `<prefix>-<i>` to `queue`.
async fn submit(redis: &RedisServer, queue: &str, prefix: &str, n: usize) {
    let producer = producer(redis, queue).await;
    for i in 0..n {
        producer
            .submit(request(&format!("{prefix}-{i}"), 60, r#"{"prompt":"a"}"#))
            .await
            .unwrap();
    }
}

/// Waits until `log` shows `line` (at most 10 s).
async fn wait_log(p: &Processor, line: &str) {
    let started = Instant::now();
    while !p.log().contains(line) && started.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(
        p.log().contains(line),
        "no {line:?} in the log:\n{}",
        p.log()
    );
}

/// Results per request id on the default result list.
async fn results_by_id(con: &mut redis::aio::ConnectionManager) -> HashMap<String, usize> {
    let mut by_id = HashMap::new();
    for r in results(con).await {
        *by_id.entry(r.id).or_default() += 1;
    }
    by_id
}

/// A queue added to the file is served once the next tick reads it: the backlog it had
/// gathered drains, the queue that stayed keeps its request in flight (run once, one result),
/// and the reload is logged and counted as a success.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_added_queue_drains_its_backlog_and_the_kept_one_is_untouched() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    gw.script(
        "kept-0",
        vec![Reply::ok("{}").after(Duration::from_millis(1500))],
    );
    let file = tempfile::NamedTempFile::new().unwrap();
    write(&file, &config(&redis, "", &[queue("qa", &gw)]));
    let p = start(
        &redis,
        &gw,
        &file,
        4,
        &["--transport-config-watch-interval=200ms"],
    )
    .await;
    submit(&redis, "qb", "new", 5).await;
    submit(&redis, "qa", "kept", 1).await;
    gw.wait_seen("kept-0", Duration::from_secs(5)).await;
    let mut con = con(&redis).await;
    let pending: u64 = con.zcard("qb").await.unwrap();
    assert_eq!(pending, 5, "qb is not served before the reload");

    write(
        &file,
        &config(&redis, "", &[queue("qa", &gw), queue("qb", &gw)]),
    );
    wait_log(&p, "Applied queues config reload").await;
    let got = wait_results(&mut con, 6, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 6, "{got:?}");
    let by_id = results_by_id(&mut con).await;
    assert!(by_id.values().all(|n| *n == 1), "{by_id:?}");
    assert_eq!(
        gw.seen("kept-0").len(),
        1,
        "the kept queue's request ran once"
    );
    let pending: u64 = con.zcard("qb").await.unwrap();
    assert_eq!(pending, 0);
    let log = p.log();
    assert!(
        log.contains(r#"added=["qb"] removed=[] changed=[]"#),
        "{log}"
    );
    let metrics = p
        .metrics_with(&[r#"llm_d_async_async_queue_config_reloads_total{result="success"} 1"#])
        .await;
    assert!(
        metrics.contains(r#"llm_d_async_async_queue_config_reloads_total{result="success"} 1"#),
        "{metrics}"
    );
    let stamp = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix("llm_d_async_async_queue_config_last_success_timestamp_seconds ")
        })
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let now = inferq_client::producer::unix_ms() as f64 / 1000.0;
    assert!((now - 60.0..=now).contains(&stamp), "{stamp} vs {now}");
}

/// All queues removed (an empty `queues`) while a slow gateway has some of them in flight:
/// what was in flight finishes with one result each, what was claimed and waiting goes back to
/// pending, nothing is claimed any more, nothing more is sent, and results + pending make the
/// count submitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_queue_finishes_or_returns_what_it_holds_and_keeps_its_backlog() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    const N: usize = 30;
    for i in 0..N {
        gw.script(
            &format!("b-{i}"),
            vec![Reply::ok("{}").after(Duration::from_millis(1500))],
        );
    }
    let file = tempfile::NamedTempFile::new().unwrap();
    write(&file, &config(&redis, "", &[queue("qb", &gw)]));
    let p = start(
        &redis,
        &gw,
        &file,
        2,
        &["--transport-config-watch-interval=200ms"],
    )
    .await;
    submit(&redis, "qb", "b", N).await;
    gw.wait_executions(2, Duration::from_secs(5)).await;
    let mut con = con(&redis).await;
    let claimed: u64 = con.hlen("qb:claimed").await.unwrap();
    assert!(
        claimed > 2,
        "requests wait for a worker too: {claimed} claimed"
    );

    write(&file, &config(&redis, "", &[]));
    wait_log(&p, "removed queue stopped; its backlog stays in Redis").await;
    let in_flight: Vec<String> = gw.executions().into_keys().collect();
    let by_id = results_by_id(&mut con).await;
    for id in &in_flight {
        assert_eq!(by_id.get(id), Some(&1), "{id} ran: one result ({by_id:?})");
    }
    assert!(by_id.values().all(|n| *n == 1), "{by_id:?}");
    let claimed: u64 = con.hlen("qb:claimed").await.unwrap();
    let pending: u64 = con.zcard("qb").await.unwrap();
    assert_eq!(claimed, 0, "no claim stays behind");
    assert!(
        pending > 0,
        "the claims that waited for a worker went back to pending"
    );
    assert_eq!(
        by_id.len() + pending as usize,
        N,
        "{by_id:?}, {pending} pending"
    );
    // Nothing more is taken from the removed queue.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let later: u64 = con.zcard("qb").await.unwrap();
    assert_eq!((later, gw.executions().len()), (pending, in_flight.len()));
    assert!(
        p.log().contains(r#"added=[] removed=["qb"]"#),
        "{}",
        p.log()
    );
}

/// A change to a field other than `queues`, or a queue naming an unknown pool, is refused: the
/// log says a restart is required (naming the field), the error is counted, and the queues
/// that ran keep running.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_beyond_the_queues_is_refused_and_the_old_config_keeps_serving() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    write(&file, &config(&redis, "", &[queue("qa", &gw)]));
    let p = start(
        &redis,
        &gw,
        &file,
        4,
        &["--transport-config-watch-interval=200ms"],
    )
    .await;
    let added = [queue("qa", &gw), queue("qb", &gw)];
    write(
        &file,
        &config(&redis, r##","retry_queue_name":"other-retry""##, &added),
    );
    wait_log(&p, "Rejected transport config reload; restart required").await;
    assert!(p.log().contains("field=retry_queue_name"), "{}", p.log());
    let pooled = queue("qb", &gw).replace('}', r#","worker_pool_id":"gpu"}"#);
    write(&file, &config(&redis, "", &[queue("qa", &gw), pooled]));
    wait_log(&p, r#"pool "gpu" is not defined"#).await;
    let metrics = p
        .metrics_with(&[r#"llm_d_async_async_queue_config_reloads_total{result="error"} 2"#])
        .await;
    assert!(
        metrics.contains(r#"llm_d_async_async_queue_config_reloads_total{result="error"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"llm_d_async_async_queue_config_reloads_total{result="success"} 0"#),
        "{metrics}"
    );
    assert!(!p.log().contains("Applied queues config reload"));
    // Still the first config: qa is served, qb is not.
    submit(&redis, "qa", "a", 1).await;
    submit(&redis, "qb", "b", 1).await;
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].id, "a-0");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending: u64 = con.zcard("qb").await.unwrap();
    assert_eq!(pending, 1);
}

/// With no watch interval, nothing reads the file until a SIGHUP, which reloads it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_without_a_watch_interval() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let file = tempfile::NamedTempFile::new().unwrap();
    write(&file, &config(&redis, "", &[queue("qa", &gw)]));
    let p = start(&redis, &gw, &file, 4, &[]).await;
    write(
        &file,
        &config(&redis, "", &[queue("qa", &gw), queue("qb", &gw)]),
    );
    submit(&redis, "qb", "b", 2).await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut con = con(&redis).await;
    let pending: u64 = con.zcard("qb").await.unwrap();
    assert_eq!(pending, 2, "no reload without a tick or a SIGHUP");
    p.signal("HUP");
    let got = wait_results(&mut con, 2, Duration::from_secs(5)).await;
    assert_eq!(got.len(), 2, "{}", p.log());
    let log = p.log();
    assert!(log.contains("SIGHUP: reloading the queues config"), "{log}");
    assert!(log.contains(r#"added=["qb"]"#), "{log}");
}

/// Bad values of the flag, and the flag where no reload can be made, exit 2 naming it.
#[test]
fn bad_watch_flags_exit_2_naming_the_flag() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let json =
        r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    std::fs::write(file.path(), json).unwrap();
    let from_file = format!("--transport-config-file={}", file.path().display());
    let inline = format!("--transport-config={json}");
    let cases: [(&[&str], &str); 5] = [
        (
            &[
                "--transport=redis-sortedset",
                &from_file,
                "--transport-config-watch-interval=-1s",
            ],
            "must not be negative",
        ),
        (
            &[
                "--transport=redis-sortedset",
                &from_file,
                "--transport-config-watch-interval=soon",
            ],
            "invalid duration",
        ),
        (
            &[
                "--transport=redis-sortedset",
                &inline,
                "--transport-config-watch-interval=5s",
            ],
            "only with --transport=redis-sortedset and --transport-config-file",
        ),
        (
            &[
                "--transport=redis-pubsub",
                &from_file,
                "--transport-config-watch-interval=5s",
            ],
            "only with --transport=redis-sortedset:",
        ),
        (
            &[
                "--redis.url=redis://127.0.0.1:1",
                "--redis.ss.igw-base-url=http://gw",
                "--message-queue-impl=redis-sortedset",
                "--transport-config-watch-interval=5s",
            ],
            "only with --transport=redis-sortedset and --transport-config-file",
        ),
    ];
    for (flags, reason) in cases {
        let mut args = vec![
            "run",
            "--metrics-endpoint-auth=false",
            "--health-port=0",
            "--metrics-port=0",
        ];
        args.extend_from_slice(flags);
        let (code, err) = run_briefly(&args);
        assert_eq!(code, Some(2), "{flags:?}: {err}");
        assert!(
            err.contains("--transport-config-watch-interval") && err.contains(reason),
            "{flags:?}: {err}"
        );
    }
}

/// Runs `inferq` with `args` for at most 10 s (one that accepted its flags would run on): its
/// exit code (`None`: killed) and standard error.
fn run_briefly(args: &[&str]) -> (Option<i32>, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let code = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status.code();
        }
        if started.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut stderr, &mut err);
    }
    (code, err)
}
