//! The Batch API driven by the official `openai` Python SDK (`tests/api/batch_sdk.py`) against
//! a real deployment with API keys: two replicas, one processor, Redis and the simulator.
//! The SDK comes from the venv `scripts/ensure-openai.sh` makes; `$INFERQ_PYTHON` names its
//! python (scripts/test.sh sets it). Without it the test fails, saying how to get it.

use crate::common::{Deployment, Fallible};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_sdk_runs_batches_end_to_end() -> Fallible {
    let python = std::env::var("INFERQ_PYTHON").map_err(|_| {
        "INFERQ_PYTHON is not set: run scripts/test.sh, or `export INFERQ_PYTHON=$(scripts/ensure-openai.sh)`"
    })?;
    let mut d = Deployment::start(5).await?;
    let keys = d.dir.path().join("keys.json");
    std::fs::write(
        &keys,
        r#"{"sk-tenant-a-0123456789":"a","sk-tenant-b-0123456789":"b"}"#,
    )?;
    d.extra_flags = vec!["--api-keys-file".into(), keys.display().to_string()];
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api/batch_sdk.py");
    let out = tokio::process::Command::new(python)
        .arg(script)
        .env("INFERQ_BATCH_URLS", format!("{},{}", d.url(0), d.url(1)))
        .env("INFERQ_KEY_A", "sk-tenant-a-0123456789")
        .env("INFERQ_KEY_B", "sk-tenant-b-0123456789")
        .output()
        .await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the SDK checks failed:\n{stdout}\n{stderr}\n{}",
        d.logs()
    );
    assert!(stdout.contains("all SDK checks passed"), "{stdout}");
    Ok(())
}
