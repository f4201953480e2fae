//! OpenTelemetry settings from the standard environment, read as the Go processor reads them:
//! tracing is on exactly when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (go-compat §9.3). What comes
//! out is an [`OtelSettings`] (the OTLP gRPC endpoint with its scheme, the service name, the CA
//! and client certificate of an `https://` collector) for `ops::otel` to start the exporter
//! with; the other standard variables (headers, timeout, sampler, resource attributes) are read
//! by the OpenTelemetry SDK itself.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

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
    /// The client certificate chain and its key (PEM) to present to an `https://` collector
    /// that asks for one (`OTEL_EXPORTER_OTLP[_TRACES]_CLIENT_CERTIFICATE` and `_CLIENT_KEY`).
    pub client_pem: Option<ClientPem>,
}

/// A client certificate chain and its private key, both PEM.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientPem {
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for ClientPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("ClientPem")
            .field("cert", &format_args!("{} bytes", self.cert.len()))
            .finish_non_exhaustive()
    }
}

/// The first of `keys` (the traces-only variable, then the general one) that is set, with its
/// value.
fn first_set<'k>(
    set: &dyn Fn(&str) -> Option<String>,
    keys: [&'k str; 2],
) -> Option<(&'k str, String)> {
    keys.iter().find_map(|key| set(key).map(|v| (*key, v)))
}

/// The file `path` that `key` names.
fn read_file(key: &str, path: &str) -> Result<Vec<u8>, ConfigError> {
    std::fs::read(path).map_err(|e| ConfigError::invalid(key, format!("cannot read {path:?}: {e}")))
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
    let ca = first_set(
        &set,
        [
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        ],
    );
    let ca_pem = match ca {
        Some((key, path)) => {
            let pem = read_file(key, &path)?;
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
        client_pem: client_pem(&set)?,
    }))
}

/// The client certificate and key the variables name: both or neither (one alone is refused,
/// naming the other), each a readable PEM file holding what its name says.
fn client_pem(set: &dyn Fn(&str) -> Option<String>) -> Result<Option<ClientPem>, ConfigError> {
    const CERT: [&str; 2] = [
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
        "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
    ];
    const KEY: [&str; 2] = [
        "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        "OTEL_EXPORTER_OTLP_CLIENT_KEY",
    ];
    let (cert_var, cert_path, key_var, key_path) = match (first_set(set, CERT), first_set(set, KEY))
    {
        (None, None) => return Ok(None),
        (Some((var, _)), None) => {
            return Err(ConfigError::invalid(
                var,
                format!("a client certificate needs its key: set {} too", KEY[1]),
            ))
        }
        (None, Some((var, _))) => {
            return Err(ConfigError::invalid(
                var,
                format!("a client key needs its certificate: set {} too", CERT[1]),
            ))
        }
        (Some((cv, cp)), Some((kv, kp))) => (cv, cp, kv, kp),
    };
    let cert = read_file(cert_var, &cert_path)?;
    if !CertificateDer::pem_slice_iter(&cert).any(|c| c.is_ok()) {
        return Err(ConfigError::invalid(
            cert_var,
            format!("{cert_path:?} holds no PEM certificate"),
        ));
    }
    let key = read_file(key_var, &key_path)?;
    if PrivateKeyDer::from_pem_slice(&key).is_err() {
        return Err(ConfigError::invalid(
            key_var,
            format!("{key_path:?} holds no PEM private key"),
        ));
    }
    Ok(Some(ClientPem { cert, key }))
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
                client_pem: None,
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

    /// A client certificate for a collector that asks for one: both files read at start-up,
    /// the traces-only variables first; one without the other, an unreadable file or a file
    /// without what its variable names is refused naming the variable.
    #[test]
    fn a_client_certificate_takes_both_variables() {
        use inferq_testkit::certs::{temp_file, TEST_CLIENT_CERT_PEM, TEST_CLIENT_KEY_PEM};
        let dir = match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("tempdir: {e}"),
        };
        let cert = temp_file(&dir, "client.crt", TEST_CLIENT_CERT_PEM);
        let key = temp_file(&dir, "client.key", TEST_CLIENT_KEY_PEM);
        let (cert, key) = (cert.display().to_string(), key.display().to_string());
        let with = |vars: &[(&str, &str)]| {
            let mut all = vec![(ENDPOINT_VAR, "https://c:4317")];
            all.extend_from_slice(vars);
            read(&all)
        };
        let pair = ClientPem {
            cert: TEST_CLIENT_CERT_PEM.as_bytes().to_vec(),
            key: TEST_CLIENT_KEY_PEM.as_bytes().to_vec(),
        };
        let got = with(&[
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
        ]);
        assert_eq!(
            got.ok().flatten().and_then(|s| s.client_pem),
            Some(pair.clone())
        );
        let got = with(&[
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", &cert),
            ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/nonexistent"),
            ("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &key),
        ]);
        assert_eq!(got.ok().flatten().and_then(|s| s.client_pem), Some(pair));
        assert!(!format!("{:?}", with(&[])).contains("PRIVATE"));

        let refused = |vars: &[(&str, &str)], var: &str| {
            let text = with(vars).err().map(|e| e.to_string()).unwrap_or_default();
            assert!(text.contains(var), "{vars:?}: {text}");
        };
        refused(
            &[("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert)],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        refused(
            &[("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", &key)],
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
        );
        refused(
            &[
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", "/nonexistent"),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
            ],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        refused(
            &[
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &key),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &key),
            ],
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        refused(
            &[
                ("OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE", &cert),
                ("OTEL_EXPORTER_OTLP_CLIENT_KEY", &cert),
            ],
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        );
    }
}
