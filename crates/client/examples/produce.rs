//! A Rust producer with nothing but `inferq-client`: submits one chat request to the queue
//! `request-sortedset` and waits up to a minute for its result on `result-list`, the queues a
//! default `inferq run` (or the Go processor) serves.
//!
//!     cargo run -p inferq-client --example produce -- redis://127.0.0.1:6379/

use std::time::Duration;

use inferq_client::{NewRequest, Producer};
use serde_json::value::RawValue;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "redis://127.0.0.1:6379/".to_owned());
    let producer = Producer::connect(&url, "request-sortedset", "result-list").await?;
    let now = inferq_client::producer::unix_ms() / 1000;
    let body = r#"{"model":"m","messages":[{"role":"user","content":"Say hello."}]}"#;
    let submitted = producer
        .submit(
            NewRequest::new(
                format!("hello-{now}"),
                now + 3600,
                RawValue::from_string(body.to_owned())?,
            )
            .with_created(now),
        )
        .await?;
    println!(
        "submitted {} (generation {})",
        submitted.id, submitted.request_token
    );
    match producer.pop_result(Duration::from_secs(60)).await? {
        Some(result) => println!("{}", result.to_json()),
        None => println!("no result within a minute: is a processor running?"),
    }
    Ok(())
}
