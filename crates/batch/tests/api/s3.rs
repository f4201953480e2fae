//! The Batch API on S3-compatible storage (`--files-url s3://bucket/prefix`): a batch end to end
//! through two replicas whose files live in a bucket of a real S3 server, moto's (`moto_server`,
//! installed from PyPI beside the openai SDK by `scripts/ensure-openai.sh`, found next to
//! `$INFERQ_PYTHON`). Checked: the objects are under the prefix, a replica that did not take the
//! upload serves the output, and a deleted file's object is gone.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::common::{
    chat_lines, create, lines_per_id, until, upload, wait_ended, Deployment, Fallible,
};
use inferq_testkit::free_port;

struct Moto(Child);

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn moto_server() -> Fallible<std::path::PathBuf> {
    let python = std::env::var("INFERQ_PYTHON").map_err(|_| {
        "INFERQ_PYTHON is not set: run scripts/test.sh, or `export INFERQ_PYTHON=$(scripts/ensure-openai.sh)`"
    })?;
    let bin = std::path::Path::new(&python).with_file_name("moto_server");
    if !bin.is_file() {
        return Err(format!("{} not found: run scripts/ensure-openai.sh", bin.display()).into());
    }
    Ok(bin)
}

async fn bucket_keys(endpoint: &str) -> Fallible<Vec<String>> {
    let xml = reqwest::get(format!("{endpoint}/inferq-files?list-type=2"))
        .await?
        .text()
        .await?;
    Ok(xml
        .split("<Key>")
        .skip(1)
        .filter_map(|k| k.split("</Key>").next())
        .map(str::to_owned)
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_run_on_s3_compatible_storage() -> Fallible {
    let port = free_port()?;
    let dir = tempfile::tempdir()?;
    let _moto = Moto(
        Command::new(moto_server()?)
            .args(["-p", &port.to_string()])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let endpoint = format!("http://127.0.0.1:{port}");
    let bucket = format!("{endpoint}/inferq-files");
    until(
        "moto_server making the bucket",
        Duration::from_secs(30),
        Duration::from_millis(100),
        async || {
            let made = reqwest::Client::new().put(&bucket).send().await;
            Ok(made.is_ok_and(|r| r.status().is_success()).then_some(()))
        },
    )
    .await?;
    let mut d = Deployment::start(5).await?;
    d.store_flags = Some(vec![
        "--files-url".into(),
        "s3://inferq-files/batches".into(),
    ]);
    d.replica_env = [
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_REGION", "us-east-1"),
        ("AWS_ENDPOINT", endpoint.as_str()),
        ("AWS_ALLOW_HTTP", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    d.add_processor()?;
    d.add_replica().await?;
    d.add_replica().await?;
    let file = upload(&d.url(0), chat_lines(60)).await?;
    let file_id = file["id"].as_str().unwrap_or_default().to_owned();
    let batch = create(&d.url(0), &file_id, "24h").await?;
    let id = batch["id"].as_str().unwrap_or_default();
    let ended = wait_ended(&[d.url(1)], id, Duration::from_secs(60))
        .await
        .map_err(|e| format!("{e}\n{}", d.logs()))?;
    assert_eq!(ended["status"], "completed", "{ended}");
    let seen = lines_per_id(&d.url(1), &ended).await?;
    assert_eq!(seen.len(), 60);
    assert!(seen.values().all(|n| *n == 1));
    let keys = bucket_keys(&endpoint).await?;
    let out = ended["output_file_id"].as_str().unwrap_or_default();
    assert!(
        keys.contains(&format!("batches/files/{file_id}")),
        "{keys:?}"
    );
    assert!(keys.contains(&format!("batches/files/{out}")), "{keys:?}");
    let r = reqwest::Client::new()
        .delete(format!("{}/files/{file_id}", d.url(1)))
        .send()
        .await?;
    assert!(r.status().is_success());
    assert!(!bucket_keys(&endpoint)
        .await?
        .contains(&format!("batches/files/{file_id}")));
    Ok(())
}
