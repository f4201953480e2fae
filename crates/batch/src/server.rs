//! The HTTP side: the OpenAI routes under `/v1`, plus `/healthz`, `/readyz` (Redis and the file
//! store answer) and `/metrics`. Unknown routes and wrong methods answer in OpenAI's error
//! shape. Request bodies of the batch routes are small (a JSON object); the upload route has no
//! body limit of its own, since the upload enforces the file limit while it streams.

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::App;
use crate::{batches_api, files_api};

/// The router of a replica.
pub fn router(app: App) -> Router {
    let files = Router::new()
        .route("/v1/files", post(files_api::upload).get(files_api::list))
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(files)
        .route(
            "/v1/files/{file_id}",
            get(files_api::retrieve).delete(files_api::delete),
        )
        .route("/v1/files/{file_id}/content", get(files_api::content))
        .route(
            "/v1/batches",
            post(batches_api::create)
                .get(batches_api::list)
                .layer(DefaultBodyLimit::max(64 * 1024)),
        )
        .route("/v1/batches/{batch_id}", get(batches_api::retrieve))
        .route("/v1/batches/{batch_id}/cancel", post(batches_api::cancel))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .fallback(|| async {
            ApiError::invalid("Unknown request URL or method.", None)
                .with_status(StatusCode::NOT_FOUND)
                .with_code("unknown_url")
        })
        .method_not_allowed_fallback(|| async {
            ApiError::invalid("This method is not allowed on this URL.", None)
                .with_status(StatusCode::METHOD_NOT_ALLOWED)
        })
        .with_state(app)
}

async fn ready(State(app): State<App>) -> impl IntoResponse {
    let mut con = app.redis.clone();
    let redis: Result<String, _> = redis::cmd("PING").query_async(&mut con).await;
    let store = app.store.check().await;
    match (redis, store) {
        (Ok(_), Ok(())) => (StatusCode::OK, "ready".to_owned()),
        (Err(e), _) => (StatusCode::SERVICE_UNAVAILABLE, format!("redis: {e}")),
        (_, Err(e)) => (StatusCode::SERVICE_UNAVAILABLE, format!("file store: {e}")),
    }
}

async fn metrics(State(app): State<App>) -> impl IntoResponse {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
}
