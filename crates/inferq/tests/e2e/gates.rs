//! End-to-end tests of dispatch gates with `inferq run`: the Go gate configs are honoured, a
//! refused request stays pending without blocking the ones behind it, and pool gates bound
//! concurrency at the gateway.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use inferq_testkit::RedisServer;
use redis::AsyncCommands;

const Q: &str = "request-sortedset";

/// The `redis` budget gate: budget 0 closes the queue (nothing is claimed, the closed gate is
/// counted); raising it lets the work flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_budget_gate_closes_and_opens_the_queue() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("dispatch-gate-budget", "0").await.unwrap();
    let opts = ProcessorOpts {
        extra_queue_fields: format!(
            r#","gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}"#,
            redis.port()
        ),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for i in 0..5 {
        producer
            .submit(request(&format!("g{i}"), 60, "{}"))
            .await
            .unwrap();
    }
    // Once the gate has answered a poll (its budget is published), nothing was claimed.
    let closed = r#"llm_d_async_async_dispatch_budget{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0"#;
    let metrics = p.metrics_with(&[closed]).await;
    assert!(metrics.contains(closed), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
    let pending: u64 = con.zcard(Q).await.unwrap();
    assert_eq!((claimed, pending), (0, 5), "a closed gate claims nothing");
    assert!(gw.executions().is_empty());
    let metrics = p.metrics().await;
    assert!(
        !metrics.contains(r#"reason="gate_closed"} 0"#),
        "closed polls are counted"
    );
    let _: () = con.set("dispatch-gate-budget", "1").await.unwrap();
    let got = wait_results(&mut con, 5, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 5);
}

/// A `redis` budget under 1 is a rate, as in Go: with batch 10, budget 0.1 and a 1 s poll
/// interval, one request per second is taken, not the whole queue back to back. A budget of 1
/// takes the rest at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queue_budget_caps_the_dispatch_rate() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("dispatch-gate-budget", "0.1").await.unwrap();
    let opts = ProcessorOpts {
        extra_queue_fields: format!(
            r#","gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}"#,
            redis.port()
        ),
        poll_interval_ms: 1000,
        ..ProcessorOpts::default()
    };
    let _p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for i in 0..10 {
        producer
            .submit(request(&format!("r{i}"), 60, "{}"))
            .await
            .unwrap();
    }
    gw.wait_executions(1, Duration::from_secs(10)).await;
    assert!(!gw.executions().is_empty(), "the queue is open at 0.1");
    // 1.5 s after the first: two or three polls of one request each (a slow machine polls
    // less often, never more).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let sent = gw.executions().len();
    assert!(
        (1..=4).contains(&sent),
        "budget 0.1 of batch 10 takes one request per 1 s poll; {sent} were sent in 1.5 s"
    );
    let _: () = con.set("dispatch-gate-budget", "1").await.unwrap();
    let got = wait_results(&mut con, 10, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 10, "an open budget takes the rest");
}

/// `redis-quota` (blocking, concurrency 1 per user) at queue level: the over-quota user's second
/// request stays pending while another user's request behind it is dispatched at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_quota_head_does_not_block_the_queue() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    // alice holds her one slot long enough that bob's dispatch falls inside it on a loaded
    // machine too.
    let (_p, producer) = one_per_user(&redis, &gw, ("alice-1", 4), 50).await;
    for (id, user, secs) in [
        ("alice-1", "alice", 30),
        ("alice-2", "alice", 31),
        ("bob-1", "bob", 32),
    ] {
        producer.submit(of_user(id, secs, user)).await.unwrap();
    }
    gw.wait_seen("bob-1", Duration::from_secs(5)).await;
    assert_eq!(gw.seen("bob-1").len(), 1, "bob is not stuck behind alice");
    assert!(
        gw.seen("alice-2").is_empty(),
        "alice's second request waits for her quota"
    );
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 3, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 3);
    let a1 = gw.seen("alice-1")[0].at;
    let a2 = gw.seen("alice-2")[0].at;
    assert!(
        a2 - a1 >= Duration::from_millis(3900),
        "alice-2 ran after alice-1 released its slot"
    );
}

/// A head the queue gate refuses is put to the gate once per poll interval, as Go does once
/// per tick, not on every quick poll for the work behind it: the refusals counted (and the
/// quota scripts run) stay near one per refused request per interval, and an admissible
/// request that arrives meanwhile still runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_head_is_asked_once_per_poll_interval() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    // alice's first request holds her one slot for the whole test.
    let (p, producer) = one_per_user(&redis, &gw, ("alice-0", 30), 250).await;
    for i in 0..6 {
        producer
            .submit(of_user(&format!("alice-{i}"), 60 + i, "alice"))
            .await
            .unwrap();
    }
    gw.wait_seen("alice-0", Duration::from_secs(5)).await;
    let series = r#"llm_d_async_async_gate_decisions_total{pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset",reason="quota_exhausted"}"#;
    let first = counter(&p.metrics_with(&[series]).await, series);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let refusals = counter(&p.metrics().await, series) - first;
    let ticks = started.elapsed().as_secs_f64() / 0.25;
    // Five refused requests, about eight intervals: about 40. Asked on every 10 ms poll, it
    // was about 1,000.
    assert!(
        refusals > 0.0 && refusals <= 5.0 * (ticks + 3.0),
        "{refusals} refusals of 5 requests in {ticks:.1} poll intervals"
    );
    producer.submit(of_user("bob-1", 90, "bob")).await.unwrap();
    gw.wait_seen("bob-1", Duration::from_secs(5)).await;
    assert_eq!(gw.seen("bob-1").len(), 1, "bob is not stuck behind alice");
    assert!(
        gw.seen("alice-1").is_empty(),
        "alice still waits for her slot"
    );
}

/// Rule 9 however deep the refused head: 45 requests of a user the gate turns away fill more
/// than four batches at the head of the queue, and another user's request behind them still
/// runs (the poll pages past them). Before, a poll looked four batches deep and no further.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deep_refused_head_does_not_hide_the_requests_behind_it() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let (_p, producer) = one_per_user(&redis, &gw, ("alice-0", 30), 50).await;
    producer
        .submit(of_user("alice-0", 60, "alice"))
        .await
        .unwrap();
    gw.wait_seen("alice-0", Duration::from_secs(5)).await;
    for i in 1..45 {
        producer
            .submit(of_user(&format!("alice-{i}"), 60 + i, "alice"))
            .await
            .unwrap();
    }
    producer.submit(of_user("bob-1", 200, "bob")).await.unwrap();
    gw.wait_seen("bob-1", Duration::from_secs(5)).await;
    assert_eq!(gw.seen("bob-1").len(), 1, "bob is stuck behind alice");
    assert!(gw.seen("alice-1").is_empty(), "alice still waits");
}

/// A request of `user` (its `userid` metadata), due in `secs`.
fn of_user(id: &str, secs: i64, user: &str) -> inferq_client::wire::NewRequest {
    let mut r = request(id, secs, "{}");
    r.metadata.insert("userid".into(), user.into());
    r
}

/// A processor whose queue gate lets each user run one request at a time, polling every
/// `poll_ms`, and a producer; the gateway answers `held.0` only after `held.1` seconds, so that
/// request holds its user's slot meanwhile.
async fn one_per_user(
    redis: &RedisServer,
    gw: &Gateway,
    held: (&str, u64),
    poll_ms: u64,
) -> (Processor, inferq_client::producer::Producer) {
    gw.script(
        held.0,
        vec![Reply::ok("{}").after(Duration::from_secs(held.1))],
    );
    let opts = ProcessorOpts {
        extra_queue_fields: one_request_per_user(redis),
        poll_interval_ms: poll_ms,
        ..ProcessorOpts::default()
    };
    let p = Processor::start(redis, gw, &opts).await;
    (p, producer(redis, Q).await)
}

/// The queue fields of a blocking `redis-quota` queue gate: one request per user at a time.
fn one_request_per_user(redis: &RedisServer) -> String {
    format!(
        r#","gate_type":"redis-quota","gate_params":{{"address":"127.0.0.1:{}","mode":"concurrency","limit":1}}"#,
        redis.port()
    )
}

/// The value of the first series in `metrics` that starts with `series` (0 when absent).
fn counter(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// A blocking `local-max-concurrency` pool gate of 2 with 6 workers: never more than 2 requests
/// at the gateway at once, and no retries.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_gate_bounds_concurrency_at_the_gateway() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    for i in 0..6 {
        gw.script(
            &format!("p{i}"),
            vec![Reply::ok("{}").after(Duration::from_millis(400))],
        );
    }
    let opts = ProcessorOpts {
        pools: Some(
            r#"[{"id":"default","workers":6,"gate_type":"local-max-concurrency","gate_params":{"limit":2,"gating_mode":"blocking"}}]"#
                .to_owned(),
        ),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for i in 0..6 {
        producer
            .submit(request(&format!("p{i}"), 60, "{}"))
            .await
            .unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 6, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 6);
    let mut starts: Vec<Instant> = (0..6).map(|i| gw.seen(&format!("p{i}"))[0].at).collect();
    starts.sort();
    // With 2 slots and 400 ms each, the 3rd and 5th starts wait for earlier ones to finish.
    assert!(
        starts[2] - starts[0] >= Duration::from_millis(350),
        "{starts:?}"
    );
    assert!(
        starts[4] - starts[2] >= Duration::from_millis(350),
        "{starts:?}"
    );
    let metrics = p.metrics().await;
    assert_no_retries(&metrics);
}

/// A pool gate's refusal frees the worker, as in Go: with 2 workers and a `redis-quota` pool
/// gate (concurrency 1 per user), six requests of alice queued ahead of two of bob's do not hold
/// both workers, so bob's first request is sent while alice's first is still running. Each
/// refusal is counted, and none is a retry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_gate_refusal_frees_the_worker_for_other_users() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    for i in 1..=6 {
        gw.script(
            &format!("alice-{i}"),
            vec![Reply::ok("{}").after(Duration::from_millis(1500))],
        );
    }
    let opts = ProcessorOpts {
        pools: Some(format!(
            r#"[{{"id":"default","workers":2,"gate_type":"redis-quota","gate_params":{{"address":"127.0.0.1:{}","mode":"concurrency","limit":1}}}}]"#,
            redis.port()
        )),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    let mut order = Vec::new();
    for i in 1..=6 {
        order.push((format!("alice-{i}"), "alice", 60 + i));
    }
    for i in 1..=2 {
        order.push((format!("bob-{i}"), "bob", 70 + i));
    }
    for (id, user, secs) in &order {
        let mut r = request(id, *secs, "{}");
        r.metadata.insert("userid".into(), (*user).into());
        producer.submit(r).await.unwrap();
    }
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 8, Duration::from_secs(30)).await;
    let mut ids: Vec<&str> = got.iter().map(|r| r.id.as_str()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!((got.len(), ids.len()), (8, 8), "one result each: {got:?}");
    let bob = gw.seen("bob-1")[0].at;
    let mut alice: Vec<Instant> = (1..=6)
        .map(|i| gw.seen(&format!("alice-{i}"))[0].at)
        .collect();
    alice.sort();
    let alice_before_bob = alice.iter().filter(|at| **at < bob).count();
    assert!(
        alice_before_bob <= 1,
        "bob's first request waits for {alice_before_bob} of alice's 6 (one at a time, 1.5 s each)"
    );
    for i in 1..=6 {
        assert_eq!(
            gw.seen(&format!("alice-{i}")).len(),
            1,
            "alice-{i} sent once"
        );
    }
    let metrics = p.metrics().await;
    assert!(
        !metrics.contains(r#"llm_d_async_async_gate_decisions_total{pool_name="default",queue_id="",queue_name="",reason="quota_exhausted"} 0"#)
            && metrics.contains(r#"llm_d_async_async_gate_decisions_total{pool_name="default",queue_id="",queue_name="",reason="quota_exhausted"}"#),
        "refusals are counted: {metrics}"
    );
    assert_no_retries(&metrics);
}

/// Graceful shutdown releases the claims of requests waiting at a pool gate at once: they have
/// not started, so they are back in pending long before `--drain-timeout` (60 s here), and the
/// processor exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_requests_waiting_at_the_pool_gate() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let mut con = con(&redis).await;
    let _: () = con.set("dispatch-gate-budget", "0").await.unwrap();
    let opts = ProcessorOpts {
        pools: Some(format!(
            r#"[{{"id":"default","workers":4,"gate_type":"wait-on-refuse","gate_params":{{"gate":{{"gate_type":"redis","gate_params":{{"address":"127.0.0.1:{}"}}}}}}}}]"#,
            redis.port()
        )),
        drain: "60s",
        ..ProcessorOpts::default()
    };
    let mut p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for i in 0..3 {
        producer
            .submit(request(&format!("w{i}"), 120, "{}"))
            .await
            .unwrap();
    }
    let started = Instant::now();
    loop {
        let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
        if claimed == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the requests are claimed and wait at the closed pool gate ({claimed} claimed)"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    p.signal("TERM");
    let code = p.wait_exit(Duration::from_secs(15)).await;
    assert_eq!(
        code,
        Some(0),
        "the processor exits without waiting out the 60 s drain"
    );
    let claimed: u64 = con.hlen(format!("{Q}:claimed")).await.unwrap();
    let pending: u64 = con.zcard(Q).await.unwrap();
    assert_eq!(
        (claimed, pending),
        (0, 3),
        "the waiting requests are back in pending"
    );
    assert!(gw.executions().is_empty(), "none was sent");
    assert!(results(&mut con).await.is_empty(), "none has a result");
}

/// A gate that cannot be built is a config error naming the field: exit 2.
#[test]
fn bad_gate_params_exit_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
        .args([
            "run",
            "--transport",
            "redis-sortedset",
            "--transport-config",
            r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_url":"http://127.0.0.1:9","gate_type":"local-max-concurrency","gate_params":{"limit":0}}]}"#,
            "--health-port",
            "0",
            "--metrics-port",
            "0",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("queues[0].gate_params") && err.contains("limit"),
        "{err}"
    );
}

/// A `prometheus-query` queue gate reads its budget from Prometheus (`--prometheus-url`): a
/// reading at or below the threshold closes the queue, a higher one opens it, the reading is
/// exported under Go's gauge names, and the start-up log names the query once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_gate_follows_the_metric() {
    let (prom, value) = fake_prometheus("0").await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_queue_fields: r#","gate_type":"prometheus-query","gate_params":{"query":"free_capacity","pool":"pool-a"}"#.to_owned(),
        extra_args: vec![
            format!("--prometheus-url=http://{prom}"),
            "--prometheus-cache-ttl=0s".to_owned(),
        ],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    for i in 0..3 {
        producer
            .submit(request(&format!("pq{i}"), 60, "{}"))
            .await
            .unwrap();
    }
    let available = r#"llm_d_async_async_gate_metric_source_available{inference_pool="pool-a",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 1"#;
    let metrics = p.metrics_with(&[available]).await;
    assert!(metrics.contains(available), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(gw.executions().is_empty(), "budget 0: the queue is closed");
    *value.lock().unwrap() = "0.8".to_owned();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 3, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 3);
    let metrics = p.metrics().await;
    assert!(metrics.contains(r#"llm_d_async_async_gate_metric_value{inference_pool="pool-a",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0.8"#), "{metrics}");
    // The gate is built once: its start-up line says its query once.
    assert_eq!(
        p.log().matches("metric gate query").count(),
        1,
        "{}",
        p.log()
    );
}

/// A fake Prometheus whose every instant query answers one sample of the value in the returned
/// cell.
pub(crate) async fn fake_prometheus(value: &str) -> (std::net::SocketAddr, Arc<Mutex<String>>) {
    let value = Arc::new(Mutex::new(value.to_owned()));
    let served = value.clone();
    let app = axum::Router::new().route(
        "/api/v1/query",
        axum::routing::get(move || {
            let v = served.lock().unwrap().clone();
            async move {
                format!(
                    r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{}},"value":[1,"{v}"]}}]}}}}"#
                )
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, value)
}

/// Metric gates wrapped in other gates, at queue and at pool level, export their readings under
/// Go's gauge names, as Go's do: a queue's `wait-on-refuse` around `prometheus-query` with the
/// queue's labels, a pool's `tier-priority-admission` around `prometheus-saturation` with the
/// pool's (empty queue labels).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrapped_and_pool_metric_gates_export_their_readings() {
    let (prom, _value) = fake_prometheus("0.8").await;
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        extra_queue_fields: r#","gate_type":"wait-on-refuse","gate_params":{"gate":{"gate_type":"prometheus-query","gate_params":{"query":"free_capacity","pool":"pool-a"}}}"#.to_owned(),
        pools: Some(
            r#"[{"id":"default","workers":4,"gate_type":"tier-priority-admission","gate_params":{"saturation_gate":"prometheus-saturation","saturation_gate_params":{"pool":"pool-b"}}}]"#
                .to_owned(),
        ),
        extra_args: vec![
            format!("--prometheus-url=http://{prom}"),
            "--prometheus-cache-ttl=0s".to_owned(),
        ],
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let producer = producer(&redis, Q).await;
    producer.submit(request("m1", 60, "{}")).await.unwrap();
    let mut con = con(&redis).await;
    let got = wait_results(&mut con, 1, Duration::from_secs(10)).await;
    assert_eq!(got.len(), 1);
    let metrics = p.metrics().await;
    for series in [
        r#"llm_d_async_async_gate_metric_value{inference_pool="pool-a",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 0.8"#,
        r#"llm_d_async_async_gate_metric_source_available{inference_pool="pool-a",pool_name="default",queue_id="request-sortedset",queue_name="request-sortedset"} 1"#,
        r#"llm_d_async_async_gate_metric_value{inference_pool="pool-b",pool_name="default",queue_id="",queue_name=""} 0.8"#,
        r#"llm_d_async_async_gate_metric_source_available{inference_pool="pool-b",pool_name="default",queue_id="",queue_name=""} 1"#,
        r#"llm_d_async_async_gate_metric_threshold{inference_pool="pool-b",pool_name="default",queue_id="",queue_name=""}"#,
    ] {
        assert!(metrics.contains(series), "{series} missing:\n{metrics}");
    }
}

/// No request was counted as a retry (every series of the metric, there from start-up, is 0).
fn assert_no_retries(metrics: &str) {
    let series: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("llm_d_async_async_request_retries_total{"))
        .collect();
    assert!(
        !series.is_empty() && series.iter().all(|l| l.ends_with("} 0")),
        "no retries: {metrics}"
    );
}

/// A `redis-leased-rate` pool gate inside `wait-on-refuse`, as Go recommends: with no lease
/// nothing is sent and the three `drain_limit_*` gauges read 0; a lease of 4 requests a second
/// lets a burst of 4 through at once and the rest at its pace, and the gauges show the lease.
/// A malformed lease stops the pool again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_rate_pool_gate_paces_the_pool_and_exports_its_lease() {
    let redis = RedisServer::start().unwrap();
    let gw = Gateway::start().await;
    let opts = ProcessorOpts {
        pools: Some(format!(
            r#"[{{"id":"default","workers":8,"gate_type":"wait-on-refuse","gate_params":{{"gate":{{"gate_type":"redis-leased-rate","gate_params":{{"address":"127.0.0.1:{}","control_key":"drain:default"}}}}}}}}]"#,
            redis.port()
        )),
        ..ProcessorOpts::default()
    };
    let p = Processor::start(&redis, &gw, &opts).await;
    let gauges = |rps: &str, valid: &str, until: &str| {
        [
            format!(r#"llm_d_async_async_drain_limit_rps{{pool_name="default"}} {rps}"#),
            format!(r#"llm_d_async_async_drain_limit_lease_valid{{pool_name="default"}} {valid}"#),
            format!(
                r#"llm_d_async_async_drain_limit_valid_until_seconds{{pool_name="default"}} {until}"#
            ),
        ]
    };
    let at_start = p.metrics().await;
    for series in gauges("0", "0", "0") {
        assert!(at_start.contains(&series), "{series} missing:\n{at_start}");
    }
    let producer = producer(&redis, Q).await;
    for i in 0..8 {
        producer
            .submit(request(&format!("l{i}"), 60, "{}"))
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(gw.executions().is_empty(), "no lease: nothing is sent");

    let mut con = con(&redis).await;
    let (now_s, now_us): (i64, i64) = redis::cmd("TIME").query_async(&mut con).await.unwrap();
    let until = now_s * 1000 + now_us / 1000 + 60_000;
    let lease = |rate: &str| {
        [
            ("api_version", "llm-d.ai/v1alpha1".to_owned()),
            ("pool_id", "default".to_owned()),
            ("max_admission_rps", rate.to_owned()),
            ("valid_until_unix_ms", until.to_string()),
            ("decision_id", "d-1".to_owned()),
        ]
    };
    let _: () = con
        .hset_multiple("drain:default", &lease("4"))
        .await
        .unwrap();
    let got = wait_results(&mut con, 8, Duration::from_secs(15)).await;
    assert_eq!(got.len(), 8);
    let mut starts: Vec<Instant> = (0..8).map(|i| gw.seen(&format!("l{i}"))[0].at).collect();
    starts.sort();
    // A burst of 4, then 4 more at 4 a second: the last starts about a second after the first.
    assert!(
        starts[7] - starts[0] >= Duration::from_millis(800),
        "paced at 4/s: {:?}",
        starts[7] - starts[0]
    );
    let seconds = inferq::ops::gofloat::go_float(until as f64 / 1000.0);
    let metrics = p.metrics().await;
    for series in gauges("4", "1", &seconds) {
        assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
    }

    // A lease for another pool is no lease: the pool stops, and says so.
    let _: () = con.hset("drain:default", "pool_id", "other").await.unwrap();
    producer.submit(request("late", 60, "{}")).await.unwrap();
    let stopped = gauges("0", "0", "0");
    let metrics = p.metrics_with(&[&stopped[1]]).await;
    assert!(metrics.contains(&stopped[1]), "{metrics}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        gw.seen("late").is_empty(),
        "an invalid lease admits nothing"
    );
}

/// A `redis-leased-rate` gate without its `control_key`, and an `endpoint-scrape` gate whose
/// counted admission has no capacity, are config errors naming the field: exit 2.
#[test]
fn bad_leased_rate_and_counted_params_exit_2() {
    for (gate, param) in [
        (
            r#""gate_type":"redis-leased-rate","gate_params":{"address":"127.0.0.1:1"}"#,
            "control_key",
        ),
        (
            r#""gate_type":"endpoint-scrape","gate_params":{"url":"http://127.0.0.1:9/metrics","metric":"m","admission":"counted"}"#,
            "max_count_per_pod",
        ),
    ] {
        let config = format!(
            r#"{{"url":"redis://127.0.0.1:1","queues":[{{"queue_name":"q","igw_base_url":"http://127.0.0.1:9",{gate}}}]}}"#
        );
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_inferq"))
            .args([
                "run",
                "--transport",
                "redis-sortedset",
                "--transport-config",
                &config,
                "--health-port",
                "0",
                "--metrics-port",
                "0",
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("queues[0].gate_params") && err.contains(param),
            "{err}"
        );
    }
}
