//! The emulation against a real `redis-server`: each test starts its own and checks the bytes
//! the step writes and the answers it gives.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use serde_json::json;

use super::*;
use crate::RedisServer;

async fn setup(
    config: BrokerConfig,
) -> (RedisServer, RouterBroker, redis::aio::MultiplexedConnection) {
    let server = RedisServer::start().unwrap();
    let con = server.connection().await.unwrap();
    let broker = RouterBroker::connect(&server.url(), config).await.unwrap();
    (server, broker, con)
}

fn queued(served: Served) -> (Queued, Answer) {
    match served {
        Served::Queued { queued, answer } => (queued, answer),
        other => panic!("not queued: {other:?}"),
    }
}

/// Polls `check` every 20 ms for up to 10 s.
async fn until<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn enqueue_writes_the_routers_member_markers_and_score() {
    let config = BrokerConfig {
        routes: vec![BrokerRoute {
            model: "m".into(),
            queue: "q-m".into(),
            tier: "batch".into(),
            ..BrokerRoute::default()
        }],
        ..BrokerConfig::default()
    };
    let (_server, broker, mut con) = setup(config).await;
    // A stale cancel marker from an earlier generation: the MULTI deletes it.
    let _: () = con.set("request-cancel:acme:job-1", "old").await.unwrap();
    let body = br#"{"model":"m","messages":[{"role":"user","content":"<b> & \u2028"}],"max_tokens":16,"temperature":1.0,"top_p":1e-7}"#;
    let headers = [
        ("X-AP-Mode", "Enqueue"),
        ("X-Team", "acme"),
        ("X-Request-Id", "job-1"),
        ("X-Request-Timeout-Seconds", "120"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("X-LLM-D-SLO-TTFT-MS", "250"),
        ("x-not-forwarded", "1"),
    ];
    let (q, answer) = queued(broker.post("/v1/chat/completions", &headers, body).await);

    assert_eq!(answer.status, 202);
    assert_eq!(answer.body, b"{\"id\":\"job-1\",\"status\":\"pending\"}\n");
    assert_eq!(answer.header("x-request-id"), Some("job-1"));
    assert_eq!(answer.header("content-type"), Some("application/json"));
    assert_eq!(q.deadline - q.created, 120);
    assert_eq!(q.token.len(), 32);
    let expected = format!(
        concat!(
            r#"{{"internal":{{"request_token":"{token}","request_queue_name":"q-m","result_queue_name":"results:req:acme:job-1"}},"#,
            r#""request_kind":"redis","data":{{"id":"acme:job-1","created":{created},"deadline":{deadline},"#,
            r#""payload":{{"max_tokens":16,"messages":[{{"content":"\u003cb\u003e \u0026 \u2028","role":"user"}}],"model":"m","temperature":1,"top_p":1e-7}},"#,
            r#""metadata":{{"traceparent":"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01","userid":"acme"}},"#,
            r#""headers":{{"x-llm-d-slo-ttft-ms":"250"}},"endpoint":"/v1/chat/completions","#,
            r#""request_queue_name":"q-m","result_queue_name":"results:req:acme:job-1"}}}}"#
        ),
        token = q.token,
        created = q.created,
        deadline = q.deadline
    );
    assert_eq!(q.member, expected);
    let members: Vec<(String, f64)> = con.zrange_withscores("q-m", 0, -1).await.unwrap();
    assert_eq!(members, vec![(expected, q.deadline as f64)]);
    let active: String = con.get("request-active:acme:job-1").await.unwrap();
    assert_eq!(active, q.token);
    let pttl: i64 = con.pttl("request-active:acme:job-1").await.unwrap();
    assert!((118_000..=120_000).contains(&pttl), "pttl {pttl}");
    assert!(matches!(q.active_ttl, ActiveTtl::Px(ms) if (119_000..=120_000).contains(&ms)));
    let cancel: bool = con.exists("request-cancel:acme:job-1").await.unwrap();
    assert!(!cancel, "the stale cancel marker is deleted");
}

#[tokio::test]
async fn ids_tenants_timeouts_and_queues_default_as_the_router_does() {
    let config = BrokerConfig {
        timeouts: [(
            "wait".to_owned(),
            TimeoutBounds {
                default_seconds: 0,
                max_seconds: 30,
            },
        )]
        .into(),
        forward_headers: Some(Vec::new()),
        ..BrokerConfig::default()
    };
    let (_server, broker, mut con) = setup(config).await;
    let body = br#"{"model":"m"}"#;
    let long = "a".repeat(128);
    for (given, kept) in [
        ("ok-1", true),
        (long.as_str(), true),
        ("a_b", false),
        ("", false),
    ] {
        let (q, answer) = queued(
            broker
                .post(
                    "/v1/completions",
                    &[("x-ap-mode", "enqueue"), ("x-request-id", given)],
                    body,
                )
                .await,
        );
        assert_eq!(q.id == given, kept, "{given:?}");
        assert_eq!(answer.header("x-request-id"), Some(q.id.as_str()));
        assert_eq!(q.tenant, "default");
        assert_eq!(q.queue, "request-sortedset");
        assert_eq!(q.deadline - q.created, 3600, "enqueue's default");
        if !kept {
            let uuid = q.id.as_bytes();
            assert_eq!(q.id.len(), 36, "{}", q.id);
            assert_eq!(
                (uuid[8], uuid[13], uuid[14], uuid[18], uuid[23]),
                (b'-', b'-', b'4', b'-', b'-')
            );
        }
    }
    let (q, _) = queued(
        broker
            .post(
                "/v1/completions",
                &[("x-ap-mode", "enqueue"), ("x-request-id", &"b".repeat(129))],
                body,
            )
            .await,
    );
    assert_eq!(q.id.len(), 36, "129 characters are minted over");
    // `wait` clamps to max_seconds, ignores a bad timeout; the wait cap is unset, so the hold
    // would run to the deadline: a result is there before the hold starts.
    for (asked, secs) in [("600", 30), ("-5", 30), ("x", 30), ("7", 7)] {
        let id = format!("t{secs}{}", asked.len());
        let _: () = con
            .lpush(
                mailbox("default", &id),
                r#"{"id":"default:x","status_code":200,"payload":"{}"}"#,
            )
            .await
            .unwrap();
        let headers = [
            ("x-ap-mode", "WAIT"),
            ("x-request-id", id.as_str()),
            ("x-request-timeout-seconds", asked),
        ];
        let (q, answer) = queued(broker.post("/v1/completions", &headers, body).await);
        assert_eq!(answer.status, 200);
        assert_eq!((asked, q.deadline - q.created), (asked, secs));
        assert!(
            !q.member.contains("\"headers\""),
            "empty forward_headers forward nothing"
        );
    }
}

#[tokio::test]
async fn refusals_answer_the_routers_bytes_and_write_nothing() {
    let (_server, broker, mut con) = setup(BrokerConfig::default()).await;
    /// Headers, body, the answer's status and text.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [u8], u16, &'a str);
    let cases: [Case; 6] = [
        (&[("x-ap-mode", "later")], br#"{"model":"m"}"#, 400,
         "{\"error\":{\"message\":\"unknown X-AP-Mode value\",\"type\":\"invalid_request_error\",\"code\":\"INVALID_REQUEST\"}}\n"),
        (&[("x-ap-mode", "wait")], br#"{"model":"m","stream":true}"#, 400,
         "{\"error\":{\"message\":\"stream is only supported in passthrough mode\",\"type\":\"invalid_request_error\",\"code\":\"INVALID_REQUEST\"}}\n"),
        (&[("x-ap-mode", "enqueue")], br#"{"model":7}"#, 400,
         "{\"error\":{\"message\":\"model is required\",\"type\":\"invalid_request_error\",\"code\":\"INVALID_REQUEST\"}}\n"),
        (&[("x-ap-mode", "enqueue"), ("x-team", "a:b")], br#"{"model":"m"}"#, 400,
         "{\"error\":{\"message\":\"X-Team must not contain \\\":\\\"\",\"type\":\"invalid_request_error\",\"code\":\"INVALID_REQUEST\"}}\n"),
        (&[("x-ap-mode", "enqueue")], b"[1]", 400, "invalid JSON body\n"),
        (&[("x-ap-mode", "enqueue")], b"null", 400, "invalid JSON body\n"),
    ];
    for (headers, body, status, text) in cases {
        let served = broker.post("/v1/completions", headers, body).await;
        let Served::Answered(answer) = served else {
            panic!("{headers:?}: {served:?}");
        };
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (status, text),
            "{headers:?}"
        );
        assert_eq!(answer.header("x-request-id"), None);
    }
    assert!(matches!(
        broker
            .post(
                "/v1/completions",
                &[("x-team", "a:b")],
                br#"{"stream":true}"#
            )
            .await,
        Served::Untouched
    ));
    let keys: i64 = redis::cmd("DBSIZE").query_async(&mut con).await.unwrap();
    assert_eq!(keys, 0, "nothing written");
}

#[tokio::test]
async fn fetch_reads_pending_ready_and_unknown_and_shrinks_the_ttl() {
    let (_server, broker, mut con) = setup(BrokerConfig::default()).await;
    let headers = [
        ("x-ap-mode", "enqueue"),
        ("x-team", "acme"),
        ("x-request-id", "f1"),
    ];
    queued(
        broker
            .post("/v1/completions", &headers, br#"{"model":"m"}"#)
            .await,
    );
    let answer = broker.fetch(Some("acme"), "f1").await;
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (202, "{\"id\":\"f1\",\"status\":\"pending\"}\n")
    );
    let gone = "{\"error\":{\"message\":\"request id is unknown, expired, or already deleted\",\"type\":\"invalid_request_error\",\"code\":\"UNKNOWN_REQUEST\"}}\n";
    for (tenant, id) in [(None, "f1"), (Some("other"), "f1"), (Some("acme"), "nope")] {
        let answer = broker.fetch(tenant, id).await;
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (410, gone),
            "{tenant:?} {id}"
        );
    }
    // The AP's result: one LPUSH to the mailbox with the queue's result TTL.
    let _: () = con
        .lpush(
            "results:req:acme:f1",
            r#"{"id":"acme:f1","status_code":201,"payload":"{\"ok\":true} "}"#,
        )
        .await
        .unwrap();
    let _: () = con.expire("results:req:acme:f1", 3600).await.unwrap();
    for _ in 0..2 {
        let answer = broker.fetch(Some("acme"), "f1").await;
        assert_eq!(
            (answer.status, answer.body.as_slice()),
            (201, &b"{\"ok\":true} "[..])
        );
        assert_eq!(answer.header("content-type"), Some("application/json"));
        let ttl: i64 = con.ttl("results:req:acme:f1").await.unwrap();
        assert!((55..=60).contains(&ttl), "grace ttl {ttl}");
    }
    let answer = broker.delete(Some("acme"), "f1").await;
    assert_eq!((answer.status, answer.body.len()), (204, 0));
    let _: () = con.del("request-active:acme:f1").await.unwrap();
    assert_eq!(broker.fetch(Some("acme"), "f1").await.status, 410);
    assert_eq!(broker.delete(Some("acme"), "never").await.status, 204);

    let _: () = con.lpush("results:req:acme:bad", "not json").await.unwrap();
    let answer = broker.fetch(Some("acme"), "bad").await;
    assert_eq!(
        (answer.status, answer.json()["error"]["code"].as_str()),
        (500, Some("LOOKUP_FAILED"))
    );
}

#[tokio::test]
async fn a_fetch_grace_of_zero_deletes_the_delivered_result() {
    let config = BrokerConfig {
        fetch_grace_seconds: Some(0),
        ..BrokerConfig::default()
    };
    let (_server, broker, mut con) = setup(config).await;
    let _: () = con
        .lpush(
            "results:req:default:z",
            r#"{"id":"default:z","status_code":200,"payload":"{}"}"#,
        )
        .await
        .unwrap();
    assert_eq!(broker.fetch(None, "z").await.status, 200);
    let left: bool = con.exists("results:req:default:z").await.unwrap();
    assert!(!left);
}

#[test]
fn stored_results_map_to_status_and_body() {
    let cases = [
        (r#"{"id":"t:a","status_code":200,"payload":"{\"x\":1}"}"#, 200, "{\"x\":1}"),
        (r#"{"id":"t:a","status_code":503,"payload":"busy","error_code":"GATE_DROPPED"}"#, 503, "busy"),
        (r#"{"id":"t:a","payload":"","error_code":"GATE_DROPPED","error_message":"Pool gating dropped request"}"#, 429,
         "{\"error\":{\"message\":\"Pool gating dropped request\",\"type\":\"rate_limit_error\",\"code\":\"GATE_DROPPED\"}}\n"),
        (r#"{"id":"t:a","payload":"","error_code":"DEADLINE_EXCEEDED","error_message":"deadline exceeded"}"#, 504,
         "{\"error\":{\"message\":\"deadline exceeded\",\"type\":\"timeout_error\",\"code\":\"DEADLINE_EXCEEDED\"}}\n"),
        (r#"{"id":"t:a","payload":"","error_code":"INVALID_REQUEST","error_message":"bad <body>"}"#, 400,
         "{\"error\":{\"message\":\"bad \\u003cbody\\u003e\",\"type\":\"invalid_request_error\",\"code\":\"INVALID_REQUEST\"}}\n"),
        (r#"{"id":"t:a","payload":"","error_code":"CANCELLED","error_message":"cancelled"}"#, 499,
         "{\"error\":{\"message\":\"cancelled\",\"type\":\"cancelled\",\"code\":\"CANCELLED\"}}\n"),
        (r#"{"id":"t:a","payload":"","error_code":"INFERENCE_ERROR","error_message":"x"}"#, 502,
         "{\"error\":{\"message\":\"x\",\"type\":\"api_error\",\"code\":\"INFERENCE_ERROR\"}}\n"),
        (r#"{"id":"t:a","payload":""}"#, 502, "{\"error\":{\"message\":\"\",\"type\":\"api_error\"}}\n"),
    ];
    for (stored, status, body) in cases {
        let answer = answer_of(&StoredResult::parse(stored).unwrap());
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (status, body),
            "{stored}"
        );
    }
}

#[tokio::test]
async fn cancel_copies_the_active_token_for_seven_days() {
    let (_server, broker, mut con) = setup(BrokerConfig::default()).await;
    let headers = [
        ("x-ap-mode", "enqueue"),
        ("x-team", "acme"),
        ("x-request-id", "c1"),
    ];
    let (q, _) = queued(
        broker
            .post("/v1/completions", &headers, br#"{"model":"m"}"#)
            .await,
    );
    assert!(broker.cancel("acme", "c1").await.unwrap());
    let marker: String = con.get("request-cancel:acme:c1").await.unwrap();
    assert_eq!(marker, q.token);
    let ttl: i64 = con.ttl("request-cancel:acme:c1").await.unwrap();
    assert!((604_790..=604_800).contains(&ttl), "ttl {ttl}");
    assert!(!broker.cancel("acme", "never").await.unwrap());
    let none: bool = con.exists("request-cancel:acme:never").await.unwrap();
    assert!(!none);
}

/// `wait` in both wake-up modes: a result pushed once the request is queued is answered and its
/// mailbox deleted.
#[tokio::test]
async fn wait_answers_the_result_and_deletes_the_mailbox() {
    for mode in ["notify", "poll"] {
        let config = BrokerConfig {
            wakeup_mode: "auto".into(),
            ..BrokerConfig::default()
        };
        let server = RedisServer::start().unwrap();
        let mut con = server.connection().await.unwrap();
        if mode == "notify" {
            crate::config_set(&mut con, "notify-keyspace-events", "Kl")
                .await
                .unwrap();
        }
        let broker = RouterBroker::connect(&server.url(), config).await.unwrap();
        assert_eq!(broker.notify(), mode == "notify");
        let pusher = {
            let mut con = con.clone();
            tokio::spawn(async move {
                until("the queued request", || {
                    let mut con = con.clone();
                    async move { con.zcard::<_, i64>("request-sortedset").await.unwrap() == 1 }
                })
                .await;
                let _: () = con
                    .lpush(
                        "results:req:t:w1",
                        r#"{"id":"t:w1","status_code":200,"payload":"done"}"#,
                    )
                    .await
                    .unwrap();
            })
        };
        let headers = [
            ("x-ap-mode", "wait"),
            ("x-team", "t"),
            ("x-request-id", "w1"),
        ];
        let started = Instant::now();
        let (_, answer) = queued(
            broker
                .post("/v1/chat/completions", &headers, br#"{"model":"m"}"#)
                .await,
        );
        pusher.await.unwrap();
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (200, "done"),
            "{mode}"
        );
        assert_eq!(answer.header("x-request-id"), Some("w1"));
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{mode}: woke in {:?}",
            started.elapsed()
        );
        let left: bool = con.exists("results:req:t:w1").await.unwrap();
        assert!(!left, "{mode}: the delivered mailbox is deleted");
    }
}

#[tokio::test]
async fn wait_ends_at_the_cap_with_pending_and_at_the_deadline_with_504() {
    let config = BrokerConfig {
        wait_cap_seconds: 1,
        ..BrokerConfig::default()
    };
    let (_server, broker, _con) = setup(config).await;
    let headers = [("x-ap-mode", "wait"), ("x-request-id", "cap")];
    let (_, answer) = queued(
        broker
            .post("/v1/completions", &headers, br#"{"model":"m"}"#)
            .await,
    );
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (202, "{\"id\":\"cap\",\"status\":\"pending\"}\n")
    );
    assert_eq!(
        broker.fetch(None, "cap").await.status,
        202,
        "still fetchable"
    );

    let headers = [
        ("x-ap-mode", "wait"),
        ("x-request-id", "late"),
        ("x-request-timeout-seconds", "1"),
    ];
    let (_, answer) = queued(
        broker
            .post("/v1/completions", &headers, br#"{"model":"m"}"#)
            .await,
    );
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (504, "{\"error\":{\"message\":\"request deadline exceeded before a result was produced\",\"type\":\"timeout_error\",\"code\":\"DEADLINE_EXCEEDED\"}}\n")
    );
    assert_eq!(answer.header("x-request-id"), Some("late"));
}

#[test]
fn params_take_the_routers_defaults_and_refusals() {
    let config = BrokerConfig::from_params(json!({"redis_url": "redis://x"})).unwrap();
    assert_eq!(
        (
            config.mode_header.as_str(),
            config.tenant_header.as_str(),
            config.default_queue.as_str()
        ),
        ("X-AP-Mode", "X-Team", "request-sortedset")
    );
    assert_eq!(
        config.forward_headers.as_deref(),
        Some(
            &[
                "x-llm-d-slo-ttft-ms".to_owned(),
                "x-llm-d-slo-tpot-ms".to_owned()
            ][..]
        )
    );
    assert_eq!(config.fetch_grace(), Duration::from_secs(60));
    assert_eq!(config.bounds("wait").default_seconds, 60);
    for (params, reason) in [
        (json!({"wakeup_mode": "push"}), "wakeup_mode"),
        (json!({"fetch_grace_seconds": -1}), "fetch_grace_seconds"),
        (json!({"timeouts": {"stream": {}}}), "timeouts keys"),
        (
            json!({"timeouts": {"wait": {"default_seconds": 9, "max_seconds": 5}}}),
            "exceeds",
        ),
        (json!({"forward_headers": ["X-AP-Mode"]}), "forward_headers"),
        (json!({"no_such_param": 1}), "unknown field"),
    ] {
        let error = BrokerConfig::from_params(params.clone())
            .unwrap_err()
            .to_string();
        assert!(error.contains(reason), "{params}: {error}");
    }
}

/// A gateway that answers each request with its path and headers, as JSON.
async fn echo_gateway() -> (String, tokio::task::JoinHandle<()>) {
    use axum::http::{HeaderMap, Uri};
    let app = axum::Router::new().fallback(|uri: Uri, headers: HeaderMap| async move {
        let headers: serde_json::Map<String, serde_json::Value> = headers
            .iter()
            .map(|(n, v)| (n.as_str().to_owned(), json!(v.to_str().unwrap_or(""))))
            .collect();
        axum::Json(json!({"path": uri.path(), "headers": headers}))
    });
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", crate::free_port().unwrap()))
        .await
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

#[tokio::test]
async fn the_http_front_serves_the_step_and_sends_the_rest_to_the_gateway() {
    let config = BrokerConfig {
        routes: vec![BrokerRoute {
            model: "m".into(),
            tier: "gold".into(),
            ..BrokerRoute::default()
        }],
        objectives: [(
            "gold".to_owned(),
            ObjectivePair {
                reserved: "gold-r".into(),
                overflow: "gold-o".into(),
            },
        )]
        .into(),
        quota: QuotaConfig {
            limits: [("acme".to_owned(), 1)].into(),
            ..QuotaConfig::default()
        },
        ..BrokerConfig::default()
    };
    let (_server, broker, mut con) = setup(config).await;
    let (gateway, _gateway_task) = echo_gateway().await;
    let front = http::BrokerServer::start(broker, Some(gateway))
        .await
        .unwrap();
    let http = reqwest::Client::new();
    let post = |mode: Option<&str>| {
        let mut request = http
            .post(format!("{}/v1/chat/completions", front.url()))
            .header("x-team", "acme")
            .header("x-llm-d-inference-objective", "self-assigned")
            .body(r#"{"model":"m"}"#);
        if let Some(mode) = mode {
            request = request.header("x-ap-mode", mode);
        }
        request.send()
    };

    // The counter at the limit: overflow; then a reserved slot, given back after the answer.
    let _: () = con.set("quota:userid:acme", 1).await.unwrap();
    let seen: serde_json::Value = post(Some("passthrough"))
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap();
    assert_eq!(seen["path"], "/v1/chat/completions");
    assert_eq!(seen["headers"]["x-llm-d-inference-objective"], "gold-o");
    assert_eq!(seen["headers"]["x-llm-d-inference-fairness-id"], "acme");
    let _: () = con.set("quota:userid:acme", 0).await.unwrap();
    let seen: serde_json::Value = post(Some("passthrough"))
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap();
    assert_eq!(seen["headers"]["x-llm-d-inference-objective"], "gold-r");
    let counter: i64 = con.get("quota:userid:acme").await.unwrap();
    assert_eq!(counter, 0, "the reserved slot is released");
    let seen: serde_json::Value = post(None)
        .await
        .unwrap()
        .bytes()
        .await
        .map(|b| serde_json::from_slice(&b).unwrap())
        .unwrap();
    assert_eq!(
        seen["headers"]["x-llm-d-inference-objective"], "self-assigned",
        "untouched"
    );
    assert_eq!(seen["headers"].get("x-llm-d-inference-fairness-id"), None);

    let enqueued = post(Some("enqueue")).await.unwrap();
    assert_eq!(enqueued.status(), 202);
    let id = enqueued.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        enqueued.text().await.unwrap(),
        format!("{{\"id\":\"{id}\",\"status\":\"pending\"}}\n")
    );
    let url = format!("{}/v1/requests/{id}", front.url());
    let fetched = http
        .get(&url)
        .header("x-team", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 202);
    let deleted = http
        .delete(&url)
        .header("x-team", "acme")
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    let models = http
        .get(format!("{}/v1/models", front.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        models.text().await.unwrap(),
        "{\"data\":[{\"id\":\"m\",\"object\":\"model\",\"owned_by\":\"llm-d-async\"}],\"object\":\"list\"}\n"
    );
}

/// A `wait` client that goes away before its result cancels the request.
#[tokio::test]
async fn a_wait_client_that_disconnects_cancels_its_request() {
    use tokio::io::AsyncWriteExt;
    let (_server, broker, con) = setup(BrokerConfig::default()).await;
    let front = http::BrokerServer::start(broker, None).await.unwrap();
    let body = r#"{"model":"m"}"#;
    let mut socket = tokio::net::TcpStream::connect(front.addr()).await.unwrap();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-ap-mode: wait\r\nx-request-id: gone\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    socket.write_all(request.as_bytes()).await.unwrap();
    until("the queued request", || {
        let mut con = con.clone();
        async move { con.zcard::<_, i64>("request-sortedset").await.unwrap() == 1 }
    })
    .await;
    drop(socket);
    until("the cancel marker", || {
        let mut con = con.clone();
        async move {
            con.exists::<_, bool>("request-cancel:default:gone")
                .await
                .unwrap()
        }
    })
    .await;
    let marker: String = con
        .clone()
        .get("request-cancel:default:gone")
        .await
        .unwrap();
    let active: String = con
        .clone()
        .get("request-active:default:gone")
        .await
        .unwrap();
    assert_eq!(marker, active);
}
