//! A poison request — one that kills its processor every time it is dispatched — is
//! dead-lettered after `max_deliveries` lease expiries with one clear terminal record, while a
//! small fleet (three `inferq run` processes under a supervisor in the test that restarts any
//! that dies) keeps serving everything else. The crash is real: `INFERQ_FAULT_CRASH_ON` makes
//! the processor `abort()` before it sends a payload carrying the marker.

use crate::common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Gateway;
use inferq_client::wire::ErrorCode;
use inferq_testkit::{free_port, port_taken, RedisServer};
use redis::AsyncCommands;

const QUEUE: &str = "request-sortedset";
const MARKER: &str = "POISON-7f3a";
const MAX_DELIVERIES: u32 = 3;
const FLEET: usize = 3;

fn spawn(redis: &RedisServer, gateway: &Gateway, log: &std::path::Path) -> Child {
    let config = format!(
        r#"{{"url":"{}","poll_interval_ms":50,"batch_size":10,"claim_lease_ttl_seconds":1.5,"claim_reclaim_interval_ms":250,"max_deliveries":{MAX_DELIVERIES},"queues":[{{"queue_name":"{QUEUE}","igw_base_url":"{}"}}]}}"#,
        redis.url(),
        gateway.url(),
    );
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args([
            "run",
            "--transport",
            "redis-sortedset",
            "--transport-config",
            &config,
        ])
        .args(["--health-port", &free_port().unwrap().to_string()])
        .args(["--metrics-port", &free_port().unwrap().to_string()])
        .args(["--concurrency", "4", "--drain-timeout", "1s"])
        .env("INFERQ_FAULT_CRASH_ON", MARKER)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap()
}

/// Keeps one processor running in a slot: restarts it whenever it dies, counting the deaths
/// by SIGABRT (the injected crash) and any other death, except a start that found its port
/// taken (by another test process, between `free_port` and its bind), which says so in the
/// log it wrote.
async fn supervise(
    redis: Arc<RedisServer>,
    gateway: Gateway,
    log: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    aborts: Arc<AtomicU32>,
    other_deaths: Arc<AtomicU32>,
) {
    let written = |log: &std::path::Path| std::fs::read(log).unwrap_or_default();
    let mut from = written(&log).len();
    let mut child = spawn(&redis, &gateway, &log);
    while !stop.load(Ordering::SeqCst) {
        if let Ok(Some(status)) = child.try_wait() {
            let said = written(&log);
            let taken = port_taken(&String::from_utf8_lossy(
                said.get(from..).unwrap_or_default(),
            ));
            if status.signal() == Some(libc_sigabrt()) {
                aborts.fetch_add(1, Ordering::SeqCst);
            } else if !taken {
                other_deaths.fetch_add(1, Ordering::SeqCst);
            }
            from = said.len();
            child = spawn(&redis, &gateway, &log);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn libc_sigabrt() -> i32 {
    6
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_request_is_dead_lettered_after_max_deliveries_while_the_fleet_serves_the_rest() {
    let started = Instant::now();
    let redis = Arc::new(RedisServer::start().unwrap());
    let gateway = Gateway::start().await;
    let producer = common::producer(&redis, QUEUE).await;
    let mut con = common::con(&redis).await;
    let logs = tempfile::tempdir().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let aborts = Arc::new(AtomicU32::new(0));
    let other_deaths = Arc::new(AtomicU32::new(0));
    let mut slots = Vec::new();
    for i in 0..FLEET {
        slots.push(tokio::spawn(supervise(
            redis.clone(),
            gateway.clone(),
            logs.path().join(format!("p{i}.log")),
            stop.clone(),
            aborts.clone(),
            other_deaths.clone(),
        )));
    }

    // Normal work in waves across the whole poison cycle, the poison in the middle of the first.
    let normal = 300usize;
    let waves = 10usize;
    for w in 0..waves {
        let reqs: Vec<_> = (0..normal / waves)
            .map(|i| {
                let n = w * (normal / waves) + i;
                common::request(&format!("n-{n:03}"), 600, r#"{"prompt":"fine"}"#)
            })
            .collect();
        for r in producer.submit_many(reqs).await.unwrap() {
            r.unwrap();
        }
        if w == 0 {
            let poison = common::request(
                "poison",
                600,
                &format!(r#"{{"prompt":"this one kills the worker: {MARKER}"}}"#),
            );
            producer.submit(poison).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let results = common::wait_results(&mut con, normal + 1, Duration::from_secs(40)).await;
    stop.store(true, Ordering::SeqCst);
    for s in slots {
        s.await.unwrap();
    }
    let dump_logs = || {
        for i in 0..FLEET {
            let text =
                std::fs::read_to_string(logs.path().join(format!("p{i}.log"))).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            eprintln!("--- p{i} (last lines) ---");
            for l in tail.iter().rev() {
                eprintln!("{l}");
            }
        }
    };

    let poison: Vec<_> = results.iter().filter(|r| r.id == "poison").collect();
    if poison.len() != 1 || results.len() != normal + 1 {
        dump_logs();
    }
    assert_eq!(results.len(), normal + 1, "one terminal record per request");
    assert_eq!(poison.len(), 1, "{poison:?}");
    assert_eq!(poison[0].error_code, ErrorCode::DeadLettered.as_str());
    assert!(
        poison[0].error_message.contains("delivery limit")
            && poison[0].error_message.contains("max_deliveries"),
        "{}",
        poison[0].error_message
    );
    // Delivered exactly max_deliveries times: each delivery killed one processor, and the
    // gateway never saw it.
    assert_eq!(aborts.load(Ordering::SeqCst), MAX_DELIVERIES);
    assert_eq!(other_deaths.load(Ordering::SeqCst), 0);
    assert!(gateway.seen("poison").is_empty());
    // Every normal request: exactly one result, and a successful one.
    for n in 0..normal {
        let id = format!("n-{n:03}");
        let mine: Vec<_> = results.iter().filter(|r| r.id == id).collect();
        assert_eq!(mine.len(), 1, "{id}: {mine:?}");
        assert_eq!(mine[0].status_code, 200, "{id}: {mine:?}");
    }
    // The dead list has exactly the poison, and `inferq dead-letter list` shows it.
    let out = Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args(["dead-letter", "list", "--json", "--redis-url", &redis.url()])
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0]["id"], "poison");
    assert_eq!(rows[0]["deliveries"], MAX_DELIVERIES);
    assert!(rows[0]["reason"]
        .as_str()
        .unwrap()
        .contains("delivery limit reached"));
    let pending: u64 = con.zcard(QUEUE).await.unwrap();
    assert_eq!(pending, 0);
    eprintln!(
        "poison test: {} crashes, {} results, {:.1} s",
        aborts.load(Ordering::SeqCst),
        results.len(),
        started.elapsed().as_secs_f64()
    );
}
