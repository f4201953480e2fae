//! Errors: [`ApiError`] is what a client sees, OpenAI's `{"error": {message, type, param,
//! code}}` with its HTTP status; [`BatchError`] is what goes wrong inside (Redis, the file
//! store, a file that does not read), which a handler turns into a 5xx and a log line.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Failures inside the Batch API.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis answered something unexpected: {0}")]
    Parse(#[from] redis::ParsingError),
    #[error(transparent)]
    Link(#[from] inferq_client::target::LinkError),
    #[error("file store: {0}")]
    Store(#[from] object_store::Error),
    #[error("file store: {0}")]
    Io(#[from] std::io::Error),
    #[error("submitting requests: {0}")]
    Producer(#[from] inferq_client::producer::ProducerError),
    #[error("unexpected answer from {script}: {answer}")]
    Unexpected {
        script: &'static str,
        answer: String,
    },
    #[error("the input file {0} is gone from the file store")]
    InputGone(String),
    #[error("lost the steward lease of {0} (another replica took the batch over)")]
    LeaseLost(String),
    #[error("only {acked} of {wanted} replicas hold the writes (replica_wait): waiting to go on")]
    NotReplicated { acked: u32, wanted: u32 },
}

/// An OpenAI-shaped error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    pub fn with_code(mut self, code: &str) -> ApiError {
        self.code = Some(code.to_owned());
        self
    }

    pub fn with_status(mut self, status: StatusCode) -> ApiError {
        self.status = status;
        self
    }

    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::invalid(format!("No such {what} object: {id}"), Some("id"))
            .with_status(StatusCode::NOT_FOUND)
    }

    pub fn unauthorized(message: &str) -> ApiError {
        ApiError::invalid(message, None)
            .with_status(StatusCode::UNAUTHORIZED)
            .with_code("invalid_api_key")
    }

    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::invalid(message, Some("file"))
            .with_status(StatusCode::PAYLOAD_TOO_LARGE)
            .with_code("file_too_large")
    }

    pub fn conflict(message: impl Into<String>) -> ApiError {
        ApiError::invalid(message, None).with_status(StatusCode::CONFLICT)
    }

    pub fn unavailable(e: &dyn std::fmt::Display) -> ApiError {
        tracing::warn!(error = %e, "request failed inside the Batch API");
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: "The server could not complete the request (its Redis or file store is \
                      unavailable); nothing was changed that a retry would repeat"
                .to_owned(),
            kind: "server_error",
            param: None,
            code: Some("service_unavailable".to_owned()),
        }
    }
}

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> ApiError {
        ApiError::unavailable(&e)
    }
}

impl From<redis::RedisError> for ApiError {
    fn from(e: redis::RedisError) -> ApiError {
        ApiError::unavailable(&e)
    }
}

impl From<redis::ParsingError> for ApiError {
    fn from(e: redis::ParsingError) -> ApiError {
        ApiError::unavailable(&e)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }});
        (self.status, axum::Json(body)).into_response()
    }
}
