//! The front door driven by the official `openai` Python SDK (`tests/api/front_sdk.py`):
//! wait, `stream: true`, and enqueue + GET, against a real deployment with API keys (two
//! replicas, one processor, Redis and the simulator). The SDK comes from the venv
//! `scripts/ensure-openai.sh` makes; `$INFERQ_PYTHON` names its python (scripts/test.sh sets
//! it). Without it the test fails, saying how to get it.

use crate::common::{Deployment, Fallible};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_waits_streams_and_enqueues_single_requests() -> Fallible {
    let mut d = Deployment::start(300).await?;
    d.keys(r#"{"sk-tenant-a-0123456789":"a"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    d.run_sdk(
        "front_sdk.py",
        &[("INFERQ_KEY_A", "sk-tenant-a-0123456789")],
    )
    .await
}

/// The SDK's default retries at a passed deadline (issue 44): the front door answers 504 and
/// the `openai` SDK (max_retries=2) tries twice more. With an `Idempotency-Key` every retry
/// joins the same request, so the gateway runs it once; without one each retry is a new
/// request, which is why the book's SDK examples pass a key (or max_retries=0 to wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sdk_retries_at_a_passed_deadline_run_the_work_once_with_an_idempotency_key() -> Fallible {
    let mut d = Deployment::start(3000).await?;
    d.keys(r#"{"sk-tenant-a-0123456789":"a"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let key = ("INFERQ_KEY_A", "sk-tenant-a-0123456789");
    let out = d
        .sdk_output("retry_sdk.py", &[key, ("INFERQ_CASE", "keyed")])
        .await?;
    // Whatever the processor still had in hand has reached the gateway by now.
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert_eq!(d.sim.total_requests(), 1, "{out}\n{}", d.logs());
    let out = d
        .sdk_output("retry_sdk.py", &[key, ("INFERQ_CASE", "unkeyed")])
        .await?;
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    assert!(
        d.sim.total_requests() >= 3,
        "without a key each retry is new work: {} runs\n{out}",
        d.sim.total_requests()
    );
    Ok(())
}
