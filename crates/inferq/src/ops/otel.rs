//! OpenTelemetry export, started when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (go-compat §9.3):
//! an OTLP gRPC exporter behind a batch span processor, the resource from the standard
//! variables with `service.name` as [`OtelSettings`] names it, the sampler from
//! `OTEL_TRACES_SAMPLER`/`_ARG` (the SDK's default: parent-based, always on). An `https://`
//! collector is trusted by the CA of `OTEL_EXPORTER_OTLP_CERTIFICATE` alone when it is set (as Go
//! reads it), otherwise by the system store plus the bundled Mozilla roots ([`inferq_client::roots`]);
//! it is shown the client certificate of `OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE` and `_KEY`.
//!
//! In: the settings the config resolved. Out: an [`Otel`] handle whose tracer the workers use for
//! request spans (`dispatch::trace`), and whose [`Otel::shutdown`] flushes what is still
//! buffered when the processor stops.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::tonic_types::transport::{Certificate, ClientTlsConfig, Identity};
use opentelemetry_otlp::{SpanExporter, WithExportConfig, WithTonicConfig};
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

use crate::config::otel::OtelSettings;
use inferq_client::Roots;

/// The instrumentation scope of every span, Go's tracer name.
pub const TRACER_NAME: &str = "llm-d-async";

/// How long the shutdown waits for buffered spans to reach the collector (Go's 5 s budget).
const FLUSH_LIMIT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum OtelError {
    #[error("cannot start the OTLP trace exporter for {endpoint}: {reason}")]
    Exporter { endpoint: String, reason: String },
}

/// A running trace pipeline.
#[derive(Debug)]
pub struct Otel {
    provider: SdkTracerProvider,
}

impl Otel {
    /// Builds the exporter and the provider. The exporter connects lazily: a collector that is
    /// down costs dropped spans (the SDK logs them), never a request. Needs a Tokio runtime.
    pub fn start(settings: &OtelSettings) -> Result<Otel, OtelError> {
        let fail = |reason: String| OtelError::Exporter {
            endpoint: crate::config::redact_url(&settings.endpoint),
            reason,
        };
        let mut builder = SpanExporter::builder()
            .with_tonic()
            .with_endpoint(settings.endpoint.clone());
        if settings.endpoint.starts_with("https://") {
            let mut tls = match &settings.ca_pem {
                Some(pem) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem)),
                None => ClientTlsConfig::new().trust_anchors(Roots::system().anchors()),
            };
            if let Some(client) = &settings.client_pem {
                tls = tls.identity(Identity::from_pem(&client.cert, &client.key));
            }
            builder = builder.with_tls_config(tls);
        }
        let exporter = builder.build().map_err(|e| fail(e.to_string()))?;
        let resource = Resource::builder()
            .with_service_name(settings.service_name.clone())
            .build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource)
            .build();
        Ok(Otel { provider })
    }

    /// The tracer request spans are made with.
    pub fn tracer(&self) -> SdkTracer {
        self.provider.tracer(TRACER_NAME)
    }

    /// Exports what is buffered (at most [`FLUSH_LIMIT`]) and stops the pipeline.
    pub async fn shutdown(self) {
        let provider = self.provider;
        let flushed =
            tokio::task::spawn_blocking(move || provider.shutdown_with_timeout(FLUSH_LIMIT)).await;
        match flushed {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not flush the last spans"),
            Err(e) => tracing::warn!(error = %e, "could not flush the last spans"),
        }
    }
}
