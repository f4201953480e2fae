//! The Batches API: create, retrieve, list and cancel. Create checks the request as OpenAI
//! does and records the batch (status `validating`) in one Lua move; the stewards do the rest.
//! Retrieve reads the batch's hash, so its `request_counts` and `usage` are live while it runs,
//! from whichever replica answers. A create that would take its tenant past its bound on lines
//! not yet finished (`--max-enqueued-lines`, or the key's `max_enqueued_lines`) is refused 429 by
//! the same move, with nothing written. With `replica_wait` a create is answered only once the
//! replicas hold it, so a fail-over right after cannot lose an answered batch.

use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use redis::AsyncCommands;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::files_api::{owned_file, ListQuery};
use crate::ids;
use crate::keys;
use crate::model::{batch_object, list_object, Fields};
use crate::scripts::SCRIPTS;
use crate::settings::window;
use crate::state::{now_secs, App, Owned};

/// The endpoints a batch may name: the ones the inference gateway serves.
pub const ENDPOINTS: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/embeddings"];

fn required<'a>(body: &'a Map<String, Value>, name: &str) -> Result<&'a str, ApiError> {
    match body.get(name) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s),
        None | Some(Value::Null) => Err(ApiError::invalid(
            format!("Missing required parameter: '{name}'."),
            Some(name),
        )),
        Some(_) => Err(ApiError::invalid(
            format!("Invalid type for '{name}': expected a string."),
            Some(name),
        )),
    }
}

/// The batch's `endpoint`: one the gateway serves.
fn endpoint_of(body: &Map<String, Value>) -> Result<&str, ApiError> {
    let endpoint = required(body, "endpoint")?;
    if !ENDPOINTS.contains(&endpoint) {
        return Err(ApiError::invalid(
            format!(
                "Invalid value for 'endpoint': '{endpoint}'. Supported values are: {}.",
                ENDPOINTS.join(", ")
            ),
            Some("endpoint"),
        ));
    }
    Ok(endpoint)
}

/// The batch's `completion_window`, as written and as a duration.
fn window_of<'a>(
    app: &App,
    body: &'a Map<String, Value>,
) -> Result<(&'a str, std::time::Duration), ApiError> {
    let text = required(body, "completion_window")?;
    match window(text, &app.settings.extra_windows) {
        Some(w) => Ok((text, w)),
        None => Err(ApiError::invalid(
            format!(
                "Invalid value for 'completion_window': '{text}'. Supported values are: '24h'."
            ),
            Some("completion_window"),
        )),
    }
}

/// `POST /v1/batches`.
pub async fn create(
    State(app): State<App>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let body: Map<String, Value> = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(format!("The request body is not a JSON object: {e}"), None)
    })?;
    let input = required(&body, "input_file_id")?;
    let endpoint = endpoint_of(&body)?;
    let (window_text, window) = window_of(&app, &body)?;
    let metadata = crate::metadata::check(body.get("metadata"))?;
    let output_life = crate::retention::expires_after_json(
        "output_expires_after",
        body.get("output_expires_after"),
        &app.settings.retention,
    )?;
    let file = owned_file(&app, &tenant, input).await.map_err(|mut e| {
        e.param = Some("input_file_id".into());
        e
    })?;
    if file.get("purpose").map(String::as_str) != Some("batch") {
        return Err(ApiError::invalid(
            format!(
                "File {input} has purpose '{}': a batch's input file must have purpose 'batch'.",
                file.get("purpose").map_or("", String::as_str)
            ),
            Some("input_file_id"),
        ));
    }
    let id = ids::new_batch_id();
    let created = now_secs();
    let expires = created + i64::try_from(window.as_secs()).unwrap_or(i64::MAX / 2);
    let mut fields: Vec<(&str, String)> = vec![
        ("id", id.clone()),
        ("tenant", tenant.clone()),
        ("endpoint", endpoint.to_owned()),
        ("input_file_id", input.to_owned()),
        ("completion_window", window_text.to_owned()),
        ("created_at", created.to_string()),
        ("expires_at", expires.to_string()),
        ("total", "0".into()),
        ("completed", "0".into()),
        ("failed", "0".into()),
    ];
    if let Some(m) = metadata {
        fields.push(("metadata", m));
    }
    if let Some(life) = output_life {
        fields.push(("output_expires_after", life.to_string()));
    }
    let bound = app
        .keys
        .settings(&tenant)
        .max_enqueued_lines
        .or(app.settings.limits.max_enqueued_lines)
        .unwrap_or(0);
    let mut args: Vec<String> = vec![
        id.clone(),
        inferq_client::producer::unix_ms().to_string(),
        tenant.clone(),
        bound.to_string(),
    ];
    for (k, v) in &fields {
        args.push((*k).to_owned());
        args.push(v.clone());
    }
    let script = &SCRIPTS.create;
    let cmd = script.cmd(
        &[
            keys::batch(&id),
            keys::batches(&tenant),
            keys::live(),
            keys::counts(),
            keys::file(input),
            keys::enqueued(),
        ],
        &args,
    );
    let mut con = app.redis.clone();
    let made: Vec<i64> = redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    match made.as_slice() {
        [1, ..] => {}
        [-1, enqueued, lines] => {
            app.metrics.limit_refused(&tenant);
            return Err(limit_reached(&tenant, bound, *enqueued, *lines));
        }
        _ => return Err(ApiError::not_found("File", input)),
    }
    replicated(&app, &id).await?;
    // The batch is recorded: answer it from what was written, so a failed read cannot make a
    // caller retry (and create a second batch).
    let mut f: Fields = fields.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    f.insert("status".into(), "validating".into());
    tracing::info!(batch = %id, tenant = %tenant, endpoint = %endpoint, "batch created");
    Ok(Json(batch_object(&f)))
}

/// OpenAI's 429 for a tenant at its bound.
fn limit_reached(tenant: &str, bound: u64, enqueued: i64, lines: i64) -> ApiError {
    ApiError {
        status: axum::http::StatusCode::TOO_MANY_REQUESTS,
        message: format!(
            "Enqueued line limit reached for tenant {tenant}. Limit: {bound} enqueued lines. \
             Enqueued: {enqueued} lines; this batch has {lines}. Please try again once some \
             in_progress batches have been completed."
        ),
        kind: "rate_limit_error",
        param: None,
        code: Some("rate_limit_exceeded".to_owned()),
    }
}

/// With `replica_wait`, waits until the replicas hold the new batch; a 503 when too few do in
/// time (the batch is recorded on the primary but a fail-over could lose it).
async fn replicated(app: &App, id: &str) -> Result<(), ApiError> {
    let crate::durable::Replicated::Short { acked, wanted } =
        crate::durable::wait(app, &keys::batch(id)).await?
    else {
        return Ok(());
    };
    tracing::warn!(batch = %id, acked, wanted, "a created batch is not on enough replicas");
    Err(ApiError {
        status: axum::http::StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "Batch {id} was recorded, but only {acked} of {wanted} replicas confirmed it in \
             time: a fail-over could lose it. Retrieve it before creating it again."
        ),
        kind: "server_error",
        param: None,
        code: Some("not_replicated".to_owned()),
    })
}

/// A batch of `tenant`, or 404.
async fn owned_batch(app: &App, tenant: &str, id: &str) -> Result<Fields, ApiError> {
    app.owned(Owned::Batch, tenant, id).await
}

/// `GET /v1/batches/{batch_id}`.
pub async fn retrieve(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    Ok(Json(batch_object(&owned_batch(&app, &tenant, &id).await?)))
}

/// `POST /v1/batches/{batch_id}/cancel`.
pub async fn cancel(
    State(app): State<App>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    owned_batch(&app, &tenant, &id).await?;
    let script = &SCRIPTS.cancel;
    let cmd = script.cmd(&[keys::batch(&id), keys::counts(), keys::live()], &[&id]);
    let mut con = app.redis.clone();
    let (status, taken): (String, i64) =
        redis::from_redis_value(script.run(&mut con, &cmd).await?)?;
    if taken != 1 {
        return Err(ApiError::conflict(format!(
            "Cannot cancel a batch with status '{status}'."
        )));
    }
    let f: Fields = con.hgetall(keys::batch(&id)).await?;
    tracing::info!(batch = %id, "batch cancel asked");
    Ok(Json(batch_object(&f)))
}

/// `GET /v1/batches`.
pub async fn list(
    State(app): State<App>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>, ApiError> {
    let tenant = app.keys.tenant(&headers)?;
    let Query(q) = query.map_err(|e| ApiError::invalid(e.body_text(), None))?;
    let page = crate::listing::page(&app, &keys::batches(&tenant), &q, 20, 100).await?;
    let data = crate::listing::fetch(&app, &page.ids, keys::batch)
        .await?
        .iter()
        .map(batch_object)
        .collect();
    Ok(Json(list_object(data, page.has_more)))
}
