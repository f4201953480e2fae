//! The HTTP side: the OpenAI routes under `/v1` (the Batch API's and the front door's), plus `/healthz`, `/readyz` (Redis and the file
//! store answer) and `/metrics`. Unknown routes and wrong methods answer in OpenAI's error
//! shape. Request bodies of the batch routes are small (a JSON object); the upload route has no
//! body limit of its own, since the upload enforces the file limit while it streams. Every
//! `/v1` call's API key is checked from its headers before its body is read, and every refusal
//! has OpenAI's error shape ([`crate::guard`]).

use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::middleware::{from_fn, from_fn_with_state};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;

use crate::error::ApiError;
use crate::state::App;
use crate::{batches_api, files_api, front, guard};

/// The router of a replica.
pub fn router(app: App) -> Router {
    let files = Router::new()
        .route(
            "/v1/files",
            post(files_api::upload)
                .layer(from_fn_with_state(app.clone(), guard::upload_budget))
                .get(files_api::list),
        )
        .layer(DefaultBodyLimit::disable());
    let v1 = Router::new()
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
        .merge(front_routes(&app))
        // Both run before any extractor reads the body; the error shape wraps them all.
        .route_layer(from_fn_with_state(app.clone(), guard::key_first))
        .route_layer(from_fn(guard::openai_errors));
    Router::new()
        .merge(v1)
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

/// The front door's routes, the router's step's (bodies up to `--max-line-bytes`), and
/// `/v1/embeddings`.
fn front_routes(app: &App) -> Router<App> {
    let body = DefaultBodyLimit::max(app.settings.limits.max_line_bytes);
    Router::new()
        .route("/v1/chat/completions", post(front::http::chat))
        .route("/v1/completions", post(front::http::completions))
        .route("/inference/v1/generate", post(front::http::generate))
        .route("/v1/embeddings", post(front::http::embeddings))
        .route("/v1/models", get(front::http::models))
        .route(
            "/v1/requests/{request_id}",
            get(front::http::retrieve).delete(front::http::delete),
        )
        .layer(body)
}

async fn ready(State(app): State<App>) -> impl IntoResponse {
    let mut con = app.redis.clone();
    let redis: Result<String, _> = redis::cmd("PING").query_async(&mut con).await;
    let store = app.store.check().await;
    match (redis, store) {
        (Ok(_), Ok(())) => match crate::tenants::unserved(&app) {
            None => (StatusCode::OK, "ready".to_owned()),
            Some(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
        },
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

/// How long a stopping replica lets open calls finish (waits included) before it drops them:
/// a client whose wait is dropped retries with its `Idempotency-Key` through another replica.
const DRAIN: std::time::Duration = std::time::Duration::from_secs(20);

/// Serves `router` on `listener` until `stop`, one bounded HTTP/1.1 connection per task (see
/// [`inferq_http`]), then lets open calls finish for up to [`DRAIN`].
///
/// HTTP/1 only, rather than axum's `serve` (which builds every connection able to speak HTTP/2
/// as well): a connection held by a waiting client costs about half the memory, which is what
/// bounds how many clients one replica holds waiting.
pub async fn serve_http1(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: inferq_http::ConnLimits,
    stop: tokio_util::sync::CancellationToken,
) {
    inferq_http::serve(listener, router, limits, stop, DRAIN).await;
}
