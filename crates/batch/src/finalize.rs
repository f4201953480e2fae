//! Writing a sealed batch's output and error files. The input file is read again, a thousand
//! lines at a time; each line's filed result is fetched (one `HMGET` per thousand) and turned
//! into OpenAI's output line: a 2xx answer goes to the output file, any other answer (with its
//! response) and any failure without one (with `error{code, message}`) to the error file, and a
//! line with no result gets `batch_expired` or `batch_cancelled`. So every `custom_id` gets
//! exactly one line. Both files stream to the store under fresh ids; `finish-10.lua` records the
//! first steward's files (each expiring after the batch's `output_expires_after`, else
//! `--file-retention`) and ending, and a later steward deletes what it wrote. With
//! `replica_wait` the steward waits for the replicas to hold the ending before it moves on.

use inferq_client::wire::ResultMessage;
use serde::Serialize;
use serde_json::value::RawValue;

use crate::durable::Replicated;
use crate::error::BatchError;
use crate::ids;
use crate::keys;
use crate::lines::{decode_line, is_blank, LineSplitter, SplitError};
use crate::metrics::FileLabel;
use crate::model::Fields;
use crate::scripts::SCRIPTS;
use crate::state::App;
use crate::store::Writer;

const CHUNK: usize = 1000;

#[derive(Serialize)]
struct Response<'a> {
    status_code: u16,
    request_id: &'a str,
    body: &'a RawValue,
}

#[derive(Serialize)]
struct LineError<'a> {
    code: &'a str,
    message: &'a str,
}

#[derive(Serialize)]
struct OutputLine<'a> {
    id: String,
    custom_id: &'a str,
    response: Option<Response<'a>>,
    error: Option<LineError<'a>>,
}

/// OpenAI's code for a failure without an HTTP answer.
fn error_code(code: &str) -> String {
    match code {
        "DEADLINE_EXCEEDED" => "batch_expired".to_owned(),
        "CANCELLED" => "batch_cancelled".to_owned(),
        other => other.to_ascii_lowercase(),
    }
}

/// One line's record, and whether it belongs in the output file (else the error file).
pub fn render(
    batch: &str,
    line: u64,
    custom_id: &str,
    result: Option<&str>,
    ending: &str,
) -> (bool, String) {
    let id = ids::output_line_id(batch, line);
    let parsed = result.and_then(|r| serde_json::from_str::<ResultMessage>(r).ok());
    match &parsed {
        Some(r) if r.status_code != 0 => answered(id, custom_id, r),
        Some(r) => {
            let code = error_code(&r.error_code);
            let message = if r.error_message.is_empty() {
                r.payload.as_str()
            } else {
                r.error_message.as_str()
            };
            (false, failed(id, custom_id, &code, message))
        }
        None => {
            let (code, message) = match (ending, result) {
                (_, Some(_)) => (
                    "invalid_result",
                    "The processor's result for this request could not be read.",
                ),
                ("cancelled", None) => (
                    "batch_cancelled",
                    "The batch was cancelled before this request ran.",
                ),
                ("expired", None) => (
                    "batch_expired",
                    "This request could not be executed before the completion window expired.",
                ),
                _ => ("result_missing", "No result was recorded for this request."),
            };
            (false, failed(id, custom_id, code, message))
        }
    }
}

/// The line of a request the gateway answered: its status, the request token as `request_id`,
/// and the body (as JSON when it is JSON, else as a string).
fn answered(id: String, custom_id: &str, r: &ResultMessage) -> (bool, String) {
    let quoted;
    let body: &RawValue = match serde_json::from_str::<&RawValue>(&r.payload) {
        Ok(raw) => raw,
        Err(_) => {
            quoted = serde_json::value::to_raw_value(&r.payload).ok();
            match &quoted {
                Some(q) => q,
                None => RawValue::NULL,
            }
        }
    };
    let request_id = if r.request_token.is_empty() {
        &r.id
    } else {
        &r.request_token
    };
    let out = OutputLine {
        id,
        custom_id,
        response: Some(Response {
            status_code: r.status_code,
            request_id,
            body,
        }),
        error: None,
    };
    (
        (200..300).contains(&r.status_code),
        serde_json::to_string(&out).unwrap_or_default(),
    )
}

/// The line of a request without an answer: `response` null, `error{code, message}`.
fn failed(id: String, custom_id: &str, code: &str, message: &str) -> String {
    let out = OutputLine {
        id,
        custom_id,
        response: None,
        error: Some(LineError { code, message }),
    };
    serde_json::to_string(&out).unwrap_or_default()
}

struct Outputs {
    output: Writer,
    errors: Writer,
    completed: u64,
    failed: u64,
}

/// Writes the files of `batch`, sealed with `ending`, and records its ending.
pub async fn finalize(app: &App, batch: &Fields, ending: &str) -> Result<(), BatchError> {
    let started = std::time::Instant::now();
    let id = batch.get("id").cloned().unwrap_or_default();
    let mut outs = Outputs {
        output: app.store.writer(&ids::new_file_id()),
        errors: app.store.writer(&ids::new_file_id()),
        completed: 0,
        failed: 0,
    };
    // A batch cancelled while it was validated accounts for every line it can read too.
    if let Err(e) = write_lines(app, batch, ending, &mut outs).await {
        outs.output.abort().await;
        outs.errors.abort().await;
        return Err(e);
    }
    let (completed, failed) = (outs.completed, outs.failed);
    let output = keep(outs.output, completed > 0).await?;
    let errors = keep(outs.errors, failed > 0).await?;
    let tenant = batch.get("tenant").cloned().unwrap_or_default();
    let input = batch.get("input_file_id").cloned().unwrap_or_default();
    let retention = &app.settings.retention;
    let files_life = batch
        .get("output_expires_after")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| crate::retention::secs(retention.files));
    let script = &SCRIPTS.finish;
    let cmd = script.cmd(
        &[
            keys::batch(&id),
            keys::counts(),
            keys::live(),
            keys::out(&id),
            keys::file(&output.0),
            keys::file(&errors.0),
            keys::files(&tenant),
            keys::enqueued(),
            keys::expiries(),
            keys::file(&input),
        ],
        &[
            id.clone(),
            output.0.clone(),
            errors.0.clone(),
            completed.to_string(),
            failed.to_string(),
            (completed + failed).to_string(),
            output.1.to_string(),
            errors.1.to_string(),
            tenant,
            inferq_client::producer::unix_ms().to_string(),
            crate::retention::secs(retention.batches).to_string(),
            files_life.to_string(),
        ],
    );
    let mut con = app.redis.clone();
    let (status, won): (String, i64) = redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    // The ending and its files' records reach the replicas before the steward moves on.
    match crate::durable::wait(app, &keys::batch(&id)).await {
        Ok(Replicated::Short { acked, wanted }) => {
            tracing::warn!(batch = %id, acked, wanted, "a batch's ending is not on enough replicas");
        }
        Err(e) => tracing::warn!(batch = %id, error = %e, "cannot wait for the replicas"),
        Ok(_) => {}
    }
    if won != 1 {
        for name in [output.0, errors.0].into_iter().filter(|n| !n.is_empty()) {
            app.store.delete(&name).await?;
        }
        return Ok(());
    }
    for (file, n) in [("output", completed), ("error", failed)] {
        let label = FileLabel { file: file.into() };
        app.metrics.lines_written.get_or_create(&label).inc_by(n);
    }
    app.metrics
        .finalize_seconds
        .observe(started.elapsed().as_secs_f64());
    tracing::info!(batch = %id, status = %status, completed, failed, "batch ended");
    Ok(())
}

/// Completes a written file when it holds lines (its id and bytes), else gives it up (`""`).
async fn keep(writer: Writer, wanted: bool) -> Result<(String, u64), BatchError> {
    if !wanted {
        writer.abort().await;
        return Ok((String::new(), 0));
    }
    let id = writer.id.clone();
    let bytes = writer.finish().await?;
    Ok((id, bytes))
}

async fn write_lines(
    app: &App,
    batch: &Fields,
    ending: &str,
    outs: &mut Outputs,
) -> Result<(), BatchError> {
    use futures::StreamExt;
    let id = batch.get("id").cloned().unwrap_or_default();
    let file = batch.get("input_file_id").cloned().unwrap_or_default();
    let endpoint = batch.get("endpoint").cloned().unwrap_or_default();
    let mut stream = app.store.read(&file).await?;
    let mut splitter = LineSplitter::new(app.settings.limits.max_line_bytes);
    let mut pending: Vec<(u64, String)> = Vec::with_capacity(CHUNK);
    let mut finished = false;
    while !finished {
        let mut take = |n: u64, line: &[u8]| -> Result<(), SplitError> {
            if !is_blank(line) {
                if let Ok(l) = decode_line(line, &endpoint) {
                    pending.push((n, l.custom_id));
                }
            }
            Ok(())
        };
        match stream.next().await {
            Some(chunk) => splitter.push(&chunk?, &mut take).map_err(too_long)?,
            None => {
                splitter.finish(&mut take).map_err(too_long)?;
                finished = true;
            }
        }
        while pending.len() >= CHUNK || (finished && !pending.is_empty()) {
            let at = pending.len().min(CHUNK);
            let chunk: Vec<(u64, String)> = pending.drain(..at).collect();
            write_chunk(app, &id, ending, chunk, outs).await?;
        }
    }
    Ok(())
}

fn too_long(e: SplitError) -> BatchError {
    let SplitError::TooLong { line, limit } = e;
    BatchError::Io(std::io::Error::other(format!(
        "line {line} of the input file is longer than {limit} bytes"
    )))
}

async fn write_chunk(
    app: &App,
    id: &str,
    ending: &str,
    chunk: Vec<(u64, String)>,
    outs: &mut Outputs,
) -> Result<(), BatchError> {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(keys::out(id));
    for (n, _) in &chunk {
        cmd.arg(*n);
    }
    let mut con = app.redis.clone();
    let results: Vec<Option<String>> = cmd.query_async(&mut con).await?;
    let mut out_text = String::new();
    let mut err_text = String::new();
    for ((n, custom_id), result) in chunk.iter().zip(results.iter()) {
        let (ok, line) = render(id, *n, custom_id, result.as_deref(), ending);
        let into = if ok {
            outs.completed += 1;
            &mut out_text
        } else {
            outs.failed += 1;
            &mut err_text
        };
        into.push_str(&line);
        into.push('\n');
    }
    outs.output.write(out_text.as_bytes()).await?;
    outs.errors.write(err_text.as_bytes()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_result_becomes_its_line() {
        let ok = r#"{"id":"batch_a:1","request_token":"t1","status_code":200,"payload":"{\"choices\":[]}"}"#;
        let (is_out, line) = render("batch_a", 1, "c1", Some(ok), "completed");
        assert!(is_out);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(v["custom_id"], "c1");
        assert_eq!(v["response"]["status_code"], 200);
        assert_eq!(v["response"]["request_id"], "t1");
        assert_eq!(v["response"]["body"]["choices"], serde_json::json!([]));
        assert!(v["error"].is_null());
        assert!(v["id"]
            .as_str()
            .is_some_and(|s| s.starts_with("batch_req_")));

        let bad = r#"{"id":"batch_a:2","status_code":400,"payload":"not json"}"#;
        let (is_out, line) = render("batch_a", 2, "c2", Some(bad), "completed");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert!(!is_out);
        assert_eq!(v["response"]["body"], "not json");

        let late = r#"{"id":"batch_a:3","payload":"{}","error_code":"DEADLINE_EXCEEDED","error_message":"too late"}"#;
        let (is_out, line) = render("batch_a", 3, "c3", Some(late), "completed");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert!(!is_out);
        assert!(v["response"].is_null());
        assert_eq!(v["error"]["code"], "batch_expired");
        assert_eq!(v["error"]["message"], "too late");

        let (_, line) = render("batch_a", 4, "c4", None, "cancelled");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
        assert_eq!(v["error"]["code"], "batch_cancelled");
    }
}
