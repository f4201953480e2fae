//! The Batch API driven by the official `openai` Python SDK (`tests/api/batch_sdk.py`) against
//! a real deployment with API keys: two replicas, one processor, Redis and the simulator.
//! The SDK comes from the venv `scripts/ensure-openai.sh` makes; `$INFERQ_PYTHON` names its
//! python (scripts/test.sh sets it). Without it the test fails, saying how to get it.

use crate::common::{Deployment, Fallible};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_runs_batches_end_to_end() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.keys(r#"{"sk-tenant-a-0123456789":"a","sk-tenant-b-0123456789":"b"}"#)?;
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    d.run_sdk(
        "batch_sdk.py",
        &[
            ("INFERQ_KEY_A", "sk-tenant-a-0123456789"),
            ("INFERQ_KEY_B", "sk-tenant-b-0123456789"),
        ],
    )
    .await
}
