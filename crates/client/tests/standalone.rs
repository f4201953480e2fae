//! `inferq-client` on its own, as a Rust producer uses it: against a real `redis-server` (started
//! on a free port by the test kit), with no processor crate linked. A submitted request lands in
//! the sorted set with its body byte for byte and its deadline as score; a result a processor
//! pushed comes back to `pop_result`; a cancel marks the generation.

use std::time::Duration;

use inferq_client::wire::{Envelope, ResultMessage};
use inferq_client::{NewRequest, Producer};
use inferq_testkit::RedisServer;
use redis::AsyncCommands;
use serde_json::value::RawValue;

fn request(id: &str, deadline: i64, body: &str) -> NewRequest {
    NewRequest::new(
        id.to_owned(),
        deadline,
        RawValue::from_string(body.to_owned()).unwrap(),
    )
    .with_created(deadline - 60)
}

#[tokio::test]
async fn a_producer_submits_takes_results_and_cancels() {
    let redis = RedisServer::start().unwrap();
    let producer = Producer::connect(&redis.url(), "request-sortedset", "result-list")
        .await
        .unwrap();
    let deadline = inferq_client::producer::unix_ms() / 1000 + 600;
    // Spacing and a big integer serde would not write back the same way.
    let body = r#"{ "model":"m", "n": 123456789012345678901234567890 }"#;
    let submitted = producer.submit(request("a", deadline, body)).await.unwrap();
    assert_eq!(submitted.enqueue_seq, 1);

    let mut con = redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let members: Vec<(Vec<u8>, f64)> = con
        .zrange_withscores("request-sortedset", 0, -1)
        .await
        .unwrap();
    assert_eq!(members.len(), 1);
    let envelope = Envelope::decode(&members[0].0).unwrap();
    assert_eq!(
        envelope.request.payload.get(),
        body,
        "the body, byte for byte"
    );
    assert_eq!(members[0].1.floor() as i64, deadline, "scored by deadline");

    let pushed = ResultMessage::http("a", 200, br#"{"ok":true}"#);
    let _: () = con.lpush("result-list", pushed.to_json()).await.unwrap();
    let got = producer
        .pop_result(Duration::from_secs(5))
        .await
        .unwrap()
        .expect("the pushed result");
    assert_eq!(got.id, "a");
    assert_eq!(got.to_json(), pushed.to_json());

    assert_eq!(producer.cancel(&["a".to_owned()]).await.unwrap(), [true]);
    let cancelled: Option<String> = con.get("request-cancel:a").await.unwrap();
    assert_eq!(cancelled.as_deref(), Some(submitted.request_token.as_str()));
}
