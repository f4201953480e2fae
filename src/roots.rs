//! The certificate authorities inferq trusts when it checks a server's certificate by default:
//! the gateway's (`--tls-ca-cert` adds to them), a `rediss://` Redis's without
//! `--redis-tls-ca-cert`, and an `https://` OTLP collector's without
//! `OTEL_EXPORTER_OTLP_CERTIFICATE`.
//!
//! They are the machine's system certificate store, as Go's `crypto/x509` trusts it, **plus** the
//! Mozilla roots bundled in the binary (`webpki-root-certs`). The store is read by
//! `rustls-native-certs`: the files and directories named by `SSL_CERT_FILE` and `SSL_CERT_DIR`
//! when either is set, otherwise the distribution's bundle and directory (on Debian
//! `/etc/ssl/certs/ca-certificates.crt` and `/etc/ssl/certs`, where `update-ca-certificates` puts
//! a private CA). The bundled roots go further than Go: an image without a system store still
//! reaches servers with public certificates, where Go trusts nothing.
//!
//! The store is read once per process, on first use ([`Roots::system`]). Reading it never stops
//! inferq: a file or certificate in it that cannot be read or used is skipped with one warning,
//! and a store that cannot be read at all (or a machine without one) leaves the bundled roots.
//!
//! Out: a rustls [`RootCertStore`] (the gateway, the OTLP exporter), the certificates themselves
//! and the same set as one PEM bundle (redis-rs takes its roots only as PEM).

use std::collections::HashSet;
use std::path::Path;
use std::sync::OnceLock;

use base64::Engine as _;
use rustls::pki_types::{CertificateDer, TrustAnchor};
use rustls::RootCertStore;
use rustls_native_certs::CertificateResult;

/// A set of trusted roots: the usable certificates of a system store, then the bundled Mozilla
/// roots that are not already among them.
#[derive(Debug)]
pub struct Roots {
    /// Every trusted certificate, those of the system store first (`certs[..system]`): redis-rs
    /// and reqwest take roots as certificates, and Go's short cut for a trusted certificate
    /// served as it is compares them (`gateway::trust`).
    certs: Vec<CertificateDer<'static>>,
    /// How many of `certs` came from the system store.
    system: usize,
    /// `certs` as webpki trust anchors, parsed once.
    store: RootCertStore,
    /// `certs` as one PEM bundle, made on first use (only `rediss://` needs it).
    pem: OnceLock<Vec<u8>>,
}

impl Roots {
    /// The process's roots: the system store, read on the first call, plus the bundled roots.
    pub fn system() -> &'static Roots {
        static ROOTS: OnceLock<Roots> = OnceLock::new();
        ROOTS.get_or_init(|| {
            let roots = Roots::with_store(rustls_native_certs::load_native_certs());
            if roots.system > 0 {
                tracing::debug!(
                    system = roots.system,
                    bundled = roots.certs.len() - roots.system,
                    "trusting the system certificate store and the bundled Mozilla roots"
                );
            }
            roots
        })
    }

    /// The roots a process would have whose `SSL_CERT_FILE` is `file` and `SSL_CERT_DIR` is
    /// `dir` (neither: the bundled roots alone). For tests: [`Roots::system`] reads the
    /// environment, which is the whole process's.
    pub fn from_paths(file: Option<&Path>, dir: Option<&Path>) -> Roots {
        Roots::with_store(rustls_native_certs::load_certs_from_paths(file, dir))
    }

    /// The certificates `found` in a store, those webpki can use as roots, then the bundled
    /// roots. What could not be read or used is logged (once: each store is read once).
    fn with_store(found: CertificateResult) -> Roots {
        let mut store = RootCertStore::empty();
        let mut certs = Vec::new();
        let mut seen = HashSet::new();
        let mut unusable = 0usize;
        for cert in found.certs {
            if !seen.insert(cert.as_ref().to_vec()) {
                continue;
            }
            match store.add(cert.clone()) {
                Ok(()) => certs.push(cert),
                Err(e) => {
                    unusable += 1;
                    tracing::debug!(error = %e, "a system certificate is not usable as a root");
                }
            }
        }
        let system = certs.len();
        for e in &found.errors {
            tracing::debug!(error = %e, "reading the system certificate store");
        }
        if unusable > 0 {
            tracing::warn!(
                skipped = unusable,
                "certificates of the system store that are not usable as roots are not trusted"
            );
        }
        match (found.errors.first(), system) {
            (Some(first), 0) => tracing::warn!(
                error = %first,
                "cannot read the system certificate store; trusting the bundled Mozilla roots only"
            ),
            (Some(first), _) => tracing::warn!(
                errors = found.errors.len(),
                first = %first,
                "part of the system certificate store cannot be read; what can be read is trusted"
            ),
            (None, 0) => tracing::info!(
                "the system certificate store is empty; trusting the bundled Mozilla roots only"
            ),
            (None, _) => {}
        }
        for cert in webpki_root_certs::TLS_SERVER_ROOT_CERTS {
            if seen.insert(cert.as_ref().to_vec()) && store.add(cert.clone()).is_ok() {
                certs.push(cert.clone());
            }
        }
        Roots {
            certs,
            system,
            store,
            pem: OnceLock::new(),
        }
    }

    /// The trusted roots as rustls takes them.
    pub fn store(&self) -> &RootCertStore {
        &self.store
    }

    /// The trusted roots as trust anchors (tonic takes them so).
    pub fn anchors(&self) -> impl Iterator<Item = TrustAnchor<'static>> + '_ {
        self.store.roots.iter().cloned()
    }

    /// Every trusted certificate (DER).
    pub fn certs(&self) -> &[CertificateDer<'static>] {
        &self.certs
    }

    /// The certificates that came from the system store (DER).
    pub fn system_certs(&self) -> &[CertificateDer<'static>] {
        &self.certs[..self.system]
    }

    /// Every trusted certificate as one PEM bundle.
    pub fn pem(&self) -> &[u8] {
        self.pem.get_or_init(|| pem_bundle(&self.certs))
    }
}

/// `certs` as `CERTIFICATE` PEM blocks, 64 base64 characters a line.
fn pem_bundle(certs: &[CertificateDer<'_>]) -> Vec<u8> {
    let mut out = String::new();
    for cert in certs {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let text = base64::engine::general_purpose::STANDARD.encode(cert.as_ref());
        for (i, c) in text.chars().enumerate() {
            if i > 0 && i % 64 == 0 {
                out.push('\n');
            }
            out.push(c);
        }
        out.push_str("\n-----END CERTIFICATE-----\n");
    }
    out.into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::tls::tests::{temp_file, TEST_CA_PEM, TEST_CLIENT_CERT_PEM};
    use rustls::pki_types::pem::PemObject;

    fn der(pem: &str) -> CertificateDer<'static> {
        match CertificateDer::from_pem_slice(pem.as_bytes()) {
            Ok(der) => der,
            Err(e) => panic!("test certificate: {e}"),
        }
    }

    fn tempdir() -> tempfile::TempDir {
        match tempfile::tempdir() {
            Ok(dir) => dir,
            Err(e) => panic!("tempdir: {e}"),
        }
    }

    fn bundled() -> usize {
        Roots::from_paths(None, None).certs().len()
    }

    #[test]
    fn a_store_file_adds_its_cas_to_the_bundled_roots() {
        let dir = tempdir();
        let file = temp_file(
            &dir,
            "bundle.pem",
            &format!("{TEST_CA_PEM}some text between\n{TEST_CLIENT_CERT_PEM}"),
        );
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(
            roots.system_certs(),
            [der(TEST_CA_PEM), der(TEST_CLIENT_CERT_PEM)].as_slice()
        );
        assert!(bundled() > 100, "the Mozilla roots are bundled");
        assert_eq!(roots.certs().len(), 2 + bundled());
        assert_eq!(roots.store().len(), roots.certs().len());
        assert_eq!(roots.anchors().count(), roots.certs().len());
    }

    #[test]
    fn a_store_directory_is_read_as_ssl_cert_dir_names_it() {
        let dir = tempdir();
        temp_file(&dir, "one.pem", TEST_CA_PEM);
        temp_file(&dir, "two.crt", TEST_CLIENT_CERT_PEM);
        let roots = Roots::from_paths(None, Some(dir.path()));
        assert_eq!(roots.system_certs().len(), 2);
        assert!(roots.system_certs().contains(&der(TEST_CLIENT_CERT_PEM)));
    }

    #[test]
    fn what_cannot_be_read_or_used_is_skipped_without_failing() {
        let dir = tempdir();
        let broken = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let file = temp_file(&dir, "mixed.pem", &format!("{broken}{TEST_CA_PEM}"));
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(roots.system_certs(), [der(TEST_CA_PEM)].as_slice());

        // A store that cannot be read at all: the bundled roots alone.
        let missing = dir.path().join("missing.pem");
        let roots = Roots::from_paths(Some(&missing), Some(&dir.path().join("no-such-dir")));
        assert!(roots.system_certs().is_empty());
        assert_eq!(roots.certs().len(), bundled());
    }

    #[test]
    fn a_bundled_root_in_the_store_is_trusted_once() {
        let dir = tempdir();
        let mozilla = match webpki_root_certs::TLS_SERVER_ROOT_CERTS.first() {
            Some(cert) => cert.clone(),
            None => panic!("no bundled roots"),
        };
        let file = temp_file(
            &dir,
            "bundle.pem",
            &String::from_utf8_lossy(&pem_bundle(&[mozilla])),
        );
        let roots = Roots::from_paths(Some(&file), None);
        assert_eq!(roots.system_certs().len(), 1);
        assert_eq!(roots.certs().len(), bundled());
    }

    /// The PEM bundle holds exactly the trusted certificates, and redis-rs takes it whole (it
    /// refuses a bundle if any one certificate is not a usable root).
    #[test]
    fn the_pem_bundle_is_the_same_set_and_redis_takes_it() {
        let dir = tempdir();
        let file = temp_file(&dir, "bundle.pem", TEST_CA_PEM);
        let roots = Roots::from_paths(Some(&file), None);
        let parsed = CertificateDer::pem_slice_iter(roots.pem()).collect::<Result<Vec<_>, _>>();
        match parsed {
            Ok(parsed) => assert_eq!(parsed, roots.certs()),
            Err(e) => panic!("the bundle does not parse: {e}"),
        }
        let built = redis::Client::build_with_tls(
            "rediss://127.0.0.1:1/",
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(roots.pem().to_vec()),
            },
        );
        assert!(built.is_ok(), "{built:?}");
    }
}
