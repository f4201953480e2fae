//! Operations surface of a running processor: Prometheus metrics under the Go processor's names
//! (plus inferq's own) served as Go serves them (`exposition`, with Go's float spelling in
//! `gofloat`, Go's `Content-Type` in `accept` and Go's gzip in `encoding`), the `/healthz` + `/readyz` server with Go's
//! semantics, the OpenTelemetry trace export (`otel`), and the standard process metrics
//! (`process`).

pub mod accept;
pub mod dispatch_metrics;
pub mod encoding;
pub mod exposition;
pub mod fair_share_metrics;
pub mod fd_limit;
pub mod feedback_metrics;
pub mod gofloat;
pub mod health;
pub mod listen;
pub mod metrics;
pub mod otel;
mod precreate;
pub mod process;

pub use health::{serve_health, serve_metrics, Readiness, Trouble};
pub use metrics::{Metrics, QueueLabels};
