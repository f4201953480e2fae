//! OpenTelemetry settings from the standard environment, read as the Go processor reads them:
//! tracing is on exactly when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (go-compat §9.3). What comes
//! out is an [`OtelSettings`] (the OTLP gRPC endpoint with its scheme, the service name) for
//! `ops::otel` to start the exporter with; the other standard variables (headers, timeout,
//! sampler, resource attributes) are read by the OpenTelemetry SDK itself.

use super::ConfigError;

/// The variable that switches tracing on (Go: "enabled iff set").
pub const ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
/// The traces-only endpoint, which wins over [`ENDPOINT_VAR`] once tracing is on.
pub const TRACES_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
/// Go's service name when `OTEL_SERVICE_NAME` is unset: kept, so trace queries written for a Go
/// deployment find inferq's spans.
pub const DEFAULT_SERVICE_NAME: &str = "llm-d-async";

/// Where spans go and under what name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtelSettings {
    /// The OTLP gRPC endpoint, `http://` (plain) or `https://` (TLS).
    pub endpoint: String,
    /// The resource's `service.name`.
    pub service_name: String,
    /// PEM certificates to trust for an `https://` endpoint instead of the public roots
    /// (`OTEL_EXPORTER_OTLP[_TRACES]_CERTIFICATE`), read at start-up.
    pub ca_pem: Option<Vec<u8>>,
}

/// The settings the environment asks for: `None` when `OTEL_EXPORTER_OTLP_ENDPOINT` is unset or
/// empty. An endpoint without a scheme is plain when `OTEL_EXPORTER_OTLP[_TRACES]_INSECURE` is
/// `true` and TLS otherwise, as Go's exporter takes it; one that is not an http(s) URL with a
/// host is refused, naming the variable.
pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Result<Option<OtelSettings>, ConfigError> {
    let set = |key: &str| {
        env(key)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set(ENDPOINT_VAR).is_none() {
        return Ok(None);
    }
    let (var, raw) = match set(TRACES_ENDPOINT_VAR) {
        Some(traces) => (TRACES_ENDPOINT_VAR, traces),
        None => (ENDPOINT_VAR, set(ENDPOINT_VAR).unwrap_or_default()),
    };
    let insecure = [
        "OTEL_EXPORTER_OTLP_TRACES_INSECURE",
        "OTEL_EXPORTER_OTLP_INSECURE",
    ]
    .iter()
    .find_map(|key| set(key))
    .is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let endpoint = if raw.contains("://") {
        raw
    } else if insecure {
        format!("http://{raw}")
    } else {
        format!("https://{raw}")
    };
    let url = url::Url::parse(&endpoint)
        .map_err(|e| ConfigError::invalid(var, format!("{endpoint:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(ConfigError::invalid(
            var,
            format!("{endpoint:?} must be an http:// or https:// URL with a host"),
        ));
    }
    let service_name = set("OTEL_SERVICE_NAME").unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_owned());
    let ca = [
        "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CERTIFICATE",
    ]
    .iter()
    .find_map(|key| set(key).map(|path| (*key, path)));
    let ca_pem = match ca {
        Some((key, path)) => {
            let pem = std::fs::read(&path)
                .map_err(|e| ConfigError::invalid(key, format!("cannot read {path:?}: {e}")))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(ConfigError::invalid(
                    key,
                    format!("{path:?} holds no PEM certificate"),
                ));
            }
            Some(pem)
        }
        None => None,
    };
    Ok(Some(OtelSettings {
        endpoint,
        service_name,
        ca_pem,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<OtelSettings>, ConfigError> {
        let vars: Vec<(String, String)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        from_env(&move |key| vars.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone()))
    }

    #[test]
    fn tracing_is_on_exactly_when_the_go_variable_is_set() {
        assert_eq!(read(&[]).ok(), Some(None));
        assert_eq!(read(&[(ENDPOINT_VAR, " ")]).ok(), Some(None));
        // The traces-only variable alone does not switch Go's tracing on.
        assert_eq!(
            read(&[(TRACES_ENDPOINT_VAR, "http://c:4317")]).ok(),
            Some(None)
        );
        let on = read(&[(ENDPOINT_VAR, "http://collector:4317")])
            .ok()
            .flatten();
        assert_eq!(
            on,
            Some(OtelSettings {
                endpoint: "http://collector:4317".to_owned(),
                service_name: DEFAULT_SERVICE_NAME.to_owned(),
                ca_pem: None,
            })
        );
    }

    #[test]
    fn the_endpoint_and_name_follow_the_standard_variables() {
        let endpoint = |vars: &[(&str, &str)]| read(vars).ok().flatten().map(|s| s.endpoint);
        assert_eq!(
            endpoint(&[(ENDPOINT_VAR, "collector:4317")]).as_deref(),
            Some("https://collector:4317")
        );
        assert_eq!(
            endpoint(&[
                (ENDPOINT_VAR, "collector:4317"),
                ("OTEL_EXPORTER_OTLP_INSECURE", "TRUE")
            ])
            .as_deref(),
            Some("http://collector:4317")
        );
        assert_eq!(
            endpoint(&[
                (ENDPOINT_VAR, "http://all:4317"),
                (TRACES_ENDPOINT_VAR, "http://traces:4317")
            ])
            .as_deref(),
            Some("http://traces:4317")
        );
        let named = read(&[
            (ENDPOINT_VAR, "http://c:4317"),
            ("OTEL_SERVICE_NAME", "batch"),
        ]);
        assert_eq!(
            named.ok().flatten().map(|s| s.service_name).as_deref(),
            Some("batch")
        );
    }

    #[test]
    fn a_bad_endpoint_is_refused_naming_its_variable() {
        for (var, value) in [
            (ENDPOINT_VAR, "ftp://collector:4317"),
            (ENDPOINT_VAR, "http://"),
            (ENDPOINT_VAR, "http://collector:port"),
        ] {
            let text = match read(&[(var, value)]) {
                Err(e) => e.to_string(),
                Ok(s) => panic!("{value} accepted: {s:?}"),
            };
            assert!(text.contains(var), "{value}: {text}");
        }
        let text = read(&[
            (ENDPOINT_VAR, "http://ok:4317"),
            (TRACES_ENDPOINT_VAR, "ftp://x"),
        ])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(text.contains(TRACES_ENDPOINT_VAR), "{text}");
        for value in ["/nonexistent/ca.pem", "/etc/hostname"] {
            let text = read(&[
                (ENDPOINT_VAR, "https://c:4317"),
                ("OTEL_EXPORTER_OTLP_CERTIFICATE", value),
            ])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
            assert!(
                text.contains("OTEL_EXPORTER_OTLP_CERTIFICATE"),
                "{value}: {text}"
            );
        }
    }
}
