//! The Files API: upload (`multipart/form-data` with `file` and `purpose=batch`), list,
//! retrieve, content and delete. An upload streams into the file store while each line is
//! checked to be a JSON object, so a file that is not JSONL, or that grows past the size limit,
//! is refused while it arrives and nothing of it is kept. An upload may give
//! `expires_after[anchor]=created_at` and `expires_after[seconds]`; without it a file lives
//! `--file-retention`. Either way its `expires_at` is set and the sweeper removes it then. Its
//! count of lines is kept, for the tenant's bound on lines not yet finished that a batch of it
//! holds. A tenant sees only its own files; another tenant's id answers 404, as an unknown one
//! does.

use axum::body::Body;
use axum::extract::multipart::{Field, MultipartRejection};
use axum::extract::{Multipart, Path, Query, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use axum::Json;
use futures::StreamExt;
use redis::AsyncCommands;
use serde::Deserialize;
use serde_json::Value;

use crate::error::ApiError;
use crate::ids;
use crate::keys;
use crate::lines::{is_blank, LineSplitter, SplitError};
use crate::model::{file_object, list_object, Fields};
use crate::state::{now_secs, App, Owned};

/// A stored upload: its id, bytes, file name and requests (non-blank lines).
type Stored = (String, u64, String, u64);

/// The form's small fields.
#[derive(Default)]
struct Form {
    purpose: Option<String>,
    anchor: Option<String>,
    seconds: Option<String>,
}

/// Why an upload stopped.
enum Refusal {
    Split(SplitError),
    Api(ApiError),
}

impl From<SplitError> for Refusal {
    fn from(e: SplitError) -> Refusal {
        Refusal::Split(e)
    }
}

fn bad_multipart(e: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(
        format!("The request body is not valid multipart/form-data: {e}"),
        None,
    )
}

/// `POST /v1/files`.
pub async fn upload(
    State(app): State<App>,
    headers: HeaderMap,
    Extension(budget): Extension<crate::guard::Budget>,
    multipart: Result<Multipart, MultipartRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let mut multipart = multipart.map_err(bad_multipart)?;
    let mut form = Form::default();
    let mut stored: Option<Stored> = None;
    let mut outcome = read_form(&app, &mut multipart, &mut form, &mut stored).await;
    if outcome.is_err() {
        let cap = app.settings.limits.max_file_bytes.max(DRAIN_AT_LEAST);
        // Counted off the connection: multer reads an unfinished field through before the
        // next one, which `drain` alone would not count.
        budget.drain(cap);
        drain(&mut multipart, cap).await;
    }
    if outcome.is_ok() {
        outcome = match form.purpose.as_deref() {
            Some("batch") => Ok(()),
            None => Err(ApiError::invalid("Missing required parameter: 'purpose'.", Some("purpose"))),
            Some(other) => Err(ApiError::invalid(
                format!("Invalid value for 'purpose': '{other}'. This server takes files with purpose 'batch'."),
                Some("purpose"),
            )),
        };
    }
    let life = match outcome {
        Ok(()) => crate::retention::expires_after(
            "expires_after",
            form.anchor.as_deref(),
            form.seconds.as_deref(),
            &app.settings.retention,
        ),
        Err(e) => Err(e),
    };
    let (life, outcome) = match life {
        Ok(l) => (
            l.unwrap_or_else(|| crate::retention::secs(app.settings.retention.files)),
            Ok(()),
        ),
        Err(e) => (0, Err(e)),
    };
    let Some((id, bytes, filename, lines)) = stored else {
        return Err(outcome.err().unwrap_or_else(|| {
            ApiError::invalid("Missing required parameter: 'file'.", Some("file"))
        }));
    };
    if let Err(e) = outcome {
        forget(&app, &id).await;
        return Err(e);
    }
    let created = now_secs();
    let expires = created + i64::try_from(life).unwrap_or(i64::MAX / 4);
    let fields: Fields = [
        ("id", id.clone()),
        ("bytes", bytes.to_string()),
        ("created_at", created.to_string()),
        ("expires_at", expires.to_string()),
        ("filename", filename),
        ("purpose", "batch".to_owned()),
        ("tenant", tenant.clone()),
        ("lines", lines.to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    if let Err(e) = record(&app, &tenant, &id, &fields, expires).await {
        forget(&app, &id).await;
        return Err(ApiError::from(e));
    }
    Ok(Json(file_object(&fields)))
}

/// Reads the form's fields: `purpose`, `expires_after[…]`, and `file` streamed into the store.
async fn read_form(
    app: &App,
    multipart: &mut Multipart,
    form: &mut Form,
    stored: &mut Option<Stored>,
) -> Result<(), ApiError> {
    while let Some(field) = multipart.next_field().await.map_err(bad_multipart)? {
        match field.name() {
            Some("purpose") => form.purpose = Some(small_text(field, "purpose").await?),
            Some("expires_after[anchor]") => {
                form.anchor = Some(small_text(field, "expires_after.anchor").await?)
            }
            Some("expires_after[seconds]") => {
                form.seconds = Some(small_text(field, "expires_after.seconds").await?)
            }
            Some("file") if stored.is_some() => {
                return Err(ApiError::invalid(
                    "Only one 'file' may be uploaded.",
                    Some("file"),
                ))
            }
            Some("file") => *stored = Some(receive(app, field).await?),
            _ => {}
        }
    }
    Ok(())
}

/// A refused upload's rest is read up to the file limit or this, whichever is more (a small
/// limit must not leave most of a small upload unread).
const DRAIN_AT_LEAST: u64 = 64 << 20;

/// Reads and drops what is left of a refused upload, up to `cap` bytes or 10 s, before the
/// refusal is answered. A server that answers and closes while the client is still sending
/// makes the client's kernel reset the connection, and the client may then see a broken
/// connection instead of the 413 (the Batch API's tests saw one in CI).
async fn drain(multipart: &mut Multipart, cap: u64) {
    let mut left = cap;
    let rest = async {
        while let Ok(Some(mut field)) = multipart.next_field().await {
            while let Ok(Some(chunk)) = field.chunk().await {
                left = left.saturating_sub(chunk.len() as u64);
                if left == 0 {
                    return;
                }
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_secs(10), rest).await;
}

/// Deletes the bytes of an upload that was refused after it was stored.
async fn forget(app: &App, id: &str) {
    if let Err(e) = app.store.delete(id).await {
        tracing::warn!(error = %e, file = %id, "could not delete a refused upload");
    }
}

/// Records a stored file: its hash, its place in the tenant's list and its expiry, in one
/// transaction.
async fn record(
    app: &App,
    tenant: &str,
    id: &str,
    fields: &Fields,
    expires: i64,
) -> redis::RedisResult<()> {
    let mut con = app.redis.clone();
    let pairs: Vec<(&String, &String)> = fields.iter().collect();
    redis::pipe()
        .atomic()
        .hset_multiple(keys::file(id), &pairs)
        .ignore()
        .zadd(keys::files(tenant), id, inferq_client::producer::unix_ms())
        .ignore()
        .zadd(keys::expiries(), id, expires)
        .ignore()
        .query_async(&mut con)
        .await
}

async fn small_text(mut field: Field<'_>, name: &str) -> Result<String, ApiError> {
    let mut text = Vec::new();
    while let Some(chunk) = field.chunk().await.map_err(bad_multipart)? {
        text.extend_from_slice(&chunk);
        if text.len() > 256 {
            return Err(ApiError::invalid(
                format!("'{name}' is too long."),
                Some(name),
            ));
        }
    }
    String::from_utf8(text)
        .map_err(|_| ApiError::invalid(format!("'{name}' is not UTF-8."), Some(name)))
}

/// Streams the `file` field into the store, checking it is JSONL within the limits.
async fn receive(app: &App, mut field: Field<'_>) -> Result<Stored, ApiError> {
    let filename: String = field
        .file_name()
        .unwrap_or("upload.jsonl")
        .chars()
        .filter(|c| !c.is_control())
        .take(255)
        .collect();
    let id = ids::new_file_id();
    let limits = app.settings.limits;
    let mut writer = app.store.writer(&id);
    let mut splitter = LineSplitter::new(limits.max_line_bytes);
    let mut lines = 0u64;
    let mut check = |n: u64, line: &[u8]| -> Result<(), Refusal> {
        if is_blank(line) {
            return Ok(());
        }
        lines += 1;
        match serde_json::from_slice::<&serde_json::value::RawValue>(line) {
            Ok(v) if v.get().starts_with('{') => Ok(()),
            Ok(_) => Err(Refusal::Api(not_jsonl(n, "the line is not a JSON object"))),
            Err(e) => Err(Refusal::Api(not_jsonl(n, &e.to_string()))),
        }
    };
    let outcome: Result<(), ApiError> = async {
        loop {
            let chunk = match field.chunk().await {
                Ok(Some(c)) => c,
                Ok(None) => break,
                Err(e) => return Err(bad_multipart(e)),
            };
            if writer.bytes + chunk.len() as u64 > limits.max_file_bytes {
                return Err(ApiError::too_large(format!(
                    "File is too large: the limit is {} bytes.",
                    limits.max_file_bytes
                )));
            }
            splitter.push(&chunk, &mut check).map_err(refusal)?;
            writer.write(&chunk).await.map_err(ApiError::from)?;
        }
        splitter.finish(&mut check).map_err(refusal)?;
        Ok(())
    }
    .await;
    if let Err(e) = outcome {
        writer.abort().await;
        return Err(e);
    }
    if lines == 0 {
        writer.abort().await;
        return Err(ApiError::invalid(
            "The file is empty: a batch file needs at least one line.",
            Some("file"),
        )
        .with_code("empty_file"));
    }
    let bytes = writer.finish().await.map_err(ApiError::from)?;
    Ok((id, bytes, filename, lines))
}

fn not_jsonl(line: u64, why: &str) -> ApiError {
    ApiError::invalid(
        format!("The file is not valid JSONL: line {line}: {why}."),
        Some("file"),
    )
    .with_code("invalid_file_format")
}

fn refusal(r: Refusal) -> ApiError {
    match r {
        Refusal::Api(e) => e,
        Refusal::Split(SplitError::TooLong { line, limit }) => ApiError::too_large(format!(
            "Line {line} is longer than the longest line taken ({limit} bytes)."
        ))
        .with_code("line_too_large"),
    }
}

/// A file of `tenant`, or 404.
pub async fn owned_file(app: &App, tenant: &str, id: &str) -> Result<Fields, ApiError> {
    app.owned(Owned::File, tenant, id).await
}

/// `GET /v1/files/{file_id}`.
pub async fn retrieve(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    Ok(Json(file_object(&owned_file(&app, &tenant, &id).await?)))
}

/// `GET /v1/files/{file_id}/content`: the bytes, streamed.
pub async fn content(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    owned_file(&app, &tenant, &id).await?;
    let stream = app.store.read(&id).await.map_err(ApiError::from)?;
    let body = Body::from_stream(stream.map(|c| c.map_err(std::io::Error::other)));
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        body,
    )
        .into_response())
}

/// `DELETE /v1/files/{file_id}`. The input file of a batch that has not ended is kept: the
/// batch reads it again to write its results.
pub async fn delete(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    owned_file(&app, &tenant, &id).await?;
    let mut con = app.redis.clone();
    if let Some(batch) = reading_batch(&mut con, &id).await? {
        return Err(ApiError::conflict(format!(
            "File {id} is the input of batch {batch}, which has not ended: delete it once the batch has ended."
        )));
    }
    let _: () = redis::pipe()
        .atomic()
        .del(keys::file(&id))
        .ignore()
        .zrem(keys::files(&tenant), &id)
        .ignore()
        .query_async(&mut con)
        .await?;
    app.store.delete(&id).await.map_err(ApiError::from)?;
    Ok(Json(
        serde_json::json!({"id": id, "object": "file", "deleted": true}),
    ))
}

/// A batch not yet ended that reads `file` (its input), looked for among the live batches:
/// each reads its input again to write its results.
async fn reading_batch(
    con: &mut inferq_client::target::Link,
    file: &str,
) -> Result<Option<String>, ApiError> {
    let live: Vec<String> = con.zrange(keys::live(), 0, -1).await?;
    if live.is_empty() {
        return Ok(None);
    }
    let mut pipe = redis::pipe();
    for b in &live {
        pipe.hget(keys::batch(b), "input_file_id");
    }
    let inputs: Vec<Option<String>> = pipe.query_async(con).await?;
    Ok(live
        .into_iter()
        .zip(inputs)
        .find(|(_, input)| input.as_deref() == Some(file))
        .map(|(b, _)| b))
}

/// The query of a list call.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    pub limit: Option<String>,
    pub after: Option<String>,
    pub order: Option<String>,
    pub purpose: Option<String>,
}

/// `GET /v1/files`.
pub async fn list(
    State(app): State<App>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    let page = crate::listing::page(&app, &keys::files(&tenant), &q, 10_000, 10_000).await?;
    let mut data = Vec::new();
    for f in crate::listing::fetch(&app, &page.ids, keys::file).await? {
        if q.purpose
            .as_deref()
            .is_some_and(|p| f.get("purpose").map(String::as_str) != Some(p))
        {
            continue;
        }
        data.push(file_object(&f));
    }
    Ok(Json(list_object(data, page.has_more)))
}
