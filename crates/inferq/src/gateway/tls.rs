//! The gateway TLS settings (Go's `--tls-ca-cert`, `--tls-cert`, `--tls-key`,
//! `--tls-insecure-skip-verify`) and the rustls client configuration they make.
//!
//! Paths enter; one `rustls::ClientConfig` leaves (every HTTPS connection to the gateway uses it),
//! or a [`GatewayError`] naming the flag and file at fault. As in Go: the CA file is *added* to
//! the default roots (the system certificate store plus the bundled Mozilla roots, see
//! [`inferq_client::roots`]) and must hold at least one certificate, and a certificate it or the system
//! store lists is trusted when a gateway serves it as it is ([`super::trust`]); the client
//! certificate and key come together or not at all. rustls speaks TLS 1.2 and 1.3 only, which
//! matches Go's `MinVersion: TLS1.2`. HTTP/2 and HTTP/1.1 are offered by ALPN.
//!
//! PEM files may carry other blocks (e.g. `EC PARAMETERS` before an EC key, as `openssl ecparam
//! -genkey` writes them); those are ignored, as Go's `tls.X509KeyPair` ignores them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore};

use super::trust::GatewayVerifier;
use super::GatewayError;
use inferq_client::Roots;

/// TLS settings for the connection to the gateway.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GatewayTls {
    /// Extra trusted roots (PEM, one or more certificates), for gateways behind a private CA.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate chain (PEM), for gateways that require mutual TLS.
    pub cert: Option<PathBuf>,
    /// Private key of `cert` (PEM: PKCS#8, PKCS#1 RSA or SEC1 EC; unencrypted).
    pub key: Option<PathBuf>,
    /// Accept any server certificate (testing only).
    pub insecure_skip_verify: bool,
}

impl GatewayTls {
    /// Whether any TLS flag was given.
    pub fn is_configured(&self) -> bool {
        self.ca_cert.is_some()
            || self.cert.is_some()
            || self.key.is_some()
            || self.insecure_skip_verify
    }

    /// The client configuration these settings make, with `roots` as the default roots (the
    /// process's are [`Roots::system`]).
    pub(crate) fn client_config_on(&self, roots: &Roots) -> Result<ClientConfig, GatewayError> {
        let identity = match (&self.cert, &self.key) {
            (None, None) => None,
            (Some(cert), Some(key)) => Some((
                certificates(cert, "--tls-cert")?,
                client_key(key)?,
                cert,
                key,
            )),
            (Some(_), None) | (None, Some(_)) => {
                return Err(GatewayError::Tls(
                    "--tls-cert and --tls-key must be given together".to_string(),
                ));
            }
        };
        let listed = match &self.ca_cert {
            Some(path) => Some((certificates(path, "--tls-ca-cert")?, path.as_path())),
            None => None,
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let algorithms = provider.signature_verification_algorithms;
        let verifier = if self.insecure_skip_verify {
            GatewayVerifier::any(algorithms)
        } else {
            let mut store: RootCertStore = roots.store().clone();
            let mut listed = match listed {
                Some((certs, path)) => {
                    for cert in &certs {
                        store
                            .add(cert.clone())
                            .map_err(|e| tls_error("--tls-ca-cert", path, e))?;
                    }
                    certs
                }
                None => Vec::new(),
            };
            // Go's pool holds the system store's certificates as it holds the CA file's.
            listed.extend_from_slice(roots.system_certs());
            let webpki =
                WebPkiServerVerifier::builder_with_provider(Arc::new(store), Arc::clone(&provider))
                    .build()
                    .map_err(|e| GatewayError::Tls(format!("trusted roots: {e}")))?;
            GatewayVerifier::go(webpki, listed, algorithms)
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| GatewayError::Tls(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier));
        let mut config = match identity {
            Some((chain, key, cert_path, key_path)) => {
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    GatewayError::Tls(format!(
                        "--tls-cert {} / --tls-key {}: {e}",
                        cert_path.display(),
                        key_path.display(),
                    ))
                })?
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

/// The `CERTIFICATE` blocks of the PEM file given to `flag`, each decoded: at least one.
fn certificates(path: &Path, flag: &str) -> Result<Vec<CertificateDer<'static>>, GatewayError> {
    let blocks = pem_blocks(&read(path)?, |label| label == "CERTIFICATE");
    let certs = CertificateDer::pem_slice_iter(&blocks)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(flag, path, format!("unreadable certificate: {e}")))?;
    if certs.is_empty() {
        return Err(tls_error(flag, path, "no PEM certificates found"));
    }
    Ok(certs)
}

/// The private key of `--tls-key`.
fn client_key(path: &Path) -> Result<PrivateKeyDer<'static>, GatewayError> {
    let blocks = pem_blocks(&read(path)?, |label| {
        matches!(label, "PRIVATE KEY" | "RSA PRIVATE KEY" | "EC PRIVATE KEY")
    });
    if blocks.is_empty() {
        return Err(tls_error(
            "--tls-key",
            path,
            "no unencrypted PEM private key found",
        ));
    }
    PrivateKeyDer::from_pem_slice(&blocks)
        .map_err(|e| tls_error("--tls-key", path, format!("unreadable private key: {e}")))
}

/// A TLS setting's error: `<flag> <path>: <reason>`.
fn tls_error(flag: &str, path: &Path, reason: impl std::fmt::Display) -> GatewayError {
    GatewayError::Tls(format!("{flag} {}: {reason}", path.display()))
}

fn read(path: &Path) -> Result<Vec<u8>, GatewayError> {
    std::fs::read(path).map_err(|source| GatewayError::ReadFile {
        path: path.to_path_buf(),
        source,
    })
}

/// The PEM blocks of `pem` whose label `keep` accepts, each re-emitted verbatim with its
/// `-----BEGIN …-----` / `-----END …-----` lines. Text outside blocks is dropped; a block without
/// its END line is kept as is so that the PEM parser reports it.
fn pem_blocks(pem: &[u8], keep: impl Fn(&str) -> bool) -> Vec<u8> {
    let text = String::from_utf8_lossy(pem);
    let mut out = String::new();
    let mut current: Option<(bool, String)> = None;
    for line in text.lines() {
        let trimmed = line.trim();
        if let Some((keeping, block)) = current.as_mut() {
            if *keeping {
                block.push_str(trimmed);
                block.push('\n');
            }
            if trimmed.starts_with("-----END ") {
                if *keeping {
                    out.push_str(block);
                }
                current = None;
            }
        } else if let Some(label) = trimmed
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
        {
            current = Some((keep(label), format!("{trimmed}\n")));
        }
    }
    if let Some((true, block)) = current {
        out.push_str(&block);
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use inferq_testkit::certs::{
        temp_file, TEST_CA_PEM, TEST_CLIENT_CERT_PEM, TEST_CLIENT_KEY_PEM,
    };

    fn build(tls: &GatewayTls) -> Result<ClientConfig, GatewayError> {
        tls.client_config_on(Roots::system())
    }

    fn tempdir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("tempdir: {e}"),
        }
    }

    #[test]
    fn valid_settings_build_a_client() {
        let dir = tempdir();
        let tls = GatewayTls {
            ca_cert: Some(temp_file(&dir, "ca.pem", TEST_CA_PEM)),
            cert: Some(temp_file(&dir, "client.pem", TEST_CLIENT_CERT_PEM)),
            key: Some(temp_file(&dir, "client.key", TEST_CLIENT_KEY_PEM)),
            insecure_skip_verify: false,
        };
        assert!(tls.is_configured());
        if let Err(e) = build(&tls) {
            panic!("valid TLS settings rejected: {e}");
        }
        assert!(build(&GatewayTls::default()).is_ok());
        let insecure = GatewayTls {
            insecure_skip_verify: true,
            ..GatewayTls::default()
        };
        assert!(build(&insecure).is_ok());
    }

    fn error_text(tls: &GatewayTls) -> String {
        match build(tls) {
            Ok(_) => panic!("{tls:?} should be rejected"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn cert_and_key_must_come_together() {
        let dir = tempdir();
        let cert = temp_file(&dir, "client.pem", TEST_CLIENT_CERT_PEM);
        let key = temp_file(&dir, "client.key", TEST_CLIENT_KEY_PEM);
        for tls in [
            GatewayTls {
                cert: Some(cert),
                ..GatewayTls::default()
            },
            GatewayTls {
                key: Some(key),
                ..GatewayTls::default()
            },
        ] {
            let text = error_text(&tls);
            assert!(
                text.contains("--tls-cert and --tls-key must be given together"),
                "{text}"
            );
        }
    }

    #[test]
    fn unusable_files_are_clear_errors() {
        let dir = tempdir();
        let garbage = temp_file(&dir, "garbage.pem", "this is not PEM\n");
        let key = temp_file(&dir, "client.key", TEST_CLIENT_KEY_PEM);
        let cert = temp_file(&dir, "client.pem", TEST_CLIENT_CERT_PEM);

        let text = error_text(&GatewayTls {
            ca_cert: Some(garbage.clone()),
            ..GatewayTls::default()
        });
        assert!(
            text.contains("--tls-ca-cert") && text.contains("no PEM certificates"),
            "{text}"
        );

        let bad_der = temp_file(
            &dir,
            "bad-der.pem",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        );
        let text = error_text(&GatewayTls {
            ca_cert: Some(bad_der),
            ..GatewayTls::default()
        });
        assert!(text.contains("certificate"), "{text}");

        let text = error_text(&GatewayTls {
            ca_cert: Some(dir.path().join("missing.pem")),
            ..GatewayTls::default()
        });
        assert!(text.contains("missing.pem"), "{text}");

        let text = error_text(&GatewayTls {
            cert: Some(garbage.clone()),
            key: Some(key),
            ..GatewayTls::default()
        });
        assert!(
            text.contains("--tls-cert") && text.contains("no PEM certificate"),
            "{text}"
        );

        let text = error_text(&GatewayTls {
            cert: Some(cert.clone()),
            key: Some(garbage),
            ..GatewayTls::default()
        });
        assert!(
            text.contains("--tls-key") && text.contains("private key"),
            "{text}"
        );

        // A certificate offered as the key.
        let text = error_text(&GatewayTls {
            cert: Some(cert.clone()),
            key: Some(cert),
            ..GatewayTls::default()
        });
        assert!(text.contains("--tls-key"), "{text}");
    }

    #[test]
    fn pem_blocks_filters_by_label() {
        let both = format!("{TEST_CLIENT_KEY_PEM}junk between\n{TEST_CLIENT_CERT_PEM}");
        let certs = String::from_utf8_lossy(&pem_blocks(both.as_bytes(), |l| l == "CERTIFICATE"))
            .into_owned();
        assert_eq!(certs, TEST_CLIENT_CERT_PEM);
        let keys = String::from_utf8_lossy(&pem_blocks(both.as_bytes(), |l| l == "PRIVATE KEY"))
            .into_owned();
        assert!(keys.starts_with("-----BEGIN PRIVATE KEY-----") && !keys.contains("PARAMETERS"));
    }
}
