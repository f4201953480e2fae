//! The Batch API at the HTTP level: OpenAI's error shape and codes for bad calls, uploads
//! refused while they stream (over the size limit, a line over its limit, not JSONL, not
//! UTF-8, not multipart), ids with path tricks, keys (401, never logged), the refusal to serve
//! open on a non-loopback address, and the metrics a completed batch leaves.

use std::process::Command;
use std::time::Duration;

use crate::common::{
    assert_openai_error, chat_lines, start_batch, until, wait_ended, Deployment, Fallible,
};
use inferq_testkit::inferq_binary;
use serde_json::Value;

const KEY: &str = "sk-http-test-0123456789";

/// Asserts OpenAI's error shape and the status; the error object.
async fn error_of(r: reqwest::Response, status: u16) -> Fallible<Value> {
    assert_eq!(r.status().as_u16(), status);
    let v: Value = r.json().await?;
    assert_openai_error(&v);
    Ok(v["error"].clone())
}

fn form(text: Vec<u8>) -> reqwest::multipart::Form {
    reqwest::multipart::Form::new()
        .text("purpose", "batch")
        .part(
            "file",
            reqwest::multipart::Part::bytes(text).file_name("in.jsonl"),
        )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_get_openai_errors_and_leave_nothing_behind() -> Fallible {
    let mut d = Deployment::start(5).await?;
    let keys = d.dir.path().join("keys.json");
    std::fs::write(&keys, format!(r#"{{"{KEY}":"t1"}}"#))?;
    d.extra_flags = vec![
        "--api-keys-file".into(),
        keys.display().to_string(),
        "--max-file-bytes".into(),
        "20000".into(),
        "--max-line-bytes".into(),
        "4000".into(),
    ];
    d.add_replica().await?;
    let base = d.url(0);
    let c = reqwest::Client::new();
    let auth = format!("Bearer {KEY}");

    let e = error_of(c.get(format!("{base}/batches")).send().await?, 401).await?;
    assert_eq!(e["code"], "invalid_api_key");
    let e = error_of(
        c.get(format!("{base}/files"))
            .bearer_auth("sk-http-test-0123456788")
            .send()
            .await?,
        401,
    )
    .await?;
    assert_eq!(e["code"], "invalid_api_key");

    // Over the file limit: refused while it streams.
    let big = chat_lines(600).into_bytes();
    assert!(big.len() > 40_000);
    let e = error_of(
        c.post(format!("{base}/files"))
            .header("authorization", &auth)
            .multipart(form(big))
            .send()
            .await?,
        413,
    )
    .await?;
    assert_eq!(e["code"], "file_too_large");
    // A line over the line limit.
    let long = format!("{{\"custom_id\":\"a\",\"pad\":\"{}\"}}\n", "x".repeat(5000));
    let e = error_of(
        c.post(format!("{base}/files"))
            .header("authorization", &auth)
            .multipart(form(long.into_bytes()))
            .send()
            .await?,
        413,
    )
    .await?;
    assert_eq!(e["code"], "line_too_large");
    // Not JSONL, not UTF-8, empty.
    for (body, code) in [
        (b"{\"a\":1}\nnot json\n".to_vec(), "invalid_file_format"),
        (b"{\"a\":\"\xff\xfe\"}\n".to_vec(), "invalid_file_format"),
        (b"[1]\n".to_vec(), "invalid_file_format"),
        (b"\n\n".to_vec(), "empty_file"),
    ] {
        let e = error_of(
            c.post(format!("{base}/files"))
                .header("authorization", &auth)
                .multipart(form(body))
                .send()
                .await?,
            400,
        )
        .await?;
        assert_eq!(e["code"], code);
    }
    // Not multipart, and broken multipart.
    error_of(
        c.post(format!("{base}/files"))
            .header("authorization", &auth)
            .body("hello")
            .send()
            .await?,
        400,
    )
    .await?;
    error_of(
        c.post(format!("{base}/files"))
            .header("authorization", &auth)
            .header("content-type", "multipart/form-data; boundary=XYZ")
            .body("--XYZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\n{\"a\":1}\n")
            .send()
            .await?,
        400,
    )
    .await?;
    // Nothing of any refused upload was kept.
    let kept = std::fs::read_dir(d.files_dir().join("files"))
        .map(|e| e.count())
        .unwrap_or(0);
    assert_eq!(kept, 0, "refused uploads left objects");
    let listed: Value = c
        .get(format!("{base}/files"))
        .header("authorization", &auth)
        .send()
        .await?
        .json()
        .await?;
    assert_eq!(listed["data"], serde_json::json!([]));

    // Ids with path tricks, unknown routes, wrong methods, bad bodies.
    for path in [
        "files/..%2F..%2Fetc%2Fpasswd",
        "files/file-..",
        "files/file-a%2F..%2Fb/content",
        "batches/batch_..%2Fx",
    ] {
        error_of(
            c.get(format!("{base}/{path}"))
                .header("authorization", &auth)
                .send()
                .await?,
            404,
        )
        .await?;
    }
    error_of(c.get(format!("{base}/nothing-here")).send().await?, 404).await?;
    error_of(
        c.put(format!("{base}/batches"))
            .header("authorization", &auth)
            .send()
            .await?,
        405,
    )
    .await?;
    let e = error_of(
        c.post(format!("{base}/batches"))
            .header("authorization", &auth)
            .body("{not json")
            .send()
            .await?,
        400,
    )
    .await?;
    assert!(e["message"].as_str().is_some_and(|m| m.contains("JSON")));
    let e = error_of(c.post(format!("{base}/batches")).header("authorization", &auth).json(&serde_json::json!({"endpoint": "/v1/chat/completions", "completion_window": "24h"})).send().await?, 400).await?;
    assert_eq!(e["param"], "input_file_id");
    let e = error_of(
        c.get(format!("{base}/batches?limit=0"))
            .header("authorization", &auth)
            .send()
            .await?,
        400,
    )
    .await?;
    assert_eq!(e["param"], "limit");

    // The key was never written to a log.
    let logs = d.logs();
    assert!(!logs.contains(KEY), "a key reached the logs");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_batch_shows_in_the_metrics() -> Fallible {
    let mut d = Deployment::start(5).await?;
    d.add_processor()?;
    let port = d.add_replica().await?;
    let base = d.url(0);
    let id = start_batch(&base, 25).await?;
    wait_ended(std::slice::from_ref(&base), &id, Duration::from_secs(30)).await?;
    let wanted = [
        "inferq_batch_batches{status=\"completed\"} 1",
        "inferq_batch_lines_ingested_total 25",
        "inferq_batch_results_filed_total 25",
        "inferq_batch_lines_written_total{file=\"output\"} 25",
        "inferq_batch_finalize_seconds_count 1",
    ];
    // The batches gauge follows a census: wait for the page to show what is asserted (or give
    // it as it is after 10 s, for the assertion to show).
    let page = || async {
        let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
            .await?
            .text()
            .await?;
        Fallible::Ok(text)
    };
    let text = match until(
        "the completed batch on the metrics page",
        Duration::from_secs(10),
        Duration::from_millis(100),
        async || {
            let text = page().await?;
            Ok(wanted.iter().all(|w| text.contains(w)).then_some(text))
        },
    )
    .await
    {
        Ok(text) => text,
        Err(_) => page().await?,
    };
    for want in wanted {
        assert!(text.contains(want), "missing {want:?} in\n{text}");
    }
    // `inferq status --batches` counts it too.
    let out = Command::new(inferq_binary()?)
        .args([
            "status",
            "--redis-url",
            &d.redis.url(),
            "--queue",
            "batch-q",
            "--batches",
            "--json",
        ])
        .output()?;
    let first = String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let census: Value = serde_json::from_str(&first)?;
    assert_eq!(census["by_status"]["completed"], 1, "{first}");
    assert_eq!(census["live"], serde_json::json!([]), "{first}");
    Ok(())
}

#[test]
fn bad_settings_exit_2_naming_the_field() -> Fallible {
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("t.json");
    std::fs::write(
        &config,
        r#"{"url":"redis://127.0.0.1:1","queues":[{"queue_name":"q","igw_base_url":"http://127.0.0.1:1"},{"id":"own","queue_name":"q2","result_queue_name":"mine","igw_base_url":"http://127.0.0.1:1"}]}"#,
    )?;
    let run = |extra: &[&str]| -> Fallible<(i32, String)> {
        let out = Command::new(inferq_binary()?)
            .args(["batch-api", "--transport-config-file"])
            .arg(&config)
            .args(["--files-dir"])
            .arg(dir.path().join("files"))
            .args(extra)
            .output()?;
        Ok((
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    };
    let (code, err) = run(&["--listen", "0.0.0.0:0"])?;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--listen") && err.contains("--api-keys-file"),
        "{err}"
    );
    let (code, err) = run(&["--queue", "own"])?;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("result_queue_name"), "{err}");
    let (code, err) = run(&["--queue", "nope"])?;
    assert_eq!((code, err.contains("--queue")), (2, true), "{err}");
    let (code, err) = run(&["--allow-completion-window", "soon"])?;
    assert_eq!(
        (code, err.contains("--allow-completion-window")),
        (2, true),
        "{err}"
    );
    let keys = dir.path().join("keys.json");
    std::fs::write(&keys, r#"{"short":"t"}"#)?;
    let (code, err) = run(&["--api-keys-file", &keys.display().to_string()])?;
    assert_eq!((code, err.contains("--api-keys-file")), (2, true), "{err}");
    std::fs::write(
        &keys,
        r#"{"sk-aaaaaaaaaaaaaaaa":{"tenant":"a","weight":0}}"#,
    )?;
    let (code, err) = run(&["--api-keys-file", &keys.display().to_string()])?;
    assert_eq!(
        (
            code,
            err.contains("--api-keys-file") && err.contains("weight")
        ),
        (2, true),
        "{err}"
    );
    // The front door: a redis-pubsub transport, and broker configs that cannot work.
    let (code, err) = run(&["--transport", "redis-pubsub"])?;
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--transport") && err.contains("never collected"),
        "{err}"
    );
    let broker = dir.path().join("broker.yaml");
    let broker_arg = broker.display().to_string();
    for (text, says) in [
        ("wakeup_mode: sometimes\n", "wakeup_mode"),
        ("rooutes: []\n", "rooutes"),
        (
            "timeouts: {wait: {default_seconds: 9, max_seconds: 5}}\n",
            "timeouts.wait",
        ),
        (
            "default_queue: q\nroutes: [{model: m, queue: q2}]\n",
            "result_queue_name",
        ),
        (
            "routes: [{model: m, queue: nope}]\n",
            "\"request-sortedset\"",
        ),
    ] {
        std::fs::write(&broker, text)?;
        let (code, err) = run(&["--broker-config", &broker_arg])?;
        assert_eq!(code, 2, "{text}: {err}");
        assert!(
            err.contains("--broker-config") && err.contains(says),
            "{text}: {err}"
        );
    }
    for (flag, value) in [
        ("--max-waiting-clients", "0"),
        // Limits and retention.
        ("--max-enqueued-lines", "0"),
        ("--file-retention", "0s"),
        ("--batch-retention", "500ms"),
        ("--min-expires-after", "40days"),
        ("--sweep-interval", "0s"),
        ("--orphan-grace", "0s"),
    ] {
        let (code, err) = run(&[flag, value])?;
        assert_eq!(
            (code, err.contains(flag)),
            (2, true),
            "{flag} {value}: {err}"
        );
    }
    Ok(())
}
