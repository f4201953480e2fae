//! Whether inferq trusts a TLS gateway's certificate, decided as Go's `crypto/x509` decides it.
//!
//! The certificate a gateway presents enters [`GatewayVerifier`] during the handshake; a verdict
//! leaves. By Go's rules it has webpki check the chain to the trusted roots (the system store,
//! the bundled Mozilla roots and the `--tls-ca-cert` certificates, see [`inferq_client::roots`]), and
//! adds Go's one short cut: a presented certificate that is itself one of the `--tls-ca-cert` or
//! system-store certificates (Go's root pool) is trusted as it stands (Go's `Verify` answers with
//! a chain of that one certificate when the root pool holds it), once its validity dates, its
//! names and its extended key usage fit. That is the gateway started with a
//! certificate from `openssl req -x509`, which is marked as a CA: webpki refuses it as an end
//! entity (`CaUsedAsEndEntity`), so without the short cut every request failed where the Go
//! processor given the same `--tls-ca-cert` succeeds.
//!
//! With `--tls-insecure-skip-verify` any certificate is accepted, but the handshake's
//! signatures are still checked against the key it carries, as Go checks them.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, SignatureScheme};

use super::leaf::LeafFacts;

/// How a gateway's certificate is judged (the handshake's signatures are checked against the
/// certificate's key either way).
#[derive(Debug)]
pub(crate) struct GatewayVerifier {
    trust: Trust,
    algorithms: WebPkiSupportedAlgorithms,
}

#[derive(Debug)]
enum Trust {
    /// webpki's verdict, and Go's short cut for a listed certificate served as it is.
    Go {
        webpki: Arc<WebPkiServerVerifier>,
        /// The `--tls-ca-cert` certificates and the system store's: Go's root pool.
        listed: Vec<CertificateDer<'static>>,
    },
    /// `--tls-insecure-skip-verify`: every certificate.
    Any,
}

impl GatewayVerifier {
    /// Go's rules: a chain to the roots `webpki` holds, or a `listed` certificate served as is.
    pub(crate) fn go(
        webpki: Arc<WebPkiServerVerifier>,
        listed: Vec<CertificateDer<'static>>,
        algorithms: WebPkiSupportedAlgorithms,
    ) -> GatewayVerifier {
        GatewayVerifier {
            trust: Trust::Go { webpki, listed },
            algorithms,
        }
    }

    /// `--tls-insecure-skip-verify`.
    pub(crate) fn any(algorithms: WebPkiSupportedAlgorithms) -> GatewayVerifier {
        GatewayVerifier {
            trust: Trust::Any,
            algorithms,
        }
    }
}

impl ServerCertVerifier for GatewayVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let Trust::Go { webpki, listed } = &self.trust else {
            return Ok(ServerCertVerified::assertion());
        };
        let refused = match webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => return Ok(verified),
            Err(refused) => refused,
        };
        if !listed.iter().any(|c| c.as_ref() == end_entity.as_ref()) {
            return Err(refused);
        }
        trust_as_listed(end_entity, server_name, now)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Go's checks of a certificate its root pool holds, when it is the one served: valid now, made
/// for the name dialled, and not limited to usages other than a TLS server's.
fn trust_as_listed(
    end_entity: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<(), Error> {
    let facts = LeafFacts::read(end_entity.as_ref())
        .ok_or(Error::InvalidCertificate(CertificateError::BadEncoding))?;
    let now = now.as_secs();
    if now < facts.not_before {
        return Err(Error::InvalidCertificate(CertificateError::NotValidYet));
    }
    if now > facts.not_after {
        return Err(Error::InvalidCertificate(CertificateError::Expired));
    }
    if !facts.serves_tls {
        return Err(Error::InvalidCertificate(CertificateError::InvalidPurpose));
    }
    verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::leaf::tests::{der, CLIENT_ONLY_PEM, SELF_SIGNED_PEM};
    use rustls::RootCertStore;

    /// A verifier whose `--tls-ca-cert` lists `listed`, as [`crate::gateway::GatewayTls`] builds it.
    fn verifier(listed: &[&str]) -> GatewayVerifier {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        let listed: Vec<_> = listed.iter().map(|pem| der(pem)).collect();
        for cert in &listed {
            if let Err(e) = roots.add(cert.clone()) {
                panic!("root: {e}");
            }
        }
        let algorithms = provider.signature_verification_algorithms;
        match WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider).build() {
            Ok(webpki) => GatewayVerifier::go(webpki, listed, algorithms),
            Err(e) => panic!("verifier: {e}"),
        }
    }

    fn name(text: &str) -> ServerName<'static> {
        match ServerName::try_from(text.to_owned()) {
            Ok(name) => name,
            Err(e) => panic!("{text}: {e}"),
        }
    }

    /// 2027-01-01, inside the test certificates' validity.
    const IN_2027: u64 = 1_798_761_600;

    fn check(verifier: &GatewayVerifier, pem: &str, host: &str, at: u64) -> Result<(), Error> {
        verifier
            .verify_server_cert(
                &der(pem),
                &[],
                &name(host),
                &[],
                UnixTime::since_unix_epoch(std::time::Duration::from_secs(at)),
            )
            .map(|_| ())
    }

    fn refusal(result: Result<(), Error>) -> CertificateError {
        match result {
            Err(Error::InvalidCertificate(e)) => e,
            other => panic!("expected a certificate error, got {other:?}"),
        }
    }

    #[test]
    fn a_listed_self_signed_ca_served_as_the_leaf_is_trusted_as_go_trusts_it() {
        let listed = verifier(&[SELF_SIGNED_PEM]);
        for host in ["127.0.0.1", "localhost"] {
            if let Err(e) = check(&listed, SELF_SIGNED_PEM, host, IN_2027) {
                panic!("{host}: {e}");
            }
        }
        // webpki alone refuses it, though it is a root: the case the short cut exists for.
        let Trust::Go { webpki, .. } = &listed.trust else {
            panic!("Go's rules");
        };
        let alone = webpki.verify_server_cert(
            &der(SELF_SIGNED_PEM),
            &[],
            &name("127.0.0.1"),
            &[],
            UnixTime::since_unix_epoch(std::time::Duration::from_secs(IN_2027)),
        );
        assert!(alone.is_err());
    }

    #[test]
    fn the_short_cut_still_checks_name_dates_usage_and_listing() {
        let listed = verifier(&[SELF_SIGNED_PEM, CLIENT_ONLY_PEM]);
        assert!(matches!(
            refusal(check(&listed, SELF_SIGNED_PEM, "gateway.example", IN_2027)),
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. }
        ));
        // Valid from 2026-11-29 20:56:33 to 2126-11-05 20:56:33 UTC.
        assert_eq!(
            refusal(check(&listed, SELF_SIGNED_PEM, "127.0.0.1", 1_795_985_792)),
            CertificateError::NotValidYet
        );
        assert_eq!(
            refusal(check(&listed, SELF_SIGNED_PEM, "127.0.0.1", 4_949_585_794)),
            CertificateError::Expired
        );
        assert_eq!(
            refusal(check(&listed, CLIENT_ONLY_PEM, "127.0.0.1", IN_2027)),
            CertificateError::InvalidPurpose
        );
        // Not listed: webpki's refusal stands.
        let other = verifier(&[CLIENT_ONLY_PEM]);
        assert!(check(&other, SELF_SIGNED_PEM, "127.0.0.1", IN_2027).is_err());
    }
}
