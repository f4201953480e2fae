//! HTTPS for the simulator (`inferq-dev sim --tls-cert --tls-key [--tls-client-ca]`), so the gateway
//! TLS flags of `inferq run` can be tested end to end against a real TLS server.
//!
//! PEM paths enter as [`SimTls`]; a `TlsAcceptor` leaves (rustls with the ring provider, TLS 1.2
//! and 1.3, ALPN `http/1.1`). With `--tls-client-ca`, a client must present a certificate signed
//! by that CA (mutual TLS); a handshake without one fails.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use super::SimError;

/// The simulator's TLS flags. None given: plain HTTP.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct SimTls {
    /// Serve HTTPS with this certificate chain (PEM); needs --tls-key.
    #[arg(long = "tls-cert", value_name = "PATH", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long = "tls-key", value_name = "PATH", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM): mutual TLS.
    #[arg(long = "tls-client-ca", value_name = "PATH", requires = "cert")]
    pub client_ca: Option<PathBuf>,
}

fn tls_error(flag: &str, path: &Path, reason: impl std::fmt::Display) -> SimError {
    SimError::Tls(format!("{flag} {}: {reason}", path.display()))
}

fn certs(flag: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, SimError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| tls_error(flag, path, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(flag, path, e))?;
    if certs.is_empty() {
        return Err(tls_error(flag, path, "no PEM certificate found"));
    }
    Ok(certs)
}

impl SimTls {
    /// The acceptor for these flags, `None` for plain HTTP.
    pub(crate) fn acceptor(&self) -> Result<Option<TlsAcceptor>, SimError> {
        let (cert, key) =
            match (&self.cert, &self.key) {
                (None, None) if self.client_ca.is_none() => return Ok(None),
                (Some(cert), Some(key)) => (cert, key),
                _ => return Err(SimError::Tls(
                    "--tls-cert and --tls-key must be given together (and --tls-client-ca only \
                     with them)"
                        .to_owned(),
                )),
            };
        let chain = certs("--tls-cert", cert)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_error("--tls-key", key, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| SimError::Tls(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for ca in certs("--tls-client-ca", path)? {
                    roots
                        .add(ca)
                        .map_err(|e| tls_error("--tls-client-ca", path, e))?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(roots.into(), provider)
                    .build()
                    .map_err(|e| tls_error("--tls-client-ca", path, e))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder
            .with_single_cert(chain, key)
            .map_err(|e| tls_error("--tls-cert", cert, e))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Some(TlsAcceptor::from(Arc::new(config))))
    }
}
