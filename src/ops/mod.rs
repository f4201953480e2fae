//! Operations surface of a running processor: Prometheus metrics under the Go processor's names
//! (plus inferq's own), and the `/healthz` + `/readyz` server with Go's semantics.

pub mod health;
pub mod listen;
pub mod metrics;

pub use health::{serve_health, serve_metrics, Readiness};
pub use metrics::{Metrics, QueueLabels};
