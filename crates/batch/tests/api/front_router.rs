//! The front door and the llm-d router's `async-broker` step over one Redis, both directions:
//! the step is the test kit's emulation ([`inferq_testkit::router_broker`], byte for byte from
//! the router's source), inferq's is a real `inferq batch-api`. A request enqueued through
//! either is fetched through the other, and both write the same member bytes for the same
//! request.

use std::time::Duration;

use inferq_testkit::router_broker::{BrokerConfig, RouterBroker, Served};
use redis::AsyncCommands;
use serde_json::{json, Value};

use crate::common::{until, Deployment, Fallible};
use crate::front::{get, post};

fn chat(content: &str) -> Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "<&> ".to_owned() + content}], "max_tokens": 4, "temperature": 0.5})
}

async fn router(d: &Deployment) -> Fallible<RouterBroker> {
    let config =
        BrokerConfig::from_params(json!({"redis_url": d.redis.url(), "default_queue": "batch-q"}))?;
    Ok(RouterBroker::connect(&d.redis.url(), config).await?)
}

/// `member` with its token, times and id replaced by placeholders.
fn normalized(member: &str, id: &str) -> Fallible<String> {
    let v: Value = serde_json::from_str(member)?;
    let token = v["internal"]["request_token"].as_str().unwrap_or_default();
    let created = v["data"]["created"].to_string();
    let deadline = v["data"]["deadline"].to_string();
    Ok(member
        .replace(token, "TOKEN")
        .replace(&format!("\"created\":{created}"), "\"created\":C")
        .replace(&format!("\"deadline\":{deadline}"), "\"deadline\":D")
        .replace(id, "ID"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inferq_and_the_routers_step_write_the_same_member_bytes() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.add_replica().await?;
    let step = router(&d).await?;
    let headers = [
        ("X-AP-Mode", "enqueue"),
        ("X-Team", "acme"),
        ("X-Request-Timeout-Seconds", "300"),
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
        ("x-llm-d-slo-ttft-ms", "120"),
    ];
    let body = chat("same");
    let mut theirs = headers.to_vec();
    theirs.push(("X-Request-Id", "from-router"));
    let served = step
        .post("/v1/chat/completions", &theirs, body.to_string().as_bytes())
        .await;
    let Served::Queued { queued, answer } = served else {
        return Err(format!("the step did not queue: {served:?}").into());
    };
    assert_eq!(answer.status, 202);
    let mut ours = headers.to_vec();
    ours.push(("X-Request-Id", "from-inferq"));
    let a = post(&format!("{}/chat/completions", d.url(0)), &ours, &body).await?;
    assert_eq!(a.status, 202, "{}", a.body);
    let mut con = d.redis.connection().await?;
    let members: Vec<String> = con.zrange("batch-q", 0, -1).await?;
    let mine = members
        .iter()
        .find(|m| m.contains("from-inferq"))
        .ok_or("inferq's member is missing")?;
    assert_eq!(
        normalized(mine, "from-inferq")?,
        normalized(&queued.member, "from-router")?,
        "the members differ"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_enqueued_through_the_routers_step_is_fetched_from_inferq() -> Fallible {
    let mut d = Deployment::start(300).await?;
    d.add_processor()?;
    d.add_replica().await?;
    let step = router(&d).await?;
    let served = step
        .post(
            "/v1/chat/completions",
            &[
                ("X-AP-Mode", "enqueue"),
                ("X-Team", "acme"),
                ("X-Request-Id", "via-router"),
            ],
            chat("there").to_string().as_bytes(),
        )
        .await;
    assert_eq!(served.answer().map(|a| a.status), Some(202), "{served:?}");
    let team = [("X-Team", "acme")];
    let url = format!("{}/requests/via-router", d.url(0));
    let (s, body) = get(&format!("{url}?wait=20"), &team).await?;
    assert_eq!(s, 200, "{body}\n{}", d.logs());
    assert_eq!(body["object"], "chat.completion", "{body}");
    // Fetched through inferq, the step reads it too (within the grace), and the same.
    let again = step.fetch(Some("acme"), "via-router").await;
    assert_eq!(again.status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&again.body)?, body);
    // Another tenant sees nothing on either side.
    let (s, _) = get(&url, &[("X-Team", "other")]).await?;
    assert_eq!(s, 410);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_enqueued_through_inferq_is_fetched_through_the_routers_step() -> Fallible {
    let mut d = Deployment::start(300).await?;
    d.add_processor()?;
    d.add_replica().await?;
    let step = router(&d).await?;
    let a = post(
        &format!("{}/chat/completions", d.url(0)),
        &[
            ("X-AP-Mode", "enqueue"),
            ("X-Team", "acme"),
            ("X-Request-Id", "via-inferq"),
        ],
        &chat("here"),
    )
    .await?;
    assert_eq!(a.status, 202, "{}", a.body);
    // Pending as the step reads it, then the model's answer.
    let first = step.fetch(Some("acme"), "via-inferq").await;
    assert!(matches!(first.status, 200 | 202), "{first:?}");
    let body = until(
        "the step fetching the answer",
        Duration::from_secs(20),
        Duration::from_millis(100),
        async || {
            let got = step.fetch(Some("acme"), "via-inferq").await;
            Ok((got.status == 200).then_some(got.body))
        },
    )
    .await?;
    let body: Value = serde_json::from_slice(&body)?;
    assert_eq!(body["object"], "chat.completion", "{body}");
    // inferq reads the same answer (the step's fetch left it for the grace).
    let (s, mine) = get(
        &format!("{}/requests/via-inferq", d.url(0)),
        &[("X-Team", "acme")],
    )
    .await?;
    assert_eq!((s, &mine), (200, &body));
    Ok(())
}
