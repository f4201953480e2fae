//! A Go processor serves inferq's front door. No Go toolchain can build llm-d-async here (its
//! `go.mod` asks for Go 1.26, Debian has 1.19 and the module proxy is out of reach), so the
//! processor is played by [`GoProcessor`]: llm-d-async v0.9's moves on the router's layout as
//! `go-compat.md` gives them — `ZPOPMIN` (§3.4), the cancel check against the member's own
//! token (§2.5), one POST of the payload to `igw_base_url` + `endpoint` with the member's
//! headers (§5.1), one `LPUSH` of Go's `ResultMessage` to the member's `result_queue_name`
//! (§2.4, §3.6), and the cleanup of the markers that still hold its token (§3.7). No inferq
//! processor runs in these tests: whatever answers the client came through the Go moves.

use std::time::Duration;

use redis::AsyncCommands;
use serde::Serialize;
use serde_json::{json, Value};

use crate::common::{until, Deployment, Fallible};
use crate::front::{get, post};

/// Go's `api.ResultMessage`, its fields in Go's order with Go's `omitempty`.
#[derive(Serialize)]
struct GoResult<'a> {
    id: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    status_code: Option<u16>,
    payload: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_code: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_message: Option<&'a str>,
}

/// What one pop did.
#[derive(Debug, PartialEq)]
enum Served {
    Nothing,
    Sent(String),
    Cancelled(String),
}

/// The Go processor's moves on one queue, one member at a time.
struct GoProcessor {
    con: redis::aio::MultiplexedConnection,
    gateway: String,
    http: reqwest::Client,
}

impl GoProcessor {
    async fn connect(d: &Deployment) -> Fallible<GoProcessor> {
        Ok(GoProcessor {
            con: d.redis.connection().await?,
            gateway: d.sim.base_url(),
            http: reqwest::Client::new(),
        })
    }

    /// Pops the lowest member of `queue` and serves it as Go's worker does.
    async fn serve_one(&mut self, queue: &str) -> Fallible<Served> {
        let popped: Vec<(String, f64)> = self.con.zpopmin(queue, 1).await?;
        let Some((member, _)) = popped.into_iter().next() else {
            return Ok(Served::Nothing);
        };
        let m: Value = serde_json::from_str(&member)?;
        let data = &m["data"];
        let id = data["id"].as_str().ok_or("the member has no data.id")?;
        let token = m["internal"]["request_token"].as_str().unwrap_or_default();
        let mailbox = m["internal"]["result_queue_name"]
            .as_str()
            .ok_or("the member names no result_queue_name")?;
        let deadline = data["deadline"].as_i64().filter(|d| *d > 0);
        assert!(
            deadline.is_some(),
            "Go discards a member without a deadline: {member}"
        );
        let cancelled: Option<String> = self.con.get(format!("request-cancel:{id}")).await?;
        let (result, served) = if !token.is_empty() && cancelled.as_deref() == Some(token) {
            let r = GoResult {
                id,
                status_code: None,
                payload: r#"{"error":"cancelled"}"#.to_owned(),
                error_code: Some("CANCELLED"),
                error_message: Some("cancelled"),
            };
            (r, Served::Cancelled(id.to_owned()))
        } else {
            let path = data["endpoint"]
                .as_str()
                .filter(|e| !e.is_empty())
                .unwrap_or("/v1/completions");
            let mut request = self
                .http
                .post(format!("{}{path}", self.gateway.trim_end_matches('/')))
                .header("Content-Type", "application/json");
            for (k, v) in data["headers"].as_object().into_iter().flatten() {
                request = request.header(k, v.as_str().unwrap_or_default());
            }
            let answer = request.body(data["payload"].to_string()).send().await?;
            let status = answer.status().as_u16();
            let r = GoResult {
                id,
                status_code: Some(status),
                payload: answer.text().await?,
                error_code: None,
                error_message: None,
            };
            (r, Served::Sent(id.to_owned()))
        };
        // Go's encoder escapes <, > and & inside strings.
        let bytes = serde_json::to_string(&result)?
            .replace('<', "\\u003c")
            .replace('>', "\\u003e")
            .replace('&', "\\u0026");
        let _: () = self.con.lpush(mailbox, bytes).await?;
        // The cleanup script: each marker goes only while it still holds this token.
        for key in [
            format!("request-active:{id}"),
            format!("request-cancel:{id}"),
        ] {
            let held: Option<String> = self.con.get(&key).await?;
            if held.as_deref() == Some(token) {
                let _: () = self.con.del(&key).await?;
            }
        }
        Ok(served)
    }
}

/// Redis, the simulator and one `inferq batch-api` replica, with no inferq processor: the Go
/// side is the only one taking requests.
async fn go_deployment() -> Fallible<(Deployment, GoProcessor)> {
    let mut d = Deployment::start(5).await?;
    d.add_replica().await?;
    let go = GoProcessor::connect(&d).await?;
    Ok((d, go))
}

fn chat(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": format!("<&> {content}")}], "max_tokens": 4})
}

/// Waits and fetches through inferq's front door are answered by the Go processor's moves:
/// a held wait gets the model's answer, an enqueued request is fetched, and each request's
/// marker is gone afterwards, cleared by the Go side's cleanup with the token inferq wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_go_processor_serves_inferqs_waits_and_fetches() -> Fallible {
    let (d, mut go) = go_deployment().await?;
    let stop = tokio_util::sync::CancellationToken::new();
    let served = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut served = Vec::new();
            while !stop.is_cancelled() {
                match go.serve_one("batch-q").await? {
                    Served::Nothing => tokio::time::sleep(Duration::from_millis(20)).await,
                    s => served.push(s),
                }
            }
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(served)
        })
    };
    let url = format!("{}/chat/completions", d.url(0));
    let team = ("X-Team", "acme");
    let waited = post(&url, &[("X-AP-Mode", "wait"), team], &chat("held")).await?;
    assert_eq!(waited.status, 200, "{}\n{}", waited.body, d.logs());
    assert_eq!(waited.body["object"], "chat.completion", "{}", waited.body);
    let queued = post(
        &url,
        &[("X-AP-Mode", "enqueue"), team, ("X-Request-Id", "go-1")],
        &chat("queued"),
    )
    .await?;
    assert_eq!(queued.status, 202, "{}", queued.body);
    let (s, fetched) = get(&format!("{}/requests/go-1?wait=20", d.url(0)), &[team]).await?;
    assert_eq!(s, 200, "{fetched}\n{}", d.logs());
    assert_eq!(fetched["object"], "chat.completion", "{fetched}");
    stop.cancel();
    let served = served.await??;
    let waited_id = format!("acme:{}", waited.id());
    assert_eq!(
        served,
        vec![
            Served::Sent(waited_id.clone()),
            Served::Sent("acme:go-1".into())
        ]
    );
    let mut con = d.redis.connection().await?;
    for id in [waited_id.as_str(), "acme:go-1"] {
        let active: bool = con.exists(format!("request-active:{id}")).await?;
        assert!(!active, "{id}'s marker outlived its result");
    }
    Ok(())
}

/// A `DELETE` through inferq writes the cancel marker a Go processor honours: the member is
/// answered `CANCELLED` without reaching the gateway, and inferq answers that result 499.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_inferq_is_honoured_by_a_go_processor() -> Fallible {
    let (d, mut go) = go_deployment().await?;
    let team = ("X-Team", "acme");
    let queued = post(
        &format!("{}/chat/completions", d.url(0)),
        &[("X-AP-Mode", "enqueue"), team, ("X-Request-Id", "go-2")],
        &chat("never"),
    )
    .await?;
    assert_eq!(queued.status, 202, "{}", queued.body);
    let url = format!("{}/requests/go-2", d.url(0));
    let deleted = reqwest::Client::new()
        .delete(&url)
        .header(team.0, team.1)
        .send()
        .await?;
    assert_eq!(deleted.status().as_u16(), 204);
    assert_eq!(
        go.serve_one("batch-q").await?,
        Served::Cancelled("acme:go-2".into())
    );
    let (s, body) = until(
        "inferq answering the Go processor's CANCELLED",
        Duration::from_secs(10),
        Duration::from_millis(50),
        async || {
            let (s, body) = get(&url, &[team]).await?;
            Ok((s != 202).then_some((s, body)))
        },
    )
    .await?;
    assert_eq!(s, 499, "{body}");
    assert_eq!(body["error"]["code"], "CANCELLED", "{body}");
    Ok(())
}

/// The Go side's `LPUSH` is what wakes a held wait: the answer follows the push within
/// milliseconds (a keyspace notification), not at the wait's own 2 s re-read. Each wait has
/// been parked for 300 ms when its result is pushed; the median of five answers is asserted,
/// against a bound of half the re-read period.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_sides_push_wakes_a_held_wait_at_once() -> Fallible {
    let (d, mut go) = go_deployment().await?;
    let mut con = d.redis.connection().await?;
    let url = format!("{}/chat/completions", d.url(0));
    let mut after_push = Vec::new();
    for i in 0..5 {
        let id = format!("go-wake-{i}");
        let waiting = {
            let (url, id) = (url.clone(), id.clone());
            tokio::spawn(async move {
                let headers = [
                    ("X-AP-Mode", "wait"),
                    ("X-Team", "acme"),
                    ("X-Request-Id", &id),
                ];
                let a = post(&url, &headers, &chat("woken")).await;
                (a, std::time::Instant::now())
            })
        };
        let marker = format!("request-active:acme:{id}");
        until(
            "the wait's request queued",
            Duration::from_secs(10),
            Duration::from_millis(10),
            async || Ok(con.exists::<_, bool>(&marker).await?.then_some(())),
        )
        .await?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let pushed = std::time::Instant::now();
        assert_eq!(
            go.serve_one("batch-q").await?,
            Served::Sent(format!("acme:{id}"))
        );
        let (answer, at) = waiting.await?;
        let answer = answer?;
        assert_eq!(answer.status, 200, "{}", answer.body);
        after_push.push(at.saturating_duration_since(pushed));
    }
    after_push.sort();
    assert!(
        after_push[2] < Duration::from_secs(1),
        "answers came {after_push:?} after the push"
    );
    Ok(())
}
