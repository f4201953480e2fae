//! From an input file to requests on the queue, in two streamed passes, as OpenAI does it:
//! [`validate`] reads the whole file and either counts its lines or names every bad one (the
//! batch then fails and nothing is submitted); [`ingest`] reads it again and submits each line
//! as one inferq request, `<batch id>:<line>`, its body's bytes untouched, `url` as its
//! endpoint and the batch's expiry as its deadline, a thousand per round trip. After each
//! round trip the batch's cursor moves (`advance-1.lua`), so a steward that dies is resumed by
//! another from there; the requests of the round trip it was in may be submitted twice, and
//! `collect-4.lua` files only the first result of a line. A cancel stops ingestion after the round
//! trip in flight, whose lines the cursor still takes in, so the cancel marks them too. With
//! `replica_wait`, each round trip waits for the replicas ([`crate::durable`]) before the next.
//!
//! The lines go to the one request queue, or with `--queue-per-tenant` to the batch's tenant's
//! queue, recorded after each round trip in the index of queues with work
//! ([`crate::tenants`]).

use std::collections::{BTreeMap, HashSet};

use futures::StreamExt;
use inferq_client::producer::ProducerError;
use inferq_client::wire::NewRequest;
use serde_json::{json, Value};

use crate::error::BatchError;
use crate::ids;
use crate::keys;
use crate::lines::{decode_line, decode_line_all, is_blank, EachLine, LineSplitter, SplitError};
use crate::model::Fields;
use crate::scripts::SCRIPTS;
use crate::state::App;

/// Lines submitted per round trip.
const CHUNK: usize = 1000;
/// Bad lines named in a failed batch's `errors` (the rest are counted in one more entry).
const MAX_ERRORS: usize = 1000;

/// What validation found.
#[derive(Debug)]
pub enum Validated {
    Lines(u64),
    /// The `errors` object of a failed batch, as JSON.
    Failed(String),
}

struct Check<'a> {
    endpoint: &'a str,
    max_lines: u64,
    seen: HashSet<String>,
    lines: u64,
    errors: Vec<Value>,
    more_errors: u64,
}

impl Check<'_> {
    fn error(&mut self, code: &str, message: String, param: Option<&str>, line: Option<u64>) {
        if self.errors.len() < MAX_ERRORS {
            self.errors
                .push(json!({"code": code, "message": message, "param": param, "line": line}));
        } else {
            self.more_errors += 1;
        }
    }

    fn line(&mut self, n: u64, line: &[u8]) {
        if is_blank(line) {
            return;
        }
        self.lines += 1;
        match decode_line_all(line, self.endpoint) {
            Ok(l) => {
                if !self.seen.insert(l.custom_id.clone()) {
                    self.error(
                        "duplicate_custom_id",
                        format!("The custom_id '{}' is used by an earlier line: each line needs its own.", l.custom_id),
                        Some("custom_id"),
                        Some(n),
                    );
                }
            }
            Err(faults) => {
                for e in faults {
                    self.error(e.code, e.message, e.param, Some(n));
                }
            }
        }
    }
}

/// Streams lines of `file_id` to `each`; stops at the first error `each` gives.
async fn each_line<E: From<SplitError> + From<BatchError>>(
    app: &App,
    file_id: &str,
    each: &mut EachLine<'_, E>,
) -> Result<(), E> {
    let mut stream = app.store.read(file_id).await?;
    let mut splitter = LineSplitter::new(app.settings.limits.max_line_bytes);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(BatchError::from)?;
        splitter.push(&chunk, each)?;
    }
    splitter.finish(each)
}

#[derive(Debug)]
enum ReadError {
    Batch(BatchError),
    Split(SplitError),
}

impl From<BatchError> for ReadError {
    fn from(e: BatchError) -> Self {
        ReadError::Batch(e)
    }
}

impl From<SplitError> for ReadError {
    fn from(e: SplitError) -> Self {
        ReadError::Split(e)
    }
}

/// Reads the batch's input file through and judges it.
pub async fn validate(app: &App, batch: &Fields) -> Result<Validated, BatchError> {
    let file = batch.get("input_file_id").cloned().unwrap_or_default();
    let mut check = Check {
        endpoint: batch.get("endpoint").map_or("", String::as_str),
        max_lines: app.settings.limits.max_lines,
        seen: HashSet::new(),
        lines: 0,
        errors: Vec::new(),
        more_errors: 0,
    };
    let read = each_line::<ReadError>(app, &file, &mut |n, line| {
        check.line(n, line);
        Ok(())
    })
    .await;
    match read {
        Ok(()) => {}
        Err(ReadError::Batch(BatchError::InputGone(_))) => check.error(
            "input_file_missing",
            format!("The input file {file} was deleted."),
            Some("input_file_id"),
            None,
        ),
        Err(ReadError::Batch(e)) => return Err(e),
        Err(ReadError::Split(SplitError::TooLong { line, limit })) => check.error(
            "line_too_large",
            format!("The line is longer than the longest line taken ({limit} bytes)."),
            None,
            Some(line),
        ),
    }
    if check.lines == 0 && check.errors.is_empty() {
        check.error(
            "empty_file",
            "The input file has no requests.".into(),
            Some("input_file_id"),
            None,
        );
    }
    if check.lines > check.max_lines {
        let message = format!(
            "The input file has {} requests; a batch takes at most {}.",
            check.lines, check.max_lines
        );
        check.errors.insert(
            0,
            json!({"code": "too_many_tasks", "message": message, "param": null, "line": null}),
        );
    }
    if check.more_errors > 0 {
        let message = format!("{} more lines are invalid (not listed).", check.more_errors);
        check.errors.push(
            json!({"code": "too_many_errors", "message": message, "param": null, "line": null}),
        );
    }
    if check.errors.is_empty() {
        return Ok(Validated::Lines(check.lines));
    }
    Ok(Validated::Failed(
        json!({"object": "list", "data": check.errors}).to_string(),
    ))
}

/// Why ingestion stopped before the end.
#[derive(Debug, PartialEq, Eq)]
pub enum Stopped {
    /// Every line is on the queue.
    Done,
    /// The batch moved on (cancelled, sealed) or the window passed: the steward looks again.
    Moved,
}

/// Submits the batch's lines after its cursor.
pub async fn ingest(
    app: &App,
    batch: &Fields,
    still_held: &(dyn Fn() -> bool + Sync),
) -> Result<Stopped, BatchError> {
    let id = batch.get("id").cloned().unwrap_or_default();
    let file = batch.get("input_file_id").cloned().unwrap_or_default();
    let endpoint = batch.get("endpoint").cloned().unwrap_or_default();
    let tenant = batch.get("tenant").cloned().unwrap_or_default();
    let queue = crate::tenants::queue_of(app, batch);
    let num = |name: &str| {
        batch
            .get(name)
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(0)
    };
    let (created, deadline) = (num("created_at"), num("expires_at"));
    let cursor = u64::try_from(num("cursor")).unwrap_or(0);
    let mut submitted = u64::try_from(num("ingested")).unwrap_or(0);
    let mut pending: Vec<(u64, NewRequest)> = Vec::with_capacity(CHUNK);
    let mut stream = app.store.read(&file).await?;
    let mut splitter = LineSplitter::new(app.settings.limits.max_line_bytes);
    let mut finished = false;
    loop {
        let mut take = |n: u64, line: &[u8]| -> Result<(), SplitError> {
            if n <= cursor || is_blank(line) {
                return Ok(());
            }
            if let Ok(l) = decode_line(line, &endpoint) {
                pending.push((n, request(&id, n, created, deadline, &l)));
            }
            Ok(())
        };
        match stream.next().await {
            Some(chunk) => {
                let chunk = chunk?;
                splitter.push(&chunk, &mut take).map_err(split_error)?;
            }
            None => {
                splitter.finish(&mut take).map_err(split_error)?;
                finished = true;
            }
        }
        while pending.len() >= CHUNK || (finished && !pending.is_empty()) {
            if !still_held() {
                return Err(BatchError::LeaseLost(id));
            }
            let at = pending.len().min(CHUNK);
            let chunk: Vec<(u64, NewRequest)> = pending.drain(..at).collect();
            let last = chunk.last().map_or(cursor, |(n, _)| *n);
            match submit(app, &queue, chunk).await? {
                Some(n) => submitted += n,
                None => return Ok(Stopped::Moved),
            }
            crate::tenants::note_ingested(app, &tenant, &queue, at as u64).await?;
            app.metrics.lines_ingested.inc_by(at as u64);
            let status = advance(app, &id, submitted, last).await?;
            if let crate::durable::Replicated::Short { acked, wanted } =
                crate::durable::wait(app, &keys::batch(&id)).await?
            {
                return Err(BatchError::NotReplicated { acked, wanted });
            }
            if status != "in_progress" {
                return Ok(Stopped::Moved);
            }
        }
        if finished {
            return Ok(Stopped::Done);
        }
    }
}

fn split_error(e: SplitError) -> BatchError {
    let SplitError::TooLong { line, limit } = e;
    BatchError::Io(std::io::Error::other(format!(
        "line {line} of the input file is longer than {limit} bytes (it was valid when checked)"
    )))
}

fn request(
    batch: &str,
    line: u64,
    created: i64,
    deadline: i64,
    l: &crate::lines::InputLine<'_>,
) -> NewRequest {
    let mut metadata = BTreeMap::new();
    metadata.insert("batch_id".to_owned(), batch.to_owned());
    NewRequest::new(ids::request_id(batch, line), deadline, l.body.to_owned())
        .with_created(created)
        .with_metadata(metadata)
        .with_endpoint(l.url.clone())
}

/// Lines per `ingest-1.lua` call (several calls go in one round trip): small enough that one call
/// holds Redis for about a millisecond.
const PER_CALL: usize = 100;

/// Submits one round trip's requests to `queue`; `None` once the window has passed. On a
/// Cluster each goes through the producer's own script; elsewhere `ingest-1.lua` queues many per
/// call.
async fn submit(
    app: &App,
    queue: &str,
    chunk: Vec<(u64, NewRequest)>,
) -> Result<Option<u64>, BatchError> {
    if !app.redis.is_cluster() {
        return submit_batched(app, queue, chunk).await;
    }
    let reqs: Vec<NewRequest> = chunk.into_iter().map(|(_, r)| r).collect();
    let n = reqs.len() as u64;
    let producer = if queue == app.producer.request_queue() {
        app.producer.as_ref().clone()
    } else {
        app.producer.for_queue(queue)
    };
    for outcome in producer.submit_many(reqs).await? {
        match outcome {
            Ok(_) => {}
            Err(ProducerError::Expired) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(n))
}

async fn submit_batched(
    app: &App,
    queue: &str,
    chunk: Vec<(u64, NewRequest)>,
) -> Result<Option<u64>, BatchError> {
    let n = chunk.len() as u64;
    let Some(deadline) = chunk.first().map(|(_, r)| r.deadline) else {
        return Ok(Some(0));
    };
    let ttl_ms = deadline.saturating_mul(1000) - inferq_client::producer::unix_ms();
    if ttl_ms <= 0 {
        return Ok(None);
    }
    let script = &SCRIPTS.ingest;
    let mut pipe = redis::pipe();
    let mut calls = 0;
    let mut reqs = chunk.into_iter().map(|(_, r)| r).peekable();
    while reqs.peek().is_some() {
        let mut args: Vec<Vec<u8>> = vec![
            deadline.to_string().into_bytes(),
            ttl_ms.to_string().into_bytes(),
        ];
        for req in reqs.by_ref().take(PER_CALL) {
            args.extend(ingest_args(queue, req)?);
        }
        pipe.add_command(script.cmd(&[queue], &args));
        calls += 1;
    }
    // Ring the queue's doorbell so idle processors poll at once (a wake-up only).
    pipe.cmd("PUBLISH")
        .arg(inferq_client::keys::doorbell_channel(queue))
        .arg("1")
        .ignore();
    let mut con = app.redis.clone();
    let values: Vec<redis::Value> = match pipe.query_async(&mut con).await {
        Ok(values) => values,
        // The script was not loaded (a restart): nothing of it ran; load it and send again.
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load(&mut con).await?;
            pipe.query_async(&mut con).await?
        }
        Err(e) => return Err(e.into()),
    };
    if values.len() != calls {
        return Err(BatchError::Unexpected {
            script: script.name,
            answer: format!("{} answers to {calls} calls", values.len()),
        });
    }
    for v in values {
        redis::from_redis_value::<u64>(v)?;
    }
    Ok(Some(n))
}

/// The four arguments of one request for `ingest-1.lua`: its active and cancel keys, a fresh
/// request token, and its member (routed to the batch result list).
fn ingest_args(queue: &str, req: NewRequest) -> Result<[Vec<u8>; 4], BatchError> {
    let token = inferq_client::keys::fresh_token();
    let routing = inferq_client::wire::Routing {
        request_token: token.clone(),
        request_queue_name: queue.to_owned(),
        result_queue_name: crate::keys::results(),
        ..Default::default()
    };
    let active = inferq_client::keys::active_key(&req.id).into_bytes();
    let cancel = inferq_client::keys::cancel_key(&req.id).into_bytes();
    let member = req
        .into_envelope(routing)
        .map_err(|e| BatchError::Io(std::io::Error::other(e.to_string())))?
        .encode();
    Ok([active, cancel, token.into_bytes(), member])
}

async fn advance(app: &App, id: &str, submitted: u64, cursor: u64) -> Result<String, BatchError> {
    let script = &SCRIPTS.advance;
    let cmd = script.cmd(&[keys::batch(id)], &[submitted, cursor]);
    let mut con = app.redis.clone();
    Ok(redis::from_redis_value(script.run(&mut con, &cmd).await?)?)
}
